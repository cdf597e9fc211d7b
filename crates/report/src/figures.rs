//! The report's charts (four, six for a model with experts): which data each draws, on which
//! axes, and the sentence under it. Drawing is `charts`' job; every chart has one series per
//! variant, built by [`per_variant`] (per variant with routing, [`per_routed_variant`]).

use crate::charts::{Interval, Scale, Series, Spec, interval_chart, line_chart};
use crate::format::kld;
use crate::{Report, ReportError, RoutingDrift, Variant};

/// A chart and its caption.
pub(crate) struct Figure {
    /// The inline `<svg>`.
    pub svg: String,
    /// What the chart shows (plain text, escaped by the printer).
    pub caption: String,
}

/// The smallest KL divergence the KLD chart draws, in nats: its y axis is logarithmic, so smaller
/// means (exact zeros included) are drawn at this floor, and the caption says so.
pub(crate) const KLD_FLOOR: f64 = 1e-6;

/// The x-axis label of the per-position charts.
const POSITION: &str = "generated position (log scale)";

/// Token match by position, Kaplan–Meier survival, KLD by position and PPL drift by horizon;
/// when any variant has routing (a model with experts), routing flips by layer and by position.
pub(crate) fn figures(report: &Report) -> Result<Vec<Figure>, ReportError> {
    let mut figures = vec![token_match(report)?, survival(report)?, kld_by_position(report)?, ppl_drift(report)?];
    if report.variants.iter().any(|v| v.routing.is_some()) {
        figures.push(routing_by_layer(report)?);
        figures.push(routing_by_position(report)?);
    }
    Ok(figures)
}

