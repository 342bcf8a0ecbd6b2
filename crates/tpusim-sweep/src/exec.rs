//! Running a sweep: parallel evaluation, deterministic output, resume, shards.
//!
//! **Parallelism.** Points are evaluated on a rayon pool (one thread per core unless `--jobs`):
//! first every point's chip and job are resolved, then points that lower to the same program
//! (they differ only in `[hbm]` and `[fitted]` chip parameters, see [`crate::eval`]) are grouped
//! so that each group lowers once, and the groups (split into pieces so that every thread has
//! work) are evaluated in parallel. Each point's row depends only on the point (sharing never
//! changes a result), so the output is the same for any number of threads.
//!
//! **Writing and resuming.** While it runs, a sweep appends each finished row to `OUT.partial`
//! (after the header), in the order points finish, flushing at least every 200 ms; a killed
//! sweep loses only the rows of the last fraction of a second. When every point is done, the
//! rows are written to `OUT` in index order through a temporary file and a rename, and
//! `OUT.partial` is removed: `OUT` only ever holds a complete, ordered sweep, and its bytes do not
//! depend on interruptions or thread counts.
//!
//! On start, a sweep reads `OUT.partial` (and `OUT`, if it exists) when its header matches this
//! sweep (same definition hash, shard and format): their rows are kept and their points are not
//! evaluated again. A last line without its newline (cut off by the kill) is dropped and
//! recomputed. Files of a different sweep (another definition, shard or format) are replaced,
//! with a note; `--restart` ignores the rows of existing sweep outputs. A file at `OUT` or
//! `OUT.partial` that is not a sweep output is never replaced, with or without `--restart`.
//!
//! Everything that can refuse a run (the thread count, the output paths, a foreign file at
//! either of them) is checked before any file is written, so a refused run leaves nothing behind.
//!
//! **Shards.** `--shard I/N` evaluates the points with `index % N == I` (interleaved, so that
//! shards get similar mixes of cheap and costly points) and writes them with their indices;
//! [`mod@crate::merge`] joins the shards.

use crate::def::SweepDef;
use crate::eval::{Evaluator, Outcome, Shared};
use crate::output::{check_replaceable, csv_fields, read_back, write_atomic, Format, Header, Layout};
use crate::SweepError;
use rayon::prelude::*;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::BuildHasher;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tpusim_job::JobSpec;

/// A slice of a sweep: the points with `index % count == index_of_shard`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// Which slice, 0-based.
    pub index: u64,
    /// How many slices.
    pub count: u64,
}

impl Shard {
    /// The whole sweep (shard 0 of 1).
    pub const WHOLE: Shard = Shard { index: 0, count: 1 };

    /// Parses `I/N` (0 <= I < N).
    ///
    /// # Errors
    /// [`SweepError`] naming the value.
    pub fn parse(s: &str) -> Result<Shard, SweepError> {
        let bad = || {
            SweepError::new(format!(
                "--shard {s}: expected I/N with 0 <= I < N, e.g. --shard 0/4, or auto (a Slurm array task or Kubernetes Indexed Job: studies/README.md)"
            ))
        };
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let (index, count): (u64, u64) = (i.trim().parse().map_err(|_| bad())?, n.trim().parse().map_err(|_| bad())?);
        if count == 0 || index >= count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }

    /// Whether a point belongs to this shard.
    pub fn owns(&self, point: u64) -> bool {
        point % self.count == self.index
    }

    /// Number of this shard's points in a sweep of `total`.
    pub fn len(&self, total: u64) -> u64 {
        if total > self.index {
            (total - self.index - 1) / self.count + 1
        } else {
            0
        }
    }

