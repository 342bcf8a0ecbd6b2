"""The microbenchmark kernels: small Pallas kernels, each isolating one mechanism of the chip.

Every builder returns `(fn, args)`: a function of JAX arrays that calls one `pl.pallas_call`, and
its arguments as `jax.ShapeDtypeStruct`s, or as NumPy arrays where the kernel reads their values
(scalar-prefetch tables). `interpret=True` builds the same kernel for Pallas's interpret mode
(CPU), which `python -m tpusim.microbench --measure --dry-run` times to test the harness.

The public v6e microbenchmarks (the `MB-v6e-` and `VLLM-KVUPD-v6e-` rows of `traces/measured/calibration.csv`) are written here from their
public description (`copy`, `dma_hbm_hbm_rows`, `dma_via_vmem_rows`, `kv_cache_update_vllm`):
the block shapes, grids, copy patterns and operands it gives, nothing else assumed but what each
docstring says.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

S = jax.ShapeDtypeStruct

#: Rows of the public copy and small-DMA benchmarks: bf16[2048, 4, 128], 1 KiB a row.
PUBLIC_ROWS = 2048
#: The public small-DMA benchmarks' cache: bf16[358848, 4, 128] (5607 pages of 64 tokens).
PUBLIC_CACHE_ROWS = 5607 * 64


def _named(fn, name):
    """`fn` with `name` as its Python name: the jitted module is then `jit_<name>`, which the
    harness finds in a profiler trace."""
    fn.__name__ = fn.__qualname__ = name
    return fn


def _copy_body(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def copy(shape, block, dtype, *, name, interpret=False):
    """A BlockSpec-pipelined copy: `o[...] = x[...]` over blocks `block` of an array `shape`,
    one grid dimension over the leading axis (default dimension semantics). The public v6e copy
    is `shape` (2048, 4, 128), bf16, `block` (t, 4, 128)."""
    shape, block = tuple(shape), tuple(block)
    steps = shape[0] // block[0]
    index = lambda i: (i,) + (0,) * (len(shape) - 1)  # noqa: E731

    def fn(x):
        return pl.pallas_call(
            _copy_body,
            grid=(steps,),
            in_specs=[pl.BlockSpec(block, index)],
            out_specs=pl.BlockSpec(block, index),
            out_shape=S(shape, dtype),
            name=name,
            interpret=interpret,
        )(x)

    return _named(fn, name), [S(shape, dtype)]


def _cache_call(kernel, rows, *, name, interpret, scratch=()):
    """A one-program call (no grid) that copies rows of `x` (bf16[rows, 4, 128], in HBM) into
    the bf16[358848, 4, 128] cache (in HBM, aliased input to output) with its own DMAs."""

    def fn(x, cache):
        return pl.pallas_call(
            kernel,
            in_specs=[pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=list(scratch) + [pltpu.SemaphoreType.DMA],
            out_shape=S(cache.shape, cache.dtype),
            input_output_aliases={1: 0},
            name=name,
            interpret=interpret,
        )(x, cache)

    return _named(fn, name), [S((rows, 4, 128), jnp.bfloat16), S((PUBLIC_CACHE_ROWS, 4, 128), jnp.bfloat16)]


def dma_hbm_hbm_rows(rows=PUBLIC_ROWS, *, name, interpret=False):
    """Public small-DMA pattern (c): one program starts `rows` one-row (1 KiB) copies from x to
    rows 0..rows-1 of the cache, HBM to HBM, on one DMA semaphore, then waits each."""

    def kernel(x_hbm, _cache_in, cache_hbm, sem):
        for i in range(rows):
            pltpu.make_async_copy(x_hbm.at[i], cache_hbm.at[i], sem).start()
        for i in range(rows):
            pltpu.make_async_copy(x_hbm.at[i], cache_hbm.at[i], sem).wait()

    return _cache_call(kernel, rows, name=name, interpret=interpret)


def dma_via_vmem_rows(rows=PUBLIC_ROWS, *, name, interpret=False):
    """Public small-DMA pattern (d): one program copies all of x (rows KiB) HBM to VMEM and waits,
    then starts `rows` one-row copies VMEM to HBM into rows 0..rows-1 of the cache, then waits
    each; one DMA semaphore."""

    def kernel(x_hbm, _cache_in, cache_hbm, buf, sem):
        c = pltpu.make_async_copy(x_hbm, buf, sem)
        c.start()
        c.wait()
        for i in range(rows):
            pltpu.make_async_copy(buf.at[i], cache_hbm.at[i], sem).start()
        for i in range(rows):
            pltpu.make_async_copy(buf.at[i], cache_hbm.at[i], sem).wait()

    return _cache_call(kernel, rows, name=name, interpret=interpret, scratch=[pltpu.VMEM((rows, 4, 128), jnp.bfloat16)])


def _one_program(kernel, in_shape, out_shape, scratch, *, name, interpret):
    def fn(x):
        return pl.pallas_call(
            kernel,
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=scratch,
            out_shape=out_shape,
            name=name,
            interpret=interpret,
        )(x)

    return _named(fn, name), [in_shape]


def dma_serial(tiles, copies=8, *, name, interpret=False):
    """`copies` DMAs of `tiles` f32 (8, 128) tiles each (4 KiB a tile), HBM to VMEM, each waited
    before the next starts: per copy the DMA latency plus its bytes at the HBM-to-VMEM rate."""
    src = S((copies * tiles, 8, 128), jnp.float32)

    def kernel(x_hbm, o_hbm, buf, sem):
        for i in range(copies):
            c = pltpu.make_async_copy(x_hbm.at[pl.ds(i * tiles, tiles)], buf, sem)
            c.start()
            c.wait()
        c = pltpu.make_async_copy(buf.at[pl.ds(0, 1)], o_hbm, sem)
        c.start()
        c.wait()

    scratch = [pltpu.VMEM((tiles, 8, 128), jnp.float32), pltpu.SemaphoreType.DMA]
    return _one_program(kernel, src, S((1, 8, 128), jnp.float32), scratch, name=name, interpret=interpret)


def dma_inflight(in_flight, copies=256, hbm_to_hbm=False, *, name, interpret=False):
    """`copies` one-tile DMAs (f32 (8, 128), 4 KiB), HBM to VMEM (or HBM to HBM), issued in
    groups of `in_flight`: start a group, wait each of it, start the next. How many copies the
    DMA engines keep in flight, and the issue cost of each."""
    src = S((copies, 8, 128), jnp.float32)
    groups = range(0, copies, in_flight)

    if hbm_to_hbm:

        def kernel(x_hbm, o_hbm, sem):
            for g in groups:
                for i in range(g, g + in_flight):
                    pltpu.make_async_copy(x_hbm.at[i], o_hbm.at[i], sem).start()
                for i in range(g, g + in_flight):
                    pltpu.make_async_copy(x_hbm.at[i], o_hbm.at[i], sem).wait()

        return _one_program(kernel, src, src, [pltpu.SemaphoreType.DMA], name=name, interpret=interpret)

    def kernel(x_hbm, o_hbm, buf, sem):
        for g in groups:
            for i in range(g, g + in_flight):
                pltpu.make_async_copy(x_hbm.at[i], buf.at[i], sem).start()
            for i in range(g, g + in_flight):
                pltpu.make_async_copy(x_hbm.at[i], buf.at[i], sem).wait()
        c = pltpu.make_async_copy(buf.at[pl.ds(0, 1)], o_hbm, sem)
        c.start()
        c.wait()

    scratch = [pltpu.VMEM((copies, 8, 128), jnp.float32), pltpu.SemaphoreType.DMA]
    return _one_program(kernel, src, S((1, 8, 128), jnp.float32), scratch, name=name, interpret=interpret)


def dma_grid_rows(rows=PUBLIC_ROWS, *, name, interpret=False):
    """A grid of `rows` steps, each starting one one-row (1 KiB) HBM-to-HBM copy of bf16[rows, 4,
    128] and waiting for it: what a grid step adds to a copy it issues (the public patterns (a)
    and (b) split the starts and waits over two calls, which tpusim cannot express)."""

    def kernel(x_hbm, o_hbm, sem):
        i = pl.program_id(0)
        c = pltpu.make_async_copy(x_hbm.at[i], o_hbm.at[i], sem)
        c.start()
        c.wait()

    def fn(x):
        return pl.pallas_call(
            kernel,
            grid=(rows,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.SemaphoreType.DMA],
            out_shape=S((rows, 4, 128), jnp.bfloat16),
            name=name,
            interpret=interpret,
        )(x)

    return _named(fn, name), [S((rows, 4, 128), jnp.bfloat16)]


def empty_steps(steps, *, name, interpret=False):
    """A grid of `steps` steps with an empty body: one f32 (8, 128) output block at a constant
    index (written back once, at the end), no input. The fixed cost of a grid step, and of the
    call."""

    def kernel(o_ref):
        del o_ref

    def fn(x):
        del x
        return pl.pallas_call(
            kernel,
            grid=(steps,),
            out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
            out_shape=S((8, 128), jnp.float32),
            name=name,
            interpret=interpret,
        )()

    # One (unused) argument so that every entry's function takes arrays.
    return _named(fn, name), [S((8, 128), jnp.float32)]


def resident_chain(op, reps, shape, dtype, steps=8, *, name, interpret=False):
    """A dependent chain of `reps` applications of `op` to one block held in VMEM: `steps` grid
    steps over the same block (index maps constant, so no copy after the first, and the output
    written back once). `op` is `add` (`y = y + x`, VPU), `exp` (`y = exp(y)`, EUP), `roll`
    (`y = roll(y, 1, lanes)`, XLU) or `lane-max` (`y = y - max(y, lanes)`, XLU and VPU)."""

    def step(y, x):
        if op == "add":
            return y + x
        if op == "exp":
            return jnp.exp(y)
        if op == "roll":
            return pltpu.roll(y, 1, 1)
        if op == "lane-max":
            return y - jnp.max(y, axis=1, keepdims=True)
        raise ValueError(f"op = {op!r}: expected add, exp, roll or lane-max")

    def kernel(x_ref, o_ref):
        x = x_ref[...]
        y = x
        for _ in range(reps):
            y = step(y, x)
        o_ref[...] = y

    def fn(x):
        return pl.pallas_call(
            kernel,
            grid=(steps,),
            in_specs=[pl.BlockSpec(shape, lambda i: (0, 0))],
            out_specs=pl.BlockSpec(shape, lambda i: (0, 0)),
            out_shape=S(shape, dtype),
            name=name,
            interpret=interpret,
        )(x)

    return _named(fn, name), [S(shape, dtype)]


def matmul(size, block, dtype, *, name, interpret=False):
    """The Pallas TPU tutorial's blocked matmul, `size`-cubed, square blocks `block` (grid
    (size/block)^3, the contraction innermost, a VMEM accumulator): bf16 operands accumulate in
    f32, int8 operands in int32."""
    acc = jnp.int32 if jnp.dtype(dtype) == jnp.int8 else jnp.float32
    nk = size // block

    def kernel(x_ref, y_ref, z_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=acc)

        @pl.when(pl.program_id(2) == nk - 1)
        def _():
            z_ref[...] = acc_ref[...]

    def fn(x, y):
        return pl.pallas_call(
            kernel,
            grid=(size // block, size // block, nk),
            in_specs=[pl.BlockSpec((block, block), lambda i, j, k: (i, k)), pl.BlockSpec((block, block), lambda i, j, k: (k, j))],
            out_specs=pl.BlockSpec((block, block), lambda i, j, k: (i, j)),
            scratch_shapes=[pltpu.VMEM((block, block), acc)],
            out_shape=S((size, size), acc),
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
            name=name,
            interpret=interpret,
        )(x, y)

    return _named(fn, name), [S((size, size), dtype), S((size, size), dtype)]


def attention_scores(head_dim, seq=2048, block=512, *, name, interpret=False):
    """An attention-like pair of matmuls without softmax at head_dim `head_dim`: per (q block,
    kv block) step `s = q k^T` (contraction over head_dim) and `o += s v` (head_dim output
    columns); bf16 operands, f32 accumulation in the output block. How much of the MXU a 64-wide
    head uses against a 128-wide one."""

    def kernel(q_ref, k_ref, v_ref, o_ref):
        @pl.when(pl.program_id(1) == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        s = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        o_ref[...] += jnp.dot(s.astype(jnp.bfloat16), v_ref[...], preferred_element_type=jnp.float32)

    spec = lambda f: pl.BlockSpec((block, head_dim), f)  # noqa: E731

    def fn(q, k, v):
        return pl.pallas_call(
            kernel,
            grid=(seq // block, seq // block),
            in_specs=[spec(lambda i, j: (i, 0)), spec(lambda i, j: (j, 0)), spec(lambda i, j: (j, 0))],
            out_specs=spec(lambda i, j: (i, 0)),
            out_shape=S((seq, head_dim), jnp.float32),
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
            name=name,
            interpret=interpret,
        )(q, k, v)

    a = S((seq, head_dim), jnp.bfloat16)
    return _named(fn, name), [a, a, a]


# ----------------------------------------------------------------------------------------------
# vLLM's kv_cache_update (judge rows: they check the model and are never fitted)


def vllm_slices(nspb, page=64, seed=0):
    """The public kv_cache_update fixture's slice table, int32[3, n] (cache start, new-kv start,
    length), n = 536 slices padded with zero-length slices to a multiple of `nspb`: 16 and then
    8 pages of contiguous prefill tokens as `page`-token slices (placed at cache slots 0..1535:
    the public file does not say where; no simulated time depends on it), then 512 single
    tokens at unique random slots at or above 4000 (NumPy's default_rng(`seed`))."""
    starts, src, lens = [], [], []
    new = 0
    for p in range(16 + 8):
        starts.append(p * page)
        src.append(new)
        lens.append(page)
        new += page
    rng = np.random.default_rng(seed)
    for slot in rng.choice(np.arange(4000, PUBLIC_CACHE_ROWS), size=512, replace=False):
        starts.append(int(slot))
        src.append(new)
        lens.append(1)
        new += 1
    assert new == PUBLIC_ROWS and len(lens) == 536
    pad = -len(lens) % nspb
    table = np.array([starts + [0] * pad, src + [0] * pad, lens + [0] * pad], dtype=np.int32)
    return table


def kv_cache_update_vllm(nspb, pipelined=False, page=64, *, name, interpret=False):
    """vLLM's kv_cache_update kernel as the public file describes it (vLLM commit 7f280d69,
    `pallas_kv_cache_update.py`): the slice table scalar-prefetched into SMEM, `new_kv`
    bf16[2048, 4, 128] and the cache bf16[358848, 4, 128] in HBM (the cache aliased input to
    output), a VMEM scratch (nspb, page, 4, 128) and DMA semaphores; grid slices / nspb. Each
    step starts nspb HBM-to-VMEM copies of its slices' tokens (each `length` rows), waits all,
    then starts nspb VMEM-to-HBM copies into the cache and waits all, on one semaphore. The
    `pipelined` variant gives each slice its own semaphore and starts each out-copy as soon as
    its in-copy has landed."""
    table = vllm_slices(nspb, page)
    steps = table.shape[1] // nspb

    def kernel(slices_ref, new_hbm, _cache_in, cache_hbm, buf, sems):
        base = pl.program_id(0) * nspb

        def sem(j):
            return sems.at[j] if pipelined else sems.at[0]

        def copy_in(j):
            n = slices_ref[2, base + j]
            return pltpu.make_async_copy(new_hbm.at[pl.ds(slices_ref[1, base + j], n)], buf.at[j, pl.ds(0, n)], sem(j))

        def copy_out(j):
            n = slices_ref[2, base + j]
            return pltpu.make_async_copy(buf.at[j, pl.ds(0, n)], cache_hbm.at[pl.ds(slices_ref[0, base + j], n)], sem(j))

        ins = [copy_in(j) for j in range(nspb)]
        for c in ins:
            c.start()
        if pipelined:
            outs = []
            for j, c in enumerate(ins):
                c.wait()
                outs.append(copy_out(j))
                outs[-1].start()
        else:
            for c in ins:
                c.wait()
            outs = [copy_out(j) for j in range(nspb)]
            for c in outs:
                c.start()
        for c in outs:
            c.wait()

    def fn(slices, new_kv, cache):
        return pl.pallas_call(
            kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1,
                grid=(steps,),
                in_specs=[pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pl.ANY)],
                out_specs=pl.BlockSpec(memory_space=pl.ANY),
                scratch_shapes=[
                    pltpu.VMEM((nspb, page, 4, 128), jnp.bfloat16),
                    pltpu.SemaphoreType.DMA((nspb if pipelined else 1,)),
                ],
            ),
            out_shape=S(cache.shape, cache.dtype),
            input_output_aliases={2: 0},
            name=name,
            interpret=interpret,
        )(slices, new_kv, cache)

    return _named(fn, name), [table, S((PUBLIC_ROWS, 4, 128), jnp.bfloat16), S((PUBLIC_CACHE_ROWS, 4, 128), jnp.bfloat16)]


