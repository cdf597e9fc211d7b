//! `qdrift gate`: thresholds files, ci/point semantics, wildcard variants, exit codes, JUnit.

mod common;

use std::path::Path;

use common::{mean_ci, temp_dir};
use qdrift_report::testing::sample_report;
use qdrift_report::{
    Bound, GateError, GateOutcome, Report, Thresholds, Verdict, exit_code, gate, junit_error_xml, junit_xml, run_gate,
};

fn run(report: &Report, toml: &str) -> Result<GateOutcome, GateError> {
    gate(report, &Thresholds::parse(toml)?)
}

fn lines(outcome: &GateOutcome) -> Vec<String> {
    outcome.results.iter().map(|r| r.line()).collect()
}

/// The sample report with int8's token-match rate over 100 tokens set to mean 0.85, CI
/// [0.78, 0.90]: a `min = 0.80` threshold is cleared by the mean but not by the lower bound.
fn point_passes_ci_fails() -> Report {
    let mut r = sample_report();
    let v = r.variants.iter_mut().find(|v| v.name == "int8").unwrap();
    let h = v.horizons.iter_mut().find(|h| h.tokens == 100).unwrap();
    h.set("token_match_rate", mean_ci(0.85, 0.78, 0.90)).unwrap();
    r
}

#[test]
fn a_report_within_every_threshold_passes_with_exit_code_0() {
    let toml = r#"
        [defaults]
        bound = "ci"
        [variant."int8"]
        "token_match_rate@10" = { min = 0.9 }
        "kld@1000" = { max = 0.01 }
        "ppl_drift_of_generated_text@1000" = { max = 1.5 }
        [variant."*"]
        "top1_agreement@10" = { min = 0.5 }
    "#;
    let outcome = run(&sample_report(), toml);
    assert_eq!(exit_code(&outcome), 0, "{outcome:?}");
    let outcome = outcome.unwrap();
    // int8: three explicit checks and the wildcard one; int4-g128: the wildcard one.
    assert_eq!(outcome.results.len(), 5);
    assert!(outcome.passed());
    let l = lines(&outcome);
    assert!(l.iter().all(|l| l.starts_with("PASS ")), "{l:#?}");
    assert!(
        outcome.lines().ends_with("gate: 5 checks, 5 passed, 0 failed, 0 inconclusive: PASS\n"),
        "{}",
        outcome.lines()
    );
}

#[test]
fn a_report_outside_a_threshold_fails_with_exit_code_1_and_says_which_value() {
    let r = sample_report();
    let kld = *r.variant("int4-g128").unwrap().horizon(1000).unwrap().metric("kld").unwrap();
    let tmr = *r.variant("int4-g128").unwrap().horizon(100).unwrap().metric("token_match_rate").unwrap();
    let toml = r#"
        [variant."int4-g128"]
        "token_match_rate@100" = { min = 0.80 }
        "kld@1000" = { max = 0.05 }
    "#;
    let outcome = run(&r, toml);
    assert_eq!(exit_code(&outcome), 1);
    let outcome = outcome.unwrap();
    assert_eq!(outcome.failures().count(), 1, "{:#?}", lines(&outcome));
    assert_eq!(
        lines(&outcome),
        // In METRICS order, not the file's; four significant digits.
        [
            // The whole interval below 0.8: a fail, and its MDE is the upper half-width.
            "FAIL int4-g128 token_match_rate@100 bound=ci value=0.3518 (lower CI bound) threshold=min ≥ 0.8 \
             ci95=[0.3518, 0.5863] mde=0.1173",
            "PASS int4-g128 kld@1000 bound=ci value=0.04701 (upper CI bound) threshold=max ≤ 0.05 \
             ci95=[0.03516, 0.04701] mde=6.132e-3",
        ]
    );
    let [lower, upper] = [outcome.results[0].value, outcome.results[1].value];
    assert_eq!((lower, upper), (tmr.ci95[0], kld.ci95[1]), "the values compared are the interval's bounds");
    assert!((outcome.results[0].mde().unwrap() - (tmr.ci95[1] - tmr.mean)).abs() < 1e-15);
}

