//! The Markdown, terminal and HTML renderings of a report.

mod common;

use qdrift_report::Group;
use qdrift_report::metrics::{Metric, Placement};
use qdrift_report::testing::{sample_moe_report, sample_report};
use qdrift_report::{
    METRICS, Report, Thresholds, VariantKind, gate, junit_xml, render_html, render_markdown, render_summary,
    render_summary_gated,
};

/// The metrics the dense sample report has: all but the routing ones.
fn dense_metrics() -> Vec<&'static Metric> {
    METRICS.iter().filter(|m| m.group != Group::Routing).collect()
}

/// The tables of the Markdown section of horizon `h`, each as its lines (header, rule, rows).
fn horizon_tables(md: &str, h: usize) -> Vec<Vec<&str>> {
    let heading = format!("## First {h} generated tokens");
    let at = md.find(&heading).unwrap_or_else(|| panic!("no {heading:?}"));
    let section = &md[at + heading.len()..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    let mut tables: Vec<Vec<&str>> = Vec::new();
    let mut in_table = false;
    for line in section.lines() {
        match (line.starts_with('|'), in_table) {
            (true, false) => tables.push(vec![line]),
            (true, true) => tables.last_mut().expect("a table").push(line),
            _ => {}
        }
        in_table = line.starts_with('|');
    }
    tables
}

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
        "model `model.safetensors` (hf-safetensors · llama · 134.5M parameters · sha256 3f5c0b1e9d2a)",
        "backend wgpu on `llvmpipe (LLVM 19.1.7, 256 bits)`",
        "compute f16",
        "72 prompts",
        "horizons 10, 100, 1000",
        "batch size 8",
        "seed 42",
        "eval set `stories.jsonl (built in)` (sha256 9a8b7c6d5e4f)",
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
fn files_are_named_without_the_folders_of_the_machine_that_wrote_the_report() {
    // Reports written before files were named by their name alone hold whole paths.
    let mut r = sample_report();
    r.model.path = "/work/main/xtask/../../shared/models/stories260K/stories260K.bin".into();
    r.model.format = "llama2.c".into();
    r.model.architecture = "llama2.c".into();
    r.workload.eval_set.path = "/home/ci/qdrift/eval-sets/stories.jsonl".into();
    r.variants[1].path = Some("/tmp/checkpoints/other.gguf".into());
    r.variants[1].scheme = None;
    let md = render_markdown(&r);
    let html = render_html(&r).unwrap();
    let summary = render_summary(&r);
    for text in [&md, &html, &summary] {
        assert!(!text.contains("/work/") && !text.contains("/home/") && !text.contains("/tmp/"), "{text}");
        assert!(text.contains("stories260K.bin"));
    }
    assert!(md.contains("model `stories260K.bin` (llama2.c · 134.5M parameters · sha256 3f5c0b1e9d2a)"), "{md}");
    assert!(md.contains("eval set `stories.jsonl`") && md.contains("| other.gguf |"), "{md}");
}

#[test]
fn markdown_has_a_table_per_horizon_with_intervals() {
    let r = sample_report();
    let md = render_markdown(&r);
    for &h in &r.workload.horizons {
        let tables = horizon_tables(&md, h);
        // Free-running, KL divergence, reverse KL, agreement, top-K, speculative decoding (greedy
        // and sampling), stopping: no routing table for a dense model.
        assert_eq!(tables.len(), 8, "{tables:#?}");
        let headers: Vec<&str> = tables.iter().map(|t| t[0]).collect();
        assert!(headers[0].starts_with("| Variant | Token match |"), "{}", headers[0]);
        assert!(headers[1].starts_with("| Variant | KLD mean |") && headers[1].ends_with("| Excess KLD |"));
        let shown = dense_metrics();
        let columns: usize = headers.iter().map(|l| l.matches(" | ").count()).sum();
        // Per table the variant's name, then a column per metric (the KLD's p99 is kld_p99's).
        assert_eq!(columns, shown.len(), "{headers:#?}");
        for t in &tables {
            assert_eq!(t.len(), 2 + r.variants.len(), "{t:#?}");
        }
        for (i, v) in r.variants.iter().enumerate() {
            let m = v.horizon(h).unwrap();
            let rows: Vec<&str> = tables.iter().map(|t| t[2 + i]).collect();
            assert!(rows.iter().all(|row| row.starts_with(&format!("| {} |", v.name))), "{rows:#?}");
            let tm = m.metric("token_match_rate").unwrap();
            let tm = format!("{:.4} [{:.4}, {:.4}]", tm.mean, tm.ci95[0], tm.ci95[1]);
            assert!(rows[0].contains(&tm), "{tm} missing from {}", rows[0]);
            // An interval for every metric the variant has (all but the noise floor's excess).
            let intervals: usize = rows.iter().map(|row| row.matches('[').count()).sum();
            assert_eq!(intervals, m.iter().count(), "{rows:#?}");
            assert_eq!(m.iter().count(), if v.kind == VariantKind::NoiseFloor { shown.len() - 2 } else { shown.len() });
        }
    }
    // Small KLD in scientific notation.
    let floor = r.variants[0].horizon(10).unwrap().metric("kld").unwrap().mean;
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
        assert!(block[0].starts_with("variant") && block[0].ends_with("PPL drift (gen. text)"), "{}", block[0]);
        for (line, v) in block[1..].iter().zip(&r.variants) {
            assert!(line.starts_with(&v.name), "{line}");
            assert_eq!(line.matches('[').count(), 5, "{line}");
        }
    }
    let mut evil = sample_report();
    evil.variants[0].name = "a\u{1b}[2Jb".into();
    assert!(!render_summary(&evil).contains('\u{1b}'));
}

