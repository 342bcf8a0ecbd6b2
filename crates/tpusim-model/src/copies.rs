//! Pallas's pipeline rule: which copies run around each grid step, derived from a
//! [`KernelDecl`] by one rule for both front ends (jax-ml/jax `docs/pallas/tpu/pipelining.md`;
//! `jax/_src/pallas/mosaic/pipeline.py`):
//!
//! * an **input** window's block is copied HBM -> VMEM before a step when its block index
//!   differs from the previous step's (the first step copies every input window);
//! * an **output** window's block is written back VMEM -> HBM after a step when the next step's
//!   block index differs (or the step is the grid's last);
//! * a copy moves the block's bytes, except at the edge of an array its blocks do not divide,
//!   where it moves only the part inside the array (Pallas clamps the DMA to the array's
//!   bounds), in whole (rows, 128) tiles, never more than the block;
//! * each copy is one DMA.
//!
//! **The padding rule** (one rule for every figure). *On chip*, data lives in (rows, 128) tiles:
//! a VMEM buffer has its last dimension padded to 128 lanes and its second-to-last to its tile
//! height ([`crate::vmem`]; documented, jax-ml/jax `infer_memref_layout.cc`), a register value
//! likewise, and the MXU executes a matmul at those padded dimensions
//! ([`crate::Work::executed_flops`]): a head_dim of 7 or 64 costs VMEM and MXU time as 128.
//! *In HBM* the layout is XLA's choice; tpusim **assumes** a copy moves the block's own
//! elements, a narrow last dimension unpadded (a head_dim of 64 moves 64 lanes per row; the DMA
//! writes them into padded VMEM tiles), rounded to whole tiles only where a block is cut at the
//! array's edge. Evidence for the assumption: the public head_dim-64 rows that can tell
//! (tokamax's autotuned attention rows, `traces/measured/VALIDATION.md`) ran layouts in which
//! head_dim is the second-minor dimension and nothing pads; padding their HBM copies to 128
//! lanes moved TK-v6e-225 from +14% to +21%. [`Copy::bytes`] is what a copy moves,
//! [`Copy::useful_bytes`] the elements inside the array (they differ at edges).
//!
//! A step stream names each step's copies by a [`CopySet`] id: the distinct sets of a program
//! are kept once ([`CopySets`]), so a step stays a few words and the engine reads the set's
//! totals without walking its list.

use crate::decl::{KernelDecl, RefRole};
use crate::dtype::Dtype;
use serde::Serialize;

/// Which way a copy goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// HBM -> VMEM before the step (an input window).
    In,
    /// VMEM -> HBM after the step (an output window's write-back).
    Out,
}

/// One copy the pipeline makes around a step.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Copy {
    /// The ref (its index in the declaration).
    pub r: u32,
    /// In before the step, or out after it.
    pub dir: Direction,
    /// Bytes moved: the region, in whole tiles where the block is cut at the array's edge
    /// (module docs, the padding rule).
    pub bytes: u64,
    /// The bytes of the elements inside the array (no edge rounding).
    pub useful_bytes: u64,
    /// DMAs issued for it.
    pub dmas: u32,
    /// The region copied, elements per dimension (the block, or its part inside the array at
    /// an edge).
    pub shape: Vec<u64>,
    /// Buffers of its window (the pipeline's lookahead is `buffers - 1` steps).
    pub buffers: u32,
}

/// The copies around one step, with their totals.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize)]
pub struct CopySet {
    /// The copies, inputs first, each in declaration order.
    pub copies: Vec<Copy>,
    /// Bytes copied in before the step.
    pub in_bytes: u64,
    /// Bytes written back after the step.
    pub out_bytes: u64,
    /// DMAs of the copies in.
    pub in_dmas: u32,
    /// DMAs of the write-backs.
    pub out_dmas: u32,
    /// The copies' own bytes, in and out, padding left out ([`Copy::useful_bytes`]).
    pub useful_bytes: u64,
    /// Of `in_bytes`, the copies into windows of one buffer (`pl.Buffered(1)`, Mosaic's
    /// `synchronous` pipeline mode): each fills the buffer the step before reads, so it can start
    /// only once that step's body is done (the engine's rule; double and deeper buffers are
    /// prefetched while the step before runs).
    #[serde(skip_serializing_if = "is_zero")]
    pub in_bytes_sync: u64,
    /// DMAs of those copies (of `in_dmas`).
    #[serde(skip_serializing_if = "is_zero")]
    pub in_dmas_sync: u32,
}

fn is_zero<T: Default + PartialEq>(x: &T) -> bool {
    *x == T::default()
}

impl CopySet {
    /// The set of `copies`, with their totals.
    pub fn new(copies: Vec<Copy>) -> Self {
        let mut s = CopySet { copies, ..CopySet::default() };
        for c in &s.copies {
            s.useful_bytes += c.useful_bytes;
            match c.dir {
                Direction::In => {
                    s.in_bytes += c.bytes;
                    s.in_dmas += c.dmas;
                    if c.buffers == 1 {
                        s.in_bytes_sync += c.bytes;
                        s.in_dmas_sync += c.dmas;
                    }
                }
                Direction::Out => {
                    s.out_bytes += c.bytes;
                    s.out_dmas += c.dmas;
                }
            }
        }
        s
    }
}

/// The distinct copy sets of a program; a step names one by its index. Index 0 is the empty
/// set (a step that copies nothing).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CopySets {
    sets: Vec<CopySet>,
    /// Set -> id. Fx-hashed (no random state), so that equal programs print equal (`Debug`:
    /// the sweep's test that lowering does not read timing parameters compares programs so).
    #[serde(skip)]
    index: rustc_hash::FxHashMap<CopySet, u32>,
}

