"""Whole programs through the Pallas IR path (`tpusim.jax.simulate_program`, crate
`tpusim-program`): the XLA ops around the kernels, their counts checked against XLA's own
`Lowered.cost_analysis()`, the fusions against a closed form, collectives under `shard_map` on
the slice, and a ring-attention step with compute and ICI overlapped.

The `shard_map` tests lower over `tpusim.jax.mesh` (an `AbstractMesh` with the TPU device kind),
which needs no devices: no fake CPU devices (XLA_FLAGS) are needed, so no subprocess either."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.sharding import PartitionSpec as P

import tpusim
import tpusim.jax as tj

from kernels import tutorial_matmul


def _cost_analysis(fn, args, mesh=None):
    kind, cores = tj.DEVICE_KINDS["v6e"]
    m = mesh or tj.mesh((1,), ("x",))
    with jax.sharding.use_abstract_mesh(m):
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("tpu",)).cost_analysis()


def _block(x, w1, w2, g):
    """A transformer-style block's XLA part: RMS norm, an MLP with gelu, a softmax over a
    transposed product, converts."""
    xf = x.astype(jnp.float32)
    h = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + 1e-6) * g
    h = h.astype(jnp.bfloat16)
    u = jax.nn.gelu(jnp.dot(h, w1, preferred_element_type=jnp.float32))
    y = jnp.dot(u.astype(jnp.bfloat16), w2, preferred_element_type=jnp.float32)
    s = jnp.einsum("sd,td->st", y.astype(jnp.bfloat16), x, preferred_element_type=jnp.float32)
    p = jax.nn.softmax(s, axis=-1)
    return (p.T @ xf).astype(jnp.bfloat16) + x


BLOCK_ARGS = (
    jax.ShapeDtypeStruct((256, 512), jnp.bfloat16),
    jax.ShapeDtypeStruct((512, 1024), jnp.bfloat16),
    jax.ShapeDtypeStruct((1024, 512), jnp.bfloat16),
    jax.ShapeDtypeStruct((512,), jnp.float32),
)


def test_xla_counts_agree_with_cost_analysis():
    """FLOPs and transcendentals of the XLA ops equal XLA's cost analysis of the same export
    within 1%; the unfused bytes (custom calls excluded) equal its bytes within 1%."""
    r = tj.simulate_program(_block, *BLOCK_ARGS)
    ca = _cost_analysis(_block, BLOCK_ARGS)
    assert r.xla_flops == pytest.approx(ca["flops"], rel=0.01)
    assert r.xla_transcendentals == pytest.approx(ca["transcendentals"], rel=0.01)
    assert r.xla_bytes_unfused == pytest.approx(ca["bytes accessed"], rel=0.01)
    # The difference is the transpose: XLA's analysis reports no bytes for it, tpusim counts its
    # operand and result; without it the counts agree within 0.1%.
    tr = _transpose_bytes(tj.describe_program(_block, *BLOCK_ARGS))
    assert tr == 2 * 256 * 256 * 4
    assert r.xla_bytes_unfused - tr == pytest.approx(ca["bytes accessed"], rel=0.001)
    # Not a tautology: the dots alone are far from the total, and fusion saves bytes.
    dots = 2 * 256 * 512 * 1024 * 2 + 2 * 256 * 256 * 512 * 2
    assert dots < r.xla_flops < 1.1 * dots
    assert r.xla_bytes_fused < 0.5 * r.xla_bytes_unfused
    kinds = [e["kind"] for e in r.entries]
    assert kinds.count("dot") == 4 and kinds.count("fusion") == r.fusions >= 3
    assert r.latency_ms == pytest.approx(sum(e["seconds"] for e in r.entries) * 1e3)
    assert all(e["location"].startswith("test_program.py:") for e in r.entries), [e["location"] for e in r.entries]


def _transpose_bytes(d):
    """Operand plus result bytes of a description's transposes (XLA's analysis counts none)."""
    size = {"f32": 4, "bf16": 2}
    return sum(
        int(np.prod(d["values"][v]["shape"])) * size[d["values"][v]["dtype"]]
        for o in d["ops"] if o["op"] == "transpose" for v in o["operands"] + o["results"]
    )


def collective_program():
    """A shard_map body on a 2x4 mesh: x @ x^T, tanh, psum over one axis, all_gather over the
    other. Returns (fn, args, mesh)."""
    mesh = tj.mesh((2, 4), ("a", "b"))

    def f(x):
        def inner(x):
            y = jnp.tanh(x @ x.T)
            return jax.lax.psum(y, "a"), jax.lax.all_gather(y, "b", tiled=True)

        return jax.shard_map(inner, mesh=mesh, in_specs=P("a", "b"), out_specs=(P(None, "b"), P("a", None)), check_vma=False)(x)

    return f, (jax.ShapeDtypeStruct((512, 1024), jnp.float32),), mesh


def test_collective_program_counts_agree_with_cost_analysis():
    """Under shard_map (per-device shapes, collectives): FLOPs and transcendentals within 1%;
    bytes unfused, the transpose's left out, within 0.1%."""
    f, args, mesh = collective_program()
    r = tj.simulate_program(f, *args, mesh=mesh)
    ca = _cost_analysis(f, args, mesh)
    assert r.xla_flops == pytest.approx(ca["flops"], rel=0.01)
    assert r.xla_transcendentals == pytest.approx(ca["transcendentals"], rel=0.01)
    tr = _transpose_bytes(tj.describe_program(f, *args, mesh=mesh))
    assert tr == 2 * 256 * 256 * 4
    assert r.xla_bytes_unfused - tr == pytest.approx(ca["bytes accessed"], rel=0.001)
    assert [e["name"].split()[0] for e in r.by_kind("collective")] == ["all_reduce", "all_gather"]


