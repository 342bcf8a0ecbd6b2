//! The job layer of tpusim: what a job is ([`JobSpec`], built into a [`Job`] for a chip), how it
//! runs end to end ([`run`]: lower, simulate, and for sparse attention the dense baseline) and
//! what it reports ([`Report`]: JSON for machines, a table for people).
//!
//! Every front end goes through this crate: the command line (`tpusim run`, `tune`, `plot`),
//! trace files, sweep points (`tpusim-sweep`), measurement rows (`tpusim-calib`) and figures
//! (`tpusim-plot`). Depends on every lower crate (chip, workload, kernel, engine); never on the
//! crates above it.

pub mod bands;
pub mod decode;
pub mod fields;
pub mod notes;
mod paths;
pub mod spec;
pub mod whatif;

pub use spec::{apply_overrides, render_fields, render_fields_with, FieldStyle, JobSpec, KernelIrValue, SpecError, DEFAULT_KERNEL};

use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use tpusim_chip::ChipModel;
use tpusim_engine::{simulate_lowered, CoreResult, PhaseResult, SimResult, UnitCycles};
use tpusim_kernel::{lower_attention, matmul, Direction, KernelError, MatmulConfig, Scope, SplashConfig};
use tpusim_model::{Lowered, Part, PerUnit, Phase, PhaseWork, Program, TileCounts, Unit};
use tpusim_pallas::{Description, IrFacts, PallasError};
use tpusim_workload::{AttentionCall, Mask, MatmulCall};

/// What to run: a kernel, its workload and its configuration; or a kernel read from its IR.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
// An attention job carries its workload and whole configuration by value: jobs are built once
// per run or sweep point and moved, so the variants' size difference costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum Job {
    /// Splash-style attention.
    Attention {
        /// The attention call.
        workload: AttentionCall,
        /// Block sizes and strategy.
        config: SplashConfig,
        /// Forward, backward or both.
        direction: Direction,
        /// The kernels alone, or every op of the library call.
        scope: Scope,
    },
    /// Blocked matmul.
    Matmul {
        /// The matmul.
        workload: MatmulCall,
        /// Block sizes.
        config: MatmulConfig,
        /// The kernel alone (`op` is the same: nothing else runs), or a host-timed call.
        scope: Scope,
    },
    /// A user's own Pallas kernel read from its TPU lowering (a kernel description,
    /// `tpusim-pallas`): its lowering fixed the workload, blocks and grid.
    Described(DescribedJob),
}

/// A kernel description as a job ([`Job::Described`]). Serialised as the file, the kernel's
/// name, metadata and device kind (the description itself is the file's).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DescribedJob {
    /// The description file as the user named it (a label: `-` for text given in memory).
    pub file: String,
    /// The kernel's name (the custom call's `kernel_name`: a label, never dispatched on).
    pub kernel_name: String,
    /// The custom call's `kernel_metadata` (a label), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_metadata: Option<String>,
    /// The device kind it was lowered for (empty when the description does not say).
    pub device_kind: String,
    /// The runtime values bound, `NAME=FILE.npy` each, as the job gave them
    /// ([`JobSpec::runtime`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub runtime: Vec<String>,
    /// The library kernel family it is, recorded or recognised ([`tpusim_pallas::family`]): a
    /// label that picks the report's error band ([`bands::band_for`]), never simulated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub family: Option<String>,
    /// The description, runtime values bound.
    #[serde(skip)]
    pub description: std::sync::Arc<Description>,
    /// The folder its side files (`.npy` tables) resolve in.
    #[serde(skip)]
    pub dir: std::path::PathBuf,
    /// What the time covers: the kernel alone, or a host-timed call (the kernel plus the chip
    /// model's `[host]` dispatch and sync, as a host timer around the jitted call measures it).
    /// The XLA ops around the kernel are not in a description, so there is no `op` scope.
    pub scope: Scope,
}

impl DescribedJob {
    /// The job of `description` read from `file`, side files resolved in `dir`.
    pub fn new(file: impl Into<String>, description: Description, dir: impl Into<std::path::PathBuf>) -> Self {
        DescribedJob {
            file: file.into(),
            kernel_name: description.kernel_name.clone(),
            kernel_metadata: description.kernel_metadata.clone(),
            device_kind: description.producer.device_kind.clone(),
            runtime: Vec::new(),
            family: tpusim_pallas::family::of(&description),
            description: std::sync::Arc::new(description),
            dir: dir.into(),
            scope: Scope::Kernel,
        }
    }

    /// The job timed at `scope` ([`DescribedJob::scope`]).
    ///
    /// # Errors
    /// `Scope::Op` (the XLA ops around a described kernel are not in its description), as what
    /// is allowed instead.
    pub fn with_scope(mut self, scope: Scope) -> Result<Self, String> {
        if scope == Scope::Op {
            return Err(
                "needs the XLA ops around the kernel, which a kernel description does not hold: use kernel, or call (the kernel plus the host's dispatch), or tpusim.jax.simulate_program for the whole program"
                    .into(),
            );
        }
        self.scope = scope;
        Ok(self)
    }

    /// Lowers the description on `chip` ([`tpusim_pallas::lower()`]) as a one-kernel call, with the
    /// facts of the lowering a report shows.
    ///
    /// # Errors
    /// Whatever the IR path reports ([`PallasError`]: names the op, kernel and location).
    pub fn lower(&self, chip: &ChipModel) -> Result<(Lowered, IrFacts), PallasError> {
        let (program, facts) = tpusim_pallas::lower(chip, &self.description, &self.dir)?;
        let lowered = Lowered {
            phases: vec![Phase { part: Part::Forward, work: PhaseWork::Kernel(std::sync::Arc::new(program)) }],
            host_calls: u32::from(self.scope == Scope::Call),
        };
        Ok((lowered, facts))
    }
}

/// Why a job does not lower: a hand model's rule ([`KernelError`]: block rules, VMEM, SMEM) or
/// the IR path's refusal of a kernel description ([`PallasError`]). Its message is the inner
/// error's.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum JobError {
    /// A hand-modelled kernel refuses the configuration.
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// The IR path refuses the kernel description.
    #[error(transparent)]
    Described(#[from] PallasError),
}

impl Job {
    /// The kernel family the job runs; `None` for a kernel read from its IR (which is no family:
    /// [`DescribedJob::kernel_name`] names it).
    pub fn kernel(&self) -> Option<tpusim_kernel::Kernel> {
        match self {
            Job::Attention { config, .. } => Some(config.kernel),
            Job::Matmul { config, .. } => Some(config.kernel),
            Job::Described(_) => None,
        }
    }

    /// Lowers the job: its phases (kernels and XLA ops) in order.
    ///
    /// # Errors
    /// Whatever lowering reports ([`JobError`]).
    pub fn lower(&self, chip: &ChipModel) -> Result<Lowered, JobError> {
        Ok(self.lower_with_facts(chip)?.0)
    }

    /// [`Job::lower`] with the facts of an IR lowering (`None` for a hand-modelled kernel).
    ///
    /// # Errors
    /// As [`Job::lower`].
    pub fn lower_with_facts(&self, chip: &ChipModel) -> Result<(Lowered, Option<IrFacts>), JobError> {
        match self {
            Job::Attention { workload, config, direction, scope } => Ok((lower_attention(chip, workload, config, *direction, *scope)?, None)),
            Job::Matmul { workload, config, scope } => Ok((
                Lowered {
                    phases: vec![Phase { part: Part::Forward, work: PhaseWork::Kernel(std::sync::Arc::new(matmul::lower(chip, workload, config)?)) }],
                    host_calls: u32::from(*scope == Scope::Call),
                },
                None,
            )),
            Job::Described(d) => {
                let (lowered, facts) = d.lower(chip)?;
                Ok((lowered, Some(facts)))
            }
        }
    }

    /// The dense baseline of a sparse attention job: the same kernel, blocks and direction with
    /// the full mask and no alignment; `None` for dense jobs.
    pub fn dense_baseline(&self) -> Option<Job> {
        match self {
            Job::Attention { workload, config, direction, scope } if !workload.mask.is_full() || config.tile_align => {
                let mut w = workload.clone();
                w.mask = Mask::Full;
                Some(Job::Attention {
                    workload: w,
                    config: SplashConfig { tile_align: false, ..config.clone() },
                    direction: *direction,
                    scope: *scope,
                })
            }
            _ => None,
        }
    }
}

/// The fields of [`Report`] a kernel read from its IR ([`Job::Described`]) has not: they describe
/// attention workloads (masks, the q x kv tiles, a dense baseline) that a kernel's IR does not
/// state. Absent from its JSON; front ends name them when asked for one.
pub const DESCRIBED_LACKS: &[&str] =
    &["pair_density", "exact_pair_density", "tile_density", "useful_fraction", "dense_latency_ms", "tile_skip_efficiency", "speedup_vs_dense"];

/// Why a [`Report`] field that its JSON leaves out when it has no value is absent, for front ends
/// asked for it by name (`report.declared_cost_estimate` in Python): `None` for any other name.
pub fn absent_field_reason(described: bool, name: &str) -> Option<&'static str> {
    match name {
        _ if described && DESCRIBED_LACKS.contains(&name) => {
            Some("a kernel read from its IR lacks it (its IR does not state an attention workload)")
        }
        "declared_cost_estimate" if described => {
            Some("the kernel declares no pl.CostEstimate (cost_estimate= of its pallas_call); cost_estimate holds the run's own totals")
        }
        "declared_cost_estimate" => Some("only a kernel read from its IR (tpusim.jax, tpusim run --kernel-ir) has it"),
        "smem_bytes" => Some("only a kernel read from its IR and a forward attention kernel (its mask metadata) have it"),
        "measured" => Some(
            "no row of traces/measured/calibration.csv is this job on this chip model (the notes say so when the job has a row on the chip as built)",
        ),
        "dense_latency_ms" | "tile_skip_efficiency" | "speedup_vs_dense" => {
            Some("only a masked attention job has a dense baseline (a full mask is its own)")
        }
        _ => None,
    }
}

