//! Per-prompt traces → the statistics of `report.json`.
//!
//! Everything here is host arithmetic in f64 on [`Trace`]s; prompts are the unit of every
//! interval (bootstrap over prompts, Wilson over prompts), never tokens.

use qdrift_report::{Distribution, EntropyStratum, Estimate, FirstDivergence, HorizonMetrics, PerPosition};
use qdrift_score::{
    Divergence, Interval, PositionMetrics, PromptLogProbs, TOP_K, bootstrap_ci, bootstrap_mean_ci, entropy_quartiles,
    expected_tokens, first_divergence, greedy_speculative_steps, kaplan_meier, median_survival, paired_difference_ci,
    pooled_quantile_ci, ppl_ratio_ci, quantile, summarize, wilson_interval,
};

use crate::error::EvalError;
pub use crate::trace::{RoutingTrace, Trace};

/// The greedy speculative-decoding metrics and their draft lengths.
const SPECULATIVE: [(&str, usize); 4] = [
    ("spec_tokens_per_step_g1", 1),
    ("spec_tokens_per_step_g2", 2),
    ("spec_tokens_per_step_g4", 4),
    ("spec_tokens_per_step_g8", 8),
];

/// The speculative-sampling metrics (temperature 1) and their draft lengths.
const SPECULATIVE_SAMPLING: [(&str, usize); 4] = [
    ("spec_sampling_tokens_per_step_g1", 1),
    ("spec_sampling_tokens_per_step_g2", 2),
    ("spec_sampling_tokens_per_step_g4", 4),
    ("spec_sampling_tokens_per_step_g8", 8),
];

/// The top-K overlap metrics and their K (K = 1 is `top1_agreement`).
const TOP_K_OVERLAP: [(&str, usize); 4] =
    [("top_k_overlap_k2", 2), ("top_k_overlap_k3", 3), ("top_k_overlap_k4", 4), ("top_k_overlap_k5", 5)];

/// Confidence level of every interval.
pub const LEVEL: f64 = 0.95;

/// The estimate and its interval, widened to contain the estimate: a percentile-bootstrap
/// interval can miss its own point estimate (with very few resamples, or a skewed ratio), and a
/// report whose mean lies outside its interval is one the gate refuses as no run's.
fn estimate(i: Interval) -> Estimate {
    Estimate::new(i.estimate, [i.lo.min(i.estimate), i.hi.max(i.estimate)])
}

/// How every bootstrap interval of a report is drawn.
#[derive(Clone, Copy, Debug)]
pub struct Bootstrap {
    /// Resamples per interval.
    pub resamples: usize,
    /// Seed of every resampling (the same seed for every metric, so that all intervals of a
    /// report resample the same prompt sets).
    pub seed: u64,
}

impl Bootstrap {
    /// The mean of per-prompt `values` with its percentile interval.
    pub(crate) fn mean(&self, values: &[f64]) -> Result<Estimate, EvalError> {
        Ok(estimate(bootstrap_mean_ci(values, self.resamples, self.seed, LEVEL)?))
    }

    /// Sets metric `name` of `m` to the mean of per-prompt `values` with its interval, and keeps
    /// the values (`report.json`'s `per_prompt`).
    pub(crate) fn set_mean(&self, m: &mut HorizonMetrics, name: &str, values: Vec<f64>) -> Result<(), EvalError> {
        m.set(name, self.mean(&values)?)?;
        m.set_per_prompt(name, values)?;
        Ok(())
    }

    /// The type-7 median of per-prompt `values` with its percentile interval (prompts resampled).
    fn median(&self, values: &[f64]) -> Result<Estimate, EvalError> {
        let median = |idx: &[usize]| {
            let drawn: Vec<f64> = idx.iter().map(|&i| values[i]).collect();
            quantile(&drawn, 0.5).unwrap_or(f64::NAN)
        };
        Ok(estimate(bootstrap_ci(values.len(), self.resamples, self.seed, LEVEL, median)?))
    }

    /// The type-7 quantile `q` of per-position values pooled over prompts, with its interval
    /// (prompts resampled, each with all its positions).
    ///
    /// # Shapes
    /// `positions: [prompts][positions]`.
    fn pooled_quantile(&self, positions: &[Vec<f64>], q: f64) -> Result<Estimate, EvalError> {
        let slices: Vec<&[f64]> = positions.iter().map(Vec::as_slice).collect();
        Ok(estimate(pooled_quantile_ci(&slices, q, self.resamples, self.seed, LEVEL)?))
    }

