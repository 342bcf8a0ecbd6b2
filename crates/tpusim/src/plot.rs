//! `tpusim plot KIND`: figures as PNG or SVG. Each kind is a subcommand with its own flags (a
//! flag that does not apply to a kind is an error). Drawing lives in `tpusim-plot`; this module
//! maps flags onto it.

use crate::error::CliError;
use crate::run::JobArgs;
use clap::{Args, Subcommand};
use tpusim_plot::breakdown::BreakdownFigure;
use tpusim_plot::gantt::GanttFigure;
use tpusim_plot::heatmap::{HeatmapFigure, HeatmapSpec};
use tpusim_plot::jobs::{self, JobRun};
use tpusim_plot::layer::{self, LayerBreakdownFigure, Mark, SpeedupFigure};
use tpusim_plot::roofline::RooflineFigure;
use tpusim_plot::sweep::{SweepFigure, SweepSpec};
use tpusim_plot::table::Table;
use tpusim_plot::tiles::TilesFigure;
use tpusim_plot::timeline::{self, Window};
use tpusim_plot::validation::{parse_bands, ValidationFigure, ValidationSpec};
use tpusim_plot::{render, Figure, Output};
use tpusim_job::JobSpec;
use tpusim_workload::tiles::TileGrid;

/// Flags of `tpusim plot`.
#[derive(Args, Debug)]
#[command(
    after_help = "Examples (plots/make.sh regenerates the case-study figures):\n  tpusim plot roofline --trace plots/jobs/dense.toml --trace plots/jobs/sparse.toml --out roof.png\n  tpusim plot tiles --trace plots/jobs/sparse.toml --tile-align --out tiles.svg\n  tpusim plot timeline --trace plots/jobs/dense.toml --steps 10:13 --out timeline.png\n  tpusim plot sweep --input sweep.csv --x block_kv --y latency_ms --series block_q --out sweep.png"
)]
pub struct PlotArgs {
    #[command(subcommand)]
    pub kind: PlotKind,
}

/// The kinds of figure.
#[derive(Subcommand, Debug)]
pub enum PlotKind {
    /// A metric against a swept variable, one line per series (from a sweep CSV).
    Sweep(SweepPlotArgs),
    /// A metric over block_q x block_kv (from a sweep CSV).
    Heatmap(HeatmapArgs),
    /// Predicted vs measured latency with y = x and error bands (from `tpusim validate --format csv`).
    Validation(ValidationArgs),
    /// Arithmetic intensity vs achieved FLOP/s with the chip's roofs and the workload's ceilings.
    Roofline(MultiJobArgs),
    /// Stacked busy time per unit for several jobs; with --layer, a transformer layer's time by
    /// part (attention, projections, feed-forward, element-wise, all-to-all, permutation) over
    /// resolutions, chip counts or attention modes.
    Breakdown(Box<BreakdownArgs>),
    /// End-to-end speedup of sparse attention over all-dense as a curve over the fraction of
    /// (step, block) pairs that stay dense, one curve per resolution or slice, with reference
    /// speedups marked.
    Speedup(SpeedupArgs),
    /// The tile map (empty / partial / full, padding) of a mask at a tiling for one head.
    Tiles(TilesArgs),
    /// A Gantt chart of MXU, VPU, EUP, XLU, DMA and step control over grid steps.
    Timeline(TimelineArgs),
}

/// Output flags every kind takes.
#[derive(Args, Debug)]
pub struct FigureArgs {
    /// Output file; the extension (.png or .svg) picks the format.
    #[arg(long, value_name = "FILE.png|FILE.svg")]
    pub out: String,
    /// Title (replaces the generated one).
    #[arg(long)]
    pub title: Option<String>,
    /// Width, pixels [default: 1400; tiles: 1150].
    #[arg(long)]
    pub width: Option<u32>,
    /// Height, pixels [default: 860; tiles: 900].
    #[arg(long)]
    pub height: Option<u32>,
    /// Replace --out even if tpusim's plot did not write it (figures carry a mark saying
    /// which command wrote them; without --force only a figure of `tpusim plot` is replaced).
    #[arg(long)]
    pub force: bool,
}

