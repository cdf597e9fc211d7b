//! `qdrift compare`: two variants of the same reference, prompts and seed, head to head.
//!
//! A [`Comparison`] holds, per horizon and per metric with per-prompt values
//! ([`PerPrompt`](crate::PerPrompt)), both variants' estimates, the paired difference `B − A`
//! and B's advantage (how much closer B is to the reference: `B − A` where higher is better,
//! `A − B` where lower is, `|A − 1| − |B − 1|` for a ratio whose ideal is 1), each with a paired
//! bootstrap interval over prompts, the sign test of the per-prompt advantages, and which
//! variant is closer when the interval says so. `qdrift_eval::compare` computes it; this module
//! defines it, checks that two reports are paired ([`check_paired`]), parses the gate's
//! `--max-worse` checks ([`MaxWorse`]) and renders it as Markdown and HTML from one document, as
//! the reports are.

use serde::{Deserialize, Serialize};

use crate::document::{Block, Column, Inline};
use crate::format::rate;
use crate::gate::Verdict;
use crate::metrics::{Better, Estimate, METRICS, Metric, metric};
use crate::{KlMethod, Report, Variant};

/// The `format` of `compare.json`.
pub const COMPARISON_FORMAT: &str = "qdrift-comparison";
/// The layout version of `compare.json`.
pub const COMPARISON_VERSION: u32 = 1;

/// Two variants compared prompt by prompt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// Always [`COMPARISON_FORMAT`].
    pub format: String,
    /// Always [`COMPARISON_VERSION`].
    pub version: u32,
    /// The baseline.
    pub a: ComparedSide,
    /// The candidate: "is B closer to the reference than A?".
    pub b: ComparedSide,
    /// The reference checkpoint's file name and SHA-256, as both reports give them.
    pub model: String,
    /// SHA-256 of the reference checkpoint.
    pub model_sha256: String,
    /// Prompts, paired one to one.
    pub prompts: usize,
    /// Seed of the bootstrap (the reports').
    pub seed: u64,
    /// Bootstrap resamples per interval.
    pub bootstrap_resamples: usize,
    /// One entry per horizon, ascending.
    pub horizons: Vec<ComparedHorizon>,
    /// The `--max-worse` checks, in the order given; empty when none was asked for.
    pub checks: Vec<CompareCheck>,
}

/// One of the two variants.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ComparedSide {
    /// The report's file name as given (without its folders).
    pub report: String,
    /// The variant's name in it.
    pub variant: String,
    /// Its bits per weight.
    pub bits_per_weight: f64,
}

/// The compared metrics of one horizon.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ComparedHorizon {
    /// The horizon `h`.
    pub tokens: usize,
    /// Every metric both variants have per-prompt values of, in [`METRICS`] order.
    pub metrics: Vec<ComparedMetric>,
}

/// One metric, both variants.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ComparedMetric {
    /// The metric's name.
    pub name: String,
    /// A's estimate.
    pub a: f64,
    /// B's estimate.
    pub b: f64,
    /// `B − A`, with its paired bootstrap interval.
    pub difference: Estimate,
    /// How much closer B is to the reference (> 0: B is), with its paired bootstrap interval.
    pub b_advantage: Estimate,
    /// The sign test of the per-prompt advantages.
    pub sign_test: SignTestResult,
    /// Which variant is closer: the one the whole interval of the advantage favours.
    pub closer: Closer,
}

/// The sign test of the per-prompt advantages (Dixon & Mood 1946).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SignTestResult {
    /// Prompts where B is closer.
    pub b_closer: usize,
    /// Prompts where A is closer.
    pub a_closer: usize,
    /// Prompts where they are equal.
    pub ties: usize,
    /// The two-sided p-value of "neither tends to be closer".
    pub p_value: f64,
}

/// Which variant a metric's interval favours.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Closer {
    /// The whole interval of B's advantage is above 0.
    B,
    /// The whole interval is below 0.
    A,
    /// The interval contains 0: no difference the prompts can show.
    Undetermined,
}

impl Closer {
    /// From the interval of B's advantage.
    pub fn of(advantage: &Estimate) -> Closer {
        if advantage.ci95[0] > 0.0 {
            Closer::B
        } else if advantage.ci95[1] < 0.0 {
            Closer::A
        } else {
            Closer::Undetermined
        }
    }

    fn words(self) -> &'static str {
        match self {
            Closer::B => "B",
            Closer::A => "A",
            Closer::Undetermined => "—",
        }
    }
}

