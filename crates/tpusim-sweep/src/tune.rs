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
//! A backward job (`direction` bwd) searches the backward kernel's blocks instead, with the same
//! candidates: `block_q_dkv`, `block_kv_dkv` and `block_kv_dkv_compute` (and, for the unfused
//! two-kernel backward, the dq kernel's `block_q_dq` / `block_kv_dq` set to the same pair); a
//! `fwd+bwd` job searches the forward's blocks with the backward's held at the given or default
//! values.
//!
//! **Pruning.** Stages 2 and 3 lower every candidate first (which also finds the ones the block
//! rules or VMEM refuse) and bound its latency from below without scheduling any body
//! ([`tpusim_job::latency_lower_bound_s`]: per core, the grid-step overheads plus the MXU's
//! occupancy, each other unit's occupancy, the DMA time; plus the exact XLA and host phases).
//! They then simulate candidates in order of that bound, eight (`PRUNE_CHUNK`) at a time, and stop
//! once the next bound is above the latency of `top` distinct simulated jobs (and, in stage 2,
//! of the best of `refine` distinct block pairs): every candidate left has a latency at least
//! its bound, so it could enter neither the ranking nor the pairs stage 3 refines. The ranking
//! is exactly the exhaustive search's ([`TuneOptions::exhaustive`] turns pruning off; a test
//! compares both); [`TuneResult::pruned`] says how many were not simulated.
//!
//! Configurations are ranked by predicted latency (ties broken by the configuration's text, so
//! the ranking is deterministic). Matmul jobs search `block_m` (multiples of 8), `block_n` and
//! `block_k` (multiples of 128) over {128, 256, 512, 1024, 2048} and the full dimension,
//! exhaustively.

use crate::eval::Evaluator;
use crate::SweepError;
use rayon::prelude::*;
use serde::Serialize;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;
use std::time::Instant;
use tpusim_chip::ChipModel;
use tpusim_kernel::{Direction, KernelError, MaskSource, Masking, SplashConfig, Traversal};
use tpusim_model::Unit;
use tpusim_job::{Job, JobError, JobSpec, Report};

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
    /// Print progress on stderr ([`crate::progress`]: bars on a terminal, else plain lines).
    pub progress: bool,
    /// Set by another thread to stop the search (a Python caller's Ctrl-C): candidates not yet
    /// evaluated are skipped and [`tune`] returns an error.
    pub cancel: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// Simulate every valid configuration: no configuration is skipped for its lower bound
    /// (module docs, "Pruning"). The ranking is the same; only the count of configurations
    /// simulated differs.
    pub exhaustive: bool,
    /// The job the ranking compares against (`vs given`) when it is not the searched spec's own:
    /// the default job, whose blocks are searched, is compared with the case study at its own
    /// blocks ([`tpusim_job::tune_baseline`]); `None`: the searched spec's job.
    pub baseline: Option<JobSpec>,
}

impl Default for TuneOptions {
    fn default() -> Self {
        TuneOptions {
            top: 10,
            allow_inexact: false,
            allow_approximate: false,
            refine: 12,
            jobs: None,
            progress: false,
            cancel: None,
            exhaustive: false,
            baseline: None,
        }
    }
}

impl TuneOptions {
    /// Whether [`TuneOptions::cancel`] was set (the search stops and [`tune`] returns an error).
    pub fn cancelled(&self) -> bool {
        self.cancel.as_ref().is_some_and(|c| c.load(std::sync::atomic::Ordering::Relaxed))
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
    /// The limiting unit: the one whose 2x speed-up gains the most ([`tpusim_job::whatif`]).
    pub bottleneck: Unit,
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
    /// The blocks as the call of the kernel's library config: JAX Splash's `BlockSizes(...)`,
    /// tokamax's `SplashConfig(...)` (attention; [`Job::block_sizes_call`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_sizes: Option<String>,
    /// The options of this configuration its kernel family's library has no setting for (a
    /// design what-if, starred in the table: tpusim times it as if the library had them; its
    /// `block_sizes` run without them), `; `-joined; absent when the library runs it as it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub design_whatif: Option<String>,
}

/// The outcome of a search.
#[derive(Debug, Clone, Serialize)]
pub struct TuneResult {
    /// Chip model name.
    pub chip: String,
    /// Which chip model every configuration ran on (source, overrides, parameter hash).
    pub chip_model: tpusim_chip::ChipIdentity,
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
    /// The search's stages in order (options, blocks, compute widths; a matmul's blocks): the
    /// configurations each evaluated, which add up to `evaluated` (a progress line counts one
    /// stage's).
    pub stages: Vec<Stage>,
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
    /// Valid configurations lowered but not simulated: a lower bound on their latency
    /// ([`tpusim_job::latency_lower_bound_s`]) was above the latency of enough simulated ones
    /// that they could not rank (module docs, "Pruning"). 0 with [`TuneOptions::exhaustive`].
    pub pruned: usize,
    /// Wall time, seconds.
    pub seconds: f64,
    /// The best configurations, best first.
    pub top: Vec<Ranked>,
    /// The `tpusim run` command that runs the best configuration (chip, overrides, workload and
    /// every resolved kernel field), complete and ready to paste.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_command: Option<String>,
}

/// What evaluating one candidate gave.
#[derive(Debug, Clone)]
enum Eval {
    Ok(Box<(Report, Job)>),
    /// Lowered, valid, not simulated: enough simulated configurations beat its latency lower
    /// bound.
    Pruned(Box<Job>),
    Rules(String),
    Vmem,
    Inexact,
    Other(String),
}

impl Eval {
    fn latency(&self) -> Option<f64> {
        match self {
            Eval::Ok(rj) => Some(rj.0.latency_ms),
            _ => None,
        }
    }
}

/// A candidate: the fields it sets over the given job.
type Cand = JobSpec;

fn cand_key(c: &Cand) -> String {
    serde_json::to_string(c).unwrap_or_default()
}

/// Stage 1 keeps option combinations within this factor of the best latency.
const OPTION_WINDOW: f64 = 1.05;

/// Candidates simulated between two pruning checks (module docs, "Pruning"). Fixed, so that
/// which candidates are simulated does not depend on the machine's cores.
const PRUNE_CHUNK: usize = 8;

/// What the results of a stage decide: the `jobs` fastest distinct jobs (the final ranking) and,
/// for stage 2, the `pairs.1` fastest distinct (q, kv) block pairs of the searched kernel
/// (the pairs stage 3 refines).
#[derive(Debug, Clone, Copy)]
struct Need {
    jobs: usize,
    pairs: Option<(Target, usize)>,
}

/// The simulated latencies a pruning check compares bounds with: per distinct job, and the best
/// per distinct block pair.
struct Board {
    need: Need,
    jobs: HashMap<String, f64>,
    pairs: HashMap<(u64, u64), f64>,
}

impl Board {
    fn new(results: &[(Cand, Eval)], need: Need) -> Self {
        let mut b = Board { need, jobs: HashMap::new(), pairs: HashMap::new() };
        for (_, e) in results {
            b.add(e);
        }
        b
    }

