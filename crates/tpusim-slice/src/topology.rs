//! A slice of devices joined by ICI links, and collectives timed on it from first principles.
//!
//! A [`Torus`] is a box of devices (`AxB` or `AxBxC`) with, per axis, a wraparound flag: the
//! chip model's `[ici]` section says when an axis has wraparound links (a ring) and when it does
//! not (a line): a 2x4 v6e-8 has none ([`Torus::slice`]). Neighbours along an axis are joined by
//! one link in each direction, each moving `ici.link_bandwidth_gb_per_s`.
//!
//! **Collectives.** Every message travels a shortest path in dimension order (axis 0 first, then
//! axis 1, ...); on a ring, a message halfway round splits its bytes evenly between the two
//! directions. Each directed link's load is the sum of the bytes routed over it; an all-to-all's
//! messages are all distinct (unicast), while an all-gather delivers each device's shard to every
//! other device along the union of its routes (a link on several routes of one source carries
//! the shard once: store and forward). The collective takes
//!
//! `time = max over links (bytes on the link) / link bandwidth + longest route (hops) x hop latency`:
//!
//! the busiest link bounds the exchange (every link moves its bytes concurrently; a device's
//! injection is bounded by its links); the hop latency (`ici.hop_latency_us`) is paid once per
//! hop of the longest route. The report also gives the bisection bound (bytes that must cross
//! the middle of the longest axis over the links that cross it), which the routed load can only
//! meet or exceed.

use crate::SliceError;
use serde::Serialize;
use std::collections::HashMap;
use tpusim_chip::ChipModel;

/// A directed link: (device, axis, positive direction).
type Link = (u64, usize, bool);

/// A route: the fraction of a message's bytes that takes it, and its links in order.
type Route = (f64, Vec<Link>);

/// A box of devices with per-axis wraparound.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Torus {
    /// Devices along each axis.
    pub dims: Vec<u64>,
    /// Whether each axis has wraparound links.
    pub wrap: Vec<bool>,
}

impl Torus {
    /// A box with no wraparound (a mesh).
    pub fn mesh(dims: &[u64]) -> Self {
        Torus { dims: dims.to_vec(), wrap: vec![false; dims.len()] }
    }

    /// A box with wraparound on every axis.
    pub fn ring(dims: &[u64]) -> Self {
        Torus { dims: dims.to_vec(), wrap: vec![true; dims.len()] }
    }

    /// The slice `text` names on `chip`: a device count (`8`: the most nearly cubic box of
    /// `ici.torus_dims` axes, shortest axis first: 2x4 for 8 devices of a 2-D torus, 4x4x4 for 64
    /// of a 3-D one) or a shape (`2x4`, `4x4x8`). Wraparound per the chip's `[ici]` rules
    /// (crate `tpusim-chip`, `Ici`).
    ///
    /// # Errors
    /// [`SliceError::Field`] naming `slice` for malformed text, zero axes, more axes than the
    /// chip's torus has, or more devices than its pod.
    pub fn slice(text: &str, chip: &ChipModel) -> Result<Self, SliceError> {
        let k = chip.ici.torus_dims.value as usize;
        let pod = u64::from(chip.ici.pod_devices.value);
        let bad = |why: String| SliceError::field("slice", text, why);
        let parts: Vec<&str> = text.trim().split('x').collect();
        let mut dims = Vec::new();
        for p in &parts {
            let v: u64 = p.trim().parse().map_err(|_| bad("expected a device count (e.g. 8) or a shape (e.g. 2x4)".into()))?;
            if v == 0 {
                return Err(bad("every axis needs at least one device".into()));
            }
            dims.push(v);
        }
        if dims.len() == 1 {
            dims = balanced(dims[0], k);
        }
        if dims.len() > k {
            return Err(bad(format!("{} has a {k}-D torus: give at most {k} axes", chip.name)));
        }
        while dims.len() < k {
            dims.insert(0, 1);
        }
        let n: u64 = dims.iter().product();
        if n > pod {
            return Err(bad(format!("{n} devices; a {} pod has {pod}", chip.name)));
        }
        let axis = u64::from(chip.ici.wraparound_axis_devices.value);
        let cube = u64::from(chip.ici.wraparound_cube_devices.value);
        let whole_cubes = cube > 0 && dims.iter().all(|d| d % cube == 0);
        let wrap = dims.iter().map(|&d| d > 1 && ((axis > 0 && d % axis == 0) || whole_cubes)).collect();
        Ok(Torus { dims, wrap })
    }

