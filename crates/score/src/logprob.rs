//! Reference definitions of the per-position metrics, from the full-vocabulary logits of one
//! position. Logits arrive as `f32` (what the model emits) and every sum runs in `f64`, so these
//! are the values the device reductions are tested against.

use serde::{Deserialize, Serialize};

use crate::error::{Result, ScoreError, check_finite, check_nonempty, check_paired};

/// Log-probabilities of one position: `log_softmax(x)_i = x_i − max − ln Σ_j exp(x_j − max)`.
///
/// Subtracting the maximum first keeps every `exp` in `(0, 1]`, so logits of any finite size
/// (1e4, 1e30) neither overflow nor lose the distribution.
///
/// # Shapes
/// `logits: [vocab]` → `[vocab]`.
///
/// # Errors
/// [`ScoreError::Empty`] for an empty slice, [`ScoreError::NonFinite`] for a NaN or infinite
/// logit (masked `-inf` logits are refused too: no model here emits them).
pub fn log_softmax(logits: &[f32]) -> Result<Vec<f64>> {
    check_nonempty("logits", logits)?;
    check_finite("logits", logits)?;
    let max = logits.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(f64::from(x)));
    let sum_exp: f64 = logits.iter().map(|&x| (f64::from(x) - max).exp()).sum();
    // sum_exp ≥ 1 (the maximum contributes exp(0)), so the logarithm is finite.
    let log_z = max + sum_exp.ln();
    Ok(logits.iter().map(|&x| f64::from(x) - log_z).collect())
}

/// Shannon entropy of the softmax of `logits`, in nats: `H = −Σ p_i ln p_i`.
///
/// # Shapes
/// `logits: [vocab]`.
///
/// # Errors
/// As [`log_softmax`].
pub fn entropy(logits: &[f32]) -> Result<f64> {
    Ok(entropy_of_logp(&log_softmax(logits)?))
}

/// KL divergence of the variant from the reference, in nats:
/// `KL(p_ref ‖ p_var) = Σ_i p_ref,i (ln p_ref,i − ln p_var,i)`.
///
/// Mathematically `≥ 0`; in floating point two identical distributions can give a value a few
/// ulps below zero. The value is returned as computed, not clamped, so that a device reduction
/// can be compared with it exactly; callers that need a non-negative number clamp themselves.
///
/// # Shapes
/// `ref_logits: [vocab]`, `var_logits: [vocab]` (same vocabulary, same order).
///
/// # Errors
/// [`ScoreError::LengthMismatch`] when the vocabularies differ in size, else as [`log_softmax`].
pub fn kl_divergence(ref_logits: &[f32], var_logits: &[f32]) -> Result<f64> {
    check_paired("reference and variant logits", ref_logits.len(), var_logits.len())?;
    Ok(kl_of_logp(&log_softmax(ref_logits)?, &log_softmax(var_logits)?))
}

/// Index of the largest logit; the first one on ties, like llama2.c's `argmax`.
///
/// # Shapes
/// `logits: [vocab]`.
///
/// # Errors
/// As [`log_softmax`].
pub fn top1(logits: &[f32]) -> Result<usize> {
    check_nonempty("logits", logits)?;
    check_finite("logits", logits)?;
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate().skip(1) {
        if x > logits[best] {
            best = i;
        }
    }
    Ok(best)
}

/// Every per-position metric of one position, computed from both models' logits and the token
/// the reference emitted there.
///
/// `token` is the reference's token at this position (the variant is teacher-forced on the
/// reference's sequence), so `p_ref_token_ref` is what the reference gave its own token and
/// `p_var_of_ref_token` is what the variant gave that same token.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PositionMetrics {
    /// `KL(p_ref ‖ p_var)` in nats (see [`kl_divergence`]).
    pub kld: f64,
    /// Whether both models' top-1 tokens (first maximum on ties) are the same.
    pub top1_agree: bool,
    /// `p_ref(token)`: the reference's probability of the reference token.
    pub p_ref_token_ref: f64,
    /// `p_var(token)`: the variant's probability of the reference token.
    pub p_var_of_ref_token: f64,
    /// `p_var(token) − p_ref(token)`; negative when the variant is less sure of the reference
    /// token (the sign convention of llama.cpp's `Δp`).
    pub delta_p: f64,
    /// Entropy of the reference distribution in nats (used to stratify positions).
    pub ref_entropy: f64,
    /// `ln p_ref(token)`.
    pub logp_ref_of_token: f64,
    /// `ln p_var(token)`.
    pub logp_var_of_token: f64,
}

