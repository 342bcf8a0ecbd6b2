//! What a layer run reports: the layer's latency per chip with its breakdown, the ops in
//! program order, and with `steps` the end-to-end denoising time and the speedup of sparse
//! attention as a curve over the fraction of (step, block) pairs that stay dense.

use crate::graph::Category;
use crate::sim::{Breakdown, LayerResult, Resource};
use crate::spec::AttentionMode;
use serde::Serialize;
use std::fmt::Write as _;

/// The end-to-end time of `steps` denoising steps of `layers` blocks, some dense, some sparse.
///
/// Every sparse block costs the sparse layer's time and every dense one the dense layer's, so
/// the time is `n_dense x t_dense + n_sparse x t_sparse` and the speedup over all-dense depends
/// only on the dense fraction f = n_dense / (steps x layers): `1 / (f + (1 - f) t_sparse /
/// t_dense)`. The non-block parts of a step (patch embedding, time and text embeddings, the
/// output head) and the VAE and text encoder are not simulated.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EndToEnd {
    /// Denoising steps.
    pub steps: u64,
    /// Blocks per step.
    pub layers: u64,
    /// Steps that run dense from the first.
    pub dense_steps: u64,
    /// Blocks of every step that run dense from the first.
    pub dense_layers: u64,
    /// (step, block) pairs that run dense.
    pub dense_pairs: u64,
    /// dense_pairs / (steps x layers).
    pub dense_fraction: f64,
    /// One dense block, ms.
    pub dense_layer_ms: f64,
    /// One sparse block, ms (sparse attention only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sparse_layer_ms: Option<f64>,
    /// The run's time, seconds.
    pub seconds: f64,
    /// All blocks dense, seconds.
    pub all_dense_seconds: f64,
    /// all_dense_seconds / seconds.
    pub speedup: f64,
    /// All blocks sparse: t_dense / t_sparse.
    pub max_speedup: f64,
    /// The speedup at dense fractions 0, 0.05, ..., 1 (sparse attention only).
    pub curve: Vec<CurvePoint>,
    /// The dense fraction at which each requested speedup is met (`None`: beyond the all-sparse
    /// speedup).
    pub targets: Vec<Target>,
}

/// One point of the speedup curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CurvePoint {
    /// Fraction of (step, block) pairs that run dense.
    pub dense_fraction: f64,
    /// End-to-end time, seconds.
    pub seconds: f64,
    /// Speedup over all-dense.
    pub speedup: f64,
}

/// A requested speedup and the dense fraction that meets it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Target {
    /// The speedup.
    pub speedup: f64,
    /// The dense fraction giving exactly this speedup, if any in [0, 1].
    pub dense_fraction: Option<f64>,
}

impl EndToEnd {
    /// The end-to-end time (type docs); `sparse` is `None` for dense attention.
    pub fn new(steps: u64, layers: u64, dense_steps: u64, dense_layers: u64, dense_s: f64, sparse_s: Option<f64>, targets: &[f64]) -> Self {
        let pairs = steps * layers;
        let (dense_pairs, per_sparse) = match sparse_s {
            Some(s) => (dense_steps * layers + (steps - dense_steps) * dense_layers.min(layers), s),
            None => (pairs, dense_s),
        };
        let f = dense_pairs as f64 / pairs as f64;
        let seconds = dense_pairs as f64 * dense_s + (pairs - dense_pairs) as f64 * per_sparse;
        let all_dense = pairs as f64 * dense_s;
        let time_at = |f: f64| pairs as f64 * (f * dense_s + (1.0 - f) * per_sparse);
        let curve = match sparse_s {
            Some(_) => (0..=20)
                .map(|i| i as f64 / 20.0)
                .map(|f| CurvePoint { dense_fraction: f, seconds: time_at(f), speedup: all_dense / time_at(f) })
                .collect(),
            None => Vec::new(),
        };
        let targets = targets.iter().map(|&s| Target { speedup: s, dense_fraction: dense_fraction_for(dense_s, per_sparse, s) }).collect();
        EndToEnd {
            steps,
            layers,
            dense_steps,
            dense_layers,
            dense_pairs,
            dense_fraction: f,
            dense_layer_ms: dense_s * 1e3,
            sparse_layer_ms: sparse_s.map(|s| s * 1e3),
            seconds,
            all_dense_seconds: all_dense,
            speedup: all_dense / seconds,
            max_speedup: dense_s / per_sparse,
            curve,
            targets,
        }
    }
}

