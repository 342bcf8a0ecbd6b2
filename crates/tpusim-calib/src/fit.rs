//! Calibration: fit a chip model's `[fitted]` parameters (and only those) to measured times.
//!
//! **Objective.** Least squares on log time: minimise `S = sum_i ln(predicted_i / measured_i)^2`
//! over the rows of the chosen chip that the simulator can express, every row weighted equally.
//! Log time makes a 10% miss on a 0.1 ms kernel count as much as a 10% miss on a 100 ms one.
//!
//! **Coordinates and bounds.** Each parameter `x` is moved in offset-log coordinates
//! `u = ln(x + c)`: `c = 0` for the strictly positive parameters (throughputs, cycles per
//! register, operations per register), and a typical scale `c` for the one that may be zero (100
//! cycles of grid-step overhead), so that a zero value can still move. `x` is kept within the ranges [`tpusim_chip::ChipModel::validate`] allows.
//!
//! **Optimiser.** Levenberg-Marquardt on the residuals `ln(predicted/measured)` with a
//! forward-difference Jacobian (step 0.01 in `u`), Marquardt's diagonal scaling, steps limited to
//! a factor e per iteration and projected onto the bounds. The main fit starts it from the best
//! few points of a coarse grid around the starting values ([`STARTS`]); refits for
//! cross-validation start from the main fit. Small and dependency-free; every
//! evaluation simulates every row (a few ms each), on all cores.
//!
//! **Identifiability.** Before fitting, the elasticity of every row's time to every parameter
//! (`d ln t / d u`, by central differences of +-0.05 in `u`) is measured at the starting point.
//! The candidates are the parameters asked for, else the set the starting model declares fitted
//! (every shipped preset declares its own; [`candidates`]), else all five. Among them parameters
//! are taken greedily, the one the rows pin down best first: at each round, the
//! candidate whose elasticity column has the largest part that the parameters already taken cannot
//! mimic; it is fitted only when that part has a norm of at least [`MIN_RESIDUAL_NORM`] (a 10%
//! change moves the rows' log times, beyond what the others can make up, by at least 0.5%
//! root-sum-square) and is at least [`CONFOUND_FRACTION`] of its whole column. At most
//! [`MAX_FITTED`] parameters are fitted per chip.
//! Otherwise it is *not identifiable from these rows* and keeps its value and provenance: either
//! no row responds to it (e.g. the exp rate when no row is bound by the EUP), or it is confounded
//! with those taken (its effect on the rows is one they already have).
//!
//! **Confidence intervals.** At the optimum, the covariance of the fitted coordinates is
//! `s^2 (J^T J)^-1` with `J` the Jacobian of the residuals and `s^2 = S / (n - p)` (n rows, p fitted
//! parameters); each interval is `u +- t(0.975; n - p) sqrt(cov_jj)` (Student's t from statrs),
//! mapped back to the parameter, so it is asymmetric around the value. It assumes the residuals
//! are independent noise of one scale and the model is locally linear; a model error that is
//! the same for similar rows makes the interval too narrow, so read it with the held-out errors.
//!
//! **Cross-validation.** Each row is predicted by a model refitted without it: leave-one-out up
//! to [`LOO_MAX_ROWS`] rows, [`KFOLDS`]-fold above (row i in fold i mod k). A second scheme holds
//! out whole head_dim groups (every row with one head_dim, the rows without one as a group of
//! their own), which asks whether the fit carries to a shape it never saw. Each refit repeats the
//! identifiability test on its own rows, starts from the full fit, and puts parameters it cannot
//! identify back to the starting model's values. A held-out error well above the training error
//! means the fitted parameters follow noise in the rows rather than the hardware.

use crate::measure::{Measurement, MeasurementFile};
use crate::stats::{mean, median};
use serde::Serialize;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use tpusim_chip::{ChipModel, Param};
use tpusim_job::JobSpec;

/// The chip model's fitted parameters (candidates: at most [`MAX_FITTED`] are fitted per stage,
/// chosen by identifiability; module docs): the unit rates, then the step and DMA mechanisms
/// ([`MECHANISM_PARAMS`]).
pub const FITTED_PARAMS: &[&str] = &[
    "valu_vreg_ops_per_cycle",
    "eup_vregs_per_cycle",
    "xlu_cycles_per_vreg",
    "loaded_mask_ops_per_vreg",
    "grid_step_overhead_cycles",
    "dma_latency_ns",
    "dma_issue_ns",
    "dmas_in_flight",
];

/// The step and DMA mechanisms: fitted in the first stage, from mechanism rows alone (rows whose
/// `kernel` starts [`MECHANISM_KERNEL_PREFIX`]: microbenchmarks that isolate them), when a chip
/// has such rows; otherwise from its library rows like the rest (module docs, "Stages").
pub const MECHANISM_PARAMS: &[&str] = &["grid_step_overhead_cycles", "dma_latency_ns", "dma_issue_ns", "dmas_in_flight"];

/// The `kernel` word prefix of a mechanism row: a microbenchmark kernel read from its IR
/// (`python -m tpusim.microbench`), which calibration fits the mechanisms to. Every other kernel
/// read from its IR is a judge: validated, never fitted.
pub const MECHANISM_KERNEL_PREFIX: &str = "microbench-";

/// The `kernel` word a dry run of the microbenchmark kit gives its rows (`dry-run-` before the
/// mechanism word): times taken in interpret mode on the CPU, which no fit takes.
pub const DRY_RUN_KERNEL_PREFIX: &str = "dry-run-";

/// Leave-one-out up to this many rows; k-fold above.
pub const LOO_MAX_ROWS: usize = 30;
/// Folds of k-fold cross-validation for more than [`LOO_MAX_ROWS`] rows.
pub const KFOLDS: usize = 10;

/// Most parameters fitted per chip and stage (the rest keep their values and provenance): at most
/// three mechanisms from the mechanism rows, then at most three more from the library rows.
pub const MAX_FITTED: usize = 3;

/// Smallest norm of a parameter's elasticity column, beyond what earlier parameters explain, for
/// it to be fitted (module docs, "Identifiability").
pub const MIN_RESIDUAL_NORM: f64 = 0.05;
/// Smallest share of a parameter's elasticity column not explained by earlier parameters.
pub const CONFOUND_FRACTION: f64 = 0.05;

/// Range and offset of one fitted parameter.
#[derive(Debug, Clone, Copy)]
struct Spec {
    name: &'static str,
    lo: f64,
    hi: f64,
    offset: f64,
}

