//! The backward pass of Splash attention: what `jax.grad` runs after a forward that saved its
//! residuals (logsumexp per q row). Sources: tokamax `splash_attention_kernel.py`
//! (`_splash_attention_bwd`, `_splash_attention_bwd_dkv`, `_flash_attention_dkv_kernel`) and
//! JAX's `splash_attention_kernel.py` (`_splash_attention_bwd_dq`, `_flash_attention_dq_kernel`,
//! `_splash_attention_bwd_dkv`, `_flash_attention_dkv_kernel`).
//!
//! * **dkv kernel** (fused: it also writes dq): grid (kv blocks, q heads, q blocks), q innermost,
//!   every dimension "arbitrary" (only a vmapped batch is parallel). Per computed step, for each
//!   `block_kv_dkv_compute`-wide sub-tile of the kv block against the q block (q in lanes), the
//!   body recomputes the scores and probabilities, runs the dv, dp and dk matmuls (fused, dq
//!   too, after a transpose of ds) and accumulates into f32 scratch: the ops as the kernel's
//!   Mosaic IR has them are written once in `splash::bwd_ops`, and the one op-cost table of the
//!   body builder (`tpusim_model::body::cost`) prices them, so no cost is stated here.
//!
//!   The dk / dv scratch of a sub-tile is carried from one q step to the next (carried slots);
//!   the dq scratch is zeroed and stored every step. tokamax runs its static grid: empty blocks
//!   skip the compute but still fetch q, dO, logsumexp and di (and write a zero dq partial);
//!   JAX's dkv kernel follows its `data_next` (below) and without fusion its grid is shrunk to
//!   each kv column's non-empty blocks (padded at the front). DMAs per step: q and dO (bf16), logsumexp and di (f32, sublane-broadcast to 8 rows)
//!   and, for computed masks, the q positions (int32, 8 rows); k and v when the (kv block, kv
//!   head) changes; the dq partial (q's dtype when there are at most 4 kv blocks, else f32) every
//!   step (fused); dk and dv when the kv block's last q step of its head group is done.
//! * **dq kernel** (JAX's unfused path): grid (q heads, q blocks, kv steps), kv innermost, shrunk
//!   to each q row's non-empty blocks; per computed step: qk (bq x d x bkv), mask, p (exp),
//!   dp = dO v^T (bq x dv x bkv), ds, dq += ds k (bq x bkv x d) into an f32 scratch carried over
//!   the row. q, dO, logsumexp and di (and a computed mask's q positions, block_q_dq x 128
//!   int32) are fetched once per row, k and v per step, dq written at the row's end; the f32
//!   accumulator is an output of constant block index, written back once after the last step.
//!   The row finalizes at its last grid step (an empty padding step when the row is short),
//!   and padding steps point at kv block 0 (JAX's `data_next`), as the forward's.
//!
//! JAX's dkv grid (JAX 0.10.2, checked against the kernels' Mosaic IR): unfused, the grid is
//! shrunk per kv column with the padding at the front pointing at q block 0; fused, the grid is
//! not shrunk and an empty step points at the next non-empty block in (kv, q) order of one
//! head's mask (past a column's last block: the next column's first), fetched with the current
//! head. The q positions' index map has no head (a copy when the q block alone changes); the
//! f32 dk and dv accumulators (and the fused dq accumulator when the kv block is sub-tiled) are
//! outputs written back once. Loaded (bool) mask blocks are int32 in JAX's kernels.
//!
//! FLOPs: the fused kernel runs five matmuls of the forward's size per visited tile (qk, dv, dp,
//! dk, dq) where the forward runs two; the two-kernel path recomputes qk and dp in the dq kernel:
//! seven.

use super::bwd_ops::BwdStep;
use super::{check_blocks_named, classify, padded_lengths, Classified, Seg, Steps};
use crate::ir::{ClassKey, Step, StepBody, StepClass};
use crate::options::{Exp, Kernel, MaskSource, Masking, Traversal};
use super::Tagged;
use crate::vmem::VmemBuffer;
use crate::{KernelError, Program, ProgramInfo, TileCounts, VmemBudget};
use tpusim_model::copies::CopySets;
use tpusim_model::decl::{KernelDecl, RefDecl};
use tpusim_model::expr::Expr;
use tpusim_model::RunItem;
use serde::Serialize;
use tpusim_chip::ChipModel;
use tpusim_workload::tiles::TileKind;
use tpusim_workload::AttentionCall;

/// Where a backward kernel's block sizes came from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BlockOrigin {
    /// The kernel family's own backward defaults ([`crate::options::BwdRule`]).
    #[default]
    FamilyDefault,
    /// Given by the job.
    Given,
    /// Taken from the forward's blocks, as the library does
    /// ([`crate::options::BwdRule::InheritForward`]).
    Forward,
}

/// Where the dkv (or fused) and the dq kernels' blocks came from. Provenance, not configuration:
/// [`BwdBlocks`] compare equal whatever their origin.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct BwdOrigin {
    /// The dkv (or fused) kernel's blocks.
    pub dkv: BlockOrigin,
    /// The dq kernel's blocks (unfused backward).
    pub dq: BlockOrigin,
}

