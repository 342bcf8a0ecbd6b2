//! Forward Splash Attention (and its sparse descendants) lowered to grid steps.
//!
//! Grid: (batch x q heads, q blocks, kv steps), run in lexicographic order (attention-kernels.md).
//! Per computed step, for each `block_kv_compute`-wide sub-tile and each [`SLAB_ROWS`]-row slab
//! of the q block, the body issues (op name: unit, work):
//!
//! | op | unit | work per slab of r rows and c columns |
//! |---|---|---|
//! | `qk` | MXU | r x d x c matmul (k^T chunk stationary) |
//! | `mask` | VPU | (r c / 1024) x mask ops (masked steps only; see [`mask_ops_per_vreg`]) |
//! | `rowmax` | VPU | 2 r c / 1024 (pop scores from the MXU result buffer; element-wise max across lane chunks) |
//! | `rowmax_xlu` | XLU | r / 8 cross-lane reductions |
//! | `sub` | VPU | r c / 1024 (s - m) + 2 r / 8 (m update, alpha argument) |
//! | `exp` | EUP | r c / 1024 + r / 8 (p and alpha) |
//! | `sum_cast` | VPU | 2 r c / 1024 (row-sum accumulate, cast p to bf16) |
//! | `rowsum_xlu` | XLU | r / 8 |
//! | `pv` | MXU | r x c x dv matmul (v chunk stationary) |
//! | `acc` | VPU | 3 r dv / 1024 + 2 r / 8 (pop pv; o_acc = alpha o_acc + pv; l update) |
//!
//! plus `init` (zero m, l, o_acc: r (256 + dv) / 1024 register stores) on a row's first step and
//! `finalize` (reciprocal of l on the EUP, o = o_acc / l and cast: 1.5 r dv / 1024 VPU ops) on its
//! last. m and l are lane-replicated (r x 128), so per-row work is r / 8 registers.
//!
//! DMAs: q block (block_q x d bf16) when the (batch, head, q block) index changes; k and v blocks
//! (block_kv x d and block_kv x dv bf16) when the (batch, kv head, kv block) index changes (GQA
//! heads of one group share them); an int8 mask block per masked partial step when masks are
//! loaded; the o block (block_q x dv bf16) after a row's last step.
//!
//! Traversals: `full-grid` (JAX Splash after grid shrinking: every row has as many steps as the
//! longest row's non-empty tiles; surplus steps are empty: fixed step cost, no compute, no copy)
//! and `compact` (a grid over non-empty tiles only: tokamax / MaxDiffusion sparse kernels).

use crate::ir::{ClassKey, Step, StepBody, StepClass, Work};
pub use crate::options::{Kernel, MaskSource, Masking, Traversal};
use crate::{KernelError, Program, ProgramInfo, StepSource, TileCounts, VmemBudget, SLAB_ROWS};
use petgraph::graph::NodeIndex;
use serde::Serialize;
use std::collections::HashMap;
use tpusim_chip::ChipModel;
use tpusim_workload::tiles::{for_each_tile_row, TileGrid, TileKind};
use tpusim_workload::{AttentionCall, Mask};

/// Block sizes and strategy of a Splash-style attention kernel.
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
    /// Scoped VMEM limit in bytes; `None` uses the chip's default.
    pub vmem_limit_bytes: Option<u64>,
}

impl SplashConfig {
    /// A kernel family's configuration with its library's defaults ([`Kernel::defaults`]):
    /// blocks, traversal, masking and mask source; `block_kv_compute` = `block_kv` when the
    /// family leaves it unset.
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
            vmem_limit_bytes: None,
        }
    }

    /// The default family's configuration ([`Kernel::default`]) with the given blocks, the
    /// compute width by [`default_compute`] when `compute` is `None`.
    pub fn with_blocks(w: &AttentionCall, chip: &ChipModel, block_q: u64, block_kv: u64, compute: Option<u64>) -> Self {
        let mut c = SplashConfig { block_q, block_kv, block_kv_compute: block_kv, ..SplashConfig::for_family(Kernel::default()) };
        c.block_kv_compute = compute.unwrap_or_else(|| default_compute(w, &c, chip));
        c
    }
}

