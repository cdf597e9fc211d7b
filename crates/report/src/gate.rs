//! The check of `qdrift gate`: a report against a thresholds file, for CI. The command around it
//! (reading the files, writing the JUnit) is `command`.
//!
//! A thresholds file (TOML):
//!
//! ```toml
//! [defaults]
//! bound = "ci"            # "ci": the 95% interval's bound must clear the threshold; "point": the mean must
//! [variant."int4-g128"]
//! "token_match_rate@100" = { min = 0.80 }
//! "kld@1000" = { max = 0.05 }
//! "ppl_drift_of_generated_text@1000" = { max = 1.10, bound = "point" }   # per-check override
//! [variant."*"]
//! "top1_agreement@10" = { min = 0.95 }
//! "routing_flip_rate@1000" = { max = 0.1, optional = true }   # only where the report has it
//! ```
//!
//! Keys are `METRIC@HORIZON` with a metric of [`METRICS`](crate::metrics::METRICS) and a horizon of the report.
//! With `bound = "ci"`, `min` is compared with the interval's **lower** bound and `max` with its
//! **upper** bound (the metric must clear the threshold with 95% confidence); with `"point"` the
//! mean is compared. A check may have both `min` and `max`: each side is one outcome.
//!
//! A check of a metric the variant does not have (an optional metric: the routing metrics of a
//! dense model, the stopping metrics of a model without a stop token, a metric newer than the
//! report) refuses the file, exit 2, so that a typo never passes silently; with `optional = true`
//! the check is skipped for such a variant instead, so one file (the built-in profiles of
//! `profile`) gates dense models and models with experts alike.
//!
//! `variant."*"` applies to every variant of the report **except the noise floor** (kind
//! `noise_floor`): the noise floor is the yardstick, not a candidate, and has no
//! `excess_*` metrics; it can still be checked by naming it. A variant named explicitly and
//! matched by `"*"` gets both sets of checks.
//!
//! ## Three verdicts
//!
//! With `bound = "ci"` a check has three outcomes ([`Verdict`]): **pass** when the whole 95%
//! interval is on the right side of the threshold, **fail** when the whole interval is on the
//! wrong side, and **inconclusive** when the interval straddles the threshold: the run had too
//! few prompts to tell. (A threshold equal to a bound counts as on its side: `lo = min` passes.)
//! With `bound = "point"` only the mean is compared: pass or fail.
//!
//! For every `ci` check the outcome also gives the **minimum detectable effect** ([`CheckResult::mde`]):
//! the distance between the estimate and a threshold below which this run cannot resolve it,
//! the interval's half-width on the threshold's side (upper for a threshold above the mean,
//! lower for one below). An inconclusive check gives the number of prompts that would resolve
//! it ([`CheckResult::prompts_needed`]), assuming the interval narrows as `1/√prompts` (the
//! central-limit rate of a mean over prompts; an estimate, since the interval is a bootstrap's).
//!
//! Exit codes ([`exit_code`]): 0 every check passed, 1 some check failed, 3 none failed but some
//! were inconclusive, 2 the input is unusable ([`GateError`]: a missing or unreadable file, a
//! TOML error or unknown key, an unknown metric, horizon or variant, an `excess_*` metric on the
//! noise floor, another schema version, a check with neither `min` nor `max`, an unknown bound,
//! or a file that checks nothing).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::format::{plain, significant};
use crate::metrics::{metric, names, rank};
use crate::read::THRESHOLDS_CAP;
use crate::{Report, ReportError, Variant, VariantKind};
use qdrift_io::read_capped;

/// The section that applies to every variant but the noise floor.
pub const WILDCARD: &str = "*";

/// What a threshold is compared with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// The 95% interval's bound on the threshold's side (lower for `min`, upper for `max`).
    Ci,
    /// The point estimate (mean).
    Point,
}

impl Bound {
    fn parse(s: &str) -> Option<Bound> {
        match s {
            "ci" => Some(Bound::Ci),
            "point" => Some(Bound::Point),
            _ => None,
        }
    }
}

impl fmt::Display for Bound {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(match self {
            Bound::Ci => "ci",
            Bound::Point => "point",
        })
    }
}

/// Which side of the threshold the metric must stay on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The value must be ≥ the threshold.
    Min,
    /// The value must be ≤ the threshold.
    Max,
}

