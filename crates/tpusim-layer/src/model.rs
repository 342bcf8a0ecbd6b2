//! The transformer block of a video diffusion transformer (DiT): its dimensions ([`DitModel`]),
//! the video it denoises ([`Video`], [`Latent`]) and counts derived from them (parameters).
//!
//! The built-in preset `wan2.1-14b` is Wan 2.1's text-to-video 14B model
//! (`Wan-Video/Wan2.1` `wan/configs/wan_t2v_14B.py` with `wan/configs/shared_config.py`:
//! dim 5120, ffn_dim 13824, num_heads 40, num_layers 40, text_len 512, qk_norm and
//! cross_attn_norm on, patch (1, 2, 2); the VAE stride (4, 8, 8) from the same config). Any other
//! block is a TOML file with the keys of [`DitModel`] (`layers/wan2.1-14b.toml` is the preset
//! written out).
//!
//! The block's structure follows `WanAttentionBlock.forward` in `wan/modules/model.py`:
//! adaptive modulation (a learned per-block table of `modulation_vectors` x hidden plus the shared
//! time embedding: shift, scale and gate for attention and for the feed-forward network), a
//! LayerNorm + modulation, self-attention (q, k, v, o projections with bias, RMSNorm of q and k
//! over the whole projection, 3-D RoPE on q and k), a gated residual, an affine LayerNorm and
//! cross-attention to the text tokens (q from the video, k and v from the text, no RoPE), a
//! residual, a LayerNorm + modulation, the feed-forward network (up, GELU, down) and a gated
//! residual.

use crate::LayerError;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Names of the built-in DiT blocks.
pub const MODEL_PRESETS: &[&str] = &["wan2.1-14b"];

const PRESET_TEXT: &[(&str, &str)] = &[("wan2.1-14b", include_str!("../../../layers/wan2.1-14b.toml"))];

/// The dimensions of one DiT block and of the video latent it works on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DitModel {
    /// Short name, e.g. `wan2.1-14b`.
    pub name: String,
    /// Where the numbers come from (a public config: repository and path).
    pub source: String,
    /// Hidden size D (model width), elements.
    pub hidden: u64,
    /// Attention heads H (self- and cross-attention).
    pub heads: u64,
    /// Head dimension d; the q, k, v projections are D -> H x d, the output H x d -> D.
    pub head_dim: u64,
    /// Feed-forward width F (D -> F -> D).
    pub ffn: u64,
    /// Transformer blocks in the model.
    pub layers: u64,
    /// Text tokens the cross-attention attends to (the text encoder's padded length).
    pub text_tokens: u64,
    /// RMSNorm of q and k over the whole projection (with a learned weight of H x d).
    pub qk_norm: bool,
    /// Affine LayerNorm before cross-attention (weight and bias of D).
    pub cross_attn_norm: bool,
    /// Vectors of D in each block's modulation table (6: shift, scale, gate for attention and FFN).
    pub modulation_vectors: u64,
    /// Whether the linear layers have a bias.
    pub bias: bool,
    /// Patch size (frames, rows, columns) of the patch embedding over the latent.
    pub patch: [u64; 3],
    /// VAE compression (frames, rows, columns): latent frames = (frames - 1) / t + 1, latent rows
    /// = height / h, latent columns = width / w.
    pub vae_stride: [u64; 3],
    /// Bytes per activation element (2: bf16).
    pub activation_bytes: u64,
    /// Bytes per weight element (2: bf16).
    pub weight_bytes: u64,
}

impl DitModel {
    /// A built-in block by name ([`MODEL_PRESETS`]).
    ///
    /// # Errors
    /// [`LayerError::Field`] naming `model` for an unknown name.
    pub fn preset(name: &str) -> Result<Self, LayerError> {
        let text = PRESET_TEXT.iter().find(|(n, _)| *n == name).map(|(_, t)| *t).ok_or_else(|| {
            LayerError::field("model", name, format!("expected a preset ({}) or a path to a .toml block", MODEL_PRESETS.join(", ")))
        })?;
        Self::from_toml_str(text, &format!("preset {name}"))
    }

