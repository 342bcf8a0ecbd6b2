//! `tpusim run` and `tpusim chip`.

use crate::error::CliError;
use clap::{Args, Subcommand, ValueEnum};
use tpusim_chip::ChipModel;
use tpusim_job::{render_fields_with, run, JobSpec, Report};

#[derive(Subcommand, Debug)]
pub enum ChipCommand {
    /// Print a chip model: every parameter with its unit and source (or the rows it was fitted to).
    Show {
        /// Preset name (v6e, v5e, v5p, v4, v7x) or path to a chip TOML.
        chip: String,
        /// Change a parameter, e.g. --set hbm.bandwidth_gb_per_s=3276 (repeatable).
        #[arg(long = "set", value_name = "SECTION.FIELD=VALUE")]
        set: Vec<String>,
        /// Output format (json writes a chip model TOML-equivalent object).
        #[arg(long, value_enum, default_value_t = Format::Table)]
        format: Format,
    },
    /// List the built-in chip models.
    List,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Json,
}

/// Flags of `tpusim run`: the job flags plus output options.
#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub job: JobArgs,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Also write the simulated execution as a Chrome trace (open in Perfetto or
    /// chrome://tracing): one track per unit, one event per tile operation, DMA and step
    /// overhead, with head, q block, kv block and tile kind as arguments (with --kernel-ir: the
    /// grid indices and whether the body runs). At most a million events (about 180 MB) are
    /// written: a larger run is written only for a window (--timeline-steps, --timeline-head)
    /// that holds no more; otherwise the report is printed and the timeline refused with the
    /// sizes to choose from.
    #[arg(long, value_name = "FILE.json")]
    pub timeline: Option<String>,
    /// Only grid steps START..END (END exclusive) in the timeline, e.g. 0:16.
    #[arg(long, value_name = "START:END", requires = "timeline")]
    pub timeline_steps: Option<String>,
    /// Only the steps of one batch x head index (grid coordinate 0) in the timeline (with
    /// --kernel-ir: one index of grid dimension 0).
    #[arg(long, value_name = "H", requires = "timeline")]
    pub timeline_head: Option<u32>,
    /// Show a measured profiler trace (XProf / Perfetto Chrome trace JSON, gzip or not) beside
    /// the simulated one in the --timeline file: its device ops matching --kernel-pattern become
    /// a second process, shifted to start at 0 like the simulation.
    #[arg(long, value_name = "TRACE.json[.gz]", requires_all = ["timeline", "kernel_pattern"])]
    pub compare_trace: Option<String>,
    /// Regular expression naming the measured kernel's device ops (with --compare-trace), e.g.
    /// 'splash_mha_fwd'.
    #[arg(long, requires = "compare_trace")]
    pub kernel_pattern: Option<String>,
    /// Replace the --timeline file even if `tpusim run --timeline` did not write it.
    #[arg(long, requires = "timeline")]
    pub force: bool,
}

/// The job flags shared by `tpusim run`, `tpusim tune` and the job-based plots: a trace file
/// and the fields of [`JobSpec`] (one definition: the struct's fields are the flags).
#[derive(Args, Debug)]
pub struct JobArgs {
    /// Read the job from a trace file (TOML with the same keys as these flags, underscores for
    /// dashes); flags given on the command line override it. Examples in traces/.
    #[arg(long)]
    pub trace: Option<String>,
    #[command(flatten)]
    pub job: JobSpec,
}

impl JobArgs {
    /// Whether these flags give no job (no trace and no job field: only --chip and --set), so
    /// that the default job runs ([`JobArgs::spec_or_default`]).
    pub fn is_default(&self) -> bool {
        self.trace.is_none() && tpusim_job::gives_no_job(&self.job)
    }

    /// The job these flags describe, or with no job flag the default job: the built-in case
    /// study on the chip and overrides given ([`tpusim_job::case_study_or`], described by
    /// [`tpusim_job::default_job_text`]), the one default of `run`, `tune` and `plot`.
    pub fn spec_or_default(&self) -> Result<JobSpec, CliError> {
        if self.is_default() {
            Ok(tpusim_job::case_study_or(self.job.clone()))
        } else {
            self.spec()
        }
    }

    /// The job these flags describe (a trace file, if given, overlaid by the flags).
    pub fn spec(&self) -> Result<JobSpec, CliError> {
        Ok(match &self.trace {
            // The trace is the --trace flag's file.
            Some(path) => JobSpec::from_toml_file(path).map_err(|e| CliError::input(format!("--{e}")))?.overlay(&self.job),
            None => self.job.clone(),
        })
    }