/// One check of a thresholds file, as written.
#[derive(Clone, Debug, PartialEq)]
pub struct Check {
    /// The variant's name, or [`WILDCARD`].
    pub variant: String,
    /// A name of [`METRICS`](crate::metrics::METRICS).
    pub metric: String,
    /// The horizon in tokens.
    pub horizon: usize,
    /// The smallest acceptable value.
    pub min: Option<f64>,
    /// The largest acceptable value.
    pub max: Option<f64>,
    /// The file's default bound unless the check overrides it.
    pub bound: Bound,
    /// `optional = true`: skipped for a variant that does not have the metric (a dense model's
    /// routing metrics), where a check without it refuses the file.
    pub optional: bool,
}

/// A parsed thresholds file. Checks are sorted by variant section, then metric in
/// [`METRICS`](crate::metrics::METRICS) order, then horizon (TOML tables have no order to keep).
#[derive(Clone, Debug, PartialEq)]
pub struct Thresholds {
    /// `[defaults] bound` (`ci` when absent).
    pub default_bound: Bound,
    /// Every check of every `[variant."NAME"]` section.
    pub checks: Vec<Check>,
}

/// Why a gate could not run: exit code 2. Every message is one line.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    /// The report could not be read (missing, not JSON, another schema version, invalid).
    #[error("{0}")]
    Report(#[from] ReportError),
    /// The thresholds file could not be read (missing, not a regular file, too large, not UTF-8).
    #[error("{0}")]
    ThresholdsFile(qdrift_io::IoError),
    /// The thresholds file is not UTF-8.
    #[error("{path}: the thresholds file is not UTF-8: {source}")]
    ThresholdsText {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::string::FromUtf8Error,
    },
    /// The thresholds file is not valid TOML or has a key the format does not know.
    #[error("{origin}:{line}:{column}: {message}")]
    Toml {
        /// The file, or `thresholds` for text parsed from memory.
        origin: String,
        /// 1-based line of the error.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The TOML parser's message (one line).
        message: String,
    },
    /// A `bound` that is neither `ci` nor `point`.
    #[error("{at}: bound = \"{value}\": expected \"ci\" or \"point\"")]
    UnknownBound {
        /// `[defaults]` or `variant."NAME" "KEY"`.
        at: String,
        /// The value given.
        value: String,
    },
    /// A check key that is not `METRIC@HORIZON`.
    #[error("{at}: a check is written \"METRIC@HORIZON\" (e.g. \"kld@100\")")]
    BadKey {
        /// `variant."NAME" "KEY"`.
        at: String,
    },
    /// A metric name `qdrift gate` does not know.
    #[error("{at}: unknown metric \"{metric}\"{}; known metrics: {}", did_you_mean(metric, crate::metrics::METRICS.iter().map(|m| m.name)), names())]
    UnknownMetric {
        /// `variant."NAME" "KEY"`.
        at: String,
        /// The name given.
        metric: String,
    },
    /// A check with neither `min` nor `max`.
    #[error("{at}: a check needs `min`, `max` or both")]
    NoLimit {
        /// `variant."NAME" "KEY"`.
        at: String,
    },
    /// A threshold that is NaN or infinite, or `min > max`.
    #[error("{at}: {why}")]
    BadLimit {
        /// `variant."NAME" "KEY"`.
        at: String,
        /// What is wrong.
        why: String,
    },
    /// A horizon the report does not have.
    #[error("{at}: the report has no horizon {horizon}; its horizons: {}", list(known))]
    UnknownHorizon {
        /// `variant."NAME" "KEY"`.
        at: String,
        /// The horizon given.
        horizon: usize,
        /// The report's horizons.
        known: Vec<usize>,
    },
    /// A variant the report does not have.
    #[error("variant.\"{name}\": the report has no such variant{}; its variants: {}", did_you_mean(name, known.iter().map(String::as_str)), list(known))]
    UnknownVariant {
        /// The name given.
        name: String,
        /// The report's variants.
        known: Vec<String>,
    },
    /// An `excess_*` metric on the noise floor, which has none.
    #[error("{at}: {variant} is the noise floor; excess over the noise floor is not defined for it")]
    ExcessOnNoiseFloor {
        /// `variant."NAME" "KEY"`.
        at: String,
        /// The noise floor's name.
        variant: String,
    },
    /// No check applies to the report: a gate that checks nothing would pass anything.
    #[error(
        "the thresholds file checks nothing in this report (no [variant.\"NAME\"] checks, or only \
         [variant.\"*\"] checks and no variant but the noise floor)"
    )]
    NoChecks,
}

