//! A decode step (paged attention, ragged paged attention) read from its Mosaic IR and
//! simulated, reported against the HBM roofline.
//!
//! * **What the step must move** ([`DecodeShape::must_move_bytes`]): the K and V of the pages
//!   its sequence lengths touch (`ceil(length / page_size)` pages per sequence, each
//!   `kv_bytes_per_page` for all KV heads), plus q and o.
//! * **Latency.** The engine runs the kernel's IR: its manual DMAs are ops of the step's body on
//!   the DMA engines, queued one after another, each taking the largest of its bytes at the
//!   sustained HBM-to-VMEM bandwidth, its issue by the scalar core and its share of the
//!   in-flight slots (`tpusim_engine::op_cycles`), overlapping compute until a wait needs them.
//!   The report lists two closed-form lower bounds beside it, summed over the step's DMAs (the
//!   rule: the step takes the largest of the three; the engine's is at least each):
//!   - issue: `DMAs x fitted.dma_issue_ns` (the scalar core issues them one by one);
//!   - in flight: `sum over DMAs of (fitted.dma_latency_ns + bytes / bandwidth) / fitted.dmas_in_flight`
//!     (Little's law: at most that many DMAs hold a slot, each for its latency plus its bytes).
//!
//!   Both parameters are named assumptions of the chip model (`models/README.md`).
//! * **Roofline fraction** = must-move bytes / (latency x sustained HBM-to-VMEM bandwidth of the
//!   cores that ran: `hbm.dma_bandwidth_gb_per_s` per core, at most the device's
//!   `hbm.bandwidth_gb_per_s`). What holds it below 1 is listed ([`DecodeReport::below_roof`]):
//!   bytes moved beyond the must-move (compute blocks rounded up to whole blocks of pages, the
//!   next sequence's prefetch), the bound that sets the latency, DMA count and size.

use crate::Run;
use serde::Serialize;
use std::fmt::Write as _;
use tpusim_pallas::runtime::DmaTally;
use tpusim_model::Unit;

/// The decode step's shape as the caller's arrays give it (the kernel's IR does not say which
/// operand is a sequence length).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecodeShape {
    /// KV length of each sequence, tokens.
    pub lengths: Vec<u64>,
    /// Tokens per page.
    pub page_size: u64,
    /// Bytes of K and V of one page over all KV heads.
    pub kv_bytes_per_page: u64,
    /// Bytes of q.
    pub q_bytes: u64,
    /// Bytes of o.
    pub o_bytes: u64,
    /// Pages per compute block of the kernel's tiling (a label for the report).
    pub pages_per_block: Option<u64>,
}

impl DecodeShape {
    /// Pages the lengths touch: sum of `ceil(length / page_size)`.
    pub fn pages_touched(&self) -> u64 {
        self.lengths.iter().map(|&l| l.div_ceil(self.page_size.max(1))).sum()
    }

    /// Bytes the step must move: the touched pages' K and V, plus q and o.
    pub fn must_move_bytes(&self) -> u64 {
        self.pages_touched() * self.kv_bytes_per_page + self.q_bytes + self.o_bytes
    }

    /// Checks the fields.
    ///
    /// # Errors
    /// A message naming the field for a zero page size or page size in bytes.
    pub fn check(&self) -> Result<(), String> {
        if self.page_size == 0 {
            return Err("page_size = 0: expected a whole number of tokens per page from 1".into());
        }
        if self.kv_bytes_per_page == 0 {
            return Err("kv_bytes_per_page = 0: expected the bytes of K and V of one page, from 1".into());
        }
        Ok(())
    }
}

/// One lower bound on the step's latency.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Bound {
    /// Name: `engine pipeline`, `DMA issue`, `DMAs in flight`.
    pub name: String,
    /// Its time, ms.
    pub ms: f64,
    /// How it is computed, with the values.
    pub reason: String,
}

/// A decode step's report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecodeReport {
    /// Chip model name.
    pub chip: String,
    /// The kernel's name (a label).
    pub kernel_name: String,
    /// Predicted step latency, ms: the largest bound.
    pub latency_ms: f64,
    /// The engine's latency for the kernel, ms.
    pub engine_latency_ms: f64,
    /// Bytes the run moves between HBM and VMEM.
    pub hbm_bytes: u64,
    /// Bytes the step must move ([`DecodeShape::must_move_bytes`]).
    pub must_move_bytes: u64,
    /// Pages the lengths touch.
    pub pages_touched: u64,
    /// Sustained HBM-to-VMEM bandwidth of the cores that ran, GB/s.
    pub bandwidth_gb_per_s: f64,
    /// Time the must-move bytes take at that bandwidth, ms.
    pub roof_ms: f64,
    /// must-move bytes / (latency x bandwidth).
    pub roofline_fraction: f64,
    /// The bounds, largest first.
    pub bounds: Vec<Bound>,
    /// The bound that sets the latency.
    pub bound: String,
    /// Why the step is below the roof, largest effects first.
    pub below_roof: Vec<String>,
    /// The kernel's manual DMAs.
    pub dmas: DmaTally,
    /// Mean bytes per DMA.
    pub bytes_per_dma: f64,
    /// Pages per compute block (the caller's tiling label).
    pub pages_per_block: Option<u64>,
    /// Pipeline depth the engine times (double-buffered step inputs).
    pub pipeline_depth: u32,
    /// Grid steps.
    pub grid_steps: u64,
    /// The assumed chip parameters the bounds read, as `FIELD = VALUE (source)`.
    pub assumed: Vec<String>,
    /// The decode shape.
    pub shape: DecodeShape,
}

