//! `tpusim sweep`, `tpusim merge` and `tpusim tune` (issue 5): flags and output only; the work is
//! in the `tpusim-sweep` crate. Sweep files, output columns, resume and shards are documented in
//! `studies/README.md`.

use crate::InputError;
use clap::{Args, ValueEnum};
use tpusim_report::JobSpec;
use tpusim_sweep::exec::default_out;
use tpusim_sweep::{Format, Shard, SweepDef, SweepOptions, TuneOptions};

/// Output format of a sweep.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum SweepFormat {
    /// Comma-separated values (a `#` header line, then column names).
    Csv,
    /// JSON lines (a header object, then one object per point).
    Jsonl,
}

/// Flags of `tpusim sweep`.
#[derive(Args, Debug)]
pub struct SweepArgs {
    /// Sweep file (TOML: [base] job, [axes] value lists or [[points]]; see studies/README.md).
    pub file: String,
    /// Output file [default: the sweep file's name with .csv or .jsonl in the current folder;
    /// shards add .shard-I-of-N].
    #[arg(long, short)]
    pub out: Option<String>,
    /// Output format [default: from --out's extension (.jsonl/.json: jsonl), else csv].
    #[arg(long, value_enum)]
    pub format: Option<SweepFormat>,
    /// Evaluate only slice I of N (points with index % N == I), e.g. --shard $SLURM_ARRAY_TASK_ID/8;
    /// join the slices with `tpusim merge`.
    #[arg(long, value_name = "I/N")]
    pub shard: Option<String>,
    /// Change a chip parameter of the base job, e.g. --set hbm.bandwidth_gb_per_s=3276
    /// (repeatable; axes on the same field override it).
    #[arg(long = "set", value_name = "SECTION.FIELD=VALUE")]
    pub set: Vec<String>,
    /// Worker threads [default: one per core].
    #[arg(long, short)]
    pub jobs: Option<usize>,
    /// Do not draw a progress bar (it is drawn only when stderr is a terminal anyway).
    #[arg(long)]
    pub no_progress: bool,
    /// Ignore an existing output or OUT.partial and evaluate every point again.
    #[arg(long)]
    pub restart: bool,
}

/// Flags of `tpusim merge`.
#[derive(Args, Debug)]
pub struct MergeArgs {
    /// Shard output files (of one sweep, in any order).
    #[arg(required = true)]
    pub files: Vec<String>,
    /// Merged output file (byte-for-byte the unsharded sweep's output).
    #[arg(long, short)]
    pub out: String,
}

/// Flags of `tpusim tune`: the job flags of `tpusim run` (a block size or option given here is
/// held fixed; the others are searched) and the search's own.
#[derive(Args, Debug)]
pub struct TuneArgs {
    /// Read the job from a trace file (TOML with the same keys as these flags); flags given on
    /// the command line override it.
    #[arg(long)]
    pub trace: Option<String>,
    /// Chip: preset name (v6e, v5e, v5p, v4, v7x) or path to a chip TOML [default: v6e].
    #[arg(long)]
    pub chip: Option<String>,
    /// Change a chip parameter, e.g. --set hbm.bandwidth_gb_per_s=3276 (repeatable).
    #[arg(long = "set", value_name = "SECTION.FIELD=VALUE")]
    pub set: Vec<String>,
    /// Kernel [default: splash].
    #[arg(long, value_parser = ["splash", "matmul"])]
    pub kernel: Option<String>,
    /// Batch size [default: 1].
    #[arg(long)]
    pub batch: Option<u64>,
    /// Query heads [default: 10].
    #[arg(long)]
    pub heads: Option<u64>,
    /// Key/value heads [default: --heads].
    #[arg(long)]
    pub kv_heads: Option<u64>,
    /// Sequence length of both q and kv [default: 75600].
    #[arg(long, conflicts_with_all = ["q_len", "kv_len"])]
    pub seq_len: Option<u64>,
    /// Query length.
    #[arg(long)]
    pub q_len: Option<u64>,
    /// Key/value length.
    #[arg(long)]
    pub kv_len: Option<u64>,
    /// Head dimension of q and k [default: 128].
    #[arg(long)]
    pub head_dim: Option<u64>,
    /// Head dimension of v and o [default: --head-dim].
    #[arg(long)]
    pub head_dim_v: Option<u64>,
    /// Mask, as for `tpusim run` (e.g. band:15000+sink:3600) [default: full].
    #[arg(long)]
    pub mask: Option<String>,
    /// Hold block_q fixed [default: searched].
    #[arg(long)]
    pub block_q: Option<u64>,
    /// Hold block_kv fixed [default: searched].
    #[arg(long)]
    pub block_kv: Option<u64>,
    /// Hold block_kv_compute fixed [default: searched].
    #[arg(long)]
    pub block_kv_compute: Option<u64>,
    /// Hold the traversal fixed [default: searched].
    #[arg(long, value_parser = ["full-grid", "compact"])]
    pub traversal: Option<String>,
    /// Hold the masking fixed [default: searched].
    #[arg(long, value_parser = ["all", "partial", "none"])]
    pub masking: Option<String>,
    /// Hold the mask source fixed [default: searched].
    #[arg(long, value_parser = ["computed", "loaded"])]
    pub mask_source: Option<String>,
    /// Round the mask to whole tiles (held fixed; see --allow-approximate to search it).
    #[arg(long)]
    pub tile_align: bool,
    /// Scoped VMEM limit, MiB [default: the chip's].
    #[arg(long)]
    pub vmem_limit_mib: Option<f64>,
    /// Matmul M (with --kernel matmul).
    #[arg(long)]
    pub m: Option<u64>,
    /// Matmul N.
    #[arg(long)]
    pub n: Option<u64>,
    /// Matmul K.
    #[arg(long)]
    pub k: Option<u64>,
    /// Hold matmul block M fixed [default: searched].
    #[arg(long)]
    pub block_m: Option<u64>,
    /// Hold matmul block N fixed [default: searched].
    #[arg(long)]
    pub block_n: Option<u64>,
    /// Hold matmul block K fixed [default: searched].
    #[arg(long)]
    pub block_k: Option<u64>,
    /// Configurations to list.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Also rank configurations that skip masking on partial tiles (their results are wrong).
    #[arg(long)]
    pub allow_inexact: bool,
    /// Also search --tile-align (rounds the mask to whole tiles: a different mask).
    #[arg(long)]
    pub allow_approximate: bool,
    /// Best (block_q, block_kv) pairs refined over every block_kv_compute and option.
    #[arg(long, default_value_t = 12)]
    pub refine: usize,
    /// Worker threads [default: one per core].
    #[arg(long, short)]
    pub jobs: Option<usize>,
    /// Do not draw progress bars (they are drawn only when stderr is a terminal anyway).
    #[arg(long)]
    pub no_progress: bool,
    /// Output format.
    #[arg(long, value_parser = ["table", "json"], default_value = "table")]
    pub format: String,
}

