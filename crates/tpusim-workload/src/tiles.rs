//! Tile classification: a mask at a (block_q x block_kv) tiling, block by block.
//!
//! Sequences that are not a multiple of their block are padded up to the next multiple (as
//! MaxDiffusion does). A tile's *real* pairs are those whose q and kv positions are both below
//! the unpadded lengths; only real pairs can be kept. Classification:
//!
//! * **empty**: no real pair kept;
//! * **full**: every real pair kept and no padding inside the tile. Padding is excluded by the
//!   mask (MaxDiffusion marks padded tokens with segment ids, and the kernel masks them), so a
//!   tile that holds padded q rows or kv columns needs the element-wise mask;
//! * **partial**: anything else: the element-wise mask is needed.
//!
//! Cost: for each q row, one pass over the row's kept intervals ([`Mask::row_intervals`]) with
//! a difference array over kv tiles, so O(q_len x intervals + q_tiles x kv_tiles) per distinct
//! mask; the N x N mask is never built. Masks whose rows repeat (video, sink, file masks and
//! their combinations) group the rows of each q tile by a short row key and walk each
//! distinct row once, weighted by how many rows share it. A video row is counted either by its
//! intervals or, when it has more runs than kv tiles it crosses, by an O(1) rank (kept tokens
//! below each tile boundary, [`crate::mask::VideoMask::rank_digits`]), so a video mask costs
//! O(q_len + distinct rows per tile x min(runs, kv tiles crossed)).
//!
//! Masks whose rows keep one interval with constant or shifted ends (full, causal, local, band,
//! sink, chunked), and unions of them and their intersections (band + sink, the video case's), skip
//! the rows too: their tile counts are sums of clamped linear functions of q, in closed form per
//! tile (a union's by inclusion-exclusion over the parts that touch the tile).
//!
//! Array masks ([`crate::mask::ArrayMask`]: dense NumPy masks and block maps) skip the rows:
//! they hand over per-tile counts read block by block from the array (cached per tiling).
//!
//! **Tile alignment** (`align = true`) rounds the mask to whole tiles: a tile is kept whole when
//! at least half of its real pairs are kept, and dropped otherwise. Rounding in and out at the
//! same threshold keeps the kept-pair budget close to the exact mask's (video-diffusion-case.md:
//! 445 of 1,150 tiles, 39.1% vs 39.4% pair density). Kept tiles are full unless they hold
//! padding, which still has to be masked.

use crate::mask::{Mask, VideoDigits};
use serde::Serialize;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A tiling of a q_len x kv_len score matrix into block_q x block_kv tiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TileGrid {
    /// Query length (unpadded), tokens.
    pub q_len: u64,
    /// Key/value length (unpadded), tokens.
    pub kv_len: u64,
    /// Rows per tile.
    pub block_q: u64,
    /// Columns per tile.
    pub block_kv: u64,
}

impl TileGrid {
    /// Number of q tiles, ceil(q_len / block_q).
    pub fn q_tiles(&self) -> u64 {
        self.q_len.div_ceil(self.block_q)
    }
    /// Number of kv tiles, ceil(kv_len / block_kv).
    pub fn kv_tiles(&self) -> u64 {
        self.kv_len.div_ceil(self.block_kv)
    }
    /// q length padded to a multiple of block_q.
    pub fn padded_q_len(&self) -> u64 {
        self.q_tiles() * self.block_q
    }
    /// kv length padded to a multiple of block_kv.
    pub fn padded_kv_len(&self) -> u64 {
        self.kv_tiles() * self.block_kv
    }
    /// Real (unpadded) rows of q tile `qi`.
    pub fn real_rows(&self, qi: u64) -> u64 {
        self.q_len.saturating_sub(qi * self.block_q).min(self.block_q)
    }
    /// Real (unpadded) columns of kv tile `kj`.
    pub fn real_cols(&self, kj: u64) -> u64 {
        self.kv_len.saturating_sub(kj * self.block_kv).min(self.block_kv)
    }
}

/// Kind of one tile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum TileKind {
    /// No pair kept: skippable.
    Empty,
    /// Some pairs kept: needs the element-wise mask.
    Partial,
    /// Every pair kept: mask-free.
    Full,
}

/// One classified tile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tile {
    /// Kept real pairs in the tile (after alignment, if any).
    pub kept: u64,
    /// Its kind.
    pub kind: TileKind,
}

/// `n` consecutive kv tiles of one q tile row that classify alike: tiles `kj0 .. kj0 + n`, each
/// with the same kept pairs and kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TileRun {
    /// First kv tile.
    pub kj0: u64,
    /// Tiles in the run.
    pub n: u64,
    /// Each tile of the run.
    pub tile: Tile,
}

