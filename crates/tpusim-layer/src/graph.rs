//! One transformer block on one chip of the slice, as a dependency graph of operations
//! (petgraph): what each op computes or moves, for the chip's share of the work.
//!
//! Layout (Ulysses sequence parallelism, `LayerPlan`): between the all-to-alls each chip holds
//! `T` = local batch x L / P tokens of every head; inside self-attention it holds all L tokens of
//! H / P heads. Ops, in program order (which is also their issue order):
//!
//! * **modulation** and **norm1 + modulate**: the block's table plus the time embedding, then
//!   LayerNorm x (1 + scale) + shift (HBM-bound fusions);
//! * **q, k, v projections** (T x D -> H d, bias fused into the dot's output), **q/k RMSNorm +
//!   RoPE** (per tensor a statistics fusion and a normalising one that applies RoPE; the RoPE
//!   tables are read as f32 cos and sin per token and head-dim element), on one chip a **v
//!   transpose** to the kernel's layout;
//! * **all-to-all q, k, v** (each chip sends each other chip of its group T x H d / P elements);
//! * sparse attention only: **routing** (the SVG head router: `routing_rows` sampled queries
//!   of each local head against all keys under three candidate masks, modelled as a small
//!   attention call of 3 x local batch x H / P heads) and the **permutation** of the temporal
//!   heads' tokens: after the all-to-all a head-local gather of q, k, v (and the inverse gather of
//!   o before the return all-to-all); before it, an exchange of the sequence-sharded tensors
//!   across the group (`Exchange`) and a gather, per tensor, and the inverse after the return
//!   all-to-all;
//! * **self-attention**: the Splash kernel (dense, or sparse on the band + sink mask) over the
//!   local batch x H / P heads of length L;
//! * on one chip an **o transpose** back to token-major, **all-to-all o**, **o projection**;
//! * **residual + norm3** (affine LayerNorm of x1 = x + gate x o: its statistics and
//!   normalising fusions each compute x1 from x, o and the gate, and nothing writes x1; without
//!   `cross_attn_norm` no norm and an **attention gate + residual** fusion writes x1), **cross q
//!   projection** and **q RMSNorm**, the **text k, v
//!   projections** of the 512 text tokens (each chip projects its sequences' text; no exchange:
//!   queries stay sequence-sharded and every chip holds all heads), **text k RMSNorm**, **text
//!   v transpose**, **cross-attention** (all H heads, T / local batch queries, 512 keys), **cross
//!   o transpose**, **cross o projection** with the **residual add** fused into its output
//!   (reading x, o and the gate where norm3 left x1 unwritten);
//! * **norm2 + modulate**, **FFN up** (GELU fused into the dot's output), **FFN down**, **gate
//!   + residual**.
//!
//! Fusions follow the rule of the whole-program path (`tpusim-program`'s `fuse` module, as XLA
//! fuses): element-wise chains that widen nothing fuse into a dot's output (bias, GELU, the
//! ungated residual add; a gate multiplies in f32, so the gated residuals start fusions of their
//! own); a reduction is its fusion's root, so every norm (LayerNorm, RMSNorm) is two HBM round
//! trips, its **statistics** (read the input, write f32 row values: mean and variance, or the
//! mean square) and its normalising fusion (read the input and the rows, and an RMSNorm's f32
//! weight, write the output); an element-wise value inside a statistics fusion (the first gated
//! residual, which norm3 reduces) is not written but recomputed by each later reader. The
//! kernels read head-major [H, L, d] and the projections write token-major [L, H d]: a fusion
//! over the whole tensor (norm + RoPE, a norm) or an all-to-all writes the other layout as it
//! goes, while a dot's output (v, text v) and a kernel's (o, cross o) change layout in a
//! **transpose** fusion of their own (data movement joins neither a dot nor a kernel).
//!
//! With weights `gathered`, each matmul first all-gathers its weight over the group (no data
//! dependence on the activations, so the gathers can run ahead on the ICI).
//!
//! Byte counts of the fusions are what they read and write in HBM (activations at the block's
//! activation width; modulation vectors, norm weights and the RoPE cos and sin tables in f32).
//! On the same block they equal the whole-program path's fusions but for the few bytes of
//! scalar constants (an epsilon) XLA's fusions also read (`crates/tpusim-py/tests/test_program.py`).

