//! Attention masks as values: which (q, kv) position pairs are kept.
//!
//! A mask is never materialised as N x N. Each kind answers one question: for query position
//! `q`, which kv positions are kept, as sorted disjoint half-open intervals
//! ([`Mask::row_intervals`]). Tile classification ([`crate::tiles`]) builds on that.
//!
//! # Grammar of `--mask`
//!
//! ```text
//! mask  := union
//! union := inter ('+' inter)*          union of kept pairs
//! inter := atom ('&' atom)*            intersection of kept pairs
//! atom  := 'full' | 'causal' | 'local:' L ',' R | 'band:' W | 'sink:' S | 'chunked:' C
//!        | '(' union ')' | 'file:' PATH     (PATH runs to the end of the text)
//! ```
//!
//! * `full`: every pair.
//! * `causal`: k <= q.
//! * `local:L,R`: q - L <= k <= q + R (sliding window; `local:L,0` is causal local attention).
//! * `band:W`: |q - k| <= W.
//! * `sink:S`: k < S (attention-sink columns).
//! * `chunked:C`: chunked causal: k <= q and k / C == q / C.
//! * `file:PATH`: block-sparse mask read from a JSON file (see [`crate::mask::BlockSparse`]).
//!
//! Example: `band:15000+sink:3600` is the video-diffusion case's reconstructed mask.

use serde::{Deserialize, Serialize};
use std::fmt;

/// An error in a mask: what was wrong and what is allowed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MaskError {
    /// The text does not follow the grammar.
    #[error("mask '{text}': {message}; allowed: full, causal, local:L,R, band:W, sink:S, chunked:C, file:PATH, joined with + (union) and & (intersection), grouped with ( )")]
    Syntax {
        /// The whole mask text.
        text: String,
        /// What is wrong and where.
        message: String,
    },
    /// A number in the mask is out of range.
    #[error("mask '{text}': {message}")]
    Value {
        /// The mask or field.
        text: String,
        /// What is wrong.
        message: String,
    },
    /// A mask file could not be read or has the wrong shape.
    #[error("mask file {path}: {message}")]
    File {
        /// File path.
        path: String,
        /// What is wrong, naming the field.
        message: String,
    },
}

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

impl BlockSparse {
    /// Reads and checks a block-sparse mask file.
    ///
    /// # Errors
    /// [`MaskError::File`] naming the field for unreadable files, malformed JSON, zero sizes and
    /// block indices outside the grid.
    pub fn read(path: &str) -> Result<Self, MaskError> {
        let err = |m: String| MaskError::File { path: path.to_string(), message: m };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        let mut b: BlockSparse = serde_json::from_str(&text).map_err(|e| err(e.to_string()))?;
        b.path = path.to_string();
        for (name, v) in [("q_len", b.q_len), ("kv_len", b.kv_len), ("block_q", b.block_q), ("block_kv", b.block_kv)] {
            if v == 0 || v > crate::MAX_DIM {
                return Err(err(format!("field '{name}' = {v}: expected a whole number from 1 to {}", crate::MAX_DIM)));
            }
        }
        let nq = b.q_len.div_ceil(b.block_q);
        let nk = b.kv_len.div_ceil(b.block_kv);
        let mut rows = vec![Vec::new(); nq as usize];
        for (i, [qi, kj]) in b.blocks.iter().enumerate() {
            if *qi >= nq || *kj >= nk {
                return Err(err(format!(
                    "field 'blocks'[{i}] = [{qi}, {kj}]: outside the {nq} x {nk} block grid of q_len {} / block_q {} and kv_len {} / block_kv {}",
                    b.q_len, b.block_q, b.kv_len, b.block_kv
                )));
            }
            rows[*qi as usize].push(*kj);
        }
        for r in &mut rows {
            r.sort_unstable();
            r.dedup();
        }
        b.rows = rows;
        Ok(b)
    }
}

