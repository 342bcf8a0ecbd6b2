//! [`JobSpec`]: the one description of "what to simulate". The same struct is the command line's
//! job flags (`#[command(flatten)]` in `run`, `tune` and `plot`), a trace file (TOML with the
//! same keys), a sweep point and a measurement row; every field is optional, and unset fields
//! take the kernel family's defaults when [`JobSpec::build`] turns the spec into a [`Job`] for a
//! chip.
//!
//! Field names are the vocabulary of every layer below: workload and kernel errors name fields
//! in backticks (`` `heads` ``), and each front end renders them as what its user typed
//! ([`FieldStyle`]: `--heads` on the command line, `heads` in a trace or sweep file).

use crate::{DescribedJob, Job};
use clap::Args;
use serde::{Deserialize, Serialize};
use std::sync::OnceLock;
use tpusim_chip::{ChipError, ChipModel};
use tpusim_kernel::{splash, BwdBlocks, Direction, Exp, KernelError, MaskSource, Masking, MatmulConfig, Scope, SplashConfig, Traversal};
use tpusim_model::KernelKind;
use tpusim_workload::{AttentionCall, Mask, MatmulCall, WorkloadError};

pub use tpusim_kernel::Kernel;

/// The chip a job runs on when it names none.
pub const DEFAULT_CHIP: &str = "v6e";

/// The kernel family a job runs when it names none.
pub const DEFAULT_KERNEL: Kernel = Kernel::TokamaxSplash;

/// An error in a job: the field (in backticks, rendered by the front end with
/// [`render_fields`]), its value and what is allowed, or an error of a lower layer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpecError {
    /// A field's value is not allowed, or fields contradict each other.
    #[error("`{field}` = {value}: {allowed}")]
    Field {
        /// The job field, e.g. `heads`.
        field: String,
        /// The value as given.
        value: String,
        /// What is allowed.
        allowed: String,
    },
    /// The chip model: unknown preset, unreadable or invalid file, bad `set` override.
    #[error(transparent)]
    Chip(#[from] ChipError),
    /// A trace file cannot be read or parsed.
    #[error("trace {path}: {message}")]
    Trace {
        /// The file as given.
        path: String,
        /// What is wrong (names the key).
        message: String,
    },
    /// The workload is invalid (names the field).
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    /// The kernel refuses the configuration (block rules, VMEM, ...).
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// A kernel description (`kernel_ir`) or a runtime value of it (`runtime`) cannot be read,
    /// or does not bind: the reader's message (naming the file, or the field in backticks).
    #[error("{0}")]
    Description(String),
}

impl SpecError {
    fn field(field: &str, value: impl std::fmt::Display, allowed: impl Into<String>) -> Self {
        SpecError::Field { field: field.to_string(), value: value.to_string(), allowed: allowed.into() }
    }
}

/// How a front end names job fields in messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldStyle {
    /// Command-line flags: `--block-kv-compute`.
    Flag,
    /// Trace and sweep-file keys: `block_kv_compute`.
    Key,
}

/// Rewrites every backticked job field in `text` (`` `block_q` ``) as `style` names it; other
/// backticked words are left alone.
pub fn render_fields(text: &str, style: FieldStyle) -> String {
    render_fields_with(text, &mut |field| match style {
        FieldStyle::Flag => format!("--{}", field.replace('_', "-")),
        FieldStyle::Key => field.to_string(),
    })
}

/// Words after which a backticked word is a name (a kernel's, a runtime operand's), not a field.
const NAME_BEFORE: &[&str] = &["kernel ", "operand ", "operands ", "did you mean "];

/// Rewrites every backticked job field in `text` with `name(field)`; other backticked words are
/// left alone, and so is one that names a kernel or a runtime operand (after "kernel ",
/// "operand ", "operands " or "did you mean ") even where it spells a field.
pub fn render_fields_with(text: &str, name: &mut dyn FnMut(&str) -> String) -> String {
    let fields = JobSpec::fields();
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('`') {
        let Some(close) = rest[open + 1..].find('`') else {
            break;
        };
        let word = &rest[open + 1..open + 1 + close];
        out.push_str(&rest[..open]);
        // A name in backticks after "kernel " or "operand(s) " (a kernel read from its IR, or one
        // of its runtime operands) is that name, even when it spells a field (`kernel`, `mask`).
        let named = NAME_BEFORE.iter().any(|w| out.ends_with(w));
        if !named && fields.iter().any(|f| f == word) {
            out.push_str(&name(word));
        } else {
            out.push_str(&rest[open..open + close + 2]);
        }
        rest = &rest[open + close + 2..];
    }
    out.push_str(rest);
    out
}

