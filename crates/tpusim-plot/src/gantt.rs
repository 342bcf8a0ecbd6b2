//! A Gantt chart of unit activity over a window of grid steps: one row per track (MXU, VPU, EUP,
//! XLU, DMA in, DMA out, step control), one bar per event of [`crate::timeline`], step
//! boundaries marked and labelled with the step's head, q block, kv block and tile kind, and
//! each track's busy share of the window at the right.

use crate::style::{self, Sizes, DARK_GREY};
use crate::timeline::{Track, UsEvent};
use crate::{draw_err, sig3, Figure, PlotError};
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// The Gantt figure.
#[derive(Debug, Clone)]
pub struct GanttFigure {
    /// Title.
    pub title: String,
    /// Subtitle.
    pub subtitle: String,
    /// Events (microseconds).
    pub events: Vec<UsEvent>,
    /// Footnotes.
    pub notes: Vec<String>,
}

/// Colour of an event: by track, with the MXU's two matmuls and the VPU's mask work told apart.
pub fn event_color(track: Track, name: &str) -> RGBColor {
    match (track, name) {
        (Track::Mxu, "pv") => style::LIGHT_BLUE,
        (Track::Vpu, "mask") => style::DARK_ORANGE,
        (Track::DmaOut, _) => style::LIGHT_GREEN,
        _ => style::unit_color(track.report_unit()),
    }
}

/// Legend label of an event's colour. Attention bodies get their softmax vocabulary; other
/// kernels' operations are named as they are.
fn legend_label(track: Track, name: &str, attention: bool) -> String {
    let named = |unit: &str| format!("{unit} ({name})");
    match (track, name) {
        (Track::Mxu, "qk") => "MXU QK^T".into(),
        (Track::Mxu, "pv") => "MXU PV".into(),
        (Track::Mxu, _) => named("MXU"),
        (Track::Vpu, "mask") => "VPU mask".into(),
        (Track::Vpu, _) if attention => "VPU (softmax, accumulate)".into(),
        (Track::Vpu, _) => "VPU".into(),
        (Track::Eup, _) if attention => "EUP (exp, reciprocal)".into(),
        (Track::Eup, _) => named("EUP"),
        (Track::Xlu, _) if attention => "XLU (row max, row sum)".into(),
        (Track::Xlu, _) => named("XLU"),
        (Track::DmaIn, _) => "DMA in".into(),
        (Track::DmaOut, _) => "DMA out".into(),
        (Track::StepControl, _) => "step overhead".into(),
    }
}

/// A darker shade of a colour (alternate operations on one track).
fn shade(c: RGBColor) -> RGBColor {
    RGBColor((c.0 as f64 * 0.8) as u8, (c.1 as f64 * 0.8) as u8, (c.2 as f64 * 0.8) as u8)
}

