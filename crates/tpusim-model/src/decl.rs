//! One declaration per `pallas_call`: the grid, which of its leading dimensions are parallel,
//! and the refs in the call's order, each with its role, block shape, element type, memory
//! space, pipeline buffer count and block index map. Both front ends build one: the importer
//! (crate `tpusim-pallas`) from a kernel description, each hand-written kernel family (crate
//! `tpusim-kernel`) once per lowering. Everything the pipeline around a step body needs is
//! derived from it, by one rule each:
//!
//! * **VMEM** ([`KernelDecl::buffers`], counted by [`crate::vmem::footprint`]): every VMEM
//!   window times its buffer count, every VMEM scratch operand once, and the largest value of
//!   the body once ([`KernelDecl::internal`]);
//! * **ref indices**: a ref's index is its position in [`KernelDecl::refs`] (the order of the
//!   `pallas_call`'s operands: scalar-prefetch tables, inputs, outputs, scratch), which the
//!   bodies' loads and stores name;
//! * **carried refs** ([`KernelDecl::carried`]): the refs whose values a step leaves for the
//!   next (loaded and stored by the body);
//! * **copies** ([`crate::copies`]): Pallas's pipeline rule over the windows.

use crate::dtype::Dtype;
use crate::expr::Expr;
use crate::vmem::{Role, VmemBuffer};
use serde::Serialize;

/// What an operand of a `pallas_call` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RefRole {
    /// A scalar-prefetch table in SMEM (index maps and the body read it).
    Prefetch,
    /// A window (BlockSpec) of an input array, or an input left in HBM.
    Input,
    /// A window of an output array, or an output left in HBM.
    Output,
    /// Scratch the kernel keeps across grid steps (`scratch_shapes`).
    Scratch,
}

/// Where a ref lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Space {
    /// Vector memory: a window's blocks are copied here by the pipeline.
    Vmem,
    /// Scalar memory.
    Smem,
    /// Left in HBM (`pl.ANY`): no window; the kernel copies from it itself.
    Any,
    /// DMA or barrier semaphores.
    Semaphore,
}

/// One operand of a `pallas_call`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RefDecl {
    /// A name for reports and messages (`q`, `arg3`, `scratch 0`).
    pub name: String,
    /// Prefetch table, input, output or scratch.
    pub role: RefRole,
    /// The block shape, elements per dimension (a squeezed `None` dimension as 1); the whole
    /// shape for a scratch operand, a prefetch table or a ref left in HBM.
    pub block: Vec<u64>,
    /// Element type as VMEM holds it.
    pub dtype: Dtype,
    /// Bytes of one element in HBM (the array's own type: 1 for 8-bit data, 2 for bf16, ...).
    pub elem_bytes: u64,
    /// Memory space.
    pub space: Space,
    /// Buffers a window keeps in VMEM (2: double-buffered, Pallas's default; 1:
    /// `pl.Buffered(1)`; n: `pl.Buffered(n)`); 1 for scratch; 0 for prefetch tables and refs
    /// left in HBM.
    pub buffers: u32,
    /// The whole array in HBM a window's blocks are cut from (`None`: not known, taken as
    /// divided by its blocks).
    pub array: Option<Vec<u64>>,
    /// The block index per dimension as expressions over the grid indices and prefetch values
    /// (block units: element offset = index x block). The importer reads it from the IR; a hand
    /// kernel declares its maps for reports, and its step generator supplies the indices.
    pub index_map: Option<Vec<Expr>>,
    /// Whether the body both loads and stores it, so that a step's value is the next step's
    /// input (an accumulator: a scratch operand or an output block accumulated in place).
    pub carried: bool,
}

impl RefDecl {
    /// A double-buffered VMEM window of an input (`index_map`: the block index per dimension).
    pub fn input(name: &str, block: &[u64], dtype: Dtype, index_map: Vec<Expr>) -> Self {
        RefDecl {
            name: name.into(),
            role: RefRole::Input,
            block: block.to_vec(),
            dtype,
            elem_bytes: dtype.bytes(),
            space: Space::Vmem,
            buffers: 2,
            array: None,
            index_map: Some(index_map),
            carried: false,
        }
    }

    /// A double-buffered VMEM window of an output, carried (the body's `ref[...] = x` reads
    /// the block before it writes it).
    pub fn output(name: &str, block: &[u64], dtype: Dtype, index_map: Vec<Expr>) -> Self {
        RefDecl { role: RefRole::Output, carried: true, ..RefDecl::input(name, block, dtype, index_map) }
    }

