//! Sweep output: one row per point, as CSV or JSON lines.
//!
//! A file starts with a header that identifies the sweep:
//!
//! * CSV: a comment line `# tpusim sweep: points=N shard=I/K definition=HASH tpusim=VERSION`
//!   (read it with `pandas.read_csv(path, comment="#")`), then the column names;
//! * JSON lines: a first object `{"tpusim_sweep":{"points":N,"shard":"I/K","definition":"HASH",
//!   "tpusim":"VERSION"}}`, then one object per point with the column names as keys.
//!
//! Columns, in order:
//!
//! 1. `index`: the point's number (0-based);
//! 2. the sweep's inputs: one column per axis key (or per key used by any point), holding the
//!    value as written (empty where a point does not give it);
//! 3. the resolved job (defaults applied): every field of [`tpusim_job::JobSpec`] but `set`
//!    and `seq_len` ([`job_columns`], in the struct's order), except keys that are already input
//!    columns (empty where they do not apply, or when the job could not be built);
//! 4. `design_whatif`: the options of the point's configuration that its kernel family's library
//!    has no setting for, `; `-separated (e.g. `traversal compact (splash runs full-grid)`;
//!    [`tpusim_job::design_what_ifs`]): tpusim times them as if the library had them, as
//!    `tpusim run` notes and `tpusim tune` stars them (empty for configurations the library runs);
//! 5. the chip model the point ran on ([`tpusim_chip::ChipIdentity`]): `chip_source` (`preset`
//!    or the chip TOML's path), `chip_set` (the `--set` overrides applied, `;`-separated) and
//!    `chip_hash` (a hash of the model's parameter values: rows with equal hashes ran on
//!    identical models);
//! 6. the metrics of [`tpusim_job::Report`]: `latency_ms`, `cycles`, `flops`, `mfu`,
//!    `achieved_tflops`, (with `--what-if-2x`: `bottleneck`, `co_bound`, `gain_2x_UNIT`, then
//!    `gain_2x_dma_latency`, `gain_2x_dma_issue`, `gain_2x_dmas_in_flight`),
//!    `util_mxu` .. `util_step_control` (busy fraction),
//!    `busy_ms_mxu` .. `busy_ms_step_control`, `transcendentals`, `hbm_bytes`, `useful_flops`,
//!    `useful_hbm_bytes` (`flops` and `hbm_bytes` are executed, tile-padded by the padding rule
//!    of `tpusim_model::copies`; these without the padding), `arithmetic_intensity`, `grid_steps`, `steps_computed`, `vmem_bytes`, `vmem_limit_bytes`,
//!    `smem_bytes` (kernels read from their IR, forward attention), `dma_stall_ms`, `tiles_total`, `tiles_visited`,
//!    `tiles_empty`, `tiles_partial`, `tiles_full`, `tiles_masked`, `pair_density`,
//!    `exact_pair_density`, `tile_density`, `useful_fraction`, `dense_latency_ms`,
//!    `tile_skip_efficiency`, `speedup_vs_dense` (empty where they do not apply);
//! 7. `error`: why the point could not be evaluated (empty when it was), naming job fields as
//!    sweep-file keys.
//!
//! A sweep of kernel descriptions (`kernel_ir`, [`crate::def`]) has rows of the same form, with
//! the job columns of a described job in place of a kernel family's ([`described_columns`]):
//! `kernel_ir` (the file, resolved from the sweep file's folder), `runtime` and `scope` (when the
//! sweep's base gives them), `kernel_name` and `chip`, each unless an input, and no `design_whatif`
//! column (a description runs as written). Its metric columns
//! are every sweep's (one report, [`tpusim_job::Report`], for either front end; a kernel read
//! from its IR counts its grid steps as tiles and leaves the attention densities empty).
//!
//! Numbers are written in Rust's shortest round-trip form, so equal inputs give equal bytes. CSV
//! is written and read with the `csv` crate (RFC 4180: a field with a comma, quote or line break
//! is quoted, so a row may span lines).

