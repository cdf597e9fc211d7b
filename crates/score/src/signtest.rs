//! The sign test of paired differences (Dixon & Mood 1946, "The statistical sign test", JASA
//! 41(236)): under the null hypothesis that neither of two paired measurements tends to be the
//! larger, the number of positive differences among the `n` that are not zero is Binomial(n, ½).
//! It assumes nothing about the differences' distribution, only that pairs are independent, as
//! prompts are.

use statrs::distribution::{Binomial, DiscreteCDF};

use crate::error::{Result, ScoreError};

/// The signs of paired differences and the two-sided sign-test p-value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SignTest {
    /// Differences above zero.
    pub positive: usize,
    /// Differences below zero.
    pub negative: usize,
    /// Differences equal to zero (left out of the test, as Dixon & Mood do).
    pub ties: usize,
    /// `min(1, 2 · P(X ≤ min(positive, negative)))` with `X ~ Binomial(positive + negative, ½)`;
    /// 1 when every difference is zero.
    pub p_value: f64,
}

/// The sign test of `differences` (one per pair).
///
/// # Errors
/// [`ScoreError::Empty`] for no differences; [`ScoreError::NonFinite`] for a NaN one.
pub fn sign_test(differences: &[f64]) -> Result<SignTest> {
    if differences.is_empty() {
        return Err(ScoreError::Empty { what: "sign test differences" });
    }
    if let Some(index) = differences.iter().position(|d| d.is_nan()) {
        return Err(ScoreError::NonFinite { what: "sign test differences", index, value: f64::NAN });
    }
    let positive = differences.iter().filter(|&&d| d > 0.0).count();
    let negative = differences.iter().filter(|&&d| d < 0.0).count();
    let n = positive + negative;
    let p_value = if n == 0 {
        1.0
    } else {
        let binomial = Binomial::new(0.5, n as u64).map_err(|_| ScoreError::Zero { what: "sign test pairs" })?;
        (2.0 * binomial.cdf(positive.min(negative) as u64)).min(1.0)
    };
    Ok(SignTest { positive, negative, ties: differences.len() - n, p_value })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_binomial_tails() {
        // 1 of 10 positive: 2 · (1 + 10) / 2¹⁰ = 0.021484375 (scipy.stats.binomtest(1, 10)).
        let t = sign_test(&[1.0, -1.0, -2.0, -3.0, -0.5, -1.0, -1.0, -4.0, -1.0, -1.0]).unwrap();
        assert_eq!((t.positive, t.negative, t.ties), (1, 9, 0));
        assert!((t.p_value - 0.021_484_375).abs() < 1e-12, "{}", t.p_value);
        // 5 of 10, ties left out: p = 1.
        let mut even = vec![1.0; 5];
        even.extend([-1.0; 5]);
        even.extend([0.0; 3]);
        let t = sign_test(&even).unwrap();
        assert_eq!((t.ties, t.p_value), (3, 1.0));
        // 0 of 20: 2 / 2²⁰.
        let t = sign_test(&[-1.0; 20]).unwrap();
        assert!((t.p_value - 2.0 / 1_048_576.0).abs() < 1e-15, "{}", t.p_value);
        assert_eq!(sign_test(&[0.0, 0.0]).unwrap().p_value, 1.0);
        assert!(sign_test(&[]).is_err() && sign_test(&[f64::NAN]).is_err());
    }
}
