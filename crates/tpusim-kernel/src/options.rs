//! The kernel options a job can set, each defined once ([`crate::word_enum!`]): which kernel
//! family runs, how a sparse grid is traversed and masked, the exp base, what a timing covers and
//! which direction of attention runs. Every family's defaults are those of the library it models
//! ([`Kernel::defaults`]).

crate::word_enum! {
    /// A kernel family: the library whose kernel (and whose defaults) is simulated.
    pub enum Kernel {
        /// tokamax's Splash attention (openxla/tokamax, `pallas_mosaic_tpu.py`): compacted grid over non-empty blocks, mask on partial blocks only, base-2 exp; default blocks 128 (its heuristic config); fused backward.
        TokamaxSplash = "tokamax-splash",
        /// JAX's Splash attention (`jax.experimental.pallas.ops.tpu.splash_attention`): every grid step after grid shrinking, compute skipped on empty blocks, mask on every computed block (its `_apply_mask_and_soft_cap` masks whatever the block's kind, as its IR reads; --masking partial is a what-if); default blocks 128 (`BlockSizes.get_default`); dq and dkv backward kernels, whose blocks a backward needs given once any block is given.
        Splash = "splash",
        /// MaxDiffusion's dense Splash kernel (mask-free, `custom_splash_attention.py`): every block computed without a mask; q along the lanes (o is (head_dim_v, q)), so block_q is a multiple of 128 or q_len; default blocks 4864 / 1024 / 1024, scoped VMEM limit 64 MiB (MaxDiffusion's compiler flag); backward: JAX Splash's dq and dkv kernels, mask-free, at the forward's blocks unless given.
        SplashDense = "splash-dense",
        /// MaxDiffusion's sparse Splash kernel (Sparse VideoGen): compacted grid over non-empty blocks, mask on partial blocks only; default blocks 128 as the Splash it copies, scoped VMEM limit 64 MiB (MaxDiffusion's compiler flag); backward: JAX Splash's dq and dkv kernels at the forward's blocks unless given. The video case study's own code runs its sparse kernels as two kv-major passes over static tile tables instead (full tiles, then boundary tiles with a computed mask); this one-pass model with loaded mask blocks stands in for them (traces/measured/VALIDATION.md, known misses).
        SparseSplash = "sparse-splash",
        /// JAX's older Pallas TPU flash attention (`jax.experimental.pallas.ops.tpu.flash_attention`): grid (batch, heads, q blocks, kv blocks), blocks above the causal diagonal skipped, the mask applied on every computed block; no mask metadata in SMEM; default blocks 128; a backward needs its blocks given once any block is given; backward modelled as JAX Splash's dq and dkv kernels (its own dq / dkv kernels have the same structure).
        FlashAttention = "flash-attention",
        /// The blocked matmul of the Pallas TPU matmul tutorial: grid (M / bm, N / bn, K / bk); default blocks 128 x 128 x 128.
        PallasMatmul = "pallas-matmul" | "matmul",
        /// XLA's own dot (not a Pallas kernel): modelled as a blocked matmul with 2048 x 2048 output tiles and 512-deep contraction chunks in all of VMEM (XLA's tiling is not public).
        XlaMatmul = "xla-matmul",
        /// An XLA fusion that only moves data (a copy, transpose or element-wise op): HBM bytes read and written at the sustained copy bandwidth. Names calibration-CSV rows of a bare copy; `run`, `tune` and `sweep` refuse it (no kernel to simulate: the copies around a kernel are timed in --scope op and call).
        HbmCopy = "hbm-copy",
    }
}

impl Default for Kernel {
    /// The family a job runs when it names none: tokamax's Splash, the maintained Splash.
    fn default() -> Self {
        Kernel::TokamaxSplash
    }
}

crate::word_enum! {
    /// Which grid steps an attention kernel runs.
    pub enum Traversal {
        /// Every row runs as many steps as the longest row's non-empty blocks (JAX Splash after grid shrinking); surplus steps only pay the step overhead.
        FullGrid = "full-grid",
        /// Only non-empty blocks are grid steps (tokamax's dynamic grid, MaxDiffusion's sparse kernel).
        Compact = "compact",
    }
}

