"""tpusim.simulate and the command line give the same numbers; masks, block sizes and errors from
Python mean what the command line's flags mean."""

import json
import re

import numpy as np
import pytest

import tpusim
from conftest import run_cli, run_json

SPARSE = dict(heads=10, seq_len=75600, mask="band:15000+sink:3600", traversal="compact", masking="partial", block_q=3328, block_kv=1536)


def flags(d):
    out = []
    for k, v in d.items():
        out += [f"--{k.replace('_', '-')}", str(v)]
    return out


def test_video_case_dense_matches_the_cli():
    # The built-in default case: Wan 2.1 720p, dense Splash on v6e.
    # With no job keyword, the built-in case study (traces/video-720p-dense.toml), as `tpusim run`
    # with no job flag; its measured row found by the lookup, not typed.
    py = tpusim.simulate().to_dict()
    cli = run_json()
    py_notes, cli_notes = py.pop("notes"), cli.pop("notes")
    assert py == cli
    assert len(py_notes) == len(cli_notes)  # the same notes, settings named each front end's way
    assert py["latency_ms"] > 0 and py["job"]["workload"]["q_len"] == 75600
    assert py["job"]["config"]["block_q"] == 3024 and py["measured"]["id"] == "VD-B0"
    # JAX's Splash masks the padded kv tiles (its masking default, all): no masking note.
    assert not any("masking" in n for n in py_notes), py_notes
    # The case study's job with masking none typed: the note names the keyword.
    case = dict(kernel="splash", heads=10, seq_len=75600, head_dim=128, block_q=3024, block_kv=2048, block_kv_compute=1024)
    typed = tpusim.simulate(masking="none", **case).notes
    assert any("masking" in n and "250 partial tiles" in n for n in typed), typed


def test_video_case_sparse_matches_the_cli():
    r = tpusim.simulate(**SPARSE)
    cli = run_json(*flags(SPARSE))
    assert r.to_dict() == cli
    assert r.latency_ms == cli["latency_ms"] and r.tiles == cli["tiles"]
    # Every report field reads as an attribute, with the CLI's value; the sparse kernel beats dense.
    assert r.speedup_vs_dense == cli["speedup_vs_dense"] and r.speedup_vs_dense > 1.0


def blocky_map(nq, nk, heads=1, seed=0):
    rng = np.random.default_rng(seed)
    classes = rng.choice([0, 1, 2], size=(heads, nq, nk), p=[0.5, 0.2, 0.3]).astype(np.int8)
    classes[:, np.arange(nq), np.arange(nq) % nk] = 1  # every row has a block
    return classes


def test_npz_block_map_written_from_numpy_matches_the_cli(tmp_path):
    path = tmp_path / "map.npz"
    np.savez(path, block_mask=blocky_map(8, 8, heads=2), q_len=4096, kv_len=4096, block_q=512, block_kv=512)
    job = dict(heads=2, seq_len=4096, block_q=1024, block_kv=512, mask=f"file:{path}")
    py = tpusim.simulate(**job)
    assert py.to_dict() == run_json(*flags(job))
    # The map's classes give the tiles at a tiling of whole map blocks: heads summed.
    assert py.tiles["total"] == 2 * 4 * 8
    assert any("half kept" in n for n in py.notes)  # partial elements unknown: said so


