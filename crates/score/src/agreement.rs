//! Top-K agreement and speculative-sampling acceptance between a reference's and a variant's
//! distributions at one position: the host definitions (`f64`) the chunk reductions of
//! [`crate::host`] and [`crate::device`] are tested against.
//!
//! - **Top-K overlap** (exllamav3's `model_diff` reports it for K = 1..5):
//!   `|top-K(P_var) ∩ top-K(P_ref)| / K`. Top-K orders by logit, larger first, lower id first on
//!   ties (so the top-1 is the first maximum, as greedy decoding's argmax). K = 1 is the top-1
//!   agreement.
//! - **The reference's top-1 in the variant's top-K**: whether the token the reference would
//!   pick greedily is among the variant's K most likely.
//! - **Acceptance** of speculative sampling at temperature 1 (Leviathan, Kalman & Matias 2023,
//!   "Fast Inference from Transformers via Speculative Decoding", §3.1–3.3): a token drafted from
//!   `q` (the variant) is kept with probability `min(1, p/q)` under `p` (the reference), so a
//!   draft is accepted with probability `β = Σ_i min(p_i, q_i) = 1 − TV(p, q)`. With `α` the
//!   expected `β` and drafts accepted independently, a step that drafts `γ` tokens produces
//!   `(1 − α^(γ+1)) / (1 − α)` tokens in expectation (their equation 1): [`expected_tokens`].
//!
//! On the compact reference (top-K log-probabilities plus a tail bucket, [`crate::compact`]),
//! merging outcomes can only move these one way: `Σ_{i∈T} min(p_i, q_i) + min(p_tail, q_tail) ≥ β`
//! (the minimum of two sums is at least the sum of the minima), an upper bound
//! ([`compact_acceptance`]); the overlaps are exact when the reference kept at least K tokens.

use crate::error::{Result, ScoreError, check_finite, check_nonempty, check_paired};
use crate::logprob::log_softmax;

/// The largest K of the top-K agreement kept per position.
pub const TOP_K: usize = 5;

/// A top-K overlap that could not be computed: the compact reference kept fewer than K tokens.
pub const UNKNOWN: u8 = u8::MAX;

/// Where the top-K lists of the two models agree, at one position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TopKAgreement {
    /// `shared[K − 1] = |top-K(P_var) ∩ top-K(P_ref)|` for K = 1..=[`TOP_K`] ([`UNKNOWN`] where
    /// the reference's top-K is not known).
    pub shared: [u8; TOP_K],
    /// The 0-based rank of the reference's top-1 token in the variant's top-[`TOP_K`], or
    /// [`TOP_K`] when it is not among them.
    pub ref_top1_rank: u8,
}

impl TopKAgreement {
    /// `|top-K ∩ top-K| / K`, or `None` where it is [`UNKNOWN`].
    ///
    /// # Panics
    /// For `k` outside `1..=TOP_K` (a programming error, never input).
    pub fn overlap(&self, k: usize) -> Option<f64> {
        let s = self.shared[k - 1];
        (s != UNKNOWN).then(|| f64::from(s) / k as f64)
    }

    /// Whether the reference's top-1 token is among the variant's top `k ≤ TOP_K`.
    pub fn ref_top1_in_top(&self, k: usize) -> bool {
        usize::from(self.ref_top1_rank) < k
    }

    /// Whether every value is one a position can have: `shared[K−1] ≤ K` (or unknown, and then
    /// for every larger K too), and a rank ≤ [`TOP_K`].
    pub fn is_valid(&self) -> bool {
        let known = self.shared.iter().take_while(|&&s| s != UNKNOWN).count();
        self.shared[known..].iter().all(|&s| s == UNKNOWN)
            && self.shared[..known].iter().enumerate().all(|(k, &s)| usize::from(s) <= k + 1)
            && usize::from(self.ref_top1_rank) <= TOP_K
    }
}

