//! Progress of long work on stderr, with indicatif: a redrawn bar when stderr is a terminal, and
//! otherwise (a batch job's log, a pipe) a plain line every [`DEFAULT_INTERVAL`] (or
//! `TPUSIM_PROGRESS_SECS` seconds), so that long sweeps and searches are never silent:
//!
//! ```text
//! tpusim tune: blocks (stage 2 of 3), lowering: 412/923 (44%), 37s elapsed, about 45s left
//! ```
//!
//! `--no-progress` turns both off.

use crate::SweepError;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle, TermLike};
use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Time between plain progress lines when stderr is not a terminal.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);

/// The environment variable that sets the time between plain progress lines, in seconds.
pub const INTERVAL_VAR: &str = "TPUSIM_PROGRESS_SECS";

/// The time between plain progress lines: `TPUSIM_PROGRESS_SECS` if set, else
/// [`DEFAULT_INTERVAL`].
///
/// # Errors
/// [`SweepError::Input`] naming the variable when it is not a number of seconds from 0.01 to
/// 86400.
pub fn interval() -> Result<Duration, SweepError> {
    match std::env::var(INTERVAL_VAR) {
        Err(_) => Ok(DEFAULT_INTERVAL),
        Ok(v) => v
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && (0.01..=86400.0).contains(s))
            .map(Duration::from_secs_f64)
            .ok_or_else(|| SweepError::new(format!("{INTERVAL_VAR}={v}: expected seconds between progress lines, from 0.01 to 86400"))),
    }
}

/// A plain-text "terminal" for indicatif: ignores cursor movement and clearing, and writes a
/// drawn line to stderr only when `every` has passed since the last one (or since the start).
#[derive(Debug)]
struct PlainLines {
    every: Duration,
    last: Mutex<Option<Instant>>,
}

impl TermLike for PlainLines {
    fn width(&self) -> u16 {
        100
    }
    fn move_cursor_up(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn write_line(&self, s: &str) -> std::io::Result<()> {
        let s = s.trim_end();
        if s.is_empty() {
            return Ok(());
        }
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|t| t.elapsed() < self.every) {
            return Ok(());
        }
        *last = Some(Instant::now());
        let mut err = std::io::stderr().lock();
        writeln!(err, "{s}")?;
        err.flush()
    }
    fn write_str(&self, s: &str) -> std::io::Result<()> {
        self.write_line(s)
    }
    fn clear_line(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Progress over `len` items of `what` on stderr (module docs), or `None` when `show` is false.
pub fn bar(show: bool, len: u64, what: &str) -> Option<ProgressBar> {
    if !show {
        return None;
    }
    if std::io::stderr().is_terminal() {
        let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
        let style = ProgressStyle::with_template(&format!(
            "{{spinner}} {what}{{msg}} [{{elapsed_precise}}] {{wide_bar}} {{pos}}/{{len}} ({{per_sec}}, eta {{eta}})"
        ))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        pb.set_style(style);
        return Some(pb);
    }
    let every = interval().unwrap_or(DEFAULT_INTERVAL);
    // The first line comes after one interval: quick work prints nothing.
    let term = PlainLines { every, last: Mutex::new(Some(Instant::now())) };
    let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::term_like(Box::new(term)));
    let style =
        ProgressStyle::with_template(&format!("tpusim {what}{{msg}}: {{pos}}/{{len}} ({{percent}}%), {{elapsed}} elapsed, about {{eta}} left"))
            .unwrap_or_else(|_| ProgressStyle::default_bar());
    pb.set_style(style);
    // Redraw on a timer too, so that a line comes even while no item finishes.
    pb.enable_steady_tick(every.min(Duration::from_secs(1)));
    Some(pb)
}
