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
//! 3. the resolved job (defaults applied), except keys that are already input columns: `chip`,
//!    `kernel`, `batch`, `heads`, `kv_heads`, `q_len`, `kv_len`, `head_dim`, `head_dim_v`, `mask`,
//!    `block_q`, `block_kv`, `block_kv_compute`, `traversal`, `masking`, `mask_source`,
//!    `tile_align`, `vmem_limit_mib`, `m`, `n`, `k`, `block_m`, `block_n`, `block_k` (empty where
//!    they do not apply, or when the job could not be built);
//! 4. the metrics of [`tpusim_report::Report`]: `latency_ms`, `cycles`, `flops`, `mfu`,
//!    `achieved_tflops`, `bottleneck`, `util_mxu` .. `util_step_control` (busy fraction),
//!    `busy_ms_mxu` .. `busy_ms_step_control`, `hbm_bytes`, `arithmetic_intensity`,
//!    `grid_steps`, `vmem_bytes`, `vmem_limit_bytes`, `tiles_total`, `tiles_visited`,
//!    `tiles_empty`, `tiles_partial`, `tiles_full`, `tiles_masked`, `pair_density`,
//!    `exact_pair_density`, `tile_density`, `useful_fraction`, `dense_latency_ms`,
//!    `tile_skip_efficiency`, `speedup_vs_dense`;
//! 5. `error`: why the point could not be evaluated (empty when it was).
//!
//! Numbers are written in Rust's shortest round-trip form, so equal inputs give equal bytes.

use crate::def::{Point, SweepDef};
use crate::eval::Outcome;
use crate::SweepError;
use tpusim_report::Job;

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

/// Units whose utilisation and busy time get a column each.
pub const UNITS: [&str; 6] = ["mxu", "vpu", "eup", "xlu", "hbm", "step_control"];

/// Resolved-job columns (module docs).
pub const JOB_COLUMNS: [&str; 24] = [
    "chip",
    "kernel",
    "batch",
    "heads",
    "kv_heads",
    "q_len",
    "kv_len",
    "head_dim",
    "head_dim_v",
    "mask",
    "block_q",
    "block_kv",
    "block_kv_compute",
    "traversal",
    "masking",
    "mask_source",
    "tile_align",
    "vmem_limit_mib",
    "m",
    "n",
    "k",
    "block_m",
    "block_n",
    "block_k",
];

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

    fn csv(&self) -> String {
        match self {
            Cell::Empty => String::new(),
            Cell::Str(s) => csv_escape(s),
            Cell::Int(i) => i.to_string(),
            Cell::Float(f) if f.is_finite() => format!("{f}"),
            Cell::Float(_) => String::new(),
            Cell::Bool(b) => b.to_string(),
            Cell::Toml(v) => csv_escape(&toml_text(v)),
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

/// Quotes a CSV field when it holds a comma, a quote or a line break (RFC 4180); line breaks
/// become spaces so that every row is one line.
pub fn csv_escape(s: &str) -> String {
    let s: String = s.chars().map(|c| if c == '\n' || c == '\r' { ' ' } else { c }).collect();
    if s.contains(',') || s.contains('"') {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s
    }
}

/// Splits one CSV line into fields (RFC 4180 quoting). `None` if a quote is left open.
pub fn csv_split(line: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            (true, '"') => quoted = false,
            (false, '"') if cur.is_empty() => quoted = true,
            (false, ',') => out.push(std::mem::take(&mut cur)),
            (_, c) => cur.push(c),
        }
    }
    if quoted {
        return None;
    }
    out.push(cur);
    Some(out)
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
                "# tpusim sweep: points={} shard={}/{} definition={} tpusim={}\n{}\n",
                self.points,
                self.shard.0,
                self.shard.1,
                self.definition,
                self.version,
                columns.iter().map(|c| csv_escape(c)).collect::<Vec<_>>().join(",")
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
    job: Vec<usize>,
}

