//! Figures of a transformer layer on a slice of chips (`tpusim-layer`):
//!
//! * [`LayerBreakdownFigure`]: one stacked bar per layer run (over resolutions, chip counts or
//!   attention modes), stacked by the layer's breakdown categories (attention, projections,
//!   feed-forward, element-wise, all-to-all, permutation, weight gathers), in milliseconds per
//!   chip or as shares of the layer;
//! * [`SpeedupFigure`]: the end-to-end speedup of sparse attention over all-dense as a curve over
//!   the fraction of (step, block) pairs that stay dense, one curve per run, with reference
//!   speedups marked where the user gives them (`--mark LABEL=SPEEDUP`) and the fraction at
//!   which each curve meets its mark.

use crate::style::{self, Sizes};
use crate::{draw_err, sig3, Figure, PlotError};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use tpusim_chip::ChipModel;
use tpusim_layer::graph::Category;
use tpusim_layer::report::dense_fraction_for;
use tpusim_layer::{AttentionMode, LayerRun, LayerSpec};

/// One layer run with its label.
#[derive(Debug, Clone)]
pub struct LabelledLayer {
    /// Label (the values of the axes that vary).
    pub label: String,
    /// The run.
    pub run: LayerRun,
}

/// The runs of every combination of `resolutions` x `slices` x `attentions` (outer to inner;
/// an empty list keeps `base`'s value), each labelled by the axes with more than one value (by
/// its resolution when none varies).
///
/// # Errors
/// [`PlotError::Input`] with the layer error, fields named as flags.
pub fn run_layers(
    base: &LayerSpec,
    chip: &ChipModel,
    resolutions: &[String],
    slices: &[String],
    attentions: &[AttentionMode],
) -> Result<Vec<LabelledLayer>, PlotError> {
    let opt = |v: &[String]| if v.is_empty() { vec![None] } else { v.iter().cloned().map(Some).collect() };
    let atts: Vec<Option<AttentionMode>> = if attentions.is_empty() { vec![None] } else { attentions.iter().copied().map(Some).collect() };
    let mut out = Vec::new();
    for r in opt(resolutions) {
        for s in opt(slices) {
            for a in &atts {
                let mut spec = base.clone();
                if let Some(r) = &r {
                    spec.resolution = Some(r.clone());
                }
                if let Some(s) = &s {
                    spec.slice = Some(s.clone());
                }
                if let Some(a) = a {
                    spec.attention = Some(*a);
                }
                let mut label = Vec::new();
                if resolutions.len() > 1 {
                    label.push(r.clone().unwrap_or_default());
                }
                if slices.len() > 1 {
                    let s = s.clone().unwrap_or_default();
                    label.push(if s == "1" { "1 chip".to_string() } else { format!("{s} chips") });
                }
                if attentions.len() > 1 {
                    label.push(a.map(|a| a.to_string()).unwrap_or_default());
                }
                let run = tpusim_layer::run(&spec, chip).map_err(|e| {
                    let what = if label.is_empty() { String::new() } else { format!("{}: ", label.join(" ")) };
                    PlotError::Input(format!("{what}{}", tpusim_layer::spec::render_layer_fields(&e.to_string(), true)))
                })?;
                // With no varying axis, the resolution names the one run.
                let label = if label.is_empty() { run.result.plan.video.label() } else { label.join(" ") };
                out.push(LabelledLayer { label, run });
            }
        }
    }
    Ok(out)
}

/// The colour of a breakdown category.
pub fn category_color(c: Category) -> RGBColor {
    match c {
        Category::Attention => style::BLUE,
        Category::Projections => style::GREEN,
        Category::FeedForward => style::LIGHT_GREEN,
        Category::Elementwise => style::ORANGE,
        Category::AllToAll => style::VERMILLION,
        Category::Permutation => style::PURPLE,
        Category::WeightGather => style::GREY,
    }
}

/// One bar of the layer breakdown.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerBar {
    /// Label under the bar.
    pub label: String,
    /// ms per category, in [`Category::ALL`] order.
    pub ms: Vec<(Category, f64)>,
    /// Layer latency, ms.
    pub latency_ms: f64,
}

