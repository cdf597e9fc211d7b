//! The metric registry: every per-horizon metric of `report.json`, in one table.
//!
//! [`METRICS`] gives each metric its name (its key in `report.json` and in a thresholds file), its
//! column title, a one-sentence description, its range, which way is better, its number format and
//! where it sits in the JSON. Everything that lists metrics reads this table and nothing else:
//! [`HorizonMetrics`](crate::HorizonMetrics)' JSON layout, [`Report::validate`](crate::Report::validate),
//! the gate's metric names, the Markdown and HTML tables and glossary, the terminal summary, and
//! so the JUnit test names.
//!
//! Adding a metric computed from data already in a trace is one entry here (placed
//! [`Placement::Optional`]: reports written before it lack it, see the schema version rule on
//! [`SCHEMA_VERSION`](crate::SCHEMA_VERSION)) and one `set` where the evaluation computes the
//! metrics (`qdrift_eval::aggregate`).

use serde::{Deserialize, Serialize};

use crate::format::{kld, rate, signed_kld, signed_rate};

/// A statistic over prompts: the point estimate, its 95% interval, and for some metrics the
/// distribution of the per-position values it summarises.
///
/// In JSON: `{"mean", "median", "p90", "p99", "max", "ci95"}` (the distribution's four keys only
/// when there is one), the fields' declaration order.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    /// The point estimate (a mean over prompts, or a pooled ratio).
    pub mean: f64,
    /// Where the per-position values fall, for the metrics with a [`Metric::tail`] column.
    #[serde(flatten)]
    pub distribution: Option<Distribution>,
    /// The 95% interval `[lo, hi]`.
    pub ci95: [f64; 2],
}

impl Estimate {
    /// A point estimate and its interval, without a distribution.
    pub fn new(mean: f64, ci95: [f64; 2]) -> Estimate {
        Estimate { mean, distribution: None, ci95 }
    }

    /// Every number of the estimate: the mean, the interval, and the distribution if any.
    fn numbers(&self) -> Vec<f64> {
        let mut xs = vec![self.mean, self.ci95[0], self.ci95[1]];
        if let Some(d) = &self.distribution {
            xs.extend([d.median, d.p90, d.p99, d.max]);
        }
        xs
    }
}

/// Quantiles of the per-position values over all positions `< h` of all prompts.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Distribution {
    /// Median over positions.
    pub median: f64,
    /// 90th percentile over positions.
    pub p90: f64,
    /// 99th percentile over positions.
    pub p99: f64,
    /// Largest per-position value.
    pub max: f64,
}

impl Distribution {
    /// `(suffix, value)` of the quantiles a metric's pooled-quantile twins hold: the metrics
    /// `NAME_median`, `NAME_p90` and `NAME_p99` (`kld_p99`) are the same type-7 quantiles of the
    /// same positions as `NAME`'s distribution, each with an interval of its own.
    pub fn quantiles(&self) -> [(&'static str, f64); 3] {
        [("median", self.median), ("p90", self.p90), ("p99", self.p99)]
    }
}

/// The values a metric can take: [`Report::validate`](crate::Report::validate) refuses others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Range {
    /// A rate, share or probability in `[0, 1]`.
    Unit,
    /// Any finite number `≥ 0` (a divergence).
    NonNegative,
    /// Any finite number `> 0` (a ratio of perplexities).
    Positive,
    /// Any finite number (a difference).
    Any,
}

impl Range {
    /// Whether `x` is in the range (never for NaN or an infinity).
    pub fn contains(self, x: f64) -> bool {
        x.is_finite()
            && match self {
                Range::Unit => (0.0..=1.0).contains(&x),
                Range::NonNegative => x >= 0.0,
                Range::Positive => x > 0.0,
                Range::Any => true,
            }
    }

    /// The smallest and largest values of the range: `(0, 1)` for a rate, `(0, ∞)` for a
    /// divergence or a ratio (a ratio's open end at 0 included), `(−∞, ∞)` for a difference. A
    /// `min` at or below the first, or a `max` at or above the second, is passed by every value.
    pub fn bounds(self) -> (f64, f64) {
        match self {
            Range::Unit => (0.0, 1.0),
            Range::NonNegative | Range::Positive => (0.0, f64::INFINITY),
            Range::Any => (f64::NEG_INFINITY, f64::INFINITY),
        }
    }

