//! One grid step's body on the units: operation costs ([`op_cycles`]), the body scheduled alone
//! ([`schedule_body`], for per-class reports) and its max-plus transfer ([`Transfer`]): how the
//! times the body ends with depend on the times it starts with, which lets consecutive grid steps
//! overlap while each body is scheduled only once.

use petgraph::graph::NodeIndex;
use petgraph::Direction;
use std::sync::Arc;
use serde::Serialize;
use tpusim_chip::ChipModel;
use tpusim_model::{mxu::MxuType, DmaPath, PerUnit, StepBody, Unit, Work};

/// Cycles per unit ([`Unit`]): busy time or a share of the critical path. `hbm` is DMA transfer
/// time, `step_control` the grid-step overhead.
pub type UnitCycles = PerUnit<f64>;

/// Occupancy and latency in cycles of one piece of work on a chip.
///
/// * matmul m x k x n whose weights serve `m_total` streamed rows: folds = ceil(k / rows) x
///   ceil(n / columns); the whole product takes max(folds x m_total / A, ceil(folds / A) x rows)
///   cycles on A = count x passes arrays (a fold streams one bf16 row per cycle per array;
///   loading a fold's bf16 weights takes `rows` cycles and overlaps the previous stream; int8
///   and fp8 operands at the chip's factors for them: [`matmul_parts`]); an operation streaming m of
///   the m_total rows takes its m / m_total share. Latency: the chip's MXU result latency.
/// * vector: (ops + loaded-mask registers x loaded_mask_ops_per_vreg) / valu_vreg_ops_per_cycle;
///   latency: the ALU latency.
/// * transcendental: registers / eup_vregs_per_cycle; latency: the EUP latency.
/// * cross-lane: registers x xlu_cycles_per_vreg / count; latency: the XLU latency.
/// * a copy the body starts (`tpu.enqueue_dma`): the DMA engines are taken for the largest of
///   its bytes at the sustained bandwidth of one core of the device's TensorCores all streaming
///   (`hbm.dma_bandwidth_gb_per_s`, at most the device's peak over its cores), the scalar core's
///   issue (`fitted.dma_issue_ns`) and its share of the in-flight slots ((latency + transfer) /
///   `fitted.dmas_in_flight`, Little's law); its data lands issue + `fitted.dma_latency_ns` + transfer
///   after it starts (the result latency is that less the occupancy). Copies queue one after
///   another, so n copies of b bytes take about n x max(b / bandwidth, issue) + one latency, and
///   a copy waited for before the next starts takes issue + latency + transfer.
/// * a wait for copies: no time (it orders the body: [`tpusim_model::Work::DmaWait`]).
///
/// Vector, transcendental and cross-lane work is counted by lowering in (8,128)-register units of
/// 1024 elements; a chip whose registers hold `sublanes x lanes` elements needs
/// `1024 / (sublanes x lanes)` of its registers per unit.
pub fn op_cycles(chip: &ChipModel, work: &Work) -> (f64, f64) {
    let regs = |units: f64| units * 1024.0 / chip.vreg_elems();
    match *work {
        Work::Matmul { m, k, n, m_total, mxu_type } => {
            let (stream, load) = matmul_parts(chip, k, n, m_total, mxu_type);
            let occ = stream.max(load) * m as f64 / m_total.max(1) as f64;
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
        Work::Dma { bytes, path } => {
            let transfer = bytes as f64 / chip.dma_bytes_per_cycle(chip.tensorcores());
            // Each HBM leg its latency: an HBM-to-HBM copy's read, then its write; a copy between
            // on-chip memories takes a read's.
            let latency = match path {
                DmaPath::HbmToVmem | DmaPath::Local => chip.dma_latency_cycles(),
                DmaPath::VmemToHbm => chip.dma_latency_cycles(),
                DmaPath::HbmToHbm => 2.0 * chip.dma_latency_cycles(),
            };
            let issue = chip.dma_issue_cycles();
            let in_flight = (latency + transfer) / chip.fitted.dmas_in_flight.value.max(1.0);
            let occupancy = transfer.max(issue).max(in_flight);
            // The data lands issue + latency + transfer after the copy starts, however long it
            // holds the engines.
            (occupancy, (issue + latency + transfer - occupancy).max(0.0))
        }
        Work::DmaWait { .. } => (0.0, 0.0),
    }
}

/// A matmul type's (row rate, fold load time) against bf16's, from the chip model's
/// `mxu.*_row_rate_vs_bf16` and `mxu.*_fold_load_vs_bf16` (XLA's cadences); (1, 1) for bf16.
pub fn mxu_type_factors(chip: &ChipModel, t: MxuType) -> (f64, f64) {
    let x = &chip.mxu;
    match t {
        MxuType::Bf16 => (1.0, 1.0),
        MxuType::Int8 => (x.int8_row_rate_vs_bf16.value, x.int8_fold_load_vs_bf16.value),
        MxuType::Fp8 => (x.fp8_row_rate_vs_bf16.value, x.fp8_fold_load_vs_bf16.value),
    }
}

/// The two bounds of a whole matmul product on one TensorCore's MXUs, cycles: streaming its
/// `m_total` rows through `folds = ceil(k / rows) x ceil(n / columns)` weight folds, `folds x
/// m_total / (A x rate)`, and loading the folds, `ceil(folds / A) x rows x load` (one fold per
/// array at a time, a bf16 fold taking a cycle per array row), on `A = count x
/// passes_per_cycle` arrays; `rate` and `load` are the type's against bf16
/// ([`mxu_type_factors`]). The product takes the larger (loads overlap the previous fold's
/// stream).
pub fn matmul_parts(chip: &ChipModel, k: u64, n: u64, m_total: u64, t: MxuType) -> (f64, f64) {
    let rows = chip.mxu.rows.value as u64;
    let cols = chip.mxu.columns.value as u64;
    let arrays = chip.mxu_arrays();
    let (rate, load) = mxu_type_factors(chip, t);
    let folds = (k.div_ceil(rows) * n.div_ceil(cols)) as f64;
    (folds * m_total as f64 / (arrays * rate), (folds / arrays).ceil() * rows as f64 * load)
}

/// The resolution of simulated time, cycles (2^-16). The engine rounds every cost (operation
/// occupancy and latency, DMA transfer times and latencies, the grid-step overhead) to a whole
/// number of quanta, so that every time it computes is an exact binary fraction: adding and
/// comparing them is exact (below 2^37 cycles, about 80 s at 1.75 GHz), shifting every input of
/// a step shifts every output by exactly as much, and remembered transitions and steady-state
/// jumps are exact rather than close. The rounding moves a cost by at most half a quantum.
pub const TIME_QUANTUM: f64 = 1.0 / 65536.0;

/// `cycles` rounded to the nearest whole [`TIME_QUANTUM`].
pub fn quantize(cycles: f64) -> f64 {
    (cycles / TIME_QUANTUM).round() * TIME_QUANTUM
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

/// The list-scheduled issue order of a body's nodes given each distinct work's (unit,
/// occupancy, latency) in cycles (whole quanta; a node's work is `index.work_of`): whenever a unit can start an operation, it takes, among the operations whose inputs
/// are done by then, the one first in program order (the lowering's issue slot, then node
/// index); if none is ready it waits for the earliest. Computed once per body and compiled chip
/// ([`Plan`]), then fixed (a static VLIW schedule).
///
/// A what-if model (one with `--set` overrides) keeps the order of the model it was derived from
/// (`provenance.compiled_for`: the code compiled for the chip as read) and times it with its own
/// costs: list scheduling is not monotone (a faster unit can reorder a body and lengthen it,
/// Graham's scheduling anomalies), a fixed order is.
fn list_order(index: &Index, work_costs: &[(usize, f64, f64)]) -> Vec<usize> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let n = index.rank.len();
    // Times in whole quanta (every cost is a whole number of them: [`quantize`]), so sums and
    // comparisons are integer and exact, as their f64 forms are. Ready operations wait in heaps
    // ordered by their time rounded to 1/1024 cycle (64 quanta): `(q + 32) >> 6`, the rounding
    // of q / 64.
    let quanta = |t: f64| (t / TIME_QUANTUM) as u64;
    let fx = |q: u64| (q + 32) >> 6;
    let cost: Vec<(usize, u64, u64)> = work_costs.iter().map(|&(u, o, l)| (u, quanta(o), quanta(l))).collect();
    let cost_of = |i: usize| cost[index.work_of[i] as usize];
    let mut missing: Vec<u32> = (0..n).map(|i| index.pred_at[i + 1] - index.pred_at[i]).collect();
    let mut ready_at = vec![0u64; n];
    let mut free = [0u64; BODY_UNITS];
    let mut free_fx = [0u64; BODY_UNITS];
    // The units the body uses (the others' sets stay empty).
    let active: Vec<usize> = (0..BODY_UNITS).filter(|&u| index.unit.iter().any(|&x| usize::from(x) == u)).collect();
    // Per unit: operations whose inputs are scheduled, by ready time (then program order); and
    // those ready by the unit's free time, by program order (their rank in it, a set of bits).
    let mut pending: [BinaryHeap<Reverse<(u64, u32)>>; BODY_UNITS] = Default::default();
    let mut ready: [RankSet; BODY_UNITS] = Default::default();
    for &u in &active {
        ready[u] = RankSet::new(n);
    }
    let (rank, by_rank) = (&index.rank, &index.by_rank);
    for i in 0..n {
        if missing[i] == 0 {
            ready[usize::from(index.unit[i])].insert(rank[i]);
        }
    }
    let mut order = Vec::with_capacity(n);
    // Per unit: when it can start an operation (`None`: it has none). Only the units the last
    // step touched (the one that issued, those that received a successor) are looked at again;
    // the others' heaps and free times did not change.
    let mut cand: [Option<u64>; BODY_UNITS] = [None; BODY_UNITS];
    let mut dirty: u32 = active.iter().fold(0, |m, &u| m | 1 << u);
    while order.len() < n {
        for &u in &active {
            if dirty & 1 << u == 0 {
                continue;
            }
            while let Some(&Reverse((t, r))) = pending[u].peek() {
                if t > free_fx[u] {
                    break;
                }
                pending[u].pop();
                ready[u].insert(r);
            }
            cand[u] = if ready[u].len > 0 {
                Some(free[u])
            } else {
                pending[u].peek().map(|Reverse((t, _))| free[u].max(*t << 6))
            };
        }
        dirty = 0;
        // The unit that can start an operation first (the first in unit order on a tie).
        let mut best: Option<(u64, usize)> = None;
        for &u in &active {
            if let Some(start) = cand[u] {
                if best.is_none_or(|(b, _)| start < b) {
                    best = Some((start, u));
                }
            }
        }
        let (start, u) = best.expect("a body's graph is acyclic: some operation is always schedulable");
        let r = match ready[u].pop_min() {
            Some(r) => r,
            None => pending[u].pop().expect("a unit with a start time has an operation").0 .1,
        };
        let i = by_rank[r as usize] as usize;
        let (_, occ, lat) = cost_of(i);
        let start = start.max(ready_at[i]);
        free[u] = start + occ;
        free_fx[u] = fx(free[u]);
        let done = start + occ + lat;
        dirty |= 1 << u;
        for &j in &index.succ[index.succ_at[i] as usize..index.succ_at[i + 1] as usize] {
            let j = j as usize;
            if done > ready_at[j] {
                ready_at[j] = done;
            }
            missing[j] -= 1;
            if missing[j] == 0 {
                // Ready by the time its unit is free: straight to the unit's ready operations
                // (units' free times only grow, so it would be moved there next anyway).
                let (uj, t) = (usize::from(index.unit[j]), fx(ready_at[j]));
                dirty |= 1 << uj;
                if t <= free_fx[uj] {
                    ready[uj].insert(rank[j]);
                } else {
                    pending[uj].push(Reverse((t, rank[j])));
                }
            }
        }
        order.push(i);
    }
    order
}

/// `keys` ((issue slot << 20 | sequence) << 24 | node index) in increasing order: counted into
/// buckets by issue slot, in node order, which sorts them when sequence numbers grow with node
/// indices (the body builder's); sorted outright when they do not, or when the slots are spread
/// far wider than the nodes.
fn program_order(keys: &[u64]) -> Vec<u64> {
    let slot = |k: u64| (k >> 44) as usize;
    let slots = keys.iter().map(|&k| slot(k) + 1).max().unwrap_or(0);
    if slots > 4 * keys.len() + 64 {
        let mut sorted = keys.to_vec();
        sorted.sort_unstable();
        return sorted;
    }
    let mut at = vec![0u32; slots + 1];
    for &k in keys {
        at[slot(k) + 1] += 1;
    }
    for s in 0..slots {
        at[s + 1] += at[s];
    }
    let mut sorted = vec![0u64; keys.len()];
    for &k in keys {
        let p = &mut at[slot(k)];
        sorted[*p as usize] = k;
        *p += 1;
    }
    if !sorted.is_sorted() {
        sorted.sort_unstable();
    }
    sorted
}

/// A set of ranks below n (program-order positions): a bit per rank and a summary bit per word
/// of them, so the smallest is found by scanning one summary word per 4,096 ranks.
#[derive(Debug, Default)]
struct RankSet {
    words: Vec<u64>,
    summary: Vec<u64>,
    len: usize,
}

impl RankSet {
    fn new(n: usize) -> Self {
        let w = n.div_ceil(64);
        RankSet { words: vec![0; w], summary: vec![0; w.div_ceil(64)], len: 0 }
    }

    fn insert(&mut self, r: u32) {
        let w = r as usize >> 6;
        let bit = 1u64 << (r & 63);
        if self.words[w] & bit == 0 {
            self.words[w] |= bit;
            self.summary[w >> 6] |= 1 << (w & 63);
            self.len += 1;
        }
    }

    /// Removes and returns the smallest rank.
    fn pop_min(&mut self) -> Option<u32> {
        if self.len == 0 {
            return None;
        }
        let si = self.summary.iter().position(|&s| s != 0)?;
        let w = si * 64 + self.summary[si].trailing_zeros() as usize;
        let word = &mut self.words[w];
        let b = word.trailing_zeros();
        *word &= *word - 1;
        if *word == 0 {
            self.summary[si] &= !(1u64 << (w & 63));
        }
        self.len -= 1;
        Some((w * 64) as u32 + b)
    }
}

/// What a body is, independently of any chip: its distinct pieces of work (a body's slabs repeat
/// a few of them) and each node's, and its totals. Cached in the body's memo.
#[derive(Debug)]
struct Index {
    /// Distinct works, in order of first appearance.
    works: Vec<Work>,
    /// Index into `works` of each node.
    work_of: Vec<u32>,
    /// Nodes per distinct work.
    count: Vec<u32>,
    flops: f64,
    useful_flops: f64,
    transcendental_vregs: f64,
    dma_bytes: u64,
    /// The body's isolated schedules ([`Transfer::isolated`]), per order and costs.
    timings: tpusim_model::Memo,
    /// Applications of the body's transfers seen before, by every run sharing the body
    /// ([`Transfer::apply`]).
    applied: std::sync::Mutex<AppliedMemo>,
    /// Each node's position in program order (issue slot, then node index), and the node at
    /// each position.
    rank: Vec<u32>,
    by_rank: Vec<u32>,
    /// Successors of node i: `succ[succ_at[i] .. succ_at[i + 1]]` (compact arrays: the graph's
    /// own edge lists are walked many times per body and miss the cache).
    succ_at: Vec<u32>,
    succ: Vec<u32>,
    /// Predecessors of node i, likewise.
    pred_at: Vec<u32>,
    pred: Vec<u32>,
    /// Per node: unit index, carried slot read and written ([`NONE`] when none).
    unit: Vec<u8>,
    carry_in: Vec<u16>,
    carry_out: Vec<u16>,
}

/// Memo key of a body's [`Index`] (plans and timings use hashes of chip costs, which are never 0
/// in practice; the memo also tells values apart by type).
const INDEX_KEY: u64 = 0;

impl Index {
    fn of(body: &StepBody) -> Arc<Index> {
        assert!(body.counted.is_none(), "a body built for counting only has no order to simulate (tpusim_model::body::counting_only)");
        body.memo.get_or_insert_with(INDEX_KEY, || {
            let mut works: Vec<Work> = Vec::new();
            let mut count: Vec<u32> = Vec::new();
            let mut seen: std::collections::HashMap<WorkKey, u32, rustc_hash::FxBuildHasher> = Default::default();
            // A slab-split op's nodes come one after another with one work: the previous
            // node's is tried before the table.
            let mut last: Option<(WorkKey, u32)> = None;
            let work_of = body
                .graph
                .node_weights()
                .map(|op| {
                    let key = WorkKey::of(&op.work);
                    let id = match last {
                        Some((k, id)) if k == key => id,
                        _ => *seen.entry(key).or_insert_with(|| {
                            works.push(op.work);
                            count.push(0);
                            (works.len() - 1) as u32
                        }),
                    };
                    last = Some((key, id));
                    count[id as usize] += 1;
                    id
                })
                .collect();
            let g = &body.graph;
            let n = g.node_count();
            // From the edge list in one pass each way (walking each node's edge chain misses
            // the cache), each node's list newest edge first, as the graph's own neighbour
            // lists give them.
            let csr = |dir: Direction| {
                let ends = |e: &petgraph::graph::Edge<()>| match dir {
                    Direction::Outgoing => (e.source().index(), e.target().index() as u32),
                    Direction::Incoming => (e.target().index(), e.source().index() as u32),
                };
                let edges = g.raw_edges();
                let mut at = vec![0u32; n + 1];
                for e in edges {
                    at[ends(e).0 + 1] += 1;
                }
                for i in 0..n {
                    at[i + 1] += at[i];
                }
                let mut fill = at[1..].to_vec();
                let mut to = vec![0u32; edges.len()];
                for e in edges {
                    let (from, other) = ends(e);
                    fill[from] -= 1;
                    to[fill[from] as usize] = other;
                }
                (at, to)
            };
            let (succ_at, succ) = csr(Direction::Outgoing);
            let (pred_at, pred) = csr(Direction::Incoming);
            // Program-order keys, (issue slot << 24) | node index (bodies have far fewer than
            // 2^24 nodes).
            let keys: Vec<u64> = (0..n).map(|i| (g[NodeIndex::new(i)].issue << 24) | i as u64).collect();
            let sorted = program_order(&keys);
            let by_rank: Vec<u32> = sorted.iter().map(|&k| (k & ((1 << 24) - 1)) as u32).collect();
            let mut rank = vec![0u32; n];
            for (r, &i) in by_rank.iter().enumerate() {
                rank[i as usize] = r as u32;
            }
            Index {
                work_of,
                count,
                flops: body.executed_flops(),
                useful_flops: body.flops(),
                dma_bytes: body.dma_bytes(),
                transcendental_vregs: body.transcendental_vregs(),
                works,
                timings: tpusim_model::Memo::with_capacity(64),
                applied: Default::default(),
                rank,
                by_rank,
                succ_at,
                succ,
                pred_at,
                pred,
                unit: g.node_weights().map(|op| op.work.unit().index() as u8).collect(),
                carry_in: g.node_weights().map(|op| op.carry_in.unwrap_or(NONE)).collect(),
                carry_out: g.node_weights().map(|op| op.carry_out.unwrap_or(NONE)).collect(),
            }
        })
    }

    /// (unit, occupancy, latency) of each distinct work on `chip`, in whole [`TIME_QUANTUM`]s.
    fn costs(&self, chip: &ChipModel) -> Vec<(usize, f64, f64)> {
        self.works
            .iter()
            .map(|w| {
                let (occ, lat) = op_cycles(chip, w);
                (w.unit().index(), quantize(occ), quantize(lat))
            })
            .collect()
    }
}

/// Transfers applied before, keyed by the transfer's costs ([`Transfer`]'s key and carried
/// slots) and the inputs the body reads relative to the step's start, each clamped to it (whole
/// quanta; 0 at or before the start): the outputs the body writes, relative to the start. Every input is read
/// through a max with the start, so two applications with equal keys write outputs that differ
/// by exactly the difference of their starts (times are whole quanta: exact).
#[derive(Debug, Default)]
struct AppliedMemo {
    map: std::collections::HashMap<Vec<i64>, Box<[f64]>, rustc_hash::FxBuildHasher>,
}

impl AppliedMemo {
    /// Entries kept per body before the memo starts over.
    const CAPACITY: usize = 1 << 12;
}

/// A [`Work`] as a hashable key (its numbers by bit pattern).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum WorkKey {
    Matmul(u64, u64, u64, u64, MxuType),
    Vector(u64, u64),
    Transcendental(u64),
    CrossLane(u64),
    Dma(u64, DmaPath),
    DmaWait(bool),
}

