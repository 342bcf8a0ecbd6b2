//! A blocked Pallas matmul (the kernel of the Pallas TPU matmul tutorial) lowered to grid steps.
//!
//! Grid (M / block_m, N / block_n, K / block_k), k innermost. Each step multiplies an x block
//! (block_m x block_k) by a y block (block_k x block_n) on the MXU, pops the f32 result and adds
//! it into a VMEM accumulator (2 VPU ops per (8,128) register); the first k step zeroes the accumulator, the
//! last casts it to bf16 and the output block is written back. Per [`tpusim_model::SLAB_ROWS`]-row slab of x:
//! `mm` (MXU) then `acc` (VPU), so the two units overlap across slabs. Sizes that are not a
//! multiple of their block are padded up.

use crate::ir::{ClassKey, Step, StepBody, StepClass};
use crate::{Kernel, KernelError, Program, ProgramInfo, VmemBudget};
use tpusim_model::copies::{CopyRule, CopySets};
use tpusim_model::decl::{KernelDecl, RefDecl};
use serde::Serialize;
use tpusim_chip::ChipModel;
use tpusim_workload::MatmulCall;

/// Block sizes of the blocked matmul.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MatmulConfig {
    /// The kernel family (the Pallas tutorial's matmul, or XLA's dot modelled as one).
    pub kernel: Kernel,
    /// Rows of x and of the output per block.
    pub block_m: u64,
    /// Columns of y and of the output per block.
    pub block_n: u64,
    /// Contraction per block.
    pub block_k: u64,
    /// Scoped VMEM limit in bytes; `None` uses the chip's default.
    pub vmem_limit_bytes: Option<u64>,
}

impl MatmulConfig {
    /// A family's default blocks ([`Kernel::defaults`]) clamped to the sizes (rounded up to 8
    /// rows / 128 columns).
    pub fn for_family(kernel: Kernel, mm: &MatmulCall) -> Self {
        let d = kernel.defaults().blocks;
        MatmulConfig {
            kernel,
            block_m: mm.m.next_multiple_of(8).min(d.q),
            block_n: mm.n.next_multiple_of(128).min(d.kv),
            block_k: mm.k.next_multiple_of(128).min(d.compute.unwrap_or(d.kv)),
            vmem_limit_bytes: None,
        }
    }

    /// Given blocks of the Pallas matmul.
    pub fn blocks(block_m: u64, block_n: u64, block_k: u64) -> Self {
        MatmulConfig { kernel: Kernel::PallasMatmul, block_m, block_n, block_k, vmem_limit_bytes: None }
    }
}

/// The matmul's step stream: runs per output block (the grid's two parallel dimensions).
#[derive(Debug, Clone)]
pub(crate) struct Steps {
    nm: u64,
    nn: u64,
    nk: u64,
    class_of: [[u32; 2]; 2],
    /// The copy-set id of a step by [`copy_key`].
    copies: Vec<u32>,
}

/// A step's copies as a key into [`Steps::copies`]: x and y copied in (their block index
/// changed), o written back, and which of the step's m, n and k blocks is the last (an edge
/// block, when the dimension is not a multiple of its block).
fn copy_key(x: bool, y: bool, o: bool, last: [bool; 3]) -> usize {
    usize::from(x) | usize::from(y) << 1 | usize::from(o) << 2 | usize::from(last[0]) << 3 | usize::from(last[1]) << 4 | usize::from(last[2]) << 5
}

impl Steps {
    /// The copy-set id of step (i, j, k) with x and y copied or not.
    fn copies(&self, (i, j, k): (u64, u64, u64), x: bool, y: bool) -> u32 {
        let o = k + 1 == self.nk;
        self.copies[copy_key(x, y, o, [i + 1 == self.nm, j + 1 == self.nn, k + 1 == self.nk])]
    }

