//! 3-D video masks: a latent volume of F frames x H rows x W columns of tokens, a window in
//! that volume, and the order in which the volume's tokens are laid out in the sequence.
//!
//! The grammar (`video:...`, `sta:...`) is documented in the [`crate::mask`] module docs.
//!
//! For one query row the kept kv tokens are a box in (frame, row, column) space:
//! `[f0, f1] x [h0, h1] x [w0, w1]` (inclusive). [`VideoMask::row_intervals`] walks that box in
//! token order, one interval per innermost run (whole rows, frames or tiles collapse to one run
//! when the box spans them), merging adjacent runs; it never touches positions outside the box.

use super::MaskTerms;
use std::fmt;

/// How the tokens of an F x H x W video volume are ordered in the sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VideoOrder {
    /// Frame-major (raster order): token = (f x H + h) x W + w.
    Frame,
    /// Position-major (the temporal-head permutation): token = (h x W + w) x F + f.
    Position,
    /// Tile by tile as in Sliding Tile Attention: the volume is cut into tiles of
    /// `tile = [tf, th, tw]` tokens (each dividing F, H, W), tiles ordered frame-major over the
    /// (F/tf) x (H/th) x (W/tw) tile grid, tokens inside a tile frame-major:
    /// token = (((Tf x NTh + Th) x NTw + Tw) x tf x th x tw) + (f' x th + h') x tw + w', with
    /// f = Tf x tf + f' (likewise h, w).
    Tiles {
        /// Tile size in frames, rows, columns.
        tile: [u64; 3],
    },
}

/// Which pairs of a video volume are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VideoWindow {
    /// Token window: keep (q, k) when |fq - fk| <= w\[0\], |hq - hk| <= w\[1\] and
    /// |wq - wk| <= w\[2\] (half-widths in frames, rows, columns).
    Tokens([u64; 3]),
    /// Sliding Tile Attention window, counted in whole tiles of `tile` tokens: the query's tile
    /// (Tq) picks a kernel of `kernel[i]` tiles (odd) per dimension centred on
    /// clamp(Tq, kernel/2, NT - 1 - kernel/2), so the window is shifted inward at the volume's
    /// borders and every query sees the same number of tiles (as in the STA and NATTEN masks);
    /// a kernel of at least NT tiles keeps the whole dimension.
    Tiles {
        /// Kernel size in tiles per dimension (odd).
        kernel: [u64; 3],
        /// Tile size in frames, rows, columns (each dividing F, H, W).
        tile: [u64; 3],
    },
}

/// A 3-D video mask: volume `dims = [F, H, W]` (F x H x W must equal the sequence length), a
/// window, and a token order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VideoMask {
    /// Frames F, rows H, columns W of the latent volume.
    pub dims: [u64; 3],
    /// Which pairs are kept.
    pub window: VideoWindow,
    /// How tokens are laid out in the sequence.
    pub order: VideoOrder,
}

const DIM_NAMES: [&str; 3] = ["frames F", "height H", "width W"];
const TILE_NAMES: [&str; 3] = ["tf", "th", "tw"];

impl VideoMask {
    /// Number of tokens F x H x W (saturating; [`VideoMask::check`] bounds it by
    /// [`crate::MAX_DIM`]).
    pub fn tokens(&self) -> u64 {
        self.dims[0].saturating_mul(self.dims[1]).saturating_mul(self.dims[2])
    }

