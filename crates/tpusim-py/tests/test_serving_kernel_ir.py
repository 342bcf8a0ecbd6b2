"""What serving and MoE kernels (ragged paged attention, MLA, megablox gmm_v2, the kv-cache update)
do in their IR that simpler kernels do not, each in a small kernel of its own: copies in sibling
branches (MLIR names values again in each region), `pl.multiple_of` on a copy's size, a call with
no grid, work inside `pl.run_scoped` (how `pltpu.emit_pipeline` allocates its buffers), a scratch
with a small second-minor dimension, and a companion call whose dynamic grid runs no step. Each
is read as it runs, never dropped or refused."""

import gzip
import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import tpusim.jax as tj
from conftest import run_json


def _dmas(ops):
    for o in ops:
        if o["op"] == "tpu.enqueue_dma":
            yield o
        for k in ("then", "else"):
            yield from _dmas(o.get(k, []))


def test_a_copy_in_a_sibling_branch_keeps_its_own_window(tmp_path):
    """The second branch's copy (from a reshaped ref) must not take the first branch's window."""

    def kernel(n_ref, x_hbm, o_ref, buf, sems):
        n = n_ref[0]

        @pl.when(pl.program_id(0) == 0)
        def _():
            cp = pltpu.make_async_copy(x_hbm.at[0, pl.ds(0, 1)], buf.at[pl.ds(0, 1)], sems.at[0])
            cp.start()
            cp.wait()

        @pl.when(pl.program_id(0) != 0)
        def _():
            flat = x_hbm.reshape(4 * 64, 128)
            cp = pltpu.make_async_copy(flat.at[pl.ds(0, n)], buf.at[pl.ds(0, n)], sems.at[1])
            cp.start()
            cp.wait()

        o_ref[...] = buf[...]

    def f(n, x):
        return pl.pallas_call(
            kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1,
                grid=(2,),
                in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                out_specs=pl.BlockSpec((64, 128), lambda i, n: (0, 0)),
                scratch_shapes=[pltpu.VMEM((64, 128), jnp.float32), pltpu.SemaphoreType.DMA((2,))],
            ),
            out_shape=jax.ShapeDtypeStruct((64, 128), jnp.float32),
        )(n, x)

    n, x = np.array([64], np.int32), np.ones((4, 64, 128), np.float32)
    [path] = tj.describe(f, n, x, path=tmp_path / "k.json")
    first, second = list(_dmas(json.load(open(path))["body"]))
    assert first["attrs"]["src_shape"] == [1, 1, 128] and first["attrs"]["bytes"] == 512
    # 64 rows x 128 x 4 bytes from the table; no window of the other branch.
    assert second["attrs"].get("src_shape") != [1, 1, 128], second["attrs"]
    r = run_json("--kernel-ir", path)
    # Step 0 copies 512 bytes, step 1 copies 32 KiB; the output block is written once.
    assert r["hbm_bytes"] == 512 + 64 * 128 * 4 + 64 * 128 * 4


def test_a_copy_sized_with_multiple_of_is_sized():
    def kernel(n_ref, x_hbm, o_ref, buf, sem):
        n = pl.multiple_of(n_ref[0], 8)
        cp = pltpu.make_async_copy(x_hbm.at[pl.ds(0, n)], buf.at[pl.ds(0, n)], sem)
        cp.start()
        cp.wait()
        o_ref[...] = buf[...]

    def f(n, x):
        return pl.pallas_call(
            kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1,
                grid=(1,),
                in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                out_specs=pl.BlockSpec((64, 128), lambda i, n: (0, 0)),
                scratch_shapes=[pltpu.VMEM((64, 128), jnp.float32), pltpu.SemaphoreType.DMA(())],
            ),
            out_shape=jax.ShapeDtypeStruct((64, 128), jnp.float32),
        )(n, x)

    [r] = tj.simulate(f, np.array([40], np.int32), np.ones((64, 128), np.float32), chip="v6e")
    assert r.hbm_bytes == 40 * 128 * 4 + 64 * 128 * 4


