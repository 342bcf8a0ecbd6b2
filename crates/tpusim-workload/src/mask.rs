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
//! atom  := 'full' | 'causal' [offset] | 'local:' L ',' R [offset] | 'band:' W | 'sink:' S
//!        | 'chunked:' C
//!        | 'video:' F ',' H ',' W ':' wf ',' wh ',' ww [order]
//!        | 'sta:' F ',' H ',' W ':' kf ',' kh ',' kw ':' tf ',' th ',' tw [order]
//!        | 'per-head[' item (';' item)* ']'
//!        | '(' union ')' | 'file:' PATH
//! order := '@frame' | '@position' | '@tiles:' tf ',' th ',' tw
//! offset := '@offset:' N               N may be negative: -2^32 to 2^32
//! item  := [N '*'] union               N copies of the mask (one per head)
//! ```
//!
//! All numbers are whole token counts from 0 to 2^32 (negative numbers are errors, except an
//! offset). Spaces around words and operators are ignored.
//!
//! ## 1-D masks
//!
//! * `full`: every pair.
//! * `causal`: k <= q, positions counted from the first token of both q and kv.
//! * `local:L,R`: q - L <= k <= q + R (sliding window; `local:L,0` is causal local attention).
//!   A side of 2^32 tokens (4294967296) is unbounded in practice.
//! * `band:W`: |q - k| <= W.
//! * `sink:S`: k < S (attention-sink columns).
//! * `chunked:C`: chunked causal: k <= q and k / C == q / C (C >= 1).
//!
//! Example: `band:15000+sink:3600` is the video-diffusion case's reconstructed mask.
//!
//! ### Offsets: q_len != kv_len
//!
//! `causal@offset:N` keeps k <= q + N and `local:L,R@offset:N` keeps
//! q + N - L <= k <= q + N + R: query row q sits at kv position q + N. These are Splash's
//! `CausalMask(shape, offset=N)` and `LocalMask(shape, (L, R), offset=N)` (jax-ml/jax
//! `jax/experimental/pallas/ops/tpu/splash_attention/splash_attention_mask.py`: `q_ids + offset
//! >= kv_ids`, `q_ids + offset - left <= kv_ids <= q_ids + offset + right`). For a query block
//! that continues a cache of P tokens (decode: q_len new tokens after kv_len - q_len cached
//! ones), N = P = kv_len - q_len: `--q-len 1 --kv-len 4096 --mask causal@offset:4095` keeps
//! all 4096 keys, where plain `causal` keeps one. A negative N drops the first |N| query rows'
//! keys entirely (rows with q + N < 0 keep nothing). Offset 0 is plain `causal` / `local`.
//!
//! ## 3-D video masks ([`VideoMask`])
//!
//! The sequence is a latent video of F frames x H rows x W columns (F x H x W must equal both
//! q_len and kv_len; [`Mask::check_lengths`] says so otherwise). Each token has coordinates
//! (f, h, w) given by the token order:
//!
//! * `@frame` (default for `video`): frame-major, token = (f x H + h) x W + w;
//! * `@position`: position-major (the temporal-head permutation), token = (h x W + w) x F + f;
//! * `@tiles:tf,th,tw`: tile by tile as in Sliding Tile Attention (STA): the volume is cut into
//!   tiles of tf x th x tw tokens (tf, th, tw must divide F, H, W), tiles ordered frame-major,
//!   tokens inside a tile frame-major.
//!
//! Windows:
//!
//! * `video:F,H,W:wf,wh,ww` keeps (q, k) when |fq - fk| <= wf, |hq - hk| <= wh and
//!   |wq - wk| <= ww (half-widths in frames, rows, columns; a half-width of at least the
//!   extent keeps the whole dimension).
//! * `sta:F,H,W:kf,kh,kw:tf,th,tw` is STA's tile window: the volume is cut into tiles of
//!   tf x th x tw tokens and each query tile attends a kernel of kf x kh x kw tiles (odd
//!   counts) centred on its own tile, shifted inward at the volume's borders (the kernel centre
//!   is clamped to [k/2, NT - 1 - k/2] tiles, as in the STA reference masks) so every query sees
//!   the same number of tiles. Default order: `@tiles` with the same tile sizes (STA's layout);
//!   another order may be given.
//!
//! Examples:
//!
//! * `video:21,45,80:4,45,80`: Wan 2.1 720p latent (21 x 45 x 80 = 75,600 tokens), each token
//!   sees +-4 frames, whole frames; frame-major.
//! * `video:21,45,80:4,45,80@position`: the same window after the temporal-head permutation.
//! * `video:30,48,80:18,24,24@tiles:6,8,8`: token window in STA's tiled layout.
//! * `sta:30,48,80:3,3,5:6,8,8`: STA with 6 x 8 x 8 tiles and a 3 x 3 x 5 tile kernel.
//!
//! ## Per-head masks
//!
//! `per-head[M1;M2;...]` lists one mask per q head or per kv head group, in head order
//! (resolved by [`crate::AttentionCall::mask_for_head`]; [`crate::AttentionCall::validate`]
//! checks the count). `N*M` repeats item `M` (a whole union expression) N times:
//! `per-head[4*band:100;6*causal]` is 4 heads of `band:100` then 6 of `causal`, and
//! `per-head[2*band:8+sink:4;causal]` is 2 heads of `band:8+sink:4` then one `causal`. A list
//! holds at most 65,536 masks; lists cannot nest or be combined with `+` / `&`. Display
//! prints runs of equal masks with the `N*` shorthand.
//!
//! ## Mask files
//!
//! `file:PATH` reads a JSON file (or a NumPy `.npy` / `.npz` file, by extension); the format
//! is picked by its keys (see `crates/tpusim-workload/MASK_FILES.md`). The path runs to the end
//! of the mask text or to a closing `)`, so a file combined with other masks goes last or in
//! parentheses: `causal+file:a.npy` or `(file:a.npy)+causal`, not `file:a.npy+causal` (that
//! names a file `a.npy+causal`).
//!
//! * block format ([`BlockSparse`]): kept tiles of a tiling,
//!   `{"q_len": 4096, "kv_len": 4096, "block_q": 512, "block_kv": 512, "blocks": [[0, 0], [1, 1]]}`;
//! * range format ([`RangeSparse`]): kept kv ranges per q range (half-open; rows not listed
//!   keep nothing; overlapping q ranges are unioned),
//!   `{"q_len": 1000, "kv_len": 1000, "rows": [{"q": [0, 500], "kv": [[0, 600]]}]}`.
//!
//! At the top level PATH runs to the end of the text (so `causal+file:a.json` works but
//! `file:a.json+causal` reads the path `a.json+causal`); inside `( )` or `per-head[ ]` it ends at
//! the first `)`, `;` or `]`, e.g. `(file:a.json)&causal` or `per-head[file:a.json;causal]`.
//! Display parenthesises file masks inside `+` / `&` so that its output parses back.

