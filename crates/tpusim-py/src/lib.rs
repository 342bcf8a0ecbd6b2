//! The Python package `tpusim`: the simulator as a library for the notebook a TPU kernel author
//! already has open. Built with PyO3 (abi3: one wheel for CPython 3.11 and later) and maturin;
//! the command line stays the pure-Rust `tpusim` binary.
//!
//! Every function goes through the same job layer as the command line
//! ([`tpusim_job::JobSpec`]): keyword arguments are the job fields (`heads`, `seq_len`,
//! `block_q`, ...; the CLI's flags with underscores), masks may also be Splash mask objects or
//! NumPy arrays (module `masks`), block sizes may be a Splash `BlockSizes` / tokamax config object, and
//! errors are Python exceptions (`tpusim.InputError`, a `ValueError`, for bad input) carrying the
//! CLI's messages with fields named as keyword arguments.

mod decode;
mod masks;
mod program;

use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString};
use serde_json::Value;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tpusim_job::fields::{self, Rule};
use tpusim_job::{render_fields, FieldStyle, Job, JobSpec, Report};
use tpusim_io::mark::Force;
use tpusim_workload::tiles::{TileGrid, TileStats};

/// mimalloc, as the `tpusim` binary: lowering builds step bodies of thousands of small nodes,
/// which the system allocator serves at several times the cost.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

create_exception!(tpusim, InputError, PyValueError, "Bad input: an argument, file or value the simulator refuses (the command line's exit code 2). The message names the field, the value and what is allowed.");
create_exception!(
    tpusim,
    SimulationError,
    PyRuntimeError,
    "A failure that is not the input's fault (the command line's exit code 1): an output file that cannot be written."
);

/// An [`InputError`] with a message.
pub(crate) fn input_err(msg: impl Into<String>) -> PyErr {
    // A chip override's error names the command line's flag (`chip model --set: ...`); in
    // Python the overrides are the `set=` keyword.
    InputError::new_err(msg.into().replace("chip model --set: ", "set: "))
}

/// An output file refused or not written, as Python raises it: a refusal (the user's path) as
/// an [`InputError`] `ARG = 'PATH': why; how to go on`, a failed write as a [`SimulationError`].
pub(crate) fn output_err(arg: &str, e: tpusim_io::OutputError) -> PyErr {
    match e {
        tpusim_io::OutputError::Refused { path, reason } => input_err(format!("{arg} = '{path}': {reason}")),
        e @ tpusim_io::OutputError::Io { .. } => SimulationError::new_err(format!("{arg}: {e}")),
    }
}

/// An input error from a library error, job fields rendered as keyword arguments.
fn spec_err(e: impl std::fmt::Display) -> PyErr {
    input_err(render_fields(&e.to_string(), FieldStyle::Key))
}

/// An input error about `spec`'s job, fields named as the caller gave them (a length given as
/// `seq_len` is named `seq_len`, not the `q_len` / `kv_len` it resolves to).
fn spec_err_as_given(spec: &JobSpec, e: impl std::fmt::Display) -> PyErr {
    input_err(as_given(spec, e))
}

/// `e`'s message with `spec`'s job fields named as the caller gave them (see [`spec_err_as_given`]).
fn as_given(spec: &JobSpec, e: impl std::fmt::Display) -> String {
    tpusim_job::render_fields_with(&e.to_string(), &mut |f| spec.field_as_given(f).to_string())
}

/// How often a long call checks for Ctrl-C (Python's signal handlers), milliseconds: the
/// interrupt is raised within this time plus the time the work in flight takes to stop
/// (README: "From Python").
const SIGNAL_CHECK_MS: u64 = 20;

/// Runs `work` on another thread without the GIL, checking Python's signals every
/// [`SIGNAL_CHECK_MS`]: Ctrl-C (or any exception a signal handler raises) sets `cancel` and
/// raises at once, without waiting for `work`. Cooperative work (`tune`, `sweep`, `validate`)
/// reads `cancel` and stops starting new pieces; whatever is in flight finishes on its own
/// thread in the background and its result is dropped. `work` therefore owns what it reads
/// (`'static`): a NumPy mask it reads stays exported until the work drops it.
pub(crate) fn interruptible<T: Send + 'static>(
    py: Python<'_>,
    cancel: &Arc<AtomicBool>,
    work: impl FnOnce() -> T + Send + 'static,
) -> PyResult<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("tpusim-work".into())
        .spawn(move || {
            let _ = tx.send(work());
        })
        .map_err(|e| SimulationError::new_err(format!("cannot start the simulation's thread: {e}")))?;
    let mut rx = rx;
    loop {
        let (got, back) = py.detach(move || (rx.recv_timeout(Duration::from_millis(SIGNAL_CHECK_MS)), rx));
        rx = back;
        match got {
            Ok(v) => return Ok(v),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if let Err(e) = py.check_signals() {
                    cancel.store(true, Ordering::Relaxed);
                    return Err(e);
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(SimulationError::new_err("the simulation stopped without a result (a tpusim bug; please report it)"))
            }
        }
    }
}

/// [`interruptible`] for work that cannot stop early (one simulation, one kernel).
pub(crate) fn interruptible_once<T: Send + 'static>(py: Python<'_>, work: impl FnOnce() -> T + Send + 'static) -> PyResult<T> {
    interruptible(py, &Arc::new(AtomicBool::new(false)), work)
}

/// A Python value as `repr()` shows it (what the user typed).
fn repr(v: &Bound<'_, PyAny>) -> String {
    v.repr().map(|r| r.to_string()).unwrap_or_else(|_| "?".into())
}

/// The values the caller gave, as the job layer renders them and as Python shows them: an
/// error `heads = 10: ...` about a value given as a string reads `mask = 'band:': ...`.
#[derive(Default)]
struct Given(Vec<(String, String, String)>);

impl Given {
    fn note(&mut self, key: &str, core: String, repr: String) {
        self.0.push((key.to_string(), core, repr));
    }

    /// `msg` with the value of the field it starts with (`key = VALUE: ...`) shown as the
    /// caller's Python value.
    fn fix(&self, msg: String) -> String {
        for (key, core, repr) in &self.0 {
            let prefix = format!("{key} = {core}: ");
            if let Some(rest) = msg.strip_prefix(&prefix) {
                return format!("{key} = {repr}: {rest}");
            }
        }
        msg
    }
}

/// A count argument (`top`, `refine`): a whole number from 1, as the command line's flags.
fn count_arg(name: &str, v: &Bound<'_, PyAny>) -> PyResult<usize> {
    let bad = || input_err(format!("{name} = {}: expected a whole number from 1", repr(v)));
    if v.cast::<PyBool>().is_ok() || v.cast::<PyInt>().is_err() {
        return Err(bad());
    }
    match v.extract::<u64>() {
        Ok(n) if n >= 1 => usize::try_from(n).map_err(|_| bad()),
        _ => Err(bad()),
    }
}

/// A flag argument (`allow_inexact`): True or False.
fn bool_arg(name: &str, v: &Bound<'_, PyAny>) -> PyResult<bool> {
    if v.cast::<PyBool>().is_ok() {
        return v.extract();
    }
    Err(input_err(format!("{name} = {}: expected true or false", repr(v))))
}