    /// A block by preset name or, for a name ending in `.toml` or naming a file, from a file.
    ///
    /// # Errors
    /// As [`DitModel::preset`] and [`DitModel::from_toml_str`], plus unreadable files.
    pub fn load(spec: &str) -> Result<Self, LayerError> {
        if MODEL_PRESETS.contains(&spec) {
            return Self::preset(spec);
        }
        if spec.ends_with(".toml") || Path::new(spec).exists() {
            let text =
                std::fs::read_to_string(spec).map_err(|e| LayerError::File { path: spec.into(), message: format!("cannot read: {e}") })?;
            return Self::from_toml_str(&text, spec);
        }
        Self::preset(spec)
    }

    /// Parses and validates a block from TOML text; `origin` names it in errors.
    ///
    /// # Errors
    /// [`LayerError::File`] for malformed TOML, unknown or missing keys (the parser names the
    /// key); [`LayerError::Field`] for out-of-range values.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Self, LayerError> {
        let m: DitModel = toml::from_str(text).map_err(|e| LayerError::File { path: origin.into(), message: one_line(&e.to_string()) })?;
        m.validate().map_err(|e| match e {
            LayerError::Field { field, value, allowed } => {
                LayerError::File { path: origin.into(), message: format!("{field} = {value}: {allowed}") }
            }
            other => other,
        })?;
        Ok(m)
    }

    /// Checks every dimension.
    ///
    /// # Errors
    /// [`LayerError::Field`] naming the key.
    pub fn validate(&self) -> Result<(), LayerError> {
        let max = 1u64 << 24;
        for (k, v, lo) in [
            ("hidden", self.hidden, 1),
            ("heads", self.heads, 1),
            ("head_dim", self.head_dim, 1),
            ("ffn", self.ffn, 1),
            ("layers", self.layers, 1),
            ("text_tokens", self.text_tokens, 1),
        ] {
            if v < lo || v > max {
                return Err(LayerError::field(k, v, format!("expected a whole number from {lo} to {max}")));
            }
        }
        if self.modulation_vectors != 6 {
            return Err(LayerError::field(
                "modulation_vectors",
                self.modulation_vectors,
                "expected 6: the block's graph applies adaLN modulation as Wan does (shift, scale and gate for the attention and for the FFN)",
            ));
        }
        for (k, v) in [("activation_bytes", self.activation_bytes), ("weight_bytes", self.weight_bytes)] {
            if ![1, 2, 4].contains(&v) {
                return Err(LayerError::field(k, v, "expected 1, 2 or 4 (bytes per element)"));
            }
        }
        for (k, a) in [("patch", self.patch), ("vae_stride", self.vae_stride)] {
            if a.iter().any(|&v| v == 0 || v > 64) {
                return Err(LayerError::field(k, format!("{a:?}"), "expected three whole numbers from 1 to 64 (frames, rows, columns)"));
            }
        }
        if self.name.trim().is_empty() || self.source.trim().is_empty() {
            return Err(LayerError::field("source", &self.source, "a block needs a non-empty `name` and `source`"));
        }
        Ok(())
    }

    /// Width of the q, k, v projections: heads x head_dim.
    pub fn qkv_width(&self) -> u64 {
        self.heads * self.head_dim
    }

    /// Parameters of one attention (q, k, v, o projections, their biases, q/k RMSNorm weights).
    pub fn attention_params(&self) -> u64 {
        let (d, w) = (self.hidden, self.qkv_width());
        let bias = if self.bias { 3 * w + d } else { 0 };
        let norms = if self.qk_norm { 2 * w } else { 0 };
        4 * d * w + bias + norms
    }

    /// Parameters of the feed-forward network (up and down projections and biases).
    pub fn ffn_params(&self) -> u64 {
        2 * self.hidden * self.ffn + if self.bias { self.ffn + self.hidden } else { 0 }
    }

    /// Parameters of one transformer block: self-attention, cross-attention, the cross-attention
    /// LayerNorm's affine weights, the feed-forward network and the modulation table (the
    /// non-affine LayerNorms have none). Formula from the parameter shapes of
    /// `WanAttentionBlock` (`wan/modules/model.py`).
    pub fn block_params(&self) -> u64 {
        let norm3 = if self.cross_attn_norm { 2 * self.hidden } else { 0 };
        2 * self.attention_params() + norm3 + self.ffn_params() + self.modulation_vectors * self.hidden
    }

    /// Parameters of all transformer blocks (embeddings and the output head aside).
    pub fn blocks_params(&self) -> u64 {
        self.block_params() * self.layers
    }

    /// Bytes of one block's weights.
    pub fn block_weight_bytes(&self) -> u64 {
        self.block_params() * self.weight_bytes
    }
}

