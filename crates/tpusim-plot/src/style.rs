//! Shared look: colours (Okabe-Ito, distinguishable with the common colour-vision deficiencies),
//! font sizes scaled to the figure, and the frame every figure uses (title, subtitle, footnotes).

use crate::{draw_err, PlotError};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Okabe-Ito blue.
pub const BLUE: RGBColor = RGBColor(0, 114, 178);
/// Lighter blue (Okabe-Ito blue mixed with white).
pub const LIGHT_BLUE: RGBColor = RGBColor(86, 160, 211);
/// Okabe-Ito orange.
pub const ORANGE: RGBColor = RGBColor(230, 159, 0);
/// Dark orange.
pub const DARK_ORANGE: RGBColor = RGBColor(166, 86, 0);
/// Okabe-Ito vermillion.
pub const VERMILLION: RGBColor = RGBColor(213, 94, 0);
/// Okabe-Ito reddish purple.
pub const PURPLE: RGBColor = RGBColor(204, 121, 167);
/// Okabe-Ito bluish green.
pub const GREEN: RGBColor = RGBColor(0, 158, 115);
/// Light bluish green.
pub const LIGHT_GREEN: RGBColor = RGBColor(120, 200, 170);
/// Okabe-Ito sky blue.
pub const SKY: RGBColor = RGBColor(86, 180, 233);
/// Okabe-Ito yellow (use for fills with a dark outline only).
pub const YELLOW: RGBColor = RGBColor(240, 228, 66);
/// Mid grey for secondary marks.
pub const GREY: RGBColor = RGBColor(127, 127, 127);
/// Light grey for backgrounds and empty cells.
pub const LIGHT_GREY: RGBColor = RGBColor(232, 232, 232);
/// Dark grey for secondary text.
pub const DARK_GREY: RGBColor = RGBColor(80, 80, 80);

/// Colours for series in order (black first, then the Okabe-Ito hues).
pub const SERIES: [RGBColor; 8] = [BLUE, VERMILLION, GREEN, ORANGE, PURPLE, SKY, RGBColor(0, 0, 0), RGBColor(140, 100, 40)];

/// Dark colours that tell chips' roofs apart on one figure (black first), distinct from the
/// [`SERIES`] hues the workloads take.
pub const CHIPS: [RGBColor; 4] = [RGBColor(0, 0, 0), RGBColor(30, 50, 130), RGBColor(120, 35, 35), RGBColor(85, 85, 20)];

/// Colour of chip `i` (cycling).
pub fn chip_color(i: usize) -> RGBColor {
    CHIPS[i % CHIPS.len()]
}

/// Colour of series `i` (cycling).
pub fn series(i: usize) -> RGBColor {
    SERIES[i % SERIES.len()]
}

/// Colour of a unit (the timeline draws DMA out in [`LIGHT_GREEN`], beside DMA in's HBM green).
pub fn unit_color(u: tpusim_model::Unit) -> RGBColor {
    use tpusim_model::Unit;
    match u {
        Unit::Mxu => BLUE,
        Unit::Vpu => ORANGE,
        Unit::Eup => VERMILLION,
        Unit::Xlu => PURPLE,
        Unit::Hbm => GREEN,
        Unit::StepControl => GREY,
    }
}

/// Font sizes for a figure of a given height (pixels), so that text stays readable when the
/// figure is drawn large or small.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    /// Title.
    pub title: f64,
    /// Subtitle and axis descriptions.
    pub label: f64,
    /// Tick labels, legends and annotations.
    pub tick: f64,
    /// Footnotes.
    pub note: f64,
}

impl Sizes {
    /// Sizes for a drawing area `h` pixels high (reference: 750 px).
    pub fn for_height(h: u32) -> Self {
        let k = (h as f64 / 750.0).clamp(0.6, 2.5);
        Sizes { title: 26.0 * k, label: 19.0 * k, tick: 16.0 * k, note: 14.5 * k }
    }
}

/// A text style in the bundled font.
pub fn font(size: f64) -> TextStyle<'static> {
    ("sans-serif", size).into_font().color(&BLACK)
}

/// A text style in the bundled font with a colour.
pub fn font_c(size: f64, c: RGBColor) -> TextStyle<'static> {
    ("sans-serif", size).into_font().color(&c)
}

