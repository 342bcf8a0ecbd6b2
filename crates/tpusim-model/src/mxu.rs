//! How many times a matmul goes through the MXU ([`matmul_passes`]): the one rule for matmuls
//! whose operands are 32-bit, which the hand-written kernels and the Pallas-IR front end share.
//!
//! The MXU multiplies bf16 (and narrower) operands. A matmul with an f32 operand is, by its
//! precision:
//!
//! * **default** (`jax.lax.Precision.DEFAULT`, Mosaic's `tpu.matmul` without a `precision`):
//!   one pass, the f32 operands rounded to bf16 - "Even if you pass in 32-bit operands to a
//!   matrix multiplication, they will be rounded to bfloat16 unless float32 precision is
//!   requested" (jax-ml/jax `docs/pallas/tpu/details.rst`, Precision control);
//! * **high** (`Precision.HIGH`, `bfloat16_3x`, Mosaic `#tpu.contract_precision<bf16x3>`): three
//!   bf16 passes;
//! * **highest** (`Precision.HIGHEST`, `float32`, `#tpu.contract_precision<fp32>`): six bf16
//!   passes ("On TPU: performs float32 computations in 3 / 6 bfloat16 passes", jax-ml/jax
//!   `jax/_src/lax/lax.py` `Precision`; `DotAlgorithmPreset.BF16_BF16_F32_X3` / `_X6`).
//!
//! Rounding an f32 operand to bf16 before the MXU is VPU work the caller counts (one operation
//! per f32 register of the operand), not an MXU pass.
//!
//! **8-bit operands** ([`MxuType`]). A matmul whose operands are both int8, or both fp8 of the
//! two formats XLA's table lists (float8_e4m3fn, float8_e5m2, in either combination), runs in
//! that type: the chip model's `mxu.int8_*_vs_bf16` / `mxu.fp8_*_vs_bf16` factors say how fast
//! it streams rows and loads weights against bf16 (derived from XLA's per-generation cadences,
//! `openxla/xla xla/benchmarks/core/platform_info.py`: v6e streams int8 at twice bf16's row
//! rate and fp8 at bf16's, v7x fp8 at twice; a register holds twice as many 8-bit weights at the
//! same latch cadence). A matmul of mixed types (bf16 by fp8) is a bf16 matmul: the narrower
//! operand is widened first. Other types (f16, int4, the other fp8 formats, which XLA emulates in
//! bf16: `get_emulated_dtype`) are taken as bf16.

use crate::dtype::Dtype;

crate::word_enum! {
    /// The element type the MXU multiplies a matmul in.
    pub enum MxuType {
        /// bf16 (and f32 operands rounded to it, and mixed or other types).
        Bf16 = "bf16",
        /// Both operands 8-bit integers.
        Int8 = "int8",
        /// Both operands 8-bit floats (either fp8 format).
        Fp8 = "fp8",
    }
}

/// The fp8 formats the MXU multiplies natively where the chip has fp8 (XLA's table lists these
/// two), by Mosaic's and JAX's names.
const NATIVE_FP8: &[&str] = &["f8e4m3fn", "float8_e4m3fn", "f8e5m2", "float8_e5m2"];

/// The type the MXU runs a matmul of operands typed `lhs` and `rhs` in (Mosaic or JAX names:
/// `i8`, `f8E4M3FN`, `bf16`, ...; module docs).
pub fn mxu_type(lhs: &str, rhs: &str) -> MxuType {
    let (l, r) = (lhs.trim().to_ascii_lowercase(), rhs.trim().to_ascii_lowercase());
    let int8 = |s: &str| s.parse::<Dtype>().ok() == Some(Dtype::I8);
    let fp8 = |s: &str| NATIVE_FP8.contains(&s);
    if int8(&l) && int8(&r) {
        MxuType::Int8
    } else if fp8(&l) && fp8(&r) {
        MxuType::Fp8
    } else {
        MxuType::Bf16
    }
}

crate::word_enum! {
    /// The precision a matmul asks for (`jax.lax.Precision`, Mosaic's `contract_precision`).
    pub enum Precision {
        /// One bf16 pass; f32 operands rounded to bf16.
        Default = "default" | "bf16" | "bfloat16" | "fastest",
        /// Three bf16 passes (bf16x3).
        High = "high" | "bf16x3" | "bf16_3x" | "bfloat16_3x" | "tensorfloat32",
        /// Six bf16 passes (full f32).
        Highest = "highest" | "fp32" | "float32",
    }
}

/// MXU passes of a matmul of `lhs` by `rhs` operands at `precision` (module docs): 1 unless an
/// operand is 32-bit, then 1, 3 or 6.
pub fn matmul_passes(lhs: Dtype, rhs: Dtype, precision: Precision) -> u64 {
    if lhs.bytes() < 4 && rhs.bytes() < 4 {
        return 1;
    }
    match precision {
        Precision::Default => 1,
        Precision::High => 3,
        Precision::Highest => 6,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eight_bit_types_only_when_both_operands_are() {
        assert_eq!(mxu_type("i8", "i8"), MxuType::Int8);
        assert_eq!(mxu_type("f8E4M3FN", "f8E4M3FN"), MxuType::Fp8);
        assert_eq!(mxu_type("float8_e5m2", "f8E4M3FN"), MxuType::Fp8);
        assert_eq!(mxu_type("bf16", "f8E4M3FN"), MxuType::Bf16);
        assert_eq!(mxu_type("i8", "bf16"), MxuType::Bf16);
        assert_eq!(mxu_type("f32", "f32"), MxuType::Bf16);
        assert_eq!(mxu_type("i4", "i4"), MxuType::Bf16);
        // fp8 formats outside XLA's table run as bf16 (emulated).
        assert_eq!(mxu_type("f8E4M3FNUZ", "f8E4M3FNUZ"), MxuType::Bf16);
        assert_eq!(mxu_type("f8E4M3", "f8E4M3"), MxuType::Bf16);
    }

    #[test]
    fn passes_by_operand_type_and_precision() {
        assert_eq!(matmul_passes(Dtype::Bf16, Dtype::Bf16, Precision::Highest), 1);
        assert_eq!(matmul_passes(Dtype::F32, Dtype::F32, Precision::Default), 1);
        assert_eq!(matmul_passes(Dtype::F32, Dtype::Bf16, Precision::High), 3);
        assert_eq!(matmul_passes(Dtype::F32, Dtype::F32, Precision::Highest), 6);
        assert_eq!("bf16_3x".parse::<Precision>().unwrap(), Precision::High);
        assert_eq!("fp32".parse::<Precision>().unwrap(), Precision::Highest);
    }
}
