//! One overwrite rule for every output (issue 22, item 5), through the built binary: tpusim marks
//! what it writes and replaces only its own output of the same command (`--force` for anything
//! else, another sweep definition included); two sweeps on one output meet a lock; Ctrl-C on a
//! sweep says where its rows are and how to resume; error rows name their chip. And `tune`'s
//! best line is a complete command (item 7).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tpusim"));
    c.env("TPUSIM_PROGRESS_SECS", "86400");
    c
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tpusim-outputs-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn ok(out: Output, what: &str) -> String {
    assert!(out.status.success(), "{what} failed ({:?}): {}", out.status.code(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn refused(out: Output, what: &str) -> String {
    assert_eq!(out.status.code(), Some(2), "{what} should exit 2; stdout: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

const SMALL: [&str; 8] = ["--heads", "2", "--seq-len", "2048", "--block-q", "512", "--block-kv", "512"];

#[test]
fn every_output_is_marked_and_only_its_own_command_replaces_it() {
    let dir = scratch("marks");
    let png = dir.join("fig.png");
    let svg = dir.join("fig.svg");
    let plot = |out: &Path, force: bool| {
        let mut c = bin();
        c.args(["plot", "tiles"]).args(SMALL).args(["--out", s(out)]);
        if force {
            c.arg("--force");
        }
        c.output().unwrap()
    };
    // A hand-written file is never replaced without --force.
    std::fs::write(&png, "my notes").unwrap();
    let e = refused(plot(&png, false), "plot over a hand-written file");
    assert!(e.contains("tpusim did not write it") && e.contains("--force"), "{e}");
    assert_eq!(std::fs::read_to_string(&png).unwrap(), "my notes");
    ok(plot(&png, true), "plot --force");
    // The PNG carries a tEXt chunk naming the command, the SVG a comment.
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.windows(20).any(|w| w == b"tpusim output\0plot (".as_slice()), "PNG mark");
    ok(plot(&png, false), "plot over its own figure");
    ok(plot(&svg, false), "plot svg");
    assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<!-- tpusim output: plot (tpusim "));
    // Another command's output needs --force: a timeline over a figure.
    let timeline = |out: &Path| bin().arg("run").args(SMALL).args(["--timeline", s(out), "--timeline-steps", "0:2"]).output().unwrap();
    let e = refused(timeline(&png), "timeline over a figure");
    assert!(e.contains("holds the output of `tpusim plot`, not of `tpusim run --timeline`"), "{e}");
    let json = dir.join("t.json");
    ok(timeline(&json), "timeline");
    assert!(std::fs::read_to_string(&json).unwrap().starts_with("{\"tpusim_output\":\"run --timeline (tpusim "));
    ok(timeline(&json), "timeline over its own");
    // from-trace rows and calibrate models are marked too (a comment line each).
    let hand = dir.join("v6e-copy.toml");
    std::fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/v6e.toml"), &hand).unwrap();
    let e = refused(
        bin().args(["calibrate", "traces/measured/calibration.csv", "--chip", "v6e", "--no-cv", "--out", s(&hand)])
            .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
            .output()
            .unwrap(),
        "calibrate over a hand-written chip model",
    );
    assert!(e.contains("tpusim did not write it"), "{e}");
}

/// A small sweep file: `n` block_q values over a short job.
fn sweep_file(dir: &Path, name: &str, block_q: &[u64]) -> PathBuf {
    let p = dir.join(name);
    let list: Vec<String> = block_q.iter().map(u64::to_string).collect();
    std::fs::write(&p, format!("[base]\nheads = 2\nseq_len = 4096\nmask = \"causal\"\n[axes]\nblock_q = [{}]\nblock_kv = [512, 1024]\n", list.join(", ")))
        .unwrap();
    p
}

#[test]
fn a_sweep_replaces_only_its_own_results_and_locks_its_output() {
    let dir = scratch("sweep");
    let out = dir.join("out.csv");
    let a = sweep_file(&dir, "a.toml", &[256, 512]);
    let sweep = |file: &Path, force: bool| {
        let mut c = bin();
        c.args(["sweep", s(file), "--out", s(&out), "--no-progress"]);
        if force {
            c.arg("--force");
        }
        c.output().unwrap()
    };
    ok(sweep(&a, false), "sweep");
    let first = std::fs::read_to_string(&out).unwrap();
    let again = ok(sweep(&a, false), "the same sweep again");
    assert!(again.contains("0 computed, 4 resumed"), "{again}");
    // An edited sweep file is another sweep: its results do not replace these without --force.
    let b = sweep_file(&dir, "a.toml", &[256, 1024]);
    let e = refused(sweep(&b, false), "an edited sweep over the old results");
    assert!(e.contains("another sweep") && e.contains("--force"), "{e}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), first, "the old results are untouched");
    ok(sweep(&b, true), "--force");
    assert_ne!(std::fs::read_to_string(&out).unwrap(), first);
    // A hand-written file at --out is refused without --force.
    std::fs::write(&out, "mine\n").unwrap();
    let e = refused(sweep(&b, false), "a sweep over a hand-written file");
    assert!(e.contains("not a tpusim sweep output") && e.contains("--force"), "{e}");
    std::fs::remove_file(&out).unwrap();

    // Two sweeps on one output: the second meets the first's lock (an OS advisory lock, held
    // here by this test as a running sweep would hold it, in a lock file with tpusim's mark).
    let mut lock = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(format!("{}.lock", s(&out))).unwrap();
    use std::io::Write as _;
    use std::os::fd::AsRawFd as _;
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }, 0);
    lock.write_all(b"# tpusim output: sweep --out (tpusim 0.1.0)\n").unwrap();
    let e = refused(sweep(&b, false), "a second sweep on a locked output");
    assert!(e.contains("another tpusim sweep is writing it") && e.contains("out.csv.lock"), "{e}");
    drop(lock); // released, as when a sweep's process ends
    ok(sweep(&b, false), "after the lock is released");
    assert!(!Path::new(&format!("{}.lock", s(&out))).exists(), "a finished sweep removes its lock file");
}

/// Issue 47, point 4: a lock file tpusim did not write (`echo keep > out.csv.lock`) is refused
/// as `OUT.partial` is, and left as it was; `--force` replaces it (and the finished sweep removes
/// it, as it removes its own).
#[test]
fn a_lock_file_tpusim_did_not_write_is_refused_and_kept() {
    let dir = scratch("user-lock");
    let out = dir.join("out.csv");
    let lock = dir.join("out.csv.lock");
    let a = sweep_file(&dir, "a.toml", &[256]);
    std::fs::write(&lock, "keep\n").unwrap();
    let sweep = |force: bool| {
        let mut c = bin();
        c.args(["sweep", s(&a), "--out", s(&out), "--no-progress"]);
        if force {
            c.arg("--force");
        }
        c.output().unwrap()
    };
    let e = refused(sweep(false), "a sweep beside a user's lock file");
    assert!(e.contains("out.csv.lock exists and tpusim did not write it") && e.contains("--force"), "{e}");
    assert_eq!(std::fs::read(&lock).unwrap(), b"keep\n", "the user's file is left byte for byte");
    assert!(!out.exists() && !dir.join("out.csv.partial").exists(), "nothing was written");
    let forced = sweep(true);
    let said = format!("{}{}", String::from_utf8_lossy(&forced.stdout), String::from_utf8_lossy(&forced.stderr));
    ok(forced, "--force");
    assert!(out.exists() && !lock.exists());
    // --force replaces a foreign file with a note, as it does for OUT.partial.
    assert!(said.contains("replaced") && said.contains("out.csv.lock (--force): tpusim did not write it"), "{said}");
}

#[test]
fn rows_with_an_error_name_their_chip() {
    let dir = scratch("chip");
    let f = dir.join("s.toml");
    std::fs::write(&f, "[base]\nseq_len = 4096\n[axes]\nblock_kv = [100, 512]\n").unwrap();
    let out = dir.join("s.csv");
    ok(bin().args(["sweep", s(&f), "--out", s(&out), "--no-progress"]).output().unwrap(), "sweep");
    let text = std::fs::read_to_string(&out).unwrap();
    let mut lines = text.lines().filter(|l| !l.starts_with('#'));
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let chip = header.iter().position(|h| *h == "chip").unwrap();
    let rows: Vec<String> = lines.map(String::from).collect();
    assert!(rows[0].contains("block_kv = 100"), "{}", rows[0]);
    for r in &rows {
        assert_eq!(r.split(',').nth(chip), Some("v6e"), "{r}");
    }
}

#[test]
fn ctrl_c_on_a_sweep_says_where_the_rows_are_and_resumes() {
    let dir = scratch("interrupt");
    let f = dir.join("big.toml");
    // Enough points (14,400) to outlast the interrupt on any machine.
    std::fs::write(
        &f,
        "[base]\nheads = 10\nseq_len = 75600\nmask = \"band:15000+sink:3600\"\ntraversal = \"compact\"\nmasking = \"partial\"\n[axes]\nblock_q = [1024, 1536, 2048, 2304, 2560, 3072, 3328, 3584]\nblock_kv = [512, 768, 1024, 1536, 2048, 2560]\n\"chip.hbm.bandwidth_gb_per_s\" = [800, 900, 1000, 1100, 1200, 1300, 1400, 1500, 1600, 1700, 1800, 1900, 2000, 2100, 2200, 2300, 2400, 2500, 2600, 2700, 2800, 2900, 3000, 3100, 3200, 3300, 3400, 3500, 3600, 3700]\n\"chip.device.clock_ghz\" = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9]\n",
    )
    .unwrap();
    let out = dir.join("big.csv");
    let partial = dir.join("big.csv.partial");
    let child = bin()
        .args(["sweep", s(&f), "--out", s(&out), "--no-progress", "--jobs", "1"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for the first rows, then interrupt as Ctrl-C does.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(120) {
        let rows = std::fs::read_to_string(&partial).map(|t| t.lines().count()).unwrap_or(0);
        if rows > 3 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(130), "{err}");
    assert!(err.contains("interrupted:") && err.contains(s(&partial)) && err.contains("run the same command again to resume"), "{err}");
    assert!(!out.exists(), "no complete output yet");
    // The message's count is the rows kept in the partial file, which the same command resumes
    // from (interrupted again here: the whole sweep takes minutes).
    let count = |text: &str| {
        text.split("interrupted: the ").nth(1).and_then(|t| t.split(' ').next()).and_then(|n| n.parse::<usize>().ok())
    };
    let kept = count(&err).unwrap_or_else(|| panic!("no row count in: {err}"));
    assert!(kept >= 2, "{err}");
    // The count is what the file holds (its two header lines aside), every row whole.
    let text = std::fs::read_to_string(&partial).unwrap();
    assert!(text.ends_with('\n'), "the partial file ends with a whole row");
    assert_eq!(text.lines().count() - 2, kept, "{err}");
    // The same command resumes: interrupted again it keeps at least those rows; if it finished
    // first, its summary counts them as resumed.
    let child = bin()
        .args(["sweep", s(&f), "--out", s(&out), "--no-progress"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let _ = unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let o = child.wait_with_output().unwrap();
    let again = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    let now = if o.status.code() == Some(130) {
        count(&again)
    } else {
        assert!(o.status.success(), "{again}");
        again.split(" resumed").next().and_then(|t| t.rsplit(' ').next()).and_then(|n| n.parse::<usize>().ok())
    };
    let now = now.unwrap_or_else(|| panic!("no row count in: {again}"));
    assert!(now >= kept, "resumed from the {kept} kept rows: {again}");
}

/// Ctrl-C while a large output is being written leaves no hidden temporary file beside it (a
/// fresh user found 90-170 MB `.tpusim-*.tmp` files after interrupting `run --timeline`), and the
/// target is not created half-written.
#[test]
fn an_interrupted_write_leaves_no_temporary_file() {
    let dir = scratch("interrupted-write");
    let tl = dir.join("tl.json");
    let trace = concat!(env!("CARGO_MANIFEST_DIR"), "/../../traces/video-720p-sparse.toml");
    let temps = || {
        std::fs::read_dir(&dir).unwrap().filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n.starts_with(".tpusim-")).collect::<Vec<_>>()
    };
    let child = bin()
        .args(["run", "--trace", trace, "--timeline", s(&tl), "--timeline-steps", "0:800"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Interrupt once the temporary file exists (the write takes about a second).
    let start = Instant::now();
    while temps().is_empty() && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    if o.status.success() {
        // The write finished before the signal arrived: the output is whole.
        assert!(tl.exists());
    } else {
        assert_eq!(o.status.code(), Some(130), "{err}");
        assert!(err.contains("interrupted: the outputs it had written are complete") && err.contains("run the command again"), "{err}");
        assert!(!tl.exists(), "no half-written target");
    }
    assert!(temps().is_empty(), "left behind: {:?} ({err})", temps());
}

/// Ctrl-C during `tpusim tune` says what happened and what to do (it exited 130 without a word).
#[test]
fn an_interrupted_tune_says_so_and_exits_130() {
    let child = bin()
        .args(["tune", "--heads", "8", "--mask", "causal", "--seq-len", "1048576", "--no-progress", "--jobs", "1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(130), "{err}");
    assert!(err.contains("interrupted: stopping the search"), "{err}");
    assert!(err.contains("tune: interrupted before every candidate was simulated") && err.contains("narrow it"), "{err}");
    assert!(o.stdout.is_empty(), "no table from an interrupted search");
}

#[test]
fn tune_best_line_is_a_complete_command_that_runs_the_best_row() {
    let job = ["--heads", "2", "--seq-len", "2048", "--mask", "band:300+sink:64", "--traversal", "compact", "--masking", "partial"];
    let out = ok(bin().arg("tune").args(job).args(["--top", "2", "--refine", "2", "--format", "json", "--no-progress"]).output().unwrap(), "tune");
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    // band+sink cannot be computed by Splash: only loaded blocks are ranked.
    for t in r["top"].as_array().unwrap() {
        assert_eq!(t["job"]["config"]["mask_source"], "loaded", "{t}");
    }
    let cmd = r["best_command"].as_str().unwrap();
    let words = shell_words(cmd);
    assert_eq!(&words[..2], ["tpusim", "run"], "{cmd}");
    let ran = ok(bin().args(&words[1..]).args(["--format", "json"]).output().unwrap(), cmd);
    let ran: serde_json::Value = serde_json::from_str(&ran).unwrap();
    assert_eq!(ran["latency_ms"], r["top"][0]["latency_ms"], "{cmd}");
    // The table's best line is the same command.
    let table = ok(bin().arg("tune").args(job).args(["--top", "2", "--refine", "2", "--no-progress"]).output().unwrap(), "tune table");
    assert!(table.contains(&format!("  best: {cmd}")), "{table}");
}

/// Splits a command line as a POSIX shell does for words with single quotes.
fn shell_words(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut any = false;
    for c in s.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                any = true;
            }
            ' ' if !quoted => {
                if any || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
                any = false;
            }
            c => cur.push(c),
        }
    }
    if any || !cur.is_empty() {
        out.push(cur);
    }
    out
}

#[test]
fn a_generator_writes_into_a_hand_written_file_between_its_markers_only() {
    let dir = scratch("splice");
    let doc = dir.join("REPORT.md");
    let hand = "# My report\n\nNotes I wrote.\n\n<!-- tpusim validate: begin -->\nstale\n<!-- tpusim validate: end -->\n\nMore notes.\n";
    std::fs::write(&doc, hand).unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let csv = root.join("traces/measured/calibration.csv");
    ok(bin().args(["validate", s(&csv), "--format", "markdown", "--into", s(&doc)]).output().unwrap(), "validate --into");
    let text = std::fs::read_to_string(&doc).unwrap();
    assert!(text.starts_with("# My report\n\nNotes I wrote.\n\n<!-- tpusim validate: begin -->\n"));
    assert!(text.ends_with("<!-- tpusim validate: end -->\n\nMore notes.\n"));
    assert!(!text.contains("stale") && text.contains("VD-B0"));
    // A file without markers is refused before any work and left as it was.
    let bare = dir.join("bare.md");
    std::fs::write(&bare, "mine\n").unwrap();
    let e = refused(bin().args(["validate", s(&csv), "--format", "markdown", "--into", s(&bare)]).output().unwrap(), "no markers");
    assert!(e.contains("<!-- tpusim validate: begin -->"), "{e}");
    assert_eq!(std::fs::read_to_string(&bare).unwrap(), "mine\n");
    // The docs generator (--bands, minutes of cross-validation) refuses it before the work too,
    // naming every part it writes; a marker quoted in a sentence is not a marker.
    std::fs::write(&bare, "Write between `<!-- tpusim accuracy: begin -->` and `<!-- tpusim accuracy: end -->`.\n").unwrap();
    // (The check before the work words it "or the markers of"; the one at writing time does not.)
    let e = refused(bin().args(["validate", s(&csv), "--bands", "--into", s(&bare)]).output().unwrap(), "no markers with --bands");
    assert!(e.contains("(or the markers of tpusim validate-cv, tpusim validate-bands, tpusim accuracy, tpusim fitted-params)"), "{e}");
}

/// A sweep whose rows cannot be written (a full disk, a file-size limit) says the rows written
/// are kept and how to go on (a fresh user saw a bare "File too large"), and the same command
/// resumes it.
#[test]
fn a_sweep_that_cannot_write_its_rows_says_how_to_go_on() {
    use std::os::unix::process::CommandExt;
    let dir = scratch("efbig");
    let def = dir.join("s.toml");
    let rates: Vec<String> = (0..60).map(|i| (800 + 10 * i).to_string()).collect();
    std::fs::write(&def, format!("[base]\nheads = 1\nseq_len = 4096\n[axes]\n\"chip.hbm.bandwidth_gb_per_s\" = [{}]\n", rates.join(", "))).unwrap();
    let out = dir.join("o.csv");
    let mut cmd = bin();
    cmd.args(["sweep", s(&def), "--out", s(&out), "--no-progress", "--jobs", "1"]);
    // SAFETY: async-signal-safe calls only, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let lim = libc::rlimit { rlim_cur: 16 << 10, rlim_max: 16 << 10 };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let o = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "60 rows do not fit 16 KiB: {err}");
    assert!(err.contains("cannot write") && err.contains("the rows already in it are kept") && err.contains("run the same command again to resume"), "{err}");
    // Without the limit the same command resumes and finishes.
    let o = bin().args(["sweep", s(&def), "--out", s(&out), "--no-progress"]).output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success() && said.contains("resumed"), "{said}");
    assert_eq!(std::fs::read_to_string(&out).unwrap().lines().filter(|l| !l.starts_with('#')).count(), 61, "header and 60 rows");
}