fn spec(name: &str) -> Option<Spec> {
    // Ranges as ChipModel::validate allows them.
    let (lo, hi, offset) = match name {
        "valu_vreg_ops_per_cycle" => (1e-3, 64.0, 0.0),
        "eup_vregs_per_cycle" => (1e-3, 64.0, 0.0),
        "xlu_cycles_per_vreg" => (1e-3, 1e4, 0.0),
        "loaded_mask_ops_per_vreg" => (1e-3, 1e3, 0.0),
        "grid_step_overhead_cycles" => (0.0, 1e7, 100.0),
        "dma_latency_ns" => (0.0, 1e6, 100.0),
        "dma_issue_ns" => (0.0, 1e6, 5.0),
        "dmas_in_flight" => (1.0, 1e6, 0.0),
        _ => return None,
    };
    let name = FITTED_PARAMS.iter().find(|n| **n == name)?;
    Some(Spec { name, lo, hi, offset })
}

impl Spec {
    fn to_u(self, x: f64) -> f64 {
        (x + self.offset).max(1e-300).ln()
    }
    fn to_x(self, u: f64) -> f64 {
        (u.exp() - self.offset).clamp(self.lo, self.hi)
    }
    fn u_lo(self) -> f64 {
        self.to_u(self.lo)
    }
    fn u_hi(self) -> f64 {
        self.to_u(self.hi)
    }
}

/// The fitted parameter `name` of a chip, mutably.
///
/// # Panics
/// For a name not in [`FITTED_PARAMS`] (a programming error).
fn param_mut<'a>(chip: &'a mut ChipModel, name: &str) -> &'a mut Param<f64> {
    let f = &mut chip.fitted;
    match name {
        "valu_vreg_ops_per_cycle" => &mut f.valu_vreg_ops_per_cycle,
        "eup_vregs_per_cycle" => &mut f.eup_vregs_per_cycle,
        "xlu_cycles_per_vreg" => &mut f.xlu_cycles_per_vreg,
        "loaded_mask_ops_per_vreg" => &mut f.loaded_mask_ops_per_vreg,
        "grid_step_overhead_cycles" => &mut f.grid_step_overhead_cycles,
        "dma_latency_ns" => &mut f.dma_latency_ns,
        "dma_issue_ns" => &mut f.dma_issue_ns,
        "dmas_in_flight" => &mut f.dmas_in_flight,
        other => panic!("not a fitted parameter: {other}"),
    }
}

/// The parameters a calibration of `base` fits (each only if the rows identify it, module docs):
/// `params` when given; else the ones `base` declares fitted (a non-empty `fitted_to`: every
/// shipped preset declares its set, and a model written by `tpusim calibrate` declares what was
/// fitted), so that re-fitting a model to the rows it names reproduces it; else, for a model that
/// declares none, every one of [`FITTED_PARAMS`] (identifiability chooses at most
/// [`MAX_FITTED`]).
pub fn candidates(base: &ChipModel, params: &[String]) -> Vec<&'static str> {
    if !params.is_empty() {
        return FITTED_PARAMS.iter().copied().filter(|n| params.iter().any(|p| p == n)).collect();
    }
    let declared: Vec<&'static str> = FITTED_PARAMS
        .iter()
        .copied()
        .filter(|n| fitted_param(base, n).and_then(|p| p.fitted_to.as_ref()).is_some_and(|rows| !rows.is_empty()))
        .collect();
    if declared.is_empty() {
        FITTED_PARAMS.to_vec()
    } else {
        declared
    }
}

/// Fitted parameter `name` of a chip (one of [`FITTED_PARAMS`]); `None` for other names.
pub fn fitted_param<'a>(chip: &'a ChipModel, name: &str) -> Option<&'a Param<f64>> {
    let f = &chip.fitted;
    Some(match name {
        "valu_vreg_ops_per_cycle" => &f.valu_vreg_ops_per_cycle,
        "eup_vregs_per_cycle" => &f.eup_vregs_per_cycle,
        "xlu_cycles_per_vreg" => &f.xlu_cycles_per_vreg,
        "loaded_mask_ops_per_vreg" => &f.loaded_mask_ops_per_vreg,
        "grid_step_overhead_cycles" => &f.grid_step_overhead_cycles,
        "dma_latency_ns" => &f.dma_latency_ns,
        "dma_issue_ns" => &f.dma_issue_ns,
        "dmas_in_flight" => &f.dmas_in_flight,
        _ => return None,
    })
}

/// The value of fitted parameter `name` (one of [`FITTED_PARAMS`]); `None` for other names.
pub fn fitted_value(chip: &ChipModel, name: &str) -> Option<f64> {
    fitted_param(chip, name).map(|p| p.value)
}

/// A copy of `chip` with fitted parameter `name` set to `value` (through
/// [`ChipModel::with_override`], so it is validated like a file).
///
/// # Errors
/// The chip model's error for an unknown name or an out-of-range value.
pub fn with_fitted(chip: &ChipModel, name: &str, value: f64) -> Result<ChipModel, String> {
    chip.with_override(&format!("fitted.{name}"), &format!("{value}")).map_err(|e| e.to_string())
}

/// One row prepared for repeated simulation.
#[derive(Debug, Clone)]
struct Row {
    id: String,
    measured_ms: f64,
    job: RowJob,
    /// A mechanism row (a microbenchmark: [`MECHANISM_KERNEL_PREFIX`]), fitted in the first stage.
    mechanism: bool,
}

/// A candidate parameter's outcome: its name, status, elasticity, 95% interval and the rows of
/// its stage.
type Outcome<'a> = (&'a str, Status, f64, Option<(f64, f64)>, Vec<String>);

/// What a row runs: a hand-modelled job (built for each chip, as its defaults may read it) or a
/// kernel read from its IR (a mechanism row's microbenchmark).
#[derive(Debug, Clone)]
enum RowJob {
    Spec(Box<JobSpec>),
    Described(Box<tpusim_job::Job>),
}

impl RowJob {
    fn head_dim(&self) -> Option<u64> {
        match self {
            RowJob::Spec(s) => s.head_dim,
            RowJob::Described(_) => None,
        }
    }
}

fn simulate_ms(chip: &ChipModel, job: &RowJob) -> Result<f64, String> {
    let built;
    let job = match job {
        RowJob::Spec(spec) => {
            built = spec.build(chip).map_err(|e| e.to_string())?;
            &built
        }
        RowJob::Described(j) => &**j,
    };
    let lowered = job.lower(chip).map_err(|e| e.to_string())?;
    Ok(tpusim_job::simulate_call(chip, &lowered).iter().map(|p| p.result.seconds).sum::<f64>() * 1e3)
}

/// Predicted times (ms) of rows on a chip, simulated on all cores. A failed row gives NaN.
fn predict_all(chip: &ChipModel, rows: &[&Row]) -> Vec<f64> {
    let n = rows.len();
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(n.max(1));
    let next = AtomicUsize::new(0);
    let mut out = vec![f64::NAN; n];
    let results: Vec<Vec<(usize, f64)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            break;
                        }
                        mine.push((i, simulate_ms(chip, &rows[i].job).unwrap_or(f64::NAN)));
                    }
                    mine
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_default()).collect()
    });
    for (i, v) in results.into_iter().flatten() {
        out[i] = v;
    }
    out
}

