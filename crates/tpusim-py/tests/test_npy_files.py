"""`--mask file:PATH.npy` / `.npz` on the command line: dense masks and block maps written by
NumPy mean what the equivalent grammar means, and bad files are errors that say what to fix."""

import json

import numpy as np
import pytest

from conftest import run_cli, run_json

Q = 2048
I, K = np.arange(Q)[:, None], np.arange(Q)[None, :]
BAND = (np.abs(I - K) <= 300) | (K < 100)
COMMON = ["--heads", 2, "--seq-len", Q, "--block-q", 256, "--block-kv", 512, "--mask-source", "loaded"]


def numbers(r):
    return r["latency_ms"], r["tiles"], r["pair_density"], r["hbm_bytes"], r["flops"]


@pytest.fixture(scope="module")
def grammar():
    return numbers(run_json(*COMMON, "--mask", "band:300+sink:100"))


@pytest.mark.parametrize("kind", ["npy", "npy-fortran", "npy-uint8", "npz-stored", "npz-compressed", "npz-named"])
def test_dense_files_equal_the_grammar(tmp_path, grammar, kind):
    p = tmp_path / ("m.npy" if kind.startswith("npy") else "m.npz")
    if kind == "npy":
        np.save(p, BAND)
    elif kind == "npy-fortran":
        np.save(p, np.asfortranarray(BAND))
    elif kind == "npy-uint8":
        np.save(p, BAND.astype(np.uint8) * 7)  # any non-zero byte is kept
    elif kind == "npz-stored":
        np.savez(p, BAND)
    elif kind == "npz-compressed":
        np.savez_compressed(p, BAND)
    else:
        np.savez(p, mask=BAND, note=np.arange(3))
    assert numbers(run_json(*COMMON, "--mask", f"file:{p}")) == grammar


def test_per_head_dense_file(tmp_path):
    p = tmp_path / "h.npy"
    np.save(p, np.stack([BAND, I >= K]))
    got = numbers(run_json(*COMMON, "--mask", f"file:{p}"))
    assert got == numbers(run_json(*COMMON, "--mask", "per-head[band:300+sink:100;causal]"))


def test_dense_file_in_an_expression(tmp_path):
    p = tmp_path / "b.npy"
    np.save(p, BAND)
    got = numbers(run_json(*COMMON, "--mask", f"causal&(file:{p})"))
    assert got == numbers(run_json(*COMMON, "--mask", "causal&(band:300+sink:100)"))


def test_block_map_tiles_at_multiples_of_its_blocks(tmp_path):
    rng = np.random.default_rng(3)
    classes = rng.choice([0, 1, 2], size=(1, 8, 4), p=[0.4, 0.3, 0.3]).astype(np.int8)
    p = tmp_path / "map.npz"
    np.savez(p, block_mask=classes, q_len=Q, kv_len=Q, block_q=256, block_kv=512)
    r = run_json("--heads", 3, "--seq-len", Q, "--block-q", 512, "--block-kv", 512, "--mask", f"file:{p}")
    # Kernel tiles of 2 x 1 map blocks: empty iff both empty, full iff both full, else partial.
    c = classes[0].reshape(4, 2, 4)
    empty = int(((c == 0).all(axis=1)).sum())
    full = int(((c == 2).all(axis=1)).sum())
    assert (r["tiles"]["empty"], r["tiles"]["full"], r["tiles"]["partial"]) == (3 * empty, 3 * full, 3 * (16 - empty - full))
    _, err = run_cli("run", "--seq-len", Q, "--block-q", 128, "--block-kv", 512, "--mask", f"file:{p}", expect=2)
    assert "whole blocks" in err and "128 x 512" in err
    _, err = run_cli("run", "--seq-len", Q, "--mask", f"causal+(file:{p})", expect=2)
    assert "cannot be combined" in err


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: np.save(p, BAND.astype(np.float32)), "dtype '<f4'"),
        (lambda p: np.save(p, np.zeros(5, dtype=bool)), "shape [5]"),
        (lambda p: np.savez(p, a=BAND, b=BAND), "members a, b"),
        (lambda p: np.savez(p, block_mask=np.zeros((1, 8, 4), np.int8), q_len=Q, kv_len=Q, block_q=256), "missing member 'block_kv'"),
        (lambda p: np.savez(p, block_mask=np.full((1, 8, 4), 3, np.int8), q_len=Q, kv_len=Q, block_q=256, block_kv=512), "expected 0 (empty), 1 (partial) or 2 (full)"),
        (lambda p: np.savez(p, block_mask=np.zeros((1, 4, 4), np.int8), q_len=Q, kv_len=Q, block_q=256, block_kv=512), "shrink_grid=False"),
        (
            lambda p: np.savez(p, block_mask=np.zeros((1, 8, 4), np.int8), q_len=Q, kv_len=Q, block_q=256, block_kv=512, mask_nxt=np.zeros(1)),
            "member 'mask_nxt': not a member of a block map",
        ),
        (lambda p: np.save(p, np.ones((Q, Q // 2), dtype=bool)), "the workload is 2048 x 2048"),
    ],
)
def test_bad_files_are_input_errors(tmp_path, make, message):
    p = tmp_path / ("bad.npz" if "savez" in make.__code__.co_names else "bad.npy")
    make(p)
    _, err = run_cli("run", "--seq-len", Q, "--mask", f"file:{p}", expect=2)
    assert message in err and str(p) in err, err


def test_missing_file_is_an_input_error(tmp_path):
    _, err = run_cli("run", "--seq-len", Q, "--mask", f"file:{tmp_path / 'nope.npy'}", expect=2)
    assert "cannot read" in err


def test_report_json_names_the_file(tmp_path):
    p = tmp_path / "b.npy"
    np.save(p, BAND)
    r = run_json(*COMMON, "--mask", f"file:{p}")
    assert r["job"]["workload"]["mask"] == f"file:{p}"
    assert json.loads(json.dumps(r["cost_estimate"]))["bytes_accessed"] == r["hbm_bytes"]
