//! The layer model's checks: FLOPs against the analytic count, one chip as the sum of its ops,
//! the breakdown adding up, collectives following the link bandwidth, and the directions of the
//! what-ifs (resolution, permutation placement, sparse attention).

use tpusim_chip::ChipModel;
use tpusim_layer::graph::{Category, Work};
use tpusim_layer::{run, simulate_layer, AttentionMode, Cfg, LayerSpec, Placement};

fn v6e() -> ChipModel {
    ChipModel::preset("v6e").unwrap()
}

fn spec(resolution: &str, slice: &str, attention: AttentionMode) -> LayerSpec {
    LayerSpec { resolution: Some(resolution.into()), slice: Some(slice.into()), attention: Some(attention), ..Default::default() }
}

/// Wan 2.1 14B's block FLOPs for `seqs` sequences of `l` tokens, written out from the model's
/// dimensions (2 m n k per matmul; 4 d per attention pair for QK^T and PV).
fn wan_block_flops(seqs: f64, l: f64) -> f64 {
    let (d, w, f, h, hd, text) = (5120.0, 5120.0, 13824.0, 40.0, 128.0, 512.0);
    let t = seqs * l;
    let self_proj = 4.0 * 2.0 * t * d * w;
    let cross_proj = 2.0 * 2.0 * t * d * w + 2.0 * 2.0 * seqs * text * d * w;
    let ffn = 2.0 * 2.0 * t * d * f;
    let self_attn = 4.0 * hd * seqs * h * l * l;
    let cross_attn = 4.0 * hd * seqs * h * l * text;
    self_proj + cross_proj + ffn + self_attn + cross_attn
}

#[test]
fn layer_flops_equal_the_analytic_count() {
    let chip = v6e();
    // One chip, guidance as a batch of 2: the whole block.
    let r = simulate_layer(&spec("720p", "1", AttentionMode::Dense).build(&chip).unwrap()).unwrap();
    let want = wan_block_flops(2.0, 75_600.0);
    assert!((r.flops() / want - 1.0).abs() < 1e-12, "{} vs {want}", r.flops());
    assert!(r.executed_flops() >= r.flops());
    // Eight chips in two groups: each chip does an eighth of it (75,600 divides by 4), except
    // that every chip projects its sequence's 512 text tokens to k and v itself (6 redundant
    // copies of the two text projections over the slice).
    let r8 = simulate_layer(&spec("720p", "8", AttentionMode::Dense).build(&chip).unwrap()).unwrap();
    let text_kv = 2.0 * 2.0 * 512.0 * 5120.0 * 5120.0;
    let want8 = want + 6.0 * text_kv;
    assert!((8.0 * r8.flops() / want8 - 1.0).abs() < 1e-12, "{} vs {want8}", 8.0 * r8.flops());
    // Matmul FLOPs alone, from the graph's shapes.
    let mm = r.graph.matmul_flops();
    let attn = 4.0 * 128.0 * 2.0 * 40.0 * 75_600.0 * (75_600.0 + 512.0);
    assert!((mm + attn - want).abs() / want < 1e-12);
}

#[test]
fn one_chip_with_no_exchange_is_the_sum_of_its_ops() {
    let chip = v6e();
    let r = simulate_layer(&spec("720p", "1", AttentionMode::Sparse).build(&chip).unwrap()).unwrap();
    assert!(r.graph.ops().all(|(_, o)| !o.work.on_ici()), "one chip has no collectives");
    let sum: f64 = r.costs.iter().map(|c| c.seconds).sum();
    assert!((r.seconds / sum - 1.0).abs() < 1e-12, "{} vs {sum}", r.seconds);
    assert!((r.breakdown.total() / r.seconds - 1.0).abs() < 1e-12);
    assert_eq!(r.ici_busy, 0.0);
}

