//! Forward Splash Attention (and its sparse descendants and JAX's older flash attention)
//! lowered to grid steps; the backward kernels are in [`bwd`].
//!
//! Grid: (batch x q heads, q blocks, kv steps), run in lexicographic order; batch and heads are
//! the grid's parallel units (tokamax's and JAX's Splash mark heads "parallel", and vmapping over
//! the batch adds a parallel dimension).
//!
//! **Step bodies.** A step's body is the op sequence the kernel runs, written once per family
//! (this module's `ops.rs` for the forward kernels, `bwd_ops.rs` for the backward ones) and
//! priced by the one body builder ([`crate::body`]) that also builds the bodies of kernels read
//! from their Mosaic IR: the same ops, the same cost table ([`crate::body::cost`]), the same
//! [`tpusim_model::SLAB_ROWS`]-row slabs and issue slots. Per computed sub-tile of `block_kv_compute`
//! columns: the `q k^T` matmul on the MXU; on a masked step the mask (the mask function traced
//! from iota positions, a loaded int8 block widened at the chip's fitted cost, segment ids
//! compared) and its select; the row max (element-wise maxima then a cross-lane reduction on the
//! XLU), `s - m`, `exp` on the EUP, the row sum the same way, the cast of p, the `p v` matmul and
//! the rescaled accumulation of o, l and m. A row's first step runs the `init` branch (zeroing
//! m, l and the o accumulator: stores of a constant, one VPU operation per register) and its
//! last the `end` branch (1 / l on the EUP, o scaled and cast, the residuals when returned; JAX's
//! Splash refills its scratch). Each family's differences from JAX's Splash (base-2 exp, v in
//! f32, the residuals) are flags of one program, so a `--set` override or a what-if moves the
//! hand model and the IR path alike.
//!
//! **Carried state.** m, l and the o accumulator are VMEM scratch that consecutive steps of a row
//! update in turn: a step's first load of a slab waits for the previous step's last store of it.
//! Everything else of the next step may overlap (the engine's cross-step pipelining).
//!
//! DMAs: q block (block_q x d bf16) when the (batch, head, q block) index changes; k and v blocks
//! (block_kv x d and block_kv x dv bf16) when the (batch, kv head, kv block) index changes (GQA
//! heads of one group share them); an int8 mask block per masked partial step when masks are
//! loaded (JAX's Splash: int32 blocks, copied when `mask_next` changes, `steps.rs`); the o block
//! (block_q x dv bf16) after a row's last step, with the residuals
//! (logsumexp and max logits, f32, lane-replicated to 128 per q row) when they are returned.
//!
//! Traversals: `full-grid` (JAX Splash after grid shrinking: every row has as many steps as the
//! longest row's non-empty tiles; surplus steps are empty: fixed step cost, no compute, no copy)
//! and `compact` (a grid over non-empty tiles only: tokamax / MaxDiffusion sparse kernels).
//!
//! **Limits.** Blocks follow the (8, 128) rules (MaxDiffusion's mask-free kernel and JAX's
//! backward kernels lay q along the lanes: their q blocks are multiples of 128 or q_len); VMEM holds 32-bit data in (8, 128) tiles, bf16 in (16, 128) and int8 in (32, 128), each last dimension padded to 128 lanes, and counts as
//! [`crate::vmem`] says (over the family's declaration: `family_refs`);
//! the mask metadata Splash prefetches into SMEM must fit SMEM ([`smem_bytes`]); q, k, v and o
//! must fit the device's HBM.

pub mod bwd;
pub(crate) mod bwd_ops;
pub(crate) mod ops;
mod steps;

use crate::ir::{ClassKey, StepBody, StepClass};
pub use crate::options::{Exp, Kernel, MaskSource, Masking, Traversal};
use crate::vmem::VmemBuffer;
use crate::{KernelError, Program, ProgramInfo, TileCounts, VmemBudget};
use tpusim_model::copies::{CopyRule, CopySets};
use tpusim_model::decl::{KernelDecl, RefDecl};
use serde::Serialize;
use std::collections::HashMap;
pub(crate) use steps::{Seg, Steps};
use tpusim_chip::ChipModel;
use tpusim_workload::tiles::{for_each_tile_run_row, TileGrid, TileKind};
use tpusim_workload::{AttentionCall, Mask};

/// Block sizes and strategy of a Splash-style attention kernel (forward and backward).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SplashConfig {
    /// The kernel family simulated (whose library's behaviour the options describe).
    pub kernel: Kernel,
    /// Rows of q per block.
    pub block_q: u64,
    /// Rows of k/v per block (one DMA tile).
    pub block_kv: u64,
    /// Width of the inner matmul/softmax sub-tile; divides block_kv.
    pub block_kv_compute: u64,
    /// Which steps run.
    pub traversal: Traversal,
    /// Which tiles are masked.
    pub masking: Masking,
    /// How the mask is evaluated.
    pub mask_source: MaskSource,
    /// Round the mask to whole tiles first (see `tpusim_workload::tiles`).
    pub tile_align: bool,
    /// The base of the softmax exponential.
    pub exp: Exp,
    /// The compiler's experimental (LP) scheduler flag (tokamax's `use_experimental_scheduler`).
    /// No released pair of measurements differs by it alone beyond noise, so it changes nothing
    /// in the model; it is kept so that configurations read as their library writes them.
    pub experimental_scheduler: bool,
    /// Whether the forward also writes its residuals (logsumexp and max logits).
    pub return_residuals: bool,
    /// The backward kernels' blocks.
    pub bwd: bwd::BwdBlocks,
    /// Scoped VMEM limit in bytes; `None` uses the family's or the chip's default.
    pub vmem_limit_bytes: Option<u64>,
    /// The layout of the caller's q, k, v and o ([`crate::options::InputLayout::Bshd`]: the
    /// wrapper's transposes run in scope `op` and `call`).
    pub input_layout: crate::options::InputLayout,
}

impl SplashConfig {
    /// A kernel family's configuration with its library's defaults ([`Kernel::defaults`]):
    /// blocks, traversal, masking, mask source, exp base, scheduler flag and backward blocks;
    /// `block_kv_compute` = `block_kv` when the family leaves it unset.
    pub fn for_family(kernel: Kernel) -> Self {
        let d = kernel.defaults();
        SplashConfig {
            kernel,
            block_q: d.blocks.q,
            block_kv: d.blocks.kv,
            block_kv_compute: d.blocks.compute.unwrap_or(d.blocks.kv),
            traversal: d.traversal,
            masking: d.masking,
            mask_source: d.mask_source,
            tile_align: false,
            exp: d.exp,
            experimental_scheduler: d.experimental_scheduler,
            return_residuals: false,
            bwd: bwd::BwdBlocks::for_family(kernel),
            vmem_limit_bytes: None,
            input_layout: d.input_layout,
        }
    }

    /// The default family's configuration ([`Kernel::default`]) with the given blocks;
    /// `block_kv_compute` = `block_kv` when `compute` is `None` (every Splash family's rule).
    pub fn with_blocks(block_q: u64, block_kv: u64, compute: Option<u64>) -> Self {
        SplashConfig { block_q, block_kv, block_kv_compute: compute.unwrap_or(block_kv), ..SplashConfig::for_family(Kernel::default()) }
    }

    /// The scoped VMEM limit the kernels are checked against, bytes: the one given, else the
    /// family's ([`crate::options::FamilyDefaults::vmem_limit_mib`], at most the chip's physical
    /// VMEM), else the chip's default.
    pub fn vmem_limit(&self, chip: &ChipModel) -> u64 {
        self.vmem_limit_bytes.unwrap_or_else(|| match self.kernel.defaults().vmem_limit_mib {
            Some(mib) => ((mib * 1048576.0) as u64).min(chip.vmem_size_bytes()),
            None => chip.vmem_limit_bytes(),
        })
    }
}