def test_a_call_with_no_grid_reads_its_prefetch_table_and_refs():
    def kernel(n_ref, x_hbm, o_hbm, buf, sem):
        cp = pltpu.make_async_copy(x_hbm.at[pl.ds(0, 8)], buf, sem)
        cp.start()
        cp.wait()
        cp = pltpu.make_async_copy(buf, o_hbm.at[pl.ds(n_ref[0], 8)], sem)
        cp.start()
        cp.wait()

    def f(n, x):
        return pl.pallas_call(
            kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1,
                in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                out_specs=pl.BlockSpec(memory_space=pl.ANY),
                scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA(())],
            ),
            out_shape=jax.ShapeDtypeStruct((64, 128), jnp.float32),
        )(n, x)

    n, x = np.array([8], np.int32), np.ones((64, 128), np.float32)
    [d], _ = tj.describe_all(f, n, x, chip="v6e")
    kinds = [(r["kind"], r.get("array_shape")) for r in d["refs"]]
    assert kinds[:3] == [("prefetch", None), ("input", [64, 128]), ("output", [64, 128])], kinds
    assert d["refs"][0]["values"] == {"inline": [8]}
    [r] = tj.simulate(f, n, x, chip="v6e")
    assert r.hbm_bytes == 2 * 8 * 128 * 4


def test_work_inside_run_scoped_is_simulated():
    """`pl.run_scoped` puts its body in a region; a 256 KiB copy and a 256^3 matmul in it count."""

    def kernel(x_hbm, o_ref):
        def scoped(buf, sem):
            cp = pltpu.make_async_copy(x_hbm, buf, sem)
            cp.start()
            cp.wait()
            o_ref[...] = jnp.dot(buf[...], buf[...], preferred_element_type=jnp.float32)

        pl.run_scoped(scoped, pltpu.VMEM((256, 256), jnp.float32), pltpu.SemaphoreType.DMA(()))

    def f(x):
        return pl.pallas_call(kernel, in_specs=[pl.BlockSpec(memory_space=pl.ANY)], out_shape=jax.ShapeDtypeStruct((256, 256), jnp.float32))(x)

    [r] = tj.simulate(f, np.ones((256, 256), np.float32), chip="v6e")
    assert r.flops == 2 * 256**3
    assert r.hbm_bytes == 2 * 256 * 256 * 4


def test_a_scratch_with_a_small_second_minor_dimension_is_not_padded_to_a_whole_tile(tmp_path):
    """(2, 16384, 1, 2, 128) bf16 is 16 MiB as Mosaic tiles it ((2, 128) tiles): it fits 32 MiB."""

    def kernel(x_hbm, o_ref, buf, sem):
        cp = pltpu.make_async_copy(x_hbm, buf.at[0, pl.ds(0, 8)], sem)
        cp.start()
        cp.wait()
        o_ref[...] = buf[0, 0, 0].astype(jnp.float32)

    def f(x):
        return pl.pallas_call(
            kernel,
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_shape=jax.ShapeDtypeStruct((2, 128), jnp.float32),
            scratch_shapes=[pltpu.VMEM((2, 16384, 1, 2, 128), jnp.bfloat16), pltpu.SemaphoreType.DMA(())],
            compiler_params=pltpu.CompilerParams(vmem_limit_bytes=32 * 1024 * 1024),
        )(x)

    [path] = tj.describe(f, np.ones((8, 1, 2, 128), jnp.bfloat16), path=tmp_path / "k.json")
    r = run_json("--kernel-ir", path)
    assert 16 * 2**20 <= r["vmem_bytes"] < 17 * 2**20, r["vmem_buffers"]


def test_a_companion_call_that_runs_no_step_is_left_out_with_a_warning(tmp_path):
    def call(x, n):
        def kernel(n_ref, x_ref, o_ref):
            o_ref[...] = x_ref[...] * 2

        return pl.pallas_call(
            kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1,
                grid=(n[0],),
                in_specs=[pl.BlockSpec((8, 128), lambda i, n: (i, 0))],
                out_specs=pl.BlockSpec((8, 128), lambda i, n: (i, 0)),
            ),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        )(n, x)

    def f(x, dist):
        return call(call(x, dist[0:1]), dist[1:2])

    x = np.ones((64, 128), np.float32)
    with pytest.warns(UserWarning, match="runs no grid step"):
        paths = tj.describe(f, x, np.array([4, 0], np.int32), path=tmp_path / "k.json")
    assert len(paths) == 1 and json.load(open(paths[0]))["grid"] == [4]
    # Every call empty: nothing to simulate, said once.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(tj.InputError, match="every Pallas kernel of the function runs no grid step"):
            tj.describe_all(f, x, np.array([0, 0], np.int32), chip="v6e")


