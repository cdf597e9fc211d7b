//! Per-position metrics stratified by how uncertain the reference was.
//!
//! Quantization hurts confident and uncertain positions differently; a single mean KL mixes
//! them. Positions (pooled over every prompt) are split at the 25/50/75% type-7 quantiles of the
//! reference entropy into four strata.

use serde::{Deserialize, Serialize};

use crate::error::{Result, ScoreError, check_nonempty};
use crate::logprob::PositionMetrics;
use crate::quantiles::quantile_sorted;

/// One entropy stratum: positions with `lower < ref_entropy ≤ upper` (the first stratum also
/// includes `ref_entropy == lower`, the minimum).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Stratum {
    /// Lower entropy boundary in nats (the minimum for the first stratum).
    pub lower: f64,
    /// Upper entropy boundary in nats (the maximum for the last stratum).
    pub upper: f64,
    /// Positions in the stratum. Can be 0 when many positions share one entropy (ties at a
    /// boundary all go to the lower stratum).
    pub count: usize,
    /// Mean KL divergence of the stratum's positions; `None` when it is empty.
    pub mean_kld: Option<f64>,
    /// Share of the stratum's positions whose top-1 tokens agree; `None` when it is empty.
    pub top1_agreement: Option<f64>,
}

/// Splits positions into reference-entropy quartiles and summarizes each.
///
/// The boundaries are `min, Q(0.25), Q(0.5), Q(0.75), max` of the reference entropies of all
/// `positions`; a position goes to the first stratum whose upper boundary it does not exceed.
///
/// # Shapes
/// `positions: [positions pooled over prompts]`.
///
/// # Errors
/// [`ScoreError::Empty`] when there are no positions, [`ScoreError::NonFinite`] when an
/// entropy or a KL divergence is NaN or infinite.
pub fn entropy_quartiles(positions: &[PositionMetrics]) -> Result<[Stratum; 4]> {
    check_nonempty("stratified positions", positions)?;
    for (index, m) in positions.iter().enumerate() {
        for (what, value) in [("reference entropy", m.ref_entropy), ("KL divergence", m.kld)] {
            if !value.is_finite() {
                return Err(ScoreError::NonFinite { what, index, value });
            }
        }
    }
    let mut entropies: Vec<f64> = positions.iter().map(|m| m.ref_entropy).collect();
    entropies.sort_by(f64::total_cmp);
    let b = [
        entropies[0],
        quantile_sorted(&entropies, 0.25)?,
        quantile_sorted(&entropies, 0.5)?,
        quantile_sorted(&entropies, 0.75)?,
        entropies[entropies.len() - 1],
    ];
    let mut count = [0usize; 4];
    let mut kld = [0f64; 4];
    let mut agree = [0usize; 4];
    for m in positions {
        // The last stratum takes everything above the third boundary.
        let s = (0..3).find(|&s| m.ref_entropy <= b[s + 1]).unwrap_or(3);
        count[s] += 1;
        kld[s] += m.kld;
        agree[s] += usize::from(m.top1_agree);
    }
    Ok(std::array::from_fn(|s| {
        let n = count[s] as f64;
        Stratum {
            lower: b[s],
            upper: b[s + 1],
            count: count[s],
            mean_kld: (count[s] > 0).then(|| kld[s] / n),
            top1_agreement: (count[s] > 0).then(|| agree[s] as f64 / n),
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(ref_entropy: f64, kld: f64, top1_agree: bool) -> PositionMetrics {
        PositionMetrics {
            kld,
            top1_agree,
            p_ref_token_ref: 0.5,
            p_var_of_ref_token: 0.5,
            delta_p: 0.0,
            ref_entropy,
            logp_ref_of_token: 0.5f64.ln(),
            logp_var_of_token: 0.5f64.ln(),
        }
    }

    #[test]
    fn eight_positions_by_hand() {
        // Entropies 1..=8 (shuffled): Q(0.25) = 1 + 7·0.25 = 2.75, Q(0.5) = 4.5, Q(0.75) = 6.25.
        // Strata: {1, 2}, {3, 4}, {5, 6}, {7, 8}; KL = entropy / 10; agree when entropy < 6.
        let order = [5, 1, 8, 3, 2, 7, 4, 6];
        let positions: Vec<_> = order.iter().map(|&e| pos(f64::from(e), f64::from(e) / 10.0, e < 6)).collect();
        let s = entropy_quartiles(&positions).unwrap();
        let bounds: Vec<(f64, f64)> = s.iter().map(|s| (s.lower, s.upper)).collect();
        assert_eq!(bounds, [(1.0, 2.75), (2.75, 4.5), (4.5, 6.25), (6.25, 8.0)]);
        assert_eq!(s.map(|s| s.count), [2, 2, 2, 2]);
        let kld = s.map(|s| s.mean_kld.unwrap());
        for (got, want) in kld.iter().zip([0.15, 0.35, 0.55, 0.75]) {
            assert!((got - want).abs() < 1e-12, "{kld:?}");
        }
        assert_eq!(s.map(|s| s.top1_agreement), [Some(1.0), Some(1.0), Some(0.5), Some(0.0)]);
    }

    #[test]
    fn ties_go_to_the_lower_stratum_and_empty_strata_have_no_mean() {
        // All entropies equal: every boundary is 0.3 and every position is in the first stratum.
        let positions = vec![pos(0.3, 0.01, true), pos(0.3, 0.03, false)];
        let s = entropy_quartiles(&positions).unwrap();
        assert_eq!(s.map(|s| s.count), [2, 0, 0, 0]);
        assert!((s[0].mean_kld.unwrap() - 0.02).abs() < 1e-15);
        assert_eq!(s[0].top1_agreement, Some(0.5));
        assert_eq!((s[1].mean_kld, s[3].top1_agreement), (None, None));
    }

    #[test]
    fn bad_input_is_an_error() {
        assert!(matches!(entropy_quartiles(&[]), Err(ScoreError::Empty { .. })));
        assert!(matches!(
            entropy_quartiles(&[pos(1.0, 0.0, true), pos(f64::NAN, 0.0, true)]),
            Err(ScoreError::NonFinite { index: 1, .. })
        ));
    }
}