    fn add(&mut self, e: &Eval) {
        let Eval::Ok(rj) = e else { return };
        let (l, job) = (rj.0.latency_ms, &rj.1);
        self.jobs.insert(serde_json::to_string(job).unwrap_or_default(), l);
        if let (Some((target, _)), Job::Attention { config, .. }) = (self.need.pairs, job) {
            let (q, kv, _) = target.of_config(config);
            let best = self.pairs.entry((q, kv)).or_insert(l);
            *best = best.min(l);
        }
    }

    /// Whether a configuration whose latency is at least `bound` ms can no longer change what the
    /// stage decides: at least `need.jobs` distinct jobs, and `need.pairs` distinct pairs, are
    /// strictly faster than it could be (so it ranks below all of them, and its pair, whatever
    /// its best, comes after theirs).
    fn settled(&self, bound: f64) -> bool {
        let faster = |m: &mut dyn Iterator<Item = f64>| m.filter(|&l| l < bound).count();
        faster(&mut self.jobs.values().copied()) >= self.need.jobs
            && self.need.pairs.is_none_or(|(_, n)| faster(&mut self.pairs.values().copied()) >= n)
    }
}

/// Which kernel's blocks an attention search moves (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// The forward kernel's `block_q`, `block_kv`, `block_kv_compute`.
    Forward,
    /// The backward's dkv (or fused) kernel blocks; `dq` also moves the dq kernel's pair.
    Backward { dq: bool },
}

impl Target {
    fn of(given: &Job) -> Target {
        match given {
            Job::Attention { direction: Direction::Bwd, config, .. } => Target::Backward { dq: !config.bwd.fused },
            _ => Target::Forward,
        }
    }

    /// Field names of (q, kv, kv compute) blocks.
    fn names(self) -> [&'static str; 3] {
        match self {
            Target::Forward => ["block_q", "block_kv", "block_kv_compute"],
            Target::Backward { .. } => ["block_q_dkv", "block_kv_dkv", "block_kv_dkv_compute"],
        }
    }

    /// The blocks a job gives.
    fn given(self, spec: &JobSpec) -> [Option<u64>; 3] {
        match self {
            Target::Forward => [spec.block_q, spec.block_kv, spec.block_kv_compute],
            Target::Backward { .. } => [spec.block_q_dkv, spec.block_kv_dkv, spec.block_kv_dkv_compute],
        }
    }

    /// `c` with the blocks set.
    fn set(self, c: &JobSpec, bq: u64, bkv: u64, compute: Option<u64>) -> JobSpec {
        match self {
            Target::Forward => JobSpec { block_q: Some(bq), block_kv: Some(bkv), block_kv_compute: compute, ..c.clone() },
            Target::Backward { dq } => JobSpec {
                block_q_dkv: Some(bq),
                block_kv_dkv: Some(bkv),
                block_kv_dkv_compute: compute,
                block_q_dq: dq.then_some(bq),
                block_kv_dq: dq.then_some(bkv),
                ..c.clone()
            },
        }
    }

    /// The (q, kv, kv compute) blocks of a configuration.
    fn of_config(self, c: &SplashConfig) -> (u64, u64, u64) {
        match self {
            Target::Forward => (c.block_q, c.block_kv, c.block_kv_compute),
            Target::Backward { .. } => (c.bwd.block_q_dkv, c.bwd.block_kv_dkv, c.bwd.block_kv_dkv_compute),
        }
    }
}

/// Stage 0: what is searched and what is held fixed (module docs).
#[derive(Debug, Clone, Default)]
struct Space {
    /// Option combinations (traversal, masking, mask source, tile alignment) as candidates.
    combos: Vec<Cand>,
    /// block_q values (one when given).
    block_q: Vec<u64>,
    /// block_kv values (one when given).
    block_kv: Vec<u64>,
    /// Whether block_kv_compute (or its backward counterpart) is searched.
    search_compute: bool,
    /// Which kernel's blocks are searched.
    target: Option<Target>,
    searched: Vec<String>,
    fixed: Vec<String>,
}

/// One option axis: every value when the job leaves it unset, else nothing (held fixed).
fn axis<T: Copy + std::fmt::Display>(name: &str, given: Option<T>, all: &[T], space: &mut Space) -> Vec<Option<T>> {
    match given {
        Some(v) => {
            space.fixed.push(format!("{name} {v}"));
            vec![None]
        }
        None => {
            space.searched.push(format!("{name} ({})", all.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", ")));
            all.iter().map(|&v| Some(v)).collect()
        }
    }
}