/// The cells of a Markdown table row, trimmed.
fn cells(row: &str) -> Vec<&str> {
    row.trim().trim_matches('|').split(" | ").map(str::trim).collect()
}

#[test]
fn the_summary_ends_with_the_verdict_the_report_opens_with() {
    let r = sample_report();
    let summary = render_summary(&r);
    let md = render_markdown(&r);
    let verdict = table_after(&md, "## Verdict");
    let heading = "\nverdict: ranked by Excess KLD over the first 1000 tokens (lower is closer to the reference)\n";
    let at = summary.find(heading).unwrap_or_else(|| panic!("no verdict heading in\n{summary}"));
    let lines: Vec<&str> = summary[at + heading.len()..].lines().collect();
    // One line per ranked variant (the noise floor is not one), in the report's order, nothing after.
    assert_eq!(lines.len(), verdict.len() - 2, "{summary}");
    for (line, row) in lines.iter().zip(&verdict[2..]) {
        let c = cells(row);
        let (rank, name, words) = (c[0], c[1], c[c.len() - 1]);
        let words = words.replace("\\|", "|");
        assert!(line.starts_with(&format!("{rank}. {name} ")), "{line:?} is not {rank}. {name}");
        assert!(line.ends_with(&format!("  {words}")), "{line:?} does not end with {words:?}");
        assert!(line.contains(c[2].split(' ').next().unwrap()), "{line:?} lacks the excess KLD of {row}");
    }
    // Gated: each variant's gate verdict, as the report's verdict table has it.
    let t = Thresholds::parse(
        "[variant.\"int8\"]\n\"kld@10\" = { max = 1 }\n[variant.\"int4-g128\"]\n\"kld@10\" = { max = 1e-9 }\n",
    )
    .unwrap();
    let outcome = gate(&r, &t).unwrap();
    let gated = render_summary_gated(&r, Some(&outcome));
    let md = qdrift_report::render_markdown_gated(&r, Some(&outcome));
    for row in &table_after(&md, "## Verdict")[2..] {
        let c = cells(row);
        let line = gated.lines().find(|l| l.starts_with(&format!("{}. {} ", c[0], c[1]))).unwrap();
        assert!(line.contains(&format!(" {} ", c[2])), "{line:?} lacks the gate verdict {}", c[2]);
    }
    assert!(gated.lines().any(|l| l.starts_with("1. int8 ") && l.contains(" PASS ")), "{gated}");
    assert!(gated.lines().any(|l| l.starts_with("2. int4-g128 ") && l.contains(" FAIL ")), "{gated}");
}

