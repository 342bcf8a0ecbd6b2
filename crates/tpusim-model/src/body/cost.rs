//! What each Mosaic op costs on the TensorCore's units, in (8,128) 32-bit register units: the
//! one table both front ends use (a kernel read from its IR, crate `tpusim-pallas`, and the
//! hand-written kernels of this crate, whose bodies are op sequences through the same
//! [`super::Builder`]).
//!
//! Register counting (the IR's logical shapes include lane replication, so work is counted in
//! registers, not elements): a value of shape `[..., R, C]` takes `lead x ceil(R / 8) x
//! ceil(C / 128)` (8,128) register units, where a dimension along which the value is constant (a
//! broadcast, an iota along another dimension, a splat constant) counts as 1: the compiler forms
//! such a value once per register row or column (Splash's kv positions are the same for every
//! 8-row group). Units are 1024 elements whatever the chip's register shape: the engine turns
//! them into the chip's registers (`tpusim_engine::op_cycles`), so a what-if register shape
//! (`--set vpu.lanes=256`) scales both front ends alike. Work is counted in 32-bit units
//! whatever the element type (16-bit data is computed in 32-bit on the VPU: an assumption, named
//! in reports).

/// Sublanes of the (8, 128) register unit work is counted in (module docs).
pub const UNIT_SUBLANES: u64 = 8;
/// Lanes of the (8, 128) register unit work is counted in (module docs).
pub const UNIT_LANES: u64 = 128;

/// How an op uses the units.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OpCost {
    /// No unit time: layout-preserving reshapes and casts, broadcasts, slices and
    /// concatenations of whole registers (one that starts off the register tile is shifted:
    /// `Builder::relayout`), constants, iota (formed once per kernel), loads and stores (the vector
    /// load/store slots issue beside the ALUs), semaphores. One exception, made
    /// where the store is lowered: a store of a constant fills its buffer at one VPU operation
    /// per register (the hand-written lowerings' zero-fill rule).
    Free,
    /// `ops` VPU operations per result register.
    Vpu(f64),
    /// `eup` transcendental registers and `vpu` VPU operations per result register (natural
    /// exp and log: the EUP computes exp2 / log2, so a scale by log2(e) runs on the VPU first;
    /// division: a reciprocal on the EUP and a multiply).
    Eup {
        /// EUP registers per result register.
        eup: f64,
        /// VPU operations per result register.
        vpu: f64,
    },
    /// Cross-lane unit: one pass per input register (transposes, lane rotations).
    Xlu,
    /// A vector reduction (`vector.multi_reduction`): VPU combines across registers, then the
    /// XLU reduces across lanes when the lane dimension is reduced.
    Reduce,
    /// A matmul on the MXUs, then one VPU operation per f32 result register to pop the result.
    Matmul,
    /// A DMA the kernel starts itself (`tpu.enqueue_dma`): its `bytes` move over HBM on the DMA
    /// engines (`Work::Dma`).
    Dma,
    /// A wait for DMAs (`tpu.wait_dma`, `tpu.wait_dma2`): no unit time; the ops after it wait for
    /// the copies it counts (`Work::DmaWait`).
    DmaWait,
    /// Packed int8 data widened to 32-bit lanes (`tpu.unpack_subelements`): an int8 mask block
    /// read for the scores it masks, at the chip's fitted cost per register
    /// (`fitted.loaded_mask_ops_per_vreg`, which covers the widening and the comparison; the
    /// select that applies the mask is its own op).
    LoadedMask,
}