impl Space {
    /// The attention search space of `spec` over workload `w`.
    fn attention(spec: &JobSpec, w: &tpusim_workload::AttentionCall, target: Target, opts: &TuneOptions) -> Space {
        let mut sp = Space { target: Some(target), ..Space::default() };
        // The backward kernels take no forward grid traversal or masking rule: searching them
        // in a backward run would rank equal twins.
        let backward = matches!(target, Target::Backward { .. });
        if backward && (spec.traversal.is_none() || spec.masking.is_none()) {
            sp.fixed.push("traversal and masking (the backward kernels' own: they change nothing in a backward run)".into());
        }
        let traversals = if backward { vec![None] } else { axis("traversal", spec.traversal, Traversal::ALL, &mut sp) };
        // A full mask has nothing to apply but the padding: `all` masks what `partial` does, and
        // where the mask comes from changes nothing (searching them would rank equal twins).
        let full = w.mask.is_full();
        let maskings = if backward {
            vec![None]
        } else if full && spec.masking.is_none() {
            sp.searched.push("masking (partial, none; all is partial for a full mask)".into());
            vec![Some(Masking::Partial), Some(Masking::None)]
        } else {
            axis("masking", spec.masking, Masking::ALL, &mut sp)
        };
        // Only what the family can run: Splash computes a single causal, local, band or chunked
        // mask in the kernel and loads every other mask (a union with a sink, a file) as int8
        // blocks, so such a mask is searched with loaded blocks only (a `mask_source` computed
        // given by the user is held fixed and runs as a what-if, with a note).
        let sources = if spec.mask_source.is_none() && full {
            vec![None]
        } else if spec.mask_source.is_none() && !tpusim_kernel::splash::computable(&w.mask) {
            sp.fixed.push(format!("mask_source loaded (the family loads {} as int8 blocks: it computes only causal, local, band and chunked masks)", w.mask));
            vec![Some(MaskSource::Loaded)]
        } else {
            axis("mask_source", spec.mask_source, MaskSource::ALL, &mut sp)
        };
        let aligns: Vec<Option<bool>> = match spec.tile_align {
            Some(v) => {
                sp.fixed.push(format!("tile_align {v}"));
                vec![None]
            }
            None if opts.allow_approximate => {
                sp.searched.push("tile_align (false, true)".into());
                vec![Some(false), Some(true)]
            }
            None => vec![None],
        };
        for &traversal in &traversals {
            for &masking in &maskings {
                for &mask_source in &sources {
                    for &tile_align in &aligns {
                        sp.combos.push(JobSpec { traversal, masking, mask_source, tile_align, ..Default::default() });
                    }
                }
            }
        }
        let [nq, nkv, nc] = target.names();
        let [gq, gkv, gc] = target.given(spec);
        // The dkv kernel's q blocks stream along the kv sequence and its kv blocks along q.
        sp.block_q = sp.blocks(nq, gq, || block_q_candidates(w.q_len));
        sp.block_kv = sp.blocks(nkv, gkv, || block_kv_candidates(w.kv_len));
        sp.search_compute = gc.is_none();
        match gc {
            Some(v) => sp.fixed.push(format!("{nc} {v}")),
            None => sp.searched.push(format!("{nc} (multiples of 128 dividing {nkv})")),
        }
        sp
    }

    fn blocks(&mut self, name: &str, given: Option<u64>, candidates: impl Fn() -> Vec<u64>) -> Vec<u64> {
        match given {
            Some(v) => {
                self.fixed.push(format!("{name} {v}"));
                vec![v]
            }
            None => {
                let v = candidates();
                self.searched.push(format!("{name} ({} values)", v.len()));
                v
            }
        }
    }

    /// The matmul search space: block_m (multiples of 8), block_n and block_k (multiples of
    /// 128) over {128, ..., 2048} and the full dimension, as candidates.
    fn matmul(spec: &JobSpec, mm: &tpusim_workload::MatmulCall) -> (Space, Vec<Cand>) {
        let mut sp = Space::default();
        let mut lists: Vec<Vec<u64>> = Vec::new();
        for (name, given, dim, align) in
            [("block_m", spec.block_m, mm.m, 8u64), ("block_n", spec.block_n, mm.n, 128), ("block_k", spec.block_k, mm.k, 128)]
        {
            lists.push(sp.blocks(name, given, || {
                let full = dim.next_multiple_of(align);
                let mut v: BTreeSet<u64> = [128u64, 256, 512, 1024, 2048].into_iter().filter(|&b| b <= full).collect();
                if full <= 2048 {
                    v.insert(full);
                }
                v.into_iter().collect()
            }));
        }
        let mut cands = Vec::new();
        for &m in &lists[0] {
            for &n in &lists[1] {
                for &k in &lists[2] {
                    cands.push(JobSpec { block_m: Some(m), block_n: Some(n), block_k: Some(k), ..Default::default() });
                }
            }
        }
        (sp, cands)
    }
}

/// Stage 2: evaluating candidates in parallel, each once.
struct Search<'a> {
    spec: &'a JobSpec,
    chip: ChipModel,
    chip_key: String,
    opts: &'a TuneOptions,
    pool: rayon::ThreadPool,
    ev: Evaluator,
    seen: HashSet<String>,
    results: Vec<(Cand, Eval)>,
    /// Each stage's name and the configurations it evaluated (they add up to the total).
    stages: Vec<(String, usize)>,
    /// How many stages the search runs (for the progress lines).
    stage_count: usize,
}

impl<'a> Search<'a> {
    fn new(spec: &'a JobSpec, chip: ChipModel, opts: &'a TuneOptions) -> Result<Self, SweepError> {
        let mut ev = Evaluator::new();
        ev.skip_dense = true;
        Ok(Search {
            spec,
            chip_key: format!("{:?}|{:?}", spec.chip, spec.set),
            chip,
            opts,
            pool: crate::pool(opts.jobs)?,
            ev,
            seen: HashSet::new(),
            results: Vec::new(),
            stages: Vec::new(),
            stage_count: 1,
        })
    }

