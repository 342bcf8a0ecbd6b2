//! The forward attention kernels' step bodies as the op sequences they run, through the one
//! body builder ([`crate::body`]): JAX's Splash (`splash_attention_kernel.py`,
//! `flash_attention_kernel`) and JAX's older Pallas TPU flash attention (`flash_attention.py`,
//! `_flash_attention_kernel_single_batch`), op by op as their Mosaic IR has them (JAX 0.10.2), so
//! that the hand model and the kernel read from its IR build the same body (the agreement suite
//! compares their op lists).
//!
//! A step's ops depend on its class: the `init` branch at the row's first grid step, the compute
//! branch (one sub-tile after another, unrolled) at a non-empty step, the `end` branch at the
//! row's last grid step; the mask's ops on a masked step (the mask function as JAX traces it,
//! the partial mask block loaded, segment ids compared).

use crate::body::{Arg, Attrs, Emitter, V};
use crate::ir::StepBody;
use tpusim_model::decl::KernelDecl;
use tpusim_workload::Mask;

/// Lanes of a vector register: the width of Splash's lane-replicated row statistics (m, l) and
/// of its q positions (`NUM_LANES`).
pub(crate) const LANES: u64 = 128;

/// How a masked step masks its scores.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MaskPlan {
    /// The mask function evaluated from positions (JAX's `_ComputableMask`; a union or
    /// intersection of position masks is traced as their combination), if any.
    pub function: Option<Mask>,
    /// The partial mask block loaded (JAX's `NumpyMask`: a bool block passed as int32; the
    /// other families' int8 blocks, `int8`).
    pub loaded: bool,
    /// The loaded block is int8 (tokamax's and MaxDiffusion's `partial_mask_blocks`): widened
    /// at the chip's fitted cost ([`crate::body::cost::OpCost::LoadedMask`]) rather than
    /// compared as JAX's int32 block is.
    pub int8: bool,
    /// Segment ids compared (the sequence padded to the blocks).
    pub segments: bool,
}

/// How a family's forward kernel differs from JAX's Splash (whose IR the program follows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Flavor {
    /// Base-2 exp (tokamax's `use_base2_exp`): q scaled by log2(e) once per step, `exp2`.
    pub base2: bool,
    /// The p.v matmul takes v as f32 (JAX's `v.astype(float32)`); otherwise p is cast to bf16.
    pub f32_v: bool,
    /// `end()` refills m, l and o_scratch (JAX's Splash, whose scratch are outputs).
    pub resets_scratch: bool,
    /// The residuals are the logsumexp and the max logits (tokamax); JAX writes the logsumexp.
    pub max_logits: bool,
}

/// One forward step's shape and branches.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FwdStep<'a> {
    /// The family's differences from JAX's Splash.
    pub flavor: Flavor,
    pub block_q: u64,
    pub block_kv: u64,
    pub compute: u64,
    pub d: u64,
    pub dv: u64,
    /// The mask of a masked step (`None`: no mask ops).
    pub mask: Option<&'a MaskPlan>,
    /// The kernel writes its residuals (the logsumexp).
    pub residuals: bool,
    /// The row's first grid step (`init` runs).
    pub first: bool,
    /// The step computes (a non-empty block).
    pub runs: bool,
    /// The row's last grid step (`end` runs).
    pub last: bool,
}

/// `x // c` of int32 positions as `jnp.floor_divide` traces it: the truncating division, then
/// one subtracted where the signs differ and the remainder is not zero.
fn floor_div(e: &mut Emitter, x: &V) -> V {
    let c = e.splat(&x.shape, "i32");
    let q = e.same("arith.divsi", &[x, &c]);
    let zero = e.splat(&x.shape, "i32");
    let pos = e.ew("arith.cmpi", &[x, &zero], "i1");
    let pos = e.ew("arith.extui", &[&pos], "i32");
    let zero = e.splat(&x.shape, "i32");
    let neg = e.ew("arith.cmpi", &[x, &zero], "i1");
    let neg = e.ew("arith.extui", &[&neg], "i32");
    let sign = e.same("arith.subi", &[&pos, &neg]);
    let dsign = e.splat(&x.shape, "i32");
    let differ = e.ew("arith.cmpi", &[&sign, &dsign], "i1");
    let c = e.splat(&x.shape, "i32");
    let rem = e.same("arith.remsi", &[x, &c]);
    let zero = e.splat(&x.shape, "i32");
    let inexact = e.ew("arith.cmpi", &[&rem, &zero], "i1");
    let fix = e.same("arith.andi", &[&differ, &inexact]);
    let one = e.splat(&x.shape, "i32");
    let down = e.same("arith.subi", &[&q, &one]);
    e.ew("arith.select", &[&fix, &down, &q], "i32")
}

