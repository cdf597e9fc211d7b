//! `--prompts auto --max-prompts MAX` ([`evaluate_auto`]): as many prompts as the `--gate`
//! thresholds need to decide, found by whole runs of more and more prompts.
//!
//! **Invariant: each round is a whole run (the reference generates again), so the report of the
//! last round is byte for byte the one a run with its prompt count makes, whatever the rounds
//! before it.**

use qdrift_report::{Report, Verdict};

use crate::check::config::EvalConfig;
use crate::error::EvalError;
use crate::run::evaluate::Evaluated;

/// The first round when no batch size is given: one full default batch.
const FIRST_ROUND: usize = qdrift_generate::MAX_DEFAULT_BATCH_SIZE;

/// What [`evaluate_auto`] decided at a round, for its caller to show (its `Display` is one line).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AutoRound {
    /// A round of `prompts` prompts starts.
    Start {
        /// The prompts of this round.
        prompts: usize,
        /// `--max-prompts`.
        max: usize,
    },
    /// The eval set ran out before the cap: the round used all of its `prompts` prompts; the last.
    SetExhausted {
        /// The eval set's prompts.
        prompts: usize,
    },
    /// No check is inconclusive at `prompts` prompts; the last round.
    Resolved {
        /// The round's prompts.
        prompts: usize,
    },
    /// `open` of `checks` checks are inconclusive at `prompts` prompts; the next round has `next`.
    Inconclusive {
        /// Inconclusive checks.
        open: usize,
        /// All checks.
        checks: usize,
        /// The round's prompts.
        prompts: usize,
        /// The next round's prompts.
        next: usize,
    },
}

impl std::fmt::Display for AutoRound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            AutoRound::Start { prompts, max } => write!(f, "a round of {prompts} prompts (at most {max})"),
            AutoRound::SetExhausted { prompts } => write!(f, "the eval set has {prompts} prompts, all of them used"),
            AutoRound::Resolved { prompts } => write!(f, "every check resolved at {prompts} prompts"),
            AutoRound::Inconclusive { open, checks, prompts, next } => {
                write!(f, "{open} of {checks} checks inconclusive at {prompts} prompts; next round {next}")
            }
        }
    }
}

/// Refuses what `--prompts auto --max-prompts max` cannot run with: no `--gate` (nothing to
/// resolve), a zero cap, or an option that a run of several rounds cannot repeat (`--shard`,
/// `--reference`, `--save-reference`, `--dump-logprobs`).
pub fn check_auto(cfg: &EvalConfig, max: usize) -> Result<(), EvalError> {
    let refuse = |option: &'static str, problem: String| Err(EvalError::Option { option, problem });
    if max == 0 {
        return refuse("--max-prompts", "0: a round needs at least one prompt".into());
    }
    if cfg.gate.is_none() {
        return refuse(
            "--prompts auto",
            "adds prompts until the gate's checks are resolved: give --gate thresholds.toml".into(),
        );
    }
    for (given, flag) in [
        (cfg.shard.is_some(), "--shard"),
        (cfg.reference_store.is_some(), "--reference"),
        (cfg.save_reference.is_some(), "--save-reference"),
        (cfg.dump_logprobs.is_some(), "--dump-logprobs"),
    ] {
        if given {
            return refuse("--prompts auto", format!("runs several rounds and cannot be combined with {flag}"));
        }
    }
    Ok(())
}

