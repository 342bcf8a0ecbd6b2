//! `tpusim validate` and `tpusim calibrate` (issue 4): flags and output; the work is in
//! `tpusim-calib`. The measurement CSV format is documented in traces/measured/README.md.

use crate::error::CliError;
use clap::{Args, ValueEnum};
use tpusim_calib::{calibrate, read_file, validate, CalibrateOptions, ChipSet, FITTED_PARAMS};
use tpusim_chip::ChipModel;

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum ValidateFormat {
    /// Per-row table and summary, for people.
    Table,
    /// One object: rows, skipped, groups, summary.
    Json,
    /// One line per row of the file, predicted or skipped.
    Csv,
    /// Markdown tables, as in traces/measured/VALIDATION.md.
    Markdown,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum CalibrateFormat {
    /// Parameters, per-row predictions and error summary, for people.
    Table,
    /// One object.
    Json,
}

/// Flags of `tpusim validate`.
#[derive(Args, Debug)]
pub struct ValidateArgs {
    /// Measurement CSV (format: traces/measured/README.md), e.g. traces/measured/calibration.csv.
    pub file: String,
    /// Chip model for the rows whose `chip` column equals its `name`, instead of the preset: a
    /// chip TOML, e.g. one written by `tpusim calibrate` (repeatable).
    #[arg(long, value_name = "CHIP")]
    pub chip: Vec<String>,
    /// Cross-validate instead: refit each chip's [fitted] parameters on all of its rows but one
    /// (and all of its head_dim groups but one) and report each held-out row's error, per chip
    /// and over the tokamax rows (slow: one fit per row; formats table, json, markdown).
    #[arg(long)]
    pub cv: bool,
    /// Write the error bands instead: cross-validate (as --cv) and group the rows' leave-one-out
    /// |error| by chip, kernel family, direction and scope (median, 90th percentile, rows) as the
    /// band file every report quotes; JSON to --out or stdout (--format markdown: tables by band,
    /// scope and family).
    #[arg(long, conflicts_with = "cv")]
    pub bands: bool,
    /// With --bands: write the band file here (atomically), e.g. traces/measured/bands.json. An
    /// existing file is replaced only when it is a band file (its `generated_by` names `tpusim
    /// validate ... --bands`), or with --force.
    #[arg(long, value_name = "PATH")]
    pub out: Option<String>,
    /// Replace --out even if it is not a band file tpusim wrote.
    #[arg(long, requires = "out")]
    pub force: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t = ValidateFormat::Table)]
    pub format: ValidateFormat,
    /// Write the report into this hand-written file (e.g. a report's Markdown) between its lines
    /// `<!-- tpusim validate: begin -->` and `<!-- tpusim validate: end -->`, leaving the rest
    /// of the file as it is, instead of printing it (repeatable). With --cv also the
    /// cross-validation tables (markers `tpusim validate-cv`); with --bands every accuracy table
    /// from one cross-validation: in-sample, cross-validated, bands (`tpusim validate-bands`) and
    /// README's summary (`tpusim accuracy`). Each file gets the parts whose markers it has.
    /// The docs' tables: `tpusim validate traces/measured/calibration.csv --bands --out
    /// traces/measured/bands.json --into README.md --into traces/measured/VALIDATION.md`.
    #[arg(long, value_name = "FILE")]
    pub into: Vec<String>,
}

/// Flags of `tpusim calibrate`.
#[derive(Args, Debug)]
pub struct CalibrateArgs {
    /// Measurement CSV (format: traces/measured/README.md).
    pub file: String,
    /// Chip model to start from: preset name or chip TOML. Rows whose `chip` column equals its
    /// `name` (or this argument) are fitted to; the others are listed as not used.
    #[arg(long)]
    pub chip: String,
    /// Write the fitted chip model here (complete TOML, written atomically). Without it nothing
    /// is written.
    #[arg(long, value_name = "PATH")]
    pub out: Option<String>,
    /// Replace --out even if `tpusim calibrate` did not write it (a hand-written chip model
    /// included).
    #[arg(long, requires = "out")]
    pub force: bool,
    /// Fit only these fitted parameters (comma separated), e.g.
    /// --params valu_vreg_ops_per_cycle,grid_step_overhead_cycles [default: the parameters the
    /// starting model declares fitted (a non-empty `fitted_to`; every preset declares its set), or
    /// all of [fitted] for a model that declares none].
    #[arg(long, value_delimiter = ',')]
    pub params: Vec<String>,
    /// Skip cross-validation (leave-one-out / k-fold refits).
    #[arg(long)]
    pub no_cv: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t = CalibrateFormat::Table)]
    pub format: CalibrateFormat,
}

