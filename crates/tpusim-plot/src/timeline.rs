//! Timelines: the simulated execution as events on unit tracks, written as Chrome Trace Event
//! JSON (the format Perfetto and `chrome://tracing` open).
//!
//! Events come from the engine's pipeline recursion ([`tpusim_engine::simulate_observed`]) and
//! the per-class body schedules ([`tpusim_engine::schedule_body`]); nothing is re-modelled here.
//! For every grid step in the [`Window`]:
//!
//! * **step control**: the step's scalar work, from `overhead_start` for its `scalar` cycles (the
//!   grid-step overhead and the issue of the copies it starts; the engine's `busy.step_control`
//!   is exactly the sum of these);
//! * **DMA in**: the step's input copy (transfer start to end, after the DMA latency);
//! * **MXU / VPU / EUP / XLU**: one event per tile operation of the step body, at
//!   `body_start + op.start` for `op.end - op.start` cycles (its occupancy; the result latency is
//!   not busy time); a copy the body starts itself (`tpu.enqueue_dma`, named `dma`) is an event
//!   on the DMA-in track the same way whatever its direction, and a wait (`dma wait`) a
//!   zero-length event on the step-control track;
//! * **DMA out**: the output write-back after the step, if any.
//!
//! Per track, the durations of a whole run's events add up to the report's busy time per unit
//! (`busy_ms`; DMA in + DMA out = `hbm`), so utilisation read off a timeline matches the report.
//!
//! A call of several phases (the backward's kernels, a training step, the library's XLA ops in
//! `--scope op`) is drawn phase after phase: each kernel is its own process (pid 1, 2, ... in
//! order, named after the kernel and its part) with the same unit tracks, shifted by the time
//! of the phases before it; the XLA ops outside the kernels are one event each on the single
//! track of process 100. The window applies to every kernel's grid steps.
//!
//! JSON: `{"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}`. Process 1 is the
//! first kernel; threads 1..=7 are the tracks (named by `thread_name` metadata events, ordered by
//! `thread_sort_index`). Each event is a complete event (`"ph": "X"`) with `ts` and `dur` in
//! microseconds (cycles / clock), full f64 precision (no rounding, so sums match the report),
//! `cat` the track key and `args` = `step`, `head` (batch x head index, grid coordinate 0),
//! `q_block`, `kv_block`, `tile` (`empty` / `partial` / `full`), `masked`, and `bytes` for
//! DMAs. Matmul programs carry `m_block`, `n_block`, `k_block` instead of head and blocks; a
//! kernel read from its IR (`tpusim run --kernel-ir F --timeline T`, [`Timed::of_program`])
//! carries `index_first` (its grid index of dimension 0), `index_inner` (of the innermost
//! dimension) and `computed` (whether the step's body runs work; `tile` is then `full` or
//! `empty`). `--timeline-head H` selects the steps whose grid index of dimension 0 is H.

use crate::PlotError;
use petgraph::graph::NodeIndex;
use serde::Serialize;
use std::io::{BufWriter, Write};
use std::path::Path;
use tpusim_chip::ChipModel;
use tpusim_engine::{schedule_body, simulate_observed, SimResult, StepTiming};
use tpusim_model::{PhaseWork, Program, Step, Unit};
use tpusim_job::Run;

/// A track of the timeline: a unit of the TensorCore, a DMA direction, or step control.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Track {
    /// Matrix units.
    Mxu,
    /// Vector ALUs.
    Vpu,
    /// Transcendental unit.
    Eup,
    /// Cross-lane units.
    Xlu,
    /// HBM -> VMEM input copies.
    DmaIn,
    /// VMEM -> HBM write-backs.
    DmaOut,
    /// Scalar grid-step control (fixed per-step overhead).
    StepControl,
}

impl Track {
    /// Every track, in display order.
    pub const ALL: [Track; 7] = [Track::Mxu, Track::Vpu, Track::Eup, Track::Xlu, Track::DmaIn, Track::DmaOut, Track::StepControl];

    /// Display name (the Chrome trace thread name).
    pub fn name(self) -> &'static str {
        match self {
            Track::Mxu => "MXU",
            Track::Vpu => "VPU",
            Track::Eup => "EUP",
            Track::Xlu => "XLU",
            Track::DmaIn => "DMA in",
            Track::DmaOut => "DMA out",
            Track::StepControl => "step control",
        }
    }

    /// Key (the Chrome trace category; report unit names where they exist).
    pub fn key(self) -> &'static str {
        match self {
            Track::DmaIn => "dma_in",
            Track::DmaOut => "dma_out",
            t => t.report_unit().word(),
        }
    }

    /// The report unit whose busy time this track adds to (HBM for both DMA tracks).
    pub fn report_unit(self) -> Unit {
        match self {
            Track::Mxu => Unit::Mxu,
            Track::Vpu => Unit::Vpu,
            Track::Eup => Unit::Eup,
            Track::Xlu => Unit::Xlu,
            Track::DmaIn | Track::DmaOut => Unit::Hbm,
            Track::StepControl => Unit::StepControl,
        }
    }

    /// Chrome trace thread id (1-based, display order).
    pub fn tid(self) -> u32 {
        self as u32 + 1
    }

    /// The track of a thread name (inverse of [`Track::name`]).
    pub fn from_name(s: &str) -> Option<Track> {
        Track::ALL.into_iter().find(|t| t.name() == s)
    }

    fn of_unit(u: Unit) -> Track {
        match u {
            Unit::Mxu => Track::Mxu,
            Unit::Vpu => Track::Vpu,
            Unit::Eup => Track::Eup,
            Unit::Xlu => Track::Xlu,
            Unit::Hbm => Track::DmaIn,
            Unit::StepControl => Track::StepControl,
        }
    }
}