#[test]
fn point_and_ci_semantics_differ_when_the_mean_clears_and_the_bound_does_not() {
    let r = point_passes_ci_fails();
    let ci = run(&r, "[variant.int8]\n\"token_match_rate@100\" = { min = 0.80 }\n").unwrap();
    // The interval [0.78, 0.90] straddles 0.80: inconclusive, and 72 · (0.07 / 0.05)² = 141.1
    // prompts would resolve it.
    // The MDE 0.85 − 0.78 is 0.07000000000000006 in f64: printed to four significant digits.
    assert_eq!(
        lines(&ci),
        ["INCONCLUSIVE int8 token_match_rate@100 bound=ci value=0.78 (lower CI bound) threshold=min ≥ 0.8 \
             ci95=[0.78, 0.9] mde=0.07 prompts=72 prompts_needed=142"]
    );
    assert_eq!(exit_code(&Ok(ci)), 3);
    let point =
        run(&r, "[defaults]\nbound = \"point\"\n[variant.int8]\n\"token_match_rate@100\" = { min = 0.80 }\n").unwrap();
    assert_eq!(lines(&point), ["PASS int8 token_match_rate@100 bound=point value=0.85 (mean) threshold=min ≥ 0.8"]);
    // max: the upper bound 0.90 is above 0.88, the mean 0.85 below.
    let max_ci = run(&r, "[variant.int8]\n\"token_match_rate@100\" = { max = 0.88 }\n").unwrap();
    assert!(!max_ci.passed());
    assert_eq!(max_ci.results[0].verdict, Verdict::Inconclusive);
    assert_eq!(max_ci.results[0].value, 0.90);
    let max_point = run(&r, "[variant.int8]\n\"token_match_rate@100\" = { max = 0.88, bound = \"point\" }\n").unwrap();
    assert!(max_point.passed());
}

#[test]
fn gate_lines_print_four_significant_digits_and_more_only_at_the_threshold() {
    // The numbers of the issue's log: 0.5499999999999999 and an MDE of 6.252050617274569e-5.
    let mut r = sample_report();
    let v = r.variants.iter_mut().find(|v| v.name == "int8").unwrap();
    let h = v.horizons.iter_mut().find(|h| h.tokens == 100).unwrap();
    let hi = 0.5499999999999999;
    let mean = hi - 0.00006252050617274569;
    h.set("top1_agreement", mean_ci(mean, mean - 0.01, hi)).unwrap();
    let outcome = run(&r, "[variant.int8]\n\"top1_agreement@100\" = { max = 0.6 }\n").unwrap();
    assert_eq!(
        lines(&outcome),
        ["PASS int8 top1_agreement@100 bound=ci value=0.55 (upper CI bound) threshold=max ≤ 0.6 \
          ci95=[0.5399, 0.55] mde=6.252e-5"]
    );
    // A value a hair above the threshold it fails is not printed as the threshold itself.
    let outcome = run(&r, "[variant.int8]\n\"top1_agreement@100\" = { max = 0.54999 }\n").unwrap();
    let line = &lines(&outcome)[0];
    assert!(line.starts_with("INCONCLUSIVE int8 top1_agreement@100 bound=ci value=0.55 "), "{line}");
    let outcome = run(&r, "[variant.int8]\n\"top1_agreement@100\" = { max = 0.54999999 }\n").unwrap();
    let line = &lines(&outcome)[0];
    assert!(line.contains(" value=0.55 ") && line.contains("threshold=max ≤ 0.54999999"), "{line}");
    // Just under a threshold it passes: not printed as the threshold either.
    let outcome = run(&r, "[variant.int8]\n\"top1_agreement@100\" = { max = 0.55 }\n").unwrap();
    let line = &lines(&outcome)[0];
    assert!(line.starts_with("PASS int8 top1_agreement@100 bound=ci value=0.5499999999999999 (upper"), "{line}");
    assert!(line.contains(" ci95=[0.5399, 0.5499999999999999] mde=6.252e-5"), "{line}");
}

#[test]
fn a_check_can_override_the_default_bound() {
    let r = point_passes_ci_fails();
    let toml = r#"
        [defaults]
        bound = "ci"
        [variant.int8]
        "token_match_rate@100" = { min = 0.80, bound = "point" }
        "exact_match_fraction@100" = { min = 0.0 }
    "#;
    let outcome = run(&r, toml).unwrap();
    let bounds: Vec<(String, Bound)> = outcome.results.iter().map(|c| (c.metric.clone(), c.bound)).collect();
    assert_eq!(
        bounds,
        [("token_match_rate".to_string(), Bound::Point), ("exact_match_fraction".to_string(), Bound::Ci)]
    );
    assert!(outcome.passed());
    // And the other way round: a point default, one check on the interval.
    let toml =
        "[defaults]\nbound = \"point\"\n[variant.int8]\n\"token_match_rate@100\" = { min = 0.80, bound = \"ci\" }\n";
    assert_eq!(exit_code(&run(&r, toml)), 3);
}

#[test]
fn a_check_with_min_and_max_is_two_outcomes() {
    let r = point_passes_ci_fails();
    let outcome = run(&r, "[variant.int8]\n\"token_match_rate@100\" = { min = 0.5, max = 0.95 }\n").unwrap();
    let names: Vec<String> = outcome.results.iter().map(|c| c.name()).collect();
    assert_eq!(names, ["token_match_rate@100 (min)", "token_match_rate@100 (max)"]);
    assert_eq!(outcome.results[0].value, 0.78);
    assert_eq!(outcome.results[1].value, 0.90);
    assert!(outcome.passed());
}

