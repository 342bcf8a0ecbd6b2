//! The one body builder: a grid step's body given as ops (Mosaic's vector ops, with result
//! shapes, operands and the attributes that matter) becomes a [`StepBody`] of tile operations
//! on the units. A kernel read from its IR (crate `tpusim-pallas`) feeds it the ops of the path
//! a step takes; the hand-written kernels of this crate feed it the op sequence their kernel
//! runs ([`Emitter`]). One op-cost table ([`cost`]) prices both.
//!
//! * **Units.** Each op becomes tile operations on its unit ([`cost::OpCost`]), counted in (8,128)
//!   register units ([`cost::vregs`]).
//! * **Slabs.** An op whose rows vary is split into [`SLAB_ROWS`]-row slabs (the MXU streams slab
//!   s + 1 while the vector units work on slab s).
//! * **Issue slots** follow the data flow (software pipelining: an op issues a few slabs after its
//!   producers, more after an MXU producer to cover its latency); the slabs of a transpose, each
//!   of which needs its whole source, issue together. A rolled loop's iterations issue one after
//!   another ([`Builder::advance`]); an unrolled loop's do too once a reduction has needed every
//!   slab of a matmul result (kv-major scores, whose softmax reduces over rows): a matmul
//!   repeating an earlier one of the body (same shape, operands read from the same refs,
//!   directly or through views, casts and element-wise ops with constants) and independent of
//!   the matmul before it ranks after that one.
//! * **Copies and waits.** A copy the kernel starts (`tpu.enqueue_dma`) is a node on the DMA
//!   engines that waits for the last work on each compute unit before it in program order (the
//!   buffer it refills or reads out); it overlaps the work after it. A wait (`tpu.wait_dma2`)
//!   counts the copies on its semaphore, earliest first, until their bytes reach the bytes it
//!   waits for (short of them, it also waits for the DMA queue as the step began: copies an
//!   earlier step started), and every op after it in program order waits for it (the TensorCore
//!   issues in order and stalls at a wait).
//! * **Carried state.** Refs the body both loads and stores (scratch accumulators, output blocks
//!   accumulated in place) are carried: the next step's load of a slab waits for this step's
//!   last store of it. A store of a constant fills its buffer at one VPU operation per register.

pub mod cost;
pub mod emit;

pub use emit::{Emitter, V};

use crate::{StepBody, TileOp, Unit, Work, SLAB_ROWS};
use cost::OpCost;
use petgraph::graph::{DiGraph, NodeIndex as NodeIdx};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use smallvec::SmallVec;

/// An operand of a body op.
#[derive(Debug, Clone, PartialEq)]
pub enum Arg {
    /// The result of the op with this id.
    Op(u64),
    /// A kernel ref (an index into the kernel's refs), for loads and stores.
    Ref(usize),
    /// A scalar (an index, a constant): no unit time, no dependency.
    Scalar,
}

/// The attributes of an op the builder reads.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Attrs {
    /// Iota: the dimensions it counts along; reduction: the dimensions reduced.
    pub dims: Vec<u64>,
    /// Concatenation: the dimension joined.
    pub dimension: Option<u64>,
    /// A strided slice extracted or inserted (`vector.extract_strided_slice`,
    /// `vector.insert_strided_slice`), or a load or store at constant indices: where it starts,
    /// one offset per dimension (empty: not known, taken as aligned).
    pub offsets: Vec<u64>,
    /// Matmul: rows, contraction and columns.
    pub mkn: Option<[u64; 3]>,
    /// Matmul: the batch (1 when absent).
    pub batch: Option<u64>,
    /// Matmul: the operands' element types (`bf16` when absent).
    pub lhs_dtype: Option<String>,
    /// Matmul: the rhs's element type.
    pub rhs_dtype: Option<String>,
    /// Matmul: the precision it asks for.
    pub precision: Option<String>,
    /// A copy (`tpu.enqueue_dma`): the bytes it moves in this step (required); a wait
    /// (`tpu.wait_dma2`): the bytes it waits for (absent: every copy on its semaphore).
    pub bytes: Option<u64>,
    /// A copy or a wait: which DMA semaphore it signals or waits on (the semaphore ref's index,
    /// then the element's indices, evaluated in this step); absent: not known, and a wait then
    /// waits for every copy the body started before it.
    pub semaphore: Option<Vec<i64>>,
    /// A copy (`tpu.enqueue_dma`): where its data goes ([`crate::ir::DmaPath`]; absent: HBM to
    /// VMEM). A copy from HBM to HBM reads its bytes from HBM and writes them back, so the DMA
    /// engines carry them twice (the waits still count them once).
    pub dma_path: Option<crate::ir::DmaPath>,
    /// A transpose the compiler folds into the matmul that reads it (Mosaic's
    /// `canonicalize_matmul`: a transpose of the two minor dimensions whose one use is a
    /// matmul's rhs becomes that matmul's transposed rhs, which the MXU latches as it loads the
    /// weights, and the transpose is erased): no operation, its result is its operand. The
    /// reader decides it from the op's uses (`tpusim_pallas`).
    pub folded: bool,
}

/// One op of a body: its name (`arith.addf`, `tpu.matmul`, ...), result id, shape and element
/// type, operands and attributes, and where it comes from (for messages).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BodyOp {
    /// Result id (operands refer to it).
    pub id: u64,
    /// The MLIR op name.
    pub name: String,
    /// Result shape (empty for ops without a vector result).
    pub shape: Vec<u64>,
    /// Result element type (`f32`, `bf16`, `i32`, `i1`, ...; empty: 4 bytes).
    pub dtype: String,
    /// Operands.
    pub args: Vec<Arg>,
    /// Attributes.
    pub attrs: Attrs,
    /// Source location, for messages.
    pub loc: String,
}

/// Why an op cannot be built: the message (the caller names the op, kernel and location).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct OpError(pub String);

/// A built body with what the front end reports beside it.
#[derive(Debug, Clone)]
pub struct Built {
    /// The body.
    pub body: StepBody,
    /// Bytes of the largest vector value (tile padded): VMEM Mosaic materialises at once.
    pub largest_bytes: u64,
    /// The largest vector value's shape and element type (the first of that size), if any.
    pub largest_value: Option<(Vec<u64>, crate::dtype::Dtype)>,
    /// Matmuls with an f32 operand.
    pub f32_matmuls: u64,
}

/// Bytes of an element type as VMEM holds it (4 for an empty or unknown one, as 32-bit
/// registers hold them; sub-byte and mask types take a byte).
pub fn elem_bytes(dtype: &str) -> u64 {
    match dtype {
        "f64" | "i64" | "ui64" | "index" => 8,
        "bf16" | "f16" | "i16" | "ui16" => 2,
        "i8" | "ui8" | "f8E4M3FN" | "f8E5M2" | "f8E4M3B11FNUZ" | "f8E4M3FNUZ" | "f8E5M2FNUZ" | "i1" | "i4" | "ui4" | "f4E2M1FN" => 1,
        _ => 4,
    }
}

/// A value in the body: its shape, the dimensions along which it varies, and what its
/// consumers wait for per slab.
#[derive(Debug, Clone)]
struct Val {
    shape: Vec<u64>,
    varies: Vec<bool>,
    /// Slabs of the value ([`nslabs`]; 1 when not split).
    ns: usize,
    /// Per slab: (nodes to depend on, their issue slot). A body built for counting only keeps no
    /// dependencies: at most one list, present when some node produced the value.
    deps: Vec<Deps>,
    /// Carried state this value was loaded from (per slab carry slot), before any store of it
    /// in this step.
    carry: Option<Vec<u16>>,
    /// The unit of the producing node (for issue skews).
    unit: Option<Unit>,
}

