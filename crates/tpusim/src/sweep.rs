//! `tpusim sweep`, `tpusim merge` and `tpusim tune` (issue 5): flags and output only; the work is
//! in the `tpusim-sweep` crate. Sweep files, output columns, resume and shards are documented in
//! `studies/README.md`.

use crate::error::CliError;
use clap::{Args, ValueEnum};
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
    /// Sweep file (TOML: [base] job, [axes] value lists or [[points]]; or kernel description
    /// files, `kernel_ir = [...]`, over chips and chip fields; see studies/README.md).
    pub file: String,
    /// Output file [default: the sweep file's name with .csv or .jsonl in the current folder;
    /// shards add .shard-I-of-N].
    #[arg(long, short)]
    pub out: Option<String>,
    /// Output format [default: from --out's extension (.jsonl/.json: jsonl), else csv].
    #[arg(long, value_enum)]
    pub format: Option<SweepFormat>,
    /// Evaluate only slice I of N (points with index % N == I), e.g. --shard 3/8; join the slices
    /// with `tpusim merge`. `auto` reads I and N from a Slurm job array (SLURM_ARRAY_TASK_ID,
    /// _MIN, _STEP, _COUNT / _MAX: any range such as --array=1-16) or a Kubernetes Indexed Job
    /// (JOB_COMPLETION_INDEX, with N from auto/N or TPUSIM_SHARD_COUNT).
    #[arg(long, value_name = "I/N|auto[/N]")]
    pub shard: Option<String>,
    /// Change a chip parameter of the base job, e.g. --set hbm.bandwidth_gb_per_s=3276
    /// (repeatable; axes on the same field override it).
    #[arg(long = "set", value_name = "SECTION.FIELD=VALUE")]
    pub set: Vec<String>,
    /// Worker threads [default: one per core].
    #[arg(long, short, allow_negative_numbers = true, value_parser = thread_count)]
    pub jobs: Option<usize>,
    /// Print no progress on stderr (a bar on a terminal; otherwise a plain line every 10 s, or
    /// every TPUSIM_PROGRESS_SECS seconds).
    #[arg(long)]
    pub no_progress: bool,
    /// Ignore an existing output or OUT.partial and evaluate every point again.
    #[arg(long)]
    pub restart: bool,
    /// Replace an existing --out (or OUT.partial) that is not this sweep's: another sweep
    /// definition (an edited sweep file included), shard or format, or a file tpusim did not
    /// write. Without it such a file is refused, never replaced.
    #[arg(long)]
    pub force: bool,
    /// Add each point's what-if table: `bottleneck` (`tpusim run`'s rule: the unit whose 2x
    /// speed-up gains 10% or more, untied; else the tied or critical-path unit), `co_bound` and a
    /// `gain_2x_UNIT` column per unit (1 - t'/t with that unit alone twice as fast) and per step
    /// and DMA mechanism (`gain_2x_dma_latency`, `gain_2x_dma_issue`, `gain_2x_dmas_in_flight`).
    /// Nine re-timings a point; without it rows have no bottleneck column.
    #[arg(long = "what-if-2x")]
    pub what_if_2x: bool,
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
    /// Replace an existing --out that is not an output of this sweep.
    #[arg(long)]
    pub force: bool,
}

/// Flags of `tpusim tune`: the job flags of `tpusim run` (a block size or option given here is
/// held fixed; the others are searched) and the search's own.
#[derive(Args, Debug)]
pub struct TuneArgs {
    /// The job (--kernel-ir is refused: a kernel read from its Mosaic IR has the block sizes its
    /// lowering fixed; rank candidates with `tpusim.jax.tune(make_fn, candidates, *args)`, as
    /// the message says).
    #[command(flatten)]
    pub job: crate::run::JobArgs,
    /// Configurations to list.
    #[arg(long, default_value_t = 10, allow_negative_numbers = true, value_parser = at_least_one)]
    pub top: usize,
    /// Also rank configurations that skip masking on partial tiles (their results are wrong).
    #[arg(long)]
    pub allow_inexact: bool,
    /// Also search --tile-align (rounds the mask to whole tiles: a different mask).
    #[arg(long)]
    pub allow_approximate: bool,
    /// Best (block_q, block_kv) pairs refined over every block_kv_compute and option.
    #[arg(long, default_value_t = 12, allow_negative_numbers = true, value_parser = at_least_one)]
    pub refine: usize,
    /// Worker threads [default: one per core].
    #[arg(long, short, allow_negative_numbers = true, value_parser = thread_count)]
    pub jobs: Option<usize>,
    /// Simulate every valid configuration, also those whose latency lower bound (per-unit busy
    /// time and grid-step overhead, no scheduling) shows they cannot rank: the same ranking,
    /// slower.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    pub exhaustive: Option<bool>,
    /// Print no progress on stderr (bars on a terminal; otherwise a plain line every 10 s, or
    /// every TPUSIM_PROGRESS_SECS seconds).
    #[arg(long)]
    pub no_progress: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t = crate::run::Format::Table)]
    pub format: crate::run::Format,
    /// Print the ranked configurations as the kernel's config call ready to paste (JAX Splash's
    /// `BlockSizes(...)`, tokamax's `SplashConfig(...)`; one line each, the rank, latency and
    /// other options in a comment, a design what-if starred), instead of --format.
    #[arg(long)]
    pub block_sizes: bool,
}

/// The value parser of a count flag (`--jobs`, `--top`, `--refine`): a whole number of at least 1,
/// or an error saying so (`-1` included: the flag takes negative numbers as values so that they
/// are named, not mistaken for flags).
/// The value parser of `--jobs`: a whole number from 1 to [`tpusim_sweep::MAX_JOBS`].
pub fn thread_count(s: &str) -> Result<usize, String> {
    let max = tpusim_sweep::MAX_JOBS;
    match s.trim().parse::<usize>() {
        Ok(v) if (1..=max).contains(&v) => Ok(v),
        _ => Err(format!("expected a whole number of threads from 1 to {max}")),
    }
}