/// `block_kv_compute` for a configuration whose caller gave `block_kv` alone, by the family's
/// [`crate::options::ComputeRule`]: `block_kv`, or the largest multiple of 128 dividing
/// `block_kv` whose tiling fits the scoped VMEM limit (the smallest candidate when none fits:
/// lowering then reports its VMEM error).
pub fn default_compute(w: &AttentionCall, cfg: &SplashConfig, chip: &ChipModel) -> u64 {
    let bkv = cfg.block_kv;
    if cfg.kernel.defaults().compute_rule == crate::options::ComputeRule::BlockKv || bkv == 0 || !bkv.is_multiple_of(128) {
        return bkv;
    }
    let limit = cfg.vmem_limit(chip);
    (1..=bkv / 128)
        .rev()
        .map(|m| m * 128)
        .filter(|c| bkv.is_multiple_of(*c))
        .find(|&c| vmem_budget(w, &SplashConfig { block_kv_compute: c, ..cfg.clone() }, limit).fits())
        .unwrap_or(128)
}

/// Whether Splash can compute `mask` in the kernel from iota: JAX's computable mask classes
/// (`CausalMask`, `LocalMask` (a band is a symmetric local window), `ChunkedCausalMask`, in
/// `splash_attention_mask.py`; tokamax copies them), or one of them for every head. Any other mask
/// (a sink, a video mask, a union or intersection of several, different masks per head, a file)
/// is a `NumpyMask` or logical combination to Splash: `process_mask` stores its partial blocks as
/// int8 arrays that the kernel loads (`MaskInfo.partial_mask_blocks`).
pub fn computable(mask: &Mask) -> bool {
    match mask {
        Mask::Full | Mask::Causal { .. } | Mask::Local { .. } | Mask::Band { .. } | Mask::Chunked { .. } => true,
        Mask::PerHead(p) => p.windows(2).all(|w| w[0] == w[1]) && p.first().is_none_or(computable),
        _ => false,
    }
}

/// How an op program masks a masked step of tiling `cl` ([`ops::MaskPlan`]): the costliest
/// distinct mask's function when the mask is computed, the partial block when it is loaded
/// (`int8`: the family's blocks are int8), segment ids when the lengths are padded.
pub(crate) fn mask_plan(cl: &Classified, source: MaskSource, any_not_full: bool, int8: bool) -> ops::MaskPlan {
    let terms = |m: &Mask| {
        let t = m.expression_terms();
        t.compares + t.arith + t.combines
    };
    ops::MaskPlan {
        function: (source == MaskSource::Computed).then(|| cl.distinct.iter().filter(|m| !m.is_full()).max_by_key(|m| terms(m)).cloned()).flatten(),
        loaded: source == MaskSource::Loaded && any_not_full,
        int8,
        segments: cl.padded,
    }
}

/// The body of one step of a kernel whose body is an op program ([`ops`]: JAX's Splash, JAX's
/// flash attention), shared between lowerings ([`crate::body::cached_pair`]: the step and its
/// row's last step are built together).
///
/// The key leaves the declaration out: it names the refs the body touches, which the step's
/// arguments and the family decide, and a body does not depend on their indices.
fn op_body(kernel: Kernel, decl: &KernelDecl, s: &ops::FwdStep<'_>) -> StepBody {
    let key = |last: bool| format!("{kernel:?}{:?}", ops::FwdStep { last, ..s.clone() });
    crate::body::cached_pair([key(false), key(true)], usize::from(s.last), || {
        if kernel == Kernel::FlashAttention {
            ops::jax_flash_fwd(decl, s)
        } else {
            ops::splash_fwd(decl, s)
        }
    })
}

/// A step class's body arguments: (masked, first, runs, last); `None` for the empty step's
/// class, whose body stays empty.
pub(crate) type BodyArgs = Option<(bool, bool, bool, bool)>;

/// A forward's step class by (tile kind: 0 partial, 1 full; first of its row; last of its row).
type ClassOf = [[[u32; 2]; 2]; 2];

/// Gives each class some step of the grid runs (`used`, from the step stream) the body `body`
/// builds from its arguments; a class no step runs keeps its empty body (lowering builds only
/// the bodies it simulates).
pub(crate) fn build_used_bodies(classes: &mut [StepClass], args: &[BodyArgs], used: &[bool], body: impl Fn(bool, bool, bool, bool) -> StepBody) {
    for ((class, args), &used) in classes.iter_mut().zip(args).zip(used) {
        if let (Some((masked, first, runs, last)), true) = (*args, used) {
            class.body = body(masked, first, runs, last);
        }
    }
}

/// Whether a mask keeps a pair by q - k alone, so that blocks at equal q0 - k0 are identical
/// (what lets [`steps`] name a deduplicated mask block by its offset).
pub(crate) fn diagonal_invariant(m: &Mask) -> bool {
    match m {
        Mask::Full | Mask::Causal { .. } | Mask::Local { .. } | Mask::Band { .. } => true,
        Mask::Union(p) | Mask::Intersect(p) => p.iter().all(diagonal_invariant),
        _ => false,
    }
}

/// Whether the lengths are padded to the blocks (the padding is masked with segment ids, whose
/// blocks the kernel then also holds in VMEM).
pub(crate) fn padded_lengths(w: &AttentionCall, block_q: u64, block_kv: u64) -> bool {
    !w.q_len.is_multiple_of(block_q) || !w.kv_len.is_multiple_of(block_kv)
}

/// Whether a tiling's partial blocks are masked with int8 blocks loaded from HBM.
pub(crate) fn loads_mask(w: &AttentionCall, cfg: &SplashConfig) -> bool {
    let loaded = cfg.mask_source == MaskSource::Loaded || w.mask.expression_terms().loaded_only;
    loaded && cfg.masking != Masking::None && !w.mask.is_full()
}

/// A window or operand of a hand-written family's `pallas_call`, with the step-stream event its
/// block index follows ([`steps::event`]; `None`: never copied by the pipeline).
pub(crate) type Tagged = (RefDecl, Option<u32>);