    /// Checks sizes: F, H, W and tile sizes at least 1, tiles dividing the volume, STA
    /// kernels odd and at least 1, F x H x W at most [`crate::MAX_DIM`].
    ///
    /// # Errors
    /// A message naming the field and value.
    pub fn check(&self) -> Result<(), String> {
        let word = self.word();
        for (i, &n) in self.dims.iter().enumerate() {
            if n == 0 || n > crate::MAX_DIM {
                return Err(format!("'{word}' {} = {n}: expected a whole number from 1 to {}", DIM_NAMES[i], crate::MAX_DIM));
            }
        }
        if (self.dims[0] as u128) * (self.dims[1] as u128) * (self.dims[2] as u128) > crate::MAX_DIM as u128 {
            return Err(format!(
                "'{word}' volume {} x {} x {}: expected at most {} tokens",
                self.dims[0],
                self.dims[1],
                self.dims[2],
                crate::MAX_DIM
            ));
        }
        let check_tile = |what: &str, tile: &[u64; 3]| -> Result<(), String> {
            for i in 0..3 {
                if tile[i] == 0 {
                    return Err(format!("'{word}' {what} {} = 0: tile sizes must be at least 1", TILE_NAMES[i]));
                }
                if !self.dims[i].is_multiple_of(tile[i]) {
                    return Err(format!(
                        "'{word}' {what} {},{},{}: {} = {} is not a multiple of {} = {} (tiles must divide the volume {},{},{})",
                        tile[0],
                        tile[1],
                        tile[2],
                        DIM_NAMES[i],
                        self.dims[i],
                        TILE_NAMES[i],
                        tile[i],
                        self.dims[0],
                        self.dims[1],
                        self.dims[2]
                    ));
                }
            }
            Ok(())
        };
        if let VideoWindow::Tiles { kernel, tile } = &self.window {
            check_tile("tile", tile)?;
            for (i, &k) in kernel.iter().enumerate() {
                if k % 2 == 0 {
                    return Err(format!(
                        "'sta' kernel {} = {k}: STA kernels are counted in whole tiles and must be odd (1, 3, 5, ...)",
                        ["kf", "kh", "kw"][i]
                    ));
                }
            }
        }
        if let VideoOrder::Tiles { tile } = &self.order {
            check_tile("@tiles", tile)?;
        }
        Ok(())
    }

