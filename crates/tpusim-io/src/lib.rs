//! What is not the domain, written once for every front end: output files that are written
//! completely or not at all ([`write_atomic`], checked before any work by [`check_output`]) and
//! CSV records ([`csv_record`], [`csv_fields`]) with the `csv` crate's RFC 4180 quoting.
//!
//! Depends on nothing in the workspace.

pub mod alloc;
pub mod bench;
pub mod mark;
pub mod plain;
pub use mark::check_replace;
pub use plain::plain_error;

use std::io::Write as _;
use std::path::{Path, PathBuf};

/// Why an output file cannot be written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutputError {
    /// The path cannot be an output: its folder is missing, it is empty, or it names something
    /// that is not a regular file. Checked before any work ([`check_output`]).
    #[error("{path}: {reason}")]
    Refused {
        /// The path as given.
        path: String,
        /// Why.
        reason: String,
    },
    /// Creating, writing or renaming the file failed.
    #[error("cannot write {path}: {reason}")]
    Io {
        /// The path as given.
        path: String,
        /// The operating system's reason.
        reason: String,
    },
}

impl OutputError {
    /// True when the path itself was refused (the user's input), false for an I/O failure.
    pub fn is_refusal(&self) -> bool {
        matches!(self, OutputError::Refused { .. })
    }
}

pub(crate) fn refused(path: &Path, reason: impl Into<String>) -> OutputError {
    OutputError::Refused { path: path.display().to_string(), reason: reason.into() }
}

/// The folder a path's file lives in (`.` for a bare file name).
fn folder_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Reads a text file, as `std::fs::read_to_string` does, but a file that is not UTF-8 is refused
/// with where: the byte offset of the first byte that is not, and its line and column (1-based),
/// so that a user can find it (the standard error says only that the stream was not UTF-8).
///
/// # Errors
/// The file's read error, or an [`std::io::ErrorKind::InvalidData`] error naming the position.
pub fn read_text(path: impl AsRef<Path>) -> std::io::Result<String> {
    let bytes = std::fs::read(path)?;
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let before = &e.as_bytes()[..at];
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        let column = before.len() - before.iter().rposition(|&b| b == b'\n').map_or(0, |p| p + 1) + 1;
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not UTF-8 text: the byte at offset {at} (line {line}, column {column}) is not valid UTF-8; save the file as UTF-8"),
        )
    })
}

/// Checks, before any work, that `path` can be written by [`write_atomic`]: a non-empty path
/// with a file name, in an existing folder that takes new files (probed by creating and removing
/// a temporary file there), that is not an existing directory, device or link.
///
/// # Errors
/// [`OutputError::Refused`] saying why.
pub fn check_output(path: &Path) -> Result<(), OutputError> {
    if path.as_os_str().is_empty() {
        return Err(refused(path, "an empty path; give a file name"));
    }
    if path.file_name().is_none() {
        return Err(refused(path, "not a file name"));
    }
    let dir = folder_of(path);
    if !dir.is_dir() {
        return Err(refused(path, format!("the folder {} does not exist", dir.display())));
    }
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if !m.file_type().is_file() {
            return Err(refused(path, "exists and is not a regular file (a device, directory or link); choose another path"));
        }
    }
    // The file is written as a temporary file in its folder, then renamed: probe that the folder
    // takes new files (permissions, read-only or pseudo file systems such as /proc).
    tempfile::Builder::new().prefix(".tpusim-check-").tempfile_in(&dir).map_err(|e| {
        // The operating system's reason, without the probe's own file name.
        let reason = e.raw_os_error().map_or_else(|| e.kind().to_string(), |c| std::io::Error::from_raw_os_error(c).to_string());
        refused(path, format!("cannot create files in the folder {}: {reason}", dir.display()))
    })?;
    Ok(())
}

/// Writes a file completely or not at all: `fill` writes into a temporary file in the same
/// folder (so the rename cannot cross file systems), which is flushed to disk and then renamed
/// over `path`. A reader never sees a half-written file, and a failure leaves no temporary file.
/// On Unix the file gets the permissions of any new file (0666 less the process's umask).
///
/// # Errors
/// [`OutputError::Refused`] as [`check_output`]; [`OutputError::Io`] when writing or renaming
/// fails.
pub fn write_with(path: &Path, fill: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>) -> Result<(), OutputError> {
    check_output(path)?;
    let io = |e: std::io::Error| OutputError::Io { path: path.display().to_string(), reason: e.to_string() };
    let mut builder = tempfile::Builder::new();
    builder.prefix(".tpusim-").suffix(".tmp");
    // A temporary file is private (0600) by default; the output gets the permissions any new
    // file gets (0666 less the umask), as `File::create` would give it.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        builder.permissions(std::fs::Permissions::from_mode(0o666));
    }
    let mut tmp = builder.tempfile_in(folder_of(path)).map_err(io)?;
    // Until it is renamed or dropped, an interrupt handler may remove it (remove_pending_outputs).
    let _pending = Pending::new(tmp.path());
    fill(tmp.as_file_mut()).map_err(io)?;
    tmp.as_file_mut().flush().map_err(io)?;
    tmp.as_file().sync_all().map_err(io)?;
    tmp.persist(path).map_err(|e| io(e.error))?;
    Ok(())
}

