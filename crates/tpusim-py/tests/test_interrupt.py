"""Ctrl-C works in Python: every long call (tune, sweep, validate, a loop of simulate calls, and
tpusim.jax.simulate of a large kernel) raises KeyboardInterrupt within a second of SIGINT, prints
no "Exception ignored" warning, and leaves the interpreter usable (no restart of a notebook
kernel)."""

import os
import signal
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))

PRELUDE = r"""
import signal, sys, time
# Python raises KeyboardInterrupt only where SIGINT has its default handler; a process started
# with SIGINT ignored (a background job of a non-interactive shell, some CI runners) inherits
# the ignore. Install the handler, as a notebook kernel does.
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, {here!r})
import tpusim
"""

EPILOGUE = r"""
print("ready", flush=True)
try:
    # Repeat the call: as the simulator gets faster one call may end inside the 3 s before the
    # signal; the gap between calls is microseconds, so the signal lands inside a call.
    while True:
        long_call()
except KeyboardInterrupt:
    print("interrupted", flush=True)
    # The interpreter goes on: a short call runs normally after the interrupt.
    r = tpusim.simulate(heads=2, seq_len=2048, block_q=512, block_kv=512)
    print("after", r.latency_ms > 0, flush=True)
    sys.exit(0)
"""

# Each long call takes seconds on a 2-core machine and is repeated until the signal (the sweep
# fell from about 10 s to under 3 s as the engine got faster, and ended before the signal).
CALLS = {
    "tune": r"""
def long_call():
    tpusim.tune(heads=10, seq_len=75600, mask="band:15000+sink:3600")
""",
    "sweep": r"""
# About 15 s of work (1,000 distinct lowerings): the signal lands well inside it.
points = [dict(heads=2, seq_len=16384 + 128 * (i % 1000), block_q=512, block_kv=512) for i in range(40000)]
def long_call():
    tpusim.sweep(points)
""",
    "simulate": r"""
def long_call():
    # A notebook cell looping over short calls: the signal lands between calls or inside one.
    tpusim.simulate(heads=8, seq_len=32768, mask="causal", block_q=512, block_kv=512)
""",
    "validate": r"""
import csv
with open({csv!r}) as f:
    rows = [{{k: v for k, v in r.items() if v != ""}} for r in csv.DictReader(l for l in f if not l.startswith("#"))]
rows = [dict(r, id=f"{{r['id']}}-{{i}}") for i in range(30) for r in rows]
def long_call():
    tpusim.validate(rows)
""",
    "jax.simulate": r"""
import jax, jax.numpy as jnp, numpy as np
import tpusim.jax as tj
import kernels
mask = np.random.default_rng(0).random((256, 256)) < 0.5
f = kernels.block_sparse_matmul(mask, bm=128, bk=128, bn=128)
x = jax.ShapeDtypeStruct((256 * 128, 256 * 128), jnp.bfloat16)
def long_call():
    tj.simulate(f, x, x)
""",
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_ctrl_c_interrupts_a_long_call_within_a_second(call):
    csv_path = os.path.join(ROOT, "traces", "measured", "calibration.csv")
    script = PRELUDE.format(here=HERE) + CALLS[call].format(csv=csv_path) + EPILOGUE
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready", p.communicate(timeout=60)
    time.sleep(3)  # well inside the call
    assert p.poll() is None, f"{call} ended before the signal: {p.communicate()}"
    # The first line the child prints after SIGINT, read on a thread so that a signal the
    # interpreter never raises (one landing while Python frees an object is reported as
    # "Exception ignored" and dropped) is sent again a second later, as a user presses Ctrl-C
    # again, instead of hanging the test; the assertions below still fail on such a drop.
    import queue
    import threading

    lines = queue.Queue()
    threading.Thread(target=lambda: lines.put(p.stdout.readline()), daemon=True).start()
    for _ in range(5):
        sent = time.monotonic()
        p.send_signal(signal.SIGINT)
        try:
            line = lines.get(timeout=1.0).strip()
            break
        except queue.Empty:
            line = None
    took = time.monotonic() - sent
    if line is None:
        p.kill()
        raise AssertionError(f"{call}: no KeyboardInterrupt after five SIGINTs a second apart: {p.communicate()}")
    # Read the rest through the same buffered file as the first line: `communicate` reads the
    # pipe itself and would miss a line that arrived with "interrupted" (the call after the
    # interrupt is short enough for both to come in one read).
    rest = p.stdout.read()
    err = p.stderr.read()
    p.wait(timeout=120)
    assert line == "interrupted", (call, line, rest, err)
    assert took < 1.0, f"{call}: KeyboardInterrupt {took:.2f} s after SIGINT"
    assert "Exception ignored" not in err, (call, err)
    assert "after True" in rest and p.returncode == 0, (call, rest, err)
    print(f"{call}: KeyboardInterrupt {took:.3f} s after SIGINT")
