//! Sweep and tune speed: `cargo bench -p tpusim-sweep --bench sweep_throughput` (add
//! `-- --splice $PWD/studies/README.md --splice $PWD/README.md` (absolute paths) to write the table into those files'
//! `bench-sweep` parts; `./bench.sh` does it for every bench).
//!
//! Cases, each run once on all cores (`TPUSIM_BENCH_JOBS=N` sets the thread count):
//!
//! * `studies/video-10k.toml` (10,000 points: HBM bandwidth x VPU throughput x block_q x
//!   block_kv on the sparse 720p video case), and the same sweep on the dense video case;
//! * 1,000 sparse points that share no lowering (40 block_q x 25 block_kv, no chip axis);
//! * a 10,000-point causal sweep at 65,536 tokens (100 block pairs x 100 HBM x VPU rates);
//! * `studies/video-1m.toml` (1,000,000 points: the 10k study x 100 exp-rate x clock
//!   combinations), skipped when `TPUSIM_BENCH_SKIP_1M=1`;
//! * `tpusim tune` of the README example (16 heads, 16,384 tokens, causal, options fixed) and of
//!   `--heads 8 --head-dim 128 --mask causal --seq-len 1048576` (every option searched).
//!
//! Each line gives wall time, CPU time (user + system of this process, which does not grow
//! when other processes share the cores) and CPU time per point; "on idle cores" divides the
//! CPU time by the thread count, the wall time the case would take alone on this machine.

use std::time::Instant;
use tpusim_report::JobSpec;
use tpusim_sweep::{run_sweep, tune, SweepDef, SweepOptions, TuneOptions};

/// One measured case.
struct Row {
    name: String,
    points: u64,
    errors: u64,
    wall_s: f64,
    cpu_s: Option<f64>,
}

