#!/usr/bin/env bash
# Runs the benches and writes their tables into README.md and studies/README.md between the
# `<!-- tpusim bench-simulate/bench-sweep/bench-ir: begin/end -->` markers (the rest of each file is not
# touched). TPUSIM_BENCH_SKIP_1M=1 skips the million-point sweep and then writes nothing, so the
# tables never lose that row. TPUSIM_BENCH_JOBS=N sets the sweep threads.
set -euo pipefail
cd "$(dirname "$0")"
# Absolute paths: cargo runs each bench in its package folder.
splice=(--splice "$PWD/README.md" --splice "$PWD/studies/README.md")
if [[ ${TPUSIM_BENCH_SKIP_1M:-0} == 1 ]]; then splice=(); fi
cargo bench -p tpusim-job --bench simulate -- "${splice[@]}"
cargo bench -p tpusim --bench commands -- "${splice[@]}"
cargo bench -p tpusim-pallas --bench from_description -- "${splice[@]}"
