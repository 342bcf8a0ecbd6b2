//! The kernel description file: one Pallas kernel as its Mosaic IR describes it (format in
//! `crates/tpusim-pallas/DESCRIPTION.md`). Read with serde; every field is checked and an error
//! names the field, the value and what is allowed.

use crate::expr::Expr;
use crate::PallasError;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The format's name, in the file's `format` field.
pub const FORMAT: &str = "tpusim-kernel-description";

/// The version this reader reads. Bump it when a field changes meaning or a required field is
/// added (DESCRIPTION.md, "Versions"); optional fields with a default that keeps old files'
/// meaning do not bump it.
pub const VERSION: u64 = 1;

/// A whole description file: one Pallas kernel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Description {
    /// Always [`FORMAT`].
    pub format: String,
    /// Always [`VERSION`] for this reader.
    pub version: u64,
    /// The custom call's `kernel_name` (a label only: never dispatched on).
    pub kernel_name: String,
    /// The custom call's `kernel_metadata` (a label only), if any.
    #[serde(default)]
    pub kernel_metadata: Option<String>,
    /// The library kernel family it is (a label: the error band a report quotes; never read by
    /// the simulation), as `tpusim.jax.describe` recognised it or was told (`family=`); absent:
    /// recognised when read ([`crate::family`]) or none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub family: Option<String>,
    /// Who wrote the file and for which device (labels).
    #[serde(default)]
    pub producer: Producer,
    /// The grid's extents (`iteration_bounds`), outermost first.
    pub grid: Vec<u64>,
    /// Per grid dimension: `parallel` or `arbitrary` (`dimension_semantics`).
    pub dimension_semantics: Vec<DimSemantics>,
    /// The scoped VMEM limit from the custom call's `scoped_memory_configs`, bytes; absent: the
    /// chip's default.
    #[serde(default)]
    pub vmem_limit_bytes: Option<u64>,
    /// The `pl.CostEstimate` the kernel declares, if any.
    #[serde(default)]
    pub cost_estimate: Option<DeclaredCost>,
    /// The kernel function's arguments after the grid indices, in order: scalar-prefetch refs,
    /// the windows of inputs and outputs, then scratch.
    pub refs: Vec<Ref>,
    /// The kernel body: ops and control flow.
    pub body: Vec<Op>,
    /// What the body allocates in scoped regions (`pl.run_scoped`, and so
    /// `pltpu.emit_pipeline`'s buffers and semaphores), by the ids copies name them with
    /// (`src_alloc`, `dst_alloc`, `sem_alloc`); empty when none (or not recorded).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allocations: Vec<Allocation>,
}

/// A buffer or semaphore array the body allocates (`memref.alloca`, `tpu.sem_alloc`).
/// `pltpu.emit_pipeline` allocates one buffer per pipelined window, its first dimension the
/// window's buffer count (`pl.Buffered(n)`), and its copies fill one slot each.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Allocation {
    /// The id copies and waits name it by.
    pub id: u64,
    /// Its shape.
    pub shape: Vec<u64>,
    /// Element type (a semaphore type for semaphores).
    pub dtype: String,
    /// Where it lives.
    pub memory_space: MemorySpace,
    /// `file:line` of the allocation, for messages.
    #[serde(default)]
    pub loc: String,
}

/// Labels of the program that wrote the file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Producer {
    /// Tool, e.g. `tpusim.jax`.
    #[serde(default)]
    pub tool: String,
    /// JAX version that lowered the kernel.
    #[serde(default)]
    pub jax: String,
    /// The device kind it was lowered for (`TPU v6 lite`).
    #[serde(default)]
    pub device_kind: String,
    /// `stable_mosaic.version` of the IR.
    #[serde(default)]
    pub mosaic_version: Option<u64>,
}

/// A copy's `src_space` or `dst_space` (`key`): the memory space it names, as a ref's
/// `memory_space` is written; `None` when absent or not one.
fn dma_space(op: &Op, key: &str) -> Option<MemorySpace> {
    op.attrs.get(key).and_then(|v| serde_json::from_value(v.clone()).ok())
}

/// Where a copy's data goes: whether it reads from HBM and whether it writes to HBM (`any`), by
/// its `src_space` and `dst_space`; a description written before they were recorded names its
/// source ref (`src_ref`), whose memory space says where it reads, and the copy is taken to go
/// to the other side (HBM to VMEM, or VMEM to HBM).
pub fn dma_path(op: &Op, refs: &[Ref]) -> tpusim_model::DmaPath {
    let hbm = |s: Option<MemorySpace>| s.map(|m| m == MemorySpace::Any);
    let src_ref = op.attrs.get("src_ref").and_then(|v| v.as_u64()).and_then(|r| refs.get(r as usize)).map(|r| r.memory_space == MemorySpace::Any);
    let src = hbm(dma_space(op, "src_space")).or(src_ref).unwrap_or(true);
    let dst = hbm(dma_space(op, "dst_space")).unwrap_or(!src);
    tpusim_model::DmaPath::of(src, dst)
}

/// The JAX device kinds a kernel is lowered for, with the chip preset of each (the strings
/// `jax._src.pallas.mosaic.tpu_info.chip_version_from_device_kind` maps to each generation;
/// `tpusim.jax.DEVICE_KINDS` lists the same).
pub const DEVICE_KINDS: &[(&str, &str)] = &[("TPU v4", "v4"), ("TPU v5 lite", "v5e"), ("TPU v5p", "v5p"), ("TPU v6 lite", "v6e"), ("TPU7x", "v7x")];

/// The most grid steps a description may have (2^32): the lowering evaluates every step's path.
pub const MAX_GRID_STEPS: u64 = 1 << 32;

/// A grid dimension's semantics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DimSemantics {
    /// Iterations are independent: a megacore device splits them over its TensorCores.
    Parallel,
    /// Iterations run in order on one core.
    Arbitrary,
    /// Split over cores explicitly (`pltpu.CORE_PARALLEL`); treated as parallel.
    CoreParallel,
}

