//! What each StableHLO op is and what it counts, before fusion.
//!
//! **Counts** follow XLA's `HloCostAnalysis` (openxla/xla `xla/service/hlo_cost_analysis.cc`), so
//! that they can be checked against `Lowered.cost_analysis()`: a dot 2 x batch x M x N x K FLOPs;
//! an element-wise op (and a convert) one FLOP per result element, or one transcendental for
//! `exponential`, `exponential_minus_one`, `log`, `log_plus_one`, `logistic`, `tanh`, `sqrt`,
//! `rsqrt`, `cbrt`, `power`, `sine`, `cosine`, `tan`, `atan2`, `erf`; a reduction (and an
//! all-reduce) (input elements - result elements) (all-reduce: result elements) times the ops of
//! its computation; data movement (transpose, broadcast, reshape, slice, concatenate, pad, iota,
//! ...) none. Bytes before fusion: every op reads its operands and writes its results.

use crate::desc::{Op, ProgramDescription};
use crate::ProgramError;
use serde::Serialize;

/// A collective's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CollectiveKind {
    /// `all_gather`.
    AllGather,
    /// `all_reduce`.
    AllReduce,
    /// `reduce_scatter`.
    ReduceScatter,
    /// `all_to_all`.
    AllToAll,
    /// `collective_permute` (`lax.ppermute`).
    CollectivePermute,
}

/// What an op is, for fusion and timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OpClass {
    /// `dot_general`: on the MXU.
    Dot,
    /// An element-wise op or convert (fusible).
    Elementwise,
    /// An element-wise op XLA counts as transcendental (fusible).
    Transcendental,
    /// Data movement that XLA fuses (transpose, broadcast, slice, concatenate, pad, iota, ...).
    Movement,
    /// A reshape: a bitcast of its operand (no work, no bytes after fusion).
    Bitcast,
    /// A reduction (fusible as the root of a fusion).
    Reduce,
    /// A collective on the ICI.
    Collective(CollectiveKind),
    /// A Pallas kernel (`tpu_custom_call`): the index of its description.
    Kernel(usize),
    /// A `shard_map` boundary (no work).
    Boundary,
}

const ELEMENTWISE: &[&str] = &[
    "add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum", "negate", "abs", "sign", "compare", "select", "clamp",
    "and", "or", "xor", "not", "floor", "ceil", "round_nearest_even", "round_nearest_afz", "convert", "is_finite",
    "shift_left", "shift_right_arithmetic", "shift_right_logical", "popcnt", "count_leading_zeros", "real", "imag",
    "bitcast_convert", "map",
];

const TRANSCENDENTAL: &[&str] = &[
    "exponential", "exponential_minus_one", "log", "log_plus_one", "logistic", "tanh", "sqrt", "rsqrt", "cbrt", "power", "sine", "cosine",
    "tan", "atan2", "erf",
];

const MOVEMENT: &[&str] = &[
    "transpose", "broadcast_in_dim", "broadcast", "slice", "dynamic_slice", "dynamic_update_slice", "concatenate", "pad", "iota", "reverse", "copy",
];

/// Classifies an op.
///
/// # Errors
/// [`ProgramError::Op`] naming the op and its location for an op tpusim does not model (control
/// flow, gathers and scatters, sorts, custom calls other than Pallas kernels, ...): never free.
pub fn classify(op: &Op, kernels: usize) -> Result<OpClass, ProgramError> {
    let name = op.op.as_str();
    Ok(match name {
        "dot_general" | "dot" => OpClass::Dot,
        "reshape" => OpClass::Bitcast,
        "reduce" => OpClass::Reduce,
        "shard" | "unshard" => OpClass::Boundary,
        "all_gather" => OpClass::Collective(CollectiveKind::AllGather),
        "all_reduce" => OpClass::Collective(CollectiveKind::AllReduce),
        "reduce_scatter" => OpClass::Collective(CollectiveKind::ReduceScatter),
        "all_to_all" => OpClass::Collective(CollectiveKind::AllToAll),
        "collective_permute" => OpClass::Collective(CollectiveKind::CollectivePermute),
        "custom_call" => {
            let target = op.attrs.get("target").and_then(|v| v.as_str()).unwrap_or("");
            if target != "tpu_custom_call" {
                return Err(op.error(format!(
                    "a custom call to `{target}`: tpusim simulates Pallas kernels (`tpu_custom_call`) only, and no other custom call is free"
                )));
            }
            let k = op.attrs.get("kernel").and_then(|v| v.as_u64()).ok_or_else(|| op.error("a tpu_custom_call without `attrs.kernel`"))?;
            if k as usize >= kernels {
                return Err(op.error(format!("`attrs.kernel` = {k}: the description has {kernels} kernels")));
            }
            OpClass::Kernel(k as usize)
        }
        n if ELEMENTWISE.contains(&n) => OpClass::Elementwise,
        n if TRANSCENDENTAL.contains(&n) => OpClass::Transcendental,
        n if MOVEMENT.contains(&n) => OpClass::Movement,
        n => {
            return Err(op.error(format!(
                "`{n}` is not an op tpusim models (it simulates dots, element-wise ops, converts, data movement, reductions, the \
                 collectives all_gather / all_reduce / reduce_scatter / all_to_all / collective_permute and Pallas kernels; \
                 control flow, gathers, scatters and sorts are not modelled)"
            )))
        }
    })
}