/// What to simulate: kernel family, workload and kernel options. Field names are the trace keys;
/// the command-line flags are the same names with dashes. Defaults are the kernel family's
/// (`--kernel`), never a workload's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, Args)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// Chip: preset name (v6e, v5e, v5p, v4, v7x) or path to a chip TOML [default: v6e].
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chip: Option<String>,
    /// Change a chip parameter, e.g. --set hbm.bandwidth_gb_per_s=3276 (repeatable).
    #[arg(long = "set", value_name = "SECTION.FIELD=VALUE")]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub set: Vec<String>,
    /// Kernel family; its library's defaults apply to every option and block size not given
    /// [default: tokamax-splash].
    #[arg(long, value_enum)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<Kernel>,
    /// Which pass runs: the forward, the backward alone (after a forward that saved its
    /// residuals) or both (one training step of the layer) [default: fwd].
    #[arg(long, value_enum)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direction: Option<Direction>,
    /// What a simulated time covers: the Pallas kernels alone, every XLA op of the library
    /// call (tokamax's transposes and scalings around its kernels), or a host-timed jitted call
    /// (those ops plus the host's dispatch and sync, the chip model's host section) [default: kernel].
    #[arg(long, value_enum)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<Scope>,
    /// The layout of the caller's q, k, v and o: bhsd, or bshd for a wrapper that swaps the
    /// sequence and head axes around the kernel (axlearn's and Levanter's Splash layers; counted
    /// in --scope op and call) [default: the kernel family's API: bshd for tokamax-splash, bhsd
    /// otherwise].
    #[arg(long, value_enum)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_layout: Option<tpusim_kernel::InputLayout>,
    /// Batch size [default: 1].
    #[arg(long, allow_negative_numbers = true, value_parser = whole::<1, { tpusim_workload::MAX_DIM }>)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<u64>,
    /// Query heads [default: 10].
    #[arg(long, allow_negative_numbers = true, value_parser = whole::<1, { tpusim_workload::MAX_HEADS }>)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heads: Option<u64>,
    /// Key/value heads (fewer than --heads is GQA/MQA) [default: --heads].
    #[arg(long, allow_negative_numbers = true, value_parser = whole::<1, { tpusim_workload::MAX_HEADS }>)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_heads: Option<u64>,
    /// Sequence length of both q and kv [default: 75600, Wan 2.1 at 720p].
    #[arg(long, conflicts_with_all = ["q_len", "kv_len"], allow_negative_numbers = true, value_parser = whole::<1, { tpusim_workload::MAX_DIM }>)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq_len: Option<u64>,
    /// Query length (with --kv-len).
    #[arg(long, allow_negative_numbers = true, value_parser = whole::<1, { tpusim_workload::MAX_DIM }>)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub q_len: Option<u64>,
    /// Key/value length (with --q-len).
    #[arg(long, allow_negative_numbers = true, value_parser = whole::<1, { tpusim_workload::MAX_DIM }>)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_len: Option<u64>,
    /// Head dimension of q and k [default: 128].
    #[arg(long, allow_negative_numbers = true, value_parser = whole::<1, { tpusim_workload::MAX_HEAD_DIM }>)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<u64>,
    /// Head dimension of v and o [default: --head-dim].
    #[arg(long, allow_negative_numbers = true, value_parser = whole::<1, { tpusim_workload::MAX_HEAD_DIM }>)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim_v: Option<u64>,
    /// Mask: full, causal, local:L,R, band:W, sink:S, chunked:C, video:F,H,W:wf,wh,ww and
    /// sta:F,H,W:kf,kh,kw:tf,th,tw, each optionally followed by a token order @frame, @position or
    /// @tiles:tf,th,tw,
    /// per-head[N*M;...], file:PATH; + is union, & is intersection, ( ) groups.
    /// causal is k <= q counted from the first token of both; causal@offset:N (k <= q + N) and
    /// local:L,R@offset:N are Splash's CausalMask / LocalMask with offset N: for q_len != kv_len,
    /// e.g. decode after a cache, N = kv_len - q_len (N may be negative).
    /// Example: band:15000+sink:3600 [default: full].
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask: Option<String>,
    /// Rows of q per block (multiple of 8) [default: the kernel family's].
    #[arg(long, allow_negative_numbers = true, value_parser = whole::<1, { tpusim_workload::MAX_DIM }>)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_q: Option<u64>,
    /// Rows of k/v per block (multiple of 128) [default: the kernel family's].
    #[arg(long, allow_negative_numbers = true, value_parser = whole::<1, { tpusim_workload::MAX_DIM }>)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_kv: Option<u64>,
    /// Width of the inner matmul/softmax sub-tile (multiple of 128 dividing --block-kv)
    /// [default: the kernel family's; with --block-kv given, --block-kv (JAX's and MaxDiffusion's
    /// kernels), or the largest width that fits the VMEM limit (tokamax-splash, whose Config has
    /// no default)].
    #[arg(long, allow_negative_numbers = true, value_parser = whole::<1, { tpusim_workload::MAX_DIM }>)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_kv_compute: Option<u64>,
    /// Which grid steps run [default: the kernel family's].
    #[arg(long, value_enum)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traversal: Option<Traversal>,
    /// Which visited blocks apply the element-wise mask [default: the kernel family's].
    #[arg(long, value_enum)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub masking: Option<Masking>,
    /// How the mask is evaluated [default: what Splash does: computed in the kernel for causal,
    /// local, band and chunked masks, loaded as int8 blocks for every other mask; a file mask is
    /// always loaded].
    #[arg(long, value_enum)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask_source: Option<MaskSource>,
    /// Round the mask to whole tiles (keep a tile when at least half its pairs are kept).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tile_align: Option<bool>,
    /// The softmax exponential's base (base2 folds log2(e) into q's scale) [default: the kernel
    /// family's: base2 for tokamax-splash, natural otherwise].
    #[arg(long, value_enum)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exp: Option<Exp>,
    /// The compiler's experimental scheduler flag (tokamax's use_experimental_scheduler; it
    /// changes nothing in the model: no released measurement shows an effect) [default: the
    /// kernel family's].
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experimental_scheduler: Option<bool>,
    /// The forward also writes its residuals (logsumexp and max logits) [default: false; always
    /// with --direction fwd+bwd].
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_residuals: Option<bool>,
    /// q rows per block of the backward's dkv (or fused) kernel [default: the kernel family's:
    /// 128 for tokamax-splash, --block-q for MaxDiffusion's kernels; JAX's need it once any block
    /// is given].
    #[arg(long, allow_negative_numbers = true, value_parser = whole::<1, { tpusim_workload::MAX_DIM }>)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_q_dkv: Option<u64>,
    /// kv rows per block of the dkv kernel [default: as --block-q-dkv: 128, or --block-kv].
    #[arg(long, allow_negative_numbers = true, value_parser = whole::<1, { tpusim_workload::MAX_DIM }>)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_kv_dkv: Option<u64>,
    /// kv rows per sub-tile of the dkv kernel (divides --block-kv-dkv) [default: --block-kv-dkv].
    #[arg(long, allow_negative_numbers = true, value_parser = whole::<1, { tpusim_workload::MAX_DIM }>)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_kv_dkv_compute: Option<u64>,
    /// q rows per block of the dq kernel (unfused backward) [default: 128, or --block-q for
    /// MaxDiffusion's kernels; JAX's need it once any block is given].
    #[arg(long, allow_negative_numbers = true, value_parser = whole::<1, { tpusim_workload::MAX_DIM }>)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_q_dq: Option<u64>,
    /// kv rows per block of the dq kernel (unfused backward) [default: 128, or --block-kv].
    #[arg(long, allow_negative_numbers = true, value_parser = whole::<1, { tpusim_workload::MAX_DIM }>)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_kv_dq: Option<u64>,
    /// One fused backward kernel for dq, dk and dv (tokamax's only path) rather than JAX's dq
    /// and dkv kernels [default: the kernel family's: fused for tokamax-splash, unfused for splash].
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL", overrides_with = "no_fused_bwd")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fused_bwd: Option<bool>,
    /// JAX's two backward kernels (dq, then dkv): --fused-bwd=false.
    #[arg(long, overrides_with = "fused_bwd")]
    #[serde(skip)]
    pub no_fused_bwd: bool,
    /// Scoped VMEM limit, MiB [default: the chip's].
    #[arg(long, allow_negative_numbers = true, value_parser = mib)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vmem_limit_mib: Option<f64>,
    /// Matmul M (matmul kernels).
    #[arg(long, allow_negative_numbers = true, value_parser = whole::<1, { tpusim_workload::MAX_DIM }>)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub m: Option<u64>,
    /// Matmul N (matmul kernels).
    #[arg(long, allow_negative_numbers = true, value_parser = whole::<1, { tpusim_workload::MAX_DIM }>)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u64>,
    /// Matmul K (matmul kernels).
    #[arg(long, allow_negative_numbers = true, value_parser = whole::<1, { tpusim_workload::MAX_DIM }>)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k: Option<u64>,
    /// Matmul block M [default: the kernel family's, clamped to M].
    #[arg(long, allow_negative_numbers = true, value_parser = whole::<1, { tpusim_workload::MAX_DIM }>)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_m: Option<u64>,
    /// Matmul block N [default: the kernel family's, clamped to N].
    #[arg(long, allow_negative_numbers = true, value_parser = whole::<1, { tpusim_workload::MAX_DIM }>)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_n: Option<u64>,
    /// Matmul block K [default: the kernel family's, clamped to K].
    #[arg(long, allow_negative_numbers = true, value_parser = whole::<1, { tpusim_workload::MAX_DIM }>)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_k: Option<u64>,
    /// Simulate a Pallas kernel read from its Mosaic IR: a kernel description file written by
    /// `tpusim.jax.describe` (format: crates/tpusim-pallas/DESCRIPTION.md) instead of a kernel
    /// family's job. The lowering fixed the workload, mask and blocks, so of the job flags only
    /// --chip, --set, --scope (kernel, or call: the kernel plus the host's dispatch) and
    /// --runtime apply.
    #[arg(long, value_name = "FILE.json")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_ir: Option<String>,
    /// With --kernel-ir: the values of a runtime operand of the kernel (sequence lengths, page
    /// tables), an integer `.npy` file, by the operand's name in the description (the traced
    /// function's parameter name, or `prefetch N`). Repeat per operand; an operand the kernel
    /// reads that is not given is an error naming it.
    #[arg(long, value_name = "NAME=FILE.npy")]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runtime: Vec<String>,
    /// A mask given as a value rather than as `mask` text, by a library front end (the Python
    /// package hands over NumPy arrays and Splash mask objects this way); used instead of
    /// `mask`, never both. Not a flag or a trace key.
    #[arg(skip)]
    #[serde(skip)]
    pub mask_value: Option<Mask>,
    /// A kernel description given as a value rather than as a `kernel_ir` file, by a library
    /// front end (the Python package hands over what `tpusim.jax.describe` made, a program the
    /// descriptions of its kernels); used instead of `kernel_ir`, never both. Not a flag or a
    /// trace key.
    #[arg(skip)]
    #[serde(skip)]
    pub kernel_ir_value: Option<KernelIrValue>,
}