/// Everything one run produced.
#[derive(Debug, Clone)]
pub struct Run {
    /// The chip simulated.
    pub chip: ChipModel,
    /// What ran.
    pub job: Job,
    /// Its phases (kernels and XLA ops).
    pub lowered: Lowered,
    /// Each phase's simulation, in order.
    pub phases: Vec<PhaseResult>,
    /// The main kernel (the first): what timelines draw (shared with `lowered`).
    pub program: std::sync::Arc<Program>,
    /// The whole call: every phase summed ([`combine`]).
    pub result: SimResult,
    /// For attention with a non-full mask: the same kernel and blocks with the full mask.
    pub dense: Option<SimResult>,
    /// For a kernel read from its IR: the facts of its lowering (steps computed, SMEM, the
    /// declared cost, the importer's assumptions, manual DMAs).
    pub facts: Option<IrFacts>,
}

/// Every phase of a lowered call simulated in order (the engine's [`simulate_lowered`]), then
/// the host's dispatch and sync when the call is host-timed ([`host_phase`]). Every front end
/// that times a lowered job goes through it.
pub fn simulate_call(chip: &ChipModel, lowered: &Lowered) -> Vec<PhaseResult> {
    let mut phases = simulate_lowered(chip, lowered);
    if lowered.host_calls > 0 {
        phases.push(host_phase(chip, lowered.host_calls));
    }
    phases
}

/// A lower bound on the latency, seconds, that [`simulate_call`] gives `lowered` (the
/// [`Report::latency_ms`] of its run, in seconds), without scheduling any kernel: each kernel
/// phase's [`tpusim_engine::cycles_lower_bound`], plus the exact time of its XLA fusions and of
/// the host's dispatch (phases run one after another, so their times add).
pub fn latency_lower_bound_s(chip: &ChipModel, lowered: &Lowered) -> f64 {
    let kernels: f64 = lowered
        .phases
        .iter()
        .map(|p| match &p.work {
            PhaseWork::Kernel(prog) => tpusim_engine::cycles_lower_bound(chip, prog) / chip.clock_hz(),
            PhaseWork::Fusion(f) => tpusim_engine::simulate_fusion(chip, f).seconds,
        })
        .sum();
    let host = if lowered.host_calls > 0 { host_phase(chip, lowered.host_calls).result.seconds } else { 0.0 };
    kernels + host
}

/// The host's dispatch and sync of `calls` jitted calls (scope `call`), as a phase of the call:
/// `calls x host.dispatch_us` of time on no unit of the device (its busy time and critical path
/// are zero; [`Report::host_ms`] names it).
pub fn host_phase(chip: &ChipModel, calls: u32) -> PhaseResult {
    let seconds = calls as f64 * chip.host_dispatch_s();
    let cycles = seconds * chip.clock_hz();
    let cores = chip.tensorcores() as usize;
    PhaseResult {
        part: Part::Host,
        name: "host dispatch and sync".into(),
        result: SimResult {
            cycles,
            seconds,
            cores: vec![CoreResult { cycles, grid_steps: 0, busy: UnitCycles::default() }; cores],
            ..SimResult::default()
        },
    }
}

/// The whole call's result from its phases, which run one after another: times, work and bytes
/// add up; the critical path is the phases' in sequence; per-core busy adds core by core.
pub fn combine(chip: &ChipModel, phases: &[PhaseResult]) -> SimResult {
    let cores = chip.tensorcores() as usize;
    let mut r = SimResult {
        cores: vec![CoreResult { cycles: 0.0, grid_steps: 0, busy: UnitCycles::default() }; cores],
        ..SimResult::default()
    };
    for p in phases {
        let x = &p.result;
        r.cycles += x.cycles;
        r.seconds += x.seconds;
        r.flops += x.flops;
        r.useful_flops += x.useful_flops;
        r.transcendentals += x.transcendentals;
        r.hbm_bytes += x.hbm_bytes;
        r.useful_hbm_bytes += x.useful_hbm_bytes;
        r.grid_steps += x.grid_steps;
        r.dma_stall_cycles += x.dma_stall_cycles;
        r.critical.add_scaled(&x.critical, 1.0);
        r.busy.add_scaled(&x.busy, 1.0);
        for (i, c) in r.cores.iter_mut().enumerate() {
            c.cycles += x.cycles;
            if let Some(pc) = x.cores.get(i) {
                c.grid_steps += pc.grid_steps;
                c.busy.add_scaled(&pc.busy, 1.0);
            }
        }
    }
    if let Some(first) = phases.iter().find(|p| !p.result.class_timing.is_empty()) {
        r.class_timing = first.result.class_timing.clone();
        r.class_steps = first.result.class_steps.clone();
    }
    r
}

/// Lowers and simulates a job; for attention with a non-full mask also simulates the dense
/// baseline (same kernel and blocks, full mask, no alignment) for `tile_skip_efficiency`.
///
/// # Errors
/// Whatever lowering reports ([`JobError`]): invalid shapes, block rules, VMEM overflow, a
/// kernel description the IR path refuses.
pub fn run(chip: &ChipModel, job: &Job) -> Result<Run, JobError> {
    // The job's own errors come first; its dense baseline is lowered only when it lowers.
    let (lowered, facts) = job.lower_with_facts(chip)?;
    let dense = match job.dense_baseline() {
        Some(d) => Some(combine(chip, &simulate_call(chip, &d.lower(chip)?))),
        None => None,
    };
    let mut run = run_lowered(chip, job, lowered, dense);
    run.facts = facts;
    Ok(run)
}

/// [`run`] with the dense baseline already simulated (sweeps cache it).
///
/// # Errors
/// As [`run`].
pub fn run_with_dense(chip: &ChipModel, job: &Job, dense: Option<SimResult>) -> Result<Run, JobError> {
    let (lowered, facts) = job.lower_with_facts(chip)?;
    let mut run = run_lowered(chip, job, lowered, dense);
    run.facts = facts;
    Ok(run)
}

/// A run of a job already lowered (sweep points that share a lowering simulate it on their own
/// chips): simulates every phase and combines them.
///
/// # Panics
/// Never for a lowering of `job` ([`Job::lower`] always yields a kernel).
pub fn run_lowered(chip: &ChipModel, job: &Job, lowered: Lowered, dense: Option<SimResult>) -> Run {
    let phases = simulate_call(chip, &lowered);
    let result = combine(chip, &phases);
    let program = lowered
        .phases
        .iter()
        .find_map(|p| match &p.work {
            PhaseWork::Kernel(k) => Some(k.clone()),
            PhaseWork::Fusion(_) => None,
        })
        .expect("every job has a kernel");
    Run { chip: chip.clone(), job: job.clone(), lowered, phases, program, result, dense, facts: None }
}