/// A video to generate: pixels and frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Video {
    /// Width, pixels.
    pub width: u64,
    /// Height, pixels.
    pub height: u64,
    /// Frames.
    pub frames: u64,
}

impl Video {
    /// Parses a resolution: `720p` (1280 x 720), `1080p` (1920 x 1080), `1440p` (2560 x 1440),
    /// `480p` (832 x 480) or `WIDTHxHEIGHT`.
    ///
    /// # Errors
    /// [`LayerError::Field`] naming `resolution`.
    pub fn parse(text: &str, frames: u64) -> Result<Self, LayerError> {
        let t = text.trim().to_ascii_lowercase();
        let named = [("480p", (832, 480)), ("720p", (1280, 720)), ("1080p", (1920, 1080)), ("1440p", (2560, 1440))];
        let (width, height) = match named.iter().find(|(n, _)| *n == t) {
            Some((_, wh)) => *wh,
            None => {
                let bad =
                    || LayerError::field("resolution", text, "expected 480p, 720p, 1080p, 1440p or WIDTHxHEIGHT in pixels, e.g. 1280x720");
                let (w, h) = t.split_once('x').ok_or_else(bad)?;
                let w: u64 = w.trim().parse().map_err(|_| bad())?;
                let h: u64 = h.trim().parse().map_err(|_| bad())?;
                if w == 0 || h == 0 || w > 1 << 16 || h > 1 << 16 {
                    return Err(LayerError::field("resolution", text, "width and height must be from 1 to 65536 pixels"));
                }
                (w, h)
            }
        };
        if frames == 0 || frames > 1 << 16 {
            return Err(LayerError::field("frames", frames, "expected a whole number from 1 to 65536"));
        }
        Ok(Video { width, height, frames })
    }

    /// The label of a resolution as written on the command line (`720p` for 1280 x 720).
    pub fn label(&self) -> String {
        match (self.width, self.height) {
            (832, 480) => "480p".into(),
            (1280, 720) => "720p".into(),
            (1920, 1080) => "1080p".into(),
            (2560, 1440) => "1440p".into(),
            (w, h) => format!("{w}x{h}"),
        }
    }
}

/// The patch grid of a video's latent: the tokens one sequence holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Latent {
    /// Latent frames after the VAE and the temporal patch.
    pub frames: u64,
    /// Patch rows per frame.
    pub rows: u64,
    /// Patch columns per frame.
    pub cols: u64,
}

impl Latent {
    /// The latent patch grid of `video` under `model`'s VAE stride and patch: latent frames =
    /// (frames - 1) / stride_t + 1 (Wan's causal VAE keeps the first frame), rows = height /
    /// stride_h / patch_h rounded down (an odd latent, as 1080 / 8 = 135 rows, loses its last
    /// row: what the reference's stride-2 patch convolution and diffusers' rounding of the
    /// height to a multiple of 16 both give, 67 rows), columns likewise.
    ///
    /// # Errors
    /// [`LayerError::Field`] naming `frames` when (frames - 1) is not a multiple of the temporal
    /// stride, and `resolution` when the width or height is not a multiple of the spatial stride
    /// (the VAE encodes whole 8 x 8 pixel blocks) or the picture is smaller than one patch.
    pub fn of(model: &DitModel, video: &Video) -> Result<Self, LayerError> {
        let [st, sh, sw] = model.vae_stride;
        let [pt, ph, pw] = model.patch;
        if !(video.frames - 1).is_multiple_of(st) {
            return Err(LayerError::field(
                "frames",
                video.frames,
                format!("expected {st} x n + 1 frames (the VAE compresses time by {st} after the first frame), e.g. 81"),
            ));
        }
        if !video.width.is_multiple_of(sw) || !video.height.is_multiple_of(sh) {
            // Suggest sizes of whole patches (stride x patch pixels), the ones that change the grid.
            let (uw, uh) = (sw * pw, sh * ph);
            let near = |x: u64, s: u64| {
                if x < s {
                    s.to_string()
                } else if x.is_multiple_of(s) {
                    x.to_string()
                } else {
                    format!("{} or {}", x / s * s, x.div_ceil(s) * s)
                }
            };
            return Err(LayerError::field(
                "resolution",
                format!("{}x{}", video.width, video.height),
                format!(
                    "width and height must be multiples of the VAE's spatial stride ({sw} x {sh} pixels per latent element); in whole {uw} x {uh} pixel patches: width {}, height {}",
                    near(video.width, uw),
                    near(video.height, uh)
                ),
            ));
        }
        let lat_frames = (video.frames - 1) / st + 1;
        let frames = lat_frames / pt;
        let rows = video.height / sh / ph;
        let cols = video.width / sw / pw;
        if frames == 0 || rows == 0 || cols == 0 {
            return Err(LayerError::field(
                "resolution",
                format!("{}x{}", video.width, video.height),
                format!("the picture is smaller than one patch ({} x {} pixels)", sw * pw, sh * ph),
            ));
        }
        Ok(Latent { frames, rows, cols })
    }