#[test]
fn breakdown_adds_up_to_the_latency_on_a_slice() {
    let chip = v6e();
    for (attention, placement) in
        [(AttentionMode::Dense, None), (AttentionMode::Sparse, Some(Placement::After)), (AttentionMode::Sparse, Some(Placement::Before))]
    {
        for overlap in [true, false] {
            let s = LayerSpec { permutation: placement, overlap: Some(overlap), ..spec("720p", "8", attention) };
            let r = simulate_layer(&s.build(&chip).unwrap()).unwrap();
            assert!((r.breakdown.total() / r.seconds - 1.0).abs() < 1e-9, "{attention} {placement:?} {overlap}");
            assert!(r.ici_exposed <= r.ici_busy + 1e-12);
            if !overlap {
                // Serialised: the latency is the sum of every op, collectives included.
                let sum: f64 = r.costs.iter().map(|c| c.seconds + c.issue_seconds).sum();
                assert!((r.seconds / sum - 1.0).abs() < 1e-12);
            }
        }
    }
}

#[test]
fn graph_is_acyclic_in_program_order() {
    let chip = v6e();
    let s = LayerSpec {
        permutation: Some(Placement::Before),
        weights: Some(tpusim_layer::Weights::Gathered),
        ..spec("720p", "8", AttentionMode::Sparse)
    };
    let plan = s.build(&chip).unwrap();
    let g = tpusim_layer::graph::build(&plan);
    assert!(petgraph::algo::toposort(&g.graph, None).is_ok());
    for e in g.graph.edge_indices() {
        let (a, b) = g.graph.edge_endpoints(e).unwrap();
        assert!(a < b, "edges go forward in program order");
    }
    // Every op a category; four Ulysses all-to-alls; one self-attention.
    let count = |c: Category| g.ops().filter(|(_, o)| o.category == c).count();
    assert_eq!(g.ops().filter(|(_, o)| o.name.starts_with("all-to-all")).count(), 4);
    assert_eq!(count(Category::WeightGather), 10);
    assert!(g.ops().any(|(_, o)| o.name == "self-attention" && matches!(o.work, Work::Attention { .. })));
}

#[test]
fn doubling_ici_bandwidth_halves_the_all_to_alls() {
    let chip = v6e();
    let fast = chip.with_override("ici.link_bandwidth_gb_per_s", "200").unwrap();
    let s = spec("720p", "8", AttentionMode::Dense);
    let (a, b) = (simulate_layer(&s.build(&chip).unwrap()).unwrap(), simulate_layer(&s.build(&fast).unwrap()).unwrap());
    let hop = chip.ici_hop_latency_s();
    let mut n = 0;
    for ((i, op), (cb, ca)) in a.graph.ops().zip(b.costs.iter().zip(&a.costs)) {
        if let Some(t) = ca.collective {
            let lat = t.max_hops as f64 * hop;
            assert!(((cb.seconds - lat) / (ca.seconds - lat) - 0.5).abs() < 1e-9, "{}", op.name);
            n += 1;
        }
        let _ = i;
    }
    assert_eq!(n, 4);
    assert!(b.seconds < a.seconds);
}

#[test]
fn attention_share_rises_with_resolution() {
    let chip = v6e();
    let mut shares = Vec::new();
    for res in ["720p", "1080p", "1440p"] {
        let r = simulate_layer(&spec(res, "8", AttentionMode::Dense).build(&chip).unwrap()).unwrap();
        shares.push(r.attention_share());
    }
    assert!(shares[0] < shares[1] && shares[1] < shares[2], "{shares:?}");
}

#[test]
fn permutation_after_the_all_to_all_beats_before() {
    let chip = v6e();
    let t = |p: Placement| {
        let r =
            simulate_layer(&LayerSpec { permutation: Some(p), ..spec("720p", "8", AttentionMode::Sparse) }.build(&chip).unwrap()).unwrap();
        (r.seconds, r.breakdown.permutation)
    };
    let (after, before) = (t(Placement::After), t(Placement::Before));
    assert!(after.0 < before.0 && after.1 < before.1, "after {after:?} before {before:?}");
    // On one chip there is nothing to exchange: the placements cost the same.
    let one = |p: Placement| {
        simulate_layer(
            &LayerSpec { permutation: Some(p), cfg: Some(Cfg::Batch), ..spec("720p", "1", AttentionMode::Sparse) }.build(&chip).unwrap(),
        )
        .unwrap()
        .seconds
    };
    assert!((one(Placement::After) / one(Placement::Before) - 1.0).abs() < 1e-9);
}

