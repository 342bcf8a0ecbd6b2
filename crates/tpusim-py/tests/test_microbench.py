"""The microbenchmark kit (`python -m tpusim.microbench`): its catalogue, its predictions, and
its measuring harness end to end on the CPU (Pallas interpret mode, `--dry-run`), whose rows
`tpusim validate` reads. Small entries only: CI has 2 cores."""

import csv
import gzip
import json
import os
import re
import subprocess
import sys

import pytest

import tpusim
import tpusim.jax as tj
from tpusim import microbench as mb
from tpusim.microbench import measure as mm
from conftest import run_cli

PY = sys.executable


def kit(*args, expect=0, cwd=None):
    r = subprocess.run([PY, "-m", "tpusim.microbench", *map(str, args)], capture_output=True, text=True, cwd=cwd)
    assert r.returncode == expect, f"microbench {' '.join(map(str, args))}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout, r.stderr


def test_catalogue_names_kernel_words_and_row_ids():
    es = mb.catalogue()
    names = [e.name for e in es]
    assert len(names) == len(set(names))
    assert len({e.row_id("v6e") for e in es}) == len(es)
    mech = [e for e in es if e.role == "mechanism"]
    judges = [e for e in es if e.role == "judge"]
    assert mech and judges and {e.role for e in es} == {"mechanism", "judge"}
    for e in mech:
        assert e.kernel.startswith(mb.PREFIX) and e.name.startswith(e.kernel + "-"), e.name
        assert e.mechanism and e.pins
        assert re.fullmatch(r"MB-v6e-[a-z0-9-]+", e.row_id("v6e")), e.row_id("v6e")
    for e in judges:
        assert not e.kernel.startswith(mb.PREFIX) and not e.row_id("v6e").startswith("MB-")
    # Every mechanism the kit promises has entries.
    kinds = {e.kernel for e in mech}
    for k in ("copy", "dma", "step", "matmul", "mxu", "vpu", "eup", "xlu", "headdim"):
        assert mb.PREFIX + k in kinds
    # The public copy: exactly t = 1 .. 128, and the two public DMA patterns.
    ts = sorted(int(e.name.rsplit("-t", 1)[1]) for e in mech if re.fullmatch(r"microbench-copy-t\d+", e.name))
    assert ts == [1, 2, 4, 8, 16, 32, 64, 128]
    assert {"microbench-dma-hbm-hbm-rows2048", "microbench-dma-via-vmem-rows2048"} <= set(names)
    assert mb.catalogue()[0].row_id("v6e") == "MB-v6e-copy-t1"


def test_select_filters_and_refuses_a_pattern_that_selects_nothing():
    assert [e.name for e in mb.select("copy-t(1|128)$")] == ["microbench-copy-t1", "microbench-copy-t128"]
    assert all(e.role == "mechanism" for e in mb.select(None))
    assert len(mb.select("vllm", judges=True)) == 12
    with pytest.raises(ValueError, match="judges need --judges"):
        mb.select("vllm")
    with pytest.raises(ValueError, match="not a regular expression"):
        mb.select("copy-(")


