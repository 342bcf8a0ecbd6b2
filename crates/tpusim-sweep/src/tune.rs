//! Block-size and kernel-option search for one workload (`tpusim tune`).
//!
//! Fields given in the job (block sizes, traversal, masking, mask source, tile alignment) are
//! held fixed; the others are searched:
//!
//! * `block_q`: multiples of 256 from 256 to 4096, and for each the block just at or below it
//!   that splits q_len into equal blocks with the least padding (`ceil(q_len / ceil(q_len / c))`
//!   rounded up to 8, e.g. 3024 for 75,600 tokens), and q_len itself (rounded up to 8) when it
//!   is at most 4096;
//! * `block_kv`: multiples of 128 from 512 to 4096, and kv_len (rounded up to 128) when at most
//!   4096;
//! * `block_kv_compute`: multiples of 128 dividing `block_kv` (and `block_kv` itself);
//! * traversal (`full-grid`, `compact`), masking (`all`, `partial`, and `none` where it is exact:
//!   a tiling with partial tiles gives wrong results without masking, so such configurations are
//!   dropped unless `allow_inexact`), mask source (`computed`, `loaded`), and tile alignment only
//!   with `allow_approximate` (it changes the mask).
//!
//! Blocks that break the hardware's rules or overflow the VMEM limit are skipped (lowering
//! rejects them before any simulation). The search has three stages, each evaluated in parallel:
//!
//! 1. every option combination at the given (or default) blocks; combinations within 5% of the
//!    best go on (and any the probe could not run, e.g. over VMEM at those blocks);
//! 2. every (block_q, block_kv) pair with those combinations, `block_kv_compute` defaulting to
//!    the widest that fits VMEM;
//! 3. the best `refine` pairs with every `block_kv_compute` and every option combination.
//!
//! Configurations are ranked by predicted latency (ties broken by the configuration's text, so
//! the ranking is deterministic). Matmul jobs search `block_m` (multiples of 8), `block_n` and
//! `block_k` (multiples of 128) over {128, 256, 512, 1024, 2048} and the full dimension,
//! exhaustively.

use crate::eval::Evaluator;
use crate::SweepError;
use rayon::prelude::*;
use serde::Serialize;
use std::collections::{BTreeSet, HashSet};
use std::fmt::Write as _;
use std::time::Instant;
use tpusim_chip::ChipModel;
use tpusim_kernel::KernelError;
use tpusim_report::{Job, JobSpec, Report};

/// How to tune.
#[derive(Debug, Clone)]
pub struct TuneOptions {
    /// Configurations to keep in the ranking.
    pub top: usize,
    /// Also rank configurations whose results would be wrong (masking none with partial tiles).
    pub allow_inexact: bool,
    /// Also search tile alignment (rounds the mask to whole tiles).
    pub allow_approximate: bool,
    /// Block pairs refined in stage 3.
    pub refine: usize,
    /// Worker threads (`None`: one per core).
    pub jobs: Option<usize>,
    /// Draw progress bars (only when stderr is a terminal).
    pub progress: bool,
}

impl Default for TuneOptions {
    fn default() -> Self {
        TuneOptions { top: 10, allow_inexact: false, allow_approximate: false, refine: 12, jobs: None, progress: false }
    }
}

/// One ranked configuration.
#[derive(Debug, Clone, Serialize)]
pub struct Ranked {
    /// 1-based rank.
    pub rank: usize,
    /// Predicted latency, ms.
    pub latency_ms: f64,
    /// Latency of the given configuration / this latency (above 1: faster than given).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speedup_vs_given: Option<f64>,
    /// The limiting unit.
    pub bottleneck: String,
    /// Model FLOP utilisation.
    pub mfu: f64,
    /// VMEM the tiling needs, bytes.
    pub vmem_bytes: u64,
    /// The VMEM limit, bytes.
    pub vmem_limit_bytes: u64,
    /// The job: workload and kernel configuration.
    pub job: Job,
    /// The fields to pass to `tpusim run` for this configuration.
    pub flags: String,
}