#[test]
fn sparse_speedup_curves_are_ordered_by_resolution() {
    let chip = v6e();
    let mut curves = Vec::new();
    for res in ["720p", "1440p"] {
        let s = LayerSpec { steps: Some(40), ..spec(res, "8", AttentionMode::Sparse) };
        let e = run(&s, &chip).unwrap().end_to_end.unwrap();
        assert!(e.max_speedup > 1.0);
        assert!((e.curve.last().unwrap().speedup - 1.0).abs() < 1e-12);
        curves.push(e.curve);
    }
    for (a, b) in curves[0].iter().zip(&curves[1]).take(20) {
        assert!(b.speedup > a.speedup, "at {}: {} vs {}", a.dense_fraction, a.speedup, b.speedup);
    }
}

#[test]
fn what_if_gains_are_independent_runs_and_never_negative() {
    let chip = v6e();
    for attention in [AttentionMode::Dense, AttentionMode::Sparse] {
        let s = spec("720p", "2x4", attention);
        let base = run(&s, &chip).unwrap();
        let (table, best) = tpusim_layer::what_if_2x(&s, &chip, &base).unwrap();
        assert_eq!(table.len(), 7, "six units and the ICI links");
        for w in &table {
            let mut fast = chip.clone();
            for kv in &w.set {
                let (k, v) = kv.split_once('=').unwrap();
                fast = fast.with_override(k, v).unwrap();
            }
            let t = run(&s, &fast).unwrap().result.seconds * 1e3;
            assert_eq!(t, w.latency_ms, "{attention:?} {}", w.unit);
            assert!(w.gain >= -1e-12, "{attention:?}: 2x {} makes the layer slower ({})", w.unit, w.gain);
        }
        let top = table.iter().map(|w| w.gain).fold(f64::NEG_INFINITY, f64::max);
        assert_eq!(table.iter().find(|w| w.unit == best).unwrap().gain, top);
        // Faster ICI links buy something on a slice whose all-to-alls the TensorCore waits for.
        assert!(base.result.ici_exposed <= 0.0 || table.iter().find(|w| w.unit == "ici").unwrap().gain > 0.0);
    }
}

/// The fusion rule of the whole-program path (graph module docs), written out for Wan's block:
/// every norm is a statistics fusion (read its input, write f32 rows) and a normalising one that
/// reads both; on one chip the v and o tensors change layout in transposes of their own and
/// the all-to-alls do it on a slice; text v and cross o always; the ungated residual add rides
/// on the cross o projection; the first gated residual is computed inside norm3's two fusions
/// (read x, o and the gate; never written) unless there is no norm3.
#[test]
fn norms_are_two_passes_and_layout_changes_are_transposes() {
    let chip = v6e();
    for (slice, transposes) in [("1", vec!["v transpose", "o transpose", "text v transpose", "cross o transpose"]), ("8", vec!["text v transpose", "cross o transpose"])] {
        let plan = spec("720p", slice, AttentionMode::Dense).build(&chip).unwrap();
        let g = tpusim_layer::graph::build(&plan);
        let names: Vec<&str> = g.ops().map(|(_, o)| o.name.as_str()).collect();
        let found: Vec<&str> = names.iter().copied().filter(|n| n.ends_with("transpose")).collect();
        assert_eq!(found, transposes, "slice {slice}");
        let (t, a) = (plan.tokens_per_chip(), plan.model.activation_bytes);
        let (d, w) = (plan.model.hidden, plan.model.qkv_width());
        // norm1, q, k, norm3, cross q, text k, norm2: seven statistics passes.
        let stats: Vec<_> = g.ops().filter(|(_, o)| o.name.ends_with("statistics")).collect();
        assert_eq!(stats.len(), 7, "slice {slice}: {names:?}");
        for (i, o) in &stats {
            let Work::Fusion { read_bytes, write_bytes } = o.work else { panic!("{} is not a fusion", o.name) };
            let layer_norm = o.name.starts_with("norm") || o.name.starts_with("residual + norm3");
            let rows = if layer_norm { 2 } else { 1 };
            let tokens = if o.name.starts_with("text") { plan.local_batch * plan.model.text_tokens } else { t };
            let width = if layer_norm { d } else { w };
            // norm3's statistics read x and o and the gate (f32 per sequence) for x1 = x + gate x o.
            let input = if o.name.starts_with("residual") { 2 * tokens * width * a + plan.local_batch * d * 4 } else { tokens * width * a };
            assert_eq!((read_bytes, write_bytes), (input, rows * tokens * 4), "{}", o.name);
            // Its one reader is the normalising fusion, which also reads the input.
            let readers: Vec<_> = g.graph.neighbors_directed(*i, petgraph::Direction::Outgoing).collect();
            assert_eq!(readers.len(), 1, "{}", o.name);
            let Work::Fusion { read_bytes: r2, .. } = g.graph[readers[0]].work else { panic!() };
            assert!(r2 >= input + rows * tokens * 4, "{} reader reads {r2}", o.name);
        }
        assert!(!names.contains(&"residual add"), "slice {slice}: the residual add is fused");
        // Only the last gated residual is a fusion of its own: the first lives in norm3's.
        assert_eq!(names.iter().filter(|n| **n == "gate + residual").count(), 1, "slice {slice}: {names:?}");
        // Without the cross-attention norm (Wan's `nn.Identity`) norm3 and its statistics go.
        let mut plain = plan.clone();
        plain.model.cross_attn_norm = false;
        let gp = tpusim_layer::graph::build(&plain);
        // ... and the first gated residual is a fusion of its own that writes x1.
        assert!(gp.ops().all(|(_, o)| !o.name.contains("norm3")), "slice {slice}");
        assert_eq!(gp.ops().filter(|(_, o)| o.name == "attention gate + residual").count(), 1, "slice {slice}");
        assert_eq!(gp.ops().filter(|(_, o)| o.name == "gate + residual").count(), 1, "slice {slice}");
        assert_eq!(gp.ops().count(), g.ops().count() - 1);
        let co = g.ops().find(|(_, o)| o.name == "cross o proj (+ residual)").expect("the cross o projection carries the residual");
        assert_eq!(g.deps(co.0).len(), 3, "it reads the cross-attention output, o and the gate (x1 unwritten)");
        let co = gp.ops().find(|(_, o)| o.name == "cross o proj (+ residual)").unwrap();
        assert_eq!(gp.deps(co.0).len(), 2, "it reads the cross-attention output and x1");
    }
}

