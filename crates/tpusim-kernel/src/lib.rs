//! Kernel lowering for tpusim: a kernel and its block sizes -> a Pallas grid of tile operations.
//!
//! * [`splash`]: forward flash attention as Splash Attention and its sparse descendants run it
//!   (dense, full-grid with skipped empty steps, compacted grid; masked on every tile, on partial
//!   tiles only, or never; masks computed from iota or loaded as int8 blocks; tile alignment).
//! * [`matmul`]: a blocked Pallas matmul (the Pallas TPU matmul tutorial's kernel).
//! * [`body`]: the one body builder and op-cost table: a step's ops (a kernel's IR, or the op
//!   sequence a hand-written kernel emits) become its dependency graph of tile operations.
//!
//! The result is a [`Program`]: step classes (distinct step bodies, each a dependency graph of
//! [`ir::TileOp`]s) and a stream of [`ir::Step`]s in grid order with their DMA bytes. Lowering
//! checks the hardware's block rules and the VMEM budget against the chip model.
//!
//! Depends on `tpusim-chip` (block rules, VMEM limits) and `tpusim-workload` (shapes, masks,
//! tile classification); never on the engine or anything above it.

pub mod body;
pub mod dtype;
pub mod ir;
pub mod library;
pub mod listed;
pub mod matmul;
pub mod mxu;
pub mod options;
pub mod splash;
pub mod vmem;
pub mod words;

#[doc(hidden)]
pub mod __private {
    #[cfg(feature = "clap")]
    pub use clap;
}

pub use ir::{ClassKey, Memo, PerUnit, Step, StepBody, StepClass, TileOp, Unit, Work};
pub use library::{lower_attention, Fusion, Lowered, Part, Phase, PhaseWork};
pub use matmul::MatmulConfig;
pub use options::{Direction, Exp, InputLayout, Kernel, KernelKind, MaskSource, Masking, Scope, Traversal};
pub use splash::bwd::BwdBlocks;
pub use splash::{RunItem, SplashConfig};
pub use vmem::{footprint, VmemBuffer};
pub use words::WordError;

use serde::Serialize;

/// Rows of a block the kernel's code processes as one software-pipelined slab: the MXU streams
/// slab s+1 while the vector units work on slab s. An assumption about the compiler's schedule
/// (not public), fixed for every chip and workload.
pub const SLAB_ROWS: u64 = 64;

/// Most tiles of one head's grid (q tiles x kv tiles), or output blocks of a matmul, that a
/// program may have (2^28): classification and run generation are linear in it, and beyond it a
/// run would take minutes. Larger problems need larger blocks.
pub const MAX_TILES: u64 = 1 << 28;

/// Most rows of grid steps an attention program may need generated (2^24): heads whose step
/// streams repeat are folded, so this bounds heads that cannot be folded x q tiles; step
/// generation is linear in it.
pub const MAX_ROWS: u64 = 1 << 24;

/// What to change when a tiling overflows VMEM: smaller blocks, or a higher scoped limit when the
/// tiling fits the physical VMEM.
fn vmem_advice(needed: u64, physical_mib: f64) -> String {
    if needed as f64 > physical_mib * 1048576.0 {
        format!("use smaller blocks (it needs more than the physical VMEM, {physical_mib} MiB)")
    } else {
        format!("use smaller blocks or raise `vmem_limit_mib` (physical VMEM: {physical_mib} MiB)")
    }
}

/// An error in a kernel configuration: the field, its value and what is allowed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KernelError {
    /// A block size or option breaks the hardware's or the kernel's rules.
    #[error("{field} = {value}: {allowed}")]
    Config {
        /// Flag name, e.g. `--block-kv-compute`.
        field: String,
        /// Offending value.
        value: String,
        /// What is allowed.
        allowed: String,
    },
    /// The tiling does not fit the scoped VMEM limit.
    #[error("tiling needs {needed} bytes of VMEM ({breakdown}) but the scoped limit is {limit} bytes ({limit_mib} MiB); {}", vmem_advice(*.needed, *.physical_mib))]
    Vmem {
        /// Bytes the tiling needs.
        needed: u64,
        /// Bytes allowed.
        limit: u64,
        /// The limit in MiB.
        limit_mib: f64,
        /// Physical VMEM in MiB.
        physical_mib: f64,
        /// Per-buffer breakdown.
        breakdown: String,
    },
    /// The mask metadata Splash prefetches into SMEM does not fit.
    /// The message names the block fields in backticks (the front end renders them as flags or
    /// keys) with their values.
    #[error(
        "the mask metadata this kernel prefetches into SMEM needs {needed} bytes at `block_q` = {block_q} and `block_kv` = {block_kv} but SMEM holds {limit} bytes: use a larger `block_q` or `block_kv` (fewer grid steps)"
    )]
    Smem {
        /// Bytes needed.
        needed: u64,
        /// SMEM bytes.
        limit: u64,
        /// The tiling's q block, tokens.
        block_q: u64,
        /// The tiling's kv block, tokens.
        block_kv: u64,
    },
    /// The call's tensors do not fit the device's HBM.
    #[error("the tensors need {needed} bytes of HBM but the device holds {capacity} bytes ({capacity_gib} GiB): {advice}")]
    Hbm {
        /// Bytes needed.
        needed: u64,
        /// Device HBM, bytes.
        capacity: u64,
        /// Device HBM, GiB.
        capacity_gib: f64,
        /// What would make it fit (the largest share's field first).
        advice: String,
    },
    /// The workload itself is invalid.
    #[error(transparent)]
    Workload(#[from] tpusim_workload::WorkloadError),
    /// The mask is invalid for this workload.
    #[error(transparent)]
    Mask(#[from] tpusim_workload::MaskError),
}

impl KernelError {
    pub(crate) fn config(field: &str, value: impl ToString, allowed: impl Into<String>) -> Self {
        KernelError::Config { field: field.to_string(), value: value.to_string(), allowed: allowed.into() }
    }
}

/// VMEM a tiling needs, buffer by buffer, bytes ([`vmem::footprint`] says what is counted).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct VmemBudget {
    /// (buffer name, bytes), e.g. ("q x2", 1548288).
    pub buffers: Vec<(String, u64)>,
    /// The scoped limit checked against, bytes.
    pub limit_bytes: u64,
}