/// The dense fraction f with `1 / (f + (1 - f) sparse / dense) = speedup`, if f is in [0, 1].
pub fn dense_fraction_for(dense_s: f64, sparse_s: f64, speedup: f64) -> Option<f64> {
    if (dense_s - sparse_s).abs() < f64::EPSILON * dense_s {
        return (speedup - 1.0).abs().lt(&1e-12).then_some(1.0);
    }
    let f = (dense_s / speedup - sparse_s) / (dense_s - sparse_s);
    (-1e-12..=1.0 + 1e-12).contains(&f).then(|| f.clamp(0.0, 1.0))
}

/// One op in a report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpReport {
    /// Name.
    pub name: String,
    /// Breakdown category.
    pub category: Category,
    /// Queue (core or ici).
    pub resource: Resource,
    /// Start, ms from the layer's start.
    pub start_ms: f64,
    /// Duration, ms.
    pub ms: f64,
    /// Useful FLOPs.
    pub flops: f64,
    /// HBM bytes.
    pub hbm_bytes: u64,
    /// Bounding unit (TensorCore ops).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bottleneck: Option<tpusim_model::Unit>,
    /// Shape, kernel, bytes.
    pub detail: String,
    /// A collective's busiest link, bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_link_bytes: Option<f64>,
    /// A collective's longest route, hops.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_hops: Option<u64>,
    /// A collective's bisection bound, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bisection_ms: Option<f64>,
}

/// The slice in a report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SliceReport {
    /// Shape, e.g. `2x4`.
    pub shape: String,
    /// Devices.
    pub devices: u64,
    /// mesh, torus or partial torus.
    pub kind: String,
    /// Wraparound per axis.
    pub wraparound: Vec<bool>,
}

/// The metrics of a layer run (`tpusim layer --format json`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LayerReport {
    /// Chip model.
    pub chip: String,
    /// Block name.
    pub model: String,
    /// Resolution label (`720p`).
    pub resolution: String,
    /// Width, height and frames.
    pub video: crate::model::Video,
    /// Latent patch grid.
    pub latent: crate::model::Latent,
    /// Tokens per sequence.
    pub tokens: u64,
    /// The slice.
    pub slice: SliceReport,
    /// Guidance layout (batch, groups or off).
    pub cfg: String,
    /// Chip groups.
    pub groups: u64,
    /// One group's shape.
    pub group_shape: String,
    /// Ulysses degree (devices per group).
    pub ulysses: u64,
    /// Sequences whose tokens each chip holds.
    pub local_batch: u64,
    /// Tokens per chip outside attention.
    pub tokens_per_chip: u64,
    /// Heads per chip inside attention.
    pub heads_per_chip: u64,
    /// dense or sparse.
    pub attention: AttentionMode,
    /// Where the permutation runs (sparse).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permutation: Option<String>,
    /// The sparse mask (sparse).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sparse_mask: Option<String>,
    /// Whether the sparse kernel runs the mask aligned to its tiles (`tile_align`: every tile
    /// the exact mask touches computed whole, as the case study's tile-aligned kernel; it
    /// changes the output), else the exact mask (sparse).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sparse_tile_align: Option<bool>,
    /// Weights on each chip.
    pub weights: String,
    /// Whether collectives overlap compute.
    pub overlap: bool,
    /// One block on one chip, ms.
    pub latency_ms: f64,
    /// The latency by category, ms (sums to latency_ms).
    pub breakdown_ms: Breakdown,
    /// Attention kernels' share of the latency.
    pub attention_share: f64,
    /// Attention with its all-to-alls and the permutation, share of the latency.
    pub attention_with_exchange_share: f64,
    /// ICI busy, ms.
    pub ici_busy_ms: f64,
    /// ICI time the TensorCore waited for, ms.
    pub ici_exposed_ms: f64,
    /// Useful FLOPs per chip.
    pub flops: f64,
    /// Executed FLOPs per chip.
    pub executed_flops: f64,
    /// Useful FLOPs / latency / peak.
    pub mfu: f64,
    /// HBM bytes per chip.
    pub hbm_bytes: u64,
    /// Weight bytes resident on each chip (all blocks).
    pub weight_bytes_per_chip: u64,
    /// The ops in program order.
    pub ops: Vec<OpReport>,
    /// Steps x layers, with sparse attention against all-dense.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_to_end: Option<EndToEnd>,
    /// Assumptions and caveats of this run.
    pub notes: Vec<String>,
    /// Per unit of the chip, and the ICI links, what making it alone twice as fast saves in the
    /// layer's latency ([`crate::what_if_2x`]); `None` unless computed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub what_if_2x: Option<Vec<tpusim_job::whatif::WhatIf>>,
    /// The unit or `ici` with the largest 2x gain (with `what_if_2x`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bottleneck: Option<String>,
}

