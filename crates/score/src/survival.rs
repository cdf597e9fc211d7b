//! Kaplan–Meier estimate of `S(t)`, the share of prompts whose variant output is still
//! identical to the reference's after `t` generated tokens.
//!
//! A prompt is an [`Observation`]: either the sequences were seen to part after `time` tokens
//! (an event), or they were still identical when generation stopped at `time` tokens
//! (censored: all we know is that the divergence, if any, comes later). Build observations with
//! [`crate::freerun::Divergence::observation`].

use serde::{Deserialize, Serialize};

use crate::error::{Result, check_nonempty};

/// One prompt's time to divergence, in generated tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observation {
    /// Tokens after which the divergence was seen, or (censored) after which none had been.
    pub time: usize,
    /// `true` when no divergence was seen up to `time`.
    pub censored: bool,
}

/// One step of the Kaplan–Meier curve: `S` drops to `survival` at `t` and stays there until the
/// next step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SurvivalStep {
    /// Tokens generated.
    pub t: usize,
    /// `S(t)`: estimated share of prompts still identical after `t` tokens.
    pub survival: f64,
    /// Prompts at risk just before `t` (not yet diverged, not censored before `t`).
    pub at_risk: usize,
    /// Prompts that diverged exactly at `t`.
    pub events: usize,
}

/// The Kaplan–Meier product-limit estimate `S(t) = Π_{t_i ≤ t} (1 − d_i / n_i)`.
///
/// Returns the step `t = 0, S = 1` followed by one step per distinct event time, ascending.
/// Ties follow the usual convention: a prompt censored at `t` is still at risk at `t` (the
/// censoring is taken to happen just after the events at `t`). Censoring at a time with no
/// event adds no step; after the last observation `S` stays at its last value (it is not
/// known to reach 0 when the longest observation is censored).
///
/// # Shapes
/// `observations: [prompts]`, in any order.
///
/// # Errors
/// [`crate::ScoreError::Empty`] when there are no observations.
pub fn kaplan_meier(observations: &[Observation]) -> Result<Vec<SurvivalStep>> {
    check_nonempty("survival observations", observations)?;
    let mut sorted = observations.to_vec();
    // Events before censorings at equal times, so each group below is contiguous.
    sorted.sort_by_key(|o| (o.time, o.censored));
    let mut steps = vec![SurvivalStep { t: 0, survival: 1.0, at_risk: sorted.len(), events: 0 }];
    let mut survival = 1.0;
    let mut at_risk = sorted.len();
    let mut i = 0;
    while i < sorted.len() {
        let t = sorted[i].time;
        let group = sorted[i..].iter().take_while(|o| o.time == t).count();
        let events = sorted[i..i + group].iter().filter(|o| !o.censored).count();
        if events > 0 {
            survival *= 1.0 - events as f64 / at_risk as f64;
            if t == 0 {
                // A divergence at time 0 cannot come from `Divergence::observation` (whose
                // event times are ≥ 1); fold it into the first step rather than repeat t = 0.
                steps[0] = SurvivalStep { t, survival, at_risk, events };
            } else {
                steps.push(SurvivalStep { t, survival, at_risk, events });
            }
        }
        at_risk -= group;
        i += group;
    }
    Ok(steps)
}

/// `S(t)` read off a curve from [`kaplan_meier`]: the survival of the last step at or before
/// `t` (1 before any step).
///
/// # Shapes
/// `steps`: ascending in `t`, as [`kaplan_meier`] returns them; an empty slice gives 1.
pub fn survival_at(steps: &[SurvivalStep], t: usize) -> f64 {
    steps.iter().take_while(|s| s.t <= t).last().map_or(1.0, |s| s.survival)
}

