//! The latency lower bound `tpusim tune` prunes with ([`tpusim_job::latency_lower_bound_s`])
//! never exceeds the simulated latency, on every kernel family, direction and scope, on
//! single- and two-core chips; and it is not vacuous (at least the busiest unit's share). The
//! tuner bounds from bodies built for counting only (`tpusim_model::body::counting_only`): their
//! bound equals the full bodies' exactly.

use proptest::prelude::*;
use tpusim_job::{latency_lower_bound_s, run, JobSpec};

fn spec(toml: &str) -> JobSpec {
    toml::from_str(toml).unwrap_or_else(|e| panic!("{e}: {toml}"))
}

/// Checks the bound of one job against its run; returns (bound, latency) in seconds, or None
/// when the block rules or VMEM refuse the job.
fn check(s: &JobSpec, what: &str) -> Option<(f64, f64)> {
    let chip = s.chip().unwrap();
    let job = s.build(&chip).ok()?;
    let lowered = job.lower(&chip).ok()?;
    let bound = latency_lower_bound_s(&chip, &lowered);
    let counted = tpusim_model::body::counting_only(|| job.lower(&chip)).unwrap_or_else(|e| panic!("{what}: counting: {e}"));
    assert_eq!(latency_lower_bound_s(&chip, &counted).to_bits(), bound.to_bits(), "{what}: the counted bodies' bound differs");
    let r = run(&chip, &job).unwrap_or_else(|e| panic!("{what}: {e}"));
    let t = r.result.seconds;
    assert!(bound <= t * (1.0 + 1e-12), "{what}: bound {bound} s above the simulated {t} s");
    let cores = chip.tensorcores() as f64;
    let busiest = tpusim_model::Unit::COMPUTE.iter().map(|&u| r.result.busy[u] / cores).fold(0.0, f64::max) / chip.clock_hz();
    assert!(bound >= 0.5 * busiest, "{what}: bound {bound} s is below half the busiest unit's {busiest} s per core");
    Some((bound, t))
}

#[test]
fn every_family_direction_and_scope() {
    let cases = [
        "kernel = 'splash'\nheads = 4\nseq_len = 8192\nmask = 'causal'\nblock_q = 1024\nblock_kv = 1024\nblock_kv_compute = 512",
        "kernel = 'tokamax-splash'\nchip = 'v7x'\nheads = 8\nseq_len = 8192\nmask = 'causal'\ndirection = 'bwd'",
        "kernel = 'splash'\nchip = 'v5p'\nheads = 8\nseq_len = 4096\ndirection = 'bwd'\nfused_bwd = false",
        "kernel = 'splash'\nchip = 'v5p'\nscope = 'call'\nbatch = 2\nheads = 8\nseq_len = 2048\nmask = 'causal'\nblock_q = 512\nblock_kv = 512\nblock_kv_compute = 512",
        "kernel = 'sparse-splash'\nseq_len = 20000\nmask = 'band:4000+sink:1024'\ntraversal = 'compact'\nmasking = 'partial'",
        "kernel = 'flash-attention'\nchip = 'v5e'\nheads = 2\nseq_len = 4096\nmask = 'causal'",
        "kernel = 'matmul'\nm = 8\nn = 8192\nk = 8192\nblock_m = 8\nblock_n = 2048\nblock_k = 2048",
        "kernel = 'pallas-matmul'\nchip = 'v7x'\nm = 4096\nn = 4096\nk = 2048",
    ];
    for c in cases {
        let s = spec(c);
        assert!(check(&s, c).is_some(), "{c}: refused");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn random_jobs(
        len in 512u64..6000,
        bq in 1u64..=8,
        bkv in 1u64..=8,
        kernel in prop::sample::select(vec!["tokamax-splash", "splash", "sparse-splash", "flash-attention"]),
        mask in prop::sample::select(vec!["full", "causal", "local:300,300", "band:1000+sink:256"]),
        chip in prop::sample::select(vec!["v6e", "v5e", "v5p", "v7x"]),
        direction in prop::sample::select(vec!["fwd", "bwd", "fwd+bwd"]),
    ) {
        let cap = len / 128 * 128;
        let (bq, bkv) = ((bq * 128).min(cap), (bkv * 128).min(cap));
        let s = spec(&format!(
            "kernel = '{kernel}'\nchip = '{chip}'\nheads = 2\nseq_len = {len}\nmask = '{mask}'\nblock_q = {bq}\nblock_kv = {bkv}\nblock_kv_compute = {bkv}\nvmem_limit_mib = 100\ndirection = '{direction}'\n"
        ));
        if s.chip().is_err() {
            return Ok(());
        }
        check(&s, &format!("{kernel} {chip} {direction} {mask} {len} {bq}x{bkv}"));
    }
}
