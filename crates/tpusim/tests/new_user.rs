//! What a new user tripped on (issue 13, items 10 to 15), through the built binary: mask offsets,
//! paths inside trace and sweep files, timelines of large runs, progress without a terminal,
//! tile maps of long sequences, and shards from a batch system's environment.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tpusim"));
    // Tests set the batch-system variables they read; none leaks in from the caller's job.
    for v in ["SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX", "SLURM_ARRAY_TASK_STEP", "SLURM_ARRAY_TASK_COUNT"] {
        c.env_remove(v);
    }
    c.env_remove("JOB_COMPLETION_INDEX").env_remove("TPUSIM_SHARD_COUNT").env_remove("TPUSIM_PROGRESS_SECS");
    c
}

/// A fresh scratch folder for one test.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tpusim-new-user-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn ok(out: Output, what: &str) -> String {
    assert!(out.status.success(), "{what} failed ({:?}): {}", out.status.code(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn input_error(out: Output, what: &str) -> String {
    assert_eq!(out.status.code(), Some(2), "{what} should exit 2; stdout: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

// ---- item 11: mask offsets for q_len != kv_len ----

#[test]
fn a_decode_step_with_a_causal_offset_attends_the_whole_cache() {
    let run = |mask: &str| {
        let args = [
            "run",
            "--q-len",
            "8",
            "--kv-len",
            "4096",
            "--heads",
            "8",
            "--block-q",
            "8",
            "--block-kv",
            "512",
            "--mask",
            mask,
            "--format",
            "json",
        ];
        json(&ok(bin().args(args).output().unwrap(), mask))
    };
    // Plain causal counts from the first token of both: 8 query rows keep 1 + 2 + ... + 8 pairs.
    let plain = run("causal");
    let kept = plain["pair_density"].as_f64().unwrap() * 8.0 * 4096.0;
    assert!((kept - 36.0).abs() < 1e-6, "{kept}");
    // Splash's CausalMask(offset=4088): the 8 new tokens see the 4088 cached ones and each other.
    let decode = run("causal@offset:4088");
    let kept = decode["pair_density"].as_f64().unwrap() * 8.0 * 4096.0;
    assert!((kept - (8.0 * 4088.0 + 36.0)).abs() < 1e-6, "{kept}");
    assert_eq!(decode["job"]["workload"]["mask"], "causal@offset:4088");
    let help = ok(bin().args(["run", "--help"]).output().unwrap(), "run --help");
    assert!(help.contains("causal@offset:N") && help.contains("kv_len - q_len"), "--help documents the offset");
    let e = input_error(bin().args(["run", "--mask", "band:4@offset:2"]).output().unwrap(), "band with an offset");
    assert!(e.contains("--mask") && e.contains("'@offset:N' applies to causal and local"), "{e}");
}

/// The repository root (traces/, studies/).
#[allow(dead_code)]
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[allow(dead_code)]
fn write(p: &Path, text: &str) {
    std::fs::write(p, text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
}