/// `x + c` (`c` a constant).
fn plus(e: &mut Emitter, x: &V, op: &str) -> V {
    let c = e.splat(&x.shape, "i32");
    e.same(op, &[x, &c])
}

/// A mask function of q and kv positions as JAX traces it (`splash_attention_mask.py`): i1 of the
/// positions' shape. `q` varies along the rows, `k` along the lanes.
pub(crate) fn mask_function(e: &mut Emitter, m: &Mask, q: &V, k: &V) -> V {
    match m {
        Mask::Causal { offset } => {
            let q = if *offset != 0 { plus(e, q, "arith.addi") } else { q.clone() };
            e.ew("arith.cmpi", &[&q, k], "i1")
        }
        Mask::Local { offset, .. } => {
            let q = if *offset != 0 { plus(e, q, "arith.addi") } else { q.clone() };
            let lo = plus(e, &q, "arith.subi");
            let left = e.ew("arith.cmpi", &[&lo, k], "i1");
            let hi = plus(e, &q, "arith.addi");
            let right = e.ew("arith.cmpi", &[&hi, k], "i1");
            e.same("arith.andi", &[&left, &right])
        }
        Mask::Band { .. } => {
            let diff = e.same("arith.subi", &[q, k]);
            let abs = e.same("math.absi", &[&diff]);
            let w = e.splat(&abs.shape, "i32");
            e.ew("arith.cmpi", &[&abs, &w], "i1")
        }
        Mask::Sink { .. } => {
            let t = e.splat(&k.shape, "i32");
            e.ew("arith.cmpi", &[k, &t], "i1")
        }
        Mask::Chunked { .. } => {
            let qc = floor_div(e, q);
            let kc = floor_div(e, k);
            let same = e.ew("arith.cmpi", &[&qc, &kc], "i1");
            let causal = e.ew("arith.cmpi", &[q, k], "i1");
            e.same("arith.andi", &[&same, &causal])
        }
        Mask::Union(parts) | Mask::Intersect(parts) if !parts.is_empty() => {
            let join = if matches!(m, Mask::Union(_)) { "arith.ori" } else { "arith.andi" };
            let mut acc = mask_function(e, &parts[0], q, k);
            for p in &parts[1..] {
                let v = mask_function(e, p, q, k);
                acc = e.same(join, &[&acc, &v]);
            }
            acc
        }
        other => {
            // A mask with no position form here (a video window): its expression's terms, each
            // an operation on the positions' shape.
            let t = other.expression_terms();
            let mut acc = e.ew("arith.cmpi", &[q, k], "i1");
            for _ in 0..t.arith {
                acc = e.same("arith.addi", &[&acc, &acc]);
            }
            for _ in 1..t.compares.max(1) {
                let c = e.ew("arith.cmpi", &[q, k], "i1");
                acc = e.same("arith.andi", &[&acc, &c]);
            }
            for _ in 0..t.combines {
                acc = e.same("arith.ori", &[&acc, &acc]);
            }
            acc
        }
    }
}

/// The indices of the refs named `names` in a family's declaration ([`super::family_refs`],
/// the `pallas_call`'s order) and the declaration's carried flags. A name the declaration lacks
/// (a ref of a branch the family never takes, or running state a kernel keeps outside its
/// `pallas_call`) gets an index past the declared refs, carried, so that what the op program
/// reads and writes of it stays its own.
pub(crate) fn ref_indices<const N: usize>(decl: &KernelDecl, names: [&str; N]) -> ([usize; N], Vec<bool>) {
    let mut carried = decl.carried();
    let idx = names.map(|n| {
        decl.index_of(n).unwrap_or_else(|| {
            carried.push(true);
            carried.len() - 1
        })
    });
    (idx, carried)
}

/// `alpha` ([bq, 128]) tiled to the head dimension (`jnp.tile(alpha, (1, r))[..., :dv]`).
fn tile_lanes(e: &mut Emitter, x: &V, dv: u64) -> V {
    let r = dv.div_ceil(LANES) as usize;
    let t = if r > 1 { e.tile(x, r, 1) } else { x.clone() };
    if r as u64 * LANES == dv {
        t
    } else {
        let shape = [t.shape[0], dv];
        e.op("vector.extract_strided_slice", &shape, t.dtype, vec![Arg::Op(t.id)], Attrs::default())
    }
}