/// The forward kernel's `pallas_call` as `cfg.kernel`'s family declares it (the grid left for
/// the lowering to fill in), each window with the step-stream event its block index follows;
/// blocks as the kernel's refs see them (a squeezed `None` dimension as 1):
///
/// * JAX's Splash (`splash_attention_kernel.py` `_splash_attention_forward`): prefetch tables
///   `data_next`, `block_mask` (and `mask_next` when masks are loaded); windows q (1 x block_q x
///   d), k, v (1 x block_kv x d, dv), bf16; when the lengths are padded the segment ids (block_q
///   x 128 and 8 x block_kv, int32); the mask block (1 x block_q x block_kv, its bool blocks as
///   int32) when masks are loaded, the q positions (block_q x 128 int32) when a mask is
///   computed; outputs m and l (block_q x 128 f32) and o_scratch (block_q x dv f32) with a
///   constant block index, written back once after the grid's last step and kept in one buffer
///   (as the kernel's IR has them), o (1 x block_q x dv bf16) and, with residuals, logsumexp (1
///   x block_q x 128 f32); in the body the score tile (block_q x block_kv_compute f32), p (f32)
///   and v cast to f32 (block_kv_compute x dv).
/// * tokamax's Splash and MaxDiffusion's sparse kernel (tokamax's fork;
///   `_splash_attention_forward`): the same inputs (the mask block int8); outputs o and, with
///   residuals, logsumexp and max logits (block_q x 128 f32); scratch m and l (block_q x 128 f32)
///   and o (block_q x dv f32); in the body the score tile and p (bf16).
/// * JAX's older flash attention (`flash_attention.py`): windows q, k, v, the segment ids when
///   padded, o, l and m (block_q x 128 f32) with residuals; scratch m, l (block_q x 128 f32) and
///   acc (block_q x dv f32) unless one kv step covers the sequence (block_kv_compute = kv_len);
///   the score tile (block_q x block_kv_compute f32).
/// * MaxDiffusion's mask-free kernel (`custom_splash_attention.py`), which computes the scores
///   kv-major (k q^T): windows q, k, v; outputs m and l (8 x block_q f32), o_scratch (dv x
///   block_q f32) with constant block indices, and o (dv x block_q bf16); with residuals m and l
///   of the row (8 x block_q f32); the score tile (block_kv_compute x block_q f32).
pub(crate) fn family_refs(w: &AttentionCall, cfg: &SplashConfig) -> (Vec<Tagged>, Vec<VmemBuffer>) {
    use crate::dtype::Dtype::{Bf16, F32, I32, I8};
    use steps::event::{FINAL, KJ, KV, MASK, OUT, Q, QI};
    use tpusim_model::expr::Expr::{Const, Grid};
    let (bq, bkv, c, d, dv) = (cfg.block_q, cfg.block_kv, cfg.block_kv_compute, w.head_dim, w.head_dim_v);
    // Index maps for reports: the head and q block from the grid, the kv block from the step
    // stream (data_next); the generator supplies the events (module docs of `steps`).
    let at = |dims: &[Option<usize>]| dims.iter().map(|g| g.map_or(Const(0), Grid)).collect::<Vec<_>>();
    let input = |name: &str, shape: &[u64], dtype, map: &[Option<usize>]| RefDecl::input(name, shape, dtype, at(map));
    let output = |name: &str, shape: &[u64], dtype, map: &[Option<usize>]| RefDecl::output(name, shape, dtype, at(map));
    let (h, i, j) = (Some(0), Some(1), Some(2));
    let mut r: Vec<Tagged> = Vec::new();
    let padded = padded_lengths(w, bq, bkv);
    let masked = cfg.masking != Masking::None && !w.mask.is_full();
    let loaded = loads_mask(w, cfg);
    let computed = masked && !loaded;
    let jax = cfg.kernel == Kernel::Splash;
    if jax {
        r.push((RefDecl::prefetch("data_next", &[1]), None));
        r.push((RefDecl::prefetch("block_mask", &[1]), None));
        if loaded {
            r.push((RefDecl::prefetch("mask_next", &[1]), None));
        }
    }
    if cfg.kernel == Kernel::SplashDense {
        r.push((input("q", &[1, d, bq], Bf16, &[h, None, i]), Some(Q)));
        r.push((input("k", &[1, bkv, d], Bf16, &[h, j, None]), Some(KV)));
        r.push((input("v", &[1, bkv, dv], Bf16, &[h, j, None]), Some(KV)));
        r.push((output("m", &[8, bq], F32, &[None, None]), Some(FINAL)));
        r.push((output("l", &[8, bq], F32, &[None, None]), Some(FINAL)));
        r.push((output("o_scratch", &[dv, bq], F32, &[None, None]), Some(FINAL)));
        r.push((output("o", &[1, dv, bq], Bf16, &[h, None, i]), Some(OUT)));
        if cfg.return_residuals {
            r.push((output("m out", &[1, 8, bq], F32, &[h, None, i]), Some(OUT)));
            r.push((output("l out", &[1, 8, bq], F32, &[h, None, i]), Some(OUT)));
        }
        return (r, vec![VmemBuffer::internal("scores", &[c, bq], F32)]);
    }
    // JAX's older flash attention takes (batch, heads, seq, dim) arrays: batch and head
    // squeezed; the Splash kernels (heads, seq, dim).
    let lead: &[u64] = if cfg.kernel == Kernel::FlashAttention { &[1, 1] } else { &[1] };
    let lead_map: &[Option<usize>] = if cfg.kernel == Kernel::FlashAttention { &[None, h] } else { &[h] };
    let block = |rows: u64, cols: u64| [lead, &[rows, cols][..]].concat();
    let map = |m: &[Option<usize>]| [lead_map, m].concat();
    r.push((input("q", &block(bq, d), Bf16, &map(&[i, None])), Some(Q)));
    r.push((input("k", &block(bkv, d), Bf16, &map(&[j, None])), Some(KV)));
    r.push((input("v", &block(bkv, dv), Bf16, &map(&[j, None])), Some(KV)));
    if padded {
        r.push((input("q segment ids", &[bq, 128], I32, &[i, None]), Some(QI)));
        r.push((input("kv segment ids", &[8, bkv], I32, &[None, j]), Some(KJ)));
    }
    if loaded {
        // JAX's Splash: bool mask blocks passed as int32 (the kernel's memref is `i32`).
        r.push((input("mask", &[1, bq, bkv], if jax { I32 } else { I8 }, &[Some(3), None, None]), Some(MASK)));
    }
    if computed && cfg.kernel != Kernel::FlashAttention {
        r.push((input("q positions", &[bq, 128], I32, &[i, None]), Some(QI)));
    }
    let mut internal = vec![VmemBuffer::internal("scores", &[bq, c], F32)];
    let scratch = |name: &str, shape: &[u64]| (RefDecl::scratch(name, shape, F32), None);
    match cfg.kernel {
        Kernel::Splash => {
            // Outputs of constant block index: one buffer, written back after the last step.
            let constant = |name: &str, shape: &[u64]| (output(name, shape, F32, &[None, None]).buffered(1), Some(FINAL));
            r.extend([constant("m", &[bq, 128]), constant("l", &[bq, 128]), constant("o_scratch", &[bq, dv])]);
            r.push((output("o", &[1, bq, dv], Bf16, &[h, i, None]), Some(OUT)));
            if cfg.return_residuals {
                r.push((output("logsumexp", &[1, bq, 128], F32, &[h, i, None]), Some(OUT)));
            }
            internal.extend([VmemBuffer::internal("p", &[bq, c], F32), VmemBuffer::internal("v f32", &[c, dv], F32)]);
        }
        Kernel::FlashAttention => {
            r.push((output("o", &[1, 1, bq, dv], Bf16, &[Some(0), h, i, None]), Some(OUT)));
            if cfg.return_residuals {
                r.push((output("l out", &[1, 1, bq, 128], F32, &[Some(0), h, i, None]), Some(OUT)));
                r.push((output("m out", &[1, 1, bq, 128], F32, &[Some(0), h, i, None]), Some(OUT)));
            }
            // One kv step per row (block_k = kv_len) needs no running state.
            if c != w.kv_len {
                r.extend([scratch("m", &[1, 1, bq, 128]), scratch("l", &[1, 1, bq, 128]), scratch("acc", &[1, 1, bq, dv])]);
            }
        }
        _ => {
            r.push((output("o", &[1, bq, dv], Bf16, &[h, i, None]), Some(OUT)));
            if cfg.return_residuals {
                r.push((output("logsumexp", &[1, bq, 128], F32, &[h, i, None]), Some(OUT)));
                r.push((output("max logits", &[1, bq, 128], F32, &[h, i, None]), Some(OUT)));
            }
            r.extend([scratch("m", &[bq, 128]), scratch("l", &[bq, 128]), scratch("o_scratch", &[bq, dv])]);
            internal.push(VmemBuffer::internal("p", &[bq, c], Bf16));
        }
    }
    (r, internal)
}

/// The declaration of a family's `pallas_call` ([`family_refs`]) over `grid`, its leading
/// `parallel_dims` dimensions parallel.
pub(crate) fn declare(refs: Vec<Tagged>, internal: Vec<VmemBuffer>, grid: Vec<u64>, parallel_dims: usize) -> (KernelDecl, Vec<Option<u32>>) {
    let (refs, tags): (Vec<RefDecl>, Vec<Option<u32>>) = refs.into_iter().unzip();
    (KernelDecl { grid, parallel_dims, refs, internal }, tags)
}

/// The copy-set id of every combination of step-stream events ([`steps::event`]): Pallas's
/// rule over the declaration's windows ([`tpusim_model::copies`]), each window copied when its
/// event happens.
pub(crate) fn copy_table(decl: &KernelDecl, tags: &[Option<u32>], events: u32, sets: &mut CopySets) -> Vec<u32> {
    let rule = CopyRule::new(decl);
    let window_tags: Vec<Option<u32>> = rule.windows().map(|r| tags[r]).collect();
    (0..1usize << events)
        .map(|key| sets.intern(rule.copies(|w| window_tags[w].is_some_and(|e| key >> e & 1 == 1), |_| None)))
        .collect()
}

/// VMEM a forward tiling needs (its declaration, `family_refs`, counted by
/// [`crate::vmem::footprint`]).
pub fn vmem_budget(w: &AttentionCall, cfg: &SplashConfig, limit_bytes: u64) -> VmemBudget {
    let (refs, internal) = family_refs(w, cfg);
    declare(refs, internal, Vec::new(), 0).0.vmem(limit_bytes)
}

