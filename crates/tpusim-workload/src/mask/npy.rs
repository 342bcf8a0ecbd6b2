//! NumPy mask files for `--mask file:PATH.npy` / `file:PATH.npz` (format in
//! `crates/tpusim-workload/MASK_FILES.md`):
//!
//! * `.npy`: a dense mask `[q, kv]` or `[heads, q, kv]` of `bool` (or `uint8` / `int8`, non-zero =
//!   kept), C or Fortran order. The file is memory-mapped and read row by row when a tiling
//!   asks for its tile counts; it is never loaded whole.
//! * `.npz`: either a **block map** (members `block_mask` `[heads, q_blocks, kv_blocks]` or
//!   `[q_blocks, kv_blocks]` of 0 empty / 1 partial / 2 full, and the scalars `q_len`, `kv_len`,
//!   `block_q`, `block_kv`; optionally `partial_mask_blocks` `[n, block_q, block_kv]` with
//!   `mask_next` `[heads, q_blocks, kv_blocks]` indexing it, as Splash's `MaskInfo` holds them),
//!   or a dense mask as its only member (or the member `mask`). A stored (`np.savez`) dense member is
//!   memory-mapped in place; a compressed (`np.savez_compressed`) one is decompressed once,
//!   streaming, into an anonymous temporary file that is then memory-mapped.
//!
//! Headers are parsed with npyz; archives are read with zip.

use super::array::{ArrayMask, ArraySource, BlockMap, DenseArray};
use super::{Mask, MaskError};
use npyz::{DType, NpyFile, NpyHeader, Order, TypeChar};
use std::fs::File;
use std::io::{Read, Seek};
use std::sync::Arc;

fn err(path: &str, message: String) -> MaskError {
    MaskError::File { path: path.to_string(), message }
}

/// Whether `path` names a NumPy file (by its extension).
pub fn is_numpy_path(path: &str) -> bool {
    let p = path.to_ascii_lowercase();
    p.ends_with(".npy") || p.ends_with(".npz")
}

/// Reads a `.npy` or `.npz` mask file (module docs).
///
/// # Errors
/// [`MaskError::File`] naming the path and the member or field: unreadable files, malformed
/// headers, dtypes other than bool / 1-byte integers for dense masks, shapes of the wrong rank,
/// missing or inconsistent block-map members.
pub fn read_numpy_mask(path: &str) -> Result<Mask, MaskError> {
    if path.to_ascii_lowercase().ends_with(".npy") {
        let mut file = File::open(path).map_err(|e| err(path, format!("cannot read: {e}")))?;
        let header = NpyHeader::from_reader(&mut file).map_err(|e| err(path, format!("not a NumPy .npy file: {e}")))?;
        let offset = file.stream_position().map_err(|e| err(path, format!("cannot read: {e}")))? as usize;
        // SAFETY: the map is read-only; a file changed by another process while it is mapped
        // gives wrong tile counts, not undefined behaviour in safe code that reads bytes.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| err(path, format!("cannot map: {e}")))?;
        dense(path, "", &header, Box::new(map), offset)
    } else {
        read_npz(path)
    }
}

/// Builds a dense mask from a parsed header and the bytes holding the data at `offset`.
fn dense(path: &str, member: &str, header: &NpyHeader, data: Box<dyn super::array::ByteSource>, offset: usize) -> Result<Mask, MaskError> {
    let what = if member.is_empty() { String::new() } else { format!("member '{member}': ") };
    match header.dtype() {
        DType::Plain(t) if matches!(t.type_char(), TypeChar::Bool | TypeChar::Uint | TypeChar::Int) && t.num_bytes() == Some(1) => {}
        d => {
            return Err(err(
                path,
                format!(
                    "{what}dtype {}: a dense mask is bool (or uint8 / int8, non-zero = kept); a block map goes in an .npz with 'block_mask', 'q_len', 'kv_len', 'block_q', 'block_kv'",
                    d.descr()
                ),
            ))
        }
    }
    let shape = header.shape();
    let (dims, c_strides) = match *shape {
        [q, k] => ([1, q, k], [0usize, k as usize, 1]),
        [h, q, k] => ([h, q, k], [(q * k) as usize, k as usize, 1]),
        _ => return Err(err(path, format!("{what}shape {shape:?}: a dense mask is [q_len, kv_len] or [heads, q_len, kv_len]"))),
    };
    let strides = match header.order() {
        Order::C => c_strides,
        Order::Fortran => match *shape {
            [q, _] => [0, 1, q as usize],
            [h, q, _] => [1, h as usize, (h * q) as usize],
            _ => unreachable!("rank checked above"),
        },
    };
    let label = format!("file:{path}");
    let d = DenseArray::new(&label, data, offset, dims, strides).map_err(|e| match e {
        MaskError::File { message, .. } => err(path, format!("{what}{message}")),
        other => other,
    })?;
    Ok(Mask::Array(ArrayMask::new(ArraySource::Dense(Arc::new(d)))))
}

