//! Small statistics: median, mean, Kendall's rank correlation.

/// Median of the values (mean of the two middle ones for an even count); `None` when empty or
/// when a value is NaN.
pub fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() || values.iter().any(|v| v.is_nan()) {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 })
}

/// Arithmetic mean; `None` when empty.
pub fn mean(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        None
    } else {
        Some(values.iter().sum::<f64>() / values.len() as f64)
    }
}

/// Pair counts of two rankings of the same items.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PairCounts {
    /// Pairs ordered the same way by both.
    pub concordant: u64,
    /// Pairs ordered oppositely.
    pub discordant: u64,
    /// Pairs tied in the first ranking only.
    pub ties_x: u64,
    /// Pairs tied in the second ranking only.
    pub ties_y: u64,
    /// Pairs tied in both.
    pub ties_xy: u64,
}

impl PairCounts {
    /// Counts every pair of `(x[i], y[i])` (O(n^2); groups are small).
    ///
    /// # Panics
    /// If the slices differ in length (a programming error).
    pub fn of(x: &[f64], y: &[f64]) -> Self {
        assert_eq!(x.len(), y.len(), "rankings of different lengths");
        let mut c = PairCounts::default();
        for i in 0..x.len() {
            for j in i + 1..x.len() {
                let dx = (x[i] - x[j]).partial_cmp(&0.0).unwrap_or(std::cmp::Ordering::Equal);
                let dy = (y[i] - y[j]).partial_cmp(&0.0).unwrap_or(std::cmp::Ordering::Equal);
                use std::cmp::Ordering::Equal;
                match (dx, dy) {
                    (Equal, Equal) => c.ties_xy += 1,
                    (Equal, _) => c.ties_x += 1,
                    (_, Equal) => c.ties_y += 1,
                    (a, b) if a == b => c.concordant += 1,
                    _ => c.discordant += 1,
                }
            }
        }
        c
    }

    /// Kendall's tau-b: (C - D) / sqrt((C + D + Tx) (C + D + Ty)), which corrects for ties and
    /// equals tau-a without them (Kendall 1945; as `scipy.stats.kendalltau`'s default). `None`
    /// when either ranking is constant (the coefficient is undefined).
    pub fn tau_b(&self) -> Option<f64> {
        let (c, d) = (self.concordant as f64, self.discordant as f64);
        let n1 = c + d + self.ties_x as f64;
        let n2 = c + d + self.ties_y as f64;
        if n1 == 0.0 || n2 == 0.0 {
            None
        } else {
            Some((c - d) / (n1 * n2).sqrt())
        }
    }
}

/// Kendall's tau-b of two rankings of the same items (see [`PairCounts::tau_b`]).
pub fn kendall_tau_b(x: &[f64], y: &[f64]) -> Option<f64> {
    PairCounts::of(x, y).tau_b()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_mean() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        assert_eq!(mean(&[1.0, 2.0, 6.0]), Some(3.0));
    }

    #[test]
    fn tau_matches_reference_values() {
        assert_eq!(kendall_tau_b(&[1.0, 2.0, 3.0], &[3.0, 4.0, 5.0]), Some(1.0));
        assert_eq!(kendall_tau_b(&[1.0, 2.0, 3.0], &[5.0, 4.0, 3.0]), Some(-1.0));
        // scipy.stats.kendalltau([1,2,3,4,5], [5,6,7,8,7]) = 0.7378647873726218 (one tie in y)
        let t = kendall_tau_b(&[1.0, 2.0, 3.0, 4.0, 5.0], &[5.0, 6.0, 7.0, 8.0, 7.0]).unwrap();
        assert!((t - 0.7378647873726218).abs() < 1e-12, "{t}");
        // scipy.stats.kendalltau([12,2,1,12,2], [1,4,7,1,0]) = -0.4714045207910316
        let t = kendall_tau_b(&[12.0, 2.0, 1.0, 12.0, 2.0], &[1.0, 4.0, 7.0, 1.0, 0.0]).unwrap();
        assert!((t + 0.4714045207910316).abs() < 1e-12, "{t}");
        assert_eq!(kendall_tau_b(&[1.0, 1.0], &[1.0, 2.0]), None);
    }
}