/// report.json's positions are 0-based; every rendering says them 1-based, as the charts draw
/// them (position 1 is the first generated token), and the first-divergence intro says so once.
#[test]
fn positions_are_one_based_in_every_rendering() {
    let mut r = sample_moe_report();
    r.variants[1].first_divergence.median = Some(36);
    let name = r.variants[1].name.clone();
    let md = render_markdown(&r);
    let html = render_html(&r).unwrap();
    let summary = render_summary(&r);
    for text in [&md, &html, &summary] {
        assert!(text.contains("half the prompts differ from the reference by position 37"), "{text}");
        assert!(!text.contains("by position 36"), "{text}");
    }
    let first = table_after(&md, "## First divergence");
    let row = first.iter().find(|l| l.starts_with(&format!("| {name} |"))).unwrap();
    assert!(row.contains("| 37 |"), "{row}");
    assert_eq!(md.matches("position 1 is the first generated token (report.json counts from 0)").count(), 1);
    // Routing: the first flip of any layer and of each layer, one more than report.json's.
    let routing = r.variants[1].routing.as_ref().unwrap();
    let flip = routing.first_flip.median.unwrap();
    let routed = table_after(&md, "## Expert routing");
    let row = routed.iter().find(|l| l.starts_with(&format!("| {name} |"))).unwrap();
    assert!(row.contains(&format!("| {} |", flip + 1)), "{row}");
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
    assert!(html.contains("<title>qdrift report: a&amp;b &lt;c&gt;.gguf</title>"));
    assert!(html.contains("<code>GPU &lt;&quot;quoted&quot;&gt; &amp; co</code>"));
    // The charts' series attributes and legends are escaped too.
    assert!(html.contains("data-series=\"int8 &lt;&amp;&gt; &quot;x&quot; &#39;y&#39;"));
    // (The legend elides the middle of a name past 24 characters.)
    assert!(html.contains("\nint8 &lt;&amp;&gt; &quot;x…"), "the legend's name is not escaped");
}

#[test]
fn every_gateable_metric_appears_in_every_rendering() {
    // A model with experts: its report has every metric, the routing ones included.
    let r = sample_moe_report();
    let md = render_markdown(&r);
    let html = render_html(&r).unwrap();
    let escaped = |s: &str| s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('\'', "&#39;");
    for m in METRICS {
        // A column of every horizon's table, and a row of the glossary with its gate name.
        let md_column = format!("| {} |", m.title);
        let table_header = horizon_headers(&md);
        assert_eq!(
            table_header.iter().filter(|l| l.contains(&md_column)).count(),
            r.workload.horizons.len(),
            "{}: no column in the Markdown",
            m.name
        );
        assert!(md.contains(&format!("| {} | `{}` |", m.title, m.name)), "{}: not in the Markdown glossary", m.name);
        let th = format!("<th class=\"num\">{}</th>", escaped(m.title));
        // (At least: "KLD mean" and "Top-1 agreement" head the entropy strata's columns too.)
        assert!(html.matches(&th).count() >= r.workload.horizons.len(), "{}: no column in the HTML", m.name);
        assert!(html.contains(&format!("<code>{}</code>", m.name)), "{}: not in the HTML glossary", m.name);
        // A thresholds file that gates it on every variant but the noise floor.
        let thresholds =
            Thresholds::parse(&format!("[variant.\"*\"]\n\"{}@10\" = {{ min = -1e9 }}\n", m.name)).unwrap();
        let xml = junit_xml(&gate(&r, &thresholds).unwrap());
        assert_eq!(xml.matches(&format!("name=\"{}@10\"", m.name)).count(), 2, "{}: {xml}", m.name);
    }
    // rms_delta_p, once missing from both renderings, in int8's row of the first table.
    let rms = r.variants[1].horizon(10).unwrap().metric("rms_delta_p").unwrap();
    assert!(md.contains(&format!("{:.4} [{:.4}, {:.4}]", rms.mean, rms.ci95[0], rms.ci95[1])));
}