/// The default `block_kv_compute` for a configuration: `block_kv` itself (JAX Splash's default),
/// or, when that tiling overflows the scoped VMEM limit, the largest multiple of 128 that divides
/// `block_kv` and fits (what a kernel author or autotuner does). Falls back to the smallest
/// candidate, whose VMEM error lowering then reports.
pub fn default_compute(w: &AttentionCall, cfg: &SplashConfig, chip: &ChipModel) -> u64 {
    let bkv = cfg.block_kv;
    if bkv == 0 || bkv % 128 != 0 {
        return bkv;
    }
    let limit = cfg.vmem_limit_bytes.unwrap_or_else(|| chip.vmem_limit_bytes());
    let candidates: Vec<u64> = (1..=bkv / 128).rev().map(|m| m * 128).filter(|c| bkv % c == 0).collect();
    candidates
        .iter()
        .copied()
        .find(|&c| vmem_budget(w, &SplashConfig { block_kv_compute: c, ..cfg.clone() }, limit).total() <= limit)
        .unwrap_or(128)
}

/// VPU register operations per (8,128) register of scores to apply a mask.
///
/// Computed masks: 2 (q and kv positions from iota plus block offsets) + one per comparison,
/// position arithmetic and boolean combination in the mask expression + 1 (the select), + 2 when
/// the sequence is padded (segment-id compare and combine). Loaded masks: 3 (unpack the int8
/// block, compare, select). A mask that can only be loaded (a block file) always costs 3.
pub fn mask_ops_per_vreg(mask: &Mask, source: MaskSource, padded: bool) -> f64 {
    let t = mask.expression_terms();
    match source {
        MaskSource::Loaded => 3.0,
        MaskSource::Computed if t.loaded_only => 3.0,
        MaskSource::Computed => {
            let pad = if padded { 2.0 } else { 0.0 };
            2.0 + (t.compares + t.arith + t.combines) as f64 + 1.0 + pad
        }
    }
}

/// Shapes of one attention step body.
#[derive(Debug, Clone, Copy, PartialEq)]
struct BodyShape {
    block_q: u64,
    block_kv: u64,
    compute: u64,
    d: u64,
    dv: u64,
    mask_ops: Option<f64>,
    first: bool,
    last: bool,
}

fn vregs(rows: u64, cols: u64) -> f64 {
    (rows * cols) as f64 / 1024.0
}