/// Stacked bars of layer time by category (module docs).
#[derive(Debug, Clone)]
pub struct LayerBreakdownFigure {
    /// Title.
    pub title: String,
    /// Bars.
    pub bars: Vec<LayerBar>,
    /// Draw shares of each layer (100% stacks) instead of milliseconds.
    pub share: bool,
    /// Footnotes.
    pub notes: Vec<String>,
}

impl LayerBreakdownFigure {
    /// Bars from runs.
    pub fn from_runs(runs: &[LabelledLayer], share: bool, title: Option<&str>) -> Self {
        let bars = runs
            .iter()
            .map(|r| LayerBar {
                label: r.label.clone(),
                ms: Category::ALL.iter().map(|&c| (c, r.run.result.breakdown.get(c) * 1e3)).collect(),
                latency_ms: r.run.result.seconds * 1e3,
            })
            .collect();
        let first = runs.first().map(|r| &r.run.result.plan);
        let mut notes = Vec::new();
        if let Some(p) = first {
            let distinct = |f: &dyn Fn(&tpusim_layer::LayerPlan) -> String| {
                let mut v: Vec<String> = Vec::new();
                for r in runs {
                    let x = f(&r.run.result.plan);
                    if !v.contains(&x) {
                        v.push(x);
                    }
                }
                v.join(", ")
            };
            notes.push(format!(
                "{} block on {} (slices {}); guidance as {}; weights {}; {} collectives. Each bar: one block, one denoising step, on one chip.",
                p.model.name,
                p.chip.name,
                distinct(&|p| p.slice.label()),
                distinct(&|p| match p.cfg {
                    tpusim_layer::Cfg::Groups => "two chip groups".to_string(),
                    tpusim_layer::Cfg::Batch => "a batch of 2".to_string(),
                    c => c.to_string(),
                }),
                p.weights,
                if p.overlap { "overlapped" } else { "serialised" }
            ));
        }
        notes.push(
            "Exposed time: collectives hidden under compute count nowhere; a TensorCore wait for a collective counts for the collective."
                .into(),
        );
        LayerBreakdownFigure {
            title: title.map(str::to_string).unwrap_or_else(|| {
                if share {
                    "Share of layer time by part".into()
                } else {
                    "Layer time by part".into()
                }
            }),
            bars,
            share,
            notes,
        }
    }
}