/// A keyword argument for job field `key`, checked against the field's rule (the command
/// line's, [`tpusim_job::fields`]): `heads = '10': expected a whole number from 1 to 1048576`.
/// `Ok(None)` for a number in MiB, which the caller keeps as a float (NaN and infinities have
/// no JSON form, and are refused by the job layer with the chip's limit).
fn field_value(key: &str, v: &Bound<'_, PyAny>) -> PyResult<Option<Value>> {
    let Some(rule) = fields::rule(key) else { return to_json(v, key).map(Some) };
    let bad = || input_err(format!("{key} = {}: {}", repr(v), rule.allowed()));
    let is_bool = v.cast::<PyBool>().is_ok() || type_name_of(v) == "bool_";
    let is_text = v.cast::<PyString>().is_ok();
    match rule {
        Rule::Whole { .. } => {
            if is_bool || is_text || v.cast::<PyFloat>().is_ok() {
                return Err(bad());
            }
            let i: i64 = if v.cast::<PyInt>().is_ok() {
                v.extract().map_err(|_| bad())?
            } else if v.hasattr("__index__")? {
                v.call_method0("__index__")?.extract().map_err(|_| bad())?
            } else {
                return Err(bad());
            };
            if rule.accepts_whole(i128::from(i)) {
                Ok(Some(Value::from(i)))
            } else {
                Err(bad())
            }
        }
        Rule::Word(w) => {
            let Ok(t) = v.cast::<PyString>() else { return Err(bad()) };
            let t = t.to_str()?.to_string();
            if w.accepts(&t) {
                Ok(Some(Value::String(t)))
            } else {
                Err(bad())
            }
        }
        Rule::Bool if is_bool => Ok(Some(Value::Bool(v.is_truthy()?))),
        Rule::Bool => Err(bad()),
        Rule::Mib if is_bool || is_text => Err(bad()),
        Rule::Mib => {
            if v.cast::<PyInt>().is_err() && v.cast::<PyFloat>().is_err() && !v.hasattr("__float__")? {
                return Err(bad());
            }
            Ok(None)
        }
        Rule::Text | Rule::File if is_text => Ok(Some(Value::String(v.extract()?))),
        // A path object (pathlib.Path) for a chip file or a kernel description.
        Rule::Text | Rule::File if (key == "chip" || rule == Rule::File) && v.hasattr("__fspath__")? => {
            Ok(Some(Value::String(v.call_method0("__fspath__")?.extract()?)))
        }
        // `runtime`: a list of NAME=FILE.npy texts.
        Rule::RuntimeList if !is_text => match v.extract::<Vec<String>>() {
            Ok(list) => Ok(Some(Value::Array(list.into_iter().map(Value::String).collect()))),
            Err(_) => Err(bad()),
        },
        Rule::Text | Rule::File | Rule::TextList | Rule::RuntimeList => Err(bad()),
    }
}

/// The type's name of a Python value (`bool_` for NumPy's booleans).
fn type_name_of(v: &Bound<'_, PyAny>) -> String {
    v.get_type().name().map(|n| n.to_string()).unwrap_or_default()
}

/// Python value -> JSON (bool, int, float, str, lists of those; `None` is null).
fn to_json(v: &Bound<'_, PyAny>, what: &str) -> PyResult<Value> {
    if v.is_none() {
        Ok(Value::Null)
    } else if v.cast::<PyBool>().is_ok() {
        Ok(Value::Bool(v.extract()?))
    } else if v.cast::<PyInt>().is_ok() {
        match v.extract::<i64>() {
            Ok(i) => Ok(Value::from(i)),
            Err(_) => Err(input_err(format!("{what} = {v}: out of range"))),
        }
    } else if v.cast::<PyFloat>().is_ok() {
        Ok(serde_json::Number::from_f64(v.extract()?).map(Value::Number).unwrap_or(Value::Null))
    } else if let Ok(s) = v.cast::<PyString>() {
        Ok(Value::String(s.to_str()?.to_string()))
    } else if let Ok(l) = v.cast::<PyList>() {
        l.iter().map(|x| to_json(&x, what)).collect::<PyResult<Vec<_>>>().map(Value::Array)
    } else if v.hasattr("__index__")? {
        Ok(Value::from(v.call_method0("__index__")?.extract::<i64>()?))
    } else if v.hasattr("__float__")? {
        Ok(serde_json::Number::from_f64(v.call_method0("__float__")?.extract()?).map(Value::Number).unwrap_or(Value::Null))
    } else {
        Err(input_err(format!("{what} = {v}: expected a number, a bool or text")))
    }
}

/// JSON text -> Python object.
fn from_json<'py>(py: Python<'py>, text: &str) -> PyResult<Bound<'py, PyAny>> {
    py.import("json")?.call_method1("loads", (text,))
}

/// Splash / tokamax block-size field names, in their spelling, and what they map onto.
const BLOCK_FIELDS: &[&str] =
    &["block_q", "block_kv", "block_kv_compute", "block_q_dkv", "block_kv_dkv", "block_kv_dkv_compute", "block_q_dq", "block_kv_dq"];
const BWD_FIELDS: &[&str] = &["block_q_dkv", "block_kv_dkv", "block_kv_dkv_compute", "block_q_dq", "block_kv_dq", "fused_bwd"];

/// A job being assembled from keyword arguments.
struct JobIn {
    fields: serde_json::Map<String, Value>,
    mask: Option<masks::PyMask>,
    /// `vmem_limit_mib` as given (any float: the job layer checks it against the chip).
    mib: Option<f64>,
    given: Given,
}

