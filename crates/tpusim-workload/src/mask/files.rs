//! Mask files: kept blocks of a tiling ([`BlockSparse`]) or kept kv ranges per q range
//! ([`RangeSparse`]). Both are JSON objects; [`read_mask_file`] picks the format by its keys
//! (`blocks` or `rows`). See `crates/tpusim-workload/MASK_FILES.md` for examples.

use super::{Mask, MaskError};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A block-sparse mask read from a file: kept tiles of a (block_q x block_kv) tiling.
///
/// File format (JSON):
/// ```json
/// { "q_len": 4096, "kv_len": 4096, "block_q": 512, "block_kv": 512,
///   "blocks": [[0, 0], [1, 0], [1, 1]] }
/// ```
/// `blocks` lists `[q_block, kv_block]` index pairs whose every pair is kept; all other tiles are
/// dropped. `q_len` and `kv_len` must equal the workload's lengths.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlockSparse {
    /// Query length the file was made for.
    pub q_len: u64,
    /// Key/value length the file was made for.
    pub kv_len: u64,
    /// Rows per block.
    pub block_q: u64,
    /// Columns per block.
    pub block_kv: u64,
    /// Kept blocks as `[q_block, kv_block]`.
    pub blocks: Vec<[u64; 2]>,
    /// Path the mask was read from (not in the file).
    #[serde(skip)]
    pub path: String,
    /// Kept kv block indices per q block, sorted (derived).
    #[serde(skip)]
    pub rows: Vec<Vec<u64>>,
}

fn file_err(path: &str, message: String) -> MaskError {
    MaskError::File { path: path.to_string(), message }
}

fn read_text(path: &str) -> Result<String, MaskError> {
    tpusim_io::read_text(path).map_err(|e| file_err(path, format!("cannot read: {e}")))
}

fn parse_json(text: &str, path: &str) -> Result<Value, MaskError> {
    serde_json::from_str(text).map_err(|e| file_err(path, format!("malformed JSON: {e}")))
}

fn check_len(path: &str, name: &str, v: u64) -> Result<(), MaskError> {
    if v == 0 || v > crate::MAX_DIM {
        return Err(file_err(path, format!("field '{name}' = {v}: expected a whole number from 1 to {}", crate::MAX_DIM)));
    }
    Ok(())
}

impl BlockSparse {
    /// Reads and checks a block-sparse mask file.
    ///
    /// # Errors
    /// [`MaskError::File`] naming the field for unreadable files, malformed JSON, zero sizes and
    /// block indices outside the grid.
    pub fn read(path: &str) -> Result<Self, MaskError> {
        Self::from_json(&read_text(path)?, path)
    }

    /// Parses and checks the block format from JSON text; `path` names the source in errors
    /// and in the mask's `file:PATH` form.
    ///
    /// # Errors
    /// As [`BlockSparse::read`].
    pub fn from_json(text: &str, path: &str) -> Result<Self, MaskError> {
        Self::from_value(parse_json(text, path)?, path)
    }

    fn from_value(v: Value, path: &str) -> Result<Self, MaskError> {
        // Errors name the file's keys (never backticked: they are not job fields here), the value
        // and the rule in words.
        let b: BlockSparse = serde_path_to_error::deserialize(v).map_err(|e| {
            let p = e.path().to_string();
            let p = if p == "." { String::new() } else { p };
            file_err(path, format!("block format (keys q_len, kv_len, block_q, block_kv, blocks): {}", tpusim_io::plain_error(&p, &e.inner().to_string())))
        })?;
        b.finish(path)
    }

