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
/// * vector: (ops + loaded-mask registers x loaded_mask_ops_per_vreg) / valu_vreg_ops_per_cycle;
///   latency: the ALU latency.
/// * transcendental: registers / eup_vregs_per_cycle; latency: the EUP latency.
/// * cross-lane: registers x xlu_cycles_per_vreg / count; latency: the XLU latency.
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
        Work::Vector { ops, loaded_mask_vregs } => (
            regs(ops + loaded_mask_vregs * chip.fitted.loaded_mask_ops_per_vreg.value) / chip.fitted.valu_vreg_ops_per_cycle.value,
            chip.vpu.alu_latency_cycles.value as f64,
        ),
        Work::Transcendental { vregs } => (regs(vregs) / chip.fitted.eup_vregs_per_cycle.value, chip.eup.latency_cycles.value as f64),
        Work::CrossLane { vregs } => {
            (regs(vregs) * chip.fitted.xlu_cycles_per_vreg.value / chip.xlu.count.value as f64, chip.xlu.latency_cycles.value as f64)
        }
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

/// The operations of a body in issue order with their costs: (node, unit, occupancy, latency).
///
/// The order is the compiler's list schedule of the body, computed once with every unit free and
/// no carried state pending: whenever a unit can start an operation, it takes, among the
/// operations whose inputs are done by then, the one first in program order (the lowering's
/// issue slot, then node index); if none is ready it waits for the earliest. The order is then
/// fixed (a static VLIW schedule): [`Transfer`] and [`schedule_body`] replay it per unit, so the
/// times stay max-plus expressions of the step's inputs.
///
/// A what-if model (one with `--set` overrides) keeps the order of the model it was derived from
/// (`provenance.compiled_for`: the code compiled for the chip as read) and times it with its own
/// costs: list scheduling is not monotone (a faster unit can reorder a body and lengthen it,
/// Graham's scheduling anomalies), a fixed order is.
fn issue_order(chip: &ChipModel, body: &StepBody) -> Vec<(usize, usize, f64, f64)> {
    let compiled_for = chip.provenance.compiled_for.as_deref().unwrap_or(chip);
    let g = &body.graph;
    list_order(compiled_for, body)
        .into_iter()
        .map(|i| {
            let op = &g[NodeIndex::new(i)];
            let (occ, lat) = op_cycles(chip, &op.work);
            (i, op.work.unit().index(), occ, lat)
        })
        .collect()
}

/// The list-scheduled issue order of a body's nodes on `chip` (see [`issue_order`]).
fn list_order(chip: &ChipModel, body: &StepBody) -> Vec<usize> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let g = &body.graph;
    let n = g.node_count();
    let cost: Vec<(usize, f64, f64)> = (0..n)
        .map(|i| {
            let op = &g[NodeIndex::new(i)];
            let (occ, lat) = op_cycles(chip, &op.work);
            (op.work.unit().index(), occ, lat)
        })
        .collect();
    let key = |i: usize| (g[NodeIndex::new(i)].issue, i);
    // Times are compared as integers of 1/1024 cycle so heaps can order them.
    let fx = |t: f64| (t * 1024.0).round() as u64;
    let mut missing: Vec<usize> = (0..n).map(|i| g.neighbors_directed(NodeIndex::new(i), Direction::Incoming).count()).collect();
    let mut ready_at = vec![0.0f64; n];
    let mut free = [0.0f64; 6];
    // Per unit: operations whose inputs are scheduled, by ready time; and those ready by the
    // unit's free time, by program order.
    // Program order key of an operation: (issue slot, node index).
    type Key = (u64, usize);
    let mut pending: Vec<BinaryHeap<Reverse<(u64, Key)>>> = (0..6).map(|_| BinaryHeap::new()).collect();
    let mut ready: Vec<BinaryHeap<Reverse<Key>>> = (0..6).map(|_| BinaryHeap::new()).collect();
    for i in 0..n {
        if missing[i] == 0 {
            pending[cost[i].0].push(Reverse((0, key(i))));
        }
    }
    let mut order = Vec::with_capacity(n);
    while order.len() < n {
        // The unit that can start an operation first.
        let mut best: Option<(f64, usize)> = None;
        for u in 0..6 {
            while let Some(Reverse((t, k))) = pending[u].peek().copied() {
                if t > fx(free[u]) {
                    break;
                }
                pending[u].pop();
                ready[u].push(Reverse(k));
            }
            let start = if !ready[u].is_empty() {
                free[u]
            } else if let Some(Reverse((t, _))) = pending[u].peek() {
                free[u].max(*t as f64 / 1024.0)
            } else {
                continue;
            };
            if best.is_none_or(|(b, _)| start < b) {
                best = Some((start, u));
            }
        }
        let (start, u) = best.expect("a body's graph is acyclic: some operation is always schedulable");
        let i = match ready[u].pop() {
            Some(Reverse((_, i))) => i,
            None => {
                let Reverse((_, (_, i))) = pending[u].pop().expect("a unit with a start time has an operation");
                i
            }
        };
        let (_, occ, lat) = cost[i];
        let start = start.max(ready_at[i]);
        free[u] = start + occ;
        let done = start + occ + lat;
        for s in g.neighbors_directed(NodeIndex::new(i), Direction::Outgoing) {
            let j = s.index();
            ready_at[j] = ready_at[j].max(done);
            missing[j] -= 1;
            if missing[j] == 0 {
                pending[cost[j].0].push(Reverse((fx(ready_at[j]), key(j))));
            }
        }
        order.push(i);
    }
    order
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
/// the new unit free times and carried-slot times, the body's *front* (when the next grid step may
/// begin issuing: the end of the body's last MXU operation's occupancy, or of its last operation
/// when it has no matmul) and its *done* time (its last result). Every output is
/// `max_j (a[out][j] + x_j)` over the inputs `x`.
#[derive(Debug, Clone, PartialEq)]
pub struct Transfer {
    /// Carried slots of the body.
    pub carries: usize,
    units_out: [Form; 4],
    carries_out: Vec<Form>,
    front: Form,
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
        let mut mxu_end: Option<Form> = None;
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
            if u == Unit::Mxu.index() {
                match &mut mxu_end {
                    Some(m) => form_max(m, &end),
                    None => mxu_end = Some(end.clone()),
                }
            }
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
            front: mxu_end.unwrap_or(issue_end),
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
        (form_eval(&self.front, x), form_eval(&self.done, x))
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
