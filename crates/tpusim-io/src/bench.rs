//! What a bench binary needs to write its figures into the docs: the process's CPU time and
//! peak memory, the machine it ran on with the date, and `--splice FILE` arguments naming the
//! hand-written files whose generated parts ([`crate::mark::splice_into`]) take its tables.
//!
//! The benches (`cargo bench -p tpusim-job --bench simulate`, `cargo bench -p tpusim --bench
//! commands`, or `./bench.sh`, which runs them and splices) print Markdown tables;
//! with `-- --splice /abs/path/README.md` they also write them between the file's markers.

use std::path::PathBuf;

/// CPU time of this process (user + system), seconds, from `/proc/self/stat` (Linux; `None`
/// elsewhere). Unlike wall time it does not grow when other processes share the cores.
pub fn cpu_seconds() -> Option<f64> {
    // Fields 14 and 15 of stat(5): utime, stime.
    stat_seconds(11)
}

/// CPU time (user + system) of this process's waited-for children so far, seconds, from
/// `/proc/self/stat` (cutime, cstime; Linux; `None` elsewhere): what the commands a bench ran
/// as processes used.
pub fn children_cpu_seconds() -> Option<f64> {
    // Fields 16 and 17 of stat(5): cutime, cstime.
    stat_seconds(13)
}

/// The sum of the two `/proc/self/stat` fields from index `i` after the command name (clock
/// ticks of 1/100 s on Linux), seconds.
fn stat_seconds(i: usize) -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(i)?.parse::<f64>().ok()? + f.get(i + 1)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// Peak resident memory of this process so far, MiB (`VmHWM` of `/proc/self/status`; `None`
/// off Linux).
pub fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Runs a command to its end as [`std::process::Command::output`] does, and gives its peak
/// resident memory in MiB: the child's `ru_maxrss` from `wait4(2)` on Linux (`None` elsewhere).
/// For the commands bench, whose processes are each measured on their own.
///
/// # Errors
/// Spawning, reading its output or waiting for it failed.
pub fn output_with_peak_rss(cmd: &mut std::process::Command) -> std::io::Result<(std::process::Output, Option<f64>)> {
    #[cfg(target_os = "linux")]
    {
        use std::io::Read as _;
        use std::os::unix::process::ExitStatusExt as _;
        use std::process::Stdio;
        let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
        let (mut out, mut err) = (child.stdout.take().expect("piped"), child.stderr.take().expect("piped"));
        let reader = std::thread::spawn(move || {
            let mut v = Vec::new();
            out.read_to_end(&mut v).map(|_| v)
        });
        let mut stderr = Vec::new();
        err.read_to_end(&mut stderr)?;
        let stdout = reader.join().map_err(|_| std::io::Error::other("the stdout reader panicked"))??;
        let mut status = 0;
        // SAFETY: rusage is plain data; wait4 fills it and the status for our own child, which
        // nothing else waits for (std's Child does not wait on drop).
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let pid = libc::pid_t::try_from(child.id()).map_err(std::io::Error::other)?;
        if unsafe { libc::wait4(pid, &mut status, 0, &mut usage) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // ru_maxrss is in KiB on Linux (getrusage(2)).
        Ok((std::process::Output { status: std::process::ExitStatus::from_raw(status), stdout, stderr }, Some(usage.ru_maxrss as f64 / 1024.0)))
    }
    #[cfg(not(target_os = "linux"))]
    {
        cmd.output().map(|o| (o, None))
    }
}

/// The machine and the date, for the line under a generated table: for instance
/// `2 cores (Intel Xeon ...), 23 GiB, 2026-12-01`. Reads `/proc/cpuinfo` and `/proc/meminfo`
/// where they exist; the date is UTC.
pub fn machine_and_date() -> String {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| t.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split(':').nth(1)).map(|s| s.trim().to_string()));
    let mem_gib = std::fs::read_to_string("/proc/meminfo").ok().and_then(|t| {
        let kib: f64 = t.lines().find(|l| l.starts_with("MemTotal:"))?.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib / (1024.0 * 1024.0))
    });
    let date = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let mut s = format!("{cores} core{}", if cores == 1 { "" } else { "s" });
    if let Some(c) = cpu {
        s.push_str(&format!(" ({c})"));
    }
    if let Some(m) = mem_gib {
        s.push_str(&format!(", {m:.0} GiB"));
    }
    format!("{s}, {}", &date[..10])
}

/// The files named by `--splice FILE` among this process's arguments (cargo's own `--bench`
/// argument and anything else are ignored).
pub fn splice_targets() -> Vec<PathBuf> {
    let args: Vec<String> = std::env::args().collect();
    args.windows(2).filter(|w| w[0] == "--splice").map(|w| PathBuf::from(&w[1])).collect()
}

/// Writes `table` into every `--splice` file that has the markers of `tag` (files without them
/// are left alone, so one list of files serves several benches), and says where it went. Give
/// absolute paths: cargo runs a bench in its package's folder.
///
/// # Errors
/// The first file that cannot be read or written ([`crate::OutputError`]).
pub fn splice_table(tag: &str, table: &str) -> Result<(), crate::OutputError> {
    for path in splice_targets() {
        let text = std::fs::read_to_string(&path).map_err(|e| crate::refused(&path, format!("--splice: cannot read it: {e}")))?;
        if crate::mark::has_part(&text, tag) {
            crate::mark::splice_into(&path, tag, table)?;
            println!("wrote the {tag} table into {}", path.display());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_machine_line_ends_with_a_date() {
        let m = machine_and_date();
        let date = &m[m.len() - 10..];
        assert!(date.as_bytes()[4] == b'-' && date.as_bytes()[7] == b'-' && date[..4].parse::<u32>().unwrap() >= 2024, "{m}");
        assert!(m.contains("core"), "{m}");
    }

    /// A child that touches 64 MiB reports at least that peak, and its output and status come
    /// back as `Command::output` gives them.
    #[test]
    fn a_childs_peak_memory_is_its_own() {
        if !cfg!(target_os = "linux") {
            return;
        }
        let run = |mib: u32| {
            let script = format!("import sys; b = bytearray({mib} << 20); b[::4096] = b'x' * len(b[::4096]); print('ok'); sys.exit(3)");
            output_with_peak_rss(std::process::Command::new("python3").args(["-c", &script])).expect("python3 runs")
        };
        let (big, big_peak) = run(64);
        let (small, small_peak) = run(1);
        assert_eq!(String::from_utf8_lossy(&big.stdout).trim(), "ok");
        assert_eq!(big.status.code(), Some(3));
        assert_eq!(small.status.code(), Some(3));
        let (big_peak, small_peak) = (big_peak.unwrap(), small_peak.unwrap());
        assert!(big_peak >= 64.0, "{big_peak}");
        assert!(small_peak < big_peak - 50.0, "a later, smaller child reports its own peak: {small_peak} after {big_peak}");
    }

    #[test]
    fn process_counters_are_read_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(cpu_seconds().unwrap() >= 0.0);
            assert!(peak_rss_mib().unwrap() > 0.0);
        }
    }
}