impl WorkKey {
    pub(crate) fn of(w: &Work) -> Self {
        match *w {
            Work::Matmul { m, k, n, m_total, mxu_type } => WorkKey::Matmul(m, k, n, m_total, mxu_type),
            Work::Vector { ops, loaded_mask_vregs } => WorkKey::Vector(ops.to_bits(), loaded_mask_vregs.to_bits()),
            Work::Transcendental { vregs } => WorkKey::Transcendental(vregs.to_bits()),
            Work::CrossLane { vregs } => WorkKey::CrossLane(vregs.to_bits()),
            Work::Dma { bytes, path } => WorkKey::Dma(bytes, path),
            Work::DmaWait { queued } => WorkKey::DmaWait(queued),
        }
    }
}

/// A stable hash of a cost table (memo keys of plans and timings).
fn cost_key(tag: u64, costs: &[(usize, f64, f64)]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = rustc_hash::FxHasher::default();
    tag.hash(&mut h);
    for (u, o, l) in costs {
        (u, o.to_bits(), l.to_bits()).hash(&mut h);
    }
    // Never the index's key.
    h.finish() | 1
}

/// No slot (carry slots are below it).
const NONE: u16 = u16::MAX;

/// A body's issue order for one compiled chip with its dependencies in issue positions: what
/// [`Transfer`] replays. Depends on the compiled chip only through the order; cached in the
/// body's [`tpusim_model::Memo`].
#[derive(Debug)]
struct Plan {
    /// Node at each issue position.
    node: Vec<u32>,
    /// Dependencies of the positions, as positions: position p's end at `replay[p].deps_end`
    /// and start where p - 1's end ([`Plan::deps`]).
    deps: Vec<u32>,
    has_mxu: bool,
    /// Whether any position runs on each unit (MXU, VPU, EUP, XLU, the DMA engines, the scalar
    /// unit's waits).
    runs: [bool; BODY_UNITS],
    /// Each position's distinct work, unit and carried slots, packed for [`Transfer::apply`].
    replay: Vec<Replay>,
    /// The carried slots some position writes (the others pass their input through).
    writes: Vec<u16>,
    /// The inputs some position reads (the free times of the units it runs on, the carried
    /// slots and the DMA engines' free time its positions wait for), in increasing order.
    reads: Vec<u32>,
}