/// Calls `f(qi, tiles)` for every q tile in order, with the classified kv tiles of that row.
///
/// `tiles.len()` equals `grid.kv_tiles()`. See the module docs for the rules and cost.
pub fn for_each_tile_row(mask: &Mask, grid: &TileGrid, align: bool, mut f: impl FnMut(u64, &[Tile])) {
    let mut tiles = Vec::with_capacity(grid.kv_tiles() as usize);
    for_each_tile_run_row(mask, grid, align, |qi, runs| {
        tiles.clear();
        for r in runs {
            tiles.extend(std::iter::repeat_n(r.tile, r.n as usize));
        }
        f(qi, &tiles);
    });
}

/// Calls `f(qi, runs)` for every q tile in order, with the row's kv tiles as runs of alike
/// tiles ([`TileRun`], covering every kv tile in order; adjacent runs may be alike). Masks whose
/// rows keep one interval with ends moving by at most a position per row (full, causal, local,
/// band, sink, chunked) are counted in closed form and run-length encoded without visiting every
/// tile: O(q tiles x (block_q / block_kv + 2)); unions of such masks (but chunked) and their
/// intersections in closed form per tile, O(q tiles x kv tiles); other masks cost as in the
/// module docs.
pub fn for_each_tile_run_row(mask: &Mask, grid: &TileGrid, align: bool, mut f: impl FnMut(u64, &[TileRun])) {
    let nk = grid.kv_tiles() as usize;
    let bkv = grid.block_kv;
    let mut counts = vec![0u64; nk];
    let mut diff = vec![0u64; nk + 1];
    let mut iv = Vec::new();
    let mut runs: Vec<TileRun> = Vec::new();
    let full_mask = mask.is_full();
    // An array mask answers tile counts block by block (cached per tiling).
    let array_counts = match mask {
        Mask::Array(a) if a.source.lengths() == (grid.q_len, grid.kv_len) => a.tile_counts(grid.block_q, grid.block_kv),
        _ => None,
    };
    let grouped = !full_mask && mask.has_row_classes();
    let linear = if array_counts.is_none() { LinearRows::of(mask) } else { None };
    let union = if array_counts.is_none() && linear.is_none() { LinearUnion::of(mask) } else { None };
    let mut classes = RowClasses::default();
    let bounds = match mask {
        Mask::Video(v) if !full_mask => v.tile_bounds(bkv, grid.kv_len),
        _ => Vec::new(),
    };
    for qi in 0..grid.q_tiles() {
        let rows = grid.real_rows(qi);
        runs.clear();
        if let Some(lin) = linear {
            lin.tile_runs(qi * grid.block_q, rows, grid, align, &mut runs);
            f(qi, &runs);
            continue;
        }
        if let Some(u) = &union {
            u.tile_runs(qi * grid.block_q, rows, grid, align, &mut runs);
            f(qi, &runs);
            continue;
        }
        counts.iter_mut().for_each(|c| *c = 0);
        if full_mask {
            for (kj, c) in counts.iter_mut().enumerate() {
                *c = rows * grid.real_cols(kj as u64);
            }
        } else if let Some(ac) = &array_counts {
            counts.copy_from_slice(&ac[qi as usize * nk..(qi as usize + 1) * nk]);
        } else {
            diff.iter_mut().for_each(|d| *d = 0);
            let q0 = qi * grid.block_q;
            if grouped {
                classes.collect(mask, q0, q0 + rows);
                for &(q, mult) in &classes.reps {
                    add_row(mask, q, grid, &bounds, mult, &mut iv, &mut counts, &mut diff);
                }
            } else {
                for q in q0..q0 + rows {
                    add_row(mask, q, grid, &bounds, 1, &mut iv, &mut counts, &mut diff);
                }
            }
            // Prefix sums in wrapping arithmetic: every partial sum of true values is
            // non-negative, so the wrapped result equals the true count.
            let mut run = 0u64;
            for (kj, c) in counts.iter_mut().enumerate() {
                run = run.wrapping_add(diff[kj]);
                *c += run;
            }
        }
        for (kj, &kept) in counts.iter().enumerate() {
            push_run(&mut runs, kj as u64, 1, classify_tile(grid, qi, kj as u64, kept, align));
        }
        f(qi, &runs);
    }
}

