//! Jobs for the simulation-driven figures (roofline, tiles, timeline, breakdown): trace files
//! (TOML [`JobSpec`]s, as `tpusim run --trace`) overlaid by flags, and kernels read from their
//! Mosaic IR (kernel description files, as `tpusim run --kernel-ir`), optionally run on several
//! chips, each with a label for legends.

use crate::PlotError;
use tpusim_chip::ChipModel;
use tpusim_engine::SimResult;
use tpusim_model::{PerUnit, Unit};
use tpusim_job::{run, Job, JobSpec, Report, Run};

/// A job to run and the label that names it in a figure.
#[derive(Debug, Clone, PartialEq)]
pub struct LabelledSpec {
    /// Legend label.
    pub label: String,
    /// The job (a kernel family's, or a kernel read from its IR: `kernel_ir`).
    pub spec: JobSpec,
}

/// A job that ran (a hand-modelled job or a kernel read from its IR: one run, one report).
#[derive(Debug, Clone)]
pub struct JobRun {
    /// Legend label.
    pub label: String,
    /// The lowering and simulation.
    pub run: Box<Run>,
    /// Its report (with its what-if table).
    pub report: Box<Report>,
}

impl JobRun {
    /// The run of `label`, reported.
    pub fn new(label: String, run: Run) -> Self {
        let report = Report::from_run(&run);
        JobRun { label, run: Box::new(run), report: Box::new(report) }
    }

    /// The job that ran.
    pub fn job(&self) -> &Job {
        &self.run.job
    }

    /// The chip it ran on.
    pub fn chip(&self) -> &ChipModel {
        &self.run.chip
    }

    /// The whole run's simulation.
    pub fn result(&self) -> &SimResult {
        &self.run.result
    }

    /// Latency, ms (the report's).
    pub fn latency_ms(&self) -> f64 {
        self.report.latency_ms
    }

    /// Busy time per unit, ms (the report's).
    pub fn busy_ms(&self) -> PerUnit<f64> {
        self.report.busy_ms
    }

    /// The bounding unit (the report's, [`Report::bottleneck`]).
    pub fn bottleneck(&self) -> Unit {
        self.report.bottleneck
    }

    /// MFU (the report's).
    pub fn mfu(&self) -> f64 {
        self.report.mfu
    }
}

/// Expands trace files x chips into labelled job specs.
///
/// With no trace files, the default job of `tpusim run` ([`tpusim_job::case_study_or`]: the
/// built-in case study, labelled `video-720p-dense`, on `overlay`'s chip and overrides) when
/// `overlay` gives no job field, else one job from `overlay` alone (the family's defaults),
/// labelled `default`. Each trace file's label is its file stem; with more than one
/// chip, the chip name is appended. `labels`, when given, replace the automatic labels in order
/// and must match the number of jobs.
///
/// # Errors
/// [`PlotError`] naming `--trace` for unreadable or invalid files and `--label` for a count
/// mismatch.
pub fn expand(traces: &[String], overlay: &JobSpec, chips: &[String], labels: &[String]) -> Result<Vec<LabelledSpec>, PlotError> {
    expand_with(traces, &[], overlay, chips, labels)
}

/// [`expand`] with kernel description files too (`--kernel-ir`, after the trace files, each
/// labelled by its file stem and run on each chip like a trace). With description files and no
/// trace file there is no default job, and `overlay` may set only `chip` and `set` (the
/// lowering fixed the rest).
///
/// # Errors
/// As [`expand`]; a job field other than `chip` and `set` given for description files alone
/// is an error naming its flag.
pub fn expand_with(
    traces: &[String],
    kernel_irs: &[String],
    overlay: &JobSpec,
    chips: &[String],
    labels: &[String],
) -> Result<Vec<LabelledSpec>, PlotError> {
    if !kernel_irs.is_empty() && traces.is_empty() {
        let given: Vec<String> =
            overlay.set_fields().keys().filter(|k| !matches!(k.as_str(), "chip" | "set")).map(|k| format!("--{}", k.replace('_', "-"))).collect();
        if !given.is_empty() {
            return Err(PlotError::Input(format!(
                "{}: not with --kernel-ir: a kernel's lowering fixed its workload, mask and block sizes (only --chip, --chips and --set apply; give --trace for jobs these flags describe)",
                given.join(", ")
            )));
        }
    }
    let mut bases = Vec::new();
    if traces.is_empty() && kernel_irs.is_empty() {
        // The default job of `tpusim run` (the built-in case study) unless job flags are given.
        if tpusim_job::gives_no_job(overlay) {
            let stem = std::path::Path::new(tpusim_job::CASE_STUDY_PATH).file_stem().and_then(|s| s.to_str()).unwrap_or("default");
            bases.push((stem.to_string(), tpusim_job::case_study(), false));
        } else {
            bases.push(("default".to_string(), JobSpec::default(), false));
        }
    }
    for t in traces {
        // One prefix, as `tpusim run --trace` prints it: a trace's own error names its file.
        let spec = JobSpec::from_toml_file(t).map_err(|source| match source {
            tpusim_job::SpecError::Trace { path, message } if path == *t => PlotError::new(format!("--trace {t}: {message}")),
            source => PlotError::Spec { context: format!("--trace {t}: "), source },
        })?;
        let stem = std::path::Path::new(t).file_stem().and_then(|s| s.to_str()).unwrap_or(t).to_string();
        bases.push((stem, spec, false));
    }
    for k in kernel_irs {
        let stem = std::path::Path::new(k).file_stem().and_then(|s| s.to_str()).unwrap_or(k).to_string();
        let spec = JobSpec { chip: overlay.chip.clone(), set: overlay.set.clone(), kernel_ir: Some(k.clone()), ..Default::default() };
        bases.push((stem, spec, true));
    }
    let mut out = Vec::new();
    for (label, base, described) in bases {
        // The job flags overlay the traces' jobs; a description file takes only the chip.
        let spec = if described { base } else { base.overlay(overlay) };
        if chips.is_empty() {
            out.push(LabelledSpec { label, spec });
        } else {
            for c in chips {
                let mut s = spec.clone();
                s.chip = Some(c.clone());
                let l = if chips.len() > 1 { format!("{label} ({c})") } else { label.clone() };
                out.push(LabelledSpec { label: l, spec: s });
            }
        }
    }
    if !labels.is_empty() {
        if labels.len() != out.len() {
            return Err(PlotError::Input(format!(
                "--label given {} times but there are {} jobs ({}); give one label per job or none",
                labels.len(),
                out.len(),
                out.iter().map(|j| j.label.as_str()).collect::<Vec<_>>().join(", ")
            )));
        }
        for (j, l) in out.iter_mut().zip(labels) {
            j.label = l.clone();
        }
    }
    Ok(out)
}

