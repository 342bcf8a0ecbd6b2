//! A kernel read from its IR multiplies 8-bit operands at the chip's 8-bit rates: the reader's
//! `lhs_dtype` / `rhs_dtype` reach the engine (`tpusim_model::mxu::MxuType`), and the MXU's busy
//! time follows the chip model's XLA cadences against bf16.

use serde_json::{json, Value};
use tpusim_chip::ChipModel;
use tpusim_model::Unit;
use tpusim_job::{DescribedJob, Job, Report};

/// A one-step kernel: `m x k` by `k x n` from VMEM scratch typed `lhs` and `rhs`, accumulated in f32.
fn kernel(m: u64, k: u64, n: u64, lhs: &str, rhs: &str) -> Value {
    json!({
        "format": "tpusim-kernel-description", "version": 1, "kernel_name": "mm",
        "kernel_metadata": null, "producer": {"tool": "test", "jax": "", "device_kind": "", "mosaic_version": 11},
        "grid": [1], "dimension_semantics": ["arbitrary"], "vmem_limit_bytes": null, "cost_estimate": null,
        "refs": [
            {"name": "scratch 0", "kind": "scratch", "shape": [m, k], "dtype": lhs, "memory_space": "vmem"},
            {"name": "scratch 1", "kind": "scratch", "shape": [k, n], "dtype": rhs, "memory_space": "vmem"},
            {"name": "scratch 2", "kind": "scratch", "shape": [m, n], "dtype": "f32", "memory_space": "vmem"}
        ],
        "body": [
            {"op": "vector.load", "id": 1, "operands": [{"ref": 0}, {"scalar": 0}, {"scalar": 0}], "shape": [m, k], "dtype": lhs, "loc": "k.py:1"},
            {"op": "vector.load", "id": 2, "operands": [{"ref": 1}, {"scalar": 0}, {"scalar": 0}], "shape": [k, n], "dtype": rhs, "loc": "k.py:2"},
            {"op": "vector.load", "id": 3, "operands": [{"ref": 2}, {"scalar": 0}, {"scalar": 0}], "shape": [m, n], "dtype": "f32", "loc": "k.py:3"},
            {"op": "tpu.matmul", "id": 4, "operands": [{"op": 1}, {"op": 2}, {"op": 3}], "shape": [m, n], "dtype": "f32", "loc": "k.py:4",
             "attrs": {"mkn": [m, k, n], "lhs_dtype": lhs, "rhs_dtype": rhs}}
        ]
    })
}

fn mxu_ms(chip: &str, v: &Value) -> f64 {
    let chip = ChipModel::preset(chip).expect("preset");
    let d = tpusim_pallas::Description::from_json(&v.to_string(), "mm.json").expect("reads");
    let job = Job::Described(DescribedJob::new("mm.json", d, "."));
    let r = Report::from_run(&tpusim_job::run(&chip, &job).expect("simulates"));
    r.busy_ms[Unit::Mxu]
}

#[test]
fn eight_bit_operands_run_at_the_chips_eight_bit_rates() {
    let fp8 = "f8E4M3FN";
    // Stream-bound (2048 rows through 512 x 512 weights) and weight-load-bound (8 rows through
    // 4096 x 2048): (chip, lhs, rhs, stream ratio, load ratio) against bf16 on the same chip.
    for (chip, lhs, rhs, stream, load) in [
        ("v7x", fp8, fp8, 0.5, 0.5),
        ("v6e", fp8, fp8, 1.0, 0.5),
        ("v6e", "i8", "i8", 0.5, 0.5),
        ("v7x", "i8", "i8", 1.0, 1.0),
        // Mixed types are a bf16 matmul (the narrower operand widened).
        ("v7x", "bf16", fp8, 1.0, 1.0),
    ] {
        for ((m, k, n), want) in [((2048, 512, 512), stream), ((8, 4096, 2048), load)] {
            let base = mxu_ms(chip, &kernel(m, k, n, "bf16", "bf16"));
            let eight = mxu_ms(chip, &kernel(m, k, n, lhs, rhs));
            assert!(base > 0.0);
            let ratio = eight / base;
            assert!((ratio - want).abs() < 1e-9, "{chip} {lhs} x {rhs} {m}x{k}x{n}: {eight} ms vs bf16 {base} ms");
        }
    }
}

fn report(chip: &str, v: &Value) -> Report {
    let chip = ChipModel::preset(chip).expect("preset");
    let d = tpusim_pallas::Description::from_json(&v.to_string(), "mm.json").expect("reads");
    let job = Job::Described(DescribedJob::new("mm.json", d, "."));
    Report::from_run(&tpusim_job::run(&chip, &job).expect("simulates"))
}

/// The MFU stays against the bf16 peak: a note names the 8-bit type's faster peak where its row
/// rate is not bf16's, and the weight-load note gives an 8-bit fold's own load time.
#[test]
fn notes_name_the_eight_bit_peak_and_fold_load() {
    let fp8 = "f8E4M3FN";
    let peak_note = |r: &Report| r.notes.iter().any(|n| n.contains("MFU counts against the bf16 peak"));
    // Stream-bound fp8 on v7x: twice bf16's rows, so the note; on v6e fp8 streams at bf16's rate.
    let v7x = report("v7x", &kernel(2048, 512, 512, fp8, fp8));
    assert!(peak_note(&v7x), "{:?}", v7x.notes);
    assert!(v7x.notes.iter().any(|n| n.contains("fp8 (100% of MXU time) at 2x bf16's row rate")), "{:?}", v7x.notes);
    assert!(!peak_note(&report("v6e", &kernel(2048, 512, 512, fp8, fp8))));
    assert!(!peak_note(&report("v7x", &kernel(2048, 512, 512, "bf16", "bf16"))));
    // Load-bound: an fp8 fold loads in 128 of a bf16 fold's 256 cycles.
    let load = report("v6e", &kernel(8, 4096, 2048, fp8, fp8));
    assert!(load.notes.iter().any(|n| n.contains("loading a fold of fp8 weights takes 128 cycles (0.5x a bf16 fold's 256")), "{:?}", load.notes);
}
