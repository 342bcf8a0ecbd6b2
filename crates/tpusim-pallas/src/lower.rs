//! A kernel description lowered to the engine's [`Program`].
//!
//! * **Grid.** Steps run in lexicographic order of the grid. Each step's path through the body
//!   (which `scf.if` branches run, how many `scf.for` iterations) is evaluated from the grid
//!   indices and the prefetch tables; each distinct path (with the step's first / last flags) is
//!   one step class, lowered once.
//! * **Pipeline rule (Pallas).** An input window is copied HBM -> VMEM before a step when its
//!   block index differs from the previous step's (the first step copies every window); an
//!   output window is written back after a step when the next step's block index differs (or it
//!   is the last step). Bytes are the block's (block shape x element bytes).
//! * **Copies the kernel starts** (`tpu.enqueue_dma`, `tpu.wait_dma2`) are ops of the step's
//!   body: each copy's size and semaphore are evaluated at the step (they are part of its step
//!   class), and the body builder puts the copy on the DMA engines, overlapping the work after
//!   it until a wait needs it ([`tpusim_model::body`]).
//! * **Megacore.** The grid's leading dimensions marked parallel form the parallel units a
//!   two-core device splits over its TensorCores ([`Program::core_ranges`]).
//! * **Body.** The ops of the path a step class takes are handed, one by one, to the body
//!   builder the hand-written kernels use too ([`tpusim_model::body`]): it prices each vector
//!   op on its unit from one op-cost table ([`tpusim_model::body::cost`]), splits it into
//!   [`tpusim_model::SLAB_ROWS`]-row slabs, gives it issue slots that follow the data flow and
//!   carries the state of refs the body both loads and stores (scratch accumulators, output
//!   blocks accumulated in place) from one step to the next.

use crate::desc::{dtype_bytes, Description, DimSemantics, MemorySpace, Op, Operand, Ref, RefKind, Values};
use crate::expr::{Env, EvalError, Expr};
use crate::runtime::{DmaTally, SmemState};
use crate::PallasError;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use tpusim_chip::ChipModel;
use tpusim_model::copies::{CopyRule, CopySets};
use tpusim_model::decl::{KernelDecl, RefDecl, RefRole, Space};
use tpusim_model::dtype::Dtype;
use tpusim_model::listed::ListedSteps;
use tpusim_model::{ClassKey, KernelKind, Program, ProgramInfo, Step, StepClass, TileCounts, VmemBudget, VmemBuffer};

/// Most `scf.for` iterations lowered per step body (they are unrolled).
pub const MAX_UNROLL: i64 = 4096;

/// Most grid steps a kernel may have (2^28): step generation evaluates every step.
pub const MAX_GRID_STEPS: u64 = 1 << 28;

/// Most distinct step classes (paths through the body).
pub const MAX_CLASSES: usize = 4096;

/// A table's values (a prefetch ref's or an SMEM input's).
#[derive(Debug, Clone)]
enum Table {
    Known { shape: Vec<u64>, values: Vec<i64> },
    Runtime,
}

/// The facts of a lowering that a report shows beside the program.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct IrFacts {
    /// The kernel's name (a label).
    pub kernel_name: String,
    /// Grid steps whose body runs some op with unit time (the IR job's "visited" tiles).
    pub steps_computed: u64,
    /// Grid steps.
    pub grid_steps: u64,
    /// Distinct step classes.
    pub classes: usize,
    /// Bytes of the prefetch tables in SMEM.
    pub smem_bytes: u64,
    /// The assumptions this lowering made for this kernel, for the report.
    pub assumptions: Vec<String>,
    /// The kernel's declared cost estimate, if any.
    pub declared_cost: Option<crate::desc::DeclaredCost>,
    /// The manual DMAs (`tpu.enqueue_dma`) the run issues: count, bytes, sizes, most per step.
    pub dmas: DmaTally,
}

struct Tables<'a> {
    /// By ref index: the prefetch table of that ref, `None` for other refs.
    tables: Vec<Option<Table>>,
    refs: &'a [Ref],
}

impl Tables<'_> {
    fn get(&self, r: usize) -> Option<&Table> {
        self.tables.get(r).and_then(Option::as_ref)
    }
}

struct StepEnv<'a> {
    idx: &'a [i64],
    ivs: Vec<i64>,
    tables: &'a Tables<'a>,
    /// The run's SMEM state (stores and bound loads, [`crate::runtime`]); index maps see none.
    smem: Option<&'a std::cell::RefCell<SmemState>>,
}

impl Env for StepEnv<'_> {
    fn grid(&self, d: usize) -> i64 {
        self.idx.get(d).copied().unwrap_or(0)
    }
    fn iv(&self, d: usize) -> Option<i64> {
        self.ivs.get(d).copied()
    }
    fn var(&self, id: u64) -> Option<i64> {
        self.smem.and_then(|s| s.borrow().vars.get(&id).copied())
    }
    fn unbound(&self, id: u64) -> Option<String> {
        self.smem.and_then(|s| s.borrow().unwritten.get(&id).cloned())
    }
    fn load(&self, r: usize, idx: &[i64]) -> Result<i64, EvalError> {
        if let Some(s) = self.smem {
            let s = s.borrow();
            if !s.written.is_empty() {
                let shape = match self.tables.get(r) {
                    Some(Table::Known { shape, .. }) => shape.clone(),
                    _ => self.tables.refs.get(r).map(|x| x.shape.clone()).unwrap_or_default(),
                };
                if let Some(v) = crate::runtime::flat_index(&shape, idx).and_then(|f| s.written.get(&(r, f))) {
                    return Ok(*v);
                }
            }
        }
        match self.tables.get(r) {
            Some(Table::Known { shape, values }) => {
                if idx.len() != shape.len() {
                    return Err(EvalError::OutOfBounds(r, idx.to_vec()));
                }
                let mut flat = 0u64;
                for (&i, &n) in idx.iter().zip(shape) {
                    if i < 0 || i as u64 >= n {
                        return Err(EvalError::OutOfBounds(r, idx.to_vec()));
                    }
                    flat = flat * n + i as u64;
                }
                Ok(values[flat as usize])
            }
            Some(Table::Runtime) => Err(EvalError::Runtime(r)),
            None => {
                let _ = self.tables.refs;
                Err(EvalError::Runtime(r))
            }
        }
    }
}

fn read_table(r: &Ref, i: usize, dir: &Path) -> Result<Table, PallasError> {
    let field = format!("refs[{i}] ({}).values", r.name);
    match r.values.as_ref() {
        Some(Values::Inline(v)) => {
            let n: u64 = r.shape.iter().product();
            if v.len() as u64 != n {
                return Err(PallasError::field(&field, format!("{} values", v.len()), format!("expected {n} (shape {:?})", r.shape)));
            }
            Ok(Table::Known { shape: r.shape.clone(), values: v.clone() })
        }
        Some(Values::File(f)) => {
            let path = dir.join(f);
            let (shape, values) = crate::npy::read_int_array(&path)?;
            if shape != r.shape {
                return Err(PallasError::field(&field, format!("{} of shape {shape:?}", path.display()), format!("expected shape {:?}", r.shape)));
            }
            Ok(Table::Known { shape, values })
        }
        Some(Values::Runtime(_)) => Ok(Table::Runtime),
        None => Err(PallasError::field(&field, "(missing)", "a table needs its values")),
    }
}