/// Which grid steps a timeline covers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Window {
    /// Grid step indices `start..end` (half-open); `None` for all.
    pub steps: Option<(u64, u64)>,
    /// Only steps of this batch x head index (grid coordinate 0); `None` for all.
    pub head: Option<u32>,
}

impl Window {
    /// Parses `START:END` (grid step indices, END exclusive; either side may be empty: `:100`,
    /// `500:`).
    ///
    /// # Errors
    /// [`PlotError`] naming `flag` when the text is not two whole numbers with START < END.
    pub fn parse_steps(s: &str, flag: &str) -> Result<(u64, u64), PlotError> {
        let bad =
            || PlotError::Input(format!("{flag} {s}: expected START:END, grid step indices with START < END (END exclusive), e.g. 0:8"));
        let (a, b) = s.split_once(':').ok_or_else(bad)?;
        let a = if a.trim().is_empty() { 0 } else { a.trim().parse::<u64>().map_err(|_| bad())? };
        let b = if b.trim().is_empty() { u64::MAX } else { b.trim().parse::<u64>().map_err(|_| bad())? };
        if a >= b {
            return Err(bad());
        }
        Ok((a, b))
    }

    /// Whether a step is inside the window.
    pub fn contains(&self, index: u64, step: &Step) -> bool {
        self.steps.is_none_or(|(a, b)| index >= a && index < b) && self.head.is_none_or(|h| step.coords[0] == h)
    }

    /// Whether the window bounds anything.
    pub fn is_bounded(&self) -> bool {
        self.steps.is_some() || self.head.is_some()
    }
}

/// One timeline event, in cycles from the start of the run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Event {
    /// Track.
    pub track: Track,
    /// Operation name (`qk`, `exp`, ..., `dma in`, `write-back`, `step overhead`).
    pub name: &'static str,
    /// Start, cycles.
    pub start: f64,
    /// Duration, cycles.
    pub dur: f64,
    /// Grid step index.
    pub step: u64,
    /// Grid coordinates of the step.
    pub coords: [u32; 4],
    /// Tile kind of the step (`empty`, `partial`, `full`).
    pub tile: &'static str,
    /// Whether the step applies the element-wise mask.
    pub masked: bool,
    /// Bytes moved (DMA events), else 0.
    pub bytes: u64,
}

/// Calls `f` for every event of the steps in `window`, in step order, and returns the
/// simulation result (identical to [`tpusim_engine::simulate`]). Zero-length operations are
/// skipped.
pub fn for_each_event(chip: &ChipModel, program: &Program, window: &Window, f: &mut dyn FnMut(&Event)) -> SimResult {
    simulate_observed(chip, program, &mut |s: &Step, t: &StepTiming| {
        if !window.contains(t.index, s) {
            return;
        }
        let class = &program.classes[s.class as usize];
        let base = Event {
            track: Track::StepControl,
            name: "step overhead",
            start: t.overhead_start,
            dur: t.scalar,
            step: t.index,
            coords: s.coords,
            tile: class.key.tile,
            masked: class.key.masked,
            bytes: 0,
        };
        if t.scalar > 0.0 {
            f(&base);
        }
        if let Some((a, b)) = t.dma_in {
            f(&Event { track: Track::DmaIn, name: "dma in", start: a, dur: b - a, bytes: program.copies_of(s).in_bytes, ..base });
        }
        for op in &t.ops {
            let dur = op.end - op.start;
            if dur > 0.0 {
                let name = class.body.graph[NodeIndex::new(op.node)].name;
                f(&Event { track: Track::of_unit(op.unit), name, start: op.start, dur, ..base });
            }
        }
        if let Some((a, b)) = t.dma_out {
            f(&Event { track: Track::DmaOut, name: "write-back", start: a, dur: b - a, bytes: program.copies_of(s).out_bytes, ..base });
        }
    })
}

