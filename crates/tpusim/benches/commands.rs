//! How long the commands take as a user runs them: `cargo bench -p tpusim --bench commands` (add
//! `-- --splice $PWD/README.md --splice $PWD/studies/README.md`, absolute paths, to write the
//! table into those files' `bench-sweep` parts; `./bench.sh` does it for every bench).
//!
//! Each case is a `tpusim` command line run as its own process (the binary this package builds),
//! from process start to exit: parsing, reading the chip and job, every simulation, the output
//! written. Each runs `TPUSIM_BENCH_RUNS` times (default 5; the million-point sweep once, and not
//! at all with `TPUSIM_BENCH_SKIP_1M=1`); the table gives the median wall time with the fastest
//! and slowest run, and the median CPU time (user + system of the command's process, which does
//! not grow when other processes share the cores). Sweeps restart every time (`--restart`), so no
//! run resumes another's rows. A bench binary, not a test: nothing here asserts a time.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// One command and what it is.
struct Case {
    name: String,
    args: Vec<String>,
    /// Points of a sweep or configurations of a tune (read from the command's output).
    count: fn(&str) -> Option<u64>,
    runs: usize,
}

/// The points a sweep wrote: "... N points -> ...".
fn sweep_points(out: &str) -> Option<u64> {
    let i = out.find(" points -> ")?;
    out[..i].rsplit(' ').next()?.parse().ok()
}

/// The configurations a tune evaluated: "evaluated    N configurations".
fn tune_configurations(out: &str) -> Option<u64> {
    let i = out.find("evaluated")?;
    out[i + 9..].split_whitespace().next()?.parse().ok()
}

