//! Evaluating jobs end to end, sharing work between the points of a sweep.
//!
//! A point is evaluated as `tpusim run` evaluates a job ([`JobSpec::chip`], [`JobSpec::build`],
//! [`tpusim_job::run`], [`Report::from_run`]), with three savings that never change a
//! result (tested against `tpusim_job::run`):
//!
//! * **Chips** are parsed once per (chip, `set` overrides).
//! * **Lowering** is shared by points that differ only in the chip's `[device]`, `[fitted]`, `[ici]` and
//!   HBM rates (bandwidth, latency). Lowering reads the chip only for the block rules (`[vpu]`
//!   register shape), the VMEM budget (`[vmem]`), SMEM and the HBM capacity; clock, bandwidth and
//!   unit throughputs are the simulator's (ARCHITECTURE.md: step bodies carry hardware-neutral
//!   work amounts). [`lowering_key`] is the resolved job plus every other chip field, so a
//!   what-if on any other field lowers anew. A test checks that lowering with different values
//!   of the excluded fields gives identical programs, so a change to that contract fails loudly. On the sparse video case lowering
//!   (tile classification of 75,600 rows) is ~95% of a point's cost.
//! * **Dense baselines** of sparse attention points are cached per (chip, workload with the full
//!   mask, kernel configuration without tile alignment): a sweep over masks or kernel options
//!   simulates one baseline per chip, shape and blocks. The cached baseline keeps its latency and
//!   totals, which is what a report reads of it, and no per-class timings (`class_timing`,
//!   `class_steps`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use tpusim_chip::ChipModel;
use tpusim_engine::SimResult;
use tpusim_model::Lowered;
use tpusim_pallas::IrFacts;
use tpusim_job::{combine, run_with_dense, Job, JobError, JobSpec, Report, Run};

/// Caches stop growing at this many entries (memory stays bounded on huge sweeps).
const CACHE_LIMIT: usize = 100_000;
/// Distinct base models [`SharedParts`] shares (each lookup compares with every one).
const BASES_KEPT: usize = 16;
/// Dense baselines kept before the cache starts over (a sweep over timing parameters has a
/// baseline per point, which is never reused).
const DENSE_LIMIT: usize = 4096;

/// A stable 64-bit hash of a key's text (FNV-1a): the dense job part of baseline cache keys.
pub(crate) fn stable_hash(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

/// One lowering shared by the points of a group ([`Evaluator::lower_for`]).
#[derive(Debug)]
pub struct Shared {
    /// The chip it was lowered for.
    pub chip: Arc<ChipEntry>,
    /// The job lowered.
    pub job: Job,
    /// Its lowering, with the facts of an IR lowering (a kernel read from its IR).
    pub lowered: Result<(Lowered, Option<IrFacts>), JobError>,
    dense: Option<Job>,
    dense_key: Option<u64>,
    dense_lowered: LoweredCell,
}

type DenseCell = Arc<OnceLock<Result<Arc<SimResult>, JobError>>>;
type LoweredCell = OnceLock<Result<Lowered, JobError>>;
type ChipCache = HashMap<(Option<String>, Vec<String>), Result<Arc<ChipEntry>, String>>;

/// A parsed chip with its cache keys.
#[derive(Debug)]
pub struct ChipEntry {
    /// The chip with its overrides.
    pub chip: ChipModel,
    /// Identifies the whole chip (its name or path and overrides).
    pub key: String,
    /// Identifies the parts of the chip that lowering reads (module docs). One allocation per
    /// distinct key, shared by the chips that have it (a sweep over rates has one).
    pub lowering_key: Arc<str>,
    /// A hash of `lowering_key`.
    pub lowering_hash: u64,
    /// Which model this is (source, overrides, parameter hash), for the rows it produces.
    pub identity: tpusim_chip::ChipIdentity,
}

/// What evaluating one job gave.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The built job, if building succeeded (even when lowering then failed).
    pub job: Option<Job>,
    /// The chip model the point ran on, if it could be read (even when the job then failed).
    pub chip: Option<tpusim_chip::ChipIdentity>,
    /// The report, or the error that stopped the point.
    pub report: Result<Report, String>,
}

