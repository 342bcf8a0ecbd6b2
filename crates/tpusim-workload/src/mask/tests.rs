use super::*;
use crate::tiles::{TileGrid, TileStats};
use crate::AttentionCall;

fn rows(m: &Mask, q: u64, kv: u64) -> Vec<(u64, u64)> {
    let mut v = Vec::new();
    m.row_intervals(q, kv, &mut v);
    v
}

/// Parses and reads mask files, as the job layer does.
fn loaded(text: &str) -> Result<Mask, MaskError> {
    Mask::parse(text).and_then(|m| m.load_files(&read_mask_file))
}

fn err(text: &str) -> String {
    loaded(text).unwrap_err().to_string()
}

/// A temporary JSON file removed on drop.
struct Tmp(std::path::PathBuf);

impl Tmp {
    fn new(name: &str, json: &str) -> Self {
        let p = std::env::temp_dir().join(format!("tpusim-mask-unit-{}-{name}.json", std::process::id()));
        std::fs::write(&p, json).unwrap();
        Tmp(p)
    }
    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn parse_round_trips() {
    for s in [
        "full",
        "causal",
        "local:128,0",
        "band:15000+sink:3600",
        "causal&band:5",
        "(causal+sink:4)&local:10,10",
        "video:21,45,80:4,45,80",
        "video:21,45,80:4,45,80@position",
        "video:30,48,80:18,24,24@tiles:6,8,8",
        "sta:30,48,80:3,3,5:6,8,8",
        "sta:30,48,80:3,3,5:6,8,8@frame",
        "per-head[4*band:100;6*causal]",
        "per-head[2*band:8+sink:4;causal&local:3,3]",
        "video:2,3,4:1,1,1+sink:2",
    ] {
        let m = Mask::parse(s).unwrap();
        assert_eq!(Mask::parse(&m.to_string()).unwrap(), m, "{s}");
    }
    // Canonical forms: default orders are omitted, per-head runs are compressed.
    assert_eq!(Mask::parse("video:21,45,80:4,45,80@frame").unwrap().to_string(), "video:21,45,80:4,45,80");
    assert_eq!(Mask::parse("sta:6,8,8:1,1,1:2,2,2@tiles:2,2,2").unwrap().to_string(), "sta:6,8,8:1,1,1:2,2,2");
    assert_eq!(Mask::parse("per-head[causal;causal; 2 * full;causal]").unwrap().to_string(), "per-head[2*causal;2*full;causal]");
    // Nested unions keep their structure through Display.
    let m = Mask::Union(vec![Mask::Union(vec![Mask::Causal { offset: 0 }, Mask::Sink { tokens: 1 }]), Mask::Band { width: 2 }]);
    assert_eq!(m.to_string(), "(causal+sink:1)+band:2");
    assert_eq!(Mask::parse(&m.to_string()).unwrap(), m);
}

#[test]
fn bad_masks_are_named() {
    let e = err("band:-5");
    assert!(e.contains("non-negative") && e.contains("band"), "{e}");
    let e = err("diagonal");
    assert!(e.contains("unknown mask word 'diagonal'") && e.contains("allowed"), "{e}");
    assert!(Mask::parse("local:5").is_err());
    assert!(Mask::parse("band:x").is_err());
    assert!(Mask::parse("causal:3").is_err());
    assert!(Mask::parse("chunked:0").is_err());
    assert!(Mask::parse("(causal").is_err());
    assert!(Mask::parse("").is_err());
    assert!(Mask::parse("causal+").is_err());
    let deep = format!("{}causal{}", "(".repeat(7000), ")".repeat(7000));
    let e = Mask::parse(&deep).unwrap_err().to_string();
    assert!(e.contains("nests at most"), "{e}");
    let wide = vec!["sink:1"; 300].join("+");
    let e = Mask::parse(&wide).unwrap_err().to_string();
    assert!(e.contains("at most 256 terms"), "{e}");
}

#[test]
fn band_plus_sink_rows() {
    let m = Mask::parse("band:2+sink:3").unwrap();
    assert_eq!(rows(&m, 10, 20), vec![(0, 3), (8, 13)]);
    assert_eq!(rows(&m, 1, 20), vec![(0, 4)]);
    assert_eq!(rows(&m, 19, 20), vec![(0, 3), (17, 20)]);
}

#[test]
fn intersection_rows() {
    let m = Mask::parse("causal&local:3,3").unwrap();
    assert_eq!(rows(&m, 10, 20), vec![(7, 11)]);
    let m = Mask::parse("chunked:4").unwrap();
    assert_eq!(rows(&m, 6, 20), vec![(4, 7)]);
    assert!(rows(&Mask::Intersect(vec![]), 0, 0).is_empty());
}

#[test]
fn video_frame_major_rows() {
    // 3 frames of 2 x 4; token = (f * 2 + h) * 4 + w.
    let m = Mask::parse("video:3,2,4:1,2,4").unwrap(); // whole frames, +-1 frame
    assert_eq!(rows(&m, 0, 24), vec![(0, 16)]);
    assert_eq!(rows(&m, 9, 24), vec![(0, 24)]);
    assert_eq!(rows(&m, 23, 24), vec![(8, 24)]);
    let m = Mask::parse("video:3,2,4:0,0,1").unwrap(); // same frame and row, +-1 column
    assert_eq!(rows(&m, 13, 24), vec![(12, 15)]); // f 1, h 1, w 1
    let m = Mask::parse("video:3,2,4:1,0,0").unwrap(); // same (h, w), +-1 frame
    assert_eq!(rows(&m, 13, 24), vec![(5, 6), (13, 14), (21, 22)]);
    // Rows are clipped to kv_len and rows beyond the volume keep nothing.
    assert_eq!(rows(&m, 13, 14), vec![(5, 6), (13, 14)]);
    assert!(rows(&m, 24, 30).is_empty());
}

#[test]
fn video_position_major_rows() {
    // token = (h * W + w) * F + f with F 3, H 2, W 4: each (h, w) holds 3 consecutive frames.
    let m = Mask::parse("video:3,2,4:1,2,4@position").unwrap(); // +-1 frame, whole frames
                                                                // q = 4: (h, w) = (0, 1), f = 1: frames 0..=2 at every position -> everything.
    assert_eq!(rows(&m, 4, 24), vec![(0, 24)]);
    // q = 3: f = 0 -> frames 0, 1 at every one of the 8 positions.
    let want: Vec<(u64, u64)> = (0..8).map(|p| (3 * p, 3 * p + 2)).collect();
    assert_eq!(rows(&m, 3, 24), want);
    let m = Mask::parse("video:3,2,4:2,0,0@position").unwrap(); // same (h, w), all frames
    assert_eq!(rows(&m, 7, 24), vec![(6, 9)]);
}

#[test]
fn video_tile_order_rows() {
    // F 2, H 4, W 4 in tiles of 1 x 2 x 2 (4 tokens); 2 x 2 x 2 tiles ordered frame-major.
    let m = Mask::parse("video:2,4,4:0,1,1@tiles:1,2,2").unwrap();
    // Token 0 is (0, 0, 0): keeps (0, 0..=1, 0..=1) = all of tile 0.
    assert_eq!(rows(&m, 0, 32), vec![(0, 4)]);
    // Token 3 is (0, 1, 1): keeps h 0..=2, w 0..=2 in frame 0: all of tile 0, column 0 of
    // tile 1 (tokens 4, 6), row 0 of tile 2 (8, 9) and token 12 of tile 3.
    assert_eq!(rows(&m, 3, 32), vec![(0, 5), (6, 7), (8, 10), (12, 13)]);
    // Whole-tile windows merge consecutive tiles.
    let m = Mask::parse("video:2,4,4:0,3,3@tiles:1,2,2").unwrap();
    assert_eq!(rows(&m, 17, 32), vec![(16, 32)]);
}

#[test]
fn sta_windows_shift_inward_at_borders() {
    // One frame, 1 x 10 tiles of 1 x 1 x 2 tokens: 5 tiles along w, kernel 3 tiles.
    let m = Mask::parse("sta:1,1,10:1,1,3:1,1,2").unwrap();
    // Query in tile 0: centre clamped to tile 1 -> tiles 0..=2 (tokens 0..6).
    assert_eq!(rows(&m, 0, 10), vec![(0, 6)]);
    // Query in tile 2 -> tiles 1..=3.
    assert_eq!(rows(&m, 5, 10), vec![(2, 8)]);
    // Query in tile 4 -> centre clamped to 3 -> tiles 2..=4.
    assert_eq!(rows(&m, 9, 10), vec![(4, 10)]);
    // A kernel as large as the tile grid keeps everything.
    assert!(Mask::parse("sta:1,1,10:1,1,5:1,1,2").unwrap().is_full());
    assert!(Mask::parse("sta:1,1,10:1,1,7:1,1,2").unwrap().is_full());
    assert!(!m.is_full());
}

#[test]
fn video_expression_terms_count_index_arithmetic() {
    // Only the frame test is needed: f = t / (H W) for q and k, |fq - fk| <= 4.
    let t = Mask::parse("video:21,45,80:4,45,80").unwrap().expression_terms();
    assert_eq!(t, MaskTerms { compares: 1, combines: 0, arith: 4, loaded_only: false });
    let t = Mask::parse("video:21,45,80:4,45,80@position").unwrap().expression_terms();
    assert_eq!((t.compares, t.arith), (1, 4)); // f = t % F
                                               // All three dimensions: coordinates (1 + 2 + 1 ops per position), 3 abs-diff-compares,
                                               // 2 combines.
    let t = Mask::parse("video:21,45,80:4,9,10").unwrap().expression_terms();
    assert_eq!(t, MaskTerms { compares: 3, combines: 2, arith: 2 * (1 + 2 + 1) + 3 * 2, loaded_only: false });
    let t = Mask::parse("video:30,48,80:18,24,24@tiles:6,8,8").unwrap().expression_terms();
    assert_eq!((t.compares, t.combines, t.arith), (3, 2, 2 * (5 + 6 + 5) + 6));
    // STA in its own layout: tile digits (1 + 2 + 2 ops), clamp of the centre (2 per dim).
    let t = Mask::parse("sta:30,48,80:3,3,5:6,8,8").unwrap().expression_terms();
    assert_eq!((t.compares, t.combines, t.arith), (3, 2, 2 * (1 + 2 + 2) + 3 * 2 + 3 * 2));
    // A window spanning the volume is full and costs nothing.
    let m = Mask::parse("video:2,3,4:1,2,3").unwrap();
    assert!(m.is_full());
    assert_eq!(m.expression_terms(), MaskTerms::default());
    // Combined masks add their parts plus one combine per operator.
    let t = Mask::parse("video:21,45,80:4,45,80+sink:3600").unwrap().expression_terms();
    assert_eq!((t.compares, t.combines, t.arith), (2, 1, 4));
}

#[test]
fn video_errors_name_the_field() {
    let e = err("video:21,45,80:-1,45,80");
    assert!(e.contains("'video' window wf = -1") && e.contains("non-negative"), "{e}");
    let e = err("video:0,45,80:1,1,1");
    assert!(e.contains("'video' volume F = 0") && e.contains("at least 1"), "{e}");
    let e = err("video:21,45:1,1,1");
    assert!(e.contains("'video' volume needs 3 numbers F,H,W"), "{e}");
    let e = err("video:21,45,80");
    assert!(e.contains("video:F,H,W:wf,wh,ww"), "{e}");
    let e = err("video:21,45,80:4,45,80@tiles:6,8,8");
    assert!(e.contains("frames F = 21 is not a multiple of tf = 6"), "{e}");
    let e = err("video:21,45,80:4,45,80@tiles:0,9,8");
    assert!(e.contains("tf = 0"), "{e}");
    let e = err("video:21,45,80:4,45,80@diagonal");
    assert!(e.contains("unknown video order '@diagonal'") && e.contains("@position"), "{e}");
    let e = err("sta:30,48,80:2,3,3:6,8,8");
    assert!(e.contains("kernel kf = 2") && e.contains("odd"), "{e}");
    let e = err("sta:30,48,80:3,3,3:7,8,8");
    assert!(e.contains("frames F = 30 is not a multiple of tf = 7"), "{e}");
    let e = err("video:65536,65536,2:1,1,1");
    assert!(e.contains("volume 65536 x 65536 x 2"), "{e}");
    // The volume must match both lengths.
    let m = Mask::parse("video:21,45,80:4,45,80").unwrap();
    m.check_lengths(75_600, 75_600).unwrap();
    let e = m.check_lengths(75_601, 75_600).unwrap_err().to_string();
    assert!(
        e.contains("video:21,45,80:4,45,80") && e.contains("75600") && e.contains("q_len = 75601") && e.contains("kv_len = 75600"),
        "{e}"
    );
    let e = Mask::parse("causal+video:2,2,2:1,1,1").unwrap().check_lengths(8, 9).unwrap_err().to_string();
    assert!(e.contains("= 8 tokens") && e.contains("kv_len = 9"), "{e}");
}

#[test]
fn per_head_lists() {
    let m = Mask::parse("per-head[4*band:100;6*causal]").unwrap();
    let Mask::PerHead(list) = &m else { panic!() };
    assert_eq!(list.len(), 10);
    assert!(list[..4].iter().all(|x| *x == Mask::Band { width: 100 }));
    assert!(list[4..].iter().all(|x| *x == Mask::Causal { offset: 0 }));
    assert_eq!(m.to_string(), "per-head[4*band:100;6*causal]");
    // Resolved per q head (10 masks for 10 heads) or per kv head group (2 masks, 5 q heads each).
    let mut w = AttentionCall { q_heads: 10, kv_heads: 2, mask: m, ..AttentionCall::video_default() };
    w.validate().unwrap();
    assert_eq!(*w.mask_for_head(3), Mask::Band { width: 100 });
    assert_eq!(*w.mask_for_head(4), Mask::Causal { offset: 0 });
    w.mask = Mask::parse("per-head[causal;sink:4]").unwrap();
    w.validate().unwrap();
    assert_eq!(*w.mask_for_head(4), Mask::Causal { offset: 0 });
    assert_eq!(*w.mask_for_head(5), Mask::Sink { tokens: 4 });
    w.mask = Mask::parse("per-head[3*causal]").unwrap();
    let e = w.validate().unwrap_err().to_string();
    assert!(e.contains("`mask`") && e.contains("3 per-head masks"), "{e}");
    // Errors.
    let e = err("per-head[]");
    assert!(e.contains("at least one mask"), "{e}");
    let e = err("per-head[0*causal]");
    assert!(e.contains("repeat count 0"), "{e}");
    let e = err("per-head[causal;band:2");
    assert!(e.contains("expected ';' or ']'"), "{e}");
    let e = err("per-head[causal;per-head[full]]");
    assert!(e.contains("cannot nest"), "{e}");
    let e = err("per-head[causal]+sink:3");
    assert!(e.contains("cannot be combined"), "{e}");
    let e = err("per-head[99999*causal]");
    assert!(e.contains("65536"), "{e}");
    let e = err("per-head");
    assert!(e.contains("bracketed list"), "{e}");
    let e = err("per-head[causal;diagonal]");
    assert!(e.contains("unknown mask word 'diagonal'"), "{e}");
}

const BLOCKS: &str = r#"{"q_len": 40, "kv_len": 30, "block_q": 16, "block_kv": 8, "blocks": [[0, 0], [1, 1], [1, 2], [2, 3]]}"#;
const RANGES: &str = r#"{"q_len": 40, "kv_len": 30,
  "rows": [{"q": [0, 10], "kv": [[0, 5], [20, 30]]},
           {"q": [5, 20], "kv": [[4, 8]]},
           {"q": [30, 40], "kv": []}]}"#;

