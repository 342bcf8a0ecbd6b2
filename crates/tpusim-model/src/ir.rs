//! The lowered form of a kernel: a Pallas grid of steps, each step a small dependency graph of
//! tile operations on the chip's units, plus the DMAs that feed it.
//!
//! The engine (`tpusim-engine`) times these; this module only says *what* runs. Work amounts are
//! in hardware-neutral units (matmul shapes, (8,128)-register counts) so that the same program
//! can be timed on any chip model.

use petgraph::graph::{DiGraph, NodeIndex};
use serde::Serialize;

crate::word_enum! {
    /// A unit of the TensorCore whose time the simulator accounts: the four compute units that
    /// tile operations occupy, the HBM <-> VMEM DMA engines and the scalar unit's grid-step
    /// control. Per-unit quantities are [`PerUnit`] arrays indexed by it.
    pub enum Unit {
        /// Matrix units (all MXUs together).
        Mxu = "mxu",
        /// Vector ALUs.
        Vpu = "vpu",
        /// Transcendental unit.
        Eup = "eup",
        /// Cross-lane units.
        Xlu = "xlu",
        /// HBM <-> VMEM DMA transfers.
        Hbm = "hbm",
        /// Scalar grid-step control (the fixed per-step overhead).
        StepControl = "step_control",
    }
}

impl Unit {
    /// The units tile operations run on, in report order.
    pub const COMPUTE: [Unit; 4] = [Unit::Mxu, Unit::Vpu, Unit::Eup, Unit::Xlu];

    /// Index into per-unit arrays.
    pub fn index(self) -> usize {
        self as usize
    }

    /// Short name as used in reports (the serialised word).
    pub fn name(self) -> &'static str {
        self.word()
    }

    /// Name for figures and tables: `MXU`, ..., `HBM`, `step control`.
    pub fn label(self) -> &'static str {
        match self {
            Unit::Mxu => "MXU",
            Unit::Vpu => "VPU",
            Unit::Eup => "EUP",
            Unit::Xlu => "XLU",
            Unit::Hbm => "HBM",
            Unit::StepControl => "step control",
        }
    }
}

/// One value per [`Unit`], in [`Unit::ALL`] order. Serialised as a map from unit word to value.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PerUnit<T>(pub [T; 6]);

impl<T: Copy> PerUnit<T> {
    /// The value of one unit.
    pub fn get(&self, u: Unit) -> T {
        self.0[u.index()]
    }

    /// (unit, value) pairs in report order.
    pub fn iter(&self) -> impl Iterator<Item = (Unit, T)> + '_ {
        Unit::ALL.iter().map(move |&u| (u, self.0[u.index()]))
    }
}

impl<T> std::ops::Index<Unit> for PerUnit<T> {
    type Output = T;
    fn index(&self, u: Unit) -> &T {
        &self.0[u.index()]
    }
}

impl<T> std::ops::IndexMut<Unit> for PerUnit<T> {
    fn index_mut(&mut self, u: Unit) -> &mut T {
        &mut self.0[u.index()]
    }
}

impl PerUnit<f64> {
    /// Sum over units.
    pub fn total(&self) -> f64 {
        self.0.iter().sum()
    }

    /// Adds `k` times `other`, unit by unit.
    pub fn add_scaled(&mut self, other: &PerUnit<f64>, k: f64) {
        for (a, b) in self.0.iter_mut().zip(other.0.iter()) {
            *a += k * b;
        }
    }

    /// Every value multiplied by `k`.
    pub fn scaled(&self, k: f64) -> PerUnit<f64> {
        PerUnit(self.0.map(|v| v * k))
    }
}

impl<T: Serialize> Serialize for PerUnit<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(6))?;
        for u in Unit::ALL {
            m.serialize_entry(u.word(), &self.0[u.index()])?;
        }
        m.end()
    }
}

