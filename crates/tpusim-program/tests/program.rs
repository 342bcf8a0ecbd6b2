//! The fusion rule, the counts, the collectives and the overlap rule on hand-written program
//! descriptions (PROGRAM.md), with closed forms.

use serde_json::{json, Value};
use std::path::Path;
use tpusim_chip::ChipModel;
use tpusim_program::fuse::{group, GroupKind};
use tpusim_program::{simulate_program, ProgramDescription, ProgramError};

/// A description builder: values by (shape, dtype, kind), ops by (name, operands, results, attrs).
struct B {
    values: Vec<Value>,
    ops: Vec<Value>,
    mesh: Vec<Value>,
}

impl B {
    fn new() -> Self {
        B { values: Vec::new(), ops: Vec::new(), mesh: Vec::new() }
    }
    fn val(&mut self, shape: &[u64], dtype: &str, kind: &str) -> usize {
        self.values.push(json!({"shape": shape, "dtype": dtype, "kind": kind}));
        self.values.len() - 1
    }
    fn op(&mut self, name: &str, operands: &[usize], shape: &[u64], dtype: &str, attrs: Value) -> usize {
        let r = self.val(shape, dtype, "result");
        self.ops.push(json!({"op": name, "operands": operands, "results": [r], "location": format!("t.py:{}", self.ops.len() + 1), "sharded": !self.mesh.is_empty(), "attrs": attrs}));
        r
    }
    fn build(&self, inputs: &[usize], outputs: &[usize]) -> ProgramDescription {
        let d = json!({
            "format": "tpusim-program-description", "version": 1, "producer": {"tool": "test"},
            "mesh": self.mesh, "values": self.values, "inputs": inputs, "outputs": outputs, "ops": self.ops, "kernels": [],
        });
        ProgramDescription::from_json(&d.to_string(), "test").unwrap()
    }
}

fn v6e() -> ChipModel {
    ChipModel::preset("v6e").unwrap()
}

fn dot(b: &mut B, x: usize, w: usize, m: u64, n: u64) -> usize {
    b.op(
        "dot_general",
        &[x, w],
        &[m, n],
        "bf16",
        json!({"lhs_batching_dimensions": [], "rhs_batching_dimensions": [], "lhs_contracting_dimensions": [1], "rhs_contracting_dimensions": [0]}),
    )
}

