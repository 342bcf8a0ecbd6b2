//! Cycle-approximate simulation of a lowered kernel ([`tpusim_model::Program`]) on a chip model.
//!
//! Two levels:
//!
//! 1. **Inside a grid step** ([`body`]): the step's tile operations form a dependency graph
//!    (petgraph). They issue on the MXU, VPU, EUP and XLU in a static order, the compiler's list
//!    schedule of the body (whenever a unit can start work it takes the ready operation first in
//!    program order; computed once per body, then fixed): each unit runs one operation at a time,
//!    in that order; an operation starts when its inputs are done and its unit is free. An operation *occupies*
//!    its unit for its throughput time and its result is available a *latency* later (MXU: the
//!    chip's sourced result latency; VPU/EUP/XLU: their op latencies). Copies a kernel starts in
//!    its body run on the DMA engines the same way, queued behind the pipeline's step copies, and
//!    its waits for them on the scalar unit ([`op_cycles`]). Each distinct step body
//!    is turned once into a max-plus [`Transfer`]: its output times as max-plus forms of its
//!    input times.
//! 2. **Across grid steps** ([`simulate`]): the Pallas pipeline. Grid steps overlap (Mosaic
//!    software-pipelines consecutive steps): step i+1 begins issuing once step i has issued its
//!    last matmul (its *front*: the end of the last MXU operation's occupancy, or of the last
//!    operation in a body without matmuls, and no earlier than the body's last wait for the
//!    copies it starts itself), plus the fixed grid-step overhead on the scalar unit,
//!    and once its input DMAs have landed. Step i's drain (the last matmul's results, the softmax
//!    and accumulator updates that follow it) runs on while step i+1 starts. Its operations then wait for their units (still busy with step
//!    i's work) and for the carried state step i writes (the running max and o_acc of each slab,
//!    the dk/dv accumulators): the next step's QK matmul starts while the current step's softmax
//!    and PV are draining. The scalar unit's part of a step is the fixed grid-step overhead
//!    (`fitted.grid_step_overhead_cycles`) plus one issue (`fitted.dma_issue_ns`) per copy it
//!    starts (the next step's input blocks, this step's output blocks: the step's copy set from
//!    the declaration's copy rule, [`tpusim_model::copies`]). The next step's input DMAs are
//!    issued as step i starts (double buffering), once the buffer they fill is free (step i-1,
//!    which read it, is done); every copy's data starts moving `fitted.dma_latency_ns` after its
//!    issue (one latency per HBM leg) and moves at the sustained DMA bandwidth, one copy after
//!    another. Output blocks are written back once the step that completes them is done, sharing
//!    the bandwidth with the next step's input copies still moving (processor sharing: both at
//!    half the rate until one is done). So a step whose body outlasts its copies' round trip
//!    hides it entirely, and a step too short to hide it waits for its inputs: the exposed round
//!    trip (issue, latency, transfer) sets the pace of short steps (the public v6e
//!    microbenchmarks of a pipelined copy pin it, `models/v6e.toml`).
//!
//! **Megacore.** On a device with several TensorCores the grid's parallel units
//! ([`Program::core_ranges`]) are split over the cores; each core runs its share with its own
//! units and an equal share of the device's HBM bandwidth, and the kernel ends when the last
//! core does.
//!
//! Runs of identical grid steps ([`Program::for_each_run`]) are simulated step by step only until
//! the pipeline state shifts uniformly from one step to the next; since every time is a max-plus
//! expression of the previous step's times, the state then advances by the same amount every
//! step, and the rest of the run is added in one jump (equal to step-by-step simulation, tested).

pub mod body;

pub use body::{matmul_parts, mxu_type_factors, op_cycles, quantize, schedule_body, BodyTiming, OpTiming, Scratch, Transfer, UnitCycles, TIME_QUANTUM};

use serde::Serialize;
use tpusim_chip::ChipModel;
use tpusim_model::{Fusion, Lowered, Part, PerUnit, PhaseWork, Program, RunItem, Step, Unit};

/// One TensorCore's share of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CoreResult {
    /// Cycles until this core's last step and write-back ended.
    pub cycles: f64,
    /// Grid steps this core ran.
    pub grid_steps: u64,
    /// Busy cycles per unit on this core.
    pub busy: UnitCycles,
}

/// The outcome of simulating a program (`Default`: nothing ran).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SimResult {
    /// Total cycles from the first DMA issue to the last write-back (the slowest core).
    pub cycles: f64,
    /// Total time, seconds.
    pub seconds: f64,
    /// Busy cycles per unit, summed over cores.
    pub busy: UnitCycles,
    /// Executed matmul FLOPs: every matmul at its operands' tile-padded dimensions (contraction
    /// and output columns to 128 lanes, rows to 8: [`tpusim_model::Work::executed_flops`]),
    /// sequence padding and masked-out pairs of visited tiles included.
    pub flops: f64,
    /// The same matmuls at their own dimensions (2 m k n each): `flops` without the lane and row
    /// padding.
    pub useful_flops: f64,
    /// Executed exp/reciprocal elements.
    pub transcendentals: f64,
    /// Bytes moved between HBM and VMEM (both directions): each copy's block, in whole tiles
    /// where it is cut at an array's edge (`tpusim_model::copies`, the padding rule).
    pub hbm_bytes: u64,
    /// `hbm_bytes` counting only the elements inside the arrays (no edge tiles).
    pub useful_hbm_bytes: u64,
    /// Grid steps run.
    pub grid_steps: u64,
    /// Scheduled body of each step class alone (index = class id).
    pub class_timing: Vec<BodyTiming>,
    /// Steps run of each class.
    pub class_steps: Vec<u64>,
    /// Cycles step bodies waited for their input DMAs beyond the grid-step overhead (exposed DMA
    /// latency and bandwidth), on the slowest core.
    pub dma_stall_cycles: f64,
    /// The slowest core's critical path split by unit (sums to `cycles`): per step, the
    /// grid-step overhead (step_control; hbm when the step's input DMAs land after every earlier
    /// body is done: the overhead runs under them) with the wait for input DMAs beyond it (hbm),
    /// and the step's issue span split as its body's critical path, except the part after the
    /// next step's input copy was issued when that copy lands after this body is done and the
    /// overhead (hbm: the run waits on the copy, which the body overlaps); the final drain and
    /// write-back tail (the last body's units, or hbm).
    pub critical: UnitCycles,
    /// Per TensorCore (one entry on single-core devices).
    pub cores: Vec<CoreResult>,
}

