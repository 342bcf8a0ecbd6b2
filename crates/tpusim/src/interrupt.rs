//! Interrupts (Ctrl-C's SIGINT, and SIGTERM and SIGHUP, as a batch system or a closed terminal
//! sends them) for every command: one handler, installed first thing in `main`.
//!
//! A long command that stops cleanly (sweep, tune) registers itself with [`stop_on_interrupt`]:
//! the first interrupt sets its cancel flag, a second exits at once. Any other command exits at
//! once. Exiting, the handler removes the temporary file of an output being written
//! ([`tpusim_io::remove_pending_outputs`]; a `--timeline` of hundreds of MB takes a second), so
//! no hidden `.tpusim-*.tmp` is left beside it; the target is its old file or the complete new
//! one. Exit code 130, the shell's code for SIGINT.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// The command that stops cleanly on a first interrupt: its cancel flag and what the first and
/// a second interrupt print.
struct Cancellable {
    flag: Arc<AtomicBool>,
    first: &'static str,
    again: &'static str,
}

static CANCELLABLE: Mutex<Option<Cancellable>> = Mutex::new(None);

/// What an interrupt of a command without a clean stop leaves (every output is written whole or
/// not at all: `tpusim_io::write_with`).
const NOTHING_HALF_WRITTEN: &str =
    "the outputs it had written are complete, the others are as they were (each file is written whole or not at all); run the command again to finish";

/// Installs the handler (once; a failure to install leaves the default, which ends the process).
pub fn install() {
    let _ = ctrlc::set_handler(|| {
        let c = CANCELLABLE.lock().unwrap_or_else(PoisonError::into_inner);
        match c.as_ref() {
            Some(c) if !c.flag.swap(true, Ordering::Relaxed) => {
                eprintln!("\n{}", c.first);
                return;
            }
            Some(c) => eprintln!("\n{}", c.again),
            None => eprintln!("\ninterrupted: {NOTHING_HALF_WRITTEN}"),
        }
        if tpusim_io::remove_pending_outputs() > 0 {
            eprintln!("the output being written was not finished and is removed; the file it was to replace is as it was");
        }
        std::process::exit(130);
    });
}

/// Makes the running command one that stops cleanly: the first interrupt sets the returned
/// cancel flag and prints `first`; a second prints `again` and exits at once with 130.
///
/// A sweep then starts no further point: the points running finish, their rows are flushed to
/// `OUT.partial`, and it ends with [`tpusim_sweep::SweepError::Interrupted`], which says how many
/// rows that file holds (exit 130). A tune skips the candidates not yet simulated and exits 130.
pub fn stop_on_interrupt(first: &'static str, again: &'static str) -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    *CANCELLABLE.lock().unwrap_or_else(PoisonError::into_inner) = Some(Cancellable { flag: flag.clone(), first, again });
    flag
}