/// Block sizes of the backward kernels, with Splash's names.
#[derive(Debug, Clone, Copy, Eq, Serialize)]
pub struct BwdBlocks {
    /// q rows per block of the dkv (or fused) kernel (`block_q_dkv`).
    pub block_q_dkv: u64,
    /// kv rows per block of the dkv kernel (`block_kv_dkv`).
    pub block_kv_dkv: u64,
    /// kv rows per sub-tile of the dkv kernel (`block_kv_dkv_compute`); divides `block_kv_dkv`.
    pub block_kv_dkv_compute: u64,
    /// q rows per block of the dq kernel (`block_q_dq`; unfused only).
    pub block_q_dq: u64,
    /// kv rows per block of the dq kernel (`block_kv_dq`; unfused only).
    pub block_kv_dq: u64,
    /// One fused kernel writes dq, dk and dv (`use_fused_bwd_kernel`); otherwise a dq kernel and
    /// a dkv kernel.
    pub fused: bool,
    /// Where the blocks came from (for reports; not compared).
    #[serde(skip)]
    pub origin: BwdOrigin,
}

impl PartialEq for BwdBlocks {
    /// Equal blocks and kernel choice, whatever their [`BwdOrigin`].
    fn eq(&self, o: &Self) -> bool {
        (self.block_q_dkv, self.block_kv_dkv, self.block_kv_dkv_compute, self.block_q_dq, self.block_kv_dq, self.fused)
            == (o.block_q_dkv, o.block_kv_dkv, o.block_kv_dkv_compute, o.block_q_dq, o.block_kv_dq, o.fused)
    }
}

impl BwdBlocks {
    /// A family's backward defaults ([`Kernel::defaults`]).
    pub fn for_family(kernel: Kernel) -> Self {
        let d = kernel.defaults();
        BwdBlocks {
            block_q_dkv: d.bwd_blocks.q,
            block_kv_dkv: d.bwd_blocks.kv,
            block_kv_dkv_compute: d.bwd_blocks.compute.unwrap_or(d.bwd_blocks.kv),
            block_q_dq: d.dq_blocks.0,
            block_kv_dq: d.dq_blocks.1,
            fused: d.fused_bwd,
            origin: BwdOrigin::default(),
        }
    }
}

/// Bytes of the dq partial's element: q's dtype (bf16) with at most 4 kv blocks, else f32
/// (tokamax); JAX's fused kernel always writes q's dtype.
fn dq_partial_bytes(kernel: Kernel, kv_blocks: u64) -> u64 {
    match kernel {
        Kernel::TokamaxSplash if kv_blocks > 4 => 4,
        _ => 2,
    }
}

/// Why JAX's dq and dkv kernels want their q blocks in whole lanes ([`super::check_q_lanes`]):
/// their logsumexp and di blocks are (8, block_q) and the dkv kernel's mask block
/// (block_kv, block_q) (`splash_attention_kernel.py`; Pallas refuses other blocks when it lowers
/// them).
const JAX_Q_LANES: &str = "for JAX's Splash backward kernels, which lay q along the lanes (their logsumexp and di blocks are (8, block_q))";

/// Whether the family runs the dkv kernel on its static grid (tokamax: empty blocks still fetch
/// their q-side blocks) rather than JAX's data_next prefetch (empty blocks fetch nothing).
fn static_grid(kernel: Kernel) -> bool {
    kernel == Kernel::TokamaxSplash
}

/// What a backward kernel's VMEM depends on besides its blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BwdVmemOptions {
    /// Bytes of the fused kernel's dq partial element (2: q's dtype, 4: f32).
    pub dq_elem: u64,
    /// A mask is computed in the kernel (its q positions are an input).
    pub computed: bool,
    /// Partial mask blocks are loaded (an int8 input).
    pub loaded: bool,
    /// The lengths are padded to the blocks (segment ids are inputs).
    pub padded: bool,
}

/// The events of the dkv kernel's step stream that change its windows' block indices: each
/// window of its declaration names the one its block index follows ([`dkv_refs`]).
pub(crate) mod column_event {
    /// The (batch x head, q block) of the q-side windows changed (or, on tokamax's static grid,
    /// any step: it fetches them every step).
    pub const Q_SIDE: u32 = 0;
    /// The q block alone changed: windows whose index map has no head (JAX's q positions and q
    /// segment ids).
    pub const QI: u32 = 1;
    /// The (kv block, kv head) changed: k and v.
    pub const KV: u32 = 2;
    /// The kv block alone changed: the kv segment ids.
    pub const KJ: u32 = 3;
    /// A loaded mask block.
    pub const MASK: u32 = 4;
    /// The fused kernel's dq partial written back (every step it computes, or every step of a
    /// full grid).
    pub const DQ: u32 = 5;
    /// dk and dv written back (the kv block's last q step of its head group).
    pub const KV_OUT: u32 = 6;
    /// The grid's last step: outputs of constant block index written back.
    pub const FINAL: u32 = 7;
    /// Events.
    pub const COUNT: u32 = 8;
}

