//! Joining shard outputs (`tpusim merge`).
//!
//! The inputs must be outputs of one sweep: the same definition hash, number of points, tpusim
//! version, format and columns (a shard of another sweep, or of an edited sweep file, is
//! refused). Together their rows must hold every point `0..points` exactly once: a point in two
//! files, or a point in none, is an error that names the files, the points and, when the inputs
//! are shards `I/N`, the shards that are missing or incomplete. The merged file is written
//! atomically and is byte-for-byte the output of the same sweep run unsharded. The output may not
//! be one of the inputs, nor an existing file that is not a sweep output (checked before any
//! input is read).

use crate::output::{check_replaceable, read_back, same_file, write_atomic, Format, Header, ReadBack};
use crate::SweepError;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// What a merge did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergeSummary {
    /// Output file.
    pub out: String,
    /// Input files.
    pub files: usize,
    /// Points (rows) written.
    pub points: u64,
}

impl fmt::Display for MergeSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "merged {} files: {} points -> {}", self.files, self.points, self.out)
    }
}

fn list(v: &[u64]) -> String {
    let shown: Vec<String> = v.iter().take(10).map(u64::to_string).collect();
    if v.len() > 10 {
        format!("{}, ... ({} in all)", shown.join(", "), v.len())
    } else {
        shown.join(", ")
    }
}

/// Merges shard outputs into `out` (module docs).
///
/// # Errors
/// [`SweepError`] naming the files for unreadable or mismatched inputs, duplicated or missing
/// points.
pub fn merge(files: &[String], out: &str, force: bool) -> Result<MergeSummary, SweepError> {
    if files.is_empty() {
        return Err(SweepError::new("tpusim merge: give the shard outputs to join, e.g. tpusim merge s.shard-*.csv --out s.csv"));
    }
    // The output is checked before any input is read: never one of the inputs (it would be
    // lost if the merge failed halfway), never a file that is not a sweep output.
    if let Some(f) = files.iter().find(|f| f.as_str() == out || same_file(f, out)) {
        return Err(SweepError::new(format!("--out {out} is one of the files to merge ({f}); write the merged sweep to a new file")));
    }
    check_replaceable(out, &crate::output::out_label(out), force)?;
    let reads: Vec<ReadBack> = files.iter().map(|f| read_back(f, None)).collect::<Result<_, _>>()?;
    let first = &reads[0];
    let cols = |r: &ReadBack| r.header_text.split_once('\n').map(|(_, rest)| rest.to_string()).unwrap_or_default();
    for (f, r) in files.iter().zip(&reads).skip(1) {
        let a = &first.header;
        let b = &r.header;
        let what = if r.format != first.format {
            Some(format!("format {} vs {}", r.format.extension(), first.format.extension()))
        } else if b.definition != a.definition {
            Some(format!("sweep definition {} vs {}", b.definition, a.definition))
        } else if b.points != a.points {
            Some(format!("{} points vs {}", b.points, a.points))
        } else if b.version != a.version {
            Some(format!("tpusim {} vs {}", b.version, a.version))
        } else if cols(r) != cols(first) {
            Some("different columns".to_string())
        } else {
            None
        };
        if let Some(w) = what {
            return Err(SweepError::new(format!("{f} and {} are not shards of one sweep ({w})", files[0])));
        }
    }
    // The overwrite rule: an existing output of another sweep is replaced only with --force.
    if !force && std::path::Path::new(out).exists() {
        let head = std::fs::read(out).map_err(|e| SweepError::new(format!("cannot read {out}: {e}")))?;
        let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
        if let Some((h, _)) = Header::parse(String::from_utf8_lossy(line).trim_end()) {
            if h.definition != first.header.definition {
                return Err(SweepError::new(format!(
                    "--out {out} holds another sweep (definition {}, not {}); give --force to replace it, or choose another --out",
                    h.definition, first.header.definition
                )));
            }
        }
    }
    let total = first.header.points;
    let mut rows: BTreeMap<u64, (&str, usize)> = BTreeMap::new();
    for (fi, r) in reads.iter().enumerate() {
        for (i, line) in &r.rows {
            if *i >= total {
                return Err(SweepError::new(format!("{}: point {i} is out of range (the sweep has {total} points)", files[fi])));
            }
            if let Some((_, other)) = rows.insert(*i, (line.as_str(), fi)) {
                let where_ =
                    if other == fi { format!("twice in {}", files[fi]) } else { format!("in both {} and {}", files[other], files[fi]) };
                return Err(SweepError::new(format!("point {i} is {where_}: a shard was given twice or shards overlap")));
            }
        }
    }
    if rows.len() as u64 != total {
        let missing: Vec<u64> = (0..total).filter(|i| !rows.contains_key(i)).collect();
        let mut msg = format!("{} of {total} points are missing: {}", missing.len(), list(&missing));
        let counts: BTreeSet<u64> = reads.iter().map(|r| r.header.shard.1).collect();
        if counts.len() == 1 {
            let n = *counts.iter().next().unwrap_or(&1);
            let have: BTreeSet<u64> = reads.iter().map(|r| r.header.shard.0).collect();
            let absent: Vec<u64> = (0..n).filter(|i| !have.contains(i)).collect();
            if !absent.is_empty() {
                msg.push_str(&format!("; no file for shard{} {} of {n}", if absent.len() > 1 { "s" } else { "" }, list(&absent)));
            }
            for (f, r) in files.iter().zip(&reads) {
                let (i, n) = r.header.shard;
                if n > 0 && i < n {
                    let want = total.saturating_sub(i).div_ceil(n);
                    if (r.rows.len() as u64) < want {
                        msg.push_str(&format!(
                            "; {f} (shard {i}/{n}) has {} of its {want} rows: rerun that shard to finish it",
                            r.rows.len()
                        ));
                    }
                }
            }
        }
        return Err(SweepError::new(msg));
    }
    let header = Header { shard: (0, 1), ..first.header.clone() };
    let mut text = header.render(Format::Jsonl, &[]);
    text = match first.format {
        // Keep the CSV column line exactly as the shards have it, after a whole-sweep header.
        Format::Csv => {
            let rest = first.header_text.split_once('\n').map(|(_, rest)| rest).unwrap_or("");
            format!("{}{rest}", header.render(Format::Csv, &[]).lines().next().map(|l| format!("{l}\n")).unwrap_or_default())
        }
        Format::Jsonl => text,
    };
    rows.values().for_each(|(l, _)| text.push_str(l));
    write_atomic(out, text.as_bytes())?;
    Ok(MergeSummary { out: out.to_string(), files: files.len(), points: total })
}