/// Computes [`PositionMetrics`] for one position.
///
/// # Shapes
/// `ref_logits: [vocab]`, `var_logits: [vocab]`, `token < vocab`.
///
/// # Errors
/// [`ScoreError::OutOfRange`] when `token ≥ vocab`, else as [`kl_divergence`].
pub fn position_metrics(ref_logits: &[f32], var_logits: &[f32], token: usize) -> Result<PositionMetrics> {
    check_paired("reference and variant logits", ref_logits.len(), var_logits.len())?;
    let ref_logp = log_softmax(ref_logits)?;
    let var_logp = log_softmax(var_logits)?;
    if token >= ref_logp.len() {
        return Err(ScoreError::OutOfRange { what: "token", index: token, limit: ref_logp.len() });
    }
    let logp_ref_of_token = ref_logp[token];
    let logp_var_of_token = var_logp[token];
    let p_ref_token_ref = logp_ref_of_token.exp();
    let p_var_of_ref_token = logp_var_of_token.exp();
    Ok(PositionMetrics {
        kld: kl_of_logp(&ref_logp, &var_logp),
        top1_agree: top1(ref_logits)? == top1(var_logits)?,
        p_ref_token_ref,
        p_var_of_ref_token,
        delta_p: p_var_of_ref_token - p_ref_token_ref,
        ref_entropy: entropy_of_logp(&ref_logp),
        logp_ref_of_token,
        logp_var_of_token,
    })
}

fn entropy_of_logp(logp: &[f64]) -> f64 {
    -logp.iter().map(|&l| l.exp() * l).sum::<f64>()
}