def test_npz_block_map_with_element_masks_equals_the_dense_mask_and_the_grammar(tmp_path):
    q = 2048
    i, k = np.arange(q)[:, None], np.arange(q)[None, :]
    dense = (np.abs(i - k) <= 300) | (k < 100)
    bq = 256
    blocks = dense.reshape(q // bq, bq, q // bq, bq).transpose(0, 2, 1, 3)
    kept = blocks.sum(axis=(2, 3))
    classes = np.where(kept == 0, 0, np.where(kept == bq * bq, 2, 1)).astype(np.int8)[None]
    partial = [(a, b) for a in range(q // bq) for b in range(q // bq) if classes[0, a, b] == 1]
    mask_next = np.zeros_like(classes, dtype=np.int32)
    for n, (a, b) in enumerate(partial):
        mask_next[0, a, b] = n
    pmb = np.stack([blocks[a, b] for a, b in partial])
    path = tmp_path / "exact.npz"
    np.savez_compressed(path, block_mask=classes, partial_mask_blocks=pmb, mask_next=mask_next, q_len=q, kv_len=q, block_q=bq, block_kv=bq)
    common = dict(heads=4, seq_len=q, block_q=512, block_kv=512, traversal="compact", masking="partial", mask_source="loaded")
    from_map = tpusim.simulate(mask=f"file:{path}", **common)
    from_array = tpusim.simulate(mask=dense, **{k: v for k, v in common.items() if k != "seq_len"})
    from_text = tpusim.simulate(mask="band:300+sink:100", **common)
    for r in (from_map, from_array):
        assert r.tiles == from_text.tiles
        assert r.latency_ms == from_text.latency_ms
        assert r.pair_density == from_text.pair_density
    assert from_map.to_dict() == run_json(*flags({**common, "mask": f"file:{path}"}))


def test_block_map_from_splash_maskinfo_equals_the_grammar(tmp_path):
    # The recipe of MASK_FILES.md: Splash's own MaskInfo saved as a block map.
    M = pytest.importorskip("jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_mask")
    mi = pytest.importorskip("jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_mask_info")
    q = 2048
    i, k = np.arange(q)[:, None], np.arange(q)[None, :]
    mh = M.MultiHeadMask([M.NumpyMask((np.abs(i - k) <= 300) | (k < 100)), M.NumpyMask(i >= k)])
    info, _ = mi.process_mask(mh, (256, 256), shrink_grid=False, downcast_smem_data=False)
    path = tmp_path / "maskinfo.npz"
    np.savez(path, block_mask=info.block_mask, q_len=q, kv_len=q, block_q=256, block_kv=256,
             partial_mask_blocks=info.partial_mask_blocks, mask_next=info.mask_next)
    job = dict(heads=2, seq_len=q, block_q=512, block_kv=1024, mask_source="loaded")
    a = tpusim.simulate(mask=f"file:{path}", **job)
    b = tpusim.simulate(mask="per-head[band:300+sink:100;causal]", **job)
    assert (a.tiles, a.latency_ms, a.pair_density) == (b.tiles, b.latency_ms, b.pair_density)


def test_splash_mask_object_gives_the_tiles_of_the_equivalent_text():
    M = pytest.importorskip("jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_mask")
    shape = (4096, 4096)
    cases = [
        (M.CausalMask(shape), "causal"),
        (M.LocalMask(shape, (512, 0), 0), "local:512,0"),
        (M.ChunkedCausalMask(shape, 1000), "chunked:1000"),
        (M.LogicalOr(M.LocalMask(shape, (256, 0), 0), M.CausalMask(shape)), "local:256,0+causal"),
        (M.MultiHeadMask([M.CausalMask(shape), M.LocalMask(shape, (128, 128), 0)]), "per-head[causal;local:128,128]"),
    ]
    for obj, text in cases:
        assert tpusim.mask_text(obj) == text
        heads = 2 if text.startswith("per-head") else 8
        a = tpusim.simulate(mask=obj, heads=heads, block_q=512, block_kv=1024)
        b = tpusim.simulate(mask=text, heads=heads, seq_len=4096, block_q=512, block_kv=1024)
        assert a.to_dict() == b.to_dict(), text
        c = run_json("--mask", text, "--heads", heads, "--seq-len", 4096, "--block-q", 512, "--block-kv", 1024)
        assert a.tiles == c["tiles"] and a.latency_ms == c["latency_ms"]


def test_offsets_translate_to_the_grammar():
    M = pytest.importorskip("jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_mask")
    assert tpusim.mask_text(M.LocalMask((1024, 1024), (256, 16), 64)) == "local:256,16@offset:64"
    assert tpusim.mask_text(M.CausalMask((1024, 2048), offset=1024)) == "causal@offset:1024"
    assert tpusim.mask_text(M.LocalMask((1024, 1024), (0, 8), -32)) == "local:0,8@offset:-32"
    # The same tiles as the CLI's spelling of the mask.
    a = tpusim.simulate(mask=M.CausalMask((1024, 2048), offset=1024), heads=2, block_q=256, block_kv=512)
    c = run_json("--mask", "causal@offset:1024", "--heads", 2, "--q-len", 1024, "--kv-len", 2048, "--block-q", 256, "--block-kv", 512)
    assert a.tiles == c["tiles"]
    with pytest.raises(tpusim.InputError, match="at least 0"):
        tpusim.mask_text(M.LocalMask((1024, 1024), (-1, 8), 0))


def test_numpy_arrays_are_masks_read_in_place():
    q = 2048
    i, k = np.arange(q)[:, None], np.arange(q)[None, :]
    band = (np.abs(i - k) <= 200) | (k < 64)
    text = tpusim.simulate(mask="band:200+sink:64", mask_source="loaded", heads=4, seq_len=q, block_q=256, block_kv=512)
    arr = tpusim.simulate(mask=band, heads=4, block_q=256, block_kv=512)
    assert (arr.tiles, arr.latency_ms, arr.pair_density) == (text.tiles, text.latency_ms, text.pair_density)
    # A strided view (every other column of a wider array) and Fortran order read the same.
    wide = np.zeros((q, 2 * q), dtype=bool)
    wide[:, ::2] = band
    assert tpusim.simulate(mask=wide[:, ::2], heads=4, block_q=256, block_kv=512).tiles == text.tiles
    assert tpusim.simulate(mask=np.asfortranarray(band), heads=4, block_q=256, block_kv=512).tiles == text.tiles
    # [heads, q, kv]: one mask per head.
    per = tpusim.simulate(mask=np.stack([band, i >= k]), block_q=256, block_kv=512, mask_source="loaded")
    want = tpusim.simulate(mask="per-head[band:200+sink:64;causal]", heads=2, seq_len=q, block_q=256, block_kv=512, mask_source="loaded")
    assert (per.tiles, per.latency_ms) == (want.tiles, want.latency_ms)
    with pytest.raises(tpusim.InputError, match="dtype float64"):
        tpusim.simulate(mask=band.astype(np.float64))
    with pytest.raises(tpusim.InputError, match=r"shape \(2048, 2048\) does not match"):
        tpusim.simulate(mask=band, seq_len=4096)


def test_block_sizes_objects_and_their_spellings():
    K = pytest.importorskip("jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_kernel")
    job = dict(heads=8, seq_len=4096, mask="causal")
    bs = K.BlockSizes(block_q=512, block_kv=1024, block_kv_compute=512)
    a = tpusim.simulate(block_sizes=bs, **job)
    b = tpusim.simulate(kernel="splash", block_q=512, block_kv=1024, block_kv_compute=512, **job)
    assert a.to_dict() == b.to_dict()  # a JAX BlockSizes means JAX's Splash
    # Backward blocks and the fused flag as BlockSizes spells them.
    bwd = K.BlockSizes(block_q=512, block_kv=512, block_kv_compute=512, block_q_dkv=256, block_kv_dkv=512, block_kv_dkv_compute=256, use_fused_bwd_kernel=True)
    r = tpusim.simulate(block_sizes=bwd, direction="bwd", **job)
    c = r.to_dict()["job"]["config"]
    assert (c["bwd"]["block_q_dkv"], c["bwd"]["block_kv_dkv_compute"], c["bwd"]["fused"]) == (256, 256, True)
    # tokamax's names: use_base2_exp and use_experimental_scheduler map to kernel options.
    t = tpusim.simulate(block_sizes={"block_q": 512, "block_kv": 512, "use_base2_exp": False, "use_experimental_scheduler": True}, **job)
    assert t.to_dict()["job"]["config"]["exp"] == "natural"
    with pytest.raises(tpusim.InputError, match="q_layout = SEQ_MINOR.*not modelled"):
        tpusim.simulate(block_sizes=K.BlockSizes(block_q=512, block_kv=512, q_layout=K.QKVLayout.SEQ_MINOR), **job)
    with pytest.raises(tpusim.InputError, match="unknown key 'blockq'"):
        tpusim.simulate(block_sizes={"blockq": 512}, **job)


def as_kwargs(cli_error):
    """The CLI's message with its flags (--kv-heads) named as keyword arguments (kv_heads)."""
    msg = cli_error.strip().removeprefix("error: ")
    return re.sub(r"--([a-z][a-z-]*)", lambda m: m.group(1).replace("-", "_"), msg)


def test_errors_carry_the_cli_messages():
    for flags_, kwargs in [
        (["--heads", 3, "--kv-heads", 2], dict(heads=3, kv_heads=2)),
        (["--seq-len", 4096, "--block-kv", 1000], dict(seq_len=4096, block_kv=1000)),
    ]:
        _, err = run_cli("run", *flags_, expect=2)
        with pytest.raises(tpusim.InputError) as e:
            tpusim.simulate(**kwargs)
        assert str(e.value) == as_kwargs(err), kwargs
    with pytest.raises(tpusim.InputError, match="hedas = 4: not a job keyword"):
        tpusim.simulate(hedas=4)
    assert issubclass(tpusim.InputError, ValueError)


def test_cost_estimate_fields():
    r = tpusim.simulate(heads=8, seq_len=4096, mask="causal", block_q=512, block_kv=512)
    assert r.cost_estimate == {"flops": round(r.flops), "transcendentals": round(r.transcendentals), "bytes_accessed": r.hbm_bytes}
    assert "pl.CostEstimate(flops=" in str(r)
    # A hand-modelled job has no declared estimate, and says why when asked for one.
    with pytest.raises(AttributeError, match="declared_cost_estimate': only a kernel read from its IR"):
        r.declared_cost_estimate
    with pytest.raises(AttributeError, match="^Report has no field 'no_such_field'$"):
        r.no_such_field
    with pytest.raises(AttributeError, match="^Report has no field 'latncy_ms': did you mean 'latency_ms'\\?$"):
        r.latncy_ms
    # A what-if chip has no measured row (the notes say which row the chip as built has).
    w = tpusim.simulate(set={"mxu.count": 4})
    with pytest.raises(AttributeError, match="'measured': no row of traces/measured/calibration.csv is this job on this chip model"):
        w.measured
    assert any("row VD-B0" in n for n in w.notes), w.notes


def test_a_kernel_that_declares_no_cost_estimate_says_so():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    import tpusim.jax as tj

    def copy(x):
        def body(x_ref, o_ref):
            o_ref[...] = x_ref[...]

        spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
        return pl.pallas_call(body, grid=(4,), in_specs=[spec], out_specs=spec, out_shape=jax.ShapeDtypeStruct((32, 128), jnp.float32))(x)

    call = tj.simulate(copy, jax.ShapeDtypeStruct((32, 128), jnp.float32), chip="v6e")
    # A call's report holds one Report per kernel, and says so when asked for a kernel's field.
    with pytest.raises(AttributeError, match=r"CallReport has no field 'bottleneck': it holds one Report per kernel .*report.kernels\[i\].bottleneck"):
        call.bottleneck
    with pytest.raises(AttributeError, match="CallReport has no field 'nonsense' \\(its fields: kernels"):
        call.nonsense
    r = call.kernels[0]
    assert r.cost_estimate["bytes_accessed"] == r.hbm_bytes
    with pytest.raises(AttributeError, match="declares no pl.CostEstimate"):
        r.declared_cost_estimate


def test_tune_prints_block_sizes_ready_to_paste():
    K = pytest.importorskip("jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_kernel")
    # A small search (options held fixed, few refined pairs) keeps the test fast.
    job = dict(heads=2, seq_len=2048, mask="causal", traversal="compact", masking="partial", mask_source="computed")
    t = tpusim.tune(top=3, refine=3, **job)
    best = t["top"][0]
    cfg = best["job"]["config"]
    # The text is the kernel's own config call: tokamax's SplashConfig, JAX Splash's BlockSizes.
    api = "SplashConfig" if cfg["kernel"] == "tokamax-splash" else "BlockSizes"
    assert best["block_sizes"].startswith(f"{api}(block_q="), best["block_sizes"]
    bs = K.BlockSizes(**best["block_sizes_kwargs"])  # the same kwargs construct JAX's BlockSizes
    again = tpusim.simulate(kernel=cfg["kernel"], block_sizes=bs, exp=cfg["exp"], **job)
    assert again.latency_ms == best["latency_ms"]
    out, _ = run_cli("tune", *flags(job), "--top", 3, "--refine", 3, "--block-sizes", "--no-progress")
    assert [line.split("  #")[0] for line in out.splitlines()] == [r["block_sizes"] for r in t["top"]]


def test_sweep_returns_rows_ready_for_a_dataframe():
    points = [{"block_q": b, "block_kv": 512} for b in (256, 512, 1024)]
    rows = tpusim.sweep(points, heads=4, seq_len=4096, mask="causal")
    assert [r["block_q"] for r in rows] == [256, 512, 1024]
    for p, r in zip(points, rows):
        assert r["latency_ms"] == tpusim.simulate(heads=4, seq_len=4096, mask="causal", **p).latency_ms
        assert r["tiles_partial"] > 0 and r["bottleneck"]
    # A point that does not run keeps its row with the reason, as `tpusim sweep`'s rows do; the
    # blocks a point left unset are the ones it ran with.
    ok, bad = tpusim.sweep([{"block_kv": 512}, {"block_kv": 100}], seq_len=4096)
    assert ok["error"] is None and ok["latency_ms"] > 0 and ok["block_q"] >= 128
    assert "block_kv = 100" in bad["error"] and "latency_ms" not in bad and bad["block_kv"] == 100
    # A design what-if (JAX's Splash has no compact traversal) is named, as `tpusim sweep`'s
    # design_whatif column names it; a kernel as written has None (a fresh user found no mark).
    full, compact = tpusim.sweep([{"traversal": "full-grid"}, {"traversal": "compact"}], kernel="splash", seq_len=4096, mask="causal")
    assert ok["design_whatif"] is None and full["design_whatif"] is None, (ok, full)
    assert compact["design_whatif"].startswith("traversal compact (splash runs full-grid"), compact["design_whatif"]
    # Malformed fields still stop the sweep before anything runs, naming the point.
    with pytest.raises(tpusim.InputError, match=r"points\[1\]: block_kv = '100'"):
        tpusim.sweep([{"block_kv": 512}, {"block_kv": "100"}], seq_len=4096)


def test_chip_models_and_overrides():
    base = tpusim.chip("v6e")
    fast = tpusim.chip("v6e", {"hbm.bandwidth_gb_per_s": 3276})
    assert fast["hbm"]["bandwidth_gb_per_s"]["value"] == 3276
    assert base["hbm"]["bandwidth_gb_per_s"]["value"] != 3276
    out, _ = run_cli("chip", "show", "v6e", "--format", "json")
    assert json.loads(out) == base
    with pytest.raises(tpusim.InputError, match="v9z"):
        tpusim.chip("v9z")
    # A bad override is named by Python's keyword, not the command line's flag (a fresh user's
    # finding: "chip model --set: field ...").
    with pytest.raises(tpusim.InputError, match=r"^set: field 'mxu.count' = 0: expected a whole number from 1 to 64$"):
        tpusim.simulate(set={"mxu.count": 0})


def test_reports_say_how_sure_they_are_and_time_host_timed_calls():
    r = tpusim.simulate(heads=8, seq_len=4096, mask="causal", block_q=512, block_kv=512, scope="op")
    assert r.band["covered"] and r.band["n"] >= 5
    assert r.band["text"].startswith("v6e tokamax-splash fwd op: median ")
    call = tpusim.simulate(chip="v5p", kernel="splash", heads=8, seq_len=2048, block_q=512, block_kv=512,
                           scope="call", input_layout="bshd")
    assert not call.band["covered"] and "median_abs_error" not in call.band
    assert call.band["text"].startswith("not covered by measurements: chip v5p, family splash")
    assert call.host_ms == pytest.approx(0.424)
    assert call.to_dict() == run_json("--chip", "v5p", "--kernel", "splash", "--heads", "8", "--seq-len", "2048", "--block-q", "512",
                                      "--block-kv", "512", "--scope", "call", "--input-layout", "bshd")


def test_bound_by_is_the_largest_what_if_gain_and_matches_a_set_run():
    r = tpusim.simulate(
        kernel="sparse-splash", mask="band:15000+sink:3600", traversal="compact", masking="partial",
        block_q=3328, block_kv=1536)
    table = r.what_if_2x
    units = ["mxu", "vpu", "eup", "xlu", "hbm", "step_control"]
    assert [w["unit"] for w in table] == units + ["dma_latency", "dma_issue", "dmas_in_flight"]
    best = max((w for w in table if w["unit"] in units), key=lambda w: w["gain"])
    assert r.bottleneck == best["unit"] and all(w["gain"] >= 0 for w in table)
    assert isinstance(r.co_bound, list)
    # The entry equals a run with the same overrides.
    again = tpusim.simulate(kernel="sparse-splash", mask="band:15000+sink:3600", traversal="compact",
                            masking="partial", block_q=3328, block_kv=1536, set=best["set"])
    assert again.latency_ms == best["latency_ms"]


def test_a_job_keyword_starts_from_the_family_defaults_and_says_so():
    # simulate() runs the case study; simulate(heads=10), the case study's own head count, runs
    # tokamax's Splash at its 128 blocks: its notes say why, as `tpusim run --heads 10` does
    # (a fresh user saw 75 ms become 1597 ms without a word).
    case = tpusim.simulate()
    assert not any("kernel family's defaults" in n for n in case.notes), case.notes
    r = tpusim.simulate(heads=10, seq_len=4096)
    note = next((n for n in r.notes if "starts from the kernel family's defaults" in n), None)
    assert note is not None, r.notes
    assert "block_q" in note and "--block-q" not in note and "tune with the same fields" in note, note
    given = tpusim.simulate(heads=10, seq_len=4096, block_q=512, block_kv=512)
    assert not any("kernel family's defaults" in n for n in given.notes), given.notes


def test_tune_marks_the_configurations_the_library_cannot_run():
    # Ranks that differ only in an option tokamax has no setting for (masking all) carry
    # `design_whatif`, as the CLI stars them: their block_sizes would run the other option.
    r = tpusim.tune(heads=8, seq_len=8192, mask="causal", top=4)
    marks = [t.get("design_whatif") for t in r["top"]]
    assert any(m and "masking all" in m for m in marks), marks
    plain = [t for t in r["top"] if "design_whatif" not in t]
    assert plain, marks


def test_a_per_head_mask_of_another_head_count_is_refused():
    # Three alike masks for four heads ran as `causal` on four heads (three different ones were
    # refused): both are refused, naming the two counts.
    M = pytest.importorskip("jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_mask")
    shape = (1024, 1024)
    for masks in ([M.CausalMask(shape)] * 3, [M.CausalMask(shape), M.LocalMask(shape, (128, 128), 0), M.CausalMask(shape)]):
        with pytest.raises(tpusim.InputError, match=r"per-head mask of 3 heads for heads = 4"):
            tpusim.simulate(mask=M.MultiHeadMask(masks), heads=4)
    assert tpusim.simulate(mask=M.MultiHeadMask([M.CausalMask(shape)] * 4), heads=4).latency_ms > 0
