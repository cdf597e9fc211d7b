//! The compact reference: per position, the reference's top-K log-probabilities and one tail
//! bucket instead of its whole vocabulary, and the KL divergence a variant gets against it.
//!
//! With `T` the K most probable tokens of the reference and the tail `∁T` as one outcome,
//!
//! ```text
//! KL_K(P ‖ Q) = Σ_{i∈T} p_i (ln p_i − ln q_i) + p_tail (ln p_tail − ln q_tail),
//! p_tail = Σ_{i∉T} p_i,   q_tail = Σ_{i∉T} q_i.
//! ```
//!
//! By the log-sum inequality, `Σ_{i∉T} p_i ln(p_i/q_i) ≥ p_tail ln(p_tail/q_tail)`, so
//! `KL_K ≤ KL` (merging outcomes never increases a divergence), with equality when K covers the
//! vocabulary. mlx-lm's `evaluate` stores the same top-K plus tail bucket; llama.cpp's
//! `--kl-divergence-base` files store every logit. `ln p_tail` is a log-sum-exp over the tail's
//! own log-probabilities, never `ln(1 − Σ_{i∈T} p_i)`, which cancels to nothing (or below zero)
//! once the top K hold all but ~1e-7 of the mass in `f32`.
//!
//! These are the host definitions (`f64`), what [`crate::device`]'s reductions are tested
//! against.

use crate::error::{Result, ScoreError, check_finite, check_nonempty};
use crate::logprob::log_softmax;

/// The reference's distribution at one position, kept compact.
#[derive(Debug, Clone, PartialEq)]
pub struct CompactPosition {
    /// The K most probable tokens, most probable first (lower id first on ties).
    pub top_ids: Vec<u32>,
    /// Their log-probabilities, in the same order.
    pub top_logp: Vec<f64>,
    /// `ln p_tail`: the log of the probability of every other token (`-inf` when K covers the
    /// vocabulary).
    pub tail_logp: f64,
}

/// Keeps the top `k` of one position's distribution and its tail.
///
/// # Shapes
/// `logits: [vocab]`; `1 ≤ k`; a `k ≥ vocab` keeps every token (and an empty tail).
///
/// # Errors
/// [`ScoreError::Zero`] for `k = 0`, else as [`log_softmax`].
pub fn compact_position(logits: &[f32], k: usize) -> Result<CompactPosition> {
    if k == 0 {
        return Err(ScoreError::Zero { what: "the reference's top-K" });
    }
    let logp = log_softmax(logits)?;
    let mut order: Vec<usize> = (0..logp.len()).collect();
    // Stable sort: equal log-probabilities keep id order.
    order.sort_by(|&a, &b| logp[b].total_cmp(&logp[a]));
    let k = k.min(logp.len());
    let (top, tail) = order.split_at(k);
    let tail_logp: Vec<f64> = tail.iter().map(|&i| logp[i]).collect();
    Ok(CompactPosition {
        top_ids: top.iter().map(|&i| i as u32).collect(),
        top_logp: top.iter().map(|&i| logp[i]).collect(),
        tail_logp: log_sum_exp(&tail_logp),
    })
}

/// `ln Σ exp(x_i)`, stably (`-inf` for an empty slice).
pub fn log_sum_exp(x: &[f64]) -> f64 {
    let max = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        return f64::NEG_INFINITY;
    }
    max + x.iter().map(|&v| (v - max).exp()).sum::<f64>().ln()
}

/// The variant's side of a compact position: its log-probabilities of the reference's top-K
/// tokens and of the reference's tail.
///
/// # Shapes
/// `var_logits: [vocab]`; `top_ids`: K distinct ids `< vocab`.
///
/// # Errors
/// [`ScoreError::OutOfRange`] for an id `≥ vocab`, else as [`log_softmax`].
pub fn variant_on_compact(var_logits: &[f32], top_ids: &[u32]) -> Result<(Vec<f64>, f64)> {
    let logq = log_softmax(var_logits)?;
    let mut in_top = vec![false; logq.len()];
    for &id in top_ids {
        let slot = in_top.get_mut(id as usize).ok_or(ScoreError::OutOfRange {
            what: "top-K token",
            index: id as usize,
            limit: logq.len(),
        })?;
        *slot = true;
    }
    let tail: Vec<f64> = logq.iter().zip(&in_top).filter(|(_, t)| !**t).map(|(&l, _)| l).collect();
    Ok((top_ids.iter().map(|&i| logq[i as usize]).collect(), log_sum_exp(&tail)))
}