impl Layout {
    /// The layout for a sweep (module docs).
    pub fn for_sweep(def: &SweepDef) -> Layout {
        let mut columns = vec!["index".to_string()];
        columns.extend(def.inputs.iter().cloned());
        let job: Vec<usize> = (0..JOB_COLUMNS.len()).filter(|&i| !def.inputs.iter().any(|k| k == JOB_COLUMNS[i])).collect();
        columns.extend(job.iter().map(|&i| JOB_COLUMNS[i].to_string()));
        columns.extend(metric_columns());
        columns.push("error".into());
        Layout { columns, inputs: def.inputs.len(), job }
    }

    /// The cells of a point's row.
    pub fn row(&self, point: &Point<'_>, outcome: &Outcome) -> Vec<Cell> {
        let mut cells = Vec::with_capacity(self.columns.len());
        cells.push(Cell::Int(point.index));
        for i in 0..self.inputs {
            cells.push(Cell::opt(point.inputs.get(i).copied().flatten().map(|v| Cell::Toml(v.clone()))));
        }
        let chip = outcome.report.as_ref().map(|r| r.chip.clone()).ok().or_else(|| point.spec.chip.clone());
        let job = job_cells(outcome.job.as_ref(), chip, point.spec.vmem_limit_mib);
        cells.extend(self.job.iter().map(|&i| job[i].clone()));
        match &outcome.report {
            Ok(r) => {
                cells.extend(metric_cells(r));
                cells.push(Cell::Empty);
            }
            Err(e) => {
                cells.extend(std::iter::repeat(Cell::Empty).take(metric_columns().len()));
                cells.push(Cell::Str(e.clone()));
            }
        }
        cells
    }

