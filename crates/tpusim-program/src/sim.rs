//! Timing the groups of a program on one chip of a slice, and scheduling them.
//!
//! * **Fusions**: `tpusim_engine::simulate_fusion` (their bytes after fusion at the sustained
//!   HBM bandwidth plus one HBM round trip of latency; their VPU and EUP work is not timed, so
//!   a fusion is HBM-bound by rule).
//! * **Dots**: XLA's dot as `tpusim layer` times it (`tpusim_kernel::matmul::lower_xla`, the
//!   `xla-matmul` family through the engine) for M x N x K, times the batch. The family moves
//!   bf16 operands; a dot with other operand types is timed as bf16 (the report says so). The
//!   element-wise ops fused into its output ride under the matmul (not timed), as in the layer.
//! * **Pallas kernels**: the kernel description through `tpusim-pallas` and the engine
//!   (`tpusim_job::run` of a `Job::Described`).
//! * **Collectives** on the slice's links (`tpusim_slice::topology::time_transfers`): device i of
//!   the program (its replica-group and source-target ids) is chip i in row-major order of the
//!   slice shape. Per group of n devices with B operand bytes per device: an all-gather sends
//!   each device's B to the n - 1 others (multicast); an all-to-all B / n to each other device
//!   (unicast); a collective-permute B per source-target pair; a reduce-scatter loads the links
//!   as the all-gather of its B / n result shards does (the dual pattern, reducing at each hop);
//!   an all-reduce is a reduce-scatter then an all-gather (twice that time). The reduction
//!   arithmetic is not timed.
//!
//! **Ops outside `shard_map`** run with the shapes the export gives them (global shapes): each
//! device is assumed to run them whole (the partitioner's choices are not in the export).
//!
//! **The overlap rule (schedule)** is the slice crate's one schedule (`tpusim_slice::schedule`,
//! which `tpusim layer` runs too): groups issue in creation order, each collective moved to just
//! after the last group it reads; the TensorCore runs fusions, dots and kernels one at a time;
//! a collective costs the TensorCore one DMA issue (`fitted.dma_issue_ns`, a named assumption of the
//! chip model) per message the device sends, then runs on the ICI concurrently with later
//! compute, and its consumers wait for its end. So a step whose transfer hides behind compute
//! takes the compute plus the issue cost; the program's time is at least the larger of its
//! compute-only and ICI-only schedules and at most their sum.

use crate::desc::ProgramDescription;
use crate::fuse::{group, GroupKind, Grouped};
use crate::ops::{dot_dims, CollectiveKind, OpClass};
use crate::ProgramError;
use serde::Serialize;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;
use tpusim_chip::ChipModel;
use tpusim_slice::topology::{time_transfers, Torus, Transfer};
use tpusim_slice::{issue_order, Queue, SliceOp};
use tpusim_workload::MatmulCall;

/// One group's time and place in the schedule.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Entry {
    /// `fusion`, `dot`, `collective` or `kernel`.
    pub kind: GroupKind,
    /// A name: the kind and first op (`fusion 3: multiply, add, tanh`, `dot 0`, ...).
    pub name: String,
    /// The member ops' names, in program order.
    pub ops: Vec<String>,
    /// Where the first member is in the user's code (`file.py:LINE`).
    pub location: String,
    /// Time on its queue, seconds (a collective: on the ICI).
    pub seconds: f64,
    /// TensorCore time to issue a collective, seconds (others 0).
    pub issue_seconds: f64,
    /// Start, seconds from the program's start.
    pub start: f64,
    /// End, seconds.
    pub end: f64,
    /// `core` or `ici`.
    pub queue: &'static str,
    /// FLOPs of the members (before fusion; a kernel's as simulated).
    pub flops: f64,
    /// Transcendentals of the members (a kernel's as simulated).
    pub transcendentals: f64,
    /// HBM bytes after fusion (a kernel's as simulated; collectives 0).
    pub hbm_bytes: u64,
    /// What it is (shapes, bytes, devices).
    pub detail: String,
}