# ----------------------------------------------------------------------------------------------
# Paged gathers and weight-load-bound matmuls (no public measurement yet: kernels that would take one)


def dma_paged(page, heads, tokens=2048, *, name, interpret=False):
    """A paged gather, as paged attention fetches a sequence's KV cache: one program reads a page
    table (int32[tokens / page], scalar-prefetched into SMEM: pages of a bf16[4 x tokens / page,
    page, heads, 128] cache in HBM, a permutation from NumPy's default_rng(0)) and in a scalar
    loop (`lax.fori_loop`, as the kernels write it) starts one HBM-to-VMEM copy per page into
    rows of a VMEM buffer bf16[tokens, heads, 128], on one semaphore, then waits each; one
    row of the buffer is copied out so that the call has an output. Equal bytes at different
    page sizes separate a page copy's own cost from its bytes; `heads` below bf16's 16-row tile
    makes each token's rows a strided piece of a VMEM tile."""
    pages = tokens // page
    table = np.random.default_rng(0).permutation(4 * pages)[:pages].astype(np.int32)

    def kernel(table_ref, cache_hbm, o_hbm, buf, sem):
        def start(i, c):
            pltpu.make_async_copy(cache_hbm.at[table_ref[i]], buf.at[pl.ds(i * page, page)], sem).start()
            return c

        def wait(i, c):
            pltpu.make_async_copy(cache_hbm.at[0], buf.at[pl.ds(0, page)], sem).wait()
            return c

        jax.lax.fori_loop(0, pages, start, 0)
        jax.lax.fori_loop(0, pages, wait, 0)
        out = pltpu.make_async_copy(buf.at[pl.ds(0, 1)], o_hbm, sem)
        out.start()
        out.wait()

    def fn(table, cache):
        return pl.pallas_call(
            kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1,
                grid=(1,),
                in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                out_specs=pl.BlockSpec(memory_space=pl.ANY),
                scratch_shapes=[pltpu.VMEM((tokens, heads, 128), jnp.bfloat16), pltpu.SemaphoreType.DMA],
            ),
            out_shape=S((1, heads, 128), jnp.bfloat16),
            name=name,
            interpret=interpret,
        )(table, cache)

    return _named(fn, name), [table, S((4 * pages, page, heads, 128), jnp.bfloat16)]


