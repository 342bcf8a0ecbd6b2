//! Times the Rust part of the IR path: a kernel description file read, lowered and simulated
//! (JAX Splash forward, 10 heads x 75,776 tokens x 128, full mask, blocks 512, written by
//! `tpusim.jax.describe`; the goal is well under 100 ms). `cargo bench -p tpusim-pallas`.

use std::path::Path;
use std::time::Instant;
use tpusim_chip::ChipModel;

fn main() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/data/splash_full_75776_b512.json");
    let chip = ChipModel::preset("v6e").expect("preset");
    let mut times = Vec::new();
    let mut latency = 0.0;
    for _ in 0..5 {
        let t = Instant::now();
        let (d, dir) = tpusim_pallas::Description::read(&path).expect("description");
        let (p, _) = tpusim_pallas::lower(&chip, &d, &dir).expect("lowers");
        let r = tpusim_engine::simulate(&chip, &p);
        times.push(t.elapsed().as_secs_f64() * 1e3);
        latency = r.seconds * 1e3;
    }
    times.sort_by(f64::total_cmp);
    println!("splash fwd 10 x 75776 x 128 full, blocks 512 (v6e): read + lower + simulate median {:.1} ms (min {:.1}); predicted {latency:.3} ms", times[2], times[0]);
}