    /// A setting a report's note names (`masking=none`), as the user gave it: the flag typed,
    /// the trace's key, the built-in case study's (`case_study`), or the family's default.
    pub fn describe_setting(&self, spec: &JobSpec, field: &str, value: &str, case_study: bool) -> String {
        let flag = if value == "true" { format!("--{}", field.replace('_', "-")) } else { format!("--{} {value}", field.replace('_', "-")) };
        if self.job.set_fields().contains_key(field) {
            flag
        } else if let (Some(t), true) = (&self.trace, spec.set_fields().contains_key(field)) {
            format!("{field} = {value} (in --trace {t})")
        } else if case_study && spec.set_fields().contains_key(field) {
            format!("{field} {value} (the built-in case study's, {})", tpusim_job::CASE_STUDY_PATH)
        } else {
            format!("{field} {value} (the default of --kernel {})", spec.kernel())
        }
    }

    /// Renders an error resolving the chip: named with the trace when the trace, not a flag,
    /// gives the field at fault (`chip`, or `set` for an override), else as [`JobArgs::error`].
    pub fn chip_error(&self, e: impl std::fmt::Display) -> CliError {
        let flags = self.job.set_fields();
        let text = e.to_string();
        // An override's error names `--set`; any other is the chip's name or file.
        let field = if text.contains("chip model --set:") { "set" } else { "chip" };
        match &self.trace {
            Some(t) if !flags.contains_key(field) => CliError::input(format!("trace {t}: {}", text.replace("chip model --set:", "chip model, its `set`:"))),
            _ => self.error(text),
        }
    }

    /// Renders a job error: fields the flags set read as flags, fields only the trace set read
    /// as its keys (named with the trace).
    pub fn error(&self, e: impl std::fmt::Display) -> CliError {
        let text = e.to_string();
        let flags = self.job.set_fields();
        // With no job flag the job is the built-in case study, whose fields it sets are given.
        let spec = self.spec_or_default().unwrap_or_else(|_| self.job.clone());
        let mut from_trace = false;
        let given = spec.set_fields();
        let mut defaulted: Vec<String> = Vec::new();
        let msg = render_fields_with(&text, &mut |field| {
            // A length the user gave as seq_len is named so, not as the q_len it resolves to.
            let field = spec.field_as_given(field);
            // A block size nobody gave is the kernel family's default: say so.
            if field.starts_with("block_") && !given.contains_key(field) && !defaulted.iter().any(|d| d == field) {
                defaulted.push(field.to_string());
            }
            if flags.contains_key(field) || self.trace.is_none() {
                format!("--{}", field.replace('_', "-"))
            } else {
                from_trace = true;
                field.to_string()
            }
        });
        // A message that already asks for the field ("give --block-q-dq ...") needs no hint.
        let asks = |f: &str| msg.find("give ").is_some_and(|i| msg[i..].contains(&format!("--{}", f.replace('_', "-"))));
        let msg = match defaulted.iter().find(|f| !asks(f)) {
            Some(f) => format!(
                "{msg} ({} was not given: its value is the default of --kernel {}; give --{} to choose one that fits)",
                format_args!("--{}", f.replace('_', "-")),
                spec.kernel(),
                f.replace('_', "-")
            ),
            None => msg,
        };
        match &self.trace {
            Some(t) if from_trace && !msg.contains(t.as_str()) => CliError::input(format!("trace {t}: {msg}")),
            _ => CliError::input(msg),
        }
    }
}

/// Writes the `--timeline` file of a run and appends what it holds to the
/// report `text`; when the timeline cannot be written, prints the report first and returns why.
fn with_timeline(a: &RunArgs, timed: &tpusim_plot::timeline::Timed<'_>, path: &str, text: String) -> Result<String, CliError> {
    let window = tpusim_plot::timeline::Window {
        steps: a.timeline_steps.as_deref().map(|s| tpusim_plot::timeline::Window::parse_steps(s, "--timeline-steps")).transpose()?,
        head: a.timeline_head,
    };
    let measured = match (&a.compare_trace, &a.kernel_pattern) {
        (Some(t), Some(p)) => {
            let trace = tpusim_calib::read_trace(t).map_err(|e| CliError::input(format!("--compare-trace {e}")))?;
            let ops =
                tpusim_calib::select_ops(&trace, &tpusim_calib::Selection::xprof(p), t).map_err(|e| CliError::input(e.to_string()))?;
            let name = std::path::Path::new(t).file_name().map(|f| f.to_string_lossy().to_string()).unwrap_or_else(|| t.clone());
            Some(tpusim_plot::timeline::MeasuredTrack {
                process: format!("measured: {name}"),
                ops: ops.into_iter().map(|o| (format!("{} {}", o.device, o.line), o.name, o.ts_us, o.dur_us)).collect(),
            })
        }
        _ => None,
    };
    let sum = match tpusim_plot::timeline::write_chrome_trace_with(timed, &window, std::path::Path::new(path), "--timeline", measured.as_ref())
    {
        Ok(sum) => sum,
        Err(e) => {
            // The run itself succeeded: print its report, then say why the timeline was not
            // written (for a run too large to trace whole, how to window it).
            print_now(&text);
            return Err(CliError::from(e));
        }
    };
    Ok(match a.format {
        Format::Json => text,
        Format::Table => {
            let steps = match sum.step_range {
                Some((f, l)) => format!("steps {f} to {l}"),
                None => "no steps".into(),
            };
            format!(
                "{}\n  timeline     {path}: {} events, {} of {} grid steps ({steps}); open in Perfetto or chrome://tracing\n",
                text.trim_end(),
                sum.events,
                sum.steps,
                sum.run_steps
            )
        }
    })
}