#[test]
fn the_wildcard_applies_to_every_variant_but_the_noise_floor() {
    let outcome = run(&sample_report(), "[variant.\"*\"]\n\"top1_agreement@10\" = { min = 0.0 }\n").unwrap();
    let variants: Vec<&str> = outcome.results.iter().map(|c| c.variant.as_str()).collect();
    assert_eq!(variants, ["int8", "int4-g128"]);
    assert!(outcome.results.iter().all(|c| c.section == "*"));
    // An excess metric under "*" is fine: the noise floor is not among the variants it checks.
    let outcome = run(&sample_report(), "[variant.\"*\"]\n\"excess_kld@100\" = { max = 1.0 }\n").unwrap();
    assert_eq!(outcome.results.len(), 2);
}

#[test]
fn an_explicit_entry_and_the_wildcard_both_apply() {
    let toml = r#"
        [variant."*"]
        "top1_agreement@10" = { min = 0.0 }
        [variant."int8"]
        "top1_agreement@10" = { min = 0.99 }
        "kld@10" = { max = 1.0 }
    "#;
    let outcome = run(&sample_report(), toml).unwrap();
    let got: Vec<(String, String, String)> =
        outcome.results.iter().map(|c| (c.variant.clone(), c.section.clone(), c.name())).collect();
    let want = [
        ("int8", "int8", "kld@10"),
        ("int8", "int8", "top1_agreement@10"),
        ("int8", "*", "top1_agreement@10"),
        ("int4-g128", "*", "top1_agreement@10"),
    ];
    assert_eq!(got, want.map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string())));
    // The explicit, stricter check fails; the wildcard one passes.
    assert_eq!(outcome.failures().count(), 1);
    assert_eq!(outcome.failures().next().unwrap().section, "int8");
}

#[test]
fn the_noise_floor_can_be_checked_by_name() {
    let outcome = run(&sample_report(), "[variant.\"noise-floor-f32\"]\n\"kld@1000\" = { max = 0.001 }\n").unwrap();
    assert_eq!(lines(&outcome).len(), 1);
    assert!(outcome.passed());
}

#[test]
fn integer_thresholds_are_numbers() {
    let outcome = run(&sample_report(), "[variant.int8]\n\"ppl_ratio_on_reference_text@10\" = { min = 1, max = 2 }\n");
    assert_eq!(exit_code(&outcome), 0, "{outcome:?}");
}

// ---- unusable input: exit code 2, one line ----

fn unusable(report: &Report, toml: &str) -> GateError {
    let outcome = run(report, toml);
    assert_eq!(exit_code(&outcome), 2, "{outcome:?}");
    let e = outcome.unwrap_err();
    assert!(!e.to_string().contains('\n'), "not one line: {e}");
    e
}

#[test]
fn exit_2_a_missing_thresholds_file() {
    let dir = temp_dir("missing-thresholds");
    let report = dir.join("report.json");
    sample_report().write(&report).unwrap();
    let missing = dir.join("thresholds.toml");
    let run = run_gate(&report, &missing, None);
    assert_eq!(run.exit_code, 2);
    assert_eq!(run.stdout, "");
    assert!(run.stderr.contains("thresholds.toml") && run.stderr.contains("cannot read"), "{}", run.stderr);
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
}

#[test]
fn exit_2_a_missing_report_file() {
    let dir = temp_dir("missing-report");
    let thresholds = dir.join("thresholds.toml");
    std::fs::write(&thresholds, "[variant.int8]\n\"kld@10\" = { max = 1 }\n").unwrap();
    let run = run_gate(&dir.join("report.json"), &thresholds, None);
    assert_eq!(run.exit_code, 2);
    assert!(run.stderr.contains("report.json"), "{}", run.stderr);
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
}

#[test]
fn exit_2_a_toml_syntax_error_names_the_line() {
    let e = unusable(&sample_report(), "[variant.int8]\n\"kld@10\" = { max = }\n");
    let GateError::Toml { line, .. } = &e else { panic!("{e:?}") };
    assert_eq!(*line, 2, "{e}");
    assert!(e.to_string().starts_with("thresholds:2:"), "{e}");
}

#[test]
fn exit_2_an_unknown_key() {
    let e = unusable(&sample_report(), "[variant.int8]\n\"kld@10\" = { mxa = 0.1 }\n");
    assert!(matches!(e, GateError::Toml { .. }), "{e:?}");
    assert!(e.to_string().contains("mxa"), "{e}");
    let e = unusable(&sample_report(), "[default]\nbound = \"ci\"\n");
    assert!(e.to_string().contains("default"), "{e}");
    let e = unusable(&sample_report(), "[defaults]\nbond = \"ci\"\n");
    assert!(e.to_string().contains("bond"), "{e}");
}

