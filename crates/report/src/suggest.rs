//! `qdrift thresholds suggest`: a thresholds file written from a known-good report, so that a
//! team records "today's artifact" and gates future ones against it.
//!
//! Each suggested check is the report's 95% interval bound on the side a regression moves, widened
//! by a relative margin `m`:
//!
//! - a metric where lower is better (KLD, routing flips): `max = hi + m·|hi|`;
//! - higher is better (token match, top-1 agreement): `min = lo − m·|lo|`;
//! - closer to 1 is better (perplexity ratios): a band around 1, `1 ± d·(1 + m)` with `d` the
//!   interval's largest distance from 1, `max(|lo − 1|, |hi − 1|)` (a later run drifting as far the
//!   other way passes too);
//!
//! each rounded outward to three significant digits and clamped to the metric's range. A side no
//! value in the metric's range can fail (a rate's `min = 0`, its `max = 1`, a ratio's band reaching
//! 0) is left out, with a comment saying so: a check that cannot fail would read as a guard and
//! guard nothing. The file uses `bound = "ci"`, so the report it came from
//! passes every check (its bound is within its own threshold, margin 0 included), and a later run
//! passes only where its own interval clears the threshold: a later artifact that is as good
//! passes, one whose interval reaches past the margin fails or is inconclusive.
//!
//! `--variant NAME` suggests for one variant (the noise floor too, when named); `--as SECTION`
//! writes its checks as `[variant."SECTION"]`, so that a CI thresholds file for its candidate
//! (or `*`) can be made from any variant of a known-good report.

use std::fmt::Write as _;

use crate::format::plain;
use crate::gate::Side;
use crate::metrics::{Better, Metric, Range, metric};
use crate::{Estimate, Report, Variant, VariantKind};

/// What to suggest checks for.
#[derive(Clone, Debug, Default)]
pub struct SuggestOptions {
    /// The relative margin `m ≥ 0` (0.1: 10% of the bound, or of its distance from 1).
    pub margin: f64,
    /// The metrics to check (registry names); empty: those the terminal summary shows
    /// ([`Metric::summary`]) that the report has.
    pub metrics: Vec<String>,
    /// The horizons to check; empty: every horizon of the report.
    pub horizons: Vec<usize>,
    /// The one variant to suggest checks for (`--variant`); `None`: every variant but the noise
    /// floor.
    pub variant: Option<String>,
    /// The section the checks are written under (`--as`: `[variant."SECTION"]`) instead of the
    /// variant's own name; needs one variant, named or the report's only one but the noise floor.
    pub section: Option<String>,
}

/// Why no thresholds could be suggested: one line, exit 2.
#[derive(Debug, thiserror::Error)]
pub enum SuggestError {
    /// A margin that is negative, NaN or infinite.
    #[error("--margin {0}: expected a finite number ≥ 0 (0.1 widens each bound by 10%)")]
    Margin(f64),
    /// A metric the registry does not know.
    #[error("unknown metric \"{0}\"; known metrics: {known}", known = crate::metrics::names())]
    UnknownMetric(String),
    /// A horizon the report does not have.
    #[error("the report has no horizon {horizon}; its horizons: {known:?}")]
    UnknownHorizon {
        /// The horizon given.
        horizon: usize,
        /// The report's horizons.
        known: Vec<usize>,
    },
    /// A metric no variant of the report has (an optional metric of a newer qdrift, a routing
    /// metric of a dense model).
    #[error("no variant of the report has {0}")]
    Absent(String),
    /// The report has no variant but the noise floor.
    #[error("the report has no variant but the noise floor: nothing to gate")]
    NoVariants,
    /// `--variant` names a variant the report does not have.
    #[error("--variant \"{name}\": the report has no such variant; its variants: {known}")]
    UnknownVariant {
        /// The name given.
        name: String,
        /// The report's variants, comma-separated.
        known: String,
    },
    /// `--variant` names a variant that failed: it has no metrics.
    #[error("--variant \"{name}\": the variant failed in this report ({why}), so it has no metrics to suggest from")]
    FailedVariant {
        /// The variant.
        name: String,
        /// Its failure.
        why: String,
    },
    /// `--as` with several variants to suggest for.
    #[error("--as writes one variant's checks, and the report has several ({known}): name one with --variant")]
    SectionNeedsOneVariant {
        /// The candidate variants, comma-separated.
        known: String,
    },
    /// `--as ""`.
    #[error("--as \"\": a section needs a name (a variant's name, or * for every variant but the noise floor)")]
    EmptySection,
    /// Every suggested side is one no value can fail: the file would check nothing.
    #[error(
        "every suggested check is one no value in its metric's range can fail (the intervals reach the ends of their \
         ranges): nothing to gate"
    )]
    NothingToCheck,
}

