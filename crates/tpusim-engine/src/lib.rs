//! Cycle-approximate simulation of a lowered kernel ([`tpusim_kernel::Program`]) on a chip model.
//!
//! Two levels:
//!
//! 1. **Inside a grid step** ([`schedule_body`]): the step's tile operations form a dependency
//!    graph (petgraph). They issue on the MXU, VPU, EUP and XLU in the body's static
//!    (software-pipelined) order: each unit runs one operation at a time, in that order; an
//!    operation starts when its inputs are done and its unit is free. An operation *occupies* its unit for its throughput time and its
//!    result is available a *latency* later (MXU: the systolic pipeline depth with weights preloaded, rows + columns
//!    cycles; VPU/EUP/XLU: the chip's op latencies). Work -> cycles:
//!    * matmul m x k x n whose weights serve `m_total` streamed rows: folds = ceil(k / rows) x
//!      ceil(n / columns); the whole product takes max(folds x m_total / A, ceil(folds / A) x rows)
//!      cycles on A = count x passes arrays (a fold streams one row per cycle; loading a fold's
//!      weights takes `rows` cycles and overlaps the previous stream); an operation streaming m of
//!      the m_total rows takes its m / m_total share;
//!    * vector: ops / valu_vreg_ops_per_cycle + masked registers x mask_extra_cycles_per_vreg;
//!    * transcendental: registers / eup_vregs_per_cycle;
//!    * cross-lane: registers x issue_interval_cycles / count.
//!    Each distinct step body is scheduled once and reused.
//! 2. **Across grid steps** ([`simulate`]): the Pallas pipeline. Step i's body starts when the
//!    previous step's body has ended plus the fixed grid-step overhead (scalar unit), and when its
//!    input DMAs have landed. The next step's input DMAs are issued as step i's body starts
//!    (double buffering); a DMA waits `dma_latency_ns`, then moves its bytes at the sustained HBM
//!    bandwidth (peak x efficiency), one DMA at a time. Output blocks are written back after the
//!    step that completes them; the kernel ends when the last body and the last write-back end.

use petgraph::graph::NodeIndex;
use petgraph::Direction;
use serde::Serialize;
use tpusim_chip::ChipModel;
use tpusim_kernel::{PerUnit, Program, RunItem, Step, StepBody, Unit, Work};

/// Cycles per unit ([`Unit`]): busy time or a share of the critical path. `hbm` is DMA transfer
/// time, `step_control` the grid-step overhead.
pub type UnitCycles = PerUnit<f64>;

/// When one tile operation ran inside a step body, cycles from the body's start.
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

/// A scheduled step body.
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
    /// successor on the path started (occupancy plus latency when a data dependency binds,
    /// occupancy alone when the successor waited for the unit).
    pub critical: UnitCycles,
}

/// Occupancy and latency in cycles of one piece of work on a chip.
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
            (occ, (rows + cols) as f64)
        }
        Work::Vector { ops, masked_vregs } => (
            regs(ops) / chip.fitted.valu_vreg_ops_per_cycle.value + regs(masked_vregs) * chip.fitted.mask_extra_cycles_per_vreg.value,
            chip.vpu.alu_latency_cycles.value as f64,
        ),
        Work::Transcendental { vregs } => (regs(vregs) / chip.fitted.eup_vregs_per_cycle.value, chip.eup.latency_cycles.value as f64),
        Work::CrossLane { vregs } => (
            regs(vregs) * chip.xlu.issue_interval_cycles.value as f64 / chip.xlu.count.value as f64,
            chip.xlu.latency_cycles.value as f64,
        ),
    }
}

