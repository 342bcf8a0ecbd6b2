//! Jobs for the simulation-driven figures (roofline, tiles, timeline, breakdown): trace files
//! (TOML [`JobSpec`]s, as `tpusim run --trace`) overlaid by flags, optionally run on several
//! chips, each with a label for legends.

use crate::PlotError;
use tpusim_report::{run, Job, JobSpec, Report, Run};

/// A job to run and the label that names it in a figure.
#[derive(Debug, Clone, PartialEq)]
pub struct LabelledSpec {
    /// Legend label.
    pub label: String,
    /// The job.
    pub spec: JobSpec,
}

/// A job that ran.
#[derive(Debug, Clone)]
pub struct JobRun {
    /// Legend label.
    pub label: String,
    /// Lowered program and simulation.
    pub run: Run,
    /// Its report.
    pub report: Report,
}

/// Expands trace files x chips into labelled job specs.
///
/// With no trace files, one job from `overlay` alone (the built-in video case unless flags say
/// otherwise), labelled `default`. Each trace file's label is its file stem; with more than one
/// chip, the chip name is appended. `labels`, when given, replace the automatic labels in order
/// and must match the number of jobs.
///
/// # Errors
/// [`PlotError`] naming `--trace` for unreadable or invalid files and `--label` for a count
/// mismatch.
pub fn expand(traces: &[String], overlay: &JobSpec, chips: &[String], labels: &[String]) -> Result<Vec<LabelledSpec>, PlotError> {
    let mut bases = Vec::new();
    if traces.is_empty() {
        bases.push(("default".to_string(), JobSpec::default()));
    }
    for t in traces {
        let spec = JobSpec::from_toml_file(t).map_err(|source| PlotError::Spec { context: format!("--trace {t}: "), source })?;
        let stem = std::path::Path::new(t).file_stem().and_then(|s| s.to_str()).unwrap_or(t).to_string();
        bases.push((stem, spec));
    }
    let mut out = Vec::new();
    for (label, base) in bases {
        let spec = base.overlay(overlay);
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
    let ctx = |source: tpusim_report::SpecError| PlotError::Spec { context: format!("job {}: ", j.label), source };
    let chip = j.spec.chip().map_err(ctx)?;
    let job = j.spec.build(&chip).map_err(ctx)?;
    let r = run(&chip, &job).map_err(|e| ctx(e.into()))?;
    let report = Report::from_run(&r);
    Ok(JobRun { label: j.label.clone(), run: r, report })
}

/// Runs every job in order.
///
/// # Errors
/// The first job's error.
pub fn run_all(jobs: &[LabelledSpec]) -> Result<Vec<JobRun>, PlotError> {
    jobs.iter().map(run_one).collect()
}

/// The attention workload and configuration of a run.
///
/// # Errors
/// [`PlotError`] naming `kind` when the job is not attention.
pub fn splash_of<'a>(
    r: &'a JobRun,
    kind: &str,
) -> Result<(&'a tpusim_workload::AttentionCall, &'a tpusim_kernel::SplashConfig), PlotError> {
    match &r.run.job {
        Job::Attention { workload, config, .. } => Ok((workload, config)),
        Job::Matmul { .. } => {
            Err(PlotError::Input(format!("{kind} needs an attention job (an attention --kernel); job {} is a matmul", r.label)))
        }
    }
}

/// A one-line description of a job: chip, workload and kernel configuration.
pub fn describe(r: &JobRun) -> String {
    let chip = &r.report.chip;
    match &r.run.job {
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
        assert_eq!(j.iter().map(|j| j.label.as_str()).collect::<Vec<_>>(), ["default (v6e)", "default (v5e)"]);
        assert_eq!(j[1].spec.chip.as_deref(), Some("v5e"));
        let e = expand(&[], &JobSpec::default(), &[], &["a".into(), "b".into()]).unwrap_err().to_string();
        assert!(e.contains("--label"), "{e}");
        let e = expand(&["/nonexistent.toml".into()], &JobSpec::default(), &[], &[]).unwrap_err().to_string();
        assert!(e.contains("--trace /nonexistent.toml"), "{e}");
    }
}