crate::word_enum! {
    /// Which visited blocks apply the element-wise mask.
    pub enum Masking {
        /// Every computed block (with a full mask, those holding padding: as JAX's Splash).
        All = "all",
        /// Partial blocks only; full blocks take a mask-free path.
        Partial = "partial",
        /// Never (a mask-free kernel; results are inexact unless the mask is tile-aligned and unpadded).
        None = "none",
    }
}

crate::word_enum! {
    /// Where the element-wise mask comes from.
    pub enum MaskSource {
        /// Compared from iota-generated positions on the VPU (Splash's mask functions).
        Computed = "computed",
        /// int8 mask blocks loaded from HBM by DMA (Splash's partial mask blocks).
        Loaded = "loaded",
    }
}

crate::word_enum! {
    /// The base of the softmax exponential.
    pub enum Exp {
        /// exp(s - m): the VPU scales every score by log2(e) before the EUP's exp2.
        Natural = "natural",
        /// exp2 with log2(e) folded into q's scale (tokamax's `use_base2_exp`): one VPU multiply per score fewer, one per q element more.
        Base2 = "base2",
    }
}

crate::word_enum! {
    /// What a simulated time covers.
    pub enum Scope {
        /// The Pallas kernel(s) alone (what a kernel benchmark such as the video case study times).
        Kernel = "kernel",
        /// Every XLA op of the library call: the kernel(s) plus the library's transposes, scalings and reductions around them (what tokamax's profiler-based timer sums).
        Op = "op",
        /// What a host timer around one jitted call sees (`block_until_ready`, as axlearn's and Levanter's benchmarks time): every device op of the call, plus the host's dispatch-and-sync cost (the chip model's `[host]` section).
        Call = "call",
    }
}

crate::word_enum! {
    /// The layout the caller's q, k, v and o arrays have.
    pub enum InputLayout {
        /// [batch, heads, sequence, head_dim]: what the Splash kernels take.
        Bhsd = "bhsd",
        /// [batch, sequence, heads, head_dim]: a wrapper (tokamax's API, axlearn's and Levanter's Splash layers) swaps the sequence and head axes of q, k and v before the kernel and of o after it; counted in scope `op` and `call`.
        Bshd = "bshd",
    }
}

crate::word_enum! {
    /// Which pass of attention runs.
    pub enum Direction {
        /// The forward pass.
        Fwd = "fwd",
        /// The backward pass alone (what `jax.grad` runs after a forward that saved residuals).
        Bwd = "bwd",
        /// The forward with residuals, then the backward: one training step of the layer.
        FwdBwd = "fwd+bwd",
    }
}

impl Direction {
    /// Parses the measurement CSV's `direction` words too: `bwd(dq,dk,dv)` is the backward.
    ///
    /// # Errors
    /// [`tpusim_model::words::WordError`] listing the words.
    pub fn from_measurement(word: &str) -> Result<Direction, tpusim_model::words::WordError> {
        let w = word.trim();
        if w.starts_with("bwd(") && w.ends_with(')') {
            return Ok(Direction::Bwd);
        }
        w.parse().map_err(|e: tpusim_model::words::WordError| tpusim_model::words::WordError { allowed: format!("{}, or bwd(dq,dk,dv)", e.allowed), ..e })
    }
}

pub use tpusim_model::KernelKind;

/// Block sizes a family uses when a job gives none (the library's own defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DefaultBlocks {
    /// block_q (attention) or block_m (matmul).
    pub q: u64,
    /// block_kv (attention) or block_n (matmul).
    pub kv: u64,
    /// block_kv_compute (attention; `None`: equal to block_kv) or block_k (matmul).
    pub compute: Option<u64>,
}

