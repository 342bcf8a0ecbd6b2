//! Parser fuzzing as property tests (issue 7): arbitrary and mutated inputs to every parser this
//! layer owns - chip TOML, trace files (JobSpec TOML), the mask grammar, mask files - and random
//! job specs run end to end. Each must give a value or an error, never a panic.
//!
//! `PROPTEST_CASES=20000 cargo test --release -p tpusim-job --test fuzz_parsers` runs a longer
//! campaign; CI runs the default (bounded) number of cases.

use proptest::prelude::*;
use tpusim_chip::ChipModel;
use tpusim_job::{run, JobSpec};
use tpusim_workload::Mask;

const V6E: &str = include_str!("../../../models/v6e.toml");

/// Applies byte-level mutations to a valid input: deletions, insertions, replacements.
fn mutate(base: &str, edits: &[(usize, u8, u8)]) -> String {
    let mut b = base.as_bytes().to_vec();
    for &(pos, op, byte) in edits {
        if b.is_empty() {
            b.push(byte);
            continue;
        }
        let i = pos % b.len();
        match op % 3 {
            0 => {
                b.remove(i);
            }
            1 => b.insert(i, byte),
            _ => b[i] = byte,
        }
    }
    String::from_utf8_lossy(&b).into_owned()
}

fn edits() -> impl Strategy<Value = Vec<(usize, u8, u8)>> {
    prop::collection::vec((any::<usize>(), any::<u8>(), prop::sample::select(b"0123456789.-+=[]{}\",:# \nabcxyz_&()".to_vec())), 1..8)
}

const TRACE: &str = "chip = \"v6e\"\nheads = 4\nseq_len = 4096\nhead_dim = 128\nmask = \"band:500+sink:64\"\ntraversal = \"compact\"\nmasking = \"partial\"\nblock_q = 1024\nblock_kv = 512\n";

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn chip_toml_never_panics(e in edits()) {
        let text = mutate(V6E, &e);
        let _ = ChipModel::from_toml_str(&text, "fuzz.toml");
    }

    #[test]
    fn chip_overrides_never_panic(key in "[a-z_]{1,12}\\.[a-z_]{1,30}", value in "[-0-9.eE+a-z]{0,12}") {
        let chip = ChipModel::preset("v6e").unwrap();
        let _ = chip.with_override(&key, &value);
        for field in ["mxu.count", "fitted.clock_ghz", "hbm.bandwidth_gb_per_s", "xlu.latency_cycles"] {
            let _ = chip.with_override(field, &value);
        }
    }

    #[test]
    fn trace_toml_never_panics(e in edits()) {
        let text = mutate(TRACE, &e);
        if let Ok(spec) = toml::from_str::<JobSpec>(&text) {
            if let Ok(chip) = spec.chip() {
                if let Ok(job) = spec.build(&chip) {
                    // Sizes from mutated text can be large; keep the run bounded.
                    if let tpusim_job::Job::Attention { workload, .. } = &job {
                        prop_assume!(workload.q_len <= 1 << 16 && workload.kv_len <= 1 << 16 && workload.q_heads <= 64 && workload.batch <= 8);
                    }
                    let _ = run(&chip, &job);
                }
            }
        }
    }

    #[test]
    fn mask_grammar_never_panics(text in "[a-z0-9:,+&() -]{0,40}") {
        if let Ok(m) = Mask::parse(&text) {
            // Whatever parses prints back to something that parses to the same mask.
            prop_assert_eq!(Mask::parse(&m.to_string()).unwrap(), m);
        }
    }

    #[test]
    fn mutated_masks_never_panic(e in edits()) {
        let _ = Mask::parse(&mutate("(band:15000+sink:3600)&local:100,0+chunked:64", &e));
    }

    #[test]
    fn mask_files_never_panic(e in edits()) {
        let base = r#"{"q_len": 1024, "kv_len": 1024, "block_q": 256, "block_kv": 256, "blocks": [[0, 0], [1, 1], [2, 0]]}"#;
        let dir = std::env::temp_dir().join(format!("tpusim-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("m{}.json", e.len()));
        std::fs::write(&path, mutate(base, &e)).unwrap();
        let _ = Mask::parse(&format!("file:{}", path.display())).and_then(|m| m.load_files(&tpusim_workload::mask::read_mask_file));
        std::fs::remove_dir_all(&dir).ok();
    }

    /// Random job specs within bounded sizes run to a result or an error naming a field.
    #[test]
    fn random_jobs_never_panic(
        heads in 0u64..20, kv in 0u64..20, len in 0u64..20_000, d in prop::sample::select(vec![0u64, 32, 64, 100, 128, 256, 512]),
        bq in 0u64..5000, bkv in 0u64..5000, c in prop::option::of(0u64..5000),
        mask in prop::sample::select(vec!["full", "causal", "band:300", "local:10,0+sink:3", "chunked:100", "causal&band:50"]),
        trav in prop::sample::select(vec!["full-grid", "compact", "spiral"]),
        masking in prop::sample::select(vec!["all", "partial", "none", "some"]),
    ) {
        let mut text = format!(
            "heads = {heads}\nkv_heads = {kv}\nseq_len = {len}\nhead_dim = {d}\nblock_q = {bq}\nblock_kv = {bkv}\nmask = \"{mask}\"\ntraversal = \"{trav}\"\nmasking = \"{masking}\"\n"
        );
        if let Some(c) = c {
            text.push_str(&format!("block_kv_compute = {c}\n"));
        }
        let spec = match toml::from_str::<JobSpec>(&text) {
            Ok(s) => s,
            Err(e) => {
                // Unknown option words are refused while reading, naming the key and the words.
                let s = e.to_string();
                prop_assert!(s.contains("traversal") || s.contains("masking"), "parse error without a key: {s}");
                return Ok(());
            }
        };
        let chip = spec.chip().unwrap();
        match spec.build(&chip) {
            Err(e) => prop_assert!(e.to_string().contains('`'), "error without a field: {e}"),
            Ok(job) => {
                if let Err(e) = run(&chip, &job) {
                    let s = e.to_string();
                    prop_assert!(s.contains('`') || s.contains("VMEM"), "error without a field: {s}");
                }
            }
        }
    }
}
