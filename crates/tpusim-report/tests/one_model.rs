//! One model of a kernel: the hand-written JAX Splash forward and the same kernel read from its
//! Mosaic IR (a description `tpusim.jax.describe` wrote, `crates/tpusim-pallas/benches/data`)
//! build their step bodies from op sequences through the one body builder, so they answer alike
//! on the chip as read and under what-if overrides of the register shape, the MXU and every rate:
//! equal latency, hence equal ratios (the IR path once counted chip registers and the engine
//! rescaled them again: a 256-lane VPU divided its work by 4 there and by 2 in the hand model).

use std::path::Path;
use tpusim_chip::ChipModel;
use tpusim_report::JobSpec;

fn ir_ms(chip: &ChipModel) -> f64 {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tpusim-pallas/benches/data");
    let (d, dir) = tpusim_pallas::Description::read(&dir.join("splash_full_75776_b512.json")).unwrap();
    tpusim_report::ir::run_kernel_ir(chip, &d, &dir).unwrap().result.seconds * 1e3
}

fn hand_ms(chip: &ChipModel) -> f64 {
    let spec: JobSpec = toml::from_str("kernel = 'splash'\nheads = 10\nseq_len = 75776\nhead_dim = 128\nmask = 'full'\nblock_q = 512\nblock_kv = 512\nblock_kv_compute = 512\n").unwrap();
    let job = spec.build(chip).unwrap();
    tpusim_report::run(chip, &job).unwrap().result.seconds * 1e3
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
    let d = tpusim_pallas::Description::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../tpusim-pallas/benches/data/splash_full_75776_b512.json")).unwrap();
    let vpu = |c: &ChipModel| tpusim_report::ir::run_kernel_ir(c, &d.0, &d.1).unwrap().result.busy[tpusim_kernel::Unit::Vpu];
    assert!((vpu(&wide) / vpu(&base) - 0.5).abs() < 1e-9, "{} / {}", vpu(&wide), vpu(&base));
}