impl Plan {
    fn new(index: &Index, order: &[usize]) -> Plan {
        let n = order.len();
        let mut pos = vec![0usize; n];
        for (p, &i) in order.iter().enumerate() {
            pos[i] = p;
        }
        let mut plan = Plan {
            node: order.iter().map(|&i| i as u32).collect(),
            deps: Vec::with_capacity(index.pred.len()),
            has_mxu: index.unit.iter().any(|&u| usize::from(u) == Unit::Mxu.index()),
            runs: std::array::from_fn(|u| index.unit.iter().any(|&x| usize::from(x) == u)),
            replay: Vec::with_capacity(n),
            writes: Vec::new(),
            reads: Vec::new(),
        };
        for &i in order {
            plan.deps.extend(index.pred[index.pred_at[i] as usize..index.pred_at[i + 1] as usize].iter().map(|&d| pos[d as usize] as u32));
            let c = index.carry_in[i];
            // A wait for copies earlier steps started reads the DMA engines' free time at the
            // step's start (an input of the transfer) as it would a carried slot.
            let queued = matches!(index.works[index.work_of[i] as usize], Work::DmaWait { queued: true });
            plan.replay.push(Replay {
                work: index.work_of[i],
                deps_end: plan.deps.len() as u32,
                carry_in: if queued {
                    (IN_UNITS + Unit::Hbm.index()) as u32
                } else if c == NONE {
                    IN_START as u32
                } else {
                    (IN_CARRIES + usize::from(c)) as u32
                },
                carry_out: index.carry_out[i],
                unit: index.unit[i],
            });
        }
        plan.writes = plan.replay.iter().map(|r| r.carry_out).filter(|&c| c != NONE).collect();
        plan.writes.sort_unstable();
        plan.writes.dedup();
        plan.reads = (0..BODY_UNITS).filter(|&u| plan.runs[u]).map(|u| (IN_UNITS + u) as u32).collect();
        plan.reads.extend(plan.replay.iter().map(|r| r.carry_in).filter(|&c| c != IN_START as u32));
        plan.reads.sort_unstable();
        plan.reads.dedup();
        plan
    }