/// The outcome of a search.
#[derive(Debug, Clone, Serialize)]
pub struct TuneResult {
    /// Chip model name.
    pub chip: String,
    /// Latency of the given job (its own or default blocks and options), ms, if it runs.
    pub given_latency_ms: Option<f64>,
    /// Why the given job does not run, if it does not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub given_error: Option<String>,
    /// The given job's configuration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub given_job: Option<Job>,
    /// Fields searched, with how many values each.
    pub searched: Vec<String>,
    /// Fields held fixed.
    pub fixed: Vec<String>,
    /// Configurations evaluated (distinct).
    pub evaluated: usize,
    /// Of those, rejected by the block rules.
    pub rejected_rules: usize,
    /// Of those, over the VMEM limit.
    pub rejected_vmem: usize,
    /// Of those, dropped as inexact (masking none with partial tiles).
    pub rejected_inexact: usize,
    /// Valid configurations found (distinct jobs).
    pub valid: usize,
    /// Valid evaluations that resolved to the same job as another (e.g. a block size clamped to
    /// the sequence), counted once in `valid`.
    pub duplicates: usize,
    /// Wall time, seconds.
    pub seconds: f64,
    /// The best configurations, best first.
    pub top: Vec<Ranked>,
}

#[derive(Debug, Clone)]
enum Eval {
    Ok(Box<Report>, Job),
    Rules,
    Vmem,
    Inexact,
    Other(String),
}

/// A candidate: the fields it sets (over the given job).
type Cand = JobSpec;

fn cand_key(c: &Cand) -> String {
    serde_json::to_string(c).unwrap_or_default()
}

/// Stage 1 keeps option combinations within this factor of the best latency.
const OPTION_WINDOW: f64 = 1.05;

const OPTION_WORDS: [(&str, &[&str]); 3] = [
    ("traversal", &["full-grid", "compact"]),
    ("masking", &["all", "partial", "none"]),
    ("mask_source", &["computed", "loaded"]),
];