impl LayerReport {
    /// Summarises a layer result and its end-to-end time, if any.
    pub fn new(r: &LayerResult, e2e: Option<EndToEnd>) -> Self {
        let p = &r.plan;
        let ms = 1e3;
        let ops = r
            .graph
            .ops()
            .map(|(i, op)| {
                let (c, s) = (&r.costs[i.index()], &r.schedule[i.index()]);
                OpReport {
                    name: op.name.clone(),
                    category: op.category,
                    resource: s.resource,
                    start_ms: s.start * ms,
                    ms: (s.end - s.start) * ms,
                    flops: c.flops,
                    hbm_bytes: c.hbm_bytes,
                    bottleneck: c.bottleneck,
                    detail: c.detail.clone(),
                    max_link_bytes: c.collective.map(|t| t.max_link_bytes),
                    max_hops: c.collective.map(|t| t.max_hops),
                    bisection_ms: c.collective.and_then(|t| t.bisection_seconds.map(|b| b * ms)),
                }
            })
            .collect();
        let weights_per_chip = match p.weights {
            crate::spec::Weights::Replicated => p.model.block_weight_bytes() * p.model.layers,
            crate::spec::Weights::Gathered => p.model.block_weight_bytes() * p.model.layers / p.ulysses + p.model.block_weight_bytes(),
        };
        let mut notes = Vec::new();
        let cap = p.chip.hbm_capacity_bytes();
        let m = &p.model;
        let t = p.tokens_per_chip();
        // The largest live set of one block: the residual stream, its normalised copy, q, k, v
        // and o, and the FFN's hidden activations.
        let activations = t * (2 * m.hidden + 4 * m.qkv_width() + m.ffn) * m.activation_bytes;
        if weights_per_chip + activations > cap {
            notes.push(format!(
                "HBM: the weights ({:.1} GB) and about {:.1} GB of one block's activations exceed the {:.1} GB of a {} chip; the model does not check HBM capacity beyond each kernel (--weights gathered or more chips would be needed)",
                weights_per_chip as f64 / 1e9,
                activations as f64 / 1e9,
                cap as f64 / 1e9,
                p.chip.name
            ));
        }
        if p.overlap && p.ulysses > 1 {
            notes.push("collectives overlap independent compute (XLA's asynchronous collectives); --overlap=false serialises them".into());
        }
        notes.push(if p.model.cross_attn_norm {
            "bias adds, GELU and the ungated residual after cross-attention are fused into their matmuls' output; each norm is a statistics and a normalising fusion (with its modulation or RoPE); the first gated residual is computed inside norm3's two fusions and never written (its readers recompute it), the last and the layout transposes are HBM-bound fusions of their own"
        } else {
            "bias adds, GELU and the ungated residual after cross-attention are fused into their matmuls' output; each norm is a statistics and a normalising fusion (with its modulation or RoPE); gated residuals and layout transposes are HBM-bound fusions of their own"
        }
        .into());
        if p.attention == AttentionMode::Sparse {
            notes.push("routing is modelled as a small attention call (the SVG profiler's sampled queries against all keys, three candidate masks)".into());
        }
        LayerReport {
            chip: p.chip.name.clone(),
            model: p.model.name.clone(),
            resolution: p.video.label(),
            video: p.video,
            latent: p.latent,
            tokens: p.seq_len,
            slice: SliceReport {
                shape: p.slice.label(),
                devices: p.slice.devices(),
                kind: p.slice.kind().into(),
                wraparound: p.slice.wrap.clone(),
            },
            cfg: p.cfg.to_string(),
            groups: p.groups,
            group_shape: p.group.label(),
            ulysses: p.ulysses,
            local_batch: p.local_batch,
            tokens_per_chip: p.tokens_per_chip(),
            heads_per_chip: p.heads_per_chip(),
            attention: p.attention,
            permutation: (p.attention == AttentionMode::Sparse).then(|| match p.permutation {
                crate::spec::Placement::After => "after the all-to-all (head-local)".to_string(),
                crate::spec::Placement::Before => format!("before the all-to-all ({} exchange)", p.exchange),
            }),
            sparse_mask: (p.attention == AttentionMode::Sparse).then(|| p.sparse_mask.to_string()),
            sparse_tile_align: (p.attention == AttentionMode::Sparse).then_some(p.sparse_kernel.tile_align == Some(true)),
            weights: p.weights.to_string(),
            overlap: p.overlap,
            latency_ms: r.seconds * ms,
            breakdown_ms: r.breakdown.scaled(ms),
            attention_share: r.attention_share(),
            attention_with_exchange_share: r.attention_with_exchange_share(),
            ici_busy_ms: r.ici_busy * ms,
            ici_exposed_ms: r.ici_exposed * ms,
            flops: r.flops(),
            executed_flops: r.executed_flops(),
            mfu: r.flops() / r.seconds / p.chip.peak_flops(),
            hbm_bytes: r.hbm_bytes(),
            weight_bytes_per_chip: weights_per_chip,
            ops,
            end_to_end: e2e,
            notes,
            what_if_2x: None,
            bottleneck: None,
        }
    }

