//! `decode_kernel_ir`: a decode kernel's description simulated and reported against the HBM
//! roofline (`tpusim_job::decode`), for `tpusim.jax.decode`.

use crate::input_err;
use pyo3::prelude::*;
use tpusim_job::JobSpec;

/// Simulates a decode kernel's description (JSON text) on `chip` with `set` overrides and
/// reports it against the HBM roofline: `lengths` (tokens per sequence), `page_size` (tokens),
/// `kv_bytes_per_page` (K and V of one page over the KV heads), `q_bytes`, `o_bytes`,
/// `pages_per_block` (a label). Returns (report JSON, table, kernel report JSON).
#[pyfunction]
#[pyo3(signature = (description, lengths, page_size, kv_bytes_per_page, q_bytes, o_bytes, pages_per_block = None, chip = "v6e", set = Vec::new(), folder = "."))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn decode_kernel_ir(
    py: Python<'_>,
    description: &str,
    lengths: Vec<u64>,
    page_size: u64,
    kv_bytes_per_page: u64,
    q_bytes: u64,
    o_bytes: u64,
    pages_per_block: Option<u64>,
    chip: &str,
    set: Vec<String>,
    folder: &str,
) -> PyResult<(String, String, String)> {
    let spec = JobSpec { chip: Some(chip.to_string()), set, kernel_ir_value: Some(crate::kernel_ir_value(description, folder)), ..Default::default() };
    let model = spec.chip().map_err(|e| input_err(e.to_string()))?;
    let shape = tpusim_job::decode::DecodeShape { lengths, page_size, kv_bytes_per_page, q_bytes, o_bytes, pages_per_block };
    crate::interruptible_once(py, move || {
        let job = spec.build(&model).map_err(|e| e.to_string())?;
        let run = tpusim_job::run(&model, &job).map_err(|e| e.to_string())?;
        let rep = tpusim_job::decode::DecodeReport::from_run(&run, &shape)?;
        let k = tpusim_job::Report::from_run(&run);
        Ok::<_, String>((rep.to_json(), rep.to_table(), k.to_json()))
    })?
    .map_err(input_err)
}