/// The state of a fit: a base chip and values in `u` for the active parameters.
struct Problem<'a> {
    base: &'a ChipModel,
    rows: Vec<&'a Row>,
    active: Vec<Spec>,
    evaluations: usize,
}

impl Problem<'_> {
    fn chip_at(&self, u: &[f64]) -> ChipModel {
        let mut c = self.base.clone();
        for (s, &ui) in self.active.iter().zip(u) {
            param_mut(&mut c, s.name).value = s.to_x(ui);
        }
        c
    }

    fn residuals(&mut self, u: &[f64]) -> Vec<f64> {
        self.evaluations += 1;
        let chip = self.chip_at(u);
        predict_all(&chip, &self.rows)
            .iter()
            .zip(&self.rows)
            .map(|(p, r)| if p.is_finite() && *p > 0.0 { (p / r.measured_ms).ln() } else { 1e3 })
            .collect()
    }

    fn jacobian(&mut self, u: &[f64], r0: &[f64], h: f64) -> Vec<Vec<f64>> {
        // column j = d r / d u_j, forward differences (backward at the upper bound)
        (0..u.len())
            .map(|j| {
                let s = self.active[j];
                let step = if u[j] + h <= s.u_hi() { h } else { -h };
                let mut v = u.to_vec();
                v[j] += step;
                let r = self.residuals(&v);
                r.iter().zip(r0).map(|(a, b)| (a - b) / step).collect()
            })
            .collect()
    }

    fn clamp(&self, u: &mut [f64]) {
        for (s, ui) in self.active.iter().zip(u.iter_mut()) {
            *ui = ui.clamp(s.u_lo(), s.u_hi());
        }
    }
}

fn sum_sq(r: &[f64]) -> f64 {
    r.iter().map(|x| x * x).sum()
}

/// Solves `a x = b` (small, dense) by Gaussian elimination with partial pivoting.
fn solve(mut a: Vec<Vec<f64>>, mut b: Vec<f64>) -> Option<Vec<f64>> {
    let n = b.len();
    for col in 0..n {
        let piv = (col..n).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[piv][col].abs() < 1e-300 {
            return None;
        }
        a.swap(col, piv);
        b.swap(col, piv);
        let (top, below) = a.split_at_mut(col + 1);
        let pivot_row = &top[col];
        for (r, row) in below.iter_mut().enumerate() {
            let f = row[col] / pivot_row[col];
            for (x, p) in row[col..].iter_mut().zip(&pivot_row[col..]) {
                *x -= f * p;
            }
            b[col + 1 + r] -= f * b[col];
        }
    }
    let mut x = vec![0.0; n];
    for i in (0..n).rev() {
        let s: f64 = (i + 1..n).map(|k| a[i][k] * x[k]).sum();
        x[i] = (b[i] - s) / a[i][i];
    }
    Some(x)
}

/// Levenberg-Marquardt from `u0`; returns the best `u` found.
fn levenberg_marquardt(p: &mut Problem, u0: &[f64]) -> Vec<f64> {
    let mut u = u0.to_vec();
    p.clamp(&mut u);
    if u.is_empty() {
        return u;
    }
    let mut r = p.residuals(&u);
    let mut s = sum_sq(&r);
    let mut lambda = 1e-3;
    for _ in 0..60 {
        if s < 1e-20 {
            break;
        }
        let j = p.jacobian(&u, &r, 0.01);
        let m = u.len();
        let mut a = vec![vec![0.0; m]; m];
        let mut g = vec![0.0; m];
        for i in 0..m {
            for k in 0..m {
                a[i][k] = j[i].iter().zip(&j[k]).map(|(x, y)| x * y).sum();
            }
            g[i] = j[i].iter().zip(&r).map(|(x, y)| x * y).sum();
        }
        let mut improved = false;
        for _ in 0..12 {
            let mut damped = a.clone();
            for i in 0..m {
                damped[i][i] += lambda * a[i][i].max(1e-9);
            }
            let Some(delta) = solve(damped, g.iter().map(|x| -x).collect()) else {
                lambda *= 10.0;
                continue;
            };
            let mut v: Vec<f64> = u.iter().zip(&delta).map(|(a, d)| a + d.clamp(-1.0, 1.0)).collect();
            p.clamp(&mut v);
            let rv = p.residuals(&v);
            let sv = sum_sq(&rv);
            if sv < s {
                let step: f64 = u.iter().zip(&v).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
                let gain = s - sv;
                u = v;
                r = rv;
                s = sv;
                lambda = (lambda / 3.0).max(1e-12);
                improved = gain > 1e-6 * s + 1e-24 && step > 1e-9;
                break;
            }
            lambda *= 4.0;
        }
        if !improved {
            break;
        }
    }
    u
}

/// The main fit's search: the simulated times are piecewise linear in the parameters (maxima of
/// sums), so a local search can stop at a kink. Every combination of each parameter at half, one
/// and two times its starting value (3^p points) is evaluated, Levenberg-Marquardt runs from the
/// [`STARTS`] best, and the best end point is kept.
fn multi_start(p: &mut Problem, u0: &[f64]) -> Vec<f64> {
    let m = u0.len();
    if m == 0 {
        return Vec::new();
    }
    let mut points: Vec<(f64, Vec<f64>)> = Vec::new();
    for code in 0..3usize.pow(m as u32) {
        let mut u: Vec<f64> = u0.to_vec();
        let mut c = code;
        for (j, uj) in u.iter_mut().enumerate() {
            let step = [0.0, -std::f64::consts::LN_2, std::f64::consts::LN_2][c % 3];
            c /= 3;
            *uj += step;
            *uj = uj.clamp(p.active[j].u_lo(), p.active[j].u_hi());
        }
        let s = sum_sq(&p.residuals(&u));
        points.push((s, u));
    }
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut best: Option<(f64, Vec<f64>)> = None;
    for (_, start) in points.into_iter().take(STARTS) {
        let u = levenberg_marquardt(p, &start);
        let s = sum_sq(&p.residuals(&u));
        if best.as_ref().is_none_or(|(b, _)| s < *b) {
            best = Some((s, u));
        }
    }
    best.map(|(_, u)| u).unwrap_or_else(|| u0.to_vec())
}

/// Local searches of the main fit (module docs, "Optimiser").
pub const STARTS: usize = 3;

/// How a parameter came out of a fit.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Fitted to the rows.
    Fitted,
    /// Left unchanged: the rows do not respond to it, or only through parameters taken before it.
    NotIdentifiable(String),
    /// Left unchanged: not among the parameters asked for.
    NotSelected,
}

