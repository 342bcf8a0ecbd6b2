"""Kernels sized at run time, as serving and MoE kernels are: a copy `pl.ds(start, size)` with a
traced size (ragged paged attention's page copies), a grid dimension computed by XLA ops before
the kernel and scalar-prefetch tables computed so (megablox `gmm`'s group metadata). Their
sizes come from the values given, never 0 and never a sentinel."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import tpusim
import tpusim.jax as tj
from conftest import run_cli

ROWS, LANES = 256, 128


def _ragged_copy():
    """Step i copies lens[i] rows of x (f32, 128 lanes) from HBM into VMEM, then scales a block."""

    def kernel(lens_ref, x_hbm, o_ref, buf, sem):
        i = pl.program_id(0)
        n = lens_ref[i]
        cp = pltpu.make_async_copy(x_hbm.at[pl.ds(i * ROWS, n)], buf.at[pl.ds(0, n)], sem)
        cp.start()
        cp.wait()
        o_ref[...] = buf[...] * 2.0

    def f(lens, x):
        return pl.pallas_call(
            kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1,
                grid=(lens.shape[0],),
                in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                out_specs=pl.BlockSpec((ROWS, LANES), lambda i, lens: (i, 0)),
                scratch_shapes=[pltpu.VMEM((ROWS, LANES), jnp.float32), pltpu.SemaphoreType.DMA(())],
            ),
            out_shape=jax.ShapeDtypeStruct((lens.shape[0] * ROWS, LANES), jnp.float32),
        )(lens, x)

    return f


X = np.ones((4 * ROWS, LANES), np.float32)


def test_a_copy_sized_at_run_time_moves_the_rows_the_table_gives():
    lens = np.array([256, 128, 64, 200], np.int32)
    r = tj.simulate(_ragged_copy(), lens, X).kernels[0]
    out = 4 * ROWS * LANES * 4  # the output windows
    assert r.hbm_bytes == int(lens.sum()) * LANES * 4 + out
    # Other lengths, other bytes: the size is the table's, not a constant.
    r2 = tj.simulate(_ragged_copy(), np.array([8, 8, 8, 8], np.int32), X).kernels[0]
    assert r2.hbm_bytes == 32 * LANES * 4 + out


def test_a_copy_sized_by_a_table_given_as_a_shape_asks_for_it(tmp_path):
    lens = jax.ShapeDtypeStruct((4,), jnp.int32)
    path = tmp_path / "ragged.json"
    tj.describe(_ragged_copy(), lens, X, path=str(path))
    d = json.loads(path.read_text())
    dma = [op for op in d["body"] if op["op"] == "tpu.enqueue_dma"][0]
    # An expression over the table, never a number taken from the `?` marker.
    assert isinstance(dma["attrs"]["bytes"], list), dma["attrs"]
    # The command line asks for the table by the traced function's parameter name; given, the
    # copies move its rows.
    _, err = run_cli("run", "--kernel-ir", path, expect=2)
    assert "--runtime lens=" in err, err
    np.save(tmp_path / "lens.npy", np.array([256, 128, 64, 200], np.int32))
    out, _ = run_cli("run", "--kernel-ir", path, "--runtime", f"lens={tmp_path / 'lens.npy'}", "--format", "json")
    assert json.loads(out)["hbm_bytes"] == 648 * LANES * 4 + 4 * ROWS * LANES * 4


def _gmm(m=512, k=256, n=256, groups=4):
    from jax.experimental.pallas.ops.tpu.megablox import gmm

    def f(lhs, rhs, group_sizes):
        return gmm(lhs, rhs, group_sizes, tiling=(128, 128, 128))

    lhs = np.ones((m, k), jnp.bfloat16)
    rhs = np.ones((groups, k, n), jnp.bfloat16)
    return f, lhs, rhs


def test_megablox_gmm_reads_its_dynamic_grid_and_xla_computed_metadata(tmp_path):
    f, lhs, rhs = _gmm()
    even = np.array([128, 128, 128, 128], np.int32)
    path = tmp_path / "gmm.json"
    tj.describe(f, lhs, rhs, even, path=str(path))
    d = json.loads(path.read_text())
    assert all(isinstance(g, int) and g >= 1 for g in d["grid"]), d["grid"]
    assert all("runtime" not in (r.get("values") or {}) for r in d["refs"] if r["kind"] == "prefetch"), [r.get("values") for r in d["refs"]]
    r = tj.simulate(f, lhs, rhs, even).kernels[0]
    # Every (m tile, group) pair is one active tile: 4 m tiles of 128 rows, one group each,
    # times n tiles x k tiles; each step is a 128 x 128 x 128 matmul.
    assert r.grid_steps == 4 * 2 * 2
    assert r.flops == pytest.approx(2 * 512 * 256 * 256)
    # Groups that straddle m tiles add active tiles (steps), as the kernel's metadata gives them.
    ragged = np.array([100, 156, 60, 196], np.int32)
    r2 = tj.simulate(f, lhs, rhs, ragged).kernels[0]
    assert r2.grid_steps > r.grid_steps


def test_a_dynamic_grid_from_shapes_only_is_refused_by_name():
    f, lhs, rhs = _gmm()
    with pytest.raises(tpusim.InputError, match=r"grid dimension 1 is sized at run time.*concrete arrays"):
        tj.simulate(f, lhs, rhs, jax.ShapeDtypeStruct((4,), jnp.int32))


def _dynamic_grid(use_num_programs):
    """A grid of sum(cnt) steps (computed by XLA); the last step doubles its block when
    `use_num_programs` (reading `pl.num_programs(0)`, the dynamic size)."""

    def f(cnt, x):
        nsteps = jnp.sum(cnt)

        def kernel(c_ref, x_ref, o_ref):
            if use_num_programs:

                @pl.when(pl.program_id(0) == pl.num_programs(0) - 1)
                def _():
                    o_ref[...] = jnp.exp(x_ref[...])

            else:
                o_ref[...] = jnp.exp(x_ref[...])

        return pl.pallas_call(
            kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1,
                grid=(nsteps,),
                in_specs=[pl.BlockSpec((8, 128), lambda i, c: (i, 0))],
                out_specs=pl.BlockSpec((8, 128), lambda i, c: (i, 0)),
            ),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        )(cnt, x)

    return f


def test_num_programs_of_a_dynamic_grid_is_the_computed_size():
    x = np.ones((64, 128), np.float32)
    for cnt in ([1, 2], [4, 4]):
        every = tj.simulate(_dynamic_grid(False), np.array(cnt, np.int32), x).kernels[0]
        last = tj.simulate(_dynamic_grid(True), np.array(cnt, np.int32), x).kernels[0]
        assert every.grid_steps == last.grid_steps == sum(cnt)
        # exp on every step vs on the last step only.
        assert every.transcendentals == pytest.approx(sum(cnt) * last.transcendentals)


def test_megablox_tgmm_simulates():
    from jax.experimental.pallas.ops.tpu.megablox.gmm import tgmm

    def f(lhs, rhs, gs):
        return tgmm(lhs, rhs, gs, tiling=(128, 128, 128))

    lhs = np.ones((256, 512), jnp.bfloat16)  # (k, m): tgmm contracts over the grouped m
    rhs = np.ones((512, 256), jnp.bfloat16)
    r = tj.simulate(f, lhs, rhs, np.array([128, 128, 128, 128], np.int32)).kernels[0]
    assert r.grid_steps > 0 and r.flops == pytest.approx(2 * 256 * 512 * 256)


def test_the_gradient_of_megablox_gmm_reads_its_metadata():
    """A fresh user's finding: jax.grad of gmm traces three kernels (the forward, dlhs and drhs)
    but the export keeps two (the forward's result is unused): the host evaluation now drops
    what the export drops, so each kernel gets its own group metadata (it was refused as a grid
    sized at run time, with concrete arrays given)."""
    from jax.experimental.pallas.ops.tpu.megablox import gmm

    m, k, n, g = 1024, 512, 512, 4
    f = jax.grad(lambda lhs, rhs, gs: gmm(lhs, rhs, gs, tiling=(256, 256, 256)).sum(), argnums=(0, 1))
    rs = tj.simulate(f, np.zeros((m, k), jnp.bfloat16), np.zeros((g, k, n), jnp.bfloat16), np.array([256] * g, np.int32))
    assert len(rs.kernels) == 2
    # dlhs = dout @ rhs^T per group and drhs = lhs^T @ dout per group: 2 m k n FLOPs each.
    assert [r.flops for r in rs.kernels] == [2 * m * k * n] * 2


def test_smem_scratch_filled_by_the_kernel_is_read_back():
    def kernel(gs_ref, x_ref, o_ref, tbl):
        def body(i, c):
            tbl[i] = gs_ref[i] * 2
            return c

        jax.lax.fori_loop(0, 4, body, 0)

        @pl.when(tbl[1] > 0)
        def _():
            o_ref[...] = jnp.exp(x_ref[...])

    def f(gs, x):
        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1,
                grid=(1,),
                in_specs=[pl.BlockSpec(x.shape, lambda i, gs: (0, 0))],
                out_specs=pl.BlockSpec(x.shape, lambda i, gs: (0, 0)),
                scratch_shapes=[pltpu.SMEM((4,), jnp.int32)],
            ),
        )(gs, x)

    x = np.ones((256, 128), np.float32)
    on = tj.simulate(f, np.array([1, 1, 1, 1], np.int32), x).kernels[0]
    off = tj.simulate(f, np.array([1, 0, 1, 1], np.int32), x).kernels[0]
    assert on.transcendentals > 0 and off.transcendentals == 0


def test_a_runtime_operand_given_twice_is_refused(tmp_path):
    path = tmp_path / "ragged.json"
    tj.describe(_ragged_copy(), jax.ShapeDtypeStruct((4,), jnp.int32), X, path=str(path))
    np.save(tmp_path / "lens.npy", np.array([1, 2, 3, 4], np.int32))
    lens = f"lens={tmp_path / 'lens.npy'}"
    _, err = run_cli("run", "--kernel-ir", path, "--runtime", lens, "--runtime", lens, expect=2)
    assert "given twice" in err, err


def test_a_float_runtime_table_is_named_by_its_numpy_type(tmp_path):
    path = tmp_path / "ragged.json"
    tj.describe(_ragged_copy(), jax.ShapeDtypeStruct((4,), jnp.int32), X, path=str(path))
    np.save(tmp_path / "lens.npy", np.array([1, 2, 3, 4], np.float32))
    _, err = run_cli("run", "--kernel-ir", path, "--runtime", f"lens={tmp_path / 'lens.npy'}", expect=2)
    assert "float32" in err and "integer" in err, err


def test_gmm_with_shape_only_weights_reads_its_metadata_from_concrete_group_sizes():
    """A fresh user's finding: weights given as jax.ShapeDtypeStruct (as for a model too large to
    allocate) with a concrete group_sizes were refused as a grid sized at run time. The host
    evaluation now runs what it can: values computed from a shape-only argument stay unknown,
    the group metadata is computed from group_sizes alone."""
    f, lhs, rhs = _gmm()
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (lhs, rhs)]
    for sizes in ([128, 128, 128, 128], [100, 156, 60, 196]):
        gs = np.array(sizes, np.int32)
        concrete = tj.simulate(f, lhs, rhs, gs).kernels[0]
        shaped = tj.simulate(f, *shapes, gs).kernels[0]
        assert shaped.grid_steps == concrete.grid_steps and shaped.latency_ms == concrete.latency_ms

    # A table computed from a shape-only argument is never filled with made-up values: the
    # kernel's prefetch table stays a runtime operand.
    def kernel(idx_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...]

    def g(x, y):
        idx = (x[:4, 0] > 0).astype(jnp.int32) + jnp.sum(y)
        return pl.pallas_call(
            kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, grid=(4,), in_specs=[pl.BlockSpec((8, 128), lambda i, t: (t[i], 0))], out_specs=pl.BlockSpec((8, 128), lambda i, t: (i, 0))
            ),
            out_shape=jax.ShapeDtypeStruct((32, 128), jnp.float32),
        )(idx, x)

    (d,), _ = tj.describe_all(g, jax.ShapeDtypeStruct((32, 128), jnp.float32), np.zeros(4, np.int32))
    (table,) = [r for r in d["refs"] if r["kind"] == "prefetch"]
    assert "runtime" in table["values"], table