/// The message of an evaluation error at `loc` of `what`.
fn eval_err(d: &Description, e: EvalError, what: &str, loc: &str) -> PallasError {
    let at = if loc.is_empty() { String::new() } else { format!(" at {loc}") };
    let message = match e {
        EvalError::Unknown(why) => format!(
            "{what}{at} reads {why}, a value the simulator does not evaluate (it evaluates integer constants, grid and loop indices, scalar-prefetch arguments and SMEM scalars): it cannot tell which steps take which path (pass the value as a scalar-prefetch argument of the pallas_call)"
        ),
        EvalError::Runtime(r) if d.refs.get(r).is_some_and(|x| x.values.is_none()) => {
            let name = d.refs.get(r).map(|x| x.name.as_str()).unwrap_or("?");
            format!(
                "{what}{at} reads `{name}`, whose values the description does not hold (only a prefetch table's or an SMEM input's are): describe the kernel again with `tpusim.jax.describe` and concrete arguments"
            )
        }
        EvalError::Runtime(r) => {
            let name = d.refs.get(r).map(|x| x.name.as_str()).unwrap_or("?");
            let given = match d.refs.get(r).and_then(|x| x.values.as_ref()) {
                Some(Values::Runtime(n)) => n.as_str(),
                _ => name,
            };
            format!("{what}{at} reads the runtime operand `{given}` ({name}), whose values were not given: pass a concrete array for it (Python: `tpusim.jax.describe` then writes its values into the description, which `tpusim sweep` can run) or `--runtime {given}=FILE.npy` (`tpusim run`)")
        }
        EvalError::OutOfBounds(r, idx) => {
            let name = d.refs.get(r).map(|x| x.name.as_str()).unwrap_or("?");
            format!("{what}{at} reads the table `{name}` at {idx:?}, outside its shape")
        }
        EvalError::Invalid(m) => format!("{what}{at}: {m}"),
    };
    PallasError::Kernel { kernel: d.kernel_name.clone(), message }
}

/// The ops [`walk_path`] reads - control flow, manual DMAs, SMEM scalar loads and stores - with
/// every other op dropped: the path is walked once per grid step (millions of steps), so the
/// body's vector ops are not visited at each.
fn path_skeleton(ops: &[Op]) -> Vec<Op> {
    ops.iter()
        .filter_map(|op| match op.op.as_str() {
            "scf.if" | "scf.for" | "scf.while" => Some(Op {
                id: op.id,
                op: op.op.clone(),
                shape: op.shape.clone(),
                dtype: op.dtype.clone(),
                operands: op.operands.clone(),
                loc: op.loc.clone(),
                attrs: op.attrs.clone(),
                cond: op.cond.clone(),
                then: path_skeleton(&op.then),
                otherwise: path_skeleton(&op.otherwise),
                lower: op.lower.clone(),
                upper: op.upper.clone(),
                step: op.step.clone(),
                parsed: op.parsed.clone(),
            }),
            "tpu.enqueue_dma" | "tpu.wait_dma" | "tpu.wait_dma2" | "memref.load" | "memref.store" => Some(op.clone()),
            _ => None,
        })
        .collect()
}

