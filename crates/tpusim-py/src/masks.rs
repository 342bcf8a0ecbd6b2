//! Masks from Python: JAX Splash and tokamax mask objects read by their structure (class name
//! and attributes; JAX is never imported), NumPy boolean arrays read through the buffer protocol
//! without a copy, and mask text in the `--mask` grammar.
//!
//! Splash semantics (`jax/experimental/pallas/ops/tpu/splash_attention/splash_attention_mask.py`;
//! tokamax's `splash_attention_mask.py` has the same classes but no `MultiHeadMask`), with q the
//! row and kv the column, both absolute positions:
//!
//! | class | keeps (q, kv) when | grammar |
//! |---|---|---|
//! | `FullMask` | always | `full` |
//! | `CausalMask(offset=o)` | `q + o >= kv` | `causal@offset:o` (`causal` for o = 0) |
//! | `LocalMask(window_size=(L, R), offset=o)` | `kv >= q + o - L` and `kv <= q + o + R` (`None`: unbounded) | `local:L,R@offset:o` |
//! | `ChunkedCausalMask(chunk_size=c)` | `q // c == kv // c` and `q >= kv` | `chunked:c` |
//! | `NumpyMask(array)` | `array[q, kv]` | an array mask |
//! | `LogicalOr(l, r)` / `LogicalAnd(l, r)` | either / both | `l+r` / `l&r` |
//! | `MultiHeadMask(masks)` | head h: `masks[h]` | `per-head[...]` |
//!
//! Offsets are the grammar's own (`@offset:o`, signed), so an offset mask is the same kernel in
//! both front ends. A `LocalMask` side of `None` becomes a window wider than both lengths and
//! the offset; a negative window side is refused.

use pyo3::buffer::PyUntypedBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tpusim_workload::mask::{ArrayMask, ArraySource, ByteSource, DenseArray};
use tpusim_workload::Mask;

use crate::input_err;

/// A mask read from Python with the shape its object declares (`(q, kv)` or `(heads, q, kv)`).
pub struct PyMask {
    /// The mask.
    pub mask: Mask,
    /// `(q_len, kv_len)` the object says it covers (`None` for mask text).
    pub lengths: Option<(u64, u64)>,
    /// Heads of a multi-head object (`MultiHeadMask`, a 3-D array).
    pub heads: Option<u64>,
}

/// The bytes of a Python buffer (a NumPy array), kept alive while the mask lives.
struct PyBytes {
    _buf: std::panic::AssertUnwindSafe<PyUntypedBuffer>,
    ptr: usize,
    len: usize,
}

