"""`python -m tpusim.microbench`: list, simulate, describe or measure the microbenchmark kit.

    python -m tpusim.microbench --list
    python -m tpusim.microbench --simulate --chip v6e [--only copy]
    python -m tpusim.microbench --measure --out rows.csv [--out-dir kernels/microbench]   # on a TPU VM
    python -m tpusim.microbench --measure --dry-run --chip v6e --only 'step-empty-g1$' --out dry.csv
    python -m tpusim.microbench --describe --out-dir DIR [--only ...]                     # descriptions only

Exit codes: 0 done, 2 bad input (an option, a pattern that selects nothing), 1 a kernel that
failed to simulate or measure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from . import select

#: Back-to-back calls `--measure` times per kernel on a TPU.
REPEATS = 200
#: ... and with `--dry-run` (CPU interpret mode: 200 calls of the slowest copy took minutes and
#: the profiler dropped some of their events).
DRY_RUN_REPEATS = 20


def _parser():
    p = argparse.ArgumentParser(
        prog="python -m tpusim.microbench",
        description="Small Pallas kernels that each isolate one TPU mechanism: simulate them with tpusim, "
        "or time them on a TPU VM and write calibration rows (traces/measured/README.md) for `tpusim calibrate`.",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--list", action="store_true", help="list the catalogue: name, kernel word, mechanism, what it pins")
    what.add_argument("--simulate", action="store_true", help="print tpusim's prediction of each kernel (tpusim.jax.simulate)")
    what.add_argument("--describe", action="store_true", help="write each kernel's description to --out-dir (no timing)")
    what.add_argument("--measure", action="store_true", help="time each kernel on this machine's TPU (JAX profiler) and write rows")
    p.add_argument("--dry-run", action="store_true", help="with --measure: run the timing path on the CPU in Pallas interpret mode (times mean nothing)")
    p.add_argument("--chip", help="chip preset (v6e, v5e, v5p, v4, v7x) or, for --simulate, a chip TOML with --device-kind; "
                   "--measure takes the TPU's own (default v6e for --simulate and --describe)")
    p.add_argument("--device-kind", help="the JAX device kind to lower for, with a chip TOML (e.g. 'TPU v6 lite')")
    p.add_argument("--only", metavar="REGEX", help="only the entries whose name matches (searched, e.g. 'copy-t' or 'dma-serial')")
    p.add_argument("--judges", action="store_true", help="include the judge kernels (vLLM's kv_cache_update: check a model, never fitted)")
    p.add_argument("--out", metavar="CSV", help="--measure: the rows' CSV file (required)")
    p.add_argument("--out-dir", metavar="DIR", help="--measure, --describe: the descriptions' folder (default: microbench-kernels beside --out)")
    p.add_argument(
        "--repeats",
        type=int,
        default=None,
        help=f"--measure: back-to-back calls timed per kernel (default {REPEATS}; with --dry-run {DRY_RUN_REPEATS}: interpret mode on the CPU is slow, and its profiler drops events of long runs)",
    )
    p.add_argument("--force", action="store_true", help="--measure, --describe: replace an --out file or a description in --out-dir that tpusim did not write")
    p.add_argument("--format", choices=("table", "json"), default="table", help="--list, --simulate: output format")
    return p


def _table(rows, header):
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header) - 1)]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(header, widths)) + "  " + header[-1]]
    for r in rows:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(r, widths)) + "  " + str(r[-1]))
    return "\n".join(lines)


def _simulate(entries, chip, device_kind, fmt):
    from .. import jax as tj

    results, failed = [], 0
    for e in entries:
        fn, args = e.build()
        try:
            r = tj.simulate(fn, *args, chip=chip, device_kind=device_kind)
            results.append({"name": e.name, "mechanism": e.mechanism, "predicted_ms": r.latency_ms, "bottleneck": r[0].bottleneck, "error": None})
        except Exception as ex:  # one entry's failure is reported in its row; the others run
            failed += 1
            results.append({"name": e.name, "mechanism": e.mechanism, "predicted_ms": None, "bottleneck": None, "error": f"{type(ex).__name__}: {ex}"})
        if fmt == "table" and sys.stdout.isatty():
            print(f"  {len(results)}/{len(entries)} {e.name}", file=sys.stderr, end="\r", flush=True)
    if fmt == "json":
        print(json.dumps({"chip": chip, "entries": results}, indent=1))
    else:
        rows = [
            (r["name"], "error" if r["error"] else f"{r['predicted_ms']:.4f}", r["bottleneck"] or "-", r["error"] or r["mechanism"])
            for r in results
        ]
        print(f"tpusim predictions on {chip} (tpusim.jax.simulate; kernel time)")
        print(_table(rows, ("name", "predicted ms", "bound by", "mechanism")))
    return 1 if failed else 0


def main(argv=None):
    a = _parser().parse_args(argv)

    def usage(msg):
        print(f"error: {msg}", file=sys.stderr)
        return 2

    if a.dry_run and not a.measure:
        return usage("--dry-run goes with --measure")
    if a.repeats is None:
        a.repeats = DRY_RUN_REPEATS if a.dry_run else REPEATS
    if a.repeats < 1:
        return usage(f"--repeats {a.repeats}: expected a whole number from 1")
    try:
        entries = select(a.only, judges=a.judges)
    except ValueError as e:
        return usage(str(e))
    if a.list:
        if a.format == "json":
            print(json.dumps([{"name": e.name, "kernel": e.kernel, "role": e.role, "mechanism": e.mechanism, "pins": e.pins, "public": e.public} for e in entries], indent=1))
        else:
            print(_table([(e.name, e.kernel, e.mechanism, e.pins) for e in entries], ("name", "kernel", "mechanism", "pins")))
        return 0
    if a.simulate:
        return _simulate(entries, a.chip or "v6e", a.device_kind, a.format)
    from . import measure as m

    if a.describe:
        if not a.out_dir:
            return usage("--describe needs --out-dir (the folder the descriptions go to)")
        chip = a.chip or "v6e"
        from .. import InputError

        try:
            m.check_descriptions(entries, a.out_dir, chip, a.force)
        except InputError as e:
            return usage(str(e))
        os.makedirs(a.out_dir, exist_ok=True)
        for e in entries:
            print(m.describe_entry(e, m.description_path(e, a.out_dir, chip), chip, a.force))
        return 0
    if not a.out:
        return usage("--measure needs --out (the CSV file the rows go to)")
    out_dir = a.out_dir or os.path.join(os.path.dirname(os.path.abspath(a.out)), "microbench-kernels")
    from .. import InputError

    try:
        rows, failures = m.measure(entries, a.out, out_dir, chip=a.chip, repeats=a.repeats, dry_run=a.dry_run, force=a.force)
    except InputError as e:
        return usage(str(e))
    except m.MeasureError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if rows:
        print(f"wrote {len(rows)} rows to {a.out} and their descriptions to {out_dir}")
    for name, why in failures:
        print(f"error: {name} was not measured: {why}", file=sys.stderr)
    if rows and not a.dry_run:
        print(f"next: tpusim calibrate {a.out} --chip {rows[0]['chip']} --out my-{rows[0]['chip']}.toml")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