/// Draws the title, subtitle and footnotes on `root` and returns the area left for the chart.
///
/// # Errors
/// [`PlotError`] if drawing fails.
pub fn frame<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    subtitle: &str,
    notes: &[String],
) -> Result<DrawingArea<DB, Shift>, PlotError>
where
    DB::ErrorType: 'static,
{
    let (w, h) = root.dim_in_pixel();
    let s = Sizes::for_height(h);
    let pad = (s.title * 0.6) as i32;
    let max_w = w as i32 - 2 * pad;
    // The title shrinks (down to 70%) to fit on one line, then wraps.
    let mut ts = s.title;
    while ts > s.title * 0.7 && text_width(root, title, &font(ts)) > max_w {
        ts -= 1.0;
    }
    let mut top = pad;
    for line in wrap(root, title, &font(ts), max_w) {
        root.draw(&Text::new(line, (pad, top), font(ts))).map_err(draw_err)?;
        top += (ts * 1.25) as i32;
    }
    top += (s.title * 0.05) as i32;
    let sub_style = font_c(s.label * 0.9, DARK_GREY);
    for para in subtitle.lines() {
        for line in wrap(root, para, &sub_style, max_w) {
            root.draw(&Text::new(line, (pad, top), sub_style.clone())).map_err(draw_err)?;
            top += (s.label * 1.2) as i32;
        }
    }
    top += (s.label * 0.3) as i32;
    let note_style = font_c(s.note, DARK_GREY);
    let lines: Vec<String> = notes.iter().flat_map(|n| wrap(root, n, &note_style, max_w)).collect();
    let note_h = (s.note * 1.3) as i32;
    let bottom = h as i32 - pad / 2 - note_h * lines.len() as i32;
    for (i, n) in lines.into_iter().enumerate() {
        let y = bottom + note_h * i as i32 + (s.note * 0.2) as i32;
        root.draw(&Text::new(n, (pad, y), note_style.clone())).map_err(draw_err)?;
    }
    Ok(root.clone().margin(top as u32, (h as i32 - bottom) as u32, (pad / 2) as u32, (pad / 2) as u32))
}

/// Splits `text` into lines no wider than `max_w` pixels in `style` (at word boundaries; a
/// single over-long word stays on its own line).
pub fn wrap<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, text: &str, style: &TextStyle, max_w: i32) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for word in text.split(' ') {
        let cand = if cur.is_empty() { word.to_string() } else { format!("{cur} {word}") };
        if !cur.is_empty() && text_width(area, &cand, style) > max_w {
            out.push(std::mem::take(&mut cur));
            cur = format!("  {word}");
        } else {
            cur = cand;
        }
    }
    if !cur.is_empty() || out.is_empty() {
        out.push(cur);
    }
    out
}

/// Draws `text` centred at `pos` (pixels of `area`).
///
/// # Errors
/// [`PlotError`] if drawing fails.
pub fn centered<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, text: &str, pos: (i32, i32), style: &TextStyle) -> Result<(), PlotError>
where
    DB::ErrorType: 'static,
{
    let st = style.pos(Pos::new(HPos::Center, VPos::Center));
    area.draw(&Text::new(text.to_string(), pos, st)).map_err(draw_err)
}

/// A horizontal legend row of coloured squares and labels starting at `pos`, its text drawn
/// smaller than `size` when the row would not fit the area's width; returns its width.
///
/// # Errors
/// [`PlotError`] if drawing fails.
pub fn legend_row<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    items: &[(String, RGBColor)],
    pos: (i32, i32),
    size: f64,
) -> Result<i32, PlotError>
where
    DB::ErrorType: 'static,
{
    // The row's width at `size`; a row wider than the area is drawn smaller until it fits.
    let width_at = |size: f64| -> i32 {
        let st = font(size).pos(Pos::new(HPos::Left, VPos::Center));
        items.iter().map(|(l, _)| (size * 0.8) as i32 + (size * 0.4) as i32 + text_width(area, l, &st) + (size * 1.2) as i32).sum()
    };
    let room = area.dim_in_pixel().0 as i32 - pos.0;
    let mut size = size;
    while width_at(size) > room && size > 4.0 {
        size *= 0.95;
    }
    let st = font(size).pos(Pos::new(HPos::Left, VPos::Center));
    let sq = (size * 0.8) as i32;
    let mut x = pos.0;
    for (label, c) in items {
        area.draw(&Rectangle::new([(x, pos.1 - sq / 2), (x + sq, pos.1 + sq / 2)], c.filled())).map_err(draw_err)?;
        area.draw(&Rectangle::new([(x, pos.1 - sq / 2), (x + sq, pos.1 + sq / 2)], BLACK.mix(0.4).stroke_width(1))).map_err(draw_err)?;
        x += sq + (size * 0.4) as i32;
        area.draw(&Text::new(label.clone(), (x, pos.1), st.clone())).map_err(draw_err)?;
        let (tw, _) = area.estimate_text_size(label, &st).map_err(draw_err)?;
        x += tw as i32 + (size * 1.2) as i32;
    }
    Ok(x - pos.0)
}