    /// The dependencies of position `p`, as positions.
    fn deps(&self, p: usize) -> &[u32] {
        let start = if p == 0 { 0 } else { self.replay[p - 1].deps_end as usize };
        &self.deps[start..self.replay[p].deps_end as usize]
    }
}

/// Schedules one step body alone: operations issue in the body's static order; each starts
/// when its inputs are done and its unit has finished the previous operation in that order (no
/// carried state pending, every unit free at 0). With a fixed order, every start time is a
/// max-plus expression of operation times, so making any unit faster never delays anything.
pub fn schedule_body(chip: &ChipModel, body: &StepBody) -> BodyTiming {
    Transfer::new(chip, body, 0).isolated(true)
}

/// The larger of two times (never NaN): one `maxsd`, where `f64::max`'s NaN rule costs several
/// instructions in [`Transfer::apply`]'s inner loop.
#[inline(always)]
fn fmax(a: f64, b: f64) -> f64 {
    if a > b {
        a
    } else {
        b
    }
}

/// Index of the step's start among a transfer's inputs.
pub const IN_START: usize = 0;
/// Index of the first unit's free time among a transfer's inputs (then VPU, EUP, XLU, the DMA
/// engines and the scalar unit).
pub const IN_UNITS: usize = 1;
/// Units a step body's operations occupy: the four compute units, the DMA engines (the copies a
/// kernel starts in its body) and the scalar unit (its waits for them), in [`Unit`] order
/// (`Unit::Hbm` is index 4, `Unit::StepControl` 5).
pub const BODY_UNITS: usize = 6;
/// Index of the first carried slot among a transfer's inputs.
pub const IN_CARRIES: usize = IN_UNITS + BODY_UNITS;

