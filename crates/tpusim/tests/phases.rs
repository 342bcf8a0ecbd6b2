//! Calls of several phases (backward kernels, training steps, the library's XLA ops) in the
//! timeline and the breakdown figure.

use std::path::PathBuf;
use std::process::Command;

fn tpusim(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tpusim")).args(args).output().unwrap()
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tpusim-phases-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

const STEP: &[&str] = &[
    "--chip",
    "v7x",
    "--heads",
    "2",
    "--seq-len",
    "4096",
    "--head-dim",
    "128",
    "--direction",
    "fwd+bwd",
    "--scope",
    "op",
    "--block-q",
    "1024",
    "--block-kv",
    "1024",
    "--block-q-dkv",
    "1024",
    "--block-kv-dkv",
    "1024",
];

#[test]
fn a_training_step_timeline_draws_each_kernel_after_the_ops_before_it() {
    let d = tmp("timeline");
    let path = d.join("step.json");
    let mut args = vec!["run"];
    args.extend(STEP);
    args.extend(["--timeline", path.to_str().unwrap()]);
    let out = tpusim(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let ev = v["traceEvents"].as_array().unwrap();
    let processes: Vec<(u64, String)> = ev
        .iter()
        .filter(|e| e["name"] == "process_name")
        .map(|e| (e["pid"].as_u64().unwrap(), e["args"]["name"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(processes.len(), 3, "{processes:?}");
    assert!(processes[0].1.contains("forward") && processes[1].1.contains("backward") && processes[2].0 == 100, "{processes:?}");
    // Phases are laid end to end: every event of the backward kernel starts after the forward
    // kernel's phase ends, and the XLA ops' events tile the time outside the kernels.
    let phases = v["otherData"]["phases"].as_array().unwrap();
    let starts: Vec<f64> = phases.iter().map(|p| p["start_us"].as_f64().unwrap()).collect();
    assert!(starts.windows(2).all(|w| w[0] < w[1]), "{starts:?}");
    let bwd_start = phases.iter().find(|p| p["part"] == "fused dq/dk/dv").unwrap()["start_us"].as_f64().unwrap();
    for e in ev.iter().filter(|e| e["ph"] == "X" && e["pid"] == 2) {
        assert!(e["ts"].as_f64().unwrap() >= bwd_start - 1e-9, "{e}");
    }
    let xla: f64 = ev.iter().filter(|e| e["ph"] == "X" && e["pid"] == 100).map(|e| e["dur"].as_f64().unwrap()).sum();
    let xla_phases: f64 =
        phases.iter().filter(|p| p["part"] == "outside the kernels" || p["part"] == "di").map(|p| p["latency_us"].as_f64().unwrap()).sum();
    assert!(xla >= xla_phases * (1.0 - 1e-9), "{xla} vs {xla_phases}");
    let total: f64 = phases.iter().map(|p| p["latency_us"].as_f64().unwrap()).sum();
    assert!((total - v["otherData"]["run_latency_us"].as_f64().unwrap()).abs() < 1e-6 * total);
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn the_breakdown_draws_a_bar_per_kernel_of_a_training_step() {
    let d = tmp("breakdown");
    let job = d.join("step.toml");
    std::fs::write(
        &job,
        "chip = 'v7x'\nheads = 2\nseq_len = 4096\nhead_dim = 128\ndirection = 'fwd+bwd'\nscope = 'op'\nblock_q = 1024\nblock_kv = 1024\nblock_q_dkv = 1024\nblock_kv_dkv = 1024\n",
    )
    .unwrap();
    let out_png = d.join("b.svg");
    let out = tpusim(&["plot", "breakdown", "--trace", job.to_str().unwrap(), "--out", out_png.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let svg = std::fs::read_to_string(&out_png).unwrap();
    for label in ["step: forward", "step: fused dq/dk/dv", "step: XLA ops"] {
        assert!(svg.contains(label), "no bar {label:?}");
    }
    let _ = std::fs::remove_dir_all(d);
}
