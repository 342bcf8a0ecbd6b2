//! XLA's own dot (not a Pallas kernel) as the kernel crate's `xla-matmul` family: a blocked
//! matmul on the MXUs whose efficiency the `XLA-MM-v6e-*` calibration rows pin. Its output tiles
//! are the family's default size at most, balanced over the dimension (the fewest tiles that pad
//! it by at most 1%: a 18,900-row operand as 10 tiles of 1,896 rows, not 10 of 2,048 with 8%
//! padding); the (8, 128) rules round them up; on a chip whose VMEM the tiling overflows, the
//! output tiles are halved until it fits (XLA always finds a tiling that fits).

use crate::SliceError;
use tpusim_kernel::{matmul, Kernel, MatmulConfig, Program};
use tpusim_workload::MatmulCall;

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
pub fn xla_matmul_config(chip: &tpusim_chip::ChipModel, mm: &MatmulCall, cap_m: u64, cap_n: u64) -> MatmulConfig {
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

/// Lowers a matmul as XLA's dot (module docs): its configuration and program.
///
/// # Errors
/// [`SliceError::Op`] naming `name` when even 128 x 128 tiles do not fit, or the sizes are
/// invalid.
pub fn lower_xla_matmul(chip: &tpusim_chip::ChipModel, mm: &MatmulCall, name: &str) -> Result<(MatmulConfig, Program), SliceError> {
    let d = Kernel::XlaMatmul.defaults().blocks;
    let (mut cap_m, mut cap_n) = (d.q, d.kv);
    loop {
        let cfg = xla_matmul_config(chip, mm, cap_m, cap_n);
        match matmul::lower(chip, mm, &cfg) {
            Ok(p) => return Ok((cfg, p)),
            Err(tpusim_kernel::KernelError::Vmem { .. }) if cap_m > 128 || cap_n > 128 => {
                if cap_m >= cap_n {
                    cap_m /= 2;
                } else {
                    cap_n /= 2;
                }
            }
            Err(e) => return Err(SliceError::Op { op: name.into(), message: e.to_string() }),
        }
    }
}