impl ByteSource for PyBytes {
    fn bytes(&self) -> &[u8] {
        // SAFETY: the buffer export (`_buf`) keeps the memory alive and unmoved until this value
        // drops; `len` spans the last element (computed from shape and strides, all >= 0).
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
}

static ARRAY_ID: AtomicU64 = AtomicU64::new(0);

fn type_name(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    Ok(obj.get_type().name()?.to_string())
}

/// Whether `obj` looks like an array (NumPy or anything with `__array__`).
fn is_array_like(obj: &Bound<'_, PyAny>) -> bool {
    obj.hasattr("__array_interface__").unwrap_or(false) || obj.hasattr("__array__").unwrap_or(false)
}

/// A NumPy array (2-D `[q, kv]` or 3-D `[heads, q, kv]`, one byte per element) as a mask,
/// without copying it (a non-NumPy array, e.g. a `jax.Array`, goes through `numpy.asarray`).
fn array_mask(py: Python<'_>, obj: &Bound<'_, PyAny>, what: &str) -> PyResult<PyMask> {
    let np = py.import("numpy").map_err(|_| input_err(format!("{what}: reading an array mask needs NumPy installed")))?;
    let mut arr = obj.clone();
    if !obj.hasattr("__array_interface__")? || !obj.hasattr("view")? {
        arr = np.call_method1("asarray", (obj,))?;
    }
    let dtype = arr.getattr("dtype")?;
    let kind: String = dtype.getattr("kind")?.extract()?;
    let itemsize: usize = dtype.getattr("itemsize")?.extract()?;
    if itemsize != 1 || !matches!(kind.as_str(), "b" | "u" | "i") {
        let name: String = dtype.getattr("name")?.extract()?;
        return Err(input_err(format!("{what}: dtype {name}: a mask array is bool (or uint8 / int8, non-zero = kept)")));
    }
    let shape: Vec<u64> = arr.getattr("shape")?.extract()?;
    if shape.len() != 2 && shape.len() != 3 {
        return Err(input_err(format!("{what}: shape {shape:?}: a mask array is [q_len, kv_len] or [heads, q_len, kv_len]")));
    }
    let strides: Vec<isize> = arr.getattr("strides")?.extract()?;
    if strides.iter().any(|&s| s < 0) {
        arr = np.call_method1("ascontiguousarray", (&arr,))?;
    }
    let bytes_view = arr.call_method1("view", ("u1",))?;
    let buf = PyUntypedBuffer::get(&bytes_view)?;
    let (bshape, bstrides) = (buf.shape().to_vec(), buf.strides().to_vec());
    if bstrides.iter().any(|&s| s < 0) || bshape.contains(&0) {
        return Err(input_err(format!("{what}: shape {shape:?}: every dimension must be at least 1")));
    }
    let span = bshape.iter().zip(&bstrides).map(|(&n, &s)| (n - 1) * s as usize).sum::<usize>() + 1;
    let ptr = buf.buf_ptr() as usize;
    let (dims, st) = if bshape.len() == 2 {
        ([1, bshape[0] as u64, bshape[1] as u64], [0usize, bstrides[0] as usize, bstrides[1] as usize])
    } else {
        ([bshape[0] as u64, bshape[1] as u64, bshape[2] as u64], [bstrides[0] as usize, bstrides[1] as usize, bstrides[2] as usize])
    };
    let id = ARRAY_ID.fetch_add(1, Ordering::Relaxed);
    let label = format!("array#{id}[{}]", shape.iter().map(|x| x.to_string()).collect::<Vec<_>>().join("x"));
    let src = PyBytes { _buf: std::panic::AssertUnwindSafe(buf), ptr, len: span };
    let d = DenseArray::new(&label, Box::new(src), 0, dims, st).map_err(|e| input_err(format!("{what}: {e}")))?;
    Ok(PyMask {
        mask: Mask::Array(ArrayMask::new(ArraySource::Dense(Arc::new(d)))),
        lengths: Some((dims[1], dims[2])),
        heads: (shape.len() == 3).then_some(dims[0]),
    })
}

fn shape_of(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
    obj.getattr("shape")?.extract::<Vec<u64>>()
}

/// An optional whole number attribute (`None` stays `None`).
fn opt_int(v: &Bound<'_, PyAny>) -> PyResult<Option<i64>> {
    if v.is_none() {
        Ok(None)
    } else {
        v.extract::<i64>().map(Some)
    }
}

/// Reads a mask given from Python: text (the `--mask` grammar), a Splash / tokamax mask object,
/// or an array. `what` names the argument in errors.
pub fn read_mask(py: Python<'_>, obj: &Bound<'_, PyAny>, what: &str) -> PyResult<PyMask> {
    if let Ok(s) = obj.cast::<PyString>() {
        let text = s.to_str()?;
        // The value as Python prints it (`mask = 'band:': ...`), as for every keyword.
        let mask = Mask::parse(text).map_err(|e| input_err(format!("{what} = {}: {e}", obj.repr().map(|r| r.to_string()).unwrap_or_default())))?;
        return Ok(PyMask { mask, lengths: None, heads: None });
    }
    let name = type_name(obj)?;
    let splash = obj
        .get_type()
        .getattr("__module__")
        .ok()
        .and_then(|m| m.extract::<String>().ok())
        .is_some_and(|m| m.ends_with("splash_attention_mask"));
    let shape2 = |o: &Bound<'_, PyAny>| -> PyResult<(u64, u64)> {
        let s = shape_of(o)?;
        match s.as_slice() {
            [q, k] => Ok((*q, *k)),
            _ => Err(input_err(format!("{what}: {} has shape {s:?}; expected (q_len, kv_len)", type_name(o)?))),
        }
    };
    let leaf = |mask: Mask, o: &Bound<'_, PyAny>| -> PyResult<PyMask> { Ok(PyMask { mask, lengths: Some(shape2(o)?), heads: None }) };
    match name.as_str() {
        "FullMask" => leaf(Mask::Full, obj),
        "CausalMask" => {
            let offset = opt_int(&obj.getattr("offset")?)?.unwrap_or(0);
            leaf(Mask::Causal { offset }, obj)
        }
        "LocalMask" => {
            let (q, kv) = shape2(obj)?;
            let ws = obj.getattr("window_size")?;
            let (l, r): (Option<i64>, Option<i64>) = (opt_int(&ws.get_item(0)?)?, opt_int(&ws.get_item(1)?)?);
            let offset = opt_int(&obj.getattr("offset")?)?.unwrap_or(0);
            // An unbounded side keeps every position on that side: a window wider than both
            // lengths and the offset.
            let unbounded = (q + kv) as i64 + offset.abs();
            if l.is_none() && r.is_none() {
                return leaf(Mask::Full, obj);
            }
            let side = |v: Option<i64>, which: &str| -> PyResult<u64> {
                match v {
                    None => Ok(unbounded as u64),
                    Some(v) if v >= 0 => Ok(v as u64),
                    Some(v) => Err(input_err(format!("{what}: LocalMask window_size {which} side {v}: a window side must be None or at least 0"))),
                }
            };
            let (left, right) = (side(l, "left")?, side(r, "right")?);
            leaf(Mask::Local { left, right, offset }, obj)
        }
        "ChunkedCausalMask" => {
            let c: i64 = obj.getattr("chunk_size")?.extract()?;
            if c <= 0 {
                return Err(input_err(format!("{what}: ChunkedCausalMask(chunk_size={c}): the chunk size must be at least 1")));
            }
            leaf(Mask::Chunked { size: c as u64 }, obj)
        }
        "NumpyMask" => array_mask(py, &obj.getattr("array")?, &format!("{what}: NumpyMask.array")),
        "LogicalOr" | "LogicalAnd" => {
            let l = read_mask(py, &obj.getattr("left")?, what)?;
            let r = read_mask(py, &obj.getattr("right")?, what)?;
            let or = name == "LogicalOr";
            let mut parts = Vec::new();
            for m in [l.mask, r.mask] {
                match (m, or) {
                    (Mask::Union(p), true) => parts.extend(p),
                    (Mask::Intersect(p), false) => parts.extend(p),
                    (m, _) => parts.push(m),
                }
            }
            Ok(PyMask { mask: if or { Mask::Union(parts) } else { Mask::Intersect(parts) }, lengths: l.lengths.or(r.lengths), heads: None })
        }
        "MultiHeadMask" => {
            let masks = obj.getattr("masks")?;
            let list: Vec<Bound<'_, PyAny>> = masks.try_iter()?.collect::<PyResult<_>>()?;
            let mut out = Vec::with_capacity(list.len());
            let mut lengths = None;
            for (i, m) in list.iter().enumerate() {
                let pm = read_mask(py, m, &format!("{what}: MultiHeadMask.masks[{i}]"))?;
                if pm.heads.is_some() {
                    return Err(input_err(format!("{what}: MultiHeadMask.masks[{i}] is multi-head; each head's mask is 2-D")));
                }
                lengths = lengths.or(pm.lengths);
                out.push(pm.mask);
            }
            if out.is_empty() {
                return Err(input_err(format!("{what}: MultiHeadMask with no masks")));
            }
            let heads = out.len() as u64;
            let mask = if out.iter().all(|m| *m == out[0]) { out.swap_remove(0) } else { Mask::PerHead(out) };
            Ok(PyMask { mask, lengths, heads: Some(heads) })
        }
        _ if is_array_like(obj) => array_mask(py, obj, what),
        _ if obj.cast::<PyList>().is_ok() => Err(input_err(format!(
            "{what}: a list; give a MultiHeadMask, a 3-D array [heads, q, kv], or per-head[...] text for one mask per head"
        ))),
        _ => Err(input_err(format!(
            "{what}: {}{name}: expected mask text (e.g. 'causal', 'band:512+sink:64'), a Splash mask (FullMask, CausalMask, LocalMask, ChunkedCausalMask, NumpyMask, LogicalOr, LogicalAnd, MultiHeadMask) or a boolean NumPy array",
            if splash { "the Splash mask class " } else { "" }
        ))),
    }
}

/// The mask as `--mask` text when it holds no array (the CLI then reads the same definition).
pub fn as_text(mask: &Mask) -> Option<String> {
    fn has_array(m: &Mask) -> bool {
        match m {
            Mask::Array(_) => true,
            Mask::Union(p) | Mask::Intersect(p) | Mask::PerHead(p) => p.iter().any(has_array),
            _ => false,
        }
    }
    (!has_array(mask)).then(|| mask.to_string())
}