impl TuneArgs {
    /// The job these flags describe (a trace file, if given, overlaid by the flags).
    // `..Default::default()` keeps this compiling when JobSpec gains fields (other owners).
    #[allow(clippy::needless_update)]
    fn spec(&self) -> Result<JobSpec, InputError> {
        let flags = JobSpec {
            chip: self.chip.clone(),
            set: self.set.clone(),
            kernel: self.kernel.clone(),
            batch: self.batch,
            heads: self.heads,
            kv_heads: self.kv_heads,
            seq_len: self.seq_len,
            q_len: self.q_len,
            kv_len: self.kv_len,
            head_dim: self.head_dim,
            head_dim_v: self.head_dim_v,
            mask: self.mask.clone(),
            block_q: self.block_q,
            block_kv: self.block_kv,
            block_kv_compute: self.block_kv_compute,
            traversal: self.traversal.clone(),
            masking: self.masking.clone(),
            mask_source: self.mask_source.clone(),
            tile_align: self.tile_align.then_some(true),
            vmem_limit_mib: self.vmem_limit_mib,
            m: self.m,
            n: self.n,
            k: self.k,
            block_m: self.block_m,
            block_n: self.block_n,
            block_k: self.block_k,
            ..Default::default()
        };
        Ok(match &self.trace {
            Some(path) => JobSpec::from_toml_file(path)?.overlay(&flags),
            None => flags,
        })
    }
}

pub fn cmd_sweep(a: &SweepArgs) -> Result<String, InputError> {
    let def = SweepDef::from_file(&a.file, &a.set)?;
    let shard = match &a.shard {
        Some(s) => Shard::parse(s)?,
        None => Shard::WHOLE,
    };
    let format = match (a.format, &a.out) {
        (Some(SweepFormat::Csv), _) => Format::Csv,
        (Some(SweepFormat::Jsonl), _) => Format::Jsonl,
        (None, Some(o)) => Format::from_path(o),
        (None, None) => Format::Csv,
    };
    let out = a.out.clone().unwrap_or_else(|| default_out(&a.file, shard, format));
    let opts =
        SweepOptions { format, shard, jobs: a.jobs, progress: !a.no_progress, restart: a.restart, ..SweepOptions::new(&out) };
    Ok(tpusim_sweep::run_sweep(&def, &opts)?.to_string())
}

pub fn cmd_merge(a: &MergeArgs) -> Result<String, InputError> {
    Ok(tpusim_sweep::merge(&a.files, &a.out)?.to_string())
}

pub fn cmd_tune(a: &TuneArgs) -> Result<String, InputError> {
    let spec = a.spec()?;
    let opts = TuneOptions {
        top: a.top,
        allow_inexact: a.allow_inexact,
        allow_approximate: a.allow_approximate,
        refine: a.refine,
        jobs: a.jobs,
        progress: !a.no_progress,
    };
    let r = tpusim_sweep::tune(&spec, &opts)?;
    Ok(if a.format == "json" { r.to_json() } else { r.to_table() })
}