impl Figure for LayerBreakdownFigure {
    /// Per bar its latency and attention's share of it: `720p dense: 97.0 ms, attention 79.2%`.
    fn facts(&self) -> Vec<String> {
        self.bars
            .iter()
            .map(|b| {
                let att = b.ms.iter().filter(|(c, _)| *c == Category::Attention).map(|(_, v)| v).sum::<f64>();
                let share = if b.latency_ms > 0.0 { 100.0 * att / b.latency_ms } else { 0.0 };
                format!("{}: {:.1} ms, attention {share:.1}%", b.label, b.latency_ms)
            })
            .collect()
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), PlotError>
    where
        DB::ErrorType: 'static,
    {
        let s = Sizes::for_height(root.dim_in_pixel().1);
        let sub = if self.share {
            "Each layer's time split by part, as shares of the layer (its latency in ms above the bar)."
        } else {
            "Each layer's time split by part, ms per chip (parts add up to the latency)."
        };
        let area = style::frame(root, &self.title, sub, &self.notes)?;
        let n = self.bars.len().max(1);
        let top = if self.share { 108.0 } else { self.bars.iter().map(|b| b.latency_ms).fold(0.0f64, f64::max).max(1e-9) * 1.12 };
        let (area_w, _) = area.dim_in_pixel();
        let legend_w = (s.tick * 10.0) as u32;
        let (chart_area, legend_area) = area.split_horizontally(area_w - legend_w);
        let mut chart = ChartBuilder::on(&chart_area)
            .margin_right(s.tick as u32)
            .x_label_area_size((s.label * 3.4) as u32)
            .y_label_area_size((s.label * 4.0) as u32)
            .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..top)
            .map_err(draw_err)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .y_desc(if self.share { "share of layer time (%)" } else { "time per layer per chip (ms)" })
            .axis_desc_style(style::font(s.label))
            .label_style(style::font(s.tick))
            .y_label_formatter(&|v| style::tick_label(*v))
            .light_line_style(WHITE)
            .bold_line_style(style::LIGHT_GREY)
            .draw()
            .map_err(draw_err)?;
        let plot = chart.plotting_area();
        let half = 0.32;
        for (i, b) in self.bars.iter().enumerate() {
            let x = i as f64;
            let k = if self.share && b.latency_ms > 0.0 { 100.0 / b.latency_ms } else { 1.0 };
            let mut y = 0.0;
            for &(c, v) in &b.ms {
                let v = v * k;
                if v <= 0.0 {
                    continue;
                }
                plot.draw(&Rectangle::new([(x - half, y), (x + half, y + v)], category_color(c).filled())).map_err(draw_err)?;
                plot.draw(&Rectangle::new([(x - half, y), (x + half, y + v)], WHITE.stroke_width(1))).map_err(draw_err)?;
                let (p0, p1) = (plot.map_coordinate(&(x, y)), plot.map_coordinate(&(x, y + v)));
                if (p0.1 - p1.1) as f64 > s.tick * 1.3 {
                    let txt = if self.share { format!("{:.1}%", v) } else { format!("{} ms", sig3(v)) };
                    let fg = if matches!(c, Category::Elementwise | Category::FeedForward) { BLACK } else { WHITE };
                    style::centered(root, &txt, ((p0.0 + p1.0) / 2, (p0.1 + p1.1) / 2), &style::font_c(s.tick * 0.9, fg))?;
                }
                y += v;
            }
            let tot = plot.map_coordinate(&(x, y));
            let st = style::font(s.tick).pos(Pos::new(HPos::Center, VPos::Bottom));
            root.draw(&Text::new(format!("{} ms", sig3(b.latency_ms)), (tot.0, tot.1 - 4), st)).map_err(draw_err)?;
            // The label under the bar, wrapped to the bar's slot.
            let base = plot.map_coordinate(&(x, 0.0));
            let slot = plot.map_coordinate(&(x + 0.5, 0.0)).0 - plot.map_coordinate(&(x - 0.5, 0.0)).0;
            let lf = style::font(s.label * 0.9);
            let mut ly = base.1 + (s.tick * 0.5) as i32;
            for line in style::wrap(root, &b.label, &lf, slot - 6) {
                let st = lf.pos(Pos::new(HPos::Center, VPos::Top));
                root.draw(&Text::new(line.trim().to_string(), (base.0, ly), st)).map_err(draw_err)?;
                ly += (s.label * 1.05) as i32;
            }
        }
        let st = style::font(s.tick).pos(Pos::new(HPos::Left, VPos::Center));
        let sq = (s.tick * 0.9) as i32;
        let x0 = (s.tick * 0.5) as i32;
        let mut yy = (s.tick * 1.5) as i32;
        legend_area.draw(&Text::new("part", (x0, yy), style::font(s.label).pos(Pos::new(HPos::Left, VPos::Center)))).map_err(draw_err)?;
        yy += (s.label * 1.5) as i32;
        let used: Vec<Category> =
            Category::ALL.iter().copied().filter(|&c| self.bars.iter().any(|b| b.ms.iter().any(|&(k, v)| k == c && v > 0.0))).collect();
        for c in used.iter().rev() {
            legend_area
                .draw(&Rectangle::new([(x0, yy - sq / 2), (x0 + sq, yy + sq / 2)], category_color(*c).filled()))
                .map_err(draw_err)?;
            legend_area.draw(&Text::new(c.word().to_string(), (x0 + sq + 8, yy), st.clone())).map_err(draw_err)?;
            yy += (s.tick * 1.6) as i32;
        }
        Ok(())
    }
}

/// A reference speedup to mark on the curve with the same label.
#[derive(Debug, Clone, PartialEq)]
pub struct Mark {
    /// The curve's label.
    pub label: String,
    /// The speedup.
    pub speedup: f64,
}

impl Mark {
    /// Parses `LABEL=SPEEDUP`.
    ///
    /// # Errors
    /// [`PlotError::Input`] naming `--mark`.
    pub fn parse(text: &str) -> Result<Mark, PlotError> {
        let bad = || {
            PlotError::Input(format!(
                "--mark {text}: expected LABEL=SPEEDUP with a curve's label and a speedup of at least 1, e.g. 720p=1.28"
            ))
        };
        let (l, v) = text.split_once('=').ok_or_else(bad)?;
        let speedup: f64 = v.trim().parse().map_err(|_| bad())?;
        if !(speedup.is_finite() && speedup >= 1.0) || l.trim().is_empty() {
            return Err(bad());
        }
        Ok(Mark { label: l.trim().to_string(), speedup })
    }
}