    /// JSON, one object.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a layer report serialises")
    }

    /// A table for people.
    pub fn to_table(&self) -> String {
        let mut s = String::new();
        if self.slice.devices == 1 {
            let _ = writeln!(s, "tpusim layer: {} block on one {}", self.model, self.chip);
        } else {
            let wrap = if self.slice.kind == "mesh" { ", no wraparound" } else { "" };
            let _ = writeln!(
                s,
                "tpusim layer: {} block on {} x {} ({} {}{wrap})",
                self.model, self.slice.devices, self.chip, self.slice.shape, self.slice.kind
            );
        }
        let _ = writeln!(
            s,
            "  video        {}x{}, {} frames -> latent {} x {} x {} = {} tokens",
            self.video.width, self.video.height, self.video.frames, self.latent.frames, self.latent.rows, self.latent.cols, self.tokens
        );
        let layout = match self.cfg.as_str() {
            "groups" => format!("guidance as {} chip groups of {} ({})", self.groups, self.ulysses, self.group_shape),
            "batch" => "guidance as a batch of 2 on every chip".to_string(),
            _ => "no guidance".to_string(),
        };
        let seqs = if self.local_batch == 1 { "1 sequence".to_string() } else { format!("{} sequences", self.local_batch) };
        let ulysses =
            if self.ulysses > 1 { format!("Ulysses over {} devices", self.ulysses) } else { "no sequence parallelism".to_string() };
        let _ = writeln!(
            s,
            "  parallelism  {layout}; {ulysses}: each chip holds {} tokens of {seqs}, and in self-attention {} heads of {seqs}; weights {}",
            self.tokens_per_chip, self.heads_per_chip, self.weights
        );
        match (&self.permutation, &self.sparse_mask) {
            (Some(perm), Some(mask)) => {
                let aligned = if self.sparse_tile_align == Some(true) {
                    " aligned to the kernel's tiles (tile_align: each tile it touches computed whole; the output changes)"
                } else {
                    " (exact)"
                };
                let _ = writeln!(s, "  attention    sparse, mask {mask}{aligned}; permutation {perm}");
            }
            _ => {
                let _ = writeln!(s, "  attention    dense");
            }
        }
        let _ = writeln!(s);
        let _ = writeln!(s, "  layer        {:.3} ms per chip (one block, one denoising step)", self.latency_ms);
        let _ = writeln!(s, "  breakdown    {:<16} {:>10} {:>7}", "", "ms", "share");
        for &c in Category::ALL {
            let v = self.breakdown_ms.get(c);
            if v > 0.0 {
                let share = v / self.latency_ms;
                let _ = writeln!(
                    s,
                    "               {:<16} {:>10.3} {:>6.1}%  {}",
                    c.word(),
                    v,
                    100.0 * share,
                    "#".repeat((share * 40.0).round() as usize)
                );
            }
        }
        let _ = writeln!(
            s,
            "  attention    {:.1}% of the layer ({:.1}% with its all-to-alls and the permutation)",
            100.0 * self.attention_share,
            100.0 * self.attention_with_exchange_share
        );
        let _ = writeln!(
            s,
            "  ICI          busy {:.3} ms, the TensorCore waited {:.3} ms; compute {:.3e} FLOP, {:.1}% MFU; HBM {:.2} GB",
            self.ici_busy_ms,
            self.ici_exposed_ms,
            self.flops,
            100.0 * self.mfu,
            self.hbm_bytes as f64 / 1e9
        );
        if let (Some(t), Some(b)) = (&self.what_if_2x, &self.bottleneck) {
            let cells: Vec<String> = t.iter().map(|w| format!("{} -{:.1}%", w.unit, 100.0 * w.gain)).collect();
            use tpusim_job::whatif::{CO_BOUND_FRACTION, CO_BOUND_MIN_GAIN};
            let top = t.iter().find(|w| &w.unit == b).map_or(0.0, |w| w.gain);
            let co: Vec<String> = t
                .iter()
                .filter(|w| &w.unit != b && w.gain >= CO_BOUND_FRACTION * top && w.gain > CO_BOUND_MIN_GAIN)
                .map(|w| format!("{} -{:.1}%", w.unit, 100.0 * w.gain))
                .collect();
            let co = if co.is_empty() { String::new() } else { format!("; co-bound: {}", co.join(", ")) };
            // Below the gain `tpusim run` calls decisive, say that no unit dominates the layer.
            let spread = if top < tpusim_job::whatif::DECISIVE_GAIN {
                format!("; no unit twice as fast saves {:.0}%: the layer's time is spread over its units and ops", 100.0 * tpusim_job::whatif::DECISIVE_GAIN)
            } else {
                String::new()
            };
            let _ = writeln!(s, "  bound by     {b} (2x faster: -{:.1}% latency, the largest gain of one unit twice as fast{co}{spread})", 100.0 * top);
            let _ = writeln!(s, "  what if 2x   {}", cells.join(", "));
        }
        let _ = writeln!(s);
        let _ = writeln!(s, "  {:<34} {:<13} {:>5} {:>10} {:>9}  detail", "op", "category", "on", "start ms", "ms");
        for o in &self.ops {
            let on = match o.resource {
                Resource::Core => "core",
                Resource::Ici => "ici",
            };
            let _ = writeln!(s, "  {:<34} {:<13} {:>5} {:>10.3} {:>9.3}  {}", o.name, o.category.word(), on, o.start_ms, o.ms, o.detail);
        }
        if let Some(e) = &self.end_to_end {
            let _ = writeln!(s);
            let _ = writeln!(s, "  end to end   {} steps x {} blocks: {:.2} s", e.steps, e.layers, e.seconds);
            if let Some(sp) = e.sparse_layer_ms {
                let _ = writeln!(
                    s,
                    "               dense block {:.3} ms, sparse block {:.3} ms; {} of {} (step, block) pairs dense ({:.1}%, first {} steps and first {} blocks)",
                    e.dense_layer_ms,
                    sp,
                    e.dense_pairs,
                    e.steps * e.layers,
                    100.0 * e.dense_fraction,
                    e.dense_steps,
                    e.dense_layers
                );
                let _ = writeln!(
                    s,
                    "               all dense {:.2} s: speedup {:.3}x (all sparse {:.3}x)",
                    e.all_dense_seconds, e.speedup, e.max_speedup
                );
                let pts: Vec<String> = e.curve.iter().step_by(4).map(|c| format!("{:.2}: {:.3}x", c.dense_fraction, c.speedup)).collect();
                let _ = writeln!(s, "               speedup over the dense fraction  {}", pts.join(", "));
                for t in &e.targets {
                    match t.dense_fraction {
                        Some(f) => {
                            let _ = writeln!(s, "               {:.3}x is met at dense fraction {:.3}", t.speedup, f);
                        }
                        None => {
                            let _ =
                                writeln!(s, "               {:.3}x is not reachable (all sparse gives {:.3}x)", t.speedup, e.max_speedup);
                        }
                    }
                }
            }
        }
        for n in &self.notes {
            let _ = writeln!(s, "  note         {n}");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speedup_curve_and_fractions_agree() {
        let e = EndToEnd::new(40, 40, 10, 1, 0.1, Some(0.05), &[1.5, 3.0]);
        assert_eq!(e.dense_pairs, 10 * 40 + 30);
        assert!((e.max_speedup - 2.0).abs() < 1e-12);
        assert!((e.curve[0].speedup - 2.0).abs() < 1e-12 && (e.curve[20].speedup - 1.0).abs() < 1e-12);
        let f = e.targets[0].dense_fraction.unwrap();
        // 1 / (f + (1 - f) / 2) = 1.5  =>  f = 1/3.
        assert!((f - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(e.targets[1].dense_fraction, None);
        assert!((e.seconds - (430.0 * 0.1 + 1170.0 * 0.05)).abs() < 1e-9);
    }
}