def test_a_description_written_gzip_compressed_reads_alike(tmp_path):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    def f(x):
        return pl.pallas_call(
            kernel, grid=(4,), in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))], out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct((32, 128), jnp.float32),
        )(x)

    x = np.ones((32, 128), np.float32)
    [plain] = tj.describe(f, x, path=tmp_path / "k.json")
    [packed] = tj.describe(f, x, path=tmp_path / "k.json.gz")
    assert json.loads(gzip.decompress(open(packed, "rb").read())) == json.load(open(plain))
    assert run_json("--kernel-ir", packed)["latency_ms"] == run_json("--kernel-ir", plain)["latency_ms"]


def _waits(ops):
    for o in ops:
        if o["op"] in ("tpu.wait_dma2", "tpu.wait_dma"):
            yield o
        for k in ("then", "else"):
            yield from _waits(o.get(k, []))


def _double_buffered(prefetch):
    """Eight 512 x 512 f32 blocks copied from HBM into two VMEM slots, each waited for and then
    worked on; with `prefetch`, block i + 1's copy starts before block i's wait (the usual manual
    pipeline), else each wait follows its own start."""

    def kernel(x_hbm, o_ref, buf, sems):
        def copy(i):
            return pltpu.make_async_copy(x_hbm.at[i], buf.at[i % 2], sems.at[i % 2])

        acc = jnp.zeros((512, 512), jnp.float32)
        if prefetch:
            copy(0).start()
        for i in range(8):
            if prefetch and i + 1 < 8:
                copy(i + 1).start()
            if not prefetch:
                copy(i).start()
            copy(i).wait()
            x = buf[i % 2]
            for _ in range(6):
                x = jnp.tanh(x) * x
            acc = acc + x
        o_ref[...] = acc

    def f(x):
        return pl.pallas_call(
            kernel,
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_shape=jax.ShapeDtypeStruct((512, 512), jnp.float32),
            scratch_shapes=[pltpu.VMEM((2, 512, 512), jnp.float32), pltpu.SemaphoreType.DMA((2,))],
        )(x)

    return f


def test_copies_and_waits_name_their_semaphore_and_a_prefetch_overlaps_the_work(tmp_path):
    x = np.ones((8, 512, 512), np.float32)
    [path] = tj.describe(_double_buffered(True), x, path=tmp_path / "k.json")
    body = json.load(open(path))["body"]
    starts, waits = list(_dmas(body)), list(_waits(body))
    assert len(starts) == 8 and len(waits) == 8
    # Each copy and wait names the semaphore array (a ref in semaphore memory) and its slot.
    sem_ref = starts[0]["attrs"]["sem_ref"]
    assert json.load(open(path))["refs"][sem_ref]["memory_space"] == "semaphore"
    assert [s["attrs"]["sem_offsets"] for s in starts] == [[i % 2] for i in range(8)]
    assert [w["attrs"]["sem_offsets"] for w in waits] == [[i % 2] for i in range(8)]
    assert all(w["attrs"]["sem_ref"] == sem_ref and w["attrs"]["bytes"] == 512 * 512 * 4 for w in waits)
    # The prefetching kernel runs its copies under the work; the serial one waits for each.
    [pre] = tj.simulate(_double_buffered(True), x, chip="v6e")
    [ser] = tj.simulate(_double_buffered(False), x, chip="v6e")
    assert pre.hbm_bytes == ser.hbm_bytes == 8 * 512 * 512 * 4 + 512 * 512 * 4
    assert pre.latency_ms < 0.85 * ser.latency_ms, (pre.latency_ms, ser.latency_ms)


def test_a_semaphore_run_scoped_allocates_pairs_its_copy_and_wait(tmp_path):
    def kernel(x_hbm, o_ref):
        def scoped(buf, sem):
            cp = pltpu.make_async_copy(x_hbm, buf, sem)
            cp.start()
            cp.wait()
            o_ref[...] = buf[...] * 2.0

        pl.run_scoped(scoped, pltpu.VMEM((256, 256), jnp.float32), pltpu.SemaphoreType.DMA(()))

    def f(x):
        return pl.pallas_call(kernel, in_specs=[pl.BlockSpec(memory_space=pl.ANY)], out_shape=jax.ShapeDtypeStruct((256, 256), jnp.float32))(x)

    [path] = tj.describe(f, np.ones((256, 256), np.float32), path=tmp_path / "k.json")
    body = json.load(open(path))["body"]
    [start], [wait] = list(_dmas(body)), list(_waits(body))
    assert "sem_ref" not in start["attrs"] and start["attrs"]["sem_alloc"] == wait["attrs"]["sem_alloc"], (start["attrs"], wait["attrs"])
    assert wait["attrs"]["bytes"] == 256 * 256 * 4
