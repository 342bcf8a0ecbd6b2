#!/usr/bin/env bash
# The project's test command: the Rust workspace's tests, then the Python package's
# (crates/tpusim-py/test.sh: builds the wheel, installs it with pytest, NumPy and JAX for CPU in
# target/py-venv, and runs its tests).
set -euo pipefail
cd "$(dirname "$0")"
cargo test --workspace --release
crates/tpusim-py/test.sh
