//! The backward attention kernels' step bodies as the op sequences they run, through the one
//! body builder ([`crate::body`]): JAX Splash's dq kernel (`_flash_attention_dq_kernel`) and dkv
//! kernel (`_flash_attention_dkv_kernel`, fused or not), op by op as their Mosaic IR has them
//! (JAX 0.10.2), so that the hand model and the kernel read from its IR build the same body.
//!
//! The dq kernel runs q-major (q along the score tile's rows, as the forward). The dkv kernel
//! runs kv-major (s = k q^T: kv along the rows, q along the lanes) over sub-tiles of the kv block;
//! fused, it also writes dq = ds^T k per step (a partial per kv block, summed outside).

use super::ops::{apply_mask, load2, load3, ref_indices, store, MaskPlan, MaskRefs};
use crate::body::{Emitter, V};
use crate::ir::StepBody;
use tpusim_model::decl::KernelDecl;

/// One backward step's shape and branches.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BwdStep<'a> {
    pub block_q: u64,
    pub block_kv: u64,
    /// The dkv kernel's kv sub-tile (`block_kv_dkv_compute`); the dq kernel's is `block_kv`.
    pub compute: u64,
    pub d: u64,
    pub dv: u64,
    /// The mask of a masked step (`None`: no mask ops).
    pub mask: Option<&'a MaskPlan>,
    /// Base-2 exp (tokamax): q scaled by log2(e), `exp2`.
    pub base2: bool,
    /// The dkv kernel also writes dq.
    pub fused: bool,
    /// The first grid step of the output block (`init` runs).
    pub first: bool,
    /// The step computes (a non-empty block).
    pub runs: bool,
    /// The last grid step of the output block (`end` runs).
    pub last: bool,
}

/// The backward kernels' refs by name from the family's declaration ([`super::bwd::dkv_refs`],
/// [`super::bwd::dq_refs`]), with the declaration's carried flags (the scratch and the outputs,
/// which `ref[...] = x` reads before it writes).
#[derive(Debug, Clone, Copy)]
struct Named {
    q: usize,
    k: usize,
    v: usize,
    lse: usize,
    d_o: usize,
    di: usize,
    mask: MaskRefs,
    dq_scratch: usize,
    dk_scratch: usize,
    dv_scratch: usize,
    dq: usize,
    dk: usize,
    dv: usize,
}

/// The refs of `decl` by the names the backward families declare them with; `dq`: the dq
/// output's name (`dq` for the dq kernel, `dq partial` for the fused dkv kernel).
fn named(decl: &KernelDecl, dq: &str) -> (Named, Vec<bool>) {
    let ([q, k, v, lse, d_o, di, q_seg, kv_seg, mask, q_seq, dq_scratch, dk_scratch, dv_scratch, dq, dk, dv], carried) = ref_indices(
        decl,
        ["q", "k", "v", "logsumexp", "dO", "di", "q segment ids", "kv segment ids", "mask", "q positions", "dq f32", "dk f32", "dv f32", dq, "dk", "dv"],
    );
    (Named { q, k, v, lse, d_o, di, mask: MaskRefs { mask, q_seq, q_seg, kv_seg }, dq_scratch, dk_scratch, dv_scratch, dq, dk, dv }, carried)
}

/// A `[1, 1, n]` row statistic (logsumexp, di) read as `[n]` then `[n, 1]` (q along the rows) or
/// as `[1, n]` (q along the lanes).
fn stat(e: &mut Emitter, r: usize, n: u64, rows: bool) -> V {
    let x = e.load(r, &[1, 1, n], "f32");
    if rows {
        let x = e.shape_cast(&x, &[n]);
        e.shape_cast(&x, &[n, 1])
    } else {
        e.shape_cast(&x, &[1, n])
    }
}

/// `q` scaled by log2(e) for base-2 exp (tokamax): VPU time, not a dependency of the matmuls
/// that read q (as the forward's, [`super::ops::splash_fwd`]).
fn scaled(e: &mut Emitter, q: V, base2: bool) -> V {
    if base2 {
        let c = e.splat(&q.shape, "bf16");
        e.same("arith.mulf", &[&q, &c]);
    }
    q
}