/// Counts the events a window would produce without simulating (for size checks).
pub fn count_events(chip: &ChipModel, program: &Program, window: &Window) -> u64 {
    let per_class: Vec<u64> =
        program.classes.iter().map(|c| schedule_body(chip, &c.body).ops.iter().filter(|o| o.end > o.start).count() as u64).collect();
    let step_ev = u64::from(chip.fitted.grid_step_overhead_cycles.value > 0.0 || chip.fitted.dma_issue_ns.value > 0.0);
    let mut n = 0u64;
    let mut i = 0u64;
    program.for_each_step(&mut |s| {
        if window.contains(i, s) {
            n += step_ev + per_class[s.class as usize] + u64::from(program.copies_of(s).in_bytes > 0) + u64::from(program.copies_of(s).out_bytes > 0);
        }
        i += 1;
    });
    n
}

/// What a written timeline holds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceSummary {
    /// Events written (metadata excluded).
    pub events: u64,
    /// Grid steps included.
    pub steps: u64,
    /// Grid steps of the whole run.
    pub run_steps: u64,
    /// First and last included step index.
    pub step_range: Option<(u64, u64)>,
    /// Busy time per track in the window, microseconds, in [`Track::ALL`] order.
    pub busy_us: Vec<(String, f64)>,
    /// Latency of the whole run, microseconds.
    pub run_us: f64,
}

/// Largest number of events a timeline file is written with, whole run or window (about 180
/// bytes each: 180 MB).
pub const MAX_EVENTS: u64 = 1_000_000;

#[derive(Serialize)]
struct MetaArgs<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sort_index: Option<u32>,
}

#[derive(Serialize)]
struct Meta<'a> {
    name: &'a str,
    ph: &'a str,
    pid: u32,
    tid: u32,
    args: MetaArgs<'a>,
}

#[derive(Serialize)]
struct SplashArgs {
    step: u64,
    head: u32,
    q_block: u32,
    kv_block: u32,
    tile: &'static str,
    masked: bool,
    #[serde(skip_serializing_if = "is_zero")]
    bytes: u64,
}

#[derive(Serialize)]
struct MatmulArgs {
    step: u64,
    m_block: u32,
    n_block: u32,
    k_block: u32,
    #[serde(skip_serializing_if = "is_zero")]
    bytes: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

#[derive(Serialize)]
struct GridArgs {
    step: u64,
    index_first: u32,
    index_inner: u32,
    computed: bool,
    #[serde(skip_serializing_if = "is_zero")]
    bytes: u64,
}

#[derive(Serialize)]
struct FusionArgs {
    bytes: u64,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Args {
    Splash(SplashArgs),
    Matmul(MatmulArgs),
    Grid(GridArgs),
    Fusion(FusionArgs),
}

#[derive(Serialize)]
struct XEvent<'a> {
    name: &'a str,
    cat: &'a str,
    ph: &'a str,
    pid: u32,
    tid: u32,
    ts: f64,
    dur: f64,
    args: Args,
}

/// What a step's events carry as arguments (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepArgs {
    /// Attention: `head`, `q_block`, `kv_block`, `tile`, `masked`.
    Attention,
    /// A hand-modelled matmul: `m_block`, `n_block`, `k_block`.
    Matmul,
    /// A kernel read from its IR (`tpusim run --kernel-ir`): `index_first` (the grid index of
    /// dimension 0), `index_inner` (of the innermost dimension) and `computed` (whether the
    /// step's body runs work). `dims` is the grid's number of dimensions (for labels).
    Grid {
        /// Grid dimensions.
        dims: u8,
    },
}

/// One phase of a [`Timed`] run.
#[derive(Debug, Clone, Copy)]
pub enum TimedWork<'a> {
    /// A Pallas kernel's program.
    Kernel(&'a Program),
    /// An XLA data-movement fusion.
    Fusion(&'a tpusim_model::Fusion),
}

/// A phase of a run as a timeline draws it: its work, the label of its part (`forward`, `dq`,
/// ...), and its simulation.
#[derive(Debug, Clone, Copy)]
pub struct TimedPhase<'a> {
    /// The work.
    pub work: TimedWork<'a>,
    /// Its part's label (in the process name).
    pub part: &'a str,
    /// The phase's name (the kernel's or the fusion's).
    pub name: &'a str,
    /// Its simulation on `chip`.
    pub result: &'a SimResult,
}

/// What a timeline draws: the chip and the phases of a run in order, with the run's latency.
/// Both front ends build one: [`Timed::of_run`] for a hand-modelled job (a [`Run`], one or
/// several phases), [`Timed::of_program`] for one program and its [`SimResult`] (a kernel read
/// from its IR).
#[derive(Debug, Clone)]
pub struct Timed<'a> {
    /// The chip simulated.
    pub chip: &'a ChipModel,
    /// The phases, in execution order.
    pub phases: Vec<TimedPhase<'a>>,
    /// The run's name (`otherData.kernel`).
    pub kernel: &'a str,
    /// The run's latency, seconds.
    pub seconds: f64,
    /// What step events carry as arguments.
    pub args: StepArgs,
}

