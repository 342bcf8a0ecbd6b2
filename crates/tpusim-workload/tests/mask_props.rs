//! Property tests: masks and tile classification against a brute-force pair oracle.
//!
//! Random masks are described by `Spec` (a test-side mirror of the grammar), printed as
//! `--mask` text (file masks are written to temporary files), parsed with `Mask::parse`, and
//! checked against `Spec::keeps`, an independent per-pair definition: video coordinates come
//! from explicitly enumerated token-order tables, STA windows from the reference formula
//! (kernel centre = min(max(Tq, k/2), NT - 1 - k/2)).

use proptest::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use tpusim_workload::mask::VideoMask;
use tpusim_workload::tiles::{for_each_tile_row, TileGrid, TileKind, TileStats};
use tpusim_workload::Mask;

#[derive(Debug, Clone)]
enum Order {
    Frame,
    Position,
    Tiles([u64; 3]),
}

#[derive(Debug, Clone)]
enum Win {
    Tokens([u64; 3]),
    Sta { kernel: [u64; 3], tile: [u64; 3] },
}

/// A range-file entry: [q0, q1) keeps the listed [k0, k1) ranges.
type RangeEntry = ((u64, u64), Vec<(u64, u64)>);

#[derive(Debug, Clone)]
enum Spec {
    Full,
    /// Causal with an offset (Splash's `CausalMask(offset=...)`).
    Causal(i64),
    /// Local with left, right and an offset (Splash's `LocalMask`).
    Local(u64, u64, i64),
    Band(u64),
    Sink(u64),
    Chunked(u64),
    Video {
        dims: [u64; 3],
        win: Win,
        order: Option<Order>,
    },
    Blocks {
        bq: u64,
        bkv: u64,
        blocks: Vec<(u64, u64)>,
    },
    Ranges {
        rows: Vec<RangeEntry>,
    },
    Union(Vec<Spec>),
    Inter(Vec<Spec>),
}