#[test]
fn exit_2_an_unknown_metric_lists_the_known_ones() {
    let e = unusable(&sample_report(), "[variant.int8]\n\"kl_divergence@10\" = { max = 0.1 }\n");
    assert!(matches!(e, GateError::UnknownMetric { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("kl_divergence") && msg.contains("token_match_rate, exact_match_fraction, kld"), "{msg}");
    // A near miss gets the name it probably meant.
    let e = unusable(&sample_report(), "[variant.int8]\n\"token_match@10\" = { max = 0.1 }\n");
    assert!(e.to_string().contains("\"token_match\" (did you mean token_match_rate?)"), "{e}");
    assert!(!msg.contains("did you mean"), "no guess for a name far from every metric: {msg}");
}

#[test]
fn exit_2_a_key_without_a_horizon() {
    let e = unusable(&sample_report(), "[variant.int8]\n\"kld\" = { max = 0.1 }\n");
    assert!(matches!(e, GateError::BadKey { .. }), "{e:?}");
    let e = unusable(&sample_report(), "[variant.int8]\n\"kld@ten\" = { max = 0.1 }\n");
    assert!(matches!(e, GateError::BadKey { .. }), "{e:?}");
}

#[test]
fn exit_2_an_unknown_horizon_lists_the_reports() {
    let e = unusable(&sample_report(), "[variant.int8]\n\"kld@50\" = { max = 0.1 }\n");
    assert!(matches!(e, GateError::UnknownHorizon { horizon: 50, .. }), "{e:?}");
    assert!(e.to_string().contains("its horizons: 10, 100, 1000"), "{e}");
    // Also under the wildcard.
    let e = unusable(&sample_report(), "[variant.\"*\"]\n\"kld@2000\" = { max = 0.1 }\n");
    assert!(matches!(e, GateError::UnknownHorizon { horizon: 2000, .. }), "{e:?}");
}

#[test]
fn exit_2_an_unknown_variant_lists_the_reports() {
    let e = unusable(&sample_report(), "[variant.int3]\n\"kld@10\" = { max = 0.1 }\n");
    assert!(matches!(e, GateError::UnknownVariant { .. }), "{e:?}");
    assert!(e.to_string().contains("its variants: noise-floor-f32, int8, int4-g128"), "{e}");
    assert!(e.to_string().contains("no such variant (did you mean int8?)"), "{e}");
    let e = unusable(&sample_report(), "[variant.INT4-G128]\n\"kld@10\" = { max = 0.1 }\n");
    assert!(e.to_string().contains("(did you mean int4-g128?)"), "{e}");
}

#[test]
fn exit_2_an_excess_metric_on_the_noise_floor() {
    let e =
        unusable(&sample_report(), "[variant.\"noise-floor-f32\"]\n\"excess_token_match_rate@10\" = { min = -0.1 }\n");
    assert!(matches!(e, GateError::ExcessOnNoiseFloor { .. }), "{e:?}");
    assert!(e.to_string().contains("noise floor"), "{e}");
}

#[test]
fn exit_2_a_report_of_another_schema_version() {
    let dir = temp_dir("schema-version");
    let report = dir.join("report.json");
    let json = sample_report().to_json().unwrap().replacen("\"schema_version\": 2", "\"schema_version\": 1", 1);
    std::fs::write(&report, json).unwrap();
    let thresholds = dir.join("thresholds.toml");
    std::fs::write(&thresholds, "[variant.int8]\n\"kld@10\" = { max = 1 }\n").unwrap();
    let run = run_gate(&report, &thresholds, None);
    assert_eq!(run.exit_code, 2);
    assert!(run.stderr.contains("schema_version 1"), "{}", run.stderr);
}

#[test]
fn exit_2_a_check_with_neither_min_nor_max() {
    let e = unusable(&sample_report(), "[variant.int8]\n\"kld@10\" = { bound = \"ci\" }\n");
    assert!(matches!(e, GateError::NoLimit { .. }), "{e:?}");
    let e = unusable(&sample_report(), "[variant.int8]\n\"kld@10\" = {}\n");
    assert!(matches!(e, GateError::NoLimit { .. }), "{e:?}");
}

#[test]
fn exit_2_an_unknown_bound() {
    let e = unusable(&sample_report(), "[defaults]\nbound = \"mean\"\n[variant.int8]\n\"kld@10\" = { max = 1 }\n");
    assert!(matches!(e, GateError::UnknownBound { .. }), "{e:?}");
    assert!(e.to_string().contains("[defaults]"), "{e}");
    let e = unusable(&sample_report(), "[variant.int8]\n\"kld@10\" = { max = 1, bound = \"CI\" }\n");
    assert!(matches!(e, GateError::UnknownBound { .. }), "{e:?}");
}

#[test]
fn exit_2_thresholds_that_check_nothing() {
    let e = unusable(&sample_report(), "[defaults]\nbound = \"ci\"\n");
    assert!(matches!(e, GateError::NoChecks), "{e:?}");
    let mut only_floor = sample_report();
    only_floor.variants.truncate(1);
    let e = unusable(&only_floor, "[variant.\"*\"]\n\"kld@10\" = { max = 1 }\n");
    assert!(matches!(e, GateError::NoChecks), "{e:?}");
}

#[test]
fn exit_2_a_threshold_that_no_value_can_meet() {
    let e = unusable(&sample_report(), "[variant.int8]\n\"kld@10\" = { max = nan }\n");
    assert!(matches!(e, GateError::BadLimit { .. }), "{e:?}");
    let e = unusable(&sample_report(), "[variant.int8]\n\"kld@10\" = { min = 0.2, max = 0.1 }\n");
    assert!(matches!(e, GateError::BadLimit { .. }), "{e:?}");
}

// ---- the CLI's wrapper and JUnit ----

fn parse_junit(xml: &str) -> roxmltree::Document<'_> {
    roxmltree::Document::parse(xml).unwrap_or_else(|e| panic!("not XML: {e}\n{xml}"))
}

fn attr<'a>(node: roxmltree::Node<'a, '_>, name: &str) -> &'a str {
    node.attribute(name).unwrap_or_else(|| panic!("<{}> has no {name}", node.tag_name().name()))
}

#[test]
fn junit_has_one_testcase_per_check_and_a_failure_per_failed_check() {
    let toml = r#"
        [variant."int4-g128"]
        "token_match_rate@100" = { min = 0.80 }
        "kld@1000" = { max = 0.05 }
        "ppl_drift_of_generated_text@1000" = { max = 1.10, bound = "point" }
        [variant."*"]
        "top1_agreement@10" = { min = 0.5 }
    "#;
    let outcome = run(&sample_report(), toml).unwrap();
    let xml = junit_xml(&outcome);
    let doc = parse_junit(&xml);
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "testsuites");
    let suites: Vec<_> = root.children().filter(|n| n.has_tag_name("testsuite")).collect();
    assert_eq!(suites.len(), 1);
    let suite = suites[0];
    assert_eq!(attr(suite, "name"), "qdrift gate");
    assert_eq!(attr(suite, "tests"), "5");
    assert_eq!(attr(suite, "failures"), "2");
    assert_eq!(attr(suite, "errors"), "0");
    let cases: Vec<_> = suite.children().filter(|n| n.has_tag_name("testcase")).collect();
    assert_eq!(cases.len(), 5);
    let failed: Vec<(&str, &str)> = cases
        .iter()
        .filter(|c| c.children().any(|n| n.has_tag_name("failure")))
        .map(|c| (attr(*c, "classname"), attr(*c, "name")))
        .collect();
    assert_eq!(
        failed,
        [
            ("qdrift.gate.int4-g128", "token_match_rate@100"),
            ("qdrift.gate.int4-g128", "ppl_drift_of_generated_text@1000")
        ]
    );
    let failure = cases[1].children().find(|n| n.has_tag_name("failure")).unwrap();
    assert!(attr(failure, "message").starts_with("FAIL int4-g128 token_match_rate@100 bound=ci"), "{xml}");
    assert_eq!(failure.text().unwrap(), attr(failure, "message"));
}