/// The tile at (`qi`, `kj`) with `kept` real pairs kept, by the module docs' rules.
fn classify_tile(grid: &TileGrid, qi: u64, kj: u64, kept: u64, align: bool) -> Tile {
    let rows = grid.real_rows(qi);
    let cols = grid.real_cols(kj);
    let real = rows * cols;
    let padded = cols < grid.block_kv || rows < grid.block_q;
    if align {
        if kept > 0 && 2 * kept >= real {
            Tile { kept: real, kind: if padded { TileKind::Partial } else { TileKind::Full } }
        } else {
            Tile { kept: 0, kind: TileKind::Empty }
        }
    } else if kept == 0 {
        Tile { kept, kind: TileKind::Empty }
    } else if kept == real && !padded {
        Tile { kept, kind: TileKind::Full }
    } else {
        Tile { kept, kind: TileKind::Partial }
    }
}

/// The rows `a .. b` of q tile `qi` (of `nk` kv tiles over `kv` columns) whose kv tiles a
/// closed form classifies as runs.
struct RowSpan {
    nk: u64,
    qi: u64,
    kv: i128,
    a: i128,
    b: i128,
}

impl RowSpan {
    /// The span of rows `q0 .. q0 + rows`; a tile of no rows (padding only) is pushed as one
    /// run of its kind, and gives `None`.
    fn of(q0: u64, rows: u64, grid: &TileGrid, align: bool, runs: &mut Vec<TileRun>) -> Option<Self> {
        let (nk, qi) = (grid.kv_tiles(), q0 / grid.block_q);
        if rows == 0 {
            push_run(runs, 0, nk, classify_tile(grid, qi, 0, 0, align));
            return None;
        }
        Some(RowSpan { nk, qi, kv: grid.kv_len as i128, a: q0 as i128, b: (q0 + rows) as i128 })
    }
}

/// Appends `n` tiles from `kj0`, all `tile`, merging with the last run when alike.
fn push_run(runs: &mut Vec<TileRun>, kj0: u64, n: u64, tile: Tile) {
    if n == 0 {
        return;
    }
    match runs.last_mut() {
        Some(r) if r.tile == tile && r.kj0 + r.n == kj0 => r.n += n,
        _ => runs.push(TileRun { kj0, n, tile }),
    }
}

/// Adds `mult` copies of row `q` to the per-tile counts: a video mask counts by rank at tile
/// boundaries when that is cheaper than its intervals ([`crate::mask::VideoMask::add_tile_counts`]);
/// everything else walks [`Mask::row_intervals`].
#[inline]
#[allow(clippy::too_many_arguments)]
fn add_row(
    mask: &Mask,
    q: u64,
    grid: &TileGrid,
    bounds: &[VideoDigits],
    mult: u64,
    iv: &mut Vec<(u64, u64)>,
    counts: &mut [u64],
    diff: &mut [u64],
) {
    if let Mask::Video(v) = mask {
        if v.add_tile_counts(q, grid.kv_len, grid.block_kv, bounds, mult, counts) {
            return;
        }
    }
    mask.row_intervals(q, grid.kv_len, iv);
    accumulate(iv, mult, grid.block_kv, counts, diff);
}

/// Adds `mult` rows with kept intervals `iv` to per-tile counts: the first and last kv tile an
/// interval touches directly, the whole tiles between through the difference array `diff`
/// (wrapping; see the prefix sum in [`for_each_tile_row`]).
#[inline]
fn accumulate(iv: &[(u64, u64)], mult: u64, bkv: u64, counts: &mut [u64], diff: &mut [u64]) {
    for &(lo, hi) in iv {
        let ja = (lo / bkv) as usize;
        let jb = ((hi - 1) / bkv) as usize;
        if ja == jb {
            counts[ja] += mult * (hi - lo);
        } else {
            counts[ja] += mult * ((ja as u64 + 1) * bkv - lo);
            counts[jb] += mult * (hi - jb as u64 * bkv);
            if jb > ja + 1 {
                diff[ja + 1] = diff[ja + 1].wrapping_add(mult * bkv);
                diff[jb] = diff[jb].wrapping_sub(mult * bkv);
            }
        }
    }
}

/// An end of a row's kept interval as a function of the row q, before clamping to `[0, kv_len]`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum End {
    /// A constant position.
    Const(i128),
    /// `q + c`.
    Shift(i128),
    /// The start of q's chunk of this many tokens, `floor(q / size) x size`.
    Chunk(u64),
}

impl End {
    fn at(self, q: i128, kv: i128) -> i128 {
        match self {
            End::Const(c) => c,
            End::Shift(c) => q + c,
            End::Chunk(s) => q / s as i128 * s as i128,
        }
        .clamp(0, kv)
    }
}