impl VmemBudget {
    /// Total bytes.
    pub fn total(&self) -> u64 {
        self.buffers.iter().map(|(_, b)| b).sum()
    }

    /// Whether the total fits the limit.
    pub fn fits(&self) -> bool {
        self.total() <= self.limit_bytes
    }

    /// Checks the budget against the limit.
    ///
    /// # Errors
    /// [`KernelError::Vmem`] with the breakdown when it does not fit.
    pub fn check(&self, chip: &tpusim_chip::ChipModel) -> Result<(), KernelError> {
        if self.total() > self.limit_bytes {
            return Err(KernelError::Vmem {
                needed: self.total(),
                limit: self.limit_bytes,
                limit_mib: self.limit_bytes as f64 / 1048576.0,
                physical_mib: chip.vmem.size_mib.value,
                breakdown: self.buffers.iter().map(|(n, b)| format!("{n} {b}")).collect::<Vec<_>>().join(", "),
            });
        }
        Ok(())
    }
}

/// Tile counts of an attention program, summed over batch and heads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct TileCounts {
    /// All tiles of the padded grid (batch x heads x q tiles x kv tiles).
    pub total: u64,
    /// Tiles whose compute runs (non-empty tiles).
    pub visited: u64,
    /// Tiles with no kept pair.
    pub empty: u64,
    /// Non-empty tiles that need the element-wise mask.
    pub partial: u64,
    /// Mask-free tiles.
    pub full: u64,
    /// Visited tiles that apply the element-wise mask (depends on `--masking`).
    pub masked: u64,
}

/// Facts about a lowered program that reports show.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ProgramInfo {
    /// Kernel name for reports (`attention forward`, `matmul`, ...).
    pub kernel: String,
    /// What the kernel computes (attention grids carry head and q / kv block coordinates,
    /// matmul grids m / n / k blocks).
    pub kind: crate::options::KernelKind,
    /// Grid dimensions as (name, extent).
    pub grid: Vec<(String, u64)>,
    /// Block sizes as (name, value).
    pub blocks: Vec<(String, u64)>,
    /// Padded lengths as (name, unpadded, padded).
    pub padded: Vec<(String, u64, u64)>,
    /// Tile counts (attention only).
    pub tiles: Option<TileCounts>,
    /// Kept (q, kv) pairs over batch and heads (attention: after tile alignment, if any).
    pub kept_pairs: u64,
    /// Pairs in visited tiles, padding included (attention).
    pub visited_pairs: u64,
    /// Kept pairs of the exact (unaligned) mask (attention).
    pub exact_kept_pairs: u64,
    /// Total grid steps.
    pub grid_steps: u64,
    /// Bytes of mask metadata prefetched into SMEM (attention).
    pub smem_bytes: u64,
}

/// A lowered kernel: step classes and the grid's step stream.
#[derive(Debug, Clone)]
pub struct Program {
    /// Distinct step bodies; [`Step::class`] indexes this.
    pub classes: Vec<StepClass>,
    /// Units of the grid's leading "parallel" dimensions (flattened, in grid order): a megacore
    /// device splits them over its TensorCores ([`Program::core_ranges`]). 1 when no dimension
    /// is parallel.
    pub parallel_units: u64,
    /// VMEM budget of the tiling.
    pub vmem: VmemBudget,
    /// Facts for reports.
    pub info: ProgramInfo,
    steps: StepSource,
}