/// The dkv (or fused) kernel's `pallas_call` as the family declares it (the grid left for the
/// lowering), each window with the step-stream event its block index follows
/// ([`column_event`]); blocks as the kernel's refs see them (a squeezed dimension as 1):
///
/// * tokamax (`_splash_attention_bwd_dkv`): prefetch tables `data_next`, `block_mask` (and
///   `mask_next` when masks are loaded); windows q, dO (block_q_dkv x d, dv), k, v (block_kv_dkv
///   x d, dv), bf16; logsumexp and di (8 x block_q_dkv f32); the segment ids when padded (8 x
///   block_q_dkv and block_kv_dkv x 128, int32), the int8 mask block (block_kv_dkv x
///   block_q_dkv) when loaded, the q positions of a computed mask (8 x block_q_dkv int32);
///   scratch dq (block_q_dkv x d f32, when the kv block has several sub-tiles), dk and dv
///   (f32); outputs the dq partial (block_q_dkv x d), dk and dv (bf16); in the body the score
///   tiles (block_kv_dkv_compute x block_q_dkv f32: s, p, dp, ds).
/// * JAX's Splash (`_splash_attention_bwd_dkv`; the other families' backward): the same inputs
///   (the (bool) mask blocks as int32); the f32 dq (fused, sub-tiled), dk and dv accumulators are
///   outputs of constant block index, one buffer each, written back after the grid's last step.
pub(crate) fn dkv_refs(w: &AttentionCall, b: &BwdBlocks, kernel: Kernel, o: BwdVmemOptions) -> (Vec<Tagged>, Vec<VmemBuffer>) {
    use crate::dtype::Dtype::{Bf16, F32, I32, I8};
    use column_event::{DQ, FINAL, KJ, KV, KV_OUT, MASK, QI, Q_SIDE};
    let (bq, bkv, c, d, dv) = (b.block_q_dkv, b.block_kv_dkv, b.block_kv_dkv_compute, w.head_dim, w.head_dim_v);
    let tokamax = kernel == Kernel::TokamaxSplash;
    // Grid (kv block, head, q block): index maps for reports.
    let map = |dims: &[Option<usize>]| dims.iter().map(|g| g.map_or(Expr::Const(0), Expr::Grid)).collect::<Vec<_>>();
    let (j, h, i) = (Some(0), Some(1), Some(2));
    let input = |name: &str, shape: &[u64], dtype, m: &[Option<usize>], e: u32| (RefDecl::input(name, shape, dtype, map(m)), Some(e));
    let output = |name: &str, shape: &[u64], dtype, m: &[Option<usize>], e: u32| (RefDecl::output(name, shape, dtype, map(m)), Some(e));
    let headless = if tokamax { Q_SIDE } else { QI };
    let mut r: Vec<Tagged> = vec![(RefDecl::prefetch("data_next", &[1]), None), (RefDecl::prefetch("block_mask", &[1]), None)];
    if o.loaded {
        r.push((RefDecl::prefetch("mask_next", &[1]), None));
    }
    r.extend([
        input("q", &[1, bq, d], Bf16, &[h, i, None], Q_SIDE),
        input("k", &[1, bkv, d], Bf16, &[h, j, None], KV),
        input("v", &[1, bkv, dv], Bf16, &[h, j, None], KV),
        input("logsumexp", &[1, 8, bq], F32, &[h, None, i], Q_SIDE),
        input("dO", &[1, bq, dv], Bf16, &[h, i, None], Q_SIDE),
        input("di", &[1, 8, bq], F32, &[h, None, i], Q_SIDE),
    ]);
    if o.padded {
        r.push(input("q segment ids", &[8, bq], I32, &[None, i], headless));
        r.push(input("kv segment ids", &[bkv, 128], I32, &[j, None], KJ));
    }
    if o.loaded {
        r.push(input("mask", &[1, bkv, bq], if tokamax { I8 } else { I32 }, &[None, None, None], MASK));
    }
    if o.computed {
        r.push(input("q positions", &[8, bq], I32, &[None, i], headless));
    }
    // The f32 accumulators: tokamax's scratch, JAX's outputs of constant block index.
    let acc = |name: &str, shape: &[u64]| {
        if tokamax {
            (RefDecl::scratch(name, shape, F32), None)
        } else {
            (RefDecl::output(name, shape, F32, map(&[None, None])).buffered(1), Some(FINAL))
        }
    };
    if b.fused && bkv != c {
        r.push(acc("dq f32", &[bq, d]));
    }
    r.extend([acc("dk f32", &[bkv, d]), acc("dv f32", &[bkv, dv])]);
    if b.fused {
        r.push(output("dq partial", &[1, 1, bq, d], if o.dq_elem == 4 { F32 } else { Bf16 }, &[j, h, i, None], DQ));
    }
    r.push(output("dk", &[1, bkv, d], Bf16, &[h, j, None], KV_OUT));
    r.push(output("dv", &[1, bkv, dv], Bf16, &[h, j, None], KV_OUT));
    (r, vec![VmemBuffer::internal("score tile", &[c, bq], F32)])
}

/// VMEM the dkv (or fused) kernel needs (its declaration, `dkv_refs`, counted by
/// [`crate::vmem::footprint`]).
pub fn dkv_vmem(w: &AttentionCall, b: &BwdBlocks, kernel: Kernel, o: BwdVmemOptions, limit_bytes: u64) -> VmemBudget {
    let (refs, internal) = dkv_refs(w, b, kernel, o);
    super::declare(refs, internal, Vec::new(), 0).0.vmem(limit_bytes)
}