impl<'a> Timed<'a> {
    /// The phases of a run (a kernel read from its IR: its one kernel, steps by grid index).
    pub fn of_run(run: &'a Run) -> Self {
        let described = match &run.job {
            tpusim_job::Job::Described(d) => Some(d.description.grid.len().min(255) as u8),
            _ => None,
        };
        let phases = run
            .lowered
            .phases
            .iter()
            .zip(&run.phases)
            .map(|(p, r)| TimedPhase {
                work: match &p.work {
                    PhaseWork::Kernel(k) => TimedWork::Kernel(k),
                    PhaseWork::Fusion(f) => TimedWork::Fusion(f),
                },
                part: if described.is_some() { "from its Mosaic IR" } else { p.part.label() },
                name: &r.name,
                result: &r.result,
            })
            .collect();
        let args = match described {
            Some(dims) => StepArgs::Grid { dims },
            None if run.program.info.kind == tpusim_model::KernelKind::Attention => StepArgs::Attention,
            None => StepArgs::Matmul,
        };
        Timed { chip: &run.chip, phases, kernel: &run.program.info.kernel, seconds: run.result.seconds, args }
    }

    /// One program simulated on `chip` (`result` is `tpusim_engine::simulate(chip, program)`),
    /// its process labelled `part`; its steps carry `args`.
    pub fn of_program(chip: &'a ChipModel, program: &'a Program, result: &'a SimResult, part: &'a str, args: StepArgs) -> Self {
        let phases = vec![TimedPhase { work: TimedWork::Kernel(program), part, name: &program.info.kernel, result }];
        Timed { chip, phases, kernel: &program.info.kernel, seconds: result.seconds, args }
    }

    /// What grid coordinate 0 indexes, in words, for messages.
    fn first_dim_words(&self) -> &'static str {
        match self.args {
            StepArgs::Grid { .. } => "indices of grid dimension 0",
            StepArgs::Attention | StepArgs::Matmul => "batch x head indices",
        }
    }

    /// Extent of grid dimension 0 of the first kernel (batch x heads for attention), at least 1.
    fn first_extent(&self) -> u64 {
        self.kernels().next().and_then(|(k, _, _)| k.info.grid.first().map(|g| g.1)).unwrap_or(1).max(1)
    }

    /// The kernels with their part label and start, cycles.
    fn kernels(&self) -> impl Iterator<Item = (&'a Program, &'a str, f64)> + '_ {
        let mut offset = 0.0;
        self.phases.iter().filter_map(move |p| {
            let off = offset;
            offset += p.result.cycles;
            match p.work {
                TimedWork::Kernel(k) => Some((k, p.part, off)),
                TimedWork::Fusion(_) => None,
            }
        })
    }
}

/// Writes the timeline of `run` over `window` to `path` as Chrome Trace Event JSON, atomically,
/// streaming (memory does not grow with the number of events).
///
/// # Errors
/// [`PlotError`] naming `flag` when the file cannot be written, or when the window (the whole
/// run when unbounded) would produce more than [`MAX_EVENTS`] events (the message
/// suggests `--timeline-steps` / `--timeline-head`), or when the window holds no step.
pub fn write_chrome_trace(run: &Run, window: &Window, path: &Path, flag: &str) -> Result<TraceSummary, PlotError> {
    write_chrome_trace_with(&Timed::of_run(run), window, path, flag, None)
}

/// Measured device ops shown beside a simulated timeline (process [`MEASURED_PID`] of the same trace
/// file).
#[derive(Debug, Clone, PartialEq)]
pub struct MeasuredTrack {
    /// The process's name, e.g. `measured: trace.json.gz`.
    pub process: String,
    /// (thread name, op name, start µs, duration µs); starts are shifted so the first op starts
    /// at 0, like the simulated run.
    pub ops: Vec<(String, String, f64, f64)>,
}

