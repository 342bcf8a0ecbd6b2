//! The program description file (`PROGRAM.md` beside this crate): what `tpusim.jax` reads from
//! an export's StableHLO. Strictly read: unknown keys, a wrong format or version, value ids out
//! of range and kernels that do not parse are errors naming the field.

use crate::ProgramError;
use serde::Deserialize;
use std::collections::BTreeMap;

/// The format name in the `format` field.
pub const FORMAT: &str = "tpusim-program-description";

/// The version this reader reads. A reader accepts exactly its version: a field added or a
/// meaning changed makes a new version (PROGRAM.md, "Versions").
pub const VERSION: u32 = 1;

/// A whole program: its values, ops in program order and the Pallas kernels it calls.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProgramDescription {
    /// Always [`FORMAT`].
    pub format: String,
    /// Always [`VERSION`].
    pub version: u32,
    /// Who wrote it (a label).
    pub producer: BTreeMap<String, String>,
    /// The `sdy.mesh` axes as (name, devices), in order; empty without `shard_map`.
    pub mesh: Vec<(String, u64)>,
    /// Every value (tensor) by id: its shape and dtype.
    pub values: Vec<Value>,
    /// The program's arguments (value ids).
    pub inputs: Vec<usize>,
    /// The program's results (value ids).
    pub outputs: Vec<usize>,
    /// The ops in program order.
    pub ops: Vec<Op>,
    /// The kernel descriptions of the Pallas calls (`crates/tpusim-pallas/DESCRIPTION.md`),
    /// referenced by `custom_call` ops' `attrs.kernel`.
    pub kernels: Vec<serde_json::Value>,
}

/// Where a value comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ValueKind {
    /// An argument of the program (in HBM at the start).
    Argument,
    /// A constant (a literal in HBM).
    Constant,
    /// A `shard_map` body's argument: one device's shard of an operand.
    Shard,
    /// An op's result.
    Result,
}

/// A tensor value.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Value {
    /// Dimensions (empty: a scalar).
    pub shape: Vec<u64>,
    /// Element type as MLIR prints it: `f32`, `bf16`, `i32`, `i1`, ...
    pub dtype: String,
    /// Where it comes from.
    pub kind: ValueKind,
}

impl Value {
    /// Elements.
    pub fn elements(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Bytes (elements x element bytes; `i1` as one byte, as XLA stores `pred`).
    ///
    /// # Errors
    /// [`ProgramError::Description`] for an element type this reader does not know.
    pub fn bytes(&self) -> Result<u64, ProgramError> {
        Ok(self.elements() * dtype_bytes(&self.dtype)?)
    }
}

/// Bytes of one element of `dtype`.
///
/// # Errors
/// [`ProgramError::Description`] naming `values[].dtype` for an unknown type.
pub fn dtype_bytes(dtype: &str) -> Result<u64, ProgramError> {
    Ok(match dtype {
        "f64" | "i64" | "ui64" | "complex<f32>" => 8,
        "f32" | "i32" | "ui32" => 4,
        "bf16" | "f16" | "i16" | "ui16" => 2,
        "i8" | "ui8" | "i1" | "f8E4M3FN" | "f8E5M2" | "f8E4M3FNUZ" | "f8E5M2FNUZ" | "f8E4M3B11FNUZ" => 1,
        other => {
            return Err(ProgramError::Description {
                field: "values[].dtype".into(),
                message: format!("{other:?}: not an element type tpusim knows (f64, f32, bf16, f16, f8*, i64, i32, i16, i8, i1)"),
            })
        }
    })
}

/// One op of the program.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Op {
    /// The StableHLO op name without `stablehlo.` (`dot_general`, `add`, `all_gather`, ...),
    /// or `shard` / `unshard` at a `shard_map` body's boundary.
    pub op: String,
    /// Operand value ids.
    pub operands: Vec<usize>,
    /// Result value ids.
    pub results: Vec<usize>,
    /// `file.py:LINE` of the user's code.
    pub location: String,
    /// Inside a `shard_map` body (per-device shapes).
    pub sharded: bool,
    /// The op's attributes this reader uses (dimension numbers, reduce dimensions, replica
    /// groups, source-target pairs, the kernel index of a Pallas call, ...).
    #[serde(default)]
    pub attrs: BTreeMap<String, serde_json::Value>,
}

impl Op {
    /// An integer list attribute (e.g. `lhs_contracting_dimensions`), empty when absent.
    ///
    /// # Errors
    /// [`ProgramError::Op`] when present but not a list of non-negative integers.
    pub fn ints(&self, key: &str) -> Result<Vec<u64>, ProgramError> {
        match self.attrs.get(key) {
            None => Ok(Vec::new()),
            Some(v) => serde_json::from_value(v.clone()).map_err(|_| self.error(format!("attribute `{key}` = {v}: expected a list of non-negative integers"))),
        }
    }

    /// A list-of-lists integer attribute (replica groups, source-target pairs), empty when absent.
    ///
    /// # Errors
    /// [`ProgramError::Op`] when present but not a list of lists of non-negative integers.
    pub fn groups(&self, key: &str) -> Result<Vec<Vec<u64>>, ProgramError> {
        match self.attrs.get(key) {
            None => Ok(Vec::new()),
            Some(v) => serde_json::from_value(v.clone())
                .map_err(|_| self.error(format!("attribute `{key}` = {v}: expected a list of lists of device ids"))),
        }
    }

    /// An error naming this op and its location.
    pub fn error(&self, message: impl Into<String>) -> ProgramError {
        ProgramError::Op { op: self.op.clone(), location: self.location.clone(), message: message.into() }
    }
}

impl ProgramDescription {
    /// Parses and checks a description (`origin` names it in errors).
    ///
    /// # Errors
    /// [`ProgramError::Description`] for malformed JSON, unknown keys, a wrong format or version,
    /// or a value id or kernel index out of range.
    pub fn from_json(text: &str, origin: &str) -> Result<Self, ProgramError> {
        let d: ProgramDescription = serde_json::from_str(text)
            .map_err(|e| ProgramError::Description { field: origin.into(), message: format!("not a program description: {e}") })?;
        if d.format != FORMAT {
            return Err(ProgramError::Description { field: "format".into(), message: format!("{:?}: expected {FORMAT:?}", d.format) });
        }
        if d.version != VERSION {
            return Err(ProgramError::Description {
                field: "version".into(),
                message: format!("{}: this tpusim reads version {VERSION} (write the description with the tpusim.jax of the same release)", d.version),
            });
        }
        let n = d.values.len();
        let bad = |field: &str, id: usize| ProgramError::Description {
            field: field.into(),
            message: format!("value id {id}: out of range (the description has {n} values)"),
        };
        for &i in d.inputs.iter() {
            if i >= n {
                return Err(bad("inputs", i));
            }
        }
        for &i in d.outputs.iter() {
            if i >= n {
                return Err(bad("outputs", i));
            }
        }
        for (k, op) in d.ops.iter().enumerate() {
            for &i in op.operands.iter().chain(&op.results) {
                if i >= n {
                    return Err(bad(&format!("ops[{k}] ({} at {})", op.op, op.location), i));
                }
            }
        }
        for v in &d.values {
            dtype_bytes(&v.dtype)?;
        }
        if let Some((name, _)) = d.mesh.iter().find(|(_, s)| *s == 0) {
            return Err(ProgramError::Description { field: "mesh".into(), message: format!("axis {name:?} has 0 devices") });
        }
        Ok(d)
    }
}
