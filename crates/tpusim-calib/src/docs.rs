//! The accuracy tables of the docs, generated: one command ([`command`]) runs one validation and
//! one cross-validation, writes the band file (with every row's held-out predictions) and
//! splices each table into README.md and VALIDATION.md between its markers
//! (`tpusim_io::mark::splice_markers`). The in-sample tables are re-derived by a fresh
//! validation (a second); the held-out ones from the band file, whose staleness test
//! ([`crate::bands::stale`]: the measurement file's hash, the chip models' hashes, every row's
//! in-sample error) says when the cross-validation must be run again. `tests/docs.rs` checks that
//! the shipped docs hold exactly what this module generates.

use crate::cv::CrossValidation;
use crate::fit::ErrorStats;
use crate::measure::MeasurementFile;
use crate::validate::{ChipSet, Validation};
use std::fmt::Write as _;
use tpusim_job::bands::BandFile;

/// The tag of the in-sample table (`tpusim validate --format markdown`), in VALIDATION.md.
pub const TAG_IN_SAMPLE: &str = "validate";
/// The tag of the cross-validation tables (`tpusim validate --cv --format markdown`).
pub const TAG_CV: &str = "validate-cv";
/// The tag of the band tables (`tpusim validate --bands --format markdown`).
pub const TAG_BANDS: &str = "validate-bands";
/// The tag of README.md's summary: the case-study rows and the per-chip figures.
pub const TAG_SUMMARY: &str = "accuracy";
/// Marker tag of VALIDATION.md's table of the chips' `[fitted]` parameters.
pub const TAG_PARAMS: &str = "fitted-params";

/// The chips of the fitted-parameter table, in its order.
pub const PARAM_CHIPS: &[&str] = &["v6e", "v7x", "v5p", "v5e", "v4"];

/// A Markdown table of every chip's `[fitted]` parameters as its model file states them: a value
/// fitted to the chip's own rows in bold with the 95% interval its note records, a value carried
/// from another chip's fit named so, any other value with where its note says it comes from
/// (the first sentence after a "No rows" / "Not fitted" lead). `rows` counts the calibration rows
/// the chip's fitted values were fitted to.
///
/// # Errors
/// The chip's error when a model cannot be loaded.
pub fn params_table(chips: &ChipSet) -> Result<String, String> {
    let mut s = String::from(
        "| chip | rows | VALU (8,128)-register ops / cycle | EUP registers / cycle | XLU cycles / register | loaded-mask ops / register | grid-step overhead, cycles |\n|---|---:|---|---|---|---|---|\n",
    );
    // Values as the model file writes them (the shortest text that reads back the same number).
    let num = |v: f64| v.to_string();
    for name in PARAM_CHIPS {
        let chip = chips.chip_for(name)?;
        let f = &chip.fitted;
        let params = [&f.valu_vreg_ops_per_cycle, &f.eup_vregs_per_cycle, &f.xlu_cycles_per_vreg, &f.loaded_mask_ops_per_vreg, &f.grid_step_overhead_cycles];
        let rows = params.iter().filter_map(|p| p.fitted_to.as_ref()).map(Vec::len).max().unwrap_or(0);
        let cells: Vec<String> = params
            .iter()
            .map(|p| {
                let note = p.note.as_deref().unwrap_or("");
                if p.fitted_to.as_ref().is_some_and(|r| !r.is_empty()) {
                    let ci = note.split("95% confidence interval ").nth(1).and_then(|r| r.split(';').next()).map(|r| format!(" ({r})")).unwrap_or_default();
                    format!("**{}**{ci}", num(p.value))
                } else if let Some(from) = note.split("Carried from ").nth(1).and_then(|r| r.split("'s").next()) {
                    format!("{} carried from {from}", num(p.value))
                } else {
                    // The reason: the note's sentence after its "No v4 rows." / "Not fitted: ..." lead.
                    let why = note.strip_prefix(&format!("No {name} rows. ")).unwrap_or(note);
                    let why = why.split(". ").next().unwrap_or("").trim_end_matches('.');
                    if why.is_empty() { num(p.value) } else { format!("{}: {why}", num(p.value)) }
                }
            })
            .collect();
        let _ = writeln!(s, "| {name} | {rows} | {} |", cells.join(" | "));
    }
    Ok(s)
}