impl GanttFigure {
    /// A Gantt chart of the events of grid steps `steps.0..steps.1` (plus the next step's input
    /// DMA, which runs inside the window as a prefetch); time runs from the first step's overhead
    /// and bars are clipped to the window. `what` names the run in the title; `job` (if any)
    /// describes it in a footnote.
    ///
    /// # Errors
    /// [`PlotError`] when no event falls in the window.
    pub fn new(events: Vec<UsEvent>, steps: (u64, u64), what: &str, job: Option<String>, title: Option<&str>) -> Result<Self, PlotError> {
        let inside = |e: &UsEvent| e.step >= steps.0 && e.step < steps.1;
        let main: Vec<&UsEvent> = events.iter().filter(|e| inside(e)).collect();
        if main.is_empty() {
            return Err(PlotError::Input(format!(
                "timeline: no event in grid steps {}..{} (check --steps / --head)",
                steps.0,
                if steps.1 == u64::MAX { String::new() } else { steps.1.to_string() }
            )));
        }
        let t0 = main.iter().filter(|e| e.track != Track::DmaIn).map(|e| e.ts).fold(f64::INFINITY, f64::min);
        let t0 = if t0.is_finite() { t0 } else { main.iter().map(|e| e.ts).fold(f64::INFINITY, f64::min) };
        let t1 = main.iter().map(|e| e.ts + e.dur).fold(0.0f64, f64::max);
        let mut kept = Vec::new();
        for e in &events {
            let prefetch = e.track == Track::DmaIn && e.step == steps.1;
            if !(inside(e) || prefetch) {
                continue;
            }
            let (a, b) = (e.ts.max(t0), (e.ts + e.dur).min(t1));
            if b > a {
                kept.push(UsEvent { ts: a, dur: b - a, ..e.clone() });
            }
        }
        let mut ids: Vec<u64> = main.iter().map(|e| e.step).collect();
        ids.sort_unstable();
        ids.dedup();
        let span = (t1 - t0).max(1e-12);
        let busy: Vec<String> = [Track::Mxu, Track::Vpu, Track::Eup, Track::Xlu]
            .iter()
            .map(|t| {
                let b = kept.iter().filter(|e| e.track == *t).fold(0.0, |a, e| a + e.dur);
                format!("{} {:.0}%", t.name(), 100.0 * b / span)
            })
            .collect();
        let range = match (ids.first(), ids.last()) {
            (Some(a), Some(b)) if a == b => format!("grid step {a}"),
            (Some(a), Some(b)) if b - a + 1 == ids.len() as u64 => format!("grid steps {a} to {b}"),
            (Some(a), Some(b)) => format!("{} grid steps from {a} to {b}", ids.len()),
            _ => String::new(),
        };
        let subtitle = format!("{} µs from t = {} µs into the run; busy in this window: {}", sig3(span), sig3(t0), busy.join(", "));
        let mut notes = vec![
            "Bars: each operation's occupancy of its unit (its result arrives a latency later); DMA: transfers after the DMA latency, the next step's input prefetched during this one.".to_string(),
            "Same events as tpusim run --timeline FILE.json, which Perfetto and chrome://tracing open with each operation's grid step, blocks and tile kind.".to_string(),
        ];
        notes.extend(job);
        Ok(GanttFigure {
            title: title.map(str::to_string).unwrap_or_else(|| format!("Timeline of {what}: {range}")),
            subtitle,
            events: kept,
            notes,
        })
    }
}

