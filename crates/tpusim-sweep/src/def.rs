//! Sweep files: what to evaluate.
//!
//! ```toml
//! description = "HBM bandwidth x MXU count on the sparse video case"   # optional, free text
//! mode = "product"                     # or "points"; default: "points" if [[points]] is given
//!
//! [base]                               # a JobSpec: the keys of `tpusim run` (underscores)
//! chip = "v6e"
//! mask = "band:15000+sink:3600"
//! traversal = "compact"
//!
//! [axes]                               # product mode: each key lists its values
//! "chip.hbm.bandwidth_gb_per_s" = [819, 1640, 3276]   # a chip field -> a `set` entry
//! block_q = [2048, 3024, 3328]                        # a JobSpec field
//! ```
//!
//! In points mode, each `[[points]]` table gives one point with the same keys as `[axes]`, each
//! with a single value. Axis keys are JobSpec field names (`chip`, `set`, `kernel`, `batch`,
//! `heads`, `kv_heads`, `seq_len`, `q_len`, `kv_len`, `head_dim`, `head_dim_v`, `mask`, `block_q`,
//! `block_kv`, `block_kv_compute`, `traversal`, `masking`, `mask_source`, `tile_align`,
//! `vmem_limit_mib`, `m`, `n`, `k`, `block_m`, `block_n`, `block_k`) or `chip.SECTION.FIELD`
//! (quoted, or as a dotted key when no `chip` axis is given), or `label`: a free-text input
//! column (e.g. `label = "720p dense"` in a point) that does not change the job. A chip-field
//! value becomes a `SECTION.FIELD=VALUE` override appended after the base's `set` (so an axis
//! wins over the base and over `--set` on the command line).
//!
//! Relative file paths in a sweep file (`chip = "my-v6e.toml"`, `mask = "file:blocks.json"`, in
//! the base, axes or points) resolve from the sweep file's folder; a named file that does not
//! exist is an error naming the key and the resolved path.
//!
//! Points are numbered from 0. In product mode the first axis varies slowest and the last
//! fastest; in points mode they are numbered in file order.
//!
//! **Kernel descriptions.** A sweep may run kernels read from their Mosaic IR instead of jobs:
//! `kernel_ir = "kernel.json"` in `[base]`, or `kernel_ir = ["a.json", "b.json"]` as an axis (or
//! one per `[[points]]`), names kernel description files (`tpusim.jax.describe`; the job field
//! `kernel_ir`, as `tpusim run --kernel-ir`). Such a sweep crosses its files with chip fields
//! only: besides `kernel_ir` its keys may be `chip`, `set`, `scope`, `runtime`,
//! `chip.SECTION.FIELD` and `label` (a kernel's lowering fixed its workload, mask and block
//! sizes, so any other job field is an error naming it), and every point must name a file. Each
//! file is read and checked (format, version, fields) when the sweep file is, and its bytes (and
//! its `.npy` side files' and runtime values') are part of the definition hash: editing one
//! makes the sweep another sweep for resuming and merging. Its points run as every sweep's do
//! (the job layer builds the described job; points that differ only in the chip's timing
//! parameters share one lowering); rows carry the report's metrics ([`crate::output`]).
//!
//! Everything that can be checked without running a point is checked when the file is read:
//! unknown keys, wrong value types, empty axes, a value listed twice in one axis, unknown chip
//! fields and out-of-range chip values (`chip.SECTION.FIELD` values and `set` entries, against
//! the base chip),
//! unknown option words and malformed masks are errors naming the file and the key. What depends
//! on a combination (block rules, VMEM overflow, contradictory fields) is reported per point, in
//! that point's row.

use crate::SweepError;
use serde::Deserialize;
use std::path::Path;
use tpusim_chip::ChipModel;
use tpusim_job::{render_fields, FieldStyle, JobSpec};
use tpusim_workload::Mask;

/// Most points a sweep may have.
pub const MAX_POINTS: u64 = 1_000_000_000;

/// How a sweep's points are formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The cartesian product of the axes.
    Product,
    /// The listed `[[points]]`.
    Points,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSweep {
    #[serde(default)]
    #[allow(dead_code)]
    description: Option<String>,
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    base: toml::Table,
    #[serde(default)]
    axes: Option<toml::Table>,
    #[serde(default)]
    points: Option<Vec<toml::Table>>,
}