/// A job built for its chip, ready to lower and simulate.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The chip, or why it is invalid.
    pub chip: Result<Arc<ChipEntry>, String>,
    /// The job, or why it cannot be built.
    pub job: Result<Job, String>,
}

impl Prepared {
    /// Points with equal keys lower to the same program (module docs); `None` for points that
    /// fail before lowering.
    pub fn lowering_key(&self) -> Option<String> {
        match (&self.chip, &self.job) {
            (Ok(c), Ok(j)) => Some(format!("{}|{j:?}", c.lowering_key)),
            _ => None,
        }
    }
}

/// The key of the chip fields lowering reads: everything but `[device]`, `[fitted]`, `[ici]` and
/// the HBM rates (the capacity stays: lowering checks that the tensors fit).
pub fn lowering_key(chip: &ChipModel) -> String {
    let mut v = serde_json::to_value(chip).unwrap_or_default();
    if let Some(m) = v.as_object_mut() {
        m.remove("device");
        m.remove("fitted");
        m.remove("ici");
        m.remove("description");
        if let Some(h) = m.get_mut("hbm").and_then(|h| h.as_object_mut()) {
            h.retain(|k, _| k == "capacity_gib");
        }
    }
    v.to_string()
}

/// The parts cached chips share: the models their overrides were applied to (the first
/// [`BASES_KEPT`] distinct ones: a sweep names a few chips) and their lowering keys (at most
/// [`CACHE_LIMIT`]); beyond those a new one is kept by its chip alone.
#[derive(Default)]
struct SharedParts {
    bases: Vec<Arc<ChipModel>>,
    keys: std::collections::HashSet<Arc<str>>,
}

impl SharedParts {
    /// Replaces `base` with an equal model kept before, or keeps it.
    fn base(&mut self, base: &mut Arc<ChipModel>) {
        match self.bases.iter().find(|b| ***b == **base) {
            Some(b) => *base = b.clone(),
            None if self.bases.len() < BASES_KEPT => self.bases.push(base.clone()),
            None => {}
        }
    }

    /// The kept key equal to `key`, or `key` kept.
    fn key(&mut self, key: String) -> Arc<str> {
        if let Some(k) = self.keys.get(key.as_str()) {
            return k.clone();
        }
        let k: Arc<str> = key.into();
        if self.keys.len() < CACHE_LIMIT {
            self.keys.insert(k.clone());
        }
        k
    }
}

/// Evaluates jobs, caching chips and dense baselines. Shared by threads (`Sync`).
#[derive(Default)]
pub struct Evaluator {
    chips: Mutex<ChipCache>,
    /// What the cached chips share ([`Evaluator::chip`]).
    shared: Mutex<SharedParts>,
    dense: Mutex<HashMap<(String, u64), DenseCell>>,
    /// Skip the dense baseline of sparse points (the tuner only needs latency).
    pub skip_dense: bool,
    /// Add each report's what-if table ([`Report::with_what_if`]: six re-timings a point).
    pub what_if_2x: bool,
}

impl Evaluator {
    /// A new evaluator with empty caches.
    pub fn new() -> Self {
        Self::default()
    }

    /// The chip a spec names, with its overrides (cached). Chips with overrides share the model
    /// they were made from (`provenance.compiled_for`) and their lowering key when equal: a
    /// sweep over 10,000 rate combinations holds the base model once, not 10,000 times (a
    /// model with its sources is some 15 KB).
    ///
    /// # Errors
    /// The chip model's error, as text.
    pub fn chip(&self, spec: &JobSpec) -> Result<Arc<ChipEntry>, String> {
        let key = (spec.chip.clone(), spec.set.clone());
        if let Some(c) = self.chips.lock().expect("chip cache").get(&key) {
            return c.clone();
        }
        let entry = spec.chip().map_err(|e| e.to_string()).map(|mut chip| {
            let lk = lowering_key(&chip);
            let lowering_hash = stable_hash(&lk);
            let lowering_key = {
                let mut shared = self.shared.lock().expect("shared chip parts");
                if let Some(base) = &mut chip.provenance.compiled_for {
                    shared.base(base);
                }
                shared.key(lk)
            };
            Arc::new(ChipEntry {
                lowering_hash,
                lowering_key,
                key: format!("{:?}|{:?}", spec.chip, spec.set),
                identity: chip.identity(),
                chip,
            })
        });
        let mut cache = self.chips.lock().expect("chip cache");
        if cache.len() < CACHE_LIMIT {
            cache.insert(key, entry.clone());
        }
        entry
    }