/// How a step body's end times depend on its start times: the body's fixed issue order (a plan,
/// cached per compiled chip) with this chip's operation costs.
///
/// Inputs: the step's start `S` (its scalar control done and its input DMAs landed), the times the
/// four compute units become free, and the times the carried-state slots were written. Outputs:
/// the new unit free times and carried-slot times, the body's *front* (when the next grid step may
/// begin issuing: the end of the body's last MXU operation's occupancy, or of its last operation
/// when it has no matmul, a copy it starts excepted: a copy in flight does not hold the next step
/// back; and no earlier than the body's last wait for copies, where the in-order TensorCore
/// stalls) and its *done* time (its last result). Every output is a max-plus
/// expression of the inputs: `max_j (a[out][j] + x_j)`; [`Transfer::apply`] evaluates it by
/// replaying the issue order, O(operations + dependencies).
///
/// Building one is O(distinct works) after the first time for a body and compiled chip: the order
/// and the dependency structure come from the body's memo, and costs are computed per distinct
/// work (the repeated slabs of a body share a few).
#[derive(Debug, Clone)]
pub struct Transfer {
    /// Carried slots of the body.
    pub carries: usize,
    index: Arc<Index>,
    plan: Arc<Plan>,
    /// (unit, occupancy, latency) per distinct work on the timing chip.
    costs: Vec<(usize, f64, f64)>,
    /// Memo key of the plan and of these costs (for the isolated schedule).
    key: u64,
    /// Whether the body has no operations (a skipped grid step).
    pub empty: bool,
}

