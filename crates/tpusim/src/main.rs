//! `tpusim`: the command-line front end. Parses flags, runs them through the library crates
//! (the facade in `lib.rs`), and prints or writes the result. Nothing else lives here.
//!
//! Exit codes: 0 success, 2 usage or input error, 1 internal or I/O failure.

mod calib;
mod error;
mod interrupt;
mod layer;
mod plot;
mod run;
mod sweep;

use clap::{Parser, Subcommand};
use error::CliError;
use std::io::Write;
use std::process::ExitCode;

/// Small blocks from mimalloc, large ones from the system allocator: `tpusim_io::alloc`.
#[global_allocator]
static GLOBAL: tpusim_io::alloc::Split = tpusim_io::alloc::Split;

#[derive(Parser, Debug)]
#[command(name = "tpusim", version, about = "Cycle-approximate TPU simulator for attention kernels and the transformer layers around them", long_about = None, args_override_self = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Simulate one kernel call and report latency, utilisation and the bounding unit.
    ///
    /// (The long help's second paragraph, the default job, is written at run time from the
    /// case study's trace: `with_default_job`.)
    Run(run::RunArgs),
    /// Simulate one transformer block of a video diffusion model on a slice of chips: its ops
    /// (projections, attention, feed-forward, element-wise fusions, all-to-alls, permutation),
    /// the latency per chip with its breakdown, and with --steps the denoising time.
    ///
    /// With no flags: Wan 2.1 14B at 720p (75,600 tokens), dense attention, on a v6e-8 (2x4)
    /// with guidance as two groups of four chips and Ulysses sequence parallelism in each.
    Layer(layer::LayerArgs),
    /// Inspect chip models.
    Chip {
        #[command(subcommand)]
        command: run::ChipCommand,
    },
    /// Predict every row of a measurement CSV and report the error against the measurements.
    Validate(calib::ValidateArgs),
    /// Fit a chip model's fitted parameters to a measurement CSV and write a new chip model.
    Calibrate(calib::CalibrateArgs),
    /// Turn a profiler trace (XProf / Perfetto Chrome trace JSON, gzip or not) into measurement
    /// rows for validate and calibrate: the device ops matching --kernel-pattern, median over
    /// their repeats, with the job fields given.
    FromTrace(calib::FromTraceArgs),
    /// Evaluate a sweep file's points in parallel and write one row per point.
    Sweep(sweep::SweepArgs),
    /// Join sweep shard outputs, checking that none is missing or duplicated.
    Merge(sweep::MergeArgs),
    /// Search block sizes and kernel options for one workload and rank them.
    Tune(sweep::TuneArgs),
    /// Draw a figure (PNG or SVG).
    Plot(plot::PlotArgs),
}

/// The CLI with the default job stated in the long help of the commands that run it (`run`,
/// `tune`, the job plots), from [`tpusim_job::default_job_text`]: the help says what runs.
fn cli_command() -> clap::Command {
    use clap::CommandFactory;
    let text = tpusim_job::default_job_text();
    let run = format!(
        "Simulate one kernel call and report latency, utilisation and the bounding unit.\n\nWith no job flag it runs the default job: {text}. Every option not given takes the kernel family's default (--kernel)."
    );
    let tune = format!(
        "Search block sizes and kernel options for one workload and rank them.\n\nWith no job flag it ranks block sizes for the default job, {text}: its workload and kernel kept, the options it does not give (--traversal, --masking, --mask-source) searched with its blocks (give one to hold it), and the ranking's `vs given` against the default job at its own blocks (as `tpusim run` runs it)."
    );
    let plot_job = format!("With no --trace and no job flag: the default job, {text}.");
    Cli::command()
        .mut_subcommand("run", |c| c.long_about(run))
        .mut_subcommand("tune", |c| c.long_about(tune))
        .mut_subcommand("plot", |p| {
            ["roofline", "breakdown", "tiles", "timeline"].iter().fold(p, |p, k| {
                p.mut_subcommand(*k, |c| {
                    let about = c.get_about().map(|a| a.to_string()).unwrap_or_default();
                    c.long_about(format!("{about}\n\n{plot_job}"))
                })
            })
        })
}