/// A mask whose every row keeps one interval `[lo(q), hi(q))` with ends that never decrease
/// with q and move by at most one position per row (full, causal, local, band, sink, chunked):
/// its tile counts are sums of clamped linear functions of q, added in closed form per tile
/// instead of row by row (O(q tiles x kv tiles), independent of the tile height).
#[derive(Debug, Clone, Copy)]
struct LinearRows {
    lo: End,
    hi: End,
}

impl LinearRows {
    fn of(mask: &Mask) -> Option<Self> {
        let (lo, hi) = match *mask {
            Mask::Full => (End::Const(0), End::Const(i128::MAX / 4)),
            Mask::Causal { offset } => (End::Const(0), End::Shift(offset as i128 + 1)),
            Mask::Local { left, right, offset } => (End::Shift(offset as i128 - left as i128), End::Shift(offset as i128 + right as i128 + 1)),
            Mask::Band { width } => (End::Shift(-(width as i128)), End::Shift(width as i128 + 1)),
            Mask::Sink { tokens } => (End::Const(0), End::Const(tokens as i128)),
            Mask::Chunked { size } if size > 0 => (End::Chunk(size), End::Shift(1)),
            _ => return None,
        };
        Some(LinearRows { lo, hi })
    }

    /// The classified kv tiles of rows `q0 .. q0 + rows` as runs: the tiles wholly left of every
    /// row's interval, wholly inside every row's, and wholly right of every row's are runs of
    /// one kind found from the first and last rows alone; only the tiles the ends cross are
    /// counted ([`LinearRows::sum`]).
    fn tile_runs(&self, q0: u64, rows: u64, grid: &TileGrid, align: bool, runs: &mut Vec<TileRun>) {
        let Some(RowSpan { nk, qi, kv, a, b }) = RowSpan::of(q0, rows, grid, align, runs) else { return };
        let (lo_min, lo_max) = (self.lo.at(a, kv), self.lo.at(b - 1, kv));
        let (hi_min, hi_max) = (self.hi.at(a, kv), self.hi.at(b - 1, kv));
        let bkv = grid.block_kv as i128;
        let count = |kj: u64| -> u64 {
            let c0 = kj as i128 * bkv;
            let c1 = (c0 + bkv).min(kv);
            if c1 <= lo_min || c0 >= hi_max {
                0
            } else if c0 >= lo_max && c1 <= hi_min {
                (rows as i128 * (c1 - c0)) as u64
            } else {
                self.sum(a, b, c0, c1, kv) as u64
            }
        };
        let nk_i = nk as i128;
        // Tiles [0, left) end at or before every row's start; [right, nk) begin at or after every
        // row's end; [f0, f1) lie inside every row's interval.
        let left = (lo_min / bkv).min(nk_i) as u64;
        let right = ((hi_max + bkv - 1) / bkv).clamp(left as i128, nk_i) as u64;
        let f0 = ((lo_max + bkv - 1) / bkv).max(left as i128);
        let f1 = if hi_min >= kv { nk_i } else { hi_min / bkv }.min(right as i128);
        let (f0, f1) = (f0 as u64, (f1 as u64).max(f0 as u64).min(right));
        let f0 = f0.min(right);
        let empty = Tile { kept: 0, kind: TileKind::Empty };
        push_run(runs, 0, left, if rows == 0 { empty } else { classify_tile(grid, qi, 0, 0, align) });
        for kj in left..f0 {
            push_run(runs, kj, 1, classify_tile(grid, qi, kj, count(kj), align));
        }
        if f1 > f0 {
            // Whole tiles: alike but for the last kv tile, which may be padded.
            let whole = if f1 == nk && grid.real_cols(nk - 1) < grid.block_kv { f1 - 1 } else { f1 };
            if whole > f0 {
                push_run(runs, f0, whole - f0, classify_tile(grid, qi, f0, rows * grid.block_kv, align));
            }
            for kj in whole.max(f0)..f1 {
                push_run(runs, kj, 1, classify_tile(grid, qi, kj, count(kj), align));
            }
        }
        for kj in f1.max(f0)..right {
            push_run(runs, kj, 1, classify_tile(grid, qi, kj, count(kj), align));
        }
        if right < nk {
            push_run(runs, right, nk - right, classify_tile(grid, qi, right, 0, align));
        }
    }