/// One value of one input: as written (for the output row) and as a partial job (to overlay).
#[derive(Debug, Clone)]
struct Value {
    raw: toml::Value,
    spec: JobSpec,
}

/// The key that names a kernel description file in a sweep (module docs): the job field.
pub const KERNEL_IR_KEY: &str = "kernel_ir";

/// One input value as a partial job ([`value_spec`]).
fn value_of(key: &str, raw: toml::Value, chip: &ChipModel, dir: &Path) -> Result<Value, String> {
    let spec = value_spec(key, &raw, chip, dir)?;
    Ok(Value { raw, spec })
}

/// A hash of a kernel description's bytes and its side files' (prefetch tables as `.npy`): what
/// the definition hash covers of a `kernel_ir` file.
fn description_hash(path: &str) -> Result<u64, String> {
    let mut all = std::fs::read(path).map_err(|e| format!("{KERNEL_IR_KEY} = \"{path}\": cannot read ({e})"))?;
    let (description, ir_dir) = tpusim_pallas::Description::read(Path::new(path)).map_err(|e| format!("{KERNEL_IR_KEY} = \"{path}\": {e}"))?;
    for r in &description.refs {
        if let Some(tpusim_pallas::desc::Values::File(f)) = &r.values {
            if let Ok(b) = std::fs::read(ir_dir.join(f)) {
                all.extend_from_slice(f.as_bytes());
                all.extend_from_slice(&b);
            }
        }
    }
    Ok(crate::stable_hash(&all))
}

/// A parsed, validated sweep file.
#[derive(Debug, Clone)]
pub struct SweepDef {
    /// The file it came from (for messages).
    pub origin: String,
    /// The base job, with `--set` overrides from the command line appended to its `set`.
    pub base: JobSpec,
    /// Product or points.
    pub mode: Mode,
    /// The input keys, one output column each: the axis keys in file order (product mode) or
    /// every key used by a point, in order of first use (points mode).
    pub inputs: Vec<String>,
    /// Product mode: values per input column.
    axes: Vec<Vec<Value>>,
    /// Points mode: per point, (input column, value).
    points: Vec<Vec<(usize, Value)>>,
    /// Whether the points are kernel descriptions (`kernel_ir`, module docs), not jobs.
    pub kernel_ir: bool,
    total: u64,
    hash: u64,
}

/// One point of a sweep.
#[derive(Debug, Clone)]
pub struct Point<'a> {
    /// Its index, 0-based.
    pub index: u64,
    /// Its input values, one per [`SweepDef::inputs`] column (`None`: not given for this point).
    pub inputs: Vec<Option<&'a toml::Value>>,
    /// The job: the base overlaid with the point's values.
    pub spec: JobSpec,
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn flatten(prefix: &str, t: &toml::Table, out: &mut Vec<(String, toml::Value)>) {
    for (k, v) in t {
        let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
        match v {
            toml::Value::Table(sub) => flatten(&key, sub, out),
            other => out.push((key, other.clone())),
        }
    }
}

fn type_name(v: &toml::Value) -> &'static str {
    match v {
        toml::Value::String(_) => "a string",
        toml::Value::Integer(_) => "a whole number",
        toml::Value::Float(_) => "a number",
        toml::Value::Boolean(_) => "a boolean",
        toml::Value::Datetime(_) => "a date",
        toml::Value::Array(_) => "a list",
        toml::Value::Table(_) => "a table",
    }
}

/// Checks what deserialising a (partial) job spec cannot: that its mask parses, its chip loads
/// and its kernel description reads, naming the key on error (option words are typed and
/// checked while reading).
fn check_spec(spec: &JobSpec) -> Result<(), String> {
    if let Some(k) = &spec.kernel_ir {
        tpusim_pallas::Description::read(Path::new(k)).map_err(|e| format!("{KERNEL_IR_KEY} = \"{k}\": {e}"))?;
    }
    if let Some(m) = &spec.mask {
        Mask::parse(m).map_err(|e| format!("mask = \"{m}\": {e}"))?;
    }
    if let Some(c) = &spec.chip {
        ChipModel::load(c).map_err(|e| format!("chip = \"{c}\": {e}"))?;
    }
    Ok(())
}

