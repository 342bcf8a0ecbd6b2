//! `tpusim plot` (issue 6): figures as PNG or SVG. Drawing lives in `tpusim-plot`; this module
//! maps flags onto it.

use crate::InputError;
use clap::Args;
use tpusim_plot::breakdown::BreakdownFigure;
use tpusim_plot::gantt::GanttFigure;
use tpusim_plot::heatmap::{HeatmapFigure, HeatmapSpec};
use tpusim_plot::jobs::{self, JobRun};
use tpusim_plot::roofline::RooflineFigure;
use tpusim_plot::sweep::{SweepFigure, SweepSpec};
use tpusim_plot::table::Table;
use tpusim_plot::tiles::TilesFigure;
use tpusim_plot::timeline::{self, Window};
use tpusim_plot::validation::{parse_bands, ValidationFigure, ValidationSpec};
use tpusim_plot::{render, Figure, Output, PlotError};
use tpusim_report::JobSpec;
use tpusim_workload::tiles::TileGrid;

/// Plot kinds and what they read.
pub const KINDS: &[(&str, &str)] = &[
    ("sweep", "a metric against a swept variable, one line per series (--input CSV --x COL [--y COL] [--series COL])"),
    ("heatmap", "a metric over block_q x block_kv (--input CSV [--x block_kv --y block_q --z latency_ms])"),
    ("roofline", "intensity vs achieved FLOP/s with the chip's roofs and ceilings ([--trace FILE]... [--chips LIST])"),
    ("tiles", "the tile map of a mask at a tiling for one head ([--trace FILE] [--mask ...] [--tile-align] [--head H])"),
    ("timeline", "a Gantt chart of unit activity over grid steps ([--trace FILE] [--steps A:B] [--head H], or --input TRACE.json)"),
    ("validation", "predicted vs measured with y = x and error bands (--input CSV from tpusim validate --format csv)"),
    ("breakdown", "stacked busy time per unit for several jobs ([--trace FILE]... [--chips LIST])"),
];

/// Flags of `tpusim plot`.
#[derive(Args, Debug)]
#[command(after_help = "Kinds:\n  sweep       a metric against a swept variable, one line per --series value\n  heatmap     a metric over block_q x block_kv\n  roofline    arithmetic intensity vs achieved FLOP/s with roofs and ceilings\n  tiles       tile map (empty / partial / full, padding) of a mask at a tiling\n  timeline    Gantt chart of MXU, VPU, EUP, XLU, DMA and step control over grid steps\n  validation  predicted vs measured latency with y = x and error bands\n  breakdown   stacked busy time per unit for several jobs\n\nExamples (plots/make.sh regenerates the case-study figures):\n  tpusim plot roofline --trace plots/jobs/dense.toml --trace plots/jobs/sparse.toml --out roof.png\n  tpusim plot tiles --trace plots/jobs/sparse.toml --tile-align --out tiles.svg\n  tpusim plot timeline --trace plots/jobs/dense.toml --steps 10:13 --out timeline.png\n  tpusim plot sweep --input sweep.csv --x block_kv --y latency_ms --series block_q --out sweep.png")]
pub struct PlotArgs {
    /// Plot kind: sweep, heatmap, roofline, tiles, timeline, validation or breakdown.
    pub kind: String,
    /// Output file; the extension (.png or .svg) picks the format.
    #[arg(long, value_name = "FILE.png|FILE.svg")]
    pub out: String,
    /// Input file: a CSV with a header row (sweep, heatmap, validation) or a Chrome trace from
    /// `tpusim run --timeline` (timeline).
    #[arg(long, value_name = "FILE")]
    pub input: Option<String>,
    /// Column for the x axis [sweep: required; heatmap: block_kv; validation: measured_ms].
    #[arg(long, value_name = "COL")]
    pub x: Option<String>,
    /// Column for the y axis [sweep: latency_ms; heatmap: block_q; validation: predicted_ms].
    #[arg(long, value_name = "COL")]
    pub y: Option<String>,
    /// Metric column of a heatmap [default: latency_ms].
    #[arg(long, value_name = "COL")]
    pub z: Option<String>,
    /// Column whose values split the rows into lines (sweep) or colour groups (validation;
    /// default: the id's prefix).
    #[arg(long, value_name = "COL")]
    pub series: Option<String>,
    /// Column holding each row's name (validation) [default: id].
    #[arg(long, value_name = "COL")]
    pub label_column: Option<String>,
    /// Keep only rows where COL equals VALUE (repeatable).
    #[arg(long = "where", value_name = "COL=VALUE")]
    pub filters: Vec<String>,
    /// Log-scale x axis (sweep).
    #[arg(long)]
    pub logx: bool,
    /// Log-scale y axis (sweep).
    #[arg(long)]
    pub logy: bool,
    /// Which end of a heatmap's metric is best [default: min for latency/time/bytes/error
    /// columns, else max].
    #[arg(long, value_parser = ["min", "max"])]
    pub best: Option<String>,
    /// Relative error bands of the validation plot, percent.
    #[arg(long, default_value = "10,25", value_name = "PCT,PCT")]
    pub bands: String,
    /// Job file (TOML with `tpusim run` keys, as `tpusim run --trace`); repeatable: one bar,
    /// point or line per file [default: the built-in video case].
    #[arg(long, value_name = "FILE")]
    pub trace: Vec<String>,
    /// Run every job on each of these chips (comma-separated presets or TOML paths).
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub chips: Vec<String>,
    /// Legend label per job, in order (repeatable) [default: the trace file's stem].
    #[arg(long, value_name = "TEXT")]
    pub label: Vec<String>,
    /// Mask for every job (overrides the trace files), e.g. band:15000+sink:3600.
    #[arg(long)]
    pub mask: Option<String>,
    /// Sequence length of q and kv for every job.
    #[arg(long)]
    pub seq_len: Option<u64>,
    /// Query heads for every job.
    #[arg(long)]
    pub heads: Option<u64>,
    /// Rows of q per block for every job.
    #[arg(long)]
    pub block_q: Option<u64>,
    /// Rows of k/v per block for every job.
    #[arg(long)]
    pub block_kv: Option<u64>,
    /// Inner sub-tile width for every job.
    #[arg(long)]
    pub block_kv_compute: Option<u64>,
    /// Traversal for every job (full-grid or compact).
    #[arg(long)]
    pub traversal: Option<String>,
    /// Masking for every job (all, partial or none).
    #[arg(long)]
    pub masking: Option<String>,
    /// Round the mask to whole tiles (tiles: draw the aligned map).
    #[arg(long)]
    pub tile_align: bool,
    /// q head whose mask the tile map shows (tiles), or batch x head index whose steps the
    /// timeline shows (timeline) [tiles default: 0].
    #[arg(long, value_name = "H")]
    pub head: Option<u32>,
    /// Grid steps START:END (END exclusive) of the timeline [default: 0:4]; with --head they
    /// count that head's own steps.
    #[arg(long, value_name = "START:END")]
    pub steps: Option<String>,
    /// Title (replaces the generated one).
    #[arg(long)]
    pub title: Option<String>,
    /// Width, pixels [default: 1400; tiles: 1150].
    #[arg(long)]
    pub width: Option<u32>,
    /// Height, pixels [default: 860; tiles: 900].
    #[arg(long)]
    pub height: Option<u32>,
}

