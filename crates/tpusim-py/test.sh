#!/usr/bin/env bash
# Builds the Python package's wheel with maturin (release, abi3), installs it into the test
# environment (env.sh) and runs its tests (tests/) against JAX on CPU and the tpusim binary.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=$("$here/env.sh")
# The tpusim binary the tests call, built as the workspace's tests build it (the same features and
# profile as `cargo test --workspace --release`), so after ./test.sh's Rust tests this is a no-op
# instead of a second build of the binary with another feature set.
cargo test --workspace --release --no-run --quiet
start=$(date +%s)
rm -rf "$root/target/wheels/tpusim-py"
"$venv/bin/maturin" build --release --quiet -m "$here/Cargo.toml" -o "$root/target/wheels/tpusim-py"
echo "tpusim-py: wheel built in $(( $(date +%s) - start )) s: $(ls "$root"/target/wheels/tpusim-py)"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$root"/target/wheels/tpusim-py/tpusim-*.whl
cd "$here"
TPUSIM_BIN="$root/target/release/tpusim" "$venv/bin/python" -m pytest -q -p no:cacheprovider tests
