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

/// Calls `f(qi, tiles)` for every q tile in order, with the classified kv tiles of that row.
///
/// `tiles.len()` equals `grid.kv_tiles()`. See the module docs for the rules and cost.
pub fn for_each_tile_row(mask: &Mask, grid: &TileGrid, align: bool, mut f: impl FnMut(u64, &[Tile])) {
    let nk = grid.kv_tiles() as usize;
    let bkv = grid.block_kv;
    let mut counts = vec![0u64; nk];
    let mut diff = vec![0u64; nk + 1];
    let mut iv = Vec::new();
    let mut tiles = vec![Tile { kept: 0, kind: TileKind::Empty }; nk];
    let full_mask = mask.is_full();
    // An array mask answers tile counts block by block (cached per tiling).
    let array_counts = match mask {
        Mask::Array(a) if a.source.lengths() == (grid.q_len, grid.kv_len) => a.tile_counts(grid.block_q, grid.block_kv),
        _ => None,
    };
    let grouped = !full_mask && mask.has_row_classes();
    let mut classes = RowClasses::default();
    let bounds = match mask {
        Mask::Video(v) if !full_mask => v.tile_bounds(bkv, grid.kv_len),
        _ => Vec::new(),
    };
    for qi in 0..grid.q_tiles() {
        let rows = grid.real_rows(qi);
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
        for (kj, t) in tiles.iter_mut().enumerate() {
            let cols = grid.real_cols(kj as u64);
            let real = rows * cols;
            let padded = cols < bkv || rows < grid.block_q;
            let kept = counts[kj];
            *t = if align {
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
            };
        }
        f(qi, &tiles);
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
        for_each_tile_row(mask, grid, align, |_, row| {
            for t in row {
                s.total += 1;
                s.kept_pairs += t.kept;
                match t.kind {
                    TileKind::Empty => s.empty += 1,
                    TileKind::Partial => s.partial += 1,
                    TileKind::Full => s.full += 1,
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

    #[test]
    fn alignment_keeps_whole_tiles() {
        let g = TileGrid { q_len: 64, kv_len: 64, block_q: 16, block_kv: 16 };
        let s = TileStats::collect(&Mask::Causal { offset: 0 }, &g, true);
        assert_eq!(s.partial, 0);
        assert_eq!(s.full, 10); // 6 below the diagonal + 4 diagonal tiles (each > half kept)
        assert_eq!(s.kept_pairs, 10 * 256);
    }
}