def test_a_kernel_in_the_program_is_left_out_of_the_xla_counts():
    """A Pallas matmul between XLA ops: the kernel is simulated through tpusim-pallas, the
    XLA counts still match cost_analysis (which sees no work in the kernel), and the kernel's
    own FLOPs are the matmul's."""
    mm = tutorial_matmul(256, 256, 256)

    def f(x, y):
        return jnp.tanh(mm(x * 2, y).astype(jnp.float32)).sum(axis=0)

    args = (jax.ShapeDtypeStruct((512, 512), jnp.bfloat16), jax.ShapeDtypeStruct((512, 512), jnp.bfloat16))
    r = tj.simulate_program(f, *args)
    ca = _cost_analysis(f, args)
    assert r.xla_flops == pytest.approx(ca["flops"], rel=0.01)
    assert r.xla_transcendentals == pytest.approx(ca["transcendentals"], rel=0.01) and r.xla_transcendentals == 512 * 512
    (k,) = r.by_kind("kernel")
    assert k["flops"] == 2 * 512**3
    # With JAX 0.9.0 to 0.10.2 the analysis counts no bytes for the Pallas call either (no cost_estimate).
    assert r.xla_bytes_unfused == pytest.approx(ca["bytes accessed"], rel=0.01)
    assert k["hbm_bytes"] >= 3 * 512 * 512 * 2
    # Fused: x * 2 (read x, write), then tanh + convert + reduce (read the kernel's output, write 512 f32).
    assert r.xla_bytes_fused == (512 * 512 * 2 + 2) + 512 * 512 * 2 + 512 * 512 * 2 + 4 + 512 * 4


def test_fused_bytes_follow_the_closed_form():
    """x @ w then gelu and a convert, fused into the dot's output: one group reading x, w and
    the gelu's four scalar constants once and writing the bf16 output once."""
    m, k, n = 256, 512, 384

    def f(x, w):
        return jax.nn.gelu(jnp.dot(x, w, preferred_element_type=jnp.float32)).astype(jnp.bfloat16)

    r = tj.simulate_program(f, jax.ShapeDtypeStruct((m, k), jnp.bfloat16), jax.ShapeDtypeStruct((k, n), jnp.bfloat16))
    assert [e["kind"] for e in r.entries] == ["dot"]
    assert r.xla_bytes_fused == m * k * 2 + k * n * 2 + 4 * 4 + m * n * 2


