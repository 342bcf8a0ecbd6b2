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
//! mask; the N x N mask is never built.
//!
//! **Tile alignment** (`align = true`) rounds the mask to whole tiles: a tile is kept whole when
//! at least half of its real pairs are kept, and dropped otherwise. Rounding in and out at the
//! same threshold keeps the kept-pair budget close to the exact mask's (video-diffusion-case.md:
//! 445 of 1,150 tiles, 39.1% vs 39.4% pair density). Kept tiles are full unless they hold
//! padding, which still has to be masked.

use crate::mask::Mask;
use serde::Serialize;

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
    let mut diff = vec![0i64; nk + 1];
    let mut iv = Vec::new();
    let mut tiles = vec![Tile { kept: 0, kind: TileKind::Empty }; nk];
    let full_mask = mask.is_full();
    for qi in 0..grid.q_tiles() {
        let rows = grid.real_rows(qi);
        counts.iter_mut().for_each(|c| *c = 0);
        if full_mask {
            for (kj, c) in counts.iter_mut().enumerate() {
                *c = rows * grid.real_cols(kj as u64);
            }
        } else {
            diff.iter_mut().for_each(|d| *d = 0);
            let q0 = qi * grid.block_q;
            for q in q0..q0 + rows {
                mask.row_intervals(q, grid.kv_len, &mut iv);
                for &(lo, hi) in &iv {
                    let ja = (lo / bkv) as usize;
                    let jb = ((hi - 1) / bkv) as usize;
                    if ja == jb {
                        counts[ja] += hi - lo;
                    } else {
                        counts[ja] += (ja as u64 + 1) * bkv - lo;
                        counts[jb] += hi - jb as u64 * bkv;
                        if jb > ja + 1 {
                            diff[ja + 1] += bkv as i64;
                            diff[jb] -= bkv as i64;
                        }
                    }
                }
            }
            let mut run = 0i64;
            for (kj, c) in counts.iter_mut().enumerate() {
                run += diff[kj];
                *c += run as u64;
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
        let s = TileStats::collect(&Mask::Causal, &g, true);
        assert_eq!(s.partial, 0);
        assert_eq!(s.full, 10); // 6 below the diagonal + 4 diagonal tiles (each > half kept)
        assert_eq!(s.kept_pairs, 10 * 256);
    }
}