    /// Whether the shard has no point in a sweep of `total`.
    pub fn is_empty(&self, total: u64) -> bool {
        self.len(total) == 0
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// How to run a sweep.
#[derive(Debug, Clone)]
pub struct SweepOptions {
    /// Output file.
    pub out: String,
    /// Output format.
    pub format: Format,
    /// Which slice of the sweep to evaluate.
    pub shard: Shard,
    /// Worker threads (`None`: one per core).
    pub jobs: Option<usize>,
    /// Print progress on stderr ([`crate::progress`]: a bar on a terminal, else plain lines).
    pub progress: bool,
    /// Ignore existing output and partial files.
    pub restart: bool,
    /// Replace an existing output that is not this sweep's (another sweep definition, shard or
    /// format, or a file tpusim did not write); without it such a file is refused.
    pub force: bool,
    /// Longest time between flushes of `OUT.partial`.
    pub flush_every: Duration,
    /// Add each point's what-if table (`--what-if-2x`): the `bottleneck` and `co_bound` columns
    /// and one `gain_2x_UNIT` column per unit ([`tpusim_job::whatif`]); six re-timings a point.
    /// Part of the output's identity: a file written with it is another sweep's for resuming and
    /// merging (its definition carries `-what-if-2x`).
    pub what_if_2x: bool,
    /// Set by another thread to stop the sweep (the CLI's Ctrl-C), as
    /// [`crate::tune::TuneOptions::cancel`]: the workers start no further point, the rows
    /// finished so far are flushed to `OUT.partial`, and [`run_sweep`] returns
    /// [`SweepError::Interrupted`] saying how many rows that file holds.
    pub cancel: Option<std::sync::Arc<AtomicBool>>,
}

impl SweepOptions {
    /// Whether [`SweepOptions::cancel`] is set.
    fn cancelled(&self) -> bool {
        self.cancel.as_ref().is_some_and(|c| c.load(Ordering::Relaxed))
    }

    /// Options for writing `out` (format from its extension), whole sweep, all cores.
    pub fn new(out: &str) -> Self {
        SweepOptions {
            out: out.to_string(),
            format: Format::from_path(out),
            shard: Shard::WHOLE,
            jobs: None,
            progress: false,
            restart: false,
            force: false,
            flush_every: Duration::from_millis(200),
            cancel: None,
            what_if_2x: false,
        }
    }
}

/// The default output file of a sweep: the sweep file's name with the format's extension, in
/// the current folder; shards add `.shard-I-of-N`.
pub fn default_out(sweep_file: &str, shard: Shard, format: Format) -> String {
    let stem = Path::new(sweep_file).file_stem().and_then(|s| s.to_str()).unwrap_or("sweep");
    if shard.count > 1 {
        format!("{stem}.shard-{}-of-{}.{}", shard.index, shard.count, format.extension())
    } else {
        format!("{stem}.{}", format.extension())
    }
}

/// What a sweep run did.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepSummary {
    /// The sweep file.
    pub origin: String,
    /// The output file.
    pub out: String,
    /// The shard run.
    pub shard: Shard,
    /// Points in the whole sweep.
    pub total: u64,
    /// Points in this shard (rows written).
    pub points: u64,
    /// Points evaluated by this run.
    pub computed: u64,
    /// Points taken from an earlier, interrupted run.
    pub resumed: u64,
    /// Rows with an error.
    pub errors: u64,
    /// Wall time, seconds.
    pub seconds: f64,
    /// Remarks (files replaced or discarded).
    pub notes: Vec<String>,
}

impl fmt::Display for SweepSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for n in &self.notes {
            writeln!(f, "note: {n}")?;
        }
        let shard = if self.shard.count > 1 { format!(" (shard {} of a sweep of {})", self.shard, self.total) } else { String::new() };
        write!(
            f,
            "sweep {}: {} point{}{shard} -> {}: {} computed, {} resumed, {} with errors; {:.1} s",
            self.origin,
            self.points,
            if self.points == 1 { "" } else { "s" },
            self.out,
            self.computed,
            self.resumed,
            self.errors,
            self.seconds
        )?;
        if self.computed > 0 && self.seconds > 0.0 {
            write!(f, " ({:.0} points/s)", self.computed as f64 / self.seconds)?;
        }
        writeln!(f)
    }
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_else(|| "panic".into())
}

fn row_has_error(format: Format, line: &str) -> bool {
    let body = line.trim_end_matches('\n');
    match format {
        Format::Csv => csv_fields(body).ok().and_then(|f| f.last().cloned()).is_some_and(|e| !e.is_empty()),
        Format::Jsonl => {
            serde_json::from_str::<serde_json::Value>(body).ok().and_then(|v| v.get("error").cloned()).is_some_and(|e| !e.is_null())
        }
    }
}

