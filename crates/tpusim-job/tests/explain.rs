//! Results a user would question are explained in the report, each note naming its mechanism
//! (issue 13, item 6): a larger MXU array that runs slower, a chip whose parameters were never
//! fitted to a measurement of the kind of kernel it runs, and a bottleneck label that must agree
//! with what making that unit twice as fast buys.

use tpusim_model::Unit;
use tpusim_job::{run, JobSpec, Report};

fn report(toml: &str) -> Report {
    let spec = JobSpec::from_toml_str(toml, "test").unwrap_or_else(|e| panic!("{toml}: {e}"));
    let chip = spec.chip().expect("chip");
    let job = spec.build(&chip).unwrap_or_else(|e| panic!("{toml}: {e}"));
    Report::from_run(&run(&chip, &job).unwrap_or_else(|e| panic!("{toml}: {e}")))
}

fn notes_with(r: &Report, word: &str) -> Vec<String> {
    r.notes.iter().filter(|n| n.contains(word)).cloned().collect()
}

#[test]
fn a_larger_mxu_array_that_runs_slower_says_why() {
    let job = "kernel = 'splash'\nheads = 16\nseq_len = 16384\nhead_dim = 128\nblock_q = 512\nblock_kv = 512\n";
    let base = report(&format!("{job}set = ['mxu.rows=256', 'mxu.columns=256']\n"));
    let big = report(&format!("{job}set = ['mxu.rows=1024', 'mxu.columns=1024']\n"));
    // The model makes the 1024 x 1024 arrays slower here (weight loads of 1024 cycles per fold
    // against 512 streamed rows); the report must say so rather than leave it unexplained.
    assert!(big.latency_ms > base.latency_ms, "{} vs {}", big.latency_ms, base.latency_ms);
    let why = notes_with(&big, "weight loading");
    assert_eq!(why.len(), 1, "{:?}", big.notes);
    assert!(why[0].contains("1024 x 1024") && why[0].contains("1024 cycles") && why[0].contains("larger array"), "{}", why[0]);
    assert!(notes_with(&base, "of its peak while busy").is_empty(), "the 256 x 256 arrays are well used here: {:?}", base.notes);
    assert!(big.to_table().contains("weight loading"));
}

#[test]
fn a_chip_without_measurements_of_this_kind_of_kernel_says_so() {
    // v5e's shipped rows are Pallas matmuls: its vector and exp rates are carried from other
    // chips, and a v5e attention run (97% MFU in the model) rests on them.
    let att =
        report("chip = 'v5e'\nheads = 16\nseq_len = 16384\nhead_dim = 128\nblock_q = 2048\nblock_kv = 2048\nblock_kv_compute = 512\n");
    let why = notes_with(&att, "not fitted to any v5e measurement");
    assert_eq!(why.len(), 1, "{:?}", att.notes);
    // Its EUP rate is carried from v5p's fit; the VPU (4 ALUs, assumed as v5p's) is busy less
    // than the note's threshold here.
    assert!(why[0].contains("fitted.eup_vregs_per_cycle") && why[0].contains("eup") && why[0].contains(" work (busy"), "{}", why[0]);
    assert!(why[0].contains("Not fitted: v5e's rows are Pallas matmuls"), "quotes the chip model's own note: {}", why[0]);
    // A v5e matmul uses no EUP and little VPU: nothing carried matters.
    let mm =
        report("chip = 'v5e'\nkernel = 'pallas-matmul'\nm = 4096\nn = 4096\nk = 4096\nblock_m = 512\nblock_n = 1024\nblock_k = 1024\n");
    assert!(notes_with(&mm, "not fitted to any").is_empty(), "{:?}", mm.notes);
    // An override of a carried parameter is still not a measurement; v7x fits its VALU, so a
    // VPU-only dependence names nothing there.
    let v7x =
        report("chip = 'v7x'\nheads = 16\nseq_len = 16384\nhead_dim = 128\nblock_q = 2048\nblock_kv = 2048\nblock_kv_compute = 512\n");
    for n in notes_with(&v7x, "not fitted to any") {
        assert!(!n.contains("valu_vreg_ops_per_cycle"), "v7x's VALU rate is fitted to v7x rows: {n}");
    }
    // v6e's EUP rate is not fitted but checked against the v6e rows (`checked_against`): the
    // EUP-bound video kernel rests on measurements, and says nothing.
    let v6e =
        report("chip = 'v6e'\nheads = 10\nseq_len = 75600\nhead_dim = 128\nblock_q = 3024\nblock_kv = 2048\nblock_kv_compute = 1024\n");
    assert!(notes_with(&v6e, "not fitted to any").is_empty(), "{:?}", v6e.notes);
    // A chip model without the check says so again.
    let mut unchecked = tpusim_chip::ChipModel::preset("v6e").unwrap();
    unchecked.fitted.eup_vregs_per_cycle.checked_against = None;
    let job = JobSpec {
        heads: Some(10),
        seq_len: Some(75600),
        head_dim: Some(128),
        block_q: Some(3024),
        block_kv: Some(2048),
        block_kv_compute: Some(1024),
        ..Default::default()
    }
    .build(&unchecked)
    .unwrap();
    let rep = Report::from_run(&run(&unchecked, &job).unwrap());
    assert!(
        notes_with(&rep, "not fitted to any v6e measurement").iter().any(|n| n.contains("fitted.eup_vregs_per_cycle [")),
        "{:?}",
        rep.notes
    );
}

