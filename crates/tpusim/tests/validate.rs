//! `tpusim validate` and `tpusim calibrate` from the command line: figures on the shipped
//! measurements, machine formats, exit codes and error messages for malformed files.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const SHIPPED: &str = "traces/measured/calibration.csv";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tpusim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tpusim")).args(args).current_dir(root()).output().expect("tpusim runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let d = std::env::temp_dir().join(format!("tpusim-validate-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
    fn file(&self, name: &str, contents: &str) -> String {
        let p = self.0.join(name);
        std::fs::write(&p, contents).unwrap();
        p.to_string_lossy().into_owned()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn validate_json_has_every_row_with_consistent_errors() {
    // Accuracy bands live in tpusim-calib/tests/accuracy.rs; this checks the command's output.
    let out = tpusim(&["validate", SHIPPED, "--format", "json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let shipped = std::fs::read_to_string(root().join(SHIPPED)).unwrap();
    let rows = v["rows"].as_array().unwrap();
    let skipped = v["skipped"].as_array().unwrap();
    assert_eq!(rows.len() + skipped.len(), shipped.lines().count() - 1);
    assert!(skipped.iter().all(|r| !r["reason"].as_str().unwrap().is_empty()));
    assert!(v["summary"]["median_abs_error"].as_f64().unwrap() >= 0.0);
    for r in rows {
        let p = r["predicted_ms"].as_f64().unwrap();
        let m = r["measured_ms"].as_f64().unwrap();
        assert!(((p - m) / m - r["error"].as_f64().unwrap()).abs() < 1e-12);
    }
}

#[test]
fn validate_table_and_csv_list_every_row() {
    let out = tpusim(&["validate", SHIPPED]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = text(&out.stdout);
    let shipped = std::fs::read_to_string(root().join(SHIPPED)).unwrap();
    for line in shipped.lines().skip(1) {
        let id = line.split(',').next().unwrap();
        assert!(t.contains(id), "{id} missing from\n{t}");
    }
    assert!(t.contains("median") && t.contains("worst") && t.contains("Kendall tau") && t.contains("skipped"), "{t}");
    let out = tpusim(&["validate", SHIPPED, "--format", "csv"]);
    assert!(out.status.success());
    let csv = text(&out.stdout);
    assert_eq!(csv.lines().count(), shipped.lines().count());
    assert!(csv.lines().any(|l| l.starts_with("HBM-COPY-v6e-32MiB,18,v6e,hbm-copy,skipped,") && l.contains(",skipped,")), "{csv}");
}

#[test]
fn malformed_files_name_line_and_column_and_exit_2() {
    let d = TempDir::new("malformed");
    let header = "id,chip,kernel,batch,q_heads,kv_heads,q_len,kv_len,head_dim,measured_ms";
    let cases = [
        (
            "missing-column.csv",
            "id,chip,kernel,batch,q_heads,q_len,kv_len,head_dim\nA,v6e,splash,1,8,4096,4096,128\n".to_string(),
            "line 1, column measured_ms",
        ),
        (
            "bad-time.csv",
            format!("{header}\nA,v6e,splash,1,8,8,4096,4096,128,2.5\nB,v6e,splash,1,8,8,4096,4096,128,abc\n"),
            "line 3, column measured_ms: \"abc\" is not a number",
        ),
        ("bad-chip.csv", format!("{header}\nA,v9z,splash,1,8,8,4096,4096,128,2.5\n"), "line 2, column chip: unknown chip 'v9z'"),
        ("bad-int.csv", format!("{header}\nA,v6e,splash,1,8,8,4096,4k,128,2.5\n"), "line 2, column kv_len: \"4k\" is not a whole number"),
        ("unknown-column.csv", "id,chip,kernel,measured_ms,colour\n".to_string(), "line 1, column colour: unknown column"),
    ];
    for (name, contents, want) in cases {
        let path = d.file(name, &contents);
        for cmd in [vec!["validate", path.as_str()], vec!["calibrate", path.as_str(), "--chip", "v6e"]] {
            let out = tpusim(&cmd);
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{cmd:?}: {err}");
            assert!(err.contains(&format!("{path} {want}")), "{cmd:?}: expected '{want}' in: {err}");
        }
    }
    let out = tpusim(&["validate", "no/such/file.csv"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("no/such/file.csv"));
}

#[test]
fn calibrate_writes_a_model_that_validate_uses() {
    let d = TempDir::new("calibrate");
    let model = d.0.join("my-v6e.toml").to_string_lossy().into_owned();
    let out = tpusim(&["calibrate", SHIPPED, "--chip", "v6e", "--out", &model, "--no-cv"]);
    let t = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(t.contains("before") && t.contains("after") && t.contains("fitted model (training)") && t.contains(&model), "{t}");
    let toml = std::fs::read_to_string(&model).unwrap();
    assert!(toml.contains("tpusim calibrate") && toml.contains("fitted_to = [\"VD-B0\""), "{toml}");
    let out = tpusim(&["chip", "show", &model]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = tpusim(&["validate", SHIPPED, "--chip", &model, "--format", "json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["summary"]["median_abs_error"].as_f64().unwrap() <= 0.10);

    let out = tpusim(&["calibrate", SHIPPED, "--chip", "v6e", "--params", "clock_mhz"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("clock_mhz") && text(&out.stderr).contains("valu_vreg_ops_per_cycle"));
    let out = tpusim(&["calibrate", SHIPPED, "--chip", "v9z"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn calibrate_reports_held_out_error_next_to_training_error() {
    let out = tpusim(&["calibrate", SHIPPED, "--chip", "v5e", "--format", "json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let c: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(c["cross_validation"], "leave-one-out");
    assert!(c["after"]["median_abs_error"].is_number() && c["held_out"]["median_abs_error"].is_number());
    assert_eq!(c["fitted_to"].as_array().unwrap().len(), 4);
    assert!(c["rows"].as_array().unwrap().iter().all(|r| r["held_out_ms"].is_number()));
}
