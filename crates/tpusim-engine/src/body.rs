//! One grid step's body on the units: operation costs ([`op_cycles`]), the body scheduled alone
//! ([`schedule_body`], for per-class reports) and its max-plus transfer ([`Transfer`]): how the
//! times the body ends with depend on the times it starts with, which lets consecutive grid steps
//! overlap while each body is scheduled only once.

use petgraph::graph::NodeIndex;
use petgraph::Direction;
use serde::Serialize;
use tpusim_chip::ChipModel;
use tpusim_kernel::{PerUnit, StepBody, Unit, Work};

/// Cycles per unit ([`Unit`]): busy time or a share of the critical path. `hbm` is DMA transfer
/// time, `step_control` the grid-step overhead.
pub type UnitCycles = PerUnit<f64>;

/// Occupancy and latency in cycles of one piece of work on a chip.
///
/// * matmul m x k x n whose weights serve `m_total` streamed rows: folds = ceil(k / rows) x
///   ceil(n / columns); the whole product takes max(folds x m_total / A, ceil(folds / A) x rows)
///   cycles on A = count x passes arrays (a fold streams one row per cycle per array; loading a
///   fold's weights takes `rows` cycles and overlaps the previous stream); an operation streaming
///   m of the m_total rows takes its m / m_total share. Latency: the chip's MXU result latency.
/// * vector: ops / valu_vreg_ops_per_cycle; latency: the ALU latency.
/// * transcendental: registers / eup_vregs_per_cycle; latency: the EUP latency.
/// * cross-lane: registers x issue_interval_cycles / count; latency: the XLU latency.
///
/// Vector, transcendental and cross-lane work is counted by lowering in (8,128)-register units of
/// 1024 elements; a chip whose registers hold `sublanes x lanes` elements needs
/// `1024 / (sublanes x lanes)` of its registers per unit.
pub fn op_cycles(chip: &ChipModel, work: &Work) -> (f64, f64) {
    let regs = |units: f64| units * 1024.0 / chip.vreg_elems();
    match *work {
        Work::Matmul { m, k, n, m_total } => {
            let rows = chip.mxu.rows.value as u64;
            let cols = chip.mxu.columns.value as u64;
            let arrays = chip.mxu_arrays();
            let folds = (k.div_ceil(rows) * n.div_ceil(cols)) as f64;
            let whole = (folds * m_total as f64 / arrays).max((folds / arrays).ceil() * rows as f64);
            let occ = whole * m as f64 / m_total.max(1) as f64;
            (occ, chip.mxu.result_latency_cycles.value as f64)
        }
        Work::Vector { ops, .. } => (regs(ops) / chip.fitted.valu_vreg_ops_per_cycle.value, chip.vpu.alu_latency_cycles.value as f64),
        Work::Transcendental { vregs } => (regs(vregs) / chip.fitted.eup_vregs_per_cycle.value, chip.eup.latency_cycles.value as f64),
        Work::CrossLane { vregs } => (
            regs(vregs) * chip.xlu.issue_interval_cycles.value as f64 / chip.xlu.count.value as f64,
            chip.xlu.latency_cycles.value as f64,
        ),
    }
}

/// When one tile operation ran, cycles (from the body's start in a [`BodyTiming`]; absolute in
/// a step observed by [`crate::simulate_observed`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct OpTiming {
    /// Node index in the body graph.
    pub node: usize,
    /// Unit it ran on.
    pub unit: Unit,
    /// Start cycle.
    pub start: f64,
    /// Cycle its unit became free again.
    pub end: f64,
}

/// A step body scheduled alone (every unit free, no carried state pending).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct BodyTiming {
    /// Cycles from the first issue to the last result.
    pub cycles: f64,
    /// Busy cycles per unit (MXU, VPU, EUP, XLU; hbm and step_control are zero).
    pub busy: UnitCycles,
    /// Per-operation timing, in node order.
    pub ops: Vec<OpTiming>,
    /// The body's critical path split by unit (sums to `cycles`): walking back from the last
    /// result, each operation on the path is charged from its start to the point where its
    /// successor on the path started.
    pub critical: UnitCycles,
}