/// A program simulated on one chip of a slice.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProgramReport {
    /// Chip model name.
    pub chip: String,
    /// The chip model that ran (provenance and parameter hash).
    pub chip_model: tpusim_chip::ChipIdentity,
    /// The slice (`AxB`) and its kind (mesh or torus).
    pub slice: String,
    /// The program's latency on each chip, milliseconds.
    pub latency_ms: f64,
    /// The same schedule with every collective's ICI time zero, milliseconds.
    pub compute_only_ms: f64,
    /// The same schedule with every TensorCore op's time zero (issue costs kept), milliseconds.
    pub ici_only_ms: f64,
    /// ICI busy time hidden under compute (ICI busy minus what the TensorCore waited), ms.
    pub ici_hidden_ms: f64,
    /// FLOPs of the XLA ops (custom calls excluded), the count `cost_analysis()` makes.
    pub xla_flops: f64,
    /// Transcendentals of the XLA ops (custom calls excluded).
    pub xla_transcendentals: f64,
    /// Bytes of the XLA ops before fusion (operands plus results per op, custom calls excluded).
    pub xla_bytes_unfused: u64,
    /// HBM bytes of the fusions and dots after fusion.
    pub xla_bytes_fused: u64,
    /// HBM bytes of the Pallas kernels, as simulated.
    pub kernel_hbm_bytes: u64,
    /// Fusions formed.
    pub fusions: usize,
    /// Each group in creation order.
    pub entries: Vec<Entry>,
    /// What the run assumed.
    pub assumptions: Vec<String>,
}

fn dot_cost(chip: &ChipModel, m: u64, n: u64, k: u64, name: &str) -> Result<(f64, u64), ProgramError> {
    let mm = MatmulCall { m, n, k };
    let (_, prog) = tpusim_kernel::matmul::lower_xla(chip, &mm).map_err(|e| ProgramError::Kernel(format!("op `{name}`: {e}")))?;
    let r = tpusim_engine::simulate(chip, &prog);
    Ok((r.seconds, r.hbm_bytes))
}

/// The messages one device group's collective sends (module docs) and a time factor.
fn transfers(kind: CollectiveKind, group: &[u64], operand_bytes: f64, result_bytes: f64) -> (Vec<Transfer>, f64) {
    let n = group.len() as f64;
    let all = |bytes: f64| -> Vec<Transfer> { group.iter().map(|&s| Transfer { source: s, targets: group.to_vec(), bytes }).collect() };
    match kind {
        CollectiveKind::AllGather => (all(operand_bytes), 1.0),
        CollectiveKind::ReduceScatter => (all(result_bytes), 1.0),
        CollectiveKind::AllReduce => (all(operand_bytes / n), 2.0),
        CollectiveKind::AllToAll => (
            group
                .iter()
                .flat_map(|&s| group.iter().filter(move |&&t| t != s).map(move |&t| Transfer { source: s, targets: vec![t], bytes: operand_bytes / n }))
                .collect(),
            1.0,
        ),
        CollectiveKind::CollectivePermute => (Vec::new(), 1.0),
    }
}

