#!/usr/bin/env bash
# Regenerates every figure of the case study in plots/ (and the example data they read), and the
# figures' numbers that plots/README.md quotes, from the same runs (`tpusim plot` prints them).
#
#   plots/make.sh            # from the repository root or anywhere
#   TPUSIM=path/to/tpusim plots/make.sh   # use an existing binary instead of building one
#   plots/make.sh --prose-only            # only the figures README.md quotes, and its numbers
#
# Inputs: plots/jobs/*.toml (the case-study jobs, `tpusim run --trace` files),
# traces/measured/calibration.csv (measurements). Outputs: plots/*.png, plots/data/*.csv, the
# numbers between <!--f:NAME--> and <!--/f--> in plots/README.md. PLOTS_OUT and PLOTS_README
# name another folder and README (the test that holds the README to the figures uses them).
# Needs only bash, sed and the tpusim binary (fonts are bundled in the binary).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
cd "$root"

if [[ -z "${TPUSIM:-}" ]]; then
  cargo build --release -q -p tpusim
  TPUSIM="${CARGO_TARGET_DIR:-$root/target}/release/tpusim"
fi
t() { "$TPUSIM" "$@"; }
dest="${PLOTS_OUT:-plots}"
readme="${PLOTS_README:-plots/README.md}"
prose_only=false
[[ "${1:-}" == "--prose-only" ]] && prose_only=true

jobs=(--trace plots/jobs/dense.toml --trace plots/jobs/sparse.toml --trace plots/jobs/aligned.toml)

# --- The figures README.md quotes, and its numbers from their output --------------------------

# Replaces the number between <!--f:NAME--> and <!--/f--> in the README with VALUE.
fill() {
  grep -q "<!--f:$1-->" "$readme" || { echo "plots/make.sh: $readme has no <!--f:$1--> marker" >&2; exit 1; }
  sed -i "s|<!--f:$1-->[^<]*<!--/f-->|<!--f:$1-->$2<!--/f-->|g" "$readme"
}
# The first capture of sed expression EXPR in TEXT (a figure's printed facts); fails when none.
fact() {
  local v
  v="$(sed -n "$1" <<<"$2" | head -n 1)"
  [[ -n "$v" ]] || { echo "plots/make.sh: no fact matches $1 in:" >&2; echo "$2" >&2; exit 1; }
  echo "$v"
}
# 76544 -> 76,544.
thousands() { sed ':a;s/\B[0-9]\{3\}\>/,&/;ta' <<<"$1"; }
# A list of percentages as the figure printed them: "78.3 89.0 93.5" -> "78.3%, 89.0%, 93.5%".
percents() { sed 's/ *$//; s/ /%, /g; s/$/%/' <<<"$1"; }

roof="$(t plot roofline "${jobs[@]}" --title "Roofline: video attention case study on v6e" --out "$dest/roofline.png")"
fill ridge "$(fact 's/^  ridge v6e: \([0-9]*\) FLOP\/B$/\1/p' "$roof")"
for j in dense sparse aligned; do
  fill "ai-$j" "$(thousands "$(fact "s/^  point $j: \([0-9]*\) FLOP\/B.*/\1/p" "$roof")")"
  fill "ceiling-$j" "$(fact "s/^  point $j: .*softmax ceiling (\([A-Z]*\)) \([0-9]*\) TFLOP\/s$/\1, \2/p" "$roof")"
done
exact="$(t plot tiles --trace plots/jobs/sparse.toml --out "$dest/tiles_exact.png")"
aligned="$(t plot tiles --trace plots/jobs/aligned.toml --out "$dest/tiles_aligned.png")"
fill partial-exact "$(fact 's/^  tiles: .* \([0-9]*\) partial, .*/\1/p' "$exact")"
fill partial-exact-share "$(fact 's/^  tiles: .*(partial \([0-9]*\)% of visited)$/\1/p' "$exact")"
fill partial-aligned "$(fact 's/^  tiles: .* \([0-9]*\) partial, .*/\1/p' "$aligned")"
fill padded-q "$(thousands "$(fact 's/^  padded: q \([0-9]*\), kv [0-9]*$/\1/p' "$exact")")"
fill padded-kv "$(thousands "$(fact 's/^  padded: q [0-9]*, kv \([0-9]*\)$/\1/p' "$exact")")"
# A transformer layer on a slice (tpusim layer): Wan 2.1 14B on a v6e-8 (2x4 mesh), guidance as two
# groups of four chips, Ulysses sequence parallelism within each group.
layer="$(t plot breakdown --layer --share --resolutions 720p,1080p,1440p --attentions dense,sparse \
  --title "Wan 2.1 14B block on v6e-8: share of layer time by part, dense vs sparse attention" --out "$dest/layer_breakdown.png")"
for a in dense sparse; do
  fill "share-$a" "$(percents "$(sed -n "s/^  [0-9]*p $a: .* ms, attention \([0-9.]*\)%$/\1/p" <<<"$layer" | tr '\n' ' ')")"