/// A kernel description handed over as a value ([`JobSpec::kernel_ir_value`]): its JSON text,
/// read when the job is built.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelIrValue {
    /// What names it: the report's `job.file` and the description's errors (`kernels[2]` for a
    /// program's kernel; `-`, named `kernel description` in errors, for text given in memory).
    pub file: String,
    /// The description (JSON, as `tpusim.jax.describe` writes it).
    pub text: String,
    /// The folder its side files (`.npy` tables) resolve in.
    pub dir: std::path::PathBuf,
}

/// The job fields a kernel read from its IR takes (`kernel_ir`): its lowering fixed every other.
pub const DESCRIBED_FIELDS: &[&str] = &["chip", "set", "scope", "kernel_ir", "runtime"];

/// The value parser of a whole-number job flag: the number, or an error stating the range the
/// job enforces (`LO` to `HI`, the limits of [`tpusim_workload`]), so that `--heads -1` and
/// `--heads 0` both say what is allowed. (The same limits are checked again when a trace or
/// sweep file gives the value.)
fn whole<const LO: u64, const HI: u64>(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(v) if (LO..=HI).contains(&v) => Ok(v),
        _ => Err(crate::fields::whole_allowed(LO, HI)),
    }
}

/// The value parser of `--vmem-limit-mib`: a number (its range, which depends on the chip, is
/// checked when the job is built), or the rule's message.
fn mib(s: &str) -> Result<f64, String> {
    s.trim().parse::<f64>().map_err(|_| crate::fields::MIB_ALLOWED.to_string())
}

/// Fields that describe attention (refused for matmul kernels).
const ATTENTION_ONLY: &[&str] = &[
    "direction",
    "input_layout",
    "exp",
    "experimental_scheduler",
    "return_residuals",
    "block_q_dkv",
    "block_kv_dkv",
    "block_kv_dkv_compute",
    "block_q_dq",
    "block_kv_dq",
    "fused_bwd",
    "heads",
    "kv_heads",
    "seq_len",
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
];
/// Fields that describe a matmul (refused for attention kernels).
const MATMUL_ONLY: &[&str] = &["m", "n", "k", "block_m", "block_n", "block_k"];

