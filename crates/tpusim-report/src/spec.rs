//! [`JobSpec`]: the one description of "what to simulate" shared by the CLI flags, trace files,
//! measurement rows, sweep points and the tuner. Every field is optional; unset fields take the
//! documented defaults when [`JobSpec::build`] turns the spec into a [`Job`] for a chip.
//!
//! Trace files (`traces/*.toml`) are JobSpecs in TOML with the same keys as the CLI flags (with
//! underscores): unknown keys are errors.

use crate::Job;
use serde::{Deserialize, Serialize};
use tpusim_chip::ChipModel;
use tpusim_kernel::{splash, MaskSource, Masking, MatmulConfig, SplashConfig, Traversal};
use tpusim_workload::{AttentionCall, Mask, MatmulCall};

/// An error in a job description, naming the field, its value and what is allowed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct SpecError(pub String);

/// What to simulate: kernel, workload and kernel options. Field names match the CLI flags.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// Chip preset or TOML path (default `v6e`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chip: Option<String>,
    /// Chip overrides as `SECTION.FIELD=VALUE`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub set: Vec<String>,
    /// `splash` (default) or `matmul`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    /// Batch size (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<u64>,
    /// Query heads (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heads: Option<u64>,
    /// Key/value heads (default: heads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_heads: Option<u64>,
    /// q and kv length (default 75,600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq_len: Option<u64>,
    /// q length (default seq_len).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub q_len: Option<u64>,
    /// kv length (default seq_len).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_len: Option<u64>,
    /// Head dimension of q, k (default 128).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<u64>,
    /// Head dimension of v, o (default head_dim).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim_v: Option<u64>,
    /// Mask in the `--mask` grammar (default `full`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask: Option<String>,
    /// Rows of q per block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_q: Option<u64>,
    /// Rows of k/v per block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_kv: Option<u64>,
    /// Inner sub-tile width.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_kv_compute: Option<u64>,
    /// `full-grid` (default) or `compact`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traversal: Option<String>,
    /// `all` (default), `partial` or `none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub masking: Option<String>,
    /// `computed` (default) or `loaded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask_source: Option<String>,
    /// Round the mask to whole tiles (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tile_align: Option<bool>,
    /// Scoped VMEM limit, MiB (default: the chip's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vmem_limit_mib: Option<f64>,
    /// Matmul M.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub m: Option<u64>,
    /// Matmul N.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u64>,
    /// Matmul K.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k: Option<u64>,
    /// Matmul block M.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_m: Option<u64>,
    /// Matmul block N.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_n: Option<u64>,
    /// Matmul block K.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_k: Option<u64>,
}

fn err<T>(field: &str, value: impl std::fmt::Display, allowed: &str) -> Result<T, SpecError> {
    Err(SpecError(format!("{field} = {value}: {allowed}")))
}

impl JobSpec {
    /// Reads a trace file (TOML JobSpec).
    ///
    /// # Errors
    /// [`SpecError`] naming the file and the key for unreadable files, malformed TOML and unknown
    /// keys.
    pub fn from_toml_file(path: &str) -> Result<Self, SpecError> {
        let text = std::fs::read_to_string(path).map_err(|e| SpecError(format!("cannot read trace {path}: {e}")))?;
        toml::from_str(&text).map_err(|e| SpecError(format!("trace {path}: {}", e.to_string().split_whitespace().collect::<Vec<_>>().join(" "))))
    }

    /// Fields set in `over` replace those of `self` (CLI flags over a trace file).
    /// `--seq-len` on top replaces a base's `q_len` / `kv_len`, and `--q-len` / `--kv-len` on top
    /// replace a base's `seq_len` (the other length keeps the base's value).
    pub fn overlay(&self, over: &JobSpec) -> JobSpec {
        let mut base = self.clone();
        if over.seq_len.is_some() {
            base.q_len = None;
            base.kv_len = None;
        }
        if over.q_len.is_some() || over.kv_len.is_some() {
            if let Some(l) = base.seq_len.take() {
                base.q_len = base.q_len.or(Some(l));
                base.kv_len = base.kv_len.or(Some(l));
            }
        }
        let base = &base;
        macro_rules! pick {
            ($($f:ident),*) => { JobSpec { $($f: over.$f.clone().or_else(|| base.$f.clone()),)* set: [base.set.clone(), over.set.clone()].concat() } };
        }
        pick!(
            chip, kernel, batch, heads, kv_heads, seq_len, q_len, kv_len, head_dim, head_dim_v, mask, block_q, block_kv,
            block_kv_compute, traversal, masking, mask_source, tile_align, vmem_limit_mib, m, n, k, block_m, block_n, block_k
        )
    }