impl SimResult {
    /// Busy fraction per unit (busy cycles / (total cycles x cores)).
    pub fn utilization(&self) -> PerUnit<f64> {
        let denom = self.cycles * self.cores.len().max(1) as f64;
        PerUnit(self.busy.0.map(|c| if denom > 0.0 { c / denom } else { 0.0 }))
    }

    /// The unit that bounds the run: the one with the largest share of the critical path
    /// ([`SimResult::critical`]), i.e. the unit the run waited on longest, whether for its
    /// throughput or its latency. Ties go to the unit busier per core. A unit can be busier than
    /// the bottleneck without bounding the run when its work overlaps other units' (front ends
    /// say so next to the label).
    pub fn bottleneck(&self) -> Unit {
        let cores = self.cores.len().max(1) as f64;
        let mut best = (Unit::Mxu, f64::NEG_INFINITY, f64::NEG_INFINITY);
        for ((u, b), (_, c)) in self.busy.iter().zip(self.critical.iter()) {
            let b = b / cores;
            if c > best.1 || (c == best.1 && b > best.2) {
                best = (u, c, b);
            }
        }
        best.0
    }
}

/// Per-step times from the pipeline, passed to an observer (for timelines). Times are absolute
/// cycles on the step's core.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepTiming {
    /// Grid step index on its core.
    pub index: u64,
    /// The TensorCore that ran it.
    pub core: u32,
    /// Cycle the step's scalar overhead started (after the previous step's issue end).
    pub overhead_start: f64,
    /// Cycles of the step's scalar-unit work from `overhead_start`: the grid-step overhead plus
    /// the issue of the copies it starts (the next step's inputs, its own write-backs; the first
    /// step's own inputs too, issued in the prologue); the engine's `busy.step_control` is the
    /// sum of these.
    pub scalar: f64,
    /// Cycle the step began issuing (overhead done, inputs landed).
    pub body_start: f64,
    /// Cycle the step's last result was ready.
    pub body_end: f64,
    /// Input DMA for this step: (end less its bytes at the full DMA rate, the end: its data in)
    /// if any bytes moved; a copy that shared the bandwidth started earlier than this.
    pub dma_in: Option<(f64, f64)>,
    /// Output DMA after this step: (end less its bytes at the full DMA rate, the end), if any.
    pub dma_out: Option<(f64, f64)>,
    /// Each operation's absolute times, in node order.
    pub ops: Vec<OpTiming>,
}

/// One phase of a lowered call, simulated.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PhaseResult {
    /// Which part of the call.
    pub part: Part,
    /// A kernel's name, or the fusion's.
    pub name: String,
    /// Its simulation (a fusion's as HBM time alone).
    pub result: SimResult,
}

/// Simulates an XLA data-movement fusion: its bytes read and written at the device's sustained
/// HBM bandwidth, plus one HBM round trip (read and write-back latency).
pub fn simulate_fusion(chip: &ChipModel, f: &Fusion) -> SimResult {
    let bytes = f.read_bytes + f.write_bytes;
    let bpc = chip.sustained_hbm_gb_per_s() * 1e9 / chip.clock_hz();
    let move_cycles = bytes as f64 / bpc;
    let cycles = move_cycles + 2.0 * chip.dma_latency_cycles();
    let mut busy = UnitCycles::default();
    busy[Unit::Hbm] = move_cycles;
    let mut critical = UnitCycles::default();
    critical[Unit::Hbm] = cycles;
    SimResult {
        cycles,
        seconds: cycles / chip.clock_hz(),
        busy,
        flops: 0.0,
        useful_flops: 0.0,
        transcendentals: 0.0,
        hbm_bytes: bytes,
        useful_hbm_bytes: bytes,
        grid_steps: 0,
        class_timing: Vec::new(),
        class_steps: Vec::new(),
        dma_stall_cycles: 0.0,
        critical,
        cores: vec![CoreResult { cycles, grid_steps: 0, busy }],
    }
}

/// Simulates every phase of a lowered call in order (they run one after another).
pub fn simulate_lowered(chip: &ChipModel, lowered: &Lowered) -> Vec<PhaseResult> {
    lowered
        .phases
        .iter()
        .map(|p| match &p.work {
            PhaseWork::Kernel(prog) => PhaseResult { part: p.part, name: prog.info.kernel.clone(), result: simulate(chip, prog) },
            PhaseWork::Fusion(f) => PhaseResult { part: p.part, name: f.name.clone(), result: simulate_fusion(chip, f) },
        })
        .collect()
}

/// Simulates a program on a chip (module docs).
pub fn simulate(chip: &ChipModel, program: &Program) -> SimResult {
    run_cores(chip, program, &mut |_, _| {}, false)
}

/// Simulates step by step, calling `observe(step, timing)` for every grid step of every core in
/// order (for timelines). Same result as [`simulate`].
pub fn simulate_observed(chip: &ChipModel, program: &Program, observe: &mut dyn FnMut(&Step, &StepTiming)) -> SimResult {
    run_cores(chip, program, observe, true)
}