/// Median time to divergence: the smallest `t` with `S(t) ≤ 0.5`, or `None` when the curve never
/// gets there (more than half the prompts outlast every divergence seen).
///
/// # Shapes
/// `steps`: as [`survival_at`].
pub fn median_survival(steps: &[SurvivalStep]) -> Option<usize> {
    // A small tolerance so that an exact half computed as e.g. 0.5000000000000001 still counts.
    steps.iter().find(|s| s.survival <= 0.5 + 1e-12).map(|s| s.t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(time: usize, censored: bool) -> Observation {
        Observation { time, censored }
    }

    /// Freireich et al. (1963), 6-MP arm, remission weeks (+ = censored); the worked example of
    /// Kleinbaum & Klein, *Survival Analysis*, ch. 2:
    /// 6 6 6 6+ 7 9+ 10 10+ 11+ 13 16 17+ 19+ 20+ 22 23 25+ 32+ 32+ 34+ 35+.
    fn six_mp() -> Vec<Observation> {
        let events = [6, 6, 6, 7, 10, 13, 16, 22, 23];
        let censored = [6, 9, 10, 11, 17, 19, 20, 25, 32, 32, 34, 35];
        let mut v: Vec<_> = censored.iter().map(|&t| obs(t, true)).collect();
        v.extend(events.iter().map(|&t| obs(t, false)));
        // Mixed up on purpose: the estimator must not depend on input order.
        v.reverse();
        v.swap(0, 10);
        v
    }

    #[test]
    fn textbook_six_mp_curve() {
        let steps = kaplan_meier(&six_mp()).unwrap();
        // t  n_i d_i  S(t)
        // 6  21  3   18/21                 = 0.857142857
        // 7  17  1   · 16/17               = 0.806722689
        // 10 15  1   · 14/15               = 0.752941176
        // 13 12  1   · 11/12               = 0.690196078
        // 16 11  1   · 10/11               = 0.627450980
        // 22  7  1   · 6/7                 = 0.537815126
        // 23  6  1   · 5/6                 = 0.448179272
        let expected = [
            (0, 21, 0, 1.0),
            (6, 21, 3, 18.0 / 21.0),
            (7, 17, 1, 0.806_722_689),
            (10, 15, 1, 0.752_941_176),
            (13, 12, 1, 0.690_196_078),
            (16, 11, 1, 0.627_450_980),
            (22, 7, 1, 0.537_815_126),
            (23, 6, 1, 0.448_179_272),
        ];
        assert_eq!(steps.len(), expected.len());
        for (s, (t, n, d, surv)) in steps.iter().zip(expected) {
            assert_eq!((s.t, s.at_risk, s.events), (t, n, d));
            assert!((s.survival - surv).abs() < 1e-9, "t={t}: {} vs {surv}", s.survival);
        }
        assert_eq!(median_survival(&steps), Some(23));
        assert_eq!(survival_at(&steps, 5), 1.0);
        assert!((survival_at(&steps, 12) - 0.752_941_176).abs() < 1e-9);
        assert!((survival_at(&steps, 1000) - 0.448_179_272).abs() < 1e-9);
    }

    #[test]
    fn all_diverge_reaches_zero_and_exact_half_is_the_median() {
        let steps = kaplan_meier(&[obs(1, false), obs(2, false), obs(3, false), obs(4, false)]).unwrap();
        let s: Vec<f64> = steps.iter().map(|s| s.survival).collect();
        assert_eq!(s, [1.0, 0.75, 0.5, 0.25, 0.0]);
        assert_eq!(median_survival(&steps), Some(2));
    }

    #[test]
    fn all_censored_stays_at_one_with_no_median() {
        let steps = kaplan_meier(&[obs(10, true), obs(10, true)]).unwrap();
        assert_eq!(steps, [SurvivalStep { t: 0, survival: 1.0, at_risk: 2, events: 0 }]);
        assert_eq!(median_survival(&steps), None);
        assert_eq!(survival_at(&steps, 10), 1.0);
    }

    #[test]
    fn censored_at_an_event_time_is_still_at_risk() {
        // Two prompts at t = 5: one diverges, one censored. Both at risk: S(5) = 1 − 1/3.
        let steps = kaplan_meier(&[obs(5, true), obs(5, false), obs(9, false)]).unwrap();
        assert_eq!(steps[1].at_risk, 3);
        assert!((steps[1].survival - 2.0 / 3.0).abs() < 1e-15);
        // Then only the t = 9 prompt is at risk, and it diverges.
        assert_eq!((steps[2].t, steps[2].at_risk, steps[2].survival), (9, 1, 0.0));
    }

    #[test]
    fn empty_is_an_error() {
        assert!(kaplan_meier(&[]).is_err());
    }
}
