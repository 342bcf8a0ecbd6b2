//! Workloads for tpusim: attention and matmul calls, attention masks, and tile classification.
//!
//! This crate knows nothing about chips or kernels. It describes *what* is computed: an
//! [`AttentionCall`] (shapes and a [`Mask`]) or a [`MatmulCall`]; and it classifies a mask at a
//! tiling ([`tiles`]) into empty, partial and full tiles with exact kept-pair counts, block by
//! block, never materialising an N x N mask.
//!
//! Of the workspace it depends on `tpusim-io` alone (for the words of a mask file's parse error,
//! `tpusim_io::plain_error`).

pub mod mask;
pub mod tiles;

pub use mask::{Mask, MaskError, VideoMask, VideoOrder, VideoWindow};
pub use tiles::{TileGrid, TileKind, TileRun, TileStats};

use serde::Serialize;

/// An error in a workload description: the field, its value and what is allowed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field} = {value}: {allowed}")]
pub struct WorkloadError {
    /// The field (CLI flag or trace key), e.g. `--heads`.
    pub field: String,
    /// The offending value.
    pub value: String,
    /// What is allowed.
    pub allowed: String,
}

impl WorkloadError {
    /// Builds an error.
    pub fn new(field: &str, value: impl ToString, allowed: &str) -> Self {
        WorkloadError { field: field.to_string(), value: value.to_string(), allowed: allowed.to_string() }
    }
}

/// Largest sequence length, batch or head count accepted (2^32): beyond it pair counts
/// could overflow 64-bit arithmetic.
pub const MAX_DIM: u64 = 1 << 32;

/// Most query heads one call may have (2^20); per-head state is kept per head.
pub const MAX_HEADS: u64 = 1 << 20;

/// Largest head dimension (of q and k, or of v and o) accepted.
pub const MAX_HEAD_DIM: u64 = 4096;

/// Most score pairs (batch x heads x q_len x kv_len) one call may have: 2^64 / 1024, so that
/// FLOP and byte counts stay within 64-bit arithmetic.
pub const MAX_PAIRS: u128 = (u64::MAX as u128) / 1024;

/// One forward multi-head attention call: q[B, Hq, Sq, d] x k[B, Hkv, Skv, d] -> o[B, Hq, Sq, dv],
/// bf16 inputs and outputs, with a mask over (q position, kv position).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AttentionCall {
    /// Batch size B.
    pub batch: u64,
    /// Query heads Hq.
    pub q_heads: u64,
    /// Key/value heads Hkv (Hq must be a multiple; Hkv < Hq is GQA/MQA).
    pub kv_heads: u64,
    /// Query sequence length Sq (tokens).
    pub q_len: u64,
    /// Key/value sequence length Skv (tokens).
    pub kv_len: u64,
    /// Head dimension d of q and k.
    pub head_dim: u64,
    /// Head dimension dv of v and o.
    pub head_dim_v: u64,
    /// Which (q, kv) pairs are kept.
    #[serde(serialize_with = "mask::serialize_display")]
    pub mask: Mask,
}

impl AttentionCall {
    /// The built-in default workload: Wan 2.1 14B at 720p, one v6e chip's share: 1 x 10 heads x
    /// 75,600 tokens x head_dim 128, full mask (video-diffusion-case.md).
    pub fn video_default() -> Self {
        AttentionCall {
            batch: 1,
            q_heads: 10,
            kv_heads: 10,
            q_len: 75_600,
            kv_len: 75_600,
            head_dim: 128,
            head_dim_v: 128,
            mask: Mask::Full,
        }
    }