pub fn at_least_one(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(v) if v >= 1 => Ok(v),
        _ => Err("expected a whole number from 1".to_string()),
    }
}

pub fn cmd_sweep(a: &SweepArgs) -> Result<String, CliError> {
    let def = SweepDef::from_file(&a.file, &a.set)?;
    let choice = match &a.shard {
        Some(s) => Shard::choose(s, &|k| std::env::var(k).ok())?,
        None => tpusim_sweep::ShardChoice { shard: Shard::WHOLE, from: None },
    };
    let shard = choice.shard;
    let format = match (a.format, &a.out) {
        (Some(SweepFormat::Csv), _) => Format::Csv,
        (Some(SweepFormat::Jsonl), _) => Format::Jsonl,
        (None, Some(o)) => {
            // The format follows the extension: an extension that names neither is refused, not
            // silently written as CSV.
            let ext = std::path::Path::new(o).extension().map(|e| e.to_string_lossy().to_ascii_lowercase());
            if let Some(e) = ext.filter(|e| !["csv", "jsonl", "ndjson", "json"].contains(&e.as_str())) {
                return Err(CliError::input(format!(
                    "--out {o}: the format follows the extension, and .{e} is neither CSV (.csv) nor JSON lines (.jsonl, .ndjson, .json); name the file so, or give --format csv|jsonl"
                )));
            }
            Format::from_path(o)
        }
        (None, None) => Format::Csv,
    };
    let out = a.out.clone().unwrap_or_else(|| default_out(&a.file, shard, format));
    let opts = SweepOptions {
        format,
        shard,
        jobs: a.jobs,
        progress: !a.no_progress,
        restart: a.restart,
        force: a.force,
        what_if_2x: a.what_if_2x,
        cancel: Some(crate::interrupt::stop_on_interrupt(
            "interrupted: finishing the points running (Ctrl-C again to exit at once)",
            "interrupted again: exiting without waiting for the running points",
        )),
        ..SweepOptions::new(&out)
    };
    let summary = tpusim_sweep::run_sweep(&def, &opts).map_err(|e| match e {
        e @ tpusim_sweep::SweepError::Interrupted { .. } => CliError::Interrupted(e.to_string()),
        e => e.into(),
    })?;
    // (Points that set an option their family has no setting for, a mask computed that Splash
    // only loads among them, are noted by the summary and named in the design_whatif column.)
    Ok(match choice.from {
        Some(from) => format!("note: --shard auto: shard {shard} from {from}\n{summary}"),
        None => summary.to_string(),
    })
}

pub fn cmd_merge(a: &MergeArgs) -> Result<String, CliError> {
    Ok(tpusim_sweep::merge(&a.files, &a.out, a.force)?.to_string())
}

/// What an interrupted `tpusim tune` says (exit code 130).
const TUNE_INTERRUPTED: &str = "tune: interrupted before every candidate was simulated, so nothing is ranked and nothing was written; to search faster, narrow it (a shorter --seq-len or fewer --heads for the ranking, or --top 1), or time chosen blocks with `tpusim run --block-q ... --block-kv ...`, or write the candidates as a sweep file (`tpusim sweep` keeps its rows across a Ctrl-C and resumes)";

/// Why `tpusim tune --kernel-ir` is refused, and what to run instead.
pub const TUNE_KERNEL_IR: &str = "not with tpusim tune: a kernel read from its Mosaic IR has the block sizes its lowering fixed (block sizes live in the lowering, so each candidate is another lowering); rank candidates in Python with tpusim.jax.tune(make_fn, candidates, *args, chip=\"v6e\"), which lowers make_fn(candidate) for each and returns [(candidate, latency_ms, report)] fastest first, e.g. tpusim.jax.tune(lambda bq: make_kernel(block_q=bq), [256, 512, 1024], q, k, v)";

pub fn cmd_tune(a: &TuneArgs) -> Result<String, CliError> {
    if let Some(f) = &a.job.spec()?.kernel_ir {
        return Err(CliError::input(format!("--kernel-ir {f}: {TUNE_KERNEL_IR}")));
    }
    // With no job flag: the default job's workload and kernel, its block sizes searched.
    let spec = if a.job.is_default() { tpusim_job::tune_default_or(a.job.job.clone()) } else { a.job.spec()? };
    // ... compared with the default job at its own blocks, as `tpusim run` runs it.
    let baseline = if a.job.is_default() { tpusim_job::tune_baseline(&a.job.job) } else { None };
    let opts = TuneOptions {
        top: a.top,
        allow_inexact: a.allow_inexact,
        allow_approximate: a.allow_approximate,
        refine: a.refine,
        jobs: a.jobs,
        progress: !a.no_progress,
        cancel: Some(crate::interrupt::stop_on_interrupt(
            "interrupted: stopping the search (Ctrl-C again to exit at once)",
            "interrupted again: exiting without waiting for the running candidates",
        )),
        exhaustive: a.exhaustive.unwrap_or(false),
        baseline,
    };
    let r = tpusim_sweep::tune(&spec, &opts).map_err(|e| match e {
        _ if opts.cancelled() => CliError::Interrupted(TUNE_INTERRUPTED.into()),
        tpusim_sweep::SweepError::Spec(e) => a.job.error(e),
        other => other.into(),
    })?;
    if a.block_sizes {
        return Ok(r.to_block_sizes());
    }
    Ok(match a.format {
        crate::run::Format::Json => r.to_json(),
        crate::run::Format::Table => r.to_table(),
    })
}