/// Per step: its path through the body (branch decisions, loop trip counts) and the manual
/// DMA bytes on it.
fn walk_path(d: &Description, ops: &[Op], env: &mut StepEnv<'_>, key: &mut Vec<i64>, dma: &mut DmaTally) -> Result<(), PallasError> {
    for op in ops {
        match op.op.as_str() {
            "scf.if" => {
                let c = op.cond.as_ref().ok_or_else(|| missing_cond(d, op))?;
                let v = c.eval(env).map_err(|e| eval_err(d, e, "the `scf.if` condition", &op.loc))?;
                key.push(i64::from(v != 0));
                walk_path(d, if v != 0 { &op.then } else { &op.otherwise }, env, key, dma)?;
            }
            "scf.for" => {
                let mut trips = 0;
                run_for(d, op, env, &mut |ops, env, _| walk_path(d, ops, env, key, dma), &mut trips)?;
                key.push(trips);
            }
            "scf.while" => {
                let mut trips = 0;
                run_while(d, op, env, &mut |ops, env, _| walk_path(d, ops, env, key, dma), &mut trips)?;
                key.push(trips);
            }
            "tpu.enqueue_dma" | "tpu.wait_dma" | "tpu.wait_dma2" => {
                let (bytes, sem) = copy_facts(d, op, env)?;
                if op.op == "tpu.enqueue_dma" {
                    dma.add(bytes.unwrap_or(0));
                }
                // A copy's size and semaphore shape the step's body: part of its class.
                key.push(bytes.map_or(-1, |b| b as i64));
                key.extend(sem.iter().flatten());
            }
            "memref.load" | "memref.store" => {
                if let Some(s) = env.smem {
                    crate::runtime::run_scalar_op(d, op, env, s, &|e, what| eval_err(d, e, what, &op.loc))?;
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// A copy's or wait's facts at this step: its bytes (a copy's always; a wait's when it names
/// them) and its semaphore (ref index, then element indices) when the description names it.
fn copy_facts(d: &Description, op: &Op, env: &StepEnv<'_>) -> Result<(Option<u64>, Option<Vec<i64>>), PallasError> {
    let err = |e, what: &str| eval_err(d, e, what, &op.loc);
    let bytes = if op.op == "tpu.enqueue_dma" {
        let window = crate::runtime::check_dma_source(d, op, env, &err)?;
        Some(crate::runtime::dma_bytes(d, op, env, window, &err)?)
    } else if op.attrs.contains_key("bytes") {
        Some(crate::runtime::dma_bytes(d, op, env, None, &err)?)
    } else {
        None
    };
    // A ref's semaphores are keyed from 0 up, those the body allocates from -1 down.
    let base = match (op.attrs.get("sem_ref").and_then(|x| x.as_u64()), op.attrs.get("sem_alloc").and_then(|x| x.as_u64())) {
        (Some(r), _) => Some(r as i64),
        (None, Some(a)) => Some(-1 - a as i64),
        (None, None) => None,
    };
    let sem = match base {
        Some(b) => {
            let mut k = vec![b];
            for e in crate::runtime::exprs(op, "sem_offsets")?.iter() {
                k.push(e.eval(env).map_err(|x| err(x, &format!("the semaphore index of the `{}`", op.op)))?);
            }
            // A ref's semaphore array bounds its indices (an allocation's shape is not in the
            // description).
            if let Some(rf) = usize::try_from(b).ok().and_then(|r| d.refs.get(r)) {
                for (j, (&i, &n)) in k[1..].iter().zip(&rf.shape).enumerate() {
                    if i < 0 || i as u64 >= n {
                        return Err(kernel_err(
                            d,
                            op,
                            format!("attrs.sem_offsets[{j}] = {i} in this step: outside the semaphore array `{}` of shape {:?} (indices 0 to {})", rf.name, rf.shape, n.saturating_sub(1)),
                        ));
                    }
                }
            }
            Some(k)
        }
        None => None,
    };
    Ok((bytes, sem))
}

/// A loop's scalar loop-carried values (`attrs`: `carried` variable ids set from `init` and
/// then from each iteration's `yield`; `scf.while`: the before region's `forward` values bound to
/// the body's `args`; `results` bound to the final values).
#[derive(Default)]
struct LoopVars {
    carried: Vec<u64>,
    init: std::sync::Arc<Vec<Expr>>,
    forward: std::sync::Arc<Vec<Expr>>,
    args: Vec<u64>,
    yields: std::sync::Arc<Vec<Expr>>,
    results: Vec<u64>,
}

fn loop_vars(op: &Op) -> Result<LoopVars, PallasError> {
    let ids = |k: &str| -> Vec<u64> { op.attrs.get(k).and_then(|v| v.as_array()).map(|a| a.iter().filter_map(|x| x.as_u64()).collect()).unwrap_or_default() };
    let exprs = |k: &str| crate::runtime::exprs(op, k);
    let lv = LoopVars { carried: ids("carried"), init: exprs("init")?, forward: exprs("forward")?, args: ids("args"), yields: exprs("yield")?, results: ids("results") };
    if lv.init.len() != lv.carried.len() || lv.yields.len() != lv.carried.len() {
        return Err(PallasError::field(&format!("{} at {}: attrs", op.op, op.loc), format!("{} carried, {} init, {} yield", lv.carried.len(), lv.init.len(), lv.yields.len()), "expected one init and one yield per carried value"));
    }
    Ok(lv)
}

/// A loop-carried scalar: its value, or why the simulator has none (a float, a value computed
/// at run time), which is an error only where control flow, an index or a copy size reads it.
type Carried = Result<i64, String>;

/// The values of a loop's carried scalars, forwarded values or yields. One the simulator does
/// not evaluate ([`EvalError::Unknown`]: a float accumulator, say) is kept as the reason, so a
/// loop that carries it runs and only a use that steers the path is refused, naming the loop;
/// any other evaluation error is refused here.
fn eval_list(d: &Description, op: &Op, env: &StepEnv<'_>, es: &[Expr], what: &str) -> Result<Vec<Carried>, PallasError> {
    es.iter()
        .map(|e| match e.eval(env) {
            Ok(v) => Ok(Ok(v)),
            Err(EvalError::Unknown(why)) => {
                let at = if op.loc.is_empty() { String::new() } else { format!(" at {}", op.loc) };
                Ok(Err(if why.contains(" carried by the `") { why } else { format!("{why}, carried by the `{}`{at}", op.op) }))
            }
            Err(x) => Err(eval_err(d, x, &format!("the {what} of the `{}`", op.op), &op.loc)),
        })
        .collect()
}

fn set_vars(env: &StepEnv<'_>, ids: &[u64], vals: &[Carried]) {
    if let Some(s) = env.smem {
        let mut s = s.borrow_mut();
        for (&i, v) in ids.iter().zip(vals) {
            match v {
                Ok(v) => {
                    s.vars.insert(i, *v);
                    s.unwritten.remove(&i);
                }
                Err(why) => {
                    s.vars.remove(&i);
                    s.unwritten.insert(i, why.clone());
                }
            }
        }
    }
}

/// A region walker: (ops, env, whether it is a loop body).
type Region<'r> = dyn FnMut(&[Op], &mut StepEnv<'_>, bool) -> Result<(), PallasError> + 'r;

/// Runs an `scf.for` (with its scalar loop-carried values); `trips` gets the trip count.
fn run_for(d: &Description, op: &Op, env: &mut StepEnv<'_>, region: &mut Region<'_>, trips: &mut i64) -> Result<(), PallasError> {
    let (lo, hi, st) = for_bounds(d, op, env)?;
    *trips = trip(lo, hi, st);
    let lv = loop_vars(op)?;
    let mut cur = eval_list(d, op, env, &lv.init, "initial values")?;
    set_vars(env, &lv.carried, &cur);
    let mut i = lo;
    while i < hi {
        env.ivs.push(i);
        region(&op.then, env, true)?;
        cur = eval_list(d, op, env, &lv.yields, "yielded values")?;
        env.ivs.pop();
        set_vars(env, &lv.carried, &cur);
        // The trip count is at most MAX_UNROLL (checked), so this only stops at the top of i64.
        match i.checked_add(st) {
            Some(n) => i = n,
            None => break,
        }
    }
    set_vars(env, &lv.results, &cur);
    Ok(())
}

/// Runs an `scf.while`: the before region (`else`) and the condition, then the body (`then`)
/// while it holds, at most [`MAX_UNROLL`] times; `trips` gets the body's trip count.
fn run_while(d: &Description, op: &Op, env: &mut StepEnv<'_>, region: &mut Region<'_>, trips: &mut i64) -> Result<(), PallasError> {
    let lv = loop_vars(op)?;
    let c = op.cond.as_ref().ok_or_else(|| missing_cond(d, op))?;
    let cur = eval_list(d, op, env, &lv.init, "initial values")?;
    set_vars(env, &lv.carried, &cur);
    *trips = 0;
    loop {
        region(&op.otherwise, env, false)?;
        let go = c.eval(env).map_err(|e| eval_err(d, e, "the `scf.while` condition", &op.loc))?;
        let fwd = eval_list(d, op, env, &lv.forward, "forwarded values")?;
        if go == 0 {
            set_vars(env, &lv.results, &fwd);
            return Ok(());
        }
        if *trips >= MAX_UNROLL {
            return Err(PallasError::Kernel {
                kernel: d.kernel_name.clone(),
                message: format!("the `scf.while` at {} runs more than {MAX_UNROLL} iterations per step (they are unrolled): use fewer, larger iterations", op.loc),
            });
        }
        set_vars(env, &lv.args, &fwd);
        region(&op.then, env, true)?;
        let next = eval_list(d, op, env, &lv.yields, "yielded values")?;
        set_vars(env, &lv.carried, &next);
        *trips += 1;
    }
}

fn trip(lo: i64, hi: i64, st: i64) -> i64 {
    if hi <= lo {
        0
    } else {
        // In 128 bits: the span of two 64-bit bounds does not fit 64 (saturated: only compared
        // with the unroll limit).
        let n = (i128::from(hi) - i128::from(lo) + i128::from(st) - 1) / i128::from(st);
        i64::try_from(n).unwrap_or(i64::MAX)
    }
}

fn for_bounds(d: &Description, op: &Op, env: &StepEnv<'_>) -> Result<(i64, i64, i64), PallasError> {
    let get = |e: &Option<Expr>, name: &str| -> Result<i64, PallasError> {
        let e = e.as_ref().ok_or_else(|| PallasError::field(&format!("scf.for.{name}"), "(missing)", "a loop needs its bounds"))?;
        e.eval(env).map_err(|x| eval_err(d, x, &format!("the `scf.for` {name} bound"), &op.loc))
    };
    let (lo, hi, st) = (get(&op.lower, "lower")?, get(&op.upper, "upper")?, get(&op.step, "step")?);
    if st <= 0 {
        return Err(PallasError::Kernel { kernel: d.kernel_name.clone(), message: format!("the `scf.for` at {} has step {st}: expected a positive step", op.loc) });
    }
    if trip(lo, hi, st) > MAX_UNROLL {
        return Err(PallasError::Kernel {
            kernel: d.kernel_name.clone(),
            message: format!(
                "the `scf.for` at {} runs {} iterations per step; at most {MAX_UNROLL} are lowered (they are unrolled): use fewer, larger iterations",
                op.loc,
                trip(lo, hi, st)
            ),
        });
    }
    Ok((lo, hi, st))
}

/// Walks a step's path through the body (control flow evaluated at the step), feeding its ops
/// to the kernel crate's one body builder ([`tpusim_model::body::Builder`]).
struct Walker<'a> {
    d: &'a Description,
    b: tpusim_model::body::Builder,
    /// The transposes the compiler folds into their matmul ([`canonicalized`]).
    folded: &'a HashSet<u64>,
    /// The loads nothing uses ([`canonicalized`]).
    dead: &'a HashSet<u64>,
}

/// The transposes Mosaic's canonicalization folds into the matmul that reads them (jax
/// `jaxlib/mosaic/dialect/tpu/transforms/canonicalize_mosaic.cc`, `canonicalize_matmul`): a
/// `tpu.transpose` or `vector.transpose` that swaps the two minor dimensions and keeps the
/// others (its `permutation`; a rank-2 one without it can only swap them) and whose one use in
/// the whole body is a `tpu.matmul`'s rhs becomes that matmul's transposed rhs and is erased;
/// not where the product is an f32 x f32 matrix-vector one with the rhs contracted along its
/// last dimension (`rhs_contracting`), which Mosaic leaves as it is. A description is written
/// before that pass (`tpusim.jax.describe` reads the kernel as lowered), so the reader applies
/// it. By op id; second, the loads whose result nothing uses (a store through a slice of a ref
/// reads the old window first), which Mosaic erases, so they shift nothing ([`body_op`]'s
/// offsets).
fn canonicalized(d: &Description) -> (HashSet<u64>, HashSet<u64>) {
    /// Per value id: how many uses, and whether the last is a matmul's (its id, operand index).
    type Uses = HashMap<u64, (u32, Option<(u64, usize)>)>;
    fn scan<'o>(ops: &'o [Op], uses: &mut Uses, by_id: &mut HashMap<u64, &'o Op>) {
        for op in ops {
            by_id.insert(op.id, op);
            for (i, o) in op.operands.iter().enumerate() {
                if let Operand::Op(id) = o {
                    let u = uses.entry(*id).or_insert((0, None));
                    u.0 += 1;
                    u.1 = (op.op == "tpu.matmul").then_some((op.id, i));
                }
            }
            // Loop-carried initial values and forwarded values are uses too.
            for key in ["args", "forward"] {
                for id in op.attrs.get(key).and_then(|v| v.as_array()).into_iter().flatten().filter_map(serde_json::Value::as_u64) {
                    uses.entry(id).or_insert((0, None)).0 += 1;
                }
            }
            scan(&op.then, uses, by_id);
            scan(&op.otherwise, uses, by_id);
        }
    }
    let mut uses = HashMap::new();
    let mut by_id = HashMap::new();
    scan(&d.body, &mut uses, &mut by_id);
    let dead = by_id.iter().filter(|(id, op)| matches!(op.op.as_str(), "vector.load" | "tpu.load") && !uses.contains_key(*id)).map(|(&id, _)| id).collect();
    let mut out = HashSet::new();
    for (&id, op) in &by_id {
        if !matches!(op.op.as_str(), "tpu.transpose" | "vector.transpose") {
            continue;
        }
        let Some(&(1, Some((mm, 1)))) = uses.get(&id) else { continue };
        let src = match op.operands.first() {
            Some(Operand::Op(s)) => by_id.get(s).map(|o| &o.shape),
            _ => None,
        };
        let r = op.shape.len();
        let ints = |o: &Op, k: &str| -> Option<Vec<u64>> { o.attrs.get(k)?.as_array()?.iter().map(serde_json::Value::as_u64).collect() };
        let swap: Vec<u64> = (0..r as u64).map(|i| if r >= 2 && i + 2 >= r as u64 { 2 * r as u64 - 3 - i } else { i }).collect();
        let permutation_ok = match ints(op, "permutation") {
            Some(p) => p == swap,
            None => r == 2,
        };
        let minor_swap = permutation_ok && src.is_some_and(|s| r >= 2 && s.len() == r && s[..r - 2] == op.shape[..r - 2] && s[r - 2] == op.shape[r - 1] && s[r - 1] == op.shape[r - 2]);
        let matvec_f32 = by_id.get(&mm).is_some_and(|m| {
            let t = |k: &str| m.attrs.get(k).and_then(|x| x.as_str()) == Some("f32");
            let n = m.attrs.get("mkn").and_then(|v| v.get(2)).and_then(|x| x.as_u64());
            let contracted_last = ints(m, "rhs_contracting").is_some_and(|c| c == [r as u64 - 1]);
            t("lhs_dtype") && t("rhs_dtype") && n == Some(1) && contracted_last
        });
        if minor_swap && !matvec_f32 {
            out.insert(id);
        }
    }
    (out, dead)
}

/// A description op as the body builder reads it.
fn body_op(d: &Description, op: &Op) -> Result<tpusim_model::body::BodyOp, PallasError> {
    use tpusim_model::body::{Arg, Attrs, BodyOp};
    let ints = |k: &str| -> Vec<u64> { op.attrs.get(k).and_then(|v| v.as_array()).map(|a| a.iter().filter_map(|x| x.as_u64()).collect()).unwrap_or_default() };
    let text = |k: &str| op.attrs.get(k).and_then(|x| x.as_str()).map(str::to_string);
    let mkn = match op.attrs.get("mkn") {
        None => None,
        Some(v) => match ints("mkn")[..] {
            [m, k, n] if v.as_array().is_some_and(|a| a.len() == 3) => Some([m, k, n]),
            _ => {
                return Err(kernel_err(d, op, format!("a matmul's `mkn` attribute = {v}: expected three whole numbers (rows, contraction, columns)")));
            }
        },
    };
    if !op.dtype.is_empty() {
        dtype_bytes(&op.dtype, &format!("{} at {}: dtype", op.op, op.loc))?;
    }
    let attrs = Attrs {
        dims: ints("dims"),
        dimension: op.attrs.get("dimension").and_then(|x| x.as_u64()),
        offsets: match op.op.as_str() {
            // A load or store at constant indices: where its window starts (the indices after
            // the ref); one at indices computed at run time is taken as aligned.
            "vector.load" | "tpu.load" | "vector.store" | "tpu.vector_store" => {
                let at = op.operands.iter().skip_while(|o| !matches!(o, Operand::Ref(_))).skip(1);
                at.map(|o| match o {
                    Operand::Scalar(crate::expr::Expr::Const(c)) => u64::try_from(*c).ok(),
                    _ => None,
                })
                .collect::<Option<Vec<u64>>>()
                .unwrap_or_default()
            }
            _ => ints("offsets"),
        },
        mkn,
        batch: op.attrs.get("batch").and_then(|b| b.as_u64()),
        lhs_dtype: text("lhs_dtype"),
        rhs_dtype: text("rhs_dtype"),
        precision: text("precision"),
        // A copy's bytes and semaphore are evaluated at the step ([`copy_facts`]).
        bytes: None,
        semaphore: None,
        dma_path: (op.op == "tpu.enqueue_dma").then(|| crate::desc::dma_path(op, &d.refs)),
        // Decided from the op's uses in the whole body ([`canonicalized`]).
        folded: false,
    };
    let args = op
        .operands
        .iter()
        .map(|o| match o {
            Operand::Op(id) => Arg::Op(*id),
            Operand::Ref(r) => Arg::Ref(*r),
            Operand::Scalar(_) | Operand::Other => Arg::Scalar,
        })
        .collect();
    Ok(BodyOp { id: op.id, name: op.op.clone(), shape: op.shape.clone(), dtype: op.dtype.clone(), args, attrs, loc: op.loc.clone() })
}

/// A branch or while loop without its condition (the reader refuses such a file first:
/// [`Description::from_json`]).
fn missing_cond(d: &Description, op: &Op) -> PallasError {
    kernel_err(d, op, "`cond` (missing): a branch or while loop needs its condition; describe the kernel again with `tpusim.jax.describe`".into())
}

fn kernel_err(d: &Description, op: &Op, message: String) -> PallasError {
    PallasError::Kernel { kernel: d.kernel_name.clone(), message: format!("`{}` at {}: {message}", op.op, op.place()) }
}

impl Walker<'_> {
    fn walk(&mut self, ops: &[Op], env: &mut StepEnv<'_>) -> Result<(), PallasError> {
        for op in ops {
            match op.op.as_str() {
                "scf.if" => {
                    let c = op.cond.as_ref().expect("checked by walk_path");
                    let v = c.eval(env).map_err(|e| eval_err(self.d, e, "the `scf.if` condition", &op.loc))?;
                    let region = if v != 0 { &op.then } else { &op.otherwise };
                    self.walk(region, env)?;
                    self.bind_results(region);
                }
                "scf.for" | "scf.while" => {
                    let d = self.d;
                    let mut trips = 0;
                    let mut region = |ops: &[Op], env: &mut StepEnv<'_>, body: bool| -> Result<(), PallasError> {
                        self.walk(ops, env)?;
                        if body {
                            // The next iteration's slabs issue after this one's (slab-major order).
                            let slabs = ops.iter().map(|o| tpusim_model::body::slabs_of(&o.shape)).max().unwrap_or(1);
                            self.b.advance(slabs);
                        }
                        Ok(())
                    };
                    if op.op == "scf.for" {
                        run_for(d, op, env, &mut region, &mut trips)?;
                    } else {
                        run_while(d, op, env, &mut region, &mut trips)?;
                    }
                    self.bind_results(&op.then);
                }
                "scf.yield" | "func.return" => {}
                "memref.load" | "memref.store" => {
                    if let Some(s) = env.smem {
                        let d = self.d;
                        crate::runtime::run_scalar_op(d, op, env, s, &|e, what| eval_err(d, e, what, &op.loc))?;
                    }
                }
                "tpu.enqueue_dma" | "tpu.wait_dma" | "tpu.wait_dma2" => {
                    let mut bop = body_op(self.d, op)?;
                    (bop.attrs.bytes, bop.attrs.semaphore) = copy_facts(self.d, op, env)?;
                    self.b.op(&bop).map_err(|e| kernel_err(self.d, op, e.0))?;
                }
                _ => {
                    let mut bop = body_op(self.d, op)?;
                    bop.attrs.folded = self.folded.contains(&op.id);
                    if self.dead.contains(&op.id) {
                        bop.attrs.offsets.clear();
                    }
                    self.b.op(&bop).map_err(|e| kernel_err(self.d, op, e.0))?;
                }
            }
        }
        Ok(())
    }

    /// Results of a region op take the values its region yields (the `then` region's yield).
    fn bind_results(&mut self, region: &[Op]) {
        if let Some(y) = region.iter().rev().find(|o| o.op == "scf.yield") {
            let ids: Vec<u64> = y.attrs.get("results").and_then(|r| r.as_array()).map(|a| a.iter().filter_map(|x| x.as_u64()).collect()).unwrap_or_default();
            for (k, o) in y.operands.iter().enumerate() {
                if let (Operand::Op(from), Some(id)) = (o, ids.get(k)) {
                    self.b.bind(*id, &tpusim_model::body::Arg::Op(*from));
                }
            }
        }
    }
}