    /// The range in words, for error messages: `∈ [0, 1]`.
    pub fn describe(self) -> &'static str {
        match self {
            Range::Unit => "∈ [0, 1]",
            Range::NonNegative => "≥ 0",
            Range::Positive => "> 0",
            Range::Any => "finite",
        }
    }
}

/// Which values of a metric mean a variant closer to its reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Better {
    /// Higher is better (agreement rates).
    Higher,
    /// Lower is better (divergences).
    Lower,
    /// Closer to 1 is better (ratios of perplexities: 1 is no drift either way).
    NearOne,
}

impl Better {
    /// `higher`, `lower` or `closer to 1`.
    pub fn describe(self) -> &'static str {
        match self {
            Better::Higher => "higher",
            Better::Lower => "lower",
            Better::NearOne => "closer to 1",
        }
    }
}

/// The key of the object that holds the differences against the noise floor in `report.json`.
pub const EXCESS_KEY: &str = "excess_over_noise_floor";

/// The key of the object that holds a horizon's per-prompt values in `report.json`.
pub const PER_PROMPT_KEY: &str = "per_prompt";

/// How a metric's point estimate follows from one value per prompt, `v_1 … v_n` (`report.json`'s
/// `per_prompt`), through the mean `m = Σ v_i / n`: what lets two reports of the same prompts be
/// compared prompt by prompt (`qdrift compare`). Every prompt has `h` positions at horizon `h`,
/// so a pooled ratio is a function of a mean too. Metrics without one (pooled percentiles, a
/// median over a subset of prompts, differences against the noise floor) have none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PerPrompt {
    /// The estimate is `m` (a mean over prompts; a share of prompts from 0/1 values).
    Mean,
    /// The estimate is `exp(m)`: a perplexity ratio, `v_i` the prompt's mean log-probability
    /// gain `(Σ ln p_ref − Σ ln p_var) / h`.
    ExpMean,
    /// The estimate is `h / m`: tokens per verification step, `v_i` the prompt's steps.
    HorizonOverMean,
    /// The estimate is `(1 − m^(γ+1)) / (1 − m)`: speculative sampling's tokens per step, `v_i`
    /// the prompt's mean acceptance.
    ExpectedTokens {
        /// Drafts per step.
        gamma: usize,
    },
}

impl PerPrompt {
    /// The statistic of metric `name`, if it has one ([`Metric::per_prompt`]).
    pub fn of(name: &str) -> Option<PerPrompt> {
        metric(name)?.per_prompt
    }

    /// Whether `v` can be one prompt's value, at horizon `h`, of a metric whose estimates lie in
    /// `range`: a mean's values lie in the metric's range (a rate in `[0, 1]`, a KL divergence
    /// `≥ 0`); a log-probability gain is any finite number; a prompt's verification steps are a
    /// whole number from 1 to `h`; an acceptance is in `[0, 1]`.
    pub fn admits(self, range: Range, v: f64, h: usize) -> bool {
        match self {
            PerPrompt::Mean => range.contains(v),
            PerPrompt::ExpMean => v.is_finite(),
            PerPrompt::HorizonOverMean => v.fract() == 0.0 && (1.0..=h as f64).contains(&v),
            PerPrompt::ExpectedTokens { .. } => Range::Unit.contains(v),
        }
    }

    /// What [`PerPrompt::admits`] accepts, in words, for error messages: `≥ 0`.
    pub fn describe(self, range: Range, h: usize) -> String {
        match self {
            PerPrompt::Mean => range.describe().to_string(),
            PerPrompt::ExpMean => Range::Any.describe().to_string(),
            PerPrompt::HorizonOverMean => format!("a whole number of steps from 1 to {h}"),
            PerPrompt::ExpectedTokens { .. } => format!("{} (an acceptance)", Range::Unit.describe()),
        }
    }

    /// The estimate from the mean `m` of the per-prompt values, at horizon `h`.
    pub fn estimate(self, m: f64, h: usize) -> f64 {
        match self {
            PerPrompt::Mean => m,
            PerPrompt::ExpMean => m.exp(),
            PerPrompt::HorizonOverMean => h as f64 / m,
            PerPrompt::ExpectedTokens { gamma } => (0..=gamma).map(|j| m.clamp(0.0, 1.0).powi(j as i32)).sum(),
        }
    }
}