/// "B is no worse than A by more than `max_worse`" on one metric at one horizon.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompareCheck {
    /// `METRIC@H`.
    pub check: String,
    /// The largest worsening allowed, in the metric's units.
    pub max_worse: f64,
    /// How much worse B is (`−advantage`), with its interval.
    pub worse: Estimate,
    /// Pass: the whole interval is at most `max_worse`; fail: the whole interval is above it;
    /// inconclusive: it straddles it.
    pub verdict: Verdict,
}

/// A parsed `--max-worse METRIC@H=X`.
#[derive(Clone, Debug)]
pub struct MaxWorse {
    /// The metric.
    pub metric: &'static Metric,
    /// The horizon.
    pub tokens: usize,
    /// The largest worsening allowed.
    pub max_worse: f64,
}

impl MaxWorse {
    /// Parses `METRIC@H=X`: a metric with per-prompt values, a horizon, a finite `X ≥ 0`.
    pub fn parse(text: &str) -> Result<MaxWorse, String> {
        let form = "write METRIC@HORIZON=X, e.g. kld@100=0.01";
        let (check, x) = text.split_once('=').ok_or_else(|| format!("--max-worse {text:?}: {form}"))?;
        let (name, h) = check.split_once('@').ok_or_else(|| format!("--max-worse {text:?}: {form}"))?;
        let pairable =
            || METRICS.iter().filter(|m| m.per_prompt.is_some()).map(|m| m.name).collect::<Vec<_>>().join(", ");
        let metric = metric(name.trim())
            .filter(|m| m.per_prompt.is_some())
            .ok_or_else(|| format!("--max-worse {text:?}: {name:?} is not a metric compare pairs ({})", pairable()))?;
        let tokens = h.trim().parse::<usize>().ok().filter(|&h| h > 0);
        let tokens =
            tokens.ok_or_else(|| format!("--max-worse {text:?}: the horizon {h:?} is not a positive integer"))?;
        let max_worse = x.trim().parse::<f64>().ok().filter(|x| x.is_finite() && *x >= 0.0);
        let max_worse = max_worse.ok_or_else(|| format!("--max-worse {text:?}: {x:?} is not a finite number ≥ 0"))?;
        Ok(MaxWorse { metric, tokens, max_worse })
    }

    /// `METRIC@H`.
    pub fn name(&self) -> String {
        format!("{}@{}", self.metric.name, self.tokens)
    }

    /// The verdict on B's worsening `worse` (its interval against `max_worse`).
    pub fn verdict(&self, worse: &Estimate) -> Verdict {
        if worse.ci95[1] <= self.max_worse {
            Verdict::Pass
        } else if worse.ci95[0] > self.max_worse {
            Verdict::Fail
        } else {
            Verdict::Inconclusive
        }
    }
}

impl Comparison {
    /// The verdict of the checks: fail if any failed, else inconclusive if any was, else pass
    /// (pass with no checks).
    pub fn verdict(&self) -> Verdict {
        let has = |v: Verdict| self.checks.iter().any(|c| c.verdict == v);
        if has(Verdict::Fail) {
            Verdict::Fail
        } else if has(Verdict::Inconclusive) {
            Verdict::Inconclusive
        } else {
            Verdict::Pass
        }
    }

    /// The process exit code of the checks, as the gate's: 0 pass, 1 fail, 3 inconclusive.
    pub fn exit_code(&self) -> u8 {
        match self.verdict() {
            Verdict::Pass => 0,
            Verdict::Fail => 1,
            Verdict::Inconclusive => crate::gate::INCONCLUSIVE_EXIT,
        }
    }

    /// How many metrics, over every horizon, each variant is closer on.
    fn tally(&self) -> (usize, usize, usize) {
        let all = self.horizons.iter().flat_map(|h| &h.metrics);
        let count = |c: Closer| all.clone().filter(|m| m.closer == c).count();
        (count(Closer::B), count(Closer::A), count(Closer::Undetermined))
    }

    /// The headline: which variant is closer to the reference on how many metrics.
    pub fn headline(&self) -> String {
        let (b, a, none) = self.tally();
        format!(
            "B ({}) is closer to the reference on {b} metric-horizons, A ({}) on {a}; {none} show no difference \
             these {} prompts can resolve.",
            self.b.variant, self.a.variant, self.prompts
        )
    }

