#!/usr/bin/env bash
# Runs the IR-path tests (pytest marker `jax_ir`, tests/conftest.py: the README's kernels, JAX's
# flash attention, Splash forward and backward, paged and ragged paged attention, megablox gmm,
# the agreement suite, meshes and whole programs, and the comparison of predictions across
# releases) under each JAX release tpusim.jax is tested with, each in its own environment, and
# prints one row per release: tests passed, failed and in error, and seconds.
#
#   crates/tpusim-py/jax-releases.sh [--no-build] [--envs-only] [--predictions] [RELEASE ...]
#
# RELEASE defaults to every release of `TESTED_JAX` in python/tpusim/jax.py (the one list).
# Each environment is target/jax-envs/RELEASE/ (python3 -m venv), made once and reused: JAX for
# CPU at that release, NumPy, pytest and absl-py (as the package's `jax` extra has it: JAX 0.9.2
# imports absl without requiring it), then the package's wheel with --no-deps.
# The wheel is built once (maturin, as test.sh builds it, with target/py-venv's maturin) unless
# --no-build is given, which takes the one test.sh left in target/wheels/tpusim-py.
# The cross-release test compares each release's predictions with the newest release's (the
# newest's with the oldest's): with target/jax-envs/NEWEST, else target/py-venv when it holds that
# release (as in CI), named in $TPUSIM_JAX_REFERENCE.
# --envs-only makes the environments and installs the wheel, and runs no test.
# --predictions also prints the latency of each kernel of tests/release_kernels.py per release.
# Extra pytest arguments: $JAX_RELEASES_PYTEST (e.g. "-x -k splash").
# Exit status: 0 when every release's tests passed, 1 otherwise, 2 for bad arguments.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=1
envs_only=0
predictions=0
releases=()
for a in "$@"; do
  case "$a" in
    --no-build) build=0 ;;
    --envs-only) envs_only=1 ;;
    --predictions) predictions=1 ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "jax-releases.sh: unknown option $a (expected --no-build, --envs-only, --predictions, or JAX releases such as 0.9.0)" >&2; exit 2 ;;
    *) releases+=("$a") ;;
  esac
done
# The tested releases, read from jax.py without importing it (the package needs its compiled module).
tested=$(python3 - "$here/python/tpusim/jax.py" <<'EOF'
import ast, sys
tree = ast.parse(open(sys.argv[1]).read())
for node in tree.body:
    if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "TESTED_JAX" for t in node.targets):
        print(" ".join(ast.literal_eval(node.value)))
EOF
)
if [ -z "$tested" ]; then
  echo "jax-releases.sh: TESTED_JAX not found in python/tpusim/jax.py" >&2
  exit 2
