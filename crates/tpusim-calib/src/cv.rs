//! Out-of-sample judgement of the chip models (`tpusim validate --cv`): for every chip with rows
//! in a measurement file, its `[fitted]` parameters are refitted ([`crate::calibrate`]) on all of
//! its rows but one (leave-one-out) and on all of its head_dim groups but one, and each held-out
//! row is predicted by the model that never saw it.

use crate::fit::{calibrate, CalibrateOptions, ErrorStats};
use crate::measure::MeasurementFile;
use crate::stats::median;
use crate::validate::{ChipSet, Usage};
use crate::CalibError;
use serde::Serialize;
use tpusim_job::bands::BandFile;
use std::fmt::Write as _;

/// One row's in-sample and held-out predictions.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CvRow {
    /// Row id.
    pub id: String,
    /// Chip column.
    pub chip: String,
    /// Kernel column.
    pub kernel: String,
    /// Direction column.
    pub direction: String,
    /// Measured, ms.
    pub measured_ms: f64,
    /// Predicted by the chip fitted to all of its rows, ms.
    pub fitted_ms: f64,
    /// Predicted by the chip fitted without this row, ms.
    pub loo_ms: Option<f64>,
    /// Predicted by the chip fitted without this row's head_dim group, ms.
    pub group_ms: Option<f64>,
}

/// Held-out error figures over a set of rows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CvSummary {
    /// What the rows are (a chip, "tokamax rows", "all rows").
    pub name: String,
    /// Rows.
    pub rows: usize,
    /// In-sample |error| (fitted to all rows).
    pub fitted: Option<ErrorStats>,
    /// Leave-one-out |error|.
    pub loo: Option<ErrorStats>,
    /// Head_dim-group-out |error|.
    pub group: Option<ErrorStats>,
}

/// The outcome of `validate --cv`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CrossValidation {
    /// The measurement file.
    pub file: String,
    /// Per row.
    pub rows: Vec<CvRow>,
    /// Rows not used (chips without a model, rows the simulator cannot express): id and reason.
    pub unused: Vec<(String, String)>,
    /// Per chip, then the tokamax rows, then all rows.
    pub summaries: Vec<CvSummary>,
    /// Which chip model each chip's rows were refitted from, and `--chip` models that matched no
    /// row.
    pub chip_models: Usage,
}

fn stats(pairs: impl Iterator<Item = (Option<f64>, f64)>) -> Option<ErrorStats> {
    let (p, m): (Vec<f64>, Vec<f64>) = pairs.filter_map(|(p, m)| p.map(|p| (p, m))).unzip();
    ErrorStats::of(&p, &m)
}

fn summary(name: &str, rows: &[&CvRow]) -> CvSummary {
    CvSummary {
        name: name.to_string(),
        rows: rows.len(),
        fitted: stats(rows.iter().map(|r| (Some(r.fitted_ms), r.measured_ms))),
        loo: stats(rows.iter().map(|r| (r.loo_ms, r.measured_ms))),
        group: stats(rows.iter().map(|r| (r.group_ms, r.measured_ms))),
    }
}

/// Cross-validates every chip of `file` (module docs); chips come from `chips` (replacement
/// models by name) or their presets.
///
/// # Errors
/// [`CalibError::Input`] when no chip of the file has a row the simulator can express.
pub fn cross_validate(file: &MeasurementFile, chips: &ChipSet) -> Result<CrossValidation, CalibError> {
    let mut names: Vec<&str> = Vec::new();
    for m in &file.rows {
        if !names.contains(&m.chip.as_str()) {
            names.push(&m.chip);
        }
    }
    let mut rows = Vec::new();
    let mut unused = Vec::new();
    let opts = CalibrateOptions { params: Vec::new(), cross_validate: true, date: Some("cross-validation".into()) };
    for name in names {
        let chip = match chips.chip_for(name) {
            Ok(c) => c,
            Err(e) => {
                for m in file.rows.iter().filter(|m| m.chip == name) {
                    unused.push((m.id.clone(), e.clone()));
                }
                continue;
            }
        };
        let cal = match calibrate(file, &chip, name, &opts) {
            Ok(c) => c,
            Err(CalibError::Input(reason)) => {
                for m in file.rows.iter().filter(|m| m.chip == name) {
                    unused.push((m.id.clone(), reason.clone()));
                }
                continue;
            }
            Err(e) => return Err(e),
        };
        for u in &cal.unused {
            if file.rows.iter().any(|m| m.id == u.id && m.chip == name) {
                unused.push((u.id.clone(), u.reason.clone()));
            }
        }
        for r in &cal.rows {
            let m = file.rows.iter().find(|m| m.id == r.id).expect("a fitted row comes from the file");
            rows.push(CvRow {
                id: r.id.clone(),
                chip: name.to_string(),
                kernel: m.kernel_word.clone(),
                direction: m.direction.map_or_else(|| "-".to_string(), |d| d.to_string()),
                measured_ms: r.measured_ms,
                fitted_ms: r.after_ms,
                loo_ms: r.held_out_ms,
                group_ms: r.held_out_group_ms,
            });
        }
    }
    if rows.is_empty() {
        return Err(CalibError::Input(format!("{}: no row the simulator can express; nothing to cross-validate", file.path)));
    }
    Ok(CrossValidation::assemble(file, rows, unused, chips))
}