use crate::def::{Point, SweepDef};
use crate::eval::Outcome;
use crate::SweepError;
use tpusim_model::Unit;
use tpusim_job::{Job, JobSpec};

/// Output format of a sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Comma-separated values with a `#` header comment.
    Csv,
    /// One JSON object per line, after a header object.
    Jsonl,
}

impl Format {
    /// The format a file name implies: `.jsonl`, `.ndjson` and `.json` are JSON lines, anything
    /// else CSV.
    pub fn from_path(path: &str) -> Format {
        let p = path.to_ascii_lowercase();
        if p.ends_with(".jsonl") || p.ends_with(".ndjson") || p.ends_with(".json") {
            Format::Jsonl
        } else {
            Format::Csv
        }
    }

    /// The usual extension.
    pub fn extension(self) -> &'static str {
        match self {
            Format::Csv => "csv",
            Format::Jsonl => "jsonl",
        }
    }
}

/// Resolved-job columns of a kernel family's job (module docs): the job fields a resolved job
/// sets, in [`JobSpec::fields`] order (not those of a kernel read from its IR, which such a job
/// never sets).
pub fn job_columns() -> Vec<String> {
    JobSpec::fields()
        .iter()
        .filter(|f| !matches!(f.as_str(), "set" | "seq_len" | "no_fused_bwd" | "kernel_ir" | "runtime"))
        .cloned()
        .collect()
}

/// Resolved-job columns of a sweep of kernel descriptions (module docs): `kernel_ir`, `runtime`
/// and `scope` when the base gives them, the kernel's name and the chip.
pub fn described_columns(def: &SweepDef) -> Vec<String> {
    let mut c = vec![crate::def::KERNEL_IR_KEY.to_string()];
    if !def.base.runtime.is_empty() {
        c.push("runtime".into());
    }
    if def.base.scope.is_some() {
        c.push("scope".into());
    }
    c.extend(["kernel_name".to_string(), "chip".to_string()]);
    c
}

/// One cell of a row.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    /// Not applicable / not available.
    Empty,
    /// Text.
    Str(String),
    /// A whole number.
    Int(u64),
    /// A number.
    Float(f64),
    /// A flag.
    Bool(bool),
    /// An input value as written in the sweep file.
    Toml(toml::Value),
}

impl Cell {
    fn opt<T: Into<Cell>>(v: Option<T>) -> Cell {
        v.map_or(Cell::Empty, Into::into)
    }

    fn text(&self) -> String {
        match self {
            Cell::Empty => String::new(),
            Cell::Str(s) => s.clone(),
            Cell::Int(i) => i.to_string(),
            Cell::Float(f) if f.is_finite() => format!("{f}"),
            Cell::Float(_) => String::new(),
            Cell::Bool(b) => b.to_string(),
            Cell::Toml(v) => toml_text(v),
        }
    }

    fn json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match self {
            Cell::Empty => J::Null,
            Cell::Str(s) => J::String(s.clone()),
            Cell::Int(i) => J::from(*i),
            Cell::Float(f) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
            Cell::Bool(b) => J::Bool(*b),
            Cell::Toml(v) => serde_json::to_value(v).unwrap_or(J::Null),
        }
    }
}

impl From<u64> for Cell {
    fn from(v: u64) -> Self {
        Cell::Int(v)
    }
}
impl From<f64> for Cell {
    fn from(v: f64) -> Self {
        Cell::Float(v)
    }
}
impl From<String> for Cell {
    fn from(v: String) -> Self {
        Cell::Str(v)
    }
}
impl From<bool> for Cell {
    fn from(v: bool) -> Self {
        Cell::Bool(v)
    }
}

fn toml_text(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        toml::Value::Float(f) => format!("{f}"),
        other => serde_json::to_string(other).unwrap_or_else(|_| other.to_string()),
    }
}

pub use tpusim_io::{csv_fields, csv_record};