/// x @ w (f32 result), then a chain of element-wise ops with a broadcast constant, a reshape
/// and a convert: the chain fuses into the dot's output while every user of what it reads is
/// element-wise (the broadcast is recomputed, the reshape a bitcast); the sum also feeds a
/// reduce, so the chain ends there and the dot writes it; a reduce starts and closes a fusion.
#[test]
fn element_wise_chains_fuse_into_one_round_trip() {
    let (m, k, n) = (512u64, 256u64, 1024u64);
    let mut b = B::new();
    let x = b.val(&[m, k], "bf16", "argument");
    let w = b.val(&[k, n], "bf16", "argument");
    let c = b.val(&[], "f32", "constant");
    let y = b.op(
        "dot_general",
        &[x, w],
        &[m, n],
        "f32",
        json!({"lhs_batching_dimensions": [], "rhs_batching_dimensions": [], "lhs_contracting_dimensions": [1], "rhs_contracting_dimensions": [0]}),
    );
    let sq = b.op("multiply", &[y, y], &[m, n], "f32", json!({}));
    let cb = b.op("broadcast_in_dim", &[c], &[m, n], "f32", json!({"broadcast_dimensions": []}));
    let t = b.op("tanh", &[sq], &[m, n], "f32", json!({}));
    let s = b.op("add", &[t, cb], &[m, n], "f32", json!({}));
    let r = b.op("reshape", &[s], &[m * n], "f32", json!({}));
    let o = b.op("convert", &[r], &[m * n], "bf16", json!({}));
    let init = b.val(&[], "f32", "constant");
    let red = b.op("reduce", &[s, init], &[m], "f32", json!({"dimensions": [1], "computation": ["add"]}));
    let after = b.op("exponential", &[red], &[m], "f32", json!({}));
    let d = b.build(&[x, w], &[o, after]);
    let g = group(&d).unwrap();
    let kinds: Vec<GroupKind> = g.groups.iter().map(|g| g.kind).collect();
    assert_eq!(kinds, vec![GroupKind::Dot, GroupKind::Fusion, GroupKind::Fusion, GroupKind::Fusion]);
    let dg = &g.groups[0];
    assert_eq!(dg.ops, vec![0, 1, 3, 4], "the dot, multiply, tanh, add");
    assert_eq!(dg.read_bytes, (m * k + k * n) * 2 + 4, "x, w and the scalar, once");
    assert_eq!(dg.write_bytes, m * n * 4, "the sum, which the convert and the reduce read");
    assert_eq!((g.groups[1].read_bytes, g.groups[1].write_bytes), (m * n * 4, m * n * 2), "the convert");
    assert_eq!((g.groups[2].read_bytes, g.groups[2].write_bytes), (m * n * 4 + 4, m * 4), "the reduce cannot join a dot");
    assert_eq!((g.groups[3].read_bytes, g.groups[3].write_bytes), (m * 4, m * 4), "a reduce closes its fusion");
    // Counts as HloCostAnalysis: 2mnk, one FLOP per element-wise result, (in - out) per reduce.
    let r = simulate_program(&v6e(), &d, None, Path::new(".")).unwrap();
    let e = (m * n) as f64;
    assert_eq!(r.xla_flops, 2.0 * (m * n * k) as f64 + 3.0 * e + (e - m as f64));
    assert_eq!(r.xla_transcendentals, e + m as f64);
    assert_eq!(r.fusions, 3);
    assert_eq!(r.xla_bytes_fused, (m * k + k * n) * 2 + 4 + m * n * 4 + m * n * 6 + (m * n * 4 + 4 + m * 4) + 2 * m * 4);
    assert!(r.xla_bytes_unfused > r.xla_bytes_fused);
    // Everything on the core: the latency is the sum of the groups' times.
    let sum: f64 = r.entries.iter().map(|e| e.seconds).sum();
    assert!((r.latency_ms - sum * 1e3).abs() < 1e-12);
}

/// An upcast after a bf16 dot is not fused into it (it would widen what the dot writes): its
/// reader fuses it and reads the bf16 result.
#[test]
fn an_upcast_does_not_widen_a_dot() {
    let (m, k, n) = (256u64, 512u64, 384u64);
    let mut b = B::new();
    let x = b.val(&[m, k], "bf16", "argument");
    let w = b.val(&[k, n], "bf16", "argument");
    let y = dot(&mut b, x, w, m, n);
    let yf = b.op("convert", &[y], &[m, n], "f32", json!({}));
    let sq = b.op("multiply", &[yf, yf], &[m, n], "f32", json!({}));
    let o = b.op("convert", &[sq], &[m, n], "bf16", json!({}));
    let d = b.build(&[x, w], &[o]);
    let g = group(&d).unwrap();
    assert_eq!(g.groups.iter().map(|g| g.kind).collect::<Vec<_>>(), vec![GroupKind::Dot, GroupKind::Fusion]);
    assert_eq!(g.groups[0].write_bytes, m * n * 2);
    assert_eq!((g.groups[1].ops.clone(), g.groups[1].read_bytes, g.groups[1].write_bytes), (vec![2, 3], m * n * 2, m * n * 2));
}

