//! `.npy` side files of prefetch tables: integer arrays of any shape, read with npyz.

use crate::PallasError;
use npyz::{DType, NpyFile, TypeChar};
use std::path::Path;

/// Reads an integer `.npy` array: (shape, values in row-major order).
///
/// # Errors
/// [`PallasError::Io`] when the file cannot be read; [`PallasError::Field`] naming the file for a
/// header that is not an integer or bool array in C order.
pub fn read_int_array(path: &Path) -> Result<(Vec<u64>, Vec<i64>), PallasError> {
    let shown = path.display().to_string();
    let io = |m: String| PallasError::Io { path: shown.clone(), message: m };
    let bytes = std::fs::read(path).map_err(|e| io(e.to_string()))?;
    let npy = NpyFile::new(&bytes[..]).map_err(|e| io(format!("not a NumPy .npy file: {e}")))?;
    let shape = npy.shape().to_vec();
    if npy.order() != npyz::Order::C {
        return Err(PallasError::field(&shown, "Fortran order", "expected a C-order array (np.ascontiguousarray)"));
    }
    let bad = |t: &str| PallasError::field(&shown, t.to_string(), "expected an integer or bool array (int8 ... int64, uint8 ... uint32, bool)");
    let (tc, size) = match npy.dtype() {
        DType::Plain(t) => (t.type_char(), t.size_field()),
        other => return Err(bad(&other.descr())),
    };
    let values: Vec<i64> = match (tc, size) {
        (TypeChar::Bool, 1) => npy.into_vec::<bool>().map_err(|e| io(e.to_string()))?.into_iter().map(i64::from).collect(),
        (TypeChar::Int, 1) => npy.into_vec::<i8>().map_err(|e| io(e.to_string()))?.into_iter().map(i64::from).collect(),
        (TypeChar::Int, 2) => npy.into_vec::<i16>().map_err(|e| io(e.to_string()))?.into_iter().map(i64::from).collect(),
        (TypeChar::Int, 4) => npy.into_vec::<i32>().map_err(|e| io(e.to_string()))?.into_iter().map(i64::from).collect(),
        (TypeChar::Int, 8) => npy.into_vec::<i64>().map_err(|e| io(e.to_string()))?,
        (TypeChar::Uint, 1) => npy.into_vec::<u8>().map_err(|e| io(e.to_string()))?.into_iter().map(i64::from).collect(),
        (TypeChar::Uint, 2) => npy.into_vec::<u16>().map_err(|e| io(e.to_string()))?.into_iter().map(i64::from).collect(),
        (TypeChar::Uint, 4) => npy.into_vec::<u32>().map_err(|e| io(e.to_string()))?.into_iter().map(i64::from).collect(),
        // NumPy's own name for the element type (`float32`, `complex64`, `uint64`, ...).
        _ => {
            let kind = match tc {
                TypeChar::Float => "float",
                TypeChar::Complex => "complex",
                TypeChar::Uint => "uint",
                TypeChar::Int => "int",
                _ => "",
            };
            let name = if kind.is_empty() { format!("{tc:?}{size}") } else { format!("{kind}{}", size * 8) };
            return Err(bad(&name));
        }
    };
    Ok((shape, values))
}