    /// Devices in the box.
    pub fn devices(&self) -> u64 {
        self.dims.iter().product()
    }

    /// The shape as `AxB` (axes of one device left out, `1` for a single device).
    pub fn label(&self) -> String {
        let d: Vec<String> = self.dims.iter().filter(|&&v| v > 1).map(|v| v.to_string()).collect();
        if d.is_empty() {
            "1".into()
        } else {
            d.join("x")
        }
    }

    /// `torus`, `mesh` or `partial torus` (wraparound on some axes), for reports.
    pub fn kind(&self) -> &'static str {
        let axes: Vec<bool> = self.dims.iter().zip(&self.wrap).filter(|(d, _)| **d > 1).map(|(_, w)| *w).collect();
        if axes.is_empty() {
            "single device"
        } else if axes.iter().all(|w| *w) {
            "torus"
        } else if axes.iter().any(|w| *w) {
            "partial torus"
        } else {
            "mesh"
        }
    }

    /// The box each of `n` equal groups occupies: the slice cut along its longest axis that `n`
    /// divides (the last such axis on ties). A group keeps an axis's wraparound only where it
    /// spans the whole axis; its traffic stays inside its box, so groups use disjoint links.
    ///
    /// # Errors
    /// [`SliceError::Field`] naming `slice` when no axis divides into `n` parts.
    pub fn split(&self, n: u64) -> Result<Torus, SliceError> {
        if n <= 1 {
            return Ok(self.clone());
        }
        let mut best: Option<usize> = None;
        for (i, &d) in self.dims.iter().enumerate() {
            if d % n == 0 && best.is_none_or(|b| d >= self.dims[b]) {
                best = Some(i);
            }
        }
        let i = best.ok_or_else(|| {
            SliceError::field(
                "slice",
                self.label(),
                format!("no axis of the slice divides into {n} equal chip groups (for classifier-free guidance as chip groups)"),
            )
        })?;
        let mut g = self.clone();
        g.dims[i] /= n;
        g.wrap[i] = false;
        Ok(g)
    }

    fn coords(&self, mut i: u64) -> Vec<u64> {
        let mut c = vec![0; self.dims.len()];
        for a in (0..self.dims.len()).rev() {
            c[a] = i % self.dims[a];
            i /= self.dims[a];
        }
        c
    }

    fn index(&self, c: &[u64]) -> u64 {
        c.iter().zip(&self.dims).fold(0, |acc, (&x, &d)| acc * d + x)
    }

    /// The routes from `s` to `t` in dimension order: (fraction of the bytes, directed links as
    /// (device, axis, positive direction)).
    fn routes(&self, s: u64, t: u64) -> Vec<Route> {
        let mut out = vec![(1.0, Vec::new(), self.coords(s))];
        let target = self.coords(t);
        for a in 0..self.dims.len() {
            let n = self.dims[a];
            let mut next = Vec::new();
            for (f, path, cur) in out {
                let (x, y) = (cur[a], target[a]);
                if x == y {
                    next.push((f, path, cur));
                    continue;
                }
                let options: Vec<(bool, u64)> = if self.wrap[a] {
                    let fwd = (y + n - x) % n;
                    let back = n - fwd;
                    match fwd.cmp(&back) {
                        std::cmp::Ordering::Less => vec![(true, fwd)],
                        std::cmp::Ordering::Greater => vec![(false, back)],
                        std::cmp::Ordering::Equal => vec![(true, fwd), (false, back)],
                    }
                } else if y > x {
                    vec![(true, y - x)]
                } else {
                    vec![(false, x - y)]
                };
                let share = f / options.len() as f64;
                for (pos, hops) in options {
                    let mut p = path.clone();
                    let mut c = cur.clone();
                    for _ in 0..hops {
                        p.push((self.index(&c), a, pos));
                        c[a] = if pos { (c[a] + 1) % n } else { (c[a] + n - 1) % n };
                    }
                    next.push((share, p, c));
                }
            }
            out = next;
        }
        out.into_iter().map(|(f, p, _)| (f, p)).collect()
    }
}