/// The rows README.md's summary shows one by one (the video-diffusion case study's), with the
/// words it shows them under, and the pair whose ratio it quotes as the sparse kernel's speedup.
/// A choice of what to show, not of what to predict: every row is predicted alike.
pub const CASE_STUDY_ROWS: &[(&str, &str)] = &[
    ("VD-B0", "VD-B0 dense Splash, 75,600 tokens"),
    ("VD-B2-3328", "VD-B2 sparse, partial tiles masked"),
    ("VD-B3", "VD-B3 sparse, tile-aligned"),
];
/// (dense row, sparse row) of the quoted speedup.
pub const CASE_STUDY_SPEEDUP: (&str, &str) = ("VD-B0", "VD-B3");

/// The command that regenerates the band file and every table, for the measurement file `path`.
pub fn command(path: &str) -> String {
    format!(
        "tpusim validate {path} --bands --out {} --into README.md --into traces/measured/VALIDATION.md",
        tpusim_job::bands::BANDS_PATH
    )
}

fn pct_abs(e: Option<ErrorStats>) -> String {
    e.map_or("-".to_string(), |e| format!("{:.1}% / {:.1}%", e.median_abs_error * 100.0, e.worst_abs_error * 100.0))
}

/// In-sample |error| figures of the validated rows that `keep` selects.
fn in_sample_stats(v: &Validation, keep: &dyn Fn(&str, &str) -> bool) -> (usize, Option<ErrorStats>) {
    let (p, m): (Vec<f64>, Vec<f64>) = v.rows.iter().filter(|r| keep(&r.chip, &r.id)).map(|r| (r.predicted_ms, r.measured_ms)).unzip();
    (p.len(), ErrorStats::of(&p, &m))
}

/// Leave-one-out |error| figures of the cross-validated rows that `keep` selects.
fn held_out_stats(cv: &CrossValidation, keep: &dyn Fn(&str, &str) -> bool) -> Option<ErrorStats> {
    let (p, m): (Vec<f64>, Vec<f64>) =
        cv.rows.iter().filter(|r| keep(&r.chip, &r.id)).filter_map(|r| r.loo_ms.map(|l| (l, r.measured_ms))).unzip();
    ErrorStats::of(&p, &m)
}

/// README.md's summary: the case-study rows (measured, predicted, error), the speedup they
/// imply, and per chip, per direction and over all rows the in-sample (this validation) and
/// leave-one-out (the cross-validation) median / worst |error|.
pub fn summary(file: &MeasurementFile, v: &Validation, cv: &CrossValidation) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "| case | measured | predicted | error |");
    let _ = writeln!(s, "|---|---|---|---|");
    let row = |id: &str| v.rows.iter().find(|r| r.id == id);
    for (id, words) in CASE_STUDY_ROWS {
        if let Some(r) = row(id) {
            let _ = writeln!(
                s,
                "| {words} ({}) | {:.2} ms | {:.2} ms | {:+.1}% |",
                r.blocks,
                r.measured_ms,
                r.predicted_ms,
                r.error * 100.0
            );
        }
    }
    if let (Some(d), Some(a)) = (row(CASE_STUDY_SPEEDUP.0), row(CASE_STUDY_SPEEDUP.1)) {
        let (m, p) = (d.measured_ms / a.measured_ms, d.predicted_ms / a.predicted_ms);
        let _ = writeln!(s, "| {} / {} speedup | {m:.2}x | {p:.2}x | {:+.1}% |", CASE_STUDY_SPEEDUP.0, CASE_STUDY_SPEEDUP.1, (p / m - 1.0) * 100.0);
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "| rows | n | in sample: median / worst | held out (leave-one-out): median / worst |");
    let _ = writeln!(s, "|---|---|---|---|");
    // Library kernels read from their IR are never fitted: their rows have a table of their own
    // below. Microbenchmark rows (read from their IR too) are fitted first: a line of their own.
    let described = |id: &str| file.rows.iter().any(|m| m.id == id && m.kernel_ir.is_some());
    let mechanism = |id: &str| file.rows.iter().any(|m| m.id == id && m.kernel_word.starts_with(crate::fit::MECHANISM_KERNEL_PREFIX));
    let mut chips: Vec<&str> = Vec::new();
    for r in v.rows.iter().filter(|r| !described(&r.id)) {
        if !chips.contains(&r.chip.as_str()) {
            chips.push(&r.chip);
        }
    }
    let kernels_of = |chip: &str| {
        let mut k: Vec<&str> = Vec::new();
        for r in v.rows.iter().filter(|r| r.chip == chip && !described(&r.id)) {
            if !k.contains(&r.kernel.as_str()) {
                k.push(&r.kernel);
            }
        }
        k.join(", ")
    };
    let direction = |id: &str| file.rows.iter().find(|m| m.id == id).and_then(|m| m.direction).map(|d| d.to_string());
    let mut line = |label: String, keep: &dyn Fn(&str, &str) -> bool| {
        let (n, ins) = in_sample_stats(v, keep);
        if n > 0 {
            let _ = writeln!(s, "| {label} | {n} | {} | {} |", pct_abs(ins), pct_abs(held_out_stats(cv, keep)));
        }
    };
    for c in &chips {
        line(format!("{c} ({})", kernels_of(c)), &|chip, id| chip == *c && !described(id));
    }
    for c in &chips {
        line(format!("{c} microbenchmarks (the step and DMA mechanisms, fitted first)"), &|chip, id| chip == *c && mechanism(id));
    }
    let mut dirs: Vec<String> = Vec::new();
    for r in &v.rows {
        if let Some(d) = direction(&r.id) {
            if !dirs.contains(&d) {
                dirs.push(d);
            }
        }
    }
    if dirs.len() > 1 {
        for d in &dirs {
            line(format!("attention {d}"), &|_, id| direction(id).as_deref() == Some(d.as_str()));
        }
    }
    // Every row the fit and the cross-validation take (`validate --cv`'s "all rows"): the
    // library rows and the mechanism rows; the other described rows only judge (below).
    line("all rows".to_string(), &|_, id| !described(id) || mechanism(id));
    described_families(&mut s, file, v);
    s
}

