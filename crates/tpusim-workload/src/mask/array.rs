//! Masks given as arrays rather than formulas: a dense boolean mask (`[q, kv]` or
//! `[heads, q, kv]`, one byte per element, any non-zero byte kept) and a block map
//! (`[heads, q_blocks, kv_blocks]` with 0 empty, 1 partial, 2 full: the block classes of Splash's
//! `MaskInfo.block_mask`, optionally with the partial blocks' element masks).
//!
//! Dense arrays are never copied: the bytes stay where they are (a memory-mapped `.npy` file, a
//! decompressed spill file, or a caller's buffer such as a NumPy array) and are read row by row
//! when a tiling asks for its tile counts ([`ArrayMask::tile_counts`]); counts are cached per
//! (head, block_q, block_kv), so a second lowering at the same tiling reads nothing. A block map is
//! small (one byte per block) and is held in memory.
//!
//! Reading `.npy` / `.npz` files: [`crate::mask::npy`].

use super::{Mask, MaskError};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

/// Where the bytes of a dense mask live. Implemented for memory maps and owned buffers; a
/// front end may implement it for a buffer it keeps alive (the Python package does for NumPy
/// arrays).
pub trait ByteSource: Send + Sync + std::panic::RefUnwindSafe {
    /// The bytes (element (h, q, kv) of the array is at `offset + h*sh + q*sq + kv*sk`).
    fn bytes(&self) -> &[u8];
}

impl ByteSource for memmap2::Mmap {
    fn bytes(&self) -> &[u8] {
        self
    }
}

impl ByteSource for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

/// Per-tile kept counts of one head at one tiling, row-major `[q_tiles, kv_tiles]`.
type Counts = Arc<Vec<u64>>;

/// A dense boolean mask `[heads, q_len, kv_len]` over borrowed or mapped bytes, one byte per
/// element (NumPy `bool`, `uint8` or `int8`; any non-zero byte keeps the pair).
pub struct DenseArray {
    /// What the mask is called in text (`file:PATH` or a label for an in-memory array).
    pub name: String,
    /// Heads (1 for a 2-D array).
    pub heads: u64,
    /// Query length (rows).
    pub q_len: u64,
    /// Key/value length (columns).
    pub kv_len: u64,
    /// Byte offset of element (0, 0, 0).
    offset: usize,
    /// Byte strides of (head, q, kv); non-negative.
    strides: [usize; 3],
    data: Box<dyn ByteSource>,
    cache: Mutex<HashMap<(u64, u64, u64), Counts>>,
}

impl fmt::Debug for DenseArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DenseArray({}, {} x {} x {})", self.name, self.heads, self.q_len, self.kv_len)
    }
}

impl DenseArray {
    /// Wraps `data` as a dense mask of `[heads, q_len, kv_len]` elements with the given byte
    /// `offset` and byte `strides` (head, q, kv).
    ///
    /// # Errors
    /// [`MaskError::File`] naming `name` when a size is zero or above [`crate::MAX_DIM`], or the
    /// last element lies outside the bytes.
    pub fn new(name: &str, data: Box<dyn ByteSource>, offset: usize, shape: [u64; 3], strides: [usize; 3]) -> Result<Self, MaskError> {
        let err = |m: String| MaskError::File { path: name.to_string(), message: m };
        let [heads, q_len, kv_len] = shape;
        for (n, v) in [("heads", heads), ("q_len", q_len), ("kv_len", kv_len)] {
            if v == 0 || v > crate::MAX_DIM {
                return Err(err(format!("array {n} = {v}: expected a size from 1 to {}", crate::MAX_DIM)));
            }
        }
        let last = (heads - 1)
            .checked_mul(strides[0] as u64)
            .and_then(|a| (q_len - 1).checked_mul(strides[1] as u64).and_then(|b| a.checked_add(b)))
            .and_then(|a| (kv_len - 1).checked_mul(strides[2] as u64).and_then(|b| a.checked_add(b)))
            .and_then(|a| a.checked_add(offset as u64));
        let len = data.bytes().len() as u64;
        match last {
            Some(l) if l < len => {}
            _ => {
                return Err(err(format!(
                    "the array of {heads} x {q_len} x {kv_len} one-byte elements needs more than the {len} bytes the data holds (a truncated file?)"
                )))
            }
        }
        Ok(DenseArray { name: name.to_string(), heads, q_len, kv_len, offset, strides, data, cache: Mutex::new(HashMap::new()) })
    }