/// Builds, lowers and simulates one labelled job.
///
/// # Errors
/// [`PlotError`] prefixed with the job's label: chip, spec or lowering errors.
pub fn run_one(j: &LabelledSpec) -> Result<JobRun, PlotError> {
    let ctx = |source: tpusim_job::SpecError| PlotError::Spec { context: format!("job {}: ", j.label), source };
    let chip = j.spec.chip().map_err(ctx)?;
    let job = j.spec.build(&chip).map_err(ctx)?;
    let r = run(&chip, &job).map_err(|e| match &j.spec.kernel_ir {
        Some(path) => PlotError::Input(format!("--kernel-ir {path}: {e}")),
        None => PlotError::Input(format!("job {}: {e}", j.label)),
    })?;
    Ok(JobRun::new(j.label.clone(), r))
}

/// Runs every job in order.
///
/// # Errors
/// The first job's error.
pub fn run_all(jobs: &[LabelledSpec]) -> Result<Vec<JobRun>, PlotError> {
    jobs.iter().map(run_one).collect()
}

/// A one-line description of a job: chip, workload and kernel configuration.
pub fn describe(r: &JobRun) -> String {
    let chip = &r.report.chip;
    match &r.run.job {
        Job::Described(d) => {
            let grid: Vec<String> = d.description.grid.iter().map(|g| g.to_string()).collect();
            format!(
                "{}: {chip}, Pallas kernel `{}` from its Mosaic IR ({}), grid {} = {} grid steps ({} computed)",
                r.label,
                d.kernel_name,
                d.file,
                grid.join(" x "),
                r.report.grid_steps,
                r.report.steps_computed
            )
        }
        Job::Attention { workload: w, config: c, .. } => {
            let heads =
                if w.kv_heads == w.q_heads { format!("{} heads", w.q_heads) } else { format!("{} q / {} kv heads", w.q_heads, w.kv_heads) };
            let len = if w.q_len == w.kv_len {
                crate::thousands(w.q_len)
            } else {
                format!("{} x {}", crate::thousands(w.q_len), crate::thousands(w.kv_len))
            };
            format!(
                "{}: {chip}, B{} x {heads} x {len} tokens, d {}, mask {}{}; blocks {}/{}/{}, {}, masking {}",
                r.label,
                w.batch,
                w.head_dim,
                w.mask,
                if c.tile_align { " (tile-aligned)" } else { "" },
                c.block_q,
                c.block_kv,
                c.block_kv_compute,
                c.traversal,
                c.masking
            )
        }
        Job::Matmul { workload: m, config: c, .. } => {
            format!("{}: {chip}, matmul {} x {} x {}, blocks {}/{}/{}", r.label, m.m, m.n, m.k, c.block_m, c.block_n, c.block_k)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_chips_and_labels() {
        let j = expand(&[], &JobSpec::default(), &["v6e".into(), "v5e".into()], &[]).unwrap();
        // No trace and no job flag: the default job of `tpusim run`, the case study.
        assert_eq!(j.iter().map(|j| j.label.as_str()).collect::<Vec<_>>(), ["video-720p-dense (v6e)", "video-720p-dense (v5e)"]);
        assert_eq!(j[0].spec.kernel, tpusim_job::case_study().kernel);
        let flagged = JobSpec { heads: Some(4), ..JobSpec::default() };
        let j2 = expand(&[], &flagged, &[], &[]).unwrap();
        assert_eq!((j2[0].label.as_str(), j2[0].spec.heads), ("default", Some(4)));
        assert_eq!(j[1].spec.chip.as_deref(), Some("v5e"));
        let e = expand(&[], &JobSpec::default(), &[], &["a".into(), "b".into()]).unwrap_err().to_string();
        assert!(e.contains("--label"), "{e}");
        let e = expand(&["/nonexistent.toml".into()], &JobSpec::default(), &[], &[]).unwrap_err().to_string();
        assert!(e.contains("--trace /nonexistent.toml"), "{e}");
    }
}
