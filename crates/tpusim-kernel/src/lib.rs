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

pub mod library;
pub mod matmul;
pub mod options;
pub mod splash;

// The model half this crate builds on (crate `tpusim-model`), under the paths the families use.
use tpusim_model::{body, dtype, ir, vmem, word_enum};
use tpusim_model::{Program, ProgramInfo, TileCounts, VmemBudget};

pub use library::{lower_attention, Fusion, Lowered, Part, Phase, PhaseWork};
pub use matmul::MatmulConfig;
pub use options::{Direction, Exp, InputLayout, Kernel, Masking, MaskSource, Scope, Traversal};
pub use splash::bwd::BwdBlocks;
pub use splash::SplashConfig;

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

/// Checks a VMEM budget against its limit.
///
/// # Errors
/// [`KernelError::Vmem`] with the breakdown when it does not fit.
pub fn check_vmem(budget: &VmemBudget, chip: &tpusim_chip::ChipModel) -> Result<(), KernelError> {
    if budget.total() > budget.limit_bytes {
        return Err(KernelError::Vmem {
            needed: budget.total(),
            limit: budget.limit_bytes,
            limit_mib: budget.limit_bytes as f64 / 1048576.0,
            physical_mib: chip.vmem.size_mib.value,
            breakdown: budget.buffers.iter().map(|(n, b)| format!("{n} {b}")).collect::<Vec<_>>().join(", "),
        });
    }
    Ok(())
}