/// A kernel declared cost (`pl.CostEstimate`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeclaredCost {
    /// FLOPs.
    pub flops: f64,
    /// Transcendental elements.
    pub transcendentals: f64,
    /// Bytes accessed.
    pub bytes_accessed: f64,
}

/// What a kernel argument is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefKind {
    /// A scalar-prefetch table in SMEM (index maps and the body read it).
    Prefetch,
    /// A window (BlockSpec) of an input array.
    Input,
    /// A window of an output array.
    Output,
    /// Scratch the kernel keeps across grid steps.
    Scratch,
}

/// Where a ref lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemorySpace {
    /// Vector memory (windows are DMA'd here by the pipeline).
    Vmem,
    /// Scalar memory.
    Smem,
    /// Left in HBM (`pl.ANY`): no window, the kernel copies it itself.
    Any,
    /// DMA or barrier semaphores.
    Semaphore,
}

/// A window's pipelining (`pipeline_mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PipelineMode {
    /// Double-buffered (Pallas's default).
    #[default]
    Double,
    /// One buffer (`tpu.pipeline_mode<synchronous>`, `pl.Buffered(1)`).
    Synchronous,
    /// `pl.Buffered(n)`.
    Buffered(u64),
}

impl PipelineMode {
    /// VMEM buffers the window holds.
    pub fn buffers(self) -> u64 {
        match self {
            PipelineMode::Double => 2,
            PipelineMode::Synchronous => 1,
            PipelineMode::Buffered(n) => n,
        }
    }
}

/// Values of a table in SMEM: a scalar-prefetch ref's, or an SMEM input's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Values {
    /// The values in row-major order.
    Inline(Vec<i64>),
    /// A `.npy` side file (path relative to the description file) of integers in `shape`.
    File(String),
    /// Not known when the kernel was lowered: a runtime input, named as the operand. Simulating
    /// a kernel whose index maps or branches read it is an error naming it.
    Runtime(String),
}

/// One argument of the kernel function after the grid indices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ref {
    /// Name for messages (`q`, `arg5`, `prefetch 0`).
    pub name: String,
    /// What it is.
    pub kind: RefKind,
    /// The ref's shape in the kernel (a window's block shape, squeezed dimensions as 1).
    pub shape: Vec<u64>,
    /// Element type: `bf16`, `f32`, `i32`, `i8`, ...
    pub dtype: String,
    /// Memory space.
    pub memory_space: MemorySpace,
    /// Windows: the whole operand's shape in HBM.
    #[serde(default)]
    pub array_shape: Option<Vec<u64>>,
    /// Windows: the block index per dimension as expressions over grid indices and prefetch
    /// values (block units: element offset = index x block shape).
    #[serde(default)]
    pub index_map: Option<Vec<Expr>>,
    /// Windows: pipelining.
    #[serde(default)]
    pub pipeline_mode: PipelineMode,
    /// Tables the call passes: the values of a prefetch ref (required) or of an input in SMEM
    /// (a grid-less `pallas_call`'s or a `pl.kernel`'s `pltpu.SMEM` operand; optional: without
    /// them a read of it is not evaluated).
    #[serde(default)]
    pub values: Option<Values>,
}

impl Ref {
    /// Whether the ref is a table whose values a description may hold ([`Ref::values`]): a
    /// scalar-prefetch ref, or an input in SMEM.
    pub fn holds_table(&self) -> bool {
        self.kind == RefKind::Prefetch || (self.kind == RefKind::Input && self.memory_space == MemorySpace::Smem)
    }
}

/// An operand of an op.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Operand {
    /// The result of the op with this id.
    Op(u64),
    /// A kernel ref (index into `refs`), for loads and stores.
    Ref(usize),
    /// A scalar value as an expression.
    Scalar(Expr),
    /// Something the lowering does not track (a scalar from a runtime value, a block argument).
    Other,
}

/// One op of the kernel body, or a control-flow region.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Op {
    /// Unique id within the kernel (results are referred to by it).
    #[serde(default)]
    pub id: u64,
    /// The MLIR op name: `tpu.matmul`, `arith.addf`, `scf.if`, ...
    pub op: String,
    /// Result shape (vector ops), empty for scalars and ops without results.
    #[serde(default)]
    pub shape: Vec<u64>,
    /// Result element type.
    #[serde(default)]
    pub dtype: String,
    /// Operands.
    #[serde(default)]
    pub operands: Vec<Operand>,
    /// Source location (`file:line`), for messages.
    #[serde(default)]
    pub loc: String,
    /// Op-specific attributes (see DESCRIPTION.md): `dims` (iota, reduction), `mkn` and
    /// `lhs_dtype` / `rhs_dtype` / `precision` (matmul), `bytes` (DMA), ...
    #[serde(default)]
    pub attrs: serde_json::Map<String, serde_json::Value>,
    /// `scf.if`: the condition.
    #[serde(default)]
    pub cond: Option<Expr>,
    /// `scf.if`: the then-region; `scf.for`: the loop body.
    #[serde(default)]
    pub then: Vec<Op>,
    /// `scf.if`: the else-region.
    #[serde(default, rename = "else")]
    pub otherwise: Vec<Op>,
    /// `scf.for`: bounds and step.
    #[serde(default)]
    pub lower: Option<Expr>,
    /// `scf.for`: upper bound (exclusive).
    #[serde(default)]
    pub upper: Option<Expr>,
    /// `scf.for`: step.
    #[serde(default)]
    pub step: Option<Expr>,
    /// The op's expression attributes parsed once ([`Op::attr_exprs`]): an op runs in many
    /// grid steps, and a serving kernel's copy sizes are large expressions.
    #[serde(skip)]
    pub parsed: ParsedAttrs,
}

/// Parsed expressions of one attribute ([`ParsedAttrs`]).
type Parsed = std::sync::Arc<Vec<Expr>>;

