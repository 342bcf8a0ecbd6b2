//! TPU chip models for tpusim.
//!
//! A [`ChipModel`] is one JAX device of a TPU chip as a Pallas kernel sees it: its TensorCores
//! (`[device]`: how many, their clock), each with matrix units (MXU), a vector unit (VPU), a
//! transcendental unit (EUP), cross-lane units (XLU) and on-chip memories (VMEM, SMEM), the HBM
//! they share, and the parameters that had to be fitted to measurements because they are not
//! public.
//!
//! Chip models are TOML files (see `models/README.md`). Every number is a [`Param`]: a value with
//! its unit in the field name and either a `source` (architectural parameters) or a `fitted_to`
//! list naming the measurement rows it was fitted to (parameters in the `[fitted]` table).
//! Unknown keys, missing sources and out-of-range values are errors ([`ChipError`]).
//!
//! Of the workspace it depends on `tpusim-io` alone (for the words of a TOML parse error,
//! `tpusim_io::plain_error`); it knows nothing of workloads, kernels or simulation.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::Path;

/// Names of the chip models built into the binary (from `models/*.toml`).
pub const PRESETS: &[&str] = &["v6e", "v5e", "v5p", "v4", "v7x"];

const PRESET_TEXT: &[(&str, &str)] = &[
    ("v6e", include_str!("../../../models/v6e.toml")),
    ("v5e", include_str!("../../../models/v5e.toml")),
    ("v5p", include_str!("../../../models/v5p.toml")),
    ("v4", include_str!("../../../models/v4.toml")),
    ("v7x", include_str!("../../../models/v7x.toml")),
];

/// An error in a chip model: where it is, what was wrong, and what is allowed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ChipError {
    /// The `--chip` argument named neither a preset nor a readable file.
    #[error("unknown chip '{name}': expected a preset ({presets}) or a path to a .toml chip model")]
    UnknownChip {
        /// What the user passed.
        name: String,
        /// The preset names, comma separated.
        presets: String,
    },
    /// The file could not be read.
    #[error("cannot read chip model {path}: {reason}")]
    Io {
        /// File path.
        path: String,
        /// The operating system's reason.
        reason: String,
    },
    /// The TOML is malformed or has unknown / missing keys.
    #[error("chip model {origin}: {message}")]
    Parse {
        /// File path or preset name.
        origin: String,
        /// The TOML parser's message (names the key and line).
        message: String,
    },
    /// A field has a value outside its allowed range, or lacks its source.
    #[error("chip model {origin}: field '{field}' = {value}: {allowed}")]
    Field {
        /// File path, preset name or `--set`.
        origin: String,
        /// Dotted field path, e.g. `mxu.count`.
        field: String,
        /// The offending value as written.
        value: String,
        /// What is allowed.
        allowed: String,
    },
}

/// One chip-model number: its value and where it comes from.
///
/// Architectural parameters carry `source` (a document, page or measurement). Fitted parameters
/// (only in [`Fitted`]) carry `fitted_to`, the ids of the calibration rows they were fitted to,
/// and a `note` on how; an empty `fitted_to` is allowed only with a `note` saying why (e.g. a
/// value carried over from another chip for lack of measurements).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Param<T> {
    /// The value, in the unit the field name states.
    pub value: T,
    /// Where an architectural value comes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Calibration rows a fitted value was fitted to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fitted_to: Option<Vec<String>>,
    /// Free-text remark (how a value was derived or fitted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Calibration rows an unfitted `[fitted]` value was checked against: a fit that freed it on
    /// these rows agreed with the value (the `note` gives the fit's value and interval). Only in
    /// `[fitted]`, only with an empty `fitted_to`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checked_against: Option<Vec<String>>,
}

impl<T> Param<T> {
    /// A parameter with a value and a source.
    pub fn sourced(value: T, source: &str) -> Self {
        Param { value, source: Some(source.to_string()), fitted_to: None, note: None, checked_against: None }
    }
}

/// Matrix units (systolic arrays).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mxu {
    /// Number of MXUs per TensorCore.
    pub count: Param<u32>,
    /// Systolic array rows (the contraction dimension of a weight tile).
    pub rows: Param<u32>,
    /// Systolic array columns (the output dimension of a weight tile).
    pub columns: Param<u32>,
    /// Array passes retired per cycle per MXU (1 on the 128x128 generations; 2 on v6e, whose
    /// matmul cadence is half v5e's and whose published peak needs it at 1.75 GHz).
    pub passes_per_cycle: Param<u32>,
    /// Cycles from a matmul's start to its result (the systolic pipeline depth), cycles.
    pub result_latency_cycles: Param<u32>,
    /// Rows per cycle a matmul whose operands are both int8 streams, against bf16's (XLA's
    /// cadences: an operation streams one register, 32 packed int8 rows against 16 of bf16). 1
    /// on a chip that runs int8 as bf16.
    pub int8_row_rate_vs_bf16: Param<f64>,
    /// The same for operands that are both fp8 (float8_e4m3fn or float8_e5m2).
    pub fp8_row_rate_vs_bf16: Param<f64>,
    /// Time to load a fold of int8 weights, against a fold of bf16 weights (XLA's latch cadences:
    /// one register per latch, holding twice as many 8-bit weights). 1 on a chip that runs int8
    /// as bf16.
    pub int8_fold_load_vs_bf16: Param<f64>,
    /// The same for fp8 weights.
    pub fp8_fold_load_vs_bf16: Param<f64>,
    /// Published peak bf16 dense matmul rate of the whole device (all its TensorCores), TFLOP/s
    /// (reference only: the simulator derives the peak from count x rows x columns x passes x
    /// clock x TensorCores so that what-if changes move it).
    pub published_peak_bf16_tflops: Param<f64>,
}

/// The JAX device: how many TensorCores it holds and their clock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Device {
    /// TensorCores per JAX device: 2 on the megacore chips (v4, v5p), whose Pallas kernels split
    /// the grid dimensions marked "parallel" across both; 1 otherwise.
    pub tensorcores: Param<u32>,
    /// Core clock, GHz.
    pub clock_ghz: Param<f64>,
}

/// Vector unit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Vpu {
    /// Sublanes of a vector register.
    pub sublanes: Param<u32>,
    /// Lanes of a vector register.
    pub lanes: Param<u32>,
    /// Latency of a simple f32 vector ALU op, cycles.
    pub alu_latency_cycles: Param<u32>,
}

/// Transcendental unit (exp, reciprocal).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Eup {
    /// Latency of one transcendental op, cycles.
    pub latency_cycles: Param<u32>,
}

/// Cross-lane unit (row reductions, permutes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Xlu {
    /// Number of XLUs per TensorCore.
    pub count: Param<u32>,
    /// Latency of one cross-lane op, cycles.
    pub latency_cycles: Param<u32>,
}

/// Vector memory (the on-chip scratchpad blocks live in).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Vmem {
    /// Physical VMEM per TensorCore, MiB.
    pub size_mib: Param<f64>,
    /// The compiler's default scoped VMEM limit for one kernel, MiB.
    pub scoped_limit_mib: Param<f64>,
}

/// Scalar memory (grid metadata, block indices).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Smem {
    /// SMEM per TensorCore, KiB.
    pub size_kib: Param<f64>,
}

