//! Figures and timelines for tpusim: what people look at.
//!
//! * [`timeline`]: the simulated execution as Chrome Trace Event JSON (Perfetto,
//!   `chrome://tracing`): one track per unit, one event per tile operation, DMA transfer and
//!   grid-step overhead, bounded by a window of grid steps or one head.
//! * Figures, each a PNG or an SVG chosen by the output file's extension ([`Output`]):
//!   [`sweep`] (a metric against a swept variable, one line per series, from a CSV),
//!   [`heatmap`] (a metric over block_q x block_kv from a CSV), [`roofline`] (arithmetic
//!   intensity vs achieved FLOP/s with the chip's roofs and the workload's ceilings),
//!   [`tiles`] (the tile map of a mask at a tiling), [`gantt`] (unit activity over a window of
//!   grid steps), [`validation`] (predicted vs measured with error bands) and [`breakdown`]
//!   (stacked busy time per unit for several jobs); [`layer`] (a transformer layer on a slice of
//!   chips: its time by part over resolutions, chip counts or attention modes, and the
//!   end-to-end speedup of sparse attention over the dense fraction).
//!
//! [`layout`] checks a finished SVG's text: inside the canvas, no text over another.
//!
//! Text is rasterised from a bundled font (DejaVu Sans, `assets/`, Bitstream Vera licence) with
//! `ab_glyph`, so PNGs render on a machine with no fonts installed; SVGs name the `sans-serif`
//! family and leave text to the viewer. Output files are written atomically (a temporary file
//! in the same directory, then a rename).
//!
//! Errors are [`PlotError`] values naming the flag, file or column at fault; the binary maps them
//! to exit code 2. Depends on `tpusim-job`, `tpusim-layer` and the crates below them.

pub mod axis;
pub mod breakdown;
pub mod gantt;
pub mod heatmap;
pub mod jobs;
pub mod layer;
pub mod layout;
pub mod roofline;
pub mod style;
pub mod sweep;
pub mod table;
pub mod tiles;
pub mod timeline;
pub mod validation;

use plotters::coord::Shift;
use plotters::prelude::*;
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// An error of a figure. Input errors name the flag, file or column and what is expected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlotError {
    /// Bad input: a flag, an input file, a column, a job.
    #[error("{0}")]
    Input(String),
    /// A job of the figure is invalid (names the field).
    #[error("{context}{source}")]
    Spec {
        /// Which job, e.g. `job dense: `.
        context: String,
        /// The job's error.
        source: tpusim_job::SpecError,
    },
    /// Drawing failed (a plotters backend error: not the input's fault).
    #[error("drawing failed: {0}")]
    Draw(String),
    /// Writing the output file failed.
    #[error("{0}")]
    Io(String),
}

impl PlotError {
    /// An input error from anything printable.
    pub fn new(msg: impl Into<String>) -> Self {
        PlotError::Input(msg.into())
    }

    /// True for failures that are not the input's fault (drawing, writing).
    pub fn is_internal(&self) -> bool {
        matches!(self, PlotError::Draw(_) | PlotError::Io(_))
    }
}

/// Converts a plotters drawing error into a [`PlotError`] (these are internal: a backend that
/// writes to memory does not fail on user input).
pub(crate) fn draw_err<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> PlotError {
    PlotError::Draw(e.to_string())
}

/// The bundled font: DejaVu Sans (see `assets/DejaVuSans-LICENSE.txt`).
static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

/// Registers the bundled font as `sans-serif` (once per process).
pub fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // The bytes are a valid TrueType file shipped with the crate; a failure here is a
        // packaging bug, caught by every rendering test.
        if plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).is_err() {
            panic!("the bundled font assets/DejaVuSans.ttf is not a valid font");
        }
    });
}

/// Image format of an output file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Portable Network Graphics (RGB, 8 bits per channel).
    Png,
    /// Scalable Vector Graphics.
    Svg,
}

/// Where a figure goes: a path whose extension (`.png` or `.svg`) picks the format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// Destination path.
    pub path: PathBuf,
    /// Format from the extension.
    pub format: Format,
    /// Width, pixels.
    pub width: u32,
    /// Height, pixels.
    pub height: u32,
}

impl Output {
    /// An output for `path` at `width` x `height` pixels.
    ///
    /// # Errors
    /// [`PlotError`] naming `--out` when the extension is neither `.png` nor `.svg`, or a size is
    /// outside 200..=8000 pixels.
    pub fn new(path: &str, width: u32, height: u32) -> Result<Self, PlotError> {
        let ext = Path::new(path).extension().and_then(|e| e.to_str()).map(|e| e.to_ascii_lowercase());
        let format = match ext.as_deref() {
            Some("png") => Format::Png,
            Some("svg") => Format::Svg,
            _ => return Err(PlotError::Input(format!("--out {path}: expected a file name ending in .png or .svg"))),
        };
        for (flag, v) in [("--width", width), ("--height", height)] {
            if !(200..=8000).contains(&v) {
                return Err(PlotError::Input(format!("{flag} = {v}: expected 200 to 8000 pixels")));
            }
        }
        Ok(Output { path: PathBuf::from(path), format, width, height })
    }
}

/// A figure that can draw itself on any plotters backend.
pub trait Figure {
    /// Draws the whole figure on `root` (already cleared to white).
    ///
    /// # Errors
    /// [`PlotError`] if drawing fails.
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), PlotError>
    where
        DB::ErrorType: 'static;

    /// The figure's key numbers as lines of text (`NAME: VALUE`), computed from the same data it
    /// draws: what `tpusim plot` prints after writing it, so prose about a figure (plots/README.md,
    /// written by plots/make.sh) quotes the figure itself. Empty for figures of a CSV's rows.
    fn facts(&self) -> Vec<String> {
        Vec::new()
    }
}