    /// Kept pairs per kv tile of rows `q0 .. q0 + rows`, into `counts` (one per kv tile).
    #[cfg(test)]
    fn tile_counts(&self, q0: u64, rows: u64, grid: &TileGrid, counts: &mut [u64]) {
        let kv = grid.kv_len as i128;
        let (a, b) = (q0 as i128, (q0 + rows) as i128);
        if rows == 0 {
            counts.iter_mut().for_each(|c| *c = 0);
            return;
        }
        // Both ends never decrease with q: the first and last rows bound every row's interval.
        let (lo_min, lo_max) = (self.lo.at(a, kv), self.lo.at(b - 1, kv));
        let (hi_min, hi_max) = (self.hi.at(a, kv), self.hi.at(b - 1, kv));
        let bkv = grid.block_kv as i128;
        for (kj, c) in counts.iter_mut().enumerate() {
            let c0 = kj as i128 * bkv;
            let c1 = (c0 + bkv).min(kv);
            *c = if c1 <= lo_min || c0 >= hi_max {
                0
            } else if c0 >= lo_max && c1 <= hi_min {
                (rows as i128 * (c1 - c0)) as u64
            } else {
                self.sum(a, b, c0, c1, kv) as u64
            };
        }
    }

    /// Sum over rows q in [a, b) of |[lo(q), hi(q)) ∩ [c0, c1)|.
    fn sum(&self, a: i128, b: i128, c0: i128, c1: i128, kv: i128) -> i128 {
        // Chunk starts are constant within a chunk: split the rows at chunk boundaries that
        // matter (where the chunk start differs).
        if let End::Chunk(s) = self.lo {
            let s = s as i128;
            let mut total = 0;
            let mut p = a;
            while p < b {
                let e = ((p / s + 1) * s).min(b);
                let piece = LinearRows { lo: End::Const((p / s * s).clamp(0, kv)), hi: self.hi };
                total += piece.sum(p, e, c0, c1, kv);
                p = e;
            }
            return total;
        }
        sum_between(&[self.lo], &[self.hi], a, b, c0, c1, kv)
    }
}

/// Sum over rows q in [a, b) of |[max of `los` at q, min of `his` at q) ∩ [c0, c1)|, for ends
/// that are constants or shifts (no chunk starts). The inner length min(his, c1) - max(los, c0)
/// is linear with a step of -1, 0 or 1 between the rows where a clamp, a min or a max switches
/// (a shift meeting 0, kv, its tile edge or a constant end of its side); max(0, inner) is summed
/// piece by piece.
fn sum_between(los: &[End], his: &[End], a: i128, b: i128, c0: i128, c1: i128, kv: i128) -> i128 {
    let mut cuts: smallvec::SmallVec<[i128; 24]> = smallvec::smallvec![a, b];
    for (side, edge) in [(los, c0), (his, c1)] {
        for e in side {
            let End::Shift(c) = *e else { continue };
            let consts = side.iter().filter_map(|o| if let End::Const(k) = *o { Some(k) } else { None });
            for x in [-c, kv - c, edge - c].into_iter().chain(consts.map(|k| k - c)) {
                // The row at which the end crosses x (and the next row).
                for y in [x, x + 1] {
                    if y > a && y < b {
                        cuts.push(y);
                    }
                }
            }
        }
    }
    cuts.sort_unstable();
    cuts.dedup();
    let inner = |q: i128| {
        let hi = his.iter().map(|e| e.at(q, kv)).min().unwrap_or(kv);
        let lo = los.iter().map(|e| e.at(q, kv)).max().unwrap_or(0);
        hi.min(c1) - lo.max(c0)
    };
    cuts.windows(2).map(|w| sum_positive(inner(w[0]), inner(w[1] - 1), w[1] - w[0])).sum()
}

/// A union of masks whose rows each keep one interval with constant or shifted ends (band +
/// sink, causal | local, and intersections of such: `causal&band:9`): a kv tile's kept pairs by
/// inclusion-exclusion over the parts that keep some pair of it (a part that keeps all of it
/// keeps the union's; the intersection of parts keeps, per row, the interval from their largest
/// start to their smallest end), O(q tiles x kv tiles) with no row walked.
#[derive(Debug, Clone)]
struct LinearUnion {
    /// Each part's starts (the interval begins at the largest) and ends (it stops at the smallest).
    parts: Vec<(Vec<End>, Vec<End>)>,
}

impl LinearUnion {
    /// Parts of a union (or one intersection) of such masks; `None` for any other mask, and for
    /// unions of more than 6 parts (inclusion-exclusion's terms grow as 2^parts).
    fn of(mask: &Mask) -> Option<Self> {
        fn interval(m: &Mask) -> Option<(Vec<End>, Vec<End>)> {
            match m {
                Mask::Intersect(p) if !p.is_empty() => {
                    let (mut lo, mut hi) = (Vec::new(), Vec::new());
                    for x in p {
                        let (l, h) = interval(x)?;
                        lo.extend(l);
                        hi.extend(h);
                    }
                    Some((lo, hi))
                }
                m => LinearRows::of(m).filter(|l| !matches!(l.lo, End::Chunk(_))).map(|l| (vec![l.lo], vec![l.hi])),
            }
        }
        let parts = match mask {
            Mask::Union(p) if !p.is_empty() && p.len() <= 6 => p.iter().map(interval).collect::<Option<Vec<_>>>()?,
            Mask::Intersect(_) => vec![interval(mask)?],
            _ => return None,
        };
        Some(LinearUnion { parts })
    }

