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

#: The IR-path tests (marker `jax_ir`): every test of these modules lowers kernels or programs with
#: the installed JAX and reads their IR (the README's kernels, JAX's flash attention, Splash forward
#: and backward, paged and ragged paged attention, megablox gmm, the agreement suite, meshes and
#: whole programs). `jax-releases.sh` runs them under each tested JAX release (`pytest -m jax_ir`).
JAX_IR_MODULES = {
    "test_jax_ir.py",
    "test_ir_inputs.py",
    "test_decode.py",
    "test_serving_kernel_ir.py",
    "test_runtime_sized.py",
    "test_agreement.py",
    "test_program.py",
    "test_jax_releases.py",
    "test_outputs.py",
}


def pytest_configure(config):
    config.addinivalue_line("markers", "jax_ir: lowers kernels with the installed JAX and reads their IR (jax-releases.sh runs these under each release)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in JAX_IR_MODULES:
            item.add_marker(pytest.mark.jax_ir)


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