/// High-bandwidth memory and the DMA engines that move blocks between it and VMEM.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hbm {
    /// Capacity of the device, GiB.
    pub capacity_gib: Param<f64>,
    /// Peak bandwidth of the device, GB/s (10^9 bytes per second).
    pub bandwidth_gb_per_s: Param<f64>,
    /// Sustained HBM <-> VMEM DMA bandwidth of one TensorCore, GB/s. TensorCores that stream at
    /// once share the device's peak: each gets at most peak / active cores.
    pub dma_bandwidth_gb_per_s: Param<f64>,
}

/// The inter-chip interconnect (ICI): the links that join the JAX devices of a slice into a mesh
/// or torus. Read only by multi-chip models (the layer workload's collectives); no kernel
/// simulation uses it.
///
/// A slice is a box of devices (`AxB` or `AxBxC`, at most `torus_dims` axes, at most
/// `pod_devices` devices). Neighbours along an axis are joined by one link per direction; an
/// axis has wraparound links (a ring rather than a line) when its length is a multiple of
/// `wraparound_axis_devices` (the static wraparound of v5e and v6e pods along a full pod axis),
/// or when every axis of the slice is a multiple of `wraparound_cube_devices` (the optical
/// circuit switches of v4, v5p and v7x close whole cubes into a torus). A value of 0 disables
/// that rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ici {
    /// ICI ports per device: one link per direction of each torus axis (2 x `torus_dims` used).
    pub ports: Param<u32>,
    /// Bandwidth of one link in one direction, GB/s (10^9 bytes per second).
    pub link_bandwidth_gb_per_s: Param<f64>,
    /// Fixed cost of one hop over a link, independent of the bytes, microseconds.
    pub hop_latency_us: Param<f64>,
    /// Axes of the torus (2 on v5e and v6e, 3 on v4, v5p and v7x).
    pub torus_dims: Param<u32>,
    /// Devices in the largest slice (a pod).
    pub pod_devices: Param<u32>,
    /// An axis whose length is a multiple of this has wraparound links (0: never by this rule).
    pub wraparound_axis_devices: Param<u32>,
    /// A slice whose every axis is a multiple of this has wraparound links on every axis (0:
    /// never by this rule).
    pub wraparound_cube_devices: Param<u32>,
}

/// The host that dispatches the device's work: what a host timer around a jitted call
/// (`jax.block_until_ready(f(x))`) sees beyond the device's time. A property of the host, its
/// runtime and the harness, not of the chip: each preset's value says which host it was derived
/// on. Read only by `--scope call`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Host {
    /// Host time of one jitted call's dispatch and synchronisation beyond the device time,
    /// microseconds.
    pub dispatch_us: Param<f64>,
}

/// Parameters that are not public and are fitted to measurements, each a physical rate or cost,
/// in two stages (`tpusim calibrate`): the step and DMA mechanisms (`dma_latency_ns`,
/// `dma_issue_ns`, `dmas_in_flight`, `grid_step_overhead_cycles`) from microbenchmark rows that
/// isolate them, then the unit rates (`valu_vreg_ops_per_cycle`, `eup_vregs_per_cycle`,
/// `xlu_cycles_per_vreg`, `loaded_mask_ops_per_vreg`) from a chip's library rows with the
/// mechanisms held; at most three per stage. A value not fitted says where it comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fitted {
    /// Vector ALU throughput: (8,128) f32 register operations retired per cycle.
    pub valu_vreg_ops_per_cycle: Param<f64>,
    /// Transcendental throughput: (8,128) registers of exp results per cycle.
    pub eup_vregs_per_cycle: Param<f64>,
    /// Cycles one XLU is busy with a cross-lane reduction of one (8,128) register.
    pub xlu_cycles_per_vreg: Param<f64>,
    /// VPU register operations to apply a loaded int8 mask block to one (8,128) register of
    /// scores (unpack the packed int8 rows, compare, select).
    pub loaded_mask_ops_per_vreg: Param<f64>,
    /// Fixed scalar-unit cost of one grid step (pipeline bookkeeping), cycles, beyond the issue
    /// of the step's copies (`dma_issue_ns` each).
    pub grid_step_overhead_cycles: Param<f64>,
    /// Latency of one HBM leg of a DMA, ns: from its issue until its data moves (an HBM read)
    /// or until its write lands (an HBM write). A pipeline step whose body is shorter pays it
    /// (its next inputs are not in yet); a copy from HBM to HBM pays two.
    pub dma_latency_ns: Param<f64>,
    /// Scalar-core time to issue one DMA (descriptor arithmetic and the issue), ns: every copy
    /// the pipeline makes around a step and every copy a kernel starts itself.
    pub dma_issue_ns: Param<f64>,
    /// DMAs one TensorCore keeps in flight at once (each holds its slot for its latency plus its
    /// bytes at `hbm.dma_bandwidth_gb_per_s`, so many small copies move at most this many per
    /// latency: Little's law).
    pub dmas_in_flight: Param<f64>,
}

/// One JAX device of a TPU chip, as a Pallas kernel sees it: its TensorCores (each with the
/// units and memories below) and the HBM they share.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChipModel {
    /// Short name, e.g. `v6e`.
    pub name: String,
    /// One line describing the chip.
    pub description: String,
    /// TensorCores per device and clock.
    pub device: Device,
    /// Matrix units (per TensorCore).
    pub mxu: Mxu,
    /// Vector unit.
    pub vpu: Vpu,
    /// Transcendental unit.
    pub eup: Eup,
    /// Cross-lane unit.
    pub xlu: Xlu,
    /// Vector memory.
    pub vmem: Vmem,
    /// Scalar memory.
    pub smem: Smem,
    /// HBM.
    pub hbm: Hbm,
    /// The inter-chip interconnect (multi-chip models only).
    pub ici: Ici,
    /// The host's per-call cost (`--scope call` only).
    pub host: Host,
    /// Parameters fitted to measurements.
    pub fitted: Fitted,
    /// Where the model was read from and the overrides applied since (not part of the file; two
    /// models with equal parameters compare equal whatever their provenance).
    #[serde(skip)]
    pub provenance: Provenance,
}

/// Where a chip model came from: the preset or file it was read from and the `--set` overrides
/// applied to it since, in order. Set by [`ChipModel::preset`], [`ChipModel::load`],
/// [`ChipModel::from_toml_str`] and [`ChipModel::with_override`]; reported by
/// [`ChipModel::identity`].
///
/// Provenance takes no part in equality (`==` is always true between two provenances), so a
/// model compares equal to its own copy read back from a file.
#[derive(Debug, Clone, Default)]
pub struct Provenance {
    /// `preset` for a built-in model, else the path of the chip TOML as given (or the label a
    /// caller of [`ChipModel::from_toml_str`] gave).
    pub source: String,
    /// `--set` overrides applied, in order, as `SECTION.FIELD=VALUE` with the value as typed.
    pub overrides: Vec<String>,
    /// The model as read, before any override: the chip a kernel's code was compiled for. A
    /// what-if model ([`ChipModel::with_override`]) runs that chip's compiled code (the order in
    /// which each grid step issues its operations) at its own unit speeds, so making a unit
    /// faster never makes a run slower. `None` for a model without overrides.
    pub compiled_for: Option<std::sync::Arc<ChipModel>>,
}

