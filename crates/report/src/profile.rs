//! Built-in thresholds profiles: a gate that gives a verdict on the first run, with no file to
//! write (`qdrift gate --thresholds default`, `qdrift eval --gate default`).
//!
//! A profile is one table in code ([`PROFILES`]): each check with its threshold and its reason in
//! words. It becomes a thresholds file at a report's horizons ([`Profile::toml`], which `qdrift
//! thresholds show` prints, a comment per check giving its reason), and the gate reads that very
//! text ([`Profile::thresholds`]), so what is printed is exactly what is checked. Every check is
//! `[variant."*"]` (every variant but the noise floor) at the longest horizon, where a
//! teacher-forced metric has the most positions and the narrowest interval; a check of a metric
//! some models lack (routing, stopping) is `optional = true`, so a dense model's report is gated
//! without error.

use std::fmt::Write as _;
use std::path::Path;

use crate::gate::{GateError, Side, Thresholds};

/// One check of a profile: `METRIC@LONGEST = { min|max = threshold }` for every variant but the
/// noise floor.
#[derive(Debug)]
pub struct ProfileCheck {
    /// A name of [`METRICS`](crate::METRICS).
    pub metric: &'static str,
    /// Which side of the threshold the metric must stay on.
    pub side: Side,
    /// The threshold.
    pub threshold: f64,
    /// Skipped for a variant that does not have the metric (`optional = true`).
    pub optional: bool,
    /// Why this metric and this threshold, in words (a comment above the check).
    pub reason: &'static str,
}

/// A named set of checks.
#[derive(Debug)]
pub struct Profile {
    /// The name `--thresholds` and `--gate` take.
    pub name: &'static str,
    /// What the profile is for, in one sentence.
    pub summary: &'static str,
    /// The checks, in the order they are written.
    pub checks: &'static [ProfileCheck],
}

/// Every built-in profile.
pub const PROFILES: &[Profile] = &[Profile {
    name: "default",
    summary: "a first gate for any model, before a team has thresholds of its own: the variant's distributions \
              stay near the reference's, it ends its text where the reference does, and a model with experts \
              routes tokens to the same experts",
    checks: &[
        ProfileCheck {
            metric: "excess_kld",
            side: Side::Max,
            threshold: 0.05,
            optional: false,
            reason: "KL divergence from the reference beyond the noise floor's, teacher-forced, mean per token: at \
                     most 0.05 nats. llama.cpp's table of LLaMA 3 8B quantizations (examples/perplexity/README.md, \
                     mean KLD on wikitext) has q8_0 at 0.0014, q5_K_M at 0.011 and the 4-bit k-quants at 0.031 \
                     (q4_K_M, 92% same top token) to 0.043 (q4_K_S), and q4_0 and the 3-bit quantizations at 0.07 \
                     and above: 0.05 passes what is commonly shipped and fails what visibly degrades. qdrift measures \
                     on the reference's own greedy text, usually more predictable than wikitext, so a variant tends \
                     to read lower here than in that table.",
        },
        ProfileCheck {
            metric: "stop_missed",
            side: Side::Max,
            threshold: 0.25,
            optional: true,
            reason: "Share of prompts where the reference ends its text (EOS; for a chat model, the end of its turn) \
                     and the variant does not: at most a quarter. A quantized chat model that stops ending its turns \
                     fails in production even when its tokens match (llm-compressor issue 2680), and misses most of \
                     the prompts the reference ends, far above 0.25. Not tighter: a variant whose text forked may end \
                     later for its own text's sake (the noise floor misses some too), and with 32 prompts the 95% \
                     Wilson interval of no miss at all reaches 0.11, of three 0.24. Skipped where the report has no \
                     stopping metrics (a tokenizer without a stop token).",
        },
        ProfileCheck {
            metric: "routing_flip_rate",
            side: Side::Max,
            threshold: 0.1,
            optional: true,
            reason: "Models with experts: share of routing decisions (position, mixture-of-experts layer) whose \
                     top-1 expert differs from the reference's, teacher-forced: at most one in ten. A flipped token \
                     runs through another expert's weights, a different function rather than a rounded one, and \
                     each flip changes what the next layer's router reads; past a tenth of the decisions the variant \
                     is a different mixture of experts. int8 and fp8 weights flip 1.6% and 5.9% on the example MoE \
                     (reports/qwen3-moe-tiny), its int4 variants 20% and 21%. Skipped for a dense model.",
        },
    ],
}];

/// Why a profile could not be used: exit 2.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// A name no profile has.
    #[error("unknown thresholds profile \"{name}\"; profiles: {}", profile_names())]
    Unknown {
        /// The name given.
        name: String,
    },
}

