//! Simulating a layer: each op on the chip model, then the ops in program order on two
//! resources, the TensorCore and the ICI.
//!
//! * **Matmuls**: XLA's dot as the kernel crate lowers it (`tpusim_kernel::matmul::lower_xla`:
//!   the `xla-matmul` family with balanced output tiles, halved until the tiling fits VMEM),
//!   simulated by the engine.
//! * **Attention**: the Splash simulation of the kernel crate and engine, through the job layer
//!   (`tpusim_job::run`), exactly as `tpusim run` runs the same call and kernel options.
//! * **Fusions**: `tpusim_engine::simulate_fusion` (bytes read and written at the sustained HBM
//!   bandwidth plus one HBM round trip of latency).
//! * **Collectives**: [`crate::topology::time_collective`] on the chip group's box; the
//!   TensorCore issues one DMA per message a device sends (`fitted.dma_issue_ns` each).
//!
//! **Schedule.** The slice crate's one schedule (`tpusim_slice::schedule`, which a jitted
//! program read from its StableHLO runs too): TensorCore ops one at a time in issue order, each
//! when its inputs are done; collectives moved to just after the op they read, issued from the
//! TensorCore and run one at a time on the ICI, concurrently with compute (XLA's asynchronous
//! collectives) unless `overlap` is off, when everything shares one queue. Identical ops (the
//! q, k and v projections, ...) are simulated once.
//!
//! **Breakdown.** The layer's latency is split by category so that the parts add up to it: a
//! TensorCore op counts its own time; a wait of the TensorCore for a collective counts for the
//! collective's category (its exposed time); collective time hidden under compute counts
//! nowhere (reported as `ici_hidden_ms`).

use crate::graph::{build, Category, LayerGraph, Work};
use crate::spec::LayerPlan;
use crate::topology::{time_collective, CollectiveTiming};
use crate::LayerError;
use serde::Serialize;
use std::collections::HashMap;
use tpusim_engine::{simulate, simulate_fusion, SimResult};
use tpusim_model::{Fusion, PerUnit, Unit};
use tpusim_slice::{issue_order, Queue, SliceOp};
use tpusim_workload::MatmulCall;

/// One op's simulated cost.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpCost {
    /// Time, seconds (a collective: on the ICI).
    pub seconds: f64,
    /// TensorCore time to issue a collective, seconds: one `fitted.dma_issue_ns` per message a
    /// device sends (0 for TensorCore ops).
    pub issue_seconds: f64,
    /// Useful matmul FLOPs (2 m n k; attention `tpusim_job::model_flops_per_pair` per kept pair).
    pub flops: f64,
    /// FLOPs the MXUs executed (padding and masked-out pairs of visited tiles included).
    pub executed_flops: f64,
    /// Bytes moved between HBM and VMEM.
    pub hbm_bytes: u64,
    /// Busy time per unit on the TensorCore, seconds (zero for collectives).
    pub busy_s: PerUnit<f64>,
    /// The unit that bounds a TensorCore op.
    pub bottleneck: Option<Unit>,
    /// A kernel's description (blocks, grid), for reports.
    pub detail: String,
    /// A collective's timing.
    pub collective: Option<CollectiveTiming>,
}

fn from_sim(chip: &tpusim_chip::ChipModel, r: &SimResult, flops: f64, detail: String) -> OpCost {
    let s = 1.0 / chip.clock_hz();
    OpCost {
        seconds: r.seconds,
        issue_seconds: 0.0,
        flops,
        executed_flops: r.flops,
        hbm_bytes: r.hbm_bytes,
        busy_s: PerUnit(r.busy.0.map(|c| c * s)),
        bottleneck: Some(r.bottleneck()),
        detail,
        collective: None,
    }
}