/// JAX's dq kernel's `pallas_call` (`_splash_attention_bwd_dq`), each window with the
/// forward step stream's event its block index follows ([`super::steps::event`]): prefetch
/// tables `data_next`, `block_mask` (and `mask_next` when masks are loaded); windows q, dO
/// (1 x block_q_dq x d, dv), k, v (1 x block_kv_dq x d, dv), bf16; logsumexp and di (1 x 1 x
/// block_q_dq f32); the segment ids when padded (block_q_dq x 128 and 8 x block_kv_dq int32),
/// the mask block when loaded (its bool blocks as int32), the q positions of a computed mask
/// (block_q_dq x 128 int32); outputs the f32 dq accumulator (constant block index, one buffer,
/// written back after the grid's last step) and dq (bf16); in the body the score tiles
/// (block_q_dq x block_kv_dq f32).
pub(crate) fn dq_refs(w: &AttentionCall, b: &BwdBlocks, o: BwdVmemOptions) -> (Vec<Tagged>, Vec<VmemBuffer>) {
    use crate::dtype::Dtype::{Bf16, F32, I32};
    use super::steps::event::{FINAL, KJ, KV, MASK, OUT, Q, QI};
    let (bq, bkv, d, dv) = (b.block_q_dq, b.block_kv_dq, w.head_dim, w.head_dim_v);
    let map = |dims: &[Option<usize>]| dims.iter().map(|g| g.map_or(Expr::Const(0), Expr::Grid)).collect::<Vec<_>>();
    let (h, i, j) = (Some(0), Some(1), Some(2));
    let input = |name: &str, shape: &[u64], dtype, m: &[Option<usize>], e: u32| (RefDecl::input(name, shape, dtype, map(m)), Some(e));
    let mut r: Vec<Tagged> = vec![(RefDecl::prefetch("data_next", &[1]), None), (RefDecl::prefetch("block_mask", &[1]), None)];
    if o.loaded {
        r.push((RefDecl::prefetch("mask_next", &[1]), None));
    }
    r.extend([
        input("q", &[1, bq, d], Bf16, &[h, i, None], Q),
        input("k", &[1, bkv, d], Bf16, &[h, j, None], KV),
        input("v", &[1, bkv, dv], Bf16, &[h, j, None], KV),
        input("logsumexp", &[1, 1, bq], F32, &[h, None, i], Q),
        input("dO", &[1, bq, dv], Bf16, &[h, i, None], Q),
        input("di", &[1, 1, bq], F32, &[h, None, i], Q),
    ]);
    if o.padded {
        r.push(input("q segment ids", &[bq, 128], I32, &[i, None], QI));
        r.push(input("kv segment ids", &[8, bkv], I32, &[None, j], KJ));
    }
    if o.loaded {
        r.push(input("mask", &[1, bq, bkv], I32, &[None, None, None], MASK));
    }
    if o.computed {
        r.push(input("q positions", &[bq, 128], I32, &[i, None], QI));
    }
    r.push((RefDecl::output("dq f32", &[bq, d], F32, map(&[None, None])).buffered(1), Some(FINAL)));
    r.push((RefDecl::output("dq", &[1, bq, d], Bf16, map(&[h, i, None])), Some(OUT)));
    (r, vec![VmemBuffer::internal("score tile", &[bq, bkv], F32)])
}

/// VMEM the dq kernel needs (its declaration, `dq_refs`, counted by
/// [`crate::vmem::footprint`]).
pub fn dq_vmem(w: &AttentionCall, b: &BwdBlocks, o: BwdVmemOptions, limit_bytes: u64) -> VmemBudget {
    let (refs, internal) = dq_refs(w, b, o);
    super::declare(refs, internal, Vec::new(), 0).0.vmem(limit_bytes)
}

/// The dkv kernel's step stream: per batch element (the parallel unit), kv block j, head h, the
/// q blocks of column j (module docs). Every batch element's stream is the same.
#[derive(Debug, Clone)]
pub(crate) struct ColumnSteps {
    batch: u64,
    q_heads: u64,
    group: u64,
    q_blocks: u64,
    /// Per distinct mask, per kv block: its non-empty q blocks as runs of one kind (`kj0` holds
    /// the q block).
    cols: Vec<Vec<Vec<Seg>>>,
    /// JAX's unshrunk grid (fused): per distinct mask, per kv block, the q block a trailing
    /// empty step of that column points at (`MaskInfo.data_next`: the next non-empty block in
    /// (kv, q) order, the first one after the last; with one mask per head shard the mask info
    /// is one head's, so the current head's q-side windows of that block are fetched).
    trail: Vec<Vec<u64>>,
    head_mask: Vec<usize>,
    /// Grid width in q steps per column: q_blocks (static / fused) or the longest column (shrunk).
    width: u64,
    /// Whether empty steps still fetch their q-side blocks (tokamax's static grid).
    fetch_empty: bool,
    /// Whether the grid is shrunk per column, padding at the front (JAX unfused).
    shrunk: bool,
    /// class id by [kind: 0 partial, 1 full][first][last]; empty steps by [first][last] (an
    /// empty step still runs the kernel's `init` and `end` branches).
    class_of: [[[u32; 2]; 2]; 2],
    empty_of: [[u32; 2]; 2],
    /// The copy-set id of each combination of [`column_event`]s.
    copies: Vec<u32>,
    /// Whether partial steps load mask blocks.
    loads_mask: bool,
}

/// What the dkv kernel's q-side windows hold in VMEM, carried from one step to the next (copy
/// elision across lines).
#[derive(Debug, Clone, Copy, Default)]
struct QSide {
    /// (batch x head, q block) of q, dO, logsumexp and di.
    block: Option<(u32, u64)>,
    /// q block of the windows whose index map has no head (JAX: `(0, next_i)`).
    qpos: Option<u64>,
}

impl ColumnSteps {
    /// The events of a step pointing its q-side windows at (`bh`, q block `qi`), and the new
    /// state.
    fn q_fetch(st: &mut QSide, bh: u32, qi: u64) -> usize {
        let mut events = 0;
        if st.block != Some((bh, qi)) {
            events |= 1 << column_event::Q_SIDE;
            st.block = Some((bh, qi));
        }
        if st.qpos != Some(qi) {
            events |= 1 << column_event::QI;
            st.qpos = Some(qi);
        }
        events
    }

