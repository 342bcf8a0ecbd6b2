//! One overwrite rule for every output: tpusim marks each file it writes with the command that
//! wrote it, and replaces an existing file only when it carries the mark of the same command
//! (`--force` replaces anything else). The marks, in each file's own form:
//!
//! | output | mark |
//! |---|---|
//! | CSV (`from-trace --out`), TOML (`calibrate --out`) | a first line `# tpusim output: COMMAND (tpusim VERSION)` |
//! | JSON (`run --timeline`, `layer --timeline`) | a top-level key `"tpusim_output": "COMMAND (tpusim VERSION)"` |
//! | SVG (`plot`) | a first line `<!-- tpusim output: plot (tpusim VERSION) -->` |
//! | PNG (`plot`) | a `tEXt` chunk, keyword `tpusim output`, text `plot (tpusim VERSION)` |
//! | sweep outputs (`sweep`, `merge`) | their header, `# tpusim sweep: ...` or `{"tpusim_sweep": ...}`, which also names the sweep definition |
//! | sweep lock files (`sweep`: `OUT.lock`) | a first line `# tpusim output: sweep --out (tpusim VERSION)` |
//! | band files (`validate --bands --out`) | a top-level key `"generated_by": "tpusim validate ... --bands ..."` ([`BANDS_COMMAND`]) |
//! | kernel descriptions (`tpusim.jax.describe`, plain or gzip-compressed) | `"format": "tpusim-kernel-description"` with `"producer": {"tool": "tpusim.jax", ...}` ([`DESCRIBE_COMMAND`]) |
//! | a description's `.npy` side files | none of their own: replaced only beside a description tpusim wrote ([`check_beside`]) |
//! | decode sweep CSV (`tpusim.jax.decode_sweep(..., path=)`) | a first line `# tpusim output: tpusim.jax.decode_sweep (tpusim VERSION)` ([`DECODE_SWEEP_COMMAND`]) |
//!
//! Sweep outputs carry their own identity (the definition hash), which the sweep crate checks:
//! a different sweep definition needs `--force` too. Every writer, the Python package's
//! included (`force=False` by default), checks every path it will write before it writes the
//! first ([`check_replace`], [`check_beside`]); a refusal says how to force in the writer's own
//! terms ([`Force`]: `--force` on the command line, `force=True` in Python).

use crate::OutputError;
use std::io::Read as _;
use std::path::Path;

/// The tpusim version written into marks.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The top-level key of the mark in JSON outputs.
pub const JSON_KEY: &str = "tpusim_output";
/// The keyword of the mark's `tEXt` chunk in PNG outputs.
pub const PNG_KEYWORD: &str = "tpusim output";
const TAG: &str = "tpusim output: ";
/// The command a band file's mark names (`tpusim validate --bands --out FILE`).
pub const BANDS_COMMAND: &str = "validate --bands";
/// The command a kernel description's mark names (`tpusim.jax.describe`).
pub const DESCRIBE_COMMAND: &str = "tpusim.jax.describe";
/// The command a decode sweep's CSV mark names (`tpusim.jax.decode_sweep(..., path=...)`).
pub const DECODE_SWEEP_COMMAND: &str = "tpusim.jax.decode_sweep";

/// How a writer's caller replaces a file tpusim would not replace, as a refusal says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Force {
    /// The command line's `--force`.
    #[default]
    Flag,
    /// The Python package's `force=True` keyword.
    Keyword,
}

impl Force {
    /// The refusal's way forward: `give --force to replace it` or `pass force=True to replace it`.
    pub fn advice(self) -> &'static str {
        match self {
            Force::Flag => "give --force to replace it",
            Force::Keyword => "pass force=True to replace it",
        }
    }
}

/// A command as a refusal names it: `tpusim COMMAND` for a command of the binary, the Python
/// function itself (`tpusim.jax.describe`) for the package's writers.
fn shown(command: &str) -> String {
    if command.starts_with("tpusim.") {
        command.to_string()
    } else {
        format!("tpusim {command}")
    }
}

/// The mark's value: `COMMAND (tpusim VERSION)`.
pub fn mark_value(command: &str) -> String {
    format!("{command} (tpusim {VERSION})")
}

/// The mark as a comment line of a CSV or TOML file (with its newline).
pub fn comment_line(command: &str) -> String {
    format!("# {TAG}{}\n", mark_value(command))
}

/// The mark as the first line of an SVG file (an XML comment, with its newline).
pub fn svg_comment(command: &str) -> String {
    format!("<!-- {TAG}{} -->\n", mark_value(command))
}

