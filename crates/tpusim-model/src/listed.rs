//! A step stream given as runs, for programs lowered outside this crate (a Pallas kernel read
//! from its Mosaic IR by `tpusim-pallas`): per parallel unit of the grid its runs of identical
//! steps, with consecutive units whose runs are identical but for coordinates stored once with a
//! repeat count (so memory and the engine's work grow with distinct units, not with the grid).

use crate::ir::Step;
use crate::RunItem;

/// Runs of one parallel unit (or of several identical consecutive units).
#[derive(Debug, Clone, PartialEq)]
struct UnitRuns {
    /// (first step of the run, steps in the run).
    runs: Vec<(Step, u64)>,
    /// Units with these runs (this one and the `repeat - 1` that follow).
    repeat: u64,
    /// Per unit of the repeat, how its coordinates differ from the stored runs' (the first
    /// step's coordinates minus the stored unit's first step's, wrapping): a timeline of a
    /// repeated unit shows its own grid indices. `offsets[0]` is zero.
    offsets: Vec<[u32; 3]>,
}

/// The step stream of a program as runs per parallel unit, in grid order.
///
/// A run is `n` consecutive steps identical to its first but for the innermost coordinate
/// (`coords[2]`, which counts up by one per step). Build it with [`ListedSteps::push_unit`],
/// one call per parallel unit in grid order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListedSteps {
    units: Vec<UnitRuns>,
    total_units: u64,
}

fn same_but_coords(a: &[(Step, u64)], b: &[(Step, u64)]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|((x, n), (y, m))| n == m && x.class == y.class && x.copies == y.copies)
}

impl ListedSteps {
    /// An empty stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends the runs of the next parallel unit (in grid order). A unit whose runs equal the
    /// previous unit's but for coordinates is folded into it (a repeat).
    pub fn push_unit(&mut self, runs: Vec<(Step, u64)>) {
        self.total_units += 1;
        if let Some(last) = self.units.last_mut() {
            if same_but_coords(&last.runs, &runs) {
                let delta = match (last.runs.first(), runs.first()) {
                    (Some((a, _)), Some((b, _))) => std::array::from_fn(|i| b.coords[i].wrapping_sub(a.coords[i])),
                    _ => [0; 3],
                };
                last.repeat += 1;
                last.offsets.push(delta);
                return;
            }
        }
        self.units.push(UnitRuns { runs, repeat: 1, offsets: vec![[0; 3]] });
    }

    /// Parallel units pushed.
    pub fn units(&self) -> u64 {
        self.total_units
    }

    /// Distinct unit run lists stored (after folding repeats).
    pub fn distinct_units(&self) -> usize {
        self.units.len()
    }

    /// Visits the units `lo..hi` as (stored unit, first unit index it stands for, how many).
    fn for_each_unit(&self, lo: u64, hi: u64, f: &mut dyn FnMut(&UnitRuns, u64, u64)) {
        let mut start = 0u64;
        for u in &self.units {
            let (a, b) = (start.max(lo), (start + u.repeat).min(hi));
            if a < b {
                f(u, a - start, b - a);
            }
            start += u.repeat;
            if start >= hi {
                break;
            }
        }
    }

}

impl crate::StepStream for ListedSteps {
    /// Runs of the units `lo..hi`, no folding. Repeated units give their stored runs again, each
    /// with its own coordinates (the stored ones shifted by the unit's offset).
    fn for_each_run_range(&self, lo: u64, hi: u64, f: &mut dyn FnMut(&Step, u64)) {
        self.for_each_unit(lo, hi, &mut |u, first, k| {
            for r in first..first + k {
                let d = u.offsets[r as usize];
                for (s, n) in &u.runs {
                    let c = s.coords;
                    let coords = [c[0].wrapping_add(d[0]), c[1].wrapping_add(d[1]), c[2].wrapping_add(d[2]), c[3]];
                    f(&Step { coords, ..*s }, *n);
                }
            }
        });
    }

    /// Runs of the units `lo..hi` with repeated units folded (`RunItem::RepeatHead`).
    fn for_each_run_block(&self, lo: u64, hi: u64, f: &mut dyn FnMut(RunItem<'_>)) {
        self.for_each_unit(lo, hi, &mut |u, _, k| {
            f(RunItem::HeadStart);
            for (s, n) in &u.runs {
                f(RunItem::Run(s, *n));
            }
            if k > 1 {
                f(RunItem::RepeatHead(k - 1));
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StepStream;

    fn st(class: u32, b: u64, c: u32) -> Step {
        Step { class, copies: b as u32, coords: [0, 0, c, 0] }
    }

    #[test]
    fn identical_units_fold_and_expand_back() {
        let mut l = ListedSteps::new();
        l.push_unit(vec![(st(1, 10, 0), 1), (st(2, 5, 1), 3)]);
        l.push_unit(vec![(st(1, 10, 0), 1), (st(2, 5, 1), 3)]);
        l.push_unit(vec![(st(1, 10, 0), 2)]);
        assert_eq!(l.units(), 3);
        assert_eq!(l.distinct_units(), 2);
        let mut n = 0;
        l.for_each_run_range(0, 3, &mut |_, k| n += k);
        assert_eq!(n, 4 + 4 + 2);
        // A repeated unit keeps its own coordinates (timelines show them).
        let mut m = ListedSteps::new();
        for u in 0..3u32 {
            m.push_unit(vec![(Step { coords: [u, 7, 0, 0], ..st(1, 10, 0) }, 2)]);
        }
        assert_eq!(m.distinct_units(), 1);
        let mut seen = Vec::new();
        m.for_each_run_range(1, 3, &mut |s, k| seen.push((s.coords, k)));
        assert_eq!(seen, [([1, 7, 0, 0], 2), ([2, 7, 0, 0], 2)]);
        let mut items = Vec::new();
        l.for_each_run_block(1, 3, &mut |it| {
            items.push(match it {
                RunItem::HeadStart => "h".to_string(),
                RunItem::Run(_, k) => format!("r{k}"),
                RunItem::RepeatHead(k) => format!("x{k}"),
            })
        });
        // Unit 1 alone (its repeat is cut by the range), then unit 2.
        assert_eq!(items, ["h", "r1", "r3", "h", "r2"]);
    }
}