    /// The classified kv tiles of rows `q0 .. q0 + rows` as runs.
    fn tile_runs(&self, q0: u64, rows: u64, grid: &TileGrid, align: bool, runs: &mut Vec<TileRun>) {
        let Some(RowSpan { nk, qi, kv, a, b }) = RowSpan::of(q0, rows, grid, align, runs) else { return };
        // Every end never decreases with q: the first and last rows bound each part's rows.
        let at = |ends: &[End], q: i128, lo: bool| {
            let v = ends.iter().map(|e| e.at(q, kv));
            if lo { v.max() } else { v.min() }.unwrap_or(0)
        };
        let bounds: Vec<[i128; 4]> = self.parts.iter().map(|(l, h)| [at(l, a, true), at(l, b - 1, true), at(h, a, false), at(h, b - 1, false)]).collect();
        let bkv = grid.block_kv as i128;
        let mut touching: smallvec::SmallVec<[usize; 6]> = smallvec::SmallVec::new();
        let (mut lo, mut hi) = (Vec::new(), Vec::new());
        for kj in 0..nk {
            let c0 = kj as i128 * bkv;
            let c1 = (c0 + bkv).min(kv);
            touching.clear();
            let mut whole = false;
            for (p, &[lo_min, lo_max, hi_min, hi_max]) in bounds.iter().enumerate() {
                if c1 <= lo_min || c0 >= hi_max || lo_min >= hi_max {
                    continue;
                }
                if c0 >= lo_max && c1 <= hi_min {
                    whole = true;
                    break;
                }
                touching.push(p);
            }
            let kept = if whole {
                rows as i128 * (c1 - c0)
            } else {
                // Inclusion-exclusion over the subsets of the touching parts.
                let mut total = 0i128;
                for set in 1u32..1 << touching.len() {
                    lo.clear();
                    hi.clear();
                    for (i, &p) in touching.iter().enumerate() {
                        if set >> i & 1 == 1 {
                            lo.extend_from_slice(&self.parts[p].0);
                            hi.extend_from_slice(&self.parts[p].1);
                        }
                    }
                    let s = sum_between(&lo, &hi, a, b, c0, c1, kv);
                    total += if set.count_ones() % 2 == 1 { s } else { -s };
                }
                total
            };
            push_run(runs, kj, 1, classify_tile(grid, qi, kj, kept as u64, align));
        }
    }
}

/// Sum of max(0, v) over `n` terms of an arithmetic sequence from `first` to `last` whose step
/// is -1, 0 or 1.
fn sum_positive(first: i128, last: i128, n: i128) -> i128 {
    if n == 1 {
        return first.max(0);
    }
    debug_assert!((last - first).abs() == n - 1 || last == first, "a clamped linear piece steps by one");
    match (first >= 0, last >= 0) {
        (true, true) => (first + last) * n / 2,
        (false, false) => 0,
        // Rising from below 0 to `last`: the terms 1 ..= last.
        (false, true) => last * (last + 1) / 2,
        // Falling from `first` to below 0: the terms first ..= 1.
        (true, false) => first * (first + 1) / 2,
    }
}

/// Rows of one q tile grouped by [`Mask::row_key`]: one representative row per distinct key
/// and how many rows share it, so each distinct row's intervals are walked once (a video mask
/// in position-major order has only F distinct rows per tile when its window spans H and W).
#[derive(Default)]
struct RowClasses {
    /// (representative row, rows sharing its key).
    reps: Vec<(u64, u64)>,
    index: HashMap<Vec<u64>, usize, BuildHasherDefault<FxHasher>>,
    key: Vec<u64>,
    last: Vec<u64>,
}

impl RowClasses {
    fn collect(&mut self, mask: &Mask, q0: u64, q1: u64) {
        self.reps.clear();
        self.index.clear();
        let mut last_id = usize::MAX;
        for q in q0..q1 {
            self.key.clear();
            mask.row_key(q, &mut self.key);
            if last_id != usize::MAX && self.key == self.last {
                self.reps[last_id].1 += 1;
                continue;
            }
            let id = match self.index.get(self.key.as_slice()) {
                Some(&id) => {
                    self.reps[id].1 += 1;
                    id
                }
                None => {
                    self.reps.push((q, 1));
                    self.index.insert(self.key.clone(), self.reps.len() - 1);
                    self.reps.len() - 1
                }
            };
            last_id = id;
            std::mem::swap(&mut self.last, &mut self.key);
        }
    }
}

