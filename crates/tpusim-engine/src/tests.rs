//! Engine tests: invariants of the pipeline and the equality of the fast (steady-state jump)
//! and step-by-step paths.

use super::*;
use tpusim_kernel::{matmul, splash, MatmulConfig, SplashConfig};
use tpusim_workload::{AttentionCall, MatmulCall};

fn v6e() -> ChipModel {
    ChipModel::preset("v6e").unwrap()
}

#[test]
fn busy_never_exceeds_total() {
    let chip = v6e();
    let w = AttentionCall::video_default();
    let p = splash::lower(&chip, &w, &SplashConfig::with_blocks(2048, 2048, None)).unwrap();
    let r = simulate(&chip, &p);
    for (n, u) in r.utilization().iter() {
        assert!((0.0..=1.0 + 1e-9).contains(&u), "{n} {u}");
    }
    assert!(r.cycles > 0.0);
}

#[test]
fn body_schedule_overlaps_units() {
    let chip = v6e();
    let w = AttentionCall::video_default();
    let p = splash::lower(&chip, &w, &SplashConfig::with_blocks(2048, 2048, None)).unwrap();
    let t = schedule_body(&chip, &p.classes[1].body);
    let serial = t.busy.total();
    let longest = Unit::COMPUTE.iter().map(|&u| t.busy[u]).fold(0.0, f64::max);
    assert!(t.cycles < serial, "no overlap: {} vs {serial}", t.cycles);
    assert!(t.cycles >= longest);
}

#[test]
fn critical_path_sums_to_total() {
    let chip = v6e();
    let w = AttentionCall::video_default();
    let p = splash::lower(&chip, &w, &SplashConfig::with_blocks(2048, 2048, None)).unwrap();
    let r = simulate(&chip, &p);
    let sum: f64 = r.critical.total();
    assert!((sum / r.cycles - 1.0).abs() < 1e-6, "{sum} vs {}", r.cycles);
    for t in &r.class_timing {
        let s: f64 = t.critical.total();
        assert!((s - t.cycles).abs() < 1e-6 * t.cycles.max(1.0), "{s} vs {}", t.cycles);
    }
}

#[test]
fn steady_state_fast_path_equals_step_by_step() {
    let chip = v6e();
    let cases: Vec<(AttentionCall, SplashConfig)> = ["full", "causal", "band:3000+sink:700", "local:2000,0"]
        .iter()
        .flat_map(|m| {
            [tpusim_kernel::Traversal::Compact, tpusim_kernel::Traversal::FullGrid].into_iter().map(move |t| {
                let mut w = AttentionCall::video_default();
                w.q_len = 12_000;
                w.kv_len = 12_000;
                w.q_heads = 3;
                w.kv_heads = 3;
                w.mask = tpusim_workload::Mask::parse(m).unwrap();
                let mut c = SplashConfig::with_blocks(2048, 2048, None);
                c.block_q = 1024;
                c.block_kv = 512;
                c.block_kv_compute = 512;
                c.traversal = t;
                c.masking = tpusim_kernel::Masking::Partial;
                (w, c)
            })
        })
        .collect();
    for (w, c) in cases {
        let p = splash::lower(&chip, &w, &c).unwrap();
        let fast = simulate(&chip, &p);
        let slow = simulate_observed(&chip, &p, &mut |_, _| {});
        assert_eq!(fast.grid_steps, slow.grid_steps);
        assert_eq!(fast.class_steps, slow.class_steps);
        assert_eq!(fast.hbm_bytes, slow.hbm_bytes);
        for (a, b) in [
            (fast.cycles, slow.cycles),
            (fast.dma_stall_cycles, slow.dma_stall_cycles),
            (fast.critical[Unit::Hbm], slow.critical[Unit::Hbm]),
            (fast.critical[Unit::StepControl], slow.critical[Unit::StepControl]),
        ] {
            assert!((a - b).abs() <= 1e-9 * b.abs().max(1.0), "{} {:?}: fast {a} vs step-by-step {b}", w.mask, c.traversal);
        }
    }
    // A DMA-latency-bound matmul (every step waits for its prefetch) also reaches a steady state.
    let chip5 = ChipModel::preset("v5e").unwrap();
    let mm = MatmulCall { m: 1024, n: 1024, k: 4096 };
    let p = matmul::lower(&chip5, &mm, &MatmulConfig::blocks(128, 128, 128)).unwrap();
    let fast = simulate(&chip5, &p);
    let slow = simulate_observed(&chip5, &p, &mut |_, _| {});
    assert!((fast.cycles - slow.cycles).abs() <= 1e-9 * slow.cycles);
}