/// The agreement of two top lists, each most probable first: `ref_ids` the reference's (at least
/// its top-1), `var_ids` the variant's top-[`TOP_K`]. The overlap at a K longer than either list
/// (a compact reference that kept fewer tokens, a vocabulary smaller than K) is [`UNKNOWN`].
///
/// # Shapes
/// `ref_ids: [≥ 1]`, `var_ids: [≥ 1]`; only the first [`TOP_K`] of each are read.
pub fn top_k_agreement(ref_ids: &[u32], var_ids: &[u32]) -> TopKAgreement {
    let (r, v) = (&ref_ids[..ref_ids.len().min(TOP_K)], &var_ids[..var_ids.len().min(TOP_K)]);
    let mut shared = [UNKNOWN; TOP_K];
    for (k, slot) in shared.iter_mut().enumerate().map(|(i, s)| (i + 1, s)) {
        if k <= r.len() && k <= v.len() {
            *slot = r[..k].iter().filter(|id| v[..k].contains(id)).count() as u8;
        }
    }
    let rank = r.first().and_then(|top1| v.iter().position(|id| id == top1)).unwrap_or(TOP_K);
    TopKAgreement { shared, ref_top1_rank: rank as u8 }
}

/// The `k` most probable tokens of one position, most probable first, lower id first on ties.
///
/// # Shapes
/// `logits: [vocab]` → `[min(k, vocab)]`.
///
/// # Errors
/// As [`log_softmax`].
pub fn top_k_ids(logits: &[f32], k: usize) -> Result<Vec<u32>> {
    check_nonempty("logits", logits)?;
    check_finite("logits", logits)?;
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    // Stable: equal logits keep id order.
    order.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
    order.truncate(k);
    Ok(order)
}

/// The speculative-sampling acceptance `β = Σ_i min(p_ref,i, p_var,i) = 1 − TV(p_ref, p_var)` of
/// one position, in `[0, 1]`.
///
/// # Shapes
/// `ref_logits: [vocab]`, `var_logits: [vocab]`.
///
/// # Errors
/// [`ScoreError::LengthMismatch`] when the vocabularies differ in size, else as [`log_softmax`].
pub fn acceptance(ref_logits: &[f32], var_logits: &[f32]) -> Result<f64> {
    check_paired("reference and variant logits", ref_logits.len(), var_logits.len())?;
    let (p, q) = (log_softmax(ref_logits)?, log_softmax(var_logits)?);
    Ok(p.iter().zip(&q).map(|(&a, &b)| a.exp().min(b.exp())).sum())
}

/// The acceptance against the compact reference: `Σ_{i∈T} min(p_i, q_i) + min(p_tail, q_tail)`
/// from both sides' top-K log-probabilities (paired by token) and tail log-masses, an upper
/// bound of [`acceptance`] (see the module docs).
///
/// # Shapes
/// `top_logp_ref`, `top_logp_var`: `[K]`.
///
/// # Errors
/// [`ScoreError::LengthMismatch`] when the two sides differ in K.
pub fn compact_acceptance(
    top_logp_ref: &[f64],
    tail_logp_ref: f64,
    top_logp_var: &[f64],
    tail_logp_var: f64,
) -> Result<f64> {
    check_paired("reference and variant top-K", top_logp_ref.len(), top_logp_var.len())?;
    let top: f64 = top_logp_ref.iter().zip(top_logp_var).map(|(&p, &q)| p.exp().min(q.exp())).sum();
    Ok(top + tail_logp_ref.exp().min(tail_logp_var.exp()))
}

