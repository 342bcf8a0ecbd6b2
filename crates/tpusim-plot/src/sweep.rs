//! A metric against one swept variable, one line per value of another column, from a sweep CSV
//! (`tpusim sweep` output: a header row; columns chosen by name).

use crate::axis::{describe_column, Axis};
use crate::style::{self, Sizes};
use crate::table::{BadRow, BadRows, Table};
use crate::{draw_err, Figure, PlotError};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Which columns to plot and how.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SweepSpec {
    /// x column (the swept variable).
    pub x: String,
    /// y column (the metric).
    pub y: String,
    /// Series column (one line per distinct value), if any.
    pub series: Option<String>,
    /// `COL=VALUE` row filters.
    pub filters: Vec<String>,
    /// Log10 x axis.
    pub logx: bool,
    /// Log10 y axis.
    pub logy: bool,
    /// Title override.
    pub title: Option<String>,
    /// Leave out rows whose x or y is not finite, or not above 0 on a log axis (`--skip-bad`;
    /// the footnote lists them), instead of refusing them.
    pub skip_bad: bool,
}

/// The sweep figure.
#[derive(Debug, Clone)]
pub struct SweepFigure {
    /// Title.
    pub title: String,
    /// Subtitle.
    pub subtitle: String,
    /// x description.
    pub x_desc: String,
    /// y description.
    pub y_desc: String,
    /// Series name (legend title), if any.
    pub series_name: Option<String>,
    /// (series label, points sorted by x).
    pub series: Vec<(String, Vec<(f64, f64)>)>,
    /// Log axes.
    pub logx: bool,
    /// Log y.
    pub logy: bool,
    /// Footnotes.
    pub notes: Vec<String>,
    /// Rows left out by `--skip-bad`.
    pub skipped: Vec<BadRow>,
}

/// What an axis of a sweep figure takes (`log`: a log axis).
fn allowed(axis: &str, log: bool) -> String {
    if log {
        format!("a finite number above 0 on the log {axis} axis (--log{axis}); draw without --log{axis} for 0 and negative values")
    } else {
        format!("a finite number on the {axis} axis")
    }
}