fn main() -> ExitCode {
    tpusim_io::alloc::tune_process_heap();
    interrupt::install();
    use clap::FromArgMatches;
    let cli = match cli_command().try_get_matches().and_then(|m| Cli::from_arg_matches(&m)) {
        Ok(cli) => cli,
        Err(e) => match value_error(&e) {
            Some(msg) => {
                eprintln!("error: {msg}");
                return ExitCode::from(2);
            }
            None => e.exit(),
        },
    };
    // A panic is a bug, not bad input: report it as an internal failure with exit code 1.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("internal error (a tpusim bug; please report it with the command line): {info}");
    }));
    let out = match std::panic::catch_unwind(|| dispatch(&cli)) {
        Ok(out) => out,
        Err(_) => return ExitCode::from(1),
    };
    match out {
        Ok(mut s) => {
            if !s.is_empty() && !s.ends_with('\n') {
                s.push('\n');
            }
            let mut stdout = std::io::stdout().lock();
            match stdout.write_all(s.as_bytes()).and_then(|_| stdout.flush()) {
                Ok(()) => ExitCode::SUCCESS,
                // A reader that stopped early (`| head`) is not an error.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: cannot write the output: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Err(e) => {
            if let CliError::AfterOutput { output, .. } = &e {
                let mut stdout = std::io::stdout().lock();
                let _ = stdout.write_all(output.as_bytes()).and_then(|_| stdout.flush());
            }
            if matches!(e, CliError::Interrupted(_)) {
                eprintln!("{e}");
            } else {
                eprintln!("error: {e}");
            }
            ExitCode::from(e.exit_code())
        }
    }
}

/// A refused flag value in the form of every other input error, the flag, the value as typed
/// and what is allowed: `--heads = -1: expected a whole number from 1 to 1048576`,
/// `--traversal = zig: expected full-grid or compact` (the Python package says the same with
/// keywords). `None` for other parse errors (unknown flags, missing values, --help), which
/// clap reports itself.
fn value_error(e: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if !matches!(e.kind(), ErrorKind::InvalidValue | ErrorKind::ValueValidation) {
        return None;
    }
    let ContextValue::String(arg) = e.get(ContextKind::InvalidArg)? else { return None };
    let ContextValue::String(value) = e.get(ContextKind::InvalidValue)? else { return None };
    let flag = arg.split([' ', '[']).next().unwrap_or(arg);
    // A flag given without its value (`tpusim run --heads`): say that, not that "" is refused.
    if value.is_empty() && e.kind() == ErrorKind::InvalidValue {
        return Some(format!("{flag} needs a value: give it as `{flag} VALUE` (`--help` says what each flag takes)"));
    }
    let why = match e.kind() {
        ErrorKind::ValueValidation => std::error::Error::source(e)?.to_string(),
        _ => match e.get(ContextKind::ValidValue) {
            Some(ContextValue::Strings(v)) => match v.as_slice() {
                [] => "not allowed".to_string(),
                [one] => format!("expected {one}"),
                [init @ .., last] => format!("expected {} or {last}", init.join(", ")),
            },
            _ => "not allowed".to_string(),
        },
    };
    Some(format!("{flag} = {value}: {why}"))
}

fn dispatch(cli: &Cli) -> Result<String, CliError> {
    match &cli.command {
        Command::Run(a) => run::cmd_run(a),
        Command::Layer(a) => layer::cmd_layer(a),
        Command::Chip { command } => run::cmd_chip(command),
        Command::Validate(a) => calib::cmd_validate(a),
        Command::Calibrate(a) => calib::cmd_calibrate(a),
        Command::FromTrace(a) => calib::cmd_from_trace(a),
        Command::Sweep(a) => sweep::cmd_sweep(a),
        Command::Merge(a) => sweep::cmd_merge(a),
        Command::Tune(a) => sweep::cmd_tune(a),
        Command::Plot(a) => plot::cmd_plot(a),
    }
}
