//! What a new user tripped on (issue 13, items 10 to 15), through the built binary: mask offsets,
//! paths inside trace and sweep files, timelines of large runs, progress without a terminal,
//! tile maps of long sequences, and shards from a batch system's environment.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tpusim"));
    // Tests set the batch-system variables they read; none leaks in from the caller's job.
    for v in ["SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX", "SLURM_ARRAY_TASK_STEP", "SLURM_ARRAY_TASK_COUNT"] {
        c.env_remove(v);
    }
    c.env_remove("JOB_COMPLETION_INDEX").env_remove("TPUSIM_SHARD_COUNT").env_remove("TPUSIM_PROGRESS_SECS");
    c
}

/// A fresh scratch folder for one test.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tpusim-new-user-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn ok(out: Output, what: &str) -> String {
    assert!(out.status.success(), "{what} failed ({:?}): {}", out.status.code(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn input_error(out: Output, what: &str) -> String {
    assert_eq!(out.status.code(), Some(2), "{what} should exit 2; stdout: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

// ---- item 11: mask offsets for q_len != kv_len ----

#[test]
fn a_decode_step_with_a_causal_offset_attends_the_whole_cache() {
    let run = |mask: &str| {
        let args = [
            "run",
            "--q-len",
            "8",
            "--kv-len",
            "4096",
            "--heads",
            "8",
            "--block-q",
            "8",
            "--block-kv",
            "512",
            "--mask",
            mask,
            "--format",
            "json",
        ];
        json(&ok(bin().args(args).output().unwrap(), mask))
    };
    // Plain causal counts from the first token of both: 8 query rows keep 1 + 2 + ... + 8 pairs.
    let plain = run("causal");
    let kept = plain["pair_density"].as_f64().unwrap() * 8.0 * 4096.0;
    assert!((kept - 36.0).abs() < 1e-6, "{kept}");
    // Splash's CausalMask(offset=4088): the 8 new tokens see the 4088 cached ones and each other.
    let decode = run("causal@offset:4088");
    let kept = decode["pair_density"].as_f64().unwrap() * 8.0 * 4096.0;
    assert!((kept - (8.0 * 4088.0 + 36.0)).abs() < 1e-6, "{kept}");
    assert_eq!(decode["job"]["workload"]["mask"], "causal@offset:4088");
    let help = ok(bin().args(["run", "--help"]).output().unwrap(), "run --help");
    assert!(help.contains("causal@offset:N") && help.contains("kv_len - q_len"), "--help documents the offset");
    let e = input_error(bin().args(["run", "--mask", "band:4@offset:2"]).output().unwrap(), "band with an offset");
    assert!(e.contains("--mask") && e.contains("'@offset:N' applies to causal and local"), "{e}");
}

/// The repository root (traces/, studies/).
#[allow(dead_code)]
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[allow(dead_code)]
fn write(p: &Path, text: &str) {
    std::fs::write(p, text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
}

// ---- item 10: paths inside trace and sweep files resolve from the file's folder ----

#[test]
fn paths_in_traces_and_sweep_files_resolve_from_their_folder() {
    let dir = scratch("paths");
    let sub = dir.join("jobs");
    std::fs::create_dir_all(&sub).unwrap();
    write(&sub.join("blocks.json"), r#"{"q_len": 1024, "kv_len": 1024, "block_q": 256, "block_kv": 256, "blocks": [[0, 3]]}"#);
    std::fs::copy(root().join("models/v6e.toml"), sub.join("my-v6e.toml")).unwrap();
    let job = "seq_len = 1024\nheads = 2\nblock_q = 256\nblock_kv = 256\n";
    write(&sub.join("trace.toml"), &format!("chip = \"my-v6e.toml\"\nmask = \"causal+file:blocks.json\"\n{job}"));
    // Run from the scratch folder (not the trace's): the mask file and chip model are found
    // beside the trace.
    let out = ok(bin().args(["run", "--trace", "jobs/trace.toml", "--format", "json"]).current_dir(&dir).output().unwrap(), "run --trace");
    let r = json(&out);
    assert_eq!(r["tiles"]["visited"], 2 * (10 + 1), "4 x 4 causal tiles (10) plus the file's block (0, 3), per head: {}", r["tiles"]);
    // A flag on the command line still resolves from the current folder.
    write(&dir.join("other.json"), r#"{"q_len": 1024, "kv_len": 1024, "block_q": 256, "block_kv": 256, "blocks": [[0, 0]]}"#);
    let out = ok(
        bin()
            .args(["run", "--trace", "jobs/trace.toml", "--mask", "file:other.json", "--format", "json"])
            .current_dir(&dir)
            .output()
            .unwrap(),
        "flag",
    );
    assert_eq!(json(&out)["tiles"]["visited"], 2);
    // A missing file: the error names the key, the path as written and the resolved path.
    write(&sub.join("missing.toml"), &format!("mask = \"file:nowhere.json\"\n{job}"));
    let e = input_error(bin().args(["run", "--trace", "jobs/missing.toml"]).current_dir(&dir).output().unwrap(), "missing mask file");
    assert!(
        e.contains("jobs/missing.toml") && e.contains("file:nowhere.json") && e.contains("jobs/nowhere.json") && e.contains("folder"),
        "{e}"
    );

    // Sweep files: base, axes and points alike.
    write(&sub.join("sweep.toml"), &format!("[base]\nchip = \"my-v6e.toml\"\n{job}[axes]\nmask = [\"file:blocks.json\", \"causal\"]\n"));
    let out = dir.join("out.csv");
    ok(
        bin().args(["sweep", "jobs/sweep.toml", "--out", out.to_str().unwrap(), "--no-progress"]).current_dir(&dir).output().unwrap(),
        "sweep",
    );
    let text = std::fs::read_to_string(&out).unwrap();
    let mut rows = csv_rows(&text);
    let header = rows.remove(0);
    let col = |name: &str| header.iter().position(|h| h == name).unwrap_or_else(|| panic!("{name} in {header:?}"));
    assert_eq!(rows.len(), 2);
    for r in &rows {
        assert_eq!(r[col("error")], "", "{r:?}");
    }
    assert_eq!(rows[0][col("tiles_visited")], "2", "the file's one block per head");
    assert_eq!(rows[0][col("mask")], "file:blocks.json", "the input column keeps the value as written");
    write(&sub.join("bad-sweep.toml"), &format!("[base]\n{job}[[points]]\nmask = \"file:gone.json\"\n"));
    let e = input_error(bin().args(["sweep", "jobs/bad-sweep.toml", "--no-progress"]).current_dir(&dir).output().unwrap(), "bad sweep");
    assert!(e.contains("points[0]") && e.contains("jobs/gone.json"), "{e}");
}

/// CSV rows after the `#` header line (fields without quotes or commas inside).
fn csv_rows(text: &str) -> Vec<Vec<String>> {
    text.lines().filter(|l| !l.starts_with('#')).map(|l| l.split(',').map(String::from).collect()).collect()
}

// ---- item 12: timelines of large runs ----

#[test]
fn a_timeline_too_large_to_write_still_prints_the_report_and_says_how_to_window_it() {
    let dir = scratch("timeline");
    let file = dir.join("whole.json");
    let out = bin().args(["run", "--timeline", file.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "the timeline was asked for and not written");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains("latency") && stdout.contains("bound by"), "the report is printed: {stdout}");
    assert!(stderr.contains("not written") && stderr.contains("--timeline-steps") && stderr.contains("--timeline-head"), "{stderr}");
    assert!(!file.exists(), "no partial timeline is left");
    // JSON output is still one parseable object on stdout.
    let out = bin().args(["run", "--format", "json", "--timeline", file.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(json(&String::from_utf8_lossy(&out.stdout))["latency_ms"].as_f64().unwrap() > 0.0);
    // A window that holds the whole run is held to the same size.
    let out = bin().args(["run", "--timeline", file.to_str().unwrap(), "--timeline-steps", "0:99999999999"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not written: the window holds") && stderr.contains("narrow --timeline-steps"), "{stderr}");
    assert!(!file.exists());
}

#[test]
fn a_timeline_written_for_one_head_plots_with_the_default_steps() {
    let dir = scratch("timeline-head");
    let file = dir.join("head.json");
    let png = dir.join("head.png");
    let job = ["--heads", "4", "--seq-len", "2048", "--block-q", "512", "--block-kv", "512"];
    ok(bin().arg("run").args(job).args(["--timeline", file.to_str().unwrap(), "--timeline-head", "3"]).output().unwrap(), "run");
    let said =
        ok(bin().args(["plot", "timeline", "--input", file.to_str().unwrap(), "--out", png.to_str().unwrap()]).output().unwrap(), "plot");
    assert!(png.exists() && said.contains("grid steps 48 to 51"), "head 3's first four steps: {said}");
}

// ---- item 13: progress when stderr is not a terminal ----

#[test]
fn long_work_without_a_terminal_prints_plain_progress_lines() {
    let dir = scratch("progress");
    write(
        &dir.join("s.toml"),
        "[base]\nheads = 16\nseq_len = 16384\nmask = \"causal\"\n[axes]\nblock_q = [256, 512, 1024, 2048]\nblock_kv = [256, 512, 1024, 2048]\nmask_source = [\"computed\", \"loaded\"]\n",
    );
    // stderr is a pipe here (not a terminal): plain lines, at most one per interval.
    let out = bin().args(["sweep", "s.toml", "--out", "a.csv"]).env("TPUSIM_PROGRESS_SECS", "0.01").current_dir(&dir).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    ok(out, "sweep with progress");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("tpusim sweep: ")).collect();
    assert!(!lines.is_empty() && lines.iter().all(|l| l.contains("/32 (") && l.contains("elapsed")), "{err}");
    assert!(!err.contains('\r') && !err.contains('\u{1b}'), "no terminal control characters in a log: {err:?}");
    // The default interval (10 s) prints nothing for quick work; --no-progress never prints.
    let out = bin().args(["sweep", "s.toml", "--out", "b.csv"]).current_dir(&dir).output().unwrap();
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = bin()
        .args(["sweep", "s.toml", "--out", "c.csv", "--no-progress"])
        .env("TPUSIM_PROGRESS_SECS", "0.01")
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(ok(out, "no progress").contains("32 points"));
    // tune too.
    let out = bin()
        .args(["tune", "--heads", "16", "--seq-len", "16384", "--mask", "causal", "--block-q", "1024", "--top", "1", "--refine", "1"])
        .env("TPUSIM_PROGRESS_SECS", "0.01")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    ok(out, "tune with progress");
    assert!(err.lines().any(|l| l.starts_with("tpusim tune: ")), "{err}");
    // A bad interval is an input error naming the variable.
    let out = bin().args(["sweep", "s.toml", "--out", "d.csv"]).env("TPUSIM_PROGRESS_SECS", "soon").current_dir(&dir).output().unwrap();
    assert!(input_error(out, "bad interval").contains("TPUSIM_PROGRESS_SECS=soon"));
}

/// A tune's progress lines count what the search is doing: each line names its stage, the
/// lowering of a stage's candidates counts up (it once showed 0/N until the stage ended), each
/// line's total is its stage's count in the summary, and the stages' counts add up to the
/// configurations evaluated.
#[test]
fn tune_progress_counts_each_stage_and_adds_up() {
    let out = bin()
        .args(["tune", "--heads", "8", "--head-dim", "128", "--mask", "causal", "--seq-len", "262144", "--top", "3", "--refine", "3"])
        .env("TPUSIM_PROGRESS_SECS", "0.01")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let text = ok(out, "tune with progress");
    let summary = text.lines().find(|l| l.trim_start().starts_with("evaluated")).unwrap_or_else(|| panic!("{text}"));
    // "evaluated    N configurations (options a + blocks b + compute widths c) in ..."
    let total: usize = summary.split_whitespace().nth(1).unwrap().parse().unwrap();
    let parts = &summary[summary.find('(').unwrap() + 1..summary.find(')').unwrap()];
    let stages: Vec<(String, usize)> = parts
        .split(" + ")
        .map(|p| {
            let (name, n) = p.rsplit_once(' ').unwrap();
            (name.to_string(), n.parse().unwrap())
        })
        .collect();
    assert_eq!(stages.iter().map(|s| s.0.as_str()).collect::<Vec<_>>(), ["options", "blocks", "compute widths"], "{summary}");
    assert_eq!(stages.iter().map(|s| s.1).sum::<usize>(), total, "{summary}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("tpusim tune: ")).collect();
    assert!(!lines.is_empty(), "{err}");
    let mut lowered_counts = false;
    for l in &lines {
        let (stage, rest) = l["tpusim tune: ".len()..].split_once(" (stage ").unwrap_or_else(|| panic!("no stage named: {l}"));
        let n = stages.iter().find(|s| s.0 == stage).unwrap_or_else(|| panic!("{l}: no such stage in {summary}")).1;
        let counts = rest.split(": ").nth(1).unwrap_or_else(|| panic!("{l}")).split_whitespace().next().unwrap();
        let (pos, len) = counts.split_once('/').unwrap();
        let (pos, len): (usize, usize) = (pos.parse().unwrap(), len.parse().unwrap());
        if rest.contains("lowering") {
            assert_eq!(len, n, "{l}: a stage's lowering counts its configurations ({summary})");
            lowered_counts |= pos > 0 && pos < len;
        } else {
            assert!(len <= n && pos <= len, "{l}");
        }
    }
    assert!(lowered_counts, "the lowering's count moves while it runs: {err}");
}

// ---- item 15: --shard auto from a batch system's environment ----

/// A 12-point sweep, quick to run in shards.
const SHARDED: &str =
    "[base]\nheads = 2\nseq_len = 4096\n[axes]\nblock_q = [512, 1024, 2048]\nblock_kv = [512, 1024]\nmask = [\"full\", \"causal\"]\n";

#[test]
fn a_one_based_slurm_array_and_a_kubernetes_indexed_job_shard_with_auto() {
    let dir = scratch("shard-auto");
    write(&dir.join("s.toml"), SHARDED);
    ok(bin().args(["sweep", "s.toml", "--out", "whole.csv", "--no-progress"]).current_dir(&dir).output().unwrap(), "unsharded");
    let whole = std::fs::read(dir.join("whole.csv")).unwrap();
    // sbatch --array=1-4: tasks 1..4 are shards 0..3 of 4 (named by the default output).
    for id in 1..=4 {
        let said = ok(
            bin()
                .args(["sweep", "s.toml", "--shard", "auto/4", "--no-progress"])
                .envs([
                    ("SLURM_ARRAY_TASK_ID", id.to_string()),
                    ("SLURM_ARRAY_TASK_MIN", "1".into()),
                    ("SLURM_ARRAY_TASK_MAX", "4".into()),
                    ("SLURM_ARRAY_TASK_STEP", "1".into()),
                    ("SLURM_ARRAY_TASK_COUNT", "4".into()),
                ])
                .current_dir(&dir)
                .output()
                .unwrap(),
            "slurm task",
        );
        assert!(said.contains(&format!("shard {}/4 from SLURM_ARRAY_TASK_ID={id}", id - 1)), "{said}");
    }
    let shards: Vec<String> = (0..4).map(|i| format!("s.shard-{i}-of-4.csv")).collect();
    let mut merge = vec!["merge".to_string()];
    merge.extend(shards.iter().cloned());
    merge.extend(["--out".into(), "slurm.csv".into()]);
    ok(bin().args(&merge).current_dir(&dir).output().unwrap(), "merge slurm shards");
    assert!(std::fs::read(dir.join("slurm.csv")).unwrap() == whole, "the merged Slurm shards are the unsharded sweep");
    // A rerun submitted as its own one-task array (--array=3) is not mistaken for shard 0 of 1.
    let e = input_error(
        bin()
            .args(["sweep", "s.toml", "--shard", "auto/4", "--no-progress"])
            .envs([
                ("SLURM_ARRAY_TASK_ID", "3"),
                ("SLURM_ARRAY_TASK_MIN", "3"),
                ("SLURM_ARRAY_TASK_MAX", "3"),
                ("SLURM_ARRAY_TASK_COUNT", "1"),
            ])
            .current_dir(&dir)
            .output()
            .unwrap(),
        "one-task array",
    );
    assert!(e.contains("has 1 tasks") && e.contains("not 4"), "{e}");
    // Kubernetes Indexed Job: JOB_COMPLETION_INDEX 0..3, the count from TPUSIM_SHARD_COUNT.
    for i in 0..4 {
        ok(
            bin()
                .args(["sweep", "s.toml", "--shard", "auto", "--out", &format!("k8s-{i}.csv"), "--no-progress"])
                .envs([("JOB_COMPLETION_INDEX", i.to_string()), ("TPUSIM_SHARD_COUNT", "4".into())])
                .current_dir(&dir)
                .output()
                .unwrap(),
            "k8s index",
        );
    }
    let mut merge = vec!["merge".to_string()];
    merge.extend((0..4).map(|i| format!("k8s-{i}.csv")));
    merge.extend(["--out".into(), "k8s.csv".into()]);
    ok(bin().args(&merge).current_dir(&dir).output().unwrap(), "merge k8s shards");
    assert!(std::fs::read(dir.join("k8s.csv")).unwrap() == whole);
    // No batch system: the error names what it looked for.
    let e = input_error(bin().args(["sweep", "s.toml", "--shard", "auto"]).current_dir(&dir).output().unwrap(), "no batch system");
    assert!(e.contains("SLURM_ARRAY_TASK_ID") && e.contains("JOB_COMPLETION_INDEX"), "{e}");
}

/// The GNU parallel recipe of studies/README.md, run as written on a small sweep (its sweep
/// file swapped for a 12-point one), with GNU parallel when installed (CI installs it) and else
/// with the shell running the commands parallel would.
#[test]
fn the_gnu_parallel_recipe_in_the_studies_readme_merges_to_the_unsharded_sweep() {
    let readme = std::fs::read_to_string(root().join("studies/README.md")).unwrap();
    let start = readme.find("<!-- gnu-parallel-recipe -->").expect("studies/README.md marks its GNU parallel recipe");
    let block = &readme[start..];
    let body_start = block.find("```bash\n").expect("a bash block") + "```bash\n".len();
    let body = &block[body_start..body_start + block[body_start..].find("```").unwrap()];
    assert!(body.contains("parallel") && body.contains("--shard {}/$N") && body.contains("tpusim merge"), "{body}");
    let dir = scratch("gnu-parallel");
    std::fs::create_dir_all(dir.join("studies")).unwrap();
    write(&dir.join("studies/video-10k.toml"), SHARDED);
    ok(bin().args(["sweep", "studies/video-10k.toml", "--out", "whole.csv", "--no-progress"]).current_dir(&dir).output().unwrap(), "whole");
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_tpusim"));
    let path = format!("{}:{}", exe.parent().unwrap().display(), std::env::var("PATH").unwrap_or_default());
    let have_parallel = Command::new("parallel").arg("--version").output().is_ok_and(|o| o.status.success());
    let script = if have_parallel {
        body.to_string()
    } else {
        eprintln!("GNU parallel is not installed (apt-get install parallel): running the recipe's commands with the shell");
        // What `parallel CMD {}... ::: $(seq ...)` runs: CMD once per argument.
        let mut s = String::new();
        for line in body.lines() {
            match line.split_once(" ::: ") {
                Some((cmd, args)) if line.trim_start().starts_with("parallel") => {
                    let cmd = cmd.split_whitespace().skip_while(|w| *w == "parallel" || w.starts_with('-')).collect::<Vec<_>>();
                    // Drop parallel's own options and their values (-j 4, --halt now,fail=1).
                    let cmd = cmd.into_iter().skip_while(|w| !w.starts_with("tpusim")).collect::<Vec<_>>().join(" ");
                    s.push_str(&format!("for x in {args}; do {}; done\n", cmd.replace("{}", "$x")));
                }
                _ => {
                    s.push_str(line);
                    s.push('\n');
                }
            }
        }
        s
    };
    let out = Command::new("bash").args(["-euo", "pipefail", "-c", &script]).env("PATH", path).current_dir(&dir).output().unwrap();
    ok(out, &format!("the recipe:\n{script}"));
    assert!(std::fs::read(dir.join("video-10k.csv")).unwrap() == std::fs::read(dir.join("whole.csv")).unwrap(), "merged = unsharded");
}

// ---- item 14: tile maps of long sequences ----

#[test]
fn a_tile_map_of_four_million_tokens_is_drawn_from_aggregated_tiles_quickly() {
    let dir = scratch("tiles-4m");
    let png = dir.join("t.png");
    let start = std::time::Instant::now();
    // 8192 x 8192 = 67 million tiles; the kernel itself would refuse this tiling (its mask
    // metadata overflows SMEM), but the map needs only the mask and the tiling.
    let said = ok(
        bin()
            .args(["plot", "tiles", "--seq-len", "4194304", "--heads", "1", "--mask", "causal", "--block-q", "512", "--block-kv", "512"])
            .args(["--out", png.to_str().unwrap()])
            .output()
            .unwrap(),
        "plot tiles at 4M tokens",
    );
    let secs = start.elapsed().as_secs_f64();
    assert!(png.exists() && said.contains("causal at 512 x 512 tiles"), "{said}");
    assert!(secs < 30.0, "took {secs:.1} s");
    // The picture is small: cells, not 67 million rectangles.
    assert!(std::fs::metadata(&png).unwrap().len() < 2_000_000);
}
