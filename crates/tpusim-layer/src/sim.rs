//! Simulating a layer: each op on the chip model, then the ops in program order on two
//! resources, the TensorCore and the ICI.
//!
//! * **Matmuls**: the kernel crate's `xla-matmul` family (XLA's dot modelled as a blocked matmul
//!   on the MXUs; the `XLA-MM-v6e-*` calibration rows pin its efficiency), lowered and simulated
//!   by the engine. Its tiles are the family's default size at most, balanced over the
//!   dimension (the fewest tiles that pad it by at most 1%: a 18,900-row operand as 10 tiles of
//!   1,896 rows, not 10 of 2,048 with 8% padding); the (8, 128) rules round them up; on a chip
//!   whose VMEM the tiling overflows, the output tiles are halved until it fits.
//! * **Attention**: the Splash simulation of the kernel crate and engine, through the job layer
//!   (`tpusim_report::run`), exactly as `tpusim run` runs the same call and kernel options.
//! * **Fusions**: `tpusim_engine::simulate_fusion` (bytes read and written at the sustained HBM
//!   bandwidth plus one HBM round trip of latency).
//! * **Collectives**: [`crate::topology::time_collective`] on the chip group's box.
//!
//! **Schedule.** Ops issue in program order, each when its inputs are done and its resource is
//! free: TensorCore ops one at a time (XLA runs one op at a time on a core), collectives one at a
//! time on the ICI, concurrently with compute (XLA's asynchronous collectives) unless `overlap`
//! is off, when everything shares one queue. Identical ops (the q, k and v projections, ...)
//! are simulated once.
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
use tpusim_kernel::{matmul, Fusion, Kernel, MatmulConfig, PerUnit, Unit};
use tpusim_workload::MatmulCall;

/// One op's simulated cost.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpCost {
    /// Time, seconds.
    pub seconds: f64,
    /// Useful matmul FLOPs (2 m n k; attention 2 (d + dv) per kept pair).
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

/// The matmul tiling used for XLA's dot (module docs): per dimension the family default at most;
/// the fewest tiles (from ceil(dim / default) up to twice that) that pad the dimension by at most
/// 1%, or the least padding if none does; rounded up to `unit`.
pub fn balanced_block(dim: u64, default: u64, unit: u64) -> u64 {
    let t0 = dim.div_ceil(default).max(1);
    let mut best = (u64::MAX, default);
    for t in t0..=2 * t0 {
        let b = dim.div_ceil(t).next_multiple_of(unit).min(dim.next_multiple_of(unit));
        let padded = b * dim.div_ceil(b);
        if padded * 100 <= dim * 101 {
            return b;
        }
        if padded < best.0 {
            best = (padded, b);
        }
    }
    best.1
}

/// The XLA matmul configuration of a matmul (module docs), with output tiles at most
/// `cap_m` x `cap_n` (the family's defaults, halved while the tiling overflows VMEM).
pub fn xla_matmul_config(chip: &tpusim_chip::ChipModel, mm: &MatmulCall, cap_m: u64, cap_n: u64) -> MatmulConfig {
    let d = Kernel::XlaMatmul.defaults().blocks;
    let sub = u64::from(chip.vpu.sublanes.value);
    let lanes = u64::from(chip.vpu.lanes.value);
    MatmulConfig {
        kernel: Kernel::XlaMatmul,
        block_m: balanced_block(mm.m, cap_m, sub),
        block_n: balanced_block(mm.n, cap_n, lanes),
        block_k: balanced_block(mm.k, d.compute.unwrap_or(d.kv), lanes),
        vmem_limit_bytes: None,
    }
}

/// Lowers a matmul as XLA's dot: the family's tiles, halved (output rows, then columns) until
/// the tiling fits the chip's VMEM, as XLA always finds a tiling that fits.
///
/// # Errors
/// [`LayerError::Op`] when even 128 x 128 tiles do not fit, or the sizes are invalid.
pub fn lower_xla_matmul(
    chip: &tpusim_chip::ChipModel,
    mm: &MatmulCall,
    name: &str,
) -> Result<(MatmulConfig, tpusim_kernel::Program), LayerError> {
    let d = Kernel::XlaMatmul.defaults().blocks;
    let (mut cap_m, mut cap_n) = (d.q, d.kv);
    loop {
        let cfg = xla_matmul_config(chip, mm, cap_m, cap_n);
        match matmul::lower(chip, mm, &cfg) {
            Ok(p) => return Ok((cfg, p)),
            Err(tpusim_kernel::KernelError::Vmem { .. }) if cap_m > 128 || cap_n > 128 => {
                if cap_m >= cap_n {
                    cap_m /= 2;
                } else {
                    cap_n /= 2;
                }
            }
            Err(e) => return Err(LayerError::Op { op: name.into(), message: e.to_string() }),
        }
    }
}