impl JobIn {
    /// A job field from a Python value, checked against the field's rule.
    fn field(&mut self, key: &str, v: &Bound<'_, PyAny>, origin: &str) -> PyResult<()> {
        if v.is_none() {
            return Ok(());
        }
        match field_value(key, v)? {
            Some(val) => {
                let core = match &val {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                self.given.note(key, core, repr(v));
                self.set(key, val, origin)
            }
            None => {
                let f: f64 = v.extract().or_else(|_| v.call_method0("__float__").and_then(|x| x.extract()))?;
                self.given.note(key, fields::number_text(f), repr(v));
                self.mib = Some(f);
                Ok(())
            }
        }
    }

    fn set(&mut self, key: &str, v: Value, origin: &str) -> PyResult<()> {
        if v.is_null() {
            return Ok(());
        }
        if let Some(old) = self.fields.get(key) {
            if *old != v {
                return Err(input_err(format!("{key} = {v} (from {origin}) contradicts {key} = {old} given before")));
            }
        }
        self.fields.insert(key.to_string(), v);
        Ok(())
    }

    /// A Splash / tokamax spelling onto the job's field.
    fn alias(&mut self, key: &str, v: &Bound<'_, PyAny>, origin: &str) -> PyResult<bool> {
        match key {
            "use_fused_bwd_kernel" | "use_experimental_scheduler" if !v.is_none() => {
                let field = if key == "use_fused_bwd_kernel" { "fused_bwd" } else { "experimental_scheduler" };
                let b = bool_arg(key, v)?;
                self.set(field, Value::Bool(b), origin)?
            }
            "use_fused_bwd_kernel" | "use_experimental_scheduler" => {}
            "use_base2_exp" => {
                if !v.is_none() {
                    let b = bool_arg(key, v)?;
                    self.set("exp", Value::String(if b { "base2" } else { "natural" }.into()), origin)?;
                }
            }
            "q_layout" | "k_layout" | "v_layout" => {
                if !v.is_none() {
                    let name: String = match v.getattr("name") {
                        Ok(n) => n.extract()?,
                        Err(_) => v.str()?.to_string(),
                    };
                    let name = name.rsplit('.').next().unwrap_or(&name).to_string();
                    if name != "HEAD_DIM_MINOR" && name != "1" {
                        return Err(input_err(format!(
                            "{key} = {name}: the model lays q, k and v out as HEAD_DIM_MINOR (head_dim on the lanes, Splash's default); what {name} changes in the kernel is not modelled, so it is refused rather than ignored"
                        )));
                    }
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Block sizes from a `BlockSizes` / `SplashConfig` / tokamax `Config` object or a dict.
    fn block_sizes(&mut self, obj: &Bound<'_, PyAny>, backward: bool) -> PyResult<()> {
        let origin = "block_sizes";
        if let Ok(d) = obj.cast::<PyDict>() {
            for (k, v) in d.iter() {
                let key: String = k.extract()?;
                if BLOCK_FIELDS.contains(&key.as_str()) {
                    self.field(&key, &v, origin)?;
                } else if !self.alias(&key, &v, origin)? {
                    return Err(input_err(format!(
                        "block_sizes: unknown key '{key}'; block sizes are {}, use_fused_bwd_kernel, use_base2_exp, use_experimental_scheduler, q_layout, k_layout, v_layout",
                        BLOCK_FIELDS.join(", ")
                    )));
                }
            }
            return Ok(());
        }
        // An object: read the fields it has, by name. Backward fields only for a backward job
        // (a forward-only BlockSizes still carries their defaults). An object with none of them
        // (a number, text) is not block sizes: refused, never read as the defaults.
        if obj.cast::<PyString>().is_ok() || !BLOCK_FIELDS.iter().any(|k| obj.hasattr(*k).unwrap_or(false)) {
            return Err(input_err(format!(
                "block_sizes = {}: expected a Splash BlockSizes, a tokamax SplashConfig or Config, or a dict of their fields ({})",
                repr(obj),
                BLOCK_FIELDS.join(", ")
            )));
        }
        for key in BLOCK_FIELDS {
            if !backward && BWD_FIELDS.contains(key) {
                continue;
            }
            if let Ok(v) = obj.getattr(*key) {
                self.field(key, &v, origin)?;
            }
        }
        for key in ["use_fused_bwd_kernel", "use_base2_exp", "use_experimental_scheduler", "q_layout", "k_layout", "v_layout"] {
            if key == "use_fused_bwd_kernel" && !backward {
                continue;
            }
            if let Ok(v) = obj.getattr(key) {
                self.alias(key, &v, origin)?;
            }
        }
        // Options that change the kernel and are not modelled: refused unless at their defaults.
        for (key, default_ok) in [("attn_logits_soft_cap", "None"), ("max_logit_const", "None"), ("dq_reduction_steps", "None")] {
            if let Ok(v) = obj.getattr(key) {
                if !v.is_none() {
                    return Err(input_err(format!(
                        "block_sizes.{key} = {v}: not modelled (only {default_ok} is); it changes the kernel's work, so it is refused rather than ignored"
                    )));
                }
            }
        }
        if let Ok(v) = obj.getattr("num_stacked_q_heads") {
            if v.extract::<i64>().unwrap_or(1) != 1 {
                return Err(input_err(format!("block_sizes.num_stacked_q_heads = {v}: only 1 is modelled")));
            }
        }
        if !self.fields.contains_key("kernel") {
            // A JAX BlockSizes means JAX's Splash; tokamax's configs mean tokamax's.
            let module: String = obj.get_type().getattr("__module__").and_then(|m| m.extract()).unwrap_or_default();
            if module.starts_with("jax.") {
                self.fields.insert("kernel".into(), Value::String("splash".into()));
            } else if module.starts_with("tokamax") {
                self.fields.insert("kernel".into(), Value::String("tokamax-splash".into()));
            }
        }
        Ok(())
    }

    /// The job spec, with the mask's lengths and heads filled in when the job leaves them out
    /// and checked when it gives them.
    fn spec(mut self) -> PyResult<(JobSpec, Given)> {
        let mut mask_value = None;
        if let Some(pm) = self.mask.take() {
            if let Some((q, kv)) = pm.lengths {
                let given = (
                    self.fields.get("seq_len").or(self.fields.get("q_len")).and_then(Value::as_u64),
                    self.fields.get("seq_len").or(self.fields.get("kv_len")).and_then(Value::as_u64),
                );
                match given {
                    (None, None) => {
                        if q == kv {
                            self.fields.insert("seq_len".into(), Value::from(q));
                        } else {
                            self.fields.insert("q_len".into(), Value::from(q));
                            self.fields.insert("kv_len".into(), Value::from(kv));
                        }
                    }
                    (gq, gk) if gq.unwrap_or(q) != q || gk.unwrap_or(kv) != kv => {
                        return Err(input_err(format!(
                            "mask: shape ({q}, {kv}) does not match q_len x kv_len = {} x {}",
                            gq.map_or("unset".into(), |v| v.to_string()),
                            gk.map_or("unset".into(), |v| v.to_string())
                        )));
                    }
                    _ => {}
                }
            }
            if let Some(h) = pm.heads {
                match self.fields.get("heads").map(Value::as_u64) {
                    None => {
                        self.fields.insert("heads".into(), Value::from(h));
                    }
                    // A per-head mask of another head count (its masks all alike or not); a heads
                    // value that is no count is refused where the job is read.
                    Some(Some(given)) if given != h => {
                        return Err(input_err(format!(
                            "mask: a per-head mask of {h} heads for heads = {given}: a per-head mask lists one mask per q head; give {given} masks or heads={h}"
                        )));
                    }
                    Some(_) => {}
                }
            }
            match masks::as_text(&pm.mask) {
                Some(t) => {
                    self.fields.insert("mask".into(), Value::String(t));
                }
                None => mask_value = Some(pm.mask),
            }
        }
        let mut spec: JobSpec = serde_json::from_value(Value::Object(self.fields)).map_err(|e| input_err(e.to_string()))?;
        spec.mask_value = mask_value;
        spec.vmem_limit_mib = self.mib.or(spec.vmem_limit_mib);
        Ok((spec, self.given))
    }
}

/// Reads job keyword arguments (the job fields, Splash / tokamax spellings, `mask`,
/// `block_sizes`, `set` as a dict or a list).
fn job_in(py: Python<'_>, kwargs: Option<&Bound<'_, PyDict>>, skip: &[&str]) -> PyResult<JobIn> {
    let mut j = JobIn { fields: serde_json::Map::new(), mask: None, mib: None, given: Given::default() };
    let Some(kw) = kwargs else { return Ok(j) };
    let direction: Option<String> = kw.get_item("direction")?.and_then(|d| d.extract().ok());
    let backward = direction.as_deref().is_some_and(|d| d != "fwd");
    let mut block_sizes = None;
    for (k, v) in kw.iter() {
        let key: String = k.extract()?;
        if skip.contains(&key.as_str()) {
            continue;
        }
        match key.as_str() {
            "mask" => {
                if !v.is_none() {
                    j.mask = Some(masks::read_mask(py, &v, "mask")?);
                }
            }
            "block_sizes" => block_sizes = Some(v),
            "set" => {
                let items = set_items("set", &v)?;
                j.fields.insert("set".into(), Value::Array(items.into_iter().map(Value::String).collect()));
            }
            _ => {
                if !j.alias(&key, &v, "keyword arguments")? {
                    if fields::rule(&key).is_none() || key == "no_fused_bwd" {
                        return Err(input_err(format!(
                            "{key} = {}: not a job keyword; the keywords are {}, block_sizes and Splash's spellings (use_fused_bwd_kernel, use_base2_exp, use_experimental_scheduler)",
                            repr(&v),
                            {
                                let mut keys = fields::file_keys();
                                if !keys.contains(&"mask") {
                                    keys.push("mask");
                                }
                                keys.join(", ")
                            }
                        )));
                    }
                    j.field(&key, &v, "keyword arguments")?;
                }
            }
        }
    }
    if let Some(b) = block_sizes {
        if !b.is_none() {
            j.block_sizes(&b, backward)?;
        }
    }
    Ok(j)
}

fn job_spec(py: Python<'_>, kwargs: Option<&Bound<'_, PyDict>>, skip: &[&str]) -> PyResult<(JobSpec, Given)> {
    job_in(py, kwargs, skip)?.spec()
}

/// The job of `simulate()` with no job keyword (`chip` and `set` do not count): the built-in
/// case study, as `tpusim run` with no job flag.
fn default_job(spec: JobSpec) -> JobSpec {
    tpusim_job::case_study_or(spec)
}

/// Builds and runs a job: its report (with the what-if table, notes and shipped measurement),
/// its pipelines ([`pipelines`]) and its design what-ifs (`tpusim_job::design_what_ifs`: the
/// options its kernel family has no setting for); errors name fields as the caller gave them
/// (a length given as seq_len is named seq_len).
fn run_job(spec: &JobSpec, asked: Option<&JobSpec>) -> Result<(Report, String, Vec<String>), String> {
    let chip = spec.chip().map_err(|e| as_given(spec, e))?;
    let job = spec.build(&chip).map_err(|e| as_given(spec, e))?;
    let run = tpusim_job::run(&chip, &job).map_err(|e| as_given(spec, e))?;
    let mut rep = Report::from_run(&run);
    rep.render_notes(&mut |f, v| spec.describe_setting(f, v, FieldStyle::Key));
    // The job fields as the caller gave them (before the case study filled an empty call).
    if let Some(asked) = asked {
        rep.notes.extend(tpusim_job::family_defaults_note(asked, &job, FieldStyle::Key));
    }
    tpusim_calib::attach_shipped_measurement(&mut rep, &chip, &job);
    Ok((rep, pipelines(&run), tpusim_job::design_what_ifs(&job)))
}

/// Every kernel phase's pipeline ([`tpusim_model::Program::pipeline`]) as JSON: a list of
/// `{part, kernel, steps_computed, vmem, copy_sets, steps}`, in phase order.
fn pipelines(run: &tpusim_job::Run) -> String {
    let list: Vec<Value> = run
        .lowered
        .phases
        .iter()
        .filter_map(|p| match &p.work {
            tpusim_model::PhaseWork::Kernel(prog) => {
                let mut v = serde_json::to_value(prog.pipeline()).unwrap_or(Value::Null);
                if let Value::Object(m) = &mut v {
                    m.insert("part".into(), serde_json::to_value(p.part).unwrap_or(Value::Null));
                    m.insert("kernel".into(), Value::String(prog.info.kernel.clone()));
                    m.insert("steps_computed".into(), Value::from(prog.steps_computed()));
                }
                Some(v)
            }
            tpusim_model::PhaseWork::Fusion(_) => None,
        })
        .collect();
    Value::Array(list).to_string()
}

/// Builds and runs the job the caller `asked` for (the case study when it gives no job field:
/// [`default_job`]) on another thread without the GIL, Ctrl-C checked meanwhile.
fn run_spec(py: Python<'_>, asked: JobSpec, given: &Given) -> PyResult<(Report, String)> {
    interruptible_once(py, move || run_job(&default_job(asked.clone()), Some(&asked)).map(|(r, p, _)| (r, p)))?
        .map_err(|e| input_err(given.fix(e)))
}

/// The result of one simulation, whichever front end described the kernel: a hand-modelled job
/// (`tpusim.simulate`) or a kernel read from its IR (`tpusim.jax.simulate`, whose `job` is
/// `{kind: "described", file, kernel_name, device_kind}`): one report type, the same metrics by
/// the same names. The main metrics are attributes (`latency_ms`, `cycles`, `flops`,
/// `transcendentals`, `hbm_bytes`, `bottleneck`, `tiles`, `cost_estimate`, ...; every key of
/// `to_dict()` reads as an attribute and is listed by `dir()`; `python/tpusim/_tpusim.pyi` types
/// them); `str(report)` is the command line's table.
#[pyclass(name = "Report", module = "tpusim", frozen)]
struct PyReport {
    json: String,
    table: String,
    report: Report,
    /// Every kernel phase's pipeline as JSON ([`pipelines`]).
    pipelines: String,
}

#[pymethods]
impl PyReport {
    /// Predicted latency, milliseconds.
    #[getter]
    fn latency_ms(&self) -> f64 {
        self.report.latency_ms
    }
    /// Predicted latency, cycles of the chip model's clock.
    #[getter]
    fn cycles(&self) -> f64 {
        self.report.cycles
    }
    /// Executed matmul FLOPs (visited tiles, padding included: a head_dim below 128 runs as
    /// 128 lanes; `useful_flops` leaves the padding out).
    #[getter]
    fn flops(&self) -> f64 {
        self.report.flops
    }
    /// Executed exp / reciprocal elements.
    #[getter]
    fn transcendentals(&self) -> f64 {
        self.report.transcendentals
    }
    /// Bytes moved between HBM and VMEM (`useful_hbm_bytes`: only the elements inside the
    /// arrays, no edge tiles).
    #[getter]
    fn hbm_bytes(&self) -> u64 {
        self.report.hbm_bytes
    }
    /// Achieved useful FLOP/s over the chip model's peak (0..1).
    #[getter]
    fn mfu(&self) -> f64 {
        self.report.mfu
    }
    /// The unit that bounds the run (mxu, vpu, eup, xlu, hbm, step_control): the one whose 2x
    /// speed-up gains the most (`what_if_2x`) when that gain is 10% or more and untied; otherwise
    /// the unit with the largest share of the critical path (`critical_path_ms`; of the tied
    /// units when gains tie). `bound_rule` says which rule named it.
    #[getter]
    fn bottleneck(&self) -> String {
        self.report.bottleneck.to_string()
    }
    /// Other units whose 2x gain ties with the bottleneck's (at least 80% of the largest, above
    /// 1%, the largest 10% or more).
    #[getter]
    fn co_bound(&self) -> Vec<String> {
        self.report.co_bound.iter().map(|u| u.to_string()).collect()
    }
    /// Per unit, what making it alone twice as fast buys: a list of `{unit, set, latency_ms,
    /// gain}` (`gain` = 1 - latency_ms / this latency; `set` the `--set` overrides applied), the
    /// run's own lowering re-timed; `None` when the report was built without it.
    #[getter]
    fn what_if_2x<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.get(py, "what_if_2x")
    }
    /// `{flops, transcendentals, bytes_accessed}`: the run's totals named as Pallas'
    /// `pl.CostEstimate` fields, to compare with the estimate a kernel declares.
    #[getter]
    fn cost_estimate<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.get(py, "cost_estimate")
    }
    /// Tile counts over batch x heads: `{total, visited, empty, partial, full, masked}` (attention).
    #[getter]
    fn tiles<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.get(py, "tiles")
    }
    /// How sure the prediction is: `{chip, family, direction, scope, covered, n,
    /// median_abs_error, p90_abs_error, text}`, the leave-one-out |error| of the calibration rows
    /// of this job's chip, kernel family, direction and scope (`covered` false, without the
    /// error figures, when fewer than 5 rows stand behind it).
    #[getter]
    fn band<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.get(py, "band")
    }
    /// What the pipeline around each kernel's step bodies is, per kernel phase in order: a list
    /// of `{part, kernel, steps_computed, vmem, copy_sets, steps}`: `steps_computed` the kernel's grid
    /// steps that compute (`Report.steps_computed`'s definition), `vmem` the `pallas_call`'s VMEM buffers in
    /// its order (`{role, shape, dtype, buffers, bytes}`: windows with their pipeline buffers,
    /// scratch, the largest body value), `copy_sets` the distinct sets of copies Pallas's rule
    /// makes around a step (each a `{copies: [{r, dir, bytes, dmas, shape, buffers}], in_bytes,
    /// out_bytes, in_dmas, out_dmas}`, with `in_bytes_sync` / `in_dmas_sync` when one-buffer
    /// windows copy in; index 0 copies nothing) and `steps` every grid step's set
    /// in step order as `[steps, set index]` runs. What the hand models and the IR path must
    /// declare alike (`crates/tpusim-py/agreement.py`).
    #[getter]
    fn pipelines<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        from_json(py, &self.pipelines)
    }
    /// The whole report as a dict (the JSON of `tpusim run --format json`).
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        from_json(py, &self.json)
    }
    /// The whole report as JSON text.
    fn to_json(&self) -> String {
        self.json.clone()
    }
    fn __getattr__<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        let d = from_json(py, &self.json)?;
        match d.get_item(name) {
            Ok(v) => Ok(v),
            Err(_) => Err(pyo3::exceptions::PyAttributeError::new_err(
                match tpusim_job::absent_field_reason(matches!(self.report.job, Job::Described(_)), name) {
                    Some(why) => format!("Report has no field '{name}': {why}"),
                    None => match self.__dir__().into_iter().map(|k| (strsim::levenshtein(&k, name), k)).filter(|(e, _)| *e <= 2).min() {
                        Some((_, k)) => format!("Report has no field '{name}': did you mean '{k}'?"),
                        None => format!("Report has no field '{name}'"),
                    },
                },
            )),
        }
    }
    /// The report's fields (every key of `to_dict()`) with its methods: what `dir(report)` and
    /// tab completion list.
    fn __dir__(&self) -> Vec<String> {
        let mut names: Vec<String> = match serde_json::from_str::<Value>(&self.json) {
            Ok(Value::Object(m)) => m.keys().cloned().collect(),
            _ => Vec::new(),
        };
        names.extend(["to_dict", "to_json"].map(String::from));
        names.sort();
        names
    }
    fn __str__(&self) -> String {
        self.table.clone()
    }
    fn __repr__(&self) -> String {
        let what = match &self.report.job {
            Job::Described(d) => format!("`{}` ", d.kernel_name),
            _ => String::new(),
        };
        format!("<tpusim.Report {what}{:.3} ms on {}, bound by {}>", self.report.latency_ms, self.report.chip, self.report.bottleneck)
    }
}