pub mod array;
pub mod files;
pub mod npy;
pub mod video;

pub use array::{ArrayMask, ArraySource, BlockMap, ByteSource, DenseArray};
pub use files::{mask_from_json, read_mask_file, BlockSparse, RangeRow, RangeSparse};
pub use video::{VideoDigits, VideoMask, VideoOrder, VideoWindow};

use std::fmt;

/// Largest number of masks a `per-head[...]` list may hold (after expanding `N*` repeats).
pub const MAX_PER_HEAD: usize = 65_536;

/// An error in a mask: what was wrong and what is allowed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MaskError {
    /// The text does not follow the grammar.
    #[error("mask '{text}': {message}; allowed: full, causal[@offset:N], local:L,R[@offset:N], band:W, sink:S, chunked:C, video:F,H,W:wf,wh,ww[@frame|@position|@tiles:tf,th,tw], sta:F,H,W:kf,kh,kw:tf,th,tw[@order], per-head[[N*]M;...], file:PATH, joined with + (union) and & (intersection), grouped with ( )")]
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

/// Which (q, kv) pairs attention keeps. See the module docs for the grammar and semantics.
#[derive(Debug, Clone, PartialEq)]
pub enum Mask {
    /// Every pair.
    Full,
    /// k <= q + offset (Splash's `CausalMask(offset=...)`; module docs).
    Causal {
        /// Kv position of query row 0 (kv_len - q_len for a block after a cache); may be negative.
        offset: i64,
    },
    /// q + offset - left <= k <= q + offset + right (Splash's `LocalMask`).
    Local {
        /// Tokens to the left (past).
        left: u64,
        /// Tokens to the right (future).
        right: u64,
        /// Kv position of query row 0; may be negative.
        offset: i64,
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
    /// Kept tiles read from a file (block format).
    Blocks(Box<BlockSparse>),
    /// Kept kv ranges per q range read from a file (range format).
    Ranges(Box<RangeSparse>),
    /// A window in a 3-D video volume under a token order.
    Video(VideoMask),
    /// A dense boolean array or a block map (`file:PATH.npy` / `.npz`, or an array handed over by
    /// a front end such as the Python package); see [`mod@array`].
    Array(ArrayMask),
    /// A mask file named by `file:PATH` whose contents have not been loaded yet: [`Mask::parse`]
    /// never reads files; the layer that reads the job calls [`Mask::load_files`]. Every other
    /// method treats an unloaded file as an error ([`Mask::validate`]) or as keeping nothing.
    File(String),
}

/// Serialises a value through its `Display` form (used for masks in JSON output).
pub fn serialize_display<T: fmt::Display, S: serde::Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&v.to_string())
}

