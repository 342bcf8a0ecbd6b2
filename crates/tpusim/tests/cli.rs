//! End-to-end tests of `tpusim run` and `tpusim chip` through the built binary: explanations,
//! invariants and bad input. (Accuracy against the published measurements is tested on the
//! calibration CSV itself, in `tpusim-calib/tests/accuracy.rs`.)

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tpusim"))
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `tpusim run ARGS --format json`, panicking with stderr on failure.
fn run_json(args: &[&str]) -> Value {
    let out = bin().arg("run").args(args).args(["--format", "json"]).output().unwrap();
    assert!(out.status.success(), "tpusim run {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Runs `tpusim ARGS`, expecting exit code 2 and a one-line error containing every `needle`.
fn expect_input_error(args: &[&str], needles: &[&str]) {
    let out = bin().args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "tpusim {args:?} should exit 2; stderr: {err}");
    for n in needles {
        assert!(err.contains(n), "tpusim {args:?}: error should mention {n:?}: {err}");
    }
    assert!(out.stdout.is_empty(), "nothing on stdout on error");
}

#[test]
fn head_dim_128_is_not_hbm_bound_and_mfu_rises_with_head_dim() {
    let base = ["--chip", "v6e", "--seq-len", "16384", "--block-q", "2048", "--block-kv", "2048", "--block-kv-compute", "512"];
    let mut mfu = Vec::new();
    for (d, h) in [("64", "32"), ("128", "16"), ("256", "8")] {
        let mut a = base.to_vec();
        a.extend(["--head-dim", d, "--heads", h]);
        let j = run_json(&a);
        if d == "128" {
            assert_ne!(j["bottleneck"], "hbm", "d=128 should not be HBM-bound");
        }
        mfu.push(j["mfu"].as_f64().unwrap());
    }
    assert!(mfu[0] < mfu[1] && mfu[1] < mfu[2], "MFU should rise with head_dim: {mfu:?}");
}

/// One padding rule in every figure (`tpusim_model::copies`): on chip a head_dim below 128 runs
/// as 128 lanes, so executed FLOPs equal head_dim 128's while useful FLOPs (and MFU, which
/// counts them) scale with head_dim; in HBM it is not padded, so bytes scale with it too, and
/// only an edge block's whole tiles make moved bytes exceed useful ones. The text report says
/// how much is padding.
#[test]
fn head_dim_below_128_pads_to_128_lanes_in_every_figure() {
    let base = ["--heads", "4", "--seq-len", "4096", "--block-q", "1024", "--block-kv", "1024", "--block-kv-compute", "512"];
    let at = |d: &str| {
        let mut a = base.to_vec();
        a.extend(["--head-dim", d]);
        run_json(&a)
    };
    let (full, half, seven) = (at("128"), at("64"), at("7"));
    let f = |j: &Value, k: &str| j[k].as_f64().unwrap_or_else(|| panic!("{k} in {j}"));
    assert_eq!(f(&full, "useful_flops"), f(&full, "flops"));
    for (j, d) in [(&half, 64.0), (&seven, 7.0)] {
        let r = d / 128.0;
        assert_eq!(f(j, "flops"), f(&full, "flops"), "executed FLOPs at d {d}");
        assert!((f(j, "useful_flops") / f(&full, "flops") - r).abs() < 1e-9, "useful FLOPs at d {d}");
        let mfu = f(j, "mfu") * f(j, "latency_ms") / (f(&full, "mfu") * f(&full, "latency_ms"));
        assert!((mfu - r).abs() < 1e-9, "MFU at d {d} counts useful FLOPs: {mfu}");
        assert_eq!(f(j, "useful_hbm_bytes"), f(j, "hbm_bytes"), "no edge block at d {d}");
        // q, k, v and o all scale with head_dim; the segment ids and residuals do not.
        assert!(f(j, "hbm_bytes") < f(&full, "hbm_bytes") * (r + 0.1), "HBM bytes at d {d}");
    }
    let out = bin().args(["run", "--head-dim", "64"]).args(base).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("useful, 50.0% of it masked pairs, padding or recomputation)"), "{text}");
    // The rule is stated in the run's own notes (a fresh user found it only in the README).
    assert!(text.contains("run head_dim 64 as 128 lanes") && text.contains("HBM copies move the operands' own lanes"), "{text}");
    assert!(!String::from_utf8_lossy(&bin().args(["run", "--head-dim", "128"]).args(base).output().unwrap().stdout).contains("128-lane tiles"));
    // An edge block: 4000 tokens in 1024-row blocks move whole tiles past the array's end.
    let mut a = base.to_vec();
    a[3] = "4000";
    let edge = run_json(&a);
    assert!(f(&edge, "hbm_bytes") >= f(&edge, "useful_hbm_bytes"));
}

#[test]
fn busy_time_never_exceeds_latency_and_critical_path_sums_to_it() {
    let j = run_json(&["--heads", "4", "--seq-len", "8192", "--mask", "causal", "--traversal", "compact", "--masking", "partial"]);
    let lat = j["latency_ms"].as_f64().unwrap();
    for (k, v) in j["utilization"].as_object().unwrap() {
        let u = v.as_f64().unwrap();
        assert!((0.0..=1.0 + 1e-9).contains(&u), "{k} utilisation {u}");
    }
    let crit: f64 = j["critical_path_ms"].as_object().unwrap().values().map(|v| v.as_f64().unwrap()).sum();
    assert!((crit / lat - 1.0).abs() < 1e-6, "{crit} vs {lat}");
}

#[test]
fn padding_is_reported_and_costs_like_real_tokens() {
    let j = run_json(&["--heads", "1", "--seq-len", "1000", "--block-q", "512", "--block-kv", "512"]);
    let padded = &j["padded"];
    assert_eq!(padded[0][2], 1024);
    assert_eq!(padded[1][2], 1024);
    // Executed FLOPs cover the padded square: 4 x 1024^2 x 128.
    assert_eq!(j["flops"].as_f64().unwrap(), 4.0 * 1024.0 * 1024.0 * 128.0);
}