/// A small multiplicative hasher for row keys (a few u64 words); not DoS-resistant, which
/// does not matter for keys derived from the mask itself.
#[derive(Default)]
struct FxHasher(u64);

impl FxHasher {
    #[inline]
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        for &b in chunks.remainder() {
            self.add(b as u64);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.add(v);
    }
    fn write_usize(&mut self, v: usize) {
        self.add(v as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// Tile counts and kept pairs of one mask at one tiling (one head).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TileStats {
    /// All tiles of the padded grid.
    pub total: u64,
    /// Tiles with no kept pair.
    pub empty: u64,
    /// Tiles needing the element-wise mask.
    pub partial: u64,
    /// Mask-free tiles.
    pub full: u64,
    /// Kept real pairs.
    pub kept_pairs: u64,
}

impl TileStats {
    /// Classifies every tile of `mask` at `grid`.
    pub fn collect(mask: &Mask, grid: &TileGrid, align: bool) -> Self {
        let mut s = TileStats::default();
        for_each_tile_run_row(mask, grid, align, |_, row| {
            for r in row {
                s.total += r.n;
                s.kept_pairs += r.n * r.tile.kept;
                match r.tile.kind {
                    TileKind::Empty => s.empty += r.n,
                    TileKind::Partial => s.partial += r.n,
                    TileKind::Full => s.full += r.n,
                }
            }
        });
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Brute force: test every pair.
    fn brute(mask: &Mask, g: &TileGrid) -> Vec<Vec<(u64, TileKind)>> {
        let mut iv = Vec::new();
        let mut out = vec![vec![0u64; g.kv_tiles() as usize]; g.q_tiles() as usize];
        for q in 0..g.q_len {
            mask.row_intervals(q, g.kv_len, &mut iv);
            for k in 0..g.kv_len {
                if iv.iter().any(|&(lo, hi)| lo <= k && k < hi) {
                    out[(q / g.block_q) as usize][(k / g.block_kv) as usize] += 1;
                }
            }
        }
        out.iter()
            .enumerate()
            .map(|(qi, row)| {
                row.iter()
                    .enumerate()
                    .map(|(kj, &c)| {
                        let real = g.real_rows(qi as u64) * g.real_cols(kj as u64);
                        let kind = if c == 0 {
                            TileKind::Empty
                        } else if c == real && g.real_cols(kj as u64) == g.block_kv && g.real_rows(qi as u64) == g.block_q {
                            TileKind::Full
                        } else {
                            TileKind::Partial
                        };
                        (c, kind)
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn matches_brute_force_on_small_cases() {
        let g = TileGrid { q_len: 37, kv_len: 45, block_q: 8, block_kv: 16 };
        for s in ["full", "causal", "band:5+sink:3", "local:7,2", "chunked:10", "causal&band:9"] {
            let m = Mask::parse(s).unwrap();
            let want = brute(&m, &g);
            for_each_tile_row(&m, &g, false, |qi, row| {
                let got: Vec<_> = row.iter().map(|t| (t.kept, t.kind)).collect();
                assert_eq!(got, want[qi as usize], "{s} row {qi}");
            });
        }
    }

    /// The generic row walk, for comparison with the closed-form counts.
    fn walked(mask: &Mask, g: &TileGrid) -> Vec<Vec<u64>> {
        let mut iv = Vec::new();
        let nk = g.kv_tiles() as usize;
        (0..g.q_tiles())
            .map(|qi| {
                let mut counts = vec![0u64; nk];
                let mut diff = vec![0u64; nk + 1];
                for q in qi * g.block_q..qi * g.block_q + g.real_rows(qi) {
                    mask.row_intervals(q, g.kv_len, &mut iv);
                    accumulate(&iv, 1, g.block_kv, &mut counts, &mut diff);
                }
                let mut run = 0u64;
                for (kj, c) in counts.iter_mut().enumerate() {
                    run = run.wrapping_add(diff[kj]);
                    *c += run;
                }
                counts
            })
            .collect()
    }

    #[test]
    fn closed_form_counts_equal_the_row_walk() {
        let masks = [
            "full",
            "causal",
            "causal@offset:-37",
            "causal@offset:300",
            "local:0,0",
            "local:77,5",
            "local:5,300@offset:-100",
            "local:1000,1000@offset:50",
            "band:0",
            "band:63",
            "band:999",
            "sink:1",
            "sink:200",
            "sink:5000",
            "chunked:1",
            "chunked:7",
            "chunked:128",
            "chunked:333",
            "chunked:5000",
        ];
        for (q_len, kv_len, bq, bkv) in
            [(1000, 1000, 128, 128), (777, 1313, 64, 256), (2048, 640, 512, 128), (37, 45, 8, 16), (1, 1, 8, 128), (3000, 3000, 2048, 128), (640, 4096, 8, 512)]
        {
            let g = TileGrid { q_len, kv_len, block_q: bq, block_kv: bkv };
            for m in masks {
                let mask = Mask::parse(m).unwrap();
                let lin = LinearRows::of(&mask).expect("a single-interval mask");
                let want = walked(&mask, &g);
                for qi in 0..g.q_tiles() {
                    let mut got = vec![0u64; g.kv_tiles() as usize];
                    lin.tile_counts(qi * bq, g.real_rows(qi), &g, &mut got);
                    assert_eq!(got, want[qi as usize], "{m} at {q_len}x{kv_len} / {bq}x{bkv}, q tile {qi}");
                    // The run-length form expands to the tiles the counts classify to.
                    for align in [false, true] {
                        let mut runs = Vec::new();
                        lin.tile_runs(qi * bq, g.real_rows(qi), &g, align, &mut runs);
                        let expanded: Vec<Tile> = runs.iter().flat_map(|r| std::iter::repeat_n(r.tile, r.n as usize)).collect();
                        let classified: Vec<Tile> =
                            want[qi as usize].iter().enumerate().map(|(kj, &c)| classify_tile(&g, qi, kj as u64, c, align)).collect();
                        assert_eq!(expanded, classified, "{m} at {q_len}x{kv_len} / {bq}x{bkv}, q tile {qi}, align {align}");
                        assert!(runs.windows(2).all(|w| w[0].kj0 + w[0].n == w[1].kj0), "runs cover the row in order");
                    }
                }
            }
        }
    }

    #[test]
    fn unions_of_linear_masks_count_as_the_row_walk() {
        let masks = [
            "band:5+sink:3",
            "band:63+sink:200",
            "band:0+sink:1",
            "band:15000+sink:3600",
            "causal&band:9",
            "causal@offset:-37&local:50,3",
            "sink:10+causal@offset:-100",
            "local:5,300@offset:-100+band:7",
            "band:3+band:50+sink:20",
            "causal+full",
            "sink:7+sink:19",
            "local:100,0+local:0,100@offset:40+sink:64",
        ];
        for (q_len, kv_len, bq, bkv) in [(1000, 1000, 128, 128), (777, 1313, 64, 256), (2048, 640, 512, 128), (37, 45, 8, 16), (1, 1, 8, 128), (3000, 3000, 2048, 128)] {
            let g = TileGrid { q_len, kv_len, block_q: bq, block_kv: bkv };
            for m in masks {
                let mask = Mask::parse(m).unwrap();
                let union = LinearUnion::of(&mask).unwrap_or_else(|| panic!("{m}: a union of linear masks"));
                let want = walked(&mask, &g);
                for qi in 0..g.q_tiles() {
                    for align in [false, true] {
                        let mut runs = Vec::new();
                        union.tile_runs(qi * bq, g.real_rows(qi), &g, align, &mut runs);
                        let expanded: Vec<Tile> = runs.iter().flat_map(|r| std::iter::repeat_n(r.tile, r.n as usize)).collect();
                        let classified: Vec<Tile> =
                            want[qi as usize].iter().enumerate().map(|(kj, &c)| classify_tile(&g, qi, kj as u64, c, align)).collect();
                        assert_eq!(expanded, classified, "{m} at {q_len}x{kv_len} / {bq}x{bkv}, q tile {qi}, align {align}");
                    }
                }
            }
        }
        // Chunked parts and masks of other kinds keep the row walk.
        for m in ["chunked:7+sink:3", "band:5"] {
            assert!(LinearUnion::of(&Mask::parse(m).unwrap()).is_none(), "{m}");
        }
    }

    #[test]
    fn alignment_keeps_whole_tiles() {
        let g = TileGrid { q_len: 64, kv_len: 64, block_q: 16, block_kv: 16 };
        let s = TileStats::collect(&Mask::Causal { offset: 0 }, &g, true);
        assert_eq!(s.partial, 0);
        assert_eq!(s.full, 10); // 6 below the diagonal + 4 diagonal tiles (each > half kept)
        assert_eq!(s.kept_pairs, 10 * 256);
    }
}
