//! `simulate_program_description`: a whole program's description (crate `tpusim-program`)
//! simulated on a slice, for `tpusim.jax.simulate_program`.

use crate::input_err;
use pyo3::prelude::*;
use tpusim_job::JobSpec;

/// Simulates a program description (JSON text, `crates/tpusim-program/PROGRAM.md`) on `chip`
/// with `set` overrides over `slice` (`AxB`; `None`: the program's mesh shape). Returns (report
/// JSON, table). Errors are `InputError`s naming the op and its location, the slice or the field.
#[pyfunction]
#[pyo3(signature = (description, chip = "v6e", set = Vec::new(), slice = None, folder = "."))]
pub(crate) fn simulate_program_description(
    py: Python<'_>,
    description: &str,
    chip: &str,
    set: Vec<String>,
    slice: Option<String>,
    folder: &str,
) -> PyResult<(String, String)> {
    let spec = JobSpec { chip: Some(chip.to_string()), set, ..Default::default() };
    let model = spec.chip().map_err(|e| input_err(e.to_string()))?;
    let text = description.to_string();
    let dir = std::path::PathBuf::from(folder);
    crate::interruptible_once(py, move || {
        let d = tpusim_program::ProgramDescription::from_json(&text, "program description")?;
        let r = tpusim_program::simulate_program(&model, &d, slice.as_deref(), &dir)?;
        Ok::<_, tpusim_program::ProgramError>((r.to_json(), r.to_table()))
    })?
    .map_err(|e| input_err(e.to_string()))
}
