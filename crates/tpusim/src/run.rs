//! `tpusim run` and `tpusim chip`.

use crate::InputError;
use clap::{Args, Subcommand, ValueEnum};
use tpusim_chip::ChipModel;
use tpusim_report::{run, JobSpec, Report};

#[derive(Subcommand, Debug)]
pub enum ChipCommand {
    /// Print a chip model: every parameter with its unit and source (or the rows it was fitted to).
    Show {
        /// Preset name (v6e, v5e, v5p, v4, v7x) or path to a chip TOML.
        chip: String,
        /// Change a parameter, e.g. --set hbm.bandwidth_gb_per_s=3276 (repeatable).
        #[arg(long = "set", value_name = "SECTION.FIELD=VALUE")]
        set: Vec<String>,
        /// Output format (json writes a chip model TOML-equivalent object).
        #[arg(long, value_enum, default_value_t = Format::Table)]
        format: Format,
    },
    /// List the built-in chip models.
    List,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Json,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Kernel {
    /// Splash-style flash attention (forward).
    Splash,
    /// Blocked Pallas matmul.
    Matmul,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum TraversalArg {
    FullGrid,
    Compact,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum MaskingArg {
    All,
    Partial,
    None,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum MaskSourceArg {
    Computed,
    Loaded,
}

fn word<T: ValueEnum>(v: &T) -> String {
    v.to_possible_value().map(|p| p.get_name().to_string()).unwrap_or_default()
}

/// Flags of `tpusim run`: the job flags plus output options.
#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub job: JobArgs,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Also write the simulated execution as a Chrome trace (open in Perfetto or
    /// chrome://tracing): one track per unit, one event per tile operation, DMA and step
    /// overhead, with head, q block, kv block and tile kind as arguments.
    #[arg(long, value_name = "FILE.json")]
    pub timeline: Option<String>,
    /// Only grid steps START..END (END exclusive) in the timeline, e.g. 0:16.
    #[arg(long, value_name = "START:END", requires = "timeline")]
    pub timeline_steps: Option<String>,
    /// Only the steps of one batch x head index (grid coordinate 0) in the timeline.
    #[arg(long, value_name = "H", requires = "timeline")]
    pub timeline_head: Option<u32>,
}

/// The job flags shared by `tpusim run` and `tpusim tune`; each maps onto a [`JobSpec`] field.
#[derive(Args, Debug)]
pub struct JobArgs {
    /// Read the job from a trace file (TOML with the same keys as these flags); flags given on
    /// the command line override it. Examples in traces/.
    #[arg(long)]
    pub trace: Option<String>,
    /// Chip: preset name (v6e, v5e, v5p, v4, v7x) or path to a chip TOML [default: v6e].
    #[arg(long)]
    pub chip: Option<String>,
    /// Change a chip parameter for this run, e.g. --set hbm.bandwidth_gb_per_s=3276 (repeatable).
    #[arg(long = "set", value_name = "SECTION.FIELD=VALUE")]
    pub set: Vec<String>,
    /// Kernel to simulate [default: splash].
    #[arg(long, value_enum)]
    pub kernel: Option<Kernel>,
    /// Batch size [default: 1].
    #[arg(long)]
    pub batch: Option<u64>,
    /// Query heads [default: 10].
    #[arg(long)]
    pub heads: Option<u64>,
    /// Key/value heads (fewer than --heads is GQA/MQA) [default: --heads].
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
    /// Mask: full, causal, local:L,R, band:W, sink:S, chunked:C, video:F,H,W:wf,wh,ww[@order],
    /// sta:F,H,W:kf,kh,kw:tf,th,tw[@order] (order @frame, @position or @tiles:tf,th,tw),
    /// per-head[N*M;...], file:PATH; + is union, & is intersection, ( ) groups.
    /// Example: band:15000+sink:3600 [default: full].
    #[arg(long)]
    pub mask: Option<String>,
    /// Rows of q per block (multiple of 8) [default: 3024 for the 75,600-token, head_dim-128
    /// shape (MaxDiffusion's v6e blocks), else min(2048, q_len rounded up to 8)].
    #[arg(long)]
    pub block_q: Option<u64>,
    /// Rows of k/v per block (multiple of 128) [default: 2048 for the 75,600-token shape, else
    /// min(2048, kv_len rounded up to 128)].
    #[arg(long)]
    pub block_kv: Option<u64>,
    /// Width of the inner matmul/softmax sub-tile (multiple of 128 dividing --block-kv)
    /// [default: --block-kv, or the largest such width whose tiling fits the VMEM limit].
    #[arg(long)]
    pub block_kv_compute: Option<u64>,
    /// Which grid steps run: full-grid (JAX Splash) or compact (non-empty tiles only) [default: full-grid].
    #[arg(long, value_enum)]
    pub traversal: Option<TraversalArg>,
    /// Which visited tiles apply the element-wise mask [default: all].
    #[arg(long, value_enum)]
    pub masking: Option<MaskingArg>,
    /// How the mask is evaluated: computed from iota, or loaded as int8 blocks [default: computed].
    #[arg(long, value_enum)]
    pub mask_source: Option<MaskSourceArg>,
    /// Round the mask to whole tiles (keep a tile when at least half its pairs are kept).
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
    /// Matmul block M [default: the first of 1024/1024/1024, 512/1024/1024, 512, 256, 128 (M/N/K
    /// blocks, clamped to the sizes) that fits the VMEM limit].
    #[arg(long)]
    pub block_m: Option<u64>,
    /// Matmul block N [default: see --block-m].
    #[arg(long)]
    pub block_n: Option<u64>,
    /// Matmul block K [default: see --block-m].
    #[arg(long)]
    pub block_k: Option<u64>,
}

impl JobArgs {
    /// The job these flags describe (a trace file, if given, overlaid by the flags).
    pub fn spec(&self) -> Result<JobSpec, InputError> {
        let flags = JobSpec {
            chip: self.chip.clone(),
            set: self.set.clone(),
            kernel: self.kernel.as_ref().map(word),
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
            traversal: self.traversal.as_ref().map(word),
            masking: self.masking.as_ref().map(word),
            mask_source: self.mask_source.as_ref().map(word),
            tile_align: self.tile_align.then_some(true),
            vmem_limit_mib: self.vmem_limit_mib,
            m: self.m,
            n: self.n,
            k: self.k,
            block_m: self.block_m,
            block_n: self.block_n,
            block_k: self.block_k,
        };
        Ok(match &self.trace {
            Some(path) => JobSpec::from_toml_file(path)?.overlay(&flags),
            None => flags,
        })
    }
}

/// Runs a spec and returns its report.
pub fn report(spec: &JobSpec) -> Result<Report, InputError> {
    let chip = spec.chip()?;
    let job = spec.build(&chip)?;
    let r = run(&chip, &job)?;
    Ok(Report::from_run(&r))
}

pub fn cmd_run(a: &RunArgs) -> Result<String, InputError> {
    cmd_run_inner(a).map_err(|InputError(e)| match &a.job.trace {
        // Name the trace too: its keys are the flags without the leading dashes.
        Some(t) if !e.contains(t.as_str()) => InputError(format!("with --trace {t}: {e}")),
        _ => InputError(e),
    })
}

fn cmd_run_inner(a: &RunArgs) -> Result<String, InputError> {
    let Some(path) = &a.timeline else {
        let rep = report(&a.job.spec()?)?;
        return Ok(match a.format {
            Format::Json => rep.to_json(),
            Format::Table => rep.to_table(),
        });
    };
    let window = tpusim_plot::timeline::Window {
        steps: a.timeline_steps.as_deref().map(|s| tpusim_plot::timeline::Window::parse_steps(s, "--timeline-steps")).transpose()?,
        head: a.timeline_head,
    };
    let spec = a.job.spec()?;
    let chip = spec.chip()?;
    let job = spec.build(&chip)?;
    let r = run(&chip, &job)?;
    let sum = tpusim_plot::timeline::write_chrome_trace(&r, &window, std::path::Path::new(path), "--timeline")?;
    let rep = Report::from_run(&r);
    Ok(match a.format {
        Format::Json => rep.to_json(),
        Format::Table => {
            let steps = match sum.step_range {
                Some((f, l)) => format!("steps {f} to {l}"),
                None => "no steps".into(),
            };
            format!(
                "{}\n  timeline     {path}: {} events, {} of {} grid steps ({steps}); open in Perfetto or chrome://tracing\n",
                rep.to_table().trim_end(),
                sum.events,
                sum.steps,
                sum.run_steps
            )
        }
    })
}

pub fn cmd_chip(c: &ChipCommand) -> Result<String, InputError> {
    match c {
        ChipCommand::List => Ok(tpusim_chip::PRESETS
            .iter()
            .map(|p| match ChipModel::preset(p) {
                Ok(c) => format!("{p:<5} {}\n", c.description),
                Err(e) => format!("{p:<5} (invalid: {e})\n"),
            })
            .collect()),
        ChipCommand::Show { chip, set, format } => {
            let chip = JobSpec { chip: Some(chip.clone()), set: set.clone(), ..Default::default() }.chip()?;
            Ok(match format {
                Format::Json => serde_json::to_string_pretty(&chip).map_err(|e| InputError(e.to_string()))?,
                Format::Table => {
                    let mut s = format!("{}: {}\n", chip.name, chip.description);
                    s.push_str(&format!(
                        "derived: peak {:.1} TFLOP/s bf16, sustained HBM {:.0} GB/s, {} elements per vector register\n\n",
                        chip.peak_flops() / 1e12,
                        chip.hbm_bytes_per_cycle() * chip.clock_hz() / 1e9,
                        chip.vreg_elems()
                    ));
                    s.push_str(&format!("{:<36} {:>10} {:<28} {}\n", "field", "value", "unit", "source / fitted to"));
                    for r in chip.rows() {
                        s.push_str(&format!("{:<36} {:>10} {:<28} {}\n", r.field, r.value, r.unit, r.provenance));
                    }
                    s
                }
            })
        }
    }
}