    /// Tokens of one sequence: frames x rows x columns.
    pub fn tokens(&self) -> u64 {
        self.frames * self.rows * self.cols
    }

    /// Tokens of one latent frame: rows x columns.
    pub fn tokens_per_frame(&self) -> u64 {
        self.rows * self.cols
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wan_block_parameter_count_matches_the_public_model() {
        // Independent count from the parameter shapes of Wan 2.1's WanAttentionBlock (dim 5120,
        // ffn 13824, 40 layers): q, k, v, o are Linear(5120, 5120) with bias; norm_q, norm_k are
        // RMSNorm(5120); the T2V cross-attention repeats them; norm3 is an affine LayerNorm; the
        // FFN is Linear(5120, 13824) + Linear(13824, 5120); modulation is [1, 6, 5120].
        let d: u64 = 5120;
        let f: u64 = 13824;
        let attn = 4 * (d * d + d) + 2 * d;
        let block = 2 * attn + 2 * d + (d * f + f) + (f * d + d) + 6 * d;
        let m = DitModel::preset("wan2.1-14b").unwrap();
        assert_eq!(m.block_params(), block);
        assert_eq!(m.blocks_params(), 40 * block);
        // "14B": the blocks alone are 14.06 billion parameters (embeddings and head aside).
        let b = m.blocks_params() as f64 / 1e9;
        assert!((b - 14.0).abs() < 0.3, "{b}");
    }

    #[test]
    fn token_counts_per_resolution() {
        let m = DitModel::preset("wan2.1-14b").unwrap();
        let t = |r: &str| Latent::of(&m, &Video::parse(r, 81).unwrap()).unwrap();
        assert_eq!(t("720p").tokens(), 21 * 45 * 80);
        assert_eq!(t("720p").tokens(), 75_600);
        assert_eq!(t("1440p").tokens(), 302_400);
        // 1080 / 8 = 135 latent rows, 67 patch rows after the stride-2 patch.
        assert_eq!(t("1080p").tokens(), 21 * 67 * 120);
        assert_eq!(t("720p").tokens_per_frame(), 3600);
        assert!(Video::parse("720x", 81).unwrap_err().to_string().contains("resolution"));
        let e = Latent::of(&m, &Video::parse("720p", 80).unwrap()).unwrap_err().to_string();
        assert!(e.contains("frames") && e.contains("4 x n + 1"), "{e}");
        // A picture the VAE cannot encode whole is refused, naming the nearest sizes, not rounded.
        let e = Latent::of(&m, &Video::parse("1281x721", 81).unwrap()).unwrap_err().to_string();
        assert!(e.contains("resolution") && e.contains("1281x721") && e.contains("1280 or 1296") && e.contains("720 or 736"), "{e}");
        // A width that is whole patches already is named once.
        let e = Latent::of(&m, &Video::parse("1280x721", 81).unwrap()).unwrap_err().to_string();
        assert!(e.contains("width 1280, height 720 or 736"), "{e}");
    }

    #[test]
    fn bad_blocks_are_refused_naming_the_key() {
        let text = include_str!("../../../layers/wan2.1-14b.toml");
        let e = DitModel::from_toml_str(&text.replace("heads = 40", "heads = 0"), "b.toml").unwrap_err().to_string();
        assert!(e.contains("b.toml") && e.contains("heads = 0"), "{e}");
        let e = DitModel::from_toml_str(&format!("{text}\nbogus = 1\n"), "b.toml").unwrap_err().to_string();
        assert!(e.contains("bogus"), "{e}");
        let e = DitModel::load("wan9").unwrap_err().to_string();
        assert!(e.contains("wan2.1-14b"), "{e}");
    }
}