impl PyReport {
    fn new((report, pipelines): (Report, String)) -> Self {
        PyReport { json: report.to_json(), table: report.to_table(), report, pipelines }
    }
    fn get<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Bound<'py, PyAny>> {
        Ok(from_json(py, &self.json)?.get_item(key).unwrap_or_else(|_| py.None().into_bound(py)))
    }
}

/// Simulates one kernel call and returns its `Report`.
///
/// Keyword arguments are the job fields of `tpusim run` with underscores (`chip`, `kernel`,
/// `direction`, `batch`, `heads`, `kv_heads`, `seq_len` or `q_len` and `kv_len` in tokens,
/// `head_dim`, `block_q`, `block_kv`, `block_kv_compute`, `traversal`, `masking`,
/// `mask_source`, `vmem_limit_mib` in MiB, ...), with these additions:
///
/// * `mask`: text in the `--mask` grammar, a JAX Splash / tokamax mask object (FullMask,
///   CausalMask, LocalMask, ChunkedCausalMask, NumpyMask, LogicalOr, LogicalAnd, MultiHeadMask),
///   or a boolean NumPy array `[q, kv]` / `[heads, q, kv]` (read in place, never copied). The
///   lengths (and heads of a multi-head mask) are taken from the mask when not given.
/// * `block_sizes`: a Splash `BlockSizes`, tokamax `SplashConfig` / op `Config`, or a dict with
///   their field names (`block_q`, `block_kv`, `block_kv_compute`, `block_q_dkv`, ...,
///   `use_fused_bwd_kernel`, `use_base2_exp`, `use_experimental_scheduler`; layouts only
///   HEAD_DIM_MINOR).
/// * `set`: chip overrides, `{"hbm.bandwidth_gb_per_s": 3276}`.
///
/// With no job keyword (only `chip`, `set` or none) it runs the built-in case study (JAX's Splash
/// at 3024/2048/1024 on the 75,600-token video layer); any job keyword starts from the kernel
/// family's defaults instead (`simulate(heads=10)` runs tokamax's Splash at its 128-wide
/// blocks), and the report's notes say so.
///
/// Raises `tpusim.InputError` (a `ValueError`) with the command line's message for bad input.
#[pyfunction]
#[pyo3(signature = (**kwargs))]
fn simulate(py: Python<'_>, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<PyReport> {
    let (spec, given) = job_spec(py, kwargs, &[])?;
    Ok(PyReport::new(run_spec(py, spec, &given)?))
}

