//! Wilson score interval for a proportion (e.g. the share of prompts whose first 100 tokens
//! match exactly): unlike the normal-approximation interval it stays inside [0, 1] and keeps a
//! sensible width at 0 and at n successes.

use statrs::distribution::{ContinuousCDF, Normal};

use crate::bootstrap::Interval;
use crate::error::{Result, ScoreError, check_level};

/// Wilson score interval of `successes` out of `trials` at confidence `level`.
///
/// With `p = k/n` and `z = Φ⁻¹((1 + level)/2)`:
/// `centre = (p + z²/2n) / (1 + z²/n)`,
/// `half-width = z / (1 + z²/n) · √(p(1 − p)/n + z²/4n²)`.
/// At `k = 0` the lower bound is exactly 0 and at `k = n` the upper bound exactly 1 (the
/// formula gives them up to rounding). The estimate is `p`.
///
/// # Errors
/// [`ScoreError::Empty`] when `trials == 0`, [`ScoreError::OutOfRange`] when
/// `successes > trials`, [`ScoreError::Level`] when `level ∉ (0, 1)`.
pub fn wilson_interval(successes: usize, trials: usize, level: f64) -> Result<Interval> {
    if trials == 0 {
        return Err(ScoreError::Empty { what: "Wilson interval trials" });
    }
    if successes > trials {
        return Err(ScoreError::OutOfRange { what: "successes", index: successes, limit: trials + 1 });
    }
    check_level(level)?;
    let standard = Normal::standard();
    let z = standard.inverse_cdf((1.0 + level) / 2.0);
    let n = trials as f64;
    let p = successes as f64 / n;
    let z2n = z * z / n;
    let denom = 1.0 + z2n;
    let centre = (p + z2n / 2.0) / denom;
    let half = z / denom * (p * (1.0 - p) / n + z2n / (4.0 * n)).sqrt();
    let lo = if successes == 0 { 0.0 } else { (centre - half).max(0.0) };
    let hi = if successes == trials { 1.0 } else { (centre + half).min(1.0) };
    Ok(Interval { estimate: p, lo, hi, level })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(k: usize, n: usize, level: f64, lo: f64, hi: f64) {
        let ci = wilson_interval(k, n, level).unwrap();
        assert!((ci.lo - lo).abs() < 1e-9, "{k}/{n}: lo {} vs {lo}", ci.lo);
        assert!((ci.hi - hi).abs() < 1e-9, "{k}/{n}: hi {} vs {hi}", ci.hi);
        assert_eq!(ci.estimate, k as f64 / n as f64);
    }

    #[test]
    fn known_values_at_95_percent() {
        // z = Φ⁻¹(0.975) = 1.959963984540054, z² = 3.841458820694124, n = 10: z²/n = 0.38414588.
        // k = 0: centre = half = 0.19207294 / 1.38414588 → [0, 0.38414588 / 1.38414588]
        //        = [0, 0.277532800].
        check(0, 10, 0.95, 0.0, 0.277_532_799_862_889);
        // k = 5: centre 0.5, half = (1.95996398 / 1.38414588) · √(0.025 + 0.00960365)
        //        = 1.41600 · 0.186020 = 0.263407 → [0.236593, 0.763407].
        check(5, 10, 0.95, 0.236_593_090_512_564, 0.763_406_909_487_436);
        // k = 10: the mirror image of k = 0.
        check(10, 10, 0.95, 0.722_467_200_137_111, 1.0);
        // k = 1, n = 3: p = 1/3, z²/n = 1.28048627, centre = (1/3 + 0.64024314) / 2.28048627
        //        = 0.42691617, half = 0.85944461 · √(0.07407407 + 0.10670719) = 0.36542423.
        check(1, 3, 0.95, 0.061_491_944_720_396, 0.792_340_399_197_952);
    }

    #[test]
    fn other_levels() {
        // z = Φ⁻¹(0.95) = 1.6448536269514715 for a 90% interval, 81/263.
        check(81, 263, 0.90, 0.263_313_617_188_481, 0.356_566_349_608_488);
        let wide = wilson_interval(81, 263, 0.99).unwrap();
        assert!(wide.lo < 0.2633 && wide.hi > 0.3566);
    }

    #[test]
    fn bad_input_is_an_error() {
        assert!(matches!(wilson_interval(0, 0, 0.95), Err(ScoreError::Empty { .. })));
        assert!(matches!(wilson_interval(11, 10, 0.95), Err(ScoreError::OutOfRange { .. })));
        assert!(matches!(wilson_interval(1, 10, 1.0), Err(ScoreError::Level { .. })));
    }
}