/// The metrics of one run. Serialised as the JSON output of `tpusim run --format json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// Chip model name.
    pub chip: String,
    /// Which chip model ran: its source (preset or file), the `--set` overrides and a hash of its
    /// parameter values ([`tpusim_chip::ChipIdentity`]).
    pub chip_model: tpusim_chip::ChipIdentity,
    /// The kernel family simulated; absent for a kernel read from its IR (no family: `kernel_name`
    /// names it, `job` gives its file).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel: Option<tpusim_kernel::Kernel>,
    /// The main kernel's name: the hand model's (e.g. `attention forward`) or, for a kernel read
    /// from its IR, the custom call's `kernel_name` (a label).
    pub kernel_name: String,
    /// Predicted latency, milliseconds.
    pub latency_ms: f64,
    /// How sure the prediction is: the leave-one-out error band of the calibration rows of the
    /// job's chip, kernel family, direction and scope ([`bands::band_for`]), or that none covers it.
    pub band: bands::ReportBand,
    /// Predicted latency, cycles.
    pub cycles: f64,
    /// Clock of the chip model, GHz.
    pub clock_ghz: f64,
    /// Executed matmul FLOPs: every matmul at its operands' tile-padded dimensions (a head_dim
    /// of 7 or 64 runs on the MXU as 128 lanes; `tpusim_model::copies`, the padding rule),
    /// visited tiles, sequence padding and masked-out pairs included.
    pub flops: f64,
    /// The model's FLOPs, which MFU counts: for attention the mask's kept pairs, 2 x (head_dim +
    /// head_dim_v) each forward and 6 x head_dim + 4 x head_dim_v backward (FlashAttention's
    /// count; masked pairs of visited tiles, sequence padding and recomputation left out);
    /// otherwise the matmuls at their own dimensions (2 m k n each, no lane or row padding).
    pub useful_flops: f64,
    /// Achieved useful FLOP/s ([`Report::useful_flops`]) over the chip model's bf16 peak (a
    /// kernel whose matmuls run in int8 or fp8 at a faster rate than bf16's can exceed 1).
    pub mfu: f64,
    /// Achieved useful TFLOP/s.
    pub achieved_tflops: f64,
    /// The chip model's peak bf16 TFLOP/s (count x rows x columns x passes x clock x 2).
    pub peak_tflops: f64,
    /// Executed exp / reciprocal elements (lane-replicated row values count every lane).
    pub transcendentals: f64,
    /// Bytes moved between HBM and VMEM: each copy's block (a narrow head_dim unpadded in HBM,
    /// whole tiles where a block is cut at an array's edge: the padding rule), the copies a
    /// kernel body starts at their own bytes.
    pub hbm_bytes: u64,
    /// [`Report::hbm_bytes`] counting only the elements inside the arrays (no edge tiles).
    pub useful_hbm_bytes: u64,
    /// The run's executed totals under the field names of Pallas' `pl.CostEstimate` (flops,
    /// transcendentals, bytes_accessed): what the units did, not a logical count ([`CostEstimate`]).
    pub cost_estimate: CostEstimate,
    /// Executed FLOPs per HBM byte moved ([`Report::flops`] / [`Report::hbm_bytes`]): where the
    /// run sits on the roofline.
    pub arithmetic_intensity: f64,
    /// Grid steps run.
    pub grid_steps: u64,
    /// Grid steps that compute, over every kernel of the call ([`Program::steps_computed`], one
    /// definition for every front end): in a kernel whose bodies do MXU work, the steps whose
    /// body does (not the steps that only initialize or finalize an output); in a kernel without
    /// MXU work, the steps whose body does any work on a unit. The rest only pay the step
    /// overhead and their copies, or set up or write out what the computing steps accumulate.
    pub steps_computed: u64,
    /// The unit that bounds the run ([`whatif::bottleneck_of`]): the one whose 2x speed-up gains
    /// the most when that gain is large (10% or more) and untied; otherwise the unit with the
    /// largest critical-path share (of the tied units, when gains tie). A report built without
    /// the what-if table ([`Report::from_run_as`], as sweeps without `--what-if-2x` do) names the
    /// unit with the largest critical-path share ([`SimResult::bottleneck`]).
    pub bottleneck: Unit,
    /// Other units whose 2x gain ties with the bottleneck's ([`whatif`]: at least 80% of the
    /// largest and above 1%, the largest 10% or more); empty without the what-if table.
    pub co_bound: Vec<Unit>,
    /// Of the MXU's busy time, the share spent in matmuls whose weight folds take longer to
    /// load than their rows take to stream through them (`tpusim_engine::body::matmul_parts`:
    /// a fold of `rows x columns` weights loads in `rows` cycles; a matmul of fewer rows than
    /// that per fold waits on loads). Such matmuls gain nothing from a faster row rate; more
    /// rows per fold (a larger block_q, or m) amortise each load. `None` without MXU work, and
    /// in a sweep's rows ([`Report::row_of`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mxu_fold_load_share: Option<f64>,
    /// Which rule named the bottleneck (`gain`, `tied`, `critical_path`); `None` without the
    /// what-if table (the critical-path rule then).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bound_rule: Option<whatif::BoundRule>,
    /// Per unit, what it buys to make it alone twice as fast, re-timing this run's lowering
    /// ([`whatif::what_if_2x`]); `None` when not computed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub what_if_2x: Option<Vec<whatif::WhatIf>>,
    /// Busy fraction of the run per unit (mxu, vpu, eup, xlu, hbm, step_control).
    pub utilization: PerUnit<f64>,
    /// Busy time per unit, milliseconds.
    pub busy_ms: PerUnit<f64>,
    /// Time step bodies waited for input DMAs beyond the step overhead, milliseconds.
    pub dma_stall_ms: f64,
    /// The critical path split by unit, milliseconds (sums to `latency_ms` - `host_ms`): which unit the run
    /// was waiting on, by throughput or by latency. `bottleneck` is its largest entry.
    pub critical_path_ms: PerUnit<f64>,
    /// What ran: workload and kernel configuration.
    pub job: Job,
    /// Grid dimensions.
    pub grid: Vec<(String, u64)>,
    /// Unpadded and padded lengths: (name, unpadded, padded).
    pub padded: Vec<(String, u64, u64)>,
    /// VMEM the tiling needs, bytes.
    pub vmem_bytes: u64,
    /// Scoped VMEM limit checked against, bytes.
    pub vmem_limit_bytes: u64,
    /// VMEM of the main kernel by buffer: (name, bytes), tile-padded.
    pub vmem_buffers: Vec<(String, u64)>,
    /// SMEM for prefetch tables and SMEM buffers, bytes: a kernel read from its IR, or a forward
    /// attention kernel's mask metadata (Splash's data_next, mask_next and block masks; 0 for a
    /// mask that needs none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub smem_bytes: Option<u64>,
    /// The `pl.CostEstimate` a kernel read from its IR declares, if any (to compare with
    /// `cost_estimate`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub declared_cost_estimate: Option<tpusim_pallas::desc::DeclaredCost>,
    /// Tile counts over batch and heads (attention).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tiles: Option<TileCounts>,
    /// Kept pairs / (batch x heads x q_len x kv_len) (attention).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pair_density: Option<f64>,
    /// Kept pairs of the exact mask over the same total, before tile alignment (attention).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exact_pair_density: Option<f64>,
    /// Non-empty tiles / total tiles (attention).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tile_density: Option<f64>,
    /// Kept pairs / pairs in visited tiles, padding included (attention).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub useful_fraction: Option<f64>,
    /// Latency of the same kernel and blocks with the full mask, ms (sparse attention).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dense_latency_ms: Option<f64>,
    /// (dense latency x tile_density) / latency: 1.0 when skipped tiles cost nothing and visited
    /// tiles cost no more than dense ones (sparse attention).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tile_skip_efficiency: Option<f64>,
    /// Dense latency / latency (sparse attention).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speedup_vs_dense: Option<f64>,
    /// Time in the Pallas kernels, milliseconds.
    pub kernel_ms: f64,
    /// Time in the XLA ops outside the kernels (the library's transposes, scalings and
    /// reductions, the backward's precompute), milliseconds.
    pub outside_kernel_ms: f64,
    /// The host's dispatch and sync of the call, milliseconds (scope `call`; the chip model's
    /// `[host]`): part of `latency_ms`, on no unit of the device, so outside the critical path.
    pub host_ms: f64,
    /// Each phase of the call in order: kernels, XLA ops and (scope `call`) the host's dispatch.
    pub phases: Vec<PhaseSummary>,
    /// Per TensorCore of the device: busy time per unit, milliseconds (megacore devices split the
    /// kernels' parallel grid dimensions over their cores).
    pub cores: Vec<CoreSummary>,
    /// Each distinct step body of the main kernel: what it is, how many steps ran it, and its
    /// scheduled cycles.
    pub step_classes: Vec<ClassSummary>,
    /// The modelling assumptions the IR path made for a kernel read from its IR (empty for the
    /// hand models, whose assumptions are their documentation).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub assumptions: Vec<String>,
    /// Caveats a kernel engineer should know about this configuration (inexact results, ...).
    /// Settings appear as `` `field=value` ``, which a front end renders as its user gave them
    /// ([`Report::render_notes`]).
    pub notes: Vec<String>,
    /// A published measurement of this very job on this chip model, when the shipped
    /// measurements hold one (filled in by the front ends from `tpusim-calib`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured: Option<Measured>,
}

/// A measured time of the job a report ran: a row of `traces/measured/calibration.csv` whose job
/// resolves to the same job on the same, unmodified chip model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Measured {
    /// The row's id, e.g. `VD-B0`.
    pub id: String,
    /// The measured time, milliseconds.
    pub measured_ms: f64,
    /// (predicted - measured) / measured.
    pub error: f64,
    /// How it was timed (the row's `timing`).
    pub timing: String,
    /// Where the measurement was published (the row's `source`).
    pub source: String,
    /// The file the row is in.
    pub file: String,
}

/// Rewrites every `` `field=value` `` setting in `text` with `name(field, value)`; other
/// backticked words are left alone.
pub fn render_settings(text: &str, name: &mut dyn FnMut(&str, &str) -> String) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('`') {
        let Some(close) = rest[open + 1..].find('`') else { break };
        let word = &rest[open + 1..open + 1 + close];
        out.push_str(&rest[..open]);
        match word.split_once('=') {
            Some((f, v)) if JobSpec::fields().iter().any(|x| x == f) => out.push_str(&name(f, v)),
            _ => out.push_str(&rest[open..open + close + 2]),
        }
        rest = &rest[open + close + 2..];
    }
    out.push_str(rest);
    out
}

/// The options of an attention job that its kernel family's library has no setting for (design
/// what-ifs, each as `name value (the family runs ...)`): [`tpusim_kernel::Kernel::what_ifs`],
/// and a mask computed in the kernel that the family can only load. Empty for a configuration
/// the library runs as it is, and for other jobs. A report says so in a note; `tpusim tune`
/// marks such configurations with `*`; a sweep names them in its `design_whatif` column.
pub fn design_what_ifs(job: &Job) -> Vec<String> {
    let Job::Attention { workload: w, config: c, .. } = job else { return Vec::new() };
    let mut v = c.kernel.what_ifs(c.traversal, c.masking, c.mask_source, c.exp, w.mask.is_full());
    if c.mask_source == tpusim_kernel::MaskSource::Computed
        && !tpusim_kernel::splash::computable(&w.mask)
        && !w.mask.expression_terms().loaded_only
        && !v.iter().any(|x| x.starts_with("mask_source"))
    {
        v.push(format!("mask_source computed ({} computes only a single causal, local, band or chunked mask and loads any other)", c.kernel));
    }
    v
}

/// Whether `spec` gives no job field: nothing but `chip` and `set` (the hardware).
pub fn gives_no_job(spec: &JobSpec) -> bool {
    spec.set_fields().keys().all(|k| k == "chip" || k == "set") && spec.mask_value.is_none() && spec.kernel_ir_value.is_none() && !spec.no_fused_bwd
}

/// The built-in case study's job: what `traces/video-720p-dense.toml` runs (row VD-B0 of the
/// shipped measurements: JAX's Splash at MaxDiffusion's v6e blocks on the 720p video layer).
pub fn case_study() -> JobSpec {
    JobSpec::from_toml_str(CASE_STUDY_TOML, CASE_STUDY_PATH).expect("the shipped case-study trace is valid")
}

/// The case study's trace file, as the repository names it.
pub const CASE_STUDY_PATH: &str = "traces/video-720p-dense.toml";
const CASE_STUDY_TOML: &str = include_str!("../../../traces/video-720p-dense.toml");

/// `spec` itself, or, when it gives no job field at all (only `chip` and `set`, which choose the
/// hardware), the built-in case study ([`case_study`]) on that hardware: the first run of a new
/// user is the case study, not the families' 128-block defaults. The one default job of every
/// front end (`tpusim run`, `tune`, `plot`; Python's `simulate`, `tune`), described by
/// [`default_job_text`].
pub fn case_study_or(spec: JobSpec) -> JobSpec {
    if gives_no_job(&spec) {
        case_study().overlay(&spec)
    } else {
        spec
    }
}

/// An attention call's useful (model) FLOPs per kept score pair in `direction`: 2 x (head_dim +
/// head_dim_v) forward (q.k and p.v) and 6 x head_dim + 4 x head_dim_v backward (s recomputed,
/// dp, dv, dq, dk), FlashAttention's count (backward 2.5x the forward at equal dims); both for a
/// training step. What MFU counts, for a run ([`Report::useful_flops`]) and a layer's attention.
pub fn model_flops_per_pair(call: &AttentionCall, direction: Direction) -> f64 {
    let (dq, dv) = (call.head_dim as f64, call.head_dim_v as f64);
    let (fwd, bwd) = (2.0 * (dq + dv), 6.0 * dq + 4.0 * dv);
    match direction {
        Direction::Fwd => fwd,
        Direction::Bwd => bwd,
        Direction::FwdBwd => fwd + bwd,
    }
}

