//! Element types of the arrays a kernel holds in VMEM and feeds to the MXU ([`Dtype`]), with the
//! two facts the model needs of each: its width in bytes and its VMEM tile height.

crate::word_enum! {
    /// An element type, by the names Mosaic IR (`f32`, `bf16`, `i8`) and JAX (`float32`,
    /// `bfloat16`, `int8`) give it.
    pub enum Dtype {
        /// 32-bit float.
        F32 = "f32" | "float32",
        /// bfloat16.
        Bf16 = "bf16" | "bfloat16",
        /// IEEE half.
        F16 = "f16" | "float16",
        /// 32-bit integer (Splash's segment ids and q positions, index tables).
        I32 = "i32" | "int32",
        /// 16-bit integer.
        I16 = "i16" | "int16",
        /// 8-bit integer (Splash's partial mask blocks).
        I8 = "i8" | "int8" | "ui8" | "uint8",
        /// 8-bit float (any fp8 format: e4m3fn, e5m2 and the others JAX names).
        F8 = "f8" | "f8e4m3fn" | "f8e5m2" | "float8_e4m3fn" | "float8_e5m2" | "f8e4m3" | "float8_e4m3" | "f8e3m4"
            | "float8_e3m4" | "f8e4m3fnuz" | "float8_e4m3fnuz" | "f8e5m2fnuz" | "float8_e5m2fnuz" | "f8e4m3b11fnuz"
            | "float8_e4m3b11fnuz" | "f8e8m0fnu" | "float8_e8m0fnu",
    }
}

impl Dtype {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            Dtype::F32 | Dtype::I32 => 4,
            Dtype::Bf16 | Dtype::F16 | Dtype::I16 => 2,
            Dtype::I8 | Dtype::F8 => 1,
        }
    }

    /// Rows of one VMEM tile: a sublane holds 32 bits, so an (8, 128) tile of 32-bit data holds
    /// (16, 128) of 16-bit and (32, 128) of 8-bit data (jax-ml/jax `docs/pallas/tpu/details.rst`:
    /// VMEM arrays are tiled in (8, 128) 32-bit tiles; narrower types pack along sublanes).
    pub fn tile_rows(self) -> u64 {
        8 * (4 / self.bytes())
    }

    /// A type of `bytes` per element for VMEM tiling (4: f32, 2: bf16, 1: int8), when only the
    /// width is known; `None` for other widths.
    pub fn of_bytes(bytes: u64) -> Option<Dtype> {
        match bytes {
            4 => Some(Dtype::F32),
            2 => Some(Dtype::Bf16),
            1 => Some(Dtype::I8),
            _ => None,
        }
    }
}