/// Writes the generated `parts` into each `--into` file (the parts whose markers it has, one
/// atomic write per file); returns what was written, a line per file.
fn splice_parts(into: &[String], parts: &[(&str, String)]) -> Result<String, CliError> {
    let parts: Vec<(&str, &str)> = parts.iter().map(|(t, c)| (*t, c.as_str())).collect();
    let mut out = String::new();
    for f in into {
        let tags = tpusim_io::mark::splice_all(std::path::Path::new(f), &parts).map_err(|e| {
            if e.is_refusal() {
                CliError::input(format!("--into {e}"))
            } else {
                CliError::Internal(format!("--into {e}"))
            }
        })?;
        let names: Vec<String> = tags.iter().map(|t| format!("tpusim {t}")).collect();
        out.push_str(&format!("wrote into {f} between its {} markers\n", names.join(", ")));
    }
    Ok(out)
}

/// The command line of a `validate --bands` run, as its band file's `generated_by` records it
/// (the flags that decide its content and where it went, each file as given).
fn bands_command_line(a: &ValidateArgs) -> String {
    let word = |w: &str| if !w.is_empty() && w.chars().all(|c| c.is_ascii_alphanumeric() || "/._-+=:,@".contains(c)) { w.to_string() } else { format!("'{}'", w.replace('\'', "'\\''")) };
    let mut s = format!("tpusim validate {}", word(&a.file));
    for c in &a.chip {
        s.push_str(&format!(" --chip {}", word(c)));
    }
    s.push_str(" --bands");
    if let Some(o) = &a.out {
        s.push_str(&format!(" --out {}", word(o)));
    }
    if a.format == ValidateFormat::Markdown {
        s.push_str(" --format markdown");
    }
    for f in &a.into {
        s.push_str(&format!(" --into {}", word(f)));
    }
    s
}

/// The tags a validate command with these flags writes (`--into`).
fn tags_of(a: &ValidateArgs) -> Vec<&'static str> {
    use tpusim_calib::docs::{TAG_BANDS, TAG_CV, TAG_IN_SAMPLE, TAG_PARAMS, TAG_SUMMARY};
    if a.bands {
        vec![TAG_IN_SAMPLE, TAG_CV, TAG_BANDS, TAG_SUMMARY, TAG_PARAMS]
    } else if a.cv {
        vec![TAG_CV]
    } else {
        vec![TAG_IN_SAMPLE]
    }
}

