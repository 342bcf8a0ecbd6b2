//! [`LayerSpec`]: what `tpusim layer` runs (the command's flags, also usable as TOML keys), and
//! the [`LayerPlan`] it resolves to for a chip: the block, the video, the slice and its chip
//! groups, the parallel layout, the attention kernels and the sparse mask.

use crate::model::{DitModel, Latent, Video};
use crate::topology::Torus;
use crate::LayerError;
use clap::Args;
use serde::{Deserialize, Serialize};
use std::sync::OnceLock;
use tpusim_chip::ChipModel;
use tpusim_kernel::{Kernel, Masking, Traversal};
use tpusim_job::JobSpec;
use tpusim_workload::Mask;

tpusim_model::word_enum! {
    /// How classifier-free guidance's two passes (conditional and unconditional) are laid out.
    pub enum Cfg {
        /// Two chip groups when the slice splits in two and each half divides the heads, else a batch of 2 on every chip.
        Auto = "auto",
        /// A batch of 2 on every chip: one Ulysses group over the whole slice.
        Batch = "batch",
        /// Two chip groups, one per pass, each a Ulysses group over half the slice (MaxDiffusion's data axis of 2).
        Groups = "groups",
        /// No guidance: one pass.
        Off = "off",
    }
}

tpusim_model::word_enum! {
    /// Which self-attention kernel runs.
    pub enum AttentionMode {
        /// The dense kernel on the full mask.
        Dense = "dense",
        /// Sparse VideoGen: head routing, the temporal-head token permutation and the sparse kernel on the band + sink mask.
        Sparse = "sparse",
    }
}

tpusim_model::word_enum! {
    /// Where the temporal heads' token permutation runs.
    pub enum Placement {
        /// Before the input all-to-all, on the sequence-sharded tensors (a cross-chip exchange), and its inverse after the return all-to-all.
        Before = "before",
        /// After the input all-to-all, on each chip's own heads (head-local, no extra ICI traffic), and its inverse before the return all-to-all.
        After = "after",
    }
}

tpusim_model::word_enum! {
    /// How a permutation of sequence-sharded tensors crosses chips (placement `before`).
    pub enum Exchange {
        /// XLA's SPMD partitioner replicates a reshape it cannot partition (every chip gathers the whole tensor, then keeps its shard).
        AllGather = "all-gather",
        /// An ideal resharding: each chip sends each other chip only the tokens it needs.
        AllToAll = "all-to-all",
    }
}

tpusim_model::word_enum! {
    /// Where each chip's copy of the block's weights comes from.
    pub enum Weights {
        /// Every chip holds all weights.
        Replicated = "replicated",
        /// Weights are sharded over the Ulysses group and all-gathered before each matmul (FSDP-like, as MaxDiffusion's `embed` axis rule over `context`).
        Gathered = "gathered",
    }
}

/// The case-study sparse mask's band, as a fraction of the sequence: half-width 15,000 of
/// 75,600 tokens (the reconstruction `band:15000+sink:3600` of `traces/video-720p-aligned.toml`,
/// which reproduces the study's published tile statistics). Kept at every resolution, so the
/// pair density stays at that mask's.
pub const DEFAULT_SPARSE_BAND: f64 = 15_000.0 / 75_600.0;

/// Query rows SVG samples per head to route it (maxdiffusion pull request 480,
/// `svg_profile_query_count` = 64).
pub const DEFAULT_ROUTING_ROWS: u64 = 64;