/// Checks a kernel's block sizes against the (8, 128) rules and the lengths; `names` are the
/// fields the blocks come from (q, kv, kv compute).
pub(crate) fn check_blocks_named(
    chip: &ChipModel,
    (q_len, kv_len): (u64, u64),
    (bq, bkv, c): (u64, u64, u64),
    names: [&str; 3],
) -> Result<(), KernelError> {
    let sub = chip.vpu.sublanes.value as u64;
    let lanes = chip.vpu.lanes.value as u64;
    let [nq, nkv, nc] = names;
    for (f, v) in [(nq, bq), (nkv, bkv), (nc, c)] {
        if v == 0 || v > tpusim_workload::MAX_DIM {
            return Err(KernelError::config(f, v, format!("expected a whole number from 1 to {}", tpusim_workload::MAX_DIM)));
        }
    }
    if bq % sub != 0 && bq != q_len {
        return Err(KernelError::config(
            nq,
            bq,
            format!("must be a multiple of {sub} (the sublanes of an ({sub}, {lanes}) tile) or equal `q_len` ({q_len})"),
        ));
    }
    if bq > q_len.next_multiple_of(sub) {
        return Err(KernelError::config(nq, bq, format!("must not exceed `q_len` ({q_len}) rounded up to {sub}")));
    }
    if bkv % lanes != 0 && bkv != kv_len {
        return Err(KernelError::config(
            nkv,
            bkv,
            format!("must be a multiple of {lanes} (the lanes of an ({sub}, {lanes}) tile: kv positions are the score tile's lane dimension) or equal `kv_len` ({kv_len})"),
        ));
    }
    if bkv > kv_len.next_multiple_of(lanes) {
        return Err(KernelError::config(nkv, bkv, format!("must not exceed `kv_len` ({kv_len}) rounded up to {lanes}")));
    }
    if c % lanes != 0 && c != bkv {
        return Err(KernelError::config(nc, c, format!("must be a multiple of {lanes} or equal `{}` ({bkv})", nkv.trim_matches('`'))));
    }
    if bkv % c != 0 {
        return Err(KernelError::config(nc, c, format!("must divide `{}` ({bkv})", nkv.trim_matches('`'))));
    }
    Ok(())
}

fn check_blocks(w: &AttentionCall, cfg: &SplashConfig, chip: &ChipModel) -> Result<(), KernelError> {
    check_blocks_named(
        chip,
        (w.q_len, w.kv_len),
        (cfg.block_q, cfg.block_kv, cfg.block_kv_compute),
        ["`block_q`", "`block_kv`", "`block_kv_compute`"],
    )?;
    if cfg.kernel == Kernel::SplashDense {
        // `custom_splash_attention.py`: o is (heads, head_dim_v, q_len) in (head_dim_v,
        // block_q) blocks, m and l (8, block_q).
        check_q_lanes(
            chip,
            w.q_len,
            cfg.block_q,
            "`block_q`",
            "for splash-dense, MaxDiffusion's mask-free kernel, which lays q along the lanes (its o block is (head_dim_v, block_q)); JAX's Splash (set `kernel` to splash) takes any multiple of 8",
        )?;
    }
    Ok(())
}

/// Pallas's (8, 128) rule for a kernel that lays q along the lanes (a block whose last
/// dimension is `bq` of an array whose last dimension is `q_len`): `bq` a multiple of the
/// lanes, or `q_len` itself. The error names `field`, the legal values nearest `bq` and `why`.
pub(crate) fn check_q_lanes(chip: &ChipModel, q_len: u64, bq: u64, field: &str, why: &str) -> Result<(), KernelError> {
    let lanes = chip.vpu.lanes.value as u64;
    if bq.is_multiple_of(lanes) || bq == q_len {
        return Ok(());
    }
    let sub = chip.vpu.sublanes.value as u64;
    let mut legal: Vec<u64> = [bq / lanes * lanes, bq.next_multiple_of(lanes)]
        .into_iter()
        .filter(|&v| v > 0 && v <= q_len.next_multiple_of(sub))
        .collect();
    // The whole q axis in one block, when no multiple of the lanes is near.
    if legal.len() < 2 && !legal.contains(&q_len) {
        legal.push(q_len);
    }
    let legal: Vec<String> = legal.iter().map(u64::to_string).collect();
    Err(KernelError::config(
        field,
        bq,
        format!("must be a multiple of {lanes} or equal `q_len` ({q_len}) {why}: e.g. {}", legal.join(" or ")),
    ))
}

/// Checks that the call's tensors fit the device's HBM: q, k, v, o (bf16, head dims unpadded:
/// `tpusim_model::copies`, the padding rule), the residuals when
/// returned, and `extra` bytes (the backward's gradients and partials); `advice` says what
/// would make them fit (`None`: a smaller batch or shorter sequences).
pub(crate) fn check_hbm(chip: &ChipModel, w: &AttentionCall, residuals: bool, extra: u64, advice: Option<String>) -> Result<(), KernelError> {
    let bh = (w.batch * w.q_heads) as u128;
    let bkvh = (w.batch * w.kv_heads) as u128;
    let mut need: u128 =
        bh * w.q_len as u128 * (w.head_dim + w.head_dim_v) as u128 * 2 + bkvh * w.kv_len as u128 * (w.head_dim + w.head_dim_v) as u128 * 2;
    if residuals {
        need += 2 * bh * w.q_len as u128 * 4;
    }
    need += extra as u128;
    let cap = chip.hbm_capacity_bytes() as u128;
    if need > cap {
        return Err(KernelError::Hbm {
            needed: need.min(u64::MAX as u128) as u64,
            capacity: cap as u64,
            capacity_gib: chip.hbm.capacity_gib.value,
            advice: advice.unwrap_or_else(|| "use a smaller `batch` or shorter sequences".to_string()),
        });
    }
    Ok(())
}

/// Kept pairs and tile counts of one distinct mask at a tiling.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct MaskStats {
    /// Tiles with no kept pair.
    pub empty: u64,
    /// Non-empty tiles that need the element-wise mask.
    pub partial: u64,
    /// Tiles whose every pair is kept.
    pub full: u64,
    /// Kept pairs (after tile alignment, if any).
    pub kept: u64,
    /// Kept pairs of the exact mask.
    pub exact_kept: u64,
    /// Pairs in non-empty tiles, padding included.
    pub visited_pairs: u64,
}

/// The masks of a call classified at a tiling: each distinct mask once.
#[derive(Debug, Clone)]
pub(crate) struct Classified {
    pub grid: TileGrid,
    pub distinct: Vec<Mask>,
    /// Which distinct mask each q head uses.
    pub head_mask: Vec<usize>,
    /// Per distinct mask, per q block: its non-empty tiles as runs of one kind.
    pub rows: Vec<Vec<Vec<Seg>>>,
    pub stats: Vec<MaskStats>,
    /// Most non-empty tiles in one q row over every mask.
    pub width: u64,
    /// Whether the lengths are padded to the blocks.
    pub padded: bool,
}