fn read_npz(path: &str) -> Result<Mask, MaskError> {
    let file = File::open(path).map_err(|e| err(path, format!("cannot read: {e}")))?;
    let mut zip = zip::ZipArchive::new(file).map_err(|e| err(path, format!("not a NumPy .npz (zip) archive: {e}")))?;
    let names: Vec<String> = zip.file_names().map(String::from).collect();
    let members: Vec<String> = names.iter().map(|n| n.trim_end_matches(".npy").to_string()).collect();
    if members.iter().any(|m| m == "block_mask") {
        // A member a block map does not have (a misspelt `mask_next`, say) is refused, as a
        // JSON mask file's unknown key is: read silently, it would change nothing.
        const BLOCK_MAP_MEMBERS: [&str; 7] = ["block_mask", "q_len", "kv_len", "block_q", "block_kv", "partial_mask_blocks", "mask_next"];
        if let Some(m) = members.iter().find(|m| !BLOCK_MAP_MEMBERS.contains(&m.as_str())) {
            return Err(err(path, format!("member '{m}': not a member of a block map (its members are {})", BLOCK_MAP_MEMBERS.join(", "))));
        }
        return block_map(path, &mut zip, &members);
    }
    let pick = if members.len() == 1 {
        members[0].clone()
    } else if members.iter().any(|m| m == "mask") {
        "mask".to_string()
    } else {
        return Err(err(
            path,
            format!(
                "members {}: expected a block map ('block_mask', 'q_len', 'kv_len', 'block_q', 'block_kv') or one dense mask (the only member, or one named 'mask')",
                members.join(", ")
            ),
        ));
    };
    let entry = format!("{pick}.npy");
    let (stored, data_start) = {
        let f = zip.by_name(&entry).map_err(|e| err(path, format!("member '{pick}': {e}")))?;
        (f.compression() == zip::CompressionMethod::Stored, f.data_start())
    };
    if stored {
        let mut f = zip.by_name(&entry).map_err(|e| err(path, format!("member '{pick}': {e}")))?;
        let mut counting = Counting { inner: &mut f, n: 0 };
        let header = NpyHeader::from_reader(&mut counting).map_err(|e| err(path, format!("member '{pick}': not a .npy array: {e}")))?;
        let offset = (data_start + counting.n) as usize;
        let file = File::open(path).map_err(|e| err(path, format!("cannot read: {e}")))?;
        // SAFETY: read-only map (see `read_numpy_mask`).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| err(path, format!("cannot map: {e}")))?;
        dense(path, &pick, &header, Box::new(map), offset)
    } else {
        // Compressed: stream it once into an anonymous temporary file and map that.
        let mut f = zip.by_name(&entry).map_err(|e| err(path, format!("member '{pick}': {e}")))?;
        let mut spill = tempfile::tempfile().map_err(|e| err(path, format!("cannot create a temporary file to decompress into: {e}")))?;
        std::io::copy(&mut f, &mut spill).map_err(|e| err(path, format!("member '{pick}': cannot decompress: {e}")))?;
        spill.rewind().map_err(|e| err(path, format!("temporary file: {e}")))?;
        let header = NpyHeader::from_reader(&mut spill).map_err(|e| err(path, format!("member '{pick}': not a .npy array: {e}")))?;
        let offset = spill.stream_position().map_err(|e| err(path, format!("temporary file: {e}")))? as usize;
        // SAFETY: read-only map of a file only this process knows.
        let map = unsafe { memmap2::Mmap::map(&spill) }.map_err(|e| err(path, format!("cannot map: {e}")))?;
        dense(path, &pick, &header, Box::new(map), offset)
    }
}

/// Counts the bytes read through it (to find where a stored member's data begins).
struct Counting<'a, R: Read> {
    inner: &'a mut R,
    n: u64,
}

impl<R: Read> Read for Counting<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.n += n as u64;
        Ok(n)
    }
}

/// An integer (or bool) array member, read whole: (shape, values).
fn int_member<R: Read + Seek>(path: &str, zip: &mut zip::ZipArchive<R>, name: &str) -> Result<(Vec<u64>, Vec<i64>), MaskError> {
    let f = zip.by_name(&format!("{name}.npy")).map_err(|e| err(path, format!("member '{name}': {e}")))?;
    let npy = NpyFile::new(f).map_err(|e| err(path, format!("member '{name}': not a .npy array: {e}")))?;
    let shape = npy.shape().to_vec();
    if npy.order() == Order::Fortran && shape.len() > 1 {
        return Err(err(path, format!("member '{name}': Fortran order; save it with np.ascontiguousarray")));
    }
    let dtype = npy.dtype();
    let bad = |e: std::io::Error| err(path, format!("member '{name}': {e}"));
    let values: Vec<i64> = match &dtype {
        DType::Plain(t) => match (t.type_char(), t.num_bytes()) {
            (TypeChar::Bool, Some(1)) => npy.into_vec::<bool>().map_err(bad)?.into_iter().map(i64::from).collect(),
            (TypeChar::Int, Some(1)) => npy.into_vec::<i8>().map_err(bad)?.into_iter().map(i64::from).collect(),
            (TypeChar::Int, Some(2)) => npy.into_vec::<i16>().map_err(bad)?.into_iter().map(i64::from).collect(),
            (TypeChar::Int, Some(4)) => npy.into_vec::<i32>().map_err(bad)?.into_iter().map(i64::from).collect(),
            (TypeChar::Int, Some(8)) => npy.into_vec::<i64>().map_err(bad)?,
            (TypeChar::Uint, Some(1)) => npy.into_vec::<u8>().map_err(bad)?.into_iter().map(i64::from).collect(),
            (TypeChar::Uint, Some(2)) => npy.into_vec::<u16>().map_err(bad)?.into_iter().map(i64::from).collect(),
            (TypeChar::Uint, Some(4)) => npy.into_vec::<u32>().map_err(bad)?.into_iter().map(i64::from).collect(),
            (TypeChar::Uint, Some(8)) => npy.into_vec::<u64>().map_err(bad)?.into_iter().map(|v| v.min(i64::MAX as u64) as i64).collect(),
            _ => return Err(err(path, format!("member '{name}': dtype {}: expected integers or bools", dtype.descr()))),
        },
        _ => return Err(err(path, format!("member '{name}': dtype {}: expected integers or bools", dtype.descr()))),
    };
    Ok((shape, values))
}