/// Schedules one step body on the chip's units (module docs): operations issue in the body's
/// static order (issue slot, then node index); each starts when its inputs are done and its unit
/// has finished the previous operation in that order. With a fixed order, every start time is a
/// max-plus expression of operation times, so making any unit faster never delays anything.
pub fn schedule_body(chip: &ChipModel, body: &StepBody) -> BodyTiming {
    let g = &body.graph;
    let n = g.node_count();
    if n == 0 {
        return BodyTiming::default();
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| (g[NodeIndex::new(i)].issue, i));
    let mut ready_at = vec![0.0f64; n];
    let mut binding_dep: Vec<Option<usize>> = vec![None; n];
    let mut unit_free = [0.0f64; 6];
    let mut last_on_unit: [Option<usize>; 6] = [None; 6];
    let mut cause: Vec<Option<usize>> = vec![None; n];
    let mut done_at = vec![0.0f64; n];
    let mut starts = vec![0.0f64; n];
    let mut t = BodyTiming { ops: Vec::with_capacity(n), ..Default::default() };
    let mut timing = vec![None; n];
    for &i in &order {
        let op = &g[NodeIndex::new(i)];
        let u = op.work.unit().index();
        let (occ, lat) = op_cycles(chip, &op.work);
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

/// The outcome of simulating a program.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimResult {
    /// Total cycles from the first DMA issue to the last write-back.
    pub cycles: f64,
    /// Total time, seconds.
    pub seconds: f64,
    /// Busy cycles per unit.
    pub busy: UnitCycles,
    /// Executed matmul FLOPs (padding and masked-out pairs of visited tiles included).
    pub flops: f64,
    /// Executed exp/reciprocal elements.
    pub transcendentals: f64,
    /// Bytes moved between HBM and VMEM (both directions).
    pub hbm_bytes: u64,
    /// Grid steps run.
    pub grid_steps: u64,
    /// Scheduled body of each step class (index = class id).
    pub class_timing: Vec<BodyTiming>,
    /// Steps run of each class.
    pub class_steps: Vec<u64>,
    /// Cycles step bodies waited for their input DMAs beyond the grid-step overhead (exposed DMA
    /// latency and bandwidth).
    pub dma_stall_cycles: f64,
    /// The run's critical path split by unit (sums to `cycles`): per step, the grid-step overhead
    /// (step_control), the wait for input DMAs beyond it and the final write-back tail (hbm), and
    /// the body's critical path ([`BodyTiming::critical`]).
    pub critical: UnitCycles,
}

impl SimResult {
    /// Busy fraction per unit (busy cycles / total cycles).
    pub fn utilization(&self) -> PerUnit<f64> {
        PerUnit(self.busy.0.map(|c| if self.cycles > 0.0 { c / self.cycles } else { 0.0 }))
    }

    /// The unit that bounds the run: the one with the largest of its busy time (a throughput
    /// bound: the run cannot be shorter) and its share of the critical path
    /// ([`SimResult::critical`]: a latency bound, e.g. MXU fill and drain in short steps or DMA
    /// latency with small blocks). Ties go to the unit with the larger critical-path share.
    pub fn bottleneck(&self) -> Unit {
        let mut best = (Unit::Mxu, f64::NEG_INFINITY, f64::NEG_INFINITY);
        for ((u, b), (_, c)) in self.busy.iter().zip(self.critical.iter()) {
            let v = b.max(c);
            if v > best.1 || (v == best.1 && c > best.2) {
                best = (u, v, c);
            }
        }
        best.0
    }
}

/// Per-step times from the pipeline recursion, passed to an observer (for timelines).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StepTiming {
    /// Grid step index.
    pub index: u64,
    /// Cycle the body started.
    pub body_start: f64,
    /// Cycle the body ended.
    pub body_end: f64,
    /// Cycle the step's overhead started (after the previous body).
    pub overhead_start: f64,
    /// Input DMA for this step: (transfer start, transfer end) if any bytes moved.
    pub dma_in: Option<(f64, f64)>,
    /// Output DMA after this step: (transfer start, transfer end) if any.
    pub dma_out: Option<(f64, f64)>,
}

