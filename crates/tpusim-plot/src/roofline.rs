//! Roofline: arithmetic intensity (FLOP per HBM byte) against achieved FLOP/s, log-log, with
//! the chip's roofs and each workload's own ceilings.
//!
//! Formulas (all from the chip model and the simulation; nothing is fitted here):
//!
//! * **HBM roof**: FLOP/s = intensity x the device's sustained DMA bandwidth
//!   ([`tpusim_chip::ChipModel::sustained_hbm_gb_per_s`]);
//! * **MXU peak**: 2 x MXUs x rows x columns x passes per cycle x clock
//!   ([`tpusim_chip::ChipModel::peak_flops`]);
//! * **MXU ceiling at head_dim** (attention): QK^T contracts over d, so a weight tile uses
//!   e_qk = d / (rows x ceil(d / rows)) of the array's rows; PV produces dv columns, so it uses
//!   e_pv = dv / (columns x ceil(dv / columns)) of its columns. The two matmuls do equal FLOPs
//!   when d = dv; in general the ceiling is peak x (F_qk + F_pv) / (F_qk / e_qk + F_pv / e_pv)
//!   with F_qk : F_pv = d : dv. For d = dv = 128 on 256 x 256 arrays: half the peak;
//! * **softmax ceiling** of a workload: the FLOP rate at which the vector work per score equals
//!   the matmul work per score: FLOPs per score 2 (d + dv) over VPU cycles per score, times the
//!   clock, i.e. executed FLOPs / (VPU busy cycles / clock) from the simulation (the VPU work of
//!   the lowering: softmax, mask ops, accumulator update). The EUP ceiling is computed the same
//!   way; the lower of the two is drawn and named.
//!
//! A workload's point is (executed FLOPs / HBM bytes, executed FLOPs / latency).

use crate::jobs::{describe, JobRun};
use crate::style::{self, Sizes, DARK_GREY};
use crate::{draw_err, sig3, Figure, PlotError};
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use tpusim_chip::ChipModel;
use tpusim_job::Job;

/// Roofs of one chip.
#[derive(Debug, Clone, PartialEq)]
pub struct ChipRoofs {
    /// Chip name.
    pub chip: String,
    /// MXU peak, FLOP/s.
    pub peak: f64,
    /// Sustained HBM bandwidth, bytes/s.
    pub bw: f64,
    /// Peak HBM bandwidth, GB/s, and efficiency (for the label).
    pub bw_peak_gbs: f64,
    /// Sustained over peak HBM bandwidth.
    pub efficiency: f64,
    /// MXU array rows and columns.
    pub rows_cols: (u64, u64),
}

impl ChipRoofs {
    /// Roofs of a chip model.
    pub fn of(chip: &ChipModel) -> Self {
        ChipRoofs {
            chip: chip.name.clone(),
            peak: chip.peak_flops(),
            bw: chip.sustained_hbm_gb_per_s() * 1e9,
            bw_peak_gbs: chip.hbm.bandwidth_gb_per_s.value,
            efficiency: chip.sustained_hbm_gb_per_s() / chip.hbm.bandwidth_gb_per_s.value,
            rows_cols: (chip.mxu.rows.value as u64, chip.mxu.columns.value as u64),
        }
    }
}

/// Fraction of the MXU peak that attention matmuls can reach at head dims `d` (QK^T contraction)
/// and `dv` (PV output columns) on `rows` x `cols` arrays (module docs).
pub fn mxu_head_dim_fraction(d: u64, dv: u64, rows: u64, cols: u64) -> f64 {
    let e_qk = d as f64 / (rows * d.div_ceil(rows)) as f64;
    let e_pv = dv as f64 / (cols * dv.div_ceil(cols)) as f64;
    let (f_qk, f_pv) = (d as f64, dv as f64);
    (f_qk + f_pv) / (f_qk / e_qk + f_pv / e_pv)
}

/// One workload's point and ceilings.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// Legend label.
    pub label: String,
    /// Chip it ran on.
    pub chip: String,
    /// FLOP per HBM byte.
    pub intensity: f64,
    /// Executed FLOP/s (the MXU's work, padding and masked pairs of visited tiles included: what
    /// the roofs bound, at the intensity's executed FLOPs per byte).
    pub achieved: f64,
    /// MFU: the run's useful (model) FLOPs per second over the peak, as `tpusim run` gives it
    /// (below `achieved` / peak where work is padded or masked).
    pub mfu: f64,
    /// MXU ceiling at the workload's head dims, FLOP/s (attention only).
    pub mxu_head_dim: Option<(u64, f64)>,
    /// Softmax ceiling: (unit that sets it, FLOP/s).
    pub softmax: Option<(&'static str, f64)>,
}