/// Renders a figure to bytes in a format.
///
/// # Errors
/// [`PlotError`] if drawing or PNG encoding fails.
pub fn render_bytes<F: Figure>(fig: &F, format: Format, width: u32, height: u32) -> Result<Vec<u8>, PlotError> {
    register_font();
    match format {
        Format::Svg => {
            let mut s = String::new();
            {
                let root = SVGBackend::with_string(&mut s, (width, height)).into_drawing_area();
                root.fill(&WHITE).map_err(draw_err)?;
                fig.draw(&root)?;
                root.present().map_err(draw_err)?;
            }
            // The overwrite rule's mark (tpusim_io::mark): which command wrote the file.
            Ok(format!("{}{s}", tpusim_io::mark::svg_comment("plot")).into_bytes())
        }
        Format::Png => {
            let mut buf = vec![255u8; width as usize * height as usize * 3];
            {
                let root = BitMapBackend::with_buffer(&mut buf, (width, height)).into_drawing_area();
                root.fill(&WHITE).map_err(draw_err)?;
                fig.draw(&root)?;
                root.present().map_err(draw_err)?;
            }
            let mut out = Vec::new();
            {
                let mut enc = png::Encoder::new(&mut out, width, height);
                enc.set_color(png::ColorType::Rgb);
                enc.set_depth(png::BitDepth::Eight);
                enc.set_compression(png::Compression::Best);
                // The overwrite rule's mark (tpusim_io::mark): which command wrote the file.
                enc.add_text_chunk(tpusim_io::mark::PNG_KEYWORD.into(), tpusim_io::mark::mark_value("plot"))
                    .map_err(|e| PlotError::Draw(format!("PNG encoding failed: {e}")))?;
                let mut w = enc.write_header().map_err(|e| PlotError::Draw(format!("PNG encoding failed: {e}")))?;
                w.write_image_data(&buf).map_err(|e| PlotError::Draw(format!("PNG encoding failed: {e}")))?;
            }
            Ok(out)
        }
    }
}

/// Renders a figure and writes it to `out` atomically.
///
/// # Errors
/// [`PlotError`] naming `--out` and the path when it cannot be written.
pub fn render<F: Figure>(fig: &F, out: &Output) -> Result<(), PlotError> {
    let bytes = render_bytes(fig, out.format, out.width, out.height)?;
    write_atomic(&out.path, &bytes, "--out")
}

/// Writes `bytes` to `path` completely or not at all ([`tpusim_io::write_atomic`]).
///
/// # Errors
/// [`PlotError`] naming `flag` and the path: [`PlotError::Input`] for a path that cannot be an
/// output, [`PlotError::Io`] when writing fails.
pub fn write_atomic(path: &Path, bytes: &[u8], flag: &str) -> Result<(), PlotError> {
    atomic_with(path, flag, |f| f.write_all(bytes))
}

/// Like [`write_atomic`], with the contents produced by `fill` writing into the temporary file.
///
/// # Errors
/// As [`write_atomic`].
pub fn atomic_with(path: &Path, flag: &str, fill: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>) -> Result<(), PlotError> {
    tpusim_io::write_with(path, fill).map_err(|e| output_error(e, flag))
}

/// A [`tpusim_io::OutputError`] as a [`PlotError`] naming the flag.
pub fn output_error(e: tpusim_io::OutputError, flag: &str) -> PlotError {
    if e.is_refusal() {
        PlotError::Input(format!("{flag} {e}"))
    } else {
        PlotError::Io(format!("{flag} {e}"))
    }
}

/// Formats a number with thousands separators (`75600` -> `75,600`).
pub fn thousands(v: u64) -> String {
    let s = v.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Formats a value with about three significant digits and no exponent for ordinary sizes.
pub fn sig3(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 || !a.is_finite() {
        format!("{v}")
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else if a >= 0.01 {
        format!("{v:.3}")
    } else {
        format!("{v:.2e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_extension_is_checked() {
        assert_eq!(Output::new("a/b.PNG", 800, 600).unwrap().format, Format::Png);
        assert_eq!(Output::new("b.svg", 800, 600).unwrap().format, Format::Svg);
        let e = Output::new("b.jpg", 800, 600).unwrap_err().to_string();
        assert!(e.contains("--out b.jpg") && e.contains(".png"), "{e}");
        assert!(Output::new("b.png", 10, 600).unwrap_err().to_string().contains("--width"));
    }

    #[test]
    fn number_formats() {
        assert_eq!(thousands(75600), "75,600");
        assert_eq!(thousands(512), "512");
        assert_eq!(thousands(1234567), "1,234,567");
        assert_eq!(sig3(78.71), "78.7");
        assert_eq!(sig3(918.0), "918");
    }

    #[test]
    fn atomic_write_leaves_no_temp_file() {
        let dir = std::env::temp_dir().join(format!("tpusim-plot-atomic-{}", std::process::id()));
        let p = dir.join("sub/x.txt");
        let e = write_atomic(&p, b"hello", "--out").unwrap_err().to_string();
        assert!(e.contains("does not exist"), "{e}");
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        write_atomic(&p, b"hello", "--out").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"hello");
        let names: Vec<_> = std::fs::read_dir(p.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 1, "{names:?}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
