"""A small Wan-like DiT block (the structure of Wan 2.1's WanAttentionBlock: modulation, LayerNorm,
q / k / v projections with bias, q / k RMSNorm and RoPE, Splash self-attention, a gated residual,
norm3, cross-attention to the text with its own projections and norms, the FFN with tanh GELU and a
gated residual) in JAX, for the whole-program tests (a test helper, not a test)."""
import jax, jax.numpy as jnp


def layer_norm(x, eps=1e-6):
    xf = x.astype(jnp.float32)
    mu = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mu), axis=-1, keepdims=True)
    return (xf - mu) * jax.lax.rsqrt(var + eps)


def rms_norm(x, g, eps=1e-6):
    xf = x.astype(jnp.float32)
    return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps) * g).astype(x.dtype)


def rope(x, cos, sin):
    # x [L, H, hd], cos / sin [L, 1, hd] f32 (rotate-half form)
    xf = x.astype(jnp.float32)
    h = xf.shape[-1] // 2
    rot = jnp.concatenate([-xf[..., h:], xf[..., :h]], axis=-1)
    return (xf * cos + rot * sin).astype(x.dtype)


def make_block(heads, head_dim, self_attn, cross_attn):
    def block(x, ctx, e, table, w, b, g, cos, sin):
        L, D = x.shape
        mod = table + e                                     # [6, D] f32
        sh1, sc1, g1, sh2, sc2, g2 = [mod[i] for i in range(6)]
        h = (layer_norm(x) * (1 + sc1) + sh1).astype(jnp.bfloat16)
        q = jnp.dot(h, w["q"]) + b["q"]
        k = jnp.dot(h, w["k"]) + b["k"]
        v = jnp.dot(h, w["v"]) + b["v"]
        scale = head_dim ** -0.5
        q = rope(rms_norm(q, g["q"]).reshape(L, heads, head_dim), cos, sin) * jnp.bfloat16(scale)
        k = rope(rms_norm(k, g["k"]).reshape(L, heads, head_dim), cos, sin)
        v = v.reshape(L, heads, head_dim)
        o = self_attn(q.transpose(1, 0, 2), k.transpose(1, 0, 2), v.transpose(1, 0, 2))
        o = o.transpose(1, 0, 2).reshape(L, D)
        o = jnp.dot(o, w["o"]) + b["o"]
        x1 = (x.astype(jnp.float32) + o.astype(jnp.float32) * g1).astype(jnp.bfloat16)
        n3 = (layer_norm(x1) * g["n3"] + b["n3"]).astype(jnp.bfloat16)
        cq = rms_norm(jnp.dot(n3, w["cq"]) + b["cq"], g["cq"]) * jnp.bfloat16(scale)
        ck = rms_norm(jnp.dot(ctx, w["ck"]) + b["ck"], g["ck"])
        cv = jnp.dot(ctx, w["cv"]) + b["cv"]
        T = ctx.shape[0]
        co = cross_attn(cq.reshape(L, heads, head_dim).transpose(1, 0, 2), ck.reshape(T, heads, head_dim).transpose(1, 0, 2), cv.reshape(T, heads, head_dim).transpose(1, 0, 2))
        co = jnp.dot(co.transpose(1, 0, 2).reshape(L, D), w["co"]) + b["co"]
        x2 = x1 + co
        n2 = (layer_norm(x2) * (1 + sc2) + sh2).astype(jnp.bfloat16)
        u = jax.nn.gelu(jnp.dot(n2, w["up"]) + b["up"], approximate=True)
        dn = jnp.dot(u, w["down"]) + b["down"]
        return (x2.astype(jnp.float32) + dn.astype(jnp.float32) * g2).astype(jnp.bfloat16)
    return block


def block_args(L, D, F, T, hd):
    S = jax.ShapeDtypeStruct
    bf, f32 = jnp.bfloat16, jnp.float32
    w = {n: S((D, D), bf) for n in ("q", "k", "v", "o", "cq", "ck", "cv", "co")}
    w["up"] = S((D, F), bf)
    w["down"] = S((F, D), bf)
    b = {n: S((D,), bf) for n in ("q", "k", "v", "o", "cq", "ck", "cv", "co", "down")}
    b["up"] = S((F,), bf)
    b["n3"] = S((D,), f32)
    g = {n: S((D,), f32) for n in ("q", "k", "cq", "ck", "n3")}
    return (S((L, D), bf), S((T, D), bf), S((6, D), f32), S((6, D), f32), w, b, g, S((L, 1, hd), f32), S((L, 1, hd), f32))