#[test]
fn a_dense_kernel_that_names_only_its_family_runs_cross_attention_at_its_defaults_cut_to_the_text() {
    // splash-dense's own blocks (4864 / 1024 / 1024) cut to the 512 text keys in cross-attention.
    let dir = std::env::temp_dir().join(format!("tpusim-layer-family-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("dense.toml");
    std::fs::write(&trace, "kernel = \"splash-dense\"\n").unwrap();
    let s = LayerSpec { dense_kernel: Some(trace.to_string_lossy().into_owned()), ..spec("720p", "8", AttentionMode::Dense) };
    let r = simulate_layer(&s.build(&v6e()).unwrap());
    std::fs::remove_dir_all(&dir).ok();
    let r = r.unwrap();
    assert!(r.seconds > 0.0 && r.breakdown.total() > 0.0);
}

/// The slice crate's one schedule: a collective issues as soon as the op it reads ends (the v
/// all-to-all right after the v projection, before the q and k norms that the q and k
/// all-to-alls wait for), costing the TensorCore one DMA issue per message.
#[test]
fn collectives_issue_right_after_their_input() {
    let chip = v6e();
    let r = simulate_layer(&spec("720p", "8", AttentionMode::Dense).build(&chip).unwrap()).unwrap();
    let at = |name: &str| r.graph.ops().position(|(_, o)| o.name == name).unwrap_or_else(|| panic!("no op {name}"));
    let (v_proj, a2a_v, a2a_q) = (at("v proj"), at("all-to-all v"), at("all-to-all q"));
    let issue = r.costs[a2a_v].issue_seconds;
    assert_eq!(issue, 3.0 * chip.fitted.dma_issue_ns.value * 1e-9, "three messages to the other devices of a group of 4");
    assert!((r.schedule[a2a_v].start - (r.schedule[v_proj].end + issue)).abs() < 1e-12, "{:?} {:?}", r.schedule[v_proj], r.schedule[a2a_v]);
    assert!(r.schedule[a2a_v].start < r.schedule[a2a_q].start, "v leaves first: its input is ready first");
}