/// Which (q, kv) pairs attention keeps. See the module docs for the grammar and semantics.
#[derive(Debug, Clone, PartialEq)]
pub enum Mask {
    /// Every pair.
    Full,
    /// k <= q.
    Causal,
    /// q - left <= k <= q + right.
    Local {
        /// Tokens to the left (past).
        left: u64,
        /// Tokens to the right (future).
        right: u64,
    },
    /// |q - k| <= width.
    Band {
        /// Half-width in tokens.
        width: u64,
    },
    /// k < tokens.
    Sink {
        /// Number of sink columns.
        tokens: u64,
    },
    /// k <= q and both in the same chunk of `size` tokens.
    Chunked {
        /// Chunk length in tokens.
        size: u64,
    },
    /// Pairs kept by any part.
    Union(Vec<Mask>),
    /// Pairs kept by every part.
    Intersect(Vec<Mask>),
    /// One mask per q head (or per kv head group), in head order.
    PerHead(Vec<Mask>),
    /// Kept tiles read from a file.
    Blocks(Box<BlockSparse>),
}

/// Serialises a value through its `Display` form (used for masks in JSON output).
pub fn serialize_display<T: fmt::Display, S: serde::Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&v.to_string())
}

impl fmt::Display for Mask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mask::Full => write!(f, "full"),
            Mask::Causal => write!(f, "causal"),
            Mask::Local { left, right } => write!(f, "local:{left},{right}"),
            Mask::Band { width } => write!(f, "band:{width}"),
            Mask::Sink { tokens } => write!(f, "sink:{tokens}"),
            Mask::Chunked { size } => write!(f, "chunked:{size}"),
            Mask::Union(parts) => join(f, parts, "+", false),
            Mask::Intersect(parts) => join(f, parts, "&", true),
            Mask::PerHead(parts) => {
                write!(f, "per-head[")?;
                for (i, p) in parts.iter().enumerate() {
                    if i > 0 {
                        write!(f, ";")?;
                    }
                    write!(f, "{p}")?;
                }
                write!(f, "]")
            }
            Mask::Blocks(b) => write!(f, "file:{}", b.path),
        }
    }
}

fn join(f: &mut fmt::Formatter<'_>, parts: &[Mask], sep: &str, paren_unions: bool) -> fmt::Result {
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            write!(f, "{sep}")?;
        }
        if paren_unions && matches!(p, Mask::Union(_)) {
            write!(f, "({p})")?;
        } else {
            write!(f, "{p}")?;
        }
    }
    Ok(())
}

impl Mask {
    /// Parses the `--mask` grammar (module docs).
    ///
    /// # Errors
    /// [`MaskError::Syntax`] for unknown words or malformed numbers, [`MaskError::Value`] for
    /// negative or zero sizes, [`MaskError::File`] for unreadable mask files.
    pub fn parse(text: &str) -> Result<Mask, MaskError> {
        let mut p = Parser { text, pos: 0 };
        let m = p.union()?;
        p.skip_ws();
        if p.pos < text.len() {
            return Err(p.err(&format!("unexpected '{}' at position {}", &text[p.pos..], p.pos)));
        }
        m.validate()?;
        Ok(m)
    }