/// A note for an attention job whose block sizes nobody gave, built from job fields (not the
/// case study: [`case_study_or`] runs that when no job field is given): a job field starts from
/// the kernel family's defaults, so `tpusim run --heads 10` (or `tpusim.simulate(heads=10)`)
/// runs tokamax's Splash at its 128-wide blocks where the case study ran JAX's Splash at
/// 3024/2048/1024; `tune` with the same fields finds better blocks. Job fields are named as
/// `style` names them; `None` for the case study, a kernel read from its IR, a job given blocks
/// and any job but attention.
pub fn family_defaults_note(spec: &JobSpec, job: &Job, style: FieldStyle) -> Option<String> {
    let Job::Attention { config: c, .. } = job else { return None };
    if gives_no_job(spec) || spec.kernel_ir.is_some() || spec.block_q.is_some() || spec.block_kv.is_some() {
        return None;
    }
    let (what, tune) = match style {
        FieldStyle::Flag => ("a job flag", "`tpusim tune` with the same flags"),
        FieldStyle::Key => ("a job field", "tune with the same fields"),
    };
    let family = if spec.kernel.is_some() { format!("`kernel` {}", c.kernel) } else { format!("{} (the default `kernel`)", c.kernel) };
    let case = case_study();
    let text = format!(
        "{what} starts from the kernel family's defaults, not from the built-in case study: this ran {family} at its default blocks {}/{}/{} (no `block_q` or `block_kv` given); {tune} searches for better blocks (with no job field the case study runs: `kernel` {} at {}/{}/{})",
        c.block_q,
        c.block_kv,
        c.block_kv_compute,
        case.kernel(),
        case.block_q.unwrap_or_default(),
        case.block_kv.unwrap_or_default(),
        case.block_kv_compute.unwrap_or_default()
    );
    Some(render_fields(&text, style))
}

/// The job `tune` searches when given no job field: the default job ([`case_study_or`]) with its
/// block sizes left to the search (its workload, kernel family and options kept).
pub fn tune_default_or(spec: JobSpec) -> JobSpec {
    if gives_no_job(&spec) {
        JobSpec { block_q: None, block_kv: None, block_kv_compute: None, ..case_study_or(spec) }
    } else {
        spec
    }
}

/// The job `tune` compares its ranking with when given no job field: the default job at its own
/// blocks ([`case_study_or`]), while [`tune_default_or`] leaves them to the search; `None` when
/// `spec` gives a job (the ranking then compares with that job).
pub fn tune_baseline(spec: &JobSpec) -> Option<JobSpec> {
    gives_no_job(spec).then(|| case_study_or(spec.clone()))
}

/// The default job in words, from [`case_study`]'s fields (so the help text cannot drift from
/// what runs): "the built-in case study (traces/video-720p-dense.toml): 1 x 10 heads x 75600
/// tokens, head_dim 128, mask full, on v6e with JAX's Splash attention (--kernel splash) at block_q 3024,
/// block_kv 2048, block_kv_compute 1024; any job flag starts from the kernel family's defaults
/// instead (--chip, --set and output flags do not count)".
pub fn default_job_text() -> String {
    let c = case_study();
    let kernel = c.kernel();
    let n = |v: Option<u64>| v.map_or_else(|| "?".into(), |v| v.to_string());
    format!(
        "the built-in case study ({CASE_STUDY_PATH}): {} x {} heads x {} tokens, head_dim {}, mask {}, on {} with {} (--kernel {}) at block_q {}, block_kv {}, block_kv_compute {}; any job flag starts from the kernel family's defaults instead (--chip, --set and output flags do not count)",
        n(c.batch),
        n(c.heads),
        n(c.seq_len),
        n(c.head_dim),
        c.mask.as_deref().unwrap_or("full"),
        c.chip.as_deref().unwrap_or("v6e"),
        kernel.help().split(" (").next().unwrap_or(kernel.word()),
        kernel.word(),
        n(c.block_q),
        n(c.block_kv),
        n(c.block_kv_compute),
    )
}

/// A run's totals named as the fields of Pallas' `pl.CostEstimate` (`jax.experimental.pallas`),
/// which a kernel passes to `pallas_call(cost_estimate=...)` for XLA's scheduler. Splash in
/// tokamax (`splash_attention_kernel.py`, `_fwd_cost_estimate`) declares
/// `flops = heads x q_len x kv_len x 2 (d + dv) x mask density`, `transcendentals = heads x q_len
/// x kv_len x mask density` and `bytes_accessed` = the bytes of its inputs and outputs; these are
/// what the simulated run executed and moved, which differ from a logical count (XLA's
/// `cost_analysis()`) where the hardware does more or other work: `flops` are the MXU's (every
/// pass of an f32 `HIGHEST` matmul, padding included; element-wise work is not counted), and
/// `transcendentals` the EUP's elements per lane (a per-row value held lane-replicated in a
/// (rows, 128) register counts 128 times; a divide's reciprocal counts).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CostEstimate {
    /// Executed matmul FLOPs (visited tiles, padding included): [`Report::flops`].
    pub flops: u64,
    /// Executed exp / reciprocal elements: [`Report::transcendentals`].
    pub transcendentals: u64,
    /// Bytes moved between HBM and VMEM (with Pallas' copy elision): [`Report::hbm_bytes`].
    pub bytes_accessed: u64,
}

/// One phase of a call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PhaseSummary {
    /// Which part of the call (forward, di, dq, dkv, fused backward, outside the kernels).
    pub part: Part,
    /// The kernel's or XLA op's name.
    pub name: String,
    /// Whether it is a Pallas kernel (else an XLA op).
    pub kernel: bool,
    /// Time, milliseconds.
    pub latency_ms: f64,
    /// Matmul FLOPs executed.
    pub flops: f64,
    /// Transcendental (EUP) element operations executed.
    pub transcendentals: f64,
    /// Bytes moved between HBM and VMEM.
    pub hbm_bytes: u64,
    /// Grid steps.
    pub grid_steps: u64,
    /// Bounding unit.
    pub bottleneck: Unit,
    /// Tile counts of a kernel's grid (attention kernels).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tiles: Option<TileCounts>,
    /// A kernel's distinct step bodies that ran ([`ClassSummary`]); empty for an XLA op.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub step_classes: Vec<ClassSummary>,
}

/// One TensorCore's share of a call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CoreSummary {
    /// Grid steps it ran.
    pub grid_steps: u64,
    /// Busy time per unit, milliseconds.
    pub busy_ms: PerUnit<f64>,
}

/// One distinct grid-step body of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassSummary {
    /// Tile kind (`empty`, `partial`, `full`).
    pub tile: String,
    /// Whether the element-wise mask is applied.
    pub masked: bool,
    /// First step of an output block.
    pub first: bool,
    /// Last step of an output block.
    pub last: bool,
    /// Steps that ran this body.
    pub steps: u64,
    /// Cycles of one body, first issue to last result (grid-step overhead and DMA waits excluded).
    pub body_cycles: f64,
    /// Busy cycles of one body per compute unit (mxu, vpu, eup, xlu).
    pub busy_cycles: BTreeMap<Unit, f64>,
    /// Tile operations of the body.
    pub ops: usize,
    /// The body's signature (hex, [`tpusim_model::StepBody::signature`]): equal signatures,
    /// equal bodies, whichever front end built them (the agreement suite compares them).
    pub signature: String,
}

/// The summaries of a program's step classes that ran (`steps > 0`), in class order; `label`
/// names a class's tile kind and whether it masks.
pub(crate) fn class_summaries(program: &Program, r: &SimResult, label: &dyn Fn(&tpusim_model::StepClass) -> (String, bool)) -> Vec<ClassSummary> {
    program
        .classes
        .iter()
        .zip(&r.class_timing)
        .zip(&r.class_steps)
        .filter(|(_, &n)| n > 0)
        .map(|((c, t), &n)| {
            let (tile, masked) = label(c);
            ClassSummary {
                tile,
                masked,
                first: c.key.first,
                last: c.key.last,
                steps: n,
                body_cycles: t.cycles,
                busy_cycles: Unit::COMPUTE.iter().map(|&u| (u, t.busy[u])).collect(),
                ops: c.body.graph.node_count(),
                signature: format!("{:016x}", c.body.signature()),
            }
        })
        .collect()
}

/// HBM bytes for people: GB to three decimals from 1 MB up, else kB or bytes (a small kernel's
/// traffic is never shown as 0.000 GB).
fn traffic(bytes: u64) -> String {
    match bytes {
        b if b >= 1_000_000 => format!("{:.3} GB", b as f64 / 1e9),
        b if b >= 1_000 => format!("{:.1} kB", b as f64 / 1e3),
        b => format!("{b} bytes"),
    }
}

impl Report {
    /// Summarises a run.
    pub fn from_run(run: &Run) -> Self {
        Self::from_run_as(run, run.chip.identity()).with_what_if(run)
    }

    /// This report (of `run`) with its what-if table ([`whatif::what_if_2x`]: one re-timing per
    /// unit) and the bottleneck and co-bound units it gives.
    pub fn with_what_if(mut self, run: &Run) -> Self {
        let table = whatif::what_if_2x(run);
        let (b, co, rule) = whatif::bottleneck_of(&table, &self.critical_path_ms, self.bottleneck);
        self.bottleneck = b;
        self.co_bound = co;
        self.bound_rule = Some(rule);
        self.what_if_2x = Some(table);
        self
    }

    /// [`Report::from_run`] with the chip model's identity already known (a sweep names each of
    /// its chip models once, not once per point).
    pub fn from_run_as(run: &Run, identity: tpusim_chip::ChipIdentity) -> Self {
        Self::summarise(run, identity, true)
    }

    /// [`Report::from_run_as`] without the parts a sweep's row never shows: the step-class
    /// summaries (each body's signature hashes every operation), the notes and
    /// [`Report::mxu_fold_load_share`]. Every other metric is the same.
    pub fn row_of(run: &Run, identity: tpusim_chip::ChipIdentity) -> Self {
        Self::summarise(run, identity, false)
    }