    /// Row `q` of head `h` as a byte slice when the kv stride is 1.
    fn row(&self, h: u64, q: u64) -> Option<&[u8]> {
        if self.strides[2] != 1 {
            return None;
        }
        let start = self.offset + h as usize * self.strides[0] + q as usize * self.strides[1];
        Some(&self.data.bytes()[start..start + self.kv_len as usize])
    }

    fn at(&self, h: u64, q: u64, k: u64) -> bool {
        let i = self.offset + h as usize * self.strides[0] + q as usize * self.strides[1] + k as usize * self.strides[2];
        self.data.bytes()[i] != 0
    }

    /// Kept intervals of row `q` of head `h` (sorted, disjoint, maximal) into `out`.
    fn row_intervals(&self, h: u64, q: u64, kv_len: u64, out: &mut Vec<(u64, u64)>) {
        let n = self.kv_len.min(kv_len);
        let mut start: Option<u64> = None;
        let mut push = |k: u64, kept: bool, out: &mut Vec<(u64, u64)>| match (kept, start) {
            (true, None) => start = Some(k),
            (false, Some(s)) => {
                out.push((s, k));
                start = None;
            }
            _ => {}
        };
        match self.row(h, q) {
            Some(row) => {
                for (k, &b) in row[..n as usize].iter().enumerate() {
                    push(k as u64, b != 0, out);
                }
            }
            None => {
                for k in 0..n {
                    push(k, self.at(h, q, k), out);
                }
            }
        }
        push(n, false, out);
    }

    /// Kept pairs per tile of head `h` at `block_q x block_kv` (row-major), computed by one pass
    /// over the head's rows and cached.
    fn counts(&self, h: u64, block_q: u64, block_kv: u64) -> Counts {
        let key = (h, block_q, block_kv);
        if let Some(c) = self.cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return c.clone();
        }
        let nq = self.q_len.div_ceil(block_q) as usize;
        let nk = self.kv_len.div_ceil(block_kv) as usize;
        let mut counts = vec![0u64; nq * nk];
        for q in 0..self.q_len {
            let base = (q / block_q) as usize * nk;
            match self.row(h, q) {
                Some(row) => {
                    for (kj, chunk) in row.chunks(block_kv as usize).enumerate() {
                        counts[base + kj] += count_nonzero(chunk);
                    }
                }
                None => {
                    for k in 0..self.kv_len {
                        if self.at(h, q, k) {
                            counts[base + (k / block_kv) as usize] += 1;
                        }
                    }
                }
            }
        }
        let c = Arc::new(counts);
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).insert(key, c.clone());
        c
    }
}

/// Number of non-zero bytes.
fn count_nonzero(s: &[u8]) -> u64 {
    // Written so that the compiler vectorises it (a byte compare and a widening add per lane).
    let mut n = 0u64;
    for c in s.chunks(255) {
        n += c.iter().map(|&b| (b != 0) as u8).fold(0u8, |a, b| a.wrapping_add(b)) as u64;
    }
    n
}

/// A block map `[heads, q_blocks, kv_blocks]` of block classes (0 empty, 1 partial, 2 full) at
/// its own `block_q x block_kv` tiling, optionally with the element masks of its partial blocks
/// (`partial_mask_blocks[index[h, i, j]]`, `[n, block_q, block_kv]`), as Splash's `MaskInfo`
/// holds them.
#[derive(Debug)]
pub struct BlockMap {
    /// What the mask is called in text (`file:PATH` or a label).
    pub name: String,
    /// Heads (1: every head uses it).
    pub heads: u64,
    /// Query length the map covers.
    pub q_len: u64,
    /// Key/value length the map covers.
    pub kv_len: u64,
    /// Rows per block.
    pub block_q: u64,
    /// Columns per block.
    pub block_kv: u64,
    /// Block classes, `[heads, q_blocks, kv_blocks]` row-major.
    classes: Vec<u8>,
    /// Element masks of the partial blocks, `[n, block_q, block_kv]` (non-zero = kept), and the
    /// index of each partial block's mask in it (`[heads, q_blocks, kv_blocks]`).
    partial: Option<(Vec<u8>, Vec<u32>)>,
}

