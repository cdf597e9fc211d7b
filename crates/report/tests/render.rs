//! The Markdown, terminal and HTML renderings of a report.

mod common;

use qdrift_report::testing::sample_report;
use qdrift_report::{Report, render_html, render_markdown, render_summary};

/// The sample report with a variant whose name needs escaping everywhere.
fn hostile_report() -> Report {
    let mut r = sample_report();
    r.variants[1].name = "int8 <&> \"x\" 'y' <script>alert(1)</script>".into();
    r.model.path = "models/a&b <c>.gguf".into();
    r.workload.adapter = "GPU <\"quoted\"> & co".into();
    r
}

#[test]
fn markdown_has_the_workload_line() {
    let md = render_markdown(&sample_report());
    let workload = md.lines().find(|l| l.starts_with("**Workload:**")).expect("a workload line");
    for part in [
        "`models/SmolLM2-135M-Instruct/model.safetensors`",
        "134.5M parameters",
        "backend wgpu on `llvmpipe (LLVM 19.1.7, 256 bits)`",
        "compute f16",
        "72 prompts",
        "horizons 10, 100, 1000",
        "batch size 8",
        "seed 42",
        "eval set `eval-sets/stories.jsonl`",
        "qdrift 0.1.0",
    ] {
        assert!(workload.contains(part), "{part:?} missing from {workload}");
    }
    assert!(!workload.contains("synthetic"));
    let mut synthetic = sample_report();
    synthetic.model.synthetic = true;
    assert!(render_markdown(&synthetic).contains("**synthetic weights**"));
}

#[test]
fn markdown_has_a_table_per_horizon_with_intervals() {
    let r = sample_report();
    let md = render_markdown(&r);
    for &h in &r.workload.horizons {
        let heading = format!("## First {h} generated tokens");
        let at = md.find(&heading).unwrap_or_else(|| panic!("no {heading:?}"));
        let table: Vec<&str> =
            md[at..].lines().skip_while(|l| !l.starts_with('|')).take_while(|l| l.starts_with('|')).collect();
        assert_eq!(table.len(), 2 + r.variants.len(), "{table:#?}");
        assert!(table[0].contains("Token match") && table[0].contains("Excess KLD"), "{}", table[0]);
        for (row, v) in table[2..].iter().zip(&r.variants) {
            let m = v.horizon(h).unwrap();
            assert!(row.starts_with(&format!("| {} |", v.name)), "{row}");
            let tm = format!(
                "{:.4} [{:.4}, {:.4}]",
                m.token_match_rate.mean, m.token_match_rate.ci95[0], m.token_match_rate.ci95[1]
            );
            assert!(row.contains(&tm), "{tm} missing from {row}");
            // Ten columns, each but the name and p99 (and the noise floor's excess) with a CI.
            assert_eq!(row.matches(" | ").count(), 9, "{row}");
            let intervals = row.matches('[').count();
            assert_eq!(intervals, if m.excess_over_noise_floor.is_some() { 8 } else { 6 }, "{row}");
        }
    }
    // Small KLD in scientific notation.
    let floor = r.variants[0].horizon(10).unwrap().kld.mean;
    assert!(floor < 0.01);
    assert!(md.contains(&format!("{floor:.2e}")), "KLD {floor} not in scientific notation");
    for section in ["## First divergence", "## Entropy strata", "## Per-tensor error"] {
        assert!(md.contains(section), "{section} missing");
    }
    assert!(md.contains("| int4-g128 | `model.layers.0.mlp.down_proj.weight` |"));
}

#[test]
fn markdown_escapes_names() {
    let md = render_markdown(&hostile_report());
    assert!(md.contains("int8 \\<\\&\\> \"x\" 'y' \\<script\\>alert(1)\\</script\\>"), "{md}");
    assert!(!md.contains("<script>"));
}

#[test]
fn the_summary_has_a_line_per_variant_and_horizon() {
    let r = sample_report();
    let s = render_summary(&r);
    for &h in &r.workload.horizons {
        let at = s.find(&format!("first {h} tokens\n")).unwrap();
        let block: Vec<&str> = s[at..].lines().skip(1).take_while(|l| !l.is_empty()).collect();
        assert_eq!(block.len(), 1 + r.variants.len(), "{block:#?}");
        assert!(block[0].starts_with("variant") && block[0].ends_with("PPL drift"), "{}", block[0]);
        for (line, v) in block[1..].iter().zip(&r.variants) {
            assert!(line.starts_with(&v.name), "{line}");
            assert_eq!(line.matches('[').count(), 5, "{line}");
        }
    }
    let mut evil = sample_report();
    evil.variants[0].name = "a\u{1b}[2Jb".into();
    assert!(!render_summary(&evil).contains('\u{1b}'));
}

#[test]
fn html_is_self_contained() {
    let html = render_html(&sample_report()).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"));
    for banned in ["http://", "https://", "src=", "<script", "<link", "@import", "url(", "<img", "<iframe"] {
        assert!(!html.contains(banned), "{banned} in the HTML");
    }
    assert!(html.contains("<style>"));
}

/// `(series name, number of points)` of each series line (`data-part="line"`) of the chart
/// with `id`.
fn series_points(html: &str, id: &str) -> Vec<(String, usize)> {
    let start = html.find(&format!("<svg id=\"{id}\"")).unwrap_or_else(|| panic!("no chart {id}"));
    let end = start + html[start..].find("</svg>").unwrap();
    html[start..end]
        .lines()
        .filter(|l| l.starts_with("<polyline class=\"series\"") && l.contains(" data-part=\"line\""))
        .map(|l| {
            let name = l.split("data-series=\"").nth(1).unwrap().split('"').next().unwrap().to_string();
            let points = l.split("points=\"").nth(1).unwrap().split('"').next().unwrap();
            (name, points.split_whitespace().count())
        })
        .collect()
}