/// Searches block sizes and kernel options for one job (the job fields as for `simulate`; with
/// no job field, the default job's workload and kernel, its blocks searched) and
/// returns the ranking as a dict: `top` is a list of configurations, best first, each with
/// `latency_ms`, `bottleneck`, `flags` (for `tpusim run`), `block_sizes` (text ready to paste:
/// the kernel's config call, JAX Splash's `BlockSizes(block_q=..., ...)` or tokamax's
/// `SplashConfig(block_q=..., ...)`), `block_sizes_kwargs` (a dict for either, `**kw`) and,
/// for a design what-if (an option the kernel's library has no setting for, starred by
/// `tpusim tune`), `design_whatif` naming it: its `block_sizes` run without that option.
/// `pruned` counts the valid configurations not simulated because their latency lower bound
/// showed they cannot rank; `exhaustive=True` simulates them too (the same ranking).
#[pyfunction]
#[pyo3(signature = (top = None, allow_inexact = None, allow_approximate = None, refine = None, exhaustive = None, **kwargs))]
#[allow(clippy::too_many_arguments)]
fn tune<'py>(
    py: Python<'py>,
    top: Option<&Bound<'py, PyAny>>,
    allow_inexact: Option<&Bound<'py, PyAny>>,
    allow_approximate: Option<&Bound<'py, PyAny>>,
    refine: Option<&Bound<'py, PyAny>>,
    exhaustive: Option<&Bound<'py, PyAny>>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let d = tpusim_sweep::TuneOptions::default();
    let top = top.map(|v| count_arg("top", v)).transpose()?.unwrap_or(d.top);
    let refine = refine.map(|v| count_arg("refine", v)).transpose()?.unwrap_or(d.refine);
    let allow_inexact = allow_inexact.map(|v| bool_arg("allow_inexact", v)).transpose()?.unwrap_or(false);
    let allow_approximate = allow_approximate.map(|v| bool_arg("allow_approximate", v)).transpose()?.unwrap_or(false);
    let exhaustive = exhaustive.map(|v| bool_arg("exhaustive", v)).transpose()?.unwrap_or(false);
    let (spec, given) = job_spec(py, kwargs, &[])?;
    // With no job keyword: the default job's workload and kernel, its blocks searched.
    // ... compared with the default job at its own blocks, as `simulate()` runs it.
    let baseline = tpusim_job::tune_baseline(&spec);
    let spec = tpusim_job::tune_default_or(spec);
    let cancel = Arc::new(AtomicBool::new(false));
    let opts = tpusim_sweep::TuneOptions { top, allow_inexact, allow_approximate, refine, exhaustive, cancel: Some(cancel.clone()), baseline, ..d };
    let job = spec.clone();
    let r = interruptible(py, &cancel, move || tpusim_sweep::tune(&job, &opts))?.map_err(|e| input_err(given.fix(as_given(&spec, e))))?;
    let out = from_json(py, &r.to_json())?;
    let list = out.get_item("top")?;
    for (i, ranked) in r.top.iter().enumerate() {
        let kw = PyDict::new(py);
        if let Some(text) = ranked.job.block_sizes_kwargs() {
            for pair in text.split(", ") {
                if let Some((k, v)) = pair.split_once('=') {
                    match v {
                        "True" => kw.set_item(k, true)?,
                        "False" => kw.set_item(k, false)?,
                        n => kw.set_item(k, n.parse::<u64>().unwrap_or_default())?,
                    }
                }
            }
        }
        list.get_item(i)?.set_item("block_sizes_kwargs", kw)?;
    }
    Ok(out)
}

/// Chip overrides given from Python as `SECTION.FIELD=VALUE` strings: a dict
/// `{"SECTION.FIELD": value}`, one such string or a list of them; `arg` names the argument in
/// the error for anything else.
fn set_items(arg: &str, v: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    if let Ok(d) = v.cast::<PyDict>() {
        d.iter().map(|(a, b)| Ok(format!("{}={}", a.str()?, b.str()?))).collect()
    } else if let Ok(s) = v.extract::<String>() {
        Ok(vec![s])
    } else {
        v.extract::<Vec<String>>().map_err(|_| {
            input_err(format!("{arg} = {}: expected a dict {{'SECTION.FIELD': value}}, 'SECTION.FIELD=VALUE' or a list of them", repr(v)))
        })
    }
}

/// A chip model as a dict (every parameter with its unit in its name and its source): a preset
/// (`v6e`, `v5e`, `v5p`, `v4`, `v7x`) or a chip TOML path, with `overrides`
/// (`{"hbm.bandwidth_gb_per_s": 3276}`) applied; `set` is the same (as `simulate` names it: a
/// dict, one `SECTION.FIELD=VALUE` string or a list of them).
///
/// Raises `InputError` naming the argument for a name that is not text, overrides that are none
/// of those, and (from the model) an unknown preset, field or value.
#[pyfunction]
#[pyo3(signature = (name_or_path = None, overrides = None, set = None))]
fn chip<'py>(
    py: Python<'py>,
    name_or_path: Option<&Bound<'py, PyAny>>,
    overrides: Option<&Bound<'py, PyAny>>,
    set: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let name = match name_or_path {
        None => "v6e".to_string(),
        Some(n) => n.extract::<String>().map_err(|_| {
            input_err(format!("name_or_path = {}: expected a preset name (v6e, v5e, v5p, v4, v7x) or a chip TOML path", repr(n)))
        })?,
    };
    let mut list = Vec::new();
    for (arg, o) in [("overrides", overrides), ("set", set)] {
        if let Some(o) = o {
            list.extend(set_items(arg, o)?);
        }
    }
    let set = list;
    let name_or_path = name.as_str();
    let model = JobSpec { chip: Some(name_or_path.to_string()), set, ..Default::default() }.chip().map_err(spec_err)?;
    from_json(py, &serde_json::to_string(&model).map_err(|e| SimulationError::new_err(e.to_string()))?)
}

/// Measurement rows (dicts with the columns of traces/measured/README.md) as CSV text.
fn rows_csv(rows: &Bound<'_, PyAny>) -> PyResult<String> {
    let mut recs: Vec<serde_json::Map<String, Value>> = Vec::new();
    for (i, r) in rows.try_iter()?.enumerate() {
        let r = r?;
        let d = r.cast::<PyDict>().map_err(|_| input_err(format!("rows[{i}]: expected a dict of measurement columns")))?;
        let mut m = serde_json::Map::new();
        for (k, v) in d.iter() {
            let key: String = k.extract()?;
            // A NaN or infinite number is named as such (it became an empty cell: "empty").
            if let Some(f) = v.cast::<PyFloat>().ok().and_then(|f| f.extract::<f64>().ok()) {
                if !f.is_finite() {
                    return Err(input_err(format!("rows[{i}].{key} = {f}: not a finite number")));
                }
            }
            m.insert(key.clone(), to_json(&v, &format!("rows[{i}].{key}"))?);
        }
        if m.is_empty() {
            return Err(input_err(format!(
                "rows[{i}] = {{}}: no measurement columns; a row needs at least {} (the columns are {}; traces/measured/README.md)",
                tpusim_calib::measure::REQUIRED_COLUMNS.join(", "),
                tpusim_calib::measure::KNOWN_COLUMNS.join(", ")
            )));
        }
        recs.push(m);
    }
    if recs.is_empty() {
        return Err(input_err("rows = []: no measurement rows; give at least one dict of measurement columns (traces/measured/README.md) or a CSV path".to_string()));
    }
    let cols: Vec<&str> =
        tpusim_calib::measure::KNOWN_COLUMNS.iter().copied().filter(|c| recs.iter().any(|r| r.contains_key(*c))).collect();
    if let Some((i, k)) = recs.iter().enumerate().find_map(|(i, r)| r.keys().find(|k| !cols.contains(&k.as_str())).map(|k| (i, k.clone())))
    {
        return Err(input_err(format!(
            "rows[{i}]: unknown column '{k}'; the columns are {} (traces/measured/README.md)",
            tpusim_calib::measure::KNOWN_COLUMNS.join(", ")
        )));
    }
    let mut text = tpusim_io::csv_record(cols.iter());
    for r in &recs {
        let cells: Vec<String> = cols
            .iter()
            .map(|c| match r.get(*c) {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(Value::Bool(b)) => if *b { "yes" } else { "no" }.into(),
                Some(v) => v.to_string(),
            })
            .collect();
        text.push_str(&tpusim_io::csv_record(cells.iter()));
    }
    Ok(text)
}