    /// Checks sizes and block indices and derives the per-row index (`rows`), setting `path`.
    ///
    /// # Errors
    /// [`MaskError::File`] naming the field.
    pub fn finish(mut self, path: &str) -> Result<Self, MaskError> {
        self.path = path.to_string();
        for (name, v) in [("q_len", self.q_len), ("kv_len", self.kv_len), ("block_q", self.block_q), ("block_kv", self.block_kv)] {
            check_len(path, name, v)?;
        }
        let nq = self.q_len.div_ceil(self.block_q);
        let nk = self.kv_len.div_ceil(self.block_kv);
        let mut rows = vec![Vec::new(); nq as usize];
        for (i, [qi, kj]) in self.blocks.iter().enumerate() {
            if *qi >= nq || *kj >= nk {
                return Err(file_err(
                    path,
                    format!(
                        "field 'blocks'[{i}] = [{qi}, {kj}]: outside the {nq} x {nk} block grid of q_len {} / block_q {} and kv_len {} / block_kv {}",
                        self.q_len, self.block_q, self.kv_len, self.block_kv
                    ),
                ));
            }
            rows[*qi as usize].push(*kj);
        }
        for r in &mut rows {
            r.sort_unstable();
            r.dedup();
        }
        self.rows = rows;
        Ok(self)
    }
}

/// One entry of a range file: query rows `q = [q0, q1)` keep kv positions in each `kv`
/// range `[k0, k1)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RangeRow {
    /// Half-open query range `[q0, q1)`, `q0 < q1 <= q_len`.
    pub q: [u64; 2],
    /// Half-open kept kv ranges `[k0, k1)`, each `k0 < k1 <= kv_len`; may be empty, overlap
    /// or come in any order.
    pub kv: Vec<[u64; 2]>,
}

/// One elementary q segment `[start, end)` with its merged kept kv intervals (derived).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Segment {
    start: u64,
    end: u64,
    kv: Vec<(u64, u64)>,
}

/// A mask read from a range file: kept kv index ranges per query row range.
///
/// File format (JSON, half-open ranges):
/// ```json
/// { "q_len": 1000, "kv_len": 1000,
///   "rows": [ { "q": [0, 500], "kv": [[0, 600]] },
///             { "q": [500, 1000], "kv": [[0, 64], [400, 1000]] } ] }
/// ```
/// Rows not covered by any entry keep nothing; entries whose q ranges overlap are unioned.
/// `q_len` and `kv_len` must equal the workload's lengths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeSparse {
    /// Query length the file was made for.
    pub q_len: u64,
    /// Key/value length the file was made for.
    pub kv_len: u64,
    /// Entries as listed in the file.
    pub rows: Vec<RangeRow>,
    /// Path the mask was read from (not in the file).
    pub path: String,
    /// Disjoint q segments in increasing order (derived).
    segments: Vec<Segment>,
}

fn pair_text(v: &Value) -> String {
    match v.as_array().map(|a| a.as_slice()) {
        Some([a, b]) => format!("[{a}, {b}]"),
        _ => v.to_string(),
    }
}

fn as_pair(v: &Value) -> Option<[u64; 2]> {
    match v.as_array()?.as_slice() {
        [a, b] => Some([a.as_u64()?, b.as_u64()?]),
        _ => None,
    }
}

impl RangeSparse {
    /// Reads and checks a range-format mask file.
    ///
    /// # Errors
    /// [`MaskError::File`] naming the field and index (e.g. `rows[3].kv[1] = [10, 5]: expected
    /// k0 < k1 <= kv_len (64)`) for unreadable files, malformed JSON, missing or unknown
    /// fields, zero sizes and ranges outside the lengths.
    pub fn read(path: &str) -> Result<Self, MaskError> {
        Self::from_json(&read_text(path)?, path)
    }

    /// Parses and checks the range format from JSON text; `path` names the source.
    ///
    /// # Errors
    /// As [`RangeSparse::read`].
    pub fn from_json(text: &str, path: &str) -> Result<Self, MaskError> {
        Self::from_value(&parse_json(text, path)?, path)
    }