/// A load of a 2-D block of ref `r` read through a leading squeezed dimension (`[1, rows, cols]`
/// then a shape cast to `[rows, cols]`).
pub(crate) fn load3(e: &mut Emitter, r: usize, rows: u64, cols: u64, dtype: &'static str) -> V {
    let x = e.load(r, &[1, rows, cols], dtype);
    e.shape_cast(&x, &[rows, cols])
}

/// A load of a 2-D ref and its shape cast (how Mosaic reads `ref[...]`).
pub(crate) fn load2(e: &mut Emitter, r: usize, shape: &[u64], dtype: &'static str) -> V {
    let x = e.load(r, shape, dtype);
    e.shape_cast(&x, shape)
}

/// `ref[...] = x`: the ref read first (Mosaic's store of a whole ref), then the store.
pub(crate) fn store(e: &mut Emitter, x: &V, r: usize, shape: &[u64], dtype: &'static str) {
    e.load(r, shape, dtype);
    e.store(x, r);
}

/// A Splash forward step (module docs): `flash_attention_kernel`'s `init`, `body` per sub-tile
/// and `end`, as JAX's Splash runs them, with the family's differences ([`Flavor`]): the step's
/// bodies without and with `end` (`s.last` is not read; the row's last step takes the second).
pub(crate) fn splash_fwd(decl: &KernelDecl, s: &FwdStep<'_>) -> [StepBody; 2] {
    let f = s.flavor;
    // Carried (the declaration's): the refs the body loads and stores (the row statistics, the
    // accumulator, and o and the residuals, which `ref[...] = x` reads before it writes).
    let ([q_ref, k_ref, v_ref, q_seg, kv_seg, mask_ref, q_seq, m_ref, l_ref, o_scratch, o_ref, lse_ref, max_ref], carried) = ref_indices(
        decl,
        ["q", "k", "v", "q segment ids", "kv segment ids", "mask", "q positions", "m", "l", "o_scratch", "o", "logsumexp", "max logits"],
    );
    let mask_refs = MaskRefs { mask: mask_ref, q_seq, q_seg, kv_seg };
    let mut e = Emitter::new(carried);
    let (bq, c, d, dv) = (s.block_q, s.compute, s.d, s.dv);
    let stat = [bq, LANES];
    let acc = [bq, dv];
    let exp = if f.base2 { "math.exp2" } else { "math.exp" };
    if s.first {
        let z = e.splat(&acc, "f32");
        store(&mut e, &z, o_scratch, &acc, "f32");
        let m0 = e.splat(&stat, "f32");
        store(&mut e, &m0, m_ref, &stat, "f32");
        let l0 = e.splat(&stat, "f32");
        store(&mut e, &l0, l_ref, &stat, "f32");
    }
    if s.runs {
        for _ in 0..s.block_kv / c {
            let m_prev = load2(&mut e, m_ref, &stat, "f32");
            let l_prev = load2(&mut e, l_ref, &stat, "f32");
            let q = load3(&mut e, q_ref, bq, d, "bf16");
            if f.base2 {
                // q x log2(e) (tokamax's `q *= LOG2E`) takes VPU time but is not a dependency
                // of the QK matmul: the compiler scales the block while the previous step's
                // softmax drains (an assumption; the matmul reads the loaded q).
                let log2e = e.splat(&q.shape, "bf16");
                e.same("arith.mulf", &[&q, &log2e]);
            }
            let k = load3(&mut e, k_ref, c, d, "bf16");
            let zero = e.constant(&[bq, c], "f32");
            let mut qk = e.matmul(&q, &k, &zero, [bq, d, c]);
            if let Some(plan) = s.mask {
                qk = apply_mask(&mut e, plan, mask_refs, &qk, true);
            }
            let m_curr = e.reduce(&qk, &[1]);
            let m_col = e.shape_cast(&m_curr, &[bq, 1]);
            let m_b = e.broadcast(&m_col, &stat);
            let m_next = e.same("arith.maximumf", &[&m_prev, &m_b]);
            let m_tiled = if c > LANES { e.tile(&m_next, (c / LANES) as usize, 1) } else { m_next.clone() };
            let centred = e.same("arith.subf", &[&qk, &m_tiled]);
            let s_curr = e.same(exp, &[&centred]);
            let l_sum = e.reduce(&s_curr, &[1]);
            let l_col = e.shape_cast(&l_sum, &[bq, 1]);
            let l_curr = e.broadcast(&l_col, &stat);
            let dm = e.same("arith.subf", &[&m_prev, &m_next]);
            let alpha = e.same(exp, &[&dm]);
            let al = e.same("arith.mulf", &[&alpha, &l_prev]);
            let l_next = e.same("arith.addf", &[&l_curr, &al]);
            store(&mut e, &m_next, m_ref, &stat, "f32");
            store(&mut e, &l_next, l_ref, &stat, "f32");
            let v = load3(&mut e, v_ref, c, dv, "bf16");
            let (p, v) = if f.f32_v { (s_curr, e.ew("arith.extf", &[&v], "f32")) } else { (e.ew("arith.truncf", &[&s_curr], "bf16"), v) };
            let zero_o = e.constant(&acc, "f32");
            let o_curr = e.matmul(&p, &v, &zero_o, [bq, c, dv]);
            let alpha_o = tile_lanes(&mut e, &alpha, dv);
            let o_prev = load2(&mut e, o_scratch, &acc, "f32");
            let ao = e.same("arith.mulf", &[&alpha_o, &o_prev]);
            let o_next = e.same("arith.addf", &[&ao, &o_curr]);
            store(&mut e, &o_next, o_scratch, &acc, "f32");
        }
    }
    // The step without its row's end, then with it: the ops before the end are emitted once
    // ([`crate::body::cached_pair`]).
    let without_end = e.finish_copy().body;
    {
        let l = load2(&mut e, l_ref, &stat, "f32");
        // `1.0 / l` (the IR broadcasts a constant of the compute branch, or a scalar: alike).
        let one = e.splat(&stat, "f32");
        let inv = e.same("arith.divf", &[&one, &l]);
        let inv = tile_lanes(&mut e, &inv, dv);
        let o_acc = load2(&mut e, o_scratch, &acc, "f32");
        let o = e.same("arith.mulf", &[&o_acc, &inv]);
        let o = e.ew("arith.truncf", &[&o], "bf16");
        let _ = load3(&mut e, o_ref, bq, dv, "bf16");
        let o = e.shape_cast(&o, &[1, bq, dv]);
        e.store(&o, o_ref);
        if s.residuals {
            let log_l = e.same(if f.base2 { "math.log2" } else { "math.log" }, &[&l]);
            let m = load2(&mut e, m_ref, &stat, "f32");
            let lse = e.same("arith.addf", &[&log_l, &m]);
            let _ = load3(&mut e, lse_ref, bq, LANES, "f32");
            let lse = e.shape_cast(&lse, &[1, bq, LANES]);
            e.store(&lse, lse_ref);
            if f.max_logits {
                let _ = load3(&mut e, max_ref, bq, LANES, "f32");
                let m = e.shape_cast(&m, &[1, bq, LANES]);
                e.store(&m, max_ref);
            }
        }
        if f.resets_scratch {
            let z = e.splat(&stat, "f32");
            store(&mut e, &z, m_ref, &stat, "f32");
            let z = e.splat(&stat, "f32");
            store(&mut e, &z, l_ref, &stat, "f32");
            let z = e.splat(&acc, "f32");
            store(&mut e, &z, o_scratch, &acc, "f32");
        }
    }
    [without_end, e.finish().body]
}