/// What to run: the block, the video, the slice, the parallel layout, the attention and the
/// end-to-end schedule. Every field is optional; unset fields take the defaults in their help.
/// Field names are the TOML keys; the command-line flags are the same names with dashes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, Args)]
#[serde(deny_unknown_fields)]
pub struct LayerSpec {
    /// Transformer block: a preset (wan2.1-14b) or a path to a block TOML [default: wan2.1-14b].
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Video resolution: 480p, 720p, 1080p, 1440p or WIDTHxHEIGHT [default: 720p].
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolution: Option<String>,
    /// Video frames (4 x n + 1 for Wan's VAE) [default: 81].
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frames: Option<u64>,
    /// Slice: a device count (8: the chip's most nearly square shape, 2x4 on v6e) or a shape
    /// such as 2x4 or 4x4x4 [default: 8].
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice: Option<String>,
    /// Classifier-free guidance layout [default: auto].
    #[arg(long, value_enum)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cfg: Option<Cfg>,
    /// Self-attention kernel [default: dense].
    #[arg(long, value_enum)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention: Option<AttentionMode>,
    /// Where the temporal heads' token permutation runs (sparse attention) [default: after].
    #[arg(long, value_enum)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permutation: Option<Placement>,
    /// How the permutation crosses chips when it runs before the all-to-all [default: all-gather].
    #[arg(long, value_enum)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permute_exchange: Option<Exchange>,
    /// Fraction of each chip's heads whose tokens are permuted (SVG's head-local placement
    /// computes the permuted layout for every local head and selects per head) [default: 1].
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permuted_heads: Option<f64>,
    /// Query rows sampled per head to route it (sparse attention) [default: 64].
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing_rows: Option<u64>,
    /// Weights on each chip [default: replicated].
    #[arg(long, value_enum)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<Weights>,
    /// Let ICI collectives overlap independent compute (XLA's asynchronous collectives)
    /// [default: true].
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<bool>,
    /// Sparse mask band half-width as a fraction of the sequence [default: 15000/75600, the
    /// case study's band at 720p].
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sparse_band: Option<f64>,
    /// Sparse mask attention-sink columns, in latent frames from the first [default: 1].
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sparse_sink_frames: Option<u64>,
    /// The dense self-attention kernel: a `tpusim run` trace whose kernel keys apply [default:
    /// JAX's Splash at MaxDiffusion's v6e blocks, 3024 / 2048 / 1024].
    #[arg(long, value_name = "TRACE.toml")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dense_kernel: Option<String>,
    /// The sparse self-attention kernel: a `tpusim run` trace whose kernel keys apply [default:
    /// MaxDiffusion's sparse Splash, compacted grid, mask on partial tiles, tile-aligned mask,
    /// blocks 3328 x 1536].
    #[arg(long, value_name = "TRACE.toml")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sparse_kernel: Option<String>,
    /// Denoising steps: also report the time of steps x layers blocks.
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<u64>,
    /// With sparse attention: the first N steps run dense [default: 0].
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dense_steps: Option<u64>,
    /// With sparse attention: the first N blocks of every step run dense [default: 0].
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dense_layers: Option<u64>,
    /// With --steps and sparse attention: report the fraction of dense (step, block) pairs at
    /// which the end-to-end speedup equals this (repeatable).
    #[arg(long, value_name = "X")]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub target_speedup: Vec<f64>,
}

/// Kernel keys a `dense_kernel` / `sparse_kernel` trace may set; the workload (batch, heads,
/// lengths, mask) is the layer's.
const KERNEL_KEYS: &[&str] = &[
    "kernel",
    "block_q",
    "block_kv",
    "block_kv_compute",
    "traversal",
    "masking",
    "mask_source",
    "tile_align",
    "exp",
    "experimental_scheduler",
    "vmem_limit_mib",
];