    /// Evaluates the candidates not seen before; returns the index of the first new result.
    /// With `need` (and not [`TuneOptions::exhaustive`]) candidates are lowered and bounded
    /// first, then simulated in order of their bound, a chunk at a time, until the rest cannot
    /// change what the search keeps (module docs, "Pruning").
    fn stage(&mut self, cands: Vec<Cand>, what: &str, need: Option<Need>) -> usize {
        let fresh: Vec<Cand> = cands.into_iter().filter(|c| self.seen.insert(cand_key(c))).collect();
        self.stages.push((what.to_string(), fresh.len()));
        let label = format!("tune: {what} (stage {} of {})", self.stages.len(), self.stage_count.max(self.stages.len()));
        let pb = crate::progress_bar(self.opts.progress, fresh.len() as u64, &label);
        let (ev, chip_key, chip, spec, opts) = (&self.ev, &self.chip_key, &self.chip, self.spec, self.opts);
        let tick = || {
            if let Some(pb) = &pb {
                pb.inc(1);
            }
        };
        // One candidate simulated (or skipped once the search is cancelled).
        let run = |c: &Cand| {
            if opts.cancelled() {
                return Eval::Other("interrupted".into());
            }
            let e = evaluate(ev, chip_key, chip, spec, c, opts);
            tick();
            e
        };
        let evals: Vec<Eval> = match need.filter(|_| !opts.exhaustive) {
            None => self.pool.install(|| fresh.par_iter().map(run).collect()),
            Some(need) => {
                // Lowering every candidate first (counted as it goes), then simulating the
                // lowered ones by their bound (counted anew: the rest may be pruned).
                if let Some(pb) = &pb {
                    pb.set_message(", lowering");
                }
                let pre: Vec<Pre> = self.pool.install(|| {
                    fresh
                        .par_iter()
                        .map(|c| {
                            let p = if opts.cancelled() { Pre::Done(Eval::Other("interrupted".into())) } else { prepare(chip, spec, c, opts) };
                            tick();
                            p
                        })
                        .collect()
                });
                // Every lowered candidate is pruned until it is simulated.
                let mut order: Vec<(f64, usize)> = Vec::new();
                let mut evals: Vec<Eval> = pre
                    .into_iter()
                    .enumerate()
                    .map(|(i, p)| match p {
                        Pre::Done(e) => e,
                        Pre::Lowered(job, bound) => {
                            order.push((bound, i));
                            Eval::Pruned(job)
                        }
                    })
                    .collect();
                if let Some(pb) = &pb {
                    pb.set_message(", simulating the lowered ones, lowest latency bound first (the rest pruned once they cannot rank)");
                    pb.set_length(order.len() as u64);
                    pb.set_position(0);
                    pb.reset_eta();
                }
                // Lowest bound first (ties in candidate order, so the outcome is deterministic).
                order.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                let mut board = Board::new(&self.results, need);
                for chunk in order.chunks(PRUNE_CHUNK) {
                    // Sorted by bound: once the chunk's lowest cannot rank, nothing after it can.
                    if board.settled(chunk[0].0) {
                        break;
                    }
                    let done: Vec<(usize, Eval)> = self.pool.install(|| chunk.par_iter().map(|&(_, i)| (i, run(&fresh[i]))).collect());
                    for (i, e) in done {
                        board.add(&e);
                        evals[i] = e;
                    }
                }
                evals
            }
        };
        if let Some(pb) = pb {
            pb.finish_and_clear();
        }
        let start = self.results.len();
        self.results.extend(fresh.into_iter().zip(evals));
        start
    }

    /// The attention search (module docs): options at the given blocks; every block pair with
    /// the options within [`OPTION_WINDOW`] of the best; the best pairs over every compute width.
    fn attention(&mut self, sp: &Space) {
        let target = sp.target.unwrap_or(Target::Forward);
        // Stage 1 decides which options go on by a window around the best: all are simulated.
        self.stage_count = 3;
        let s1 = self.stage(sp.combos.clone(), "options", None);
        let kept = self.kept_options(s1, &sp.combos);
        let mut s2 = Vec::new();
        for c in &kept {
            for &bq in &sp.block_q {
                for &bkv in &sp.block_kv {
                    s2.push(target.set(c, bq, bkv, None));
                }
            }
        }
        self.stage(s2, "blocks", Some(Need { jobs: self.opts.top, pairs: Some((target, self.opts.refine)) }));
        let mut s3 = Vec::new();
        for (bq, bkv) in self.best_pairs(target, self.opts.refine) {
            let computes: Vec<Option<u64>> = if sp.search_compute {
                (1..=bkv / 128).map(|m| m * 128).filter(|c| bkv % c == 0).chain(std::iter::once(bkv)).map(Some).collect()
            } else {
                vec![None]
            };
            for c in &sp.combos {
                for &bc in &computes {
                    s3.push(target.set(c, bq, bkv, bc));
                }
            }
        }
        self.stage(s3, "compute widths", Some(Need { jobs: self.opts.top, pairs: None }));
    }

    /// Option combinations within the window of the best from `start` on, plus those the probe
    /// could not run (e.g. over VMEM at the given blocks), which go on unjudged.
    fn kept_options(&self, start: usize, combos: &[Cand]) -> Vec<Cand> {
        let results = &self.results[start..];
        let mut scored: Vec<(f64, &Cand)> = results.iter().filter_map(|(c, e)| e.latency().map(|l| (l, c))).collect();
        let judged: HashSet<String> =
            results.iter().filter(|(_, e)| matches!(e, Eval::Ok(..) | Eval::Inexact)).map(|(c, _)| cand_key(c)).collect();
        scored.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| cand_key(a.1).cmp(&cand_key(b.1))));
        let Some(&(best, _)) = scored.first() else {
            return combos.to_vec();
        };
        let mut k: Vec<Cand> = scored.iter().filter(|(l, _)| *l <= best * OPTION_WINDOW).map(|(_, c)| (*c).clone()).collect();
        k.extend(combos.iter().filter(|c| !judged.contains(&cand_key(c))).cloned());
        k
    }

    /// The `n` fastest distinct (q, kv) block pairs of the searched kernel so far.
    fn best_pairs(&self, target: Target, n: usize) -> Vec<(u64, u64)> {
        let mut ranked: Vec<(f64, String, (u64, u64))> = self
            .results
            .iter()
            .filter_map(|(_, e)| match e {
                Eval::Ok(rj) => match &rj.1 {
                    Job::Attention { config, .. } => {
                        let (q, kv, _) = target.of_config(config);
                        Some((rj.0.latency_ms, format!("{config:?}"), (q, kv)))
                    }
                    _ => None,
                },
                _ => None,
            })
            .collect();
        ranked.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
        let mut pairs: Vec<(u64, u64)> = Vec::new();
        for (_, _, p) in ranked {
            if !pairs.contains(&p) {
                pairs.push(p);
            }
            if pairs.len() >= n {
                break;
            }
        }
        pairs
    }
}