/// Simulates a program description on `chip` over the slice `slice` (`AxB`, or the mesh's shape
/// when `None`); kernel side files are resolved in `dir`.
///
/// # Errors
/// [`ProgramError`]: an op not modelled (naming it and its location), a slice that does not
/// match the program's mesh or a collective naming a device the slice lacks, a kernel that does
/// not lower.
pub fn simulate_program(chip: &ChipModel, d: &ProgramDescription, slice: Option<&str>, dir: &Path) -> Result<ProgramReport, ProgramError> {
    let mesh_devices: u64 = d.mesh.iter().map(|(_, s)| *s).product();
    let mesh_shape = if d.mesh.is_empty() { "1".to_string() } else { d.mesh.iter().map(|(_, s)| s.to_string()).collect::<Vec<_>>().join("x") };
    let slice_text = slice.map_or(mesh_shape.clone(), str::to_string);
    let torus = Torus::slice(&slice_text, chip).map_err(|e| ProgramError::Slice(e.to_string()))?;
    if !d.mesh.is_empty() && torus.devices() != mesh_devices {
        return Err(ProgramError::Slice(format!(
            "`slice` = {slice_text}: {} devices, but the program's mesh ({}) has {mesh_devices}",
            torus.devices(),
            d.mesh.iter().map(|(n, s)| format!("{n}={s}")).collect::<Vec<_>>().join(", ")
        )));
    }
    let Grouped { groups, classes, counts } = group(d)?;
    let issue_s = chip.fitted.dma_issue_ns.value * 1e-9;
    let mut assumptions = vec![
        "ops outside shard_map run whole on every device (global shapes)".to_string(),
        "fusions are HBM-bound (their VPU / EUP work is not timed)".to_string(),
        format!("a collective costs the TensorCore fitted.dma_issue_ns = {} ns per message a device sends", chip.fitted.dma_issue_ns.value),
    ];
    let mut kernel_cache: HashMap<usize, (f64, u64, f64, f64, String)> = HashMap::new();
    let mut dot_cache: HashMap<(u64, u64, u64), (f64, u64)> = HashMap::new();
    let mut entries = Vec::with_capacity(groups.len());
    for (gi, g) in groups.iter().enumerate() {
        let first = &d.ops[g.ops[0]];
        let names: Vec<String> = g.ops.iter().map(|&i| d.ops[i].op.clone()).collect();
        let mut e = Entry {
            kind: g.kind,
            name: String::new(),
            ops: names.clone(),
            location: first.location.clone(),
            seconds: 0.0,
            issue_seconds: 0.0,
            start: 0.0,
            end: 0.0,
            queue: "core",
            flops: g.counts.flops,
            transcendentals: g.counts.transcendentals,
            hbm_bytes: g.read_bytes + g.write_bytes,
            detail: String::new(),
        };
        match (g.kind, classes[g.ops[0]]) {
            (GroupKind::Fusion, _) => {
                let mut short: Vec<&str> = Vec::new();
                for n in &names {
                    if !short.contains(&n.as_str()) {
                        short.push(n);
                    }
                }
                e.name = format!("fusion {gi}: {}", short.join(", "));
                let r = tpusim_engine::simulate_fusion(
                    chip,
                    &tpusim_model::Fusion { name: e.name.clone(), read_bytes: g.read_bytes, write_bytes: g.write_bytes },
                );
                e.seconds = r.seconds;
                e.detail = format!("{} ops, {} B read, {} B written", g.ops.len(), g.read_bytes, g.write_bytes);
            }
            (GroupKind::Dot, _) => {
                let (b, m, n, k) = dot_dims(d, first)?;
                e.name = format!("dot {gi}");
                let (s, _) = match dot_cache.get(&(m, n, k)) {
                    Some(c) => *c,
                    None => {
                        let c = dot_cost(chip, m.max(1), n.max(1), k.max(1), &e.name).map_err(|err| first.error(err.to_string()))?;
                        dot_cache.insert((m, n, k), c);
                        c
                    }
                };
                e.seconds = s * b as f64;
                let dt = &d.values[first.operands[0]].dtype;
                if dt != "bf16" {
                    let a = format!("dots with {dt} operands are timed as the xla-matmul family's bf16 dots");
                    if !assumptions.contains(&a) {
                        assumptions.push(a);
                    }
                }
                e.name = if g.ops.len() > 1 { format!("dot {gi} (+ {} fused ops)", g.ops.len() - 1) } else { e.name };
                e.detail = format!(
                    "{}{m} x {n} x {k} ({dt}), {} B read, {} B written",
                    if b > 1 { format!("{b} x ") } else { String::new() },
                    g.read_bytes,
                    g.write_bytes
                );
            }
            (GroupKind::Kernel, OpClass::Kernel(k)) => {
                let c = match kernel_cache.get(&k) {
                    Some(c) => c.clone(),
                    None => {
                        let value = tpusim_job::KernelIrValue { file: format!("kernels[{k}]"), text: d.kernels[k].to_string(), dir: dir.to_path_buf() };
                        let spec = tpusim_job::JobSpec { kernel_ir_value: Some(value), ..Default::default() };
                        let job = spec.build(chip).map_err(|err| first.error(err.to_string()))?;
                        let tpusim_job::Job::Described(described) = &job else { unreachable!("a kernel description builds a described job") };
                        let name = described.kernel_name.clone();
                        let run = tpusim_job::run(chip, &job).map_err(|err| first.error(err.to_string()))?;
                        let c = (run.result.seconds, run.result.hbm_bytes, run.result.flops, run.result.transcendentals, name);
                        kernel_cache.insert(k, c.clone());
                        c
                    }
                };
                e.name = format!("kernel {gi}: {}", c.4);
                e.seconds = c.0;
                e.hbm_bytes = c.1;
                e.flops = c.2;
                e.transcendentals = c.3;
                e.detail = format!("Pallas kernel `{}` (kernels[{k}])", c.4);
            }
            (GroupKind::Collective, OpClass::Collective(kind)) => {
                let (Some(&operand), Some(&result)) = (first.operands.first(), first.results.first()) else {
                    return Err(first.error("a collective needs an operand and a result"));
                };
                let ob = d.values[operand].bytes()? as f64;
                let rb = d.values[result].bytes()? as f64;
                let (msgs, factor) = if kind == CollectiveKind::CollectivePermute {
                    let pairs = first.groups("source_target_pairs")?;
                    let mut v = Vec::new();
                    for p in &pairs {
                        if p.len() != 2 {
                            return Err(first.error(format!("a source-target pair {p:?} is not two device ids")));
                        }
                        v.push(Transfer { source: p[0], targets: vec![p[1]], bytes: ob });
                    }
                    (v, 1.0)
                } else {
                    let mut gs = first.groups("replica_groups")?;
                    gs.retain(|g| !g.is_empty());
                    if gs.is_empty() {
                        gs = vec![(0..torus.devices()).collect()];
                    }
                    let mut v = Vec::new();
                    let mut f = 1.0;
                    for grp in &gs {
                        let (t, ff) = transfers(kind, grp, ob, rb);
                        v.extend(t);
                        f = ff;
                    }
                    (v, f)
                };
                let n = torus.devices();
                if let Some(bad) = msgs.iter().flat_map(|t| std::iter::once(t.source).chain(t.targets.iter().copied())).find(|&x| x >= n) {
                    return Err(first.error(format!(
                        "device {bad} in its replica groups / source-target pairs is not in the slice `{}` ({n} devices, chip i in row-major \
                         order of the slice shape): the collective runs over an axis or devices the slice lacks",
                        torus.label()
                    )));
                }
                let t = time_transfers(chip, &torus, &msgs).map_err(|err| first.error(err.to_string()))?;
                let mut per_source: HashMap<u64, usize> = HashMap::new();
                for m in &msgs {
                    *per_source.entry(m.source).or_default() += m.targets.iter().filter(|&&x| x != m.source).count();
                }
                let sends = per_source.values().copied().max().unwrap_or(0) as f64 * factor;
                e.name = format!("{} {gi}", first.op);
                e.seconds = t.seconds * factor;
                e.issue_seconds = sends * issue_s;
                e.queue = "ici";
                e.hbm_bytes = 0;
                e.detail = format!(
                    "{ob} B per device, busiest link {:.0} B, {} hops, {} messages per device",
                    t.max_link_bytes * factor,
                    t.max_hops,
                    sends
                );
            }
            _ => return Err(first.error("internal: a group of an unexpected kind")),
        }
        entries.push(e);
    }
    let ops: Vec<SliceOp> = groups
        .iter()
        .zip(&entries)
        .map(|(g, e)| SliceOp {
            queue: if e.queue == "ici" { Queue::Ici } else { Queue::Core },
            seconds: e.seconds,
            issue_seconds: e.issue_seconds,
            deps: g.deps.clone(),
        })
        .collect();
    let order = issue_order(&ops);
    let sched = tpusim_slice::schedule(&ops, &order, true, 1.0, 1.0);
    let total = sched.seconds;
    for (e, &(s, end)) in entries.iter_mut().zip(&sched.spans) {
        e.start = s;
        e.end = end;
    }
    let compute_only = tpusim_slice::schedule(&ops, &order, true, 1.0, 0.0).seconds;
    let ici_only = tpusim_slice::schedule(&ops, &order, true, 0.0, 1.0).seconds;
    let ici_busy: f64 = entries.iter().filter(|e| e.queue == "ici").map(|e| e.seconds).sum();
    let mut xla = crate::ops::OpCounts::default();
    for (c, cl) in counts.iter().zip(&classes) {
        if !matches!(cl, OpClass::Kernel(_) | OpClass::Boundary) {
            xla += *c;
        }
    }
    Ok(ProgramReport {
        chip: chip.name.clone(),
        chip_model: chip.identity(),
        slice: format!("{} ({})", torus.label(), torus.kind()),
        latency_ms: total * 1e3,
        compute_only_ms: compute_only * 1e3,
        ici_only_ms: ici_only * 1e3,
        ici_hidden_ms: (ici_busy - (total - compute_only).max(0.0)).max(0.0) * 1e3,
        xla_flops: xla.flops,
        xla_transcendentals: xla.transcendentals,
        xla_bytes_unfused: xla.bytes,
        xla_bytes_fused: groups.iter().filter(|g| matches!(g.kind, GroupKind::Fusion | GroupKind::Dot)).map(|g| g.read_bytes + g.write_bytes).sum(),
        kernel_hbm_bytes: entries.iter().filter(|e| e.kind == GroupKind::Kernel).map(|e| e.hbm_bytes).sum(),
        fusions: groups.iter().filter(|g| g.kind == GroupKind::Fusion).count(),
        entries,
        assumptions,
    })
}