    fn summarise(run: &Run, identity: tpusim_chip::ChipIdentity, detail: bool) -> Self {
        let r = &run.result;
        let chip = &run.chip;
        let ms = |c: f64| c / chip.clock_hz() * 1e3;
        let seconds = r.seconds.max(f64::MIN_POSITIVE);
        let info = &run.program.info;
        let facts = run.facts.as_ref();
        // The simulated phases follow the lowered ones; a host phase (scope call) comes last.
        let phases: Vec<PhaseSummary> = run
            .phases
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let l = run.lowered.phases.get(i);
                PhaseSummary {
                    part: p.part,
                    name: p.name.clone(),
                    kernel: l.is_some_and(|l| matches!(l.work, PhaseWork::Kernel(_))),
                    latency_ms: p.result.seconds * 1e3,
                    flops: p.result.flops,
                    transcendentals: p.result.transcendentals,
                    hbm_bytes: p.result.hbm_bytes,
                    grid_steps: p.result.grid_steps,
                    bottleneck: p.result.bottleneck(),
                    tiles: l.and_then(|l| match &l.work {
                        PhaseWork::Kernel(k) => k.info.tiles,
                        PhaseWork::Fusion(_) => None,
                    }),
                    step_classes: match l.map(|l| &l.work) {
                        // A one-phase run's classes are the report's own (not repeated here).
                        Some(PhaseWork::Kernel(k)) if detail && run.lowered.phases.len() > 1 => {
                            class_summaries(k, &p.result, &|c| (c.key.tile.to_string(), c.key.masked))
                        }
                        _ => Vec::new(),
                    },
                }
            })
            .collect();
        let kernel_ms: f64 = phases.iter().filter(|p| p.kernel).map(|p| p.latency_ms).fold(0.0, |a, b| a + b);
        let host_ms: f64 = phases.iter().filter(|p| p.part == Part::Host).map(|p| p.latency_ms).fold(0.0, |a, b| a + b);
        let outside_kernel_ms: f64 =
            phases.iter().filter(|p| !p.kernel && p.part != Part::Host).map(|p| p.latency_ms).fold(0.0, |a, b| a + b);
        let mut rep = Report {
            chip: chip.name.clone(),
            chip_model: identity,
            kernel: run.job.kernel(),
            kernel_name: info.kernel.clone(),
            latency_ms: r.seconds * 1e3,
            band: bands::band_for(chip, &run.job),
            cycles: r.cycles,
            clock_ghz: chip.device.clock_ghz.value,
            flops: r.flops,
            useful_flops: r.useful_flops,
            mfu: r.useful_flops / seconds / chip.peak_flops(),
            achieved_tflops: r.useful_flops / seconds / 1e12,
            peak_tflops: chip.peak_flops() / 1e12,
            transcendentals: r.transcendentals,
            hbm_bytes: r.hbm_bytes,
            useful_hbm_bytes: r.useful_hbm_bytes,
            cost_estimate: CostEstimate {
                flops: r.flops.round() as u64,
                transcendentals: r.transcendentals.round() as u64,
                bytes_accessed: r.hbm_bytes,
            },
            arithmetic_intensity: if r.hbm_bytes > 0 { r.flops / r.hbm_bytes as f64 } else { 0.0 },
            grid_steps: r.grid_steps,
            steps_computed: run
                .lowered
                .phases
                .iter()
                .map(|l| match &l.work {
                    PhaseWork::Kernel(k) => k.steps_computed(),
                    PhaseWork::Fusion(_) => 0,
                })
                .sum(),
            bottleneck: r.bottleneck(),
            co_bound: Vec::new(),
            // Walks every class body's works: for the report's text, not a sweep's row.
            mxu_fold_load_share: if detail { mxu_fold_load_share(run) } else { None },
            bound_rule: None,
            what_if_2x: None,
            utilization: r.utilization(),
            busy_ms: PerUnit(r.busy.0.map(ms)),
            dma_stall_ms: ms(r.dma_stall_cycles),
            critical_path_ms: PerUnit(r.critical.0.map(ms)),
            job: run.job.clone(),
            grid: info.grid.clone(),
            padded: info.padded.clone(),
            vmem_bytes: run.program.vmem.total(),
            vmem_limit_bytes: run.program.vmem.limit_bytes,
            vmem_buffers: run.program.vmem.buffers.clone(),
            // A forward attention kernel's mask metadata (its scalar prefetch), else a kernel
            // read from its IR.
            smem_bytes: match (facts, &run.job) {
                (Some(f), _) => Some(f.smem_bytes),
                (None, Job::Attention { direction: Direction::Fwd, .. }) => Some(info.smem_bytes),
                _ => None,
            },
            declared_cost_estimate: facts.and_then(|f| f.declared_cost),
            tiles: info.tiles,
            pair_density: None,
            exact_pair_density: None,
            tile_density: None,
            useful_fraction: None,
            dense_latency_ms: None,
            tile_skip_efficiency: None,
            speedup_vs_dense: None,
            kernel_ms,
            outside_kernel_ms,
            host_ms,
            phases,
            cores: r.cores.iter().map(|c| CoreSummary { grid_steps: c.grid_steps, busy_ms: PerUnit(c.busy.0.map(ms)) }).collect(),
            step_classes: match facts {
                _ if !detail => Vec::new(),
                // The IR path's classes are paths through the body, not tile kinds.
                Some(_) => class_summaries(&run.program, r, &|c| (if c.body.is_empty() { "skipped".into() } else { "computed".into() }, false)),
                None => class_summaries(&run.program, r, &|c| (c.key.tile.to_string(), c.key.masked)),
            },
            assumptions: facts.map(|f| f.assumptions.clone()).unwrap_or_default(),
            notes: Vec::new(),
            measured: None,
        };
        if let Job::Attention { config: c, direction, .. } = &run.job {
            if *direction != Direction::Fwd {
                rep.notes.extend(backward_block_notes(c));
            }
        }
        // A DMA rate above the HBM peak is capped by it (ChipModel::dma_bytes_per_cycle).
        let (dma, peak) = (run.chip.hbm.dma_bandwidth_gb_per_s.value, run.chip.hbm.bandwidth_gb_per_s.value);
        if dma > peak {
            rep.notes.push(format!(
                "hbm.dma_bandwidth_gb_per_s = {dma} is above hbm.bandwidth_gb_per_s = {peak}: copies run at the HBM peak, {peak} GB/s (raise hbm.bandwidth_gb_per_s, which scales the DMA rate with it)"
            ));
        }
        if let (Job::Attention { workload: w, config: c, .. }, Some(t)) = (&run.job, info.tiles) {
            rep.notes.extend(w.mask.notes());
            if c.masking == tpusim_kernel::Masking::None && t.partial > 0 {
                rep.notes.push(format!(
                    "`masking=none` with {} partial tiles: a mask-free kernel treats them as full, so the pairs the mask drops in them are wrongly attended (results are inexact)",
                    t.partial
                ));
            }
            // The padding rule, stated where it applies (a head_dim off the 128-lane tile).
            let lanes = tpusim_model::vmem::LANES;
            let mut odd: Vec<(&str, u64)> =
                [("head_dim", w.head_dim), ("head_dim_v", w.head_dim_v)].into_iter().filter(|(_, d)| !d.is_multiple_of(lanes)).collect();
            if w.head_dim == w.head_dim_v {
                odd.truncate(1);
            }
            if !odd.is_empty() {
                let what: Vec<String> = odd.iter().map(|(n, d)| format!("{n} {d} as {} lanes", d.next_multiple_of(lanes))).collect();
                rep.notes.push(format!(
                    "on chip each operand is padded to {lanes}-lane tiles, so the MXU, VPU and VMEM run {} (the executed FLOPs count the padding, the useful ones do not); HBM copies move the operands' own lanes per row, the named assumption (XLA chooses the HBM layout; tpusim_model::copies states the rule)",
                    what.join(" and ")
                ));
            }
            // (Not for a family that masks every computed block as it is: JAX's Splash.)
            if c.masking == tpusim_kernel::Masking::All
                && c.kernel.defaults().masking != tpusim_kernel::Masking::All
                && matches!(w.mask, tpusim_workload::Mask::Full)
            {
                rep.notes.push(format!(
                    "`masking=all` with a full mask: there is no mask to evaluate, so only the {} tiles holding sequence padding apply one (as partial masking does)",
                    t.masked
                ));
            }
            if c.mask_source == tpusim_kernel::MaskSource::Computed
                && !tpusim_kernel::splash::computable(&w.mask)
                && !w.mask.expression_terms().loaded_only
            {
                rep.notes.push(format!(
                    "`mask_source=computed` with mask {}: a what-if; Splash computes only a single causal, local, band or chunked mask in the kernel and loads any other as int8 blocks, so {} cannot run this configuration (tpusim tune searches only loaded blocks for it)",
                    w.mask, c.kernel
                ));
            }
            let what_ifs = c.kernel.what_ifs(c.traversal, c.masking, c.mask_source, c.exp, w.mask.is_full());
            if !what_ifs.is_empty() {
                rep.notes.push(format!(
                    "a design what-if: {} has no setting for {}; tpusim times the kernel as if it had one (tpusim tune marks such configurations with *)",
                    c.kernel,
                    what_ifs.join(", ")
                ));
            }
            if c.tile_align {
                rep.notes.push(format!(
                    "`tile_align=true` changes the attention output: {:.2}% of pairs kept vs {:.2}% in the exact mask",
                    100.0 * info.kept_pairs as f64 / ((w.batch * w.q_heads) as f64 * w.q_len as f64 * w.kv_len as f64),
                    100.0 * info.exact_kept_pairs as f64 / ((w.batch * w.q_heads) as f64 * w.q_len as f64 * w.kv_len as f64)
                ));
            }
            let all = (w.batch * w.q_heads) as f64 * w.q_len as f64 * w.kv_len as f64;
            rep.pair_density = Some(info.kept_pairs as f64 / all);
            rep.exact_pair_density = Some(info.exact_kept_pairs as f64 / all);
            let td = if t.total > 0 { t.visited as f64 / t.total as f64 } else { 0.0 };
            rep.tile_density = Some(td);
            rep.useful_fraction = Some(if info.visited_pairs > 0 { info.kept_pairs as f64 / info.visited_pairs as f64 } else { 0.0 });
            // Useful (model) FLOPs of attention: the mask's kept pairs ([`model_flops_per_pair`]).
            // Masked pairs of visited tiles, sequence padding and recomputation are executed, not
            // useful: MFU ranks configurations as their latency does.
            if let Job::Attention { direction, .. } = &run.job {
                rep.useful_flops = info.kept_pairs as f64 * model_flops_per_pair(w, *direction);
            }
            rep.mfu = rep.useful_flops / seconds / chip.peak_flops();
            rep.achieved_tflops = rep.useful_flops / seconds / 1e12;
            if let Some(d) = &run.dense {
                rep.dense_latency_ms = Some(d.seconds * 1e3);
                rep.tile_skip_efficiency = Some(d.seconds * td / seconds);
                rep.speedup_vs_dense = Some(d.seconds / seconds);
            }
        }
        // Results a user would question, with the mechanism behind them (crate::notes).
        if detail {
            let fill = notes::measure_mxu(run);
            let explained: Vec<String> =
                [notes::mxu_fill(run, &fill), notes::eight_bit_peak(run, &fill), notes::short_steps(run, &rep), notes::unfitted_parameters(run, &rep)].into_iter().flatten().collect();
            rep.notes.extend(explained);
        } else {
            rep.notes.clear();
        }
        rep
    }

    /// Renders the settings its notes name (`` `masking=none` ``, [`render_settings`]) with
    /// `name(field, value)`: as the user gave them, or as a family's default.
    pub fn render_notes(&mut self, name: &mut dyn FnMut(&str, &str) -> String) {
        for n in &mut self.notes {
            *n = render_settings(n, name);
        }
    }

    /// JSON, one object.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report serialises")
    }

    /// A table for people.
    pub fn to_table(&self) -> String {
        let mut s = String::new();
        let mib = |b: u64| b as f64 / 1048576.0;
        match &self.job {
            Job::Attention { workload: w, config: c, direction, scope } => {
                let _ = writeln!(s, "tpusim: {} attention ({direction}, scope {scope}) on {}", c.kernel, self.chip);
                let _ = writeln!(
                    s,
                    "  workload     batch {}, heads {} (kv heads {}), q_len {}, kv_len {}, head_dim {}/{}, mask {}",
                    w.batch, w.q_heads, w.kv_heads, w.q_len, w.kv_len, w.head_dim, w.head_dim_v, w.mask
                );
                let _ = writeln!(
                    s,
                    "  kernel       block_q {}, block_kv {}, block_kv_compute {}; traversal {}, masking {}, mask source {}{}",
                    c.block_q,
                    c.block_kv,
                    c.block_kv_compute,
                    c.traversal,
                    c.masking,
                    c.mask_source,
                    if c.tile_align { ", tile-aligned mask" } else { "" }
                );
                // The backward runs at its own blocks (`--block-q-dkv`, ...), not the forward's.
                if *direction != Direction::Fwd {
                    let b = &c.bwd;
                    let dkv = format!(
                        "block_q_dkv {}, block_kv_dkv {}, block_kv_dkv_compute {}",
                        b.block_q_dkv, b.block_kv_dkv, b.block_kv_dkv_compute
                    );
                    if b.fused {
                        let _ = writeln!(s, "  backward     fused dq/dk/dv kernel: {dkv}");
                    } else {
                        let _ = writeln!(
                            s,
                            "  backward     dkv kernel: {dkv}; dq kernel: block_q_dq {}, block_kv_dq {}",
                            b.block_q_dq, b.block_kv_dq
                        );
                    }
                }
            }
            Job::Matmul { workload: m, config: c, .. } => {
                let _ = writeln!(s, "tpusim: {} matmul on {}", c.kernel, self.chip);
                let _ = writeln!(s, "  workload     M {} x N {} x K {} bf16", m.m, m.n, m.k);
                let _ = writeln!(s, "  kernel       block_m {}, block_n {}, block_k {}", c.block_m, c.block_n, c.block_k);
            }
            Job::Described(d) => {
                let _ = writeln!(s, "tpusim: Pallas kernel `{}` from its Mosaic IR on {}", d.kernel_name, self.chip);
                let _ = writeln!(s, "  description  {}", d.file);
                if !d.device_kind.is_empty() {
                    let _ = writeln!(s, "  lowered for  {}", d.device_kind);
                }
            }
        }
        let _ = writeln!(s, "  chip model   {}", self.chip_model);
        if !self.padded.is_empty() {
            let pads: Vec<String> =
                self.padded.iter().map(|(n, a, b)| if a == b { format!("{n} {a}") } else { format!("{n} {a} padded to {b}") }).collect();
            // Attention's lengths: the Splash kernels take whole blocks (JAX's mask info refuses
            // a length its block does not divide), so the caller pads the sequence and masks the
            // padding with segment ids, as the case study's kernels run (MaxDiffusion pads 75,600
            // tokens to whole blocks).
            let by_caller = self.tiles.is_some() && self.padded.iter().any(|(_, a, b)| a != b);
            let why = if by_caller { " (by the caller, to whole blocks: the kernel takes no partial block; the padding is masked with segment ids)" } else { "" };
            let _ = writeln!(s, "  lengths      {}{why}", pads.join(", "));
        }
        let grid: Vec<String> = self.grid.iter().map(|(n, v)| format!("{v} {n}")).collect();
        let computed = match self.steps_computed {
            n if n >= self.grid_steps => String::new(),
            // A kernel that only moves data (its copies are the pipeline's): no step runs work
            // on the MXU, VPU, EUP or XLU, which is not every step skipped.
            0 => ", none with work on the MXU, VPU, EUP or XLU (data movement only)".to_string(),
            n => format!(", {n} computed (the others only copy, skip, or set up or write out an output)"),
        };
        let grid = if grid.is_empty() { "(no grid)".to_string() } else { grid.join(" x ") };
        let steps = if self.grid_steps == 1 { "grid step" } else { "grid steps" };
        // A call of several kernels (a forward and its backward): the grid shown is the first
        // kernel's, and the steps are every kernel's, each named.
        let kernels: Vec<&PhaseSummary> = self.phases.iter().filter(|p| p.kernel && p.grid_steps > 0).collect();
        if kernels.len() > 1 {
            let each: Vec<String> = kernels.iter().map(|p| format!("{} {}", p.part.label(), p.grid_steps)).collect();
            let _ = writeln!(
                s,
                "  grid         {grid} (the {} kernel's); {} {steps} over its {} kernels ({}){computed}",
                kernels[0].part.label(),
                self.grid_steps,
                kernels.len(),
                each.join(", ")
            );
        } else {
            let _ = writeln!(s, "  grid         {grid} -> {} {steps}{computed}", self.grid_steps);
        }
        let _ = writeln!(s, "  VMEM         {:.1} MiB of the {:.1} MiB scoped limit", mib(self.vmem_bytes), mib(self.vmem_limit_bytes));
        let _ = writeln!(s);
        // Four significant digits below 0.1 ms (a small kernel printed 0.001 ms).
        let digits = if self.latency_ms > 0.0 && self.latency_ms < 0.1 { (3.0 - self.latency_ms.log10().floor()) as usize } else { 3 };
        let _ = writeln!(s, "  latency      {:.digits$} ms  ({:.4e} cycles at {} GHz)", self.latency_ms, self.cycles, self.clock_ghz);
        if let Some(m) = &self.measured {
            let _ = writeln!(
                s,
                "  measured     {:.2} ms  (row {} of {}: {}; {}): prediction {:+.1}%",
                m.measured_ms,
                m.id,
                m.file,
                m.timing,
                m.source,
                100.0 * m.error
            );
        }
        let _ = writeln!(
            s,
            "  band         {}{}",
            self.band.text,
            if self.band.covered { " (leave-one-out |error| over the calibration rows)" } else { "" }
        );
        // Executed and useful apart where they differ: tile padding (a head_dim below 128) and,
        // for attention, the masked pairs of visited tiles, sequence padding and recomputation.
        let waste = if self.pair_density.is_some() { "masked pairs, padding or recomputation" } else { "tile padding" };
        let useful = |executed: f64, useful: f64, what: String, waste: &str| {
            if executed > useful * (1.0 + 1e-9) {
                format!(" ({what} useful, {:.1}% of it {waste})", 100.0 * (1.0 - useful / executed))
            } else {
                String::new()
            }
        };
        let _ = writeln!(
            s,
            "  compute      {:.3e} FLOP executed{}, {:.1} TFLOP/s = {:.1}% MFU (peak {:.0} TFLOP/s)",
            self.flops,
            useful(self.flops, self.useful_flops, format!("{:.3e}", self.useful_flops), waste),
            self.achieved_tflops,
            self.mfu * 100.0,
            self.peak_tflops
        );
        let _ = writeln!(
            s,
            "  memory       {} HBM traffic{}, arithmetic intensity {:.0} FLOP/byte",
            traffic(self.hbm_bytes),
            useful(self.hbm_bytes as f64, self.useful_hbm_bytes as f64, traffic(self.useful_hbm_bytes), "tile padding"),
            self.arithmetic_intensity
        );
        let _ = writeln!(
            s,
            "  executed     pl.CostEstimate(flops={}, transcendentals={}, bytes_accessed={}) (MXU FLOPs, EUP elements per lane, HBM bytes)",
            self.cost_estimate.flops, self.cost_estimate.transcendentals, self.cost_estimate.bytes_accessed
        );
        if let Some(d) = self.declared_cost_estimate {
            let _ = writeln!(
                s,
                "  declared     pl.CostEstimate(flops={}, transcendentals={}, bytes_accessed={})",
                d.flops, d.transcendentals, d.bytes_accessed
            );
        }
        write_bound_by(
            &mut s,
            &BoundBy {
                bottleneck: self.bottleneck,
                co_bound: &self.co_bound,
                rule: self.bound_rule,
                what_if_2x: self.what_if_2x.as_deref(),
                utilization: &self.utilization,
                critical_path_ms: &self.critical_path_ms,
                latency_ms: self.latency_ms,
                mxu_fold_load_share: self.mxu_fold_load_share,
            },
        );
        // Microseconds for a run under 0.1 ms (its cells all read 0.000 in ms).
        let (scale, per) = if self.latency_ms < 0.1 { (1e3, "us") } else { (1.0, "ms") };
        let _ = writeln!(s, "  unit           busy {per}  busy %  critical path {per}");
        for n in Unit::ALL {
            let (b, u, c) = (self.busy_ms[*n] * scale, self.utilization[*n], self.critical_path_ms[*n] * scale);
            let _ = writeln!(s, "    {:<12} {:>9.3}  {:>6.1}  {:>9.3}  {}", n.word(), b, u * 100.0, c, bar(u));
        }
        if self.cores.len() > 1 {
            let _ = writeln!(
                s,
                "  (busy ms: the {} TensorCores' sum; busy %: of {} x the run; critical path: the slowest core's)",
                self.cores.len(),
                self.cores.len()
            );
        }
        if self.phases.len() > 1 {
            let _ = writeln!(s);
            let _ = writeln!(
                s,
                "  phases       {:.3} ms in the kernels, {:.3} ms in XLA ops outside them{}",
                self.kernel_ms,
                self.outside_kernel_ms,
                if self.host_ms > 0.0 { format!(", {:.3} ms host dispatch and sync", self.host_ms) } else { String::new() }
            );
            for p in &self.phases {
                let tiles =
                    p.tiles.map(|t| format!(", tiles {} visited of {} ({} partial)", t.visited, t.total, t.partial)).unwrap_or_default();
                let _ = writeln!(
                    s,
                    "    {:<20} {:>9.3} ms  {:<44} {}{tiles}",
                    p.part.label(),
                    p.latency_ms,
                    p.name,
                    if p.kernel {
                        format!("{} steps, bound by {}", p.grid_steps, p.bottleneck)
                    } else if p.part == Part::Host {
                        "host".to_string()
                    } else {
                        format!("{:.3} GB", p.hbm_bytes as f64 / 1e9)
                    }
                );
            }
        }
        if self.cores.len() > 1 {
            let _ = writeln!(s);
            for (i, c) in self.cores.iter().enumerate() {
                let busy: Vec<String> = Unit::COMPUTE.iter().map(|&u| format!("{} {:.3}", u, c.busy_ms[u])).collect();
                let _ = writeln!(s, "  core {i}       {} grid steps; busy ms: {}", c.grid_steps, busy.join(", "));
            }
        }
        // A kernel read from its IR counts grid steps as tiles: the grid line says it all.
        if let Some(t) = self.tiles.filter(|_| !matches!(self.job, Job::Described(_))) {
            let _ = writeln!(s);
            let pct = |a: u64, b: u64| {
                if b > 0 {
                    100.0 * a as f64 / b as f64
                } else {
                    0.0
                }
            };
            // With several kernels (forward and backward), these are the first one's; the
            // phase lines above give each kernel's.
            let mut tiled = self.phases.iter().filter(|p| p.tiles.is_some());
            let whose = match (tiled.next(), tiled.next()) {
                (Some(first), Some(_)) => format!(" (the {} kernel's; the phases above give each kernel's)", first.part.label()),
                _ => String::new(),
            };
            let _ = writeln!(
                s,
                "  tiles        {} total: {} empty, {} partial, {} full; {} visited ({:.1}%), {} masked{whose}",
                t.total,
                t.empty,
                t.partial,
                t.full,
                t.visited,
                pct(t.visited, t.total),
                t.masked
            );
            let _ = writeln!(s, "               partial = {:.1}% of visited tiles", pct(t.partial, t.visited));
            if let (Some(pd), Some(uf)) = (self.pair_density, self.useful_fraction) {
                let _ = writeln!(
                    s,
                    "  density      pairs {:.1}% (exact mask {:.1}%), tiles {:.1}%, useful fraction of visited pairs {:.1}%",
                    pd * 100.0,
                    self.exact_pair_density.unwrap_or(pd) * 100.0,
                    self.tile_density.unwrap_or(0.0) * 100.0,
                    uf * 100.0
                );
            }
            if let (Some(d), Some(e), Some(x)) = (self.dense_latency_ms, self.tile_skip_efficiency, self.speedup_vs_dense) {
                let _ = writeln!(
                    s,
                    "  vs dense     dense {:.3} ms with the same kernel and blocks: speedup {:.2}x, tile-skip efficiency {:.2}",
                    d, x, e
                );
            }
        }
        for a in &self.assumptions {
            let _ = writeln!(s, "  assumes      {a}");
        }
        for n in &self.notes {
            let _ = writeln!(s, "  note         {n}");
        }
        s
    }
}

