//! Simulator speed: `cargo bench -p tpusim-job --bench simulate` (add `-- --splice $PWD/README.md`
//! to write the table into README.md's `bench-simulate` part; `./bench.sh` does it for every
//! bench).
//!
//! Times lowering + simulation (including the dense baseline that sparse runs also simulate) of
//! each case, seven times, and prints the first run's, the median and the minimum wall time and
//! the process's peak resident memory. Each case is named by the `tpusim run` flags of its job
//! and a label derived from the job it resolves to (kernel, shape, mask, blocks), so a label cannot
//! disagree with what ran; a job tpusim refuses is reported as refused, with the reason. A bench
//! binary, not a test: nothing here asserts a time.

use std::time::Instant;
use tpusim_job::{run, Job, JobSpec};

/// The allocator the shipped binary uses (`tpusim_io::alloc`; its `main` calls
/// `tune_process_heap`, as this bench's does), so that bench figures are the binary's.
#[global_allocator]
static GLOBAL: tpusim_io::alloc::Split = tpusim_io::alloc::Split;

/// A case: the job as `tpusim run` flags would give it.
fn spec(args: &[(&str, &str)]) -> JobSpec {
    let mut text = String::new();
    for (k, v) in args {
        text.push_str(&format!("{k} = {v}\n"));
    }
    toml::from_str(&text).expect("bench spec")
}

/// What the job resolves to, in a few words.
fn label(job: &Job) -> String {
    match job {
        Job::Attention { workload: w, config: c, direction, .. } => format!(
            "{} {}: {} tokens x {} heads, d {}, mask {}, {}, blocks {}/{}/{}",
            c.kernel,
            direction,
            w.q_len,
            w.q_heads,
            w.head_dim,
            w.mask,
            c.traversal,
            c.block_q,
            c.block_kv,
            c.block_kv_compute
        ),
        Job::Matmul { workload: m, config: c, .. } => {
            format!("{} matmul {}x{}x{}, blocks {}/{}/{}", c.kernel, m.m, m.n, m.k, c.block_m, c.block_n, c.block_k)
        }
        Job::Described(d) => format!("Pallas kernel `{}` from {}", d.kernel_name, d.file),
    }
}

fn main() {
    tpusim_io::alloc::tune_process_heap();
    let default_trace = concat!(env!("CARGO_MANIFEST_DIR"), "/../../traces/video-720p-dense.toml");
    let cases: Vec<JobSpec> = vec![
        // `tpusim run` with no flags runs this trace.
        JobSpec::from_toml_file(default_trace).expect("traces/video-720p-dense.toml"),
        spec(&[
            ("mask", "\"band:15000+sink:3600\""),
            ("kernel", "\"sparse-splash\""),
            ("traversal", "\"compact\""),
            ("masking", "\"partial\""),
            ("block_q", "3328"),
            ("block_kv", "1536"),
        ]),
        spec(&[
            ("seq_len", "302400"),
            ("mask", "\"band:60000+sink:14400\""),
            ("kernel", "\"sparse-splash\""),
            ("traversal", "\"compact\""),
            ("masking", "\"partial\""),
            ("block_q", "3328"),
            ("block_kv", "1536"),
        ]),
        spec(&[
            ("seq_len", "1048576"),
            ("heads", "16"),
            ("mask", "\"causal\""),
            ("kernel", "\"tokamax-splash\""),
            ("traversal", "\"compact\""),
            ("masking", "\"partial\""),
            ("block_q", "4096"),
            ("block_kv", "2048"),
        ]),
        spec(&[("seq_len", "1048576"), ("heads", "16"), ("mask", "\"causal\""), ("kernel", "\"flash-attention\""), ("block_q", "1024"), ("block_kv", "1024")]),
        spec(&[("seq_len", "16384"), ("heads", "1"), ("kernel", "\"tokamax-splash\""), ("block_q", "8192"), ("block_kv", "8192"), ("vmem_limit_mib", "128")]),
        // Refused for SMEM (JAX Splash prefetches its mask metadata): reported, not unwrapped.
        spec(&[("seq_len", "1048576"), ("kernel", "\"splash\""), ("chip", "\"v5p\""), ("mask", "\"causal\""), ("block_q", "1024"), ("block_kv", "1024")]),
    ];
    let mut table = String::from("| job (`tpusim run` flags) | what it resolves to | grid steps | first run ms | median ms | min ms |\n|---|---|---:|---:|---:|---:|\n");
    println!("simulate: each case run 7 times (lowering + simulation, the dense baseline included)");
    for s in cases {
        let flags = s.to_flags();
        let flags = if flags.is_empty() { "(the defaults)".to_string() } else { flags };
        let built = s.chip().map_err(|e| e.to_string()).and_then(|chip| s.build(&chip).map(|j| (chip, j)).map_err(|e| e.to_string()));
        let (chip, job) = match built {
            Ok(x) => x,
            Err(e) => {
                println!("  {flags}: refused: {e}");
                table.push_str(&format!("| `{flags}` | refused: {} | | | | |\n", e.replace('|', "/")));
                continue;
            }
        };
        let name = label(&job);
        let mut times = Vec::new();
        let mut steps = 0;
        let mut refused = None;
        for _ in 0..7 {
            let t = Instant::now();
            match run(&chip, &job) {
                Ok(r) => steps = r.result.grid_steps,
                Err(e) => {
                    refused = Some(e.to_string());
                    break;
                }
            }
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        if let Some(e) = refused {
            println!("  {flags}: {name}: refused: {e}");
            table.push_str(&format!("| `{flags}` | {name}: refused: {} | | | | |\n", e.replace('|', "/")));
            continue;
        }
        let first = times[0];
        times.sort_by(f64::total_cmp);
        let (median, min) = (times[times.len() / 2], times[0]);
        println!("  {flags}\n    {name}: {steps} grid steps, first run {first:.2} ms, median {median:.2} ms, min {min:.2} ms");
        table.push_str(&format!("| `{flags}` | {name} | {steps} | {first:.2} | {median:.2} | {min:.2} |\n"));
    }
    let rss = tpusim_io::bench::peak_rss_mib().map_or(String::new(), |m| format!(" Peak resident memory of the bench process: {m:.0} MiB."));
    println!("{}", rss.trim());
    table.push_str(&format!(
        "\nGenerated by `cargo bench -p tpusim-job --bench simulate` on {}: wall times of single runs (one thread), seven runs each; the first run of a case fills the caches later runs of the same process reuse (attention body prototypes, step memos), as a sweep's points do.{rss}\n",
        tpusim_io::bench::machine_and_date()
    ));
    if let Err(e) = tpusim_io::bench::splice_table("bench-simulate", &table) {
        eprintln!("{e}");
        std::process::exit(1);
    }
}
