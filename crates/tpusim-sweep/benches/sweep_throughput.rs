//! Sweep throughput: runs the 10,000-point study `studies/video-10k.toml` (HBM bandwidth x VPU
//! throughput x block_q x block_kv on the sparse 720p video case) on all cores, the same sweep on
//! the dense video case (mask = "full"), and 1,000 sparse points that share no lowering (block
//! sizes only), and prints points per second.
//!
//!     cargo bench -p tpusim-sweep --bench sweep_throughput
//!
//! `TPUSIM_BENCH_JOBS=N` sets the thread count (default: one per core).

use std::time::Instant;
use tpusim_sweep::{run_sweep, SweepDef, SweepOptions};

fn main() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../studies/video-10k.toml");
    let text = std::fs::read_to_string(path).expect("studies/video-10k.toml");
    let jobs: Option<usize> = std::env::var("TPUSIM_BENCH_JOBS").ok().and_then(|v| v.parse().ok());
    let threads = jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let dir = std::env::temp_dir().join(format!("tpusim-sweep-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch folder");
    println!("sweep throughput on {threads} threads");
    // Worst case for sharing: 1,000 sparse points that all lower differently (40 block_q x 25
    // block_kv, no chip axis).
    let block_q: Vec<String> = (0..40).map(|i| (1024 + 64 * i).to_string()).collect();
    let block_kv: Vec<String> = (0..25).map(|i| (512 + 128 * i).to_string()).collect();
    let unshared = format!(
        "{}\n[axes]\nblock_q = [{}]\nblock_kv = [{}]\n",
        &text[..text.find("[axes]").expect("[axes]")],
        block_q.join(", "),
        block_kv.join(", ")
    );
    for (name, text) in [
        ("sparse video case (band:15000+sink:3600)", text.clone()),
        ("dense video case (mask full)", text.replace("mask = \"band:15000+sink:3600\"", "mask = \"full\"")),
        ("sparse video case, every point lowered (block sizes only)", unshared),
    ] {
        let def = SweepDef::parse(&text, path, &[]).expect("the study parses");
        let out = dir.join("bench.csv");
        let opts = SweepOptions { jobs, restart: true, ..SweepOptions::new(out.to_str().expect("utf-8 path")) };
        let start = Instant::now();
        let cpu0 = cpu_seconds();
        let s = run_sweep(&def, &opts).expect("the sweep runs");
        let secs = start.elapsed().as_secs_f64();
        let cpu = cpu_seconds().zip(cpu0).map(|(b, a)| b - a);
        println!(
            "  {name}: {} points ({} with errors) in {secs:.1} s = {:.0} points/s{}",
            s.points,
            s.errors,
            s.points as f64 / secs,
            cpu.map_or(String::new(), |c| format!(
                "; {c:.1} CPU s = {:.2} ms per point, {:.1} s per 10,000 points on {threads} idle cores",
                c * 1e3 / s.points as f64,
                c / threads as f64 * 10_000.0 / s.points as f64
            ))
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// CPU time of this process (user + system), seconds, from /proc/self/stat (Linux; `None`
/// elsewhere). Unlike wall time it does not grow when other processes share the cores.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of stat (utime, stime), in clock ticks (100 per second on Linux).
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}
