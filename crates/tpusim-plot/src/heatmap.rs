//! A metric over two block sizes (default block_q x block_kv) from a sweep CSV: one cell per
//! (x, y) pair, coloured on a perceptually uniform scale (viridis), the value written in the
//! cell, the best cell outlined. When several rows fall in one cell (another column varies and
//! no `--where` filter pins it), the best of them is shown and the figure says so.

use crate::axis::{describe_column, Ticked};
use crate::style::{self, Sizes};
use crate::table::{BadRow, BadRows, Table};
use crate::{draw_err, sig3, Figure, PlotError};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Columns and options of a heatmap.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HeatmapSpec {
    /// Column across (default `block_kv`).
    pub x: String,
    /// Column down (default `block_q`).
    pub y: String,
    /// Metric (default `latency_ms`).
    pub z: String,
    /// `COL=VALUE` filters.
    pub filters: Vec<String>,
    /// Whether lower is better; `None` guesses from the name (`_ms`, latency, cycles, time,
    /// bytes, error: lower).
    pub lower_is_better: Option<bool>,
    /// Title override.
    pub title: Option<String>,
    /// Leave out rows whose metric is not a finite number, 0 or more, or whose x or y is not
    /// finite (`--skip-bad`; the footnote lists them), instead of refusing them.
    pub skip_bad: bool,
}

/// What a heatmap's metric may be: it colours times, counts, rates and fractions.
pub const METRIC_ALLOWED: &str = "a heatmap's metric must be a finite number, 0 or more (it colours times, counts, rates and fractions and marks the lowest or highest as best)";

/// Whether lower values of a metric are better, from its name.
pub fn lower_is_better(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    ["_ms", "latency", "cycles", "time", "bytes", "error", "_us", "_s"].iter().any(|k| n.contains(k))
}

/// The heatmap figure.
#[derive(Debug, Clone)]
pub struct HeatmapFigure {
    /// Title.
    pub title: String,
    /// Subtitle.
    pub subtitle: String,
    /// Distinct x values (sorted).
    pub xs: Vec<f64>,
    /// Distinct y values (sorted).
    pub ys: Vec<f64>,
    /// Cell values `[y][x]`.
    pub cells: Vec<Vec<Option<f64>>>,
    /// x, y, z descriptions.
    pub desc: (String, String, String),
    /// Best cell (y index, x index).
    pub best: Option<(usize, usize)>,
    /// Footnotes.
    pub notes: Vec<String>,
    /// Rows left out by `--skip-bad` (their cells show no value).
    pub skipped: Vec<BadRow>,
}

/// Viridis colour map at `t` in [0, 1].
pub fn viridis(t: f64) -> RGBColor {
    const C: [(u8, u8, u8); 9] = [
        (68, 1, 84),
        (71, 44, 122),
        (59, 81, 139),
        (44, 113, 142),
        (33, 144, 141),
        (39, 173, 129),
        (92, 200, 99),
        (170, 220, 50),
        (253, 231, 37),
    ];
    let t = t.clamp(0.0, 1.0) * (C.len() - 1) as f64;
    let i = (t.floor() as usize).min(C.len() - 2);
    let f = t - i as f64;
    let mix = |a: u8, b: u8| (a as f64 + (b as f64 - a as f64) * f).round() as u8;
    RGBColor(mix(C[i].0, C[i + 1].0), mix(C[i].1, C[i + 1].1), mix(C[i].2, C[i + 1].2))
}