    /// Tokens per verification step pooled over prompts, `Σ h / Σ steps`, each prompt `h`
    /// positions in `steps[p]` steps, with its interval (prompts resampled).
    fn tokens_per_step(&self, h: usize, steps: &[usize]) -> Result<Estimate, EvalError> {
        let pooled = |idx: &[usize]| (idx.len() * h) as f64 / idx.iter().map(|&i| steps[i]).sum::<usize>() as f64;
        Ok(estimate(bootstrap_ci(steps.len(), self.resamples, self.seed, LEVEL, pooled)?))
    }

    /// The mean of the paired differences `variant − noise_floor`, per prompt, with its interval.
    fn paired_difference(&self, variant: &[f64], noise_floor: &[f64]) -> Result<Estimate, EvalError> {
        Ok(estimate(paired_difference_ci(variant, noise_floor, self.resamples, self.seed, LEVEL)?))
    }

    /// The pooled perplexity ratio `PPL_var / PPL_ref` of per-prompt log-probabilities, with its
    /// interval.
    fn ppl_ratio(&self, prompts: &[PromptLogProbs]) -> Result<Estimate, EvalError> {
        Ok(estimate(ppl_ratio_ci(prompts, self.resamples, self.seed, LEVEL)?))
    }
}

/// The metrics of one variant at every horizon, one entry per metric of
/// [`qdrift_report::METRICS`], set by name. `noise_floor`: the noise floor's traces for the same
/// prompts (`None` for the noise floor itself, which has no excess over itself).
///
/// # Shapes
/// `traces: [prompts]`, each with `max(horizons)` positions; `noise_floor` likewise.
pub fn horizon_metrics(
    traces: &[Trace],
    noise_floor: Option<&[Trace]>,
    horizons: &[usize],
    bootstrap: Bootstrap,
) -> Result<Vec<HorizonMetrics>, EvalError> {
    horizons.iter().map(|&h| at_horizon(traces, noise_floor, h, bootstrap)).collect()
}

/// `f` of every prompt's trace.
fn per_prompt(traces: &[Trace], f: impl Fn(&Trace) -> f64) -> Vec<f64> {
    traces.iter().map(f).collect()
}