impl BlockMap {
    /// Builds a block map; `classes` is `[heads, ceil(q_len / block_q), ceil(kv_len / block_kv)]`
    /// row-major; `partial` optionally holds the partial blocks' element masks
    /// (`[n, block_q, block_kv]`) and each block's index into them.
    ///
    /// # Errors
    /// [`MaskError::File`] naming `name` and the field: zero sizes, a class outside 0..=2, arrays
    /// of the wrong length, a partial block whose index is outside the element masks.
    pub fn new(
        name: &str,
        heads: u64,
        [q_len, kv_len]: [u64; 2],
        [block_q, block_kv]: [u64; 2],
        classes: Vec<u8>,
        partial: Option<(Vec<u8>, Vec<u32>)>,
    ) -> Result<Self, MaskError> {
        let err = |m: String| MaskError::File { path: name.to_string(), message: m };
        for (n, v) in [("q_len", q_len), ("kv_len", kv_len), ("block_q", block_q), ("block_kv", block_kv), ("heads", heads)] {
            if v == 0 || v > crate::MAX_DIM {
                return Err(err(format!("field '{n}' = {v}: expected a whole number from 1 to {}", crate::MAX_DIM)));
            }
        }
        let nq = q_len.div_ceil(block_q);
        let nk = kv_len.div_ceil(block_kv);
        let want = heads.checked_mul(nq).and_then(|x| x.checked_mul(nk)).unwrap_or(u64::MAX);
        if classes.len() as u64 != want {
            return Err(err(format!(
                "field 'block_mask' has {} entries; q_len {q_len} / block_q {block_q} and kv_len {kv_len} / block_kv {block_kv} need [heads, {nq}, {nk}] = {want}",
                classes.len()
            )));
        }
        if let Some(i) = classes.iter().position(|&c| c > 2) {
            return Err(err(format!("field 'block_mask' entry {i} = {}: expected 0 (empty), 1 (partial) or 2 (full)", classes[i])));
        }
        if let Some((masks, index)) = &partial {
            let per = (block_q * block_kv) as usize;
            if masks.len() % per != 0 {
                return Err(err(format!(
                    "field 'partial_mask_blocks' has {} elements: expected [n, block_q = {block_q}, block_kv = {block_kv}]",
                    masks.len()
                )));
            }
            let n = masks.len() / per;
            if index.len() != classes.len() {
                return Err(err(format!("field 'mask_next' has {} entries: expected the shape of 'block_mask' ({want})", index.len())));
            }
            for (i, (&c, &m)) in classes.iter().zip(index).enumerate() {
                if c == 1 && m as usize >= n {
                    return Err(err(format!(
                        "field 'mask_next' entry {i} = {m}: the block is partial but 'partial_mask_blocks' holds only {n} blocks"
                    )));
                }
            }
        }
        Ok(BlockMap { name: name.to_string(), heads, q_len, kv_len, block_q, block_kv, classes, partial })
    }

    fn nq(&self) -> u64 {
        self.q_len.div_ceil(self.block_q)
    }
    fn nk(&self) -> u64 {
        self.kv_len.div_ceil(self.block_kv)
    }

    /// Class of block (qi, kj) of head `h` (0 empty, 1 partial, 2 full).
    pub fn class(&self, h: u64, qi: u64, kj: u64) -> u8 {
        self.classes[((h * self.nq() + qi) * self.nk() + kj) as usize]
    }

    /// Whether the element masks of the partial blocks are known.
    pub fn has_element_masks(&self) -> bool {
        self.partial.is_some()
    }

    /// Whether some block is partial and its elements are unknown (kept counts are then
    /// estimates).
    pub fn has_unknown_partials(&self) -> bool {
        self.partial.is_none() && self.classes.contains(&1)
    }

    /// The element mask of partial block (qi, kj) of head `h`, `[block_q, block_kv]`.
    fn element_block(&self, h: u64, qi: u64, kj: u64) -> Option<&[u8]> {
        let (masks, index) = self.partial.as_ref()?;
        let per = (self.block_q * self.block_kv) as usize;
        let m = index[((h * self.nq() + qi) * self.nk() + kj) as usize] as usize;
        Some(&masks[m * per..(m + 1) * per])
    }

