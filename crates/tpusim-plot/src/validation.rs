//! Predicted against measured latency (log-log) from `tpusim validate --format csv` output
//! (columns `id`, `predicted_ms`, `measured_ms`, ...): the y = x line, shaded relative-error
//! bands and points coloured by group (a `--series` column, or the id's prefix before the first
//! `-`); beside it, every row's relative error as a bar, named by its id, over the same bands.
//!
//! Error of a row: (predicted - measured) / measured, computed from the two columns.

use crate::style::{self, Sizes, DARK_GREY};
use crate::table::Table;
use crate::{draw_err, Figure, PlotError};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Columns and options.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ValidationSpec {
    /// Measured column (x; default `measured_ms`).
    pub measured: String,
    /// Predicted column (y; default `predicted_ms`).
    pub predicted: String,
    /// Label column (default `id`).
    pub id: String,
    /// Group column; `None` groups by the id's prefix.
    pub series: Option<String>,
    /// Relative error bands, fractions (e.g. 0.1, 0.25), ascending.
    pub bands: Vec<f64>,
    /// `COL=VALUE` filters.
    pub filters: Vec<String>,
    /// Title override.
    pub title: Option<String>,
}

/// One validated row.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Row id.
    pub id: String,
    /// Group.
    pub group: String,
    /// Measured, ms.
    pub measured: f64,
    /// Predicted, ms.
    pub predicted: f64,
}

impl Row {
    /// (predicted - measured) / measured.
    pub fn error(&self) -> f64 {
        (self.predicted - self.measured) / self.measured
    }
}

/// The validation figure.
#[derive(Debug, Clone)]
pub struct ValidationFigure {
    /// Title.
    pub title: String,
    /// Summary line.
    pub subtitle: String,
    /// Rows.
    pub rows: Vec<Row>,
    /// Bands (fractions, ascending).
    pub bands: Vec<f64>,
    /// Groups in legend order.
    pub groups: Vec<String>,
    /// Footnotes.
    pub notes: Vec<String>,
}

/// Parses `--bands` text: comma-separated percentages (`10,25`).
///
/// # Errors
/// [`PlotError`] naming `--bands` for values that are not numbers in (0, 100).
pub fn parse_bands(s: &str) -> Result<Vec<f64>, PlotError> {
    let mut v = Vec::new();
    for p in s.split(',').filter(|p| !p.trim().is_empty()) {
        let x: f64 = p.trim().parse().map_err(|_| PlotError::Input(format!("--bands {s}: expected percentages like 10,25")))?;
        if !(x > 0.0 && x < 100.0) {
            return Err(PlotError::Input(format!("--bands {s}: {x} is not a percentage between 0 and 100")));
        }
        v.push(x / 100.0);
    }
    v.sort_by(f64::total_cmp);
    v.dedup();
    Ok(v)
}

impl ValidationFigure {
    /// Reads the rows of `t` by `spec`.
    ///
    /// # Errors
    /// [`PlotError`] naming the flag and column for unknown columns, the file and line for
    /// non-numeric or non-positive latencies, and the file when no row has both values.
    pub fn from_table(t: &Table, spec: &ValidationSpec) -> Result<Self, PlotError> {
        let mc = t.col(&spec.measured, "--x")?;
        let pc = t.col(&spec.predicted, "--y")?;
        let ic = t.col(&spec.id, "--label-column")?;
        let gc = spec.series.as_deref().map(|s| t.col(s, "--series")).transpose()?;
        let mut rows = Vec::new();
        let mut skipped = 0;
        for (line, r) in t.filtered(&spec.filters)? {
            let (Some(m), Some(p)) = (t.num(line, r, mc)?, t.num(line, r, pc)?) else {
                skipped += 1;
                continue;
            };
            if m <= 0.0 || p <= 0.0 {
                return Err(PlotError::Input(format!("{} line {line}: latencies must be positive (measured {m}, predicted {p})", t.path)));
            }
            let id = t.get(r, ic).to_string();
            let group = match gc {
                Some(c) => t.get(r, c).to_string(),
                None => id.split('-').next().unwrap_or("").to_string(),
            };
            rows.push(Row { id, group, measured: m, predicted: p });
        }
        if rows.is_empty() {
            return Err(PlotError::Input(format!("--input {}: no row has numeric {} and {}", t.path, spec.measured, spec.predicted)));
        }
        let mut groups: Vec<String> = Vec::new();
        for r in &rows {
            if !groups.contains(&r.group) {
                groups.push(r.group.clone());
            }
        }
        let mut abs: Vec<f64> = rows.iter().map(|r| r.error().abs()).collect();
        abs.sort_by(f64::total_cmp);
        let median = if abs.len() % 2 == 1 { abs[abs.len() / 2] } else { (abs[abs.len() / 2 - 1] + abs[abs.len() / 2]) / 2.0 };
        let within: Vec<String> = spec
            .bands
            .iter()
            .map(|b| format!("{} of {} within ±{:.0}%", abs.iter().filter(|e| **e <= *b + 1e-12).count(), abs.len(), b * 100.0))
            .collect();
        let subtitle = format!(
            "{} rows: median |error| {:.1}%, max {:.1}%{}{}",
            rows.len(),
            median * 100.0,
            abs.last().copied().unwrap_or(0.0) * 100.0,
            if within.is_empty() { String::new() } else { format!("; {}", within.join(", ")) },
            if skipped > 0 { format!(" ({skipped} row{} without both values skipped)", if skipped == 1 { "" } else { "s" }) } else { String::new() }
        );
        let notes = vec![format!(
            "Source: {}. Error = (predicted - measured) / measured; shaded bands: ±{} around y = x.",
            t.path,
            spec.bands.iter().map(|b| format!("{:.0}%", b * 100.0)).collect::<Vec<_>>().join(", ±")
        )]
        .into_iter()
        .filter(|n| !n.is_empty())
        .collect();
        Ok(ValidationFigure {
            title: spec.title.clone().unwrap_or_else(|| "Predicted vs measured latency".into()),
            subtitle,
            rows,
            bands: spec.bands.clone(),
            groups,
            notes,
        })
    }
}

