//! The tile map of a mask at a tiling, for one head: every block_q x block_kv tile coloured
//! empty / partial / full (classification by [`tpusim_workload::tiles::for_each_tile_row`],
//! exact or tile-aligned), the padding beyond the sequence ends hatched, and the exact mask's
//! boundary dotted over it (sampled rows' kept intervals).
//!
//! The picture holds at most [`MAX_CELLS`] cells per side (or the caller's resolution): when
//! the grid has more tiles than that, each cell aggregates a block of tiles and is coloured by
//! their mix (the kinds' colours in proportion to their counts). Only the per-cell counts are
//! kept, so memory and drawing time follow the picture, not the number of tiles (a 4M-token mask
//! at 512-token tiles has 67 million). The counts in the legend are exact.

use crate::style::{self, Sizes, BLUE, DARK_GREY, LIGHT_GREY, ORANGE};
use crate::{draw_err, thousands, Figure, PlotError};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use tpusim_workload::tiles::{for_each_tile_row, TileGrid, TileKind};
use tpusim_workload::Mask;

/// A classified tiling ready to draw.
#[derive(Debug, Clone)]
pub struct TilesFigure {
    /// Title.
    pub title: String,
    /// Subtitle (counts and densities).
    pub subtitle: String,
    /// Footnotes.
    pub notes: Vec<String>,
    /// The tiling.
    pub grid: TileGrid,
    /// Tile kinds aggregated to the picture's cells.
    pub cells: Cells,
    /// Exact mask boundary points (kv, q) sampled along rows.
    pub boundary: Vec<(u64, u64)>,
    /// Tile counts.
    pub counts: Counts,
}

/// Most cells per side of a tile map (a cell aggregates tiles beyond that).
pub const MAX_CELLS: u64 = 1024;

/// Tile counts aggregated to a grid of cells: cell (r, c) holds q tiles
/// `r * q_per_cell .. (r + 1) * q_per_cell` and kv tiles likewise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cells {
    /// Cell rows.
    pub rows: u64,
    /// Cell columns.
    pub cols: u64,
    /// q tiles per cell row.
    pub q_per_cell: u64,
    /// kv tiles per cell column.
    pub kv_per_cell: u64,
    /// Per cell, row-major: (empty, partial, full) tile counts.
    pub counts: Vec<[u32; 3]>,
}

impl Cells {
    /// Cells for `grid` with at most `max_cells` per side.
    fn new(grid: &TileGrid, max_cells: u64) -> Self {
        let max = max_cells.max(1);
        let (qt, kt) = (grid.q_tiles().max(1), grid.kv_tiles().max(1));
        let (q_per_cell, kv_per_cell) = (qt.div_ceil(max), kt.div_ceil(max));
        let (rows, cols) = (qt.div_ceil(q_per_cell), kt.div_ceil(kv_per_cell));
        Cells { rows, cols, q_per_cell, kv_per_cell, counts: vec![[0; 3]; (rows * cols) as usize] }
    }

    /// Whether each cell is one tile.
    pub fn one_tile_each(&self) -> bool {
        self.q_per_cell == 1 && self.kv_per_cell == 1
    }

    /// The colour of cell (r, c): its kind's colour when all its tiles are of one kind, else the
    /// kinds' colours mixed in proportion to their counts.
    pub fn color(&self, r: u64, c: u64) -> RGBColor {
        let n = self.counts[(r * self.cols + c) as usize];
        let total: u32 = n.iter().sum();
        if total == 0 {
            return kind_color(TileKind::Empty);
        }
        let mut rgb = [0.0f64; 3];
        for (k, kind) in [TileKind::Empty, TileKind::Partial, TileKind::Full].into_iter().enumerate() {
            let RGBColor(a, b, c) = kind_color(kind);
            let w = n[k] as f64 / total as f64;
            rgb[0] += w * a as f64;
            rgb[1] += w * b as f64;
            rgb[2] += w * c as f64;
        }
        RGBColor(rgb[0].round() as u8, rgb[1].round() as u8, rgb[2].round() as u8)
    }
}

/// Counts of a tiling.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Tiles with no kept pair.
    pub empty: u64,
    /// Tiles needing the element-wise mask.
    pub partial: u64,
    /// Mask-free tiles.
    pub full: u64,
    /// Kept real pairs.
    pub kept: u64,
}