    /// The chip this spec names, with its overrides applied (default `v6e`).
    ///
    /// # Errors
    /// [`SpecError`] with the chip model's error (unknown chip, bad override).
    pub fn chip(&self) -> Result<ChipModel, SpecError> {
        let mut chip = ChipModel::load(self.chip.as_deref().unwrap_or("v6e")).map_err(|e| SpecError(e.to_string()))?;
        for s in &self.set {
            let (k, v) = s
                .split_once('=')
                .ok_or_else(|| SpecError(format!("--set {s}: expected SECTION.FIELD=VALUE, e.g. hbm.bandwidth_gb_per_s=3276")))?;
            chip = chip.with_override(k.trim(), v.trim()).map_err(|e| SpecError(e.to_string()))?;
        }
        Ok(chip)
    }

    fn blocks_given(&self) -> bool {
        self.block_q.is_some() || self.block_kv.is_some() || self.block_kv_compute.is_some()
    }

    /// Builds the job for a chip.
    ///
    /// Defaults: the built-in video workload (1 x 10 heads x 75,600 tokens, head_dim 128, full
    /// mask); for that shape (75,600 x 75,600 tokens, head_dim 128) with no block fields,
    /// MaxDiffusion's v6e blocks for it (block_q 3024, block_kv 2048); otherwise blocks by
    /// [`SplashConfig::defaults_for`]; block_kv_compute by [`splash::default_compute`].
    /// `q_len` and `kv_len` come together (or as `seq_len`). Options default
    /// to JAX Splash's: full-grid traversal, masking all, computed masks, no alignment.
    ///
    /// # Errors
    /// [`SpecError`] naming the field: contradictory fields, unknown option words, invalid
    /// sizes or masks. Block rules and VMEM are checked later, by lowering.
    pub fn build(&self, chip: &ChipModel) -> Result<Job, SpecError> {
        let vmem_limit_bytes = match self.vmem_limit_mib {
            None => None,
            Some(v) if v.is_finite() && v > 0.0 && v <= chip.vmem.size_mib.value => Some((v * 1048576.0) as u64),
            Some(v) => {
                return err(
                    "--vmem-limit-mib",
                    v,
                    &format!("expected a number above 0 and at most the chip's physical VMEM ({} MiB)", chip.vmem.size_mib.value),
                )
            }
        };
        if self.seq_len == Some(0) {
            return err("--seq-len", 0, &format!("expected a whole number from 1 to {}", tpusim_workload::MAX_DIM));
        }
        if self.seq_len.is_some() && (self.q_len.is_some() || self.kv_len.is_some()) {
            return err("--seq-len", self.seq_len.unwrap_or(0), "give either --seq-len or --q-len/--kv-len, not both");
        }
        match self.kernel.as_deref().unwrap_or("splash") {
            "matmul" => {
                let attention_only = [
                    ("--heads", self.heads.is_some()),
                    ("--seq-len", self.seq_len.is_some()),
                    ("--mask", self.mask.is_some()),
                    ("--block-q", self.block_q.is_some()),
                    ("--block-kv", self.block_kv.is_some()),
                    ("--traversal", self.traversal.is_some()),
                    ("--masking", self.masking.is_some()),
                ];
                if let Some((f, _)) = attention_only.iter().find(|(_, set)| *set) {
                    return Err(SpecError(format!(
                        "{f} applies to --kernel splash, not --kernel matmul (use --m --n --k --block-m --block-n --block-k)"
                    )));
                }
                let (m, n, k) = match (self.m, self.n, self.k) {
                    (Some(m), Some(n), Some(k)) => (m, n, k),
                    _ => return Err(SpecError("--kernel matmul needs --m, --n and --k".into())),
                };
                let workload = MatmulCall { m, n, k };
                workload.validate().map_err(|e| SpecError(e.to_string()))?;
                let d = MatmulConfig::defaults_for_chip(&workload, chip);
                let config = MatmulConfig {
                    block_m: self.block_m.unwrap_or(d.block_m),
                    block_n: self.block_n.unwrap_or(d.block_n),
                    block_k: self.block_k.unwrap_or(d.block_k),
                    vmem_limit_bytes,
                };
                Ok(Job::Matmul { workload, config })
            }
            "splash" => {
                let matmul_only = [
                    ("--m", self.m),
                    ("--n", self.n),
                    ("--k", self.k),
                    ("--block-m", self.block_m),
                    ("--block-n", self.block_n),
                    ("--block-k", self.block_k),
                ];
                if let Some((f, _)) = matmul_only.iter().find(|(_, v)| v.is_some()) {
                    return Err(SpecError(format!("{f} applies to --kernel matmul, not --kernel splash")));
                }
                let base = AttentionCall::video_default();
                let heads = self.heads.unwrap_or(base.q_heads);
                let head_dim = self.head_dim.unwrap_or(base.head_dim);
                let mask = match &self.mask {
                    Some(s) => Mask::parse(s).map_err(|e| SpecError(format!("--mask: {e}")))?,
                    None => Mask::Full,
                };
                if self.q_len.is_some() != self.kv_len.is_some() {
                    let (given, missing) = if self.q_len.is_some() { ("--q-len", "--kv-len") } else { ("--kv-len", "--q-len") };
                    return err(given, self.q_len.or(self.kv_len).unwrap_or(0), &format!("give {missing} too, or --seq-len for both"));
                }
                let workload = AttentionCall {
                    batch: self.batch.unwrap_or(base.batch),
                    q_heads: heads,
                    kv_heads: self.kv_heads.unwrap_or(heads),
                    q_len: self.seq_len.or(self.q_len).unwrap_or(base.q_len),
                    kv_len: self.seq_len.or(self.kv_len).unwrap_or(base.kv_len),
                    head_dim,
                    head_dim_v: self.head_dim_v.unwrap_or(head_dim),
                    mask,
                };
                workload.validate().map_err(|e| SpecError(e.to_string()))?;
                let mut config = SplashConfig::defaults_for(&workload, chip);
                // The Wan 2.1 720p shape (75,600 tokens, head_dim 128) defaults to MaxDiffusion's v6e
                // blocks for it; block_kv_compute then follows the rule (1024 on v6e).
                let builtin = !self.blocks_given()
                    && (workload.q_len, workload.kv_len, workload.head_dim, workload.head_dim_v)
                        == (base.q_len, base.kv_len, base.head_dim, base.head_dim_v);
                if builtin {
                    config.block_q = 3024;
                    config.block_kv = 2048;
                }
                if let Some(v) = self.block_q {
                    config.block_q = v;
                }
                if let Some(v) = self.block_kv {
                    config.block_kv = v;
                }
                if let Some(t) = &self.traversal {
                    config.traversal = match t.as_str() {
                        "full-grid" => Traversal::FullGrid,
                        "compact" => Traversal::Compact,
                        other => return err("--traversal", other, "expected full-grid or compact"),
                    };
                }
                if let Some(m) = &self.masking {
                    config.masking = match m.as_str() {
                        "all" => Masking::All,
                        "partial" => Masking::Partial,
                        "none" => Masking::None,
                        other => return err("--masking", other, "expected all, partial or none"),
                    };
                }
                if let Some(s) = &self.mask_source {
                    config.mask_source = match s.as_str() {
                        "computed" => MaskSource::Computed,
                        "loaded" => MaskSource::Loaded,
                        other => return err("--mask-source", other, "expected computed or loaded"),
                    };
                }
                if workload.mask.expression_terms().loaded_only {
                    // A block file has no closed form: its blocks can only be loaded.
                    if config.mask_source == MaskSource::Computed && self.mask_source.is_some() {
                        return err(
                            "--mask-source",
                            "computed",
                            "a file mask has no closed form to compute from iota; it can only be loaded (use --mask-source loaded)",
                        );
                    }
                    config.mask_source = MaskSource::Loaded;
                }
                config.tile_align = self.tile_align.unwrap_or(false);
                config.vmem_limit_bytes = vmem_limit_bytes;
                config.block_kv_compute = match self.block_kv_compute {
                    Some(v) => v,
                    None => splash::default_compute(&workload, &config, chip),
                };
                Ok(Job::Splash { workload, config })
            }
            other => err("--kernel", other, "expected splash or matmul"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_spec_is_the_builtin_default_case() {
        let chip = ChipModel::preset("v6e").unwrap();
        match JobSpec::default().build(&chip).unwrap() {
            Job::Splash { workload, config } => {
                assert_eq!(workload, AttentionCall::video_default());
                assert_eq!((config.block_q, config.block_kv, config.block_kv_compute), (3024, 2048, 1024));
            }
            _ => panic!("expected splash"),
        }
    }

    #[test]
    fn unknown_words_and_keys_are_named() {
        let chip = ChipModel::preset("v6e").unwrap();
        let s = JobSpec { traversal: Some("zigzag".into()), ..Default::default() };
        let e = s.build(&chip).unwrap_err().to_string();
        assert!(e.contains("--traversal") && e.contains("zigzag"), "{e}");
        let e = toml::from_str::<JobSpec>("heads = 4\nbogus = 1").unwrap_err().to_string();
        assert!(e.contains("bogus"), "{e}");
    }

    #[test]
    fn overlay_prefers_the_top() {
        let a = JobSpec { heads: Some(4), seq_len: Some(1024), ..Default::default() };
        let b = JobSpec { heads: Some(8), ..Default::default() };
        let c = a.overlay(&b);
        assert_eq!((c.heads, c.seq_len), (Some(8), Some(1024)));
    }
}
