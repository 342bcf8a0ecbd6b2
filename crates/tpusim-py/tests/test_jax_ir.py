"""tpusim.jax: Pallas kernels lowered for TPU on this CPU-only machine, read from their Mosaic
IR and simulated; checked against closed-form counts and against the hand-written models."""

import json
import os

import numpy as np
import pytest

import tpusim
import tpusim.jax as tj
from kernels import block_sparse_matmul, bf16, kv_major_flash, rms_norm, splash, tutorial_matmul

from conftest import run_cli


def test_version_and_description_version_match_the_reader(tmp_path):
    import jax

    assert jax.__version__ in tj.TESTED_JAX
    # The description version the module writes is the one the Rust reader reads.
    paths = tj.describe(tutorial_matmul(256, 256, 256), bf16(512, 512), bf16(512, 512), path=tmp_path / "mm.json")
    d = json.loads(open(paths[0]).read())
    assert d["version"] == tj.DESCRIPTION_VERSION
    d["version"] = tj.DESCRIPTION_VERSION + 1
    (tmp_path / "v2.json").write_text(json.dumps(d))
    _, err = run_cli("run", "--kernel-ir", tmp_path / "v2.json", expect=2)
    assert f"version {tj.DESCRIPTION_VERSION + 1}" in err and f"reads version {tj.DESCRIPTION_VERSION}" in err, err