/// Builds the dependency graph of one computed attention step (module docs).
fn attention_body(s: &BodyShape) -> StepBody {
    let mut b = StepBody::default();
    let slabs = s.block_q.div_ceil(SLAB_ROWS);
    let chunks = s.block_kv / s.compute;
    let c = s.compute;
    let mut prev_max: Vec<Option<NodeIndex>> = vec![None; slabs as usize];
    let mut prev_acc: Vec<Option<NodeIndex>> = vec![None; slabs as usize];
    // Software-pipelined issue slots: stage k of slab g (g counts slabs over all sub-tiles) issues
    // at slot g + SKEW[k], so each unit interleaves stages of successive slabs and an operation's
    // input was produced a few slabs' worth of work earlier (covering MXU, XLU and EUP latency).
    // Stages: init, qk, mask, rowmax, rowmax_xlu, sub, exp, sum_cast, rowsum_xlu, pv, acc, recip,
    // finalize. Deeper skews than these change no prediction by more than 0.1%.
    const SKEW: [u64; 13] = [0, 0, 3, 3, 4, 4, 5, 5, 6, 7, 9, 10, 10];
    let slot = |g: u64, stage: usize| (g + SKEW[stage]) * 16 + stage as u64;
    for j in 0..chunks {
        for si in 0..slabs {
            let g = j * slabs + si;
            let r = SLAB_ROWS.min(s.block_q - si * SLAB_ROWS);
            let sv = vregs(r, c);
            let rv = r as f64 / 8.0;
            let i = si as usize;
            if s.first && j == 0 {
                let init = b.add("init", Work::Vector { ops: vregs(r, 256 + s.dv), masked_vregs: 0.0 }, &[], slot(g, 0));
                prev_max[i] = Some(init);
                prev_acc[i] = Some(init);
            }
            let qk = b.add("qk", Work::Matmul { m: r, k: s.d, n: c, m_total: s.block_q }, &[], slot(g, 1));
            let scores = match s.mask_ops {
                Some(ops) => b.add("mask", Work::Vector { ops: sv * ops, masked_vregs: sv }, &[qk], slot(g, 2)),
                None => qk,
            };
            // Pop the f32 scores from the MXU result buffer, then the element-wise max.
            let rowmax = b.add("rowmax", Work::Vector { ops: 2.0 * sv, masked_vregs: 0.0 }, &[scores], slot(g, 3));
            let mut deps = vec![rowmax];
            deps.extend(prev_max[i]);
            let rowmax_x = b.add("rowmax_xlu", Work::CrossLane { vregs: rv }, &deps, slot(g, 4));
            prev_max[i] = Some(rowmax_x);
            let sub = b.add("sub", Work::Vector { ops: sv + 2.0 * rv, masked_vregs: 0.0 }, &[rowmax_x], slot(g, 5));
            let exp = b.add("exp", Work::Transcendental { vregs: sv + rv }, &[sub], slot(g, 6));
            let post = b.add("sum_cast", Work::Vector { ops: 2.0 * sv, masked_vregs: 0.0 }, &[exp], slot(g, 7));
            let rowsum = b.add("rowsum_xlu", Work::CrossLane { vregs: rv }, &[post], slot(g, 8));
            let pv = b.add("pv", Work::Matmul { m: r, k: c, n: s.dv, m_total: s.block_q }, &[post], slot(g, 9));
            let mut deps = vec![pv, rowsum];
            deps.extend(prev_acc[i]);
            let acc = b.add("acc", Work::Vector { ops: 3.0 * vregs(r, s.dv) + 2.0 * rv, masked_vregs: 0.0 }, &deps, slot(g, 10));
            prev_acc[i] = Some(acc);
            if s.last && j == chunks - 1 {
                let recip = b.add("recip", Work::Transcendental { vregs: rv }, &[acc], slot(g, 11));
                b.add("finalize", Work::Vector { ops: 1.5 * vregs(r, s.dv), masked_vregs: 0.0 }, &[recip], slot(g, 12));
            }
        }
    }
    b
}

/// VMEM a Splash tiling needs (attention-kernels.md): double-buffered q, k, v, o blocks; m and l
/// lane-replicated (block_q x 128 f32 each); o_acc (block_q x dv f32); the score sub-tile
/// (block_q x block_kv_compute f32) and p (same, bf16); double-buffered int8 mask blocks when
/// loaded.
pub fn vmem_budget(w: &AttentionCall, cfg: &SplashConfig, limit_bytes: u64) -> VmemBudget {
    let (bq, bkv, c, d, dv) = (cfg.block_q, cfg.block_kv, cfg.block_kv_compute, w.head_dim, w.head_dim_v);
    let mut buffers = vec![
        ("q x2".to_string(), 2 * bq * d * 2),
        ("k x2".to_string(), 2 * bkv * d * 2),
        ("v x2".to_string(), 2 * bkv * dv * 2),
        ("o x2".to_string(), 2 * bq * dv * 2),
        ("m,l".to_string(), 2 * bq * 128 * 4),
        ("o_acc".to_string(), bq * dv * 4),
        ("scores f32".to_string(), bq * c * 4),
        ("p bf16".to_string(), bq * c * 2),
    ];
    let loaded = cfg.mask_source == MaskSource::Loaded || w.mask.expression_terms().loaded_only;
    if loaded && cfg.masking != Masking::None && !w.mask.is_full() {
        buffers.push(("mask int8 x2".to_string(), 2 * bq * bkv));
    }
    VmemBudget { buffers, limit_bytes }
}

