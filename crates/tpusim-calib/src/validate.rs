//! Validation: predict every row of a measurement file and compare with the measured times.

use crate::measure::{Measurement, MeasurementFile};
use crate::stats::{mean, median, PairCounts};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use tpusim_chip::ChipModel;
use tpusim_job::{run, Job, Report};

/// Chip models to use instead of a row's `chip`: a row whose `chip` equals a model's `name` is
/// predicted on that model (e.g. a calibrated `my-v6e.toml` named `v6e`); other rows load their
/// chip by preset name or path. Build it with [`ChipSet::new`], which refuses two models with
/// one name.
#[derive(Debug, Clone, Default)]
pub struct ChipSet {
    /// Replacement models, matched by name.
    pub models: Vec<ChipModel>,
}

/// One chip model and the rows of a measurement file it serves.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelUse {
    /// Which model (name, source, overrides, parameter hash).
    pub model: tpusim_chip::ChipIdentity,
    /// Whether it was given with `--chip` (else the row's `chip` column named it: a preset or a
    /// chip TOML path).
    pub given: bool,
    /// The value of the `chip` column that selects it.
    pub chip: String,
    /// Ids of the rows whose `chip` column selects it, predicted or not, in file order.
    pub rows: Vec<String>,
}

/// A `--chip` model that no row of the file selects.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UnmatchedModel {
    /// Which model.
    pub model: tpusim_chip::ChipIdentity,
    /// The chip names the file's rows use, for comparison with the model's `name`.
    pub file_chips: Vec<String>,
}

/// Which model serves which rows ([`ChipSet::usage`]).
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct Usage {
    /// Every model that serves a row, given ones first, then the presets and files the rows name.
    pub used: Vec<ModelUse>,
    /// `--chip` models that serve no row.
    pub unmatched: Vec<UnmatchedModel>,
}

impl ChipSet {
    /// The replacement models, checked: two models with the same `name` would make the rows of
    /// that chip ambiguous.
    ///
    /// # Errors
    /// [`crate::CalibError::Input`] naming both models' sources and the shared name.
    pub fn new(models: Vec<ChipModel>) -> Result<ChipSet, crate::CalibError> {
        for (i, a) in models.iter().enumerate() {
            if let Some(b) = models[..i].iter().find(|b| b.name == a.name) {
                return Err(crate::CalibError::Input(format!(
                    "--chip {} and --chip {} are both named '{}': a row of chip {} could use either; give one model per chip name (rename one with its `name` key)",
                    b.provenance.source, a.provenance.source, a.name, a.name
                )));
            }
        }
        Ok(ChipSet { models })
    }

    /// The chip for a row.
    ///
    /// # Errors
    /// The chip model's error (unknown preset, unreadable or invalid file).
    pub fn chip_for(&self, name: &str) -> Result<ChipModel, String> {
        match self.models.iter().find(|c| c.name == name) {
            Some(c) => Ok(c.clone()),
            None => ChipModel::load(name).map_err(|e| e.to_string()),
        }
    }

    /// Which model serves which rows of `file`: each given model with the rows whose `chip`
    /// equals its name; each chip name no given model has, with its preset or file (the
    /// fallback); and the given models no row selects.
    pub fn usage(&self, file: &MeasurementFile) -> Usage {
        let mut names: Vec<&str> = Vec::new();
        for m in &file.rows {
            if !names.contains(&m.chip.as_str()) {
                names.push(&m.chip);
            }
        }
        let ids = |name: &str| file.rows.iter().filter(|m| m.chip == name).map(|m| m.id.clone()).collect::<Vec<_>>();
        let mut u = Usage::default();
        for c in &self.models {
            if names.contains(&c.name.as_str()) {
                u.used.push(ModelUse { model: c.identity(), given: true, chip: c.name.clone(), rows: ids(&c.name) });
            } else {
                u.unmatched.push(UnmatchedModel { model: c.identity(), file_chips: names.iter().map(|n| n.to_string()).collect() });
            }
        }
        for name in names {
            if self.models.iter().any(|c| c.name == name) {
                continue;
            }
            // Unloadable chips are rejected when the file is read; a row that still fails keeps
            // its reason among the skipped rows.
            if let Ok(c) = ChipModel::load(name) {
                u.used.push(ModelUse { model: c.identity(), given: false, chip: name.to_string(), rows: ids(name) });
            }
        }
        u
    }
}