/// Pixel width of `text` in `style` on `area` (0 if it cannot be measured).
pub fn text_width<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, text: &str, style: &TextStyle) -> i32 {
    area.estimate_text_size(text, style).map(|(w, _)| w as i32).unwrap_or(0)
}

/// Tick values for a log axis from `lo` to `hi`: the powers of ten inside (and 2x, 5x when there
/// are at most three decades).
pub fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    // A log axis needs a positive, finite range (a zero would give 2^31 decades).
    if !(lo > 0.0 && hi >= lo && hi.is_finite()) {
        return Vec::new();
    }
    let (a, b) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
    let decades = (hi / lo).log10();
    let mut out = Vec::new();
    for e in a..=b {
        let p = 10f64.powi(e);
        let mults: &[f64] = if decades <= 3.0 { &[1.0, 2.0, 5.0] } else { &[1.0] };
        for m in mults {
            let v = m * p;
            if v >= lo * (1.0 - 1e-9) && v <= hi * (1.0 + 1e-9) {
                out.push(v);
            }
        }
    }
    out
}

/// A compact label for a tick value: `1k`, `20k`, `0.5`, `1M`, ...
pub fn tick_label(v: f64) -> String {
    let a = v.abs();
    let trim = |s: String| {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    if a >= 1e12 {
        trim(format!("{:.1}", v / 1e12)) + "T"
    } else if a >= 1e9 {
        trim(format!("{:.1}", v / 1e9)) + "G"
    } else if a >= 1e6 {
        trim(format!("{:.1}", v / 1e6)) + "M"
    } else if a >= 1e4 {
        trim(format!("{:.1}", v / 1e3)) + "k"
    } else if a >= 1.0 || a == 0.0 {
        trim(format!("{v:.2}"))
    } else {
        trim(format!("{v:.3}"))
    }
}

/// Spreads labels vertically so that none is closer than `gap` pixels to the next, keeping each
/// as near its wanted position as possible (wanted pixel y in, placed pixel y out, same order).
pub fn spread(wanted: &[i32], gap: i32) -> Vec<i32> {
    let mut idx: Vec<usize> = (0..wanted.len()).collect();
    idx.sort_by_key(|&i| wanted[i]);
    let mut placed = vec![0; wanted.len()];
    let mut prev: Option<i32> = None;
    for &i in &idx {
        let y = match prev {
            Some(p) if wanted[i] < p + gap => p + gap,
            _ => wanted[i],
        };
        placed[i] = y;
        prev = Some(y);
    }
    placed
}

/// Draws `text` at `pos` with a translucent white box behind it, so that lines under a label do
/// not cross its glyphs.
///
/// # Errors
/// [`PlotError`] if drawing fails.
pub fn boxed<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, text: &str, pos: (i32, i32), style: &TextStyle) -> Result<(), PlotError>
where
    DB::ErrorType: 'static,
{
    let (w, h) = area.estimate_text_size(text, style).map_err(draw_err)?;
    let (w, h) = (w as i32, h as i32);
    let x0 = match style.pos.h_pos {
        HPos::Left => pos.0,
        HPos::Center => pos.0 - w / 2,
        HPos::Right => pos.0 - w,
    };
    let y0 = match style.pos.v_pos {
        VPos::Top => pos.1,
        VPos::Center => pos.1 - h / 2,
        VPos::Bottom => pos.1 - h,
    };
    area.draw(&Rectangle::new([(x0 - 3, y0 - 2), (x0 + w + 3, y0 + h + 3)], WHITE.mix(0.85).filled())).map_err(draw_err)?;
    area.draw(&Text::new(text.to_string(), pos, style.clone())).map_err(draw_err)
}

