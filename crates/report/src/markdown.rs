//! The Markdown report and the terminal summary.

use crate::Report;
use crate::document::{Block, Inline, document};
use crate::format::{kld, plain, rate, with_ci};

/// Escapes a string from the report for Markdown text (CommonMark: any ASCII punctuation may be
/// backslash-escaped); control characters become spaces so a name cannot break a table row.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' | '`' | '*' | '_' | '[' | ']' | '<' | '>' | '|' | '#' | '~' | '&' | '!' | '$' => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

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
        }
    }
    out
}

/// The report as Markdown: the workload line, the variants, one table per horizon (every metric
/// with its 95% interval, and the excess over the noise floor), first divergence, entropy strata
/// and per-tensor error. Deterministic: same report → same bytes.
pub fn render_markdown(report: &Report) -> String {
    let mut out = String::new();
    for block in document(report) {
        match block {
            Block::Heading { level, text, .. } => {
                out.push_str(&"#".repeat(usize::from(level)));
                out.push(' ');
                out.push_str(&text);
                out.push_str("\n\n");
            }
            Block::Paragraph(runs) => {
                out.push_str(&inlines(&runs, false));
                out.push_str("\n\n");
            }
            Block::Table { columns, rows } => {
                out.push('|');
                for c in &columns {
                    out.push(' ');
                    out.push_str(c.title);
                    out.push_str(" |");
                }
                out.push_str("\n|");
                for c in &columns {
                    out.push_str(if c.numeric { "---:|" } else { "---|" });
                }
                out.push('\n');
                for row in &rows {
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
            Block::Charts => {}
        }
    }
    while out.ends_with("\n\n") {
        out.pop();
    }
    out
}

/// A short plain-text table for the terminal: per horizon, one line per variant with token
/// match, exact match, KLD mean, top-1 agreement and PPL drift of generated text, each as
/// `mean [lo, hi]`. Names are shown with control characters escaped.
pub fn render_summary(report: &Report) -> String {
    const HEADER: [&str; 6] = ["variant", "token match", "exact match", "KLD mean", "top-1", "PPL drift"];
    let m = &report.model;
    let w = &report.workload;
    let mut out = format!(
        "qdrift: {} ({} parameters{}) · {} prompts · {} {} on {}\n",
        plain(&m.path),
        crate::format::count(m.parameters),
        if m.synthetic { ", synthetic" } else { "" },
        w.prompts,
        plain(&w.backend),
        plain(&w.compute_dtype),
        plain(&w.adapter),
    );
    for &h in &w.horizons {
        let mut rows: Vec<[String; 6]> = vec![HEADER.map(String::from)];
        for v in &report.variants {
            let Some(hm) = v.horizon(h) else { continue };
            let kld_ci = crate::MeanCi { mean: hm.kld.mean, ci95: hm.kld.ci95 };
            rows.push([
                plain(&v.name),
                with_ci(&hm.token_match_rate, rate),
                with_ci(&hm.exact_match_fraction, rate),
                with_ci(&kld_ci, kld),
                with_ci(&hm.top1_agreement, rate),
                with_ci(&hm.ppl_drift_of_generated_text, rate),
            ]);
        }
        let mut widths = [0usize; 6];
        for row in &rows {
            for (w, c) in widths.iter_mut().zip(row) {
                *w = (*w).max(c.chars().count());
            }
        }
        out.push_str(&format!("\nfirst {h} tokens\n"));
        for row in &rows {
            let mut line = String::new();
            for (i, (c, &width)) in row.iter().zip(&widths).enumerate() {
                let pad = width - c.chars().count();
                if i > 0 {
                    line.push_str("  ");
                }
                if i == 0 {
                    line.push_str(c);
                    line.push_str(&" ".repeat(pad));
                } else {
                    line.push_str(&" ".repeat(pad));
                    line.push_str(c);
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
    out
}