impl Default for CopySets {
    fn default() -> Self {
        let mut s = CopySets { sets: Vec::new(), index: Default::default() };
        s.intern(CopySet::default());
        s
    }
}

impl CopySets {
    /// The id of `set`, added if new.
    pub fn intern(&mut self, set: CopySet) -> u32 {
        if let Some(&i) = self.index.get(&set) {
            return i;
        }
        let i = self.sets.len() as u32;
        self.index.insert(set.clone(), i);
        self.sets.push(set);
        i
    }

    /// The set of id `i` (the empty set for an id not interned).
    pub fn get(&self, i: u32) -> &CopySet {
        self.sets.get(i as usize).unwrap_or(&self.sets[0])
    }

    /// Distinct sets.
    pub fn len(&self) -> usize {
        self.sets.len()
    }

    /// Whether only the empty set is kept.
    pub fn is_empty(&self) -> bool {
        self.sets.len() <= 1
    }
}

/// The pipeline rule over one declaration's windows (module docs).
#[derive(Debug, Clone)]
pub struct CopyRule {
    /// The windows: (ref index, role, block, array shape when its blocks do not divide it,
    /// element bytes, HBM tiling, buffers).
    windows: Vec<Window>,
}

#[derive(Debug, Clone)]
struct Window {
    r: u32,
    out: bool,
    block: Vec<u64>,
    edge: Option<Vec<u64>>,
    elem_bytes: u64,
    tile_rows: u64,
    buffers: u32,
}

impl CopyRule {
    /// The rule for `decl`'s windows (its inputs and outputs with a block index map, in VMEM
    /// or SMEM), in declaration order.
    pub fn new(decl: &KernelDecl) -> Self {
        let windows = decl
            .refs
            .iter()
            .enumerate()
            .filter(|(_, r)| r.is_window())
            .map(|(i, r)| {
                let edge = r
                    .array
                    .as_ref()
                    .filter(|a| a.len() == r.block.len() && a.iter().zip(&r.block).any(|(&x, &b)| b > 0 && x % b != 0))
                    .cloned();
                Window {
                    r: i as u32,
                    out: r.role == RefRole::Output,
                    block: r.block.clone(),
                    edge,
                    elem_bytes: r.elem_bytes,
                    tile_rows: Dtype::of_bytes(r.elem_bytes).unwrap_or(Dtype::F32).tile_rows(),
                    buffers: r.buffers,
                }
            })
            .collect();
        CopyRule { windows }
    }

    /// The windows' ref indices, in declaration order (the order of [`CopyRule::copies`]'s
    /// `changed` and `at` arguments).
    pub fn windows(&self) -> impl Iterator<Item = usize> + '_ {
        self.windows.iter().map(|w| w.r as usize)
    }

    /// How many windows there are.
    pub fn len(&self) -> usize {
        self.windows.len()
    }

    /// Whether the declaration has no window.
    pub fn is_empty(&self) -> bool {
        self.windows.is_empty()
    }

    /// Whether window `w` (its position among [`CopyRule::windows`]) is an output.
    pub fn is_output(&self, w: usize) -> bool {
        self.windows[w].out
    }

    /// Whether window `w`'s blocks may be cut at the array's edge (so its copies depend on
    /// the block index, not only on whether it changes).
    pub fn has_edge(&self, w: usize) -> bool {
        self.windows[w].edge.is_some()
    }

    /// The copy of window `w`'s block at block indices `at` (`None`: the whole block).
    pub fn copy(&self, w: usize, at: Option<&[i64]>) -> Copy {
        let win = &self.windows[w];
        // At an edge: the part inside the array per dimension, and that part in whole tiles.
        let (shape, inside): (Vec<u64>, u64) = match (&win.edge, at) {
            (Some(a), Some(at)) => {
                let n = win.block.len();
                let mut inside = 1u64;
                let shape = win
                    .block
                    .iter()
                    .zip(a)
                    .zip(at)
                    .enumerate()
                    .map(|(k, ((&b, &x), &i))| {
                        let tile = match n - k {
                            1 => crate::vmem::LANES,
                            2 => win.tile_rows,
                            _ => 1,
                        };
                        let part = b.min(x.saturating_sub(i.max(0) as u64 * b));
                        inside = inside.saturating_mul(part);
                        b.min(part.next_multiple_of(tile))
                    })
                    .collect();
                (shape, inside)
            }
            _ => (win.block.clone(), win.block.iter().product()),
        };
        let bytes = shape.iter().product::<u64>().saturating_mul(win.elem_bytes);
        let useful_bytes = inside.saturating_mul(win.elem_bytes);
        Copy { r: win.r, dir: if win.out { Direction::Out } else { Direction::In }, bytes, useful_bytes, dmas: 1, shape, buffers: win.buffers }
    }

    /// The copies of one step (module docs): `changed(w)` says whether window `w`'s block index
    /// differs from the previous step's (an input is copied in) or from the next step's (an
    /// output is written back); `at(w)` gives its block indices at this step when it has an
    /// edge ([`CopyRule::has_edge`]; `None`: the whole block).
    pub fn copies<'a>(&self, changed: impl Fn(usize) -> bool, at: impl Fn(usize) -> Option<&'a [i64]>) -> CopySet {
        let mut list = Vec::new();
        for out in [false, true] {
            for (w, win) in self.windows.iter().enumerate() {
                if win.out == out && changed(w) {
                    list.push(self.copy(w, if win.edge.is_some() { at(w) } else { None }));
                }
            }
        }
        CopySet::new(list)
    }
}