impl fmt::Display for Mask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mask::Full => write!(f, "full"),
            Mask::Causal { offset } => write!(f, "causal{}", Offset(*offset)),
            Mask::Local { left, right, offset } => write!(f, "local:{left},{right}{}", Offset(*offset)),
            Mask::Band { width } => write!(f, "band:{width}"),
            Mask::Sink { tokens } => write!(f, "sink:{tokens}"),
            Mask::Chunked { size } => write!(f, "chunked:{size}"),
            Mask::Union(parts) => join(f, parts, "+", false),
            Mask::Intersect(parts) => join(f, parts, "&", true),
            Mask::PerHead(parts) => {
                write!(f, "per-head[")?;
                let mut i = 0;
                while i < parts.len() {
                    let run = parts[i..].iter().take_while(|m| **m == parts[i]).count();
                    if i > 0 {
                        write!(f, ";")?;
                    }
                    if run > 1 {
                        write!(f, "{run}*")?;
                    }
                    write!(f, "{}", parts[i])?;
                    i += run;
                }
                write!(f, "]")
            }
            Mask::Blocks(b) => write!(f, "file:{}", b.path),
            Mask::Ranges(r) => write!(f, "file:{}", r.path),
            Mask::Video(v) => write!(f, "{v}"),
            Mask::File(path) => write!(f, "file:{path}"),
            Mask::Array(a) => write!(f, "{a}"),
        }
    }
}

/// An offset as the grammar writes it: nothing for 0, else `@offset:N`.
struct Offset(i64);

impl fmt::Display for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 != 0 {
            write!(f, "@offset:{}", self.0)?;
        }
        Ok(())
    }
}

