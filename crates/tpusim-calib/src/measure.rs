//! Measurement files: CSV tables of measured kernel timings (format documented in
//! `traces/measured/README.md`) and their mapping onto simulator jobs ([`JobSpec`]).
//!
//! One row is one measured kernel call: its workload (`batch`, `q_heads`, `kv_heads`, `q_len`,
//! `kv_len`, `head_dim`, `head_dim_v`, `mask`), kernel options (`traversal`, `masking`,
//! `mask_source`, `tile_align`), block sizes (`block_q`, `block_kv`, `block_kv_compute`), the
//! `chip` and the measured time `measured_ms`. Matmul rows reuse the attention columns:
//! M = `q_len`, N = `kv_len`, K = `head_dim`, block M/N/K = `block_q`/`block_kv`/`block_kv_compute`.
//!
//! Parsing is strict: an unknown column, a missing required column, a cell that is not a number
//! where a number is expected, an unknown option word, a malformed mask or an unknown chip is a
//! [`MeasureError`] naming the file, the line and the column. Rows whose kernel the simulator
//! cannot express (XLA's matmul, a bare HBM copy, a backward pass) are not errors: they parse, and
//! [`Measurement::expressible`] says why they are skipped.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use tpusim_chip::ChipModel;
use tpusim_report::JobSpec;
use tpusim_workload::Mask;

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
];

/// `kernel` words simulated as Splash-style forward attention.
pub const ATTENTION_KERNELS: &[&str] = &["splash", "splash-dense", "sparse-splash", "tokamax-splash"];
/// `kernel` words simulated as the blocked Pallas matmul.
pub const MATMUL_KERNELS: &[&str] = &["pallas-matmul", "matmul"];

/// The simulator's kernel a row maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// Splash-style forward attention (`--kernel splash`).
    Attention,
    /// Blocked Pallas matmul (`--kernel matmul`).
    Matmul,
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::Attention => "attention",
            Family::Matmul => "matmul",
        })
    }
}

/// One row of a measurement file, checked and typed. Empty cells are `None`.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    /// Row id (unique in the file).
    pub id: String,
    /// Line of the file the row starts on (header = line 1).
    pub line: u64,
    /// Chip preset name or chip-model path.
    pub chip: String,
    /// Kernel word as written (`tokamax-splash`, `pallas-matmul`, `xla-matmul`, ...).
    pub kernel: String,
    /// `fwd`, `bwd`, `matmul`, `copy` or empty.
    pub direction: Option<String>,
    /// Batch.
    pub batch: Option<u64>,
    /// Query heads.
    pub q_heads: Option<u64>,
    /// Key/value heads.
    pub kv_heads: Option<u64>,
    /// Query length (matmul: M).
    pub q_len: Option<u64>,
    /// Key/value length (matmul: N).
    pub kv_len: Option<u64>,
    /// Head dimension of q and k (matmul: K).
    pub head_dim: Option<u64>,
    /// Head dimension of v and o.
    pub head_dim_v: Option<u64>,
    /// Mask in the `--mask` grammar, with a trailing note such as ` (reconstructed)` removed.
    pub mask: Option<String>,
    /// `full-grid` or `compact`.
    pub traversal: Option<String>,
    /// `all`, `partial` or `none`.
    pub masking: Option<String>,
    /// `computed` or `loaded`.
    pub mask_source: Option<String>,
    /// Mask rounded to whole tiles (`yes`/`no`).
    pub tile_align: Option<bool>,
    /// Block rows of q (matmul: block M).
    pub block_q: Option<u64>,
    /// Block rows of k/v (matmul: block N).
    pub block_kv: Option<u64>,
    /// Inner compute width (matmul: block K).
    pub block_kv_compute: Option<u64>,
    /// Scoped VMEM limit, MiB.
    pub vmem_limit_mib: Option<f64>,
    /// Free text about the kernel's options.
    pub options: String,
    /// Measured time, milliseconds.
    pub measured_ms: f64,
    /// How the time was measured (free text).
    pub timing: String,
    /// Where the measurement comes from (free text).
    pub source: String,
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

/// Finds "uses A/B/C" (three whole numbers) in free text: assumed block sizes.
fn uses_blocks(text: &str) -> Option<(u64, u64, u64)> {
    let mut rest = text;
    while let Some(pos) = rest.find("uses ") {
        let after = &rest[pos + 5..];
        let token: String = after.chars().take_while(|c| c.is_ascii_digit() || *c == '/').collect();
        let parts: Vec<&str> = token.split('/').collect();
        if parts.len() == 3 {
            if let (Ok(a), Ok(b), Ok(c)) = (parts[0].parse(), parts[1].parse(), parts[2].parse()) {
                return Some((a, b, c));
            }
        }
        rest = after;
    }
    None
}