#[test]
fn gqa_shares_kv_blocks_and_reads_less() {
    let a = run_json(&["--heads", "8", "--seq-len", "4096", "--block-kv", "4096", "--block-q", "1024"]);
    let b = run_json(&["--heads", "8", "--kv-heads", "1", "--seq-len", "4096", "--block-kv", "4096", "--block-q", "1024"]);
    assert!(b["hbm_bytes"].as_u64().unwrap() < a["hbm_bytes"].as_u64().unwrap());
}

#[test]
fn chip_show_prints_units_and_sources() {
    let out = bin().args(["chip", "show", "v6e"]).output().unwrap();
    assert!(out.status.success());
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.contains("hbm.bandwidth_gb_per_s") && s.contains("GB/s") && s.contains("cloud.google.com/tpu/docs/v6e"), "{s}");
    assert!(s.contains("FITTED to [") && s.contains("VD-B0"), "{s}");
    // A parameter no row of this chip fits says so once, not "fitted" then "not fitted".
    for line in s.lines().filter(|l| l.contains("Not fitted")) {
        assert!(line.contains("NOT FITTED") && !line.contains("FITTED elsewhere"), "{line}");
    }
}

#[test]
fn bad_input_exits_2_naming_the_field() {
    expect_input_error(&["run", "--chip", "v9"], &["unknown chip", "v9", "v6e"]);
    expect_input_error(&["run", "--heads", "0"], &["--heads", "0"]);
    expect_input_error(&["run", "--seq-len", "0"], &["--seq-len", "0"]);
    expect_input_error(&["run", "--head-dim", "0"], &["--head-dim"]);
    expect_input_error(&["run", "--heads", "10", "--kv-heads", "3"], &["--kv-heads", "3", "divide"]);
    expect_input_error(&["run", "--block-kv", "2000"], &["--block-kv", "2000", "128"]);
    expect_input_error(&["run", "--block-q", "3020"], &["--block-q", "3020", "8"]);
    expect_input_error(&["run", "--block-kv", "2048", "--block-kv-compute", "768"], &["--block-kv-compute", "768", "divide"]);
    expect_input_error(&["run", "--block-q", "4096", "--block-kv", "8192", "--block-kv-compute", "8192"], &["VMEM", "bytes", "limit"]);
    expect_input_error(&["run", "--vmem-limit-mib", "0"], &["--vmem-limit-mib"]);
    expect_input_error(&["run", "--set", "mxu.count=0"], &["mxu.count", "0"]);
    expect_input_error(&["run", "--set", "hbm.bogus=1"], &["bogus", "bandwidth_gb_per_s"]);
    expect_input_error(&["run", "--mask", "band:-5"], &["band", "non-negative"]);
    expect_input_error(&["run", "--mask", "diagonal"], &["diagonal"]);
    expect_input_error(&["run", "--kernel", "pallas-matmul", "--m", "64"], &["--m, --n and --k"]);
    expect_input_error(
        &["run", "--kernel", "pallas-matmul", "--m", "1024", "--n", "1024", "--k", "1024", "--block-n", "100"],
        &["--block-n", "100"],
    );
    // Matmul operands larger than the device's HBM (both matmul kernels): 6 TB of bf16.
    for kernel in ["pallas-matmul", "xla-matmul"] {
        expect_input_error(
            &["run", "--kernel", kernel, "--m", "1000000", "--n", "1000000", "--k", "1000000"],
            &["the tensors need 6000000000000 bytes of HBM", "(32 GiB)", "use smaller --m, --n or --k"],
        );
    }
    expect_input_error(&["run", "--traversal", "zigzag"], &["zigzag"]);
    expect_input_error(&["run", "--seq-len", "4096", "--mask", "sink:0"], &["--mask", "sink:0", "no (q, kv) pair"]);
    // Tensors larger than the device's HBM.
    expect_input_error(
        &[
            "run",
            "--batch",
            "100000",
            "--heads",
            "1000",
            "--kv-heads",
            "250",
            "--seq-len",
            "4096",
            "--block-kv",
            "4096",
            "--block-q",
            "256",
        ],
        &["HBM", "bytes", "--batch"],
    );
    expect_input_error(&["run", "--q-len", "4096"], &["--q-len", "--kv-len"]);
    let deep = format!("{}causal{}", "(".repeat(5000), ")".repeat(5000));
    expect_input_error(&["run", "--seq-len", "4096", "--mask", &deep], &["nests at most"]);
    expect_input_error(&["run", "--seq-len", "1000000000"], &["score pairs"]);
    // Just over the limit: the count and the limit differ as printed (both exact).
    expect_input_error(&["run", "--seq-len", "134217728", "--heads", "1"], &["= 18014398509481984 score pairs, 1 more than the at most 18014398509481983", "shorter sequence, fewer heads or a smaller batch"]);
    // A flag without its value says so.
    expect_input_error(&["run", "--heads"], &["--heads needs a value"]);
    expect_input_error(&["run", "--heads", "4294967295", "--seq-len", "128"], &["--heads", "from 1 to 1048576"]);
    // Outputs are never written through devices, directories or links.
    let csv = root().join("traces/measured/calibration.csv");
    expect_input_error(&["calibrate", csv.to_str().unwrap(), "--chip", "v6e", "--out", "/dev/null"], &["/dev/null", "not a regular file"]);
    expect_input_error(&["run", "--seq-len", "2048", "--timeline", "/dev/null"], &["/dev/null", "not a regular file"]);
    let dir = std::env::temp_dir().join(format!("tpusim-cli-out-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("taken.png")).unwrap();
    let trace = root().join("plots/jobs/dense.toml");
    let taken = dir.join("taken.png");
    expect_input_error(
        &["plot", "roofline", "--trace", trace.to_str().unwrap(), "--out", taken.to_str().unwrap()],
        &["not a regular file"],
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn malformed_and_unknown_chip_toml_are_errors() {
    let dir = std::env::temp_dir().join(format!("tpusim-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "name = \"x\"\n[mxu\n").unwrap();
    expect_input_error(&["run", "--chip", bad.to_str().unwrap()], &["bad.toml"]);
    let text = std::fs::read_to_string(root().join("models/v6e.toml")).unwrap();
    let unknown = dir.join("unknown.toml");
    std::fs::write(&unknown, text.replace("[vmem]", "[vmem]\nwidth_lanes = { value = 3, source = \"x\" }")).unwrap();
    expect_input_error(&["run", "--chip", unknown.to_str().unwrap()], &["width_lanes"]);
    let missing = dir.join("missing.toml");
    expect_input_error(&["run", "--chip", missing.to_str().unwrap()], &["missing.toml"]);
    // An empty trace (or one of comments) is refused, not run as the family's defaults.
    let empty = dir.join("empty.toml");
    std::fs::write(&empty, "# nothing yet\n").unwrap();
    expect_input_error(&["run", "--trace", empty.to_str().unwrap()], &["empty.toml", "sets no job field"]);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn flags_at_their_default_values_change_nothing_and_trace_lengths_can_be_overridden() {
    // A job flag at its default value changes nothing against the family defaults (the run
    // with no job flag is the case study, tested in case_study_is_the_first_run).
    let a = run_json(&["--kernel", "tokamax-splash"]);
    let b = run_json(&["--heads", "10", "--batch", "1", "--head-dim", "128", "--seq-len", "75600"]);
    assert_eq!(a["latency_ms"], b["latency_ms"]);
    let trace = root().join("traces/llm-causal-16k.toml");
    let j = run_json(&["--trace", trace.to_str().unwrap(), "--q-len", "8192", "--kv-len", "8192"]);
    assert_eq!(j["job"]["workload"]["q_len"], 8192);
    assert_eq!(j["job"]["workload"]["mask"], "causal");
    // Every preset runs the family's default case (block_kv_compute follows its VMEM limit).
    for chip in ["v6e", "v5e", "v5p", "v4", "v7x"] {
        let j = run_json(&["--chip", chip, "--kernel", "tokamax-splash"]);
        assert!(j["latency_ms"].as_f64().unwrap() > 0.0, "{chip}");
    }
}

#[test]
fn identical_heads_fold_so_huge_batches_run_and_scale_linearly() {
    // 100 x 16 heads of 16384 causal tokens (3.4 GB per tensor) fit the 32 GiB of HBM.
    let many = run_json(&[
        "--batch",
        "100",
        "--heads",
        "16",
        "--seq-len",
        "16384",
        "--head-dim",
        "64",
        "--mask",
        "causal",
        "--traversal",
        "compact",
        "--masking",
        "partial",
    ]);
    let one = run_json(&[
        "--batch",
        "1",
        "--heads",
        "16",
        "--seq-len",
        "16384",
        "--head-dim",
        "64",
        "--mask",
        "causal",
        "--traversal",
        "compact",
        "--masking",
        "partial",
    ]);
    let (a, b) = (one["latency_ms"].as_f64().unwrap(), many["latency_ms"].as_f64().unwrap());
    assert!((b / (a * 100.0) - 1.0).abs() < 0.01, "{b} vs 100 x {a}");
    assert_eq!(many["grid_steps"].as_u64().unwrap(), 100 * one["grid_steps"].as_u64().unwrap());
}

#[test]
fn table_output_explains_the_run() {
    let out = bin().args(["run", "--kernel", "tokamax-splash"]).output().unwrap();
    assert!(out.status.success());
    let s = String::from_utf8_lossy(&out.stdout);
    for needle in ["latency", "MFU", "bound by", "vpu", "tokamax-splash", "grid steps", "q_len 75600"] {
        assert!(s.contains(needle), "table lacks {needle:?}:\n{s}");
    }
}

/// Runs `tpusim ARGS` expecting exit code 2; returns stderr.
fn input_error(args: &[&str]) -> String {
    let out = bin().args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "tpusim {args:?} should exit 2; stderr: {err}");
    assert!(out.stdout.is_empty(), "tpusim {args:?}: nothing on stdout on error");
    err
}

#[test]
fn reports_name_the_chip_model_that_produced_them() {
    // Issue 13, item 1: two runs on different models (an override, or a calibrated file that
    // keeps the name v6e) are told apart by their reports: source, overrides and parameter hash.
    let job = ["--heads", "2", "--seq-len", "2048"];
    let preset = run_json(&job);
    let mut a = job.to_vec();
    a.extend(["--set", "hbm.bandwidth_gb_per_s=3276"]);
    let set = run_json(&a);
    let dir = std::env::temp_dir().join(format!("tpusim-cli-identity-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = std::fs::read_to_string(root().join("models/v6e.toml")).unwrap();
    let fitted = dir.join("my-fit.toml");
    // A model as `calibrate` writes it: the name stays v6e, one fitted value differs.
    let changed = text.replacen("grid_step_overhead_cycles = { value = ", "grid_step_overhead_cycles = { value = 1", 1);
    assert_ne!(changed, text, "models/v6e.toml has a grid_step_overhead_cycles value");
    std::fs::write(&fitted, changed).unwrap();
    let mut a = job.to_vec();
    a.extend(["--chip", fitted.to_str().unwrap()]);
    let file = run_json(&a);

    for j in [&preset, &set, &file] {
        assert_eq!(j["chip"], "v6e", "the name alone cannot tell them apart");
    }
    let id = |j: &Value| j["chip_model"].clone();
    assert_eq!(id(&preset)["source"], "preset");
    assert_eq!(id(&preset)["overrides"], serde_json::json!([]));
    assert_eq!(id(&set)["overrides"], serde_json::json!(["hbm.bandwidth_gb_per_s=3276"]));
    assert_eq!(id(&file)["source"], fitted.to_str().unwrap());
    let hashes: Vec<&str> = [&preset, &set, &file].iter().map(|j| j["chip_model"]["hash"].as_str().unwrap()).collect();
    assert!(hashes[0] != hashes[1] && hashes[0] != hashes[2] && hashes[1] != hashes[2], "{hashes:?}");
    // The preset's own file has the preset's hash: the hash follows the values, not the name.
    let own_file = root().join("models/v6e.toml");
    let mut a = job.to_vec();
    a.extend(["--chip", own_file.to_str().unwrap()]);
    assert_eq!(run_json(&a)["chip_model"]["hash"], id(&preset)["hash"]);

    // The table says it too, as do tune's table and JSON.
    let mut a = vec!["run"];
    a.extend(job);
    a.extend(["--set", "hbm.bandwidth_gb_per_s=3276"]);
    let out = bin().args(&a).output().unwrap();
    let t = String::from_utf8_lossy(&out.stdout);
    assert!(t.contains("chip model") && t.contains("--set hbm.bandwidth_gb_per_s=3276") && t.contains(hashes[1]), "{t}");
    let tune = |extra: &[&str]| {
        let mut a = vec!["tune", "--heads", "2", "--seq-len", "2048", "--top", "1", "--refine", "1", "--block-q", "512"];
        a.extend(extra);
        let out = bin().args(&a).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let tj: Value = serde_json::from_str(&tune(&["--chip", fitted.to_str().unwrap(), "--format", "json"])).unwrap();
    assert_eq!(tj["chip_model"]["hash"].as_str(), Some(hashes[2]));
    let tt = tune(&["--set", "hbm.bandwidth_gb_per_s=3276"]);
    assert!(tt.contains("chip model") && tt.contains(hashes[1]), "{tt}");
    // `chip show` names the model the same way.
    let out = bin().args(["chip", "show", "v6e", "--set", "hbm.bandwidth_gb_per_s=3276"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains(hashes[1]));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn errors_name_what_was_typed_the_rule_and_the_enforced_range() {
    // Issue 13, item 5. A length given as --seq-len is named so, in workload and kernel errors.
    let e = input_error(&["run", "--seq-len", "100000000000"]);
    assert!(e.contains("--seq-len") && e.contains("100000000000") && e.contains("from 1 to 4294967296") && !e.contains("--q-len"), "{e}");
    // A block size nobody typed is named as the family's default (a decode-sized q).
    let e = input_error(&["run", "--q-len", "8", "--kv-len", "4096"]);
    assert!(e.contains("--block-q = 128") && e.contains("was not given") && e.contains("--kernel tokamax-splash"), "{e}");
    let e = input_error(&["run", "--q-len", "8", "--kv-len", "4096", "--block-q", "16"]);
    assert!(!e.contains("was not given"), "{e}");
    let e = input_error(&["run", "--seq-len", "100000000"]);
    assert!(e.contains("--seq-len") && e.contains("score pairs") && !e.contains("--q-len"), "{e}");
    let e = input_error(&["run", "--seq-len", "4096", "--block-q", "100"]);
    assert!(
        e.contains("--block-q = 100") && e.contains("multiple of 8") && e.contains("--seq-len (4096)") && !e.contains("--q-len"),
        "{e}"
    );
    // Tile alignment that drops every tile blames --tile-align, not the mask.
    let e = input_error(&["run", "--seq-len", "4096", "--mask", "band:10", "--tile-align"]);
    assert!(e.contains("--tile-align") && e.contains("dropped every tile") && !e.contains("--mask"), "{e}");
    // The stated range is the enforced one, for 0, negative numbers and values past the cap.
    for v in ["0", "-1", "1048577"] {
        let e = input_error(&["run", "--heads", v]);
        assert_eq!(e, format!("error: --heads = {v}: expected a whole number from 1 to 1048576\n"), "--heads {v}");
    }
    let e = input_error(&["run", "--head-dim", "5000"]);
    assert!(e.contains("--head-dim") && e.contains("from 1 to 4096"), "{e}");
    let e = input_error(&["run", "--batch", "-3"]);
    assert!(e.contains("--batch = -3:"), "{e}");
    let e = input_error(&["run", "--vmem-limit-mib", "-1"]);
    assert!(e.contains("--vmem-limit-mib = -1") && e.contains("above 0"), "{e}");
    let e = input_error(&["tune", "--top", "-1"]);
    assert!(e.contains("--top = -1:"), "{e}");
    // Chip overrides: an absurd value prints short, with the field's own range.
    let e = input_error(&["run", "--set", "hbm.bandwidth_gb_per_s=1e300"]);
    assert!(e.contains("= 1e300:") && e.contains("from 0.001 to 1e7") && e.len() < 200, "{e}");
    let e = input_error(&["run", "--set", "mxu.count=99999999999"]);
    assert!(e.contains("mxu.count") && e.contains("from 1 to 64"), "{e}");
    // tune names the rule a held-fixed block breaks, as run does, without searching.
    let e = input_error(&["tune", "--heads", "2", "--seq-len", "4096", "--block-q", "100"]);
    assert!(e.contains("--block-q = 100") && e.contains("multiple of 8") && e.contains("fixed"), "{e}");
    assert!(!e.contains("breaking block rules") && !e.contains("evaluated"), "{e}");
}

/// `` `field` `` in a table message as the command line names it (`--field`).
fn as_flags(text: &str) -> String {
    let mut out = String::new();
    let mut parts = text.split('`');
    if let Some(first) = parts.next() {
        out.push_str(first);
    }
    for (i, p) in parts.enumerate() {
        if i % 2 == 0 {
            out.push_str(&format!("--{}", p.replace('_', "-")));
        } else {
            out.push_str(p);
        }
    }
    out
}

/// The shared bad-input table (tests/data/bad-inputs.toml, also read by the Python package's
/// tests): every case with a command-line value exits 2 with `error: --KEY = VALUE: ERROR`.
#[test]
fn the_shared_bad_input_table_is_refused_in_the_cli_form() {
    let text = std::fs::read_to_string(root().join("crates/tpusim/tests/data/bad-inputs.toml")).unwrap();
    let table: toml::Table = toml::from_str(&text).unwrap();
    let cases = table["case"].as_array().unwrap();
    let mut ran = 0;
    for c in cases {
        let Some(cli) = c.get("cli").and_then(|v| v.as_str()) else { continue };
        let key = c["key"].as_str().unwrap();
        let flag = format!("--{}", key.replace('_', "-"));
        let mut args = vec![c.get("fn").and_then(|v| v.as_str()).unwrap_or("run").to_string(), format!("{flag}={cli}")];
        if let Some(w) = c.get("with").and_then(|v| v.as_table()) {
            for (k, v) in w {
                let v = v.as_str().map(String::from).unwrap_or_else(|| v.to_string());
                args.push(format!("--{}={v}", k.replace('_', "-")));
            }
        }
        let out = bin().args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "tpusim {args:?}: {err}");
        let want = format!("error: {flag} = {cli}: {}\n", as_flags(c["error"].as_str().unwrap()));
        assert_eq!(err, want, "tpusim {args:?}");
        ran += 1;
    }
    assert!(ran >= 15, "{ran} command-line cases");
}

/// File errors name the file's own keys, the value and the rule in words (no "expected u64").
#[test]
fn file_errors_name_their_keys_in_plain_words() {
    let dir = std::env::temp_dir().join(format!("tpusim-cli-files-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let w = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let extra = w("extra.json", r#"{"q_len": 1024, "kv_len": 1024, "block_q": 256, "block_kv": 256, "blocks": [[0, 3]], "extra": 1}"#);
    expect_input_error(
        &["run", "--seq-len", "1024", "--mask", &format!("file:{extra}")],
        &["unknown key 'extra'; the keys here are q_len, kv_len, block_q, block_kv, blocks"],
    );
    let neg = w("neg.json", r#"{"q_len": 1024, "kv_len": 1024, "block_q": -512, "block_kv": 256, "blocks": [[0, 3]]}"#);
    expect_input_error(&["run", "--seq-len", "1024", "--mask", &format!("file:{neg}")], &["block_q = -512: expected a whole number"]);
    let v6e = std::fs::read_to_string(root().join("models/v6e.toml")).unwrap();
    let chip = w("chip.toml", &v6e.replacen("count = { value = 2,", "count = { value = 2.0,", 1));
    expect_input_error(&["run", "--chip", &chip], &["mxu.count = 2.0: expected a whole number"]);
    let trace = w("trace.toml", "heads = \"10\"\n");
    expect_input_error(&["run", "--trace", &trace], &["heads = \"10\": expected a whole number from 1 to 1048576"]);
    let sweep = w("sweep.toml", "[base]\nheads = 2\n[axes]\nblock_q = [-128]\n");
    expect_input_error(&["sweep", &sweep, "--no-progress"], &["axes.block_q[0]: block_q = -128: expected a whole number from 1 to 4294967296"]);
    for args in [vec!["run", "--trace", trace.as_str()], vec!["run", "--chip", chip.as_str()], vec!["sweep", sweep.as_str()]] {
        let out = bin().args(&args).output().unwrap();
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(!e.contains("expected u") && !e.contains("invalid type"), "no serde type names: {e}");
    }
}

/// One default job, stated once: the long help of `run`, `tune` and the job plots states the job
/// `tpusim run` runs with no flag (its kernel and blocks read off the run's own report, not typed
/// here), and the plots without --trace draw that job; with a job flag they start from the
/// family's defaults, as `run` does.
#[test]
fn help_text_and_plot_defaults_equal_the_run_default() {
    let ran = run_json(&[]);
    let c = &ran["job"]["config"];
    let w = &ran["job"]["workload"];
    let (kernel, bq, bkv, bkvc) = (c["kernel"].as_str().unwrap(), &c["block_q"], &c["block_kv"], &c["block_kv_compute"]);
    let stated = [
        format!("(--kernel {kernel}) at block_q {bq}, block_kv {bkv}, block_kv_compute {bkvc}"),
        format!("{} x {} heads x {} tokens, head_dim {}, mask {}", w["batch"], w["q_heads"], w["q_len"], w["head_dim"], w["mask"].as_str().unwrap()),
        format!("on {}", ran["chip"].as_str().unwrap()),
    ];
    for cmd in [vec!["run"], vec!["tune"], vec!["plot", "roofline"], vec!["plot", "breakdown"], vec!["plot", "tiles"], vec!["plot", "timeline"]] {
        let out = bin().args(&cmd).arg("--help").output().unwrap();
        let help = String::from_utf8_lossy(&out.stdout).split_whitespace().collect::<Vec<_>>().join(" ");
        for st in &stated {
            assert!(help.contains(st.as_str()), "tpusim {cmd:?} --help should state the default job ({st}): {help}");
        }
        assert!(!help.contains("tokamax's Splash kernel and its default blocks"), "{cmd:?}");
    }
    // The plots without --trace draw the run's default job.
    let dir = std::env::temp_dir().join(format!("tpusim-cli-default-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = |kind: &str, extra: &[&str]| {
        let path = dir.join(format!("{kind}.svg"));
        let out = bin().args(["plot", kind, "--out", path.to_str().unwrap()]).args(extra).output().unwrap();
        assert!(out.status.success(), "plot {kind}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let tiles = svg("tiles", &[]);
    assert!(tiles.contains(&format!("at {bq} x {bkv} tiles")), "{tiles}");
    assert!(svg("timeline", &[]).contains("Timeline of video-720p-dense"));
    let tiles_flag = svg("tiles", &["--heads", "10"]);
    assert!(!tiles_flag.contains(&format!("at {bq} x {bkv} tiles")), "a job flag starts from the family's defaults: {tiles_flag}");
    // Roofline and breakdown expand their jobs through the plot crate: the default is the run's.
    let none = tpusim_job::JobSpec::default();
    let jobs = tpusim_plot::jobs::expand(&[], &none, &[], &[]).unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].spec, tpusim_job::case_study_or(none.clone()));
    let chip = jobs[0].spec.chip().unwrap();
    let built = serde_json::to_value(jobs[0].spec.build(&chip).unwrap()).unwrap();
    assert_eq!(built, ran["job"], "the roofline's default job is the run's");
    let flagged = tpusim_job::JobSpec { heads: Some(10), ..Default::default() };
    assert_eq!(tpusim_plot::jobs::expand(&[], &flagged, &[], &[]).unwrap()[0].spec, flagged);
    // `tune` with no job flag searches the default job's blocks and compares with the default
    // job as `run` runs it (the case study's own blocks), not with the family's default blocks.
    let opts = tpusim_sweep::TuneOptions { top: 1, baseline: tpusim_job::tune_baseline(&none), ..Default::default() };
    let tuned = tpusim_sweep::tune(&tpusim_job::tune_default_or(none.clone()), &opts).unwrap();
    assert_eq!(tuned.given_latency_ms, ran["latency_ms"].as_f64(), "the ranking's `given` is the run's default job");
    assert!(tpusim_job::tune_baseline(&flagged).is_none(), "a given job is its own baseline");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `tpusim run` with no job flag (output format, --chip and --set do not count) runs the built-in
/// case study (traces/video-720p-dense.toml's job) and shows its measured time, found by a lookup
/// of the shipped calibration rows; any job flag starts from the family defaults instead.
#[test]
fn case_study_is_the_first_run() {
    let trace = root().join("traces/video-720p-dense.toml");
    let plain = run_json(&[]);
    let traced = run_json(&["--trace", trace.to_str().unwrap()]);
    assert_eq!(plain["job"], traced["job"]);
    assert_eq!(plain["latency_ms"], traced["latency_ms"]);
    assert_eq!(plain["measured"]["id"], "VD-B0");
    let measured = plain["measured"]["measured_ms"].as_f64().unwrap();
    let err = plain["measured"]["error"].as_f64().unwrap();
    let latency = plain["latency_ms"].as_f64().unwrap();
    assert!((err - (latency - measured) / measured).abs() < 1e-12);
    // The measurement is found for the job, whatever spelled it: the flags of the trace too.
    let flags = run_json(&[
        "--kernel",
        "splash",
        "--seq-len",
        "75600",
        "--heads",
        "10",
        "--block-q",
        "3024",
        "--block-kv",
        "2048",
        "--block-kv-compute",
        "1024",
    ]);
    assert_eq!(flags["measured"]["id"], "VD-B0");
    // Hardware flags keep the case study; a what-if chip is not the measured one.
    let fast = run_json(&["--set", "hbm.bandwidth_gb_per_s=3276"]);
    assert_eq!(fast["job"], plain["job"]);
    assert!(fast.get("measured").is_none());
    // A job flag: the family's defaults, and no row matches.
    let other = run_json(&["--heads", "10"]);
    assert_eq!(other["job"]["config"]["kernel"], "tokamax-splash");
    assert!(other.get("measured").is_none());
    // The table shows the measured time beside the prediction.
    let out = bin().arg("run").output().unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.contains("  measured     78.70 ms  (row VD-B0 of traces/measured/calibration.csv"), "{s}");
    // Notes name what the user typed, or the family's default: the case study's JAX Splash masks
    // its padded kv tiles (masking all), so it has no masking note; a mask-free run does.
    assert!(!s.contains("note         masking"), "{s}");
    let typed = bin().args(["run", "--trace", trace.to_str().unwrap(), "--masking", "none"]).output().unwrap();
    assert!(String::from_utf8_lossy(&typed.stdout).contains("note         --masking none with"));
}

/// Errors name what the user gave (fresh users' findings): a default job's block size comes
/// from the built-in case study, not a family default; an oversized product names its largest
/// factor; a trace's bad chip or override names the trace.
#[test]
fn errors_name_the_field_the_user_gave() {
    let out = bin().args(["run", "--set", "vpu.lanes=4096"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--block-kv = 2048") && err.contains("this is the default job"), "{err}");
    assert!(!err.contains("was not given"), "the case study gives block_kv: {err}");
    expect_input_error(&["run", "--batch", "100000000"], &["--batch = 100000000: batch x heads x q_len x kv_len"]);
    let dir = std::env::temp_dir().join(format!("tpusim-cli-trace-errors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let chip = dir.join("chip.toml");
    std::fs::write(&chip, "chip = \"v9\"\n").unwrap();
    let set = dir.join("set.toml");
    std::fs::write(&set, "set = [\"mxu.count=0\"]\n").unwrap();
    let (chip, set) = (chip.to_str().unwrap(), set.to_str().unwrap());
    expect_input_error(&["run", "--trace", chip], &[&format!("trace {chip}: unknown chip 'v9'")]);
    expect_input_error(&["run", "--trace", set], &[&format!("trace {set}: chip model, its `set`: field 'mxu.count' = 0")]);
    // Overrides apply whatever their order: a smaller VMEM with its scoped limit; alone, the
    // error says to lower the limit too.
    let mm = ["run", "--kernel", "pallas-matmul", "--m", "1024", "--n", "1024", "--k", "1024"];
    for set in [["vmem.size_mib=16", "vmem.scoped_limit_mib=16"], ["vmem.scoped_limit_mib=16", "vmem.size_mib=16"]] {
        let out = bin().args(mm).args(["--set", set[0], "--set", set[1]]).output().unwrap();
        assert!(out.status.success(), "{set:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let mut alone = mm.to_vec();
    alone.extend(["--set", "vmem.size_mib=16"]);
    expect_input_error(&alone, &["must not exceed vmem.size_mib (16)", "--set vmem.scoped_limit_mib=16"]);
    // The flag's own override is the flag's.
    expect_input_error(&["run", "--trace", set, "--set", "mxu.count=0"], &["chip model --set: field 'mxu.count' = 0"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fresh user's finding: `tune --kernel flash-attention` ranked first a compacted grid with
/// partial masking, which JAX's flash attention cannot run, without a word. Such options are now
/// marked as design what-ifs, the fastest configuration the library runs as it is is named, and
/// `run` says so in a note.
#[test]
fn design_what_ifs_are_marked_in_tune_and_noted_in_run() {
    let out = bin()
        .args(["tune", "--kernel", "flash-attention", "--heads", "2", "--seq-len", "2048", "--mask", "causal", "--top", "40"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("compact*") && text.contains("* a design what-if: flash-attention has no setting for it (it runs traversal full-grid, masking all"), "{text}");
    // Either a runnable rank is named or the command says none is, with how to hold them.
    assert!(text.contains("the fastest it runs as it is: rank") || text.contains("none of these runs as it is"), "{text}");
    let run = |extra: &[&str]| {
        let mut a = vec!["run", "--kernel", "flash-attention", "--heads", "2", "--seq-len", "2048", "--mask", "causal"];
        a.extend_from_slice(extra);
        String::from_utf8_lossy(&bin().args(&a).output().unwrap().stdout).into_owned()
    };
    assert!(run(&["--traversal", "compact"]).contains("a design what-if: flash-attention has no setting for traversal compact"));
    assert!(!run(&[]).contains("design what-if"));
}

/// A fresh user's findings: a `--set` the chip refuses was blamed on the sweep file's base; a
/// per-head mask of the wrong count did not echo the mask; a tiling larger than the physical
/// VMEM was told to raise the scoped limit.
#[test]
fn errors_name_what_the_user_gave() {
    let dir = std::env::temp_dir().join(format!("tpusim-cli-blame-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sweep = dir.join("s.toml");
    std::fs::write(&sweep, "[base]\nheads = 2\nseq_len = 1024\n[axes]\nblock_q = [128, 256]\n").unwrap();
    let err = input_error;
    let e = err(&["sweep", sweep.to_str().unwrap(), "--out", dir.join("s.csv").to_str().unwrap(), "--set", "hbm.nope=1"]);
    assert!(e.contains("--set: field 'hbm.nope'") && !e.contains("sweep file"), "{e}");
    std::fs::write(&sweep, "[base]\nheads = 2\nseq_len = 1024\n[axes]\nblock_qq = [128, 256]\n").unwrap();
    let e = err(&["sweep", sweep.to_str().unwrap(), "--out", dir.join("s2.csv").to_str().unwrap()]);
    assert!(e.contains("axes.block_qq: unknown key 'block_qq'"), "{e}");
    let e = err(&["run", "--heads", "8", "--seq-len", "4096", "--mask", "per-head[4*band:100;3*causal]"]);
    assert!(e.contains("per-head[4*band:100;3*causal] (7 per-head masks)"), "{e}");
    let e = err(&["layer", "--chip", "v4"]);
    assert!(e.contains("use smaller blocks (it needs more than the physical VMEM, 16 MiB)") && !e.contains("raise `vmem_limit_mib`"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fresh user's finding: tuning a backward run searched the forward's traversal and masking,
/// which change nothing there (equal twins in the ranking). They are held fixed and said so.
#[test]
fn backward_tuning_holds_the_forward_options() {
    let o = bin()
        .args(["tune", "--kernel", "splash", "--heads", "2", "--seq-len", "2048", "--mask", "causal", "--direction", "bwd", "--top", "3"])
        .output()
        .unwrap();
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let searched = t.lines().find(|l| l.trim_start().starts_with("searched")).unwrap_or_default();
    assert!(!searched.contains("traversal") && !searched.contains("masking ("), "{t}");
    assert!(t.contains("fixed        traversal and masking (the backward kernels' own"), "{t}");
}

/// Issue 47, point 6: `tpusim run --help` says which blocks each attention family masks as the
/// family's default does (JAX's Splash masks every computed block, as its IR reads; it said
/// "partial blocks only").
#[test]
fn the_help_says_which_blocks_each_family_masks_as_it_runs() {
    let out = bin().args(["run", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    for family in ["tokamax-splash", "splash", "sparse-splash", "flash-attention"] {
        let line = help.lines().find(|l| l.trim_start().starts_with(&format!("- {family}:"))).unwrap_or_else(|| panic!("{family} in --help"));
        let masking = run_json(&["--kernel", family, "--heads", "1", "--seq-len", "1024", "--mask", "causal"])["job"]["config"]["masking"].as_str().unwrap().to_string();
        let says_partial = line.contains("partial blocks only");
        assert_eq!(says_partial, masking == "partial", "{family} runs masking {masking}; its help: {line}");
    }
}

/// Issue 47, point 8: a job flag starts from the family's defaults, not from the case study
/// (`run --heads 10`, the case study's heads, runs tokamax's Splash at 128-wide blocks, twenty
/// times slower): a note says so, in the table and in the JSON notes, and points to `tune`.
#[test]
fn a_job_flag_that_leaves_the_case_study_says_so() {
    let args = ["--heads", "2", "--seq-len", "4096"];
    let j = run_json(&args);
    let notes: Vec<&str> = j["notes"].as_array().unwrap().iter().filter_map(|n| n.as_str()).collect();
    let note = notes.iter().find(|n| n.contains("starts from the kernel family's defaults")).unwrap_or_else(|| panic!("{notes:?}"));
    assert!(note.contains("tokamax-splash (the default --kernel) at its default blocks 128/128/128") && note.contains("tpusim tune"), "{note}");
    let table = bin().arg("run").args(args).output().unwrap();
    assert!(String::from_utf8_lossy(&table.stdout).contains("starts from the kernel family's defaults"));
    // The case study itself, and a job that gives its blocks, need no such note.
    for args in [&[][..], &["--heads", "2", "--seq-len", "4096", "--block-q", "512", "--block-kv", "512"][..]] {
        let j = run_json(args);
        assert!(!j["notes"].as_array().unwrap().iter().any(|n| n.as_str().unwrap().contains("starts from the kernel family's defaults")), "{args:?}");
    }
}

/// A call of several kernels names whose grid the grid line shows and each kernel's steps,
/// which add up to the total (it mixed the forward's blocks with both passes' steps).
#[test]
fn a_forward_and_backward_grid_line_names_each_kernels_steps() {
    let args = ["run", "--direction", "fwd+bwd", "--heads", "4", "--seq-len", "8192", "--mask", "causal"];
    let out = bin().args(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.trim_start().starts_with("grid ")).unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("(the forward kernel's)") && line.contains("over its 2 kernels (forward "), "{line}");
    // The tiles line is the forward kernel's too, and says so.
    let tiles = text.lines().find(|l| l.trim_start().starts_with("tiles ")).unwrap_or_else(|| panic!("{text}"));
    assert!(tiles.ends_with("masked (the forward kernel's; the phases above give each kernel's)"), "{tiles}");
    let j = run_json(&args[1..]);
    let per: Vec<u64> = j["phases"].as_array().unwrap().iter().filter(|p| p["kernel"] == true).map(|p| p["grid_steps"].as_u64().unwrap()).collect();
    assert_eq!(per.len(), 2);
    assert_eq!(per.iter().sum::<u64>(), j["grid_steps"].as_u64().unwrap());
    for n in &per {
        assert!(line.contains(&format!(" {n}")), "{line} names {n}");
    }
}

/// Issue 47, point 10: a run bound by the MXU that twice the MXU's row rate does not speed up
/// says which part of the MXU's work bounds it (its weight-fold loads at 128-row blocks), and
/// the report gives the share; large blocks stream enough rows per fold to leave loads hidden.
#[test]
fn an_mxu_bound_run_says_whether_fold_loads_or_result_latency_bound_it() {
    let args = ["--heads", "32", "--seq-len", "8192", "--mask", "causal"];
    let out = bin().arg("run").args(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.contains("bound by")).unwrap();
    assert!(line.starts_with("  bound by     mxu") && line.contains("the MXU's weight-fold loads bound it, not its row rate"), "{line}");
    let j = run_json(&args);
    assert!(j["mxu_fold_load_share"].as_f64().unwrap() >= 0.5, "{}", j["mxu_fold_load_share"]);
    let big = run_json(&["--heads", "32", "--seq-len", "8192", "--mask", "causal", "--block-q", "2048", "--block-kv", "2048", "--block-kv-compute", "512"]);
    assert!(big["mxu_fold_load_share"].as_f64().unwrap() < 0.5, "{}", big["mxu_fold_load_share"]);
}

/// A trace, chip model or sweep file that is not UTF-8 (a Latin-1 `é`) is refused with where
/// its first bad byte is; the message was "stream did not contain valid UTF-8", with no place.
#[test]
fn a_file_that_is_not_utf8_is_refused_with_its_position() {
    let dir = std::env::temp_dir().join(format!("tpusim-utf8-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("latin1.toml");
    std::fs::write(&f, b"heads = 8\nmask = \"caf\xe9\"\n").unwrap();
    let f = f.to_str().unwrap();
    let at = "not UTF-8 text: the byte at offset 21 (line 2, column 12) is not valid UTF-8; save the file as UTF-8";
    expect_input_error(&["run", "--trace", f], &["--trace", at]);
    expect_input_error(&["chip", "show", f], &[at]);
    expect_input_error(&["sweep", f, "--out", dir.join("o.csv").to_str().unwrap()], &["sweep file", at]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A forward attention run reports the SMEM its mask metadata takes (the column was empty in
/// every attention sweep row, where the same figure refuses a tiling that overflows SMEM): more
/// grid blocks need more; a full mask needs none in tokamax.
#[test]
fn forward_attention_reports_its_mask_metadata_smem() {
    let smem = |bq: &str, mask: &str| {
        let j = run_json(&["--kernel", "splash", "--heads", "2", "--seq-len", "16384", "--mask", mask, "--block-q", bq, "--block-kv", bq]);
        j["smem_bytes"].as_u64().unwrap_or_else(|| panic!("no smem_bytes: {j}"))
    };
    let (small, large) = (smem("512", "causal"), smem("2048", "causal"));
    assert!(small > large && large > 0, "{small} {large}");
    let bwd = run_json(&["--kernel", "splash", "--direction", "bwd", "--heads", "2", "--seq-len", "4096", "--mask", "causal"]);
    assert!(bwd.get("smem_bytes").is_none(), "the backward's metadata is not counted: {bwd}");
}

/// A unit busy for the whole run whose doubling saves almost nothing is not called
/// latency-bound: the line says its rate and the steps' dependency chain bound the run at
/// nearly one time (a fresh user read "xlu (latency: ...) busy 100%" as a contradiction).
#[test]
fn a_unit_busy_all_run_that_gains_little_names_the_chain_behind_it() {
    let out = bin().args(["run", "--block-q", "8192", "--block-kv", "8192", "--seq-len", "65536", "--heads", "1"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.trim_start().starts_with("bound by")).unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("busy 100% of the run") && line.contains("dependency chain"), "{line}");
    assert!(!line.contains("(latency:"), "{line}");
}

/// `masking all` with a full mask says that only the padding tiles apply a mask (a fresh user
/// read "masking all ... 720 masked" of 11500 visited as a contradiction).
#[test]
fn masking_all_with_a_full_mask_says_only_padding_is_masked() {
    let j = run_json(&["--kernel", "tokamax-splash", "--heads", "1", "--seq-len", "4000", "--mask", "full", "--masking", "all", "--block-q", "1024", "--block-kv", "1024"]);
    let masked = j["tiles"]["masked"].as_u64().unwrap();
    assert!(masked > 0 && masked < j["tiles"]["visited"].as_u64().unwrap(), "{j}");
    let notes = j["notes"].as_array().unwrap();
    assert!(notes.iter().any(|n| n.as_str().unwrap().contains(&format!("only the {masked} tiles holding sequence padding"))), "{notes:?}");
}

/// The shipped chip file read by its path is the preset (same parameter hash): its band carries
/// no "this model differs" caveat; an override does.
#[test]
fn the_shipped_chip_file_is_not_called_a_different_model() {
    let ir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../traces/measured/kernels/microbench/MB-v6e-copy-t1.json.gz");
    let band = |args: &[&str]| {
        let mut a = vec!["--kernel-ir", ir];
        a.extend_from_slice(args);
        run_json(&a)["band"]["text"].as_str().unwrap().to_string()
    };
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/v6e.toml");
    assert!(!band(&["--chip", root]).contains("this model differs"));
    assert!(band(&["--chip", root, "--set", "hbm.bandwidth_gb_per_s=3276"]).contains("this model differs"));
}

/// A kernel of about a microsecond prints its latency to four significant digits and its unit
/// table in microseconds (a fresh user read `latency 0.001 ms` and a table of 0.000 cells).
#[test]
fn a_microsecond_kernel_prints_significant_digits() {
    let o = bin().args(["run", "--kernel", "pallas-matmul", "--m", "100", "--n", "100", "--k", "100"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    let line = text.lines().find(|l| l.trim_start().starts_with("latency")).unwrap();
    let ms: f64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    let printed = line.split_whitespace().nth(1).unwrap();
    let j = run_json(&["--kernel", "pallas-matmul", "--m", "100", "--n", "100", "--k", "100"]);
    let exact = j["latency_ms"].as_f64().unwrap();
    assert!(exact < 0.01, "a microsecond kernel: {exact}");
    assert!(((ms - exact) / exact).abs() < 5e-4, "four significant digits: {printed} for {exact}");
    assert!(text.contains("unit           busy us  busy %  critical path us"), "{text}");
    let mxu = text.lines().find(|l| l.trim_start().starts_with("mxu ")).unwrap();
    let busy_us: f64 = mxu.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!((busy_us - j["busy_ms"]["mxu"].as_f64().unwrap() * 1e3).abs() < 1e-3, "{mxu}");
}