impl CrossValidation {
    /// The cross-validation of `file` from its rows' predictions: summaries per chip (in row
    /// order), over the tokamax rows and over all rows.
    fn assemble(file: &MeasurementFile, rows: Vec<CvRow>, unused: Vec<(String, String)>, chips: &ChipSet) -> CrossValidation {
        let mut summaries = Vec::new();
        let mut chips_seen: Vec<&str> = Vec::new();
        for r in &rows {
            if !chips_seen.contains(&r.chip.as_str()) {
                chips_seen.push(&r.chip);
            }
        }
        for c in chips_seen {
            let of: Vec<&CvRow> = rows.iter().filter(|r| r.chip == c).collect();
            summaries.push(summary(c, &of));
        }
        let tk: Vec<&CvRow> = rows.iter().filter(|r| r.kernel == "tokamax-splash").collect();
        if !tk.is_empty() {
            summaries.push(summary("tokamax rows", &tk));
        }
        summaries.push(summary("all rows", &rows.iter().collect::<Vec<_>>()));
        CrossValidation { file: file.path.clone(), rows, unused, summaries, chip_models: chips.usage(file) }
    }

    /// The cross-validation a band file records ([`BandFile::held_out`], written by
    /// `tpusim validate --bands`), rebuilt without refitting: the docs' held-out tables come from
    /// it, checked by the band file's staleness test.
    ///
    /// # Errors
    /// [`CalibError::Input`] when the band file names a row `file` does not have, or has none.
    pub fn from_band_file(file: &MeasurementFile, chips: &ChipSet, bands: &BandFile) -> Result<CrossValidation, CalibError> {
        if bands.held_out.is_empty() {
            return Err(CalibError::Input(format!("the band file of {} records no held-out predictions: regenerate it with `{}`", bands.measurements, bands.generated_by)));
        }
        let mut rows = Vec::new();
        for h in &bands.held_out {
            let m = file.rows.iter().find(|m| m.id == h.id).ok_or_else(|| {
                CalibError::Input(format!("the band file names row {}, which {} does not have: regenerate it with `{}`", h.id, file.path, bands.generated_by))
            })?;
            rows.push(CvRow {
                id: h.id.clone(),
                chip: m.chip.clone(),
                kernel: m.kernel_word.clone(),
                direction: m.direction.map_or_else(|| "-".to_string(), |d| d.to_string()),
                measured_ms: m.measured_ms,
                fitted_ms: h.fitted_ms,
                loo_ms: h.loo_ms,
                group_ms: h.group_ms,
            });
        }
        Ok(CrossValidation::assemble(file, rows, bands.not_used.clone(), chips))
    }
}

fn pct(e: f64) -> String {
    format!("{:+.1}%", e * 100.0)
}

impl CrossValidation {
    /// The median leave-one-out |error| of a summary by name.
    pub fn loo_median(&self, name: &str) -> Option<f64> {
        self.summaries.iter().find(|s| s.name == name)?.loo.map(|e| e.median_abs_error)
    }

