"""Pallas kernels the IR-path tests lower (test helpers, not tests): the Pallas TPU tutorial's
matmul, a block-sparse matmul and a fused RMSNorm (user kernels no hand model covers), a
kv-major flash attention forward, and JAX's Splash attention."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def tutorial_matmul(bm=512, bk=512, bn=512):
    """The Pallas TPU tutorial's blocked matmul (docs/pallas/tpu/matmul.ipynb), bf16 in, f32 acc."""

    def kernel(x_ref, y_ref, z_ref, acc_ref, *, nsteps):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == nsteps - 1)
        def _():
            z_ref[...] = acc_ref[...].astype(z_ref.dtype)

    def f(x, y):
        m, k = x.shape
        _, n = y.shape
        return pl.pallas_call(
            lambda *r: kernel(*r, nsteps=k // bk),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=0,
                in_specs=[pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)), pl.BlockSpec((bk, bn), lambda i, j, k: (k, j))],
                out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
                scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
                grid=(m // bm, n // bn, k // bk),
            ),
            out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
        )(x, y)

    return f


def block_sparse_matmul(block_mask, bm=256, bk=256, bn=256):
    """x @ y where only the (i, k) blocks of x that `block_mask` keeps are nonzero: a
    scalar-prefetched mask skips the others' matmuls, and an index map that repeats the previous
    kept block elides their copies (the pattern of Splash's data_next)."""
    block_mask = np.asarray(block_mask, dtype=np.int32)
    mb, kb = block_mask.shape
    # For each (i, k): the k block to have in VMEM (the last kept one at or before k, else the first kept).
    nxt = np.zeros_like(block_mask)
    for i in range(mb):
        last = int(np.argmax(block_mask[i])) if block_mask[i].any() else 0
        for k in range(kb):
            if block_mask[i, k]:
                last = k
            nxt[i, k] = last

    def kernel(mask_ref, next_ref, x_ref, y_ref, z_ref, acc_ref):
        i, k = pl.program_id(0), pl.program_id(2)

        @pl.when(k == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        @pl.when(mask_ref[i, k] != 0)
        def _():
            acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

        @pl.when(k == kb - 1)
        def _():
            z_ref[...] = acc_ref[...].astype(z_ref.dtype)

    def f(x, y):
        m, kk = x.shape
        _, n = y.shape
        return pl.pallas_call(
            kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=2,
                in_specs=[
                    pl.BlockSpec((bm, bk), lambda i, j, k, msk, nx: (i, nx[i, k])),
                    pl.BlockSpec((bk, bn), lambda i, j, k, msk, nx: (nx[i, k], j)),
                ],
                out_specs=pl.BlockSpec((bm, bn), lambda i, j, k, msk, nx: (i, j)),
                scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
                grid=(m // bm, n // bn, kb),
            ),
            out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
        )(jnp.asarray(block_mask), jnp.asarray(nxt), x, y)

    return f


def block_sparse_matmul_runtime(nb, b):
    """A block-diagonal-or-not matmul whose block mask is an argument (`mask` (nb, nb) int32,
    scalar-prefetched): the kernel branches on it, so it must be known to simulate."""

    def kernel(mask_ref, x_ref, y_ref, z_ref, acc_ref):
        i, k = pl.program_id(0), pl.program_id(2)

        @pl.when(k == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        @pl.when(mask_ref[i, k] != 0)
        def _():
            acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

        @pl.when(k == nb - 1)
        def _():
            z_ref[...] = acc_ref[...].astype(z_ref.dtype)

    def f(mask, x, y):
        return pl.pallas_call(
            kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1,
                in_specs=[pl.BlockSpec((b, b), lambda i, j, k, m: (i, k)), pl.BlockSpec((b, b), lambda i, j, k, m: (k, j))],
                out_specs=pl.BlockSpec((b, b), lambda i, j, k, m: (i, j)),
                scratch_shapes=[pltpu.VMEM((b, b), jnp.float32)],
                grid=(nb, y.shape[1] // b, nb),
            ),
            out_shape=jax.ShapeDtypeStruct((x.shape[0], y.shape[1]), x.dtype),
        )(mask, x, y)

    return f


def rms_norm(block_rows=256, eps=1e-6):
    """Fused RMSNorm over the last dimension: y = x * rsqrt(mean(x^2) + eps) * w, f32 math."""

    def kernel(x_ref, w_ref, o_ref):
        x = x_ref[...].astype(jnp.float32)
        ms = jnp.mean(x * x, axis=-1, keepdims=True)
        o_ref[...] = (x * jax.lax.rsqrt(ms + eps) * w_ref[...].astype(jnp.float32)).astype(o_ref.dtype)

    def f(x, w):
        rows, d = x.shape
        return pl.pallas_call(
            kernel,
            grid=(rows // block_rows,),
            in_specs=[pl.BlockSpec((block_rows, d), lambda i: (i, 0)), pl.BlockSpec((1, d), lambda i: (0, 0))],
            out_specs=pl.BlockSpec((block_rows, d), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        )(x, w)

    return f


def splash(mask_name, heads=4, seq=2048, block=512):
    """JAX's Splash attention forward over `heads` identical masks (full, causal, local, chunked)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk

    mask = _multi_head_mask(mask_name, heads, seq)
    bs = sk.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block)
    return sk.make_splash_mha(mask, block_sizes=bs, head_shards=1, q_seq_shards=1)


def _multi_head_mask(mask_name, heads, seq):
    """`heads` copies of a JAX Splash mask (full, causal, local, chunked, a NumPy causal array)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    masks = {
        "full": lambda: sm.FullMask((seq, seq)),
        "causal": lambda: sm.CausalMask((seq, seq)),
        "local:512,0": lambda: sm.LocalMask((seq, seq), window_size=(512, 0), offset=0),
        "chunked:1024": lambda: sm.ChunkedCausalMask((seq, seq), chunk_size=1024),
        # A NumPy mask (its partial blocks loaded by the kernel): the causal pattern as an array.
        "numpy-causal": lambda: sm.NumpyMask(np.tril(np.ones((seq, seq), dtype=np.bool_))),
    }
    return sm.MultiHeadMask([masks[mask_name]() for _ in range(heads)])


def splash_bwd(mask_name, heads=4, seq=2048, block=512, fused=False, block_kv_compute=None):
    """`jax.grad` of JAX's Splash attention (a sum of its output) with respect to q, k and v:
    the forward with residuals, then the dq and dkv kernels (`fused`: one dkv kernel that also
    writes dq). Every block `block`; the dkv kernel's compute sub-tile `block_kv_compute`."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk

    m = _multi_head_mask(mask_name, heads, seq)
    bs = sk.BlockSizes(
        block_q=block,
        block_kv=block,
        block_kv_compute=block,
        block_q_dkv=block,
        block_kv_dkv=block,
        block_kv_dkv_compute=block_kv_compute or block,
        block_q_dq=None if fused else block,
        block_kv_dq=None if fused else block,
        use_fused_bwd_kernel=fused,
    )
    kernel = sk.make_splash_mha(m, block_sizes=bs, head_shards=1, q_seq_shards=1)

    def loss(q, k, v):
        return kernel(q, k, v).astype(jnp.float32).sum()

    return jax.grad(loss, argnums=(0, 1, 2))


def flash(causal, block_q, block_k_major, block_k):
    """JAX's older Pallas TPU flash attention forward (`flash_attention.flash_attention`) with
    `block_b` 1."""
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    bs = fa.BlockSizes(block_q=block_q, block_k_major=block_k_major, block_k=block_k, block_b=1)
    return lambda q, k, v: fa.flash_attention(q, k, v, causal=causal, block_sizes=bs)


def kv_major_flash(block_q=1024, block_kv=1024, block_kv_compute=256, unroll=True, scale_k=False):
    """A flash attention forward that computes its scores kv-major, s = k q^T (kv along the
    sublanes, q along the lanes, as MaxDiffusion's Splash kernels lay them out), so the softmax
    reduces over the score tile's rows; a loop over `block_kv_compute`-row sub-tiles of each kv
    block, unrolled or not; with `scale_k` each k sub-tile is scaled and cast as it is read.
    Grid (heads, q blocks, kv blocks); o is written (heads, dv, q)."""
    nt = (((1,), (1,)), ((), ()))

    def kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref):
        j = pl.program_id(2)

        @pl.when(j == 0)
        def _():
            m_ref[...] = jnp.full_like(m_ref, -1e30)
            l_ref[...] = jnp.zeros_like(l_ref)
            acc_ref[...] = jnp.zeros_like(acc_ref)

        def sub_tile(c, _):
            rows = pl.ds(c * block_kv_compute, block_kv_compute)
            k = (k_ref[rows, :] * 0.125).astype(jnp.bfloat16) if scale_k else k_ref[rows, :]
            s = jax.lax.dot_general(k, q_ref[...], nt, preferred_element_type=jnp.float32)
            m_old = m_ref[...]
            m_new = jnp.maximum(m_old, s.max(axis=0, keepdims=True))
            p = jnp.exp(s - m_new[0:1])
            alpha = jnp.exp(m_old - m_new)
            l_ref[...] = alpha * l_ref[...] + p.sum(axis=0, keepdims=True)
            pv = jax.lax.dot_general(v_ref[rows, :], p.astype(jnp.bfloat16), (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)
            acc_ref[...] = alpha[0:1] * acc_ref[...] + pv
            m_ref[...] = m_new

        jax.lax.fori_loop(0, block_kv // block_kv_compute, sub_tile, None, unroll=unroll)

        @pl.when(j == pl.num_programs(2) - 1)
        def _():
            o_ref[...] = (acc_ref[...] / l_ref[0:1]).astype(o_ref.dtype)

    def f(q, k, v):
        heads, seq, d = q.shape
        return pl.pallas_call(
            kernel,
            grid=(heads, seq // block_q, seq // block_kv),
            in_specs=[
                pl.BlockSpec((None, block_q, d), lambda h, i, j: (h, i, 0)),
                pl.BlockSpec((None, block_kv, d), lambda h, i, j: (h, j, 0)),
                pl.BlockSpec((None, block_kv, d), lambda h, i, j: (h, j, 0)),
            ],
            out_specs=pl.BlockSpec((None, d, block_q), lambda h, i, j: (h, 0, i)),
            scratch_shapes=[pltpu.VMEM((8, block_q), jnp.float32), pltpu.VMEM((8, block_q), jnp.float32), pltpu.VMEM((d, block_q), jnp.float32)],
            out_shape=jax.ShapeDtypeStruct((heads, d, seq), q.dtype),
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary", "arbitrary")),
        )(q, k, v)

    return f


def bf16(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.bfloat16)