/// Simulates one op (module docs).
///
/// # Errors
/// [`LayerError`] from the kernel's lowering (block rules, VMEM, HBM capacity) or job building.
pub fn cost(plan: &LayerPlan, work: &Work, name: &str) -> Result<OpCost, LayerError> {
    let chip = &plan.chip;
    match work {
        Work::Matmul { m, n, k } => {
            let mm = MatmulCall { m: *m, n: *n, k: *k };
            let (cfg, prog) =
                tpusim_kernel::matmul::lower_xla(chip, &mm).map_err(|e| LayerError::Op { op: name.into(), message: e.to_string() })?;
            let r = simulate(chip, &prog);
            let detail = format!("{m} x {n} x {k}, tiles {} x {} x {}", cfg.block_m, cfg.block_n, cfg.block_k);
            Ok(from_sim(chip, &r, 2.0 * *m as f64 * *n as f64 * *k as f64, detail))
        }
        Work::Attention { call, kernel } => {
            let spec = kernel.overlay(&tpusim_job::JobSpec {
                batch: Some(call.batch),
                heads: Some(call.q_heads),
                kv_heads: Some(call.kv_heads),
                q_len: Some(call.q_len),
                kv_len: Some(call.kv_len),
                head_dim: Some(call.head_dim),
                head_dim_v: Some(call.head_dim_v),
                mask: Some(call.mask.to_string()),
                ..Default::default()
            });
            let err = |e: String| LayerError::Op {
                op: name.into(),
                message: format!("{e} (the self-attention kernels' options come from `dense_kernel` and `sparse_kernel` trace files)"),
            };
            let job = spec.build(chip).map_err(|e| err(tpusim_job::render_fields(&e.to_string(), tpusim_job::FieldStyle::Key)))?;
            let run = tpusim_job::run_with_dense(chip, &job, None)
                .map_err(|e| err(tpusim_job::render_fields(&e.to_string(), tpusim_job::FieldStyle::Key)))?;
            let info = &run.program.info;
            let flops = info.kept_pairs as f64 * tpusim_job::model_flops_per_pair(call, tpusim_kernel::Direction::Fwd);
            let blocks: Vec<String> = info.blocks.iter().map(|(_, v)| v.to_string()).collect();
            let detail = format!(
                "{} x {} heads x {} x {}, {} {}, mask {}",
                call.batch,
                call.q_heads,
                call.q_len,
                call.kv_len,
                job.kernel().map_or_else(|| run.program.info.kernel.clone(), |k| k.to_string()),
                blocks.join("/"),
                call.mask
            );
            Ok(from_sim(chip, &run.result, flops, detail))
        }
        Work::Fusion { read_bytes, write_bytes } => {
            let r = simulate_fusion(chip, &Fusion { name: name.into(), read_bytes: *read_bytes, write_bytes: *write_bytes });
            Ok(from_sim(chip, &r, 0.0, format!("{:.1} MB read, {:.1} MB written", *read_bytes as f64 / 1e6, *write_bytes as f64 / 1e6)))
        }
        Work::Collective(c) => {
            let t = time_collective(chip, &plan.group, *c);
            let detail = match c {
                crate::topology::Collective::AllToAll { bytes_per_pair } => {
                    format!("{:.1} MB to each of {} devices", *bytes_per_pair as f64 / 1e6, plan.ulysses - 1)
                }
                crate::topology::Collective::AllGather { bytes_per_device } => {
                    format!("{:.1} MB shard from each of {} devices", *bytes_per_device as f64 / 1e6, plan.ulysses)
                }
                crate::topology::Collective::Permute { bytes_per_device } => {
                    format!("{:.1} MB to the next of {} devices", *bytes_per_device as f64 / 1e6, plan.ulysses)
                }
            };
            Ok(OpCost {
                seconds: t.seconds,
                issue_seconds: c.messages_per_device(plan.group.devices()) as f64 * chip.fitted.dma_issue_ns.value * 1e-9,
                flops: 0.0,
                executed_flops: 0.0,
                hbm_bytes: 0,
                busy_s: PerUnit::default(),
                bottleneck: None,
                detail,
                collective: Some(t),
            })
        }
    }
}