impl Val {
    /// A value that only carries dependencies (an op's intermediate node).
    fn after(deps: Deps, unit: Unit) -> Val {
        Val { shape: Vec::new(), varies: Vec::new(), ns: 1, deps: vec![deps], carry: None, unit: Some(unit) }
    }

    /// Sets slab `s`'s dependencies (when counting, the first list only: it marks the value as
    /// produced).
    fn set(&mut self, s: usize, d: Deps) {
        if self.deps.is_empty() {
            self.deps.push(d);
        } else if let Some(x) = self.deps.get_mut(s) {
            *x = d;
        }
    }
}

/// Slabs of a value of `shape` varying along `varies`: its rows in [`SLAB_ROWS`]-row slabs when
/// they vary, else 1.
fn nslabs(shape: &[u64], varies: &[bool]) -> usize {
    let n = shape.len();
    if n < 2 || !varies.get(n - 2).copied().unwrap_or(true) {
        return 1;
    }
    shape[n - 2].div_ceil(SLAB_ROWS).max(1) as usize
}

/// Slabs of a value of `shape` varying along every dimension: how far a loop iteration of ops
/// of this shape advances the issue slots ([`Builder::advance`]).
pub fn slabs_of(shape: &[u64]) -> usize {
    if shape.len() >= 2 {
        nslabs(shape, &vec![true; shape.len()])
    } else {
        1
    }
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
/// A copy started and not yet waited for: its node, issue slot and the bytes no wait has
/// counted yet.
type Outstanding = (NodeIdx, u64, u64);
/// Nodes to wait for, with their issue slots (most values wait for one node: kept inline).
type Deps = SmallVec<[(NodeIdx, u64); 2]>;
/// A matmul's (m, k, n) and the refs its lhs and rhs are loaded from (`None`: computed).
type MatmulSig = (u64, u64, u64, Option<usize>, Option<usize>);

/// The share of a value's work in slab `s` of `ns`.
fn slab_share(shape: &[u64], s: usize, ns: usize) -> f64 {
    if ns == 1 {
        1.0
    } else {
        slab_rows(shape, s, ns) as f64 / shape[shape.len() - 2] as f64
    }
}

/// The skew from a producer on `from` to a consumer on `to` (module docs).
fn skew(from: Option<Unit>, to: Unit) -> u64 {
    match (from, to) {
        (Some(Unit::Mxu), _) => 3,
        (_, Unit::Eup) | (_, Unit::Xlu) => 1,
        (_, Unit::Mxu) => 2,
        _ => 0,
    }
}

/// Issue keys: slot x SLOT + sequence number (program order within a slot).
const SLOT: u64 = 1 << 20;

fn is_load(name: &str) -> bool {
    matches!(name, "vector.load" | "tpu.load" | "tpu.strided_load")
}

fn is_store(name: &str) -> bool {
    matches!(name, "tpu.vector_store" | "vector.store" | "tpu.store" | "tpu.strided_store")
}

/// Which refs the ops both load and store: carried across steps ([`Builder::new`]).
pub fn carried_refs<'a>(refs: usize, ops: impl IntoIterator<Item = (&'a str, Option<usize>)>) -> Vec<bool> {
    let mut loads = vec![false; refs];
    let mut stores = vec![false; refs];
    for (name, r) in ops {
        if let Some(r) = r.filter(|&r| r < refs) {
            if is_load(name) {
                loads[r] = true;
            } else if is_store(name) {
                stores[r] = true;
            }
        }
    }
    loads.iter().zip(&stores).map(|(a, b)| *a && *b).collect()
}

/// Builds one step body from its ops in program order (module docs). A clone continues
/// independently: a body and the same body with more ops after it share the build of the ops
/// before (the two bodies of a step without and with its row's end, [`cached_pair`]).
#[derive(Debug, Clone)]
pub struct Builder {
    /// The body's graph, built in place (a [`StepBody`] at [`Builder::finish`]).
    graph: DiGraph<TileOp, ()>,
    /// Carried-state slots the graph's operations name.
    carries: u16,
    /// Scratch: the nodes one new node depends on.
    scratch: Vec<NodeIdx>,
    vals: HashMap<u64, std::rc::Rc<Val>>,
    /// Carry slot per (ref, slab).
    slots: HashMap<(usize, usize), u16>,
    /// Refs that are carried (loaded and stored by the body).
    carried: Vec<bool>,
    /// Last writer in this step per (ref, slab).
    writers: HashMap<(usize, usize), Deps>,
    /// Offset of issue slots for the current loop iteration (slabs of earlier iterations).
    base: u64,
    /// The previous matmul in program order: its slab nodes and its last slab's issue slot.
    last_matmul: Option<(Vec<NodeIdx>, u64)>,
    /// Matmuls seen in this body, by (m, k, n, the refs its operands are loaded from).
    matmul_sigs: HashSet<MatmulSig>,
    /// The ref a value is read from (a load, or a view, cast or element-wise op of one load
    /// with constants), by value id.
    load_refs: HashMap<u64, usize>,
    /// A reduction over a slab-split value's rows (which needs every slab) has been lowered.
    row_reduction: bool,
    seq: u64,
    largest: u64,
    largest_value: Option<(Vec<u64>, crate::dtype::Dtype)>,
    f32_matmuls: u64,
    /// Operations only, no edges or carried state ([`counting_only`]): their works, consecutive
    /// equal ones counted once.
    counting: bool,
    tally: Vec<(Work, u32)>,
    /// How many slabs the node being built stands for ([`Builder::reps`]; 1 unless counting).
    mult: u32,
    /// Copies the body started and no wait has counted yet, per semaphore, in issue order.
    outstanding: HashMap<Option<Vec<i64>>, std::collections::VecDeque<Outstanding>>,
    /// The last wait: every node after it in program order depends on it (the TensorCore
    /// issues in order and stalls at a wait until its copies have landed).
    barrier: Option<(NodeIdx, u64)>,
    /// The last node built on each compute unit: a copy the body starts waits for them (the
    /// buffer it refills or reads out was last used by the work before it in program order).
    last_on_unit: [Option<(NodeIdx, u64)>; 4],
}

