"""What tokamax's grouped matmuls do as they launch, each in a small kernel of its own. Tables a
kernel takes in SMEM without scalar prefetch:
a `pl.kernel` on a TensorCore mesh (its windows' index maps are affine maps, not index-map
functions) with its group sizes in SMEM, and a grid-less `pallas_call` whose SMEM operands XLA ops
compute from concrete arguments inside a `jax.custom_batching.custom_vmap` (as every tokamax op
call is wrapped). Their values are read as prefetch tables' are, so the branches, loop bounds and
copy sizes that read them are evaluated; a table given as a shape only is named. And a
`pltpu.emit_pipeline` block that does not divide its array, whose edge copy is rounded up to the
array's tiling."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import tpusim
import tpusim.jax as tj


def _on_mesh(x_shape=(256, 128)):
    """A pl.kernel on the device's TensorCore mesh: its SMEM table decides whether the kernel
    copies x in, takes exp and copies it out."""

    def body(tbl_ref, x_hbm, o_hbm, buf, sem):
        @pl.when(tbl_ref[1] > 0)
        def _():
            cp = pltpu.make_async_copy(x_hbm, buf, sem)
            cp.start()
            cp.wait()
            buf[...] = jnp.exp(buf[...])
            cp = pltpu.make_async_copy(buf, o_hbm, sem)
            cp.start()
            cp.wait()

    def f(tbl, x):
        tbl = pltpu.with_memory_space_constraint(tbl, pltpu.SMEM)
        return pl.kernel(
            body,
            out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
            mesh=pltpu.create_tensorcore_mesh("core"),
            scratch_types=[pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA(())],
        )(tbl, x)

    return f, np.ones(x_shape, np.float32)


def test_a_kernel_on_a_tensorcore_mesh_reads_its_smem_table_and_affine_index_maps():
    f, x = _on_mesh()
    [d], _ = tj.describe_all(f, np.array([0, 1], np.int32), x, chip="v6e")
    tbl = d["refs"][0]
    # The table's window is the whole array (`affine_map<(d0) -> (0)>`) and its values are the
    # argument's.
    assert (tbl["kind"], tbl["memory_space"], tbl["index_map"], tbl["values"]) == ("input", "smem", [0], {"inline": [0, 1]}), tbl
    on = tj.simulate(f, np.array([0, 1], np.int32), x, chip="v6e")[0]
    off = tj.simulate(f, np.array([1, 0], np.int32), x, chip="v6e")[0]
    assert on.transcendentals > 0 and off.transcendentals == 0
    assert on.hbm_bytes >= 2 * x.nbytes and off.hbm_bytes < x.nbytes


def test_a_smem_table_given_as_a_shape_only_is_named():
    f, x = _on_mesh()
    with pytest.raises(tpusim.InputError, match="runtime operand `tbl`") as e:
        tj.simulate(f, jax.ShapeDtypeStruct((2,), jnp.int32), x, chip="v6e")
    assert "scf.if" in str(e.value), str(e.value)


def _gridless(rows_per_copy=8):
    """A grid-less pallas_call whose SMEM operand (the running sum of `gs`) XLA computes before
    the call, inside a custom_vmap: the kernel copies `cumsum(gs)[-1] // rows_per_copy` blocks."""

    def kernel(ends_ref, x_hbm, o_hbm, buf, sem):
        def step(i, c):
            cp = pltpu.make_async_copy(x_hbm.at[pl.ds(i * rows_per_copy, rows_per_copy)], buf, sem)
            cp.start()
            cp.wait()
            return c

        jax.lax.fori_loop(0, ends_ref[ends_ref.shape[0] - 1] // rows_per_copy, step, 0)

    def call(ends, x):
        return pl.pallas_call(
            kernel,
            in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            scratch_shapes=[pltpu.VMEM((rows_per_copy, x.shape[1]), x.dtype), pltpu.SemaphoreType.DMA(())],
        )(ends, x)

    wrapped = jax.custom_batching.custom_vmap(call)

    @wrapped.def_vmap
    def _(axis_size, in_batched, ends, x):  # pragma: no cover - never vmapped here
        raise NotImplementedError

    def f(gs, x):
        return wrapped(jnp.cumsum(gs).astype(jnp.int32), x)

    return f


def test_smem_operands_computed_by_xla_ops_inside_custom_vmap_are_evaluated():
    f = _gridless()
    x = jax.ShapeDtypeStruct((512, 128), jnp.float32)  # the data stays a shape: not evaluated
    gs = np.array([64, 0, 128, 64], np.int32)  # 256 rows: 32 copies of 8 x 128 f32
    [d], outside = tj.describe_all(f, gs, x, chip="v6e")
    assert d["refs"][0]["values"] == {"inline": [64, 64, 192, 256]}, d["refs"][0]
    assert any("reduce_window" in o or "add" in o for o in outside), outside
    [r] = tj.simulate(f, gs, x, chip="v6e")
    [half] = tj.simulate(f, gs // 2, x, chip="v6e")
    assert r.hbm_bytes - half.hbm_bytes == 16 * 8 * 128 * 4, (r.hbm_bytes, half.hbm_bytes)


def test_affine_index_maps_translate_every_form_and_refuse_symbols():
    from jaxlib.mlir import ir

    with tj._context():
        m = ir.AffineMapAttr(ir.Attribute.parse("affine_map<(d0, d1) -> (0, d0 mod 3, d1 floordiv 2 + 1, (d0 * 2) ceildiv 4)>")).value
        got = [tj._affine_expr(e, "k", "input 0") for e in m.results]
        assert got == [
            0,
            ["sub", ["grid", 0], ["mul", ["floordiv", ["grid", 0], 3], 3]],
            ["add", ["floordiv", ["grid", 1], 2], 1],
            ["ceildiv", ["mul", ["grid", 0], 2], 4],
        ], got
        s = ir.AffineMapAttr(ir.Attribute.parse("affine_map<(d0)[s0] -> (d0 + s0)>")).value
        with pytest.raises(tpusim.InputError, match=r"kernel `k`: the index map of `input 0` holds the affine expression"):
            tj._affine_expr(s.results[0], "k", "input 0")


def test_values_on_a_ref_that_is_no_table_are_refused():
    import json

    f, x = _on_mesh()
    [d], _ = tj.describe_all(f, np.array([0, 1], np.int32), x, chip="v6e")
    d = json.loads(json.dumps(d))
    x_ref = next(i for i, r in enumerate(d["refs"]) if r["memory_space"] == "any" and r["kind"] == "input")
    d["refs"][x_ref]["values"] = {"inline": [0]}
    with pytest.raises(tpusim.InputError, match=rf"refs\[{x_ref}\].*values.*a prefetch ref's, or an input's in SMEM"):
        tpusim._tpusim.simulate_kernel_ir(json.dumps(d), chip="v6e")


def test_an_emit_pipeline_edge_block_copies_the_tiles_it_rounds_up_to():
    """A 256-column block of a 200-column f32 array: emit_pipeline copies the edge block rounded
    up to whole 128-lane tiles (256 columns), which memory holds; it was refused as longer than
    the array."""
    rows, cols, block = 256, 200, 256

    def kernel(x_hbm, o_hbm):
        def inner(x_ref, o_ref):
            o_ref[...] = x_ref[...] + 1

        spec = pl.BlockSpec((rows, block), lambda j: (0, j))
        pltpu.emit_pipeline(inner, grid=(1,), in_specs=[spec], out_specs=[spec])(x_hbm, o_hbm)

    def f(x):
        return pl.pallas_call(
            kernel,
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        )(x)

    [r] = tj.simulate(f, jax.ShapeDtypeStruct((rows, cols), jnp.float32), chip="v6e")
    assert r.hbm_bytes == 2 * rows * block * 4, r.hbm_bytes


def _copies(ops):
    for o in ops:
        if o["op"] == "tpu.enqueue_dma":
            yield o
        for k in ("then", "else"):
            yield from _copies(o.get(k, []))


def test_emit_pipeline_buffers_are_recorded_with_the_slots_their_copies_fill():
    """tokamax's Pallas ragged dot pipelines its lhs through `pl.Buffered(input_buffer_count,
    use_lookahead=True)`: the description lists each buffer emit_pipeline allocates (first
    dimension: its buffer count) and names the buffer each copy fills or drains."""
    rows, blocks = 128, 8

    def kernel(x_hbm, o_hbm):
        def inner(x_ref, o_ref):
            o_ref[...] = x_ref[...] * 2

        pltpu.emit_pipeline(
            inner,
            grid=(blocks,),
            in_specs=[pl.BlockSpec((rows, 128), lambda i: (i, 0), pipeline_mode=pl.Buffered(3, use_lookahead=True))],
            out_specs=[pl.BlockSpec((rows, 128), lambda i: (i, 0))],
        )(x_hbm, o_hbm)

    def f(x):
        return pl.pallas_call(
            kernel,
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        )(x)

    x = jax.ShapeDtypeStruct((rows * blocks, 128), jnp.float32)
    [d], _ = tj.describe_all(f, x, chip="v6e")
    allocs = {a["id"]: a for a in d["allocations"]}
    copies = list(_copies(d["body"]))
    ins = [c["attrs"] for c in copies if c["attrs"].get("src_ref") == 0]
    outs = [c["attrs"] for c in copies if c["attrs"].get("dst_ref") == 1]
    assert ins and outs, [c["attrs"] for c in copies]
    assert {tuple(allocs[a["dst_alloc"]]["shape"]) for a in ins} == {(3, rows, 128)}, ins
    assert {tuple(allocs[a["src_alloc"]]["shape"]) for a in outs} == {(2, rows, 128)}, outs
    assert all(len(a["dst_offsets"]) == 3 for a in ins)
    [r] = tj.simulate(f, x, chip="v6e")
    assert r.hbm_bytes == 2 * rows * blocks * 128 * 4