def mxu_fold(m, k, n, reps=64, steps=8, *, name, interpret=False):
    """`reps` matmuls of one resident bf16 (m, k) block by `reps` different (k, n) weight blocks,
    summed in f32: `steps` grid steps over the same blocks (no copy after the first). With few
    rows (m = 8) each matmul's time is its weights' load into the MXU; k and n of 128 against
    256 show whether a fold that fills part of a 256 x 256 array loads in part of the time."""

    def kernel(x_ref, w_ref, o_ref):
        x = x_ref[...]
        acc = jnp.zeros((m, n), jnp.float32)
        for r in range(reps):
            acc += jnp.dot(x, w_ref[r], preferred_element_type=jnp.float32)
        o_ref[...] = acc

    def fn(x, w):
        return pl.pallas_call(
            kernel,
            grid=(steps,),
            in_specs=[pl.BlockSpec((m, k), lambda i: (0, 0)), pl.BlockSpec((reps, k, n), lambda i: (0, 0, 0))],
            out_specs=pl.BlockSpec((m, n), lambda i: (0, 0)),
            out_shape=S((m, n), jnp.float32),
            name=name,
            interpret=interpret,
        )(x, w)

    return _named(fn, name), [S((m, k), jnp.bfloat16), S((reps, k, n), jnp.bfloat16)]