    /// Every grid step in order, each with its copies (x and y copied when their block index
    /// changes from the previous step's).
    fn for_each(&self, f: &mut dyn FnMut(&Step)) {
        let mut last_x = None;
        let mut last_y = None;
        for i in 0..self.nm {
            for j in 0..self.nn {
                for k in 0..self.nk {
                    let x = last_x != Some((i, k));
                    let y = last_y != Some((k, j));
                    (last_x, last_y) = (Some((i, k)), Some((k, j)));
                    let last = k + 1 == self.nk;
                    f(&Step {
                        class: self.class_of[usize::from(k == 0)][usize::from(last)],
                        copies: self.copies((i, j, k), x, y),
                        coords: [0, i as u32, j as u32, k as u32],
                    });
                }
            }
        }
    }
}

impl tpusim_model::StepStream for Steps {
    /// Runs of the output blocks `lo..hi` (flattened (m block, n block)): within an output
    /// block, the k steps between the first and the last differ only in their coordinates (x
    /// and y blocks change every step).
    fn for_each_run_range(&self, lo: u64, hi: u64, f: &mut dyn FnMut(&Step, u64)) {
        if self.nk < 3 {
            let mut idx = 0u64;
            let per = self.nk;
            return self.for_each(&mut |s| {
                let unit = idx / per;
                idx += 1;
                if unit >= lo && unit < hi {
                    f(s, 1)
                }
            });
        }
        for u in lo..hi.min(self.nm * self.nn) {
            let (i, j) = (u / self.nn, u % self.nn);
            let at = |k: u64| [0, i as u32, j as u32, k as u32];
            // x (i, k) always differs from the previous step's x; y (k, j) too (nk >= 3).
            f(&Step { class: self.class_of[1][0], copies: self.copies((i, j, 0), true, true), coords: at(0) }, 1);
            f(&Step { class: self.class_of[0][0], copies: self.copies((i, j, 1), true, true), coords: at(1) }, self.nk - 2);
            f(&Step { class: self.class_of[0][1], copies: self.copies((i, j, self.nk - 1), true, true), coords: at(self.nk - 1) }, 1);
        }
    }
}

/// One grid step of the Pallas TPU matmul tutorial's kernel as its Mosaic IR has it (JAX 0.10.2),
/// through the one body builder ([`crate::body`]): at the first k step the f32 accumulator is
/// zeroed, every step adds `x @ y` to it, the last k step writes it out as bf16. Refs: x, y, z
/// (the output) and the accumulator (scratch); the accumulator and z are read before they are
/// written (`ref[...] = v`), so both are carried.
fn body(decl: &KernelDecl, (bm, bn, bk): (u64, u64, u64), first: bool, last: bool) -> StepBody {
    use crate::body::Emitter;
    let r = |name: &str| decl.index_of(name).expect("declared");
    let (x, y, z, acc) = (r("x"), r("y"), r("o"), r("acc"));
    let mut e = Emitter::new(decl.carried());
    let tile = [bm, bn];
    if first {
        let zero = e.splat(&tile, "f32");
        let old = e.load(acc, &tile, "f32");
        e.shape_cast(&old, &tile);
        let zero = e.shape_cast(&zero, &tile);
        e.store(&zero, acc);
    }
    let a = e.load(acc, &tile, "f32");
    let xv = e.load(x, &[bm, bk], "bf16");
    let yv = e.load(y, &[bk, bn], "bf16");
    let c = e.constant(&tile, "f32");
    let prod = e.matmul(&xv, &yv, &c, [bm, bk, bn]);
    let sum = e.same("arith.addf", &[&a, &prod]);
    let old = e.load(acc, &tile, "f32");
    e.shape_cast(&old, &tile);
    let sum = e.shape_cast(&sum, &tile);
    e.store(&sum, acc);
    if last {
        let a = e.load(acc, &tile, "f32");
        let out = e.ew("arith.truncf", &[&a], "bf16");
        e.load(z, &tile, "bf16");
        e.store(&out, z);
    }
    e.finish().body
}