#[test]
fn junit_escapes_names() {
    let mut r = sample_report();
    r.variants[1].name = "int8 <\"&'>".into();
    let outcome = run(&r, "[variant.\"int8 <\\\"&'>\"]\n\"kld@10\" = { max = 0.0 }\n").unwrap();
    let xml = junit_xml(&outcome);
    let doc = parse_junit(&xml);
    let case = doc.descendants().find(|n| n.has_tag_name("testcase")).unwrap();
    assert_eq!(attr(case, "classname"), "qdrift.gate.int8 <\"&'>");
    let failure = case.children().find(|n| n.has_tag_name("failure")).unwrap();
    assert!(failure.text().unwrap().starts_with("FAIL int8 <\"&'> kld@10"));
}

#[test]
fn run_gate_writes_junit_atomically_and_prints_the_outcome() {
    let dir = temp_dir("run-gate");
    let report = dir.join("report.json");
    sample_report().write(&report).unwrap();
    let thresholds = dir.join("thresholds.toml");
    std::fs::write(&thresholds, "[variant.\"int4-g128\"]\n\"token_match_rate@100\" = { min = 0.80 }\n").unwrap();
    let junit = dir.join("junit.xml");
    std::fs::write(&junit, "stale").unwrap();
    let run = run_gate(&report, &thresholds, Some(&junit));
    assert_eq!(run.exit_code, 1);
    assert_eq!(run.stderr, "");
    let out: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(out.len(), 2, "{}", run.stdout);
    assert!(out[0].starts_with("FAIL int4-g128 token_match_rate@100 bound=ci value="), "{}", out[0]);
    assert_eq!(out[1], "gate: 1 checks, 0 passed, 1 failed, 0 inconclusive: FAIL");
    let xml = std::fs::read_to_string(&junit).unwrap();
    let doc = parse_junit(&xml);
    assert_eq!(doc.descendants().filter(|n| n.has_tag_name("failure")).count(), 1);
    let names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 3, "stray temporary files: {names:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn run_gate_on_unusable_input_writes_a_junit_error() {
    let dir = temp_dir("run-gate-error");
    let report = dir.join("report.json");
    sample_report().write(&report).unwrap();
    let thresholds = dir.join("thresholds.toml");
    std::fs::write(&thresholds, "[variant.int3]\n\"kld@10\" = { max = 1 }\n").unwrap();
    let junit = dir.join("junit.xml");
    let run = run_gate(&report, &thresholds, Some(&junit));
    assert_eq!(run.exit_code, 2);
    let xml = std::fs::read_to_string(&junit).unwrap();
    let doc = parse_junit(&xml);
    let suite = doc.descendants().find(|n| n.has_tag_name("testsuite")).unwrap();
    assert_eq!(attr(suite, "errors"), "1");
    let error = doc.descendants().find(|n| n.has_tag_name("error")).unwrap();
    assert!(attr(error, "message").contains("int3"));
    assert_eq!(
        xml,
        junit_error_xml(&GateError::UnknownVariant {
            name: "int3".into(),
            known: vec!["noise-floor-f32".into(), "int8".into(), "int4-g128".into()],
        })
    );
    // An unwritable JUnit path makes an otherwise passing gate unusable, before it runs (the
    // output rule: every output is checked first).
    std::fs::write(&thresholds, "[variant.int8]\n\"kld@10\" = { max = 1 }\n").unwrap();
    let run = run_gate(&report, &thresholds, Some(Path::new("/nonexistent-qdrift-dir/junit.xml")));
    assert_eq!(run.exit_code, 2);
    assert_eq!(run.stdout, "");
    assert_eq!(
        run.stderr,
        "qdrift: error: --junit /nonexistent-qdrift-dir/junit.xml: its folder /nonexistent-qdrift-dir does not exist\n"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn thresholds_read_names_the_file_in_toml_errors() {
    let dir = temp_dir("read-names-file");
    let path = dir.join("gate.toml");
    std::fs::write(&path, "[variant.int8\n").unwrap();
    let e = Thresholds::read(&path).unwrap_err();
    assert!(e.to_string().starts_with(&format!("{}:1:", path.display())), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_unquoted_key_with_an_at_sign_gets_a_hint() {
    let e = Thresholds::parse("[variant.int8]\nkld@100 = { max = 0.01 }\n").unwrap_err().to_string();
    assert!(e.starts_with("thresholds:2:"), "{e}");
    assert!(e.ends_with("; keys with @ must be quoted: \"kld@100\" = { max = 0.01 }"), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
    // Other TOML errors get no hint.
    let e = Thresholds::parse("[variant.int8\n\"kld@100\" = { max = 0.01 }\n").unwrap_err().to_string();
    assert!(!e.contains("must be quoted"), "{e}");
}

// ---- three verdicts ----

/// int8's token-match rate over 100 tokens set to mean 0.85, interval [0.78, 0.90], checked
/// with `min = threshold` on the interval.
fn min_check(threshold: f64) -> qdrift_report::CheckResult {
    let toml = format!("[variant.int8]\n\"token_match_rate@100\" = {{ min = {threshold} }}\n");
    run(&point_passes_ci_fails(), &toml).unwrap().results.remove(0)
}

#[test]
fn a_ci_check_passes_fails_or_is_inconclusive_by_where_the_interval_lies() {
    // min: passes from the lower bound down (equal passes), fails above the upper bound.
    for (threshold, verdict) in [
        (0.5, Verdict::Pass),
        (0.78, Verdict::Pass),
        (0.7800001, Verdict::Inconclusive),
        (0.85, Verdict::Inconclusive),
        (0.90, Verdict::Inconclusive),
        (0.9000001, Verdict::Fail),
    ] {
        assert_eq!(min_check(threshold).verdict, verdict, "min = {threshold}");
    }
    // max: the mirror image.
    for (threshold, verdict) in [
        (0.95, Verdict::Pass),
        (0.90, Verdict::Pass),
        (0.8999999, Verdict::Inconclusive),
        (0.78, Verdict::Inconclusive),
        (0.7799999, Verdict::Fail),
    ] {
        let toml = format!("[variant.int8]\n\"token_match_rate@100\" = {{ max = {threshold} }}\n");
        let outcome = run(&point_passes_ci_fails(), &toml).unwrap();
        assert_eq!(outcome.results[0].verdict, verdict, "max = {threshold}");
    }
    // A point check is never inconclusive.
    let toml = "[variant.int8]\n\"token_match_rate@100\" = { min = 0.86, bound = \"point\" }\n";
    let outcome = run(&point_passes_ci_fails(), toml).unwrap();
    assert_eq!(outcome.results[0].verdict, Verdict::Fail);
    assert_eq!((outcome.results[0].mde(), outcome.results[0].prompts_needed()), (None, None));
}

#[test]
fn the_mde_is_the_half_width_facing_the_threshold_and_prompts_needed_scales_it_as_one_over_root_n() {
    // Below the mean the lower half-width (0.07) decides, above it the upper one (0.05).
    let below = min_check(0.80);
    assert!((below.mde().unwrap() - 0.07).abs() < 1e-12);
    assert_eq!(below.prompts_needed(), Some((72.0f64 * (0.07f64 / 0.05).powi(2)).ceil() as u64));
    let above = min_check(0.88);
    assert!((above.mde().unwrap() - 0.05).abs() < 1e-12);
    // 72 · (0.05 / 0.03)² = 200.
    assert_eq!(above.prompts_needed(), Some(200));
    // At the estimate no prompt count resolves the check.
    let at = min_check(0.85);
    assert_eq!(at.prompts_needed(), None);
    assert!(at.line().ends_with("prompts=72 prompts_needed=unbounded"), "{}", at.line());
    // Resolved checks need no more prompts.
    assert_eq!(min_check(0.5).prompts_needed(), None);
    assert_eq!(min_check(0.95).prompts_needed(), None);
    // With the needed count the interval, narrowed by √(72 / n), clears the threshold.
    let n = below.prompts_needed().unwrap() as f64;
    assert!(0.85 - 0.07 * (72.0 / n).sqrt() >= 0.80);
    assert!(0.85 - 0.07 * (72.0 / (n - 1.0)).sqrt() < 0.80);
}

#[test]
fn fail_outranks_inconclusive_and_inconclusive_outranks_pass() {
    let r = point_passes_ci_fails();
    let inconclusive = run(&r, "[variant.int8]\n\"token_match_rate@100\" = { min = 0.8 }\n\"kld@10\" = { min = 0 }\n");
    assert_eq!(exit_code(&inconclusive), 3);
    let inconclusive = inconclusive.unwrap();
    assert_eq!(inconclusive.verdict(), Verdict::Inconclusive);
    assert_eq!(inconclusive.variant_verdict("int8"), Some(Verdict::Inconclusive));
    assert_eq!(inconclusive.variant_verdict("int4-g128"), None);
    assert!(inconclusive.lines().ends_with("gate: 2 checks, 1 passed, 0 failed, 1 inconclusive: INCONCLUSIVE\n"));
    let failed = run(&r, "[variant.int8]\n\"token_match_rate@100\" = { min = 0.8 }\n\"kld@10\" = { max = 0 }\n");
    assert_eq!(exit_code(&failed), 1);
    assert_eq!(failed.unwrap().verdict(), Verdict::Fail);
}

#[test]
fn junit_marks_an_inconclusive_check_skipped() {
    let r = point_passes_ci_fails();
    let outcome =
        run(&r, "[variant.int8]\n\"token_match_rate@100\" = { min = 0.8 }\n\"kld@10\" = { max = 0 }\n").unwrap();
    let xml = junit_xml(&outcome);
    let doc = parse_junit(&xml);
    let suite = doc.root_element().children().find(|n| n.has_tag_name("testsuite")).unwrap();
    assert_eq!((attr(suite, "tests"), attr(suite, "failures"), attr(suite, "skipped")), ("2", "1", "1"));
    assert_eq!(attr(doc.root_element(), "skipped"), "1");
    let case = suite.children().find(|c| c.has_tag_name("testcase") && attr(*c, "name") == "token_match_rate@100");
    let skipped = case.unwrap().children().find(|n| n.has_tag_name("skipped")).expect("a <skipped>");
    assert!(attr(skipped, "message").starts_with("INCONCLUSIVE int8 token_match_rate@100"), "{xml}");
    assert!(attr(skipped, "message").ends_with("prompts_needed=142"), "{xml}");
}

#[test]
fn run_gate_exits_3_on_an_inconclusive_check() {
    let dir = temp_dir("gate-inconclusive");
    let report = dir.join("report.json");
    std::fs::write(&report, serde_json::to_string(&point_passes_ci_fails()).unwrap()).unwrap();
    let thresholds = dir.join("t.toml");
    std::fs::write(&thresholds, "[variant.int8]\n\"token_match_rate@100\" = { min = 0.8 }\n").unwrap();
    let run = run_gate(&report, &thresholds, Some(&dir.join("gate.xml")));
    assert_eq!(run.exit_code, 3, "{run:?}");
    assert!(run.stderr.is_empty(), "{run:?}");
    assert!(run.stdout.starts_with("INCONCLUSIVE int8 token_match_rate@100"), "{run:?}");
    assert!(std::fs::read_to_string(dir.join("gate.xml")).unwrap().contains("<skipped message=\"INCONCLUSIVE"));
}

#[test]
fn the_summary_gives_each_variants_verdict_and_the_checks_it_did_not_pass() {
    let dir = temp_dir("gate-summary");
    let report = dir.join("report.json");
    std::fs::write(&report, serde_json::to_string(&point_passes_ci_fails()).unwrap()).unwrap();
    let thresholds = dir.join("t.toml");
    std::fs::write(
        &thresholds,
        "[variant.int8]\n\"token_match_rate@100\" = { min = 0.8 }\n[variant.\"int4-g128\"]\n\"kld@10\" = { max = 0 }\n",
    )
    .unwrap();
    let summary = dir.join("summary.md");
    let run = qdrift_report::run_gate_with(&report, &thresholds, None, Some(&summary));
    assert_eq!(run.exit_code, 1, "{run:?}");
    let md = std::fs::read_to_string(&summary).unwrap();
    assert!(md.starts_with("## Verdict\n\n**Gate: FAIL** — 2 checks: 0 passed, 1 failed, 1 inconclusive."), "{md}");
    assert!(!md.contains("glossary"), "a link to a glossary the summary lacks: {md}");
    let row = |name: &str| md.lines().find(|l| l.contains(&format!("| {name} |"))).unwrap_or_else(|| panic!("{md}"));
    assert!(
        row("int8").contains(
            "| INCONCLUSIVE | token_match_rate@100: [0.7800, 0.9000] straddles min 0.8000, ~142 prompts would tell |"
        ),
        "{md}"
    );
    assert!(row("int4-g128").contains("| FAIL | kld@10: upper CI bound "), "{md}");
    // The noise floor is the yardstick: not ranked.
    assert!(!md.contains("| noise-floor-f32 |"), "{md}");
    // A summary path that is the report is refused before anything is written.
    let before = std::fs::read(&report).unwrap();
    let run = qdrift_report::run_gate_with(&report, &thresholds, None, Some(&report));
    assert_eq!(run.exit_code, 2, "{run:?}");
    assert!(run.stderr.contains("--summary-md"), "{run:?}");
    assert_eq!(std::fs::read(&report).unwrap(), before, "the report is untouched");
    // On unusable input the summary says why.
    let run = qdrift_report::run_gate_with(&report, &dir.join("missing.toml"), None, Some(&summary));
    assert_eq!(run.exit_code, 2);
    let md = std::fs::read_to_string(&summary).unwrap();
    assert!(
        md.starts_with("## Verdict\n\n**Gate: ERROR** — the gate could not run: ") && md.contains("missing.toml"),
        "{md}"
    );
}

#[test]
fn a_gated_report_opens_with_the_gates_verdict() {
    let r = point_passes_ci_fails();
    let outcome = run(&r, "[variant.int8]\n\"token_match_rate@100\" = { min = 0.8 }\n").unwrap();
    let md = qdrift_report::render_markdown_gated(&r, Some(&outcome));
    let verdict = md.find("## Verdict").unwrap();
    assert!(verdict < md.find("**Workload:**").unwrap(), "the verdict comes first");
    assert!(md.contains("**Gate: INCONCLUSIVE** — 1 checks: 0 passed, 0 failed, 1 inconclusive."), "{md}");
    assert!(md.contains("| # | Variant | Gate | Checks not passed |"), "{md}");
    assert!(md.lines().any(|l| l.contains("| int4-g128 | not gated | — |")), "{md}");
    let html = qdrift_report::render_html_gated(&r, Some(&outcome)).unwrap();
    assert!(html.contains("<strong>Gate: INCONCLUSIVE</strong>"), "{html}");
    // Ungated, the same report has no gate columns.
    let plain = qdrift_report::render_markdown(&r);
    assert!(!plain.contains("Gate") && plain.contains("## Verdict"));
}

/// Every thresholds block of the README (```toml) parses and passes on the stories260K example
/// report it names.
#[test]
fn the_readmes_thresholds_pass_on_the_example_report() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let report = Report::read(&root.join("reports/stories260K/report.json")).unwrap();
    let blocks: Vec<&str> =
        readme.split("```toml\n").skip(1).map(|b| b.split("```").next().expect("a closed block")).collect();
    assert!(!blocks.is_empty(), "the README shows a thresholds file");
    for block in blocks {
        let outcome = run(&report, block).unwrap_or_else(|e| panic!("{e}\n{block}"));
        assert!(outcome.passed(), "{}\n{block}", outcome.lines());
    }
    // The README's worked example of an inconclusive check.
    let straddled = run(&report, "[variant.int8]\n\"kld@100\" = { max = 3.5e-4 }\n").unwrap();
    assert_eq!(straddled.results[0].verdict, Verdict::Inconclusive);
    let mde = straddled.results[0].mde().unwrap();
    assert!((mde - 0.31e-4).abs() < 0.005e-4, "{mde}");
    let needed = straddled.results[0].prompts_needed().unwrap();
    assert!((350..=430).contains(&needed), "{needed}");
    assert_eq!(run(&report, "[variant.int8]\n\"kld@100\" = { max = 4e-4 }\n").unwrap().verdict(), Verdict::Pass);
}
