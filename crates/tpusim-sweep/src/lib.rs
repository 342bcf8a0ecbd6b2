//! Sweeps, shards, merges and block-size tuning for tpusim (`tpusim sweep`, `tpusim merge`,
//! `tpusim tune`).
//!
//! * [`def`]: sweep files. A sweep file is TOML: `[base]` is a [`tpusim_job::JobSpec`] (the
//!   same keys as the `tpusim run` flags) and `[axes]` lists values for job fields and chip fields
//!   (`chip.SECTION.FIELD`); the sweep is their cartesian product (`mode = "product"`, the
//!   default) or the listed `[[points]]` (`mode = "points"`). Points are numbered 0..N in a fixed
//!   order (first axis slowest).
//! * [`eval`]: evaluates one point end to end (chip, job, lowering, simulation, dense baseline)
//!   with per-sweep caches of parsed chips and dense baselines.
//! * [`output`]: the row layout (point index, inputs, resolved job, metrics, error) as CSV or
//!   JSON lines, with a header line that carries the number of points, the shard and a hash of
//!   the sweep definition.
//! * [`exec`]: runs a sweep (or one shard `I/N`: points with `index % N == I`) in parallel on a
//!   rayon pool, appending finished rows to `OUT.partial` and finishing by an atomic rename to
//!   `OUT` with the rows in index order; an interrupted run resumes from `OUT.partial`.
//! * [`shard_env`]: `--shard auto`, the shard of a Slurm array task or Kubernetes Indexed Job
//!   from its environment.
//! * [`mod@merge`]: joins shard outputs, checking that every point is present exactly once; the
//!   result is byte-for-byte the unsharded output.
//! * [`mod@tune`]: searches block sizes and kernel options for one workload within the block rules
//!   and the VMEM limit, and ranks them by predicted latency.
//!
//! Depends on `tpusim-job` and the crates below it; never on the binary.

pub mod def;
pub mod eval;
pub mod exec;
pub mod merge;
pub mod output;
pub mod progress;
pub mod shard_env;
pub mod tune;

pub use def::SweepDef;
pub use exec::{run_sweep, Shard, SweepOptions, SweepSummary};
pub use merge::{merge, MergeSummary};
pub use output::Format;
pub use shard_env::ShardChoice;
pub use tune::{tune, Stage, TuneOptions, TuneResult};

/// An error of a sweep, merge or search. Messages name the file and the key or line.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SweepError {
    /// Bad input: a sweep file, a flag, an inconsistent or foreign output file.
    #[error("{0}")]
    Input(String),
    /// The job itself is invalid (names the field).
    #[error(transparent)]
    Spec(#[from] tpusim_job::SpecError),
    /// Writing or removing an output file failed, or worker threads could not start.
    #[error("{0}")]
    Io(String),
    /// A bug (an inconsistency the code should never reach).
    #[error("internal error: {0}")]
    Internal(String),
    /// Stopped by [`exec::SweepOptions::cancel`]: `rows` of the shard's `points` rows are in
    /// `partial`; the same command again resumes from them.
    #[error("interrupted: the {rows} of {points} rows finished so far are in {partial}; run the same command again to resume from them (only the missing points are evaluated; --restart starts over)")]
    Interrupted {
        /// The `OUT.partial` file holding the finished rows.
        partial: String,
        /// Rows it holds.
        rows: u64,
        /// Rows of the whole shard.
        points: u64,
    },
}

impl SweepError {
    pub(crate) fn new(msg: impl Into<String>) -> Self {
        SweepError::Input(msg.into())
    }

    /// True for failures that are not the input's fault (I/O, bugs).
    pub fn is_internal(&self) -> bool {
        matches!(self, SweepError::Io(_) | SweepError::Internal(_))
    }
}

/// Builds the rayon pool for `jobs` threads (`None`: one per core).
/// Most worker threads a sweep or a tune takes (`--jobs`): a pool of many thousands of threads
/// exhausts the machine before it computes anything.
pub const MAX_JOBS: usize = 1024;

pub(crate) fn pool(jobs: Option<usize>) -> Result<rayon::ThreadPool, SweepError> {
    let mut b = rayon::ThreadPoolBuilder::new();
    if let Some(j) = jobs {
        if j == 0 || j > MAX_JOBS {
            return Err(SweepError::new(format!("--jobs {j}: expected a whole number of threads from 1 to {MAX_JOBS}")));
        }
        b = b.num_threads(j);
    }
    b.build().map_err(|e| SweepError::Io(format!("cannot start worker threads: {e}")))
}

/// Progress on stderr ([`progress::bar`]): a bar on a terminal, plain periodic lines otherwise.
pub(crate) fn progress_bar(show: bool, len: u64, what: &str) -> Option<indicatif::ProgressBar> {
    progress::bar(show, len, what)
}

/// A 64-bit hash of bytes with no random seed (rustc-hash's FxHasher), for sweep definitions and
/// the files they name: equal inputs hash equally on every run of a tpusim release.
pub(crate) fn stable_hash(bytes: &[u8]) -> u64 {
    use std::hash::Hasher;
    let mut h = rustc_hash::FxHasher::default();
    h.write(bytes);
    h.finish()
}