/// The profiles' names, comma-separated, for messages.
fn profile_names() -> String {
    PROFILES.iter().map(|p| p.name).collect::<Vec<_>>().join(", ")
}

impl Profile {
    /// The profile named `name`.
    pub fn named(name: &str) -> Result<&'static Profile, ProfileError> {
        PROFILES
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| ProfileError::Unknown { name: crate::format::plain(name) })
    }

    /// The profile a `--thresholds`/`--gate` argument names: `default` is the profile, where a
    /// file of that name is given as `./default`. `None` for any other path.
    pub fn given_as(path: &Path) -> Option<&'static Profile> {
        PROFILES.iter().find(|p| path.as_os_str() == p.name)
    }

    /// The checks as a thresholds file at the longest of `horizons` (a report's, or a run's),
    /// each under its reason as a comment; `origin` says where the horizons come from, in the
    /// header (`the report's horizons 10, 100, 1000`). `None` without a horizon.
    pub fn toml(&self, horizons: &[usize], origin: &str) -> Option<String> {
        let longest = horizons.iter().max()?;
        let header = format!(
            "qdrift thresholds profile \"{name}\": {}. Each check applies to every variant but the noise floor, \
             at the longest horizon, {longest} tokens ({origin}). `qdrift gate --thresholds {name}` and `qdrift eval \
             --gate {name}` check exactly this; save it to a file to tighten or loosen it.",
            self.summary,
            name = self.name,
        );
        let mut out = String::new();
        for line in wrap(&header, 98) {
            let _ = writeln!(out, "# {line}");
        }
        out.push_str("[defaults]\nbound = \"ci\"\n\n[variant.\"*\"]\n");
        for c in self.checks {
            for line in wrap(c.reason, 98) {
                let _ = writeln!(out, "# {line}");
            }
            let side = if c.side == Side::Min { "min" } else { "max" };
            let optional = if c.optional { ", optional = true" } else { "" };
            let _ = writeln!(out, "\"{}@{longest}\" = {{ {side} = {}{optional} }}", c.metric, c.threshold);
        }
        Some(out)
    }

    /// The thresholds the gate checks: [`Profile::toml`] at the longest of `horizons`, parsed.
    ///
    /// # Errors
    /// [`GateError::NoChecks`] without a horizon.
    pub fn thresholds(&self, horizons: &[usize]) -> Result<Thresholds, GateError> {
        let text = self.toml(horizons, "the report's").ok_or(GateError::NoChecks)?;
        Thresholds::parse_named(&text, &format!("thresholds profile {}", self.name))
    }

    /// What a gate with this profile prints first: the profile and, one line each, its checks at
    /// the longest of `horizons` with the first sentence of their reasons (the whole reasons are
    /// in `qdrift thresholds show`).
    pub fn announce(&self, horizons: &[usize]) -> String {
        let longest = horizons.iter().max().copied().unwrap_or(0);
        let mut out = format!(
            "gate: thresholds profile \"{}\" on every variant but the noise floor (`qdrift thresholds show {}` gives \
             each check's reason in full):\n",
            self.name, self.name
        );
        for c in self.checks {
            let side = if c.side == Side::Min { "min" } else { "max" };
            let present = if c.optional { " where present" } else { "" };
            let _ = writeln!(
                out,
                "gate:   {}@{longest} {side} {}{present}: {}",
                c.metric,
                c.threshold,
                first_sentence(c.reason)
            );
        }
        out
    }
}

/// `text` up to and with its first full stop followed by a space (all of it without one).
fn first_sentence(text: &str) -> &str {
    text.find(". ").map_or(text, |end| &text[..=end])
}

/// `text` in lines of at most `width` characters, broken at spaces (a longer word stays whole).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{Placement, metric};

    /// Every check names a registry metric; exactly the metrics some models lack are optional;
    /// every reason is words enough to say why.
    #[test]
    fn every_check_is_a_metric_with_a_reason() {
        for p in PROFILES {
            for c in p.checks {
                let m = metric(c.metric).unwrap_or_else(|| panic!("{}: {} is no metric", p.name, c.metric));
                assert_eq!(c.optional, m.placement == Placement::Optional, "{}", c.metric);
                assert!(c.reason.split_whitespace().count() > 20, "{}: a reason in words", c.metric);
                assert!(m.range.contains(c.threshold) || m.range == crate::metrics::Range::Any, "{}", c.metric);
            }
        }
    }

    #[test]
    fn wrap_keeps_lines_within_the_width() {
        let lines = wrap("a bb ccc dddd eeeee", 6);
        assert_eq!(lines, ["a bb", "ccc", "dddd", "eeeee"]);
        assert!(wrap("", 6).is_empty());
    }
}