impl TilesFigure {
    /// Classifies `mask` (one head's) at `grid`; `align` rounds it to whole tiles first.
    /// `what` describes the mask for the title (e.g. `band:15000+sink:3600`). The map keeps at
    /// most [`MAX_CELLS`] cells per side ([`TilesFigure::with_resolution`] to choose).
    pub fn new(mask: &Mask, grid: TileGrid, align: bool, what: &str, head: u64) -> (Self, Counts) {
        Self::with_resolution(mask, grid, align, what, head, MAX_CELLS)
    }

    /// [`TilesFigure::new`] with at most `max_cells` cells per side (module docs).
    pub fn with_resolution(mask: &Mask, grid: TileGrid, align: bool, what: &str, head: u64, max_cells: u64) -> (Self, Counts) {
        let mut cells = Cells::new(&grid, max_cells);
        let mut c = Counts::default();
        for_each_tile_row(mask, &grid, align, |qi, row| {
            let base = (qi / cells.q_per_cell * cells.cols) as usize;
            for (kj, t) in row.iter().enumerate() {
                c.kept += t.kept;
                let k = match t.kind {
                    TileKind::Empty => {
                        c.empty += 1;
                        0
                    }
                    TileKind::Partial => {
                        c.partial += 1;
                        1
                    }
                    TileKind::Full => {
                        c.full += 1;
                        2
                    }
                };
                cells.counts[base + kj / cells.kv_per_cell as usize][k] += 1;
            }
        });
        let mut boundary = Vec::new();
        if !mask.is_full() {
            let samples = 700u64.min(grid.q_len);
            let mut iv = Vec::new();
            for i in 0..samples {
                let q = i * grid.q_len / samples;
                mask.row_intervals(q, grid.kv_len, &mut iv);
                for &(lo, hi) in &iv {
                    // The matrix's own edges are not mask boundaries.
                    if lo > 0 {
                        boundary.push((lo, q));
                    }
                    if hi < grid.kv_len {
                        boundary.push((hi, q));
                    }
                }
            }
        }
        let total = (grid.q_tiles() * grid.kv_tiles()) as f64;
        let pct = |v: u64| 100.0 * v as f64 / total;
        let pairs = grid.q_len as f64 * grid.kv_len as f64;
        let title = format!(
            "Tile map: {what} at {} x {} tiles ({}), head {head}",
            grid.block_q,
            grid.block_kv,
            if align { "tile-aligned mask" } else { "exact mask" }
        );
        let subtitle = format!(
            "{} x {} tokens in {} x {} = {} tiles; kept pairs {:.1}% of {:.3e}; {:.1}% of tiles visited",
            thousands(grid.q_len),
            thousands(grid.kv_len),
            grid.q_tiles(),
            grid.kv_tiles(),
            thousands(total as u64),
            100.0 * c.kept as f64 / pairs,
            pairs,
            pct(c.partial + c.full)
        );
        let padded = grid.padded_q_len() != grid.q_len || grid.padded_kv_len() != grid.kv_len;
        let mut notes = Vec::new();
        if padded {
            notes.push(format!(
                "Padding (hatched): q and kv are padded to {} and {} tokens (multiples of the blocks); padded rows/columns are masked, so tiles holding padding are never full.",
                thousands(grid.padded_q_len()),
                thousands(grid.padded_kv_len())
            ));
        }
        if !cells.one_tile_each() {
            notes.push(format!(
                "Each cell of the map aggregates up to {} x {} tiles (the picture's resolution); a cell's colour mixes the kinds' colours in proportion to its tiles.",
                cells.q_per_cell, cells.kv_per_cell
            ));
        }
        if align {
            notes.push("Tile-aligned: a tile is kept whole when at least half of its real pairs are kept, else dropped; the black line is the exact mask's boundary.".into());
        } else if !mask.is_full() {
            notes.push("Partial tiles run the element-wise mask; full tiles can skip it; empty tiles are skipped. Black line: the exact mask's boundary.".into());
        }
        (TilesFigure { title, subtitle, notes, grid, cells, boundary, counts: c }, c)
    }
}

