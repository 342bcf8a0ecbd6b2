//! "Bound by" as a what-if: for each unit, the gain `1 - t'/t` in latency if that unit alone were
//! twice as fast, by re-timing the run's own lowering (same program, same issue order) on a chip
//! model with that unit's fields changed. The unit with the largest gain is the bottleneck.
//!
//! The fields changed per unit (each through [`ChipModel::with_override`], so a what-if is
//! exactly `tpusim run --set FIELD=VALUE ...` of the same job):
//!
//! | unit | fields | change |
//! |---|---|---|
//! | mxu | `mxu.passes_per_cycle` | x2 (its rate, not its count) |
//! | vpu | `fitted.valu_vreg_ops_per_cycle` | x2 |
//! | eup | `fitted.eup_vregs_per_cycle` | x2 |
//! | xlu | `fitted.xlu_cycles_per_vreg` | /2 |
//! | hbm | `hbm.bandwidth_gb_per_s`, `hbm.dma_bandwidth_gb_per_s` | x2 (a kernel's DMAs run at the lower) |
//! | step_control | `fitted.grid_step_overhead_cycles` | /2 |
//! | host (scope `call` only) | `host.dispatch_us` | /2 |
//!
//! and, after the units, one row per step and DMA mechanism ([`MECHANISMS`]): `dma_latency`
//! (`fitted.dma_latency_ns` /2), `dma_issue` (`fitted.dma_issue_ns` /2) and `dmas_in_flight`
//! (`fitted.dmas_in_flight` x2). They say which part of the copies' round trip a DMA- or
//! step-bound kernel waits on; "bound by" is decided among the units alone.
//!
//! A what-if model keeps the issue order of the model it was derived from (`compiled_for`), so a
//! faster unit lengthens a run only through the DMA engines' sharing (a body done sooner issues
//! its write-back sooner, which then shares the bandwidth longer with the next step's inputs):
//! a gain may be slightly below 0. A gain decides "bound by" only when it
//! is large ([`DECISIVE_GAIN`]) and untied; tied units (within [`CO_BOUND_FRACTION`]) are
//! co-bound, and a run whose gains are all small is bound by the unit its critical path waits on
//! longest ([`bottleneck_of`]).

use crate::{run_lowered, Run};
use serde::Serialize;
use tpusim_chip::ChipModel;
use tpusim_model::{PerUnit, Unit};

/// A unit whose 2x gain is at least this fraction of the largest gain is co-bound.
pub const CO_BOUND_FRACTION: f64 = 0.8;

/// ... and above this gain (1%): below it no unit bounds the run appreciably.
pub const CO_BOUND_MIN_GAIN: f64 = 0.01;

/// What one unit twice as fast buys.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WhatIf {
    /// The unit (`mxu`, `vpu`, `eup`, `xlu`, `hbm`, `step_control`), a mechanism
    /// (`dma_latency`, `dma_issue`, `dmas_in_flight`: [`MECHANISMS`]) or `host`.
    pub unit: String,
    /// The `--set` overrides that make it twice as fast, e.g. `mxu.passes_per_cycle=4`.
    pub set: Vec<String>,
    /// Latency with those overrides, ms.
    pub latency_ms: f64,
    /// 1 - latency_ms / the run's latency (about 0 or more: module docs).
    pub gain: f64,
}

/// The overrides that make `unit` twice as fast on `chip` (module table).
pub fn doubled(chip: &ChipModel, unit: Unit) -> Vec<(String, f64)> {
    let f = &chip.fitted;
    match unit {
        Unit::Mxu => vec![("mxu.passes_per_cycle".into(), 2.0 * f64::from(chip.mxu.passes_per_cycle.value))],
        Unit::Vpu => vec![("fitted.valu_vreg_ops_per_cycle".into(), 2.0 * f.valu_vreg_ops_per_cycle.value)],
        Unit::Eup => vec![("fitted.eup_vregs_per_cycle".into(), 2.0 * f.eup_vregs_per_cycle.value)],
        Unit::Xlu => vec![("fitted.xlu_cycles_per_vreg".into(), 0.5 * f.xlu_cycles_per_vreg.value)],
        Unit::Hbm => vec![
            ("hbm.bandwidth_gb_per_s".into(), 2.0 * chip.hbm.bandwidth_gb_per_s.value),
            ("hbm.dma_bandwidth_gb_per_s".into(), 2.0 * chip.hbm.dma_bandwidth_gb_per_s.value),
        ],
        Unit::StepControl => vec![("fitted.grid_step_overhead_cycles".into(), 0.5 * f.grid_step_overhead_cycles.value)],
    }
}

/// The step and DMA mechanisms of the what-if table (module docs): each row's name and its
/// override on `chip`, that mechanism twice as fast.
pub fn mechanisms(chip: &ChipModel) -> Vec<(&'static str, Vec<(String, f64)>)> {
    let f = &chip.fitted;
    vec![
        ("dma_latency", vec![("fitted.dma_latency_ns".into(), 0.5 * f.dma_latency_ns.value)]),
        ("dma_issue", vec![("fitted.dma_issue_ns".into(), 0.5 * f.dma_issue_ns.value)]),
        ("dmas_in_flight", vec![("fitted.dmas_in_flight".into(), 2.0 * f.dmas_in_flight.value)]),
    ]
}

/// The names of the mechanism rows ([`mechanisms`]).
pub const MECHANISMS: [&str; 3] = ["dma_latency", "dma_issue", "dmas_in_flight"];

