//! The backward pass (issue: Splash dq / dkv kernels): matmul counts, which tiles each kernel
//! visits, monotonicity in the mask, fused against unfused, and refusals of bad blocks.

use proptest::prelude::*;
use tpusim_model::{Part, PhaseWork, Program};
use tpusim_job::{run, JobSpec, Report};
use tpusim_workload::Mask;

fn spec(toml: &str) -> JobSpec {
    JobSpec::from_toml_str(toml, "test").unwrap_or_else(|e| panic!("{toml}: {e}"))
}

fn report(toml: &str) -> Report {
    let s = spec(toml);
    let chip = s.chip().unwrap();
    let job = s.build(&chip).unwrap_or_else(|e| panic!("{toml}: {e}"));
    Report::from_run(&run(&chip, &job).unwrap_or_else(|e| panic!("{toml}: {e}")))
}

/// The kernels of a job's lowering, by part.
fn kernels(toml: &str) -> Vec<(Part, Program)> {
    let s = spec(toml);
    let chip = s.chip().unwrap();
    let job = s.build(&chip).unwrap_or_else(|e| panic!("{toml}: {e}"));
    job.lower(&chip)
        .unwrap_or_else(|e| panic!("{toml}: {e}"))
        .phases
        .into_iter()
        .filter_map(|p| match p.work {
            PhaseWork::Kernel(k) => Some((p.part, (*k).clone())),
            PhaseWork::Fusion(_) => None,
        })
        .collect()
}

/// Brute-force tile kind of the (qi, kj) tile of `mask` at blocks (bq, bkv) over lengths
/// (q_len, kv_len): 0 empty, 1 partial, 2 full, counting every pair (padding is not kept).
fn tile_kind(mask: &Mask, q_len: u64, kv_len: u64, bq: u64, bkv: u64, qi: u64, kj: u64) -> u8 {
    let mut kept = 0u64;
    let mut iv = Vec::new();
    for q in qi * bq..((qi + 1) * bq).min(q_len) {
        mask.row_intervals(q, kv_len, &mut iv);
        for &(lo, hi) in &iv {
            let (a, b) = (lo.max(kj * bkv), hi.min((kj + 1) * bkv));
            kept += b.saturating_sub(a);
        }
    }
    if kept == 0 {
        0
    } else if kept == bq * bkv {
        2
    } else {
        1
    }
}

/// Checks that `program` visits exactly the non-empty tiles of `mask` at (bq, bkv), each once,
/// with its kind; `transposed` when the grid's second coordinate is the kv block (dkv kernel).
fn check_visits(program: &Program, mask: &Mask, len: u64, heads: u64, bq: u64, bkv: u64, transposed: bool) {
    let (nq, nk) = (len.div_ceil(bq), len.div_ceil(bkv));
    let mut seen = vec![0u32; (heads * nq * nk) as usize];
    program.for_each_step(&mut |s| {
        let key = &program.classes[s.class as usize].key;
        if key.tile == "empty" {
            return;
        }
        let (qi, kj) = if transposed { (s.coords[2] as u64, s.coords[1] as u64) } else { (s.coords[1] as u64, s.coords[2] as u64) };
        let h = s.coords[0] as u64;
        let want = tile_kind(mask, len, len, bq, bkv, qi, kj);
        assert_ne!(want, 0, "visited an empty tile ({qi}, {kj}) of {mask}");
        assert_eq!(key.tile == "full", want == 2, "tile ({qi}, {kj}) of {mask}: kind {}", key.tile);
        seen[((h * nq + qi) * nk + kj) as usize] += 1;
    });
    for h in 0..heads {
        for qi in 0..nq {
            for kj in 0..nk {
                let n = seen[((h * nq + qi) * nk + kj) as usize];
                let nonempty = tile_kind(mask, len, len, bq, bkv, qi, kj) != 0;
                assert_eq!(n, u32::from(nonempty), "head {h} tile ({qi}, {kj}) of {mask} visited {n} times");
            }
        }
    }
}