/// Searches block sizes and options for `spec` (module docs).
///
/// # Errors
/// [`SweepError`] when the chip or the job itself is invalid (before any block is changed).
pub fn tune(spec: &JobSpec, opts: &TuneOptions) -> Result<TuneResult, SweepError> {
    let start = Instant::now();
    if opts.top == 0 {
        return Err(SweepError::new("--top 0: expected at least 1 configuration to list".to_string()));
    }
    if opts.refine == 0 {
        return Err(SweepError::new("--refine 0: expected at least 1 (block_q, block_kv) pair to refine".to_string()));
    }
    let chip = spec.chip().map_err(|e| SweepError::new(e.to_string()))?;
    let given = spec.build(&chip).map_err(|e| SweepError::new(e.to_string()))?;
    let pool = crate::pool(opts.jobs)?;
    let mut ev = Evaluator::new();
    ev.skip_dense = true;
    let chip_key = format!("{:?}|{:?}", spec.chip, spec.set);
    let mut seen: HashSet<String> = HashSet::new();
    let mut results: Vec<(Cand, Eval)> = Vec::new();
    let mut searched = Vec::new();
    let mut fixed = Vec::new();

    let run_stage = |cands: Vec<Cand>, seen: &mut HashSet<String>, results: &mut Vec<(Cand, Eval)>, what: &str| {
        let fresh: Vec<Cand> = cands.into_iter().filter(|c| seen.insert(cand_key(c))).collect();
        let pb = crate::progress_bar(opts.progress, fresh.len() as u64, what);
        let evals: Vec<Eval> = pool.install(|| {
            fresh
                .par_iter()
                .map(|c| {
                    let e = evaluate(&ev, &chip_key, &chip, spec, c, opts);
                    if let Some(pb) = &pb {
                        pb.inc(1);
                    }
                    e
                })
                .collect()
        });
        if let Some(pb) = pb {
            pb.finish_and_clear();
        }
        let start = results.len();
        results.extend(fresh.into_iter().zip(evals));
        start
    };

    match &given {
        Job::Splash { workload: w, .. } => {
            // Free option values.
            let mut option_axes: Vec<(&str, Vec<String>)> = Vec::new();
            for (key, words) in OPTION_WORDS {
                let given_word = match key {
                    "traversal" => &spec.traversal,
                    "masking" => &spec.masking,
                    _ => &spec.mask_source,
                };
                match given_word {
                    Some(v) => fixed.push(format!("{key} {v}")),
                    None => {
                        searched.push(format!("{key} ({})", words.join(", ")));
                        option_axes.push((key, words.iter().map(|s| s.to_string()).collect()));
                    }
                }
            }
            let aligns: Vec<Option<bool>> = match spec.tile_align {
                Some(v) => {
                    fixed.push(format!("tile_align {v}"));
                    vec![None]
                }
                None if opts.allow_approximate => {
                    searched.push("tile_align (false, true)".into());
                    vec![Some(false), Some(true)]
                }
                None => vec![None],
            };
            let mut combos: Vec<Cand> = vec![JobSpec::default()];
            for (key, words) in &option_axes {
                combos = combos
                    .iter()
                    .flat_map(|c| {
                        words.iter().map(move |w| {
                            let mut c = c.clone();
                            match *key {
                                "traversal" => c.traversal = Some(w.clone()),
                                "masking" => c.masking = Some(w.clone()),
                                _ => c.mask_source = Some(w.clone()),
                            }
                            c
                        })
                    })
                    .collect();
            }
            combos = combos.iter().flat_map(|c| aligns.iter().map(move |a| JobSpec { tile_align: *a, ..c.clone() })).collect();

            let bqs: Vec<u64> = match spec.block_q {
                Some(v) => {
                    fixed.push(format!("block_q {v}"));
                    vec![v]
                }
                None => {
                    let v = block_q_candidates(w.q_len);
                    searched.push(format!("block_q ({} values)", v.len()));
                    v
                }
            };
            let bkvs: Vec<u64> = match spec.block_kv {
                Some(v) => {
                    fixed.push(format!("block_kv {v}"));
                    vec![v]
                }
                None => {
                    let v = block_kv_candidates(w.kv_len);
                    searched.push(format!("block_kv ({} values)", v.len()));
                    v
                }
            };
            match spec.block_kv_compute {
                Some(v) => fixed.push(format!("block_kv_compute {v}")),
                None => searched.push("block_kv_compute (multiples of 128 dividing block_kv)".into()),
            }

            // Stage 1: options at the given blocks.
            let s1 = run_stage(combos.clone(), &mut seen, &mut results, "tune: options");
            let mut scored: Vec<(f64, &Cand)> = results[s1..].iter().filter_map(|(c, e)| latency(e).map(|l| (l, c))).collect();
            // Judged: ran (valid or inexact). Combinations the probe could not run (e.g. over
            // VMEM at the given blocks) go on unjudged.
            let judged: HashSet<String> = results[s1..]
                .iter()
                .filter(|(_, e)| matches!(e, Eval::Ok(..) | Eval::Inexact))
                .map(|(c, _)| cand_key(c))
                .collect();
            scored.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| cand_key(a.1).cmp(&cand_key(b.1))));
            let kept: Vec<Cand> = if scored.is_empty() {
                combos.clone()
            } else {
                let best = scored[0].0;
                let mut k: Vec<Cand> =
                    scored.iter().filter(|(l, _)| *l <= best * OPTION_WINDOW).map(|(_, c)| (*c).clone()).collect();
                k.extend(combos.iter().filter(|c| !judged.contains(&cand_key(c))).cloned());
                k
            };

            // Stage 2: every block pair with the kept options.
            let mut s2 = Vec::new();
            for c in &kept {
                for &bq in &bqs {
                    for &bkv in &bkvs {
                        s2.push(JobSpec { block_q: Some(bq), block_kv: Some(bkv), ..c.clone() });
                    }
                }
            }
            run_stage(s2, &mut seen, &mut results, "tune: blocks");

            // Stage 3: refine the best pairs over compute widths and all options.
            let mut ranked: Vec<(f64, String, (u64, u64))> = results
                .iter()
                .filter_map(|(_, e)| match e {
                    Eval::Ok(r, Job::Splash { config, .. }) => {
                        Some((r.latency_ms, format!("{config:?}"), (config.block_q, config.block_kv)))
                    }
                    _ => None,
                })
                .collect();
            ranked.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
            let mut pairs: Vec<(u64, u64)> = Vec::new();
            for (_, _, p) in ranked {
                if !pairs.contains(&p) {
                    pairs.push(p);
                }
                if pairs.len() >= opts.refine {
                    break;
                }
            }
            let mut s3 = Vec::new();
            for &(bq, bkv) in &pairs {
                let computes: Vec<Option<u64>> = match spec.block_kv_compute {
                    Some(_) => vec![None],
                    None => {
                        (1..=bkv / 128).map(|m| m * 128).filter(|c| bkv % c == 0).chain(std::iter::once(bkv)).map(Some).collect()
                    }
                };
                for c in &combos {
                    for &bc in &computes {
                        s3.push(JobSpec { block_q: Some(bq), block_kv: Some(bkv), block_kv_compute: bc, ..c.clone() });
                    }
                }
            }
            run_stage(s3, &mut seen, &mut results, "tune: refine");
        }
        Job::Matmul { workload: mm, .. } => {
            let dims = [
                ("block_m", spec.block_m, mm.m, 8u64),
                ("block_n", spec.block_n, mm.n, 128),
                ("block_k", spec.block_k, mm.k, 128),
            ];
            let mut lists: Vec<Vec<u64>> = Vec::new();
            for (name, given, dim, align) in dims {
                match given {
                    Some(v) => {
                        fixed.push(format!("{name} {v}"));
                        lists.push(vec![v]);
                    }
                    None => {
                        let full = dim.next_multiple_of(align);
                        let mut v: BTreeSet<u64> = [128u64, 256, 512, 1024, 2048].into_iter().filter(|&b| b <= full).collect();
                        if full <= 2048 {
                            v.insert(full);
                        }
                        searched.push(format!("{name} ({} values)", v.len()));
                        lists.push(v.into_iter().collect());
                    }
                }
            }
            let mut cands = Vec::new();
            for &m in &lists[0] {
                for &n in &lists[1] {
                    for &k in &lists[2] {
                        cands.push(JobSpec { block_m: Some(m), block_n: Some(n), block_k: Some(k), ..Default::default() });
                    }
                }
            }
            run_stage(cands, &mut seen, &mut results, "tune: blocks");
        }
    }

    // The given configuration, for comparison.
    let given_eval =
        evaluate(&ev, &chip_key, &chip, spec, &JobSpec::default(), &TuneOptions { allow_inexact: true, ..opts.clone() });
    let (given_latency_ms, given_error) = match &given_eval {
        Eval::Ok(r, _) => (Some(r.latency_ms), None),
        Eval::Other(e) => (None, Some(e.clone())),
        Eval::Vmem => (None, Some("the given blocks overflow the VMEM limit".into())),
        Eval::Rules => (None, Some("the given blocks break the block rules".into())),
        Eval::Inexact => (None, None),
    };

    let count = |f: fn(&Eval) -> bool| results.iter().filter(|(_, e)| f(e)).count();
    let rejected_rules = count(|e| matches!(e, Eval::Rules | Eval::Other(_)));
    let rejected_vmem = count(|e| matches!(e, Eval::Vmem));
    let rejected_inexact = count(|e| matches!(e, Eval::Inexact));
    let mut valid: Vec<(f64, String, &Report, &Job)> = Vec::new();
    let mut jobs_seen = HashSet::new();
    for (_, e) in &results {
        if let Eval::Ok(r, job) = e {
            let key = serde_json::to_string(job).unwrap_or_default();
            if jobs_seen.insert(key.clone()) {
                valid.push((r.latency_ms, key, r, job));
            }
        }
    }
    let ok_evals = results.iter().filter(|(_, e)| matches!(e, Eval::Ok(..))).count();
    if valid.is_empty() {
        return Err(SweepError::new(format!(
            "no valid configuration among {} evaluated: {rejected_vmem} over the VMEM limit, {rejected_rules} breaking block rules, {rejected_inexact} inexact; {}",
            results.len(),
            if spec.block_q.is_some() || spec.block_kv.is_some() || spec.block_kv_compute.is_some() {
                "change the blocks held fixed or raise --vmem-limit-mib"
            } else {
                "raise --vmem-limit-mib"
            }
        )));
    }
    valid.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
    let top = valid
        .iter()
        .take(opts.top)
        .enumerate()
        .map(|(i, (l, _, r, job))| Ranked {
            rank: i + 1,
            latency_ms: *l,
            speedup_vs_given: given_latency_ms.map(|g| g / l),
            bottleneck: r.bottleneck.clone(),
            mfu: r.mfu,
            vmem_bytes: r.vmem_bytes,
            vmem_limit_bytes: r.vmem_limit_bytes,
            job: (*job).clone(),
            flags: flags(job),
        })
        .collect();
    Ok(TuneResult {
        chip: chip.name.clone(),
        given_latency_ms,
        given_error,
        given_job: match given_eval {
            Eval::Ok(_, j) => Some(j),
            _ => Some(given),
        },
        searched,
        fixed,
        evaluated: results.len(),
        rejected_rules,
        rejected_vmem,
        rejected_inexact,
        valid: valid.len(),
        duplicates: ok_evals - valid.len(),
        seconds: start.elapsed().as_secs_f64(),
        top,
    })
}