/// ` (did you mean X?)` for the one of `known` that `given` probably meant: the shortest that
/// starts with it (`token_match` → `token_match_rate`), else the closest, case aside, at most two
/// edits or a third of its length away; else nothing.
pub(crate) fn did_you_mean<'a>(given: &str, known: impl Iterator<Item = &'a str>) -> String {
    let lower = given.to_lowercase();
    let known: Vec<&str> = known.filter(|k| *k != given).collect();
    let prefixed =
        known.iter().filter(|k| lower.len() >= 4 && k.to_lowercase().starts_with(&lower)).min_by_key(|k| k.len());
    let closest = || {
        known
            .iter()
            .map(|k| (strsim::levenshtein(&lower, &k.to_lowercase()), k))
            .filter(|(d, _)| *d <= 2.max(given.chars().count() / 3))
            .min_by_key(|(d, _)| *d)
            .map(|(_, k)| k)
    };
    prefixed.or_else(closest).map_or_else(String::new, |k| format!(" (did you mean {}?)", plain(k)))
}

fn list<T: fmt::Display>(xs: &[T]) -> String {
    if xs.is_empty() {
        return "none".into();
    }
    xs.iter().map(|x| plain(&x.to_string())).collect::<Vec<_>>().join(", ")
}

fn at(variant: &str, key: &str) -> String {
    format!("variant.\"{}\" \"{}\"", plain(variant), plain(key))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    defaults: Defaults,
    #[serde(default)]
    variant: BTreeMap<String, BTreeMap<String, CheckFile>>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Defaults {
    bound: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckFile {
    min: Option<f64>,
    max: Option<f64>,
    bound: Option<String>,
    #[serde(default)]
    optional: bool,
}

/// 1-based line and column of byte `offset` in `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset.min(text.len())).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// The first line of `text` whose key is bare and holds an `@` (`kld@100 = { max = 0.01 }`), as
/// it must be written: `"kld@100" = { max = 0.01 }` (shortened when long).
fn quoted_at_key(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let line = line.trim();
        if line.starts_with(['#', '[', '"', '\'']) {
            return None;
        }
        let (key, rest) = line.split_once('=')?;
        let key = key.trim();
        let bare = !key.contains(['"', '\'']);
        (bare && key.contains('@')).then(|| qdrift_io::elide(&format!("\"{key}\" = {}", rest.trim())).into_owned())
    })
}

impl Thresholds {
    /// Parses a thresholds file's text; `origin` names it in errors.
    pub fn parse_named(text: &str, origin: &str) -> Result<Thresholds, GateError> {
        let file: File = toml::from_str(text).map_err(|e| {
            let (line, column) = e.span().map_or((1, 1), |s| line_column(text, s.start));
            let mut message = e.message().split_whitespace().collect::<Vec<_>>().join(" ");
            // toml's own message ("invalid unquoted key") does not say that `@` is the cause.
            if let Some(quoted) = quoted_at_key(text) {
                message.push_str(&format!("; keys with @ must be quoted: {quoted}"));
            }
            GateError::Toml { origin: origin.to_string(), line, column, message }
        })?;
        let default_bound = match &file.defaults.bound {
            None => Bound::Ci,
            Some(b) => {
                Bound::parse(b).ok_or_else(|| GateError::UnknownBound { at: "[defaults]".into(), value: plain(b) })?
            }
        };
        let mut checks = Vec::new();
        for (variant, entries) in &file.variant {
            for (key, c) in entries {
                let at = at(variant, key);
                let (name, horizon) = key.rsplit_once('@').ok_or_else(|| GateError::BadKey { at: at.clone() })?;
                if metric(name).is_none() {
                    return Err(GateError::UnknownMetric { at, metric: plain(name) });
                }
                let horizon: usize = horizon.parse().map_err(|_| GateError::BadKey { at: at.clone() })?;
                let bound = match &c.bound {
                    None => default_bound,
                    Some(b) => {
                        Bound::parse(b).ok_or_else(|| GateError::UnknownBound { at: at.clone(), value: plain(b) })?
                    }
                };
                if c.min.is_none() && c.max.is_none() {
                    return Err(GateError::NoLimit { at });
                }
                for (side, x) in [("min", c.min), ("max", c.max)] {
                    if let Some(x) = x
                        && !x.is_finite()
                    {
                        return Err(GateError::BadLimit { at, why: format!("{side} = {x} is not a finite number") });
                    }
                }
                if let (Some(lo), Some(hi)) = (c.min, c.max)
                    && lo > hi
                {
                    return Err(GateError::BadLimit { at, why: format!("min = {lo} > max = {hi}: no value passes") });
                }
                checks.push(Check {
                    variant: variant.clone(),
                    metric: name.to_string(),
                    horizon,
                    min: c.min,
                    max: c.max,
                    bound,
                    optional: c.optional,
                });
            }
        }
        let metric_rank = |m: &str| rank(m).unwrap_or(usize::MAX);
        checks.sort_by(|a, b| {
            (a.variant == WILDCARD, &a.variant, metric_rank(&a.metric), a.horizon).cmp(&(
                b.variant == WILDCARD,
                &b.variant,
                metric_rank(&b.metric),
                b.horizon,
            ))
        });
        Ok(Thresholds { default_bound, checks })
    }