/// Turns one input value into a partial job spec, validating it. `chip` is the base chip that
/// chip-field overrides are checked against; relative file paths (`chip`, `mask` files) resolve
/// from `dir`, the sweep file's folder.
fn value_spec(key: &str, raw: &toml::Value, chip: &ChipModel, dir: &Path) -> Result<JobSpec, String> {
    if key == "label" {
        return match raw {
            toml::Value::String(_) => Ok(JobSpec::default()),
            other => Err(format!("label: expected a string, found {}", type_name(other))),
        };
    }
    if let Some(field) = key.strip_prefix("chip.") {
        if field.split('.').count() != 2 {
            return Err(format!("'{key}': a chip field is chip.SECTION.FIELD, e.g. chip.hbm.bandwidth_gb_per_s"));
        }
        let text = match raw {
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => format!("{f}"),
            toml::Value::String(s) => s.clone(),
            other => return Err(format!("expected a number, found {}", type_name(other))),
        };
        chip.with_override(field, &text).map_err(|e| e.to_string())?;
        return Ok(JobSpec { set: vec![format!("{field}={text}")], ..Default::default() });
    }
    let mut t = toml::Table::new();
    t.insert(key.to_string(), raw.clone());
    if tpusim_job::fields::rule(key).is_none() {
        let section = key.split('.').next().unwrap_or("");
        let hint = if chip.sections().iter().any(|s| s == section) { format!(" (a chip field is written chip.{key})") } else { String::new() };
        return Err(format!(
            "unknown key '{key}': expected a job field or chip.SECTION.FIELD{hint}; the job fields are {}",
            tpusim_job::fields::file_keys().join(", ")
        ));
    }
    // The key, the value and what is allowed, in words.
    let spec = tpusim_job::fields::spec_from_toml(&t)?;
    let mut spec = spec;
    spec.resolve_paths_from(dir)?;
    check_spec(&spec)?;
    // Overrides are checked against the base chip, as chip.SECTION.FIELD values are (together:
    // one may need another, as a smaller VMEM its scoped limit).
    if !spec.set.is_empty() {
        tpusim_job::apply_overrides(chip.clone(), &spec.set).map_err(|e| format!("set: {}", e.to_string().replace("chip model --set: ", "")))?;
    }
    Ok(spec)
}

impl SweepDef {
    /// Reads and validates a sweep file. `set` holds `--set` overrides from the command line,
    /// appended to the base's. Relative paths in it (`chip`, `mask = "file:..."`, in the base,
    /// axes or points) resolve from the sweep file's folder.
    ///
    /// # Errors
    /// [`SweepError`] naming the file and the key (module docs).
    pub fn from_file(path: &str, set: &[String]) -> Result<Self, SweepError> {
        let text = tpusim_io::read_text(path).map_err(|e| SweepError::new(format!("cannot read sweep file {path}: {e}")))?;
        Self::parse_in(&text, path, set, Path::new(path).parent().unwrap_or(Path::new("")))
    }

    /// Parses and validates a sweep definition; `origin` names it in errors, and its relative
    /// paths resolve from the current folder.
    ///
    /// # Errors
    /// [`SweepError`] naming `origin` and the key (module docs).
    pub fn parse(text: &str, origin: &str, set: &[String]) -> Result<Self, SweepError> {
        Self::parse_in(text, origin, set, Path::new(""))
    }

