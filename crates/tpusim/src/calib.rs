//! `tpusim validate` and `tpusim calibrate` (issue 4). Owned by the calibration work.

use crate::InputError;
use clap::Args;

/// Flags of `tpusim validate`.
#[derive(Args, Debug)]
pub struct ValidateArgs {
    /// Measurement CSV (see traces/measured/README.md).
    pub file: String,
}

/// Flags of `tpusim calibrate`.
#[derive(Args, Debug)]
pub struct CalibrateArgs {
    /// Measurement CSV.
    pub file: String,
}

pub fn cmd_validate(_a: &ValidateArgs) -> Result<String, InputError> {
    Err(InputError("tpusim validate is not built yet".into()))
}

pub fn cmd_calibrate(_a: &CalibrateArgs) -> Result<String, InputError> {
    Err(InputError("tpusim calibrate is not built yet".into()))
}
