//! `tpusim sweep`, `tpusim merge` and `tpusim tune` (issue 5). Owned by the sweep work.

use crate::InputError;
use clap::Args;

/// Flags of `tpusim sweep`.
#[derive(Args, Debug)]
pub struct SweepArgs {
    /// Sweep file (TOML).
    pub file: String,
}

/// Flags of `tpusim merge`.
#[derive(Args, Debug)]
pub struct MergeArgs {
    /// Shard output files.
    pub files: Vec<String>,
}

/// Flags of `tpusim tune`.
#[derive(Args, Debug)]
pub struct TuneArgs {}

pub fn cmd_sweep(_a: &SweepArgs) -> Result<String, InputError> {
    Err(InputError("tpusim sweep is not built yet".into()))
}

pub fn cmd_merge(_a: &MergeArgs) -> Result<String, InputError> {
    Err(InputError("tpusim merge is not built yet".into()))
}

pub fn cmd_tune(_a: &TuneArgs) -> Result<String, InputError> {
    Err(InputError("tpusim tune is not built yet".into()))
}
