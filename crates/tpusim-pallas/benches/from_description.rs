//! Times the Rust part of the IR path: a kernel description file read, lowered and simulated
//! (JAX Splash forward, 10 heads x 75,776 tokens x 128, full mask, blocks 512, written by
//! `tpusim.jax.describe`; the goal is well under 100 ms). `cargo bench -p tpusim-pallas`.

use std::path::Path;
use std::time::Instant;
use tpusim_chip::ChipModel;

fn main() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/data/splash_full_75776_b512.json");
    let chip = ChipModel::preset("v6e").expect("preset");
    // Per iteration: (total, read, lower, simulate, CPU) in ms.
    let mut times: Vec<[f64; 5]> = Vec::new();
    let mut latency = 0.0;
    for _ in 0..5 {
        let t = Instant::now();
        let cpu0 = tpusim_io::bench::cpu_seconds().unwrap_or(0.0);
        let (d, dir) = tpusim_pallas::Description::read(&path).expect("description");
        let read = t.elapsed().as_secs_f64() * 1e3;
        let (p, _) = tpusim_pallas::lower(&chip, &d, &dir).expect("lowers");
        let lowered = t.elapsed().as_secs_f64() * 1e3;
        let r = tpusim_engine::simulate(&chip, &p);
        let total = t.elapsed().as_secs_f64() * 1e3;
        let cpu = (tpusim_io::bench::cpu_seconds().unwrap_or(0.0) - cpu0) * 1e3;
        times.push([total, read, lowered - read, total - lowered, cpu]);
        latency = r.seconds * 1e3;
    }
    times.sort_by(|a, b| a[0].total_cmp(&b[0]));
    let [total, read, lower, sim, _] = times[2];
    let mut cpu: Vec<f64> = times.iter().map(|t| t[4]).collect();
    cpu.sort_by(f64::total_cmp);
    println!(
        "splash fwd 10 x 75776 x 128 full, blocks 512 (v6e): read + lower + simulate median {total:.1} ms wall (min {:.1}; of the median run: read {read:.1}, lower {lower:.1}, simulate {sim:.1}), median {:.1} ms CPU; predicted {latency:.3} ms",
        times[0][0], cpu[2]
    );
}