/// Runs (or resumes) a sweep or one shard of it and writes `opts.out` (module docs).
///
/// # Errors
/// [`SweepError`] for unwritable files, an existing `OUT` or `OUT.partial` that is not a sweep
/// output, `jobs` of 0, or rows of an existing file that are malformed (the message names the
/// file and line).
pub fn run_sweep(def: &SweepDef, opts: &SweepOptions) -> Result<SweepSummary, SweepError> {
    let start = Instant::now();
    if opts.progress {
        crate::progress::interval()?;
    }
    let layout = Layout::for_sweep(def, opts.what_if_2x);
    let shard = opts.shard;
    let format = opts.format;
    let header = Header {
        points: def.total(),
        shard: (shard.index, shard.count),
        definition: if opts.what_if_2x { format!("{}-what-if-2x", def.hash_hex()) } else { def.hash_hex() },
        version: env!("CARGO_PKG_VERSION").to_string(),
    };
    let header_text = header.render(format, &layout.columns);
    let out = opts.out.as_str();
    let partial = format!("{out}.partial");
    let mut notes = Vec::new();
    let mut done: BTreeMap<u64, String> = BTreeMap::new();

    // Everything that can refuse the run does so before any file is written: the worker
    // threads, and both files this run would write (a file tpusim did not write is never
    // replaced, with or without --restart).
    let pool = crate::pool(opts.jobs)?;
    check_replaceable(out, &crate::output::out_label(out), opts.force)?;
    check_replaceable(&partial, &format!("{partial} (where the sweep to --out {out} keeps its unfinished rows)"), opts.force)?;
    // Two sweeps on one output: an advisory lock (flock), released by the OS when the process
    // holding it ends, however it ends.
    let (file, replaced) = lock_output(out, opts.force)?;
    let _lock = LockGuard { _file: file, path: lock_path(out) };
    if replaced {
        notes.push(format!("replaced {} (--force): tpusim did not write it; the sweep kept its lock there and removed it at the end", lock_path(out)));
    }
    if !opts.restart {
        for path in [out, partial.as_str()] {
            if !Path::new(path).exists() {
                continue;
            }
            // Only the head of the file decides whether it is this sweep's output.
            let mut text = Vec::new();
            std::fs::File::open(path)
                .and_then(|f| std::io::Read::read_to_end(&mut std::io::Read::take(f, 1 << 20), &mut text))
                .map_err(|e| SweepError::new(format!("cannot read {path}: {e}")))?;
            let first = text.split(|&b| b == b'\n').next().unwrap_or_default();
            let Some((theirs, their_format)) = Header::parse(&String::from_utf8_lossy(first)) else {
                if opts.force {
                    notes.push(format!("replaced {path} (--force): it is not a tpusim sweep output"));
                    continue;
                }
                return Err(SweepError::new(format!(
                    "{path} exists and is not a tpusim sweep output; give --force to replace it, or choose another --out"
                )));
            };
            if !text.starts_with(header_text.as_bytes()) {
                let holds = format!(
                    "{} (definition {}, shard {}/{}, {}), not this sweep (definition {}, shard {shard}, {})",
                    if theirs.definition == header.definition { "another shard or format of this sweep" } else { "another sweep" },
                    theirs.definition,
                    theirs.shard.0,
                    theirs.shard.1,
                    their_format.extension(),
                    header.definition,
                    format.extension()
                );
                if !opts.force {
                    return Err(SweepError::new(format!(
                        "{path} holds {holds}: it is not replaced; give --force to replace it (or --restart if the sweep file is the same), or choose another --out"
                    )));
                }
                notes.push(format!("replaced {path}: it holds {holds}"));
                continue;
            }
            drop(text);
            let rb = read_back(path, Some(&layout))
                .map_err(|e| SweepError::new(format!("{e}; rerun with --restart to start this sweep over")))?;
            for (i, line) in rb.rows {
                if i >= def.total() || !shard.owns(i) {
                    return Err(SweepError::new(format!(
                        "{path}: row {i} does not belong to shard {shard} of this sweep; rerun with --restart"
                    )));
                }
                match done.get(&i) {
                    Some(prev) if *prev != line => {
                        return Err(SweepError::new(format!("{path}: point {i} appears twice with different rows; rerun with --restart")))
                    }
                    _ => {
                        done.insert(i, line);
                    }
                }
            }
        }
    }
    let resumed = done.len() as u64;
    let todo: Vec<u64> = (shard.index..def.total()).step_by(shard.count as usize).filter(|i| !done.contains_key(i)).collect();

    let expected = shard.len(def.total());
    let mut computed_n = 0u64;
    let mut errors = done.values().filter(|l| row_has_error(format, l)).count() as u64;
    let mut what_ifs = WhatIfRows::default();
    for (&i, l) in &done {
        let w = row_design_whatif(format, l, layout.design_whatif_column());
        if !w.is_empty() {
            what_ifs.add(i, &w);
        }
    }
    if todo.is_empty() {
        if done.len() as u64 != expected {
            return Err(SweepError::Internal(format!("{} rows for {expected} points", done.len())));
        }
        let mut text = String::with_capacity(header_text.len() + done.values().map(String::len).sum::<usize>());
        text.push_str(&header_text);
        done.values().for_each(|l| text.push_str(l));
        write_atomic(out, text.as_bytes())?;
    } else {
        // Start OUT.partial afresh with the rows kept so far (dropping any cut-off last line),
        // noting where each row lies: rows are not held in memory, OUT is assembled from
        // OUT.partial at the end.
        let mut text = header_text.clone();
        let mut index: Vec<RowAt> = Vec::with_capacity(expected as usize);
        for (&i, l) in &done {
            index.push(RowAt { point: i, at: text.len() as u64, len: l.len() as u32 });
            text.push_str(l);
        }
        write_atomic(&partial, text.as_bytes())?;
        let written = text.len() as u64;
        drop(text);
        done.clear();
        let rows = evaluate_into(def, &layout, format, &todo, &partial, written, opts, &pool)?;
        computed_n = rows.rows.len() as u64;
        errors += rows.errors;
        what_ifs.merge(rows.what_ifs);
        index.extend(rows.rows);
        if opts.cancelled() && (index.len() as u64) < expected {
            return Err(SweepError::Interrupted { partial, rows: index.len() as u64, points: expected });
        }
        if index.len() as u64 != expected {
            return Err(SweepError::Internal(format!("{} rows for {expected} points", index.len())));
        }
        index.sort_unstable_by_key(|r| r.point);
        assemble(&partial, out, &header_text, &index)?;
    }
    if Path::new(&partial).exists() {
        std::fs::remove_file(&partial).map_err(|e| SweepError::Io(format!("cannot remove {partial}: {e}")))?;
    }
    notes.extend(what_ifs.note(expected));
    Ok(SweepSummary {
        origin: def.origin.clone(),
        out: out.to_string(),
        shard,
        total: def.total(),
        points: expected,
        computed: computed_n,
        resumed,
        errors,
        seconds: start.elapsed().as_secs_f64(),
        notes,
    })
}

