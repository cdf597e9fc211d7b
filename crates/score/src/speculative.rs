//! Greedy speculative decoding with the variant as the draft and the reference as the verifier
//! (Leviathan, Kalman & Matias 2023, "Fast Inference from Transformers via Speculative Decoding";
//! Chen et al. 2023, "Accelerating Large Language Model Decoding with Speculative Sampling"):
//! how many tokens each verification step of the reference yields.
//!
//! With greedy verification a step works as follows. The draft proposes `γ` tokens greedily from
//! the current text; the reference computes its own greedy token at each of the `γ + 1`
//! positions in one pass; the step keeps the longest run of drafts equal to the reference's
//! tokens, then the reference's own token at the first position that differs (or, when all `γ`
//! agree, its token after them). Every kept token is the reference's, so the text is exactly the
//! reference's greedy continuation, and while the drafts agree each is the variant's greedy token
//! on the reference's own text. So the steps are determined by the teacher-forced top-1 agreement
//! on the reference's continuation, `agree[t]` = (the variant's most likely token at `t` is the
//! reference's): a step at `t` accepts the run of `agree[t..t+γ]` that holds from its start,
//! `r ≤ γ` tokens, yields `r + 1`, and the next step starts at `t + r + 1`.
//!
//! Over a horizon of `h` positions the tokens per step are `h / steps` (a last step that would
//! reach past `h` counts once and yields only the positions up to `h`).

use crate::error::{Result, ScoreError};

/// The verification steps greedy speculative decoding with draft length `gamma` takes to produce
/// the first `horizon` tokens of the reference's continuation, from the top-1 agreement sequence
/// (see the module documentation).
///
/// # Shapes
/// `agree: [≥ horizon]`, `agree[t]` for generated position `t`.
///
/// # Errors
/// [`ScoreError::Zero`] when `gamma` or `horizon` is 0, [`ScoreError::TooShort`] when `agree`
/// has fewer than `horizon` positions.
pub fn greedy_speculative_steps(agree: &[bool], gamma: usize, horizon: usize) -> Result<usize> {
    if gamma == 0 {
        return Err(ScoreError::Zero { what: "speculative draft length" });
    }
    if horizon == 0 {
        return Err(ScoreError::Zero { what: "horizon" });
    }
    if agree.len() < horizon {
        return Err(ScoreError::TooShort { what: "top-1 agreement", len: agree.len(), horizon });
    }
    let (mut t, mut steps) = (0, 0);
    while t < horizon {
        let window = &agree[t..(t + gamma).min(horizon)];
        let accepted = window.iter().take_while(|&&a| a).count();
        steps += 1;
        t += accepted + 1;
    }
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_by_hand() {
        let (y, n) = (true, false);
        // All agree, γ = 4: steps of 5 tokens, 10 positions in 2 steps.
        assert_eq!(greedy_speculative_steps(&[y; 10], 4, 10), Ok(2));
        // None agrees: one token per step, whatever γ.
        assert_eq!(greedy_speculative_steps(&[n; 7], 8, 7), Ok(7));
        // y y n y | y y y y: γ = 2 → [y y]+bonus(pos 2) → t=3: [y y]+bonus(pos 5) → t=6: [y y]
        // reaches 8 → 3 steps.
        let a = [y, y, n, y, y, y, y, y];
        assert_eq!(greedy_speculative_steps(&a, 2, 8), Ok(3));
        // γ = 4: t=0 [y y n] accepts 2 → t=3 [y y y y] accepts 4 → t=8: 2 steps.
        assert_eq!(greedy_speculative_steps(&a, 4, 8), Ok(2));
        // γ = 1: t=0 y → t=2; t=2 n → t=3; t=3 y → 5; t=5 y → 7; t=7 y → 9: 5 steps.
        assert_eq!(greedy_speculative_steps(&a, 1, 8), Ok(5));
        // The horizon cuts the sequence: only the first 3 positions count.
        assert_eq!(greedy_speculative_steps(&a, 4, 3), Ok(1));
    }

    #[test]
    fn bad_input_is_an_error() {
        assert!(greedy_speculative_steps(&[true], 0, 1).is_err());
        assert!(greedy_speculative_steps(&[true], 1, 0).is_err());
        assert!(greedy_speculative_steps(&[true], 1, 2).is_err());
    }
}