    /// Checks sizes (chunk sizes must be positive; nested per-head lists are not allowed).
    ///
    /// # Errors
    /// [`MaskError::Value`].
    pub fn validate(&self) -> Result<(), MaskError> {
        match self {
            Mask::Chunked { size: 0 } => {
                Err(MaskError::Value { text: self.to_string(), message: "chunk size must be at least 1".into() })
            }
            Mask::Union(p) | Mask::Intersect(p) => {
                for m in p {
                    if matches!(m, Mask::PerHead(_)) {
                        return Err(MaskError::Value {
                            text: self.to_string(),
                            message: "a per-head list cannot be combined with + or &".into(),
                        });
                    }
                    m.validate()?;
                }
                Ok(())
            }
            Mask::PerHead(p) => {
                if p.is_empty() {
                    return Err(MaskError::Value { text: self.to_string(), message: "a per-head list needs at least one mask".into() });
                }
                for m in p {
                    if matches!(m, Mask::PerHead(_)) {
                        return Err(MaskError::Value { text: self.to_string(), message: "per-head lists cannot nest".into() });
                    }
                    m.validate()?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Checks that a file mask was made for these lengths.
    ///
    /// # Errors
    /// [`MaskError::File`] naming `q_len` or `kv_len` when they differ from the workload's.
    pub fn check_lengths(&self, q_len: u64, kv_len: u64) -> Result<(), MaskError> {
        match self {
            Mask::Blocks(b) => {
                if b.q_len != q_len || b.kv_len != kv_len {
                    return Err(MaskError::File {
                        path: b.path.clone(),
                        message: format!(
                            "field 'q_len' x 'kv_len' = {} x {}: the workload is {} x {}; the file must match it",
                            b.q_len, b.kv_len, q_len, kv_len
                        ),
                    });
                }
                Ok(())
            }
            Mask::Union(p) | Mask::Intersect(p) | Mask::PerHead(p) => {
                p.iter().try_for_each(|m| m.check_lengths(q_len, kv_len))
            }
            _ => Ok(()),
        }
    }

    /// True when the mask keeps every pair.
    pub fn is_full(&self) -> bool {
        match self {
            Mask::Full => true,
            Mask::Union(p) => p.iter().any(|m| m.is_full()),
            Mask::Intersect(p) | Mask::PerHead(p) => p.iter().all(|m| m.is_full()),
            _ => false,
        }
    }

    /// Kept kv positions of query row `q`, as sorted, disjoint, non-empty half-open intervals
    /// within `[0, kv_len)`, written into `out` (cleared first). A per-head list answers with
    /// the union of its heads (callers resolve heads first with
    /// [`crate::AttentionCall::mask_for_head`]).
    pub fn row_intervals(&self, q: u64, kv_len: u64, out: &mut Vec<(u64, u64)>) {
        out.clear();
        let push = |out: &mut Vec<(u64, u64)>, lo: u64, hi: u64| {
            let hi = hi.min(kv_len);
            if lo < hi {
                out.push((lo, hi));
            }
        };
        match self {
            Mask::Full => push(out, 0, kv_len),
            Mask::Causal => push(out, 0, q.saturating_add(1)),
            Mask::Local { left, right } => push(out, q.saturating_sub(*left), q.saturating_add(*right).saturating_add(1)),
            Mask::Band { width } => push(out, q.saturating_sub(*width), q.saturating_add(*width).saturating_add(1)),
            Mask::Sink { tokens } => push(out, 0, *tokens),
            Mask::Chunked { size } => push(out, q / size * size, q.saturating_add(1)),
            Mask::Blocks(b) => {
                let qi = q / b.block_q;
                if let Some(row) = b.rows.get(qi as usize) {
                    for &kj in row {
                        let lo = kj * b.block_kv;
                        let hi = lo + b.block_kv;
                        match out.last_mut() {
                            Some(last) if last.1 == lo => last.1 = hi.min(kv_len),
                            _ => push(out, lo, hi),
                        }
                    }
                }
            }
            Mask::Union(parts) | Mask::PerHead(parts) => {
                let mut tmp = Vec::new();
                for p in parts {
                    p.row_intervals(q, kv_len, &mut tmp);
                    out.extend_from_slice(&tmp);
                }
                out.sort_unstable();
                let mut merged: Vec<(u64, u64)> = Vec::with_capacity(out.len());
                for &(lo, hi) in out.iter() {
                    match merged.last_mut() {
                        Some(last) if lo <= last.1 => last.1 = last.1.max(hi),
                        _ => merged.push((lo, hi)),
                    }
                }
                *out = merged;
            }
            Mask::Intersect(parts) => {
                let mut acc: Vec<(u64, u64)> = vec![(0, kv_len)];
                let mut tmp = Vec::new();
                for p in parts {
                    p.row_intervals(q, kv_len, &mut tmp);
                    acc = intersect(&acc, &tmp);
                    if acc.is_empty() {
                        break;
                    }
                }
                *out = acc;
            }
        }
    }

    /// Number of primitive comparisons the mask expression evaluates per element and number of
    /// boolean combinations (`+`, `&`), used by kernel lowering to cost a computed mask.
    /// Returns (compares, combines, needs_abs) summed over the tree; `full` costs nothing.
    pub fn expression_terms(&self) -> MaskTerms {
        match self {
            Mask::Full => MaskTerms::default(),
            Mask::Causal | Mask::Sink { .. } => MaskTerms { compares: 1, ..Default::default() },
            Mask::Local { .. } => MaskTerms { compares: 2, combines: 1, ..Default::default() },
            Mask::Band { .. } => MaskTerms { compares: 1, arith: 2, ..Default::default() },
            Mask::Chunked { .. } => MaskTerms { compares: 2, combines: 1, arith: 2, ..Default::default() },
            Mask::Blocks(_) => MaskTerms { loaded_only: true, ..Default::default() },
            Mask::Union(p) | Mask::Intersect(p) | Mask::PerHead(p) => {
                let mut t = MaskTerms::default();
                for m in p {
                    let s = m.expression_terms();
                    t.compares += s.compares;
                    t.combines += s.combines;
                    t.arith += s.arith;
                    t.loaded_only |= s.loaded_only;
                }
                t.combines += p.len().saturating_sub(1) as u32;
                t
            }
        }
    }
}

/// What evaluating a mask expression element-wise takes, counted per element.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MaskTerms {
    /// Comparisons of a position (or position difference) against a constant or another position.
    pub compares: u32,
    /// Boolean and/or of comparison results.
    pub combines: u32,
    /// Arithmetic on positions (differences, absolute values, divisions by a chunk size).
    pub arith: u32,
    /// The mask has no closed form and can only be loaded (a file of kept blocks).
    pub loaded_only: bool,
}

fn intersect(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::new();
    while i < a.len() && j < b.len() {
        let lo = a[i].0.max(b[j].0);
        let hi = a[i].1.min(b[j].1);
        if lo < hi {
            out.push((lo, hi));
        }
        if a[i].1 < b[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

struct Parser<'a> {
    text: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn err(&self, message: &str) -> MaskError {
        MaskError::Syntax { text: self.text.to_string(), message: message.to_string() }
    }
    fn skip_ws(&mut self) {
        while self.text[self.pos..].starts_with(' ') {
            self.pos += 1;
        }
    }
    fn eat(&mut self, c: char) -> bool {
        self.skip_ws();
        if self.text[self.pos..].starts_with(c) {
            self.pos += c.len_utf8();
            true
        } else {
            false
        }
    }
    fn union(&mut self) -> Result<Mask, MaskError> {
        let mut parts = vec![self.inter()?];
        while self.eat('+') {
            parts.push(self.inter()?);
        }
        Ok(if parts.len() == 1 { parts.pop().expect("one part") } else { Mask::Union(parts) })
    }
    fn inter(&mut self) -> Result<Mask, MaskError> {
        let mut parts = vec![self.atom()?];
        while self.eat('&') {
            parts.push(self.atom()?);
        }
        Ok(if parts.len() == 1 { parts.pop().expect("one part") } else { Mask::Intersect(parts) })
    }
    fn number(&self, word: &str, s: &str) -> Result<u64, MaskError> {
        let s = s.trim();
        if s.starts_with('-') {
            return Err(MaskError::Value {
                text: self.text.to_string(),
                message: format!("'{word}' takes non-negative token counts, got {s}"),
            });
        }
        s.parse::<u64>()
            .ok()
            .filter(|v| *v <= crate::MAX_DIM)
            .ok_or_else(|| self.err(&format!("'{word}' expects a whole number of tokens (0 to {}), got '{s}'", crate::MAX_DIM)))
    }
    fn atom(&mut self) -> Result<Mask, MaskError> {
        self.skip_ws();
        if self.eat('(') {
            let m = self.union()?;
            if !self.eat(')') {
                return Err(self.err(&format!("missing ')' at position {}", self.pos)));
            }
            return Ok(m);
        }
        let rest = &self.text[self.pos..];
        if let Some(path) = rest.strip_prefix("file:") {
            self.pos = self.text.len();
            let path = path.trim();
            if path.is_empty() {
                return Err(self.err("'file:' needs a path"));
            }
            return Ok(Mask::Blocks(Box::new(BlockSparse::read(path)?)));
        }
        let end = rest.find(['+', '&', ')', '(']).unwrap_or(rest.len());
        let tok = rest[..end].trim();
        self.pos += end;
        let (word, arg) = match tok.split_once(':') {
            Some((w, a)) => (w.trim(), Some(a)),
            None => (tok, None),
        };
        let need = |n: usize| -> Result<Vec<&str>, MaskError> {
            let a = arg.ok_or_else(|| self.err(&format!("'{word}' needs {n} argument(s) after ':'")))?;
            let v: Vec<&str> = a.split(',').collect();
            if v.len() != n {
                return Err(self.err(&format!("'{word}' takes {n} argument(s), got '{a}'")));
            }
            Ok(v)
        };
        let none = |m: Mask| -> Result<Mask, MaskError> {
            if arg.is_some() {
                return Err(self.err(&format!("'{word}' takes no arguments")));
            }
            Ok(m)
        };
        match word {
            "full" => none(Mask::Full),
            "causal" => none(Mask::Causal),
            "local" => {
                let a = need(2)?;
                Ok(Mask::Local { left: self.number(word, a[0])?, right: self.number(word, a[1])? })
            }
            "band" => Ok(Mask::Band { width: self.number(word, need(1)?[0])? }),
            "sink" => Ok(Mask::Sink { tokens: self.number(word, need(1)?[0])? }),
            "chunked" => {
                let size = self.number(word, need(1)?[0])?;
                if size == 0 {
                    return Err(MaskError::Value { text: self.text.to_string(), message: "'chunked' needs a chunk size of at least 1".into() });
                }
                Ok(Mask::Chunked { size })
            }
            "" => Err(self.err(&format!("expected a mask at position {}", self.pos))),
            other => Err(self.err(&format!("unknown mask word '{other}'"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(m: &Mask, q: u64, kv: u64) -> Vec<(u64, u64)> {
        let mut v = Vec::new();
        m.row_intervals(q, kv, &mut v);
        v
    }

    #[test]
    fn parse_round_trips() {
        for s in ["full", "causal", "local:128,0", "band:15000+sink:3600", "causal&band:5", "(causal+sink:4)&local:10,10"] {
            let m = Mask::parse(s).unwrap();
            assert_eq!(Mask::parse(&m.to_string()).unwrap(), m, "{s}");
        }
    }

    #[test]
    fn bad_masks_are_named() {
        let e = Mask::parse("band:-5").unwrap_err().to_string();
        assert!(e.contains("non-negative") && e.contains("band"), "{e}");
        let e = Mask::parse("diagonal").unwrap_err().to_string();
        assert!(e.contains("unknown mask word 'diagonal'") && e.contains("allowed"), "{e}");
        assert!(Mask::parse("local:5").is_err());
        assert!(Mask::parse("band:x").is_err());
        assert!(Mask::parse("causal:3").is_err());
        assert!(Mask::parse("chunked:0").is_err());
        assert!(Mask::parse("(causal").is_err());
        assert!(Mask::parse("").is_err());
        assert!(Mask::parse("causal+").is_err());
    }

    #[test]
    fn band_plus_sink_rows() {
        let m = Mask::parse("band:2+sink:3").unwrap();
        assert_eq!(rows(&m, 10, 20), vec![(0, 3), (8, 13)]);
        assert_eq!(rows(&m, 1, 20), vec![(0, 4)]);
        assert_eq!(rows(&m, 19, 20), vec![(0, 3), (17, 20)]);
    }

    #[test]
    fn intersection_rows() {
        let m = Mask::parse("causal&local:3,3").unwrap();
        assert_eq!(rows(&m, 10, 20), vec![(7, 11)]);
        let m = Mask::parse("chunked:4").unwrap();
        assert_eq!(rows(&m, 6, 20), vec![(4, 7)]);
    }
}
