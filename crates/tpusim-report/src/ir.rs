//! Runs and reports of a Pallas kernel read from its Mosaic IR (a kernel description,
//! `tpusim-pallas`): the same engine as the hand-written kernels, a report with the same metrics
//! where they apply ([`KernelIrReport`]), and the fields of [`crate::Report`] it lacks named.

use crate::{bar, ClassSummary, CoreSummary, CostEstimate};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;
use tpusim_chip::ChipModel;
use tpusim_engine::{simulate, SimResult};
use tpusim_kernel::{PerUnit, Program, Unit};
use tpusim_pallas::desc::DeclaredCost;
use tpusim_pallas::{Description, IrFacts, PallasError};

/// A kernel description simulated.
#[derive(Debug, Clone)]
pub struct IrRun {
    /// The chip simulated.
    pub chip: ChipModel,
    /// The description.
    pub description: Description,
    /// Its lowering.
    pub program: Program,
    /// Facts of the lowering.
    pub facts: IrFacts,
    /// The simulation.
    pub result: SimResult,
}

/// Lowers a description (side files resolved in `dir`) and simulates it on `chip`.
///
/// # Errors
/// Whatever the lowering reports ([`PallasError`]).
pub fn run_kernel_ir(chip: &ChipModel, description: &Description, dir: &Path) -> Result<IrRun, PallasError> {
    let (program, facts) = tpusim_pallas::lower(chip, description, dir)?;
    let result = simulate(chip, &program);
    Ok(IrRun { chip: chip.clone(), description: description.clone(), program, facts, result })
}

/// The fields of [`crate::Report`] an IR job does not have: they describe attention workloads
/// (masks, tiles of a q x kv grid, a dense baseline) that a kernel's IR does not state.
pub const LACKS: &[&str] = &[
    "job",
    "padded",
    "pair_density",
    "exact_pair_density",
    "tile_density",
    "useful_fraction",
    "dense_latency_ms",
    "tile_skip_efficiency",
    "speedup_vs_dense",
    "phases",
];

/// The metrics of one kernel read from its IR. The JSON of `tpusim run --kernel-ir FILE --format
/// json`; the fields mean what [`crate::Report`]'s of the same name mean, with `tiles` counting
/// grid steps (`visited`: steps whose body runs work on some unit).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KernelIrReport {
    /// Chip model name.
    pub chip: String,
    /// Which chip model ran.
    pub chip_model: tpusim_chip::ChipIdentity,
    /// The kernel's name (the custom call's `kernel_name`: a label).
    pub kernel_name: String,
    /// The custom call's `kernel_metadata` (a label), if any.
    pub kernel_metadata: Option<String>,
    /// The device kind it was lowered for.
    pub device_kind: String,
    /// Predicted latency, milliseconds.
    pub latency_ms: f64,
    /// How sure the prediction is ([`crate::bands::band_for_kernel_ir`]): no calibration row is of
    /// an IR kernel, so `not covered by measurements: ...`.
    pub band: crate::bands::ReportBand,
    /// Predicted latency, cycles.
    pub cycles: f64,
    /// Clock, GHz.
    pub clock_ghz: f64,
    /// Executed matmul FLOPs.
    pub flops: f64,
    /// Achieved FLOP/s over the chip model's peak.
    pub mfu: f64,
    /// Achieved TFLOP/s.
    pub achieved_tflops: f64,
    /// Peak bf16 TFLOP/s of the chip model.
    pub peak_tflops: f64,
    /// Executed transcendental elements (EUP registers x 1024).
    pub transcendentals: f64,
    /// Bytes moved between HBM and VMEM.
    pub hbm_bytes: u64,
    /// The run's totals as `pl.CostEstimate` fields.
    pub cost_estimate: CostEstimate,
    /// The `pl.CostEstimate` the kernel declares, if any.
    pub declared_cost_estimate: Option<DeclaredCost>,
    /// FLOPs per HBM byte.
    pub arithmetic_intensity: f64,
    /// Grid steps run.
    pub grid_steps: u64,
    /// Grid steps whose body runs work on some unit.
    pub steps_computed: u64,
    /// Grid dimensions (name with semantics, extent).
    pub grid: Vec<(String, u64)>,
    /// Tile counts as grid steps: total = grid steps, visited = full = steps computed, empty = the rest.
    pub tiles: Option<tpusim_kernel::TileCounts>,
    /// The unit that bounds the run, by the rule of [`crate::Report::bottleneck`]
    /// ([`crate::whatif::bottleneck_of`]); without the what-if table (sweeps without
    /// `--what-if-2x`) the unit with the largest critical-path share.
    pub bottleneck: Unit,
    /// Other units whose 2x gain ties with the bottleneck's ([`crate::whatif::bottleneck_of`]);
    /// empty without the what-if table.
    pub co_bound: Vec<Unit>,
    /// Which rule named the bottleneck; `None` without the what-if table.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bound_rule: Option<crate::whatif::BoundRule>,
    /// Per unit, the latency with that unit alone twice as fast, re-timing this kernel's
    /// lowering on the derived chip ([`crate::whatif::what_if_2x_program`]); `None` when not
    /// computed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub what_if_2x: Option<Vec<crate::whatif::WhatIf>>,
    /// Busy fraction per unit.
    pub utilization: PerUnit<f64>,
    /// Busy time per unit, ms.
    pub busy_ms: PerUnit<f64>,
    /// DMA waits beyond the step overhead, ms.
    pub dma_stall_ms: f64,
    /// Critical path by unit, ms.
    pub critical_path_ms: PerUnit<f64>,
    /// VMEM the kernel keeps at once, bytes.
    pub vmem_bytes: u64,
    /// Its scoped VMEM limit (the custom call's, or the chip's default), bytes.
    pub vmem_limit_bytes: u64,
    /// VMEM by buffer.
    pub vmem_buffers: Vec<(String, u64)>,
    /// SMEM for prefetch tables and SMEM buffers, bytes.
    pub smem_bytes: u64,
    /// Per TensorCore.
    pub cores: Vec<CoreSummary>,
    /// Distinct step bodies.
    pub step_classes: Vec<ClassSummary>,
    /// The modelling assumptions the importer made for this kernel.
    pub assumptions: Vec<String>,
    /// Fields of `Report` this report lacks ([`LACKS`]).
    pub lacks: Vec<String>,
}

