//! The accuracy tables of README.md and traces/measured/VALIDATION.md are what the generator
//! (`tpusim_calib::docs`) gives now: the in-sample parts from a fresh validation, the held-out
//! parts from the band file's recorded cross-validation (held to the current inputs by
//! `tests/bands.rs`), so CI does not repeat the cross-validation.

use std::path::PathBuf;
use tpusim_calib::bands::stale;
use tpusim_calib::docs::{command, parts_from_band_file, TAG_BANDS, TAG_CV, TAG_IN_SAMPLE, TAG_PARAMS, TAG_SUMMARY};
use tpusim_calib::{read_file, ChipSet};
use tpusim_io::mark::spliced_part;
use tpusim_job::bands::BandFile;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn shipped_bands() -> BandFile {
    serde_json::from_str(&std::fs::read_to_string(root().join("traces/measured/bands.json")).unwrap()).unwrap()
}

#[test]
fn the_docs_hold_the_generated_accuracy_tables() {
    let csv = root().join("traces/measured/calibration.csv");
    let file = read_file(csv.to_str().unwrap(), &[]).unwrap();
    let bands = shipped_bands();
    let bytes = std::fs::read(&csv).unwrap();
    let regenerate = command("traces/measured/calibration.csv");
    if let Some(why) = stale(&bands, &bytes, &file, &ChipSet::default()) {
        panic!("traces/measured/bands.json is stale ({why}): regenerate it and the tables with `{regenerate}`");
    }
    let parts = parts_from_band_file(&file, &ChipSet::default(), &bands).unwrap();
    let docs = [("README.md", vec![TAG_SUMMARY]), ("traces/measured/VALIDATION.md", vec![TAG_IN_SAMPLE, TAG_CV, TAG_BANDS, TAG_PARAMS])];
    for (doc, tags) in docs {
        let text = std::fs::read_to_string(root().join(doc)).unwrap();
        for tag in tags {
            let want = &parts.iter().find(|(t, _)| *t == tag).unwrap().1;
            let have = spliced_part(&text, tag).unwrap_or_else(|| panic!("{doc} has no `tpusim {tag}` markers"));
            assert_eq!(
                have.trim_end(),
                want.trim_end(),
                "{doc}'s `tpusim {tag}` part is not what the models give now: regenerate it with `{regenerate}`"
            );
        }
    }
}

#[test]
fn a_band_file_without_held_out_rows_or_with_a_foreign_row_is_refused() {
    let csv = root().join("traces/measured/calibration.csv");
    let file = read_file(csv.to_str().unwrap(), &[]).unwrap();
    let mut b = shipped_bands();
    assert!(!b.held_out.is_empty(), "the shipped band file records the cross-validation");
    b.held_out[0].id = "NOT-A-ROW".into();
    let e = parts_from_band_file(&file, &ChipSet::default(), &b).unwrap_err().to_string();
    assert!(e.contains("NOT-A-ROW") && e.contains("regenerate"), "{e}");
    b.held_out.clear();
    let e = parts_from_band_file(&file, &ChipSet::default(), &b).unwrap_err().to_string();
    assert!(e.contains("no held-out predictions"), "{e}");
}

#[test]
fn a_moved_held_out_prediction_changes_the_generated_tables() {
    // The check can fail: a different recorded leave-one-out prediction gives other tables.
    let csv = root().join("traces/measured/calibration.csv");
    let file = read_file(csv.to_str().unwrap(), &[]).unwrap();
    let b = shipped_bands();
    let before = parts_from_band_file(&file, &ChipSet::default(), &b).unwrap();
    let mut moved = b.clone();
    let r = moved.held_out.iter_mut().find(|h| h.loo_ms.is_some()).unwrap();
    r.loo_ms = r.loo_ms.map(|x| x * 1.5);
    let after = parts_from_band_file(&file, &ChipSet::default(), &moved).unwrap();
    let cv = |p: &Vec<(&str, String)>| p.iter().find(|(t, _)| *t == TAG_CV).unwrap().1.clone();
    assert_ne!(cv(&before), cv(&after));
}

/// The summary's "all rows" counts every row the fit and `validate --cv` take: each chip's
/// library rows and its microbenchmark rows (it left the microbenchmarks out: 44 against
/// `validate --cv`'s 54).
#[test]
fn the_summarys_all_rows_are_the_chips_rows_and_their_microbenchmarks() {
    let csv = root().join("traces/measured/calibration.csv");
    let file = read_file(csv.to_str().unwrap(), &[]).unwrap();
    let parts = parts_from_band_file(&file, &ChipSet::default(), &shipped_bands()).unwrap();
    let summary = &parts.iter().find(|(t, _)| *t == TAG_SUMMARY).unwrap().1;
    let n = |l: &str| l.split('|').nth(2).unwrap().trim().parse::<usize>().unwrap();
    let rows: Vec<&str> = summary.lines().filter(|l| l.starts_with("| v") && !l.contains("VD-B")).collect();
    assert!(rows.iter().any(|l| l.contains("microbenchmarks")), "{summary}");
    let all = summary.lines().find(|l| l.starts_with("| all rows |")).expect("an all-rows line");
    assert_eq!(n(all), rows.iter().map(|l| n(l)).sum::<usize>(), "{summary}");
}
