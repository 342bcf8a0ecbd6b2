//! Measurement files: CSV tables of measured kernel timings (format documented in
//! `traces/measured/README.md`) and their mapping onto simulator jobs ([`JobSpec`]).
//!
//! One row is one measured kernel call: its workload (`batch`, `q_heads`, `kv_heads`, `q_len`,
//! `kv_len`, `head_dim`, `head_dim_v`, `mask`), kernel options (`traversal`, `masking`,
//! `mask_source`, `tile_align`, and the option words of `options`), block sizes (`block_q`,
//! `block_kv`, `block_kv_compute`), the `chip`, the kernel family (`kernel`) whose defaults apply
//! to what the row leaves out, and the measured time `measured_ms`. Matmul rows reuse the
//! attention columns: M = `q_len`, N = `kv_len`, K = `head_dim`, block M/N/K =
//! `block_q`/`block_kv`/`block_kv_compute`.
//!
//! Every word maps onto the simulator's typed values here, in one place: `kernel` onto
//! [`Kernel`], `direction` onto [`Direction`] (`bwd(dq,dk,dv)` is the backward), `traversal`,
//! `masking` and `mask_source` onto their enums, and the known words of `options`
//! ([`OptionWord`]) onto job fields; the rest of `options` is a note.
//!
//! Parsing is strict: an unknown column, a missing required column, a cell that is not a number
//! where a number is expected, an unknown option word, a malformed mask or an unknown chip is a
//! [`MeasureError`] naming the file, the line and the column. Rows whose kernel the simulator
//! cannot express are not errors: they parse, and [`Measurement::expressible`] says why they are
//! skipped.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use tpusim_chip::ChipModel;
use tpusim_kernel::{Direction, Exp, Kernel, MaskSource, Masking, Scope, Traversal};
use tpusim_model::KernelKind;
use tpusim_job::JobSpec;
use tpusim_workload::Mask;

tpusim_model::word_enum! {
    /// A word of the `options` column that names a kernel option (the rest of the text is a note).
    pub enum OptionWord {
        /// tokamax's `use_base2_exp`: `--exp base2`.
        Base2Exp = "base2-exp",
        /// tokamax's `use_experimental_scheduler`: `--experimental-scheduler`.
        ExperimentalScheduler = "experimental-scheduler",
        /// The forward also returns its residuals: `--return-residuals`.
        ReturnResiduals = "return-residuals",
    }
}

impl OptionWord {
    /// The `tpusim run` flag the option word stands for.
    pub fn flag(self) -> &'static str {
        match self {
            OptionWord::Base2Exp => "--exp base2",
            OptionWord::ExperimentalScheduler => "--experimental-scheduler",
            OptionWord::ReturnResiduals => "--return-residuals",
        }
    }
}

/// An error in a measurement file, naming the file, the line (1-based, the header is line 1) and
/// the column where it is.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub struct MeasureError {
    /// The file as given.
    pub file: String,
    /// 1-based line, when the error is in one.
    pub line: Option<u64>,
    /// Column name, when the error is in one.
    pub column: Option<String>,
    /// What is wrong and what is allowed.
    pub message: String,
}

impl fmt::Display for MeasureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(l) = self.line {
            write!(f, " line {l}")?;
        }
        if let Some(c) = &self.column {
            write!(f, ", column {c}")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Columns a measurement file must have.
pub const REQUIRED_COLUMNS: &[&str] = &["id", "chip", "kernel", "measured_ms"];

/// Every column a measurement file may have (any order). Columns not listed are errors.
pub const KNOWN_COLUMNS: &[&str] = &[
    "id",
    "chip",
    "kernel",
    "direction",
    "batch",
    "q_heads",
    "kv_heads",
    "q_len",
    "kv_len",
    "head_dim",
    "head_dim_v",
    "mask",
    "traversal",
    "masking",
    "mask_source",
    "tile_align",
    "block_q",
    "block_kv",
    "block_kv_compute",
    "vmem_limit_mib",
    "options",
    "measured_ms",
    "timing",
    "source",
    "kernel_ir",
    "runtime",
];

/// Runtime values of a described kernel: (operand name, `.npy` file).
type RuntimeFiles = Vec<(String, String)>;

/// One row of a measurement file, checked and typed. Empty cells are `None`.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    /// Row id (unique in the file).
    pub id: String,
    /// Line of the file the row starts on (header = line 1).
    pub line: u64,
    /// Chip preset name or chip-model path.
    pub chip: String,
    /// The `kernel` word as written.
    pub kernel_word: String,
    /// The kernel family it names, or `None` for a word that names none.
    pub kernel: Option<Kernel>,
    /// The direction (`fwd`, `bwd(dq,dk,dv)` = backward); `None` when empty, or for matmul and
    /// copy rows (whose `direction` cell is descriptive: `matmul`, `copy`).
    pub direction: Option<Direction>,
    /// The job the row describes, every typed cell mapped onto its field (kernel and chip are
    /// set by [`Measurement::job_spec`]).
    pub job: JobSpec,
    /// Mask in the `--mask` grammar as given, with a trailing note such as ` (reconstructed)`
    /// removed.
    pub mask: Option<String>,
    /// Kernel options named in the `options` column.
    pub options: Vec<OptionWord>,
    /// The rest of the `options` text (a note).
    pub note: String,
    /// Measured time, milliseconds.
    pub measured_ms: f64,
    /// How the time was measured (free text).
    pub timing: String,
    /// Where the measurement comes from (free text).
    pub source: String,
    /// A kernel read from its IR: the kernel description file (`tpusim.jax.describe`), resolved
    /// against the measurement file's folder. The row is then simulated from it (`kernel` names
    /// the row's kernel family, a label) and validated against, never fitted to.
    pub kernel_ir: Option<String>,
    /// Values the described kernel reads at run time: (operand name, `.npy` file resolved against
    /// the measurement file's folder), as `--runtime NAME=FILE` gives them.
    pub runtime: Vec<(String, String)>,
}

