"""Timing the catalogue's kernels with JAX's profiler, and writing measurement rows.

Each kernel is jitted and called back to back inside `jax.profiler.trace`; the profiler's trace
(`plugins/profile/RUN/HOST.trace.json.gz`) is read by tpusim's own trace reader
(`tpusim.trace_ops`, crate `tpusim-calib`'s `trace` module) and the kernel's time is the median
duration of its jitted module's events: on a TPU the `XLA Modules` line of `/device:TPU:N`, as
the public copy benchmarks were timed. A dry run (`dry_run=True`) takes the same path on the
CPU with Pallas's interpret mode, selecting the host's `PjitFunction(NAME)` events: the times
mean nothing, and every row written says so.
"""

from __future__ import annotations

import csv
import datetime
import glob
import io
import os
import re
import statistics
import sys
import tempfile

import tpusim

#: The first words of a dry run's `timing` cell. Rows so marked are not measurements.
DRY_RUN_TIMING = "interpret mode on CPU, not a measurement"
#: The kernel word of a dry run's rows: `dry-run-microbench-...`, which `tpusim calibrate`
#: never fits (it fits rows whose kernel starts `microbench-`).
DRY_RUN_KERNEL_PREFIX = "dry-run-"
#: The first line of a CSV file this module writes (tpusim's output mark, README "Output files").
MARK = "# tpusim output: microbench --measure"

BANNER = (
    "*** DRY RUN: Pallas interpret mode on the CPU. The times taken mean NOTHING about a TPU; the rows\n"
    "*** written are marked so (timing '" + DRY_RUN_TIMING + "', kernel 'dry-run-microbench-...')\n"
    "*** and no calibration may use them. Measure on a TPU VM without --dry-run."
)


class MeasureError(Exception):
    """A measurement that cannot be taken or written (the message says why)."""


def _versions():
    """jax / jaxlib / libtpu versions and LIBTPU_INIT_ARGS, as the `source` cell records them."""
    import importlib.metadata as md

    import jax
    import jaxlib

    libtpu = "not installed"
    for dist in ("libtpu", "libtpu-nightly"):
        try:
            libtpu = md.version(dist)
            break
        except md.PackageNotFoundError:
            pass
    args = os.environ.get("LIBTPU_INIT_ARGS", "").strip() or "(unset)"
    return f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, libtpu {libtpu}; LIBTPU_INIT_ARGS={args}"


def device_chip(device):
    """The tpusim chip preset of a JAX TPU device (from its device kind), or None."""
    from ..jax import DEVICE_KINDS

    for chip, (kind, _) in DEVICE_KINDS.items():
        if device.device_kind == kind:
            return chip
    return None


def _concrete(args, device, seed=0):
    """Device arrays for the entry's arguments: NumPy arrays as given, shapes filled with
    uniform values in [0, 1) (integers: zeros)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    key = jax.random.key(seed)
    out = []
    for i, a in enumerate(args):
        if isinstance(a, jax.ShapeDtypeStruct):
            if jnp.issubdtype(a.dtype, jnp.floating):
                v = jax.random.uniform(jax.random.fold_in(key, i), a.shape, jnp.float32).astype(a.dtype)
            else:
                v = jnp.zeros(a.shape, a.dtype)
        else:
            v = np.asarray(a)
        out.append(jax.device_put(v, device))
    return out


def _selection(fn_name, dry_run, device):
    """(pattern, device, line) of the jitted module's events in the trace."""
    if dry_run:
        return rf"^PjitFunction\({re.escape(fn_name)}\)$", r"^/host:CPU$", "."
    # XProf names a module's events `jit_NAME(PROGRAM_ID)` on the device's `XLA Modules` line.
    return rf"^jit_{re.escape(fn_name)}(\(|\.|$)", rf"^/device:TPU:{device.id}$", r"^XLA Modules$"


def _outermost(ops):
    """The selected events that no other selected event on the same device line holds: one per
    call where a call's event nests another of the same name (a dry run's host trace has two
    `PjitFunction(NAME)` events a call, one inside the other)."""
    out = []
    for o in sorted(ops, key=lambda o: (o["device"], o["line"], o["ts_us"], -o["dur_us"])):
        last = out[-1] if out else None
        inside = last is not None and (last["device"], last["line"]) == (o["device"], o["line"]) and o["ts_us"] + o["dur_us"] <= last["ts_us"] + last["dur_us"]
        if not inside:
            out.append(o)
    return out