/// One issue position as [`Transfer::apply`] replays it, packed: its distinct work (the index of
/// its costs), the end of its dependencies in the plan's list, the input it reads a carried slot
/// from ([`IN_START`] when none: a no-op in the max), the slot it writes ([`NONE`] when none)
/// and its unit.
#[derive(Debug, Clone, Copy)]
struct Replay {
    work: u32,
    deps_end: u32,
    carry_in: u32,
    carry_out: u16,
    unit: u8,
}

/// Reusable buffers for [`Transfer::apply`] (one per pipeline, so applying allocates nothing).
#[derive(Debug, Clone, Default)]
pub struct Scratch {
    done: Vec<f64>,
    /// The memo key being looked up ([`Transfer::apply`]).
    key: Vec<i64>,
}

impl Transfer {
    /// The transfer of `body` on `chip`, with `carries` carried slots (at least the body's).
    /// The issue order is the compiled chip's (`provenance.compiled_for`, else `chip`), taken
    /// from the body's memo when it was computed before.
    pub fn new(chip: &ChipModel, body: &StepBody, carries: usize) -> Self {
        let k = carries.max(body.carries as usize);
        let index = Index::of(body);
        let costs = index.costs(chip);
        let compiled = chip.provenance.compiled_for.as_deref().map(|c| index.costs(c));
        let order_costs = compiled.as_deref().unwrap_or(&costs);
        // The order depends on nothing but the compiled chip's costs of the distinct works.
        let plan_key = cost_key(1, order_costs);
        let plan = body.memo.get_or_insert_with(plan_key, || Plan::new(&index, &list_order(&index, order_costs)));
        let key = cost_key(plan_key, &costs);
        Transfer { carries: k, empty: plan.node.is_empty(), index, plan, costs, key }
    }

    /// Executed matmul FLOPs of one step of this body, at the operands' tile-padded dimensions
    /// ([`tpusim_model::Work::executed_flops`]).
    pub fn flops(&self) -> f64 {
        self.index.flops
    }

    /// The same matmuls' FLOPs at their own dimensions ([`tpusim_model::Work::flops`]).
    pub fn useful_flops(&self) -> f64 {
        self.index.useful_flops
    }

    /// Bytes the copies the body starts itself move, per step of this body.
    pub fn dma_bytes(&self) -> u64 {
        self.index.dma_bytes
    }

    /// Registers of exp / reciprocal work of one step of this body.
    pub fn transcendental_vregs(&self) -> f64 {
        self.index.transcendental_vregs
    }

