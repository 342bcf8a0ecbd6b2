//! Beyond one kernel: a video diffusion transformer (DiT) block on a slice of TPU chips.
//!
//! * [`model`]: the block's dimensions ([`DitModel`]: the built-in Wan 2.1 14B, or any block from
//!   a TOML file), the video and its latent patch grid, parameter counts.
//! * [`topology`]: the slice as a mesh or torus of devices from the chip model's `[ici]` section,
//!   chip groups, and collectives timed from the bytes on each link (the slice crate's,
//!   `tpusim_slice::topology`, re-exported).
//! * [`spec`]: what to run ([`LayerSpec`], the flags of `tpusim layer`) resolved into a
//!   [`LayerPlan`]: Ulysses sequence parallelism over a chip group, classifier-free guidance as a
//!   batch of 2 or as two chip groups, dense or sparse (Sparse VideoGen) self-attention, where the
//!   temporal heads' permutation runs, weights replicated or gathered.
//! * [`graph`]: one chip's share of the block as a petgraph graph of ops (norms and modulation,
//!   projections, RoPE, all-to-alls, routing, permutation gathers, self- and cross-attention, the
//!   feed-forward network, residuals).
//! * [`sim`]: each op on the chip model (matmuls on the MXU model as XLA dots, attention through
//!   the Splash simulation, element-wise ops as HBM-bound fusions, collectives on the topology),
//!   then the ops scheduled on the TensorCore and the ICI by the slice crate's one schedule
//!   (`tpusim_slice::schedule`, which `tpusim-program` runs too); the latency and its breakdown.
//! * [`report`]: the layer report (JSON and a table) and the end-to-end time of steps x blocks
//!   with the speedup of sparse attention as a curve over the dense fraction.
//! * [`trace`]: the layer's timeline as a Chrome trace (one track per unit and one for ICI).
//!
//! Depends on chip, workload, kernel, engine, report and slice; only the binary and the plot
//! crate depend on it.

pub mod graph;
pub mod model;
pub mod report;
pub mod sim;
pub mod spec;
pub mod trace;

pub use tpusim_slice::topology;

pub use model::{DitModel, Latent, Video};
pub use report::{EndToEnd, LayerReport};
pub use sim::{simulate_layer, Breakdown, LayerResult};
pub use spec::{AttentionMode, Cfg, Exchange, LayerPlan, LayerSpec, Placement, Weights};
pub use topology::{time_collective, time_transfers, Collective, CollectiveTiming, Transfer, Torus};

use tpusim_chip::ChipModel;

/// An error of a layer run: a field (in backticks: a [`LayerSpec`] field or a block TOML key),
/// its value and what is allowed, or an error of a lower layer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LayerError {
    /// A field's value is not allowed.
    #[error("`{field}` = {value}: {allowed}")]
    Field {
        /// The field, e.g. `slice`.
        field: String,
        /// The value as given.
        value: String,
        /// What is allowed.
        allowed: String,
    },
    /// A block or trace file cannot be read or is invalid.
    #[error("{path}: {message}")]
    File {
        /// The file (or preset).
        path: String,
        /// What is wrong (names the key).
        message: String,
    },
    /// An op cannot run on the chip (its kernel's block rules, VMEM or HBM capacity).
    #[error("op `{op}`: {message}")]
    Op {
        /// The op's name.
        op: String,
        /// Why.
        message: String,
    },
}

impl From<tpusim_slice::SliceError> for LayerError {
    fn from(e: tpusim_slice::SliceError) -> Self {
        let tpusim_slice::SliceError::Field { field, value, allowed } = e;
        LayerError::Field { field, value, allowed }
    }
}

impl LayerError {
    pub(crate) fn field(field: &str, value: impl ToString, allowed: impl Into<String>) -> Self {
        LayerError::Field { field: field.to_string(), value: value.to_string(), allowed: allowed.into() }
    }
}