impl PartialEq for Provenance {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// Which chip model produced a result: what every report (`run`, sweep rows, `tune`,
/// `validate`, `calibrate`) names, so that runs on different models can be told apart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChipIdentity {
    /// The model's `name`, e.g. `v6e` (a calibrated file keeps its starting model's name).
    pub name: String,
    /// `preset` for a built-in model, else the path of the chip TOML as given.
    pub source: String,
    /// The `--set` overrides applied, in order (`SECTION.FIELD=VALUE`).
    pub overrides: Vec<String>,
    /// [`ChipModel::parameter_hash`]: 12 hex digits that change with any parameter's value and
    /// with nothing else (names, descriptions and sources do not enter it).
    pub hash: String,
}

impl fmt::Display for ChipIdentity {
    /// `v6e (preset; parameters 1a2b3c4d5e6f)`, or with a file and overrides
    /// `v6e (my-fit.toml, --set hbm.bandwidth_gb_per_s=3276; parameters 9f8e7d6c5b4a)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}", self.name, if self.source.is_empty() { "unknown source" } else { &self.source })?;
        for o in &self.overrides {
            write!(f, ", --set {o}")?;
        }
        write!(f, "; parameters {})", self.hash)
    }
}

/// The tables of a chip model file, in [`ChipModel`]'s order.
const TABLES: &[&str] = &["device", "mxu", "vpu", "eup", "xlu", "vmem", "smem", "hbm", "ici", "host", "fitted"];