@pytest.mark.parametrize("chip", ["v6e", "v5e"])
def test_tutorial_matmul_equals_the_hand_model(chip):
    m = n = k = 2048
    b = 512
    r = tj.simulate(tutorial_matmul(b, b, b), bf16(m, k), bf16(k, n), chip=chip)
    assert len(r) == 1
    ir = r[0]
    hand = tpusim.simulate(kernel="pallas-matmul", m=m, n=n, k=k, block_m=b, block_n=b, block_k=b, chip=chip)
    assert ir.grid_steps == hand.grid_steps == (m // b) * (n // b) * (k // b)
    # Steps computed: one definition for both front ends (every matmul step does MXU work).
    assert ir.steps_computed == hand.steps_computed == hand.grid_steps
    assert ir.flops == hand.flops == 2 * m * n * k
    assert ir.transcendentals == hand.transcendentals == 0
    # Every step copies an x and a y block; every output block is written once.
    assert ir.hbm_bytes == hand.hbm_bytes == (m // b) * (n // b) * (k // b) * 2 * b * b * 2 + m * n * 2
    assert abs(ir.latency_ms / hand.latency_ms - 1) < 0.03, (ir.latency_ms, hand.latency_ms)


@pytest.mark.parametrize("chip", ["v6e", "v5e"])
def test_block_sparse_matmul_counts_only_kept_blocks(chip):
    # A user kernel no hand model covers: 8 x 8 blocks of 256, a banded block mask.
    nb, b = 8, 256
    mask = np.array([[1 if abs(i - k) <= 1 else 0 for k in range(nb)] for i in range(nb)])
    kept = int(mask.sum())
    n = 512
    r = tj.simulate(block_sparse_matmul(mask, b, b, b), bf16(nb * b, nb * b), bf16(nb * b, n), chip=chip)[0]
    nn = n // b
    assert r.grid_steps == nb * nn * nb
    assert r.steps_computed == kept * nn
    assert r.flops == 2 * b * b * b * kept * nn
    # Copies: a kept block's x and y once per (i, j) row of k steps (the index map repeats the
    # last kept block over skipped steps, so their copies are elided); the output once.
    x_copies = y_copies = kept * nn
    assert r.hbm_bytes == (x_copies + y_copies) * b * b * 2 + nb * b * n * 2
    # Docs (README): on v6e and v5e this small-block kernel is bound by HBM / DMA, not the MXU:
    # 256^3 bf16 per 2 x 128 KiB copied is 1 FLOP per ... far below either chip's ridge.
    assert r.bottleneck in ("hbm", "step_control", "mxu"), r.bottleneck


@pytest.mark.parametrize("chip", ["v6e", "v5e"])
def test_fused_rms_norm_closed_form(chip):
    rows, d, br = 4096, 1024, 256
    r = tj.simulate(rms_norm(br), bf16(rows, d), bf16(1, d), chip=chip)[0]
    assert r.grid_steps == rows // br
    assert r.flops == 0
    # Per row, the mean's division (JAX lowers jnp.mean to a divide: a reciprocal on the EUP)
    # and the rsqrt, each on a (rows, 1) column: one register per 8 rows, counted as 1024 elements.
    assert r.transcendentals == 2 * (rows // 8) * 1024
    # x in and y out once each; the weight row once (its block index never changes).
    assert r.hbm_bytes == 2 * rows * d * 2 + d * 2
    # An element-wise kernel with a few VPU ops per element: bound by HBM on both chips.
    assert r.bottleneck == "hbm", (r.bottleneck, r.busy_ms)


@pytest.mark.parametrize("mask", ["full", "causal"])
def test_splash_forward_counts_equal_the_hand_model(mask):
    h, s, d, b = 4, 2048, 128, 512
    ir = tj.simulate(splash(mask, h, s, b), bf16(h, s, d), bf16(h, s, d), bf16(h, s, d), chip="v6e")[0]
    hand = tpusim.simulate(kernel="splash", heads=h, seq_len=s, head_dim=d, mask=mask, block_q=b, block_kv=b, block_kv_compute=b)
    assert ir.grid_steps == hand.grid_steps
    # The steps whose body does MXU work: the visited tiles, on both front ends.
    assert ir.steps_computed == hand.steps_computed == hand.tiles["visited"]
    assert ir.flops == hand.flops
    assert ir.transcendentals == hand.transcendentals


def test_errors_are_ours():
    import jax
    import jax.numpy as jnp

    with pytest.raises(tpusim.InputError, match="no Pallas kernel"):
        tj.simulate(lambda x: x @ x, bf16(256, 256))
    with pytest.raises(tpusim.InputError, match="device_kind"):
        tj.simulate(tutorial_matmul(256, 256, 256), bf16(512, 512), bf16(512, 512), chip="my-chip.toml")
    with pytest.raises(tpusim.InputError, match="block_q"):
        tj.simulate(tutorial_matmul(256, 256, 256), bf16(512, 512), bf16(512, 512), block_q=128)


def test_unknown_op_is_named(tmp_path):
    paths = tj.describe(tutorial_matmul(256, 256, 256), bf16(512, 512), bf16(512, 512), path=tmp_path / "mm.json")
    d = json.loads(open(paths[0]).read())
    d["body"].append({"op": "math.erf", "id": 9999, "shape": [256, 256], "dtype": "f32", "operands": [], "loc": "mine.py:7"})
    (tmp_path / "bad.json").write_text(json.dumps(d))
    _, err = run_cli("run", "--kernel-ir", tmp_path / "bad.json", expect=2)
    assert "math.erf" in err and "mine.py:7" in err and d["kernel_name"] in err, err


def test_cli_runs_a_description_and_refuses_job_flags(tmp_path):
    paths = tj.describe(tutorial_matmul(256, 256, 256), bf16(512, 512), bf16(512, 512), path=tmp_path / "mm.json")
    out, _ = run_cli("run", "--kernel-ir", paths[0], "--format", "json")
    rep = json.loads(out)
    assert rep["grid_steps"] == 8 and rep["flops"] == 2 * 512**3
    fast, _ = run_cli("run", "--kernel-ir", paths[0], "--format", "json", "--set", "hbm.bandwidth_gb_per_s=100000")
    assert json.loads(fast)["latency_ms"] <= rep["latency_ms"]
    _, err = run_cli("run", "--kernel-ir", paths[0], "--heads", "8", "--block-q", "256", expect=2)
    assert "--heads" in err and "--block-q" in err and "--kernel-ir" in err, err


def test_readme_example_runs(tmp_path, root, monkeypatch):
    text = (root / "README.md").read_text()
    section = text.split("## Your own Pallas kernel", 1)[1]
    code = section.split("```python", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})
    assert (tmp_path / "rms_norm.json").exists()
    out, _ = run_cli("run", "--kernel-ir", tmp_path / "rms_norm.json", "--chip", "v5e", "--format", "json")
    rep = json.loads(out)
    assert rep["bottleneck"] == "hbm" and rep["grid_steps"] == 32


def _renamed_splash():
    """JAX's Splash kernel module, read from the installed JAX at test time (no copy is kept in
    the repository), renamed and with one extra element-wise op per computed step: the score
    tile scaled once more (`qk = qk * 1.0001`, one f32 VPU multiply per score register)."""
    import importlib.util
    import sys
    import types

    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk

    src = open(sk.__file__).read()
    anchor = "    qk = apply_mask_and_soft_cap()\n"
    assert src.count(anchor) == 1, "the Splash source changed: update the anchor"
    src = src.replace(anchor, anchor + "    qk = qk * 1.0001\n")
    name_anchor = 'return f"splash_{attention_type}'
    assert src.count(name_anchor) == 1
    src = src.replace(name_anchor, 'return f"renamed_attention_{attention_type}')
    mod = types.ModuleType("renamed_splash_kernel")
    mod.__file__ = "renamed_splash_kernel.py"
    sys.modules["renamed_splash_kernel"] = mod
    exec(compile(src, "renamed_splash_kernel.py", "exec"), mod.__dict__)
    return mod


def test_renamed_splash_with_one_more_op_costs_that_op():
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    h, s, d, b = 4, 2048, 128, 512
    mod = _renamed_splash()
    mask = sm.MultiHeadMask([sm.CausalMask((s, s)) for _ in range(h)])
    q = bf16(h, s, d)
    orig = tj.simulate(sk.make_splash_mha(mask, block_sizes=sk.BlockSizes(block_q=b, block_kv=b, block_kv_compute=b), head_shards=1, q_seq_shards=1), q, q, q)[0]
    ren = tj.simulate(mod.make_splash_mha(mask, block_sizes=mod.BlockSizes(block_q=b, block_kv=b, block_kv_compute=b), head_shards=1, q_seq_shards=1), q, q, q)[0]
    assert ren.kernel_name.startswith("renamed_attention") and orig.kernel_name.startswith("splash")
    for f in ("grid_steps", "steps_computed", "flops", "transcendentals", "hbm_bytes"):
        assert getattr(ren, f) == getattr(orig, f), f
    chip = tpusim.chip("v6e")
    rate = chip["fitted"]["valu_vreg_ops_per_cycle"]["value"]
    clock = chip["device"]["clock_ghz"]["value"] * 1e9
    # One multiply per f32 score register (512 x 512 / 1024 = 256) on every computed step.
    want_ms = orig.steps_computed * (b * b / 1024) / rate / clock * 1e3
    got_ms = ren.busy_ms["vpu"] - orig.busy_ms["vpu"]
    assert abs(got_ms - want_ms) <= 1e-9 + 1e-6 * want_ms, (got_ms, want_ms)
    # The latency moves by at most the op's VPU time, and not backwards.
    assert -1e-9 <= ren.latency_ms - orig.latency_ms <= want_ms + 1e-9


def test_branch_on_a_runtime_table_names_the_operand():
    # The block mask given as a shape only: the kernel's `pl.when(mask_ref[i, k] != 0)` reads a
    # value nobody knows before the run; the error names the operand and where it is read.
    import jax
    import jax.numpy as jnp

    nb, b = 4, 256
    mask = np.eye(nb, dtype=np.int32)
    from kernels import block_sparse_matmul_runtime

    with pytest.raises(tpusim.InputError, match="prefetch 0") as e:
        tj.simulate(block_sparse_matmul_runtime(nb, b), jax.ShapeDtypeStruct((nb, nb), jnp.int32), bf16(nb * b, nb * b), bf16(nb * b, b))
    assert "runtime operand `mask`" in str(e.value) and "scf.if" in str(e.value) and "--runtime mask=" in str(e.value), str(e.value)
    # Given as concrete values, the same call simulates.
    r = tj.simulate(block_sparse_matmul_runtime(nb, b), jnp.asarray(mask), bf16(nb * b, nb * b), bf16(nb * b, b))[0]
    assert r.steps_computed == nb


def test_a_kernel_from_its_ir_is_reported_as_a_report_with_what_if_bound(tmp_path):
    # One report type for both front ends: the same class, the same metrics by the same names.
    hand = tpusim.simulate(kernel="pallas-matmul", m=1024, n=1024, k=1024, block_m=256, block_n=256, block_k=256)
    ir = tj.simulate(tutorial_matmul(256, 256, 256), bf16(1024, 1024), bf16(1024, 1024))[0]
    assert type(ir) is type(hand) is tpusim.Report
    assert ir.job["kind"] == "described" and ir.job["kernel_name"] == ir.kernel_name and hand.job["kind"] == "matmul"
    for name in ["latency_ms", "cycles", "flops", "transcendentals", "hbm_bytes", "mfu", "bottleneck", "co_bound",
                 "what_if_2x", "cost_estimate", "band", "grid_steps", "steps_computed", "vmem_bytes", "vmem_limit_bytes",
                 "critical_path_ms", "utilization", "step_classes"]:
        a, b = getattr(hand, name), getattr(ir, name)
        assert type(a) is type(b), (name, a, b)
    # The hand model's matmul and the tutorial kernel's IR are one model: equal latency.
    assert ir.latency_ms == hand.latency_ms and ir.what_if_2x == hand.what_if_2x
    assert ir.flops == hand.flops and ir.hbm_bytes == hand.hbm_bytes
    # Bound by the what-if table's largest gain, as on a Report.
    # The units' rows decide; the step and DMA mechanisms' rows follow them.
    units = ["mxu", "vpu", "eup", "xlu", "hbm", "step_control"]
    assert [w["unit"] for w in ir.what_if_2x] == units + ["dma_latency", "dma_issue", "dmas_in_flight"]
    gains = {w["unit"]: w["gain"] for w in ir.what_if_2x if w["unit"] in units}
    assert ir.bottleneck == max(gains, key=gains.get) and ir.bottleneck == hand.bottleneck
    # Each row is the lowering re-timed with its overrides: the same as simulating with them.
    row = next(w for w in ir.what_if_2x if w["unit"] == ir.bottleneck)
    again = tj.simulate(tutorial_matmul(256, 256, 256), bf16(1024, 1024), bf16(1024, 1024),
                        set=dict(s.split("=") for s in row["set"]))[0]
    assert abs(again.latency_ms - row["latency_ms"]) <= 1e-9 * row["latency_ms"]
    # The band is v6e's band of the kernels read from their IR that the calibration rows measure.
    assert ir.band["covered"] is True and ir.band["text"].startswith("v6e kernel-ir any kernel: median ")
    assert "band         v6e kernel-ir any kernel" in str(ir) and "what if 2x" in str(ir)
    # A field an IR job lacks says so.
    assert "tile_skip_efficiency" not in ir.to_dict() and ir.assumptions
    with pytest.raises(AttributeError, match="lacks it"):
        ir.tile_skip_efficiency


@pytest.mark.parametrize("chip,scale_k", [("v6e", False), ("v5e", False), ("v6e", True)])
def test_an_unrolled_sub_tile_loop_times_as_the_rolled_loop(chip, scale_k):
    # kv-major scores (k q^T): each sub-tile's softmax reduces over all rows of its scores, so
    # the next sub-tile's matmul must rank after this one's (as a rolled loop's iterations do),
    # not share its slots and interleave with it slab by slab (which held every reduction until
    # all sub-tiles' scores had streamed: 42.6 against 34.6 ms on the video case's tiles).
    x = bf16(2, 2048, 128)
    # With `scale_k` the k sub-tile reaches the matmul through a multiply and a cast.
    rolled = tj.simulate(kv_major_flash(unroll=False, scale_k=scale_k), x, x, x, chip=chip).kernels[0]
    unrolled = tj.simulate(kv_major_flash(unroll=True, scale_k=scale_k), x, x, x, chip=chip).kernels[0]
    assert unrolled.flops == rolled.flops and unrolled.hbm_bytes == rolled.hbm_bytes
    assert abs(unrolled.latency_ms / rolled.latency_ms - 1) < 0.01, (unrolled.latency_ms, rolled.latency_ms)


def _nt_matmul(also_store_transpose):
    """`x @ y.T` in one block (y stored [n, k]); optionally y.T stored as well, a second use."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    def kernel(x_ref, y_ref, o_ref, *t_ref):
        yt = y_ref[...].T
        o_ref[...] = jnp.dot(x_ref[...], yt, preferred_element_type=jnp.float32)
        if also_store_transpose:
            t_ref[0][...] = yt

    def f(x, y):
        out = [jax.ShapeDtypeStruct((x.shape[0], y.shape[0]), jnp.float32)]
        if also_store_transpose:
            out.append(jax.ShapeDtypeStruct((y.shape[1], y.shape[0]), y.dtype))
        return pl.pallas_call(kernel, out_shape=out)(x, y)

    return f


@pytest.mark.parametrize("chip", ["v6e", "v5e"])
def test_a_transpose_read_once_by_a_matmul_is_folded_into_it(chip):
    # Mosaic's canonicalize_matmul makes a transpose whose one use is a matmul's rhs the
    # matmul's transposed rhs and erases it: no cross-lane work. A transpose with a second use
    # stays, one XLU pass per register of its source.
    folded = tj.simulate(_nt_matmul(False), bf16(256, 128), bf16(1024, 128), chip=chip)[0]
    kept = tj.simulate(_nt_matmul(True), bf16(256, 128), bf16(1024, 128), chip=chip)[0]
    assert folded.flops == kept.flops == 2 * 256 * 128 * 1024
    assert folded.busy_ms["xlu"] == 0, folded.busy_ms
    assert kept.busy_ms["xlu"] > 0, kept.busy_ms


def test_a_transpose_of_leading_dimensions_is_not_folded():
    # A transpose that moves the batch dimension ([1, 0, 2]) is not one Mosaic folds into the
    # matmul, even where the shapes cannot tell it from a swap of the minor two (a cube).
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def kernel(x_ref, y_ref, o_ref):
        yt = jnp.transpose(y_ref[...], (1, 0, 2))
        o_ref[...] = jnp.einsum("bqd,bdk->bqk", x_ref[...], yt, preferred_element_type=jnp.float32)

    def f(x, y):
        out = jax.ShapeDtypeStruct(x.shape, jnp.float32)
        return pl.pallas_call(kernel, out_shape=out, compiler_params=pltpu.CompilerParams(vmem_limit_bytes=100 * 2**20))(x, y)

    import jax

    n = 128
    x = jax.ShapeDtypeStruct((n, n, n), jnp.bfloat16)
    r = tj.simulate(f, x, x, chip="v6e")[0]
    assert r.busy_ms["xlu"] > 0, r.busy_ms


def test_a_debug_print_runs_free_with_a_warning(tmp_path):
    """`pl.debug_print` (`tpu.log`) was refused as an unknown op: it runs free, with a warning
    that says so once, and the kernel times as it does without the print."""
    import warnings

    import jax
    from jax.experimental import pallas as pl

    def copy(printing):
        def kernel(x_ref, o_ref):
            if printing:
                pl.debug_print("step {}", pl.program_id(0))
            o_ref[...] = x_ref[...] * 2

        def f(x):
            return pl.pallas_call(
                kernel,
                grid=(4,),
                in_specs=[pl.BlockSpec((128, 128), lambda i: (i, 0))],
                out_specs=pl.BlockSpec((128, 128), lambda i: (i, 0)),
                out_shape=jax.ShapeDtypeStruct((512, 128), x.dtype),
            )(x)

        return f

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with_print = tj.simulate(copy(True), bf16(512, 128))
    said = [str(w.message) for w in caught if "debug_print" in str(w.message)]
    assert len(said) == 1 and "taken as free" in said[0], [str(w.message) for w in caught]
    without = tj.simulate(copy(False), bf16(512, 128))
    assert with_print.latency_ms == without.latency_ms


@pytest.mark.jax_ir
def test_megablox_gmm_is_recognised_and_family_names_a_kernels_band(tmp_path):
    """JAX's own megablox gmm (a generic kernel name, `kernel`, in `megablox/gmm.py`) is
    recognised from its ops' full source paths and quotes its family's band (issue 47 point 9:
    the description's `loc` keeps file names only, so recognising it when read never matched);
    `family=` names the family of a kernel tpusim does not recognise, and a bad one is refused."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.megablox import gmm

    m, k, n, groups = 512, 256, 512, 4
    sizes = np.full((groups,), m // groups, np.int32)

    def f(lhs, rhs, gs):
        return gmm(lhs, rhs, gs, preferred_element_type=jnp.float32, tiling=(128, 128, 128))

    args = (bf16(m, k), jax.ShapeDtypeStruct((groups, k, n), jnp.bfloat16), sizes)
    (path,) = tj.describe(f, *args, path=tmp_path / "gmm.json")
    assert json.load(open(path))["family"] == "megablox-gmm"
    r = tj.simulate(f, *args)[0]
    assert r.band["family"] == "megablox-gmm", r.band
    # A kernel of no library: the pooled band, unless the caller names its family.
    plain = tj.simulate(rms_norm(256), bf16(1024, 512), bf16(1, 512))[0]
    assert plain.band["family"] != "megablox-gmm" and "not known" in plain.band["text"], plain.band
    named = tj.simulate(rms_norm(256), bf16(1024, 512), bf16(1, 512), family="megablox-gmm")[0]
    assert named.band["family"] == "megablox-gmm", named.band
    (p2,) = tj.describe(rms_norm(256), bf16(1024, 512), bf16(1, 512), path=tmp_path / "rms.json", family="my-lib.rms")
    assert json.load(open(p2))["family"] == "my-lib.rms"
    with pytest.raises(tpusim.InputError, match=r"family = 'my lib': expected a kernel family word"):
        tj.simulate(rms_norm(256), bf16(1024, 512), bf16(1, 512), family="my lib")