/// A bias broadcast from an argument fuses into the dot with its add: the dot reads x, w and
/// the bias vector once.
#[test]
fn a_broadcast_bias_fuses_into_the_dot() {
    let (m, k, n) = (256u64, 512u64, 384u64);
    let mut b = B::new();
    let x = b.val(&[m, k], "bf16", "argument");
    let w = b.val(&[k, n], "bf16", "argument");
    let bias = b.val(&[n], "bf16", "argument");
    let y = dot(&mut b, x, w, m, n);
    let bb = b.op("broadcast_in_dim", &[bias], &[m, n], "bf16", json!({"broadcast_dimensions": [1]}));
    let z = b.op("add", &[y, bb], &[m, n], "bf16", json!({}));
    let d = b.build(&[x, w, bias], &[z]);
    let g = group(&d).unwrap();
    assert_eq!(g.groups.len(), 1);
    assert_eq!(g.groups[0].ops.len(), 2, "the dot and the add (the broadcast is recomputed)");
    assert_eq!(g.groups[0].read_bytes, (m * k + k * n + n) * 2);
    assert_eq!(g.groups[0].write_bytes, m * n * 2);
}

#[test]
fn an_op_not_modelled_is_an_error_naming_it_and_its_location() {
    let mut b = B::new();
    let x = b.val(&[8, 128], "f32", "argument");
    let y = b.op("sort", &[x], &[8, 128], "f32", json!({}));
    let d = b.build(&[x], &[y]);
    let e = simulate_program(&v6e(), &d, None, Path::new(".")).unwrap_err();
    assert!(matches!(&e, ProgramError::Op { op, location, .. } if op == "sort" && location == "t.py:1"), "{e}");
    assert!(e.to_string().contains("not an op tpusim models"), "{e}");
    let mut b = B::new();
    let x = b.val(&[8, 128], "f32", "argument");
    let y = b.op("custom_call", &[x], &[8, 128], "f32", json!({"target": "Sharding"}));
    let e = simulate_program(&v6e(), &b.build(&[x], &[y]), None, Path::new(".")).unwrap_err().to_string();
    assert!(e.contains("`Sharding`") && e.contains("t.py:1"), "{e}");
    let bad = r#"{"format": "tpusim-program-description", "version": 2, "producer": {}, "mesh": [], "values": [], "inputs": [], "outputs": [], "ops": [], "kernels": []}"#;
    assert!(ProgramDescription::from_json(bad, "x").unwrap_err().to_string().contains("`version`"));
}

fn ring(b: &mut B, x: usize, shape: &[u64], dtype: &str, n: u64) -> usize {
    let pairs: Vec<[u64; 2]> = (0..n).map(|i| [i, (i + 1) % n]).collect();
    b.op("collective_permute", &[x], shape, dtype, json!({"source_target_pairs": pairs}))
}

/// A ring step: a dot on the core while an independent block goes round the ring. The transfer
/// (hidden) costs the core one DMA issue; the latency lies between max and sum of the
/// compute-only and ICI-only schedules; the consumer of the transfer waits for it.
#[test]
fn a_permute_hides_behind_independent_compute() {
    let chip = v6e();
    let mut b = B::new();
    b.mesh = vec![json!(["x", 8])];
    let q = b.val(&[4096, 1024], "bf16", "shard");
    let w = b.val(&[1024, 4096], "bf16", "shard");
    let kv = b.val(&[64, 128], "bf16", "shard");
    let s = dot(&mut b, q, w, 4096, 4096);
    let kv2 = ring(&mut b, kv, &[64, 128], "bf16", 8);
    let d = b.build(&[q, w, kv], &[s, kv2]);
    let r = simulate_program(&chip, &d, Some("2x4"), Path::new(".")).unwrap();
    let dot_s = r.entries.iter().find(|e| e.kind == GroupKind::Dot).unwrap().seconds;
    let perm = r.entries.iter().find(|e| e.kind == GroupKind::Collective).unwrap();
    assert!(perm.seconds < dot_s, "the case needs a transfer shorter than the dot: {} vs {dot_s}", perm.seconds);
    let issue = chip.fitted.dma_issue_ns.value * 1e-9;
    assert_eq!(perm.issue_seconds, issue, "one message per device");
    assert!((r.latency_ms - (dot_s + issue) * 1e3).abs() < 1e-12, "{} vs {}", r.latency_ms, (dot_s + issue) * 1e3);
    assert!(r.latency_ms >= r.compute_only_ms.max(r.ici_only_ms) - 1e-12);
    assert!(r.latency_ms <= r.compute_only_ms + r.ici_only_ms + 1e-12);
    // The wraparound pair 3 -> 4 of a 2x4 mesh goes 4 hops; one message per link.
    assert!(perm.detail.contains("4 hops"), "{}", perm.detail);

    // A consumer of the permuted block waits for it: adding kv2 + kv after the dot.
    let mut b2 = B::new();
    b2.mesh = vec![json!(["x", 8])];
    let q = b2.val(&[4096, 1024], "bf16", "shard");
    let w = b2.val(&[1024, 4096], "bf16", "shard");
    let kv = b2.val(&[4096, 1024], "bf16", "shard");
    let s = dot(&mut b2, q, w, 4096, 4096);
    let kv2 = ring(&mut b2, kv, &[4096, 1024], "bf16", 8);
    let sum = b2.op("add", &[kv2, kv], &[4096, 1024], "bf16", json!({}));
    let d2 = b2.build(&[q, w, kv], &[s, sum]);
    let r2 = simulate_program(&chip, &d2, Some("2x4"), Path::new(".")).unwrap();
    let perm = r2.entries.iter().find(|e| e.kind == GroupKind::Collective).unwrap();
    let add = r2.entries.iter().find(|e| e.kind == GroupKind::Fusion).unwrap();
    assert!(perm.seconds > r2.entries[0].seconds, "this transfer is longer than the dot");
    assert!((add.start - perm.end).abs() < 1e-15, "the add starts when the transfer ends");
    assert!(r2.latency_ms >= r2.compute_only_ms.max(r2.ici_only_ms) - 1e-12);
    assert!(r2.latency_ms <= r2.compute_only_ms + r2.ici_only_ms + 1e-12);
    assert!(r2.latency_ms > r2.compute_only_ms, "an exposed transfer shows");
}