impl HeatmapFigure {
    /// Pivots `table` by `spec`.
    ///
    /// # Errors
    /// [`PlotError`] naming the flag and column for unknown columns, the file and line for
    /// non-numeric values, and the file when no row has all three values.
    pub fn from_table(t: &Table, spec: &HeatmapSpec) -> Result<Self, PlotError> {
        let xc = t.col(&spec.x, "--x")?;
        let yc = t.col(&spec.y, "--y")?;
        let zc = t.col(&spec.z, "--z")?;
        // A sweep's rows that are design what-ifs (options their kernel family has no setting
        // for) name them in `design_whatif`: a cell such a row fills says so.
        let wc = t.col("design_whatif", "design_whatif").ok();
        let lower = spec.lower_is_better.unwrap_or_else(|| lower_is_better(&spec.z));
        let rows = t.filtered(&spec.filters)?;
        let mut pts = Vec::new();
        let mut missing = 0;
        let mut bad = BadRows { skip: spec.skip_bad, ..Default::default() };
        let position = "a heatmap's x and y must be finite numbers (a cell's place)";
        for (line, r) in &rows {
            let (x, y, z) = (t.num(*line, r, xc)?, t.num(*line, r, yc)?, t.num(*line, r, zc)?);
            let (Some(x), Some(y)) = (x, y) else {
                missing += 1;
                continue;
            };
            let at = || format!("{} = {}, {} = {}", spec.y, t.get(r, yc), spec.x, t.get(r, xc));
            if !bad.check(t, *line, r, xc, x, f64::is_finite, position, String::new)?
                || !bad.check(t, *line, r, yc, y, f64::is_finite, position, String::new)?
            {
                continue;
            }
            match z {
                Some(z) => {
                    // A value left out by --skip-bad leaves its cell without one.
                    let ok = bad.check(t, *line, r, zc, z, |v| v.is_finite() && v >= 0.0, METRIC_ALLOWED, at)?;
                    let what_if = wc.map(|c| t.get(r, c).trim().to_string()).unwrap_or_default();
                    pts.push((x, y, if ok { z } else { f64::NAN }, what_if));
                }
                None => {
                    missing += 1;
                    pts.push((x, y, f64::NAN, String::new()));
                }
            }
        }
        if pts.iter().all(|p| p.2.is_nan()) {
            return Err(PlotError::Input(format!("--input {}: no row has numeric {}, {} and {}", t.path, spec.x, spec.y, spec.z)));
        }
        let distinct = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v.dedup();
            v
        };
        let xs = distinct(pts.iter().map(|p| p.0).collect());
        let ys = distinct(pts.iter().map(|p| p.1).collect());
        let mut cells = vec![vec![None; xs.len()]; ys.len()];
        let mut counts = vec![vec![0usize; xs.len()]; ys.len()];
        // The design what-if of the row each cell shows (empty: none).
        let mut cell_what_if = vec![vec![String::new(); xs.len()]; ys.len()];
        for (x, y, z, what_if) in &pts {
            let (x, y, z) = (*x, *y, *z);
            let (i, j) = (ys.iter().position(|v| *v == y).unwrap_or(0), xs.iter().position(|v| *v == x).unwrap_or(0));
            if z.is_nan() {
                continue;
            }
            counts[i][j] += 1;
            let better = |old: f64| if lower { z < old } else { z > old };
            if cells[i][j].is_none_or(better) {
                cells[i][j] = Some(z);
                cell_what_if[i][j].clone_from(what_if);
            }
        }
        let mut best = None;
        let mut best_v = f64::NAN;
        for (i, row) in cells.iter().enumerate() {
            for (j, c) in row.iter().enumerate() {
                if let Some(v) = *c {
                    if best.is_none() || (lower && v < best_v) || (!lower && v > best_v) {
                        best = Some((i, j));
                        best_v = v;
                    }
                }
            }
        }
        let mut notes = vec![format!(
            "Source: {} ({} rows{}{}); {} is {} better; grey cells: no value{}.",
            t.path,
            rows.len(),
            if spec.filters.is_empty() { String::new() } else { format!(" where {}", spec.filters.join(", ")) },
            bad.of_them(),
            spec.z,
            if lower { "lower" } else { "higher" },
            if missing > 0 { format!(" ({missing} rows without one, e.g. tilings that do not fit VMEM)") } else { String::new() }
        )];
        notes.extend(bad.note());
        let what_ifs = cell_what_if.iter().flatten().filter(|w| !w.is_empty()).count();
        if what_ifs > 0 {
            notes.push(format!(
                "{what_ifs} cells show rows that are design what-ifs (their design_whatif column: options their kernel has no setting for); --where design_whatif= keeps the rows that run as written."
            ));
        }
        if counts.iter().flatten().any(|&c| c > 1) {
            notes.push(format!(
                "Some cells hold several rows (another column varies): each shows the {} value; pin the others with --where COL=VALUE.",
                if lower { "lowest" } else { "highest" }
            ));
        }
        // A width picked per point (no block_kv_compute in the sweep: tokamax's family takes the
        // largest that fits VMEM) moves with the blocks and can make neighbouring cells jump.
        if ![&spec.x, &spec.y, &spec.z].iter().any(|c| c.as_str() == "block_kv_compute") {
            if let Ok(cc) = t.col("block_kv_compute", "block_kv_compute") {
                let mut widths: Vec<f64> = Vec::new();
                for (line, r) in &rows {
                    if let Ok(Some(v)) = t.num(*line, r, cc) {
                        if !widths.contains(&v) {
                            widths.push(v);
                        }
                    }
                }
                if widths.len() > 1 {
                    widths.sort_by(f64::total_cmp);
                    let list: Vec<String> = widths.iter().map(|w| format!("{w}")).collect();
                    notes.push(format!(
                        "block_kv_compute differs between cells ({}): where the sweep gives none, each point takes its family's rule ({}), so neighbouring cells may jump; give block_kv_compute in the sweep to hold it.",
                        list.join(", "),
                        compute_rules(t, &rows)
                    ));
                }
            }
        }
        let zdesc = describe_column(&spec.z);
        let title =
            spec.title.clone().unwrap_or_else(|| format!("{} over {} x {}", zdesc.split(" (").next().unwrap_or(&zdesc), spec.y, spec.x));
        let subtitle = match best {
            Some((i, j)) => {
                let w = &cell_what_if[i][j];
                let what_if = if w.is_empty() { String::new() } else { format!(" * a design what-if: {w}") };
                format!("best: {} = {}, {} = {}: {} {}{what_if}", spec.y, ys[i], spec.x, xs[j], spec.z, sig3(best_v))
            }
            None => String::new(),
        };
        Ok(HeatmapFigure { title, subtitle, xs, ys, cells, desc: (spec.x.clone(), spec.y.clone(), zdesc), best, notes, skipped: bad.skipped })
    }
}