/// An op's counts before fusion.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct OpCounts {
    /// FLOPs (module docs).
    pub flops: f64,
    /// Transcendental element operations.
    pub transcendentals: f64,
    /// Operand bytes plus result bytes.
    pub bytes: u64,
}

impl std::ops::AddAssign for OpCounts {
    fn add_assign(&mut self, o: OpCounts) {
        self.flops += o.flops;
        self.transcendentals += o.transcendentals;
        self.bytes += o.bytes;
    }
}

/// (batch, M, N, K) of a `dot_general` from its operand shapes and dimension numbers.
///
/// # Errors
/// [`ProgramError::Op`] when the dimension numbers name dimensions the operands lack.
pub fn dot_dims(d: &ProgramDescription, op: &Op) -> Result<(u64, u64, u64, u64), ProgramError> {
    if op.operands.len() != 2 || op.results.len() != 1 {
        return Err(op.error("a dot needs two operands and one result"));
    }
    let lhs = &d.values[op.operands[0]].shape;
    let rhs = &d.values[op.operands[1]].shape;
    let pick = |shape: &[u64], dims: &[u64], which: &str| -> Result<u64, ProgramError> {
        dims.iter().try_fold(1u64, |acc, &i| {
            shape.get(i as usize).map(|s| acc * s).ok_or_else(|| op.error(format!("{which} dimension {i} of a rank-{} operand", shape.len())))
        })
    };
    let batch = pick(lhs, &op.ints("lhs_batching_dimensions")?, "lhs batching")?;
    let k = pick(lhs, &op.ints("lhs_contracting_dimensions")?, "lhs contracting")?;
    let bk = (batch * k).max(1);
    let m = lhs.iter().product::<u64>() / bk;
    let n = rhs.iter().product::<u64>() / bk;
    Ok((batch, m, n, k))
}

/// The counts of an op of class `class` (module docs).
///
/// # Errors
/// [`ProgramError::Op`] from [`dot_dims`], or an unknown element type.
pub fn counts(d: &ProgramDescription, op: &Op, class: OpClass) -> Result<OpCounts, ProgramError> {
    let mut bytes = 0;
    for &v in op.operands.iter().chain(&op.results) {
        bytes += d.values[v].bytes()?;
    }
    let out: u64 = op.results.iter().map(|&v| d.values[v].elements()).sum();
    let computation_ops = || op.attrs.get("computation").and_then(|v| v.as_array()).map_or(1, |a| a.len().max(1)) as f64;
    let (flops, transcendentals) = match class {
        OpClass::Dot => {
            let (b, m, n, k) = dot_dims(d, op)?;
            (2.0 * (b * m * n * k) as f64, 0.0)
        }
        OpClass::Elementwise => (out as f64, 0.0),
        OpClass::Transcendental => (0.0, out as f64),
        OpClass::Reduce => {
            // Variadic reductions: the first half of the operands are the inputs.
            let half = (op.operands.len() / 2).max(1);
            let input: u64 = op.operands.iter().take(half).map(|&v| d.values[v].elements()).sum::<u64>() / half as u64;
            let per = op.results.iter().map(|&v| d.values[v].elements()).max().unwrap_or(1);
            (input.saturating_sub(per) as f64 * computation_ops(), 0.0)
        }
        OpClass::Collective(CollectiveKind::AllReduce) => (out as f64 * computation_ops(), 0.0),
        _ => (0.0, 0.0),
    };
    Ok(OpCounts { flops, transcendentals, bytes })
}
