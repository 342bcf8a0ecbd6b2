//! `tpusim run`, `plot`, `sweep` and `tune` with kernels read from their Mosaic IR
//! (`--kernel-ir FILE`), on a hand-written description fixture (`tests/data/kernel-ir/`: a
//! tiled bf16 matmul, 1024 x 1024 x 1024 in 256 x 256 x 512 blocks, f32 output accumulated over
//! the k dimension), and their bad input.

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tpusim"))
}

fn fixture() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/kernel-ir/matmul.json").to_string_lossy().into_owned()
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tpusim-kernel-ir-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn tpusim(args: &[&str]) -> Output {
    bin().args(args).output().unwrap()
}

fn ok(args: &[&str]) -> String {
    let out = tpusim(args);
    assert!(out.status.success(), "tpusim {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `tpusim ARGS`, expecting exit code 2 and an error containing every `needle`.
fn input_error(args: &[&str], needles: &[&str]) -> String {
    let out = tpusim(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "tpusim {args:?} should exit 2; stderr: {err}");
    for n in needles {
        assert!(err.contains(n), "tpusim {args:?}: error should mention {n:?}: {err}");
    }
    err
}

fn run_json(extra: &[&str]) -> Value {
    let f = fixture();
    let mut a = vec!["run", "--kernel-ir", f.as_str(), "--format", "json"];
    a.extend(extra);
    serde_json::from_str(&ok(&a)).unwrap()
}

#[test]
fn bound_by_is_the_what_if_table_and_each_row_is_the_run_with_its_overrides() {
    let j = run_json(&[]);
    let table = j["what_if_2x"].as_array().expect("a what-if table");
    // The six units, then the three step and DMA mechanisms.
    assert_eq!(table.len(), 9, "{table:?}");
    let gain = |u: &str| table.iter().find(|w| w["unit"] == u).unwrap()["gain"].as_f64().unwrap();
    // The bottleneck is the unit with the largest gain.
    let best = table.iter().max_by(|a, b| a["gain"].as_f64().unwrap().total_cmp(&b["gain"].as_f64().unwrap())).unwrap();
    assert_eq!(j["bottleneck"], best["unit"]);
    assert!(j["co_bound"].is_array());
    // Each row is `tpusim run --kernel-ir F --set ...` of its overrides.
    for u in ["hbm", "mxu"] {
        let row = table.iter().find(|w| w["unit"] == u).unwrap();
        let mut extra = Vec::new();
        for s in row["set"].as_array().unwrap() {
            extra.extend(["--set", s.as_str().unwrap()]);
        }
        let again = run_json(&extra);
        let (a, b) = (again["latency_ms"].as_f64().unwrap(), row["latency_ms"].as_f64().unwrap());
        assert!((a - b).abs() <= 1e-9 * b, "{u}: {a} vs {b}");
        assert!((gain(u) - (1.0 - b / j["latency_ms"].as_f64().unwrap())).abs() < 1e-12);
    }
    // The band line is v6e's band of kernels read from their IR (the calibration rows with a
    // `kernel_ir`), in the hand-model report's words; a host-timed call's band is the call's.
    assert_eq!(j["band"]["covered"], true, "{}", j["band"]);
    assert!(j["band"]["text"].as_str().unwrap().starts_with("v6e kernel-ir any kernel: median "), "{}", j["band"]);
    let call = run_json(&["--scope", "call"]);
    assert!(call["band"]["text"].as_str().unwrap().starts_with("v6e kernel-ir any call: median "), "{}", call["band"]);
    let f = fixture();
    let table = ok(&["run", "--kernel-ir", &f]);
    assert!(table.contains("  band         v6e kernel-ir any kernel: median"), "{table}");
    assert!(
        table.contains(&format!("  bound by     {}", j["bottleneck"].as_str().unwrap())) && table.contains("  what if 2x   mxu -"),
        "{table}"
    );
}

/// A host-timed call of a kernel read from its IR (`--scope call`) spends part of its time in
/// the host's dispatch, and its what-if table has the host's row (halving the dispatch saves
/// half of it), as a hand-modelled call's has; the kernel alone has none.
#[test]
fn a_host_timed_ir_call_has_a_host_row_in_its_what_if_table() {
    let call = run_json(&["--scope", "call"]);
    let (latency, host_ms) = (call["latency_ms"].as_f64().unwrap(), call["host_ms"].as_f64().unwrap());
    assert!(host_ms > 0.0 && host_ms < latency, "{host_ms} of {latency} ms");
    let table = call["what_if_2x"].as_array().unwrap();
    let host = table.iter().find(|w| w["unit"] == "host").unwrap_or_else(|| panic!("no host row: {table:?}"));
    assert!(host["set"][0].as_str().unwrap().starts_with("host.dispatch_us="), "{host}");
    let gain = host["gain"].as_f64().unwrap();
    assert!((gain - 0.5 * host_ms / latency).abs() < 1e-9, "gain {gain}, host {host_ms} of {latency} ms");
    let kernel = run_json(&[]);
    assert!(kernel["what_if_2x"].as_array().unwrap().iter().all(|w| w["unit"] != "host"), "{}", kernel["what_if_2x"]);
    let f = fixture();
    let text = ok(&["run", "--kernel-ir", &f, "--scope", "call"]);
    assert!(text.lines().any(|l| l.starts_with("  what if 2x") && l.contains(", host -")), "{text}");
}

#[test]
fn timeline_of_an_ir_kernel_adds_up_to_its_report() {
    let d = scratch("timeline");
    let t = d.join("t.json");
    let f = fixture();
    let out = ok(&["run", "--kernel-ir", &f, "--timeline", t.to_str().unwrap()]);
    assert!(out.contains("timeline     ") && out.contains("32 of 32 grid steps"), "{out}");
    let rep = run_json(&[]);
    let trace: Value = serde_json::from_slice(&std::fs::read(&t).unwrap()).unwrap();
    let events: Vec<&Value> = trace["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "X").collect();
    assert!(!events.is_empty());
    // Per unit, the events' durations add up to the report's busy time.
    for (cat, unit) in [("mxu", "mxu"), ("vpu", "vpu"), ("step_control", "step_control")] {
        let us: f64 = events.iter().filter(|e| e["cat"] == cat).map(|e| e["dur"].as_f64().unwrap()).sum();
        let ms = rep["busy_ms"][unit].as_f64().unwrap();
        assert!((us / 1e3 - ms).abs() <= 1e-6 * ms.max(1e-9), "{cat}: {us} us vs {ms} ms");
    }
    let dma: f64 = events.iter().filter(|e| e["cat"] == "dma_in" || e["cat"] == "dma_out").map(|e| e["dur"].as_f64().unwrap()).sum();
    assert!((dma / 1e3 - rep["busy_ms"]["hbm"].as_f64().unwrap()).abs() < 1e-6);
    // Steps carry their grid indices, not attention blocks.
    let a = &events[0]["args"];
    assert!(a.get("index_first").is_some() && a.get("computed").is_some() && a.get("q_block").is_none(), "{a}");
    // A window: steps 8..16 of grid index 1 of dimension 0 (4 x 2 steps each: steps 8..15).
    let w = d.join("w.json");
    let out = ok(&["run", "--kernel-ir", &f, "--timeline", w.to_str().unwrap(), "--timeline-steps", "0:12", "--timeline-head", "1"]);
    assert!(out.contains("4 of 32 grid steps (steps 8 to 11)"), "{out}");
    let trace: Value = serde_json::from_slice(&std::fs::read(&w).unwrap()).unwrap();
    assert!(trace["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "X").all(|e| e["args"]["index_first"] == 1));
    // plot timeline --input draws the written trace, with the steps' grid indices as labels.
    let png = d.join("from-trace.png");
    let text = ok(&["plot", "timeline", "--input", t.to_str().unwrap(), "--steps", "0:4", "--out", png.to_str().unwrap()]);
    assert!(text.contains("grid steps 0 to 3") && std::fs::metadata(&png).unwrap().len() > 10_000, "{text}");
    // An empty window is refused in the IR's words; the report is printed first.
    let out = tpusim(&["run", "--kernel-ir", &f, "--timeline", d.join("e.json").to_str().unwrap(), "--timeline-head", "9"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("window (--timeline-head 9) holds no grid step") && err.contains("4 indices of grid dimension 0"), "{err}");
    assert!(!d.join("e.json").exists());
    // A file tpusim did not write is not replaced.
    let foreign = d.join("mine.json");
    std::fs::write(&foreign, "{}").unwrap();
    input_error(&["run", "--kernel-ir", &f, "--timeline", foreign.to_str().unwrap()], &["--timeline", "--force"]);
    assert_eq!(std::fs::read_to_string(&foreign).unwrap(), "{}");
}

fn base_of(f: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap()
}

/// A named edit of the fixture and what the refusal must say.
type Edit = (&'static str, fn(&mut Value), &'static [&'static str]);

#[test]
fn bad_kernel_ir_input_is_refused_by_name() {
    let f = fixture();
    input_error(&["run", "--kernel-ir", "/nonexistent/k.json"], &["--kernel-ir", "/nonexistent/k.json"]);
    input_error(&["run", "--kernel-ir", &f, "--block-q", "256"], &["--block-q", "not with --kernel-ir"]);
    // A description holds no XLA op around its kernel: scope op is refused, call adds the host.
    input_error(&["run", "--kernel-ir", &f, "--scope", "op"], &["--scope = op", "needs the XLA ops", "use kernel, or call"]);
    let kernel = run_json(&[]);
    let call = run_json(&["--scope", "call"]);
    let (k, c) = (kernel["latency_ms"].as_f64().unwrap(), call["latency_ms"].as_f64().unwrap());
    assert!(c > k && (c - k - call["host_ms"].as_f64().unwrap()).abs() < 1e-9, "{k} {c} {}", call["host_ms"]);
    // tune says to use tpusim.jax.tune, and how.
    input_error(&["tune", "--kernel-ir", &f], &["--kernel-ir", "tpusim.jax.tune(make_fn, candidates", "lowers make_fn(candidate)"]);
    // A side table given for the description (a fresh user did): what it is, and what to give.
    let dir = scratch("bad-block");
    let npy = dir.join("k.prefetch0.npy");
    std::fs::write(&npy, b"\x93NUMPY\x01\x00v\x00{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }\xff\xfe").unwrap();
    input_error(&["run", "--kernel-ir", npy.to_str().unwrap()], &["k.prefetch0.npy", "a NumPy array (.npy)", "give the description's .json"]);
    // A hand-edited window that breaks the (8, 128) block rule: 250 rows of a 1024-row array.
    let mut d: Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
    d["refs"][0]["shape"][0] = 250.into();
    let bad = dir.join("bad.json");
    std::fs::write(&bad, serde_json::to_string(&d).unwrap()).unwrap();
    input_error(
        &["run", "--kernel-ir", bad.to_str().unwrap()],
        &["refs[0] (input 0).shape[0] = 250", "multiple of the chip's 8 sublanes", "(1024)"],
    );
    // Lanes: 200 columns.
    d["refs"][0]["shape"][0] = 256.into();
    d["refs"][0]["shape"][1] = 200.into();
    std::fs::write(&bad, serde_json::to_string(&d).unwrap()).unwrap();
    input_error(&["run", "--kernel-ir", bad.to_str().unwrap()], &["refs[0] (input 0).shape[1] = 200", "128 lanes"]);
    // An operand with no elements names the ref and its shape.
    let mut e = base_of(&f);
    e["refs"][0]["array_shape"][0] = 0.into();
    std::fs::write(&bad, serde_json::to_string(&e).unwrap()).unwrap();
    input_error(&["run", "--kernel-ir", bad.to_str().unwrap()], &["array_shape[0] = 0", "operand `input 0` is an array of shape [0,", "no elements"]);
    // References to what the description does not hold: each names the field and the range.
    let base: Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
    let edits: [Edit; 16] = [
        (
            "a ref past the refs",
            |d| d["body"][0]["operands"][0] = serde_json::json!({"ref": 9}),
            &["body[0] (vector.load, id 1).operands[0] = {\"ref\": 9}", "a ref from 0 to 2"],
        ),
        ("no refs at all", |d| d["refs"] = serde_json::json!([]), &["= {\"ref\": 0}", "lists no refs"]),
        (
            "an op that is not there",
            |d| d["body"][4]["operands"][0] = serde_json::json!({"op": 999}),
            &["body[4] (vector.store, id 5).operands[0] = {\"op\": 999}", "a value of the body"],
        ),
        (
            // A hand-edited operand that points forward would have been read as no dependency.
            "an operand bound after the op that reads it",
            |d| d["body"][3]["operands"][1] = serde_json::json!({"op": 5}),
            &["body[3] (tpu.matmul, id 4).operands[1] = {\"op\": 5} (bound after this op)", "bound before the op that reads it"],
        ),
        (
            "an mkn its operands do not have",
            |d| d["body"][3]["attrs"]["mkn"] = serde_json::json!([256, 384, 256]),
            &["body[3] (tpu.matmul, id 4)", "attrs.mkn = [256, 384, 256]", "its lhs [256, 512] holds 131072 elements, where batch 1 x 256 x 384 = 98304 are needed"],
        ),
        (
            "a transpose whose shape is not its operand's permuted",
            |d| {
                let t = serde_json::json!({"id": 6, "op": "tpu.transpose", "shape": [512, 512], "dtype": "bf16", "operands": [{"op": 2}], "attrs": {"permutation": [1, 0]}});
                d["body"].as_array_mut().unwrap().insert(3, t);
            },
            &["body[3] (tpu.transpose, id 6)", "shape = [512, 512]", "its operand's [512, 256] permuted by [1, 0]"],
        ),
        (
            "a grid dimension past the grid",
            |d| d["refs"][0]["index_map"][0] = serde_json::json!(["grid", 7]),
            &["refs[0] (input 0).index_map[0] = [\"grid\", 7]", "from 0 to 2", "[4, 4, 2]"],
        ),
        (
            "an array of another rank",
            |d| d["refs"][0]["array_shape"] = serde_json::json!([10]),
            &["refs[0] (input 0).array_shape = [10]", "one dimension per block dimension (2"],
        ),
        (
            // 4 row blocks of 256 in the 1024-row array: index 4 is past it.
            "a block index past its array",
            |d| d["refs"][0]["index_map"][0] = serde_json::json!(["add", ["grid", 0], 4]),
            &["kernel `tiled_matmul`: the index map of `input 0` at grid index [0, 0, 0]: block index 0 = 4", "expected 0 to 3", "[1024, 1024] in blocks of [256, 512]"],
        ),
        (
            "a device kind JAX does not lower for",
            |d| d["producer"]["device_kind"] = "TPU v99".into(),
            &["producer.device_kind = \"TPU v99\"", "\"TPU v6 lite\" (v6e)"],
        ),
        (
            "a block of no rows",
            |d| d["refs"][0]["shape"][0] = 0.into(),
            &["refs[0] (input 0).shape[0] = 0", "a whole number from 1"],
        ),
        (
            "a load of another dtype than its ref's",
            |d| d["refs"][0]["dtype"] = "i1".into(),
            &["body[0] (vector.load, id 1) at matmul.py:10: dtype = bf16", "expected `i1`, the dtype of the ref it loads (refs[0], input 0)"],
        ),
        (
            "a negative declared cost",
            |d| d["cost_estimate"]["flops"] = (-1).into(),
            &["cost_estimate.flops = -1", "a count from 0"],
        ),
        (
            "an id bound twice",
            |d| d["body"][1]["id"] = 1.into(),
            &["body: id 1 (vector.load at matmul.py:11)", "each value's id once"],
        ),
        (
            "a scoped VMEM limit above the chip's VMEM that the buffers overflow",
            |d| {
                d["vmem_limit_bytes"] = (1u64 << 40).into();
                d["refs"][0]["shape"] = serde_json::json!([1024, 1024]);
                d["refs"][0]["array_shape"] = serde_json::json!([1024, 65536]);
                d["refs"][0]["index_map"] = serde_json::json!([0, ["grid", 2]]);
                d["refs"].as_array_mut().unwrap().push(serde_json::json!({"name": "scratch 0", "kind": "scratch", "shape": [16384, 2048], "dtype": "f32", "memory_space": "vmem"}));
            },
            &["but the kernel's `vmem_limit_bytes` (1099511627776 bytes, 1048576.0 MiB) is above the chip's physical VMEM (128 MiB", "use smaller blocks"],
        ),
        (
            "operands larger than HBM",
            |d| d["refs"][0]["array_shape"] = serde_json::json!([1048576, 1048576]),
            &["the kernel's HBM operands", "the device holds 34359738368 bytes (32 GiB"],
        ),
    ];
    for (what, edit, says) in edits {
        let mut d = base.clone();
        edit(&mut d);
        std::fs::write(&bad, serde_json::to_string(&d).unwrap()).unwrap();
        let out = tpusim(&["run", "--kernel-ir", bad.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{what}: {err}");
        for s in says {
            assert!(err.contains(s), "{what}: {err:?} lacks {s:?}");
        }
    }
}

#[test]
fn plots_of_an_ir_kernel_render_and_kinds_that_need_attention_refuse_it() {
    let d = scratch("plot");
    let f = fixture();
    let dense = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../plots/jobs/dense.toml").to_string_lossy().into_owned();
    let png = |name: &str| d.join(name).to_string_lossy().into_owned();
    for (args, what) in [
        (vec!["plot", "timeline", "--kernel-ir", &f, "--steps", "0:6"], "grid steps 0 to 5"),
        // --head is the grid index of dimension 0: index 2 holds steps 16..23.
        (vec!["plot", "timeline", "--kernel-ir", &f, "--head", "2"], "grid steps 16 to 19"),
        (vec!["plot", "roofline", "--kernel-ir", &f, "--trace", &dense], "Roofline on v6e"),
        (vec!["plot", "breakdown", "--kernel-ir", &f, "--kernel-ir", &f, "--chips", "v6e,v5e"], "Busy time per unit"),
    ] {
        let out = png(&format!("{}.png", args[1..].join("_").replace(['/', '.', ','], "-")));
        let mut a = args.clone();
        a.extend(["--out", out.as_str()]);
        let text = ok(&a);
        assert!(text.contains(what), "{a:?}: {text}");
        let bytes = std::fs::read(&out).unwrap();
        assert!(bytes.starts_with(b"\x89PNG") && bytes.len() > 10_000, "{a:?}: {} bytes", bytes.len());
    }
    let out = png("x.png");
    for kind in ["tiles", "heatmap", "speedup"] {
        let mut a = vec!["plot", kind, "--kernel-ir", f.as_str(), "--out", out.as_str()];
        if kind == "heatmap" {
            a.extend(["--input", "sweep.csv"]);
        }
        input_error(&a, &["--kernel-ir", &format!("not with plot {kind}"), "plot timeline, breakdown and roofline --kernel-ir"]);
    }
    input_error(&["plot", "roofline", "--kernel-ir", &f, "--heads", "4", "--out", &out], &["--heads", "not with --kernel-ir"]);
    input_error(&["plot", "roofline", "--kernel-ir", "/nonexistent/k.json", "--out", &out], &["--kernel-ir /nonexistent/k.json"]);
    input_error(&["plot", "timeline", "--kernel-ir", &f, "--head", "4", "--out", &out], &["--head 4", "4 indices (0 to 3)"]);
    input_error(&["plot", "timeline", "--kernel-ir", &f, "--block-q", "256", "--out", &out], &["--block-q", "not with --kernel-ir"]);
    assert!(!d.join("x.png").exists());
}

/// A sweep file over the fixture (copied beside it) in a fresh folder.
fn sweep_dir(name: &str, sweep: &str) -> PathBuf {
    let d = scratch(name);
    std::fs::copy(fixture(), d.join("k.json")).unwrap();
    std::fs::write(d.join("s.toml"), sweep).unwrap();
    d
}

fn csv_rows(path: &std::path::Path) -> Vec<std::collections::BTreeMap<String, String>> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines().filter(|l| !l.starts_with('#'));
    let header: Vec<String> = lines.next().unwrap().split(',').map(String::from).collect();
    lines.map(|l| header.iter().cloned().zip(l.split(',').map(String::from)).collect()).collect()
}

#[test]
fn a_sweep_over_description_files_and_chip_fields_has_the_ir_reports_rows() {
    let d = sweep_dir(
        "sweep",
        "[base]\nchip = \"v6e\"\n[axes]\nkernel_ir = [\"k.json\"]\nchip = [\"v6e\", \"v5e\"]\n\"chip.hbm.bandwidth_gb_per_s\" = [800, 1600]\n",
    );
    let s = d.join("s.toml").to_string_lossy().into_owned();
    let out = d.join("s.csv").to_string_lossy().into_owned();
    let text = ok(&["sweep", &s, "--out", &out, "--no-progress", "--jobs", "2"]);
    assert!(text.contains("4 points") && text.contains("4 computed, 0 resumed, 0 with errors"), "{text}");
    let rows = csv_rows(std::path::Path::new(&out));
    assert_eq!(rows.len(), 4);
    assert!(rows.iter().all(|r| r["kernel_name"] == "tiled_matmul" && r["error"].is_empty() && r["grid_steps"] == "32"), "{rows:?}");
    // Each row is `tpusim run --kernel-ir` of its chip and override.
    for r in &rows {
        let set = format!("hbm.bandwidth_gb_per_s={}", r["chip.hbm.bandwidth_gb_per_s"]);
        let j = run_json(&["--chip", &r["chip"], "--set", &set]);
        // Equal to float rounding: the two paths have differed by one unit in the last place.
        let (a, b) = (r["latency_ms"].parse::<f64>().unwrap(), j["latency_ms"].as_f64().unwrap());
        assert!((a - b).abs() <= 1e-12 * b.abs(), "{a} vs {b}: {r:?}");
        assert_eq!(r["hbm_bytes"], j["hbm_bytes"].to_string());
    }
    // More HBM bandwidth is never slower.
    let lat = |i: usize| rows[i]["latency_ms"].parse::<f64>().unwrap();
    assert!(lat(1) < lat(0) && lat(3) <= lat(2), "{rows:?}");
    // A second run resumes every row; the bytes do not change.
    let before = std::fs::read(&out).unwrap();
    let text = ok(&["sweep", &s, "--out", &out, "--no-progress"]);
    assert!(text.contains("0 computed, 4 resumed"), "{text}");
    assert_eq!(std::fs::read(&out).unwrap(), before);
    // Editing the description makes it another sweep: refused without --force, replaced with it.
    let k = d.join("k.json");
    let edited = std::fs::read_to_string(&k).unwrap().replace("\"tiled_matmul\"", "\"tiled_matmul_2\"");
    std::fs::write(&k, edited).unwrap();
    input_error(&["sweep", &s, "--out", &out, "--no-progress"], &["another sweep", "--force"]);
    let text = ok(&["sweep", &s, "--out", &out, "--no-progress", "--force"]);
    assert!(text.contains("4 computed"), "{text}");
    assert!(csv_rows(std::path::Path::new(&out)).iter().all(|r| r["kernel_name"] == "tiled_matmul_2"));
    // Shards merge into the whole sweep's bytes.
    let whole = std::fs::read(&out).unwrap();
    let (a, b, m) = (d.join("a.csv"), d.join("b.csv"), d.join("m.csv"));
    ok(&["sweep", &s, "--out", a.to_str().unwrap(), "--no-progress", "--shard", "0/2"]);
    ok(&["sweep", &s, "--out", b.to_str().unwrap(), "--no-progress", "--shard", "1/2"]);
    ok(&["merge", b.to_str().unwrap(), a.to_str().unwrap(), "--out", m.to_str().unwrap()]);
    assert_eq!(std::fs::read(&m).unwrap(), whole);
    // --what-if-2x adds the bottleneck and gains; the bound unit is the run's.
    let w = d.join("w.csv").to_string_lossy().into_owned();
    ok(&["sweep", &s, "--out", &w, "--no-progress", "--what-if-2x"]);
    let rows = csv_rows(std::path::Path::new(&w));
    assert_eq!(rows[0]["bottleneck"], run_json(&["--set", "hbm.bandwidth_gb_per_s=800"])["bottleneck"].as_str().unwrap());
    assert!(rows[0]["gain_2x_hbm"].parse::<f64>().unwrap() > 0.1, "{:?}", rows[0]);
}

#[test]
fn bad_sweeps_of_description_files_name_the_key_and_the_file() {
    for (sweep, needles) in [
        ("[axes]\nkernel_ir = [\"k.json\", \"missing.json\"]\n", vec!["axes.kernel_ir[1]", "missing.json", "does not exist"]),
        ("[base]\nkernel_ir = \"nope.json\"\n[axes]\nchip = [\"v6e\"]\n", vec!["base.kernel_ir", "nope.json"]),
        ("[axes]\nkernel_ir = [\"k.json\"]\nblock_q = [256]\n", vec!["axes.block_q", "not in a sweep of kernel descriptions"]),
        ("[base]\nheads = 4\n[axes]\nkernel_ir = [\"k.json\"]\n", vec!["base.heads", "not in a sweep of kernel descriptions"]),
        ("[[points]]\nkernel_ir = \"k.json\"\n[[points]]\nchip = \"v5e\"\n", vec!["points[1] names no kernel_ir"]),
        ("[axes]\nkernel_ir = [3]\n", vec!["axes.kernel_ir[0]", "expected the path of a kernel description file"]),
        ("[axes]\nkernel_ir = [\"s.toml\"]\n", vec!["axes.kernel_ir[0]", "s.toml"]),
    ] {
        let d = sweep_dir("bad-sweep", sweep);
        let s = d.join("s.toml").to_string_lossy().into_owned();
        let out = d.join("o.csv").to_string_lossy().into_owned();
        let mut n = needles.clone();
        n.push("s.toml");
        input_error(&["sweep", &s, "--out", &out, "--no-progress"], &n);
        assert!(!d.join("o.csv").exists() && !d.join("o.csv.partial").exists(), "{sweep}: nothing written");
    }
}

/// A kernel without matmul FLOPs (an element-wise `tanh(x) * y + 1`, fixture
/// `elementwise.json`) cannot sit on the roofline's log axes: alone it is refused saying why
/// (it once spun forever on a zero axis range), beside another kernel it is left out with a note;
/// a timeline takes one description.
#[test]
fn a_kernel_without_matmul_flops_is_left_off_the_roofline_and_a_timeline_takes_one_file() {
    let ew = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/kernel-ir/elementwise.json").to_string_lossy().into_owned();
    let d = scratch("roofline-zero");
    let alone = d.join("alone.svg");
    input_error(&["plot", "roofline", "--kernel-ir", &ew, "--out", alone.to_str().unwrap()], &["no matmul FLOPs", "breakdown or timeline"]);
    assert!(!alone.exists());
    let both = d.join("both.svg");
    let out = ok(&["plot", "roofline", "--kernel-ir", &ew, "--kernel-ir", &fixture(), "--out", both.to_str().unwrap()]);
    let svg = std::fs::read_to_string(&both).unwrap();
    assert!(svg.contains("elementwise: not drawn"), "the left-out kernel is named in the notes");
    // and in what the command prints (a fresh user saw one point listed and no word of the other).
    assert!(out.contains("elementwise: not drawn: it executes no matmul FLOPs"), "{out}");
    let t = d.join("t.svg");
    input_error(&["plot", "timeline", "--kernel-ir", &fixture(), "--kernel-ir", &ew, "--out", t.to_str().unwrap()], &["--kernel-ir", "cannot be used multiple times"]);
}

/// A float carried through a loop (a `fori_loop` accumulator, which the simulator does not
/// evaluate) does not stop the kernel: only a use that steers the path is refused, naming the
/// value and the loop that carries it.
#[test]
fn a_float_carried_through_a_loop_is_refused_only_where_the_path_reads_it() {
    let base: Value = serde_json::from_str(&std::fs::read_to_string(fixture()).unwrap()).unwrap();
    let dir = scratch("float-carry");
    let file = dir.join("k.json");
    let float_loop = serde_json::json!({
        "op": "scf.for", "lower": 0, "upper": 4, "step": 1, "loc": "k.py:3",
        "then": [{"op": "scf.yield", "operands": [{"scalar": ["unknown", "the result of `arith.addf`"]}], "attrs": {"results": [null]}}],
        "attrs": {"carried": [101], "init": [["unknown", "the float constant 0.0"]], "yield": [["unknown", "the result of `arith.addf`"]], "results": [102]}
    });
    let mut d = base.clone();
    d["body"].as_array_mut().unwrap().insert(0, float_loop.clone());
    std::fs::write(&file, serde_json::to_string(&d).unwrap()).unwrap();
    let with_loop: Value = serde_json::from_str(&ok(&["run", "--kernel-ir", file.to_str().unwrap(), "--format", "json"])).unwrap();
    let without = run_json(&[]);
    assert_eq!(with_loop["latency_ms"], without["latency_ms"], "a loop of scalar work adds no unit time");
    // A branch on the carried value: refused at the branch, naming what it reads.
    let branch = serde_json::json!({"op": "scf.if", "cond": ["var", 102], "then": [], "else": [], "loc": "k.py:5"});
    d["body"].as_array_mut().unwrap().insert(1, branch);
    std::fs::write(&file, serde_json::to_string(&d).unwrap()).unwrap();
    input_error(&["run", "--kernel-ir", file.to_str().unwrap()], &["k.py:5", "the result of `arith.addf`, carried by the `scf.for` at k.py:3", "does not evaluate"]);
}

/// A matmul whose rows span two dimensions of its result (Mosaic collapses a dot_general's
/// leading non-contracting dimensions into its rows): the fixture's 256 x 512 x 256 matmul with
/// its lhs and result split as 2 x 128 rows does the same MXU work and takes about the same time.
#[test]
fn a_matmul_whose_rows_span_two_dimensions_counts_all_of_them() {
    let mut d: Value = serde_json::from_str(&std::fs::read_to_string(fixture()).unwrap()).unwrap();
    let dir = scratch("rank3-matmul");
    let file = dir.join("k.json");
    for (i, shape) in [(0, [2, 128, 512]), (2, [2, 128, 256]), (3, [2, 128, 256])] {
        d["body"][i]["shape"] = serde_json::json!(shape);
    }
    std::fs::write(&file, serde_json::to_string(&d).unwrap()).unwrap();
    let split: Value = serde_json::from_str(&ok(&["run", "--kernel-ir", file.to_str().unwrap(), "--format", "json"])).unwrap();
    let flat = run_json(&[]);
    assert!(flat["flops"].as_f64().unwrap() > 0.0);
    assert_eq!(split["flops"], flat["flops"]);
    // Slabs follow the second-minor dimension: 2 slabs of 2 x 64 rows against 4 of 64, so the
    // schedules differ slightly (the MXU work does not).
    let (a, b) = (split["latency_ms"].as_f64().unwrap(), flat["latency_ms"].as_f64().unwrap());
    assert!((a / b - 1.0).abs() < 0.01, "{a} against {b} ms");
}

/// A scoped VMEM limit above the chip's VMEM (a kernel's `vmem_limit_bytes`) is read as the
/// physical size, and the report says so; the fixture's buffers fit either way.
#[test]
fn a_vmem_limit_above_the_chip_is_checked_against_the_physical_vmem() {
    let mut d: Value = serde_json::from_str(&std::fs::read_to_string(fixture()).unwrap()).unwrap();
    d["vmem_limit_bytes"] = (1u64 << 40).into();
    let file = scratch("vmem-limit").join("k.json");
    std::fs::write(&file, serde_json::to_string(&d).unwrap()).unwrap();
    let out = ok(&["run", "--kernel-ir", file.to_str().unwrap()]);
    assert!(out.contains("of the 128.0 MiB scoped limit"), "{out}");
    assert!(out.contains("above the chip's physical VMEM: its buffers are checked against the physical 134217728 bytes"), "{out}");
}

/// A kernel lowered for one generation and simulated on another says so; on its own it does not.
#[test]
fn a_kernel_simulated_on_another_chip_than_it_was_lowered_for_says_so() {
    let f = fixture();
    let other = ok(&["run", "--kernel-ir", &f, "--chip", "v7x"]);
    assert!(other.contains("lowered for TPU v6 lite (v6e) and simulated on v7x: Mosaic's choices for v6e"), "{other}");
    assert!(!ok(&["run", "--kernel-ir", &f]).contains("simulated on"));
}

/// Issue 47, point 9: a kernel read from its IR quotes its family's band where its family has
/// one: megablox's gmm (its description records the family; measured as host-timed calls, so
/// the band at scope call with a note), sglang's ragged paged attention (recognised from its
/// kernel name and source file); a kernel of no known family quotes the pooled band and says so.
#[test]
fn a_kernel_read_from_its_ir_quotes_its_familys_band() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../traces/measured/kernels");
    let band = |file: PathBuf| -> Value {
        let j: Value = serde_json::from_str(&ok(&["run", "--kernel-ir", file.to_str().unwrap(), "--format", "json"])).unwrap();
        j["band"].clone()
    };
    let gmm = band(root.join("megablox-gmm/GMM-v6e-t128-m1024-k1024-n4096-g16.json.gz"));
    assert_eq!(gmm["family"], "megablox-gmm", "{gmm}");
    assert_eq!(gmm["scope"], "call");
    assert!(gmm["note"].as_str().unwrap().contains("measured at scope call only"), "{gmm}");
    let rpa = band(root.join("rpa-v3-sglang/RPA3-v6e-decode-p128-t128-q4kv1.json.gz"));
    assert_eq!((rpa["family"].as_str(), rpa["covered"].as_bool()), (Some("rpa-v3-sglang"), Some(true)), "{rpa}");
    assert!(rpa.get("note").is_none(), "{rpa}");
    let plain = run_json(&[]);
    assert_eq!(plain["band"]["family"], "kernel-ir");
    assert!(plain["band"]["note"].as_str().unwrap().contains("family is not known"), "{}", plain["band"]);
    // The table says it too.
    let table = ok(&["run", "--kernel-ir", root.join("megablox-gmm/GMM-v6e-t128-m1024-k1024-n4096-g16.json.gz").to_str().unwrap()]);
    let line = table.lines().find(|l| l.trim_start().starts_with("band")).unwrap();
    assert!(line.contains("megablox-gmm") && line.contains("median 13%"), "{line}");
}

/// A unit made twice as fast that makes the run slower (the DMA engines' sharing) shows the
/// latency it adds with a plus and says so; it printed a double minus (`vpu --0.1%`).
#[test]
fn a_what_if_that_slows_the_run_is_shown_as_added_latency() {
    let f = fixture();
    let json: serde_json::Value = serde_json::from_str(&ok(&["run", "--kernel-ir", &f, "--format", "json"])).unwrap();
    let slower: Vec<&str> = json["what_if_2x"].as_array().unwrap().iter().filter(|w| w["gain"].as_f64().unwrap() < -0.0005).map(|w| w["unit"].as_str().unwrap()).collect();
    assert!(!slower.is_empty(), "the fixture's matmul has a unit whose 2x makes it slower (vpu): {json}");
    let text = ok(&["run", "--kernel-ir", &f]);
    let line = text.lines().find(|l| l.trim_start().starts_with("what if 2x")).expect("what-if line");
    assert!(!line.contains("--"), "{line}");
    for u in slower {
        assert!(line.contains(&format!("{u} +")) && line.contains("(slower:"), "{u} in {line}");
    }
}

/// A kernel that only moves data (the public pipelined copy: its bodies are free loads and
/// stores) visits every grid step that copies: a fresh user saw its 2048 steps reported as 2048
/// empty tiles ("skipped") while it moved 16 MiB. None computes (the grid line says "data
/// movement only").
#[test]
fn a_copy_kernels_steps_are_not_empty_tiles() {
    let f = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../traces/measured/kernels/microbench/MB-v6e-copy-t1.json.gz");
    let json: serde_json::Value = serde_json::from_str(&ok(&["run", "--kernel-ir", f.to_str().unwrap(), "--format", "json"])).unwrap();
    let steps = json["grid_steps"].as_u64().unwrap();
    assert!(steps > 1 && json["hbm_bytes"].as_u64().unwrap() > 0, "{json}");
    assert_eq!(json["steps_computed"].as_u64(), Some(0), "{json}");
    assert_eq!(json["tiles"]["visited"].as_u64(), Some(steps), "{json}");
    assert_eq!(json["tiles"]["empty"].as_u64(), Some(0), "{json}");
}