done
# The marks are the case study's published end-to-end speedups (Google for Developers blog, "Accelerating
# Spatio-Temporal Attention for Video Diffusion on TPUs", 2026-09-30: 40 steps on eight v6e chips); they are
# drawn for comparison only and enter no simulated number.
speedup="$(t plot speedup --resolutions 720p,1080p,1440p --mark 720p=1.28 --mark 1080p=1.49 --mark 1440p=1.69 \
  --title "Wan 2.1 14B on v6e-8: end-to-end speedup of sparse attention over the dense fraction" --out "$dest/layer_speedup.png")"
fill fractions "$(sed -n 's/^  [0-9]*p: .* at dense fraction \([0-9.]*\)$/\1/p' <<<"$speedup" | paste -sd, - | sed 's/,/, /g')"
if $prose_only; then
  echo "plots/make.sh: the figures $readme quotes written to $dest/, its numbers filled"
  exit 0
fi

# --- Example data -----------------------------------------------------------------------------

# A JSON report's top-level number or string for KEY (first occurrence).
field() { sed -n "s/^  \"$1\": \"\{0,1\}\([^\",]*\)\"\{0,1\},\{0,1\}$/\1/p" <<<"$2" | head -n 1; }
# The chosen block_kv_compute (nested in job.config).
compute() { sed -n 's/^ *"block_kv_compute": \([0-9]*\),\{0,1\}$/\1/p' <<<"$1" | head -n 1; }

# Block-size sweep of the sparse case study (exact and tile-aligned mask): the same columns a
# `tpusim sweep` output has (latency_ms, block_q, block_kv, swept fields, metrics).
sweep_csv=plots/data/sweep_example.csv
{
  echo "case,tile_align,block_q,block_kv,block_kv_compute,latency_ms,mfu,achieved_tflops,tile_density,speedup_vs_dense,bottleneck,error"
  for align in false true; do
    for bq in 1024 1536 2048 2560 3072 3328 4096; do
      for bkv in 512 1024 1536 2048 3072; do
        case_name=sparse; [[ $align == true ]] && case_name=aligned
        flags=(--trace plots/jobs/sparse.toml --block-q "$bq" --block-kv "$bkv" --format json)
        [[ $align == true ]] && flags+=(--tile-align)
        if out="$(t run "${flags[@]}" 2>&1)"; then
          echo "$case_name,$align,$bq,$bkv,$(compute "$out"),$(field latency_ms "$out"),$(field mfu "$out"),$(field achieved_tflops "$out"),$(field tile_density "$out"),$(field speedup_vs_dense "$out"),$(field bottleneck "$out"),"
        else
          # A tiling that does not fit: no metrics, the error instead (quoted for commas).
          msg="$(head -n 1 <<<"$out" | sed 's/^error: //; s/"/'"'"'/g')"
          echo "$case_name,$align,$bq,$bkv,,,,,,,,\"$msg\""
        fi
      done
    done
  done
} >"$sweep_csv.tmp"
mv "$sweep_csv.tmp" "$sweep_csv"

# Predicted vs measured: every row of the measurement CSV that tpusim can model.
val_csv=plots/data/validation.csv
t validate traces/measured/calibration.csv --format csv >"$val_csv.tmp"
mv "$val_csv.tmp" "$val_csv"

# --- Figures ----------------------------------------------------------------------------------

t plot breakdown "${jobs[@]}" --title "Busy time per unit: dense vs sparse vs tile-aligned (v6e)" --out "$dest"/breakdown.png
# block_kv_compute 256: chosen when the v5e model had a 16 MiB scoped VMEM limit (now 32 MiB, as XLA gives it); kept so that this figure compares with earlier ones.
t plot breakdown --trace plots/jobs/dense.toml --block-kv-compute 256 --chips v6e,v5e,v5p \
  --title "Busy time per unit: dense video attention on three chips (blocks 3024/2048/256)" --out "$dest"/breakdown_chips.png
t plot timeline --trace plots/jobs/dense.toml --steps 10:13 --out "$dest"/timeline_dense.png
t plot timeline --trace plots/jobs/sparse.toml --steps 10:13 --out "$dest"/timeline_sparse.png
t plot validation --input "$val_csv" --out "$dest"/validation.png
t plot sweep --input "$sweep_csv" --where case=sparse --x block_kv --y latency_ms --series block_q \
  --title "Sparse video attention (exact mask, v6e): latency vs block_kv, one line per block_q" --out "$dest"/sweep.png
t plot heatmap --input "$sweep_csv" --where case=aligned --x block_kv --y block_q --z latency_ms \
  --title "Tile-aligned sparse video attention (v6e): latency (ms) over block_q x block_kv" --out "$dest"/heatmap.png
t plot breakdown --layer --slices 1,4,8,16 --attentions dense,sparse \
  --title "Wan 2.1 14B block at 720p on 1 to 16 v6e chips: layer time per chip by part" --out "$dest"/layer_breakdown_chips.png
echo "plots/make.sh: figures written to $dest/, the numbers of $readme filled"