impl JobSpec {
    /// Every field name, in declaration order (read off the command-line definition, so the
    /// list cannot drift from the struct).
    pub fn fields() -> &'static [String] {
        static FIELDS: OnceLock<Vec<String>> = OnceLock::new();
        FIELDS.get_or_init(|| {
            <JobSpec as Args>::augment_args(clap::Command::new("job")).get_arguments().map(|a| a.get_id().as_str().to_string()).collect()
        })
    }

    /// The fields this spec sets, with their values as JSON.
    pub fn set_fields(&self) -> serde_json::Map<String, serde_json::Value> {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(m)) => m,
            _ => serde_json::Map::new(),
        }
    }

    /// Reads a trace file (TOML with the keys of [`JobSpec`]). Relative paths in it (`chip`,
    /// `mask = "file:..."`) resolve from the trace's folder ([`JobSpec::resolve_paths_from`]).
    ///
    /// # Errors
    /// [`SpecError::Trace`] naming the file and the key for unreadable files, malformed TOML,
    /// unknown keys, values of the wrong type and named files that do not exist, and a file that
    /// sets no job field (an empty trace would run the family's defaults without a word).
    pub fn from_toml_file(path: &str) -> Result<Self, SpecError> {
        let text =
            tpusim_io::read_text(path).map_err(|e| SpecError::Trace { path: path.into(), message: format!("cannot read: {e}") })?;
        let mut spec = Self::from_toml_str(&text, path)?;
        if spec.set_fields().is_empty() {
            return Err(SpecError::Trace {
                path: path.into(),
                message: "sets no job field: a trace gives the job, e.g. `kernel = \"splash\"`, `heads = 10`, `seq_len = 75600` (README.md, `tpusim run --help` and the files in traces/ show the keys)".into(),
            });
        }
        let dir = std::path::Path::new(path).parent().unwrap_or(std::path::Path::new(""));
        spec.resolve_paths_from(dir).map_err(|message| SpecError::Trace { path: path.into(), message })?;
        Ok(spec)
    }

    /// Parses trace text; `path` names it in errors.
    ///
    /// # Errors
    /// As [`JobSpec::from_toml_file`].
    pub fn from_toml_str(text: &str, path: &str) -> Result<Self, SpecError> {
        let trace = |message: String| SpecError::Trace { path: path.into(), message };
        let table: toml::Table = toml::from_str(text).map_err(|e| trace(one_line(&e.to_string())))?;
        // Each key checked against its field's rule: the key, the value and what is allowed.
        crate::fields::spec_from_toml(&table).map_err(|m| trace(render_fields(&m, FieldStyle::Key)))
    }

    /// Fields set in `over` replace those of `self` (flags over a trace file); `set` overrides
    /// are concatenated. `seq_len` on top replaces a base's `q_len` / `kv_len`, and `q_len` /
    /// `kv_len` on top replace a base's `seq_len` (the other length keeps the base's value).
    pub fn overlay(&self, over: &JobSpec) -> JobSpec {
        let mut base = self.clone();
        if over.seq_len.is_some() {
            base.q_len = None;
            base.kv_len = None;
        }
        if over.q_len.is_some() || over.kv_len.is_some() {
            if let Some(l) = base.seq_len.take() {
                base.q_len = base.q_len.or(Some(l));
                base.kv_len = base.kv_len.or(Some(l));
            }
        }
        let mut merged = base.set_fields();
        if over.no_fused_bwd {
            merged.insert("fused_bwd".into(), serde_json::Value::Bool(false));
        }
        for (k, v) in over.set_fields() {
            if k == "set" {
                let mut all = merged.remove("set").and_then(|s| s.as_array().cloned()).unwrap_or_default();
                all.extend(v.as_array().cloned().unwrap_or_default());
                merged.insert(k, serde_json::Value::Array(all));
            } else {
                merged.insert(k, v);
            }
        }
        let mut out: JobSpec =
            serde_json::from_value(serde_json::Value::Object(merged)).expect("a merge of two valid specs is a valid spec");
        // A mask on top (text or value) replaces the base's.
        out.mask_value = match (&over.mask_value, &over.mask) {
            (Some(m), _) => {
                out.mask = None;
                Some(m.clone())
            }
            (None, Some(_)) => None,
            (None, None) => base.mask_value.clone(),
        };
        out.no_fused_bwd = over.no_fused_bwd || (base.no_fused_bwd && over.fused_bwd.is_none());
        // So does a kernel description (file or value).
        out.kernel_ir_value = match (&over.kernel_ir_value, &over.kernel_ir) {
            (Some(v), _) => {
                out.kernel_ir = None;
                Some(v.clone())
            }
            (None, Some(_)) => None,
            (None, None) => base.kernel_ir_value.clone(),
        };
        out
    }

    /// The field a message about `field` should name for this spec: lengths given as `seq_len`
    /// are named `seq_len`, not `q_len` or `kv_len` (which the spec resolves them to).
    pub fn field_as_given<'a>(&self, field: &'a str) -> &'a str {
        let by_seq_len = self.seq_len.is_some() && self.q_len.is_none() && self.kv_len.is_none();
        if by_seq_len && (field == "q_len" || field == "kv_len") {
            "seq_len"
        } else {
            field
        }
    }

    /// Rewrites the backticked job fields of an error message as `style` names them, each as
    /// this spec gave it ([`JobSpec::field_as_given`]).
    pub fn render_error(&self, text: &str, style: FieldStyle) -> String {
        render_fields_with(text, &mut |field| {
            let f = self.field_as_given(field);
            match style {
                FieldStyle::Flag => format!("--{}", f.replace('_', "-")),
                FieldStyle::Key => f.to_string(),
            }
        })
    }

    /// The chip this spec names, with its overrides applied (default `v6e`).
    ///
    /// # Errors
    /// [`SpecError::Chip`]: unknown chip, unreadable file, bad override.
    pub fn chip(&self) -> Result<ChipModel, SpecError> {
        apply_overrides(ChipModel::load(self.chip.as_deref().unwrap_or(DEFAULT_CHIP))?, &self.set)
    }

    /// The kernel family ([`DEFAULT_KERNEL`] when unset).
    pub fn kernel(&self) -> Kernel {
        self.kernel.unwrap_or(DEFAULT_KERNEL)
    }

    /// Builds the job for a chip, in stages: the kernel family and the fields that apply to
    /// it; the VMEM limit; the workload; the kernel configuration from the family's defaults
    /// ([`tpusim_kernel::Kernel::defaults`]) overridden by the fields given.
    ///
    /// # Errors
    /// [`SpecError`] naming the field: contradictory fields, fields that do not apply to the
    /// kernel, invalid sizes or masks, unreadable mask files. Block rules and VMEM are checked
    /// later, by lowering.
    pub fn build(&self, chip: &ChipModel) -> Result<Job, SpecError> {
        if let Some(d) = self.described()? {
            return Ok(Job::Described(d));
        }
        if let Some(r) = self.runtime.first() {
            return Err(SpecError::field("runtime", r, "only with `kernel_ir` (the values of a Pallas kernel's runtime operands)"));
        }
        let kernel = self.kernel();
        self.check_applicable(kernel)?;
        let vmem_limit_bytes = self.vmem_limit_bytes(chip)?;
        match kernel.kind() {
            KernelKind::Attention => {
                let workload = self.attention_call()?;
                let config = self.splash_config(kernel, &workload, chip, vmem_limit_bytes)?;
                let scope = self.scope.unwrap_or(Scope::Kernel);
                let direction = self.direction.unwrap_or(Direction::Fwd);
                self.check_backward(&config, direction)?;
                Ok(Job::Attention { workload, config, direction, scope })
            }
            KernelKind::Matmul => {
                let workload = self.matmul_call()?;
                let config = self.matmul_config(kernel, &workload, chip, vmem_limit_bytes);
                Ok(Job::Matmul { workload, config, scope: self.scope.unwrap_or(Scope::Kernel) })
            }
            KernelKind::Copy => Err(SpecError::field("kernel", kernel, "names calibration-CSV rows of a bare HBM copy, not a kernel to simulate (the copies around a kernel are timed with --scope op or call); choose another kernel family")),
        }
    }

    /// The job of a kernel read from its IR (`kernel_ir`, or `kernel_ir_value`): the
    /// description read, its runtime operands bound from `runtime`, timed at `scope`. Any other
    /// field is an error naming it (the lowering fixed the workload, mask and blocks). `None`
    /// when the spec names no kernel description.
    fn described(&self) -> Result<Option<DescribedJob>, SpecError> {
        if self.kernel_ir.is_none() && self.kernel_ir_value.is_none() {
            return Ok(None);
        }
        let set = self.set_fields();
        let mut others: Vec<(&str, String)> =
            set.keys().filter(|k| !DESCRIBED_FIELDS.contains(&k.as_str())).map(|k| (k.as_str(), set[k].to_string().trim_matches('"').to_string())).collect();
        others.extend(self.mask_value.as_ref().map(|m| ("mask", m.to_string())));
        if self.no_fused_bwd {
            others.push(("fused_bwd", "false".into()));
        }
        if let Some((field, value)) = others.first() {
            // Every field given that does not apply is named, the first with its value.
            let also: Vec<String> = others[1..].iter().map(|(f, _)| format!("`{f}`")).collect();
            let also = if also.is_empty() { String::new() } else { format!(" (nor {})", also.join(", ")) };
            return Err(SpecError::field(
                field,
                value.clone(),
                format!("not with `kernel_ir`{also}: the kernel's lowering fixed its workload, mask and block sizes (of the job fields only `chip`, `set`, `scope` and `runtime` apply; re-lower with tpusim.jax to change them)"),
            ));
        }
        let description = |e: tpusim_pallas::PallasError| SpecError::Description(e.to_string());
        let (mut desc, dir, file) = match (&self.kernel_ir, &self.kernel_ir_value) {
            (Some(path), None) => {
                let (d, dir) = tpusim_pallas::Description::read(std::path::Path::new(path)).map_err(|e| SpecError::Description(format!("`kernel_ir` {e}")))?;
                (d, dir, path.clone())
            }
            (None, Some(v)) => {
                let name = if v.file == "-" { "kernel description" } else { v.file.as_str() };
                (tpusim_pallas::Description::from_json(&v.text, name).map_err(description)?, v.dir.clone(), v.file.clone())
            }
            (Some(path), Some(_)) => return Err(SpecError::field("kernel_ir", path, "give the kernel description as a file or as a value, not both")),
            (None, None) => return Ok(None),
        };
        let mut given: Vec<(String, tpusim_pallas::runtime::RuntimeValue)> = Vec::with_capacity(self.runtime.len());
        for r in &self.runtime {
            let (name, npy) = r.split_once('=').ok_or_else(|| SpecError::field("runtime", r, "expected NAME=FILE.npy (no '=')"))?;
            if name.is_empty() {
                return Err(SpecError::field("runtime", r, "expected NAME=FILE.npy (the operand's name before '=' is empty)"));
            }
            if npy.is_empty() {
                return Err(SpecError::field("runtime", r, "expected NAME=FILE.npy (no file after '=')"));
            }
            if npy.contains(',') && npy.contains('=') {
                return Err(SpecError::field("runtime", r, "expected one NAME=FILE.npy (repeat --runtime for each operand)"));
            }
            if given.iter().any(|(n, _)| n == name) {
                return Err(SpecError::field("runtime", name, "given twice (each runtime operand takes one file)"));
            }
            // The name first: a mistyped name is named as such, not as a file that cannot be read.
            tpusim_pallas::runtime::check_runtime_name(&desc, name).map_err(description)?;
            let v = tpusim_pallas::runtime::RuntimeValue::from_npy(std::path::Path::new(npy))
                .map_err(|e| SpecError::Description(format!("`runtime` {name}: {e}")))?;
            given.push((name.to_string(), v));
        }
        tpusim_pallas::runtime::bind_runtime(&mut desc, &given).map_err(description)?;
        let mut job = DescribedJob::new(file, desc, dir);
        job.runtime.clone_from(&self.runtime);
        match self.scope {
            Some(scope) => job.with_scope(scope).map(Some).map_err(|allowed| SpecError::field("scope", scope, allowed)),
            None => Ok(Some(job)),
        }
    }

    /// Stage 1: fields that belong to another kind of kernel are errors, not ignored.
    fn check_applicable(&self, kernel: Kernel) -> Result<(), SpecError> {
        let (foreign, kind) = match kernel.kind() {
            KernelKind::Attention => (MATMUL_ONLY, "an attention"),
            KernelKind::Matmul => (ATTENTION_ONLY, "a matmul"),
            KernelKind::Copy => (&[][..], "a copy"),
        };
        let set = self.set_fields();
        if let Some(f) = foreign.iter().find(|f| set.contains_key(**f)) {
            return Err(SpecError::field(
                f,
                set[*f].to_string().trim_matches('"'),
                format!("does not apply to `kernel` {kernel} ({kind} kernel)"),
            ));
        }
        if self.seq_len == Some(0) {
            return Err(SpecError::field("seq_len", 0, format!("expected a whole number from 1 to {}", tpusim_workload::MAX_DIM)));
        }
        if self.seq_len.is_some() && (self.q_len.is_some() || self.kv_len.is_some()) {
            return Err(SpecError::field("seq_len", self.seq_len.unwrap_or(0), "give either `seq_len` or `q_len` and `kv_len`, not both"));
        }
        if self.q_len.is_some() != self.kv_len.is_some() {
            let (given, missing) = if self.q_len.is_some() { ("q_len", "kv_len") } else { ("kv_len", "q_len") };
            return Err(SpecError::field(
                given,
                self.q_len.or(self.kv_len).unwrap_or(0),
                format!("give `{missing}` too, or `seq_len` for both"),
            ));
        }
        Ok(())
    }

    /// Stage 2: the scoped VMEM limit, if given.
    fn vmem_limit_bytes(&self, chip: &ChipModel) -> Result<Option<u64>, SpecError> {
        match self.vmem_limit_mib {
            None => Ok(None),
            Some(v) if v.is_finite() && v > 0.0 && v <= chip.vmem.size_mib.value => Ok(Some((v * 1048576.0) as u64)),
            Some(v) => Err(SpecError::field(
                "vmem_limit_mib",
                crate::fields::number_text(v),
                format!("{} ({} MiB)", crate::fields::MIB_ALLOWED, chip.vmem.size_mib.value),
            )),
        }
    }

    /// Stage 3 (attention): the workload, with mask files read. Defaults: the built-in video
    /// workload (1 x 10 heads x 75,600 tokens, head_dim 128, full mask).
    fn attention_call(&self) -> Result<AttentionCall, SpecError> {
        let base = AttentionCall::video_default();
        let heads = self.heads.unwrap_or(base.q_heads);
        let head_dim = self.head_dim.unwrap_or(base.head_dim);
        let mask = match (&self.mask_value, &self.mask) {
            (Some(_), Some(s)) => return Err(SpecError::field("mask", s, "give the mask as text or as a value, not both")),
            (Some(m), None) => m.clone(),
            (None, Some(s)) => Mask::parse(s)
                .and_then(|m| m.load_files(&tpusim_workload::mask::read_mask_file))
                .map_err(|e| SpecError::field("mask", s, e.to_string()))?,
            (None, None) => Mask::Full,
        };
        let workload = AttentionCall {
            batch: self.batch.unwrap_or(base.batch),
            q_heads: heads,
            kv_heads: self.kv_heads.unwrap_or(heads),
            q_len: self.seq_len.or(self.q_len).unwrap_or(base.q_len),
            kv_len: self.seq_len.or(self.kv_len).unwrap_or(base.kv_len),
            head_dim,
            head_dim_v: self.head_dim_v.unwrap_or(head_dim),
            mask,
        };
        workload.validate().map_err(|e| self.name_lengths(e))?;
        Ok(workload)
    }

    /// A length error names `seq_len` when the user gave the lengths as `seq_len`.
    fn name_lengths(&self, mut e: WorkloadError) -> WorkloadError {
        if self.seq_len.is_some() && (e.field == "`q_len`" || e.field == "`kv_len`") {
            e.field = "`seq_len`".into();
        }
        e
    }

    /// Stage 4 (attention): the family's defaults, overridden by the fields given.
    fn splash_config(
        &self,
        kernel: Kernel,
        w: &AttentionCall,
        chip: &ChipModel,
        vmem_limit_bytes: Option<u64>,
    ) -> Result<SplashConfig, SpecError> {
        let d = kernel.defaults();
        // JAX's flash attention takes `causal` or nothing (segment ids aside): no other mask
        // has a kernel there.
        if kernel == Kernel::FlashAttention && !matches!(w.mask.to_string().as_str(), "full" | "causal") {
            return Err(SpecError::field(
                "mask",
                w.mask.to_string(),
                "flash-attention (jax.experimental.pallas.ops.tpu.flash_attention) takes full or causal only (its `causal` flag); other masks run with splash or tokamax-splash",
            ));
        }
        let mut config = SplashConfig::for_family(kernel);
        config.block_q = self.block_q.unwrap_or(d.blocks.q);
        config.block_kv = self.block_kv.unwrap_or(d.blocks.kv);
        config.traversal = self.traversal.unwrap_or(d.traversal);
        config.masking = self.masking.unwrap_or(d.masking);
        // Splash computes only its computable mask classes in the kernel; it loads the others.
        let default_source = if splash::computable(&w.mask) { d.mask_source } else { MaskSource::Loaded };
        config.mask_source = self.mask_source.unwrap_or(default_source);
        if w.mask.expression_terms().loaded_only {
            // A file mask has no closed form: its blocks can only be loaded.
            if self.mask_source == Some(MaskSource::Computed) {
                return Err(SpecError::field(
                    "mask_source",
                    MaskSource::Computed,
                    "a file mask has no closed form to compute from iota; it can only be loaded (use `mask_source` loaded)",
                ));
            }
            config.mask_source = MaskSource::Loaded;
        }
        config.tile_align = self.tile_align.unwrap_or(false);
        config.exp = self.exp.unwrap_or(d.exp);
        config.experimental_scheduler = self.experimental_scheduler.unwrap_or(d.experimental_scheduler);
        config.return_residuals = self.return_residuals.unwrap_or(false);
        config.input_layout = self.input_layout.unwrap_or(d.input_layout);
        if d.transposes_around && config.input_layout != d.input_layout {
            return Err(SpecError::field(
                "input_layout",
                config.input_layout,
                format!("{kernel}'s API takes [batch, sequence, heads, head_dim] arrays (`input_layout` {})", d.input_layout),
            ));
        }
        config.vmem_limit_bytes = vmem_limit_bytes;
        config.block_kv_compute = match (self.block_kv_compute, d.blocks.compute, self.block_kv) {
            (Some(v), _, _) => v,
            // The family's compute width applies to its own block_kv; with a block_kv given, the
            // family's rule (block_kv itself, or the largest width that fits).
            (None, Some(c), None) => c,
            _ => splash::default_compute(w, &config, chip),
        };
        config.bwd = self.backward_blocks(kernel, &config)?;
        Ok(config)
    }

    /// The backward blocks by the family's rule ([`tpusim_kernel::options::BwdRule`]): its own
    /// defaults, the forward's blocks, or - for JAX's kernels, once any block is given - the
    /// fields given and nothing else (a backward then needs them; [`JobSpec::check_backward`]);
    /// then the fields given. The dkv compute width follows `block_kv_dkv` when only that is
    /// given.
    fn backward_blocks(&self, kernel: Kernel, fwd: &SplashConfig) -> Result<BwdBlocks, SpecError> {
        use tpusim_kernel::options::BwdRule;
        use tpusim_kernel::splash::bwd::BlockOrigin;
        let mut b = BwdBlocks::for_family(kernel);
        let fused = if self.no_fused_bwd { Some(false) } else { self.fused_bwd };
        if fused == Some(false) && kernel == Kernel::TokamaxSplash {
            return Err(SpecError::field(
                "fused_bwd",
                false,
                "tokamax's Splash has only the fused backward kernel (use `kernel` splash for JAX's dq and dkv kernels)",
            ));
        }
        b.fused = fused.unwrap_or(b.fused);
        if kernel.defaults().bwd_rule == BwdRule::InheritForward {
            (b.block_q_dkv, b.block_kv_dkv, b.block_kv_dkv_compute) = (fwd.block_q, fwd.block_kv, fwd.block_kv_compute);
            (b.block_q_dq, b.block_kv_dq) = (fwd.block_q, fwd.block_kv);
            b.origin.dkv = BlockOrigin::Forward;
            b.origin.dq = BlockOrigin::Forward;
        }
        let given = |v: Option<u64>, slot: &mut u64| {
            if let Some(v) = v {
                *slot = v;
            }
        };
        given(self.block_q_dkv, &mut b.block_q_dkv);
        if let Some(v) = self.block_kv_dkv {
            b.block_kv_dkv = v;
            b.block_kv_dkv_compute = v;
        }
        given(self.block_kv_dkv_compute, &mut b.block_kv_dkv_compute);
        given(self.block_q_dq, &mut b.block_q_dq);
        given(self.block_kv_dq, &mut b.block_kv_dq);
        if self.block_q_dkv.is_some() && self.block_kv_dkv.is_some() {
            b.origin.dkv = BlockOrigin::Given;
        }
        if self.block_q_dq.is_some() && self.block_kv_dq.is_some() {
            b.origin.dq = BlockOrigin::Given;
        }
        Ok(b)
    }

    /// The backward block fields a JAX-family job must give to run a backward: JAX's Splash and
    /// flash attention refuse a `BlockSizes` without its backward blocks ("Need to specify
    /// backward blocks."), and a job that gives any block gives its `BlockSizes`; with no block
    /// given, `BlockSizes.get_default()` sets them all. Empty when none is missing.
    fn missing_backward_blocks(&self, kernel: Kernel, fused: bool) -> Vec<&'static str> {
        use tpusim_kernel::options::BwdRule;
        let set = self.set_fields();
        let blocks = ["block_q", "block_kv", "block_kv_compute", "block_q_dkv", "block_kv_dkv", "block_kv_dkv_compute", "block_q_dq", "block_kv_dq"];
        if kernel.defaults().bwd_rule != BwdRule::Required || !blocks.iter().any(|f| set.contains_key(*f)) {
            return Vec::new();
        }
        // block_kv_dkv_compute defaults to block_kv_dkv (Splash's BlockSizes).
        let mut need = vec!["block_q_dkv", "block_kv_dkv"];
        if !fused {
            need.extend(["block_q_dq", "block_kv_dq"]);
        }
        need.into_iter().filter(|f| !set.contains_key(*f)).collect()
    }

    /// Backward fields need a backward, and the dq kernel's blocks an unfused one; a JAX-family
    /// backward needs its blocks once any block is given ([`JobSpec::missing_backward_blocks`]).
    fn check_backward(&self, config: &SplashConfig, direction: Direction) -> Result<(), SpecError> {
        let set = self.set_fields();
        let missing = self.missing_backward_blocks(config.kernel, config.bwd.fused);
        if direction != Direction::Fwd && !missing.is_empty() {
            let list: Vec<String> = missing.iter().map(|f| format!("`{f}`")).collect();
            return Err(SpecError::field(
                missing[0],
                "unset",
                format!(
                    "{}'s BlockSizes with block sizes given cannot run a backward without its backward blocks (\"Need to specify backward blocks.\"): give {} too, or no block at all for its defaults (every block 128)",
                    config.kernel,
                    tpusim_model::words::or_list(&list.iter().map(String::as_str).collect::<Vec<_>>()).replace(" or ", " and ")
                ),
            ));
        }
        if direction == Direction::Fwd {
            if let Some(f) = ["block_q_dkv", "block_kv_dkv", "block_kv_dkv_compute", "block_q_dq", "block_kv_dq", "fused_bwd"]
                .iter()
                .find(|f| set.contains_key(**f))
            {
                return Err(SpecError::field(
                    f,
                    set[*f].to_string().trim_matches('"'),
                    "applies to the backward: give `direction` bwd or fwd+bwd",
                ));
            }
        }
        if config.bwd.fused {
            if let Some(f) = ["block_q_dq", "block_kv_dq"].iter().find(|f| set.contains_key(**f)) {
                return Err(SpecError::field(
                    f,
                    set[*f].to_string().trim_matches('"'),
                    "applies to the unfused backward's dq kernel (`fused_bwd`=false)",
                ));
            }
        }
        Ok(())
    }

    /// Stage 3 (matmul): the matmul's sizes.
    fn matmul_call(&self) -> Result<MatmulCall, SpecError> {
        let (m, n, k) = match (self.m, self.n, self.k) {
            (Some(m), Some(n), Some(k)) => (m, n, k),
            _ => {
                let missing: Vec<&str> =
                    [("m", self.m), ("n", self.n), ("k", self.k)].iter().filter(|(_, v)| v.is_none()).map(|(f, _)| *f).collect();
                return Err(SpecError::field(missing[0], "unset", "a matmul kernel needs `m`, `n` and `k`"));
            }
        };
        let workload = MatmulCall { m, n, k };
        workload.validate()?;
        Ok(workload)
    }

    /// Stage 4 (matmul): the family's blocks, clamped to the sizes, overridden by the fields;
    /// XLA's dot with no block given takes XLA's tiling on this chip
    /// ([`tpusim_kernel::matmul::xla_tiling`], as the layer and program paths do).
    fn matmul_config(&self, kernel: Kernel, mm: &MatmulCall, chip: &ChipModel, vmem_limit_bytes: Option<u64>) -> MatmulConfig {
        if kernel == Kernel::XlaMatmul && self.block_m.is_none() && self.block_n.is_none() && self.block_k.is_none() && vmem_limit_bytes.is_none() {
            return tpusim_kernel::matmul::xla_tiling(chip, mm);
        }
        let d = kernel.defaults().blocks;
        MatmulConfig {
            kernel,
            block_m: self.block_m.unwrap_or_else(|| mm.m.next_multiple_of(8).min(d.q)),
            block_n: self.block_n.unwrap_or_else(|| mm.n.next_multiple_of(128).min(d.kv)),
            block_k: self.block_k.unwrap_or_else(|| mm.k.next_multiple_of(128).min(d.compute.unwrap_or(d.kv))),
            vmem_limit_bytes,
        }
    }
}