impl DecodeReport {
    /// Reports a simulated decode kernel (a run of a kernel read from its IR, [`crate::Job::Described`]).
    ///
    /// # Errors
    /// A message naming the field of an invalid shape, or saying that the run is not of a kernel
    /// read from its IR (only its lowering counts the manual DMAs the bounds read).
    pub fn from_run(run: &Run, shape: &DecodeShape) -> Result<DecodeReport, String> {
        shape.check()?;
        let facts = run.facts.as_ref().ok_or("a decode report reads the manual DMAs of a kernel read from its IR; this run is of a hand-modelled kernel")?;
        let chip = &run.chip;
        let r = &run.result;
        let active = r.cores.iter().filter(|c| c.grid_steps > 0).count().max(1) as f64;
        let bw_gbs = (chip.hbm.dma_bandwidth_gb_per_s.value * active).min(chip.hbm.bandwidth_gb_per_s.value);
        let bw = bw_gbs * 1e9;
        let dmas = facts.dmas.clone();
        let engine_ms = r.seconds * 1e3;
        let issue_ns = chip.fitted.dma_issue_ns.value;
        let lat_ns = chip.fitted.dma_latency_ns.value;
        let inflight = chip.fitted.dmas_in_flight.value.max(1.0);
        let per_core_bw = chip.hbm.dma_bandwidth_gb_per_s.value * 1e9;
        let issue_ms = dmas.count as f64 * issue_ns * 1e-6 / active;
        let slot_s: f64 = dmas.sizes.iter().map(|(&b, &n)| n as f64 * (lat_ns * 1e-9 + b as f64 / per_core_bw)).sum();
        let inflight_ms = slot_s / inflight * 1e3 / active;
        // Whether a figure is fitted to this chip's measurements or assumed.
        let how = |p: &tpusim_chip::Param<f64>| if p.fitted_to.as_ref().is_some_and(|r| !r.is_empty()) { "fitted" } else { "assumed" };
        // What the engine's bound is made of, in the terms a kernel engineer acts on: on a path
        // that waits on copies, the bytes' streaming time against the copies' round trips.
        let share = |u: Unit| r.critical[u] / r.critical.0.iter().sum::<f64>().max(f64::MIN_POSITIVE);
        let wait_ms = engine_ms * share(Unit::Hbm);
        let stream_ms = r.hbm_bytes as f64 / bw * 1e3;
        let term = if r.bottleneck() == Unit::Hbm && wait_ms > 1.5 * stream_ms {
            format!(
                "bound by DMA round trips: the critical path waits {wait_ms:.4} ms on copies whose bytes stream in {stream_ms:.4} ms, the rest their latency the steps cannot hide (fitted.dma_latency_ns {lat_ns} ns a copy, {:.1}% of the HBM roof reached)",
                100.0 * stream_ms / engine_ms.max(f64::MIN_POSITIVE)
            )
        } else if r.bottleneck() == Unit::Hbm {
            format!("bound by HBM bandwidth: the critical path waits {wait_ms:.4} ms on copies whose bytes stream in {stream_ms:.4} ms")
        } else if r.bottleneck() == Unit::Mxu {
            // Which part of the MXU's work bounds it (as the run report says it): a decode step
            // streams few query rows through each weight fold it loads.
            let sh = 100.0 * share(Unit::Mxu);
            match crate::mxu_fold_load_share(run) {
                Some(f) if f >= crate::FOLD_LOADS_BOUND => format!(
                    "bound by the MXU's weight-fold loads ({sh:.0}% of its critical path): {:.0}% of the MXU's busy time is matmuls whose folds take longer to load than their few query rows take to stream (more query rows per fold, e.g. the q heads that share a KV head in one matmul, amortise each load)",
                    100.0 * f
                ),
                _ => format!("bound by the MXU's result latency ({sh:.0}% of its critical path): each matmul's result is waited on before the next op of its chain"),
            }
        } else {
            format!("bound by {} ({:.0}% of its critical path)", r.bottleneck().word(), 100.0 * share(r.bottleneck()))
        };
        let mut bounds = vec![
            Bound {
                name: "engine pipeline".into(),
                ms: engine_ms,
                reason: format!(
                    "the kernel's IR on the engine, {term}: {} HBM bytes at {:.0} GB/s per core, its copies under its compute as far as its waits allow, and {} grid steps' overhead",
                    r.hbm_bytes,
                    chip.hbm.dma_bandwidth_gb_per_s.value,
                    r.grid_steps
                ),
            },
            Bound { name: "DMA issue".into(), ms: issue_ms, reason: format!("{} DMAs x fitted.dma_issue_ns {issue_ns} ns ({}) over {active} core(s)", dmas.count, how(&chip.fitted.dma_issue_ns)) },
            Bound {
                name: "DMAs in flight".into(),
                ms: inflight_ms,
                reason: format!(
                    "{} DMAs x (fitted.dma_latency_ns {lat_ns} ns + {:.0} bytes / {:.0} GB/s) / fitted.dmas_in_flight {inflight} ({})",
                    dmas.count,
                    if dmas.count > 0 { dmas.bytes as f64 / dmas.count as f64 } else { 0.0 },
                    chip.hbm.dma_bandwidth_gb_per_s.value,
                    how(&chip.fitted.dmas_in_flight)
                ),
            },
        ];
        bounds.sort_by(|a, b| b.ms.total_cmp(&a.ms));
        let latency_ms = bounds[0].ms;
        let must = shape.must_move_bytes();
        let roof_ms = must as f64 / bw * 1e3;
        let fraction = if latency_ms > 0.0 { roof_ms / latency_ms } else { 0.0 };
        let mut below = Vec::new();
        if r.hbm_bytes > must {
            below.push(format!(
                "moves {} bytes, {:.1}% more than the {} it must ({} pages touched): whole compute blocks of pages and prefetches past the last page",
                r.hbm_bytes,
                100.0 * (r.hbm_bytes as f64 / must as f64 - 1.0),
                must,
                shape.pages_touched()
            ));
        }
        below.push(format!(
            "{}: {:.4} ms against {:.4} ms to stream the moved bytes ({})",
            bounds[0].name, latency_ms, stream_ms, bounds[0].reason
        ));
        if dmas.count > 0 {
            below.push(format!(
                "{} DMAs of {:.0} bytes on average (at most {} in one grid step); {} pages per compute block; pipeline depth 2",
                dmas.count,
                dmas.bytes as f64 / dmas.count as f64,
                dmas.max_per_step,
                shape.pages_per_block.map(|p| p.to_string()).unwrap_or_else(|| "(not given)".into())
            ));
        }
        let assumed = vec![
            format!("fitted.dma_issue_ns = {issue_ns} ({})", chip.fitted.dma_issue_ns.note.as_deref().unwrap_or("no source")),
            format!("fitted.dmas_in_flight = {inflight} ({})", chip.fitted.dmas_in_flight.note.as_deref().unwrap_or("no source")),
        ];
        Ok(DecodeReport {
            chip: chip.name.clone(),
            kernel_name: facts.kernel_name.clone(),
            latency_ms,
            engine_latency_ms: engine_ms,
            hbm_bytes: r.hbm_bytes,
            must_move_bytes: must,
            pages_touched: shape.pages_touched(),
            bandwidth_gb_per_s: bw_gbs,
            roof_ms,
            roofline_fraction: fraction,
            bound: bounds[0].name.clone(),
            bounds,
            below_roof: below,
            bytes_per_dma: if dmas.count > 0 { dmas.bytes as f64 / dmas.count as f64 } else { 0.0 },
            dmas,
            pages_per_block: shape.pages_per_block,
            pipeline_depth: 2,
            grid_steps: r.grid_steps,
            assumed,
            shape: shape.clone(),
        })
    }

    /// JSON, one object.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report serialises")
    }

    /// A table for people.
    pub fn to_table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "tpusim: decode step `{}` on {}", self.kernel_name, self.chip);
        let _ = writeln!(s, "  latency      {:.4} ms  (bound: {})", self.latency_ms, self.bound);
        let _ = writeln!(s, "  HBM bytes    {} moved, {} must move ({} pages touched)", self.hbm_bytes, self.must_move_bytes, self.pages_touched);
        let _ = writeln!(s, "  roofline     {:.1}% of {:.0} GB/s (roof {:.4} ms)", 100.0 * self.roofline_fraction, self.bandwidth_gb_per_s, self.roof_ms);
        for b in &self.bounds {
            let _ = writeln!(s, "  bound        {:<16} {:.4} ms  {}", b.name, b.ms, b.reason);
        }
        for w in &self.below_roof {
            let _ = writeln!(s, "  below roof   {w}");
        }
        for a in &self.assumed {
            let _ = writeln!(s, "  assumes      {a}");
        }
        s
    }
}