/// Where a backward run's blocks came from, for each backward kernel whose blocks the job did not
/// give: the family's backward defaults, or the forward's blocks (the library's rule,
/// [`tpusim_kernel::options::BwdRule`]).
fn backward_block_notes(c: &SplashConfig) -> Vec<String> {
    use tpusim_kernel::options::BwdRule;
    use tpusim_kernel::splash::bwd::BlockOrigin;
    let b = &c.bwd;
    let why = |o: BlockOrigin| match (o, c.kernel.defaults().bwd_rule) {
        (BlockOrigin::Given, _) => None,
        (BlockOrigin::Forward, _) => Some(format!("the forward's blocks, as {} derives backward blocks it is not given", c.kernel)),
        (BlockOrigin::FamilyDefault, BwdRule::OwnDefaults) => Some(format!("{}'s backward default, whatever the forward's blocks", c.kernel)),
        (BlockOrigin::FamilyDefault, _) => Some(format!("{}'s default block sizes", c.kernel)),
    };
    let mut notes = Vec::new();
    let kernel = if b.fused { "fused dq/dk/dv" } else { "dkv" };
    if let Some(w) = why(b.origin.dkv) {
        notes.push(format!(
            "backward blocks not given: the {kernel} kernel runs at block_q_dkv {}, block_kv_dkv {}, block_kv_dkv_compute {} ({w}); give --block-q-dkv --block-kv-dkv --block-kv-dkv-compute to choose",
            b.block_q_dkv, b.block_kv_dkv, b.block_kv_dkv_compute
        ));
    }
    if !b.fused {
        if let Some(w) = why(b.origin.dq) {
            notes.push(format!(
                "backward blocks not given: the dq kernel runs at block_q_dq {}, block_kv_dq {} ({w}); give --block-q-dq --block-kv-dq to choose",
                b.block_q_dq, b.block_kv_dq
            ));
        }
    }
    notes
}