/// One fitted parameter's outcome.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ParamFit {
    /// Field name in `[fitted]`.
    pub name: String,
    /// Value before.
    pub before: f64,
    /// Value after.
    pub after: f64,
    /// Largest |d ln t / d ln(x + c)| over the rows at the starting point.
    pub elasticity: f64,
    /// 95% confidence interval of a fitted value, in its unit (module docs).
    pub interval: Option<(f64, f64)>,
    /// Fitted or why not.
    pub status: Status,
    /// The value ended at a bound of its allowed range.
    pub at_bound: bool,
}

/// One row's predictions before and after the fit, and held out.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FitRow {
    /// Row id.
    pub id: String,
    /// Measured, ms.
    pub measured_ms: f64,
    /// Predicted by the starting model, ms.
    pub before_ms: f64,
    /// Predicted by the fitted model, ms.
    pub after_ms: f64,
    /// Predicted by the model fitted without this row (cross-validation), ms.
    pub held_out_ms: Option<f64>,
    /// Predicted by the model fitted without this row's head_dim group, ms.
    pub held_out_group_ms: Option<f64>,
}

/// |error| figures over a set of predictions.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ErrorStats {
    /// Median |error| (fraction).
    pub median_abs_error: f64,
    /// Mean |error| (fraction).
    pub mean_abs_error: f64,
    /// Largest |error| (fraction).
    pub worst_abs_error: f64,
    /// RMS of ln(predicted / measured): the square root of the objective over the row count.
    pub rms_log_error: f64,
}

impl ErrorStats {
    /// The figures of predictions `pred` against `meas` (same length); `None` when empty.
    pub fn of(pred: &[f64], meas: &[f64]) -> Option<ErrorStats> {
        let abs: Vec<f64> = pred.iter().zip(meas).map(|(p, m)| ((p - m) / m).abs()).collect();
        let logs: Vec<f64> = pred.iter().zip(meas).map(|(p, m)| (p / m).ln().powi(2)).collect();
        Some(ErrorStats {
            median_abs_error: median(&abs)?,
            mean_abs_error: mean(&abs)?,
            worst_abs_error: abs.iter().copied().fold(0.0, f64::max),
            rms_log_error: mean(&logs)?.sqrt(),
        })
    }
}

/// A row of the file not used in the fit, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Unused {
    /// Row id.
    pub id: String,
    /// Why.
    pub reason: String,
}

/// Options of a calibration.
#[derive(Debug, Clone)]
pub struct CalibrateOptions {
    /// Fitted parameters to fit (names from [`FITTED_PARAMS`]); empty = the set the starting
    /// model declares ([`candidates`]).
    pub params: Vec<String>,
    /// Run cross-validation (leave-one-out or k-fold).
    pub cross_validate: bool,
    /// Date recorded in the notes (YYYY-MM-DD); `None` = today (UTC).
    pub date: Option<String>,
}

impl Default for CalibrateOptions {
    fn default() -> Self {
        CalibrateOptions { params: Vec::new(), cross_validate: true, date: None }
    }
}

/// The outcome of a calibration.
#[derive(Debug, Clone, Serialize)]
pub struct Calibration {
    /// The measurement file.
    pub file: String,
    /// Chip model name.
    pub chip: String,
    /// The model the fit started from (source, `--set` overrides, parameter hash).
    pub start_model: tpusim_chip::ChipIdentity,
    /// The fitted model: the starting model with the fitted `[fitted]` values (its hash is the
    /// one a run with the written file reports).
    pub fitted_model: tpusim_chip::ChipIdentity,
    /// Objective, in words.
    pub objective: String,
    /// Ids of the rows fitted to.
    pub fitted_to: Vec<String>,
    /// Rows of the file not used.
    pub unused: Vec<Unused>,
    /// Every fitted parameter, before and after.
    pub params: Vec<ParamFit>,
    /// Per-row predictions.
    pub rows: Vec<FitRow>,
    /// Training error of the starting model.
    pub before: Option<ErrorStats>,
    /// Training error of the fitted model.
    pub after: Option<ErrorStats>,
    /// Held-out error (leave-one-out or k-fold), when run.
    pub held_out: Option<ErrorStats>,
    /// Held-out error with whole head_dim groups held out, when run (two groups or more).
    pub held_out_group: Option<ErrorStats>,
    /// `leave-one-out`, `10-fold` or `none`.
    pub cross_validation: String,
    /// Simulations of the whole row set run by the main fit.
    pub evaluations: usize,
    /// The fitted chip model.
    #[serde(skip)]
    pub model: ChipModel,
    /// Whether the parameters to fit were named (`--params`), for the table's words.
    #[serde(skip)]
    pub params_given: bool,
    /// Whether cross-validation was asked for (not `--no-cv`), for the table's words.
    #[serde(skip)]
    pub cv_asked: bool,
}

/// Today's date (UTC) as YYYY-MM-DD.
pub fn today() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    // days since 1970-01-01 to a civil date (H. Hinnant's algorithm)
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

fn round_sig(x: f64, digits: i32) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let scale = sig_scale(x, digits);
    (x * scale).round() / scale
}

/// The power of ten that puts `digits` significant digits of `x` before the decimal point.
fn sig_scale(x: f64, digits: i32) -> f64 {
    10f64.powi(digits - 1 - x.abs().log10().floor() as i32)
}

/// `x` to `digits` significant digits, rounded outward (`down`: towards -inf, else towards +inf),
/// so that a rounded interval still holds every value the exact one holds.
fn round_sig_outward(x: f64, digits: i32, down: bool) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let scale = sig_scale(x, digits);
    // A hair of slack, so that a value already at `digits` digits is not moved a step.
    let y = x * scale;
    (if down { (y + 1e-9).floor() } else { (y - 1e-9).ceil() }) / scale
}

/// Elasticities at `u`: column j = d r / d u_j by central differences of +-0.05 (one-sided at a
/// bound).
fn elasticities(p: &mut Problem, u: &[f64]) -> Vec<Vec<f64>> {
    let h = 0.05;
    (0..u.len())
        .map(|j| {
            let s = p.active[j];
            let (lo, hi) = ((u[j] - h).max(s.u_lo()), (u[j] + h).min(s.u_hi()));
            if hi - lo < 1e-12 {
                return vec![0.0; p.rows.len()];
            }
            let mut a = u.to_vec();
            a[j] = lo;
            let ra = p.residuals(&a);
            let mut b = u.to_vec();
            b[j] = hi;
            let rb = p.residuals(&b);
            ra.iter().zip(&rb).map(|(x, y)| (y - x) / (hi - lo)).collect()
        })
        .collect()
}