/// Every metric over the first `h` positions.
fn at_horizon(
    traces: &[Trace],
    noise_floor: Option<&[Trace]>,
    h: usize,
    bootstrap: Bootstrap,
) -> Result<HorizonMetrics, EvalError> {
    let token_match = per_prompt(traces, |t| t.token_match_rate(h));
    let kld = per_prompt(traces, |t| t.mean_kld(h));
    let on_reference_text: Vec<PromptLogProbs> = traces.iter().map(|t| t.ppl_on_reference_text(h)).collect();
    let generated_text: Vec<PromptLogProbs> = traces.iter().map(|t| t.ppl_of_generated_text(h)).collect();
    let mut m = HorizonMetrics::new(h);
    bootstrap.set_mean(&mut m, "token_match_rate", token_match.clone())?;
    let exact = per_prompt(traces, |t| f64::from(u8::from(t.ref_tokens[..h] == t.var_tokens[..h])));
    set_share(&mut m, "exact_match_fraction", exact)?;
    m.set("kld", Estimate { distribution: Some(distribution(traces, h, Trace::kld_at)?), ..bootstrap.mean(&kld)? })?;
    m.set_per_prompt("kld", kld.clone())?;
    let positions: Vec<Vec<f64>> = traces.iter().map(|t| (0..h).map(|i| t.kld_at(i)).collect()).collect();
    for (name, q) in [("kld_median", 0.5), ("kld_p90", 0.9), ("kld_p99", 0.99)] {
        m.set(name, bootstrap.pooled_quantile(&positions, q)?)?;
    }
    bootstrap.set_mean(&mut m, "top1_agreement", per_prompt(traces, |t| t.top1_agreement(h)))?;
    bootstrap.set_mean(&mut m, "rms_delta_p", per_prompt(traces, |t| t.rms_delta_p(h)))?;
    for (name, prompts) in
        [("ppl_ratio_on_reference_text", &on_reference_text), ("ppl_drift_of_generated_text", &generated_text)]
    {
        m.set(name, bootstrap.ppl_ratio(prompts)?)?;
        // The pooled ratio is exp of the mean over prompts of (Σ ln p_ref − Σ ln p_var) / h.
        m.set_per_prompt(name, prompts.iter().map(|p| (p.sum_ref - p.sum_var) / h as f64).collect())?;
    }
    for (name, gamma) in SPECULATIVE {
        let steps =
            traces.iter().map(|t| greedy_speculative_steps(&t.top1, gamma, h)).collect::<Result<Vec<_>, _>>()?;
        m.set(name, bootstrap.tokens_per_step(h, &steps)?)?;
        m.set_per_prompt(name, steps.iter().map(|&s| s as f64).collect())?;
    }
    let kld_reverse = per_prompt(traces, |t| t.mean_kld_reverse(h));
    let distribution = distribution(traces, h, Trace::kld_reverse_at)?;
    m.set("kld_reverse", Estimate { distribution: Some(distribution), ..bootstrap.mean(&kld_reverse)? })?;
    m.set_per_prompt("kld_reverse", kld_reverse)?;
    let positions: Vec<Vec<f64>> = traces.iter().map(|t| (0..h).map(|i| t.kld_reverse_at(i)).collect()).collect();
    for (name, q) in [("kld_reverse_median", 0.5), ("kld_reverse_p90", 0.9), ("kld_reverse_p99", 0.99)] {
        m.set(name, bootstrap.pooled_quantile(&positions, q)?)?;
    }
    for (name, k) in TOP_K_OVERLAP {
        // Absent when the compact reference kept fewer than k tokens.
        if let Some(overlap) = traces.iter().map(|t| t.top_k_overlap(h, k)).collect::<Option<Vec<f64>>>() {
            bootstrap.set_mean(&mut m, name, overlap)?;
        }
    }
    bootstrap.set_mean(&mut m, "ref_top1_in_var_top_k", per_prompt(traces, |t| t.ref_top1_in_top(h, TOP_K)))?;
    let alphas = per_prompt(traces, |t| t.mean_acceptance(h));
    let acceptance = bootstrap.mean(&alphas)?;
    m.set("spec_acceptance", acceptance)?;
    m.set_per_prompt("spec_acceptance", alphas.clone())?;
    for (name, gamma) in SPECULATIVE_SAMPLING {
        // (1 − α^(γ+1)) / (1 − α) increases with α: the interval of α maps to its interval.
        let [lo, hi] = acceptance.ci95.map(|a| expected_tokens(a.clamp(0.0, 1.0), gamma));
        m.set(name, Estimate::new(expected_tokens(acceptance.mean.clamp(0.0, 1.0), gamma)?, [lo?, hi?]))?;
        m.set_per_prompt(name, alphas.clone())?;
    }
    if let Some(floor) = noise_floor {
        let floor_token_match = per_prompt(floor, |t| t.token_match_rate(h));
        let floor_kld = per_prompt(floor, |t| t.mean_kld(h));
        m.set("excess_token_match_rate", bootstrap.paired_difference(&token_match, &floor_token_match)?)?;
        m.set("excess_kld", bootstrap.paired_difference(&kld, &floor_kld)?)?;
    }
    Ok(m)
}

/// The stopping metrics at every horizon of `metrics`: where each model first emits `eos` in
/// its own free-running text (generation does not stop there). `stop_length_ratio` is absent at a
/// horizon where the reference never stops.
///
/// # Shapes
/// `traces: [prompts]`, each with `max(horizons)` positions.
pub fn set_stopping_metrics(
    metrics: &mut [HorizonMetrics],
    traces: &[Trace],
    eos: u32,
    bootstrap: Bootstrap,
) -> Result<(), EvalError> {
    for m in metrics {
        let h = m.tokens;
        let first = |tokens: &[u32]| tokens[..h].iter().position(|&t| t == eos);
        let stops: Vec<(Option<usize>, Option<usize>)> =
            traces.iter().map(|t| (first(&t.ref_tokens), first(&t.var_tokens))).collect();
        let agree: Vec<f64> = stops.iter().map(|(r, v)| f64::from(u8::from(r == v))).collect();
        let missed: Vec<f64> = stops.iter().map(|(r, v)| f64::from(u8::from(r.is_some() && v.is_none()))).collect();
        set_share(m, "stop_agreement", agree)?;
        set_share(m, "stop_missed", missed)?;
        // Lengths up to and including the first EOS; a variant that does not stop within `h`
        // is at least `h + 1` tokens long.
        let ratios: Vec<f64> =
            stops.iter().filter_map(|&(r, v)| r.map(|r| (v.unwrap_or(h) + 1) as f64 / (r + 1) as f64)).collect();
        if !ratios.is_empty() {
            m.set("stop_length_ratio", bootstrap.median(&ratios)?)?;
        }
    }
    Ok(())
}