    /// The comparison as Markdown.
    pub fn markdown(&self) -> String {
        crate::markdown::print(&self.document())
    }

    /// The comparison as one self-contained HTML page.
    pub fn html(&self) -> String {
        crate::html::page(&format!("qdrift compare: {} vs {}", self.a.variant, self.b.variant), &self.document())
    }

    /// Terminal lines: the headline, then each check.
    pub fn summary(&self) -> String {
        let mut out = format!("{}\n", self.headline());
        for c in &self.checks {
            out.push_str(&format!(
                "{} {}: B worse by {} [{}, {}], allowed {}\n",
                c.verdict.word(),
                c.check,
                fmt(c.worse.mean),
                fmt(c.worse.ci95[0]),
                fmt(c.worse.ci95[1]),
                fmt(c.max_worse)
            ));
        }
        out
    }

    fn document(&self) -> Vec<Block> {
        let text = |s: String| Inline::Text(s);
        let mut doc = vec![
            Block::Heading {
                level: 1,
                id: "compare".into(),
                text: format!("qdrift compare: {} vs {}", self.a.variant, self.b.variant),
            },
            Block::Paragraph(vec![
                Inline::Strong("A:".into()),
                text(" ".into()),
                Inline::Name(self.a.variant.clone()),
                text(format!(" ({} bits/weight) from ", rate(self.a.bits_per_weight))),
                Inline::Code(self.a.report.clone()),
                text(". ".into()),
                Inline::Strong("B:".into()),
                text(" ".into()),
                Inline::Name(self.b.variant.clone()),
                text(format!(" ({} bits/weight) from ", rate(self.b.bits_per_weight))),
                Inline::Code(self.b.report.clone()),
                text(format!(
                    ". Both against the reference {} (sha256 {}), on the same {} prompts, paired prompt by prompt; \
                     intervals are 95% paired bootstrap intervals over prompts ({} resamples, seed {}).",
                    self.model,
                    &self.model_sha256[..self.model_sha256.len().min(12)],
                    self.prompts,
                    self.bootstrap_resamples,
                    self.seed
                )),
            ]),
            Block::Paragraph(vec![Inline::Strong(self.headline())]),
        ];
        if !self.checks.is_empty() {
            doc.push(Block::Heading {
                level: 2,
                id: "checks".into(),
                text: format!("Verdict: {}", self.verdict().word()),
            });
            let columns = ["Check", "B worse by", "95% interval", "Allowed", "Verdict"];
            let rows = self
                .checks
                .iter()
                .map(|c| {
                    vec![
                        vec![Inline::Code(c.check.clone())],
                        vec![text(fmt(c.worse.mean))],
                        vec![text(format!("[{}, {}]", fmt(c.worse.ci95[0]), fmt(c.worse.ci95[1])))],
                        vec![text(fmt(c.max_worse))],
                        vec![Inline::Strong(c.verdict.word().into())],
                    ]
                })
                .collect();
            doc.push(table(&columns, rows));
        }
        for h in &self.horizons {
            doc.push(Block::Heading {
                level: 2,
                id: format!("h{}", h.tokens),
                text: format!("First {} tokens", h.tokens),
            });
            let columns =
                ["Metric", "A", "B", "B − A", "95% interval", "Prompts B / A / tie closer", "Sign test p", "Closer"];
            let rows = h
                .metrics
                .iter()
                .map(|m| {
                    let s = &m.sign_test;
                    vec![
                        vec![Inline::Code(m.name.clone())],
                        vec![text(fmt(m.a))],
                        vec![text(fmt(m.b))],
                        vec![text(fmt(m.difference.mean))],
                        vec![text(format!("[{}, {}]", fmt(m.difference.ci95[0]), fmt(m.difference.ci95[1])))],
                        vec![text(format!("{} / {} / {}", s.b_closer, s.a_closer, s.ties))],
                        vec![text(if s.p_value < 0.001 { "< 0.001".into() } else { format!("{:.3}", s.p_value) })],
                        vec![Inline::Strong(m.closer.words().into())],
                    ]
                })
                .collect();
            doc.push(table(&columns, rows));
        }
        doc.push(Block::Paragraph(vec![text(
            "Closer: the variant the whole interval of B's advantage favours (B − A where higher is better, A − B where \
             lower is, |A − 1| − |B − 1| for a perplexity ratio); — when the interval holds 0. The sign test counts the \
             prompts on which each is closer and gives the two-sided probability of a split at least that uneven if \
             neither tended to be. Percentile metrics and the stop length ratio are not paired prompt by prompt and \
             are not compared here."
                .into(),
        )]));
        doc
    }
}

