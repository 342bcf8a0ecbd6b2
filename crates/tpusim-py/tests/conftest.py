"""Shared helpers for the tests of the Python package `tpusim`.

The command line binary (`tpusim`) is taken from $TPUSIM_BIN, else from the workspace's
target/release (built by ../../../test.sh before pytest runs).
"""

import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]


def cli_path():
    p = os.environ.get("TPUSIM_BIN") or str(ROOT / "target" / "release" / "tpusim")
    if not os.path.exists(p):
        pytest.fail(f"the tpusim binary is missing at {p}: run `cargo build --release -p tpusim` (test.sh does)")
    return p


def run_cli(*args, expect=0, cwd=None):
    """Runs the binary; returns (stdout, stderr). Fails unless the exit code is `expect`."""
    r = subprocess.run([cli_path(), *map(str, args)], capture_output=True, text=True, cwd=cwd)
    assert r.returncode == expect, f"tpusim {' '.join(map(str, args))}: exit {r.returncode}\n{r.stderr}"
    return r.stdout, r.stderr


def run_json(*args):
    """`tpusim run ARGS --format json` as a dict."""
    out, _ = run_cli("run", *args, "--format", "json")
    return json.loads(out)


@pytest.fixture
def root():
    return ROOT
