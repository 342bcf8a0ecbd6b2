//! `tpusim plot` (issue 6). Owned by the plotting work.

use crate::InputError;
use clap::Args;

/// Flags of `tpusim plot`.
#[derive(Args, Debug)]
pub struct PlotArgs {
    /// Plot kind.
    pub kind: String,
}

pub fn cmd_plot(_a: &PlotArgs) -> Result<String, InputError> {
    Err(InputError("tpusim plot is not built yet".into()))
}