/// Chooses the identifiable parameters among the candidates, whose elasticity columns are
/// `cols`: returns the indices taken and, per candidate, its status and largest |elasticity|.
///
/// Greedy: each round takes the candidate whose column has the largest part not explained by the
/// columns already taken, if that part has a norm of at least [`MIN_RESIDUAL_NORM`] (a 10% change
/// of x + c moves the rows' log times, beyond what the others can make up, by at least 0.5%
/// root-sum-square) and at least [`CONFOUND_FRACTION`] of the column's own norm; at most
/// [`MAX_FITTED`] are taken.
fn identify(cols: &[Vec<f64>], names: &[&str]) -> (Vec<usize>, Vec<(Status, f64)>) {
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    let project = |col: &[f64], basis: &[Vec<f64>]| {
        let mut rest = col.to_vec();
        for b in basis {
            let d: f64 = rest.iter().zip(b).map(|(x, y)| x * y).sum();
            for (x, y) in rest.iter_mut().zip(b) {
                *x -= d * y;
            }
        }
        rest
    };
    let max: Vec<f64> = cols.iter().map(|c| c.iter().map(|x| x.abs()).fold(0.0, f64::max)).collect();
    let mut basis: Vec<Vec<f64>> = Vec::new();
    let mut taken: Vec<usize> = Vec::new();
    while taken.len() < MAX_FITTED {
        let best = (0..cols.len())
            .filter(|j| !taken.contains(j))
            .map(|j| {
                let rest = project(&cols[j], &basis);
                (j, norm(&rest), rest)
            })
            .filter(|(j, nr, _)| *nr >= MIN_RESIDUAL_NORM && *nr >= CONFOUND_FRACTION * norm(&cols[*j]))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        let Some((j, nr, rest)) = best else { break };
        basis.push(rest.iter().map(|x| x / nr).collect());
        taken.push(j);
    }
    let out = (0..cols.len())
        .map(|j| {
            if taken.contains(&j) {
                return (Status::Fitted, max[j]);
            }
            let nc = norm(&cols[j]);
            let why = if nc < MIN_RESIDUAL_NORM {
                format!(
                    "not identifiable from these rows: a 10% change moves their times by {:.2}% (root-sum-square; at most {:.2}% on one row)",
                    nc * 10.0,
                    max[j] * 10.0
                )
            } else if taken.len() == MAX_FITTED && norm(&project(&cols[j], &basis)) >= MIN_RESIDUAL_NORM {
                format!("not fitted: at most {MAX_FITTED} parameters are fitted per chip and the rows pin down {} better", taken.iter().map(|&i| names[i]).collect::<Vec<_>>().join(", "))
            } else {
                format!(
                    "not identifiable from these rows: its effect on them is almost all one that {} already have (confounded)",
                    taken.iter().map(|&i| names[i]).collect::<Vec<_>>().join(", ")
                )
            };
            (Status::NotIdentifiable(why), max[j])
        })
        .collect();
    (taken, out)
}

/// 95% confidence intervals of the active parameters at `u` (module docs): per parameter
/// `(low, high)` in its own unit; `None` without degrees of freedom or with a singular `J^T J`.
fn confidence_intervals(p: &mut Problem, u: &[f64]) -> Vec<Option<(f64, f64)>> {
    let (n, m) = (p.rows.len(), u.len());
    if m == 0 || n <= m {
        return vec![None; m];
    }
    let r = p.residuals(u);
    let j = p.jacobian(u, &r, 0.01);
    let s2 = sum_sq(&r) / (n - m) as f64;
    let a: Vec<Vec<f64>> = (0..m).map(|i| (0..m).map(|k| j[i].iter().zip(&j[k]).map(|(x, y)| x * y).sum()).collect()).collect();
    let Ok(t) = statrs::distribution::StudentsT::new(0.0, 1.0, (n - m) as f64) else {
        return vec![None; m];
    };
    let t = statrs::distribution::ContinuousCDF::inverse_cdf(&t, 0.975);
    (0..m)
        .map(|i| {
            // Column i of the inverse of J^T J.
            let e: Vec<f64> = (0..m).map(|k| if k == i { 1.0 } else { 0.0 }).collect();
            let col = solve(a.clone(), e)?;
            let var = s2 * col[i];
            if !(var.is_finite() && var >= 0.0) {
                return None;
            }
            let s = p.active[i];
            let half = t * var.sqrt();
            let lo = s.to_x((u[i] - half).max(s.u_lo() - 50.0)).max(s.lo);
            let hi = s.to_x((u[i] + half).min(s.u_hi() + 50.0)).min(s.hi);
            Some((lo, hi))
        })
        .collect()
}

/// A fit's outcome: the fitted chip, per candidate its status and largest elasticity, per
/// candidate its 95% interval (fitted ones), and the evaluations used.
type RowFit = (ChipModel, Vec<(Status, f64)>, Vec<Option<(f64, f64)>>, usize);

/// Fits the chosen parameters of `start` to `rows`: returns the fitted chip, per-parameter status
/// and elasticity, and the number of evaluations. Parameters found not identifiable take their
/// value from `fallback`.
fn fit_rows(start: &ChipModel, fallback: &ChipModel, rows: &[&Row], names: &[&str], want_ci: bool) -> RowFit {
    let all: Vec<Spec> = names.iter().filter_map(|n| spec(n)).collect();
    let mut p = Problem { base: start, rows: rows.to_vec(), active: all.clone(), evaluations: 0 };
    let u0: Vec<f64> = all.iter().map(|s| s.to_u(fitted_value(start, s.name).unwrap_or(0.0))).collect();
    let cols = elasticities(&mut p, &u0);
    let (taken, status) = identify(&cols, names);
    let mut base = start.clone();
    for (i, s) in all.iter().enumerate() {
        if !taken.contains(&i) {
            param_mut(&mut base, s.name).value = fitted_value(fallback, s.name).unwrap_or(0.0);
        }
    }
    let mut p = Problem { base: &base, rows: rows.to_vec(), active: taken.iter().map(|&i| all[i]).collect(), evaluations: p.evaluations };
    let u_start: Vec<f64> = taken.iter().map(|&i| u0[i]).collect();
    let u = if want_ci { multi_start(&mut p, &u_start) } else { levenberg_marquardt(&mut p, &u_start) };
    let ci_active = if want_ci { confidence_intervals(&mut p, &u) } else { vec![None; u.len()] };
    let mut chip = p.chip_at(&u);
    for s in &p.active {
        let v = param_mut(&mut chip, s.name);
        v.value = round_sig(v.value, 5).clamp(s.lo, s.hi);
    }
    let mut ci = vec![None; all.len()];
    for (k, &i) in taken.iter().enumerate() {
        // Rounded outward: the printed interval holds the (5-digit) fitted value.
        ci[i] = ci_active[k].map(|(a, b)| (round_sig_outward(a, 3, true), round_sig_outward(b, 3, false)));
    }
    (chip, status, ci, p.evaluations)
}

