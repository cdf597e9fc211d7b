//! The Markdown report and the terminal summary.

use crate::Report;
use crate::document::{Block, Column, Inline, Ranking, document, in_words, shown_metrics, verdict_section};
use crate::format::{count, escape_markdown as escape, file_name, plain};
use crate::gate::{GateOutcome, Verdict};
use crate::metrics::Metric;

/// A code span holding `s` verbatim: the fence is one backtick longer than the longest run of
/// backticks in `s`.
fn code_span(s: &str) -> String {
    let s: String = s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    let mut longest = 0;
    let mut run = 0;
    for c in s.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    let fence = "`".repeat(longest + 1);
    let pad = if s.starts_with('`') || s.ends_with('`') { " " } else { "" };
    format!("{fence}{pad}{s}{pad}{fence}")
}

fn inlines(runs: &[Inline], in_table: bool) -> String {
    let mut out = String::new();
    for run in runs {
        match run {
            Inline::Text(t) if in_table => out.push_str(&t.replace('|', "\\|")),
            Inline::Text(t) => out.push_str(t),
            Inline::Strong(t) => {
                out.push_str("**");
                out.push_str(t);
                out.push_str("**");
            }
            Inline::Name(n) => out.push_str(&escape(n)),
            // A pipe in a code span would still end a table cell: such a name is escaped instead.
            Inline::Code(c) if in_table && c.contains(['|', '`']) => out.push_str(&escape(c)),
            Inline::Code(c) => out.push_str(&code_span(c)),
            Inline::Link { text, href } => out.push_str(&format!("[{text}](#{href})")),
        }
    }
    out
}

/// A GitHub-flavoured table, numbers right-aligned.
fn table(out: &mut String, columns: &[Column], rows: &[Vec<Vec<Inline>>]) {
    out.push('|');
    for c in columns {
        out.push(' ');
        out.push_str(&c.title);
        out.push_str(" |");
    }
    out.push_str("\n|");
    for c in columns {
        out.push_str(if c.numeric { "---:|" } else { "---|" });
    }
    out.push('\n');
    for row in rows {
        out.push('|');
        for cell in row {
            out.push(' ');
            out.push_str(&inlines(cell, true));
            out.push_str(" |");
        }
        out.push('\n');
    }
    out.push('\n');
}

/// The report as Markdown: the workload line, the variants, one table per horizon (every metric
/// of [`METRICS`](crate::METRICS) the report has, with its 95% interval, and the excess over the
/// noise floor), first divergence, expert routing (for a model with experts), entropy strata,
/// per-tensor error and a glossary of the metrics. Deterministic: same report → same bytes.
pub fn render_markdown(report: &Report) -> String {
    render_markdown_gated(report, None)
}

/// [`render_markdown`], with the gate's outcome in the verdict when the run was gated.
pub fn render_markdown_gated(report: &Report, gate: Option<&GateOutcome>) -> String {
    print(&document(report, gate))
}

/// The verdict alone (a CI job's summary, `qdrift gate --summary-md`): the verdict section of
/// [`render_markdown_gated`], without the link to a glossary it does not include.
pub fn render_verdict_markdown(report: &Report, gate: Option<&GateOutcome>) -> String {
    print(&verdict_section(report, gate, false))
}

/// `doc` as Markdown, ending in one newline.
pub(crate) fn print(doc: &[Block]) -> String {
    let mut out = String::new();
    blocks(&mut out, doc);
    while out.ends_with("\n\n") {
        out.pop();
    }
    out
}

/// Prints `doc` as Markdown into `out`.
fn blocks(out: &mut String, doc: &[Block]) {
    for block in doc {
        match block {
            Block::Heading { level, text, .. } => {
                out.push_str(&"#".repeat(usize::from(*level)));
                out.push(' ');
                out.push_str(text);
                out.push_str("\n\n");
            }
            Block::Paragraph(runs) => {
                out.push_str(&inlines(runs, false));
                out.push_str("\n\n");
            }
            Block::Table { columns, rows } => table(out, columns, rows),
            Block::Charts => {}
            // GitHub renders Markdown inside <details> when blank lines set it apart.
            Block::Details { summary, blocks: inner } => {
                out.push_str(&format!("<details><summary>{}</summary>\n\n", escape(summary)));
                blocks(out, inner);
                out.push_str("</details>\n\n");
            }
        }
    }
}