/// Where a metric sits in a horizon's JSON object, and whether a report must have it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// `horizons[i].NAME`, in every variant of every schema-1 report: a report without it is
    /// not a report.
    Required,
    /// `horizons[i].NAME`, added to schema 1 after reports were first written: older reports
    /// lack it, and a report without it is still read (it shows as `—` and cannot be gated).
    Optional,
    /// `horizons[i].excess_over_noise_floor.KEY`: a paired difference against the noise floor,
    /// absent on the noise floor itself.
    Excess {
        /// The key inside [`EXCESS_KEY`].
        key: &'static str,
    },
}

/// One metric of a horizon.
#[derive(Debug)]
pub struct Metric {
    /// The name in `report.json` (for top-level metrics) and in a thresholds file
    /// (`NAME@HORIZON`).
    pub name: &'static str,
    /// The column header in the Markdown and HTML tables and the terminal summary.
    pub title: &'static str,
    /// What it measures, in one sentence (the reports' glossary).
    pub description: &'static str,
    /// The values it can take.
    pub range: Range,
    /// Which way is better.
    pub better: Better,
    /// How its numbers are printed.
    pub format: fn(f64) -> String,
    /// The title of its p99 column, for a metric whose [`Estimate`] carries a [`Distribution`]
    /// (every report has it); `None`: no distribution.
    pub tail: Option<&'static str>,
    /// Where it sits in the JSON.
    pub placement: Placement,
    /// Whether the terminal summary of `qdrift eval` shows it.
    pub summary: bool,
    /// Which of a horizon's tables shows it.
    pub group: Group,
    /// How its estimate follows from one value per prompt, when it does (`qdrift compare` pairs
    /// those values).
    pub per_prompt: Option<PerPrompt>,
}

/// The tables a horizon's metrics are shown in, each narrow enough for a page: what the
/// variant writes on its own, how its distributions differ from the reference's, and how its
/// predictions on the reference's text agree, then routing for a model with experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    /// Free-running generation: the variant's own text against the reference's.
    FreeRunning,
    /// Teacher-forced KL divergence and its distribution over positions.
    Divergence,
    /// Teacher-forced agreement: top-1, probability of the reference's token, perplexity.
    Agreement,
    /// Teacher-forced reverse KL divergence, KL(variant ‖ reference), and its distribution.
    ReverseDivergence,
    /// Teacher-forced top-K agreement of the two distributions.
    TopK,
    /// Greedy speculative decoding, the variant drafting for the reference.
    Speculative,
    /// Speculative sampling at temperature 1, the variant drafting for the reference.
    SpeculativeSampling,
    /// Where each model first emits its end-of-text token in its own text.
    Stopping,
    /// Expert routing (models with experts).
    Routing,
}

impl Group {
    /// Every group, in table order.
    pub const ALL: [Group; 9] = [
        Group::FreeRunning,
        Group::Divergence,
        Group::ReverseDivergence,
        Group::Agreement,
        Group::TopK,
        Group::Speculative,
        Group::SpeculativeSampling,
        Group::Stopping,
        Group::Routing,
    ];

    /// The table's caption.
    pub fn title(self) -> &'static str {
        match self {
            Group::FreeRunning => "Free-running: the variant's own text",
            Group::Divergence => "Teacher-forced on the reference's text: KL divergence",
            Group::Agreement => "Teacher-forced on the reference's text: agreement and perplexity",
            Group::ReverseDivergence => "Teacher-forced on the reference's text: reverse KL divergence",
            Group::TopK => "Teacher-forced on the reference's text: top-K agreement",
            Group::Speculative => "Speculative decoding: the variant drafts, the reference verifies (greedy)",
            Group::SpeculativeSampling => {
                "Speculative sampling at temperature 1: the variant drafts, the reference verifies"
            }
            Group::Stopping => "Stopping: where each model first ends its own text (EOS, or the end of a chat turn)",
            Group::Routing => "Expert routing",
        }
    }
}