/// The operations of a body in issue order (issue slot, then node index) with their costs.
fn issue_order(chip: &ChipModel, body: &StepBody) -> Vec<(usize, usize, f64, f64)> {
    let g = &body.graph;
    let mut order: Vec<usize> = (0..g.node_count()).collect();
    order.sort_by_key(|&i| (g[NodeIndex::new(i)].issue, i));
    order
        .into_iter()
        .map(|i| {
            let op = &g[NodeIndex::new(i)];
            let (occ, lat) = op_cycles(chip, &op.work);
            (i, op.work.unit().index(), occ, lat)
        })
        .collect()
}

/// Schedules one step body alone: operations issue in the body's static order (issue slot, then
/// node index); each starts when its inputs are done and its unit has finished the previous
/// operation in that order. With a fixed order, every start time is a max-plus expression of
/// operation times, so making any unit faster never delays anything.
pub fn schedule_body(chip: &ChipModel, body: &StepBody) -> BodyTiming {
    let g = &body.graph;
    let n = g.node_count();
    if n == 0 {
        return BodyTiming::default();
    }
    let mut ready_at = vec![0.0f64; n];
    let mut binding_dep: Vec<Option<usize>> = vec![None; n];
    let mut unit_free = [0.0f64; 6];
    let mut last_on_unit: [Option<usize>; 6] = [None; 6];
    let mut cause: Vec<Option<usize>> = vec![None; n];
    let mut done_at = vec![0.0f64; n];
    let mut starts = vec![0.0f64; n];
    let mut t = BodyTiming::default();
    let mut timing = vec![None; n];
    for (i, u, occ, lat) in issue_order(chip, body) {
        let start = ready_at[i].max(unit_free[u]);
        cause[i] = if ready_at[i] >= unit_free[u] { binding_dep[i] } else { last_on_unit[u] };
        let end = start + occ;
        unit_free[u] = end;
        last_on_unit[u] = Some(i);
        let done = end + lat;
        done_at[i] = done;
        starts[i] = start;
        t.cycles = t.cycles.max(done);
        t.busy.0[u] += occ;
        timing[i] = Some(OpTiming { node: i, unit: Unit::ALL[u], start, end });
        for s in g.neighbors_directed(NodeIndex::new(i), Direction::Outgoing) {
            let j = s.index();
            if done >= ready_at[j] {
                binding_dep[j] = Some(i);
            }
            ready_at[j] = ready_at[j].max(done);
        }
    }
    t.ops = timing.into_iter().flatten().collect();
    // Walk the critical path back from the last result.
    let mut cur = (0..n).max_by(|&a, &b| done_at[a].total_cmp(&done_at[b]));
    let mut mark = t.cycles;
    while let Some(i) = cur {
        t.critical[g[NodeIndex::new(i)].work.unit()] += mark - starts[i];
        mark = starts[i];
        cur = cause[i];
    }
    t
}

const NEG: f64 = f64::NEG_INFINITY;

/// A time as a max-plus linear form of the step's inputs: entry j is the delay from input j
/// (`-inf`: no path).
type Form = Vec<f64>;

fn form_max(a: &mut Form, b: &Form) {
    for (x, y) in a.iter_mut().zip(b) {
        if *y > *x {
            *x = *y;
        }
    }
}

fn form_add(a: &Form, c: f64) -> Form {
    a.iter().map(|x| x + c).collect()
}

fn form_eval(f: &Form, x: &[f64]) -> f64 {
    f.iter().zip(x).fold(NEG, |m, (a, b)| m.max(a + b))
}

/// Index of the step's start among a transfer's inputs.
pub const IN_START: usize = 0;
/// Index of the first unit's free time among a transfer's inputs (then VPU, EUP, XLU).
pub const IN_UNITS: usize = 1;
/// Index of the first carried slot among a transfer's inputs.
pub const IN_CARRIES: usize = 5;