/// Simulates a program on a chip (module docs).
///
/// Runs of identical grid steps ([`Program::for_each_run`]) are simulated step by step only until
/// the pipeline reaches a steady state (two consecutive steps advance every time and total by the
/// same amounts); the rest of the run is then added in one jump. The result equals step-by-step
/// simulation ([`simulate_observed`]) up to floating-point rounding, and the cost grows with the
/// number of runs, not the number of steps.
pub fn simulate(chip: &ChipModel, program: &Program) -> SimResult {
    let mut sim = Pipeline::new(chip, program);
    let mut quiet = |_: &Step, _: &StepTiming| {};
    let mut head: Vec<(Step, u64)> = Vec::new();
    program.for_each_run_block(&mut |item| match item {
        RunItem::HeadStart => head.clear(),
        RunItem::Run(s, n) => {
            head.push((*s, n));
            sim.run(s, n, &mut quiet);
        }
        RunItem::RepeatHead(k) => sim.repeat_head(&head, k, &mut quiet),
    });
    sim.finish(&mut quiet)
}

/// Simulates step by step, calling `observe(step, timing)` for every grid step in order (for
/// timelines). Same result as [`simulate`].
pub fn simulate_observed(chip: &ChipModel, program: &Program, observe: &mut dyn FnMut(&Step, &StepTiming)) -> SimResult {
    let mut sim = Pipeline::new(chip, program);
    program.for_each_step(&mut |s| sim.push(s, observe));
    sim.finish(observe)
}

/// State of the Pallas pipeline recursion (module docs, level 2).
struct Pipeline<'a> {
    chip: &'a ChipModel,
    program: &'a Program,
    class_timing: Vec<BodyTiming>,
    class_steps: Vec<u64>,
    bpc: f64,
    lat: f64,
    overhead: f64,
    t: Times,
    in_bytes: u64,
    out_bytes: u64,
    steps: u64,
    /// The step whose inputs are in flight, with its input DMA (start, end).
    pending: Option<(Step, Option<(f64, f64)>)>,
}

/// The time-valued and accumulated state that one grid step advances.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Times {
    prev_end: f64,
    hbm_free: f64,
    last_out_done: f64,
    stall: f64,
    crit_step: f64,
    crit_hbm: f64,
}

impl Times {
    /// How far each field advanced since `before`.
    fn since(&self, before: &Times) -> Times {
        Times {
            prev_end: self.prev_end - before.prev_end,
            hbm_free: self.hbm_free - before.hbm_free,
            last_out_done: self.last_out_done - before.last_out_done,
            stall: self.stall - before.stall,
            crit_step: self.crit_step - before.crit_step,
            crit_hbm: self.crit_hbm - before.crit_hbm,
        }
    }

    /// Whether this advance repeats `prev` (same shift and same accumulated amounts), given the
    /// shifts of the pending input DMA in both.
    fn repeats(&self, din: Option<(f64, f64)>, prev: Option<(Times, Option<(f64, f64)>)>) -> bool {
        prev.is_some_and(|(p, pin)| {
            close(p.prev_end, self.prev_end)
                && close(p.stall, self.stall)
                && close(p.crit_step, self.crit_step)
                && close(p.crit_hbm, self.crit_hbm)
                && pin.is_some() == din.is_some()
        })
    }
}