/// Every metric, in the order of the JSON keys, the table columns and the gate's checks.
pub const METRICS: &[Metric] = &[
    Metric {
        name: "token_match_rate",
        title: "Token match",
        description: "Free-running: share of the first h generated positions where the variant's token equals the \
                      reference's.",
        range: Range::Unit,
        better: Better::Higher,
        format: rate,
        tail: None,
        placement: Placement::Required,
        summary: true,
        group: Group::FreeRunning,
        per_prompt: Some(PerPrompt::Mean),
    },
    Metric {
        name: "exact_match_fraction",
        title: "Exact match",
        description: "Free-running: share of prompts whose first h generated tokens all equal the reference's \
                      (Wilson interval).",
        range: Range::Unit,
        better: Better::Higher,
        format: rate,
        tail: None,
        placement: Placement::Required,
        summary: true,
        group: Group::FreeRunning,
        per_prompt: Some(PerPrompt::Mean),
    },
    Metric {
        name: "kld",
        title: "KLD mean",
        description: "Teacher-forced on the reference's continuation: KL(P_ref ‖ P_variant) in nats, the mean over \
                      prompts of each prompt's mean over positions (p99: over all positions).",
        range: Range::NonNegative,
        better: Better::Lower,
        format: kld,
        tail: Some("KLD p99"),
        placement: Placement::Required,
        summary: true,
        group: Group::Divergence,
        per_prompt: Some(PerPrompt::Mean),
    },
    Metric {
        name: "kld_median",
        title: "KLD median",
        description: "Teacher-forced: the median (Hyndman & Fan type 7) of KL(P_ref ‖ P_variant) over every position < h \
                      of every prompt, pooled; its interval resamples prompts, each bringing all its positions.",
        range: Range::NonNegative,
        better: Better::Lower,
        format: kld,
        tail: None,
        placement: Placement::Optional,
        summary: false,
        group: Group::Divergence,
        per_prompt: None,
    },
    Metric {
        name: "kld_p90",
        title: "KLD p90",
        description: "As KLD median, the 90th percentile.",
        range: Range::NonNegative,
        better: Better::Lower,
        format: kld,
        tail: None,
        placement: Placement::Optional,
        summary: false,
        group: Group::Divergence,
        per_prompt: None,
    },
    Metric {
        name: "kld_p99",
        title: "KLD p99",
        description: "As KLD median, the 99th percentile: the tail llama.cpp's KL-divergence statistics report, here \
                      with an interval over prompts.",
        range: Range::NonNegative,
        better: Better::Lower,
        format: kld,
        tail: None,
        placement: Placement::Optional,
        summary: false,
        group: Group::Divergence,
        per_prompt: None,
    },
    Metric {
        name: "kld_reverse",
        title: "Reverse KLD mean",
        description: "Teacher-forced on the reference's continuation: KL(P_variant ‖ P_ref) in nats, the other \
                      direction (exllamav3's model_diff reports both; llm-compressor issue 2031): it weighs the tokens \
                      the variant makes likely that the reference does not. The mean over prompts of each prompt's \
                      mean over positions (p99: over all positions). Against a compact reference (--reference-top-k), \
                      a lower bound, as the KLD.",
        range: Range::NonNegative,
        better: Better::Lower,
        format: kld,
        tail: Some("Reverse KLD p99"),
        placement: Placement::Optional,
        summary: false,
        group: Group::ReverseDivergence,
        per_prompt: Some(PerPrompt::Mean),
    },
    Metric {
        name: "kld_reverse_median",
        title: "Reverse KLD median",
        description: "As KLD median, of KL(P_variant ‖ P_ref).",
        range: Range::NonNegative,
        better: Better::Lower,
        format: kld,
        tail: None,
        placement: Placement::Optional,
        summary: false,
        group: Group::ReverseDivergence,
        per_prompt: None,
    },
    Metric {
        name: "kld_reverse_p90",
        title: "Reverse KLD p90",
        description: "As KLD p90, of KL(P_variant ‖ P_ref).",
        range: Range::NonNegative,
        better: Better::Lower,
        format: kld,
        tail: None,
        placement: Placement::Optional,
        summary: false,
        group: Group::ReverseDivergence,
        per_prompt: None,
    },
    Metric {
        name: "kld_reverse_p99",
        title: "Reverse KLD p99",
        description: "As KLD p99, of KL(P_variant ‖ P_ref).",
        range: Range::NonNegative,
        better: Better::Lower,
        format: kld,
        tail: None,
        placement: Placement::Optional,
        summary: false,
        group: Group::ReverseDivergence,
        per_prompt: None,
    },
    Metric {
        name: "top1_agreement",
        title: "Top-1 agreement",
        description: "Teacher-forced: share of positions where both models' most likely token is the same.",
        range: Range::Unit,
        better: Better::Higher,
        format: rate,
        tail: None,
        placement: Placement::Required,
        summary: true,
        group: Group::Agreement,
        per_prompt: Some(PerPrompt::Mean),
    },
    Metric {
        name: "rms_delta_p",
        title: "RMS Δp",
        description: "Teacher-forced: root mean square over positions of p_variant(ref token) − p_ref(ref token).",
        range: Range::Unit,
        better: Better::Lower,
        format: rate,
        tail: None,
        placement: Placement::Required,
        summary: false,
        group: Group::Agreement,
        per_prompt: Some(PerPrompt::Mean),
    },
    Metric {
        name: "top_k_overlap_k2",
        title: "Top-2 overlap",
        description: "Teacher-forced: |top-K_variant ∩ top-K_ref| / K with K = 2, the two models' K most likely tokens \
                      (by logit, lower id first on ties), the mean over prompts of each prompt's mean over positions; K = 1 \
                      is the top-1 agreement (exllamav3's model_diff reports K = 1..5). Exact against a compact reference \
                      that kept at least K tokens, absent against one that kept fewer.",
        range: Range::Unit,
        better: Better::Higher,
        format: rate,
        tail: None,
        placement: Placement::Optional,
        summary: false,
        group: Group::TopK,
        per_prompt: Some(PerPrompt::Mean),
    },
    Metric {
        name: "top_k_overlap_k3",
        title: "Top-3 overlap",
        description: "As top-2 overlap, K = 3.",
        range: Range::Unit,
        better: Better::Higher,
        format: rate,
        tail: None,
        placement: Placement::Optional,
        summary: false,
        group: Group::TopK,
        per_prompt: Some(PerPrompt::Mean),
    },
    Metric {
        name: "top_k_overlap_k4",
        title: "Top-4 overlap",
        description: "As top-2 overlap, K = 4.",
        range: Range::Unit,
        better: Better::Higher,
        format: rate,
        tail: None,
        placement: Placement::Optional,
        summary: false,
        group: Group::TopK,
        per_prompt: Some(PerPrompt::Mean),
    },
    Metric {
        name: "top_k_overlap_k5",
        title: "Top-5 overlap",
        description: "As top-2 overlap, K = 5.",
        range: Range::Unit,
        better: Better::Higher,
        format: rate,
        tail: None,
        placement: Placement::Optional,
        summary: false,
        group: Group::TopK,
        per_prompt: Some(PerPrompt::Mean),
    },
    Metric {
        name: "ref_top1_in_var_top_k",
        title: "Ref. top-1 in var. top-5",
        description: "Teacher-forced: share of positions where the reference's most likely token is among the \
                      variant's 5 most likely, the mean over prompts (exact against a compact reference too).",
        range: Range::Unit,
        better: Better::Higher,
        format: rate,
        tail: None,
        placement: Placement::Optional,
        summary: false,
        group: Group::TopK,
        per_prompt: Some(PerPrompt::Mean),
    },
    Metric {
        name: "ppl_ratio_on_reference_text",
        title: "PPL ratio (ref. text)",
        description: "Teacher-forced: PPL_variant(ref text) / PPL_ref(ref text), pooled over prompts.",
        range: Range::Positive,
        better: Better::NearOne,
        format: rate,
        tail: None,
        placement: Placement::Required,
        summary: false,
        group: Group::Agreement,
        per_prompt: Some(PerPrompt::ExpMean),
    },
    Metric {
        name: "ppl_drift_of_generated_text",
        title: "PPL drift (gen. text)",
        description: "PPL_ref(variant's text) / PPL_ref(reference's text), pooled over prompts: rises as the \
                      variant's free-running text wanders from what the reference would write.",
        range: Range::Positive,
        better: Better::NearOne,
        format: rate,
        tail: None,
        placement: Placement::Required,
        summary: true,
        group: Group::FreeRunning,
        per_prompt: Some(PerPrompt::ExpMean),
    },
    Metric {
        name: "spec_tokens_per_step_g1",
        title: "Tokens/step γ=1",
        description: "Greedy speculative decoding with the variant drafting 1 token per step and the reference verifying: tokens per \
                      verification step (accepted drafts plus the reference's own token), pooled over prompts; from the \
                      teacher-forced top-1 agreement on the reference's text (Leviathan et al. 2023). 1 = no draft \
                      accepted, 2 = every draft accepted.",
        range: Range::Positive,
        better: Better::Higher,
        format: rate,
        tail: None,
        placement: Placement::Optional,
        summary: false,
        group: Group::Speculative,
        per_prompt: Some(PerPrompt::HorizonOverMean),
    },
    Metric {
        name: "spec_tokens_per_step_g2",
        title: "Tokens/step γ=2",
        description: "As the γ=1 column, 2 drafts per step (at most 3 tokens per step).",
        range: Range::Positive,
        better: Better::Higher,
        format: rate,
        tail: None,
        placement: Placement::Optional,
        summary: false,
        group: Group::Speculative,
        per_prompt: Some(PerPrompt::HorizonOverMean),
    },
    Metric {
        name: "spec_tokens_per_step_g4",
        title: "Tokens/step γ=4",
        description: "As the γ=1 column, 4 drafts per step (at most 5 tokens per step).",
        range: Range::Positive,
        better: Better::Higher,
        format: rate,
        tail: None,
        placement: Placement::Optional,
        summary: false,
        group: Group::Speculative,
        per_prompt: Some(PerPrompt::HorizonOverMean),
    },
    Metric {
        name: "spec_tokens_per_step_g8",
        title: "Tokens/step γ=8",
        description: "As the γ=1 column, 8 drafts per step (at most 9 tokens per step).",
        range: Range::Positive,
        better: Better::Higher,
        format: rate,
        tail: None,
        placement: Placement::Optional,
        summary: false,
        group: Group::Speculative,
        per_prompt: Some(PerPrompt::HorizonOverMean),
    },
    Metric {
        name: "spec_acceptance",
        title: "Acceptance α",
        description: "Speculative sampling at temperature 1 (Leviathan et al. 2023, §3), the variant drafting and the \
                      reference verifying: a drafted token is kept with probability Σ min(p_ref, p_variant) = 1 − \
                      TV(p_ref, p_variant) at its position; α is its mean over the positions of the reference's \
                      continuation (teacher-forced), the mean over prompts. Against a compact reference, an upper bound \
                      (merging the tail into one outcome can only raise Σ min).",
        range: Range::Unit,
        better: Better::Higher,
        format: rate,
        tail: None,
        placement: Placement::Optional,
        summary: false,
        group: Group::SpeculativeSampling,
        per_prompt: Some(PerPrompt::Mean),
    },
    Metric {
        name: "spec_sampling_tokens_per_step_g1",
        title: "Tokens/step γ=1 (sampling)",
        description: "Speculative sampling at temperature 1 with 1 draft per step: the expected tokens per \
                      verification step (1 − α^(γ+1)) / (1 − α) (Leviathan et al. 2023, eq. 1, which takes drafts to be \
                      accepted independently with probability α); its interval is α's interval mapped through the \
                      formula, which increases with α.",
        range: Range::Positive,
        better: Better::Higher,
        format: rate,
        tail: None,
        placement: Placement::Optional,
        summary: false,
        group: Group::SpeculativeSampling,
        per_prompt: Some(PerPrompt::ExpectedTokens { gamma: 1 }),
    },
    Metric {
        name: "spec_sampling_tokens_per_step_g2",
        title: "Tokens/step γ=2 (sampling)",
        description: "As the sampling γ=1 column, 2 drafts per step.",
        range: Range::Positive,
        better: Better::Higher,
        format: rate,
        tail: None,
        placement: Placement::Optional,
        summary: false,
        group: Group::SpeculativeSampling,
        per_prompt: Some(PerPrompt::ExpectedTokens { gamma: 2 }),
    },
    Metric {
        name: "spec_sampling_tokens_per_step_g4",
        title: "Tokens/step γ=4 (sampling)",
        description: "As the sampling γ=1 column, 4 drafts per step.",
        range: Range::Positive,
        better: Better::Higher,
        format: rate,
        tail: None,
        placement: Placement::Optional,
        summary: false,
        group: Group::SpeculativeSampling,
        per_prompt: Some(PerPrompt::ExpectedTokens { gamma: 4 }),
    },
    Metric {
        name: "spec_sampling_tokens_per_step_g8",
        title: "Tokens/step γ=8 (sampling)",
        description: "As the sampling γ=1 column, 8 drafts per step.",
        range: Range::Positive,
        better: Better::Higher,
        format: rate,
        tail: None,
        placement: Placement::Optional,
        summary: false,
        group: Group::SpeculativeSampling,
        per_prompt: Some(PerPrompt::ExpectedTokens { gamma: 8 }),
    },
    Metric {
        name: "stop_agreement",
        title: "Stops alike",
        description: "Free-running, each model on its own text: share of prompts where the variant first emits the \
                      end-of-text token (model.stop_token_id: EOS, the end of a chat turn, or BOS for llama2.c) at the same position as the reference within the first h \
                      tokens, or neither emits it (Wilson interval). Generation does not stop there; a quantized chat model \
                      that ends its turn later or never does fails in production even when its tokens match (llm-compressor \
                      issue 2680).",
        range: Range::Unit,
        better: Better::Higher,
        format: rate,
        tail: None,
        placement: Placement::Optional,
        summary: false,
        group: Group::Stopping,
        per_prompt: Some(PerPrompt::Mean),
    },
    Metric {
        name: "stop_missed",
        title: "Ref. stops, variant not",
        description: "Free-running: share of prompts where the reference emits the end-of-text token within the first \
                      h tokens of its text and the variant does not within the first h of its own (Wilson interval).",
        range: Range::Unit,
        better: Better::Lower,
        format: rate,
        tail: None,
        placement: Placement::Optional,
        summary: false,
        group: Group::Stopping,
        per_prompt: Some(PerPrompt::Mean),
    },
    Metric {
        name: "stop_length_ratio",
        title: "Stop length ratio",
        description: "Free-running: median over the prompts where the reference stops within h tokens of (variant's tokens \
                      up to and including its first end-of-text token) / (the reference's), with a percentile-bootstrap \
                      interval over those prompts; a variant that does not stop within h counts as h + 1 tokens, a lower \
                      bound. Absent when the reference never stops within h.",
        range: Range::Positive,
        better: Better::NearOne,
        format: rate,
        tail: None,
        placement: Placement::Optional,
        summary: false,
        group: Group::Stopping,
        per_prompt: None,
    },
    Metric {
        name: "expert_overlap",
        title: "Expert overlap",
        description: "Models with experts, teacher-forced on the reference's text: |experts_variant ∩ experts_ref| / k \
                      per position and mixture-of-experts layer, the mean over prompts of each prompt's mean.",
        range: Range::Unit,
        better: Better::Higher,
        format: rate,
        tail: None,
        placement: Placement::Optional,
        summary: true,
        group: Group::Routing,
        per_prompt: Some(PerPrompt::Mean),
    },
    Metric {
        name: "routing_flip_rate",
        title: "Routing flips",
        description: "Models with experts, teacher-forced on the reference's text: share of (position, \
                      mixture-of-experts layer) pairs whose top-1 expert differs from the reference's, the mean over \
                      prompts.",
        range: Range::Unit,
        better: Better::Lower,
        format: rate,
        tail: None,
        placement: Placement::Optional,
        summary: true,
        group: Group::Routing,
        per_prompt: Some(PerPrompt::Mean),
    },
    Metric {
        name: "expert_overlap_on_generated_text",
        title: "Expert overlap (gen. text)",
        description: "As expert overlap, both models teacher-forced on the variant's own continuation.",
        range: Range::Unit,
        better: Better::Higher,
        format: rate,
        tail: None,
        placement: Placement::Optional,
        summary: false,
        group: Group::Routing,
        per_prompt: Some(PerPrompt::Mean),
    },
    Metric {
        name: "routing_flip_rate_on_generated_text",
        title: "Routing flips (gen. text)",
        description: "As routing flips, both models teacher-forced on the variant's own continuation.",
        range: Range::Unit,
        better: Better::Lower,
        format: rate,
        tail: None,
        placement: Placement::Optional,
        summary: false,
        group: Group::Routing,
        per_prompt: Some(PerPrompt::Mean),
    },
    Metric {
        name: "excess_token_match_rate",
        title: "Excess token match",
        description: "Token match minus the noise floor's, paired by prompt (negative: the variant matches less \
                      than the noise floor).",
        range: Range::Any,
        better: Better::Higher,
        format: signed_rate,
        tail: None,
        placement: Placement::Excess { key: "token_match_rate" },
        summary: false,
        group: Group::FreeRunning,
        per_prompt: None,
    },
    Metric {
        name: "excess_kld",
        title: "Excess KLD",
        description: "KLD mean minus the noise floor's, paired by prompt, in nats.",
        range: Range::Any,
        better: Better::Lower,
        format: signed_kld,
        tail: None,
        placement: Placement::Excess { key: "kld" },
        summary: false,
        group: Group::Divergence,
        per_prompt: None,
    },
];