/// `k` of `n` prompts as a share, with its Wilson interval.
fn share(k: usize, n: usize) -> Result<Estimate, EvalError> {
    let wilson = wilson_interval(k, n, LEVEL)?;
    Ok(Estimate::new(k as f64 / n as f64, [wilson.lo, wilson.hi]))
}

/// Sets metric `name` of `m` to the share of prompts whose value in `values` (0 or 1, one per
/// prompt) is 1, with its Wilson interval, and keeps the values (`report.json`'s `per_prompt`).
fn set_share(m: &mut HorizonMetrics, name: &str, values: Vec<f64>) -> Result<(), EvalError> {
    m.set(name, share(values.iter().filter(|&&x| x == 1.0).count(), values.len())?)?;
    m.set_per_prompt(name, values)?;
    Ok(())
}

/// Quantiles of a per-position value over every position `< h` of every prompt, pooled.
fn distribution(traces: &[Trace], h: usize, at: fn(&Trace, usize) -> f64) -> Result<Distribution, EvalError> {
    let pooled: Vec<f64> = traces.iter().flat_map(|t| (0..h).map(move |i| at(t, i))).collect();
    let s = summarize(&pooled)?;
    Ok(Distribution { median: s.median, p90: s.p90, p99: s.p99, max: s.max })
}

/// First-divergence positions over the whole run and their Kaplan–Meier curve.
pub fn first_divergence_summary(traces: &[Trace], horizon: usize) -> Result<FirstDivergence, EvalError> {
    let divergences =
        traces.iter().map(|t| first_divergence(&t.ref_tokens, &t.var_tokens, horizon)).collect::<Result<_, _>>()?;
    survival_summary(divergences)
}

/// First-divergence positions, one per prompt, and their Kaplan–Meier curve.
pub(crate) fn survival_summary(divergences: Vec<Divergence>) -> Result<FirstDivergence, EvalError> {
    let positions: Vec<usize> = divergences.iter().map(|d| d.position).collect();
    let observations: Vec<_> = divergences.iter().map(|d| d.observation()).collect();
    // Kaplan–Meier over "tokens still identical": S(t) is the share of prompts whose first t
    // tokens all match (a divergence at 0-based position p is an event at t = p + 1).
    let steps = kaplan_meier(&observations)?;
    let survival = steps.iter().map(|s| (s.t, s.survival)).collect();
    Ok(FirstDivergence {
        // The median first-divergence position: the event time where S first drops to ≤ 0.5,
        // as a 0-based position.
        median: median_survival(&steps).map(|t| t.saturating_sub(1)),
        survival,
        censored: observations.iter().filter(|o| o.censored).count(),
        positions,
    })
}

/// Means over prompts at every position.
pub fn per_position(traces: &[Trace], horizon: usize) -> PerPosition {
    let n = traces.len().max(1) as f64;
    let mean = |f: &dyn Fn(&Trace, usize) -> f64| -> Vec<f64> {
        (0..horizon).map(|t| traces.iter().map(|tr| f(tr, t)).sum::<f64>() / n).collect()
    };
    PerPosition {
        token_match: mean(&|tr, t| f64::from(u8::from(tr.ref_tokens[t] == tr.var_tokens[t]))),
        kld: mean(&|tr, t| tr.kld_at(t)),
        top1_agreement: mean(&|tr, t| f64::from(u8::from(tr.top1[t]))),
    }
}