/// The refs a mask reads: the loaded mask block, the q positions (`q_sequence`), the q and kv
/// segment ids.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MaskRefs {
    pub mask: usize,
    pub q_seq: usize,
    pub q_seg: usize,
    pub kv_seg: usize,
}

/// Splash's `_apply_mask_and_soft_cap` on a score tile `s`: the loaded mask block (JAX's: or'ed
/// with `should_not_mask`; an int8 block widened), the mask function of q and kv positions, the
/// segment ids' equality, and'ed together, then `where(mask, s, mask_value)`. `k_in_lanes`: kv
/// along the lanes (the forward and the dq kernel), else along the rows (the dkv kernel).
pub(super) fn apply_mask(e: &mut Emitter, plan: &MaskPlan, refs: MaskRefs, s: &V, k_in_lanes: bool) -> V {
    let tile = s.shape.clone();
    let (rows, cols) = (tile[0], tile[1]);
    let mut masks: Vec<V> = Vec::new();
    if plan.loaded && plan.int8 {
        let block = load3(e, refs.mask, rows, cols, "i8");
        masks.push(e.ew("tpu.unpack_subelements", &[&block], "i1"));
    } else if plan.loaded {
        let block = load3(e, refs.mask, rows, cols, "i32");
        let zero = e.constant(&tile, "i32");
        let kept = e.ew("arith.cmpi", &[&block, &zero], "i1");
        let always = e.splat(&tile, "i1");
        masks.push(e.same("arith.ori", &[&kept, &always]));
    }
    if let Some(f) = &plan.function {
        let (q, k) = if k_in_lanes {
            let iota = e.iota(&tile, &[1]);
            let off = e.splat(&tile, "i32");
            let k = e.same("arith.addi", &[&off, &iota]);
            let q = load2(e, refs.q_seq, &[rows, LANES], "i32");
            let q = if cols > LANES { e.tile(&q, (cols / LANES) as usize, 1) } else { q };
            (q, k)
        } else {
            let iota = e.iota(&tile, &[0]);
            let off = e.splat(&tile, "i32");
            let k = e.same("arith.addi", &[&off, &iota]);
            let q = load2(e, refs.q_seq, &[1, cols], "i32");
            let q = e.shape_cast(&q, &[1, cols]);
            let q = e.broadcast(&q, &tile);
            (q, k)
        };
        masks.push(mask_function(e, f, &q, &k));
    }
    if plan.segments {
        if k_in_lanes {
            let kv = load2(e, refs.kv_seg, &[1, cols], "i32");
            let q = load2(e, refs.q_seg, &[rows, LANES], "i32");
            let q = if cols > LANES { e.tile(&q, (cols / LANES) as usize, 1) } else { q };
            let kv = e.broadcast(&kv, &tile);
            masks.push(e.ew("arith.cmpi", &[&q, &kv], "i1"));
        } else {
            let kv = load2(e, refs.kv_seg, &[rows, LANES], "i32");
            let kv = if cols > LANES { e.tile(&kv, (cols / LANES) as usize, 1) } else { kv };
            let q = load2(e, refs.q_seg, &[1, cols], "i32");
            let q = e.broadcast(&q, &tile);
            masks.push(e.ew("arith.cmpi", &[&q, &kv], "i1"));
        }
    }
    let Some(first) = masks.first().cloned() else { return s.clone() };
    let mut mask = first;
    for m in &masks[1..] {
        mask = e.same("arith.andi", &[&mask, m]);
    }
    let fill = e.splat(&tile, "f32");
    e.ew("arith.select", &[&mask, s, &fill], "f32")
}

