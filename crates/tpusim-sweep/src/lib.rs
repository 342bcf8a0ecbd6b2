//! Sweeps, shards, merges and block-size tuning for tpusim (`tpusim sweep`, `tpusim merge`,
//! `tpusim tune`).
//!
//! * [`def`]: sweep files. A sweep file is TOML: `[base]` is a [`tpusim_report::JobSpec`] (the
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
//! * [`mod@merge`]: joins shard outputs, checking that every point is present exactly once; the
//!   result is byte-for-byte the unsharded output.
//! * [`mod@tune`]: searches block sizes and kernel options for one workload within the block rules
//!   and the VMEM limit, and ranks them by predicted latency.
//!
//! Depends on `tpusim-report` and the crates below it; never on the binary.

pub mod def;
pub mod eval;
pub mod exec;
pub mod merge;
pub mod output;
pub mod tune;

pub use def::SweepDef;
pub use exec::{run_sweep, Shard, SweepOptions, SweepSummary};
pub use merge::{merge, MergeSummary};
pub use output::Format;
pub use tune::{tune, TuneOptions, TuneResult};

/// An error for the user: a bad sweep file, a bad flag, an unreadable or inconsistent output
/// file. The message names the file and the key or line.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct SweepError(pub String);

impl SweepError {
    pub(crate) fn new(msg: impl Into<String>) -> Self {
        SweepError(msg.into())
    }
}

/// Builds the rayon pool for `jobs` threads (`None`: one per core).
pub(crate) fn pool(jobs: Option<usize>) -> Result<rayon::ThreadPool, SweepError> {
    let mut b = rayon::ThreadPoolBuilder::new();
    if let Some(j) = jobs {
        if j == 0 {
            return Err(SweepError::new("--jobs 0: expected at least 1 thread"));
        }
        b = b.num_threads(j);
    }
    b.build().map_err(|e| SweepError::new(format!("cannot start worker threads: {e}")))
}

/// A progress bar on stderr, drawn only when `show` is set and stderr is a terminal.
pub(crate) fn progress_bar(show: bool, len: u64, what: &str) -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    if !show || !std::io::stderr().is_terminal() {
        return None;
    }
    let pb = indicatif::ProgressBar::with_draw_target(Some(len), indicatif::ProgressDrawTarget::stderr());
    let style = indicatif::ProgressStyle::with_template(&format!(
        "{{spinner}} {what} [{{elapsed_precise}}] {{wide_bar}} {{pos}}/{{len}} ({{per_sec}}, eta {{eta}})"
    ))
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    pb.set_style(style);
    Some(pb)
}

/// 64-bit FNV-1a hash (stable across platforms and releases; used for sweep definitions).
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}