/// The lock file of a sweep's output (`OUT.lock`, beside it).
pub fn lock_path(out: &str) -> String {
    format!("{out}.lock")
}

/// The command a sweep's lock file is marked with ([`tpusim_io::mark`]).
pub const LOCK_COMMAND: &str = "sweep --out";

/// Takes the advisory lock of `out` ([`lock_path`]) for this process, or says which file another
/// running sweep holds. The lock file carries tpusim's mark ([`LOCK_COMMAND`]); an existing file
/// at its path that does not (a user's `OUT.lock`) is refused, as `OUT.partial` is, unless
/// `force`: the lock file is removed when the sweep ends. Gives the open lock file and whether it
/// replaced such a file.
///
/// # Errors
/// [`SweepError::Input`] when another process holds it or a file tpusim did not write is there,
/// [`SweepError::Io`] when the lock file cannot be created.
fn lock_output(out: &str, force: bool) -> Result<(std::fs::File, bool), SweepError> {
    let path = lock_path(out);
    let held = |path: &str| {
        SweepError::new(format!(
            "--out {out}: another tpusim sweep is writing it (it holds the lock {path}); wait for it to finish, or choose another --out"
        ))
    };
    let foreign = Path::new(&path).exists() && tpusim_io::mark::read_mark(Path::new(&path)).as_deref() != Some(LOCK_COMMAND);
    if foreign && !force {
        // Not tpusim's mark: a sweep of an older tpusim holding it (an empty file), or the user's.
        if let Ok(f) = std::fs::File::open(&path) {
            if matches!(fs4::FileExt::try_lock(&f), Err(fs4::TryLockError::WouldBlock)) {
                return Err(held(&path));
            }
        }
        return Err(SweepError::new(format!(
            "{path} exists and tpusim did not write it (it carries no tpusim mark); a sweep to --out {out} keeps its lock there and removes it when it ends, so it is not used: give --force to replace it, or choose another --out"
        )));
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| SweepError::Io(format!("cannot create the lock file {path}: {e}")))?;
    match fs4::FileExt::try_lock(&file) {
        Ok(()) => {
            let marked = file.set_len(0).and_then(|_| file.write_all(tpusim_io::mark::comment_line(LOCK_COMMAND).as_bytes()));
            marked.map_err(|e| SweepError::Io(format!("cannot write the lock file {path}: {e}")))?;
            Ok((file, foreign))
        }
        Err(fs4::TryLockError::WouldBlock) => Err(held(&path)),
        Err(fs4::TryLockError::Error(e)) => Err(SweepError::Io(format!("cannot lock {path}: {e}"))),
    }
}