fn main() {
    let studies = concat!(env!("CARGO_MANIFEST_DIR"), "/../../studies");
    let read = |f: &str| std::fs::read_to_string(format!("{studies}/{f}")).unwrap_or_else(|e| panic!("studies/{f}: {e}"));
    let text = read("video-10k.toml");
    let jobs: Option<usize> = std::env::var("TPUSIM_BENCH_JOBS").ok().and_then(|v| v.parse().ok());
    let threads = jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let dir = std::env::temp_dir().join(format!("tpusim-sweep-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch folder");
    println!("sweep and tune speed on {threads} threads");
    let base = &text[..text.find("[axes]").expect("[axes]")];
    let list = |v: Vec<String>| v.join(", ");
    let unshared = format!(
        "{base}\n[axes]\nblock_q = [{}]\nblock_kv = [{}]\n",
        list((0..40).map(|i| (1024 + 64 * i).to_string()).collect()),
        list((0..25).map(|i| (512 + 128 * i).to_string()).collect())
    );
    let causal = format!(
        "[base]\nchip = \"v6e\"\nkernel = \"tokamax-splash\"\nheads = 8\nseq_len = 65536\nmask = \"causal\"\ntraversal = \"compact\"\nmasking = \"partial\"\n[axes]\nblock_q = [512, 1024, 1536, 2048, 2560, 3072, 3584, 4096, 5120, 6144]\nblock_kv = [512, 768, 1024, 1280, 1536, 2048, 2560, 3072, 3584, 4096]\n\"chip.hbm.bandwidth_gb_per_s\" = [{}]\n\"chip.fitted.valu_vreg_ops_per_cycle\" = [{}]\n",
        list((0..10).map(|i| (819 + 410 * i).to_string()).collect()),
        list((0..10).map(|i| format!("{:.2}", 1.35 + 1.0 * f64::from(i))).collect())
    );
    let mut sweeps: Vec<(String, String, String)> = vec![
        ("`studies/video-10k.toml`: sparse video case".into(), "video-10k.toml".into(), text.clone()),
        ("`video-10k.toml` with `mask = \"full\"`: dense video case".into(), "video-10k.toml".into(), text.replace("mask = \"band:15000+sink:3600\"", "mask = \"full\"")),
        ("sparse video case, block sizes only (every point lowered)".into(), "video-10k.toml".into(), unshared),
        ("causal, 65,536 tokens x 8 heads: 100 block pairs x 100 HBM x VPU rates".into(), "causal-10k.toml".into(), causal),
    ];
    if std::env::var("TPUSIM_BENCH_SKIP_1M").as_deref() != Ok("1") {
        sweeps.push(("`studies/video-1m.toml`: the 10k study x 100 exp-rate x clock combinations".into(), "video-1m.toml".into(), read("video-1m.toml")));
    }
    let mut rows = Vec::new();
    for (name, file, text) in sweeps {
        let def = SweepDef::parse(&text, &format!("{studies}/{file}"), &[]).expect("the study parses");
        let out = dir.join("bench.csv");
        let opts = SweepOptions { jobs, restart: true, ..SweepOptions::new(out.to_str().expect("utf-8 path")) };
        let start = Instant::now();
        let cpu0 = tpusim_io::bench::cpu_seconds();
        let s = run_sweep(&def, &opts).expect("the sweep runs");
        let row = Row {
            name,
            points: s.points,
            errors: s.errors,
            wall_s: start.elapsed().as_secs_f64(),
            cpu_s: tpusim_io::bench::cpu_seconds().zip(cpu0).map(|(b, a)| b - a),
        };
        print_row(&row, threads);
        rows.push(row);
    }
    let _ = std::fs::remove_dir_all(&dir);
    for (name, flags) in [
        (
            "`tpusim tune --heads 16 --seq-len 16384 --head-dim 128 --mask causal --traversal compact --masking partial --mask-source computed --top 5` (the studies README's example)",
            "heads = 16\nseq_len = 16384\nhead_dim = 128\nmask = \"causal\"\ntraversal = \"compact\"\nmasking = \"partial\"\nmask_source = \"computed\"\n",
        ),
        ("`tpusim tune --heads 8 --head-dim 128 --mask causal --seq-len 1048576`", "heads = 8\nseq_len = 1048576\nhead_dim = 128\nmask = \"causal\"\n"),
    ] {
        let spec: JobSpec = toml::from_str(flags).expect("tune spec");
        let opts = TuneOptions { top: 5, jobs, ..TuneOptions::default() };
        let start = Instant::now();
        let cpu0 = tpusim_io::bench::cpu_seconds();
        let r = tune(&spec, &opts).expect("tune runs");
        let row = Row {
            name: name.to_string(),
            points: r.evaluated as u64,
            errors: (r.evaluated - r.valid - r.duplicates) as u64,
            wall_s: start.elapsed().as_secs_f64(),
            cpu_s: tpusim_io::bench::cpu_seconds().zip(cpu0).map(|(b, a)| b - a),
        };
        print_row(&row, threads);
        rows.push(row);
    }
    let load = std::fs::read_to_string("/proc/loadavg").ok().and_then(|l| l.split_whitespace().next().map(str::to_string));
    let mut table = String::from(
        "| case | points (configurations for tune) | refused | wall s | CPU s | CPU ms per point | on idle cores, s |\n|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in &rows {
        let (cpu, per, idle) = match r.cpu_s {
            Some(c) => (format!("{c:.1}"), format!("{:.3}", c * 1e3 / r.points.max(1) as f64), format!("{:.1}", c / threads as f64)),
            None => ("-".into(), "-".into(), "-".into()),
        };
        table.push_str(&format!("| {} | {} | {} | {:.1} | {cpu} | {per} | {idle} |\n", r.name, r.points, r.errors, r.wall_s, ));
    }
    table.push_str(&format!(
        "\nGenerated by `cargo bench -p tpusim-sweep --bench sweep_throughput` on {}, {threads} threads{}. CPU time is per process (user + system); \"on idle cores\" is CPU time / threads, what the case takes when nothing else runs; the wall time includes whatever else shared the machine. Per-point figures divide by every point of the case (for tune: every configuration it evaluated, refused ones included).\n",
        tpusim_io::bench::machine_and_date(),
        load.map_or(String::new(), |l| format!(", load average {l} at the end"))
    ));
    if let Err(e) = tpusim_io::bench::splice_table("bench-sweep", &table) {
        eprintln!("{e}");
        std::process::exit(1);
    }
}

fn print_row(r: &Row, threads: usize) {
    println!(
        "  {}: {} points ({} refused) in {:.1} s wall{}",
        r.name,
        r.points,
        r.errors,
        r.wall_s,
        r.cpu_s.map_or(String::new(), |c| format!(
            "; {c:.1} CPU s = {:.3} ms per point; {:.1} s on {threads} idle cores",
            c * 1e3 / r.points.max(1) as f64,
            c / threads as f64
        ))
    );
}
