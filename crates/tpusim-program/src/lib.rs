//! A whole jitted program on a slice of TPU chips: the XLA ops of a `jax.export` (read by
//! `tpusim.jax` from its StableHLO into a program description, [`desc`], schema in
//! `crates/tpusim-program/PROGRAM.md`) grouped as XLA would fuse them ([`fuse`], the fusion
//! rule), each group timed with the machinery that exists (fusions as the engine's HBM-bound
//! fusions, dots as XLA's matmuls, Pallas kernels through `tpusim-pallas`, collectives on the
//! `[ici]` link model; the dot and link models of `tpusim-slice`, which `tpusim layer` uses
//! too) and scheduled on the TensorCore and the ICI with asynchronous collectives ([`sim`], the
//! slice crate's one schedule). [`ops`] classifies ops and
//! counts FLOPs, transcendentals and bytes as XLA's `HloCostAnalysis` does, so the counts can
//! be checked against `Lowered.cost_analysis()`.
//!
//! Depends on chip, workload, kernel, engine, pallas, report and slice; only front ends (the
//! Python package) depend on it.

pub mod desc;
pub mod fuse;
pub mod ops;
pub mod sim;

pub use desc::ProgramDescription;
pub use sim::{simulate_program, Entry, ProgramReport};

/// An error of a program run: the description, an op (named with its location), the slice, or
/// a kernel that cannot run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProgramError {
    /// The description is malformed.
    #[error("program description: `{field}`: {message}")]
    Description {
        /// The field.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// An op is not modelled or malformed.
    #[error("op `{op}` at {location}: {message}")]
    Op {
        /// The op's StableHLO name.
        op: String,
        /// `file.py:LINE`.
        location: String,
        /// Why.
        message: String,
    },
    /// The slice does not fit the program.
    #[error("{0}")]
    Slice(String),
    /// A kernel (a dot's lowering) cannot run.
    #[error("{0}")]
    Kernel(String),
}