fn from_sim(chip: &tpusim_chip::ChipModel, r: &SimResult, flops: f64, detail: String) -> OpCost {
    let s = 1.0 / chip.clock_hz();
    OpCost {
        seconds: r.seconds,
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
            let (cfg, prog) = lower_xla_matmul(chip, &mm, name)?;
            let r = simulate(chip, &prog);
            let detail = format!("{m} x {n} x {k}, tiles {} x {} x {}", cfg.block_m, cfg.block_n, cfg.block_k);
            Ok(from_sim(chip, &r, 2.0 * *m as f64 * *n as f64 * *k as f64, detail))
        }
        Work::Attention { call, kernel } => {
            let spec = kernel.overlay(&tpusim_report::JobSpec {
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
            let job = spec.build(chip).map_err(|e| err(tpusim_report::render_fields(&e.to_string(), tpusim_report::FieldStyle::Key)))?;
            let run = tpusim_report::run_with_dense(chip, &job, None)
                .map_err(|e| err(tpusim_report::render_fields(&e.to_string(), tpusim_report::FieldStyle::Key)))?;
            let info = &run.program.info;
            let flops = 2.0 * (call.head_dim + call.head_dim_v) as f64 * info.kept_pairs as f64;
            let blocks: Vec<String> = info.blocks.iter().map(|(_, v)| v.to_string()).collect();
            let detail = format!(
                "{} x {} heads x {} x {}, {} {}, mask {}",
                call.batch,
                call.q_heads,
                call.q_len,
                call.kv_len,
                job.kernel(),
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

/// Which queue an op issues on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Resource {
    /// The TensorCore.
    Core,
    /// The inter-chip interconnect.
    Ici,
}

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

/// Schedules ops with known costs (module docs).
pub fn schedule(plan: LayerPlan, graph: LayerGraph, costs: Vec<OpCost>) -> LayerResult {
    let overlap = plan.overlap;
    let mut sched: Vec<Scheduled> = Vec::with_capacity(costs.len());
    let (mut core_free, mut ici_free) = (0.0f64, 0.0f64);
    let mut breakdown = Breakdown::default();
    let (mut ici_busy, mut ici_exposed) = (0.0, 0.0);
    for (i, op) in graph.ops() {
        let deps = graph.deps(i);
        let ready = deps.iter().map(|d| sched[d.index()].end).fold(0.0, f64::max);
        let on_ici = op.work.on_ici() && overlap;
        let resource = if op.work.on_ici() { Resource::Ici } else { Resource::Core };
        let free = if on_ici { ici_free } else { core_free };
        let start = ready.max(free);
        let end = start + costs[i.index()].seconds;
        if op.work.on_ici() {
            ici_busy += costs[i.index()].seconds;
        }
        if on_ici {
            ici_free = end;
        } else {
            // A TensorCore op (or, without overlap, any op): its own time counts for its
            // category; a wait for a collective counts for the collective's.
            let gap = start - core_free;
            if gap > 0.0 {
                let waited = deps.iter().copied().max_by(|a, b| sched[a.index()].end.total_cmp(&sched[b.index()].end));
                if let Some(w) = waited {
                    breakdown.add(graph.graph[w].category, gap);
                    ici_exposed += gap;
                }
            }
            breakdown.add(op.category, end - start);
            if op.work.on_ici() {
                ici_exposed += end - start;
            }
            core_free = end;
        }
        sched.push(Scheduled { start, end, resource });
    }
    let last = sched.iter().map(|s| s.end).fold(0.0, f64::max);
    if last > core_free {
        // A collective ends after the last TensorCore op (a trailing exchange).
        if let Some((i, _)) = sched.iter().enumerate().max_by(|a, b| a.1.end.total_cmp(&b.1.end)) {
            breakdown.add(graph.graph[petgraph::graph::NodeIndex::new(i)].category, last - core_free);
            ici_exposed += last - core_free;
        }
    }
    LayerResult { plan, graph, costs, schedule: sched, seconds: last, breakdown, ici_busy, ici_exposed }
}