#[test]
fn the_kld_chart_has_a_log_axis_that_shows_every_variant() {
    let mut r = sample_report();
    // An exact zero (a variant equal to the reference at one position) is drawn at the floor.
    r.variants[0].per_position.kld[0] = 0.0;
    let html = render_html(&r).unwrap();
    assert!(html.contains("mean KLD (nats, log scale)"));
    assert!(html.contains("means below 1.00e-6 nats (exact zeros included) are drawn at 1.00e-6"), "no caption");
    let start = html.find("<svg id=\"chart-kld\"").unwrap();
    let chart = &html[start..start + html[start..].find("</svg>").unwrap()];
    // The noise floor (about 2e-4) and int4 (about 4e-2) are two decades apart: on a linear axis
    // the noise floor would be a flat line on the x axis, on the log axis it is well above it.
    let heights = |name: &str| -> Vec<f64> {
        let line = chart
            .lines()
            .find(|l| l.contains(&format!("data-series=\"{name}\" data-part=\"line\"")))
            .unwrap_or_else(|| panic!("no {name} line"));
        let points = line.split("points=\"").nth(1).unwrap().split('"').next().unwrap();
        points.split_whitespace().map(|p| p.split(',').nth(1).unwrap().parse::<f64>().unwrap()).collect()
    };
    let (floor, int4) = (heights("noise-floor-f32"), heights("int4-g128"));
    let mean = |ys: &[f64]| ys.iter().sum::<f64>() / ys.len() as f64;
    assert!(mean(&int4) + 100.0 < mean(&floor), "int4 is not drawn well above the noise floor");
    let (lo, hi) = floor[1..].iter().fold((f64::MAX, f64::MIN), |(lo, hi), &y| (lo.min(y), hi.max(y)));
    assert!(hi - lo > 5.0, "the noise floor's line is flat ({lo}..{hi} px)");
    assert!(floor[0] > hi, "the zero is not drawn at the floor, below the rest");
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

/// The header lines of the Markdown's per-horizon tables.
fn horizon_headers(md: &str) -> Vec<&str> {
    let report_horizons = md.lines().filter_map(|l| l.strip_prefix("## First ")?.split(' ').next()?.parse().ok());
    report_horizons.collect::<Vec<usize>>().into_iter().flat_map(|h| horizon_tables(md, h)).map(|t| t[0]).collect()
}

#[test]
fn a_dense_report_shows_no_routing_column_but_documents_every_metric() {
    let r = sample_report();
    let md = render_markdown(&r);
    let summary = render_summary(&r);
    let html = render_html(&r).unwrap();
    assert_eq!(horizon_headers(&md).len(), (Group::ALL.len() - 1) * r.workload.horizons.len());
    for m in METRICS.iter().filter(|m| m.group == Group::Routing) {
        assert!(horizon_headers(&md).iter().all(|l| !l.contains(m.title)), "{}: a column in the Markdown", m.name);
        assert!(!summary.contains(m.title), "{}: a column in the summary:\n{summary}", m.name);
        assert!(!html.contains(&format!("<th class=\"num\">{}</th>", m.title)), "{}: a column in the HTML", m.name);
        // Still in the glossary, so that every gateable name is documented.
        assert!(md.contains(&format!("| {} | `{}` |", m.title, m.name)), "{}: not in the glossary", m.name);
        assert!(html.contains(&format!("<code>{}</code>", m.name)), "{}: not in the HTML glossary", m.name);
    }
    assert!(horizon_headers(&md).iter().all(|l| !l.contains("| Expert overlap |")));
    assert!(!summary.contains("Expert overlap"), "{summary}");
}

#[test]
fn a_routing_metric_some_variants_lack_shows_a_dash_for_them() {
    let mut r = sample_moe_report();
    for h in &mut r.variants[1].horizons {
        let mut dense = qdrift_report::HorizonMetrics::new(h.tokens);
        for (m, e) in h.iter().filter(|(m, _)| m.placement != Placement::Optional) {
            dense.set(m.name, *e).unwrap();
        }
        *h = dense;
    }
    r.variants[1].routing = None;
    r.validate().unwrap();
    let md = render_markdown(&r);
    let headers = horizon_headers(&md);
    let routing: Vec<&&str> = headers.iter().filter(|l| l.contains("| Expert overlap |")).collect();
    assert_eq!(routing.len(), r.workload.horizons.len(), "{headers:#?}");
    assert!(routing.iter().all(|l| l.contains("| Routing flips |")));
    let name = &r.variants[1].name;
    // The rows of the first horizon's routing table.
    let table = horizon_tables(&md, 10).into_iter().find(|t| t[0].contains("| Expert overlap |")).unwrap();
    let row = table.iter().find(|l| l.starts_with(&format!("| {name} |"))).unwrap();
    let routed = table.iter().find(|l| l.starts_with(&format!("| {} |", r.variants[2].name))).unwrap();
    assert_eq!(row.matches(" | ").count(), routed.matches(" | ").count(), "{row}");
    assert_eq!(row.matches('—').count(), 4, "{row}");
    let summary = render_summary(&r);
    let line = summary.lines().find(|l| l.starts_with(name.as_str())).unwrap();
    assert_eq!(line.matches('—').count(), 2, "{line}");
}

/// Whether two lines are the same but for some digits: serde_json (without `float_roundtrip`)
/// may read a float one ulp off, which can flip the last printed digit of a value that sat on a
/// rounding boundary (`0.96875` → `0.9688` or `0.9687`).
fn same_but_last_digits(a: &str, b: &str) -> bool {
    a.chars().count() == b.chars().count()
        && a.chars().zip(b.chars()).all(|(x, y)| x == y || (x.is_ascii_digit() && y.is_ascii_digit()))
}

/// `rendered` is `committed` line for line but for last digits ([`same_but_last_digits`]).
fn assert_same_but_last_digits(what: &str, rendered: &str, committed: &str) {
    assert_eq!(rendered.lines().count(), committed.lines().count(), "{what}");
    for (i, (r, c)) in rendered.lines().zip(committed.lines()).enumerate() {
        assert!(same_but_last_digits(r, c), "{what}:{}: rendered {r:?}, committed {c:?}", i + 1);
    }
}

/// The committed example reports render as their committed Markdown and HTML (charts included)
/// but for last digits ([`same_but_last_digits`]): a dense model's with no routing column,
/// section or chart, and every glossary lists every metric.
///
/// `QDRIFT_BLESS=1` writes the renderings over the committed ones instead (after a change of the
/// layout, when the reports' data are unchanged); review the diff before committing it.
#[test]
fn the_example_reports_render_as_committed() {
    let reports = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../reports");
    for name in ["stories260K", "smollm2-135m", "qwen3-moe-tiny"] {
        let dir = reports.join(name);
        let report = Report::read(&dir.join("report.json")).unwrap();
        if std::env::var("QDRIFT_BLESS").is_ok_and(|v| v == "1") {
            std::fs::write(dir.join("report.md"), render_markdown(&report)).unwrap();
            std::fs::write(dir.join("report.html"), render_html(&report).unwrap()).unwrap();
        }
        let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
        let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
        assert_same_but_last_digits(&format!("{name}/report.md"), &render_markdown(&report), &md);
        assert_same_but_last_digits(&format!("{name}/report.html"), &render_html(&report).unwrap(), &html);
    }
}

/// The README's first table is copied from the SmolLM2 example report: its first-divergence
/// column is the report's median position (1-based, as the report shows it), per variant.
#[test]
fn the_readmes_first_divergence_column_is_the_example_reports() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let md = std::fs::read_to_string(root.join("reports/smollm2-135m/report.md")).unwrap();
    let table: Vec<&str> =
        readme.lines().skip_while(|l| !l.starts_with("| variant |")).take_while(|l| l.starts_with('|')).collect();
    let column = cells(table[0]).iter().position(|c| *c == "first divergence (median position)").expect("the column");
    let report: Vec<Vec<&str>> = table_after(&md, "## First divergence")[2..].iter().map(|r| cells(r)).collect();
    let mut compared = 0;
    for row in &table[2..] {
        let c = cells(row);
        let Some(r) = report.iter().find(|r| r[0] == c[0]) else { continue };
        let shown = r[2].replace("> ", "beyond ").replace(" (not reached)", "");
        assert_eq!(c[column], shown, "README's {} against report.md's {}", c[0], r[2]);
        compared += 1;
    }
    assert!(compared >= 3, "{table:#?}");
}