/// The dq kernel's step (module docs): its bodies without and with the row's end (`s.last` is
/// not read).
pub(crate) fn dq_step(decl: &KernelDecl, s: &BwdStep<'_>) -> [StepBody; 2] {
    let (refs, carried) = named(decl, "dq");
    let mut e = Emitter::new(carried);
    let (bq, bkv, d, dv) = (s.block_q, s.block_kv, s.d, s.dv);
    let acc = [bq, d];
    let exp = if s.base2 { "math.exp2" } else { "math.exp" };
    if s.first {
        let z = e.splat(&acc, "f32");
        store(&mut e, &z, refs.dq_scratch, &acc, "f32");
    }
    if s.runs {
        let q = load3(&mut e, refs.q, bq, d, "bf16");
        let q = scaled(&mut e, q, s.base2);
        let k = load3(&mut e, refs.k, bkv, d, "bf16");
        let v = load3(&mut e, refs.v, bkv, dv, "bf16");
        let lse = stat(&mut e, refs.lse, bq, true);
        let d_o = load3(&mut e, refs.d_o, bq, dv, "bf16");
        let di = stat(&mut e, refs.di, bq, true);
        let zero = e.constant(&[bq, bkv], "f32");
        let mut qk = e.matmul(&q, &k, &zero, [bq, d, bkv]);
        if let Some(plan) = s.mask {
            qk = apply_mask(&mut e, plan, refs.mask, &qk, true);
        }
        let lse = e.broadcast(&lse, &[bq, bkv]);
        let centred = e.same("arith.subf", &[&qk, &lse]);
        let p = e.same(exp, &[&centred]);
        let zero = e.constant(&[bq, bkv], "f32");
        let dp = e.matmul(&d_o, &v, &zero, [bq, dv, bkv]);
        let di = e.broadcast(&di, &[bq, bkv]);
        let dd = e.same("arith.subf", &[&dp, &di]);
        let ds = e.same("arith.mulf", &[&dd, &p]);
        let prev = load2(&mut e, refs.dq_scratch, &acc, "f32");
        let ds16 = e.ew("arith.truncf", &[&ds], "bf16");
        let zero = e.constant(&acc, "f32");
        let dq = e.matmul(&ds16, &k, &zero, [bq, bkv, d]);
        let next = e.same("arith.addf", &[&prev, &dq]);
        store(&mut e, &next, refs.dq_scratch, &acc, "f32");
    }
    // The step without its row's end, then with it: the ops before the end are emitted once
    // ([`crate::body::cached_pair`]).
    let without_end = e.finish_copy().body;
    {
        let dq = load2(&mut e, refs.dq_scratch, &acc, "f32");
        let dq = e.ew("arith.truncf", &[&dq], "bf16");
        let _ = load3(&mut e, refs.dq, bq, d, "bf16");
        let dq = e.shape_cast(&dq, &[1, bq, d]);
        e.store(&dq, refs.dq);
        let z = e.splat(&acc, "f32");
        store(&mut e, &z, refs.dq_scratch, &acc, "f32");
    }
    [without_end, e.finish().body]
}

/// `x` ([rows, cols] f32) cast to bf16 and written to `r`, a `[1, 1, rows, cols]` output.
fn write4(e: &mut Emitter, x: &V, r: usize) {
    let (rows, cols) = (x.shape[0], x.shape[1]);
    let l = e.load(r, &[1, 1, rows, cols], "bf16");
    e.shape_cast(&l, &[rows, cols]);
    let x = e.shape_cast(x, &[1, 1, rows, cols]);
    e.store(&x, r);
}