/// Searches block sizes and options for `spec` (module docs), in stages: the search space, the
/// evaluation of candidates, and the ranking.
///
/// # Errors
/// [`SweepError`] when the chip or the job itself is invalid (before any block is changed), or
/// when no candidate is valid.
pub fn tune(spec: &JobSpec, opts: &TuneOptions) -> Result<TuneResult, SweepError> {
    let start = Instant::now();
    if opts.top == 0 {
        return Err(SweepError::new("--top 0: expected at least 1 configuration to list".to_string()));
    }
    if opts.refine == 0 {
        return Err(SweepError::new("--refine 0: expected at least 1 (block_q, block_kv) pair to refine".to_string()));
    }
    if opts.progress {
        crate::progress::interval()?;
    }
    let chip = spec.chip()?;
    // The job compared against: the baseline's (the same workload), else the spec's own.
    let base_spec = opts.baseline.as_ref().unwrap_or(spec);
    let given = base_spec.build(&chip)?;
    let mut search = Search::new(spec, chip.clone(), opts)?;
    let space = match &given {
        Job::Attention { workload: w, .. } => {
            let sp = Space::attention(spec, w, Target::of(&given), opts);
            search.attention(&sp);
            sp
        }
        Job::Matmul { workload: mm, .. } => {
            let (sp, cands) = Space::matmul(spec, mm);
            search.stage(cands, "blocks", Some(Need { jobs: opts.top, pairs: None }));
            sp
        }
        Job::Described(d) => {
            return Err(SweepError::new(format!(
                "tune: `{}` is a kernel read from its IR: its lowering fixed its blocks (re-lower it with tpusim.jax at other blocks and sweep the files)",
                d.kernel_name
            )))
        }
    };
    if opts.cancelled() {
        return Err(SweepError::new("tune: interrupted".to_string()));
    }
    let given_eval =
        evaluate(&search.ev, &search.chip_key, &chip, base_spec, &JobSpec::default(), &TuneOptions { allow_inexact: true, ..opts.clone() });
    let mut r = rank(&chip, given, given_eval, &search.results, space, opts, spec, start)?;
    r.stages = search.stages.iter().map(|(name, configurations)| Stage { name: name.clone(), configurations: *configurations }).collect();
    Ok(r)
}

/// When no configuration is valid and the given job breaks a rule of a field it gives (a field
/// tune holds fixed), that rule is the reason: the error `tpusim run` gives (the field, its value
/// and the rule), saying that tune holds the field fixed.
///
/// # Errors
/// [`SweepError::Spec`] naming the field when the given job breaks a rule of a field it gives.
fn held_fixed_rules(spec: &JobSpec, given: &Job, chip: &ChipModel) -> Result<(), SweepError> {
    let Err(JobError::Kernel(KernelError::Config { field, value, allowed })) = given.lower(chip) else {
        return Ok(());
    };
    let name = field.trim_matches('`');
    if !spec.set_fields().contains_key(spec.field_as_given(name)) {
        return Ok(());
    }
    Err(SweepError::Spec(tpusim_job::SpecError::Field {
        field: name.to_string(),
        value,
        allowed: format!(
            "{allowed} (tune holds `{name}` fixed because it was given, and no configuration around it runs: change it, or leave it out to search it)"
        ),
    }))
}

/// One stage of a search and the configurations it evaluated ([`TuneResult::stages`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Stage {
    /// `options`, `blocks` or `compute widths`.
    pub name: String,
    /// Configurations it evaluated (new ones: a configuration an earlier stage evaluated is not
    /// evaluated again).
    pub configurations: usize,
}

/// Stage 3: distinct valid jobs ranked by latency (ties by the job's text), with the counts of
/// what was rejected and why.
#[allow(clippy::too_many_arguments)]
fn rank(
    chip: &ChipModel,
    given: Job,
    given_eval: Eval,
    results: &[(Cand, Eval)],
    space: Space,
    opts: &TuneOptions,
    spec: &JobSpec,
    start: Instant,
) -> Result<TuneResult, SweepError> {
    let (given_latency_ms, given_error) = match &given_eval {
        Eval::Ok(rj) => (Some(rj.0.latency_ms), None),
        Eval::Other(e) | Eval::Rules(e) => (None, Some(e.clone())),
        Eval::Vmem => (None, Some("the given blocks overflow the VMEM limit".into())),
        Eval::Inexact | Eval::Pruned(..) => (None, None),
    };
    let count = |f: fn(&Eval) -> bool| results.iter().filter(|(_, e)| f(e)).count();
    let rejected_rules = count(|e| matches!(e, Eval::Rules(_) | Eval::Other(_)));
    let rejected_vmem = count(|e| matches!(e, Eval::Vmem));
    let rejected_inexact = count(|e| matches!(e, Eval::Inexact));
    let mut valid: Vec<(f64, String, &Report, &Job)> = Vec::new();
    let mut jobs_seen = HashSet::new();
    for (_, e) in results {
        if let Eval::Ok(rj) = e {
            let (r, job) = (&rj.0, &rj.1);
            let key = serde_json::to_string(job).unwrap_or_default();
            if jobs_seen.insert(key.clone()) {
                valid.push((r.latency_ms, key, r, job));
            }
        }
    }
    // Pruned jobs are valid but not ranked: enough simulated ones are faster (module docs).
    let mut pruned = 0;
    for (_, e) in results {
        if let Eval::Pruned(job) = e {
            if jobs_seen.insert(serde_json::to_string(job).unwrap_or_default()) {
                pruned += 1;
            }
        }
    }
    let ok_evals = results.iter().filter(|(_, e)| matches!(e, Eval::Ok(..) | Eval::Pruned(..))).count();
    if valid.is_empty() {
        if matches!(given_eval, Eval::Rules(_)) {
            held_fixed_rules(spec, &given, chip)?;
        }
        // Name the rule the held-fixed blocks break, as `tpusim run` would.
        let rule = results.iter().find_map(|(_, e)| match e {
            Eval::Rules(r) | Eval::Other(r) => Some(r.clone()),
            _ => None,
        });
        return Err(SweepError::new(format!(
            "no valid configuration among {} evaluated: {rejected_vmem} over the VMEM limit, {rejected_rules} breaking block rules{}, {rejected_inexact} inexact; {}",
            results.len(),
            rule.map(|r| format!(" (e.g. {r})")).unwrap_or_default(),
            if spec.block_q.is_some() || spec.block_kv.is_some() || spec.block_kv_compute.is_some() {
                "change the blocks held fixed or raise --vmem-limit-mib"
            } else {
                "raise --vmem-limit-mib"
            }
        )));
    }
    valid.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
    let top: Vec<Ranked> = valid
        .iter()
        .take(opts.top)
        .enumerate()
        .map(|(i, (l, _, r, job))| Ranked {
            rank: i + 1,
            latency_ms: *l,
            speedup_vs_given: given_latency_ms.map(|g| g / l),
            // By the what-if rule of `tpusim run` (the unit whose 2x speed-up gains the most).
            bottleneck: tpusim_job::run(chip, job)
                .map(|run| tpusim_job::Report::from_run_as(&run, run.chip.identity()).with_what_if(&run).bottleneck)
                .unwrap_or(r.bottleneck),
            mfu: r.mfu,
            vmem_bytes: r.vmem_bytes,
            vmem_limit_bytes: r.vmem_limit_bytes,
            job: (*job).clone(),
            flags: job.config_spec().to_flags(),
            block_sizes: job.block_sizes_call(),
            design_whatif: Some(tpusim_job::design_what_ifs(job).join("; ")).filter(|w| !w.is_empty()),
        })
        .collect();
    Ok(TuneResult {
        chip: chip.name.clone(),
        chip_model: chip.identity(),
        given_latency_ms,
        given_error,
        given_job: match given_eval {
            Eval::Ok(rj) => Some(rj.1),
            _ => Some(given),
        },
        searched: space.searched,
        fixed: space.fixed,
        evaluated: results.len(),
        stages: Vec::new(),
        rejected_rules,
        rejected_vmem,
        rejected_inexact,
        valid: valid.len() + pruned,
        duplicates: ok_evals - valid.len() - pruned,
        pruned,
        seconds: start.elapsed().as_secs_f64(),
        best_command: top.first().map(|r: &Ranked| {
            let full = JobSpec { chip: spec.chip.clone(), set: spec.set.clone(), ..r.job.to_spec() };
            format!("tpusim run {}", full.to_flags())
        }),
        top,
    })
}