/// Calibrates `base` to the rows of `file` whose chip is `base` (the `chip` column equals the
/// model's `name` or `chip_arg`, the `--chip` argument as given).
///
/// # Errors
/// A message when no row can be used, or a parameter name is unknown.
pub fn calibrate(
    file: &MeasurementFile,
    base: &ChipModel,
    chip_arg: &str,
    opts: &CalibrateOptions,
) -> Result<Calibration, crate::CalibError> {
    for n in &opts.params {
        if spec(n).is_none() {
            return Err(crate::CalibError::Input(format!(
                "--params {n}: not a fitted parameter; the fitted parameters are {}",
                FITTED_PARAMS.join(", ")
            )));
        }
    }
    let names = candidates(base, &opts.params);
    let mut rows = Vec::new();
    let mut unused = Vec::new();
    for m in &file.rows {
        if m.chip != base.name && m.chip != chip_arg {
            unused.push(Unused { id: m.id.clone(), reason: format!("chip {} (calibrating {})", m.chip, base.name) });
            continue;
        }
        match prepare(m, base) {
            Ok(r) => rows.push(r),
            Err(reason) => unused.push(Unused { id: m.id.clone(), reason }),
        }
    }
    if rows.is_empty() {
        // Why each row was left out, the commonest reasons first (a dry run's rows, say, are
        // expressible but never fitted).
        let mut why: Vec<(usize, &str)> = Vec::new();
        for u in &unused {
            match why.iter_mut().find(|(_, r)| *r == u.reason) {
                Some(w) => w.0 += 1,
                None => why.push((1, &u.reason)),
            }
        }
        why.sort_by_key(|w| std::cmp::Reverse(w.0));
        let reasons: Vec<String> = why.iter().take(3).map(|(n, r)| format!("{n} row{}: {r}", if *n == 1 { "" } else { "s" })).collect();
        return Err(crate::CalibError::Input(format!(
            "{}: no row of chip {} that the fit takes; nothing to fit{}",
            file.path,
            base.name,
            if reasons.is_empty() { String::new() } else { format!(" ({}{})", reasons.join("; "), if why.len() > 3 { "; ..." } else { "" }) }
        )));
    }
    // Stages (module docs): the mechanisms from the mechanism rows, when there are any; then the
    // rest from the library rows, the mechanisms held.
    let mechanism_rows: Vec<usize> = (0..rows.len()).filter(|&i| rows[i].mechanism).collect();
    let library_rows: Vec<usize> = (0..rows.len()).filter(|&i| !rows[i].mechanism).collect();
    let stage1: Vec<&str> = if mechanism_rows.is_empty() { Vec::new() } else { names.iter().copied().filter(|n| MECHANISM_PARAMS.contains(n)).collect() };
    let stage2: Vec<&str> = names.iter().copied().filter(|n| !stage1.contains(n)).collect();
    let stages = [(stage1, mechanism_rows), (stage2, library_rows)];
    let refs: Vec<&Row> = rows.iter().collect();
    let meas: Vec<f64> = rows.iter().map(|r| r.measured_ms).collect();
    let before_pred = predict_all(base, &refs);
    let mut fitted = base.clone();
    let mut evaluations = 0;
    // Per candidate: (status, elasticity, interval, the rows of its stage).
    let mut outcome: Vec<Outcome> = Vec::new();
    for (stage_names, idx) in &stages {
        if stage_names.is_empty() || idx.is_empty() {
            continue;
        }
        let stage_rows: Vec<&Row> = idx.iter().map(|&i| &rows[i]).collect();
        let (chip, status, ci, ev) = fit_rows(&fitted, &fitted, &stage_rows, stage_names, true);
        fitted = chip;
        evaluations += ev;
        let ids: Vec<String> = stage_rows.iter().map(|r| r.id.clone()).collect();
        for (k, n) in stage_names.iter().enumerate() {
            outcome.push((n, status[k].0.clone(), status[k].1, ci[k], ids.clone()));
        }
    }
    let after_pred = predict_all(&fitted, &refs);

    // Cross-validation per stage (module docs): each held-out row refits its own stage's
    // parameters without it, the other stage held at the fit.
    let mut held = vec![None; rows.len()];
    let mut held_group = vec![None; rows.len()];
    let mut cv_name = "none".to_string();
    for (stage_names, idx) in &stages {
        let n = idx.len();
        if stage_names.is_empty() || !opts.cross_validate || n < 2 {
            continue;
        }
        let stage_rows: Vec<Row> = idx.iter().map(|&i| rows[i].clone()).collect();
        let loo_folds: Vec<Vec<usize>> = if n <= LOO_MAX_ROWS {
            (0..n).map(|i| vec![i]).collect()
        } else {
            (0..KFOLDS).map(|f| (0..n).filter(|i| i % KFOLDS == f).collect()).collect()
        };
        cv_name = if n <= LOO_MAX_ROWS && cv_name != format!("{KFOLDS}-fold") { "leave-one-out".to_string() } else { format!("{KFOLDS}-fold") };
        let mut groups: Vec<(Option<u64>, Vec<usize>)> = Vec::new();
        for (i, r) in stage_rows.iter().enumerate() {
            match groups.iter_mut().find(|(d, _)| *d == r.job.head_dim()) {
                Some((_, g)) => g.push(i),
                None => groups.push((r.job.head_dim(), vec![i])),
            }
        }
        let group_folds: Vec<Vec<usize>> = if groups.len() >= 2 { groups.into_iter().map(|(_, g)| g).collect() } else { Vec::new() };
        for (k, h) in held_out(&fitted, base, &stage_rows, stage_names, &loo_folds).into_iter().enumerate() {
            held[idx[k]] = h;
        }
        for (k, h) in held_out(&fitted, base, &stage_rows, stage_names, &group_folds).into_iter().enumerate() {
            held_group[idx[k]] = h;
        }
    }
    let stats_of = |h: &[Option<f64>]| {
        let pairs: Vec<(f64, f64)> = h.iter().zip(&meas).filter_map(|(p, m)| p.map(|p| (p, *m))).collect();
        if pairs.is_empty() {
            return None;
        }
        let (p, m): (Vec<f64>, Vec<f64>) = pairs.into_iter().unzip();
        ErrorStats::of(&p, &m)
    };
    let held_out_stats = stats_of(&held);
    let held_out_group = stats_of(&held_group);

    // provenance of the fitted values
    let date = opts.date.clone().unwrap_or_else(today);
    let ids: Vec<String> = rows.iter().map(|r| r.id.clone()).collect();
    let fitted_names: Vec<&str> = outcome.iter().filter(|o| o.1 == Status::Fitted).map(|o| o.0).collect();
    let objective = "least squares on ln(predicted/measured), rows weighted equally (Levenberg-Marquardt in log parameters)".to_string();
    let mut params = Vec::new();
    for name in FITTED_PARAMS {
        let before = fitted_value(base, name).unwrap_or(0.0);
        let after = fitted_value(&fitted, name).unwrap_or(0.0);
        let found = outcome.iter().find(|o| o.0 == *name);
        let (st, el, interval) = match found {
            Some(o) => (o.1.clone(), o.2, o.3),
            None => (Status::NotSelected, 0.0, None),
        };
        let s = spec(name).expect("known name");
        // At a bound, or within a millionth of one in the fit's log space (a value driven to
        // 4e-14 cycles is at the bound 0).
        let at_bound = st == Status::Fitted
            && (after <= s.lo || after >= s.hi || (s.to_u(after) - s.u_lo()).abs() < 1e-6 || (s.u_hi() - s.to_u(after)).abs() < 1e-6);
        if let (Status::Fitted, Some(o)) = (&st, found) {
            let stage_ids = o.4.clone();
            let mechanism = MECHANISM_PARAMS.contains(name) && rows.iter().any(|r| r.mechanism);
            let together: Vec<&str> =
                outcome.iter().filter(|x| x.1 == Status::Fitted && x.0 != *name && x.4 == o.4).map(|x| x.0).collect();
            let p = param_mut(&mut fitted, name);
            p.note = Some(format!(
                "fitted by tpusim calibrate on {date} to {} ({} {} rows{}): {objective}; 95% confidence interval {}{}; {}",
                file.path,
                stage_ids.len(),
                if mechanism { "mechanism" } else { "library" },
                if mechanism { ", the first stage" } else if rows.iter().any(|r| r.mechanism) { ", the second stage, the mechanisms held" } else { "" },
                match interval {
                    Some((lo, hi)) => format!("{lo} to {hi}"),
                    None => "not available".to_string(),
                },
                if at_bound { "; at a bound of its range: the rows do not pin it from that side" } else { "" },
                if together.is_empty() { "fitted alone".to_string() } else { format!("jointly with: {}", together.join(", ")) }
            ));
            p.fitted_to = Some(stage_ids);
            p.checked_against = None;
            p.source = None;
        }
        params.push(ParamFit {
            name: name.to_string(),
            before,
            after,
            elasticity: el,
            interval,
            at_bound,
            status: st,
        });
    }
    fitted.description = if fitted_names.is_empty() {
        // Nothing fitted: the values (and the rows they were fitted to) are the base model's.
        format!("{} [tpusim calibrate on {date} to {} fitted no parameter: the values are the base model's]", base.description, file.path)
    } else {
        format!("{} [calibrated by tpusim calibrate on {date} to {}]", base.description, file.path)
    };
    fitted.validate("calibrated model")?;
    fitted.provenance.source =
        format!("tpusim calibrate from {} to {}", if chip_arg.is_empty() { &base.name } else { chip_arg }, file.path);
    let fit_rows_out = rows
        .iter()
        .enumerate()
        .map(|(i, r)| FitRow {
            id: r.id.clone(),
            measured_ms: r.measured_ms,
            before_ms: before_pred[i],
            after_ms: after_pred[i],
            held_out_ms: held[i],
            held_out_group_ms: held_group[i],
        })
        .collect();
    Ok(Calibration {
        file: file.path.clone(),
        chip: base.name.clone(),
        start_model: base.identity(),
        fitted_model: fitted.identity(),
        objective,
        fitted_to: ids,
        unused,
        params,
        rows: fit_rows_out,
        before: ErrorStats::of(&before_pred, &meas),
        after: ErrorStats::of(&after_pred, &meas),
        held_out: held_out_stats,
        held_out_group,
        cross_validation: cv_name,
        evaluations,
        model: fitted,
        params_given: !opts.params.is_empty(),
        cv_asked: opts.cross_validate,
    })
}

