//! Validation of tpusim against measured kernel timings, and calibration of a chip model's
//! fitted parameters to a user's own measurements.
//!
//! * [`measure`]: the measurement CSV format (documented in `traces/measured/README.md`), strict
//!   parsing with errors that name the file, line and column, and the mapping of a row onto a
//!   [`tpusim_job::JobSpec`].
//! * [`mod@validate`]: predicts every row, reports signed errors, skipped rows with reasons, an error
//!   summary (median and mean |error|, worst row) and, for rows that differ only in tiling or
//!   kernel options, whether the predicted ranking matches the measured one (Kendall's tau).
//! * [`fit`]: fits the `[fitted]` parameters of a chip model by least squares on log time,
//!   detects parameters the rows cannot identify, cross-validates (leave-one-out or k-fold), and
//!   writes the fitted model with the rows it was fitted to.
//! * [`trace`]: measured timings from profiler traces (XProf / Perfetto Chrome trace JSON, gzip
//!   or not): device ops selected by a kernel-name pattern, median over repeats, written as
//!   measurement rows.
//! * [`cv`]: `validate --cv`, every chip refitted without each row (and each head_dim group) to
//!   judge the models out of sample.
//!
//! Depends on `tpusim-job` and the crates below it; nothing depends on it but the binary.

#![warn(missing_docs)]

pub mod bands;
pub mod cv;
pub mod docs;
pub mod fit;
pub mod lookup;
pub mod measure;
pub mod stats;
pub mod trace;
pub mod validate;

pub use cv::{cross_validate, CrossValidation};
pub use fit::{calibrate, candidates, fitted_param, CalibrateOptions, Calibration, FITTED_PARAMS};

/// An error of calibration or validation (not a skipped row: those carry their reason).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CalibError {
    /// Bad input: flags, an unknown parameter, too few rows to fit.
    #[error("{0}")]
    Input(String),
    /// The measurement file is malformed (names file, line and column).
    #[error(transparent)]
    Measure(#[from] MeasureError),
    /// The chip model could not be loaded.
    #[error(transparent)]
    Chip(#[from] tpusim_chip::ChipError),
    /// The output file cannot be written.
    #[error(transparent)]
    Output(#[from] tpusim_io::OutputError),
    /// A bug (a model that does not read back).
    #[error("internal error: {0}")]
    Internal(String),
}

impl CalibError {
    /// True for failures that are not the input's fault (writing, bugs).
    pub fn is_internal(&self) -> bool {
        match self {
            CalibError::Output(e) => !e.is_refusal(),
            CalibError::Internal(_) => true,
            _ => false,
        }
    }
}
pub use lookup::{attach_shipped_measurement, shipped_measurement, what_if_measurement_note};
pub use measure::{parse, read_file, MeasureError, Measurement, MeasurementFile};
pub use trace::{kernel_timings, measurement_rows, read_trace, rows_to_csv, select_ops, DeviceOp, KernelTiming, Selection, TraceError};
pub use validate::{validate, ChipSet, ModelUse, UnmatchedModel, Usage, Validation};
