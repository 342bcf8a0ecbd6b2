//! Sampled points of every sweep path equal an independent `tpusim run` of the same job exactly:
//! timing-only axes (points sharing one lowering, re-timed on their own chips), block axes (a
//! lowering per point), the cached dense baselines, and with `--what-if-2x` the what-if columns.

use tpusim_job::{run, Report};
use tpusim_sweep::{run_sweep, SweepDef, SweepOptions};

/// Parses a CSV sweep output into (column names, rows); rows have no quoted commas here except
/// in `mask` values, which the csv crate handles.
fn read_csv(path: &std::path::Path) -> (Vec<String>, Vec<Vec<String>>) {
    let text = std::fs::read_to_string(path).unwrap();
    let body: String = text.lines().skip(1).map(|l| format!("{l}\n")).collect();
    let mut r = csv::ReaderBuilder::new().has_headers(true).from_reader(body.as_bytes());
    let cols = r.headers().unwrap().iter().map(str::to_string).collect();
    let rows = r.records().map(|x| x.unwrap().iter().map(str::to_string).collect()).collect();
    (cols, rows)
}

fn check_sweep(text: &str, what_if: bool, every: usize) {
    let def = SweepDef::parse(text, "exact.toml", &[]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.csv");
    let opts = SweepOptions { jobs: Some(2), what_if_2x: what_if, ..SweepOptions::new(out.to_str().unwrap()) };
    run_sweep(&def, &opts).unwrap();
    let (cols, rows) = read_csv(&out);
    let col = |n: &str| cols.iter().position(|c| c == n).unwrap_or_else(|| panic!("no column {n} in {cols:?}"));
    assert_eq!(cols.contains(&"bottleneck".to_string()), what_if, "the bottleneck column comes with --what-if-2x only");
    let mut checked = 0;
    for (i, row) in rows.iter().enumerate().step_by(every) {
        let p = def.point(i as u64);
        let chip = p.spec.chip().unwrap();
        let Ok(job) = p.spec.build(&chip) else {
            assert!(!row[col("error")].is_empty(), "row {i}");
            continue;
        };
        let Ok(r) = run(&chip, &job) else {
            assert!(!row[col("error")].is_empty(), "row {i}");
            continue;
        };
        let rep = Report::from_run(&r);
        let got = |n: &str| row[col(n)].parse::<f64>().unwrap_or_else(|e| panic!("row {i} {n} = '{}': {e}", row[col(n)]));
        assert_eq!(got("latency_ms"), rep.latency_ms, "row {i}: latency");
        assert_eq!(got("cycles"), rep.cycles, "row {i}: cycles");
        assert_eq!(got("hbm_bytes") as u64, rep.hbm_bytes, "row {i}: bytes");
        if let Some(d) = rep.dense_latency_ms {
            assert_eq!(got("dense_latency_ms"), d, "row {i}: dense baseline");
        }
        for u in tpusim_model::Unit::ALL {
            assert_eq!(got(&format!("busy_ms_{u}")), rep.busy_ms[*u], "row {i}: busy {u}");
        }
        if what_if {
            assert_eq!(row[col("bottleneck")], rep.bottleneck.to_string(), "row {i}");
            let co: Vec<&str> = rep.co_bound.iter().map(|u| u.word()).collect();
            assert_eq!(row[col("co_bound")], co.join(";"), "row {i}");
            for w in rep.what_if_2x.as_ref().unwrap().iter().filter(|w| w.unit != "host") {
                assert_eq!(got(&format!("gain_2x_{}", w.unit)), w.gain, "row {i}: gain of {}", w.unit);
            }
        }
        checked += 1;
    }
    assert!(checked >= 4, "{checked} rows checked");
}

#[test]
fn timing_only_points_equal_independent_runs() {
    check_sweep(
        "[base]\nheads = 2\nseq_len = 9000\nmask = \"band:2000+sink:512\"\nkernel = \"sparse-splash\"\ntraversal = \"compact\"\nmasking = \"partial\"\nblock_q = 1024\nblock_kv = 512\n\
         [axes]\n\"chip.hbm.bandwidth_gb_per_s\" = [819, 1638, 3276]\n\"chip.fitted.valu_vreg_ops_per_cycle\" = [1.5, 3.0, 6.0]\n\"chip.device.clock_ghz\" = [1.2, 1.75]\n",
        false,
        1,
    );
}

#[test]
fn block_axes_and_chips_equal_independent_runs() {
    check_sweep(
        "[base]\nheads = 2\nseq_len = 8192\nkernel = \"tokamax-splash\"\n[axes]\nchip = [\"v6e\", \"v5e\", \"v7x\"]\nmask = [\"causal\", \"full\"]\nblock_q = [512, 1024, 2048]\nblock_kv = [512, 1024]\n",
        false,
        3,
    );
}

#[test]
fn what_if_columns_equal_independent_runs() {
    check_sweep(
        "[base]\nheads = 2\nseq_len = 8192\nmask = \"causal\"\nkernel = \"tokamax-splash\"\n[axes]\nblock_q = [512, 2048]\n\"chip.hbm.bandwidth_gb_per_s\" = [819, 3276]\n\"chip.fitted.eup_vregs_per_cycle\" = [0.25, 1.0]\n",
        true,
        1,
    );
}