/// Whether a candidate is dropped as inexact: the tuner (not the user) chose masking `none` and
/// the tiling has partial tiles (`partial`), which then give wrong results.
fn inexact(spec: &JobSpec, cand: &Cand, opts: &TuneOptions, partial: bool) -> bool {
    spec.masking.is_none() && cand.masking == Some(Masking::None) && !opts.allow_inexact && partial
}

/// A candidate lowered, before simulation: its job and a lower bound on its latency (ms), or
/// what it gave without simulation (refused, inexact).
enum Pre {
    Lowered(Box<Job>, f64),
    Done(Eval),
}

/// Builds and lowers a candidate and bounds its latency from below
/// ([`tpusim_job::latency_lower_bound_s`]); the outcome [`evaluate`] would give for a
/// candidate that does not run, or is dropped as inexact, without simulating it.
fn prepare(chip: &ChipModel, spec: &JobSpec, cand: &Cand, opts: &TuneOptions) -> Pre {
    let s = spec.overlay(cand);
    let render = |e: &dyn std::fmt::Display| s.render_error(&e.to_string(), tpusim_job::FieldStyle::Flag);
    let job = match s.build(chip) {
        Ok(j) => j,
        Err(e) => return Pre::Done(Eval::Other(render(&e))),
    };
    // The bound needs each body's operations, not their order: bodies built for counting only.
    match tpusim_model::body::counting_only(|| job.lower(chip)) {
        Ok(lowered) => {
            // As `evaluate` judges it from the report's tiles (the first kernel's).
            let partial = lowered.phases.iter().find_map(|p| match &p.work {
                tpusim_model::PhaseWork::Kernel(k) => Some(k.info.tiles.is_some_and(|t| t.partial > 0)),
                tpusim_model::PhaseWork::Fusion(_) => None,
            });
            if inexact(spec, cand, opts, partial == Some(true)) {
                return Pre::Done(Eval::Inexact);
            }
            let bound_ms = tpusim_job::latency_lower_bound_s(chip, &lowered) * 1e3;
            Pre::Lowered(Box::new(job), bound_ms)
        }
        Err(JobError::Kernel(KernelError::Vmem { .. })) => Pre::Done(Eval::Vmem),
        Err(e @ JobError::Kernel(KernelError::Config { .. })) => Pre::Done(Eval::Rules(render(&e))),
        Err(e) => Pre::Done(Eval::Other(render(&e))),
    }
}

