//! A sweep stopped through its cancel flag (the CLI's Ctrl-C) keeps the rows it finished in
//! `OUT.partial`, says how many, leaves no lock file, and the same sweep run again resumes from
//! them to the output an uninterrupted run writes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tpusim_sweep::{run_sweep, SweepDef, SweepError, SweepOptions};

const SWEEP: &str = r#"
description = "interrupt"
[base]
chip = "v6e"
heads = 2
seq_len = 2048
[axes]
block_q = [256, 512, 1024]
block_kv = [256, 512, 1024]
"#;

#[test]
fn an_interrupted_sweep_says_what_it_kept_and_resumes_to_the_same_output() {
    let def = SweepDef::parse(SWEEP, "interrupt.toml", &[]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.csv");
    let out_s = out.to_str().unwrap();
    let partial = format!("{out_s}.partial");
    // Interrupted before any point starts: nothing computed, every row still to do.
    let flag = Arc::new(AtomicBool::new(true));
    let opts = SweepOptions { jobs: Some(2), cancel: Some(flag.clone()), ..SweepOptions::new(out_s) };
    match run_sweep(&def, &opts) {
        Err(SweepError::Interrupted { partial: p, rows, points }) => {
            assert_eq!((p.as_str(), rows, points), (partial.as_str(), 0, 9));
        }
        other => panic!("expected an interruption, got {other:?}"),
    }
    assert!(!out.exists(), "no output is written by an interrupted sweep");
    assert!(std::path::Path::new(&partial).exists(), "the partial file holds the header and the finished rows");
    assert!(!std::path::Path::new(&format!("{out_s}.lock")).exists(), "the lock file goes with the run");
    // Resumed without the interruption: the whole output, as a fresh run writes it.
    flag.store(false, Ordering::Relaxed);
    let summary = run_sweep(&def, &opts).unwrap();
    assert_eq!((summary.computed, summary.resumed), (9, 0));
    let fresh = dir.path().join("fresh.csv");
    run_sweep(&def, &SweepOptions { jobs: Some(2), ..SweepOptions::new(fresh.to_str().unwrap()) }).unwrap();
    assert_eq!(std::fs::read_to_string(&out).unwrap(), std::fs::read_to_string(&fresh).unwrap());
    assert!(!std::path::Path::new(&partial).exists());
}

#[test]
fn a_refused_run_leaves_no_lock_file() {
    let def = SweepDef::parse(SWEEP, "interrupt.toml", &[]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.csv");
    let out_s = out.to_str().unwrap();
    let shard = |i| tpusim_sweep::Shard::parse(&format!("{i}/3")).unwrap();
    run_sweep(&def, &SweepOptions { shard: shard(0), ..SweepOptions::new(out_s) }).unwrap();
    // Another shard onto the same output is refused once the run holds the output's lock.
    let err = run_sweep(&def, &SweepOptions { shard: shard(1), ..SweepOptions::new(out_s) }).unwrap_err();
    assert!(err.to_string().contains("holds another shard"), "{err}");
    assert!(!std::path::Path::new(&format!("{out_s}.lock")).exists());
}