    /// The steps of one (kv block, head) line. Coordinates are (batch x head, kv block, q block):
    /// the q block varies along a run.
    fn line(&self, j: u64, h: u64, b: u64, st: &mut QSide, f: &mut dyn FnMut(&Step, u64)) {
        let col = &self.cols[self.head_mask[h as usize]][j as usize];
        let len: u64 = col.iter().map(|s| s.n as u64).sum();
        let first_head = h.is_multiple_of(self.group);
        let last_head = h % self.group == self.group - 1;
        let bh = (b * self.q_heads + h) as u32;
        // The line's steps as (first q block, kind or None for an empty step, count).
        let mut items: Vec<(u64, Option<TileKind>, u64)> = Vec::new();
        if self.shrunk {
            if self.width > len {
                items.push((0, None, self.width - len));
            }
            items.extend(col.iter().map(|s| (s.kj0 as u64, Some(s.kind), s.n as u64)));
        } else {
            let mut i = 0u64;
            for s in col {
                if (s.kj0 as u64) > i {
                    items.push((i, None, s.kj0 as u64 - i));
                }
                items.push((s.kj0 as u64, Some(s.kind), s.n as u64));
                i = (s.kj0 + s.n) as u64;
            }
            if self.q_blocks > i {
                items.push((i, None, self.q_blocks - i));
            }
        }
        let total: u64 = items.iter().map(|t| t.2).sum();
        let mut idx = 0u64;
        let n_items = items.len();
        for (it, (q0, kind, n)) in items.into_iter().enumerate() {
            // JAX's unshrunk grid: an empty stretch points at the next non-empty q block of the
            // column, or past the column's last at `trail` (copied on the stretch's first step).
            let target = if it + 1 < n_items { q0 + n } else { self.trail[self.head_mask[h as usize]][j as usize] };
            let mut k = 0;
            while k < n {
                let i = idx + k;
                // The line's first and last steps stand alone; so does the first step of a
                // stretch (its copies may be elided); the rest run in stretches.
                let run = if i == 0 || i + 1 == total || k == 0 { 1 } else { (n - k).min(total - 1 - i) };
                // k and v change with the (kv block, kv head): the first head of a group loads them.
                let load_kv = i == 0 && first_head;
                let last = i + 1 == total && last_head;
                let empty = self.empty_of[usize::from(load_kv)][usize::from(last)];
                let both = 1 << column_event::Q_SIDE | 1 << column_event::QI;
                let (class, q_in) = match kind {
                    None if self.fetch_empty => (empty, both),
                    // JAX's shrunk grid: padding steps point at q block 0 (data_next = 0).
                    None if self.shrunk && k == 0 => (empty, Self::q_fetch(st, bh, 0)),
                    // JAX's full grid: empty steps point at the next non-empty block.
                    None if !self.shrunk && k == 0 => (empty, Self::q_fetch(st, bh, target)),
                    None => (empty, 0),
                    Some(kd) => {
                        let ki = usize::from(kd == TileKind::Full);
                        let mask = if kd == TileKind::Partial && self.loads_mask { 1 << column_event::MASK } else { 0 };
                        let q = if self.fetch_empty {
                            both
                        } else if k == 0 {
                            Self::q_fetch(st, bh, q0)
                        } else {
                            // Inside a stretch the q block changes every step.
                            st.block = Some((bh, q0 + k + run - 1));
                            st.qpos = Some(q0 + k + run - 1);
                            both
                        };
                        (self.class_of[ki][usize::from(load_kv)][usize::from(last)], q | mask)
                    }
                };
                // k and v with the (kv block, kv head); the kv segment ids with the kv block.
                let kv = if load_kv { 1 << column_event::KV | if h == 0 { 1 << column_event::KJ } else { 0 } } else { 0 };
                // The fused kernel's dq partial (declared only when fused) after every step that computes,
                // and every step of an unshrunk grid.
                let dq = if kind.is_some() || !self.shrunk { 1 << column_event::DQ } else { 0 };
                let final_out = if last && j + 1 == self.cols[0].len() as u64 && h + 1 == self.q_heads { 1 << column_event::FINAL } else { 0 };
                let events = q_in | kv | dq | if last { 1 << column_event::KV_OUT } else { 0 } | final_out;
                f(&Step { class, copies: self.copies[events], coords: [bh, j as u32, (q0 + k) as u32, 0] }, run);
                k += run;
            }
            idx += n;
        }
    }

    /// Which of a program's `n` step classes some step of the grid runs (every batch element
    /// runs the same classes: the first is walked).
    pub(crate) fn used_classes(&self, n: usize) -> Vec<bool> {
        let mut used = vec![false; n];
        if self.batch > 0 {
            self.element(0, &mut |s, _| {
                if let Some(u) = used.get_mut(s.class as usize) {
                    *u = true;
                }
            });
        }
        used
    }

    fn element(&self, b: u64, f: &mut dyn FnMut(&Step, u64)) {
        let mut st = QSide::default();
        for j in 0..self.cols[0].len() as u64 {
            for h in 0..self.q_heads {
                self.line(j, h, b, &mut st, f);
            }
        }
    }
}

impl tpusim_model::StepStream for ColumnSteps {
    /// The runs of batch elements `lo..hi`, unfolded.
    fn for_each_run_range(&self, lo: u64, hi: u64, f: &mut dyn FnMut(&Step, u64)) {
        for b in lo..hi.min(self.batch) {
            self.element(b, f);
        }
    }