    /// JSON: one object (errors as fractions).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a cross-validation serialises")
    }

    /// Per-row table and summaries, for people (`markdown`: as Markdown tables).
    pub fn to_table(&self, markdown: bool) -> String {
        let mut s = String::new();
        let err = |p: Option<f64>, m: f64| p.map_or("-".to_string(), |p| pct(p / m - 1.0));
        let ms = |p: Option<f64>| p.map_or("-".to_string(), |p| format!("{p:.4}"));
        let head =
            ["id", "chip", "direction", "measured ms", "fitted ms", "err", "leave-one-out ms", "err", "head_dim-group-out ms", "err"];
        let lines: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|r| {
                vec![
                    r.id.clone(),
                    r.chip.clone(),
                    r.direction.clone(),
                    format!("{:.4}", r.measured_ms),
                    format!("{:.4}", r.fitted_ms),
                    err(Some(r.fitted_ms), r.measured_ms),
                    ms(r.loo_ms),
                    err(r.loo_ms, r.measured_ms),
                    ms(r.group_ms),
                    err(r.group_ms, r.measured_ms),
                ]
            })
            .collect();
        let abs = |e: &Option<ErrorStats>| {
            e.map_or("-".to_string(), |e| format!("{:.1}% / {:.1}%", e.median_abs_error * 100.0, e.worst_abs_error * 100.0))
        };
        let shead = ["rows", "n", "fitted median / worst", "leave-one-out median / worst", "head_dim-group-out median / worst"];
        let slines: Vec<Vec<String>> =
            self.summaries.iter().map(|x| vec![x.name.clone(), x.rows.to_string(), abs(&x.fitted), abs(&x.loo), abs(&x.group)]).collect();
        if markdown {
            for (h, ls) in [(&head[..], &lines), (&shead[..], &slines)] {
                let _ = writeln!(s, "| {} |", h.join(" | "));
                let _ = writeln!(s, "|{}|", h.iter().map(|_| "---").collect::<Vec<_>>().join("|"));
                for l in ls {
                    let _ = writeln!(s, "| {} |", l.join(" | "));
                }
                let _ = writeln!(s);
            }
        } else {
            let _ = writeln!(s, "tpusim validate --cv: {} (each chip's [fitted] parameters refitted without the held-out rows)", self.file);
            let _ = writeln!(s);
            for (h, ls) in [(&head[..], &lines), (&shead[..], &slines)] {
                let widths: Vec<usize> =
                    (0..h.len()).map(|i| ls.iter().map(|l| l[i].len()).chain([h[i].len()]).max().unwrap_or(0)).collect();
                let row = |cells: Vec<String>| {
                    cells
                        .iter()
                        .enumerate()
                        .map(|(i, c)| if i == 0 { format!("{c:<w$}", w = widths[i]) } else { format!("{c:>w$}", w = widths[i]) })
                        .collect::<Vec<_>>()
                        .join("  ")
                };
                let _ = writeln!(s, "{}", row(h.iter().map(|x| x.to_string()).collect()));
                for l in ls {
                    let _ = writeln!(s, "{}", row(l.clone()));
                }
                let _ = writeln!(s);
            }
        }
        let _ = writeln!(s, "chip models (each refitted from):");
        for l in self.chip_models.lines() {
            let _ = writeln!(s, "{}{l}", if markdown { "- " } else { "  " });
        }
        let _ = writeln!(s);
        if !self.unused.is_empty() {
            let _ = writeln!(s, "not used ({} rows):", self.unused.len());
            // Rows that share a reason (the kernels read from their IR: every one is validated,
            // none fitted) are said once, with their number and first id.
            let mut said: Vec<&str> = Vec::new();
            for (id, why) in &self.unused {
                let n = self.unused.iter().filter(|(_, w)| w == why).count();
                if n < 3 {
                    let _ = writeln!(s, "  {id}: {why}");
                } else if !said.contains(&why.as_str()) {
                    said.push(why);
                    let _ = writeln!(s, "  {n} rows ({id}, ...): {why}");
                }
            }
        }
        let all: Vec<f64> = self.rows.iter().filter_map(|r| r.loo_ms.map(|p| (p / r.measured_ms - 1.0).abs())).collect();
        if let Some(m) = median(&all) {
            let _ = writeln!(s, "leave-one-out median |error| over all rows: {:.1}%", m * 100.0);
        }
        s
    }
}