    /// Kept pairs of block (qi, kj) of head `h` within the lengths: exact for empty and full
    /// blocks and for partial blocks with element masks; half the block's real pairs (at least
    /// 1, at most all but 1) for a partial block without them.
    fn kept(&self, h: u64, qi: u64, kj: u64) -> u64 {
        let rows = self.q_len.saturating_sub(qi * self.block_q).min(self.block_q);
        let cols = self.kv_len.saturating_sub(kj * self.block_kv).min(self.block_kv);
        match self.class(h, qi, kj) {
            0 => 0,
            2 => rows * cols,
            _ => match self.element_block(h, qi, kj) {
                Some(b) => b.chunks(self.block_kv as usize).take(rows as usize).map(|r| count_nonzero(&r[..cols as usize])).sum(),
                None => (rows * cols / 2).clamp(1, (rows * cols).saturating_sub(1).max(1)),
            },
        }
    }

    fn row_intervals(&self, h: u64, q: u64, kv_len: u64, out: &mut Vec<(u64, u64)>) {
        if q >= self.q_len {
            return;
        }
        let qi = q / self.block_q;
        let r = (q % self.block_q) as usize;
        let n = self.kv_len.min(kv_len);
        let push = |lo: u64, hi: u64, out: &mut Vec<(u64, u64)>| {
            let hi = hi.min(n);
            if lo < hi {
                match out.last_mut() {
                    Some(last) if last.1 == lo => last.1 = hi,
                    _ => out.push((lo, hi)),
                }
            }
        };
        for kj in 0..self.nk() {
            let k0 = kj * self.block_kv;
            match self.class(h, qi, kj) {
                0 => {}
                2 => push(k0, k0 + self.block_kv, out),
                _ => match self.element_block(h, qi, kj) {
                    Some(b) => {
                        let row = &b[r * self.block_kv as usize..(r + 1) * self.block_kv as usize];
                        for (c, &x) in row.iter().enumerate() {
                            if x != 0 {
                                push(k0 + c as u64, k0 + c as u64 + 1, out);
                            }
                        }
                    }
                    // Unknown elements: the row view keeps the whole block (an upper bound).
                    None => push(k0, k0 + self.block_kv, out),
                },
            }
        }
    }
}

/// The data behind an [`ArrayMask`].
#[derive(Debug, Clone)]
pub enum ArraySource {
    /// A dense boolean mask.
    Dense(Arc<DenseArray>),
    /// A block map.
    Blocks(Arc<BlockMap>),
}