/// The thresholds of [`SuggestOptions`] for the chosen variants of `report` (by default every
/// variant but the noise floor), as the text of a thresholds file (TOML), deterministic.
/// `source` names the report in the header comment.
pub fn suggest_thresholds(report: &Report, options: &SuggestOptions, source: &str) -> Result<String, SuggestError> {
    let m = options.margin;
    if !(m.is_finite() && m >= 0.0) {
        return Err(SuggestError::Margin(m));
    }
    let horizons = chosen_horizons(report, options)?;
    let metrics = chosen_metrics(report, options)?;
    let variants = chosen_variants(report, options)?;
    let mut out = header(report, options, source, &horizons);
    let mut checks = 0;
    for v in variants {
        let section = options.section.as_deref().unwrap_or(&v.name);
        let _ = write!(out, "\n[variant.{}]\n", toml_string(section));
        if let Some(why) = &v.failure {
            let _ = writeln!(out, "# {} failed in this report ({}): no checks", plain(&v.name), plain(why));
            continue;
        }
        for x in &metrics {
            for &h in &horizons {
                let Some(e) = v.horizon(h).and_then(|hm| hm.get(x)) else { continue };
                checks += write_check(&mut out, x, h, e, m);
            }
        }
    }
    if checks == 0 {
        return Err(SuggestError::NothingToCheck);
    }
    Ok(out)
}

/// The horizons of `options`, each one of the report's; empty: all of them.
fn chosen_horizons(report: &Report, options: &SuggestOptions) -> Result<Vec<usize>, SuggestError> {
    let known = &report.workload.horizons;
    if let Some(&h) = options.horizons.iter().find(|h| !known.contains(h)) {
        return Err(SuggestError::UnknownHorizon { horizon: h, known: known.clone() });
    }
    Ok(if options.horizons.is_empty() { known.clone() } else { options.horizons.clone() })
}

/// The metrics of `options`, each one some variant has; empty: the summary's metrics the report
/// has.
fn chosen_metrics(report: &Report, options: &SuggestOptions) -> Result<Vec<&'static Metric>, SuggestError> {
    let present = |m: &Metric| report.variants.iter().any(|v| v.horizons.iter().any(|h| h.get(m).is_some()));
    if options.metrics.is_empty() {
        return Ok(crate::metrics::METRICS.iter().filter(|x| x.summary && present(x)).collect());
    }
    let mut chosen = Vec::new();
    for name in &options.metrics {
        let x = metric(name).ok_or_else(|| SuggestError::UnknownMetric(plain(name)))?;
        if !present(x) {
            return Err(SuggestError::Absent(x.name.to_string()));
        }
        chosen.push(x);
    }
    Ok(chosen)
}