/// Predicts every measurement row and compares with the measured time. `rows` is a CSV path
/// (the format of `traces/measured/README.md`) or a list of dicts with its columns (e.g. from
/// `measurements_from_trace`); `chips` are chip TOML paths used for rows whose `chip` names
/// them. Returns the JSON of `tpusim validate --format json` as a dict: `rows` (predicted, with
/// signed `error` as a fraction), `skipped` (with reasons), `groups` and `summary`.
#[pyfunction]
#[pyo3(signature = (rows, chips = None))]
fn validate<'py>(py: Python<'py>, rows: &Bound<'py, PyAny>, chips: Option<Vec<String>>) -> PyResult<Bound<'py, PyAny>> {
    let models =
        chips.unwrap_or_default().iter().map(|c| tpusim_chip::ChipModel::load(c)).collect::<Result<Vec<_>, _>>().map_err(spec_err)?;
    let source = if let Ok(p) = rows.extract::<String>() {
        Ok(p)
    } else {
        if rows.is_none() || rows.cast::<PyDict>().is_ok() || rows.try_iter().is_err() {
            return Err(input_err(format!(
                "rows = {}: expected a measurement CSV path or a list of dicts of its columns (traces/measured/README.md)",
                repr(rows)
            )));
        }
        Err(rows_csv(rows)?)
    };
    // Reading the rows (each kernel_ir row's description too) runs with the validation, off the
    // GIL: a file of many described rows takes seconds to read, and Ctrl-C must stop it.
    let v = interruptible_once(py, move || {
        let file = match &source {
            Ok(path) => tpusim_calib::read_file(path, &models),
            Err(text) => tpusim_calib::parse(text, "rows", &models),
        }?;
        Ok::<_, tpusim_calib::measure::MeasureError>(tpusim_calib::validate(&file, &tpusim_calib::ChipSet { models }))
    })?
    .map_err(spec_err)?;
    from_json(py, &v.to_json())
}

/// Runs one simulation per point (in parallel over the machine's cores; Ctrl-C stops it) and
/// returns a list of dicts (ready for `pandas.DataFrame`), in the order of `points`:
/// `error` (None, or why the point did not run: its row then holds only its own fields),
/// `design_whatif` (None, or the options the point's kernel family has no setting for, as
/// `tpusim sweep`'s column names them),
/// each point's fields, then `latency_ms`, `cycles`, `flops`, `mfu`, `hbm_bytes`,
/// `transcendentals`, `bottleneck`, the tile counts (`tiles_empty`, `tiles_partial`,
/// `tiles_full`, `tiles_visited`), `pair_density`, `tile_density`, `dense_latency_ms` and
/// `speedup_vs_dense` (sparse attention) and, for attention, the `block_q`, `block_kv` and
/// `block_kv_compute` it ran with. `points` is any iterable of dicts of job fields (as for
/// `simulate`); `**base` are fields every point shares (a point's own fields win). A point
/// whose fields are malformed (an unknown keyword, a wrong type) stops the sweep with
/// [`InputError`] naming it, before anything runs.
#[pyfunction]
#[pyo3(signature = (points, **base))]
fn sweep<'py>(py: Python<'py>, points: &Bound<'py, PyAny>, base: Option<&Bound<'py, PyDict>>) -> PyResult<Bound<'py, PyList>> {
    let (base_spec, _) = job_spec(py, base, &[])?;
    let out = PyList::empty(py);
    let iter = match points.try_iter() {
        Ok(it) if points.cast::<PyString>().is_err() && points.cast::<PyDict>().is_err() => it,
        _ => return Err(input_err(format!("points = {}: expected a list (or any iterable) of dicts of job fields", repr(points)))),
    };
    let in_point = |i: usize, e: PyErr| {
        if e.is_instance_of::<InputError>(py) {
            input_err(format!("points[{i}]: {}", e.value(py)))
        } else {
            e
        }
    };
    // The points read under the GIL (a signal is checked between them: a long generator of
    // points stops on Ctrl-C), then run together on the worker threads without it.
    let mut points = Vec::new();
    for (i, p) in iter.enumerate() {
        py.check_signals()?;
        let p = p?;
        let d = p.cast::<PyDict>().map_err(|_| input_err(format!("points[{i}] = {}: expected a dict of job fields", repr(&p))))?.clone();
        let (point, given) = job_spec(py, Some(&d), &[]).map_err(|e| in_point(i, e))?;
        points.push((d, base_spec.overlay(&point), given));
    }
    let specs: Vec<JobSpec> = points.iter().map(|(_, s, _)| s.clone()).collect();
    let cancel = Arc::new(AtomicBool::new(false));
    let stop = cancel.clone();
    let reports = interruptible(py, &cancel, move || {
        use rayon::prelude::*;
        // Each run with its design what-ifs, which `tpusim sweep` gives in its `design_whatif`
        // column.
        specs.par_iter().map(|s| if stop.load(Ordering::Relaxed) { Err(String::new()) } else { run_job(s, None).map(|(r, _, w)| (r, w)) }).collect::<Vec<_>>()
    })?;
    for ((d, _, given), r) in points.iter().zip(reports) {
        let row = PyDict::new(py);
        // A point that does not run (a block rule, a VMEM overflow) keeps its row, with the
        // reason in `error`, as `tpusim sweep` does; the others' `error` is None.
        let (r, what_ifs) = match r {
            Ok(r) => r,
            Err(e) => {
                for (k, v) in d.iter() {
                    row.set_item(k, v)?;
                }
                row.set_item("error", given.fix(e))?;
                out.append(row)?;
                continue;
            }
        };
        row.set_item("error", py.None())?;
        row.set_item("design_whatif", if what_ifs.is_empty() { None } else { Some(what_ifs.join("; ")) })?;
        for (k, v) in d.iter() {
            let key: String = k.extract()?;
            if key == "mask" && !v.is_instance_of::<PyString>() {
                row.set_item(k, r.job_mask())?;
            } else if key == "block_sizes" {
                continue;
            } else {
                row.set_item(k, v)?;
            }
        }
        row.set_item("latency_ms", r.latency_ms)?;
        row.set_item("cycles", r.cycles)?;
        row.set_item("flops", r.flops)?;
        row.set_item("mfu", r.mfu)?;
        row.set_item("hbm_bytes", r.hbm_bytes)?;
        row.set_item("transcendentals", r.transcendentals)?;
        row.set_item("bottleneck", r.bottleneck.to_string())?;
        if let Some(t) = r.tiles {
            row.set_item("tiles_empty", t.empty)?;
            row.set_item("tiles_partial", t.partial)?;
            row.set_item("tiles_full", t.full)?;
            row.set_item("tiles_visited", t.visited)?;
        }
        row.set_item("pair_density", r.pair_density)?;
        row.set_item("tile_density", r.tile_density)?;
        row.set_item("dense_latency_ms", r.dense_latency_ms)?;
        row.set_item("speedup_vs_dense", r.speedup_vs_dense)?;
        // The blocks the point ran with (a point that leaves one unset, or None, takes the
        // family's default).
        if let Job::Attention { config: c, .. } = &r.job {
            row.set_item("block_q", c.block_q)?;
            row.set_item("block_kv", c.block_kv)?;
            row.set_item("block_kv_compute", c.block_kv_compute)?;
        }
        out.append(row)?;
    }
    Ok(out)
}

trait JobMask {
    fn job_mask(&self) -> String;
}
impl JobMask for Report {
    fn job_mask(&self) -> String {
        match &self.job {
            Job::Attention { workload, .. } => workload.mask.to_string(),
            Job::Matmul { .. } | Job::Described(_) => String::new(),
        }
    }
}