/// A parsed measurement file.
#[derive(Debug, Clone, PartialEq)]
pub struct MeasurementFile {
    /// The path as given.
    pub path: String,
    /// Rows in file order.
    pub rows: Vec<Measurement>,
}

fn strip_note(mask: &str) -> String {
    // A trailing " (note)" whose text holds no mask syntax is a remark, not part of the mask.
    let m = mask.trim();
    if let Some(open) = m.rfind(" (") {
        let tail = &m[open + 2..];
        if let Some(inner) = tail.strip_suffix(')') {
            if !inner.is_empty() && inner.chars().all(|c| c.is_ascii_alphabetic() || c == ' ' || c == '-' || c == '_') {
                return m[..open].trim().to_string();
            }
        }
    }
    m.to_string()
}

/// What a `timing` text says a time covers: a profiler's device time of the whole library call
/// ("device time from profiler trace", as tokamax's benchmark reports it) is scope `op`; a host
/// timer around the call ("wall clock incl. dispatch") scope `call`; kernel timings and the
/// rest are the kernel alone.
pub fn measured_scope(timing: &str) -> Scope {
    let t = timing.trim_start();
    if t.starts_with("wall clock incl. dispatch") {
        Scope::Call
    } else if t.starts_with("device time from profiler trace") {
        Scope::Op
    } else {
        Scope::Kernel
    }
}

impl Measurement {
    /// The kind of kernel this row is simulated as, or why it cannot be simulated.
    ///
    /// # Errors
    /// The reason the row is skipped (never a silent drop).
    pub fn expressible(&self) -> Result<KernelKind, String> {
        if self.kernel_ir.is_some() {
            return Err("a kernel read from its IR (`kernel_ir`): `tpusim validate` predicts it; no fit uses it".into());
        }
        let Some(kernel) = self.kernel else {
            return Err(format!("kernel '{}' is not one the simulator models (kernel families: {})", self.kernel_word, Kernel::allowed()));
        };
        match kernel.kind() {
            KernelKind::Copy => Err("a bare HBM copy is not a kernel the simulator runs on its own".into()),
            kind => Ok(kind),
        }
    }

    /// The scope a row of a kernel read from its IR is timed at: the row's (`timing`), but a
    /// profiler's device time of a described kernel is the kernel's (its description holds no
    /// XLA op around it).
    pub fn described_scope(&self) -> Scope {
        match measured_scope(&self.timing) {
            Scope::Op => Scope::Kernel,
            s => s,
        }
    }

    /// The job of a row of a kernel read from its IR: its description (`kernel_ir`) with the
    /// row's runtime values, on the row's chip, at [`Measurement::described_scope`]; `None` for a
    /// row of a kernel family ([`Measurement::job_spec`]).
    pub fn described_spec(&self) -> Option<JobSpec> {
        Some(JobSpec {
            chip: Some(self.chip.clone()),
            kernel_ir: Some(self.kernel_ir.clone()?),
            runtime: self.runtime.iter().map(|(name, file)| format!("{name}={file}")).collect(),
            scope: Some(self.described_scope()),
            ..Default::default()
        })
    }

    /// The mask, `full` when empty.
    pub fn mask_or_full(&self) -> &str {
        self.mask.as_deref().filter(|m| !m.is_empty()).unwrap_or("full")
    }

    /// Whether the mask keeps every pair.
    pub fn mask_is_full(&self) -> bool {
        Mask::parse(self.mask_or_full()).map(|m| m.is_full()).unwrap_or(false)
    }

