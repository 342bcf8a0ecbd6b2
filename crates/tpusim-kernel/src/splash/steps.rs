//! The forward grid's step stream: runs of identical steps per q row, identical heads folded.

use super::Traversal;
use crate::ir::Step;
pub use tpusim_model::RunItem;
use tpusim_workload::tiles::TileKind;

/// The events of a step stream that change windows' block indices: each window of a family's
/// declaration names the one its block index follows ([`super::Family::refs`]), and a step's
/// copies are the copy-set id of the events it saw ([`Steps::copies`]).
pub(crate) mod event {
    /// The (batch x head, q block) changed: q.
    pub const Q: u32 = 0;
    /// The q block alone changed: windows whose index map has no head (q positions, q segment ids).
    pub const QI: u32 = 1;
    /// The (batch, kv head, kv block) changed: k and v.
    pub const KV: u32 = 2;
    /// The kv block alone changed: kv segment ids.
    pub const KJ: u32 = 3;
    /// A loaded mask block changed.
    pub const MASK: u32 = 4;
    /// The row ends: o (and its residuals) written back.
    pub const OUT: u32 = 5;
    /// The grid's last step: outputs of constant block index written back.
    pub const FINAL: u32 = 6;
    /// Events.
    pub const COUNT: u32 = 7;
}

/// What a step stream carries from one step to the next for copy elision: the (batch x head,
/// q block) of the q window, the (batch, kv head, kv block) of the kv windows and the key of the
/// mask block in VMEM.
type ElisionState<'a> = (&'a mut Option<(u32, u32)>, &'a mut Option<(u64, u64, u32)>, &'a mut Option<i64>);

/// A run of consecutive non-empty tiles of one kind in a q row: kv blocks `kj0 .. kj0 + n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seg {
    pub(crate) kj0: u32,
    pub(crate) n: u32,
    pub(crate) kind: TileKind,
}

/// The step stream of a lowered Splash kernel (regenerated on demand).
#[derive(Debug, Clone)]
pub(crate) struct Steps {
    pub(crate) batch: u64,
    pub(crate) q_heads: u64,
    pub(crate) group: u64,
    /// Distinct masks' rows: for each q block, its non-empty tiles as runs of one kind.
    pub(crate) rows: Vec<Vec<Vec<Seg>>>,
    /// Which distinct mask each q head uses.
    pub(crate) head_mask: Vec<usize>,
    pub(crate) traversal: Traversal,
    pub(crate) width: u64,
    /// class id by [kind (0 partial, 1 full)][first][last]; empty steps use `empty_class`.
    pub(crate) class_of: [[[u32; 2]; 2]; 2],
    pub(crate) empty_class: u32,
    /// JAX's Splash finalizes a row at its last grid step (`j == grid_width - 1`), an empty one
    /// when the row has fewer non-empty tiles than the grid is wide: the class of such a step
    /// (the finalize alone), and computed steps then never finalize. `None`: the row's last
    /// computed step finalizes.
    pub(crate) finalize_class: Option<u32>,
    /// Padding steps (a row's steps after its non-empty tiles) point at kv block 0, as JAX's
    /// `MaskInfo.data_next` holds for them (0, not a repeat of the row's last block): the first
    /// one copies kv block 0 unless it is already the block in VMEM. `false`: they repeat the
    /// last block (no copy).
    pub(crate) pad_to_block0: bool,
    /// The copy-set id of each combination of [`event`]s (bit `e` set: event `e` happened).
    pub(crate) copies: Vec<u32>,
    /// Whether partial steps load mask blocks.
    pub(crate) loads_mask: bool,
    /// Whether outputs of constant block index are written back after the grid's last step
    /// (JAX's Splash keeps m, l and o_scratch as such outputs).
    pub(crate) final_out: bool,
    pub(crate) masked_partial: bool,
    /// JAX's Splash with a loaded mask: `process_mask` stores each distinct partial block once
    /// and `mask_next` names the block a step reads, so a mask block is copied only when that
    /// index changes. Some((block_q, block_kv)) when the mask is a function of q - k alone
    /// (causal, local, band): a partial block is then identified by q0 - k0. `None`: one copy
    /// per partial step.
    pub(crate) mask_dedup: Option<(u64, u64)>,
    /// (batch, head) streams per parallel unit: 1 when heads are parallel (the forward), the
    /// head count when only the batch is (JAX's dq kernel).
    pub(crate) unit_span: u64,
}