    /// Applies the transfer to inputs `x` (length [`IN_CARRIES`]` + carries`): writes the new unit
    /// free times (compute units, the DMA engines, the scalar unit) into `units` and carried times into
    /// `carries_out`; returns (front, done). Replays the
    /// issue order: each operation starts when its unit is free, its inputs are done and, for a
    /// carried slot it reads, the previous step wrote it.
    ///
    /// An application with the same inputs relative to the start as one before (by any run that
    /// shares the body and these costs: a sweep's points that differ only in copy or clock
    /// fields) takes its outputs from the body's memo instead, to the bit.
    pub fn apply(&self, x: &[f64], units: &mut [f64; BODY_UNITS], carries_out: &mut [f64], scratch: &mut Scratch) -> (f64, f64) {
        let plan = &*self.plan;
        let s0 = x[IN_START];
        let w = IN_CARRIES + self.carries;
        let mut key = std::mem::take(&mut scratch.key);
        key.clear();
        key.extend([self.key as i64, self.carries as i64]);
        key.extend(plan.reads.iter().map(|&j| x[j as usize]).map(|v| if v <= s0 { 0 } else { ((v - s0) / TIME_QUANTUM) as i64 }));
        // The outputs the body writes: its units' free times, its carried slots, front and done;
        // the others pass their inputs through.
        let written = |units: &mut [f64; BODY_UNITS], carries_out: &mut [f64], vals: &mut dyn FnMut() -> f64| {
            for u in 0..BODY_UNITS {
                units[u] = if plan.runs[u] { vals() } else { x[IN_UNITS + u] };
            }
            carries_out[..self.carries].copy_from_slice(&x[IN_CARRIES..w]);
            for &c in &plan.writes {
                carries_out[usize::from(c)] = vals();
            }
            (vals(), vals())
        };
        {
            let memo = self.index.applied.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(rel) = memo.map.get(&key) {
                let mut it = rel.iter();
                let out = written(units, carries_out, &mut || s0 + it.next().expect("one value per written output"));
                drop(memo);
                scratch.key = key;
                return out;
            }
        }
        let (front, done) = self.replay(x, units, carries_out, scratch);
        let mut rel: Vec<f64> = Vec::with_capacity(BODY_UNITS + plan.writes.len() + 2);
        rel.extend((0..BODY_UNITS).filter(|&u| plan.runs[u]).map(|u| units[u] - s0));
        rel.extend(plan.writes.iter().map(|&c| carries_out[usize::from(c)] - s0));
        rel.extend([front - s0, done - s0]);
        let mut memo = self.index.applied.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if memo.map.len() >= AppliedMemo::CAPACITY {
            memo.map.clear();
        }
        memo.map.insert(key.clone(), rel.into_boxed_slice());
        drop(memo);
        scratch.key = key;
        (front, done)
    }

    /// [`Transfer::apply`] by replaying the issue order.
    pub(crate) fn replay(&self, x: &[f64], units: &mut [f64; BODY_UNITS], carries_out: &mut [f64], scratch: &mut Scratch) -> (f64, f64) {
        let plan = &*self.plan;
        let n = plan.node.len();
        if scratch.done.len() < n {
            scratch.done.resize(n, 0.0);
        }
        let done = &mut scratch.done[..n];
        let deps = &plan.deps[..];
        carries_out[..self.carries].copy_from_slice(&x[IN_CARRIES..IN_CARRIES + self.carries]);
        let s0 = x[IN_START];
        let mut uf: [f64; BODY_UNITS] = std::array::from_fn(|u| x[IN_UNITS + u]);
        let mut last = s0;
        let mut at = 0usize;
        let costs = &self.costs[..];
        for (p, r) in plan.replay.iter().enumerate() {
            let u = usize::from(r.unit);
            let (_, occ, lat) = costs[r.work as usize];
            // A position without a carried input reads the start (a no-op in the max).
            let mut s = fmax(fmax(s0, uf[u]), x[r.carry_in as usize]);
            let end_deps = r.deps_end as usize;
            for &d in &deps[at..end_deps] {
                s = fmax(s, done[d as usize]);
            }
            at = end_deps;
            let end = s + occ;
            uf[u] = end;
            let d = end + lat;
            done[p] = d;
            if r.carry_out != NONE {
                carries_out[usize::from(r.carry_out)] = d;
            }
            last = fmax(last, d);
        }
        // A unit's operations end in issue order, so its last end is its new free time: the
        // front is the MXU's (or, without matmuls, any unit's that ran) last end.
        let front = if plan.has_mxu {
            // The TensorCore issues in order: the next step also waits for the body's last wait.
            let w = Unit::StepControl.index();
            if plan.runs[w] {
                fmax(uf[Unit::Mxu.index()], uf[w])
            } else {
                uf[Unit::Mxu.index()]
            }
        } else {
            // A copy in flight does not hold the next step back (only a wait for it does).
            (0..BODY_UNITS).filter(|&u| plan.runs[u] && u != Unit::Hbm.index()).map(|u| uf[u]).fold(s0, f64::max)
        };
        *units = uf;
        (front, last)
    }

    /// Absolute operation times for inputs `x` (for timelines), in node order.
    pub fn op_times(&self, x: &[f64]) -> Vec<OpTiming> {
        let plan = &*self.plan;
        let n = plan.node.len();
        let mut out = vec![OpTiming { node: 0, unit: Unit::Mxu, start: 0.0, end: 0.0 }; n];
        let mut units: [f64; BODY_UNITS] = std::array::from_fn(|u| x[IN_UNITS + u]);
        let mut done = vec![0.0; n];
        for p in 0..n {
            let r = plan.replay[p];
            let u = usize::from(r.unit);
            let mut s = x[IN_START].max(units[u]);
            for &d in plan.deps(p) {
                s = s.max(done[d as usize]);
            }
            s = s.max(x[r.carry_in as usize]);
            let (_, occ, lat) = self.costs[r.work as usize];
            let end = s + occ;
            units[u] = end;
            done[p] = end + lat;
            let node = plan.node[p] as usize;
            out[node] = OpTiming { node, unit: Unit::ALL[u], start: s, end };
        }
        out
    }

    /// The body scheduled alone ([`schedule_body`]); `ops` keeps the per-operation times. Without
    /// them the timing is memoised per body, order and costs (sweeps over HBM rates reuse it).
    pub(crate) fn isolated(&self, ops: bool) -> BodyTiming {
        if ops {
            return self.schedule_alone(true);
        }
        BodyTiming::clone(&self.index.timings.get_or_insert_with(self.key, || self.schedule_alone(false)))
    }