fn num_label(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e9 {
        format!("{v:.0}")
    } else {
        sig3(v)
    }
}

impl Figure for HeatmapFigure {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), PlotError>
    where
        DB::ErrorType: 'static,
    {
        let s = Sizes::for_height(root.dim_in_pixel().1);
        let area = style::frame(root, &self.title, &self.subtitle, &self.notes)?;
        let (aw, _) = area.dim_in_pixel();
        let bar_w = (s.tick * 8.5) as u32;
        let (chart_area, bar_area) = area.split_horizontally(aw - bar_w);
        let (nx, ny) = (self.xs.len(), self.ys.len());
        let vals: Vec<f64> = self.cells.iter().flatten().flatten().copied().collect();
        let (lo, hi) = vals.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| (a.min(v), b.max(v)));
        let span = if hi > lo { hi - lo } else { 1.0 };
        let xs = self.xs.clone();
        let ys = self.ys.clone();
        let mut chart = ChartBuilder::on(&chart_area)
            .margin_right((s.tick) as u32)
            .x_label_area_size((s.label * 3.2) as u32)
            .y_label_area_size((s.label * 4.4) as u32)
            .build_cartesian_2d(
                Ticked { lo: -0.5, hi: nx as f64 - 0.5, ticks: (0..nx).map(|i| i as f64).collect() },
                Ticked { lo: -0.5, hi: ny as f64 - 0.5, ticks: (0..ny).map(|i| i as f64).collect() },
            )
            .map_err(draw_err)?;
        chart
            .configure_mesh()
            .disable_mesh()
            .x_desc(self.desc.0.clone())
            .y_desc(self.desc.1.clone())
            .axis_desc_style(style::font(s.label))
            .label_style(style::font(s.tick))
            .x_label_formatter(&|v| xs.get(v.round() as usize).map(|x| num_label(*x)).unwrap_or_default())
            .y_label_formatter(&|v| ys.get(v.round() as usize).map(|y| num_label(*y)).unwrap_or_default())
            .draw()
            .map_err(draw_err)?;
        let plot = chart.plotting_area();
        for (i, row) in self.cells.iter().enumerate() {
            for (j, c) in row.iter().enumerate() {
                let (x, y) = (j as f64, i as f64);
                let rect = [(x - 0.5, y - 0.5), (x + 0.5, y + 0.5)];
                let (fill, fg, txt) = match c {
                    Some(v) => {
                        let col = viridis((v - lo) / span);
                        let lum = 0.299 * col.0 as f64 + 0.587 * col.1 as f64 + 0.114 * col.2 as f64;
                        (col, if lum > 140.0 { BLACK } else { WHITE }, sig3(*v))
                    }
                    None => (style::LIGHT_GREY, style::DARK_GREY, "n/a".to_string()),
                };
                plot.draw(&Rectangle::new(rect, fill.filled())).map_err(draw_err)?;
                plot.draw(&Rectangle::new(rect, WHITE.stroke_width(2))).map_err(draw_err)?;
                let p = plot.map_coordinate(&(x, y));
                let cell_w = plot.map_coordinate(&(x + 0.5, y)).0 - plot.map_coordinate(&(x - 0.5, y)).0;
                let fs = (s.tick * 1.05).min(cell_w as f64 / 4.0);
                if fs >= 9.0 {
                    style::centered(root, &txt, p, &style::font_c(fs, fg))?;
                }
            }
        }
        if let Some((i, j)) = self.best {
            let (x, y) = (j as f64, i as f64);
            plot.draw(&Rectangle::new([(x - 0.47, y - 0.47), (x + 0.47, y + 0.47)], RGBColor(220, 20, 60).stroke_width(4)))
                .map_err(draw_err)?;
        }
        // Colour bar.
        let (_, bh) = bar_area.dim_in_pixel();
        let top = (s.tick * 2.5) as i32;
        let bottom = bh as i32 - (s.label * 3.2) as i32;
        let x0 = (s.tick * 1.0) as i32;
        let w = (s.tick * 1.4) as i32;
        let steps = 100;
        for k in 0..steps {
            let y0 = bottom - (bottom - top) * k / steps;
            let y1 = bottom - (bottom - top) * (k + 1) / steps;
            bar_area.draw(&Rectangle::new([(x0, y1), (x0 + w, y0)], viridis(k as f64 / (steps - 1) as f64).filled())).map_err(draw_err)?;
        }
        bar_area.draw(&Rectangle::new([(x0, top), (x0 + w, bottom)], BLACK.stroke_width(1))).map_err(draw_err)?;
        let st = style::font(s.tick * 0.9).pos(Pos::new(HPos::Left, VPos::Center));
        for k in 0..=4 {
            let v = lo + span * k as f64 / 4.0;
            let y = bottom - (bottom - top) * k / 4;
            bar_area.draw(&PathElement::new(vec![(x0 + w, y), (x0 + w + 5, y)], BLACK.stroke_width(1))).map_err(draw_err)?;
            bar_area.draw(&Text::new(sig3(v), (x0 + w + 8, y), st.clone())).map_err(draw_err)?;
        }
        let st = style::font(s.tick * 0.9).pos(Pos::new(HPos::Left, VPos::Bottom));
        bar_area.draw(&Text::new(self.desc.2.clone(), (2, top - 8), st)).map_err(draw_err)?;
        Ok(())
    }
}