/// The metric named `name`.
pub fn metric(name: &str) -> Option<&'static Metric> {
    METRICS.iter().find(|m| m.name == name)
}

/// The position of metric `name` in [`METRICS`].
pub(crate) fn rank(name: &str) -> Option<usize> {
    METRICS.iter().position(|m| m.name == name)
}

/// Every metric name, comma-separated: for messages that list what is known.
pub(crate) fn names() -> String {
    METRICS.iter().map(|m| m.name).collect::<Vec<_>>().join(", ")
}

impl Metric {
    /// `mean [lo, hi]`, each number in the metric's format.
    pub fn with_ci(&self, e: &Estimate) -> String {
        let f = self.format;
        format!("{} [{}, {}]", f(e.mean), f(e.ci95[0]), f(e.ci95[1]))
    }

    /// Whether the metric is a difference against the noise floor (so the noise floor has none).
    pub fn is_excess(&self) -> bool {
        matches!(self.placement, Placement::Excess { .. })
    }

    /// Checks an estimate of this metric: every number in [`Metric::range`], the interval
    /// ordered and containing the mean (up to a rounding slack of `1e-9 · max(1, |bound|)`), and a distribution, ordered, exactly
    /// when the metric has a [`Metric::tail`]. The error says what is wrong, for a message that
    /// names the variant and horizon.
    ///
    /// Every interval qdrift writes contains its estimate: a Wilson interval always does, and
    /// the evaluation widens a percentile-bootstrap interval to the estimate in the rare case it
    /// misses it (very few resamples, or a skewed ratio), so a mean outside its interval is a
    /// report no run wrote.
    pub fn check(&self, e: &Estimate) -> Result<(), String> {
        if let Some(x) = e.numbers().into_iter().find(|&x| !self.range.contains(x)) {
            return Err(format!("{} = {x}, not {}", self.name, self.range.describe()));
        }
        let [lo, hi] = e.ci95;
        if lo > hi {
            return Err(format!("{} interval {:?} is reversed", self.name, e.ci95));
        }
        if e.mean < lo - slack(lo) || e.mean > hi + slack(hi) {
            return Err(format!("{} mean {} is outside its interval {:?}", self.name, e.mean, e.ci95));
        }
        match (self.tail.is_some(), e.distribution) {
            (true, None) => Err(format!("{} has no median, p90, p99 and max", self.name)),
            (false, Some(_)) => Err(format!("{} has a distribution it does not define", self.name)),
            (true, Some(d)) if !(d.median <= d.p90 && d.p90 <= d.p99 && d.p99 <= d.max) => Err(format!(
                "{} distribution is not ordered (median {} ≤ p90 {} ≤ p99 {} ≤ max {})",
                self.name, d.median, d.p90, d.p99, d.max
            )),
            _ => Ok(()),
        }
    }
}