/// Static names of the ops this lowering knows, with their cost. An op not listed is an error
/// naming the op, the kernel and the location.
pub const OPS: &[(&str, OpCost)] = &[
    // Free: data movement within registers and memory, constants, control.
    ("arith.constant", OpCost::Free),
    ("vector.broadcast", OpCost::Free),
    ("vector.splat", OpCost::Free),
    ("vector.shape_cast", OpCost::Free),
    ("tpu.reshape", OpCost::Free),
    ("tpu.bitcast", OpCost::Free),
    ("arith.bitcast", OpCost::Free),
    ("tpu.concatenate", OpCost::Free),
    ("tpu.iota", OpCost::Free),
    ("vector.extract_strided_slice", OpCost::Free),
    ("vector.extract", OpCost::Free),
    ("vector.insert_strided_slice", OpCost::Free),
    ("vector.load", OpCost::Free),
    ("tpu.load", OpCost::Free),
    ("tpu.strided_load", OpCost::Free),
    ("tpu.vector_store", OpCost::Free),
    ("vector.store", OpCost::Free),
    ("tpu.store", OpCost::Free),
    ("tpu.strided_store", OpCost::Free),
    ("vector.create_mask", OpCost::Free),
    ("tpu.create_mask", OpCost::Free),
    ("tpu.memref_slice", OpCost::Free),
    ("tpu.memref_squeeze", OpCost::Free),
    ("tpu.memref_reshape", OpCost::Free),
    ("tpu.memref_bitcast", OpCost::Free),
    ("tpu.reinterpret_cast", OpCost::Free),
    ("tpu.assume_multiple", OpCost::Free),
    ("tpu.assume_layout", OpCost::Free),
    ("tpu.erase_memref_layout", OpCost::Free),
    ("tpu.sem_wait", OpCost::Free),
    ("tpu.sem_signal", OpCost::Free),
    ("tpu.sem_alloc", OpCost::Free),
    ("tpu.trace_start", OpCost::Free),
    ("tpu.trace_stop", OpCost::Free),
    ("tpu.yield", OpCost::Free),
    // VPU element-wise.
    ("arith.addf", OpCost::Vpu(1.0)),
    ("arith.subf", OpCost::Vpu(1.0)),
    ("arith.mulf", OpCost::Vpu(1.0)),
    ("arith.negf", OpCost::Vpu(1.0)),
    ("arith.maximumf", OpCost::Vpu(1.0)),
    ("arith.minimumf", OpCost::Vpu(1.0)),
    ("arith.maxnumf", OpCost::Vpu(1.0)),
    ("arith.minnumf", OpCost::Vpu(1.0)),
    ("arith.addi", OpCost::Vpu(1.0)),
    ("arith.subi", OpCost::Vpu(1.0)),
    ("arith.muli", OpCost::Vpu(1.0)),
    ("arith.andi", OpCost::Vpu(1.0)),
    ("arith.ori", OpCost::Vpu(1.0)),
    ("arith.xori", OpCost::Vpu(1.0)),
    ("arith.shli", OpCost::Vpu(1.0)),
    ("arith.shrui", OpCost::Vpu(1.0)),
    ("arith.shrsi", OpCost::Vpu(1.0)),
    ("arith.maxsi", OpCost::Vpu(1.0)),
    ("arith.minsi", OpCost::Vpu(1.0)),
    ("arith.maxui", OpCost::Vpu(1.0)),
    ("arith.minui", OpCost::Vpu(1.0)),
    ("arith.select", OpCost::Vpu(1.0)),
    ("arith.cmpf", OpCost::Vpu(1.0)),
    ("arith.cmpi", OpCost::Vpu(1.0)),
    ("arith.extf", OpCost::Vpu(1.0)),
    ("arith.truncf", OpCost::Vpu(1.0)),
    ("tpu.extf", OpCost::Vpu(1.0)),
    ("tpu.truncf", OpCost::Vpu(1.0)),
    ("arith.extsi", OpCost::Vpu(1.0)),
    ("arith.extui", OpCost::Vpu(1.0)),
    ("arith.trunci", OpCost::Vpu(1.0)),
    ("arith.sitofp", OpCost::Vpu(1.0)),
    ("arith.uitofp", OpCost::Vpu(1.0)),
    ("arith.fptosi", OpCost::Vpu(1.0)),
    ("arith.fptoui", OpCost::Vpu(1.0)),
    ("tpu.sitofp", OpCost::Vpu(1.0)),
    ("tpu.fptosi", OpCost::Vpu(1.0)),
    // Integer division and remainder (mask arithmetic by a constant chunk or window): a
    // multiply-high, shifts and a correction, assumed 3 VPU operations (the sequence is the
    // compiler's and not public).
    ("arith.divsi", OpCost::Vpu(3.0)),
    ("arith.divui", OpCost::Vpu(3.0)),
    ("arith.floordivsi", OpCost::Vpu(4.0)),
    ("arith.remsi", OpCost::Vpu(4.0)),
    ("arith.remui", OpCost::Vpu(4.0)),
    ("math.absf", OpCost::Vpu(1.0)),
    ("math.absi", OpCost::Vpu(1.0)),
    ("math.copysign", OpCost::Vpu(1.0)),
    ("math.floor", OpCost::Vpu(1.0)),
    ("math.ceil", OpCost::Vpu(1.0)),
    ("math.roundeven", OpCost::Vpu(1.0)),
    ("math.round", OpCost::Vpu(1.0)),
    ("math.fma", OpCost::Vpu(2.0)),
    // EUP.
    ("math.exp", OpCost::Eup { eup: 1.0, vpu: 1.0 }),
    ("math.exp2", OpCost::Eup { eup: 1.0, vpu: 0.0 }),
    ("math.log", OpCost::Eup { eup: 1.0, vpu: 1.0 }),
    ("math.log2", OpCost::Eup { eup: 1.0, vpu: 0.0 }),
    ("math.log1p", OpCost::Eup { eup: 1.0, vpu: 2.0 }),
    ("math.tanh", OpCost::Eup { eup: 1.0, vpu: 0.0 }),
    ("math.rsqrt", OpCost::Eup { eup: 1.0, vpu: 0.0 }),
    ("math.sqrt", OpCost::Eup { eup: 1.0, vpu: 0.0 }),
    ("tpu.reciprocal", OpCost::Eup { eup: 1.0, vpu: 0.0 }),
    ("arith.divf", OpCost::Eup { eup: 1.0, vpu: 1.0 }),
    ("math.powf", OpCost::Eup { eup: 2.0, vpu: 2.0 }),
    // XLU.
    ("tpu.transpose", OpCost::Xlu),
    ("vector.transpose", OpCost::Xlu),
    ("tpu.dynamic_rotate", OpCost::Xlu),
    ("tpu.rotate", OpCost::Xlu),
    ("vector.multi_reduction", OpCost::Reduce),
    // MXU.
    ("tpu.matmul", OpCost::Matmul),
    ("vector.contract", OpCost::Matmul),
    // DMA.
    ("tpu.enqueue_dma", OpCost::Dma),
    ("tpu.wait_dma", OpCost::DmaWait),
    ("tpu.wait_dma2", OpCost::DmaWait),
    // Packed sub-32-bit data widened (an int8 mask block).
    ("tpu.unpack_subelements", OpCost::LoadedMask),
];

