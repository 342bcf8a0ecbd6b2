//! End-to-end tests of `tpusim sweep`, `tpusim merge` and `tpusim tune` (issue 5), through the
//! binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tpusim"))
}

/// A fresh scratch folder for one test.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tpusim-sweep-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn run(args: &[&str], dir: &Path) -> Output {
    bin().args(args).current_dir(dir).output().expect("tpusim runs")
}

fn ok(args: &[&str], dir: &Path) -> String {
    let o = run(args, dir);
    assert!(o.status.success(), "tpusim {args:?} failed: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn fails(args: &[&str], dir: &Path) -> String {
    let o = run(args, dir);
    assert_eq!(o.status.code(), Some(2), "tpusim {args:?} should fail with exit code 2; stdout {}", String::from_utf8_lossy(&o.stdout));
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// 36 small points: 3 block_q x 3 block_kv x 2 masks x 2 HBM bandwidths; block_q 8192 overflows the
/// 32 MiB scoped VMEM limit, so some rows carry errors.
const SMALL: &str = r#"
[base]
heads = 2
seq_len = 8192
traversal = "compact"
masking = "partial"

[axes]
mask = ["causal", "local:1000,1000"]
block_q = [512, 2048, 8192]
block_kv = [512, 1024, 8192]
"chip.hbm.bandwidth_gb_per_s" = [819, 3276]
"#;

#[test]
fn shards_merged_equal_the_unsharded_sweep_byte_for_byte() {
    let d = scratch("shards");
    std::fs::write(d.join("small.toml"), SMALL).unwrap();
    for ext in ["csv", "jsonl"] {
        let whole = format!("whole.{ext}");
        let out = ok(&["sweep", "small.toml", "--out", &whole, "--no-progress"], &d);
        assert!(out.contains("36 points") && out.contains("36 computed"), "{out}");
        let shards: Vec<String> = (0..3).map(|i| format!("s{i}.{ext}")).collect();
        for (i, s) in shards.iter().enumerate() {
            ok(&["sweep", "small.toml", "--shard", &format!("{i}/3"), "--out", s, "-j", "1"], &d);
        }
        // Shards in any order.
        let merged = format!("merged.{ext}");
        let out = ok(&["merge", &shards[2], &shards[0], &shards[1], "--out", &merged], &d);
        assert!(out.contains("36 points"), "{out}");
        assert_eq!(read(&d.join(&merged)), read(&d.join(&whole)), "{ext}: merged shards differ from the unsharded sweep");

        // A missing shard, a duplicated shard.
        let e = fails(&["merge", &shards[0], &shards[2], "--out", "bad.out"], &d);
        assert!(e.contains("12 of 36 points are missing") && e.contains("shard 1 of 3"), "{e}");
        let e = fails(&["merge", &shards[0], &shards[1], &shards[2], &shards[1], "--out", "bad.out"], &d);
        assert!(e.contains("in both"), "{e}");
        assert!(!d.join("bad.out").exists());
    }
    // A shard of a different sweep is refused.
    std::fs::write(d.join("other.toml"), SMALL.replace("[819, 3276]", "[819, 1638]")).unwrap();
    ok(&["sweep", "other.toml", "--shard", "1/3", "--out", "other1.csv"], &d);
    let e = fails(&["merge", "s0.csv", "other1.csv", "s2.csv", "--out", "bad.csv"], &d);
    assert!(e.contains("not shards of one sweep") && e.contains("definition"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn sweep_rows_hold_inputs_metrics_and_errors_in_index_order() {
    let d = scratch("rows");
    std::fs::write(d.join("small.toml"), SMALL).unwrap();
    ok(&["sweep", "small.toml", "--out", "a.csv", "-j", "2"], &d);
    let text = String::from_utf8(read(&d.join("a.csv"))).unwrap();
    let mut lines = text.lines();
    let header = lines.next().unwrap();
    assert!(header.starts_with("# tpusim sweep: points=36 shard=0/1 definition="), "{header}");
    let cols: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(&cols[..5], &["index", "mask", "block_q", "block_kv", "chip.hbm.bandwidth_gb_per_s"]);
    for c in [
        "latency_ms",
        "mfu",
        "util_mxu",
        "hbm_bytes",
        "grid_steps",
        "tiles_partial",
        "tile_density",
        "tile_skip_efficiency",
        "dense_latency_ms",
        "error",
    ] {
        assert!(cols.contains(&c), "column {c} missing from {cols:?}");
    }
    // The bottleneck column is the what-if rule's and comes with --what-if-2x only (a file of
    // its own: its definition differs, so it never resumes from or merges with this one).
    assert!(!cols.contains(&"bottleneck"), "{cols:?}");
    let e = fails(&["sweep", "small.toml", "--out", "a.csv", "--what-if-2x"], &d);
    assert!(e.contains("not this sweep") && e.contains("-what-if-2x"), "{e}");
    ok(&["sweep", "small.toml", "--out", "w.csv", "--what-if-2x"], &d);
    let wt = String::from_utf8(read(&d.join("w.csv"))).unwrap();
    let wcols: Vec<&str> = wt.lines().nth(1).unwrap().split(',').collect();
    for c in ["bottleneck", "co_bound", "gain_2x_mxu", "gain_2x_hbm", "gain_2x_step_control"] {
        assert!(wcols.contains(&c), "{c} missing from {wcols:?}");
    }
    let col = |name: &str| cols.iter().position(|c| *c == name).unwrap();
    let rows: Vec<Vec<String>> = lines.map(split_csv).collect();
    assert_eq!(rows.len(), 36);
    let mut errors = 0;
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r.len(), cols.len(), "row {i}");
        assert_eq!(r[0], i.to_string(), "rows are in index order");
        let err = &r[col("error")];
        // At block_q 8192 the kernel's (block_q, 128) buffers alone - q positions double-buffered,
        // m and l scratch, the f32 accumulator - pass the 32 MiB scoped limit, whatever block_kv.
        if r[col("block_q")] == "8192" {
            assert!(err.contains("VMEM"), "row {i}: {err}");
            assert!(r[col("latency_ms")].is_empty());
            errors += 1;
        } else {
            assert!(err.is_empty(), "row {i}: {err}");
            assert!(r[col("latency_ms")].parse::<f64>().unwrap() > 0.0);
        }
    }
    assert_eq!(errors, 12);
    // The last axis varies fastest; a faster HBM never makes a point slower.
    assert_eq!(rows[0][col("chip.hbm.bandwidth_gb_per_s")], "819");
    assert_eq!(rows[1][col("chip.hbm.bandwidth_gb_per_s")], "3276");
    let lat = |r: &Vec<String>| r[col("latency_ms")].parse::<f64>().unwrap();
    assert!(lat(&rows[1]) <= lat(&rows[0]));
    let _ = std::fs::remove_dir_all(&d);
}

fn split_csv(line: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                out.last_mut().unwrap().push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(String::new()),
            c => out.last_mut().unwrap().push(c),
        }
    }
    out
}

#[test]
fn an_interrupted_sweep_resumes_to_the_same_file() {
    let d = scratch("resume");
    std::fs::write(d.join("small.toml"), SMALL).unwrap();
    ok(&["sweep", "small.toml", "--out", "ref.csv"], &d);
    let reference = read(&d.join("ref.csv"));
    let text = String::from_utf8(reference.clone()).unwrap();
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    // What a kill leaves: the header, rows finished out of order, and a row cut off mid-line.
    let mut partial = format!("{}{}", lines[0], lines[1]);
    for i in [7usize, 2, 30, 11, 3] {
        partial.push_str(lines[2 + i]);
    }
    partial.push_str(&lines[2 + 20][..25]);
    std::fs::write(d.join("out.csv.partial"), &partial).unwrap();
    let out = ok(&["sweep", "small.toml", "--out", "out.csv"], &d);
    assert!(out.contains("31 computed, 5 resumed"), "{out}");
    assert_eq!(read(&d.join("out.csv")), reference);
    assert!(!d.join("out.csv.partial").exists());
    // Rerunning a finished sweep computes nothing and leaves the same bytes.
    let out = ok(&["sweep", "small.toml", "--out", "out.csv"], &d);
    assert!(out.contains("0 computed, 36 resumed"), "{out}");
    assert_eq!(read(&d.join("out.csv")), reference);
    // A partial file of another sweep is not mixed in: refused, or replaced with --force.
    std::fs::write(d.join("other.toml"), SMALL.replace("heads = 2", "heads = 4")).unwrap();
    std::fs::write(d.join("o.csv.partial"), &partial).unwrap();
    let refused = Command::new(env!("CARGO_BIN_EXE_tpusim")).args(["sweep", "other.toml", "--out", "o.csv"]).current_dir(&d).output().unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("another sweep"), "{}", String::from_utf8_lossy(&refused.stderr));
    let out = ok(&["sweep", "other.toml", "--out", "o.csv", "--force"], &d);
    assert!(out.contains("36 computed, 0 resumed") && out.contains("replaced"), "{out}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn killing_a_sweep_midway_and_rerunning_gives_the_uninterrupted_file() {
    let d = scratch("kill");
    // About 3 ms a point: the single-threaded run is killed after its first flushed rows.
    let sweep = r#"
[base]
heads = 4
seq_len = 32768
mask = "band:6000+sink:1024"
traversal = "compact"
masking = "partial"
[axes]
"chip.hbm.bandwidth_gb_per_s" = [819, 1228, 1638, 2458, 3276, 4915]
block_q = [1024, 1536, 2048, 2560, 3072]
block_kv = [512, 1024, 1536, 2048, 3072, 4096]
mask_source = ["computed", "loaded"]
"#;
    std::fs::write(d.join("k.toml"), sweep).unwrap();
    ok(&["sweep", "k.toml", "--out", "ref.jsonl", "-j", "2"], &d);
    let reference = read(&d.join("ref.jsonl"));

    let mut child = bin().args(["sweep", "k.toml", "--out", "out.jsonl", "-j", "1"]).current_dir(&d).spawn().unwrap();
    let partial = d.join("out.jsonl.partial");
    let start = Instant::now();
    let mut rows_at_kill = 0;
    loop {
        let rows = std::fs::read_to_string(&partial).map(|t| t.lines().count().saturating_sub(1)).unwrap_or(0);
        if rows >= 20 {
            child.kill().unwrap();
            rows_at_kill = rows;
            break;
        }
        if child.try_wait().unwrap().is_some() || start.elapsed() > Duration::from_secs(60) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait().unwrap();
    assert!(rows_at_kill >= 20 && !d.join("out.jsonl").exists(), "the sweep finished before it could be killed");
    let out = ok(&["sweep", "k.toml", "--out", "out.jsonl", "-j", "2"], &d);
    let resumed: u64 = out.split(" resumed").next().unwrap().rsplit(' ').next().unwrap().parse().unwrap();
    assert!(resumed >= 20 && out.contains(&format!("{} computed", 360 - resumed)), "{out}");
    assert_eq!(read(&d.join("out.jsonl")), reference, "the resumed sweep differs from the uninterrupted one");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn bad_sweep_files_and_flags_are_input_errors_naming_file_and_key() {
    let d = scratch("bad");
    let cases = [
        ("[axes]\nblock_q = [512]\nblok_kv = [512]\n", "blok_kv"),
        ("[axes]\nblock_q = [\"wide\"]\n", "axes.block_q[0]"),
        ("[axes]\n", "[axes] is empty"),
        ("[axes]\nblock_q = []\n", "axes.block_q is empty"),
        ("[axes]\n\"chip.hbm.bandwith_gb_per_s\" = [1000]\n", "bandwith"),
        ("[base]\nheads = \"ten\"\n[axes]\nblock_q = [512]\n", "heads"),
    ];
    for (i, (text, key)) in cases.iter().enumerate() {
        let f = format!("bad{i}.toml");
        std::fs::write(d.join(&f), text).unwrap();
        let e = fails(&["sweep", &f], &d);
        assert!(e.contains(&f) && e.contains(key), "{text:?}: {e}");
    }
    std::fs::write(d.join("good.toml"), "[axes]\nblock_q = [512]\n").unwrap();
    let e = fails(&["sweep", "good.toml", "--shard", "3/3"], &d);
    assert!(e.contains("--shard 3/3"), "{e}");
    let e = fails(&["sweep", "good.toml", "--set", "mxu.count=0"], &d);
    assert!(e.contains("mxu.count"), "{e}");
    std::fs::write(d.join("notes.csv"), "my notes\n").unwrap();
    let e = fails(&["sweep", "good.toml", "--out", "notes.csv"], &d);
    assert!(e.contains("not a tpusim sweep output"), "{e}");
    assert_eq!(read(&d.join("notes.csv")), b"my notes\n");
    // An extension that is neither CSV nor JSON lines is refused, not written as CSV.
    let e = fails(&["sweep", "good.toml", "--out", "x.parquet"], &d);
    assert!(e.contains("--out x.parquet") && e.contains("--format csv|jsonl"), "{e}");
    assert!(!d.join("x.parquet").exists() && !d.join("x.parquet.partial").exists());
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn set_overrides_apply_to_sweep_and_tune() {
    let d = scratch("set");
    std::fs::write(d.join("s.toml"), "[base]\nheads = 2\nseq_len = 8192\n[axes]\nblock_q = [1024, 2048]\n").unwrap();
    ok(&["sweep", "s.toml", "--out", "a.jsonl"], &d);
    ok(&["sweep", "s.toml", "--out", "b.jsonl", "--set", "fitted.valu_vreg_ops_per_cycle=5.4"], &d);
    let lat = |f: &str| -> Vec<f64> {
        std::fs::read_to_string(d.join(f))
            .unwrap()
            .lines()
            .skip(1)
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["latency_ms"].as_f64().unwrap())
            .collect()
    };
    let (a, b) = (lat("a.jsonl"), lat("b.jsonl"));
    assert!(a.iter().zip(&b).all(|(a, b)| b < a), "{a:?} vs {b:?}");

    let tune = |set: &[&str]| -> f64 {
        let mut args = vec!["tune", "--heads", "2", "--seq-len", "4096", "--mask", "causal", "--format", "json", "--top", "1"];
        args.extend_from_slice(set);
        let v: serde_json::Value = serde_json::from_str(&ok(&args, &d)).unwrap();
        v["top"][0]["latency_ms"].as_f64().unwrap()
    };
    assert!(tune(&["--set", "fitted.valu_vreg_ops_per_cycle=5.4"]) < tune(&[]));
    let e = fails(&["tune", "--set", "mxu.cont=4"], &d);
    assert!(e.contains("mxu.cont"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn tune_on_the_sparse_video_case_beats_the_study_blocks() {
    let d = scratch("tune");
    let job = [
        "--heads",
        "10",
        "--seq-len",
        "75600",
        "--head-dim",
        "128",
        "--mask",
        "band:15000+sink:3600",
        "--traversal",
        "compact",
        "--masking",
        "partial",
    ];
    let mut args = vec!["tune"];
    args.extend_from_slice(&job);
    args.extend_from_slice(&["--format", "json", "--top", "5"]);
    let v: serde_json::Value = serde_json::from_str(&ok(&args, &d)).unwrap();
    let top = v["top"].as_array().unwrap();
    assert_eq!(top.len(), 5);
    let lats: Vec<f64> = top.iter().map(|t| t["latency_ms"].as_f64().unwrap()).collect();
    assert!(lats.windows(2).all(|w| w[0] <= w[1]), "ranked by latency: {lats:?}");
    for t in top {
        let c = &t["job"]["config"];
        assert_eq!((c["traversal"].as_str(), c["masking"].as_str()), (Some("compact"), Some("partial")), "given options are held fixed");
        assert!(c["block_q"].as_u64().unwrap() % 8 == 0 && c["block_kv"].as_u64().unwrap() % 128 == 0);
        assert!(t["vmem_bytes"].as_u64() <= t["vmem_limit_bytes"].as_u64());
        assert!(t["bottleneck"].as_str().is_some());
    }

    let mut args = vec!["run"];
    args.extend_from_slice(&job);
    args.extend_from_slice(&["--block-q", "3328", "--block-kv", "1536", "--format", "json"]);
    let study: serde_json::Value = serde_json::from_str(&ok(&args, &d)).unwrap();
    let study_ms = study["latency_ms"].as_f64().unwrap();
    assert!(lats[0] <= study_ms, "tuned {} ms vs 3328 x 1536 {study_ms} ms", lats[0]);
    // The table names the limiting unit and the best configuration's flags.
    let mut args = vec!["tune"];
    args.extend_from_slice(&job);
    args.extend_from_slice(&["--top", "3", "--block-kv", "1536"]);
    let table = ok(&args, &d);
    assert!(table.contains("bottleneck") && table.contains("best: tpusim run") && table.contains("block_kv 1536"), "{table}");
    let _ = std::fs::remove_dir_all(&d);
}

/// Files in a folder, sorted.
fn listing(d: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

#[test]
fn outputs_are_checked_before_work_and_files_tpusim_did_not_write_are_never_replaced() {
    // Issue 13, item 3.
    let d = scratch("outputs");
    std::fs::write(d.join("good.toml"), "[base]\nheads = 2\nseq_len = 2048\n[axes]\nblock_q = [512, 1024]\n").unwrap();
    std::fs::write(d.join("notes.csv"), "my notes\n").unwrap();
    // --restart ignores earlier rows, not the rule: a file that is not a sweep output stays.
    let e = fails(&["sweep", "good.toml", "--restart", "--out", "notes.csv"], &d);
    assert!(e.contains("notes.csv") && e.contains("not a tpusim sweep output"), "{e}");
    assert_eq!(read(&d.join("notes.csv")), b"my notes\n");
    // Nor is a foreign file where the unfinished rows would go.
    std::fs::write(d.join("out.csv.partial"), "draft\n").unwrap();
    for restart in [false, true] {
        let mut a = vec!["sweep", "good.toml", "--out", "out.csv"];
        if restart {
            a.push("--restart");
        }
        let e = fails(&a, &d);
        assert!(e.contains("out.csv.partial") && e.contains("not a tpusim sweep output"), "{e}");
        assert_eq!(read(&d.join("out.csv.partial")), b"draft\n");
        assert!(!d.join("out.csv").exists());
    }
    std::fs::remove_file(d.join("out.csv.partial")).unwrap();
    // A sweep refused on its arguments leaves nothing behind.
    let before = listing(&d);
    for bad in [vec!["--jobs", "0"], vec!["--jobs", "-1"], vec!["--out", ""], vec!["--out", "no/such/folder/x.csv"]] {
        let mut a = vec!["sweep", "good.toml"];
        a.extend(&bad);
        let e = fails(&a, &d);
        assert!(e.contains(bad[0]), "{bad:?}: {e}");
        assert_eq!(listing(&d), before, "{bad:?} left files behind");
    }
    // merge: never into one of its inputs (under any spelling), never over a foreign file.
    ok(&["sweep", "good.toml", "--shard", "0/2", "--out", "s0.csv"], &d);
    ok(&["sweep", "good.toml", "--shard", "1/2", "--out", "s1.csv"], &d);
    let s0 = read(&d.join("s0.csv"));
    for out in ["s0.csv", "./s0.csv"] {
        let e = fails(&["merge", "s0.csv", "s1.csv", "--out", out], &d);
        assert!(e.contains("one of the files to merge"), "{e}");
        assert_eq!(read(&d.join("s0.csv")), s0);
    }
    let e = fails(&["merge", "s0.csv", "s1.csv", "--out", "notes.csv"], &d);
    assert!(e.contains("not a tpusim sweep output"), "{e}");
    assert_eq!(read(&d.join("notes.csv")), b"my notes\n");
    // A sweep output (of any sweep) is replaced as before.
    ok(&["merge", "s0.csv", "s1.csv", "--out", "merged.csv"], &d);
    ok(&["merge", "s0.csv", "s1.csv", "--out", "merged.csv"], &d);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn sweep_rows_name_the_chip_model_of_each_point() {
    // Issue 13, item 1: points on different models (an axis over a chip field, a --set on the
    // base) are told apart by their rows.
    let d = scratch("chip-model");
    std::fs::write(
        d.join("s.toml"),
        "[base]\nheads = 2\nseq_len = 2048\nchip = \"v6e\"\n[axes]\n\"chip.hbm.bandwidth_gb_per_s\" = [819, 3276]\n",
    )
    .unwrap();
    ok(&["sweep", "s.toml", "--out", "a.jsonl", "--set", "fitted.valu_vreg_ops_per_cycle=5.4"], &d);
    let rows: Vec<serde_json::Value> =
        std::fs::read_to_string(d.join("a.jsonl")).unwrap().lines().skip(1).map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 2);
    for (r, bw) in rows.iter().zip(["819", "3276"]) {
        assert_eq!(r["chip_source"], "preset");
        assert_eq!(r["chip_set"], format!("fitted.valu_vreg_ops_per_cycle=5.4;hbm.bandwidth_gb_per_s={bw}"));
    }
    let h: Vec<&str> = rows.iter().map(|r| r["chip_hash"].as_str().unwrap()).collect();
    assert!(h[0].len() == 12 && h[0] != h[1], "{h:?}");
    // The hash is the one `tpusim run` reports for the same model.
    let run = ok(
        &[
            "run",
            "--heads",
            "2",
            "--seq-len",
            "2048",
            "--set",
            "fitted.valu_vreg_ops_per_cycle=5.4",
            "--set",
            "hbm.bandwidth_gb_per_s=3276",
            "--format",
            "json",
        ],
        &d,
    );
    let run: serde_json::Value = serde_json::from_str(&run).unwrap();
    assert_eq!(run["chip_model"]["hash"].as_str(), Some(h[1]));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn sweep_row_errors_name_fields_as_the_sweep_file_gives_them() {
    // Issue 13, item 5: a row's error names the keys of the sweep file (a length given as
    // seq_len is seq_len), not the flags or internal names.
    let d = scratch("row-errors");
    std::fs::write(d.join("e.toml"), "[base]\nheads = 2\nseq_len = 2048\n[axes]\nblock_q = [100, 512]\n").unwrap();
    ok(&["sweep", "e.toml", "--out", "e.jsonl"], &d);
    let text = std::fs::read_to_string(d.join("e.jsonl")).unwrap();
    let row: serde_json::Value = serde_json::from_str(text.lines().nth(1).unwrap()).unwrap();
    let e = row["error"].as_str().unwrap();
    assert!(e.starts_with("block_q = 100:") && e.contains("seq_len (2048)") && !e.contains('`') && !e.contains(" q_len"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

/// `tune --block-sizes` (a fresh user's finding): two ranks with the same `BlockSizes` (they
/// differ in an option that is not a block size) are told apart on the second's line.
#[test]
fn tune_block_sizes_lines_mark_a_repeated_block_size() {
    let dir = scratch("tune-block-sizes");
    let out = ok(&["tune", "--heads", "16", "--seq-len", "16384", "--mask", "causal", "--block-sizes", "--top", "6"], &dir);
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("BlockSizes(") || l.starts_with("SplashConfig(")).collect();
    assert_eq!(lines.len(), 6, "{out}");
    let mut seen: Vec<&str> = Vec::new();
    let mut repeats = 0;
    for l in &lines {
        let b = &l[..l.find(')').unwrap() + 1];
        let marked = l.contains("(the same blocks as rank ");
        assert_eq!(marked, seen.contains(&b), "{l}");
        if marked {
            repeats += 1;
            assert!(l.contains("; differs in --"), "{l}");
        }
        seen.push(b);
    }
    assert!(repeats > 0, "no repeated BlockSizes in the top 6 to check: {out}");
}

/// `tune --block-sizes` writes each family's own config call (tokamax's `SplashConfig`, JAX
/// Splash's `BlockSizes`), and a design what-if's line carries the table's `*` with the option.
#[test]
fn tune_block_sizes_lines_use_the_kernels_config_and_star_design_what_ifs() {
    let dir = scratch("tune-block-sizes-api");
    let job = ["tune", "--heads", "4", "--seq-len", "4096", "--block-sizes", "--top", "4", "--no-progress"];
    let tokamax = ok(&[&job[..], &["--kernel", "tokamax-splash"]].concat(), &dir);
    let jax = ok(&[&job[..], &["--kernel", "splash"]].concat(), &dir);
    let ranked = |out: &str| out.lines().filter(|l| l.contains("# rank ")).map(String::from).collect::<Vec<_>>();
    let (t, j) = (ranked(&tokamax), ranked(&jax));
    assert!(!t.is_empty() && t.iter().all(|l| l.starts_with("SplashConfig(block_q=")), "{tokamax}");
    assert!(!j.is_empty() && j.iter().all(|l| l.starts_with("BlockSizes(block_q=")), "{jax}");
    // JAX's Splash runs only the full grid: every compacted row is a design what-if, starred.
    for l in j.iter().filter(|l| l.contains("--traversal compact")) {
        assert!(l.contains("; * a design what-if: traversal compact"), "{l}");
    }
    for l in j.iter().filter(|l| l.contains("--traversal full-grid") && l.contains("--masking partial")) {
        assert!(!l.contains("* a design what-if"), "{l}");
    }
}

/// Issue 47, point 5: a sweep that runs a family with an option its library has no setting for
/// (JAX's Splash with the compacted grid) names it per row in `design_whatif` (CSV and JSON
/// lines) and notes it, as `run` notes and `tune` stars it; the rows the library runs as they
/// are leave the cell empty.
#[test]
fn design_what_if_rows_are_named_and_noted() {
    let d = scratch("design-whatif");
    std::fs::write(
        d.join("s.toml"),
        "[base]\nkernel = \"splash\"\nheads = 2\nseq_len = 4096\nmask = \"causal\"\nblock_q = 512\nblock_kv = 512\n[axes]\ntraversal = [\"full-grid\", \"compact\"]\n",
    )
    .unwrap();
    for ext in ["csv", "jsonl"] {
        let out = format!("s.{ext}");
        let text = ok(&["sweep", "s.toml", "--out", &out, "--no-progress"], &d);
        assert!(text.contains("1 of 2 rows are design what-ifs (column design_whatif)") && text.contains("point 1: traversal compact (splash runs full-grid)"), "{text}");
        let body = String::from_utf8(read(&d.join(&out))).unwrap();
        let cells: Vec<String> = if ext == "csv" {
            let mut lines = body.lines().filter(|l| !l.starts_with('#')).map(|l| tpusim_io::csv_fields(l).unwrap());
            let col = lines.next().unwrap().iter().position(|h| h == "design_whatif").expect("a design_whatif column");
            lines.map(|f| f[col].clone()).collect()
        } else {
            body.lines().skip(1).map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["design_whatif"].as_str().unwrap_or("").to_string()).collect()
        };
        assert_eq!(cells, ["", "traversal compact (splash runs full-grid)"], "{ext}");
    }
}

/// A sweep row names the input layout it ran with, also where it is the family's own (the cell
/// was empty there, as if the row had none): JAX's Splash takes [batch, heads, seq, head_dim],
/// tokamax's flash attention [batch, seq, heads, head_dim].
#[test]
fn every_attention_row_names_its_input_layout() {
    let d = scratch("input-layout");
    std::fs::write(
        d.join("s.toml"),
        "[base]\nheads = 2\nseq_len = 2048\nmask = \"causal\"\nblock_q = 512\nblock_kv = 512\n[axes]\nkernel = [\"splash\", \"tokamax-splash\"]\n",
    )
    .unwrap();
    ok(&["sweep", "s.toml", "--out", "s.csv", "--no-progress"], &d);
    let body = String::from_utf8(read(&d.join("s.csv"))).unwrap();
    let mut lines = body.lines().filter(|l| !l.starts_with('#')).map(|l| tpusim_io::csv_fields(l).unwrap());
    let head = lines.next().unwrap();
    let col = |name: &str| head.iter().position(|h| h == name).unwrap_or_else(|| panic!("no {name} column: {head:?}"));
    let (k, l) = (col("kernel"), col("input_layout"));
    let rows: Vec<(String, String)> = lines.map(|f| (f[k].clone(), f[l].clone())).collect();
    assert_eq!(rows.len(), 2, "{body}");
    for (kernel, layout) in &rows {
        assert!(!layout.is_empty(), "{kernel}: empty input_layout in {body}");
    }
    assert_ne!(rows[0].1, rows[1].1, "the two families take different layouts: {rows:?}");
}