fi
read -r -a all <<<"$tested"
oldest=${all[0]}
newest=${all[${#all[@]}-1]}
if [ ${#releases[@]} -eq 0 ]; then
  releases=("${all[@]}")
fi
for r in "${releases[@]}"; do
  case " $tested " in
    *" $r "*) ;;
    *) echo "jax-releases.sh: JAX $r is not one of the tested releases ($tested); add it to TESTED_JAX first" >&2; exit 2 ;;
  esac
done

wheels="$root/target/wheels/tpusim-py"
if [ "$build" = 1 ]; then
  venv=$("$here/env.sh")
  # The tpusim binary the tests call, as test.sh builds it (the workspace tests' features).
  cargo test --workspace --release --no-run --quiet
  rm -rf "$wheels"
  "$venv/bin/maturin" build --release --quiet -m "$here/Cargo.toml" -o "$wheels"
fi
wheel=$(ls "$wheels"/tpusim-*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$wheel" ]; then
  echo "jax-releases.sh: no wheel in $wheels: run without --no-build (or crates/tpusim-py/test.sh) first" >&2
  exit 2
fi

jax_of() { "$1" -c 'import importlib.metadata as m; print(m.version("jax"))' 2>/dev/null || true; }

# Makes (once) the environment of release $1 and installs the wheel into it.
make_env() {
  local r=$1 env="$root/target/jax-envs/$1"
  if [ ! -x "$env/bin/python" ]; then
    python3 -m venv "$env" >&2
  fi
  local have="import importlib.metadata as m, numpy, pytest, absl; assert m.version('jax') == m.version('jaxlib') == '$r'"
  if ! "$env/bin/python" -c "$have" >/dev/null 2>&1; then
    echo "jax-releases.sh: installing jax[cpu]==$r, numpy, pytest, absl-py into $env" >&2
    "$env/bin/python" -m pip install -q --disable-pip-version-check "jax[cpu]==$r" numpy pytest absl-py >&2
  fi
  "$env/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$wheel" >&2
}

# The Python of release $1's environment: target/jax-envs/$1, else target/py-venv when it holds
# that release; empty when neither does.
python_of() {
  local p
  for p in "$root/target/jax-envs/$1/bin/python" "$root/target/py-venv/bin/python"; do
    if [ -x "$p" ] && [ "$(jax_of "$p")" = "$1" ]; then
      echo "$p"
      return
    fi
  done
}

for r in "${releases[@]}"; do
  make_env "$r"
done
[ "$envs_only" = 1 ] && exit 0

results=()
status=0
total_passed=0
total_failed=0
for r in "${releases[@]}"; do
  env="$root/target/jax-envs/$r"
  want=$newest
  [ "$r" = "$newest" ] && want=$oldest
  ref=$(python_of "$want")
  if [ -n "$ref" ]; then
    "$ref" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$wheel" >&2
  else
    echo "jax-releases.sh: no environment of JAX $want to compare JAX $r's predictions with (the test skips)" >&2
  fi
  log="$root/target/jax-envs/$r.pytest.log"
  start=$(date +%s)
  set +e
  (cd "$here" && TPUSIM_BIN="$root/target/release/tpusim" TPUSIM_JAX_REFERENCE="$ref" "$env/bin/python" -m pytest -q \
    -p no:cacheprovider -m jax_ir ${JAX_RELEASES_PYTEST:-} tests) >"$log" 2>&1
  rc=$?
  set -e
  secs=$(( $(date +%s) - start ))
  # pytest's closing line (-q: "144 passed, 96 deselected in 98.1s"; else framed in "=").
  summary=$(grep -E '^=* ?[0-9]+ (passed|failed|errors?|skipped|deselected)|no tests ran' "$log" | tail -n 1 | sed -E 's/^=+ //; s/ =+$//' || true)
  count() { echo "$summary" | grep -oE "[0-9]+ $1" | grep -oE '[0-9]+' || echo 0; }
  echo "JAX $r: ${summary:-no summary (exit $rc)}, $secs s (log: $log)" >&2
  results+=("$(printf '| %-8s | %6s | %6s | %6s | %7s | %7s |' "$r" "$(count passed)" "$(count failed)" "$(count 'errors?')" "$(count skipped)" "$secs")")
  total_passed=$(( total_passed + $(count passed) ))
  total_failed=$(( total_failed + $(count failed) + $(count 'errors?') ))
  if [ "$rc" != 0 ]; then
    status=1
    [ -z "$summary" ] && total_failed=$(( total_failed + 1 ))
    tail -n 30 "$log" >&2
  fi
done
echo "| JAX      | passed | failed | errors | skipped | seconds |"
echo "|----------|--------|--------|--------|---------|---------|"
printf '%s\n' "${results[@]}"
# The tests pass or fail; this prints what they compare, for the record.
if [ "$predictions" = 1 ]; then
  out="$root/target/jax-envs/predictions"
  mkdir -p "$out"
  for r in "${releases[@]}"; do
    "$root/target/jax-envs/$r/bin/python" "$here/tests/release_kernels.py" >"$out/$r.json"
  done
  python3 - "$out" "${releases[@]}" <<'EOF'
import json, sys
folder, releases = sys.argv[1], sys.argv[2:]
runs = {r: json.load(open(f"{folder}/{r}.json"))["reports"] for r in releases}
first = runs[releases[0]]
print("| kernel | " + " | ".join(f"JAX {r} ms" for r in releases) + " |")
print("|---|" + "---|" * len(releases))
for name in first:
    for k in range(len(first[name])):
        cells = []
        for r in releases:
            rep = runs[r][name][k] if k < len(runs[r].get(name, [])) else None
            cells.append("-" if rep is None else f"{rep['latency_ms']:.6f}" + ("" if rep == first[name][k] else " (differs)"))
        print(f"| {name} [{first[name][k]['kernel_name']}] | " + " | ".join(cells) + " |")
EOF
fi
# The plain closing line CI reads: every release's tests together.
echo "jax-releases: $total_passed passed, $total_failed failed"
exit $status