/// A lower bound on [`simulate`]`(chip, program).cycles`, computed without scheduling any body:
/// the largest, over cores, of
///
/// * the grid-step overhead of every step plus the MXU occupancy of every step (a step begins
///   issuing no earlier than the previous step's front plus the overhead, and its matmuls run
///   one after another on the MXU from then on, so fronts advance by at least both; the run ends
///   no earlier than its last front);
/// * each of the VPU, EUP and XLU's total occupancy (each unit runs one operation at a time);
/// * the DMA engines' total transfer time (one DMA at a time at the core's sustained rate).
///
/// Occupancies are [`op_cycles`] quantised as the engine quantises them. Cost: one pass over
/// each class body's operations and over the program's runs (heads folded), O(operations +
/// runs); no list schedule, no transfer. Used by `tpusim tune` to skip configurations that
/// cannot rank (tested against [`simulate`] on every kernel family and megacore).
pub fn cycles_lower_bound(chip: &ChipModel, program: &Program) -> f64 {
    let busy: Vec<[f64; body::BODY_UNITS]> = program
        .classes
        .iter()
        .map(|c| {
            // A body's slabs repeat a few distinct works: each is costed once.
            let mut occupancy: rustc_hash::FxHashMap<body::WorkKey, f64> = Default::default();
            let mut b = [0.0; body::BODY_UNITS];
            for (w, n) in c.body.works() {
                // Whole quanta: n equal terms add up exactly as their product.
                b[w.unit().index()] += f64::from(n) * *occupancy.entry(body::WorkKey::of(&w)).or_insert_with(|| quantize(op_cycles(chip, &w).0));
            }
            b
        })
        .collect();
    let overhead = quantize(chip.fitted.grid_step_overhead_cycles.value);
    let ranges = program.core_ranges(chip.tensorcores());
    let bpc = chip.dma_bytes_per_cycle(ranges.len() as u32);
    // Per core: steps, unit occupancies (MXU, VPU, EUP, XLU) and DMA time (the steps' copies
    // and the bodies' own, which queue on the same engines).
    type Tally = (f64, [f64; 4], f64);
    let add = |t: &mut Tally, s: &Step, n: f64| {
        t.0 += n;
        let b = &busy[s.class as usize];
        for (a, b) in t.1.iter_mut().zip(b) {
            *a += n * b;
        }
        let c = program.copies_of(s);
        t.2 += n * (quantize(c.in_bytes as f64 / bpc) + quantize(c.out_bytes as f64 / bpc) + b[Unit::Hbm.index()]);
    };
    let mut bound = 0.0f64;
    for &(lo, hi) in &ranges {
        let (mut total, mut head): (Tally, Tally) = Default::default();
        program.for_each_run_block_range(lo, hi, &mut |item| match item {
            RunItem::HeadStart => head = Tally::default(),
            RunItem::Run(s, n) => {
                add(&mut total, s, n as f64);
                add(&mut head, s, n as f64);
            }
            RunItem::RepeatHead(k) => {
                let k = k as f64;
                total.0 += k * head.0;
                for (a, b) in total.1.iter_mut().zip(head.1) {
                    *a += k * b;
                }
                total.2 += k * head.2;
            }
        });
        let (steps, units, dma) = total;
        bound = bound.max(steps * overhead + units[0]).max(units[1]).max(units[2]).max(units[3]).max(dma);
    }
    bound
}

/// An observer of steps, and whether it watches (observed runs are simulated step by step).
type Observer<'o> = (&'o mut dyn FnMut(&Step, &StepTiming), bool);

fn run_cores(chip: &ChipModel, program: &Program, observe: &mut dyn FnMut(&Step, &StepTiming), watch: bool) -> SimResult {
    let ranges = program.core_ranges(chip.tensorcores());
    let active = ranges.len() as u32;
    let shared = Shared::new(chip, program);
    let mut cores = Vec::new();
    for (core, &(lo, hi)) in ranges.iter().enumerate() {
        let mut p = Pipeline::new(chip, &shared, core as u32, chip.dma_bytes_per_cycle(active));
        let mut obs: Observer<'_> = (&mut *observe, watch);
        if watch {
            program.for_each_run_range(lo, hi, &mut |s, n| {
                for i in 0..n {
                    let st = Step { coords: [s.coords[0], s.coords[1], s.coords[2] + i as u32, s.coords[3]], ..*s };
                    p.push(&st, &mut obs);
                }
            });
        } else {
            // Runs are fed to the pipeline a q row at a time (a row's runs share their head and
            // q block coordinates), so that rows seen before from the same state are replayed
            // from the row memo ([`Pipeline::row`]).
            let mut head: Vec<Vec<(Step, u64)>> = Vec::new();
            let mut row: Vec<(Step, u64)> = Vec::new();
            program.for_each_run_block_range(lo, hi, &mut |item| match item {
                RunItem::HeadStart => {
                    if !row.is_empty() {
                        p.row(&row, &mut obs);
                        row.clear();
                    }
                    head.clear();
                }
                RunItem::Run(s, n) => {
                    if row.first().is_some_and(|(f, _)| f.coords[..2] != s.coords[..2]) {
                        p.row(&row, &mut obs);
                        head.push(std::mem::take(&mut row));
                    }
                    row.push((*s, n));
                }
                RunItem::RepeatHead(k) => {
                    if !row.is_empty() {
                        p.row(&row, &mut obs);
                        head.push(std::mem::take(&mut row));
                    }
                    p.repeat_head(&head, k, &mut obs);
                }
            });
            if !row.is_empty() {
                p.row(&row, &mut obs);
            }
        }
        cores.push(p.finish(&mut obs));
    }
    shared.combine(chip, program, cores)
}

/// What every core's pipeline shares: the step classes' transfers and isolated schedules.
struct Shared {
    /// The program's copy sets ([`Step::copies`] indexes them).
    copies: std::sync::Arc<tpusim_model::copies::CopySets>,
    transfers: Vec<Transfer>,
    timing: Vec<BodyTiming>,
    /// Per class: its isolated critical path as fractions of its cycles.
    crit_share: Vec<UnitCycles>,
    carries: usize,
}

impl Shared {
    fn new(chip: &ChipModel, program: &Program) -> Self {
        let carries = program.classes.iter().map(|c| c.body.carries as usize).max().unwrap_or(0);
        let transfers: Vec<Transfer> = program.classes.iter().map(|c| Transfer::new(chip, &c.body, carries)).collect();
        let timing: Vec<BodyTiming> = transfers.iter().map(|t| t.isolated(false)).collect();
        let crit_share =
            timing.iter().map(|t| if t.cycles > 0.0 { t.critical.scaled(1.0 / t.cycles) } else { UnitCycles::default() }).collect();
        Shared { copies: program.copies.clone(), transfers, timing, crit_share, carries }
    }

    fn combine(self, chip: &ChipModel, program: &Program, cores: Vec<CoreState>) -> SimResult {
        let mut busy = UnitCycles::default();
        let mut class_steps = vec![0u64; program.classes.len()];
        let (mut in_b, mut out_b, mut useful_b, mut steps) = (0u64, 0u64, 0u64, 0u64);
        let slowest = cores.iter().enumerate().max_by(|a, b| a.1.cycles.total_cmp(&b.1.cycles)).map(|(i, _)| i).unwrap_or(0);
        let mut per_core = Vec::new();
        for c in &cores {
            busy.add_scaled(&c.busy, 1.0);
            for (i, n) in c.class_steps.iter().enumerate() {
                class_steps[i] += n;
            }
            in_b += c.in_bytes;
            out_b += c.out_bytes;
            useful_b += c.useful_bytes;
            steps += c.steps;
            per_core.push(CoreResult { cycles: c.cycles, grid_steps: c.steps, busy: c.busy });
        }
        let mut flops = 0.0;
        let mut useful_flops = 0.0;
        let mut trans = 0.0;
        let mut body_dma = 0u64;
        for (i, tr) in self.transfers.iter().enumerate() {
            let k = class_steps[i] as f64;
            flops += k * tr.flops();
            useful_flops += k * tr.useful_flops();
            trans += k * tr.transcendental_vregs() * 1024.0;
            body_dma += class_steps[i] * tr.dma_bytes();
        }
        let (cycles, critical, stall) = cores.get(slowest).map(|c| (c.cycles, c.critical, c.stall)).unwrap_or_default();
        SimResult {
            cycles,
            seconds: cycles / chip.clock_hz(),
            busy,
            flops,
            useful_flops,
            transcendentals: trans,
            hbm_bytes: in_b + out_b + body_dma,
            useful_hbm_bytes: useful_b + body_dma,
            grid_steps: steps,
            class_timing: self.timing,
            class_steps,
            dma_stall_cycles: stall,
            critical,
            cores: per_core,
        }
    }
}