fn scalar<R: Read + Seek>(path: &str, zip: &mut zip::ZipArchive<R>, members: &[String], name: &str) -> Result<u64, MaskError> {
    if !members.iter().any(|m| m == name) {
        return Err(err(
            path,
            format!("missing member '{name}': a block map needs 'block_mask', 'q_len', 'kv_len', 'block_q', 'block_kv'"),
        ));
    }
    let (shape, v) = int_member(path, zip, name)?;
    match (shape.iter().product::<u64>(), v.first()) {
        (1, Some(&x)) if x >= 1 => Ok(x as u64),
        (1, Some(&x)) => Err(err(path, format!("member '{name}' = {x}: expected a whole number from 1 to {}", crate::MAX_DIM))),
        _ => Err(err(path, format!("member '{name}' has shape {shape:?}: expected one number"))),
    }
}

fn block_map<R: Read + Seek>(path: &str, zip: &mut zip::ZipArchive<R>, members: &[String]) -> Result<Mask, MaskError> {
    let q_len = scalar(path, zip, members, "q_len")?;
    let kv_len = scalar(path, zip, members, "kv_len")?;
    let block_q = scalar(path, zip, members, "block_q")?;
    let block_kv = scalar(path, zip, members, "block_kv")?;
    let (shape, classes) = int_member(path, zip, "block_mask")?;
    let heads = match *shape {
        [_, _] => 1,
        [h, _, _] => h,
        _ => return Err(err(path, format!("member 'block_mask' has shape {shape:?}: expected [heads, q_blocks, kv_blocks]"))),
    };
    let (nq, nk) = (q_len.div_ceil(block_q), kv_len.div_ceil(block_kv));
    if shape[shape.len() - 2..] != [nq, nk] {
        return Err(err(
            path,
            format!(
                "member 'block_mask' has shape {shape:?}: q_len {q_len} / block_q {block_q} and kv_len {kv_len} / block_kv {block_kv} give [heads, {nq}, {nk}] (Splash's MaskInfo: build it with shrink_grid=False)"
            ),
        ));
    }
    if let Some((i, v)) = classes.iter().enumerate().find(|(_, v)| !(0..=2).contains(*v)) {
        return Err(err(path, format!("member 'block_mask' entry {i} = {v}: expected 0 (empty), 1 (partial) or 2 (full)")));
    }
    let classes: Vec<u8> = classes.into_iter().map(|v| v as u8).collect();
    let has_blocks = members.iter().any(|m| m == "partial_mask_blocks");
    let has_next = members.iter().any(|m| m == "mask_next");
    let partial = match (has_blocks, has_next) {
        (false, false) => None,
        (true, true) => {
            let (bshape, blocks) = int_member(path, zip, "partial_mask_blocks")?;
            if bshape.len() != 3 || bshape[1] != block_q || bshape[2] != block_kv {
                return Err(err(
                    path,
                    format!("member 'partial_mask_blocks' has shape {bshape:?}: expected [n, block_q = {block_q}, block_kv = {block_kv}]"),
                ));
            }
            let (nshape, next) = int_member(path, zip, "mask_next")?;
            if nshape != shape {
                return Err(err(path, format!("member 'mask_next' has shape {nshape:?}: expected the shape of 'block_mask' {shape:?}")));
            }
            let next: Vec<u32> = next.into_iter().map(|v| v.clamp(0, u32::MAX as i64) as u32).collect();
            Some((blocks.into_iter().map(|v| (v != 0) as u8).collect(), next))
        }
        _ => {
            return Err(err(path, "give both 'partial_mask_blocks' and 'mask_next' (the partial blocks' element masks), or neither".into()))
        }
    };
    let map = BlockMap::new(&format!("file:{path}"), heads, [q_len, kv_len], [block_q, block_kv], classes, partial)?;
    Ok(Mask::Array(ArrayMask::new(ArraySource::Blocks(Arc::new(map)))))
}
