"""The IR path's inputs a new user gets wrong, and kernels it must read: a loop that carries a
vector, a kernel's own cost estimate, scalar-prefetch indices outside the array, operands larger
than HBM, and the Python arguments around them (set=, args, path=, top=)."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import tpusim
import tpusim.jax as tj


def _loop_carried(n=10):
    """o = sum over n iterations of x, the running sum carried by fori_loop as a vector."""

    def kernel(x_ref, o_ref):
        o_ref[...] = jax.lax.fori_loop(0, n, lambda i, c: c + x_ref[...], jnp.zeros(o_ref.shape, jnp.float32))

    def f(x):
        return pl.pallas_call(
            kernel,
            grid=(x.shape[0] // 256,),
            in_specs=[pl.BlockSpec((256, x.shape[1]), lambda i: (i, 0))],
            out_specs=pl.BlockSpec((256, x.shape[1]), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct(x.shape, jnp.float32),
        )(x)

    return f


def _add(cost=None):
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] + y_ref[...]

    def f(x, y):
        spec = pl.BlockSpec((256, 1024), lambda i: (i, 0))
        return pl.pallas_call(
            kernel, grid=(x.shape[0] // 256,), in_specs=[spec, spec], out_specs=spec, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), cost_estimate=cost
        )(x, y)

    return f


def _gather(rows=2048, block=256):
    """Copies the row blocks a scalar-prefetch table names."""

    def kernel(idx_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...]

    def f(idx, x):
        return pl.pallas_call(
            kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1,
                grid=(rows // block,),
                in_specs=[pl.BlockSpec((block, 1024), lambda i, idx: (idx[i], 0))],
                out_specs=pl.BlockSpec((block, 1024), lambda i, idx: (i, 0)),
            ),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        )(idx, x)

    return f


F32 = jax.ShapeDtypeStruct((1024, 1024), jnp.float32)


def test_a_loop_carrying_a_vector_is_read_and_counts_each_iteration():
    one = tj.simulate(_loop_carried(1), F32).kernels[0]
    ten = tj.simulate(_loop_carried(10), F32).kernels[0]
    assert ten.grid_steps == one.grid_steps == 4
    # Ten adds of every register against one, the same copies.
    assert ten.hbm_bytes == one.hbm_bytes
    assert ten.busy_ms["vpu"] > 5 * one.busy_ms["vpu"], (ten.busy_ms, one.busy_ms)


def test_a_kernels_own_cost_estimate_is_read():
    r = tj.simulate(_add(pl.CostEstimate(flops=1, transcendentals=2, bytes_accessed=3)), F32, F32).kernels[0]
    declared = r.to_dict()["declared_cost_estimate"]
    assert declared == {"flops": 1.0, "transcendentals": 2.0, "bytes_accessed": 3.0}, declared
    # A kernel that declares none has no such field (as attention-only fields are absent elsewhere).
    assert "declared_cost_estimate" not in tj.simulate(_add(), F32, F32).kernels[0].to_dict()


def test_scalar_prefetch_indices_outside_the_array_are_refused():
    x = jax.ShapeDtypeStruct((2048, 1024), jnp.float32)
    ok = tj.simulate(_gather(), np.arange(8, dtype=np.int32)[::-1].copy(), x).kernels[0]
    assert ok.grid_steps == 8
    for bad, shown in ((np.full(8, 100, dtype=np.int32), "= 100"), (np.full(8, -1, dtype=np.int32), "= -1")):
        with pytest.raises(tpusim.InputError, match=r"index map of .*block index 0 " + shown + r": expected 0 to 7"):
            tj.simulate(_gather(), bad, x)


def test_operands_larger_than_hbm_are_refused():
    big = jax.ShapeDtypeStruct((2**20, 2**14), jnp.bfloat16)
    with pytest.raises(tpusim.InputError, match=r"HBM operands.*the device holds 34359738368 bytes \(32 GiB"):
        tj.simulate(_add(), big, big)


def test_python_arguments_are_checked_by_name(tmp_path):
    f = _add()
    # set= takes one string, a list of them or a dict, as tpusim.simulate does.
    one = tj.simulate(f, F32, F32, set="hbm.dma_bandwidth_gb_per_s=100").latency_ms
    assert one == tj.simulate(f, F32, F32, set=["hbm.dma_bandwidth_gb_per_s=100"]).latency_ms
    assert one > tj.simulate(f, F32, F32).latency_ms
    with pytest.raises(tpusim.InputError, match=r"set = 5: expected 'SECTION.FIELD=VALUE'"):
        tj.simulate(f, F32, F32, set=5)
    with pytest.raises(tpusim.InputError, match=r"args\[1\] = 3: expected an array or a jax.ShapeDtypeStruct"):
        tj.simulate(f, F32, 3)
    for top in (0, -1, 1.5):
        with pytest.raises(tpusim.InputError, match=r"top = .*: expected a whole number from 1"):
            tj.tune(lambda c: f, [1, 2], F32, F32, top=top)
    with pytest.raises(tpusim.InputError, match="candidates: none given"):
        tj.tune(lambda c: f, [], F32, F32)
    with pytest.raises(tpusim.InputError, match=r"device_kind = 'TPU v99': expected one of the JAX device kinds 'TPU v4' \(v4\)"):
        tj.simulate(f, F32, F32, device_kind="TPU v99")
    # describe(path=): refused before lowering, naming the path given; nothing left behind.
    with pytest.raises(tpusim.InputError, match="does not exist"):
        tj.describe(f, F32, F32, path=str(tmp_path / "nodir" / "k.json"))
    with pytest.raises(tpusim.InputError, match="is a directory"):
        tj.describe(f, F32, F32, path=str(tmp_path))
    with pytest.raises(tpusim.InputError, match="expected a file path"):
        tj.describe(f, F32, F32, path=None)
    assert list(tmp_path.iterdir()) == []


def test_tile_counts_of_a_text_mask_needs_its_lengths():
    with pytest.raises(tpusim.InputError, match="no shape of its own.*give q_len and kv_len"):
        tpusim.tile_counts("causal", 512, 512)
    with pytest.raises(tpusim.InputError, match="q_len, kv_len: give both or neither"):
        tpusim.tile_counts("causal", 512, 512, q_len=4096)
    (c,) = tpusim.tile_counts("causal", 512, 512, q_len=4096, kv_len=4096)
    assert (c["empty"], c["partial"], c["full"]) == (28, 8, 28)


def test_flash_attention_takes_full_or_causal_only():
    tpusim.simulate(kernel="flash-attention", heads=2, seq_len=2048, mask="causal")
    with pytest.raises(tpusim.InputError, match="flash-attention .* takes full or causal only"):
        tpusim.simulate(kernel="flash-attention", heads=2, seq_len=2048, mask="local:128,0")


def test_chip_takes_overrides_as_simulate_does_and_names_bad_arguments():
    assert tpusim.chip()["name"] == tpusim.chip("v6e")["name"]
    for o in ("mxu.rows=256", ["mxu.rows=256"], {"mxu.rows": 256}):
        assert tpusim.chip("v5e", o)["mxu"]["rows"]["value"] == 256
        assert tpusim.chip("v5e", set=o)["mxu"]["rows"]["value"] == 256
    with pytest.raises(tpusim.InputError, match=r"name_or_path = 5: expected a preset name"):
        tpusim.chip(5)
    with pytest.raises(tpusim.InputError, match=r"overrides = 5: expected a dict"):
        tpusim.chip("v5e", 5)


def test_a_float_carried_through_a_loop_is_simulated_and_refused_only_where_it_steers_the_path():
    # A fori_loop accumulating a float scalar: the simulator does not evaluate floats, and needs
    # not, since no index, bound or branch reads it.
    def kernel(x_ref, o_ref):
        s = jax.lax.fori_loop(0, 4, lambda i, acc: acc + 0.5, jnp.float32(0.0))
        o_ref[...] = x_ref[...] * s

    def f(x):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    x = jnp.ones((8, 128), jnp.float32)
    r = tj.simulate(f, x, chip="v6e")[0]
    assert r.latency_ms > 0

    # A branch on it cannot be decided: refused at the branch, naming what it reads.
    def steered(x_ref, o_ref):
        s = jax.lax.fori_loop(0, 4, lambda i, acc: acc + 0.5, jnp.float32(0.0))

        @pl.when(s.astype(jnp.int32) > 1)
        def _():
            o_ref[...] = x_ref[...]

    def g(x):
        return pl.pallas_call(steered, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    with pytest.raises(tpusim.InputError, match=r"the `scf.if` condition at .* reads the result of `arith.fptosi`, a value the simulator does not evaluate"):
        tj.simulate(g, x, chip="v6e")


def test_a_matmul_whose_rows_span_two_dimensions_is_read():
    # dot_general of a [4, 128, 256] lhs by a [256, 512] rhs: Mosaic collapses the lhs's two row
    # dimensions into one (512 rows), and the description's mkn says so.
    def kernel(x_ref, w_ref, o_ref):
        o_ref[...] = jax.lax.dot_general(x_ref[...], w_ref[...], (((2,), (0,)), ((), ())), preferred_element_type=jnp.float32)

    def f(x, w):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((x.shape[0], x.shape[1], w.shape[1]), jnp.float32))(x, w)

    x = jax.ShapeDtypeStruct((4, 128, 256), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((256, 512), jnp.bfloat16)
    r = tj.simulate(f, x, w, chip="v6e")[0]
    assert r.flops == 2 * 512 * 256 * 512


def test_tune_names_the_candidates_it_leaves_out():
    # Row blocks of an add over 8192 x 1024 f32: 4096 rows need 96 MiB of double-buffered
    # windows, past v6e's 32 MiB scoped limit, and are left out with a warning and their reason.
    def make(rows):
        def kernel(x_ref, y_ref, o_ref):
            o_ref[...] = x_ref[...] + y_ref[...]

        def f(x, y):
            spec = pl.BlockSpec((rows, 1024), lambda i: (i, 0))
            return pl.pallas_call(kernel, grid=(x.shape[0] // rows,), in_specs=[spec, spec], out_specs=spec, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)

        return f

    x = jax.ShapeDtypeStruct((8192, 1024), jnp.float32)
    with pytest.warns(UserWarning, match=r"tune: 1 of 3 candidates were left out of the ranking .* the first, 4096: .*VMEM"):
        ranked = tj.tune(make, [512, 4096, 1024], x, x)
    assert [c for c, _, _ in ranked] and sorted(c for c, _, _ in ranked) == [512, 1024]
    assert [c for c, _ in ranked.failures] == [4096] and "VMEM" in ranked.failures[0][1]


def test_a_static_grid_of_zero_steps_is_named_as_such():
    # 256 rows in blocks of 512: grid (256 // 512,) = (0,) in the lowering itself, not a grid
    # computed at run time.
    def f(x):
        spec = pl.BlockSpec((512, 1024), lambda i: (i, 0))
        return pl.pallas_call(lambda x_ref, o_ref: None, grid=(x.shape[0] // 512,), in_specs=[spec], out_specs=spec, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    x = jax.ShapeDtypeStruct((256, 1024), jnp.float32)
    with pytest.warns(UserWarning, match=r"grid \[0\] \(dimension 0 is 0 in the lowering itself, e.g. an array dimension smaller than its block"):
        with pytest.raises(tpusim.InputError, match="runs no grid step .*static .*or dynamic"):
            tj.simulate(f, x)


def test_a_loop_of_4096_iterations_is_unrolled_and_one_more_is_refused():
    # A row loop over 8-row slices, as a kernel engineer writes it: 4096 iterations per step are
    # lowered (unrolled); 4097 are refused naming the loop and what to do.
    def make(n):
        def kernel(x_ref, o_ref):
            def body(i, c):
                r = pl.multiple_of((i % 64) * 8, 8)
                o_ref[pl.ds(r, 8), :] = jnp.exp(x_ref[pl.ds(r, 8), :])
                return c

            jax.lax.fori_loop(0, n, body, 0)

        def f(x):
            spec = pl.BlockSpec((512, 128), lambda i: (i, 0))
            return pl.pallas_call(kernel, grid=(x.shape[0] // 512,), in_specs=[spec], out_specs=spec, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

        return f

    x = jax.ShapeDtypeStruct((512 * 4, 128), jnp.float32)
    r = tj.simulate(make(4096), x)[0]
    assert r.transcendentals == 4 * 4096 * 8 * 128
    with pytest.raises(tpusim.InputError, match=r"runs 4097 iterations per step; at most 4096 are lowered .*use fewer, larger iterations"):
        tj.simulate(make(4097), x)


def test_the_device_kinds_are_the_readers():
    """tpusim.jax.DEVICE_KINDS (what a description is lowered for) and the Rust reader's list
    (tpusim_pallas::desc::DEVICE_KINDS, what it accepts) name the same (kind, chip) pairs: the
    reader's refusal of an unknown kind lists its own, compared here with the Python table."""
    import json
    import re
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "tpusim" / "tests" / "data" / "kernel-ir" / "elementwise.json"
    d = json.loads(path.read_text())
    d["producer"]["device_kind"] = "TPU v99"
    with pytest.raises(tpusim.InputError) as e:
        tpusim._tpusim.simulate_kernel_ir(json.dumps(d), chip="v6e", set=[])
    listed = re.findall(r'"([^"]+)" \((\w+)\)', str(e.value))
    assert listed, str(e.value)
    assert sorted(listed) == sorted((kind, chip) for chip, (kind, _) in tj.DEVICE_KINDS.items())