def time_entry(entry, repeats=200, warmup=3, dry_run=False, device=None, trace_dir=None):
    """Times one entry: `repeats` back-to-back calls of its jitted function inside a profiler
    trace. Returns a dict: `median_ms`, `events` (the events the median is of), `selection`
    (pattern, device, line), `trace` (the trace file read)."""
    import jax

    if device is None:
        device = jax.devices("cpu" if dry_run else None)[0]
    fn, args = entry.build(interpret=dry_run)
    vals = _concrete(args, device)
    donate = (entry.carry,) if entry.carry is not None else ()
    jf = jax.jit(fn, donate_argnums=donate)

    def call():
        out = jf(*vals)
        if entry.carry is not None:
            vals[entry.carry] = out
        return out

    out = None
    for _ in range(max(1, warmup)):  # compiles, and runs the first calls outside the trace
        out = call()
    jax.block_until_ready(out)
    own = trace_dir is None
    tmp = tempfile.mkdtemp(prefix="tpusim-microbench-") if own else trace_dir
    try:
        with jax.profiler.trace(tmp):
            for _ in range(repeats):
                out = call()
            jax.block_until_ready(out)
        traces = sorted(glob.glob(os.path.join(tmp, "plugins", "profile", "*", "*.trace.json.gz")), key=os.path.getmtime)
        if not traces:
            raise MeasureError(f"{entry.name}: the profiler wrote no *.trace.json.gz under {tmp}")
        pattern, dev, line = _selection(fn.__name__, dry_run, device)
        ops = _outermost(tpusim.trace_ops(traces[-1], pattern, device=dev, line=line))
        durs = [o["dur_us"] for o in ops]
        if len(durs) < repeats:
            raise MeasureError(
                f"{entry.name}: the trace holds {len(durs)} events of '{pattern}' on '{line}' of '{dev}' for {repeats} calls "
                "(the profiler dropped some: try fewer --repeats)"
            )
        return {"median_ms": statistics.median(durs) / 1e3, "events": len(durs), "selection": (pattern, dev, line), "trace": traces[-1]}
    finally:
        if own:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)


def description_path(entry, out_dir, chip):
    """Where the entry's kernel description goes: `out_dir/<row id>.json.gz`."""
    return os.path.join(out_dir, entry.row_id(chip) + ".json.gz")


def check_descriptions(entries, out_dir, chip, force):
    """Refuses, before any work, a description path of `entries` that holds a file tpusim did not
    write (unless `force`): the overwrite rule of `tpusim.jax.describe`, as `--force` says it.
    Raises `tpusim.InputError`."""
    from .. import _tpusim
    from .. import jax as tj

    if os.path.isdir(out_dir):
        targets = [(description_path(e, out_dir, chip), None) for e in entries]
        _tpusim._check_outputs("--out-dir", tj.DESCRIBE_COMMAND, targets, force, flag=True)


def describe_entry(entry, path, chip, force=False):
    """Writes the entry's kernel description (`tpusim.jax.describe`, `force` as it takes it) to
    `path`; returns it."""
    from .. import jax as tj

    fn, args = entry.build()
    (written, *more) = tj.describe(fn, *args, path=path, chip=chip, force=force)
    if more:
        raise MeasureError(f"{entry.name}: {1 + len(more)} Pallas kernels; a catalogue entry calls one")
    return written


def row(entry, chip, timed, desc_path, csv_dir, repeats, dry_run, device=None):
    """The measurement row (column -> cell) of one timed entry."""
    pattern, dev, line = timed["selection"]
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    if dry_run:
        timing = (
            f"{DRY_RUN_TIMING}: Pallas interpret mode, median host time of {timed['events']} "
            f"'{pattern}' events over {repeats} calls"
        )
        kernel, rid = DRY_RUN_KERNEL_PREFIX + entry.kernel, "DRYRUN-" + entry.row_id(chip)
        where = "CPU (dry run)"
    else:
        timing = (
            f"module device time from a jax.profiler trace: median of {timed['events']} events of {repeats} "
            f"back-to-back calls ('{pattern}' on the '{line}' line of '{dev}')"
        )
        kernel, rid = entry.kernel, entry.row_id(chip)
        where = f"{device.device_kind} device {device.id}" if device is not None else "TPU"
    return {
        "id": rid,
        "chip": chip,
        "kernel": kernel,
        "measured_ms": f"{timed['median_ms']:.6g}",
        "timing": timing,
        "source": f"python -m tpusim.microbench --measure ({entry.name}), {where}, {when}; {_versions()}",
        "kernel_ir": os.path.relpath(desc_path, csv_dir),
    }