/// The kernel's `pallas_call` (the tutorial's, as its Mosaic IR has it): grid (m blocks, n
/// blocks, k blocks), the first two parallel; x (block_m x block_k), y (block_k x block_n) and the
/// output (block_m x block_n) bf16 windows, double-buffered; an f32 accumulator in scratch; the
/// step's f32 product in the body.
pub fn declaration(mm: &MatmulCall, cfg: &MatmulConfig) -> KernelDecl {
    use crate::dtype::Dtype::{Bf16, F32};
    use tpusim_model::expr::Expr::Grid;
    let (bm, bn, bk) = (cfg.block_m, cfg.block_n, cfg.block_k);
    KernelDecl {
        grid: vec![mm.m.div_ceil(bm), mm.n.div_ceil(bn), mm.k.div_ceil(bk)],
        parallel_dims: 2,
        refs: vec![
            RefDecl::input("x", &[bm, bk], Bf16, vec![Grid(0), Grid(2)]).of_array(&[mm.m, mm.k]),
            RefDecl::input("y", &[bk, bn], Bf16, vec![Grid(2), Grid(1)]).of_array(&[mm.k, mm.n]),
            RefDecl::output("o", &[bm, bn], Bf16, vec![Grid(0), Grid(1)]).of_array(&[mm.m, mm.n]),
            RefDecl::scratch("acc", &[bm, bn], F32),
        ],
        internal: vec![tpusim_model::VmemBuffer::internal("dot result", &[bm, bn], F32)],
    }
}

/// The VMEM a tiling takes ([`declaration`]), against its limit: the scoped limit of a Pallas
/// kernel; XLA's own dot is not held to it (all of VMEM).
fn tiling_vmem(chip: &ChipModel, mm: &MatmulCall, cfg: &MatmulConfig) -> VmemBudget {
    let limit = cfg.vmem_limit_bytes.unwrap_or_else(|| if cfg.kernel == Kernel::XlaMatmul { chip.vmem_size_bytes() } else { chip.vmem_limit_bytes() });
    declaration(mm, cfg).vmem(limit)
}

/// The most grid steps a matmul lowers to (2^32, the IR path's bound too).
pub const MAX_GRID_STEPS: u64 = 1 << 32;