/// A short plain-text table for the terminal: per horizon, one line per variant with each
/// metric of [`METRICS`](crate::METRICS) marked for the summary that the report has (an
/// optional metric no variant has, like the routing metrics of a dense model, shows no column),
/// as `mean [lo, hi]`; then the verdict the reports open with, one line per variant
/// ([`render_summary_gated`] without a gate). Names are shown with control characters escaped.
pub fn render_summary(report: &Report) -> String {
    render_summary_gated(report, None)
}

/// [`render_summary`], its verdict lines with each variant's gate verdict when the run was gated:
/// the last thing a terminal shows of a run is the same verdict its report opens with.
pub fn render_summary_gated(report: &Report, gate: Option<&GateOutcome>) -> String {
    let mut out = summary_tables(report);
    out.push_str(&summary_verdict(report, gate));
    out
}

/// The per-horizon tables of [`render_summary`].
fn summary_tables(report: &Report) -> String {
    let shown: Vec<&Metric> = shown_metrics(report).into_iter().filter(|m| m.summary).collect();
    let mut out = summary_header(report);
    for &h in &report.workload.horizons {
        let mut rows: Vec<Vec<String>> =
            vec![std::iter::once("variant").chain(shown.iter().map(|m| m.title)).map(String::from).collect()];
        for v in &report.variants {
            let Some(hm) = v.horizon(h) else { continue };
            let cells = shown.iter().map(|m| hm.get(m).map_or_else(|| "—".to_string(), |e| m.with_ci(e)));
            rows.push(std::iter::once(plain(&v.name)).chain(cells).collect());
        }
        out.push_str(&format!("\nfirst {h} tokens\n"));
        out.push_str(&aligned(&rows));
    }
    out
}

/// The verdict as plain lines: a heading saying what ranks the variants, then per variant, closest
/// first, `RANK. NAME [GATE] VALUE WORDS` ([`Ranking`], [`in_words`]), as the reports' verdict
/// table has them.
fn summary_verdict(report: &Report, gate: Option<&GateOutcome>) -> String {
    let ranking = Ranking::of(report);
    if ranking.variants.is_empty() {
        return String::new();
    }
    let rows: Vec<[String; 4]> = ranking
        .variants
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let verdict =
                gate.map_or(String::new(), |g| g.variant_verdict(&v.name).map_or("not gated", Verdict::word).into());
            [format!("{}.", i + 1), plain(&v.name), verdict, ranking.value(v)]
        })
        .collect();
    let width = |c: usize| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0);
    let widths = [width(0), width(1), width(2), width(3)];
    let mut out = format!(
        "\nverdict: ranked by {} over the first {} tokens (lower is closer to the reference)\n",
        ranking.key_title(),
        ranking.longest
    );
    for (row, v) in rows.iter().zip(&ranking.variants) {
        let pad = |c: usize| " ".repeat(widths[c] - row[c].chars().count());
        let verdict = if gate.is_some() { format!("  {}{}", row[2], pad(2)) } else { String::new() };
        out.push_str(&format!(
            "{}{} {}{}{verdict}  {}{}  {}\n",
            pad(0),
            row[0],
            row[1],
            pad(1),
            pad(3),
            row[3],
            plain(&in_words(report, v))
        ));
    }
    out
}

/// `qdrift: MODEL (N parameters) · P prompts · BACKEND DTYPE on ADAPTER`.
fn summary_header(report: &Report) -> String {
    let m = &report.model;
    let w = &report.workload;
    format!(
        "qdrift: {} ({} parameters{}) · {} prompts · {} {} on {}\n",
        plain(file_name(&m.path)),
        count(m.parameters),
        if m.synthetic { ", synthetic" } else { "" },
        w.prompts,
        plain(&w.backend),
        plain(&w.compute_dtype),
        plain(&w.adapter),
    )
}

/// Rows as columns two spaces apart: the first left-aligned, the others right-aligned.
fn aligned(rows: &[Vec<String>]) -> String {
    let mut widths = vec![0usize; rows.first().map_or(0, Vec::len)];
    for row in rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, (c, &width)) in row.iter().zip(&widths).enumerate() {
            let pad = " ".repeat(width - c.chars().count());
            if i == 0 {
                line.push_str(c);
                line.push_str(&pad);
            } else {
                line.push_str("  ");
                line.push_str(&pad);
                line.push_str(c);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}
