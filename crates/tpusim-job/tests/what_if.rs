//! The what-if table behind "bound by": each entry is an independent run of the same job on a
//! chip model with that unit's fields doubled (as `tpusim run --set` builds it: a fresh
//! lowering, not the re-timed one), every gain is >= 0 but for the DMA engines' sharing (at
//! most -2%), and the bottleneck is the largest gain
//! when that gain decides (10% or more, untied), else the unit with the largest critical-path
//! share.

use proptest::prelude::*;
use tpusim_job::whatif::{doubled, with_all, BoundRule, CO_BOUND_FRACTION, CO_BOUND_MIN_GAIN, DECISIVE_GAIN};
use tpusim_job::{run, JobSpec, Report};

fn spec(toml: &str) -> JobSpec {
    toml::from_str(toml).unwrap_or_else(|e| panic!("{e}: {toml}"))
}

/// Checks a report's table against independent runs; returns it for further checks.
fn check(s: &JobSpec, what: &str) -> Report {
    let chip = s.chip().unwrap();
    let job = s.build(&chip).unwrap_or_else(|e| panic!("{what}: {e}"));
    let r = run(&chip, &job).unwrap_or_else(|e| panic!("{what}: {e}"));
    let rep = Report::from_run(&r);
    let table = rep.what_if_2x.clone().expect("from_run computes the what-if table");
    assert!(table.len() >= 6, "{what}: {table:?}");
    for w in &table {
        // An independent run: the overrides applied one by one, the job built and lowered again.
        let unit = tpusim_model::Unit::ALL.iter().copied().find(|u| u.word() == w.unit);
        let mechanism = tpusim_job::whatif::mechanisms(&chip).into_iter().find(|(n, _)| *n == w.unit).map(|(_, set)| set);
        let set = match (unit, mechanism) {
            (Some(u), _) => doubled(&chip, u),
            (None, Some(set)) => set,
            (None, None) => vec![("host.dispatch_us".to_string(), 0.5 * chip.host.dispatch_us.value)],
        };
        let fast = with_all(&chip, &set).unwrap();
        let job2 = s.build(&fast).unwrap();
        let t2 = run(&fast, &job2).unwrap().result.seconds * 1e3;
        assert_eq!(w.latency_ms, t2, "{what}: {} 2x: table {} ms vs independent run {t2} ms", w.unit, w.latency_ms);
        // Never slower but through the DMA engines' sharing (a write-back issued sooner shares
        // the bandwidth longer with the next inputs: module `tpusim_job::whatif`): at most 2%.
        assert!(w.gain >= -0.02, "{what}: {} 2x makes the run slower: gain {}", w.unit, w.gain);
        assert!((w.gain - (1.0 - t2 / rep.latency_ms)).abs() < 1e-12, "{what}: {w:?}");
    }
    // "Bound by" is decided among the units (the mechanisms' and the host's rows only inform).
    let best = table.iter().filter(|w| tpusim_model::Unit::ALL.iter().any(|u| u.word() == w.unit)).map(|w| w.gain).fold(f64::NEG_INFINITY, f64::max);
    let gain_of = |u: &str| table.iter().find(|w| w.unit == u).unwrap().gain;
    let units = tpusim_model::Unit::ALL;
    let longest = |among: &[tpusim_model::Unit]| among.iter().map(|&u| rep.critical_path_ms[u]).fold(f64::NEG_INFINITY, f64::max);
    let tied: Vec<_> = units.iter().copied().filter(|u| gain_of(u.word()) >= CO_BOUND_FRACTION * best && gain_of(u.word()) > CO_BOUND_MIN_GAIN).collect();
    let text = rep.to_table();
    // An MXU that bounds the run and gains nothing from twice its row rate is explained beside
    // its figure, and only then.
    let explained = rep.bottleneck == tpusim_model::Unit::Mxu && gain_of("mxu") < CO_BOUND_MIN_GAIN;
    assert_eq!(text.contains("% (twice the row rate; its fold loads and result latency unchanged)"), explained, "{what}: {text}");
    if best < DECISIVE_GAIN {
        // No gain decides: the label names the critical path's unit and says why.
        assert_eq!(rep.bound_rule, Some(BoundRule::CriticalPath), "{what}: {table:?}");
        assert_eq!(rep.critical_path_ms[rep.bottleneck], longest(units), "{what}: bound by {} but {:?}", rep.bottleneck, rep.critical_path_ms);
        assert!(rep.co_bound.is_empty(), "{what}");
        if best < CO_BOUND_MIN_GAIN {
            assert!(text.contains("(latency: no unit twice as fast saves 1% or more"), "{what}");
        } else {
            assert!(text.contains("of the critical path") && text.contains("no unit twice as fast saves 10%"), "{what}: {text}");
        }
    } else if tied.len() > 1 {
        assert_eq!(rep.bound_rule, Some(BoundRule::Tied), "{what}: {table:?}");
        assert!(tied.contains(&rep.bottleneck), "{what}");
        assert_eq!(rep.critical_path_ms[rep.bottleneck], longest(&tied), "{what}");
        for u in &rep.co_bound {
            let g = gain_of(u.word());
            assert!(g >= CO_BOUND_FRACTION * best && g > CO_BOUND_MIN_GAIN, "{what}: co-bound {u} at {g} vs {best}");
        }
        assert_eq!(rep.co_bound.len() + 1, tied.len(), "{what}");
    } else {
        assert_eq!(rep.bound_rule, Some(BoundRule::Gain), "{what}: {table:?}");
        assert_eq!(gain_of(rep.bottleneck.word()), best, "{what}: bound by {} but {table:?}", rep.bottleneck);
        assert!(rep.co_bound.is_empty(), "{what}");
    }
    rep
}