fn kind_color(k: TileKind) -> RGBColor {
    match k {
        TileKind::Empty => LIGHT_GREY,
        TileKind::Partial => ORANGE,
        TileKind::Full => BLUE,
    }
}

impl Figure for TilesFigure {
    /// The counts and the padding: `tiles: 1234 empty, 146 partial, 300 full (partial 28% of
    /// visited)`, `padded: q 76544, kv 76800`.
    fn facts(&self) -> Vec<String> {
        let c = &self.counts;
        let visited = c.partial + c.full;
        let share = if visited > 0 { 100.0 * c.partial as f64 / visited as f64 } else { 0.0 };
        vec![
            format!("tiles: {} empty, {} partial, {} full (partial {share:.0}% of visited)", c.empty, c.partial, c.full),
            format!("padded: q {}, kv {}", self.grid.q_tiles() * self.grid.block_q, self.grid.kv_tiles() * self.grid.block_kv),
        ]
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), PlotError>
    where
        DB::ErrorType: 'static,
    {
        let s = Sizes::for_height(root.dim_in_pixel().1);
        let area = style::frame(root, &self.title, &self.subtitle, &self.notes)?;
        let (aw, ah) = area.dim_in_pixel();
        let g = &self.grid;
        let (pq, pk) = (g.padded_q_len() as f64, g.padded_kv_len() as f64);
        // One token as wide as it is tall: the plot keeps the matrix's aspect ratio; the legend
        // takes the room on the right.
        let (xlab, ylab, mr) = ((s.label * 3.2) as u32, (s.label * 4.6) as u32, (s.tick * 1.5) as u32);
        let legend_w = (s.tick * 19.0) as u32;
        let max_w = aw.saturating_sub(legend_w + ylab + mr).max(100) as f64;
        let max_h = ah.saturating_sub(xlab + 8).max(100) as f64;
        let (pw, ph) = if max_h * pk / pq <= max_w { (max_h * pk / pq, max_h) } else { (max_w, max_w * pq / pk) };
        let chart_w = pw as u32 + ylab + mr;
        let (chart_col, legend_area) = area.split_horizontally(chart_w);
        let (chart_area, _) = chart_col.split_vertically(ph as u32 + xlab + 8);
        let mut chart = ChartBuilder::on(&chart_area)
            .margin_top(8)
            .margin_right(mr)
            .x_label_area_size(xlab)
            .y_label_area_size(ylab)
            .build_cartesian_2d(0f64..pk, pq..0f64)
            .map_err(draw_err)?;
        chart
            .configure_mesh()
            .disable_mesh()
            .x_desc("kv position (tokens)")
            .y_desc("q position (tokens)")
            .axis_desc_style(style::font(s.label))
            .label_style(style::font(s.tick))
            .x_label_formatter(&|v| style::tick_label(*v))
            .y_label_formatter(&|v| style::tick_label(*v))
            .x_labels(10)
            .y_labels(10)
            .draw()
            .map_err(draw_err)?;
        let plot = chart.plotting_area();
        let cells = &self.cells;
        let (bq, bk) = ((g.block_q * cells.q_per_cell) as f64, (g.block_kv * cells.kv_per_cell) as f64);
        let tile_px = {
            let (a, b) = (plot.map_coordinate(&(0.0, 0.0)), plot.map_coordinate(&(bk, bq)));
            (b.0 - a.0).abs().min((b.1 - a.1).abs())
        };
        // Runs of equal colour along a row are one rectangle.
        let (pq_end, pk_end) = (pq, pk);
        for r in 0..cells.rows {
            let (y0, y1) = (r as f64 * bq, ((r + 1) as f64 * bq).min(pq_end));
            let mut c = 0;
            while c < cells.cols {
                let col = cells.color(r, c);
                let mut e = c + 1;
                while e < cells.cols && !cells.one_tile_each() && cells.color(r, e) == col {
                    e += 1;
                }
                let (x0, x1) = (c as f64 * bk, (e as f64 * bk).min(pk_end));
                plot.draw(&Rectangle::new([(x0, y0), (x1, y1)], col.filled())).map_err(draw_err)?;
                if cells.one_tile_each() && tile_px >= 6 {
                    plot.draw(&Rectangle::new([(x0, y0), (x1, y1)], WHITE.stroke_width(1))).map_err(draw_err)?;
                }
                c = e;
            }
        }
        // Padding: hatch the region beyond the sequence ends.
        let pad_color = BLACK.mix(0.55);
        let (q_len, kv_len) = (g.q_len as f64, g.kv_len as f64);
        let mut pad_rects = Vec::new();
        if kv_len < pk {
            pad_rects.push(((kv_len, 0.0), (pk, pq)));
        }
        if q_len < pq {
            pad_rects.push(((0.0, q_len), (pk, pq)));
        }
        for &((x0, y0), (x1, y1)) in &pad_rects {
            plot.draw(&Rectangle::new([(x0, y0), (x1, y1)], BLACK.mix(0.25).filled())).map_err(draw_err)?;
            // Diagonal hatch lines in pixel space.
            let (p0, p1) = (plot.map_coordinate(&(x0, y0)), plot.map_coordinate(&(x1, y1)));
            let (px0, px1) = (p0.0.min(p1.0), p0.0.max(p1.0));
            let (py0, py1) = (p0.1.min(p1.1), p0.1.max(p1.1));
            let step = 7;
            let mut c = px0 - (py1 - py0);
            while c < px1 {
                // Line x - y = c - py0 clipped to the rectangle.
                let mut pts = Vec::new();
                for y in [py0, py1] {
                    let x = c + (y - py0);
                    if x >= px0 && x <= px1 {
                        pts.push((x, y));
                    }
                }
                for x in [px0, px1] {
                    let y = py0 + (x - c);
                    if y >= py0 && y <= py1 {
                        pts.push((x, y));
                    }
                }
                if pts.len() >= 2 {
                    root.draw(&PathElement::new(vec![pts[0], pts[1]], pad_color.stroke_width(1))).map_err(draw_err)?;
                }
                c += step;
            }
        }
        // Sequence ends.
        let dash = DARK_GREY.stroke_width(2);
        if kv_len < pk {
            plot.draw(&PathElement::new(vec![(kv_len, 0.0), (kv_len, pq)], dash)).map_err(draw_err)?;
        }
        if q_len < pq {
            plot.draw(&PathElement::new(vec![(0.0, q_len), (pk, q_len)], dash)).map_err(draw_err)?;
        }
        // Exact mask boundary.
        // One pixel per sampled point, not a dot: a fine mask (video windows) stays visible
        // under its outline (`tpusim plot tiles --no-outline` draws none).
        for &(x, y) in &self.boundary {
            plot.draw(&Pixel::new((x as f64, y as f64), BLACK.mix(0.8))).map_err(draw_err)?;
        }
        // Legend: kinds with counts, padding, boundary.
        let c = &self.counts;
        let total = (c.empty + c.partial + c.full).max(1) as f64;
        let items = [
            (format!("empty: {} ({:.0}%)", c.empty, 100.0 * c.empty as f64 / total), "skipped", LIGHT_GREY),
            (format!("partial: {} ({:.0}%)", c.partial, 100.0 * c.partial as f64 / total), "element-wise mask", ORANGE),
            (format!("full: {} ({:.0}%)", c.full, 100.0 * c.full as f64 / total), "mask-free", BLUE),
        ];
        let x0 = (s.tick * 1.2) as i32;
        let sq = (s.tick * 1.1) as i32;
        let mut y = (s.tick * 1.5) as i32;
        let left = style::font(s.label).pos(Pos::new(HPos::Left, VPos::Center));
        let note = style::font_c(s.tick * 0.9, DARK_GREY).pos(Pos::new(HPos::Left, VPos::Center));
        legend_area.draw(&Text::new("tiles", (x0, y), left.clone())).map_err(draw_err)?;
        y += (s.label * 1.6) as i32;
        for (label, what, col) in &items {
            legend_area.draw(&Rectangle::new([(x0, y - sq / 2), (x0 + sq, y + sq / 2)], col.filled())).map_err(draw_err)?;
            legend_area
                .draw(&Text::new(label.clone(), (x0 + sq + 10, y), style::font(s.tick).pos(Pos::new(HPos::Left, VPos::Center))))
                .map_err(draw_err)?;
            legend_area.draw(&Text::new(what.to_string(), (x0 + sq + 10, y + (s.tick * 1.1) as i32), note.clone())).map_err(draw_err)?;
            y += (s.tick * 2.9) as i32;
        }
        // Padding swatch: grey with hatch.
        let padded = g.padded_q_len() != g.q_len || g.padded_kv_len() != g.kv_len;
        if padded {
            legend_area.draw(&Rectangle::new([(x0, y - sq / 2), (x0 + sq, y + sq / 2)], BLACK.mix(0.25).filled())).map_err(draw_err)?;
            for k in (0..2 * sq).step_by(6) {
                let (ax, ay) = (x0 + (k - sq).max(0), y - sq / 2 + (k.min(sq)));
                let (bx, by) = (x0 + k.min(sq), y - sq / 2 + (k - sq).max(0));
                legend_area.draw(&PathElement::new(vec![(ax, ay), (bx, by)], pad_color.stroke_width(1))).map_err(draw_err)?;
            }
            legend_area
                .draw(&Text::new("padding", (x0 + sq + 10, y), style::font(s.tick).pos(Pos::new(HPos::Left, VPos::Center))))
                .map_err(draw_err)?;
            legend_area
                .draw(&Text::new(
                    format!("q to {}, kv to {}", thousands(g.padded_q_len()), thousands(g.padded_kv_len())),
                    (x0 + sq + 10, y + (s.tick * 1.1) as i32),
                    note.clone(),
                ))
                .map_err(draw_err)?;
            y += (s.tick * 2.9) as i32;
        }
        if !self.boundary.is_empty() {
            legend_area.draw(&PathElement::new(vec![(x0, y), (x0 + sq, y)], BLACK.stroke_width(2))).map_err(draw_err)?;
            legend_area
                .draw(&Text::new("exact mask boundary", (x0 + sq + 10, y), style::font(s.tick).pos(Pos::new(HPos::Left, VPos::Center))))
                .map_err(draw_err)?;
            legend_area.draw(&Text::new("(sampled rows)", (x0 + sq + 10, y + (s.tick * 1.1) as i32), note)).map_err(draw_err)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_match_tile_stats() {
        let m = Mask::parse("band:15000+sink:3600").unwrap();
        let g = TileGrid { q_len: 75600, kv_len: 75600, block_q: 3328, block_kv: 1536 };
        let (f, c) = TilesFigure::new(&m, g, false, "band", 0);
        let st = tpusim_workload::tiles::TileStats::collect(&m, &g, false);
        assert_eq!((c.empty, c.partial, c.full, c.kept), (st.empty, st.partial, st.full, st.kept_pairs));
        assert_eq!((f.cells.rows, f.cells.cols), (23, 50));
        assert!(f.cells.one_tile_each());
    }

    #[test]
    fn a_grid_finer_than_the_picture_is_aggregated_with_exact_counts() {
        let m = Mask::parse("causal").unwrap();
        let g = TileGrid { q_len: 1 << 16, kv_len: 1 << 16, block_q: 128, block_kv: 128 };
        let (f, c) = TilesFigure::with_resolution(&m, g, false, "causal", 0, 100);
        // 512 x 512 tiles into cells of 6 x 6 tiles: 86 x 86 cells.
        assert_eq!((f.cells.q_per_cell, f.cells.rows, f.cells.cols), (6, 86, 86));
        let sum = f.cells.counts.iter().fold([0u64; 3], |a, n| [a[0] + n[0] as u64, a[1] + n[1] as u64, a[2] + n[2] as u64]);
        assert_eq!(sum, [c.empty, c.partial, c.full]);
        assert_eq!((c.partial, c.full, c.empty), (512, 512 * 511 / 2, 512 * 511 / 2));
        // A cell on the diagonal mixes kinds; cells away from it are pure.
        assert_eq!(f.cells.color(0, 85), kind_color(TileKind::Empty));
        assert_eq!(f.cells.color(85, 0), kind_color(TileKind::Full));
        let d = f.cells.color(10, 10);
        assert!(d != kind_color(TileKind::Full) && d != kind_color(TileKind::Partial), "{d:?}");
        assert!(f.notes.iter().any(|n| n.contains("aggregates up to 6 x 6 tiles")));
    }
}