    /// Parses a thresholds file's text.
    pub fn parse(text: &str) -> Result<Thresholds, GateError> {
        Thresholds::parse_named(text, "thresholds")
    }

    /// Reads and parses a thresholds file: only a regular file of at most [`THRESHOLDS_CAP`]
    /// bytes ([`read_capped`]).
    pub fn read(path: &Path) -> Result<Thresholds, GateError> {
        let bytes = read_capped(path, THRESHOLDS_CAP, "thresholds file").map_err(GateError::ThresholdsFile)?;
        let text = String::from_utf8(bytes)
            .map_err(|source| GateError::ThresholdsText { path: path.to_path_buf(), source })?;
        Thresholds::parse_named(&text, &path.display().to_string())
    }
}

/// The outcome of one check: see the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The compared value is on the right side of the threshold (equal passes).
    Pass,
    /// The compared value is on the wrong side; with `bound = "ci"`, the whole interval is.
    Fail,
    /// `bound = "ci"` only: the interval straddles the threshold.
    Inconclusive,
}

impl Verdict {
    /// `PASS`, `FAIL` or `INCONCLUSIVE`.
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::Inconclusive => "INCONCLUSIVE",
        }
    }
}

/// The outcome of one side of one check on one variant.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckResult {
    /// The variant checked.
    pub variant: String,
    /// The section of the thresholds file the check came from (the variant's name or `*`).
    pub section: String,
    /// The metric's gate name.
    pub metric: String,
    /// The horizon in tokens.
    pub horizon: usize,
    /// What was compared.
    pub bound: Bound,
    /// Which side: `min` (value ≥ threshold) or `max` (value ≤ threshold).
    pub side: Side,
    /// The threshold.
    pub threshold: f64,
    /// The value compared: the lower or upper interval bound, or the mean.
    pub value: f64,
    /// The metric's estimate.
    pub mean: f64,
    /// The metric's 95% interval.
    pub ci95: [f64; 2],
    /// The run's prompt count (`workload.prompts`).
    pub prompts: usize,
    /// Pass, fail or inconclusive.
    pub verdict: Verdict,
    /// Whether the check also has the other side (then the JUnit name says which side).
    pub two_sided: bool,
    /// The variant's failure, when it failed (its values are then NaN and the check fails).
    pub failure: Option<String>,
}

impl CheckResult {
    /// Whether the check passed.
    pub fn passed(&self) -> bool {
        self.verdict == Verdict::Pass
    }