impl Usage {
    /// One line per model: which rows it served, and which `--chip` models served none.
    pub fn lines(&self) -> Vec<String> {
        let any_given = self.used.iter().any(|m| m.given) || !self.unmatched.is_empty();
        let mut out = Vec::new();
        for m in &self.used {
            let n = m.rows.len();
            let why = match (m.given, any_given) {
                (true, _) => " (--chip)".to_string(),
                (false, true) => format!(" (no --chip model is named {}: {})", m.chip, fallback(&m.model)),
                (false, false) => String::new(),
            };
            out.push(format!("{}: the {n} row{} of chip {}{why}", m.model, if n == 1 { "" } else { "s" }, m.chip));
        }
        for m in &self.unmatched {
            out.push(format!(
                "{} (--chip) matched no row: no row's chip is {}; the file's chips are {}",
                m.model,
                m.model.name,
                m.file_chips.join(", ")
            ));
        }
        out
    }
}

fn fallback(id: &tpusim_chip::ChipIdentity) -> &'static str {
    if id.source == "preset" {
        "its preset"
    } else {
        "the chip TOML the rows name"
    }
}

/// A row the simulator predicted.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PredictedRow {
    /// Row id.
    pub id: String,
    /// Line in the file.
    pub line: u64,
    /// Chip column.
    pub chip: String,
    /// Kernel column.
    pub kernel: String,
    /// Predicted time, ms.
    pub predicted_ms: f64,
    /// Measured time, ms.
    pub measured_ms: f64,
    /// (predicted - measured) / measured.
    pub error: f64,
    /// The unit bounding the simulated run.
    pub bottleneck: String,
    /// Block sizes simulated, `block_q/block_kv/block_kv_compute` (matmul: `block_m/block_n/block_k`).
    pub blocks: String,
    /// Why the row's blocks were assumed, when they were.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The parameter hash of the chip model that predicted it (see [`Validation::chip_models`]).
    pub chip_hash: String,
}

/// A row that was not predicted, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SkippedRow {
    /// Row id.
    pub id: String,
    /// Line in the file.
    pub line: u64,
    /// Chip column.
    pub chip: String,
    /// Kernel column.
    pub kernel: String,
    /// Measured time, ms.
    pub measured_ms: f64,
    /// Why the simulator cannot express it.
    pub reason: String,
}

/// Rows that differ only in block sizes or kernel options, and whether the simulator orders them
/// as the measurements do.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankGroup {
    /// What the rows share (chip, kernel family, workload shape, mask).
    pub key: String,
    /// Row ids, fastest measured first.
    pub ids: Vec<String>,
    /// Kendall's tau-b between predicted and measured times (`None` when undefined: all tied).
    pub kendall_tau: Option<f64>,
    /// Pair counts behind it.
    pub pairs: PairCounts,
    /// Every pair ordered as measured (no discordant pair, no predicted tie of distinct times).
    pub ranking_matches: bool,
}

/// Worst row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Worst {
    /// Row id.
    pub id: String,
    /// Signed error.
    pub error: f64,
}

/// Error summary over the predicted rows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// Rows in the file.
    pub rows: usize,
    /// Rows predicted.
    pub predicted: usize,
    /// Rows skipped.
    pub skipped: usize,
    /// Median of |error| (fraction).
    pub median_abs_error: Option<f64>,
    /// Mean of |error| (fraction): the mean absolute percentage error / 100.
    pub mean_abs_error: Option<f64>,
    /// Mean signed error (bias).
    pub mean_signed_error: Option<f64>,
    /// Root mean square of ln(predicted / measured).
    pub rms_log_error: Option<f64>,
    /// The row with the largest |error|.
    pub worst: Option<Worst>,
    /// Ranking groups (two rows or more).
    pub groups: usize,
    /// Groups whose predicted ranking matches the measured one.
    pub groups_ranking_matches: usize,
    /// Kendall's tau-a over all within-group pairs: (concordant - discordant) / pairs.
    pub pooled_kendall_tau: Option<f64>,
}

/// The outcome of validating a measurement file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Validation {
    /// The file.
    pub file: String,
    /// Predicted rows, in file order.
    pub rows: Vec<PredictedRow>,
    /// Skipped rows with their reasons, in file order.
    pub skipped: Vec<SkippedRow>,
    /// Ranking groups.
    pub groups: Vec<RankGroup>,
    /// Error summary.
    pub summary: Summary,
    /// Which chip model predicted which rows, and `--chip` models that matched no row.
    pub chip_models: Usage,
}