/// Classifies the distinct masks of `w` at `block_q x block_kv` (block by block, never an N x N
/// mask).
///
/// # Errors
/// [`KernelError::Config`] when the grid has too many tiles or no mask keeps a pair.
pub(crate) fn classify(
    w: &AttentionCall,
    block_q: u64,
    block_kv: u64,
    tile_align: bool,
    names: (&str, &str),
) -> Result<Classified, KernelError> {
    let grid = TileGrid { q_len: w.q_len, kv_len: w.kv_len, block_q, block_kv };
    w.mask.check_tiling(block_q, block_kv)?;
    let tiles_per_head = grid.q_tiles().saturating_mul(grid.kv_tiles());
    if tiles_per_head > crate::MAX_TILES {
        return Err(KernelError::config(
            &format!("{} x {}", names.0, names.1),
            format!("{block_q} x {block_kv}"),
            format!(
                "the grid has {} q tiles x {} kv tiles = {tiles_per_head} tiles per head; at most {} are supported: use larger blocks",
                grid.q_tiles(),
                grid.kv_tiles(),
                crate::MAX_TILES
            ),
        ));
    }
    let padded = grid.padded_q_len() != w.q_len || grid.padded_kv_len() != w.kv_len;
    let mut distinct: Vec<Mask> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut head_mask = Vec::with_capacity(w.q_heads as usize);
    for h in 0..w.q_heads {
        let m = w.mask_for_head(h);
        let id = *index.entry(m.to_string()).or_insert_with(|| {
            distinct.push(m.clone());
            distinct.len() - 1
        });
        head_mask.push(id);
    }
    let mut rows = Vec::with_capacity(distinct.len());
    let mut stats = Vec::with_capacity(distinct.len());
    for m in &distinct {
        let mut mrows = Vec::with_capacity(grid.q_tiles() as usize);
        let mut st = MaskStats::default();
        if tile_align {
            for_each_tile_run_row(m, &grid, false, |_, row| st.exact_kept += row.iter().map(|r| r.n * r.tile.kept).sum::<u64>());
        }
        for_each_tile_run_row(m, &grid, tile_align, |_, row| {
            let mut r: Vec<Seg> = Vec::new();
            for run in row {
                let t = run.tile;
                st.kept += run.n * t.kept;
                match t.kind {
                    TileKind::Empty => st.empty += run.n,
                    TileKind::Partial => st.partial += run.n,
                    TileKind::Full => st.full += run.n,
                }
                if t.kind != TileKind::Empty {
                    match r.last_mut() {
                        Some(seg) if seg.kind == t.kind && u64::from(seg.kj0 + seg.n) == run.kj0 => seg.n += run.n as u32,
                        _ => r.push(Seg { kj0: run.kj0 as u32, n: run.n as u32, kind: t.kind }),
                    }
                    st.visited_pairs += run.n * block_q * block_kv;
                }
            }
            mrows.push(r);
        });
        if !tile_align {
            st.exact_kept = st.kept;
        }
        rows.push(mrows);
        stats.push(st);
    }
    let width = rows.iter().flat_map(|m| m.iter().map(|r| r.iter().map(|s| s.n as u64).sum::<u64>())).max().unwrap_or(0);
    if stats.iter().all(|st| st.kept == 0) {
        let (what, hint) = if tile_align && stats.iter().any(|st| st.exact_kept > 0) {
            ("`tile_align`", "tile alignment dropped every tile (each keeps less than half its pairs): use smaller blocks or no alignment")
        } else {
            ("`mask`", "the mask keeps no (q, kv) pair of this workload: there is nothing to compute")
        };
        return Err(KernelError::config(what, if what == "`mask`" { w.mask.to_string() } else { "true".into() }, hint));
    }
    Ok(Classified { grid, distinct, head_mask, rows, stats, width, padded })
}

/// What the mask metadata of one distinct mask describes (the grid and its active blocks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetadataShape {
    /// q blocks of the grid.
    pub q_blocks: u64,
    /// kv blocks of the grid.
    pub kv_blocks: u64,
    /// kv steps per row of the full grid after shrinking (the longest row's non-empty blocks).
    pub width: u64,
    /// Non-empty blocks (partial and full).
    pub active: u64,
    /// The mask keeps every pair (padding aside).
    pub all_full: bool,
    /// Partial blocks are loaded from mask arrays (`mask_next` is kept).
    pub loaded: bool,
}

/// Bytes of the mask metadata a Splash kernel prefetches into SMEM for one distinct mask
/// (arrays downcast to the smallest integer type that holds their values, as
/// `splash_attention_mask_info.py` does): tokamax's compacted grid keeps per active block its q
/// and kv block indices, mask-block index, row start and end flags and block kind; JAX's full grid
/// keeps per (q block, kv step) the block kind and the next kv block (plus the next mask block
/// when masks are loaded). A mask whose every block is full needs none in tokamax and its
/// MaxDiffusion fork (`process_mask` returns an empty `MaskInfo`); MaxDiffusion's mask-free kernel
/// and JAX's older flash attention prefetch no mask metadata at all (`num_scalar_prefetch` 0 in
/// `flash_attention.py`; the causal skip is computed from the grid indices).
pub fn smem_bytes(family: Kernel, traversal: Traversal, m: MetadataShape) -> u64 {
    let int = |max: u64| {
        if max <= 127 {
            1
        } else if max <= 32767 {
            2
        } else {
            4
        }
    };
    match (family, traversal) {
        (Kernel::FlashAttention | Kernel::SplashDense, _) => 0,
        (Kernel::TokamaxSplash | Kernel::SparseSplash, _) if m.all_full => 0,
        (_, Traversal::Compact) => m.active * (int(m.q_blocks) + int(m.kv_blocks) + 1 + 1 + 1 + if m.loaded { int(m.active) } else { 1 }),
        (_, Traversal::FullGrid) => {
            m.q_blocks * m.width * (1 + int(m.kv_blocks) + if m.loaded { int(m.q_blocks * m.kv_blocks) } else { 0 })
        }
    }
}

/// The SMEM a forward's mask metadata needs: the largest over its distinct masks
/// ([`smem_bytes`]).
///
/// # Errors
/// [`KernelError::Smem`] naming the blocks when it does not fit.
fn fwd_smem(chip: &ChipModel, cfg: &SplashConfig, cl: &Classified, source: MaskSource) -> Result<u64, KernelError> {
    // A full mask needs no metadata in tokamax even when the lengths are padded to the blocks:
    // the padding is masked with segment ids, not with mask blocks.
    let smem = cl
        .stats
        .iter()
        .zip(&cl.distinct)
        .map(|(st, m)| {
            smem_bytes(
                cfg.kernel,
                cfg.traversal,
                MetadataShape {
                    q_blocks: cl.grid.q_tiles(),
                    kv_blocks: cl.grid.kv_tiles(),
                    width: cl.width,
                    active: st.partial + st.full,
                    all_full: m.is_full(),
                    loaded: source == MaskSource::Loaded,
                },
            )
        })
        .max()
        .unwrap_or(0);
    if smem > chip.smem_bytes() {
        return Err(KernelError::Smem { needed: smem, limit: chip.smem_bytes(), block_q: cfg.block_q, block_kv: cfg.block_kv });
    }
    Ok(smem)
}

/// A forward's step classes (their bodies left empty until the step stream says which run),
/// each class's body arguments, the class of each (tile kind, first, last) and the
/// finalize-only class of a family that finalizes at a row's last grid step.
///
/// The classes' keys now, their bodies once the step stream says which classes run (a class no
/// step runs keeps an empty body: a padded dense grid's masked tiles, for one, are never a
/// row's first).
fn fwd_classes(cfg: &SplashConfig, masked_kind: &dyn Fn(bool) -> bool) -> (Vec<StepClass>, Vec<BodyArgs>, ClassOf, Option<u32>) {
    let mut classes =
        vec![StepClass { key: ClassKey { tile: "empty", masked: false, first: false, last: false }, body: StepBody::default() }];
    // Per class: the arguments of its body (`None`: the empty step's).
    let mut body_args: Vec<BodyArgs> = vec![None];
    let mut class_of = [[[0u32; 2]; 2]; 2];
    for (k, kind) in [TileKind::Partial, TileKind::Full].into_iter().enumerate() {
        for first in [false, true] {
            for last in [false, true] {
                let is_masked = masked_kind(kind == TileKind::Partial);
                class_of[k][usize::from(first)][usize::from(last)] = classes.len() as u32;
                body_args.push(Some((is_masked, first, true, last)));
                classes.push(StepClass {
                    key: ClassKey { tile: if k == 0 { "partial" } else { "full" }, masked: is_masked, first, last },
                    body: StepBody::default(),
                });
            }
        }
    }
    // JAX's Splash finalizes at the row's last grid step, which may be empty (steps.rs); so does
    // JAX's older flash attention (`store_output` at the last kv index, causal rows included).
    let flash = cfg.kernel == Kernel::FlashAttention;
    let finalize_class = ((cfg.kernel == Kernel::Splash || flash) && cfg.traversal == Traversal::FullGrid).then(|| {
        body_args.push(Some((false, false, false, true)));
        classes.push(StepClass { key: ClassKey { tile: "empty", masked: false, first: false, last: true }, body: StepBody::default() });
        classes.len() as u32 - 1
    });
    (classes, body_args, class_of, finalize_class)
}