/// The temporary files [`write_with`] is filling right now (a writer's drop removes its own;
/// a process killed by a signal drops nothing).
fn pending() -> &'static std::sync::Mutex<Vec<PathBuf>> {
    static PENDING: std::sync::OnceLock<std::sync::Mutex<Vec<PathBuf>>> = std::sync::OnceLock::new();
    PENDING.get_or_init(Default::default)
}

/// A temporary file's place in [`pending`] while [`write_with`] fills it.
struct Pending(PathBuf);

impl Pending {
    fn new(path: &Path) -> Self {
        pending().lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(path.to_path_buf());
        Pending(path.to_path_buf())
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut p = pending().lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(i) = p.iter().position(|q| *q == self.0) {
            p.swap_remove(i);
        }
    }
}

/// Removes the temporary files of the writes in progress ([`write_with`]), for a front end's
/// interrupt handler to call before it exits: a process ended by a signal runs no destructor, so
/// a large output interrupted while being written (a `--timeline` of hundreds of MB) would leave
/// its hidden `.tpusim-*.tmp` beside the target. The targets themselves are never touched: each
/// is either its old file or the complete new one. Returns how many were removed.
pub fn remove_pending_outputs() -> usize {
    remove_pending(|_| true)
}

/// [`remove_pending_outputs`] for the pending files `which` picks.
fn remove_pending(which: impl Fn(&Path) -> bool) -> usize {
    let p = pending().lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    p.iter().filter(|f| which(f) && std::fs::remove_file(f).is_ok()).count()
}

/// [`write_with`] for bytes in memory.
///
/// # Errors
/// As [`write_with`].
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), OutputError> {
    write_with(path, |f| f.write_all(bytes))
}

/// One CSV record, ending in a newline (fields with a comma, quote or line break are quoted).
pub fn csv_record<I: IntoIterator<Item = S>, S: AsRef<[u8]>>(fields: I) -> String {
    let mut w = csv::WriterBuilder::new().terminator(csv::Terminator::Any(b'\n')).from_writer(Vec::new());
    // Writing into memory cannot fail.
    let _ = w.write_record(fields);
    String::from_utf8_lossy(&w.into_inner().unwrap_or_default()).into_owned()
}

/// The fields of one CSV record (its text, with or without the line break).
///
/// # Errors
/// The `csv` crate's description of what is malformed.
pub fn csv_fields(record: &str) -> Result<Vec<String>, String> {
    let mut r = csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(record.as_bytes());
    match r.records().next() {
        Some(Ok(rec)) => Ok(rec.iter().map(String::from).collect()),
        Some(Err(e)) => Err(e.to_string()),
        None => Ok(vec![String::new()]),
    }
}

/// The 1-based line of the CSV record that starts at or after byte `byte` of `text`: the `csv`
/// crate's record position may point at the previous line's terminator or at skipped blank lines
/// and `#` comment lines.
pub fn csv_line_at(text: &str, byte: u64) -> u64 {
    CsvLines::new(text).line_at(byte)
}

/// [`csv_line_at`] for a reader's records in order: counts line ends only from the previous
/// record on, so a file's lines cost one pass (each call from the start made reading a
/// calibration file of a few hundred long rows quadratic). A byte before the previous one is
/// counted from the start again.
#[derive(Debug, Clone)]
pub struct CsvLines<'a> {
    text: &'a str,
    /// Byte up to which line ends are counted, and the 1-based line there.
    at: (usize, u64),
}

impl<'a> CsvLines<'a> {
    /// A counter over `text`, at its first byte.
    pub fn new(text: &'a str) -> Self {
        CsvLines { text, at: (0, 1) }
    }