/// `--prompts auto --max-prompts max`: runs the first P prompts (`run_round`, a whole evaluation
/// of `cfg` with P prompts, at most the set's), gates the report in memory as it will be written
/// (through its JSON), and stops when no check is inconclusive or P is `max`; else the next round
/// has at least twice the prompts, at least the largest `prompts_needed` of an inconclusive check
/// (all of `max` when one is unbounded), a whole number of first rounds, at most `max`. The first
/// round is `cfg.batch_size`, else one full default batch. Doubling keeps the rounds' total below
/// twice the last round's cost, or three times when the last is cut to `max`. `note` hears each
/// decision ([`AutoRound`]).
///
/// A library user runs it as `evaluate_auto(&cfg, max, &mut |c| evaluate_any(c, &mut |_| {}),
/// &mut |_| {})` ([`crate::evaluate_any`]); the CLI passes its progress display and prints the
/// notes.
pub fn evaluate_auto(
    cfg: &EvalConfig,
    max: usize,
    run_round: &mut dyn FnMut(&EvalConfig) -> Result<Evaluated, EvalError>,
    note: &mut dyn FnMut(AutoRound),
) -> Result<Evaluated, EvalError> {
    check_auto(cfg, max)?;
    let Some((path, thresholds)) = &cfg.gate else {
        return Err(EvalError::Internal("--prompts auto without thresholds passed its check".into()));
    };
    let step = cfg.batch_size.unwrap_or(FIRST_ROUND).clamp(1, max);
    let mut round = cfg.clone();
    round.prompts_up_to_set = true;
    let mut prompts = step;
    loop {
        round.prompts = Some(prompts);
        note(AutoRound::Start { prompts, max });
        let evaluated = run_round(&round)?;
        let Evaluated::Report(report) = &evaluated else {
            return Err(EvalError::Internal("--prompts auto made a part, not a report".into()));
        };
        if prompts >= max {
            return Ok(evaluated);
        }
        if report.workload.prompts < prompts {
            note(AutoRound::SetExhausted { prompts: report.workload.prompts });
            return Ok(evaluated);
        }
        let written: Report = serde_json::from_str(&report.to_json()?)
            .map_err(|e| EvalError::Internal(format!("a report does not read back from its JSON: {e}")))?;
        let outcome = qdrift_report::gate(&written, thresholds)
            .map_err(|source| EvalError::Gate { path: path.clone(), source })?;
        let open: Vec<_> = outcome.results.iter().filter(|r| r.verdict == Verdict::Inconclusive).collect();
        if open.is_empty() {
            note(AutoRound::Resolved { prompts });
            return Ok(evaluated);
        }
        let needed = open.iter().map(|r| r.prompts_needed()).try_fold(0u64, |m, n| n.map(|n| m.max(n)));
        let wanted = needed.map_or(max, |n| usize::try_from(n).unwrap_or(max)).max(2 * prompts);
        let next = wanted.div_ceil(step).saturating_mul(step).min(max);
        note(AutoRound::Inconclusive { open: open.len(), checks: outcome.results.len(), prompts, next });
        prompts = next;
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn gated() -> EvalConfig {
        let mut cfg = EvalConfig::new(PathBuf::from("model.bin"));
        let thresholds = qdrift_report::Thresholds::parse("[variant.int8]\n\"kld@10\" = { max = 4.5e-4 }\n");
        cfg.gate = thresholds.ok().map(|t| (PathBuf::from("thresholds.toml"), t));
        assert!(cfg.gate.is_some(), "the thresholds parse");
        cfg
    }

    #[test]
    fn what_rounds_cannot_repeat_is_refused_in_the_flags_words() {
        assert!(check_auto(&gated(), 16).is_ok());
        let message = |cfg: &EvalConfig, max| check_auto(cfg, max).map_err(|e| e.to_string()).err().unwrap_or_default();
        assert_eq!(message(&gated(), 0), "--max-prompts 0: a round needs at least one prompt");
        let ungated = EvalConfig::new(PathBuf::from("model.bin"));
        assert!(message(&ungated, 8).ends_with("give --gate thresholds.toml"), "{}", message(&ungated, 8));
        let mut sharded = gated();
        sharded.shard = "0/2".parse().ok();
        assert_eq!(message(&sharded, 8), "--prompts auto runs several rounds and cannot be combined with --shard");
        let mut saving = gated();
        saving.save_reference = Some(PathBuf::from("ref"));
        assert!(message(&saving, 8).ends_with("with --save-reference"), "{}", message(&saving, 8));
    }

    #[test]
    fn each_decision_is_one_line() {
        let shown = [
            AutoRound::Start { prompts: 4, max: 32 },
            AutoRound::Inconclusive { open: 1, checks: 1, prompts: 4, next: 8 },
            AutoRound::Resolved { prompts: 8 },
            AutoRound::SetExhausted { prompts: 5 },
        ]
        .map(|r| r.to_string());
        assert_eq!(
            shown,
            [
                "a round of 4 prompts (at most 32)",
                "1 of 1 checks inconclusive at 4 prompts; next round 8",
                "every check resolved at 8 prompts",
                "the eval set has 5 prompts, all of them used",
            ]
        );
    }
}