/// The lines of the first table after `heading` in `md`.
fn table_after<'a>(md: &'a str, heading: &str) -> Vec<&'a str> {
    let at = md.find(heading).unwrap_or_else(|| panic!("no {heading:?}"));
    md[at..].lines().skip_while(|l| !l.starts_with('|')).take_while(|l| l.starts_with('|')).collect()
}

#[test]
fn a_report_with_routing_has_an_expert_routing_section() {
    let r = sample_moe_report();
    let md = render_markdown(&r);
    let at = |s: &str| md.find(s).unwrap_or_else(|| panic!("no {s:?}"));
    assert!(at("## First divergence") < at("## Expert routing") && at("## Expert routing") < at("## Entropy strata"));
    let section = &md[at("## Expert routing")..at("## Entropy strata")];
    for words in ["teacher-forced on the reference's continuation", "top-1 expert", "|S ∩ S_ref| / k", "bootstrap"] {
        assert!(section.contains(words), "{words:?} missing from the intro:\n{section}");
    }
    // Per variant: its experts, the median first flip (or not reached) and the censored prompts.
    let first = table_after(&md, "## Expert routing");
    assert_eq!(first[0], "| Variant | Quantizes | Experts | First flip | Censored |");
    assert_eq!(first.len(), 2 + r.variants.len(), "{first:#?}");
    for (row, v) in first[2..].iter().zip(r.variants_grouped()) {
        let routing = v.routing.as_ref().unwrap();
        // 1-based: report.json's 0-based median plus one.
        let median = routing.first_flip.median.map_or("> 1000 (not reached)".to_string(), |m| (m + 1).to_string());
        let censored = format!("{} of 72", routing.first_flip.censored);
        assert_eq!(*row, format!("| {} | {} | 2 of 8 | {median} | {censored} |", v.name, v.group()));
    }
    assert!(first[2].contains("> 1000 (not reached)"), "the noise floor's routing barely flips: {}", first[2]);
    // Per (variant, layer): flips and overlap with their intervals, the layer's median first flip.
    let section_tables: Vec<&str> = section.lines().filter(|l| l.starts_with('|')).collect();
    let layers = &section_tables[first.len()..];
    assert_eq!(layers[0], "| Variant | Layer | Routing flips | Expert overlap | First flip |");
    assert_eq!(layers.len(), 2 + 3 * r.variants.len(), "{layers:#?}");
    let int4 = r.variant("int4-g128").unwrap().routing.as_ref().unwrap();
    let l = &int4.layers[2];
    let ci = |e: &qdrift_report::Estimate| format!("{:.4} [{:.4}, {:.4}]", e.mean, e.ci95[0], e.ci95[1]);
    let row = format!(
        "| int4-g128 | 29 | {} | {} | {} |",
        ci(&l.flip_rate),
        ci(&l.expert_overlap),
        l.first_flip_median.unwrap() + 1
    );
    assert!(layers.contains(&row.as_str()), "{row} missing from {layers:#?}");
    // The HTML has the same section.
    let html = render_html(&r).unwrap();
    assert!(html.contains("<h2 id=\"expert-routing\">Expert routing</h2>"));
    assert!(html.contains("<td>int4-g128</td><td class=\"num\">29</td>"));
}