/// The command whose mark a file carries (`None`: no tpusim mark, or not readable). Reads the
/// first 64 KiB (of the decompressed text for a gzip-compressed file, such as a
/// `kernel.json.gz` description): marks are at the start of every output.
pub fn read_mark(path: &Path) -> Option<String> {
    let mut head = Vec::new();
    std::fs::File::open(path).ok()?.take(1 << 16).read_to_end(&mut head).ok()?;
    if head.starts_with(&[0x1f, 0x8b]) {
        let mut text = Vec::new();
        // A truncated stream still yields its first bytes; a corrupt one yields what it can.
        let file = std::fs::File::open(path).ok()?;
        let _ = flate2::read::GzDecoder::new(file).take(1 << 16).read_to_end(&mut text);
        return mark_in(&text);
    }
    mark_in(&head)
}

/// The text of the JSON string value that follows `"key"` at or after byte `from` of `text`
/// (with its byte offset), for the marks of JSON outputs: `"key": "value"`, any spacing.
fn json_string_after(text: &str, key: &str, from: usize) -> Option<(usize, String)> {
    let quoted = format!("\"{key}\"");
    let mut at = from;
    while let Some(i) = text.get(at..)?.find(&quoted).map(|i| at + i) {
        at = i + quoted.len();
        let Some(rest) = text[at..].trim_start().strip_prefix(':') else { continue };
        let Some(rest) = rest.trim_start().strip_prefix('"') else { continue };
        let end = rest.find('"')?;
        return Some((i, rest[..end].to_string()));
    }
    None
}

/// The command whose mark `head` (a file's first bytes) carries.
pub fn mark_in(head: &[u8]) -> Option<String> {
    let command = |value: &str| value.rfind(" (tpusim ").map_or(value, |i| &value[..i]).trim().to_string();
    if head.starts_with(b"\x89PNG\r\n\x1a\n") {
        let mut pos = 8usize;
        while pos + 8 <= head.len() {
            let len = u32::from_be_bytes(head[pos..pos + 4].try_into().ok()?) as usize;
            let kind = &head[pos + 4..pos + 8];
            let data = head.get(pos + 8..pos + 8 + len)?;
            if kind == b"tEXt" {
                if let Some(i) = data.iter().position(|&b| b == 0) {
                    if &data[..i] == PNG_KEYWORD.as_bytes() {
                        return Some(command(&String::from_utf8_lossy(&data[i + 1..])));
                    }
                }
            }
            if kind == b"IDAT" || kind == b"IEND" {
                return None;
            }
            pos += 12 + len;
        }
        return None;
    }
    let text = String::from_utf8_lossy(head);
    if text.starts_with("# tpusim sweep: ") || text.starts_with("{\"tpusim_sweep\"") {
        return Some("sweep".into());
    }
    if let Some(i) = text.find(TAG) {
        let rest = &text[i + TAG.len()..];
        let end = rest.find(['\n', '\r']).unwrap_or(rest.len());
        let value = rest[..end].trim_end_matches("-->").trim();
        return Some(command(value));
    }
    if let Some((_, value)) = json_string_after(&text, JSON_KEY, 0) {
        return Some(command(&value));
    }
    // A band file names the command that wrote it.
    if let Some((_, by)) = json_string_after(&text, "generated_by", 0) {
        let words: Vec<&str> = by.split_whitespace().collect();
        if words.starts_with(&["tpusim", "validate"]) && words.contains(&"--bands") {
            return Some(BANDS_COMMAND.to_string());
        }
    }
    // A kernel description tpusim.jax wrote: its format, and its producer's tool.
    if json_string_after(&text, "format", 0).is_some_and(|(_, f)| f == "tpusim-kernel-description") {
        let (_, tool) = json_string_after(&text, "tool", text.find("\"producer\"")?)?;
        if tool == "tpusim.jax" {
            return Some(DESCRIBE_COMMAND.to_string());
        }
    }
    None
}

/// Checks, before any work, that `command` may write `path`: a path [`crate::check_output`]
/// accepts and, when a file is there, one that carries the mark of the same command, unless
/// `force` (module docs). The refusal says `--force` ([`check_replace_as`] for another [`Force`]).
///
/// # Errors
/// [`OutputError::Refused`] saying what the file holds and that `--force` replaces it.
pub fn check_replace(path: &Path, command: &str, force: bool) -> Result<(), OutputError> {
    check_replace_as(path, command, force, Force::Flag)
}