impl FigureArgs {
    fn output(&self, default: (u32, u32)) -> Result<Output, CliError> {
        let out = Output::new(&self.out, self.width.unwrap_or(default.0), self.height.unwrap_or(default.1))?;
        tpusim_io::check_replace(&out.path, "plot", self.force).map_err(|e| CliError::input(format!("--out {e}")))?;
        Ok(out)
    }
}

/// Flags of the CSV-driven kinds: the input table and row filters.
#[derive(Args, Debug)]
pub struct TableArgs {
    /// Input CSV with a header row.
    #[arg(long, value_name = "FILE")]
    pub input: String,
    /// Keep only rows where COL equals VALUE (repeatable).
    #[arg(long = "where", value_name = "COL=VALUE")]
    pub filters: Vec<String>,
}

/// `--kernel-ir` on a kind that needs an attention workload and takes no job flags: accepted by
/// the parser only to be refused with the reason ([`NoKernelIr::refuse`]; `plot tiles` refuses
/// its job's `--kernel-ir` the same way).
#[derive(Args, Debug)]
pub struct NoKernelIr {
    /// Not for this kind (it needs an attention workload, which a kernel's IR does not state).
    #[arg(long, value_name = "FILE.json", hide = true)]
    pub kernel_ir: Option<String>,
}

impl NoKernelIr {
    fn refuse(&self, kind: &str, why: &str) -> Result<(), CliError> {
        match &self.kernel_ir {
            Some(f) => Err(CliError::input(format!(
                "--kernel-ir {f}: not with plot {kind}: {why}; the figures of a kernel read from its IR are plot timeline, breakdown and roofline --kernel-ir FILE"
            ))),
            None => Ok(()),
        }
    }
}

/// Flags of `tpusim plot sweep`.
#[derive(Args, Debug)]
pub struct SweepPlotArgs {
    #[command(flatten)]
    pub figure: FigureArgs,
    #[command(flatten)]
    pub table: TableArgs,
    /// Column for the x axis.
    #[arg(long, value_name = "COL")]
    pub x: String,
    /// Column for the y axis.
    #[arg(long, value_name = "COL", default_value = "latency_ms")]
    pub y: String,
    /// Column whose values split the rows into lines.
    #[arg(long, value_name = "COL")]
    pub series: Option<String>,
    /// Log-scale x axis.
    #[arg(long)]
    pub logx: bool,
    /// Log-scale y axis.
    #[arg(long)]
    pub logy: bool,
    /// Leave out rows whose x or y is NaN or infinite, or 0 or below on a log axis, instead of
    /// refusing them; the footnote and stderr say how many and which lines.
    #[arg(long)]
    pub skip_bad: bool,
}

/// Which end of a heatmap's metric is best.
#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Best {
    /// Lower is better.
    Min,
    /// Higher is better.
    Max,
}

/// Flags of `tpusim plot heatmap`.
#[derive(Args, Debug)]
pub struct HeatmapArgs {
    #[command(flatten)]
    pub figure: FigureArgs,
    #[command(flatten)]
    pub no_kernel_ir: NoKernelIr,
    #[command(flatten)]
    pub table: TableArgs,
    /// Column for the x axis.
    #[arg(long, value_name = "COL", default_value = "block_kv")]
    pub x: String,
    /// Column for the y axis.
    #[arg(long, value_name = "COL", default_value = "block_q")]
    pub y: String,
    /// Metric column.
    #[arg(long, value_name = "COL", default_value = "latency_ms")]
    pub z: String,
    /// Which end of the metric is best [default: min for latency/time/bytes/error columns, else max].
    #[arg(long, value_enum)]
    pub best: Option<Best>,    /// Leave out rows whose metric is NaN, infinite or negative (or whose x or y is not finite)
    /// instead of refusing them; their cells show no value, and the footnote and stderr say how
    /// many and which lines.
    #[arg(long)]
    pub skip_bad: bool,
}