/// Writes the timeline of `timed` (a hand-modelled run, [`Timed::of_run`], or one program, a
/// kernel read from its IR, [`Timed::of_program`]) over `window` to `path`, with measured ops
/// beside the simulation when given: one trace file, the simulated kernels as processes from 1,
/// the XLA ops [`FUSION_PID`], the measured ops [`MEASURED_PID`] (one thread per device line),
/// all starting at 0.
///
/// # Errors
/// As [`write_chrome_trace`].
pub fn write_chrome_trace_with(
    timed: &Timed<'_>,
    window: &Window,
    path: &Path,
    flag: &str,
    measured: Option<&MeasuredTrack>,
) -> Result<TraceSummary, PlotError> {
    let chip = timed.chip;
    // The phases in order with their start (cycles): kernels and the XLA ops around them.
    let mut phases: Vec<(&TimedPhase, f64)> = Vec::new();
    let mut offset = 0.0;
    for p in &timed.phases {
        phases.push((p, offset));
        offset += p.result.cycles;
    }
    let kernels: Vec<(&Program, &str, f64)> = timed.kernels().collect();
    let run_steps: u64 = kernels.iter().map(|(k, _, _)| k.info.grid_steps).sum();
    let n: u64 = kernels.iter().map(|(k, _, _)| count_events(chip, k, window)).sum();
    let first_steps = kernels.first().map_or(0, |(k, _, _)| k.info.grid_steps);
    if n > MAX_EVENTS {
        let (mb, what) = (n * 180 / 1_000_000, if window.is_bounded() { "the window" } else { "the whole run" });
        let how = if window.is_bounded() {
            "narrow --timeline-steps START:END and/or give --timeline-head H".to_string()
        } else {
            let heads = timed.first_extent();
            format!(
                "window it with --timeline-steps START:END (grid steps, e.g. --timeline-steps 0:16) and/or --timeline-head H (one of {heads} {}, about {} steps each)",
                timed.first_dim_words(),
                first_steps.div_ceil(heads)
            )
        };
        return Err(PlotError::Input(format!(
            "{flag} {}: not written: {what} holds {n} events of a run of {run_steps} grid steps (about {mb} MB, more than {MAX_EVENTS} events); {how}",
            path.display()
        )));
    }
    if n == 0 {
        // The flags that set the window, as given.
        let mut given = Vec::new();
        if let Some(h) = window.head {
            given.push(format!("--timeline-head {h}"));
        }
        if let Some((a, b)) = window.steps {
            given.push(format!("--timeline-steps {a}:{b}"));
        }
        let given = if given.is_empty() { String::new() } else { format!(" ({})", given.join(", ")) };
        return Err(PlotError::Input(format!(
            "{flag} {}: the window{given} holds no grid step (the run has {} steps and {} {}, indexed from 0)",
            path.display(),
            run_steps,
            timed.first_extent(),
            timed.first_dim_words()
        )));
    }
    let us = 1e6 / chip.clock_hz();
    let mut summary = TraceSummary {
        events: 0,
        steps: 0,
        run_steps,
        step_range: None,
        busy_us: Track::ALL.iter().map(|t| (t.key().to_string(), 0.0)).collect(),
        run_us: 0.0,
    };
    let window_text = match (window.steps, window.head) {
        (None, None) => "whole run".to_string(),
        (s, h) => {
            let mut v = Vec::new();
            if let Some((a, b)) = s {
                // An end past the run is the run's end.
                v.push(if b == u64::MAX { format!("steps {a}..") } else { format!("steps {a}..{}", b.min(run_steps)) });
            }
            if let Some(h) = h {
                v.push(format!("head {h}"));
            }
            v.join(", ")
        }
    };
    crate::atomic_with(path, flag, |file| {
        let mut w = BufWriter::with_capacity(1 << 20, file);
        // The overwrite rule's mark (tpusim_io::mark) first, where a reader finds it.
        let mark = serde_json::to_string(&tpusim_io::mark::mark_value("run --timeline")).unwrap_or_default();
        writeln!(w, "{{\"{}\":{mark},\"traceEvents\":[", tpusim_io::mark::JSON_KEY)?;
        let mut first = true;
        let mut meta = |w: &mut BufWriter<&mut std::fs::File>, m: &Meta| -> std::io::Result<()> {
            if !first {
                w.write_all(b",\n")?;
            }
            first = false;
            serde_json::to_writer(&mut *w, m).map_err(std::io::Error::from)
        };
        for (i, (k, part, _)) in kernels.iter().enumerate() {
            let pid = i as u32 + 1;
            let process = format!("tpusim: {} ({part}) on {} ({window_text})", k.info.kernel, chip.name)
                .replace(" (fused dq/dk/dv) (fused dq/dk/dv)", " (fused dq/dk/dv)");
            meta(&mut w, &Meta { name: "process_name", ph: "M", pid, tid: 0, args: MetaArgs { name: Some(&process), sort_index: None } })?;
            meta(&mut w, &Meta { name: "process_sort_index", ph: "M", pid, tid: 0, args: MetaArgs { name: None, sort_index: Some(pid) } })?;
            for t in Track::ALL {
                meta(
                    &mut w,
                    &Meta { name: "thread_name", ph: "M", pid, tid: t.tid(), args: MetaArgs { name: Some(t.name()), sort_index: None } },
                )?;
                meta(
                    &mut w,
                    &Meta {
                        name: "thread_sort_index",
                        ph: "M",
                        pid,
                        tid: t.tid(),
                        args: MetaArgs { name: None, sort_index: Some(t.tid()) },
                    },
                )?;
            }
        }
        let fusions = phases.iter().any(|(p, _)| matches!(p.work, TimedWork::Fusion(_)));
        if fusions {
            let name = "XLA ops outside the kernels";
            meta(
                &mut w,
                &Meta { name: "process_name", ph: "M", pid: FUSION_PID, tid: 0, args: MetaArgs { name: Some(name), sort_index: None } },
            )?;
            meta(
                &mut w,
                &Meta {
                    name: "thread_name",
                    ph: "M",
                    pid: FUSION_PID,
                    tid: 1,
                    args: MetaArgs { name: Some("HBM fusions"), sort_index: None },
                },
            )?;
        }
        let mut err: Option<std::io::Error> = None;
        fn write(w: &mut BufWriter<&mut std::fs::File>, ev: &XEvent) -> std::io::Result<()> {
            w.write_all(b",\n").and_then(|_| serde_json::to_writer(&mut *w, ev).map_err(std::io::Error::from))
        }
        let mut kernel_index = 0u32;
        for (p, off) in &phases {
            match p.work {
                TimedWork::Fusion(f) => {
                    let (ts, dur) = (off * us, p.result.cycles * us);
                    let ev = XEvent {
                        name: &f.name,
                        cat: "xla",
                        ph: "X",
                        pid: FUSION_PID,
                        tid: 1,
                        ts,
                        dur,
                        args: Args::Fusion(FusionArgs { bytes: f.read_bytes + f.write_bytes }),
                    };
                    summary.events += 1;
                    write(&mut w, &ev)?;
                }
                TimedWork::Kernel(program) => {
                    kernel_index += 1;
                    let pid = kernel_index;
                    let mut last_step = None;
                    for_each_event(chip, program, window, &mut |e| {
                        if err.is_some() {
                            return;
                        }
                        if last_step != Some(e.step) {
                            last_step = Some(e.step);
                            summary.steps += 1;
                            if pid == 1 {
                                summary.step_range = Some((summary.step_range.map_or(e.step, |r| r.0), e.step));
                            }
                        }
                        let args = match timed.args {
                            StepArgs::Attention => Args::Splash(SplashArgs {
                                step: e.step,
                                head: e.coords[0],
                                q_block: e.coords[1],
                                kv_block: e.coords[2],
                                tile: e.tile,
                                masked: e.masked,
                                bytes: e.bytes,
                            }),
                            StepArgs::Matmul => Args::Matmul(MatmulArgs {
                                step: e.step,
                                m_block: e.coords[1],
                                n_block: e.coords[2],
                                k_block: e.coords[3],
                                bytes: e.bytes,
                            }),
                            StepArgs::Grid { .. } => Args::Grid(GridArgs {
                                step: e.step,
                                index_first: e.coords[0],
                                index_inner: e.coords[2],
                                computed: e.tile != "empty",
                                bytes: e.bytes,
                            }),
                        };
                        // Both ends converted, and the duration their difference: an event that
                        // starts where the previous one on its track ended then starts exactly at
                        // that event's ts + dur (no rounding overlap for viewers that require
                        // disjoint slices).
                        let ts = (off + e.start) * us;
                        let dur = (off + e.start + e.dur) * us - ts;
                        summary.busy_us[e.track as usize].1 += dur;
                        summary.events += 1;
                        if let Err(x) =
                            write(&mut w, &XEvent { name: e.name, cat: e.track.key(), ph: "X", pid, tid: e.track.tid(), ts, dur, args })
                        {
                            err = Some(x);
                        }
                    });
                }
            }
        }
        if let Some(e) = err {
            return Err(e);
        }
        if let Some(m) = measured {
            w.write_all(b",\n")?;
            serde_json::to_writer(
                &mut w,
                &Meta {
                    name: "process_name",
                    ph: "M",
                    pid: MEASURED_PID,
                    tid: 0,
                    args: MetaArgs { name: Some(&m.process), sort_index: None },
                },
            )?;
            let t0 = m.ops.iter().map(|o| o.2).fold(f64::INFINITY, f64::min);
            let mut tids: Vec<&str> = Vec::new();
            for (thread, name, ts, dur) in &m.ops {
                let tid = match tids.iter().position(|t| t == thread) {
                    Some(i) => i as u32 + 1,
                    None => {
                        tids.push(thread);
                        w.write_all(b",\n")?;
                        serde_json::to_writer(
                            &mut w,
                            &Meta {
                                name: "thread_name",
                                ph: "M",
                                pid: MEASURED_PID,
                                tid: tids.len() as u32,
                                args: MetaArgs { name: Some(thread), sort_index: None },
                            },
                        )?;
                        tids.len() as u32
                    }
                };
                w.write_all(b",\n")?;
                let ev = serde_json::json!({"name": name, "cat": "measured", "ph": "X", "pid": MEASURED_PID, "tid": tid, "ts": ts - t0, "dur": dur});
                serde_json::to_writer(&mut w, &ev)?;
            }
        }
        summary.run_us = timed.seconds * 1e6;
        w.write_all(b"\n],\n\"displayTimeUnit\":\"ns\",\n\"otherData\":")?;
        let other = serde_json::json!({
            "generator": "tpusim run --timeline",
            "chip": chip.name,
            "kernel": timed.kernel,
            "phases": phases.iter().map(|(p, off)| serde_json::json!({"name": p.name, "part": p.part, "start_us": off * us, "latency_us": p.result.seconds * 1e6})).collect::<Vec<_>>(),
            "clock_ghz": chip.device.clock_ghz.value,
            "time_unit": "us",
            "window_steps": window.steps.map(|(a, b)| vec![a, b.min(run_steps)]),
            "window_head": window.head,
            "whole_run": !window.is_bounded(),
            "steps_included": summary.steps,
            "run_grid_steps": summary.run_steps,
            "run_latency_us": summary.run_us,
            "busy_us": summary.busy_us.iter().map(|(k, v)| (k.clone(), serde_json::json!(v))).collect::<serde_json::Map<_, _>>(),
        });
        serde_json::to_writer(&mut w, &other)?;
        w.write_all(b"}\n")?;
        w.flush()
    })?;
    Ok(summary)
}