    /// Resolves a spec's chip and job.
    pub fn prepare(&self, spec: &JobSpec) -> Prepared {
        let chip = self.chip(spec);
        let job = match &chip {
            Ok(c) => spec.build(&c.chip).map_err(|e| e.to_string()),
            Err(e) => Err(e.clone()),
        };
        Prepared { chip, job }
    }

    /// Builds, lowers and simulates a spec and summarises it.
    pub fn evaluate(&self, spec: &JobSpec) -> Outcome {
        let p = self.prepare(spec);
        let mut out = None;
        self.evaluate_group(&[&p], &mut |_, o| out = Some(o));
        out.expect("one outcome per point")
    }

    /// Evaluates points that share one lowering key (or a single point), lowering once; calls
    /// `done(i, outcome)` for `group[i]` as each finishes.
    pub fn evaluate_group(&self, group: &[&Prepared], done: &mut dyn FnMut(usize, Outcome)) {
        let Some(first) = group.first() else { return };
        let shared = self.lower_for(first);
        for (i, p) in group.iter().enumerate() {
            done(i, self.evaluate_in(shared.as_ref(), p));
        }
    }

    /// The lowering that points like `p` share (its chip and job lowered once), or `None` when
    /// `p` fails before lowering.
    pub fn lower_for(&self, p: &Prepared) -> Option<Shared> {
        let (Ok(chip), Ok(job)) = (&p.chip, &p.job) else { return None };
        let dense = if self.skip_dense { None } else { job.dense_baseline() };
        Some(Shared {
            lowered: job.lower_with_facts(&chip.chip),
            dense_key: dense.as_ref().map(|d| stable_hash(&format!("{d:?}"))),
            dense,
            dense_lowered: OnceLock::new(),
            chip: chip.clone(),
            job: job.clone(),
        })
    }

    /// Evaluates `p` on a shared lowering when its job is the one lowered (otherwise, or without
    /// one, on its own).
    pub fn evaluate_in(&self, shared: Option<&Shared>, p: &Prepared) -> Outcome {
        let (chip, job) = match (&p.chip, &p.job) {
            (Ok(c), Ok(j)) => (c, j),
            (Err(e), _) | (_, Err(e)) => {
                return Outcome { job: p.job.as_ref().ok().cloned(), chip: p.chip.as_ref().ok().map(|c| c.identity.clone()), report: Err(e.clone()) }
            }
        };
        let own;
        let g = match shared {
            Some(g) if g.job == *job && g.chip.lowering_key == chip.lowering_key => g,
            _ => {
                own = self.lower_for(p).expect("a prepared point with a chip and a job lowers");
                &own
            }
        };
        let report = g.lowered.as_ref().map_err(|e| e.to_string()).and_then(|(low, facts)| {
            let dense = match (&g.dense, g.dense_key) {
                (Some(dj), Some(dk)) => Some(
                    self.dense_result((chip.key.clone(), dk), &chip.chip, &|| {
                        g.dense_lowered.get_or_init(|| dj.lower(&g.chip.chip)).clone()
                    })
                    .map_err(|e| e.to_string())?,
                ),
                _ => None,
            };
            let mut run = tpusim_job::run_lowered(&chip.chip, job, low.clone(), dense);
            run.facts.clone_from(facts);
            let rep = Report::row_of(&run, chip.identity.clone());
            Ok(if self.what_if_2x { rep.with_what_if(&run) } else { rep })
        });
        Outcome { job: Some(job.clone()), chip: Some(chip.identity.clone()), report }
    }

