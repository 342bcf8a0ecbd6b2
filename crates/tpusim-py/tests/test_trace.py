"""Profiler traces to measurement rows: a synthetic trace shaped like XProf's Chrome trace JSON
(TSL's trace_events_to_json.cc: process_name / thread_name metadata, complete "X" events with
microsecond ts/dur, string args, a trailing {}), written by the test."""

import csv
import gzip
import io
import json

import pytest

import tpusim
from conftest import run_cli

DURS_MS = [4.1, 4.0, 4.3, 3.9, 4.2, 4.05]
JOB = dict(chip="v6e", heads=8, seq_len=8192, head_dim=128, mask="causal", block_q=512, block_kv=1024)


def xprof_trace(devices=2):
    ev = []
    for d in range(devices):
        pid = 1 + d
        ev += [
            {"ph": "M", "pid": pid, "name": "process_name", "args": {"name": f"/device:TPU:{d}"}},
            {"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": pid}},
            {"ph": "M", "pid": pid, "tid": 1, "name": "thread_name", "args": {"name": "XLA Modules"}},
            {"ph": "M", "pid": pid, "tid": 2, "name": "thread_name", "args": {"name": "XLA Ops"}},
        ]
    ev += [
        {"ph": "M", "pid": 701, "name": "process_name", "args": {"name": "/host:CPU"}},
        {"ph": "M", "pid": 701, "tid": 9, "name": "thread_name", "args": {"name": "python3"}},
    ]
    t = 1000.0
    for i, ms in enumerate(DURS_MS):
        for d in range(devices):
            pid = 1 + d
            ev.append({"ph": "X", "pid": pid, "tid": 1, "ts": t, "dur": ms * 1e3 + 80.0, "name": f"jit_attention({i})", "args": {"run_id": str(i)}})
            ev.append({"ph": "X", "pid": pid, "tid": 2, "ts": t + 5.0, "dur": 20.0, "name": "fusion.12", "args": {"hlo_category": "loop fusion"}})
            # Device time of the kernel: the same on every device in this trace.
            ev.append({
                "ph": "X", "pid": pid, "tid": 2, "ts": t + 30.0, "dur": ms * 1e3,
                "name": f"splash_mha_fwd_no_residuals.{1 + i % 2}",
                "args": {"long_name": "custom-call", "tf_op": "jit(attention)/splash_mha_fwd_no_residuals"},
            })
        # The host's dispatch of the same name is not a device op.
        ev.append({"ph": "X", "pid": 701, "tid": 9, "ts": t, "dur": 9e3, "name": "splash_mha_fwd_no_residuals", "args": {}})
        t += 6000.0
    ev.append({})
    return {"displayTimeUnit": "ns", "metadata": {"highres-ticks": True}, "traceEvents": ev}


@pytest.fixture(params=["json", "json.gz"])
def trace_file(tmp_path, request):
    p = tmp_path / f"host.trace.{request.param}"
    text = json.dumps(xprof_trace())
    if request.param.endswith(".gz"):
        with gzip.open(p, "wt") as f:
            f.write(text)
    else:
        p.write_text(text)
    return p


def test_trace_becomes_rows_that_validate_accepts(trace_file, tmp_path):
    rows = tpusim.measurements_from_trace(str(trace_file), "splash_mha_fwd", "xprof-causal", **JOB)
    assert len(rows) == 1
    row = rows[0]
    want = sorted(DURS_MS)[2:4]  # median of 6 repeats per device; 2 devices alike
    assert float(row["measured_ms"]) == pytest.approx(sum(want) / 2)
    assert "median of 12 events" in row["timing"] and "2 device(s)" in row["timing"]
    assert (row["q_len"], row["block_q"], row["mask"], row["kernel"]) == ("8192", "512", "causal", "tokamax-splash")
    v = tpusim.validate(rows)
    assert [r["id"] for r in v["rows"]] == ["xprof-causal"] and v["skipped"] == []
    # The simulated time is the one simulate() predicts for the same job.
    sim = tpusim.simulate(**{k: v for k, v in JOB.items()})
    assert v["rows"][0]["predicted_ms"] == pytest.approx(sim.latency_ms, rel=1e-9)

    # The command line writes the same rows, and `tpusim validate` takes the file.
    out = tmp_path / "rows.csv"
    flags = [x for k, val in JOB.items() for x in (f"--{k.replace('_', '-')}", val)]
    run_cli("from-trace", trace_file, "--kernel-pattern", "splash_mha_fwd", "--id", "xprof-causal", "--out", out, *flags)
    # The file starts with the overwrite rule's mark, a comment line (pandas: comment="#").
    text = out.read_text()
    assert text.startswith("# tpusim output: from-trace (tpusim ")
    cli_rows = list(csv.DictReader(io.StringIO("".join(l for l in text.splitlines(True) if not l.startswith("#")))))
    assert cli_rows == [{k: row.get(k, "") for k in cli_rows[0]}]
    stdout, _ = run_cli("validate", out, "--format", "json")
    assert [r["id"] for r in json.loads(stdout)["rows"]] == ["xprof-causal"]
    # The Python function writes the file too.
    out2 = tmp_path / "rows2.csv"
    tpusim.measurements_from_trace(str(trace_file), "splash_mha_fwd", "xprof-causal", out=str(out2), **JOB)
    assert out2.read_text() == out.read_text()
    assert tpusim.validate(str(out2))["rows"][0]["measured_ms"] == pytest.approx(sum(want) / 2)
    # A file it did not write is replaced only with force=True.
    mine = tmp_path / "mine.csv"
    mine.write_text("my,notes\n")
    with pytest.raises(tpusim.InputError, match=r"out = '.*mine\.csv': exists and tpusim did not write it.*pass force=True to replace it"):
        tpusim.measurements_from_trace(str(trace_file), "splash_mha_fwd", "x", out=str(mine), **JOB)
    assert mine.read_text() == "my,notes\n"
    tpusim.measurements_from_trace(str(trace_file), "splash_mha_fwd", "x", out=str(mine), force=True, **JOB)
    assert mine.read_text().startswith("# tpusim output: from-trace")