/// Process id of the XLA ops outside the kernels in a written timeline.
pub const FUSION_PID: u32 = 100;

/// The process id of the measured ops (`run --compare-trace`) in a timeline.
pub const MEASURED_PID: u32 = 200;

/// A timeline event in microseconds, as read back from a Chrome trace or converted from
/// [`Event`] (for the Gantt figure).
#[derive(Debug, Clone, PartialEq)]
pub struct UsEvent {
    /// Track.
    pub track: Track,
    /// Operation name.
    pub name: String,
    /// Start, microseconds.
    pub ts: f64,
    /// Duration, microseconds.
    pub dur: f64,
    /// Grid step index.
    pub step: u64,
    /// Batch x head index of the step (attention), if known.
    pub head: Option<u32>,
    /// Short description of the step (`h0 q1 kv3 full masked`).
    pub desc: String,
}

fn describe(e: &Event, args: StepArgs) -> String {
    match args {
        StepArgs::Attention => {
            format!("h{} q{} kv{} {}{}", e.coords[0], e.coords[1], e.coords[2], e.tile, if e.masked { " masked" } else { "" })
        }
        StepArgs::Matmul => format!("m{} n{} k{}", e.coords[1], e.coords[2], e.coords[3]),
        StepArgs::Grid { dims } => {
            let c = e.coords;
            let idx = match dims {
                0 | 1 => format!("({})", c[0]),
                2 => format!("({}, {})", c[0], c[2]),
                3 => format!("({}, {}, {})", c[0], c[1], c[2]),
                _ => format!("({}, .., {}, {})", c[0], c[1], c[2]),
            };
            format!("grid {idx}{}", if e.tile == "empty" { " skipped" } else { "" })
        }
    }
}