pub fn cmd_validate(a: &ValidateArgs) -> Result<String, CliError> {
    if let (Some(out), false) = (&a.out, a.bands) {
        return Err(CliError::input(format!(
            "--out {out}: writes the band file of --bands; the validation itself goes to standard output (`tpusim validate {} --format csv > {out}`), or into a Markdown file between its markers with --into",
            a.file
        )));
    }
    let models = a.chip.iter().map(|c| ChipModel::load(c)).collect::<Result<Vec<_>, _>>()?;
    let chips = ChipSet::new(models)?;
    let file = read_file(&a.file, &chips.models)?;
    // Checked before the work (the cross-validation takes minutes): every --into file exists and
    // has the markers of some part this command writes (nothing is written yet).
    for into in &a.into {
        let text = tpusim_io::read_text(into).map_err(|e| CliError::input(format!("--into {into}: cannot read it: {e}")))?;
        let tags = tags_of(a);
        if !tags.iter().any(|t| tpusim_io::mark::has_part(&text, t)) {
            let (begin, end) = tpusim_io::mark::splice_markers(tags[0]);
            let others: Vec<String> = tags.iter().skip(1).map(|t| format!("tpusim {t}")).collect();
            return Err(CliError::input(format!(
                "--into {into}: has no generated part: add a line {begin} and, below it, a line {end} where tpusim writes{}",
                if others.is_empty() { String::new() } else { format!(" (or the markers of {})", others.join(", ")) }
            )));
        }
    }
    if a.bands {
        if let Some(path) = &a.out {
            // A file that is not a band file tpusim wrote is never replaced without --force,
            // checked before the cross-validation.
            tpusim_io::check_replace(std::path::Path::new(path), tpusim_io::mark::BANDS_COMMAND, a.force)
                .map_err(|e| CliError::input(format!("--out {e}")))?;
        }
        let bytes = std::fs::read(&a.file).map_err(|e| CliError::input(format!("{}: {e}", a.file)))?;
        let cv = tpusim_calib::cross_validate(&file, &chips)?;
        let mut bands = tpusim_calib::bands::band_file(&a.file, &bytes, &file, &chips, &cv);
        // The file names the command that wrote it, as it ran.
        bands.generated_by = bands_command_line(a);
        let text = match a.format {
            ValidateFormat::Markdown => tpusim_calib::bands::to_markdown(&bands, &file, &cv),
            _ => bands.to_json(),
        };
        let mut out = String::new();
        if let Some(path) = &a.out {
            tpusim_io::write_atomic(std::path::Path::new(path), bands.to_json().as_bytes()).map_err(|e| CliError::from(tpusim_calib::CalibError::from(e)))?;
            out = format!("{}wrote {path}: {} bands over {} rows\n", if a.format == ValidateFormat::Markdown { text.clone() } else { String::new() }, bands.bands.len(), bands.in_sample.len());
        }
        if !a.into.is_empty() {
            let v = validate(&file, &chips);
            out.push_str(&splice_parts(&a.into, &tpusim_calib::docs::parts(&file, &v, &cv, &bands, &chips)?)?);
        }
        return Ok(if out.is_empty() { text } else { out });
    }
    if a.cv {
        let cv = tpusim_calib::cross_validate(&file, &chips)?;
        if !a.into.is_empty() {
            return splice_parts(&a.into, &[(tpusim_calib::docs::TAG_CV, cv.to_table(true))]);
        }
        return match a.format {
            ValidateFormat::Table => Ok(cv.to_table(false)),
            ValidateFormat::Markdown => Ok(cv.to_table(true)),
            ValidateFormat::Json => Ok(cv.to_json()),
            ValidateFormat::Csv => Err(CliError::input("--cv --format csv: the cross-validation report comes as table, json or markdown")),
        };
    }
    if !a.into.is_empty() && matches!(a.format, ValidateFormat::Json | ValidateFormat::Csv) {
        return Err(CliError::input(format!(
            "--into with --format {}: a file's generated part is Markdown (drop --format, or give --format markdown)",
            if a.format == ValidateFormat::Json { "json" } else { "csv" }
        )));
    }
    let v = validate(&file, &chips);
    if v.rows.is_empty() {
        // Nothing predicted is a failed validation, not an empty success.
        let why: Vec<String> = v.skipped.iter().take(3).map(|r| format!("{} (line {}): {}", r.id, r.line, r.reason)).collect();
        return Err(CliError::input(format!(
            "{}: no row could be predicted ({} skipped{}{})",
            a.file,
            v.skipped.len(),
            if why.is_empty() { "" } else { ": " },
            why.join("; ")
        )));
    }
    let text = match a.format {
        ValidateFormat::Table => v.to_table(),
        ValidateFormat::Json => v.to_json(),
        ValidateFormat::Csv => v.to_csv(),
        ValidateFormat::Markdown => v.to_markdown(),
    };
    if a.into.is_empty() {
        return Ok(text);
    }
    splice_parts(&a.into, &[(tpusim_calib::docs::TAG_IN_SAMPLE, v.to_markdown())])
}

pub fn cmd_calibrate(a: &CalibrateArgs) -> Result<String, CliError> {
    let base = ChipModel::load(&a.chip)?;
    // `fitted.NAME`, as `--set` spells the field, is NAME.
    let params: Vec<String> = a.params.iter().map(|p| p.strip_prefix("fitted.").unwrap_or(p).to_string()).collect();
    for p in &params {
        if !FITTED_PARAMS.contains(&p.as_str()) {
            return Err(CliError::input(format!(
                "--params {p}: not a fitted parameter; the fitted parameters are {}",
                FITTED_PARAMS.join(", ")
            )));
        }
    }
    if let Some(path) = &a.out {
        // Refuse an unwritable destination before the fit, not after it, and never replace what
        // calibrate did not write (a hand-written chip model included) without --force.
        tpusim_io::check_replace(std::path::Path::new(path), "calibrate", a.force).map_err(|e| CliError::input(format!("--out {e}")))?;
    }
    let file = read_file(&a.file, std::slice::from_ref(&base))?;
    let opts = CalibrateOptions { params, cross_validate: !a.no_cv, date: None };
    let cal = calibrate(&file, &base, &a.chip, &opts)?;
    let mut out = match a.format {
        CalibrateFormat::Table => cal.to_table(),
        CalibrateFormat::Json => cal.to_json(),
    };
    if let Some(path) = &a.out {
        // The fit is done: whatever happens to the file, its results are printed.
        let written = cal.model_toml().map_err(CliError::Internal).and_then(|text| {
            let text = format!("{}{text}", tpusim_io::mark::comment_line("calibrate"));
            tpusim_io::write_atomic(std::path::Path::new(path), text.as_bytes())
                .map_err(|e| CliError::from(tpusim_calib::CalibError::from(e)))
        });
        if let Err(e) = written {
            let note = format!("{e} (the fit above is complete; nothing was written to --out {path})");
            let error = Box::new(match e {
                CliError::Input(_) => CliError::Input(note),
                _ => CliError::Internal(note),
            });
            return Err(CliError::AfterOutput { output: out, error });
        }
        if a.format == CalibrateFormat::Table {
            out.push_str(&format!(
                "\nwrote {path}: chip model {} with the fitted values above, parameters {} (use it with --chip {path})\n",
                cal.chip, cal.fitted_model.hash
            ));
        }
    }
    Ok(out)
}