/// [`check_replace`], the refusal saying how to force as `how` does (`force=True` in Python).
///
/// # Errors
/// [`OutputError::Refused`] saying what the file holds and how to replace it.
pub fn check_replace_as(path: &Path, command: &str, force: bool, how: Force) -> Result<(), OutputError> {
    crate::check_output(path)?;
    if force || !path.exists() {
        return Ok(());
    }
    let advice = how.advice();
    match read_mark(path) {
        Some(c) if c == command => Ok(()),
        Some(c) => Err(crate::refused(
            path,
            format!("holds the output of `{}`, not of `{}`; {advice}, or choose another path", shown(&c), shown(command)),
        )),
        None => Err(crate::refused(
            path,
            format!("exists and tpusim did not write it (it carries no tpusim mark), so it is not replaced; {advice}, or choose another path"),
        )),
    }
}

/// Checks, before any work, that a side file of `owner` (a description's `.npy` table) may be
/// written at `side`: a path [`crate::check_output`] accepts and, when a file is there, one beside
/// an `owner` that carries the mark of `owner_command` (the side file holds tpusim's data only
/// when the file that names it is tpusim's), unless `force`. The refusal says how to force as
/// `how` does.
///
/// # Errors
/// [`OutputError::Refused`] naming the side file and its owner, and how to replace it.
pub fn check_beside(side: &Path, owner: &Path, owner_command: &str, force: bool, how: Force) -> Result<(), OutputError> {
    crate::check_output(side)?;
    if force || !side.exists() {
        return Ok(());
    }
    if read_mark(owner).as_deref() == Some(owner_command) {
        return Ok(());
    }
    Err(crate::refused(
        side,
        format!(
            "exists and tpusim did not write it: it would be replaced as a side file of {}, which {}; {}, or choose another path",
            owner.display(),
            if owner.exists() { format!("does not carry the mark of `{}`", shown(owner_command)) } else { "is not there".to_string() },
            how.advice()
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_read_back_in_every_form() {
        assert_eq!(mark_in(comment_line("from-trace").as_bytes()).as_deref(), Some("from-trace"));
        assert_eq!(mark_in(format!("{}<svg/>", svg_comment("plot")).as_bytes()).as_deref(), Some("plot"));
        let json = format!("{{\"{JSON_KEY}\": \"{}\", \"traceEvents\": []}}", mark_value("run --timeline"));
        assert_eq!(mark_in(json.as_bytes()).as_deref(), Some("run --timeline"));
        assert_eq!(mark_in(b"# tpusim sweep: points=2 shard=0/1 definition=00 tpusim=0.1.0\n").as_deref(), Some("sweep"));
        assert_eq!(mark_in(b"id,chip\nA,v6e\n"), None);
        assert_eq!(mark_in(b"{\"traceEvents\": []}"), None);
        let bands = "{\n  \"generated_by\": \"tpusim validate m.csv --bands --out b.json\",\n  \"measurements\": \"m.csv\"}";
        assert_eq!(mark_in(bands.as_bytes()).as_deref(), Some(BANDS_COMMAND));
        assert_eq!(mark_in(b"{\"generated_by\": \"my script\"}"), None);
        let desc = "{\"format\":\"tpusim-kernel-description\",\"version\":1,\"kernel_name\":\"k\",\"producer\":{\"tool\":\"tpusim.jax\",\"jax\":\"0.10.2\"}}";
        assert_eq!(mark_in(desc.as_bytes()).as_deref(), Some(DESCRIBE_COMMAND));
        let other = desc.replace("\"tool\":\"tpusim.jax\"", "\"tool\":\"hand-written\"");
        assert_eq!(mark_in(other.as_bytes()), None);
        assert_eq!(mark_in(b"{\"format\":\"tpusim-kernel-description\",\"tool\":\"tpusim.jax\"}"), None, "the tool is the producer's");
    }

    #[test]
    fn a_compressed_description_carries_its_mark() {
        use std::io::Write as _;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k.json.gz");
        let mut enc = flate2::write::GzEncoder::new(std::fs::File::create(&p).unwrap(), flate2::Compression::fast());
        enc.write_all(b"{\"format\": \"tpusim-kernel-description\", \"producer\": {\"tool\": \"tpusim.jax\"}}").unwrap();
        enc.finish().unwrap();
        assert_eq!(read_mark(&p).as_deref(), Some(DESCRIBE_COMMAND));
        check_replace(&p, DESCRIBE_COMMAND, false).unwrap();
    }

    #[test]
    fn side_files_are_replaced_only_beside_a_description_tpusim_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let owner = dir.path().join("k.json");
        let side = dir.path().join("k.prefetch0.npy");
        check_beside(&side, &owner, DESCRIBE_COMMAND, false, Force::Flag).unwrap();
        std::fs::write(&side, b"precious").unwrap();
        let e = check_beside(&side, &owner, DESCRIBE_COMMAND, false, Force::Flag).unwrap_err().to_string();
        assert!(e.contains("is not there") && e.contains("force"), "{e}");
        std::fs::write(&owner, b"{\"mine\": 1}").unwrap();
        assert!(check_beside(&side, &owner, DESCRIBE_COMMAND, false, Force::Flag).unwrap_err().to_string().contains("does not carry the mark"));
        check_beside(&side, &owner, DESCRIBE_COMMAND, true, Force::Flag).unwrap();
        std::fs::write(&owner, b"{\"format\": \"tpusim-kernel-description\", \"producer\": {\"tool\": \"tpusim.jax\"}}").unwrap();
        check_beside(&side, &owner, DESCRIBE_COMMAND, false, Force::Flag).unwrap();
        assert_eq!(std::fs::read(&side).unwrap(), b"precious", "a check writes nothing");
    }

    #[test]
    fn only_the_same_command_replaces_without_force() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.csv");
        check_replace(&p, "from-trace", false).unwrap();
        std::fs::write(&p, "hand,written\n").unwrap();
        let e = check_replace(&p, "from-trace", false).unwrap_err().to_string();
        assert!(e.contains("tpusim did not write it") && e.contains("--force"), "{e}");
        check_replace(&p, "from-trace", true).unwrap();
        std::fs::write(&p, comment_line("from-trace")).unwrap();
        check_replace(&p, "from-trace", false).unwrap();
        let e = check_replace(&p, "calibrate", false).unwrap_err().to_string();
        assert!(e.contains("holds the output of `tpusim from-trace`"), "{e}");
    }

    #[test]
    fn a_python_writer_is_told_its_own_keyword() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("rows.csv");
        std::fs::write(&p, "hand,written\n").unwrap();
        let e = check_replace_as(&p, DECODE_SWEEP_COMMAND, false, Force::Keyword).unwrap_err().to_string();
        assert!(e.contains("pass force=True to replace it") && !e.contains("--force"), "{e}");
        std::fs::write(&p, comment_line("from-trace")).unwrap();
        let e = check_replace_as(&p, DECODE_SWEEP_COMMAND, false, Force::Keyword).unwrap_err().to_string();
        assert!(e.contains("not of `tpusim.jax.decode_sweep`; pass force=True"), "{e}");
        std::fs::write(&p, comment_line(DECODE_SWEEP_COMMAND)).unwrap();
        check_replace_as(&p, DECODE_SWEEP_COMMAND, false, Force::Keyword).unwrap();
        let side = dir.path().join("k.prefetch0.npy");
        std::fs::write(&side, b"mine").unwrap();
        let e = check_beside(&side, &dir.path().join("k.json"), DESCRIBE_COMMAND, false, Force::Keyword).unwrap_err().to_string();
        assert!(e.contains("pass force=True to replace it"), "{e}");
    }
}