    /// `lower CI bound`, `upper CI bound` or `mean`.
    pub fn value_kind(&self) -> &'static str {
        match (self.bound, self.side) {
            (Bound::Point, _) => "mean",
            (Bound::Ci, Side::Min) => "lower CI bound",
            (Bound::Ci, Side::Max) => "upper CI bound",
        }
    }

    /// `min ≥ 0.8` or `max ≤ 0.05`.
    pub fn threshold_text(&self) -> String {
        match self.side {
            Side::Min => format!("min ≥ {}", self.threshold),
            Side::Max => format!("max ≤ {}", self.threshold),
        }
    }

    /// `METRIC@H`, plus ` (min)`/` (max)` for one side of a two-sided check.
    pub fn name(&self) -> String {
        let side = match (self.two_sided, self.side) {
            (false, _) => "",
            (true, Side::Min) => " (min)",
            (true, Side::Max) => " (max)",
        };
        format!("{}@{}{side}", self.metric, self.horizon)
    }

    /// The minimum detectable effect of a `ci` check (`None` for `point`): the interval's
    /// half-width on the threshold's side of the estimate, `hi − mean` for a threshold at or
    /// above the mean and `mean − lo` below it. A threshold farther than this from the estimate
    /// is resolved (pass or fail) at this run's prompt count; a nearer one is inconclusive.
    pub fn mde(&self) -> Option<f64> {
        if self.failure.is_some() {
            return None;
        }
        match self.bound {
            Bound::Point => None,
            Bound::Ci if self.threshold >= self.mean => Some(self.ci95[1] - self.mean),
            Bound::Ci => Some(self.mean - self.ci95[0]),
        }
    }

    /// For an inconclusive check, the prompt count whose interval would resolve it:
    /// `⌈prompts · (mde / |mean − threshold|)²⌉`, the interval's half-width scaled as
    /// `1/√prompts`. `None` when the check is resolved, and when the estimate equals the
    /// threshold (no prompt count resolves it).
    pub fn prompts_needed(&self) -> Option<u64> {
        if self.verdict != Verdict::Inconclusive {
            return None;
        }
        let distance = (self.mean - self.threshold).abs();
        let mde = self.mde()?;
        // Less a relative 1e-12, so that the rounding of `hi − mean` (0.90 − 0.85 is
        // 0.05000000000000004) does not ask for one prompt more than the exact ratio does.
        let needed = (self.prompts as f64 * (mde / distance).powi(2) * (1.0 - 1e-12)).ceil();
        // Zero distance gives infinity, and an f64 past u64 saturates: both are "no count".
        (needed.is_finite() && needed < u64::MAX as f64).then_some((needed as u64).max(self.prompts as u64 + 1))
    }

    /// The outcome line:
    /// `PASS|FAIL|INCONCLUSIVE VARIANT METRIC@H bound=ci|point value=X (WHICH) threshold=min ≥ T|max ≤ T`,
    /// then for a `ci` check ` ci95=[lo, hi] mde=D`, and for an inconclusive one
    /// ` prompts=N prompts_needed=M` (or `prompts_needed=unbounded`). The threshold is printed
    /// as written; the value, the interval and the MDE to four significant digits
    /// (`value=0.55`, `mde=6.252e-5`), and the value and interval with as many more as it takes
    /// to show which side of the threshold they are on (a `0.8000004` failing `max ≤ 0.8` is
    /// not printed `0.8`).
    pub fn line(&self) -> String {
        if let Some(failure) = &self.failure {
            return format!(
                "{} {} {}@{} the variant failed: {}",
                self.verdict.word(),
                plain(&self.variant),
                self.metric,
                self.horizon,
                plain(failure)
            );
        }
        let mut line = format!(
            "{} {} {}@{} bound={} value={} ({}) threshold={}",
            self.verdict.word(),
            plain(&self.variant),
            self.metric,
            self.horizon,
            self.bound,
            beside(self.value, self.threshold),
            self.value_kind(),
            self.threshold_text()
        );
        if let Some(mde) = self.mde() {
            let [lo, hi] = self.ci95.map(|x| beside(x, self.threshold));
            line.push_str(&format!(" ci95=[{lo}, {hi}] mde={}", significant(mde, 4)));
        }
        if self.verdict == Verdict::Inconclusive {
            match self.prompts_needed() {
                Some(n) => line.push_str(&format!(" prompts={} prompts_needed={n}", self.prompts)),
                None => line.push_str(&format!(" prompts={} prompts_needed=unbounded", self.prompts)),
            }
        }
        line
    }
}

