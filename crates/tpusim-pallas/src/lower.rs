//! A kernel description lowered to the engine's [`Program`].
//!
//! * **Grid.** Steps run in lexicographic order of the grid. Each step's path through the body
//!   (which `scf.if` branches run, how many `scf.for` iterations) is evaluated from the grid
//!   indices and the prefetch tables; each distinct path (with the step's first / last flags) is
//!   one step class, lowered once.
//! * **Pipeline rule (Pallas).** An input window is copied HBM -> VMEM before a step when its
//!   block index differs from the previous step's (the first step copies every window); an
//!   output window is written back after a step when the next step's block index differs (or it
//!   is the last step). Bytes are the block's (block shape x element bytes). Manual DMAs
//!   (`tpu.enqueue_dma`) add their bytes to their step's input copies.
//! * **Megacore.** The grid's leading dimensions marked parallel form the parallel units a
//!   two-core device splits over its TensorCores ([`Program::core_ranges`]).
//! * **Body.** Each vector op becomes tile operations on its unit ([`crate::cost`]), split into
//!   [`SLAB_ROWS`]-row slabs when its rows vary and exceed a slab (as the hand-written lowerings
//!   do: the MXU streams slab s + 1 while the vector units work on slab s). Issue slots follow
//!   the data flow (software pipelining: an op issues a few slabs after its producers, more
//!   after an MXU producer to cover its latency); the slabs of a transpose, each of which needs
//!   its whole source, issue together. A rolled loop's iterations issue one after another; an
//!   unrolled loop's do too once a reduction has needed every slab of a matmul result (kv-major
//!   scores, whose softmax reduces over rows): a matmul repeating an earlier one of the body
//!   (same shape, operands read from the same refs, directly or through views, casts and
//!   element-wise ops with constants) and independent of the matmul before it ranks after that
//!   one. Refs the body both loads and stores (scratch
//!   accumulators, output blocks accumulated in place) are carried state: the next step's load
//!   of a slab waits for this step's last store of it.

use crate::cost::{self, OpCost, VmemBuffer};
use crate::desc::{dtype_bytes, Description, DimSemantics, MemorySpace, Op, Operand, Ref, RefKind, Values};
use crate::expr::{Env, EvalError, Expr};
use crate::runtime::{DmaTally, SmemState};
use crate::PallasError;
use petgraph::graph::NodeIndex as NodeIdx;
use std::collections::HashMap;
use std::path::Path;
use tpusim_chip::ChipModel;
use tpusim_kernel::listed::ListedSteps;
use tpusim_kernel::{ClassKey, KernelKind, Program, ProgramInfo, Step, StepBody, StepClass, TileCounts, VmemBudget, Work, SLAB_ROWS};

/// Most `scf.for` iterations lowered per step body (they are unrolled).
pub const MAX_UNROLL: i64 = 512;

/// Most grid steps a kernel may have (2^28): step generation evaluates every step.
pub const MAX_GRID_STEPS: u64 = 1 << 28;

/// Most distinct step classes (paths through the body).
pub const MAX_CLASSES: usize = 4096;

/// A prefetch table's values.
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
        None => Err(PallasError::field(&field, "(missing)", "a prefetch table needs its values")),
    }
}