/// How much work one tile operation is.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Work {
    /// A matmul (in `mxu_type`) of `m` x `k` by `k` x `n` rows streamed through weight tiles of the whole
    /// `m_total` x `k` x `n` product (weights stay resident while `m_total` rows stream in slabs).
    Matmul {
        /// Rows streamed by this operation.
        m: u64,
        /// Contraction length.
        k: u64,
        /// Output columns.
        n: u64,
        /// Rows streamed through the same weights over all slabs of the product.
        m_total: u64,
        /// The type the MXU multiplies in ([`crate::mxu::MxuType`]: bf16, or int8 / fp8 when
        /// both operands are).
        mxu_type: crate::mxu::MxuType,
    },
    /// Vector ALU work: `ops` (8,128)-register operations, plus `loaded_mask_vregs` score
    /// registers masked with a loaded int8 mask block, each costing the chip's
    /// `fitted.loaded_mask_ops_per_vreg` operations (unpack, compare, select).
    Vector {
        /// Register operations.
        ops: f64,
        /// Score registers masked with a loaded mask.
        loaded_mask_vregs: f64,
    },
    /// Transcendental work: (8,128) registers of exp or reciprocal.
    Transcendental {
        /// Registers.
        vregs: f64,
    },
    /// Cross-lane reductions: (8,128) registers reduced across lanes.
    CrossLane {
        /// Registers.
        vregs: f64,
    },
    /// A copy the kernel starts itself inside its body (`tpu.enqueue_dma`): `bytes` between HBM
    /// and VMEM on the DMA engines, overlapping the compute units' work until a wait needs it.
    Dma {
        /// Bytes the DMA engines carry (an HBM-to-HBM copy's twice: read, then written).
        bytes: u64,
        /// Where the data goes: its HBM legs (a read, a write, or both), each with its latency.
        path: DmaPath,
    },
    /// A wait for copies (`tpu.wait_dma`): no unit time (it is the scalar unit's,
    /// [`Unit::StepControl`], and holds no DMA engine); the TensorCore issues in order, so
    /// nothing after it in program order starts before the copies it counts have landed.
    DmaWait {
        /// It also waits for copies earlier grid steps started: the DMA engines' queue as the
        /// step begins.
        queued: bool,
    },
}

/// Where a copy's data goes, by the HBM legs it crosses: an HBM read, an HBM write, both (a copy
/// from HBM to HBM), or neither (between on-chip memories). Each HBM leg pays its latency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DmaPath {
    /// HBM to VMEM or SMEM: one HBM read.
    HbmToVmem,
    /// VMEM or SMEM to HBM: one HBM write.
    VmemToHbm,
    /// HBM to HBM: a read, then a write.
    HbmToHbm,
    /// Between on-chip memories (VMEM, SMEM): no HBM leg.
    Local,
}

impl DmaPath {
    /// The path of a copy that reads from HBM (`src_hbm`) and/or writes to it (`dst_hbm`).
    pub fn of(src_hbm: bool, dst_hbm: bool) -> Self {
        match (src_hbm, dst_hbm) {
            (true, false) => DmaPath::HbmToVmem,
            (false, true) => DmaPath::VmemToHbm,
            (true, true) => DmaPath::HbmToHbm,
            (false, false) => DmaPath::Local,
        }
    }

    /// Whether it reads from HBM.
    pub fn reads_hbm(self) -> bool {
        matches!(self, DmaPath::HbmToVmem | DmaPath::HbmToHbm)
    }

    /// Whether it writes to HBM.
    pub fn writes_hbm(self) -> bool {
        matches!(self, DmaPath::VmemToHbm | DmaPath::HbmToHbm)
    }
}

impl Work {
    /// The unit this work runs on.
    pub fn unit(&self) -> Unit {
        match self {
            Work::Matmul { .. } => Unit::Mxu,
            Work::Vector { .. } => Unit::Vpu,
            Work::Transcendental { .. } => Unit::Eup,
            Work::CrossLane { .. } => Unit::Xlu,
            Work::Dma { .. } => Unit::Hbm,
            // The scalar unit stalls at the wait: it holds no DMA engine.
            Work::DmaWait { .. } => Unit::StepControl,
        }
    }

