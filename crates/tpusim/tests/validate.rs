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
    // The rows of the hand-modelled families (the ones a fit uses; kernels read from their IR
    // are validated, never fitted) within 10% at the median.
    let hand = ["splash", "sparse-splash", "tokamax-splash", "xla-matmul", "pallas-matmul"];
    let mut errs: Vec<f64> = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| hand.contains(&r["kernel"].as_str().unwrap()))
        .map(|r| r["error"].as_f64().unwrap().abs())
        .collect();
    errs.sort_by(f64::total_cmp);
    assert!(errs.len() >= 40 && errs[errs.len() / 2] <= 0.10, "{errs:?}");

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

/// The shipped rows of one chip, with the header: a small, fast measurement file.
fn rows_of(d: &TempDir, chip: &str) -> String {
    let shipped = std::fs::read_to_string(root().join(SHIPPED)).unwrap();
    let mut lines = shipped.lines();
    let mut text = format!("{}\n", lines.next().unwrap());
    for l in lines.filter(|l| l.split(',').nth(1) == Some(chip)) {
        text.push_str(l);
        text.push('\n');
    }
    d.file(&format!("{chip}.csv"), &text)
}

/// A copy of a preset's model file with its grid-step overhead changed (as a calibrated file
/// keeps the preset's name).
fn changed_model(d: &TempDir, preset: &str, file: &str) -> String {
    let text = std::fs::read_to_string(root().join(format!("models/{preset}.toml"))).unwrap();
    let changed = text.replacen("grid_step_overhead_cycles = { value = ", "grid_step_overhead_cycles = { value = 1", 1);
    assert_ne!(changed, text);
    d.file(file, &changed)
}