/// The rows of kernels read from their IR (`kernel_ir`), per kernel family and chip: never
/// fitted, so every prediction is held out. A family with fewer than [`tpusim_job::bands::MIN_ROWS`]
/// rows on a chip is not covered (no band is claimed from it).
fn described_families(s: &mut String, file: &MeasurementFile, v: &Validation) {
    let mut groups: Vec<(String, String)> = Vec::new();
    for m in file.rows.iter().filter(|m| m.kernel_ir.is_some() && !m.kernel_word.starts_with(crate::fit::MECHANISM_KERNEL_PREFIX)) {
        let g = (m.kernel_word.clone(), m.chip.clone());
        if !groups.contains(&g) {
            groups.push(g);
        }
    }
    if groups.is_empty() {
        return;
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "| kernel read from its IR (never fitted) | chip | n | median / worst \\|error\\| | median signed |");
    let _ = writeln!(s, "|---|---|---|---|---|");
    for (family, chip) in groups {
        let rows: Vec<&crate::validate::PredictedRow> = v.rows.iter().filter(|r| r.kernel == family && r.chip == chip).collect();
        let (p, m): (Vec<f64>, Vec<f64>) = rows.iter().map(|r| (r.predicted_ms, r.measured_ms)).unzip();
        let mut signed: Vec<f64> = rows.iter().map(|r| r.error).collect();
        signed.sort_by(f64::total_cmp);
        let median = signed.get(signed.len() / 2).map_or("-".to_string(), |e| format!("{:+.1}%", e * 100.0));
        let covered = if rows.len() < tpusim_job::bands::MIN_ROWS { " (not covered: fewer than 5 rows)" } else { "" };
        let _ = writeln!(s, "| {family}{covered} | {chip} | {} | {} | {median} |", rows.len(), pct_abs(ErrorStats::of(&p, &m)));
    }
}

/// Every generated part, `(tag, Markdown)`: the in-sample table, the cross-validation tables,
/// the band tables and README.md's summary.
pub fn parts(file: &MeasurementFile, v: &Validation, cv: &CrossValidation, bands: &BandFile, chips: &ChipSet) -> Result<Vec<(&'static str, String)>, crate::CalibError> {
    Ok(vec![
        (TAG_IN_SAMPLE, v.to_markdown()),
        (TAG_CV, cv.to_table(true)),
        (TAG_BANDS, crate::bands::to_markdown(bands, file, cv)),
        (TAG_SUMMARY, summary(file, v, cv)),
        (TAG_PARAMS, params_table(chips).map_err(crate::CalibError::Input)?),
    ])
}

/// The parts the shipped band file and a fresh validation give, as [`parts`] (what the docs
/// must hold while the band file is not stale).
///
/// # Errors
/// [`crate::CalibError::Input`] from [`CrossValidation::from_band_file`].
pub fn parts_from_band_file(file: &MeasurementFile, chips: &ChipSet, bands: &BandFile) -> Result<Vec<(&'static str, String)>, crate::CalibError> {
    let cv = CrossValidation::from_band_file(file, chips, bands)?;
    let v = crate::validate::validate(file, chips);
    parts(file, &v, &cv, bands, chips)
}