/// The most nearly cubic box of `n` devices with `k` axes, shortest axis first.
fn balanced(n: u64, k: usize) -> Vec<u64> {
    if k <= 1 {
        return vec![n];
    }
    // The smallest largest axis, then the smallest next one (brute force over divisors).
    let mut best: Option<Vec<u64>> = None;
    let divisors: Vec<u64> = (1..=n).filter(|d| n.is_multiple_of(*d)).collect();
    let mut consider = |v: Vec<u64>| {
        let mut s = v.clone();
        s.sort_unstable();
        let key = |x: &Vec<u64>| x.iter().rev().copied().collect::<Vec<_>>();
        if best.as_ref().is_none_or(|b| key(&s) < key(b)) {
            best = Some(s);
        }
    };
    if k == 2 {
        for &a in &divisors {
            consider(vec![a, n / a]);
        }
    } else {
        for &a in &divisors {
            for &b in divisors.iter().filter(|&&b| (n / a).is_multiple_of(b)) {
                consider(vec![a, b, n / a / b]);
            }
        }
    }
    best.unwrap_or_else(|| vec![n])
}

/// What a collective moves.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Collective {
    /// Every device sends `bytes_per_pair` distinct bytes to every other device of the group.
    AllToAll {
        /// Bytes from one device to one other device.
        bytes_per_pair: u64,
    },
    /// Every device's shard of `bytes_per_device` reaches every other device of the group.
    AllGather {
        /// Bytes of one device's shard.
        bytes_per_device: u64,
    },
    /// Every device sends `bytes_per_device` to the next device in device order, the last to the
    /// first (`lax.ppermute` with `perm = [(i, (i + 1) % n)]`, a ring shift).
    Permute {
        /// Bytes each device sends.
        bytes_per_device: u64,
    },
}

impl Collective {
    /// The messages one device of a group of `n` sends (what the TensorCore issues as DMAs): an
    /// all-to-all or all-gather one to each other device, a ring shift one; none in a group of
    /// one device.
    pub fn messages_per_device(&self, n: u64) -> u64 {
        match (self, n) {
            (_, 0 | 1) => 0,
            (Collective::AllToAll { .. } | Collective::AllGather { .. }, n) => n - 1,
            (Collective::Permute { .. }, _) => 1,
        }
    }
}

/// A collective timed on a group's box.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CollectiveTiming {
    /// Time, seconds: busiest link / link bandwidth + longest route x hop latency.
    pub seconds: f64,
    /// Bytes on the busiest directed link.
    pub max_link_bytes: f64,
    /// Directed links that carry bytes.
    pub links_used: u64,
    /// Hops of the longest route.
    pub max_hops: u64,
    /// Bytes each device sends (all-to-all: to every other device; all-gather: its shard once
    /// per link of its routes that leaves it).
    pub bytes_sent_per_device: f64,
    /// The bisection bound: bytes that must cross the middle of the longest axis in one
    /// direction over the links that cross it, seconds (`None` for an odd longest axis).
    pub bisection_seconds: Option<f64>,
}

impl CollectiveTiming {
    /// No exchange (a group of one device).
    pub fn none() -> Self {
        CollectiveTiming {
            seconds: 0.0,
            max_link_bytes: 0.0,
            links_used: 0,
            max_hops: 0,
            bytes_sent_per_device: 0.0,
            bisection_seconds: None,
        }
    }
}

