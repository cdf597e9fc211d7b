//! The HTML report: one self-contained file.
//!
//! No network at all: inline CSS, inline SVG charts, no scripts, fonts, stylesheets or images
//! from elsewhere, and no URL anywhere in the page (the SVG `xmlns` is dropped, HTML does not
//! need it). Every string from the report is escaped.

use crate::charts::{Interval, Legend, Series, Spec, interval_chart, line_chart};
use crate::document::{Block, Inline, document};
use crate::format::kld;
use crate::{Report, ReportError};

/// Escapes text or an attribute value for HTML and XML 1.0 alike; control characters other than
/// tab, newline and carriage return, and the noncharacters U+FFFE/U+FFFF (which XML 1.0 cannot
/// hold) become U+FFFD.
pub(crate) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if c.is_control() || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "\
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:0;color:#1b1b1b;background:#fff}
main{max-width:1280px;margin:0 auto;padding:1.5rem}
h1{font-size:1.7rem;margin:.2rem 0 1rem}
h2{font-size:1.25rem;margin:2rem 0 .6rem;border-bottom:1px solid #ddd;padding-bottom:.2rem}
p{line-height:1.5}
code{font-family:ui-monospace,'DejaVu Sans Mono',monospace;font-size:.92em;background:#f3f3f3;padding:0 .2em;border-radius:3px}
table{border-collapse:collapse;font-size:.88rem;margin:.4rem 0 1rem}
th,td{border:1px solid #d6d6d6;padding:.28rem .5rem;vertical-align:top}
th{background:#f5f5f5;text-align:left}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.scroll{overflow-x:auto}
figure{margin:1rem 0 1.6rem}
figure svg{max-width:100%;height:auto;border:1px solid #e4e4e4}
figcaption{font-size:.88rem;color:#444;max-width:900px}
";

fn inlines(runs: &[Inline]) -> String {
    let mut out = String::new();
    for run in runs {
        match run {
            Inline::Text(t) | Inline::Name(t) => out.push_str(&escape(t)),
            Inline::Strong(t) => {
                out.push_str("<strong>");
                out.push_str(&escape(t));
                out.push_str("</strong>");
            }
            Inline::Code(c) => {
                out.push_str("<code>");
                out.push_str(&escape(c));
                out.push_str("</code>");
            }
        }
    }
    out
}

/// The charts, each an inline `<svg>` in a `<figure>`.
fn charts(report: &Report) -> Result<String, ReportError> {
    let h_max = report.workload.horizons.last().copied().unwrap_or(1).max(2) as f64;
    let x_label = "generated position (log scale)";
    let mut out = String::from("<h2 id=\"charts\">Charts</h2>\n");
    let mut figure = |svg: String, caption: &str| {
        out.push_str("<figure>\n");
        out.push_str(&svg);
        out.push_str("<figcaption>");
        out.push_str(&escape(caption));
        out.push_str("</figcaption>\n</figure>\n");
    };

    let token_match: Vec<Series> = report
        .variants
        .iter()
        .map(|v| Series {
            name: &v.name,
            points: v.per_position.token_match.iter().enumerate().map(|(t, &y)| ((t + 1) as f64, y)).collect(),
        })
        .collect();
    let spec = Spec {
        id: "chart-token-match",
        title: "Token-match rate by position",
        x_label,
        y_label: "token-match rate",
        x_range: (1.0, h_max),
        y_range: (0.0, 1.02),
        y_format: |y| format!("{y:.1}"),
        legend: Legend::LowerLeft,
    };
    figure(
        line_chart(&spec, &token_match)?,
        "Share of prompts whose free-running token at each position equals the reference's \
         (position 1 is the first generated token).",
    );

    let survival: Vec<Series> = report
        .variants
        .iter()
        .map(|v| {
            // A step function: S(t) holds until the next event time, then drops.
            let mut points: Vec<(f64, f64)> = Vec::new();
            for &(t, s) in &v.first_divergence.survival {
                let x = (t as f64).max(1.0);
                if let Some(&(_, prev)) = points.last() {
                    points.push((x, prev));
                }
                points.push((x, s));
            }
            if let Some(&(x, s)) = points.last()
                && x < h_max
            {
                points.push((h_max, s));
            }
            Series { name: &v.name, points }
        })
        .collect();
    let spec = Spec {
        id: "chart-survival",
        title: "Still identical to the reference (Kaplan–Meier)",
        x_label: "tokens generated (log scale)",
        y_label: "share of prompts still identical",
        x_range: (1.0, h_max),
        y_range: (0.0, 1.02),
        y_format: |y| format!("{y:.1}"),
        legend: Legend::LowerLeft,
    };
    figure(
        line_chart(&spec, &survival)?,
        "Kaplan–Meier estimate of the share of prompts whose continuation is still identical to \
         the reference's after t tokens; prompts that never diverge are censored at the longest \
         horizon. t = 0 is drawn at 1.",
    );

    let kld_max = report.variants.iter().flat_map(|v| v.per_position.kld.iter().copied()).fold(0.0, f64::max);
    let kld_series: Vec<Series> = report
        .variants
        .iter()
        .map(|v| Series {
            name: &v.name,
            points: v.per_position.kld.iter().enumerate().map(|(t, &y)| ((t + 1) as f64, y)).collect(),
        })
        .collect();
    let spec = Spec {
        id: "chart-kld",
        title: "KL divergence by position (teacher-forced)",
        x_label,
        y_label: "mean KLD (nats)",
        x_range: (1.0, h_max),
        y_range: (0.0, if kld_max > 0.0 { kld_max * 1.08 } else { 1e-3 }),
        y_format: kld,
        legend: Legend::UpperRight,
    };
    figure(
        line_chart(&spec, &kld_series)?,
        "Mean over prompts of KL(P_ref ‖ P_variant) at each position of the reference's continuation.",
    );

    let ppl: Vec<(&str, Vec<Interval>)> = report
        .variants
        .iter()
        .map(|v| {
            let intervals = v
                .horizons
                .iter()
                .map(|h| {
                    let m = &h.ppl_drift_of_generated_text;
                    Interval { x: h.tokens as f64, mean: m.mean, lo: m.ci95[0], hi: m.ci95[1] }
                })
                .collect();
            (v.name.as_str(), intervals)
        })
        .collect();
    let all = ppl.iter().flat_map(|(_, ivs)| ivs.iter());
    let (lo, hi) = all.fold((1.0f64, 1.0f64), |(lo, hi), iv| (lo.min(iv.lo), hi.max(iv.hi)));
    let pad = (hi - lo).max(0.01) * 0.08;
    let h_min = report.workload.horizons.first().copied().unwrap_or(1).max(1) as f64;
    let spec = Spec {
        id: "chart-ppl-drift",
        title: "PPL drift of generated text by horizon (95% CI)",
        x_label: "horizon, tokens (log scale)",
        y_label: "PPL_ref(variant text) / PPL_ref(ref text)",
        x_range: (h_min / 1.6, h_max * 1.6),
        y_range: (lo - pad, hi + pad),
        y_format: |y| format!("{y:.2}"),
        legend: Legend::UpperLeft,
    };
    figure(
        interval_chart(&spec, &ppl)?,
        "Perplexity the reference assigns to each variant's continuation over its first h tokens, \
         relative to its own continuation: 1 means the variant's text is as likely as the \
         reference's. Bars are 95% intervals; series are offset a little along x.",
    );
    Ok(out)
}

/// The report as one self-contained HTML page: the Markdown's content as HTML tables plus four
/// inline SVG charts (token match by position, Kaplan–Meier survival, KLD by position, PPL drift
/// per horizon with intervals). Validates the report first. Deterministic: same report → same
/// bytes.
///
/// Each data series is marked `class="series" data-series="VARIANT"` (a `<polyline>` with one
/// `x,y` pair per data point in its `points` attribute; the PPL chart also has one `<circle>`
/// per horizon), so tests can count data points.
pub fn render_html(report: &Report) -> Result<String, ReportError> {
    report.validate()?;
    let mut body = String::new();
    for block in document(report) {
        match block {
            Block::Heading { level, id, text } => {
                body.push_str(&format!("<h{level} id=\"{}\">{}</h{level}>\n", escape(&id), escape(&text)));
            }
            Block::Paragraph(runs) => {
                body.push_str("<p>");
                body.push_str(&inlines(&runs));
                body.push_str("</p>\n");
            }
            Block::Table { columns, rows } => {
                body.push_str("<div class=\"scroll\"><table>\n<thead><tr>");
                for c in &columns {
                    let class = if c.numeric { " class=\"num\"" } else { "" };
                    body.push_str(&format!("<th{class}>{}</th>", escape(c.title)));
                }
                body.push_str("</tr></thead>\n<tbody>\n");
                for row in &rows {
                    body.push_str("<tr>");
                    for (cell, c) in row.iter().zip(&columns) {
                        let class = if c.numeric { " class=\"num\"" } else { "" };
                        body.push_str(&format!("<td{class}>{}</td>", inlines(cell)));
                    }
                    body.push_str("</tr>\n");
                }
                body.push_str("</tbody>\n</table></div>\n");
            }
            Block::Charts => body.push_str(&charts(report)?),
        }
    }
    let mut title = String::from("qdrift report: ");
    title.push_str(&report.model.path);
    Ok(format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{}</title>\n<style>\n{STYLE}</style>\n</head>\n<body>\n<main>\n{body}</main>\n</body>\n</html>\n",
        escape(&title)
    ))
}
