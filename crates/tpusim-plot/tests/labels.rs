//! Figures with two or more series place their annotation labels without collisions (issue 13,
//! item 7): every label a figure draws through its layout ([`style::Labels`]) is checked against
//! every other, on figures crowded on purpose.

use tpusim_plot::breakdown::BreakdownFigure;
use tpusim_plot::jobs::{run_all, LabelledSpec};
use tpusim_plot::roofline::RooflineFigure;
use tpusim_plot::style::{self, overlaps};
use tpusim_plot::table::Table;
use tpusim_plot::validation::{ValidationFigure, ValidationSpec};
use tpusim_plot::{render_bytes, Format};
use tpusim_job::JobSpec;

fn trace(name: &str, chip: &str) -> LabelledSpec {
    let path = format!("{}/../../traces/{name}.toml", env!("CARGO_MANIFEST_DIR"));
    let mut spec = JobSpec::from_toml_file(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    spec.chip = Some(chip.into());
    LabelledSpec { label: format!("{name} ({chip})"), spec }
}

/// Renders `fig` as PNG and SVG and returns the labels of the last rendering, checking that no
/// two overlap and that none covers a marker or other text the figure reserved.
fn labels_of(fig: &impl tpusim_plot::Figure, what: &str) -> Vec<(String, style::LabelBox)> {
    for format in [Format::Png, Format::Svg] {
        render_bytes(fig, format, 1400, 860).unwrap_or_else(|e| panic!("{what}: {e}"));
        let labels = style::last_labels();
        for (a, ba) in &labels {
            for r in style::last_reserved() {
                assert!(!overlaps(ba, &r), "{what} ({format:?}): '{a}' {ba:?} covers a marker or other text at {r:?}");
            }
        }
        for (i, (a, ba)) in labels.iter().enumerate() {
            for (b, bb) in &labels[i + 1..] {
                assert!(!overlaps(ba, bb), "{what} ({format:?}): '{a}' {ba:?} overlaps '{b}' {bb:?}");
            }
        }
    }
    style::last_labels()
}

#[test]
fn a_roofline_of_two_chips_keeps_every_label_clear() {
    let jobs: Vec<LabelledSpec> = ["v6e", "v7x"]
        .iter()
        .flat_map(|c| [trace("video-720p-dense", c), trace("video-720p-sparse", c), trace("llm-causal-16k", c)])
        .collect();
    let fig = RooflineFigure::from_runs(&run_all(&jobs).unwrap(), None).unwrap();
    let labels = labels_of(&fig, "roofline");
    let hbm: Vec<&String> = labels.iter().map(|(t, _)| t).filter(|t| t.contains("HBM roof")).collect();
    assert_eq!(hbm.len(), 2, "one HBM-roof label per chip: {labels:?}");
    assert!(hbm.iter().all(|t| !t.contains("0000")), "bandwidth printed to 3 figures: {hbm:?}");
    assert_eq!(labels.iter().filter(|(t, _)| t.contains("MFU")).count(), 6, "a label per workload point");
    // The roofs and ceilings are lines no label may lie on (a point's label sat on a ceiling
    // just above its point): each flat roof and dashed ceiling is kept clear as a thin box.
    let lines = style::last_reserved().iter().filter(|b| b[3] - b[1] == 4 && b[2] - b[0] > 50).count();
    assert!(lines >= 2 + 6, "two MXU roofs and a softmax ceiling per workload kept clear: {lines}");
}

#[test]
fn a_crowded_breakdown_keeps_names_and_values_clear() {
    let jobs: Vec<LabelledSpec> = ["v6e", "v5p"]
        .iter()
        .flat_map(|c| {
            ["video-720p-dense", "video-720p-sparse", "video-720p-aligned", "video-720p-naive", "llm-causal-16k", "llm-gqa-sliding-32k"]
                .map(|t| trace(t, c))
        })
        .collect();
    let fig = BreakdownFigure::from_runs(&run_all(&jobs).unwrap(), None);
    let labels = labels_of(&fig, "breakdown");
    assert_eq!(labels.iter().filter(|(t, _)| t.starts_with("bound by")).count(), 12);
    // Each bar says its busy total adds units that run at once (not a time of the run).
    assert_eq!(labels.iter().filter(|(t, _)| t.starts_with("busy total ") && t.ends_with("(units overlap)")).count(), 12);
}

#[test]
fn a_validation_scatter_keeps_its_diagonal_label_off_the_points() {
    // Points on and near the diagonal everywhere the "y = x" label would first go.
    let mut csv = String::from("id,predicted_ms,measured_ms\n");
    for i in 0..60 {
        let m = 0.5 * 1.12f64.powi(i);
        csv.push_str(&format!("A-{i},{},{m}\n", m * (1.0 + 0.08 * ((i % 5) as f64 - 2.0))));
    }
    let t = Table::parse(&csv, "v.csv", "--input").unwrap();
    let spec = ValidationSpec {
        measured: "measured_ms".into(),
        predicted: "predicted_ms".into(),
        id: "id".into(),
        bands: vec![0.1, 0.25],
        ..Default::default()
    };
    let labels = labels_of(&ValidationFigure::from_table(&t, &spec).unwrap(), "validation");
    assert!(labels.iter().any(|(t, _)| t == "y = x"));
}