    /// The job for this row, on `chip` (a preset name or a chip-model path), and a note when the
    /// row gives no block sizes (the kernel family's defaults then apply).
    ///
    /// Mapping: the row's typed cells ([`Measurement::job`]) with `kernel` the row's family and
    /// `chip`; attention rows take `traversal` and `masking` only when the mask is not full (a
    /// full mask has no sparse options).
    ///
    /// # Errors
    /// The reason the row cannot be simulated ([`Measurement::expressible`]).
    pub fn job_spec(&self, chip: &str) -> Result<(JobSpec, Option<String>), String> {
        let kind = self.expressible()?;
        let mut s = JobSpec { chip: Some(chip.to_string()), kernel: self.kernel, ..self.job.clone() };
        if kind == KernelKind::Attention && self.mask_is_full() {
            s.mask = None;
            s.traversal = None;
            s.masking = None;
        }
        let blocks_given = [s.block_q, s.block_kv, s.block_kv_compute, s.block_q_dkv, s.block_kv_dkv, s.block_m, s.block_n, s.block_k]
            .iter()
            .any(Option::is_some);
        let note = (!blocks_given).then(|| format!("the row gives no block sizes: the {} family's defaults", s.kernel()));
        Ok((s, note))
    }

    /// The key of the row's ranking group: rows with equal keys differ only in block sizes and
    /// kernel options (traversal, masking, mask source, tile alignment, option words).
    pub fn group_key(&self) -> Option<String> {
        let kind = self.expressible().ok()?;
        let j = &self.job;
        let o = |v: Option<u64>| v.map(|x| x.to_string()).unwrap_or_default();
        Some(match kind {
            KernelKind::Attention => format!(
                "{} attention {} B={} Hq={} Hkv={} Sq={} Skv={} d={}/{} mask {}",
                self.chip,
                self.direction.unwrap_or(Direction::Fwd),
                o(j.batch),
                o(j.heads),
                o(j.kv_heads.or(j.heads)),
                o(j.q_len),
                o(j.kv_len),
                o(j.head_dim),
                o(j.head_dim_v.or(j.head_dim)),
                self.mask_or_full()
            ),
            _ => format!("{} matmul M={} N={} K={}", self.chip, o(j.m), o(j.n), o(j.k)),
        })
    }
}

use tpusim_io::csv_line_at as line_at;

/// Reads and checks a measurement file.
///
/// `known_chips` are chip models (e.g. from `--chip my.toml`) whose `name` is accepted in the
/// `chip` column besides the presets and chip-model paths.
///
/// # Errors
/// [`MeasureError`] naming the file, line and column: unreadable file, malformed CSV, unknown or
/// missing columns, non-numeric or non-positive numbers, unknown option words, malformed masks,
/// unknown chips, duplicate ids, workload columns an expressible row needs but lacks, and a file
/// with no row after its header.
pub fn read_file(path: &str, known_chips: &[ChipModel]) -> Result<MeasurementFile, MeasureError> {
    let text = tpusim_io::read_text(path).map_err(|e| MeasureError {
        file: path.to_string(),
        line: None,
        column: None,
        message: format!("cannot read: {e}"),
    })?;
    parse(&text, path, known_chips)
}

/// Parses measurement CSV text; `path` names it in errors. See [`read_file`].
///
/// Stages (private): the header (`Columns::read`), then per row its identity (id and chip,
/// `RowCells::identity`), its kernel and direction (`RowCells::kernel`), its job
/// (`RowCells::job`) and the workload columns its kernel needs (`RowCells::check_needed`).
///
/// # Errors
/// As [`read_file`].
pub fn parse(text: &str, path: &str, known_chips: &[ChipModel]) -> Result<MeasurementFile, MeasureError> {
    let mut rdr = csv::ReaderBuilder::new().comment(Some(b'#')).trim(csv::Trim::All).from_reader(text.as_bytes());
    let columns = Columns::read(&mut rdr, text, path)?;
    let mut chips = ChipCheck { known: known_chips, checked: HashMap::new() };
    let mut seen: BTreeMap<String, u64> = BTreeMap::new();
    let mut rows = Vec::new();
    let mut lines = tpusim_io::CsvLines::new(text);
    for rec in rdr.records() {
        let rec = rec.map_err(|e| record_error(&e, text, path))?;
        let row = RowCells { rec: &rec, columns: &columns, line: rec.position().map(|p| lines.line_at(p.byte())).unwrap_or(0), path };
        let (id, chip) = row.identity(&mut seen, &mut chips)?;
        let (kernel_word, kernel, direction) = row.kernel()?;
        let measured_ms = row.measured_ms()?;
        let (options, note) = row.options()?;
        let (job, mask, timing) = row.job(kernel.map(Kernel::kind), direction, &options)?;
        let (kernel_ir, runtime) = row.described(path)?;
        let m = Measurement {
            id,
            line: row.line,
            chip,
            kernel_word,
            kernel,
            direction,
            job,
            mask,
            options,
            note,
            measured_ms,
            timing,
            source: row.cell("source").map(String::from).unwrap_or_default(),
            kernel_ir,
            runtime,
        };
        row.check_needed(&m)?;
        rows.push(m);
    }
    if rows.is_empty() {
        // Nothing to validate or fit: an input error, not a report of zero rows.
        return Err(MeasureError {
            file: path.to_string(),
            line: None,
            column: None,
            message: "no measurement rows after the header line (comments and blank lines are not rows); add at least one row".into(),
        });
    }
    Ok(MeasurementFile { path: path.to_string(), rows })
}