/// The events of `run` over `window`, in microseconds.
pub fn collect_us(run: &Run, window: &Window) -> Vec<UsEvent> {
    let args = Timed::of_run(run).args;
    collect_us_of(&run.chip, &run.program, window, args)
}

/// The events of `program` on `chip` over `window`, in microseconds, described as `args` says
/// (a kernel read from its IR: [`StepArgs::Grid`]).
pub fn collect_us_of(chip: &ChipModel, program: &Program, window: &Window, args: StepArgs) -> Vec<UsEvent> {
    let us = 1e6 / chip.clock_hz();
    let mut out = Vec::new();
    for_each_event(chip, program, window, &mut |e| {
        out.push(UsEvent {
            track: e.track,
            name: e.name.to_string(),
            ts: e.start * us,
            dur: e.dur * us,
            step: e.step,
            head: (args == StepArgs::Attention).then_some(e.coords[0]),
            desc: describe(e, args),
        });
    });
    out
}

/// Reads a Chrome trace written by [`write_chrome_trace`] (or any trace whose thread names are
/// track names) back into events.
///
/// # Errors
/// [`PlotError`] naming `flag` and the file when it cannot be read, is not JSON, has no
/// `traceEvents` array, or has no complete event on a known track.
pub fn read_chrome_trace(path: &str, flag: &str) -> Result<Vec<UsEvent>, PlotError> {
    let text = std::fs::read_to_string(path).map_err(|e| PlotError::Input(format!("{flag} {path}: cannot read: {e}")))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| PlotError::Input(format!("{flag} {path}: not JSON: {e}")))?;
    let evs = v.get("traceEvents").and_then(|e| e.as_array()).or_else(|| v.as_array()).ok_or_else(|| {
        PlotError::Input(format!("{flag} {path}: no traceEvents array (expected a Chrome trace from tpusim run --timeline)"))
    })?;
    let mut tracks = std::collections::HashMap::new();
    for e in evs {
        if e.get("ph").and_then(|p| p.as_str()) == Some("M") && e.get("name").and_then(|n| n.as_str()) == Some("thread_name") {
            if let (Some(tid), Some(t)) =
                (e.get("tid").and_then(|t| t.as_u64()), e.pointer("/args/name").and_then(|n| n.as_str()).and_then(Track::from_name))
            {
                tracks.insert(tid, t);
            }
        }
    }
    let mut out = Vec::new();
    for e in evs {
        if e.get("ph").and_then(|p| p.as_str()) != Some("X") {
            continue;
        }
        let Some(track) = e.get("tid").and_then(|t| t.as_u64()).and_then(|t| tracks.get(&t)).copied() else {
            continue;
        };
        let num = |k: &str| e.get(k).and_then(|x| x.as_f64());
        let (Some(ts), Some(dur)) = (num("ts"), num("dur")) else {
            continue;
        };
        let a = |k: &str| e.pointer(&format!("/args/{k}")).and_then(|x| x.as_u64());
        let desc = match (a("head"), a("q_block"), a("kv_block")) {
            (Some(h), Some(q), Some(k)) => format!(
                "h{h} q{q} kv{k} {}{}",
                e.pointer("/args/tile").and_then(|x| x.as_str()).unwrap_or(""),
                if e.pointer("/args/masked").and_then(|x| x.as_bool()) == Some(true) { " masked" } else { "" }
            ),
            _ => match (a("m_block"), a("n_block"), a("k_block")) {
                (Some(m), Some(n), Some(k)) => format!("m{m} n{n} k{k}"),
                _ => match (a("index_first"), a("index_inner")) {
                    (Some(f), Some(i)) => format!(
                        "grid ({f}, .., {i}){}",
                        if e.pointer("/args/computed").and_then(|x| x.as_bool()) == Some(false) { " skipped" } else { "" }
                    ),
                    _ => String::new(),
                },
            },
        };
        out.push(UsEvent {
            track,
            name: e.get("name").and_then(|n| n.as_str()).unwrap_or("").to_string(),
            ts,
            dur,
            step: a("step").unwrap_or(0),
            head: a("head").map(|h| h as u32),
            desc,
        });
    }
    if out.is_empty() {
        return Err(PlotError::Input(format!(
            "{flag} {path}: no complete (\"ph\": \"X\") events on tracks named {}",
            Track::ALL.iter().map(|t| t.name()).collect::<Vec<_>>().join(", ")
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tpusim_job::JobSpec;

    fn small_run() -> Run {
        let spec = JobSpec {
            seq_len: Some(2048),
            heads: Some(2),
            mask: Some("causal".into()),
            block_q: Some(512),
            block_kv: Some(512),
            ..Default::default()
        };
        let chip = spec.chip().unwrap();
        let job = spec.build(&chip).unwrap();
        tpusim_job::run(&chip, &job).unwrap()
    }

    #[test]
    fn whole_run_totals_equal_busy() {
        let r = small_run();
        let mut busy = [0.0f64; 7];
        let res = for_each_event(&r.chip, &r.program, &Window::default(), &mut |e| busy[e.track as usize] += e.dur);
        // The critical path is split by fractional shares, so its sums may differ in the last
        // bits with the order of summation; every other field is exact.
        for (a, b) in res.critical.iter().zip(r.result.critical.iter()) {
            assert!((a.1 - b.1).abs() <= 1e-9 * b.1.abs().max(1.0), "critical {:?}: {} vs {}", a.0, a.1, b.1);
        }
        assert_eq!(SimResult { critical: r.result.critical, ..res.clone() }, r.result);
        let b = &r.result.busy;
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1.0);
        use tpusim_model::Unit;
        assert!(
            close(busy[0], b[Unit::Mxu]) && close(busy[1], b[Unit::Vpu]) && close(busy[2], b[Unit::Eup]) && close(busy[3], b[Unit::Xlu]),
            "{busy:?} {b:?}"
        );
        assert!(close(busy[4] + busy[5], b[Unit::Hbm]), "{busy:?} {b:?}");
        assert!(close(busy[6], b[Unit::StepControl]));
    }

    #[test]
    fn tracks_never_overlap() {
        // A track is one unit (or one DMA engine for both directions): Chrome trace viewers need
        // its slices disjoint.
        let r = small_run();
        let mut spans: Vec<Vec<(f64, f64)>> = vec![Vec::new(); 7];
        for_each_event(&r.chip, &r.program, &Window::default(), &mut |e| {
            let i = if e.track == Track::DmaOut { Track::DmaIn as usize } else { e.track as usize };
            spans[i].push((e.start, e.start + e.dur));
        });
        for (i, v) in spans.iter_mut().enumerate() {
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
            for w in v.windows(2) {
                assert!(w[1].0 >= w[0].1 - 1e-6, "track {i}: {:?} overlaps {:?}", w[0], w[1]);
            }
        }
        assert!(!spans[4].is_empty());
    }

    #[test]
    fn window_parsing_and_counting() {
        assert_eq!(Window::parse_steps("3:9", "--steps").unwrap(), (3, 9));
        assert_eq!(Window::parse_steps(":9", "--steps").unwrap(), (0, 9));
        assert_eq!(Window::parse_steps("4:", "--steps").unwrap(), (4, u64::MAX));
        for bad in ["9:3", "x", "1:y", "5:5"] {
            assert!(Window::parse_steps(bad, "--steps").unwrap_err().to_string().contains("--steps"), "{bad}");
        }
        let r = small_run();
        let w = Window { steps: Some((2, 5)), head: None };
        let mut n = 0u64;
        for_each_event(&r.chip, &r.program, &w, &mut |_| n += 1);
        assert_eq!(n, count_events(&r.chip, &r.program, &w));
        let h = Window { steps: None, head: Some(1) };
        let mut heads = std::collections::BTreeSet::new();
        for_each_event(&r.chip, &r.program, &h, &mut |e| {
            heads.insert(e.coords[0]);
        });
        assert_eq!(heads.into_iter().collect::<Vec<_>>(), vec![1]);
    }
}