#[test]
fn collectives_must_fit_the_slice() {
    let chip = v6e();
    let mut b = B::new();
    b.mesh = vec![json!(["x", 8])];
    let x = b.val(&[256, 128], "bf16", "shard");
    let y = ring(&mut b, x, &[256, 128], "bf16", 8);
    let d = b.build(&[x], &[y]);
    let e = simulate_program(&chip, &d, Some("2x2"), Path::new(".")).unwrap_err().to_string();
    assert!(e.contains("`slice` = 2x2") && e.contains("has 8"), "{e}");
    // A group naming device 9 on an 8-device slice.
    let mut b = B::new();
    b.mesh = vec![json!(["x", 8])];
    let x = b.val(&[256, 128], "bf16", "shard");
    let y = b.op("all_gather", &[x], &[512, 128], "bf16", json!({"all_gather_dim": 0, "replica_groups": [[0, 9]]}));
    let e = simulate_program(&chip, &b.build(&[x], &[y]), None, Path::new(".")).unwrap_err().to_string();
    assert!(e.contains("all_gather") && e.contains("device 9") && e.contains("t.py:1"), "{e}");
}

/// An all-gather over pairs of a 2x4 mesh's columns (devices i and i + 4, neighbours along
/// axis 0): one link each way per pair, B per link: B / link bandwidth + one hop. An all-reduce
/// of the same group takes twice the all-gather of B / 2.
#[test]
fn all_gather_and_all_reduce_on_neighbour_pairs() {
    let chip = v6e();
    let bytes = 1u64 << 20;
    let groups = json!([[0, 4], [1, 5], [2, 6], [3, 7]]);
    let mut b = B::new();
    b.mesh = vec![json!(["a", 2]), json!(["b", 4])];
    let x = b.val(&[bytes / 4], "f32", "shard");
    let g = b.op("all_gather", &[x], &[bytes / 2], "f32", json!({"all_gather_dim": 0, "replica_groups": groups}));
    let s = b.op("all_reduce", &[x], &[bytes / 4], "f32", json!({"replica_groups": groups, "computation": ["add"]}));
    let r = simulate_program(&chip, &b.build(&[x], &[g, s]), None, Path::new(".")).unwrap();
    let bw = chip.ici_link_bytes_per_s();
    let hop = chip.ici_hop_latency_s();
    let ag = &r.entries[0];
    let ar = &r.entries[1];
    assert!((ag.seconds - (bytes as f64 / bw + hop)).abs() < 1e-15, "{}", ag.seconds);
    assert!((ar.seconds - 2.0 * (bytes as f64 / 2.0 / bw + hop)).abs() < 1e-15, "{}", ar.seconds);
    assert_eq!(r.xla_flops, (bytes / 4) as f64, "the all-reduce's adds");
}