/// The shift of an input DMA's (start, end) between two snapshots, if both exist.
fn dma_shift(before: Option<(f64, f64)>, after: Option<(f64, f64)>) -> Option<(f64, f64)> {
    match (before, after) {
        (Some(a), Some(b)) => Some((b.0 - a.0, b.1 - a.1)),
        _ => None,
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

impl<'a> Pipeline<'a> {
    fn new(chip: &'a ChipModel, program: &'a Program) -> Self {
        let class_timing: Vec<BodyTiming> = program.classes.iter().map(|c| schedule_body(chip, &c.body)).collect();
        Pipeline {
            chip,
            program,
            class_steps: vec![0; class_timing.len()],
            class_timing,
            bpc: chip.hbm_bytes_per_cycle(),
            lat: chip.dma_latency_cycles(),
            overhead: chip.fitted.grid_step_overhead_cycles.value,
            t: Times::default(),
            in_bytes: 0,
            out_bytes: 0,
            steps: 0,
            pending: None,
        }
    }

    fn transfer(&mut self, issue: f64, bytes: u64) -> (f64, f64) {
        let start = (issue + self.lat).max(self.t.hbm_free);
        let end = start + bytes as f64 / self.bpc;
        self.t.hbm_free = end;
        (start, end)
    }

    /// Runs step `cur` (inputs `cur_in`) knowing the next step; returns the next step's input DMA.
    fn advance(&mut self, cur: &Step, cur_in: Option<(f64, f64)>, next: Option<&Step>, observe: &mut dyn FnMut(&Step, &StepTiming)) -> Option<(f64, f64)> {
        let prev_end = self.t.prev_end;
        let ready = cur_in.map_or(prev_end, |(_, e)| e);
        let body_start = (prev_end + self.overhead).max(ready);
        let waited = (ready - (prev_end + self.overhead)).max(0.0);
        self.t.stall += waited;
        self.t.crit_step += body_start - prev_end - waited;
        self.t.crit_hbm += waited;
        // The next step's inputs are issued as this body starts (double buffering).
        let next_in = next.and_then(|n| (n.in_bytes > 0).then(|| self.transfer(body_start, n.in_bytes)));
        let body_end = body_start + self.class_timing[cur.class as usize].cycles;
        let dma_out = (cur.out_bytes > 0).then(|| self.transfer(body_end, cur.out_bytes));
        if let Some((_, e)) = dma_out {
            self.t.last_out_done = e;
        }
        observe(cur, &StepTiming { index: self.steps, body_start, body_end, overhead_start: prev_end, dma_in: cur_in, dma_out });
        self.t.prev_end = body_end;
        self.count(cur, 1);
        next_in
    }

    fn count(&mut self, s: &Step, n: u64) {
        self.class_steps[s.class as usize] += n;
        self.in_bytes += n * s.in_bytes;
        self.out_bytes += n * s.out_bytes;
        self.steps += n;
    }

    /// Feeds one step of the stream.
    fn push(&mut self, s: &Step, observe: &mut dyn FnMut(&Step, &StepTiming)) {
        match self.pending.take() {
            None => {
                // The first step's inputs are issued at time 0 (the pipeline prologue).
                let dma_in = (s.in_bytes > 0).then(|| self.transfer(0.0, s.in_bytes));
                self.pending = Some((*s, dma_in));
            }
            Some((p, p_in)) => {
                let next_in = self.advance(&p, p_in, Some(s), observe);
                self.pending = Some((*s, next_in));
            }
        }
    }

    /// Feeds a run of `n` steps identical to `s` but for coordinates, jumping over its steady state.
    fn run(&mut self, s: &Step, n: u64, observe: &mut dyn FnMut(&Step, &StepTiming)) {
        if n == 0 {
            return;
        }
        self.push(s, observe);
        // The remaining n - 1 transitions each run a copy of `s` with a copy of `s` next.
        let mut remaining = n - 1;
        let traffic = s.in_bytes > 0 || s.out_bytes > 0;
        let mut prev_delta: Option<(Times, Option<(f64, f64)>)> = None;
        while remaining > 0 {
            let (cur, cur_in) = self.pending.take().expect("a step is pending");
            let before = self.t;
            let next_in = self.advance(&cur, cur_in, Some(s), observe);
            self.pending = Some((*s, next_in));
            remaining -= 1;
            let d = self.t.since(&before);
            let din = dma_shift(cur_in, next_in);
            let c = d.prev_end;
            // A uniform shift of every time that matters, repeated twice: the rest is periodic.
            let shift_ok = (!traffic || close(d.hbm_free, c))
                && (traffic || self.t.hbm_free <= self.t.prev_end)
                && (s.out_bytes == 0 || close(d.last_out_done, c))
                && din.is_none_or(|(a, b)| close(a, c) && close(b, c))
                && (s.in_bytes == 0) == din.is_none();
            if shift_ok && d.repeats(din, prev_delta) && remaining > 0 {
                self.jump(remaining as f64, &d, traffic, s.out_bytes > 0);
                self.count(s, remaining);
                remaining = 0;
            }
            prev_delta = Some((d, din));
        }
    }

    /// Advances the state by `m` more repetitions of the period `d` (times shift by
    /// `d.prev_end`; HBM and write-back times only when the period moves them).
    fn jump(&mut self, m: f64, d: &Times, shift_hbm: bool, shift_out: bool) {
        let c = d.prev_end;
        self.t.prev_end += m * c;
        if shift_hbm {
            self.t.hbm_free += m * c;
        }
        if shift_out {
            self.t.last_out_done += m * c;
        }
        self.t.stall += m * d.stall;
        self.t.crit_step += m * d.crit_step;
        self.t.crit_hbm += m * d.crit_hbm;
        if let Some((_, Some((a, b)))) = &mut self.pending {
            *a += m * c;
            *b += m * c;
        }
    }

    /// Replays a head's runs `k` more times, jumping once two consecutive replays advance every
    /// time and total by the same amounts (the rest of the heads are then periodic).
    fn repeat_head(&mut self, head: &[(Step, u64)], k: u64, observe: &mut dyn FnMut(&Step, &StepTiming)) {
        let snapshot = |p: &Self| (p.t, p.pending.and_then(|(_, i)| i));
        let mut prev: Option<(Times, Option<(f64, f64)>)> = None;
        let mut remaining = k;
        while remaining > 0 {
            let (t0, in0) = snapshot(self);
            for (s, n) in head {
                self.run(s, *n, observe);
            }
            remaining -= 1;
            let (t1, in1) = snapshot(self);
            let d = t1.since(&t0);
            if in0.is_some() != in1.is_some() {
                prev = None;
                continue;
            }
            let din = dma_shift(in0, in1);
            let c = d.prev_end;
            let uniform = close(d.hbm_free, c) && close(d.last_out_done, c) && din.is_none_or(|(a, b)| close(a, c) && close(b, c));
            if uniform && d.repeats(din, prev) && remaining > 0 {
                self.jump(remaining as f64, &d, true, true);
                for (s, n) in head {
                    self.count(s, n * remaining);
                }
                remaining = 0;
            }
            prev = Some((d, din));
        }
    }

    fn finish(mut self, observe: &mut dyn FnMut(&Step, &StepTiming)) -> SimResult {
        if let Some((p, p_in)) = self.pending.take() {
            self.advance(&p, p_in, None, observe);
        }
        let chip = self.chip;
        let cycles = self.t.prev_end.max(self.t.last_out_done);
        let mut critical = UnitCycles::default();
        critical[Unit::StepControl] = self.t.crit_step;
        critical[Unit::Hbm] = self.t.crit_hbm + (cycles - self.t.prev_end);
        let mut busy = UnitCycles::default();
        let mut flops = 0.0;
        let mut trans = 0.0;
        for (i, t) in self.class_timing.iter().enumerate() {
            let k = self.class_steps[i] as f64;
            critical.add_scaled(&t.critical, k);
            busy.add_scaled(&t.busy, k);
            flops += k * self.program.classes[i].body.flops();
            trans += k * self.program.classes[i].body.transcendental_vregs() * 1024.0;
        }
        let hbm_bytes = self.in_bytes + self.out_bytes;
        busy[Unit::Hbm] = hbm_bytes as f64 / self.bpc;
        busy[Unit::StepControl] = self.steps as f64 * self.overhead;
        SimResult {
            cycles,
            seconds: cycles / chip.clock_hz(),
            busy,
            flops,
            transcendentals: trans,
            hbm_bytes,
            grid_steps: self.steps,
            class_timing: self.class_timing,
            class_steps: self.class_steps,
            dma_stall_cycles: self.t.stall,
            critical,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tpusim_kernel::{matmul, splash, MatmulConfig, SplashConfig};
    use tpusim_workload::{AttentionCall, MatmulCall};

    fn v6e() -> ChipModel {
        ChipModel::preset("v6e").unwrap()
    }

    #[test]
    fn busy_never_exceeds_total() {
        let chip = v6e();
        let w = AttentionCall::video_default();
        let p = splash::lower(&chip, &w, &SplashConfig::with_blocks(&w, &chip, 2048, 2048, None)).unwrap();
        let r = simulate(&chip, &p);
        for (n, u) in r.utilization().iter() {
            assert!((0.0..=1.0 + 1e-9).contains(&u), "{n} {u}");
        }
        assert!(r.cycles > 0.0);
    }

    #[test]
    fn body_schedule_overlaps_units() {
        let chip = v6e();
        let w = AttentionCall::video_default();
        let p = splash::lower(&chip, &w, &SplashConfig::with_blocks(&w, &chip, 2048, 2048, None)).unwrap();
        let t = schedule_body(&chip, &p.classes[1].body);
        let serial = t.busy.total();
        let longest = Unit::COMPUTE.iter().map(|&u| t.busy[u]).fold(0.0, f64::max);
        assert!(t.cycles < serial, "no overlap: {} vs {serial}", t.cycles);
        assert!(t.cycles >= longest);
    }

    #[test]
    fn critical_path_sums_to_total() {
        let chip = v6e();
        let w = AttentionCall::video_default();
        let p = splash::lower(&chip, &w, &SplashConfig::with_blocks(&w, &chip, 2048, 2048, None)).unwrap();
        let r = simulate(&chip, &p);
        let sum: f64 = r.critical.total();
        assert!((sum / r.cycles - 1.0).abs() < 1e-9, "{sum} vs {}", r.cycles);
        for t in &r.class_timing {
            let s: f64 = t.critical.total();
            assert!((s - t.cycles).abs() < 1e-6 * t.cycles.max(1.0), "{s} vs {}", t.cycles);
        }
    }

    #[test]
    fn steady_state_fast_path_equals_step_by_step() {
        let chip = v6e();
        let cases: Vec<(AttentionCall, SplashConfig)> = ["full", "causal", "band:3000+sink:700", "local:2000,0"]
            .iter()
            .flat_map(|m| {
                [tpusim_kernel::Traversal::Compact, tpusim_kernel::Traversal::FullGrid].into_iter().map(move |t| {
                    let mut w = AttentionCall::video_default();
                    w.q_len = 12_000;
                    w.kv_len = 12_000;
                    w.q_heads = 3;
                    w.kv_heads = 3;
                    w.mask = tpusim_workload::Mask::parse(m).unwrap();
                    let mut c = SplashConfig::with_blocks(&w, &v6e(), 2048, 2048, None);
                    c.block_q = 1024;
                    c.block_kv = 512;
                    c.block_kv_compute = 512;
                    c.traversal = t;
                    c.masking = tpusim_kernel::Masking::Partial;
                    (w, c)
                })
            })
            .collect();
        for (w, c) in cases {
            let p = splash::lower(&chip, &w, &c).unwrap();
            let fast = simulate(&chip, &p);
            let slow = simulate_observed(&chip, &p, &mut |_, _| {});
            assert_eq!(fast.grid_steps, slow.grid_steps);
            assert_eq!(fast.class_steps, slow.class_steps);
            assert_eq!(fast.hbm_bytes, slow.hbm_bytes);
            for (a, b) in [(fast.cycles, slow.cycles), (fast.dma_stall_cycles, slow.dma_stall_cycles), (fast.critical[Unit::Hbm], slow.critical[Unit::Hbm]), (fast.critical[Unit::StepControl], slow.critical[Unit::StepControl])] {
                assert!((a - b).abs() <= 1e-9 * b.abs().max(1.0), "{} {:?}: fast {a} vs step-by-step {b}", w.mask, c.traversal);
            }
        }
        // A DMA-latency-bound matmul (every step waits for its prefetch) also reaches a steady state.
        let chip5 = ChipModel::preset("v5e").unwrap();
        let mm = MatmulCall { m: 1024, n: 1024, k: 4096 };
        let p = matmul::lower(&chip5, &mm, &MatmulConfig::blocks(128, 128, 128)).unwrap();
        let fast = simulate(&chip5, &p);
        let slow = simulate_observed(&chip5, &p, &mut |_, _| {});
        assert!((fast.cycles - slow.cycles).abs() <= 1e-9 * slow.cycles);
    }

    #[test]
    fn repeated_heads_fold_exactly() {
        let chip = v6e();
        let masks = ["full", "causal", "band:2000+sink:300", "per-head[3*causal;5*band:900]", "per-head[2*full;2*local:700,0;4*sink:64]"];
        for (mask, batch, heads, kv_heads, len, bkv) in [
            (0usize, 3u64, 8u64, 8u64, 6000u64, 512u64),
            (1, 2, 8, 2, 5000, 1024),
            (2, 4, 4, 1, 4000, 512),
            (3, 2, 8, 4, 3000, 512),
            (4, 3, 8, 8, 2048, 2048),
            (0, 5, 4, 2, 1000, 1024), // one kv tile per row with GQA: the kv copy is elided across heads
        ] {
            let mut w = AttentionCall::video_default();
            w.batch = batch;
            w.q_heads = heads;
            w.kv_heads = kv_heads;
            w.q_len = len;
            w.kv_len = len;
            w.mask = tpusim_workload::Mask::parse(masks[mask]).unwrap();
            for t in [tpusim_kernel::Traversal::Compact, tpusim_kernel::Traversal::FullGrid] {
                let mut c = SplashConfig::with_blocks(&w, &chip, 2048, 2048, None);
                c.block_q = 512;
                c.block_kv = bkv;
                c.block_kv_compute = bkv.min(512);
                c.traversal = t;
                c.masking = tpusim_kernel::Masking::Partial;
                let p = splash::lower(&chip, &w, &c).unwrap();
                let fast = simulate(&chip, &p);
                let slow = simulate_observed(&chip, &p, &mut |_, _| {});
                assert_eq!(fast.grid_steps, slow.grid_steps, "{} {t:?}", masks[mask]);
                assert_eq!(fast.class_steps, slow.class_steps, "{} {t:?}", masks[mask]);
                assert_eq!(fast.hbm_bytes, slow.hbm_bytes, "{} {t:?}", masks[mask]);
                for (a, b) in [(fast.cycles, slow.cycles), (fast.dma_stall_cycles, slow.dma_stall_cycles), (fast.critical[Unit::StepControl], slow.critical[Unit::StepControl])] {
                    assert!((a - b).abs() <= 1e-9 * b.abs().max(1.0), "{} {t:?}: fast {a} vs step-by-step {b}", masks[mask]);
                }
            }
        }
    }

    #[test]
    fn matmul_flops_and_bytes() {
        let chip = ChipModel::preset("v5e").unwrap();
        let mm = MatmulCall { m: 2048, n: 2048, k: 2048 };
        let p = matmul::lower(&chip, &mm, &MatmulConfig::blocks(512, 1024, 1024)).unwrap();
        let r = simulate(&chip, &p);
        assert!((r.flops - mm.flops()).abs() < 1.0);
        // A large-block matmul is MXU-bound.
        assert_eq!(r.bottleneck(), Unit::Mxu);
    }

    #[test]
    fn more_bandwidth_is_never_slower() {
        let chip = v6e();
        let fast = chip.with_override("hbm.bandwidth_gb_per_s", "3276").unwrap();
        let mm = MatmulCall { m: 4096, n: 4096, k: 4096 };
        let cfg = MatmulConfig::blocks(128, 128, 128);
        let a = simulate(&chip, &matmul::lower(&chip, &mm, &cfg).unwrap()).cycles;
        let b = simulate(&fast, &matmul::lower(&fast, &mm, &cfg).unwrap()).cycles;
        assert!(b <= a, "{b} > {a}");
    }
}