/// Flags of `tpusim plot validation`.
#[derive(Args, Debug)]
pub struct ValidationArgs {
    #[command(flatten)]
    pub figure: FigureArgs,
    #[command(flatten)]
    pub table: TableArgs,
    /// Column of measured times (x axis) [default: measured_ms].
    #[arg(long, value_name = "COL")]
    pub x: Option<String>,
    /// Column of predicted times (y axis) [default: predicted_ms].
    #[arg(long, value_name = "COL")]
    pub y: Option<String>,
    /// Column whose values colour the points [default: the id's prefix].
    #[arg(long, value_name = "COL")]
    pub series: Option<String>,
    /// Column holding each row's name.
    #[arg(long, value_name = "COL", default_value = "id")]
    pub label_column: String,
    /// Relative error bands, percent.
    #[arg(long, default_value = "10,25", value_name = "PCT,PCT")]
    pub bands: String,
}

/// Flags of the kinds that run several jobs (roofline, breakdown).
#[derive(Args, Debug)]
pub struct MultiJobArgs {
    #[command(flatten)]
    pub figure: FigureArgs,
    /// Job file (TOML with `tpusim run` keys); repeatable: one bar, point or line per file
    /// [default: the default job of `tpusim run`, the built-in case study, unless job flags are
    /// given].
    #[arg(long, value_name = "FILE")]
    pub trace: Vec<String>,
    /// Run every job on each of these chips (comma-separated presets or TOML paths).
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub chips: Vec<String>,
    /// Legend label per job, in order (repeatable) [default: the trace file's stem].
    #[arg(long, value_name = "TEXT")]
    pub label: Vec<String>,
    /// Job fields for every job (override the trace files); --kernel-ir is repeatable here.
    #[command(flatten)]
    pub job: MultiJobSpec,
}

impl MultiJobArgs {
    fn runs(&self) -> Result<Vec<JobRun>, CliError> {
        let specs = jobs::expand_with(&self.trace, &self.job.kernel_ir, &self.job.spec, &self.chips, &self.label)?;
        Ok(jobs::run_all(&specs)?)
    }
}

/// The job flags of the kinds that run several jobs: [`JobSpec`]'s, with `--kernel-ir`
/// repeatable (one bar or point per file, after the --trace jobs; its lowering fixed workload,
/// mask and blocks, so only --chip, --chips and --set apply to it).
#[derive(Debug, Clone, Default)]
pub struct MultiJobSpec {
    /// Every job field but `kernel_ir`.
    pub spec: JobSpec,
    /// The kernel description files, in the order given.
    pub kernel_ir: Vec<String>,
}