/// `chip` with `set`'s overrides (`SECTION.FIELD=VALUE` each) applied: in order, and an override
/// the chip refuses until another is applied (vmem.size_mib below the scoped limit, before
/// vmem.scoped_limit_mib) tried again after the rest, so their order does not matter.
///
/// # Errors
/// [`SpecError`] for an entry without `=`, or the first override still refused.
pub fn apply_overrides(mut chip: ChipModel, set: &[String]) -> Result<ChipModel, SpecError> {
    let mut pending = Vec::with_capacity(set.len());
    for s in set {
        let (k, v) = s.split_once('=').ok_or_else(|| SpecError::field("set", s, "expected SECTION.FIELD=VALUE, e.g. hbm.bandwidth_gb_per_s=3276"))?;
        pending.push((k.trim(), v.trim()));
    }
    while !pending.is_empty() {
        let mut refused = Vec::new();
        let mut first_err = None;
        for &(k, v) in &pending {
            match chip.with_override(k, v) {
                Ok(c) => chip = c,
                Err(e) => {
                    first_err.get_or_insert(e);
                    refused.push((k, v));
                }
            }
        }
        if refused.len() == pending.len() {
            return Err(first_err.expect("a refused override has its error").into());
        }
        pending = refused;
    }
    Ok(chip)
}