#[test]
fn the_bottleneck_is_the_unit_whose_2x_speed_up_gains_most_or_the_critical_paths() {
    // Cases where a unit is busier than the one the run waits on: DMAs hidden behind compute
    // (hbm busy, 0% of the critical path), or an MXU whose work overlaps the vector units'.
    // A decisive gain (10% or more, untied) names the unit; small gains leave the label to the
    // critical path (whatif::bottleneck_of).
    for job in [
        "kernel = 'splash'\nheads = 16\nseq_len = 16384\nhead_dim = 256\nblock_q = 512\nblock_kv = 512\n",
        "chip = 'v7x'\nheads = 16\nseq_len = 16384\nhead_dim = 64\nblock_q = 1024\nblock_kv = 1024\n",
        "chip = 'v7x'\nkernel = 'splash'\nheads = 16\nseq_len = 16384\nhead_dim = 128\nblock_q = 2048\nblock_kv = 2048\n",
        "heads = 10\nseq_len = 75600\nblock_q = 3024\nblock_kv = 2048\nblock_kv_compute = 1024\n",
    ] {
        let r = report(job);
        let table = r.what_if_2x.as_ref().expect("what-if table");
        let gain = |u: Unit| table.iter().find(|w| w.unit == u.word()).unwrap().gain;
        let top = Unit::ALL.iter().copied().max_by(|&a, &b| gain(a).total_cmp(&gain(b))).unwrap();
        let line = r.to_table().lines().find(|l| l.contains("bound by")).unwrap().to_string();
        let tied = Unit::ALL.iter().filter(|&&u| u != top && gain(u) >= 0.8 * gain(top) && gain(u) > 0.01).count();
        if gain(top) >= tpusim_job::whatif::DECISIVE_GAIN && tied == 0 {
            assert_eq!(r.bottleneck, top, "{job}: bound by {} but {table:?}", r.bottleneck);
            assert!(line.contains(&format!("bound by     {} (2x faster: -{:.1}% latency", r.bottleneck, 100.0 * gain(r.bottleneck))), "{job}: {line}");
        } else if tied == 0 {
            let longest = Unit::ALL.iter().map(|&u| r.critical_path_ms[u]).fold(0.0, f64::max);
            assert_eq!(r.critical_path_ms[r.bottleneck], longest, "{job}: bound by {} but {:?}", r.bottleneck, r.critical_path_ms);
            assert!(line.contains("of the critical path") && line.contains("no unit twice as fast saves 10%"), "{job}: {line}");
        }
        // A unit hidden behind others (no critical-path share) buys nothing when made faster.
        for u in Unit::ALL.iter().copied() {
            if r.critical_path_ms[u] == 0.0 && u != Unit::StepControl {
                assert!(gain(u) < 0.02, "{job}: {u} is off the critical path yet gains {}", gain(u));
            }
        }
    }
}

