//! Errors of the command line: every library error becomes a [`CliError`] whose kind picks the
//! exit code (2 for bad input, 1 for an internal or I/O failure), with job fields named as the
//! flags the user typed.

use tpusim_job::{render_fields, FieldStyle};

/// An error for the user, printed once as `error: ...`.
#[derive(Debug)]
pub enum CliError {
    /// Bad input: flags, files, values (exit code 2).
    Input(String),
    /// A failure that is not the input's fault: writing an output, drawing (exit code 1).
    Internal(String),
    /// The command's results, to print on stdout as if it had succeeded, followed by the error
    /// that stopped it afterwards (e.g. the output file could not be written): results that cost
    /// minutes are never lost to a failed write. The exit code is the error's.
    AfterOutput {
        /// What the command printed.
        output: String,
        /// What went wrong after.
        error: Box<CliError>,
    },
    /// Stopped by Ctrl-C, with what was kept and how to go on (exit code 130, the shell's for
    /// SIGINT).
    Interrupted(String),
}

impl CliError {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Input(_) => 2,
            CliError::Internal(_) => 1,
            CliError::Interrupted(_) => 130,
            CliError::AfterOutput { error, .. } => error.exit_code(),
        }
    }

    /// An input error with a message.
    pub fn input(msg: impl Into<String>) -> Self {
        CliError::Input(msg.into())
    }
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CliError::Input(s) | CliError::Internal(s) | CliError::Interrupted(s) => f.write_str(s),
            CliError::AfterOutput { error, .. } => error.fmt(f),
        }
    }
}

/// Whether a library error is the input's fault, and how its job fields read on the command
/// line (backticked fields become flags).
pub trait ErrorKind: std::fmt::Display {
    /// True for failures that are not the input's fault (exit code 1).
    fn internal(&self) -> bool {
        false
    }
}

impl<E: ErrorKind> From<E> for CliError {
    fn from(e: E) -> Self {
        let msg = render_fields(&e.to_string(), FieldStyle::Flag);
        if e.internal() {
            CliError::Internal(msg)
        } else {
            CliError::Input(msg)
        }
    }
}

impl ErrorKind for tpusim_job::SpecError {}
impl ErrorKind for tpusim_chip::ChipError {}
impl ErrorKind for tpusim_kernel::KernelError {}
impl ErrorKind for tpusim_calib::MeasureError {}
impl ErrorKind for tpusim_calib::CalibError {
    fn internal(&self) -> bool {
        self.is_internal()
    }
}
impl ErrorKind for tpusim_sweep::SweepError {
    fn internal(&self) -> bool {
        self.is_internal()
    }
}
impl ErrorKind for tpusim_plot::PlotError {
    fn internal(&self) -> bool {
        self.is_internal()
    }
}
