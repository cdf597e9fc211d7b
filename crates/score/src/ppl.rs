//! Perplexity and the variant-to-reference perplexity ratio.
//!
//! Both models score the same tokens (the reference's sequence, teacher-forced), so a prompt's
//! ratio `PPL_var / PPL_ref = exp(mean ln p_ref − mean ln p_var)` compares like with like. A
//! ratio of 1.02 reads "the variant is 2% more perplexed by the reference's text".

use serde::{Deserialize, Serialize};

use crate::bootstrap::{Interval, bootstrap_ci};
use crate::error::{Result, ScoreError, check_finite, check_nonempty, check_paired};

/// Perplexity `exp(−mean ln p)` of per-token log-probabilities (natural log).
///
/// # Shapes
/// `logprobs: [tokens]`.
///
/// # Errors
/// [`ScoreError::Empty`] when there are no tokens, [`ScoreError::NonFinite`] for a NaN or
/// infinite log-probability (a token of probability 0).
pub fn perplexity(logprobs: &[f64]) -> Result<f64> {
    check_nonempty("log-probabilities", logprobs)?;
    check_finite("log-probabilities", logprobs)?;
    Ok((-logprobs.iter().sum::<f64>() / logprobs.len() as f64).exp())
}

/// One prompt's perplexity ratio `PPL_var / PPL_ref`.
///
/// # Shapes
/// `ref_logprobs: [tokens]`, `var_logprobs: [tokens]`, the same tokens in the same order.
///
/// # Errors
/// [`ScoreError::LengthMismatch`] when the lengths differ, else as [`perplexity`].
pub fn ppl_ratio(ref_logprobs: &[f64], var_logprobs: &[f64]) -> Result<f64> {
    let p = PromptLogProbs::new(ref_logprobs, var_logprobs)?;
    Ok(((p.sum_ref - p.sum_var) / p.tokens as f64).exp())
}

/// What one prompt contributes to a pooled perplexity ratio.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PromptLogProbs {
    /// Tokens scored.
    pub tokens: usize,
    /// `Σ ln p_ref` over the tokens.
    pub sum_ref: f64,
    /// `Σ ln p_var` over the same tokens.
    pub sum_var: f64,
}

impl PromptLogProbs {
    /// Sums one prompt's per-token log-probabilities.
    ///
    /// # Shapes and errors
    /// As [`ppl_ratio`].
    pub fn new(ref_logprobs: &[f64], var_logprobs: &[f64]) -> Result<Self> {
        check_paired("reference and variant log-probabilities", ref_logprobs.len(), var_logprobs.len())?;
        check_nonempty("log-probabilities", ref_logprobs)?;
        check_finite("reference log-probabilities", ref_logprobs)?;
        check_finite("variant log-probabilities", var_logprobs)?;
        Ok(Self { tokens: ref_logprobs.len(), sum_ref: ref_logprobs.iter().sum(), sum_var: var_logprobs.iter().sum() })
    }
}

/// The pooled perplexity ratio of a set of prompts: every token weighs the same,
/// `exp((Σ sum_ref − Σ sum_var) / Σ tokens)`.
///
/// # Shapes
/// `prompts: [prompts]`.
///
/// # Errors
/// [`ScoreError::Empty`] when there are no prompts, and see [`ppl_ratio_ci`] for the checks on
/// each prompt.
pub fn pooled_ppl_ratio(prompts: &[PromptLogProbs]) -> Result<f64> {
    check_prompts(prompts)?;
    let all: Vec<usize> = (0..prompts.len()).collect();
    Ok(pooled_over(prompts, &all))
}

/// Percentile-bootstrap interval of [`pooled_ppl_ratio`], resampling prompts (with all their
/// tokens), as [`bootstrap_ci`] does.
///
/// # Errors
/// [`ScoreError::Empty`] when there are no prompts, [`ScoreError::Zero`] when a prompt has no
/// tokens, [`ScoreError::NonFinite`] when a sum is NaN or infinite, else as [`bootstrap_ci`].
pub fn ppl_ratio_ci(prompts: &[PromptLogProbs], resamples: usize, seed: u64, level: f64) -> Result<Interval> {
    check_prompts(prompts)?;
    bootstrap_ci(prompts.len(), resamples, seed, level, |idx| pooled_over(prompts, idx))
}