#[test]
fn repeated_heads_fold_exactly() {
    let chip = v6e();
    let masks = ["full", "causal", "band:2000+sink:300", "per-head[3*causal;5*band:900]", "per-head[2*full;2*local:700,0;4*sink:64]"];
    for (mask, batch, heads, kv_heads, len, bkv) in [
        (0usize, 3u64, 8u64, 8u64, 6000u64, 512u64),
        (1, 2, 8, 2, 5000, 1024),
        (2, 4, 4, 1, 4000, 512),
        (3, 2, 8, 4, 3000, 512),
        (4, 3, 8, 8, 2048, 2048),
        (0, 5, 4, 2, 1000, 1024), // one kv tile per row with GQA: the kv copy is elided across heads
    ] {
        let mut w = AttentionCall::video_default();
        w.batch = batch;
        w.q_heads = heads;
        w.kv_heads = kv_heads;
        w.q_len = len;
        w.kv_len = len;
        w.mask = tpusim_workload::Mask::parse(masks[mask]).unwrap();
        for t in [tpusim_kernel::Traversal::Compact, tpusim_kernel::Traversal::FullGrid] {
            let mut c = SplashConfig::with_blocks(2048, 2048, None);
            c.block_q = 512;
            c.block_kv = bkv;
            c.block_kv_compute = bkv.min(512);
            c.traversal = t;
            c.masking = tpusim_kernel::Masking::Partial;
            let p = splash::lower(&chip, &w, &c).unwrap();
            let fast = simulate(&chip, &p);
            let slow = simulate_observed(&chip, &p, &mut |_, _| {});
            assert_eq!(fast.grid_steps, slow.grid_steps, "{} {t:?}", masks[mask]);
            assert_eq!(fast.class_steps, slow.class_steps, "{} {t:?}", masks[mask]);
            assert_eq!(fast.hbm_bytes, slow.hbm_bytes, "{} {t:?}", masks[mask]);
            for (a, b) in [
                (fast.cycles, slow.cycles),
                (fast.dma_stall_cycles, slow.dma_stall_cycles),
                (fast.critical[Unit::StepControl], slow.critical[Unit::StepControl]),
            ] {
                assert!((a - b).abs() <= 1e-9 * b.abs().max(1.0), "{} {t:?}: fast {a} vs step-by-step {b}", masks[mask]);
            }
        }
    }
}

#[test]
fn matmul_flops_and_bytes() {
    let chip = ChipModel::preset("v5e").unwrap();
    let mm = MatmulCall { m: 2048, n: 2048, k: 2048 };
    let p = matmul::lower(&chip, &mm, &MatmulConfig::blocks(512, 1024, 1024)).unwrap();
    let r = simulate(&chip, &p);
    assert!((r.flops - mm.flops()).abs() < 1.0);
    // A large-block matmul is MXU-bound: at 1024-cubed blocks (512 FLOP per byte against v5e's
    // ridge of 240) the run waits on the MXU; at 512 x 1024 x 1024 its copies keep the DMA
    // engines about as busy as the MXU (85% and 87%) and the run waits on either.
    let p = matmul::lower(&chip, &mm, &MatmulConfig::blocks(1024, 1024, 1024)).unwrap();
    assert_eq!(simulate(&chip, &p).bottleneck(), Unit::Mxu);
}

#[test]
fn more_bandwidth_is_never_slower() {
    let chip = v6e();
    let fast = chip.with_override("hbm.bandwidth_gb_per_s", "3276").unwrap();
    let mm = MatmulCall { m: 4096, n: 4096, k: 4096 };
    let cfg = MatmulConfig::blocks(128, 128, 128);
    let a = simulate(&chip, &matmul::lower(&chip, &mm, &cfg).unwrap()).cycles;
    let b = simulate(&fast, &matmul::lower(&fast, &mm, &cfg).unwrap()).cycles;
    assert!(b <= a, "{b} > {a}");
}