def _hbm_copy(x):
    """x copied HBM to HBM by one manual DMA (both operands left in HBM: pl.ANY)."""

    def kernel(x_hbm, o_hbm, sem):
        c = pltpu.make_async_copy(x_hbm, o_hbm, sem)
        c.start()
        c.wait()

    return pl.pallas_call(
        kernel,
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        scratch_shapes=[pltpu.SemaphoreType.DMA(())],
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)


def test_a_copy_from_hbm_to_hbm_reads_and_writes_its_bytes():
    """A fresh user's finding: an HBM -> HBM copy was timed as a one-way copy, twice as fast as
    the calibration row HBM-COPY-v6e-32MiB measures the same 32 MiB copy (0.049359 ms, XLA's
    copy: traces/measured/calibration.csv). Its bytes now cross HBM twice; the band is 10%."""
    n = 2048 * 4096 * 4
    (r,) = tj.simulate(_hbm_copy, jax.ShapeDtypeStruct((2048, 4096), jnp.float32), chip="v6e")
    assert r.hbm_bytes == 2 * n
    assert abs(r.latency_ms / 0.049359 - 1) < 0.10, r.latency_ms


def test_a_cond_with_a_vector_result_simulates():
    """A fresh user's finding: both branches of a lax.cond yield its vector result, which the
    reader took for a value bound twice."""

    def kernel(x_ref, o_ref):
        o_ref[...] = jax.lax.cond(pl.program_id(0) == 0, lambda: x_ref[...] * 2, lambda: jnp.exp(x_ref[...]))

    def f(x):
        spec = pl.BlockSpec((256, 512), lambda i: (i, 0))
        return pl.pallas_call(kernel, grid=(4,), in_specs=[spec], out_specs=spec, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    (r,) = tj.simulate(f, jax.ShapeDtypeStruct((1024, 512), jnp.float32))
    # Step 0 takes the multiply, the other three the exp: only they run the EUP.
    assert r.transcendentals == 3 * 256 * 512, r.transcendentals


def test_a_while_loop_carrying_a_vector_is_refused_with_a_rewrite_that_works():
    def carried(x_ref, o_ref):
        o_ref[...] = jax.lax.while_loop(lambda c: c[0] < 5, lambda c: (c[0] + 1, c[1] * 2.0), (0, x_ref[...]))[1]

    def in_ref(x_ref, o_ref):
        # The advised rewrite: the vector lives in the output block, the loop carries a scalar.
        o_ref[...] = x_ref[...]

        def body(i):
            o_ref[...] = o_ref[...] * 2.0
            return i + 1

        jax.lax.while_loop(lambda i: i < 5, body, 0)

    def call(kernel):
        def f(x):
            spec = pl.BlockSpec((256, 512), lambda i: (i, 0))
            return pl.pallas_call(kernel, grid=(4,), in_specs=[spec], out_specs=spec, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

        return f

    x = jax.ShapeDtypeStruct((1024, 512), jnp.float32)
    with pytest.raises(tpusim.InputError, match=r"kernel `carried`: scf\.while at .*: a lax\.while_loop that carries a vector.*lax\.fori_loop"):
        tj.simulate(call(carried), x)
    (r,) = tj.simulate(call(in_ref), x)
    assert r.latency_ms > 0


def test_data_moved_off_the_register_tile_is_shifted_on_the_xlu_and_vpu():
    """A fresh user's finding: `jnp.roll` by 3 lanes (a slice and a concatenation) was free,
    while `pltpu.roll` by the same 3 lanes runs on the XLU. A start off the (8, 128) tile now
    costs a shift: an XLU rotation and a VPU select per register moved across lanes; a shift
    by whole registers (128 lanes, 8 rows) stays free."""

    def call(body):
        def kernel(x_ref, o_ref):
            o_ref[...] = body(x_ref[...])

        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((512, 1024), jnp.float32))

    x = jax.ShapeDtypeStruct((512, 1024), jnp.float32)
    busy = lambda body: tj.simulate(call(body), x).kernels[0].busy_ms
    copy = busy(lambda v: v)
    whole = busy(lambda v: jnp.roll(v, 128, axis=1))
    lanes = busy(lambda v: jnp.roll(v, 3, axis=1))
    rotate = busy(lambda v: pltpu.roll(v, 3, 1))
    rows = busy(lambda v: jnp.roll(v, 3, axis=0))
    assert whole["xlu"] == copy["xlu"] == 0 and whole["vpu"] == copy["vpu"], (whole, copy)
    # Every register of the result moves across lanes: at least the rotation's XLU time.
    assert lanes["xlu"] >= rotate["xlu"] > 0, (lanes, rotate)
    assert lanes["vpu"] > copy["vpu"], (lanes, copy)
    # Across sublanes: VPU work only.
    assert rows["xlu"] == 0 and rows["vpu"] > copy["vpu"], rows


def test_a_ref_window_off_the_register_tile_is_shifted_and_an_aligned_one_is_not():
    """A fresh user's finding: `x_ref[:, 1:897]` cost what `x_ref[:, 128:1024]` did. A load or
    store at constant indices off the tile now shifts its value (a store's unused read of the
    old window, which Mosaic erases, shifts nothing)."""

    def load(a):
        def kernel(x_ref, o_ref):
            o_ref[...] = x_ref[:, a : a + 896] * 2

        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((512, 896), jnp.float32))

    def store(a):
        def kernel(x_ref, o_ref):
            o_ref[...] = jnp.zeros(o_ref.shape, jnp.float32)
            o_ref[:, a : a + 896] = x_ref[...] * 2

        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((512, 1024), jnp.float32))

    wide, narrow = jax.ShapeDtypeStruct((512, 1024), jnp.float32), jax.ShapeDtypeStruct((512, 896), jnp.float32)
    off, on = (tj.simulate(load(a), wide).kernels[0].busy_ms for a in (1, 128))
    assert on["xlu"] == 0 and off["xlu"] > 0 and off["vpu"] > on["vpu"], (off, on)
    off_store, on_store = (tj.simulate(store(a), narrow).kernels[0].busy_ms for a in (3, 128))
    assert on_store["xlu"] == 0 and off_store["xlu"] > 0, (off_store, on_store)
    # The same 448 registers move in both: one shift each, not two (the store's read is dead).
    assert off_store["xlu"] == pytest.approx(off["xlu"])