impl Measurement {
    /// The simulator kernel this row maps to, or why it cannot be simulated.
    ///
    /// # Errors
    /// The reason the row is skipped (never a silent drop).
    pub fn expressible(&self) -> Result<Family, String> {
        let k = self.kernel.as_str();
        let family = if ATTENTION_KERNELS.contains(&k) {
            Family::Attention
        } else if MATMUL_KERNELS.contains(&k) {
            Family::Matmul
        } else if k == "xla-matmul" {
            return Err("XLA's own matmul is not a Pallas kernel; the simulator models Pallas kernels (use kernel pallas-matmul for a blocked Pallas matmul)".into());
        } else if k == "hbm-copy" {
            return Err("a bare HBM copy is not a kernel the simulator runs (fitted.hbm_efficiency is read off it by hand; see models/v6e.toml)".into());
        } else {
            return Err(format!(
                "kernel '{k}' is not one the simulator models (attention: {}; matmul: {})",
                ATTENTION_KERNELS.join(", "),
                MATMUL_KERNELS.join(", ")
            ));
        };
        if family == Family::Attention {
            if let Some(d) = self.direction.as_deref() {
                if d != "fwd" {
                    return Err(format!("direction '{d}': only the forward pass of attention is modelled"));
                }
            }
        }
        Ok(family)
    }

    /// The mask, `full` when empty.
    pub fn mask_or_full(&self) -> &str {
        self.mask.as_deref().filter(|m| !m.is_empty()).unwrap_or("full")
    }

    /// Whether the mask keeps every pair.
    pub fn mask_is_full(&self) -> bool {
        Mask::parse(self.mask_or_full()).map(|m| m.is_full()).unwrap_or(false)
    }

    /// Block sizes assumed for a row that gives none: "uses A/B/C" in its `options` text (e.g.
    /// VD-B0: "maxdiffusion Wan v6e config uses 3024/2048/1024").
    pub fn assumed_blocks(&self) -> Option<(u64, u64, u64)> {
        if self.block_q.is_none() && self.block_kv.is_none() && self.block_kv_compute.is_none() {
            uses_blocks(&self.options)
        } else {
            None
        }
    }

    /// The job for this row, on `chip` (a preset name or a chip-model path), and a note when block
    /// sizes were assumed or left to the simulator's defaults.
    ///
    /// Mapping: attention rows set chip, batch, heads (= q_heads), kv_heads, q_len, kv_len,
    /// head_dim, head_dim_v and mask; traversal and masking only when the mask is not full (a
    /// full mask has no sparse options); mask_source, tile_align and vmem_limit_mib when given;
    /// block sizes when given. Matmul rows set m = q_len, n = kv_len, k = head_dim and
    /// block_m/n/k = block_q/block_kv/block_kv_compute.
    ///
    /// # Errors
    /// The reason the row cannot be simulated ([`Measurement::expressible`]).
    pub fn job_spec(&self, chip: &str) -> Result<(JobSpec, Option<String>), String> {
        let family = self.expressible()?;
        let mut s = JobSpec { chip: Some(chip.to_string()), ..Default::default() };
        let (mut bq, mut bkv, mut bc) = (self.block_q, self.block_kv, self.block_kv_compute);
        let mut note = None;
        if bq.is_none() && bkv.is_none() && bc.is_none() {
            if let Some((a, b, c)) = self.assumed_blocks() {
                (bq, bkv, bc) = (Some(a), Some(b), Some(c));
                note = Some(format!("blocks {a}/{b}/{c} assumed from the options text; the row gives none"));
            } else {
                note = Some("the row gives no block sizes; the simulator's defaults for the workload".to_string());
            }
        }
        match family {
            Family::Matmul => {
                s.kernel = Some("matmul".into());
                s.m = self.q_len;
                s.n = self.kv_len;
                s.k = self.head_dim;
                s.block_m = bq;
                s.block_n = bkv;
                s.block_k = bc;
            }
            Family::Attention => {
                s.kernel = Some("splash".into());
                s.batch = self.batch;
                s.heads = self.q_heads;
                s.kv_heads = self.kv_heads;
                s.q_len = self.q_len;
                s.kv_len = self.kv_len;
                s.head_dim = self.head_dim;
                s.head_dim_v = self.head_dim_v;
                if !self.mask_is_full() {
                    s.mask = Some(self.mask_or_full().to_string());
                    s.traversal = self.traversal.clone();
                    s.masking = self.masking.clone();
                }
                s.mask_source = self.mask_source.clone();
                s.tile_align = self.tile_align.filter(|&t| t);
                s.block_q = bq;
                s.block_kv = bkv;
                s.block_kv_compute = bc;
            }
        }
        s.vmem_limit_mib = self.vmem_limit_mib;
        Ok((s, note))
    }

