//! Measured timings from profiler traces: a Chrome Trace Event JSON file (what XProf writes as
//! `<host>.trace.json.gz` next to its `.xplane.pb`, what Perfetto exports; gzip or not) becomes
//! measurement rows (`traces/measured/README.md`) that `validate` and `calibrate` read.
//!
//! Selection (XProf's layout, from TSL's `trace_events_to_json.cc`): device ops are complete
//! events (`"ph": "X"`, `ts` and `dur` in microseconds; `B`/`E` pairs are accepted too) on a
//! process whose `process_name` metadata matches `device` (default `^/device:`, XProf's XPlane
//! names such as `/device:TPU:0`) and a thread whose `thread_name` matches `line` (default
//! `^XLA Ops$`, the line with one event per executed HLO op). Of those, the ops whose name
//! matches `pattern` (a regular expression, e.g. `splash_mha_fwd` or Splash's
//! `^splash_(mha|mqa)_fwd`) are kept; XLA's uniquifying suffix (`.1`, `.2`) is dropped, and each
//! distinct name is one kernel whose repeats are its events (over every device and step). Its
//! time is the **median** duration, with the number of repeats.
//!
//! Each kernel becomes one row: the job's fields from the caller's [`JobSpec`] as the
//! simulator resolves them for the chip (family defaults for what is not given), the median as
//! `measured_ms`, and the repeat count, pattern and file in `timing` and `source`.

use crate::measure::{OptionWord, KNOWN_COLUMNS};
use regex::Regex;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use tpusim_kernel::{Direction, Exp};
use tpusim_job::{Job, JobSpec, SpecError};

/// An error reading a trace or turning it into rows.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TraceError {
    /// The trace cannot be read or is not Chrome trace JSON (names the file).
    #[error("trace {path}: {message}")]
    File {
        /// The file as given.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// An argument is wrong (names it as the front end spells it, e.g. `--kernel-pattern`).
    #[error("{0}")]
    Arg(String),
    /// The job fields do not describe a job (names the field).
    #[error(transparent)]
    Spec(#[from] SpecError),
}

/// Which events count as the kernel's device ops.
#[derive(Debug, Clone)]
pub struct Selection {
    /// Regular expression an op's name must match (searched, not anchored: anchor with `^`).
    pub pattern: String,
    /// Regular expression the device process's `process_name` must match.
    pub device: String,
    /// Regular expression the thread's `thread_name` must match.
    pub line: String,
}

impl Selection {
    /// XProf's device ops (`^/device:` processes, `^XLA Ops$` lines) named by `pattern`.
    pub fn xprof(pattern: &str) -> Self {
        Selection { pattern: pattern.to_string(), device: "^/device:".into(), line: "^XLA Ops$".into() }
    }
}

/// One kernel found in a trace: its events' durations.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct KernelTiming {
    /// The op name without XLA's `.N` suffix.
    pub name: String,
    /// Repeats (events), over every selected device.
    pub count: usize,
    /// Median duration, milliseconds.
    pub median_ms: f64,
    /// Shortest and longest duration, milliseconds.
    pub min_ms: f64,
    /// Longest duration, milliseconds.
    pub max_ms: f64,
    /// Devices (process names) it ran on.
    pub devices: Vec<String>,
}

/// Reads a trace file, gzip-compressed or not (detected by its magic bytes).
///
/// # Errors
/// [`TraceError::File`] for unreadable files, bad gzip data and malformed JSON.
pub fn read_trace(path: &str) -> Result<Value, TraceError> {
    let ferr = |m: String| TraceError::File { path: path.to_string(), message: m };
    let raw = std::fs::read(path).map_err(|e| ferr(format!("cannot read: {e}")))?;
    let text = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut s = Vec::new();
        flate2::read::MultiGzDecoder::new(&raw[..]).read_to_end(&mut s).map_err(|e| ferr(format!("bad gzip data: {e}")))?;
        s
    } else {
        raw
    };
    serde_json::from_slice(&text).map_err(|e| ferr(format!("malformed JSON: {e}")))
}