    /// FLOPs of a matmul at its own dimensions (2 x m x k x n); zero for other work.
    pub fn flops(&self) -> f64 {
        match self {
            Work::Matmul { m, k, n, .. } => 2.0 * (*m as f64) * (*k as f64) * (*n as f64),
            _ => 0.0,
        }
    }

    /// FLOPs a matmul executes at its operands' tile-padded dimensions: the contraction `k` and
    /// the output columns `n` lie along the 128 lanes of their registers and VMEM tiles and are
    /// padded to whole multiples of 128, the rows `m` to whole multiples of 8 sublanes
    /// (`crate::copies`, the padding rule); zero for other work. The MXU's own array padding
    /// (a 256-wide array fed 128 columns) is not counted here: it shows in the MXU's time.
    pub fn executed_flops(&self) -> f64 {
        match self {
            Work::Matmul { m, k, n, .. } => {
                let lanes = crate::vmem::LANES;
                2.0 * (m.next_multiple_of(8) as f64) * (k.next_multiple_of(lanes) as f64) * (n.next_multiple_of(lanes) as f64)
            }
            _ => 0.0,
        }
    }
}

/// One tile operation: a name (for timelines), its work, its issue slot and the state it carries
/// between grid steps.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TileOp {
    /// What it computes, e.g. `qk`, `exp`, `pv`.
    pub name: &'static str,
    /// Its work.
    pub work: Work,
    /// A carried-state slot this operation reads: it waits for the previous grid step's last
    /// write of that slot (an accumulator such as the running max or o_acc of a row's slab).
    pub carry_in: Option<u16>,
    /// A carried-state slot this operation writes (the next step's reader waits for it).
    pub carry_out: Option<u16>,
    /// Position in the kernel's static instruction schedule: each unit issues its operations in
    /// increasing `issue` order (ties by node index). Lowering assigns software-pipelined slots
    /// (slab s's stage k at slot s + skew(k)), as a compiler's modulo schedule would; a fixed
    /// order keeps timing monotone in every unit's speed.
    pub issue: u64,
}

/// The body of one grid step: tile operations, their data dependencies within the step, and
/// the carried-state slots that chain consecutive steps (accumulators in VMEM scratch).
///
/// Node indices are a topological order (every edge goes from a lower to a higher index); the
/// issue order is (issue slot, node index), also topological.
///
/// Build bodies with [`StepBody::add`] / [`StepBody::add_carried`]: they keep the body's
/// [`Memo`] valid (a simulator's schedules of the body are dropped when it changes).
#[derive(Debug, Clone, Default)]
pub struct StepBody {
    /// Operations and dependency edges (from producer to consumer). Shared by clones of the
    /// body (bodies of one shape are clones of a prototype; a large body's graph is megabytes),
    /// copied on the first change of a shared one.
    pub graph: std::sync::Arc<DiGraph<TileOp, ()>>,
    /// Number of carried-state slots the body's operations name (slots are `0..carries`).
    pub carries: u16,
    /// What a simulator derived from this body once per compiled chip (its issue order and
    /// schedule structure), shared by clones of the body. Holds no part of the body's meaning.
    pub memo: Memo,
    /// The body's [`StepBody::signature`] once computed, shared by clones (reports of every sweep
    /// point name it); dropped with the memo when the body changes ([`StepBody::changed`]).
    signature: SignatureCell,
    /// Set on a body built for counting only ([`crate::body::counting_only`]): its operations'
    /// works, consecutive equal ones as one entry with their number, and no graph. Enough for
    /// per-unit occupancy sums (the engine's lower bound), never to be simulated.
    pub counted: Option<std::sync::Arc<[(Work, u32)]>>,
}

/// The cell of a body's signature (shared by clones). Its `Debug` shows nothing: the signature
/// is derived, and whether it was computed yet is no part of the body.
#[derive(Clone, Default)]
struct SignatureCell(std::sync::Arc<std::sync::OnceLock<u64>>);

impl std::fmt::Debug for SignatureCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SignatureCell")
    }
}

