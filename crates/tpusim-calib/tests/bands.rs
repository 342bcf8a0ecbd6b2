//! The shipped error-band file (`traces/measured/bands.json`) must match the shipped models and
//! measurements: regenerate it with `tpusim validate --bands traces/measured/calibration.csv --out
//! traces/measured/bands.json` whenever a chip model, the simulator or the CSV changes. The check
//! takes one in-sample validation (the bands themselves take minutes of cross-validation).

use tpusim_calib::bands::stale;
use tpusim_calib::{read_file, ChipSet};
use tpusim_job::bands::{shipped, BandFile, MIN_ROWS};

const CSV: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../traces/measured/calibration.csv");
const BANDS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../traces/measured/bands.json");

#[test]
fn the_shipped_band_file_is_not_stale() {
    let bytes = std::fs::read(CSV).unwrap();
    let file = read_file(CSV, &[]).unwrap();
    let on_disk: BandFile = serde_json::from_str(&std::fs::read_to_string(BANDS).unwrap()).unwrap();
    assert_eq!(&on_disk, shipped(), "the binary embeds the file on disk");
    if let Some(why) = stale(&on_disk, &bytes, &file, &ChipSet::default()) {
        panic!("traces/measured/bands.json is stale: {why}; regenerate it: {}", on_disk.generated_by);
    }
    // Every predicted row is in one band of its family, a row of a kernel read from its IR also
    // in its chip's `kernel-ir` band (a microbenchmark row, fitted, in its own family's band
    // alone); the tokamax forward rows of v6e make a quoted one.
    let ir = tpusim_job::bands::KERNEL_IR_FAMILY;
    assert_eq!(on_disk.bands.iter().filter(|b| b.key.family != ir).map(|b| b.n).sum::<usize>(), on_disk.in_sample.len());
    let described = file.rows.iter().filter(|m| m.kernel_ir.is_some() && !m.kernel_word.starts_with(tpusim_calib::fit::MECHANISM_KERNEL_PREFIX)).count();
    assert_eq!(on_disk.bands.iter().filter(|b| b.key.family == ir).map(|b| b.n).sum::<usize>(), described);
    let v6e = on_disk.bands.iter().find(|b| b.key.chip == "v6e" && b.key.family == "tokamax-splash" && b.key.scope == "op");
    assert!(v6e.is_some_and(|b| b.n >= MIN_ROWS && b.median_abs_error <= b.p90_abs_error), "{:?}", on_disk.bands);
}

#[test]
fn a_changed_model_makes_the_file_stale() {
    let bytes = std::fs::read(CSV).unwrap();
    let file = read_file(CSV, &[]).unwrap();
    let faster = tpusim_chip::ChipModel::preset("v6e").unwrap().with_override("fitted.valu_vreg_ops_per_cycle", "5").unwrap();
    let why = stale(shipped(), &bytes, &file, &ChipSet::new(vec![faster]).unwrap()).expect("stale");
    assert!(why.contains("chip models changed"), "{why}");
    let mut b = bytes.clone();
    b.push(b'\n');
    assert!(stale(shipped(), &b, &file, &ChipSet::default()).unwrap().contains("measurement file"));
    let mut moved = shipped().clone();
    moved.in_sample[0].1 += 0.01;
    assert!(stale(&moved, &bytes, &file, &ChipSet::default()).unwrap().contains("in-sample error moved"));
}