/// One series per variant that ran (a failed one has none), in report order, with the points
/// `points` gives it.
fn per_variant<'a, P>(report: &'a Report, points: impl Fn(&'a Variant) -> Vec<P>) -> Vec<Series<'a, P>> {
    report
        .variants
        .iter()
        .filter(|v| v.failure.is_none())
        .map(|v| Series { name: &v.name, points: points(v) })
        .collect()
}

/// One series per variant with routing, in report order, with the points `points` gives it.
fn per_routed_variant<'a, P>(report: &'a Report, points: impl Fn(&'a RoutingDrift) -> Vec<P>) -> Vec<Series<'a, P>> {
    report
        .variants
        .iter()
        .filter_map(|v| v.routing.as_ref().map(|r| Series { name: &v.name, points: points(r) }))
        .collect()
}

/// `(t + 1, values[t])`: position 1 is the first generated token (the x axis is logarithmic).
fn by_position(values: &[f64]) -> Vec<(f64, f64)> {
    values.iter().enumerate().map(|(t, &y)| ((t + 1) as f64, y)).collect()
}

/// The longest horizon as the x axis' end (at least 2, so the log axis has a range).
fn x_end(report: &Report) -> f64 {
    report.workload.horizons.last().copied().unwrap_or(1).max(2) as f64
}

fn token_match(report: &Report) -> Result<Figure, ReportError> {
    let series = per_variant(report, |v| by_position(&v.per_position.token_match));
    let spec = Spec {
        id: "chart-token-match",
        title: "Token-match rate by position",
        x_label: POSITION,
        y_label: "token-match rate",
        x_range: (1.0, x_end(report)),
        x_scale: Scale::Log,
        y_range: (0.0, 1.02),
        y_scale: Scale::Linear,
        y_format: |y| format!("{y:.1}"),
    };
    Ok(Figure {
        svg: line_chart(&spec, &series)?,
        caption: "Share of prompts whose free-running token at each position equals the reference's \
                  (position 1 is the first generated token)."
            .into(),
    })
}

/// `S(t)` as a step function: it holds until the next event time, then drops; the last value
/// holds to the end of the x axis.
fn survival_steps(v: &Variant, x_end: f64) -> Vec<(f64, f64)> {
    let mut points: Vec<(f64, f64)> = Vec::new();
    for &(t, s) in &v.first_divergence.survival {
        let x = (t as f64).max(1.0);
        if let Some(&(_, prev)) = points.last() {
            points.push((x, prev));
        }
        points.push((x, s));
    }
    if let Some(&(x, s)) = points.last()
        && x < x_end
    {
        points.push((x_end, s));
    }
    points
}

fn survival(report: &Report) -> Result<Figure, ReportError> {
    let end = x_end(report);
    let series = per_variant(report, |v| survival_steps(v, end));
    let spec = Spec {
        id: "chart-survival",
        title: "Still identical to the reference (Kaplan–Meier)",
        x_label: "tokens generated (log scale)",
        y_label: "share of prompts still identical",
        x_range: (1.0, end),
        x_scale: Scale::Log,
        y_range: (0.0, 1.02),
        y_scale: Scale::Linear,
        y_format: |y| format!("{y:.1}"),
    };
    Ok(Figure {
        svg: line_chart(&spec, &series)?,
        caption: "Kaplan–Meier estimate of the share of prompts whose continuation is still identical to \
                  the reference's after t tokens; prompts that never diverge are censored at the longest \
                  horizon. t = 0 is drawn at 1."
            .into(),
    })
}

/// The power of ten at or below `x > 0`.
fn decade_below(x: f64) -> f64 {
    10f64.powf(x.log10().floor())
}

/// The power of ten above `x > 0`.
fn decade_above(x: f64) -> f64 {
    10f64.powf(x.log10().floor() + 1.0)
}

/// A tick label of a log-scaled axis, to one significant digit: decimals from `0.01` to `100`
/// (`0.1`, `2`), powers of ten beyond (`1e-3`, `5e-6`).
fn log_tick(y: f64) -> String {
    let scientific = format!("{y:.0e}");
    match scientific.split_once('e').and_then(|(_, e)| e.parse::<i32>().ok()) {
        Some(e) if (-2..=2).contains(&e) => format!("{:.*}", (-e).max(0) as usize, y),
        _ => scientific,
    }
}

/// KLD by position on a log y axis: a variant a hundred times closer to the reference than
/// another is still a visible line, not a flat one at zero.
fn kld_by_position(report: &Report) -> Result<Figure, ReportError> {
    let series = per_variant(report, |v| {
        by_position(&v.per_position.kld).into_iter().map(|(x, y)| (x, y.max(KLD_FLOOR))).collect()
    });
    let ys = series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
    let (lo, hi) = ys.fold((f64::INFINITY, KLD_FLOOR), |(lo, hi), y| (lo.min(y), hi.max(y)));
    let lo = if lo.is_finite() { lo } else { KLD_FLOOR };
    let spec = Spec {
        id: "chart-kld",
        title: "KL divergence by position (teacher-forced)",
        x_label: POSITION,
        y_label: "mean KLD (nats, log scale)",
        x_range: (1.0, x_end(report)),
        x_scale: Scale::Log,
        y_range: (decade_below(lo), decade_above(hi)),
        y_scale: Scale::Log,
        y_format: log_tick,
    };
    Ok(Figure {
        svg: line_chart(&spec, &series)?,
        caption: format!(
            "Mean over prompts of KL(P_ref ‖ P_variant) at each position of the reference's continuation, \
             on a logarithmic scale so that variants orders of magnitude apart are all visible; means below \
             {floor} nats (exact zeros included) are drawn at {floor}.",
            floor = kld(KLD_FLOOR)
        ),
    })
}

/// The PPL drift of generated text at each horizon, with its interval.
fn drift_intervals(v: &Variant) -> Vec<Interval> {
    v.horizons
        .iter()
        .filter_map(|h| {
            let m = h.metric("ppl_drift_of_generated_text")?;
            Some(Interval { x: h.tokens as f64, mean: m.mean, lo: m.ci95[0], hi: m.ci95[1] })
        })
        .collect()
}

fn ppl_drift(report: &Report) -> Result<Figure, ReportError> {
    let series = per_variant(report, drift_intervals);
    let all = series.iter().flat_map(|s| s.points.iter());
    let (lo, hi) = all.fold((1.0f64, 1.0f64), |(lo, hi), iv| (lo.min(iv.lo), hi.max(iv.hi)));
    let pad = (hi - lo).max(0.01) * 0.08;
    let h_min = report.workload.horizons.first().copied().unwrap_or(1).max(1) as f64;
    let spec = Spec {
        id: "chart-ppl-drift",
        title: "PPL drift of generated text by horizon (95% CI)",
        x_label: "horizon, tokens (log scale)",
        y_label: "PPL_ref(variant text) / PPL_ref(ref text)",
        x_range: (h_min / 1.6, x_end(report) * 1.6),
        x_scale: Scale::Log,
        y_range: (lo - pad, hi + pad),
        y_scale: Scale::Linear,
        y_format: |y| format!("{y:.2}"),
    };
    Ok(Figure {
        svg: interval_chart(&spec, &series)?,
        caption: "Perplexity the reference assigns to each variant's continuation over its first h tokens, \
                  relative to its own continuation: 1 means the variant's text is as likely as the \
                  reference's. Bars are 95% intervals; series are offset a little along x."
            .into(),
    })
}

/// A tick label of a linear axis: up to four decimals, trailing zeros dropped (`0`, `0.05`,
/// `0.125`).
fn short_decimal(y: f64) -> String {
    let s = format!("{y:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" { "0".to_string() } else { s.to_string() }
}

/// Each mixture-of-experts layer's flip rate with its interval, at the layer's index.
fn layer_intervals(r: &RoutingDrift) -> Vec<Interval> {
    r.layers
        .iter()
        .map(|l| Interval {
            x: l.layer as f64,
            mean: l.flip_rate.mean,
            lo: l.flip_rate.ci95[0],
            hi: l.flip_rate.ci95[1],
        })
        .collect()
}

/// Routing flips per mixture-of-experts layer, on a linear axis of layer indices.
fn routing_by_layer(report: &Report) -> Result<Figure, ReportError> {
    let series = per_routed_variant(report, layer_intervals);
    let all = || series.iter().flat_map(|s| s.points.iter());
    let first = all().map(|iv| iv.x).fold(f64::INFINITY, f64::min);
    let last = all().map(|iv| iv.x).fold(f64::NEG_INFINITY, f64::max);
    let (first, last) = if first.is_finite() { (first, last) } else { (0.0, 0.0) };
    let hi = all().map(|iv| iv.hi).fold(0.0f64, f64::max);
    let longest = report.workload.horizons.last().copied().unwrap_or(0);
    let spec = Spec {
        id: "chart-routing-layers",
        title: "Routing flips by layer (95% CI)",
        x_label: "mixture-of-experts layer (block, 0-based)",
        y_label: "top-1 expert flip rate",
        x_range: (first - 1.0, last + 1.0),
        x_scale: Scale::Linear,
        y_range: (0.0, (hi * 1.15).clamp(0.01, 1.02)),
        y_scale: Scale::Linear,
        y_format: short_decimal,
    };
    Ok(Figure {
        svg: interval_chart(&spec, &series)?,
        caption: format!(
            "Per mixture-of-experts layer, the share of positions whose top-1 expert differs from the \
             reference's, both models teacher-forced on the reference's continuation over its first {longest} \
             tokens: the mean over prompts. Bars are 95% bootstrap intervals over prompts; series are offset a \
             little along x."
        ),
    })
}

/// The share of mixture-of-experts layers that flip at each generated position.
fn routing_by_position(report: &Report) -> Result<Figure, ReportError> {
    let series = per_routed_variant(report, |r| by_position(&r.flip_by_position));
    // Flip shares are small next to 1: the axis ends a little above the largest.
    let hi = series.iter().flat_map(|s| s.points.iter().map(|p| p.1)).fold(0.0f64, f64::max);
    let spec = Spec {
        id: "chart-routing-position",
        title: "Routing flips by position",
        x_label: POSITION,
        y_label: "share of layers whose top-1 expert flips",
        x_range: (1.0, x_end(report)),
        x_scale: Scale::Log,
        y_range: (0.0, (hi * 1.15).clamp(0.01, 1.02)),
        y_scale: Scale::Linear,
        y_format: short_decimal,
    };
    Ok(Figure {
        svg: line_chart(&spec, &series)?,
        caption: "At each position of the reference's continuation (position 1 is the first generated token), \
                  both models teacher-forced on it: the mean over prompts of the share of mixture-of-experts \
                  layers whose top-1 expert differs from the reference's."
            .into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decades_bracket_a_value() {
        let close = |a: f64, b: f64| (a / b - 1.0).abs() < 1e-12;
        assert!(close(decade_below(2.13e-6), 1e-6));
        assert!(close(decade_above(0.293), 1.0));
        assert!(decade_below(1e-6) <= 1e-6 && decade_above(1.0) > 1.0);
    }

    #[test]
    fn linear_ticks_drop_trailing_zeros() {
        let ticks: Vec<String> = [0.0, 0.05, 0.125, 1.0, 0.30000000000000004, -0.0].map(short_decimal).into();
        assert_eq!(ticks, ["0", "0.05", "0.125", "1", "0.3", "0"]);
    }

    #[test]
    fn log_ticks_read_well() {
        let ticks: Vec<String> = [1.0, 0.1, 0.01, 0.001, 2e-6, 0.09999999999999999, 20.0, 1000.0].map(log_tick).into();
        assert_eq!(ticks, ["1", "0.1", "0.01", "1e-3", "2e-6", "0.1", "20", "1e3"]);
    }
}