    /// A VMEM scratch operand, carried.
    pub fn scratch(name: &str, shape: &[u64], dtype: Dtype) -> Self {
        RefDecl { role: RefRole::Scratch, buffers: 1, index_map: None, carried: true, ..RefDecl::input(name, shape, dtype, Vec::new()) }
    }

    /// A scalar-prefetch table in SMEM of `shape` (int32).
    pub fn prefetch(name: &str, shape: &[u64]) -> Self {
        RefDecl {
            role: RefRole::Prefetch,
            space: Space::Smem,
            buffers: 0,
            index_map: None,
            ..RefDecl::input(name, shape, Dtype::I32, Vec::new())
        }
    }

    /// The same ref with `n` pipeline buffers (`pl.Buffered(n)`).
    pub fn buffered(self, n: u32) -> Self {
        RefDecl { buffers: n, ..self }
    }

    /// The same window cut from an array of `shape` (its edge blocks copy only what is inside).
    pub fn of_array(self, shape: &[u64]) -> Self {
        RefDecl { array: Some(shape.to_vec()), ..self }
    }

    /// Whether the pipeline copies its blocks (an input or output window in VMEM or SMEM).
    pub fn is_window(&self) -> bool {
        matches!(self.role, RefRole::Input | RefRole::Output) && matches!(self.space, Space::Vmem | Space::Smem) && self.index_map.is_some()
    }

    /// Bytes of one block in HBM: the block's elements at the array's element size.
    pub fn block_bytes(&self) -> u64 {
        self.block.iter().product::<u64>().saturating_mul(self.elem_bytes)
    }
}

/// The declaration of one `pallas_call` (module docs).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct KernelDecl {
    /// The grid, iterations per dimension (run in lexicographic order).
    pub grid: Vec<u64>,
    /// How many leading grid dimensions are parallel: their iterations are the units a
    /// megacore device splits over its TensorCores.
    pub parallel_dims: usize,
    /// The operands in the call's order (a ref's index is its position).
    pub refs: Vec<RefDecl>,
    /// The body's values Mosaic materialises in VMEM (its internal scratch): only the largest
    /// counts, once ([`crate::vmem`]). The importer gives the largest value its bodies build; a
    /// hand kernel the values its body makes (the score tile and its kin).
    pub internal: Vec<VmemBuffer>,
}

impl KernelDecl {
    /// Grid steps (the product of the grid).
    pub fn grid_steps(&self) -> u64 {
        self.grid.iter().product()
    }

    /// The parallel units of the grid (the product of its leading parallel dimensions; 1 when
    /// none is).
    pub fn parallel_units(&self) -> u64 {
        self.grid[..self.parallel_dims.min(self.grid.len())].iter().product::<u64>().max(1)
    }

    /// The VMEM buffers of the call, in its order: each VMEM window with its buffer count,
    /// each VMEM scratch operand once, then the body's internal values.
    pub fn buffers(&self) -> Vec<VmemBuffer> {
        let mut out: Vec<VmemBuffer> = self
            .refs
            .iter()
            .filter(|r| r.space == Space::Vmem && r.buffers > 0)
            .filter_map(|r| {
                let role = match r.role {
                    RefRole::Input | RefRole::Output => Role::Window { buffers: r.buffers },
                    RefRole::Scratch => Role::Scratch,
                    RefRole::Prefetch => return None,
                };
                Some(VmemBuffer { name: r.name.clone(), shape: r.block.clone(), dtype: r.dtype, role })
            })
            .collect();
        out.extend(self.internal.iter().cloned());
        out
    }

    /// VMEM the call needs ([`KernelDecl::buffers`] counted by [`crate::vmem::footprint`])
    /// against a scoped limit of `limit_bytes`.
    pub fn vmem(&self, limit_bytes: u64) -> crate::VmemBudget {
        crate::vmem::footprint(&self.buffers(), limit_bytes)
    }

    /// Per ref index: whether it is carried from step to step.
    pub fn carried(&self) -> Vec<bool> {
        self.refs.iter().map(|r| r.carried).collect()
    }

    /// The index of the ref named `name` (hand kernels name their refs once).
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.refs.iter().position(|r| r.name == name)
    }
}