fn blocks_of(job: &Job) -> String {
    match job {
        // A backward-only row names its dkv (or fused) kernel's blocks, as its CSV columns do.
        Job::Attention { config: c, direction: tpusim_kernel::Direction::Bwd, .. } => {
            format!("{}/{}/{}", c.bwd.block_q_dkv, c.bwd.block_kv_dkv, c.bwd.block_kv_dkv_compute)
        }
        Job::Attention { config: c, .. } => format!("{}/{}/{}", c.block_q, c.block_kv, c.block_kv_compute),
        Job::Matmul { config: c, .. } => format!("{}/{}/{}", c.block_m, c.block_n, c.block_k),
        // A measurement row names a hand-modelled family; a described kernel's blocks are its own.
        Job::Described(_) => String::new(),
    }
}

/// Predicts one row: `Ok` with the prediction, or `Err` with the reason it is skipped (the
/// kernel is not expressible, or the simulator rejects the configuration, e.g. a tiling that
/// does not fit VMEM).
///
/// # Errors
/// The reason, as text.
pub fn predict(m: &Measurement, chips: &ChipSet) -> Result<PredictedRow, String> {
    let chip = chips.chip_for(&m.chip)?;
    let (job, note) = match m.described_spec() {
        // A described row's errors name its columns (`kernel_ir`, `runtime`) as the CSV does.
        Some(spec) => (spec.build(&chip).map_err(|e| tpusim_job::render_fields(&e.to_string(), tpusim_job::FieldStyle::Key))?, None),
        None => {
            let (spec, note) = m.job_spec(&m.chip)?;
            (spec.build(&chip).map_err(|e| format!("the simulator rejects this row: {e}"))?, note)
        }
    };
    let r = run(&chip, &job).map_err(|e| format!("the simulator rejects this configuration: {e}"))?;
    let rep = Report::from_run(&r);
    Ok(PredictedRow {
        id: m.id.clone(),
        line: m.line,
        chip: m.chip.clone(),
        kernel: m.kernel_word.clone(),
        predicted_ms: rep.latency_ms,
        measured_ms: m.measured_ms,
        error: (rep.latency_ms - m.measured_ms) / m.measured_ms,
        bottleneck: rep.bottleneck.to_string(),
        blocks: blocks_of(&r.job),
        note,
        chip_hash: chip.parameter_hash(),
    })
}

/// Error summary of predicted rows.
pub fn summarize(rows: &[PredictedRow], skipped: usize, groups: &[RankGroup]) -> Summary {
    let abs: Vec<f64> = rows.iter().map(|r| r.error.abs()).collect();
    let signed: Vec<f64> = rows.iter().map(|r| r.error).collect();
    let logs: Vec<f64> = rows.iter().map(|r| (r.predicted_ms / r.measured_ms).ln().powi(2)).collect();
    let worst = rows.iter().max_by(|a, b| a.error.abs().total_cmp(&b.error.abs())).map(|r| Worst { id: r.id.clone(), error: r.error });
    let (c, d, n) = groups.iter().fold((0u64, 0u64, 0u64), |(c, d, n), g| {
        let p = &g.pairs;
        (c + p.concordant, d + p.discordant, n + p.concordant + p.discordant + p.ties_x + p.ties_y + p.ties_xy)
    });
    Summary {
        rows: rows.len() + skipped,
        predicted: rows.len(),
        skipped,
        median_abs_error: median(&abs),
        mean_abs_error: mean(&abs),
        mean_signed_error: mean(&signed),
        rms_log_error: mean(&logs).map(f64::sqrt),
        worst,
        groups: groups.len(),
        groups_ranking_matches: groups.iter().filter(|g| g.ranking_matches).count(),
        pooled_kendall_tau: if n > 0 { Some((c as f64 - d as f64) / n as f64) } else { None },
    }
}

