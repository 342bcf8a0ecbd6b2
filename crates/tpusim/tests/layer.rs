//! End-to-end tests of `tpusim layer` and the layer figures through the built binary: the
//! report's invariants, the timeline, what-ifs and bad input.

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tpusim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tpusim")).args(args).current_dir(root()).output().expect("tpusim runs")
}

fn layer_json(args: &[&str]) -> Value {
    let mut a = vec!["layer", "--format", "json"];
    a.extend_from_slice(args);
    let out = tpusim(&a);
    assert!(out.status.success(), "tpusim {a:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn fails(args: &[&str]) -> String {
    let out = tpusim(args);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "tpusim {args:?} should exit 2: {err}");
    assert!(out.stdout.is_empty());
    err
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tpusim-layer-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn default_layer_report_adds_up() {
    let j = layer_json(&[]);
    assert_eq!(j["tokens"], 75_600);
    assert_eq!(j["slice"]["shape"], "2x4");
    assert_eq!(j["slice"]["kind"], "mesh");
    assert_eq!((j["cfg"].as_str(), j["ulysses"].as_u64()), (Some("groups"), Some(4)));
    let lat = j["latency_ms"].as_f64().unwrap();
    let sum: f64 = j["breakdown_ms"].as_object().unwrap().values().map(|v| v.as_f64().unwrap()).sum();
    assert!((sum / lat - 1.0).abs() < 1e-9, "{sum} vs {lat}");
    let share = j["attention_share"].as_f64().unwrap();
    assert!((share - j["breakdown_ms"]["attention"].as_f64().unwrap() / lat).abs() < 1e-12);
    let ops = j["ops"].as_array().unwrap();
    assert_eq!(ops.iter().filter(|o| o["resource"] == "ici").count(), 4);
    // Every op ends by the layer's end.
    for o in ops {
        assert!(o["start_ms"].as_f64().unwrap() + o["ms"].as_f64().unwrap() <= lat + 1e-9);
    }
}

#[test]
fn end_to_end_reports_the_speedup_curve_and_target_fractions() {
    let j =
        layer_json(&["--attention", "sparse", "--steps", "40", "--dense-steps", "10", "--dense-layers", "1", "--target-speedup", "1.2"]);
    let e = &j["end_to_end"];
    assert_eq!(e["dense_pairs"], 10 * 40 + 30);
    let (d, s) = (e["dense_layer_ms"].as_f64().unwrap(), e["sparse_layer_ms"].as_f64().unwrap());
    let secs = e["seconds"].as_f64().unwrap();
    assert!((secs - (430.0 * d + 1170.0 * s) / 1e3).abs() < 1e-9 * secs);
    let f = e["targets"][0]["dense_fraction"].as_f64().unwrap();
    let at = d / (f * d + (1.0 - f) * s);
    assert!((at - 1.2).abs() < 1e-9, "{at}");
    assert_eq!(e["curve"].as_array().unwrap().len(), 21);
}

#[test]
fn timeline_has_unit_tracks_and_an_ici_track() {
    let d = tmpdir("timeline");
    let t = d.join("layer.json");
    let out = tpusim(&["layer", "--attention", "sparse", "--timeline", t.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&t).unwrap()).unwrap();
    let ev = v["traceEvents"].as_array().unwrap();
    let names: Vec<&str> = ev.iter().filter(|e| e["name"] == "thread_name").map(|e| e["args"]["name"].as_str().unwrap()).collect();
    for want in ["TensorCore ops", "MXU", "VPU", "HBM", "ICI"] {
        assert!(names.contains(&want), "{names:?}");
    }
    let ici: Vec<&Value> = ev.iter().filter(|e| e["ph"] == "X" && e["cat"] == "ici").collect();
    assert_eq!(ici.len(), 4, "four all-to-alls");
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn what_ifs_move_the_right_way() {
    let lat = |a: &[&str]| layer_json(a)["latency_ms"].as_f64().unwrap();
    // More chips, less time per layer.
    assert!(lat(&["--slice", "16"]) < lat(&["--slice", "8"]));
    // Faster ICI, less all-to-all time.
    let a2a = |a: &[&str]| layer_json(a)["breakdown_ms"]["all_to_all"].as_f64().unwrap();
    assert!(a2a(&["--set", "ici.link_bandwidth_gb_per_s=200"]) < 0.6 * a2a(&[]));
    // Sparse beats dense; the head-local permutation beats the one before the all-to-all.
    assert!(lat(&["--attention", "sparse"]) < lat(&[]));
    assert!(lat(&["--attention", "sparse", "--permutation", "after"]) < lat(&["--attention", "sparse", "--permutation", "before"]));
}

#[test]
fn layer_figures_render() {
    let d = tmpdir("figures");
    let b = d.join("b.png");
    let out = tpusim(&[
        "plot",
        "breakdown",
        "--layer",
        "--share",
        "--resolutions",
        "720p,1080p",
        "--attentions",
        "dense,sparse",
        "--out",
        b.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let png = std::fs::read(&b).unwrap();
    assert_eq!(&png[1..4], b"PNG");
    let s = d.join("s.svg");
    let out = tpusim(&["plot", "breakdown", "--layer", "--slices", "1,4,8", "--out", s.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(std::fs::read_to_string(&s).unwrap().contains(">\n1 chip\n<"));
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn bad_layer_input_exits_2_naming_the_flag() {
    let e = fails(&["layer", "--slice", "3", "--cfg", "batch"]);
    assert!(e.contains("--slice") && e.contains("40 heads"), "{e}");
    let e = fails(&["layer", "--permutation", "before"]);
    assert!(e.contains("--permutation") && e.contains("--attention sparse"), "{e}");
    let e = fails(&["layer", "--resolution", "8k"]);
    assert!(e.contains("--resolution") && e.contains("720p"), "{e}");
    let e = fails(&["layer", "--model", "/nonexistent/block.toml"]);
    assert!(e.contains("/nonexistent/block.toml"), "{e}");
    let e = fails(&["layer", "--set", "ici.hop_latency_us=-1"]);
    assert!(e.contains("ici.hop_latency_us"), "{e}");
    let e = fails(&["layer", "--attention", "sparse", "--sparse-kernel", "traces/video-720p-dense.toml"]);
    assert!(e.contains("--sparse-kernel") && e.contains("not a kernel option"), "{e}");
    let e = fails(&["layer", "--timeline", "/nonexistent/dir/t.json"]);
    assert!(e.contains("--timeline"), "{e}");
    let e = fails(&["plot", "breakdown", "--resolution", "720p", "--out", "/tmp/x.png"]);
    assert!(e.contains("--layer"), "{e}");
    let e = fails(&["plot", "speedup", "--resolutions", "720p", "--mark", "4k=1.5", "--out", "/tmp/x.png"]);
    assert!(e.contains("--mark") && e.contains("720p"), "{e}");
}

/// The layer's sparse attention says whether its kernel runs the mask aligned to its tiles (the
/// built-in default, the case study's tile-aligned kernel) or exact (a sparse_kernel trace
/// without tile_align): the report named the exact mask for both, 31.7 ms against 54.5 ms.
#[test]
fn sparse_attention_names_a_tile_aligned_mask() {
    let aligned = layer_json(&["--attention", "sparse"]);
    assert_eq!(aligned["sparse_tile_align"], true, "{aligned}");
    let text = String::from_utf8(tpusim(&["layer", "--attention", "sparse"]).stdout).unwrap();
    assert!(text.contains("aligned to the kernel's tiles"), "{text}");
    let d = tmpdir("exact-sparse");
    let trace = d.join("exact.toml");
    std::fs::write(&trace, "kernel = \"sparse-splash\"\nblock_q = 3328\nblock_kv = 1536\ntraversal = \"compact\"\nmasking = \"partial\"\n").unwrap();
    let exact = layer_json(&["--attention", "sparse", "--sparse-kernel", trace.to_str().unwrap()]);
    assert_eq!(exact["sparse_tile_align"], false, "{exact}");
    assert!(exact["latency_ms"].as_f64().unwrap() > aligned["latency_ms"].as_f64().unwrap(), "the exact mask computes more");
}

/// The layer's bound-by line names its largest 2x gain; below the gain `tpusim run` calls
/// decisive (10%) it says that no unit dominates (it read as if a 6.5% gain bounded the layer
/// as a run's 10% does).
#[test]
fn a_layer_without_a_decisive_unit_says_its_time_is_spread() {
    let j = layer_json(&["--attention", "sparse"]);
    let top = j["what_if_2x"].as_array().unwrap().iter().map(|w| w["gain"].as_f64().unwrap()).fold(0.0, f64::max);
    let text = String::from_utf8(tpusim(&["layer", "--attention", "sparse"]).stdout).unwrap();
    let line = text.lines().find(|l| l.trim_start().starts_with("bound by")).unwrap();
    assert_eq!(top < 0.10, line.contains("no unit twice as fast saves 10%"), "{top}: {line}");
}