use crate::spec::{AttentionMode, Exchange, LayerPlan, Placement, Weights};
use crate::topology::Collective;
use petgraph::graph::{DiGraph, NodeIndex};
use serde::Serialize;
use tpusim_job::JobSpec;
use tpusim_workload::{AttentionCall, Mask};

tpusim_model::word_enum! {
    /// What part of the layer an op belongs to (the report's breakdown).
    pub enum Category {
        /// Self- and cross-attention kernels and the SVG head router.
        Attention = "attention",
        /// q, k, v and output projections of self- and cross-attention.
        Projections = "projections",
        /// The feed-forward network's two matmuls.
        FeedForward = "feed-forward",
        /// Norms, modulation, RoPE, gates and residual adds (HBM-bound fusions).
        Elementwise = "elementwise",
        /// The Ulysses all-to-alls of q, k, v and o.
        AllToAll = "all-to-all",
        /// The temporal heads' token permutation: gathers in HBM and, before the all-to-all, its cross-chip exchange.
        Permutation = "permutation",
        /// All-gathers of sharded weights.
        WeightGather = "weight-gather",
    }
}

/// What an op does.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Work {
    /// A matmul (m x k) . (k x n) on the MXUs (XLA's dot, the kernel crate's `xla-matmul`).
    Matmul {
        /// Rows.
        m: u64,
        /// Output columns.
        n: u64,
        /// Contraction.
        k: u64,
    },
    /// A Splash attention kernel.
    Attention {
        /// The call.
        call: Box<AttentionCall>,
        /// The kernel's options (family, blocks, traversal, masking, alignment).
        kernel: Box<JobSpec>,
    },
    /// An HBM-bound XLA fusion (element-wise ops, norms, gathers).
    Fusion {
        /// Bytes read from HBM.
        read_bytes: u64,
        /// Bytes written to HBM.
        write_bytes: u64,
    },
    /// An ICI collective within the chip's group.
    Collective(Collective),
}

impl Work {
    /// Whether the op runs on the ICI (else on the TensorCore).
    pub fn on_ici(&self) -> bool {
        matches!(self, Work::Collective(_))
    }
}

/// One op of the layer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LayerOp {
    /// Name for reports, e.g. `q proj`.
    pub name: String,
    /// Breakdown category.
    pub category: Category,
    /// What it does.
    pub work: Work,
}

/// The layer's ops and their data dependences (an edge a -> b: b reads what a writes). Node
/// indices are program order, a topological order.
#[derive(Debug, Clone)]
pub struct LayerGraph {
    /// The graph.
    pub graph: DiGraph<LayerOp, ()>,
}

impl LayerGraph {
    /// Ops in program order.
    pub fn ops(&self) -> impl Iterator<Item = (NodeIndex, &LayerOp)> {
        self.graph.node_indices().map(move |i| (i, &self.graph[i]))
    }

    /// The ops an op depends on.
    pub fn deps(&self, i: NodeIndex) -> Vec<NodeIndex> {
        self.graph.neighbors_directed(i, petgraph::Direction::Incoming).collect()
    }

    /// Useful matmul FLOPs of the ops that are matmuls (2 m n k each), for the analytic count.
    pub fn matmul_flops(&self) -> f64 {
        self.ops()
            .map(|(_, o)| match o.work {
                Work::Matmul { m, n, k } => 2.0 * m as f64 * n as f64 * k as f64,
                _ => 0.0,
            })
            .sum()
    }
}

struct Builder {
    g: DiGraph<LayerOp, ()>,
}

impl Builder {
    fn add(&mut self, name: impl Into<String>, category: Category, work: Work, deps: &[NodeIndex]) -> NodeIndex {
        let n = self.g.add_node(LayerOp { name: name.into(), category, work });
        for &d in deps {
            self.g.add_edge(d, n, ());
        }
        n
    }
}

fn fusion(read_bytes: u64, write_bytes: u64) -> Work {
    Work::Fusion { read_bytes, write_bytes }
}