fn table(columns: &[&str], rows: Vec<Vec<Vec<Inline>>>) -> Block {
    let columns = columns.iter().enumerate().map(|(i, t)| Column { title: (*t).into(), numeric: i > 0 }).collect();
    Block::Table { columns, rows }
}

/// Four significant digits, as the reports print KL divergences.
fn fmt(x: f64) -> String {
    crate::format::kld(x)
}

/// The advantage of `b` over `a` for a metric that is better `better`: `b − a` (higher),
/// `a − b` (lower), `|a − 1| − |b − 1|` (closer to 1).
pub fn advantage(better: Better, a: f64, b: f64) -> f64 {
    match better {
        Better::Higher => b - a,
        Better::Lower => a - b,
        Better::NearOne => (a - 1.0).abs() - (b - 1.0).abs(),
    }
}

/// Checks that two reports can be compared prompt by prompt: the same reference checkpoint
/// (SHA-256), reference precision, KL method (exact, or top-K with the same K: a top-K run's
/// divergences are lower bounds, so against an exact run it would look closer by construction),
/// prompts (the eval set's file and its prompt ids), chat
/// template, horizons and seed, and the same reference continuations (its self-perplexity,
/// equal only when its greedy text is: two runs paired this way share a saved reference or ran
/// the same code on the same backend). The error names the first field that differs and both
/// values.
pub fn check_paired(a: &Report, b: &Report) -> Result<(), String> {
    let differ = |field: &str, x: String, y: String| -> Result<(), String> {
        if x == y { Ok(()) } else { Err(format!("the reports are not paired: {field} is {x} in A and {y} in B")) }
    };
    differ("model.sha256", a.model.sha256.clone(), b.model.sha256.clone())?;
    differ("reference.compute_dtype", a.reference.compute_dtype.clone(), b.reference.compute_dtype.clone())?;
    let (ka, kb) = (a.reference.kl.as_ref(), b.reference.kl.as_ref());
    if !KlMethod::same_measurement(ka, kb) {
        return Err(format!(
            "the reports are not paired: their KL divergences are not the same measurement (reference.kl): A's are \
             {}, B's {}",
            KlMethod::describe(ka),
            KlMethod::describe(kb)
        ));
    }
    differ("workload.prompts", a.workload.prompts.to_string(), b.workload.prompts.to_string())?;
    differ("workload.eval_set.sha256", a.workload.eval_set.sha256.clone(), b.workload.eval_set.sha256.clone())?;
    let ids = |r: &Report| r.workload.eval_set.prompts.join(",");
    differ("workload.eval_set.prompts", ids(a), ids(b))?;
    differ("workload.chat_template", a.workload.chat_template.to_string(), b.workload.chat_template.to_string())?;
    differ("workload.horizons", format!("{:?}", a.workload.horizons), format!("{:?}", b.workload.horizons))?;
    differ("workload.seed", a.workload.seed.to_string(), b.workload.seed.to_string())?;
    let ppl = |r: &Report| format!("{:?}", r.reference.self_perplexity);
    differ("reference.self_perplexity (the reference's own continuations)", ppl(a), ppl(b))
}

/// The variant named `name` in `report`, or, with no name, its only variant that is not the
/// noise floor.
pub fn pick_variant<'a>(report: &'a Report, name: Option<&str>, which: &str) -> Result<&'a Variant, String> {
    let names = || report.variants.iter().map(|v| v.name.as_str()).collect::<Vec<_>>().join(", ");
    let picked = pick(report, name, which, names)?;
    match &picked.failure {
        Some(f) => Err(format!("{which}: variant {} failed ({f}): it has nothing to compare", picked.name)),
        None => Ok(picked),
    }
}

