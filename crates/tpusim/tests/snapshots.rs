//! Snapshot tests of the output formats (insta): the run table and JSON, the validate CSV and a
//! sweep CSV. Numbers are masked (`[n]`), so a snapshot changes when a format changes (a column,
//! a key, a line, a label), not when the model's predictions move. Review a change with
//! `cargo insta review` (or `INSTA_UPDATE=always cargo test -p tpusim --test snapshots` and
//! `git diff`).

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tpusim(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tpusim")).args(args).current_dir(root()).output().expect("tpusim runs");
    assert!(out.status.success(), "tpusim {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// Body signatures, chip-model hashes, numbers (integers, decimals, exponents, percentages' digits) and bar lengths
/// masked, and runs of spaces (column alignment) made one width, so formats are pinned and values
/// are not.
macro_rules! assert_format {
    ($name:expr, $text:expr) => {
        insta::with_settings!({ filters => vec![
            (r#""signature": "[0-9a-f]{16}""#, r#""signature": "[signature]""#),
            (r"([^.\w])[0-9a-f]{12}\b", "$1[hash]"),
            (r"-?\d+(\.\d+)?(e[-+]?\d+)?", "[n]"),
            (r"#+", "[bar]"),
            (r" {2,}", "  "),
        ] }, {
            insta::assert_snapshot!($name, $text);
        });
    };
}

#[test]
fn run_table_format() {
    assert_format!("run_table", tpusim(&["run", "--trace", "plots/jobs/dense.toml"]));
}

#[test]
fn run_json_format() {
    assert_format!("run_json", tpusim(&["run", "--trace", "plots/jobs/sparse.toml", "--format", "json"]));
}

#[test]
fn training_step_table_format() {
    assert_format!(
        "training_step_table",
        tpusim(&[
            "run",
            "--chip",
            "v7x",
            "--heads",
            "2",
            "--seq-len",
            "4096",
            "--direction",
            "fwd+bwd",
            "--scope",
            "op",
            "--block-q",
            "1024",
            "--block-kv",
            "1024",
            "--block-q-dkv",
            "1024",
            "--block-kv-dkv",
            "1024",
        ])
    );
}

#[test]
fn validate_csv_format() {
    let csv = tpusim(&["validate", "traces/measured/calibration.csv", "--format", "csv"]);
    // The header and the first rows of each kind: the format, not every row.
    let keep: Vec<&str> = csv
        .lines()
        .filter(|l| {
            l.starts_with("id,")
                || l.starts_with("VD-B0")
                || l.starts_with("PALLAS-MM-v5e-8192-b128")
                || l.starts_with("TK-v7x-1tc-078")
                || l.starts_with("HBM-COPY")
        })
        .collect();
    assert_format!("validate_csv", keep.join("\n"));
}

#[test]
fn sweep_csv_format() {
    let d = std::env::temp_dir().join(format!("tpusim-snap-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let def = d.join("s.toml");
    std::fs::write(
        &def,
        "[base]\nheads = 2\nseq_len = 2048\nblock_kv_compute = 512\n[axes]\nblock_q = [512, 1024]\nblock_kv = [512, 1024]\n",
    )
    .unwrap();
    let out = d.join("s.csv");
    tpusim(&["sweep", def.to_str().unwrap(), "--out", out.to_str().unwrap(), "--no-progress"]);
    let text = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_dir_all(&d);
    // The header line names the definition's hash and the version: masked with the numbers.
    assert_format!("sweep_csv", text.replace(env!("CARGO_PKG_VERSION"), "[version]"));
}