    fn schedule_alone(&self, ops: bool) -> BodyTiming {
        let plan = &*self.plan;
        let n = plan.node.len();
        let mut t = BodyTiming::default();
        if n == 0 {
            return t;
        }
        let mut unit_free = [0.0f64; BODY_UNITS];
        let mut last_on_unit = [usize::MAX; BODY_UNITS];
        let mut cause = vec![usize::MAX; n];
        let mut done = vec![0.0f64; n];
        let mut starts = vec![0.0f64; n];
        if ops {
            t.ops = vec![OpTiming { node: 0, unit: Unit::Mxu, start: 0.0, end: 0.0 }; n];
        }
        for p in 0..n {
            let r = plan.replay[p];
            let u = usize::from(r.unit);
            let (mut ready, mut binding) = (0.0f64, usize::MAX);
            for &d in plan.deps(p) {
                let d = d as usize;
                if done[d] >= ready {
                    ready = done[d];
                    binding = d;
                }
            }
            let (_, occ, lat) = self.costs[r.work as usize];
            let start = ready.max(unit_free[u]);
            cause[p] = if ready >= unit_free[u] { binding } else { last_on_unit[u] };
            let end = start + occ;
            unit_free[u] = end;
            last_on_unit[u] = p;
            done[p] = end + lat;
            starts[p] = start;
            t.cycles = t.cycles.max(done[p]);
            if ops {
                let node = plan.node[p] as usize;
                t.ops[node] = OpTiming { node, unit: Unit::ALL[u], start, end };
            }
        }
        for (w, &(u, occ, _)) in self.costs.iter().enumerate() {
            t.busy.0[u] += f64::from(self.index.count[w]) * occ;
        }
        // Walk the critical path back from the last result (ties: the highest node index).
        let mut cur = (0..n).max_by(|&a, &b| done[a].total_cmp(&done[b]).then(plan.node[a].cmp(&plan.node[b])));
        let mut mark = t.cycles;
        while let Some(p) = cur {
            t.critical.0[usize::from(plan.replay[p].unit)] += mark - starts[p];
            mark = starts[p];
            cur = (cause[p] != usize::MAX).then_some(cause[p]);
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Splash body with slab-split ops (program order far from node order).
    fn splash_body() -> StepBody {
        let chip = ChipModel::preset("v6e").unwrap();
        let w = tpusim_workload::AttentionCall::video_default();
        let c = tpusim_kernel::SplashConfig::with_blocks(1024, 512, None);
        let p = tpusim_kernel::splash::lower(&chip, &w, &c).unwrap();
        p.classes.iter().map(|c| c.body.clone()).max_by_key(|b| b.graph.node_count()).unwrap()
    }

    /// The index's successor and predecessor lists are the graph's neighbour lists, in their
    /// order; its ranks put the nodes in program order (issue key, then node index).
    #[test]
    fn the_index_holds_the_graph_and_program_order() {
        let body = splash_body();
        let g = &*body.graph;
        let index = Index::of(&body);
        assert!(g.node_count() > 200);
        for i in 0..g.node_count() {
            for (dir, at, list) in [(Direction::Outgoing, &index.succ_at, &index.succ), (Direction::Incoming, &index.pred_at, &index.pred)] {
                let want: Vec<u32> = g.neighbors_directed(NodeIndex::new(i), dir).map(|j| j.index() as u32).collect();
                assert_eq!(&list[at[i] as usize..at[i + 1] as usize], &want[..], "node {i} {dir:?}");
            }
        }
        let mut keys: Vec<(u64, usize)> = (0..g.node_count()).map(|i| (g[NodeIndex::new(i)].issue, i)).collect();
        keys.sort_unstable();
        assert_eq!(index.by_rank, keys.iter().map(|k| k.1 as u32).collect::<Vec<_>>());
        assert!(index.by_rank.iter().enumerate().all(|(r, &i)| index.rank[i as usize] == r as u32));
    }

    /// Program order by buckets equals a sort, for keys whose sequence numbers follow node
    /// order, keys that do not, and slots spread far wider than the nodes.
    #[test]
    fn program_order_equals_sorting() {
        let key = |slot: u64, seq: u64, i: u64| ((slot << 20 | seq) << 24) | i;
        let mut seed = 7u64;
        let mut next = move |n: u64| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        for case in 0..3 {
            let keys: Vec<u64> = (0..500u64)
                .map(|i| match case {
                    0 => key(next(40), i, i),
                    1 => key(next(40), next(500), i),
                    _ => key(next(1 << 18), i, i),
                })
                .collect();
            let mut want = keys.clone();
            want.sort_unstable();
            assert_eq!(program_order(&keys), want, "case {case}");
        }
        assert!(program_order(&[]).is_empty());
    }

    /// The rank set gives its ranks back smallest first, across summary words.
    #[test]
    fn rank_sets_pop_the_smallest() {
        let mut s = RankSet::new(10_000);
        for r in [9_999, 64, 4_096, 0, 63, 4_095, 64] {
            s.insert(r);
        }
        let popped: Vec<u32> = std::iter::from_fn(|| s.pop_min()).collect();
        assert_eq!(popped, [0, 63, 64, 4_095, 4_096, 9_999]);
        s.insert(5);
        assert_eq!((s.pop_min(), s.pop_min()), (Some(5), None));
    }
}