/// The times one grid step advances: unit free times, carried slots, the issue front, the last
/// result, the HBM queue, the last write-back and the pending input DMA.
#[derive(Debug, Clone, PartialEq)]
struct Times {
    units: [f64; 4],
    carries: Vec<f64>,
    front: f64,
    done: f64,
    hbm_free: f64,
    out_done: f64,
    pending: Option<(f64, f64)>,
}

impl Times {
    /// Every time, flattened (pending DMA as two entries, or none).
    fn flat(&self) -> Vec<f64> {
        let mut v = self.units.to_vec();
        v.extend(&self.carries);
        v.extend([self.front, self.done, self.hbm_free, self.out_done]);
        if let Some((a, b)) = self.pending {
            v.extend([a, b]);
        }
        v
    }

    /// Adds `c` to every time that still matters (above `floor`); older ones can never bind again.
    fn shift(&mut self, c: f64, floor: f64) {
        let bump = |x: &mut f64| {
            if *x > floor {
                *x += c
            }
        };
        self.units.iter_mut().for_each(bump);
        self.carries.iter_mut().for_each(bump);
        for x in [&mut self.done, &mut self.hbm_free, &mut self.out_done] {
            bump(x);
        }
        self.front += c;
        if let Some((a, b)) = &mut self.pending {
            *a += c;
            *b += c;
        }
    }
}

/// Accumulated totals that a step adds to.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Totals {
    stall: f64,
    critical: UnitCycles,
}

/// Whether `after` is `before` shifted uniformly by `c` in every time that still matters: times
/// at or below both fronts cannot bind again (every operation starts after its step's front).
fn uniform_shift(before: &Times, after: &Times, c: f64) -> bool {
    let (b, a) = (before.flat(), after.flat());
    if b.len() != a.len() || before.pending.is_some() != after.pending.is_some() {
        return false;
    }
    b.iter().zip(&a).all(|(x, y)| y - x == c || (*x <= before.front && *y <= after.front && x == y))
}

/// Two transfers that share the DMA engines' bandwidth (processor sharing: while both move,
/// each at half the rate): each given as (data start, cycles it takes alone); returns their
/// end times. Times are whole quanta in, whole quanta out.
fn shared_pair((a0, wa): (f64, f64), (b0, wb): (f64, f64)) -> (f64, f64) {
    // The earlier one moves alone until the later starts, then they share.
    let (first, second, swapped) = if a0 <= b0 { ((a0, wa), (b0, wb), false) } else { ((b0, wb), (a0, wa), true) };
    let alone = (second.0 - first.0).max(0.0);
    let (e1, e2) = if first.1 <= alone {
        (first.0 + first.1, second.0 + second.1)
    } else {
        let r = first.1 - alone;
        let both = r.min(second.1);
        (second.0 + r + both, second.0 + second.1 + both)
    };
    if swapped {
        (e2, e1)
    } else {
        (e1, e2)
    }
}

/// The pipeline of one TensorCore (module docs, level 2).
struct Pipeline<'a> {
    shared: &'a Shared,
    core: u32,
    bpc: f64,
    lat_in: f64,
    lat_out: f64,
    overhead: f64,
    /// The scalar core's time to issue one DMA's descriptor, cycles.
    issue: f64,
    t: Times,
    tot: Totals,
    class_steps: Vec<u64>,
    busy: UnitCycles,
    in_bytes: u64,
    out_bytes: u64,
    /// The copies' own bytes, padding left out.
    useful_bytes: u64,
    steps: u64,
    /// The step whose inputs are in flight.
    next: Option<Step>,
    /// The last computed class run (for the drain at the end).
    last_class: Option<u32>,
    /// Whether the first DMA was issued.
    started: bool,
    x: Vec<f64>,
    scratch: Scratch,
    memo: StepMemo,
}

/// Transitions of the pipeline seen before in this run: a step's effect depends only on the
/// pipeline's state relative to its front (max-plus algebra: shifting every input time shifts
/// every output time), on the step's class and DMA bytes and on the next step's input bytes.
/// Times at or before the front cannot bind again (every operation starts after the step's
/// start, which is after the front) and enter the key as one value. Every cost is a multiple of
/// [`TIME_QUANTUM`], so times are exact binary fractions and relative times are exact: a
/// remembered transition replays exactly what simulating the step would give. The same holds for
/// whole runs of identical steps (their transient and steady step) and for whole q rows.
#[derive(Debug, Default)]
struct StepMemo {
    /// Key -> index into `outs`.
    map: std::collections::HashMap<Vec<i64>, usize, rustc_hash::FxBuildHasher>,
    outs: Vec<MemoOut>,
    /// The key being looked up (reused).
    key: Vec<i64>,
    /// Rows: key -> index into `row_outs`.
    row_map: std::collections::HashMap<Vec<i64>, usize, rustc_hash::FxBuildHasher>,
    row_outs: Vec<RowOut>,
    /// Runs: key -> index into `run_outs`.
    run_map: std::collections::HashMap<Vec<i64>, usize, rustc_hash::FxBuildHasher>,
    run_outs: Vec<RunOut>,
}

/// One step of a steady state: how far every time moves, and what the stall and the critical
/// path gain.
#[derive(Debug, Clone, Default)]
struct Steady {
    c: f64,
    stall: f64,
    critical: UnitCycles,
}

/// A remembered run: the state after its pending step and `transient` steps (relative to the
/// front it started from), and the steady step that repeats after them (`None`: the run ended
/// first, so the memo holds for runs of exactly that length).
#[derive(Debug, Clone, Default)]
struct RunOut {
    prefix: MemoOut,
    transient: u64,
    steady: Option<Steady>,
}

/// What [`Pipeline::run_steps`] saw: the state before the jump, the steps before it and the
/// steady step.
#[derive(Debug, Default)]
struct RunRecord {
    prefix: Option<(Times, Totals)>,
    transient: u64,
    steady: Option<Steady>,
}