/// Which queue an op issues on (the slice crate's [`Queue`]: `core` or `ici`).
pub type Resource = Queue;

/// An op's place in the schedule.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Scheduled {
    /// Start, seconds from the layer's start.
    pub start: f64,
    /// End, seconds.
    pub end: f64,
    /// Its queue.
    pub resource: Resource,
}

/// Time per breakdown category, seconds (or milliseconds in reports).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Breakdown {
    /// Self- and cross-attention kernels and routing.
    pub attention: f64,
    /// Projections.
    pub projections: f64,
    /// Feed-forward matmuls.
    pub feed_forward: f64,
    /// Element-wise fusions.
    pub elementwise: f64,
    /// Exposed all-to-all time.
    pub all_to_all: f64,
    /// Permutation gathers and exposed permutation exchanges.
    pub permutation: f64,
    /// Exposed weight all-gathers.
    pub weight_gather: f64,
}

impl Breakdown {
    /// The value of a category.
    pub fn get(&self, c: Category) -> f64 {
        match c {
            Category::Attention => self.attention,
            Category::Projections => self.projections,
            Category::FeedForward => self.feed_forward,
            Category::Elementwise => self.elementwise,
            Category::AllToAll => self.all_to_all,
            Category::Permutation => self.permutation,
            Category::WeightGather => self.weight_gather,
        }
    }

    fn slot(&mut self, c: Category) -> &mut f64 {
        match c {
            Category::Attention => &mut self.attention,
            Category::Projections => &mut self.projections,
            Category::FeedForward => &mut self.feed_forward,
            Category::Elementwise => &mut self.elementwise,
            Category::AllToAll => &mut self.all_to_all,
            Category::Permutation => &mut self.permutation,
            Category::WeightGather => &mut self.weight_gather,
        }
    }

    /// Adds `v` to a category.
    pub fn add(&mut self, c: Category, v: f64) {
        *self.slot(c) += v;
    }

    /// The sum over categories.
    pub fn total(&self) -> f64 {
        Category::ALL.iter().map(|&c| self.get(c)).sum()
    }

    /// Every value times `k`.
    pub fn scaled(&self, k: f64) -> Breakdown {
        let mut b = Breakdown::default();
        for &c in Category::ALL {
            b.add(c, self.get(c) * k);
        }
        b
    }
}

/// A simulated layer.
#[derive(Debug, Clone)]
pub struct LayerResult {
    /// What ran.
    pub plan: LayerPlan,
    /// Its ops.
    pub graph: LayerGraph,
    /// Each op's cost, in program order.
    pub costs: Vec<OpCost>,
    /// Each op's place in the schedule, in program order.
    pub schedule: Vec<Scheduled>,
    /// Layer latency on each chip, seconds.
    pub seconds: f64,
    /// The latency split by category (sums to `seconds`).
    pub breakdown: Breakdown,
    /// ICI busy time, seconds.
    pub ici_busy: f64,
    /// ICI time the TensorCore waited for, seconds.
    pub ici_exposed: f64,
}

impl LayerResult {
    /// Useful FLOPs of the layer on one chip.
    pub fn flops(&self) -> f64 {
        self.costs.iter().map(|c| c.flops).sum()
    }

    /// Executed FLOPs of the layer on one chip.
    pub fn executed_flops(&self) -> f64 {
        self.costs.iter().map(|c| c.executed_flops).sum()
    }

    /// HBM bytes of the layer on one chip.
    pub fn hbm_bytes(&self) -> u64 {
        self.costs.iter().map(|c| c.hbm_bytes).sum()
    }

    /// Attention's share of the layer time.
    pub fn attention_share(&self) -> f64 {
        self.breakdown.attention / self.seconds
    }

