//! What a kernel reads at run time: the values of runtime prefetch operands (sequence lengths,
//! page tables) that the user supplies, the kernel's own SMEM state (scalars it stores and loads
//! again in later grid steps, as paged attention keeps its buffer index and first-block flag),
//! and the manual DMAs it issues with their source ranges checked.
//!
//! * **Binding.** [`bind_runtime`] replaces a description's runtime tables by the values given
//!   for them, by operand name (the `Values::Runtime` name, which `tpusim.jax` sets to the
//!   traced function's parameter name, or the ref's own name such as `prefetch 0`). A name that
//!   matches no runtime operand, a value of the wrong shape, and (on lowering) a runtime operand
//!   left without a value are errors naming the operand.
//! * **SMEM state.** `memref.store` to an SMEM ref writes a per-run state that later loads see;
//!   a `memref.load` op of a ref the kernel stores to binds its value when it runs (`["var",
//!   id]` in expressions), so a flag read before it is cleared keeps the value it had.
//! * **DMAs.** Each `tpu.enqueue_dma` that names its source (`src_ref`, `src_offsets`,
//!   `src_shape`) has its source window checked against the source array: an offset outside it
//!   (a page-table entry out of range) is an error naming the ref, the offsets and the shape.

use crate::desc::{Description, Op, RefKind, Values};
use crate::expr::{Env, Expr};
use crate::PallasError;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// Values written to SMEM refs and bound by SMEM load ops during a run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SmemState {
    /// (ref, row-major element index) -> value stored.
    pub written: HashMap<(usize, u64), i64>,
    /// SMEM load op id -> value it read in the current step.
    pub vars: HashMap<u64, i64>,
    /// SMEM load op id -> why it has no value: it read an element of SMEM scratch the kernel had
    /// not written yet (Pallas reads the old value before a store; unused, it costs nothing).
    pub unwritten: HashMap<u64, String>,
}

/// Manual DMAs counted over a run.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct DmaTally {
    /// DMAs issued (`tpu.enqueue_dma` executed).
    pub count: u64,
    /// Bytes they move.
    pub bytes: u64,
    /// Bytes per DMA -> how many.
    pub sizes: BTreeMap<u64, u64>,
    /// Most DMAs one grid step issues.
    pub max_per_step: u64,
}

impl DmaTally {
    /// Adds one DMA of `bytes`.
    pub fn add(&mut self, bytes: u64) {
        self.count += 1;
        self.bytes += bytes;
        *self.sizes.entry(bytes).or_default() += 1;
    }

    /// Adds a step's tally.
    pub fn merge_step(&mut self, step: &DmaTally) {
        self.count += step.count;
        self.bytes += step.bytes;
        for (&b, &n) in &step.sizes {
            *self.sizes.entry(b).or_default() += n;
        }
        self.max_per_step = self.max_per_step.max(step.count);
    }
}

/// A runtime value given for an operand: its shape and values in row-major order.
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeValue {
    /// Shape (the operand's, as the kernel sees it; a flattened table may be given in its
    /// original shape when the element counts agree).
    pub shape: Vec<u64>,
    /// Values, row-major.
    pub values: Vec<i64>,
}

impl RuntimeValue {
    /// Reads an integer `.npy` file (npyz).
    ///
    /// # Errors
    /// [`PallasError::Io`] / [`PallasError::Field`] naming the file.
    pub fn from_npy(path: &Path) -> Result<RuntimeValue, PallasError> {
        let (shape, values) = crate::npy::read_int_array(path)?;
        Ok(RuntimeValue { shape, values })
    }
}

/// The runtime operands of a description: (ref index, name), the name as
/// `Values::Runtime` gives it.
pub fn runtime_operands(d: &Description) -> Vec<(usize, String)> {
    d.refs
        .iter()
        .enumerate()
        .filter_map(|(i, r)| match &r.values {
            Some(Values::Runtime(n)) if r.holds_table() => Some((i, n.clone())),
            _ => None,
        })
        .collect()
}

/// The runtime operand `name` names (its operand name or its ref's name): (ref index, operand
/// name), so that a name can be checked before its file is read.
///
/// # Errors
/// [`PallasError::Field`] `--runtime` (value `NAME`) for a name that is no runtime operand of the kernel:
/// the names it has are listed, the closest first when one is within two edits of `name`.
pub fn check_runtime_name(d: &Description, name: &str) -> Result<(usize, String), PallasError> {
    runtime_operand(d, &runtime_operands(d), name)
}

