//! The example studies under studies/ parse, have the documented sizes, and their points run.

use tpusim_sweep::eval::Evaluator;
use tpusim_sweep::SweepDef;

fn study(name: &str) -> SweepDef {
    let path = format!("{}/../../studies/{name}", env!("CARGO_MANIFEST_DIR"));
    SweepDef::from_file(&path, &[]).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn every_study_parses_and_its_corner_points_run() {
    let dir = format!("{}/../../studies", env!("CARGO_MANIFEST_DIR"));
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|n| n.ends_with(".toml"))
        .collect();
    names.sort();
    assert!(names.len() >= 4, "{names:?}");
    let ev = Evaluator::new();
    for n in &names {
        let def = study(n);
        let first = ev.evaluate(&def.point(0).spec);
        assert!(first.report.is_ok(), "{n} point 0: {:?}", first.report.err());
        // The last point may be a tiling over the VMEM limit (a row with its error), nothing else.
        let last = ev.evaluate(&def.point(def.total() - 1).spec);
        assert!(last.report.as_ref().err().is_none_or(|e| e.contains("VMEM")), "{n} last point: {:?}", last.report.err());
    }
}

#[test]
fn studies_have_the_documented_points() {
    assert_eq!(study("video-10k.toml").total(), 10_000);
    assert_eq!(study("hbm-x-mxu-video.toml").total(), 126);
    let blocks = study("sparse-video-blocks.toml");
    assert_eq!(blocks.total(), 216);
    assert!((0..blocks.total()).any(|i| {
        let s = blocks.point(i).spec;
        (s.block_q, s.block_kv) == (Some(3328), Some(1536))
    }));
    let res = study("resolutions.toml");
    let lens: Vec<u64> = (0..res.total()).filter_map(|i| res.point(i).spec.seq_len).collect();
    assert_eq!(lens, vec![75_600, 75_600, 171_360, 171_360, 302_400, 302_400]);
}