/// Reduce over the last axis of an [m, n] f32 value: an [m] f32 row vector.
fn row_sum(b: &mut B, v: usize, m: u64) -> usize {
    let init = b.val(&[], "f32", "constant");
    b.op("reduce", &[v, init], &[m], "f32", json!({"dimensions": [1], "computation": ["add"]}))
}

/// `s / n` on a row vector, as `jnp.mean` writes it (a broadcast scalar constant).
fn row_mean(b: &mut B, s: usize, m: u64) -> usize {
    let c = b.val(&[], "f32", "constant");
    let cb = b.op("broadcast_in_dim", &[c], &[m], "f32", json!({"broadcast_dimensions": []}));
    b.op("divide", &[s, cb], &[m], "f32", json!({}))
}

/// `rsqrt(v + eps)` on a row vector.
fn row_rsqrt_eps(b: &mut B, v: usize, m: u64) -> usize {
    let eps = b.val(&[], "f32", "constant");
    let eb = b.op("broadcast_in_dim", &[eps], &[m], "f32", json!({"broadcast_dimensions": []}));
    let ve = b.op("add", &[v, eb], &[m], "f32", json!({}));
    b.op("rsqrt", &[ve], &[m], "f32", json!({}))
}

/// A LayerNorm as `jnp` writes it (two-pass: mean, then the mean of (x - mean)^2) on a bf16
/// [m, n] input: two fusions (rules 6 to 8). The stats fusion reads x once (and the three scalar
/// constants its reduce inits and mean need) and writes the two [m] f32 row sums; the normalise
/// fusion recomputes x - mean and rsqrt(var + eps) from x and the row sums and writes y. Before
/// rules 6 to 8 this was four fusions, one of them writing x - mean in f32.
#[test]
fn a_layer_norm_is_a_stats_fusion_and_a_normalise_fusion() {
    let (m, n) = (512u64, 1024u64);
    let mut b = B::new();
    let x = b.val(&[m, n], "bf16", "argument");
    let xf = b.op("convert", &[x], &[m, n], "f32", json!({}));
    let s = row_sum(&mut b, xf, m);
    let mu = row_mean(&mut b, s, m);
    let mub = b.op("broadcast_in_dim", &[mu], &[m, n], "f32", json!({"broadcast_dimensions": [0]}));
    let xc = b.op("subtract", &[xf, mub], &[m, n], "f32", json!({}));
    let sq = b.op("multiply", &[xc, xc], &[m, n], "f32", json!({}));
    let s2 = row_sum(&mut b, sq, m);
    let var = row_mean(&mut b, s2, m);
    let rs = row_rsqrt_eps(&mut b, var, m);
    let rsb = b.op("broadcast_in_dim", &[rs], &[m, n], "f32", json!({"broadcast_dimensions": [0]}));
    let y = b.op("multiply", &[xc, rsb], &[m, n], "f32", json!({}));
    let yo = b.op("convert", &[y], &[m, n], "bf16", json!({}));
    let d = b.build(&[x], &[yo]);
    let g = group(&d).unwrap();
    assert_eq!(g.groups.iter().map(|g| g.kind).collect::<Vec<_>>(), vec![GroupKind::Fusion, GroupKind::Fusion]);
    let (stats, norm) = (&g.groups[0], &g.groups[1]);
    assert_eq!(norm.deps, vec![0]);
    // Stats: x (bf16) once, the two reduce inits and the first mean's divisor; two row sums out.
    assert_eq!((stats.read_bytes, stats.write_bytes), (m * n * 2 + 3 * 4, 2 * m * 4));
    // Normalise: x, both row sums, the two divisors and eps; y (bf16) out.
    assert_eq!((norm.read_bytes, norm.write_bytes), (m * n * 2 + 2 * m * 4 + 3 * 4, m * n * 2));
    let r = simulate_program(&v6e(), &d, None, Path::new(".")).unwrap();
    assert_eq!(r.fusions, 2);
    assert_eq!(r.xla_bytes_fused, 3 * m * n * 2 + 4 * m * 4 + 6 * 4);
}

