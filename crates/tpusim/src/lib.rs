//! tpusim: a cycle-approximate simulator of Google TPU chips for attention kernels.
//!
//! This crate is the command-line tool (`tpusim run`, `tune`, `sweep`, `validate`, `plot`, ...)
//! and, as a library, one door to the workspace's layers: chip models ([`chip`]), workloads and
//! masks ([`workload`]), kernel lowering ([`kernel`]), the simulator ([`engine`]) and the job
//! layer ([`JobSpec`], [`run`], [`Report`]), and transformer layers on a slice of chips
//! ([`layer`]).
//!
//! # Example
//!
//! Simulate causal attention over 4,096 tokens with 8 heads and 512-wide blocks on v6e:
//!
//! ```
//! use tpusim::{run, JobSpec, Report};
//!
//! let spec = JobSpec {
//!     heads: Some(8),
//!     seq_len: Some(4096),
//!     mask: Some("causal".into()),
//!     block_q: Some(512),
//!     block_kv: Some(512),
//!     ..Default::default()
//! };
//! let chip = spec.chip()?; // v6e by default
//! let job = spec.build(&chip)?;
//! let report = Report::from_run(&run(&chip, &job)?);
//! assert!(report.latency_ms > 0.0);
//! println!("{:.3} ms, bound by {}", report.latency_ms, report.bottleneck);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub use tpusim_chip as chip;
pub use tpusim_engine as engine;
pub use tpusim_kernel as kernel;
pub use tpusim_layer as layer;
pub use tpusim_job::{run, Job, JobSpec, Report, Run, SpecError};
pub use tpusim_workload as workload;