    /// Checks sizes: all positive, heads at most [`MAX_HEADS`], head dims at most
    /// [`MAX_HEAD_DIM`], the others at most [`MAX_DIM`], at most [`MAX_PAIRS`] score pairs,
    /// q_heads a multiple of kv_heads, a
    /// per-head mask listing one mask per q head or per kv head, and the mask itself
    /// ([`Mask::validate`], and [`Mask::check_lengths`]: file masks made for these lengths,
    /// video volumes of exactly q_len = kv_len tokens).
    ///
    /// # Errors
    /// [`WorkloadError`] naming the flag.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        // Each size with the largest value the simulator accepts, so that the stated range is
        // the enforced one.
        for (field, v, max) in [
            ("`batch`", self.batch, MAX_DIM),
            ("`heads`", self.q_heads, MAX_HEADS),
            ("`kv_heads`", self.kv_heads, MAX_HEADS),
            ("`q_len`", self.q_len, MAX_DIM),
            ("`kv_len`", self.kv_len, MAX_DIM),
            ("`head_dim`", self.head_dim, MAX_HEAD_DIM),
            ("`head_dim_v`", self.head_dim_v, MAX_HEAD_DIM),
        ] {
            if v == 0 || v > max {
                let hint = if field == "`heads`" && v > max { " (use `batch` for more independent heads)" } else { "" };
                return Err(WorkloadError::new(field, v, &format!("expected a whole number from 1 to {max}{hint}")));
            }
        }
        if !self.q_heads.is_multiple_of(self.kv_heads) {
            return Err(WorkloadError::new(
                "`kv_heads`",
                self.kv_heads,
                &format!("must divide `heads` ({}) (GQA groups q heads evenly over kv heads)", self.q_heads),
            ));
        }
        let pairs = (self.q_len as u128) * (self.kv_len as u128) * (self.batch as u128) * (self.q_heads as u128);
        if pairs > MAX_PAIRS {
            // Named by its largest factor (the one a user most likely mistyped).
            let (field, value) = if self.batch > self.q_len.max(self.kv_len) && self.batch >= self.q_heads {
                ("`batch`", self.batch.to_string())
            } else if self.q_heads > self.q_len.max(self.kv_len) {
                ("`heads`", self.q_heads.to_string())
            } else if self.q_len == self.kv_len {
                ("`q_len`", self.q_len.to_string())
            } else {
                ("`q_len`", format!("{} (and `kv_len` {})", self.q_len, self.kv_len))
            };
            return Err(WorkloadError::new(
                field,
                value,
                &format!(
                    "batch x heads x q_len x kv_len = {} x {} x {} x {} = {pairs} score pairs, {} more than the at most {MAX_PAIRS} (2^64 / 1024, so that FLOP and byte counts stay within 64-bit arithmetic) a call may have: give a shorter sequence, fewer heads or a smaller batch",
                    self.batch, self.q_heads, self.q_len, self.kv_len, pairs - MAX_PAIRS
                ),
            ));
        }
        if let Mask::PerHead(list) = &self.mask {
            let n = list.len() as u64;
            if n != self.q_heads && n != self.kv_heads {
                return Err(WorkloadError::new(
                    "`mask`",
                    format!("{} ({n} per-head masks)", self.mask),
                    &format!("a per-head mask lists one mask per q head ({}) or per kv head ({})", self.q_heads, self.kv_heads),
                ));
            }
        }
        if let Mask::Array(a) = &self.mask {
            let n = a.heads();
            if n != 1 && n != self.q_heads && n != self.kv_heads {
                return Err(WorkloadError::new(
                    "`mask`",
                    format!("{} ({n} heads)", self.mask),
                    &format!("an array mask has 1 head (shared) or one per q head ({}) or per kv head ({})", self.q_heads, self.kv_heads),
                ));
            }
        }
        self.mask.validate().map_err(|e| WorkloadError::new("`mask`", self.mask.to_string(), &e.to_string()))?;
        self.mask
            .check_lengths(self.q_len, self.kv_len)
            .map_err(|e| WorkloadError::new("`mask`", self.mask.to_string(), &e.to_string()))?;
        Ok(())
    }

    /// The mask that q head `h` (0-based, below `q_heads`) uses, resolving per-head lists by q
    /// head (a list of `q_heads` masks) or by kv head group (a list of `kv_heads` masks: q head
    /// h uses entry h / (q_heads / kv_heads)).
    ///
    /// # Panics
    /// If `h >= q_heads` or the call has not passed [`AttentionCall::validate`] (a per-head
    /// list or an array mask with the wrong number of heads).
    pub fn mask_for_head(&self, h: u64) -> &Mask {
        match &self.mask {
            Mask::PerHead(list) => {
                if list.len() as u64 == self.q_heads {
                    &list[h as usize]
                } else {
                    &list[(h / (self.q_heads / self.kv_heads)) as usize]
                }
            }
            Mask::Array(a) if a.heads() > 1 => {
                let i = if a.heads() == self.q_heads { h } else { h / (self.q_heads / self.kv_heads) };
                a.view(i).expect("validate checks the array's head count")
            }
            m => m,
        }
    }

    /// Matmul FLOPs of dense attention, 2 x B x Hq x Sq x Skv x (d + dv)
    /// (attention-kernels.md), before any masking.
    pub fn dense_flops(&self) -> f64 {
        2.0 * (self.batch * self.q_heads) as f64 * self.q_len as f64 * self.kv_len as f64 * (self.head_dim + self.head_dim_v) as f64
    }
}

/// One bf16 matmul C[M, N] = A[M, K] x B[K, N] with f32 accumulation and bf16 output.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MatmulCall {
    /// Rows of A and C.
    pub m: u64,
    /// Columns of B and C.
    pub n: u64,
    /// Contraction length.
    pub k: u64,
}

impl MatmulCall {
    /// Checks that every size is from 1 to [`MAX_DIM`] and M x N x K fits 64 bits.
    ///
    /// # Errors
    /// [`WorkloadError`] naming the flag.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        for (field, v) in [("`m`", self.m), ("`n`", self.n), ("`k`", self.k)] {
            if v == 0 || v > MAX_DIM {
                return Err(WorkloadError::new(field, v, &format!("expected a whole number from 1 to {MAX_DIM}")));
            }
        }
        if (self.m as u128) * (self.n as u128) * (self.k as u128) > (u64::MAX as u128) / 4 {
            return Err(WorkloadError::new("`m`", self.m, "M x N x K must stay below 4.6e18"));
        }
        Ok(())
    }

    /// 2 x M x N x K.
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_the_video_case() {
        let w = AttentionCall::video_default();
        w.validate().unwrap();
        assert_eq!(w.q_len, 75_600);
        assert!((w.dense_flops() - 4.0 * 10.0 * 75_600f64.powi(2) * 128.0).abs() < 1.0);
    }

    #[test]
    fn zero_and_gqa_errors_name_the_field() {
        let mut w = AttentionCall::video_default();
        w.q_len = 0;
        assert!(w.validate().unwrap_err().to_string().contains("`q_len`"));
        let mut w = AttentionCall::video_default();
        w.kv_heads = 3;
        let e = w.validate().unwrap_err().to_string();
        assert!(e.contains("`kv_heads`") && e.contains("divide"), "{e}");
        let m = MatmulCall { m: 1, n: 0, k: 1 };
        assert!(m.validate().unwrap_err().to_string().contains("`n`"));
    }

    #[test]
    fn huge_sizes_are_errors_not_overflows() {
        let mut w = AttentionCall::video_default();
        w.q_len = 1 << 32;
        w.kv_len = 1 << 32;
        assert!(w.validate().is_err());
        let m = MatmulCall { m: 1 << 32, n: 1 << 32, k: 1 << 32 };
        assert!(m.validate().is_err());
    }
}