/// A report with routing says whether the routers stayed at the reference's precision (the
/// workload line and the routing section's intro), or that the run quantized them; a dense
/// model's and an older report's say nothing of routers.
#[test]
fn a_report_with_routing_says_what_precision_its_routers_ran_at() {
    let kept = "kept the routers (mlp.gate) at the reference's precision";
    let mut r = sample_moe_report();
    assert_eq!(r.workload.quantize_router, Some(false));
    let md = render_markdown(&r);
    let workload = md.lines().find(|l| l.starts_with("**Workload:**")).unwrap();
    assert!(workload.ends_with(" · routers at reference precision"), "{workload}");
    let section = &md[md.find("## Expert routing").unwrap()..md.find("## Entropy strata").unwrap()];
    assert!(section.contains(kept), "{section}");
    assert!(render_html(&r).unwrap().contains("kept the routers (mlp.gate) at the reference&#39;s precision"));
    r.workload.quantize_router = Some(true);
    let md = render_markdown(&r);
    assert!(md.contains(" · routers quantized with the weights (--quantize-router)"), "{md}");
    assert!(md.contains("quantized the routers (mlp.gate) too (--quantize-router)") && !md.contains(kept), "{md}");
    r.workload.quantize_router = None;
    let md = render_markdown(&r);
    assert!(!md.contains("routers at") && !md.contains("(mlp.gate)"), "an older report does not say");
    let dense = render_markdown(&sample_report());
    assert!(!dense.contains("routers"), "a dense model has none");
}