#[test]
fn every_shipped_trace_is_bound_by_the_what_if_rule() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../traces");
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "toml") {
            let s = JobSpec::from_toml_file(p.to_str().unwrap()).unwrap();
            check(&s, &p.display().to_string());
            n += 1;
        }
    }
    assert!(n >= 5, "{n} traces");
}

#[test]
fn chains_of_cross_lane_reductions_are_bound_by_the_xlu_on_the_critical_path() {
    // 8192-row blocks over 256-wide sub-tiles on v5e: chains of XLU row reductions, each
    // waiting its result latency; the XLU is busy nearly all the run yet a 2x XLU rate saves
    // under 2%: the label is the critical path's unit, not a gain.
    let rep = check(
        &spec("chip = 'v5e'\nkernel = 'tokamax-splash'\nheads = 1\nseq_len = 16384\nblock_q = 8192\nblock_kv = 8192\nblock_kv_compute = 256\nvmem_limit_mib = 128\n"),
        "xlu chains",
    );
    let table = rep.what_if_2x.as_ref().unwrap();
    assert!(table.iter().all(|w| w.gain < 0.02), "{table:?}");
    assert_eq!((rep.bottleneck, rep.bound_rule), (tpusim_model::Unit::Xlu, Some(BoundRule::CriticalPath)));
}

/// A run no unit twice as fast speeds up by 10% is labelled by its critical path, not by the
/// largest of small gains: tokamax's Splash at its 128 blocks on the 720p layer spends most of
/// its critical path on the MXU (weight loading: a 2x MXU rate does not shorten a fold's load),
/// while 2x step control or XLU saves 3-4%; the tile-aligned kernel waits on the EUP for 83% of
/// the run while 2x VPU saves 5.6%.
#[test]
fn small_gains_give_the_critical_paths_unit() {
    let dense = check(&spec("heads = 10\nseq_len = 75600\n"), "tokamax 128 blocks");
    assert_eq!(dense.bottleneck, tpusim_model::Unit::Mxu, "{:?}", dense.what_if_2x);
    let share = 100.0 * dense.critical_path_ms[tpusim_model::Unit::Mxu] / dense.latency_ms;
    assert!(share > 50.0, "{share}");
    assert!(dense.to_table().contains(&format!("bound by     mxu ({share:.0}% of the critical path")), "{}", dense.to_table());
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../traces/video-720p-aligned.toml");
    let aligned = check(&JobSpec::from_toml_file(dir).unwrap(), "aligned");
    assert_eq!(aligned.bottleneck, tpusim_model::Unit::Eup, "{:?}", aligned.what_if_2x);
}

#[test]
fn a_host_timed_call_has_a_host_row() {
    let rep = check(&spec("kernel = 'splash'\nchip = 'v5p'\nscope = 'call'\nbatch = 2\nheads = 8\nseq_len = 2048\nmask = 'causal'\nblock_q = 512\nblock_kv = 512\nblock_kv_compute = 512\n"), "scope call");
    let table = rep.what_if_2x.unwrap();
    let host = table.iter().find(|w| w.unit == "host").expect("a host row under scope call");
    assert!(host.gain > 0.0, "{host:?}");
}