/// One curve of the speedup figure.
#[derive(Debug, Clone, PartialEq)]
pub struct SpeedupCurve {
    /// Label.
    pub label: String,
    /// Dense and sparse layer time, ms.
    pub dense_ms: f64,
    /// Sparse layer time, ms.
    pub sparse_ms: f64,
    /// The curve's mark and the dense fraction meeting it (`None`: not reachable).
    pub mark: Option<(f64, Option<f64>)>,
}

impl SpeedupCurve {
    /// The speedup at dense fraction `f`.
    pub fn at(&self, f: f64) -> f64 {
        self.dense_ms / (f * self.dense_ms + (1.0 - f) * self.sparse_ms)
    }
}

/// End-to-end speedup over the dense fraction (module docs).
#[derive(Debug, Clone)]
pub struct SpeedupFigure {
    /// Title.
    pub title: String,
    /// Curves.
    pub curves: Vec<SpeedupCurve>,
    /// Footnotes.
    pub notes: Vec<String>,
}

impl SpeedupFigure {
    /// Curves from sparse layer runs (each with its dense layer) and marks matched by label.
    ///
    /// # Errors
    /// [`PlotError::Input`] naming `--mark` for a label no curve has, and for runs that are not
    /// sparse.
    pub fn from_runs(runs: &[LabelledLayer], marks: &[Mark], title: Option<&str>) -> Result<Self, PlotError> {
        for m in marks {
            if !runs.iter().any(|r| r.label == m.label) {
                return Err(PlotError::Input(format!(
                    "--mark {}={}: no curve is labelled {:?}; the curves are {}",
                    m.label,
                    m.speedup,
                    m.label,
                    runs.iter().map(|r| r.label.as_str()).collect::<Vec<_>>().join(", ")
                )));
            }
        }
        let mut curves = Vec::new();
        for r in runs {
            let Some(d) = &r.run.dense else {
                return Err(PlotError::Input(format!(
                    "{}: the speedup plot needs sparse attention (it compares each sparse layer with its dense layer)",
                    r.label
                )));
            };
            let (dense_ms, sparse_ms) = (d.seconds * 1e3, r.run.result.seconds * 1e3);
            let mark = marks.iter().find(|m| m.label == r.label).map(|m| (m.speedup, dense_fraction_for(dense_ms, sparse_ms, m.speedup)));
            curves.push(SpeedupCurve { label: r.label.clone(), dense_ms, sparse_ms, mark });
        }
        let mut notes = vec![
            "Speedup = all-dense time / time with a fraction f of the (step, block) pairs dense = 1 / (f + (1 - f) t_sparse / t_dense); only the blocks are simulated.".to_string(),
        ];
        if let Some(p) = runs.first().map(|r| &r.run.result.plan) {
            notes.push(format!(
                "{} on {} x {} ({}), guidance {}, sparse mask: band of half-width {:.4} of the sequence + {} sink frame(s); permutation {}.",
                p.model.name,
                p.slice.devices(),
                p.chip.name,
                p.slice.label(),
                p.cfg,
                p.sparse_band,
                p.sparse_sink_frames,
                p.permutation
            ));
        }
        if !marks.is_empty() {
            notes.push(
                "Marks: reference speedups given with --mark (dashed), and the dense fraction at which each curve meets its mark (dot)."
                    .into(),
            );
        }
        Ok(SpeedupFigure {
            title: title.map(str::to_string).unwrap_or_else(|| "End-to-end speedup of sparse attention over the dense fraction".into()),
            curves,
            notes,
        })
    }
}