/// The markers between which a generator writes into a hand-written file (Markdown, HTML):
/// `<!-- tpusim TAG: begin -->` and `<!-- tpusim TAG: end -->`, each on a line of its own.
pub fn splice_markers(tag: &str) -> (String, String) {
    (format!("<!-- tpusim {tag}: begin -->"), format!("<!-- tpusim {tag}: end -->"))
}

/// Where `marker` stands as a whole line of `text` at or after byte `from` (a marker quoted
/// inside a sentence is not one).
fn find_line(text: &str, marker: &str, from: usize) -> Option<usize> {
    let mut at = from;
    while let Some(i) = text[at..].find(marker).map(|i| at + i) {
        let starts = i == 0 || text.as_bytes()[i - 1] == b'\n';
        let ends = text[i + marker.len()..].is_empty() || text[i + marker.len()..].starts_with('\n');
        if starts && ends {
            return Some(i);
        }
        at = i + marker.len();
    }
    None
}

/// `text` with `content` between its markers for `tag` ([`splice_markers`]): `Ok(None)` when
/// `text` has no such markers, every byte outside them unchanged.
///
/// # Errors
/// A message when the markers are out of order or appear more than once.
pub fn splice_text(text: &str, tag: &str, content: &str) -> Result<Option<String>, String> {
    let (begin, end) = splice_markers(tag);
    let Some(b) = find_line(text, &begin, 0) else { return Ok(None) };
    let after_begin = b + begin.len();
    let Some(e) = find_line(text, &end, after_begin) else {
        return Err(format!("has {begin} but no line {end} below it"));
    };
    if find_line(text, &begin, after_begin).is_some() {
        return Err(format!("has {begin} more than once; keep one generated part per tag"));
    }
    let body = content.trim_end_matches('\n');
    Ok(Some(format!("{}\n{body}\n{}", &text[..after_begin], &text[e..])))
}