impl KernelIrReport {
    /// Summarises a run, with its what-if table ([`KernelIrReport::with_what_if`]).
    pub fn from_run(run: &IrRun) -> Self {
        Self::from_run_as(run, run.chip.identity()).with_what_if(run)
    }

    /// This report (of `run`) with its what-if table: the run's program re-timed with each unit
    /// twice as fast ([`crate::whatif::what_if_2x_program`]: six simulations), and the bottleneck
    /// and co-bound units it gives ([`crate::whatif::bottleneck_of`], the rule of
    /// [`crate::Report::with_what_if`]).
    pub fn with_what_if(mut self, run: &IrRun) -> Self {
        let table = crate::whatif::what_if_2x_program(&run.chip, &run.program, run.result.seconds);
        let (b, co, rule) = crate::whatif::bottleneck_of(&table, &self.critical_path_ms, self.bottleneck);
        self.bottleneck = b;
        self.co_bound = co;
        self.bound_rule = Some(rule);
        self.what_if_2x = Some(table);
        self
    }

    /// [`KernelIrReport::from_run`] without the what-if table and with the chip model's identity
    /// already known (sweeps name each chip model once).
    pub fn from_run_as(run: &IrRun, identity: tpusim_chip::ChipIdentity) -> Self {
        let r = &run.result;
        let chip = &run.chip;
        let ms = |c: f64| c / chip.clock_hz() * 1e3;
        let seconds = r.seconds.max(f64::MIN_POSITIVE);
        KernelIrReport {
            chip: chip.name.clone(),
            chip_model: identity,
            kernel_name: run.description.kernel_name.clone(),
            kernel_metadata: run.description.kernel_metadata.clone(),
            device_kind: run.description.producer.device_kind.clone(),
            latency_ms: r.seconds * 1e3,
            band: crate::bands::band_for_kernel_ir(chip),
            cycles: r.cycles,
            clock_ghz: chip.device.clock_ghz.value,
            flops: r.flops,
            mfu: r.flops / seconds / chip.peak_flops(),
            achieved_tflops: r.flops / seconds / 1e12,
            peak_tflops: chip.peak_flops() / 1e12,
            transcendentals: r.transcendentals,
            hbm_bytes: r.hbm_bytes,
            cost_estimate: CostEstimate { flops: r.flops.round() as u64, transcendentals: r.transcendentals.round() as u64, bytes_accessed: r.hbm_bytes },
            declared_cost_estimate: run.facts.declared_cost,
            arithmetic_intensity: if r.hbm_bytes > 0 { r.flops / r.hbm_bytes as f64 } else { 0.0 },
            grid_steps: r.grid_steps,
            steps_computed: run.facts.steps_computed,
            grid: run.program.info.grid.clone(),
            tiles: run.program.info.tiles,
            bottleneck: r.bottleneck(),
            co_bound: Vec::new(),
            bound_rule: None,
            what_if_2x: None,
            utilization: r.utilization(),
            busy_ms: PerUnit(r.busy.0.map(ms)),
            dma_stall_ms: ms(r.dma_stall_cycles),
            critical_path_ms: PerUnit(r.critical.0.map(ms)),
            vmem_bytes: run.program.vmem.total(),
            vmem_limit_bytes: run.program.vmem.limit_bytes,
            vmem_buffers: run.program.vmem.buffers.clone(),
            smem_bytes: run.facts.smem_bytes,
            cores: r.cores.iter().map(|c| CoreSummary { grid_steps: c.grid_steps, busy_ms: PerUnit(c.busy.0.map(ms)) }).collect(),
            step_classes: crate::class_summaries(&run.program, r, &|c| (if c.body.is_empty() { "skipped".into() } else { "computed".into() }, false)),
            assumptions: run.facts.assumptions.clone(),
            lacks: LACKS.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// JSON, one object.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report serialises")
    }

    /// A table for people.
    pub fn to_table(&self) -> String {
        let mut s = String::new();
        let mib = |b: u64| b as f64 / 1048576.0;
        let _ = writeln!(s, "tpusim: Pallas kernel `{}` from its Mosaic IR on {}", self.kernel_name, self.chip);
        if !self.device_kind.is_empty() {
            let _ = writeln!(s, "  lowered for  {}", self.device_kind);
        }
        let _ = writeln!(s, "  chip model   {}", self.chip_model);
        let grid: Vec<String> = self.grid.iter().map(|(n, v)| format!("{v} {n}")).collect();
        let _ = writeln!(s, "  grid         {} -> {} grid steps, {} computed", grid.join(" x "), self.grid_steps, self.steps_computed);
        let _ = writeln!(s, "  VMEM         {:.1} MiB of the {:.1} MiB scoped limit", mib(self.vmem_bytes), mib(self.vmem_limit_bytes));
        let _ = writeln!(s);
        let _ = writeln!(s, "  latency      {:.3} ms  ({:.4e} cycles at {} GHz)", self.latency_ms, self.cycles, self.clock_ghz);
        let _ = writeln!(
            s,
            "  band         {}{}",
            self.band.text,
            if self.band.covered { " (leave-one-out |error| over the calibration rows)" } else { "" }
        );
        let _ = writeln!(
            s,
            "  compute      {:.3e} FLOP executed, {:.1} TFLOP/s = {:.1}% MFU (peak {:.0} TFLOP/s)",
            self.flops,
            self.achieved_tflops,
            self.mfu * 100.0,
            self.peak_tflops
        );
        let _ = writeln!(s, "  memory       {:.3} GB HBM traffic, arithmetic intensity {:.0} FLOP/byte", self.hbm_bytes as f64 / 1e9, self.arithmetic_intensity);
        let _ = writeln!(
            s,
            "  cost         pl.CostEstimate(flops={}, transcendentals={}, bytes_accessed={})",
            self.cost_estimate.flops, self.cost_estimate.transcendentals, self.cost_estimate.bytes_accessed
        );
        if let Some(d) = self.declared_cost_estimate {
            let _ = writeln!(
                s,
                "  declared     pl.CostEstimate(flops={}, transcendentals={}, bytes_accessed={})",
                d.flops, d.transcendentals, d.bytes_accessed
            );
        }
        crate::write_bound_by(
            &mut s,
            &crate::BoundBy {
                bottleneck: self.bottleneck,
                co_bound: &self.co_bound,
                rule: self.bound_rule,
                what_if_2x: self.what_if_2x.as_deref(),
                utilization: &self.utilization,
                critical_path_ms: &self.critical_path_ms,
                latency_ms: self.latency_ms,
            },
        );
        let _ = writeln!(s, "  unit           busy ms  busy %  critical path ms");
        for n in Unit::ALL {
            let (b, u, c) = (self.busy_ms[*n], self.utilization[*n], self.critical_path_ms[*n]);
            let _ = writeln!(s, "    {:<12} {:>9.3}  {:>6.1}  {:>9.3}  {}", n.word(), b, u * 100.0, c, bar(u));
        }
        if self.cores.len() > 1 {
            let _ = writeln!(s);
            for (i, c) in self.cores.iter().enumerate() {
                let busy: Vec<String> = Unit::COMPUTE.iter().map(|&u| format!("{} {:.3}", u, c.busy_ms[u])).collect();
                let _ = writeln!(s, "  core {i}       {} grid steps; busy ms: {}", c.grid_steps, busy.join(", "));
            }
        }
        for a in &self.assumptions {
            let _ = writeln!(s, "  assumes      {a}");
        }
        s
    }
}