@pytest.mark.parametrize("t", [1, 128])
def test_the_public_copy_is_the_public_kernel(t):
    """bf16[2048, 4, 128] in (t, 4, 128) blocks, grid 2048 / t, default semantics."""
    (e,) = mb.select(f"copy-t{t}$")
    fn, args = e.build()
    (d,), _ = tj.describe_all(fn, *args, chip="v6e")
    assert d["grid"] == [2048 // t]
    ins = [r for r in d["refs"] if r["kind"] in ("input", "output")]
    assert [(r["kind"], r["shape"], r["dtype"], r["array_shape"]) for r in ins] == [
        ("input", [t, 4, 128], "bf16", [2048, 4, 128]),
        ("output", [t, 4, 128], "bf16", [2048, 4, 128]),
    ]


def test_the_paged_gather_moves_its_pages_bytes_at_every_page_size():
    """A page copy per table entry: equal tokens and heads move equal bytes whatever the page
    size (2048 tokens x heads x 128 bf16, and the one row copied out), so that a measured time
    that grows as pages shrink is a page copy's own cost."""
    got = {}
    for e in mb.select(r"dma-paged-p\d+-h8$"):
        fn, args = e.build()
        table, cache = args
        page = int(e.name.split("-p")[-1].split("-")[0])
        assert table.dtype == "int32" and table.shape == (2048 // page,) and len(set(table.tolist())) == table.size
        assert tuple(cache.shape) == (4 * 2048 // page, page, 8, 128)
        r = tj.simulate(fn, *args, chip="v6e").kernels[0]
        assert r.hbm_bytes == 2048 * 8 * 128 * 2 + 8 * 128 * 2, e.name
        got[page] = r.latency_ms
    assert sorted(got) == [16, 64, 256]


def test_the_mxu_fold_entries_run_their_matmuls():
    """64 matmuls a step over 8 steps of resident blocks: the executed MXU work is theirs, and
    only the first step copies its inputs."""
    for e in mb.select(r"mxu-fold-m8-k(128-n128|256-n256)$"):
        fn, args = e.build()
        x, w = args
        (m, k), (reps, k2, n) = x.shape, w.shape
        assert (m, k, reps) == (8, k2, 64)
        r = tj.simulate(fn, *args, chip="v6e").kernels[0]
        assert r.useful_flops == 2 * m * k * n * reps * 8, e.name
        assert r.hbm_bytes == (m * k + reps * k * n) * 2 + m * n * 4, e.name
        assert r.bottleneck == "mxu", e.name


def test_simulate_prints_each_prediction_as_tpusim_jax_simulates_it():
    out, _ = kit("--simulate", "--chip", "v6e", "--only", "copy-t128$|step-empty-g64$", "--format", "json")
    got = {r["name"]: r for r in json.loads(out)["entries"]}
    assert set(got) == {"microbench-copy-t128", "microbench-step-empty-g64"}
    for e in mb.select("copy-t128$|step-empty-g64$"):
        fn, args = e.build()
        assert got[e.name]["error"] is None
        assert got[e.name]["predicted_ms"] == pytest.approx(tj.simulate(fn, *args, chip="v6e").latency_ms, rel=1e-12)
    # A 2048-step copy of 2 KiB steps costs more than 64 empty steps.
    assert got["microbench-copy-t128"]["predicted_ms"] > 0 and got["microbench-step-empty-g64"]["predicted_ms"] > 0
    table, _ = kit("--simulate", "--only", "step-empty-g64$")
    assert "microbench-step-empty-g64" in table and "predicted ms" in table
    assert f"{got['microbench-step-empty-g64']['predicted_ms']:.4f}" in table


def test_bad_options_are_input_errors():
    _, err = kit("--simulate", "--only", "nothing-like-this", expect=2)
    assert "matches no entry" in err
    _, err = kit("--simulate", "--dry-run", expect=2)
    assert "--dry-run goes with --measure" in err
    _, err = kit("--measure", "--dry-run", "--chip", "v6e", expect=2)
    assert "--measure needs --out" in err


def test_measure_without_a_tpu_says_so_and_points_to_the_dry_run(tmp_path):
    _, err = kit("--measure", "--only", "step-empty-g1$", "--out", tmp_path / "rows.csv", expect=1)
    assert "needs a TPU" in err and "--dry-run" in err
    assert not (tmp_path / "rows.csv").exists()


def test_measure_refuses_to_replace_a_file_it_did_not_write(tmp_path):
    out = tmp_path / "mine.csv"
    out.write_text("id,chip,kernel,measured_ms\nx,v6e,splash,1\n")
    _, err = kit("--measure", "--dry-run", "--chip", "v6e", "--only", "step-empty-g1$", "--out", out, expect=1)
    assert "--force" in err
    assert out.read_text().startswith("id,chip")


def test_describe_refuses_a_description_tpusim_did_not_write_unless_forced(tmp_path):
    (e,) = mb.select("step-empty-g1$")
    mine = tmp_path / (e.row_id("v6e") + ".json.gz")
    mine.write_bytes(b"my own notes\n")
    _, err = kit("--describe", "--out-dir", tmp_path, "--only", "step-empty-g1$", expect=2)
    assert f"--out-dir {mine}: exists and tpusim did not write it" in err and "give --force to replace it" in err, err
    assert mine.read_bytes() == b"my own notes\n" and os.listdir(tmp_path) == [mine.name]
    # The same before a measurement: nothing runs, the file is left alone.
    _, err = kit("--measure", "--dry-run", "--chip", "v6e", "--only", "step-empty-g1$", "--out", tmp_path / "rows.csv", "--out-dir", tmp_path, expect=1)
    assert "give --force to replace it" in err and "DRY RUN" not in err, err
    assert mine.read_bytes() == b"my own notes\n" and not (tmp_path / "rows.csv").exists()
    kit("--describe", "--out-dir", tmp_path, "--only", "step-empty-g1$", "--force")
    assert json.loads(gzip.decompress(mine.read_bytes()))["format"] == "tpusim-kernel-description"
    # Its own description is replaced without --force.
    kit("--describe", "--out-dir", tmp_path, "--only", "step-empty-g1$")


def test_dry_run_times_through_the_profiler_and_writes_rows_marked_as_no_measurement(tmp_path):
    """The whole --measure path on the CPU: describe, jit, profile, read the trace with tpusim's
    reader, write rows and descriptions; the rows say they are not measurements, calibrate's
    mechanism rows exclude them by their kernel word, and `tpusim validate` predicts them."""
    out = tmp_path / "rows.csv"
    stdout, err = kit("--measure", "--dry-run", "--chip", "v6e", "--only", "step-one-copy-8x128$|step-empty-g1$", "--repeats", 4, "--out", out)
    assert err.count("DRY RUN") >= 2 and "mean NOTHING" in err
    text = out.read_text()
    assert text.startswith(mm.MARK + " --dry-run") and "# DRY RUN" in text
    rows = list(csv.DictReader(line for line in text.splitlines() if not line.startswith("#")))
    assert [r["id"] for r in rows] == ["DRYRUN-MB-v6e-step-empty-g1", "DRYRUN-MB-v6e-step-one-copy-8x128"]
    for r in rows:
        assert r["kernel"].startswith("dry-run-microbench-step") and not r["kernel"].startswith(mb.PREFIX)
        assert r["timing"].startswith(mm.DRY_RUN_TIMING)
        # One event per call (a call's nested event of the same name is not a second call).
        assert "median host time of 4 " in r["timing"] and "over 4 calls" in r["timing"] and float(r["measured_ms"]) > 0, r["timing"]
        assert "jax 0.10.2" in r["source"] and "LIBTPU_INIT_ARGS=" in r["source"]
        desc = tmp_path / r["kernel_ir"]
        assert r["kernel_ir"] == os.path.join("microbench-kernels", r["id"][len("DRYRUN-"):] + ".json.gz") and desc.exists()
        assert json.loads(gzip.decompress(desc.read_bytes()))["format"] == "tpusim-kernel-description"
    # tpusim validate reads the file and predicts each row from its description.
    table, _ = run_cli("validate", out)
    assert "2 of the rows are a dry run's" in table and "their errors say nothing about the model" in table, table
    v, _ = run_cli("validate", out, "--format", "json")
    pred = {r["id"]: r["predicted_ms"] for r in json.loads(v)["rows"]}
    assert set(pred) == {r["id"] for r in rows}
    (e,) = mb.select("step-empty-g1$")
    fn, args = e.build()
    assert pred["DRYRUN-MB-v6e-step-empty-g1"] == pytest.approx(tj.simulate(fn, *args, chip="v6e").latency_ms, rel=1e-9)
    # Run again: the file it wrote is replaced without --force.
    kit("--measure", "--dry-run", "--chip", "v6e", "--only", "step-empty-g1$", "--repeats", 2, "--out", out)
    assert len([line for line in out.read_text().splitlines() if line.startswith("DRYRUN-")]) == 1


def xprof_modules(names_durs):
    """A trace shaped as XProf's: two TPU devices with `XLA Modules` and `XLA Ops` lines."""
    ev = []
    for d in range(2):
        ev += [
            {"ph": "M", "pid": 1 + d, "name": "process_name", "args": {"name": f"/device:TPU:{d}"}},
            {"ph": "M", "pid": 1 + d, "tid": 1, "name": "thread_name", "args": {"name": "XLA Modules"}},
            {"ph": "M", "pid": 1 + d, "tid": 2, "name": "thread_name", "args": {"name": "XLA Ops"}},
        ]
    t = 0.0
    for name, durs in names_durs:
        for us in durs:
            ev.append({"ph": "X", "pid": 1, "tid": 1, "ts": t, "dur": us, "name": name})
            ev.append({"ph": "X", "pid": 1, "tid": 2, "ts": t + 1, "dur": us - 2, "name": "microbench_copy_t1"})
            ev.append({"ph": "X", "pid": 2, "tid": 1, "ts": t, "dur": 10 * us, "name": name})  # another device
            t += us + 5
    return {"traceEvents": ev}


def test_nested_events_of_one_call_count_once():
    ev = lambda ts, dur, line="t": {"device": "/host:CPU", "line": line, "name": "PjitFunction(f)", "ts_us": ts, "dur_us": dur}  # noqa: E731
    ops = [ev(0, 10), ev(1, 8), ev(20, 10), ev(21, 2), ev(25, 3, line="u")]
    assert [(o["ts_us"], o["line"]) for o in mm._outermost(ops)] == [(0, "t"), (20, "t"), (25, "u")]


def test_a_tpu_trace_is_read_as_the_module_line_of_device_0(tmp_path):
    """The selection --measure uses on a TPU, against a stored XProf-shaped trace: the module's
    events on device 0's `XLA Modules` line, not a longer name that starts alike, not device 1."""
    p = tmp_path / "host.trace.json.gz"
    p.write_bytes(gzip.compress(json.dumps(xprof_modules([
        ("jit_microbench_copy_t1(8841)", [649.0, 650.0, 651.0, 700.0]),
        ("jit_microbench_copy_t16(13)", [47.6, 47.7]),
    ])).encode()))

    class Dev:
        id = 0

    pattern, dev, line = mm._selection("microbench_copy_t1", False, Dev())
    ops = tpusim.trace_ops(str(p), pattern, device=dev, line=line)
    assert [o["dur_us"] for o in ops] == [649.0, 650.0, 651.0, 700.0]
    assert {o["device"] for o in ops} == {"/device:TPU:0"} and {o["line"] for o in ops} == {"XLA Modules"}
    with pytest.raises(tpusim.InputError, match=r"kernel_pattern '.*microbench_copy_t2.*'.*XLA Modules"):
        tpusim.trace_ops(str(p), mm._selection("microbench_copy_t2", False, Dev())[0], device=dev, line=line)


def public_rows(root):
    with open(root / "traces" / "measured" / "calibration.csv") as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    return [r for r in rows if r["id"].startswith(("MB-", "VLLM-KVUPD-"))]


def test_the_public_rows_are_the_kits_kernels_and_each_simulates(root):
    """The public microbenchmark rows of traces/measured/calibration.csv: every row is a catalogue entry's (id, kernel word,
    description path), the judge rows say how they were taken, `tpusim validate` predicts every
    row, and the shipped descriptions are what the kit describes today (a few cheap ones)."""
    rows = public_rows(root)
    by_id = {e.row_id("v6e"): e for e in mb.catalogue()}
    assert [r["id"] for r in rows][:10] == [f"MB-v6e-copy-t{t}" for t in (1, 2, 4, 8, 16, 32, 64, 128)] + [
        "MB-v6e-dma-hbm-hbm-rows2048", "MB-v6e-dma-via-vmem-rows2048"]
    assert sum(r["kernel"] == "kv-cache-update-vllm" for r in rows) == 12 and len(rows) == 22
    for r in rows:
        e = by_id[r["id"]]
        assert r["kernel"] == e.kernel and r["chip"] == "v6e" and e.public
        assert f"(tpusim.microbench entry {e.name})" in r["source"]
        folder = "microbench" if e.role == "mechanism" else "kv-cache-update-vllm"
        assert r["kernel_ir"] == f"kernels/{folder}/{r['id']}.json.gz"
        assert r["kernel"].startswith(mb.PREFIX) == (e.role == "mechanism")
        if e.role == "judge":
            assert "DMA tracing on" in r["timing"] and "never fitted" in r["timing"]
    out, _ = run_cli("validate", root / "traces" / "measured" / "calibration.csv", "--format", "json")
    v = json.loads(out)
    predicted = {x["id"] for x in v["rows"]}
    assert all(r["id"] in predicted for r in rows), "every public microbenchmark row is predicted"
    for rid in ("MB-v6e-copy-t1", "MB-v6e-copy-t128", "VLLM-KVUPD-v6e-nspb8", "VLLM-KVUPD-v6e-pipelined-nspb8"):
        fn, args = by_id[rid].build()
        (d,), _ = tj.describe_all(fn, *args, chip="v6e")
        (r,) = [r for r in rows if r["id"] == rid]
        stored = json.loads(gzip.decompress((root / "traces" / "measured" / r["kernel_ir"]).read_bytes()))
        fresh = json.loads(json.dumps(d))
        stored.pop("producer"), fresh.pop("producer")
        assert stored == fresh, f"{rid}: the shipped description is not what the kit describes: python -m tpusim.microbench --describe"


def test_a_kernel_that_fails_is_reported_and_the_others_are_written(tmp_path):
    import dataclasses
    import io

    (good,) = mb.select("step-empty-g1$")

    def broken(interpret=False):
        raise ValueError("boom: this kernel does not lower")

    bad = dataclasses.replace(good, name="microbench-step-broken", build=broken)
    log = io.StringIO()
    rows, failures = mm.measure([bad, good], str(tmp_path / "rows.csv"), str(tmp_path / "k"), chip="v6e", repeats=2, dry_run=True, log=log)
    assert [r["id"] for r in rows] == ["DRYRUN-MB-v6e-step-empty-g1"]
    assert failures == [("microbench-step-broken", "ValueError: boom: this kernel does not lower")]
    assert "microbench-step-broken: FAILED" in log.getvalue()
    assert "DRYRUN-MB-v6e-step-empty-g1" in (tmp_path / "rows.csv").read_text()