fn runtime_operand(d: &Description, ops: &[(usize, String)], name: &str) -> Result<(usize, String), PallasError> {
    if let Some((i, n)) = ops.iter().find(|(i, n)| n == name || d.refs[*i].name == *name) {
        return Ok((*i, n.clone()));
    }
    let names: Vec<String> = ops.iter().map(|(_, n)| format!("`{n}`")).collect();
    let near = ops.iter().map(|(_, n)| (strsim::levenshtein(n, name), n)).filter(|(e, _)| *e <= 2).min_by_key(|(e, _)| *e);
    Err(PallasError::field(
        "--runtime",
        name,
        match (names.is_empty(), near) {
            (true, _) => format!("kernel `{}` has no runtime operand (every table it reads is a constant of the lowering)", d.kernel_name),
            (false, Some((_, n))) => format!("did you mean `{n}`? kernel `{}` has the runtime operands {}", d.kernel_name, names.join(", ")),
            (false, None) => format!("kernel `{}` has the runtime operands {}", d.kernel_name, names.join(", ")),
        },
    ))
}

/// Replaces the runtime tables named in `given` (operand name -> value) by inline values.
///
/// # Errors
/// [`PallasError::Field`] `--runtime NAME`: a name that is no runtime operand of the kernel
/// (the names it has are listed), or a value whose element count differs from the operand's.
pub fn bind_runtime(d: &mut Description, given: &[(String, RuntimeValue)]) -> Result<(), PallasError> {
    let ops = runtime_operands(d);
    for (name, v) in given {
        let (i, n) = runtime_operand(d, &ops, name)?;
        let r = &mut d.refs[i];
        let want: u64 = r.shape.iter().product();
        if v.values.len() as u64 != want {
            return Err(PallasError::field(
                &format!("--runtime {n}"),
                format!("{} values of shape {:?}", v.values.len(), v.shape),
                format!("the operand `{n}` holds {want} values (shape {:?} in the kernel)", r.shape),
            ));
        }
        r.values = Some(Values::Inline(v.values.clone()));
    }
    Ok(())
}

/// An op's `attrs[key]` as a list of expressions (parsed once: [`Op::attr_exprs`]); empty when
/// absent.
pub(crate) fn exprs(op: &Op, key: &str) -> Result<std::sync::Arc<Vec<Expr>>, PallasError> {
    Ok(op.attr_exprs(key)?.unwrap_or_default())
}

fn ref_of(op: &Op) -> Option<usize> {
    op.operands.iter().find_map(|o| match o {
        crate::desc::Operand::Ref(r) => Some(*r),
        _ => None,
    })
}

/// The row-major element index of `idx` in `shape`, or `None` outside it.
pub fn flat_index(shape: &[u64], idx: &[i64]) -> Option<u64> {
    if idx.len() != shape.len() {
        return None;
    }
    let mut flat = 0u64;
    for (&i, &n) in idx.iter().zip(shape) {
        if i < 0 || i as u64 >= n {
            return None;
        }
        flat = flat * n + i as u64;
    }
    Some(flat)
}

/// What an SMEM op at `loc` did wrong, for messages.
fn smem_err(d: &Description, op: &Op, message: String) -> PallasError {
    PallasError::Kernel { kernel: d.kernel_name.clone(), message: format!("`{}` at {}: {message}", op.op, op.place()) }
}

