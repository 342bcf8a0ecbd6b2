"""Decode through the Pallas IR path: JAX's paged_attention and ragged paged attention lowered
for TPU with the user's sequence lengths and page tables, simulated, and reported against the
HBM roofline; bytes checked against closed forms, bad input against our errors."""

import json

import numpy as np
import pytest

import tpusim
import tpusim.jax as tj
from conftest import run_cli


def _pa(batch=2, q_heads=8, kv_heads=1, d=128, pages=32, page_size=16, pages_per_seq=8):
    import jax
    import jax.numpy as jnp

    q = jax.ShapeDtypeStruct((batch, q_heads, d), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((kv_heads, pages, page_size, d), jnp.bfloat16)
    table = np.arange(batch * pages_per_seq, dtype=np.int32).reshape(batch, pages_per_seq) % pages
    return q, kv, table


def test_paged_attention_bytes_are_the_blocks_its_lengths_touch():
    q, kv, table = _pa()
    lengths = np.array([40, 128], np.int32)
    r = tj.paged_attention_step(q, kv, kv, lengths, table, pages_per_compute_block=2)
    page = 2 * 1 * 16 * 128 * 2  # K and V of one page, bytes
    # Closed form: whole compute blocks of 2 pages (32 tokens): ceil(40/32) + ceil(128/32) blocks.
    blocks = 2 + 4
    q_bytes = 2 * 8 * 128 * 2
    m_l = 2 * 2 * 8 * 128 * 4  # the kernel's m and l outputs (f32, lane-replicated)
    assert r.hbm_bytes == blocks * 2 * page + 2 * q_bytes + m_l
    assert r.pages_touched == 3 + 8
    assert r.must_move_bytes == 11 * page + 2 * q_bytes
    assert r.dmas["count"] == blocks * 2 * 2  # a DMA per page, K and V
    assert 0 < r.roofline_fraction < 1
    assert r.bound in ("engine pipeline", "DMA issue", "DMAs in flight")
    assert any("DMAs of" in w for w in r.below_roof)
    # The engine's bound names its largest term as a kernel engineer acts on it (issue 47, point
    # 10): a path that waits on copies says whether their round trips or their bytes bound it;
    # this step's path is the MXU's (its 1-row matmuls' weight loads), named with its share.
    engine = next(b for b in r.bounds if b["name"] == "engine pipeline")
    if r.kernel["bottleneck"] == "hbm":
        assert "bound by DMA round trips" in engine["reason"] or "bound by HBM bandwidth" in engine["reason"], engine
    elif r.kernel["bottleneck"] == "mxu":
        # Which part of the MXU's work: its weight-fold loads (a decode step's few query rows per
        # fold) or its result latency, as the run report names it; "bound by mxu" alone said less.
        assert "bound by the MXU's weight-fold loads (" in engine["reason"] or "bound by the MXU's result latency (" in engine["reason"], engine
        assert "% of its critical path)" in engine["reason"], engine
    else:
        assert f"bound by {r.kernel['bottleneck']} (" in engine["reason"] and "% of its critical path)" in engine["reason"], engine


def test_longer_sequences_move_more_and_get_closer_to_the_roof():
    q, kv, table = _pa(pages=64, pages_per_seq=32)
    short = tj.paged_attention_step(q, kv, kv, np.array([16, 16], np.int32), table, pages_per_compute_block=4)
    long = tj.paged_attention_step(q, kv, kv, np.array([512, 512], np.int32), table, pages_per_compute_block=4)
    assert long.hbm_bytes > short.hbm_bytes
    assert long.latency_ms > short.latency_ms
    assert long.roofline_fraction > short.roofline_fraction


def test_ragged_paged_attention_decode_step():
    import jax
    import jax.numpy as jnp

    q = jax.ShapeDtypeStruct((8, 8, 128), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((64, 16, 2, 128), jnp.bfloat16)
    kv_lens = np.array([100, 37, 128, 5], np.int32)
    table = np.arange(32, dtype=np.int32).reshape(4, 8)
    cu = np.array([0, 1, 2, 3, 4], np.int32)
    r = tj.ragged_paged_attention_step(q, kv, kv_lens, table, cu, np.array([4], np.int32), num_kv_pages_per_block=4, num_queries_per_block=8)
    page = 16 * 2 * 128 * 2
    # The kernel fetches whole blocks of 4 pages: ceil(len / 64) blocks per sequence.
    blocks = 2 + 1 + 2 + 1
    assert r.hbm_bytes == blocks * 4 * page + 2 * 8 * 8 * 128 * 2
    assert r.pages_touched == 7 + 3 + 8 + 1
    assert 0 < r.roofline_fraction < 1


def test_missing_lengths_and_bad_page_tables_are_errors(tmp_path):
    import jax
    import jax.numpy as jnp

    q, kv, table = _pa()
    with pytest.raises(tj.InputError, match="lengths"):
        tj.paged_attention_step(q, kv, kv, jax.ShapeDtypeStruct((2,), jnp.int32), table, pages_per_compute_block=2)
    bad = table.copy()
    bad[1, 0] = 99
    with pytest.raises(tj.InputError, match="out of range"):
        tj.paged_attention_step(q, kv, kv, np.array([40, 128], np.int32), bad, pages_per_compute_block=2)
    # Lengths below 0 or beyond the page table's row (8 pages of 16 tokens) are named.
    with pytest.raises(tj.InputError, match=r"lengths\[0\] = -5: expected a whole number of tokens from 0"):
        tj.paged_attention_step(q, kv, kv, np.array([-5, 128], np.int32), table, pages_per_compute_block=2)
    with pytest.raises(tj.InputError, match=r"lengths\[1\] = 1000000: expected at most 128 tokens \(the page table holds 8 pages of 16"):
        tj.paged_attention_step(q, kv, kv, np.array([40, 10**6], np.int32), table, pages_per_compute_block=2)
    with pytest.raises(tj.InputError, match="whole numbers of tokens"):
        tj.paged_attention_step(q, kv, kv, np.array([40.5, 128.0]), table, pages_per_compute_block=2)
    # The CLI: a description whose lengths are a runtime input, given with --runtime.
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

    def step(q, k_pages, v_pages, lengths, page_indices):
        return paged_attention(q, k_pages, v_pages, lengths, page_indices, pages_per_compute_block=2)

    path = tj.describe(step, q, kv, kv, jax.ShapeDtypeStruct((2,), jnp.int32), table, path=tmp_path / "pa.json")[0]
    d = json.loads(open(path).read())
    assert {"runtime": "lengths"} in [r.get("values") for r in d["refs"]]
    _, err = run_cli("run", "--kernel-ir", path, expect=2)
    assert "`lengths`" in err and "--runtime lengths=FILE.npy" in err, err
    np.save(tmp_path / "lengths.npy", np.array([40, 128], np.int32))
    out, _ = run_cli("run", "--kernel-ir", path, "--runtime", f"lengths={tmp_path / 'lengths.npy'}", "--format", "json")
    assert json.loads(out)["hbm_bytes"] == tj.paged_attention_step(q, kv, kv, np.array([40, 128], np.int32), table, pages_per_compute_block=2).hbm_bytes
    _, err = run_cli("run", "--kernel-ir", path, "--runtime", f"lens={tmp_path / 'lengths.npy'}", expect=2)
    assert "runtime operands `lengths`" in err, err
    # A mistyped name is named as such (with the name it is near), before its file is read.
    _, err = run_cli("run", "--kernel-ir", path, "--runtime", f"lenghts={tmp_path / 'no-such.npy'}", expect=2)
    assert "did you mean `lengths`?" in err and "no-such.npy" not in err, err
    # Malformed values say what is missing; a kernel or operand name that spells a job field
    # (`kernel`, `mask`) is not rewritten as a flag.
    for value, says in [("=x.npy", "name before '=' is empty"), ("lengths=", "no file after '='"), ("lengths", "(no '=')"),
                        (f"lengths={tmp_path / 'lengths.npy'},b=y.npy", "repeat --runtime for each operand"), ("kernel=x.npy", "runtime operands `lengths`")]:
        _, err = run_cli("run", "--kernel-ir", path, "--runtime", value, expect=2)
        assert says in err and "--kernel " not in err, (value, err)


def test_decode_sweep_relowers_per_point(tmp_path):
    q, kv, table = _pa(pages=64, pages_per_seq=16)
    lengths = np.array([200, 256], np.int32)

    def step(pages_per_block):
        return tj.paged_attention_step(q, kv, kv, lengths, table, pages_per_compute_block=pages_per_block)

    rows = tj.decode_sweep(step, [{"pages_per_block": p} for p in (1, 2, 4, 3)], path=tmp_path / "s.csv")
    assert [r["error"] == "" for r in rows] == [True, True, True, False]  # 3 does not divide 16 pages
    assert "pages_per_compute_block" in rows[3]["error"] or "divisible" in rows[3]["error"]
    # Bigger blocks round the lengths up to more pages.
    assert rows[0]["hbm_bytes"] <= rows[1]["hbm_bytes"] <= rows[2]["hbm_bytes"]
    first, header = (tmp_path / "s.csv").read_text().splitlines()[:2]
    assert first.startswith("# tpusim output: tpusim.jax.decode_sweep (tpusim ") and header.startswith("pages_per_block,")
    # A point make_step itself rejects (an unknown keyword: TypeError) is a row with its error;
    # the points done before it are kept and written (they were all lost).
    rows = tj.decode_sweep(step, [{"pages_per_block": 2}, {"pages_per_block": 2, "bogus": 1}], path=tmp_path / "t.csv")
    assert rows[0]["error"] == "" and rows[1]["error"].startswith("TypeError: ") and "bogus" in rows[1]["error"], rows
    assert len((tmp_path / "t.csv").read_text().splitlines()) == 4
    with pytest.raises(tpusim.InputError, match=r"points\[1\] = 3: each point is a dict"):
        tj.decode_sweep(step, [{"pages_per_block": 2}, 3])


def test_readme_decode_example_runs(root, capsys):
    text = (root / "README.md").read_text()
    section = text.split("## Decode: paged attention against the HBM roofline", 1)[1]
    code = section.split("```python", 1)[1].split("```", 1)[0]
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)
    r = scope["r"]
    lengths = scope["lengths"]
    page = 2 * 8 * 32 * 128 * 2
    assert r.pages_touched == sum(-(-int(n) // 32) for n in lengths)
    assert r.must_move_bytes == r.pages_touched * page + 2 * 8 * 32 * 128 * 2
    assert r.hbm_bytes >= r.must_move_bytes
    assert 0 < r.roofline_fraction < 1
    assert "roofline" in capsys.readouterr().out