/// Writes `parts` joined by `sep`, parenthesising what would otherwise parse differently:
/// nested unions (and, inside an intersection, nested intersections) and file masks (whose
/// path would otherwise run to the end of the text).
fn join(f: &mut fmt::Formatter<'_>, parts: &[Mask], sep: &str, in_intersection: bool) -> fmt::Result {
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            write!(f, "{sep}")?;
        }
        let paren = match p {
            Mask::Union(_) | Mask::Blocks(_) | Mask::Ranges(_) | Mask::File(_) | Mask::Array(_) => true,
            Mask::Intersect(_) => in_intersection,
            _ => false,
        };
        if paren {
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
    /// Pure: `file:PATH` becomes [`Mask::File`] and is read by [`Mask::load_files`].
    ///
    /// # Errors
    /// [`MaskError::Syntax`] for unknown words or malformed numbers, [`MaskError::Value`] for
    /// negative or zero sizes and inconsistent video dimensions.
    pub fn parse(text: &str) -> Result<Mask, MaskError> {
        let mut p = Parser { text, pos: 0, depth: 0, atoms: 0 };
        let m = p.union()?;
        p.skip_ws();
        if p.pos < text.len() {
            return Err(p.err(&format!("unexpected '{}' at position {}", &text[p.pos..], p.pos)));
        }
        m.check(true)?;
        Ok(m)
    }

    /// Replaces every [`Mask::File`] by the mask `load` reads from its path (for the command line
    /// and traces: [`read_mask_file`]).
    ///
    /// # Errors
    /// The loader's error ([`MaskError::File`] naming the path and the field).
    pub fn load_files(self, load: &dyn Fn(&str) -> Result<Mask, MaskError>) -> Result<Mask, MaskError> {
        Ok(match self {
            Mask::File(path) => load(&path)?,
            Mask::Union(p) => Mask::Union(p.into_iter().map(|m| m.load_files(load)).collect::<Result<_, _>>()?),
            Mask::Intersect(p) => Mask::Intersect(p.into_iter().map(|m| m.load_files(load)).collect::<Result<_, _>>()?),
            Mask::PerHead(p) => Mask::PerHead(p.into_iter().map(|m| m.load_files(load)).collect::<Result<_, _>>()?),
            other => other,
        })
    }

    /// The same mask with every mask-file path replaced by `f(path)` (loaded or not); used to
    /// resolve paths written in a job file from that file's folder.
    pub fn map_files(self, f: &mut dyn FnMut(&str) -> String) -> Mask {
        match self {
            Mask::File(path) => Mask::File(f(&path)),
            Mask::Blocks(mut b) => {
                b.path = f(&b.path);
                Mask::Blocks(b)
            }
            Mask::Ranges(mut r) => {
                r.path = f(&r.path);
                Mask::Ranges(r)
            }
            Mask::Union(p) => Mask::Union(p.into_iter().map(|m| m.map_files(f)).collect()),
            Mask::Intersect(p) => Mask::Intersect(p.into_iter().map(|m| m.map_files(f)).collect()),
            Mask::PerHead(p) => Mask::PerHead(p.into_iter().map(|m| m.map_files(f)).collect()),
            other => other,
        }
    }

    /// The paths of the mask files this mask names (loaded or not).
    pub fn file_paths(&self) -> Vec<String> {
        match self {
            Mask::File(p) => vec![p.clone()],
            Mask::Blocks(b) => vec![b.path.clone()],
            Mask::Ranges(r) => vec![r.path.clone()],
            Mask::Array(a) => a.source.name().strip_prefix("file:").map(|p| vec![p.to_string()]).unwrap_or_default(),
            Mask::Union(p) | Mask::Intersect(p) | Mask::PerHead(p) => p.iter().flat_map(|m| m.file_paths()).collect(),
            _ => Vec::new(),
        }
    }

    /// Checks sizes (chunk sizes must be positive; video volumes, tiles and STA kernels as in
    /// [`VideoMask::check`]; per-head lists non-empty, at most [`MAX_PER_HEAD`] long, not
    /// nested and not combined with `+` / `&`).
    ///
    /// # Errors
    /// [`MaskError::Value`] naming the mask and the field.
    pub fn validate(&self) -> Result<(), MaskError> {
        self.check(false)
    }

    /// [`Mask::validate`], accepting unloaded files when `files_pending` (while parsing).
    fn check(&self, files_pending: bool) -> Result<(), MaskError> {
        match self {
            Mask::Chunked { size: 0 } => Err(MaskError::Value { text: self.to_string(), message: "chunk size must be at least 1".into() }),
            Mask::Video(v) => v.check().map_err(|message| MaskError::Value { text: self.to_string(), message }),
            Mask::File(_) if files_pending => Ok(()),
            Mask::File(path) => {
                Err(MaskError::File { path: path.clone(), message: "not loaded (Mask::load_files reads mask files)".into() })
            }
            Mask::Union(p) | Mask::Intersect(p) => {
                for m in p {
                    if let Mask::Array(a) = m {
                        if a.estimate_note().is_some() {
                            return Err(MaskError::Value {
                                text: self.to_string(),
                                message: "a block map without element masks ('partial_mask_blocks', 'mask_next') cannot be combined with + or &: its partial blocks' pairs are unknown".into(),
                            });
                        }
                    }
                    if matches!(m, Mask::PerHead(_)) {
                        return Err(MaskError::Value {
                            text: self.to_string(),
                            message: "a per-head list cannot be combined with + or &".into(),
                        });
                    }
                    m.check(files_pending)?;
                }
                Ok(())
            }
            Mask::PerHead(p) => {
                if p.is_empty() {
                    return Err(MaskError::Value { text: self.to_string(), message: "a per-head list needs at least one mask".into() });
                }
                if p.len() > MAX_PER_HEAD {
                    return Err(MaskError::Value {
                        text: format!("per-head[... {} masks]", p.len()),
                        message: format!("a per-head list holds at most {MAX_PER_HEAD} masks"),
                    });
                }
                for m in p {
                    if matches!(m, Mask::PerHead(_)) {
                        return Err(MaskError::Value { text: self.to_string(), message: "per-head lists cannot nest".into() });
                    }
                    m.check(files_pending)?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Checks that file masks were made for these lengths and that video volumes hold exactly
    /// this many tokens.
    ///
    /// # Errors
    /// [`MaskError::File`] naming `q_len` or `kv_len` when a file's lengths differ from the
    /// workload's; [`MaskError::Value`] naming the video mask, its F x H x W and both lengths
    /// when they differ.
    pub fn check_lengths(&self, q_len: u64, kv_len: u64) -> Result<(), MaskError> {
        let file_mismatch = |path: &str, fq: u64, fk: u64| {
            if fq != q_len || fk != kv_len {
                return Err(MaskError::File {
                    path: path.to_string(),
                    message: format!("field 'q_len' x 'kv_len' = {fq} x {fk}: the workload is {q_len} x {kv_len}; the file must match it"),
                });
            }
            Ok(())
        };
        match self {
            Mask::Blocks(b) => file_mismatch(&b.path, b.q_len, b.kv_len),
            Mask::Ranges(r) => file_mismatch(&r.path, r.q_len, r.kv_len),
            Mask::Array(a) => {
                let (fq, fk) = a.source.lengths();
                let path = a.source.name().trim_start_matches("file:");
                // A dense array smaller than the workload both ways is most likely a block map
                // given as an array: say where block maps go.
                file_mismatch(path, fq, fk).map_err(|e| match e {
                    MaskError::File { path, message } if fq < q_len && fk < kv_len => MaskError::File {
                        path,
                        message: format!(
                            "{message}; a dense array has one value per (q, kv) pair; if this is a block map (Splash's MaskInfo.block_mask: 0 empty, 1 partial, 2 full, one per tile), it goes in an .npz with 'block_mask', 'q_len', 'kv_len', 'block_q', 'block_kv' (crates/tpusim-workload/MASK_FILES.md)"
                        ),
                    },
                    e => e,
                })
            }
            Mask::Video(v) => {
                let n = v.tokens();
                if n != q_len || n != kv_len {
                    let [f, h, w] = v.dims;
                    return Err(MaskError::Value {
                        text: self.to_string(),
                        message: format!(
                            "the video volume F x H x W = {f} x {h} x {w} = {n} tokens must equal both lengths, but q_len = {q_len} and kv_len = {kv_len}"
                        ),
                    });
                }
                Ok(())
            }
            Mask::Union(p) | Mask::Intersect(p) | Mask::PerHead(p) => p.iter().try_for_each(|m| m.check_lengths(q_len, kv_len)),
            _ => Ok(()),
        }
    }

    /// Checks that every array mask in the expression can be classified exactly at a
    /// `block_q x block_kv` tiling ([`ArrayMask::check_tiling`]: a block map without element
    /// masks needs tiles made of its blocks).
    ///
    /// # Errors
    /// [`MaskError::File`] naming the map, its blocks and the tiling.
    pub fn check_tiling(&self, block_q: u64, block_kv: u64) -> Result<(), MaskError> {
        match self {
            Mask::Array(a) => a.check_tiling(block_q, block_kv),
            Mask::Union(p) | Mask::Intersect(p) | Mask::PerHead(p) => p.iter().try_for_each(|m| m.check_tiling(block_q, block_kv)),
            _ => Ok(()),
        }
    }

    /// Caveats about this mask's numbers (kept-pair counts that are estimates), for reports.
    pub fn notes(&self) -> Vec<String> {
        match self {
            Mask::Array(a) => a.estimate_note().into_iter().collect(),
            Mask::Union(p) | Mask::Intersect(p) | Mask::PerHead(p) => {
                let mut v: Vec<String> = p.iter().flat_map(|m| m.notes()).collect();
                v.dedup();
                v
            }
            _ => Vec::new(),
        }
    }

    /// True when the mask keeps every pair (a video mask whose window spans its whole volume
    /// counts as full: [`Mask::check_lengths`] ties the volume to the lengths).
    pub fn is_full(&self) -> bool {
        match self {
            Mask::Full => true,
            Mask::Video(v) => v.is_full(),
            Mask::Union(p) => p.iter().any(|m| m.is_full()),
            Mask::Intersect(p) | Mask::PerHead(p) => p.iter().all(|m| m.is_full()),
            _ => false,
        }
    }

    /// Kept kv positions of query row `q`, as sorted, disjoint, non-empty half-open intervals
    /// within `[0, kv_len)`, written into `out` (cleared first). Adjacent intervals are merged
    /// (the list is maximal). A per-head list answers with the union of its heads (callers
    /// resolve heads first with [`crate::AttentionCall::mask_for_head`]).
    ///
    /// Cost: O(intervals) for each kind (a video mask walks only its window's frames / rows /
    /// tiles), plus a sort for unions.
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
            Mask::Causal { offset } => push(out, 0, shifted(q, *offset, 1)),
            Mask::Local { left, right, offset } => {
                let at = q as i128 + *offset as i128;
                let lo = (at - *left as i128).clamp(0, kv_len as i128) as u64;
                push(out, lo, shifted(q, *offset, *right as i128 + 1))
            }
            Mask::Band { width } => push(out, q.saturating_sub(*width), q.saturating_add(*width).saturating_add(1)),
            Mask::Sink { tokens } => push(out, 0, *tokens),
            Mask::Chunked { size } => push(out, q / size * size, q.saturating_add(1)),
            Mask::Video(v) => v.row_intervals(q, kv_len, out),
            Mask::Ranges(r) => r.row_intervals(q, kv_len, out),
            Mask::Array(a) => a.row_intervals(q, kv_len, out),
            Mask::File(_) => {}
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
                files::merge_in_place(out);
            }
            Mask::Intersect(parts) => {
                if kv_len == 0 {
                    return;
                }
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

    /// True when rows can share work: every part's kept intervals depend on the row only
    /// through a short key ([`Mask::row_key`]) that many rows share (full, sink, video, file
    /// masks and their combinations). Causal, local, band and chunked rows are all distinct.
    pub(crate) fn has_row_classes(&self) -> bool {
        match self {
            Mask::Full | Mask::Sink { .. } | Mask::Video(_) | Mask::Blocks(_) | Mask::Ranges(_) | Mask::File(_) => true,
            Mask::Causal { .. } | Mask::Local { .. } | Mask::Band { .. } | Mask::Chunked { .. } | Mask::Array(_) => false,
            Mask::Union(p) | Mask::Intersect(p) | Mask::PerHead(p) => p.iter().all(|m| m.has_row_classes()),
        }
    }

    /// Appends row `q`'s key to `key`: rows with equal keys have equal
    /// [`Mask::row_intervals`]. Meaningful only when [`Mask::has_row_classes`] holds (rows of
    /// other kinds append `q` itself).
    pub(crate) fn row_key(&self, q: u64, key: &mut Vec<u64>) {
        match self {
            Mask::Full | Mask::Sink { .. } | Mask::File(_) => {}
            Mask::Causal { .. } | Mask::Local { .. } | Mask::Band { .. } | Mask::Chunked { .. } | Mask::Array(_) => key.push(q),
            Mask::Video(v) => v.row_key(q, key),
            Mask::Blocks(b) => key.push(q / b.block_q),
            Mask::Ranges(r) => key.push(r.row_key(q)),
            Mask::Union(p) | Mask::Intersect(p) | Mask::PerHead(p) => p.iter().for_each(|m| m.row_key(q, key)),
        }
    }

    /// Number of primitive comparisons the mask expression evaluates per element and number of
    /// boolean combinations (`+`, `&`), used by kernel lowering to cost a computed mask.
    /// Returns (compares, combines, needs_abs) summed over the tree; `full` costs nothing. Video
    /// masks count their coordinate arithmetic (see [`VideoMask::expression_terms`]); file masks
    /// are `loaded_only`.
    pub fn expression_terms(&self) -> MaskTerms {
        match self {
            Mask::Full => MaskTerms::default(),
            // An offset adds one addition to the row position (Splash skips it for offset 0).
            Mask::Causal { offset } => MaskTerms { compares: 1, arith: (*offset != 0) as u32, ..Default::default() },
            Mask::Sink { .. } => MaskTerms { compares: 1, ..Default::default() },
            Mask::Local { offset, .. } => MaskTerms { compares: 2, combines: 1, arith: (*offset != 0) as u32, ..Default::default() },
            Mask::Band { .. } => MaskTerms { compares: 1, arith: 2, ..Default::default() },
            Mask::Chunked { .. } => MaskTerms { compares: 2, combines: 1, arith: 2, ..Default::default() },
            Mask::Video(v) => v.expression_terms(),
            Mask::Blocks(_) | Mask::Ranges(_) | Mask::File(_) | Mask::Array(_) => MaskTerms { loaded_only: true, ..Default::default() },
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
    /// Arithmetic on positions (differences, absolute values, divisions by a chunk size,
    /// video coordinate extraction).
    pub arith: u32,
    /// The mask has no closed form and can only be loaded (a file of kept blocks or ranges).
    pub loaded_only: bool,
}

/// q + offset + plus as an interval end: clamped below at 0 (a row before the kv sequence keeps
/// nothing) and above at u64::MAX (callers clamp to kv_len).
fn shifted(q: u64, offset: i64, plus: i128) -> u64 {
    (q as i128 + offset as i128 + plus).clamp(0, u64::MAX as i128) as u64
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

/// The mask text as errors quote it: whole when short, else its start and its length.
fn shorten(text: &str) -> String {
    const KEEP: usize = 80;
    if text.chars().count() <= KEEP {
        return text.to_string();
    }
    let head: String = text.chars().take(KEEP).collect();
    format!("{head}... ({} characters)", text.chars().count())
}

/// Deepest nesting of `( )` and `per-head[ ]` the grammar accepts.
pub const MAX_MASK_DEPTH: usize = 64;
/// Most mask words (and groups) one expression may hold; per-head repeats `N*M` count once.
pub const MAX_MASK_TERMS: usize = 256;

struct Parser<'a> {
    text: &'a str,
    pos: usize,
    /// Nesting depth in `( )` and `per-head[ ]` (file paths end at `)`, `;`, `]` when > 0).
    depth: usize,
    /// Mask words parsed so far (bounded by [`MAX_MASK_TERMS`]).
    atoms: usize,
}

impl Parser<'_> {
    fn err(&self, message: &str) -> MaskError {
        MaskError::Syntax { text: shorten(self.text), message: message.to_string() }
    }
    fn value_err(&self, message: String) -> MaskError {
        MaskError::Value { text: shorten(self.text), message }
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
            return Err(self.value_err(format!("'{word}' takes non-negative token counts, got {s}")));
        }
        s.parse::<u64>()
            .ok()
            .filter(|v| *v <= crate::MAX_DIM)
            .ok_or_else(|| self.err(&format!("'{word}' expects a whole number of tokens (0 to {}), got '{s}'", crate::MAX_DIM)))
    }
    /// The `offset:N` modifier of `word` (after its `@`): a signed whole number of tokens with
    /// |N| <= 2^32.
    fn offset(&self, word: &str, m: &str) -> Result<i64, MaskError> {
        let Some(v) = m.strip_prefix("offset:") else {
            return Err(self.err(&format!(
                "unknown modifier '@{m}' of '{word}'; allowed: {word}@offset:N (N a whole number of tokens, may be negative)"
            )));
        };
        let v = v.trim();
        let max = crate::MAX_DIM as i64;
        v.parse::<i64>()
            .ok()
            .filter(|n| n.unsigned_abs() <= crate::MAX_DIM)
            .ok_or_else(|| self.err(&format!("'{word}@offset:{v}': the offset must be a whole number of tokens from -{max} to {max}")))
    }
    /// Three comma-separated numbers named `names` (e.g. frames F, height H, width W).
    fn triple(&self, word: &str, what: &str, names: [&str; 3], s: &str) -> Result<[u64; 3], MaskError> {
        let v: Vec<&str> = s.split(',').collect();
        if v.len() != 3 {
            return Err(self.err(&format!("'{word}' {what} needs 3 numbers {},{},{}, got '{s}'", names[0], names[1], names[2])));
        }
        let mut out = [0; 3];
        for i in 0..3 {
            let t = v[i].trim();
            if t.starts_with('-') {
                return Err(self.value_err(format!("'{word}' {what} {} = {t}: expected a non-negative whole number", names[i])));
            }
            out[i] = t.parse::<u64>().ok().filter(|x| *x <= crate::MAX_DIM).ok_or_else(|| {
                self.err(&format!("'{word}' {what} {} = '{t}': expected a whole number from 0 to {}", names[i], crate::MAX_DIM))
            })?;
        }
        Ok(out)
    }
    fn video(&self, word: &str, arg: &str) -> Result<Mask, MaskError> {
        let (main, order) = match arg.split_once('@') {
            Some((m, o)) => (m, Some(o.trim())),
            None => (arg, None),
        };
        let parts: Vec<&str> = main.split(':').collect();
        let want = if word == "video" { 2 } else { 3 };
        if parts.len() != want {
            let form = if word == "video" { "video:F,H,W:wf,wh,ww" } else { "sta:F,H,W:kf,kh,kw:tf,th,tw" };
            return Err(self.err(&format!("'{word}' takes {form}, got '{word}:{arg}'")));
        }
        let dims = self.triple(word, "volume", ["F", "H", "W"], parts[0])?;
        for (i, &n) in dims.iter().enumerate() {
            if n == 0 {
                return Err(self.value_err(format!("'{word}' volume {} = 0: video sizes must be at least 1", ["F", "H", "W"][i])));
            }
        }
        let window = if word == "video" {
            VideoWindow::Tokens(self.triple(word, "window", ["wf", "wh", "ww"], parts[1])?)
        } else {
            let kernel = self.triple(word, "kernel", ["kf", "kh", "kw"], parts[1])?;
            let tile = self.triple(word, "tile", ["tf", "th", "tw"], parts[2])?;
            VideoWindow::Tiles { kernel, tile }
        };
        let order = match order {
            None => match window {
                VideoWindow::Tokens(_) => VideoOrder::Frame,
                VideoWindow::Tiles { tile, .. } => VideoOrder::Tiles { tile },
            },
            Some("frame") => VideoOrder::Frame,
            Some("position") => VideoOrder::Position,
            Some(o) => match o.strip_prefix("tiles:") {
                Some(t) => VideoOrder::Tiles { tile: self.triple(word, "@tiles", ["tf", "th", "tw"], t)? },
                None => {
                    return Err(self.err(&format!("unknown video order '@{o}'; allowed: @frame, @position, @tiles:tf,th,tw")));
                }
            },
        };
        Ok(Mask::Video(VideoMask { dims, window, order }))
    }
    fn per_head(&mut self) -> Result<Mask, MaskError> {
        self.depth += 1;
        let mut list: Vec<Mask> = Vec::new();
        loop {
            self.skip_ws();
            let rest = &self.text[self.pos..];
            if rest.starts_with(']') && list.is_empty() {
                return Err(self.value_err("a per-head list needs at least one mask: per-head[M1;M2;...]".into()));
            }
            let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            let mut count = 1usize;
            if digits > 0 {
                let after = &rest[digits..];
                let spaces = after.len() - after.trim_start_matches(' ').len();
                if after[spaces..].starts_with('*') {
                    count =
                        rest[..digits].parse::<usize>().ok().filter(|n| *n <= MAX_PER_HEAD).ok_or_else(|| {
                            self.value_err(format!("per-head repeat count '{}' is above {MAX_PER_HEAD}", &rest[..digits]))
                        })?;
                    if count == 0 {
                        return Err(self.value_err("per-head repeat count 0: expected at least 1 (N*M repeats M N times)".into()));
                    }
                    self.pos += digits + spaces + 1;
                }
            }
            let m = self.union()?;
            if list.len() + count > MAX_PER_HEAD {
                return Err(self.value_err(format!("a per-head list holds at most {MAX_PER_HEAD} masks")));
            }
            list.extend(std::iter::repeat_n(m, count));
            if self.eat(';') {
                continue;
            }
            if self.eat(']') {
                break;
            }
            return Err(self.err(&format!("expected ';' or ']' in the per-head list at position {}", self.pos)));
        }
        self.depth -= 1;
        Ok(Mask::PerHead(list))
    }
    fn atom(&mut self) -> Result<Mask, MaskError> {
        self.skip_ws();
        self.atoms += 1;
        if self.atoms > MAX_MASK_TERMS {
            return Err(self.value_err(format!("a mask expression holds at most {MAX_MASK_TERMS} terms")));
        }
        if self.depth >= MAX_MASK_DEPTH {
            return Err(self.value_err(format!("a mask expression nests at most {MAX_MASK_DEPTH} levels of ( ) and per-head[ ]")));
        }
        if self.eat('(') {
            self.depth += 1;
            let m = self.union()?;
            if !self.eat(')') {
                return Err(self.err(&format!("missing ')' at position {}", self.pos)));
            }
            self.depth -= 1;
            return Ok(m);
        }
        let rest = &self.text[self.pos..];
        if rest.starts_with("per-head[") {
            self.pos += "per-head[".len();
            return self.per_head();
        }
        if let Some(path) = rest.strip_prefix("file:") {
            let len = if self.depth == 0 { path.len() } else { path.find([')', ';', ']']).unwrap_or(path.len()) };
            self.pos += "file:".len() + len;
            let path = path[..len].trim();
            if path.is_empty() {
                return Err(self.err("'file:' needs a path"));
            }
            return Ok(Mask::File(path.to_string()));
        }
        let end = rest.find(['+', '&', ')', '(', ';', ']', '[']).unwrap_or(rest.len());
        let tok = rest[..end].trim();
        self.pos += end;
        // `@` starts a modifier: a token order for video / sta (parsed with their arguments), an
        // offset for causal / local.
        let head = tok.split([':', '@']).next().unwrap_or("").trim();
        let (tok, modifier) = match tok.split_once('@') {
            Some((t, m)) if head != "video" && head != "sta" => (t.trim(), Some(m.trim())),
            _ => (tok, None),
        };
        let offset = match modifier {
            None => 0,
            Some(m) => {
                if head != "causal" && head != "local" {
                    return Err(self.err(&format!(
                        "'{head}' takes no '@{m}': '@offset:N' applies to causal and local, '@frame', '@position' and '@tiles:...' to video and sta"
                    )));
                }
                self.offset(head, m)?
            }
        };
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
            "causal" => none(Mask::Causal { offset }),
            "local" => {
                let a = need(2)?;
                Ok(Mask::Local { left: self.number(word, a[0])?, right: self.number(word, a[1])?, offset })
            }
            "band" => Ok(Mask::Band { width: self.number(word, need(1)?[0])? }),
            "sink" => Ok(Mask::Sink { tokens: self.number(word, need(1)?[0])? }),
            "chunked" => {
                let size = self.number(word, need(1)?[0])?;
                if size == 0 {
                    return Err(self.value_err("'chunked' needs a chunk size of at least 1".into()));
                }
                Ok(Mask::Chunked { size })
            }
            "video" | "sta" => {
                let a =
                    arg.ok_or_else(|| self.err(&format!("'{word}' needs its volume and window after ':' (e.g. video:21,45,80:4,45,80)")))?;
                self.video(word, a)
            }
            "per-head" => Err(self.err("'per-head' needs a bracketed list: per-head[M1;M2;...]")),
            "" => Err(self.err(&format!("expected a mask at position {}", self.pos))),
            other => Err(self.err(&format!("unknown mask word '{other}'"))),
        }
    }
}

#[cfg(test)]
mod tests;
