//! Checks of a finished figure's text: every text element of an SVG this crate wrote, measured
//! with the bundled font as the PNG backend rasterises it, must lie inside the canvas and clear
//! of every other text ([`text_problems`]). The check reads the SVG itself, so it covers what
//! plotters draws on its own (tick labels, axis titles) as well as the figures' annotations.
//!
//! plotters' SVG backend writes each text as `<text x=".." y=".." dy=".." text-anchor=".."
//! font-size=".." [transform="rotate(A, X, Y)"]>TEXT</text>`, with `font-size` the style's size
//! over 1.24 and `dy` 0.76em (top anchor), 0.5ex (centre) or -0.5ex (bottom); the box here is the
//! font's layout box of the text at the style's size placed by that anchor, as plotters' own
//! debug outline places it.

use plotters::style::{FontDesc, FontFamily, FontStyle};

/// One text element of an SVG: its text and its box `[x0, y0, x1, y1]` in canvas pixels.
#[derive(Debug, Clone, PartialEq)]
pub struct SvgText {
    /// The text, unescaped.
    pub text: String,
    /// Left, top, right, bottom, pixels.
    pub bbox: [f64; 4],
}

fn attr(tag: &str, name: &str) -> Option<String> {
    let key = format!(" {name}=\"");
    let i = tag.find(&key)? + key.len();
    let j = tag[i..].find('"')? + i;
    Some(tag[i..j].to_string())
}

fn unescape(s: &str) -> String {
    s.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&#39;", "'").replace("&apos;", "'").replace("&amp;", "&")
}

/// The canvas size of an SVG (`width`, `height` of its `<svg>` element), pixels; `None` if the
/// text holds no `<svg` element with both.
pub fn svg_size(svg: &str) -> Option<(f64, f64)> {
    let i = svg.find("<svg")?;
    let tag = &svg[i..i + svg[i..].find('>')?];
    Some((attr(tag, "width")?.parse().ok()?, attr(tag, "height")?.parse().ok()?))
}

/// Every text element of `svg` with its box, in document order (empty texts left out).
pub fn svg_texts(svg: &str) -> Vec<SvgText> {
    crate::register_font();
    let mut out = Vec::new();
    let mut rest = svg;
    while let Some(i) = rest.find("<text ") {
        rest = &rest[i..];
        let Some(close) = rest.find('>') else { break };
        let tag = &rest[..close];
        let Some(end) = rest.find("</text>") else { break };
        let text = unescape(rest[close + 1..end].trim());
        rest = &rest[end..];
        if text.trim().is_empty() {
            continue;
        }
        let num = |n: &str| attr(tag, n).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        let (x, y) = (num("x"), num("y"));
        let size = num("font-size") * 1.24;
        let font = FontDesc::new(FontFamily::Name("sans-serif"), size, FontStyle::Normal);
        let ((lx0, ly0), (lx1, ly1)) = font.layout_box(&text).unwrap_or(((0, 0), (0, 0)));
        let (w, h) = (f64::from(lx1 - lx0), f64::from(ly1 - ly0));
        let dx0 = match attr(tag, "text-anchor").as_deref() {
            Some("end") => -w,
            Some("middle") => -w / 2.0,
            _ => 0.0,
        };
        let dy0 = match attr(tag, "dy").as_deref() {
            Some("0.5ex") => -h / 2.0,
            Some("-0.5ex") => -h,
            _ => 0.0,
        };
        // rotate(A, x, y) turns the box about the anchor, clockwise on screen for positive A.
        let angle = attr(tag, "transform")
            .and_then(|t| t.strip_prefix("rotate(").and_then(|r| r.split(',').next()).and_then(|a| a.trim().parse::<f64>().ok()))
            .unwrap_or(0.0);
        let (s, c) = angle.to_radians().sin_cos();
        let corners = [(dx0, dy0), (dx0 + w, dy0), (dx0, dy0 + h), (dx0 + w, dy0 + h)].map(|(a, b)| (x + a * c - b * s, y + a * s + b * c));
        let xs = corners.map(|p| p.0);
        let ys = corners.map(|p| p.1);
        let min = |v: [f64; 4]| v.iter().copied().fold(f64::INFINITY, f64::min);
        let max = |v: [f64; 4]| v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        out.push(SvgText { text, bbox: [min(xs), min(ys), max(xs), max(ys)] });
    }
    out
}

/// What is wrong with `svg`'s text: each text that leaves the canvas, and each pair of texts
/// whose boxes overlap by more than `tolerance` pixels in both directions; empty when every
/// text is inside and clear.
pub fn text_problems(svg: &str, tolerance: f64) -> Vec<String> {
    let Some((w, h)) = svg_size(svg) else { return vec!["no <svg> element with a width and a height".into()] };
    let texts = svg_texts(svg);
    let mut problems = Vec::new();
    for t in &texts {
        let b = t.bbox;
        if b[0] < -tolerance || b[1] < -tolerance || b[2] > w + tolerance || b[3] > h + tolerance {
            problems.push(format!("'{}' at {:?} leaves the {w} x {h} canvas", t.text, b.map(|v| v.round())));
        }
    }
    for (i, a) in texts.iter().enumerate() {
        for b in &texts[i + 1..] {
            let ox = a.bbox[2].min(b.bbox[2]) - a.bbox[0].max(b.bbox[0]);
            let oy = a.bbox[3].min(b.bbox[3]) - a.bbox[1].max(b.bbox[1]);
            if ox > tolerance && oy > tolerance {
                problems.push(format!("'{}' at {:?} overlaps '{}' at {:?}", a.text, a.bbox.map(|v| v.round()), b.text, b.bbox.map(|v| v.round())));
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boxes_follow_the_anchor_and_overlaps_are_found() {
        let svg = r##"<svg width="400" height="200" viewBox="0 0 400 200" xmlns="http://www.w3.org/2000/svg">
<text x="10" y="10" dy="0.76em" text-anchor="start" font-family="sans-serif" font-size="16.129032258064516" opacity="1" fill="#000000">
left &amp; top
</text>
<text x="390" y="100" dy="0.5ex" text-anchor="end" font-family="sans-serif" font-size="16.129032258064516" opacity="1" fill="#000000">
right centred
</text>
<text x="30" y="12" dy="0.76em" text-anchor="start" font-family="sans-serif" font-size="16.129032258064516" opacity="1" fill="#000000">
clash
</text>
<text x="395" y="150" dy="0.76em" text-anchor="start" font-family="sans-serif" font-size="16.129032258064516" opacity="1" fill="#000000">
outside
</text>
</svg>"##;
        let t = svg_texts(svg);
        assert_eq!(t.len(), 4);
        assert_eq!(t[0].text, "left & top");
        assert!(t[0].bbox[0] == 10.0 && t[0].bbox[1] == 10.0 && t[0].bbox[2] > 60.0, "{:?}", t[0]);
        assert!(t[1].bbox[2] == 390.0 && t[1].bbox[0] < 300.0 && t[1].bbox[1] < 100.0 && t[1].bbox[3] > 100.0, "{:?}", t[1]);
        let p = text_problems(svg, 1.0);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p.iter().any(|m| m.contains("'outside'") && m.contains("leaves")), "{p:?}");
        assert!(p.iter().any(|m| m.contains("'left & top'") && m.contains("'clash'")), "{p:?}");
    }
}
