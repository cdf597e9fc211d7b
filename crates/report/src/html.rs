//! The HTML report: one self-contained file.
//!
//! No network at all: inline CSS, inline SVG charts, no scripts, fonts, stylesheets or images
//! from elsewhere, and no URL anywhere in the page (the SVG `xmlns` is dropped, HTML does not
//! need it). Every string from the report is escaped.

use crate::document::{Block, Column, Inline, document};
use crate::figures::figures;
use crate::format::{escape_html as escape, file_name};
use crate::gate::GateOutcome;
use crate::{Report, ReportError};

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
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
.nb{white-space:nowrap}
summary{cursor:pointer;margin:.4rem 0}
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
            Inline::Link { text, href } => {
                out.push_str(&format!("<a href=\"#{}\">{}</a>", escape(href), escape(text)));
            }
        }
    }
    out
}

/// The charts, each an inline `<svg>` in a `<figure>` with its caption.
fn charts(report: &Report) -> Result<String, ReportError> {
    let mut out = String::from("<h2 id=\"charts\">Charts</h2>\n");
    for figure in figures(report)? {
        out.push_str("<figure>\n");
        out.push_str(&figure.svg);
        out.push_str("<figcaption>");
        out.push_str(&escape(&figure.caption));
        out.push_str("</figcaption>\n</figure>\n");
    }
    Ok(out)
}

/// A table, numbers right-aligned, in a box that scrolls sideways on a screen too narrow for it
/// (the report's tables fit 1300 px).
fn table(columns: &[Column], rows: &[Vec<Vec<Inline>>]) -> String {
    let class = |c: &Column| if c.numeric { " class=\"num\"" } else { "" };
    let mut out = String::from("<div class=\"scroll\"><table>\n<thead><tr>");
    for c in columns {
        out.push_str(&format!("<th{}>{}</th>", class(c), escape(&c.title)));
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    for row in rows {
        out.push_str("<tr>");
        for (cell, c) in row.iter().zip(columns) {
            let html = inlines(cell);
            // A number with its interval may break between the two, never inside either, so a
            // table narrows to the page instead of scrolling sideways.
            let html = match html.split_once(" [") {
                Some((mean, interval)) if c.numeric => {
                    format!("<span class=\"nb\">{mean}</span> <span class=\"nb\">[{interval}</span>")
                }
                _ => html,
            };
            out.push_str(&format!("<td{}>{html}</td>", class(c)));
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody>\n</table></div>\n");
    out
}

/// The report as one self-contained HTML page: the Markdown's content as HTML tables plus four
/// inline SVG charts (token match by position, Kaplan–Meier survival, KLD by position on a log
/// scale, PPL drift per horizon with intervals), and for a model with experts two more (routing
/// flips per layer with intervals, routing flips by position). Validates the report first.
/// Deterministic: same report → same bytes.
///
/// Each data series is marked `class="series" data-series="VARIANT"` (a `<polyline>` with one
/// `x,y` pair per data point in its `points` attribute; the interval charts, PPL drift and
/// routing flips per layer, also have one `<circle>` per point), so tests can count data points.
pub fn render_html(report: &Report) -> Result<String, ReportError> {
    render_html_gated(report, None)
}

/// [`render_html`], with the gate's outcome in the verdict when the run was gated.
pub fn render_html_gated(report: &Report, gate: Option<&GateOutcome>) -> Result<String, ReportError> {
    report.validate()?;
    let mut body = String::new();
    blocks(&mut body, &document(report, gate), Some(report))?;
    Ok(wrap(&format!("qdrift report: {}", file_name(&report.model.path)), &body))
}

/// `doc` (a document without charts) as one self-contained HTML page titled `title`.
pub(crate) fn page(title: &str, doc: &[Block]) -> String {
    let mut body = String::new();
    // No charts block, so nothing to fail.
    let _ = blocks(&mut body, doc, None);
    wrap(title, &body)
}

/// The page around `body`.
fn wrap(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{}</title>\n<style>\n{STYLE}</style>\n</head>\n<body>\n<main>\n{body}</main>\n</body>\n</html>\n",
        escape(title)
    )
}

/// Prints `doc` as HTML into `body`; its charts are `report`'s (none without one).
fn blocks(body: &mut String, doc: &[Block], report: Option<&Report>) -> Result<(), ReportError> {
    for block in doc {
        match block {
            Block::Heading { level, id, text } => {
                body.push_str(&format!("<h{level} id=\"{}\">{}</h{level}>\n", escape(id), escape(text)));
            }
            Block::Paragraph(runs) => {
                body.push_str("<p>");
                body.push_str(&inlines(runs));
                body.push_str("</p>\n");
            }
            Block::Table { columns, rows } => body.push_str(&table(columns, rows)),
            Block::Charts => {
                if let Some(report) = report {
                    body.push_str(&charts(report)?);
                }
            }
            Block::Details { summary, blocks: inner } => {
                body.push_str(&format!("<details><summary>{}</summary>\n", escape(summary)));
                blocks(body, inner, report)?;
                body.push_str("</details>\n");
            }
        }
    }
    Ok(())
}