/// The max-plus transfer of a step body (module docs).
///
/// Inputs: the step's start `S` (its scalar control done and its input DMAs landed), the times the
/// four compute units become free, and the times the carried-state slots are written. Outputs:
/// the new unit free times and carried-slot times, the body's *issue end* (the end of its last
/// operation's occupancy: when the step's last instruction has issued) and its *done* time (its
/// last result). Every output is `max_j (a[out][j] + x_j)` over the inputs `x`.
#[derive(Debug, Clone, PartialEq)]
pub struct Transfer {
    /// Carried slots of the body.
    pub carries: usize,
    units_out: [Form; 4],
    carries_out: Vec<Form>,
    issue_end: Form,
    done: Form,
    /// Per operation in node order: (unit, start form, occupancy).
    ops: Vec<(Unit, Form, f64)>,
    /// Whether the body has no operations (a skipped grid step).
    pub empty: bool,
}

impl Transfer {
    /// The transfer of `body` on `chip`, with `carries` carried slots (at least the body's).
    pub fn new(chip: &ChipModel, body: &StepBody, carries: usize) -> Self {
        let g = &body.graph;
        let n = g.node_count();
        let k = carries.max(body.carries as usize);
        let n_in = IN_CARRIES + k;
        let unit_in = |i: usize| -> Form {
            let mut f = vec![NEG; n_in];
            f[i] = 0.0;
            f
        };
        let mut unit_free: [Form; 4] = std::array::from_fn(|u| unit_in(IN_UNITS + u));
        let mut carry: Vec<Form> = (0..k).map(|c| unit_in(IN_CARRIES + c)).collect();
        let mut carry_written: Vec<Form> = carry.clone();
        let mut ready: Vec<Form> = vec![unit_in(IN_START); n];
        let mut ops: Vec<Option<(Unit, Form, f64)>> = vec![None; n];
        let mut issue_end = unit_in(IN_START);
        let mut done_all = unit_in(IN_START);
        for (i, u, occ, lat) in issue_order(chip, body) {
            let op = &g[NodeIndex::new(i)];
            let mut start = ready[i].clone();
            form_max(&mut start, &unit_free[u]);
            if let Some(c) = op.carry_in {
                form_max(&mut start, &carry[c as usize]);
            }
            let end = form_add(&start, occ);
            let done = form_add(&end, lat);
            unit_free[u] = end.clone();
            form_max(&mut issue_end, &end);
            form_max(&mut done_all, &done);
            if let Some(c) = op.carry_out {
                carry_written[c as usize] = done.clone();
            }
            for s in g.neighbors_directed(NodeIndex::new(i), Direction::Outgoing) {
                form_max(&mut ready[s.index()], &done);
            }
            ops[i] = Some((Unit::ALL[u], start, occ));
        }
        // A slot read and written in one step: the next reader waits for this step's write.
        carry = carry_written;
        Transfer {
            carries: k,
            units_out: unit_free,
            carries_out: carry,
            issue_end,
            done: done_all,
            ops: ops.into_iter().flatten().collect(),
            empty: n == 0,
        }
    }

    /// Applies the transfer to inputs `x` (length `5 + carries`): writes the new unit free times
    /// into `units` and carried times into `carries_out`; returns (issue end, done).
    pub fn apply(&self, x: &[f64], units: &mut [f64; 4], carries_out: &mut [f64]) -> (f64, f64) {
        for (u, f) in self.units_out.iter().enumerate() {
            units[u] = form_eval(f, x);
        }
        for (c, f) in self.carries_out.iter().enumerate() {
            carries_out[c] = form_eval(f, x);
        }
        (form_eval(&self.issue_end, x), form_eval(&self.done, x))
    }

    /// Absolute operation times for inputs `x` (for timelines), in node order.
    pub fn op_times(&self, x: &[f64]) -> Vec<OpTiming> {
        self.ops
            .iter()
            .enumerate()
            .map(|(node, (unit, start, occ))| {
                let s = form_eval(start, x);
                OpTiming { node, unit: *unit, start: s, end: s + occ }
            })
            .collect()
    }
}
