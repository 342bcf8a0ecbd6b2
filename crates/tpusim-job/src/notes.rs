//! Notes that explain results a user would question, each naming the mechanism behind it:
//!
//! * [`mxu_fill`]: the MXU works well below its peak while busy, because the matmuls are
//!   smaller than its arrays (a contraction over head_dim 128 fills half of a 256-row array) or
//!   because loading a fold's weights (one cycle per array row) takes longer than streaming the
//!   rows through it. A larger array at the same count and clock then runs no faster, or slower,
//!   while the peak (and so the MFU's denominator) grows.
//! * [`eight_bit_peak`]: matmuls ran in int8 or fp8 at another row rate than bf16's, so the
//!   MFU (against the bf16 peak) can exceed 100%; it gives the type's peak.
//! * [`short_steps`]: the grid steps are shorter than any measured small-block step and neither
//!   the chip's step overhead nor its DMA latency is fitted, so the run may be off either way.
//! * [`unfitted_parameters`]: the run depends on `[fitted]` parameters that were not fitted to
//!   any measurement of this chip (carried over from another chip's fit), so its latency and MFU
//!   are unvalidated on this chip for this kind of kernel.
//!
//! All read the run's main kernel: its step bodies, weighted by the steps that ran them.

use crate::{Report, Run};
use tpusim_chip::{ChipModel, Param};
use tpusim_engine::{matmul_parts, mxu_type_factors, op_cycles};
use tpusim_model::{mxu::MxuType, Unit, Work};

/// MXU efficiency while busy below which [`mxu_fill`] explains it.
pub const MXU_FILL_NOTE_BELOW: f64 = 0.5;
/// Share of MXU busy time spent weight-load bound above which [`mxu_fill`] explains it.
pub const WEIGHT_LOAD_NOTE_ABOVE: f64 = 0.1;
/// Busy fraction of the run (or share of its critical path) from which a unit's carried
/// parameter is named by [`unfitted_parameters`].
pub const UNIT_MATTERS_BUSY: f64 = 0.5;
/// Critical-path share from which a unit's carried parameter is named.
pub const UNIT_MATTERS_CRITICAL: f64 = 0.1;

/// A matmul operation of a step body: (name, rows streamed m_total, contraction k, output n).
pub type MatmulShape = (&'static str, u64, u64, u64);

/// How the MXU's busy time of a run divides, from its matmul operations.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MxuFill {
    /// MXU busy cycles of the main kernel (all arrays together, as the engine charges them).
    pub busy_cycles: f64,
    /// Cycles the same FLOPs take at the arrays' peak (every cell of every array each cycle).
    pub ideal_cycles: f64,
    /// Busy cycles of operations whose time is set by weight loads (a fold's `rows` cycles)
    /// rather than by the rows streamed through it.
    pub load_bound_cycles: f64,
    /// Busy-weighted fraction of the array rows a fold's contraction uses (k / padded k).
    pub row_fill: f64,
    /// Busy-weighted fraction of the array columns a fold's output uses (n / padded n).
    pub column_fill: f64,
    /// The matmul operation with the most busy time.
    pub largest: Option<MatmulShape>,
    /// The type the largest operation ran in.
    pub largest_type: Option<MxuType>,
    /// Busy cycles of matmuls that ran in int8 or fp8, per type.
    pub eight_bit: Vec<(MxuType, f64)>,
}

impl MxuFill {
    /// Efficiency while busy: ideal / busy cycles (1.0 = every cell of every array busy).
    pub fn efficiency(&self) -> f64 {
        if self.busy_cycles > 0.0 {
            self.ideal_cycles / self.busy_cycles
        } else {
            1.0
        }
    }
}

