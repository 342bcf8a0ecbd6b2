//! Accuracy on the shipped measurements (traces/measured/calibration.csv), measured values read
//! from the file itself.
//!
//! Two kinds of figure, kept apart:
//! * **in sample**: each chip's `[fitted]` parameters were fitted to these very rows, so these
//!   bands say the model can describe them, not that it predicts;
//! * **out of sample**: every chip refitted without each row (leave-one-out), the held-out row
//!   predicted by a model that never saw it (`tpusim validate --cv`).
//!
//! Bands are the targets (fidelity issue: tokamax rows median <= 5% in sample,
//! leave-one-out median <= 7% over the tokamax rows and <= 10% per chip). Where a row misses its
//! band the test says so by name; it is never widened to pass.

use tpusim_calib::measure::MeasurementFile;
use tpusim_calib::stats::median;
use tpusim_calib::{cross_validate, read_file, validate, ChipSet, Validation};

/// The shipped file and its validation, computed once for every test of this file (its rows of
/// kernels read from their IR take most of a validation's time).
fn shipped() -> (MeasurementFile, Validation) {
    static SHIPPED: std::sync::OnceLock<(MeasurementFile, Validation)> = std::sync::OnceLock::new();
    SHIPPED
        .get_or_init(|| {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../traces/measured/calibration.csv");
            let file = read_file(path, &[]).unwrap();
            let v = validate(&file, &ChipSet::default());
            (file, v)
        })
        .clone()
}

/// |error| of the rows of `v` that `pick` selects from the file.
fn abs_errors(file: &MeasurementFile, v: &Validation, pick: impl Fn(&tpusim_calib::Measurement) -> bool) -> Vec<(String, f64)> {
    file.rows
        .iter()
        .filter(|m| pick(m))
        .map(|m| {
            let r = v.rows.iter().find(|r| r.id == m.id).unwrap_or_else(|| panic!("{} not predicted\n{}", m.id, v.to_table()));
            assert!(((r.predicted_ms - m.measured_ms) / m.measured_ms - r.error).abs() < 1e-12);
            (m.id.clone(), r.error.abs())
        })
        .collect()
}

#[test]
fn in_sample_every_row_is_predicted_and_the_tokamax_rows_meet_their_band() {
    let (file, v) = shipped();
    let t = v.to_table();
    assert_eq!(v.rows.len() + v.skipped.len(), file.rows.len(), "no row silently dropped");
    let skipped: Vec<&str> = v.skipped.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(skipped, ["HBM-COPY-v6e-32MiB"], "only the bare copy is not a kernel\n{t}");
    let tokamax_fwd = abs_errors(&file, &v, |m| m.kernel_word == "tokamax-splash" && m.direction == Some(tpusim_kernel::Direction::Fwd));
    assert_eq!(tokamax_fwd.len(), 28);
    let errs: Vec<f64> = tokamax_fwd.iter().map(|e| e.1).collect();
    let med = median(&errs).unwrap();
    assert!(med <= 0.05, "tokamax forward rows, in sample: median |error| {med:.3}\n{t}");
    // Every tokamax forward row within 15% in sample, or named with its error as a known miss
    // in VALIDATION.md's "Known misses" section (a miss is reported, never hidden by a wider band).
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../traces/measured/VALIDATION.md")).unwrap();
    let misses = doc.split("## Known misses").nth(1).unwrap_or("");
    for (id, e) in &tokamax_fwd {
        assert!(*e <= 0.15 || misses.contains(id.as_str()), "{id}: |error| {e:.3} in sample, not listed as a known miss\n{t}");
    }
    // The backward rows (v7x, fused dq/dk/dv kernel) within 15%.
    let bwd = abs_errors(&file, &v, |m| m.direction == Some(tpusim_kernel::Direction::Bwd));
    assert_eq!(bwd.len(), 6);
    for (id, e) in &bwd {
        assert!(*e <= 0.15, "{id}: |error| {e:.3}\n{t}");
    }
    // The dense video-diffusion baseline within 10%.
    let b0 = abs_errors(&file, &v, |m| m.id == "VD-B0");
    assert!(b0[0].1 <= 0.10, "VD-B0 {:.3}\n{t}", b0[0].1);
}

#[test]
fn tiling_and_option_variants_rank_as_measured() {
    let (_, v) = shipped();
    let t = v.to_table();
    assert!(v.groups.len() >= 7, "{t}");
    for g in &v.groups {
        assert!(g.ranking_matches, "{}: {:?}\n{t}", g.key, g.kendall_tau);
    }
}

#[test]
fn machine_formats_carry_every_row() {
    let (file, v) = shipped();
    let json: serde_json::Value = serde_json::from_str(&v.to_json()).unwrap();
    assert_eq!(json["rows"].as_array().unwrap().len() + json["skipped"].as_array().unwrap().len(), file.rows.len());
    assert!(json["summary"]["median_abs_error"].is_number());
    let csv = v.to_csv();
    assert_eq!(csv.lines().count(), file.rows.len() + 1);
    assert!(csv.lines().next().unwrap().starts_with("id,line,chip,kernel,status,predicted_ms,measured_ms,error"));
    let md = v.to_markdown();
    assert!(md.contains("| VD-B0 |") && md.contains("median |error|"));
}

/// Chips whose leave-one-out median misses its 10% band, with the figure recorded in
/// VALIDATION.md (none since v7x's refit came within it, 9.2%).
const KNOWN_MISSES: &[(&str, f64)] = &[];