/// A forward's facts for reports: grid, blocks, padding, tile counts ((tiles, kept pairs, kept
/// pairs of the exact mask, visited pairs), [`bwd::tile_counts`]), grid steps and SMEM.
fn fwd_info(w: &AttentionCall, cfg: &SplashConfig, cl: &Classified, (tiles, kept, exact, visited_pairs): (TileCounts, u64, u64, u64), grid_steps: u64, smem: u64) -> ProgramInfo {
    ProgramInfo {
        kind: tpusim_model::KernelKind::Attention,
        kernel: "attention forward".into(),
        grid: vec![
            ("batch x heads".into(), w.batch * w.q_heads),
            ("q blocks".into(), cl.grid.q_tiles()),
            (
                match cfg.traversal {
                    Traversal::FullGrid if cl.width < cl.grid.kv_tiles() => "kv steps (after grid shrinking)".into(),
                    Traversal::FullGrid => "kv steps".into(),
                    // Rows differ only when some tile is empty (a row visits its non-empty tiles).
                    Traversal::Compact if tiles.empty == 0 => "kv steps (compacted; no tile is empty)".into(),
                    Traversal::Compact => "kv steps (compacted, varies by row)".into(),
                },
                cl.width,
            ),
        ],
        blocks: vec![("block_q".into(), cfg.block_q), ("block_kv".into(), cfg.block_kv), ("block_kv_compute".into(), cfg.block_kv_compute)],
        padded: vec![("q_len".into(), w.q_len, cl.grid.padded_q_len()), ("kv_len".into(), w.kv_len, cl.grid.padded_kv_len())],
        tiles: Some(tiles),
        kept_pairs: kept,
        visited_pairs,
        exact_kept_pairs: exact,
        grid_steps,
        smem_bytes: smem,
    }
}