fn latency(e: &Eval) -> Option<f64> {
    match e {
        Eval::Ok(r, _) => Some(r.latency_ms),
        _ => None,
    }
}

fn evaluate(ev: &Evaluator, chip_key: &str, chip: &ChipModel, spec: &JobSpec, cand: &Cand, opts: &TuneOptions) -> Eval {
    let s = spec.overlay(cand);
    let job = match s.build(chip) {
        Ok(j) => j,
        Err(e) => return Eval::Other(e.to_string()),
    };
    match ev.run(chip_key, chip, &job) {
        Ok(run) => {
            let r = tpusim_report::Report::from_run(&run);
            let tuner_chose_none = spec.masking.is_none() && cand.masking.as_deref() == Some("none");
            if tuner_chose_none && !opts.allow_inexact && r.tiles.is_some_and(|t| t.partial > 0) {
                return Eval::Inexact;
            }
            Eval::Ok(Box::new(r), job)
        }
        Err(KernelError::Vmem { .. }) => Eval::Vmem,
        Err(KernelError::Config { .. }) => Eval::Rules,
        Err(e) => Eval::Other(e.to_string()),
    }
}

/// `block_q` candidates for a q length (module docs).
pub fn block_q_candidates(q_len: u64) -> Vec<u64> {
    let max = q_len.next_multiple_of(8);
    let mut v = BTreeSet::new();
    for c in (256..=4096u64).step_by(256).filter(|&c| c <= max) {
        v.insert(c);
        let n = q_len.div_ceil(c);
        v.insert(q_len.div_ceil(n).next_multiple_of(8));
    }
    if max <= 4096 {
        v.insert(max);
    }
    v.into_iter().collect()
}

