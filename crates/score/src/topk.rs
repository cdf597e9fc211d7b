//! KL divergence when one side is known only by its top-K log-probabilities, as an inference
//! server returns them (OpenAI-compatible `logprobs`: the K most probable tokens of each step),
//! with bounds instead of a guess.
//!
//! The other side, P, is the reference's whole distribution at that position (qdrift's own run).
//! Q is the served variant's: known on a set `S` of K tokens (`q_i`, i ∈ S), with
//! `q_rest = 1 − Σ_{i∈S} q_i` spread over the other tokens in an unknown way, each of them at
//! most `q_min = min_{i∈S} q_i` (the server listed the K most probable).
//!
//! - **Forward, `KL(P ‖ Q)`** (llama.cpp's `--kl-divergence` direction). Merging the tokens outside
//!   `S` into one outcome gives, by the log-sum inequality,
//!   `KL_S(P ‖ Q) = Σ_{i∈S} p_i ln(p_i/q_i) + p_rest ln(p_rest/q_rest) ≤ KL(P ‖ Q)`: a lower
//!   bound. There is no finite upper bound (a token outside `S` may have `q_i → 0`), so
//!   [`TopKBounds::upper`] is `+∞` unless `S` covers the vocabulary.
//! - **Reverse, `KL(Q ‖ P)`**. The same merge gives the lower bound. The upper bound maximizes
//!   `Σ_{i∉S} q_i ln(q_i/p_i)` over `0 ≤ q_i ≤ q_min`, `Σ q_i = q_rest`: a convex function on a
//!   polytope, so the maximum sits at a vertex (every `q_i` at 0 or `q_min` but one), and by
//!   rearrangement the mass goes to the least probable tokens under P first.
//!
//! When `S` covers the vocabulary both bounds equal the exact divergence. `q_rest` is computed as
//! `1 − Σ q_i` in `f64` from the server's log-probabilities and clamped at 0 (a server's top-K
//! that sums above 1 by its own rounding has no mass left outside `S`), and is 0 when `S` is the
//! whole vocabulary.

use crate::compact::log_sum_exp;
use crate::error::{Result, ScoreError, check_finite, check_nonempty};
use crate::logprob::log_softmax;

/// A divergence known to lie in `[lower, upper]` (`upper` may be `+∞`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TopKBounds {
    /// The merged-tail divergence: never above the exact one.
    pub lower: f64,
    /// The largest divergence the listed top-K allow (`+∞` when none is finite).
    pub upper: f64,
}

impl TopKBounds {
    /// Whether the bounds pin the value down (`upper − lower ≤ tol`).
    pub fn is_exact(&self, tol: f64) -> bool {
        self.upper - self.lower <= tol
    }
}

/// The forward and reverse divergences between the reference's distribution and a served top-K.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TopKDivergence {
    /// `KL(P_ref ‖ Q_var)`.
    pub forward: TopKBounds,
    /// `KL(Q_var ‖ P_ref)`.
    pub reverse: TopKBounds,
    /// `q_rest`: the variant's probability outside its listed tokens.
    pub missing_mass: f64,
}