def test_a_block_at_the_arrays_edge_copies_only_what_the_array_holds():
    """A fresh user's finding: a (257, 1024) array in blocks of 256 rows was charged two whole
    blocks each way (4.19 MB for 2.1 MB of data). The edge block's copies are clamped to the
    array, in whole (8, 128) tiles of its HBM layout."""

    def f(x):
        spec = pl.BlockSpec((256, 1024), lambda i: (i, 0))
        return pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] * 2), grid=(pl.cdiv(x.shape[0], 256),), in_specs=[spec], out_specs=spec, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    for rows in (257, 1000, 1024):
        (r,) = tj.simulate(f, jax.ShapeDtypeStruct((rows, 1024), jnp.float32))
        assert r.hbm_bytes == 2 * (-(-rows // 8) * 8) * 1024 * 4, (rows, r.hbm_bytes)


def test_a_kernel_called_inside_a_loop_is_reported_once_with_a_warning():
    """A fresh user's finding: a kernel inside fori_loop or scan was reported as one call with no
    word that the loop runs it several times."""

    def f(x):
        return pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] + 1), out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    x = jax.ShapeDtypeStruct((256, 512), jnp.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        once = tj.simulate(f, x).latency_ms
    for looped in (lambda x: jax.lax.fori_loop(0, 3, lambda i, a: f(a), x), lambda x: jax.lax.scan(lambda c, _: (f(c), None), x, None, length=5)[0]):
        with pytest.warns(UserWarning, match=r"inside a loop \(`stablehlo.while`.*multiply by the trip count"):
            r = tj.simulate(looped, x)
        assert r.latency_ms == once


def test_fresh_user_messages_name_what_to_change():
    """A kernel that set its own small VMEM limit and overflows it is told to use smaller blocks or
    raise the limit (the message read as if the kernel raised it); a kernel that only moves data is not said to have skipped its steps."""

    def copy(limit=None):
        def f(x):
            spec = pl.BlockSpec((512, 1024), lambda i: (i, 0))
            params = pltpu.CompilerParams(vmem_limit_bytes=limit) if limit else None
            return pl.pallas_call(
                lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...]), grid=(x.shape[0] // 512,), in_specs=[spec], out_specs=spec,
                out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), compiler_params=params,
            )(x)

        return f

    x = jax.ShapeDtypeStruct((2048, 1024), jnp.float32)
    with pytest.raises(tpusim.InputError, match=r"the kernel's own `vmem_limit_bytes`\): use smaller blocks, or raise the limit"):
        tj.simulate(copy(1 << 20), x)
    text = str(tj.simulate(copy(), x).kernels[0])
    assert "none with work on the MXU, VPU, EUP or XLU (data movement only)" in text and "0 computed" not in text, text