/// `block_kv` candidates for a kv length (module docs).
pub fn block_kv_candidates(kv_len: u64) -> Vec<u64> {
    let max = kv_len.next_multiple_of(128);
    let mut v: BTreeSet<u64> = (512..=4096u64).step_by(128).filter(|&c| c <= max).collect();
    if max <= 4096 {
        v.insert(max);
    }
    v.into_iter().collect()
}

fn word<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default()
}

/// The `tpusim run` flags that select a job's kernel configuration.
fn flags(job: &Job) -> String {
    match job {
        Job::Splash { config: c, .. } => format!(
            "--block-q {} --block-kv {} --block-kv-compute {} --traversal {} --masking {} --mask-source {}{}",
            c.block_q,
            c.block_kv,
            c.block_kv_compute,
            word(&c.traversal),
            word(&c.masking),
            word(&c.mask_source),
            if c.tile_align { " --tile-align" } else { "" }
        ),
        Job::Matmul { config: c, .. } => format!("--block-m {} --block-n {} --block-k {}", c.block_m, c.block_n, c.block_k),
    }
}

impl TuneResult {
    /// JSON, one object.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// A table for people.
    pub fn to_table(&self) -> String {
        let mut s = String::new();
        let mib = |b: u64| b as f64 / 1048576.0;
        match &self.given_job {
            Some(Job::Splash { workload: w, .. }) => {
                let _ = writeln!(
                    s,
                    "tpusim tune: Splash attention on {}: batch {}, heads {} (kv heads {}), q_len {}, kv_len {}, head_dim {}/{}, mask {}",
                    self.chip, w.batch, w.q_heads, w.kv_heads, w.q_len, w.kv_len, w.head_dim, w.head_dim_v, w.mask
                );
            }
            Some(Job::Matmul { workload: m, .. }) => {
                let _ = writeln!(s, "tpusim tune: blocked matmul on {}: M {} x N {} x K {}", self.chip, m.m, m.n, m.k);
            }
            None => {}
        }
        let _ =
            writeln!(s, "  searched     {}", if self.searched.is_empty() { "nothing".into() } else { self.searched.join("; ") });
        if !self.fixed.is_empty() {
            let _ = writeln!(s, "  fixed        {}", self.fixed.join("; "));
        }
        let _ = writeln!(
            s,
            "  evaluated    {} configurations in {:.1} s: {} valid, {} duplicates of a valid one, {} over the VMEM limit, {} breaking block rules, {} inexact (masking none on partial tiles)",
            self.evaluated, self.seconds, self.valid, self.duplicates, self.rejected_vmem, self.rejected_rules, self.rejected_inexact
        );
        match (self.given_latency_ms, &self.given_error, &self.given_job) {
            (Some(l), _, Some(job)) => {
                let _ = writeln!(s, "  given        {l:.3} ms with {}", flags(job));
            }
            (_, Some(e), _) => {
                let _ = writeln!(s, "  given        does not run: {e}");
            }
            _ => {}
        }
        let _ = writeln!(s);
        if self.top.is_empty() {
            let _ = writeln!(s, "  no valid configuration found");
            return s;
        }
        match &self.top[0].job {
            Job::Splash { .. } => {
                let _ = writeln!(
                    s,
                    "  {:>4}  {:>10}  {:>7}  {:>7}  {:>8}  {:>7}  {:<9}  {:<7}  {:<8}  {:<5}  {:<12}  {:>5}  {:>8}",
                    "rank",
                    "latency_ms",
                    "vs given",
                    "block_q",
                    "block_kv",
                    "compute",
                    "traversal",
                    "masking",
                    "mask src",
                    "align",
                    "bottleneck",
                    "MFU",
                    "VMEM MiB"
                );
            }
            Job::Matmul { .. } => {
                let _ = writeln!(
                    s,
                    "  {:>4}  {:>10}  {:>7}  {:>7}  {:>7}  {:>7}  {:<12}  {:>5}  {:>8}",
                    "rank", "latency_ms", "vs given", "block_m", "block_n", "block_k", "bottleneck", "MFU", "VMEM MiB"
                );
            }
        }
        for r in &self.top {
            let vs = r.speedup_vs_given.map_or("-".to_string(), |x| format!("{x:.3}x"));
            match &r.job {
                Job::Splash { config: c, .. } => {
                    let _ = writeln!(
                        s,
                        "  {:>4}  {:>10.3}  {:>7}  {:>7}  {:>8}  {:>7}  {:<9}  {:<7}  {:<8}  {:<5}  {:<12}  {:>4.1}%  {:>8.1}",
                        r.rank,
                        r.latency_ms,
                        vs,
                        c.block_q,
                        c.block_kv,
                        c.block_kv_compute,
                        word(&c.traversal),
                        word(&c.masking),
                        word(&c.mask_source),
                        if c.tile_align { "yes" } else { "no" },
                        r.bottleneck,
                        r.mfu * 100.0,
                        mib(r.vmem_bytes)
                    );
                }
                Job::Matmul { config: c, .. } => {
                    let _ = writeln!(
                        s,
                        "  {:>4}  {:>10.3}  {:>7}  {:>7}  {:>7}  {:>7}  {:<12}  {:>4.1}%  {:>8.1}",
                        r.rank,
                        r.latency_ms,
                        vs,
                        c.block_m,
                        c.block_n,
                        c.block_k,
                        r.bottleneck,
                        r.mfu * 100.0,
                        mib(r.vmem_bytes)
                    );
                }
            }
        }
        let _ = writeln!(s, "\n  best: tpusim run ... {}", self.top[0].flags);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_follow_the_rules() {
        let q = block_q_candidates(75_600);
        assert!(q.contains(&3024) && q.contains(&3328) && q.contains(&256) && q.contains(&4096), "{q:?}");
        assert!(q.iter().all(|b| b % 8 == 0));
        let kv = block_kv_candidates(75_600);
        assert!(kv.contains(&1536) && kv.contains(&512) && kv.contains(&4096));
        assert!(kv.iter().all(|b| b % 128 == 0));
        assert_eq!(block_q_candidates(100), vec![104]);
        assert_eq!(block_kv_candidates(1000), vec![512, 640, 768, 896, 1024]);
    }

    #[test]
    fn small_case_ranks_and_beats_or_matches_the_default() {
        let spec = JobSpec { heads: Some(2), seq_len: Some(4096), mask: Some("causal".into()), ..Default::default() };
        let r = tune(&spec, &TuneOptions { top: 5, ..Default::default() }).unwrap();
        assert_eq!(r.top.len(), 5);
        assert!(r.top.windows(2).all(|w| w[0].latency_ms <= w[1].latency_ms));
        assert!(r.top[0].latency_ms <= r.given_latency_ms.unwrap());
        // No inexact configuration is ranked: causal tiles on the diagonal are partial.
        for t in &r.top {
            if let Job::Splash { config, .. } = &t.job {
                assert_ne!(config.masking, tpusim_kernel::Masking::None);
            }
        }
        assert!(r.rejected_inexact > 0);
        assert!(r.to_table().contains("rank"));
    }
}