/// Times `c` on `group` with `chip`'s links (module docs).
pub fn time_collective(chip: &ChipModel, group: &Torus, c: Collective) -> CollectiveTiming {
    let n = group.devices();
    if n <= 1 {
        return CollectiveTiming::none();
    }
    let mut load: HashMap<Link, f64> = HashMap::new();
    let mut max_hops = 0u64;
    let mut sent = 0.0;
    for s in 0..n {
        let mut per_source: HashMap<Link, f64> = HashMap::new();
        let targets: Vec<u64> = match c {
            Collective::Permute { .. } => vec![(s + 1) % n],
            _ => (0..n).filter(|&t| t != s).collect(),
        };
        for t in targets {
            for (f, path) in group.routes(s, t) {
                max_hops = max_hops.max(path.len() as u64);
                for l in path {
                    match c {
                        Collective::AllToAll { bytes_per_pair: b } | Collective::Permute { bytes_per_device: b } => {
                            *load.entry(l).or_default() += f * b as f64
                        }
                        Collective::AllGather { .. } => {
                            let e = per_source.entry(l).or_default();
                            *e = e.max(f);
                        }
                    }
                }
            }
        }
        if let Collective::AllGather { bytes_per_device } = c {
            for (l, f) in per_source {
                *load.entry(l).or_default() += f * bytes_per_device as f64;
                if s == 0 && l.0 == 0 {
                    sent += f * bytes_per_device as f64;
                }
            }
        }
    }
    match c {
        Collective::AllToAll { bytes_per_pair } => sent = (n - 1) as f64 * bytes_per_pair as f64,
        Collective::Permute { bytes_per_device } => sent = bytes_per_device as f64,
        Collective::AllGather { .. } => {}
    }
    let max_link = load.values().copied().fold(0.0, f64::max);
    let bw = chip.ici_link_bytes_per_s();
    let seconds = max_link / bw + max_hops as f64 * chip.ici_hop_latency_s();
    // Bisection: the middle of the longest axis.
    let (a, &len) = group.dims.iter().enumerate().max_by_key(|(_, d)| **d).expect("a box has axes");
    let bisection_seconds = (len % 2 == 0).then(|| {
        let half = n / 2;
        let crossing = match c {
            Collective::AllToAll { bytes_per_pair } => (half * half) as f64 * bytes_per_pair as f64,
            Collective::AllGather { bytes_per_device } => half as f64 * bytes_per_device as f64,
            // One message crosses the middle each way (the shift across it and the wrap back).
            Collective::Permute { bytes_per_device } => bytes_per_device as f64,
        };
        let links = (n / len) * if group.wrap[a] { 2 } else { 1 };
        crossing / (links as f64 * bw)
    });
    CollectiveTiming {
        seconds,
        max_link_bytes: max_link,
        links_used: load.len() as u64,
        max_hops,
        bytes_sent_per_device: sent,
        bisection_seconds,
    }
}

/// One message of a general exchange: `bytes` from device `source` to each of `targets`
/// (device indices of the box, row-major over its axes). With several targets the message is a
/// multicast: each link on the union of its routes carries it once (store and forward, as
/// [`Collective::AllGather`]); with one target it is a unicast.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Transfer {
    /// Sending device.
    pub source: u64,
    /// Receiving devices (the source itself is skipped).
    pub targets: Vec<u64>,
    /// Bytes of the message.
    pub bytes: f64,
}