/// `chip` with `set` applied in order.
///
/// # Errors
/// The chip crate's error text when an override is refused (never for [`doubled`]'s values of a
/// valid model).
pub fn with_all(chip: &ChipModel, set: &[(String, f64)]) -> Result<ChipModel, String> {
    let mut c = chip.clone();
    for (k, v) in set {
        c = c.with_override(k, &format_value(*v)).map_err(|e| e.to_string())?;
    }
    Ok(c)
}

/// A value as `--set` takes it back exactly (shortest round-trip form; whole numbers without a
/// fraction, so integer fields parse).
pub fn format_value(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// Re-times `run` with each unit twice as fast (the host too for scope `call`), in the order of
/// [`Unit::ALL`], the mechanisms ([`MECHANISMS`]), then `host`. Skips (leaves out) a unit whose overrides the chip refuses.
pub fn what_if_2x(run: &Run) -> Vec<WhatIf> {
    // The host's row is the lowering's: a call it times with the host's dispatch, whatever the
    // job (a hand-modelled kernel or one read from its IR).
    let host = run.lowered.host_calls > 0;
    what_if_2x_by(&run.chip, run.result.seconds, host, &|chip| run_lowered(chip, &run.job, run.lowered.clone(), None).result.seconds)
}

/// The what-if loop: for each unit (and the host when `host`), `chip` with that unit's fields
/// doubled ([`doubled`]) and `retime` of the same lowering on it, seconds; `seconds` is the
/// latency on `chip`. Skips a unit whose overrides the chip refuses.
pub fn what_if_2x_by(chip: &ChipModel, seconds: f64, host: bool, retime: &dyn Fn(&ChipModel) -> f64) -> Vec<WhatIf> {
    let t = seconds;
    let mut sets: Vec<(String, Vec<(String, f64)>)> = Unit::ALL.iter().map(|&u| (u.word().to_string(), doubled(chip, u))).collect();
    sets.extend(mechanisms(chip).into_iter().map(|(n, set)| (n.to_string(), set)));
    if host {
        sets.push(("host".into(), vec![("host.dispatch_us".into(), 0.5 * chip.host.dispatch_us.value)]));
    }
    sets.into_iter()
        .filter_map(|(unit, set)| {
            let derived = with_all(chip, &set).ok()?;
            let t2 = retime(&derived);
            Some(WhatIf {
                unit,
                set: set.iter().map(|(k, v)| format!("{k}={}", format_value(*v))).collect(),
                latency_ms: t2 * 1e3,
                gain: if t > 0.0 { 1.0 - t2 / t } else { 0.0 },
            })
        })
        .collect()
}

/// A largest 2x gain at or above this (10%), with no unit tied to it, decides "bound by" by
/// itself. Below it the units' work overlaps so that speeding any one alone buys little (the
/// next unit takes over): the run is bound by what its critical path waits on, which a kernel
/// engineer checks against a profile, not by the largest of small gains.
pub const DECISIVE_GAIN: f64 = 0.10;

/// How the what-if table decided "bound by" ([`bottleneck_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BoundRule {
    /// One unit's 2x gain is at least [`DECISIVE_GAIN`] and no other is within
    /// [`CO_BOUND_FRACTION`] of it: that unit.
    Gain,
    /// Two or more units' 2x gains are tied (within [`CO_BOUND_FRACTION`], at least
    /// [`DECISIVE_GAIN`]): of the tied units, the one with the largest critical-path share.
    Tied,
    /// Every 2x gain is below [`DECISIVE_GAIN`]: the unit with the largest critical-path share.
    CriticalPath,
}

/// The bottleneck by the what-if table and the critical path (`critical`, per unit, any unit of
/// time): the unit with the largest gain when that gain decides ([`BoundRule::Gain`]); of tied
/// units the one the critical path waits on longest ([`BoundRule::Tied`], the others co-bound);
/// when every gain is below [`DECISIVE_GAIN`], the unit the critical path waits on longest
/// (`fallback` on equal shares: the engine's rule, ties broken by busy time) and none co-bound
/// ([`BoundRule::CriticalPath`]; [`latency_bound`] tells apart the case where no gain reaches
/// even [`CO_BOUND_MIN_GAIN`]).
pub fn bottleneck_of(table: &[WhatIf], critical: &PerUnit<f64>, fallback: Unit) -> (Unit, Vec<Unit>, BoundRule) {
    let gain = |u: Unit| table.iter().find(|w| w.unit == u.word()).map_or(0.0, |w| w.gain);
    let mut best = fallback;
    for &u in Unit::ALL {
        if gain(u) > gain(best) {
            best = u;
        }
    }
    let top = gain(best);
    let tied: Vec<Unit> = Unit::ALL.iter().copied().filter(|&u| gain(u) >= CO_BOUND_FRACTION * top && gain(u) > CO_BOUND_MIN_GAIN).collect();
    // The unit of `among` the critical path waits on longest (`fallback` first on equal shares).
    let longest = |among: &[Unit]| {
        let mut b = if among.contains(&fallback) { fallback } else { among[0] };
        for &u in among {
            if critical[u] > critical[b] {
                b = u;
            }
        }
        b
    };
    if top < DECISIVE_GAIN {
        return (longest(Unit::ALL), Vec::new(), BoundRule::CriticalPath);
    }
    if tied.len() > 1 {
        let b = longest(&tied);
        return (b, tied.into_iter().filter(|&u| u != b).collect(), BoundRule::Tied);
    }
    (best, Vec::new(), BoundRule::Gain)
}

/// True when no chip unit twice as fast saves [`CO_BOUND_MIN_GAIN`] of the latency: the run is
/// bound by latency, not by any unit's rate.
pub fn latency_bound(table: &[WhatIf]) -> bool {
    table.iter().filter(|w| Unit::ALL.iter().any(|u| u.word() == w.unit)).all(|w| w.gain < CO_BOUND_MIN_GAIN)
}
