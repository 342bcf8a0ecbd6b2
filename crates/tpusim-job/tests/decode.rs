//! The decode report on closed-form cases: a synthetic paged kernel (one grid step per
//! sequence, one DMA per page its length touches, no compute) whose bytes, DMA counts and
//! bound-limited latencies are known exactly.

use serde_json::json;
use tpusim_chip::ChipModel;
use tpusim_job::decode::{DecodeReport, DecodeShape};

/// A description run as a job ([`tpusim_job::Job::Described`]).
fn run_kernel_ir(chip: &ChipModel, d: &tpusim_pallas::Description, dir: &std::path::Path) -> Result<tpusim_job::Run, tpusim_job::JobError> {
    tpusim_job::run(chip, &tpusim_job::Job::Described(tpusim_job::DescribedJob::new("test", d.clone(), dir)))
}

const PS: u64 = 16;
const D: u64 = 128;
const PAGES: u64 = 64;

/// A kernel that copies, per sequence b (grid step b), pages `table[b, 0..ceil(len[b] / PS)]`.
fn paged_kernel(lengths: serde_json::Value, table: Vec<i64>, seqs: usize) -> tpusim_pallas::Description {
    let per = table.len() / seqs;
    let d = json!({
        "format": "tpusim-kernel-description", "version": 1, "kernel_name": "synthetic_paged",
        "grid": [seqs], "dimension_semantics": ["arbitrary"],
        "refs": [
            {"name": "prefetch 0", "kind": "prefetch", "shape": [seqs], "dtype": "i32", "memory_space": "smem", "values": lengths},
            {"name": "prefetch 1", "kind": "prefetch", "shape": [seqs, per], "dtype": "i32", "memory_space": "smem", "values": {"inline": table}},
            {"name": "input 0", "kind": "input", "shape": [PAGES, PS, D], "array_shape": [PAGES, PS, D], "dtype": "bf16", "memory_space": "any"}
        ],
        "body": [{
            "op": "scf.for", "lower": 0, "upper": ["ceildiv", ["load", 0, [["grid", 0]]], PS], "step": 1, "loc": "k.py:1",
            "then": [{"op": "tpu.enqueue_dma", "id": 1, "loc": "k.py:2",
                      "attrs": {"bytes": PS * D * 2, "src_ref": 2, "src_offsets": [["load", 1, [["grid", 0], ["iv", 0]]], 0, 0], "src_shape": [1, PS, D]}}]
        }]
    });
    tpusim_pallas::Description::from_json(&d.to_string(), "synthetic").expect("a valid description")
}

fn shape(lengths: &[u64]) -> DecodeShape {
    DecodeShape { lengths: lengths.to_vec(), page_size: PS, kv_bytes_per_page: PS * D * 2, q_bytes: 0, o_bytes: 0, pages_per_block: Some(1) }
}

fn report(chip: &ChipModel, lengths: &[u64]) -> DecodeReport {
    let table: Vec<i64> = (0..lengths.len() as i64 * 8).collect();
    let d = paged_kernel(json!({"inline": lengths}), table, lengths.len());
    let run = run_kernel_ir(chip, &d, std::path::Path::new(".")).expect("lowers");
    DecodeReport::from_run(&run, &shape(lengths)).expect("a decode report")
}

#[test]
fn bytes_and_dmas_are_the_pages_the_lengths_touch() {
    let chip = ChipModel::preset("v6e").unwrap();
    let lengths = [100u64, 37, 128, 5];
    let r = report(&chip, &lengths);
    let pages: u64 = lengths.iter().map(|l| l.div_ceil(PS)).sum();
    assert_eq!(r.pages_touched, pages);
    assert_eq!(r.dmas.count, pages);
    assert_eq!(r.hbm_bytes, pages * PS * D * 2);
    assert_eq!(r.must_move_bytes, r.hbm_bytes);
    assert_eq!(r.dmas.max_per_step, 8);
    assert!(r.roofline_fraction > 0.0 && r.roofline_fraction <= 1.0, "{}", r.roofline_fraction);
}

/// The closed-form bound named `name` of a report, ms.
fn bound_ms(r: &DecodeReport, name: &str) -> f64 {
    r.bounds.iter().find(|b| b.name == name).map(|b| b.ms).expect("the report lists the bound")
}