/// A remembered q row: its times and what it adds to the counts.
#[derive(Debug, Clone, Default)]
struct RowOut {
    times: MemoOut,
    /// (class, steps) of the classes it ran.
    classes: Vec<(usize, u64)>,
    busy: UnitCycles,
    in_bytes: u64,
    out_bytes: u64,
    /// The copies' own bytes, padding left out.
    useful_bytes: u64,
    steps: u64,
    last_class: Option<u32>,
}

impl StepMemo {
    /// Quanta per cycle (relative times are whole numbers of quanta).
    const SCALE: f64 = 1.0 / TIME_QUANTUM;
    /// Entries kept before the memo starts over.
    const CAPACITY: usize = 1 << 14;
}

/// A remembered step transition: new values relative to the old front (`None`: unchanged).
#[derive(Debug, Clone, Default)]
struct MemoOut {
    units: [Option<f64>; 4],
    carries: Vec<Option<f64>>,
    done: Option<f64>,
    hbm_free: Option<f64>,
    out_done: Option<f64>,
    front: f64,
    pending: Option<(f64, f64)>,
    stall: f64,
    critical: UnitCycles,
}

/// A finished core.
struct CoreState {
    cycles: f64,
    busy: UnitCycles,
    critical: UnitCycles,
    stall: f64,
    class_steps: Vec<u64>,
    in_bytes: u64,
    out_bytes: u64,
    /// The copies' own bytes, padding left out.
    useful_bytes: u64,
    steps: u64,
}

impl<'a> Pipeline<'a> {
    fn new(chip: &ChipModel, shared: &'a Shared, core: u32, bpc: f64) -> Self {
        let n = shared.transfers.len();
        Pipeline {
            shared,
            core,
            bpc,
            lat_in: quantize(chip.dma_latency_cycles()),
            lat_out: quantize(chip.dma_latency_cycles()),
            overhead: quantize(chip.fitted.grid_step_overhead_cycles.value),
            issue: quantize(chip.dma_issue_cycles()),
            t: Times {
                units: [0.0; 4],
                carries: vec![0.0; shared.carries],
                front: 0.0,
                done: 0.0,
                hbm_free: 0.0,
                out_done: 0.0,
                pending: None,
            },
            tot: Totals::default(),
            class_steps: vec![0; n],
            busy: UnitCycles::default(),
            in_bytes: 0,
            out_bytes: 0,
            useful_bytes: 0,
            steps: 0,
            next: None,
            last_class: None,
            started: false,
            x: vec![0.0; body::IN_CARRIES + shared.carries],
            scratch: Scratch::default(),
            memo: StepMemo::default(),
        }
    }

    /// The copies of one step issued at `issue` (the scalar core has issued their
    /// descriptors): their data moves once the DMA latency has passed and the engines are free
    /// (module docs), one after another at the core's sustained bandwidth.
    fn transfer(&mut self, issue: f64, lat: f64, bytes: u64) -> (f64, f64) {
        self.started = true;
        let start = (issue + lat).max(self.t.hbm_free);
        let end = start + quantize(bytes as f64 / self.bpc);
        self.t.hbm_free = end;
        (start, end)
    }

    /// A step's write-backs issued at `issue`: their data moves once the DMA latency has passed,
    /// sharing the engines' bandwidth with the next step's input copies when those are still
    /// moving (both at half the rate until one is done: the engines interleave the copies in
    /// flight; work is conserved), so a step too short to hide its copies waits for its inputs
    /// and the write-back before it (module docs). Returns the write-back's data interval.
    fn write_back(&mut self, issue: f64, bytes: u64) -> (f64, f64) {
        self.started = true;
        let b0 = issue + self.lat_out;
        let wb = quantize(bytes as f64 / self.bpc);
        let Some((a0, a_end)) = self.t.pending.filter(|&(_, e)| e > b0) else {
            // Nothing else moving: the write-back queues behind what went before.
            let start = b0.max(self.t.hbm_free);
            self.t.hbm_free = start + wb;
            return (start, start + wb);
        };
        let (a_end, b_end) = shared_pair((a0, a_end - a0), (b0, wb));
        self.t.pending = Some((a0, a_end));
        self.t.hbm_free = self.t.hbm_free.max(a_end).max(b_end);
        (b0, b_end)
    }

    /// Feeds one step: the previous pending step runs, knowing this one (whose inputs it
    /// prefetches).
    fn push(&mut self, s: &Step, observe: &mut Observer<'_>) {
        match self.next.take() {
            None => {
                // The first step's inputs are issued at time 0 (the pipeline prologue).
                let c = self.shared.copies.get(s.copies);
                let (bytes, issue) = (c.in_bytes, f64::from(c.in_dmas) * self.issue);
                self.t.pending = (bytes > 0).then(|| self.transfer(issue, self.lat_in, bytes));
            }
            Some(p) => self.advance(&p, Some(s), observe),
        }
        self.next = Some(*s);
    }

    /// Runs step `cur` (its inputs in `t.pending`), issuing `next`'s input DMA. Unobserved
    /// steps go through the transition memo ([`StepMemo`]).
    fn advance(&mut self, cur: &Step, next: Option<&Step>, observe: &mut Observer<'_>) {
        if observe.1 {
            return self.advance_step(cur, next, observe);
        }
        self.memo_key(cur, next);
        if let Some(&i) = self.memo.map.get(self.memo.key.as_slice()) {
            let out = std::mem::take(&mut self.memo.outs[i]);
            self.replay_memo(&out, cur);
            self.memo.outs[i] = out;
            return;
        }
        let before = (self.t.clone(), self.tot);
        self.advance_step(cur, next, observe);
        let out = self.memo_out(&before.0, before.1);
        if self.memo.outs.len() >= StepMemo::CAPACITY {
            self.memo.map.clear();
            self.memo.outs.clear();
        }
        self.memo.map.insert(self.memo.key.clone(), self.memo.outs.len());
        self.memo.outs.push(out);
    }

    /// The pipeline state relative to its front, quantised ([`StepMemo`]), with what else
    /// decides the step's transition.
    fn memo_key(&mut self, cur: &Step, next: Option<&Step>) {
        let mut k = std::mem::take(&mut self.memo.key);
        k.clear();
        k.extend([i64::from(cur.class), i64::from(cur.copies), next.map_or(-1, |n| i64::from(n.copies))]);
        self.state_key(&mut k);
        self.memo.key = k;
    }