impl LayerSpec {
    /// Every field name, in declaration order (read off the command-line definition).
    pub fn fields() -> &'static [String] {
        static FIELDS: OnceLock<Vec<String>> = OnceLock::new();
        FIELDS.get_or_init(|| {
            <LayerSpec as Args>::augment_args(clap::Command::new("layer"))
                .get_arguments()
                .map(|a| a.get_id().as_str().to_string())
                .collect()
        })
    }

    /// The fields this spec sets, with their values as JSON.
    pub fn set_fields(&self) -> serde_json::Map<String, serde_json::Value> {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(m)) => m,
            _ => serde_json::Map::new(),
        }
    }

    /// Fields set in `over` replace those of `self`.
    pub fn overlay(&self, over: &LayerSpec) -> LayerSpec {
        let mut merged = self.set_fields();
        for (k, v) in over.set_fields() {
            merged.insert(k, v);
        }
        serde_json::from_value(serde_json::Value::Object(merged)).expect("a merge of two valid specs is a valid spec")
    }

    /// Resolves the spec for `chip` (module docs).
    ///
    /// # Errors
    /// [`LayerError`] naming the field: unknown block or resolution, a slice the chip cannot
    /// have, heads that do not divide over a Ulysses group, options that need sparse attention,
    /// out-of-range fractions, unreadable or invalid kernel traces.
    pub fn build(&self, chip: &ChipModel) -> Result<LayerPlan, LayerError> {
        let model = DitModel::load(self.model.as_deref().unwrap_or("wan2.1-14b"))?;
        let video = Video::parse(self.resolution.as_deref().unwrap_or("720p"), self.frames.unwrap_or(81))?;
        let latent = Latent::of(&model, &video)?;
        let slice = Torus::slice(self.slice.as_deref().unwrap_or("8"), chip)?;
        let devices = slice.devices();
        let attention = self.attention.unwrap_or(AttentionMode::Dense);
        if attention == AttentionMode::Dense {
            let set = self.set_fields();
            if let Some(f) =
                ["permutation", "permute_exchange", "permuted_heads", "routing_rows", "sparse_band", "sparse_sink_frames", "sparse_kernel"]
                    .iter()
                    .find(|f| set.contains_key(**f))
            {
                return Err(LayerError::field(
                    f,
                    set[*f].to_string().trim_matches('"'),
                    "applies to sparse attention: give `attention` sparse",
                ));
            }
        }
        let permutation = self.permutation.unwrap_or(Placement::After);
        if permutation == Placement::After && self.permute_exchange.is_some() {
            return Err(LayerError::field(
                "permute_exchange",
                self.permute_exchange.map(|e| e.word()).unwrap_or(""),
                "applies to `permutation` before",
            ));
        }
        // Classifier-free guidance.
        let cfg = self.cfg.unwrap_or(Cfg::Auto);
        let halves_fit = devices >= 2 && slice.split(2).is_ok() && model.heads % (devices / 2) == 0;
        let resolved = match cfg {
            Cfg::Auto if halves_fit => Cfg::Groups,
            Cfg::Auto => Cfg::Batch,
            c => c,
        };
        let (groups, group) = match resolved {
            Cfg::Groups => {
                if devices < 2 {
                    return Err(LayerError::field(
                        "cfg",
                        "groups",
                        format!("two chip groups need at least 2 devices; the slice has {devices} (use `cfg` batch)"),
                    ));
                }
                (2, slice.split(2)?)
            }
            _ => (1, slice.clone()),
        };
        let ulysses = group.devices();
        let local_batch = match resolved {
            Cfg::Batch => 2,
            _ => 1,
        };
        if model.heads % ulysses != 0 {
            return Err(LayerError::field(
                "slice",
                slice.label(),
                format!(
                    "Ulysses splits the {} heads over the {ulysses} devices of a group, which must divide them ({} layout): choose another slice or `cfg`",
                    model.heads, resolved
                ),
            ));
        }
        let seq_len = latent.tokens();
        let padded_len = seq_len.next_multiple_of(ulysses);
        // Sparse attention.
        let permuted_heads = self.permuted_heads.unwrap_or(1.0);
        if !(permuted_heads.is_finite() && (0.0..=1.0).contains(&permuted_heads)) {
            return Err(LayerError::field("permuted_heads", permuted_heads, "expected a fraction from 0 to 1"));
        }
        // The default is clamped to short sequences (dense attention does no routing at all).
        let routing_rows = self.routing_rows.unwrap_or(DEFAULT_ROUTING_ROWS.min(padded_len));
        if routing_rows == 0 || routing_rows > padded_len {
            return Err(LayerError::field(
                "routing_rows",
                routing_rows,
                format!("expected a whole number from 1 to the sequence length ({padded_len})"),
            ));
        }
        let band = self.sparse_band.unwrap_or(DEFAULT_SPARSE_BAND);
        if !(band.is_finite() && band > 0.0 && band <= 1.0) {
            return Err(LayerError::field(
                "sparse_band",
                band,
                "expected a fraction above 0 and at most 1 (band half-width over the sequence)",
            ));
        }
        let sink_frames = self.sparse_sink_frames.unwrap_or(1);
        if sink_frames > latent.frames {
            return Err(LayerError::field(
                "sparse_sink_frames",
                sink_frames,
                format!("expected at most the {} latent frames", latent.frames),
            ));
        }
        let width = ((band * seq_len as f64).round() as u64).max(1);
        let sink = sink_frames * latent.tokens_per_frame();
        let text = if sink > 0 { format!("band:{width}+sink:{sink}") } else { format!("band:{width}") };
        let sparse_mask = Mask::parse(&text).map_err(|e| LayerError::field("sparse_band", band, e.to_string()))?;
        // End to end.
        for (k, v) in [("steps", self.steps), ("dense_steps", self.dense_steps), ("dense_layers", self.dense_layers)] {
            if let Some(v) = v {
                if v > 1 << 20 || (k == "steps" && v == 0) {
                    return Err(LayerError::field(k, v, "expected a whole number from 1 to 1048576"));
                }
            }
        }
        // The end-to-end fields given, with their values as typed (a list as `1.2,1.5`).
        let set = self.set_fields();
        let end_to_end: Option<(&str, String)> = ["dense_steps", "dense_layers", "target_speedup"].into_iter().find_map(|f| {
            set.get(f).map(|v| {
                let text = match v {
                    // A NaN or infinite speedup serialises as null: shown as given.
                    serde_json::Value::Array(_) if f == "target_speedup" => self.target_speedup.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(","),
                    serde_json::Value::Array(a) => a.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(","),
                    other => other.to_string(),
                };
                (f, text)
            })
        });
        if let (None, Some((f, value))) = (self.steps, &end_to_end) {
            return Err(LayerError::field(f, value, "applies to an end-to-end run: give `steps`"));
        }
        if let (AttentionMode::Dense, Some((f, value))) = (attention, &end_to_end) {
            return Err(LayerError::field(f, value, "applies to sparse attention: give `attention` sparse"));
        }
        if let Some(s) = self.steps {
            if self.dense_steps.unwrap_or(0) > s {
                return Err(LayerError::field("dense_steps", self.dense_steps.unwrap_or(0), format!("expected at most `steps` ({s})")));
            }
        }
        if self.dense_layers.unwrap_or(0) > model.layers {
            return Err(LayerError::field(
                "dense_layers",
                self.dense_layers.unwrap_or(0),
                format!("expected at most the block's {} layers", model.layers),
            ));
        }
        for &t in &self.target_speedup {
            if !(t.is_finite() && t >= 1.0) {
                return Err(LayerError::field("target_speedup", t, "expected a finite end-to-end speedup of at least 1 (e.g. 1.5)"));
            }
        }
        let dense_kernel = kernel_spec(self.dense_kernel.as_deref(), "dense_kernel", default_dense_kernel())?;
        let sparse_kernel = kernel_spec(self.sparse_kernel.as_deref(), "sparse_kernel", default_sparse_kernel())?;
        Ok(LayerPlan {
            chip: chip.clone(),
            model,
            video,
            latent,
            slice,
            group,
            groups,
            cfg: resolved,
            local_batch,
            ulysses,
            seq_len,
            padded_len,
            attention,
            permutation,
            exchange: self.permute_exchange.unwrap_or(Exchange::AllGather),
            permuted_heads,
            routing_rows,
            weights: self.weights.unwrap_or(Weights::Replicated),
            overlap: self.overlap.unwrap_or(true),
            sparse_mask,
            sparse_band: band,
            sparse_sink_frames: sink_frames,
            dense_kernel,
            sparse_kernel,
            steps: self.steps,
            dense_steps: self.dense_steps.unwrap_or(0),
            dense_layers: self.dense_layers.unwrap_or(0),
            target_speedup: self.target_speedup.clone(),
        })
    }
}

