//! Numeric axes for the data-driven figures: linear or log10, with nice tick positions and a
//! description that carries the column's unit.

use crate::style;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use std::ops::Range;

/// A linear coordinate over plotting space with fixed tick positions (plotters' own f64
/// coordinate cannot take custom ticks and a custom label formatter together).
#[derive(Debug, Clone, PartialEq)]
pub struct Ticked {
    /// Low end.
    pub lo: f64,
    /// High end.
    pub hi: f64,
    /// Tick positions.
    pub ticks: Vec<f64>,
}

impl Ranged for Ticked {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let t = if self.hi > self.lo { (v - self.lo) / (self.hi - self.lo) } else { 0.5 };
        limit.0 + ((limit.1 - limit.0) as f64 * t).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> Range<f64> {
        self.lo..self.hi
    }
}

/// One axis: values are mapped into plotting space (identity or log10) before drawing.
#[derive(Debug, Clone, PartialEq)]
pub struct Axis {
    /// Log10 scale.
    pub log: bool,
    /// Low end, plotting space.
    pub lo: f64,
    /// High end, plotting space.
    pub hi: f64,
    /// Tick positions, plotting space.
    pub ticks: Vec<f64>,
}

impl Axis {
    /// An axis covering `values` (data space) with a margin; `log` requires positive values
    /// (non-positive ones are ignored for the range).
    pub fn fit(values: &[f64], log: bool, include_zero: bool) -> Axis {
        let vals: Vec<f64> = values.iter().copied().filter(|v| v.is_finite() && (!log || *v > 0.0)).collect();
        let (mut a, mut b) = vals.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| (a.min(v), b.max(v)));
        if !a.is_finite() {
            (a, b) = if log { (1.0, 10.0) } else { (0.0, 1.0) };
        }
        if log {
            let (la, lb) = (a.log10(), b.log10());
            let pad = ((lb - la) * 0.06).max(0.05);
            let (lo, hi) = (la - pad, lb + pad);
            let ticks = style::log_ticks(10f64.powf(lo), 10f64.powf(hi)).into_iter().map(f64::log10).collect();
            Axis { log, lo, hi, ticks }
        } else {
            if include_zero {
                a = a.min(0.0);
                b = b.max(0.0);
            }
            if (b - a).abs() < 1e-12 {
                a -= 0.5_f64.max(a.abs() * 0.1);
                b += 0.5_f64.max(b.abs() * 0.1);
            }
            let pad = (b - a) * 0.06;
            let lo = if include_zero && a >= 0.0 { 0.0 } else { a - pad };
            let hi = b + pad;
            Axis { log, lo, hi, ticks: lin_ticks(lo, hi, 8) }
        }
    }

    /// The plotters coordinate of this axis.
    pub fn coord(&self) -> Ticked {
        Ticked { lo: self.lo, hi: self.hi, ticks: self.ticks.clone() }
    }

    /// Data value -> plotting space.
    pub fn map(&self, v: f64) -> f64 {
        if self.log {
            v.log10()
        } else {
            v
        }
    }

    /// Tick label for a plotting-space value.
    pub fn label(&self, t: f64) -> String {
        style::tick_label(if self.log { 10f64.powf(t) } else { t })
    }
}

/// About `n` evenly spaced ticks at 1, 2 or 5 x 10^k steps between `lo` and `hi`.
pub fn lin_ticks(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    if hi <= lo || n == 0 {
        return vec![lo];
    }
    let raw = (hi - lo) / n as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag);
    let first = (lo / step).ceil() * step;
    let mut out = Vec::new();
    let mut v = first;
    while v <= hi + step * 1e-9 {
        out.push(if v.abs() < step * 1e-9 { 0.0 } else { v });
        v += step;
    }
    out
}

/// A column name with its unit, for axis descriptions: `latency_ms` -> `latency (ms)`.
pub fn describe_column(name: &str) -> String {
    let known = [
        ("latency_ms", "latency (ms)"),
        ("predicted_ms", "predicted latency (ms)"),
        ("measured_ms", "measured latency (ms)"),
        ("mfu", "MFU (fraction of peak)"),
        ("achieved_tflops", "achieved (TFLOP/s)"),
        ("block_q", "block_q (q rows per block)"),
        ("block_kv", "block_kv (kv rows per block)"),
        ("block_kv_compute", "block_kv_compute (columns per sub-tile)"),
        ("seq_len", "sequence length (tokens)"),
        ("q_len", "q length (tokens)"),
        ("kv_len", "kv length (tokens)"),
        ("head_dim", "head_dim (elements)"),
        ("heads", "heads"),
        ("batch", "batch"),
        ("cycles", "cycles"),
        ("hbm_bytes", "HBM traffic (bytes)"),
        ("arithmetic_intensity", "arithmetic intensity (FLOP/byte)"),
        ("tile_skip_efficiency", "tile-skip efficiency (fraction)"),
        ("speedup_vs_dense", "speedup vs dense (x)"),
        ("error", "error (fraction)"),
    ];
    if let Some((_, d)) = known.iter().find(|(k, _)| *k == name) {
        return d.to_string();
    }
    // Chip fields and rates name their unit in full (`chip.hbm.bandwidth_gb_per_s`): as written.
    if name.contains('.') || name.contains("_per_") {
        return name.to_string();
    }
    for (suffix, unit) in
        [("_ms", "ms"), ("_us", "us"), ("_s", "s"), ("_bytes", "bytes"), ("_tflops", "TFLOP/s"), ("_gbs", "GB/s"), ("_mib", "MiB")]
    {
        if let Some(stem) = name.strip_suffix(suffix) {
            return format!("{} ({unit})", stem.replace('_', " "));
        }
    }
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round() {
        assert_eq!(lin_ticks(0.0, 10.0, 5), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        let t = lin_ticks(480.0, 2100.0, 8);
        assert!(t.len() >= 5 && t.iter().all(|v| v % 250.0 == 0.0), "{t:?}");
    }

    #[test]
    fn log_axis_maps() {
        let a = Axis::fit(&[1.0, 1000.0], true, false);
        assert!(a.lo < 0.0 && a.hi > 3.0);
        assert_eq!(a.map(100.0), 2.0);
        assert_eq!(a.label(2.0), "100");
    }

    #[test]
    fn column_units() {
        assert_eq!(describe_column("latency_ms"), "latency (ms)");
        assert_eq!(describe_column("dense_latency_ms"), "dense latency (ms)");
        assert_eq!(describe_column("foo"), "foo");
    }
}
