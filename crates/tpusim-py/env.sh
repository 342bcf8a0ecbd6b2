#!/usr/bin/env bash
# Creates (once) the virtual environment the Python package is built and tested in, and installs
# its tools from PyPI: maturin, pytest, NumPy and JAX for CPU at the newest release `tpusim.jax` is
# tested with (jax[cpu]==0.10.2, the newest the `jax` extra of pyproject.toml allows;
# jax-releases.sh tests the older ones in environments of their own). JAX's own Splash mask
# classes and mask processing are the reference the tests compare with, and CI lowers real Pallas
# kernels with it. Prints the environment's path.
# The folder is $TPUSIM_VENV, default target/py-venv in the workspace.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv=${TPUSIM_VENV:-$root/target/py-venv}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" >&2
fi
pkgs=("maturin>=1.5,<2" pytest numpy "jax[cpu]==0.10.2")
# Quiet when everything is installed already; otherwise pip's progress (JAX and jaxlib are large
# downloads) shows on stderr, so a first run does not sit silent for minutes.
have='import importlib.metadata as m, numpy, pytest; m.version("maturin"); assert m.version("jax") == m.version("jaxlib") == "0.10.2"'
if "$venv/bin/python" -c "$have" >/dev/null 2>&1; then
  :
else
  echo "tpusim-py: installing ${pkgs[*]} into $venv (first run: JAX and jaxlib are large downloads)" >&2
  "$venv/bin/python" -m pip install --disable-pip-version-check --progress-bar on "${pkgs[@]}" >&2
fi
echo "$venv"