impl clap::FromArgMatches for MultiJobSpec {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let kernel_ir = m.get_many::<String>("kernel_ir").map(|v| v.cloned().collect()).unwrap_or_default();
        let spec = JobSpec { kernel_ir: None, ..JobSpec::from_arg_matches(m)? };
        Ok(MultiJobSpec { spec, kernel_ir })
    }

    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl Args for MultiJobSpec {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        JobSpec::augment_args(cmd).mut_arg("kernel_ir", |a| {
            a.action(clap::ArgAction::Append).help(
                "A Pallas kernel read from its Mosaic IR: a kernel description file (`tpusim.jax.describe`; as `tpusim run --kernel-ir`); repeatable, one bar or point per file after the --trace jobs. Its lowering fixed workload, mask and blocks: only --chip, --chips and --set apply to it",
            )
        })
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

/// Flags of `tpusim plot breakdown`: jobs (unit busy time), or with `--layer` layer runs.
#[derive(Args, Debug)]
pub struct BreakdownArgs {
    #[command(flatten)]
    pub jobs: MultiJobArgs,
    /// Draw a transformer layer's time by part instead of jobs' busy time per unit (the layer
    /// flags of `tpusim layer` apply; --chip and --set choose the chip).
    #[arg(long)]
    pub layer: bool,
    /// With --layer: stack shares of each layer (100%) instead of milliseconds.
    #[arg(long, requires = "layer")]
    pub share: bool,
    #[command(flatten)]
    pub axes: LayerAxes,
    #[command(flatten)]
    pub spec: tpusim_layer::LayerSpec,
}

/// The values a layer figure runs over: one bar or curve per combination.
#[derive(Args, Debug)]
pub struct LayerAxes {
    /// Resolutions, one bar or curve each (comma-separated), e.g. 720p,1080p,1440p.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub resolutions: Vec<String>,
    /// Slices, one bar or curve each (comma-separated device counts or shapes), e.g. 1,4,8,16.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub slices: Vec<String>,
    /// Attention modes, one bar each (comma-separated), e.g. dense,sparse.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub attentions: Vec<tpusim_layer::AttentionMode>,
}

/// Flags of `tpusim plot speedup`.
#[derive(Args, Debug)]
pub struct SpeedupArgs {
    #[command(flatten)]
    pub figure: FigureArgs,
    #[command(flatten)]
    pub no_kernel_ir: NoKernelIr,
    /// Chip of every device: preset or path [default: v6e].
    #[arg(long)]
    pub chip: Option<String>,
    /// Change a chip parameter (repeatable).
    #[arg(long = "set", value_name = "SECTION.FIELD=VALUE")]
    pub set: Vec<String>,
    /// Resolutions, one curve each (comma-separated), e.g. 720p,1080p,1440p.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub resolutions: Vec<String>,
    /// Slices, one curve each (comma-separated), e.g. 4,8,16.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub slices: Vec<String>,
    /// A reference speedup for the curve with this label, e.g. 720p=1.28 (repeatable): drawn
    /// dashed, with the dense fraction at which the curve meets it.
    #[arg(long, value_name = "LABEL=SPEEDUP")]
    pub mark: Vec<String>,
    #[command(flatten)]
    pub spec: tpusim_layer::LayerSpec,
}

/// Flags of `tpusim plot tiles`.
#[derive(Args, Debug)]
pub struct TilesArgs {
    #[command(flatten)]
    pub figure: FigureArgs,
    #[command(flatten)]
    pub job: JobArgs,
    /// q head whose mask the map shows.
    #[arg(long, value_name = "H", default_value_t = 0)]
    pub head: u32,
    /// Draw no outline of the exact mask over the tiles (fine masks read better without it).
    #[arg(long)]
    pub no_outline: bool,
}

/// Flags of `tpusim plot timeline`.
#[derive(Args, Debug)]
pub struct TimelineArgs {
    #[command(flatten)]
    pub figure: FigureArgs,
    /// A Chrome trace written by `tpusim run --timeline` to draw instead of simulating a job.
    /// (With --kernel-ir, a kernel read from its Mosaic IR is drawn: --head is its grid index of
    /// dimension 0.)
    #[arg(long, value_name = "TRACE.json", conflicts_with_all = ["trace", "kernel_ir"])]
    pub input: Option<String>,
    #[command(flatten)]
    pub job: JobArgs,
    /// Grid steps START:END (END exclusive) [default: 0:4; with --head, that head's first four
    /// steps; with --input, the steps the trace holds from START].
    #[arg(long, value_name = "START:END")]
    pub steps: Option<String>,
    /// Only the steps of one batch x head index (grid coordinate 0).
    #[arg(long, value_name = "H")]
    pub head: Option<u32>,
}

fn one_run(job: &JobArgs, kind: &str) -> Result<JobRun, CliError> {
    let spec = job.spec_or_default()?;
    // Labelled by the file it came from: a kernel description, a trace or the case study's.
    let file = if job.is_default() { Some(tpusim_job::CASE_STUDY_PATH) } else { spec.kernel_ir.as_deref().or(job.trace.as_deref()) };
    let label = file.and_then(|t| std::path::Path::new(t).file_stem().and_then(|s| s.to_str())).unwrap_or("default").to_string();
    jobs::run_one(&jobs::LabelledSpec { label, spec }).map_err(|e| match e {
        tpusim_plot::PlotError::Spec { source, .. } => job.error(format!("plot {kind}: {source}")),
        other => other.into(),
    })
}

fn done<F: Figure>(fig: &F, out: &Output, what: &str) -> Result<String, CliError> {
    render(fig, out)?;
    let size = std::fs::metadata(&out.path).map(|m| m.len()).unwrap_or(0);
    let mut msg = format!("wrote {} ({} x {} px, {} bytes): {what}\n", out.path.display(), out.width, out.height, size);
    for f in fig.facts() {
        msg.push_str(&format!("  {f}\n"));
    }
    Ok(msg)
}

const WIDE: (u32, u32) = (1400, 860);

/// The footnote of the rows `--skip-bad` left out, on stderr as well (the figure drew without them).
fn skipped_note(notes: &[String]) {
    if let Some(n) = notes.iter().find(|n| n.starts_with("--skip-bad left out")) {
        eprintln!("note: {n}");
    }
}

pub fn cmd_plot(a: &PlotArgs) -> Result<String, CliError> {
    match &a.kind {
        PlotKind::Sweep(p) => {
            let out = p.figure.output(WIDE)?;
            let t = Table::read(&p.table.input, "--input")?;
            let spec = SweepSpec {
                x: p.x.clone(),
                y: p.y.clone(),
                series: p.series.clone(),
                filters: p.table.filters.clone(),
                logx: p.logx,
                logy: p.logy,
                title: p.figure.title.clone(),
                skip_bad: p.skip_bad,
            };
            let f = SweepFigure::from_table(&t, &spec)?;
            skipped_note(&f.notes);
            done(&f, &out, &f.title)
        }
        PlotKind::Heatmap(p) => {
            p.no_kernel_ir.refuse(
                "heatmap",
                "it draws a sweep CSV's metric over block_q x block_kv, and a kernel read from its IR has the block sizes its lowering fixed (describe one kernel per block size, sweep the files with kernel_ir = [...] in a sweep file, and draw the CSV with plot sweep)",
            )?;
            let out = p.figure.output(WIDE)?;
            let t = Table::read(&p.table.input, "--input")?;
            let spec = HeatmapSpec {
                x: p.x.clone(),
                y: p.y.clone(),
                z: p.z.clone(),
                filters: p.table.filters.clone(),
                lower_is_better: p.best.map(|b| b == Best::Min),
                title: p.figure.title.clone(),
                skip_bad: p.skip_bad,
            };
            let f = HeatmapFigure::from_table(&t, &spec)?;
            skipped_note(&f.notes);
            done(&f, &out, &f.title)
        }
        PlotKind::Validation(p) => {
            let out = p.figure.output(WIDE)?;
            let t = Table::read(&p.table.input, "--input")?;
            // A default column the input lacks is named as the default, not as a flag the user
            // did not type.
            for (given, default, flag) in [(&p.x, "measured_ms", "--x"), (&p.y, "predicted_ms", "--y")] {
                if given.is_none() && !t.header.iter().any(|h| h == default) {
                    return Err(CliError::input(format!(
                        "--input {}: no {default} column (the column plot validation reads by default; give {flag} COL to name another; columns: {})",
                        p.table.input,
                        t.header.join(", ")
                    )));
                }
            }
            let spec = ValidationSpec {
                measured: p.x.clone().unwrap_or_else(|| "measured_ms".into()),
                predicted: p.y.clone().unwrap_or_else(|| "predicted_ms".into()),
                id: p.label_column.clone(),
                series: p.series.clone(),
                bands: parse_bands(&p.bands)?,
                filters: p.table.filters.clone(),
                title: p.figure.title.clone(),
            };
            let f = ValidationFigure::from_table(&t, &spec)?;
            done(&f, &out, &f.title)
        }
        PlotKind::Roofline(p) => {
            let out = p.figure.output(WIDE)?;
            let f = RooflineFigure::from_runs(&p.runs()?, p.figure.title.as_deref())?;
            done(&f, &out, &f.title)
        }
        PlotKind::Breakdown(b) if b.layer => layer_breakdown(b),
        PlotKind::Breakdown(b) => {
            let p = &b.jobs;
            let layer_flags = b.spec.set_fields();
            if let Some(k) = layer_flags.keys().next() {
                return Err(CliError::input(format!("--{}: a layer flag; add --layer to draw a layer's breakdown", k.replace('_', "-"))));
            }
            if !b.axes.resolutions.is_empty() || !b.axes.slices.is_empty() || !b.axes.attentions.is_empty() {
                return Err(CliError::input("--resolutions, --slices and --attentions apply to --layer"));
            }
            let out = p.figure.output(WIDE)?;
            let f = BreakdownFigure::from_runs(&p.runs()?, p.figure.title.as_deref());
            done(&f, &out, &f.title)
        }
        PlotKind::Speedup(p) => speedup_plot(p),
        PlotKind::Tiles(p) => {
            let spec = p.job.spec_or_default()?;
            NoKernelIr { kernel_ir: spec.kernel_ir.clone() }.refuse(
                "tiles",
                "the tile map is an attention mask's empty / partial / full tiles at a block_q x block_kv tiling, and a kernel's IR states its grid, not a mask",
            )?;
            let out = p.figure.output((1150, 900))?;
            // The tile map needs the workload and the tiling only: the job is built (its
            // fields checked), not lowered or simulated.
            let chip = spec.chip().map_err(|e| p.job.error(format!("plot tiles: {e}")))?;
            let job = spec.build(&chip).map_err(|e| p.job.error(format!("plot tiles: {e}")))?;
            let tpusim_job::Job::Attention { workload: w, config: c, .. } = &job else {
                return Err(CliError::input("plot tiles needs an attention job (an attention --kernel); this job is a matmul"));
            };
            let head = u64::from(p.head);
            if head >= w.q_heads {
                return Err(CliError::input(format!("--head {head}: the job has {} q heads (0 to {})", w.q_heads, w.q_heads - 1)));
            }
            let grid = TileGrid { q_len: w.q_len, kv_len: w.kv_len, block_q: c.block_q, block_kv: c.block_kv };
            let mask = w.mask_for_head(head);
            // At most one cell per pixel of the picture's shorter side (module docs of tiles).
            let cells = u64::from(out.width.min(out.height));
            let (mut f, _) = TilesFigure::with_resolution(mask, grid, c.tile_align, &mask.to_string(), head, cells);
            if let Some(t) = &p.figure.title {
                f.title = t.clone();
            }
            if p.no_outline {
                f.boundary.clear();
                f.notes.retain(|n| !n.contains("boundary"));
            }
            done(&f, &out, &f.title)
        }
        PlotKind::Timeline(p) => timeline_plot(p),
    }
}

/// Most grid steps a Gantt chart draws: beyond, its bars are thinner than their labels.
const MAX_GANTT_STEPS: u64 = 64;

fn timeline_plot(p: &TimelineArgs) -> Result<String, CliError> {
    // One job per timeline: a repeated --kernel-ir (which roofline and breakdown take, and which
    // the parser would otherwise let the last one win) is refused.
    let given = std::env::args().filter(|a| a == "--kernel-ir" || a.starts_with("--kernel-ir=")).count();
    if given > 1 {
        return Err(CliError::input(format!(
            "--kernel-ir given {given} times: the argument '--kernel-ir' cannot be used multiple times in plot timeline (one kernel's steps per figure; plot breakdown and roofline take several)"
        )));
    }
    let out = p.figure.output(WIDE)?;
    let mut steps = Window::parse_steps(p.steps.as_deref().unwrap_or("0:4"), "--steps")?;
    if steps.1.saturating_sub(steps.0) > MAX_GANTT_STEPS {
        return Err(CliError::input(format!(
            "--steps {}:{}: {} grid steps are too many to draw legibly (at most {MAX_GANTT_STEPS}: each step's operations get a bar and a label); choose a window, e.g. --steps {}:{}, or write the whole run as a Chrome trace (tpusim run ... --timeline run.json) and open it in Perfetto, which aggregates as you zoom",
            steps.0,
            steps.1,
            steps.1 - steps.0,
            steps.0,
            steps.0 + 16
        )));
    }
    if let Some(path) = &p.input {
        // A layer's timeline (tpusim layer --timeline) holds ops and ICI transfers, not grid steps.
        let head = std::fs::read(path).map(|b| String::from_utf8_lossy(&b[..b.len().min(1 << 16)]).into_owned()).unwrap_or_default();
        if tpusim_io::mark::mark_in(head.as_bytes()).as_deref() == Some("layer --timeline") || head.contains("\"tool\":\"tpusim layer\"") {
            return Err(CliError::input(format!(
                "--input {path}: a layer's timeline (tpusim layer --timeline: ops on the TensorCore and ICI tracks), not a kernel's grid steps; open it in Perfetto (ui.perfetto.dev) or chrome://tracing, or draw the layer with tpusim plot breakdown --layer"
            )));
        }
    }
    let (events, what, job) = match &p.input {
        Some(path) => {
            let ev: Vec<_> =
                timeline::read_chrome_trace(path, "--input")?.into_iter().filter(|e| p.head.is_none_or(|h| e.head == Some(h))).collect();
            // A trace written for a window holds only those steps: count --steps from its first.
            if let Some(first) = ev.iter().map(|e| e.step).min() {
                if p.steps.is_none() || steps.0 < first {
                    steps = (first + steps.0, first + steps.1);
                }
            }
            (ev, path.clone(), None)
        }
        None => {
            // With --head, --steps counts that head's own steps (default: its first four).
            let head_first = p.head.is_some();
            // One step more than asked: its input DMA is prefetched inside the window.
            let window = Window { steps: if head_first { None } else { Some((steps.0, steps.1.saturating_add(1))) }, head: p.head };
            let r = one_run(&p.job, "timeline")?;
            if let (Some(h), tpusim_job::Job::Attention { workload: w, .. }) = (p.head, r.job()) {
                let n = w.batch * w.q_heads;
                if u64::from(h) >= n {
                    return Err(CliError::input(format!("--head {h}: the job has {n} batch x heads (0 to {})", n - 1)));
                }
            }
            if let tpusim_job::Job::Described(d) = r.job() {
                let n = d.description.grid.first().copied().unwrap_or(1);
                if let Some(h) = p.head.filter(|&h| u64::from(h) >= n) {
                    return Err(CliError::input(format!("--head {h}: the kernel's grid dimension 0 has {n} indices (0 to {})", n - 1)));
                }
            }
            let mut ev = timeline::collect_us(&r.run, &window);
            if head_first {
                if let Some(first) = ev.iter().map(|e| e.step).min() {
                    steps = (first + steps.0, first + steps.1);
                    ev.retain(|e| e.step >= steps.0 && e.step <= steps.1);
                }
            }
            (ev, format!("{} on {}", r.label, r.chip().name), Some(jobs::describe(&r)))
        }
    };
    let f = GanttFigure::new(events, steps, &what, job, p.figure.title.as_deref())?;
    done(&f, &out, &f.title)
}

fn layer_breakdown(b: &BreakdownArgs) -> Result<String, CliError> {
    let p = &b.jobs;
    let out = p.figure.output(WIDE)?;
    if !p.trace.is_empty() || !p.chips.is_empty() || !p.label.is_empty() {
        return Err(CliError::input(
            "--trace, --chips and --label describe kernel jobs; with --layer use the layer flags and --resolutions, --slices, --attentions",
        ));
    }
    let kernel_ir = (!p.job.kernel_ir.is_empty()).then(|| "kernel_ir".to_string());
    if let Some(k) = kernel_ir.or_else(|| p.job.spec.set_fields().keys().find(|k| *k != "chip" && *k != "set").cloned()) {
        return Err(CliError::input(format!(
            "--{}: a kernel job flag; with --layer only --chip and --set apply to the chip",
            k.replace('_', "-")
        )));
    }
    let chip = crate::layer::chip(&p.job.spec.chip, &p.job.spec.set)?;
    let runs = layer::run_layers(&b.spec, &chip, &b.axes.resolutions, &b.axes.slices, &b.axes.attentions)?;
    let f = LayerBreakdownFigure::from_runs(&runs, b.share, p.figure.title.as_deref());
    done(&f, &out, &f.title)
}

fn speedup_plot(p: &SpeedupArgs) -> Result<String, CliError> {
    p.no_kernel_ir.refuse(
        "speedup",
        "the curve is sparse over dense attention in a transformer layer (tpusim layer), and a kernel read from its IR has no dense baseline or layer around it",
    )?;
    let out = p.figure.output(WIDE)?;
    if p.spec.attention == Some(tpusim_layer::AttentionMode::Dense) {
        return Err(CliError::input("--attention dense: the speedup plot compares sparse attention with dense"));
    }
    let marks = p.mark.iter().map(|m| Mark::parse(m)).collect::<Result<Vec<_>, _>>()?;
    let chip = crate::layer::chip(&p.chip, &p.set)?;
    let mut spec = p.spec.clone();
    spec.attention = Some(tpusim_layer::AttentionMode::Sparse);
    spec.steps = spec.steps.or(Some(40));
    let runs = layer::run_layers(&spec, &chip, &p.resolutions, &p.slices, &[])?;
    let f = SpeedupFigure::from_runs(&runs, &marks, p.figure.title.as_deref())?;
    done(&f, &out, &f.title)
}