impl ChipModel {
    /// Parses and validates a chip model from TOML text. `origin` names the file in errors.
    ///
    /// # Errors
    /// [`ChipError::Parse`] for malformed TOML, unknown or missing keys; [`ChipError::Field`] for
    /// out-of-range values or parameters without a source.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Self, ChipError> {
        // Errors name the file's key (`mxu.count`), the value and the rule in words.
        let mut chip: ChipModel = serde_path_to_error::deserialize(toml::Deserializer::new(text)).map_err(|e| {
            let path = e.path().to_string();
            let message = if path.is_empty() || path == "." {
                // A missing top-level table or key reads as serde's "missing field" at line 1.
                match e.inner().message().strip_prefix("missing field `").and_then(|m| m.strip_suffix('`')) {
                    Some(k) if TABLES.contains(&k) => format!(
                        "missing table [{k}]: a chip model has the tables {} (their fields: models/README.md)",
                        TABLES.iter().map(|t| format!("[{t}]")).collect::<Vec<_>>().join(", ")
                    ),
                    Some(k) => format!("missing key '{k}' at the top of the file (a chip model starts with name = \"...\" and description = \"...\")"),
                    None => one_line(&e.inner().to_string()),
                }
            } else {
                let key = path.strip_suffix(".value").unwrap_or(&path);
                let plain = tpusim_io::plain_error(key, e.inner().message());
                // A value of the wrong type quotes the field's own rule, not its type's range.
                match (plain.split_once(": expected "), path.ends_with(".value").then(|| ChipModel::rule_of(key)).flatten()) {
                    (Some((head, _)), Some(rule)) => format!("{head}: {rule}"),
                    _ => plain,
                }
            };
            ChipError::Parse { origin: origin.to_string(), message }
        })?;
        chip.validate(origin)?;
        chip.provenance = Provenance { source: origin.to_string(), overrides: Vec::new(), compiled_for: None };
        Ok(chip)
    }

    /// A built-in chip model by preset name (`v6e`, `v5e`, `v5p`, `v4`, `v7x`).
    ///
    /// # Errors
    /// [`ChipError::UnknownChip`] if the name is not a preset.
    pub fn preset(name: &str) -> Result<Self, ChipError> {
        // Each preset is parsed once per process (its TOML, notes and row lists included, is most
        // of a short run's time otherwise: a run, its what-if table and its shipped measurement
        // each ask for it).
        static PARSED: std::sync::OnceLock<std::sync::Mutex<Vec<(String, ChipModel)>>> = std::sync::OnceLock::new();
        let cache = PARSED.get_or_init(Default::default);
        if let Some((_, c)) = cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter().find(|(n, _)| n == name) {
            return Ok(c.clone());
        }
        let text = PRESET_TEXT
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, t)| *t)
            .ok_or_else(|| ChipError::UnknownChip { name: name.to_string(), presets: PRESETS.join(", ") })?;
        let mut chip = Self::from_toml_str(text, &format!("preset {name}"))?;
        chip.provenance.source = "preset".to_string();
        cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((name.to_string(), chip.clone()));
        Ok(chip)
    }

    /// Loads a chip by preset name or, if `spec` ends in `.toml` or names an existing file, by path.
    ///
    /// # Errors
    /// As [`ChipModel::preset`] and [`ChipModel::from_toml_str`], plus [`ChipError::Io`].
    pub fn load(spec: &str) -> Result<Self, ChipError> {
        if PRESETS.contains(&spec) {
            return Self::preset(spec);
        }
        let path = Path::new(spec);
        if spec.ends_with(".toml") || path.exists() {
            let text = tpusim_io::read_text(path).map_err(|e| ChipError::Io { path: spec.to_string(), reason: e.to_string() })?;
            return Self::from_toml_str(&text, spec);
        }
        Err(ChipError::UnknownChip { name: spec.to_string(), presets: PRESETS.join(", ") })
    }

    /// Returns a copy with one field's value replaced: `key` is a dotted path such as
    /// `hbm.bandwidth_gb_per_s` or `device.clock_ghz`, `value` is parsed as that field's type.
    /// The result is validated like a TOML file. `hbm.bandwidth_gb_per_s` (the HBM's peak) moves
    /// `hbm.dma_bandwidth_gb_per_s` (the sustained HBM-to-VMEM rate) by the same ratio unless
    /// an earlier override set that rate: copies run at the lower of the two.
    ///
    /// # Errors
    /// [`ChipError::Field`] naming the key if it does not exist or the value has the wrong type
    /// or range.
    pub fn with_override(&self, key: &str, value: &str) -> Result<Self, ChipError> {
        let origin = "--set";
        let bad =
            |allowed: String| ChipError::Field { origin: origin.to_string(), field: key.to_string(), value: value.to_string(), allowed };
        let mut doc = toml::Value::try_from(self).map_err(|e| bad(e.to_string()))?;
        let mut parts = key.split('.');
        let (section, field) = match (parts.next(), parts.next(), parts.next()) {
            (Some(s), Some(f), None) => (s, f),
            _ => return Err(bad("expected SECTION.FIELD, e.g. hbm.bandwidth_gb_per_s".into())),
        };
        let known_fields = |t: &toml::value::Table| t.keys().cloned().collect::<Vec<_>>().join(", ");
        let table = doc.as_table_mut().expect("a chip model serialises to a table");
        let sections: Vec<String> = table.iter().filter(|(_, v)| v.is_table()).map(|(k, _)| k.clone()).collect();
        let sec = table
            .get_mut(section)
            .and_then(|v| v.as_table_mut())
            .ok_or_else(|| bad(format!("unknown section '{section}'; sections are {}", sections.join(", "))))?;
        let listing = known_fields(sec);
        let param = sec
            .get_mut(field)
            .and_then(|v| v.as_table_mut())
            .ok_or_else(|| bad(format!("unknown field '{field}' in [{section}]; fields are {listing}")))?;
        let old = param.get("value").cloned().expect("every parameter has a value");
        let new = match old {
            // A whole number outside u32 is clamped into it, so that the range check below
            // states the field's own range (with the value as typed).
            toml::Value::Integer(_) => value
                .trim()
                .parse::<i128>()
                .map(|i| toml::Value::Integer(i.clamp(0, u32::MAX as i128) as i64))
                .map_err(|_| bad(ChipModel::rule_of(key.trim()).unwrap_or_else(|| "expected a whole number".into())))?,
            toml::Value::Float(_) => value
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite())
                .map(toml::Value::Float)
                .ok_or_else(|| bad(ChipModel::rule_of(key.trim()).unwrap_or_else(|| "expected a finite number".into())))?,
            _ => return Err(bad("this field cannot be overridden".into())),
        };
        param.insert("value".into(), new);
        param.insert("note".into(), toml::Value::String(format!("overridden with --set {key}={value}")));
        let mut chip: ChipModel = doc.try_into().map_err(|e: toml::de::Error| bad(one_line(&e.to_string())))?;
        // A faster (or slower) HBM moves its sustained HBM-to-VMEM rate with it: unless an
        // override of its own set that rate, it keeps its share of the peak (a kernel's copies
        // run at the lower of the two, so the peak alone would change nothing above the rate).
        let dma_key = "hbm.dma_bandwidth_gb_per_s";
        if key.trim() == "hbm.bandwidth_gb_per_s" && !self.provenance.overrides.iter().any(|o| o.split('=').next() == Some(dma_key)) {
            let ratio = chip.hbm.bandwidth_gb_per_s.value / self.hbm.bandwidth_gb_per_s.value;
            chip.hbm.dma_bandwidth_gb_per_s.value = self.hbm.dma_bandwidth_gb_per_s.value * ratio;
            chip.hbm.dma_bandwidth_gb_per_s.note =
                Some(format!("scaled with --set {key}={value} (its share of the peak kept; set {dma_key} to choose it)"));
        }
        chip.validate(origin).map_err(|e| match e {
            // Name the value as the user typed it, not as it was parsed.
            ChipError::Field { origin, field, allowed, .. } if field == key => {
                ChipError::Field { origin, field, value: value.trim().to_string(), allowed }
            }
            // The sustained rate this override scaled: say so, and what the peak may be.
            ChipError::Field { origin, field, value: v, allowed } if field == dma_key && key.trim() == "hbm.bandwidth_gb_per_s" => {
                ChipError::Field {
                    origin,
                    field: key.trim().to_string(),
                    value: value.trim().to_string(),
                    allowed: format!(
                        "it scales {dma_key} (its share of the peak kept) to {v}, which must be {}; set both to choose each",
                        allowed.strip_prefix("expected ").unwrap_or(&allowed)
                    ),
                }
            }
            other => other,
        })?;
        chip.provenance = self.provenance.clone();
        chip.provenance.overrides.push(format!("{key}={}", value.trim()));
        if chip.provenance.compiled_for.is_none() {
            chip.provenance.compiled_for = Some(std::sync::Arc::new(self.clone()));
        }
        // The description states the model as read (its figures are the file's): it says which
        // overrides changed it since.
        let base = chip.provenance.compiled_for.as_ref().map_or_else(|| self.description.clone(), |c| c.description.clone());
        chip.description = format!("{base}; what-if: --set {}", chip.provenance.overrides.join(" --set "));
        Ok(chip)
    }

    /// Which model this is: name, source, overrides and [`ChipModel::parameter_hash`].
    pub fn identity(&self) -> ChipIdentity {
        ChipIdentity {
            name: self.name.clone(),
            source: self.provenance.source.clone(),
            overrides: self.provenance.overrides.clone(),
            hash: self.parameter_hash(),
        }
    }

    /// A short stable hash of the effective parameters: 12 hex digits of the 64-bit FNV-1a hash
    /// (crate `fnv`) of one line `SECTION.FIELD=VALUE` per parameter, in file order, values in
    /// Rust's shortest round-trip form. Equal for models that simulate alike whatever their
    /// names, descriptions, sources and provenance; different when any value differs.
    pub fn parameter_hash(&self) -> String {
        use std::hash::Hasher;
        let doc = toml::Value::try_from(self).expect("a chip model serialises");
        let mut h = fnv::FnvHasher::default();
        for (sec, v) in doc.as_table().expect("a chip model serialises to a table") {
            let Some(t) = v.as_table() else { continue };
            for (field, p) in t {
                let value = match p.get("value") {
                    Some(toml::Value::Float(f)) => format!("{f}"),
                    Some(toml::Value::Integer(i)) => format!("{i}"),
                    Some(other) => other.to_string(),
                    None => continue,
                };
                h.write(format!("{sec}.{field}={value}\n").as_bytes());
            }
        }
        format!("{:016x}", h.finish())[..12].to_string()
    }

    /// Checks ranges and provenance of every field.
    ///
    /// # Errors
    /// [`ChipError::Field`] for the first offending field.
    pub fn validate(&self, origin: &str) -> Result<(), ChipError> {
        let mut v = Validator { origin, err: None, rule_of: None };
        self.check(&mut v);
        match v.err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// What a field of a chip TOML allows, in words (`mxu.count`: "expected a whole number from
    /// 1 to 64"), as [`ChipModel::validate`] checks it; `None` for a key it has no range for.
    /// A value of the wrong type (`mxu.count = 2.5`, `"many"`) is refused quoting this rule
    /// rather than the range of the type that holds it.
    pub fn rule_of(field: &str) -> Option<String> {
        let chip = ChipModel::preset("v6e").ok()?;
        let mut v = Validator { origin: "", err: None, rule_of: Some((field, None)) };
        chip.check(&mut v);
        v.rule_of.and_then(|r| r.1)
    }

    /// Every field's check, in the file's order (the first failure is kept).
    fn check(&self, v: &mut Validator<'_>) {
        // The name labels reports, sweep rows and plots: a word, not empty.
        let n = &self.name;
        let name_ok = !n.is_empty() && n.len() <= 64 && n.chars().all(|c| c.is_ascii_alphanumeric() || "._+-".contains(c));
        v.range("name", name_ok, format!("{n:?}"), || "expected 1 to 64 letters, digits, '.', '_', '+' or '-' (the chip's label in reports)".into());
        v.count("device.tensorcores", &self.device.tensorcores, 1, 8);
        v.pos("device.clock_ghz", &self.device.clock_ghz, 1e-3, 100.0);
        v.count("mxu.count", &self.mxu.count, 1, 64);
        v.count("mxu.rows", &self.mxu.rows, 8, 4096);
        v.count("mxu.columns", &self.mxu.columns, 8, 4096);
        v.count("mxu.passes_per_cycle", &self.mxu.passes_per_cycle, 1, 16);
        v.count("mxu.result_latency_cycles", &self.mxu.result_latency_cycles, 1, 100_000);
        v.pos("mxu.int8_row_rate_vs_bf16", &self.mxu.int8_row_rate_vs_bf16, 1e-3, 1e3);
        v.pos("mxu.fp8_row_rate_vs_bf16", &self.mxu.fp8_row_rate_vs_bf16, 1e-3, 1e3);
        v.pos("mxu.int8_fold_load_vs_bf16", &self.mxu.int8_fold_load_vs_bf16, 1e-3, 1e3);
        v.pos("mxu.fp8_fold_load_vs_bf16", &self.mxu.fp8_fold_load_vs_bf16, 1e-3, 1e3);
        v.pos("mxu.published_peak_bf16_tflops", &self.mxu.published_peak_bf16_tflops, 1e-3, 1e6);
        v.count("vpu.sublanes", &self.vpu.sublanes, 1, 1024);
        v.count("vpu.lanes", &self.vpu.lanes, 1, 8192);
        for (key, p) in [("vpu.sublanes", &self.vpu.sublanes), ("vpu.lanes", &self.vpu.lanes)] {
            if p.value > 0 && !p.value.is_power_of_two() {
                v.fail(
                    key,
                    p.value,
                    "must be a power of two (1, 2, 4, ...): a vector register is a (sublanes, lanes) tile that Mosaic's layouts halve and pack (8 x 128 on every TPU so far)",
                );
            }
        }
        v.count("vpu.alu_latency_cycles", &self.vpu.alu_latency_cycles, 1, 10_000);
        v.count("eup.latency_cycles", &self.eup.latency_cycles, 1, 10_000);
        v.count("xlu.count", &self.xlu.count, 1, 64);
        v.count("xlu.latency_cycles", &self.xlu.latency_cycles, 1, 100_000);
        v.pos("vmem.size_mib", &self.vmem.size_mib, 1e-3, 1e6);
        v.pos("vmem.scoped_limit_mib", &self.vmem.scoped_limit_mib, 1e-3, 1e6);
        if self.vmem.scoped_limit_mib.value > self.vmem.size_mib.value {
            v.fail(
                "vmem.scoped_limit_mib",
                format_number(self.vmem.scoped_limit_mib.value),
                &format!(
                    "must not exceed vmem.size_mib ({0}): a smaller VMEM needs a scoped limit that fits in it too (e.g. --set vmem.scoped_limit_mib={0})",
                    format_number(self.vmem.size_mib.value)
                ),
            );
        }
        v.pos("smem.size_kib", &self.smem.size_kib, 1e-3, 1e9);
        v.pos("hbm.capacity_gib", &self.hbm.capacity_gib, 1e-3, 1e6);
        v.pos("hbm.bandwidth_gb_per_s", &self.hbm.bandwidth_gb_per_s, 1e-3, 1e7);
        v.pos("hbm.dma_bandwidth_gb_per_s", &self.hbm.dma_bandwidth_gb_per_s, 1e-3, 1e7);
        v.count("ici.torus_dims", &self.ici.torus_dims, 1, 3);
        v.count("ici.ports", &self.ici.ports, 2, 64);
        if self.ici.ports.value < 2 * self.ici.torus_dims.value {
            v.fail(
                "ici.ports",
                self.ici.ports.value,
                &format!(
                    "a torus of {} axes needs at least {} ports (one per direction per axis)",
                    self.ici.torus_dims.value,
                    2 * self.ici.torus_dims.value
                ),
            );
        }
        v.pos("ici.link_bandwidth_gb_per_s", &self.ici.link_bandwidth_gb_per_s, 1e-3, 1e7);
        v.nonneg("ici.hop_latency_us", &self.ici.hop_latency_us, 1e6);
        v.count("ici.pod_devices", &self.ici.pod_devices, 1, 1 << 20);
        v.count("ici.wraparound_axis_devices", &self.ici.wraparound_axis_devices, 0, 1 << 20);
        v.count("ici.wraparound_cube_devices", &self.ici.wraparound_cube_devices, 0, 1 << 20);
        v.nonneg("host.dispatch_us", &self.host.dispatch_us, 1e6);
        v.fit("fitted.valu_vreg_ops_per_cycle", &self.fitted.valu_vreg_ops_per_cycle, 1e-3, 64.0);
        v.fit("fitted.eup_vregs_per_cycle", &self.fitted.eup_vregs_per_cycle, 1e-3, 64.0);
        v.fit("fitted.xlu_cycles_per_vreg", &self.fitted.xlu_cycles_per_vreg, 1e-3, 1e4);
        v.fit("fitted.loaded_mask_ops_per_vreg", &self.fitted.loaded_mask_ops_per_vreg, 1e-3, 1e3);
        v.fit_nonneg("fitted.grid_step_overhead_cycles", &self.fitted.grid_step_overhead_cycles, 1e7);
        v.fit_nonneg("fitted.dma_latency_ns", &self.fitted.dma_latency_ns, 1e6);
        v.fit_nonneg("fitted.dma_issue_ns", &self.fitted.dma_issue_ns, 1e6);
        v.fit("fitted.dmas_in_flight", &self.fitted.dmas_in_flight, 1.0, 1e6);
    }

    /// Clock frequency, Hz.
    pub fn clock_hz(&self) -> f64 {
        self.device.clock_ghz.value * 1e9
    }

    /// TensorCores per device.
    pub fn tensorcores(&self) -> u32 {
        self.device.tensorcores.value
    }

    /// Elements in one vector register (sublanes x lanes; 1024 on every TPU so far).
    pub fn vreg_elems(&self) -> f64 {
        (self.vpu.sublanes.value * self.vpu.lanes.value) as f64
    }

    /// Weight arrays that stream concurrently in one TensorCore: MXU count x passes per cycle.
    pub fn mxu_arrays(&self) -> f64 {
        (self.mxu.count.value * self.mxu.passes_per_cycle.value) as f64
    }

    /// Peak bf16 matmul rate of one TensorCore, FLOP/s: 2 x count x rows x columns x passes x clock.
    pub fn peak_flops_per_core(&self) -> f64 {
        2.0 * self.mxu_arrays() * (self.mxu.rows.value as f64) * (self.mxu.columns.value as f64) * self.clock_hz()
    }

    /// Peak bf16 matmul rate of the device (all its TensorCores), FLOP/s.
    pub fn peak_flops(&self) -> f64 {
        self.peak_flops_per_core() * self.tensorcores() as f64
    }

    /// Sustained DMA bandwidth of one TensorCore when `active` TensorCores stream at once, bytes
    /// per cycle: the per-core DMA rate, capped by an equal share of the device's peak.
    pub fn dma_bytes_per_cycle(&self, active: u32) -> f64 {
        let per_core = self.hbm.dma_bandwidth_gb_per_s.value;
        let share = self.hbm.bandwidth_gb_per_s.value / active.max(1) as f64;
        per_core.min(share) * 1e9 / self.clock_hz()
    }

    /// Sustained HBM bandwidth of one streaming TensorCore, bytes per cycle
    /// ([`ChipModel::dma_bytes_per_cycle`] with one core active).
    pub fn hbm_bytes_per_cycle(&self) -> f64 {
        self.dma_bytes_per_cycle(1)
    }

    /// Sustained HBM bandwidth of the whole device, GB/s (every TensorCore streaming).
    pub fn sustained_hbm_gb_per_s(&self) -> f64 {
        self.dma_bytes_per_cycle(self.tensorcores()) * self.tensorcores() as f64 * self.clock_hz() / 1e9
    }

    /// Latency of one HBM leg of a DMA (a read or a write), cycles (`fitted.dma_latency_ns`).
    pub fn dma_latency_cycles(&self) -> f64 {
        self.fitted.dma_latency_ns.value * 1e-9 * self.clock_hz()
    }

    /// Scalar-core time to issue one DMA, cycles (`fitted.dma_issue_ns`).
    pub fn dma_issue_cycles(&self) -> f64 {
        self.fitted.dma_issue_ns.value * 1e-9 * self.clock_hz()
    }

    /// HBM capacity of the device, bytes.
    pub fn hbm_capacity_bytes(&self) -> u64 {
        (self.hbm.capacity_gib.value * 1024.0 * 1024.0 * 1024.0) as u64
    }

    /// SMEM per TensorCore, bytes.
    pub fn smem_bytes(&self) -> u64 {
        (self.smem.size_kib.value * 1024.0) as u64
    }

    /// Scoped VMEM limit, bytes.
    pub fn vmem_limit_bytes(&self) -> u64 {
        (self.vmem.scoped_limit_mib.value * 1024.0 * 1024.0) as u64
    }

    /// Physical VMEM, bytes.
    pub fn vmem_size_bytes(&self) -> u64 {
        (self.vmem.size_mib.value * 1024.0 * 1024.0) as u64
    }

    /// One ICI link's bandwidth in one direction, bytes per second.
    pub fn ici_link_bytes_per_s(&self) -> f64 {
        self.ici.link_bandwidth_gb_per_s.value * 1e9
    }

    /// The fixed cost of one ICI hop, seconds.
    pub fn ici_hop_latency_s(&self) -> f64 {
        self.ici.hop_latency_us.value * 1e-6
    }

    /// The host's dispatch-and-sync time of one jitted call, seconds.
    pub fn host_dispatch_s(&self) -> f64 {
        self.host.dispatch_us.value * 1e-6
    }

    /// The names of the model's sections (`mxu`, `vpu`, ..., `fitted`), in file order.
    pub fn sections(&self) -> Vec<String> {
        let doc = toml::Value::try_from(self).expect("a chip model serialises");
        doc.as_table().map(|t| t.iter().filter(|(_, v)| v.is_table()).map(|(k, _)| k.clone()).collect()).unwrap_or_default()
    }

    /// Every parameter as (dotted field, value, unit, provenance), in file order, for display.
    pub fn rows(&self) -> Vec<ParamRow> {
        let mut out = Vec::new();
        let doc = toml::Value::try_from(self).expect("a chip model serialises");
        for (sec, v) in doc.as_table().expect("table") {
            let Some(t) = v.as_table() else { continue };
            for (field, p) in t {
                let Some(p) = p.as_table() else { continue };
                let value = match p.get("value") {
                    Some(toml::Value::Float(f)) => format!("{f}"),
                    Some(other) => other.to_string(),
                    None => continue,
                };
                let provenance = if let Some(rows) = p.get("fitted_to").and_then(|r| r.as_array()) {
                    let ids: Vec<String> = rows.iter().filter_map(|r| r.as_str().map(String::from)).collect();
                    let checked: Vec<String> = p
                        .get("checked_against")
                        .and_then(|r| r.as_array())
                        .map(|r| r.iter().filter_map(|x| x.as_str().map(String::from)).collect())
                        .unwrap_or_default();
                    let mut s = if ids.is_empty() && !checked.is_empty() {
                        format!("NOT FITTED, checked against [{}]", checked.join(", "))
                    } else if ids.is_empty() {
                        "NOT FITTED to this chip's rows".to_string()
                    } else {
                        format!("FITTED to [{}]", ids.join(", "))
                    };
                    if let Some(n) = p.get("note").and_then(|n| n.as_str()) {
                        s.push_str("; ");
                        s.push_str(n);
                    }
                    s
                } else {
                    let mut s = p.get("source").and_then(|s| s.as_str()).unwrap_or("").to_string();
                    if let Some(n) = p.get("note").and_then(|n| n.as_str()) {
                        s.push_str("; ");
                        s.push_str(n);
                    }
                    s
                };
                out.push(ParamRow { field: format!("{sec}.{field}"), value, unit: unit_of(field), provenance });
            }
        }
        out
    }
}