    /// The key of the row's ranking group: rows with equal keys differ only in block sizes and
    /// kernel options (traversal, masking, mask source, tile alignment).
    pub fn group_key(&self) -> Option<String> {
        let family = self.expressible().ok()?;
        let o = |v: Option<u64>| v.map(|x| x.to_string()).unwrap_or_default();
        Some(match family {
            Family::Matmul => {
                format!("{} matmul M={} N={} K={}", self.chip, o(self.q_len), o(self.kv_len), o(self.head_dim))
            }
            Family::Attention => format!(
                "{} attention B={} Hq={} Hkv={} Sq={} Skv={} d={}/{} mask {}",
                self.chip,
                o(self.batch),
                o(self.q_heads),
                o(self.kv_heads.or(self.q_heads)),
                o(self.q_len),
                o(self.kv_len),
                o(self.head_dim),
                o(self.head_dim_v.or(self.head_dim)),
                self.mask_or_full()
            ),
        })
    }
}

/// The 1-based line of the record that starts at or after byte `byte` (the csv crate's position
/// may point at the previous line's terminator or at skipped blank and comment lines).
fn line_at(text: &str, byte: u64) -> u64 {
    let b = text.as_bytes();
    let mut i = (byte as usize).min(b.len());
    loop {
        while i < b.len() && (b[i] == b'\n' || b[i] == b'\r') {
            i += 1;
        }
        if i < b.len() && b[i] == b'#' {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        break;
    }
    1 + b[..i].iter().filter(|&&c| c == b'\n').count() as u64
}

/// Reads and checks a measurement file.
///
/// `known_chips` are chip models (e.g. from `--chip my.toml`) whose `name` is accepted in the
/// `chip` column besides the presets and chip-model paths.
///
/// # Errors
/// [`MeasureError`] naming the file, line and column: unreadable file, malformed CSV, unknown or
/// missing columns, non-numeric or non-positive numbers, unknown option words, malformed masks,
/// unknown chips, duplicate ids, and workload columns an expressible row needs but lacks.
pub fn read_file(path: &str, known_chips: &[ChipModel]) -> Result<MeasurementFile, MeasureError> {
    let text = std::fs::read_to_string(path).map_err(|e| MeasureError {
        file: path.to_string(),
        line: None,
        column: None,
        message: format!("cannot read: {e}"),
    })?;
    parse(&text, path, known_chips)
}

/// Parses measurement CSV text; `path` names it in errors. See [`read_file`].
///
/// # Errors
/// As [`read_file`].
pub fn parse(text: &str, path: &str, known_chips: &[ChipModel]) -> Result<MeasurementFile, MeasureError> {
    let err = |line: Option<u64>, column: Option<&str>, message: String| MeasureError {
        file: path.to_string(),
        line,
        column: column.map(String::from),
        message,
    };
    let mut rdr = csv::ReaderBuilder::new().comment(Some(b'#')).trim(csv::Trim::All).from_reader(text.as_bytes());
    let headers = rdr.headers().map_err(|e| err(Some(1), None, format!("malformed CSV header: {e}")))?.clone();
    let header_line = headers.position().map(|p| line_at(text, p.byte())).unwrap_or(1);
    let mut col: HashMap<String, usize> = HashMap::new();
    for (i, h) in headers.iter().enumerate() {
        if !KNOWN_COLUMNS.contains(&h) {
            return Err(err(
                Some(header_line),
                Some(h),
                format!("unknown column; the columns are {} (see traces/measured/README.md)", KNOWN_COLUMNS.join(", ")),
            ));
        }
        if col.insert(h.to_string(), i).is_some() {
            return Err(err(Some(header_line), Some(h), "column given twice".into()));
        }
    }
    for r in REQUIRED_COLUMNS {
        if !col.contains_key(*r) {
            return Err(err(
                Some(header_line),
                Some(r),
                format!("missing column (required columns: {})", REQUIRED_COLUMNS.join(", ")),
            ));
        }
    }
    let mut chips_ok: HashMap<String, Result<(), String>> = HashMap::new();
    let mut seen: BTreeMap<String, u64> = BTreeMap::new();
    let mut rows = Vec::new();
    for rec in rdr.records() {
        let rec = rec.map_err(|e| {
            let line = match e.kind() {
                csv::ErrorKind::UnequalLengths { pos: Some(p), .. } => Some(line_at(text, p.byte())),
                _ => e.position().map(|p| line_at(text, p.byte())),
            };
            let msg = match e.kind() {
                csv::ErrorKind::UnequalLengths { expected_len, len, .. } => {
                    format!("{len} fields, but the header has {expected_len} columns")
                }
                _ => format!("malformed CSV: {e}"),
            };
            err(line, None, msg)
        })?;
        let line = rec.position().map(|p| line_at(text, p.byte())).unwrap_or(0);
        let cell = |name: &str| -> Option<&str> { col.get(name).and_then(|&i| rec.get(i)).filter(|s| !s.is_empty()) };
        let text_of = |name: &str| cell(name).map(String::from);
        let int = |name: &str| -> Result<Option<u64>, MeasureError> {
            match cell(name) {
                None => Ok(None),
                Some(s) => match s.parse::<u64>() {
                    Ok(0) => Err(err(Some(line), Some(name), format!("\"{s}\" must be at least 1"))),
                    Ok(v) => Ok(Some(v)),
                    Err(_) => Err(err(Some(line), Some(name), format!("\"{s}\" is not a whole number"))),
                },
            }
        };
        let pos_f64 = |name: &str| -> Result<Option<f64>, MeasureError> {
            match cell(name) {
                None => Ok(None),
                Some(s) => match s.parse::<f64>() {
                    Ok(v) if v.is_finite() && v > 0.0 => Ok(Some(v)),
                    Ok(_) => Err(err(Some(line), Some(name), format!("\"{s}\" must be a number above 0"))),
                    Err(_) => Err(err(Some(line), Some(name), format!("\"{s}\" is not a number"))),
                },
            }
        };
        let word = |name: &str, allowed: &[&str]| -> Result<Option<String>, MeasureError> {
            match cell(name) {
                None => Ok(None),
                Some(s) if allowed.contains(&s) => Ok(Some(s.to_string())),
                Some(s) => {
                    Err(err(Some(line), Some(name), format!("\"{s}\": expected {} or empty", allowed.join(", "))))
                }
            }
        };
        let id =
            cell("id").ok_or_else(|| err(Some(line), Some("id"), "empty; every row needs an id".into()))?.to_string();
        if let Some(first) = seen.insert(id.clone(), line) {
            return Err(err(
                Some(line),
                Some("id"),
                format!("\"{id}\" is also the id of line {first}; ids must be unique"),
            ));
        }
        let chip = cell("chip")
            .ok_or_else(|| err(Some(line), Some("chip"), "empty; every row needs a chip".into()))?
            .to_string();
        let chip_check = chips_ok
            .entry(chip.clone())
            .or_insert_with(|| {
                if known_chips.iter().any(|c| c.name == chip) {
                    Ok(())
                } else {
                    ChipModel::load(&chip).map(|_| ()).map_err(|e| e.to_string())
                }
            })
            .clone();
        if let Err(e) = chip_check {
            return Err(err(Some(line), Some("chip"), e));
        }
        let kernel = cell("kernel")
            .ok_or_else(|| err(Some(line), Some("kernel"), "empty; every row needs a kernel".into()))?
            .to_string();
        let measured_ms = match cell("measured_ms") {
            None => return Err(err(Some(line), Some("measured_ms"), "empty; every row needs a measured time".into())),
            Some(_) => pos_f64("measured_ms")?.unwrap_or(0.0),
        };
        let mask = match cell("mask") {
            None => None,
            Some(m) => {
                let m = strip_note(m);
                Mask::parse(&m).map_err(|e| err(Some(line), Some("mask"), format!("\"{m}\": {e}")))?;
                Some(m)
            }
        };
        let tile_align = match cell("tile_align") {
            None => None,
            Some("yes") | Some("true") => Some(true),
            Some("no") | Some("false") => Some(false),
            Some(s) => return Err(err(Some(line), Some("tile_align"), format!("\"{s}\": expected yes, no or empty"))),
        };
        let m = Measurement {
            id,
            line,
            chip,
            kernel,
            direction: text_of("direction"),
            batch: int("batch")?,
            q_heads: int("q_heads")?,
            kv_heads: int("kv_heads")?,
            q_len: int("q_len")?,
            kv_len: int("kv_len")?,
            head_dim: int("head_dim")?,
            head_dim_v: int("head_dim_v")?,
            mask,
            traversal: word("traversal", &["full-grid", "compact"])?,
            masking: word("masking", &["all", "partial", "none"])?,
            mask_source: word("mask_source", &["computed", "loaded"])?,
            tile_align,
            block_q: int("block_q")?,
            block_kv: int("block_kv")?,
            block_kv_compute: int("block_kv_compute")?,
            vmem_limit_mib: pos_f64("vmem_limit_mib")?,
            options: text_of("options").unwrap_or_default(),
            measured_ms,
            timing: text_of("timing").unwrap_or_default(),
            source: text_of("source").unwrap_or_default(),
        };
        if let Ok(family) = m.expressible() {
            let needed: &[&str] = match family {
                Family::Attention => &["batch", "q_heads", "q_len", "kv_len", "head_dim"],
                Family::Matmul => &["q_len", "kv_len", "head_dim"],
            };
            for n in needed {
                if cell(n).is_none() {
                    let why = if col.contains_key(*n) { "empty" } else { "missing from the header" };
                    return Err(err(
                        Some(line),
                        Some(n),
                        format!("{why}; kernel {} needs {}", m.kernel, needed.join(", ")),
                    ));
                }
            }
        }
        rows.push(m);
    }
    Ok(MeasurementFile { path: path.to_string(), rows })
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
        let f = one("A,v6e,tokamax-splash,fwd,1,8,8,4096,4096,128,128,causal (reconstructed),compact,partial,no,1024,1024,512,x,1.5,t,s").unwrap();
        let r = &f.rows[0];
        assert_eq!((r.line, r.mask.as_deref(), r.measured_ms), (2, Some("causal"), 1.5));
        let (s, note) = r.job_spec("v6e").unwrap();
        assert_eq!((s.heads, s.block_kv_compute, s.traversal.as_deref()), (Some(8), Some(512), Some("compact")));
        assert!(note.is_none());
    }

    #[test]
    fn full_mask_rows_take_no_sparse_options() {
        let f = one("A,v6e,tokamax-splash,fwd,1,8,8,4096,4096,128,128,full,compact,partial,no,1024,1024,512,x,1.5,t,s")
            .unwrap();
        let (s, _) = f.rows[0].job_spec("v6e").unwrap();
        assert_eq!((s.mask, s.traversal, s.masking), (None, None, None));
    }

    #[test]
    fn blocks_are_assumed_from_options_text() {
        let f = one("B0,v6e,splash-dense,fwd,1,10,10,75600,75600,128,128,full,full-grid,none,no,,,,config uses 3024/2048/1024,78.7,t,s").unwrap();
        let (s, note) = f.rows[0].job_spec("v6e").unwrap();
        assert_eq!((s.block_q, s.block_kv, s.block_kv_compute), (Some(3024), Some(2048), Some(1024)));
        assert!(note.unwrap().contains("3024/2048/1024 assumed"));
        let f = one("B0,v6e,splash-dense,fwd,1,10,10,7560,7560,128,128,full,,,,,,,none given,7.8,t,s").unwrap();
        let (s, note) = f.rows[0].job_spec("v6e").unwrap();
        assert_eq!(s.block_q, None);
        assert!(note.unwrap().contains("defaults"));
    }

    #[test]
    fn inexpressible_rows_say_why() {
        let f = one("X,v6e,xla-matmul,matmul,1,,,4096,4096,4096,,,,,,,,,,0.16,t,s").unwrap();
        assert!(f.rows[0].expressible().unwrap_err().contains("XLA"));
        let f = one("X,v6e,tokamax-splash,bwd,1,8,8,4096,4096,128,128,full,,,,,,,,0.16,t,s").unwrap();
        assert!(f.rows[0].expressible().unwrap_err().contains("forward"));
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

    #[test]
    fn unknown_chip_and_words_name_line_and_column() {
        let e = one("A,v9z,tokamax-splash,fwd,1,8,8,4096,4096,128,128,full,,,,,,,x,1,t,s").unwrap_err().to_string();
        assert!(e.starts_with("m.csv line 2, column chip:") && e.contains("v9z") && e.contains("v6e"), "{e}");
        let e =
            one("A,v6e,tokamax-splash,fwd,1,8,8,4096,4096,128,128,causal,zigzag,,,,,,x,1,t,s").unwrap_err().to_string();
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
        let e = parse(
            "id,chip,kernel,measured_ms,batch,q_heads,kv_len,head_dim\nA,v6e,splash,1,1,8,4096,128\n",
            "m.csv",
            &[],
        )
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
        assert_eq!(uses_blocks("config uses 3024/2048/1024"), Some((3024, 2048, 1024)));
        assert_eq!(uses_blocks("uses 12/3"), None);
    }
}
