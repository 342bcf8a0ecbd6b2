//! XLA's own dot (not a Pallas kernel) as the kernel crate's `xla-matmul` family: a blocked
//! matmul on the MXUs whose efficiency the `XLA-MM-v6e-*` calibration rows pin, with XLA's tiling
//! as [`tpusim_kernel::matmul::lower_xla`] chooses it (the same as `tpusim run --kernel
//! xla-matmul` without blocks).

use crate::SliceError;
pub use tpusim_kernel::matmul::{balanced_block, xla_config as xla_matmul_config};
use tpusim_kernel::{matmul, MatmulConfig};
use tpusim_model::Program;
use tpusim_workload::MatmulCall;

/// Lowers a matmul as XLA's dot ([`tpusim_kernel::matmul::lower_xla`]): its configuration and
/// program.
///
/// # Errors
/// [`SliceError::Op`] naming `name` when even 128 x 128 tiles do not fit, or the sizes are
/// invalid.
pub fn lower_xla_matmul(chip: &tpusim_chip::ChipModel, mm: &MatmulCall, name: &str) -> Result<(MatmulConfig, Program), SliceError> {
    matmul::lower_xla(chip, mm).map_err(|e| SliceError::Op { op: name.into(), message: e.to_string() })
}
