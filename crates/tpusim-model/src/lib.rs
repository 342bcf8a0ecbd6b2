//! The model half of tpusim: what a lowered kernel is, whichever front end lowered it.
//!
//! * [`ir`]: a grid step's body as tile operations on the units ([`StepBody`]) and a step
//!   ([`Step`]); [`Program`]: the step classes and the grid's step stream ([`StepStream`]).
//! * [`decl`]: one declaration per `pallas_call` (grid, refs, buffers, index maps), from which
//!   VMEM, ref indices and carried refs come; [`copies`]: Pallas's pipeline rule over it, the
//!   copies around each step.
//! * [`body`]: the one body builder and op-cost table: a step's ops (a kernel's IR, or the op
//!   sequence a hand-written kernel emits) become its dependency graph of tile operations.
//! * [`vmem`], [`mxu`], [`dtype`]: the rules for what VMEM holds, the MXU passes of a matmul and
//!   element types; [`expr`]: integer expressions over grid indices (index maps, conditions);
//!   [`call`]: a call's kernels and the XLA ops around them; [`listed`]: a step stream given as
//!   runs.
//!
//! The hand-written kernel families (`tpusim-kernel`) and the importer of a kernel's Mosaic IR
//! (`tpusim-pallas`) both build on this crate and not on each other. Depends on nothing in the
//! workspace: it knows no chip's numbers (the engine times what it describes).

pub mod body;
pub mod call;
pub mod copies;
pub mod decl;
pub mod dtype;
pub mod expr;
pub mod ir;
pub mod listed;
pub mod mxu;
pub mod vmem;
pub mod words;

#[doc(hidden)]
pub mod __private {
    #[cfg(feature = "clap")]
    pub use clap;
}

pub use call::{Fusion, Lowered, Part, Phase, PhaseWork};
pub use decl::{KernelDecl, RefDecl, RefRole, Space};
pub use ir::{ClassKey, DmaPath, Memo, PerUnit, Step, StepBody, StepClass, TileOp, Unit, Work};
pub use vmem::{footprint, VmemBuffer};
pub use words::WordError;

use serde::Serialize;

/// Rows of a block the kernel's code processes as one software-pipelined slab: the MXU streams
/// slab s+1 while the vector units work on slab s. An assumption about the compiler's schedule
/// (not public), fixed for every chip and workload.
pub const SLAB_ROWS: u64 = 64;

/// What kind of computation a kernel is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KernelKind {
    /// Flash attention (Splash and its descendants).
    #[default]
    Attention,
    /// A matmul, or any kernel read from its IR.
    Matmul,
    /// A data-movement fusion.
    Copy,
}

/// A VMEM buffer of a program's declaration ([`Program::pipeline`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeclaredBuffer {
    /// `window`, `scratch` or `internal` (the largest body value).
    pub role: &'static str,
    /// Its shape, elements per dimension.
    pub shape: Vec<u64>,
    /// Element type.
    pub dtype: dtype::Dtype,
    /// Buffers kept (a window's pipeline buffers; 1 otherwise).
    pub buffers: u32,
    /// Bytes of all its buffers, tile-padded ([`vmem`]).
    pub bytes: u64,
}

/// The pipeline around a program's bodies ([`Program::pipeline`]): what both front ends must
/// declare alike.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Pipeline {
    /// VMEM buffers in declaration order.
    pub vmem: Vec<DeclaredBuffer>,
    /// The distinct copy sets (index 0: none).
    pub copy_sets: Vec<copies::CopySet>,
    /// Every grid step's copy set in step order, as (steps, copy-set index) runs.
    pub steps: Vec<(u64, u32)>,
}

/// One item of a run-length step stream with head repetition ([`Program::for_each_run_block`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RunItem<'a> {
    /// A new (batch, head) begins; the runs until the next `HeadStart` belong to it.
    HeadStart,
    /// `n` consecutive steps identical to the given one but for their innermost coordinate.
    Run(&'a Step, u64),
    /// The previous head's runs repeat this many more times (for the following heads).
    RepeatHead(u64),
}

/// A program's grid as a stream of runs of identical steps, generated on demand (so memory does
/// not grow with the number of steps). Each front end implements it for its own generator: the
/// hand-written families' mask-aware generators, a kernel read from its IR as listed runs
/// ([`listed::ListedSteps`]).
pub trait StepStream: std::fmt::Debug + Send + Sync {
    /// Calls `f(step, n)` for the runs of the parallel units `lo..hi`, in execution order: `n`
    /// consecutive steps identical to `step` but for the innermost coordinate, which counts up
    /// by one per step.
    fn for_each_run_range(&self, lo: u64, hi: u64, f: &mut dyn FnMut(&Step, u64));