/// Flags of `tpusim from-trace`.
#[derive(Args, Debug)]
pub struct FromTraceArgs {
    /// Profiler trace: Chrome trace JSON, gzip-compressed or not (XProf's
    /// `plugins/profile/RUN/HOST.trace.json.gz`, a Perfetto JSON export).
    pub trace_file: String,
    /// Regular expression naming the kernel's device ops, e.g. 'splash_mha_fwd' (XLA's `.N`
    /// suffix is ignored when grouping; each distinct name becomes one row).
    #[arg(long)]
    pub kernel_pattern: String,
    /// Row id (with several matching kernels, the prefix of `ID-NAME`).
    #[arg(long)]
    pub id: String,
    /// Regular expression for the device processes' names [default: XProf's '^/device:'].
    #[arg(long, default_value = "^/device:")]
    pub device: String,
    /// Regular expression for the lines (threads) holding device ops [default: XProf's
    /// '^XLA Ops$'].
    #[arg(long, default_value = "^XLA Ops$")]
    pub line: String,
    /// Write the rows to this CSV file (atomically) instead of standard output.
    #[arg(long, value_name = "FILE.csv")]
    pub out: Option<String>,
    /// Replace --out even if `tpusim from-trace` did not write it.
    #[arg(long, requires = "out")]
    pub force: bool,
    /// The job that was measured: its fields fill the row (--chip is required; block sizes and
    /// options not given are written as the kernel family's defaults).
    #[command(flatten)]
    pub job: crate::run::JobArgs,
}

/// `tpusim from-trace`: measurement rows from a profiler trace.
pub fn cmd_from_trace(a: &FromTraceArgs) -> Result<String, CliError> {
    let spec = a.job.spec()?;
    let sel = tpusim_calib::Selection { pattern: a.kernel_pattern.clone(), device: a.device.clone(), line: a.line.clone() };
    if let Some(out) = &a.out {
        tpusim_io::check_replace(std::path::Path::new(out), "from-trace", a.force).map_err(|e| CliError::input(format!("--out {e}")))?;
    }
    let trace = tpusim_calib::read_trace(&a.trace_file).map_err(|e| CliError::input(e.to_string()))?;
    let ops = tpusim_calib::select_ops(&trace, &sel, &a.trace_file).map_err(|e| CliError::input(e.to_string()))?;
    let kernels = tpusim_calib::kernel_timings(&ops);
    let rows = tpusim_calib::measurement_rows(&kernels, &spec, &a.id, &sel, &a.trace_file).map_err(|e| match e {
        tpusim_calib::TraceError::Spec(e) => a.job.error(e),
        other => CliError::input(other.to_string()),
    })?;
    let csv = tpusim_calib::rows_to_csv(&rows);
    match &a.out {
        None => Ok(csv),
        Some(out) => {
            let marked = format!("{}{csv}", tpusim_io::mark::comment_line("from-trace"));
            tpusim_io::write_atomic(std::path::Path::new(out), marked.as_bytes()).map_err(|e| {
                if e.is_refusal() {
                    CliError::input(format!("--out {e}"))
                } else {
                    CliError::Internal(format!("--out {e}"))
                }
            })?;
            let mut s = format!("wrote {} row(s) to {out}:\n", rows.len());
            for k in &kernels {
                s.push_str(&format!(
                    "  {}: median {:.6} ms over {} repeats on {} device(s)\n",
                    k.name,
                    k.median_ms,
                    k.count,
                    k.devices.len()
                ));
            }
            Ok(s)
        }
    }
}