/// A slot in which a simulator keeps values it derives from a program once and reuses across
/// runs: for instance a step body's list schedule for one compiled chip, which a sweep over
/// timing parameters would otherwise recompute for every point. Keyed by a `u64` the simulator
/// chooses (a chip's parameter hash); values are type-erased, so this crate knows nothing of
/// the simulator. Clones share the slot; at most its capacity of entries are kept (the oldest
/// is dropped first; [`Memo::CAPACITY`] unless made [`Memo::with_capacity`]).
#[derive(Clone)]
pub struct Memo(std::sync::Arc<MemoSlot>);

type MemoEntry = (u64, std::sync::Arc<dyn std::any::Any + Send + Sync>);

struct MemoSlot {
    entries: std::sync::Mutex<Vec<MemoEntry>>,
    capacity: usize,
}

impl Default for Memo {
    fn default() -> Self {
        Memo::with_capacity(Memo::CAPACITY)
    }
}

impl Memo {
    /// Most entries kept by default.
    pub const CAPACITY: usize = 8;

    /// An empty memo keeping at most `capacity` entries (at least one).
    pub fn with_capacity(capacity: usize) -> Self {
        Memo(std::sync::Arc::new(MemoSlot { entries: std::sync::Mutex::new(Vec::new()), capacity: capacity.max(1) }))
    }

    /// The value stored under `key` if it has type `T`, or `make()` stored and returned. `make`
    /// runs without the slot locked, so two threads may both compute a missing value (the first
    /// stored wins; the values are equal by construction).
    pub fn get_or_insert_with<T: std::any::Any + Send + Sync>(&self, key: u64, make: impl FnOnce() -> T) -> std::sync::Arc<T> {
        let find = |v: &Vec<MemoEntry>| v.iter().find_map(|(k, a)| if *k == key { a.clone().downcast::<T>().ok() } else { None });
        if let Some(found) = find(&self.lock()) {
            return found;
        }
        let made = std::sync::Arc::new(make());
        let mut v = self.lock();
        if let Some(found) = find(&v) {
            return found;
        }
        if v.len() >= self.0.capacity {
            v.remove(0);
        }
        v.push((key, made.clone()));
        made
    }