/// Bounds on KL between the reference's `ref_logits` and a variant known by its top-K.
///
/// # Shapes
/// `ref_logits: [vocab]`; `var_ids: [K]` distinct ids `< vocab`, `var_logp: [K]` their natural-log
/// probabilities (≤ 0, finite), in any order.
///
/// # Errors
/// [`ScoreError::Empty`] for no listed token, [`ScoreError::LengthMismatch`] when ids and
/// log-probabilities differ in length, [`ScoreError::OutOfRange`] for an id `≥ vocab` or a
/// repeated id, [`ScoreError::NonFinite`] for a log-probability that is not finite, else as
/// [`log_softmax`].
pub fn topk_divergence(ref_logits: &[f32], var_ids: &[u32], var_logp: &[f64]) -> Result<TopKDivergence> {
    check_nonempty("the variant's top-K", var_ids)?;
    crate::error::check_paired("the variant's top-K ids and log-probabilities", var_ids.len(), var_logp.len())?;
    check_finite("the variant's top-K log-probabilities", var_logp)?;
    let logp = log_softmax(ref_logits)?;
    let vocab = logp.len();
    let mut listed = vec![false; vocab];
    for &id in var_ids {
        let i = id as usize;
        if i >= vocab || listed[i] {
            return Err(ScoreError::OutOfRange {
                what: "a top-K token id (or a repeated one)",
                index: i,
                limit: vocab,
            });
        }
        listed[i] = true;
    }
    // A log-probability above 0 is a server's rounding of a certain token: cap it at 0.
    let logq: Vec<f64> = var_logp.iter().map(|&l| l.min(0.0)).collect();
    let q_sum: f64 = logq.iter().map(|l| l.exp()).sum();
    let rest_logp: Vec<f64> = (0..vocab).filter(|&i| !listed[i]).map(|i| logp[i]).collect();
    // A top-K that lists the whole vocabulary leaves nothing outside it, whatever its sum's rounding.
    let q_rest = if rest_logp.is_empty() { 0.0 } else { (1.0 - q_sum).max(0.0) };
    let q_min = logq.iter().copied().fold(f64::INFINITY, f64::min).exp();
    let p_rest_ln = log_sum_exp(&rest_logp);

    let mut forward = 0.0;
    let mut reverse = 0.0;
    for (&id, &lq) in var_ids.iter().zip(&logq) {
        let lp = logp[id as usize];
        forward += lp.exp() * (lp - lq);
        reverse += lq.exp() * (lq - lp);
    }
    let p_rest = p_rest_ln.exp();
    let lumped = |a: f64, ln_a: f64, ln_b: f64| if a > 0.0 { a * (ln_a - ln_b) } else { 0.0 };
    let q_rest_ln = q_rest.ln();
    let forward_lower = forward + lumped(p_rest, p_rest_ln, q_rest_ln);
    let reverse_lower = reverse + lumped(q_rest, q_rest_ln, p_rest_ln);
    let forward_upper = if rest_logp.is_empty() {
        forward_lower
    } else if p_rest > 0.0 {
        f64::INFINITY
    } else {
        forward
    };
    let reverse_upper = reverse + reverse_tail_max(rest_logp, q_rest, q_min);
    Ok(TopKDivergence {
        // Rounding can put the merged value a few ulps below 0.
        forward: TopKBounds { lower: forward_lower.max(0.0), upper: forward_upper.max(0.0) },
        reverse: TopKBounds { lower: reverse_lower.max(0.0), upper: reverse_upper.max(reverse_lower).max(0.0) },
        missing_mass: q_rest,
    })
}