#[test]
fn issue_cost_sets_the_latency_in_closed_form() {
    // 10 us per DMA issue dominates: the engine queues the copies at 10 us each, so the latency
    // is DMAs x 10 us plus the last copy's latency and the steps' overheads (under 2 us), and
    // the report's closed-form issue bound is that product.
    let chip = ChipModel::preset("v6e").unwrap().with_override("fitted.dma_issue_ns", "10000").unwrap();
    let lengths = [100u64, 37];
    let r = report(&chip, &lengths);
    let dmas = (7 + 3) as f64;
    assert!((bound_ms(&r, "DMA issue") - dmas * 10e-3).abs() < 1e-12);
    assert!(r.latency_ms >= dmas * 10e-3 && r.latency_ms < dmas * 10e-3 + 2e-3, "{}", r.latency_ms);
    let bw = chip.hbm.dma_bandwidth_gb_per_s.value * 1e9;
    let want = (10 * PS * D * 2) as f64 / (r.latency_ms * 1e-3 * bw);
    assert!((r.roofline_fraction - want).abs() < 1e-12, "{} vs {want}", r.roofline_fraction);
}

#[test]
fn dmas_in_flight_cost_in_closed_form() {
    // One DMA in flight, 100 us latency: each copy holds the slot for its latency and its bytes,
    // so 4 copies take 4 x (100 us + bytes / bandwidth), the last landing as it frees its slot
    // (plus its issue and the step's overhead, under 2 us).
    let chip = ChipModel::preset("v6e")
        .unwrap()
        .with_override("fitted.dmas_in_flight", "1")
        .unwrap()
        .with_override("fitted.dma_latency_ns", "100000")
        .unwrap();
    let r = report(&chip, &[64]);
    let bw = chip.hbm.dma_bandwidth_gb_per_s.value * 1e9;
    let want_s = 4.0 * (100e-6 + (PS * D * 2) as f64 / bw);
    assert!((bound_ms(&r, "DMAs in flight") - want_s * 1e3).abs() < 1e-9);
    assert!(r.latency_ms >= want_s * 1e3 && r.latency_ms < want_s * 1e3 + 2e-3, "{} vs {}", r.latency_ms, want_s * 1e3);
    // More DMAs in flight never slow the step.
    let more = ChipModel::preset("v6e")
        .unwrap()
        .with_override("fitted.dmas_in_flight", "4")
        .unwrap()
        .with_override("fitted.dma_latency_ns", "100000")
        .unwrap();
    assert!(report(&more, &[64]).latency_ms < r.latency_ms);
}

#[test]
fn page_table_out_of_range_and_missing_lengths_are_errors() {
    let chip = ChipModel::preset("v6e").unwrap();
    let mut table: Vec<i64> = (0..16).collect();
    table[3] = PAGES as i64; // one past the last page
    let d = paged_kernel(json!({"inline": [64, 64]}), table, 2);
    let e = run_kernel_ir(&chip, &d, std::path::Path::new(".")).unwrap_err().to_string();
    assert!(e.contains("out of range") && e.contains("input 0") && e.contains("64"), "{e}");
    let d = paged_kernel(json!({"runtime": "lengths"}), (0..16).collect(), 2);
    let e = run_kernel_ir(&chip, &d, std::path::Path::new(".")).unwrap_err().to_string();
    assert!(e.contains("`lengths`") && e.contains("--runtime lengths=FILE.npy"), "{e}");
    // Bound by name, then it runs.
    let mut d = d;
    let v = tpusim_pallas::runtime::RuntimeValue { shape: vec![2], values: vec![64, 16] };
    tpusim_pallas::runtime::bind_runtime(&mut d, &[("lengths".into(), v.clone())]).unwrap();
    let run = run_kernel_ir(&chip, &d, std::path::Path::new(".")).unwrap();
    assert_eq!(run.result.hbm_bytes, 5 * PS * D * 2);
    let e = tpusim_pallas::runtime::bind_runtime(&mut d.clone(), &[("lens".into(), v)]).unwrap_err().to_string();
    // The name once, as the value of --runtime (it read `--runtime lens = lens`).
    assert!(e.contains("--runtime = lens:") && e.contains("no runtime operand") && !e.contains("lens = lens"), "{e}");
    // A name two edits away is suggested; one further off is not.
    let unbound = paged_kernel(json!({"runtime": "lengths"}), (0..16).collect(), 2);
    let e = tpusim_pallas::runtime::check_runtime_name(&unbound, "lenghts").unwrap_err().to_string();
    assert!(e.contains("did you mean `lengths`?"), "{e}");
    let e = tpusim_pallas::runtime::check_runtime_name(&unbound, "sizes").unwrap_err().to_string();
    assert!(!e.contains("did you mean") && e.contains("`lengths`"), "{e}");
}
