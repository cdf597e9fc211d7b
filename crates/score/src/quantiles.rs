//! Sample quantiles and the summary reported for per-position metrics such as KL divergence.
//!
//! Quantiles are Hyndman & Fan's type 7 (the default of R's `quantile` and NumPy's
//! `percentile`): for `n` sorted values `x_0 ≤ … ≤ x_{n−1}` and probability `q`, with
//! `h = (n − 1) q`, `j = ⌊h⌋`: `Q(q) = x_j + (h − j)(x_{j+1} − x_j)`. So `Q(0)` is the minimum,
//! `Q(1)` the maximum, and the median of an even-sized sample is the mean of the middle two.

use serde::{Deserialize, Serialize};

use crate::error::{Result, ScoreError, check_finite, check_nonempty};

/// The type-7 quantile of an already sorted sample.
///
/// # Shapes
/// `sorted: [n]`, ascending, finite. Unsorted input gives a meaningless value, never a panic.
///
/// # Errors
/// [`ScoreError::Empty`] when `sorted` is empty, [`ScoreError::Probability`] when `q` is not in
/// `[0, 1]`.
pub fn quantile_sorted(sorted: &[f64], q: f64) -> Result<f64> {
    check_nonempty("quantile sample", sorted)?;
    if !(0.0..=1.0).contains(&q) {
        return Err(ScoreError::Probability { p: q });
    }
    let h = (sorted.len() - 1) as f64 * q;
    // h ∈ [0, n − 1], so j is a valid index.
    let j = h.floor() as usize;
    let g = h - j as f64;
    Ok(match sorted.get(j + 1) {
        // Written as x_j + g·Δ, not (1 − g)·x_j + g·x_{j+1}: equal neighbours give x_j exactly.
        Some(&next) if g > 0.0 => sorted[j] + g * (next - sorted[j]),
        _ => sorted[j],
    })
}

/// The type-7 quantile of a sample in any order.
///
/// # Shapes
/// `values: [n]`.
///
/// # Errors
/// As [`quantile_sorted`], plus [`ScoreError::NonFinite`] for a NaN or infinite value.
pub fn quantile(values: &[f64], q: f64) -> Result<f64> {
    check_finite("quantile sample", values)?;
    quantile_sorted(&sorted_copy(values), q)
}

/// Summary of a sample of per-position values (e.g. KL divergences).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Sample size.
    pub n: usize,
    /// Arithmetic mean.
    pub mean: f64,
    /// Smallest value.
    pub min: f64,
    /// Type-7 50% quantile.
    pub median: f64,
    /// Type-7 90% quantile.
    pub p90: f64,
    /// Type-7 99% quantile.
    pub p99: f64,
    /// Largest value.
    pub max: f64,
}

/// Mean, min, median, p90, p99 and max of a sample.
///
/// # Shapes
/// `values: [n]`, any order.
///
/// # Errors
/// [`ScoreError::Empty`] when `values` is empty, [`ScoreError::NonFinite`] for a NaN or
/// infinite value.
pub fn summarize(values: &[f64]) -> Result<Summary> {
    check_nonempty("summary sample", values)?;
    check_finite("summary sample", values)?;
    let sorted = sorted_copy(values);
    let q = |p| quantile_sorted(&sorted, p);
    Ok(Summary {
        n: values.len(),
        mean: values.iter().sum::<f64>() / values.len() as f64,
        min: sorted[0],
        median: q(0.5)?,
        p90: q(0.9)?,
        p99: q(0.99)?,
        max: sorted[sorted.len() - 1],
    })
}

fn sorted_copy(values: &[f64]) -> Vec<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type7_by_hand() {
        // x = 1..=10. h = 9q: Q(0.5) = x_4 + 0.5 = 5.5; Q(0.9): h = 8.1 → 9 + 0.1 = 9.1;
        // Q(0.99): h = 8.91 → 9.91; Q(0.25): h = 2.25 → 3.25. (R: quantile(1:10, c(.25,.5,.9,.99)).)
        let x: Vec<f64> = (1..=10).rev().map(f64::from).collect();
        for (q, want) in [(0.0, 1.0), (0.25, 3.25), (0.5, 5.5), (0.9, 9.1), (0.99, 9.91), (1.0, 10.0)] {
            let got = quantile(&x, q).unwrap();
            assert!((got - want).abs() < 1e-12, "Q({q}) = {got}, want {want}");
        }
        assert_eq!(quantile(&[4.0], 0.37).unwrap(), 4.0);
        assert_eq!(quantile(&[2.0, 2.0, 2.0], 0.3).unwrap(), 2.0);
    }

    #[test]
    fn summary_by_hand() {
        // 0, 0, 0, 1, 3: mean 0.8; median 0; p90: h = 3.6 → 1 + 0.6·2 = 2.2;
        // p99: h = 3.96 → 1 + 0.96·2 = 2.92.
        let s = summarize(&[3.0, 0.0, 1.0, 0.0, 0.0]).unwrap();
        assert_eq!((s.n, s.min, s.median, s.max), (5, 0.0, 0.0, 3.0));
        assert!((s.mean - 0.8).abs() < 1e-15);
        assert!((s.p90 - 2.2).abs() < 1e-12);
        assert!((s.p99 - 2.92).abs() < 1e-12);
    }

    #[test]
    fn bad_input_is_an_error() {
        assert!(matches!(summarize(&[]), Err(ScoreError::Empty { .. })));
        assert!(matches!(summarize(&[1.0, f64::NAN]), Err(ScoreError::NonFinite { index: 1, .. })));
        assert_eq!(quantile(&[1.0], 1.5), Err(ScoreError::Probability { p: 1.5 }));
        assert!(quantile(&[1.0], f64::NAN).is_err());
        assert!(quantile_sorted(&[], 0.5).is_err());
    }
}