impl ProgramReport {
    /// The report as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }

    /// The report as a table for people: the totals, then one row per group.
    pub fn to_table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "program on {} ({}), slice {}", self.chip, self.chip_model.hash, self.slice);
        let _ = writeln!(
            s,
            "latency {:.4} ms (compute only {:.4} ms, ICI only {:.4} ms, ICI hidden {:.4} ms); {} fusions",
            self.latency_ms, self.compute_only_ms, self.ici_only_ms, self.ici_hidden_ms, self.fusions
        );
        let _ = writeln!(
            s,
            "XLA ops: {:.4e} FLOP, {:.4e} transcendentals, {} B unfused, {} B fused; kernels {} B",
            self.xla_flops, self.xla_transcendentals, self.xla_bytes_unfused, self.xla_bytes_fused, self.kernel_hbm_bytes
        );
        let _ = writeln!(s, "{:<40} {:>5} {:>10} {:>10} {:>10}  {:<16} detail", "group", "queue", "ms", "start ms", "end ms", "location");
        for e in &self.entries {
            let mut name = e.name.clone();
            if name.len() > 40 {
                name.truncate(37);
                name.push_str("...");
            }
            let _ = writeln!(
                s,
                "{:<40} {:>5} {:>10.4} {:>10.4} {:>10.4}  {:<16} {}",
                name,
                e.queue,
                e.seconds * 1e3,
                e.start * 1e3,
                e.end * 1e3,
                e.location,
                e.detail
            );
        }
        for a in &self.assumptions {
            let _ = writeln!(s, "assumed: {a}");
        }
        s
    }
}