/// For a model with experts, a variant's line of words says how often its top-1 expert flips
/// when that is at least one routing decision in a hundred; a dense model's lines never do.
#[test]
fn in_words_mentions_a_material_routing_flip_rate() {
    let mut r = sample_moe_report();
    let flips = |r: &Report, i: usize| r.variants[i].horizon(1000).unwrap().metric("routing_flip_rate").unwrap().mean;
    let name = r.variants[2].name.clone();
    assert!(flips(&r, 2) >= 0.01, "{name} flips materially in the sample");
    let md = render_markdown(&r);
    let row = |md: &str, name: &str| {
        let verdict = table_after(md, "## Verdict");
        verdict.iter().find(|l| cells(l).get(1) == Some(&name)).map(|l| l.to_string()).unwrap()
    };
    let words = format!("; top-1 expert flips at {:.1}% of routing decisions |", 100.0 * flips(&r, 2));
    let p = 100.0 * flips(&r, 2);
    let words = if p < 10.0 { words } else { format!("; top-1 expert flips at {p:.0}% of routing decisions |") };
    assert!(row(&md, &name).ends_with(&words), "{} lacks {words:?}", row(&md, &name));
    assert!(render_summary(&r).contains(words.trim_end_matches(" |")));
    // Below 1%: not mentioned.
    let e = qdrift_report::Estimate::new(0.004, [0.002, 0.006]);
    for h in &mut r.variants[2].horizons {
        h.set("routing_flip_rate", e).unwrap();
    }
    assert!(!row(&render_markdown(&r), &name).contains("top-1 expert"), "{}", row(&render_markdown(&r), &name));
    assert!(!render_markdown(&sample_report()).contains("top-1 expert flips"));
}

#[test]
fn only_variants_with_routing_are_in_the_expert_routing_section() {
    let mut r = sample_moe_report();
    r.variants[1].routing = None;
    let md = render_markdown(&r);
    let first = table_after(&md, "## Expert routing");
    assert_eq!(first.len(), 2 + r.variants.len() - 1, "{first:#?}");
    assert!(first.iter().all(|l| !l.starts_with("| int8 |")), "{first:#?}");
    let dense = render_markdown(&sample_report());
    assert!(!dense.contains("Expert routing") && !dense.contains("expert-routing"));
    assert!(!render_html(&sample_report()).unwrap().contains("expert-routing"));
}

