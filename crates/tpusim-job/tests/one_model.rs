//! One model of a kernel: the hand-written JAX Splash forward and the same kernel read from its
//! Mosaic IR (a description `tpusim.jax.describe` wrote, `crates/tpusim-pallas/benches/data`)
//! build their step bodies from op sequences through the one body builder, so they answer alike
//! on the chip as read and under what-if overrides of the register shape, the MXU and every rate:
//! equal latency, hence equal ratios (the IR path once counted chip registers and the engine
//! rescaled them again: a 256-lane VPU divided its work by 4 there and by 2 in the hand model).

use std::path::Path;
use tpusim_chip::ChipModel;
use tpusim_job::{DescribedJob, Job, JobSpec, Report};

/// The JAX Splash forward of the hand model read from its IR, as a job.
fn ir_job() -> Job {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tpusim-pallas/benches/data/splash_full_75776_b512.json");
    let (d, dir) = tpusim_pallas::Description::read(&path).unwrap();
    Job::Described(DescribedJob::new(path.display().to_string(), d, dir))
}

/// The same kernel as the hand model's job.
fn hand_job(chip: &ChipModel) -> Job {
    let spec: JobSpec = toml::from_str("kernel = 'splash'\nheads = 10\nseq_len = 75776\nhead_dim = 128\nmask = 'full'\nblock_q = 512\nblock_kv = 512\nblock_kv_compute = 512\n").unwrap();
    spec.build(chip).unwrap()
}

fn ir_ms(chip: &ChipModel) -> f64 {
    tpusim_job::run(chip, &ir_job()).unwrap().result.seconds * 1e3
}

fn hand_ms(chip: &ChipModel) -> f64 {
    tpusim_job::run(chip, &hand_job(chip)).unwrap().result.seconds * 1e3
}

#[test]
fn both_front_ends_answer_every_what_if_alike() {
    let base = ChipModel::preset("v6e").unwrap();
    let (ir0, hand0) = (ir_ms(&base), hand_ms(&base));
    assert_eq!(ir0, hand0, "the chip as read");
    for set in [
        "vpu.lanes=256",
        "vpu.sublanes=16",
        "mxu.rows=128",
        "mxu.columns=128",
        "mxu.passes_per_cycle=4",
        "mxu.count=4",
        "fitted.valu_vreg_ops_per_cycle=8",
        "fitted.eup_vregs_per_cycle=1",
        "fitted.xlu_cycles_per_vreg=2",
        "fitted.grid_step_overhead_cycles=200",
        "hbm.bandwidth_gb_per_s=3276",
        "device.clock_ghz=2.1",
    ] {
        let (k, v) = set.split_once('=').unwrap();
        let chip = base.with_override(k, v).unwrap_or_else(|e| panic!("{set}: {e}"));
        let (ir, hand) = (ir_ms(&chip), hand_ms(&chip));
        assert_eq!(ir, hand, "--set {set}: IR {ir} ms, hand {hand} ms");
        assert_eq!(ir / ir0, hand / hand0, "--set {set}");
    }
    // The register shape scales both alike: twice the lanes halves the vector work.
    let wide = base.with_override("vpu.lanes", "256").unwrap();
    let vpu = |c: &ChipModel| tpusim_job::run(c, &ir_job()).unwrap().result.busy[tpusim_model::Unit::Vpu];
    assert!((vpu(&wide) / vpu(&base) - 0.5).abs() < 1e-9, "{} / {}", vpu(&wide), vpu(&base));
}

/// One report for both front ends: the shared metrics of the two reports are computed once, so
/// they are equal field by field (the what-if table and the bound-by rule included); what
/// differs is what each job states (the family and workload of the hand model, the file and
/// assumptions of the IR path).
#[test]
fn both_front_ends_report_the_same_metrics() {
    let chip = ChipModel::preset("v6e").unwrap();
    let ir = Report::from_run(&tpusim_job::run(&chip, &ir_job()).unwrap());
    let hand = Report::from_run(&tpusim_job::run(&chip, &hand_job(&chip)).unwrap());
    assert_eq!(ir.latency_ms, hand.latency_ms);
    assert_eq!(ir.what_if_2x, hand.what_if_2x);
    assert_eq!((ir.bottleneck, &ir.co_bound, ir.bound_rule), (hand.bottleneck, &hand.co_bound, hand.bound_rule));
    assert_eq!((ir.flops, ir.transcendentals, ir.hbm_bytes, ir.grid_steps), (hand.flops, hand.transcendentals, hand.hbm_bytes, hand.grid_steps));
    assert_eq!((ir.steps_computed, ir.cost_estimate, ir.dma_stall_ms), (hand.steps_computed, hand.cost_estimate, hand.dma_stall_ms));
    assert_eq!((&ir.utilization, &ir.busy_ms), (&hand.utilization, &hand.busy_ms));
    // The critical path is summed step by step, and the hand model folds identical heads into
    // scaled sums: equal to rounding.
    for u in tpusim_model::Unit::ALL {
        let (a, b) = (ir.critical_path_ms[*u], hand.critical_path_ms[*u]);
        assert!((a - b).abs() <= 1e-12 * a.abs().max(1.0), "critical path {u}: IR {a} ms, hand {b} ms");
    }
    // The same bodies run the same number of steps (the classes' order is each front end's own).
    let sig = |r: &Report| {
        let mut v = r.step_classes.iter().map(|c| (c.signature.clone(), c.steps, c.ops)).collect::<Vec<_>>();
        v.sort();
        v
    };
    assert_eq!(sig(&ir), sig(&hand));
    // What each job states.
    assert!(ir.kernel.is_none() && hand.kernel == Some(tpusim_kernel::Kernel::Splash));
    assert!(!ir.assumptions.is_empty() && hand.assumptions.is_empty());
    let json: serde_json::Value = serde_json::from_str(&ir.to_json()).unwrap();
    assert_eq!(json["job"]["kind"], "described");
    assert!(json.get("pair_density").is_none() && json.get("kernel").is_none(), "attention-only fields are absent");
}

/// `tpusim run --kernel xla-matmul` without blocks takes XLA's tiling as the layer and program
/// paths do (tpusim_kernel::matmul::lower_xla): balanced output tiles, halved on a chip whose
/// VMEM the family's default overflows (v4's 16 MiB refused it: a fresh user's finding).
#[test]
fn an_xla_dot_job_takes_the_tiling_the_program_path_takes() {
    for (chip, m) in [("v6e", 18_900u64), ("v4", 4096)] {
        let chip = tpusim_chip::ChipModel::preset(chip).unwrap();
        let spec = tpusim_job::JobSpec::from_toml_str(&format!("kernel = 'xla-matmul'\nm = {m}\nn = 4096\nk = 4096\n"), "test").unwrap();
        let job = spec.build(&chip).unwrap_or_else(|e| panic!("{}: {e}", chip.name));
        let mm = tpusim_workload::MatmulCall { m, n: 4096, k: 4096 };
        let (want, _) = tpusim_kernel::matmul::lower_xla(&chip, &mm).unwrap();
        let tpusim_job::Job::Matmul { config, .. } = &job else { panic!("a matmul job") };
        assert_eq!(config, &want, "{}", chip.name);
        assert!(tpusim_job::run(&chip, &job).is_ok(), "{}", chip.name);
    }
    assert_eq!(tpusim_kernel::matmul::balanced_block(18_900, 2048, 8), 1896);
}