/// Turns a profiler trace into measurement rows for `validate` / `tpusim calibrate`.
///
/// `trace` is Chrome trace JSON, gzip-compressed or not (XProf's
/// `plugins/profile/RUN/HOST.trace.json.gz`, a Perfetto JSON export). Device ops on processes
/// matching `device` and threads matching `line` whose names match `kernel_pattern` (a regular
/// expression) are grouped by name (XLA's `.N` suffix dropped); each group becomes one row with
/// the median duration in milliseconds (`measured_ms`) and its repeat count (in `timing`). The
/// other columns come from the job keyword arguments (as for `simulate`; `chip` is required),
/// resolved as the simulator resolves them. `id` is the row id (a prefix `ID-NAME` when several
/// kernels match). With `out`, the rows are also written there as CSV (completely or not at
/// all), marked as `tpusim from-trace --out` marks them. Returns the rows as a list of dicts.
///
/// `force` (default `False`): an existing `out` is replaced only when it holds rows this
/// function (or `tpusim from-trace`) wrote, checked before the trace is read; `force=True`
/// replaces any file. Raises `InputError` naming `out` otherwise.
#[pyfunction]
#[pyo3(signature = (trace, kernel_pattern, id, out = None, device = "^/device:", line = "^XLA Ops$", force = false, **kwargs))]
#[allow(clippy::too_many_arguments)]
fn measurements_from_trace<'py>(
    py: Python<'py>,
    trace: &str,
    kernel_pattern: &str,
    id: &str,
    out: Option<&str>,
    device: &str,
    line: &str,
    force: bool,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyList>> {
    let (spec, _) = job_spec(py, kwargs, &[])?;
    let sel = tpusim_calib::Selection { pattern: kernel_pattern.to_string(), device: device.to_string(), line: line.to_string() };
    let flag_to_arg = |s: String| {
        s.replace("--kernel-pattern", "kernel_pattern").replace("--device", "device").replace("--line", "line").replace("--", "")
    };
    // The overwrite rule of the command line's `from-trace --out` (tpusim_io::mark), before any work.
    if let Some(path) = out {
        tpusim_io::mark::check_replace_as(std::path::Path::new(path), "from-trace", force, Force::Keyword).map_err(|e| output_err("out", e))?;
    }
    let (trace_path, row_id) = (trace.to_string(), id.to_string());
    let rows = interruptible_once(py, move || {
        let t = tpusim_calib::read_trace(&trace_path)?;
        let ops = tpusim_calib::select_ops(&t, &sel, &trace_path)?;
        tpusim_calib::measurement_rows(&tpusim_calib::kernel_timings(&ops), &spec, &row_id, &sel, &trace_path)
    })?
    .map_err(|e| input_err(flag_to_arg(render_fields(&e.to_string(), FieldStyle::Key))))?;
    if let Some(path) = out {
        let marked = format!("{}{}", tpusim_io::mark::comment_line("from-trace"), tpusim_calib::rows_to_csv(&rows));
        tpusim_io::write_atomic(std::path::Path::new(path), marked.as_bytes()).map_err(|e| output_err("out", e))?;
    }
    let list = PyList::empty(py);
    for r in rows {
        let d = PyDict::new(py);
        for (k, v) in r {
            d.set_item(k, v)?;
        }
        list.append(d)?;
    }
    Ok(list)
}

/// The device ops of a profiler trace, selected as `measurements_from_trace` selects them, as a
/// list of dicts `{device, line, name, ts_us, dur_us}` in trace order (times in microseconds,
/// the trace's clock): for timings that are not a kernel family's row, such as the jitted
/// module's device time that `python -m tpusim.microbench --measure` takes.
///
/// `trace` is Chrome trace JSON, gzip-compressed or not (XProf's `HOST.trace.json.gz`, a
/// Perfetto JSON export); `kernel_pattern`, `device` and `line` are regular expressions on the
/// op's name, its process's `process_name` and its thread's `thread_name` (the name is
/// searched, not anchored). Raises `InputError` for an unreadable or malformed trace, a bad
/// expression, or a pattern that matches nothing (the message lists the trace's processes,
/// threads and most frequent op names).
#[pyfunction]
#[pyo3(signature = (trace, kernel_pattern, device = "^/device:", line = "^XLA Ops$"))]
fn trace_ops<'py>(py: Python<'py>, trace: &str, kernel_pattern: &str, device: &str, line: &str) -> PyResult<Bound<'py, PyList>> {
    let sel = tpusim_calib::Selection { pattern: kernel_pattern.to_string(), device: device.to_string(), line: line.to_string() };
    let trace_path = trace.to_string();
    let ops = interruptible_once(py, move || {
        let t = tpusim_calib::read_trace(&trace_path)?;
        tpusim_calib::select_ops(&t, &sel, &trace_path)
    })?
    .map_err(|e| input_err(e.to_string().replace("--kernel-pattern", "kernel_pattern").replace("--device", "device").replace("--line", "line")))?;
    let list = PyList::empty(py);
    for o in ops {
        let d = PyDict::new(py);
        d.set_item("device", o.device)?;
        d.set_item("line", o.line)?;
        d.set_item("name", o.name)?;
        d.set_item("ts_us", o.ts_us)?;
        d.set_item("dur_us", o.dur_us)?;
        list.append(d)?;
    }
    Ok(list)
}

/// The `--mask` text of a mask given from Python (a Splash mask object, or text); raises
/// `InputError` for masks with no text form (arrays).
#[pyfunction]
fn mask_text(py: Python<'_>, mask: &Bound<'_, PyAny>) -> PyResult<String> {
    let pm = masks::read_mask(py, mask, "mask")?;
    masks::as_text(&pm.mask)
        .ok_or_else(|| input_err("mask: an array mask has no --mask text; save it with numpy.save and pass file:PATH.npy"))
}

/// Per-head tile classification of a mask at a `block_q x block_kv` tiling: a list with one
/// dict `{empty, partial, full, kept_pairs}` per head (`heads`, default the mask's own head
/// count or 1), classified as Splash's `MaskInfo` does (empty: no pair kept; full: every pair
/// kept and no padding; partial: the rest). Lengths default to the mask's shape.
#[pyfunction]
#[pyo3(signature = (mask, block_q, block_kv, heads = None, q_len = None, kv_len = None))]
fn tile_counts<'py>(
    py: Python<'py>,
    mask: &Bound<'py, PyAny>,
    block_q: &Bound<'py, PyAny>,
    block_kv: &Bound<'py, PyAny>,
    heads: Option<&Bound<'py, PyAny>>,
    q_len: Option<&Bound<'py, PyAny>>,
    kv_len: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyList>> {
    // Block sizes and lengths follow the job fields' rules (whole numbers from 1).
    let whole = |key: &str, v: &Bound<'py, PyAny>| -> PyResult<u64> {
        match field_value(key, v)? {
            Some(Value::Number(n)) => n.as_u64().ok_or_else(|| input_err(format!("{key} = {}: expected a whole number", repr(v)))),
            _ => Err(input_err(format!("{key} = {}: expected a whole number", repr(v)))),
        }
    };
    let (block_q, block_kv) = (whole("block_q", block_q)?, whole("block_kv", block_kv)?);
    let kw = PyDict::new(py);
    kw.set_item("mask", mask)?;
    if let Some(h) = heads {
        kw.set_item("heads", h)?;
    }
    match (q_len, kv_len) {
        (Some(q), Some(k)) => {
            kw.set_item("q_len", q)?;
            kw.set_item("kv_len", k)?;
        }
        (None, None) => {}
        (Some(_), None) | (None, Some(_)) => return Err(input_err("q_len, kv_len: give both or neither (neither: the mask's own shape)")),
    }
    let (spec, _) = job_spec(py, Some(&kw), &[])?;
    // A text mask has no shape of its own: the lengths must be given, not defaulted.
    if spec.seq_len.is_none() && spec.q_len.is_none() && spec.kv_len.is_none() {
        return Err(input_err(format!(
            "tile_counts: mask = {} has no shape of its own (a text mask): give q_len and kv_len",
            repr(mask)
        )));
    }
    let heads = spec.heads.unwrap_or(1);
    let spec = JobSpec { heads: Some(heads), ..spec };
    let chip = spec.chip().map_err(|e| spec_err_as_given(&spec, e))?;
    let job = spec.build(&chip).map_err(|e| spec_err_as_given(&spec, e))?;
    let Job::Attention { workload: w, .. } = job else { return Err(input_err("tile_counts: an attention mask is needed")) };
    w.mask.check_tiling(block_q, block_kv).map_err(spec_err)?;
    if block_q == 0 || block_kv == 0 {
        return Err(input_err(format!("block_q x block_kv = {block_q} x {block_kv}: expected whole numbers from 1")));
    }
    let grid = TileGrid { q_len: w.q_len, kv_len: w.kv_len, block_q, block_kv };
    let stats: Vec<TileStats> = interruptible_once(py, move || (0..w.q_heads).map(|h| TileStats::collect(w.mask_for_head(h), &grid, false)).collect())?;
    let out = PyList::empty(py);
    for s in stats {
        let d = PyDict::new(py);
        d.set_item("empty", s.empty)?;
        d.set_item("partial", s.partial)?;
        d.set_item("full", s.full)?;
        d.set_item("kept_pairs", s.kept_pairs)?;
        out.append(d)?;
    }
    Ok(out)
}