fn pick<'a>(
    report: &'a Report,
    name: Option<&str>,
    which: &str,
    names: impl Fn() -> String,
) -> Result<&'a Variant, String> {
    match name {
        Some(n) => report
            .variants
            .iter()
            .find(|v| v.name == n)
            .ok_or_else(|| format!("{which}: no variant is named {n:?} (the report has {})", names())),
        None => {
            let mut quantized = report.variants.iter().filter(|v| v.kind != crate::VariantKind::NoiseFloor);
            match (quantized.next(), quantized.next()) {
                (Some(v), None) => Ok(v),
                _ => Err(format!("{which}: the report has several variants ({}); name one", names())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::sample_report;

    #[test]
    fn max_worse_parses_and_refuses_with_the_form() {
        let c = MaxWorse::parse("kld@100=0.01").unwrap();
        assert_eq!((c.metric.name, c.tokens, c.max_worse, c.name()), ("kld", 100, 0.01, "kld@100".to_string()));
        for (bad, says) in [
            ("kld@100", "write METRIC@HORIZON=X"),
            ("kld=1", "write METRIC@HORIZON=X"),
            ("kld_p99@100=1", "not a metric compare pairs"),
            ("nope@10=1", "not a metric compare pairs"),
            ("kld@0=1", "not a positive integer"),
            ("kld@10=-1", "not a finite number ≥ 0"),
            ("kld@10=NaN", "not a finite number ≥ 0"),
        ] {
            let e = MaxWorse::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn verdicts_follow_the_interval_of_the_worsening() {
        let c = MaxWorse::parse("kld@10=0.1").unwrap();
        let worse = |lo, hi| Estimate::new((lo + hi) / 2.0, [lo, hi]);
        assert_eq!(c.verdict(&worse(-0.2, 0.1)), Verdict::Pass);
        assert_eq!(c.verdict(&worse(0.11, 0.3)), Verdict::Fail);
        assert_eq!(c.verdict(&worse(0.05, 0.2)), Verdict::Inconclusive);
        assert_eq!(Closer::of(&worse(0.01, 0.2)), Closer::B);
        assert_eq!(Closer::of(&worse(-0.3, -0.01)), Closer::A);
        assert_eq!(Closer::of(&worse(-0.1, 0.1)), Closer::Undetermined);
        assert_eq!(advantage(Better::Lower, 0.3, 0.1), 0.19999999999999998);
        assert_eq!(advantage(Better::Higher, 0.3, 0.1), -0.19999999999999998);
        assert_eq!(advantage(Better::NearOne, 1.2, 0.9), 0.09999999999999998);
    }

    #[test]
    fn pairing_names_the_first_field_that_differs() {
        let a = sample_report();
        assert!(check_paired(&a, &a).is_ok());
        let mut b = a.clone();
        b.workload.seed += 1;
        assert!(check_paired(&a, &b).unwrap_err().contains("workload.seed is"));
        let mut b = a.clone();
        b.model.sha256 = "0".repeat(64);
        assert!(check_paired(&a, &b).unwrap_err().contains("model.sha256"));
        let mut b = a.clone();
        b.reference.self_perplexity[0].1 *= 1.01;
        assert!(check_paired(&a, &b).unwrap_err().contains("the reference's own continuations"));
        // A top-K run against an exact one: lower bounds against exact values.
        let mut b = a.clone();
        b.reference.kl = Some(KlMethod::Exact);
        assert_eq!(
            check_paired(&a, &b).unwrap_err(),
            "the reports are not paired: their KL divergences are not the same measurement (reference.kl): A's \
             are against the reference's top-64 log-probabilities plus a tail bucket (--reference-top-k 64): a lower \
             bound, B's exact (over the full vocabulary)"
        );
        b.reference.kl = None;
        assert!(check_paired(&a, &b).unwrap_err().contains("B's exact (over the full vocabulary)"));
        let mut c = b.clone();
        c.reference.kl = Some(KlMethod::Exact);
        assert!(check_paired(&b, &c).is_ok(), "an older report without reference.kl computed it exactly");
        b.reference.kl = Some(KlMethod::TopKTail { top_k: 32, tail_mass_max: 0.031, tail_mass_mean: 0.004 });
        assert!(check_paired(&a, &b).unwrap_err().contains("B's against the reference's top-32"));
        // The same K: the tail masses follow from the reference.
        b.reference.kl = Some(KlMethod::TopKTail { top_k: 64, tail_mass_max: 0.5, tail_mass_mean: 0.1 });
        assert!(check_paired(&a, &b).is_ok());
        let mut b = a.clone();
        b.workload.eval_set.prompts.reverse();
        assert!(check_paired(&a, &b).unwrap_err().contains("workload.eval_set.prompts"));
        assert!(pick_variant(&a, Some("nope"), "A").unwrap_err().contains("no variant is named"));
        assert!(pick_variant(&a, None, "A").unwrap_err().contains("several variants"));
    }
}