    /// The share of attention with its exchanges and the permutation (everything between the
    /// projections and the output projection).
    pub fn attention_with_exchange_share(&self) -> f64 {
        (self.breakdown.attention + self.breakdown.all_to_all + self.breakdown.permutation) / self.seconds
    }
}

/// Builds, simulates and schedules one block of `plan` (module docs).
///
/// # Errors
/// [`LayerError::Op`] naming the op whose kernel cannot run (VMEM, HBM capacity, block rules).
pub fn simulate_layer(plan: &LayerPlan) -> Result<LayerResult, LayerError> {
    let graph = build(plan);
    let mut cache: HashMap<String, OpCost> = HashMap::new();
    let mut costs = Vec::new();
    for (_, op) in graph.ops() {
        let key = format!("{:?}", op.work);
        let c = match cache.get(&key) {
            Some(c) => c.clone(),
            None => {
                let c = cost(plan, &op.work, &op.name)?;
                cache.insert(key, c.clone());
                c
            }
        };
        costs.push(c);
    }
    Ok(schedule(plan.clone(), graph, costs))
}

/// Schedules ops with known costs (module docs) and splits the latency by category: a
/// TensorCore op counts its own time, a collective its issue time; a wait of the TensorCore for
/// its inputs counts for the category of the input it waited for last (a collective's exposed
/// time); collective time hidden under compute counts nowhere.
pub fn schedule(plan: LayerPlan, graph: LayerGraph, costs: Vec<OpCost>) -> LayerResult {
    let overlap = plan.overlap;
    let ops: Vec<SliceOp> = graph
        .ops()
        .map(|(i, op)| SliceOp {
            queue: if op.work.on_ici() { Queue::Ici } else { Queue::Core },
            seconds: costs[i.index()].seconds,
            issue_seconds: costs[i.index()].issue_seconds,
            deps: graph.deps(i).iter().map(|d| d.index()).collect(),
        })
        .collect();
    let order = issue_order(&ops);
    let s = tpusim_slice::schedule(&ops, &order, overlap, 1.0, 1.0);
    let mut breakdown = Breakdown::default();
    let (mut ici_busy, mut ici_exposed) = (0.0, 0.0);
    for &i in &order {
        let op = &graph.graph[petgraph::graph::NodeIndex::new(i)];
        let (start, end) = s.spans[i];
        if ops[i].queue == Queue::Ici {
            ici_busy += ops[i].seconds;
        }
        let gap = s.core_waited[i];
        if gap > 0.0 {
            if let Some(&w) = ops[i].deps.iter().max_by(|a, b| s.spans[**a].1.total_cmp(&s.spans[**b].1)) {
                breakdown.add(graph.graph[petgraph::graph::NodeIndex::new(w)].category, gap);
                ici_exposed += gap;
            }
        }
        if ops[i].queue == Queue::Ici && overlap {
            // Its issue occupies the TensorCore (TensorCore time, not ICI time waited for).
            breakdown.add(op.category, ops[i].issue_seconds);
            continue;
        }
        breakdown.add(op.category, end - start);
        if ops[i].queue == Queue::Ici {
            ici_exposed += end - start - ops[i].issue_seconds;
        }
    }
    if s.seconds > s.core_seconds {
        // A collective ends after the last TensorCore op (a trailing exchange).
        if let Some((i, _)) = s.spans.iter().enumerate().max_by(|a, b| a.1 .1.total_cmp(&b.1 .1)) {
            breakdown.add(graph.graph[petgraph::graph::NodeIndex::new(i)].category, s.seconds - s.core_seconds);
            ici_exposed += s.seconds - s.core_seconds;
        }
    }
    let resource = |i: usize| ops[i].queue;
    let sched = s.spans.iter().enumerate().map(|(i, &(start, end))| Scheduled { start, end, resource: resource(i) }).collect();
    LayerResult { plan, graph, costs, schedule: sched, seconds: s.seconds, breakdown, ici_busy, ici_exposed }
}