    /// The 1-based line of the CSV record that starts at or after byte `byte` (as
    /// [`csv_line_at`]).
    pub fn line_at(&mut self, byte: u64) -> u64 {
        let b = self.text.as_bytes();
        let mut i = (byte as usize).min(b.len());
        loop {
            while i < b.len() && (b[i] == b'\n' || b[i] == b'\r') {
                i += 1;
            }
            if i < b.len() && b[i] == b'#' {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            break;
        }
        if i < self.at.0 {
            self.at = (0, 1);
        }
        let more = b[self.at.0..i].iter().filter(|&&c| c == b'\n').count() as u64;
        self.at = (i, self.at.1 + more);
        self.at.1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file that is not UTF-8 is refused with the position of its first bad byte (a fresh
    /// user's Latin-1 files got "stream did not contain valid UTF-8" with no place).
    #[test]
    fn read_text_names_where_a_file_is_not_utf8() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.toml");
        std::fs::write(&p, b"heads = 8\nmask = \"caf\xe9\"\n").unwrap();
        let e = read_text(&p).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert_eq!(e.to_string(), "not UTF-8 text: the byte at offset 21 (line 2, column 12) is not valid UTF-8; save the file as UTF-8");
        std::fs::write(&p, "heads = 8\n").unwrap();
        assert_eq!(read_text(&p).unwrap(), "heads = 8\n");
    }

    /// While a write fills its temporary file, remove_pending_outputs removes it (what an
    /// interrupt handler calls before exiting); the target is left as it was, and a finished
    /// write is no longer pending.
    #[test]
    fn an_interrupted_write_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("out.json");
        std::fs::write(&target, "old").unwrap();
        let listing = || std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect::<Vec<_>>();
        let r = write_with(&target, |f| {
            f.write_all(b"partial")?;
            assert_eq!(listing().len(), 2, "the temporary file exists: {:?}", listing());
            // Only this test's folder: other tests write in parallel.
            assert_eq!(remove_pending(|p| p.starts_with(dir.path())), 1);
            assert_eq!(listing(), vec!["out.json".to_string()], "removed while being filled");
            Err(std::io::Error::other("interrupted"))
        });
        assert!(r.is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "old");
        write_atomic(&target, b"new").unwrap();
        assert_eq!(remove_pending(|p| p.starts_with(dir.path())), 0, "nothing pending after a finished write");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "new");
    }

    #[test]
    fn counted_lines_equal_lines_counted_from_the_start() {
        let text = "a,b\n# note\n\n1,2\r\n3,\"x\ny\"\n\n# end\n4,5\n";
        let mut c = CsvLines::new(text);
        for byte in (0..text.len() as u64).chain([3, 0, 20, 7]) {
            assert_eq!(c.line_at(byte), csv_line_at(text, byte), "byte {byte}");
        }
    }

    #[test]
    fn atomic_write_replaces_completely_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.txt");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "two");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        let e = write_with(&p, |_| Err(std::io::Error::other("disk full"))).unwrap_err();
        assert!(!e.is_refusal() && e.to_string().contains("disk full"), "{e}");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "two");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    /// Outputs are shared (a sweep folder read by a merge job, figures): they get the
    /// permissions `File::create` gives a new file under the process's umask, not a temporary
    /// file's private 0600.
    #[cfg(unix)]
    #[test]
    fn atomic_outputs_get_the_permissions_of_any_new_file() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("plain.txt");
        std::fs::File::create(&plain).unwrap();
        let expected = std::fs::metadata(&plain).unwrap().permissions().mode() & 0o777;
        let p = dir.path().join("out.txt");
        write_atomic(&p, b"one").unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, expected);
    }

    #[test]
    fn bad_outputs_are_refused_before_work() {
        let dir = tempfile::tempdir().unwrap();
        assert!(check_output(Path::new("")).unwrap_err().is_refusal());
        assert!(check_output(&dir.path().join("missing/x.csv")).unwrap_err().to_string().contains("does not exist"));
        assert!(check_output(dir.path()).unwrap_err().to_string().contains("not a regular file"));
        assert!(check_output(Path::new("/dev/null")).unwrap_err().is_refusal());
        // A folder that takes no new files (as root, permissions do not stop writes; /proc does).
        let e = check_output(Path::new("/proc/tpusim-out.toml")).unwrap_err();
        assert!(e.is_refusal() && e.to_string().contains("cannot create files in the folder /proc"), "{e}");
        check_output(&dir.path().join("new.csv")).unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the probe leaves nothing behind");
    }

    #[test]
    fn csv_records_round_trip() {
        let fields = ["a", "b,c", "say \"hi\"", "", "x\ny"];
        let line = csv_record(fields);
        assert!(line.ends_with('\n'));
        assert_eq!(csv_fields(&line).unwrap(), fields);
    }
}
