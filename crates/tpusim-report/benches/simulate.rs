//! Simulator speed: `cargo bench -p tpusim-report --bench simulate`.
//!
//! Times lowering + simulation (including the dense baseline that sparse runs also simulate) of
//! the cases the issues name, reports the median of repeated runs and the process's peak resident
//! memory. A bench binary, not a test: nothing here asserts a time.

use std::time::Instant;
use tpusim_report::{run, JobSpec};

fn spec(args: &[(&str, &str)]) -> JobSpec {
    let mut text = String::new();
    for (k, v) in args {
        text.push_str(&format!("{k} = {v}\n"));
    }
    toml::from_str(&text).expect("bench spec")
}

fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn main() {
    let cases: Vec<(&str, JobSpec)> = vec![
        ("default: 75,600 tokens x 10 heads, dense, 3024/2048/1024", JobSpec::default()),
        (
            "75,600 x 10 heads, band+sink, compact, 3328 x 1536",
            spec(&[
                ("mask", "\"band:15000+sink:3600\""),
                ("traversal", "\"compact\""),
                ("masking", "\"partial\""),
                ("block_q", "3328"),
                ("block_kv", "1536"),
                ("heads", "10"),
            ]),
        ),
        (
            "302,400 tokens (1440p) x 10 heads, band+sink, compact",
            spec(&[
                ("seq_len", "302400"),
                ("mask", "\"band:60000+sink:14400\""),
                ("traversal", "\"compact\""),
                ("masking", "\"partial\""),
                ("block_q", "3328"),
                ("block_kv", "1536"),
            ]),
        ),
        (
            "1,048,576 tokens x 16 heads, causal, compact, 2048 x 2048",
            spec(&[
                ("seq_len", "1048576"),
                ("heads", "16"),
                ("mask", "\"causal\""),
                ("traversal", "\"compact\""),
                ("masking", "\"partial\""),
                ("block_q", "2048"),
                ("block_kv", "2048"),
            ]),
        ),
        (
            "1,048,576 tokens x 16 heads, causal, full-grid, 512 x 512",
            spec(&[("seq_len", "1048576"), ("heads", "16"), ("mask", "\"causal\""), ("block_q", "512"), ("block_kv", "512")]),
        ),
    ];
    println!("{:<62} {:>10} {:>10} {:>12}", "case", "median ms", "min ms", "grid steps");
    for (name, s) in cases {
        let chip = s.chip().expect("chip");
        let job = s.build(&chip).expect("job");
        let mut times = Vec::new();
        let mut steps = 0;
        for _ in 0..7 {
            let t = Instant::now();
            let r = run(&chip, &job).expect("run");
            times.push(t.elapsed().as_secs_f64() * 1e3);
            steps = r.result.grid_steps;
        }
        times.sort_by(f64::total_cmp);
        println!("{name:<62} {:>10.2} {:>10.2} {:>12}", times[times.len() / 2], times[0], steps);
    }
    if let Some(m) = peak_rss_mib() {
        println!("peak resident memory of this process: {m:.1} MiB");
    }
}