#[test]
fn validate_says_which_model_served_which_rows_and_refuses_two_models_of_one_name() {
    // Issue 13, items 1 and 2.
    let d = TempDir::new("models");
    let v5e = rows_of(&d, "v5e");
    let a = changed_model(&d, "v5e", "a.toml");
    let b = changed_model(&d, "v5e", "b.toml");
    // Two models named v5e: refused (in either order, with --cv too), naming both files.
    for args in [vec!["validate", &v5e, "--chip", &a, "--chip", &b], vec!["validate", &v5e, "--chip", &b, "--chip", &a, "--cv"]] {
        let out = tpusim(&args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(&a) && err.contains(&b) && err.contains("'v5e'"), "{err}");
    }
    // A model no row selects is reported; rows no --chip model covers name the preset used.
    let v7x = root().join("models/v7x.toml").to_string_lossy().into_owned();
    let out = tpusim(&["validate", &v5e, "--chip", &v7x]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = text(&out.stdout);
    assert!(t.contains(&v7x) && t.contains("matched no row") && t.contains("the file's chips are v5e"), "{t}");
    assert!(t.contains("v5e (preset;") && t.contains("no --chip model is named v5e: its preset"), "{t}");
    let out = tpusim(&["validate", &v5e, "--chip", &v7x, "--cv"]);
    assert!(out.status.success() && text(&out.stdout).contains("matched no row"), "{}", text(&out.stderr));
    // Which model predicted which rows, in JSON: the given file for v5e's rows.
    let json = |args: &[&str]| -> serde_json::Value {
        let out = tpusim(args);
        assert!(out.status.success(), "{}", text(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let preset = json(&["validate", &v5e, "--format", "json"]);
    let given = json(&["validate", &v5e, "--chip", &a, "--chip", &v7x, "--format", "json"]);
    let used = &given["chip_models"]["used"];
    assert_eq!(used.as_array().unwrap().len(), 1, "{used}");
    assert_eq!((used[0]["model"]["source"].as_str(), used[0]["given"].as_bool()), (Some(a.as_str()), Some(true)));
    assert_eq!(used[0]["rows"].as_array().unwrap().len(), 4);
    assert_eq!(given["chip_models"]["unmatched"][0]["model"]["source"].as_str(), Some(v7x.as_str()));
    let hash = used[0]["model"]["hash"].as_str().unwrap();
    assert!(given["rows"].as_array().unwrap().iter().all(|r| r["chip_hash"] == hash));
    assert!(preset["rows"].as_array().unwrap().iter().all(|r| r["chip_hash"] != hash), "the preset's rows carry another hash");
}

#[test]
fn a_file_with_no_rows_is_an_input_error() {
    // Issue 13, item 4: a header alone is not "0 rows, n/a".
    let d = TempDir::new("empty");
    let header = std::fs::read_to_string(root().join(SHIPPED)).unwrap().lines().next().unwrap().to_string();
    let only_header = d.file("header.csv", &format!("{header}\n# a comment\n\n"));
    for args in [vec!["validate", &only_header], vec!["validate", &only_header, "--cv"], vec!["calibrate", &only_header, "--chip", "v6e"]] {
        let out = tpusim(&args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(&only_header) && err.contains("no measurement rows"), "{args:?}: {err}");
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn calibrate_checks_its_output_first_and_prints_its_results_when_writing_fails() {
    // Issue 13, items 1 and 3.
    let d = TempDir::new("calib-out");
    let v5e = rows_of(&d, "v5e");
    let args =
        |out: &str| vec!["calibrate".to_string(), v5e.clone(), "--chip".into(), "v5e".into(), "--no-cv".into(), "--out".into(), out.into()];
    let run = |a: Vec<String>| Command::new(env!("CARGO_BIN_EXE_tpusim")).args(&a).current_dir(root()).output().unwrap();
    // A folder that takes no file is refused before the fit (root ignores permissions; /proc does not).
    let out = run(args("/proc/tpusim-fit.toml"));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--out /proc/tpusim-fit.toml") && err.contains("cannot create files"), "{err}");
    assert!(out.stdout.is_empty(), "refused before the fit: no results");
    // A file calibrate did not write is never replaced without --force (a sweep output, notes).
    let notes = d.file("notes.csv", "# tpusim sweep: points=1\nindex\n0\n");
    let out = run(args(&notes));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("holds the output of `tpusim sweep`, not of `tpusim calibrate`") && out.stdout.is_empty(), "{err}");
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "# tpusim sweep: points=1\nindex\n0\n");
    // A write that fails after the fit (a file name longer than the file system allows, which
    // the check before the fit does not foresee) still prints the results, then the error.
    let long = d.0.join(format!("{}.toml", "a".repeat(300))).to_string_lossy().into_owned();
    let out = run(args(&long));
    let (o, err) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(o.contains("tpusim calibrate: chip v5e") && o.contains("fitted model"), "results are printed: {o}");
    assert!(err.contains("nothing was written") && !o.contains("wrote "), "{err}");
    assert_eq!(std::fs::read_dir(&d.0).unwrap().count(), 2, "no temporary file is left: only v5e.csv and notes.csv");
    // Written, the model's hash is the one its runs report.
    let model = d.0.join("fit.toml").to_string_lossy().into_owned();
    let mut a = args(&model);
    a.extend(["--params".into(), "valu_vreg_ops_per_cycle".into(), "--format".into(), "json".into()]);
    let out = run(a);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let c: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(c["start_model"]["source"], "preset");
    let hash = c["fitted_model"]["hash"].as_str().unwrap().to_string();
    let out = tpusim(&["run", "--chip", &model, "--kernel", "pallas-matmul", "--m", "512", "--n", "512", "--k", "512", "--format", "json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["chip_model"]["hash"].as_str(), Some(hash.as_str()));
    assert_eq!(r["chip_model"]["source"].as_str(), Some(model.as_str()));
}

/// A fresh user's findings: a file whose every row is skipped validated "successfully" with 0
/// predicted (calibrate refused the same file); `--into` with `--format json` spliced JSON into a
/// Markdown file; calibrate refused `--params fitted.NAME`, as `--set` spells the field.
#[test]
fn nothing_predicted_is_an_error_and_into_takes_markdown() {
    let d = TempDir::new("none");
    let header = "id,chip,kernel,direction,batch,q_heads,kv_heads,q_len,kv_len,head_dim,head_dim_v,mask,traversal,masking,tile_align,block_q,block_kv,block_kv_compute,options,measured_ms,timing,source,kernel_ir\n";
    let row = "BAD-1,v6e,tokamax-splash,fwd,32,8,8,512,512,256,256,full,compact,partial,no,100,512,512,base2-exp experimental-scheduler,0.596,device time,me,\n";
    let csv = d.file("bad.csv", &format!("{header}{row}"));
    let out = tpusim(&["validate", &csv]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    let err = text(&out.stderr);
    assert!(err.contains("no row could be predicted (1 skipped: BAD-1 (line 2)"), "{err}");
    let md = d.file("r.md", "# r\n<!-- tpusim validate: begin -->\n<!-- tpusim validate: end -->\n");
    let out = tpusim(&["validate", SHIPPED, "--format", "json", "--into", &md]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--into with --format json: a file's generated part is Markdown"), "{}", text(&out.stderr));
    let out = tpusim(&["calibrate", SHIPPED, "--chip", "v6e", "--params", "fitted.nonsense", "--no-cv"]);
    assert!(text(&out.stderr).contains("--params nonsense: not a fitted parameter"), "{}", text(&out.stderr));
}

/// A fresh user's `validate FILE --format csv --out val.csv` was told `--bands` was missing, which
/// writes another file: it now says where the validation goes (standard output, or --into), and
/// writes nothing.
#[test]
fn out_without_bands_says_where_the_validation_goes() {
    let d = TempDir::new("validate-out");
    let target = d.0.join("val.csv").to_string_lossy().into_owned();
    let out = tpusim(&["validate", SHIPPED, "--format", "csv", "--out", &target]);
    assert_eq!(out.status.code(), Some(2));
    let e = text(&out.stderr);
    assert!(e.contains(&format!("--out {target}: writes the band file of --bands")) && e.contains("standard output") && e.contains("--format csv >"), "{e}");
    assert!(!std::path::Path::new(&target).exists());
}

/// Issue 47, point 1: `validate --bands --out` replaces only a band file tpusim wrote (a user's
/// file is refused before the cross-validation and left byte for byte, `--force` replaces it),
/// and the band file names the command that ran, not the docs' command.
#[test]
fn bands_out_replaces_only_a_band_file_and_names_the_command_that_ran() {
    let d = TempDir::new("bands-out");
    let rows = rows_of(&d, "v5e");
    let mine = d.file("mine.json", "{\"my\":1}\n");
    let out = tpusim(&["validate", &rows, "--bands", "--out", &mine]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    let e = text(&out.stderr);
    assert!(e.contains("--out") && e.contains("tpusim did not write it") && e.contains("--force"), "{e}");
    assert_eq!(std::fs::read(&mine).unwrap(), b"{\"my\":1}\n", "the user's file is left as it was");
    let fresh = d.0.join("bands.json").to_string_lossy().into_owned();
    let out = tpusim(&["validate", &rows, "--bands", "--out", &fresh]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let file: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&fresh).unwrap()).unwrap();
    let by = file["generated_by"].as_str().unwrap();
    assert_eq!(by, format!("tpusim validate {rows} --bands --out {fresh}"), "the command that ran");
    // Its own band file it replaces; the user's only with --force.
    assert!(tpusim(&["validate", &rows, "--bands", "--out", &fresh]).status.success());
    let out = tpusim(&["validate", &rows, "--bands", "--out", &mine, "--force"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(std::fs::read_to_string(&mine).unwrap().contains("\"generated_by\""));
}