COLUMNS = ("id", "chip", "kernel", "measured_ms", "timing", "source", "kernel_ir")


def check_out(path, force):
    """Refuses an output path whose folder is missing, or an existing file this module did not
    write (unless `force`), before any work."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise MeasureError(f"--out {path}: its folder {folder} does not exist")
    if os.path.isdir(path):
        raise MeasureError(f"--out {path}: is a directory; give a CSV file path")
    if os.path.exists(path) and not force:
        with open(path, encoding="utf-8", errors="replace") as f:
            first = f.readline()
        if not first.startswith(MARK):
            raise MeasureError(f"--out {path}: exists and was not written by tpusim.microbench --measure; pass --force to replace it")


def write_rows(path, rows, dry_run):
    """Writes the rows as a measurement CSV (traces/measured/README.md), atomically: the mark
    line, for a dry run a warning, the header, the rows."""
    buf = io.StringIO()
    from .. import __version__

    buf.write(f"{MARK}{' --dry-run' if dry_run else ''} (tpusim {__version__})\n")
    if dry_run:
        for line in BANNER.splitlines():
            buf.write("# " + line.lstrip("* ") + "\n")
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    from .. import _tpusim

    _tpusim._write_output("--out", path, buf.getvalue().encode())


def measure(entries, out, out_dir, chip=None, repeats=200, dry_run=False, force=False, log=sys.stderr):
    """Describes and times every entry, then writes the rows to `out` (CSV) and the kernel
    descriptions to `out_dir` (`<row id>.json.gz`). On a TPU the chip is the device's (a `chip`
    that disagrees is an error); a dry run needs `chip` (the descriptions are lowered for it).
    An entry that fails (it does not lower, compile or run) is reported and left out; the others'
    rows are written. Returns (rows, failures: [(entry name, reason)]).

    Raises `MeasureError` before any work for a missing TPU, an unknown device kind, a bad
    `out`, an `out` or a description in `out_dir` that tpusim did not write (unless `force`), and
    `tpusim.InputError` for a JAX other than the one `tpusim.jax` reads."""
    import jax

    from .. import InputError
    from ..jax import _jax

    _jax()  # the JAX release tpusim.jax reads, or an InputError saying which to install
    check_out(out, force)
    if dry_run:
        device = jax.devices("cpu")[0]
    else:
        try:
            device = jax.devices("tpu")[0]
        except RuntimeError as e:
            raise MeasureError(
                f"--measure needs a TPU (JAX sees none: {e}); on a machine without one, --dry-run runs the same path "
                "on the CPU with Pallas's interpret mode (its times mean nothing)"
            ) from None
        found = device_chip(device)
        if found is None:
            raise MeasureError(f"device kind {device.device_kind!r} is not one tpusim models (tpusim.jax.DEVICE_KINDS)")
        if chip is not None and chip != found:
            raise MeasureError(f"--chip {chip}: this machine's TPU is a {found} ({device.device_kind!r})")
        chip = found
    if chip is None:
        raise MeasureError("--dry-run needs --chip (the chip the descriptions are lowered for)")
    # Every description path too, before the first kernel runs.
    try:
        check_descriptions(entries, out_dir, chip, force)
    except InputError as e:
        raise MeasureError(str(e)) from None
    if dry_run:
        print(BANNER, file=log)
    os.makedirs(out_dir, exist_ok=True)
    csv_dir = os.path.dirname(os.path.abspath(out))
    rows, failures = [], []
    note = " (interpret mode: means nothing)" if dry_run else ""
    for n, e in enumerate(entries, 1):
        try:
            desc = describe_entry(e, description_path(e, out_dir, chip), chip, force)
            timed = time_entry(e, repeats=repeats, dry_run=dry_run, device=device)
        except Exception as ex:  # noqa: BLE001 - one kernel's failure is reported; the others run
            failures.append((e.name, f"{type(ex).__name__}: {ex}"))
            print(f"[{n}/{len(entries)}] {e.name}: FAILED: {failures[-1][1]}", file=log, flush=True)
            continue
        rows.append(row(e, chip, timed, desc, csv_dir, repeats, dry_run, device))
        print(f"[{n}/{len(entries)}] {e.name}: {timed['median_ms']:.4f} ms{note}", file=log, flush=True)
    if rows:
        write_rows(out, rows, dry_run)
    if dry_run:
        print(BANNER, file=log)
    return rows, failures