/// The header of a measurement file: column name to field index, every name known and given once,
/// the required ones present.
struct Columns {
    index: HashMap<String, usize>,
}

impl Columns {
    fn read(rdr: &mut csv::Reader<&[u8]>, text: &str, path: &str) -> Result<Columns, MeasureError> {
        let err = |line: u64, column: &str, message: String| MeasureError {
            file: path.to_string(),
            line: Some(line),
            column: (!column.is_empty()).then(|| column.to_string()),
            message,
        };
        let headers = rdr.headers().map_err(|e| err(1, "", format!("malformed CSV header: {e}")))?.clone();
        let line = headers.position().map(|p| line_at(text, p.byte())).unwrap_or(1);
        // A file of another kind (a sweep file, a chip model, a trace: TOML) is named as such,
        // not as a CSV with an unknown column.
        let first = text.lines().map(str::trim).find(|l| !l.is_empty() && !l.starts_with('#')).unwrap_or("");
        let toml_key = first.split_once('=').is_some_and(|(k, _)| !k.is_empty() && !k.contains(','));
        if first.starts_with('[') || toml_key {
            return Err(err(
                line,
                "",
                "not a measurement CSV: its first line reads as TOML (a sweep file, trace or chip model?); validate and calibrate read a CSV whose header names its columns, such as traces/measured/calibration.csv (see traces/measured/README.md)".into(),
            ));
        }
        let mut index: HashMap<String, usize> = HashMap::new();
        for (i, h) in headers.iter().enumerate() {
            if !KNOWN_COLUMNS.contains(&h) {
                return Err(err(
                    line,
                    h,
                    format!("unknown column; the columns are {} (see traces/measured/README.md)", KNOWN_COLUMNS.join(", ")),
                ));
            }
            if index.insert(h.to_string(), i).is_some() {
                return Err(err(line, h, "column given twice".into()));
            }
        }
        for r in REQUIRED_COLUMNS {
            if !index.contains_key(*r) {
                return Err(err(line, r, format!("missing column (required columns: {})", REQUIRED_COLUMNS.join(", "))));
            }
        }
        Ok(Columns { index })
    }
}

/// A CSV record that cannot be read (a row with the wrong number of fields, bad quoting), as a
/// [`MeasureError`] with its line.
fn record_error(e: &csv::Error, text: &str, path: &str) -> MeasureError {
    let line = match e.kind() {
        csv::ErrorKind::UnequalLengths { pos: Some(p), .. } => Some(line_at(text, p.byte())),
        _ => e.position().map(|p| line_at(text, p.byte())),
    };
    let message = match e.kind() {
        csv::ErrorKind::UnequalLengths { expected_len, len, .. } => format!("{len} fields, but the header has {expected_len} columns"),
        _ => format!("malformed CSV: {e}"),
    };
    MeasureError { file: path.to_string(), line, column: None, message }
}

/// Whether a `chip` cell names a usable model (a `--chip` model's name, a preset or a chip TOML
/// path), each name loaded once.
struct ChipCheck<'a> {
    known: &'a [ChipModel],
    checked: HashMap<String, Result<(), String>>,
}

impl ChipCheck<'_> {
    fn check(&mut self, chip: &str) -> Result<(), String> {
        let known = self.known;
        self.checked
            .entry(chip.to_string())
            .or_insert_with(|| {
                if known.iter().any(|c| c.name == chip) {
                    Ok(())
                } else {
                    ChipModel::load(chip).map(|_| ()).map_err(|e| e.to_string())
                }
            })
            .clone()
    }
}

/// One row's cells, read by column name, with errors naming the file, line and column.
struct RowCells<'a> {
    rec: &'a csv::StringRecord,
    columns: &'a Columns,
    line: u64,
    path: &'a str,
}