#[derive(Debug, Clone)]
enum StepSource {
    Splash(splash::Steps),
    Columns(splash::bwd::ColumnSteps),
    Matmul(matmul::Steps),
    Listed(listed::ListedSteps),
}

impl Program {
    /// A program whose step stream was generated elsewhere (a kernel read from its Mosaic IR,
    /// crate `tpusim-pallas`): step classes, the runs of each parallel unit
    /// ([`listed::ListedSteps`]), the VMEM budget and the facts for reports.
    pub fn from_listed(classes: Vec<StepClass>, steps: listed::ListedSteps, vmem: VmemBudget, info: ProgramInfo) -> Self {
        let parallel_units = steps.units().max(1);
        Program { classes, parallel_units, vmem, info, steps: StepSource::Listed(steps) }
    }

    /// Calls `f` for every grid step in execution (lexicographic grid) order. Steps are generated
    /// on the fly, so memory does not grow with the number of steps.
    pub fn for_each_step(&self, f: &mut dyn FnMut(&Step)) {
        match &self.steps {
            StepSource::Splash(s) => s.for_each(f),
            StepSource::Columns(_) => self.for_each_run(&mut |s, n| {
                for i in 0..n {
                    f(&Step { coords: [s.coords[0], s.coords[1], s.coords[2] + i as u32, s.coords[3]], ..*s });
                }
            }),
            StepSource::Matmul(s) => s.for_each(f),
            StepSource::Listed(s) => s.for_each_run_range(0, u64::MAX, &mut |st, n| s.expand(st, n, f)),
        }
    }

    /// Calls `f(step, n)` for runs of `n` consecutive grid steps that are identical but for their
    /// coordinates (same class, same DMA bytes), in execution order; `step` is the first of the
    /// run. Expanding the runs gives exactly the stream of [`Program::for_each_step`]. The engine
    /// uses runs to simulate steady states once; the number of runs grows with the number of
    /// distinct tile behaviours (rows x same-kind segments), not with the number of steps.
    pub fn for_each_run(&self, f: &mut dyn FnMut(&Step, u64)) {
        match &self.steps {
            StepSource::Splash(s) => s.for_each_run(f),
            StepSource::Columns(s) => s.for_each_run_range(0, u64::MAX, f),
            StepSource::Matmul(s) => s.for_each_run(f),
            StepSource::Listed(s) => s.for_each_run_range(0, u64::MAX, f),
        }
    }

    /// The run stream of [`Program::for_each_run`] with whole (batch, head) blocks folded:
    /// `HeadStart` marks each emitted head, and `RepeatHead(n)` says the previous head's runs
    /// repeat `n` more times (for heads whose streams are identical but for coordinates). The
    /// cost of walking it grows with the number of distinct heads, not with batch x heads.
    pub fn for_each_run_block(&self, f: &mut dyn FnMut(RunItem<'_>)) {
        self.for_each_run_block_range(0, self.parallel_units, f)
    }

    /// [`Program::for_each_run_block`] for the parallel units `lo..hi` only (one TensorCore's
    /// share of the grid).
    pub fn for_each_run_block_range(&self, lo: u64, hi: u64, f: &mut dyn FnMut(RunItem<'_>)) {
        match &self.steps {
            StepSource::Splash(s) => s.for_each_run_block(lo, hi, f),
            StepSource::Columns(s) => s.for_each_run_block(lo, hi, f),
            StepSource::Matmul(s) => s.for_each_run_range(lo, hi, &mut |st, n| f(RunItem::Run(st, n))),
            StepSource::Listed(s) => s.for_each_run_block(lo, hi, f),
        }
    }

    /// [`Program::for_each_run`] for the parallel units `lo..hi` only, with no head folding.
    pub fn for_each_run_range(&self, lo: u64, hi: u64, f: &mut dyn FnMut(&Step, u64)) {
        match &self.steps {
            StepSource::Splash(s) => s.for_each_run_range(lo, hi, f),
            StepSource::Columns(s) => s.for_each_run_range(lo, hi, f),
            StepSource::Matmul(s) => s.for_each_run_range(lo, hi, f),
            StepSource::Listed(s) => s.for_each_run_range(lo, hi, f),
        }
    }

    /// How Mosaic splits the parallel units over `cores` TensorCores: contiguous ranges in grid
    /// order, the first cores taking one more unit when they do not divide evenly (an assumption:
    /// the split is not documented beyond "parallel dimensions are split across the cores",
    /// `docs/pallas/tpu/pipelining.md`). Empty ranges are left out.
    pub fn core_ranges(&self, cores: u32) -> Vec<(u64, u64)> {
        let n = self.parallel_units.max(1);
        let c = u64::from(cores.max(1)).min(n);
        let (q, r) = (n / c, n % c);
        let mut out = Vec::new();
        let mut lo = 0;
        for i in 0..c {
            let len = q + u64::from(i < r);
            out.push((lo, lo + len));
            lo += len;
        }
        out
    }
}