/// Whether the body stores to SMEM (`memref.store`): then its SMEM state is carried from step
/// to step ([`crate::runtime`]).
fn stores_smem(ops: &[Op]) -> bool {
    ops.iter().any(|o| o.op == "memref.store" || stores_smem(&o.then) || stores_smem(&o.otherwise))
}

/// Which refs the body both loads and stores (carried across steps).
fn carried_refs(d: &Description) -> Vec<bool> {
    fn visit<'a>(ops: &'a [Op], out: &mut Vec<(&'a str, Option<usize>)>) {
        for op in ops {
            let r = op.operands.iter().find_map(|o| match o {
                Operand::Ref(r) => Some(*r),
                _ => None,
            });
            out.push((op.op.as_str(), r));
            visit(&op.then, out);
            visit(&op.otherwise, out);
        }
    }
    let mut ops = Vec::new();
    visit(&d.body, &mut ops);
    tpusim_model::body::carried_refs(d.refs.len(), ops)
}

/// The kernel's `pallas_call` as a declaration ([`tpusim_model::decl`]): its grid, leading
/// parallel dimensions and refs in the description's order, each with its role, block, element
/// type, memory space, pipeline buffers, array and index map, and whether the body carries it
/// (loads and stores it).
///
/// # Errors
/// [`PallasError::Field`] for an element type the description may not name.
fn declaration(d: &Description) -> Result<KernelDecl, PallasError> {
    let carried = carried_refs(d);
    let lead_par = d.dimension_semantics.iter().take_while(|s| matches!(s, DimSemantics::Parallel | DimSemantics::CoreParallel)).count();
    let refs = d
        .refs
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let elem_bytes = dtype_bytes(&r.dtype, &format!("refs[{i}] ({}).dtype", r.name))?;
            let windowed = matches!(r.kind, RefKind::Input | RefKind::Output);
            Ok(RefDecl {
                name: r.name.clone(),
                role: match r.kind {
                    RefKind::Prefetch => RefRole::Prefetch,
                    RefKind::Input => RefRole::Input,
                    RefKind::Output => RefRole::Output,
                    RefKind::Scratch => RefRole::Scratch,
                },
                block: r.shape.clone(),
                // The element type by its name where the model knows it (i32, bf16, fp8, ...),
                // else a type of its width (VMEM tiles by width alone).
                dtype: r.dtype.to_lowercase().parse::<Dtype>().ok().filter(|t| t.bytes() == elem_bytes).or_else(|| Dtype::of_bytes(elem_bytes)).unwrap_or(Dtype::F32),
                elem_bytes,
                space: match r.memory_space {
                    MemorySpace::Vmem => Space::Vmem,
                    MemorySpace::Smem => Space::Smem,
                    MemorySpace::Any => Space::Any,
                    MemorySpace::Semaphore => Space::Semaphore,
                },
                buffers: match r.kind {
                    _ if r.memory_space == MemorySpace::Any => 0,
                    RefKind::Input | RefKind::Output => r.pipeline_mode.buffers() as u32,
                    RefKind::Scratch => 1,
                    RefKind::Prefetch => 0,
                },
                array: r.array_shape.clone(),
                index_map: r.index_map.clone().filter(|_| windowed && r.memory_space != MemorySpace::Any),
                carried: carried.get(i).copied().unwrap_or(false),
            })
        })
        .collect::<Result<Vec<_>, PallasError>>()?;
    Ok(KernelDecl { grid: d.grid.clone(), parallel_dims: lead_par, refs, internal: Vec::new() })
}