impl SweepFigure {
    /// Reads the columns of `spec` from `table`.
    ///
    /// # Errors
    /// [`PlotError`] naming the flag and column for unknown columns, the file and line for
    /// non-numeric values, and the file when no row has both values (or a log axis gets no
    /// positive value).
    pub fn from_table(t: &Table, spec: &SweepSpec) -> Result<Self, PlotError> {
        let xc = t.col(&spec.x, "--x")?;
        let yc = t.col(&spec.y, "--y")?;
        let sc = spec.series.as_deref().map(|s| t.col(s, "--series")).transpose()?;
        let rows = t.filtered(&spec.filters)?;
        // The other varied inputs: job and chip columns that take several values among rows of
        // one series at one x. Each combination of their values is a line of its own (joining
        // them would draw a zig-zag through points of different configurations).
        let others = other_varied(t, &rows, xc, yc, sc);
        let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
        let mut skipped = 0usize;
        let mut bad = BadRows { skip: spec.skip_bad, ..Default::default() };
        for (line, r) in &rows {
            let (Some(x), Some(y)) = (t.num(*line, r, xc)?, t.num(*line, r, yc)?) else {
                skipped += 1;
                continue;
            };
            // A value the axis cannot place: NaN and infinities on any axis, 0 and below on a
            // log axis (it was drawn above the axes or dropped without a word).
            let series_at = || sc.map(|c| format!("{} = {}", t.header[c], t.get(r, c))).unwrap_or_default();
            let y_at = || [format!("{} = {}", spec.x, t.get(r, xc)), series_at()].into_iter().filter(|s| !s.is_empty()).collect::<Vec<_>>().join(", ");
            if !bad.check(t, *line, r, xc, x, |v| v.is_finite() && (!spec.logx || v > 0.0), &allowed("x", spec.logx), series_at)?
                || !bad.check(t, *line, r, yc, y, |v| v.is_finite() && (!spec.logy || v > 0.0), &allowed("y", spec.logy), y_at)?
            {
                continue;
            }
            let mut parts: Vec<String> = sc.map(|c| t.get(r, c).to_string()).into_iter().collect();
            parts.extend(others.iter().map(|&c| format!("{}={}", t.header[c], t.get(r, c))));
            let key = parts.join(", ");
            match series.iter_mut().find(|(k, _)| *k == key) {
                Some((_, v)) => v.push((x, y)),
                None => series.push((key, vec![(x, y)])),
            }
        }
        if series.is_empty() {
            return Err(PlotError::Input(format!(
                "--input {}: no row has numeric {} and {}{}",
                t.path,
                spec.x,
                spec.y,
                if spec.filters.is_empty() { String::new() } else { format!(" after --where {}", spec.filters.join(" --where ")) }
            )));
        }
        for (_, v) in series.iter_mut() {
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        // Numeric series sort numerically, others by first appearance.
        if others.is_empty() && series.iter().all(|(k, _)| k.parse::<f64>().is_ok()) {
            series.sort_by(|a, b| a.0.parse::<f64>().unwrap_or(0.0).total_cmp(&b.0.parse::<f64>().unwrap_or(0.0)));
        }
        let mut notes = vec![format!(
            "Source: {} ({} rows{}{}{})",
            t.path,
            rows.len(),
            if spec.filters.is_empty() { String::new() } else { format!(" where {}", spec.filters.join(", ")) },
            bad.of_them(),
            if skipped > 0 { format!("; {skipped} without a value skipped") } else { String::new() }
        )];
        notes.extend(bad.note());
        if !others.is_empty() {
            let names: Vec<&str> = others.iter().map(|&c| t.header[c].as_str()).collect();
            notes.push(format!(
                "One line per value of {} too (it varies at equal {}): --where COL=VALUE keeps one.",
                names.join(" and "),
                spec.x
            ));
        }
        let dup = series.iter().any(|(_, v)| v.windows(2).any(|w| w[0].0 == w[1].0));
        if dup {
            notes.push(
                "Several rows share an x within a line (a column that is not a job input varies): add --where COL=VALUE or --series COL to separate them."
                    .into(),
            );
        }
        if series.len() > MAX_LEGEND {
            notes.push(format!(
                "{} lines: the legend lists the first {}; --where COL=VALUE draws fewer.",
                series.len(),
                MAX_LEGEND - 1
            ));
        }
        let title = spec.title.clone().unwrap_or_else(|| {
            let base = format!("{} vs {}", describe_column(&spec.y).split(" (").next().unwrap_or(&spec.y), spec.x);
            match &spec.series {
                Some(s) => format!("{base}, by {s}"),
                None => base,
            }
        });
        Ok(SweepFigure {
            title,
            subtitle: String::new(),
            // Axes name the columns as the file does (`chip.hbm.bandwidth_gb_per_s`): the unit is in the name.
            x_desc: spec.x.clone(),
            y_desc: spec.y.clone(),
            series_name: spec.series.clone(),
            series,
            logx: spec.logx,
            logy: spec.logy,
            notes,
            skipped: bad.skipped,
        })
    }
}

/// Most legend entries a figure lists (the last says how many more lines there are).
pub const MAX_LEGEND: usize = 12;

/// Job and chip columns (job fields, `chip.SECTION.FIELD`, `set`, `label`), other than x, y and
/// the series, that take several values among the rows of one series at one x, in column order.
fn other_varied(t: &Table, rows: &[(usize, &[String])], xc: usize, yc: usize, sc: Option<usize>) -> Vec<usize> {
    let fields = tpusim_job::JobSpec::fields();
    let candidate = |c: usize| {
        let h = &t.header[c];
        c != xc && c != yc && Some(c) != sc && (h.starts_with("chip.") || h == "label" || fields.iter().any(|f| f == h))
    };
    (0..t.header.len())
        .filter(|&c| candidate(c))
        .filter(|&c| {
            let mut seen: std::collections::HashMap<(String, String), &str> = std::collections::HashMap::new();
            rows.iter().any(|(_, r)| {
                let key = (t.get(r, xc).to_string(), sc.map(|s| t.get(r, s).to_string()).unwrap_or_default());
                let v = t.get(r, c);
                match seen.get(&key) {
                    Some(prev) => *prev != v,
                    None => {
                        seen.insert(key, v);
                        false
                    }
                }
            })
        })
        .collect()
}

/// Draws the marker of series `i` at pixel `p`: seven distinct shapes, so that lines stay apart
/// in grey scale and for readers who confuse colours.
///
/// # Errors
/// [`PlotError`] if drawing fails.
pub fn marker<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, i: usize, p: (i32, i32), c: RGBColor) -> Result<(), PlotError>
where
    DB::ErrorType: 'static,
{
    let (x, y) = p;
    let filled = c.filled();
    let hollow = c.stroke_width(2);
    let r = match i % 7 {
        0 => area.draw(&Circle::new(p, 6, filled)),
        1 => area.draw(&TriangleMarker::new(p, 8, filled)),
        2 => area.draw(&Rectangle::new([(x - 5, y - 5), (x + 5, y + 5)], filled)),
        3 => area.draw(&Cross::new(p, 6, c.stroke_width(3))),
        4 => area.draw(&Circle::new(p, 6, hollow)),
        5 => area.draw(&Polygon::new(vec![(x, y - 7), (x + 7, y), (x, y + 7), (x - 7, y)], filled)),
        _ => area.draw(&Rectangle::new([(x - 5, y - 5), (x + 5, y + 5)], hollow)),
    };
    r.map_err(draw_err)
}