/// An RMSNorm with a weight, `(x * rsqrt(mean(x * x) + eps) * g)` on a bf16 [m, n] input with an
/// f32 [n] weight: a stats fusion (x in, one row sum out) and a normalise fusion that recomputes
/// rsqrt(mean + eps) from the row sum (x, the row sum, the weight in; y out).
#[test]
fn an_rms_norm_is_a_stats_fusion_and_a_normalise_fusion() {
    let (m, n) = (384u64, 2048u64);
    let mut b = B::new();
    let x = b.val(&[m, n], "bf16", "argument");
    let w = b.val(&[n], "f32", "argument");
    let xf = b.op("convert", &[x], &[m, n], "f32", json!({}));
    let sq = b.op("multiply", &[xf, xf], &[m, n], "f32", json!({}));
    let s = row_sum(&mut b, sq, m);
    let ms = row_mean(&mut b, s, m);
    let rs = row_rsqrt_eps(&mut b, ms, m);
    let rsb = b.op("broadcast_in_dim", &[rs], &[m, n], "f32", json!({"broadcast_dimensions": [0]}));
    let y = b.op("multiply", &[xf, rsb], &[m, n], "f32", json!({}));
    let wb = b.op("broadcast_in_dim", &[w], &[m, n], "f32", json!({"broadcast_dimensions": [1]}));
    let yw = b.op("multiply", &[y, wb], &[m, n], "f32", json!({}));
    let yo = b.op("convert", &[yw], &[m, n], "bf16", json!({}));
    let d = b.build(&[x, w], &[yo]);
    let g = group(&d).unwrap();
    assert_eq!(g.groups.iter().map(|g| g.kind).collect::<Vec<_>>(), vec![GroupKind::Fusion, GroupKind::Fusion]);
    assert_eq!((g.groups[0].read_bytes, g.groups[0].write_bytes), (m * n * 2 + 4, m * 4));
    assert_eq!((g.groups[1].read_bytes, g.groups[1].write_bytes), (m * n * 2 + m * 4 + 2 * 4 + n * 4, m * n * 2));
    let r = simulate_program(&v6e(), &d, None, Path::new(".")).unwrap();
    assert_eq!(r.fusions, 2);
    assert_eq!(r.xla_bytes_fused, 3 * m * n * 2 + 2 * m * 4 + 3 * 4 + n * 4);
}

/// Two reductions of the same input that do not read each other (sibling multi-output fusion,
/// rule 8) merge and read it once; a reduction of another input of the same shape does not.
#[test]
fn sibling_reductions_of_one_input_read_it_once() {
    let (m, n) = (256u64, 512u64);
    let mut b = B::new();
    let x = b.val(&[m, n], "f32", "argument");
    let z = b.val(&[m, n], "f32", "argument");
    let s = row_sum(&mut b, x, m);
    let sq = b.op("multiply", &[x, x], &[m, n], "f32", json!({}));
    let s2 = row_sum(&mut b, sq, m);
    let sz = row_sum(&mut b, z, m);
    let d = b.build(&[x, z], &[s, s2, sz]);
    let g = group(&d).unwrap();
    assert_eq!(g.groups.len(), 2);
    assert_eq!((g.groups[0].ops.clone(), g.groups[0].read_bytes, g.groups[0].write_bytes), (vec![0, 1, 2], m * n * 4 + 2 * 4, 2 * m * 4));
    assert_eq!((g.groups[1].read_bytes, g.groups[1].write_bytes), (m * n * 4 + 4, m * 4));
}