/// The `<svg>` of the chart with `id`, if the page has one.
fn chart<'a>(html: &'a str, id: &str) -> Option<&'a str> {
    let start = html.find(&format!("<svg id=\"{id}\""))?;
    Some(&html[start..start + html[start..].find("</svg>")?])
}

/// The `cx` of each mean marker (`circle[data-part="mean"]`) of series `name` in `svg`.
fn mean_markers(svg: &str, name: &str) -> Vec<f64> {
    let tag = format!("<circle class=\"series\" data-series=\"{name}\" data-part=\"mean\"");
    svg.lines()
        .filter(|l| l.starts_with(&tag))
        .map(|l| l.split("cx=\"").nth(1).unwrap().split('"').next().unwrap().parse().unwrap())
        .collect()
}

#[test]
fn a_report_with_routing_has_routing_charts_by_layer_and_position() {
    let r = sample_moe_report();
    let html = render_html(&r).unwrap();
    let layers = chart(&html, "chart-routing-layers").expect("a per-layer chart");
    assert!(layers.contains("Routing flips by layer (95% CI)"));
    let names: Vec<String> = r.variants.iter().map(|v| v.name.clone()).collect();
    // One interval series per variant: a line through its means, a marker and a bar with two
    // caps per layer, a legend entry.
    let lines = series_points(&html, "chart-routing-layers");
    assert_eq!(lines.iter().map(|s| s.0.clone()).collect::<Vec<_>>(), names);
    assert!(lines.iter().all(|s| s.1 == 3), "{lines:?}");
    for v in &r.variants {
        let markers = mean_markers(layers, &v.name);
        assert_eq!(markers.len(), v.routing.as_ref().unwrap().layers.len(), "{}", v.name);
        let bars = format!("<polyline class=\"series\" data-series=\"{}\" data-part=\"interval\"", v.name);
        assert_eq!(layers.matches(&bars).count(), 9, "{}: a bar and two caps per layer", v.name);
        assert!(layers.contains(&format!("\n{}\n</text>", v.name)), "no legend for {}", v.name);
        // The x axis is linear in the layer index: layer 15 sits 15/29 of the way from 0 to 29.
        let (x0, x15, x29) = (markers[0], markers[1], markers[2]);
        assert!(((x15 - x0) - 15.0 / 29.0 * (x29 - x0)).abs() <= 2.0, "{}: {markers:?}", v.name);
    }
    // Flips by position: one line per variant, one point per generated position.
    let position = series_points(&html, "chart-routing-position");
    assert_eq!(position.iter().map(|s| s.0.clone()).collect::<Vec<_>>(), names);
    assert!(position.iter().all(|s| s.1 == 1000), "{position:?}");
    for text in ["Routing flips by position", "share of layers whose top-1 expert flips", "top-1 expert flip rate"] {
        assert!(html.contains(text), "{text} missing");
    }
    assert!(html.contains("Bars are 95% bootstrap intervals over prompts"), "no caption for the per-layer chart");
}

#[test]
fn only_variants_with_routing_have_routing_series_and_a_dense_report_has_no_routing_chart() {
    let mut r = sample_moe_report();
    r.variants[1].routing = None;
    let html = render_html(&r).unwrap();
    let expected = vec![r.variants[0].name.clone(), r.variants[2].name.clone()];
    for id in ["chart-routing-layers", "chart-routing-position"] {
        let names: Vec<String> = series_points(&html, id).into_iter().map(|s| s.0).collect();
        assert_eq!(names, expected, "{id}");
    }
    let dense = render_html(&sample_report()).unwrap();
    assert!(chart(&dense, "chart-routing-layers").is_none() && chart(&dense, "chart-routing-position").is_none());
    assert!(!dense.contains("Routing flips by"));
    assert_eq!(dense.matches("<svg").count(), 4);
    assert_eq!(html.matches("<svg").count(), 6);
}