fn compile(flag: &str, re: &str) -> Result<Regex, TraceError> {
    Regex::new(re).map_err(|e| TraceError::Arg(format!("{flag} '{re}': not a regular expression: {}", e.to_string().replace('\n', " "))))
}

/// Strips XLA's uniquifying suffix `.N` from an op name.
fn base_name(name: &str) -> &str {
    match name.rsplit_once('.') {
        Some((b, n)) if !b.is_empty() && !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()) => b,
        _ => name,
    }
}

/// One selected device op of a trace.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DeviceOp {
    /// The device (process name).
    pub device: String,
    /// The line (thread name).
    pub line: String,
    /// The op's name as written (with XLA's `.N` suffix, if any).
    pub name: String,
    /// Start, microseconds (the trace's clock).
    pub ts_us: f64,
    /// Duration, microseconds.
    pub dur_us: f64,
}

/// The device ops of a parsed trace selected by `sel`, in trace order.
///
/// # Errors
/// [`TraceError::Arg`] for bad regular expressions, or when nothing matches (naming the
/// devices, lines and the most frequent op names on the selected lines, so that the pattern can
/// be fixed); [`TraceError::File`] when the JSON is not a trace (`path` names it).
pub fn select_ops(trace: &Value, sel: &Selection, path: &str) -> Result<Vec<DeviceOp>, TraceError> {
    let pattern = compile("--kernel-pattern", &sel.pattern)?;
    let device = compile("--device", &sel.device)?;
    let line = compile("--line", &sel.line)?;
    let events = match trace {
        Value::Array(a) => a,
        Value::Object(o) => match o.get("traceEvents") {
            Some(Value::Array(a)) => a,
            _ => return Err(TraceError::File { path: path.into(), message: "no 'traceEvents' array: not a Chrome trace".into() }),
        },
        _ => {
            return Err(TraceError::File {
                path: path.into(),
                message: "expected a JSON object with 'traceEvents' or an array of events".into(),
            })
        }
    };
    let id = |v: Option<&Value>| v.map(|x| x.to_string()).unwrap_or_default();
    let mut processes: HashMap<String, String> = HashMap::new();
    let mut threads: HashMap<(String, String), String> = HashMap::new();
    for e in events {
        if e.get("ph").and_then(Value::as_str) != Some("M") {
            continue;
        }
        let name = e.get("args").and_then(|a| a.get("name")).and_then(Value::as_str).unwrap_or_default().to_string();
        match e.get("name").and_then(Value::as_str) {
            Some("process_name") => {
                processes.insert(id(e.get("pid")), name);
            }
            Some("thread_name") => {
                threads.insert((id(e.get("pid")), id(e.get("tid"))), name);
            }
            _ => {}
        }
    }
    let selected = |pid: &str, tid: &str| -> Option<(String, String)> {
        let p = processes.get(pid)?;
        let t = threads.get(&(pid.to_string(), tid.to_string()))?;
        (device.is_match(p) && line.is_match(t)).then(|| (p.clone(), t.clone()))
    };
    let mut ops = Vec::new();
    let mut seen_names: BTreeMap<String, usize> = BTreeMap::new();
    let mut open: HashMap<(String, String), Vec<(String, f64)>> = HashMap::new();
    let mut add = |name: &str, ts: f64, dur: f64, (dev, ln): (String, String), ops: &mut Vec<DeviceOp>| {
        *seen_names.entry(base_name(name).to_string()).or_insert(0) += 1;
        if pattern.is_match(name) {
            ops.push(DeviceOp { device: dev, line: ln, name: name.to_string(), ts_us: ts, dur_us: dur });
        }
    };
    for e in events {
        let ph = e.get("ph").and_then(Value::as_str).unwrap_or_default();
        if !matches!(ph, "X" | "B" | "E") {
            continue;
        }
        let (pid, tid) = (id(e.get("pid")), id(e.get("tid")));
        let Some(where_) = selected(&pid, &tid) else { continue };
        let name = e.get("name").and_then(Value::as_str).unwrap_or_default();
        let Some(ts) = e.get("ts").and_then(Value::as_f64).filter(|t| t.is_finite()) else { continue };
        match ph {
            "X" => {
                if let Some(d) = e.get("dur").and_then(Value::as_f64).filter(|d| d.is_finite() && *d >= 0.0) {
                    add(name, ts, d, where_, &mut ops);
                }
            }
            "B" => open.entry((pid, tid)).or_default().push((name.to_string(), ts)),
            _ => {
                if let Some((n, t0)) = open.entry((pid, tid)).or_default().pop() {
                    add(&n, t0, (ts - t0).max(0.0), where_, &mut ops);
                }
            }
        }
    }
    if ops.is_empty() {
        let mut devs: Vec<&String> = processes.values().collect();
        devs.sort();
        devs.dedup();
        let mut lines: Vec<&String> = threads.values().collect();
        lines.sort();
        lines.dedup();
        let mut common: Vec<(&String, &usize)> = seen_names.iter().collect();
        common.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let names: Vec<String> = common.iter().take(8).map(|(n, c)| format!("{n} ({c})")).collect();
        return Err(TraceError::Arg(format!(
            "--kernel-pattern '{}': no op on a --device '{}' process and a --line '{}' thread matches; the trace has processes [{}] and threads [{}]{}",
            sel.pattern,
            sel.device,
            sel.line,
            devs.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "),
            lines.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "),
            if names.is_empty() { String::new() } else { format!("; the selected lines hold {}", names.join(", ")) }
        )));
    }
    Ok(ops)
}