impl Job {
    /// The spec that builds this job again (every resolved field set): the job columns of sweep
    /// outputs and the flags of tuned configurations.
    pub fn to_spec(&self) -> JobSpec {
        match self {
            Job::Attention { workload: w, config: c, scope, direction } => JobSpec {
                kernel: Some(c.kernel),
                scope: Some(*scope),
                direction: Some(*direction),
                exp: Some(c.exp),
                experimental_scheduler: Some(c.experimental_scheduler),
                return_residuals: Some(c.return_residuals),
                // The family's own layout goes unsaid (it is what the library's API takes).
                input_layout: (c.input_layout != c.kernel.defaults().input_layout).then_some(c.input_layout),
                block_q_dkv: (*direction != Direction::Fwd).then_some(c.bwd.block_q_dkv),
                block_kv_dkv: (*direction != Direction::Fwd).then_some(c.bwd.block_kv_dkv),
                block_kv_dkv_compute: (*direction != Direction::Fwd).then_some(c.bwd.block_kv_dkv_compute),
                block_q_dq: (*direction != Direction::Fwd && !c.bwd.fused).then_some(c.bwd.block_q_dq),
                block_kv_dq: (*direction != Direction::Fwd && !c.bwd.fused).then_some(c.bwd.block_kv_dq),
                fused_bwd: (*direction != Direction::Fwd).then_some(c.bwd.fused),
                batch: Some(w.batch),
                heads: Some(w.q_heads),
                kv_heads: Some(w.kv_heads),
                q_len: Some(w.q_len),
                kv_len: Some(w.kv_len),
                head_dim: Some(w.head_dim),
                head_dim_v: Some(w.head_dim_v),
                mask: Some(w.mask.to_string()),
                block_q: Some(c.block_q),
                block_kv: Some(c.block_kv),
                block_kv_compute: Some(c.block_kv_compute),
                traversal: Some(c.traversal),
                masking: Some(c.masking),
                mask_source: Some(c.mask_source),
                tile_align: Some(c.tile_align),
                vmem_limit_mib: c.vmem_limit_bytes.map(|b| b as f64 / 1048576.0),
                ..Default::default()
            },
            Job::Matmul { workload: m, config: c, scope } => JobSpec {
                kernel: Some(c.kernel),
                scope: (*scope != Scope::Kernel).then_some(*scope),
                m: Some(m.m),
                n: Some(m.n),
                k: Some(m.k),
                block_m: Some(c.block_m),
                block_n: Some(c.block_n),
                block_k: Some(c.block_k),
                vmem_limit_mib: c.vmem_limit_bytes.map(|b| b as f64 / 1048576.0),
                ..Default::default()
            },
            // A kernel description's job is its file, runtime values and scope (no other field
            // applies to it).
            Job::Described(d) => JobSpec {
                kernel_ir: Some(d.file.clone()),
                runtime: d.runtime.clone(),
                scope: (d.scope != Scope::Kernel).then_some(d.scope),
                ..Default::default()
            },
        }
    }
}