/// The cost and static name of an op, if known.
pub fn lookup(op: &str) -> Option<(&'static str, OpCost)> {
    OPS.iter().find(|(n, _)| *n == op).map(|&(n, c)| (n, c))
}

/// MXU passes of one matmul by its operand element types and the precision the IR names
/// (`tpu.matmul`'s `precision`): the one rule of [`crate::mxu`].
pub fn mxu_passes_for_operands(lhs_dtype: &str, rhs_dtype: &str, precision: Option<&str>) -> u64 {
    use crate::dtype::Dtype;
    use crate::mxu::{matmul_passes, Precision};
    // Only f32 is a 32-bit MXU operand here; other types are taken as the MXU's own.
    let dt = |s: &str| if s == "f32" { Dtype::F32 } else { Dtype::Bf16 };
    let p = match precision.map(|p| p.to_ascii_lowercase()) {
        Some(p) if p.contains("highest") || p.contains("fp32") => Precision::Highest,
        Some(p) if p.contains("high") || p.contains("3x") => Precision::High,
        _ => Precision::Default,
    };
    matmul_passes(dt(lhs_dtype), dt(rhs_dtype), p)
}

/// (8,128) register units of a value: `[..., R, C]` as `lead x ceil(R / 8) x ceil(C / 128)`, a
/// dimension along which the value is constant counting as 1 (module docs).
pub fn vregs(shape: &[u64], varies: &[bool]) -> f64 {
    let eff = |i: usize| if varies.get(i).copied().unwrap_or(true) { shape[i] } else { 1 };
    let n = shape.len();
    match n {
        0 => 1.0,
        1 => eff(0).div_ceil(UNIT_LANES) as f64,
        _ => {
            let lead: u64 = (0..n - 2).map(eff).product();
            (lead * eff(n - 2).div_ceil(UNIT_SUBLANES) * eff(n - 1).div_ceil(UNIT_LANES)) as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_count_replication_once() {
        assert_eq!(vregs(&[512, 512], &[true, true]), 256.0);
        // Constant along rows (kv positions): one register row.
        assert_eq!(vregs(&[512, 512], &[false, true]), 4.0);
        assert_eq!(vregs(&[2, 7, 200], &[true, true, true]), 4.0);
    }

    #[test]
    fn passes_by_operand_type() {
        assert_eq!(mxu_passes_for_operands("bf16", "bf16", None), 1);
        assert_eq!(mxu_passes_for_operands("f32", "f32", None), 1);
        assert_eq!(mxu_passes_for_operands("f32", "f32", Some("fp32")), 6);
        assert_eq!(mxu_passes_for_operands("f32", "bf16", Some("bf16_3x")), 3);
    }

    #[test]
    fn every_op_is_listed_once() {
        let mut names: Vec<&str> = OPS.iter().map(|(n, _)| *n).collect();
        names.sort_unstable();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n);
        assert_eq!(lookup("tpu.matmul").map(|(_, c)| c), Some(OpCost::Matmul));
        assert!(lookup("tpu.unknown").is_none());
    }
}
