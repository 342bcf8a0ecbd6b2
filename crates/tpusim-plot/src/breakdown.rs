//! Stacked bars of busy time per unit (MXU, VPU, EUP, XLU, HBM DMA, step control) for several
//! jobs side by side, each with its latency marked. Busy times come from the report
//! (`busy_ms`); units run concurrently, so a stack is total work, not elapsed time. A job of
//! several phases (a backward's dq and dkv kernels, a training step, the library's XLA ops in
//! `--scope op`) is drawn as one bar per phase, in order, so the split of time between kernels
//! shows; each phase's bar has its own latency.

use crate::jobs::{describe, JobRun};
use crate::style::{self, Sizes};
use crate::{draw_err, sig3, Figure, PlotError};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use tpusim_model::{PerUnit, Unit};

/// One bar.
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    /// Label under the bar.
    pub label: String,
    /// Busy ms per unit (stacked bottom to top in [`Unit::ALL`] order).
    pub busy_ms: PerUnit<f64>,
    /// Latency, ms.
    pub latency_ms: f64,
    /// Bounding unit.
    pub bottleneck: Unit,
}

/// The breakdown figure.
#[derive(Debug, Clone)]
pub struct BreakdownFigure {
    /// Title.
    pub title: String,
    /// Bars in order.
    pub bars: Vec<Bar>,
    /// Footnotes (job descriptions).
    pub notes: Vec<String>,
}

impl BreakdownFigure {
    /// Bars from runs: one per job, or one per phase of a job that has several (the XLA ops
    /// outside the kernels summed into one bar).
    pub fn from_runs(runs: &[JobRun], title: Option<&str>) -> Self {
        let mut bars = Vec::new();
        for r in runs {
            // A kernel read from its IR is one phase.
            let phased = Some(&*r.run).filter(|run| run.phases.len() > 1);
            let Some(run) = phased else {
                bars.push(Bar { label: r.label.clone(), busy_ms: r.busy_ms(), latency_ms: r.latency_ms(), bottleneck: r.bottleneck() });
                continue;
            };
            let ms = 1e3 / run.chip.clock_hz();
            let mut outside: Option<Bar> = None;
            for (p, lowered) in run.phases.iter().zip(&run.lowered.phases) {
                let busy = PerUnit(std::array::from_fn(|u| p.result.busy.0[u] * ms));
                let latency_ms = p.result.seconds * 1e3;
                if matches!(lowered.work, tpusim_model::PhaseWork::Fusion(_)) {
                    // XLA fusions: summed into one bar per job.
                    let b = outside.get_or_insert(Bar {
                        label: format!("{}: XLA ops", r.label),
                        busy_ms: PerUnit::default(),
                        latency_ms: 0.0,
                        bottleneck: Unit::Hbm,
                    });
                    b.busy_ms.add_scaled(&busy, 1.0);
                    b.latency_ms += latency_ms;
                } else {
                    bars.push(Bar {
                        label: format!("{}: {}", r.label, p.part.label()),
                        busy_ms: busy,
                        latency_ms,
                        bottleneck: p.result.bottleneck(),
                    });
                }
            }
            bars.extend(outside);
        }
        BreakdownFigure { title: title.unwrap_or("Busy time per unit").to_string(), bars, notes: runs.iter().map(describe).collect() }
    }
}