pub(crate) fn bar(u: f64) -> String {
    "#".repeat((u.clamp(0.0, 1.0) * 30.0).round() as usize)
}

/// What the "bound by" line of a report reads.
pub(crate) struct BoundBy<'a> {
    pub bottleneck: Unit,
    pub co_bound: &'a [Unit],
    pub rule: Option<whatif::BoundRule>,
    pub what_if_2x: Option<&'a [whatif::WhatIf]>,
    pub utilization: &'a PerUnit<f64>,
    pub critical_path_ms: &'a PerUnit<f64>,
    pub latency_ms: f64,
    pub mxu_fold_load_share: Option<f64>,
}

/// The [`Report::mxu_fold_load_share`] from which the MXU's weight-fold loads, not its result
/// latency, are said to bound an MXU-bound run (the run report's and the decode report's words).
pub(crate) const FOLD_LOADS_BOUND: f64 = 0.5;

/// [`Report::mxu_fold_load_share`] of a run: its kernels' matmuls, each class's works times the
/// steps that ran it, split by which bound of `matmul_parts` sets their occupancy.
fn mxu_fold_load_share(run: &Run) -> Option<f64> {
    let (mut total, mut load_bound) = (0.0f64, 0.0f64);
    for (l, p) in run.lowered.phases.iter().zip(&run.phases) {
        let PhaseWork::Kernel(k) = &l.work else { continue };
        for (class, &steps) in k.classes.iter().zip(&p.result.class_steps) {
            if steps == 0 {
                continue;
            }
            for (w, n) in class.body.works() {
                if let tpusim_model::Work::Matmul { m, k, n: cols, m_total, mxu_type } = w {
                    let (stream, load) = tpusim_engine::body::matmul_parts(&run.chip, k, cols, m_total, mxu_type);
                    let occ = stream.max(load) * m as f64 / m_total.max(1) as f64 * f64::from(n) * steps as f64;
                    total += occ;
                    if load > stream {
                        load_bound += occ;
                    }
                }
            }
        }
    }
    (total > 0.0).then(|| load_bound / total)
}

/// The busy fraction (of a unit's critical-path share, or of the run) at which a unit counts as
/// bound by its throughput, not its latency.
const THROUGHPUT_BUSY: f64 = 0.95;

