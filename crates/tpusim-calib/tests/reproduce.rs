//! The shipped `[fitted]` values reproduce from the command that names them (issue 19, point 4):
//! `tpusim calibrate traces/measured/calibration.csv --chip CHIP` on each preset, with the
//! parameter set the preset declares ([`tpusim_calib::candidates`]), gives back every declared
//! value to its written digits (calibrate writes five significant digits); and a value a preset
//! carries from another chip's fit (its note says "Carried from CHIP's fit") equals that chip's.
//!
//! The fits are independent of their order: each preset is fitted with the other presets' values
//! as shipped, which is what carrying a value means.

use tpusim_calib::fit::Status;
use tpusim_calib::{calibrate, candidates, fitted_param, read_file, CalibrateOptions, FITTED_PARAMS};
use tpusim_chip::ChipModel;

/// The chips with rows in the shipped CSV, in the order their values are carried (v7x's XLU cost
/// to v6e, v6e's VALU rate and loaded-mask cost to v5p and v5e, v5p's EUP and XLU to v5e).
const FITTED_CHIPS: [&str; 4] = ["v7x", "v6e", "v5p", "v5e"];

#[test]
fn refitting_the_shipped_csv_reproduces_every_declared_fitted_value() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../traces/measured/calibration.csv");
    let file = read_file(path, &[]).unwrap();
    let opts = CalibrateOptions { params: Vec::new(), cross_validate: false, date: None };
    for chip in FITTED_CHIPS {
        let preset = ChipModel::preset(chip).unwrap();
        let declared = candidates(&preset, &[]);
        // At most three per stage: the step and DMA mechanisms, then the rest.
        let mechanisms = declared.iter().filter(|n| tpusim_calib::fit::MECHANISM_PARAMS.contains(n)).count();
        assert!(!declared.is_empty() && mechanisms <= 3 && declared.len() - mechanisms <= 3, "{chip}: declares {declared:?}");
        let cal = calibrate(&file, &preset, chip, &opts).unwrap();
        for name in &declared {
            let p = cal.params.iter().find(|p| p.name == *name).unwrap();
            assert_eq!(p.status, Status::Fitted, "{chip}: {name} is declared fitted but the refit did not fit it: {:?}", p.status);
            let shipped = fitted_param(&preset, name).unwrap().value;
            let refit = fitted_param(&cal.model, name).unwrap().value;
            assert_eq!(refit, shipped, "{chip}: {name} refits to {refit}, the preset ships {shipped}: update models/{chip}.toml");
        }
        // Nothing else moves.
        for name in FITTED_PARAMS.iter().filter(|n| !declared.contains(n)) {
            assert_eq!(fitted_param(&cal.model, name).unwrap().value, fitted_param(&preset, name).unwrap().value, "{chip}: {name}");
        }
    }
}

#[test]
fn values_carried_from_another_chip_equal_their_source() {
    let mut carried = 0;
    for chip in ["v4", "v5e", "v5p", "v6e", "v7x"] {
        let model = ChipModel::preset(chip).unwrap();
        for name in FITTED_PARAMS {
            let p = fitted_param(&model, name).unwrap();
            let Some(note) = p.note.as_deref() else { continue };
            let Some(rest) = note.split("Carried from ").nth(1) else { continue };
            let Some(source) = rest.split("'s fit").next().filter(|s| !s.contains(' ')) else { continue };
            let from = ChipModel::preset(source).unwrap_or_else(|e| panic!("{chip}: {name} is carried from {source}: {e}"));
            let src = fitted_param(&from, name).unwrap();
            assert!(src.fitted_to.as_ref().is_some_and(|r| !r.is_empty()), "{chip}: {name} is carried from {source}'s fit, which does not fit it");
            assert_eq!(p.value, src.value, "{chip}: {name} is carried from {source}'s fit ({}) but ships {}", src.value, p.value);
            carried += 1;
        }
    }
    // v6e's XLU, v5p's VALU, v5e's VALU / EUP / XLU / loaded mask, ... : the notes name them.
    assert!(carried >= 8, "only {carried} carried values found: the notes' wording changed?");
}

#[test]
fn every_row_a_preset_names_is_a_row_of_its_chip() {
    // `fitted_to` and `checked_against` name the rows a value was fitted to or checked against:
    // each must be a row of the shipped CSV, measured on that preset's chip (a renamed or
    // removed row would leave a model citing measurements that are not there).
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../traces/measured/calibration.csv");
    let file = read_file(path, &[]).unwrap();
    let mut named = 0;
    for chip in ["v4", "v5e", "v5p", "v6e", "v7x"] {
        let model = ChipModel::preset(chip).unwrap();
        for name in FITTED_PARAMS {
            let p = fitted_param(&model, name).unwrap();
            for (list, ids) in [("fitted_to", &p.fitted_to), ("checked_against", &p.checked_against)] {
                for id in ids.iter().flatten() {
                    let row = file.rows.iter().find(|r| r.id == *id);
                    let row = row.unwrap_or_else(|| panic!("models/{chip}.toml: {name}.{list} names {id}, which is not a row of {path}"));
                    assert_eq!(row.chip, chip, "models/{chip}.toml: {name}.{list} names {id}, a row of chip {}", row.chip);
                    named += 1;
                }
            }
        }
    }
    assert!(named >= 20, "only {named} row ids named by the presets: the lists moved?");
}