    /// Forgets every entry for this holder only (clones keep theirs): called when what the
    /// values were derived from changes.
    pub fn invalidate(&mut self) {
        // Unshared (a body being built): clear in place, without locking.
        match std::sync::Arc::get_mut(&mut self.0) {
            Some(slot) => slot.entries.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner).clear(),
            None => *self = Memo::with_capacity(self.0.capacity),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<MemoEntry>> {
        // A panic while holding the lock leaves only a cache behind: keep using it.
        self.0.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl std::fmt::Debug for Memo {
    /// Constant: a memo is not part of what a program means (programs compare by their debug
    /// form in tests).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Memo")
    }
}

/// A [`StepBody`] held without keeping it alive ([`StepBody::downgrade`]): the body again while
/// some clone of it still holds it unchanged.
pub(crate) struct WeakBody {
    graph: std::sync::Weak<DiGraph<TileOp, ()>>,
    carries: u16,
    memo: std::sync::Weak<MemoSlot>,
    signature: std::sync::Weak<std::sync::OnceLock<u64>>,
}

impl WeakBody {
    /// The body, if a clone of it still holds its graph, memo and signature (a body changed in
    /// place lets go of all three: [`StepBody::changed`]).
    pub(crate) fn upgrade(&self) -> Option<StepBody> {
        Some(StepBody {
            graph: self.graph.upgrade()?,
            carries: self.carries,
            memo: Memo(self.memo.upgrade()?),
            signature: SignatureCell(self.signature.upgrade()?),
            counted: None,
        })
    }

    /// Whether some clone still holds the body's graph.
    pub(crate) fn alive(&self) -> bool {
        self.graph.strong_count() > 0
    }
}

impl StepBody {
    /// The body held weakly ([`WeakBody`]); `None` for a body built for counting only.
    pub(crate) fn downgrade(&self) -> Option<WeakBody> {
        self.counted.is_none().then(|| WeakBody {
            graph: std::sync::Arc::downgrade(&self.graph),
            carries: self.carries,
            memo: std::sync::Arc::downgrade(&self.memo.0),
            signature: std::sync::Arc::downgrade(&self.signature.0),
        })
    }

    /// An empty body with room for `nodes` operations and `edges` dependencies (a builder that
    /// knows its size saves the graph's reallocations).
    pub fn with_capacity(nodes: usize, edges: usize) -> Self {
        StepBody { graph: std::sync::Arc::new(DiGraph::with_capacity(nodes, edges)), ..StepBody::default() }
    }

    /// A body of `graph` (its node indices a topological order, as [`StepBody`] requires) whose
    /// operations name carried slots `0..carries`.
    pub fn from_graph(mut graph: DiGraph<TileOp, ()>, carries: u16) -> Self {
        // A built graph is kept (shared by clones, stored for later lowerings): its storage at
        // its size, not at the capacity it grew to.
        graph.shrink_to_fit();
        StepBody { graph: std::sync::Arc::new(graph), carries, ..StepBody::default() }
    }

    /// A body built for counting only ([`StepBody::counted`]): `works` are its operations' works,
    /// consecutive equal ones as one entry with their number.
    pub fn counted(works: Vec<(Work, u32)>) -> Self {
        StepBody { counted: Some(works.into()), ..StepBody::default() }
    }

    /// Adds an operation issued at slot `issue`, depending on `deps`, and returns its index.
    /// Every dependency must have an issue slot no later than the operation's.
    pub fn add(&mut self, name: &'static str, work: Work, deps: &[NodeIndex], issue: u64) -> NodeIndex {
        self.add_carried(name, work, deps, issue, None, None)
    }

    /// [`StepBody::add`] for an operation that reads carried slot `carry_in` (the previous
    /// step's value) and/or writes slot `carry_out`.
    pub fn add_carried(
        &mut self,
        name: &'static str,
        work: Work,
        deps: &[NodeIndex],
        issue: u64,
        carry_in: Option<u16>,
        carry_out: Option<u16>,
    ) -> NodeIndex {
        self.changed();
        let graph = std::sync::Arc::make_mut(&mut self.graph);
        let n = graph.add_node(TileOp { name, work, issue, carry_in, carry_out });
        for &d in deps {
            graph.add_edge(d, n, ());
        }
        for c in carry_in.iter().chain(carry_out.iter()) {
            self.carries = self.carries.max(c + 1);
        }
        n
    }

    /// Forgets what was derived from the body (the memo's schedules, the signature): code that
    /// changes [`StepBody::graph`] or [`StepBody::carries`] in place calls it ([`StepBody::add`]
    /// does).
    pub fn changed(&mut self) {
        self.memo.invalidate();
        if self.signature.0.get().is_some() {
            self.signature = SignatureCell::default();
        }
    }

    /// Each operation's work with its number (1 per graph node; a counted body's entries).
    pub fn works(&self) -> Box<dyn Iterator<Item = (Work, u32)> + '_> {
        match &self.counted {
            Some(c) => Box::new(c.iter().copied()),
            None => Box::new(self.graph.node_weights().map(|op| (op.work, 1))),
        }
    }

    /// Total matmul FLOPs of the body, at the matmuls' own dimensions ([`Work::flops`]).
    pub fn flops(&self) -> f64 {
        self.works().map(|(w, n)| f64::from(n) * w.flops()).sum()
    }

    /// Total matmul FLOPs the body executes, at tile-padded dimensions ([`Work::executed_flops`]).
    pub fn executed_flops(&self) -> f64 {
        self.works().map(|(w, n)| f64::from(n) * w.executed_flops()).sum()
    }

    /// Total exp/reciprocal registers x elements per register gives transcendentals.
    pub fn transcendental_vregs(&self) -> f64 {
        self.works()
            .map(|(w, n)| match w {
                Work::Transcendental { vregs } => f64::from(n) * vregs,
                _ => 0.0,
            })
            .sum()
    }

    /// Bytes the body's own copies move (`tpu.enqueue_dma` in the body), per step.
    pub fn dma_bytes(&self) -> u64 {
        self.works()
            .map(|(w, n)| match w {
                Work::Dma { bytes, .. } => u64::from(n) * bytes,
                _ => 0,
            })
            .sum()
    }

    /// True when the body has no operations (a skipped grid step).
    pub fn is_empty(&self) -> bool {
        self.graph.node_count() == 0 && self.counted.as_ref().is_none_or(|c| c.is_empty())
    }

    /// A stable 64-bit hash of the body's meaning (FNV-1a over every operation in node order:
    /// its name, unit work, issue key and carried slots, and its inputs): two bodies with equal
    /// signatures schedule alike on every chip. What the agreement suite compares between a
    /// hand-written kernel and the same kernel read from its IR.
    pub fn signature(&self) -> u64 {
        *self.signature.0.get_or_init(|| self.compute_signature())
    }

    fn compute_signature(&self) -> u64 {
        // FNV-1a over the fields' bytes (numbers by their bit patterns): no text is formatted.
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        let mut eat = |bytes: &[u8]| {
            for &b in bytes {
                h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
            }
        };
        let slot = |c: Option<u16>| c.map_or(u32::MAX, u32::from).to_le_bytes();
        let mut deps: Vec<u32> = Vec::new();
        for n in self.graph.node_indices() {
            let op = &self.graph[n];
            eat(op.name.as_bytes());
            eat(&[0xff]);
            match op.work {
                Work::Matmul { m, k, n, m_total, mxu_type } => {
                    eat(&[0, mxu_type as u8]);
                    for x in [m, k, n, m_total] {
                        eat(&x.to_le_bytes());
                    }
                }
                Work::Vector { ops, loaded_mask_vregs } => {
                    eat(&[1]);
                    eat(&ops.to_bits().to_le_bytes());
                    eat(&loaded_mask_vregs.to_bits().to_le_bytes());
                }
                Work::Transcendental { vregs } => {
                    eat(&[2]);
                    eat(&vregs.to_bits().to_le_bytes());
                }
                Work::CrossLane { vregs } => {
                    eat(&[3]);
                    eat(&vregs.to_bits().to_le_bytes());
                }
                Work::Dma { bytes, path } => {
                    eat(&[4, path as u8]);
                    eat(&bytes.to_le_bytes());
                }
                Work::DmaWait { queued } => eat(&[5, u8::from(queued)]),
            }
            eat(&op.issue.to_le_bytes());
            eat(&slot(op.carry_in));
            eat(&slot(op.carry_out));
            deps.clear();
            deps.extend(self.graph.neighbors_directed(n, petgraph::Direction::Incoming).map(|d| d.index() as u32));
            deps.sort_unstable();
            eat(&(deps.len() as u32).to_le_bytes());
            for d in &deps {
                eat(&d.to_le_bytes());
            }
        }
        eat(&self.carries.to_le_bytes());
        h
    }
}

/// What a step class stands for, for reports and timelines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct ClassKey {
    /// `empty`, `partial` or `full` for attention tiles; `full` for matmul steps.
    pub tile: &'static str,
    /// Whether the element-wise mask is applied.
    pub masked: bool,
    /// First step of an output block (initialises accumulators).
    pub first: bool,
    /// Last step of an output block (finalises and writes back).
    pub last: bool,
}

/// A distinct step body and what it stands for.
#[derive(Debug, Clone)]
pub struct StepClass {
    /// Description.
    pub key: ClassKey,
    /// The operations.
    pub body: StepBody,
}

/// One grid step as the engine sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Step {
    /// Index into [`crate::Program::classes`].
    pub class: u32,
    /// The copies the pipeline makes around this step: an index into
    /// [`crate::Program::copies`] (0: none; [`crate::copies`] says which copies run).
    pub copies: u32,
    /// Grid coordinates: (batch x head, q block or row block, kv block or column block, k block).
    pub coords: [u32; 4],
}