/// Writes the "bound by" line (and, with a what-if table, the "what if 2x" line) to `s`: the
/// bottleneck with the rule that named it ([`whatif::bottleneck_of`]), its critical-path share
/// and busy time, and the figures a kernel engineer checks against a profile.
pub(crate) fn write_bound_by(s: &mut String, b: &BoundBy<'_>) {
    let share = |u: Unit| if b.latency_ms > 0.0 { 100.0 * b.critical_path_ms[u] / b.latency_ms } else { 0.0 };
    let crit = b.critical_path_ms[b.bottleneck];
    let busy = b.utilization[b.bottleneck];
    // Throughput-bound when the unit is busy for nearly all of its critical-path share (idle at
    // most 5% of it: the pipeline's first copy latency and last write-back on an HBM-bound run):
    // it could not finish sooner without more throughput; latency-bound otherwise.
    let how = if busy * b.latency_ms >= THROUGHPUT_BUSY * crit { "throughput" } else { "latency" };
    let unit = b.bottleneck;
    let (sh, bz) = (share(unit), busy * 100.0);
    // The other units busier than a few percent, busiest first: what overlaps the bottleneck.
    let mut others: Vec<Unit> = Unit::ALL.iter().copied().filter(|&u| u != unit && b.utilization[u] >= 0.05).collect();
    others.sort_by(|&x, &y| b.utilization[y].total_cmp(&b.utilization[x]));
    let overlapping = |n: usize| -> String {
        let cells: Vec<String> = others.iter().take(n).map(|&u| format!("{u} busy {:.0}%", 100.0 * b.utilization[u])).collect();
        if cells.is_empty() {
            String::new()
        } else {
            format!("; overlapping it: {}", cells.join(", "))
        }
    };
    match (b.what_if_2x, b.rule) {
        (Some(table), Some(rule)) => {
            let gain = |u: &str| table.iter().find(|w| w.unit == u).map_or(0.0, |w| w.gain);
            let is_unit = |w: &&whatif::WhatIf| Unit::ALL.iter().any(|u| u.word() == w.unit);
            let largest = table.iter().filter(is_unit).max_by(|x, y| x.gain.total_cmp(&y.gain));
            // The step and DMA mechanism that saves most, when it saves more than any unit: the
            // copies' round trip (latency, issue, slots), not a unit's rate, bounds the run.
            let mechanism = table
                .iter()
                .filter(|w| whatif::MECHANISMS.contains(&w.unit.as_str()) && w.gain >= whatif::CO_BOUND_MIN_GAIN)
                .max_by(|x, y| x.gain.total_cmp(&y.gain))
                .filter(|m| m.gain > largest.map_or(0.0, |w| w.gain));
            let round_trip = mechanism.map_or(String::new(), |m| {
                let what = match m.unit.as_str() {
                    "dma_latency" => "the DMA latency its steps cannot hide (fitted.dma_latency_ns halved)",
                    "dma_issue" => "the scalar core's DMA issues (fitted.dma_issue_ns halved)",
                    _ => "the DMAs in flight at once (fitted.dmas_in_flight doubled)",
                };
                format!("; its copies' round trips bound it more than any unit: {what} saves {:.1}%", 100.0 * m.gain)
            });
            // When a copy mechanism saves more, the unit's gain is the largest of a unit only.
            let largest_word = if mechanism.is_some() { "the largest of any unit" } else { "the largest gain" };
            let co: Vec<String> = b.co_bound.iter().map(|u| format!("{u} -{:.1}%, {:.0}% of the critical path", 100.0 * gain(u.word()), share(*u))).collect();
            let line = match rule {
                whatif::BoundRule::Gain => format!(
                    "{unit} (2x faster: -{:.1}% latency, {largest_word}; {how}: {sh:.0}% of the critical path, busy {bz:.0}% of the run)",
                    100.0 * gain(unit.word())
                ),
                whatif::BoundRule::Tied => format!(
                    "{unit} ({sh:.0}% of the critical path, busy {bz:.0}%; 2x faster: -{:.1}%, tied with {}: speeding one alone leaves the other)",
                    100.0 * gain(unit.word()),
                    co.join("; ")
                ),
                // Busy nearly all the run, yet no faster unit saves 1%: two bounds at nearly one
                // time, this unit's rate and the step's dependency chain behind it.
                whatif::BoundRule::CriticalPath if whatif::latency_bound(table) && bz >= 100.0 * THROUGHPUT_BUSY => format!(
                    "{unit} (busy {bz:.0}% of the run, {sh:.0}% of the critical path, yet twice as fast it saves only {:.1}%: the steps' dependency chain through the units in turn bounds the run at nearly the same time, so speeding {unit} alone leaves it; more independent work per step (smaller blocks) shortens the chain)",
                    100.0 * gain(unit.word())
                ),
                whatif::BoundRule::CriticalPath if whatif::latency_bound(table) => format!(
                    "{unit} (latency: no unit twice as fast saves 1% or more; the critical path waits on {unit} for {sh:.0}% of the run, busy {bz:.0}%)"
                ),
                whatif::BoundRule::CriticalPath => format!(
                    "{unit} ({sh:.0}% of the critical path, busy {bz:.0}% of the run{}; no unit twice as fast saves {:.0}%: {} is {} -{:.1}%)",
                    overlapping(3),
                    100.0 * whatif::DECISIVE_GAIN,
                    largest_word,
                    largest.map_or("none", |w| w.unit.as_str()),
                    100.0 * largest.map_or(0.0, |w| w.gain)
                ),
            };
            // An MXU that bounds the run but gains nothing from twice its row rate: say which part
            // of its work does bound it.
            let mxu_part = match b.mxu_fold_load_share {
                Some(f) if unit == Unit::Mxu && gain("mxu") < whatif::CO_BOUND_MIN_GAIN && f >= FOLD_LOADS_BOUND => format!(
                    "; the MXU's weight-fold loads bound it, not its row rate: {:.0}% of its busy time is matmuls whose folds take longer to load than their rows take to stream (more rows per fold, a larger block_q or m, amortise each load)",
                    100.0 * f
                ),
                Some(_) if unit == Unit::Mxu && gain("mxu") < whatif::CO_BOUND_MIN_GAIN => {
                    "; the MXU's result latency bounds it, not its row rate: the body waits on each matmul's result before the next step of its chain (more independent work per step hides it)".to_string()
                }
                _ => String::new(),
            };
            let _ = writeln!(s, "  bound by     {line}{mxu_part}{round_trip}");
            // An MXU that bounds the run but gains nothing from twice its row rate is bound by
            // what the what-if leaves alone (module `whatif`): say so beside the figure.
            let cells: Vec<String> = table
                .iter()
                .map(|w| {
                    let why = if w.unit == "mxu" && unit == Unit::Mxu && w.gain < whatif::CO_BOUND_MIN_GAIN {
                        " (twice the row rate; its fold loads and result latency unchanged)"
                    } else {
                        ""
                    };
                    // A run made slower by a faster unit (the DMA engines' sharing: module
                    // `whatif`) shows its latency added, not a double minus.
                    if w.gain < -0.0005 {
                        format!("{} +{:.1}% (slower: a write-back issued sooner shares the DMA engines with the next inputs)", w.unit, -100.0 * w.gain)
                    } else {
                        format!("{} -{:.1}%{why}", w.unit, 100.0 * w.gain.max(0.0))
                    }
                })
                .collect();
            let _ = writeln!(s, "  what if 2x   {} (latency saved with one unit or DMA mechanism twice as fast, same schedule)", cells.join(", "));
        }
        _ => {
            // A busier unit whose work overlaps the bottleneck's does not bound the run; say so,
            // so that the label and the busy column do not read as a contradiction.
            let busier = match others.first() {
                Some(&u) if b.utilization[u] > busy + 0.005 => {
                    format!("; {u} is busier ({:.0}% of the run) but overlaps it, {:.0}% of the critical path", 100.0 * b.utilization[u], share(u))
                }
                _ => String::new(),
            };
            let _ = writeln!(s, "  bound by     {unit} ({how}: {sh:.0}% of the critical path, busy {bz:.0}% of the run{busier})");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run no unit twice as fast speeds up by 1% is called latency-bound, naming the unit its
    /// critical path waits on.
    #[test]
    fn tiny_gains_read_as_latency_bound() {
        let table: Vec<whatif::WhatIf> = Unit::ALL
            .iter()
            .map(|u| whatif::WhatIf { unit: u.word().into(), set: Vec::new(), latency_ms: 1.0, gain: if *u == Unit::Xlu { 0.004 } else { 0.0 } })
            .collect();
        let critical = PerUnit([0.1, 0.0, 0.0, 0.8, 0.05, 0.05]);
        let (b, co, rule) = whatif::bottleneck_of(&table, &critical, Unit::Mxu);
        assert_eq!((b, co.len(), rule), (Unit::Xlu, 0, whatif::BoundRule::CriticalPath));
        assert!(whatif::latency_bound(&table));
        let mut s = String::new();
        let busy = PerUnit([0.5, 0.1, 0.1, 0.8, 0.0, 0.05]);
        write_bound_by(
            &mut s,
            &BoundBy {
                bottleneck: b,
                co_bound: &co,
                rule: Some(rule),
                what_if_2x: Some(&table),
                utilization: &busy,
                critical_path_ms: &critical,
                latency_ms: 1.0,
                mxu_fold_load_share: None,
            },
        );
        assert!(s.contains("bound by     xlu (latency: no unit twice as fast saves 1% or more; the critical path waits on xlu for 80% of the run"), "{s}");
    }

    #[test]
    fn sparse_report_has_dense_baseline_and_metrics() {
        let chip = ChipModel::preset("v6e").unwrap();
        let mut w = AttentionCall::video_default();
        w.q_len = 16384;
        w.kv_len = 16384;
        w.mask = Mask::Causal { offset: 0 };
        let mut config = SplashConfig::with_blocks(2048, 2048, None);
        config.traversal = tpusim_kernel::Traversal::Compact;
        config.masking = tpusim_kernel::Masking::Partial;
        let run = run(&chip, &Job::Attention { workload: w, config, direction: Direction::Fwd, scope: Scope::Kernel }).unwrap();
        let rep = Report::from_run(&run);
        let t = rep.tiles.unwrap();
        assert_eq!(t.visited, 10 * 36);
        assert!(rep.dense_latency_ms.unwrap() > rep.latency_ms);
        let json: serde_json::Value = serde_json::from_str(&rep.to_json()).unwrap();
        for k in ["latency_ms", "cycles", "flops", "mfu", "hbm_bytes", "grid_steps", "bottleneck", "utilization", "tiles"] {
            assert!(json.get(k).is_some(), "{k}");
        }
        assert!(rep.to_table().contains("partial"));
    }

    /// Steps computed are the grid steps whose body does MXU work ([`Program::steps_computed`]):
    /// JAX's causal Splash forward on its full grid steps over its empty tiles, and the one that
    /// ends a q row finalizes its output (work on the VPU and EUP, no matmul), yet only the
    /// visited tiles compute.
    #[test]
    fn steps_computed_leaves_out_steps_that_only_finalize() {
        let chip = ChipModel::preset("v6e").unwrap();
        let mut w = AttentionCall::video_default();
        (w.q_len, w.kv_len, w.q_heads, w.kv_heads) = (4096, 4096, 1, 1);
        w.mask = Mask::Causal { offset: 0 };
        let kernel = tpusim_kernel::Kernel::Splash;
        let config = SplashConfig { block_q: 512, block_kv: 512, block_kv_compute: 512, traversal: tpusim_kernel::Traversal::FullGrid, ..SplashConfig::for_family(kernel) };
        let r = run(&chip, &Job::Attention { workload: w, config, direction: Direction::Fwd, scope: Scope::Kernel }).unwrap();
        let rep = Report::from_run(&r);
        let t = rep.tiles.unwrap();
        assert!(rep.grid_steps > t.visited, "{} steps, {} visited", rep.grid_steps, t.visited);
        assert_eq!(rep.steps_computed, t.visited);
        let matmul = |c: &tpusim_model::StepClass| c.body.works().any(|(w, _)| matches!(w, tpusim_model::Work::Matmul { .. }));
        let finalize_only = r.program.classes.iter().zip(&r.phases[0].result.class_steps).any(|(c, &n)| n > 0 && !c.body.is_empty() && !matmul(c));
        assert!(finalize_only, "some step works without a matmul");
    }

    /// A backward run's table gives the blocks the backward kernels ran at, which are not the
    /// forward's (tokamax's backward defaults to 128 blocks whatever the forward's are).
    #[test]
    fn backward_tables_give_the_backward_blocks() {
        let chip = ChipModel::preset("v6e").unwrap();
        let mut w = AttentionCall::video_default();
        w.q_len = 4096;
        w.kv_len = 4096;
        w.q_heads = 1;
        w.kv_heads = 1;
        let mut config = SplashConfig::with_blocks(1024, 1024, None);
        config.bwd.block_q_dkv = 512;
        config.bwd.block_kv_dkv = 256;
        config.bwd.block_kv_dkv_compute = 256;
        for (direction, backward) in [(Direction::Fwd, false), (Direction::Bwd, true), (Direction::FwdBwd, true)] {
            let job = Job::Attention { workload: w.clone(), config: config.clone(), direction, scope: Scope::Kernel };
            let t = Report::from_run(&run(&chip, &job).unwrap()).to_table();
            let line = t.lines().find(|l| l.trim_start().starts_with("backward "));
            assert_eq!(line.is_some(), backward, "{direction}: {t}");
            if let Some(line) = line {
                assert!(line.contains("block_q_dkv 512, block_kv_dkv 256, block_kv_dkv_compute 256"), "{line}");
            }
        }
    }
}