thread_local! {
    /// Whether bodies built on this thread are for counting only ([`counting_only`]).
    static COUNTING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with the step bodies it builds on this thread made for counting only: each has every
/// operation with its unit and work, as a full build gives them, but no dependency edges,
/// issue order or carried state. That is all a per-unit occupancy sum needs (the engine's
/// `cycles_lower_bound`, which `tpusim tune` uses to skip candidates that cannot rank), at a
/// fraction of the cost of a full build; such a body must never be simulated.
pub fn counting_only<T>(f: impl FnOnce() -> T) -> T {
    /// Restores the thread's flag however `f` ends.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            COUNTING.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(COUNTING.with(|c| c.replace(true)));
    f()
}

/// The step body under `keys[want]`: `build` builds both bodies, `keys[0]`'s and `keys[1]`'s,
/// when no recent lowering of this process built the one wanted (a hand lowering names a body
/// by its kernel and step fields), and both are kept: lowerings of one shape, and a sweep's
/// points that share one, build it once. A step and the same step at its row's end are such a
/// pair: every op before the end is emitted once ([`Builder::finish_copy`]), and a lowering that
/// uses one mostly uses the other. The most recent bodies are kept, up to 8 MiB of graph storage
/// and 64 bodies (a large body is megabytes, and a sweep keeps its groups' lowerings itself); a
/// body beyond those is still found, with its schedules, while a program holds it (a sweep's
/// dense baseline, lowered while its sparse lowering is held, shares its full-tile bodies).
/// Bodies built for counting only ([`counting_only`]) are neither kept nor looked up.
pub fn cached_pair(keys: [String; 2], want: usize, build: impl FnOnce() -> [StepBody; 2]) -> StepBody {
    use std::sync::PoisonError;
    if COUNTING.with(std::cell::Cell::get) {
        let [a, b] = build();
        return if want == 0 { a } else { b };
    }
    if let Some(b) = store().lock().unwrap_or_else(PoisonError::into_inner).get(&keys[want]) {
        return b;
    }
    let bodies = build();
    let mut c = store().lock().unwrap_or_else(PoisonError::into_inner);
    let [k0, k1] = keys;
    let [b0, b1] = bodies;
    let b0 = c.insert(k0, b0);
    let b1 = c.insert(k1, b1);
    c.evict();
    if want == 0 {
        b0
    } else {
        b1
    }
}

/// Bodies [`cached_pair`] keeps: the most recent, up to [`STORE_BYTES`] of graph storage and
/// [`STORE_BODIES`] bodies (the oldest dropped first; the pair just built always stays).
/// Small bodies are kept by the dozen, so a process that runs a lowering again (a bench, a
/// notebook) finds every body of it with its schedules; megabyte bodies by the few, so a sweep
/// holds no lowering beyond its groups' own.
const STORE_BYTES: usize = 8 << 20;
/// See [`STORE_BYTES`].
const STORE_BODIES: usize = 64;

/// The bodies recent lowerings built, by key, with their order and sizes; and every body built
/// that something else (a lowering's program) may still hold, held weakly.
#[derive(Default)]
struct Store {
    bodies: HashMap<String, StepBody>,
    order: std::collections::VecDeque<(String, usize)>,
    bytes: usize,
    /// Bodies built, held weakly: a body the store has dropped but a program still holds is
    /// found here, its schedules with it (a sweep's dense baseline, lowered while its sparse
    /// lowering is held, shares the full-tile bodies of it).
    live: HashMap<String, crate::ir::WeakBody>,
    /// `live`'s size after it was last cleared of dead entries.
    live_pruned: usize,
}

impl Store {
    /// The body under `key`, kept or still held by some program.
    fn get(&self, key: &str) -> Option<StepBody> {
        self.bodies.get(key).cloned().or_else(|| self.live.get(key)?.upgrade())
    }

    /// Keeps `body` under `key` (an equal key built by another thread meanwhile wins) and gives
    /// the kept body.
    fn insert(&mut self, key: String, body: StepBody) -> StepBody {
        if let Some(b) = self.get(&key) {
            return b;
        }
        if let Some(w) = body.downgrade() {
            self.live.insert(key.clone(), w);
            // Dead entries go once the map has doubled since they last went (amortised O(1)).
            if self.live.len() > 2 * self.live_pruned.max(64) {
                self.live.retain(|_, w| w.alive());
                self.live_pruned = self.live.len();
            }
        }
        let bytes = body.graph.node_count() * (std::mem::size_of::<TileOp>() + 8) + body.graph.edge_count() * 12;
        self.bytes += bytes;
        self.order.push_back((key.clone(), bytes));
        self.bodies.insert(key, body.clone());
        body
    }

    /// Drops the oldest bodies until the store is within its limits, keeping the last two.
    fn evict(&mut self) {
        while self.order.len() > 2 && (self.bytes > STORE_BYTES || self.order.len() > STORE_BODIES) {
            if let Some((k, b)) = self.order.pop_front() {
                self.bodies.remove(&k);
                self.bytes -= b;
            }
        }
    }
}

/// The bodies recent lowerings of this process built.
fn store() -> &'static std::sync::Mutex<Store> {
    static CACHE: std::sync::OnceLock<std::sync::Mutex<Store>> = std::sync::OnceLock::new();
    CACHE.get_or_init(Default::default)
}

impl Builder {
    /// A builder for a body whose refs `carried` (by ref index) are loaded and stored by it
    /// ([`carried_refs`]).
    pub fn new(carried: Vec<bool>) -> Self {
        // Room for a large body: its nodes are written without regrowing the storage.
        Self::with_room(carried, 4096)
    }

    /// A builder whose graph has room for `nodes` nodes and as many edges.
    fn with_room(carried: Vec<bool>, nodes: usize) -> Self {
        Builder {
            graph: DiGraph::with_capacity(nodes, nodes),
            carries: 0,
            scratch: Vec::new(),
            vals: HashMap::default(),
            slots: HashMap::default(),
            carried,
            writers: HashMap::default(),
            base: 0,
            last_matmul: None,
            matmul_sigs: Default::default(),
            load_refs: HashMap::default(),
            row_reduction: false,
            seq: 0,
            largest: 0,
            largest_value: None,
            f32_matmuls: 0,
            counting: COUNTING.with(std::cell::Cell::get),
            tally: Vec::new(),
            mult: 1,
            outstanding: HashMap::default(),
            barrier: None,
            last_on_unit: [None; 4],
        }
    }

    /// Empty dependency lists for a value of `ns` slabs (none when counting: [`Val::deps`]).
    fn slab_deps(&self, ns: usize) -> Vec<Deps> {
        if self.counting {
            Vec::new()
        } else {
            let mut v = Vec::with_capacity(ns);
            v.resize_with(ns, Deps::new);
            v
        }
    }

    /// The slabs a loop over `ns` slabs builds, each with how many slabs it stands for: every
    /// slab once; when counting, the first for every full one (they have equal work) and the
    /// last, which may be shorter.
    fn reps(&self, ns: usize) -> impl Iterator<Item = (usize, u32)> {
        let folded = self.counting && ns > 2;
        (0..if folded { 2 } else { ns }).map(move |i| match (folded, i) {
            (true, 0) => (0, (ns - 1) as u32),
            (true, _) => (ns - 1, 1),
            _ => (i, 1),
        })
    }

    /// After an iteration of a rolled loop whose ops span `slabs` slabs: the next iteration's
    /// slabs issue after this one's (slab-major order).
    pub fn advance(&mut self, slabs: usize) {
        self.base += slabs as u64;
    }

    /// A region op's result `to` takes the value of `from` (what its region yields).
    pub fn bind(&mut self, to: u64, from: &Arg) {
        if let Some(v) = self.arg_val(from).cloned() {
            self.vals.insert(to, std::rc::Rc::new(v));
        }
    }