/// `x` to four significant digits, or more until the printed number lies on the same side of
/// `threshold` as `x` (or on it, when `x` is): a gate line never shows a value equal to the
/// threshold it failed, nor one that reads as passing.
fn beside(x: f64, threshold: f64) -> String {
    (4..=17)
        .map(|digits| significant(x, digits))
        .find(|s| s.parse::<f64>().is_ok_and(|y| y.partial_cmp(&threshold) == x.partial_cmp(&threshold)))
        .unwrap_or_else(|| x.to_string())
}

/// Every check's outcome, in the report's variant order.
#[derive(Clone, Debug, PartialEq)]
pub struct GateOutcome {
    /// One entry per side of each check per variant it applies to.
    pub results: Vec<CheckResult>,
}

impl GateOutcome {
    /// Whether every check passed.
    pub fn passed(&self) -> bool {
        self.results.iter().all(|r| r.passed())
    }

    /// The checks that failed.
    pub fn failures(&self) -> impl Iterator<Item = &CheckResult> {
        self.results.iter().filter(|r| r.verdict == Verdict::Fail)
    }

    /// The checks that were inconclusive.
    pub fn inconclusive(&self) -> impl Iterator<Item = &CheckResult> {
        self.results.iter().filter(|r| r.verdict == Verdict::Inconclusive)
    }

    /// How many checks had verdict `v`.
    pub fn count(&self, v: Verdict) -> usize {
        self.results.iter().filter(|r| r.verdict == v).count()
    }

    /// The whole gate's verdict: fail if any check failed, else inconclusive if any was, else
    /// pass.
    pub fn verdict(&self) -> Verdict {
        worst(self.results.iter()).unwrap_or(Verdict::Pass)
    }

    /// The process exit code of the outcome: 0 pass, 1 fail, 3 inconclusive ([`exit_code`]).
    pub fn exit_code(&self) -> u8 {
        match self.verdict() {
            Verdict::Pass => 0,
            Verdict::Fail => 1,
            Verdict::Inconclusive => INCONCLUSIVE_EXIT,
        }
    }

    /// The verdict of the checks on variant `name`, `None` when none applies to it.
    pub fn variant_verdict(&self, name: &str) -> Option<Verdict> {
        worst(self.results.iter().filter(|r| r.variant == name))
    }

    /// One outcome line per check, then a total line, each ending in a newline.
    pub fn lines(&self) -> String {
        let mut out = String::new();
        for r in &self.results {
            out.push_str(&r.line());
            out.push('\n');
        }
        let (failed, inconclusive) = (self.count(Verdict::Fail), self.count(Verdict::Inconclusive));
        out.push_str(&format!(
            "gate: {} checks, {} passed, {failed} failed, {inconclusive} inconclusive: {}\n",
            self.results.len(),
            self.results.len() - failed - inconclusive,
            self.verdict().word()
        ));
        out
    }
}

/// The verdict of `results` together: fail over inconclusive over pass; `None` for no results.
fn worst<'a>(results: impl Iterator<Item = &'a CheckResult>) -> Option<Verdict> {
    let rank = |v: Verdict| match v {
        Verdict::Pass => 0,
        Verdict::Inconclusive => 1,
        Verdict::Fail => 2,
    };
    results.map(|r| r.verdict).max_by_key(|&v| rank(v))
}

/// Checks `report` against `thresholds`. Every check is resolved against the report before any
/// is evaluated, so an unusable thresholds file is an error, never a partial outcome.
pub fn gate(report: &Report, thresholds: &Thresholds) -> Result<GateOutcome, GateError> {
    report.validate()?;
    let known_variants = || report.variants.iter().map(|v| v.name.clone()).collect::<Vec<_>>();
    for c in &thresholds.checks {
        if c.variant != WILDCARD && report.variant(&c.variant).is_none() {
            return Err(GateError::UnknownVariant { name: plain(&c.variant), known: known_variants() });
        }
        if !report.workload.horizons.contains(&c.horizon) {
            return Err(GateError::UnknownHorizon {
                at: at(&c.variant, &format!("{}@{}", c.metric, c.horizon)),
                horizon: c.horizon,
                known: report.workload.horizons.clone(),
            });
        }
    }
    let mut results = Vec::new();
    for v in &report.variants {
        let is_floor = v.kind == VariantKind::NoiseFloor;
        let applies = thresholds
            .checks
            .iter()
            .filter(|c| c.variant == v.name)
            .chain(thresholds.checks.iter().filter(|c| c.variant == WILDCARD && !is_floor));
        for c in applies {
            results.extend(check_variant(report, v, c)?);
        }
    }
    if results.is_empty() {
        return Err(GateError::NoChecks);
    }
    Ok(GateOutcome { results })
}