    fn word(&self) -> &'static str {
        match self.window {
            VideoWindow::Tokens(_) => "video",
            VideoWindow::Tiles { .. } => "sta",
        }
    }

    /// (frame, row, column) of token `t` (which must be below [`VideoMask::tokens`]).
    pub fn coords(&self, t: u64) -> [u64; 3] {
        let [nf, nh, nw] = self.dims;
        match self.order {
            VideoOrder::Frame => [t / (nh * nw), (t / nw) % nh, t % nw],
            VideoOrder::Position => [t % nf, t / (nf * nw), (t / nf) % nw],
            VideoOrder::Tiles { tile: [tf, th, tw] } => {
                let vol = tf * th * tw;
                let (nth, ntw) = (nh / th, nw / tw);
                let (tile_id, r) = (t / vol, t % vol);
                let (bf, bh, bw) = (tile_id / (nth * ntw), (tile_id / ntw) % nth, tile_id % ntw);
                [bf * tf + r / (th * tw), bh * th + (r / tw) % th, bw * tw + r % tw]
            }
        }
    }

    /// The kept kv box of a query at coordinates `c`: inclusive (lo, hi) per dimension.
    pub fn kept_box(&self, c: [u64; 3]) -> [(u64, u64); 3] {
        let mut b = [(0, 0); 3];
        for i in 0..3 {
            let n = self.dims[i];
            b[i] = match self.window {
                VideoWindow::Tokens(w) => (c[i].saturating_sub(w[i]), c[i].saturating_add(w[i]).min(n - 1)),
                VideoWindow::Tiles { kernel, tile } => {
                    let (t, nt, half) = (tile[i], n / tile[i], kernel[i] / 2);
                    let top = (nt - 1).saturating_sub(half).max(half);
                    let centre = (c[i] / t).clamp(half, top);
                    let lo = centre - half;
                    let hi = (centre + half).min(nt - 1);
                    (lo * t, (hi + 1) * t - 1)
                }
            };
        }
        b
    }

    /// True when dimension `i`'s window spans the whole extent (no test needed).
    fn spans(&self, i: usize) -> bool {
        match self.window {
            VideoWindow::Tokens(w) => w[i] >= self.dims[i] - 1,
            VideoWindow::Tiles { kernel, tile } => kernel[i] >= self.dims[i] / tile[i],
        }
    }

    /// True when every pair of the volume is kept.
    pub fn is_full(&self) -> bool {
        (0..3).all(|i| self.spans(i))
    }

    /// Kept kv intervals of query row `q` (see [`super::Mask::row_intervals`]): sorted,
    /// disjoint, maximal, clipped to `kv_len`. Rows at or beyond F x H x W keep nothing.
    /// Cost: one step per innermost run of the kept box, never per kv position.
    pub fn row_intervals(&self, q: u64, kv_len: u64, out: &mut Vec<(u64, u64)>) {
        out.clear();
        if q >= self.tokens() || kv_len == 0 {
            return;
        }
        let r = self.kept_box(self.coords(q));
        let [nf, nh, nw] = self.dims;
        match self.order {
            VideoOrder::Frame => emit_box(0, [nf, nh, nw], [r[0], r[1], r[2]], kv_len, out),
            VideoOrder::Position => emit_box(0, [nh, nw, nf], [r[1], r[2], r[0]], kv_len, out),
            VideoOrder::Tiles { tile } => {
                let vol = tile[0] * tile[1] * tile[2];
                let (nth, ntw) = (nh / tile[1], nw / tile[2]);
                let sub = |i: usize, b: u64| -> (u64, u64) {
                    let base = b * tile[i];
                    (r[i].0.max(base) - base, r[i].1.min(base + tile[i] - 1) - base)
                };
                'outer: for bf in r[0].0 / tile[0]..=r[0].1 / tile[0] {
                    let sf = sub(0, bf);
                    for bh in r[1].0 / tile[1]..=r[1].1 / tile[1] {
                        let sh = sub(1, bh);
                        for bw in r[2].0 / tile[2]..=r[2].1 / tile[2] {
                            let base = ((bf * nth + bh) * ntw + bw) * vol;
                            if base >= kv_len {
                                break 'outer;
                            }
                            emit_box(base, tile, [sf, sh, sub(2, bw)], kv_len, out);
                        }
                    }
                }
            }
        }
    }

    /// Token index of coordinates `c` (the inverse of [`VideoMask::coords`]).
    pub fn token(&self, c: [u64; 3]) -> u64 {
        let [nf, nh, nw] = self.dims;
        match self.order {
            VideoOrder::Frame => (c[0] * nh + c[1]) * nw + c[2],
            VideoOrder::Position => (c[1] * nw + c[2]) * nf + c[0],
            VideoOrder::Tiles { tile: [tf, th, tw] } => {
                let (nth, ntw) = (nh / th, nw / tw);
                let tile_id = ((c[0] / tf) * nth + c[1] / th) * ntw + c[2] / tw;
                tile_id * (tf * th * tw) + ((c[0] % tf) * th + c[1] % th) * tw + c[2] % tw
            }
        }
    }

    /// The digits of token index `x` in this order (see [`VideoDigits`]).
    pub fn digits(&self, x: u64) -> VideoDigits {
        if x >= self.tokens() {
            return VideoDigits { d: [0; 6], beyond: true };
        }
        let [nf, nh, nw] = self.dims;
        let split3 = |n: [u64; 3], x: u64| [x / (n[1] * n[2]), (x / n[2]) % n[1], x % n[2]];
        let d = match self.order {
            VideoOrder::Frame => {
                let [a, b, c] = split3([nf, nh, nw], x);
                [a, b, c, 0, 0, 0]
            }
            VideoOrder::Position => {
                let [a, b, c] = split3([nh, nw, nf], x);
                [a, b, c, 0, 0, 0]
            }
            VideoOrder::Tiles { tile } => {
                let vol = tile[0] * tile[1] * tile[2];
                let [a, b, c] = split3([nf / tile[0], nh / tile[1], nw / tile[2]], x / vol);
                let [e, f, g] = split3(tile, x % vol);
                [a, b, c, e, f, g]
            }
        };
        VideoDigits { d, beyond: false }
    }

    /// Number of tokens of box `r` (inclusive ranges per dimension) whose index is below `x`:
    /// O(1), no walk over the box.
    pub fn rank(&self, r: &[(u64, u64); 3], x: u64) -> u64 {
        self.rank_digits(r, &self.digits(x))
    }

    /// [`VideoMask::rank`] at a token whose digits are already known (no divisions).
    pub fn rank_digits(&self, r: &[(u64, u64); 3], x: &VideoDigits) -> u64 {
        if x.beyond {
            return span(r[0]) * span(r[1]) * span(r[2]);
        }
        let d = &x.d;
        match self.order {
            VideoOrder::Frame => rank3([r[0], r[1], r[2]], [d[0], d[1], d[2]]),
            VideoOrder::Position => rank3([r[1], r[2], r[0]], [d[0], d[1], d[2]]),
            VideoOrder::Tiles { tile } => {
                // Box tokens in tiles before tile (d0, d1, d2): tiles are ordered
                // lexicographically and tile T holds prod_i |r_i within T_i| box tokens.
                let before = |i: usize| below(r[i], d[i] * tile[i]);
                let at = |i: usize| below(r[i], (d[i] + 1) * tile[i]) - before(i);
                let (s1, s2) = (span(r[1]), span(r[2]));
                let (a0, a1, a2) = (at(0), at(1), at(2));
                let mut n = before(0) * s1 * s2 + a0 * (before(1) * s2 + a1 * before(2));
                if a0 > 0 && a1 > 0 && a2 > 0 {
                    let sub = |i: usize| {
                        let b = d[i] * tile[i];
                        (r[i].0.max(b) - b, r[i].1.min(b + tile[i] - 1) - b)
                    };
                    n += rank3([sub(0), sub(1), sub(2)], [d[3], d[4], d[5]]);
                }
                n
            }
        }
    }

    /// Digits of every kv tile boundary `min(j x bkv, kv_len)`, j = 0..=ceil(kv_len / bkv), for
    /// [`VideoMask::add_tile_counts`].
    pub fn tile_bounds(&self, bkv: u64, kv_len: u64) -> Vec<VideoDigits> {
        (0..=kv_len.div_ceil(bkv)).map(|j| self.digits((j * bkv).min(kv_len))).collect()
    }

    /// Intervals [`VideoMask::row_intervals`] would emit for box `r` before merging (an upper
    /// bound on its cost).
    fn runs(&self, r: &[(u64, u64); 3]) -> u64 {
        let [nf, nh, nw] = self.dims;
        let runs3 = |n: [u64; 3], r: [(u64, u64); 3]| {
            let full = |i: usize| r[i].0 == 0 && r[i].1 + 1 == n[i];
            if full(2) && full(1) {
                1
            } else if full(2) {
                span(r[0])
            } else {
                span(r[0]) * span(r[1])
            }
        };
        match self.order {
            VideoOrder::Frame => runs3([nf, nh, nw], [r[0], r[1], r[2]]),
            VideoOrder::Position => runs3([nh, nw, nf], [r[1], r[2], r[0]]),
            VideoOrder::Tiles { tile } => {
                // Per dimension: tiles the window touches, and how many it covers whole.
                let split = |i: usize| {
                    let t = tile[i];
                    let touched = r[i].1 / t - r[i].0 / t + 1;
                    let whole = ((r[i].1 + 1) / t).saturating_sub(r[i].0.div_ceil(t));
                    (touched, whole, touched - whole)
                };
                let (tf_n, _, _) = split(0);
                let (_, h_whole, h_part) = split(1);
                let (_, w_whole, w_part) = split(2);
                w_whole * (h_whole * tf_n + h_part * span(r[0])) + w_part * span(r[0]) * span(r[1])
            }
        }
    }

    /// Adds `mult` x the kept tokens of row `q` in each kv tile of `bkv` columns to `counts`
    /// (tiles clipped to `kv_len`), by [`VideoMask::rank_digits`] at each tile boundary the
    /// row's kept span crosses (`bounds` from [`VideoMask::tile_bounds`] for this `bkv` and
    /// `kv_len`). Returns false, adding nothing, when walking the row's intervals is cheaper
    /// (at most twice as many runs as tiles crossed); the caller then uses
    /// [`VideoMask::row_intervals`].
    pub fn add_tile_counts(&self, q: u64, kv_len: u64, bkv: u64, bounds: &[VideoDigits], mult: u64, counts: &mut [u64]) -> bool {
        if q >= self.tokens() || kv_len == 0 {
            return true;
        }
        let r = self.kept_box(self.coords(q));
        let first = self.token([r[0].0, r[1].0, r[2].0]);
        let last = self.token([r[0].1, r[1].1, r[2].1]) + 1;
        let end = last.min(kv_len);
        if first >= end {
            return true;
        }
        let (ja, jb) = ((first / bkv) as usize, ((end - 1) / bkv) as usize);
        if self.runs(&r) <= 2 * (jb - ja + 1) as u64 {
            return false;
        }
        let total = span(r[0]) * span(r[1]) * span(r[2]);
        let mut prev = 0;
        for j in ja..=jb {
            let cur = if j == jb && end == last { total } else { self.rank_digits(&r, &bounds[j + 1]) };
            counts[j] += mult * (cur - prev);
            prev = cur;
        }
        true
    }

    /// Appends a key such that rows with equal keys keep the same kv intervals: the kept box
    /// (6 numbers), or one marker for rows outside the volume.
    pub(crate) fn row_key(&self, q: u64, key: &mut Vec<u64>) {
        if q >= self.tokens() {
            key.push(u64::MAX);
        } else {
            for (lo, hi) in self.kept_box(self.coords(q)) {
                key.push(lo);
                key.push(hi);
            }
        }
    }

    /// Element-wise cost of computing the mask from iota positions, as [`MaskTerms`].
    ///
    /// Per dimension that needs a test (its window does not span the whole extent):
    /// coordinate extraction for q and for k (div / mod per digit of the token order: outermost
    /// digit 1 op, middle 2, innermost 1; in tile order tile digit + in-tile digit + a
    /// multiply-add; an STA window needs only tile coordinates, plus a 2-op clamp of the
    /// query's kernel centre), then a difference and an absolute value (2 arith) and one
    /// compare; the tested dimensions are and-ed together (tested - 1 combines). Dimensions
    /// whose window spans the whole extent are not tested, as a kernel would not.
    pub fn expression_terms(&self) -> MaskTerms {
        let mut t = MaskTerms::default();
        let mut tested = 0u32;
        for i in 0..3 {
            if self.spans(i) {
                continue;
            }
            tested += 1;
            let per_pos = match (self.window, self.order) {
                (VideoWindow::Tiles { tile, .. }, VideoOrder::Tiles { tile: ot }) if tile == ot => [1, 2, 2][i],
                (VideoWindow::Tiles { .. }, order) => coord_ops(order, i) + 1,
                (VideoWindow::Tokens(_), order) => coord_ops(order, i),
            };
            let clamp = if matches!(self.window, VideoWindow::Tiles { .. }) { 2 } else { 0 };
            t.arith += 2 * per_pos + 2 + clamp;
            t.compares += 1;
        }
        t.combines = tested.saturating_sub(1);
        t
    }
}