/// Per row, its prediction by a model refitted (from `fitted`) without the fold holding it.
fn held_out(fitted: &ChipModel, base: &ChipModel, rows: &[Row], names: &[&str], folds: &[Vec<usize>]) -> Vec<Option<f64>> {
    let mut held = vec![None; rows.len()];
    for test in folds {
        let train: Vec<&Row> = (0..rows.len()).filter(|i| !test.contains(i)).map(|i| &rows[i]).collect();
        if train.is_empty() {
            continue;
        }
        let (chip, _, _, _) = fit_rows(fitted, base, &train, names, false);
        let pred = predict_all(&chip, &test.iter().map(|&i| &rows[i]).collect::<Vec<_>>());
        for (k, &i) in test.iter().enumerate() {
            held[i] = Some(pred[k]);
        }
    }
    held
}

fn prepare(m: &Measurement, base: &ChipModel) -> Result<Row, String> {
    let (job, mechanism) = match m.described_spec() {
        Some(spec) if m.kernel_word.starts_with(MECHANISM_KERNEL_PREFIX) => {
            let job = spec.build(base).map_err(|e| tpusim_job::render_fields(&e.to_string(), tpusim_job::FieldStyle::Key))?;
            (RowJob::Described(Box::new(job)), true)
        }
        Some(_) if m.kernel_word.starts_with(DRY_RUN_KERNEL_PREFIX) => {
            // One reason for every dry-run kernel (a refusal counts rows by reason).
            return Err(format!(
                "a dry run's row (kernel {DRY_RUN_KERNEL_PREFIX}...: `python -m tpusim.microbench --measure --dry-run` runs on the CPU in interpret mode, so its times are not measurements): never fitted; `tpusim validate` still predicts it; rows taken on a TPU (`--measure` without --dry-run) are fitted"
            ))
        }
        Some(_) => {
            return Err(format!(
                "a library kernel read from its IR (`kernel_ir`, kernel {}): a judge of the model, `tpusim validate` predicts it and no fit uses it (only mechanism rows, kernel {MECHANISM_KERNEL_PREFIX}..., are fitted)",
                m.kernel_word
            ))
        }
        None => (RowJob::Spec(Box::new(m.job_spec(&base.name)?.0)), false),
    };
    simulate_ms(base, &job).map_err(|e| format!("the simulator rejects this row: {e}"))?;
    Ok(Row { id: m.id.clone(), measured_ms: m.measured_ms, job, mechanism })
}

