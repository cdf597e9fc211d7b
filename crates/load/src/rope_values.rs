//! The RoPE values a model derives from its configuration, checked to be numbers before any
//! weight is read: each pair's inverse frequency, as `qdrift-model`'s `Rope` computes it in f32
//! from θ and the scaling, must be finite and positive.
//!
//! [`RopeScaling::validate`] checks each parameter alone (a factor positive and finite), but the
//! frequencies divide by them: a YaRN `factor` of 1e-45 is a positive f32 whose quotient
//! `1 / (factor · θ^(2i/d))` is infinite, and the model's first layer then produces non-finite
//! logits, which were blamed on the weights. Llama 3's and YaRN's frequencies lie between the
//! plain one and the one divided by `factor` (a ramp blends the two), so those two are checked.

use qdrift_weights::RopeScaling;

/// The configuration value a derived RoPE value comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RopeParam {
    /// θ, the base of the plain frequencies.
    Theta,
    /// The scaling's `factor` (Llama 3, linear, YaRN).
    Factor,
    /// Per-pair divisor `i` (GGUF's `rope_freqs.weight`, with its linear factor folded in).
    FreqFactor(usize),
    /// LongRoPE's `short_factor[i]`.
    ShortFactor(usize),
    /// LongRoPE's `long_factor[i]`.
    LongFactor(usize),
}

/// A derived inverse frequency that is not a finite positive number, and where it comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct BadRope {
    /// The parameter that makes it so.
    pub(crate) param: RopeParam,
    /// That parameter's value.
    pub(crate) value: f32,
    /// The rotation pair.
    pub(crate) pair: usize,
    /// The inverse frequency it gives.
    pub(crate) derived: f32,
}

impl BadRope {
    /// The problem in words, after the parameter's name: `1e-45 makes pair 0's inverse
    /// frequency inf; RoPE frequencies must be finite and positive`.
    pub(crate) fn describe(&self) -> String {
        format!(
            "{:e} makes pair {}'s RoPE inverse frequency {:e}; the frequencies it derives must be finite and \
             positive",
            self.value, self.pair, self.derived
        )
    }
}

/// Errors with the first inverse frequency (pair by pair, θ before the scaling) of a head whose
/// first `rotary_dim` dimensions RoPE rotates that is not finite and positive; the caller has
/// checked the scaling's own parameters ([`RopeScaling::validate`]).
///
/// θ's powers are monotonic in the pair, so a frequency that does not depend on a per-pair list
/// is finite and positive throughout when it is at the first and the last pair: only those two
/// and the pairs a list gives are computed (a config's head size is not yet checked here, and a
/// huge one must not make this loop run for ever).
pub(crate) fn check_rope_values(theta: f32, rotary_dim: usize, scaling: Option<&RopeScaling>) -> Result<(), BadRope> {
    let pairs = rotary_dim / 2;
    let listed = match scaling {
        Some(RopeScaling::FreqFactors { factors }) => factors.len(),
        Some(RopeScaling::LongRope { short_factor, long_factor, .. }) => short_factor.len().max(long_factor.len()),
        _ => 0,
    };
    let ends = [0, pairs.saturating_sub(1)].into_iter().filter(|&p| p < pairs);
    for pair in (0..listed.min(pairs)).chain(ends) {
        // As `Rope::new`, `yarn_inv_freq` and `longrope_inv_freq` compute it.
        let pos_freq = theta.powf((2 * pair) as f32 / rotary_dim as f32);
        let bad = |param, value, derived: f32| {
            (!(derived.is_finite() && derived > 0.0)).then_some(BadRope { param, value, pair, derived })
        };
        let plain = 1.0 / pos_freq;
        let scaled = scaling.and_then(|s| match s {
            RopeScaling::Llama3 { factor, .. } | RopeScaling::Linear { factor } => {
                bad(RopeParam::Factor, *factor, plain / factor)
            }
            RopeScaling::Yarn { factor, .. } => bad(RopeParam::Factor, *factor, 1.0 / (factor * pos_freq)),
            RopeScaling::FreqFactors { factors } => {
                factors.get(pair).and_then(|&f| bad(RopeParam::FreqFactor(pair), f, plain / f))
            }
            RopeScaling::LongRope { short_factor, long_factor, .. } => {
                let ext = |factors: &[f32], param: fn(usize) -> RopeParam| {
                    factors.get(pair).and_then(|&f| bad(param(pair), f, 1.0 / (f * pos_freq)))
                };
                ext(short_factor, RopeParam::ShortFactor).or_else(|| ext(long_factor, RopeParam::LongFactor))
            }
        });
        if let Some(b) = bad(RopeParam::Theta, theta, plain).or(scaled) {
            return Err(b);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yarn(factor: f32) -> RopeScaling {
        RopeScaling::Yarn {
            factor,
            beta_fast: 32.0,
            beta_slow: 1.0,
            original_max_position_embeddings: 4096,
            truncate: true,
            attention_factor: 1.0,
        }
    }

    /// A head size no model has (from a hostile config, before its shapes are checked) is
    /// checked at once, not pair by pair (the fuzzer's `hidden_size` 2^63 hung here).
    #[test]
    fn a_huge_head_is_checked_at_its_ends() {
        let t = std::time::Instant::now();
        assert!(check_rope_values(1e4, usize::MAX, None).is_ok());
        assert!(check_rope_values(1e4, usize::MAX, Some(&yarn(1e-45))).is_err());
        assert!(t.elapsed().as_secs() < 1, "{:?}", t.elapsed());
    }

    #[test]
    fn real_configurations_pass() {
        assert_eq!(check_rope_values(10000.0, 64, None), Ok(()));
        assert_eq!(check_rope_values(150000.0, 64, Some(&yarn(32.0))), Ok(()));
        let longrope = RopeScaling::LongRope {
            short_factor: vec![1.0; 48],
            long_factor: vec![60.0; 48],
            original_max_position_embeddings: 4096,
            attention_factor: 1.19,
        };
        assert_eq!(check_rope_values(10000.0, 96, Some(&longrope)), Ok(()));
    }

    #[test]
    fn a_factor_that_overflows_a_frequency_is_named() {
        let e = check_rope_values(10000.0, 64, Some(&yarn(1e-45))).expect_err("overflows");
        assert_eq!((e.param, e.pair, e.derived), (RopeParam::Factor, 0, f32::INFINITY));
        assert!(e.describe().starts_with("1e-45 makes pair 0's RoPE inverse frequency inf"), "{}", e.describe());
        let mut short = vec![1.0; 32];
        short[3] = 1e-44;
        let longrope = RopeScaling::LongRope {
            short_factor: short,
            long_factor: vec![1.0; 32],
            original_max_position_embeddings: 4096,
            attention_factor: 1.0,
        };
        let e = check_rope_values(10000.0, 64, Some(&longrope)).expect_err("overflows");
        assert_eq!((e.param, e.pair), (RopeParam::ShortFactor(3), 3));
    }

    #[test]
    fn a_theta_whose_frequencies_leave_f32_is_named() {
        let e = check_rope_values(1e-45, 64, None).expect_err("overflows");
        assert_eq!(e.param, RopeParam::Theta);
        let e = check_rope_values(1e30, 64, Some(&RopeScaling::Linear { factor: 3e38 })).expect_err("underflows");
        assert_eq!((e.param, e.derived), (RopeParam::Factor, 0.0));
    }
}
