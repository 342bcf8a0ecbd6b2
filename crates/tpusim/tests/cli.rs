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
    expect_input_error(&["run", "--heads", "4294967295", "--seq-len", "128"], &["--heads", "at most"]);
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
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn flags_at_their_default_values_change_nothing_and_trace_lengths_can_be_overridden() {
    let a = run_json(&[]);
    let b = run_json(&["--heads", "10", "--batch", "1", "--head-dim", "128", "--seq-len", "75600"]);
    assert_eq!(a["latency_ms"], b["latency_ms"]);
    let trace = root().join("traces/llm-causal-16k.toml");
    let j = run_json(&["--trace", trace.to_str().unwrap(), "--q-len", "8192", "--kv-len", "8192"]);
    assert_eq!(j["job"]["workload"]["q_len"], 8192);
    assert_eq!(j["job"]["workload"]["mask"], "causal");
    // Every preset runs the default case (block_kv_compute follows its VMEM limit).
    for chip in ["v6e", "v5e", "v5p", "v4", "v7x"] {
        let j = run_json(&["--chip", chip]);
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
    let out = bin().arg("run").output().unwrap();
    assert!(out.status.success());
    let s = String::from_utf8_lossy(&out.stdout);
    for needle in ["latency", "MFU", "bound by", "vpu", "tokamax-splash", "grid steps", "q_len 75600"] {
        assert!(s.contains(needle), "table lacks {needle:?}:\n{s}");
    }
}