#[test]
fn an_hbm_bound_matmul_names_hbm() {
    // A skinny matmul (8 rows) moves its whole weight matrix for 8 FLOPs per byte; in large
    // blocks (16 grid steps of 8 MiB) the DMAs' bandwidth, not their latency or the step
    // overhead, sets the time, so 2x HBM bandwidth buys the most. (At the family's default
    // blocks the same matmul is bound by step control: many small steps.)
    let rep = check(&spec("kernel = 'matmul'\nm = 8\nn = 8192\nk = 8192\nblock_m = 8\nblock_n = 2048\nblock_k = 2048\n"), "skinny matmul");
    assert_eq!(rep.bottleneck, tpusim_model::Unit::Hbm, "{:?}", rep.what_if_2x);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn what_if_entries_equal_independent_runs_on_random_jobs(
        len in 512u64..6000,
        bq in 1u64..=8,
        bkv in 1u64..=8,
        kernel in prop::sample::select(vec!["tokamax-splash", "splash", "sparse-splash", "flash-attention"]),
        mask in prop::sample::select(vec!["full", "causal", "local:300,300", "band:1000+sink:256"]),
        chip in prop::sample::select(vec!["v6e", "v5e", "v5p", "v7x"]),
        d in prop::sample::select(vec![64u64, 128]),
    ) {
        let cap = len / 128 * 128;
        let (bq, bkv) = ((bq * 128).min(cap), (bkv * 128).min(cap));
        let s = spec(&format!(
            "kernel = '{kernel}'\nchip = '{chip}'\nheads = 2\nseq_len = {len}\nhead_dim = {d}\nmask = '{mask}'\nblock_q = {bq}\nblock_kv = {bkv}\nblock_kv_compute = {bkv}\nvmem_limit_mib = 100\n"
        ));
        let Ok(c) = s.chip() else { return Ok(()) };
        // Configurations the block rules refuse are not what this test is about.
        if s.build(&c).ok().and_then(|j| run(&c, &j).ok()).is_none() {
            return Ok(());
        }
        check(&s, &format!("{kernel} {chip} {mask} {len} {bq}x{bkv} d {d}"));
    }
}

/// A run whose short steps wait on their copies' round trips says so (issue 47, point 10): the
/// what-if row of halved DMA latency saves more than any unit twice as fast, and the "bound by"
/// line names that mechanism; a long-step run does not.
#[test]
fn a_run_bound_by_its_copies_round_trips_names_them() {
    let short = check(&spec("kernel = 'pallas-matmul'\nm = 4096\nn = 4096\nk = 4096\n"), "128-block matmul");
    let table = short.what_if_2x.clone().unwrap();
    let gain = |u: &str| table.iter().find(|w| w.unit == u).unwrap().gain;
    let best_unit = tpusim_model::Unit::ALL.iter().map(|u| gain(u.word())).fold(f64::NEG_INFINITY, f64::max);
    assert!(gain("dma_latency") > best_unit + 0.1, "{table:?}");
    let text = short.to_table();
    let line = text.lines().find(|l| l.trim_start().starts_with("bound by")).unwrap();
    assert!(line.contains("round trips bound it") && line.contains("fitted.dma_latency_ns halved"), "{line}");
    // One largest gain per line: the unit's is the largest of a unit's, the mechanism's larger.
    assert_eq!(line.matches("the largest gain").count(), 0, "{line}");
    let long = check(&spec("kernel = 'splash'\nheads = 2\nseq_len = 8192\nblock_q = 1024\nblock_kv = 1024\n"), "splash 1024 blocks");
    let text = long.to_table();
    assert!(!text.contains("round trips bound it"), "{text}");
}

/// MFU counts the model's FLOPs (the mask's kept pairs), not the work a configuration executes:
/// of two tilings of one causal layer, the faster has the higher MFU (a tiling that visits more
/// masked pairs ranked above a faster one, as a fresh user found in `tpusim tune`).
#[test]
fn mfu_ranks_tilings_of_one_layer_as_their_latency_does() {
    let base = "kernel = 'splash'\nheads = 4\nseq_len = 8192\nhead_dim = 128\nmask = 'causal'\ntraversal = 'compact'\nmasking = 'partial'\n";
    let reports: Vec<Report> = [(512, 512), (1024, 1024), (2048, 1024), (2048, 2048)]
        .iter()
        .map(|(q, kv)| {
            let s = spec(&format!("{base}block_q = {q}\nblock_kv = {kv}\nblock_kv_compute = {kv}\n"));
            let chip = s.chip().unwrap();
            Report::from_run(&run(&chip, &s.build(&chip).unwrap()).unwrap())
        })
        .collect();
    let model = reports[0].useful_flops;
    for r in &reports {
        assert_eq!(r.useful_flops, model, "one layer, one model FLOP count");
        assert!(r.useful_flops < r.flops, "the diagonal tiles' masked pairs are executed, not useful");
    }
    for a in &reports {
        for b in &reports {
            if a.latency_ms < b.latency_ms {
                assert!(a.mfu > b.mfu, "{} ms at {} MFU against {} ms at {}", a.latency_ms, a.mfu, b.latency_ms, b.mfu);
            }
        }
    }
}