    fn from_value(v: &Value, path: &str) -> Result<Self, MaskError> {
        let err = |m: String| file_err(path, m);
        let obj = v.as_object().ok_or_else(|| err(format!("expected a JSON object, got {}", kind_of(v))))?;
        for key in obj.keys() {
            if !["q_len", "kv_len", "rows"].contains(&key.as_str()) {
                return Err(err(format!("unknown field '{key}': the range format has q_len, kv_len, rows")));
            }
        }
        let len = |name: &str| -> Result<u64, MaskError> {
            let f = obj.get(name).ok_or_else(|| err(format!("missing field '{name}'")))?;
            let n = f.as_u64().ok_or_else(|| err(format!("field '{name}' = {f}: expected a whole number from 1 to {}", crate::MAX_DIM)))?;
            check_len(path, name, n)?;
            Ok(n)
        };
        let q_len = len("q_len")?;
        let kv_len = len("kv_len")?;
        let rows_v = obj.get("rows").ok_or_else(|| err("missing field 'rows'".into()))?;
        let rows_a = rows_v.as_array().ok_or_else(|| {
            err(format!("field 'rows' = {}: expected an array of {{\"q\": [q0, q1], \"kv\": [[k0, k1], ...]}}", kind_of(rows_v)))
        })?;
        let mut rows = Vec::with_capacity(rows_a.len());
        for (i, r) in rows_a.iter().enumerate() {
            let ro = r
                .as_object()
                .ok_or_else(|| err(format!("rows[{i}] = {r}: expected an object {{\"q\": [q0, q1], \"kv\": [[k0, k1], ...]}}")))?;
            for key in ro.keys() {
                if key != "q" && key != "kv" {
                    return Err(err(format!("rows[{i}]: unknown field '{key}': a row has q and kv")));
                }
            }
            let qv = ro.get("q").ok_or_else(|| err(format!("rows[{i}]: missing field 'q'")))?;
            let kvv = ro.get("kv").ok_or_else(|| err(format!("rows[{i}]: missing field 'kv'")))?;
            let q = as_pair(qv)
                .filter(|[a, b]| a < b && *b <= q_len)
                .ok_or_else(|| err(format!("rows[{i}].q = {}: expected [q0, q1] with q0 < q1 <= q_len ({q_len})", pair_text(qv))))?;
            let kva = kvv.as_array().ok_or_else(|| err(format!("rows[{i}].kv = {kvv}: expected an array of [k0, k1] ranges")))?;
            let mut kv = Vec::with_capacity(kva.len());
            for (j, p) in kva.iter().enumerate() {
                let pr = as_pair(p)
                    .filter(|[a, b]| a < b && *b <= kv_len)
                    .ok_or_else(|| err(format!("rows[{i}].kv[{j}] = {}: expected k0 < k1 <= kv_len ({kv_len})", pair_text(p))))?;
                kv.push(pr);
            }
            rows.push(RangeRow { q, kv });
        }
        Self::new(q_len, kv_len, rows, path)
    }

    /// Builds a range mask from entries, checking them as [`RangeSparse::read`] does, and
    /// derives disjoint q segments (overlapping entries are unioned).
    ///
    /// Cost: O(entries x segments they cover + kv ranges log kv ranges).
    ///
    /// # Errors
    /// [`MaskError::File`] naming the field and index.
    pub fn new(q_len: u64, kv_len: u64, rows: Vec<RangeRow>, path: &str) -> Result<Self, MaskError> {
        check_len(path, "q_len", q_len)?;
        check_len(path, "kv_len", kv_len)?;
        let mut cuts = Vec::with_capacity(2 * rows.len());
        for (i, r) in rows.iter().enumerate() {
            let [q0, q1] = r.q;
            if q0 >= q1 || q1 > q_len {
                return Err(file_err(path, format!("rows[{i}].q = [{q0}, {q1}]: expected [q0, q1] with q0 < q1 <= q_len ({q_len})")));
            }
            for (j, &[k0, k1]) in r.kv.iter().enumerate() {
                if k0 >= k1 || k1 > kv_len {
                    return Err(file_err(path, format!("rows[{i}].kv[{j}] = [{k0}, {k1}]: expected k0 < k1 <= kv_len ({kv_len})")));
                }
            }
            cuts.push(q0);
            cuts.push(q1);
        }
        cuts.sort_unstable();
        cuts.dedup();
        let mut segments: Vec<Segment> = cuts.windows(2).map(|w| Segment { start: w[0], end: w[1], kv: Vec::new() }).collect();
        let mut covered = vec![false; segments.len()];
        for r in &rows {
            let a = cuts.partition_point(|&c| c < r.q[0]);
            let b = cuts.partition_point(|&c| c < r.q[1]);
            for s in a..b {
                covered[s] = true;
                segments[s].kv.extend(r.kv.iter().map(|&[k0, k1]| (k0, k1)));
            }
        }
        let mut kept = Vec::with_capacity(segments.len());
        for (s, c) in segments.into_iter().zip(covered) {
            if c {
                kept.push(Segment { kv: merge(s.kv), ..s });
            }
        }
        Ok(RangeSparse { q_len, kv_len, rows, path: path.to_string(), segments: kept })
    }