/// Writes a chip model as a complete TOML file in the presets' layout (one inline table per
/// parameter), with a header comment. The text parses back to the same model.
pub fn chip_to_toml(chip: &ChipModel, header: &str) -> Result<String, String> {
    let doc = toml::Value::try_from(chip).map_err(|e| e.to_string())?;
    let table = doc.as_table().ok_or("a chip model serialises to a table")?;
    let mut s = String::new();
    for line in header.lines() {
        let _ = writeln!(s, "# {line}");
    }
    for (k, v) in table {
        if !v.is_table() {
            let _ = writeln!(s, "{k} = {v}");
        }
    }
    for (sec, v) in table {
        let Some(t) = v.as_table() else { continue };
        let _ = writeln!(s, "\n[{sec}]");
        for (field, p) in t {
            let Some(p) = p.as_table() else { continue };
            let parts: Vec<String> = p.iter().map(|(k, v)| format!("{k} = {v}")).collect();
            let _ = writeln!(s, "{field} = {{ {} }}", parts.join(", "));
        }
    }
    let back = ChipModel::from_toml_str(&s, "calibrated model").map_err(|e| e.to_string())?;
    if &back != chip {
        return Err("internal: the written chip model does not read back identically".into());
    }
    Ok(s)
}

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

impl Calibration {
    /// The fitted chip model as TOML, with a header saying how it was made.
    ///
    /// # Errors
    /// If the model does not serialise (an internal error).
    pub fn model_toml(&self) -> Result<String, String> {
        let header = format!(
            "Chip model {} calibrated by `tpusim calibrate` to {} ({} rows: {}).\n\
             Objective: {}.\nOnly [fitted] values changed; architectural parameters are the starting model's,\n\
             {}.\nParameter hash (as reports name this model): {}.\n\
             Field meanings: models/README.md.",
            self.chip,
            self.file,
            self.fitted_to.len(),
            self.fitted_to.join(", "),
            self.objective,
            self.start_model,
            self.fitted_model.hash
        );
        chip_to_toml(&self.model, &header)
    }

    /// JSON: one object (errors as fractions).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a calibration serialises")
    }

    /// A table for people: parameters with their change, per-row predictions, error summary.
    pub fn to_table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "tpusim calibrate: chip {} to {} ({} rows)", self.chip, self.file, self.fitted_to.len());
        let _ = writeln!(s, "  starting model: {}", self.start_model);
        let _ = writeln!(s, "  fitted model:   parameters {} (the starting model with the fitted values below)", self.fitted_model.hash);
        let _ = writeln!(s, "  objective: {}", self.objective);
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "{:<28} {:>12} {:>12} {:>8}  {:>21}  {:>10}  status",
            "parameter", "before", "after", "change", "95% interval", "elasticity"
        );
        for p in &self.params {
            let change = if p.before != 0.0 {
                format!("{:+.1}%", (p.after / p.before - 1.0) * 100.0)
            } else if p.after == 0.0 {
                "0".into()
            } else {
                "new".into()
            };
            let status = match &p.status {
                Status::Fitted if p.at_bound => "fitted (at a bound of its range: the rows do not pin it from that side; check the value before using the model)".to_string(),
                Status::Fitted if p.interval.is_none() => "fitted (no 95% interval: the rows do not pin it)".to_string(),
                Status::Fitted => "fitted".to_string(),
                Status::NotIdentifiable(r) => r.clone(),
                Status::NotSelected if self.params_given => "held: not among --params".to_string(),
                Status::NotSelected => "held: the starting model does not fit it (no fitted_to rows; --params NAME fits it)".to_string(),
            };
            let interval = p.interval.map_or("-".to_string(), |(a, b)| format!("{a} to {b}"));
            let _ = writeln!(
                s,
                "{:<28} {:>12} {:>12} {:>8}  {:>21}  {:>10.3}  {}",
                p.name, p.before, p.after, change, interval, p.elasticity, status
            );
        }
        let _ = writeln!(s);
        let idw = self.rows.iter().map(|r| r.id.len()).max().unwrap_or(2).max(2);
        let _ = writeln!(
            s,
            "{:<idw$}  {:>11}  {:>11} {:>7}  {:>11} {:>7}  {:>11} {:>7}  {:>11} {:>7}",
            "id", "measured ms", "before ms", "err", "fitted ms", "err", "held-out ms", "err", "group-out", "err"
        );
        for r in &self.rows {
            let e = |p: f64| format!("{:+.1}%", (p / r.measured_ms - 1.0) * 100.0);
            let held = |v: Option<f64>| match v {
                Some(h) => (format!("{h:.4}"), e(h)),
                None => ("-".into(), "-".into()),
            };
            let ((h, he), (g, ge)) = (held(r.held_out_ms), held(r.held_out_group_ms));
            let _ = writeln!(
                s,
                "{:<idw$}  {:>11.4}  {:>11.4} {:>7}  {:>11.4} {:>7}  {:>11} {:>7}  {:>11} {:>7}",
                r.id,
                r.measured_ms,
                r.before_ms,
                e(r.before_ms),
                r.after_ms,
                e(r.after_ms),
                h,
                he,
                g,
                ge
            );
        }
        if !self.unused.is_empty() {
            let _ = writeln!(s);
            let _ = writeln!(s, "not used ({} rows):", self.unused.len());
            for u in &self.unused {
                let _ = writeln!(s, "  {}: {}", u.id, u.reason);
            }
        }
        let _ = writeln!(s);
        let line = |name: &str, e: &Option<ErrorStats>| match e {
            Some(e) => format!(
                "  {name:<26} median {}, mean {}, worst {}; RMS ln(pred/meas) {:.4}",
                pct(e.median_abs_error),
                pct(e.mean_abs_error),
                pct(e.worst_abs_error),
                e.rms_log_error
            ),
            None => format!("  {name:<26} n/a"),
        };
        let _ = writeln!(s, "|error|:");
        let _ = writeln!(s, "{}", line("starting model (training)", &self.before));
        let _ = writeln!(s, "{}", line("fitted model (training)", &self.after));
        if self.cross_validation != "none" {
            let _ = writeln!(s, "{}", line(&format!("held out ({})", self.cross_validation), &self.held_out));
            let _ = writeln!(s, "{}", line("held out (head_dim groups)", &self.held_out_group));
        } else {
            let why = if self.cv_asked { "fewer than 2 rows" } else { "--no-cv" };
            let _ = writeln!(s, "  held out                   not run ({why})");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_round_outward_and_keep_what_they_held() {
        // An exact fit's interval is about one point: rounded to the nearest 3 digits it could
        // exclude the 5-digit value; rounded outward it cannot.
        let (lo, hi) = (round_sig_outward(3.68613, 3, true), round_sig_outward(3.68617, 3, false));
        assert_eq!((lo, hi), (3.68, 3.69));
        assert!(lo <= round_sig(3.68615, 5) && round_sig(3.68615, 5) <= hi);
        assert_eq!(round_sig_outward(-0.01234, 3, true), -0.0124);
        assert_eq!(round_sig_outward(2.5, 3, false), 2.5);
        assert_eq!(round_sig_outward(0.0, 3, true), 0.0);
    }
}