    /// One row as a line of `format`, ending in a newline.
    pub fn line(&self, format: Format, cells: &[Cell]) -> String {
        match format {
            Format::Csv => {
                let mut s = cells.iter().map(Cell::csv).collect::<Vec<_>>().join(",");
                s.push('\n');
                s
            }
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
                let fields = csv_split(line).ok_or("unterminated quote")?;
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

fn metric_columns() -> Vec<String> {
    let mut c: Vec<String> =
        ["latency_ms", "cycles", "flops", "mfu", "achieved_tflops", "bottleneck"].iter().map(|s| s.to_string()).collect();
    c.extend(UNITS.iter().map(|u| format!("util_{u}")));
    c.extend(UNITS.iter().map(|u| format!("busy_ms_{u}")));
    c.extend(
        [
            "hbm_bytes",
            "arithmetic_intensity",
            "grid_steps",
            "vmem_bytes",
            "vmem_limit_bytes",
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

fn metric_cells(r: &tpusim_report::Report) -> Vec<Cell> {
    let mut c = vec![
        Cell::Float(r.latency_ms),
        Cell::Float(r.cycles),
        Cell::Float(r.flops),
        Cell::Float(r.mfu),
        Cell::Float(r.achieved_tflops),
        Cell::Str(r.bottleneck.clone()),
    ];
    c.extend(UNITS.iter().map(|u| Cell::opt(r.utilization.get(*u).copied())));
    c.extend(UNITS.iter().map(|u| Cell::opt(r.busy_ms.get(*u).copied())));
    let t = r.tiles;
    c.extend([
        Cell::Int(r.hbm_bytes),
        Cell::Float(r.arithmetic_intensity),
        Cell::Int(r.grid_steps),
        Cell::Int(r.vmem_bytes),
        Cell::Int(r.vmem_limit_bytes),
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

/// Cells of [`JOB_COLUMNS`] for a built job.
fn job_cells(job: Option<&Job>, chip: Option<String>, vmem_limit_mib: Option<f64>) -> Vec<Cell> {
    let mut c = vec![Cell::Empty; JOB_COLUMNS.len()];
    let mut set = |name: &str, v: Cell| {
        if let Some(i) = JOB_COLUMNS.iter().position(|n| *n == name) {
            c[i] = v;
        }
    };
    set("chip", Cell::opt(chip));
    set("vmem_limit_mib", Cell::opt(vmem_limit_mib));
    match job {
        Some(Job::Splash { workload: w, config: k }) => {
            set("kernel", Cell::Str("splash".into()));
            set("batch", w.batch.into());
            set("heads", w.q_heads.into());
            set("kv_heads", w.kv_heads.into());
            set("q_len", w.q_len.into());
            set("kv_len", w.kv_len.into());
            set("head_dim", w.head_dim.into());
            set("head_dim_v", w.head_dim_v.into());
            set("mask", Cell::Str(w.mask.to_string()));
            set("block_q", k.block_q.into());
            set("block_kv", k.block_kv.into());
            set("block_kv_compute", k.block_kv_compute.into());
            set("traversal", word(&k.traversal));
            set("masking", word(&k.masking));
            set("mask_source", word(&k.mask_source));
            set("tile_align", k.tile_align.into());
        }
        Some(Job::Matmul { workload: w, config: k }) => {
            set("kernel", Cell::Str("matmul".into()));
            set("m", w.m.into());
            set("n", w.n.into());
            set("k", w.k.into());
            set("block_m", k.block_m.into());
            set("block_n", k.block_n.into());
            set("block_k", k.block_k.into());
        }
        None => {}
    }
    c
}

/// An option enum's word as the CLI spells it (its serde name).
fn word<T: serde::Serialize>(v: &T) -> Cell {
    Cell::Str(serde_json::to_value(v).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default())
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
    let mut lines = text.split_inclusive('\n');
    let first = lines.next().ok_or_else(|| bad(1, "empty file, not a tpusim sweep output"))?;
    if !first.ends_with('\n') {
        return Err(bad(1, "incomplete header line"));
    }
    let (header, format) =
        Header::parse(first.trim_end()).ok_or_else(|| bad(1, "not a tpusim sweep output (no sweep header line)"))?;
    let mut header_text = first.to_string();
    let mut line_no = 1;
    let own_layout;
    let layout = match format {
        Format::Csv => {
            let cols = lines.next().filter(|l| l.ends_with('\n')).ok_or_else(|| bad(2, "missing column names"))?;
            line_no += 1;
            header_text.push_str(cols);
            match layout {
                Some(l) => l,
                None => {
                    let columns = csv_split(cols.trim_end_matches('\n')).ok_or_else(|| bad(2, "malformed column names"))?;
                    own_layout = Layout { columns, inputs: 0, job: Vec::new() };
                    &own_layout
                }
            }
        }
        Format::Jsonl => match layout {
            Some(l) => l,
            None => {
                own_layout = Layout { columns: Vec::new(), inputs: 0, job: Vec::new() };
                &own_layout
            }
        },
    };
    let mut rows = Vec::new();
    let mut valid_len = header_text.len() as u64;
    let mut truncated_tail = false;
    for l in lines {
        line_no += 1;
        if !l.ends_with('\n') {
            truncated_tail = true;
            break;
        }
        let body = l.trim_end_matches('\n');
        let index = if format == Format::Jsonl && layout.columns.is_empty() {
            serde_json::from_str::<serde_json::Value>(body)
                .ok()
                .and_then(|v| v.get("index").and_then(|i| i.as_u64()))
                .ok_or_else(|| "not a row object with an \"index\"".to_string())
        } else {
            layout.index_of(format, body)
        }
        .map_err(|e| bad(line_no, &format!("malformed row: {e}")))?;
        rows.push((index, l.to_string()));
        valid_len += l.len() as u64;
    }
    Ok(ReadBack { header, format, header_text, rows, valid_len, truncated_tail })
}

/// Writes `text` to `path` atomically: a temporary file in the same folder, flushed to disk,
/// then renamed over `path`.
///
/// # Errors
/// [`SweepError`] naming the file.
pub fn write_atomic(path: &str, text: &[u8]) -> Result<(), SweepError> {
    use std::io::Write;
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if !m.file_type().is_file() {
            return Err(SweepError::new(format!("{path} exists and is not a regular file (a device, directory or link); choose another --out")));
        }
    }
    let tmp = format!("{path}.tmp{}", std::process::id());
    let io = |e: std::io::Error| SweepError::new(format!("cannot write {path}: {e}"));
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(text).map_err(io)?;
    f.sync_all().map_err(io)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io(e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_round_trip() {
        let fields = ["a", "b,c", "say \"hi\"", "", "x\ny"];
        let line = fields.iter().map(|f| csv_escape(f)).collect::<Vec<_>>().join(",");
        assert_eq!(csv_split(&line).unwrap(), vec!["a", "b,c", "say \"hi\"", "", "x y"]);
        assert!(csv_split("\"open").is_none());
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