/// The expression attributes of an [`Op`] (`bytes`, `value`, `index`, `src_offsets`,
/// `src_shape`, `init`, `forward`, `yield`), each parsed on first use and kept. Part of no
/// comparison: two ops are equal whatever they have parsed.
#[derive(Clone, Default)]
pub struct ParsedAttrs(std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<String, Parsed>>>);

impl PartialEq for ParsedAttrs {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for ParsedAttrs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ParsedAttrs")
    }
}

impl Op {
    /// Where the op is in the kernel's source, for messages: its `loc`, or "(no location)".
    pub fn place(&self) -> &str {
        if self.loc.is_empty() {
            "(no location)"
        } else {
            &self.loc
        }
    }

    /// `attrs[key]` as expressions (one for a single expression such as `bytes`, the list's for
    /// a list), parsed on first use; `None` when the op has no such attribute.
    ///
    /// # Errors
    /// [`PallasError::Field`] naming the op, its location and the attribute when it is not an
    /// expression (or a list of them).
    pub fn attr_exprs(&self, key: &str) -> Result<Option<Parsed>, PallasError> {
        let Some(v) = self.attrs.get(key) else { return Ok(None) };
        let mut cache = self.parsed.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(p) = cache.get(key) {
            return Ok(Some(p.clone()));
        }
        let parsed = match v {
            serde_json::Value::Array(items) if items.first().is_none_or(|x| !x.is_string()) => serde_json::from_value::<Vec<Expr>>(v.clone()),
            _ => serde_json::from_value::<Expr>(v.clone()).map(|e| vec![e]),
        }
        .map_err(|e| PallasError::field(&format!("{} at {}: attrs.{key}", self.op, self.loc), v, e.to_string()))?;
        let parsed = std::sync::Arc::new(parsed);
        cache.insert(key.to_string(), parsed.clone());
        Ok(Some(parsed))
    }
}

/// Bytes of one element of `dtype`.
///
/// # Errors
/// [`PallasError::Field`] for an unknown type.
pub fn dtype_bytes(dtype: &str, field: &str) -> Result<u64, PallasError> {
    Ok(match dtype {
        "f64" | "i64" | "ui64" | "index" => 8,
        "f32" | "i32" | "ui32" | "tf32" => 4,
        "bf16" | "f16" | "i16" | "ui16" => 2,
        "i8" | "ui8" | "f8E4M3FN" | "f8E5M2" | "f8E4M3B11FNUZ" | "f8E4M3FNUZ" | "f8E5M2FNUZ" => 1,
        // Sub-byte and mask types are stored in bytes at least.
        "i1" | "i4" | "ui4" | "f4E2M1FN" => 1,
        // DMA and barrier semaphores (SMEM words).
        "!tpu.dma_semaphore" | "!tpu.semaphore" => 4,
        _ => {
            return Err(PallasError::field(
                field,
                dtype,
                "expected an element type: f32, bf16, f16, i32, i16, i8, f8E4M3FN, f8E5M2, i4, i1",
            ))
        }
    })
}

