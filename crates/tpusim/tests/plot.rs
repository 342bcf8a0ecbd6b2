//! `tpusim plot` and `tpusim run --timeline` end to end: every plot kind renders PNG and SVG from
//! the shipped inputs (plots/jobs, plots/data), timelines are valid Chrome Trace JSON whose
//! per-unit busy totals equal the report's, and bad input exits 2 naming what is wrong.

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repository root")
}

fn tpusim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tpusim")).args(args).current_dir(root()).output().expect("tpusim runs")
}

fn ok(args: &[&str]) -> String {
    let o = tpusim(args);
    assert!(o.status.success(), "tpusim {args:?} failed: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).expect("utf-8")
}

/// Runs and expects exit code 2; returns stderr.
fn fails(args: &[&str]) -> String {
    let o = tpusim(args);
    assert_eq!(o.status.code(), Some(2), "tpusim {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tpusim-plot-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Checks a PNG's signature and IHDR size, and that the image is not trivially small.
fn check_png(p: &Path, w: u32, h: u32) {
    let b = std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    assert_eq!(&b[..8], b"\x89PNG\r\n\x1a\n", "{}: not a PNG", p.display());
    assert_eq!(&b[12..16], b"IHDR");
    let dim = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    assert_eq!((dim(16), dim(20)), (w, h), "{}", p.display());
    assert!(b.len() > 20_000, "{}: only {} bytes", p.display(), b.len());
}

fn check_svg(p: &Path) {
    let s = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    // The overwrite rule's mark comes first (an XML comment), then the SVG.
    let head = s.trim_start();
    assert!(head.starts_with("<!-- tpusim output: plot (tpusim "), "{}: no tpusim mark", p.display());
    let head = head.split_once("-->\n").map_or(head, |(_, rest)| rest);
    assert!(head.starts_with("<svg") || head.starts_with("<?xml"), "{}: not an SVG", p.display());
    assert!(s.contains("</svg>"), "{}: truncated SVG", p.display());
    assert!(s.len() > 5_000 && s.contains("<text"), "{}: {} bytes, no text", p.display(), s.len());
}

const JOBS: [&str; 6] = ["--trace", "plots/jobs/dense.toml", "--trace", "plots/jobs/sparse.toml", "--trace", "plots/jobs/aligned.toml"];

/// Every plot kind, with the shipped inputs.
fn kinds() -> Vec<(&'static str, Vec<&'static str>)> {
    vec![
        (
            "sweep",
            vec![
                "--input",
                "plots/data/sweep_example.csv",
                "--where",
                "case=sparse",
                "--x",
                "block_kv",
                "--y",
                "latency_ms",
                "--series",
                "block_q",
            ],
        ),
        ("heatmap", vec!["--input", "plots/data/sweep_example.csv", "--where", "case=aligned"]),
        ("roofline", JOBS.to_vec()),
        ("tiles", vec!["--trace", "plots/jobs/sparse.toml"]),
        ("timeline", vec!["--trace", "plots/jobs/dense.toml", "--steps", "10:13"]),
        ("validation", vec!["--input", "plots/data/validation.csv"]),
        ("breakdown", JOBS.to_vec()),
        ("speedup", vec!["--resolutions", "720p,1440p", "--mark", "720p=1.28"]),
    ]
}

#[test]
fn every_plot_kind_renders_png_and_svg() {
    let d = tmpdir("kinds");
    for (kind, args) in kinds() {
        for ext in ["png", "svg"] {
            let out = d.join(format!("{kind}.{ext}"));
            let out_s = out.to_str().unwrap().to_string();
            let mut a = vec!["plot", kind, "--out", &out_s];
            a.extend(args.iter().copied());
            let msg = ok(&a);
            assert!(msg.contains("wrote"), "{msg}");
            if ext == "png" {
                let (w, h) = if kind == "tiles" { (1150, 900) } else { (1400, 860) };
                check_png(&out, w, h);
            } else {
                check_svg(&out);
            }
        }
    }
    // Atomic writes leave no temporary files behind.
    let names: Vec<String> = std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(names.iter().all(|n| !n.starts_with('.')), "{names:?}");
    assert_eq!(names.len(), 16, "{names:?}");
    let _ = std::fs::remove_dir_all(d);
}

/// No text of a generated SVG leaves the canvas or covers another text (tick labels, axis titles,
/// notes and every annotation, measured with the bundled font: `tpusim_plot::layout`): the
/// figures of plots/make.sh, a roofline of four chips and a 64-step timeline, at the default size
/// and at 800 x 600.
#[test]
fn no_text_leaves_the_canvas_or_covers_other_text() {
    let d = tmpdir("layout");
    let mut figures = kinds();
    figures.extend([
        ("breakdown", vec!["--trace", "plots/jobs/dense.toml", "--block-kv-compute", "256", "--chips", "v6e,v5e,v5p"]),
        ("tiles", vec!["--trace", "plots/jobs/aligned.toml"]),
        ("timeline", vec!["--trace", "plots/jobs/sparse.toml", "--steps", "0:64"]),
        ("roofline", vec!["--chips", "v6e,v5e,v5p,v7x"]),
        ("roofline", vec!["--chips", "v6e,v5e,v5p,v7x", "--heads", "10"]),
        ("breakdown", vec!["--layer", "--share", "--resolutions", "720p,1080p,1440p", "--attentions", "dense,sparse"]),
        ("breakdown", vec!["--layer", "--slices", "1,4,8,16", "--attentions", "dense,sparse"]),
        ("speedup", vec!["--resolutions", "720p,1080p,1440p", "--mark", "720p=1.28", "--mark", "1080p=1.49", "--mark", "1440p=1.69"]),
    ]);
    let mut problems = Vec::new();
    for (i, (kind, args)) in figures.iter().enumerate() {
        for size in [None, Some(("800", "600"))] {
            let out = d.join(format!("{i}-{kind}.svg"));
            let out_s = out.to_str().unwrap().to_string();
            let mut a = vec!["plot", kind, "--out", &out_s];
            a.extend(args.iter().copied());
            if let Some((w, h)) = size {
                a.extend(["--width", w, "--height", h]);
            }
            ok(&a);
            let svg = std::fs::read_to_string(&out).unwrap();
            assert!(tpusim_plot::layout::svg_texts(&svg).len() > 5, "{a:?}: the check found no text");
            for p in tpusim_plot::layout::text_problems(&svg, 1.0) {
                problems.push(format!("{a:?}: {p}"));
            }
        }
    }
    assert!(problems.is_empty(), "{} text problems:\n{}", problems.len(), problems.join("\n"));
    let _ = std::fs::remove_dir_all(d);
}

/// plots/README.md's prose quotes the figures it shows: every number between `<!--f:NAME-->`
/// markers, blanked in a copy, comes back as committed when `plots/make.sh --prose-only` makes
/// the figures again and fills them from what `tpusim plot` printed (so the committed numbers
/// are those of the current model; a stale one fails here).
#[test]
fn plots_readme_quotes_the_figures_it_shows() {
    let d = tmpdir("prose");
    let committed = std::fs::read_to_string(root().join("plots/README.md")).unwrap();
    let mut blank = String::new();
    let mut rest = committed.as_str();
    let mut markers = 0;
    while let Some(i) = rest.find("<!--f:") {
        let close = rest[i..].find("-->").unwrap() + i + 3;
        let end = rest[close..].find("<!--/f-->").unwrap() + close;
        blank.push_str(&rest[..close]);
        blank.push('?');
        rest = &rest[end..];
        markers += 1;
    }
    blank.push_str(rest);
    assert!(markers >= 12, "{markers} markers");
    let copy = d.join("README.md");
    std::fs::write(&copy, &blank).unwrap();
    let o = Command::new("bash")
        .arg(root().join("plots/make.sh"))
        .arg("--prose-only")
        .env("TPUSIM", env!("CARGO_BIN_EXE_tpusim"))
        .env("PLOTS_OUT", &d)
        .env("PLOTS_README", &copy)
        .current_dir(root())
        .output()
        .unwrap();
    assert!(o.status.success(), "plots/make.sh --prose-only: {}", String::from_utf8_lossy(&o.stderr));
    let filled = std::fs::read_to_string(&copy).unwrap();
    for (a, b) in committed.lines().zip(filled.lines()) {
        assert_eq!(a, b, "plots/README.md quotes a figure's number that the figure no longer shows; run plots/make.sh");
    }
    assert_eq!(committed, filled);
    check_png(&d.join("roofline.png"), 1400, 860);
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn timeline_plot_reads_a_chrome_trace_and_sizes_apply() {
    let d = tmpdir("gantt");
    let trace = d.join("t.json");
    ok(&["run", "--trace", "plots/jobs/sparse.toml", "--timeline", trace.to_str().unwrap(), "--timeline-steps", "20:26"]);
    let png = d.join("g.png");
    ok(&[
        "plot",
        "timeline",
        "--input",
        trace.to_str().unwrap(),
        "--steps",
        "20:25",
        "--width",
        "900",
        "--height",
        "600",
        "--out",
        png.to_str().unwrap(),
    ]);
    check_png(&png, 900, 600);
    let _ = std::fs::remove_dir_all(d);
}

fn read_json(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap_or_else(|e| panic!("{} is not JSON: {e}", p.display()))
}

const TRACKS: [&str; 7] = ["MXU", "VPU", "EUP", "XLU", "DMA in", "DMA out", "step control"];

/// Parses a timeline: (thread id -> track name, per-track duration sums in us, complete events).
fn parse_trace(v: &Value) -> (BTreeMap<u64, String>, BTreeMap<String, f64>, Vec<Value>) {
    let evs = v["traceEvents"].as_array().expect("traceEvents array");
    let mut names = BTreeMap::new();
    for e in evs.iter().filter(|e| e["ph"] == "M" && e["name"] == "thread_name") {
        names.insert(e["tid"].as_u64().unwrap(), e["args"]["name"].as_str().unwrap().to_string());
    }
    let mut sums: BTreeMap<String, f64> = TRACKS.iter().map(|t| (t.to_string(), 0.0)).collect();
    let mut xs = Vec::new();
    for e in evs.iter().filter(|e| e["ph"] == "X") {
        let track = names.get(&e["tid"].as_u64().expect("tid")).unwrap_or_else(|| panic!("event on an unnamed thread: {e}"));
        *sums.get_mut(track).unwrap() += e["dur"].as_f64().expect("dur");
        xs.push(e.clone());
    }
    (names, sums, xs)
}

#[test]
fn case_study_timeline_is_valid_chrome_trace() {
    let d = tmpdir("trace");
    let p = d.join("dense.json");
    // Steps 30..40 of the dense case: row ends (write-backs), row starts (q copies), full and
    // padded (partial) tiles.
    let table = ok(&["run", "--trace", "plots/jobs/dense.toml", "--timeline", p.to_str().unwrap(), "--timeline-steps", "30:40"]);
    assert!(table.contains("timeline") && table.contains("10 of 9250 grid steps"), "{table}");
    let v = read_json(&p);
    assert_eq!(v["displayTimeUnit"], "ns");
    let (names, sums, xs) = parse_trace(&v);
    let mut got: Vec<&str> = names.values().map(String::as_str).collect();
    got.sort_unstable();
    let mut want = TRACKS.to_vec();
    want.sort_unstable();
    assert_eq!(got, want, "one track per unit");
    for t in TRACKS {
        assert!(sums[t] > 0.0, "no events on {t}");
    }
    let mut steps = std::collections::BTreeSet::new();
    for e in &xs {
        for k in ["name", "cat", "ph", "pid", "tid", "ts", "dur", "args"] {
            assert!(!e[k].is_null(), "event without {k}: {e}");
        }
        assert!(e["ts"].as_f64().unwrap() >= 0.0 && e["dur"].as_f64().unwrap() > 0.0, "{e}");
        let a = &e["args"];
        let step = a["step"].as_u64().expect("step");
        assert!((30..40).contains(&step), "{e}");
        steps.insert(step);
        // Dense grid: 25 q blocks x 37 kv steps per head, in lexicographic order.
        assert_eq!(a["head"].as_u64(), Some(step / (25 * 37)), "{e}");
        assert_eq!(a["q_block"].as_u64(), Some(step / 37 % 25), "{e}");
        assert_eq!(a["kv_block"].as_u64(), Some(step % 37), "{e}");
        assert!(["full", "partial", "empty"].contains(&a["tile"].as_str().unwrap()), "{e}");
        assert!(a["masked"].is_boolean(), "{e}");
    }
    assert_eq!(steps.len(), 10);
    // The window's totals are recorded, and equal the events' sums.
    let other = &v["otherData"];
    assert_eq!(other["whole_run"], false);
    for (k, t) in [("mxu", "MXU"), ("vpu", "VPU"), ("dma_in", "DMA in"), ("step_control", "step control")] {
        let rec = other["busy_us"][k].as_f64().unwrap();
        assert!((rec - sums[t]).abs() <= 1e-9 * rec, "{k}: {rec} vs {}", sums[t]);
    }
    let _ = std::fs::remove_dir_all(d);
}

/// Per-track sums of a whole-run timeline against the report of the same run.
fn assert_totals_match(sums: &BTreeMap<String, f64>, report: &Value) {
    let busy = &report["busy_ms"];
    let ms = |t: &str| sums[t] / 1e3;
    let pairs = [
        ("mxu", ms("MXU")),
        ("vpu", ms("VPU")),
        ("eup", ms("EUP")),
        ("xlu", ms("XLU")),
        ("hbm", ms("DMA in") + ms("DMA out")),
        ("step_control", ms("step control")),
    ];
    let latency = report["latency_ms"].as_f64().unwrap();
    for (unit, got) in pairs {
        let want = busy[unit].as_f64().unwrap();
        assert!((got - want).abs() <= 1e-9 * want.max(1e-12), "{unit}: timeline {got} ms vs report {want} ms");
        let util = report["utilization"][unit].as_f64().unwrap();
        assert!((got / latency - util).abs() <= 1e-9, "{unit}: timeline utilisation {} vs report {util}", got / latency);
    }
}

#[test]
fn whole_run_timeline_totals_equal_report() {
    // A small whole run through the file (every event parsed back) ...
    let d = tmpdir("totals");
    for (name, extra) in [
        ("causal", vec!["--seq-len", "4096", "--heads", "2", "--mask", "causal", "--block-q", "512", "--block-kv", "512"]),
        (
            "band",
            vec![
                "--seq-len",
                "6000",
                "--heads",
                "1",
                "--mask",
                "band:1500+sink:300",
                "--block-q",
                "1024",
                "--block-kv",
                "768",
                "--traversal",
                "compact",
                "--masking",
                "partial",
            ],
        ),
        ("matmul", vec!["--kernel", "pallas-matmul", "--m", "2048", "--n", "2048", "--k", "2048"]),
    ] {
        let p = d.join(format!("{name}.json"));
        let mut a = vec!["run", "--format", "json", "--timeline", p.to_str().unwrap()];
        a.extend(extra);
        let report: Value = serde_json::from_str(&ok(&a)).unwrap();
        let v = read_json(&p);
        assert_eq!(v["otherData"]["whole_run"], true);
        let (_, sums, _) = parse_trace(&v);
        assert_totals_match(&sums, &report);
    }
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn case_study_timeline_totals_equal_report() {
    // ... and the whole case study through the same event generator (its files would be
    // hundreds of MB, which is why the CLI asks for a window).
    for job in ["dense", "sparse", "aligned"] {
        let spec = tpusim_job::JobSpec::from_toml_file(root().join(format!("plots/jobs/{job}.toml")).to_str().unwrap()).unwrap();
        let chip = spec.chip().unwrap();
        let r = tpusim_job::run(&chip, &spec.build(&chip).unwrap()).unwrap();
        let us = 1e6 / chip.clock_hz();
        let mut sums: BTreeMap<String, f64> = TRACKS.iter().map(|t| (t.to_string(), 0.0)).collect();
        tpusim_plot::timeline::for_each_event(&r.chip, &r.program, &Default::default(), &mut |e| {
            *sums.get_mut(e.track.name()).unwrap() += e.dur * us;
        });
        let report = serde_json::to_value(tpusim_job::Report::from_run(&r)).unwrap();
        assert_totals_match(&sums, &report);
    }
}

#[test]
fn bad_input_exits_2_naming_the_problem() {
    let d = tmpdir("errors");
    let out = d.join("x.png");
    let o = out.to_str().unwrap();
    let e = fails(&["plot", "pie", "--out", o]);
    assert!(e.contains("pie") && e.contains("tpusim plot"), "{e}");
    // A flag that does not apply to a kind is an error, not ignored.
    let e = fails(&[
        "plot",
        "sweep",
        "--out",
        o,
        "--input",
        "plots/data/sweep_example.csv",
        "--x",
        "block_kv",
        "--trace",
        "/nonexistent.toml",
        "--chips",
        "v9",
        "--mask",
        "foo",
    ]);
    assert!(e.contains("--trace"), "{e}");
    let e = fails(&["plot", "sweep", "--out", o, "--input", "plots/data/sweep_example.csv", "--x", "block_kv", "--y", "nope"]);
    assert!(e.contains("--y nope") && e.contains("latency_ms"), "{e}");
    let e = fails(&["plot", "heatmap", "--out", o, "--input", "/nonexistent/s.csv"]);
    assert!(e.contains("--input /nonexistent/s.csv") && e.contains("cannot read"), "{e}");
    let e = fails(&["plot", "roofline", "--out", d.join("x.jpg").to_str().unwrap()]);
    assert!(e.contains("--out") && e.contains(".png"), "{e}");
    let e = fails(&["plot", "validation", "--out", o]);
    assert!(e.contains("--input"), "{e}");
    let e = fails(&["plot", "tiles", "--out", o, "--trace", "plots/jobs/nope.toml"]);
    assert!(e.contains("--trace plots/jobs/nope.toml"), "{e}");
    let e = fails(&["plot", "timeline", "--out", o, "--steps", "9:3"]);
    assert!(e.contains("--steps 9:3"), "{e}");
    assert!(!out.exists(), "a failed plot wrote {o}");
    // A failed render leaves an existing file untouched.
    std::fs::write(&out, b"keep").unwrap();
    fails(&["plot", "sweep", "--out", o, "--input", "plots/data/sweep_example.csv", "--x", "nope"]);
    assert_eq!(std::fs::read(&out).unwrap(), b"keep");
    // Timelines: unbounded runs that are too large, bad windows, empty windows.
    let t = d.join("t.json");
    let ts = t.to_str().unwrap();
    let e = fails(&["run", "--timeline", ts]);
    assert!(e.contains("--timeline-steps") && e.contains("--timeline-head"), "{e}");
    let e = fails(&["run", "--timeline", ts, "--timeline-steps", "5"]);
    assert!(e.contains("--timeline-steps 5"), "{e}");
    let e = fails(&["run", "--timeline", ts, "--timeline-head", "99"]);
    assert!(e.contains("no grid step"), "{e}");
    assert!(!t.exists());
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn readme_gallery_images_exist_and_are_pngs() {
    let readme = std::fs::read_to_string(root().join("plots/README.md")).expect("plots/README.md");
    let mut n = 0;
    for part in readme.split("](").skip(1) {
        let target = part.split(')').next().unwrap();
        if !target.ends_with(".png") {
            continue;
        }
        let p = root().join("plots").join(target);
        let b = std::fs::read(&p).unwrap_or_else(|e| panic!("README image {}: {e}", p.display()));
        assert_eq!(&b[..8], b"\x89PNG\r\n\x1a\n", "{}", p.display());
        assert!(b.len() > 20_000, "{}", p.display());
        n += 1;
    }
    assert!(n >= 6, "README shows only {n} figures");
    // Every figure make.sh writes is in the gallery.
    let make = std::fs::read_to_string(root().join("plots/make.sh")).unwrap();
    for part in make.split("--out plots/").skip(1) {
        let f = part.split_whitespace().next().unwrap();
        assert!(readme.contains(&format!("({f})")), "plots/make.sh writes {f} but plots/README.md does not show it");
    }
}

/// A sweep CSV for the figure tests: x = block_kv, series = block_q, and `extra` varying too.
fn sweep_csv(dir: &Path, series: &[u64], extra: &[&str], xname: &str) -> PathBuf {
    let p = dir.join("sweep.csv");
    let mut text = format!("# tpusim sweep: points=0 shard=0/1 definition=00 tpusim=0.1.0\nindex,block_q,{xname},mask_source,latency_ms,error\n");
    let mut i = 0;
    for &q in series {
        for m in extra {
            for (j, kv) in [512u64, 1024, 2048].iter().enumerate() {
                let lat = q as f64 / 100.0 + j as f64 + if *m == "loaded" { 0.5 } else { 0.0 };
                text.push_str(&format!("{i},{q},{kv},{m},{lat},\n"));
                i += 1;
            }
        }
    }
    std::fs::write(&p, text).unwrap();
    p
}

/// Issue 22, item 6: axis labels are the column names; one line per series group (another
/// varied job column splits the lines instead of zig-zagging them); the legend is capped; a
/// Gantt chart of too many steps is refused with a hint; a layer timeline is not drawn as
/// grid steps.
#[test]
fn sweep_figures_name_their_columns_group_their_lines_and_cap_the_legend() {
    let d = tmpdir("svg-rules");
    let out = d.join("s.svg");
    let csv = sweep_csv(&d, &[512, 1024], &["computed", "loaded"], "chip.hbm.bandwidth_gb_per_s");
    ok(&["plot", "sweep", "--input", csv.to_str().unwrap(), "--x", "chip.hbm.bandwidth_gb_per_s", "--series", "block_q", "--out", out.to_str().unwrap()]);
    let svg = std::fs::read_to_string(&out).unwrap();
    // plotters writes a text element's content on a line of its own.
    assert!(svg.contains(">\nchip.hbm.bandwidth_gb_per_s\n</text>"), "the x axis label is the column name");
    assert!(svg.contains(">\nlatency_ms\n</text>"), "the y axis label is the column name");
    // 2 block_q x 2 mask_source = 4 lines, each drawn once and once in the legend (the data
    // lines are 3 px wide; the axes' ticks are 1 px polylines).
    let lines = |svg: &str| svg.split("<polyline").skip(1).filter(|p| p.split('>').next().unwrap_or("").contains("stroke-width=\"3\"")).count();
    assert_eq!(lines(&svg), 2 * 4, "one line per (block_q, mask_source)");
    assert!(svg.contains(">\n512, mask_source=loaded\n</text>"), "the legend names the group");
    // Many series: the legend lists at most 12 entries, the last counting the rest.
    let many: Vec<u64> = (1..=20).map(|i| i * 128).collect();
    let csv = sweep_csv(&d, &many, &["computed"], "block_kv");
    ok(&["plot", "sweep", "--input", csv.to_str().unwrap(), "--x", "block_kv", "--series", "block_q", "--out", out.to_str().unwrap()]);
    let svg = std::fs::read_to_string(&out).unwrap();
    assert!(svg.contains(">\n... and 9 more lines\n</text>"), "capped legend");
    assert_eq!(lines(&svg), 20 + 11, "20 lines, 11 legend samples");
    // A whole run's steps are refused with a hint, not drawn as solid hatching.
    let e = fails(&["plot", "timeline", "--steps", "0:100000", "--heads", "2", "--seq-len", "2048", "--out", out.to_str().unwrap()]);
    assert!(e.contains("--steps 0:100000") && e.contains("too many to draw") && e.contains("Perfetto"), "{e}");
    // A layer's timeline is not a kernel's grid steps.
    let layer = d.join("layer.json");
    ok(&["layer", "--timeline", layer.to_str().unwrap()]);
    let e = fails(&["plot", "timeline", "--input", layer.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert!(e.contains("a layer's timeline") && e.contains("Perfetto"), "{e}");
}

/// Issue 22, item 8: a default column the input lacks is named as the default, not as a flag
/// the user did not type.
#[test]
fn plot_validation_names_its_default_columns_as_defaults() {
    let d = tmpdir("validation-defaults");
    let csv = d.join("rows.csv");
    std::fs::write(&csv, "id,time_ms,predicted_ms\nA,1.0,1.1\n").unwrap();
    let out = d.join("v.png");
    let e = fails(&["plot", "validation", "--input", csv.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert!(e.contains("no measured_ms column (the column plot validation reads by default; give --x COL"), "{e}");
    assert!(!e.contains("--x measured_ms"), "{e}");
    ok(&["plot", "validation", "--input", csv.to_str().unwrap(), "--x", "time_ms", "--out", out.to_str().unwrap()]);
}

/// Runs and returns (stdout, stderr) of a success.
fn ok_err(args: &[&str]) -> (String, String) {
    let o = tpusim(args);
    assert!(o.status.success(), "tpusim {args:?} failed: {}", String::from_utf8_lossy(&o.stderr));
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// Issue 47, point 11: a heatmap took NaN, inf and negative metrics silently (a colour bar from
/// inf to NaN, -1 outlined as best) and a --logy sweep drew inf above the axes and dropped
/// negative values as if empty. Each is refused naming the line, column, value and what is
/// allowed, and nothing is written; --skip-bad leaves them out and says which on stderr and in
/// the footnote.
#[test]
fn values_a_figure_cannot_draw_are_refused_or_skipped_with_a_note() {
    let d = tmpdir("bad-values");
    let out = d.join("f.svg");
    let o = out.to_str().unwrap();
    for (v, heatmap_msg, logy_msg) in [
        ("NaN", "latency_ms = NaN: a heatmap's metric must be a finite number, 0 or more", "latency_ms = NaN: a finite number above 0 on the log y axis"),
        ("inf", "latency_ms = inf: a heatmap's metric must be a finite number, 0 or more", "latency_ms = inf: a finite number above 0 on the log y axis"),
        ("-1", "latency_ms = -1: a heatmap's metric must be a finite number, 0 or more", "latency_ms = -1: a finite number above 0 on the log y axis"),
    ] {
        let csv = d.join("s.csv");
        std::fs::write(&csv, format!("block_q,block_kv,latency_ms\n512,512,3\n512,1024,{v}\n1024,512,2\n1024,1024,2.5\n")).unwrap();
        let c = csv.to_str().unwrap();
        let e = fails(&["plot", "heatmap", "--input", c, "--out", o]);
        assert!(e.contains(&format!("--input {c} line 3 (block_q = 512, block_kv = 1024): {heatmap_msg}")) && e.contains("--skip-bad"), "{e}");
        let e = fails(&["plot", "sweep", "--input", c, "--x", "block_kv", "--series", "block_q", "--logy", "--out", o]);
        assert!(e.contains(&format!("--input {c} line 3 (block_kv = 1024, block_q = 512): {logy_msg}")) && e.contains("--skip-bad"), "{e}");
        assert!(!out.exists(), "a refused plot wrote {o}");
        for kind in [vec!["heatmap"], vec!["sweep", "--x", "block_kv", "--series", "block_q", "--logy"]] {
            let mut args = vec!["plot"];
            args.extend(kind.iter().copied());
            args.extend(["--input", c, "--out", o, "--skip-bad"]);
            let (_, err) = ok_err(&args);
            assert!(err.contains(&format!("note: --skip-bad left out 1 row with a value the figure cannot draw: line 3 (latency_ms = {v})")), "{kind:?}: {err}");
            let svg = std::fs::read_to_string(&out).unwrap();
            assert!(svg.contains("--skip-bad left out 1 row"), "{kind:?}: the footnote says so");
            std::fs::remove_file(&out).unwrap();
        }
    }
    // Without bad values, nothing is said.
    let csv = d.join("good.csv");
    std::fs::write(&csv, "block_q,block_kv,latency_ms\n512,512,3\n512,1024,1\n").unwrap();
    let (_, err) = ok_err(&["plot", "heatmap", "--input", csv.to_str().unwrap(), "--out", o, "--skip-bad"]);
    assert!(!err.contains("--skip-bad left out"), "{err}");
    let _ = std::fs::remove_dir_all(d);
}

/// A bad trace is named once, as `tpusim run --trace` names it (it printed `--trace t.toml:
/// trace t.toml: ...`).
#[test]
fn a_bad_trace_is_named_once_as_run_names_it() {
    let d = tmpdir("bad-trace");
    let t = d.join("t.toml");
    std::fs::write(&t, "[[call]]\nbogus = 1\n").unwrap();
    let t = t.to_str().unwrap();
    let out = d.join("r.svg");
    let plot = fails(&["plot", "roofline", "--trace", t, "--out", out.to_str().unwrap()]);
    let run = fails(&["run", "--trace", t]);
    assert_eq!(plot, run, "plot and run name the trace alike");
    assert_eq!(plot.matches(t).count(), 1, "{plot}");
    assert!(plot.contains("unknown key 'call'"), "{plot}");
    assert!(!out.exists());
}

/// `plot validation` with more groups than the palette's eight colours gives the ninth another
/// marker shape (VD and GMMV2 shared a colour and a circle), and an error panel with too many
/// rows to name each names each group's block of rows (it had no labels at all).
#[test]
fn validation_groups_past_the_palette_differ_in_shape_and_are_named_in_the_error_panel() {
    let d = tmpdir("validation-groups");
    let mut csv = String::from("id,predicted_ms,measured_ms\n");
    for g in 0..9 {
        for r in 0..30 {
            csv.push_str(&format!("G{g}-{r},{},{}\n", 1.0 + 0.01 * r as f64, 1.0 + 0.012 * r as f64 + g as f64));
        }
    }
    // Groups of three rows between large ones, too short for a label at the panel's font (a
    // fresh user found VD and XLA unnamed): named all the same, below the one above.
    for g in 9..11 {
        for r in 0..3 {
            csv.push_str(&format!("G{g}-{r},{},{}\n", 1.0 + 0.01 * r as f64, 1.1 + 0.01 * r as f64));
        }
    }
    let input = d.join("v.csv");
    std::fs::write(&input, csv).unwrap();
    let out = d.join("v.svg");
    ok(&["plot", "validation", "--input", input.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let svg = std::fs::read_to_string(&out).unwrap();
    // Circles (filled, then outlined) for the first eight groups' 30 points, legend entry and
    // error-panel label each; the ninth to eleventh groups' are squares.
    assert_eq!(svg.matches("<circle").count(), 2 * 8 * 32, "only the first eight groups are circles");
    // 276 rows cannot each be named: each group's block is, with its row count and marker.
    for g in 0..9 {
        assert!(svg.contains(&format!("G{g} (30)")), "group G{g} named in the error panel");
    }
    for g in 9..11 {
        assert!(svg.contains(&format!("G{g} (3)")), "short group G{g} named in the error panel");
    }
    assert!(!svg.contains("G0-1\n"), "no per-row ids at this size");
}

/// The roofline's point is executed FLOP/s (what the roofs bound), said so, beside the MFU `run`
/// gives (useful FLOPs): a fresh user read "191 TFLOP/s, 87% MFU" on a 197 TFLOP/s chip as two
/// figures that disagree with `run`'s 170.1 TFLOP/s.
#[test]
fn the_roofline_point_says_executed_and_gives_runs_mfu() {
    let d = tmpdir("roofline-mfu");
    let out = d.join("r.svg");
    let msg = ok(&["plot", "roofline", "--trace", "traces/llm-causal-16k.toml", "--chips", "v5e", "--out", out.to_str().unwrap()]);
    let line = msg.lines().find(|l| l.contains("point ") && l.contains("FLOP/B")).unwrap_or_else(|| panic!("{msg}"));
    assert!(line.contains("TFLOP/s executed") && line.contains("MFU (useful FLOPs)"), "{line}");
    let j: serde_json::Value = serde_json::from_str(&ok(&["run", "--trace", "traces/llm-causal-16k.toml", "--chip", "v5e", "--format", "json"])).unwrap();
    let mfu = format!("{:.0}% MFU", 100.0 * j["mfu"].as_f64().unwrap());
    assert!(line.contains(&mfu), "{line} against run's {mfu}");
    let executed = j["flops"].as_f64().unwrap() / (j["latency_ms"].as_f64().unwrap() * 1e-3) / 1e12;
    assert!(line.contains(&format!("{executed:.0} TFLOP/s executed")), "{line} against {executed:.1}");
}