/// 8-bit matmuls against bf16 by the chips' factors from XLA's cadences (`matmul_parts`): v6e streams int8 at
/// twice bf16's row rate and fp8 at bf16's, v7x fp8 at twice and int8 (run as bf16) at bf16's;
/// 8-bit weights load in half a bf16 fold's time where the type is native.
#[test]
fn eight_bit_matmuls_stream_and_latch_by_the_chips_cadences() {
    use tpusim_model::{mxu::MxuType, Work};
    let v7x = ChipModel::preset("v7x").unwrap();
    let mm = |m: u64, k: u64, n: u64, t: MxuType| Work::Matmul { m, k, n, m_total: m, mxu_type: t };
    // (chip, type, stream-bound ratio, load-bound ratio) against bf16 on the same chip.
    for (chip, t, stream, load) in [
        (v6e(), MxuType::Int8, 0.5, 0.5),
        (v6e(), MxuType::Fp8, 1.0, 0.5),
        (v7x.clone(), MxuType::Fp8, 0.5, 0.5),
        (v7x.clone(), MxuType::Int8, 1.0, 1.0),
    ] {
        // 4096 rows through 256 x 256 weights: streaming bounds it; 8 rows through 4096 x 2048:
        // loading the 128 folds does.
        for ((m, k, n), want) in [((4096, 256, 256), stream), ((8, 4096, 2048), load)] {
            let (b, _) = op_cycles(&chip, &mm(m, k, n, MxuType::Bf16));
            let (e, _) = op_cycles(&chip, &mm(m, k, n, t));
            assert!(b > 0.0);
            assert_eq!(e / b, want, "{} {t:?} {m}x{k}x{n}: {e} vs bf16 {b}", chip.name);
        }
    }
    // A factor set with --set moves its type alone.
    let slow = v6e().with_override("mxu.fp8_fold_load_vs_bf16", "1").unwrap();
    let (a, _) = op_cycles(&slow, &mm(8, 4096, 2048, MxuType::Fp8));
    let (b, _) = op_cycles(&slow, &mm(8, 4096, 2048, MxuType::Bf16));
    assert_eq!(a, b);
}

/// A program whose bodies are copies without their memos (every transfer replayed afresh).
fn unmemoised(p: &tpusim_model::Program) -> tpusim_model::Program {
    let mut q = p.clone();
    for c in &mut q.classes {
        c.body = tpusim_model::StepBody::from_graph((*c.body.graph).clone(), c.body.carries);
    }
    q
}

/// Applications remembered by a body's memo across runs (a sweep's points that differ in copy
/// rates share every body) give exactly what replaying gives: the same cycles, busy times,
/// stall and critical path to the bit, whatever ran on the body before.
#[test]
fn remembered_applications_equal_replaying() {
    let chip = v6e();
    let mut w = AttentionCall::video_default();
    w.q_len = 12_000;
    w.kv_len = 12_000;
    w.q_heads = 2;
    w.kv_heads = 2;
    w.mask = tpusim_workload::Mask::parse("band:3000+sink:700").unwrap();
    let mut c = SplashConfig::with_blocks(2048, 2048, None);
    c.block_q = 1024;
    c.block_kv = 512;
    c.block_kv_compute = 512;
    c.traversal = tpusim_kernel::Traversal::Compact;
    c.masking = tpusim_kernel::Masking::Partial;
    let p = splash::lower(&chip, &w, &c).unwrap();
    // HBM rates from copy-bound to compute-bound: the bodies' costs are shared, their inputs
    // relative to each step's start sometimes equal and sometimes not.
    let rates = ["300", "819", "1638", "6552", "300"];
    for rate in rates {
        let fast = chip.with_override("hbm.bandwidth_gb_per_s", rate).unwrap();
        let shared = simulate(&fast, &p);
        let fresh = simulate(&fast, &unmemoised(&p));
        assert_eq!(shared.cycles.to_bits(), fresh.cycles.to_bits(), "{rate}");
        assert_eq!(shared.dma_stall_cycles.to_bits(), fresh.dma_stall_cycles.to_bits(), "{rate}");
        for u in Unit::ALL.iter().copied() {
            assert_eq!(shared.busy[u].to_bits(), fresh.busy[u].to_bits(), "{rate} {u:?}");
            assert_eq!(shared.critical[u].to_bits(), fresh.critical[u].to_bits(), "{rate} {u:?}");
        }
        // The step-by-step path goes through the same memo.
        let observed = simulate_observed(&fast, &p, &mut |_, _| {});
        assert_eq!(observed.cycles.to_bits(), fresh.cycles.to_bits(), "{rate}");
    }
}

