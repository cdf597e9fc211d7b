//! `report.json`: write, read back, and refuse what this build cannot read.

mod common;

use common::temp_dir;
use qdrift_report::metrics::Placement;
use qdrift_report::testing::{sample_moe_report, sample_report};
use qdrift_report::{Group, METRICS, Report, ReportError, SCHEMA_VERSION, render_markdown};

#[test]
fn a_written_report_reads_back_equal() {
    let dir = temp_dir("round-trip");
    let path = dir.join("report.json");
    let r = sample_report();
    r.write(&path).unwrap();
    // serde_json (without `float_roundtrip`) may parse a float one ulp off: compare with what the
    // same parser makes of the same text, and check every number against the original.
    let back = Report::read(&path).unwrap();
    let reparsed: Report = serde_json::from_str(&r.to_json().unwrap()).unwrap();
    assert_eq!(back, reparsed);
    let (a, b) = (serde_json::to_value(&back).unwrap(), serde_json::to_value(&r).unwrap());
    assert_close(&a, &b);
    // Same report, same bytes.
    let first = std::fs::read(&path).unwrap();
    r.write(&path).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), first);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_report_of_another_schema_version_is_a_schema_version_error() {
    let dir = temp_dir("schema-other");
    let path = dir.join("report.json");
    let json = sample_report().to_json().unwrap();
    // Version 1 (bits per weight over the quantized tensors only) and a future version 3.
    for other in [1, 3] {
        let changed = json.replacen("\"schema_version\": 2,", &format!("\"schema_version\": {other},"), 1);
        assert_ne!(changed, json);
        std::fs::write(&path, changed).unwrap();
        match Report::read(&path) {
            Err(ReportError::SchemaVersion { found, expected, .. }) if found == other => {
                assert_eq!(expected, SCHEMA_VERSION)
            }
            other => panic!("{other:?}"),
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn truncated_json_is_a_parse_error_naming_the_file() {
    let dir = temp_dir("truncated");
    let path = dir.join("report.json");
    let json = sample_report().to_json().unwrap();
    std::fs::write(&path, &json[..json.len() / 2]).unwrap();
    let e = Report::read(&path).unwrap_err();
    assert!(matches!(e, ReportError::Parse { .. }), "{e:?}");
    assert!(e.to_string().contains("report.json"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_sample_report_is_valid_and_consistent() {
    let r = sample_report();
    r.validate().unwrap();
    assert_eq!(r.variants.len(), 3);
    for v in &r.variants {
        assert_eq!(v.per_position.token_match.len(), 1000);
        let h100 = v.horizon(100).unwrap();
        let mean: f64 = v.per_position.token_match[..100].iter().sum::<f64>() / 100.0;
        assert!((h100.metric("token_match_rate").unwrap().mean - mean).abs() < 1e-12);
        assert_eq!(v.first_divergence.survival[0].0, 0);
        assert!(v.first_divergence.survival.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 >= w[1].1));
    }
}

#[test]
fn a_report_with_routing_reads_back_equal_and_renders_its_routing() {
    let dir = temp_dir("round-trip-moe");
    let path = dir.join("report.json");
    let r = sample_moe_report();
    r.write(&path).unwrap();
    let back = Report::read(&path).unwrap();
    back.validate().unwrap();
    let reparsed: Report = serde_json::from_str(&r.to_json().unwrap()).unwrap();
    assert_eq!(back, reparsed);
    assert_close(&serde_json::to_value(&back).unwrap(), &serde_json::to_value(&r).unwrap());
    for v in &back.variants {
        let routing = v.routing.as_ref().unwrap_or_else(|| panic!("{}: routing lost", v.name));
        assert_eq!((routing.experts, routing.top_k, routing.layers.len()), (8, 2, 3));
    }
    let json = std::fs::read_to_string(&path).unwrap();
    assert!(json.contains("\"routing\": {") && json.contains("\"routing_flip_rate\": {"));
    // The Markdown of what was read has the section and a column per routing metric.
    let md = render_markdown(&back);
    assert!(md.contains("## Expert routing"));
    let first = &md[md.find("## First 10 generated tokens").unwrap()..];
    let headers: Vec<&str> = first.lines().filter(|l| l.starts_with("| Variant |")).take(Group::ALL.len()).collect();
    for m in METRICS.iter().filter(|m| m.placement == Placement::Optional) {
        assert!(
            headers.iter().any(|h| h.contains(&format!("| {} |", m.title))),
            "{}: no column in {headers:#?}",
            m.name
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_sample_report_with_routing_is_consistent() {
    let r = sample_moe_report();
    let dense = sample_report();
    let flip = |name: &str| r.variant(name).unwrap().horizon(1000).unwrap().metric("routing_flip_rate").unwrap().mean;
    // Flips rise with quantization strength, near zero on the noise floor.
    assert!(
        flip("noise-floor-f32") < 0.01 && flip("noise-floor-f32") < flip("int8") && flip("int8") < flip("int4-g128")
    );
    for (v, d) in r.variants.iter().zip(&dense.variants) {
        let routing = v.routing.as_ref().unwrap();
        for h in &v.horizons {
            // The per-horizon flip rate is the mean of the per-position curve over the horizon.
            let curve = &routing.flip_by_position[..h.tokens];
            let mean = curve.iter().sum::<f64>() / curve.len() as f64;
            assert!((h.metric("routing_flip_rate").unwrap().mean - mean).abs() < 1e-12, "{}@{}", v.name, h.tokens);
            // On the variant's own text, routers disagree more.
            let on_text = h.metric("routing_flip_rate_on_generated_text").unwrap().mean;
            assert!(on_text >= mean, "{}@{}", v.name, h.tokens);
            assert!(
                h.metric("expert_overlap").unwrap().mean > h.metric("expert_overlap_on_generated_text").unwrap().mean
            );
        }
        // The first flip in any layer comes no later than the first flip of one layer.
        let any = routing.first_flip.median.unwrap_or(1000);
        assert!(routing.layers.iter().all(|l| l.first_flip_median.unwrap_or(1000) >= any), "{}", v.name);
        // The rest is the dense sample's.
        assert_eq!((&v.first_divergence, &v.per_position), (&d.first_divergence, &d.per_position));
    }
}

fn assert_close(a: &serde_json::Value, b: &serde_json::Value) {
    use serde_json::Value;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            assert!((x - y).abs() <= 4.0 * f64::EPSILON * x.abs().max(y.abs()), "{x} vs {y}");
        }
        (Value::Array(x), Value::Array(y)) => {
            assert_eq!(x.len(), y.len());
            x.iter().zip(y).for_each(|(x, y)| assert_close(x, y));
        }
        (Value::Object(x), Value::Object(y)) => {
            assert_eq!(x.keys().collect::<Vec<_>>(), y.keys().collect::<Vec<_>>());
            x.iter().zip(y).for_each(|((_, x), (_, y))| assert_close(x, y));
        }
        _ => assert_eq!(a, b),
    }
}

/// The committed example reports, read and written again: the same text, so the layout of
/// `report.json` (key order, nesting, which keys are absent) is what it always was. Numbers may
/// differ in their last digit: serde_json, without `float_roundtrip`, may parse a float one ulp
/// off (see `a_written_report_reads_back_equal`); every other byte must be the same.
#[test]
fn the_example_reports_are_written_back_byte_identical() {
    let reports = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../reports");
    for name in ["stories260K", "smollm2-135m"] {
        let path = reports.join(name).join("report.json");
        let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let report = Report::read(&path).unwrap();
        let mut written = String::new();
        // Exactly what `Report::write` writes.
        let file = temp_dir(&format!("example-{name}")).join("report.json");
        report.write(&file).unwrap();
        written.push_str(&std::fs::read_to_string(&file).unwrap());
        assert_eq!(written.lines().count(), committed.lines().count(), "{name}");
        assert!(written.ends_with("}\n") && committed.ends_with("}\n"));
        for (i, (w, c)) in written.lines().zip(committed.lines()).enumerate() {
            if w != c {
                let (w, c) = (number_in(w), number_in(c));
                let same = matches!((w, c), (Some((pw, x, sw)), Some((pc, y, sc)))
                    if pw == pc && sw == sc && (x - y).abs() <= 4.0 * f64::EPSILON * x.abs().max(y.abs()));
                assert!(same, "{name}:{}: wrote {w:?}, committed {c:?}", i + 1);
            }
        }
        std::fs::remove_dir_all(file.parent().unwrap()).unwrap();
    }
}

/// A pretty-printed JSON line holding one number, `    "mean": 0.925,`, as its text before the
/// number, the number, and the text after it.
fn number_in(line: &str) -> Option<(&str, f64, &str)> {
    let body = line.strip_suffix(',').unwrap_or(line);
    let at = body.rfind(' ').map_or(0, |i| i + 1);
    let x: f64 = body[at..].parse().ok()?;
    Some((&line[..at], x, &line[body.len()..]))
}