    /// [`StepStream::for_each_run_range`] with stretches of (batch, head) blocks that are
    /// identical but for coordinates folded ([`RunItem::RepeatHead`]); by default no folding.
    fn for_each_run_block(&self, lo: u64, hi: u64, f: &mut dyn FnMut(RunItem<'_>)) {
        self.for_each_run_range(lo, hi, &mut |s, n| f(RunItem::Run(s, n)))
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
    pub kind: KernelKind,
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
    /// The `pallas_call` it runs: grid, refs, buffers ([`decl`]).
    pub decl: std::sync::Arc<decl::KernelDecl>,
    /// The distinct sets of copies its steps make ([`Step::copies`] indexes them; [`copies`]).
    pub copies: std::sync::Arc<copies::CopySets>,
    steps: std::sync::Arc<dyn StepStream>,
}

impl Program {
    /// A program whose step stream was generated elsewhere (a kernel read from its Mosaic IR,
    /// crate `tpusim-pallas`): step classes, the runs of each parallel unit
    /// ([`listed::ListedSteps`]), the VMEM budget and the facts for reports.
    pub fn from_listed(
        classes: Vec<StepClass>,
        steps: listed::ListedSteps,
        vmem: VmemBudget,
        info: ProgramInfo,
        decl: decl::KernelDecl,
        copies: copies::CopySets,
    ) -> Self {
        let parallel_units = steps.units().max(1);
        Program::new(classes, parallel_units, vmem, info, decl, copies, steps)
    }

    /// A program whose step stream is `steps` (a hand-written family's generator), over
    /// `parallel_units` units of its grid's leading parallel dimensions.
    pub fn new(
        classes: Vec<StepClass>,
        parallel_units: u64,
        vmem: VmemBudget,
        info: ProgramInfo,
        decl: decl::KernelDecl,
        copies: copies::CopySets,
        steps: impl StepStream + 'static,
    ) -> Self {
        Program {
            classes,
            parallel_units,
            vmem,
            info,
            decl: std::sync::Arc::new(decl),
            copies: std::sync::Arc::new(copies),
            steps: std::sync::Arc::new(steps),
        }
    }

    /// Grid steps that compute: those whose body does MXU work when some step's body does (a
    /// kernel's main work: the init- or finalize-only steps of an attention kernel, a
    /// matmul's, do not count), else those whose body does any work on a unit. The same
    /// definition for every front end (one pass over the runs).
    pub fn steps_computed(&self) -> u64 {
        let matmul = |b: &StepBody| b.works().any(|(w, _)| matches!(w, Work::Matmul { .. }));
        let any_mxu = self.classes.iter().any(|c| matmul(&c.body));
        let counts: Vec<bool> = self.classes.iter().map(|c| if any_mxu { matmul(&c.body) } else { !c.body.is_empty() }).collect();
        let mut n = 0u64;
        self.for_each_run(&mut |s, k| {
            if counts.get(s.class as usize).copied().unwrap_or(false) {
                n += k;
            }
        });
        n
    }

    /// What the pipeline around the bodies is, for comparing front ends ([`Pipeline`]): the
    /// declaration's VMEM buffers in order (windows with their buffer counts, scratch, then the
    /// largest body value: the one [`vmem::footprint`] counts) and every grid step's copies,
    /// run-length coded in step order.
    pub fn pipeline(&self) -> Pipeline {
        let mut buffers = self.decl.buffers();
        let largest = buffers.iter().filter(|b| b.role == vmem::Role::Internal).map(VmemBuffer::bytes).max();
        let mut kept = false;
        buffers.retain(|b| {
            let keep = b.role != vmem::Role::Internal || (!kept && Some(b.bytes()) == largest);
            kept |= b.role == vmem::Role::Internal && keep;
            keep
        });
        let vmem = buffers
            .into_iter()
            .map(|b| {
                let (role, buffers) = match b.role {
                    vmem::Role::Window { buffers } => ("window", buffers),
                    vmem::Role::Scratch => ("scratch", 1),
                    vmem::Role::Internal => ("internal", 1),
                };
                DeclaredBuffer { role, bytes: b.bytes() * u64::from(buffers), shape: b.shape, dtype: b.dtype, buffers }
            })
            .collect();
        let mut steps: Vec<(u64, u32)> = Vec::new();
        self.for_each_run(&mut |s, n| match steps.last_mut() {
            Some((k, id)) if *id == s.copies => *k += n,
            _ => steps.push((n, s.copies)),
        });
        Pipeline { vmem, copy_sets: (0..self.copies.len() as u32).map(|i| self.copies.get(i).clone()).collect(), steps }
    }

    /// The copies around `step` ([`copies`]).
    pub fn copies_of(&self, step: &Step) -> &copies::CopySet {
        self.copies.get(step.copies)
    }

    /// Calls `f` for every grid step in execution (lexicographic grid) order. Steps are generated
    /// on the fly, so memory does not grow with the number of steps.
    pub fn for_each_step(&self, f: &mut dyn FnMut(&Step)) {
        self.for_each_run(&mut |s, n| {
            for i in 0..n {
                f(&Step { coords: [s.coords[0], s.coords[1], s.coords[2] + i as u32, s.coords[3]], ..*s });
            }
        })
    }

    /// Calls `f(step, n)` for runs of `n` consecutive grid steps that are identical but for their
    /// coordinates (same class, same copies), in execution order; `step` is the first of the
    /// run. Expanding the runs gives exactly the stream of [`Program::for_each_step`]. The engine
    /// uses runs to simulate steady states once; the number of runs grows with the number of
    /// distinct tile behaviours (rows x same-kind segments), not with the number of steps.
    pub fn for_each_run(&self, f: &mut dyn FnMut(&Step, u64)) {
        self.steps.for_each_run_range(0, u64::MAX, f)
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
        self.steps.for_each_run_block(lo, hi, f)
    }

    /// [`Program::for_each_run`] for the parallel units `lo..hi` only, with no head folding.
    pub fn for_each_run_range(&self, lo: u64, hi: u64, f: &mut dyn FnMut(&Step, u64)) {
        self.steps.for_each_run_range(lo, hi, f)
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