impl Description {
    /// Parses a description from JSON text; `path` names it in errors and side files are
    /// resolved against its folder.
    ///
    /// # Errors
    /// [`PallasError::Json`] for malformed JSON or unknown fields, [`PallasError::Version`] for
    /// another format version, [`PallasError::Field`] for invalid values.
    pub fn from_json(text: &str, path: &str) -> Result<Description, PallasError> {
        // The version first, so that a file of another version says so rather than failing on
        // a field this reader does not know.
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| PallasError::Json { path: path.to_string(), message: e.to_string() })?;
        match v.get("format").and_then(|f| f.as_str()) {
            Some(FORMAT) => {}
            other => {
                return Err(PallasError::field(
                    "format",
                    other.map(|s| format!("\"{s}\"")).unwrap_or_else(|| "(missing)".into()),
                    format!("expected \"{FORMAT}\": {path} is not a kernel description"),
                ))
            }
        }
        match v.get("version").and_then(|x| x.as_u64()) {
            Some(VERSION) => {}
            found => {
                return Err(PallasError::Version {
                    path: path.to_string(),
                    found: found.map(|f| f.to_string()).unwrap_or_else(|| "(missing)".into()),
                })
            }
        }
        // Sizes must be whole numbers: refused by name before the typed read, whose message
        // ("invalid value: integer `-1`, expected u64") would not name the field.
        let whole = |field: String, x: &serde_json::Value| -> Result<(), PallasError> {
            if x.is_null() || x.as_u64().is_some() {
                return Ok(());
            }
            Err(PallasError::field(&field, x, "expected a whole number from 0 (a size)"))
        };
        if let Some(x) = v.get("vmem_limit_bytes") {
            whole("vmem_limit_bytes".into(), x)?;
        }
        if let Some(refs) = v.get("refs").and_then(|r| r.as_array()) {
            for (i, r) in refs.iter().enumerate() {
                for key in ["shape", "array_shape"] {
                    if let Some(a) = r.get(key).and_then(|a| a.as_array()) {
                        for (k, x) in a.iter().enumerate() {
                            whole(format!("refs[{i}].{key}[{k}]"), x)?;
                        }
                    }
                }
            }
        }
        // A grid dimension sized at run time (MLIR's dynamic marker, i64::MIN, or any negative
        // number) is refused by name before the typed read, whose message would not name it.
        if let Some(g) = v.get("grid").and_then(|g| g.as_array()) {
            for (i, x) in g.iter().enumerate() {
                if x.as_i64().is_none() && x.as_u64().is_none() {
                    return Err(PallasError::field(&format!("grid[{i}]"), x, "expected a whole number from 1"));
                }
                if let Some(n) = x.as_i64().filter(|&n| n < 0) {
                    let kernel = v.get("kernel_name").and_then(|k| k.as_str()).unwrap_or("?");
                    return Err(PallasError::field(
                        &format!("grid[{i}]"),
                        n,
                        format!("a whole number from 1: kernel `{kernel}`'s grid dimension {i} is sized at run time (a dynamic grid); describe it with `tpusim.jax.describe` and concrete arguments, which evaluates the size, or write the size the call runs with"),
                    ));
                }
            }
        }
        let d: Description = serde_json::from_value(v).map_err(|e| PallasError::Json { path: path.to_string(), message: e.to_string() })?;
        d.check()?;
        Ok(d)
    }

    /// Reads a description file: JSON, or JSON compressed with gzip (told by its first bytes,
    /// whatever its name; `tpusim.jax.describe` writes one for a path ending in `.gz`).
    ///
    /// # Errors
    /// [`PallasError::Io`] when it cannot be read or decompressed, else as
    /// [`Description::from_json`].
    pub fn read(path: &Path) -> Result<(Description, PathBuf), PallasError> {
        let io = |e: std::io::Error| PallasError::Io { path: path.display().to_string(), message: e.to_string() };
        let bytes = std::fs::read(path).map_err(io)?;
        let text = if bytes.starts_with(&[0x1f, 0x8b]) {
            use std::io::Read;
            let mut t = String::new();
            flate2::read::MultiGzDecoder::new(&bytes[..]).read_to_string(&mut t).map_err(io)?;
            t
        } else {
            String::from_utf8(bytes).map_err(|e| PallasError::Json { path: path.display().to_string(), message: not_text(e.as_bytes()) })?
        };
        let d = Description::from_json(&text, &path.display().to_string())?;
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Ok((d, dir))
    }

    /// Checks the fields this reader relies on.
    fn check(&self) -> Result<(), PallasError> {
        if let Some(f) = &self.family {
            if !crate::family::is_word(f) {
                return Err(PallasError::field("family", format!("\"{f}\""), crate::family::WORD_RULE));
            }
        }
        let kind = &self.producer.device_kind;
        if !kind.is_empty() && !DEVICE_KINDS.iter().any(|(k, _)| k == kind) {
            return Err(PallasError::field(
                "producer.device_kind",
                format!("\"{kind}\""),
                format!("expected one of the JAX device kinds {} (or \"\": not stated)", DEVICE_KINDS.iter().map(|(k, c)| format!("\"{k}\" ({c})")).collect::<Vec<_>>().join(", ")),
            ));
        }
        for (i, &g) in self.grid.iter().enumerate() {
            if g == 0 {
                return Err(PallasError::field(&format!("grid[{i}]"), g, "expected a whole number from 1"));
            }
        }
        // Every grid step's path is evaluated: a grid past 2^32 steps (or one whose step count
        // overflows) is refused rather than counted wrapped.
        let steps = self.grid.iter().try_fold(1u64, |a, &g| a.checked_mul(g));
        if steps.is_none_or(|n| n > MAX_GRID_STEPS) {
            return Err(PallasError::field(
                "grid",
                format!("{:?} ({} steps)", self.grid, steps.map_or("more than 2^64".to_string(), |n| n.to_string())),
                format!("at most {MAX_GRID_STEPS} grid steps (each step's path through the body is evaluated)"),
            ));
        }
        if self.dimension_semantics.len() != self.grid.len() && !self.dimension_semantics.is_empty() {
            return Err(PallasError::field(
                "dimension_semantics",
                format!("{} entries", self.dimension_semantics.len()),
                format!("expected one per grid dimension ({})", self.grid.len()),
            ));
        }
        for (i, r) in self.refs.iter().enumerate() {
            let f = format!("refs[{i}] ({})", r.name);
            dtype_bytes(&r.dtype, &format!("{f}.dtype"))?;
            let windowed = matches!(r.kind, RefKind::Input | RefKind::Output) && r.memory_space != MemorySpace::Any;
            if windowed {
                let im = r
                    .index_map
                    .as_ref()
                    .ok_or_else(|| PallasError::field(&format!("{f}.index_map"), "(missing)", "a window needs its index map"))?;
                if im.len() != r.shape.len() {
                    return Err(PallasError::field(
                        &format!("{f}.index_map"),
                        format!("{} expressions", im.len()),
                        format!("expected one per block dimension ({})", r.shape.len()),
                    ));
                }
            }
            if let PipelineMode::Buffered(0) = r.pipeline_mode {
                return Err(PallasError::field(&format!("{f}.pipeline_mode"), "buffered 0", "expected at least 1 buffer"));
            }
            if r.kind == RefKind::Prefetch && r.values.is_none() {
                return Err(PallasError::field(
                    &format!("{f}.values"),
                    "(missing)",
                    "a prefetch table needs its values (inline, file or runtime)",
                ));
            }
            if r.values.is_some() && !r.holds_table() {
                return Err(PallasError::field(
                    &format!("{f}.values"),
                    format!("on a {:?} ref in {:?}", r.kind, r.memory_space).to_lowercase(),
                    "values are the contents of a table the call passes: a prefetch ref's, or an input's in SMEM",
                ));
            }
            if let Some(k) = r.shape.iter().position(|&x| x == 0) {
                return Err(PallasError::field(&format!("{f}.shape[{k}]"), 0, "expected a whole number from 1 (a block or scratch buffer of no elements)"));
            }
            if let Some(a) = &r.array_shape {
                if a.len() != r.shape.len() {
                    return Err(PallasError::field(
                        &format!("{f}.array_shape"),
                        format!("{a:?}"),
                        format!("expected one dimension per block dimension ({}: the block is {:?})", r.shape.len(), r.shape),
                    ));
                }
                if let Some(k) = a.iter().position(|&x| x == 0) {
                    return Err(PallasError::field(
                        &format!("{f}.array_shape[{k}]"),
                        0,
                        format!("expected a whole number from 1: the kernel's operand `{}` is an array of shape {a:?}, with no elements; simulate it with arrays of at least one element", r.name),
                    ));
                }
            }
            if let Some(im) = &r.index_map {
                for (k, e) in im.iter().enumerate() {
                    self.check_expr(e, &format!("{f}.index_map[{k}]"), None)?;
                }
            }
        }
        if let Some(c) = &self.cost_estimate {
            for (k, v) in [("flops", c.flops), ("transcendentals", c.transcendentals), ("bytes_accessed", c.bytes_accessed)] {
                if !(v.is_finite() && v >= 0.0) {
                    return Err(PallasError::field(&format!("cost_estimate.{k}"), v, "expected a count from 0 (as `pl.CostEstimate` declares it)"));
                }
            }
        }
        let mut ids = std::collections::HashSet::new();
        for (i, a) in self.allocations.iter().enumerate() {
            let f = format!("allocations[{i}]");
            dtype_bytes(&a.dtype, &format!("{f}.dtype"))?;
            if !ids.insert(a.id) {
                return Err(PallasError::field(&format!("{f}.id"), a.id, "expected each allocation's id once"));
            }
            if a.shape.contains(&0) {
                return Err(PallasError::field(&format!("{f}.shape"), format!("{:?}", a.shape), "expected dimensions from 1 (none for a single semaphore)"));
            }
        }
        let mut defined = std::collections::HashSet::new();
        if let Some((id, op)) = Self::collect_ids(&self.body, &mut defined) {
            return Err(PallasError::field(
                &format!("body: id {id} ({op})"),
                id,
                "expected each value's id once in the body (an op's id, or a region op's results, carried values or arguments): a value bound twice would be read from either",
            ));
        }
        self.check_ops(&self.body, "body", &defined, &mut Default::default())?;
        Ok(())
    }

    /// A copy's source: `src_ref` one of the refs, `src_offsets` and `src_shape` one expression
    /// per dimension of its array, reading only what exists.
    fn check_dma_source(&self, op: &Op, f: &str, defined: &std::collections::HashSet<u64>) -> Result<(), PallasError> {
        let at = |k: &str| format!("{f} at {}: attrs.{k}", op.place());
        if op.attrs.contains_key("src_alloc") {
            if op.attrs.contains_key("src_ref") {
                return Err(PallasError::field(&at("src_alloc"), "given with src_ref", "a source is a window of a ref (`src_ref`) or of a buffer the body allocates (`src_alloc`), not both"));
            }
            let rank = self.allocation(op, f, "src_alloc")?.shape.len();
            return self.check_offsets(op, f, "src_offsets", rank, defined);
        }
        let Some(v) = op.attrs.get("src_ref") else {
            for k in ["src_offsets", "src_shape"] {
                if op.attrs.contains_key(k) {
                    return Err(PallasError::field(&at(k), "given without src_ref", "a source window needs the ref it is a window of (`src_ref` or `src_alloc`)"));
                }
            }
            return Ok(());
        };
        let r = v.as_u64().filter(|&r| (r as usize) < self.refs.len()).ok_or_else(|| PallasError::field(&at("src_ref"), v, self.refs_allowed()))? as usize;
        let rf = &self.refs[r];
        let rank = rf.array_shape.as_ref().unwrap_or(&rf.shape).len();
        for k in ["src_offsets", "src_shape"] {
            let x = op.attrs.get(k).ok_or_else(|| PallasError::field(&at(k), "(missing)", format!("one expression per dimension of `{}` ({rank})", rf.name)))?;
            let es: Vec<Expr> =
                serde_json::from_value(x.clone()).map_err(|e| PallasError::field(&at(k), x, format!("expected a list of expressions ({e})")))?;
            if es.len() != rank {
                return Err(PallasError::field(&at(k), x, format!("one expression per dimension of `{}` ({rank}: its array is {:?})", rf.name, rf.array_shape.as_ref().unwrap_or(&rf.shape))));
            }
            for e in &es {
                self.check_expr(e, &at(k), Some(defined))?;
                if let (Expr::Const(c), "src_shape") = (e, k) {
                    if *c < 0 {
                        return Err(PallasError::field(&at(k), x, "window sizes from 0 (a negative one is a dimension sized at run time read as a number)"));
                    }
                }
            }
        }
        Ok(())
    }

    /// A copy's target: `dst_ref` one of the refs or `dst_alloc` an allocation, with
    /// `dst_offsets` one expression per dimension of its array (or of the allocation).
    fn check_dma_target(&self, op: &Op, f: &str, defined: &std::collections::HashSet<u64>) -> Result<(), PallasError> {
        let at = |k: &str| format!("{f} at {}: attrs.{k}", op.place());
        let rank = match (op.attrs.get("dst_ref"), op.attrs.contains_key("dst_alloc")) {
            (Some(_), true) => {
                return Err(PallasError::field(&at("dst_alloc"), "given with dst_ref", "a target is a window of a ref (`dst_ref`) or of a buffer the body allocates (`dst_alloc`), not both"));
            }
            (Some(v), false) => {
                let r = v.as_u64().filter(|&r| (r as usize) < self.refs.len()).ok_or_else(|| PallasError::field(&at("dst_ref"), v, self.refs_allowed()))? as usize;
                let rf = &self.refs[r];
                rf.array_shape.as_ref().unwrap_or(&rf.shape).len()
            }
            (None, true) => self.allocation(op, f, "dst_alloc")?.shape.len(),
            (None, false) => {
                if op.attrs.contains_key("dst_offsets") {
                    return Err(PallasError::field(&at("dst_offsets"), "given without dst_ref or dst_alloc", "a target window needs what it is a window of"));
                }
                return Ok(());
            }
        };
        self.check_offsets(op, f, "dst_offsets", rank, defined)
    }

    /// The allocation a copy's `key` (`src_alloc`, `dst_alloc`) names.
    fn allocation(&self, op: &Op, f: &str, key: &str) -> Result<&Allocation, PallasError> {
        let v = &op.attrs[key];
        let ids: Vec<u64> = self.allocations.iter().map(|a| a.id).collect();
        v.as_u64()
            .and_then(|id| self.allocations.iter().find(|a| a.id == id))
            .ok_or_else(|| PallasError::field(&format!("{f} at {}: attrs.{key}", op.place()), v, format!("expected the id of an allocation the description lists ({ids:?})")))
    }

    /// A copy's `key` offsets: one expression per dimension (`rank`), reading only what exists.
    fn check_offsets(&self, op: &Op, f: &str, key: &str, rank: usize, defined: &std::collections::HashSet<u64>) -> Result<(), PallasError> {
        let at = format!("{f} at {}: attrs.{key}", op.place());
        let x = op.attrs.get(key).ok_or_else(|| PallasError::field(&at, "(missing)", format!("one expression per dimension ({rank})")))?;
        let es: Vec<Expr> = serde_json::from_value(x.clone()).map_err(|e| PallasError::field(&at, x, format!("expected a list of expressions ({e})")))?;
        if es.len() != rank {
            return Err(PallasError::field(&at, x, format!("one expression per dimension ({rank})")));
        }
        es.iter().try_for_each(|e| self.check_expr(e, &at, Some(defined)))
    }

    /// A copy's or wait's semaphore: `sem_ref` a semaphore ref (or `sem_alloc`, the id of one the
    /// body allocates), `sem_offsets` one expression per dimension of it (none for a single
    /// semaphore), reading only what exists.
    fn check_semaphore(&self, op: &Op, f: &str, defined: &std::collections::HashSet<u64>) -> Result<(), PallasError> {
        let at = |k: &str| format!("{f} at {}: attrs.{k}", op.place());
        if let Some(v) = op.attrs.get("sem_alloc") {
            if op.attrs.contains_key("sem_ref") {
                return Err(PallasError::field(&at("sem_alloc"), v, "a semaphore is a ref's (`sem_ref`) or one the body allocates (`sem_alloc`), not both"));
            }
            v.as_u64().filter(|&a| a < 1 << 40).ok_or_else(|| PallasError::field(&at("sem_alloc"), v, "expected the whole-number id of a semaphore the body allocates"))?;
            let x = op.attrs.get("sem_offsets").cloned().unwrap_or(serde_json::Value::Array(Vec::new()));
            let es: Vec<Expr> = serde_json::from_value(x.clone()).map_err(|e| PallasError::field(&at("sem_offsets"), &x, format!("expected a list of expressions ({e})")))?;
            for e in &es {
                self.check_expr(e, &at("sem_offsets"), Some(defined))?;
            }
            return Ok(());
        }
        let Some(v) = op.attrs.get("sem_ref") else {
            if op.attrs.contains_key("sem_offsets") {
                return Err(PallasError::field(&at("sem_offsets"), "given without sem_ref", "a semaphore index needs the semaphore it indexes (`sem_ref` or `sem_alloc`)"));
            }
            return Ok(());
        };
        let r = v.as_u64().filter(|&r| (r as usize) < self.refs.len()).ok_or_else(|| PallasError::field(&at("sem_ref"), v, format!("a whole-number ref index: {}", self.refs_allowed())))? as usize;
        let rf = &self.refs[r];
        if rf.memory_space != MemorySpace::Semaphore {
            return Err(PallasError::field(&at("sem_ref"), r, format!("expected a semaphore ref; `{}` is in {:?} memory", rf.name, rf.memory_space)));
        }
        let x = op.attrs.get("sem_offsets").cloned().unwrap_or(serde_json::Value::Array(Vec::new()));
        let es: Vec<Expr> = serde_json::from_value(x.clone()).map_err(|e| PallasError::field(&at("sem_offsets"), &x, format!("expected a list of expressions ({e})")))?;
        if es.len() != rf.shape.len() {
            return Err(PallasError::field(&at("sem_offsets"), &x, format!("one index per dimension of `{}` ({:?}): a copy or wait names one semaphore of the array", rf.name, rf.shape)));
        }
        for e in &es {
            self.check_expr(e, &at("sem_offsets"), Some(defined))?;
        }
        Ok(())
    }

    /// What a ref index may be, for errors.
    fn refs_allowed(&self) -> String {
        match self.refs.len() {
            0 => "the description lists no refs (`refs` is empty)".to_string(),
            n => format!("expected a ref from 0 to {} (the description has {n} refs)", n - 1),
        }
    }

    /// Checks that an expression reads only what exists: grid dimensions of the grid, prefetch
    /// tables among the refs and, in the body (`defined`: [`Description::collect_ids`]), values
    /// the body binds (`["var", id]`: an SMEM load's id, or a loop's carried value or result).
    fn check_expr(&self, e: &Expr, field: &str, defined: Option<&std::collections::HashSet<u64>>) -> Result<(), PallasError> {
        match e {
            Expr::Var(id) if defined.is_some_and(|d| !d.contains(id)) => Err(PallasError::field(
                field,
                format!("[\"var\", {id}]"),
                "expected the id of a value the body binds (an SMEM load's id, or a loop's carried value or result)",
            )),
            Expr::Grid(g) if *g >= self.grid.len() => Err(PallasError::field(
                field,
                format!("[\"grid\", {g}]"),
                format!("expected a grid dimension from 0 to {} (the grid is {:?})", self.grid.len().saturating_sub(1), self.grid),
            )),
            Expr::Load(r, idx) => {
                if *r >= self.refs.len() {
                    return Err(PallasError::field(field, format!("a load of ref {r}"), self.refs_allowed()));
                }
                idx.iter().try_for_each(|x| self.check_expr(x, field, defined))
            }
            Expr::Bin(_, a, b) => self.check_expr(a, field, defined).and_then(|_| self.check_expr(b, field, defined)),
            Expr::Select(c, a, b) => [c, a, b].into_iter().try_for_each(|x| self.check_expr(x, field, defined)),
            _ => Ok(()),
        }
    }

    /// The ids values are bound to anywhere in `ops`: each op's own, and the ids a region op's
    /// results, loop-carried values and arguments take (`attrs.results`, `carried`, `args`,
    /// `forward`; an `scf.yield`'s `results`).
    /// Collects the ids of the values the body binds; returns the first id bound twice (with
    /// the op that binds it the second time). Id 0 is an op without a result (no `id`).
    fn collect_ids(ops: &[Op], ids: &mut std::collections::HashSet<u64>) -> Option<(u64, String)> {
        for op in ops {
            let mut bound: Vec<u64> = vec![op.id];
            for key in ["results", "carried", "args", "forward"] {
                if let Some(a) = op.attrs.get(key).and_then(|v| v.as_array()) {
                    bound.extend(a.iter().filter_map(serde_json::Value::as_u64));
                }
            }
            // A yield names the results of the region op it ends: both branches of an `scf.if`
            // yield the same results, so a yield's ids may repeat.
            let yields = op.op == "scf.yield";
            for id in bound {
                if !ids.insert(id) && id != 0 && !yields {
                    return Some((id, format!("{} at {}", op.op, op.place())));
                }
            }
            if let Some(d) = Self::collect_ids(&op.then, ids).or_else(|| Self::collect_ids(&op.otherwise, ids)) {
                return Some(d);
            }
        }
        None
    }

    /// Checks that every op's operands exist: refs among the description's, values of the body
    /// (`defined`: [`Description::collect_ids`]) bound before the op in program order (`seen`:
    /// each value so far with its shape, `None` for a region op's bound values), expressions as
    /// [`Description::check_expr`]; and that a transpose's and a matmul's shapes agree with
    /// their operands' ([`Description::check_shapes`]).
    fn check_ops(&self, ops: &[Op], at: &str, defined: &std::collections::HashSet<u64>, seen: &mut HashMap<u64, Option<Vec<u64>>>) -> Result<(), PallasError> {
        for (i, op) in ops.iter().enumerate() {
            let f = format!("{at}[{i}] ({}, id {})", op.op, op.id);
            for (k, o) in op.operands.iter().enumerate() {
                match o {
                    Operand::Ref(r) if *r >= self.refs.len() => {
                        return Err(PallasError::field(&format!("{f}.operands[{k}]"), format!("{{\"ref\": {r}}}"), self.refs_allowed()))
                    }
                    Operand::Op(id) if !defined.contains(id) => {
                        return Err(PallasError::field(
                            &format!("{f}.operands[{k}]"),
                            format!("{{\"op\": {id}}}"),
                            "expected the id of a value of the body (an op's, or a region op's result or carried value)",
                        ))
                    }
                    Operand::Op(id) if !seen.contains_key(id) => {
                        return Err(PallasError::field(
                            &format!("{f}.operands[{k}]"),
                            format!("{{\"op\": {id}}} (bound after this op)"),
                            "expected a value bound before the op that reads it, in program order (an op's result, or a region op's result or carried value)",
                        ))
                    }
                    Operand::Scalar(e) => self.check_expr(e, &format!("{f}.operands[{k}]"), Some(defined))?,
                    _ => {}
                }
            }
            self.check_shapes(op, &f, seen)?;
            if matches!(op.op.as_str(), "vector.load" | "tpu.load" | "tpu.strided_load") {
                if let Some(Operand::Ref(r)) = op.operands.first() {
                    let rf = &self.refs[*r];
                    if !op.dtype.is_empty() && op.dtype != rf.dtype {
                        return Err(PallasError::field(
                            &format!("{f} at {}: dtype", op.place()),
                            &op.dtype,
                            format!("expected `{}`, the dtype of the ref it loads (refs[{r}], {}): a load reads its ref's element type", rf.dtype, rf.name),
                        ));
                    }
                }
            }
            seen.insert(op.id, Some(op.shape.clone()));
            for key in ["results", "carried", "args", "forward"] {
                if let Some(a) = op.attrs.get(key).and_then(|v| v.as_array()) {
                    seen.extend(a.iter().filter_map(serde_json::Value::as_u64).map(|id| (id, None)));
                }
            }
            if matches!(op.op.as_str(), "scf.if" | "scf.while") && op.cond.is_none() {
                return Err(PallasError::Kernel {
                    kernel: self.kernel_name.clone(),
                    message: format!(
                        "{f} at {}: `cond` (missing): a branch or while loop needs its condition (an expression; `[\"unknown\", why]` for one computed at run time); describe the kernel again with `tpusim.jax.describe`",
                        op.place()
                    ),
                });
            }
            if op.op == "tpu.enqueue_dma" {
                let at = format!("{f} at {}: attrs.bytes", op.place());
                let bytes = op.attrs.get("bytes").ok_or_else(|| {
                    PallasError::field(&at, "(missing)", "a copy needs its size in bytes: a whole number, or an expression over the values that size it at run time")
                })?;
                let e: Expr = serde_json::from_value(bytes.clone())
                    .map_err(|e| PallasError::field(&at, bytes, format!("expected a whole number of bytes or an expression ({e})")))?;
                if let Expr::Const(c) = e {
                    if c < 0 {
                        return Err(PallasError::field(&at, c, "expected a whole number from 0 (a negative size is a dimension sized at run time read as a number: describe the kernel again with `tpusim.jax.describe`)"));
                    }
                }
                self.check_expr(&e, &at, Some(defined))?;
                self.check_dma_source(op, &f, defined)?;
                self.check_dma_target(op, &f, defined)?;
            }
            if matches!(op.op.as_str(), "tpu.enqueue_dma" | "tpu.wait_dma" | "tpu.wait_dma2") {
                // A misspelt semaphore would silently make a wait wait for every copy.
                let known: &[&str] = if op.op == "tpu.enqueue_dma" {
                    &["bytes", "src_ref", "src_alloc", "src_offsets", "src_shape", "src_space", "dst_ref", "dst_alloc", "dst_offsets", "dst_space", "sem_ref", "sem_alloc", "sem_offsets"]
                } else {
                    &["bytes", "sem_ref", "sem_alloc", "sem_offsets"]
                };
                if let Some(k) = op.attrs.keys().find(|k| !known.contains(&k.as_str())) {
                    let at = format!("{f} at {}: attrs.{k}", op.place());
                    return Err(PallasError::field(&at, "(unknown attribute)", format!("a `{}` has attributes {}", op.op, known.join(", "))));
                }
                self.check_semaphore(op, &f, defined)?;
                for k in ["src_space", "dst_space"] {
                    if let (Some(v), None) = (op.attrs.get(k), dma_space(op, k)) {
                        let at = format!("{f} at {}: attrs.{k}", op.place());
                        return Err(PallasError::field(&at, v, "a memory space as a ref's is written: vmem, smem, any (HBM) or semaphore"));
                    }
                }
            }
            if matches!(op.op.as_str(), "tpu.wait_dma" | "tpu.wait_dma2") {
                if let Some(bytes) = op.attrs.get("bytes") {
                    let at = format!("{f} at {}: attrs.bytes", op.place());
                    let e: Expr = serde_json::from_value(bytes.clone())
                        .map_err(|e| PallasError::field(&at, bytes, format!("expected the whole number of bytes the wait counts, or an expression ({e})")))?;
                    self.check_expr(&e, &at, Some(defined))?;
                }
            }
            for (key, e) in [("cond", &op.cond), ("lower", &op.lower), ("upper", &op.upper), ("step", &op.step)] {
                if let Some(e) = e {
                    self.check_expr(e, &format!("{f}.{key}"), Some(defined))?;
                }
            }
            self.check_ops(&op.then, &format!("{f}.then"), defined, seen)?;
            self.check_ops(&op.otherwise, &format!("{f}.otherwise"), defined, seen)?;
        }
        Ok(())
    }

    /// A transpose's result is its operand's shape permuted (by its `permutation` when given);
    /// a matmul's `mkn` (and `batch`) is its operands' and result's: the lhs holds batch x rows x
    /// contraction elements, the rhs batch x contraction x columns, the result batch x rows x
    /// columns (rows and columns may span several dimensions). Operands whose shape the
    /// description does not give (a region op's bound values, scalars) are not checked.
    fn check_shapes(&self, op: &Op, f: &str, seen: &HashMap<u64, Option<Vec<u64>>>) -> Result<(), PallasError> {
        let at = |k: &str| format!("{f} at {}: {k}", op.place());
        let operand = |k: usize| match op.operands.get(k) {
            Some(Operand::Op(id)) => seen.get(id).cloned().flatten().filter(|s| !s.is_empty()),
            _ => None,
        };
        if op.op.ends_with(".transpose") {
            let Some(src) = operand(0) else { return Ok(()) };
            let perm: Option<Vec<u64>> = op.attrs.get("permutation").and_then(|v| serde_json::from_value(v.clone()).ok());
            let permuted = match &perm {
                Some(p) => {
                    let mut sorted = p.clone();
                    sorted.sort_unstable();
                    (sorted.iter().enumerate().all(|(i, &x)| x == i as u64) && p.len() == src.len()).then(|| p.iter().map(|&i| src[i as usize]).collect::<Vec<_>>())
                }
                None => {
                    let (mut a, mut b) = (src.clone(), op.shape.clone());
                    a.sort_unstable();
                    b.sort_unstable();
                    (a == b).then(|| op.shape.clone())
                }
            };
            if permuted.as_ref() != Some(&op.shape) {
                let how = perm.map_or("a permutation of its operand's".to_string(), |p| format!("its operand's {src:?} permuted by {p:?}"));
                return Err(PallasError::field(&at("shape"), format!("{:?}", op.shape), format!("a transpose's result shape is {how} (operand shape {src:?})")));
            }
        }
        if op.op == "tpu.matmul" {
            let Some(mkn) = op.attrs.get("mkn").and_then(|v| serde_json::from_value::<[u64; 3]>(v.clone()).ok()) else { return Ok(()) };
            let [m, k, n] = mkn;
            let batch = op.attrs.get("batch").and_then(serde_json::Value::as_u64).unwrap_or(1);
            // Rows and columns may each span several dimensions (Mosaic collapses them): the
            // element counts are what mkn fixes.
            for (what, shape, a, b) in [("lhs", operand(0), m, k), ("rhs", operand(1), k, n), ("result", Some(op.shape.clone()).filter(|s| !s.is_empty()), m, n)] {
                if let Some(x) = shape {
                    let have = x.iter().try_fold(1u64, |p, &d| p.checked_mul(d));
                    let need = batch.checked_mul(a).and_then(|v| v.checked_mul(b));
                    if have != need {
                        return Err(PallasError::field(
                            &at("attrs.mkn"),
                            format!("{mkn:?}"),
                            format!(
                                "rows, contraction and columns of the matmul's operands: its {what} {x:?} holds {} elements, where batch {batch} x {a} x {b} = {} are needed",
                                have.map_or("more than 2^64".into(), |h| h.to_string()),
                                need.map_or("more than 2^64".into(), |h| h.to_string())
                            ),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Grid steps in total (at most [`MAX_GRID_STEPS`]: the reader refuses more).
    pub fn grid_steps(&self) -> u64 {
        self.grid.iter().product::<u64>().max(1)
    }
}

/// Why a file of bytes that are not text is no description: what it looks like (a NumPy array,
/// say) and what a description is.
fn not_text(bytes: &[u8]) -> String {
    let what = if bytes.starts_with(b"\x93NUMPY") {
        "a NumPy array (.npy): a side table or a `--runtime` value a description names, not the description; give the description's .json (or .json.gz) beside it"
    } else {
        "binary data, not text"
    };
    format!("it is {what} (a description is the JSON text `tpusim.jax.describe` writes, or that text compressed with gzip)")
}