    /// [`SweepDef::parse`] with relative paths resolved from `dir`.
    fn parse_in(text: &str, origin: &str, set: &[String], dir: &Path) -> Result<Self, SweepError> {
        // Job fields are named as the file's keys (`block_q`), not as flags: the front end
        // renders any backticked field left in a message as its own flag.
        let fail = |what: String| SweepError::new(format!("sweep file {origin}: {}", render_fields(&what, FieldStyle::Key)));
        let raw: RawSweep = toml::from_str(text).map_err(|e| fail(one_line(&e.to_string())))?;
        let mut base = tpusim_job::fields::spec_from_toml(&raw.base).map_err(|e| fail(format!("base: {e}")))?;
        // A chip the file's own base builds, broken by the command line's overrides, is the
        // command line's error (not the file's).
        let file_chip_ok = set.is_empty() || base.chip().is_ok();
        base.set.extend(set.iter().cloned());
        base.resolve_paths_from(dir).map_err(|e| fail(format!("base.{e}")))?;
        check_spec(&base).map_err(|e| fail(format!("base.{e}")))?;
        let chip = base.chip().map_err(|e| if file_chip_ok && !set.is_empty() { SweepError::new(e.to_string()) } else { fail(format!("base: {e}")) })?;

        let mode = match raw.mode.as_deref() {
            Some("product") => Mode::Product,
            Some("points") => Mode::Points,
            None if raw.points.is_some() => Mode::Points,
            None => Mode::Product,
            Some(other) => return Err(fail(format!("mode = \"{other}\": expected \"product\" or \"points\""))),
        };
        let mut inputs: Vec<String> = Vec::new();
        let mut axes: Vec<Vec<Value>> = Vec::new();
        let mut points: Vec<Vec<(usize, Value)>> = Vec::new();
        match mode {
            Mode::Product => {
                if raw.points.is_some() {
                    return Err(fail("[[points]] belongs to mode = \"points\"; in product mode list values under [axes]".into()));
                }
                let table =
                    raw.axes.ok_or_else(|| fail("no [axes]: list the values to sweep, e.g. [axes] block_q = [2048, 3024]".into()))?;
                let mut flat = Vec::new();
                flatten("", &table, &mut flat);
                if flat.is_empty() {
                    return Err(fail("[axes] is empty: list at least one key with its values".into()));
                }
                for (key, v) in flat {
                    if inputs.contains(&key) {
                        return Err(fail(format!("axes.{key} is given twice")));
                    }
                    let toml::Value::Array(list) = v else {
                        return Err(fail(format!("axes.{key}: expected a list of values, e.g. {key} = [..], found {}", type_name(&v))));
                    };
                    if list.is_empty() {
                        return Err(fail(format!("axes.{key} is empty: give at least one value")));
                    }
                    // A value listed twice would run its points twice.
                    for (i, v) in list.iter().enumerate() {
                        if let Some(j) = list[..i].iter().position(|w| w == v) {
                            return Err(fail(format!("axes.{key}[{i}] = {v}: the same value as axes.{key}[{j}] (each point would run twice): list each value once")));
                        }
                    }
                    let mut values = Vec::with_capacity(list.len());
                    for (i, raw) in list.into_iter().enumerate() {
                        // An unknown key is the key's error, not its first value's.
                        let at = |e: &str| if e.starts_with("unknown key") { format!("axes.{key}: {e}") } else { format!("axes.{key}[{i}]: {e}") };
                        values.push(value_of(&key, raw, &chip, dir).map_err(|e| fail(at(&e)))?);
                    }
                    inputs.push(key);
                    axes.push(values);
                }
            }
            Mode::Points => {
                if raw.axes.is_some() {
                    return Err(fail("[axes] belongs to mode = \"product\"; in points mode give each point as a [[points]] table".into()));
                }
                let list = raw.points.unwrap_or_default();
                if list.is_empty() {
                    return Err(fail("mode = \"points\" needs at least one [[points]] table".into()));
                }
                // A label names its point's row (in plots too): two points may not share one.
                let mut labels: Vec<(&str, usize)> = Vec::new();
                for (pi, table) in list.iter().enumerate() {
                    if let Some(l) = table.get("label").and_then(toml::Value::as_str) {
                        if let Some((_, first)) = labels.iter().find(|(x, _)| *x == l) {
                            return Err(fail(format!(
                                "points[{pi}].label = {l:?}: points[{first}] has that label; a label tells a point's row apart, so give each point its own"
                            )));
                        }
                        labels.push((l, pi));
                    }
                    let mut flat = Vec::new();
                    flatten("", table, &mut flat);
                    let mut point = Vec::with_capacity(flat.len());
                    for (key, raw) in flat {
                        let col = match inputs.iter().position(|k| *k == key) {
                            Some(c) => c,
                            None => {
                                inputs.push(key.clone());
                                inputs.len() - 1
                            }
                        };
                        if point.iter().any(|(c, _)| *c == col) {
                            return Err(fail(format!("points[{pi}].{key} is given twice")));
                        }
                        let v = value_of(&key, raw, &chip, dir).map_err(|e| {
                            // A field's error begins with the field (`points[0].heads = ...`),
                            // an unknown key's with what it is.
                            let sep = if e.starts_with("unknown key") { ": " } else { "." };
                            fail(format!("points[{pi}]{sep}{e}"))
                        })?;
                        point.push((col, v));
                    }
                    points.push(point);
                }
            }
        }
        // A sweep of kernel descriptions crosses files with chip fields only (module docs).
        let kernel_ir = base.kernel_ir.is_some() || inputs.iter().any(|k| k == KERNEL_IR_KEY);
        if kernel_ir {
            let why = "not in a sweep of kernel descriptions (kernel_ir): a kernel's lowering fixed its workload, mask and block sizes; only chip, set, scope, runtime, chip.SECTION.FIELD and label go with kernel_ir (re-lower with tpusim.jax to change the rest)";
            let allowed = |k: &str| tpusim_job::spec::DESCRIBED_FIELDS.contains(&k) || k == "label";
            if let Some(k) = base.set_fields().keys().find(|k| !allowed(k)) {
                return Err(fail(format!("base.{k}: {why}")));
            }
            let where_ = if mode == Mode::Product { "axes" } else { "points" };
            if let Some(k) = inputs.iter().find(|k| !allowed(k) && !k.starts_with("chip.")) {
                return Err(fail(format!("{where_}.{k}: {why}")));
            }
            if base.kernel_ir.is_none() {
                if let Some(pi) = points.iter().position(|p| !p.iter().any(|(_, v)| v.spec.kernel_ir.is_some())) {
                    return Err(fail(format!(
                        "points[{pi}] names no kernel_ir: in a sweep of kernel descriptions every point runs one (give kernel_ir in [base] or in each point)"
                    )));
                }
            }
        }
        let total = match mode {
            Mode::Product => axes.iter().try_fold(1u64, |n, a| n.checked_mul(a.len() as u64).filter(|&n| n <= MAX_POINTS)),
            Mode::Points => Some(points.len() as u64),
        }
        .ok_or_else(|| fail(format!("the product of the axes has more than {MAX_POINTS} points")))?;

        // The definition hash: the canonical definition and the tpusim version (a new release
        // may compute different metrics, so its shards must not be merged with older ones).
        let canon_values = |vals: &[&toml::Value]| -> Vec<serde_json::Value> {
            vals.iter().map(|v| serde_json::to_value(v).unwrap_or(serde_json::Value::Null)).collect()
        };
        let canon = serde_json::json!({
            "format": 1,
            "tpusim": env!("CARGO_PKG_VERSION"),
            "base": serde_json::to_value(&base).unwrap_or(serde_json::Value::Null),
            "mode": format!("{mode:?}"),
            "inputs": inputs,
            "axes": axes.iter().map(|a| canon_values(&a.iter().map(|v| &v.raw).collect::<Vec<_>>())).collect::<Vec<_>>(),
            "points": points
                .iter()
                .map(|p| p.iter().map(|(c, v)| serde_json::json!([c, serde_json::to_value(&v.raw).unwrap_or_default()])).collect::<Vec<_>>())
                .collect::<Vec<_>>(),
        });
        // Files the definition refers to (chip models, mask files, as resolved from the sweep
        // file's folder) are part of it: editing one must not let a resumed sweep keep results
        // computed from the old contents.
        let mut files = Vec::new();
        let resolved: Vec<serde_json::Value> = std::iter::once(&base)
            .chain(axes.iter().flatten().map(|v| &v.spec))
            .chain(points.iter().flatten().map(|(_, v)| &v.spec))
            .map(|s| serde_json::to_value(s).unwrap_or_default())
            .collect();
        collect_referenced_files(&serde_json::Value::Array(resolved), &mut files);
        // Kernel descriptions (with their side files), then their runtime values, are part of
        // the definition too.
        let specs = || std::iter::once(&base).chain(axes.iter().flatten().map(|v| &v.spec)).chain(points.iter().flatten().map(|(_, v)| &v.spec));
        for k in specs().filter_map(|s| s.kernel_ir.as_ref()) {
            if !files.iter().any(|(p, _)| p == k) {
                files.push((k.clone(), description_hash(k).map_err(&fail)?));
            }
        }
        for f in specs().flat_map(|s| s.runtime.iter().filter_map(|r| r.split_once('=').map(|(_, f)| f))) {
            if !files.iter().any(|(p, _)| p == f) {
                let bytes = std::fs::read(f).map_err(|e| fail(format!("runtime: cannot read {f} ({e})")))?;
                files.push((f.to_string(), crate::stable_hash(&bytes)));
            }
        }
        let mut canon = canon;
        canon["files"] = serde_json::Value::Array(files.into_iter().map(|(p, h)| serde_json::json!([p, format!("{h:016x}")])).collect());
        let hash = crate::stable_hash(canon.to_string().as_bytes());
        Ok(SweepDef { origin: origin.to_string(), base, mode, inputs, axes, points, kernel_ir, total, hash })
    }