impl Point {
    /// The point and ceilings of a run (module docs for the formulas).
    pub fn of(r: &JobRun) -> Self {
        let res = r.result();
        let chip = r.chip();
        let clock = chip.clock_hz();
        let ceiling = |busy: f64| (busy > 0.0).then(|| res.flops / (busy / clock));
        let vpu = ceiling(res.busy[tpusim_model::Unit::Vpu]);
        let eup = ceiling(res.busy[tpusim_model::Unit::Eup]);
        let softmax = match (vpu, eup) {
            (Some(v), Some(e)) if e < v => Some(("EUP", e)),
            (Some(v), _) => Some(("VPU", v)),
            (None, Some(e)) => Some(("EUP", e)),
            (None, None) => None,
        };
        let mxu_head_dim = match r.job() {
            Job::Attention { workload: w, .. } => Some((
                w.head_dim,
                chip.peak_flops()
                    * mxu_head_dim_fraction(w.head_dim, w.head_dim_v, chip.mxu.rows.value as u64, chip.mxu.columns.value as u64),
            )),
            Job::Matmul { .. } | Job::Described(_) => None,
        };
        Point {
            label: r.label.clone(),
            chip: chip.name.clone(),
            intensity: if res.hbm_bytes > 0 { res.flops / res.hbm_bytes as f64 } else { 0.0 },
            achieved: res.flops / res.seconds.max(f64::MIN_POSITIVE),
            mfu: r.mfu(),
            mxu_head_dim,
            softmax: if matches!(r.job(), Job::Attention { .. }) { softmax } else { None },
        }
    }
}

/// The roofline figure.
#[derive(Debug, Clone)]
pub struct RooflineFigure {
    /// Title.
    pub title: String,
    /// Roofs per distinct chip.
    pub roofs: Vec<ChipRoofs>,
    /// Workloads.
    pub points: Vec<Point>,
    /// Footnotes.
    pub notes: Vec<String>,
    /// The jobs not drawn and why (`label: not drawn: ...`; also among the footnotes).
    pub left_out: Vec<String>,
}

impl RooflineFigure {
    /// A roofline of runs.
    ///
    /// # Errors
    /// [`PlotError`] when no run moved any HBM byte (no intensity to plot).
    pub fn from_runs(runs: &[JobRun], title: Option<&str>) -> Result<Self, PlotError> {
        let mut roofs: Vec<ChipRoofs> = Vec::new();
        for r in runs {
            let c = ChipRoofs::of(r.chip());
            if !roofs.iter().any(|x| x.chip == c.chip) {
                roofs.push(c);
            }
        }
        // A point needs executed matmul FLOPs and HBM bytes: both axes are logarithmic.
        let mut points: Vec<Point> = Vec::new();
        let mut left_out: Vec<String> = Vec::new();
        for r in runs {
            let res = r.result();
            if res.flops <= 0.0 || res.hbm_bytes == 0 {
                let why = if res.flops <= 0.0 { "it executes no matmul FLOPs (the roofline's FLOPs are the MXU's)" } else { "it moves no HBM bytes" };
                left_out.push(format!("{}: not drawn: {why}", r.label));
            } else {
                points.push(Point::of(r));
            }
        }
        if points.is_empty() {
            return Err(PlotError::Input(format!(
                "roofline: no job can be placed on the log axes ({}); plot breakdown or timeline shows such a kernel",
                left_out.join("; ")
            )));
        }
        let chips = roofs.iter().map(|r| r.chip.as_str()).collect::<Vec<_>>().join(", ");
        let mut notes = vec!["Roofs: HBM = the sustained DMA rate (hbm.dma_bandwidth_gb_per_s, at most the peak), shown as peak bandwidth x its share; MXU peak = 2 x MXUs x rows x columns x passes x clock.".to_string()];
        // The HBM roofs' terms here, so that the labels on the slopes stay short.
        let terms: Vec<String> =
            roofs.iter().map(|r| format!("{} {} GB/s x {} = {} GB/s", r.chip, sig3(r.bw_peak_gbs), sig3(r.efficiency), sig3(r.bw / 1e9))).collect();
        notes.push(format!("HBM roofs: {}.", terms.join("; ")));
        // The attention ceilings' notes only when an attention workload is drawn.
        if points.iter().any(|p| p.mxu_head_dim.is_some() || p.softmax.is_some()) {
            notes.push("MXU ceiling at head_dim: peak x (d + dv) / (d / e_qk + dv / e_pv), e_qk = d / (rows ceil(d/rows)), e_pv = dv / (cols ceil(dv/cols)).".to_string());
            notes.push(
                "Softmax ceiling (dashed, per workload): executed FLOPs / VPU busy time = 2(d+dv) FLOP per score / VPU cycles per score x clock (EUP likewise; lower drawn)."
                    .to_string(),
            );
        }
        notes.extend(runs.iter().map(describe));
        notes.extend(left_out.iter().cloned());
        Ok(RooflineFigure { title: title.map(str::to_string).unwrap_or_else(|| format!("Roofline on {chips}")), roofs, points, notes, left_out })
    }
}

