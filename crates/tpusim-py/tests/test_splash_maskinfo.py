"""Splash masks built with JAX's own classes (JAX on CPU) and classified by JAX's own mask
processing (the MaskInfo it builds for the kernel) against tpusim's empty / partial / full tile
counts, head by head.

Sources: jax/experimental/pallas/ops/tpu/splash_attention/splash_attention_mask.py (classes) and
splash_attention_mask_info.py (process_mask: 0 empty, 1 partial, 2 full per block).
"""

import numpy as np
import pytest

import tpusim

M = pytest.importorskip("jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_mask")
I = pytest.importorskip("jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_mask_info")


def maskinfo_counts(mh, bq, bkv):
    """Per-head [empty, partial, full] from JAX's process_mask (full grid, not shrunk)."""
    info, _ = I.process_mask(mh, (bq, bkv), shrink_grid=False)
    bm = np.asarray(info.block_mask)
    heads = len(mh.masks)
    # One row per head, or one shared by every head when the heads' masks are equal.
    return [np.bincount(bm[h if bm.shape[0] == heads else 0].ravel(), minlength=3).tolist() for h in range(heads)]


def tpusim_counts(mh, bq, bkv):
    return [[c["empty"], c["partial"], c["full"]] for c in tpusim.tile_counts(mh, bq, bkv)]


def heads_for(shape):
    q, kv = shape
    rng = np.random.default_rng(q * 7 + kv)
    return {
        "causal": M.CausalMask(shape),
        "local": M.LocalMask(shape, (200, 0), 0),
        "local_two_sided": M.LocalMask(shape, (96, 300), 0),
        "local_left_unbounded": M.LocalMask(shape, (None, 40), 0),
        "local_offset": M.LocalMask(shape, (256, 16), 64),
        "chunked": M.ChunkedCausalMask(shape, 300),
        "chunked_aligned": M.ChunkedCausalMask(shape, 256),
        "causal_or_local": M.LogicalOr(M.CausalMask(shape), M.LocalMask(shape, (None, 130), 0)),
        "local_and_chunked": M.LogicalAnd(M.LocalMask(shape, (500, 0), 0), M.ChunkedCausalMask(shape, 384)),
        "full": M.FullMask(shape),
        "numpy_random": M.NumpyMask(rng.random(shape) < 0.02),
        "numpy_blocky": M.NumpyMask(np.kron(rng.random((q // 128, kv // 128)) < 0.4, np.ones((128, 128), dtype=bool))),
    }


SHAPES = [(512, 512), (1024, 1024), (2048, 2048), (1024, 2048)]
BLOCKS = [(128, 128), (256, 128), (128, 256), (512, 256)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("blocks", BLOCKS)
def test_each_mask_matches_maskinfo(shape, blocks):
    bq, bkv = blocks
    for name, m in heads_for(shape).items():
        mh = M.MultiHeadMask([m])
        want = maskinfo_counts(mh, bq, bkv)
        got = tpusim_counts(mh, bq, bkv)
        assert got == want, f"{name} {shape} at {bq}x{bkv}: tpusim {got}, JAX MaskInfo {want}"


@pytest.mark.parametrize("shape", [(1024, 1024), (1024, 2048)])
@pytest.mark.parametrize("blocks", [(128, 128), (256, 512)])
def test_multi_head_combinations_match_maskinfo(shape, blocks):
    bq, bkv = blocks
    h = heads_for(shape)
    combos = [
        [h["causal"], h["local"], h["chunked"], h["causal_or_local"]],
        [h["causal"]] * 4,
        [h["numpy_random"], h["causal"], h["local_and_chunked"]],
        [h["local_offset"], h["full"]],
    ]
    for masks in combos:
        mh = M.MultiHeadMask(masks)
        want = maskinfo_counts(mh, bq, bkv)
        got = tpusim_counts(mh, bq, bkv)
        assert got == want, f"{[type(m).__name__ for m in masks]} {shape} at {bq}x{bkv}: tpusim {got}, JAX {want}"


def test_simulated_tiles_are_the_maskinfo_totals():
    # The report's tile counts (over heads) are the per-head MaskInfo counts summed.
    shape = (2048, 2048)
    h = heads_for(shape)
    mh = M.MultiHeadMask([h["causal"], h["local"], h["chunked"], h["causal_or_local"]])
    want = np.sum(maskinfo_counts(mh, 256, 512), axis=0).tolist()
    r = tpusim.simulate(mask=mh, block_q=256, block_kv=512)
    t = r.tiles
    assert [t["empty"], t["partial"], t["full"]] == want
    assert r.to_dict()["job"]["workload"]["q_heads"] == 4  # heads taken from the MultiHeadMask