    /// Number of points.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The definition hash as 16 hex digits (changes with any key or value, or tpusim's version).
    pub fn hash_hex(&self) -> String {
        format!("{:016x}", self.hash)
    }

    /// Point `index` (0-based, below [`SweepDef::total`]).
    ///
    /// # Panics
    /// If `index` is out of range.
    pub fn point(&self, index: u64) -> Point<'_> {
        assert!(index < self.total, "point {index} of a sweep of {}", self.total);
        let mut inputs: Vec<Option<&toml::Value>> = vec![None; self.inputs.len()];
        let mut spec = self.base.clone();
        match self.mode {
            Mode::Product => {
                // Mixed radix, last axis fastest.
                let mut rest = index;
                let mut chosen = vec![0usize; self.axes.len()];
                for (a, vals) in self.axes.iter().enumerate().rev() {
                    let n = vals.len() as u64;
                    chosen[a] = (rest % n) as usize;
                    rest /= n;
                }
                for (a, &c) in chosen.iter().enumerate() {
                    let v = &self.axes[a][c];
                    inputs[a] = Some(&v.raw);
                    spec = spec.overlay(&v.spec);
                }
            }
            Mode::Points => {
                for (col, v) in &self.points[index as usize] {
                    inputs[*col] = Some(&v.raw);
                    spec = spec.overlay(&v.spec);
                }
            }
        }
        Point { index, inputs, spec }
    }
}