/// The `block_kv_compute` rule of each kernel family in `rows` (its `kernel` column; tokamax's
/// when the table has none: the default family), as a footnote states it.
fn compute_rules(t: &Table, rows: &[(usize, &[String])]) -> String {
    use tpusim_kernel::options::ComputeRule;
    let mut families: Vec<tpusim_kernel::Kernel> = Vec::new();
    match t.col("kernel", "kernel") {
        Ok(c) => {
            for (_, r) in rows {
                if let Ok(k) = r[c].parse::<tpusim_kernel::Kernel>() {
                    if !families.contains(&k) {
                        families.push(k);
                    }
                }
            }
        }
        Err(_) => families.push(tpusim_kernel::Kernel::default()),
    }
    let rules: Vec<String> = families
        .iter()
        .map(|k| match k.defaults().compute_rule {
            ComputeRule::BlockKv => format!("{k}: block_kv itself"),
            ComputeRule::LargestThatFits => format!("{k}: the largest width that fits VMEM"),
        })
        .collect();
    if rules.is_empty() {
        "the kernel family's".to_string()
    } else {
        rules.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pivots_and_picks_best() {
        let t = Table::parse("block_q,block_kv,latency_ms\n512,512,3\n512,1024,2\n1024,512,\n1024,1024,2.5\n", "s.csv", "--input").unwrap();
        let spec = HeatmapSpec { x: "block_kv".into(), y: "block_q".into(), z: "latency_ms".into(), ..Default::default() };
        let f = HeatmapFigure::from_table(&t, &spec).unwrap();
        assert_eq!(f.xs, vec![512.0, 1024.0]);
        assert_eq!(f.cells[1][0], None);
        assert_eq!(f.best, Some((0, 1)));
        assert!(!f.notes.iter().any(|n| n.contains("block_kv_compute")));
    }

    #[test]
    fn a_width_picked_per_point_is_named() {
        // A fresh user's finding: cliffs in a block-size heatmap came from the sub-tile width
        // tokamax's rule picks per point, which the figure did not mention.
        let t = Table::parse("block_q,block_kv,block_kv_compute,latency_ms\n512,512,512,3\n512,1024,256,9\n1024,512,512,2\n1024,1024,1024,2.5\n", "s.csv", "--input").unwrap();
        let spec = HeatmapSpec { x: "block_kv".into(), y: "block_q".into(), z: "latency_ms".into(), ..Default::default() };
        let f = HeatmapFigure::from_table(&t, &spec).unwrap();
        assert!(f.notes.iter().any(|n| n.starts_with("block_kv_compute differs between cells (256, 512, 1024)")), "{:?}", f.notes);
    }

    /// Issue 47, point 7: the footnote gives the rule of the families the sweep ran (JAX's and
    /// MaxDiffusion's kernels take block_kv itself), not tokamax's for every sweep.
    #[test]
    fn the_width_note_gives_the_rule_of_the_swept_families() {
        let text = "kernel,block_q,block_kv,block_kv_compute,latency_ms\nsparse-splash,512,512,512,3\nsparse-splash,512,1024,1024,9\nsparse-splash,1024,512,512,2\nsparse-splash,1024,1024,1024,2.5\n";
        let t = Table::parse(text, "s.csv", "--input").unwrap();
        let spec = HeatmapSpec { x: "block_kv".into(), y: "block_q".into(), z: "latency_ms".into(), ..Default::default() };
        let f = HeatmapFigure::from_table(&t, &spec).unwrap();
        let note = f.notes.iter().find(|n| n.starts_with("block_kv_compute differs")).unwrap();
        assert!(note.contains("(sparse-splash: block_kv itself)") && !note.contains("tokamax"), "{note}");
        let t = Table::parse(&text.replace("sparse-splash", "splash"), "s.csv", "--input").unwrap();
        let note = HeatmapFigure::from_table(&t, &spec).unwrap().notes.into_iter().find(|n| n.starts_with("block_kv_compute differs")).unwrap();
        assert!(note.contains("(splash: block_kv itself)"), "{note}");
    }

    /// A fresh user's finding: the best cell of a sweep was a design what-if (a mask computed
    /// that the kernel only loads) and the figure did not say so; the runnable row of those
    /// blocks was 38% slower. The best line names it and a note counts such cells.
    #[test]
    fn a_best_cell_that_is_a_design_what_if_says_so() {
        let text = "block_q,block_kv,design_whatif,latency_ms\n512,512,,3\n512,1024,mask_source computed,2\n512,1024,,2.8\n1024,512,,2.5\n";
        let t = Table::parse(text, "s.csv", "--input").unwrap();
        let spec = HeatmapSpec { x: "block_kv".into(), y: "block_q".into(), z: "latency_ms".into(), ..Default::default() };
        let f = HeatmapFigure::from_table(&t, &spec).unwrap();
        assert_eq!(f.best, Some((0, 1)));
        assert!(f.subtitle.ends_with("latency_ms 2.00 * a design what-if: mask_source computed"), "{}", f.subtitle);
        assert!(f.notes.iter().any(|n| n.starts_with("1 cells show rows that are design what-ifs")), "{:?}", f.notes);
        // Pinned to the rows that run as written, the best is an ordinary row.
        let pinned = HeatmapSpec { filters: vec!["design_whatif=".into()], ..spec };
        let f = HeatmapFigure::from_table(&t, &pinned).unwrap();
        assert!(!f.subtitle.contains("what-if") && f.subtitle.ends_with("latency_ms 2.50"), "{}", f.subtitle);
    }

    /// Issue 47, point 11: NaN, infinite and negative metrics were taken silently (a colour bar
    /// from inf to NaN, -1 outlined as best); each is refused naming the row, or left out with
    /// --skip-bad and listed.
    #[test]
    fn values_it_cannot_colour_are_refused_or_skipped_and_listed() {
        let spec = HeatmapSpec { x: "block_kv".into(), y: "block_q".into(), z: "latency_ms".into(), ..Default::default() };
        for (v, shown) in [("NaN", "NaN"), ("inf", "inf"), ("-inf", "-inf"), ("-1", "-1")] {
            let text = format!("block_q,block_kv,latency_ms\n512,512,3\n512,1024,{v}\n1024,512,2\n1024,1024,2.5\n");
            let t = Table::parse(&text, "s.csv", "--input").unwrap();
            let e = HeatmapFigure::from_table(&t, &spec).unwrap_err().to_string();
            assert!(
                e.contains(&format!("s.csv line 3 (block_q = 512, block_kv = 1024): latency_ms = {shown}: a heatmap's metric must be a finite number, 0 or more"))
                    && e.contains("--skip-bad"),
                "{e}"
            );
            let f = HeatmapFigure::from_table(&t, &HeatmapSpec { skip_bad: true, ..spec.clone() }).unwrap();
            assert_eq!(f.cells[0][1], None, "{v}: the cell shows no value");
            assert_eq!(f.best, Some((1, 0)), "{v}: the best is the lowest finite value");
            assert_eq!(f.skipped.len(), 1);
            let note = f.notes.iter().find(|n| n.starts_with("--skip-bad left out 1 row")).unwrap();
            assert!(note.contains(&format!("line 3 (latency_ms = {shown})")), "{note}");
            assert!(f.notes[0].contains("(4 rows, 1 of them skipped with --skip-bad)"), "{}", f.notes[0]);
        }
        // A position that is not finite is refused too.
        let t = Table::parse("block_q,block_kv,latency_ms\n512,nan,3\n1024,512,2\n", "s.csv", "--input").unwrap();
        let e = HeatmapFigure::from_table(&t, &spec).unwrap_err().to_string();
        assert!(e.contains("line 2: block_kv = nan: a heatmap's x and y must be finite numbers"), "{e}");
    }

    #[test]
    fn viridis_ends() {
        assert_eq!(viridis(0.0), RGBColor(68, 1, 84));
        assert_eq!(viridis(1.0), RGBColor(253, 231, 37));
    }
}