#[test]
fn html_has_four_charts_whose_series_have_data_points() {
    let r = sample_report();
    let html = render_html(&r).unwrap();
    assert!(html.matches("<svg").count() >= 4);
    let names: Vec<String> = r.variants.iter().map(|v| v.name.clone()).collect();
    // Token match and KLD: one point per position.
    for id in ["chart-token-match", "chart-kld"] {
        let series = series_points(&html, id);
        assert_eq!(series.iter().map(|s| s.0.clone()).collect::<Vec<_>>(), names, "{id}");
        assert!(series.iter().all(|s| s.1 == 1000), "{id}: {series:?}");
    }
    // Survival: a step function, two points per event after the first, one more to the end.
    let survival = series_points(&html, "chart-survival");
    for ((name, points), v) in survival.iter().zip(&r.variants) {
        let steps = v.first_divergence.survival.len();
        assert!(*points >= 2 * steps - 1, "{name}: {points} points for {steps} steps");
    }
    // PPL drift: per variant a joining line and a marker per horizon.
    let ppl = series_points(&html, "chart-ppl-drift");
    assert_eq!(ppl.len(), r.variants.len());
    assert!(ppl.iter().all(|s| s.1 == 3), "{ppl:?}");
    let start = html.find("<svg id=\"chart-ppl-drift\"").unwrap();
    let chart = &html[start..start + html[start..].find("</svg>").unwrap()];
    for v in &r.variants {
        let tagged = |element: &str, part: &str| {
            let tag = format!("<{element} class=\"series\" data-series=\"{}\" data-part=\"{part}\"", v.name);
            chart.matches(&tag).count()
        };
        assert_eq!(tagged("circle", "mean"), 3, "{}", v.name);
        assert_eq!(tagged("polyline", "interval"), 9, "{}: a bar and two caps per horizon", v.name);
    }
    // Titles, axis labels and legends.
    for text in [
        "Token-match rate by position",
        "Still identical to the reference (Kaplan–Meier)",
        "KL divergence by position (teacher-forced)",
        "PPL drift of generated text by horizon (95% CI)",
        "generated position (log scale)",
        "token-match rate",
    ] {
        assert!(html.contains(text), "{text} missing");
    }
    // Each variant's name appears in each chart's legend.
    for id in ["chart-token-match", "chart-survival", "chart-kld", "chart-ppl-drift"] {
        let start = html.find(&format!("<svg id=\"{id}\"")).unwrap();
        let chart = &html[start..start + html[start..].find("</svg>").unwrap()];
        for v in &r.variants {
            assert!(chart.contains(&format!("\n{}\n</text>", v.name)), "{id}: no legend for {}", v.name);
        }
    }
}

#[test]
fn html_has_the_tables_and_per_tensor_sqnr() {
    let html = render_html(&sample_report()).unwrap();
    assert_eq!(html.matches("<h2 id=\"horizon-").count(), 3);
    assert!(html.contains("<th class=\"num\">SQNR (dB)</th>"));
    assert!(html.contains("<td><code>model.layers.0.mlp.down_proj.weight</code></td><td class=\"num\">17.40</td>"));
}

#[test]
fn html_escapes_every_string_from_the_report() {
    let html = render_html(&hostile_report()).unwrap();
    assert!(!html.contains("<script"), "unescaped script tag");
    assert!(!html.contains("<&>"));
    assert!(html.contains("int8 &lt;&amp;&gt; &quot;x&quot; &#39;y&#39; &lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(html.contains("<title>qdrift report: models/a&amp;b &lt;c&gt;.gguf</title>"));
    assert!(html.contains("<code>GPU &lt;&quot;quoted&quot;&gt; &amp; co</code>"));
    // The charts' series attributes and legends are escaped too.
    assert!(html.contains("data-series=\"int8 &lt;&amp;&gt; &quot;x&quot; &#39;y&#39;"));
    assert!(html.contains("\nint8 &lt;&amp;&gt; &quot;x&quot; &apos;y&apos; &lt;script&gt;"));
}

#[test]
fn rendering_is_deterministic() {
    let r = sample_report();
    assert_eq!(render_markdown(&r).as_bytes(), render_markdown(&r).as_bytes());
    assert_eq!(render_summary(&r).as_bytes(), render_summary(&r).as_bytes());
    assert_eq!(render_html(&r).unwrap().as_bytes(), render_html(&r).unwrap().as_bytes());
    // Also through a JSON round trip (the renderers see only the report).
    let back: Report = serde_json::from_str(&r.to_json().unwrap()).unwrap();
    assert_eq!(render_html(&back).unwrap(), render_html(&r).unwrap());
    let gate = qdrift_report::Thresholds::parse("[variant.\"*\"]\n\"kld@10\" = { max = 0.01 }\n").unwrap();
    let a = qdrift_report::junit_xml(&qdrift_report::gate(&r, &gate).unwrap());
    let b = qdrift_report::junit_xml(&qdrift_report::gate(&back, &gate).unwrap());
    assert_eq!(a, b);
}

#[test]
fn an_invalid_report_is_not_rendered_as_html() {
    let mut r = sample_report();
    r.variants[0].per_position.kld[3] = f64::NAN;
    assert!(render_html(&r).is_err());
}