/// How far a mean may sit outside its interval's bound `x`: the rounding of summing the same
/// values in another order (the estimate and the resamples add prompts in different orders),
/// `1e-9 · max(1, |x|)`, far below any difference a report prints.
pub(crate) fn slack(x: f64) -> f64 {
    1e-9 * x.abs().max(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_json_keys_are_unique() {
        let mut excess_keys = Vec::new();
        for (i, m) in METRICS.iter().enumerate() {
            assert_eq!(rank(m.name), Some(i), "{} twice", m.name);
            assert!(m.name != "tokens" && m.name != EXCESS_KEY, "{} is a key of its own", m.name);
            if let Placement::Excess { key } = m.placement {
                assert!(!excess_keys.contains(&key), "{key} twice in {EXCESS_KEY}");
                excess_keys.push(key);
            }
        }
    }

    #[test]
    fn check_refuses_what_the_range_excludes() {
        let unit = metric("token_match_rate").unwrap();
        assert!(unit.check(&Estimate::new(0.5, [0.25, 0.75])).is_ok());
        assert!(unit.check(&Estimate::new(1.5, [0.25, 0.75])).unwrap_err().contains("∈ [0, 1]"));
        assert!(unit.check(&Estimate::new(0.5, [0.75, 0.25])).unwrap_err().contains("reversed"));
        assert!(unit.check(&Estimate::new(f64::NAN, [0.25, 0.75])).is_err());
        let kld = metric("kld").unwrap();
        assert!(kld.check(&Estimate::new(0.5, [0.25, 0.75])).unwrap_err().contains("median"));
        let d = Distribution { median: 0.1, p90: 0.2, p99: 0.3, max: -0.4 };
        assert!(kld.check(&Estimate { distribution: Some(d), ..Estimate::new(0.5, [0.25, 0.75]) }).is_err());
        assert!(metric("excess_kld").unwrap().check(&Estimate::new(-0.5, [-0.75, -0.25])).is_ok());
        assert_eq!(unit.with_ci(&Estimate::new(0.5, [0.25, 0.75])), "0.5000 [0.2500, 0.7500]");
    }
}