/// KLD and top-1 agreement by quartile of the reference's entropy, over every position.
pub fn entropy_strata(traces: &[Trace], horizon: usize) -> Result<Vec<EntropyStratum>, EvalError> {
    let positions: Vec<PositionMetrics> = traces
        .iter()
        .flat_map(|tr| {
            (0..horizon).map(move |t| {
                let (lr, lv) = (f64::from(tr.logp_ref[t]), f64::from(tr.logp_var[t]));
                PositionMetrics {
                    kld: tr.kld_at(t),
                    top1_agree: tr.top1[t],
                    p_ref_token_ref: lr.exp(),
                    p_var_of_ref_token: lv.exp(),
                    delta_p: lv.exp() - lr.exp(),
                    ref_entropy: f64::from(tr.ref_entropy[t]).max(0.0),
                    logp_ref_of_token: lr,
                    logp_var_of_token: lv,
                }
            })
        })
        .collect();
    Ok(entropy_quartiles(&positions)?
        .iter()
        .map(|s| EntropyStratum {
            entropy_lo: s.lower,
            entropy_hi: s.upper,
            positions: s.count,
            kld_mean: s.mean_kld,
            top1_agreement: s.top1_agreement,
        })
        .collect())
}

/// The reference's pooled perplexity of its own continuations over their first `h` tokens.
pub fn self_perplexity(traces: &[Trace], h: usize) -> f64 {
    let (sum, n): (f64, usize) = traces.iter().fold((0.0, 0), |(s, n), t| (s + Trace::sum(&t.logp_ref, h), n + h));
    (-sum / n.max(1) as f64).exp()
}

#[cfg(test)]
mod tests {
    use qdrift_score::TopKAgreement;

    use super::*;

    fn trace(ref_tokens: &[u32], var_tokens: &[u32], kld: f32) -> Trace {
        let mut t = Trace::new(ref_tokens.to_vec(), var_tokens.to_vec());
        let h = ref_tokens.len();
        t.kld = vec![kld; h];
        t.top1 = ref_tokens.iter().zip(var_tokens).map(|(a, b)| a == b).collect();
        t.logp_ref = vec![-1.0; h];
        t.logp_var = vec![-1.5; h];
        t.logp_ref_on_var_text = vec![-2.0; h];
        t.ref_entropy = (0..h).map(|i| i as f32).collect();
        t
    }

    const BOOTSTRAP: Bootstrap = Bootstrap { resamples: 500, seed: 7 };

    /// The mean of metric `name`.
    fn mean(h: &HorizonMetrics, name: &str) -> f64 {
        h.metric(name).unwrap_or_else(|| panic!("no {name}")).mean
    }

    /// Stopping by hand, EOS = 0: a stops at 1 (variant at 3), b at 2 (variant never), c never
    /// (neither does its variant), d both at 0.
    #[test]
    fn stopping_metrics_by_hand() {
        let traces = [
            trace(&[5, 0, 5, 5], &[5, 5, 5, 0], 0.0),
            trace(&[5, 5, 0, 5], &[5, 5, 5, 5], 0.0),
            trace(&[5, 5, 5, 5], &[6, 6, 6, 6], 0.0),
            trace(&[0, 5, 5, 5], &[0, 6, 6, 6], 0.0),
        ];
        let mut m = horizon_metrics(&traces, None, &[2, 4], BOOTSTRAP).unwrap();
        set_stopping_metrics(&mut m, &traces, 0, BOOTSTRAP).unwrap();
        // h = 2: a's variant has not stopped (missed); b, c, d alike. Length ratios over a and
        // d: (2 + 1) / (1 + 1) = 1.5 (the variant counted at h + 1) and 1 / 1.
        assert_eq!(mean(&m[0], "stop_agreement"), 0.75);
        assert_eq!(mean(&m[0], "stop_missed"), 0.25);
        assert_eq!(mean(&m[0], "stop_length_ratio"), 1.25);
        // h = 4: c and d alike; b missed; ratios a 4/2, b 5/3, d 1: median 5/3.
        assert_eq!(mean(&m[1], "stop_agreement"), 0.5);
        assert_eq!(mean(&m[1], "stop_missed"), 0.25);
        assert!((mean(&m[1], "stop_length_ratio") - 5.0 / 3.0).abs() < 1e-15);
        let w = m[1].metric("stop_missed").unwrap().ci95;
        let wilson = wilson_interval(1, 4, LEVEL).unwrap();
        assert_eq!(w, [wilson.lo, wilson.hi]);
        // A run where the reference never stops has no length ratio.
        let never = [trace(&[5, 5], &[0, 5], 0.0)];
        let mut m = horizon_metrics(&never, None, &[2], BOOTSTRAP).unwrap();
        set_stopping_metrics(&mut m, &never, 0, BOOTSTRAP).unwrap();
        assert!(m[0].metric("stop_length_ratio").is_none());
        assert_eq!(mean(&m[0], "stop_agreement"), 0.0);
    }

