//! The measured time of a job, looked up in the shipped measurements: `tpusim run` and
//! `tpusim.simulate()` print it beside the prediction when a row of
//! `traces/measured/calibration.csv` (embedded in the binary) resolves to the very job they ran,
//! on a chip model whose parameters are the row's preset's. The lookup is by job, never by a
//! typed number or a named case.

use crate::measure::{parse, Measurement};
use std::sync::OnceLock;
use tpusim_chip::ChipModel;
use tpusim_job::{Job, Measured};

/// The file the shipped measurements come from (as the repository names it).
pub const SHIPPED_PATH: &str = "traces/measured/calibration.csv";

/// The shipped measurements' text (embedded at build time).
pub const SHIPPED: &str = include_str!("../../../traces/measured/calibration.csv");

struct Entry {
    /// Parameter hash of the row's chip preset.
    chip_hash: String,
    job: Job,
    row: Measurement,
}

/// Every shipped row that resolves to a job on its chip preset (rows of other chips, or that
/// the simulator cannot express, are left out), built once.
fn entries() -> &'static [Entry] {
    static ENTRIES: OnceLock<Vec<Entry>> = OnceLock::new();
    ENTRIES.get_or_init(|| {
        let Ok(file) = parse(SHIPPED, SHIPPED_PATH, &[]) else { return Vec::new() };
        file.rows
            .into_iter()
            .filter_map(|row| {
                let chip = ChipModel::preset(&row.chip).ok()?;
                let (spec, _) = row.job_spec(&row.chip).ok()?;
                let job = spec.build(&chip).ok()?;
                Some(Entry { chip_hash: chip.parameter_hash(), job, row })
            })
            .collect()
    })
}

/// The shipped measurement of `job` on `chip`, if a row resolves to the same job (every field
/// after defaults) on a chip model with the same parameters; `latency_ms` is the prediction the
/// error is computed for.
pub fn shipped_measurement(chip: &ChipModel, job: &Job, latency_ms: f64) -> Option<Measured> {
    let hash = chip.parameter_hash();
    let e = entries().iter().find(|e| e.chip_hash == hash && e.job == *job)?;
    Some(Measured {
        id: e.row.id.clone(),
        measured_ms: e.row.measured_ms,
        error: (latency_ms - e.row.measured_ms) / e.row.measured_ms,
        timing: e.row.timing.clone(),
        source: e.row.source.clone(),
        file: SHIPPED_PATH.to_string(),
    })
}

/// When `job` has a shipped row on the preset `chip` is named after but `chip`'s parameters
/// differ from the preset's (a `--set` what-if, or another file of that name), a note saying so:
/// the measurement is of the chip as built, so no error is given against this model.
pub fn what_if_measurement_note(chip: &ChipModel, job: &Job) -> Option<String> {
    let hash = chip.parameter_hash();
    let e = entries().iter().find(|e| e.row.chip == chip.name && e.chip_hash != hash && e.job == *job)?;
    Some(format!(
        "row {} of {} measured this job at {:.2} ms on the {} preset; this chip model's parameters differ from it (--set or another file), so the prediction is not compared with it",
        e.row.id, SHIPPED_PATH, e.row.measured_ms, e.row.chip
    ))
}

/// Puts on `report` (of `job` on `chip`) what the shipped measurements say of it: the measured
/// row ([`shipped_measurement`]), or else a note when the job has a row on the chip as built
/// ([`what_if_measurement_note`]). `tpusim run` and `tpusim.simulate` both call it.
pub fn attach_shipped_measurement(report: &mut tpusim_job::Report, chip: &ChipModel, job: &Job) {
    report.measured = shipped_measurement(chip, job, report.latency_ms);
    if report.measured.is_none() {
        report.notes.extend(what_if_measurement_note(chip, job));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tpusim_job::JobSpec;

    #[test]
    fn the_case_study_finds_its_row_and_a_changed_job_finds_none() {
        let chip = ChipModel::preset("v6e").unwrap();
        let job = tpusim_job::case_study().build(&chip).unwrap();
        let m = shipped_measurement(&chip, &job, 75.0).expect("the case study is a shipped row");
        assert_eq!((m.id.as_str(), m.measured_ms), ("VD-B0", 78.7));
        let other = JobSpec { block_q: Some(2048), ..tpusim_job::case_study() }.build(&chip).unwrap();
        assert!(shipped_measurement(&chip, &other, 75.0).is_none());
        // A what-if chip is not the chip that was measured.
        let fast = JobSpec { set: vec!["hbm.bandwidth_gb_per_s=3276".into()], ..Default::default() }.chip().unwrap();
        assert!(shipped_measurement(&fast, &job, 75.0).is_none());
        // ... and says so, naming the row the job has on the chip as built.
        let note = what_if_measurement_note(&fast, &job).expect("a note for the what-if chip");
        assert!(note.contains("row VD-B0") && note.contains("78.70 ms") && note.contains("differ"), "{note}");
        assert!(what_if_measurement_note(&chip, &job).is_none());
        assert!(what_if_measurement_note(&fast, &other).is_none());
    }
}