/// One CSV record: its fields (or why it does not parse), the byte range it occupies (the end
/// includes the line break) and whether it is complete.
type CsvRecord = (Result<Vec<String>, String>, std::ops::Range<usize>, bool);

/// CSV records of `text` with the byte range each occupies; `complete` is false for a last
/// record cut short (no line break, or inside an open quote).
fn csv_records(text: &str) -> Vec<CsvRecord> {
    let mut r = csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(text.as_bytes());
    let mut out: Vec<CsvRecord> = Vec::new();
    let mut rec = csv::StringRecord::new();
    loop {
        let start = r.position().byte() as usize;
        match r.read_record(&mut rec) {
            Ok(false) => break,
            Ok(true) => {
                let end = r.position().byte() as usize;
                // A record is complete when the reader stopped after its line break.
                let complete = end > start && text.as_bytes().get(end - 1) == Some(&b'\n');
                out.push((Ok(rec.iter().map(String::from).collect()), start..end, complete));
            }
            Err(e) => {
                let end = r.position().byte() as usize;
                out.push((Err(e.to_string()), start..end.max(start), false));
                break;
            }
        }
    }
    out
}

/// The identity of a sweep output: which sweep, how many points, which shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Points in the whole sweep.
    pub points: u64,
    /// This file's shard: (index, count); (0, 1) for a whole sweep.
    pub shard: (u64, u64),
    /// The sweep definition's hash (16 hex digits).
    pub definition: String,
    /// The tpusim version that wrote it.
    pub version: String,
}

impl Header {
    /// The header text for a format, ending in a newline: the identity line, then (CSV) the
    /// column names.
    pub fn render(&self, format: Format, columns: &[String]) -> String {
        match format {
            Format::Csv => format!(
                "# tpusim sweep: points={} shard={}/{} definition={} tpusim={}\n{}",
                self.points,
                self.shard.0,
                self.shard.1,
                self.definition,
                self.version,
                csv_record(columns)
            ),
            Format::Jsonl => format!(
                "{{\"tpusim_sweep\":{{\"points\":{},\"shard\":\"{}/{}\",\"definition\":\"{}\",\"tpusim\":\"{}\"}}}}\n",
                self.points, self.shard.0, self.shard.1, self.definition, self.version
            ),
        }
    }

    /// Reads the identity line of a sweep output (either format). `None` if it is not one.
    pub fn parse(line: &str) -> Option<(Header, Format)> {
        if let Some(rest) = line.strip_prefix("# tpusim sweep: ") {
            let mut h = Header { points: 0, shard: (0, 0), definition: String::new(), version: String::new() };
            for kv in rest.split_whitespace() {
                let (k, v) = kv.split_once('=')?;
                match k {
                    "points" => h.points = v.parse().ok()?,
                    "shard" => h.shard = parse_shard(v)?,
                    "definition" => h.definition = v.to_string(),
                    "tpusim" => h.version = v.to_string(),
                    _ => {}
                }
            }
            return Some((h, Format::Csv));
        }
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        let m = v.get("tpusim_sweep")?;
        Some((
            Header {
                points: m.get("points")?.as_u64()?,
                shard: parse_shard(m.get("shard")?.as_str()?)?,
                definition: m.get("definition")?.as_str()?.to_string(),
                version: m.get("tpusim").and_then(|v| v.as_str()).unwrap_or("").to_string(),
            },
            Format::Jsonl,
        ))
    }
}

fn parse_shard(s: &str) -> Option<(u64, u64)> {
    let (i, n) = s.split_once('/')?;
    Some((i.trim().parse().ok()?, n.trim().parse().ok()?))
}

/// The columns of a sweep's rows.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// All column names, in order.
    pub columns: Vec<String>,
    inputs: usize,
    /// The resolved-job columns (those not among the inputs).
    job: Vec<String>,
    what_if: bool,
    /// Whether the points are kernel descriptions (`kernel_ir`).
    described: bool,
}