    /// Appends the pipeline's state relative to its front, quantised ([`StepMemo`]).
    fn state_key(&self, k: &mut Vec<i64>) {
        let f = self.t.front;
        let q = |v: f64| if v <= f { i64::MIN } else { ((v - f) * StepMemo::SCALE) as i64 };
        k.push(i64::from(self.started));
        k.push(self.t.pending.map_or(i64::MIN, |(_, e)| (((e - f).max(self.overhead)) * StepMemo::SCALE) as i64));
        k.extend(self.t.units.iter().map(|&v| q(v)));
        k.extend([q(self.t.done), q(self.t.hbm_free)]);
        k.extend(self.t.carries.iter().map(|&v| q(v)));
    }

    /// What a step changed, relative to the front it started from.
    fn memo_out(&self, before: &Times, tot: Totals) -> MemoOut {
        let f = before.front;
        let rel = |new: f64, old: f64| (new.to_bits() != old.to_bits()).then_some(new - f);
        MemoOut {
            units: std::array::from_fn(|u| rel(self.t.units[u], before.units[u])),
            carries: self.t.carries.iter().zip(&before.carries).map(|(&a, &b)| rel(a, b)).collect(),
            done: rel(self.t.done, before.done),
            hbm_free: rel(self.t.hbm_free, before.hbm_free),
            out_done: rel(self.t.out_done, before.out_done),
            front: self.t.front - f,
            pending: self.t.pending.map(|(a, b)| (a - f, b - f)),
            stall: self.tot.stall - tot.stall,
            critical: PerUnit(std::array::from_fn(|u| self.tot.critical.0[u] - tot.critical.0[u])),
        }
    }

    /// Applies a remembered transition to step `cur`.
    fn replay_memo(&mut self, out: &MemoOut, cur: &Step) {
        self.replay_times(out);
        if !self.shared.transfers[cur.class as usize].empty {
            self.last_class = Some(cur.class);
        }
        self.count(cur, 1);
    }

    /// Applies remembered times (relative to the current front).
    fn replay_times(&mut self, out: &MemoOut) {
        let f = self.t.front;
        let set = |x: &mut f64, r: Option<f64>| {
            if let Some(r) = r {
                *x = f + r;
            }
        };
        for (u, r) in out.units.iter().enumerate() {
            set(&mut self.t.units[u], *r);
        }
        for (c, r) in self.t.carries.iter_mut().zip(&out.carries) {
            set(c, *r);
        }
        set(&mut self.t.done, out.done);
        set(&mut self.t.hbm_free, out.hbm_free);
        set(&mut self.t.out_done, out.out_done);
        self.t.pending = out.pending.map(|(a, b)| (f + a, f + b));
        self.t.front = f + out.front;
        self.tot.stall += out.stall;
        self.tot.critical.add_scaled(&out.critical, 1.0);
        self.started = true;
    }

    /// Runs step `cur` on the transfers (no memo).
    fn advance_step(&mut self, cur: &Step, next: Option<&Step>, observe: &mut Observer<'_>) {
        let class = cur.class as usize;
        let tr = &self.shared.transfers[class];
        let cur_in = self.t.pending.take();
        let front = self.t.front;
        let prev_done = self.t.done;
        let ready = cur_in.map_or(front, |(_, e)| e);
        // The scalar core's work of the step: the fixed overhead and the descriptors of the copies
        // it starts (the next step's inputs, this step's write-backs).
        let next_c = next.map(|n| self.shared.copies.get(n.copies));
        let cur_c = self.shared.copies.get(cur.copies);
        let scalar = self.overhead + self.issue * f64::from(next_c.map_or(0, |c| c.in_dmas) + cur_c.out_dmas);
        let start = (front + scalar).max(ready);
        let waited = (ready - (front + scalar)).max(0.0);
        // The next step's inputs are issued as this step starts (double buffering).
        // Its buffer is the one the previous step read, so it also waits for that step to be done.
        // Inputs of one-buffer windows (`pl.Buffered(1)`) fill the buffer this step reads: they
        // are issued once its body is done (below).
        let buffer_free = start.max(self.t.done);
        let next_in = next_c.map_or(0, |c| c.in_bytes - c.in_bytes_sync);
        self.t.pending = (next_in > 0).then(|| self.transfer(buffer_free, self.lat_in, next_in));
        let (front_end, done) = if tr.empty {
            (start, start)
        } else {
            self.x[body::IN_START] = start;
            self.x[body::IN_UNITS..body::IN_UNITS + 4].copy_from_slice(&self.t.units);
            // The body's own copies queue on the DMA engines behind the steps' copies.
            self.x[body::IN_UNITS + Unit::Hbm.index()] = self.t.hbm_free;
            // The scalar unit's waits are ordered by the step's start alone.
            self.x[body::IN_UNITS + Unit::StepControl.index()] = 0.0;
            self.x[body::IN_CARRIES..].copy_from_slice(&self.t.carries);
            let mut units = [0.0; body::BODY_UNITS];
            let (e, d) = tr.apply(&self.x, &mut units, &mut self.t.carries, &mut self.scratch);
            self.t.units.copy_from_slice(&units[..4]);
            self.t.hbm_free = self.t.hbm_free.max(units[Unit::Hbm.index()]);
            (e, d)
        };
        let sync_in = next_c.map_or(0, |c| c.in_bytes_sync);
        if sync_in > 0 {
            let (a, b) = self.transfer(done, self.lat_in, sync_in);
            self.t.pending = Some(self.t.pending.map_or((a, b), |(a0, b0)| (a0.min(a), b0.max(b))));
        }
        let cur_out = cur_c.out_bytes;
        let dma_out = (cur_out > 0).then(|| self.write_back(done, cur_out));
        if let Some((_, e)) = dma_out {
            self.t.out_done = self.t.out_done.max(e);
        }
        self.t.done = self.t.done.max(done);
        // Critical path: this step's advance of the front.
        self.tot.stall += waited;
        // A step whose inputs land after every earlier body is done waits on their copy from
        // the front on (the copy was issued before, and the overhead runs under it); otherwise
        // the overhead is the path, and the wait beyond it the copy's.
        if waited > 0.0 && ready > prev_done {
            self.tot.critical[Unit::Hbm] += start - front;
        } else {
            self.tot.critical[Unit::Hbm] += waited;
            self.tot.critical[Unit::StepControl] += start - front - waited;
        }
        // The next step's inputs, issued at `buffer_free` while this body runs: when they land
        // after this body is done and the overhead, the run waits on that copy from its issue
        // on, so the part of this step's span after the issue is the DMA's, the rest its body's.
        let span = front_end - start;
        let dma_part = match self.t.pending {
            Some((_, end)) if end > done.max(front_end) + self.overhead => front_end - buffer_free.clamp(start, front_end),
            _ => 0.0,
        };
        self.tot.critical[Unit::Hbm] += dma_part;
        self.tot.critical.add_scaled(&self.shared.crit_share[class], span - dma_part);
        if observe.1 {
            let ops = if tr.empty { Vec::new() } else { tr.op_times(&self.x) };
            (observe.0)(
                cur,
                &StepTiming {
                    index: self.steps,
                    core: self.core,
                    overhead_start: front,
                    // The first step's also issues its own inputs (the pipeline's prologue).
                    scalar: scalar + if self.steps == 0 { self.issue * f64::from(cur_c.in_dmas) } else { 0.0 },
                    body_start: start,
                    body_end: done,
                    // Each copy as its work on the DMA engines, ending when its data is in: a copy
                    // that shared the bandwidth took longer, but the engines' busy time is its
                    // bytes at the full rate.
                    dma_in: cur_in.map(|(_, e)| (e - quantize(cur_c.in_bytes as f64 / self.bpc), e)),
                    dma_out: dma_out.map(|(_, e)| (e - quantize(cur_out as f64 / self.bpc), e)),
                    ops,
                },
            );
        }
        self.t.front = front_end;
        if !tr.empty {
            // The drain at the end is the last computed body's (skipped steps have none).
            self.last_class = Some(cur.class);
        }
        self.count(cur, 1);
    }