/// The variants to suggest for: the one `--variant` names (refused when it failed), else every
/// variant but the noise floor; one only when `--as` names the section.
fn chosen_variants<'a>(report: &'a Report, options: &SuggestOptions) -> Result<Vec<&'a Variant>, SuggestError> {
    if options.section.as_deref() == Some("") {
        return Err(SuggestError::EmptySection);
    }
    let chosen: Vec<&Variant> = match &options.variant {
        Some(name) => {
            let v = report.variant(name).ok_or_else(|| SuggestError::UnknownVariant {
                name: plain(name),
                known: names(report.variants.iter()),
            })?;
            if let Some(why) = &v.failure {
                return Err(SuggestError::FailedVariant { name: plain(name), why: plain(why) });
            }
            vec![v]
        }
        None => report.variants.iter().filter(|v| v.kind != VariantKind::NoiseFloor).collect(),
    };
    match chosen.len() {
        0 => Err(SuggestError::NoVariants),
        1 => Ok(chosen),
        _ if options.section.is_some() => {
            Err(SuggestError::SectionNeedsOneVariant { known: names(chosen.iter().copied()) })
        }
        _ => Ok(chosen),
    }
}

/// The variants' names, comma-separated, for messages.
fn names<'a>(variants: impl Iterator<Item = &'a Variant>) -> String {
    variants.map(|v| plain(&v.name)).collect::<Vec<_>>().join(", ")
}

/// The file's opening comments and `[defaults]`: the command, the report and its workload, and
/// what each check means.
fn header(report: &Report, options: &SuggestOptions, source: &str, horizons: &[usize]) -> String {
    let m = options.margin;
    let mut flags = format!("--margin {m}");
    for (flag, value) in [("--variant", &options.variant), ("--as", &options.section)] {
        if let Some(v) = value {
            let _ = write!(flags, " {flag} {}", plain(v));
        }
    }
    let w = &report.workload;
    format!(
        "# Suggested by `qdrift thresholds suggest {flags}` from {} ({} prompts, seed {}, horizons {:?}).\n\
         # Each check is that report's 95% interval bound on the side a regression moves, widened by the\n\
         # margin: max = hi + {m}·|hi|, min = lo − {m}·|lo| (perplexity ratios: 1 ± the farthest bound's distance from 1, widened).\n\
         # A side no value of the metric can fail is left out. A later run with the same eval set, prompt\n\
         # count and seed passes where its own interval clears the threshold; a straddled threshold is\n\
         # inconclusive (exit 3): see README, Choosing thresholds.\n\
         [defaults]\nbound = \"ci\"\n",
        plain(source),
        w.prompts,
        w.seed,
        horizons
    )
}

/// Writes the check of metric `x` at horizon `h` from its estimate `e` with margin `m`: its
/// sides that can fail as one line, each side that cannot as a comment. Returns the number of
/// sides written as checks.
fn write_check(out: &mut String, x: &Metric, h: usize, e: &Estimate, m: f64) -> usize {
    let (kept, dropped): (Vec<_>, Vec<_>) =
        sides(x, e, m).into_iter().partition(|&(side, t)| can_fail(x.range, side, t));
    for &(side, t) in &dropped {
        let _ = writeln!(
            out,
            "# \"{}@{h}\" {} = {} left out: every value of {} ({}) passes it",
            x.name,
            key(side),
            toml_float(t),
            x.name,
            x.range.describe()
        );
    }
    if !kept.is_empty() {
        let limits: Vec<String> = kept.iter().map(|&(side, t)| format!("{} = {}", key(side), toml_float(t))).collect();
        let _ = writeln!(out, "\"{}@{h}\" = {{ {} }}", x.name, limits.join(", "));
    }
    kept.len()
}

/// The suggested `min` and `max` of metric `x` from its estimate `e` with margin `m` (see the
/// module docs), each rounded outward and clamped to the metric's range.
fn sides(x: &Metric, e: &Estimate, m: f64) -> Vec<(Side, f64)> {
    let [lo, hi] = e.ci95;
    let (min, max) = match x.better {
        Better::Lower => (None, Some(hi + m * hi.abs())),
        Better::Higher => (Some(lo - m * lo.abs()), None),
        Better::NearOne => {
            let d = (lo - 1.0).abs().max((hi - 1.0).abs()) * (1.0 + m);
            (Some(1.0 - d), Some(1.0 + d))
        }
    };
    [(Side::Min, min, false), (Side::Max, max, true)]
        .into_iter()
        .filter_map(|(side, t, up)| Some((side, clamp_to(x.range, round_outward(t?, up)))))
        .collect()
}