impl Layout {
    /// The layout for a sweep (module docs); `what_if` adds the what-if columns (`bottleneck`,
    /// `co_bound`, `gain_2x_UNIT`).
    pub fn for_sweep(def: &SweepDef, what_if: bool) -> Layout {
        let mut columns = vec!["index".to_string()];
        columns.extend(def.inputs.iter().cloned());
        let all = if def.kernel_ir { described_columns(def) } else { job_columns() };
        let job: Vec<String> = all.into_iter().filter(|c| !def.inputs.contains(c)).collect();
        columns.extend(job.iter().cloned());
        if !def.kernel_ir {
            columns.push(DESIGN_WHATIF.into());
        }
        columns.extend(CHIP_COLUMNS.iter().map(|c| c.to_string()));
        columns.extend(metric_columns(what_if));
        columns.push("error".into());
        Layout { columns, inputs: def.inputs.len(), job, what_if, described: def.kernel_ir }
    }

    /// Where the `design_whatif` column is (`None` in a sweep of kernel descriptions).
    pub fn design_whatif_column(&self) -> Option<usize> {
        self.columns.iter().position(|c| c == DESIGN_WHATIF)
    }

    /// The cells of a point's row.
    pub fn row(&self, point: &Point<'_>, outcome: &Outcome) -> Vec<Cell> {
        let mut cells = Vec::with_capacity(self.columns.len());
        cells.push(Cell::Int(point.index));
        for i in 0..self.inputs {
            cells.push(Cell::opt(point.inputs.get(i).copied().flatten().map(|v| Cell::Toml(v.clone()))));
        }
        // A row whose job could not be built still names the chip it was for (the default when
        // the sweep names none).
        let chip = outcome
            .report
            .as_ref()
            .map(|r| r.chip.clone())
            .ok()
            .or_else(|| point.spec.chip.clone())
            .or_else(|| Some(tpusim_job::spec::DEFAULT_CHIP.to_string()));
        // A described job that could not be built still names its file (and runtime values).
        let mut spec = match (&outcome.job, self.described) {
            (Some(j), _) => j.to_spec(),
            (None, true) => JobSpec { kernel_ir: point.spec.kernel_ir.clone(), runtime: point.spec.runtime.clone(), ..Default::default() },
            (None, false) => JobSpec::default(),
        };
        // The layout a row ran with, also where it is the family's own (which a job's spec
        // leaves unsaid).
        if let Some(Job::Attention { config, .. }) = &outcome.job {
            spec.input_layout.get_or_insert(config.input_layout);
        }
        let kernel_name = match &outcome.job {
            Some(Job::Described(d)) => Some(d.kernel_name.as_str()),
            _ => None,
        };
        cells.extend(job_cells(&spec, kernel_name, chip, &self.job));
        if !self.described {
            let what_ifs = outcome.job.as_ref().map(tpusim_job::design_what_ifs).unwrap_or_default();
            cells.push(if what_ifs.is_empty() { Cell::Empty } else { Cell::Str(what_ifs.join("; ")) });
        }
        match &outcome.chip {
            Some(id) => cells.extend([Cell::Str(id.source.clone()), Cell::Str(id.overrides.join(";")), Cell::Str(id.hash.clone())]),
            None => cells.extend(std::iter::repeat_n(Cell::Empty, CHIP_COLUMNS.len())),
        }
        match &outcome.report {
            Ok(r) => {
                cells.extend(metric_cells(r, self.what_if));
                cells.push(Cell::Empty);
            }
            Err(e) => {
                cells.extend(std::iter::repeat_n(Cell::Empty, metric_columns(self.what_if).len()));
                // Job fields named as the sweep file names them (a length given as seq_len is
                // seq_len).
                cells.push(Cell::Str(point.spec.render_error(e, tpusim_job::FieldStyle::Key)));
            }
        }
        cells
    }