/// The kernels among selected ops: one per name without XLA's `.N` suffix, in name order, each
/// with the median of its durations and its repeat count.
pub fn kernel_timings(ops: &[DeviceOp]) -> Vec<KernelTiming> {
    let mut found: BTreeMap<String, (Vec<f64>, Vec<String>)> = BTreeMap::new();
    for o in ops {
        let entry = found.entry(base_name(&o.name).to_string()).or_default();
        entry.0.push(o.dur_us);
        if !entry.1.contains(&o.device) {
            entry.1.push(o.device.clone());
        }
    }
    found
        .into_iter()
        .map(|(name, (mut d, devices))| {
            d.sort_by(f64::total_cmp);
            let n = d.len();
            let median = if n % 2 == 1 { d[n / 2] } else { 0.5 * (d[n / 2 - 1] + d[n / 2]) };
            KernelTiming { name, count: n, median_ms: median / 1e3, min_ms: d[0] / 1e3, max_ms: d[n - 1] / 1e3, devices }
        })
        .collect()
}

/// One measurement row as column -> cell (the columns of [`KNOWN_COLUMNS`] it sets).
pub type Row = BTreeMap<String, String>;

/// Measurement rows for the kernels found, one per kernel, with the job fields of `spec` as
/// the simulator resolves them on its chip. Row ids are `id_prefix` alone for one kernel, else
/// `id_prefix-NAME`.
///
/// # Errors
/// [`TraceError::Arg`] when `chip` is missing (the chip the trace was measured on must be named),
/// for job fields the measurement format cannot hold (`scope` op, `fwd+bwd`, the dq kernel's
/// blocks, an unfused backward, a chip-model override, a per-head or in-memory mask), and
/// [`TraceError::Spec`] for a job that does not build.
pub fn measurement_rows(
    kernels: &[KernelTiming],
    spec: &JobSpec,
    id_prefix: &str,
    sel: &Selection,
    trace_path: &str,
) -> Result<Vec<Row>, TraceError> {
    let Some(chip_word) = spec.chip.clone() else {
        return Err(TraceError::Arg("--chip: name the chip the trace was measured on (a preset such as v6e, or a chip-model TOML)".into()));
    };
    if !spec.set.is_empty() {
        return Err(TraceError::Arg(
            "--set: a measurement row names its chip by preset or file; chip overrides cannot be recorded in it".into(),
        ));
    }
    if id_prefix.trim().is_empty() {
        return Err(TraceError::Arg("--id: give a row id (a prefix when several kernels match)".into()));
    }
    let chip = spec.chip()?;
    let job = spec.build(&chip)?;
    let mut rows = Vec::new();
    for k in kernels {
        let mut r = Row::new();
        let id = if kernels.len() == 1 { id_prefix.to_string() } else { format!("{id_prefix}-{}", k.name) };
        r.insert("id".into(), id);
        r.insert("chip".into(), chip_word.clone());
        r.insert("kernel".into(), job.kernel().map(|k| k.to_string()).unwrap_or_default());
        match &job {
            Job::Attention { workload: w, config: c, direction, scope } => {
                if *scope != tpusim_kernel::Scope::Kernel {
                    return Err(TraceError::Arg(
                        "--scope op: a kernel's device op is the kernel alone; rows from traces have scope kernel".into(),
                    ));
                }
                if spec.mask_value.is_some() || matches!(w.mask, tpusim_workload::Mask::PerHead(_)) {
                    return Err(TraceError::Arg(format!(
                        "--mask {}: a measurement row holds one mask in the --mask grammar (or file:PATH); per-head lists and in-memory arrays cannot be recorded",
                        w.mask
                    )));
                }
                let (bq, bkv, bc) = match direction {
                    Direction::Fwd => (c.block_q, c.block_kv, c.block_kv_compute),
                    Direction::Bwd if c.bwd.fused => (c.bwd.block_q_dkv, c.bwd.block_kv_dkv, c.bwd.block_kv_dkv_compute),
                    Direction::Bwd => {
                        return Err(TraceError::Arg(
                            "--fused-bwd=false: JAX's unfused backward runs two kernels (dq, dkv) whose blocks one row cannot hold; time each with --direction fwd rows or use the fused backward".into(),
                        ))
                    }
                    Direction::FwdBwd => {
                        return Err(TraceError::Arg("--direction fwd+bwd: a row is one kernel; give fwd or bwd and a --kernel-pattern for that kernel".into()))
                    }
                };
                r.insert("direction".into(), direction.to_string());
                for (col, v) in [
                    ("batch", w.batch),
                    ("q_heads", w.q_heads),
                    ("kv_heads", w.kv_heads),
                    ("q_len", w.q_len),
                    ("kv_len", w.kv_len),
                    ("head_dim", w.head_dim),
                    ("head_dim_v", w.head_dim_v),
                    ("block_q", bq),
                    ("block_kv", bkv),
                    ("block_kv_compute", bc),
                ] {
                    r.insert(col.into(), v.to_string());
                }
                r.insert("mask".into(), w.mask.to_string());
                if !w.mask.is_full() {
                    r.insert("traversal".into(), c.traversal.to_string());
                    r.insert("masking".into(), c.masking.to_string());
                }
                r.insert("mask_source".into(), c.mask_source.to_string());
                r.insert("tile_align".into(), if c.tile_align { "yes" } else { "no" }.into());
                let mut opts = Vec::new();
                if c.exp == Exp::Base2 {
                    opts.push(OptionWord::Base2Exp.to_string());
                }
                if c.experimental_scheduler {
                    opts.push(OptionWord::ExperimentalScheduler.to_string());
                }
                if c.return_residuals {
                    opts.push(OptionWord::ReturnResiduals.to_string());
                }
                opts.push(format!("op {}", k.name));
                r.insert("options".into(), opts.join(" "));
                if let Some(v) = c.vmem_limit_bytes {
                    r.insert("vmem_limit_mib".into(), format!("{}", v as f64 / 1048576.0));
                }
            }
            Job::Described(_) => {
                return Err(TraceError::Arg(
                    "--kernel-ir: a measurement row names a kernel family and its job; a kernel read from its IR has no row form yet".into(),
                ))
            }
            Job::Matmul { workload: m, config: c, .. } => {
                r.insert("direction".into(), "matmul".into());
                for (col, v) in [
                    ("q_len", m.m),
                    ("kv_len", m.n),
                    ("head_dim", m.k),
                    ("block_q", c.block_m),
                    ("block_kv", c.block_n),
                    ("block_kv_compute", c.block_k),
                ] {
                    r.insert(col.into(), v.to_string());
                }
                r.insert("options".into(), format!("op {}", k.name));
                if let Some(v) = c.vmem_limit_bytes {
                    r.insert("vmem_limit_mib".into(), format!("{}", v as f64 / 1048576.0));
                }
            }
        }
        r.insert("measured_ms".into(), format!("{}", k.median_ms));
        r.insert(
            "timing".into(),
            format!(
                "kernel device time: median of {} events (min {:.6} ms, max {:.6} ms) on {} device(s), ops matching '{}' on '{}' lines",
                k.count,
                k.min_ms,
                k.max_ms,
                k.devices.len(),
                sel.pattern,
                sel.line
            ),
        );
        r.insert("source".into(), format!("profiler trace {trace_path}"));
        rows.push(r);
    }
    Ok(rows)
}