/// Ranking groups of the predicted rows: rows with the same [`Measurement::group_key`], two or more.
pub fn rank_groups(file: &MeasurementFile, rows: &[PredictedRow]) -> Vec<RankGroup> {
    let mut by_key: BTreeMap<String, Vec<&PredictedRow>> = BTreeMap::new();
    for m in &file.rows {
        if let (Some(key), Some(p)) = (m.group_key(), rows.iter().find(|r| r.id == m.id)) {
            by_key.entry(key).or_default().push(p);
        }
    }
    by_key
        .into_iter()
        .filter(|(_, v)| v.len() >= 2)
        .map(|(key, mut v)| {
            v.sort_by(|a, b| a.measured_ms.total_cmp(&b.measured_ms));
            let pred: Vec<f64> = v.iter().map(|r| r.predicted_ms).collect();
            let meas: Vec<f64> = v.iter().map(|r| r.measured_ms).collect();
            let pairs = PairCounts::of(&pred, &meas);
            RankGroup {
                key,
                ids: v.iter().map(|r| r.id.clone()).collect(),
                kendall_tau: pairs.tau_b(),
                ranking_matches: pairs.discordant == 0 && pairs.ties_x == 0,
                pairs,
            }
        })
        .collect()
}

/// Predicts every row of a file (skipped rows keep their reason) and summarises the errors.
pub fn validate(file: &MeasurementFile, chips: &ChipSet) -> Validation {
    use rayon::prelude::*;
    let mut rows = Vec::new();
    let mut skipped = Vec::new();
    // Rows are independent: predicted in parallel, kept in file order.
    let predicted: Vec<Result<PredictedRow, String>> = file.rows.par_iter().map(|m| predict(m, chips)).collect();
    for (m, p) in file.rows.iter().zip(predicted) {
        match p {
            Ok(p) => rows.push(p),
            Err(reason) => skipped.push(SkippedRow {
                id: m.id.clone(),
                line: m.line,
                chip: m.chip.clone(),
                kernel: m.kernel_word.clone(),
                measured_ms: m.measured_ms,
                reason,
            }),
        }
    }
    let groups = rank_groups(file, &rows);
    let summary = summarize(&rows, skipped.len(), &groups);
    Validation { file: file.path.clone(), rows, skipped, groups, summary, chip_models: chips.usage(file) }
}

fn pct(x: Option<f64>) -> String {
    x.map(|v| format!("{:.1}%", v * 100.0)).unwrap_or_else(|| "n/a".into())
}