impl PlotArgs {
    fn overlay(&self) -> JobSpec {
        JobSpec {
            mask: self.mask.clone(),
            seq_len: self.seq_len,
            heads: self.heads,
            block_q: self.block_q,
            block_kv: self.block_kv,
            block_kv_compute: self.block_kv_compute,
            traversal: self.traversal.clone(),
            masking: self.masking.clone(),
            tile_align: self.tile_align.then_some(true),
            ..Default::default()
        }
    }

    fn runs(&self) -> Result<Vec<JobRun>, PlotError> {
        let specs = jobs::expand(&self.trace, &self.overlay(), &self.chips, &self.label)?;
        jobs::run_all(&specs)
    }

    fn one_run(&self, kind: &str) -> Result<JobRun, PlotError> {
        let specs = jobs::expand(&self.trace, &self.overlay(), &self.chips, &self.label)?;
        if specs.len() != 1 {
            return Err(PlotError(format!("{kind} draws one job; --trace and --chips give {}", specs.len())));
        }
        jobs::run_one(&specs[0])
    }

    fn input(&self, kind: &str) -> Result<&str, PlotError> {
        self.input.as_deref().ok_or_else(|| PlotError(format!("plot {kind} needs --input FILE")))
    }

    fn table(&self, kind: &str) -> Result<Table, PlotError> {
        Table::read(self.input(kind)?, "--input")
    }
}

fn done<F: Figure>(fig: &F, out: &Output, what: &str) -> Result<String, InputError> {
    render(fig, out)?;
    let size = std::fs::metadata(&out.path).map(|m| m.len()).unwrap_or(0);
    Ok(format!("wrote {} ({} x {} px, {} bytes): {what}\n", out.path.display(), out.width, out.height, size))
}