/// Measures [`MxuFill`] of a run's main kernel from its step bodies (each weighted by the steps
/// that ran it) with the engine's matmul cost ([`op_cycles`]).
pub fn measure_mxu(run: &Run) -> MxuFill {
    let chip = &run.chip;
    let rows = chip.mxu.rows.value as u64;
    let cols = chip.mxu.columns.value as u64;
    let mut f = MxuFill::default();
    let mut by_op: Vec<(MatmulShape, MxuType, f64)> = Vec::new();
    for (class, &steps) in run.program.classes.iter().zip(&run.result.class_steps) {
        if steps == 0 {
            continue;
        }
        // A body's slabs repeat a few matmul shapes: cost each distinct one once.
        let mut shapes: Vec<(&'static str, Work, f64)> = Vec::new();
        for op in class.body.graph.node_weights() {
            if !matches!(op.work, Work::Matmul { .. }) {
                continue;
            }
            match shapes.iter_mut().find(|(n, w, _)| *n == op.name && *w == op.work) {
                Some((_, _, c)) => *c += 1.0,
                None => shapes.push((op.name, op.work, 1.0)),
            }
        }
        for (name, work, count) in shapes {
            let Work::Matmul { m, k, n, m_total, mxu_type } = work else { continue };
            let (occ, _) = op_cycles(chip, &work);
            let steps = steps as f64 * count;
            let busy = occ * steps;
            if busy <= 0.0 {
                continue;
            }
            f.busy_cycles += busy;
            // The ideal streams every row through full folds at the type's row rate: the stream
            // bound with the folds' fill taken out.
            let (stream, load) = matmul_parts(chip, k, n, m_total, mxu_type);
            let fill = (k * n) as f64 / (k.div_ceil(rows) * rows * n.div_ceil(cols) * cols) as f64;
            f.ideal_cycles += steps * stream * fill * m as f64 / m_total.max(1) as f64;
            if load > stream {
                f.load_bound_cycles += busy;
            }
            f.row_fill += busy * k as f64 / (k.div_ceil(rows) * rows) as f64;
            f.column_fill += busy * n as f64 / (n.div_ceil(cols) * cols) as f64;
            if mxu_type != MxuType::Bf16 {
                match f.eight_bit.iter_mut().find(|(t, _)| *t == mxu_type) {
                    Some((_, b)) => *b += busy,
                    None => f.eight_bit.push((mxu_type, busy)),
                }
            }
            let key = (name, m_total, k, n);
            match by_op.iter_mut().find(|(k2, _, _)| *k2 == key) {
                Some((_, _, b)) => *b += busy,
                None => by_op.push((key, mxu_type, busy)),
            }
        }
    }
    if f.busy_cycles > 0.0 {
        f.row_fill /= f.busy_cycles;
        f.column_fill /= f.busy_cycles;
    }
    if let Some((shape, t, _)) = by_op.into_iter().max_by(|a, b| a.2.total_cmp(&b.2)) {
        f.largest = Some(shape);
        f.largest_type = Some(t);
    }
    f
}

/// A note when the MXU works well below its peak while busy or is weight-load bound (module
/// docs), from the run's [`measure_mxu`]; `None` otherwise.
pub fn mxu_fill(run: &Run, f: &MxuFill) -> Option<String> {
    let load_share = if f.busy_cycles > 0.0 { f.load_bound_cycles / f.busy_cycles } else { 0.0 };
    let eff = f.efficiency();
    if f.busy_cycles <= 0.0 || (eff >= MXU_FILL_NOTE_BELOW && load_share <= WEIGHT_LOAD_NOTE_ABOVE) {
        return None;
    }
    let chip = &run.chip;
    let (rows, cols) = (chip.mxu.rows.value, chip.mxu.columns.value);
    let mut why = Vec::new();
    if f.row_fill < 0.99 || f.column_fill < 0.99 {
        why.push(format!(
            "the matmuls are smaller than the {rows} x {cols} arrays: their own data (not lanes padded past it) fills on average {:.0}% of a weight fold's rows (contraction) and {:.0}% of its columns (output)",
            100.0 * f.row_fill,
            100.0 * f.column_fill
        ));
    }
    if load_share > WEIGHT_LOAD_NOTE_ABOVE {
        let fold = match f.largest_type.unwrap_or(MxuType::Bf16) {
            MxuType::Bf16 => format!("loading a fold takes {rows} cycles (one per array row)"),
            t => {
                let load = mxu_type_factors(chip, t).1;
                format!("loading a fold of {} weights takes {} cycles ({}x a bf16 fold's {rows}, one per array row)", t.word(), sig(f64::from(rows) * load), sig(load))
            }
        };
        why.push(format!("{:.0}% of MXU time is weight loading: {fold}, longer than streaming the rows that use it", 100.0 * load_share));
    }
    let largest = f
        .largest
        .map(|(name, m, k, n)| {
            let t = f.largest_type.filter(|t| *t != MxuType::Bf16).map(|t| format!(" in {}", t.word())).unwrap_or_default();
            format!(" (largest share: `{name}`{t}, {m} rows through k {k} x n {n} weights)")
        })
        .unwrap_or_default();
    Some(format!(
        "the MXU runs at {:.0}% of its peak while busy{largest}: {}; the peak and MFU count every cell of every array, so a larger array at the same count and clock does not run faster here and can run slower",
        100.0 * eff,
        why.join("; ")
    ))
}

/// A note when matmuls ran in int8 or fp8 at a row rate other than bf16's: MFU is against the
/// bf16 peak, so it can exceed 100%; the note gives the type's peak. `None` otherwise.
pub fn eight_bit_peak(run: &Run, f: &MxuFill) -> Option<String> {
    let chip = &run.chip;
    let parts: Vec<String> = f
        .eight_bit
        .iter()
        .filter(|&&(t, busy)| busy > 0.0 && mxu_type_factors(chip, t).0 != 1.0)
        .map(|&(t, busy)| {
            let rate = mxu_type_factors(chip, t).0;
            format!(
                "{} ({:.0}% of MXU time) at {}x bf16's row rate, a peak of {:.0} TOP/s",
                t.word(),
                100.0 * busy / f.busy_cycles,
                sig(rate),
                chip.peak_flops() * rate / 1e12
            )
        })
        .collect();
    (!parts.is_empty()).then(|| {
        format!(
            "matmuls ran in {}: MFU counts against the bf16 peak ({:.0} TFLOP/s), so it can exceed 100% where they run faster than bf16",
            parts.join(" and "),
            chip.peak_flops() / 1e12
        )
    })
}

/// `x` with up to three significant digits and no trailing zeros (0.5, 128, 1.25).
fn sig(x: f64) -> String {
    let s = format!("{:.3}", x);
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// The `[fitted]` parameters of a chip, each with the unit whose time it sets.
fn fitted_units(chip: &ChipModel) -> [(&'static str, &Param<f64>, Unit); 5] {
    let f = &chip.fitted;
    [
        ("fitted.valu_vreg_ops_per_cycle", &f.valu_vreg_ops_per_cycle, Unit::Vpu),
        ("fitted.eup_vregs_per_cycle", &f.eup_vregs_per_cycle, Unit::Eup),
        ("fitted.xlu_cycles_per_vreg", &f.xlu_cycles_per_vreg, Unit::Xlu),
        ("fitted.loaded_mask_ops_per_vreg", &f.loaded_mask_ops_per_vreg, Unit::Vpu),
        ("fitted.grid_step_overhead_cycles", &f.grid_step_overhead_cycles, Unit::StepControl),
    ]
}

/// A note when the run depends on `[fitted]` parameters fitted to no measurement of this chip
/// (an empty `fitted_to`: carried over from another chip's fit or taken from a micro-benchmark)
/// and checked against none (`checked_against`);
/// `None` otherwise. A parameter counts when its unit is busy at least [`UNIT_MATTERS_BUSY`] of
/// the run (an error of 2x in it could then make that unit bound the run) or holds at least
/// [`UNIT_MATTERS_CRITICAL`] of its critical path; the loaded-mask cost only when a loaded mask is
/// applied. The note quotes the first sentence of each parameter's own note.
pub fn unfitted_parameters(run: &Run, rep: &Report) -> Option<String> {
    let loaded_mask = run.program.classes.iter().zip(&run.result.class_steps).any(|(c, &n)| {
        n > 0 && c.body.graph.node_weights().any(|op| matches!(op.work, Work::Vector { loaded_mask_vregs, .. } if loaded_mask_vregs > 0.0))
    });
    let mut params = Vec::new();
    let mut units: Vec<Unit> = Vec::new();
    for (name, p, unit) in fitted_units(&run.chip) {
        // Fitted to this chip's rows, or checked against them: measurements stand behind it.
        if !p.fitted_to.as_ref().is_some_and(|r| r.is_empty()) || p.checked_against.as_ref().is_some_and(|r| !r.is_empty()) {
            continue;
        }
        if name == "fitted.loaded_mask_ops_per_vreg" && !loaded_mask {
            continue;
        }
        let critical = if rep.latency_ms > 0.0 { rep.critical_path_ms[unit] / rep.latency_ms } else { 0.0 };
        if rep.utilization[unit] < UNIT_MATTERS_BUSY && critical < UNIT_MATTERS_CRITICAL {
            continue;
        }
        let why = p.note.as_deref().map(first_sentence).unwrap_or_default();
        params.push(if why.is_empty() { name.to_string() } else { format!("{name} [{why}]") });
        if !units.contains(&unit) {
            units.push(unit);
        }
    }
    if params.is_empty() {
        return None;
    }
    let chip = &run.chip.name;
    let names: Vec<String> = units.iter().map(|u| u.to_string()).collect();
    let busy: Vec<String> = units.iter().map(|&u| format!("{:.0}%", 100.0 * rep.utilization[u])).collect();
    Some(format!(
        "this run's {} work (busy {} of the run) depends on [fitted] parameters not fitted to any {chip} measurement, so no {chip} measurement of this kind of kernel validates its latency and MFU: {}; `tpusim chip show {chip}` gives their full notes",
        names.join(" and "),
        busy.join(" and "),
        params.join("; ")
    ))
}

/// The one public per-step time of a small-block Pallas kernel, ns: the Pallas TPU matmul
/// tutorial's bf16 8192^3 product in 128^3 blocks, 91.84 ms over 262,144 grid steps on v5e
/// (`traces/measured/calibration.csv`, PALLAS-MM-v5e-8192-b128).
pub const MEASURED_SMALL_STEP_NS: f64 = 350.0;

/// A note when the run's grid steps average less than [`MEASURED_SMALL_STEP_NS`] and neither the
/// chip's grid-step overhead nor its DMA latency is fitted to any of its measurements (empty
/// `fitted_to`s): the per-step costs a small block pays (its copies' issue, latency and
/// semaphore waits) are then set by values no measurement of this chip pins, and the run may be
/// optimistic or pessimistic (v6e's, pinned by its microbenchmarks, expose a 0.35 us round trip a
/// step; `python -m tpusim.microbench --measure` pins another chip's). `None` otherwise.
pub fn short_steps(run: &Run, rep: &Report) -> Option<String> {
    let f = &run.chip.fitted;
    let unpinned = |p: &tpusim_chip::Param<f64>| p.fitted_to.as_ref().is_some_and(|r| r.is_empty());
    if rep.grid_steps == 0 || !unpinned(&f.grid_step_overhead_cycles) || !unpinned(&f.dma_latency_ns) {
        return None;
    }
    let step_ns = rep.latency_ms * 1e6 / rep.grid_steps as f64;
    if step_ns >= MEASURED_SMALL_STEP_NS {
        return None;
    }
    let chip = &run.chip.name;
    Some(format!(
        "grid steps average {step_ns:.0} ns, shorter than the {MEASURED_SMALL_STEP_NS:.0} ns a step of 128-wide blocks measures on v5e (the Pallas TPU matmul tutorial); {chip}'s grid-step overhead ({:.0} cycles) and DMA latency ({:.0} ns) are fitted to no {chip} measurement, so what a small block pays each step (its copies' issue, latency and semaphore waits) is not pinned and this run may be off either way (v6e's microbenchmarks pin its: a pipelined step exposes a round trip of about 0.35 us; python -m tpusim.microbench --measure pins a chip's); larger blocks make steps fewer",
        f.grid_step_overhead_cycles.value,
        f.dma_latency_ns.value
    ))
}

/// The text up to the first sentence end (". ") or the whole text, without a final period.
fn first_sentence(text: &str) -> String {
    let t = text.trim();
    let end = t.find(". ").unwrap_or(t.len());
    t[..end].trim_end_matches('.').to_string()
}
