//! The error-band file (`tpusim validate --bands`): every calibration row's leave-one-out error
//! ([`crate::cross_validate`]) grouped by chip x kernel family x direction x scope
//! ([`tpusim_job::bands`]), with what the file was computed from, so that a test can tell
//! when it no longer matches the models ([`stale`]).

use crate::cv::CrossValidation;
use crate::measure::{measured_scope, MeasurementFile};
use crate::validate::{validate, ChipSet, Validation};
use std::collections::BTreeMap;
use tpusim_model::KernelKind;
use tpusim_job::bands::{fnv_hex, median_p90, row_key, Band, BandFile, BandKey};

/// The band key of each row of `file`, by id.
fn keys(file: &MeasurementFile) -> BTreeMap<String, BandKey> {
    file.rows
        .iter()
        .map(|m| {
            if m.kernel_ir.is_some() {
                // A kernel read from its IR: its family, any direction, its scope.
                return (m.id.clone(), BandKey { family: m.kernel_word.clone(), ..described_key(m) });
            }
            let matmul = m.kernel.is_some_and(|k| k.kind() != KernelKind::Attention);
            (m.id.clone(), row_key(&m.chip, &m.kernel_word, m.direction, matmul, measured_scope(&m.timing)))
        })
        .collect()
}

/// The chip's band of every kernel read from its IR (`tpusim_job::bands::kernel_ir_key`) at
/// the row's scope: a profiler's device time of a described kernel is the kernel's.
fn described_key(m: &crate::measure::Measurement) -> BandKey {
    let scope = m.described_scope();
    BandKey { chip: m.chip.clone(), family: tpusim_job::bands::KERNEL_IR_FAMILY.into(), direction: "any".into(), scope: scope.to_string() }
}

/// Rounds an error to the band file's precision (1e-4).
fn round4(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

/// What a band file records of the models: each row's in-sample error, rounded.
fn in_sample(v: &Validation) -> Vec<(String, f64)> {
    v.rows.iter().map(|r| (r.id.clone(), round4(r.error))).collect()
}

/// Each chip model of a validation: name and parameter hash.
fn chip_models(v: &Validation) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for r in &v.rows {
        if !out.iter().any(|(n, _)| *n == r.chip) {
            out.push((r.chip.clone(), r.chip_hash.clone()));
        }
    }
    out
}

/// The band file of `file` (whose text is `bytes`, named `path` in the file) on `chips`, from
/// its cross-validation `cv`: per group the median and 90th percentile of the rows' leave-one-out
/// |error| (rows without a held-out prediction are left out), and the rows' in-sample errors.
pub fn band_file(path: &str, bytes: &[u8], file: &MeasurementFile, chips: &ChipSet, cv: &CrossValidation) -> BandFile {
    let keys = keys(file);
    let mut groups: BTreeMap<BandKey, Vec<f64>> = BTreeMap::new();
    for r in &cv.rows {
        let (Some(loo), Some(key)) = (r.loo_ms, keys.get(&r.id)) else { continue };
        groups.entry(key.clone()).or_default().push(((loo - r.measured_ms) / r.measured_ms).abs());
    }
    let v = validate(file, chips);
    // Kernels read from their IR are never fitted: their predictions are held out as they are.
    // Each counts in its family's band and in its chip's band of every kernel read from its IR
    // (the one `tpusim run --kernel-ir` reports when it does not recognise the family).
    // Microbenchmark rows are fitted (first): their held-out errors counted above, in their own
    // family's band alone.
    for r in &v.rows {
        let Some(m) = file.rows.iter().find(|m| m.id == r.id && m.kernel_ir.is_some() && !m.kernel_word.starts_with(crate::fit::MECHANISM_KERNEL_PREFIX)) else {
            continue;
        };
        for key in [keys.get(&r.id).cloned(), Some(described_key(m))].into_iter().flatten() {
            groups.entry(key).or_default().push(r.error.abs());
        }
    }
    let bands = groups
        .into_iter()
        .map(|(key, e)| {
            let (median, p90) = median_p90(&e);
            Band { key, n: e.len(), median_abs_error: round4(median), p90_abs_error: round4(p90) }
        })
        .collect();
    BandFile {
        generated_by: crate::docs::command(path),
        measurements: path.to_string(),
        measurements_hash: fnv_hex(bytes),
        chip_models: chip_models(&v),
        in_sample: in_sample(&v),
        bands,
        held_out: cv
            .rows
            .iter()
            .map(|r| tpusim_job::bands::HeldOut { id: r.id.clone(), fitted_ms: r.fitted_ms, loo_ms: r.loo_ms, group_ms: r.group_ms })
            .collect(),
        not_used: cv.unused.clone(),
    }
}

/// Why `shipped` no longer matches `file` (text `bytes`) on `chips`, or `None` when it does: a
/// different measurement file, different chip models, or a row whose in-sample error moved
/// (the simulator changed). Takes one validation, about a second.
pub fn stale(shipped: &BandFile, bytes: &[u8], file: &MeasurementFile, chips: &ChipSet) -> Option<String> {
    if shipped.measurements_hash != fnv_hex(bytes) {
        return Some(format!("the measurement file changed (hash {} in the band file, {} now)", shipped.measurements_hash, fnv_hex(bytes)));
    }
    let v = validate(file, chips);
    let models = chip_models(&v);
    if shipped.chip_models != models {
        return Some(format!("the chip models changed: {:?} in the band file, {models:?} now", shipped.chip_models));
    }
    let now = in_sample(&v);
    for ((id, a), (id2, b)) in shipped.in_sample.iter().zip(&now) {
        if id != id2 || (a - b).abs() > 1.5e-4 {
            return Some(format!("row {id2}'s in-sample error moved: {a:+.4} in the band file, {b:+.4} now"));
        }
    }
    (shipped.in_sample.len() != now.len()).then(|| format!("{} rows in the band file, {} now", shipped.in_sample.len(), now.len()))
}

/// Markdown tables of a band file and of its rows' leave-one-out |error| grouped by scope and
/// by kernel family (over every chip), for VALIDATION.md.
pub fn to_markdown(bands: &BandFile, file: &MeasurementFile, cv: &CrossValidation) -> String {
    use std::fmt::Write as _;
    let pct = |x: f64| format!("{:.1}%", 100.0 * x);
    let mut s = String::new();
    let _ = writeln!(s, "| chip | family | direction | scope | n | median | p90 |");
    let _ = writeln!(s, "|---|---|---|---|---:|---:|---:|");
    for b in &bands.bands {
        let k = &b.key;
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} |",
            k.chip,
            k.family,
            k.direction,
            k.scope,
            b.n,
            pct(b.median_abs_error),
            pct(b.p90_abs_error)
        );
    }
    let keys = keys(file);
    for (title, by) in [("scope", 0usize), ("kernel family", 1)] {
        let mut groups: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for r in &cv.rows {
            let (Some(loo), Some(k)) = (r.loo_ms, keys.get(&r.id)) else { continue };
            let g = if by == 0 { k.scope.clone() } else { k.family.clone() };
            groups.entry(g).or_default().push(((loo - r.measured_ms) / r.measured_ms).abs());
        }
        let _ = writeln!(s, "\n| {title} | n | median | p90 |");
        let _ = writeln!(s, "|---|---:|---:|---:|");
        for (g, e) in groups {
            let (m, p) = median_p90(&e);
            let _ = writeln!(s, "| {g} | {} | {} | {} |", e.len(), pct(m), pct(p));
        }
    }
    s
}
