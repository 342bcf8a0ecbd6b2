//! Pallas kernels from their TPU lowering: the **kernel description** (a JSON file that
//! `tpusim.jax` writes from a kernel's Mosaic IR; format and version rule in
//! `crates/tpusim-pallas/DESCRIPTION.md`), read and checked ([`desc`]), with its index maps and
//! branch conditions as expressions over grid indices and prefetch values ([`expr`]), lowered to
//! the same [`tpusim_model::Program`] the hand-written lowerings produce ([`lower()`]): the
//! kernel's `pallas_call` as a declaration ([`tpusim_model::decl`]) whose windows Pallas's
//! copy rule ([`tpusim_model::copies`]) copies, and each step's path through the body fed op by
//! op to the one body builder and op-cost table ([`tpusim_model::body`]), which the
//! hand-written kernels (crate `tpusim-kernel`) go through too.
//!
//! `kernel_name`, `kernel_metadata` and `family` are labels: nothing in the simulation dispatches
//! on them (a family picks the error band a report quotes, [`family`]). Depends on chip and
//! model; never on the hand-written families, the engine or above.

pub mod desc;
pub use tpusim_model::expr;
pub mod family;
pub mod lower;
mod npy;
pub mod runtime;

pub use desc::{Description, FORMAT, VERSION};
pub use lower::{lower, IrFacts};

/// An error reading or lowering a kernel description: names the field or the kernel and the
/// location, the value and what is allowed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PallasError {
    /// The file cannot be read.
    #[error("{path}: {message}")]
    Io {
        /// File.
        path: String,
        /// Why.
        message: String,
    },
    /// Malformed JSON or a field this version does not know.
    #[error("{path}: not a valid kernel description: {message}")]
    Json {
        /// File.
        path: String,
        /// The parser's message.
        message: String,
    },
    /// A description of another format version.
    #[error("{path}: kernel description version {found}; this tpusim reads version {VERSION}: describe the kernel again with this tpusim's `tpusim.jax.describe`")]
    Version {
        /// File.
        path: String,
        /// The version found.
        found: String,
    },
    /// A field with a value that is not allowed.
    #[error("{field} = {value}: {allowed}")]
    Field {
        /// The field.
        field: String,
        /// Its value.
        value: String,
        /// What is allowed.
        allowed: String,
    },
    /// Something about the kernel itself (an unknown op, a branch on a runtime value, ...).
    #[error("kernel `{kernel}`: {message}")]
    Kernel {
        /// The kernel's name.
        kernel: String,
        /// What and where.
        message: String,
    },
}

impl PallasError {
    pub(crate) fn field(field: &str, value: impl ToString, allowed: impl Into<String>) -> Self {
        PallasError::Field { field: field.to_string(), value: value.to_string(), allowed: allowed.into() }
    }
}