#[test]
fn out_of_sample_leave_one_out_errors_meet_their_bands() {
    let (file, _) = shipped();
    let cv = cross_validate(&file, &ChipSet::default()).unwrap();
    let t = cv.to_table(false);
    let tk = cv.loo_median("tokamax rows").unwrap();
    assert!(tk <= 0.07, "tokamax rows: leave-one-out median |error| {tk:.3}\n{t}");
    for chip in ["v6e", "v5p", "v5e", "v7x"] {
        let m = cv.loo_median(chip).unwrap();
        match KNOWN_MISSES.iter().find(|(c, _)| *c == chip) {
            // A recorded miss (traces/measured/VALIDATION.md, "Known misses"): the 10% band
            // stands and is not met. Strict: when the model meets it, this fails until the miss
            // is taken off the list; it may not grow past the figure recorded.
            Some((_, recorded)) => {
                assert!(m > 0.10, "{chip}: leave-one-out median |error| {m:.3} now meets the 10% band: take it off KNOWN_MISSES and VALIDATION.md's known misses\n{t}");
                assert!(m <= *recorded, "{chip}: leave-one-out median |error| {m:.4}, worse than the recorded miss {recorded}\n{t}");
            }
            None => assert!(m <= 0.10, "{chip}: leave-one-out median |error| {m:.3}\n{t}"),
        }
    }
    // Every predicted row has a held-out prediction.
    assert!(cv.rows.iter().all(|r| r.loo_ms.is_some()), "{t}");
}

/// Per kernel family read from its IR and chip: the median |error| the model has now (README's
/// table). The 10% band stands: a family at or under it must stay there; one over it is a known
/// miss (VALIDATION.md names every such row with its mechanism) that may not get worse than the
/// figure recorded here, and fails when it meets the band until it is taken off.
const DESCRIBED_MEDIANS: &[(&str, &str, f64)] = &[
    // Since the step and DMA mechanisms are measured (v6e from its microbenchmarks; v7x's DMA
    // latency scaled from XLA's table as v6e's, its step overhead refit): VALIDATION.md, known
    // misses, names each family's mechanisms.
    ("rpa-v3-sglang", "v6e", 0.175),
    ("rpa-tpu-inference-v0.11.1", "v7x", 0.049),
    ("rpa-tpu-inference-v0.11.1", "v6e", 0.195),
    ("kv-cache-update", "v6e", 0.39),
    ("kv-cache-update", "v7x", 0.115),
    // vLLM's kv_cache_update, judge rows timed with DMA tracing on.
    ("kv-cache-update-vllm", "v6e", 0.279),
    ("megablox-gmm", "v6e", 0.132),
    // fp8 x fp8 matmuls at v7x's fp8 rates (0.578 while they were priced as bf16).
    ("gmm-v2", "v7x", 0.316),
    // tokamax's grouped matmuls (openxla/tokamax @ d52c0797 autotuning data): 0.0.12's Pallas
    // kernel and gmm_v2, each a grid-less emit_pipeline.
    ("tokamax-gmm", "v6e", 0.092),
    ("tokamax-gmm-v2", "v6e", 0.082),
    // The public v6e microbenchmarks (mechanism rows: the step and DMA mechanisms are fitted
    // to them, so these are in-sample).
    ("microbench-copy", "v6e", 0.027),
    ("microbench-dma", "v6e", 0.001),
];

#[test]
fn kernels_read_from_their_ir_meet_their_band_or_are_named_misses() {
    let (file, v) = shipped();
    let t = v.to_table();
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../traces/measured/VALIDATION.md")).unwrap();
    let misses = doc.split("## Known misses").nth(1).unwrap_or("");
    let described: Vec<&tpusim_calib::Measurement> = file.rows.iter().filter(|m| m.kernel_ir.is_some()).collect();
    assert!(described.len() >= 100, "{}", described.len());
    for (family, chip, recorded) in DESCRIBED_MEDIANS {
        let errs = abs_errors(&file, &v, |m| m.kernel_ir.is_some() && m.kernel_word == *family && m.chip == *chip);
        // A library family needs five rows for a band; the microbenchmark patterns are one
        // mechanism each.
        assert!(errs.len() >= 5 || family.starts_with("microbench-"), "{family} on {chip}: {} rows\n{t}", errs.len());
        for (id, e) in &errs {
            assert!(*e <= 0.15 || misses.contains(id.as_str()), "{id}: |error| {e:.3}, not listed in VALIDATION.md's known misses\n{t}");
        }
        let m = median(&errs.iter().map(|e| e.1).collect::<Vec<_>>()).unwrap();
        if *recorded <= 0.10 {
            assert!(m <= 0.10, "{family} on {chip}: median |error| {m:.3} over the 10% band\n{t}");
        } else {
            assert!(m > 0.10, "{family} on {chip}: median |error| {m:.3} now meets the 10% band: update DESCRIBED_MEDIANS and VALIDATION.md\n{t}");
            assert!(m <= recorded + 5e-4, "{family} on {chip}: median |error| {m:.4}, worse than the recorded {recorded}\n{t}");
        }
    }
    // Every described row belongs to a family recorded above.
    for m in &described {
        assert!(DESCRIBED_MEDIANS.iter().any(|(f, c, _)| *f == m.kernel_word && *c == m.chip), "{} ({} on {})", m.id, m.kernel_word, m.chip);
    }
}