    /// One row as a line of `format`, ending in a newline.
    pub fn line(&self, format: Format, cells: &[Cell]) -> String {
        match format {
            Format::Csv => csv_record(cells.iter().map(Cell::text)),
            Format::Jsonl => {
                let mut s = String::from("{");
                for (i, (name, cell)) in self.columns.iter().zip(cells).enumerate() {
                    if i > 0 {
                        s.push(',');
                    }
                    s.push_str(&serde_json::to_string(name).unwrap_or_default());
                    s.push(':');
                    s.push_str(&cell.json().to_string());
                }
                s.push_str("}\n");
                s
            }
        }
    }

    /// Checks that a line read back from a file is a complete row of this layout and returns its
    /// index.
    ///
    /// # Errors
    /// A description of what is wrong.
    pub fn index_of(&self, format: Format, line: &str) -> Result<u64, String> {
        match format {
            Format::Csv => {
                let fields = csv_fields(line)?;
                if fields.len() != self.columns.len() {
                    return Err(format!("{} fields, expected {}", fields.len(), self.columns.len()));
                }
                fields[0].parse().map_err(|_| format!("index '{}' is not a whole number", fields[0]))
            }
            Format::Jsonl => {
                let v: serde_json::Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
                let obj = v.as_object().ok_or("not a JSON object")?;
                if obj.len() != self.columns.len() {
                    return Err(format!("{} keys, expected {}", obj.len(), self.columns.len()));
                }
                obj.get("index").and_then(|i| i.as_u64()).ok_or_else(|| "no whole-number \"index\"".to_string())
            }
        }
    }
}

/// The design what-if column (module docs).
pub const DESIGN_WHATIF: &str = "design_whatif";

/// The chip-model columns (module docs).
const CHIP_COLUMNS: &[&str] = &["chip_source", "chip_set", "chip_hash"];

/// The metric columns both front ends' rows begin with: latency, FLOPs, MFU, the what-if
/// table (when asked) and per-unit utilisation and busy time.
fn head_columns(what_if: bool) -> Vec<String> {
    let mut c: Vec<String> = ["latency_ms", "cycles", "flops", "mfu", "achieved_tflops"].iter().map(|s| s.to_string()).collect();
    if what_if {
        c.extend(["bottleneck".to_string(), "co_bound".to_string()]);
        c.extend(Unit::ALL.iter().map(|u| format!("gain_2x_{u}")));
        c.extend(tpusim_job::whatif::MECHANISMS.iter().map(|m| format!("gain_2x_{m}")));
    }
    c.extend(Unit::ALL.iter().map(|u| format!("util_{u}")));
    c.extend(Unit::ALL.iter().map(|u| format!("busy_ms_{u}")));
    c
}

/// The cells of [`head_columns`] for a report's fields.
struct Head<'a> {
    latency_ms: f64,
    cycles: f64,
    flops: f64,
    mfu: f64,
    achieved_tflops: f64,
    bottleneck: Unit,
    co_bound: &'a [Unit],
    what_if_2x: Option<&'a [tpusim_job::whatif::WhatIf]>,
    utilization: &'a tpusim_model::PerUnit<f64>,
    busy_ms: &'a tpusim_model::PerUnit<f64>,
}

fn head_cells(h: &Head<'_>, what_if: bool) -> Vec<Cell> {
    let mut c = vec![Cell::Float(h.latency_ms), Cell::Float(h.cycles), Cell::Float(h.flops), Cell::Float(h.mfu), Cell::Float(h.achieved_tflops)];
    if what_if {
        let co: Vec<&str> = h.co_bound.iter().map(|u| u.word()).collect();
        c.extend([Cell::Str(h.bottleneck.to_string()), Cell::Str(co.join(";"))]);
        let table = h.what_if_2x.unwrap_or_default();
        c.extend(Unit::ALL.iter().map(|u| Cell::opt(table.iter().find(|w| w.unit == u.word()).map(|w| Cell::Float(w.gain)))));
        c.extend(tpusim_job::whatif::MECHANISMS.iter().map(|m| Cell::opt(table.iter().find(|w| w.unit == *m).map(|w| Cell::Float(w.gain)))));
    }
    c.extend(h.utilization.iter().map(|(_, v)| Cell::Float(v)));
    c.extend(h.busy_ms.iter().map(|(_, v)| Cell::Float(v)));
    c
}