/// Whether some value in `range` fails the `side` threshold `t`: a `min` above the range's
/// smallest value, a `max` below its largest.
fn can_fail(range: Range, side: Side, t: f64) -> bool {
    let (lowest, highest) = range.bounds();
    match side {
        Side::Min => t > lowest,
        Side::Max => t < highest,
    }
}

/// The key of a side in a thresholds file.
fn key(side: Side) -> &'static str {
    match side {
        Side::Min => "min",
        Side::Max => "max",
    }
}

/// `x` to three significant digits, rounded up (`up`) or down, never towards the bound it
/// widens: `0.00049359…` up is `0.000494`. Readable, and the report still passes its own file.
fn round_outward(x: f64, up: bool) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let exponent = x.abs().log10().floor() as i32 - 2;
    // Dividing or multiplying an integer by an exact power of ten rounds once, to the nearest
    // double of the decimal, which then prints as that decimal.
    let at = |digits: f64| {
        if exponent < 0 { digits / 10f64.powi(-exponent) } else { digits * 10f64.powi(exponent) }
    };
    let scaled = if exponent < 0 { x * 10f64.powi(-exponent) } else { x / 10f64.powi(exponent) };
    let mut digits = if up { scaled.ceil() } else { scaled.floor() };
    // The scaling itself rounds: step once more if the result landed on the wrong side.
    if up && at(digits) < x {
        digits += 1.0;
    }
    if !up && at(digits) > x {
        digits -= 1.0;
    }
    at(digits)
}

/// `t` inside the metric's range: a rate within `[0, 1]`, a divergence or ratio not below 0.
fn clamp_to(range: Range, t: f64) -> f64 {
    match range {
        Range::Unit => t.clamp(0.0, 1.0),
        Range::NonNegative | Range::Positive => t.max(0.0),
        Range::Any => t,
    }
}

/// A float as TOML writes it: the shortest form that reads back as the same `f64`, with a
/// decimal point (TOML's `1` is an integer; the gate reads both, this keeps the file uniform).
fn toml_float(x: f64) -> String {
    let s = format!("{x:?}");
    if s.contains(['.', 'e', 'E']) || !x.is_finite() { s } else { format!("{s}.0") }
}

/// A TOML basic string: quoted, with `"` and `\` and control characters escaped. Written here
/// because the workspace builds `toml` without its writer (`display`) feature, for one string per
/// section; the tests read it back with the `toml` parser.
fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_outward_to_three_digits() {
        assert_eq!(round_outward(0.0004935992198046226, true), 0.000494);
        assert_eq!(round_outward(0.36083671875000006, false), 0.36);
        assert_eq!(round_outward(0.8521874999999999, false), 0.852);
        assert_eq!(round_outward(1.0375, true), 1.04);
        assert_eq!(round_outward(123456.0, true), 124000.0);
        assert_eq!(round_outward(-0.01234, false), -0.0124);
        assert_eq!(round_outward(0.5, true), 0.5);
        assert_eq!(round_outward(0.0, true), 0.0);
        for x in [1e-7, 3.3e-3, 0.123456, 0.9999, 7.77777, 1234.5678] {
            assert!(round_outward(x, true) >= x && round_outward(x, false) <= x, "{x}");
        }
    }

    #[test]
    fn floats_and_strings_are_toml() {
        assert_eq!(toml_float(1.0), "1.0");
        assert_eq!(toml_float(0.05), "0.05");
        assert_eq!(toml_float(1e-5), "1e-5");
        assert_eq!(toml_string("a\"b\\c\u{1}"), "\"a\\\"b\\\\c\\u0001\"");
        let parsed: toml::Table = toml::from_str(&format!("x = {}", toml_string("a\"b\\c\u{1}é"))).unwrap();
        assert_eq!(parsed["x"].as_str(), Some("a\"b\\c\u{1}é"));
    }
}