fn kl_of_logp(ref_logp: &[f64], var_logp: &[f64]) -> f64 {
    ref_logp.iter().zip(var_logp).map(|(&r, &v)| r.exp() * (r - v)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) {
        assert!((a - b).abs() <= tol, "{a} vs {b}");
    }

    #[test]
    fn log_softmax_of_three_tokens() {
        // logits (0, ln 2, ln 3) → p = (1, 2, 3) / 6.
        let l = [0.0f32, 2f32.ln(), 3f32.ln()];
        let lp = log_softmax(&l).unwrap();
        for (got, p) in lp.iter().zip([1.0f64 / 6.0, 2.0 / 6.0, 3.0 / 6.0]) {
            close(got.exp(), p, 1e-7);
        }
        close(lp.iter().map(|l| l.exp()).sum(), 1.0, 1e-15);
    }

    #[test]
    fn huge_logits_neither_overflow_nor_change_the_distribution() {
        let lp = log_softmax(&[1e4, 1e4, 1e4 - 1.0]).unwrap();
        // Two at the maximum, one e⁻¹ below: p_max = 1 / (2 + e⁻¹).
        close(lp[0], -(2.0 + (-1.0f64).exp()).ln(), 1e-12);
        close(lp[2] - lp[0], -1.0, 1e-12);
        close(entropy(&[1e30, -1e30]).unwrap(), 0.0, 1e-300);
        close(kl_divergence(&[1e4, 0.0], &[1e4, 0.0]).unwrap(), 0.0, 1e-300);
    }

    #[test]
    fn entropy_of_uniform_and_of_one_third_two_thirds() {
        close(entropy(&[5.0; 4]).unwrap(), 4f64.ln(), 1e-15);
        // p = (1/3, 2/3): H = ln 3 − (2/3) ln 2 = 0.636514168294813.
        close(entropy(&[0.0, 2f32.ln()]).unwrap(), 0.636_514_168_294_813, 1e-7);
    }

    #[test]
    fn kl_by_hand_on_three_tokens() {
        // p = (1, 2, 3)/6, q = uniform: KL = Σ p ln(3p) = ln 3 − H(p)
        // H(p) = −(1/6 ln 1/6 + 1/3 ln 1/3 + 1/2 ln 1/2) = 1.0114042647073518
        // KL = 1.0986122886681098 − 1.0114042647073518 = 0.08720802396075800.
        let p = [0.0f32, 2f32.ln(), 3f32.ln()];
        let q = [7.0f32; 3];
        close(kl_divergence(&p, &q).unwrap(), 0.087_208_023_960_758, 1e-7);
        // Reversed: KL(q ‖ p) = Σ (1/3) ln((1/3) / p_i) = (1/3) ln(2 · 1 · 2/3) = (1/3) ln(4/3)
        // = 0.09589402415059363.
        close(kl_divergence(&q, &p).unwrap(), 0.095_894_024_150_593_63, 1e-7);
    }

    #[test]
    fn kl_of_a_distribution_with_itself_is_zero() {
        let l = [0.3f32, -1.7, 2.9, 0.0, 11.5, -40.0];
        let shifted: Vec<f32> = l.iter().map(|x| x + 3.0).collect();
        let k = kl_divergence(&l, &l).unwrap();
        assert!(k.abs() <= 1e-12, "{k}");
        // A constant shift of every logit is the same distribution.
        let k = kl_divergence(&l, &shifted).unwrap();
        assert!((-1e-12..=1e-6).contains(&k), "{k}");
    }

    #[test]
    fn kl_is_non_negative_on_varied_inputs() {
        for s in 0..50u32 {
            let a: Vec<f32> = (0..17).map(|i| ((i * 7 + s * 13) % 11) as f32 * 0.37 - 2.0).collect();
            let b: Vec<f32> = (0..17).map(|i| ((i * 5 + s * 3) % 13) as f32 * 0.41 - 2.5).collect();
            assert!(kl_divergence(&a, &b).unwrap() >= -1e-12);
        }
    }

    #[test]
    fn top1_takes_the_first_maximum() {
        assert_eq!(top1(&[1.0, 3.0, 3.0, 2.0]).unwrap(), 1);
        assert_eq!(top1(&[-5.0]).unwrap(), 0);
        assert_eq!(top1(&[2.0, 2.0]).unwrap(), 0);
    }

    #[test]
    fn position_metrics_by_hand() {
        // ref p = (1, 2, 3)/6, top-1 = 2; var p = (3, 2, 1)/6, top-1 = 0; token 1.
        let r = [0.0f32, 2f32.ln(), 3f32.ln()];
        let v = [3f32.ln(), 2f32.ln(), 0.0];
        let m = position_metrics(&r, &v, 1).unwrap();
        // KL = 1/6 ln(1/3) + 1/3 ln 1 + 1/2 ln 3 = (1/2 − 1/6) ln 3 = (1/3) ln 3.
        close(m.kld, 3f64.ln() / 3.0, 1e-7);
        assert!(!m.top1_agree);
        close(m.p_ref_token_ref, 1.0 / 3.0, 1e-7);
        close(m.p_var_of_ref_token, 1.0 / 3.0, 1e-7);
        close(m.delta_p, 0.0, 1e-7);
        close(m.ref_entropy, 1.011_404_264_707_351_8, 1e-7);
        close(m.logp_ref_of_token, (1.0f64 / 3.0).ln(), 1e-7);
        let m = position_metrics(&r, &v, 2).unwrap();
        close(m.delta_p, 1.0 / 6.0 - 0.5, 1e-7);
        close(m.logp_var_of_token, (1.0f64 / 6.0).ln(), 1e-7);
        assert!(position_metrics(&r, &r, 0).unwrap().top1_agree);
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        assert_eq!(log_softmax(&[]), Err(ScoreError::Empty { what: "logits" }));
        assert!(matches!(log_softmax(&[0.0, f32::NAN]), Err(ScoreError::NonFinite { index: 1, .. })));
        assert!(matches!(entropy(&[f32::INFINITY]), Err(ScoreError::NonFinite { .. })));
        assert!(matches!(
            kl_divergence(&[0.0; 3], &[0.0; 4]),
            Err(ScoreError::LengthMismatch { left: 3, right: 4, .. })
        ));
        assert!(matches!(
            position_metrics(&[0.0; 3], &[0.0; 3], 3),
            Err(ScoreError::OutOfRange { index: 3, limit: 3, .. })
        ));
        assert!(top1(&[]).is_err());
    }
}
