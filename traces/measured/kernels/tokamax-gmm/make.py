"""Writes the kernel descriptions of tokamax's grouped matmul (ragged_dot) on v6e and their rows
of `traces/measured/calibration.csv`: one description per `return_residuals = 0` row of the
public measurements (openxla/tokamax @ d52c0797, `tokamax/data/autotuning/tpu_v6_lite/`) for each
implementation the row times:

- `tokamax-gmm/` (family `tokamax-gmm`): the Pallas Mosaic TPU ragged dot as tokamax 0.0.12 (PyPI)
  ships it (`tokamax/_src/ops/ragged_dot/pallas_mosaic_tpu.py`), called through its op with the
  row's config (tile_m, tile_k, tile_n, input_buffer_count);
- `tokamax-gmm-v2/` (family `tokamax-gmm-v2`): gmm_v2 (`tokamax/_src/ops/experimental/gmm_v2/
  gmm_v2.py` at d52c0797, which tokamax 0.0.12 does not have), ported to JAX 0.10.2 at run time
  by the replacements in `PORT` below (the file itself is read from a tokamax checkout and never
  stored here), called as d52c0797's `PallasMosaicTpuV2RaggedDot._fwd` calls it, tiles chosen by
  the kernel (`calculate_tiling`).

Offline: run by hand, never imported by the package or its tests (CI does not install tokamax).
Needs a separate environment with `jax[cpu]==0.10.2`, `tokamax==0.0.12` and the tpusim wheel
(traces/measured/kernels/README.md says how), a git checkout of openxla/tokamax that holds commit
d52c0797, and the measurements (the CSV of data/v6e-grouped-matmul.csv's columns):

    python3 -m venv ENV && ENV/bin/pip install "jax[cpu]==0.10.2" "tokamax==0.0.12" maturin
    ENV/bin/maturin build --release -m crates/tpusim-py/Cargo.toml -o WHEELS
    ENV/bin/pip install WHEELS/tpusim-*.whl
    ENV/bin/python traces/measured/kernels/tokamax-gmm/make.py --tokamax-git PATH/TO/tokamax \\
        --measurements v6e-grouped-matmul.csv --rows rows.csv

It writes `<id>.json.gz` into `tokamax-gmm/` and `tokamax-gmm-v2/` beside this file and the
calibration rows (calibration.csv's columns) to `--rows`.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import os
import subprocess
import sys
import tempfile

COMMIT = "d52c0797"
V2_PATH = "tokamax/_src/ops/experimental/gmm_v2/gmm_v2.py"
AUTOTUNING = "tokamax/data/autotuning/tpu_v6_lite"
HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = os.path.dirname(HERE)

# The port of gmm_v2.py @ d52c0797 to JAX 0.10.2: (text at d52c0797, text under 0.10.2, why).
# Each must occur exactly once. Nothing else of the kernel is changed.
PORT = [
    (
        'mesh=pltpu.TensorCoreMesh(axis_name="core"),',
        'mesh=pltpu.create_tensorcore_mesh("core"),',
        "JAX 0.10.2 has no `pltpu.TensorCoreMesh(axis_name=...)` constructor; "
        "`pltpu.create_tensorcore_mesh(axis_name)` builds the same one-axis mesh of the device's TensorCores",
    ),
]

COLUMNS = "id,chip,kernel,direction,batch,q_heads,kv_heads,q_len,kv_len,head_dim,head_dim_v,mask,traversal,masking,tile_align,block_q,block_kv,block_kv_compute,options,measured_ms,timing,source,kernel_ir".split(",")


def group_sizes(spec, m, groups):
    """The row's group sizes: `seed0` is tokamax's generated sizes for {num_groups, total_size}
    at d52c0797 (`np.bincount(np.random.default_rng(0).choice(G, m), minlength=G)`); otherwise
    the sizes as written, space-separated."""
    import numpy as np

    if spec == "seed0":
        gs = np.bincount(np.random.default_rng(0).choice(groups, m), minlength=groups)
    else:
        gs = np.array([int(x) for x in spec.split()])
    if gs.shape != (groups,) or gs.sum() != m:
        raise SystemExit(f"group sizes {spec!r}: expected {groups} sizes summing to m = {m}, got {gs.tolist()}")
    return gs.astype(np.int32)


def ported_gmm_v2(tokamax_git):
    """gmm_v2.py at d52c0797 with `PORT` applied, imported from a temporary folder."""
    text = subprocess.run(["git", "-C", tokamax_git, "show", f"{COMMIT}:{V2_PATH}"], check=True, capture_output=True, text=True).stdout
    for old, new, _ in PORT:
        if text.count(old) != 1:
            raise SystemExit(f"{V2_PATH} @ {COMMIT}: expected `{old}` once, found it {text.count(old)} times")
        text = text.replace(old, new)
    folder = tempfile.mkdtemp(prefix="gmm_v2_port_")
    path = os.path.join(folder, "gmm_v2_port.py")
    with open(path, "w") as f:
        f.write(text)
    spec = importlib.util.spec_from_file_location("gmm_v2_port", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def v1_call(kind, tiles, buffers):
    """tokamax 0.0.12's Pallas Mosaic TPU ragged dot as its op runs it, with the row's config.

    d52c0797 passes a dlhs config's tiles to the kernel as (tile_m, tile_n, tile_k) (its
    `pallas_mosaic_tpu.py`: "Treat config.tile_n as tk ... and config.tile_k as tn"); 0.0.12 passes
    (tile_m, tile_k, tile_n) as they are, so a dlhs row's tile_k and tile_n are given swapped here:
    the kernel then runs the tiles d52c0797 ran."""
    from tokamax._src.ops.ragged_dot import pallas_mosaic_tpu as v1

    tm, tk, tn = tiles
    if kind == "dlhs":
        tk, tn = tn, tk
    cfg = v1.Config(tile_m=tm, tile_k=tk, tile_n=tn, input_buffer_count=buffers)
    # The op asks the device it runs on whether it is a TPU of generation 5 or later; lowered on
    # a CPU host for a v6e, that is answered as the v6e would (generation 6).
    v1.PallasMosaicTpuRaggedDot.supported_on = lambda self, device: True
    op = v1.PallasMosaicTpuRaggedDot(config=cfg)
    dims = v1.DEFAULT_RAGGED_DOT_DIM_NUMS if kind == "fwd" else v1.DLHS_RAGGED_DOT_DIM_NUMS

    def f(lhs, rhs, gs):
        return op(lhs, rhs, group_sizes=gs, ragged_dot_dimension_numbers=dims)

    return f


def v2_call(kind, mod):
    """gmm_v2 as d52c0797's `PallasMosaicTpuV2RaggedDot._fwd` calls it for a row of the autotuning
    data (no quantization, bias, offset or activation; config all None: the kernel's own
    `calculate_tiling`; `zero_initialize=True`; dlhs: `transpose_rhs=True` and the output in the
    lhs's type)."""
    import jax.numpy as jnp

    def f(lhs, rhs, gs):
        return mod.gmm_v2(
            lhs, rhs, gs.astype(jnp.int32), None, None, None,
            tile_info=mod.calculate_tiling, vmem_limit_bytes=None, precision=None,
            preferred_element_type=None if kind == "fwd" else lhs.dtype, acc_dtype=None,
            maybe_quantize_lhs=False, zero_initialize=True, fuse_act=None, transpose_rhs=kind == "dlhs",
        )

    return f


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokamax-git", required=True, help="a git checkout of openxla/tokamax holding commit d52c0797")
    ap.add_argument("--measurements", required=True, help="the v6e grouped-matmul measurements (CSV)")
    ap.add_argument("--rows", required=True, help="where to write the calibration rows (CSV)")
    ap.add_argument("--only", default=None, help="only the rows whose id contains this text")
    a = ap.parse_args()
    sys.argv = sys.argv[:1]  # tokamax reads its absl flags from the command line: give it none

    import importlib.metadata as md

    import jax
    import jax.numpy as jnp

    import tpusim.jax as tj

    for pkg, want in (("jax", "0.10.2"), ("tokamax", "0.0.12")):
        if md.version(pkg) != want:
            raise SystemExit(f"{pkg} {md.version(pkg)} is installed; these descriptions are made with {pkg} {want}")
    v2 = ported_gmm_v2(a.tokamax_git)
    with open(a.measurements) as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    out = []
    for r in rows:
        if r["return_residuals"] != "0":
            continue  # with residuals the op adds an XLA copy of the output outside the kernel
        kind, m, k, n, g = r["kind"], int(r["m"]), int(r["k"]), int(r["n"]), int(r["groups"])
        gs = group_sizes(r["group_sizes"], m, g)
        lhs = jax.ShapeDtypeStruct((m, k), jnp.bfloat16)
        # fwd: rhs [G, k, n]; dlhs: lhs is dout [m, k] contracted with rhs [G, n, k] along k.
        rhs = jax.ShapeDtypeStruct((g, k, n) if kind == "fwd" else (g, n, k), jnp.bfloat16)
        shape = f"{kind}-m{m}-k{k}-n{n}-g{g}"
        impls = []
        if r["pallas_v1_ms"]:
            tiles = (int(r["pallas_v1_tile_m"]), int(r["pallas_v1_tile_k"]), int(r["pallas_v1_tile_n"]))
            buffers = int(r["pallas_v1_input_buffers"])
            note = f"tiles (tile_m, tile_k, tile_n) = {tiles}, input_buffer_count {buffers}"
            if kind == "dlhs":
                note += " (d52c0797 runs a dlhs config's tile_n as tk and tile_k as tn)"
            impls.append(("TKGMM", "tokamax-gmm", v1_call(kind, tiles, buffers), r["pallas_v1_ms"], "pallas_mosaic_tpu_ragged_dot.json", note))
        if r["gmm_v2_ms"]:
            impls.append(("TKGMMV2", "tokamax-gmm-v2", v2_call(kind, v2), r["gmm_v2_ms"], "pallas_mosaic_tpu_v2_ragged_dot.json", "tiles chosen by the kernel (calculate_tiling)"))
        for prefix, family, fn, ms, source_file, note in impls:
            rid = f"{prefix}-v6e-{shape}"
            if a.only and a.only not in rid:
                continue
            descs, outside = tj.describe_all(fn, lhs, rhs, gs, chip="v6e")
            if len(descs) != 1:
                raise SystemExit(f"{rid}: expected one Pallas kernel, found {len(descs)}")
            rel = os.path.join(family, f"{rid}.json.gz")
            tj._write(descs[0], os.path.join(KERNELS, rel))  # what tpusim.jax.describe writes
            groups = "seed0" if r["group_sizes"] == "seed0" else "[" + ", ".join(r["group_sizes"].split()) + "]"
            ops = ", ".join(o.removeprefix("stablehlo.") for o in outside) or "none"
            options = f"{note}; group sizes {groups}; XLA ops of the call outside the kernel, not simulated: {ops}"
            timing = "device time from profiler trace (tokamax hermetic_xprof, whole op; median of 5 evaluations); simulated: the Pallas kernel alone"
            source = f"openxla/tokamax @ {COMMIT} {AUTOTUNING}/{source_file} (median of 5 evaluation_times_ms)"
            out.append({"id": rid, "chip": "v6e", "kernel": family, "options": options, "measured_ms": ms, "timing": timing, "source": source, "kernel_ir": "kernels/" + rel})
            print(f"{rid}: {descs[0]['kernel_name']}; outside: {ops}", flush=True)
    with open(a.rows, "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        for row in out:
            w.writerow({c: row.get(c, "") for c in COLUMNS})
    print(f"{len(out)} rows -> {a.rows}")


if __name__ == "__main__":
    sys.exit(main())