/// Size of the inclusive range `r`.
#[inline]
fn span(r: (u64, u64)) -> u64 {
    r.1 - r.0 + 1
}

/// Values of the inclusive range `r` below `d`.
#[inline]
fn below(r: (u64, u64), d: u64) -> u64 {
    d.clamp(r.0, r.1 + 1) - r.0
}

/// Points of the box `r` (inclusive digit ranges, outermost first) of a 3-digit mixed-radix
/// space whose index is below the index with digits `d`.
#[inline]
fn rank3(r: [(u64, u64); 3], d: [u64; 3]) -> u64 {
    let in0 = (r[0].0 <= d[0] && d[0] <= r[0].1) as u64;
    let in1 = (r[1].0 <= d[1] && d[1] <= r[1].1) as u64;
    below(r[0], d[0]) * span(r[1]) * span(r[2]) + in0 * (below(r[1], d[1]) * span(r[2]) + in1 * below(r[2], d[2]))
}

/// The digits of a token index in a video order, outermost first: (d0, d1, d2) for frame and
/// position order, (tile digits, in-tile digits) for tile order; `beyond` for indices at or
/// past the volume's end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VideoDigits {
    d: [u64; 6],
    beyond: bool,
}

/// Ops to extract coordinate `i` (0 frame, 1 row, 2 column) of a token under `order`.
fn coord_ops(order: VideoOrder, i: usize) -> u32 {
    match order {
        VideoOrder::Frame => [1, 2, 1][i],
        VideoOrder::Position => [1, 2, 1][(i + 2) % 3],
        // tile digit (1, 2, 2) + in-tile digit (2, 2, 1) + multiply-add (2)
        VideoOrder::Tiles { .. } => [5, 6, 5][i],
    }
}