impl Figure for SpeedupFigure {
    /// Per curve its all-sparse speedup and the dense fraction meeting its mark: `720p: 1.57x
    /// all sparse, meets 1.28x at dense fraction 0.45`.
    fn facts(&self) -> Vec<String> {
        self.curves
            .iter()
            .map(|c| {
                let meet = match c.mark {
                    Some((m, Some(f))) => format!(", meets {m:.2}x at dense fraction {f:.2}"),
                    Some((m, None)) => format!(", never meets {m:.2}x"),
                    None => String::new(),
                };
                format!("{}: {:.2}x all sparse{meet}", c.label, c.at(0.0))
            })
            .collect()
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), PlotError>
    where
        DB::ErrorType: 'static,
    {
        let s = Sizes::for_height(root.dim_in_pixel().1);
        let area = style::frame(
            root,
            &self.title,
            "Fraction of (step, block) pairs that stay dense: 0 = every block sparse, 1 = all dense.",
            &self.notes,
        )?;
        let top =
            self.curves.iter().map(|c| c.at(0.0)).chain(self.curves.iter().filter_map(|c| c.mark.map(|m| m.0))).fold(1.0f64, f64::max);
        let ymax = 1.0 + (top - 1.0) * 1.1 + 0.05;
        let (aw, _) = area.dim_in_pixel();
        let lw = (s.tick * 16.0) as u32;
        let (chart_area, legend_area) = area.split_horizontally(aw.saturating_sub(lw).max(aw / 2));
        let mut chart = ChartBuilder::on(&chart_area)
            .margin_right((s.tick * 1.5) as u32)
            .x_label_area_size((s.label * 3.2) as u32)
            .y_label_area_size((s.label * 4.0) as u32)
            .build_cartesian_2d(0f64..1f64, 1f64..ymax)
            .map_err(draw_err)?;
        chart
            .configure_mesh()
            .x_desc("dense fraction of (step, block) pairs")
            .y_desc("end-to-end speedup over all-dense")
            .axis_desc_style(style::font(s.label))
            .label_style(style::font(s.tick))
            .x_label_formatter(&|v| format!("{v:.1}"))
            .y_label_formatter(&|v| format!("{v:.2}x"))
            .bold_line_style(style::LIGHT_GREY)
            .light_line_style(WHITE)
            .draw()
            .map_err(draw_err)?;
        for (i, c) in self.curves.iter().enumerate() {
            let col = style::series(i);
            let pts: Vec<(f64, f64)> = (0..=100).map(|k| k as f64 / 100.0).map(|f| (f, c.at(f))).collect();
            chart.draw_series(LineSeries::new(pts, col.stroke_width(3))).map_err(draw_err)?;
            if let Some((sp, f)) = c.mark {
                chart.draw_series(DashedLineSeries::new(vec![(0.0, sp), (1.0, sp)], 8, 6, col.stroke_width(2))).map_err(draw_err)?;
                if let Some(f) = f {
                    let p = chart.plotting_area().map_coordinate(&(f, sp));
                    root.draw(&Circle::new(p, 7, col.filled())).map_err(draw_err)?;
                    let st = style::font_c(s.tick, col).pos(Pos::new(HPos::Left, VPos::Bottom));
                    root.draw(&Text::new(format!("f = {f:.2}"), (p.0 + 8, p.1 - 6), st)).map_err(draw_err)?;
                }
            }
        }
        let lf = style::font(s.tick).pos(Pos::new(HPos::Left, VPos::Center));
        let x0 = (s.tick * 0.8) as i32;
        let mut y = (s.tick * 1.5) as i32;
        for (i, c) in self.curves.iter().enumerate() {
            let col = style::series(i);
            legend_area.draw(&PathElement::new(vec![(x0, y), (x0 + (s.tick * 2.0) as i32, y)], col.stroke_width(3))).map_err(draw_err)?;
            legend_area.draw(&Text::new(c.label.clone(), (x0 + (s.tick * 2.6) as i32, y), lf.clone())).map_err(draw_err)?;
            y += (s.tick * 1.3) as i32;
            let detail = match c.mark {
                Some((sp, Some(f))) => format!("max {:.2}x; {sp}x at f = {f:.2}", c.at(0.0)),
                Some((sp, None)) => format!("max {:.2}x; {sp}x not reachable", c.at(0.0)),
                None => format!("max {:.2}x", c.at(0.0)),
            };
            legend_area
                .draw(&Text::new(
                    detail,
                    (x0 + (s.tick * 2.6) as i32, y),
                    style::font_c(s.tick * 0.85, style::DARK_GREY).pos(Pos::new(HPos::Left, VPos::Center)),
                ))
                .map_err(draw_err)?;
            y += (s.tick * 1.8) as i32;
        }
        Ok(())
    }
}