/// The rows as measurement CSV text: a header of the columns any row sets, in the order of
/// [`KNOWN_COLUMNS`], then one line per row.
pub fn rows_to_csv(rows: &[Row]) -> String {
    let cols: Vec<&str> = KNOWN_COLUMNS.iter().copied().filter(|c| rows.iter().any(|r| r.contains_key(*c))).collect();
    let mut w = csv::Writer::from_writer(Vec::new());
    let _ = w.write_record(&cols);
    for r in rows {
        let _ = w.write_record(cols.iter().map(|c| r.get(*c).map(String::as_str).unwrap_or("")));
    }
    String::from_utf8(w.into_inner().unwrap_or_default()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn trace(events: Vec<Value>) -> Value {
        let mut ev = vec![
            json!({"ph": "M", "pid": 3, "name": "process_name", "args": {"name": "/device:TPU:0"}}),
            json!({"ph": "M", "pid": 3, "tid": 7, "name": "thread_name", "args": {"name": "XLA Ops"}}),
            json!({"ph": "M", "pid": 3, "tid": 8, "name": "thread_name", "args": {"name": "Steps"}}),
        ];
        ev.extend(events);
        ev.push(json!({}));
        json!({"traceEvents": ev})
    }

    #[test]
    fn medians_over_repeats_by_name_without_the_suffix() {
        let t = trace(vec![
            json!({"ph": "X", "pid": 3, "tid": 7, "ts": 0.0, "dur": 10.0, "name": "k.1"}),
            json!({"ph": "X", "pid": 3, "tid": 7, "ts": 20.0, "dur": 30.0, "name": "k.2"}),
            json!({"ph": "B", "pid": 3, "tid": 7, "ts": 60.0, "name": "k"}),
            json!({"ph": "E", "pid": 3, "tid": 7, "ts": 80.0}),
            json!({"ph": "X", "pid": 3, "tid": 7, "ts": 90.0, "dur": 40.0, "name": "k.v2"}),
            // Another line and a host process do not count.
            json!({"ph": "X", "pid": 3, "tid": 8, "ts": 0.0, "dur": 999.0, "name": "k"}),
            json!({"ph": "X", "pid": 9, "tid": 7, "ts": 0.0, "dur": 999.0, "name": "k"}),
        ]);
        let ops = select_ops(&t, &Selection::xprof("^k"), "t.json").unwrap();
        assert_eq!(ops.len(), 4);
        let k = kernel_timings(&ops);
        assert_eq!(k.iter().map(|x| x.name.as_str()).collect::<Vec<_>>(), vec!["k", "k.v2"]);
        assert_eq!((k[0].count, k[0].median_ms), (3, 0.020));
        assert_eq!((k[0].min_ms, k[0].max_ms), (0.010, 0.030));
        let even = kernel_timings(&ops[..2]);
        assert_eq!(even[0].median_ms, 0.020);
    }

    #[test]
    fn nothing_matching_lists_what_the_trace_has() {
        let t = trace(vec![json!({"ph": "X", "pid": 3, "tid": 7, "ts": 0.0, "dur": 1.0, "name": "fusion.3"})]);
        let e = select_ops(&t, &Selection::xprof("splash"), "t.json").unwrap_err().to_string();
        assert!(e.contains("/device:TPU:0") && e.contains("fusion (1)") && e.contains("XLA Ops"), "{e}");
        let e = select_ops(&json!({"x": 1}), &Selection::xprof("k"), "t.json").unwrap_err().to_string();
        assert!(e.contains("traceEvents"), "{e}");
        assert!(select_ops(&t, &Selection::xprof("("), "t.json").unwrap_err().to_string().contains("not a regular expression"));
    }

    #[test]
    fn gzip_and_plain_files_read_alike() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let t = trace(vec![json!({"ph": "X", "pid": 3, "tid": 7, "ts": 0.0, "dur": 5.0, "name": "k"})]);
        let plain = dir.path().join("a.json");
        std::fs::write(&plain, t.to_string()).unwrap();
        let gz = dir.path().join("a.json.gz");
        let mut enc = flate2::write::GzEncoder::new(std::fs::File::create(&gz).unwrap(), flate2::Compression::fast());
        enc.write_all(t.to_string().as_bytes()).unwrap();
        enc.finish().unwrap();
        assert_eq!(read_trace(plain.to_str().unwrap()).unwrap(), read_trace(gz.to_str().unwrap()).unwrap());
        assert!(read_trace(dir.path().join("missing").to_str().unwrap()).is_err());
    }

    #[test]
    fn rows_carry_the_resolved_job_and_refuse_what_a_row_cannot_hold() {
        let k = vec![KernelTiming {
            name: "splash_mha_dkv_no_residuals".into(),
            count: 3,
            median_ms: 2.5,
            min_ms: 2.0,
            max_ms: 3.0,
            devices: vec!["d".into()],
        }];
        let sel = Selection::xprof("dkv");
        let spec = JobSpec {
            chip: Some("v6e".into()),
            direction: Some(Direction::Bwd),
            heads: Some(4),
            seq_len: Some(4096),
            block_q_dkv: Some(256),
            block_kv_dkv: Some(512),
            ..Default::default()
        };
        let rows = measurement_rows(&k, &spec, "r", &sel, "t.json").unwrap();
        let r = &rows[0];
        assert_eq!((r["direction"].as_str(), r["block_q"].as_str(), r["block_kv"].as_str()), ("bwd", "256", "512"));
        // The CSV reads back as a backward row with those dkv blocks.
        let file = crate::measure::parse(&rows_to_csv(&rows), "rows", &[]).unwrap();
        assert_eq!(file.rows[0].job.block_q_dkv, Some(256));
        assert_eq!(file.rows[0].measured_ms, 2.5);
        let e = measurement_rows(&k, &JobSpec { chip: None, ..spec.clone() }, "r", &sel, "t").unwrap_err().to_string();
        assert!(e.contains("--chip"), "{e}");
        let e = measurement_rows(&k, &JobSpec { direction: Some(Direction::FwdBwd), ..spec }, "r", &sel, "t").unwrap_err().to_string();
        assert!(e.contains("fwd+bwd"), "{e}");
    }
}