    fn arg_val(&self, o: &Arg) -> Option<&Val> {
        match o {
            Arg::Op(id) => self.vals.get(id).map(|v| &**v),
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
        if self.counting {
            // No node: the work tallied (a slab loop's equal works as one entry). The index
            // handed back is never looked up (counting skips every use of the graph).
            let _ = (name, inputs, extra, s, ns);
            // A slab's few nodes repeat slab after slab: the last few entries are searched.
            let len = self.tally.len();
            match self.tally[len.saturating_sub(4)..].iter_mut().rev().find(|(w, _)| *w == work) {
                Some((_, n)) => *n += self.mult,
                None => self.tally.push((work, self.mult)),
            }
            return (NodeIdx::new(0), floor);
        }
        let unit = work.unit();
        let mut carry_in = None;
        let mut slot = floor;
        let mut nodes = std::mem::take(&mut self.scratch);
        nodes.clear();
        for v in inputs {
            let skew = skew(v.unit, unit);
            let lists: &[Deps] = if v.deps.len() == ns { std::slice::from_ref(&v.deps[s]) } else { &v.deps };
            for l in lists {
                for &(n, sl) in l {
                    slot = slot.max(sl + skew);
                    nodes.push(n);
                }
            }
            if carry_in.is_none() {
                if let Some(c) = &v.carry {
                    carry_in = Some(if c.len() == ns { c[s] } else { c[c.len() - 1] });
                }
            }
        }
        for &(n, sl) in extra {
            slot = slot.max(sl);
            nodes.push(n);
        }
        if let Some((n, sl)) = self.barrier {
            slot = slot.max(sl);
            nodes.push(n);
        }
        self.seq += 1;
        let issue = slot * SLOT + self.seq;
        nodes.sort_unstable();
        nodes.dedup();
        let n = self.graph.add_node(TileOp { name, work, issue, carry_in, carry_out: None });
        for &d in &nodes {
            self.graph.add_edge(d, n, ());
        }
        if let Some(c) = carry_in {
            self.carries = self.carries.max(c + 1);
        }
        if let Some(last) = self.last_on_unit.get_mut(unit.index()) {
            *last = Some((n, slot));
        }
        self.scratch = nodes;
        (n, slot)
    }

    /// Builds one op (module docs).
    ///
    /// # Errors
    /// [`OpError`] for an op the cost table does not list (its cost on the units is unknown; it
    /// is never taken as free), a matmul without its shape, a reduction without its source.
    pub fn op(&mut self, op: &BodyOp) -> Result<(), OpError> {
        let name = op.name.as_str();
        let Some((static_name, c)) = cost::lookup(name) else {
            return Err(OpError(
                "an op this simulator does not model (its cost on the units is unknown; it is never taken as free): see crates/tpusim-pallas/DESCRIPTION.md for the ops it knows".into(),
            ));
        };
        // Shared handles (no copy of a value's per-slab dependencies), borrowed as plain values.
        let held: SmallVec<[std::rc::Rc<Val>; 4]> =
            op.args.iter().filter_map(|o| if let Arg::Op(id) = o { self.vals.get(id).cloned() } else { None }).collect();
        let ins: SmallVec<[&Val; 4]> = held.iter().map(|v| &**v).collect();
        self.note_load_ref(op);
        if op.attrs.folded && name.ends_with(".transpose") {
            if let Some(v) = held.first() {
                self.vals.insert(op.id, v.clone());
            }
            return Ok(());
        }
        let shape = &op.shape;
        let rank = shape.len();
        let varies = self.varies(op, &ins);
        // A value an op computes may be held in VMEM; a load, a view (reshape, bitcast, squeeze)
        // or a broadcast is the buffer or registers it reads, and a constant (a splat, constant
        // along every dimension) a register Mosaic rematerialises.
        if rank >= 2 && varies.iter().any(|&v| v) && !matches!(c, OpCost::Free) {
            let dtype = crate::dtype::Dtype::of_bytes(elem_bytes(&op.dtype)).unwrap_or(crate::dtype::Dtype::F32);
            let bytes = crate::vmem::tiled_bytes(shape, dtype);
            if bytes > self.largest {
                self.largest = bytes;
                self.largest_value = Some((shape.clone(), dtype));
            }
        }
        let ns = nslabs(shape, &varies);
        let vr = cost::vregs(shape, &varies);
        let mut out = Val { shape: shape.clone(), varies, ns, deps: self.slab_deps(ns), carry: None, unit: None };
        match c {
            OpCost::Free if !op.attrs.offsets.is_empty() && is_store(name) => match self.relayout(op, &ins, &out) {
                // The value shifted into place, then stored.
                Some(v) => {
                    let shifted: SmallVec<[&Val; 4]> = std::iter::once(&v).chain(ins.iter().skip(1).copied()).collect();
                    self.free(op, &shifted, &mut out);
                }
                None => self.free(op, &ins, &mut out),
            },
            OpCost::Free => {
                self.free(op, &ins, &mut out);
                if let Some(v) = self.relayout(op, &ins, &out) {
                    out = v;
                }
            }
            OpCost::Vpu(k) => {
                for (s, m) in self.reps(ns) {
                    self.mult = m;
                    let share = slab_share(shape, s, ns);
                    let (n, sl) = self.node(static_name, Work::Vector { ops: k * vr * share, loaded_mask_vregs: 0.0 }, &ins, &[], s, ns);
                    out.set(s, smallvec::smallvec![(n, sl)]);
                }
                out.unit = Some(Unit::Vpu);
            }
            OpCost::Eup { eup, vpu } => {
                for (s, m) in self.reps(ns) {
                    self.mult = m;
                    let share = slab_share(shape, s, ns);
                    if vpu > 0.0 {
                        let (n, sl) = self.node(static_name, Work::Vector { ops: vpu * vr * share, loaded_mask_vregs: 0.0 }, &ins, &[], s, ns);
                        let scaled = Val::after(smallvec::smallvec![(n, sl)], Unit::Vpu);
                        let (e, esl) = self.node(static_name, Work::Transcendental { vregs: eup * vr * share }, &[&scaled], &[], 0, 1);
                        out.set(s, smallvec::smallvec![(e, esl)]);
                    } else {
                        let (e, esl) = self.node(static_name, Work::Transcendental { vregs: eup * vr * share }, &ins, &[], s, ns);
                        out.set(s, smallvec::smallvec![(e, esl)]);
                    }
                }
                out.unit = Some(Unit::Eup);
            }
            OpCost::LoadedMask => {
                for (s, m) in self.reps(ns) {
                    self.mult = m;
                    let share = slab_share(shape, s, ns);
                    let (n, sl) = self.node(static_name, Work::Vector { ops: 0.0, loaded_mask_vregs: vr * share }, &ins, &[], s, ns);
                    out.set(s, smallvec::smallvec![(n, sl)]);
                }
                out.unit = Some(Unit::Vpu);
            }
            OpCost::Xlu => self.cross_lane(name, static_name, &ins, &mut out, vr),
            OpCost::Reduce => self.reduce(op, static_name, &ins, &mut out)?,
            OpCost::Matmul => self.matmul(op, static_name, &ins, &mut out)?,
            OpCost::Dma => self.dma(op)?,
            OpCost::DmaWait => self.dma_wait(op),
        }
        self.vals.insert(op.id, std::rc::Rc::new(out));
        Ok(())
    }

    /// Data a slice or concatenation moves off its register tile (a start not a multiple of
    /// the lanes, 128, or of the sublane tile, 8 rows of 32-bit data, 16 of 16-bit, 32 of
    /// 8-bit): Mosaic shifts it into place (`apply_vector_layout`'s relayout). Assumed, per
    /// (8,128) register unit moved: a lane shift is one XLU rotation and one VPU select merging
    /// the two source registers a result register takes lanes from; a sublane shift, a sublane
    /// rotation and a select on the VPU (two operations, as [`Self::reduce`] counts sublane
    /// rotations). The registers moved: an extracted slice's result, an inserted slice's source,
    /// and each concatenated operand that starts off the tile. A value constant along the
    /// dimension (a broadcast) is formed in place and moves nothing. Aligned slices and
    /// concatenations of whole registers stay free.
    ///
    /// Returns the value shifted (a store's operand, to be stored; else `out`, the op's result),
    /// or `None` when nothing moves.
    fn relayout(&mut self, op: &BodyOp, ins: &[&Val], out: &Val) -> Option<Val> {
        let offsets = &op.attrs.offsets;
        // Only a concatenation can move data without offsets (the common case: nothing to do).
        if offsets.is_empty() && op.name != "tpu.concatenate" {
            return None;
        }
        let store = is_store(&op.name);
        // A store shifts the value it writes (its first operand; the op has no result).
        let rank = if store { ins.first().map_or(0, |v| v.shape.len()) } else { op.shape.len() };
        if rank == 0 || (store && offsets.len() != rank) {
            return None;
        }
        let sub_tile = crate::dtype::Dtype::of_bytes(elem_bytes(&op.dtype)).unwrap_or(crate::dtype::Dtype::F32).tile_rows();
        // (registers shifted across lanes, across sublanes) when data of `shape` varying along
        // `varies` (the result's rank) starts at `at` along dimension `d`.
        let off = |shape: &[u64], varies: &[bool], d: usize, at: u64| -> (f64, f64) {
            let regs = if varies.get(d).copied().unwrap_or(false) { cost::vregs(shape, varies) } else { 0.0 };
            if d + 1 == rank && !at.is_multiple_of(cost::UNIT_LANES) {
                (regs, 0.0)
            } else if d + 2 == rank && !at.is_multiple_of(sub_tile) {
                (0.0, regs)
            } else {
                (0.0, 0.0)
            }
        };
        let add = |a: (f64, f64), b: (f64, f64)| (a.0 + b.0, a.1 + b.1);
        let minor = rank.saturating_sub(2)..rank;
        let (lanes, sublanes) = match op.name.as_str() {
            "vector.extract_strided_slice" | "vector.load" | "tpu.load" if offsets.len() == rank => {
                minor.map(|d| off(&out.shape, &out.varies, d, offsets[d])).fold((0.0, 0.0), add)
            }
            "vector.store" | "tpu.vector_store" => {
                let v = ins[0];
                minor.map(|d| off(&v.shape, &v.varies, d, offsets[d])).fold((0.0, 0.0), add)
            }
            "vector.insert_strided_slice" => match ins.first() {
                // The source's dimensions are the result's last ones.
                Some(src) if src.shape.len() <= rank && offsets.len() == rank => {
                    let lead = rank - src.shape.len();
                    let shape = [vec![1; lead], src.shape.clone()].concat();
                    let varies = [vec![false; lead], src.varies.clone()].concat();
                    minor.map(|d| off(&shape, &varies, d, offsets[d])).fold((0.0, 0.0), add)
                }
                _ => (0.0, 0.0),
            },
            "tpu.concatenate" => {
                let d = op.attrs.dimension.unwrap_or(0) as usize;
                let mut at = 0;
                let mut moved = (0.0, 0.0);
                if minor.contains(&d) && out.varies.get(d).copied().unwrap_or(false) {
                    for v in ins.iter().take_while(|v| v.shape.len() == rank) {
                        moved = add(moved, off(&v.shape, &v.varies, d, at));
                        at += v.shape[d];
                    }
                }
                moved
            }
            _ => (0.0, 0.0),
        };
        if lanes == 0.0 && sublanes == 0.0 {
            return None;
        }
        // The value shifted: a store's operand, else the op's result.
        let src: Val = if store { ins[0].clone() } else { out.clone() };
        let mut moved = src.clone();
        let ns = src.ns;
        for (s, m) in self.reps(ns) {
            self.mult = m;
            let share = slab_share(&src.shape, s, ns);
            let rotated = (lanes > 0.0).then(|| {
                let (n, sl) = self.node("lane shift", Work::CrossLane { vregs: lanes * share }, &[&src], &[], s, ns);
                Val::after(smallvec::smallvec![(n, sl)], Unit::Xlu)
            });
            let ops = (lanes + 2.0 * sublanes) * share;
            let (n, sl) = match &rotated {
                Some(r) => self.node("shift select", Work::Vector { ops, loaded_mask_vregs: 0.0 }, &[r], &[], 0, 1),
                None => self.node("shift select", Work::Vector { ops, loaded_mask_vregs: 0.0 }, &[&src], &[], s, ns),
            };
            moved.set(s, smallvec::smallvec![(n, sl)]);
        }
        moved.unit = Some(Unit::Vpu);
        Some(moved)
    }

    /// A copy the body starts (`tpu.enqueue_dma`): a node on the DMA engines after the work
    /// before it in program order, queued on its semaphore until a wait counts it.
    fn dma(&mut self, op: &BodyOp) -> Result<(), OpError> {
        let bytes = op.attrs.bytes.ok_or_else(|| OpError("a copy without its size in bytes (`attrs.bytes`)".into()))?;
        let after: SmallVec<[(NodeIdx, u64); 4]> = self.last_on_unit.iter().flatten().copied().collect();
        let path = op.attrs.dma_path.unwrap_or(crate::ir::DmaPath::HbmToVmem);
        let traffic = if path == crate::ir::DmaPath::HbmToHbm { 2 * bytes } else { bytes };
        let (n, sl) = self.node_from("dma", Work::Dma { bytes: traffic, path }, &[], &after, 0, 1, self.base);
        if !self.counting {
            self.outstanding.entry(op.attrs.semaphore.clone()).or_default().push_back((n, sl, bytes));
        }
        Ok(())
    }

    /// A wait (`tpu.wait_dma2`): a node that ends when the copies it counts have landed, the
    /// earliest on its semaphore until their bytes reach the bytes it waits for (all of them
    /// when it names no size; every copy outstanding when it names no semaphore). A wait that
    /// finds fewer bytes started in this step than it waits for (copies an earlier grid step
    /// started, the usual prefetch across steps) also waits for the DMA engines' queue as the
    /// step begins. Everything after it in program order waits for it.
    fn dma_wait(&mut self, op: &BodyOp) {
        let mut waited: SmallVec<[(NodeIdx, u64); 4]> = SmallVec::new();
        let mut queued = false;
        if !self.counting {
            // Takes copies off `q` until `need` bytes are counted; returns the bytes still needed.
            let mut take = |q: &mut std::collections::VecDeque<Outstanding>, mut need: u64| -> u64 {
                while let Some(front) = q.front_mut() {
                    if need == 0 && front.2 > 0 {
                        break;
                    }
                    waited.push((front.0, front.1));
                    if front.2 <= need {
                        need -= front.2;
                        q.pop_front();
                    } else {
                        front.2 -= need;
                        need = 0;
                    }
                }
                need
            };
            let short = match &op.attrs.semaphore {
                Some(k) => {
                    let need = op.attrs.bytes.unwrap_or(u64::MAX);
                    let left = match self.outstanding.get_mut(&Some(k.clone())) {
                        Some(q) => take(q, need),
                        None => need,
                    };
                    left > 0 && need != u64::MAX
                }
                None => {
                    for q in self.outstanding.values_mut() {
                        take(q, u64::MAX);
                    }
                    false
                }
            };
            queued = short || waited.is_empty();
        }
        let (n, sl) = self.node_from("dma wait", Work::DmaWait { queued }, &[], &waited, 0, 1, self.base);
        if !self.counting {
            self.barrier = Some((n, sl));
        }
    }

    /// Which dimensions an op's result varies along.
    fn varies(&self, op: &BodyOp, ins: &[&Val]) -> Vec<bool> {
        let (shape, rank) = (&op.shape, op.shape.len());
        match op.name.as_str() {
            "tpu.iota" => (0..rank).map(|i| op.attrs.dims.contains(&(i as u64))).collect(),
            "arith.constant" | "vector.splat" => vec![false; rank],
            "vector.broadcast" => match ins.first() {
                None => vec![false; rank],
                Some(s) => {
                    let off = rank.saturating_sub(s.shape.len());
                    (0..rank).map(|i| i >= off && s.shape[i - off] == shape[i] && s.varies[i - off]).collect()
                }
            },
            "vector.load" | "tpu.load" | "tpu.strided_load" | "tpu.matmul" | "vector.contract" => vec![true; rank],
            "vector.multi_reduction" => match ins.first() {
                // The source's dimensions that survive the reduction.
                Some(src) => {
                    let kept: Vec<bool> = src.varies.iter().enumerate().filter(|(i, _)| !op.attrs.dims.contains(&(*i as u64))).map(|(_, v)| *v).collect();
                    if kept.len() == rank {
                        kept
                    } else {
                        vec![true; rank]
                    }
                }
                None => vec![true; rank],
            },
            "vector.shape_cast" | "tpu.reshape" => {
                // Constant along every dimension if the source is; else varies (conservative).
                let all_const = ins.first().is_some_and(|s| s.varies.iter().all(|v| !v));
                vec![!all_const; rank]
            }
            "tpu.concatenate" => {
                let dim = op.attrs.dimension.unwrap_or(0) as usize;
                // Copies of one value at most one register wide along `dim` (`jnp.tile` of a
                // lane-replicated (rows, 128) array, as Splash's q positions): every register of
                // the result is a register of the source, so the result counts as constant
                // along `dim` (the compiler computes on the source's registers once).
                let reg = if dim + 1 == rank { cost::UNIT_LANES } else { cost::UNIT_SUBLANES };
                let same = op.args.len() > 1 && op.args.windows(2).all(|w| w[0] == w[1]) && matches!(op.args[0], Arg::Op(_));
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
        }
    }

    /// A cross-lane op: one XLU pass per source register unit. A transpose (of the two minor
    /// dimensions, the ones Mosaic transposes): a slab of the result's rows is a slab of the
    /// source's columns, so it needs every slab of the source; its slabs issue together (one op
    /// on the XLU) and it hands its result on whole (the fused backward's ds^T: pipelining dq
    /// behind it slab by slab takes 4-8% off tokamax's measured fused backward rows, which the
    /// model already predicts fast).
    fn cross_lane(&mut self, name: &str, static_name: &'static str, ins: &[&Val], out: &mut Val, vr: f64) {
        let shape = out.shape.clone();
        let ns = out.ns;
        let src_vr = ins.first().map(|v| cost::vregs(&v.shape, &v.varies)).unwrap_or(vr);
        let transpose = name.ends_with(".transpose");
        let whole: Vec<Val> = if transpose {
            ins.iter().map(|v| Val { shape: Vec::new(), varies: Vec::new(), ns: 1, deps: vec![v.deps.iter().flatten().copied().collect()], carry: v.carry.clone(), unit: v.unit }).collect()
        } else {
            Vec::new()
        };
        let in_refs: Vec<&Val> = if transpose { whole.iter().collect() } else { ins.to_vec() };
        for (s, m) in self.reps(ns) {
            self.mult = m;
            let share = slab_share(&shape, s, ns);
            let floor = if transpose { self.base } else { self.base + s as u64 };
            let (n, sl) = self.node_from(static_name, Work::CrossLane { vregs: src_vr * share }, &in_refs, &[], s, ns, floor);
            out.set(s, smallvec::smallvec![(n, sl)]);
        }
        if transpose {
            let all: Deps = out.deps.iter().flatten().copied().collect();
            for d in out.deps.iter_mut() {
                d.clone_from(&all);
            }
        }
        out.unit = Some(Unit::Xlu);
    }

    /// Records the ref `op`'s result is computed from, for matmul signatures ([`Self::matmul`]):
    /// a load's ref, and through a view, cast, transpose or element-wise op the ref of its one
    /// loaded operand when its other operands are constants (k scaled or cast as it is read).
    fn note_load_ref(&mut self, op: &BodyOp) {
        let name = op.name.as_str();
        if is_load(name) {
            if let Some(r) = ref_index(op) {
                self.load_refs.insert(op.id, r);
            }
            return;
        }
        if matches!(name, "tpu.matmul" | "vector.contract" | "vector.multi_reduction") || name.contains("store") {
            return;
        }
        let mut from: Option<usize> = None;
        for o in &op.args {
            let Arg::Op(id) = o else { continue };
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

    fn slot(&mut self, r: usize, s: usize) -> u16 {
        let n = self.slots.len() as u16;
        *self.slots.entry((r, s)).or_insert(n)
    }

    fn free(&mut self, op: &BodyOp, ins: &[&Val], out: &mut Val) {
        let ns = out.ns;
        let name = op.name.as_str();
        if is_load(name) {
            if let Some(r) = ref_index(op) {
                if self.carried.get(r).copied().unwrap_or(false) {
                    // Written earlier in this step: wait for that store; else carried in.
                    let mut carry = Vec::new();
                    for s in 0..ns {
                        match self.writers.get(&(r, s)).or_else(|| self.writers.get(&(r, 0))) {
                            Some(w) => out.set(s, w.clone()),
                            None => carry.push(self.slot(r, s)),
                        }
                    }
                    if carry.len() == ns {
                        out.carry = Some(carry);
                    }
                }
            }
            return;
        }
        if is_store(name) {
            if let (Some(r), Some(v)) = (ref_index(op), ins.first()) {
                let fill = !v.shape.is_empty() && v.varies.iter().all(|x| !x) && v.deps.iter().all(|d| d.is_empty());
                let carried = self.carried.get(r).copied().unwrap_or(false);
                if fill {
                    // A buffer filled with a constant (an accumulator zeroed, a running max set to
                    // the mask value): one VPU operation per register written (the model has no
                    // vector store slot; other stores ride with the op that computed their value).
                    let all = vec![true; v.shape.len()];
                    let regs = cost::vregs(&v.shape, &all);
                    let ns = nslabs(&v.shape, &all);
                    for (s, m) in self.reps(ns) {
                        self.mult = m;
                        let share = slab_share(&v.shape, s, ns);
                        let (n, sl) = self.node("fill", Work::Vector { ops: regs * share, loaded_mask_vregs: 0.0 }, &[], &[], s, ns);
                        if carried {
                            self.writers.insert((r, s), smallvec::smallvec![(n, sl)]);
                        }
                    }
                } else if carried {
                    for s in 0..v.deps.len() {
                        if !v.deps[s].is_empty() {
                            self.writers.insert((r, s), v.deps[s].clone());
                        }
                    }
                }
            }
            return;
        }
        // Pass-through: slab-aligned dependencies of every operand (when counting, whether any
        // node produced one).
        for v in ins {
            if self.counting {
                if let (true, Some(d)) = (out.deps.is_empty(), v.deps.iter().find(|d| !d.is_empty())) {
                    out.deps.push(d.clone());
                }
            } else {
                for s in 0..ns {
                    if v.deps.len() == ns {
                        out.deps[s].extend(v.deps[s].iter().copied());
                    } else {
                        for l in &v.deps {
                            out.deps[s].extend(l.iter().copied());
                        }
                    }
                }
            }
            if out.carry.is_none() && v.deps.iter().all(|d| d.is_empty()) {
                if let Some(c) = &v.carry {
                    out.carry = Some(if c.len() == ns { c.clone() } else { vec![c[c.len() - 1]; ns] });
                }
            }
            if out.unit.is_none() {
                out.unit = v.unit;
            }
        }
    }

    fn reduce(&mut self, op: &BodyOp, name: &'static str, ins: &[&Val], out: &mut Val) -> Result<(), OpError> {
        let src = *ins.first().ok_or_else(|| OpError("a reduction without its source".into()))?;
        let dims: Vec<usize> = op.attrs.dims.iter().map(|&d| d as usize).collect();
        let n = src.shape.len();
        let src_vr = cost::vregs(&src.shape, &src.varies);
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
            tile_shape[n - 1] = tile_shape[n - 1].min(cost::UNIT_LANES);
        }
        if rows_reduced {
            tile_shape[n - 2] = tile_shape[n - 2].min(cost::UNIT_SUBLANES);
        }
        let tile_vr = cost::vregs(&tile_shape, &src.varies);
        let mut vpu = (src_vr - tile_vr).max(0.0);
        if rows_reduced {
            // Within a register: log2(8) sublane rotations and combines.
            vpu += 3.0 * tile_vr;
        }
        let xlu = if lanes_reduced { tile_vr } else { 0.0 };
        // Slabs follow the source's rows when they survive the reduction.
        let ns_src = src.ns;
        let ns = if rows_reduced { 1 } else { ns_src };
        self.row_reduction |= rows_reduced && ns_src > 1;
        out.ns = ns;
        out.deps = self.slab_deps(ns);
        let srcs = [src];
        for (s, m) in self.reps(ns) {
            self.mult = m;
            let share = slab_share(&src.shape, s, ns);
            let mut last: Deps = Deps::new();
            let mut unit = None;
            let v = if vpu > 0.0 {
                let (a, sl) = self.node(name, Work::Vector { ops: vpu * share, loaded_mask_vregs: 0.0 }, &srcs, &[], s, ns);
                unit = Some(Unit::Vpu);
                Some(Val::after(smallvec::smallvec![(a, sl)], Unit::Vpu))
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
                unit = Some(Unit::Xlu);
            } else if let Some(v) = &v {
                last = v.deps[0].clone();
            }
            out.set(s, last);
            out.unit = unit;
        }
        Ok(())
    }

    fn matmul(&mut self, op: &BodyOp, name: &'static str, ins: &[&Val], out: &mut Val) -> Result<(), OpError> {
        let Some([m, k, n]) = op.attrs.mkn else {
            return Err(OpError("a matmul without its `mkn` attribute (rows, contraction, columns)".into()));
        };
        let batch = op.attrs.batch.unwrap_or(1).max(1);
        let lhs_t = op.attrs.lhs_dtype.as_deref().unwrap_or("bf16");
        let rhs_t = op.attrs.rhs_dtype.as_deref().unwrap_or("bf16");
        let passes = cost::mxu_passes_for_operands(lhs_t, rhs_t, op.attrs.precision.as_deref());
        let mxu_type = crate::mxu::mxu_type(lhs_t, rhs_t);
        if lhs_t == "f32" || rhs_t == "f32" {
            self.f32_matmuls += 1;
        }
        // Rows of the result split into slabs (the lhs streams; the rhs is the stationary weight).
        let rank = out.shape.len();
        let ns = out.ns;
        let (lhs, rhs, acc) = (ins.first().copied(), ins.get(1).copied(), ins.get(2).copied());
        let pop_vr = cost::vregs(&out.shape, &vec![true; rank]);
        // f32 operands are rounded to bf16 on the VPU before the MXU, one operation per f32
        // register of the operand ([`crate::mxu`]): the stationary rhs once, the streamed lhs
        // per slab.
        let rounded_rhs: Option<Val> = match rhs {
            Some(rv) if rhs_t == "f32" => {
                let ops = cost::vregs(&rv.shape, &rv.varies) * batch as f64;
                // The weights are latched before the first row streams, so their preparation
                // from a loaded window (a widening such as JAX Splash's v to f32, with no
                // producer in the step) issues at the earliest of its slots rather than slab by
                // slab behind the streamed work.
                let producers: Deps = rv.deps.iter().flatten().copied().collect();
                let graph = &mut self.graph;
                let loaded_only = !self.counting && producers.iter().all(|&(n, _)| graph.neighbors_directed(n, petgraph::Direction::Incoming).next().is_none());
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
                Some(Val::after(smallvec::smallvec![(nd, sl)], Unit::Vpu))
            }
            _ => None,
        };
        let rhs = rounded_rhs.as_ref().or(rhs);
        let lhs_vr = lhs.map(|l| cost::vregs(&l.shape, &l.varies) * batch as f64).unwrap_or(0.0);
        // An unrolled loop's next iteration after a reduction over a matmul result's rows (a
        // softmax over kv-major scores, k q^T, which needs every slab of them): a matmul of the
        // same shape on operands loaded from the same refs as an earlier one of this body,
        // independent of the matmul just before it, ranks after that matmul on the MXU, as a
        // rolled loop's iterations do. Without such a reduction the iterations keep sharing
        // slots: each slab's chain is its own (q-major scores, the backward's sub-tiles).
        let read_from = |i: usize| match op.args.get(i) {
            Some(Arg::Op(id)) => self.load_refs.get(id).copied(),
            _ => None,
        };
        let sig: MatmulSig = (m, k, n, read_from(0), read_from(1));
        let repeat = sig.3.is_some() && sig.4.is_some() && !self.matmul_sigs.insert(sig);
        let prev_mm = self.last_matmul.take();
        let after = prev_mm.filter(|_| repeat && self.row_reduction && !self.counting).and_then(|(nodes, last)| {
            let mut roots: Vec<NodeIdx> = Vec::new();
            for v in lhs.iter().chain(rhs.iter()).chain(acc.iter()) {
                roots.extend(v.deps.iter().flatten().map(|d| d.0));
            }
            (!depends_on(&self.graph, &roots, &nodes)).then_some(last)
        });
        let mut mm_nodes: Vec<NodeIdx> = Vec::with_capacity(ns * batch as usize);
        let mut mm_last = 0u64;
        // The result's rows: `m` may span several of its dimensions (Mosaic collapses a
        // matmul's leading non-contracting dimensions into its rows), so a slab of the
        // second-minor dimension carries `m / rows` of them per row.
        let rows = if ns == 1 { m } else { out.shape[rank - 2] };
        for (s, reps) in self.reps(ns) {
            self.mult = reps;
            let r = if ns == 1 { m } else { slab_rows(&out.shape, s, ns) };
            let share = r as f64 / rows.max(1) as f64;
            let r = (m * r).div_ceil(rows.max(1));
            let rounded_lhs;
            let mut inputs: SmallVec<[&Val; 2]> = SmallVec::new();
            if let Some(l) = lhs {
                if lhs_t == "f32" {
                    let (nd, sl) = self.node("round_lhs", Work::Vector { ops: lhs_vr * share, loaded_mask_vregs: 0.0 }, &[l], &[], s, ns);
                    rounded_lhs = Val::after(smallvec::smallvec![(nd, sl)], Unit::Vpu);
                    inputs.push(&rounded_lhs);
                } else {
                    inputs.push(l);
                }
            }
            // The weights: every slab of the rhs, latched ahead of the stream (no issue skew
            // beyond their producers').
            let extra: Deps = rhs.map(|rv| rv.deps.iter().flatten().copied().collect()).unwrap_or_default();
            let mut prev: Option<(NodeIdx, u64)> = None;
            for _ in 0..batch {
                let mut ex = extra.clone();
                ex.extend(prev);
                let floor = (self.base + s as u64).max(after.map_or(0, |a| a + 1 + s as u64));
                let (mm, sl) = self.node_from(name, Work::Matmul { m: r * passes, k, n, m_total: m * passes, mxu_type }, &inputs, &ex, s, ns, floor);
                prev = Some((mm, sl));
                mm_nodes.push(mm);
                mm_last = mm_last.max(sl);
            }
            let mm = prev.expect("batch >= 1");
            let mxu_val = Val::after(smallvec::smallvec![mm], Unit::Mxu);
            let mut pop_in: SmallVec<[&Val; 2]> = smallvec::smallvec![&mxu_val];
            if let Some(a) = acc {
                pop_in.push(a);
            }
            let (p, psl) = self.node("matmul_pop", Work::Vector { ops: pop_vr * share, loaded_mask_vregs: 0.0 }, &pop_in, &[], 0, 1);
            out.set(s, smallvec::smallvec![(p, psl)]);
        }
        out.unit = Some(Unit::Vpu);
        self.last_matmul = Some((mm_nodes, mm_last));
        Ok(())
    }

    /// The body, with the last store of each carried slab writing its slot.
    pub fn finish(mut self) -> Built {
        if self.counting {
            let body = StepBody::counted(std::mem::take(&mut self.tally));
            return Built { body, largest_bytes: self.largest, largest_value: self.largest_value, f32_matmuls: self.f32_matmuls };
        }
        let graph = std::mem::take(&mut self.graph);
        self.built(graph)
    }

    /// The body built so far, as [`Builder::finish`] would give it, with the builder kept to
    /// emit more ops: a body and the same body with more ops after it share the build of the
    /// ops before ([`cached_pair`]). Copies the graph at its size, not the builder (whose value
    /// maps and graph capacity a clone would copy too).
    pub fn finish_copy(&self) -> Built {
        if self.counting {
            let body = StepBody::counted(self.tally.clone());
            return Built { body, largest_bytes: self.largest, largest_value: self.largest_value.clone(), f32_matmuls: self.f32_matmuls };
        }
        let copy = Builder {
            graph: DiGraph::default(),
            carries: self.carries,
            slots: self.slots.clone(),
            writers: self.writers.clone(),
            largest: self.largest,
            largest_value: self.largest_value.clone(),
            f32_matmuls: self.f32_matmuls,
            ..Builder::with_room(Vec::new(), 0)
        };
        copy.built(self.graph.clone())
    }

    /// The body of `graph` (this builder's), its carried slots' last writers marked.
    fn built(mut self, mut graph: DiGraph<TileOp, ()>) -> Built {
        let mut writes: Vec<(RefSlab, Deps)> = self.writers.drain().collect();
        writes.sort_by_key(|w| w.0);
        for ((r, s), w) in writes {
            let slot = self.slot(r, s);
            if let Some(&(n, _)) = w.iter().max_by_key(|x| x.1) {
                let op = &mut graph[n];
                if op.carry_out.is_none() {
                    op.carry_out = Some(slot);
                    self.carries = self.carries.max(slot + 1);
                }
            }
        }
        self.carries = self.carries.max(self.slots.len() as u16);
        Built { body: StepBody::from_graph(graph, self.carries), largest_bytes: self.largest, largest_value: self.largest_value, f32_matmuls: self.f32_matmuls }
    }
}

fn ref_index(op: &BodyOp) -> Option<usize> {
    op.args.iter().find_map(|o| match o {
        Arg::Ref(r) => Some(*r),
        _ => None,
    })
}

/// Whether any of `roots` is one of `targets` or reaches one through its inputs (a depth-first
/// walk of the reversed graph, each node visited once).
fn depends_on(graph: &petgraph::graph::DiGraph<crate::TileOp, ()>, roots: &[NodeIdx], targets: &[NodeIdx]) -> bool {
    use petgraph::visit::{Dfs, Reversed};
    let rev = Reversed(graph);
    let mut dfs = Dfs::empty(&rev);
    roots.iter().any(|&r| {
        dfs.move_to(r);
        std::iter::from_fn(|| dfs.next(&rev)).any(|n| targets.contains(&n))
    })
}

#[cfg(test)]
mod store_tests {
    use super::*;

    /// A body of `n` independent vector ops.
    fn body(n: usize) -> StepBody {
        let mut b = StepBody::default();
        for i in 0..n {
            b.add("op", Work::Vector { ops: 1.0, loaded_mask_vregs: 0.0 }, &[], i as u64);
        }
        b
    }

    /// Small bodies stay by the dozen (a lowering run again finds them all); large ones by the
    /// few, oldest dropped first, the pair just built always kept.
    #[test]
    fn the_store_keeps_recent_bodies_within_its_bytes() {
        let mut s = Store::default();
        for i in 0..40 {
            s.insert(format!("small{i}"), body(10));
            s.evict();
        }
        assert_eq!(s.bodies.len(), 40, "40 small bodies fit");
        let per_node = std::mem::size_of::<TileOp>() + 8;
        let big = STORE_BYTES / per_node / 3 + 1; // three of these exceed the budget
        for i in 0..3 {
            s.insert(format!("big{i}"), body(big));
            s.evict();
        }
        assert!(s.bytes <= STORE_BYTES, "{} bytes kept, budget {STORE_BYTES}", s.bytes);
        assert!(s.bodies.contains_key("big2") && s.bodies.contains_key("big1"), "the newest stay");
        assert!(!s.bodies.contains_key("small0"), "the oldest go first");
        assert_eq!(s.bytes, s.order.iter().map(|(_, b)| b).sum::<usize>());
        assert_eq!(s.bodies.len(), s.order.len());
        // One pair larger than the budget is kept alone.
        s.insert("huge0".into(), body(STORE_BYTES / per_node + 1));
        s.insert("huge1".into(), body(1));
        s.evict();
        assert_eq!(s.order.len(), 2, "{:?}", s.order.iter().map(|(k, _)| k).collect::<Vec<_>>());
        // Count limit.
        let mut s = Store::default();
        for i in 0..(STORE_BODIES + 10) {
            s.insert(format!("k{i}"), body(1));
            s.evict();
        }
        assert_eq!(s.bodies.len(), STORE_BODIES);
        assert!(s.bodies.contains_key(&format!("k{}", STORE_BODIES + 9)) && !s.bodies.contains_key("k0"));
    }

    /// A body the store has dropped is found while a program still holds it, with its memo (a
    /// sweep's dense baseline shares the full-tile bodies of the sparse lowering it runs beside);
    /// once nothing holds it, or its holder changed it, it is gone.
    #[test]
    fn a_dropped_body_is_found_while_a_program_holds_it() {
        let mut s = Store::default();
        let per_node = std::mem::size_of::<TileOp>() + 8;
        let big = STORE_BYTES / per_node / 3 + 1;
        let held = s.insert("held".into(), body(big));
        let changed = s.insert("changed".into(), body(big));
        let dropped = s.insert("dropped".into(), body(big));
        drop(dropped);
        held.memo.get_or_insert_with(7, || 42u32);
        for i in 0..4 {
            s.insert(format!("other{i}"), body(big));
            s.evict();
        }
        assert!(!s.bodies.contains_key("held") && !s.bodies.contains_key("dropped"), "beyond the store's bytes");
        let found = s.get("held").expect("a held body is found");
        assert!(std::sync::Arc::ptr_eq(&found.graph, &held.graph), "the same graph, not a copy");
        assert_eq!(*found.memo.get_or_insert_with(7, || 0u32), 42, "with its memo");
        assert!(s.get("dropped").is_none(), "nothing holds it");
        let mut changed = changed;
        changed.add("late", Work::Vector { ops: 1.0, loaded_mask_vregs: 0.0 }, &[], 0);
        assert!(s.get("changed").is_none(), "its holder changed it in place");
        drop((found, held));
        assert!(s.get("held").is_none(), "gone with its last holder");
    }
}
