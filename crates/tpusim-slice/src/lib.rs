//! What a slice of TPU chips adds to one kernel, shared by every front end that runs more than
//! one op on a slice (`tpusim layer`'s DiT block, `tpusim-layer`; a jitted program read from its
//! StableHLO, `tpusim-program`):
//!
//! * [`topology`]: the slice as a mesh or torus of devices from the chip model's `[ici]` section,
//!   chip groups, and collectives timed from the bytes on each link.
//! * [`mod@schedule`]: the one schedule of a slice program: TensorCore ops one at a time, collectives
//!   issued from the TensorCore and run on the ICI concurrently with compute (XLA's asynchronous
//!   collectives and its latency-hiding scheduler's early start).
//!
//! Depends on chip alone; never on the kernel crates or the engine's callers above it (job,
//! layer, program). Both slice front ends depend on it, so they time collectives and order ops by
//! one rule (their dots are the kernel crate's `xla-matmul` family,
//! `tpusim_kernel::matmul::lower_xla`).

pub mod schedule;
pub mod topology;

pub use schedule::{issue_order, schedule, Queue, Schedule, SliceOp};
pub use topology::{time_collective, time_transfers, Collective, CollectiveTiming, Torus, Transfer};

/// An error of the slice: a field (in backticks), its value and what is allowed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SliceError {
    /// A field's value is not allowed (e.g. `slice`).
    #[error("`{field}` = {value}: {allowed}")]
    Field {
        /// The field, e.g. `slice`.
        field: String,
        /// The value as given.
        value: String,
        /// What is allowed.
        allowed: String,
    },
}

impl SliceError {
    pub(crate) fn field(field: &str, value: impl ToString, allowed: impl Into<String>) -> Self {
        SliceError::Field { field: field.to_string(), value: value.to_string(), allowed: allowed.into() }
    }
}