/// JAX's Splash (the kernel of MaxDiffusion's `attention: flash`) with the blocks of MaxDiffusion's
/// Wan v6e recipes (AI-Hypercomputer/tpu-recipes `inference/trillium/MaxDiffusion/Wan2.x`: flash
/// blocks q 3024, kv 2048, kv compute 1024): calibration row VD-B0. (MaxDiffusion's own mask-free
/// kernel, `splash-dense`, lays q along the lanes and cannot take block_q 3024.)
pub fn default_dense_kernel() -> JobSpec {
    JobSpec {
        kernel: Some(Kernel::Splash),
        block_q: Some(3024),
        block_kv: Some(2048),
        block_kv_compute: Some(1024),
        ..Default::default()
    }
}

/// MaxDiffusion's sparse Splash kernel as the case study ran it on the tile-aligned mask
/// (compacted grid, mask on partial tiles, blocks 3328 x 1536): calibration row VD-B3.
pub fn default_sparse_kernel() -> JobSpec {
    JobSpec {
        kernel: Some(Kernel::SparseSplash),
        block_q: Some(3328),
        block_kv: Some(1536),
        traversal: Some(Traversal::Compact),
        masking: Some(Masking::Partial),
        tile_align: Some(true),
        ..Default::default()
    }
}

/// The kernel keys of a trace file, over the built-in default (a file replaces the default).
fn kernel_spec(path: Option<&str>, field: &str, default: JobSpec) -> Result<JobSpec, LayerError> {
    let Some(path) = path else { return Ok(default) };
    let spec = JobSpec::from_toml_file(path).map_err(|e| LayerError::field(field, path, e.to_string()))?;
    if let Some(k) = spec.set_fields().keys().find(|k| !KERNEL_KEYS.contains(&k.as_str())) {
        return Err(LayerError::field(
            field,
            path,
            format!(
                "key `{k}` is not a kernel option: the layer sets the chip, workload and mask; allowed keys are {}",
                KERNEL_KEYS.join(", ")
            ),
        ));
    }
    Ok(spec)
}