    fn segment(&self, q: u64) -> Option<usize> {
        let i = self.segments.partition_point(|s| s.end <= q);
        (i < self.segments.len() && self.segments[i].start <= q).then_some(i)
    }

    /// Kept kv intervals of row `q` (sorted, disjoint, maximal, clipped to `kv_len`) into `out`.
    pub fn row_intervals(&self, q: u64, kv_len: u64, out: &mut Vec<(u64, u64)>) {
        out.clear();
        if let Some(i) = self.segment(q) {
            for &(lo, hi) in &self.segments[i].kv {
                if lo >= kv_len {
                    break;
                }
                out.push((lo, hi.min(kv_len)));
            }
        }
    }

    /// Index of the q segment holding `q` (rows with equal keys keep the same intervals).
    pub(crate) fn row_key(&self, q: u64) -> u64 {
        self.segment(q).map_or(u64::MAX, |i| i as u64)
    }
}

/// Sorts and merges overlapping or touching intervals.
pub(crate) fn merge(mut v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    merge_in_place(&mut v);
    v
}

/// Sorts `v` and merges overlapping or touching intervals in place.
pub(crate) fn merge_in_place(v: &mut Vec<(u64, u64)>) {
    v.sort_unstable();
    let mut w = 0;
    for i in 0..v.len() {
        let (lo, hi) = v[i];
        if w > 0 && lo <= v[w - 1].1 {
            v[w - 1].1 = v[w - 1].1.max(hi);
        } else {
            v[w] = (lo, hi);
            w += 1;
        }
    }
    v.truncate(w);
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Parses a mask file's JSON text, picking the format by its keys: `blocks` (block format,
/// [`BlockSparse`]) or `rows` (range format, [`RangeSparse`]).
///
/// # Errors
/// [`MaskError::File`] for malformed JSON, an object with neither or both keys, and the
/// formats' own errors.
pub fn mask_from_json(text: &str, path: &str) -> Result<Mask, MaskError> {
    let v = parse_json(text, path)?;
    let obj = v.as_object().ok_or_else(|| {
        file_err(path, format!("expected a JSON object with 'blocks' (block format) or 'rows' (range format), got {}", kind_of(&v)))
    })?;
    match (obj.contains_key("blocks"), obj.contains_key("rows")) {
        (true, false) => Ok(Mask::Blocks(Box::new(BlockSparse::from_value(v, path)?))),
        (false, true) => Ok(Mask::Ranges(Box::new(RangeSparse::from_value(&v, path)?))),
        (true, true) => Err(file_err(path, "has both 'blocks' and 'rows': a file is either block format or range format".into())),
        (false, false) => Err(file_err(
            path,
            "missing field 'blocks' (block format: q_len, kv_len, block_q, block_kv, blocks) or 'rows' (range format: q_len, kv_len, rows)"
                .into(),
        )),
    }
}

/// Reads a mask file (`file:PATH`): a `.npy` / `.npz` file by its extension
/// ([`super::npy::read_numpy_mask`]: a dense boolean mask or a block map), any other file as JSON,
/// picking the format by its keys (see [`mask_from_json`]).
///
/// # Errors
/// [`MaskError::File`] naming the path and the field.
pub fn read_mask_file(path: &str) -> Result<Mask, MaskError> {
    let read = || {
        if super::npy::is_numpy_path(path) {
            return super::npy::read_numpy_mask(path);
        }
        mask_from_json(&read_text(path)?, path)
    };
    read().map_err(|e| match e {
        // `file:a.json+causal` reads `a.json+causal` as the path: say how to join a file.
        MaskError::File { path, message } if !std::path::Path::new(&path).exists() && path.contains(['+', '&', ')']) => MaskError::File {
            message: format!("{message} (a `file:` term takes the rest of the mask text as its path: put it last, or in ( ), e.g. causal+(file:a.json))"),
            path,
        },
        e => e,
    })
}