def _attention_kernel(q, k, v, block_q=512):
    """A small flash-style Pallas kernel: per q block, softmax(q k^T) v over the whole local KV."""

    def kernel(q_ref, k_ref, v_ref, o_ref):
        s = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        m = jnp.max(s, axis=-1, keepdims=True)
        p = jnp.exp(s - m)
        l = jnp.sum(p, axis=-1, keepdims=True)
        o = jnp.dot(p.astype(v_ref.dtype), v_ref[...], preferred_element_type=jnp.float32)
        o_ref[...] = (o / l).astype(o_ref.dtype)

    sq, d = q.shape
    skv = k.shape[0]
    return pl.pallas_call(
        kernel,
        grid=(sq // block_q,),
        in_specs=[pl.BlockSpec((block_q, d), lambda i: (i, 0)), pl.BlockSpec((skv, d), lambda i: (0, 0)), pl.BlockSpec((skv, d), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((block_q, d), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
    )(q, k, v)


RING = 8


def _ring_step(mesh, wait_for_kv):
    perm = [(i, (i + 1) % RING) for i in range(RING)]

    def step(q, k, v):
        k2 = jax.lax.ppermute(k, "r", perm)
        v2 = jax.lax.ppermute(v, "r", perm)
        o = _attention_kernel(q, k2, v2) if wait_for_kv else _attention_kernel(q, k, v)
        return o, k2, v2

    return jax.shard_map(step, mesh=mesh, in_specs=P("r"), out_specs=P("r"), check_vma=False)


def test_ring_attention_step_overlaps_the_kv_pass_with_the_kernel():
    """One ring-attention step on 8 chips (2x4): each chip's KV block goes to the next with
    ppermute while the kernel computes on the current one. The overlap rule (tpusim-program
    `sim`): the transfers hide behind the kernel, which is then longer by the named issue cost
    (`fitted.dma_issue_ns` per message: one per permute); the latency lies between the larger of the
    compute-only and ICI-only schedules and their sum. When the kernel needs the passed blocks,
    nothing overlaps."""
    mesh = tj.mesh((RING,), ("r",))
    s_local, skv, d = 8192, 1024, 128
    args = (
        jax.ShapeDtypeStruct((RING * s_local, d), jnp.bfloat16),
        jax.ShapeDtypeStruct((RING * skv, d), jnp.bfloat16),
        jax.ShapeDtypeStruct((RING * skv, d), jnp.bfloat16),
    )
    r = tj.simulate_program(_ring_step(mesh, False), *args, mesh=mesh, slice="2x4")
    (kernel,) = r.by_kind("kernel")
    perms = r.by_kind("collective")
    assert [p["name"].split()[0] for p in perms] == ["collective_permute"] * 2
    ici = sum(p["seconds"] for p in perms)
    assert 0 < ici < kernel["seconds"], "the case needs the transfers shorter than the kernel"
    # Each device sends its 256 KiB block once; the 2x4 mesh's wraparound pair (3 -> 4) is 4 hops.
    link_s = skv * d * 2 / (tpusim.chip("v6e")["ici"]["link_bandwidth_gb_per_s"]["value"] * 1e9)
    assert perms[0]["seconds"] == pytest.approx(link_s + 4 * 1e-6, rel=1e-9)
    issue_s = tpusim.chip("v6e")["fitted"]["dma_issue_ns"]["value"] * 1e-9
    issue = 2 * issue_s  # fitted.dma_issue_ns of v6e, one message per permute
    assert r.latency_ms == pytest.approx((kernel["seconds"] + issue) * 1e3, rel=1e-9)
    assert max(r.compute_only_ms, r.ici_only_ms) <= r.latency_ms + 1e-12 <= r.compute_only_ms + r.ici_only_ms + 2e-12
    assert r.ici_hidden_ms == pytest.approx(ici * 1e3, rel=1e-9)

    w = tj.simulate_program(_ring_step(mesh, True), *args, mesh=mesh, slice="2x4")
    assert w.latency_ms == pytest.approx((ici + kernel["seconds"] + issue_s) * 1e3, rel=1e-6)
    assert max(w.compute_only_ms, w.ici_only_ms) <= w.latency_ms <= w.compute_only_ms + w.ici_only_ms + 1e-12


def test_collectives_under_shard_map_keep_their_groups():
    """psum and all_gather over one axis of a 2x4 mesh: replica groups of devices 4 apart, which
    the 2x4 slice puts on neighbouring chips (one hop)."""
    mesh = tj.mesh((2, 4), ("a", "b"))

    def f(x):
        def inner(x):
            s = jax.lax.psum(x, "a")
            g = jax.lax.all_gather(x, "a", tiled=True)
            return s, g

        return jax.shard_map(inner, mesh=mesh, in_specs=P("a", "b"), out_specs=(P(None, "b"), P(None, "b")), check_vma=False)(x)

    d = tj.describe_program(f, jax.ShapeDtypeStruct((512, 512), jnp.float32), mesh=mesh)
    colls = [o for o in d["ops"] if o["op"] in ("all_reduce", "all_gather")]
    assert [o["attrs"]["replica_groups"] for o in colls] == [[[0, 4], [1, 5], [2, 6], [3, 7]]] * 2
    assert d["mesh"] == [["a", 2], ["b", 4]]
    r = tj.simulate_program(f, jax.ShapeDtypeStruct((512, 512), jnp.float32), mesh=mesh)
    assert r.slice.startswith("2x4")
    assert all("1 hops" in e["detail"] for e in r.by_kind("collective"))
    with pytest.raises(tpusim.InputError, match=r"`slice` = 2x2: 4 devices, but the program's mesh \(a=2, b=4\) has 8"):
        tj.simulate_program(f, jax.ShapeDtypeStruct((512, 512), jnp.float32), mesh=mesh, slice="2x2")


def test_ops_not_modelled_are_errors_naming_op_and_line():
    def f(x):
        return jnp.sort(x, axis=-1)

    with pytest.raises(tpusim.InputError, match=r"op `sort` at test_program.py:\d+: `sort` is not an op tpusim models"):
        tj.simulate_program(f, jax.ShapeDtypeStruct((8, 128), jnp.float32))

    def g(x):
        return jax.lax.fori_loop(0, 3, lambda i, y: y * 2, x)

    with pytest.raises(tpusim.InputError, match=r"op `while` at test_program.py:\d+"):
        tj.simulate_program(g, jax.ShapeDtypeStruct((8, 128), jnp.float32))


def test_a_mesh_built_for_another_chip_is_refused():
    f, args, mesh = collective_program()
    with pytest.raises(tpusim.InputError, match=r"mesh: built for device kind 'TPU v6 lite', but chip 'v5e' lowers as"):
        tj.simulate_program(f, *args, chip="v5e", mesh=mesh)


def test_readme_whole_program_example_runs(root):
    text = (root / "README.md").read_text()
    section = text.split("## Whole programs: the XLA ops, collectives and kernels of a jitted function", 1)[1]
    code = section.split("```python", 1)[1].split("```", 1)[0]
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)
    r = scope["r"]
    kinds = [e["kind"] for e in r.entries]
    assert kinds.count("dot") == 2 and kinds.count("collective") == 1
    (ar,) = r.by_kind("collective")
    assert ar["name"].startswith("all_reduce") and ar["location"].startswith("README.md:")
    # The all-reduce waits for the second dot and the residual add waits for it: nothing to hide behind.
    assert r.latency_ms == pytest.approx(r.compute_only_ms + ar["seconds"] * 1e3, rel=1e-9)
    assert r.ici_hidden_ms == pytest.approx(0, abs=1e-12)


#: Shape and blocks of the [B, S, H, D] wrapper case: heads, tokens, head_dim, blocks.
BSHD = (4, 2048, 128, 512)


def _bshd_runs(mask):
    """JAX Splash behind an axlearn-style wrapper ([B, S, H, D] in and out: q scaled and
    transposed, k and v transposed, o transposed back), simulated from its export, and the hand
    model of the same call under `--scope call --input-layout bshd`: (program report, Report)."""
    from kernels import splash

    h, s, d, b = BSHD
    kernel = splash(mask, h, s, b)
    scale = d**-0.5

    def wrapper(q, k, v):
        qh = jnp.einsum("bshd->bhsd", q * scale)
        kh = jnp.einsum("bshd->bhsd", k)
        vh = jnp.einsum("bshd->bhsd", v)
        return jnp.einsum("bhsd->bshd", kernel(qh[0], kh[0], vh[0])[None])

    x = jax.ShapeDtypeStruct((1, s, h, d), jnp.bfloat16)
    r = tj.simulate_program(wrapper, x, x, x)
    hand = tpusim.simulate(
        kernel="splash", heads=h, seq_len=s, head_dim=d, mask=mask, block_q=b, block_kv=b, block_kv_compute=b,
        scope="call", input_layout="bshd",
    )
    return r, hand


@pytest.mark.parametrize("mask", ["full", "causal"])
def test_splash_behind_a_bshd_wrapper_agrees_with_scope_call(mask):
    """The [B, S, H, D] wrapper case (`_bshd_runs`) simulated from its export equals `--scope
    call --input-layout bshd` without the host's dispatch cost, and the wrapper's four transposes
    equal its phases one by one: the same fusions and the same kernel bodies (one builder), but
    for the scale's scalar constant the program's q transpose also reads (a part in 10^6)."""
    r, hand = _bshd_runs(mask)
    assert r.latency_ms == pytest.approx(hand.latency_ms - hand.host_ms, rel=1e-6)
    wrap = [p["latency_ms"] for p in hand.phases if p["part"] == "wrapper"]
    fusions = [e["seconds"] * 1e3 for e in r.by_kind("fusion")]
    assert len(fusions) == len(wrap) == 4
    for f, w in zip(fusions, wrap):
        assert f == pytest.approx(w, rel=1e-6)


# A small Wan-like block against `tpusim layer` on the same shapes: 768 tokens (a 256x256, 9-frame
# video), hidden 1024, 8 heads of 128, FFN 4096, 512 text tokens, JAX Splash with blocks 256.
WAN = {"L": 768, "D": 1024, "H": 8, "hd": 128, "F": 4096, "T": 512}
WAN_TOML = """name = "small-wan"
source = "tests/test_program.py: Wan 2.1's block structure at a small width"
hidden = 1024
heads = 8
head_dim = 128
ffn = 4096
layers = 1
text_tokens = 512
qk_norm = true
cross_attn_norm = true
modulation_vectors = 6
bias = true
patch = [1, 2, 2]
vae_stride = [4, 8, 8]
activation_bytes = 2
weight_bytes = 2
"""


@functools.lru_cache(maxsize=1)
def _wan_runs(tmp):
    import json
    import pathlib

    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    from conftest import run_cli
    from wan_block import block_args, make_block

    L, D, H, hd, F, T = (WAN[k] for k in ("L", "D", "H", "hd", "F", "T"))
    bs = sk.BlockSizes(block_q=256, block_kv=256, block_kv_compute=256)
    self_k = sk.make_splash_mha(sm.MultiHeadMask([sm.FullMask((L, L))] * H), block_sizes=bs, head_shards=1, q_seq_shards=1)
    cross_k = sk.make_splash_mha(sm.MultiHeadMask([sm.FullMask((L, T))] * H), block_sizes=bs, head_shards=1, q_seq_shards=1)
    r = tj.simulate_program(make_block(H, hd, self_k, cross_k), *block_args(L, D, F, T, hd))
    tmp = pathlib.Path(tmp)
    (tmp / "small-wan.toml").write_text(WAN_TOML)
    (tmp / "splash256.toml").write_text('kernel = "splash"\nblock_q = 256\nblock_kv = 256\nblock_kv_compute = 256\n')
    out, _ = run_cli(
        "layer", "--model", tmp / "small-wan.toml", "--resolution", "256x256", "--frames", "9", "--slice", "1", "--cfg", "off",
        "--dense-kernel", tmp / "splash256.toml", "--format", "json",
    )
    return r, json.loads(out)


@pytest.fixture(scope="module")
def wan(tmp_path_factory):
    return _wan_runs(str(tmp_path_factory.mktemp("wan")))


def test_wan_like_block_matmuls_and_attention_agree_with_tpusim_layer(wan):
    """The block's ten matmuls and two attention calls, op by op, take the time `tpusim layer`
    gives the same shapes (the matmuls by the same XLA-dot lowering, the attention through the IR
    path here and the hand Splash model there: one body builder, so equal)."""
    r, lay = wan
    assert lay["tokens"] == WAN["L"]
    lay_mm = [o for o in lay["ops"] if o["category"] in ("projections", "feed-forward")]
    lay_att = [o for o in lay["ops"] if o["category"] == "attention"]
    dots = r.by_kind("dot")
    kernels = r.by_kind("kernel")
    assert len(dots) == len(lay_mm) == 10 and len(kernels) == len(lay_att) == 2
    # Program order differs only in where the text projections sit: match by shape, in order.
    for e, o in zip(dots, lay_mm):
        assert e["detail"].split(" (")[0] == o["detail"].split(",")[0], (e["detail"], o["detail"])
        assert e["seconds"] * 1e3 == pytest.approx(o["ms"], rel=1e-9), (e["name"], o["name"])
    for e, o in zip(kernels, lay_att):
        assert e["seconds"] * 1e3 == pytest.approx(o["ms"], rel=1e-9), (e["name"], o["name"])
    # The FFN's GELU rides on the up projection's output, as the layer assumes.
    up = next(e for e in dots if e["detail"].startswith("768 x 4096 x 1024"))
    assert "tanh" in up["ops"]


# Bytes of scalar constants (an epsilon, a 1 / n) an XLA fusion reads beside its tensors: the
# only difference the layer's fusions may have from the program's.
SCALAR_BYTES = 16


def test_wan_like_block_elementwise_and_latency_equal_tpusim_layer(wan):
    """The layer's element-wise ops are the program's fusions one for one, in program order: the
    same HBM bytes but for a fusion's scalar constants (`SCALAR_BYTES`), so the same times to a
    part in 10^4, and the same block latency. Both follow one fusion rule: norms in two passes
    (an RMSNorm reads its f32 weight, RoPE its cos and sin tables), transposes that join neither
    a dot nor a kernel, the first gated residual computed inside norm3's fusions and never
    written, the ungated residual in the cross o projection's output."""
    r, lay = wan
    fus = r.by_kind("fusion")
    ew = [o for o in lay["ops"] if o["category"] == "elementwise"]
    assert len(fus) == len(ew) == 20, [o["name"] for o in ew]
    for e, o in zip(fus, ew):
        assert 0 <= e["hbm_bytes"] - o["hbm_bytes"] <= SCALAR_BYTES, (e["name"], e["hbm_bytes"], o["name"], o["hbm_bytes"])
        assert e["seconds"] * 1e3 == pytest.approx(o["ms"], rel=1e-4), (e["name"], o["name"])
        assert (e["ops"] == ["transpose"]) == o["name"].endswith("transpose"), (e["name"], o["name"])
    # norm3's statistics fusion computes x1 = x + gate * o (multiply, add) before reducing it.
    n3 = next(e for e, o in zip(fus, ew) if o["name"] == "residual + norm3 statistics")
    assert {"multiply", "add", "reduce"} <= set(n3["ops"]), n3["ops"]
    assert not any(o["name"] in ("residual add", "gate + residual") and o["start_ms"] < n3["start"] * 1e3 for o in ew)
    assert r.latency_ms == pytest.approx(lay["latency_ms"], rel=1e-4)


def test_all_to_all_and_reduce_scatter_are_read_and_timed():
    """all_to_all and psum_scatter over the 4-chip axis of a 2x4 mesh: read with their replica
    groups (the rows of the mesh) and timed on the links: a reduce-scatter of B per device loads
    them as the all-gather of its B / 4 result shards."""
    mesh = tj.mesh((2, 4), ("a", "b"))

    def f(x):
        def inner(x):
            t = jax.lax.all_to_all(x, "b", 0, 0, tiled=True)
            s = jax.lax.psum_scatter(x, "b", scatter_dimension=0, tiled=True)
            g = jax.lax.all_gather(s, "b", tiled=True)
            return t, g

        return jax.shard_map(inner, mesh=mesh, in_specs=P("a", "b"), out_specs=(P("a", "b"), P("a", "b")), check_vma=False)(x)

    args = (jax.ShapeDtypeStruct((1024, 1024), jnp.float32),)
    d = tj.describe_program(f, *args, mesh=mesh)
    ops = {o["op"]: o for o in d["ops"] if o["op"] in ("all_to_all", "reduce_scatter", "all_gather")}
    assert set(ops) == {"all_to_all", "reduce_scatter", "all_gather"}
    assert all(o["attrs"]["replica_groups"] == [[0, 1, 2, 3], [4, 5, 6, 7]] for o in ops.values())
    assert ops["all_to_all"]["attrs"]["split_count"] == 4
    r = tj.simulate_program(f, *args, mesh=mesh)
    t = {e["name"].split()[0]: e for e in r.by_kind("collective")}
    assert t["reduce_scatter"]["seconds"] == pytest.approx(t["all_gather"]["seconds"], rel=1e-12)
    assert all(e["seconds"] > 0 for e in t.values())