def test_steps_shorter_than_any_measured_small_step_carry_a_note_on_an_unfitted_chip():
    """A fresh user's finding: (8, 128) blocks ran at 27 ns a step on v6e, whose grid-step
    overhead no v6e measurement pinned then. The report says the run may be off and why on a chip
    whose step overhead and DMA latency no measurement of its own pins (v4); on v6e (its
    microbenchmarks pin the DMA mechanisms) and v5e (its DMA latency is fitted) it does not."""

    def f(x):
        spec = pl.BlockSpec((8, 128), lambda i, j: (i, j))
        return pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] + 1), grid=(128, 8), in_specs=[spec], out_specs=spec, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    x = jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16)
    # v4's steps (its step overhead carried from v5p, its DMA latency assumed) take about 0.5 us;
    # with both set lower they are shorter than any measured small step, and neither figure is
    # fitted to a v4 measurement.
    unpinned = {"fitted.dma_latency_ns": "100", "fitted.grid_step_overhead_cycles": "45"}
    short = [n for n in tj.simulate(f, x, chip="v4", set=unpinned).kernels[0].notes if n.startswith("grid steps average")]
    assert len(short) == 1 and "may be off" in short[0] and "350 ns" in short[0], short
    for chip in ("v6e", "v5e"):
        assert not [n for n in tj.simulate(f, x, chip=chip).kernels[0].notes if n.startswith("grid steps average")], chip
    # Long steps: no note.
    big = pl.BlockSpec((512, 1024), lambda i: (i, 0))
    g = lambda x: pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] + 1), grid=(2,), in_specs=[big], out_specs=big, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
    assert not [n for n in tj.simulate(g, x, chip="v4").kernels[0].notes if n.startswith("grid steps average")]


