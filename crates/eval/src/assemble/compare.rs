//! `qdrift compare`'s numbers: two variants of paired reports (the same reference, prompts and
//! seed: [`qdrift_report::check_paired`]) compared prompt by prompt.
//!
//! For each horizon and each metric both variants have per-prompt values of
//! ([`qdrift_report::PerPrompt`]), the prompts are resampled together (the paired bootstrap:
//! one set of indices per resample, applied to both), and each resample's `B − A` and B's
//! advantage are the metric's statistic of B's values minus A's. The sign test counts the
//! prompts on which B's own statistic is closer to the reference than A's. Prompts are the unit
//! of resampling, as everywhere in qdrift.

use qdrift_report::{
    Closer, CompareCheck, ComparedHorizon, ComparedMetric, ComparedSide, Comparison, Estimate, METRICS, MaxWorse,
    Metric, PerPrompt, Report, SignTestResult, advantage, check_paired, pick_variant,
};
use qdrift_score::{bootstrap_ci, sign_test};

use crate::assemble::aggregate::LEVEL;
use crate::error::EvalError;

/// One side of a comparison: a report, how to name it, and which of its variants (`None`: its
/// only quantized one).
pub struct CompareInput<'a> {
    /// The report.
    pub report: &'a Report,
    /// Its name in the comparison (folder and file name).
    pub name: String,
    /// The variant.
    pub variant: Option<&'a str>,
}

/// Compares B with A (see the module docs); `checks` are the `--max-worse` checks.
///
/// # Errors
/// [`EvalError::Compare`] when the reports are not paired (naming the field), a variant is
/// missing or has no per-prompt values, or a check names a horizon the reports do not have;
/// [`EvalError::Score`] from the bootstrap.
pub fn compare(a: CompareInput<'_>, b: CompareInput<'_>, checks: &[MaxWorse]) -> Result<Comparison, EvalError> {
    check_paired(a.report, b.report).map_err(EvalError::Compare)?;
    let va = pick_variant(a.report, a.variant, "A").map_err(EvalError::Compare)?;
    let vb = pick_variant(b.report, b.variant, "B").map_err(EvalError::Compare)?;
    let w = &a.report.workload;
    let (resamples, seed) = (w.bootstrap_resamples.max(1), w.seed);
    let mut horizons = Vec::with_capacity(w.horizons.len());
    for (ha, hb) in va.horizons.iter().zip(&vb.horizons) {
        let mut metrics = Vec::new();
        for m in METRICS {
            let (Some(statistic), Some(xa), Some(xb)) = (m.per_prompt, ha.per_prompt(m.name), hb.per_prompt(m.name))
            else {
                continue;
            };
            metrics.push(compare_metric(m, statistic, ha.tokens, (xa, xb), (resamples, seed))?);
        }
        if metrics.is_empty() {
            let which = if ha.per_prompt_values().next().is_none() { &va.name } else { &vb.name };
            return Err(EvalError::Compare(format!(
                "variant {which} has no per-prompt values at horizon {} (its report was written by a qdrift before \
                 they were added): evaluate it again",
                ha.tokens
            )));
        }
        horizons.push(ComparedHorizon { tokens: ha.tokens, metrics });
    }
    let mut results = Vec::with_capacity(checks.len());
    for check in checks {
        let h = horizons.iter().find(|h| h.tokens == check.tokens).ok_or_else(|| {
            EvalError::Compare(format!("--max-worse {}: the reports have horizons {:?}", check.name(), w.horizons))
        })?;
        let m = h.metrics.iter().find(|m| m.name == check.metric.name).ok_or_else(|| {
            EvalError::Compare(format!(
                "--max-worse {}: the variants do not both have it at that horizon",
                check.name()
            ))
        })?;
        let worse = Estimate::new(-m.b_advantage.mean, [-m.b_advantage.ci95[1], -m.b_advantage.ci95[0]]);
        results.push(CompareCheck {
            check: check.name(),
            max_worse: check.max_worse,
            verdict: check.verdict(&worse),
            worse,
        });
    }
    Ok(Comparison {
        format: qdrift_report::COMPARISON_FORMAT.into(),
        version: qdrift_report::COMPARISON_VERSION,
        a: side(&a.name, va),
        b: side(&b.name, vb),
        model: crate::inputs::identity::report_name(std::path::Path::new(&a.report.model.path)),
        model_sha256: a.report.model.sha256.clone(),
        prompts: w.prompts,
        seed,
        bootstrap_resamples: resamples,
        horizons,
        checks: results,
    })
}

fn side(report: &str, v: &qdrift_report::Variant) -> ComparedSide {
    ComparedSide { report: report.to_string(), variant: v.name.clone(), bits_per_weight: v.bits_per_weight }
}

/// One metric at horizon `h` from both variants' per-prompt values `(A, B)`.
fn compare_metric(
    m: &Metric,
    statistic: PerPrompt,
    h: usize,
    (xa, xb): (&[f64], &[f64]),
    (resamples, seed): (usize, u64),
) -> Result<ComparedMetric, EvalError> {
    let n = xa.len();
    if xb.len() != n {
        return Err(EvalError::Compare(format!("{}: {n} prompts in A, {} in B", m.name, xb.len())));
    }
    let of =
        |x: &[f64], idx: &[usize]| statistic.estimate(idx.iter().map(|&i| x[i]).sum::<f64>() / idx.len() as f64, h);
    let all: Vec<usize> = (0..n).collect();
    let (a, b) = (of(xa, &all), of(xb, &all));
    let interval = |f: &dyn Fn(f64, f64) -> f64| -> Result<Estimate, EvalError> {
        let i = bootstrap_ci(n, resamples, seed, LEVEL, |idx| f(of(xa, idx), of(xb, idx)))?;
        Ok(Estimate::new(i.estimate, [i.lo.min(i.estimate), i.hi.max(i.estimate)]))
    };
    let difference = interval(&|a, b| b - a)?;
    let b_advantage = interval(&|a, b| advantage(m.better, a, b))?;
    // Each prompt's own statistic, A's against B's.
    let per_prompt: Vec<f64> =
        (0..n).map(|i| advantage(m.better, statistic.estimate(xa[i], h), statistic.estimate(xb[i], h))).collect();
    let s = sign_test(&per_prompt)?;
    Ok(ComparedMetric {
        name: m.name.to_string(),
        a,
        b,
        difference,
        closer: Closer::of(&b_advantage),
        b_advantage,
        sign_test: SignTestResult { b_closer: s.positive, a_closer: s.negative, ties: s.ties, p_value: s.p_value },
    })
}
