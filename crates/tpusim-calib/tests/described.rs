//! Measurement rows of kernels read from their IR (`kernel_ir`, `runtime` columns): predicted
//! from their description exactly as `tpusim run --kernel-ir` predicts them, timed at the row's
//! scope, never used by a fit, counted in their family's band and their chip's `kernel-ir` band;
//! bad cells named by column.

use tpusim_calib::measure::parse;
use tpusim_calib::{calibrate, validate, CalibrateOptions, ChipSet};

const HEADER: &str = "id,chip,kernel,kernel_ir,runtime,measured_ms,timing,source";

/// A measurement file in a fresh folder holding a copy of the element-wise test kernel, with
/// `rows` after the header; returns the folder (kept alive) and the file's path.
fn file_with(rows: &[&str]) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/../tpusim/tests/data/kernel-ir/elementwise.json");
    std::fs::create_dir(dir.path().join("ir")).unwrap();
    std::fs::copy(src, dir.path().join("ir/elementwise.json")).unwrap();
    let path = dir.path().join("rows.csv").to_string_lossy().into_owned();
    std::fs::write(&path, format!("{HEADER}\n{}\n", rows.join("\n"))).unwrap();
    (dir, path)
}

/// `tpusim run --kernel-ir PATH --scope SCOPE`'s latency, ms.
fn run_ir(path: &std::path::Path, scope: tpusim_kernel::Scope) -> f64 {
    let chip = tpusim_chip::ChipModel::load("v6e").unwrap();
    let spec = tpusim_job::JobSpec { kernel_ir: Some(path.to_string_lossy().into_owned()), scope: Some(scope), ..Default::default() };
    tpusim_job::run(&chip, &spec.build(&chip).unwrap()).unwrap().result.seconds * 1e3
}

#[test]
fn a_described_row_is_predicted_as_run_predicts_it_at_its_scope() {
    let rows = [
        "EW-kernel,v6e,elementwise,ir/elementwise.json,,0.01,kernel time from profiler trace,test",
        "EW-call,v6e,elementwise,ir/elementwise.json,,0.2,wall clock incl. dispatch (host timer),test",
    ];
    let (dir, path) = file_with(&rows);
    let text = std::fs::read_to_string(&path).unwrap();
    let file = parse(&text, &path, &[]).unwrap();
    assert_eq!(file.rows[0].kernel_ir.as_deref(), Some(dir.path().join("ir/elementwise.json").to_string_lossy().as_ref()));
    let v = validate(&file, &ChipSet::default());
    assert!(v.skipped.is_empty(), "{:?}", v.skipped);
    let ir = dir.path().join("ir/elementwise.json");
    let kernel = run_ir(&ir, tpusim_kernel::Scope::Kernel);
    let call = run_ir(&ir, tpusim_kernel::Scope::Call);
    assert_eq!(v.rows[0].predicted_ms, kernel);
    assert_eq!(v.rows[1].predicted_ms, call);
    // The host's dispatch is the chip model's, added once.
    let host = tpusim_chip::ChipModel::load("v6e").unwrap().host.dispatch_us.value * 1e-3;
    assert!((call - kernel - host).abs() < 1e-9, "{call} {kernel} {host}");

    // Never fitted: a calibration of v6e to these rows has nothing to fit.
    let cal = calibrate(&file, &tpusim_chip::ChipModel::load("v6e").unwrap(), "v6e", &CalibrateOptions::default());
    let Err(e) = cal else { panic!("a fit to described rows only") };
    let e = e.to_string();
    assert!(e.contains("no row of chip v6e that the fit takes") && e.contains("2 rows: a library kernel read from its IR"), "{e}");
    // A dry run's rows (the kit on the CPU) are expressible and predicted, and the refusal says
    // why they are not fitted (it said the simulator could not express them).
    let dry = [
        "DRYRUN-1,v6e,dry-run-microbench-copy,ir/elementwise.json,,0.01,\"interpret mode on CPU, not a measurement\",test",
        "DRYRUN-2,v6e,dry-run-microbench-grid,ir/elementwise.json,,0.01,\"interpret mode on CPU, not a measurement\",test",
    ];
    let (_dir2, path2) = file_with(&dry);
    let file2 = parse(&std::fs::read_to_string(&path2).unwrap(), &path2, &[]).unwrap();
    assert!(validate(&file2, &ChipSet::default()).skipped.is_empty());
    let Err(e) = calibrate(&file2, &tpusim_chip::ChipModel::load("v6e").unwrap(), "v6e", &CalibrateOptions::default()) else { panic!("a fit to a dry run's rows") };
    let e = e.to_string();
    // One reason for both kernels, given once.
    assert!(e.contains("2 rows: a dry run's row (kernel dry-run-...") && e.contains("never fitted"), "{e}");
    assert_eq!(e.matches("a dry run's row").count(), 1, "{e}");

    // Bands: the family's and the chip's kernel-ir band, at each row's scope.
    let cv = tpusim_calib::CrossValidation { file: path.clone(), rows: Vec::new(), unused: Vec::new(), summaries: Vec::new(), chip_models: ChipSet::default().usage(&file) };
    let bands = tpusim_calib::bands::band_file(&path, text.as_bytes(), &file, &ChipSet::default(), &cv);
    let keys: Vec<String> = bands.bands.iter().map(|b| format!("{} n{}", b.key, b.n)).collect();
    assert!(keys.contains(&"v6e elementwise any kernel n1".to_string()), "{keys:?}");
    assert!(keys.contains(&"v6e kernel-ir any kernel n1".to_string()), "{keys:?}");
    assert!(keys.contains(&"v6e kernel-ir any call n1".to_string()), "{keys:?}");
}

#[test]
fn bad_described_cells_are_named() {
    for (row, column, says) in [
        ("X,v6e,elementwise,,n=ir/lens.npy,0.01,,", "runtime", "give its description in the kernel_ir column"),
        ("X,v6e,elementwise,ir/elementwise.json,lens,0.01,,", "runtime", "expected NAME=FILE.npy"),
        ("X,v6e,elementwise,ir/elementwise.json,a=x.npy;a=y.npy,0.01,,", "runtime", "given twice"),
    ] {
        let (_dir, path) = file_with(&[row]);
        let text = std::fs::read_to_string(&path).unwrap();
        let e = parse(&text, &path, &[]).unwrap_err();
        assert_eq!(e.column.as_deref(), Some(column), "{row}: {e}");
        assert!(e.message.contains(says), "{row}: {e}");
    }
    // A description that is not there: the row is skipped with the reader's reason, never dropped.
    let (_dir, path) = file_with(&["X,v6e,elementwise,ir/missing.json,,0.01,,"]);
    let file = parse(&std::fs::read_to_string(&path).unwrap(), &path, &[]).unwrap();
    let v = validate(&file, &ChipSet::default());
    assert_eq!(v.skipped.len(), 1);
    assert!(v.skipped[0].reason.contains("missing.json"), "{}", v.skipped[0].reason);
}