/// JAX's older flash attention forward step (module docs): `_flash_attention_kernel_single_batch`
/// with block_b 1: `start_new_sequence`, the body when the block is not above the causal
/// diagonal, `store_output` at the row's last kv block. Its causal mask is added as a bias
/// (`s + where(mask, 0, mask_value)`); its accumulator is normalized on every block. The step's
/// bodies without and with `store_output` (`s.last` is not read).
pub(crate) fn jax_flash_fwd(decl: &KernelDecl, s: &FwdStep<'_>) -> [StepBody; 2] {
    // Refs (the declaration's): q, k, v, o, then the scratch m, l, acc (each [1, 1, rows, cols]).
    let ([q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref], carried) = ref_indices(decl, ["q", "k", "v", "o", "m", "l", "acc"]);
    let mut e = Emitter::new(carried);
    let (bq, c, d, dv) = (s.block_q, s.compute, s.d, s.dv);
    let stat = [bq, LANES];
    let acc = [bq, dv];
    let load4 = |e: &mut Emitter, r: usize, shape: [u64; 2], dtype: &'static str| {
        let x = e.load(r, &[1, 1, shape[0], shape[1]], dtype);
        e.shape_cast(&x, &shape)
    };
    let store4 = |e: &mut Emitter, x: &V, r: usize, shape: [u64; 2], dtype: &'static str| {
        let _ = load4(e, r, shape, dtype);
        let x = e.shape_cast(x, &[1, 1, shape[0], shape[1]]);
        e.store(&x, r);
    };
    if s.first {
        for (r, shape) in [(m_ref, stat), (l_ref, stat), (acc_ref, [bq, dv])] {
            let z = e.splat(&shape, "f32");
            store4(&mut e, &z, r, shape, "f32");
        }
    }
    if s.runs {
        for _ in 0..s.block_kv / c {
            let m_prev = load4(&mut e, m_ref, stat, "f32");
            let l_prev = load4(&mut e, l_ref, stat, "f32");
            let q = load4(&mut e, q_ref, [bq, d], "bf16");
            let k = load4(&mut e, k_ref, [c, d], "bf16");
            let zero = e.constant(&[bq, c], "f32");
            let mut scores = e.matmul(&q, &k, &zero, [bq, d, c]);
            if s.mask.is_some() {
                let tile = [bq, c];
                let rows = e.iota(&tile, &[0]);
                let q0 = e.splat(&tile, "i32");
                let qi = e.same("arith.addi", &[&rows, &q0]);
                let cols = e.iota(&tile, &[1]);
                let k0 = e.splat(&tile, "i32");
                let ki = e.same("arith.addi", &[&cols, &k0]);
                let keep = e.ew("arith.cmpi", &[&ki, &qi], "i1");
                let zero = e.splat(&tile, "f32");
                let neg = e.splat(&tile, "f32");
                let bias = e.ew("arith.select", &[&keep, &zero, &neg], "f32");
                scores = e.same("arith.addf", &[&scores, &bias]);
            }
            let m_cur = e.reduce(&scores, &[1]);
            let m_col = e.shape_cast(&m_cur, &[bq, 1]);
            let m_b = e.broadcast(&m_col, &stat);
            let m_next = e.same("arith.maximumf", &[&m_prev, &m_b]);
            let m_tiled = if c > LANES { e.tile(&m_next, (c / LANES) as usize, 1) } else { m_next.clone() };
            let centred = e.same("arith.subf", &[&scores, &m_tiled]);
            let p = e.same("math.exp", &[&centred]);
            let dm = e.same("arith.subf", &[&m_prev, &m_next]);
            let alpha = e.same("math.exp", &[&dm]);
            let l_corr = e.same("arith.mulf", &[&alpha, &l_prev]);
            let l_sum = e.reduce(&p, &[1]);
            let l_col = e.shape_cast(&l_sum, &[bq, 1]);
            let l_b = e.broadcast(&l_col, &stat);
            let l_next = e.same("arith.addf", &[&l_b, &l_corr]);
            store4(&mut e, &l_next, l_ref, stat, "f32");
            store4(&mut e, &m_next, m_ref, stat, "f32");
            let zero = e.splat(&stat, "f32");
            let is_zero = e.ew("arith.cmpf", &[&l_next, &zero], "i1");
            let one = e.splat(&stat, "f32");
            let inv = e.same("arith.divf", &[&one, &l_next]);
            let one = e.splat(&stat, "f32");
            let l_inv = e.ew("arith.select", &[&is_zero, &one, &inv], "f32");
            let l_inv = tile_lanes(&mut e, &l_inv, dv);
            let o_prev = load4(&mut e, acc_ref, [bq, dv], "f32");
            let corr = tile_lanes(&mut e, &l_corr, dv);
            let scale = e.same("arith.mulf", &[&corr, &l_inv]);
            let o_scaled = e.same("arith.mulf", &[&o_prev, &scale]);
            store4(&mut e, &o_scaled, acc_ref, [bq, dv], "f32");
            let v = load4(&mut e, v_ref, [c, dv], "bf16");
            let p16 = e.ew("arith.truncf", &[&p], "bf16");
            let zero_o = e.constant(&acc, "f32");
            let o_curr = e.matmul(&p16, &v, &zero_o, [bq, c, dv]);
            let o_acc = load4(&mut e, acc_ref, [bq, dv], "f32");
            let o_add = e.same("arith.mulf", &[&o_curr, &l_inv]);
            let o_next = e.same("arith.addf", &[&o_acc, &o_add]);
            store4(&mut e, &o_next, acc_ref, [bq, dv], "f32");
        }
    }
    // The step without its row's end, then with it: the ops before the end are emitted once
    // ([`crate::body::cached_pair`]).
    let without_end = e.finish_copy().body;
    {
        let o = load4(&mut e, acc_ref, [bq, dv], "f32");
        let o = e.ew("arith.truncf", &[&o], "bf16");
        store4(&mut e, &o, o_ref, [bq, dv], "bf16");
    }
    [without_end, e.finish().body]
}
