"""Ctrl-C works in Python: a long call (tpusim.tune of the 75,600-token sparse video layer runs
for about 20 s uninterrupted on a 2-core machine) raises KeyboardInterrupt soon after SIGINT,
and the interpreter is usable afterwards (no restart of a notebook kernel)."""

import os
import signal
import subprocess
import sys
import time

SCRIPT = r"""
import signal, sys, time
# Python raises KeyboardInterrupt only where SIGINT has its default handler; a process started
# with SIGINT ignored (a background job of a non-interactive shell, some CI runners) inherits
# the ignore. Install the handler, as a notebook kernel does.
signal.signal(signal.SIGINT, signal.default_int_handler)
import tpusim
print("ready", flush=True)
try:
    tpusim.tune(heads=10, seq_len=75600, mask="band:15000+sink:3600")
except KeyboardInterrupt:
    t = time.monotonic()
    print("interrupted", flush=True)
    # The interpreter goes on: a short call runs normally after the interrupt.
    r = tpusim.simulate(heads=2, seq_len=2048, block_q=512, block_kv=512)
    print("after", r.latency_ms > 0, flush=True)
    sys.exit(0)
print("finished without interrupt", flush=True)
sys.exit(1)
"""


def test_ctrl_c_interrupts_a_long_tune_within_seconds():
    p = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    time.sleep(3)  # well inside the search
    sent = time.monotonic()
    p.send_signal(signal.SIGINT)
    line = p.stdout.readline().strip()
    took = time.monotonic() - sent
    rest, err = p.communicate(timeout=60)
    assert line == "interrupted", (line, rest, err)
    assert took < 5.0, f"KeyboardInterrupt {took:.2f} s after SIGINT"
    assert "after True" in rest and p.returncode == 0, (rest, err)
    print(f"KeyboardInterrupt {took:.3f} s after SIGINT")