/// Pushes [lo, hi) clipped to `kv_len`, merging with the last interval when adjacent.
#[inline]
fn push_merge(out: &mut Vec<(u64, u64)>, lo: u64, hi: u64, kv_len: u64) {
    let hi = hi.min(kv_len);
    if lo >= hi {
        return;
    }
    match out.last_mut() {
        Some(last) if last.1 == lo => last.1 = hi,
        _ => out.push((lo, hi)),
    }
}

/// Emits, in increasing order, tokens `base + (d0 x n1 + d1) x n2 + d2` for each digit
/// d_i in the inclusive range `r[i]` (digit sizes `n`, outermost first), one interval per
/// innermost run; runs spanning whole inner digits collapse into one interval.
fn emit_box(base: u64, n: [u64; 3], r: [(u64, u64); 3], kv_len: u64, out: &mut Vec<(u64, u64)>) {
    let s1 = n[2];
    let s0 = n[1] * n[2];
    let full2 = r[2].0 == 0 && r[2].1 + 1 == n[2];
    let full1 = r[1].0 == 0 && r[1].1 + 1 == n[1];
    if full2 && full1 {
        push_merge(out, base + r[0].0 * s0, base + (r[0].1 + 1) * s0, kv_len);
    } else if full2 {
        for d0 in r[0].0..=r[0].1 {
            let b = base + d0 * s0;
            if b >= kv_len {
                return;
            }
            push_merge(out, b + r[1].0 * s1, b + (r[1].1 + 1) * s1, kv_len);
        }
    } else {
        for d0 in r[0].0..=r[0].1 {
            for d1 in r[1].0..=r[1].1 {
                let b = base + d0 * s0 + d1 * s1;
                if b >= kv_len {
                    return;
                }
                push_merge(out, b + r[2].0, b + r[2].1 + 1, kv_len);
            }
        }
    }
}