/// The defaults of a kernel family, and what its library says about them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FamilyDefaults {
    /// Attention, matmul or copy.
    pub kind: KernelKind,
    /// Where the defaults come from (library, file, function).
    pub source: &'static str,
    /// Forward blocks.
    pub blocks: DefaultBlocks,
    /// Traversal of a sparse grid.
    pub traversal: Traversal,
    /// Which blocks are masked.
    pub masking: Masking,
    /// Where the mask comes from.
    pub mask_source: MaskSource,
    /// Exp base.
    pub exp: Exp,
    /// Whether the compiler's experimental (LP) scheduler flag is set.
    pub experimental_scheduler: bool,
    /// Backward blocks (dkv kernel, or the fused kernel): q, kv, kv compute.
    pub bwd_blocks: DefaultBlocks,
    /// Backward dq-kernel blocks (unfused backward): q, kv.
    pub dq_blocks: (u64, u64),
    /// Whether the backward is one fused dq/dk/dv kernel.
    pub fused_bwd: bool,
    /// Whether the forward marks its head grid dimension "parallel" (split over a megacore
    /// device's TensorCores); batch, when vmapped, is always parallel.
    pub heads_parallel: bool,
    /// Whether the library wraps the kernel in transposes and scalings (tokamax's
    /// sequence-major API, which takes only [`InputLayout::Bshd`]), counted under `--scope op`.
    pub transposes_around: bool,
    /// The layout the library's API takes by default.
    pub input_layout: InputLayout,
    /// The scoped VMEM limit the library compiles its kernels with, MiB (`None`: the chip's
    /// default scoped limit).
    pub vmem_limit_mib: Option<f64>,
    /// Where the backward's blocks come from when a job does not give them.
    pub bwd_rule: BwdRule,
    /// What `block_kv_compute` is when a job gives `block_kv` but not it.
    pub compute_rule: ComputeRule,
}

/// How a library sets `block_kv_compute` when its caller gives `block_kv` alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ComputeRule {
    /// `block_kv_compute` = `block_kv` (JAX's `BlockSizes.__post_init__`, MaxDiffusion's
    /// `_BlockSizes` and its `get_flash_block_sizes`).
    BlockKv,
    /// The library requires it (tokamax's op `Config` has no default): tpusim takes the largest
    /// multiple of 128 dividing `block_kv` that fits the scoped VMEM limit, as a tuner would.
    LargestThatFits,
}

/// What a library does with backward block sizes its caller did not give.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BwdRule {
    /// The backward has its own defaults, whatever the forward's blocks (tokamax: the vjp op's
    /// heuristic config, `pallas_mosaic_tpu_vjp.py` `_get_heuristics_config`, blocks 128).
    OwnDefaults,
    /// The backward takes the forward's blocks (MaxDiffusion's `get_flash_block_sizes`:
    /// block_q_dkv and block_q_dq = block_q, block_kv_dkv and block_kv_dq = block_kv,
    /// block_kv_dkv_compute = block_kv_compute).
    InheritForward,
    /// Block sizes given without the backward's cannot run a backward (JAX's
    /// `BlockSizes.has_backward_blocks`: "Need to specify backward blocks."); with no block given
    /// at all, `BlockSizes.get_default()` sets every block, the backward's included, to 128.
    Required,
}

const B128: DefaultBlocks = DefaultBlocks { q: 128, kv: 128, compute: Some(128) };

impl Kernel {
    /// What kind of computation this family is.
    pub fn kind(self) -> KernelKind {
        self.defaults().kind
    }

    /// The options of an attention configuration this family's library has no setting for, each
    /// as `name value (the family runs default)`; empty when the library runs the configuration
    /// as it is. Every family's kernel fixes its grid traversal and which blocks it masks; the exp
    /// base is a setting of tokamax's only (`use_base2_exp`); JAX's flash attention computes its
    /// causal mask and loads none. With a full mask, masking `all` and
    /// `partial` do the same work (only padding is masked). tpusim times the others as design
    /// what-ifs: a report says so in a note, `tpusim tune` marks them.
    pub fn what_ifs(self, traversal: Traversal, masking: Masking, mask_source: MaskSource, exp: Exp, full_mask: bool) -> Vec<String> {
        let d = self.defaults();
        if d.kind != KernelKind::Attention {
            return Vec::new();
        }
        let mut out = Vec::new();
        if traversal != d.traversal {
            out.push(format!("traversal {traversal} ({self} runs {})", d.traversal));
        }
        let same_work = full_mask && masking != Masking::None && d.masking != Masking::None;
        if masking != d.masking && !same_work {
            out.push(format!("masking {masking} ({self} runs {})", d.masking));
        }
        // JAX's flash attention computes its causal mask; it takes no mask blocks to load.
        if self == Kernel::FlashAttention && mask_source == MaskSource::Loaded && !full_mask {
            out.push(format!("mask_source {mask_source} ({self} computes its causal mask)"));
        }
        if exp != d.exp && self != Kernel::TokamaxSplash {
            out.push(format!("exp {exp} ({self} runs {})", d.exp));
        }
        out
    }