fn mask_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("full".to_string()),
        Just("causal".to_string()),
        (0u64..1500).prop_map(|w| format!("band:{w}")),
        (0u64..1500, 0u64..1500).prop_map(|(l, r)| format!("local:{l},{r}")),
        (0u64..1500, 1u64..700).prop_map(|(w, s)| format!("band:{w}+sink:{s}")),
        (1u64..1500).prop_map(|c| format!("chunked:{c}")),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Backward FLOPs are the analytic count: per visited tile of the fused kernel five matmuls
    /// (QK^T recomputed, dO V^T, dV += P^T dO, dK += dS^T Q, dQ += dS K); the unfused path runs
    /// QK^T and dO V^T in both its kernels (dq: three matmuls, dkv: four).
    #[test]
    fn backward_flops_are_the_analytic_count(
        len in 256u64..3000, d in prop::sample::select(vec![64u64, 128, 256]), bq in 1u64..=6, bkv in 1u64..=6,
        mask in mask_strategy(), fused in any::<bool>(),
    ) {
        // Blocks no larger than the sequence (the block rules refuse longer ones).
        let (bq, bkv) = ((bq * 128).min(len / 128 * 128), (bkv * 128).min(len / 128 * 128));
        let kernel = if fused { "tokamax-splash" } else { "splash" };
        let dq = if fused { String::new() } else { format!("block_q_dq = {bq}\nblock_kv_dq = {bkv}\n") };
        let toml = format!(
            "kernel = '{kernel}'\ndirection = 'bwd'\nheads = 2\nseq_len = {len}\nhead_dim = {d}\nmask = '{mask}'\n\
             block_q_dkv = {bq}\nblock_kv_dkv = {bkv}\nblock_kv_dkv_compute = {bkv}\n{dq}vmem_limit_mib = 128\n"
        );
        let r = report(&toml);
        let mut useful = 0.0;
        for p in r.phases.iter().filter(|p| p.kernel) {
            let t = p.tiles.expect("kernel tiles");
            // Executed at head_dim padded to 128 lanes (the padding rule); useful at d.
            let per_tile = 2.0 * (bq * bkv * d.next_multiple_of(128)) as f64;
            let matmuls = match p.part { Part::FusedBackward => 5.0, Part::Dq => 3.0, Part::Dkv => 4.0, other => panic!("{other:?}") };
            let want = t.visited as f64 * matmuls * per_tile;
            prop_assert!((p.flops - want).abs() <= 1e-9 * want.max(1.0), "{:?}: {} vs {want} ({toml})", p.part, p.flops);
            useful += want * d as f64 / d.next_multiple_of(128) as f64;
        }
        // Useful (model) FLOPs: the mask's kept pairs, 10 x head_dim each (FlashAttention's
        // backward count), never more than the executed at the operands' own dims.
        let kept = r.pair_density.expect("a pair density") * 2.0 * (len * len) as f64;
        let model = kept * 10.0 * d as f64;
        prop_assert!((r.useful_flops - model).abs() <= 1e-9 * model.max(1.0), "useful {} vs {model} ({toml})", r.useful_flops);
        prop_assert!(r.useful_flops <= useful * (1.0 + 1e-9), "useful {} above the executed at own dims {useful} ({toml})", r.useful_flops);
    }

    /// The dq kernel visits the forward's tiles and the dkv kernel the transposed mask's, each
    /// non-empty tile once with its kind (brute force on small sizes).
    #[test]
    fn dq_and_dkv_visit_the_mask_and_its_transpose(
        len in 256u64..1600, bq in 1u64..=4, bkv in 1u64..=4, mask in mask_strategy(),
    ) {
        let (bq, bkv) = ((bq * 128).min(len / 128 * 128), (bkv * 128).min(len / 128 * 128));
        let toml = format!(
            "kernel = 'splash'\ndirection = 'bwd'\nheads = 2\nseq_len = {len}\nhead_dim = 64\nmask = '{mask}'\ntraversal = 'compact'\n\
             block_q_dkv = {bq}\nblock_kv_dkv = {bkv}\nblock_kv_dkv_compute = {bkv}\nblock_q_dq = {bq}\nblock_kv_dq = {bkv}\n"
        );
        let m = Mask::parse(&mask).unwrap();
        let ks = kernels(&toml);
        let dq = &ks.iter().find(|(p, _)| *p == Part::Dq).expect("a dq kernel").1;
        let dkv = &ks.iter().find(|(p, _)| *p == Part::Dkv).expect("a dkv kernel").1;
        check_visits(dq, &m, len, 2, bq, bkv, false);
        check_visits(dkv, &m, len, 2, bq, bkv, true);
    }

    /// A band inside a wider band never costs the backward more (compacted grid, the mask on
    /// every visited tile, so every visited tile costs the same).
    #[test]
    fn a_subset_mask_never_costs_the_backward_more(w1 in 0u64..2000, extra in 0u64..2000, len in 1024u64..4096) {
        let job = |w: u64| format!(
            "kernel = 'tokamax-splash'\ndirection = 'bwd'\nheads = 2\nseq_len = {len}\nhead_dim = 128\nmask = 'band:{w}'\n\
             traversal = 'compact'\nmasking = 'all'\nblock_q_dkv = 512\nblock_kv_dkv = 512\nblock_kv_dkv_compute = 512\n"
        );
        let small = report(&job(w1));
        let big = report(&job(w1 + extra));
        prop_assert!(small.kernel_ms <= big.kernel_ms * (1.0 + 1e-9), "band:{w1} {} > band:{} {}", small.kernel_ms, w1 + extra, big.kernel_ms);
    }
}