/// Runs a scalar SMEM op (`memref.load` binding a var, `memref.store` writing the state) in
/// `env`, whose SMEM state is `state`. Other ops are ignored. `eval_err` maps an evaluation
/// error to the lowering's message.
///
/// # Errors
/// An index outside the ref, or an expression that cannot be evaluated.
pub fn run_scalar_op(
    d: &Description,
    op: &Op,
    env: &dyn Env,
    state: &std::cell::RefCell<SmemState>,
    eval_err: &dyn Fn(crate::expr::EvalError, &str) -> PallasError,
) -> Result<(), PallasError> {
    let is_load = op.op == "memref.load";
    if !is_load && op.op != "memref.store" {
        return Ok(());
    }
    let r = ref_of(op).ok_or_else(|| smem_err(d, op, "names no ref".into()))?;
    let rf = d.refs.get(r).ok_or_else(|| smem_err(d, op, format!("names ref {r}, which the kernel does not have")))?;
    let idx: Vec<i64> = exprs(op, "index")?.iter().map(|e| e.eval(env)).collect::<Result<_, _>>().map_err(|e| eval_err(e, &format!("the index of `{}`", op.op)))?;
    let shape = if rf.shape.is_empty() { vec![1] } else { rf.shape.clone() };
    let idx = if idx.is_empty() { vec![0; shape.len()] } else { idx };
    let flat = flat_index(&shape, &idx).ok_or_else(|| smem_err(d, op, format!("index {idx:?} is outside `{}` (shape {:?})", rf.name, shape)))?;
    if is_load {
        match env.load(r, &idx) {
            Ok(v) => {
                let mut st = state.borrow_mut();
                st.vars.insert(op.id, v);
                st.unwritten.remove(&op.id);
            }
            // Scratch starts undefined: a load before the kernel's first store of that element
            // binds no value, and only a use of it is an error.
            Err(crate::expr::EvalError::Runtime(_)) if rf.kind == RefKind::Scratch => {
                let mut st = state.borrow_mut();
                st.vars.remove(&op.id);
                st.unwritten.insert(op.id, format!("element {idx:?} of SMEM scratch `{}` before the kernel writes it (at {})", rf.name, op.loc));
            }
            Err(e) => return Err(eval_err(e, &format!("the SMEM load of `{}`", rf.name))),
        }
    } else {
        let parsed = op.attr_exprs("value")?.ok_or_else(|| smem_err(d, op, "has no `value`".into()))?;
        let e = &parsed[0];
        let v = e.eval(env).map_err(|x| eval_err(x, &format!("the value stored to `{}`", rf.name)))?;
        state.borrow_mut().written.insert((r, flat), v);
    }
    Ok(())
}

/// Checks a `tpu.enqueue_dma`'s source window against its source array when the op names it
/// (`src_ref`, `src_offsets`, `src_shape` attributes); returns the window's bytes in this step
/// (`None` when the op names no source).
///
/// # Errors
/// [`PallasError::Kernel`] naming the source ref, the offsets and the array's shape when the
/// window leaves the array (a page-table entry out of range) or is longer than it (the array's
/// two minor dimensions taken in whole tiles of its layout), or a size is negative.
pub fn check_dma_source(d: &Description, op: &Op, env: &dyn Env, eval_err: &dyn Fn(crate::expr::EvalError, &str) -> PallasError) -> Result<Option<u64>, PallasError> {
    let Some(r) = op.attrs.get("src_ref").and_then(|x| x.as_u64()) else { return Ok(None) };
    let Some(rf) = d.refs.get(r as usize) else { return Ok(None) };
    let offs: Vec<i64> = exprs(op, "src_offsets")?.iter().map(|e| e.eval(env)).collect::<Result<_, _>>().map_err(|e| eval_err(e, "the source offsets of a `tpu.enqueue_dma`"))?;
    // The window: whole numbers, or expressions for dimensions a slice sizes at run time.
    let sizes: Vec<i64> = exprs(op, "src_shape")?.iter().map(|e| e.eval(env)).collect::<Result<_, _>>().map_err(|e| eval_err(e, "the source window of a `tpu.enqueue_dma`"))?;
    if let Some(&n) = sizes.iter().find(|&&n| n < 0) {
        return Err(smem_err(d, op, format!("copies a window of `{}` sized {sizes:?} in this step: a size must be 0 or more (its size operand holds {n})", rf.name)));
    }
    let win: Vec<u64> = sizes.iter().map(|&n| n as u64).collect();
    let array = rf.array_shape.clone().unwrap_or_else(|| rf.shape.clone());
    let elem = crate::desc::dtype_bytes(&rf.dtype, "dtype")?;
    // Memory holds an array in whole tiles of its two minor dimensions (128 lanes; 8 rows of
    // 32-bit data, 16 of 16-bit, 32 of 8-bit), so a window may reach into its last tile's
    // padding: `pltpu.emit_pipeline` copies an edge block rounded up to the tiling (a block of
    // 2944 columns of a 2880-column array copies 2944).
    let rows = tpusim_model::dtype::Dtype::of_bytes(elem).unwrap_or(tpusim_model::dtype::Dtype::F32).tile_rows();
    let tiled = |k: usize, n: u64| match array.len() - k {
        1 => n.next_multiple_of(tpusim_model::vmem::LANES),
        2 => n.next_multiple_of(rows),
        _ => n,
    };
    for (k, &o) in offs.iter().enumerate() {
        let n = array.get(k).map_or(1, |&n| tiled(k, n));
        let w = win.get(k).copied().unwrap_or(1);
        if w > n {
            return Err(smem_err(
                d,
                op,
                format!("copies a window {win:?} of `{}`, longer than its shape {array:?} in dimension {k} ({w} > {n}): a length or size operand holds a value out of range", rf.name),
            ));
        }
        if o < 0 || o as u64 + w > n {
            return Err(smem_err(
                d,
                op,
                format!(
                    "copies `{}` at offsets {offs:?} (window {win:?}), outside its shape {array:?} in dimension {k} (offsets allowed 0..={}): a page table or index operand holds an entry out of range",
                    rf.name,
                    n - w
                ),
            ));
        }
    }
    Ok(Some(win.iter().product::<u64>() * elem))
}