/// `KL_K(P ‖ Q)` in nats from both sides of a compact position (see the module docs): a lower
/// bound of the full-vocabulary KL divergence. An empty tail (`ln p_tail = -inf`) contributes
/// nothing.
///
/// # Shapes
/// `top_logp_ref`, `top_logp_var`: `[K]`, paired by token.
///
/// # Errors
/// [`ScoreError::LengthMismatch`] when the two sides differ in K; [`ScoreError::Empty`] for
/// K = 0; [`ScoreError::NonFinite`] for a NaN or `+inf` log-probability.
pub fn compact_kl(top_logp_ref: &[f64], tail_logp_ref: f64, top_logp_var: &[f64], tail_logp_var: f64) -> Result<f64> {
    check_nonempty("top-K log-probabilities", top_logp_ref)?;
    crate::error::check_paired("reference and variant top-K", top_logp_ref.len(), top_logp_var.len())?;
    check_finite("reference top-K log-probabilities", top_logp_ref)?;
    check_finite("variant top-K log-probabilities", top_logp_var)?;
    let top: f64 = top_logp_ref.iter().zip(top_logp_var).map(|(&p, &q)| p.exp() * (p - q)).sum();
    let tail =
        if tail_logp_ref == f64::NEG_INFINITY { 0.0 } else { tail_logp_ref.exp() * (tail_logp_ref - tail_logp_var) };
    Ok(top + tail)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logprob::kl_divergence;

    /// Seeded logits: a peaked distribution over `v` tokens.
    fn logits(v: usize, seed: u64, peak: f32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..v)
            .map(|i| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let u = (s >> 40) as f32 / (1u64 << 24) as f32;
                let bump = if i % 97 == 3 { peak } else { 0.0 };
                4.0 * u + bump
            })
            .collect()
    }

    fn compact_kl_of(r: &[f32], q: &[f32], k: usize) -> f64 {
        let c = compact_position(r, k).expect("compact");
        let (top_q, tail_q) = variant_on_compact(q, &c.top_ids).expect("variant");
        compact_kl(&c.top_logp, c.tail_logp, &top_q, tail_q).expect("kl")
    }

    #[test]
    fn top_k_and_tail_hold_the_whole_mass() {
        let r = logits(1000, 1, 6.0);
        let c = compact_position(&r, 64).expect("compact");
        assert_eq!(c.top_ids.len(), 64);
        assert!(c.top_logp.windows(2).all(|w| w[0] >= w[1]), "descending");
        let mass: f64 = c.top_logp.iter().map(|l| l.exp()).sum::<f64>() + c.tail_logp.exp();
        assert!((mass - 1.0).abs() < 1e-12, "{mass}");
    }

    #[test]
    fn compact_kl_is_a_lower_bound_that_becomes_exact_at_full_k() {
        for seed in 0..20 {
            let r = logits(500, seed, 5.0);
            let q: Vec<f32> = r.iter().zip(logits(500, seed + 100, 0.0)).map(|(a, n)| a + 0.1 * n).collect();
            let exact = kl_divergence(&r, &q).expect("kl");
            let mut last = 0.0;
            for k in [1, 8, 64, 256, 499] {
                let c = compact_kl_of(&r, &q, k);
                assert!(c <= exact + 1e-12, "seed {seed} k {k}: {c} > {exact}");
                assert!(c >= last - 1e-12, "seed {seed}: KL_K must grow with K ({k}: {c} < {last})");
                last = c;
            }
            assert!((compact_kl_of(&r, &q, 500) - exact).abs() < 1e-12, "K = vocab is exact");
        }
    }

    #[test]
    fn identical_distributions_give_zero() {
        let r = logits(300, 7, 3.0);
        assert_eq!(compact_kl_of(&r, &r, 16), 0.0);
    }

    #[test]
    fn tiny_tails_do_not_cancel() {
        // A reference whose top token holds all but ~e^-40 of the mass: 1 − Σ p would be exactly
        // 0 in f64, the log-sum-exp keeps the tail.
        let mut r = vec![0.0f32; 100];
        r[5] = 40.0;
        let c = compact_position(&r, 1).expect("compact");
        assert!((c.tail_logp - (99f64.ln() - 40.0)).abs() < 1e-9, "{}", c.tail_logp);
    }

    #[test]
    fn bad_input_is_refused() {
        assert!(matches!(compact_position(&[1.0], 0), Err(ScoreError::Zero { .. })));
        assert!(matches!(variant_on_compact(&[1.0, 2.0], &[2]), Err(ScoreError::OutOfRange { .. })));
        assert!(matches!(compact_kl(&[-1.0], -2.0, &[-1.0, -2.0], -3.0), Err(ScoreError::LengthMismatch { .. })));
    }
}