/// Lowers a matmul with block sizes.
///
/// # Errors
/// [`KernelError::Config`] naming the flag when a block breaks the (8, 128) rules or exceeds its
/// dimension or give more than [`MAX_GRID_STEPS`] steps; [`KernelError::Vmem`] when the blocks
/// overflow the scoped VMEM limit; [`KernelError::Hbm`] when x, y and the output (bf16) overflow
/// the chip's HBM; [`KernelError::Workload`] for invalid sizes.
pub fn lower(chip: &ChipModel, mm: &MatmulCall, cfg: &MatmulConfig) -> Result<Program, KernelError> {
    mm.validate()?;
    // x [m, k], y [k, n] and o [m, n], bf16, in HBM.
    let need = (u128::from(mm.m) * u128::from(mm.k) + u128::from(mm.k) * u128::from(mm.n) + u128::from(mm.m) * u128::from(mm.n)) * 2;
    let cap = u128::from(chip.hbm_capacity_bytes());
    if need > cap {
        return Err(KernelError::Hbm {
            needed: need.min(u128::from(u64::MAX)) as u64,
            capacity: cap as u64,
            capacity_gib: chip.hbm.capacity_gib.value,
            advice: "x [m, k], y [k, n] and the output [m, n] are bf16 in HBM: use smaller `m`, `n` or `k`".into(),
        });
    }
    let sub = chip.vpu.sublanes.value as u64;
    let lanes = chip.vpu.lanes.value as u64;
    let (bm, bn, bk) = (cfg.block_m, cfg.block_n, cfg.block_k);
    for (f, v, dim, unit, name) in
        [("`block_m`", bm, mm.m, sub, "`m`"), ("`block_n`", bn, mm.n, lanes, "`n`"), ("`block_k`", bk, mm.k, lanes, "`k`")]
    {
        if v == 0 || v > tpusim_workload::MAX_DIM {
            return Err(KernelError::config(f, v, format!("expected a whole number from 1 to {}", tpusim_workload::MAX_DIM)));
        }
        if v % unit != 0 && v != dim {
            return Err(KernelError::config(f, v, format!("must be a multiple of {unit} ((8, 128) block rule) or equal {name} ({dim})")));
        }
        if v > dim.next_multiple_of(unit) {
            return Err(KernelError::config(f, v, format!("must not exceed {name} ({dim}) rounded up to {unit}")));
        }
    }
    let decl = declaration(mm, cfg);
    let limit = cfg.vmem_limit_bytes.unwrap_or_else(|| if cfg.kernel == Kernel::XlaMatmul { chip.vmem_size_bytes() } else { chip.vmem_limit_bytes() });
    let vmem = decl.vmem(limit);
    crate::check_vmem(&vmem, chip)?;
    let (nm, nn, nk) = (mm.m.div_ceil(bm), mm.n.div_ceil(bn), mm.k.div_ceil(bk));
    if nm.saturating_mul(nn) > crate::MAX_TILES {
        return Err(KernelError::config(
            "`block_m` x `block_n`",
            format!("{bm} x {bn}"),
            format!("the grid has {nm} x {nn} = {} output blocks; at most {} are supported: use larger blocks", nm * nn, crate::MAX_TILES),
        ));
    }
    // Every grid step is a step of the pipeline the engine runs: at most 2^32 of them.
    let steps = u128::from(nm) * u128::from(nn) * u128::from(nk);
    if steps > u128::from(MAX_GRID_STEPS) {
        return Err(KernelError::config(
            "`block_m` x `block_n` x `block_k`",
            format!("{bm} x {bn} x {bk}"),
            format!("the grid has {nm} x {nn} x {nk} = {steps} steps; at most {MAX_GRID_STEPS} are simulated: use larger blocks"),
        ));
    }
    let mut classes = Vec::new();
    let mut class_of = [[0u32; 2]; 2];
    for first in [false, true] {
        for last in [false, true] {
            class_of[usize::from(first)][usize::from(last)] = classes.len() as u32;
            classes.push(StepClass { key: ClassKey { tile: "full", masked: false, first, last }, body: body(&decl, (bm, bn, bk), first, last) });
        }
    }
    let info = ProgramInfo {
        kind: tpusim_model::KernelKind::Matmul,
        kernel: "matmul".into(),
        grid: vec![("m blocks".into(), nm), ("n blocks".into(), nn), ("k blocks".into(), nk)],
        blocks: vec![("block_m".into(), bm), ("block_n".into(), bn), ("block_k".into(), bk)],
        padded: vec![("m".into(), mm.m, nm * bm), ("n".into(), mm.n, nn * bn), ("k".into(), mm.k, nk * bk)],
        grid_steps: nm * nn * nk,
        ..Default::default()
    };
    // Every step's copies by Pallas's rule over the declaration ([`copy_key`]).
    let rule = CopyRule::new(&decl);
    let mut sets = CopySets::default();
    let last_block = [nm - 1, nn - 1, nk - 1].map(|b| b as i64);
    let copies = (0..64usize)
        .map(|key| {
            let last = [key & 8 != 0, key & 16 != 0, key & 32 != 0];
            let idx = |d: usize| if last[d] { last_block[d] } else { 0 };
            let at = [[idx(0), idx(2)], [idx(2), idx(1)], [idx(0), idx(1)]];
            sets.intern(rule.copies(|w| key & (1 << w) != 0, |w| Some(&at[w][..])))
        })
        .collect();
    let steps = Steps { nm, nn, nk, class_of, copies };
    Ok(Program::new(classes, nm * nn, vmem, info, decl, sets, steps))
}

// XLA's own dot (not a Pallas kernel) as the `xla-matmul` family: its output tiles are the
// family's default size at most, balanced over the dimension (the fewest tiles that pad it by
// at most 1%: a 18,900-row operand as 10 tiles of 1,896 rows, not 10 of 2,048 with 8%
// padding); the (8, 128) rules round them up; on a chip whose VMEM the tiling overflows, the
// output tiles are halved until it fits (XLA always finds a tiling that fits). `tpusim run
// --kernel xla-matmul` without blocks, the layer and the program path all take this tiling.