/// Paths named by strings in a sweep definition that are readable files (chip models ending in
/// `.toml`, mask files after `file:`), with an FNV-1a hash of their contents.
fn collect_referenced_files(v: &serde_json::Value, out: &mut Vec<(String, u64)>) {
    match v {
        serde_json::Value::String(s) => {
            let mut candidates = Vec::new();
            if s.ends_with(".toml") {
                candidates.push(s.clone());
            }
            let mut rest = s.as_str();
            while let Some(i) = rest.find("file:") {
                let after = &rest[i + 5..];
                let end = after.find([')', ']', ';', '+', '&']).unwrap_or(after.len());
                candidates.push(after[..end].trim().to_string());
                rest = &after[end..];
            }
            for c in candidates {
                if let Ok(bytes) = std::fs::read(&c) {
                    if !out.iter().any(|(p, _)| *p == c) {
                        out.push((c, crate::stable_hash(&bytes)));
                    }
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| collect_referenced_files(x, out)),
        serde_json::Value::Object(m) => m.values().for_each(|x| collect_referenced_files(x, out)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<SweepDef, SweepError> {
        SweepDef::parse(text, "t.toml", &[])
    }

    /// Errors in a sweep file name its keys as written in the file (`block_q`), never as flags:
    /// no backticked job field is left for the command line to render as `--block-q`.
    #[test]
    fn file_errors_name_keys_not_flags() {
        for (text, key) in [
            ("[base]\nbogus = 1\n[axes]\nblock_q = [128]\n", "unknown key 'bogus': the keys of a job are chip, set, kernel"),
            ("[axes]\nblock_qq = [128]\n", "the job fields are chip, set, kernel"),
            ("[axes]\nblock_q = [128, \"x\"]\n", "axes.block_q[1]: block_q = \"x\": expected a whole number from 1 to 4294967296"),
            ("[axes]\ntraversal = [\"zig\"]\n", "traversal = \"zig\": expected full-grid or compact"),
            ("[base]\nheads = 1.5\n[axes]\nblock_q = [128]\n", "base: heads = 1.5: expected a whole number from 1 to 1048576"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(key) && !e.contains("`block_q`") && !e.contains("`chip`"), "{text}: {e}");
        }
    }

    #[test]
    fn product_order_is_first_axis_slowest() {
        let d = parse("[base]\nheads = 2\n[axes]\nblock_q = [512, 1024]\n\"chip.mxu.count\" = [1, 2, 4]\n").unwrap();
        assert_eq!(d.total(), 6);
        assert_eq!(d.inputs, vec!["block_q", "chip.mxu.count"]);
        let p = d.point(4);
        assert_eq!(p.spec.block_q, Some(1024));
        assert_eq!(p.spec.set, vec!["mxu.count=2".to_string()]);
        assert_eq!(p.spec.heads, Some(2));
        assert_eq!(p.inputs[1], Some(&toml::Value::Integer(2)));
    }

    #[test]
    fn dotted_chip_keys_and_points_mode() {
        let d = parse("[axes]\nchip.hbm.bandwidth_gb_per_s = [819.0, 1640]\n").unwrap();
        assert_eq!(d.inputs, vec!["chip.hbm.bandwidth_gb_per_s"]);
        assert_eq!(d.point(0).spec.set, vec!["hbm.bandwidth_gb_per_s=819".to_string()]);
        let d = parse("[[points]]\nblock_q = 512\n[[points]]\nmask = \"causal\"\nblock_q = 1024\n").unwrap();
        assert_eq!((d.mode, d.total()), (Mode::Points, 2));
        assert_eq!(d.inputs, vec!["block_q", "mask"]);
        assert!(d.point(0).inputs[1].is_none());
    }

    #[test]
    fn bad_files_name_the_file_and_key() {
        let cases = [
            ("[axes]\nblock_q = [512]\nbogus = [1]\n", "bogus"),
            ("[axes]\nblock_q = [\"big\"]\n", "axes.block_q[0]"),
            ("[axes]\nblock_q = 512\n", "expected a list"),
            ("[axes]\nblock_q = []\n", "axes.block_q is empty"),
            ("[axes]\n", "[axes] is empty"),
            ("[base]\nheads = 2\n", "no [axes]"),
            ("[axes]\n\"chip.hbm.bandwith_gb_per_s\" = [1.0]\n", "bandwith"),
            ("[axes]\n\"chip.mxu.count\" = [0]\n", "mxu.count"),
            ("[axes]\nset = [[\"mxu.count=0\"]]\n", "axes.set[0]: set: field 'mxu.count' = 0"),
            ("[axes]\nblock_q = [512, 1024, 512]\n", "axes.block_q[2] = 512: the same value as axes.block_q[0]"),
            ("[axes]\nhbm.bandwidth_gb_per_s = [1.0]\n", "chip.hbm.bandwidth_gb_per_s"),
            ("[axes]\ntraversal = [\"zigzag\"]\n", "zigzag"),
            ("[axes]\nmask = [\"band:\"]\n", "axes.mask[0]"),
            ("[base]\nbogus = 1\n[axes]\nblock_q = [512]\n", "bogus"),
            ("modes = 1\n", "modes"),
            ("mode = \"grid\"\n[axes]\nblock_q = [512]\n", "grid"),
            (
                "[[points]]\nlabel = \"a\"\nblock_q = 512\n[[points]]\nlabel = \"b\"\n[[points]]\nlabel = \"a\"\nblock_q = 1024\n",
                "points[2].label = \"a\": points[0] has that label",
            ),
        ];
        for (text, want) in cases {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains("t.toml") && e.contains(want), "{text:?} -> {e}");
        }
    }

    #[test]
    fn hash_follows_the_definition_not_the_formatting() {
        let a = parse("[axes]\nblock_q = [512, 1024]\n").unwrap();
        let b = parse("# comment\n[axes]\nblock_q = [ 512,1024 ]\n").unwrap();
        let c = parse("[axes]\nblock_q = [512, 2048]\n").unwrap();
        let d = SweepDef::parse("[axes]\nblock_q = [512, 1024]\n", "t", &["mxu.count=2".into()]).unwrap();
        assert_eq!(a.hash_hex(), b.hash_hex());
        assert_ne!(a.hash_hex(), c.hash_hex());
        assert_ne!(a.hash_hex(), d.hash_hex());
    }
}