/// The lock this process holds on a sweep's output: when the run ends, however it ends (done,
/// refused, failed, interrupted), its lock file goes; the lock itself is released with the file.
struct LockGuard {
    _file: std::fs::File,
    path: String,
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Where a row of `OUT.partial` lies.
#[derive(Debug, Clone, Copy)]
struct RowAt {
    point: u64,
    at: u64,
    len: u32,
}

/// The rows a run appended to `OUT.partial`, how many of them carry an error, and how many are
/// design what-ifs (with the first by point index).
struct Appended {
    rows: Vec<RowAt>,
    errors: u64,
    what_ifs: WhatIfRows,
}

/// Rows whose `design_whatif` cell is not empty: how many, and the first by point index.
#[derive(Debug, Default)]
struct WhatIfRows {
    count: u64,
    first: Option<(u64, String)>,
}

impl WhatIfRows {
    fn add(&mut self, point: u64, what: &str) {
        self.count += 1;
        if self.first.as_ref().is_none_or(|(p, _)| point < *p) {
            self.first = Some((point, what.to_string()));
        }
    }

    fn merge(&mut self, other: WhatIfRows) {
        self.count += other.count;
        if let Some((p, w)) = other.first {
            if self.first.as_ref().is_none_or(|(q, _)| p < *q) {
                self.first = Some((p, w));
            }
        }
    }

    /// The sweep's note, if any row is a design what-if.
    fn note(&self, rows: u64) -> Option<String> {
        let (point, what) = self.first.as_ref()?;
        Some(format!(
            "{} of {rows} rows are design what-ifs (column design_whatif): their kernel family's library has no setting for an option the point gives, and tpusim times it as if it had (as `tpusim run` notes and `tpusim tune` stars); the first, point {point}: {what}",
            self.count
        ))
    }
}

/// The `design_whatif` cell of a row read back from an output (empty when none).
fn row_design_whatif(format: Format, line: &str, column: Option<usize>) -> String {
    let body = line.trim_end_matches('\n');
    match (format, column) {
        (_, None) => String::new(),
        (Format::Csv, Some(c)) => csv_fields(body).ok().and_then(|f| f.get(c).cloned()).unwrap_or_default(),
        (Format::Jsonl, Some(_)) => serde_json::from_str::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v.get(crate::output::DESIGN_WHATIF).and_then(|w| w.as_str().map(String::from)))
            .unwrap_or_default(),
    }
}

/// Writes `out`: the header, then the rows of `partial` at `index` in index order, completely or
/// not at all. Rows are read one at a time at their offsets (the page cache serves them), so
/// memory holds the index, not the file.
fn assemble(partial: &str, out: &str, header: &str, index: &[RowAt]) -> Result<(), SweepError> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(partial).map_err(|e| SweepError::Io(format!("cannot read {partial}: {e}")))?;
    let size = file.metadata().map_err(|e| SweepError::Io(format!("cannot read {partial}: {e}")))?.len();
    if let Some(r) = index.iter().find(|r| r.at + u64::from(r.len) > size) {
        return Err(SweepError::Internal(format!("{partial}: the row of point {} lies past its end", r.point)));
    }
    let mut buf = Vec::new();
    tpusim_io::write_with(Path::new(out), |f| {
        let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
        w.write_all(header.as_bytes())?;
        for r in index {
            buf.resize(r.len as usize, 0);
            file.read_exact_at(&mut buf, r.at)?;
            w.write_all(&buf)?;
        }
        w.flush()
    })
    .map_err(crate::output::output_error)
}