/// Lowers one attention call's forward pass with a Splash configuration, in stages: checks
/// (shapes, blocks, VMEM, HBM), mask classification, SMEM, step bodies, counts, step stream.
///
/// # Errors
/// [`KernelError::Config`] naming the field for block sizes that break the (8, 128) rules, a
/// `block_kv_compute` that does not divide `block_kv`, or blocks larger than the sequence;
/// [`KernelError::Vmem`], [`KernelError::Smem`], [`KernelError::Hbm`] when the tiling, its mask
/// metadata or the tensors do not fit; [`KernelError::Workload`] / [`KernelError::Mask`] for
/// invalid shapes or mask files.
pub fn lower(chip: &ChipModel, w: &AttentionCall, cfg: &SplashConfig) -> Result<Program, KernelError> {
    // Stage 1: checks.
    w.validate()?;
    w.mask.check_lengths(w.q_len, w.kv_len)?;
    check_blocks(w, cfg, chip)?;
    let (refs, internal) = family_refs(w, cfg);
    let vmem = declare(refs.clone(), internal.clone(), Vec::new(), 0).0.vmem(cfg.vmem_limit(chip));
    crate::check_vmem(&vmem, chip)?;
    check_hbm(chip, w, cfg.return_residuals, 0, None)?;
    // Stage 2: the masks at the tiling.
    let cl = classify(w, cfg.block_q, cfg.block_kv, cfg.tile_align, ("`block_q`", "`block_kv`"))?;
    // The `pallas_call` over the grid the masks give.
    let (decl, tags) = declare(refs, internal, vec![w.batch, w.q_heads, cl.grid.q_tiles(), cl.width], 2);
    // A mask with no closed form (a block file) can only be loaded, whatever the option says.
    let source = if cl.distinct.iter().any(|m| m.expression_terms().loaded_only) { MaskSource::Loaded } else { cfg.mask_source };
    let any_not_full = cl.distinct.iter().any(|m| !m.is_full()) || cfg.tile_align;
    // Stage 3: SMEM.
    let smem = fwd_smem(chip, cfg, &cl, source)?;
    // Stage 4: one body per (tile kind, first, last), an op program ([`ops`]) masked by the
    // costliest distinct mask's function.
    let masked_kind = |partial: bool| match cfg.masking {
        Masking::None => false,
        Masking::Partial => partial,
        Masking::All => partial || any_not_full,
    };
    // The op program's mask ([`ops`]): the costliest distinct mask's function, the partial
    // block loaded (JAX's int32, the others' int8), segment ids for padded lengths.
    let plan = mask_plan(&cl, source, any_not_full, cfg.kernel != Kernel::Splash);
    let flavor = ops::Flavor {
        base2: cfg.exp == Exp::Base2,
        f32_v: cfg.kernel == Kernel::Splash,
        resets_scratch: cfg.kernel == Kernel::Splash,
        max_logits: cfg.kernel != Kernel::Splash,
    };
    // One step's body: masked or not, the row's first and last step, and whether its tile runs.
    let step_body = |masked: bool, first: bool, runs: bool, last: bool| {
        op_body(
            cfg.kernel,
            &decl,
            &ops::FwdStep {
                flavor,
                block_q: cfg.block_q,
                block_kv: cfg.block_kv,
                compute: cfg.block_kv_compute,
                d: w.head_dim,
                dv: w.head_dim_v,
                mask: masked.then_some(&plan),
                residuals: cfg.return_residuals,
                first,
                runs,
                last,
            },
        )
    };
    let (mut classes, body_args, class_of, finalize_class) = fwd_classes(cfg, &masked_kind);
    // Stage 5: tile counts over batch and heads.
    let counts = bwd::tile_counts(w, &cl, |k| masked_kind(k == TileKind::Partial));
    let grid_steps: u64 = (0..w.q_heads)
        .map(|h| {
            let st = cl.stats[cl.head_mask[h as usize]];
            w.batch
                * match cfg.traversal {
                    Traversal::Compact => st.partial + st.full,
                    Traversal::FullGrid => cl.grid.q_tiles() * cl.width,
                }
        })
        .sum();
    let info = fwd_info(w, cfg, &cl, counts, grid_steps, smem);
    // Stage 6: the step stream, its copies by Pallas's rule over the family's declaration.
    let jax_splash = cfg.kernel == Kernel::Splash;
    let flash = cfg.kernel == Kernel::FlashAttention;
    let mut sets = CopySets::default();
    let copies = copy_table(&decl, &tags, steps::event::COUNT, &mut sets);
    let steps = Steps {
        batch: w.batch,
        q_heads: w.q_heads,
        group: w.q_heads / w.kv_heads,
        rows: cl.rows,
        head_mask: cl.head_mask,
        traversal: cfg.traversal,
        width: cl.width,
        class_of,
        empty_class: 0,
        finalize_class,
        // JAX's older flash attention points skipped causal steps at kv block 0 too (its
        // `kv_index_map`: "prefetch the next valid kv block, i.e. the 0th one").
        pad_to_block0: (cfg.kernel == Kernel::Splash || flash) && cfg.traversal == Traversal::FullGrid,
        copies,
        loads_mask: source == MaskSource::Loaded,
        final_out: tags.contains(&Some(steps::event::FINAL)),
        masked_partial: cfg.masking != Masking::None,
        mask_dedup: (jax_splash && cl.distinct.iter().all(diagonal_invariant)).then_some((cfg.block_q, cfg.block_kv)),
        unit_span: 1,
    };
    let rows_generated = steps.emitted_heads().saturating_mul(cl.grid.q_tiles());
    if rows_generated > crate::MAX_ROWS {
        return Err(KernelError::config(
            "`batch` x `heads`",
            format!("{} x {}", w.batch, w.q_heads),
            format!(
                "the grid needs {rows_generated} rows of steps generated (heads that cannot be folded x q tiles); at most {} are supported (latency scales linearly in batch: simulate a slice and scale)",
                crate::MAX_ROWS
            ),
        ));
    }
    build_used_bodies(&mut classes, &body_args, &steps.used_classes(body_args.len()), step_body);
    Ok(Program::new(classes, w.batch * w.q_heads, vmem, info, decl, sets, steps))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Step, Work};

    fn v6e() -> ChipModel {
        ChipModel::preset("v6e").unwrap()
    }

    fn cfg(bq: u64, bkv: u64, c: u64) -> SplashConfig {
        SplashConfig::with_blocks(bq, bkv, Some(c))
    }

    #[test]
    fn dense_video_case_grid_and_padding() {
        let p = lower(&v6e(), &AttentionCall::video_default(), &cfg(3024, 2048, 1024)).unwrap();
        assert_eq!(p.info.grid_steps, 10 * 25 * 37);
        assert_eq!(p.info.padded[1], ("kv_len".to_string(), 75600, 75776));
        let mut n = 0;
        let mut flops = 0.0;
        p.for_each_step(&mut |s| {
            n += 1;
            flops += p.classes[s.class as usize].body.flops();
        });
        assert_eq!(n, 9250);
        // Executed FLOPs = 4 x heads x padded q x padded kv x d.
        let want = 4.0 * 10.0 * 75600.0 * 75776.0 * 128.0;
        assert!((flops / want - 1.0).abs() < 1e-9, "{flops} vs {want}");
    }

    #[test]
    fn block_rule_errors_name_the_flag() {
        let w = AttentionCall::video_default();
        let e = lower(&v6e(), &w, &cfg(3024, 2000, 1000)).unwrap_err().to_string();
        assert!(e.contains("`block_kv`") && e.contains("128"), "{e}");
        let e = lower(&v6e(), &w, &cfg(3020, 2048, 1024)).unwrap_err().to_string();
        assert!(e.contains("`block_q`") && e.contains("multiple of 8"), "{e}");
        let e = lower(&v6e(), &w, &cfg(3024, 2048, 768)).unwrap_err().to_string();
        assert!(e.contains("`block_kv_compute`") && e.contains("divide"), "{e}");
        let e = lower(&v6e(), &w, &cfg(8192, 8192, 8192)).unwrap_err().to_string();
        assert!(e.contains("VMEM") && e.contains("bytes"), "{e}");
    }

    #[test]
    fn maxdiffusions_kv_major_kernel_needs_block_q_in_whole_lanes() {
        // Its o block is (head_dim_v, block_q): block_q runs along the lanes.
        let w = AttentionCall::video_default();
        let dense = |bq| SplashConfig { kernel: Kernel::SplashDense, ..cfg(bq, 2048, 1024) };
        let e = lower(&v6e(), &w, &dense(3024)).unwrap_err().to_string();
        assert!(e.contains("`block_q`") && e.contains("multiple of 128") && e.contains("2944 or 3072"), "{e}");
        assert!(lower(&v6e(), &w, &dense(3072)).is_ok());
        // JAX's Splash lays q along the sublanes: 3024 is a whole number of (8, 128) tiles.
        assert!(lower(&v6e(), &w, &SplashConfig { kernel: Kernel::Splash, ..cfg(3024, 2048, 1024) }).is_ok());
        // One block over the whole q axis is its own array dimension.
        let short = AttentionCall { q_len: 1000, kv_len: 1024, ..AttentionCall::video_default() };
        let one = SplashConfig { kernel: Kernel::SplashDense, ..SplashConfig::with_blocks(1000, 1024, Some(1024)) };
        assert!(lower(&v6e(), &short, &one).is_ok(), "{:?}", lower(&v6e(), &short, &one).err());
    }

    #[test]
    fn jax_backward_kernels_need_q_blocks_in_whole_lanes() {
        // JAX's dq and dkv kernels: logsumexp and di blocks (8, block_q). Tokamax's fused
        // kernel keeps its residuals q-major and takes any multiple of 8.
        let w = AttentionCall { q_len: 384, kv_len: 384, q_heads: 2, kv_heads: 2, ..AttentionCall::video_default() };
        let with = |kernel, q_dkv, q_dq, fused| {
            let mut c = SplashConfig { kernel, ..SplashConfig::with_blocks(128, 128, Some(128)) };
            c.bwd = bwd::BwdBlocks { block_q_dkv: q_dkv, block_kv_dkv: 128, block_kv_dkv_compute: 128, block_q_dq: q_dq, block_kv_dq: 128, fused, ..c.bwd };
            c
        };
        let e = bwd::lower_dq(&v6e(), &w, &with(Kernel::Splash, 128, 192, false)).unwrap_err().to_string();
        assert!(e.contains("`block_q_dq`") && e.contains("multiple of 128") && e.contains("128 or 256"), "{e}");
        let e = bwd::lower_dkv(&v6e(), &w, &with(Kernel::Splash, 192, 128, false)).unwrap_err().to_string();
        assert!(e.contains("`block_q_dkv`") && e.contains("multiple of 128"), "{e}");
        assert!(bwd::lower_dkv(&v6e(), &w, &with(Kernel::Splash, 384, 128, false)).is_ok());
        assert!(bwd::lower_dkv(&v6e(), &w, &with(Kernel::TokamaxSplash, 192, 192, true)).is_ok());
    }

    #[test]
    fn smem_overflow_names_the_blocks_to_change() {
        // tokamax's compacted grid at its default 128 blocks over 75,600 causal tokens: the
        // per-block metadata overflows SMEM; the message names the fields and their values.
        let mut w = AttentionCall::video_default();
        w.mask = Mask::parse("causal").unwrap();
        let e = lower(&v6e(), &w, &cfg(128, 128, 128)).unwrap_err();
        assert!(matches!(e, KernelError::Smem { .. }), "{e}");
        let e = e.to_string();
        assert!(e.contains("`block_q` = 128") && e.contains("`block_kv` = 128"), "{e}");
    }

    #[test]
    fn kv_copies_are_elided_when_the_block_repeats() {
        // One kv block per row: consecutive q blocks of one head reuse it.
        let mut w = AttentionCall::video_default();
        w.q_len = 4096;
        w.kv_len = 1024;
        w.q_heads = 1;
        w.kv_heads = 1;
        let p = lower(&v6e(), &w, &cfg(1024, 1024, 512)).unwrap();
        let mut bytes = 0;
        p.for_each_step(&mut |s| bytes += p.copies_of(s).in_bytes);
        assert_eq!(bytes, 4 * 1024 * 128 * 2 + 1024 * 256 * 2);
    }

    #[test]
    fn runs_expand_to_the_same_steps() {
        // Per-step generation written out directly, compared with the run generator.
        let chip = v6e();
        for (mask, trav) in
            [("band:700+sink:300", Traversal::Compact), ("causal", Traversal::FullGrid), ("local:900,100", Traversal::FullGrid)]
        {
            let mut w = AttentionCall::video_default();
            w.q_len = 5000;
            w.kv_len = 5000;
            w.q_heads = 4;
            w.kv_heads = 2;
            w.mask = Mask::parse(mask).unwrap();
            let mut c = cfg(512, 256, 256);
            c.traversal = trav;
            c.masking = Masking::Partial;
            let p = lower(&chip, &w, &c).unwrap();
            let mut a = Vec::new();
            p.for_each_step(&mut |s| a.push(*s));
            let mut runs = 0;
            let mut b = Vec::new();
            p.for_each_run(&mut |s, n| {
                runs += 1;
                for i in 0..n {
                    b.push(Step { coords: [s.coords[0], s.coords[1], s.coords[2] + i as u32, 0], ..*s });
                }
            });
            assert_eq!(a, b, "{mask}");
            assert_eq!(a.len() as u64, p.info.grid_steps, "{mask}");
            assert!(runs < a.len(), "{mask}: runs should compress the stream");
            // Each visited tile's kv block appears once per (head, q block) and kv copies happen
            // on every computed step of a row except when the block repeats.
            let computed = a.iter().filter(|s| s.class != 0).count() as u64;
            assert_eq!(computed, p.info.tiles.unwrap().visited, "{mask}");
        }
    }

    #[test]
    fn only_the_classes_some_step_runs_get_a_body() {
        // A class's body is built when a step runs it: a padded dense grid never starts a row on
        // a masked (padding) tile, a band never has a one-tile row. Every class no step names is
        // left empty, and every computing or finalizing class a step names has work; forward,
        // dq and dkv kernels, compact and full grids.
        let chip = v6e();
        for (mask, trav, kernel) in [
            ("full", Traversal::Compact, Kernel::TokamaxSplash),
            ("band:700+sink:300", Traversal::Compact, Kernel::TokamaxSplash),
            ("causal", Traversal::FullGrid, Kernel::Splash),
            ("local:900,100", Traversal::FullGrid, Kernel::Splash),
        ] {
            let mut w = AttentionCall::video_default();
            (w.q_len, w.kv_len, w.q_heads, w.kv_heads) = (5000, 5000, 4, 2);
            w.mask = Mask::parse(mask).unwrap();
            let mut c = SplashConfig { kernel, ..cfg(512, 256, 256) };
            c.traversal = trav;
            c.masking = Masking::Partial;
            c.bwd = bwd::BwdBlocks { block_q_dkv: 512, block_kv_dkv: 256, block_kv_dkv_compute: 256, block_q_dq: 512, block_kv_dq: 256, ..c.bwd };
            for (name, p) in [("fwd", lower(&chip, &w, &c)), ("dq", bwd::lower_dq(&chip, &w, &c)), ("dkv", bwd::lower_dkv(&chip, &w, &c))] {
                let p = p.unwrap_or_else(|e| panic!("{mask} {name}: {e}"));
                let mut runs = vec![0u64; p.classes.len()];
                p.for_each_run(&mut |s, n| runs[s.class as usize] += n);
                for (i, (class, &n)) in p.classes.iter().zip(&runs).enumerate() {
                    let k = &class.key;
                    // An empty tile's step runs `init` / `end` at most (the fused dkv kernel's dq
                    // partial too), so only a computing or finalizing class must have work.
                    if n == 0 {
                        assert!(class.body.is_empty(), "{mask} {name}: class {i} {k:?} runs no step but was built");
                    } else if k.tile != "empty" || k.last {
                        assert!(!class.body.is_empty(), "{mask} {name}: class {i} {k:?} runs {n} steps without a body");
                    }
                }
                // Some class is left unbuilt on every one of these grids (the one-tile rows).
                assert!(p.classes.iter().zip(&runs).any(|(c, &n)| n == 0 && c.key.tile != "empty"), "{mask} {name}");
            }
        }
    }

    #[test]
    fn jax_splash_widens_v_once_per_sub_tile_and_tokamax_does_not() {
        let w = AttentionCall::video_default();
        // Per computed step: v widened to f32 (`arith.extf`, one VPU operation per f32 register)
        // and rounded back to bf16 for the MXU (`round_rhs`) once per sub-tile.
        let casts = |kernel: Kernel| {
            let c = SplashConfig { kernel, ..cfg(3024, 2048, 1024) };
            let p = lower(&v6e(), &w, &c).unwrap();
            let body = &p.classes.iter().find(|c| c.key.tile == "full" && !c.key.first && !c.key.last).unwrap().body;
            let ops = |name: &str| -> f64 {
                body.graph.node_weights().filter(|op| op.name == name).map(|op| match op.work { Work::Vector { ops, .. } => ops, _ => 0.0 }).sum()
            };
            (ops("arith.extf"), body.graph.node_weights().filter(|op| op.name == "round_rhs").count())
        };
        let per_sub_tile = (1024 * 128) as f64 / 1024.0;
        assert_eq!(casts(Kernel::Splash), (2.0 * per_sub_tile, 2048 / 1024));
        assert_eq!(casts(Kernel::TokamaxSplash), (0.0, 0));
        // At the default precision the f32 p.v is one MXU pass: its FLOPs and matmul shapes are
        // those of the bf16 one.
        assert_eq!(tpusim_model::mxu::matmul_passes(crate::dtype::Dtype::F32, crate::dtype::Dtype::F32, tpusim_model::mxu::Precision::Default), 1);
    }

    #[test]
    fn jax_splash_copies_what_its_pallas_call_declares() {
        // 4 heads x 2048 causal at 512 blocks: per (head, q block) q (512 x 128 bf16), the q
        // positions (512 x 128 i32) and o (bf16); kv (512 x 256 bf16) per head 9 times: rows
        // 0..3 fetch kv 0 | kv 1, pad -> kv 0 | kv 1, kv 2, pad -> kv 0 | kv 1, kv 2, kv 3 (the
        // padding steps' data_next is block 0); m, l, o_scratch (512 x 384 f32) once at the end.
        let mut w = AttentionCall::video_default();
        (w.q_len, w.kv_len, w.q_heads, w.kv_heads) = (2048, 2048, 4, 4);
        w.mask = Mask::parse("causal").unwrap();
        let c = SplashConfig { block_q: 512, block_kv: 512, block_kv_compute: 512, ..SplashConfig::for_family(Kernel::Splash) };
        let p = lower(&v6e(), &w, &c).unwrap();
        let (mut inb, mut outb, mut fin) = (0, 0, 0);
        p.for_each_step(&mut |s| {
            inb += p.copies_of(s).in_bytes;
            outb += p.copies_of(s).out_bytes;
            fin += u64::from(p.classes[s.class as usize].key.tile == "empty" && !p.classes[s.class as usize].body.is_empty());
        });
        assert_eq!(inb, 16 * (512 * 128 * 2 + 512 * 128 * 4) + 4 * 9 * 512 * 256 * 2);
        assert_eq!(outb, 16 * 512 * 128 * 2 + 512 * 384 * 4);
        // Rows 0..2 end in padding: their finalize runs there.
        assert_eq!(fin, 4 * 3);
        // The run stream (heads folded) gives the same bytes.
        let mut runs = 0;
        p.for_each_run(&mut |s, n| runs += (p.copies_of(s).in_bytes + p.copies_of(s).out_bytes) * n);
        assert_eq!(runs, inb + outb);
    }

    #[test]
    fn vmem_and_copies_come_from_the_declaration() {
        // JAX's Splash, 1 head, causal 2048 at 512 blocks: VMEM and every step's copies are
        // derived from the family's one declaration, so changing a ref there changes both.
        let mut w = AttentionCall::video_default();
        (w.q_len, w.kv_len, w.q_heads, w.kv_heads) = (2048, 2048, 1, 1);
        w.mask = Mask::parse("causal").unwrap();
        let c = SplashConfig { block_q: 512, block_kv: 512, block_kv_compute: 512, ..SplashConfig::for_family(Kernel::Splash) };
        let (refs, internal) = family_refs(&w, &c);
        let (decl, tags) = declare(refs.clone(), internal.clone(), vec![1, 1, 4, 4], 2);
        let vmem = |d: &KernelDecl| d.vmem(u64::MAX).total();
        // What the kernel's IR says (m, l and o_scratch in one buffer each).
        assert_eq!(vmem(&decl), 3_407_872);
        let kv_copy = |d: &KernelDecl, tags: &[Option<u32>]| {
            let mut sets = CopySets::default();
            let ids = copy_table(d, tags, steps::event::COUNT, &mut sets);
            sets.get(ids[1 << steps::event::KV]).in_bytes
        };
        assert_eq!(kv_copy(&decl, &tags), 2 * 512 * 128 * 2);
        // k's block twice as wide: its VMEM (two buffers) and its copy grow by one block each.
        let k = decl.index_of("k").unwrap();
        let mut wide = decl.clone();
        wide.refs[k].block = vec![1, 512, 256];
        assert_eq!(vmem(&wide), vmem(&decl) + 2 * 512 * 128 * 2);
        assert_eq!(kv_copy(&wide, &tags), kv_copy(&decl, &tags) + 512 * 128 * 2);
        // q in three buffers (`pl.Buffered(3)`): one more q block of VMEM, the same copies.
        let q = decl.index_of("q").unwrap();
        let mut deep = decl.clone();
        deep.refs[q].buffers = 3;
        assert_eq!(vmem(&deep), vmem(&decl) + 512 * 128 * 2);
        assert_eq!(kv_copy(&deep, &tags), kv_copy(&decl, &tags));
        // The lowering's program carries that declaration and its VMEM.
        let p = lower(&v6e(), &w, &c).unwrap();
        assert_eq!(p.vmem.total(), 3_407_872);
        assert_eq!(p.decl.refs, decl.refs);
    }

    #[test]
    fn body_graph_is_in_topological_order() {
        let p = lower(&v6e(), &AttentionCall::video_default(), &cfg(3024, 2048, 1024)).unwrap();
        for c in &p.classes {
            for e in c.body.graph.edge_indices() {
                let (a, b) = c.body.graph.edge_endpoints(e).unwrap();
                assert!(a.index() < b.index());
            }
        }
    }
}