fn triple(f: &mut fmt::Formatter<'_>, v: &[u64; 3]) -> fmt::Result {
    write!(f, "{},{},{}", v[0], v[1], v[2])
}

impl fmt::Display for VideoMask {
    /// `video:F,H,W:wf,wh,ww[@order]` or `sta:F,H,W:kf,kh,kw:tf,th,tw[@order]`; the order
    /// suffix is omitted when it is the default (frame-major for `video`, the window's own
    /// tiles for `sta`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.word())?;
        triple(f, &self.dims)?;
        let default_order = match self.window {
            VideoWindow::Tokens(w) => {
                write!(f, ":")?;
                triple(f, &w)?;
                VideoOrder::Frame
            }
            VideoWindow::Tiles { kernel, tile } => {
                write!(f, ":")?;
                triple(f, &kernel)?;
                write!(f, ":")?;
                triple(f, &tile)?;
                VideoOrder::Tiles { tile }
            }
        };
        if self.order != default_order {
            match self.order {
                VideoOrder::Frame => write!(f, "@frame")?,
                VideoOrder::Position => write!(f, "@position")?,
                VideoOrder::Tiles { tile } => {
                    write!(f, "@tiles:")?;
                    triple(f, &tile)?;
                }
            }
        }
        Ok(())
    }
}