impl RowCells<'_> {
    fn err(&self, column: &str, message: String) -> MeasureError {
        MeasureError { file: self.path.to_string(), line: Some(self.line), column: Some(column.to_string()), message }
    }

    /// The cell of column `name`; `None` when the column is absent or the cell empty.
    fn cell(&self, name: &str) -> Option<&str> {
        self.columns.index.get(name).and_then(|&i| self.rec.get(i)).filter(|s| !s.is_empty())
    }

    /// A cell that must not be empty.
    fn required(&self, name: &str, what: &str) -> Result<String, MeasureError> {
        self.cell(name).map(String::from).ok_or_else(|| self.err(name, format!("empty; every row needs {what}")))
    }

    /// A whole number of at least 1, or empty.
    fn int(&self, name: &str) -> Result<Option<u64>, MeasureError> {
        match self.cell(name) {
            None => Ok(None),
            Some(s) => match s.parse::<u64>() {
                Ok(0) => Err(self.err(name, format!("\"{s}\" must be at least 1"))),
                Ok(v) => Ok(Some(v)),
                Err(_) => Err(self.err(name, format!("\"{s}\" is not a whole number"))),
            },
        }
    }

    /// A finite number above 0, or empty.
    fn pos_f64(&self, name: &str) -> Result<Option<f64>, MeasureError> {
        match self.cell(name) {
            None => Ok(None),
            Some(s) => match s.parse::<f64>() {
                Ok(v) if v.is_finite() && v > 0.0 => Ok(Some(v)),
                Ok(_) => Err(self.err(name, format!("\"{s}\" must be a number above 0"))),
                Err(_) => Err(self.err(name, format!("\"{s}\" is not a number"))),
            },
        }
    }

    /// A typed word, parsed by the enum that defines it (its error lists the words), or empty.
    fn typed<T: std::str::FromStr<Err = tpusim_model::WordError>>(&self, name: &str) -> Result<Option<T>, MeasureError> {
        self.cell(name).map(|s| s.parse::<T>().map_err(|e| self.err(name, format!("{e}, or empty")))).transpose()
    }

    /// Stage 1: the row's id (unique in the file) and chip (a usable model).
    fn identity(&self, seen: &mut BTreeMap<String, u64>, chips: &mut ChipCheck) -> Result<(String, String), MeasureError> {
        let id = self.required("id", "an id")?;
        if let Some(first) = seen.insert(id.clone(), self.line) {
            return Err(self.err("id", format!("\"{id}\" is also the id of line {first}; ids must be unique")));
        }
        let chip = self.required("chip", "a chip")?;
        chips.check(&chip).map_err(|e| self.err("chip", e))?;
        Ok((id, chip))
    }

    /// Stage 2: the `kernel` word, the family it names (`None` for a kind the simulator does not
    /// run) and the attention direction. Matmul and copy rows describe their direction in words of
    /// their own (`matmul`, `copy`).
    fn kernel(&self) -> Result<(String, Option<Kernel>, Option<Direction>), MeasureError> {
        let word = self.required("kernel", "a kernel")?;
        let kernel = word.parse::<Kernel>().ok();
        let attention = kernel.is_some_and(|k| k.kind() == KernelKind::Attention);
        let direction = match self.cell("direction") {
            None => None,
            Some(d) if attention => Some(Direction::from_measurement(d).map_err(|e| self.err("direction", e.to_string()))?),
            Some(d) if kernel.is_none() || d == "matmul" || d == "copy" => None,
            Some(d) => return Err(self.err("direction", format!("\"{d}\": expected matmul, copy or empty for kernel {word}"))),
        };
        Ok((word, kernel, direction))
    }

    /// The measured time in milliseconds (required, above 0).
    fn measured_ms(&self) -> Result<f64, MeasureError> {
        self.required("measured_ms", "a measured time")?;
        Ok(self.pos_f64("measured_ms")?.unwrap_or(0.0))
    }

    /// Stage 3: the known option words of `options` and the rest as a note.
    ///
    /// # Errors
    /// A word that spells an option word otherwise (`base2exp`, `Base2_Exp`, tokamax's
    /// `use_base2_exp`): taken as a note it would run the row with that option off, silently.
    fn options(&self) -> Result<(Vec<OptionWord>, String), MeasureError> {
        let (mut options, mut note) = (Vec::new(), Vec::new());
        let letters = |w: &str| w.chars().filter(char::is_ascii_alphanumeric).collect::<String>().to_ascii_lowercase();
        for w in self.cell("options").unwrap_or("").split_whitespace() {
            match w.parse::<OptionWord>() {
                Ok(o) => options.push(o),
                Err(_) => {
                    if let Some(o) = OptionWord::ALL.iter().find(|o| letters(w).contains(&letters(o.word()))) {
                        return Err(self.err(
                            "options",
                            format!(
                                "'{w}' looks like the option word `{}` but is not it: write `{}` to run the row with {}, or reword the note (option words are {})",
                                o.word(),
                                o.word(),
                                o.flag(),
                                OptionWord::ALL.iter().map(|o| format!("`{}`", o.word())).collect::<Vec<_>>().join(", ")
                            ),
                        ));
                    }
                    note.push(w)
                }
            }
        }
        Ok((options, note.join(" ")))
    }

    /// Stage 4: the row's job fields, its mask text and its `timing` cell. Matmul rows reuse the
    /// attention columns (M, N, K = `q_len`, `kv_len`, `head_dim`; blocks likewise); a backward
    /// row's blocks are its dkv kernel's (tokamax's backward Config); the option words a row names
    /// ran on, the ones it does not name ran off.
    fn job(
        &self,
        kind: Option<KernelKind>,
        direction: Option<Direction>,
        options: &[OptionWord],
    ) -> Result<(JobSpec, Option<String>, String), MeasureError> {
        let mask = match self.cell("mask") {
            None => None,
            Some(m) => {
                let m = strip_note(m);
                Mask::parse(&m).map_err(|e| self.err("mask", format!("\"{m}\": {e}")))?;
                Some(m)
            }
        };
        let tile_align = match self.cell("tile_align") {
            None => None,
            Some("yes") | Some("true") => Some(true),
            Some("no") | Some("false") => Some(false),
            Some(s) => return Err(self.err("tile_align", format!("\"{s}\": expected yes, no or empty"))),
        };
        let (q_len, kv_len, head_dim) = (self.int("q_len")?, self.int("kv_len")?, self.int("head_dim")?);
        let blocks = (self.int("block_q")?, self.int("block_kv")?, self.int("block_kv_compute")?);
        let mut job = JobSpec {
            batch: self.int("batch")?,
            heads: self.int("q_heads")?,
            kv_heads: self.int("kv_heads")?,
            head_dim_v: self.int("head_dim_v")?,
            mask: mask.clone(),
            traversal: self.typed::<Traversal>("traversal")?,
            masking: self.typed::<Masking>("masking")?,
            mask_source: self.typed::<MaskSource>("mask_source")?,
            tile_align: tile_align.filter(|&t| t),
            vmem_limit_mib: self.pos_f64("vmem_limit_mib")?,
            ..Default::default()
        };
        let timing = self.cell("timing").map(String::from).unwrap_or_default();
        if kind == Some(KernelKind::Matmul) {
            (job.m, job.n, job.k) = (q_len, kv_len, head_dim);
            (job.block_m, job.block_n, job.block_k) = blocks;
            job.batch = None;
            // A matmul has no ops around it: only a host-timed call differs from the kernel.
            job.scope = (measured_scope(&timing) == Scope::Call).then_some(Scope::Call);
        } else {
            (job.q_len, job.kv_len, job.head_dim) = (q_len, kv_len, head_dim);
            if direction == Some(Direction::Bwd) {
                (job.block_q_dkv, job.block_kv_dkv, job.block_kv_dkv_compute) = blocks;
            } else {
                (job.block_q, job.block_kv, job.block_kv_compute) = blocks;
            }
            job.direction = direction;
            job.scope = Some(measured_scope(&timing));
            job.exp = Some(if options.contains(&OptionWord::Base2Exp) { Exp::Base2 } else { Exp::Natural });
            job.experimental_scheduler = Some(options.contains(&OptionWord::ExperimentalScheduler));
            job.return_residuals = Some(options.contains(&OptionWord::ReturnResiduals));
        }
        Ok((job, mask, timing))
    }

    /// Stage 5 (rows of a kernel read from its IR): the description file and runtime values,
    /// resolved against the measurement file's folder (`base`'s). A `runtime` cell is
    /// `NAME=FILE.npy` pairs separated by `;`.
    fn described(&self, base: &str) -> Result<(Option<String>, RuntimeFiles), MeasureError> {
        let dir = std::path::Path::new(base).parent().unwrap_or(std::path::Path::new(""));
        let resolve = |f: &str| dir.join(f).to_string_lossy().into_owned();
        let kernel_ir = self.cell("kernel_ir").map(resolve);
        let mut runtime: Vec<(String, String)> = Vec::new();
        for pair in self.cell("runtime").unwrap_or("").split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((name, file)) = pair.split_once('=').filter(|(n, f)| !n.trim().is_empty() && !f.trim().is_empty()) else {
                return Err(self.err("runtime", format!("\"{pair}\": expected NAME=FILE.npy (pairs separated by `;`)")));
            };
            if kernel_ir.is_none() {
                return Err(self.err("runtime", "runtime values are for a kernel read from its IR: give its description in the kernel_ir column".into()));
            }
            if runtime.iter().any(|(n, _)| n == name.trim()) {
                return Err(self.err("runtime", format!("{}: given twice (each runtime operand takes one file)", name.trim())));
            }
            runtime.push((name.trim().to_string(), resolve(file.trim())));
        }
        Ok((kernel_ir, runtime))
    }

    /// Stage 6: a row the simulator can express has the workload columns its kernel needs.
    fn check_needed(&self, m: &Measurement) -> Result<(), MeasureError> {
        let Ok(kind) = m.expressible() else { return Ok(()) };
        let needed: &[&str] = match kind {
            KernelKind::Attention => &["batch", "q_heads", "q_len", "kv_len", "head_dim"],
            _ => &["q_len", "kv_len", "head_dim"],
        };
        for n in needed {
            if self.cell(n).is_none() {
                let why = if self.columns.index.contains_key(*n) { "empty" } else { "missing from the header" };
                return Err(self.err(n, format!("{why}; kernel {} needs {}", m.kernel_word, needed.join(", "))));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "id,chip,kernel,direction,batch,q_heads,kv_heads,q_len,kv_len,head_dim,head_dim_v,mask,traversal,masking,tile_align,block_q,block_kv,block_kv_compute,options,measured_ms,timing,source";

    fn one(row: &str) -> Result<MeasurementFile, MeasureError> {
        parse(&format!("{HEADER}\n{row}\n"), "m.csv", &[])
    }

    #[test]
    fn a_good_row_parses_and_maps() {
        let f = one("A,v6e,tokamax-splash,fwd,1,8,8,4096,4096,128,128,causal (reconstructed),compact,partial,no,1024,1024,512,x,1.5,t,s")
            .unwrap();
        let r = &f.rows[0];
        assert_eq!((r.line, r.mask.as_deref(), r.measured_ms), (2, Some("causal"), 1.5));
        let (s, note) = r.job_spec("v6e").unwrap();
        assert_eq!((s.heads, s.block_kv_compute, s.traversal), (Some(8), Some(512), Some(Traversal::Compact)));
        assert_eq!(s.kernel, Some(Kernel::TokamaxSplash));
        assert!(note.is_none());
    }

    #[test]
    fn full_mask_rows_take_no_sparse_options() {
        let f = one("A,v6e,tokamax-splash,fwd,1,8,8,4096,4096,128,128,full,compact,partial,no,1024,1024,512,x,1.5,t,s").unwrap();
        let (s, _) = f.rows[0].job_spec("v6e").unwrap();
        assert_eq!((s.mask, s.traversal, s.masking), (None, None, None));
    }

    #[test]
    fn rows_without_blocks_take_the_family_defaults_and_options_map_to_words() {
        let f = one("B0,v6e,splash-dense,fwd,1,10,10,7560,7560,128,128,full,,,,,,,none given base2-exp,7.8,t,s").unwrap();
        let r = &f.rows[0];
        let (s, note) = r.job_spec("v6e").unwrap();
        assert_eq!((s.block_q, s.kernel), (None, Some(Kernel::SplashDense)));
        assert!(note.unwrap().contains("splash-dense family's defaults"));
        assert_eq!(r.options, vec![OptionWord::Base2Exp]);
        assert_eq!(r.note, "none given");
        let e = one("B0,v6e,tokamax-splash,fwd,1,10,10,7560,7560,128,128,full,,zigzag,,,,,,7.8,t,s").unwrap_err().to_string();
        assert!(e.contains("column masking") && e.contains("all, partial or none"), "{e}");
    }

    #[test]
    fn an_option_word_spelt_otherwise_is_an_error_not_a_note() {
        // Taken as a note, `base2exp` would run the row with natural exp, silently.
        for (word, option) in [("base2exp", "base2-exp"), ("use_base2_exp", "base2-exp"), ("Experimental_Scheduler", "experimental-scheduler"), ("return-residuals;", "return-residuals")] {
            let e = one(&format!("A,v6e,tokamax-splash,fwd,1,8,8,4096,4096,128,128,full,,,,512,512,512,{word},1.5,t,s")).unwrap_err().to_string();
            assert!(e.contains("column options") && e.contains(&format!("'{word}'")) && e.contains(&format!("`{option}`")), "{e}");
        }
        // Other words stay a note.
        let f = one("A,v6e,tokamax-splash,fwd,1,8,8,4096,4096,128,128,full,,,,512,512,512,base2-exp tuned by hand,1.5,t,s").unwrap();
        assert_eq!((f.rows[0].options.clone(), f.rows[0].note.as_str()), (vec![OptionWord::Base2Exp], "tuned by hand"));
    }

    #[test]
    fn directions_map_to_typed_values() {
        let f = one("B,v7x,tokamax-splash,\"bwd(dq,dk,dv)\",1,8,8,4096,4096,128,128,full,,,,,,,,1,t,s").unwrap();
        assert_eq!(f.rows[0].direction, Some(Direction::Bwd));
        let e = one("B,v7x,tokamax-splash,sideways,1,8,8,4096,4096,128,128,full,,,,,,,,1,t,s").unwrap_err().to_string();
        assert!(e.contains("column direction") && e.contains("bwd(dq,dk,dv)"), "{e}");
        let f = one("M,v6e,xla-matmul,matmul,1,,,4096,4096,4096,,,,,,,,,,0.16,t,s").unwrap();
        assert_eq!((f.rows[0].direction, f.rows[0].job.m), (None, Some(4096)));
    }

    #[test]
    fn inexpressible_rows_say_why() {
        let f = one("X,v6e,hbm-copy,copy,1,,,,,,,,,,,,,,,0.16,t,s").unwrap();
        assert!(f.rows[0].expressible().unwrap_err().contains("copy"));
        let f = one("X,v6e,flash-attention-3,fwd,1,8,8,4096,4096,128,128,full,,,,,,,,0.16,t,s").unwrap();
        assert!(f.rows[0].expressible().unwrap_err().contains("flash-attention-3"));
    }

    #[test]
    fn non_numeric_time_names_line_and_column() {
        let e = one("A,v6e,tokamax-splash,fwd,1,8,8,4096,4096,128,128,full,,,,,,,x,abc,t,s").unwrap_err().to_string();
        assert_eq!(e, "m.csv line 2, column measured_ms: \"abc\" is not a number");
        let e = one("A,v6e,tokamax-splash,fwd,1,8,8,4096,4096,128,128,full,,,,,,,x,-1,t,s").unwrap_err().to_string();
        assert!(e.contains("line 2, column measured_ms") && e.contains("above 0"), "{e}");
        let e = one("A,v6e,tokamax-splash,fwd,1,8,8,40x96,4096,128,128,full,,,,,,,x,1,t,s").unwrap_err().to_string();
        assert!(e.contains("line 2, column q_len") && e.contains("40x96"), "{e}");
    }

    /// A TOML file given where a measurement CSV goes is named as such (it read "column
    /// [base]: unknown column").
    #[test]
    fn a_toml_file_is_named_as_not_a_measurement_csv() {
        for text in ["[base]\nheads = 2\n", "# a sweep\ndescription = \"a, b\"\n[axes]\n", "chip = \"v6e\"\n"] {
            let e = parse(text, "s.toml", &[]).unwrap_err().to_string();
            assert!(e.contains("not a measurement CSV") && e.contains("TOML") && !e.contains("unknown column"), "{text}: {e}");
        }
        assert!(one("A,v6e,tokamax-splash,fwd,1,8,8,4096,4096,128,128,full,,,,,,,x,1,t,s").is_ok());
    }

    #[test]
    fn unknown_chip_and_words_name_line_and_column() {
        let e = one("A,v9z,tokamax-splash,fwd,1,8,8,4096,4096,128,128,full,,,,,,,x,1,t,s").unwrap_err().to_string();
        assert!(e.starts_with("m.csv line 2, column chip:") && e.contains("v9z") && e.contains("v6e"), "{e}");
        let e = one("A,v6e,tokamax-splash,fwd,1,8,8,4096,4096,128,128,causal,zigzag,,,,,,x,1,t,s").unwrap_err().to_string();
        assert!(e.contains("line 2, column traversal") && e.contains("compact"), "{e}");
        let e = one("A,v6e,tokamax-splash,fwd,1,8,8,4096,4096,128,128,bnad:12,,,,,,,x,1,t,s").unwrap_err().to_string();
        assert!(e.contains("line 2, column mask"), "{e}");
    }

    #[test]
    fn missing_and_unknown_columns_are_named() {
        let e = parse("id,chip,kernel\nA,v6e,splash\n", "m.csv", &[]).unwrap_err().to_string();
        assert!(e.contains("line 1, column measured_ms") && e.contains("missing"), "{e}");
        let e = parse("id,chip,kernel,measured_ms,colour\n", "m.csv", &[]).unwrap_err().to_string();
        assert!(e.contains("line 1, column colour") && e.contains("unknown"), "{e}");
        let e = parse("id,chip,kernel,measured_ms,batch,q_heads,kv_len,head_dim\nA,v6e,splash,1,1,8,4096,128\n", "m.csv", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2, column q_len") && e.contains("missing from the header"), "{e}");
    }

    #[test]
    fn ragged_rows_and_duplicate_ids_are_errors() {
        let e = one("A,v6e,splash,fwd").unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("fields"), "{e}");
        let row = "A,v6e,tokamax-splash,fwd,1,8,8,4096,4096,128,128,full,,,,,,,x,1,t,s";
        let e = parse(&format!("{HEADER}\n{row}\n{row}\n"), "m.csv", &[]).unwrap_err().to_string();
        assert!(e.contains("line 3, column id") && e.contains("line 2"), "{e}");
    }

    #[test]
    fn lines_count_from_the_file_with_comments_blank_lines_and_quotes() {
        let row = |id: &str| format!("{id},v6e,tokamax-splash,fwd,1,8,8,4096,4096,128,128,full,,,,,,,\"x, y\",1,t,s");
        let text = format!("# comment\n{HEADER}\n{}\n\n# another\n{}\n{}\n", row("A"), row("B"), row("C"));
        let f = parse(&text, "m.csv", &[]).unwrap();
        assert_eq!(f.rows.iter().map(|r| r.line).collect::<Vec<_>>(), [3, 6, 7]);
        let text = format!("{HEADER}\n{}\n{}\n", row("A"), row("B").replace(",1,t,s", ",abc,t,s"));
        let e = parse(&text, "m.csv", &[]).unwrap_err().to_string();
        assert!(e.starts_with("m.csv line 3, column measured_ms"), "{e}");
        // the shipped file: header on line 1, first row on line 2
        let shipped = include_str!("../../../traces/measured/calibration.csv");
        let f = parse(shipped, "calibration.csv", &[]).unwrap();
        assert_eq!((f.rows[0].id.as_str(), f.rows[0].line), ("VD-B0", 2));
        assert_eq!(f.rows.last().map(|r| r.line), Some(shipped.lines().count() as u64));
    }

    #[test]
    fn notes_in_parentheses_are_stripped_but_groups_are_not() {
        assert_eq!(strip_note("band:15000+sink:3600 (reconstructed)"), "band:15000+sink:3600");
        assert_eq!(strip_note("causal&(band:8+sink:2)"), "causal&(band:8+sink:2)");
    }
}