impl Job {
    /// The kernel configuration of this job alone (family, blocks and options; no workload): the
    /// flags a tuned configuration is reported with.
    pub fn config_spec(&self) -> JobSpec {
        let s = self.to_spec();
        JobSpec {
            kernel: s.kernel,
            exp: s.exp,
            block_q: s.block_q,
            block_kv: s.block_kv,
            block_kv_compute: s.block_kv_compute,
            traversal: s.traversal,
            masking: s.masking,
            mask_source: s.mask_source,
            tile_align: s.tile_align,
            block_q_dkv: s.block_q_dkv,
            block_kv_dkv: s.block_kv_dkv,
            block_kv_dkv_compute: s.block_kv_dkv_compute,
            block_q_dq: s.block_q_dq,
            block_kv_dq: s.block_kv_dq,
            fused_bwd: s.fused_bwd,
            block_m: s.block_m,
            block_n: s.block_n,
            block_k: s.block_k,
            ..Default::default()
        }
    }
}

impl Job {
    /// The block sizes of an attention job as keyword arguments of JAX Splash's `BlockSizes`
    /// (`splash_attention_kernel.py`; tokamax's `SplashConfig` and op `Config` take the same
    /// names), ready to paste: `block_q=512, block_kv=1024, block_kv_compute=512`, plus the
    /// backward kernels' blocks and `use_fused_bwd_kernel` when the job runs the backward.
    /// `None` for matmul jobs.
    pub fn block_sizes_kwargs(&self) -> Option<String> {
        let Job::Attention { config: c, direction, .. } = self else { return None };
        let mut v =
            vec![format!("block_q={}", c.block_q), format!("block_kv={}", c.block_kv), format!("block_kv_compute={}", c.block_kv_compute)];
        if *direction != Direction::Fwd {
            v.push(format!("block_q_dkv={}", c.bwd.block_q_dkv));
            v.push(format!("block_kv_dkv={}", c.bwd.block_kv_dkv));
            v.push(format!("block_kv_dkv_compute={}", c.bwd.block_kv_dkv_compute));
            if !c.bwd.fused {
                v.push(format!("block_q_dq={}", c.bwd.block_q_dq));
                v.push(format!("block_kv_dq={}", c.bwd.block_kv_dq));
            }
            v.push(format!("use_fused_bwd_kernel={}", if c.bwd.fused { "True" } else { "False" }));
        }
        Some(v.join(", "))
    }