    /// The family's defaults (module docs): the library's own rules, never a workload's.
    pub fn defaults(self) -> FamilyDefaults {
        let attention = FamilyDefaults {
            kind: KernelKind::Attention,
            source: "",
            blocks: B128,
            traversal: Traversal::FullGrid,
            masking: Masking::Partial,
            mask_source: MaskSource::Computed,
            exp: Exp::Natural,
            experimental_scheduler: false,
            bwd_blocks: B128,
            dq_blocks: (128, 128),
            fused_bwd: false,
            heads_parallel: true,
            transposes_around: false,
            vmem_limit_mib: None,
            bwd_rule: BwdRule::Required,
            compute_rule: ComputeRule::BlockKv,
            input_layout: InputLayout::Bhsd,
        };
        // MaxDiffusion compiles with `--xla_tpu_scoped_vmem_limit_kib=65536` (its README's and
        // end_to_end scripts' LIBTPU_INIT_ARGS) and derives backward blocks from the forward's.
        let maxdiffusion = FamilyDefaults { vmem_limit_mib: Some(64.0), bwd_rule: BwdRule::InheritForward, ..attention };
        match self {
            Kernel::TokamaxSplash => FamilyDefaults {
                source: "openxla/tokamax pallas_mosaic_tpu.py (_get_heuristics_config: blocks 128, base-2 exp, experimental scheduler on; its Config requires block_kv_compute) and splash_attention_kernel.py (dynamic grid over active blocks, fused backward)",
                traversal: Traversal::Compact,
                exp: Exp::Base2,
                experimental_scheduler: true,
                fused_bwd: true,
                transposes_around: true,
                input_layout: InputLayout::Bshd,
                bwd_rule: BwdRule::OwnDefaults,
                compute_rule: ComputeRule::LargestThatFits,
                ..attention
            },
            Kernel::Splash => FamilyDefaults {
                source: "jax-ml/jax splash_attention_kernel.py (BlockSizes.get_default: every block 128, block_kv_compute = block_kv when unset; use_fused_bwd_kernel False; grid shrinking; the mask applied on every computed block; a backward needs the backward blocks)",
                blocks: DefaultBlocks { q: 128, kv: 128, compute: None },
                // `_apply_mask_and_soft_cap` applies the mask on every computed block: a computed
                // mask function is evaluated whatever the block's kind (`should_not_mask` only
                // ORs into a loaded mask block, whose select runs all the same).
                masking: Masking::All,
                ..attention
            },
            Kernel::SplashDense => FamilyDefaults {
                source: "AI-Hypercomputer/maxdiffusion src/maxdiffusion/kernels/custom_splash_attention.py (mask-free; models/attention_flax.py defaults block_q 4864, block_kv 1024, block_kv_compute 1024; scoped VMEM limit 64 MiB from its LIBTPU_INIT_ARGS --xla_tpu_scoped_vmem_limit_kib=65536; backward blocks from the forward's, max_utils.py get_flash_block_sizes)",
                blocks: DefaultBlocks { q: 4864, kv: 1024, compute: Some(1024) },
                masking: Masking::None,
                ..maxdiffusion
            },
            Kernel::SparseSplash => FamilyDefaults {
                source: "AI-Hypercomputer/maxdiffusion sparse Splash kernel (Sparse VideoGen, pull request 480; its kernels/splash_attention fork of tokamax's): a compacted grid of active blocks with a mask-free path on full blocks; blocks default as JAX Splash's; scoped VMEM limit 64 MiB (LIBTPU_INIT_ARGS --xla_tpu_scoped_vmem_limit_kib=65536); backward blocks from the forward's (max_utils.py get_flash_block_sizes). The same pull request's custom_svg_static_range_attention.py runs the case study's exact kernel as two kv-major pallas_calls (full tiles; boundary tiles with the band predicate computed) over padded static tile tables, block_kv_compute 256 by default: not this structure, whose fitted loaded-mask cost stands in for the boundary pass",
                traversal: Traversal::Compact,
                ..maxdiffusion
            },
            Kernel::FlashAttention => FamilyDefaults {
                source: "jax-ml/jax pallas/ops/tpu/flash_attention.py (BlockSizes.get_default: every block 128; grid (batch, heads, q blocks, kv blocks) with the first three parallel; no scalar prefetch (no mask metadata in SMEM); causal blocks above the diagonal skipped, the causal mask applied on every computed block; a backward needs every backward block)",
                masking: Masking::All,
                ..attention
            },
            Kernel::PallasMatmul => FamilyDefaults {
                kind: KernelKind::Matmul,
                source: "jax-ml/jax docs/pallas/tpu/matmul.ipynb (matmul(x, y, bm=128, bk=128, bn=128); grid (M/bm, N/bn, K/bk), first two parallel)",
                ..attention
            },
            Kernel::XlaMatmul => FamilyDefaults {
                kind: KernelKind::Matmul,
                source: "XLA's dot emitter (not public in detail): modelled as a blocked matmul with 2048 x 2048 output tiles and 512-deep contraction, the smallest square tiles whose arithmetic intensity (1024 FLOP/byte) clears v6e's and v7x's machine balance",
                blocks: DefaultBlocks { q: 2048, kv: 2048, compute: Some(512) },
                ..attention
            },
            Kernel::HbmCopy => FamilyDefaults {
                kind: KernelKind::Copy,
                source: "an XLA data-movement fusion: bytes read plus bytes written at the sustained HBM bandwidth",
                ..attention
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_has_a_source_and_sane_blocks() {
        for k in Kernel::ALL {
            let d = k.defaults();
            assert!(!d.source.is_empty(), "{k}");
            assert!(d.blocks.q >= 8 && d.blocks.kv >= 128, "{k}");
            assert!(!k.help().is_empty(), "{k}");
        }
    }

    #[test]
    fn what_ifs_are_the_options_a_library_has_no_setting_for() {
        // Each family's own options run as they are.
        for k in Kernel::ALL {
            let d = k.defaults();
            assert!(k.what_ifs(d.traversal, d.masking, d.mask_source, d.exp, false).is_empty(), "{k}");
        }
        // A fresh user's finding: flash-attention ran (and tune ranked first) a compacted grid
        // with partial masking and loaded mask blocks, which JAX's flash attention cannot run.
        let w = Kernel::FlashAttention.what_ifs(Traversal::Compact, Masking::Partial, MaskSource::Loaded, Exp::Base2, false);
        assert_eq!(w.len(), 4, "{w:?}");
        assert!(w[0].starts_with("traversal compact (flash-attention runs full-grid)"), "{w:?}");
        // tokamax sets its exp base (use_base2_exp); with a full mask, all and partial are the
        // same work.
        assert!(Kernel::TokamaxSplash.what_ifs(Traversal::Compact, Masking::All, MaskSource::Computed, Exp::Natural, true).is_empty());
        assert_eq!(Kernel::Splash.what_ifs(Traversal::FullGrid, Masking::None, MaskSource::Computed, Exp::Natural, true).len(), 1);
        assert!(Kernel::PallasMatmul.what_ifs(Traversal::Compact, Masking::None, MaskSource::Loaded, Exp::Base2, false).is_empty());
    }

    #[test]
    fn measurement_direction_words() {
        assert_eq!(Direction::from_measurement("bwd(dq,dk,dv)").unwrap(), Direction::Bwd);
        assert_eq!(Direction::from_measurement("fwd").unwrap(), Direction::Fwd);
        assert_eq!(Direction::from_measurement("fwd+bwd").unwrap(), Direction::FwdBwd);
        let e = Direction::from_measurement("sideways").unwrap_err().to_string();
        assert!(e.contains("fwd, bwd or fwd+bwd, or bwd(dq,dk,dv)"), "{e}");
    }
}