/// The dkv kernel's step (module docs): per kv sub-tile of `compute` rows, s = k q^T, p, dv += p
/// dO, dp = v dO^T, ds = (dp - di) p, dk += ds q, and fused dq += ds^T k. Its bodies without and
/// with the row's end (`s.last` is not read).
pub(crate) fn dkv_step(decl: &KernelDecl, s: &BwdStep<'_>) -> [StepBody; 2] {
    let (bq, bkv, c, d, dv) = (s.block_q, s.block_kv, s.compute, s.d, s.dv);
    let sub_tiled = c < bkv;
    let (refs, carried) = named(decl, "dq partial");
    let mut e = Emitter::new(carried);
    let exp = if s.base2 { "math.exp2" } else { "math.exp" };
    let (kv_acc, kv_acc_v) = ([bkv, d], [bkv, dv]);
    let dq_acc = [bq, d];
    if s.first {
        let z = e.splat(&kv_acc, "f32");
        store(&mut e, &z, refs.dk_scratch, &kv_acc, "f32");
        let z = e.splat(&kv_acc_v, "f32");
        store(&mut e, &z, refs.dv_scratch, &kv_acc_v, "f32");
    }
    if s.fused {
        // Every step: the dq scratch (several sub-tiles) or the dq partial (one) zeroed.
        if sub_tiled {
            let z = e.splat(&dq_acc, "f32");
            store(&mut e, &z, refs.dq_scratch, &dq_acc, "f32");
        } else {
            let z = e.splat(&dq_acc, "bf16");
            write4(&mut e, &z, refs.dq);
        }
    }
    if s.runs {
        for _ in 0..bkv / c {
            let q = load3(&mut e, refs.q, bq, d, "bf16");
            let q = scaled(&mut e, q, s.base2);
            let k = load3(&mut e, refs.k, c, d, "bf16");
            let v = load3(&mut e, refs.v, c, dv, "bf16");
            let lse = stat(&mut e, refs.lse, bq, false);
            let d_o = load3(&mut e, refs.d_o, bq, dv, "bf16");
            let di = stat(&mut e, refs.di, bq, false);
            let zero = e.constant(&[c, bq], "f32");
            let mut qk = e.matmul(&k, &q, &zero, [c, d, bq]);
            if let Some(plan) = s.mask {
                qk = apply_mask(&mut e, plan, refs.mask, &qk, false);
            }
            let lse = e.broadcast(&lse, &[c, bq]);
            let centred = e.same("arith.subf", &[&qk, &lse]);
            let p = e.same(exp, &[&centred]);
            let p16 = e.ew("arith.truncf", &[&p], "bf16");
            let zero = e.constant(&[c, dv], "f32");
            let dv_c = e.matmul(&p16, &d_o, &zero, [c, bq, dv]);
            let prev = load2(&mut e, refs.dv_scratch, &[c, dv], "f32");
            let next = e.same("arith.addf", &[&dv_c, &prev]);
            store(&mut e, &next, refs.dv_scratch, &[c, dv], "f32");
            let zero = e.constant(&[c, bq], "f32");
            let dp = e.matmul(&v, &d_o, &zero, [c, dv, bq]);
            let di = e.broadcast(&di, &[c, bq]);
            let dd = e.same("arith.subf", &[&dp, &di]);
            let ds = e.same("arith.mulf", &[&dd, &p]);
            let ds16 = e.ew("arith.truncf", &[&ds], "bf16");
            let zero = e.constant(&[c, d], "f32");
            let dk_c = e.matmul(&ds16, &q, &zero, [c, bq, d]);
            let prev = load2(&mut e, refs.dk_scratch, &[c, d], "f32");
            let next = e.same("arith.addf", &[&dk_c, &prev]);
            store(&mut e, &next, refs.dk_scratch, &[c, d], "f32");
            if s.fused {
                let shape = [bq, c];
                let ds_t = e.op("tpu.transpose", &shape, "f32", vec![crate::body::Arg::Op(ds.id)], Default::default());
                let ds_t16 = e.ew("arith.truncf", &[&ds_t], "bf16");
                let zero = e.constant(&dq_acc, "f32");
                let dq = e.matmul(&ds_t16, &k, &zero, [bq, c, d]);
                if sub_tiled {
                    let prev = load2(&mut e, refs.dq_scratch, &dq_acc, "f32");
                    let next = e.same("arith.addf", &[&prev, &dq]);
                    store(&mut e, &next, refs.dq_scratch, &dq_acc, "f32");
                } else {
                    let dq16 = e.ew("arith.truncf", &[&dq], "bf16");
                    write4(&mut e, &dq16, refs.dq);
                }
            }
        }
    }
    if s.fused && sub_tiled {
        // Every step: the dq scratch cast and written as this kv block's partial.
        let dq = load2(&mut e, refs.dq_scratch, &dq_acc, "f32");
        let dq = e.ew("arith.truncf", &[&dq], "bf16");
        write4(&mut e, &dq, refs.dq);
    }
    // The step without its row's end, then with it: the ops before the end are emitted once
    // ([`crate::body::cached_pair`]).
    let without_end = e.finish_copy().body;
    {
        for (scratch, out, cols) in [(refs.dk_scratch, refs.dk, d), (refs.dv_scratch, refs.dv, dv)] {
            let x = load2(&mut e, scratch, &[bkv, cols], "f32");
            let x = e.ew("arith.truncf", &[&x], "bf16");
            let _ = load3(&mut e, out, bkv, cols, "bf16");
            let x = e.shape_cast(&x, &[1, bkv, cols]);
            e.store(&x, out);
        }
        if s.fused && sub_tiled {
            let z = e.splat(&dq_acc, "f32");
            store(&mut e, &z, refs.dq_scratch, &dq_acc, "f32");
        }
        let z = e.splat(&kv_acc, "f32");
        store(&mut e, &z, refs.dk_scratch, &kv_acc, "f32");
        let z = e.splat(&kv_acc_v, "f32");
        store(&mut e, &z, refs.dv_scratch, &kv_acc_v, "f32");
    }
    [without_end, e.finish().body]
}