#[test]
fn block_and_range_files() {
    let b = Tmp::new("blocks", BLOCKS);
    let m = loaded(&format!("file:{}", b.path())).unwrap();
    assert!(matches!(m, Mask::Blocks(_)));
    m.check_lengths(40, 30).unwrap();
    assert_eq!(rows(&m, 3, 30), vec![(0, 8)]);
    assert_eq!(rows(&m, 20, 30), vec![(8, 24)]);
    assert_eq!(rows(&m, 39, 30), vec![(24, 30)]); // last kv block is 6 columns wide
    assert_eq!(m.expression_terms(), MaskTerms { loaded_only: true, ..Default::default() });

    let r = Tmp::new("ranges", RANGES);
    let m = loaded(&format!("file:{}", r.path())).unwrap();
    assert!(matches!(m, Mask::Ranges(_)));
    m.check_lengths(40, 30).unwrap();
    assert_eq!(rows(&m, 0, 30), vec![(0, 5), (20, 30)]);
    assert_eq!(rows(&m, 7, 30), vec![(0, 8), (20, 30)]); // overlapping entries are unioned
    assert_eq!(rows(&m, 12, 30), vec![(4, 8)]);
    assert!(rows(&m, 25, 30).is_empty()); // not listed
    assert!(rows(&m, 35, 30).is_empty()); // listed with no kv ranges
    assert_eq!(rows(&m, 7, 22), vec![(0, 8), (20, 22)]);
    assert!(m.expression_terms().loaded_only);
    let st = TileStats::collect(&m, &TileGrid { q_len: 40, kv_len: 30, block_q: 8, block_kv: 8 }, false);
    assert_eq!(st.kept_pairs, 5 * 15 + 5 * 18 + 10 * 4); // rows 0-4, 5-9 (unioned), 10-19

    // Files inside combinations and per-head lists print in parseable form.
    for text in [
        format!("causal+file:{}", r.path()),
        format!("(file:{})&band:3", b.path()),
        format!("per-head[file:{};2*causal]", r.path()),
        format!("sink:2+(file:{})&causal", r.path()),
    ] {
        let m = Mask::parse(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(Mask::parse(&m.to_string()).unwrap(), m, "{text} -> {m}");
    }
}

fn file_err(name: &str, json: &str) -> String {
    let t = Tmp::new(name, json);
    let e = loaded(&format!("file:{}", t.path())).unwrap_err().to_string();
    assert!(e.contains(t.path()), "the error names the file: {e}");
    e
}

#[test]
fn file_errors_name_the_field() {
    // Lengths that differ from the workload's.
    let b = Tmp::new("len", BLOCKS);
    let m = loaded(&format!("file:{}", b.path())).unwrap();
    let e = m.check_lengths(40, 31).unwrap_err().to_string();
    assert!(e.contains(b.path()) && e.contains("'q_len' x 'kv_len' = 40 x 30") && e.contains("40 x 31"), "{e}");
    let r = Tmp::new("len2", RANGES);
    let e = loaded(&format!("causal+file:{}", r.path())).unwrap().check_lengths(41, 30).unwrap_err().to_string();
    assert!(e.contains("'q_len' x 'kv_len' = 40 x 30") && e.contains("41 x 30"), "{e}");
    let w = AttentionCall { q_len: 41, kv_len: 30, mask: m, ..AttentionCall::video_default() };
    let e = w.validate().unwrap_err().to_string();
    assert!(e.contains("`mask`") && e.contains("40 x 30"), "{e}");

    // Block format.
    let e = file_err("oob", r#"{"q_len": 40, "kv_len": 30, "block_q": 16, "block_kv": 8, "blocks": [[0, 0], [3, 0]]}"#);
    assert!(e.contains("'blocks'[1] = [3, 0]") && e.contains("3 x 4 block grid"), "{e}");
    let e = file_err("zero", r#"{"q_len": 40, "kv_len": 30, "block_q": 0, "block_kv": 8, "blocks": []}"#);
    assert!(e.contains("'block_q' = 0"), "{e}");
    let e = file_err("missing", r#"{"q_len": 40, "kv_len": 30, "block_kv": 8, "blocks": []}"#);
    assert!(e.contains("block_q"), "{e}");
    let e = file_err("unknown", r#"{"q_len": 40, "kv_len": 30, "block_q": 8, "block_kv": 8, "blocks": [], "bloks": 1}"#);
    assert!(e.contains("bloks"), "{e}");

    // Range format.
    let e = file_err(
        "kv",
        r#"{"q_len": 40, "kv_len": 30, "rows": [{"q": [0, 1], "kv": []}, {"q": [0, 1], "kv": []}, {"q": [0, 1], "kv": []}, {"q": [0, 4], "kv": [[0, 1], [10, 5]]}]}"#,
    );
    assert!(e.contains("rows[3].kv[1] = [10, 5]: expected k0 < k1 <= kv_len (30)"), "{e}");
    let e = file_err("kvlen", r#"{"q_len": 40, "kv_len": 30, "rows": [{"q": [0, 4], "kv": [[0, 31]]}]}"#);
    assert!(e.contains("rows[0].kv[0] = [0, 31]"), "{e}");
    let e = file_err("q", r#"{"q_len": 40, "kv_len": 30, "rows": [{"q": [5, 41], "kv": []}]}"#);
    assert!(e.contains("rows[0].q = [5, 41]: expected [q0, q1] with q0 < q1 <= q_len (40)"), "{e}");
    let e = file_err("qshape", r#"{"q_len": 40, "kv_len": 30, "rows": [{"q": [5], "kv": []}]}"#);
    assert!(e.contains("rows[0].q = [5]"), "{e}");
    let e = file_err("nokv", r#"{"q_len": 40, "kv_len": 30, "rows": [{"q": [0, 4], "kv": []}, {"q": [0, 4]}]}"#);
    assert!(e.contains("rows[1]: missing field 'kv'"), "{e}");
    let e = file_err("noqlen", r#"{"kv_len": 30, "rows": []}"#);
    assert!(e.contains("missing field 'q_len'"), "{e}");
    let e = file_err("zerolen", r#"{"q_len": 0, "kv_len": 30, "rows": []}"#);
    assert!(e.contains("'q_len' = 0"), "{e}");
    let e = file_err("neglen", r#"{"q_len": -4, "kv_len": 30, "rows": []}"#);
    assert!(e.contains("'q_len' = -4"), "{e}");
    let e = file_err("rowkey", r#"{"q_len": 40, "kv_len": 30, "rows": [{"q": [0, 4], "kv": [], "k": 1}]}"#);
    assert!(e.contains("rows[0]: unknown field 'k'"), "{e}");
    let e = file_err("rowsobj", r#"{"q_len": 40, "kv_len": 30, "rows": {"q": [0, 4]}}"#);
    assert!(e.contains("field 'rows'") && e.contains("expected an array"), "{e}");

    // Shape of the file as a whole.
    let e = file_err("malformed", r#"{"q_len": 40, "kv_len": 30, "rows": [}"#);
    assert!(e.contains("malformed JSON") && e.contains("line 1"), "{e}");
    let e = file_err("neither", r#"{"q_len": 40, "kv_len": 30}"#);
    assert!(e.contains("missing field 'blocks'") && e.contains("'rows'"), "{e}");
    let e = file_err("both", r#"{"q_len": 40, "kv_len": 30, "rows": [], "blocks": []}"#);
    assert!(e.contains("both 'blocks' and 'rows'"), "{e}");
    let e = file_err("array", "[1, 2]");
    assert!(e.contains("expected a JSON object") && e.contains("an array"), "{e}");
    let e = err("file:/nonexistent/tpusim-mask.json");
    assert!(e.contains("/nonexistent/tpusim-mask.json") && e.contains("cannot read"), "{e}");
    let e = err("file:");
    assert!(e.contains("needs a path"), "{e}");
}

#[test]
fn row_classes_are_shared_only_where_rows_repeat() {
    assert!(Mask::parse("video:2,3,4:1,0,0+sink:3").unwrap().has_row_classes());
    assert!(!Mask::parse("video:2,3,4:1,0,0+causal").unwrap().has_row_classes());
    let m = Mask::parse("video:21,45,80:4,45,80@position").unwrap();
    let key = |q: u64| {
        let mut k = Vec::new();
        m.row_key(q, &mut k);
        k
    };
    // Position-major with whole-frame windows: rows with the same frame share a key.
    assert_eq!(key(3), key(3 + 21 * 17));
    assert_ne!(key(3), key(4));
}

#[test]
fn causal_and_local_take_splash_offsets() {
    // Decode: one new query after 4095 cached tokens sits at kv position 4095 and sees them all;
    // plain causal counts from the first token of both and keeps one pair.
    assert_eq!(rows(&Mask::parse("causal").unwrap(), 0, 4096), vec![(0, 1)]);
    let decode = Mask::parse("causal@offset:4095").unwrap();
    assert_eq!(decode, Mask::Causal { offset: 4095 });
    assert_eq!(rows(&decode, 0, 4096), vec![(0, 4096)]);
    // Splash's LocalMask: q + offset - left <= k <= q + offset + right.
    let local = Mask::parse("local:2,1@offset:10").unwrap();
    assert_eq!(local, Mask::Local { left: 2, right: 1, offset: 10 });
    assert_eq!(rows(&local, 0, 100), vec![(8, 12)]);
    assert_eq!(rows(&local, 95, 100), vec![]);
    // A negative offset empties the first rows (Splash: rows with q + offset < 0 keep nothing).
    let neg = Mask::parse("causal@offset:-3").unwrap();
    assert_eq!(rows(&neg, 2, 10), vec![]);
    assert_eq!(rows(&neg, 3, 10), vec![(0, 1)]);
    assert_eq!(rows(&Mask::parse("local:1,1@offset:-5").unwrap(), 2, 10), vec![]);
    // Offset 0 is the plain mask; Display writes offsets back in the grammar.
    assert_eq!(Mask::parse("causal@offset:0").unwrap(), Mask::parse("causal").unwrap());
    for s in ["causal@offset:7", "local:3,0@offset:-2", "(causal@offset:5+sink:2)&band:9", "per-head[2*causal@offset:1;local:1,1@offset:4]"]
    {
        let m = Mask::parse(s).unwrap();
        assert_eq!(m.to_string(), s);
        assert_eq!(Mask::parse(&m.to_string()).unwrap(), m, "{s}");
    }
    assert_eq!(Mask::parse("causal @offset: 4").unwrap(), Mask::Causal { offset: 4 }, "spaces are ignored");
    // Tiles of a decode step: q_len 8 after 1016 cached tokens, 8 x 128 tiles: all 8 kv tiles
    // are visited; the last one is partial (its rows end at different columns).
    let g = TileGrid { q_len: 8, kv_len: 1024, block_q: 8, block_kv: 128 };
    let s = TileStats::collect(&Mask::Causal { offset: 1016 }, &g, false);
    assert_eq!((s.full, s.partial, s.empty), (7, 1, 0));
    assert_eq!(s.kept_pairs, (1017..=1024).sum::<u64>());
}

#[test]
fn offsets_are_refused_where_splash_has_none_and_out_of_range() {
    for (text, want) in [
        ("band:4@offset:2", "'band' takes no '@offset:2'"),
        ("sink:4@frame", "'sink' takes no '@frame'"),
        ("causal@shift:2", "unknown modifier '@shift:2' of 'causal'"),
        ("causal@offset:", "the offset must be a whole number"),
        ("causal@offset:1.5", "the offset must be a whole number"),
        ("local:1,1@offset:99999999999", "from -4294967296 to 4294967296"),
    ] {
        let e = err(text);
        assert!(e.contains(want), "{text}: {e}");
    }
    assert!(err("nonsense").contains("causal[@offset:N]"), "the allowed list names the offset");
}

#[test]
fn a_file_term_followed_by_an_operator_says_how_to_join_it() {
    let e = super::files::read_mask_file("/nonexistent/b.json+causal").unwrap_err().to_string();
    assert!(e.contains("put it last, or in ( )"), "{e}");
    let e = super::files::read_mask_file("/nonexistent/b.json").unwrap_err().to_string();
    assert!(!e.contains("put it last"), "{e}");
}