/// The overwrite rule (`tpusim_io::mark`) for the package's own writers (`tpusim.jax.describe`,
/// `decode_sweep`, `python -m tpusim.microbench`), checked for every file a call will write before
/// it writes the first: each `(path, owner)` of `targets` is a file `command` writes (`owner`
/// `None`: replaced only when it carries `command`'s mark) or a side file of `owner` (replaced
/// only beside an `owner` that carries it), unless `force`. `arg` is the keyword the caller
/// gave the path as. Raises `InputError` `ARG = 'PATH': why; pass force=True to replace it, ...`;
/// with `flag` (a command line of the package's, `python -m tpusim.microbench`), `ARG PATH: why;
/// give --force to replace it, ...`.
#[pyfunction]
#[pyo3(name = "_check_outputs", signature = (arg, command, targets, force, flag = false))]
fn check_outputs(arg: &str, command: &str, targets: Vec<(String, Option<String>)>, force: bool, flag: bool) -> PyResult<()> {
    use std::path::Path;
    let how = if flag { Force::Flag } else { Force::Keyword };
    let output_err = |arg: &str, e| match e {
        tpusim_io::OutputError::Refused { path, reason } if flag => input_err(format!("{arg} {path}: {reason}")),
        e => output_err(arg, e),
    };
    for (path, owner) in &targets {
        match owner {
            None => tpusim_io::mark::check_replace_as(Path::new(path), command, force, how).map_err(|e| output_err(arg, e))?,
            Some(owner) => tpusim_io::mark::check_beside(Path::new(path), Path::new(owner), command, force, how).map_err(|e| {
                let e = match e {
                    tpusim_io::OutputError::Refused { path, reason } => {
                        tpusim_io::OutputError::Refused { path: owner.clone(), reason: format!("its side file {path} {reason}") }
                    }
                    other => other,
                };
                output_err(arg, e)
            })?,
        }
    }
    Ok(())
}

/// Writes `data` to `path` completely or not at all (`tpusim_io::write_atomic`: a temporary
/// file in the same folder, flushed, renamed over `path`). `arg` names the path in errors:
/// `InputError` for a path that cannot be an output, `SimulationError` for a failed write.
#[pyfunction]
#[pyo3(name = "_write_output")]
fn write_output(arg: &str, path: &str, data: &[u8]) -> PyResult<()> {
    tpusim_io::write_atomic(std::path::Path::new(path), data).map_err(|e| output_err(arg, e))
}

/// The first line of a CSV file `command` writes (`# tpusim output: COMMAND (tpusim VERSION)`,
/// with its newline): the mark [`check_outputs`] reads back.
#[pyfunction]
#[pyo3(name = "_mark_line")]
fn mark_line(command: &str) -> String {
    tpusim_io::mark::comment_line(command)
}

/// The library kernel family of a kernel named `kernel_name` whose ops come from the source
/// files `files` (paths as the lowering's locations give them, folders included), by the table
/// of `tpusim_pallas::family` (stated in `traces/measured/kernels/README.md`); `None` when no
/// row matches. `tpusim.jax.describe` records it in a description's `family`.
#[pyfunction]
#[pyo3(name = "_kernel_family")]
fn kernel_family(kernel_name: &str, files: Vec<String>) -> Option<&'static str> {
    tpusim_pallas::family::recognise(kernel_name, files.iter().map(String::as_str))
}

/// `None` when `family` is a kernel family word (`tpusim_pallas::family::is_word`), else what
/// one may be: the rule a description's `family` is read by, for `tpusim.jax`'s `family=`.
#[pyfunction]
#[pyo3(name = "_family_word_rule")]
fn family_word_rule(family: &str) -> Option<&'static str> {
    (!tpusim_pallas::family::is_word(family)).then_some(tpusim_pallas::family::WORD_RULE)
}

/// Simulates a kernel description (JSON text, as `tpusim.jax.describe` writes it; side files
/// resolved against `folder`) on `chip` with `set` overrides (`SECTION.FIELD=VALUE` strings).
/// Used by `tpusim.jax.simulate`; returns a `Report` (its `job` is `{kind: "described", file,
/// kernel_name, ...}`; the attention-only fields are absent).
#[pyfunction]
#[pyo3(signature = (description, chip = "v6e", set = Vec::new(), folder = "."))]
fn simulate_kernel_ir(py: Python<'_>, description: &str, chip: &str, set: Vec<String>, folder: &str) -> PyResult<PyReport> {
    let spec = JobSpec { chip: Some(chip.to_string()), set, kernel_ir_value: Some(kernel_ir_value(description, folder)), ..Default::default() };
    let model = spec.chip().map_err(spec_err)?;
    let rep = interruptible_once(py, move || {
        let job = spec.build(&model).map_err(|e| e.to_string())?;
        let run = tpusim_job::run(&model, &job).map_err(|e| e.to_string())?;
        Ok::<_, String>((Report::from_run(&run), pipelines(&run)))
    })?
    .map_err(input_err)?;
    Ok(PyReport::new(rep))
}

/// A kernel description given as JSON text from Python (its side files resolved against
/// `folder`), as a job's [`tpusim_job::KernelIrValue`].
pub(crate) fn kernel_ir_value(description: &str, folder: &str) -> tpusim_job::KernelIrValue {
    tpusim_job::KernelIrValue { file: "-".into(), text: description.to_string(), dir: std::path::PathBuf::from(folder) }
}

/// tpusim's compiled module, `tpusim._tpusim` (maturin's mixed layout: `python/tpusim/__init__.py`
/// re-exports it, `python/tpusim/jax.py` sits beside it): a cycle-approximate simulator of Google
/// TPU chips for attention kernels.
///
/// `simulate(...)` runs one kernel call, `tune(...)` ranks block sizes and options, `sweep(points,
/// ...)` runs many, `chip(name)` shows a chip model, `validate(rows)` compares with measurements
/// and `measurements_from_trace(...)` reads them from an XProf / Perfetto trace. Masks may be JAX
/// Splash mask objects or NumPy arrays; block sizes a Splash `BlockSizes`.
#[pymodule]
#[pyo3(name = "_tpusim")]
fn tpusim_py(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("InputError", py.get_type::<InputError>())?;
    m.add("SimulationError", py.get_type::<SimulationError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<PyReport>()?;
    m.add_function(wrap_pyfunction!(simulate, m)?)?;
    m.add_function(wrap_pyfunction!(tune, m)?)?;
    m.add_function(wrap_pyfunction!(chip, m)?)?;
    m.add_function(wrap_pyfunction!(validate, m)?)?;
    m.add_function(wrap_pyfunction!(sweep, m)?)?;
    m.add_function(wrap_pyfunction!(measurements_from_trace, m)?)?;
    m.add_function(wrap_pyfunction!(trace_ops, m)?)?;
    m.add_function(wrap_pyfunction!(kernel_family, m)?)?;
    m.add_function(wrap_pyfunction!(family_word_rule, m)?)?;
    m.add_function(wrap_pyfunction!(mask_text, m)?)?;
    m.add_function(wrap_pyfunction!(tile_counts, m)?)?;
    m.add_function(wrap_pyfunction!(simulate_kernel_ir, m)?)?;
    m.add_function(wrap_pyfunction!(decode::decode_kernel_ir, m)?)?;
    m.add_function(wrap_pyfunction!(program::simulate_program_description, m)?)?;
    m.add_function(wrap_pyfunction!(check_outputs, m)?)?;
    m.add_function(wrap_pyfunction!(write_output, m)?)?;
    m.add_function(wrap_pyfunction!(mark_line, m)?)?;
    Ok(())
}