    /// The runs of batch elements `lo..hi`, each element's stream emitted once and repeated.
    fn for_each_run_block(&self, lo: u64, hi: u64, f: &mut dyn FnMut(RunItem<'_>)) {
        let hi = hi.min(self.batch);
        if lo >= hi {
            return;
        }
        f(RunItem::HeadStart);
        self.element(lo, &mut |s, n| f(RunItem::Run(s, n)));
        if hi - lo > 1 {
            f(RunItem::RepeatHead(hi - lo - 1));
        }
    }
}

/// Transposes row classifications into columns: per kv block, its non-empty q blocks as runs.
fn columns(rows: &[Vec<Seg>], kv_blocks: u64) -> Vec<Vec<Seg>> {
    let mut cols: Vec<Vec<Seg>> = vec![Vec::new(); kv_blocks as usize];
    for (qi, row) in rows.iter().enumerate() {
        for seg in row {
            for kj in seg.kj0..seg.kj0 + seg.n {
                let col = &mut cols[kj as usize];
                match col.last_mut() {
                    Some(s) if s.kind == seg.kind && s.kj0 + s.n == qi as u32 => s.n += 1,
                    _ => col.push(Seg { kj0: qi as u32, n: 1, kind: seg.kind }),
                }
            }
        }
    }
    cols
}

/// Tile counts of a classification over batch and heads (for reports).
pub(crate) fn tile_counts(w: &AttentionCall, cl: &Classified, masked: impl Fn(TileKind) -> bool) -> (TileCounts, u64, u64, u64) {
    let mut t = TileCounts::default();
    let (mut kept, mut exact, mut visited) = (0, 0, 0);
    for h in 0..w.q_heads {
        let st = cl.stats[cl.head_mask[h as usize]];
        t.total += w.batch * (st.empty + st.partial + st.full);
        t.empty += w.batch * st.empty;
        t.partial += w.batch * st.partial;
        t.full += w.batch * st.full;
        t.visited += w.batch * (st.partial + st.full);
        t.masked += w.batch * (if masked(TileKind::Partial) { st.partial } else { 0 } + if masked(TileKind::Full) { st.full } else { 0 });
        kept += w.batch * st.kept;
        exact += w.batch * st.exact_kept;
        visited += w.batch * st.visited_pairs;
    }
    (t, kept, exact, visited)
}

fn masked_fn(kernel: Kernel, masking: Masking, any_not_full: bool) -> impl Fn(TileKind) -> bool {
    // JAX's backward kernels apply the mask on every non-empty block when a mask source exists
    // (no mask-free path); tokamax's only on partial blocks.
    let all = kernel != Kernel::TokamaxSplash && any_not_full;
    move |k: TileKind| match masking {
        Masking::None => false,
        _ if all => true,
        Masking::Partial => k == TileKind::Partial,
        Masking::All => k == TileKind::Partial || any_not_full,
    }
}

/// Lowers the dkv kernel (fused when `cfg.bwd.fused`; module docs).
///
/// # Errors
/// [`KernelError::Config`] naming the backward block fields, [`KernelError::Vmem`] and
/// [`KernelError::Hbm`] as the forward's.
pub fn lower_dkv(chip: &ChipModel, w: &AttentionCall, cfg: &super::SplashConfig) -> Result<Program, KernelError> {
    let b = cfg.bwd;
    w.validate()?;
    w.mask.check_lengths(w.q_len, w.kv_len)?;
    check_blocks_named(
        chip,
        (w.q_len, w.kv_len),
        (b.block_q_dkv, b.block_kv_dkv, b.block_kv_dkv_compute),
        ["`block_q_dkv`", "`block_kv_dkv`", "`block_kv_dkv_compute`"],
    )?;
    if !static_grid(cfg.kernel) {
        super::check_q_lanes(chip, w.q_len, b.block_q_dkv, "`block_q_dkv`", JAX_Q_LANES)?;
    }
    let cl = classify(w, b.block_q_dkv, b.block_kv_dkv, cfg.tile_align, ("`block_q_dkv`", "`block_kv_dkv`"))?;
    let (qb, kb) = (cl.grid.q_tiles(), cl.grid.kv_tiles());
    let dq_elem = dq_partial_bytes(cfg.kernel, kb);
    let source = if cl.distinct.iter().any(|m| m.expression_terms().loaded_only) { MaskSource::Loaded } else { cfg.mask_source };
    let any_not_full = cl.distinct.iter().any(|m| !m.is_full()) || cfg.tile_align;
    let computed = any_not_full && source == MaskSource::Computed;
    let loaded = any_not_full && source == MaskSource::Loaded && cfg.masking != Masking::None;
    let opts = BwdVmemOptions { dq_elem, computed, loaded, padded: padded_lengths(w, b.block_q_dkv, b.block_kv_dkv) };
    let (refs, internal) = dkv_refs(w, &b, cfg.kernel, opts);
    let vmem = super::declare(refs.clone(), internal.clone(), Vec::new(), 0).0.vmem(cfg.vmem_limit(chip));
    crate::check_vmem(&vmem, chip)?;
    let partials = if b.fused { kb * (w.batch * w.q_heads) * cl.grid.padded_q_len() * w.head_dim * dq_elem } else { 0 };
    let grads = (w.batch * w.q_heads * w.q_len + w.batch * w.kv_heads * w.kv_len) * (w.head_dim + w.head_dim_v) * 2;
    // The fused kernel's dq partials (one per kv block) can outgrow everything else: then the
    // block that sets their count is what to change.
    let advice = (partials > grads).then(|| {
        format!(
            "{partials} of them are the fused backward's dq partials, one per kv block ({kb} blocks of `block_kv_dkv` = {}): a larger `block_kv_dkv` needs fewer; or use a smaller `batch` or shorter sequences",
            b.block_kv_dkv
        )
    });
    super::check_hbm(chip, w, true, partials + grads, advice)?;
    // The op program's mask (`bwd_ops`): the costliest distinct mask's function, the partial
    // block loaded (JAX's int32, tokamax's int8), segment ids for padded lengths.
    let plan = super::mask_plan(&cl, source, any_not_full, static_grid(cfg.kernel));
    let masked = masked_fn(cfg.kernel, cfg.masking, any_not_full);
    let step = |m: bool, first: bool, runs: bool, last: bool| BwdStep {
        block_q: b.block_q_dkv,
        block_kv: b.block_kv_dkv,
        compute: b.block_kv_dkv_compute,
        d: w.head_dim,
        dv: w.head_dim_v,
        mask: m.then_some(&plan),
        base2: cfg.exp == Exp::Base2,
        fused: b.fused,
        first,
        runs,
        last,
    };
    // An empty step runs what the kernel runs outside its compute branch: the fused kernel's dq
    // partial zeroed (tokamax writes one every step; JAX zeroes it every step), and `init` or
    // `end` at the line's first or last step.
    // The classes' keys now, their bodies once the step stream says which classes run
    // ([`super::build_used_bodies`]).
    let mut classes = Vec::new();
    let mut body_args: Vec<super::BodyArgs> = Vec::new();
    let mut empty_of = [[0u32; 2]; 2];
    for first in [false, true] {
        for last in [false, true] {
            empty_of[usize::from(first)][usize::from(last)] = classes.len() as u32;
            body_args.push(Some((false, first, false, last)));
            classes.push(StepClass { key: ClassKey { tile: "empty", masked: false, first, last }, body: StepBody::default() });
        }
    }
    let mut class_of = [[[0u32; 2]; 2]; 2];
    for (k, kind) in [TileKind::Partial, TileKind::Full].into_iter().enumerate() {
        for first in [false, true] {
            for last in [false, true] {
                let m = masked(kind);
                class_of[k][usize::from(first)][usize::from(last)] = classes.len() as u32;
                body_args.push(Some((m, first, true, last)));
                classes.push(StepClass {
                    key: ClassKey { tile: if k == 0 { "partial" } else { "full" }, masked: m, first, last },
                    body: StepBody::default(),
                });
            }
        }
    }
    let (tiles, kept, exact, visited_pairs) = tile_counts(w, &cl, &masked);
    let static_g = static_grid(cfg.kernel);
    let shrunk = !b.fused && !static_g;
    let cols: Vec<Vec<Vec<Seg>>> = cl.rows.iter().map(|rows| columns(rows, kb)).collect();
    let trail: Vec<Vec<u64>> = cols
        .iter()
        .map(|c| {
            let first = |j: usize| c[j].first().map(|s| s.kj0 as u64);
            let wrap = (0..c.len()).find_map(first).unwrap_or(0);
            let mut t = vec![wrap; c.len()];
            let mut next = wrap;
            for j in (0..c.len()).rev() {
                t[j] = next;
                next = first(j).unwrap_or(next);
            }
            t
        })
        .collect();
    let col_width = cols.iter().flat_map(|c| c.iter().map(|segs| segs.iter().map(|s| s.n as u64).sum::<u64>())).max().unwrap_or(0);
    let width = if shrunk { col_width } else { qb };
    let (decl, tags) = super::declare(refs, internal, vec![w.batch, kb, w.q_heads, width], 1);
    let mut sets = CopySets::default();
    let copies = super::copy_table(&decl, &tags, column_event::COUNT, &mut sets);
    let steps = ColumnSteps {
        batch: w.batch,
        q_heads: w.q_heads,
        group: w.q_heads / w.kv_heads,
        q_blocks: qb,
        cols,
        trail,
        head_mask: cl.head_mask.clone(),
        width,
        fetch_empty: static_g,
        shrunk,
        class_of,
        empty_of,
        copies,
        loads_mask: loaded,
    };
    super::build_used_bodies(&mut classes, &body_args, &steps.used_classes(body_args.len()), |m, first, runs, last| {
        bwd_body(true, &decl, &step(m, first, runs, last))
    });
    let grid_steps = w.batch * kb * w.q_heads * width;
    let info = ProgramInfo {
        kind: tpusim_model::KernelKind::Attention,
        kernel: if b.fused { "attention backward (fused dq/dk/dv)".into() } else { "attention backward dkv".into() },
        grid: vec![
            ("batch".into(), w.batch),
            ("kv blocks".into(), kb),
            ("heads".into(), w.q_heads),
            (if shrunk { "q steps (shrunk)".into() } else { "q blocks".into() }, width),
        ],
        blocks: vec![
            ("block_q_dkv".into(), b.block_q_dkv),
            ("block_kv_dkv".into(), b.block_kv_dkv),
            ("block_kv_dkv_compute".into(), b.block_kv_dkv_compute),
        ],
        padded: vec![("q_len".into(), w.q_len, cl.grid.padded_q_len()), ("kv_len".into(), w.kv_len, cl.grid.padded_kv_len())],
        tiles: Some(tiles),
        kept_pairs: kept,
        visited_pairs,
        exact_kept_pairs: exact,
        grid_steps,
        smem_bytes: 0,
    };
    Ok(Program::new(classes, w.batch, vmem, info, decl, sets, steps))
}

/// A backward step's body (`dkv`: the dkv kernel's, else the dq kernel's) from its op program
/// ([`super::bwd_ops`]), shared between lowerings ([`crate::body::cached_pair`]: the step and
/// its row's last step are built together).
///
/// The key leaves the declaration out, as the forward's ([`super::op_body`]).
fn bwd_body(dkv: bool, decl: &KernelDecl, s: &BwdStep<'_>) -> StepBody {
    let key = |last: bool| format!("bwd{dkv}{:?}", BwdStep { last, ..s.clone() });
    crate::body::cached_pair([key(false), key(true)], usize::from(s.last), || {
        if dkv {
            super::bwd_ops::dkv_step(decl, s)
        } else {
            super::bwd_ops::dq_step(decl, s)
        }
    })
}

/// Lowers JAX's dq kernel (the unfused backward's first kernel; module docs).
///
/// # Errors
/// As [`lower_dkv`], naming `block_q_dq` and `block_kv_dq`.
pub fn lower_dq(chip: &ChipModel, w: &AttentionCall, cfg: &super::SplashConfig) -> Result<Program, KernelError> {
    let b = cfg.bwd;
    w.validate()?;
    check_blocks_named(
        chip,
        (w.q_len, w.kv_len),
        (b.block_q_dq, b.block_kv_dq, b.block_kv_dq),
        ["`block_q_dq`", "`block_kv_dq`", "`block_kv_dq`"],
    )?;
    super::check_q_lanes(chip, w.q_len, b.block_q_dq, "`block_q_dq`", JAX_Q_LANES)?;
    let cl = classify(w, b.block_q_dq, b.block_kv_dq, cfg.tile_align, ("`block_q_dq`", "`block_kv_dq`"))?;
    let source = if cl.distinct.iter().any(|m| m.expression_terms().loaded_only) { MaskSource::Loaded } else { cfg.mask_source };
    let any_not_full = cl.distinct.iter().any(|m| !m.is_full()) || cfg.tile_align;
    let loaded = any_not_full && source == MaskSource::Loaded && cfg.masking != Masking::None;
    let computed = any_not_full && source == MaskSource::Computed;
    let opts = BwdVmemOptions { dq_elem: 2, computed, loaded, padded: padded_lengths(w, b.block_q_dq, b.block_kv_dq) };
    let (refs, internal) = dq_refs(w, &b, opts);
    let vmem = super::declare(refs.clone(), internal.clone(), Vec::new(), 0).0.vmem(cfg.vmem_limit(chip));
    crate::check_vmem(&vmem, chip)?;
    let plan = super::mask_plan(&cl, source, any_not_full, false);
    let masked = masked_fn(cfg.kernel, cfg.masking, any_not_full);
    let step = |m: bool, first: bool, runs: bool, last: bool| BwdStep {
        block_q: b.block_q_dq,
        block_kv: b.block_kv_dq,
        compute: b.block_kv_dq,
        d: w.head_dim,
        dv: w.head_dim_v,
        mask: m.then_some(&plan),
        base2: false,
        fused: false,
        first,
        runs,
        last,
    };
    // The classes' keys now, their bodies once the step stream says which classes run
    // ([`super::build_used_bodies`]).
    let mut classes =
        vec![StepClass { key: ClassKey { tile: "empty", masked: false, first: false, last: false }, body: StepBody::default() }];
    let mut body_args: Vec<super::BodyArgs> = vec![None];
    let mut class_of = [[[0u32; 2]; 2]; 2];
    for (k, kind) in [TileKind::Partial, TileKind::Full].into_iter().enumerate() {
        for first in [false, true] {
            for last in [false, true] {
                let m = masked(kind);
                class_of[k][usize::from(first)][usize::from(last)] = classes.len() as u32;
                body_args.push(Some((m, first, true, last)));
                classes.push(StepClass {
                    key: ClassKey { tile: if k == 0 { "partial" } else { "full" }, masked: m, first, last },
                    body: StepBody::default(),
                });
            }
        }
    }
    // `end()` runs at the row's last grid step (`j == grid_width - 1`), an empty padding step
    // when the row is shorter than the grid: a finalize-only class (the dq cast and store).
    let finalize_class = {
        body_args.push(Some((false, false, false, true)));
        classes.push(StepClass { key: ClassKey { tile: "empty", masked: false, first: false, last: true }, body: StepBody::default() });
        Some(classes.len() as u32 - 1)
    };
    let (tiles, kept, exact, visited_pairs) = tile_counts(w, &cl, &masked);
    let width = cl.width;
    let (decl, tags) = super::declare(refs, internal, vec![w.batch, w.q_heads, cl.grid.q_tiles(), width], 1);
    let mut sets = CopySets::default();
    let copies = super::copy_table(&decl, &tags, super::steps::event::COUNT, &mut sets);
    let steps = Steps {
        batch: w.batch,
        q_heads: w.q_heads,
        group: w.q_heads / w.kv_heads,
        rows: cl.rows.clone(),
        head_mask: cl.head_mask.clone(),
        traversal: Traversal::FullGrid,
        width,
        class_of,
        empty_class: 0,
        finalize_class,
        // Padding steps point at kv block 0 (the dq MaskInfo's data_next, as the forward's).
        pad_to_block0: true,
        copies,
        loads_mask: loaded,
        final_out: true,
        masked_partial: cfg.masking != Masking::None,
        // JAX dedups identical partial mask blocks (splash::steps).
        mask_dedup: cl.distinct.iter().all(super::diagonal_invariant).then_some((b.block_q_dq, b.block_kv_dq)),
        unit_span: w.q_heads,
    };
    super::build_used_bodies(&mut classes, &body_args, &steps.used_classes(body_args.len()), |m, first, runs, last| {
        bwd_body(false, &decl, &step(m, first, runs, last))
    });
    let info = ProgramInfo {
        kind: tpusim_model::KernelKind::Attention,
        kernel: "attention backward dq".into(),
        grid: vec![
            ("batch x heads".into(), w.batch * w.q_heads),
            ("q blocks".into(), cl.grid.q_tiles()),
            ("kv steps (shrunk)".into(), width),
        ],
        blocks: vec![("block_q_dq".into(), b.block_q_dq), ("block_kv_dq".into(), b.block_kv_dq)],
        padded: vec![("q_len".into(), w.q_len, cl.grid.padded_q_len()), ("kv_len".into(), w.kv_len, cl.grid.padded_kv_len())],
        tiles: Some(tiles),
        kept_pairs: kept,
        visited_pairs,
        exact_kept_pairs: exact,
        grid_steps: w.batch * w.q_heads * cl.grid.q_tiles() * width,
        smem_bytes: 0,
    };
    // Every dimension of JAX's dq kernel is "arbitrary": only a vmapped batch is parallel, so a
    // parallel unit is a batch element's heads.
    Ok(Program::new(classes, w.batch, vmem, info, decl, sets, steps))
}