impl Figure for ValidationFigure {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), PlotError>
    where
        DB::ErrorType: 'static,
    {
        let s = Sizes::for_height(root.dim_in_pixel().1);
        let area = style::frame(root, &self.title, &self.subtitle, &self.notes)?;
        let vals: Vec<f64> = self.rows.iter().flat_map(|r| [r.measured, r.predicted]).collect();
        let (mn, mx) = vals.iter().fold((f64::INFINITY, 0.0f64), |(a, b), &v| (a.min(v), b.max(v)));
        let (lo, hi) = (mn / 1.5, mx * 1.5);
        let (aw, ah) = area.dim_in_pixel();
        // Left: the scatter, square; right: each row's error.
        let (xlab, ylab) = ((s.label * 3.2) as u32, (s.label * 4.0) as u32);
        let side = (ah.saturating_sub(xlab + 10)).min(aw / 2);
        let (chart_area, right) = area.split_horizontally(side + ylab + (s.tick as u32));
        let mut chart = ChartBuilder::on(&chart_area)
            .margin_right(s.tick as u32)
            .margin_top(10)
            .x_label_area_size(xlab)
            .y_label_area_size(ylab)
            .build_cartesian_2d(
                (lo..hi).log_scale().with_key_points(style::log_ticks(lo, hi)),
                (lo..hi).log_scale().with_key_points(style::log_ticks(lo, hi)),
            )
            .map_err(draw_err)?;
        chart
            .configure_mesh()
            .x_desc("measured latency (ms)")
            .y_desc("predicted latency (ms)")
            .axis_desc_style(style::font(s.label))
            .label_style(style::font(s.tick))
            .x_label_formatter(&|v| style::tick_label(*v))
            .y_label_formatter(&|v| style::tick_label(*v))
            .bold_line_style(style::LIGHT_GREY)
            .light_line_style(WHITE)
            .draw()
            .map_err(draw_err)?;
        let plot = chart.plotting_area();
        let band_fill = |k: usize| style::BLUE.mix(0.10 + 0.10 * (self.bands.len() - 1 - k) as f64);
        // Bands, widest first, then y = x.
        for (k, b) in self.bands.iter().enumerate().rev() {
            let poly = vec![(lo, lo * (1.0 - b)), (hi, hi * (1.0 - b)), (hi, hi * (1.0 + b)), (lo, lo * (1.0 + b))];
            plot.draw(&Polygon::new(poly, band_fill(k).filled())).map_err(draw_err)?;
        }
        plot.draw(&PathElement::new(vec![(lo, lo), (hi, hi)], BLACK.stroke_width(2))).map_err(draw_err)?;
        let mut labels = style::Labels::new();
        for r in &self.rows {
            let gi = self.groups.iter().position(|g| *g == r.group).unwrap_or(0);
            let xy = (r.measured, r.predicted);
            marker(plot, xy, gi)?;
            let p = plot.map_coordinate(&xy);
            labels.reserve([p.0 - 8, p.1 - 8, p.0 + 8, p.1 + 8]);
        }
        // "y = x" beside the diagonal, below it, where no point sits (tried from the top right).
        let candidates: Vec<(i32, i32)> = [3.0, 6.0, 12.0, 30.0, 100.0]
            .iter()
            .map(|k| {
                let v = hi / k;
                let p = plot.map_coordinate(&(v, v));
                (p.0 + 14, p.1 + 8)
            })
            .collect();
        labels.place(root, "y = x", &style::font(s.tick).pos(Pos::new(HPos::Left, VPos::Top)), &candidates)?;
        // Legend inside the scatter, top left (above the diagonal, where no point can be far).
        let origin = plot.map_coordinate(&(lo, hi));
        let (x0, mut y) = (origin.0 + 14, origin.1 + (s.tick * 1.2) as i32);
        let st = style::font(s.tick).pos(Pos::new(HPos::Left, VPos::Center));
        for (i, g) in self.groups.iter().enumerate() {
            let n = self.rows.iter().filter(|r| r.group == *g).count();
            marker(root, (x0 + 7, y), i)?;
            root.draw(&Text::new(format!("{g} ({n} rows)"), (x0 + 22, y), st.clone())).map_err(draw_err)?;
            y += (s.tick * 1.5) as i32;
        }
        for (k, b) in self.bands.iter().enumerate() {
            root.draw(&Rectangle::new([(x0, y - 7), (x0 + 14, y + 7)], band_fill(k).filled())).map_err(draw_err)?;
            root.draw(&Text::new(format!("within ±{:.0}%", b * 100.0), (x0 + 22, y), st.clone())).map_err(draw_err)?;
            y += (s.tick * 1.5) as i32;
        }

        // Right panel: error per row, grouped, as horizontal bars.
        let mut rows: Vec<&Row> = self.rows.iter().collect();
        rows.sort_by_key(|r| self.groups.iter().position(|g| *g == r.group).unwrap_or(0));
        let n = rows.len();
        let emax =
            rows.iter().map(|r| r.error().abs()).fold(0.0f64, f64::max).max(self.bands.last().copied().unwrap_or(0.1)) * 1.15 * 100.0;
        let (rw, rh) = right.dim_in_pixel();
        let id_font = (s.tick * 0.85).min((rh as f64 - xlab as f64) / n as f64 * 0.75);
        let id_w = rows.iter().map(|r| style::text_width(&right, &r.id, &style::font(id_font))).max().unwrap_or(0) as u32 + 14;
        let id_w = id_w.min(rw / 2);
        let mut ec = ChartBuilder::on(&right)
            .margin_left((s.tick * 1.5) as u32)
            .margin_right((s.tick * 1.0) as u32)
            .margin_top(10)
            .x_label_area_size(xlab)
            .y_label_area_size(id_w)
            .build_cartesian_2d(-emax..emax, 0f64..n as f64)
            .map_err(draw_err)?;
        ec.configure_mesh()
            .disable_y_mesh()
            .y_labels(0)
            .x_labels(7)
            .x_desc("error (%)")
            .axis_desc_style(style::font(s.label))
            .label_style(style::font(s.tick))
            .x_label_formatter(&|v| {
                if v.abs() < 1e-9 {
                    "0".to_string()
                } else {
                    format!("{v:+.0}")
                }
            })
            .bold_line_style(style::LIGHT_GREY)
            .light_line_style(WHITE)
            .draw()
            .map_err(draw_err)?;
        let ep = ec.plotting_area();
        for (k, b) in self.bands.iter().enumerate().rev() {
            ep.draw(&Rectangle::new([(-b * 100.0, 0.0), (b * 100.0, n as f64)], band_fill(k).filled())).map_err(draw_err)?;
        }
        ep.draw(&PathElement::new(vec![(0.0, 0.0), (0.0, n as f64)], BLACK.stroke_width(1))).map_err(draw_err)?;
        for (i, r) in rows.iter().enumerate() {
            let y = (n - 1 - i) as f64;
            let gi = self.groups.iter().position(|g| *g == r.group).unwrap_or(0);
            let e = r.error() * 100.0;
            ep.draw(&Rectangle::new([(0.0, y + 0.2), (e, y + 0.8)], style::series(gi).filled())).map_err(draw_err)?;

            if id_font >= ROW_LABEL_MIN_PX {
                let p = ep.map_coordinate(&(-emax, y + 0.5));
                root.draw(&Text::new(r.id.clone(), (p.0 - 8, p.1), style::font(id_font).pos(Pos::new(HPos::Right, VPos::Center))))
                    .map_err(draw_err)?;
                let q = ep.map_coordinate(&(e, y + 0.5));
                let (hp, dx) = if e >= 0.0 { (HPos::Left, 4) } else { (HPos::Right, -4) };
                root.draw(&Text::new(
                    format!("{e:+.1}"),
                    (q.0 + dx, q.1),
                    style::font_c(id_font * 0.95, DARK_GREY).pos(Pos::new(hp, VPos::Center)),
                ))
                .map_err(draw_err)?;
            }
        }
        // Too many rows to name each: name each group's block of rows instead, between rules.
        if id_font < ROW_LABEL_MIN_PX {
            let mut start = 0;
            // The last label's centre and half height: a group too short for its label still
            // gets it, at a smaller font, below the one above.
            let mut last: Option<(i32, f64)> = None;
            while start < n {
                let g = &rows[start].group;
                let end = start + rows[start..].iter().take_while(|r| r.group == *g).count();
                // Rows start..end sit at y from n - end to n - start.
                let (top, bottom) = ((n - start) as f64, (n - end) as f64);
                let rule = ep.map_coordinate(&(-emax, top));
                if start > 0 {
                    root.draw(&PathElement::new(vec![(rule.0 - id_w as i32, rule.1), (rule.0, rule.1)], DARK_GREY.stroke_width(1)))
                        .map_err(draw_err)?;
                }
                let mid = ep.map_coordinate(&(-emax, (top + bottom) / 2.0));
                let tall = ep.map_coordinate(&(-emax, bottom)).1 - rule.1;
                // Each block is named with its group's marker (two groups may share a colour;
                // the marker's shape tells them apart).
                let font = (s.tick * 0.85).min((tall as f64 * 0.9).max(s.tick * 0.6)).max(ROW_LABEL_MIN_PX);
                // Nudged below the label above where the two would run into each other.
                let y = match last {
                    Some((y, h)) => mid.1.max(y + (h + font * 0.5).max(14.0).ceil() as i32),
                    None => mid.1,
                };
                let gi = self.groups.iter().position(|x| x == g).unwrap_or(0);
                let label = format!("{g} ({})", end - start);
                root.draw(&Text::new(label, (mid.0 - 24, y), style::font(font).pos(Pos::new(HPos::Right, VPos::Center)))).map_err(draw_err)?;
                marker(root, (mid.0 - 12, y), gi)?;
                last = Some((y, font * 0.5));
                start = end;
            }
        }
        Ok(())
    }
}