def test_several_kernels_give_one_row_each(trace_file):
    rows = tpusim.measurements_from_trace(str(trace_file), "splash|fusion", "t", **JOB)
    assert sorted(r["id"] for r in rows) == ["t-fusion", "t-splash_mha_fwd_no_residuals"]
    fusion = next(r for r in rows if r["id"] == "t-fusion")
    assert float(fusion["measured_ms"]) == pytest.approx(0.02)


def test_trace_errors_name_what_to_fix(trace_file):
    with pytest.raises(tpusim.InputError, match=r"kernel_pattern 'flash_fwd'.*splash_mha_fwd_no_residuals \(12\)"):
        tpusim.measurements_from_trace(str(trace_file), "flash_fwd", "x", **JOB)
    with pytest.raises(tpusim.InputError, match="chip: name the chip"):
        tpusim.measurements_from_trace(str(trace_file), "splash", "x", heads=8, seq_len=8192)
    with pytest.raises(tpusim.InputError, match="not a regular expression"):
        tpusim.measurements_from_trace(str(trace_file), "splash(", "x", **JOB)
    _, err = run_cli("from-trace", trace_file, "--kernel-pattern", "nothing", "--id", "x", "--chip", "v6e", expect=2)
    assert "--kernel-pattern 'nothing'" in err and "XLA Ops" in err


def test_timeline_shows_the_measured_trace_beside_the_simulation(trace_file, tmp_path):
    tl = tmp_path / "tl.json"
    flags = [x for k, val in JOB.items() if k != "chip" for x in (f"--{k.replace('_', '-')}", val)]
    run_cli("run", *flags, "--timeline", tl, "--timeline-steps", "0:4", "--compare-trace", trace_file, "--kernel-pattern", "splash_mha_fwd")
    ev = json.loads(tl.read_text())["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in ev if e.get("name") == "process_name"}
    # Simulated kernels from process 1, XLA ops outside them 100, measured ops 200.
    assert procs[1].startswith("tpusim:") and procs[200].startswith("measured:")
    measured = [e for e in ev if e.get("pid") == 200 and e.get("ph") == "X"]
    assert len(measured) == 12 and min(e["ts"] for e in measured) == 0.0
    assert any(e.get("pid") == 1 and e.get("ph") == "X" for e in ev)


def test_trace_ops_lists_the_selected_device_ops(trace_file):
    """`tpusim.trace_ops`: the events `measurements_from_trace` selects, one dict each, for
    timings that are not a kernel family's row (the module line, here)."""
    ops = tpusim.trace_ops(str(trace_file), r"^jit_attention\(", line="^XLA Modules$")
    assert len(ops) == 12 and {o["device"] for o in ops} == {"/device:TPU:0", "/device:TPU:1"}
    assert {o["line"] for o in ops} == {"XLA Modules"}
    assert sorted(o["dur_us"] for o in ops if o["device"] == "/device:TPU:0") == sorted(ms * 1e3 + 80.0 for ms in DURS_MS)
    dev1 = tpusim.trace_ops(str(trace_file), "splash_mha_fwd", device="TPU:1$")
    assert [o["name"] for o in dev1] == [f"splash_mha_fwd_no_residuals.{1 + i % 2}" for i in range(len(DURS_MS))]
    assert all(b["ts_us"] > a["ts_us"] for a, b in zip(dev1, dev1[1:]))
    with pytest.raises(tpusim.InputError, match=r"kernel_pattern 'nothing'.*device '\^/device:'.*XLA Ops"):
        tpusim.trace_ops(str(trace_file), "nothing")


def test_validate_names_an_empty_row_and_a_nan_time():
    # A NaN time read as "empty", and a row without columns as "unknown column" with no name.
    row = {"id": "a", "chip": "v6e", "kernel": "tokamax-splash", "measured_ms": float("nan")}
    with pytest.raises(tpusim.InputError, match=r"rows\[0\]\.measured_ms = NaN: not a finite number"):
        tpusim.validate([row])
    with pytest.raises(tpusim.InputError, match=r"rows\[0\] = \{\}: no measurement columns; a row needs at least id, chip, kernel, measured_ms"):
        tpusim.validate([{}])