/// The tile of one dimension `dim`: the family default `default` at most; the fewest tiles
/// (from ceil(dim / default) up to twice that) that pad the dimension by at most 1%, or the
/// least padding if none does; rounded up to `unit` (elements).
pub fn balanced_block(dim: u64, default: u64, unit: u64) -> u64 {
    let t0 = dim.div_ceil(default).max(1);
    let mut best = (u64::MAX, default);
    for t in t0..=2 * t0 {
        let b = dim.div_ceil(t).next_multiple_of(unit).min(dim.next_multiple_of(unit));
        let padded = b * dim.div_ceil(b);
        if padded * 100 <= dim * 101 {
            return b;
        }
        if padded < best.0 {
            best = (padded, b);
        }
    }
    best.1
}

/// The XLA matmul configuration of a matmul (module docs), with output tiles at most
/// `cap_m` x `cap_n` elements (the family's defaults, halved while the tiling overflows VMEM).
pub fn xla_config(chip: &ChipModel, mm: &MatmulCall, cap_m: u64, cap_n: u64) -> MatmulConfig {
    let d = Kernel::XlaMatmul.defaults().blocks;
    let sub = u64::from(chip.vpu.sublanes.value);
    let lanes = u64::from(chip.vpu.lanes.value);
    MatmulConfig {
        kernel: Kernel::XlaMatmul,
        block_m: balanced_block(mm.m, cap_m, sub),
        block_n: balanced_block(mm.n, cap_n, lanes),
        block_k: balanced_block(mm.k, d.compute.unwrap_or(d.kv), lanes),
        vmem_limit_bytes: None,
    }
}

/// XLA's tiling of `mm` on `chip`: [`xla_config`] at the family's default output tiles, the
/// larger halved while the tiling overflows VMEM, down to 128 x 128 (then the last tried, which
/// [`lower`] refuses naming the overflow).
pub fn xla_tiling(chip: &ChipModel, mm: &MatmulCall) -> MatmulConfig {
    let d = Kernel::XlaMatmul.defaults().blocks;
    let (mut cap_m, mut cap_n) = (d.q, d.kv);
    loop {
        let cfg = xla_config(chip, mm, cap_m, cap_n);
        if tiling_vmem(chip, mm, &cfg).fits() || (cap_m <= 128 && cap_n <= 128) {
            return cfg;
        }
        if cap_m >= cap_n {
            cap_m /= 2;
        } else {
            cap_n /= 2;
        }
    }
}

/// XLA's dot of `mm` on `chip`: its configuration ([`xla_tiling`]) and program.
///
/// # Errors
/// [`KernelError`] from [`lower`] when even 128 x 128 tiles do not fit, or the sizes are invalid.
pub fn lower_xla(chip: &ChipModel, mm: &MatmulCall) -> Result<(MatmulConfig, Program), KernelError> {
    let cfg = xla_tiling(chip, mm);
    lower(chip, mm, &cfg).map(|p| (cfg, p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tutorial_grid_and_bytes() {
        let chip = ChipModel::preset("v5e").unwrap();
        let mm = MatmulCall { m: 1024, n: 1024, k: 1024 };
        let cfg = MatmulConfig::blocks(512, 512, 512);
        let p = lower(&chip, &mm, &cfg).unwrap();
        let (mut n, mut bytes, mut out, mut flops) = (0, 0, 0, 0.0);
        p.for_each_step(&mut |s| {
            n += 1;
            bytes += p.copies_of(s).in_bytes;
            out += p.copies_of(s).out_bytes;
            flops += p.classes[s.class as usize].body.flops();
        });
        assert_eq!(n, 8);
        assert_eq!(out, 1024 * 1024 * 2);
        assert_eq!(bytes, 8 * 2 * 512 * 512 * 2);
        assert!((flops - 2.0 * 1024f64.powi(3)).abs() < 1.0);
    }

    #[test]
    fn bad_blocks_are_named() {
        let chip = ChipModel::preset("v5e").unwrap();
        let mm = MatmulCall { m: 1024, n: 1024, k: 1024 };
        let e = lower(&chip, &mm, &MatmulConfig::blocks(100, 512, 512)).unwrap_err().to_string();
        assert!(e.contains("`block_m`") && e.contains("multiple of 8"), "{e}");
        let e = lower(&chip, &mm, &MatmulConfig::blocks(512, 500, 512)).unwrap_err().to_string();
        assert!(e.contains("`block_n`"), "{e}");
    }
}