/// A resolved layer run: everything the graph and the simulation need.
#[derive(Debug, Clone)]
pub struct LayerPlan {
    /// The chip model of every device.
    pub chip: ChipModel,
    /// The transformer block.
    pub model: DitModel,
    /// The video.
    pub video: Video,
    /// Its latent patch grid.
    pub latent: Latent,
    /// The slice.
    pub slice: Torus,
    /// One chip group's box (the whole slice unless guidance runs as two groups).
    pub group: Torus,
    /// Chip groups (2 for guidance as chip groups, else 1).
    pub groups: u64,
    /// The guidance layout after `auto` is resolved.
    pub cfg: Cfg,
    /// Sequences each chip holds tokens of (2 for guidance as a batch, else 1).
    pub local_batch: u64,
    /// Devices of a Ulysses group P: each holds 1/P of the tokens, then 1/P of the heads.
    pub ulysses: u64,
    /// Tokens of one sequence L.
    pub seq_len: u64,
    /// L padded to a multiple of P (Ulysses pads the sequence).
    pub padded_len: u64,
    /// Dense or sparse self-attention.
    pub attention: AttentionMode,
    /// Where the permutation runs (sparse).
    pub permutation: Placement,
    /// How a `before` permutation crosses chips.
    pub exchange: Exchange,
    /// Fraction of heads permuted.
    pub permuted_heads: f64,
    /// Rows sampled per head for routing.
    pub routing_rows: u64,
    /// Weights on each chip.
    pub weights: Weights,
    /// Collectives may overlap compute.
    pub overlap: bool,
    /// The sparse kernel's mask over the padded sequence.
    pub sparse_mask: Mask,
    /// Its band half-width as a fraction of the sequence.
    pub sparse_band: f64,
    /// Its sink columns, in latent frames.
    pub sparse_sink_frames: u64,
    /// Dense self-attention kernel options.
    pub dense_kernel: JobSpec,
    /// Sparse self-attention kernel options.
    pub sparse_kernel: JobSpec,
    /// Denoising steps for the end-to-end time.
    pub steps: Option<u64>,
    /// Steps that stay dense.
    pub dense_steps: u64,
    /// Blocks per step that stay dense.
    pub dense_layers: u64,
    /// Speedups whose dense fraction to report.
    pub target_speedup: Vec<f64>,
}

impl LayerPlan {
    /// Tokens each chip holds between the all-to-alls: local batch x L / P (padded).
    pub fn tokens_per_chip(&self) -> u64 {
        self.local_batch * self.padded_len / self.ulysses
    }

    /// Heads each chip holds between the all-to-alls: H / P.
    pub fn heads_per_chip(&self) -> u64 {
        self.model.heads / self.ulysses
    }

    /// The same plan with the other attention mode (dense for the end-to-end comparison).
    pub fn with_attention(&self, attention: AttentionMode) -> LayerPlan {
        LayerPlan { attention, ..self.clone() }
    }
}