/// A label's box in pixels of the root area: (left, top, right, bottom).
pub type LabelBox = [i32; 4];

thread_local! {
    /// The labels the last [`Labels`] of this thread placed (text and box), for tests.
    static LAST_LABELS: std::cell::RefCell<Vec<(String, LabelBox)>> = const { std::cell::RefCell::new(Vec::new()) };
    /// The areas the last [`Labels`] of this thread kept free (markers, segment labels).
    static LAST_RESERVED: std::cell::RefCell<Vec<LabelBox>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The areas (markers, other text) the last [`Labels`] created on this thread kept labels off.
pub fn last_reserved() -> Vec<LabelBox> {
    LAST_RESERVED.with(|l| l.borrow().clone())
}

/// The labels placed by the last [`Labels`] created on this thread, in placement order (text
/// and box): what a test checks for collisions.
pub fn last_labels() -> Vec<(String, LabelBox)> {
    LAST_LABELS.with(|l| l.borrow().clone())
}

/// Places annotation labels of a figure so that no two overlap and none covers a reserved area
/// (a marker, a legend). Each label tries its candidate positions in order, then positions
/// moved up and down from the first in steps of its height, and is drawn at the first free one
/// (with a white box behind it, as [`boxed`]). A label that finds no free place within the
/// drawing area is drawn at its first candidate (better overlapped than missing).
#[derive(Debug)]
pub struct Labels {
    taken: Vec<LabelBox>,
    bounds: Option<LabelBox>,
}

impl Default for Labels {
    fn default() -> Self {
        Self::new()
    }
}

impl Labels {
    /// An empty layout (also starts a new [`last_labels`] record).
    pub fn new() -> Self {
        LAST_LABELS.with(|l| l.borrow_mut().clear());
        LAST_RESERVED.with(|l| l.borrow_mut().clear());
        Labels { taken: Vec::new(), bounds: None }
    }

    /// This layout with its labels kept inside `bounds` (root pixels, e.g. a chart's plotting
    /// area): clear of the tick labels, axis titles and notes around it.
    pub fn within(mut self, bounds: LabelBox) -> Self {
        self.bounds = Some(bounds);
        self
    }

    /// The pixel box of a drawing area (a chart's plotting area) in the root's pixels.
    pub fn area_box<DB: DrawingBackend, C: plotters::coord::CoordTranslate>(area: &DrawingArea<DB, C>) -> LabelBox {
        let (x, y) = area.get_pixel_range();
        [x.start, y.start, x.end, y.end]
    }

    /// Marks an area (root pixels) that labels must not cover.
    pub fn reserve(&mut self, b: LabelBox) {
        LAST_RESERVED.with(|l| l.borrow_mut().push(b));
        self.taken.push(b);
    }

    fn free(&self, b: &LabelBox) -> bool {
        const PAD: i32 = 2;
        self.taken.iter().all(|t| b[2] + PAD <= t[0] || t[2] + PAD <= b[0] || b[3] + PAD <= t[1] || t[3] + PAD <= b[1])
    }

    /// Draws `text` in `style` (its anchor: `style.pos`) at the first free position among
    /// `candidates` (root pixels), else moved vertically from the first; returns the position
    /// used.
    ///
    /// # Errors
    /// [`PlotError`] if drawing fails.
    pub fn place<DB: DrawingBackend>(
        &mut self,
        area: &DrawingArea<DB, Shift>,
        text: &str,
        style: &TextStyle,
        candidates: &[(i32, i32)],
    ) -> Result<(i32, i32), PlotError>
    where
        DB::ErrorType: 'static,
    {
        self.put(area, text, style, candidates, true)
    }

    /// [`Labels::place`] at one of `candidates` only (axis labels that must stay in their
    /// row): the first free one, else the first.
    ///
    /// # Errors
    /// [`PlotError`] if drawing fails.
    pub fn place_fixed<DB: DrawingBackend>(
        &mut self,
        area: &DrawingArea<DB, Shift>,
        text: &str,
        style: &TextStyle,
        candidates: &[(i32, i32)],
    ) -> Result<(i32, i32), PlotError>
    where
        DB::ErrorType: 'static,
    {
        self.put(area, text, style, candidates, false)
    }

    fn put<DB: DrawingBackend>(
        &mut self,
        area: &DrawingArea<DB, Shift>,
        text: &str,
        style: &TextStyle,
        candidates: &[(i32, i32)],
        slide: bool,
    ) -> Result<(i32, i32), PlotError>
    where
        DB::ErrorType: 'static,
    {
        let (w, h) = area.estimate_text_size(text, style).map_err(draw_err)?;
        let (w, h) = (w as i32, h as i32);
        let (aw, ah) = area.dim_in_pixel();
        let box_at = |pos: (i32, i32)| {
            let x0 = match style.pos.h_pos {
                HPos::Left => pos.0,
                HPos::Center => pos.0 - w / 2,
                HPos::Right => pos.0 - w,
            };
            let y0 = match style.pos.v_pos {
                VPos::Top => pos.1,
                VPos::Center => pos.1 - h / 2,
                VPos::Bottom => pos.1 - h,
            };
            [x0 - 3, y0 - 2, x0 + w + 3, y0 + h + 3]
        };
        let [bx0, by0, bx1, by1] = self.bounds.unwrap_or([0, 0, aw as i32, ah as i32]);
        let inside = |b: &LabelBox| b[0] >= bx0 && b[1] >= by0 && b[2] <= bx1 && b[3] <= by1;
        let first = candidates.first().copied().unwrap_or((0, 0));
        let step = h + 4;
        let reach = if slide { 200 } else { 1 };
        // Moved up and down from the first candidate, then also sideways by quarters of its
        // width (a long label beside a crowded row).
        let shifted = (1..reach).flat_map(|k| [(first.0, first.1 + k * step / 2), (first.0, first.1 - k * step / 2)]);
        let quarter = (w / 4).max(1);
        let sideways = (1..if slide { 5 } else { 1 })
            .flat_map(|q| [(first.0 - q * quarter), (first.0 + q * quarter)])
            .flat_map(|x| (0..reach).flat_map(move |k| [(x, first.1 + k * step / 2), (x, first.1 - k * step / 2)]));
        let pos = candidates
            .iter()
            .copied()
            .chain(shifted)
            .chain(sideways)
            .find(|&p| {
                let b = box_at(p);
                inside(&b) && self.free(&b)
            })
            .unwrap_or(first);
        let b = box_at(pos);
        self.taken.push(b);
        LAST_LABELS.with(|l| l.borrow_mut().push((text.to_string(), b)));
        // An opaque box: a line passing under a label never strikes through its text.
        area.draw(&Rectangle::new([(b[0], b[1]), (b[2], b[3])], WHITE.filled())).map_err(draw_err)?;
        area.draw(&Text::new(text.to_string(), pos, style.clone())).map_err(draw_err)?;
        Ok(pos)
    }
}

/// Whether two label boxes overlap (share more than an edge).
pub fn overlaps(a: &LabelBox, b: &LabelBox) -> bool {
    a[0] < b[2] && b[0] < a[2] && a[1] < b[3] && b[1] < a[3]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_ticks_cover_range() {
        assert_eq!(log_ticks(1.0, 10000.0), vec![1.0, 10.0, 100.0, 1000.0, 10000.0]);
        assert_eq!(log_ticks(0.3, 3.0), vec![0.5, 1.0, 2.0]);
        // A range a log axis cannot have gives no ticks (a zero once meant 2^31 decades).
        assert!(log_ticks(0.0, 10.0).is_empty());
        assert!(log_ticks(-1.0, 10.0).is_empty());
        assert!(log_ticks(1.0, f64::INFINITY).is_empty());
    }

    #[test]
    fn tick_labels() {
        assert_eq!(tick_label(20000.0), "20k");
        assert_eq!(tick_label(1000.0), "1000");
        assert_eq!(tick_label(0.5), "0.5");
        assert_eq!(tick_label(2e6), "2M");
    }
}