    /// The dense baseline's result for a chip and dense job (cached by the chip's key and a hash
    /// of the dense job's text), lowering with `lower_dense` on a miss. Its latency and totals
    /// only: `class_timing` and `class_steps` are empty.
    fn dense_result(&self, key: (String, u64), chip: &ChipModel, lower_dense: &dyn Fn() -> Result<Lowered, JobError>) -> Result<SimResult, JobError> {
        let cell = {
            let mut cache = self.dense.lock().expect("dense cache");
            match cache.get(&key) {
                Some(cell) => cell.clone(),
                None => {
                    let cell = DenseCell::default();
                    if cache.len() >= DENSE_LIMIT {
                        cache.clear();
                    }
                    cache.insert(key, cell.clone());
                    cell
                }
            }
        };
        let r = cell.get_or_init(|| {
            let mut phases = tpusim_job::simulate_call(chip, &lower_dense()?);
            // A report reads the baseline's latency and totals ([`Report::row_of`]), not its
            // per-class timings: the cache keeps none (thousands of baselines are kept).
            for p in &mut phases {
                p.result.class_timing = Vec::new();
                p.result.class_steps = Vec::new();
            }
            Ok(Arc::new(combine(chip, &phases)))
        });
        r.clone().map(|r| SimResult::clone(&r))
    }