impl Figure for SweepFigure {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), PlotError>
    where
        DB::ErrorType: 'static,
    {
        let s = Sizes::for_height(root.dim_in_pixel().1);
        let area = style::frame(root, &self.title, &self.subtitle, &self.notes)?;
        let xs: Vec<f64> = self.series.iter().flat_map(|(_, v)| v.iter().map(|p| p.0)).collect();
        let ys: Vec<f64> = self.series.iter().flat_map(|(_, v)| v.iter().map(|p| p.1)).collect();
        let mut ax = Axis::fit(&xs, self.logx, false);
        // Few distinct x values (block sizes, lengths): tick exactly at them.
        let mut distinct = xs.clone();
        distinct.sort_by(f64::total_cmp);
        distinct.dedup();
        if distinct.len() <= 12 {
            ax.ticks = distinct.iter().map(|v| ax.map(*v)).collect();
        }
        let ay = Axis::fit(&ys, self.logy, false);
        // Legend on the right, sized to the longest label.
        let mut labels: Vec<String> = self.series.iter().map(|(k, _)| if k.is_empty() { self.y_desc.clone() } else { k.clone() }).collect();
        // At most MAX_LEGEND entries: the last counts the lines left out.
        if labels.len() > MAX_LEGEND {
            let more = labels.len() - (MAX_LEGEND - 1);
            labels.truncate(MAX_LEGEND - 1);
            labels.push(format!("... and {more} more lines"));
        }
        let lf = style::font(s.tick);
        let lw = labels
            .iter()
            .map(|l| style::text_width(&area, l, &lf))
            .max()
            .unwrap_or(0)
            .max(self.series_name.as_deref().map_or(0, |n| style::text_width(&area, n, &style::font(s.label))))
            + (s.tick * 4.0) as i32;
        let (aw, _) = area.dim_in_pixel();
        let (chart_area, legend_area) = area.split_horizontally(aw.saturating_sub(lw as u32).max(aw / 2));
        let mut chart = ChartBuilder::on(&chart_area)
            .margin_right((s.tick * 1.5) as u32)
            .x_label_area_size((s.label * 3.2) as u32)
            .y_label_area_size((s.label * 4.0) as u32)
            .build_cartesian_2d(ax.coord(), ay.coord())
            .map_err(draw_err)?;
        chart
            .configure_mesh()
            .x_desc(format!("{}{}", self.x_desc, if self.logx { ", log scale" } else { "" }))
            .y_desc(format!("{}{}", self.y_desc, if self.logy { ", log scale" } else { "" }))
            .axis_desc_style(style::font(s.label))
            .label_style(style::font(s.tick))
            .x_label_formatter(&|v| ax.label(*v))
            .y_label_formatter(&|v| ay.label(*v))
            .bold_line_style(style::LIGHT_GREY)
            .light_line_style(WHITE)
            .draw()
            .map_err(draw_err)?;
        for (i, (_, pts)) in self.series.iter().enumerate() {
            let c = style::series(i);
            let mapped: Vec<(f64, f64)> = pts.iter().map(|&(x, y)| (ax.map(x), ay.map(y))).collect();
            chart.draw_series(LineSeries::new(mapped.clone(), c.stroke_width(3))).map_err(draw_err)?;
            for p in &mapped {
                marker(root, i, chart.plotting_area().map_coordinate(p), c)?;
            }
        }
        // Legend.
        let x0 = (s.tick * 0.8) as i32;
        let mut y = (s.tick * 1.5) as i32;
        if let Some(n) = &self.series_name {
            legend_area
                .draw(&Text::new(n.clone(), (x0, y), style::font(s.label).pos(Pos::new(HPos::Left, VPos::Center))))
                .map_err(draw_err)?;
            y += (s.label * 1.5) as i32;
        }
        for (i, l) in labels.iter().enumerate() {
            if i + 1 == MAX_LEGEND && self.series.len() > MAX_LEGEND {
                legend_area
                    .draw(&Text::new(l.clone(), (x0, y), lf.clone().pos(Pos::new(HPos::Left, VPos::Center))))
                    .map_err(draw_err)?;
                break;
            }
            let c = style::series(i);
            legend_area.draw(&PathElement::new(vec![(x0, y), (x0 + (s.tick * 2.0) as i32, y)], c.stroke_width(3))).map_err(draw_err)?;
            marker(&legend_area, i, (x0 + s.tick as i32, y), c)?;
            legend_area
                .draw(&Text::new(l.clone(), (x0 + (s.tick * 2.6) as i32, y), lf.pos(Pos::new(HPos::Left, VPos::Center))))
                .map_err(draw_err)?;
            y += (s.tick * 1.6) as i32;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(logy: bool) -> SweepSpec {
        SweepSpec { x: "block_kv".into(), y: "latency_ms".into(), series: Some("block_q".into()), logy, ..Default::default() }
    }

    /// Issue 47, point 11: with --logy, NaN, inf and negative values were taken silently (a
    /// point above the axes, rows dropped as if empty); each is refused naming the row, or left
    /// out with --skip-bad and listed.
    #[test]
    fn values_an_axis_cannot_place_are_refused_or_skipped_and_listed() {
        for (v, logy_only) in [("NaN", false), ("inf", false), ("-1", true), ("0", true)] {
            let text = format!("block_q,block_kv,latency_ms\n256,512,3\n256,1024,{v}\n256,2048,2\n");
            let t = Table::parse(&text, "s.csv", "--input").unwrap();
            let e = SweepFigure::from_table(&t, &spec(true)).unwrap_err().to_string();
            assert!(
                e.contains(&format!("s.csv line 3 (block_kv = 1024, block_q = 256): latency_ms = {v}: a finite number above 0 on the log y axis (--logy)"))
                    && e.contains("--skip-bad"),
                "{e}"
            );
            let f = SweepFigure::from_table(&t, &SweepSpec { skip_bad: true, ..spec(true) }).unwrap();
            assert_eq!(f.series, vec![("256".to_string(), vec![(512.0, 3.0), (2048.0, 2.0)])], "{v}");
            assert_eq!(f.skipped.len(), 1);
            let note = f.notes.iter().find(|n| n.starts_with("--skip-bad left out 1 row")).unwrap();
            assert!(note.contains(&format!("line 3 (latency_ms = {v})")), "{note}");
            assert!(f.notes[0].contains("(3 rows, 1 of them skipped with --skip-bad)"), "{}", f.notes[0]);
            // A linear axis takes 0 and negative values, not NaN or infinities.
            match SweepFigure::from_table(&t, &spec(false)) {
                Ok(f) => assert!(logy_only && f.series[0].1.len() == 3, "{v}"),
                Err(e) => assert!(!logy_only && e.to_string().contains("a finite number on the y axis"), "{v}: {e}"),
            }
        }
        let t = Table::parse("block_q,block_kv,latency_ms\n256,-512,3\n256,1024,2\n", "s.csv", "--input").unwrap();
        let e = SweepFigure::from_table(&t, &SweepSpec { logx: true, ..spec(false) }).unwrap_err().to_string();
        assert!(e.contains("line 2 (block_q = 256): block_kv = -512: a finite number above 0 on the log x axis (--logx)"), "{e}");
    }
}