impl Steps {
    /// Per distinct mask: whether consecutive heads always reload their first kv block (so heads
    /// with that mask can be folded by [`Steps::for_each_run_block`]).
    fn reloads(&self) -> Vec<bool> {
        self.rows
            .iter()
            .map(|rows| {
                let first = rows.iter().find_map(|r| r.first()).map(|s| s.kj0);
                let last = rows.iter().rev().find_map(|r| r.last()).map(|s| s.kj0 + s.n - 1);
                // Padding steps that fetch block 0 leave it in VMEM for the next head of a GQA
                // group: its first copy is elided, so such heads are not folded.
                self.group == 1 || (!self.pad_to_block0 && (first.is_none() || first != last))
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

    /// [`Steps::same_mask_until`], stopping before the grid's last head when it writes the
    /// outputs of constant block index (its last step differs from the other heads').
    fn fold_end(&self, i: u64, id: usize, total: u64) -> u64 {
        let j = self.same_mask_until(i, id, total);
        if self.final_out && j > i && j == self.batch * self.q_heads {
            j - 1
        } else {
            j
        }
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
            let j = self.fold_end(i, id, total);
            if j - i >= 3 {
                emitted += 2; // the first of the stretch, and the last one for the elision state
                i = j;
            }
        }
        emitted
    }

    /// Which of a program's `n` step classes some step of the grid runs. Every head with one
    /// mask runs the same classes (its batch and the copy-elision state change bytes, not
    /// classes), so one head per distinct mask is walked: O(rows x segments) per mask.
    pub(crate) fn used_classes(&self, n: usize) -> Vec<bool> {
        let mut used = vec![false; n];
        let mut seen = vec![false; self.rows.len()];
        for h in 0..self.q_heads {
            let id = self.head_mask[h as usize];
            if std::mem::replace(&mut seen[id], true) {
                continue;
            }
            let (mut q, mut kv, mut m) = (None, None, None);
            self.head_runs(0, h, (&mut q, &mut kv, &mut m), &mut |s, _| {
                if let Some(u) = used.get_mut(s.class as usize) {
                    *u = true;
                }
            });
        }
        used
    }

    /// The runs of one (batch, head), updating the copy-elision state.
    fn head_runs(&self, b: u64, h: u64, state: ElisionState<'_>, f: &mut dyn FnMut(&Step, u64)) {
        use event::{FINAL, KJ, KV, MASK, OUT, Q, QI};
        let (last_q, last_kv, last_mask) = state;
        let rows = &self.rows[self.head_mask[h as usize]];
        let bh = (b * self.q_heads + h) as u32;
        let kvh = b * (self.q_heads / self.group) + h / self.group;
        let last_head = b * self.q_heads + h + 1 == self.batch * self.q_heads;
        let nrows = rows.len();
        let bit = |e: u32| 1usize << e;
        let id = |events: usize| self.copies[events];
        // The kv windows' events when the kv block becomes `kj`: KV, and KJ when the block index
        // itself changes (a new head may start on the block the last one ended on).
        let kv_events = |last_kv: &Option<(u64, u64, u32)>, kj: u32| bit(KV) | if last_kv.map(|l| l.2) != Some(kj) { bit(KJ) } else { 0 };
        for (qi, row) in rows.iter().enumerate() {
            // The grid's last step also writes the outputs whose block index never changes.
            let row_out = bit(OUT) | if last_head && qi + 1 == nrows { bit(FINAL) } else { 0 };
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
                          last_mask: &mut Option<i64>,
                          f: &mut dyn FnMut(&Step, u64)| {
                let mut events = 0;
                if *last_q != Some((bh, qi)) {
                    events |= bit(Q);
                    if last_q.map(|l| l.1) != Some(qi) {
                        events |= bit(QI);
                    }
                    *last_q = Some((bh, qi));
                }
                if *last_kv != Some((b, kvh, kj)) {
                    events |= kv_events(last_kv, kj);
                    *last_kv = Some((b, kvh, kj));
                }
                if kind == TileKind::Partial && self.masked_partial && self.mask_fetch(last_mask, qi, kj) {
                    events |= bit(MASK);
                }
                let k = usize::from(kind == TileKind::Full);
                let first = usize::from(j == 0);
                let last = usize::from(j + 1 == len && (self.finalize_class.is_none() || n_steps == len));
                if j + 1 == n_steps {
                    events |= row_out;
                }
                f(&Step { class: self.class_of[k][first][last], copies: id(events), coords: [bh, qi, kj, 0] }, 1);
            };
            let mut j = 0u64;
            for seg in row {
                let n = seg.n as u64;
                single(seg.kj0, seg.kind, j, last_q, last_kv, last_mask, f);
                if n >= 3 {
                    // Interior steps: a new kv block each, neither first nor last of the row.
                    let k = usize::from(seg.kind == TileKind::Full);
                    let masked = seg.kind == TileKind::Partial && self.masked_partial && self.loads_mask;
                    let events = bit(KV) | bit(KJ) | if masked { bit(MASK) } else { 0 };
                    let step = Step { class: self.class_of[k][0][0], copies: id(events), coords: [bh, qi, seg.kj0 + 1, 0] };
                    f(&step, n - 2);
                    *last_kv = Some((b, kvh, seg.kj0 + seg.n - 2));
                    if masked {
                        // Inside a run of partial blocks each is another block (q0 - k0 moves).
                        *last_mask = Some(self.mask_key(qi, seg.kj0 + seg.n - 2));
                    }
                }
                if n >= 2 {
                    single(seg.kj0 + seg.n - 1, seg.kind, j + n - 1, last_q, last_kv, last_mask, f);
                }
                j += n;
            }
            if n_steps > len {
                // Empty steps: fixed cost only; data_next repeats the last block, so no copy.
                let empty = |j: u64, events: usize| Step { class: self.empty_class, copies: id(events), coords: [bh, qi, j as u32, 0] };
                let mut pad = len;
                // With deduplicated mask blocks, padding steps read mask block 0 (mask_next = 0).
                let mask_pad = if self.pad_to_block0 && self.masked_partial && self.loads_mask && self.mask_dedup.is_some() {
                    let key = self.first_mask_key(rows);
                    if *last_mask != Some(key) {
                        *last_mask = Some(key);
                        bit(MASK)
                    } else {
                        0
                    }
                } else {
                    0
                };
                if mask_pad > 0 && *last_kv == Some((b, kvh, 0)) {
                    if n_steps - len == 1 {
                        let mut fin = empty(len, mask_pad | row_out);
                        fin.class = self.finalize_class.unwrap_or(self.empty_class);
                        f(&fin, 1);
                        continue;
                    }
                    f(&empty(len, mask_pad), 1);
                    pad += 1;
                } else if self.pad_to_block0 && *last_kv != Some((b, kvh, 0)) {
                    // The first padding step fetches kv block 0 (data_next = 0).
                    let events = kv_events(last_kv, 0) | mask_pad;
                    *last_kv = Some((b, kvh, 0));
                    if n_steps - len == 1 {
                        let mut fin = empty(len, events | row_out);
                        fin.class = self.finalize_class.unwrap_or(self.empty_class);
                        f(&fin, 1);
                        continue;
                    }
                    f(&empty(len, events), 1);
                    pad += 1;
                }
                if n_steps - pad > 1 {
                    f(&empty(pad, 0), n_steps - pad - 1);
                }
                let mut fin = empty(n_steps - 1, row_out);
                fin.class = self.finalize_class.unwrap_or(self.empty_class);
                f(&fin, 1);
            }
        }
    }

    /// The key of the partial block at (q block `qi`, kv block `kj`) for mask-block elision.
    fn mask_key(&self, qi: u32, kj: u32) -> i64 {
        match self.mask_dedup {
            Some((bq, bkv)) => qi as i64 * bq as i64 - kj as i64 * bkv as i64,
            // Every block its own: a key no other block has.
            None => -((qi as i64) << 32 | kj as i64) - 1,
        }
    }

    /// Whether a partial step copies its mask block, updating the elision state.
    fn mask_fetch(&self, last_mask: &mut Option<i64>, qi: u32, kj: u32) -> bool {
        if !self.loads_mask {
            return false;
        }
        if self.mask_dedup.is_none() {
            return true;
        }
        let key = self.mask_key(qi, kj);
        if *last_mask == Some(key) {
            return false;
        }
        *last_mask = Some(key);
        true
    }

    /// The key of a mask's first partial block in grid order (mask block 0 of `process_mask`).
    fn first_mask_key(&self, rows: &[Vec<Seg>]) -> i64 {
        rows.iter()
            .enumerate()
            .find_map(|(qi, r)| r.iter().find(|s| s.kind == TileKind::Partial).map(|s| self.mask_key(qi as u32, s.kj0)))
            .unwrap_or(0)
    }
}

impl tpusim_model::StepStream for Steps {
    /// Emits the grid in order as runs `(first step, count)`: the steps of a run differ only in
    /// their kv coordinate, which increases by one per step (a run never spans two rows).
    /// Runs cover the interior of each segment of same-kind tiles at once, so the cost is
    /// O(rows x segments), not O(steps).
    /// The (batch, head) units `lo..hi` only, unfolded.
    fn for_each_run_range(&self, lo: u64, hi: u64, f: &mut dyn FnMut(&Step, u64)) {
        let mut last_q: Option<(u32, u32)> = None;
        let mut last_kv: Option<(u64, u64, u32)> = None;
        let mut last_mask: Option<i64> = None;
        let (lo, hi) = (lo.saturating_mul(self.unit_span), hi.saturating_mul(self.unit_span));
        for i in lo..hi.min(self.batch * self.q_heads) {
            self.head_runs(i / self.q_heads, i % self.q_heads, (&mut last_q, &mut last_kv, &mut last_mask), f);
        }
    }

    /// Like the runs, but a stretch of consecutive (batch, head) pairs whose step
    /// streams are identical but for coordinates is emitted once, followed by
    /// [`RunItem::RepeatHead`]. Heads are identical when they use the same mask and their first
    /// step always reloads its kv block (no copy elision across the head boundary).
    fn for_each_run_block(&self, lo: u64, hi: u64, f: &mut dyn FnMut(RunItem<'_>)) {
        let mut last_q: Option<(u32, u32)> = None;
        let mut last_kv: Option<(u64, u64, u32)> = None;
        let mut last_mask: Option<i64> = None;
        let (lo, hi) = (lo.saturating_mul(self.unit_span), hi.saturating_mul(self.unit_span));
        let total = hi.min(self.batch * self.q_heads);
        // Per distinct mask: may consecutive heads elide the kv copy at their boundary?
        let reloads = self.reloads();
        let mut i = lo;
        while i < total {
            let (b, h) = (i / self.q_heads, i % self.q_heads);
            let id = self.head_mask[h as usize];
            f(RunItem::HeadStart);
            self.head_runs(b, h, (&mut last_q, &mut last_kv, &mut last_mask), &mut |s, n| f(RunItem::Run(s, n)));
            i += 1;
            if !reloads[id] {
                continue;
            }
            // Heads after the next one with the same mask repeat the next one exactly (but for
            // the grid's last head, which writes the final outputs).
            let j = self.fold_end(i, id, total);
            if j - i >= 3 {
                let (b, h) = (i / self.q_heads, i % self.q_heads);
                f(RunItem::HeadStart);
                self.head_runs(b, h, (&mut last_q, &mut last_kv, &mut last_mask), &mut |s, n| f(RunItem::Run(s, n)));
                f(RunItem::RepeatHead(j - i - 1));
                // Leave the elision state as the last repeated head would.
                let (bl, hl) = ((j - 1) / self.q_heads, (j - 1) % self.q_heads);
                let mut q = None;
                let mut kv = None;
                let mut m = last_mask;
                self.head_runs(bl, hl, (&mut q, &mut kv, &mut m), &mut |_, _| {});
                if q.is_some() {
                    last_q = q;
                }
                if kv.is_some() {
                    last_kv = kv;
                }
                last_mask = m;
                i = j;
            }
        }
    }
}