pub fn cmd_run(a: &RunArgs) -> Result<String, CliError> {
    // With no job flag at all (only --chip and --set), the built-in case study.
    let case_study = a.job.is_default();
    let spec = a.job.spec_or_default()?;
    let chip = spec.chip().map_err(|e| a.job.chip_error(e))?;
    // The job's fields are refused before the timeline is checked.
    let job = spec.build(&chip).map_err(|e| a.job.error(e))?;
    if let Some(path) = &a.timeline {
        // Refuse an unwritable timeline before the simulation, not after it.
        tpusim_io::check_replace(std::path::Path::new(path), "run --timeline", a.force).map_err(|e| CliError::input(format!("--timeline {e}")))?;
    }
    let r = run(&chip, &job).map_err(|e| match (&spec.kernel_ir, a.job.error(&e)) {
        (Some(path), _) => CliError::input(format!("--kernel-ir {path}: {e}")),
        (None, CliError::Input(m)) if case_study => CliError::Input(format!(
            "{m} (this is the default job, {})",
            tpusim_job::default_job_text()
        )),
        (None, other) => other,
    })?;
    let mut rep = Report::from_run(&r);
    rep.render_notes(&mut |f, v| a.job.describe_setting(&spec, f, v, case_study));
    if !case_study && a.job.job.kernel_ir.is_none() {
        rep.notes.extend(tpusim_job::family_defaults_note(&spec, &job, tpusim_job::FieldStyle::Flag));
    }
    tpusim_calib::attach_shipped_measurement(&mut rep, &chip, &job);
    let text = match a.format {
        Format::Json => rep.to_json(),
        Format::Table => rep.to_table(),
    };
    match &a.timeline {
        None => Ok(text),
        Some(path) => with_timeline(a, &tpusim_plot::timeline::Timed::of_run(&r), path, text),
    }
}

/// Writes `text` (with a final newline) to stdout at once, before an error follows on stderr.
fn print_now(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    if !text.ends_with('\n') {
        let _ = out.write_all(b"\n");
    }
    let _ = out.flush();
}

pub fn cmd_chip(c: &ChipCommand) -> Result<String, CliError> {
    match c {
        ChipCommand::List => Ok(tpusim_chip::PRESETS
            .iter()
            .map(|p| match ChipModel::preset(p) {
                Ok(c) => format!("{p:<5} {}\n", c.description),
                Err(e) => format!("{p:<5} (invalid: {e})\n"),
            })
            .collect()),
        ChipCommand::Show { chip, set, format } => {
            let chip = JobSpec { chip: Some(chip.clone()), set: set.clone(), ..Default::default() }.chip()?;
            Ok(match format {
                Format::Json => serde_json::to_string_pretty(&chip).map_err(|e| CliError::Internal(e.to_string()))?,
                Format::Table => {
                    let mut s = format!("{}: {}\n", chip.name, chip.description);
                    s.push_str(&format!("model: {}\n", chip.identity()));
                    s.push_str(&format!(
                        "derived: peak {:.1} TFLOP/s bf16, sustained HBM {:.0} GB/s, {} elements per vector register\n\n",
                        chip.peak_flops() / 1e12,
                        chip.hbm_bytes_per_cycle() * chip.clock_hz() / 1e9,
                        chip.vreg_elems()
                    ));
                    s.push_str(&format!("{:<36} {:>10} {:<28} {}\n", "field", "value", "unit", "source / fitted to"));
                    for r in chip.rows() {
                        s.push_str(&format!("{:<36} {:>10} {:<28} {}\n", r.field, r.value, r.unit, r.provenance));
                    }
                    s
                }
            })
        }
    }
}