    /// [`Job::block_sizes_kwargs`] as the call of the job's library config that takes them:
    /// tokamax's `SplashConfig(...)` (`tokamax/_src/ops/experimental/tpu/splash_attention/
    /// splash_attention_kernel.py`) for tokamax-splash, JAX Splash's `BlockSizes(...)` for the
    /// others. `None` for matmul jobs.
    pub fn block_sizes_call(&self) -> Option<String> {
        let Job::Attention { config: c, .. } = self else { return None };
        let api = if c.kernel == tpusim_kernel::Kernel::TokamaxSplash { "SplashConfig" } else { "BlockSizes" };
        self.block_sizes_kwargs().map(|k| format!("{api}({k})"))
    }
}

impl JobSpec {
    /// The command-line flags that give this spec's fields, e.g. `--block-q 512 --tile-align`.
    pub fn to_flags(&self) -> String {
        let mut out = Vec::new();
        for (k, v) in self.set_fields() {
            let flag = format!("--{}", k.replace('_', "-"));
            match v {
                serde_json::Value::Bool(true) => out.push(flag),
                serde_json::Value::Bool(false) => out.push(format!("{flag}=false")),
                serde_json::Value::String(s) => out.push(format!("{flag} {}", shell_word(&s))),
                serde_json::Value::Array(a) => out.extend(a.iter().map(|x| format!("{flag} {}", shell_word(x.as_str().unwrap_or_default())))),
                other => out.push(format!("{flag} {other}")),
            }
        }
        out.join(" ")
    }
}

/// A value as one shell word: as it is when it holds only characters no shell treats specially,
/// else in single quotes (masks such as `per-head[2*causal;band:8]` or `a&b`).
fn shell_word(s: &str) -> String {
    let plain = !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "_-.,:+@/=%".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_spec_is_the_video_workload_with_the_default_family() {
        let chip = ChipModel::preset("v6e").unwrap();
        match JobSpec::default().build(&chip).unwrap() {
            Job::Attention { workload, config, .. } => {
                assert_eq!(workload, AttentionCall::video_default());
                assert_eq!(config.kernel, DEFAULT_KERNEL);
                let d = DEFAULT_KERNEL.defaults();
                assert_eq!((config.block_q, config.block_kv, config.traversal), (d.blocks.q, d.blocks.kv, d.traversal));
            }
            _ => panic!("expected attention"),
        }
    }

    #[test]
    fn unknown_words_and_keys_are_named() {
        let e = toml::from_str::<JobSpec>("traversal = \"zigzag\"").unwrap_err().to_string();
        assert!(e.contains("zigzag") && e.contains("full-grid or compact"), "{e}");
        let e = toml::from_str::<JobSpec>("heads = 4\nbogus = 1").unwrap_err().to_string();
        assert!(e.contains("bogus"), "{e}");
    }

    #[test]
    fn overlay_prefers_the_top_and_concatenates_overrides() {
        let a = JobSpec { heads: Some(4), seq_len: Some(1024), set: vec!["a=1".into()], ..Default::default() };
        let b = JobSpec { heads: Some(8), set: vec!["b=2".into()], ..Default::default() };
        let c = a.overlay(&b);
        assert_eq!((c.heads, c.seq_len), (Some(8), Some(1024)));
        assert_eq!(c.set, vec!["a=1".to_string(), "b=2".to_string()]);
        let d = a.overlay(&JobSpec { q_len: Some(64), kv_len: Some(64), ..Default::default() });
        assert_eq!((d.seq_len, d.q_len), (None, Some(64)));
    }

    #[test]
    fn fields_come_from_the_struct_and_render_per_front_end() {
        let f = JobSpec::fields();
        assert!(f.iter().any(|x| x == "block_kv_compute") && f.iter().any(|x| x == "chip"));
        let msg = "`block_kv_compute` = 768: must divide `block_kv` (2048); `other` stays";
        assert_eq!(render_fields(msg, FieldStyle::Flag), "--block-kv-compute = 768: must divide --block-kv (2048); `other` stays");
        assert_eq!(render_fields(msg, FieldStyle::Key), "block_kv_compute = 768: must divide block_kv (2048); `other` stays");
    }

    #[test]
    fn foreign_fields_are_errors() {
        let chip = ChipModel::preset("v6e").unwrap();
        let e = JobSpec { kernel: Some(Kernel::PallasMatmul), heads: Some(2), ..Default::default() }.build(&chip).unwrap_err().to_string();
        assert!(e.contains("`heads`") && e.contains("pallas-matmul"), "{e}");
        let e = JobSpec { m: Some(2), ..Default::default() }.build(&chip).unwrap_err().to_string();
        assert!(e.contains("`m`") && e.contains("(an attention kernel)"), "{e}");
    }

    #[test]
    fn seq_len_errors_name_seq_len() {
        let chip = ChipModel::preset("v6e").unwrap();
        let e = JobSpec { seq_len: Some(100_000_000_000), ..Default::default() }.build(&chip).unwrap_err().to_string();
        assert!(e.contains("`seq_len`") && !e.contains("`q_len`"), "{e}");
    }

    #[test]
    fn to_spec_rebuilds_the_same_job() {
        let chip = ChipModel::preset("v6e").unwrap();
        let s = JobSpec { seq_len: Some(4096), mask: Some("causal".into()), block_q: Some(512), ..Default::default() };
        let job = s.build(&chip).unwrap();
        assert_eq!(job.to_spec().build(&chip).unwrap(), job);
    }
}