    /// [`tpusim_job::run`] with the dense baseline taken from the cache (one job, no
    /// shared lowering).
    ///
    /// # Errors
    /// Lowering errors, as `run` reports them.
    pub fn run(&self, chip_key: &str, chip: &ChipModel, job: &Job) -> Result<Run, JobError> {
        let dense = match if self.skip_dense { None } else { job.dense_baseline() } {
            None => None,
            Some(dj) => Some(self.dense_result((chip_key.to_string(), stable_hash(&format!("{dj:?}"))), chip, &|| dj.lower(chip))?),
        };
        run_with_dense(chip, job, dense)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specs() -> Vec<JobSpec> {
        let sparse = JobSpec {
            seq_len: Some(8192),
            mask: Some("band:2000+sink:512".into()),
            traversal: Some(tpusim_kernel::Traversal::Compact),
            masking: Some(tpusim_kernel::Masking::Partial),
            ..Default::default()
        };
        vec![
            JobSpec { seq_len: Some(4096), ..Default::default() },
            sparse.clone(),
            JobSpec { mask: Some("causal".into()), ..sparse.clone() },
            JobSpec { tile_align: Some(true), ..sparse.clone() },
            JobSpec { block_q: Some(4000), ..sparse.clone() },
            JobSpec { block_q: Some(8192), block_kv: Some(8192), ..sparse.clone() },
            JobSpec { kernel: Some(tpusim_kernel::Kernel::PallasMatmul), m: Some(1024), n: Some(1024), k: Some(512), ..Default::default() },
            // A kernel read from its IR (the CLI tests' fixture), alone and as a host-timed call.
            JobSpec { kernel_ir: Some(FIXTURE.into()), ..Default::default() },
            JobSpec { kernel_ir: Some(FIXTURE.into()), scope: Some(tpusim_kernel::Scope::Call), ..Default::default() },
        ]
    }

    const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tpusim/tests/data/kernel-ir/matmul.json");

    /// Chips made by overriding rates of one model hold that model once, and their lowering key
    /// once, whatever the number of combinations (a million-point sweep has 10,000); the chips
    /// themselves stay what `JobSpec::chip` gives.
    #[test]
    fn chips_with_overrides_share_their_base_and_lowering_key() {
        let ev = Evaluator::new();
        let spec = |set: &[&str]| JobSpec { set: set.iter().map(|s| (*s).to_string()).collect(), ..Default::default() };
        let specs = [spec(&["hbm.bandwidth_gb_per_s=819"]), spec(&["hbm.bandwidth_gb_per_s=2000", "fitted.valu_vreg_ops_per_cycle=4"])];
        let [a, b] = specs.each_ref().map(|s| ev.chip(s).unwrap());
        let (ba, bb) = (a.chip.provenance.compiled_for.as_ref().unwrap(), b.chip.provenance.compiled_for.as_ref().unwrap());
        assert!(Arc::ptr_eq(ba, bb), "one base model");
        assert!(Arc::ptr_eq(&a.lowering_key, &b.lowering_key), "one lowering key");
        for (s, e) in specs.iter().zip([&a, &b]) {
            assert_eq!(e.chip, s.chip().unwrap());
        }
        // A different lowering key is its own.
        let c = ev.chip(&spec(&["vmem.scoped_limit_mib=64"])).unwrap();
        assert_ne!(c.lowering_key, a.lowering_key);
    }

    /// `tpusim run`'s report of a spec without what a sweep row leaves out (step classes, notes,
    /// the MXU's fold-load share).
    fn reference(s: &JobSpec) -> Result<Report, String> {
        let chip = s.chip().map_err(|e| e.to_string())?;
        let job = s.build(&chip).map_err(|e| e.to_string())?;
        let mut r = tpusim_job::run(&chip, &job).map(|r| Report::from_run_as(&r, r.chip.identity())).map_err(|e| e.to_string())?;
        r.step_classes.clear();
        r.notes.clear();
        r.mxu_fold_load_share = None;
        for p in &mut r.phases {
            p.step_classes.clear();
        }
        Ok(r)
    }

    #[test]
    fn cached_evaluation_equals_tpusim_run() {
        let ev = Evaluator::new();
        for _ in 0..2 {
            for s in specs() {
                assert_eq!(ev.evaluate(&s).report, reference(&s), "{s:?}");
            }
        }
        assert!(!ev.dense.lock().unwrap().is_empty());
    }

    #[test]
    fn shared_lowering_equals_tpusim_run_for_each_chip() {
        let ev = Evaluator::new();
        let sets = [
            vec![],
            vec!["hbm.bandwidth_gb_per_s=3276".to_string()],
            vec!["fitted.valu_vreg_ops_per_cycle=5.4".to_string(), "device.clock_ghz=2".to_string()],
        ];
        for base in specs() {
            let group_specs: Vec<JobSpec> = sets.iter().map(|set| JobSpec { set: set.clone(), ..base.clone() }).collect();
            let prepared: Vec<Prepared> = group_specs.iter().map(|s| ev.prepare(s)).collect();
            let keys: Vec<Option<String>> = prepared.iter().map(Prepared::lowering_key).collect();
            assert!(keys.iter().all(|k| *k == keys[0]), "one lowering key for {base:?}");
            let refs: Vec<&Prepared> = prepared.iter().collect();
            let mut got = vec![None; refs.len()];
            ev.evaluate_group(&refs, &mut |i, o| got[i] = Some(o.report));
            for (s, g) in group_specs.iter().zip(got) {
                assert_eq!(g.unwrap(), reference(s), "{s:?}");
            }
        }
    }

    #[test]
    fn lowering_does_not_read_hbm_or_fitted_parameters() {
        // The contract shared lowering relies on: a kernel lowered for chips that differ only in
        // [hbm] and [fitted] is the same program.
        let a = ChipModel::preset("v6e").unwrap();
        let mut b = a.clone();
        for (k, v) in [
            ("hbm.bandwidth_gb_per_s", "100"),
            ("hbm.dma_bandwidth_gb_per_s", "50"),
            ("fitted.dma_latency_ns", "5"),
            ("device.clock_ghz", "0.5"),
            ("device.tensorcores", "2"),
            ("fitted.valu_vreg_ops_per_cycle", "9"),
            ("fitted.eup_vregs_per_cycle", "0.3"),
            ("fitted.grid_step_overhead_cycles", "5000"),
            ("ici.link_bandwidth_gb_per_s", "1"),
            ("ici.hop_latency_us", "7"),
        ] {
            b = b.with_override(k, v).unwrap();
        }
        assert_eq!(lowering_key(&a), lowering_key(&b));
        for s in specs() {
            let ja = s.build(&a).unwrap();
            let jb = s.build(&b).unwrap();
            assert_eq!(ja, jb);
            let (pa, pb) = (ja.lower(&a), jb.lower(&b));
            assert_eq!(format!("{pa:?}"), format!("{pb:?}"), "{s:?}");
        }
        let c = a.with_override("vmem.scoped_limit_mib", "16").unwrap();
        assert_ne!(lowering_key(&a), lowering_key(&c));
        let c = a.with_override("hbm.capacity_gib", "1").unwrap();
        assert_ne!(lowering_key(&a), lowering_key(&c));
    }
}