impl Validation {
    /// JSON: one object with `rows`, `skipped`, `groups` and `summary` (errors as fractions).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a validation serialises")
    }

    /// CSV: one line per row of the file (predicted and skipped), in file order, with columns
    /// `id,line,chip,kernel,status,predicted_ms,measured_ms,error,bottleneck,blocks,note,chip_hash`
    /// (`status` is `predicted` or `skipped`; a skipped row's `note` is the reason; `chip_hash`
    /// is the parameter hash of the model that predicted the row).
    pub fn to_csv(&self) -> String {
        let mut w = csv::Writer::from_writer(Vec::new());
        let _ = w.write_record([
            "id",
            "line",
            "chip",
            "kernel",
            "status",
            "predicted_ms",
            "measured_ms",
            "error",
            "bottleneck",
            "blocks",
            "note",
            "chip_hash",
        ]);
        let mut lines: Vec<(u64, Vec<String>)> = Vec::new();
        for r in &self.rows {
            lines.push((
                r.line,
                vec![
                    r.id.clone(),
                    r.line.to_string(),
                    r.chip.clone(),
                    r.kernel.clone(),
                    "predicted".into(),
                    format!("{}", r.predicted_ms),
                    format!("{}", r.measured_ms),
                    format!("{}", r.error),
                    r.bottleneck.clone(),
                    r.blocks.clone(),
                    r.note.clone().unwrap_or_default(),
                    r.chip_hash.clone(),
                ],
            ));
        }
        for s in &self.skipped {
            lines.push((
                s.line,
                vec![
                    s.id.clone(),
                    s.line.to_string(),
                    s.chip.clone(),
                    s.kernel.clone(),
                    "skipped".into(),
                    String::new(),
                    format!("{}", s.measured_ms),
                    String::new(),
                    String::new(),
                    String::new(),
                    s.reason.clone(),
                    String::new(),
                ],
            ));
        }
        lines.sort_by_key(|(l, _)| *l);
        for (_, rec) in lines {
            let _ = w.write_record(rec);
        }
        String::from_utf8(w.into_inner().unwrap_or_default()).unwrap_or_default()
    }

    /// Markdown (for reports such as traces/measured/VALIDATION.md): the per-row table, the
    /// skipped rows with reasons, the ranking groups and the summary.
    pub fn to_markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "| id | chip | kernel | blocks | predicted ms | measured ms | error | bound by |");
        let _ = writeln!(s, "|---|---|---|---|---:|---:|---:|---|");
        for r in &self.rows {
            let blocks = match &r.note {
                Some(_) => format!("{} (assumed)", r.blocks),
                None => r.blocks.clone(),
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {:.4} | {:.4} | {:+.1}% | {} |",
                r.id,
                r.chip,
                r.kernel,
                blocks,
                r.predicted_ms,
                r.measured_ms,
                r.error * 100.0,
                r.bottleneck
            );
        }
        if !self.skipped.is_empty() {
            let _ = writeln!(s);
            let _ = writeln!(s, "Skipped (the simulator cannot express them):");
            let _ = writeln!(s);
            for r in &self.skipped {
                let _ = writeln!(s, "- `{}` ({}, {} ms): {}", r.id, r.kernel, r.measured_ms, r.reason);
            }
        }
        if !self.groups.is_empty() {
            let _ = writeln!(s);
            let _ = writeln!(s, "Ranking within groups that differ only in tiling or kernel options:");
            let _ = writeln!(s);
            for g in &self.groups {
                let tau = g.kendall_tau.map(|t| format!("{t:+.2}")).unwrap_or_else(|| "n/a".into());
                let _ = writeln!(
                    s,
                    "- {}: Kendall tau {tau}, {} (measured fastest first: {})",
                    g.key,
                    if g.ranking_matches { "ranking matches" } else { "ranking differs" },
                    g.ids.join(" < ")
                );
            }
        }
        let _ = writeln!(s);
        let _ = writeln!(s, "Chip models:");
        let _ = writeln!(s);
        for l in self.chip_models.lines() {
            let _ = writeln!(s, "- {l}");
        }
        let m = &self.summary;
        let _ = writeln!(s);
        let _ = writeln!(s, "Summary: {} rows, {} predicted, {} skipped.", m.rows, m.predicted, m.skipped);
        let _ = writeln!(s);
        let _ = writeln!(s, "- median |error| {}, mean |error| (MAPE) {}", pct(m.median_abs_error), pct(m.mean_abs_error));
        if let Some(w) = &m.worst {
            let _ = writeln!(s, "- worst row {} ({:+.1}%)", w.id, w.error * 100.0);
        }
        if m.groups > 0 {
            let _ = writeln!(
                s,
                "- ranking: {} of {} groups ordered as measured; pooled Kendall tau {}",
                m.groups_ranking_matches,
                m.groups,
                m.pooled_kendall_tau.map(|t| format!("{t:+.2}")).unwrap_or_else(|| "n/a".into())
            );
        }
        s
    }

    /// A table for people: per row id, predicted, measured, signed error, bottleneck; then the
    /// skipped rows with reasons, the ranking groups and the summary.
    pub fn to_table(&self) -> String {
        let mut s = String::new();
        let idw = self.rows.iter().map(|r| r.id.len()).chain(self.skipped.iter().map(|r| r.id.len())).max().unwrap_or(2).max(2);
        let _ = writeln!(s, "tpusim validate: {}", self.file);
        let _ = writeln!(s);
        let _ = writeln!(s, "{:<idw$}  {:>12}  {:>12}  {:>8}  {:<12}  blocks", "id", "predicted ms", "measured ms", "error", "bound by");
        for r in &self.rows {
            let _ = writeln!(
                s,
                "{:<idw$}  {:>12.4}  {:>12.4}  {:>+7.1}%  {:<12}  {}{}",
                r.id,
                r.predicted_ms,
                r.measured_ms,
                r.error * 100.0,
                r.bottleneck,
                r.blocks,
                r.note.as_deref().map(|n| format!(" ({n})")).unwrap_or_default()
            );
        }
        if !self.skipped.is_empty() {
            let _ = writeln!(s);
            let _ = writeln!(s, "skipped ({} rows the simulator cannot express):", self.skipped.len());
            for r in &self.skipped {
                let _ = writeln!(s, "  {:<idw$}  line {:>3}  {}: {}", r.id, r.line, r.kernel, r.reason);
            }
        }
        if !self.groups.is_empty() {
            let _ = writeln!(s);
            let _ = writeln!(s, "ranking within groups that differ only in tiling or kernel options (fastest measured first):");
            for g in &self.groups {
                let tau = g.kendall_tau.map(|t| format!("{t:+.2}")).unwrap_or_else(|| "n/a".into());
                let _ = writeln!(
                    s,
                    "  {}: Kendall tau {tau}, {} ({})",
                    g.key,
                    if g.ranking_matches { "ranking matches" } else { "RANKING DIFFERS" },
                    g.ids.join(" < ")
                );
            }
        }
        let _ = writeln!(s);
        let _ = writeln!(s, "chip models:");
        for l in self.chip_models.lines() {
            let _ = writeln!(s, "  {l}");
        }
        let m = &self.summary;
        let _ = writeln!(s);
        let _ = writeln!(s, "summary: {} rows, {} predicted, {} skipped", m.rows, m.predicted, m.skipped);
        let dry = self.rows.iter().filter(|r| r.kernel.starts_with(crate::fit::DRY_RUN_KERNEL_PREFIX)).count();
        if dry > 0 {
            let _ = writeln!(
                s,
                "  note      {dry} of the rows are a dry run's (kernel {}...: `python -m tpusim.microbench --measure --dry-run` timed them on the CPU in interpret mode): their errors say nothing about the model",
                crate::fit::DRY_RUN_KERNEL_PREFIX
            );
        }
        let _ = writeln!(
            s,
            "  |error|   median {}, mean {} (MAPE); bias {}; RMS of ln(pred/meas) {}",
            pct(m.median_abs_error),
            pct(m.mean_abs_error),
            m.mean_signed_error.map(|v| format!("{:+.1}%", v * 100.0)).unwrap_or_else(|| "n/a".into()),
            m.rms_log_error.map(|v| format!("{v:.3}")).unwrap_or_else(|| "n/a".into())
        );
        if let Some(w) = &m.worst {
            let _ = writeln!(s, "  worst     {} ({:+.1}%)", w.id, w.error * 100.0);
        }
        if m.groups > 0 {
            let _ = writeln!(
                s,
                "  ranking   {} of {} groups ordered as measured; pooled Kendall tau {}",
                m.groups_ranking_matches,
                m.groups,
                m.pooled_kendall_tau.map(|t| format!("{t:+.2}")).unwrap_or_else(|| "n/a".into())
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::parse;

    const HEADER: &str = "id,chip,kernel,batch,q_heads,q_len,kv_len,head_dim,block_q,block_kv,block_kv_compute,measured_ms";

    #[test]
    fn rows_the_simulator_rejects_or_cannot_express_are_skipped_with_reasons() {
        let text = format!(
            "{HEADER}\n\
             ok,v6e,tokamax-splash,1,8,4096,4096,128,1024,1024,512,1.0\n\
             vmem,v6e,tokamax-splash,1,8,65536,65536,256,32768,32768,32768,1.0\n\
             flash3,v6e,flash-attention-3,1,8,4096,4096,128,,,,1.0\n"
        );
        let file = parse(&text, "t.csv", &[]).unwrap();
        let v = validate(&file, &ChipSet::default());
        assert_eq!(v.rows.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["ok"]);
        let reasons: Vec<(&str, &str)> = v.skipped.iter().map(|s| (s.id.as_str(), s.reason.as_str())).collect();
        assert_eq!(reasons.len(), 2);
        assert!(reasons[0].0 == "vmem" && reasons[0].1.contains("VMEM"), "{reasons:?}");
        assert!(reasons[1].0 == "flash3" && reasons[1].1.contains("flash-attention-3"), "{reasons:?}");
        assert_eq!((v.summary.rows, v.summary.predicted, v.summary.skipped), (3, 1, 2));
        assert!(v.to_table().contains("vmem") && v.to_csv().contains("flash3"));
    }

    #[test]
    fn a_reversed_ranking_is_reported() {
        // two tilings of one workload whose measured order is the opposite of the predicted one
        let text = format!(
            "{HEADER}\n\
             small,v5e,pallas-matmul,,,4096,4096,4096,128,128,128,0.5\n\
             big,v5e,pallas-matmul,,,4096,4096,4096,512,1024,1024,5.0\n"
        );
        let file = parse(&text, "t.csv", &[]).unwrap();
        let v = validate(&file, &ChipSet::default());
        assert_eq!(v.groups.len(), 1);
        assert_eq!(v.groups[0].kendall_tau, Some(-1.0));
        assert!(!v.groups[0].ranking_matches);
        assert_eq!(v.summary.groups_ranking_matches, 0);
        assert!(v.to_table().contains("RANKING DIFFERS"));
    }
}