impl Figure for BreakdownFigure {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), PlotError>
    where
        DB::ErrorType: 'static,
    {
        let s = Sizes::for_height(root.dim_in_pixel().1);
        let sub = "Stacked busy time per unit from the simulation; units run concurrently, so a stack can exceed the latency (black line).";
        let area = style::frame(root, &self.title, sub, &self.notes)?;
        let n = self.bars.len().max(1);
        let top = self.bars.iter().map(|b| b.busy_ms.total().max(b.latency_ms)).fold(0.0f64, f64::max).max(1e-9) * 1.12;
        let (area_w, _) = area.dim_in_pixel();
        let legend_w = (s.tick * 9.5) as u32;
        let (chart_area, legend_area) = area.split_horizontally(area_w - legend_w);
        // Bar names (each with its bound below) that do not fit their slot go to rows taken in
        // turn, so that neighbours' names never overlap; the font shrinks first, to 75%.
        let slot = (area_w as f64 - legend_w as f64 - s.label * 4.0 - s.tick) / n as f64;
        let widest = |size: f64| self.bars.iter().map(|b| style::text_width(root, &b.label, &style::font(size))).max().unwrap_or(0) as f64;
        let mut name_size = s.label;
        while name_size > s.label * 0.75 && widest(name_size) > slot - 8.0 {
            name_size -= 1.0;
        }
        let name_rows = ((widest(name_size) + 8.0) / slot).ceil().clamp(1.0, 4.0) as i32;
        let name_font = style::font(name_size);
        let mut chart = ChartBuilder::on(&chart_area)
            .margin_right((s.tick) as u32)
            .x_label_area_size((s.label * (0.6 + 2.6 * name_rows as f64)) as u32)
            .y_label_area_size((s.label * 4.0) as u32)
            .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..top)
            .map_err(draw_err)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .y_desc("busy time (ms)")
            .axis_desc_style(style::font(s.label))
            .label_style(style::font(s.tick))
            .y_label_formatter(&|v| style::tick_label(*v))
            .light_line_style(WHITE)
            .bold_line_style(style::LIGHT_GREY)
            .draw()
            .map_err(draw_err)?;
        let plot = chart.plotting_area();
        let half = 0.3;
        // Every label goes through one layout, clear of the others, of the segment labels and
        // of the latency markers; bars are drawn first so that none covers a label.
        let mut labels = style::Labels::new();
        // The y axis's tick labels are plotters', outside the layout: keep every label off them.
        let (left, top_px) = plot.map_coordinate(&(-0.5, top));
        let (_, bottom_px) = plot.map_coordinate(&(-0.5, 0.0));
        labels.reserve([0, top_px - (s.tick * 2.0) as i32, left + 2, bottom_px + (s.tick * 0.4) as i32]);
        let mut tops = Vec::with_capacity(self.bars.len());
        for (i, b) in self.bars.iter().enumerate() {
            let x = i as f64;
            let mut y = 0.0;
            for (u, v) in b.busy_ms.iter() {
                if v <= 0.0 {
                    continue;
                }
                let c = style::unit_color(u);
                plot.draw(&Rectangle::new([(x - half, y), (x + half, y + v)], c.filled())).map_err(draw_err)?;
                plot.draw(&Rectangle::new([(x - half, y), (x + half, y + v)], WHITE.stroke_width(1))).map_err(draw_err)?;
                // Label the segment when it is tall and wide enough to hold text.
                let (p0, p1) = (plot.map_coordinate(&(x, y)), plot.map_coordinate(&(x, y + v)));
                let txt = format!("{} {}", u.label(), sig3(v));
                let bar_px = plot.map_coordinate(&(x + half, y)).0 - plot.map_coordinate(&(x - half, y)).0;
                if (p0.1 - p1.1) as f64 > s.tick * 1.3 && style::text_width(root, &txt, &style::font(s.tick * 0.9)) + 4 < bar_px {
                    let fg = if matches!(u, Unit::Vpu | Unit::Hbm | Unit::StepControl | Unit::Xlu) { BLACK } else { WHITE };
                    // Keep the label off the latency line: move it above or below, or drop it.
                    let lat_py = plot.map_coordinate(&(x, b.latency_ms)).1;
                    let half_h = (s.tick * 0.55) as i32;
                    let mut ly = (p0.1 + p1.1) / 2;
                    if (ly - lat_py).abs() <= half_h + 3 {
                        let above = lat_py - half_h - 5;
                        let below = lat_py + half_h + 5;
                        ly = if above - half_h > p1.1 {
                            above
                        } else if below + half_h < p0.1 {
                            below
                        } else {
                            i32::MIN
                        };
                    }
                    if ly != i32::MIN {
                        style::centered(root, &txt, (p0.0, ly), &style::font_c(s.tick * 0.9, fg))?;
                        let (w, h) = (style::text_width(root, &txt, &style::font(s.tick * 0.9)), (s.tick * 0.9) as i32);
                        labels.reserve([p0.0 - w / 2 - 2, ly - h / 2 - 2, p0.0 + w / 2 + 2, ly + h / 2 + 2]);
                    }
                }
                y += v;
            }
            // Latency marker.
            let l = b.latency_ms;
            plot.draw(&PathElement::new(vec![(x - half - 0.06, l), (x + half + 0.06, l)], BLACK.stroke_width(4))).map_err(draw_err)?;
            let (a, c) = (plot.map_coordinate(&(x - half - 0.06, l)), plot.map_coordinate(&(x + half + 0.06, l)));
            labels.reserve([a.0, a.1 - 3, c.0, c.1 + 3]);
            tops.push(y);
        }
        // Names first (they keep their rows), then the values, which move around them.
        for (i, b) in self.bars.iter().enumerate() {
            let x = i as f64;
            // Under the bar, in its row: the name, then the bound.
            let base = plot.map_coordinate(&(x, 0.0));
            let row = (s.label * 1.3) as i32;
            let y0 = base.1 + (s.tick * 0.6) as i32 + (i as i32 % name_rows) * 2 * row;
            labels.place_fixed(root, &b.label, &name_font.pos(Pos::new(HPos::Center, VPos::Top)), &[(base.0, y0)])?;
            let st = style::font_c(s.tick, style::DARK_GREY).pos(Pos::new(HPos::Center, VPos::Top));
            labels.place_fixed(root, &format!("bound by {}", b.bottleneck), &st, &[(base.0, y0 + row)])?;
        }
        for (i, b) in self.bars.iter().enumerate() {
            let (x, l) = (i as f64, b.latency_ms);
            // The latency's value right of its marker, else left of it, else moved up or down.
            let txt = format!("{} ms", sig3(l));
            let st = style::font(s.tick * 0.95).pos(Pos::new(HPos::Left, VPos::Center));
            let (p, q) = (plot.map_coordinate(&(x + half + 0.07, l)), plot.map_coordinate(&(x - half - 0.07, l)));
            labels.place(root, &txt, &st, &[p, (q.0 - style::text_width(root, &txt, &st) - 6, q.1)])?;
            let tot = plot.map_coordinate(&(x, tops[i]));
            let st = style::font_c(s.tick * 0.9, style::DARK_GREY).pos(Pos::new(HPos::Center, VPos::Bottom));
            // Units run at once: their busy times may add up to more than the latency (say so),
            // or, with idle gaps, to less.
            let why = if tops[i] > l { "units overlap" } else { "units also idle" };
            labels.place(root, &format!("busy total {} ms ({why})", sig3(tops[i])), &st, &[(tot.0, tot.1 - 4)])?;
        }
        // Legend: top of the right column, top unit first (stack order).
        let st = style::font(s.tick).pos(Pos::new(HPos::Left, VPos::Center));
        let sq = (s.tick * 0.9) as i32;
        let mut yy = (s.tick * 1.5) as i32;
        let x0 = (s.tick * 0.5) as i32;
        legend_area.draw(&Text::new("unit", (x0, yy), style::font(s.label).pos(Pos::new(HPos::Left, VPos::Center)))).map_err(draw_err)?;
        yy += (s.label * 1.5) as i32;
        for u in Unit::ALL.iter().rev() {
            let c = style::unit_color(*u);
            legend_area.draw(&Rectangle::new([(x0, yy - sq / 2), (x0 + sq, yy + sq / 2)], c.filled())).map_err(draw_err)?;
            legend_area.draw(&Text::new(u.label().to_string(), (x0 + sq + 8, yy), st.clone())).map_err(draw_err)?;
            yy += (s.tick * 1.6) as i32;
        }
        legend_area.draw(&PathElement::new(vec![(x0, yy), (x0 + sq, yy)], BLACK.stroke_width(4))).map_err(draw_err)?;
        legend_area.draw(&Text::new("latency", (x0 + sq + 8, yy), st)).map_err(draw_err)?;
        Ok(())
    }
}