#[test]
fn fused_and_unfused_agree_on_useful_work_but_the_two_kernel_path_recomputes() {
    let base =
        "direction = 'bwd'\nheads = 4\nseq_len = 4096\nhead_dim = 128\nblock_q_dkv = 512\nblock_kv_dkv = 512\nblock_kv_dkv_compute = 512\n";
    let fused = report(&format!("kernel = 'splash'\nfused_bwd = true\n{base}"));
    let unfused = report(&format!("kernel = 'splash'\nfused_bwd = false\nblock_q_dq = 512\nblock_kv_dq = 512\n{base}"));
    // Useful work: five matmuls of 2 x 4096^2 x 128 per head.
    let useful = 4.0 * 5.0 * 2.0 * 4096.0 * 4096.0 * 128.0;
    assert!((fused.flops / useful - 1.0).abs() < 1e-9, "{} vs {useful}", fused.flops);
    // Executed: seven against five (QK^T and dO V^T in both kernels).
    assert!((unfused.flops / fused.flops - 7.0 / 5.0).abs() < 1e-9, "{} vs {}", unfused.flops, fused.flops);
    let parts: Vec<Part> = unfused.phases.iter().filter(|p| p.kernel).map(|p| p.part).collect();
    assert_eq!(parts, [Part::Dq, Part::Dkv]);
    let parts: Vec<Part> = fused.phases.iter().filter(|p| p.kernel).map(|p| p.part).collect();
    assert_eq!(parts, [Part::FusedBackward]);
}

#[test]
fn a_training_step_is_the_forward_with_residuals_then_the_backward() {
    let base = "heads = 4\nseq_len = 4096\nhead_dim = 128\nmask = 'causal'\n";
    let (f, b) = ("block_q = 1024\nblock_kv = 1024\n", "block_q_dkv = 1024\nblock_kv_dkv = 1024\n");
    let fwd = report(&format!("direction = 'fwd'\nreturn_residuals = true\n{base}{f}"));
    let bwd = report(&format!("direction = 'bwd'\n{base}{b}"));
    let both = report(&format!("direction = 'fwd+bwd'\n{base}{f}{b}"));
    assert!((both.latency_ms - fwd.latency_ms - bwd.latency_ms).abs() < 1e-9 * both.latency_ms);
    assert!(both.phases.iter().any(|p| p.part == Part::Forward) && both.phases.iter().any(|p| p.part == Part::FusedBackward));
    // The backward does five matmuls where the forward does two.
    assert!((bwd.flops / fwd.flops - 2.5).abs() < 1e-9, "{} vs {}", bwd.flops, fwd.flops);
}