/// The smallest font, pixels, a row's id is drawn at in the error panel; below it the panel
/// names each group's block of rows instead.
const ROW_LABEL_MIN_PX: f64 = 8.0;

/// Group `i`'s marker at `at`: its series colour, and past the palette's eight colours a square,
/// then a triangle, so that groups sharing a colour stay apart (filled, outlined in black).
fn marker<DB: DrawingBackend, CT: CoordTranslate>(area: &DrawingArea<DB, CT>, at: CT::From, i: usize) -> Result<(), PlotError>
where
    CT::From: Clone,
{
    let fill = style::series(i).filled();
    let edge = BLACK.stroke_width(1);
    match (i / style::SERIES.len()) % 3 {
        0 => {
            area.draw(&(EmptyElement::at(at.clone()) + Circle::new((0, 0), 7, fill))).map_err(draw_err)?;
            area.draw(&(EmptyElement::at(at) + Circle::new((0, 0), 7, edge))).map_err(draw_err)
        }
        1 => {
            area.draw(&(EmptyElement::at(at.clone()) + Rectangle::new([(-6, -6), (6, 6)], fill))).map_err(draw_err)?;
            area.draw(&(EmptyElement::at(at) + Rectangle::new([(-6, -6), (6, 6)], edge))).map_err(draw_err)
        }
        _ => {
            let tri = vec![(0, -8), (7, 5), (-7, 5)];
            area.draw(&(EmptyElement::at(at.clone()) + Polygon::new(tri.clone(), fill))).map_err(draw_err)?;
            let mut outline = tri.clone();
            outline.push(tri[0]);
            area.draw(&(EmptyElement::at(at) + PathElement::new(outline, edge))).map_err(draw_err)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bands_and_groups() {
        assert_eq!(parse_bands("25,10").unwrap(), vec![0.1, 0.25]);
        assert!(parse_bands("x").unwrap_err().to_string().contains("--bands"));
        let t = Table::parse("id,predicted_ms,measured_ms\nVD-B0,80,78.7\nTK-a,3.0,3.754\n", "v.csv", "--input").unwrap();
        let spec = ValidationSpec {
            measured: "measured_ms".into(),
            predicted: "predicted_ms".into(),
            id: "id".into(),
            bands: vec![0.1],
            ..Default::default()
        };
        let f = ValidationFigure::from_table(&t, &spec).unwrap();
        assert_eq!(f.groups, vec!["VD", "TK"]);
        assert!(f.subtitle.contains("1 of 2 within ±10%"), "{}", f.subtitle);
    }
}