impl Figure for RooflineFigure {
    /// Per chip its ridge (`ridge v6e: 668 FLOP/B`), per point its intensity, rate, MFU and
    /// softmax ceiling (`point dense: 2920 FLOP/B, 390 TFLOP/s executed, 43% MFU (useful FLOPs), softmax ceiling (EUP) 407 TFLOP/s`),
    /// then each job not drawn and why.
    fn facts(&self) -> Vec<String> {
        let mut f: Vec<String> = self.roofs.iter().map(|r| format!("ridge {}: {:.0} FLOP/B", r.chip, r.peak / r.bw)).collect();
        for p in &self.points {
            let ceiling = p.softmax.map_or(String::new(), |(u, v)| format!(", softmax ceiling ({u}) {:.0} TFLOP/s", v / 1e12));
            f.push(format!("point {}: {:.0} FLOP/B, {:.0} TFLOP/s executed, {:.0}% MFU (useful FLOPs){ceiling}", p.label, p.intensity, p.achieved / 1e12, 100.0 * p.mfu));
        }
        f.extend(self.left_out.iter().cloned());
        f
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), PlotError>
    where
        DB::ErrorType: 'static,
    {
        let s = Sizes::for_height(root.dim_in_pixel().1);
        let sub = "Achieved FLOP/s against arithmetic intensity (executed matmul FLOPs per HBM byte), with the chip's roofs and each workload's ceilings";
        let area = style::frame(root, &self.title, sub, &self.notes)?;
        let t = 1e12;
        // Ranges: around the points, ceilings and ridges, with room on the right for labels.
        let ridges: Vec<f64> = self.roofs.iter().map(|r| r.peak / r.bw).collect();
        let ai: Vec<f64> = self.points.iter().map(|p| p.intensity).filter(|v| *v > 0.0).collect();
        let xmin = ai.iter().chain(&ridges).copied().fold(f64::INFINITY, f64::min);
        let xmax = ai.iter().chain(&ridges).copied().fold(0.0f64, f64::max);
        let xlo = 10f64.powf((xmin / 5.0).log10().floor());
        let xhi = 10f64.powf((xmax * 8.0).log10().ceil());
        let peak_max = self.roofs.iter().map(|r| r.peak).fold(0.0f64, f64::max);
        let ys = self
            .points
            .iter()
            .flat_map(|p| [Some(p.achieved), p.softmax.map(|s| s.1), p.mxu_head_dim.map(|m| m.1)])
            .flatten()
            .chain(self.roofs.iter().map(|r| r.peak));
        let ymin = ys.filter(|v| *v > 0.0).fold(f64::INFINITY, f64::min);
        let ylo = ymin / 2.5 / t;
        let yhi = peak_max * 1.6 / t;
        let mut chart = ChartBuilder::on(&area)
            .margin_right((s.tick * 1.5) as u32)
            .x_label_area_size((s.label * 3.2) as u32)
            .y_label_area_size((s.label * 4.0) as u32)
            .build_cartesian_2d(
                (xlo..xhi).log_scale().with_key_points(style::log_ticks(xlo, xhi)),
                (ylo..yhi).log_scale().with_key_points(style::log_ticks(ylo, yhi)),
            )
            .map_err(draw_err)?;
        chart
            .configure_mesh()
            .x_desc("arithmetic intensity (FLOP per HBM byte)")
            .y_desc("executed compute (TFLOP/s)")
            .axis_desc_style(style::font(s.label))
            .label_style(style::font(s.tick))
            .x_label_formatter(&|v| style::tick_label(*v))
            .y_label_formatter(&|v| style::tick_label(*v))
            .bold_line_style(style::LIGHT_GREY)
            .light_line_style(WHITE)
            .draw()
            .map_err(draw_err)?;
        let plot = chart.plotting_area();
        // Every annotation goes through one layout, so that no label covers another or a point
        // (two chips' HBM roofs, a roof label and a workload's point, ...).
        let mut labels = style::Labels::new().within(style::Labels::area_box(plot));
        // (text, candidate positions, colour) of each HBM roof's label.
        type HbmLabel = (String, Vec<(i32, i32)>, RGBColor);
        let mut hbm_labels: Vec<HbmLabel> = Vec::new();
        // Right-aligned labels on horizontal lines, spread so they do not overlap.
        let mut right_labels: Vec<(String, f64, RGBColor)> = Vec::new();
        // The drawn lines, as thin boxes in root pixels: no point's label may lie on one.
        let mut lines: Vec<style::LabelBox> = Vec::new();
        let horizontal = |x0: f64, y: f64| {
            let (a, b) = (plot.map_coordinate(&(x0, y)), plot.map_coordinate(&(xhi, y)));
            [a.0, a.1 - 2, b.0, a.1 + 2]
        };
        for (i, r) in self.roofs.iter().enumerate() {
            let ridge = ridges[i];
            // Each chip's roofs and their labels in the chip's colour (black for one chip).
            let colour = style::chip_color(i);
            let roof = colour.stroke_width(3);
            let xs = xlo.max(ylo * t / r.bw);
            plot.draw(&PathElement::new(vec![(xs, xs * r.bw / t), (ridge, r.peak / t), (xhi, r.peak / t)], roof)).map_err(draw_err)?;
            lines.push(horizontal(ridge, r.peak / t));
            // The slope, as boxes around 40 short pieces.
            let at = |f: f64| {
                let x = xs * (ridge / xs).powf(f);
                plot.map_coordinate(&(x, x * r.bw / t))
            };
            for k in 0..40 {
                let (a, b) = (at(k as f64 / 40.0), at((k + 1) as f64 / 40.0));
                lines.push([a.0.min(b.0) - 2, a.1.min(b.1) - 2, a.0.max(b.0) + 2, a.1.max(b.1) + 2]);
            }
            let chip = if self.roofs.len() > 1 { format!("{} ", r.chip) } else { String::new() };
            right_labels.push((
                format!("{chip}MXU peak {} TFLOP/s (ridge at {} FLOP/B)", sig3(r.peak / t), sig3(ridge)),
                r.peak / t,
                colour,
            ));
            // HBM label below the slope, near its foot (clear of the workloads' labels); further
            // along the slope, or above it, when that place is taken.
            let along = [0.12, 0.25, 0.38, 0.5, 0.62, 0.75, 0.88];
            let below = along.iter().map(|f| {
                let lx = xs * (ridge / xs).powf(*f);
                let p = plot.map_coordinate(&(lx, lx * r.bw / t));
                (p.0 + 12, p.1 + 4)
            });
            let above = along.iter().map(|f| {
                let lx = xs * (ridge / xs).powf(*f);
                let p = plot.map_coordinate(&(lx, lx * r.bw / t));
                (p.0 - 12, p.1 - (s.tick * 1.6) as i32)
            });
            hbm_labels.push((format!("{chip}HBM roof {} GB/s", sig3(r.bw / 1e9)), below.chain(above).collect(), colour));
        }
        // MXU ceilings at head_dim (one per distinct (chip, d, value)).
        let mut seen: Vec<(String, u64)> = Vec::new();
        for p in &self.points {
            let Some((d, v)) = p.mxu_head_dim else {
                continue;
            };
            if seen.contains(&(p.chip.clone(), d)) || (v - self.roofs.iter().find(|r| r.chip == p.chip).map_or(0.0, |r| r.peak)).abs() < 1.0
            {
                continue;
            }
            seen.push((p.chip.clone(), d));
            let bw = self.roofs.iter().find(|r| r.chip == p.chip).map_or(1.0, |r| r.bw);
            let x0 = (v / bw).max(xlo);
            plot.draw(&DashedPathElement::new(vec![(x0, v / t), (xhi, v / t)], 10, 6, DARK_GREY.stroke_width(2))).map_err(draw_err)?;
            lines.push(horizontal(x0, v / t));
            let chip = if self.roofs.len() > 1 { format!("{} ", p.chip) } else { String::new() };
            right_labels.push((format!("{chip}MXU ceiling at head_dim {d}: {} TFLOP/s", sig3(v / t)), v / t, DARK_GREY));
        }
        // Workloads: softmax ceilings (dashed, own colour) and points.
        let mut left_labels: Vec<(String, (f64, f64), RGBColor)> = Vec::new();
        for (i, p) in self.points.iter().enumerate() {
            let c = style::series(i);
            if let Some((unit, v)) = p.softmax {
                let bw = self.roofs.iter().find(|r| r.chip == p.chip).map_or(1.0, |r| r.bw);
                let x0 = (v / bw).max(xlo);
                plot.draw(&DashedPathElement::new(vec![(x0, v / t), (xhi, v / t)], 6, 5, c.stroke_width(2))).map_err(draw_err)?;
                lines.push(horizontal(x0, v / t));
                right_labels.push((format!("{}: softmax ceiling ({unit}) {} TFLOP/s", p.label, sig3(v / t)), v / t, c));
            }
            if p.intensity > 0.0 {
                plot.draw(&Circle::new((p.intensity, p.achieved / t), 8, c.filled())).map_err(draw_err)?;
                plot.draw(&Circle::new((p.intensity, p.achieved / t), 8, BLACK.stroke_width(1))).map_err(draw_err)?;
                left_labels.push((
                    format!("{}: {} TFLOP/s executed, {:.0}% MFU", p.label, sig3(p.achieved / t), p.mfu * 100.0),
                    (p.intensity, p.achieved / t),
                    c,
                ));
            }
        }
        // The points are marks no label may cover.
        for (_, xy, _) in &left_labels {
            let p = plot.map_coordinate(xy);
            labels.reserve([p.0 - 10, p.1 - 10, p.0 + 10, p.1 + 10]);
        }
        // No label lies on a drawn line: each line's own label sits just above it, clear of it.
        for b in lines {
            labels.reserve(b);
        }
        let gap = (s.tick * 1.25) as i32;
        let x_right = plot.map_coordinate(&(xhi, 1.0)).0 - 6;
        let wanted: Vec<i32> =
            right_labels.iter().map(|(_, y, _)| plot.map_coordinate(&(xhi, *y)).1 - (s.tick * 0.6) as i32 - 8).collect();
        for ((txt, _, c), y) in right_labels.iter().zip(style::spread(&wanted, gap)) {
            let st = style::font_c(s.tick, *c).pos(Pos::new(HPos::Right, VPos::Center));
            labels.place(root, txt, &st, &[(x_right, y)])?;
        }
        let wanted: Vec<i32> = left_labels.iter().map(|(_, xy, _)| plot.map_coordinate(xy).1).collect();
        for ((txt, xy, c), y) in left_labels.iter().zip(style::spread(&wanted, gap)) {
            let px = plot.map_coordinate(xy);
            let left = style::font_c(s.tick, *c).pos(Pos::new(HPos::Right, VPos::Center));
            let at = labels.place(root, txt, &left, &[(px.0 - 14, y), (px.0 - 14, px.1)])?;
            if (at.1 - px.1).abs() > 3 {
                root.draw(&PathElement::new(vec![(at.0 + 2, at.1), (px.0 - 8, px.1)], c.stroke_width(1))).map_err(draw_err)?;
            }
        }
        for (txt, candidates, c) in &hbm_labels {
            let st = style::font_c(s.tick, *c).pos(Pos::new(HPos::Left, VPos::Top));
            labels.place(root, txt, &st, candidates)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_dim_fraction() {
        assert!((mxu_head_dim_fraction(128, 128, 256, 256) - 0.5).abs() < 1e-12);
        assert!((mxu_head_dim_fraction(256, 256, 256, 256) - 1.0).abs() < 1e-12);
        assert!((mxu_head_dim_fraction(128, 128, 128, 128) - 1.0).abs() < 1e-12);
        // 320 = 256 + 64 on 256 rows: 320 / 512.
        assert!((mxu_head_dim_fraction(320, 320, 256, 256) - 0.625).abs() < 1e-12);
    }
}