/// The generated part of `text` for `tag`: the lines between its markers, each with its
/// newline (`None` when the markers are missing).
pub fn spliced_part<'t>(text: &'t str, tag: &str) -> Option<&'t str> {
    let (begin, end) = splice_markers(tag);
    let b = find_line(text, &begin, 0)? + begin.len();
    let e = find_line(text, &end, b)?;
    Some(text[b..e].strip_prefix('\n').unwrap_or(&text[b..e]))
}

/// Whether `text` has the markers of `tag`, each on a line of its own, in order.
pub fn has_part(text: &str, tag: &str) -> bool {
    spliced_part(text, tag).is_some()
}

/// Writes `content` into the hand-written file `path` between its markers ([`splice_markers`]),
/// atomically, leaving every other byte as it was.
///
/// # Errors
/// [`OutputError::Refused`] when the file cannot be read or lacks the markers (in order, once
/// each), saying which lines to add; [`OutputError::Io`] when writing fails.
pub fn splice_into(path: &Path, tag: &str, content: &str) -> Result<(), OutputError> {
    splice_all(path, &[(tag, content)]).map(|_| ())
}

/// Writes each `(tag, content)` part whose markers `path` has between them, in one atomic write;
/// parts whose markers it lacks are left out. Returns the tags written.
///
/// # Errors
/// [`OutputError::Refused`] when the file cannot be read, has none of the tags' markers (saying
/// which lines to add) or has a tag's markers out of order or twice; [`OutputError::Io`] when
/// writing fails.
pub fn splice_all<'a>(path: &Path, parts: &[(&'a str, &str)]) -> Result<Vec<&'a str>, OutputError> {
    let mut text = std::fs::read_to_string(path).map_err(|e| crate::refused(path, format!("cannot read it: {e}")))?;
    let mut written = Vec::new();
    for (tag, content) in parts {
        if let Some(t) = splice_text(&text, tag, content).map_err(|m| crate::refused(path, m))? {
            text = t;
            written.push(*tag);
        }
    }
    if written.is_empty() {
        let (begin, end) = splice_markers(parts.first().map_or("validate", |p| p.0));
        let others = if parts.len() > 1 {
            let all: Vec<String> = parts.iter().map(|(tag, _)| splice_markers(tag)).map(|(b, e)| format!("{b} ... {e}")).collect();
            format!(" (this command writes any of: {})", all.join(", "))
        } else {
            String::new()
        };
        return Err(crate::refused(
            path,
            format!("has no generated part: add a line {begin} and, below it, a line {end} where tpusim writes; the rest of the file is never touched{others}"),
        ));
    }
    crate::write_atomic(path, text.as_bytes())?;
    Ok(written)
}

#[cfg(test)]
mod splice_tests {
    use super::*;

    #[test]
    fn generated_text_goes_between_the_markers_only() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("doc.md");
        std::fs::write(&p, "# Title\n\nhand text\n<!-- tpusim validate: begin -->\nold\n<!-- tpusim validate: end -->\nmore hand text\n").unwrap();
        splice_into(&p, "validate", "| a |\n|---|\n").unwrap();
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            "# Title\n\nhand text\n<!-- tpusim validate: begin -->\n| a |\n|---|\n<!-- tpusim validate: end -->\nmore hand text\n"
        );
        // A marker quoted inside a sentence is not a marker.
        std::fs::write(&p, "Write between `<!-- tpusim validate: begin -->` and `<!-- tpusim validate: end -->`.\n").unwrap();
        assert!(splice_into(&p, "validate", "x").is_err());
        std::fs::write(&p, "no markers\n").unwrap();
        let e = splice_into(&p, "validate", "x").unwrap_err().to_string();
        assert!(e.contains("<!-- tpusim validate: begin -->"), "{e}");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "no markers\n");
    }
}