pub fn cmd_plot(a: &PlotArgs) -> Result<String, InputError> {
    if !KINDS.iter().any(|(k, _)| *k == a.kind) {
        return Err(InputError(format!(
            "plot kind {:?}: expected one of {}",
            a.kind,
            KINDS.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")
        )));
    }
    let (w, h) = if a.kind == "tiles" { (1150, 900) } else { (1400, 860) };
    let out = Output::new(&a.out, a.width.unwrap_or(w), a.height.unwrap_or(h))?;
    match a.kind.as_str() {
        "sweep" => {
            let t = a.table("sweep")?;
            let x = a.x.clone().ok_or_else(|| InputError(format!("plot sweep needs --x COL (columns of {}: {})", t.path, t.header.join(", "))))?;
            let spec = SweepSpec {
                x,
                y: a.y.clone().unwrap_or_else(|| "latency_ms".into()),
                series: a.series.clone(),
                filters: a.filters.clone(),
                logx: a.logx,
                logy: a.logy,
                title: a.title.clone(),
            };
            let f = SweepFigure::from_table(&t, &spec)?;
            done(&f, &out, &f.title)
        }
        "heatmap" => {
            let t = a.table("heatmap")?;
            let spec = HeatmapSpec {
                x: a.x.clone().unwrap_or_else(|| "block_kv".into()),
                y: a.y.clone().unwrap_or_else(|| "block_q".into()),
                z: a.z.clone().unwrap_or_else(|| "latency_ms".into()),
                filters: a.filters.clone(),
                lower_is_better: a.best.as_deref().map(|b| b == "min"),
                title: a.title.clone(),
            };
            let f = HeatmapFigure::from_table(&t, &spec)?;
            done(&f, &out, &f.title)
        }
        "validation" => {
            let t = a.table("validation")?;
            let spec = ValidationSpec {
                measured: a.x.clone().unwrap_or_else(|| "measured_ms".into()),
                predicted: a.y.clone().unwrap_or_else(|| "predicted_ms".into()),
                id: a.label_column.clone().unwrap_or_else(|| "id".into()),
                series: a.series.clone(),
                bands: parse_bands(&a.bands)?,
                filters: a.filters.clone(),
                title: a.title.clone(),
            };
            let f = ValidationFigure::from_table(&t, &spec)?;
            done(&f, &out, &f.title)
        }
        "roofline" => {
            let runs = a.runs()?;
            let f = RooflineFigure::from_runs(&runs, a.title.as_deref())?;
            done(&f, &out, &f.title)
        }
        "breakdown" => {
            let runs = a.runs()?;
            let f = BreakdownFigure::from_runs(&runs, a.title.as_deref());
            done(&f, &out, &f.title)
        }
        "tiles" => {
            let r = a.one_run("tiles")?;
            let (w, c) = jobs::splash_of(&r, "plot tiles")?;
            let head = u64::from(a.head.unwrap_or(0));
            if head >= w.q_heads {
                return Err(InputError(format!("--head {head}: the job has {} q heads (0 to {})", w.q_heads, w.q_heads - 1)));
            }
            let grid = TileGrid { q_len: w.q_len, kv_len: w.kv_len, block_q: c.block_q, block_kv: c.block_kv };
            let mask = w.mask_for_head(head);
            let (mut f, _) = TilesFigure::new(mask, grid, c.tile_align, &mask.to_string(), head);
            if let Some(t) = &a.title {
                f.title = t.clone();
            }
            done(&f, &out, &f.title)
        }
        "timeline" => {
            let mut steps = Window::parse_steps(a.steps.as_deref().unwrap_or("0:4"), "--steps")?;
            // With --head, --steps counts that head's own steps (default: its first four).
            let head_first = a.head.is_some() && a.input.is_none();
            // One step more than asked: its input DMA is prefetched inside the window.
            let window = Window { steps: if head_first { None } else { Some((steps.0, steps.1.saturating_add(1))) }, head: a.head };
            let (events, what, job) = match &a.input {
                Some(path) => {
                    let ev: Vec<_> =
                        timeline::read_chrome_trace(path, "--input")?.into_iter().filter(|e| a.head.map_or(true, |h| e.head == Some(h))).collect();
                    (ev, path.clone(), None)
                }
                None => {
                    let r = a.one_run("timeline")?;
                    if let (Some(h), tpusim_report::Job::Splash { workload: w, .. }) = (a.head, &r.run.job) {
                        let n = w.batch * w.q_heads;
                        if u64::from(h) >= n {
                            return Err(InputError(format!("--head {h}: the job has {n} batch x heads (0 to {})", n - 1)));
                        }
                    }
                    let mut ev = timeline::collect_us(&r.run, &window);
                    if head_first {
                        if let Some(first) = ev.iter().map(|e| e.step).min() {
                            steps = (first + steps.0, first + steps.1);
                            ev.retain(|e| e.step >= steps.0 && e.step <= steps.1);
                        }
                    }
                    (ev, format!("{} on {}", r.label, r.report.chip), Some(jobs::describe(&r)))
                }
            };
            let f = GanttFigure::new(events, steps, &what, job, a.title.as_deref())?;
            done(&f, &out, &f.title)
        }
        _ => unreachable!("kinds checked above"),
    }
}