/// A layer run: the layer as asked, and with `steps` and sparse attention the same layer dense.
#[derive(Debug, Clone)]
pub struct LayerRun {
    /// The layer as asked.
    pub result: LayerResult,
    /// The dense layer (sparse attention with `steps`).
    pub dense: Option<LayerResult>,
    /// The end-to-end time (with `steps`).
    pub end_to_end: Option<EndToEnd>,
}

impl LayerRun {
    /// The report.
    pub fn report(&self) -> LayerReport {
        LayerReport::new(&self.result, self.end_to_end.clone())
    }
}

/// The layer's what-if table: for each unit of the chip ([`tpusim_job::whatif::doubled`]'s
/// fields) and for the ICI links (`ici.link_bandwidth_gb_per_s` x2), the layer run again on a
/// chip model with that one change, and the gain `1 - t'/t`; and the entry with the largest gain
/// (the layer's bottleneck). Every op keeps its lowering (a what-if model keeps the issue order
/// of the chip it derives from), so each gain is >= 0.
///
/// # Errors
/// [`LayerError`] as [`run`] (never for a spec that ran on `chip`).
pub fn what_if_2x(spec: &LayerSpec, chip: &ChipModel, base: &LayerRun) -> Result<(Vec<tpusim_job::whatif::WhatIf>, String), LayerError> {
    use tpusim_job::whatif::{doubled, format_value, with_all, WhatIf};
    let t = base.result.seconds;
    let mut sets: Vec<(String, Vec<(String, f64)>)> =
        tpusim_model::Unit::ALL.iter().map(|&u| (u.word().to_string(), doubled(chip, u))).collect();
    sets.push(("ici".into(), vec![("ici.link_bandwidth_gb_per_s".into(), 2.0 * chip.ici.link_bandwidth_gb_per_s.value)]));
    let mut table = Vec::new();
    for (unit, set) in sets {
        let fast = with_all(chip, &set).map_err(|e| LayerError::field("set", set.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" "), e))?;
        let plan = spec.build(&fast)?;
        let t2 = simulate_layer(&plan)?.seconds;
        table.push(WhatIf {
            unit,
            set: set.iter().map(|(k, v)| format!("{k}={}", format_value(*v))).collect(),
            latency_ms: t2 * 1e3,
            gain: if t > 0.0 { 1.0 - t2 / t } else { 0.0 },
        });
    }
    let best = table.iter().fold(None::<&WhatIf>, |b, w| if b.is_none_or(|b| w.gain > b.gain) { Some(w) } else { b });
    let name = best.map(|w| w.unit.clone()).unwrap_or_default();
    Ok((table, name))
}

/// Builds and simulates a layer run for `chip` ([`LayerSpec::build`], [`simulate_layer`]), with
/// the dense layer and the end-to-end time when `steps` is given.
///
/// # Errors
/// [`LayerError`] from the spec or from an op's kernel.
pub fn run(spec: &LayerSpec, chip: &ChipModel) -> Result<LayerRun, LayerError> {
    let plan = spec.build(chip)?;
    let result = simulate_layer(&plan)?;
    let (dense, end_to_end) = match plan.steps {
        None => (None, None),
        Some(steps) => {
            let layers = plan.model.layers;
            match plan.attention {
                AttentionMode::Dense => (None, Some(EndToEnd::new(steps, layers, steps, layers, result.seconds, None, &[]))),
                AttentionMode::Sparse => {
                    let dense = simulate_layer(&plan.with_attention(AttentionMode::Dense))?;
                    let e = EndToEnd::new(
                        steps,
                        layers,
                        plan.dense_steps,
                        plan.dense_layers,
                        dense.seconds,
                        Some(result.seconds),
                        &plan.target_speedup,
                    );
                    (Some(dense), Some(e))
                }
            }
        }
    };
    Ok(LayerRun { result, dense, end_to_end })
}