fn evaluate(ev: &Evaluator, chip_key: &str, chip: &ChipModel, spec: &JobSpec, cand: &Cand, opts: &TuneOptions) -> Eval {
    let s = spec.overlay(cand);
    let render = |e: &dyn std::fmt::Display| s.render_error(&e.to_string(), tpusim_job::FieldStyle::Flag);
    let job = match s.build(chip) {
        Ok(j) => j,
        Err(e) => return Eval::Other(render(&e)),
    };
    match ev.run(chip_key, chip, &job) {
        Ok(run) => {
            // No what-if table per candidate: the ranked ones get theirs (six re-timings each).
            let r = tpusim_job::Report::from_run_as(&run, run.chip.identity());
            if inexact(spec, cand, opts, r.tiles.is_some_and(|t| t.partial > 0)) {
                return Eval::Inexact;
            }
            Eval::Ok(Box::new((r, job)))
        }
        Err(JobError::Kernel(KernelError::Vmem { .. })) => Eval::Vmem,
        Err(e @ JobError::Kernel(KernelError::Config { .. })) => Eval::Rules(render(&e)),
        Err(e) => Eval::Other(render(&e)),
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

impl TuneResult {
    /// JSON, one object.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// The ranked configurations as lines ready to paste into Python: the kernel's config call
    /// (`BlockSizes(...)`, tokamax's `SplashConfig(...)`) with a comment giving the rank, the
    /// latency and the options that are not block sizes; a line whose blocks an earlier rank
    /// has says so and which options differ; a design what-if's line says which option its
    /// kernel has no setting for, after a `*`.
    pub fn to_block_sizes(&self) -> String {
        let mut s = String::new();
        // Per BlockSizes written: its rank and flags (`--name value` options).
        let mut seen: Vec<(&str, usize, Vec<String>)> = Vec::new();
        let options = |flags: &str| flags.split(" --").map(|o| o.trim_start_matches("--").to_string()).collect::<Vec<_>>();
        for r in &self.top {
            match &r.block_sizes {
                Some(b) => {
                    let flags = r.job.config_spec().to_flags();
                    let opts = options(&flags);
                    let same = match seen.iter().find(|(sb, _, _)| *sb == b.as_str()) {
                        Some((_, rank, first)) => {
                            let differ: Vec<String> = opts.iter().filter(|o| !first.contains(o)).map(|o| format!("--{o}")).collect();
                            format!(" (the same blocks as rank {rank}; differs in {})", differ.join(" "))
                        }
                        None => {
                            seen.push((b.as_str(), r.rank, opts));
                            String::new()
                        }
                    };
                    // A design what-if (an option the kernel's library has no setting for) carries
                    // the table's `*` and says which option.
                    let what_ifs = tpusim_job::design_what_ifs(&r.job);
                    let mark = if what_ifs.is_empty() { String::new() } else { format!("; * a design what-if: {}", what_ifs.join("; ")) };
                    let _ = writeln!(s, "{b}  # rank {}: {} ms; {flags}{same}{mark}", r.rank, ms(r.latency_ms));
                }
                None => {
                    let _ = writeln!(s, "# rank {}: {} ms; {} (not attention: no BlockSizes)", r.rank, ms(r.latency_ms), r.flags);
                }
            }
        }
        s
    }

    /// A table for people.
    pub fn to_table(&self) -> String {
        let mut s = String::new();
        let mib = |b: u64| b as f64 / 1048576.0;
        match &self.given_job {
            Some(Job::Attention { workload: w, .. }) => {
                let _ = writeln!(
                    s,
                    "tpusim tune: {} attention on {}: batch {}, heads {} (kv heads {}), q_len {}, kv_len {}, head_dim {}/{}, mask {}",
                    self.given_job.as_ref().and_then(Job::kernel).map(|k| k.to_string()).unwrap_or_default(),
                    self.chip,
                    w.batch,
                    w.q_heads,
                    w.kv_heads,
                    w.q_len,
                    w.kv_len,
                    w.head_dim,
                    w.head_dim_v,
                    w.mask
                );
            }
            Some(Job::Matmul { workload: m, .. }) => {
                let _ = writeln!(s, "tpusim tune: blocked matmul on {}: M {} x N {} x K {}", self.chip, m.m, m.n, m.k);
            }
            // tune refuses a kernel read from its IR before it searches.
            Some(Job::Described(_)) | None => {}
        }
        let _ = writeln!(s, "  chip model   {}", self.chip_model);
        let _ = writeln!(s, "  searched     {}", if self.searched.is_empty() { "nothing".into() } else { self.searched.join("; ") });
        if !self.fixed.is_empty() {
            let _ = writeln!(s, "  fixed        {}", self.fixed.join("; "));
        }
        let inexact = match &self.given_job {
            Some(Job::Matmul { .. }) => String::new(),
            _ => format!(", {} inexact (masking none on partial tiles)", self.rejected_inexact),
        };
        let stages = if self.stages.len() > 1 {
            let parts: Vec<String> = self.stages.iter().map(|st| format!("{} {}", st.name, st.configurations)).collect();
            format!(" ({})", parts.join(" + "))
        } else {
            String::new()
        };
        let _ = writeln!(
            s,
            "  evaluated    {} configurations{stages} in {:.1} s: {} valid, {} duplicates of a valid one, {} over the VMEM limit, {} breaking block rules{inexact}",
            self.evaluated, self.seconds, self.valid, self.duplicates, self.rejected_vmem, self.rejected_rules
        );
        if self.pruned > 0 {
            let _ = writeln!(
                s,
                "  simulated    {} of the valid ones; {} skipped, as they cannot rank: a lower bound on each one's latency is already slower than enough simulated ones (--exhaustive simulates them; the ranking is the same)",
                self.valid - self.pruned,
                self.pruned
            );
        }
        match (self.given_latency_ms, &self.given_error, &self.given_job) {
            (Some(l), _, Some(job)) => {
                let _ = writeln!(s, "  given        {} ms with {}", ms(l), job.config_spec().to_flags());
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
            job @ Job::Attention { .. } => {
                let (nq, nkv, nc) = match Target::of(job) {
                    Target::Forward => ("block_q", "block_kv", "compute"),
                    Target::Backward { .. } => ("q_dkv", "kv_dkv", "compute"),
                };
                let _ = writeln!(
                    s,
                    "  {:>4}  {:>10}  {:>7}  {:>7}  {:>8}  {:>7}  {:<10}  {:<8}  {:<9}  {:<5}  {:<12}  {:>5}  {:>8}",
                    "rank",
                    "latency_ms",
                    "vs given",
                    nq,
                    nkv,
                    nc,
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
            Job::Described(_) => {}
        }
        // Options the family's library has no setting for (design what-ifs), marked with `*`.
        let mut what_if_kernel = None;
        let mut runnable: Option<&Ranked> = None;
        for r in &self.top {
            let vs = r.speedup_vs_given.map_or("-".to_string(), |x| format!("{x:.3}x"));
            match &r.job {
                Job::Attention { config: c, workload: w, .. } => {
                    let (bq, bkv, bc) = Target::of(&r.job).of_config(c);
                    let what_ifs = c.kernel.what_ifs(c.traversal, c.masking, c.mask_source, c.exp, w.mask.is_full());
                    let mark = |name: &str, word: &str| if what_ifs.iter().any(|x| x.starts_with(name)) { format!("{word}*") } else { word.to_string() };
                    if what_ifs.is_empty() {
                        runnable = runnable.or(Some(r));
                    } else {
                        what_if_kernel = Some(c.kernel);
                    }
                    let _ = writeln!(
                        s,
                        "  {:>4}  {:>10}  {:>7}  {:>7}  {:>8}  {:>7}  {:<10}  {:<8}  {:<9}  {:<5}  {:<12}  {:>4.1}%  {:>8.1}",
                        r.rank,
                        ms(r.latency_ms),
                        vs,
                        bq,
                        bkv,
                        bc,
                        mark("traversal", c.traversal.word()),
                        mark("masking", c.masking.word()),
                        mark("mask_source", c.mask_source.word()),
                        if c.tile_align { "yes" } else { "no" },
                        r.bottleneck.word(),
                        r.mfu * 100.0,
                        mib(r.vmem_bytes)
                    );
                }
                Job::Matmul { config: c, .. } => {
                    let _ = writeln!(
                        s,
                        "  {:>4}  {:>10}  {:>7}  {:>7}  {:>7}  {:>7}  {:<12}  {:>4.1}%  {:>8.1}",
                        r.rank,
                        ms(r.latency_ms),
                        vs,
                        c.block_m,
                        c.block_n,
                        c.block_k,
                        r.bottleneck.word(),
                        r.mfu * 100.0,
                        mib(r.vmem_bytes)
                    );
                }
                Job::Described(_) => {}
            }
        }
        if let Some(k) = what_if_kernel {
            let d = k.defaults();
            let best = match runnable {
                Some(r) => format!("the fastest it runs as it is: rank {} ({} ms)", r.rank, ms(r.latency_ms)),
                None => "none of these runs as it is (give --traversal and --masking to hold them at its own)".to_string(),
            };
            let _ = writeln!(
                s,
                "  * a design what-if: {k} has no setting for it (it runs traversal {}, masking {}{}); {best}",
                d.traversal,
                d.masking,
                if k == tpusim_kernel::Kernel::FlashAttention { ", its mask computed" } else { "" }
            );
        }
        // Ranked rows with the same blocks and the same latency differ only in options that
        // change nothing for this job (masking a full mask without padding, say): say so.
        let same = |a: &Ranked, b: &Ranked| a.latency_ms.to_bits() == b.latency_ms.to_bits() && a.block_sizes == b.block_sizes && a.block_sizes.is_some();
        let mut i = 0;
        while i < self.top.len() {
            let j = (i + 1..self.top.len()).take_while(|&j| same(&self.top[i], &self.top[j])).last().unwrap_or(i);
            if j > i {
                let _ = writeln!(
                    s,
                    "  note: ranks {} to {} have the same blocks and latency: their other options change nothing for this job",
                    self.top[i].rank, self.top[j].rank
                );
            }
            i = j + 1;
        }
        if let Some(cmd) = &self.best_command {
            let what_if = if self.top.first().is_some_and(|r| runnable.is_none_or(|x| x.rank != r.rank) && what_if_kernel.is_some()) { " (a design what-if, *)" } else { "" };
            let _ = writeln!(s, "\n  best{what_if}: {cmd}");
        }
        s
    }
}

/// A latency in ms as the tune report prints it: three decimals, more below 1 ms so that four
/// significant digits show (0.001403, not 0.001: ranks of sub-microsecond runs told apart, and
/// the ratios beside them readable from the times).
fn ms(x: f64) -> String {
    let decimals = if x > 0.0 && x.is_finite() { (3 - x.log10().floor() as i64).clamp(3, 7) as usize } else { 3 };
    format!("{x:.decimals$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sub-millisecond latencies keep four significant digits, so that ranks a fresh user saw
    /// printed as 0.001 and 0.003 beside a 1.934x ratio read as what they are.
    #[test]
    fn latencies_print_four_significant_digits_below_a_millisecond() {
        assert_eq!(ms(75.05461), "75.055");
        assert_eq!(ms(3.1806), "3.181");
        assert_eq!(ms(0.25), "0.2500");
        assert_eq!(ms(0.0014034), "0.001403");
        assert_eq!(ms(0.0000012345), "0.0000012");
        assert_eq!(ms(0.0), "0.000");
        let (a, b) = (0.0014034, 0.0027142);
        let ratio = ms(b).parse::<f64>().unwrap() / ms(a).parse::<f64>().unwrap();
        assert!((ratio / (b / a) - 1.0).abs() < 1e-3, "{ratio}");
    }

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

    /// Pruning by the latency lower bound changes nothing but the count simulated: the ranking,
    /// the counts and the best command equal the exhaustive search's, forward, backward and
    /// matmul; and it does skip configurations.
    #[test]
    fn pruned_search_equals_exhaustive_search() {
        let cases = [
            JobSpec { heads: Some(2), seq_len: Some(4096), mask: Some("causal".into()), ..Default::default() },
            JobSpec {
                heads: Some(2),
                seq_len: Some(4000),
                mask: Some("band:1500+sink:256".into()),
                kernel: Some(tpusim_kernel::Kernel::SparseSplash),
                ..Default::default()
            },
            JobSpec { heads: Some(2), seq_len: Some(2048), direction: Some(Direction::Bwd), ..Default::default() },
            JobSpec { kernel: Some(tpusim_kernel::Kernel::PallasMatmul), m: Some(1024), n: Some(1024), k: Some(1024), ..Default::default() },
        ];
        let mut pruned = 0;
        for spec in &cases {
            for top in [1, 5] {
                let opts = TuneOptions { top, refine: 4, ..Default::default() };
                let fast = tune(spec, &opts).unwrap();
                let all = tune(spec, &TuneOptions { exhaustive: true, ..opts }).unwrap();
                assert_eq!(all.pruned, 0);
                let rows = |r: &TuneResult| r.top.iter().map(|x| (x.latency_ms, x.flags.clone(), x.bottleneck)).collect::<Vec<_>>();
                assert_eq!(rows(&fast), rows(&all), "{spec:?} top {top}");
                assert_eq!(fast.best_command, all.best_command);
                assert_eq!(
                    (fast.evaluated, fast.valid, fast.duplicates, fast.rejected_vmem, fast.rejected_rules, fast.rejected_inexact),
                    (all.evaluated, all.valid, all.duplicates, all.rejected_vmem, all.rejected_rules, all.rejected_inexact),
                    "{spec:?}"
                );
                pruned += fast.pruned;
            }
        }
        assert!(pruned > 0, "no configuration was pruned");
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
            if let Job::Attention { config, .. } = &t.job {
                assert_ne!(config.masking, tpusim_kernel::Masking::None);
            }
        }
        assert!(r.rejected_inexact > 0);
        assert!(r.to_table().contains("rank"));
    }

    /// A full mask searches no masking or mask source that changes nothing: `all` masks what
    /// `partial` does, and there is no mask to load or compute (a fresh user's finding: ranks
    /// that differed only there).
    #[test]
    fn a_full_mask_searches_no_equal_twins() {
        let spec = JobSpec { heads: Some(2), seq_len: Some(4096), mask: Some("full".into()), ..Default::default() };
        let r = tune(&spec, &TuneOptions { top: 50, ..Default::default() }).unwrap();
        for t in &r.top {
            if let Job::Attention { config, .. } = &t.job {
                assert_ne!(config.masking, tpusim_kernel::Masking::All, "{:?}", config);
            }
        }
        assert!(r.to_table().contains("all is partial for a full mask"));
    }
}