fn none(_: &str) -> Option<u64> {
    None
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let studies = root.join("studies");
    let bin = env!("CARGO_BIN_EXE_tpusim");
    let runs: usize = std::env::var("TPUSIM_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).filter(|&n| n >= 1).unwrap_or(5);
    let dir = std::env::temp_dir().join(format!("tpusim-commands-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch folder");
    let read = |f: &str| std::fs::read_to_string(studies.join(f)).unwrap_or_else(|e| panic!("studies/{f}: {e}"));
    let ten_k = read("video-10k.toml");
    let base = &ten_k[..ten_k.find("[axes]").expect("[axes]")];
    let list = |v: Vec<String>| v.join(", ");
    // Sweep files beside the studies' (none refers to another file).
    let write = |name: &str, text: String| {
        let p = dir.join(name);
        std::fs::write(&p, text).expect("sweep file");
        p.to_str().expect("utf-8 path").to_string()
    };
    let dense = write("video-10k-dense.toml", ten_k.replace("mask = \"band:15000+sink:3600\"", "mask = \"full\""));
    let blocks = write(
        "video-blocks.toml",
        format!(
            "{base}\n[axes]\nblock_q = [{}]\nblock_kv = [{}]\n",
            list((0..40).map(|i| (1024 + 64 * i).to_string()).collect()),
            list((0..25).map(|i| (512 + 128 * i).to_string()).collect())
        ),
    );
    let causal = write(
        "causal-10k.toml",
        format!(
            "[base]\nchip = \"v6e\"\nkernel = \"tokamax-splash\"\nheads = 8\nseq_len = 65536\nmask = \"causal\"\ntraversal = \"compact\"\nmasking = \"partial\"\n[axes]\nblock_q = [512, 1024, 1536, 2048, 2560, 3072, 3584, 4096, 5120, 6144]\nblock_kv = [512, 768, 1024, 1280, 1536, 2048, 2560, 3072, 3584, 4096]\n\"chip.hbm.bandwidth_gb_per_s\" = [{}]\n\"chip.fitted.valu_vreg_ops_per_cycle\" = [{}]\n",
            list((0..10).map(|i| (819 + 410 * i).to_string()).collect()),
            list((0..10).map(|i| format!("{:.2}", 1.35 + 1.0 * f64::from(i))).collect())
        ),
    );
    let out = dir.join("out.csv").to_str().expect("utf-8 path").to_string();
    let words = |s: &str| s.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    let sweep = |name: &str, file: &str, runs: usize| Case {
        name: name.to_string(),
        args: vec!["sweep".into(), file.into(), "--out".into(), out.clone(), "--restart".into(), "--force".into()],
        count: sweep_points,
        runs,
    };
    let study = |f: &str| studies.join(f).to_str().expect("utf-8 path").to_string();
    let mut cases = vec![
        Case { name: "`tpusim run` (the default job: the dense case study)".into(), args: words("run"), count: none, runs },
        Case {
            name: "`tpusim run --trace traces/video-720p-sparse.toml`".into(),
            args: vec!["run".into(), "--trace".into(), root.join("traces/video-720p-sparse.toml").to_str().expect("utf-8").into()],
            count: none,
            runs,
        },
        Case { name: "`tpusim layer` (Wan 2.1 14B block on a v6e-8)".into(), args: words("layer"), count: none, runs },
        sweep("`tpusim sweep studies/video-10k.toml`: sparse video case", &study("video-10k.toml"), runs),
        sweep("`video-10k.toml` with `mask = \"full\"`: dense video case", &dense, runs),
        sweep("sparse video case, block sizes only (every point lowered)", &blocks, runs),
        sweep("causal, 65,536 tokens x 8 heads: 100 block pairs x 100 HBM x VPU rates", &causal, runs),
    ];
    if std::env::var("TPUSIM_BENCH_SKIP_1M").as_deref() != Ok("1") {
        cases.push(sweep("`tpusim sweep studies/video-1m.toml`: the 10k study x 100 exp-rate x clock combinations", &study("video-1m.toml"), 1));
    }
    for flags in [
        "--heads 16 --seq-len 16384 --head-dim 128 --mask causal --traversal compact --masking partial --mask-source computed --top 5",
        "--heads 8 --head-dim 128 --mask causal --seq-len 1048576",
    ] {
        let mut args = words("tune");
        args.extend(words(flags));
        args.push("--no-progress".into());
        cases.push(Case { name: format!("`tpusim tune {flags}`"), args, count: tune_configurations, runs });
    }
    // The calibration commands the README's prose quotes (their times come from here).
    let csv = root.join("traces/measured/calibration.csv").to_str().expect("utf-8 path").to_string();
    cases.push(Case { name: "`tpusim calibrate traces/measured/calibration.csv --chip v6e` (with held-out refits)".into(), args: vec!["calibrate".into(), csv.clone(), "--chip".into(), "v6e".into()], count: none, runs });
    cases.push(Case { name: "`tpusim validate traces/measured/calibration.csv --cv`".into(), args: vec!["validate".into(), csv, "--cv".into()], count: none, runs });
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("commands as processes of {bin}, {threads} cores, {runs} runs each");
    let mut table = String::from(
        "| command | points (configurations for tune) | median wall s | fastest - slowest s | median CPU s | CPU ms per point | median peak memory MiB |\n|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for c in &cases {
        let mut walls = Vec::new();
        let mut cpus = Vec::new();
        let mut peaks = Vec::new();
        let mut count = None;
        for _ in 0..c.runs {
            let cpu0 = tpusim_io::bench::children_cpu_seconds();
            let t = Instant::now();
            let (o, peak) = tpusim_io::bench::output_with_peak_rss(Command::new(bin).args(&c.args).current_dir(&root)).expect("tpusim runs");
            walls.push(t.elapsed().as_secs_f64());
            peaks.extend(peak);
            if let Some(d) = tpusim_io::bench::children_cpu_seconds().zip(cpu0).map(|(b, a)| b - a) {
                cpus.push(d);
            }
            assert!(o.status.success(), "tpusim {:?}: {}", c.args, String::from_utf8_lossy(&o.stderr));
            let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
            count = (c.count)(&text);
        }
        let (lo, hi) = (walls.iter().copied().fold(f64::INFINITY, f64::min), walls.iter().copied().fold(0.0, f64::max));
        let wall = median(&mut walls);
        let cpu = (!cpus.is_empty()).then(|| median(&mut cpus));
        let peak = (!peaks.is_empty()).then(|| median(&mut peaks));
        let spread = if c.runs > 1 { format!("{lo:.2} - {hi:.2}") } else { "one run".into() };
        let per = match (cpu, count) {
            (Some(cpu), Some(n)) if n > 0 => format!("{:.3}", cpu * 1e3 / n as f64),
            _ => "".into(),
        };
        let peak = peak.map_or("-".into(), |v| format!("{v:.0}"));
        println!("  {}: {wall:.2} s wall (runs {spread}), {} CPU s, peak {peak} MiB", c.name, cpu.map_or("-".into(), |v| format!("{v:.2}")));
        table.push_str(&format!(
            "| {} | {} | {wall:.2} | {spread} | {} | {per} | {peak} |\n",
            c.name,
            count.map_or(String::new(), |n| n.to_string()),
            cpu.map_or("-".into(), |v| format!("{v:.2}"))
        ));
    }
    let _ = std::fs::remove_dir_all(&dir);
    let load = std::fs::read_to_string("/proc/loadavg").ok().and_then(|l| l.split_whitespace().next().map(str::to_string));
    table.push_str(&format!(
        "\nGenerated by `cargo bench -p tpusim --bench commands` on {}{}: each command run as its own process, {runs} times (the million-point sweep once), timed from start to exit; the median with the fastest and slowest run. CPU time is the command's (user + system) and peak memory its peak resident set (`ru_maxrss`); with {threads} cores a command that keeps both busy takes about half its CPU time. Per-point figures divide by every point (for tune: every configuration it evaluated, refused ones included).\n",
        tpusim_io::bench::machine_and_date(),
        load.map_or(String::new(), |l| format!(", load average {l} at the end"))
    ));
    if let Err(e) = tpusim_io::bench::splice_table("bench-sweep", &table) {
        eprintln!("{e}");
        std::process::exit(1);
    }
}