#[test]
fn bad_backward_blocks_are_refused_naming_the_field() {
    let refuse = |toml: &str, needles: &[&str]| {
        let s = spec(toml);
        let chip = s.chip().unwrap();
        let e = match s.build(&chip) {
            Err(e) => e.to_string(),
            Ok(job) => run(&chip, &job).err().map(|e| e.to_string()).unwrap_or_else(|| panic!("{toml}: ran")),
        };
        for n in needles {
            assert!(e.contains(n), "{toml}: error lacks {n:?}: {e}");
        }
    };
    let base = "heads = 2\nseq_len = 4096\nhead_dim = 128\n";
    refuse(&format!("direction = 'bwd'\n{base}block_q_dkv = 100\n"), &["block_q_dkv", "100"]);
    refuse(&format!("direction = 'bwd'\n{base}block_kv_dkv = 1000\n"), &["block_kv_dkv", "1000"]);
    refuse(&format!("direction = 'bwd'\n{base}block_kv_dkv = 1024\nblock_kv_dkv_compute = 384\n"), &["block_kv_dkv_compute", "384"]);
    let jax_blocks = "block_q_dkv = 512\nblock_kv_dkv = 512\nblock_kv_dq = 512\n";
    refuse(&format!("kernel = 'splash'\ndirection = 'bwd'\nfused_bwd = false\n{base}{jax_blocks}block_q_dq = 12\n"), &["block_q_dq", "12"]);
    // JAX's BlockSizes with blocks given but not the backward's cannot run a backward.
    refuse(&format!("kernel = 'splash'\ndirection = 'fwd+bwd'\n{base}block_q = 512\nblock_kv = 512\n"), &["block_q_dkv", "block_kv_dq", "Need to specify backward blocks"]);
    refuse(&format!("kernel = 'flash-attention'\ndirection = 'bwd'\n{base}block_q_dkv = 512\nblock_kv_dkv = 512\n"), &["block_q_dq", "block_kv_dq"]);
    // Backward blocks with a forward-only job, and the unfused path on tokamax (fused only).
    refuse(&format!("direction = 'fwd'\n{base}block_q_dkv = 512\n"), &["block_q_dkv"]);
    refuse(&format!("kernel = 'tokamax-splash'\ndirection = 'bwd'\nfused_bwd = false\n{base}"), &["fused_bwd"]);
}

/// Backward blocks a job does not give come from the family's rule: JAX's defaults when no block
/// is given at all, the forward's blocks for MaxDiffusion's kernels, tokamax's own backward
/// defaults whatever the forward's; the report says which.
#[test]
fn backward_blocks_follow_each_library() {
    let base = "heads = 2\nseq_len = 4096\nhead_dim = 128\ndirection = 'fwd+bwd'\n";
    let fwd = "block_q = 1024\nblock_kv = 512\nblock_kv_compute = 256\n";
    let config = |toml: &str| {
        let s = spec(toml);
        match s.build(&s.chip().unwrap()).unwrap() {
            tpusim_job::Job::Attention { config, .. } => config.bwd,
            _ => panic!("attention"),
        }
    };
    let b = config(&format!("kernel = 'sparse-splash'\n{base}{fwd}"));
    assert_eq!((b.block_q_dkv, b.block_kv_dkv, b.block_kv_dkv_compute, b.block_q_dq, b.block_kv_dq), (1024, 512, 256, 1024, 512));
    let b = config(&format!("kernel = 'sparse-splash'\n{base}{fwd}block_q_dq = 256\nblock_kv_dq = 256\n"));
    assert_eq!((b.block_q_dkv, b.block_q_dq, b.block_kv_dq), (1024, 256, 256));
    let b = config(&format!("kernel = 'tokamax-splash'\n{base}{fwd}"));
    assert_eq!((b.block_q_dkv, b.block_kv_dkv, b.block_kv_dkv_compute), (128, 128, 128));
    let b = config(&format!("kernel = 'splash'\n{base}"));
    assert_eq!((b.block_q_dkv, b.block_q_dq), (128, 128));
    let rep = report(&format!("kernel = 'sparse-splash'\n{base}{fwd}"));
    assert!(rep.notes.iter().any(|n| n.contains("dq kernel runs at block_q_dq 1024, block_kv_dq 512 (the forward's blocks")), "{:?}", rep.notes);
    let rep = report(&format!("kernel = 'tokamax-splash'\n{base}{fwd}"));
    assert!(rep.notes.iter().any(|n| n.contains("fused dq/dk/dv kernel runs at block_q_dkv 128") && n.contains("backward default")), "{:?}", rep.notes);
}