/// Expected tokens per verification step of speculative sampling with `gamma` drafts per step
/// and per-draft acceptance `alpha`: `(1 − α^(γ+1)) / (1 − α)` (Leviathan et al. 2023, eq. 1),
/// `γ + 1` at `α = 1`. Increasing in `α`, from 1 at `α = 0`.
///
/// # Errors
/// [`ScoreError::Zero`] for `gamma = 0`; [`ScoreError::Probability`] for `alpha` outside `[0, 1]`.
pub fn expected_tokens(alpha: f64, gamma: usize) -> Result<f64> {
    if gamma == 0 {
        return Err(ScoreError::Zero { what: "speculative draft length" });
    }
    if !(0.0..=1.0).contains(&alpha) {
        return Err(ScoreError::Probability { p: alpha });
    }
    // Σ_{j=0}^{γ} α^j: the same value as the closed form, without its 0/0 at α = 1.
    Ok((0..=gamma).map(|j| alpha.powi(j as i32)).sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlaps_and_rank_by_hand() {
        let a = top_k_agreement(&[7, 3, 9, 1, 4], &[3, 7, 2, 9, 8]);
        // K=1: {7}∩{3} = 0; K=2: {7,3}∩{3,7} = 2; K=3: {7,3,9}∩{3,7,2} = 2; K=4: +9 = 3; K=5: 3.
        assert_eq!(a.shared, [0, 2, 2, 3, 3]);
        assert_eq!(a.ref_top1_rank, 1);
        assert_eq!(a.overlap(2), Some(1.0));
        assert_eq!(a.overlap(4), Some(0.75));
        assert!(!a.ref_top1_in_top(1) && a.ref_top1_in_top(2));
        let none = top_k_agreement(&[1, 2, 3, 4, 5], &[6, 7, 8, 9, 10]);
        assert_eq!((none.shared, none.ref_top1_rank), ([0; 5], 5));
        assert!(none.is_valid() && a.is_valid());
    }

    #[test]
    fn a_short_reference_list_leaves_larger_overlaps_unknown() {
        let a = top_k_agreement(&[4, 2], &[2, 4, 1, 0, 3]);
        assert_eq!(a.shared, [0, 2, UNKNOWN, UNKNOWN, UNKNOWN]);
        assert_eq!(a.overlap(3), None);
        assert!(a.is_valid());
        // A vocabulary of three.
        let small = top_k_agreement(&[0, 2, 1], &[2, 0, 1]);
        assert_eq!(small.shared, [0, 2, 3, UNKNOWN, UNKNOWN]);
        let bad = TopKAgreement { shared: [1, UNKNOWN, 2, UNKNOWN, UNKNOWN], ref_top1_rank: 0 };
        assert!(!bad.is_valid());
        assert!(!TopKAgreement { shared: [2, 0, 0, 0, 0], ref_top1_rank: 0 }.is_valid());
    }

    #[test]
    fn top_k_ids_break_ties_by_id() {
        assert_eq!(top_k_ids(&[1.0, 3.0, 3.0, 2.0, 3.0], 4).unwrap(), vec![1, 2, 4, 3]);
        assert_eq!(top_k_ids(&[0.0, 1.0], 5).unwrap(), vec![1, 0]);
    }

    #[test]
    fn acceptance_by_hand() {
        // p = (1, 2, 3)/6, q = uniform: Σ min = 1/6 + 1/3 + 1/3 = 5/6; TV = 1/6.
        let p = [0.0f32, 2f32.ln(), 3f32.ln()];
        let a = acceptance(&p, &[0.0; 3]).unwrap();
        assert!((a - 5.0 / 6.0).abs() < 1e-7, "{a}");
        assert!((acceptance(&p, &p).unwrap() - 1.0).abs() < 1e-15);
        // Disjoint supports (as far as f64 goes): nothing is accepted.
        assert!(acceptance(&[100.0, -100.0], &[-100.0, 100.0]).unwrap() < 1e-80);
    }

    #[test]
    fn the_compact_acceptance_bounds_the_exact_one_from_above() {
        let r: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.7).collect();
        let q: Vec<f32> = (0..50).map(|i| ((i * 13) % 7) as f32 * 0.9).collect();
        let exact = acceptance(&r, &q).unwrap();
        let (lp, lq) = (log_softmax(&r).unwrap(), log_softmax(&q).unwrap());
        for k in [1, 3, 10, 49] {
            let top = top_k_ids(&r, k).unwrap();
            let tail = |l: &[f64]| {
                let t: Vec<f64> = (0..50).filter(|i| !top.contains(&(*i as u32))).map(|i| l[i]).collect();
                crate::compact::log_sum_exp(&t)
            };
            let pick = |l: &[f64]| top.iter().map(|&i| l[i as usize]).collect::<Vec<f64>>();
            let bound = compact_acceptance(&pick(&lp), tail(&lp), &pick(&lq), tail(&lq)).unwrap();
            assert!(bound >= exact - 1e-12, "K = {k}: {bound} < {exact}");
        }
    }

    #[test]
    fn expected_tokens_follow_leviathan() {
        assert_eq!(expected_tokens(0.0, 4).unwrap(), 1.0);
        assert_eq!(expected_tokens(1.0, 4).unwrap(), 5.0);
        // α = 0.5, γ = 2: (1 − 0.125) / 0.5 = 1.75.
        assert!((expected_tokens(0.5, 2).unwrap() - 1.75).abs() < 1e-15);
        let closed = (1.0 - 0.8f64.powi(9)) / 0.2;
        assert!((expected_tokens(0.8, 8).unwrap() - closed).abs() < 1e-12);
        assert!(expected_tokens(0.5, 0).is_err() && expected_tokens(1.5, 1).is_err());
    }
}