    fn count(&mut self, s: &Step, n: u64) {
        let c = s.class as usize;
        self.class_steps[c] += n;
        self.busy.add_scaled(&self.shared.timing[c].busy, n as f64);
        // The DMA engines are busy for the transfers' (quantised) times.
        let cs = self.shared.copies.get(s.copies);
        let (inb, outb) = (cs.in_bytes, cs.out_bytes);
        self.busy[Unit::Hbm] += n as f64 * (quantize(inb as f64 / self.bpc) + quantize(outb as f64 / self.bpc));
        // The scalar core: the step's overhead and the descriptors of its copies.
        self.busy[Unit::StepControl] += n as f64 * (self.overhead + self.issue * f64::from(cs.in_dmas + cs.out_dmas));
        self.in_bytes += n * inb;
        self.out_bytes += n * outb;
        self.useful_bytes += n * cs.useful_bytes;
        self.steps += n;
    }

    /// Feeds a run of `n` steps identical to `s` but for coordinates, jumping over its steady
    /// state (module docs). Through the run memo: a run of `s` entered before with the same
    /// pending step and state relative to the front ([`StepMemo`]) repeats that run's transient
    /// and, when it reached a steady state, jumps the rest whatever `n` is.
    fn run(&mut self, s: &Step, n: u64, observe: &mut Observer<'_>) {
        if n == 0 {
            return;
        }
        let Some(pending) = self.next.filter(|_| !observe.1) else {
            return self.run_steps(s, n, observe, None);
        };
        let mut key = std::mem::take(&mut self.memo.key);
        key.clear();
        key.extend([-2, i64::from(pending.class), i64::from(pending.copies)]);
        key.extend([i64::from(s.class), i64::from(s.copies)]);
        self.state_key(&mut key);
        if let Some(&i) = self.memo.run_map.get(key.as_slice()) {
            let out = &self.memo.run_outs[i];
            let fits = match out.steady {
                Some(_) => n > out.transient,
                None => n - 1 == out.transient,
            };
            if fits {
                self.memo.key = key;
                let out = std::mem::take(&mut self.memo.run_outs[i]);
                self.replay_run(&out, &pending, s, n);
                self.memo.run_outs[i] = out;
                return;
            }
        }
        let before = (self.t.clone(), self.tot);
        let mut record = RunRecord::default();
        self.run_steps(s, n, observe, Some(&mut record));
        // Only a run that reached its steady state (or that ran whole) can be replayed.
        if let Some(prefix) = record.prefix.take() {
            let prefix = {
                let now = std::mem::replace(&mut self.t, prefix.0);
                let tot = std::mem::replace(&mut self.tot, prefix.1);
                let out = self.memo_out(&before.0, before.1);
                self.t = now;
                self.tot = tot;
                out
            };
            let out = RunOut { prefix, transient: record.transient, steady: record.steady };
            if self.memo.run_outs.len() >= StepMemo::CAPACITY {
                self.memo.run_map.clear();
                self.memo.run_outs.clear();
            }
            self.memo.run_map.insert(key.clone(), self.memo.run_outs.len());
            self.memo.run_outs.push(out);
        }
        self.memo.key = key;
    }

    /// [`Pipeline::run`] step by step (with the steady-state jump), recording the transient and
    /// the steady shift in `record`.
    fn run_steps(&mut self, s: &Step, n: u64, observe: &mut Observer<'_>, mut record: Option<&mut RunRecord>) {
        self.push(s, observe);
        let mut remaining = n - 1;
        let mut advances = 0u64;
        while remaining > 0 {
            let before = (self.t.clone(), self.tot);
            let cur = self.next.take().expect("a step is pending");
            self.advance(&cur, Some(s), observe);
            self.next = Some(*s);
            remaining -= 1;
            advances += 1;
            if remaining > 0 {
                let pre = record.as_ref().map(|_| (self.t.clone(), self.tot));
                if let Some(shift) = self.jump(&before, remaining) {
                    // Steady state: every further step repeated this one's advance.
                    self.count(s, remaining);
                    remaining = 0;
                    if let Some(r) = record.as_deref_mut() {
                        *r = RunRecord { prefix: pre, transient: advances, steady: Some(shift) };
                    }
                }
            }
        }
        if let Some(r) = record {
            if r.prefix.is_none() {
                *r = RunRecord { prefix: Some((self.t.clone(), self.tot)), transient: advances, steady: None };
            }
        }
    }

    /// Applies a remembered run of `n` steps of `s` after `pending`.
    fn replay_run(&mut self, out: &RunOut, pending: &Step, s: &Step, n: u64) {
        self.replay_times(&out.prefix);
        for (st, k) in [(pending, 1), (s, out.transient)] {
            if k > 0 {
                if !self.shared.transfers[st.class as usize].empty {
                    self.last_class = Some(st.class);
                }
                self.count(st, k);
            }
        }
        if let Some(shift) = &out.steady {
            let m = n - 1 - out.transient;
            if m > 0 {
                self.shift_steady(shift, m);
                self.count(s, m);
            }
        }
        self.next = Some(*s);
    }

