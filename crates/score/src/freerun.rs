//! Free-running comparison: the reference and the variant each generate greedily from the same
//! prompt, and their token sequences are compared position by position over a horizon `h`
//! (10, 100, 1000 tokens). Once the sequences part, later positions compare different
//! contexts; that is the drift a user sees.
//!
//! Both sequences must hold at least `h` generated tokens (prompt excluded): a run that stopped
//! early is the caller's to pad or to score at a shorter horizon, never silently truncated here.

use serde::{Deserialize, Serialize};

use crate::error::{Result, ScoreError};
use crate::survival::Observation;

/// Fraction of the first `horizon` positions where the two sequences hold the same token
/// (position-aligned: a token inserted early misaligns everything after it).
///
/// # Shapes
/// `reference: [≥ horizon]`, `variant: [≥ horizon]`; any token type.
///
/// # Errors
/// [`ScoreError::Zero`] when `horizon == 0`, [`ScoreError::TooShort`] when a sequence is
/// shorter than `horizon`.
pub fn token_match_rate<T: PartialEq>(reference: &[T], variant: &[T], horizon: usize) -> Result<f64> {
    let (r, v) = heads(reference, variant, horizon)?;
    let matches = r.iter().zip(v).filter(|(a, b)| a == b).count();
    Ok(matches as f64 / horizon as f64)
}

/// Whether the first `horizon` tokens are all equal.
///
/// # Shapes and errors
/// As [`token_match_rate`].
pub fn exact_match<T: PartialEq>(reference: &[T], variant: &[T], horizon: usize) -> Result<bool> {
    let (r, v) = heads(reference, variant, horizon)?;
    Ok(r == v)
}

/// Where two sequences first part, within a horizon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Divergence {
    /// 0-based position of the first differing token, or the horizon when `censored`.
    pub position: usize,
    /// `true` when the sequences agree on the whole horizon: the divergence, if any, lies
    /// beyond what was generated.
    pub censored: bool,
}

impl Divergence {
    /// The survival-analysis view: the number of tokens after which the sequences are known to
    /// differ (`position + 1`, since the tokens at `0..position` were identical), or, censored,
    /// the number after which they were still identical (`horizon`).
    ///
    /// With this convention `S(t)` of [`crate::survival::kaplan_meier`] is the share of prompts
    /// whose first `t` tokens are identical, and `S(0) = 1`.
    pub fn observation(self) -> Observation {
        if self.censored {
            Observation { time: self.position, censored: true }
        } else {
            Observation { time: self.position + 1, censored: false }
        }
    }
}

/// The first position `< horizon` where the sequences differ, or `(horizon, censored)`.
///
/// # Shapes and errors
/// As [`token_match_rate`].
pub fn first_divergence<T: PartialEq>(reference: &[T], variant: &[T], horizon: usize) -> Result<Divergence> {
    let (r, v) = heads(reference, variant, horizon)?;
    Ok(match r.iter().zip(v).position(|(a, b)| a != b) {
        Some(position) => Divergence { position, censored: false },
        None => Divergence { position: horizon, censored: true },
    })
}

fn heads<'a, T>(reference: &'a [T], variant: &'a [T], horizon: usize) -> Result<(&'a [T], &'a [T])> {
    if horizon == 0 {
        return Err(ScoreError::Zero { what: "horizon" });
    }
    for (what, s) in [("reference sequence", reference), ("variant sequence", variant)] {
        if s.len() < horizon {
            return Err(ScoreError::TooShort { what, len: s.len(), horizon });
        }
    }
    Ok((&reference[..horizon], &variant[..horizon]))
}

#[cfg(test)]
mod tests {
    use super::*;

    const R: [u32; 6] = [1, 2, 3, 4, 5, 6];
    const V: [u32; 6] = [1, 2, 9, 4, 9, 6];

    #[test]
    fn match_rate_counts_aligned_positions() {
        assert_eq!(token_match_rate(&R, &V, 2).unwrap(), 1.0);
        assert_eq!(token_match_rate(&R, &V, 3).unwrap(), 2.0 / 3.0);
        assert_eq!(token_match_rate(&R, &V, 6).unwrap(), 4.0 / 6.0);
        // A shift by one token matches nowhere.
        assert_eq!(token_match_rate(&R[1..], &R[..5], 5).unwrap(), 0.0);
    }

    #[test]
    fn exact_match_and_first_divergence() {
        assert!(exact_match(&R, &V, 2).unwrap());
        assert!(!exact_match(&R, &V, 3).unwrap());
        assert_eq!(first_divergence(&R, &V, 6).unwrap(), Divergence { position: 2, censored: false });
        assert_eq!(first_divergence(&R, &V, 2).unwrap(), Divergence { position: 2, censored: true });
        assert_eq!(first_divergence(&R, &V, 3).unwrap(), Divergence { position: 2, censored: false });
        assert_eq!(first_divergence(&[7], &[8], 1).unwrap(), Divergence { position: 0, censored: false });
    }

    #[test]
    fn divergence_as_survival_observation() {
        // Differs at position 2: identical for 2 tokens, known different after 3.
        let d = Divergence { position: 2, censored: false };
        assert_eq!(d.observation(), Observation { time: 3, censored: false });
        // Identical over a horizon of 10: still identical after 10 tokens.
        let d = Divergence { position: 10, censored: true };
        assert_eq!(d.observation(), Observation { time: 10, censored: true });
    }

    #[test]
    fn short_sequences_and_zero_horizon_are_errors() {
        assert_eq!(token_match_rate(&R, &V, 0), Err(ScoreError::Zero { what: "horizon" }));
        assert!(matches!(
            exact_match(&R, &V[..3], 4),
            Err(ScoreError::TooShort { what: "variant sequence", len: 3, horizon: 4 })
        ));
        assert!(first_divergence::<u32>(&[], &[], 1).is_err());
    }
}