fn metric_columns(what_if: bool) -> Vec<String> {
    let mut c = head_columns(what_if);
    c.extend(
        [
            "transcendentals",
            "hbm_bytes",
            "useful_flops",
            "useful_hbm_bytes",
            "arithmetic_intensity",
            "grid_steps",
            "steps_computed",
            "vmem_bytes",
            "vmem_limit_bytes",
            "smem_bytes",
            "dma_stall_ms",
            "tiles_total",
            "tiles_visited",
            "tiles_empty",
            "tiles_partial",
            "tiles_full",
            "tiles_masked",
            "pair_density",
            "exact_pair_density",
            "tile_density",
            "useful_fraction",
            "dense_latency_ms",
            "tile_skip_efficiency",
            "speedup_vs_dense",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    c
}

fn metric_cells(r: &tpusim_job::Report, what_if: bool) -> Vec<Cell> {
    let mut c = head_cells(
        &Head {
            latency_ms: r.latency_ms,
            cycles: r.cycles,
            flops: r.flops,
            mfu: r.mfu,
            achieved_tflops: r.achieved_tflops,
            bottleneck: r.bottleneck,
            co_bound: &r.co_bound,
            what_if_2x: r.what_if_2x.as_deref(),
            utilization: &r.utilization,
            busy_ms: &r.busy_ms,
        },
        what_if,
    );
    let t = r.tiles;
    c.extend([
        Cell::Float(r.transcendentals),
        Cell::Int(r.hbm_bytes),
        Cell::Float(r.useful_flops),
        Cell::Int(r.useful_hbm_bytes),
        Cell::Float(r.arithmetic_intensity),
        Cell::Int(r.grid_steps),
        Cell::Int(r.steps_computed),
        Cell::Int(r.vmem_bytes),
        Cell::Int(r.vmem_limit_bytes),
        Cell::opt(r.smem_bytes),
        Cell::Float(r.dma_stall_ms),
        Cell::opt(t.map(|t| t.total)),
        Cell::opt(t.map(|t| t.visited)),
        Cell::opt(t.map(|t| t.empty)),
        Cell::opt(t.map(|t| t.partial)),
        Cell::opt(t.map(|t| t.full)),
        Cell::opt(t.map(|t| t.masked)),
        Cell::opt(r.pair_density),
        Cell::opt(r.exact_pair_density),
        Cell::opt(r.tile_density),
        Cell::opt(r.useful_fraction),
        Cell::opt(r.dense_latency_ms),
        Cell::opt(r.tile_skip_efficiency),
        Cell::opt(r.speedup_vs_dense),
    ]);
    c
}

/// Cells of the job columns `names` for a job's spec ([`Job::to_spec`]), field by field, with
/// the chip and (a kernel read from its IR) the kernel's name; a list (`runtime`) is its texts
/// joined by `;`.
fn job_cells(spec: &JobSpec, kernel_name: Option<&str>, chip: Option<String>, names: &[String]) -> Vec<Cell> {
    let mut fields = spec.set_fields();
    if let Some(c) = chip {
        fields.insert("chip".into(), serde_json::Value::String(c));
    }
    if let Some(k) = kernel_name {
        fields.insert("kernel_name".into(), serde_json::Value::String(k.to_string()));
    }
    names
        .iter()
        .map(|name| match fields.get(name) {
            None | Some(serde_json::Value::Null) => Cell::Empty,
            Some(serde_json::Value::String(s)) => Cell::Str(s.clone()),
            Some(serde_json::Value::Bool(b)) => Cell::Bool(*b),
            Some(serde_json::Value::Number(n)) => n.as_u64().map(Cell::Int).or_else(|| n.as_f64().map(Cell::Float)).unwrap_or(Cell::Empty),
            Some(serde_json::Value::Array(a)) => Cell::Str(a.iter().map(|x| x.as_str().map_or_else(|| x.to_string(), String::from)).collect::<Vec<_>>().join(";")),
            Some(other) => Cell::Str(other.to_string()),
        })
        .collect()
}

/// Reads a sweep output file for resuming or merging: its header and its complete rows.
#[derive(Debug, Clone)]
pub struct ReadBack {
    /// The identity line.
    pub header: Header,
    /// The format.
    pub format: Format,
    /// The header text as it stands in the file (identity line and, for CSV, column names).
    pub header_text: String,
    /// Complete rows: (index, line with its newline).
    pub rows: Vec<(u64, String)>,
    /// Bytes of the file up to the end of the last complete row.
    pub valid_len: u64,
    /// Whether a truncated last line (no newline) was ignored.
    pub truncated_tail: bool,
}

/// Reads a sweep output. A last line without a newline (a write cut short) is ignored; any other
/// malformed line is an error. `layout` checks the rows when given (resume); without it (merge),
/// rows are checked against the file's own column line.
///
/// # Errors
/// [`SweepError`] naming the file and line.
pub fn read_back(path: &str, layout: Option<&Layout>) -> Result<ReadBack, SweepError> {
    let text = std::fs::read(path).map_err(|e| SweepError::new(format!("cannot read {path}: {e}")))?;
    let text = String::from_utf8_lossy(&text);
    let bad = |line: usize, what: &str| SweepError::new(format!("{path}:{line}: {what}"));
    let first_len = text.find('\n').map(|i| i + 1).ok_or_else(|| {
        if text.is_empty() {
            bad(1, "empty file, not a tpusim sweep output")
        } else {
            bad(1, "incomplete header line")
        }
    })?;
    let first = &text[..first_len];
    let (header, format) = Header::parse(first.trim_end()).ok_or_else(|| bad(1, "not a tpusim sweep output (no sweep header line)"))?;
    let line_of = |byte: usize| 1 + text[..byte.min(text.len())].matches('\n').count();
    let mut header_text = first.to_string();
    let mut rows = Vec::new();
    let mut truncated_tail = false;
    match format {
        Format::Csv => {
            let body = &text[first_len..];
            let mut records = csv_records(body).into_iter();
            let (columns, range, complete) = records.next().ok_or_else(|| bad(2, "missing column names"))?;
            if !complete {
                return Err(bad(2, "missing column names"));
            }
            let columns = columns.map_err(|e| bad(2, &format!("malformed column names: {e}")))?;
            header_text.push_str(&body[range.clone()]);
            let own = Layout { columns, inputs: 0, job: Vec::new(), what_if: false, described: false };
            let layout = layout.unwrap_or(&own);
            let records: Vec<_> = records.collect();
            let n = records.len();
            for (i, (fields, range, complete)) in records.into_iter().enumerate() {
                // Counted only for an error: counting every row's line is quadratic in the file.
                let line = || line_of(first_len + range.start);
                let checked = fields.and_then(|f| {
                    if f.len() != layout.columns.len() {
                        return Err(format!("{} fields, expected {}", f.len(), layout.columns.len()));
                    }
                    f[0].parse::<u64>().map_err(|_| format!("index '{}' is not a whole number", f[0]))
                });
                match checked {
                    Ok(index) if complete => rows.push((index, body[range].to_string())),
                    // The last record cut short by an interrupted write is dropped.
                    _ if i + 1 == n => truncated_tail = true,
                    Err(e) => return Err(bad(line(), &format!("malformed row: {e}"))),
                    Ok(_) => return Err(bad(line(), "malformed row: incomplete")),
                }
            }
        }
        Format::Jsonl => {
            for (i, l) in text[first_len..].split_inclusive('\n').enumerate() {
                let line = i + 2;
                if !l.ends_with('\n') {
                    truncated_tail = true;
                    break;
                }
                let body = l.trim_end_matches('\n');
                let index = match layout {
                    Some(layout) => layout.index_of(format, body),
                    None => serde_json::from_str::<serde_json::Value>(body)
                        .ok()
                        .and_then(|v| v.get("index").and_then(|i| i.as_u64()))
                        .ok_or_else(|| "not a row object with an \"index\"".to_string()),
                }
                .map_err(|e| bad(line, &format!("malformed row: {e}")))?;
                rows.push((index, l.to_string()));
            }
        }
    }
    let valid_len = (header_text.len() + rows.iter().map(|(_, l)| l.len()).sum::<usize>()) as u64;
    Ok(ReadBack { header, format, header_text, rows, valid_len, truncated_tail })
}

/// Writes `text` to `path` completely or not at all ([`tpusim_io::write_atomic`]).
///
/// # Errors
/// [`SweepError::Input`] for a path that cannot be an output, [`SweepError::Io`] when writing
/// fails.
pub fn write_atomic(path: &str, text: &[u8]) -> Result<(), SweepError> {
    tpusim_io::write_atomic(std::path::Path::new(path), text).map_err(output_error)
}

/// Checks, before any work, that a sweep or merge may write `path` (`label` names it in
/// messages, e.g. `--out s.csv`): a path that can be an output ([`tpusim_io::check_output`])
/// and, when a file is already there, a tpusim sweep output (of any sweep; the caller checks
/// that it is this sweep's). A file tpusim did not write is replaced only with `force`.
///
/// # Errors
/// [`SweepError::Input`] naming the path.
pub fn check_replaceable(path: &str, label: &str, force: bool) -> Result<(), SweepError> {
    tpusim_io::check_output(std::path::Path::new(path)).map_err(|e| match e {
        tpusim_io::OutputError::Refused { reason, .. } => SweepError::Input(format!("{label}: {reason}")),
        other => output_error(other),
    })?;
    if force || !std::path::Path::new(path).exists() {
        return Ok(());
    }
    // Only the head of the file decides whether it is a sweep output.
    let mut head = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| std::io::Read::read_to_end(&mut std::io::Read::take(f, 1 << 16), &mut head))
        .map_err(|e| SweepError::new(format!("cannot read {path}: {e}")))?;
    let first = head.split(|&b| b == b'\n').next().unwrap_or_default();
    if Header::parse(String::from_utf8_lossy(first).trim_end()).is_none() {
        return Err(SweepError::new(format!(
            "{label} exists and is not a tpusim sweep output, so it is not replaced; give --force to replace it, or choose another --out"
        )));
    }
    Ok(())
}

/// `--out PATH` for messages (`--out ""` for an empty path).
pub fn out_label(out: &str) -> String {
    if out.is_empty() {
        "--out \"\"".to_string()
    } else {
        format!("--out {out}")
    }
}

/// Whether two paths name the same existing file (the same file through different spellings,
/// links or `..` included).
pub fn same_file(a: &str, b: &str) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// A [`tpusim_io::OutputError`] as a [`SweepError`].
pub fn output_error(e: tpusim_io::OutputError) -> SweepError {
    if e.is_refusal() {
        SweepError::Input(format!("{e}; choose another --out"))
    } else {
        SweepError::Io(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_round_trip_keeps_line_breaks() {
        let fields = ["a", "b,c", "say \"hi\"", "", "x\ny"];
        let line = csv_record(fields);
        assert!(line.ends_with('\n'));
        assert_eq!(csv_fields(&line).unwrap(), fields);
        let recs = csv_records(&format!("{line}{line}1,2"));
        assert_eq!(recs.len(), 3);
        assert!(recs[0].2 && recs[1].2 && !recs[2].2);
    }

    #[test]
    fn header_round_trip() {
        let h = Header { points: 12, shard: (1, 3), definition: "00ff".into(), version: "0.1.0".into() };
        for f in [Format::Csv, Format::Jsonl] {
            let text = h.render(f, &["index".into(), "x".into()]);
            let first = text.lines().next().unwrap();
            assert_eq!(Header::parse(first), Some((h.clone(), f)));
        }
    }
}