    /// Reverse KL, acceptance and top-K agreement by hand; the sampling tokens per step from α;
    /// overlaps absent where a compact reference kept too few tokens; every per-prompt metric's
    /// values give its estimate.
    #[test]
    fn agreement_and_acceptance_by_hand() {
        let mut a = trace(&[1, 2], &[1, 2], 0.0);
        let mut b = trace(&[1, 2], &[1, 2], 0.0);
        (a.kld_reverse, b.kld_reverse) = (vec![0.2, 0.4], vec![0.0, -1e-7]);
        (a.accept, b.accept) = (vec![0.5, 0.7], vec![1.0000001, 0.9]);
        let agree = |shared, rank| TopKAgreement { shared, ref_top1_rank: rank };
        a.top_k = vec![agree([1, 2, 3, 3, 4], 0), agree([0, 1, 2, 3, 4], 1)];
        b.top_k = vec![agree([1, 2, 3, 4, 5], 0), agree([0, 2, 2, 3, 3], 5)];
        let m = horizon_metrics(&[a.clone(), b.clone()], None, &[2], BOOTSTRAP).unwrap();
        // Reverse KL: prompt means 0.3 and 0 (rounding below 0 counts as 0).
        assert!((mean(&m[0], "kld_reverse") - 0.15).abs() < 1e-7);
        // α: prompt means 0.6 and 0.95 (each position clamped to [0, 1]).
        let alpha = (0.6 + 0.95) / 2.0;
        assert!((mean(&m[0], "spec_acceptance") - alpha).abs() < 1e-7);
        let tokens = (1.0 - alpha.powi(5)) / (1.0 - alpha);
        assert!((mean(&m[0], "spec_sampling_tokens_per_step_g4") - tokens).abs() < 1e-6);
        // Top-3 overlap: a (1 + 2/3) / 2, b (1 + 2/3) / 2.
        assert!((mean(&m[0], "top_k_overlap_k3") - 5.0 / 6.0).abs() < 1e-12);
        // Top-5 overlap: a (4/5 + 4/5) / 2, b (1 + 3/5) / 2.
        assert!((mean(&m[0], "top_k_overlap_k5") - 0.8).abs() < 1e-12);
        // Reference's top-1 in the variant's top 5: a 2 of 2, b 1 of 2.
        assert_eq!(mean(&m[0], "ref_top1_in_var_top_k"), 0.75);
        for (name, values) in m[0].per_prompt_values() {
            let statistic = qdrift_report::PerPrompt::of(name).unwrap();
            let of_values = statistic.estimate(values.iter().sum::<f64>() / values.len() as f64, 2);
            assert!((of_values - mean(&m[0], name)).abs() < 1e-12, "{name}: {of_values} vs {}", mean(&m[0], name));
        }
        // A compact reference of 3 tokens: no overlap beyond K = 3.
        b.top_k[0].shared[3..].fill(qdrift_score::agreement::UNKNOWN);
        let m = horizon_metrics(&[a, b], None, &[2], BOOTSTRAP).unwrap();
        assert!(m[0].metric("top_k_overlap_k3").is_some() && m[0].metric("top_k_overlap_k4").is_none());
        assert!(m[0].per_prompt("top_k_overlap_k5").is_none());
    }