impl Figure for GanttFigure {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), PlotError>
    where
        DB::ErrorType: 'static,
    {
        let s = Sizes::for_height(root.dim_in_pixel().1);
        let area = style::frame(root, &self.title, &self.subtitle, &self.notes)?;
        let (_, ah) = area.dim_in_pixel();
        let legend_h = (s.tick * 2.2) as u32;
        let (main, legend_area) = area.split_vertically(ah - legend_h);
        let t0 = self.events.iter().map(|e| e.ts).fold(f64::INFINITY, f64::min);
        let t1 = self.events.iter().map(|e| e.ts + e.dur).fold(0.0f64, f64::max);
        let span = (t1 - t0).max(1e-9);
        let n = Track::ALL.len() as f64;
        let label_w = (s.label * 6.5) as u32;
        let pct_w = (s.tick * 4.5) as u32;
        let step_band = (s.tick * 2.8) as u32;
        let mut chart = ChartBuilder::on(&main)
            .margin_top(step_band)
            .margin_right(pct_w)
            .x_label_area_size((s.label * 3.2) as u32)
            .y_label_area_size(label_w)
            .build_cartesian_2d(0f64..span, 0f64..n)
            .map_err(draw_err)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(0)
            .x_desc("time from the window's start (µs)")
            .axis_desc_style(style::font(s.label))
            .label_style(style::font(s.tick))
            .x_label_formatter(&|v| style::tick_label(*v))
            .bold_line_style(style::LIGHT_GREY)
            .light_line_style(WHITE)
            .draw()
            .map_err(draw_err)?;
        let plot = chart.plotting_area();
        let row_y = |t: Track| n - 1.0 - t as usize as f64; // first track on top
                                                            // Track backgrounds and names.
        for t in Track::ALL {
            let y = row_y(t);
            if (t as usize).is_multiple_of(2) {
                plot.draw(&Rectangle::new([(0.0, y), (span, y + 1.0)], RGBColor(246, 246, 246).filled())).map_err(draw_err)?;
            }
            let p = plot.map_coordinate(&(0.0, y + 0.5));
            let st = style::font(s.label).pos(Pos::new(HPos::Right, VPos::Center));
            root.draw(&Text::new(t.name(), (p.0 - 10, p.1), st)).map_err(draw_err)?;
            let busy = self.events.iter().filter(|e| e.track == t).fold(0.0, |a, e| a + e.dur);
            let p = plot.map_coordinate(&(span, y + 0.5));
            let st = style::font_c(s.tick, DARK_GREY).pos(Pos::new(HPos::Left, VPos::Center));
            root.draw(&Text::new(format!("{:.0}%", 100.0 * busy / span), (p.0 + 8, p.1), st)).map_err(draw_err)?;
        }
        let p = plot.map_coordinate(&(span, n));
        let st = style::font_c(s.tick * 0.9, DARK_GREY).pos(Pos::new(HPos::Left, VPos::Bottom));
        root.draw(&Text::new("busy", (p.0 + 8, p.1 - 4), st)).map_err(draw_err)?;
        // Step boundaries (each step's first non-DMA-in event: its overhead) with labels.
        let mut starts: Vec<(u64, f64, String)> = Vec::new();
        for e in self.events.iter().filter(|e| e.track != Track::DmaIn) {
            match starts.iter_mut().find(|x| x.0 == e.step) {
                Some(x) => x.1 = x.1.min(e.ts),
                None => starts.push((e.step, e.ts, e.desc.clone())),
            }
        }
        starts.sort_by(|a, b| a.1.total_cmp(&b.1));
        let px_per_us = (plot.map_coordinate(&(span, 0.0)).0 - plot.map_coordinate(&(0.0, 0.0)).0) as f64 / span;
        let lf = style::font(s.tick * 0.9);
        let mut last_label_end = i32::MIN;
        for (i, (step, ts, desc)) in starts.iter().enumerate() {
            let x = ts - t0;
            plot.draw(&DashedPathElement::new(vec![(x, 0.0), (x, n)], 4, 4, DARK_GREY.stroke_width(1))).map_err(draw_err)?;
            let next = starts.get(i + 1).map_or(span, |n| n.1 - t0);
            let room = ((next - x) * px_per_us) as i32;
            let p = plot.map_coordinate(&(x, n));
            let full = format!("step {step}: {desc}");
            let short = format!("{step}");
            let txt = if style::text_width(root, &full, &lf) + 8 < room { full } else { short };
            if p.0 > last_label_end {
                let st = lf.pos(Pos::new(HPos::Left, VPos::Bottom));
                root.draw(&Text::new(txt.clone(), (p.0 + 3, p.1 - 4), st)).map_err(draw_err)?;
                last_label_end = p.0 + style::text_width(root, &txt, &lf) + 6;
            }
        }
        // Events: consecutive operations on a track alternate between two shades, so that
        // back-to-back operations stay distinguishable without gaps that would misstate the
        // busy time.
        let mut parity = [false; 7];
        let mut last_end = [f64::NEG_INFINITY; 7];
        let mut ordered: Vec<&UsEvent> = self.events.iter().collect();
        ordered.sort_by(|a, b| a.ts.total_cmp(&b.ts));
        let attention = self.events.iter().any(|e| e.name == "qk");
        let mut legend: Vec<(Track, String, RGBColor)> = Vec::new();
        for e in ordered {
            let y = row_y(e.track);
            let (x0, x1) = (e.ts - t0, e.ts - t0 + e.dur);
            let base = event_color(e.track, &e.name);
            let k = e.track as usize;
            // Alternate shades only between operations that touch (less than a pixel apart).
            parity[k] = (x0 - last_end[k]) * px_per_us < 1.0 && !parity[k];
            last_end[k] = x1;
            let c = if parity[k] { shade(base) } else { base };
            plot.draw(&Rectangle::new([(x0, y + 0.15), (x1, y + 0.85)], c.filled())).map_err(draw_err)?;
            let l = legend_label(e.track, &e.name, attention);
            if !legend.iter().any(|(_, x, _)| *x == l) {
                legend.push((e.track, l, base));
            }
        }
        let rank = |l: &str| ["MXU QK^T", "MXU PV", "VPU (softmax, accumulate)", "VPU mask"].iter().position(|x| *x == l).unwrap_or(9);
        legend.sort_by_key(|x| (x.0, rank(&x.1)));
        let items: Vec<(String, RGBColor)> = legend.into_iter().map(|(_, l, c)| (l, c)).collect();
        style::legend_row(&legend_area, &items, ((s.tick * 0.8) as i32, (legend_h / 2) as i32), s.tick * 0.95)?;
        Ok(())
    }
}