/// A run whose input copies take longer than its bodies waits on the copies, which the bodies
/// overlap: the critical path is on hbm, not on the units the bodies keep busy meanwhile, and no
/// unit's 2x what-if saves more than half of its critical-path share (a fresh user's finding:
/// at 10 GB/s the DMA engines were busy 100% of the run with 7% of the path on the EUP).
#[test]
fn the_critical_path_of_a_copy_bound_run_is_the_copies() {
    for (rate, hbm_share) in [(10, 0.99), (100, 0.99)] {
        let r = report(&format!("set = [\"hbm.dma_bandwidth_gb_per_s={rate}\"]\n"));
        let path: f64 = Unit::ALL.iter().map(|&u| r.critical_path_ms[u]).sum();
        assert!((path / r.latency_ms - 1.0).abs() < 1e-6, "{rate}: path {path} against {}", r.latency_ms);
        assert!(r.critical_path_ms[Unit::Hbm] >= hbm_share * r.latency_ms, "{rate} GB/s: {:?} of {} ms", r.critical_path_ms, r.latency_ms);
        assert_eq!(r.bottleneck, Unit::Hbm, "{rate} GB/s");
        for w in r.what_if_2x.as_ref().expect("what-if table") {
            // The units' rows (the mechanisms' rows act through the DMA copies: the hbm path).
            let Some(u) = Unit::ALL.iter().copied().find(|u| u.word() == w.unit) else { continue };
            let saved = r.latency_ms - w.latency_ms;
            assert!(saved <= 0.5 * r.critical_path_ms[u] + 1e-3 * r.latency_ms, "{rate} GB/s: 2x {} saves {saved} ms of its {} ms path", w.unit, r.critical_path_ms[u]);
        }
    }
}

/// A DMA rate above the HBM peak runs at the peak, and the report says so (a fresh user set
/// v5e's DMA rate to 1400 GB/s and saw no difference and no word).
#[test]
fn a_dma_rate_above_the_hbm_peak_is_named() {
    let capped = report("chip = 'v5e'\nset = [\"hbm.dma_bandwidth_gb_per_s=1400\"]\n");
    assert_eq!(notes_with(&capped, "above hbm.bandwidth_gb_per_s = 819").len(), 1, "{:?}", capped.notes);
    let peak = report("chip = 'v5e'\nset = [\"hbm.dma_bandwidth_gb_per_s=819\"]\n");
    assert_eq!(capped.latency_ms, peak.latency_ms);
    assert!(notes_with(&peak, "above hbm.bandwidth_gb_per_s").is_empty());
}

/// A megacore run's unit table says its busy times add both cores (a fresh user read 0.599 ms
/// of MXU time in a 0.389 ms run as an error); a single core's says nothing.
#[test]
fn a_megacore_unit_table_says_what_its_columns_add() {
    let two = report("chip = 'v5p'\nheads = 4\nseq_len = 4096\n");
    let busy: f64 = two.cores.iter().map(|c| c.busy_ms[Unit::Mxu]).sum();
    assert!((two.busy_ms[Unit::Mxu] - busy).abs() < 1e-9 && two.busy_ms[Unit::Mxu] > 0.0);
    assert!(two.to_table().contains("(busy ms: the 2 TensorCores' sum; busy %: of 2 x the run"));
    assert!(!report("heads = 4\nseq_len = 4096\n").to_table().contains("TensorCores' sum"));
}