    #[test]
    fn hand_computed_metrics() {
        let a = trace(&[1, 2, 3, 4], &[1, 2, 9, 4], 0.5);
        let b = trace(&[1, 2, 3, 4], &[1, 2, 3, 4], 0.0);
        let m = horizon_metrics(&[a.clone(), b.clone()], None, &[2, 4], BOOTSTRAP).unwrap();
        // h=2: both prompts match fully.
        assert_eq!(mean(&m[0], "token_match_rate"), 1.0);
        assert_eq!(mean(&m[0], "exact_match_fraction"), 1.0);
        // h=4: prompt a matches 3/4, prompt b 4/4.
        assert_eq!(mean(&m[1], "token_match_rate"), 0.875);
        assert_eq!(mean(&m[1], "exact_match_fraction"), 0.5);
        assert_eq!(mean(&m[1], "kld"), 0.25);
        assert_eq!(m[1].metric("kld").and_then(|k| k.distribution).map(|d| d.max), Some(0.5));
        assert_eq!(mean(&m[1], "top1_agreement"), 0.875);
        // PPL_var/PPL_ref = exp(1.5 − 1) on reference text; PPL_ref(var)/PPL_ref(ref) = exp(2 − 1).
        assert!((mean(&m[1], "ppl_ratio_on_reference_text") - 0.5f64.exp()).abs() < 1e-12);
        assert!((mean(&m[1], "ppl_drift_of_generated_text") - 1f64.exp()).abs() < 1e-12);
        let dp = (-1.5f64).exp() - (-1f64).exp();
        assert!((mean(&m[1], "rms_delta_p") - dp.abs()).abs() < 1e-12);
        assert!(m[1].metric("excess_token_match_rate").is_none() && m[1].metric("excess_kld").is_none());
        // Greedy speculative decoding over top-1 agreement a = y y n y, b = y y y y (h = 4): γ = 1
        // takes a 3 steps and b 2, γ = 2 both 2, γ = 4 and 8 a 2 and b 1; 8 tokens in all.
        for (name, want) in [
            ("spec_tokens_per_step_g1", 8.0 / 5.0),
            ("spec_tokens_per_step_g2", 2.0),
            ("spec_tokens_per_step_g4", 8.0 / 3.0),
            ("spec_tokens_per_step_g8", 8.0 / 3.0),
        ] {
            assert!((mean(&m[1], name) - want).abs() < 1e-12, "{name}: {}", mean(&m[1], name));
        }
        let lo_hi = m[1].metric("token_match_rate").unwrap().ci95;
        assert!(lo_hi[0] >= 0.75 && lo_hi[1] <= 1.0 && lo_hi[0] <= 0.875 && 0.875 <= lo_hi[1], "{lo_hi:?}");

        let with_nf = horizon_metrics(&[a.clone(), b.clone()], Some(&[b.clone(), b.clone()]), &[4], BOOTSTRAP).unwrap();
        assert_eq!(mean(&with_nf[0], "excess_token_match_rate"), -0.125);
        assert_eq!(mean(&with_nf[0], "excess_kld"), 0.25);

        let fd = first_divergence_summary(&[a.clone(), b.clone()], 4).unwrap();
        assert_eq!(fd.positions, vec![2, 4]);
        assert_eq!(fd.censored, 1);
        assert_eq!(fd.survival, vec![(0, 1.0), (3, 0.5)]);
        assert_eq!(fd.median, Some(2));

        let pp = per_position(&[a, b], 4);
        assert_eq!(pp.token_match, vec![1.0, 1.0, 0.5, 1.0]);
        assert_eq!(pp.kld, vec![0.25; 4]);
    }

    #[test]
    fn an_interval_that_misses_its_estimate_is_widened_to_it() {
        let e = estimate(Interval { estimate: 0.5, lo: 0.6, hi: 0.7, level: 0.95 });
        assert_eq!((e.mean, e.ci95), (0.5, [0.5, 0.7]));
        let e = estimate(Interval { estimate: 0.8, lo: 0.6, hi: 0.7, level: 0.95 });
        assert_eq!(e.ci95, [0.6, 0.8]);
        let e = estimate(Interval { estimate: 0.65, lo: 0.6, hi: 0.7, level: 0.95 });
        assert_eq!(e.ci95, [0.6, 0.7]);
    }

    #[test]
    fn negative_rounding_of_kl_counts_as_zero() {
        let t = trace(&[1, 2], &[1, 2], -1e-9);
        assert_eq!(t.mean_kld(2), 0.0);
    }
}