/// `max Σ_{i} q_i (ln q_i − ln p_i)` over `0 ≤ q_i ≤ cap`, `Σ q_i = mass`, for the tokens outside
/// the top-K with log-probabilities `rest_logp` under P: the mass fills the least probable
/// tokens first, `cap` each (module docs). `+∞` when the mass cannot fit (`mass > cap · n`, which a
/// consistent top-K never gives) or lands on a token P gives probability 0.
fn reverse_tail_max(mut rest_logp: Vec<f64>, mass: f64, cap: f64) -> f64 {
    if mass <= 0.0 {
        return 0.0;
    }
    rest_logp.sort_by(f64::total_cmp);
    let mut left = mass;
    let mut total = 0.0;
    for lp in rest_logp {
        if left <= 0.0 {
            break;
        }
        let q = left.min(cap);
        if lp == f64::NEG_INFINITY {
            return f64::INFINITY;
        }
        total += q * (q.ln() - lp);
        left -= q;
    }
    if left > 1e-12 * mass.max(1.0) { f64::INFINITY } else { total }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logprob::kl_divergence;

    /// A deterministic distribution over `n` tokens with a long tail.
    fn logits(n: usize, seed: u32) -> Vec<f32> {
        (0..n).map(|i| (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 1000) as f32 / 150.0).collect()
    }

    fn top_k(logits: &[f32], k: usize) -> (Vec<u32>, Vec<f64>) {
        let lq = log_softmax(logits).unwrap();
        let mut order: Vec<usize> = (0..lq.len()).collect();
        order.sort_by(|&a, &b| lq[b].total_cmp(&lq[a]));
        order.truncate(k);
        (order.iter().map(|&i| i as u32).collect(), order.iter().map(|&i| lq[i]).collect())
    }

    #[test]
    fn the_bounds_contain_the_exact_divergences_for_every_k() {
        for seed in 0..20 {
            let p = logits(64, seed);
            let q = logits(64, seed.wrapping_mul(7) + 3);
            let exact_forward = kl_divergence(&p, &q).unwrap();
            let exact_reverse = kl_divergence(&q, &p).unwrap();
            let mut last_gap = f64::INFINITY;
            for k in [1, 2, 5, 10, 20, 40, 63] {
                let (ids, lq) = top_k(&q, k);
                let d = topk_divergence(&p, &ids, &lq).unwrap();
                assert!(d.forward.lower <= exact_forward + 1e-12, "seed {seed} k {k}: {d:?} vs {exact_forward}");
                assert_eq!(d.forward.upper, f64::INFINITY);
                assert!(d.reverse.lower <= exact_reverse + 1e-12, "seed {seed} k {k}: {d:?} vs {exact_reverse}");
                assert!(d.reverse.upper >= exact_reverse - 1e-12, "seed {seed} k {k}: {d:?} vs {exact_reverse}");
                let gap = d.reverse.upper - d.reverse.lower;
                assert!(gap <= last_gap + 1e-12, "the reverse interval narrows as K grows");
                last_gap = gap;
            }
        }
    }

    #[test]
    fn a_top_k_covering_the_vocabulary_gives_the_exact_divergences() {
        let p = logits(32, 1);
        let q = logits(32, 2);
        let (ids, lq) = top_k(&q, 32);
        let d = topk_divergence(&p, &ids, &lq).unwrap();
        let forward = kl_divergence(&p, &q).unwrap();
        let reverse = kl_divergence(&q, &p).unwrap();
        assert!((d.forward.lower - forward).abs() < 1e-12 && (d.forward.upper - forward).abs() < 1e-12);
        assert!((d.reverse.lower - reverse).abs() < 1e-12 && (d.reverse.upper - reverse).abs() < 1e-12);
        assert!(d.missing_mass < 1e-12);
    }

    #[test]
    fn the_reverse_upper_bound_is_reached_by_the_worst_tail() {
        // P = (0.5, 0.3, 0.15, 0.05); the variant lists token 0 at 0.6, so 0.4 is spread over
        // tokens 1–3 with each ≤ 0.6: the worst case puts it all on token 3 (p = 0.05).
        let p: Vec<f32> = [0.5f32, 0.3, 0.15, 0.05].iter().map(|v| v.ln()).collect();
        let d = topk_divergence(&p, &[0], &[0.6f64.ln()]).unwrap();
        let head = 0.6 * (0.6f64.ln() - 0.5f64.ln());
        let worst = head + 0.4 * (0.4f64.ln() - 0.05f64.ln());
        assert!((d.reverse.upper - worst).abs() < 1e-6, "{} vs {worst}", d.reverse.upper);
        let merged = head + 0.4 * (0.4f64.ln() - 0.5f64.ln());
        assert!((d.reverse.lower - merged).abs() < 1e-6, "{} vs {merged}", d.reverse.lower);
        assert!((d.missing_mass - 0.4).abs() < 1e-12);
    }

    #[test]
    fn bad_top_k_input_is_an_error_not_a_panic() {
        let p = logits(8, 0);
        assert!(matches!(topk_divergence(&p, &[], &[]), Err(ScoreError::Empty { .. })));
        assert!(matches!(topk_divergence(&p, &[1], &[-0.1, -0.2]), Err(ScoreError::LengthMismatch { .. })));
        assert!(matches!(topk_divergence(&p, &[8], &[-0.1]), Err(ScoreError::OutOfRange { .. })));
        assert!(matches!(topk_divergence(&p, &[1, 1], &[-0.1, -0.2]), Err(ScoreError::OutOfRange { .. })));
        assert!(matches!(topk_divergence(&p, &[1], &[f64::NAN]), Err(ScoreError::NonFinite { .. })));
    }
}