/// The bytes a `tpu.enqueue_dma` moves in this step: its `bytes` attribute, a whole number or an
/// expression over the values that size the copy at run time (a `pl.ds(start, size)` slice with a
/// traced size), evaluated in `env`; `window`: the bytes of its source window in this step
/// ([`check_dma_source`]), which they must equal.
///
/// # Errors
/// The reader checked that `bytes` is present and parses ([`Description::from_json`]); an
/// expression that reads a runtime operand not given, or an unknown value, is `eval_err`'s error;
/// a negative size is a [`PallasError::Kernel`] naming the op and its location.
pub fn dma_bytes(d: &Description, op: &Op, env: &dyn Env, window: Option<u64>, eval_err: &dyn Fn(crate::expr::EvalError, &str) -> PallasError) -> Result<u64, PallasError> {
    let at = || format!("{} at {}: attrs.bytes", op.op, op.loc);
    let v = op.attrs.get("bytes").ok_or_else(|| PallasError::field(&at(), "(missing)", "a copy needs its size in bytes"))?;
    // A whole number (most copies) needs no expression parsed per step.
    let b = match v.as_u64() {
        Some(b) => b,
        None => {
            let parsed = op.attr_exprs("bytes")?.ok_or_else(|| PallasError::field(&at(), "(missing)", "a copy needs its size in bytes"))?;
            let e = &parsed[0];
            let what = if op.op == "tpu.enqueue_dma" { "the size of a `tpu.enqueue_dma`".to_string() } else { format!("the bytes a `{}` waits for", op.op) };
            let b = e.eval(env).map_err(|e| eval_err(e, &what))?;
            u64::try_from(b).map_err(|_| {
                if op.op == "tpu.enqueue_dma" {
                    smem_err(d, op, format!("copies {b} bytes in this step (attrs.bytes): a copy's size must be 0 or more (a size operand holds a negative value)"))
                } else {
                    smem_err(d, op, format!("waits for {b} bytes in this step (attrs.bytes): a wait's size must be 0 or more (its destination's size operand holds a negative value)"))
                }
            })?
        }
    };
    match window {
        Some(w) if w != b => Err(smem_err(d, op, format!("copies {b} bytes in this step but its source window (`src_shape`) holds {w} bytes: the two must agree (describe the kernel again with `tpusim.jax.describe`)"))),
        _ => Ok(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_index_checks_bounds() {
        assert_eq!(flat_index(&[2, 4], &[1, 3]), Some(7));
        assert_eq!(flat_index(&[2, 4], &[2, 0]), None);
        assert_eq!(flat_index(&[2, 4], &[0, -1]), None);
    }

    #[test]
    fn tally_counts_sizes_and_steps() {
        let mut step = DmaTally::default();
        step.add(4096);
        step.add(4096);
        step.add(512);
        let mut all = DmaTally::default();
        all.merge_step(&step);
        all.merge_step(&step);
        assert_eq!(all.count, 6);
        assert_eq!(all.bytes, 2 * (8192 + 512));
        assert_eq!(all.sizes[&4096], 4);
        assert_eq!(all.max_per_step, 3);
    }
}