/// Token -> (f, h, w) by enumerating the order's nested loops (independent of the crate).
fn coord_table(dims: [u64; 3], order: &Order) -> Vec<[u64; 3]> {
    let [nf, nh, nw] = dims;
    let mut t = Vec::new();
    match order {
        Order::Frame => {
            for f in 0..nf {
                for h in 0..nh {
                    for w in 0..nw {
                        t.push([f, h, w]);
                    }
                }
            }
        }
        Order::Position => {
            for h in 0..nh {
                for w in 0..nw {
                    for f in 0..nf {
                        t.push([f, h, w]);
                    }
                }
            }
        }
        Order::Tiles([tf, th, tw]) => {
            for bf in 0..nf / tf {
                for bh in 0..nh / th {
                    for bw in 0..nw / tw {
                        for f in 0..*tf {
                            for h in 0..*th {
                                for w in 0..*tw {
                                    t.push([bf * tf + f, bh * th + h, bw * tw + w]);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    t
}

impl Spec {
    fn order(&self) -> Order {
        match self {
            Spec::Video { win, order, .. } => match (order, win) {
                (Some(o), _) => o.clone(),
                (None, Win::Tokens(_)) => Order::Frame,
                (None, Win::Sta { tile, .. }) => Order::Tiles(*tile),
            },
            _ => unreachable!(),
        }
    }

    /// Is pair (q, k) kept? (1-D and file leaves; video leaves and combinations go through
    /// [`Spec::matrix`].)
    fn keeps(&self, q: u64, k: u64) -> bool {
        let (qi, ki) = (q as i64, k as i64);
        match self {
            Spec::Full => true,
            Spec::Causal(o) => ki <= qi + o,
            Spec::Local(l, r, o) => qi + o - *l as i64 <= ki && ki <= qi + o + *r as i64,
            Spec::Band(w) => (qi - ki).abs() <= *w as i64,
            Spec::Sink(s) => k < *s,
            Spec::Chunked(c) => k <= q && k / c == q / c,
            Spec::Video { .. } | Spec::Union(_) | Spec::Inter(_) => {
                unreachable!("evaluated by matrix")
            }
            Spec::Blocks { bq, bkv, blocks } => blocks.contains(&(q / bq, k / bkv)),
            Spec::Ranges { rows } => rows.iter().any(|((q0, q1), kv)| *q0 <= q && q < *q1 && kv.iter().any(|(k0, k1)| *k0 <= k && k < *k1)),
        }
    }

    /// The kept matrix, row-major (q_len x kv_len); video tables are built once per leaf.
    fn matrix(&self, q_len: u64, kv_len: u64) -> Vec<bool> {
        match self {
            Spec::Video { .. } => {
                // Evaluate through a per-leaf table to keep the oracle fast.
                let table = coord_table(self.video_dims(), &self.order());
                let mut m = vec![false; (q_len * kv_len) as usize];
                for q in 0..q_len {
                    for k in 0..kv_len {
                        m[(q * kv_len + k) as usize] = self.video_keeps(&table, q, k);
                    }
                }
                m
            }
            Spec::Union(p) => {
                let ms: Vec<Vec<bool>> = p.iter().map(|s| s.matrix(q_len, kv_len)).collect();
                (0..ms[0].len()).map(|i| ms.iter().any(|m| m[i])).collect()
            }
            Spec::Inter(p) => {
                let ms: Vec<Vec<bool>> = p.iter().map(|s| s.matrix(q_len, kv_len)).collect();
                (0..ms[0].len()).map(|i| ms.iter().all(|m| m[i])).collect()
            }
            _ => {
                let mut m = Vec::with_capacity((q_len * kv_len) as usize);
                for q in 0..q_len {
                    for k in 0..kv_len {
                        m.push(self.keeps(q, k));
                    }
                }
                m
            }
        }
    }

    fn video_dims(&self) -> [u64; 3] {
        match self {
            Spec::Video { dims, .. } => *dims,
            _ => unreachable!(),
        }
    }

    fn video_keeps(&self, table: &[[u64; 3]], q: u64, k: u64) -> bool {
        let Spec::Video { dims, win, .. } = self else { unreachable!() };
        let (a, b) = (table[q as usize], table[k as usize]);
        (0..3).all(|i| match win {
            Win::Tokens(w) => (a[i] as i64 - b[i] as i64).abs() <= w[i] as i64,
            Win::Sta { kernel, tile } => {
                let nt = (dims[i] / tile[i]) as i64;
                let half = (kernel[i] / 2) as i64;
                let centre = ((a[i] / tile[i]) as i64).max(half).min(nt - 1 - half);
                (centre - (b[i] / tile[i]) as i64).abs() <= half
            }
        })
    }

    /// `--mask` text; file masks are written to temporary files recorded in `files`.
    fn text(&self, q_len: u64, kv_len: u64, files: &mut TempFiles) -> String {
        let t3 = |v: &[u64; 3]| format!("{},{},{}", v[0], v[1], v[2]);
        let part = |s: &Spec, files: &mut TempFiles, in_inter: bool| {
            let t = s.text(q_len, kv_len, files);
            let paren =
                matches!(s, Spec::Union(_) | Spec::Blocks { .. } | Spec::Ranges { .. }) || (in_inter && matches!(s, Spec::Inter(_)));
            if paren {
                format!("({t})")
            } else {
                t
            }
        };
        match self {
            Spec::Full => "full".into(),
            Spec::Causal(0) => "causal".into(),
            Spec::Causal(o) => format!("causal@offset:{o}"),
            Spec::Local(l, r, 0) => format!("local:{l},{r}"),
            Spec::Local(l, r, o) => format!("local:{l},{r} @offset:{o}"),
            Spec::Band(w) => format!("band:{w}"),
            Spec::Sink(s) => format!("sink:{s}"),
            Spec::Chunked(c) => format!("chunked:{c}"),
            Spec::Video { dims, win, order } => {
                let mut s = match win {
                    Win::Tokens(w) => format!("video:{}:{}", t3(dims), t3(w)),
                    Win::Sta { kernel, tile } => {
                        format!("sta:{}:{}:{}", t3(dims), t3(kernel), t3(tile))
                    }
                };
                match order {
                    None => {}
                    Some(Order::Frame) => s.push_str("@frame"),
                    Some(Order::Position) => s.push_str("@position"),
                    Some(Order::Tiles(t)) => s.push_str(&format!("@tiles:{}", t3(t))),
                }
                s
            }
            Spec::Blocks { bq, bkv, blocks } => {
                let b: Vec<String> = blocks.iter().map(|(a, b)| format!("[{a}, {b}]")).collect();
                let json = format!(
                    r#"{{"q_len": {q_len}, "kv_len": {kv_len}, "block_q": {bq}, "block_kv": {bkv}, "blocks": [{}]}}"#,
                    b.join(", ")
                );
                format!("file:{}", files.write(&json))
            }
            Spec::Ranges { rows } => {
                let r: Vec<String> = rows
                    .iter()
                    .map(|((q0, q1), kv)| {
                        let kv: Vec<String> = kv.iter().map(|(a, b)| format!("[{a},{b}]")).collect();
                        format!(r#"{{"q": [{q0}, {q1}], "kv": [{}]}}"#, kv.join(","))
                    })
                    .collect();
                let json = format!(r#"{{"q_len": {q_len}, "kv_len": {kv_len}, "rows": [{}]}}"#, r.join(", "));
                format!("file:{}", files.write(&json))
            }
            Spec::Union(p) => p.iter().map(|s| part(s, files, false)).collect::<Vec<_>>().join("+"),
            Spec::Inter(p) => p.iter().map(|s| part(s, files, true)).collect::<Vec<_>>().join("&"),
        }
    }
}

/// Temporary mask files, removed on drop.
struct TempFiles(Vec<std::path::PathBuf>);

static NEXT: AtomicUsize = AtomicUsize::new(0);

impl TempFiles {
    fn write(&mut self, json: &str) -> String {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("tpusim-mask-prop-{}-{n}.json", std::process::id()));
        std::fs::write(&p, json).unwrap();
        self.0.push(p.clone());
        p.to_str().unwrap().to_string()
    }
}

impl Drop for TempFiles {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn divisors(n: u64) -> Vec<u64> {
    (1..=n).filter(|d| n.is_multiple_of(*d)).collect()
}

fn video_leaf(dims: [u64; 3]) -> BoxedStrategy<Spec> {
    let [nf, nh, nw] = dims;
    let tile = (proptest::sample::select(divisors(nf)), proptest::sample::select(divisors(nh)), proptest::sample::select(divisors(nw)))
        .prop_map(|(a, b, c)| [a, b, c]);
    let order =
        prop_oneof![Just(None), Just(Some(Order::Frame)), Just(Some(Order::Position)), tile.clone().prop_map(|t| Some(Order::Tiles(t))),];
    let win = prop_oneof![
        (0..=nf, 0..=nh, 0..=nw).prop_map(|(a, b, c)| Win::Tokens([a, b, c])),
        ((0..3u64), (0..3u64), (0..3u64), tile).prop_map(|(a, b, c, tile)| Win::Sta { kernel: [2 * a + 1, 2 * b + 1, 2 * c + 1], tile }),
    ];
    (win, order).prop_map(move |(win, order)| Spec::Video { dims, win, order }).boxed()
}

fn blocks_leaf(q_len: u64, kv_len: u64) -> BoxedStrategy<Spec> {
    (1..=64u64, 1..=64u64)
        .prop_flat_map(move |(bq, bkv)| {
            let (nq, nk) = (q_len.div_ceil(bq), kv_len.div_ceil(bkv));
            proptest::collection::vec((0..nq, 0..nk), 0..12).prop_map(move |blocks| Spec::Blocks { bq, bkv, blocks })
        })
        .boxed()
}

fn range(len: u64) -> impl Strategy<Value = (u64, u64)> {
    (0..len).prop_flat_map(move |a| (Just(a), a + 1..=len))
}

fn ranges_leaf(q_len: u64, kv_len: u64) -> BoxedStrategy<Spec> {
    proptest::collection::vec((range(q_len), proptest::collection::vec(range(kv_len), 0..4)), 0..6)
        .prop_map(|rows| Spec::Ranges { rows })
        .boxed()
}

fn spec(q_len: u64, kv_len: u64, dims: Option<[u64; 3]>) -> BoxedStrategy<Spec> {
    let basic = prop_oneof![
        Just(Spec::Full),
        prop_oneof![Just(0i64), -300..300i64].prop_map(Spec::Causal),
        (0..250u64, 0..250u64, prop_oneof![Just(0i64), -300..300i64]).prop_map(|(l, r, o)| Spec::Local(l, r, o)),
        (0..250u64).prop_map(Spec::Band),
        (0..250u64).prop_map(Spec::Sink),
        (1..100u64).prop_map(Spec::Chunked),
        blocks_leaf(q_len, kv_len),
        ranges_leaf(q_len, kv_len),
    ];
    let leaf = match dims {
        Some(d) => prop_oneof![2 => video_leaf(d), 1 => basic].boxed(),
        None => basic.boxed(),
    };
    leaf.prop_recursive(2, 8, 3, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 2..4).prop_map(Spec::Union),
            proptest::collection::vec(inner, 2..4).prop_map(Spec::Inter),
        ]
    })
    .boxed()
}

#[derive(Debug, Clone)]
struct Case {
    q_len: u64,
    kv_len: u64,
    bq: u64,
    bkv: u64,
    spec: Spec,
}

fn case() -> impl Strategy<Value = Case> {
    let shape = prop_oneof![
        (1..200u64, 1..200u64).prop_map(|(q, k)| (q, k, None)),
        (1..=5u64, 1..=6u64, 1..=6u64).prop_map(|(f, h, w)| (f * h * w, f * h * w, Some([f, h, w]))),
    ];
    shape.prop_flat_map(|(q_len, kv_len, dims)| {
        (1..=64u64, 1..=64u64, spec(q_len, kv_len, dims)).prop_map(move |(bq, bkv, spec)| Case { q_len, kv_len, bq, bkv, spec })
    })
}

/// Brute-force kept counts per tile, indexed [q tile][kv tile].
fn brute_counts(kept: &[bool], g: &TileGrid) -> Vec<Vec<u64>> {
    let mut out = vec![vec![0u64; g.kv_tiles() as usize]; g.q_tiles() as usize];
    for q in 0..g.q_len {
        for k in 0..g.kv_len {
            if kept[(q * g.kv_len + k) as usize] {
                out[(q / g.block_q) as usize][(k / g.block_kv) as usize] += 1;
            }
        }
    }
    out
}

fn parse_case(c: &Case, files: &mut TempFiles) -> (String, Mask) {
    let text = c.spec.text(c.q_len, c.kv_len, files);
    let mask =
        Mask::parse(&text).and_then(|m| m.load_files(&tpusim_workload::mask::read_mask_file)).unwrap_or_else(|e| panic!("{text}: {e}"));
    mask.check_lengths(c.q_len, c.kv_len).unwrap_or_else(|e| panic!("{text}: {e}"));
    (text, mask)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 320, ..ProptestConfig::default() })]

    /// Exact classification: kept counts and kinds equal the brute-force pair count.
    #[test]
    fn classification_matches_brute_force(c in case()) {
        let mut files = TempFiles(Vec::new());
        let (text, mask) = parse_case(&c, &mut files);
        let g = TileGrid { q_len: c.q_len, kv_len: c.kv_len, block_q: c.bq, block_kv: c.bkv };
        let kept = c.spec.matrix(c.q_len, c.kv_len);
        let want = brute_counts(&kept, &g);
        let mut rows_seen = 0;
        for_each_tile_row(&mask, &g, false, |qi, row| {
            rows_seen += 1;
            assert_eq!(row.len() as u64, g.kv_tiles());
            for (kj, t) in row.iter().enumerate() {
                let n = want[qi as usize][kj];
                let (rows, cols) = (g.real_rows(qi), g.real_cols(kj as u64));
                let padded = rows < g.block_q || cols < g.block_kv;
                let kind = if n == 0 {
                    TileKind::Empty
                } else if n == rows * cols && !padded {
                    TileKind::Full
                } else {
                    TileKind::Partial
                };
                assert_eq!((t.kept, t.kind), (n, kind), "{text} q_len {} kv_len {} blocks {}x{} tile ({qi}, {kj})", c.q_len, c.kv_len, c.bq, c.bkv);
            }
        });
        prop_assert_eq!(rows_seen, g.q_tiles());
        let st = TileStats::collect(&mask, &g, false);
        prop_assert_eq!(st.kept_pairs, kept.iter().filter(|b| **b).count() as u64);
        prop_assert_eq!(st.total, st.empty + st.partial + st.full);
    }

    /// Video masks at small blocks (many kv tiles per row, so classification counts by rank
    /// at tile boundaries as well as by intervals): counts equal the brute-force count.
    #[test]
    fn video_classification_small_blocks(
        (spec, n, bq, bkv) in (1..=5u64, 1..=6u64, 2..=7u64)
            .prop_flat_map(|(f, h, w)| (video_leaf([f, h, w]), Just(f * h * w), 1..=12u64, 1..=12u64))
    ) {
        let mut files = TempFiles(Vec::new());
        let c = Case { q_len: n, kv_len: n, bq, bkv, spec };
        let (text, mask) = parse_case(&c, &mut files);
        let g = TileGrid { q_len: n, kv_len: n, block_q: bq, block_kv: bkv };
        let want = brute_counts(&c.spec.matrix(n, n), &g);
        for_each_tile_row(&mask, &g, false, |qi, row| {
            let got: Vec<u64> = row.iter().map(|t| t.kept).collect();
            assert_eq!(got, want[qi as usize], "{text} blocks {bq}x{bkv} q tile {qi}");
        });
    }

    /// Tile alignment: kept tiles hold >= half their real pairs in the exact mask, dropped
    /// tiles < half; kept tiles are whole; no partial tiles except ones holding padding.
    #[test]
    fn alignment_rounds_at_half(c in case()) {
        let mut files = TempFiles(Vec::new());
        let (text, mask) = parse_case(&c, &mut files);
        let g = TileGrid { q_len: c.q_len, kv_len: c.kv_len, block_q: c.bq, block_kv: c.bkv };
        let want = brute_counts(&c.spec.matrix(c.q_len, c.kv_len), &g);
        for_each_tile_row(&mask, &g, true, |qi, row| {
            for (kj, t) in row.iter().enumerate() {
                let exact = want[qi as usize][kj];
                let (rows, cols) = (g.real_rows(qi), g.real_cols(kj as u64));
                let real = rows * cols;
                let padded = rows < g.block_q || cols < g.block_kv;
                let ctx = format!("{text} tile ({qi}, {kj}) exact {exact} of {real}");
                if t.kind == TileKind::Empty {
                    assert!(2 * exact < real, "{ctx}: dropped at >= half");
                    assert_eq!(t.kept, 0, "{ctx}");
                } else {
                    assert!(2 * exact >= real && exact > 0, "{ctx}: kept below half");
                    assert_eq!(t.kept, real, "{ctx}: kept tiles are whole");
                    let kind = if padded { TileKind::Partial } else { TileKind::Full };
                    assert_eq!(t.kind, kind, "{ctx}: partial only with padding");
                }
            }
        });
    }

    /// Row intervals: sorted, disjoint, maximal, non-empty, within [0, kv_len), and exactly the
    /// oracle's kept set; Display parses back to the same mask.
    #[test]
    fn rows_are_canonical_and_display_round_trips(c in case()) {
        let mut files = TempFiles(Vec::new());
        let (text, mask) = parse_case(&c, &mut files);
        let shown = mask.to_string();
        let again = Mask::parse(&shown)
            .and_then(|m| m.load_files(&tpusim_workload::mask::read_mask_file))
            .unwrap_or_else(|e| panic!("{text} -> {shown}: {e}"));
        prop_assert_eq!(&again, &mask, "{} -> {}", text, shown);
        prop_assert_eq!(again.to_string(), shown);
        let kept = c.spec.matrix(c.q_len, c.kv_len);
        let mut iv = Vec::new();
        for q in 0..c.q_len {
            mask.row_intervals(q, c.kv_len, &mut iv);
            let mut prev_end: Option<u64> = None;
            let mut got = vec![false; c.kv_len as usize];
            for &(lo, hi) in &iv {
                prop_assert!(lo < hi && hi <= c.kv_len, "{} row {}: {:?}", text, q, iv);
                if let Some(p) = prev_end {
                    prop_assert!(p < lo, "{} row {}: not sorted, disjoint and maximal: {:?}", text, q, iv);
                }
                prev_end = Some(hi);
                for k in lo..hi {
                    got[k as usize] = true;
                }
            }
            let want = &kept[(q * c.kv_len) as usize..((q + 1) * c.kv_len) as usize];
            prop_assert_eq!(&got[..], want, "{} row {}: {:?}", text, q, iv);
        }
    }

    /// Video rank (kept tokens below x) equals counting the row's intervals.
    #[test]
    fn video_rank_matches_intervals(
        (v, q, x) in (1..=5u64, 1..=6u64, 1..=6u64)
            .prop_flat_map(|(f, h, w)| (video_leaf([f, h, w]), 0..f * h * w, 0..=f * h * w + 3))
            .prop_map(|(s, q, x)| {
                let mut files = TempFiles(Vec::new());
                let n = s.video_dims().iter().product();
                let Mask::Video(v) = Mask::parse(&s.text(n, n, &mut files)).unwrap() else { unreachable!() };
                (v, q, x)
            })
    ) {
        let v: VideoMask = v;
        let mut iv = Vec::new();
        v.row_intervals(q, v.tokens(), &mut iv);
        let want: u64 = iv.iter().map(|&(lo, hi)| hi.min(x).saturating_sub(lo)).sum();
        prop_assert_eq!(v.rank(&v.kept_box(v.coords(q)), x), want, "{} q {} x {}", v, q, x);
        prop_assert_eq!(v.token(v.coords(q)), q);
    }

    /// Per-head lists: `N*M` expands to N copies, Display compresses runs and parses back.
    #[test]
    fn per_head_round_trip(items in proptest::collection::vec((1..4usize, 0..5usize), 1..6)) {
        let words = ["causal", "band:3+sink:2", "full", "local:4,0&chunked:8", "video:2,3,4:1,0,2@position"];
        let text = format!(
            "per-head[{}]",
            items.iter().map(|(n, w)| if *n == 1 { words[*w].to_string() } else { format!("{n}*{}", words[*w]) }).collect::<Vec<_>>().join(";")
        );
        let m = Mask::parse(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        let Mask::PerHead(list) = &m else { panic!("{text} is not per-head") };
        let want: Vec<Mask> = items.iter().flat_map(|(n, w)| std::iter::repeat_n(Mask::parse(words[*w]).unwrap(), *n)).collect();
        prop_assert_eq!(list, &want);
        prop_assert_eq!(Mask::parse(&m.to_string()).unwrap(), m.clone());
    }
}
