//! A call as the device runs it: its Pallas kernels and the XLA ops around them, as a sequence
//! of [`Phase`]s. The hand-written families build one per library call
//! (`tpusim_kernel::library::lower_attention`), a kernel read from its IR one of its single
//! kernel; the engine simulates the phases in order.

use crate::Program;
use serde::Serialize;

/// An XLA fusion that only moves data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fusion {
    /// What it does, e.g. `transpose q (x logits scale)`.
    pub name: String,
    /// Bytes read from HBM.
    pub read_bytes: u64,
    /// Bytes written to HBM.
    pub write_bytes: u64,
}

/// Which part of a call a phase belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Part {
    /// The forward kernel (and its residual slices).
    Forward,
    /// The backward's precompute (di, broadcasts).
    Di,
    /// JAX's dq kernel.
    Dq,
    /// The dkv kernel (unfused).
    Dkv,
    /// The fused dq/dk/dv kernel and its dq sum.
    FusedBackward,
    /// The library's ops around the kernels (scope `op`).
    Wrapper,
    /// The host's dispatch and sync of the call (scope `call`).
    Host,
}

impl Part {
    /// Name for tables.
    pub fn label(self) -> &'static str {
        match self {
            Part::Forward => "forward",
            Part::Di => "di",
            Part::Dq => "dq",
            Part::Dkv => "dkv",
            Part::FusedBackward => "fused dq/dk/dv",
            Part::Wrapper => "outside the kernels",
            Part::Host => "host dispatch",
        }
    }
}

/// One thing the device runs.
#[derive(Debug, Clone)]
pub enum PhaseWork {
    /// A Pallas kernel.
    Kernel(std::sync::Arc<Program>),
    /// An XLA data-movement fusion.
    Fusion(Fusion),
}

/// One phase of a call, in execution order.
#[derive(Debug, Clone)]
pub struct Phase {
    /// Which part of the call.
    pub part: Part,
    /// What runs.
    pub work: PhaseWork,
}

/// A lowered library call: its phases in execution order.
#[derive(Debug, Clone)]
pub struct Lowered {
    /// Phases, run one after another.
    pub phases: Vec<Phase>,
    /// Host-timed calls the time includes (scope `call`: 1), each adding the host's
    /// dispatch-and-sync cost (the chip model's `[host]`; timed by the job layer).
    pub host_calls: u32,
}

impl Lowered {
    /// The first kernel of a part, if any.
    pub fn kernel(&self, part: Part) -> Option<&Program> {
        self.phases.iter().find_map(|p| match (&p.work, p.part == part) {
            (PhaseWork::Kernel(k), true) => Some(&**k),
            _ => None,
        })
    }
}