/// Times a set of concurrent messages on `group` with `chip`'s links, by the rule of
/// [`time_collective`] (module docs): the busiest directed link's bytes over the link bandwidth
/// plus the longest route's hops times the hop latency. `bytes_sent_per_device` is the most any
/// device puts on its outgoing links; `bisection_seconds` is `None` (no closed form for an
/// arbitrary pattern).
///
/// # Errors
/// [`SliceError::Field`] naming `slice` when a source or target is not a device of the box.
pub fn time_transfers(chip: &ChipModel, group: &Torus, transfers: &[Transfer]) -> Result<CollectiveTiming, SliceError> {
    let n = group.devices();
    let mut load: HashMap<Link, f64> = HashMap::new();
    let mut max_hops = 0u64;
    for t in transfers {
        for &d in std::iter::once(&t.source).chain(&t.targets) {
            if d >= n {
                return Err(SliceError::field(
                    "slice",
                    group.label(),
                    format!("device {d} is not in the slice ({n} devices, numbered 0 to {} in row-major order)", n.saturating_sub(1)),
                ));
            }
        }
        let mut per_message: HashMap<Link, f64> = HashMap::new();
        for &dst in t.targets.iter().filter(|&&d| d != t.source) {
            for (f, path) in group.routes(t.source, dst) {
                max_hops = max_hops.max(path.len() as u64);
                for l in path {
                    let e = per_message.entry(l).or_default();
                    *e = e.max(f);
                }
            }
        }
        for (l, f) in per_message {
            *load.entry(l).or_default() += f * t.bytes;
        }
    }
    let mut sent: HashMap<u64, f64> = HashMap::new();
    for (l, b) in &load {
        *sent.entry(l.0).or_default() += b;
    }
    let max_link = load.values().copied().fold(0.0, f64::max);
    let seconds = if load.is_empty() { 0.0 } else { max_link / chip.ici_link_bytes_per_s() + max_hops as f64 * chip.ici_hop_latency_s() };
    Ok(CollectiveTiming {
        seconds,
        max_link_bytes: max_link,
        links_used: load.len() as u64,
        max_hops,
        bytes_sent_per_device: sent.values().copied().fold(0.0, f64::max),
        bisection_seconds: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v6e() -> ChipModel {
        ChipModel::preset("v6e").unwrap()
    }

    #[test]
    fn v6e_slices_have_wraparound_only_on_full_axes() {
        let c = v6e();
        let s = Torus::slice("8", &c).unwrap();
        assert_eq!((s.dims.clone(), s.wrap.clone()), (vec![2, 4], vec![false, false]));
        assert_eq!(s.kind(), "mesh");
        assert_eq!(Torus::slice("16", &c).unwrap().dims, vec![4, 4]);
        let s = Torus::slice("8x16", &c).unwrap();
        assert_eq!(s.wrap, vec![false, true]);
        assert_eq!(Torus::slice("256", &c).unwrap().kind(), "torus");
        assert_eq!(Torus::slice("1", &c).unwrap().label(), "1");
        let p = ChipModel::preset("v5p").unwrap();
        assert_eq!(Torus::slice("64", &p).unwrap().kind(), "torus");
        assert_eq!(Torus::slice("2x2x4", &p).unwrap().kind(), "mesh");
        for bad in ["0", "2x2x2", "512", "two"] {
            let e = Torus::slice(bad, &c).unwrap_err().to_string();
            assert!(e.contains("`slice`"), "{bad}: {e}");
        }
    }

    #[test]
    fn groups_split_the_longest_axis() {
        let s = Torus::slice("8", &v6e()).unwrap();
        assert_eq!(s.split(2).unwrap().dims, vec![2, 2]);
        let s = Torus::slice("16x16", &v6e()).unwrap();
        let g = s.split(2).unwrap();
        assert_eq!((g.dims.clone(), g.wrap.clone()), (vec![16, 8], vec![true, false]));
        assert!(Torus::slice("1", &v6e()).unwrap().split(2).is_err());
    }

    /// Known per-link loads of an all-to-all of B bytes per pair: a bidirectional ring of n
    /// (n even) carries B n^2 / 8 on its busiest link, a line B n^2 / 4 (the middle link).
    #[test]
    fn all_to_all_link_loads_follow_the_topology() {
        let chip = v6e();
        let b = 1u64 << 20;
        for n in [4u64, 8, 16] {
            let ring = time_collective(&chip, &Torus::ring(&[n]), Collective::AllToAll { bytes_per_pair: b });
            let line = time_collective(&chip, &Torus::mesh(&[n]), Collective::AllToAll { bytes_per_pair: b });
            assert!((ring.max_link_bytes - (b * n * n / 8) as f64).abs() < 1.0, "ring {n}: {}", ring.max_link_bytes);
            assert!((line.max_link_bytes - (b * n * n / 4) as f64).abs() < 1.0, "line {n}: {}", line.max_link_bytes);
            assert_eq!(line.max_hops, n - 1);
            assert_eq!(ring.max_hops, n / 2);
        }
        // A 2x2 box: the routed load meets the bisection bound.
        let t = time_collective(&chip, &Torus::mesh(&[2, 2]), Collective::AllToAll { bytes_per_pair: b });
        assert!((t.max_link_bytes - 2.0 * b as f64).abs() < 1.0);
        let bis = t.bisection_seconds.unwrap();
        assert!((bis - 2.0 * b as f64 / chip.ici_link_bytes_per_s()).abs() < 1e-12);
    }

    #[test]
    fn doubling_link_bandwidth_halves_a_bandwidth_bound_exchange() {
        let chip = v6e();
        let fast = chip.with_override("ici.link_bandwidth_gb_per_s", &format!("{}", 2.0 * chip.ici.link_bandwidth_gb_per_s.value)).unwrap();
        let g = Torus::slice("8", &chip).unwrap().split(2).unwrap();
        // 48 MB per pair: a Ulysses exchange of 720p q on four chips.
        let c = Collective::AllToAll { bytes_per_pair: 48_384_000 };
        let (a, b) = (time_collective(&chip, &g, c), time_collective(&fast, &g, c));
        let lat = a.max_hops as f64 * chip.ici_hop_latency_s();
        assert!(((b.seconds - lat) / (a.seconds - lat) - 0.5).abs() < 1e-12, "{} {}", a.seconds, b.seconds);
        assert!(lat < 1e-2 * a.seconds);
        // Twice the bytes, twice the bandwidth term.
        let c2 = Collective::AllToAll { bytes_per_pair: 2 * 48_384_000 };
        let a2 = time_collective(&chip, &g, c2);
        assert!(((a2.seconds - lat) / (a.seconds - lat) - 2.0).abs() < 1e-12);
        assert_eq!(time_collective(&chip, &Torus::mesh(&[1, 1]), c).seconds, 0.0);
    }

    /// marin-community/marin issue 6736: barriered `lax.ppermute` ring shifts on v6e-8, 1 KiB to
    /// 64 MiB per device; large payloads fit 2.29 us + bytes / 86.8 GB/s, small ones take 5.6 to
    /// 5.9 us, 1 MiB 17.45 us, 64 MiB 776.34 us. The model (100 GB/s links, 1 us per hop, the
    /// 2x4 mesh's wrap-around pairs 4 hops apart) is fast on every payload: by the latency floor
    /// on small ones, by 13% on the largest (LAYER.md, "The ICI model against a measured
    /// sweep"). A band, not a fit: the test fails if the model drifts further.
    #[test]
    fn a_ring_shift_on_v6e_8_against_marins_ppermute_sweep() {
        let chip = v6e();
        let s = Torus::slice("8", &chip).unwrap();
        let t = |bytes: u64| time_collective(&chip, &s, Collective::Permute { bytes_per_device: bytes });
        assert_eq!(t(1 << 20).max_hops, 4);
        assert!((t(1 << 20).max_link_bytes - (1u64 << 20) as f64).abs() < 1.0, "one message per link");
        for (bytes, measured_us) in [(1u64 << 10, 5.6), (1 << 20, 17.45), (64 << 20, 776.34)] {
            let model_us = t(bytes).seconds * 1e6;
            let err = model_us / measured_us - 1.0;
            assert!((-0.35..=0.0).contains(&err), "{bytes} B: {model_us:.2} us vs {measured_us} us ({:+.0}%)", 100.0 * err);
        }
        // The bandwidth term is the link's (the sweep's fit: 86.8 GB/s effective).
        let slope = (t(64 << 20).seconds - t(1 << 20).seconds) / ((63u64 << 20) as f64);
        assert!((1.0 / slope / chip.ici_link_bytes_per_s() - 1.0).abs() < 1e-9);
    }

    /// The general exchange reproduces the named collectives' link loads.
    #[test]
    fn transfers_match_the_named_collectives() {
        let chip = v6e();
        let s = Torus::slice("8", &chip).unwrap();
        let b = 1u64 << 20;
        let shift: Vec<Transfer> = (0..8).map(|i| Transfer { source: i, targets: vec![(i + 1) % 8], bytes: b as f64 }).collect();
        let a = time_transfers(&chip, &s, &shift).unwrap();
        let want = time_collective(&chip, &s, Collective::Permute { bytes_per_device: b });
        assert_eq!((a.max_link_bytes, a.max_hops, a.links_used, a.seconds), (want.max_link_bytes, want.max_hops, want.links_used, want.seconds));
        let gather: Vec<Transfer> = (0..8).map(|i| Transfer { source: i, targets: (0..8).collect(), bytes: b as f64 }).collect();
        let g = time_transfers(&chip, &s, &gather).unwrap();
        let want = time_collective(&chip, &s, Collective::AllGather { bytes_per_device: b });
        assert_eq!((g.max_link_bytes, g.max_hops, g.seconds), (want.max_link_bytes, want.max_hops, want.seconds));
        let e = time_transfers(&chip, &s, &[Transfer { source: 0, targets: vec![8], bytes: 1.0 }]).unwrap_err().to_string();
        assert!(e.contains("device 8 is not in the slice"), "{e}");
    }

    #[test]
    fn all_gather_forwards_each_shard_once_per_link() {
        let chip = v6e();
        let w = 1u64 << 20;
        // A line of 4: an end device's one link brings it the three other shards, once each.
        let t = time_collective(&chip, &Torus::mesh(&[4]), Collective::AllGather { bytes_per_device: w });
        assert!((t.max_link_bytes - 3.0 * w as f64).abs() < 1.0, "{}", t.max_link_bytes);
        // A ring of 4: one shard per link and direction, plus half of the opposite device's.
        let t = time_collective(&chip, &Torus::ring(&[4]), Collective::AllGather { bytes_per_device: w });
        assert!((t.max_link_bytes - 1.5 * w as f64).abs() < 1.0, "{}", t.max_link_bytes);
    }
}