fn check_prompts(prompts: &[PromptLogProbs]) -> Result<()> {
    check_nonempty("perplexity prompts", prompts)?;
    for (index, p) in prompts.iter().enumerate() {
        if p.tokens == 0 {
            return Err(ScoreError::Zero { what: "tokens of every perplexity prompt" });
        }
        for value in [p.sum_ref, p.sum_var] {
            if !value.is_finite() {
                return Err(ScoreError::NonFinite { what: "prompt log-probability sum", index, value });
            }
        }
    }
    Ok(())
}

fn pooled_over(prompts: &[PromptLogProbs], indices: &[usize]) -> f64 {
    let (mut diff, mut tokens) = (0.0, 0usize);
    for &i in indices {
        diff += prompts[i].sum_ref - prompts[i].sum_var;
        tokens += prompts[i].tokens;
    }
    (diff / tokens as f64).exp()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perplexity_by_hand() {
        // p = 1/2, 1/4, 1/8: mean ln p = −2 ln 2 → PPL = 4 (the geometric mean of 2, 4, 8).
        let lp = [0.5f64.ln(), 0.25f64.ln(), 0.125f64.ln()];
        assert!((perplexity(&lp).unwrap() - 4.0).abs() < 1e-12);
        // Uniform over a vocabulary of 32 → 32.
        assert!((perplexity(&[(1.0f64 / 32.0).ln(); 5]).unwrap() - 32.0).abs() < 1e-12);
    }

    #[test]
    fn ratio_per_prompt_and_pooled() {
        // Prompt A: ref PPL 4, var PPL 8 over 3 tokens → ratio 2.
        let a_ref = [0.5f64.ln(), 0.25f64.ln(), 0.125f64.ln()];
        let a_var = [0.125f64.ln(); 3];
        assert!((ppl_ratio(&a_ref, &a_var).unwrap() - 2.0).abs() < 1e-12);
        // Prompt B: identical, 1 token → ratio 1.
        let b = [0.3f64.ln()];
        assert!((ppl_ratio(&b, &b).unwrap() - 1.0).abs() < 1e-15);
        // Pooled: (Σ ref − Σ var) = 3 ln 2 over 4 tokens → 2^(3/4) = 1.681792830507429.
        let prompts = [PromptLogProbs::new(&a_ref, &a_var).unwrap(), PromptLogProbs::new(&b, &b).unwrap()];
        let pooled = pooled_ppl_ratio(&prompts).unwrap();
        assert!((pooled - 1.681_792_830_507_429).abs() < 1e-12);
        let ci = ppl_ratio_ci(&prompts, 500, 11, 0.95).unwrap();
        assert_eq!(ci.estimate, pooled);
        // Resamples range from all-B (ratio 1) to all-A (ratio 2).
        assert!((1.0..=pooled).contains(&ci.lo) && (pooled..=2.0 + 1e-12).contains(&ci.hi), "{ci:?}");
    }

    #[test]
    fn bad_input_is_an_error() {
        assert!(matches!(perplexity(&[]), Err(ScoreError::Empty { .. })));
        assert!(matches!(perplexity(&[f64::NEG_INFINITY]), Err(ScoreError::NonFinite { .. })));
        assert!(matches!(ppl_ratio(&[-1.0], &[-1.0, -2.0]), Err(ScoreError::LengthMismatch { .. })));
        assert!(matches!(pooled_ppl_ratio(&[]), Err(ScoreError::Empty { .. })));
        let zero = PromptLogProbs { tokens: 0, sum_ref: 0.0, sum_var: 0.0 };
        assert!(matches!(ppl_ratio_ci(&[zero], 10, 0, 0.95), Err(ScoreError::Zero { .. })));
    }
}