fn check_blocks(w: &AttentionCall, cfg: &SplashConfig, chip: &ChipModel) -> Result<(), KernelError> {
    let sub = chip.vpu.sublanes.value as u64;
    let lanes = chip.vpu.lanes.value as u64;
    let (bq, bkv, c) = (cfg.block_q, cfg.block_kv, cfg.block_kv_compute);
    for (f, v) in [("`block_q`", bq), ("`block_kv`", bkv), ("`block_kv_compute`", c)] {
        if v == 0 || v > tpusim_workload::MAX_DIM {
            return Err(KernelError::config(f, v, format!("expected a whole number from 1 to {}", tpusim_workload::MAX_DIM)));
        }
    }
    if bq % sub != 0 && bq != w.q_len {
        return Err(KernelError::config(
            "`block_q`",
            bq,
            format!("must be a multiple of {sub} (the sublanes of an ({sub}, {lanes}) tile) or equal `q_len` ({})", w.q_len),
        ));
    }
    if bq > w.q_len.next_multiple_of(sub) {
        return Err(KernelError::config("`block_q`", bq, format!("must not exceed `q_len` ({}) rounded up to {sub}", w.q_len)));
    }
    if bkv % lanes != 0 && bkv != w.kv_len {
        return Err(KernelError::config(
            "`block_kv`",
            bkv,
            format!("must be a multiple of {lanes} (the lanes of an ({sub}, {lanes}) tile: kv positions are the score tile's lane dimension) or equal `kv_len` ({})", w.kv_len),
        ));
    }
    if bkv > w.kv_len.next_multiple_of(lanes) {
        return Err(KernelError::config("`block_kv`", bkv, format!("must not exceed `kv_len` ({}) rounded up to {lanes}", w.kv_len)));
    }
    if c % lanes != 0 && c != bkv {
        return Err(KernelError::config("`block_kv_compute`", c, format!("must be a multiple of {lanes} or equal `block_kv` ({bkv})")));
    }
    if bkv % c != 0 {
        return Err(KernelError::config("`block_kv_compute`", c, format!("must divide `block_kv` ({bkv})")));
    }
    Ok(())
}

/// One item of a run-length step stream with head repetition ([`crate::Program::for_each_run_block`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RunItem<'a> {
    /// A new (batch, head) begins; the runs until the next `HeadStart` belong to it.
    HeadStart,
    /// `n` consecutive steps identical to the given one but for their kv coordinate.
    Run(&'a Step, u64),
    /// The previous head's runs repeat this many more times (for the following heads).
    RepeatHead(u64),
}

/// A run of consecutive non-empty tiles of one kind in a q row: kv blocks `kj0 .. kj0 + n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seg {
    kj0: u32,
    n: u32,
    kind: TileKind,
}

/// The step stream of a lowered Splash kernel (regenerated on demand).
#[derive(Debug, Clone)]
pub(crate) struct Steps {
    batch: u64,
    q_heads: u64,
    group: u64,
    /// Distinct masks' rows: for each q block, its non-empty tiles as runs of one kind.
    rows: Vec<Vec<Vec<Seg>>>,
    /// Which distinct mask each q head uses.
    head_mask: Vec<usize>,
    traversal: Traversal,
    width: u64,
    /// class id by [kind (0 partial, 1 full)][first][last]; empty steps use `empty_class`.
    class_of: [[[u32; 2]; 2]; 2],
    empty_class: u32,
    q_bytes: u64,
    kv_bytes: u64,
    mask_bytes: u64,
    o_bytes: u64,
    masked_partial: bool,
}

impl Steps {
    /// Emits the grid in order as runs `(first step, count)`: the steps of a run differ only in
    /// their kv coordinate, which increases by one per step (a run never spans two rows).
    /// Runs cover the interior of each segment of same-kind tiles at once, so the cost is
    /// O(rows x segments), not O(steps).
    pub(crate) fn for_each_run(&self, f: &mut dyn FnMut(&Step, u64)) {
        let mut last_q: Option<(u32, u32)> = None;
        let mut last_kv: Option<(u64, u64, u32)> = None;
        for b in 0..self.batch {
            for h in 0..self.q_heads {
                self.head_runs(b, h, &mut last_q, &mut last_kv, f);
            }
        }
    }