/// Builds the op graph of one block on one chip (module docs).
pub fn build(plan: &LayerPlan) -> LayerGraph {
    let m = &plan.model;
    let a = m.activation_bytes;
    let (d, w, f, h, hd) = (m.hidden, m.qkv_width(), m.ffn, m.heads, m.head_dim);
    let b = plan.local_batch;
    let p = plan.ulysses;
    let t = plan.tokens_per_chip();
    let hl = plan.heads_per_chip();
    let lp = plan.padded_len;
    let text = b * m.text_tokens;
    let f32 = 4;
    let mut g = Builder { g: DiGraph::new() };
    let sparse = plan.attention == AttentionMode::Sparse;

    // Weight gathers (all at the start: they read only weights).
    let wb = m.weight_bytes;
    let gather = |g: &mut Builder, name: &str, elems: u64| -> Vec<NodeIndex> {
        if plan.weights == Weights::Gathered && p > 1 {
            vec![g.add(
                format!("gather {name} weights"),
                Category::WeightGather,
                Work::Collective(Collective::AllGather { bytes_per_device: (elems * wb).div_ceil(p) }),
                &[],
            )]
        } else {
            Vec::new()
        }
    };
    let wq = gather(&mut g, "q", d * w);
    let wk = gather(&mut g, "k", d * w);
    let wv = gather(&mut g, "v", d * w);
    let wo = gather(&mut g, "o", w * d);
    let wcq = gather(&mut g, "cross q", d * w);
    let wck = gather(&mut g, "text k", d * w);
    let wcv = gather(&mut g, "text v", d * w);
    let wco = gather(&mut g, "cross o", w * d);
    let wup = gather(&mut g, "ffn up", d * f);
    let wdown = gather(&mut g, "ffn down", f * d);
    let with = |mut v: Vec<NodeIndex>, extra: &[NodeIndex]| {
        v.extend_from_slice(extra);
        v
    };

    // Self-attention.
    let mv = m.modulation_vectors;
    let modulation = g.add("modulation", Category::Elementwise, fusion(b * 2 * mv * d * f32, b * mv * d * f32), &[]);
    // A norm's statistics pass (module docs): reads its input, writes `rows` f32 values per row.
    let stats = |g: &mut Builder, name: &str, bytes: u64, row_values: u64, deps: &[NodeIndex]| {
        g.add(format!("{name} statistics"), Category::Elementwise, fusion(bytes, row_values * f32), deps)
    };
    let s1 = stats(&mut g, "norm1", t * d * a, 2 * t, &[]);
    let norm1 = g.add("norm1 + modulate", Category::Elementwise, fusion(t * d * a + 2 * t * f32 + b * 2 * d * f32, t * d * a), &[modulation, s1]);
    let proj = |g: &mut Builder, name: &str, wdeps: &[NodeIndex], input: NodeIndex| {
        g.add(format!("{name} proj"), Category::Projections, Work::Matmul { m: t, n: w, k: d }, &with(wdeps.to_vec(), &[input]))
    };
    let q = proj(&mut g, "q", &wq, norm1);
    let k = proj(&mut g, "k", &wk, norm1);
    let v = proj(&mut g, "v", &wv, norm1);
    // RoPE's cos and sin tables, f32 per token and head-dim element.
    let rope_table = 2 * t * hd * f32;
    // An RMSNorm's weight, one f32 per element of its row.
    let rms_weight = w * f32;
    // q and k: RMSNorm (statistics, then normalise) with RoPE in the normalising fusion, which
    // also writes the kernel's head-major layout.
    let rope = |g: &mut Builder, name: &str, x: NodeIndex| {
        if m.qk_norm {
            let st = stats(g, &format!("{name} norm"), t * w * a, t, &[x]);
            g.add(format!("{name} norm + RoPE"), Category::Elementwise, fusion(t * w * a + t * f32 + rms_weight + rope_table, t * w * a), &[x, st])
        } else {
            g.add(format!("{name} RoPE"), Category::Elementwise, fusion(t * w * a + rope_table, t * w * a), &[x])
        }
    };
    let q = rope(&mut g, "q", q);
    let k = rope(&mut g, "k", k);
    let tensor = t * w * a;
    // A dot's output, or a kernel's, changes layout (token-major [L, H d] to the kernel's
    // head-major [H, L, d], or back) in a transpose fusion of its own; an element-wise fusion of
    // the whole tensor or an all-to-all writes the new layout as it goes (module docs).
    let transpose = |g: &mut Builder, name: &str, bytes: u64, x: NodeIndex| {
        g.add(format!("{name} transpose"), Category::Elementwise, fusion(bytes, bytes), &[x])
    };
    let v = if p == 1 { transpose(&mut g, "v", tensor, v) } else { v };
    let permuted = (plan.permuted_heads * tensor as f64).round() as u64;
    // The permutation before the all-to-all: exchange the permuted heads' tokens across the
    // group, then gather them into the permuted order.
    let before = |g: &mut Builder, name: &str, input: NodeIndex, inverse: bool| -> NodeIndex {
        if p == 1 || permuted == 0 {
            let verb = if inverse { "unpermute" } else { "permute" };
            return g.add(format!("{verb} {name}"), Category::Permutation, fusion(permuted, permuted), &[input]);
        }
        let verb = if inverse { "unpermute" } else { "permute" };
        let (c, gathered) = match plan.exchange {
            Exchange::AllGather => (Collective::AllGather { bytes_per_device: permuted }, permuted * p),
            Exchange::AllToAll => (Collective::AllToAll { bytes_per_pair: permuted.div_ceil(p) }, permuted),
        };
        let x = g.add(format!("{verb} {name}: {}", plan.exchange), Category::Permutation, Work::Collective(c), &[input]);
        g.add(format!("{verb} {name}: gather"), Category::Permutation, fusion(gathered, permuted), &[x])
    };
    let a2a = |g: &mut Builder, name: &str, input: NodeIndex| -> NodeIndex {
        if p == 1 {
            return input;
        }
        g.add(
            format!("all-to-all {name}"),
            Category::AllToAll,
            Work::Collective(Collective::AllToAll { bytes_per_pair: tensor.div_ceil(p) }),
            &[input],
        )
    };
    let perm_before = sparse && plan.permutation == Placement::Before;
    let perm_after = sparse && plan.permutation == Placement::After;
    let (mut q, mut k, mut v) = (q, k, v);
    if perm_before {
        q = before(&mut g, "q", q, false);
        k = before(&mut g, "k", k, false);
        v = before(&mut g, "v", v, false);
    }
    let q = a2a(&mut g, "q", q);
    let k = a2a(&mut g, "k", k);
    let v = a2a(&mut g, "v", v);
    let full_call = |batch: u64, heads: u64, q_len: u64, kv_len: u64, mask: Mask| AttentionCall {
        batch,
        q_heads: heads,
        kv_heads: heads,
        q_len,
        kv_len,
        head_dim: hd,
        head_dim_v: hd,
        mask,
    };
    let (mut qa, mut ka, mut va) = (q, k, v);
    let mut attn_deps = vec![q, k, v];
    if sparse {
        let rows = plan.routing_rows;
        let probe = JobSpec { block_q: Some(rows.next_multiple_of(8)), ..plan.dense_kernel.clone() };
        let route = g.add(
            "routing",
            Category::Attention,
            Work::Attention { call: Box::new(full_call(3 * b, hl, rows, lp, Mask::Full)), kernel: Box::new(probe) },
            &[q, k, v],
        );
        if perm_after {
            let local = |g: &mut Builder, name: &str, x: NodeIndex| {
                g.add(format!("permute {name}"), Category::Permutation, fusion(permuted, permuted), &[x, route])
            };
            qa = local(&mut g, "q", q);
            ka = local(&mut g, "k", k);
            va = local(&mut g, "v", v);
        }
        attn_deps = vec![qa, ka, va, route];
    }
    let (mask, kernel) =
        if sparse { (plan.sparse_mask.clone(), plan.sparse_kernel.clone()) } else { (Mask::Full, plan.dense_kernel.clone()) };
    let mut o = g.add(
        "self-attention",
        Category::Attention,
        Work::Attention { call: Box::new(full_call(b, hl, lp, lp, mask)), kernel: Box::new(kernel) },
        &attn_deps,
    );
    if perm_after {
        o = g.add("unpermute o", Category::Permutation, fusion(permuted, permuted), &[o]);
    }
    if p == 1 {
        o = transpose(&mut g, "o", tensor, o);
    }
    let mut o = a2a(&mut g, "o", o);
    if perm_before {
        o = before(&mut g, "o", o, true);
    }
    let o = g.add("o proj", Category::Projections, Work::Matmul { m: t, n: d, k: w }, &with(wo, &[o]));
    // The gated residual x1 = x + gate * o (the block input x is no node: it is ready at the
    // start).
    let gated = 2 * t * d * a + b * d * f32;

    // Cross-attention.
    // norm3: an affine LayerNorm, or none (Wan's `nn.Identity` when `cross_attn_norm` is off).
    // With norm3, x1 is an element-wise intermediate of norm3's statistics fusion (a reduction
    // closes it): nothing writes x1, and each reader recomputes it from x, o and the gate
    // (norm3's normalisation and the cross o projection's residual; the whole-program path's
    // fusion rules 4 and 7). Without it, x1 is a fusion of its own that the cross q projection
    // reads.
    let (n3, x1) = if m.cross_attn_norm {
        let s3 = stats(&mut g, "residual + norm3", gated, 2 * t, &[o, modulation]);
        let n3 = g.add(
            "residual + norm3",
            Category::Elementwise,
            fusion(gated + 2 * t * f32 + 2 * d * f32, t * d * a),
            &[o, modulation, s3],
        );
        (n3, vec![o, modulation])
    } else {
        let x1 = g.add("attention gate + residual", Category::Elementwise, fusion(gated, t * d * a), &[o, modulation]);
        (x1, vec![x1])
    };
    let cq = g.add("cross q proj", Category::Projections, Work::Matmul { m: t, n: w, k: d }, &with(wcq, &[n3]));
    // The cross-attention's q, k and v in the kernel's layout: normalised (RMSNorm) on the way,
    // or transposed.
    let rms_or_transpose = |g: &mut Builder, name: &str, rows: u64, x: NodeIndex| {
        if m.qk_norm {
            let st = stats(g, &format!("{name} norm"), rows * w * a, rows, &[x]);
            g.add(format!("{name} norm"), Category::Elementwise, fusion(rows * w * a + rows * f32 + rms_weight, rows * w * a), &[x, st])
        } else {
            transpose(g, name, rows * w * a, x)
        }
    };
    let cq = rms_or_transpose(&mut g, "cross q", t, cq);
    let ck = g.add("text k proj", Category::Projections, Work::Matmul { m: text, n: w, k: d }, &wck);
    let cv = g.add("text v proj", Category::Projections, Work::Matmul { m: text, n: w, k: d }, &wcv);
    let ck = rms_or_transpose(&mut g, "text k", text, ck);
    let cv = transpose(&mut g, "text v", text * w * a, cv);
    let dk = &plan.dense_kernel;
    // The dense kernel's blocks (given, or its family's defaults) cut to the text's 512 keys
    // and the chip's queries.
    let fam = dk.kernel().defaults().blocks;
    let text_kv = m.text_tokens.next_multiple_of(128);
    let cross_kernel = JobSpec {
        block_q: Some(dk.block_q.unwrap_or(fam.q).min((t / b).next_multiple_of(8))),
        block_kv: Some(dk.block_kv.unwrap_or(fam.kv).min(text_kv)),
        block_kv_compute: dk.block_kv_compute.or(fam.compute).map(|x| x.min(text_kv)),
        ..dk.clone()
    };
    let co = g.add(
        "cross-attention",
        Category::Attention,
        Work::Attention { call: Box::new(full_call(b, h, t / b, m.text_tokens, Mask::Full)), kernel: Box::new(cross_kernel) },
        &[cq, ck, cv],
    );
    let co = transpose(&mut g, "cross o", t * w * a, co);
    // The ungated residual add fuses into the dot's output (it widens nothing): the dot writes x2.
    let x2 = g.add("cross o proj (+ residual)", Category::Projections, Work::Matmul { m: t, n: d, k: w }, &with(wco, &with(x1, &[co])));

    // Feed-forward.
    let s2 = stats(&mut g, "norm2", t * d * a, 2 * t, &[x2]);
    let n2 = g.add("norm2 + modulate", Category::Elementwise, fusion(t * d * a + 2 * t * f32 + b * 2 * d * f32, t * d * a), &[x2, modulation, s2]);
    let up = g.add("ffn up (+ GELU)", Category::FeedForward, Work::Matmul { m: t, n: f, k: d }, &with(wup, &[n2]));
    let down = g.add("ffn down", Category::FeedForward, Work::Matmul { m: t, n: d, k: f }, &with(wdown, &[up]));
    g.add("gate + residual", Category::Elementwise, fusion(2 * t * d * a + b * d * f32, t * d * a), &[down, x2, modulation]);
    LayerGraph { graph: g.g }
}