    /// Advances the state, stall and critical path by `m` steady steps.
    fn shift_steady(&mut self, shift: &Steady, m: u64) {
        let m = m as f64;
        let floor = self.t.front;
        self.t.shift(m * shift.c, floor - shift.c);
        self.tot.stall += m * shift.stall;
        self.tot.critical.add_scaled(&shift.critical, m);
    }

    /// If the pipeline's state moved uniformly since `before` (one step or one head replay),
    /// advances it, the stall and the critical path by `m` more such moves and returns the move
    /// (module docs: the steady-state jump); otherwise changes nothing.
    fn jump(&mut self, before: &(Times, Totals), m: u64) -> Option<Steady> {
        let c = self.t.front - before.0.front;
        if !(c > 0.0 && uniform_shift(&before.0, &self.t, c)) {
            return None;
        }
        let shift = Steady {
            c,
            stall: self.tot.stall - before.1.stall,
            critical: PerUnit(std::array::from_fn(|u| self.tot.critical.0[u] - before.1.critical.0[u])),
        };
        self.shift_steady(&shift, m);
        Some(shift)
    }

    /// Replays a head's rows `k` more times, jumping once a replay shifts the state uniformly.
    fn repeat_head(&mut self, head: &[Vec<(Step, u64)>], k: u64, observe: &mut Observer<'_>) {
        let mut remaining = k;
        while remaining > 0 {
            let before = (self.t.clone(), self.tot);
            let counts_before = (self.class_steps.clone(), self.busy, self.in_bytes, self.out_bytes, self.steps, self.useful_bytes);
            for row in head {
                self.row(row, observe);
            }
            remaining -= 1;
            if remaining > 0 && self.jump(&before, remaining).is_some() {
                let m = remaining as f64;
                let r = remaining;
                for (a, b) in self.class_steps.iter_mut().zip(&counts_before.0) {
                    *a += (*a - b) * r;
                }
                let db = PerUnit(std::array::from_fn(|u| self.busy.0[u] - counts_before.1 .0[u]));
                self.busy.add_scaled(&db, m);
                self.in_bytes += (self.in_bytes - counts_before.2) * r;
                self.out_bytes += (self.out_bytes - counts_before.3) * r;
                self.steps += (self.steps - counts_before.4) * r;
                self.useful_bytes += (self.useful_bytes - counts_before.5) * r;
                remaining = 0;
            }
        }
    }

    /// Feeds one q row's runs ([`Pipeline::run`] each), through the row memo: a row whose runs
    /// (classes, DMA bytes, lengths) were fed before, with the same pending step and the same
    /// state relative to the front ([`StepMemo`]), repeats that row's effect.
    fn row(&mut self, row: &[(Step, u64)], observe: &mut Observer<'_>) {
        let Some(pending) = self.next.filter(|_| !observe.1) else {
            // The pipeline's first step starts at time 0 (not shift-invariant) and observed runs
            // are simulated step by step.
            for (s, n) in row {
                self.run(s, *n, observe);
            }
            return;
        };
        let mut key = std::mem::take(&mut self.memo.key);
        key.clear();
        key.push(row.len() as i64);
        for (s, n) in row {
            key.extend([i64::from(s.class), i64::from(s.copies), *n as i64]);
        }
        key.extend([i64::from(pending.class), i64::from(pending.copies)]);
        self.state_key(&mut key);
        if let Some(&i) = self.memo.row_map.get(key.as_slice()) {
            self.memo.key = key;
            let out = std::mem::take(&mut self.memo.row_outs[i]);
            self.replay_row(&out);
            self.memo.row_outs[i] = out;
            self.next = row.last().map(|(s, n)| Step { coords: [s.coords[0], s.coords[1], s.coords[2] + (*n - 1) as u32, s.coords[3]], ..*s });
            return;
        }
        let before = (self.t.clone(), self.tot);
        let counts = (self.class_steps.clone(), self.busy, self.in_bytes, self.out_bytes, self.steps, self.useful_bytes);
        for (s, n) in row {
            self.run(s, *n, observe);
        }
        let out = RowOut {
            times: self.memo_out(&before.0, before.1),
            classes: self.class_steps.iter().zip(&counts.0).enumerate().filter(|(_, (a, b))| a != b).map(|(c, (a, b))| (c, a - b)).collect(),
            busy: PerUnit(std::array::from_fn(|u| self.busy.0[u] - counts.1 .0[u])),
            in_bytes: self.in_bytes - counts.2,
            out_bytes: self.out_bytes - counts.3,
            steps: self.steps - counts.4,
            useful_bytes: self.useful_bytes - counts.5,
            last_class: self.last_class,
        };
        if self.memo.row_outs.len() >= StepMemo::CAPACITY {
            self.memo.row_map.clear();
            self.memo.row_outs.clear();
        }
        self.memo.row_map.insert(key.clone(), self.memo.row_outs.len());
        self.memo.row_outs.push(out);
        self.memo.key = key;
    }

    /// Applies a remembered row.
    fn replay_row(&mut self, out: &RowOut) {
        self.replay_times(&out.times);
        for &(c, n) in &out.classes {
            self.class_steps[c] += n;
        }
        self.busy.add_scaled(&out.busy, 1.0);
        self.in_bytes += out.in_bytes;
        self.out_bytes += out.out_bytes;
        self.useful_bytes += out.useful_bytes;
        self.steps += out.steps;
        if out.last_class.is_some() {
            self.last_class = out.last_class;
        }
    }

    fn finish(mut self, observe: &mut Observer<'_>) -> CoreState {
        if let Some(p) = self.next.take() {
            self.advance(&p, None, observe);
        }
        let body_end = self.t.done.max(self.t.front);
        // The last write-back lands when its transfer ends (its latency came before the data).
        let out_end = if self.out_bytes > 0 { self.t.out_done } else { 0.0 };
        let cycles = body_end.max(out_end);
        // The tail after the last issue: results draining (the last body's units), then the
        // write-back.
        let drain = body_end - self.t.front;
        if let Some(c) = self.last_class {
            self.tot.critical.add_scaled(&self.shared.crit_share[c as usize], drain);
        }
        self.tot.critical[Unit::Hbm] += cycles - body_end;
        CoreState {
            cycles,
            busy: self.busy,
            critical: self.tot.critical,
            stall: self.tot.stall,
            class_steps: self.class_steps,
            in_bytes: self.in_bytes,
            out_bytes: self.out_bytes,
            useful_bytes: self.useful_bytes,
            steps: self.steps,
        }
    }
}

#[cfg(test)]
mod tests;