/// Checks that the kernel's HBM operands (its inputs and outputs outside VMEM and SMEM: the
/// arrays its windows are cut from, and `ANY` refs whole) fit the device's HBM.
///
/// # Errors
/// [`PallasError::Field`] naming the bytes needed and the device's capacity.
fn check_hbm(chip: &ChipModel, d: &Description) -> Result<(), PallasError> {
    let mut need: u128 = 0;
    for r in d.refs.iter().filter(|r| matches!(r.kind, RefKind::Input | RefKind::Output) && r.memory_space != MemorySpace::Smem) {
        let shape = r.array_shape.as_ref().unwrap_or(&r.shape);
        need += shape.iter().map(|&x| u128::from(x)).product::<u128>() * u128::from(dtype_bytes(&r.dtype, "dtype")?);
    }
    let cap = u128::from(chip.hbm_capacity_bytes());
    if need > cap {
        return Err(PallasError::field(
            "refs (the kernel's HBM operands)",
            format!("{need} bytes"),
            format!("the device holds {cap} bytes ({} GiB of HBM): use smaller arrays", chip.hbm.capacity_gib.value),
        ));
    }
    Ok(())
}

/// Mosaic's block rule for a VMEM window (JAX Pallas TPU docs, "BlockSpecs and grid
/// iteration"): the block's last dimension is a multiple of the chip's lanes (128) and its
/// second-to-last a multiple of its sublanes (8), unless it equals the array's dimension; a
/// dimension of 1 is a squeezed one (`None` in the BlockSpec) and always allowed. A description
/// that `tpusim.jax` wrote always holds it (Mosaic refused anything else); a hand-edited one may
/// not.
///
/// # Errors
/// [`PallasError::Field`] naming the ref's `shape`, the value and the rule.
fn check_block_shapes(chip: &ChipModel, d: &Description) -> Result<(), PallasError> {
    let (sub, lanes) = (chip.vpu.sublanes.value as u64, chip.vpu.lanes.value as u64);
    for (i, r) in d.refs.iter().enumerate() {
        let windowed = matches!(r.kind, RefKind::Input | RefKind::Output) && r.memory_space == MemorySpace::Vmem;
        let Some(array) = r.array_shape.as_ref().filter(|a| windowed && a.len() == r.shape.len()) else { continue };
        let n = r.shape.len();
        for (k, unit, what) in [(1usize, lanes, "lanes"), (2, sub, "sublanes")] {
            if n < k {
                continue;
            }
            let (b, a) = (r.shape[n - k], array[n - k]);
            if b != 1 && b != a && b % unit != 0 {
                return Err(PallasError::field(
                    &format!("refs[{i}] ({}).shape[{}]", r.name, n - k),
                    b,
                    format!(
                        "a block's {} dimension must be a multiple of the chip's {unit} {what} or equal the array's ({a}) ((8, 128) block rule)",
                        if k == 1 { "last" } else { "second-to-last" }
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Reads the prefetch tables and counts what the kernel keeps in SMEM (tables, SMEM windows and
/// scratch).
///
/// # Errors
/// [`PallasError`] for a table of the wrong shape or SMEM overflow.
fn prefetch_tables<'d>(chip: &ChipModel, d: &'d Description, dir: &Path) -> Result<(Tables<'d>, u64), PallasError> {
    let mut tables: Vec<Option<Table>> = (0..d.refs.len()).map(|_| None).collect();
    let mut smem = 0u64;
    for (i, r) in d.refs.iter().enumerate() {
        let bytes = r.shape.iter().product::<u64>() * dtype_bytes(&r.dtype, "dtype")?;
        if r.kind == RefKind::Prefetch {
            tables[i] = Some(read_table(r, i, dir)?);
            smem += bytes;
        } else if r.memory_space == MemorySpace::Smem {
            // An SMEM input whose values the description holds is read as a prefetch table is.
            if r.values.is_some() {
                tables[i] = Some(read_table(r, i, dir)?);
            }
            smem += bytes * if r.kind == RefKind::Scratch { 1 } else { r.pipeline_mode.buffers() };
        }
    }
    if smem > chip.smem_bytes() {
        return Err(PallasError::Kernel {
            kernel: d.kernel_name.clone(),
            message: format!("its scalar-prefetch tables and SMEM buffers need {smem} bytes but SMEM holds {} bytes", chip.smem_bytes()),
        });
    }
    Ok((Tables { tables, refs: &d.refs }, smem))
}

/// The windows' block indices at a grid step: per window of the copy rule (its order), the
/// evaluated index map, in one flat buffer (window w at `offs[w]..offs[w + 1]`).
struct Windows<'a> {
    d: &'a Description,
    /// Ref index of each window.
    refs: Vec<usize>,
    offs: Vec<usize>,
    /// A window whose index map equals an earlier window's (K and V of attention) copies its
    /// values instead of evaluating them again.
    same_as: Vec<Option<usize>>,
    /// Per window and dimension, the number of blocks when its array's shape is known (flat, as
    /// the block indices are; u64::MAX when not): a block index outside them (a scalar-prefetch
    /// table pointing past the array) copies memory the array does not have.
    limits: Vec<u64>,
}

impl<'a> Windows<'a> {
    fn new(d: &'a Description, rule: &CopyRule) -> Self {
        let refs: Vec<usize> = rule.windows().collect();
        let mut offs = vec![0usize];
        for &w in &refs {
            offs.push(offs.last().copied().unwrap_or(0) + d.refs[w].index_map.as_ref().map_or(0, Vec::len));
        }
        let same_as = (0..refs.len()).map(|w| (0..w).find(|&e| d.refs[refs[e]].index_map == d.refs[refs[w]].index_map)).collect();
        let limits = refs
            .iter()
            .flat_map(|&w| {
                let r = &d.refs[w];
                let n = r.index_map.as_ref().map_or(0, Vec::len);
                match r.array_shape.as_ref().filter(|a| a.len() == r.shape.len() && a.len() == n) {
                    Some(a) => a.iter().zip(&r.shape).map(|(&x, &b)| x.div_ceil(b.max(1))).collect::<Vec<_>>(),
                    None => vec![u64::MAX; n],
                }
            })
            .collect();
        Windows { d, refs, offs, same_as, limits }
    }

    /// Window `w`'s block indices in `buf`.
    fn of<'b>(&self, buf: &'b [i64], w: usize) -> &'b [i64] {
        &buf[self.offs[w]..self.offs[w + 1]]
    }

    /// Evaluates every window's index map at grid index `idx` into `out`.
    ///
    /// # Errors
    /// An index map that reads an unknown value, or a block outside its array.
    fn at(&self, tables: &Tables<'_>, idx: &[i64], out: &mut Vec<i64>) -> Result<(), PallasError> {
        let d = self.d;
        out.clear();
        let env = StepEnv { idx, ivs: Vec::new(), tables, smem: None };
        for (k, &w) in self.refs.iter().enumerate() {
            if let Some(e) = self.same_as[k] {
                out.extend_from_within(self.offs[e]..self.offs[e + 1]);
                continue;
            }
            let r = &d.refs[w];
            for e in r.index_map.as_ref().expect("a window has an index map") {
                out.push(e.eval(&env).map_err(|x| eval_err(d, x, &format!("the index map of `{}`", r.name), ""))?);
            }
        }
        // A negative index is past every limit as u64.
        if out.iter().zip(&self.limits).any(|(&b, &n)| b as u64 >= n) {
            return Err(self.out_of_array(idx, out));
        }
        Ok(())
    }

    fn out_of_array(&self, idx: &[i64], out: &[i64]) -> PallasError {
        let at = out.iter().zip(&self.limits).position(|(&b, &n)| b as u64 >= n).unwrap_or(0);
        let k = self.offs.partition_point(|&o| o <= at) - 1;
        let r = &self.d.refs[self.refs[k]];
        PallasError::field(
            &format!("kernel `{}`: the index map of `{}` at grid index {idx:?}: block index {}", self.d.kernel_name, r.name, at - self.offs[k]),
            out[at],
            format!(
                "expected 0 to {} (array {:?} in blocks of {:?}): a block outside the array (a scalar-prefetch table's entry out of range?)",
                self.limits[at] - 1,
                r.array_shape.as_deref().unwrap_or_default(),
                r.shape
            ),
        )
    }
}

/// What the step generation of a lowering builds.
struct Generated {
    classes: Vec<StepClass>,
    listed: ListedSteps,
    sets: CopySets,
    dmas: DmaTally,
    /// The largest body value of any class (shape, element type) and its bytes.
    largest: Option<(Vec<u64>, Dtype)>,
    largest_bytes: u64,
    /// Matmuls with an f32 operand.
    f32_mm: u64,
}

/// The step classes met so far: a step's class is its path through the body (branch decisions,
/// trip counts, its copies' sizes and semaphores) and whether it starts and ends an output
/// block; each class's body is built once, the first time a step takes it.
struct Classes<'a> {
    d: &'a Description,
    carried: Vec<bool>,
    folded: HashSet<u64>,
    dead: HashSet<u64>,
    ids: HashMap<Vec<i64>, u32, fnv::FnvBuildHasher>,
    /// Neighbouring steps mostly take the same path: the last one.
    last: (Vec<i64>, Option<u32>),
}

impl Classes<'_> {
    /// The class of the step at `idx` whose path key is `key`, built if new (with the SMEM state
    /// as the step began, `before`).
    fn of(&mut self, g: &mut Generated, key: &[i64], idx: &[i64], tables: &Tables<'_>, before: &Option<SmemState>, (first, last): (bool, bool)) -> Result<u32, PallasError> {
        if let Some(c) = self.last.1.filter(|_| key == self.last.0.as_slice()).or_else(|| self.ids.get(key).copied()) {
            self.remember(key, c);
            return Ok(c);
        }
        let d = self.d;
        if g.classes.len() >= MAX_CLASSES {
            return Err(PallasError::Kernel {
                kernel: d.kernel_name.clone(),
                message: format!(
                    "its steps take more than {MAX_CLASSES} distinct paths through the body (a path: the branches taken, the loops' trip counts, and the sizes and semaphores of the copies it starts)"
                ),
            });
        }
        let mut b = Walker { d, b: tpusim_model::body::Builder::new(self.carried.clone()), folded: &self.folded, dead: &self.dead };
        let cell = std::cell::RefCell::new(before.clone().unwrap_or_default());
        let mut env = StepEnv { idx, ivs: Vec::new(), tables, smem: Some(&cell) };
        b.walk(&d.body, &mut env)?;
        let built = b.b.finish();
        if built.largest_bytes > g.largest_bytes {
            g.largest_bytes = built.largest_bytes;
            g.largest = built.largest_value;
        }
        g.f32_mm += built.f32_matmuls;
        let body = built.body;
        let tile = if body.is_empty() { "empty" } else { "full" };
        let id = g.classes.len() as u32;
        g.classes.push(StepClass { key: ClassKey { tile, masked: false, first, last }, body });
        self.ids.insert(key.to_vec(), id);
        self.remember(key, id);
        Ok(id)
    }

    fn remember(&mut self, key: &[i64], c: u32) {
        if self.last.1 != Some(c) {
            self.last.1 = Some(c);
            self.last.0.clear();
            self.last.0.extend_from_slice(key);
        }
    }
}

/// Generates every grid step in order: its copies by Pallas's rule ([`tpusim_model::copies`]:
/// an input window copied when its block index differs from the previous step's, an output
/// written back when the next step's differs, at the array's edge only what is inside), its path
/// through the body and so its class; runs of equal steps per parallel unit.
///
/// # Errors
/// [`PallasError`] from evaluating index maps and paths, or too many classes.
fn generate(d: &Description, decl: &KernelDecl, tables: &Tables<'_>) -> Result<Generated, PallasError> {
    let steps_total = d.grid_steps();
    let rule = CopyRule::new(decl);
    let win = Windows::new(d, &rule);
    let nw = rule.len();
    let unit_size: u64 = d.grid[decl.parallel_dims.min(d.grid.len())..].iter().product::<u64>().max(1);
    let (folded, dead) = canonicalized(d);
    let mut classes = Classes { d, carried: decl.carried(), folded, dead, ids: HashMap::default(), last: (Vec::new(), None) };
    let mut g = Generated { classes: Vec::new(), listed: ListedSteps::new(), sets: CopySets::default(), dmas: DmaTally::default(), largest: None, largest_bytes: 0, f32_mm: 0 };
    let ndim = d.grid.len();
    let advance = |idx: &mut [i64]| {
        for k in (0..ndim).rev() {
            idx[k] += 1;
            if (idx[k] as u64) < d.grid[k] {
                return;
            }
            idx[k] = 0;
        }
    };
    let (mut idx, mut next_idx) = (vec![0i64; ndim], vec![0i64; ndim]);
    let (mut cur, mut next) = (Vec::new(), Vec::new());
    win.at(tables, &idx, &mut cur)?;
    let path = path_skeleton(&d.body);
    let mutable_smem = stores_smem(&d.body);
    let mut smem_state = SmemState::default();
    let mut key: Vec<i64> = Vec::new();
    let mut runs: Vec<(Step, u64)> = Vec::new();
    // Per window: whether its block index changes from this step to the next (the next step's
    // "changed since the previous step"); the first step copies every input.
    let mut changes: Vec<bool> = vec![true; nw];
    let mut moved: Vec<bool> = vec![false; nw];
    // Copy sets by (windows copied, block indices of the edge windows among them).
    let mut set_ids: HashMap<(Vec<bool>, Vec<i64>), u32, fnv::FnvBuildHasher> = HashMap::default();
    let mut edge_at: Vec<i64> = Vec::new();
    for step in 0..steps_total {
        let (first_step, last_step) = (step == 0, step + 1 == steps_total);
        if !last_step {
            next_idx.copy_from_slice(&idx);
            advance(&mut next_idx);
            win.at(tables, &next_idx, &mut next)?;
        }
        let (mut first, mut last) = (first_step, last_step);
        for w in 0..nw {
            let changed_in = changes[w];
            let changes_next = last_step || win.of(&next, w) != win.of(&cur, w);
            changes[w] = changes_next;
            if rule.is_output(w) {
                moved[w] = changes_next;
                last |= changes_next;
                first |= changed_in && !first_step;
            } else {
                moved[w] = changed_in;
            }
        }
        edge_at.clear();
        for w in (0..nw).filter(|&w| moved[w] && rule.has_edge(w)) {
            edge_at.extend_from_slice(win.of(&cur, w));
        }
        let copies = match set_ids.get(&(moved.clone(), edge_at.clone())) {
            Some(&id) => id,
            None => {
                let id = g.sets.intern(rule.copies(|w| moved[w], |w| Some(win.of(&cur, w))));
                set_ids.insert((moved.clone(), edge_at.clone()), id);
                id
            }
        };
        // The body's path at this step (SMEM state carried from the previous step).
        let before = if mutable_smem { Some(smem_state.clone()) } else { None };
        let cell = std::cell::RefCell::new(std::mem::take(&mut smem_state));
        let mut env = StepEnv { idx: &idx, ivs: Vec::new(), tables, smem: Some(&cell) };
        key.clear();
        let mut step_dma = DmaTally::default();
        walk_path(d, &path, &mut env, &mut key, &mut step_dma)?;
        smem_state = cell.into_inner();
        smem_state.vars.clear();
        g.dmas.merge_step(&step_dma);
        key.extend([i64::from(first), i64::from(last)]);
        let class = classes.of(&mut g, &key, &idx, tables, &before, (first, last))?;
        let coords = [
            idx.first().copied().unwrap_or(0) as u32,
            if ndim >= 3 { idx[ndim - 2] as u32 } else { 0 },
            idx.last().copied().unwrap_or(0) as u32,
            0,
        ];
        let s = Step { class, copies, coords };
        match runs.last_mut() {
            Some((r, n)) if r.class == s.class && r.copies == s.copies && r.coords[2] + *n as u32 == s.coords[2] && r.coords[..2] == s.coords[..2] => *n += 1,
            _ => runs.push((s, 1)),
        }
        if (step + 1) % unit_size == 0 {
            g.listed.push_unit(std::mem::take(&mut runs));
        }
        // cur <- next (buffers reused).
        std::mem::swap(&mut cur, &mut next);
        std::mem::swap(&mut idx, &mut next_idx);
    }
    Ok(g)
}

/// The kernel's VMEM by the declaration ([`KernelDecl::vmem`]: windows x their buffer counts,
/// scratch once, the largest body value once) against its scoped limit.
///
/// # Errors
/// [`PallasError::Kernel`] naming every buffer and what to change when it does not fit.
fn check_vmem(chip: &ChipModel, d: &Description, decl: &KernelDecl) -> Result<VmemBudget, PallasError> {
    // A scoped limit above the chip's VMEM cannot hold more than the chip has: checked against
    // the physical size (and said so).
    let physical = chip.vmem_size_bytes();
    let declared = d.vmem_limit_bytes.unwrap_or_else(|| chip.vmem_limit_bytes());
    let limit = declared.min(physical);
    let vmem = decl.vmem(limit);
    if vmem.total() <= limit {
        return Ok(vmem);
    }
    let advice = if declared > physical {
        format!(
            "the kernel's `vmem_limit_bytes` ({declared} bytes, {:.1} MiB) is above the chip's physical VMEM ({} MiB, {physical} bytes): use smaller blocks",
            declared as f64 / 1048576.0,
            chip.vmem.size_mib.value
        )
    } else {
        let whose = if d.vmem_limit_bytes.is_some() { "the kernel's own `vmem_limit_bytes`" } else { "the compiler's default scoped limit" };
        format!(
            "the scoped limit is {limit} bytes ({:.1} MiB, {whose}): use smaller blocks, or raise the limit with `vmem_limit_bytes` in the kernel's compiler parameters (`pltpu.CompilerParams(vmem_limit_bytes=...)`, at most the physical {} MiB)",
            limit as f64 / 1048576.0,
            chip.vmem.size_mib.value
        )
    };
    Err(PallasError::Kernel {
        kernel: d.kernel_name.clone(),
        message: format!(
            "its buffers need {} bytes of VMEM ({}) but {advice}",
            vmem.total(),
            vmem.buffers.iter().map(|(n, b)| format!("{n} {b}")).collect::<Vec<_>>().join(", "),
        ),
    })
}

/// The assumptions a lowering of `d` made, for the report.
fn assumptions(chip: &ChipModel, d: &Description, folded: usize, f32_mm: u64) -> Vec<String> {
    let mut out = vec![
        "body ops cost (8,128) 32-bit registers on their unit (the model crate's one table, crates/tpusim-model/src/body/cost.rs); loads, stores, broadcasts and reshapes are free".to_string(),
        "windows follow Pallas's pipeline rule (copy when the block index changes, write back when it will change), double-buffered; a one-buffer window's copy (pl.Buffered(1)) starts when the step that reads its buffer is done".to_string(),
        "scalar-unit work (index arithmetic, SMEM loads) is part of the fixed grid-step overhead".to_string(),
        "VMEM: windows x their buffer counts, scratch, and the largest intermediate once (Mosaic's internal scratch is not in the IR)".to_string(),
    ];
    if let Some((kind, preset)) = crate::desc::DEVICE_KINDS.iter().find(|(k, _)| *k == d.producer.device_kind) {
        if *preset != chip.name {
            out.push(format!(
                "lowered for {kind} ({preset}) and simulated on {}: Mosaic's choices for {preset} (layouts, tiling, the VMEM limit) are kept; lower for the chip simulated to see its own",
                chip.name
            ));
        }
    }
    let physical = chip.vmem_size_bytes();
    let declared = d.vmem_limit_bytes.unwrap_or_else(|| chip.vmem_limit_bytes());
    if declared > physical {
        out.push(format!("the kernel's `vmem_limit_bytes` ({declared} bytes) is above the chip's physical VMEM: its buffers are checked against the physical {physical} bytes"));
    }
    if folded > 0 {
        out.push(format!(
            "{folded} transpose{} read only as a matmul's rhs cost nothing: Mosaic folds such a transpose into the matmul (its transposed rhs, latched as the weights load; canonicalize_matmul)",
            if folded == 1 { "" } else { "s" }
        ));
    }
    if f32_mm > 0 {
        out.push("f32-operand matmuls at the default precision take one MXU pass, their f32 operands rounded to bf16 on the VPU first (one operation per f32 register; tpusim_model::mxu)".into());
    }
    let lead_par = d.dimension_semantics.iter().take_while(|s| matches!(s, DimSemantics::Parallel | DimSemantics::CoreParallel)).count();
    if d.dimension_semantics.iter().skip(lead_par).any(|s| matches!(s, DimSemantics::Parallel | DimSemantics::CoreParallel)) {
        out.push("only the grid's leading parallel dimensions are split over megacore TensorCores".into());
    }
    out
}

/// Lowers a description to a program on `chip`; `dir` resolves `.npy` side files.
///
/// # Errors
/// [`PallasError`]: an op the simulator does not model, a branch or index map that reads a
/// value not known before the run, a prefetch table of the wrong shape, too many steps or
/// classes, VMEM or SMEM overflow.
pub fn lower(chip: &ChipModel, d: &Description, dir: &Path) -> Result<(Program, IrFacts), PallasError> {
    let steps_total = d.grid_steps();
    if steps_total > MAX_GRID_STEPS {
        return Err(PallasError::field("grid", format!("{:?} ({steps_total} steps)", d.grid), format!("at most {MAX_GRID_STEPS} grid steps are supported: use larger blocks")));
    }
    let (tables, smem) = prefetch_tables(chip, d, dir)?;
    check_block_shapes(chip, d)?;
    check_hbm(chip, d)?;
    let mut decl = declaration(d)?;
    let g = generate(d, &decl, &tables)?;
    if let Some((shape, dtype)) = &g.largest {
        decl.internal.push(VmemBuffer::internal("largest body value", shape, *dtype));
    }
    let vmem = check_vmem(chip, d, &decl)?;
    let assumptions = assumptions(chip, d, canonicalized(d).0.len(), g.f32_mm);
    let info = ProgramInfo {
        kernel: d.kernel_name.clone(),
        kind: KernelKind::Matmul,
        grid: d.grid.iter().enumerate().map(|(i, &n)| (format!("dim {i} ({})", d.dimension_semantics.get(i).map(|s| format!("{s:?}").to_lowercase()).unwrap_or_else(|| "arbitrary".into())), n)).collect(),
        grid_steps: steps_total,
        smem_bytes: smem,
        ..ProgramInfo::default()
    };
    let classes = g.classes.len();
    let mut program = Program::from_listed(g.classes, g.listed, vmem, info, decl, g.sets);
    let computed = program.steps_computed();
    // Grid steps as tiles: those that compute, or in a kernel that only moves data (a pipelined
    // copy: no step has unit work) those whose copies move bytes. Such a step is not skipped.
    let visited = if computed > 0 {
        computed
    } else {
        let mut n = 0u64;
        program.for_each_run(&mut |s, k| {
            let c = program.copies.get(s.copies);
            if c.in_bytes + c.out_bytes > 0 {
                n += k;
            }
        });
        n
    };
    program.info.tiles = Some(TileCounts { total: steps_total, visited, empty: steps_total - visited, partial: 0, full: visited, masked: 0 });
    let facts = IrFacts {
        kernel_name: d.kernel_name.clone(),
        steps_computed: computed,
        grid_steps: steps_total,
        classes,
        smem_bytes: smem,
        assumptions,
        declared_cost: d.cost_estimate,
        dmas: g.dmas,
    };
    Ok((program, facts))
}