/// Rewrites every backticked layer field in `text` (`` `slice` ``) as the front end names it:
/// `--slice` with `flags`, `slice` otherwise; other backticked words are left alone.
pub fn render_layer_fields(text: &str, flags: bool) -> String {
    let fields = LayerSpec::fields();
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('`') {
        let Some(close) = rest[open + 1..].find('`') else {
            break;
        };
        let word = &rest[open + 1..open + 1 + close];
        out.push_str(&rest[..open]);
        if fields.iter().any(|f| f == word) {
            if flags {
                out.push_str(&format!("--{}", word.replace('_', "-")));
            } else {
                out.push_str(word);
            }
        } else {
            out.push_str(&rest[open..open + close + 2]);
        }
        rest = &rest[open + close + 2..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v6e() -> ChipModel {
        ChipModel::preset("v6e").unwrap()
    }

    #[test]
    fn default_plan_is_wan_720p_on_v6e_8_as_two_groups() {
        let p = LayerSpec::default().build(&v6e()).unwrap();
        assert_eq!((p.seq_len, p.ulysses, p.groups, p.local_batch), (75_600, 4, 2, 1));
        assert_eq!(p.group.dims, vec![2, 2]);
        assert_eq!((p.tokens_per_chip(), p.heads_per_chip()), (18_900, 10));
        assert_eq!(p.sparse_mask.to_string(), "band:15000+sink:3600");
        let b = LayerSpec { cfg: Some(Cfg::Batch), ..Default::default() }.build(&v6e()).unwrap();
        assert_eq!((b.ulysses, b.local_batch, b.heads_per_chip(), b.tokens_per_chip()), (8, 2, 5, 18_900));
        let one = LayerSpec { slice: Some("1".into()), ..Default::default() }.build(&v6e()).unwrap();
        assert_eq!((one.cfg, one.ulysses, one.local_batch), (Cfg::Batch, 1, 2));
    }

    #[test]
    fn bad_layer_specs_name_the_field() {
        let chip = v6e();
        let cases: Vec<(LayerSpec, &str)> = vec![
            (LayerSpec { slice: Some("3".into()), cfg: Some(Cfg::Batch), ..Default::default() }, "`slice`"),
            (LayerSpec { cfg: Some(Cfg::Groups), slice: Some("1".into()), ..Default::default() }, "`cfg`"),
            (LayerSpec { permutation: Some(Placement::Before), ..Default::default() }, "`permutation`"),
            (LayerSpec { attention: Some(AttentionMode::Sparse), permuted_heads: Some(1.5), ..Default::default() }, "`permuted_heads`"),
            (LayerSpec { attention: Some(AttentionMode::Sparse), dense_steps: Some(3), ..Default::default() }, "`dense_steps`"),
            (LayerSpec { steps: Some(40), dense_layers: Some(2), ..Default::default() }, "`dense_layers`"),
            (LayerSpec { resolution: Some("huge".into()), ..Default::default() }, "`resolution`"),
            (LayerSpec { model: Some("nope.toml".into()), ..Default::default() }, "nope.toml"),
        ];
        for (s, want) in cases {
            let e = s.build(&chip).unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        }
        assert_eq!(render_layer_fields("`slice` = 3: see `cfg` and `other`", true), "--slice = 3: see --cfg and `other`");
    }

    /// End-to-end fields given where they do not apply are named with the value given, not a
    /// placeholder (`--dense-steps = set`) or a list's brackets (`[1.2]`).
    #[test]
    fn end_to_end_fields_that_do_not_apply_give_their_value() {
        let chip = v6e();
        let cases: Vec<(LayerSpec, &str)> = vec![
            (LayerSpec { steps: Some(40), dense_steps: Some(5), ..Default::default() }, "`dense_steps` = 5: applies to sparse attention"),
            (
                LayerSpec { steps: Some(40), target_speedup: vec![1.25, 1.5], ..Default::default() },
                "`target_speedup` = 1.25,1.5: applies to sparse attention",
            ),
            (
                LayerSpec { attention: Some(AttentionMode::Sparse), target_speedup: vec![1.2], ..Default::default() },
                "`target_speedup` = 1.2: applies to an end-to-end run",
            ),
            (
                LayerSpec { attention: Some(AttentionMode::Sparse), target_speedup: vec![f64::NAN], ..Default::default() },
                "`target_speedup` = NaN: applies to an end-to-end run",
            ),
        ];
        for (s, want) in cases {
            let e = s.build(&chip).unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        }
    }
}
