#!/usr/bin/env bash
# Creates (once) the virtual environment the Python package is built and tested in, and installs
# its tools from PyPI: maturin, pytest, NumPy and JAX for CPU at the pin `tpusim.jax` supports
# (jax[cpu]==0.10.2, the `tpusim[jax]` extra of pyproject.toml). JAX's own Splash mask classes and
# mask processing are the reference the tests compare with, and CI lowers real Pallas kernels with
# it. Prints the environment's path.
# The folder is $TPUSIM_VENV, default target/py-venv in the workspace.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv=${TPUSIM_VENV:-$root/target/py-venv}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" >&2
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check "maturin>=1.5,<2" pytest numpy "jax[cpu]==0.10.2" >&2
echo "$venv"