/// The outcomes of check `c` on variant `v` of `report`, one per side; none for an `optional`
/// check of a metric the variant lacks (for a variant that failed, and so has no metrics: one
/// no variant of the report has at that horizon).
fn check_variant(report: &Report, v: &Variant, c: &Check) -> Result<Vec<CheckResult>, GateError> {
    let key = format!("{}@{}", c.metric, c.horizon);
    if v.kind == VariantKind::NoiseFloor && metric(&c.metric).is_some_and(|m| m.is_excess()) {
        return Err(GateError::ExcessOnNoiseFloor { at: at(&c.variant, &key), variant: plain(&v.name) });
    }
    let sides = [(Side::Min, c.min), (Side::Max, c.max)];
    let sides = sides.into_iter().filter_map(|(s, t)| t.map(|t| (s, t)));
    // A variant that failed fails every check that applies to it, with NaN values.
    let nan = f64::NAN;
    let base = CheckResult {
        variant: v.name.clone(),
        section: c.variant.clone(),
        metric: c.metric.clone(),
        horizon: c.horizon,
        bound: c.bound,
        side: Side::Min,
        threshold: nan,
        value: nan,
        mean: nan,
        ci95: [nan, nan],
        prompts: report.workload.prompts,
        verdict: Verdict::Fail,
        two_sided: c.min.is_some() && c.max.is_some(),
        failure: v.failure.clone(),
    };
    if v.failure.is_some() {
        let anywhere =
            report.variants.iter().any(|w| w.horizon(c.horizon).is_some_and(|h| h.metric(&c.metric).is_some()));
        if c.optional && !anywhere {
            return Ok(Vec::new());
        }
        return Ok(sides.map(|(side, threshold)| CheckResult { side, threshold, ..base.clone() }).collect());
    }
    let horizon = v.horizon(c.horizon).ok_or_else(|| GateError::UnknownHorizon {
        at: at(&c.variant, &key),
        horizon: c.horizon,
        known: v.horizons.iter().map(|h| h.tokens).collect(),
    })?;
    let Some(m) = horizon.metric(&c.metric) else {
        if c.optional {
            return Ok(Vec::new());
        }
        // A known metric without a value: an excess missing from a variant that is not the
        // noise floor, or an optional metric the report was written without.
        return Err(GateError::Report(ReportError::Invalid(format!(
            "variant {}: the report has no {key} (a check of a metric some reports lack can say optional = true)",
            plain(&v.name)
        ))));
    };
    Ok(sides
        .map(|(side, threshold)| {
            let value = match (c.bound, side) {
                (Bound::Point, _) => m.mean,
                (Bound::Ci, Side::Min) => m.ci95[0],
                (Bound::Ci, Side::Max) => m.ci95[1],
            };
            let passed = match side {
                Side::Min => value >= threshold,
                Side::Max => value <= threshold,
            };
            // The interval's other bound on the wrong side too: a fail; else it straddles.
            let verdict = match (passed, c.bound, side) {
                (true, _, _) => Verdict::Pass,
                (false, Bound::Point, _) => Verdict::Fail,
                (false, Bound::Ci, Side::Min) if m.ci95[1] < threshold => Verdict::Fail,
                (false, Bound::Ci, Side::Max) if m.ci95[0] > threshold => Verdict::Fail,
                (false, Bound::Ci, _) => Verdict::Inconclusive,
            };
            CheckResult { side, threshold, value, mean: m.mean, ci95: m.ci95, verdict, ..base.clone() }
        })
        .collect())
}

/// The process exit code of a gate: 0 every check passed, 1 a check failed, 3 none failed and
/// some were inconclusive, 2 unusable input.
pub fn exit_code(outcome: &Result<GateOutcome, GateError>) -> u8 {
    outcome.as_ref().map_or(2, GateOutcome::exit_code)
}

/// The exit code of a gate whose checks did not fail but some were inconclusive.
pub const INCONCLUSIVE_EXIT: u8 = 3;