    /// Like [`Steps::for_each_run`], but a stretch of consecutive (batch, head) pairs whose step
    /// streams are identical but for coordinates is emitted once, followed by
    /// [`RunItem::RepeatHead`]. Heads are identical when they use the same mask and their first
    /// step always reloads its kv block (no copy elision across the head boundary).
    pub(crate) fn for_each_run_block(&self, f: &mut dyn FnMut(RunItem<'_>)) {
        let mut last_q: Option<(u32, u32)> = None;
        let mut last_kv: Option<(u64, u64, u32)> = None;
        let total = self.batch * self.q_heads;
        // Per distinct mask: may consecutive heads elide the kv copy at their boundary?
        let reloads = self.reloads();
        let mut i = 0u64;
        while i < total {
            let (b, h) = (i / self.q_heads, i % self.q_heads);
            let id = self.head_mask[h as usize];
            f(RunItem::HeadStart);
            self.head_runs(b, h, &mut last_q, &mut last_kv, &mut |s, n| f(RunItem::Run(s, n)));
            i += 1;
            if !reloads[id] {
                continue;
            }
            // Heads after the next one with the same mask repeat the next one exactly.
            let j = self.same_mask_until(i, id, total);
            if j - i >= 3 {
                let (b, h) = (i / self.q_heads, i % self.q_heads);
                f(RunItem::HeadStart);
                self.head_runs(b, h, &mut last_q, &mut last_kv, &mut |s, n| f(RunItem::Run(s, n)));
                f(RunItem::RepeatHead(j - i - 1));
                // Leave the elision state as the last repeated head would.
                let (bl, hl) = ((j - 1) / self.q_heads, (j - 1) % self.q_heads);
                let mut q = None;
                let mut kv = None;
                self.head_runs(bl, hl, &mut q, &mut kv, &mut |_, _| {});
                if q.is_some() {
                    last_q = q;
                }
                if kv.is_some() {
                    last_kv = kv;
                }
                i = j;
            }
        }
    }

    /// Per distinct mask: whether consecutive heads always reload their first kv block (so heads
    /// with that mask can be folded by [`Steps::for_each_run_block`]).
    fn reloads(&self) -> Vec<bool> {
        self.rows
            .iter()
            .map(|rows| {
                let first = rows.iter().find_map(|r| r.first()).map(|s| s.kj0);
                let last = rows.iter().rev().find_map(|r| r.last()).map(|s| s.kj0 + s.n - 1);
                self.group == 1 || first.is_none() || first != last
            })
            .collect()
    }

    /// The end of the stretch of heads from `i` that use mask `id` (O(1) when every head does).
    fn same_mask_until(&self, i: u64, id: usize, total: u64) -> u64 {
        if self.rows.len() == 1 {
            return total;
        }
        let mut j = i;
        while j < total && self.head_mask[(j % self.q_heads) as usize] == id {
            j += 1;
        }
        j
    }

    /// How many (batch, head) step streams [`Steps::for_each_run_block`] generates explicitly.
    pub(crate) fn emitted_heads(&self) -> u64 {
        let reloads = self.reloads();
        let total = self.batch * self.q_heads;
        let (mut i, mut emitted) = (0u64, 0u64);
        while i < total {
            let id = self.head_mask[(i % self.q_heads) as usize];
            emitted += 1;
            i += 1;
            if !reloads[id] {
                continue;
            }
            let j = self.same_mask_until(i, id, total);
            if j - i >= 3 {
                emitted += 2; // the first of the stretch, and the last one for the elision state
                i = j;
            }
        }
        emitted
    }

    /// The runs of one (batch, head), updating the copy-elision state.
    fn head_runs(
        &self,
        b: u64,
        h: u64,
        last_q: &mut Option<(u32, u32)>,
        last_kv: &mut Option<(u64, u64, u32)>,
        f: &mut dyn FnMut(&Step, u64),
    ) {
        let rows = &self.rows[self.head_mask[h as usize]];
        let bh = (b * self.q_heads + h) as u32;
        let kvh = b * (self.q_heads / self.group) + h / self.group;
        for (qi, row) in rows.iter().enumerate() {
            let qi = qi as u32;
            let len: u64 = row.iter().map(|s| s.n as u64).sum();
            let n_steps = match self.traversal {
                Traversal::Compact => len,
                Traversal::FullGrid => self.width,
            };
            // One computed step with every rule applied.
            let single = |kj: u32,
                          kind: TileKind,
                          j: u64,
                          last_q: &mut Option<(u32, u32)>,
                          last_kv: &mut Option<(u64, u64, u32)>,
                          f: &mut dyn FnMut(&Step, u64)| {
                let mut in_bytes = 0;
                if *last_q != Some((bh, qi)) {
                    in_bytes += self.q_bytes;
                    *last_q = Some((bh, qi));
                }
                if *last_kv != Some((b, kvh, kj)) {
                    in_bytes += self.kv_bytes;
                    *last_kv = Some((b, kvh, kj));
                }
                if kind == TileKind::Partial && self.masked_partial {
                    in_bytes += self.mask_bytes;
                }
                let k = usize::from(kind == TileKind::Full);
                let first = usize::from(j == 0);
                let last = usize::from(j + 1 == len);
                let out_bytes = if j + 1 == n_steps { self.o_bytes } else { 0 };
                f(&Step { class: self.class_of[k][first][last], in_bytes, out_bytes, coords: [bh, qi, kj, 0] }, 1);
            };
            let mut j = 0u64;
            for seg in row {
                let n = seg.n as u64;
                single(seg.kj0, seg.kind, j, last_q, last_kv, f);
                if n >= 3 {
                    // Interior steps: a new kv block each, neither first nor last of the row.
                    let k = usize::from(seg.kind == TileKind::Full);
                    let mask = if seg.kind == TileKind::Partial && self.masked_partial { self.mask_bytes } else { 0 };
                    let step = Step {
                        class: self.class_of[k][0][0],
                        in_bytes: self.kv_bytes + mask,
                        out_bytes: 0,
                        coords: [bh, qi, seg.kj0 + 1, 0],
                    };
                    f(&step, n - 2);
                    *last_kv = Some((b, kvh, seg.kj0 + seg.n - 2));
                }
                if n >= 2 {
                    single(seg.kj0 + seg.n - 1, seg.kind, j + n - 1, last_q, last_kv, f);
                }
                j += n;
            }
            if n_steps > len {
                // Empty steps: fixed cost only; data_next repeats the last block, so no copy.
                let empty = |j: u64, out_bytes: u64| Step { class: self.empty_class, in_bytes: 0, out_bytes, coords: [bh, qi, j as u32, 0] };
                if n_steps - len > 1 {
                    f(&empty(len, 0), n_steps - len - 1);
                }
                f(&empty(n_steps - 1, self.o_bytes), 1);
            }
        }
    }

    /// Emits every grid step in order (runs expanded).
    pub(crate) fn for_each(&self, f: &mut dyn FnMut(&Step)) {
        self.for_each_run(&mut |s, n| {
            for i in 0..n {
                f(&Step { coords: [s.coords[0], s.coords[1], s.coords[2] + i as u32, s.coords[3]], ..*s });
            }
        });
    }
}

/// Lowers one attention call with a Splash configuration.
///
/// # Errors
/// [`KernelError::Config`] naming the flag for block sizes that break the (8, 128) rules, a
/// `block_kv_compute` that does not divide `block_kv`, or blocks larger than the sequence;
/// [`KernelError::Vmem`] when the tiling overflows the scoped VMEM limit;
/// [`KernelError::Workload`] / [`KernelError::Mask`] for invalid shapes or mask files.
pub fn lower(chip: &ChipModel, w: &AttentionCall, cfg: &SplashConfig) -> Result<Program, KernelError> {
    w.validate()?;
    w.mask.check_lengths(w.q_len, w.kv_len)?;
    check_blocks(w, cfg, chip)?;
    let limit = cfg.vmem_limit_bytes.unwrap_or_else(|| chip.vmem_limit_bytes());
    let vmem = vmem_budget(w, cfg, limit);
    vmem.check(chip)?;

    let grid = TileGrid { q_len: w.q_len, kv_len: w.kv_len, block_q: cfg.block_q, block_kv: cfg.block_kv };
    let tiles_per_head = grid.q_tiles().saturating_mul(grid.kv_tiles());
    if tiles_per_head > crate::MAX_TILES {
        return Err(KernelError::config(
            "`block_q` x `block_kv`",
            format!("{} x {}", cfg.block_q, cfg.block_kv),
            format!(
                "the grid has {} q tiles x {} kv tiles = {tiles_per_head} tiles per head; at most {} are supported: use larger blocks",
                grid.q_tiles(),
                grid.kv_tiles(),
                crate::MAX_TILES
            ),
        ));
    }
    let padded = grid.padded_q_len() != w.q_len || grid.padded_kv_len() != w.kv_len;

    // Classify each distinct mask once.
    let mut distinct: Vec<&Mask> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut head_mask = Vec::with_capacity(w.q_heads as usize);
    for h in 0..w.q_heads {
        let m = w.mask_for_head(h);
        let key = m.to_string();
        let id = *index.entry(key).or_insert_with(|| {
            distinct.push(m);
            distinct.len() - 1
        });
        head_mask.push(id);
    }
    let mut rows = Vec::with_capacity(distinct.len());
    let mut per_mask_stats = Vec::with_capacity(distinct.len());
    for m in &distinct {
        let mut mrows = Vec::with_capacity(grid.q_tiles() as usize);
        let mut st = (0u64, 0u64, 0u64, 0u64, 0u64, 0u64); // empty, partial, full, kept, exact kept, visited pairs
        for_each_tile_row(m, &grid, false, |_, row| st.4 += row.iter().map(|t| t.kept).sum::<u64>());
        for_each_tile_row(m, &grid, cfg.tile_align, |_, row| {
            let mut r: Vec<Seg> = Vec::new();
            for (kj, t) in row.iter().enumerate() {
                st.3 += t.kept;
                match t.kind {
                    TileKind::Empty => st.0 += 1,
                    TileKind::Partial => st.1 += 1,
                    TileKind::Full => st.2 += 1,
                }
                if t.kind != TileKind::Empty {
                    match r.last_mut() {
                        Some(seg) if seg.kind == t.kind && seg.kj0 + seg.n == kj as u32 => seg.n += 1,
                        _ => r.push(Seg { kj0: kj as u32, n: 1, kind: t.kind }),
                    }
                    st.5 += cfg.block_q * cfg.block_kv;
                }
            }
            mrows.push(r);
        });
        rows.push(mrows);
        per_mask_stats.push(st);
    }
    let width = rows.iter().flat_map(|m| m.iter().map(|r| r.iter().map(|s| s.n as u64).sum::<u64>())).max().unwrap_or(0);
    if per_mask_stats.iter().all(|st| st.3 == 0) {
        return Err(KernelError::config(
            "`mask`",
            w.mask.to_string(),
            "the mask keeps no (q, kv) pair of this workload: there is nothing to compute",
        ));
    }
    // A mask with no closed form (a block file) can only be loaded, whatever --mask-source says.
    let source = if distinct.iter().any(|m| m.expression_terms().loaded_only) { MaskSource::Loaded } else { cfg.mask_source };

    // One mask cost for the program: the costliest distinct mask's expression.
    let mask_ops = distinct.iter().map(|m| mask_ops_per_vreg(m, source, padded)).fold(0.0, f64::max);
    let any_not_full = distinct.iter().any(|m| !m.is_full()) || cfg.tile_align;

    let mut classes = vec![StepClass {
        key: ClassKey { tile: "empty", masked: false, first: false, last: false },
        body: StepBody::default(),
    }];
    let mut class_of = [[[0u32; 2]; 2]; 2];
    for (k, kind) in [TileKind::Partial, TileKind::Full].into_iter().enumerate() {
        for first in [false, true] {
            for last in [false, true] {
                let is_masked = match cfg.masking {
                    Masking::None => false,
                    Masking::Partial => kind == TileKind::Partial,
                    Masking::All => kind == TileKind::Partial || any_not_full,
                };
                let shape = BodyShape {
                    block_q: cfg.block_q,
                    block_kv: cfg.block_kv,
                    compute: cfg.block_kv_compute,
                    d: w.head_dim,
                    dv: w.head_dim_v,
                    mask_ops: is_masked.then_some(mask_ops),
                    first,
                    last,
                };
                class_of[k][usize::from(first)][usize::from(last)] = classes.len() as u32;
                classes.push(StepClass {
                    key: ClassKey { tile: if k == 0 { "partial" } else { "full" }, masked: is_masked, first, last },
                    body: attention_body(&shape),
                });
            }
        }
    }

    // Tile counts over batch and heads.
    let mut tiles = TileCounts::default();
    let mut kept = 0u64;
    let mut exact = 0u64;
    let mut visited_pairs = 0u64;
    let mut grid_steps = 0u64;
    for h in 0..w.q_heads {
        let id = head_mask[h as usize];
        let st = per_mask_stats[id];
        tiles.total += w.batch * (st.0 + st.1 + st.2);
        tiles.empty += w.batch * st.0;
        tiles.partial += w.batch * st.1;
        tiles.full += w.batch * st.2;
        tiles.visited += w.batch * (st.1 + st.2);
        let masked_tiles = match cfg.masking {
            Masking::None => 0,
            Masking::Partial => st.1,
            Masking::All => st.1 + if any_not_full { st.2 } else { 0 },
        };
        tiles.masked += w.batch * masked_tiles;
        kept += w.batch * st.3;
        exact += w.batch * st.4;
        visited_pairs += w.batch * st.5;
        grid_steps += w.batch
            * match cfg.traversal {
                Traversal::Compact => st.1 + st.2,
                Traversal::FullGrid => grid.q_tiles() * width,
            };
    }

    let steps = Steps {
        batch: w.batch,
        q_heads: w.q_heads,
        group: w.q_heads / w.kv_heads,
        rows,
        head_mask,
        traversal: cfg.traversal,
        width,
        class_of,
        empty_class: 0,
        q_bytes: cfg.block_q * w.head_dim * 2,
        kv_bytes: cfg.block_kv * (w.head_dim + w.head_dim_v) * 2,
        mask_bytes: if source == MaskSource::Loaded { cfg.block_q * cfg.block_kv } else { 0 },
        o_bytes: cfg.block_q * w.head_dim_v * 2,
        masked_partial: cfg.masking != Masking::None,
    };
    let rows_generated = steps.emitted_heads().saturating_mul(grid.q_tiles());
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
    let info = ProgramInfo {
        kernel: "splash".into(),
        grid: vec![
            ("batch x heads".into(), w.batch * w.q_heads),
            ("q blocks".into(), grid.q_tiles()),
            (
                match cfg.traversal {
                    Traversal::FullGrid if width < grid.kv_tiles() => "kv steps (after grid shrinking)".into(),
                    Traversal::FullGrid => "kv steps".into(),
                    Traversal::Compact => "kv steps (compacted, varies by row)".into(),
                },
                width,
            ),
        ],
        blocks: vec![
            ("block_q".into(), cfg.block_q),
            ("block_kv".into(), cfg.block_kv),
            ("block_kv_compute".into(), cfg.block_kv_compute),
        ],
        padded: vec![("q_len".into(), w.q_len, grid.padded_q_len()), ("kv_len".into(), w.kv_len, grid.padded_kv_len())],
        tiles: Some(tiles),
        kept_pairs: kept,
        visited_pairs,
        exact_kept_pairs: exact,
        grid_steps,
    };
    Ok(Program { classes, vmem, info, steps: StepSource::Splash(steps) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v6e() -> ChipModel {
        ChipModel::preset("v6e").unwrap()
    }

    fn cfg(bq: u64, bkv: u64, c: u64) -> SplashConfig {
        SplashConfig::with_blocks(&AttentionCall::video_default(), &v6e(), bq, bkv, Some(c))
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
    fn kv_copies_are_elided_when_the_block_repeats() {
        // One kv block per row: consecutive q blocks of one head reuse it.
        let mut w = AttentionCall::video_default();
        w.q_len = 4096;
        w.kv_len = 1024;
        w.q_heads = 1;
        w.kv_heads = 1;
        let p = lower(&v6e(), &w, &cfg(1024, 1024, 512)).unwrap();
        let mut bytes = 0;
        p.for_each_step(&mut |s| bytes += s.in_bytes);
        assert_eq!(bytes, 4 * 1024 * 128 * 2 + 1024 * 256 * 2);
    }

    #[test]
    fn runs_expand_to_the_same_steps() {
        // Per-step generation written out directly, compared with the run generator.
        let chip = v6e();
        for (mask, trav) in [("band:700+sink:300", Traversal::Compact), ("causal", Traversal::FullGrid), ("local:900,100", Traversal::FullGrid)] {
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