def _accumulate(mode):
    """o += x_i @ w over 16 steps: x's (512, 512) block changes every step (one buffer with
    `mode` 1), w (512, 4096) and o stay (read once, written back once); each step's matmul
    (about 2.3 us on v6e) outlasts x's DMA round trip (under 1.5 us at the latencies below)."""

    def kernel(x_ref, w_ref, o_ref):
        @pl.when(pl.program_id(0) == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

    def f(x, w):
        kw = {} if mode is None else {"pipeline_mode": pl.Buffered(mode)}
        return pl.pallas_call(
            kernel,
            grid=(16,),
            in_specs=[pl.BlockSpec((512, 512), lambda i: (i, 0), **kw), pl.BlockSpec((512, 4096), lambda i: (0, 0))],
            out_specs=pl.BlockSpec((512, 4096), lambda i: (0, 0)),
            out_shape=jax.ShapeDtypeStruct((512, 4096), jnp.float32),
        )(x, w)

    return f, [jax.ShapeDtypeStruct((8192, 512), jnp.bfloat16), jax.ShapeDtypeStruct((512, 4096), jnp.bfloat16)]


def test_a_one_buffer_window_is_copied_only_after_the_step_that_reads_its_buffer():
    """pl.Buffered(1): the next block goes into the buffer this step reads, so its copy starts
    when this step's body is done and every step pays its round trip, where a double-buffered
    window copies it while the step before runs. With steps longer than the round trip, a slower
    DMA costs the double-buffered kernel only its first read, the one-buffer kernel every copy."""
    extra_ns = 1000.0
    latencies = [{"fitted.dma_latency_ns": "300"}, {"fitted.dma_latency_ns": str(300 + extra_ns)}]
    t = {}
    for mode in (None, 1):
        fn, args = _accumulate(mode)
        (d,), _ = tj.describe_all(fn, *args, chip="v6e")
        assert [r.get("pipeline_mode", "double") for r in d["refs"] if r["kind"] == "input"][0] == ("synchronous" if mode == 1 else "double")
        t[mode] = [tj.simulate(fn, *args, chip="v6e", set=s).latency_ms for s in latencies]
    steps, extra_ms = 16, extra_ns * 1e-6
    assert t[1][0] > t[None][0]
    # Double-buffered: only the reads no step hides pay it (the first step's x and w).
    assert t[None][1] - t[None][0] <= 2.5 * extra_ms, t
    # One buffer: x's copy into the buffer every step reads is exposed at each of the 15 steps after the first.
    assert t[1][1] - t[1][0] >= 0.9 * (steps - 1) * extra_ms, t