/// The message of an evaluation error at `loc` of `what`.
fn eval_err(d: &Description, e: EvalError, what: &str, loc: &str) -> PallasError {
    let at = if loc.is_empty() { String::new() } else { format!(" at {loc}") };
    let message = match e {
        EvalError::Unknown(why) => format!(
            "{what}{at} reads {why}, which is neither a constant nor an argument of the call: the simulator cannot tell which steps take which path (pass the value as a scalar-prefetch argument of the pallas_call)"
        ),
        EvalError::Runtime(r) => {
            let name = d.refs.get(r).map(|x| x.name.as_str()).unwrap_or("?");
            let given = match d.refs.get(r).and_then(|x| x.values.as_ref()) {
                Some(Values::Runtime(n)) => n.as_str(),
                _ => name,
            };
            format!("{what}{at} reads the runtime operand `{given}` ({name}), whose values were not given: pass a concrete array for it (Python) or `--runtime {given}=FILE.npy` (CLI)")
        }
        EvalError::OutOfBounds(r, idx) => {
            let name = d.refs.get(r).map(|x| x.name.as_str()).unwrap_or("?");
            format!("{what}{at} reads the prefetch operand `{name}` at {idx:?}, outside its shape")
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
            }),
            "tpu.enqueue_dma" | "memref.load" | "memref.store" => Some(op.clone()),
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
                let c = op.cond.as_ref().ok_or_else(|| PallasError::field("scf.if.cond", "(missing)", "a branch needs its condition"))?;
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
            "tpu.enqueue_dma" => {
                crate::runtime::check_dma_source(d, op, env, &|e, what| eval_err(d, e, what, &op.loc))?;
                dma.add(op.attrs.get("bytes").and_then(|b| b.as_u64()).unwrap_or(0));
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

/// A loop's scalar loop-carried values (`attrs`: `carried` variable ids set from `init` and
/// then from each iteration's `yield`; `scf.while`: the before region's `forward` values bound to
/// the body's `args`; `results` bound to the final values).
#[derive(Default)]
struct LoopVars {
    carried: Vec<u64>,
    init: Vec<Expr>,
    forward: Vec<Expr>,
    args: Vec<u64>,
    yields: Vec<Expr>,
    results: Vec<u64>,
}

fn loop_vars(op: &Op) -> Result<LoopVars, PallasError> {
    let ids = |k: &str| -> Vec<u64> { op.attrs.get(k).and_then(|v| v.as_array()).map(|a| a.iter().filter_map(|x| x.as_u64()).collect()).unwrap_or_default() };
    let exprs = |k: &str| -> Result<Vec<Expr>, PallasError> {
        match op.attrs.get(k) {
            None => Ok(Vec::new()),
            Some(v) => serde_json::from_value(v.clone()).map_err(|e| PallasError::field(&format!("{} at {}: attrs.{k}", op.op, op.loc), v, e.to_string())),
        }
    };
    let lv = LoopVars { carried: ids("carried"), init: exprs("init")?, forward: exprs("forward")?, args: ids("args"), yields: exprs("yield")?, results: ids("results") };
    if lv.init.len() != lv.carried.len() || lv.yields.len() != lv.carried.len() {
        return Err(PallasError::field(&format!("{} at {}: attrs", op.op, op.loc), format!("{} carried, {} init, {} yield", lv.carried.len(), lv.init.len(), lv.yields.len()), "expected one init and one yield per carried value"));
    }
    Ok(lv)
}

fn eval_list(d: &Description, op: &Op, env: &StepEnv<'_>, es: &[Expr], what: &str) -> Result<Vec<i64>, PallasError> {
    es.iter().map(|e| e.eval(env).map_err(|x| eval_err(d, x, &format!("the {what} of the `{}`", op.op), &op.loc))).collect()
}

fn set_vars(env: &StepEnv<'_>, ids: &[u64], vals: &[i64]) {
    if let Some(s) = env.smem {
        let mut s = s.borrow_mut();
        for (&i, &v) in ids.iter().zip(vals) {
            s.vars.insert(i, v);
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
        i += st;
    }
    set_vars(env, &lv.results, &cur);
    Ok(())
}

/// Runs an `scf.while`: the before region (`else`) and the condition, then the body (`then`)
/// while it holds, at most [`MAX_UNROLL`] times; `trips` gets the body's trip count.
fn run_while(d: &Description, op: &Op, env: &mut StepEnv<'_>, region: &mut Region<'_>, trips: &mut i64) -> Result<(), PallasError> {
    let lv = loop_vars(op)?;
    let c = op.cond.as_ref().ok_or_else(|| PallasError::field("scf.while.cond", "(missing)", "a while loop needs its condition"))?;
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
        (hi - lo + st - 1) / st
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

/// A value in the body: its shape, the dimensions along which it varies, and what its
/// consumers wait for per slab.
#[derive(Debug, Clone)]
struct Val {
    shape: Vec<u64>,
    varies: Vec<bool>,
    /// Per slab (len 1 when not split): (nodes to depend on, their issue slot).
    deps: Vec<Vec<(NodeIdx, u64)>>,
    /// Carried state this value was loaded from (per slab carry slot), before any store of it
    /// in this step.
    carry: Option<Vec<u16>>,
    /// The unit of the producing node (for issue skews).
    unit: Option<tpusim_kernel::Unit>,
}

fn nslabs(shape: &[u64], varies: &[bool]) -> usize {
    let n = shape.len();
    if n < 2 || !varies.get(n - 2).copied().unwrap_or(true) {
        return 1;
    }
    shape[n - 2].div_ceil(SLAB_ROWS).max(1) as usize
}

fn slab_rows(shape: &[u64], s: usize, ns: usize) -> u64 {
    if ns == 1 {
        return shape.get(shape.len().wrapping_sub(2)).copied().unwrap_or(1);
    }
    let r = shape[shape.len() - 2];
    SLAB_ROWS.min(r - s as u64 * SLAB_ROWS)
}

/// A (ref, slab) pair naming one slab of carried state.
type RefSlab = (usize, usize);
/// Nodes to wait for, with their issue slots.
type Deps = Vec<(NodeIdx, u64)>;

/// The share of a value's work in slab `s` of `ns`.
fn slab_share(shape: &[u64], s: usize, ns: usize) -> f64 {
    if ns == 1 {
        1.0
    } else {
        slab_rows(shape, s, ns) as f64 / shape[shape.len() - 2] as f64
    }
}

/// Builds one class's body.
struct Builder<'a> {
    d: &'a Description,
    chip: &'a ChipModel,
    body: StepBody,
    vals: HashMap<u64, Val>,
    /// Carry slot per (ref, slab).
    slots: HashMap<(usize, usize), u16>,
    /// Refs that are carried (loaded and stored by the body).
    carried: Vec<bool>,
    /// Last writer in this step per (ref, slab).
    writers: HashMap<(usize, usize), Vec<(NodeIdx, u64)>>,
    /// Offset of issue slots for the current loop iteration (slabs of earlier iterations).
    base: u64,
    /// The previous matmul in program order: its slab nodes and its last slab's issue slot
    /// ([`Self::matmul`]: the next iteration of an unrolled loop ranks after it).
    last_matmul: Option<(Vec<NodeIdx>, u64)>,
    /// Matmuls seen in this body, by (m, k, n, the refs its operands are loaded from).
    matmul_sigs: std::collections::HashSet<MatmulSig>,
    /// The ref a value is read from (a load, or a view, cast or element-wise op of one load
    /// with constants: [`Self::note_load_ref`]), by value id.
    load_refs: HashMap<u64, usize>,
    /// A reduction over a slab-split value's rows (which needs every slab) has been lowered.
    row_reduction: bool,
    seq: u64,
    /// Largest vector value, bytes (tile padded).
    largest: u64,
    f32_matmuls: u64,
    dma_bytes: u64,
}

/// A matmul's (m, k, n) and the refs its lhs and rhs are loaded from (`None`: computed).
type MatmulSig = (u64, u64, u64, Option<usize>, Option<usize>);

fn unit_of(w: &Work) -> tpusim_kernel::Unit {
    w.unit()
}

/// The skew from a producer on `from` to a consumer on `to` (module docs).
fn skew(from: Option<tpusim_kernel::Unit>, to: tpusim_kernel::Unit) -> u64 {
    use tpusim_kernel::Unit as U;
    match (from, to) {
        (Some(U::Mxu), _) => 3,
        (_, U::Eup) | (_, U::Xlu) => 1,
        (_, U::Mxu) => 2,
        _ => 0,
    }
}

const SLOT: u64 = 1 << 20;

impl<'a> Builder<'a> {
    fn kernel_err(&self, op: &Op, message: String) -> PallasError {
        PallasError::Kernel { kernel: self.d.kernel_name.clone(), message: format!("`{}` at {}: {message}", op.op, if op.loc.is_empty() { "(no location)" } else { &op.loc }) }
    }

    fn operand_val(&self, o: &Operand) -> Option<&Val> {
        match o {
            Operand::Op(id) => self.vals.get(id),
            _ => None,
        }
    }

    /// Adds a node for slab `s` of a value with `ns` slabs, depending on `inputs`' slab-aligned
    /// (or whole) dependencies; returns (node, slot).
    fn node(&mut self, name: &'static str, work: Work, inputs: &[&Val], extra: &[(NodeIdx, u64)], s: usize, ns: usize) -> (NodeIdx, u64) {
        self.node_from(name, work, inputs, extra, s, ns, self.base + s as u64)
    }

    /// [`Self::node`] issuing no earlier than slot `floor` (a slab-split op's slab s: the
    /// iteration's base + s; every slab of an op that needs its whole input: the base).
    #[allow(clippy::too_many_arguments)]
    fn node_from(&mut self, name: &'static str, work: Work, inputs: &[&Val], extra: &[(NodeIdx, u64)], s: usize, ns: usize, floor: u64) -> (NodeIdx, u64) {
        let unit = unit_of(&work);
        let mut deps: Vec<(NodeIdx, u64, Option<tpusim_kernel::Unit>)> = Vec::new();
        let mut carry_in = None;
        for v in inputs {
            let list: Vec<&Vec<(NodeIdx, u64)>> = if v.deps.len() == ns { vec![&v.deps[s]] } else { v.deps.iter().collect() };
            for l in list {
                for &(n, sl) in l {
                    deps.push((n, sl, v.unit));
                }
            }
            if carry_in.is_none() {
                if let Some(c) = &v.carry {
                    carry_in = Some(if c.len() == ns { c[s] } else { c[c.len() - 1] });
                }
            }
        }
        for &(n, sl) in extra {
            deps.push((n, sl, None));
        }
        let slot = deps.iter().map(|&(_, sl, u)| sl + skew(u, unit)).max().unwrap_or(0).max(floor);
        self.seq += 1;
        let issue = slot * SLOT + self.seq;
        let mut nodes: Vec<NodeIdx> = deps.iter().map(|d| d.0).collect();
        nodes.sort();
        nodes.dedup();
        let n = self.body.add_carried(name, work, &nodes, issue, carry_in, None);
        (n, slot)
    }

    fn walk(&mut self, ops: &[Op], env: &mut StepEnv<'_>) -> Result<(), PallasError> {
        for op in ops {
            match op.op.as_str() {
                "scf.if" => {
                    let c = op.cond.as_ref().expect("checked by walk_path");
                    let v = c.eval(env).map_err(|e| eval_err(self.d, e, "the `scf.if` condition", &op.loc))?;
                    let region = if v != 0 { &op.then } else { &op.otherwise };
                    self.walk(region, env)?;
                    self.bind_results(op, region);
                }
                "scf.for" | "scf.while" => {
                    let d = self.d;
                    let mut trips = 0;
                    let mut region = |ops: &[Op], env: &mut StepEnv<'_>, body: bool| -> Result<(), PallasError> {
                        self.walk(ops, env)?;
                        if body {
                            // The next iteration's slabs issue after this one's (slab-major order).
                            self.base += self.max_slabs(ops) as u64;
                        }
                        Ok(())
                    };
                    if op.op == "scf.for" {
                        run_for(d, op, env, &mut region, &mut trips)?;
                    } else {
                        run_while(d, op, env, &mut region, &mut trips)?;
                    }
                    self.bind_results(op, &op.then);
                }
                "scf.yield" | "func.return" => {}
                "memref.load" | "memref.store" => {
                    if let Some(s) = env.smem {
                        let d = self.d;
                        crate::runtime::run_scalar_op(d, op, env, s, &|e, what| eval_err(d, e, what, &op.loc))?;
                    }
                }
                name => self.leaf(op, name)?,
            }
        }
        Ok(())
    }

    fn max_slabs(&self, ops: &[Op]) -> usize {
        ops.iter().map(|o| if o.shape.len() >= 2 { nslabs(&o.shape, &vec![true; o.shape.len()]) } else { 1 }).max().unwrap_or(1)
    }

    /// Results of a region op take the values its region yields (the `then` region's yield).
    fn bind_results(&mut self, op: &Op, region: &[Op]) {
        if let Some(y) = region.iter().rev().find(|o| o.op == "scf.yield") {
            let ids: Vec<u64> = y.attrs.get("results").and_then(|r| r.as_array()).map(|a| a.iter().filter_map(|x| x.as_u64()).collect()).unwrap_or_default();
            for (k, o) in y.operands.iter().enumerate() {
                if let (Some(v), Some(id)) = (self.operand_val(o).cloned(), ids.get(k)) {
                    self.vals.insert(*id, v);
                }
            }
        }
        let _ = op;
    }

    fn elem(&self, op: &Op) -> Result<u64, PallasError> {
        if op.dtype.is_empty() {
            return Ok(4);
        }
        dtype_bytes(&op.dtype, &format!("{} at {}: dtype", op.op, op.loc))
    }

    fn leaf(&mut self, op: &Op, name: &str) -> Result<(), PallasError> {
        let Some((static_name, c)) = cost::lookup(name) else {
            return Err(self.kernel_err(
                op,
                "an op this simulator does not model (its cost on the units is unknown; it is never taken as free): see crates/tpusim-pallas/DESCRIPTION.md for the ops it knows".into(),
            ));
        };
        let ins: Vec<Val> = op.operands.iter().filter_map(|o| self.operand_val(o).cloned()).collect();
        self.note_load_ref(op, name);
        let shape = op.shape.clone();
        let rank = shape.len();
        // Which dimensions the result varies along.
        let varies: Vec<bool> = match name {
            "tpu.iota" => {
                let dims: Vec<u64> = op.attrs.get("dims").and_then(|d| d.as_array()).map(|a| a.iter().filter_map(|x| x.as_u64()).collect()).unwrap_or_default();
                (0..rank).map(|i| dims.contains(&(i as u64))).collect()
            }
            "arith.constant" | "vector.splat" => vec![false; rank],
            "vector.broadcast" => {
                let src = ins.first();
                match src {
                    None => vec![false; rank],
                    Some(s) => {
                        let off = rank.saturating_sub(s.shape.len());
                        (0..rank).map(|i| i >= off && s.shape[i - off] == shape[i] && s.varies[i - off]).collect()
                    }
                }
            }
            "vector.load" | "tpu.load" | "tpu.strided_load" | "tpu.matmul" | "vector.contract" => vec![true; rank],
            "vector.multi_reduction" => {
                // The source's dimensions that survive the reduction.
                let dims: Vec<u64> = op.attrs.get("dims").and_then(|d| d.as_array()).map(|a| a.iter().filter_map(|x| x.as_u64()).collect()).unwrap_or_default();
                match ins.first() {
                    Some(src) => {
                        let kept: Vec<bool> = src.varies.iter().enumerate().filter(|(i, _)| !dims.contains(&(*i as u64))).map(|(_, v)| *v).collect();
                        if kept.len() == rank {
                            kept
                        } else {
                            vec![true; rank]
                        }
                    }
                    None => vec![true; rank],
                }
            }
            "vector.shape_cast" | "tpu.reshape" => {
                // Constant along every dimension if the source is; else varies (conservative).
                let all_const = ins.first().is_some_and(|s| s.varies.iter().all(|v| !v));
                vec![!all_const; rank]
            }
            "tpu.concatenate" => {
                let dim = op.attrs.get("dimension").and_then(|x| x.as_u64()).unwrap_or(0) as usize;
                // Copies of one value at most one register wide along `dim` (`jnp.tile` of a
                // lane-replicated (rows, 128) array, as Splash's q positions): every register of
                // the result is a register of the source, so the result counts as constant
                // along `dim` (the compiler computes on the source's registers once).
                let reg = if dim + 1 == rank { self.chip.vpu.lanes.value as u64 } else { self.chip.vpu.sublanes.value as u64 };
                let ids: Vec<&Operand> = op.operands.iter().collect();
                let same = ids.len() > 1 && ids.windows(2).all(|w| w[0] == w[1]) && matches!(ids[0], Operand::Op(_));
                let tiled = same && (dim + 2 >= rank) && ins.first().is_some_and(|v| v.shape.len() == rank && v.shape[dim] <= reg);
                (0..rank).map(|i| (i == dim && !tiled) || ins.iter().any(|v| v.varies.get(i).copied().unwrap_or(true) && !(tiled && i == dim))).collect()
            }
            _ => {
                if ins.iter().any(|v| v.shape.len() == rank) {
                    (0..rank).map(|i| ins.iter().any(|v| v.shape.len() == rank && v.varies[i])).collect()
                } else {
                    vec![true; rank]
                }
            }
        };
        let elem = self.elem(op)?;
        if rank >= 2 {
            let vals_bytes = cost::vmem_buffers_bytes(&[VmemBuffer { name: String::new(), shape: shape.clone(), elem_bytes: elem, count: 1 }]);
            self.largest = self.largest.max(vals_bytes[0].1);
        }
        let ns = nslabs(&shape, &varies);
        let vr = cost::vregs(&shape, &varies, self.chip);
        let in_refs: Vec<&Val> = ins.iter().collect();
        let mut out = Val { shape: shape.clone(), varies: varies.clone(), deps: vec![Vec::new(); ns], carry: None, unit: None };
        match c {
            OpCost::Free => {
                self.free(op, name, &ins, &mut out)?;
            }
            OpCost::Vpu(k) => {
                for s in 0..ns {
                    let share = slab_share(&shape, s, ns);
                    let (n, sl) = self.node(static_name, Work::Vector { ops: k * vr * share, loaded_mask_vregs: 0.0 }, &in_refs, &[], s, ns);
                    out.deps[s] = vec![(n, sl)];
                }
                out.unit = Some(tpusim_kernel::Unit::Vpu);
            }
            OpCost::Eup { eup, vpu } => {
                for s in 0..ns {
                    let share = slab_share(&shape, s, ns);
                    if vpu > 0.0 {
                        let (n, sl) = self.node(static_name, Work::Vector { ops: vpu * vr * share, loaded_mask_vregs: 0.0 }, &in_refs, &[], s, ns);
                        let scaled = Val { shape: Vec::new(), varies: Vec::new(), deps: vec![vec![(n, sl)]], carry: None, unit: Some(tpusim_kernel::Unit::Vpu) };
                        let (e, esl) = self.node(static_name, Work::Transcendental { vregs: eup * vr * share }, &[&scaled], &[], 0, 1);
                        out.deps[s] = vec![(e, esl)];
                    } else {
                        let (e, esl) = self.node(static_name, Work::Transcendental { vregs: eup * vr * share }, &in_refs, &[], s, ns);
                        out.deps[s] = vec![(e, esl)];
                    }
                }
                out.unit = Some(tpusim_kernel::Unit::Eup);
            }
            OpCost::Xlu => {
                let src_vr = ins.first().map(|v| cost::vregs(&v.shape, &v.varies, self.chip)).unwrap_or(vr);
                // A transpose (of the two minor dimensions, the ones Mosaic transposes): a slab
                // of the result's rows is a slab of the source's columns, so it needs every
                // slab of the source.
                let whole: Vec<Val> = if name.ends_with(".transpose") {
                    ins.iter()
                        .map(|v| Val { shape: Vec::new(), varies: Vec::new(), deps: vec![v.deps.concat()], carry: v.carry.clone(), unit: v.unit })
                        .collect()
                } else {
                    Vec::new()
                };
                let in_refs: Vec<&Val> = if whole.is_empty() { in_refs } else { whole.iter().collect() };
                for s in 0..ns {
                    let share = slab_share(&shape, s, ns);
                    // A transpose's slabs all need the whole source, so they issue together
                    // (one op on the XLU, as the hand model's ds^T): a later slab does not wait
                    // for a later slot, and two transposes of equal depth run one after the
                    // other rather than slab by slab in turn (which delayed both results).
                    let floor = if whole.is_empty() { self.base + s as u64 } else { self.base };
                    let (n, sl) = self.node_from(static_name, Work::CrossLane { vregs: src_vr * share }, &in_refs, &[], s, ns, floor);
                    out.deps[s] = vec![(n, sl)];
                }
                if !whole.is_empty() {
                    // A transpose hands its result on whole: its consumers wait for every slab
                    // of it (the hand model's rule for the fused backward's ds^T; pipelining
                    // dq behind it slab by slab takes 4-8% off tokamax's measured fused
                    // backward rows, which the model already predicts fast).
                    let all = out.deps.concat();
                    for d in out.deps.iter_mut() {
                        d.clone_from(&all);
                    }
                }
                out.unit = Some(tpusim_kernel::Unit::Xlu);
            }
            OpCost::Reduce => self.reduce(op, static_name, &ins, &mut out)?,
            OpCost::Matmul => self.matmul(op, static_name, &ins, &mut out)?,
            OpCost::Dma => {
                self.dma_bytes += op.attrs.get("bytes").and_then(|b| b.as_u64()).unwrap_or(0);
            }
        }
        self.vals.insert(op.id, out);
        Ok(())
    }

    /// Records the ref `op`'s result is computed from, for matmul signatures ([`Self::matmul`]):
    /// a load's ref, and through a view, cast, transpose or element-wise op the ref of its one
    /// loaded operand when its other operands are constants (k scaled or cast as it is read).
    fn note_load_ref(&mut self, op: &Op, name: &str) {
        if matches!(name, "vector.load" | "tpu.load" | "tpu.strided_load") {
            if let Some(r) = self.ref_index(op) {
                self.load_refs.insert(op.id, r);
            }
            return;
        }
        if matches!(name, "tpu.matmul" | "vector.contract" | "vector.multi_reduction") || name.contains("store") {
            return;
        }
        let mut from: Option<usize> = None;
        for o in &op.operands {
            let Operand::Op(id) = o else { continue };
            match self.load_refs.get(id) {
                Some(&r) if from.is_none_or(|f| f == r) => from = Some(r),
                Some(_) => return,
                None if self.vals.get(id).is_some_and(|v| v.varies.iter().all(|x| !x)) => {}
                None => return,
            }
        }
        if let Some(r) = from {
            self.load_refs.insert(op.id, r);
        }
    }

    fn ref_index(&self, op: &Op) -> Option<usize> {
        op.operands.iter().find_map(|o| match o {
            Operand::Ref(r) => Some(*r),
            _ => None,
        })
    }

    fn slot(&mut self, r: usize, s: usize) -> u16 {
        let n = self.slots.len() as u16;
        *self.slots.entry((r, s)).or_insert(n)
    }

    fn free(&mut self, op: &Op, name: &str, ins: &[Val], out: &mut Val) -> Result<(), PallasError> {
        let ns = out.deps.len();
        match name {
            "vector.load" | "tpu.load" | "tpu.strided_load" => {
                if let Some(r) = self.ref_index(op) {
                    if self.carried.get(r).copied().unwrap_or(false) {
                        // Written earlier in this step: wait for that store; else carried in.
                        let mut carry = Vec::new();
                        for s in 0..ns {
                            match self.writers.get(&(r, s)).or_else(|| self.writers.get(&(r, 0))) {
                                Some(w) => out.deps[s] = w.clone(),
                                None => carry.push(self.slot(r, s)),
                            }
                        }
                        if carry.len() == ns {
                            out.carry = Some(carry);
                        }
                    }
                }
            }
            "tpu.vector_store" | "vector.store" | "tpu.store" | "tpu.strided_store" => {
                if let (Some(r), Some(v)) = (self.ref_index(op), ins.first()) {
                    let fill = !v.shape.is_empty() && v.varies.iter().all(|x| !x) && v.deps.iter().all(Vec::is_empty);
                    let carried = self.carried.get(r).copied().unwrap_or(false);
                    if fill {
                        // A buffer filled with a constant (an accumulator zeroed, a running max
                        // set to the mask value): one VPU operation per register written, the
                        // hand-written lowerings' rule for a zero-fill (the model has no vector
                        // store slot; other stores ride with the op that computed their value).
                        let all = vec![true; v.shape.len()];
                        let regs = cost::vregs(&v.shape, &all, self.chip);
                        let ns = nslabs(&v.shape, &all);
                        for s in 0..ns {
                            let share = slab_share(&v.shape, s, ns);
                            let (n, sl) = self.node("fill", Work::Vector { ops: regs * share, loaded_mask_vregs: 0.0 }, &[], &[], s, ns);
                            if carried {
                                self.writers.insert((r, s), vec![(n, sl)]);
                            }
                        }
                    } else if carried {
                        let vs = v.deps.len();
                        for s in 0..vs {
                            if !v.deps[s].is_empty() {
                                self.writers.insert((r, s), v.deps[s].clone());
                            }
                        }
                    }
                }
            }
            _ => {
                // Pass-through: slab-aligned dependencies of every operand.
                for v in ins {
                    for s in 0..ns {
                        if v.deps.len() == ns {
                            out.deps[s].extend(v.deps[s].iter().copied());
                        } else {
                            for l in &v.deps {
                                out.deps[s].extend(l.iter().copied());
                            }
                        }
                    }
                    if out.carry.is_none() && v.deps.iter().all(Vec::is_empty) {
                        if let Some(c) = &v.carry {
                            out.carry = Some(if c.len() == ns { c.clone() } else { vec![c[c.len() - 1]; ns] });
                        }
                    }
                    if out.unit.is_none() {
                        out.unit = v.unit;
                    }
                }
            }
        }
        Ok(())
    }

    fn reduce(&mut self, op: &Op, name: &'static str, ins: &[Val], out: &mut Val) -> Result<(), PallasError> {
        let src = ins.first().ok_or_else(|| self.kernel_err(op, "a reduction without its source".into()))?;
        let dims: Vec<usize> = op.attrs.get("dims").and_then(|d| d.as_array()).map(|a| a.iter().filter_map(|x| x.as_u64().map(|u| u as usize)).collect()).unwrap_or_default();
        let n = src.shape.len();
        let src_vr = cost::vregs(&src.shape, &src.varies, self.chip);
        let lanes_reduced = n >= 1 && dims.contains(&(n - 1)) && src.varies[n - 1];
        let rows_reduced = n >= 2 && dims.contains(&(n - 2)) && src.varies[n - 2];
        // The source reduced to one register along each reduced dimension.
        let mut tile_shape = src.shape.clone();
        for &dd in &dims {
            if dd + 2 < n {
                tile_shape[dd] = 1;
            }
        }
        if lanes_reduced {
            tile_shape[n - 1] = tile_shape[n - 1].min(self.chip.vpu.lanes.value as u64);
        }
        if rows_reduced {
            tile_shape[n - 2] = tile_shape[n - 2].min(self.chip.vpu.sublanes.value as u64);
        }
        let tile_vr = cost::vregs(&tile_shape, &src.varies, self.chip);
        let mut vpu = (src_vr - tile_vr).max(0.0);
        if rows_reduced {
            // Within a register: log2(8) sublane rotations and combines.
            vpu += 3.0 * tile_vr;
        }
        let xlu = if lanes_reduced { tile_vr } else { 0.0 };
        // Slabs follow the source's rows when they survive the reduction.
        let ns_src = src.deps.len();
        let ns = if rows_reduced { 1 } else { ns_src };
        self.row_reduction |= rows_reduced && ns_src > 1;
        out.deps = vec![Vec::new(); ns];
        let srcs = [src];
        for s in 0..ns {
            let share = slab_share(&src.shape, s, ns);
            let mut last: Vec<(NodeIdx, u64)> = Vec::new();
            let mut unit = None;
            let v = if vpu > 0.0 {
                let (a, sl) = self.node(name, Work::Vector { ops: vpu * share, loaded_mask_vregs: 0.0 }, &srcs, &[], s, ns);
                unit = Some(tpusim_kernel::Unit::Vpu);
                Some(Val { shape: Vec::new(), varies: Vec::new(), deps: vec![vec![(a, sl)]], carry: None, unit })
            } else {
                None
            };
            if xlu > 0.0 {
                let inputs: Vec<&Val> = match &v {
                    Some(v) => vec![v],
                    None => vec![src],
                };
                let (s0, n0) = if v.is_some() { (0, 1) } else { (s, ns) };
                let (b, sl) = self.node(name, Work::CrossLane { vregs: xlu * share }, &inputs, &[], s0, n0);
                last.push((b, sl));
                unit = Some(tpusim_kernel::Unit::Xlu);
            } else if let Some(v) = &v {
                last = v.deps[0].clone();
            }
            out.deps[s] = last;
            out.unit = unit;
        }
        Ok(())
    }

    fn matmul(&mut self, op: &Op, name: &'static str, ins: &[Val], out: &mut Val) -> Result<(), PallasError> {
        let raw = op.attrs.get("mkn");
        let mkn: Vec<u64> = raw.and_then(|d| d.as_array()).map(|a| a.iter().filter_map(|x| x.as_u64()).collect()).unwrap_or_default();
        let [m, k, n] = mkn[..] else {
            let why = match raw {
                None => "a matmul without its `mkn` attribute (rows, contraction, columns)".to_string(),
                Some(v) => format!("a matmul's `mkn` attribute = {v}: expected three whole numbers (rows, contraction, columns)"),
            };
            return Err(self.kernel_err(op, why));
        };
        let batch = op.attrs.get("batch").and_then(|b| b.as_u64()).unwrap_or(1).max(1);
        let lhs_t = op.attrs.get("lhs_dtype").and_then(|x| x.as_str()).unwrap_or("bf16");
        let rhs_t = op.attrs.get("rhs_dtype").and_then(|x| x.as_str()).unwrap_or("bf16");
        let precision = op.attrs.get("precision").and_then(|x| x.as_str());
        let passes = cost::mxu_passes_for_operands(lhs_t, rhs_t, precision);
        if lhs_t == "f32" || rhs_t == "f32" {
            self.f32_matmuls += 1;
        }
        // Rows of the result split into slabs (the lhs streams; the rhs is the stationary weight).
        let rank = out.shape.len();
        let ns = out.deps.len();
        let lhs = ins.first();
        let rhs = ins.get(1);
        let acc = ins.get(2);
        let pop_vr = cost::vregs(&out.shape, &vec![true; rank], self.chip);
        // f32 operands are rounded to bf16 on the VPU before the MXU, one operation per f32
        // register of the operand (the kernel crate's rule, `tpusim_kernel::mxu`): the
        // stationary rhs once, the streamed lhs per slab.
        let rounded_rhs: Option<Val> = match rhs {
            Some(rv) if rhs_t == "f32" => {
                let ops = cost::vregs(&rv.shape, &rv.varies, self.chip) * batch as f64;
                // The weights are latched before the first row streams, so their preparation
                // from a loaded window (a widening such as JAX Splash's v to f32, with no
                // producer in the step) issues at the earliest of its slots rather than slab
                // by slab behind the streamed work: the hand-written lowerings' rule.
                let producers: Vec<(NodeIdx, u64)> = rv.deps.concat();
                let graph = std::sync::Arc::make_mut(&mut self.body.graph);
                let loaded_only = producers.iter().all(|&(n, _)| graph.neighbors_directed(n, petgraph::Direction::Incoming).next().is_none());
                let hoisted;
                let rv = match producers.iter().map(|p| p.1).min().filter(|_| loaded_only) {
                    Some(first) => {
                        for &(n, _) in &producers {
                            let op = &mut graph[n];
                            op.issue = first * SLOT + op.issue % SLOT;
                        }
                        hoisted = Val { deps: vec![producers.iter().map(|&(n, _)| (n, first)).collect()], ..rv.clone() };
                        &hoisted
                    }
                    None => rv,
                };
                let (nd, sl) = self.node("round_rhs", Work::Vector { ops, loaded_mask_vregs: 0.0 }, &[rv], &[], 0, 1);
                Some(Val { shape: Vec::new(), varies: Vec::new(), deps: vec![vec![(nd, sl)]], carry: None, unit: Some(tpusim_kernel::Unit::Vpu) })
            }
            _ => None,
        };
        let rhs = rounded_rhs.as_ref().or(rhs);
        let lhs_vr = lhs.map(|l| cost::vregs(&l.shape, &l.varies, self.chip) * batch as f64).unwrap_or(0.0);
        // An unrolled loop's next iteration after a reduction over a matmul result's rows (a
        // softmax over kv-major scores, k q^T, which needs every slab of them): a matmul of the
        // same shape on operands loaded from the same refs as an earlier one of this body (the
        // next sub-tile's k q^T, after this sub-tile's p v), independent of the matmul just
        // before it, ranks after that matmul on the MXU, as a rolled loop's iterations do
        // (`scf.for` advances the slot base). Sharing the first iteration's slots would
        // interleave every iteration's slabs and hold the first reduction until all of them
        // had streamed. It still runs first whenever the earlier one is not ready (the list
        // schedule takes the first ready operation). Without such a reduction the iterations
        // keep sharing slots: each slab's chain is its own (q-major scores, the backward's
        // sub-tiles, which `tpusim_kernel::splash::bwd` interleaves for the same reason).
        let read_from = |i: usize| match op.operands.get(i) {
            Some(Operand::Op(id)) => self.load_refs.get(id).copied(),
            _ => None,
        };
        let sig: MatmulSig = (m, k, n, read_from(0), read_from(1));
        let repeat = sig.3.is_some() && sig.4.is_some() && !self.matmul_sigs.insert(sig);
        let prev_mm = self.last_matmul.take();
        let after = prev_mm.filter(|_| repeat && self.row_reduction).and_then(|(nodes, last)| {
            let mut roots: Vec<NodeIdx> = Vec::new();
            for v in lhs.iter().chain(rhs.iter()).chain(acc.iter()) {
                roots.extend(v.deps.iter().flatten().map(|d| d.0));
            }
            (!depends_on(&self.body.graph, &roots, &nodes)).then_some(last)
        });
        let mut mm_nodes: Vec<NodeIdx> = Vec::new();
        let mut mm_last = 0u64;
        for s in 0..ns {
            let r = if ns == 1 { m } else { slab_rows(&out.shape, s, ns) };
            let share = r as f64 / m.max(1) as f64;
            let mut inputs: Vec<&Val> = Vec::new();
            let rounded_lhs;
            if let Some(l) = lhs {
                if lhs_t == "f32" {
                    let (nd, sl) = self.node("round_lhs", Work::Vector { ops: lhs_vr * share, loaded_mask_vregs: 0.0 }, &[l], &[], s, ns);
                    rounded_lhs = Val { shape: Vec::new(), varies: Vec::new(), deps: vec![vec![(nd, sl)]], carry: None, unit: Some(tpusim_kernel::Unit::Vpu) };
                    inputs.push(&rounded_lhs);
                } else {
                    inputs.push(l);
                }
            }
            // The weights: every slab of the rhs.
            let mut extra: Vec<(NodeIdx, u64)> = Vec::new();
            if let Some(rv) = rhs {
                // Weights are latched ahead of the stream: no issue skew beyond their producers'.
                for l in &rv.deps {
                    extra.extend(l.iter().copied());
                }
            }
            let mut prev: Option<(NodeIdx, u64)> = None;
            for _ in 0..batch {
                let mut ex = extra.clone();
                ex.extend(prev);
                let floor = (self.base + s as u64).max(after.map_or(0, |a| a + 1 + s as u64));
                let (mm, sl) = self.node_from(name, Work::Matmul { m: r * passes, k, n, m_total: m * passes }, &inputs, &ex, s, ns, floor);
                prev = Some((mm, sl));
                mm_nodes.push(mm);
                mm_last = mm_last.max(sl);
            }
            let mm = prev.expect("batch >= 1");
            let mxu_val = Val { shape: Vec::new(), varies: Vec::new(), deps: vec![vec![mm]], carry: None, unit: Some(tpusim_kernel::Unit::Mxu) };
            let mut pop_in: Vec<&Val> = vec![&mxu_val];
            if let Some(a) = acc {
                pop_in.push(a);
            }
            let (p, psl) = self.node("matmul_pop", Work::Vector { ops: pop_vr * share, loaded_mask_vregs: 0.0 }, &pop_in, &[], 0, 1);
            out.deps[s] = vec![(p, psl)];
        }
        out.unit = Some(tpusim_kernel::Unit::Vpu);
        self.last_matmul = Some((mm_nodes, mm_last));
        Ok(())
    }

    fn finish(mut self) -> (StepBody, u64, u64, u64) {
        // The last store of each carried slab writes its slot.
        let mut writes: Vec<(RefSlab, Deps)> = self.writers.drain().collect();
        writes.sort_by_key(|w| w.0);
        for ((r, s), w) in writes {
            let slot = self.slot(r, s);
            if let Some(&(n, _)) = w.iter().max_by_key(|x| x.1) {
                let op = &mut std::sync::Arc::make_mut(&mut self.body.graph)[n];
                if op.carry_out.is_none() {
                    op.carry_out = Some(slot);
                    self.body.carries = self.body.carries.max(slot + 1);
                }
            }
        }
        self.body.carries = self.body.carries.max(self.slots.len() as u16);
        (self.body, self.largest, self.f32_matmuls, self.dma_bytes)
    }
}

/// Whether any of `roots` is one of `targets` or reaches one through its inputs (a depth-first
/// walk of the reversed graph, each node visited once).
fn depends_on(graph: &petgraph::graph::DiGraph<tpusim_kernel::TileOp, ()>, roots: &[NodeIdx], targets: &[NodeIdx]) -> bool {
    use petgraph::visit::{Dfs, Reversed};
    let rev = Reversed(graph);
    let mut dfs = Dfs::empty(&rev);
    roots.iter().any(|&r| {
        dfs.move_to(r);
        std::iter::from_fn(|| dfs.next(&rev)).any(|n| targets.contains(&n))
    })
}

fn has_matmul(b: &StepBody) -> bool {
    b.graph.node_weights().any(|op| matches!(op.work, Work::Matmul { .. }))
}

/// Calls `f(class, steps)` for every run of the stream.
fn listed_count(l: &ListedSteps, classes: &[StepClass], f: &mut dyn FnMut(&StepClass, u64)) {
    let p = Program::from_listed(Vec::new(), l.clone(), VmemBudget::default(), ProgramInfo::default());
    p.for_each_run(&mut |s, n| f(&classes[s.class as usize], n));
}

/// Whether the body stores to SMEM (`memref.store`): then its SMEM state is carried from step
/// to step ([`crate::runtime`]).
fn stores_smem(ops: &[Op]) -> bool {
    ops.iter().any(|o| o.op == "memref.store" || stores_smem(&o.then) || stores_smem(&o.otherwise))
}

/// Which refs the body both loads and stores (carried across steps).
fn carried_refs(d: &Description) -> Vec<bool> {
    let mut loads = vec![false; d.refs.len()];
    let mut stores = vec![false; d.refs.len()];
    fn visit(ops: &[Op], loads: &mut [bool], stores: &mut [bool]) {
        for op in ops {
            let r = op.operands.iter().find_map(|o| match o {
                Operand::Ref(r) => Some(*r),
                _ => None,
            });
            if let Some(r) = r {
                if r < loads.len() {
                    match op.op.as_str() {
                        "vector.load" | "tpu.load" | "tpu.strided_load" => loads[r] = true,
                        "tpu.vector_store" | "vector.store" | "tpu.store" | "tpu.strided_store" => stores[r] = true,
                        _ => {}
                    }
                }
            }
            visit(&op.then, loads, stores);
            visit(&op.otherwise, loads, stores);
        }
    }
    visit(&d.body, &mut loads, &mut stores);
    loads.iter().zip(&stores).map(|(a, b)| *a && *b).collect()
}

/// Bytes of a window's block.
fn block_bytes(r: &Ref) -> Result<u64, PallasError> {
    Ok(r.shape.iter().product::<u64>() * dtype_bytes(&r.dtype, "dtype")?)
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
    // Prefetch tables.
    let mut tables: Vec<Option<Table>> = (0..d.refs.len()).map(|_| None).collect();
    let mut smem = 0u64;
    for (i, r) in d.refs.iter().enumerate() {
        if r.kind == RefKind::Prefetch {
            tables[i] = Some(read_table(r, i, dir)?);
            smem += r.shape.iter().product::<u64>() * dtype_bytes(&r.dtype, "dtype")?;
        } else if r.memory_space == MemorySpace::Smem {
            smem += block_bytes(r)? * if r.kind == RefKind::Scratch { 1 } else { r.pipeline_mode.buffers() };
        }
    }
    if smem > chip.smem_bytes() {
        return Err(PallasError::Kernel {
            kernel: d.kernel_name.clone(),
            message: format!("its scalar-prefetch tables and SMEM buffers need {smem} bytes but SMEM holds {} bytes", chip.smem_bytes()),
        });
    }
    check_block_shapes(chip, d)?;
    check_hbm(chip, d)?;
    let tables = Tables { tables, refs: &d.refs };
    let windows: Vec<usize> =
        d.refs.iter().enumerate().filter(|(_, r)| matches!(r.kind, RefKind::Input | RefKind::Output) && r.memory_space != MemorySpace::Any).map(|(i, _)| i).collect();
    let wbytes: Vec<u64> = windows.iter().map(|&i| block_bytes(&d.refs[i])).collect::<Result<_, _>>()?;
    let is_out: Vec<bool> = windows.iter().map(|&i| d.refs[i].kind == RefKind::Output).collect();
    // Parallel units: the leading parallel dimensions.
    let lead_par = d.dimension_semantics.iter().take_while(|s| matches!(s, DimSemantics::Parallel | DimSemantics::CoreParallel)).count();
    let unit_size: u64 = d.grid[lead_par..].iter().product::<u64>().max(1);
    let units = d.grid[..lead_par].iter().product::<u64>().max(1);
    let carried = carried_refs(d);
    // Step generation.
    let ndim = d.grid.len();
    let mut idx = vec![0i64; ndim];
    // Every window's block index at a step, in one flat buffer (window w at `offs[w]..offs[w + 1]`).
    let mut offs = vec![0usize];
    for &w in &windows {
        offs.push(offs.last().copied().unwrap_or(0) + d.refs[w].index_map.as_ref().map_or(0, Vec::len));
    }
    // A window whose index map equals an earlier window's (K and V of attention) copies its
    // values instead of evaluating them again.
    let same_as: Vec<Option<usize>> =
        (0..windows.len()).map(|w| (0..w).find(|&e| d.refs[windows[e]].index_map == d.refs[windows[w]].index_map)).collect();
    // Per window, the number of blocks along each dimension when its array's shape is known
    // (flat, as the block indices are; u64::MAX when not): a block index outside them (a
    // scalar-prefetch table pointing past the array) copies memory the array does not have.
    let limits: Vec<u64> = windows
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
    let out_of_array = |idx: &[i64], out: &[i64]| -> PallasError {
        let at = out.iter().zip(&limits).position(|(&b, &n)| b as u64 >= n).unwrap_or(0);
        let k = offs.partition_point(|&o| o <= at) - 1;
        let r = &d.refs[windows[k]];
        PallasError::field(
            &format!("the index map of `{}` at grid index {idx:?}: block index {}", r.name, at - offs[k]),
            out[at],
            format!(
                "expected 0 to {} (array {:?} in blocks of {:?}): a block outside the array (a scalar-prefetch table's entry out of range?)",
                limits[at] - 1,
                r.array_shape.as_deref().unwrap_or_default(),
                r.shape
            ),
        )
    };
    let block_indices = |idx: &[i64], out: &mut Vec<i64>| -> Result<(), PallasError> {
        out.clear();
        let env = StepEnv { idx, ivs: Vec::new(), tables: &tables, smem: None };
        for (k, &w) in windows.iter().enumerate() {
            if let Some(e) = same_as[k] {
                out.extend_from_within(offs[e]..offs[e + 1]);
                continue;
            }
            let r = &d.refs[w];
            for e in r.index_map.as_ref().expect("checked") {
                out.push(e.eval(&env).map_err(|x| eval_err(d, x, &format!("the index map of `{}`", r.name), ""))?);
            }
        }
        // A negative index is past every limit as u64.
        if out.iter().zip(&limits).any(|(&b, &n)| b as u64 >= n) {
            return Err(out_of_array(idx, out));
        }
        Ok(())
    };
    let path = path_skeleton(&d.body);
    let advance = |idx: &mut [i64]| {
        for k in (0..ndim).rev() {
            idx[k] += 1;
            if (idx[k] as u64) < d.grid[k] {
                return;
            }
            idx[k] = 0;
        }
    };
    let mut classes: Vec<StepClass> = Vec::new();
    // A step's class: its path through the body (branch decisions, trip counts) then whether it
    // starts and ends an output block.
    let mut class_ids: HashMap<Vec<i64>, u32, fnv::FnvBuildHasher> = HashMap::default();
    let mut key: Vec<i64> = Vec::new();
    let (mut last_key, mut last_class): (Vec<i64>, Option<u32>) = (Vec::new(), None);
    let mut listed = ListedSteps::new();
    let mut largest = 0u64;
    let mut f32_mm = 0u64;
    let (mut cur, mut next) = (Vec::new(), Vec::new());
    block_indices(&idx, &mut cur)?;
    let mut runs: Vec<(Step, u64)> = Vec::new();
    let mutable_smem = stores_smem(&d.body);
    let mut smem_state = SmemState::default();
    let mut dmas = DmaTally::default();
    let mut next_idx = idx.clone();
    // Per window: whether its block index changes from this step to the next (the next step's
    // "changed since the previous step").
    let mut changes: Vec<bool> = vec![true; windows.len()];
    for step in 0..steps_total {
        let first_step = step == 0;
        let last_step = step + 1 == steps_total;
        if !last_step {
            next_idx.copy_from_slice(&idx);
            advance(&mut next_idx);
            block_indices(&next_idx, &mut next)?;
        }
        let mut in_bytes = 0u64;
        let mut out_bytes = 0u64;
        let mut first = first_step;
        let mut last = last_step;
        for w in 0..windows.len() {
            let changed_in = changes[w];
            let changes_next = last_step || next[offs[w]..offs[w + 1]] != cur[offs[w]..offs[w + 1]];
            changes[w] = changes_next;
            if is_out[w] {
                if changes_next {
                    out_bytes += wbytes[w];
                    last = true;
                }
                if changed_in && !first_step {
                    first = true;
                }
            } else if changed_in {
                in_bytes += wbytes[w];
            }
        }
        // The body's path at this step (SMEM state carried from the previous step).
        let before = if mutable_smem { Some(smem_state.clone()) } else { None };
        let cell = std::cell::RefCell::new(std::mem::take(&mut smem_state));
        let mut env = StepEnv { idx: &idx, ivs: Vec::new(), tables: &tables, smem: Some(&cell) };
        key.clear();
        let mut step_dma = DmaTally::default();
        walk_path(d, &path, &mut env, &mut key, &mut step_dma)?;
        smem_state = cell.into_inner();
        smem_state.vars.clear();
        dmas.merge_step(&step_dma);
        let dma = step_dma.bytes;
        key.push(i64::from(first));
        key.push(i64::from(last));
        let class = match last_class.filter(|_| key == last_key).or_else(|| class_ids.get(key.as_slice()).copied()) {
            Some(c) => c,
            None => {
                if classes.len() >= MAX_CLASSES {
                    return Err(PallasError::Kernel {
                        kernel: d.kernel_name.clone(),
                        message: format!("its steps take more than {MAX_CLASSES} distinct paths through the body"),
                    });
                }
                let mut b = Builder {
                    d,
                    chip,
                    body: StepBody::default(),
                    vals: HashMap::new(),
                    slots: HashMap::new(),
                    last_matmul: None,
                    matmul_sigs: Default::default(),
                    load_refs: HashMap::new(),
                    row_reduction: false,
                    carried: carried.clone(),
                    writers: HashMap::new(),
                    base: 0,
                    seq: 0,
                    largest: 0,
                    f32_matmuls: 0,
                    dma_bytes: 0,
                };
                let cell = std::cell::RefCell::new(before.clone().unwrap_or_default());
                let mut env = StepEnv { idx: &idx, ivs: Vec::new(), tables: &tables, smem: Some(&cell) };
                b.walk(&d.body, &mut env)?;
                let (body, big, f32n, dmab) = b.finish();
                largest = largest.max(big);
                f32_mm += f32n;
                let tile = if body.is_empty() { "empty" } else { "full" };
                let id = classes.len() as u32;
                classes.push(StepClass { key: ClassKey { tile, masked: false, first, last }, body });
                let _ = dmab;
                class_ids.insert(key.clone(), id);
                id
            }
        };
        // Neighbouring steps mostly take the same path: remember the last one.
        if last_class != Some(class) {
            last_class = Some(class);
            last_key.clone_from(&key);
        }
        in_bytes += dma;
        let coords = [
            idx.first().copied().unwrap_or(0) as u32,
            if ndim >= 3 { idx[ndim - 2] as u32 } else { 0 },
            idx.last().copied().unwrap_or(0) as u32,
            0,
        ];
        let s = Step { class, in_bytes, out_bytes, coords };
        match runs.last_mut() {
            Some((r, n)) if r.class == s.class && r.in_bytes == s.in_bytes && r.out_bytes == s.out_bytes && r.coords[2] + *n as u32 == s.coords[2] && r.coords[..2] == s.coords[..2] => *n += 1,
            _ => runs.push((s, 1)),
        }
        if (step + 1) % unit_size == 0 {
            listed.push_unit(std::mem::take(&mut runs));
        }
        // cur <- next (buffers reused).
        std::mem::swap(&mut cur, &mut next);
        std::mem::swap(&mut idx, &mut next_idx);
    }
    debug_assert_eq!(listed.units(), units);
    // "Computed" steps: those whose body runs a matmul when some step does (the kernel's main
    // work: init- or finalize-only steps of an attention kernel do not count), else those whose
    // body runs any work.
    let any_mxu = classes.iter().any(|c| has_matmul(&c.body));
    let computes_count = |c: &StepClass| if any_mxu { has_matmul(&c.body) } else { !c.body.is_empty() };
    let computed: u64 = {
        let mut n = 0u64;
        listed_count(&listed, &classes, &mut |cls, k| {
            if computes_count(cls) {
                n += k
            }
        });
        n
    };
    // VMEM by the kernel crate's one rule (tpusim_kernel::vmem): windows x their buffer counts,
    // scratch once, the largest body value once.
    let mut buffers = Vec::new();
    for r in &d.refs {
        if r.memory_space != MemorySpace::Vmem {
            continue;
        }
        let count = match r.kind {
            RefKind::Input | RefKind::Output => r.pipeline_mode.buffers(),
            RefKind::Scratch => 1,
            RefKind::Prefetch => 0,
        };
        if count > 0 {
            let b = VmemBuffer { name: r.name.clone(), shape: r.shape.clone(), elem_bytes: dtype_bytes(&r.dtype, "dtype")?, count };
            buffers.push(b.to_kernel(r.kind == RefKind::Scratch));
        }
    }
    let limit = d.vmem_limit_bytes.unwrap_or_else(|| chip.vmem_limit_bytes());
    let mut vmem = tpusim_kernel::footprint(&buffers, limit);
    if largest > 0 {
        vmem.buffers.push(("largest body value".into(), largest));
    }
    if vmem.total() > limit {
        return Err(PallasError::Kernel {
            kernel: d.kernel_name.clone(),
            message: format!(
                "its buffers need {} bytes of VMEM ({}) but the scoped limit is {limit} bytes ({:.1} MiB); the kernel sets `vmem_limit_bytes` in its compiler parameters to raise it (physical VMEM: {} MiB)",
                vmem.total(),
                vmem.buffers.iter().map(|(n, b)| format!("{n} {b}")).collect::<Vec<_>>().join(", "),
                limit as f64 / 1048576.0,
                chip.vmem.size_mib.value
            ),
        });
    }
    let mut assumptions = vec![
        "body ops cost (8,128) 32-bit registers on their unit (crates/tpusim-pallas/src/cost.rs); loads, stores, broadcasts and reshapes are free".to_string(),
        "windows follow Pallas's pipeline rule (copy when the block index changes, write back when it will change); every window is timed double-buffered".to_string(),
        "scalar-unit work (index arithmetic, SMEM loads) is part of the fixed grid-step overhead".to_string(),
        "VMEM: windows x their buffer counts, scratch, and the largest intermediate twice (Mosaic's internal scratch is not in the IR)".to_string(),
    ];
    if f32_mm > 0 {
        assumptions.push("f32-operand matmuls at the default precision take one MXU pass, their f32 operands rounded to bf16 on the VPU first (one operation per f32 register; tpusim_kernel::mxu)".into());
    }
    if d.dimension_semantics.iter().skip(lead_par).any(|s| matches!(s, DimSemantics::Parallel | DimSemantics::CoreParallel)) {
        assumptions.push("only the grid's leading parallel dimensions are split over megacore TensorCores".into());
    }
    let info = ProgramInfo {
        kernel: d.kernel_name.clone(),
        kind: KernelKind::Matmul,
        grid: d.grid.iter().enumerate().map(|(i, &g)| (format!("dim {i} ({})", d.dimension_semantics.get(i).map(|s| format!("{s:?}").to_lowercase()).unwrap_or_else(|| "arbitrary".into())), g)).collect(),
        blocks: Vec::new(),
        padded: Vec::new(),
        tiles: Some(TileCounts { total: steps_total, visited: computed, empty: steps_total - computed, partial: 0, full: computed, masked: 0 }),
        kept_pairs: 0,
        visited_pairs: 0,
        exact_kept_pairs: 0,
        grid_steps: steps_total,
        smem_bytes: smem,
    };
    let facts = IrFacts {
        kernel_name: d.kernel_name.clone(),
        steps_computed: computed,
        grid_steps: steps_total,
        classes: classes.len(),
        smem_bytes: smem,
        assumptions,
        declared_cost: d.cost_estimate,
        dmas,
    };
    let _ = units;
    Ok((Program::from_listed(classes, listed, vmem, info), facts))
}