/// [`body::Transfer::apply`] through the body's memo equals replaying the issue order for inputs
/// before, at and after the step's start, one input changed at a time (so that most
/// applications find an entry whose key differs from theirs in one input only).
#[test]
fn remembered_applications_equal_replaying_input_by_input() {
    use body::{Scratch, Transfer, BODY_UNITS, IN_CARRIES, IN_START, TIME_QUANTUM};
    let chip = v6e();
    let w = AttentionCall::video_default();
    let mut c = SplashConfig::with_blocks(2048, 2048, None);
    c.block_q = 512;
    c.block_kv = 512;
    c.block_kv_compute = 256;
    let p = splash::lower(&chip, &w, &c).unwrap();
    let carries = p.classes.iter().map(|c| c.body.carries as usize).max().unwrap();
    assert!(carries > 0);
    // A small deterministic generator of whole quanta.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: u64| {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    let mut tried = 0;
    for class in p.classes.iter().filter(|c| c.body.graph.node_count() > 0) {
        let tr = Transfer::new(&chip, &class.body, carries);
        let mut x = vec![0.0; IN_CARRIES + carries];
        let mut s = Scratch::default();
        for _ in 0..300 {
            let j = next(x.len() as u64) as usize;
            // Whole cycles, some with one quantum more.
            let extra = next(2) as f64 * TIME_QUANTUM;
            let q = |k: u64| k as f64 + extra;
            if j == IN_START {
                x[j] = q(next(4000));
            } else {
                // Before, at or after the start.
                x[j] = (x[IN_START] + q(next(600)) - q(300)).max(0.0);
            }
            // Then the same input one quantum later (keys one quantum apart).
            for later in [false, true] {
                if later {
                    x[j] += TIME_QUANTUM;
                }
                let (mut u1, mut u2) = ([0.0; BODY_UNITS], [0.0; BODY_UNITS]);
                let (mut c1, mut c2) = (vec![0.0; carries], vec![0.0; carries]);
                let a = tr.apply(&x, &mut u1, &mut c1, &mut s);
                let b = tr.replay(&x, &mut u2, &mut c2, &mut s);
                assert_eq!((a.0.to_bits(), a.1.to_bits()), (b.0.to_bits(), b.1.to_bits()), "{x:?}");
                assert_eq!(u1.map(f64::to_bits), u2.map(f64::to_bits), "{x:?}");
                assert_eq!(c1.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), c2.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{x:?}");
                tried += 1;
            }
        }
    }
    assert!(tried >= 600, "{tried}");
}

/// A step whose body outlasts its copies' DMA round trip pays none of it: with 1024-cubed matmul
/// blocks on v5e (each step's MXU work about 11 us, its copies' round trip about 5.4 us) a longer
/// DMA latency costs the whole run only the pipeline's first read and last write (two
/// latencies), while 128-cubed blocks (steps far shorter than the round trip) pay it at every
/// step.
#[test]
fn a_step_whose_body_outlasts_the_dma_round_trip_pays_none_of_it() {
    let chip = ChipModel::preset("v5e").unwrap();
    let slow = chip.with_override("fitted.dma_latency_ns", &format!("{}", 2.0 * chip.fitted.dma_latency_ns.value)).unwrap();
    let extra = slow.dma_latency_cycles() - chip.dma_latency_cycles();
    let mm = MatmulCall { m: 4096, n: 4096, k: 4096 };
    let run = |c: &ChipModel, b: u64| {
        let p = matmul::lower(c, &mm, &MatmulConfig::blocks(b, b, b)).unwrap();
        (simulate(c, &p).cycles, p.info.grid_steps)
    };
    let (long_fast, _) = run(&chip, 1024);
    let (long_slow, _) = run(&slow, 1024);
    assert!(long_slow - long_fast <= 2.0 * extra + 1.0, "long steps paid {} cycles for {extra} more latency", long_slow - long_fast);
    let (short_fast, steps) = run(&chip, 128);
    let (short_slow, _) = run(&slow, 128);
    assert!(short_slow - short_fast >= 0.9 * extra * steps as f64, "short steps paid {} cycles over {steps} steps for {extra} more latency", short_slow - short_fast);
}