impl ArraySource {
    /// Heads the array holds.
    pub fn heads(&self) -> u64 {
        match self {
            ArraySource::Dense(d) => d.heads,
            ArraySource::Blocks(b) => b.heads,
        }
    }
    /// (q_len, kv_len) the array covers.
    pub fn lengths(&self) -> (u64, u64) {
        match self {
            ArraySource::Dense(d) => (d.q_len, d.kv_len),
            ArraySource::Blocks(b) => (b.q_len, b.kv_len),
        }
    }
    /// The array's name in mask text.
    pub fn name(&self) -> &str {
        match self {
            ArraySource::Dense(d) => &d.name,
            ArraySource::Blocks(b) => &b.name,
        }
    }
    fn same(&self, other: &ArraySource) -> bool {
        match (self, other) {
            (ArraySource::Dense(a), ArraySource::Dense(b)) => Arc::ptr_eq(a, b),
            (ArraySource::Blocks(a), ArraySource::Blocks(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

/// A mask held as an array ([`Mask::Array`]): all heads of the array (`head` = `None`, resolved
/// per head by [`crate::AttentionCall::mask_for_head`] through [`ArrayMask::view`]) or one head.
#[derive(Debug, Clone)]
pub struct ArrayMask {
    /// The data.
    pub source: ArraySource,
    /// The head this mask is (`None`: every head of the array; a one-head array is the same
    /// for every head).
    pub head: Option<u64>,
    /// One mask per head of a multi-head array (empty for one head or a view).
    views: Arc<Vec<Mask>>,
}

impl PartialEq for ArrayMask {
    fn eq(&self, other: &Self) -> bool {
        self.source.same(&other.source) && self.head == other.head
    }
}

impl fmt::Display for ArrayMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.head {
            None => write!(f, "{}", self.source.name()),
            Some(h) => write!(f, "{}#head={h}", self.source.name()),
        }
    }
}

impl ArrayMask {
    /// The whole array as a mask.
    pub fn new(source: ArraySource) -> Self {
        let heads = source.heads();
        let views = if heads > 1 {
            (0..heads).map(|h| Mask::Array(ArrayMask { source: source.clone(), head: Some(h), views: Arc::new(Vec::new()) })).collect()
        } else {
            Vec::new()
        };
        ArrayMask { source, head: None, views: Arc::new(views) }
    }

    /// The mask of array head `h` (the whole mask for a one-head array).
    pub fn view(&self, h: u64) -> Option<&Mask> {
        self.views.get(h as usize)
    }

    /// Heads of the array.
    pub fn heads(&self) -> u64 {
        self.source.heads()
    }

    /// The heads this mask stands for (one for a view or a one-head array).
    fn head_range(&self) -> std::ops::Range<u64> {
        match self.head {
            Some(h) => h..h + 1,
            None => 0..self.source.heads(),
        }
    }

    /// Kept intervals of row `q` (a multi-head array answers with the union of its heads).
    pub(crate) fn row_intervals(&self, q: u64, kv_len: u64, out: &mut Vec<(u64, u64)>) {
        out.clear();
        let mut tmp = Vec::new();
        for h in self.head_range() {
            tmp.clear();
            match &self.source {
                ArraySource::Dense(d) if q < d.q_len => d.row_intervals(h, q, kv_len, &mut tmp),
                ArraySource::Blocks(b) => b.row_intervals(h, q, kv_len, &mut tmp),
                _ => {}
            }
            out.extend_from_slice(&tmp);
        }
        if self.head_range().end - self.head_range().start > 1 {
            super::files::merge_in_place(out);
        }
    }

    /// Kept pairs per tile at `block_q x block_kv` (row-major `[q_tiles, kv_tiles]`) when the
    /// array answers them block by block: a dense array always (cached per tiling), a block map
    /// when the tiling is made of whole blocks of the map. `None` otherwise, and for a
    /// multi-head mask (resolve heads first).
    pub fn tile_counts(&self, block_q: u64, block_kv: u64) -> Option<Arc<Vec<u64>>> {
        let h = match self.head {
            Some(h) => h,
            None if self.source.heads() == 1 => 0,
            None => return None,
        };
        match &self.source {
            ArraySource::Dense(d) => Some(d.counts(h, block_q, block_kv)),
            ArraySource::Blocks(b) => {
                if !block_q.is_multiple_of(b.block_q) || !block_kv.is_multiple_of(b.block_kv) {
                    return None;
                }
                let (mq, mk) = (block_q / b.block_q, block_kv / b.block_kv);
                let nq = b.q_len.div_ceil(block_q);
                let nk = b.kv_len.div_ceil(block_kv);
                let mut counts = vec![0u64; (nq * nk) as usize];
                for qi in 0..b.nq() {
                    for kj in 0..b.nk() {
                        counts[((qi / mq) * nk + kj / mk) as usize] += b.kept(h, qi, kj);
                    }
                }
                Some(Arc::new(counts))
            }
        }
    }

    /// Checks that a kernel tiling of `block_q x block_kv` can be classified exactly: a block map
    /// without element masks needs tiles made of whole map blocks.
    ///
    /// # Errors
    /// [`MaskError::File`] naming the map's blocks and the tiling.
    pub fn check_tiling(&self, block_q: u64, block_kv: u64) -> Result<(), MaskError> {
        if let ArraySource::Blocks(b) = &self.source {
            if !b.has_element_masks() && (!block_q.is_multiple_of(b.block_q) || !block_kv.is_multiple_of(b.block_kv)) {
                return Err(MaskError::File {
                    path: b.name.trim_start_matches("file:").to_string(),
                    message: format!(
                        "a block map of {} x {} blocks without element masks ('partial_mask_blocks', 'mask_next') classifies only tilings made of whole blocks; block_q x block_kv = {block_q} x {block_kv} is not a multiple of it: give `block_q` a multiple of {} and `block_kv` a multiple of {} (or add the element masks to the file)",
                        b.block_q, b.block_kv, b.block_q, b.block_kv
                    ),
                });
            }
        }
        Ok(())
    }

    /// A note for reports when kept-pair counts are estimates (a block map without element
    /// masks).
    pub fn estimate_note(&self) -> Option<String> {
        match &self.source {
            ArraySource::Blocks(b) if b.has_unknown_partials() => Some(format!(
                "mask {}: a block map without element masks; its partial blocks count as half kept in pair densities (tile classes and timing are exact at tilings made of its {} x {} blocks)",
                b.name, b.block_q, b.block_kv
            )),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tiles::{for_each_tile_row, TileGrid, TileStats};

    /// A dense mask of `m` (one head) as bytes, in C order.
    fn dense_of(m: &Mask, q: u64, kv: u64) -> Mask {
        let mut bytes = vec![0u8; (q * kv) as usize];
        let mut iv = Vec::new();
        for r in 0..q {
            m.row_intervals(r, kv, &mut iv);
            for &(lo, hi) in &iv {
                bytes[(r * kv + lo) as usize..(r * kv + hi) as usize].fill(1);
            }
        }
        let d = DenseArray::new("test", Box::new(bytes), 0, [1, q, kv], [0, kv as usize, 1]).unwrap();
        Mask::Array(ArrayMask::new(ArraySource::Dense(Arc::new(d))))
    }

    #[test]
    fn dense_arrays_classify_like_the_formula_they_hold() {
        for text in ["causal", "band:37+sink:5", "local:50,3", "chunked:40", "full"] {
            let m = Mask::parse(text).unwrap();
            let d = dense_of(&m, 200, 230);
            for (bq, bkv) in [(8, 128), (64, 64), (32, 100)] {
                let g = TileGrid { q_len: 200, kv_len: 230, block_q: bq, block_kv: bkv };
                assert_eq!(TileStats::collect(&d, &g, false), TileStats::collect(&m, &g, false), "{text} at {bq}x{bkv}");
                assert_eq!(TileStats::collect(&d, &g, true), TileStats::collect(&m, &g, true), "{text} aligned at {bq}x{bkv}");
            }
            // Row view: the same intervals.
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for q in [0, 17, 199] {
                d.row_intervals(q, 230, &mut a);
                m.row_intervals(q, 230, &mut b);
                assert_eq!(a, b, "{text} row {q}");
            }
        }
    }

    /// A dense array smaller than the workload both ways (a block map saved as an `.npy`) is
    /// refused with where block maps go; a longer one only with the lengths.
    #[test]
    fn a_small_dense_array_says_block_maps_go_in_an_npz() {
        let m = dense_of(&Mask::parse("causal").unwrap(), 24, 50);
        let e = m.check_lengths(75_600, 75_600).unwrap_err().to_string();
        assert!(e.contains("24 x 50") && e.contains("block map") && e.contains(".npz with 'block_mask'"), "{e}");
        let e = m.check_lengths(20, 50).unwrap_err().to_string();
        assert!(e.contains("the file must match it") && !e.contains("block map"), "{e}");
        assert!(m.check_lengths(24, 50).is_ok());
    }

    #[test]
    fn strided_and_multi_head_arrays() {
        // Fortran order (strides (1, q)) and two heads.
        let (q, kv) = (40u64, 60u64);
        let heads = [Mask::Causal { offset: 0 }, Mask::parse("band:5").unwrap()];
        let mut bytes = vec![0u8; (2 * q * kv) as usize];
        let mut iv = Vec::new();
        for (h, m) in heads.iter().enumerate() {
            for r in 0..q {
                m.row_intervals(r, kv, &mut iv);
                for &(lo, hi) in &iv {
                    for k in lo..hi {
                        bytes[(h as u64 + 2 * r + 2 * q * k) as usize] = 1;
                    }
                }
            }
        }
        let d = DenseArray::new("f", Box::new(bytes), 0, [2, q, kv], [1, 2, 2 * q as usize]).unwrap();
        let a = ArrayMask::new(ArraySource::Dense(Arc::new(d)));
        let g = TileGrid { q_len: q, kv_len: kv, block_q: 8, block_kv: 16 };
        for (h, m) in heads.iter().enumerate() {
            let view = a.view(h as u64).unwrap();
            assert_eq!(TileStats::collect(view, &g, false), TileStats::collect(m, &g, false));
        }
        // Too few bytes for the shape: an error, not a panic.
        assert!(DenseArray::new("short", Box::new(vec![0u8; 10]), 0, [1, 4, 4], [0, 4, 1]).is_err());
    }

    #[test]
    fn block_maps_classify_tiles_of_whole_blocks_exactly() {
        // 4 x 4 map of 16 x 16 blocks: classes per row.
        let classes: Vec<u8> = vec![2, 0, 0, 0, 1, 2, 0, 0, 0, 1, 1, 0, 0, 0, 2, 2];
        let map = BlockMap::new("m", 1, [64, 64], [16, 16], classes.clone(), None).unwrap();
        let m = Mask::Array(ArrayMask::new(ArraySource::Blocks(Arc::new(map))));
        let g = TileGrid { q_len: 64, kv_len: 64, block_q: 32, block_kv: 32 };
        let mut kinds = Vec::new();
        for_each_tile_row(&m, &g, false, |_, row| kinds.extend(row.iter().map(|t| t.kind)));
        use crate::tiles::TileKind::*;
        // Tile (0,0) holds classes 2,0,1,2 -> partial; (0,1) all empty; (1,0) 0,1,0,0 -> partial;
        // (1,1) 1,0,2,2 -> partial.
        assert_eq!(kinds, vec![Partial, Empty, Partial, Partial]);
        assert!(m.check_tiling(32, 32).is_ok());
        let e = m.check_tiling(24, 32).unwrap_err().to_string();
        // The way forward: the multiples the tiling needs.
        assert!(e.contains("give `block_q` a multiple of 16 and `block_kv` a multiple of 16"), "{e}");
        assert_eq!(m.notes().len(), 1);
        // Unknown partials cannot join an expression.
        assert!(Mask::Union(vec![Mask::Causal { offset: 0 }, m.clone()]).validate().is_err());
        // Wrong class values and lengths are errors naming the field.
        let e = BlockMap::new("m", 1, [64, 64], [16, 16], vec![3; 16], None).unwrap_err().to_string();
        assert!(e.contains("block_mask") && e.contains("expected 0 (empty)"), "{e}");
        assert!(BlockMap::new("m", 1, [64, 64], [16, 16], vec![0; 15], None).is_err());
    }

    #[test]
    fn block_maps_with_element_masks_are_exact_at_any_tiling() {
        let truth = Mask::parse("band:9+sink:3").unwrap();
        let (n, b) = (48u64, 16u64);
        let nb = n / b;
        let mut classes = Vec::new();
        let (mut masks, mut index) = (Vec::new(), Vec::new());
        let mut iv = Vec::new();
        for qi in 0..nb {
            for kj in 0..nb {
                let mut block = vec![0u8; (b * b) as usize];
                for r in 0..b {
                    truth.row_intervals(qi * b + r, n, &mut iv);
                    for &(lo, hi) in &iv {
                        for k in lo.max(kj * b)..hi.min((kj + 1) * b) {
                            block[(r * b + k - kj * b) as usize] = 1;
                        }
                    }
                }
                let kept = block.iter().filter(|&&x| x != 0).count() as u64;
                let c = if kept == 0 {
                    0
                } else if kept == b * b {
                    2
                } else {
                    1
                };
                classes.push(c);
                index.push((masks.len() as u64 / (b * b)) as u32);
                if c == 1 {
                    masks.extend(block);
                }
            }
        }
        let map = BlockMap::new("m", 1, [n, n], [b, b], classes, Some((masks, index))).unwrap();
        let m = Mask::Array(ArrayMask::new(ArraySource::Blocks(Arc::new(map))));
        for (bq, bkv) in [(16, 16), (8, 24), (48, 32)] {
            let g = TileGrid { q_len: n, kv_len: n, block_q: bq, block_kv: bkv };
            assert_eq!(TileStats::collect(&m, &g, false), TileStats::collect(&truth, &g, false), "{bq}x{bkv}");
        }
        assert!(m.notes().is_empty());
    }
}