/// Evaluates `todo` in parallel, appending each row to `partial` (which holds `written` bytes)
/// as it finishes. Returns where each row went and how many rows carry an error.
///
/// Points are grouped by what decides their lowering without building anything large: the chip
/// model's lowering fields and the point's job fields other than its chip and overrides. Each
/// group lowers once (its first point's job; a point whose built job differs is evaluated on its
/// own, so the grouping never changes a result); groups are split into pieces so that every
/// thread has work, and a group's lowering is dropped when its last piece is done. Memory holds
/// a few lowerings and a row index, not the rows.
#[allow(clippy::too_many_arguments)]
fn evaluate_into(
    def: &SweepDef,
    layout: &Layout,
    format: Format,
    todo: &[u64],
    partial: &str,
    written: u64,
    opts: &SweepOptions,
    pool: &rayon::ThreadPool,
) -> Result<Appended, SweepError> {
    use std::sync::atomic::AtomicUsize;
    use std::sync::Mutex;
    let io = |e: std::io::Error| {
        SweepError::Io(format!("cannot write {partial}: {e} (the rows already in it are kept: once it can be written, run the same command again to resume)"))
    };
    let file = std::fs::OpenOptions::new().append(true).open(partial).map_err(io)?;
    let pb = crate::progress_bar(opts.progress, todo.len() as u64, "sweep");
    let mut ev = Evaluator::new();
    ev.what_if_2x = opts.what_if_2x;
    let stop = AtomicBool::new(false);
    // (point, row, has an error, its design what-ifs when it is one)
    let (tx, rx) = std::sync::mpsc::channel::<(u64, String, bool, Option<String>)>();
    let flush_every = opts.flush_every;
    let result = std::thread::scope(|s| {
        let writer = s.spawn(|| -> Result<Appended, SweepError> {
            let mut w = std::io::BufWriter::with_capacity(1 << 16, file);
            let mut last = Instant::now();
            let mut out = Appended { rows: Vec::with_capacity(todo.len()), errors: 0, what_ifs: WhatIfRows::default() };
            let mut at = written;
            let mut fail = None;
            let rx = rx; // moved into the writer
            let mut dirty = false;
            loop {
                // Rows are flushed when 200 ms have passed since the last flush, or when no row
                // has come for 200 ms: a kill loses at most the last fraction of a second.
                let (i, line, error, what_if) = match rx.recv_timeout(flush_every) {
                    Ok(row) => row,
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                        if dirty && fail.is_none() {
                            if let Err(e) = w.flush() {
                                fail = Some(io(e));
                                stop.store(true, Ordering::Relaxed);
                            }
                            dirty = false;
                            last = Instant::now();
                        }
                        continue;
                    }
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                };
                if fail.is_none() {
                    dirty = true;
                    if let Err(e) = w.write_all(line.as_bytes()) {
                        fail = Some(io(e));
                        stop.store(true, Ordering::Relaxed);
                    } else if last.elapsed() >= flush_every {
                        if let Err(e) = w.flush() {
                            fail = Some(io(e));
                            stop.store(true, Ordering::Relaxed);
                        }
                        dirty = false;
                        last = Instant::now();
                    }
                }
                if let Some(pb) = &pb {
                    pb.inc(1);
                }
                out.rows.push(RowAt { point: i, at, len: line.len() as u32 });
                out.errors += u64::from(error);
                if let Some(w) = what_if {
                    out.what_ifs.add(i, &w);
                }
                at += line.len() as u64;
            }
            if let Some(e) = fail {
                return Err(e);
            }
            w.flush().map_err(io)?;
            Ok(out)
        });
        pool.install(|| {
            // Group keys, in parallel: (lowering fields of the chip, job fields but chip and set).
            // Hashed (a collision only costs a lowering: evaluate_in checks the job and chip).
            let keys: Vec<Option<[u64; 3]>> = todo
                .par_iter()
                .map(|&i| {
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        let spec = def.point(i).spec;
                        let chip = ev.chip(&spec).ok()?;
                        let job = serde_json::to_string(&JobSpec { chip: None, set: Vec::new(), ..spec }).ok()?;
                        Some([chip.lowering_hash, crate::eval::stable_hash(&job), rustc_hash::FxBuildHasher.hash_one(&job)])
                    }))
                    .ok()
                    .flatten()
                })
                .collect();
            let mut groups: Vec<Vec<usize>> = Vec::new();
            let mut by_key: HashMap<[u64; 3], usize> = HashMap::new();
            for (k, key) in keys.into_iter().enumerate() {
                match key {
                    Some(key) => {
                        let g = *by_key.entry(key).or_insert_with(|| {
                            groups.push(Vec::new());
                            groups.len() - 1
                        });
                        groups[g].push(k);
                    }
                    None => groups.push(vec![k]),
                }
            }
            drop(by_key);
            let chunk = todo.len().div_ceil(4 * pool.current_num_threads()).max(1);
            // Per group: its shared lowering (made by the first piece to need it) and how many
            // pieces have yet to finish.
            let shared: Vec<Mutex<Option<std::sync::Arc<Option<Shared>>>>> = groups.iter().map(|_| Mutex::new(None)).collect();
            let left: Vec<AtomicUsize> = groups.iter().map(|g| AtomicUsize::new(g.len().div_ceil(chunk))).collect();
            let work: Vec<(usize, &[usize])> =
                groups.iter().enumerate().flat_map(|(gi, g)| g.chunks(chunk).map(move |c| (gi, c))).collect();
            work.par_iter().for_each_with(tx, |tx, &(gi, members)| {
                if stop.load(Ordering::Relaxed) || opts.cancelled() {
                    return;
                }
                let mut sent = vec![false; members.len()];
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    for (j, &k) in members.iter().enumerate() {
                        if opts.cancelled() {
                            // Unstarted points stay missing (not error rows): a rerun resumes them.
                            return;
                        }
                        let point = def.point(todo[k]);
                        let p = ev.prepare(&point.spec);
                        let g = {
                            let mut cell = shared[gi].lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                            cell.get_or_insert_with(|| std::sync::Arc::new(ev.lower_for(&p))).clone()
                        };
                        let outcome = ev.evaluate_in(g.as_ref().as_ref(), &p);
                        let what_if = outcome.job.as_ref().map(tpusim_job::design_what_ifs).filter(|w| !w.is_empty()).map(|w| w.join("; "));
                        let _ = tx.send((todo[k], layout.line(format, &layout.row(&point, &outcome)), outcome.report.is_err(), what_if));
                        sent[j] = true;
                    }
                }));
                let panicked = ran.is_err();
                let why = match ran {
                    Err(p) => format!("internal error: {}", panic_text(p.as_ref())),
                    Ok(()) => String::new(),
                };
                for (j, &k) in members.iter().enumerate() {
                    if !sent[j] && (panicked || !opts.cancelled()) {
                        let point = def.point(todo[k]);
                        let outcome = Outcome { job: None, chip: None, report: Err(why.clone()) };
                        let _ = tx.send((todo[k], layout.line(format, &layout.row(&point, &outcome)), true, None));
                    }
                }
                if left[gi].fetch_sub(1, Ordering::AcqRel) == 1 {
                    // The group's last piece: its lowering is no longer needed.
                    *shared[gi].lock().unwrap_or_else(std::sync::PoisonError::into_inner) = None;
                }
            });
        });
        writer.join().unwrap_or_else(|p| Err(SweepError::Internal(format!("in the writer: {}", panic_text(p.as_ref())))))
    });
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_partition_the_points() {
        for total in [0u64, 1, 7, 10] {
            for n in 1..5u64 {
                let sum: u64 = (0..n).map(|i| Shard { index: i, count: n }.len(total)).sum();
                assert_eq!(sum, total);
                for i in 0..n {
                    let s = Shard { index: i, count: n };
                    assert_eq!(s.len(total), (0..total).filter(|&p| s.owns(p)).count() as u64);
                }
            }
        }
        assert!(Shard::parse("4/4").is_err());
        assert!(Shard::parse("1/0").is_err());
        assert_eq!(Shard::parse("1/4").unwrap(), Shard { index: 1, count: 4 });
    }
}