/// One parameter for display by `tpusim chip show`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ParamRow {
    /// Dotted field path.
    pub field: String,
    /// Value as text.
    pub value: String,
    /// Unit, read off the field name's suffix.
    pub unit: &'static str,
    /// Source, or the rows it was fitted to.
    pub provenance: String,
}

/// The unit a field name states by its suffix.
pub fn unit_of(field: &str) -> &'static str {
    const SUFFIXES: &[(&str, &str)] = &[
        ("_ghz", "GHz"),
        ("_tflops", "TFLOP/s"),
        ("_gb_per_s", "GB/s"),
        ("_mib", "MiB"),
        ("_kib", "KiB"),
        ("_gib", "GiB"),
        ("_ns", "ns"),
        ("_us", "µs"),
        ("_devices", "devices"),
        ("_cycles", "cycles"),
        ("_per_cycle", "per cycle"),
        ("_ops_per_vreg", "operations per (8,128) register"),
        ("_per_vreg", "cycles per (8,128) register"),
    ];
    SUFFIXES.iter().find(|(s, _)| field.ends_with(s)).map(|(_, u)| *u).unwrap_or("count")
}

/// A number for messages: as written (shortest round-trip form) from 0.001 up to 10^7, in
/// scientific notation outside that (`1e300`, `2.5e-9`), so an absurd value prints in a few
/// characters.
pub fn format_number(x: f64) -> String {
    if x == 0.0 || !x.is_finite() || (1e-3..1e7).contains(&x.abs()) {
        format!("{x}")
    } else {
        format!("{x:e}")
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

struct Validator<'a> {
    origin: &'a str,
    err: Option<ChipError>,
    /// A field whose rule is wanted ([`ChipModel::rule_of`]): its rule in words once checked;
    /// nothing fails meanwhile.
    rule_of: Option<(&'a str, Option<String>)>,
}

impl Validator<'_> {
    fn fail(&mut self, field: &str, value: impl fmt::Display, allowed: &str) {
        if self.err.is_none() {
            self.err = Some(ChipError::Field {
                origin: self.origin.to_string(),
                field: field.to_string(),
                value: value.to_string(),
                allowed: allowed.to_string(),
            });
        }
    }
    fn sourced<T: fmt::Display>(&mut self, field: &str, p: &Param<T>) {
        let ok = p.source.as_deref().is_some_and(|s| !s.trim().is_empty());
        if !ok {
            self.fail(field, &p.value, "an architectural parameter needs a non-empty `source`");
        }
        if p.fitted_to.is_some() {
            self.fail(field, &p.value, "`fitted_to` belongs only to parameters in [fitted]");
        }
        if p.checked_against.is_some() {
            self.fail(field, &p.value, "`checked_against` belongs only to parameters in [fitted]");
        }
    }
    /// A range check: fails with `allowed` unless `ok`, or records `allowed` when it is the
    /// wanted rule.
    fn range(&mut self, field: &str, ok: bool, value: impl fmt::Display, allowed: impl FnOnce() -> String) {
        if let Some((want, rule)) = &mut self.rule_of {
            if *want == field {
                *rule = Some(allowed());
            }
        } else if !ok {
            self.fail(field, value, &allowed());
        }
    }
    fn count(&mut self, field: &str, p: &Param<u32>, lo: u32, hi: u32) {
        self.sourced(field, p);
        self.range(field, p.value >= lo && p.value <= hi, p.value, || format!("expected a whole number from {lo} to {hi}"));
    }
    fn pos(&mut self, field: &str, p: &Param<f64>, lo: f64, hi: f64) {
        self.sourced(field, p);
        self.number(field, p.value, lo, hi);
    }
    /// A number from `lo` to `hi`.
    fn number(&mut self, field: &str, value: f64, lo: f64, hi: f64) {
        let ok = value.is_finite() && value >= lo && value <= hi;
        self.range(field, ok, format_number(value), || format!("expected a number from {} to {}", format_number(lo), format_number(hi)));
    }
    fn fitted_provenance(&mut self, field: &str, p: &Param<f64>) {
        match &p.fitted_to {
            None => self.fail(field, p.value, "a fitted parameter needs `fitted_to` (calibration row ids)"),
            Some(rows) if rows.is_empty() && p.note.as_deref().is_none_or(|n| n.trim().is_empty()) => {
                self.fail(field, p.value, "an empty `fitted_to` needs a `note` saying where the value comes from")
            }
            _ => {}
        }
        if p.checked_against.is_some() && p.fitted_to.as_ref().is_some_and(|r| !r.is_empty()) {
            self.fail(
                field,
                p.value,
                "`checked_against` is for a value not fitted (an empty `fitted_to`); a fitted value lists its rows in `fitted_to`",
            );
        }
    }
    fn fit(&mut self, field: &str, p: &Param<f64>, lo: f64, hi: f64) {
        self.fitted_provenance(field, p);
        self.number(field, p.value, lo, hi);
    }
    fn nonneg(&mut self, field: &str, p: &Param<f64>, hi: f64) {
        self.sourced(field, p);
        self.number(field, p.value, 0.0, hi);
    }
    fn fit_nonneg(&mut self, field: &str, p: &Param<f64>, hi: f64) {
        self.fitted_provenance(field, p);
        self.number(field, p.value, 0.0, hi);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value of the wrong type, or beyond its type's range, is refused with the field's own
    /// rule (the validator's), not the range of a u32.
    #[test]
    fn a_value_of_the_wrong_type_quotes_the_fields_rule() {
        let text = include_str!("../../../models/v6e.toml");
        let line = text.lines().find(|l| l.starts_with("count = { value = 2,")).expect("the MXU count line");
        for (bad, shown) in [("2.5", "2.5"), ("\"many\"", "\"many\""), ("-2", "-2"), ("99999999999", "99999999999")] {
            let edited = text.replacen(line, &line.replacen("value = 2,", &format!("value = {bad},"), 1), 1);
            let err = ChipModel::from_toml_str(&edited, "edited.toml").unwrap_err().to_string();
            assert!(err.contains(&format!("mxu.count = {shown}: expected a whole number from 1 to 64")), "{bad}: {err}");
        }
        let clock = text.lines().find(|l| l.starts_with("clock_ghz = ")).expect("the clock line");
        let edited = text.replacen(clock, &clock.replacen("value = 1.75", "value = \"fast\"", 1), 1);
        let err = ChipModel::from_toml_str(&edited, "edited.toml").unwrap_err().to_string();
        assert!(err.contains("device.clock_ghz = \"fast\": expected a number from 0.001 to 100"), "{err}");
        assert_eq!(ChipModel::rule_of("no.such_field"), None);
        // The chip's name labels reports: an empty one or one with spaces is refused.
        for bad in ["", "my chip"] {
            let edited = text.replacen("name = \"v6e\"", &format!("name = {bad:?}"), 1);
            let err = ChipModel::from_toml_str(&edited, "edited.toml").unwrap_err().to_string();
            assert!(err.contains(&format!("'name' = {bad:?}: expected 1 to 64 letters")), "{bad:?}: {err}");
        }
        // `--set` overrides say the same.
        let v6e = ChipModel::preset("v6e").unwrap();
        for (key, bad, rule) in [("mxu.count", "2.5", "from 1 to 64"), ("mxu.count", "many", "from 1 to 64"), ("device.clock_ghz", "fast", "from 0.001 to 100")] {
            let err = v6e.with_override(key, bad).unwrap_err().to_string();
            assert!(err.contains(key) && err.contains(bad) && err.contains(rule), "{key}={bad}: {err}");
        }
    }

    /// A missing table, or a missing top-level key, is named (serde says "missing field" at
    /// line 1, quoting the file's first line).
    #[test]
    fn a_missing_table_is_named_with_the_tables_a_model_has() {
        let text = include_str!("../../../models/v6e.toml");
        let (start, end) = (text.find("\n[ici]").expect("[ici]"), text.find("\n[host]").expect("[host]"));
        let no_ici = format!("{}{}", &text[..start], &text[end..]);
        let err = ChipModel::from_toml_str(&no_ici, "edited.toml").unwrap_err().to_string();
        assert!(err.contains("missing table [ici]") && err.contains("[device], [mxu]") && err.contains("[fitted]"), "{err}");
        assert!(!err.contains("line 1"), "{err}");
        let no_name = text.replacen("name = \"v6e\"\n", "", 1);
        let err = ChipModel::from_toml_str(&no_name, "edited.toml").unwrap_err().to_string();
        assert!(err.contains("missing key 'name' at the top of the file"), "{err}");
    }

    #[test]
    fn a_faster_hbm_moves_its_sustained_rate_unless_that_was_set() {
        let v6e = ChipModel::preset("v6e").unwrap();
        let (bw, dma) = (v6e.hbm.bandwidth_gb_per_s.value, v6e.hbm.dma_bandwidth_gb_per_s.value);
        let fast = v6e.with_override("hbm.bandwidth_gb_per_s", &format!("{}", 2.0 * bw)).unwrap();
        assert!((fast.hbm.dma_bandwidth_gb_per_s.value - 2.0 * dma).abs() < 1e-9);
        assert!((fast.hbm_bytes_per_cycle() / v6e.hbm_bytes_per_cycle() - 2.0).abs() < 1e-12);
        // A rate set by its own override stays as set, before or after the peak's.
        let set = v6e.with_override("hbm.dma_bandwidth_gb_per_s", "1000").unwrap().with_override("hbm.bandwidth_gb_per_s", "3000").unwrap();
        assert_eq!(set.hbm.dma_bandwidth_gb_per_s.value, 1000.0);
        let after =
            v6e.with_override("hbm.bandwidth_gb_per_s", "3000").unwrap().with_override("hbm.dma_bandwidth_gb_per_s", "1000").unwrap();
        assert_eq!(after.hbm.dma_bandwidth_gb_per_s.value, 1000.0);
    }

    #[test]
    fn every_preset_loads_and_validates() {
        for name in PRESETS {
            let chip = ChipModel::preset(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(&chip.name, name);
            assert!(chip.peak_flops() > 1e13, "{name} peak {}", chip.peak_flops());
        }
    }

    #[test]
    fn v6e_peak_matches_published_within_2_percent() {
        let chip = ChipModel::preset("v6e").unwrap();
        let published = chip.mxu.published_peak_bf16_tflops.value * 1e12;
        assert!((chip.peak_flops() / published - 1.0).abs() < 0.02, "{}", chip.peak_flops());
    }

    #[test]
    fn unknown_key_is_an_error_naming_it() {
        let text = PRESET_TEXT[0].1.replace("[mxu]", "[mxu]\nbogus_field = { value = 1, source = \"x\" }");
        let err = ChipModel::from_toml_str(&text, "t.toml").unwrap_err().to_string();
        assert!(err.contains("bogus_field"), "{err}");
    }

    #[test]
    fn missing_source_is_an_error() {
        let chip = ChipModel::preset("v6e").unwrap();
        let mut doc = toml::Value::try_from(&chip).unwrap();
        doc["mxu"]["count"].as_table_mut().unwrap().remove("source");
        let err = ChipModel::from_toml_str(&toml::to_string(&doc).unwrap(), "t").unwrap_err().to_string();
        assert!(err.contains("mxu.count") && err.contains("source"), "{err}");
    }

    #[test]
    fn zero_count_is_an_error() {
        let chip = ChipModel::preset("v6e").unwrap();
        let err = chip.with_override("mxu.count", "0").unwrap_err().to_string();
        assert!(err.contains("mxu.count") && err.contains("from 1"), "{err}");
    }

    #[test]
    fn override_changes_value_and_unknown_override_is_named() {
        let chip = ChipModel::preset("v6e").unwrap();
        let faster = chip.with_override("hbm.bandwidth_gb_per_s", "3276").unwrap();
        assert_eq!(faster.hbm.bandwidth_gb_per_s.value, 3276.0);
        let err = chip.with_override("hbm.bandwith_gb_per_s", "1").unwrap_err().to_string();
        assert!(err.contains("bandwith") && err.contains("bandwidth_gb_per_s"), "{err}");
        let err = chip.with_override("device.clock_ghz", "fast").unwrap_err().to_string();
        assert!(err.contains("device.clock_ghz") && err.contains("number"), "{err}");
    }

    #[test]
    fn unknown_chip_lists_presets() {
        let err = ChipModel::load("v9z").unwrap_err().to_string();
        assert!(err.contains("v9z") && err.contains("v6e"), "{err}");
    }

    #[test]
    fn malformed_toml_is_an_error_not_a_panic() {
        assert!(ChipModel::from_toml_str("name = ", "x").is_err());
        assert!(ChipModel::from_toml_str("", "x").is_err());
    }

    #[test]
    fn identity_names_source_overrides_and_a_hash_of_the_values() {
        let v6e = ChipModel::preset("v6e").unwrap();
        let id = v6e.identity();
        assert_eq!((id.name.as_str(), id.source.as_str(), id.overrides.len()), ("v6e", "preset", 0));
        assert_eq!(id.hash.len(), 12);
        let faster = v6e.with_override("hbm.bandwidth_gb_per_s", "3276").unwrap();
        let fid = faster.identity();
        assert_eq!(fid.overrides, vec!["hbm.bandwidth_gb_per_s=3276".to_string()]);
        assert_ne!(fid.hash, id.hash);
        assert!(fid.to_string().contains("--set hbm.bandwidth_gb_per_s=3276"), "{fid}");
        // The description's figures are the file's: it names the overrides since, each once.
        let twice = faster.with_override("mxu.count", "4").unwrap();
        assert_eq!(twice.description, format!("{}; what-if: --set hbm.bandwidth_gb_per_s=3276 --set mxu.count=4", v6e.description));
        // The same values from a file hash alike; only the source differs.
        let text = PRESET_TEXT[0].1;
        let file = ChipModel::from_toml_str(text, "my-v6e.toml").unwrap();
        assert_eq!((file.identity().hash, file.identity().source), (id.hash.clone(), "my-v6e.toml".to_string()));
        // A changed value under the same name (a calibrated file) hashes differently.
        let fitted = ChipModel::from_toml_str(&text.replace("value = 1.75", "value = 1.76"), "fit.toml").unwrap();
        assert_eq!(fitted.name, "v6e");
        assert_ne!(fitted.identity().hash, id.hash);
        // Setting a value back to what it was gives the original hash (the note does not enter it).
        let back = faster.with_override("hbm.bandwidth_gb_per_s", &v6e.hbm.bandwidth_gb_per_s.value.to_string()).unwrap();
        assert_eq!(back.identity().hash, id.hash);
    }

    #[test]
    fn absurd_override_values_print_short_and_state_the_range() {
        let chip = ChipModel::preset("v6e").unwrap();
        let err = chip.with_override("hbm.bandwidth_gb_per_s", "1e300").unwrap_err().to_string();
        assert!(err.contains("= 1e300:") && err.contains("from 0.001 to 1e7") && err.len() < 200, "{err}");
        // Whole numbers past u32 state the field's own range, with the value as typed.
        let err = chip.with_override("mxu.count", "99999999999").unwrap_err().to_string();
        assert!(err.contains("= 99999999999:") && err.contains("from 1 to 64"), "{err}");
        let err = chip.with_override("mxu.count", "-2").unwrap_err().to_string();
        assert!(err.contains("= -2:") && err.contains("from 1 to 64"), "{err}");
        assert_eq!(format_number(1e300), "1e300");
        assert_eq!(format_number(2.5e-9), "2.5e-9");
        assert_eq!(format_number(1638.0), "1638");
        assert_eq!(format_number(0.001), "0.001");
    }

    #[test]
    fn every_preset_has_a_sourced_ici_section() {
        for name in PRESETS {
            let chip = ChipModel::preset(name).unwrap();
            let ici = &chip.ici;
            assert!(ici.ports.value >= 2 * ici.torus_dims.value, "{name}");
            assert!(chip.ici_link_bytes_per_s() > 1e10, "{name}");
            for p in [&ici.ports, &ici.torus_dims, &ici.pod_devices, &ici.wraparound_axis_devices, &ici.wraparound_cube_devices] {
                assert!(p.source.as_deref().is_some_and(|s| s.len() > 20), "{name}");
            }
        }
    }

    #[test]
    fn register_shapes_are_powers_of_two() {
        let chip = ChipModel::preset("v6e").unwrap();
        for (key, bad, good) in [("vpu.sublanes", "3", "16"), ("vpu.lanes", "96", "256")] {
            let e = chip.with_override(key, bad).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains(bad) && e.contains("power of two"), "{e}");
            assert!(chip.with_override(key, good).is_ok(), "{key} = {good}");
        }
    }

    #[test]
    fn ici_errors_name_the_field() {
        let chip = ChipModel::preset("v6e").unwrap();
        let e = chip.with_override("ici.ports", "3").unwrap_err().to_string();
        assert!(e.contains("ici.ports") && e.contains("at least 4"), "{e}");
        let e = chip.with_override("ici.link_bandwidth_gb_per_s", "0").unwrap_err().to_string();
        assert!(e.contains("ici.link_bandwidth_gb_per_s"), "{e}");
        let e = chip.with_override("ici.torus_dims", "4").unwrap_err().to_string();
        assert!(e.contains("ici.torus_dims") && e.contains("1 to 3"), "{e}");
        let faster = chip.with_override("ici.link_bandwidth_gb_per_s", "200").unwrap();
        assert_eq!(faster.ici_link_bytes_per_s(), 2.0 * chip.ici_link_bytes_per_s());
        // A model without [ici] is refused, naming the section.
        let mut doc = toml::Value::try_from(&chip).unwrap();
        doc.as_table_mut().unwrap().remove("ici");
        let e = ChipModel::from_toml_str(&toml::to_string(&doc).unwrap(), "t").unwrap_err().to_string();
        assert!(e.contains("ici"), "{e}");
    }

    #[test]
    fn units_come_from_field_names() {
        assert_eq!(unit_of("clock_ghz"), "GHz");
        assert_eq!(unit_of("bandwidth_gb_per_s"), "GB/s");
        assert_eq!(unit_of("count"), "count");
        assert_eq!(unit_of("hop_latency_us"), "µs");
        assert_eq!(unit_of("pod_devices"), "devices");
    }
}
