//! `qdrift thresholds suggest`: a thresholds file from a known-good report.

mod common;

use std::path::Path;

use qdrift_report::testing::{sample_moe_report, sample_report};
use qdrift_report::{Report, SuggestError, SuggestOptions, Thresholds, Verdict, gate, suggest_thresholds};

fn options(margin: f64) -> SuggestOptions {
    SuggestOptions { margin, ..SuggestOptions::default() }
}

/// Whether some value in metric `name`'s range fails the check `c`.
fn can_fail(c: &qdrift_report::Check) -> bool {
    let (lowest, highest) = qdrift_report::metrics::metric(&c.metric).unwrap().range.bounds();
    c.min.is_some_and(|t| t > lowest) || c.max.is_some_and(|t| t < highest)
}

fn committed(name: &str) -> Report {
    Report::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../reports").join(name).join("report.json")).unwrap()
}

#[test]
fn the_report_a_file_was_suggested_from_passes_it_whatever_the_margin() {
    let reports = [
        ("sample", sample_report()),
        ("sample-moe", sample_moe_report()),
        ("stories260K", committed("stories260K")),
        ("smollm2-135m", committed("smollm2-135m")),
        ("qwen3-moe-tiny", committed("qwen3-moe-tiny")),
    ];
    for (name, r) in reports {
        for margin in [0.0, 0.1, 0.5] {
            let text = suggest_thresholds(&r, &options(margin), "report.json").unwrap();
            let thresholds = Thresholds::parse(&text).unwrap_or_else(|e| panic!("{name}: {e}\n{text}"));
            let outcome = gate(&r, &thresholds).unwrap();
            let open: Vec<String> = outcome.results.iter().filter(|c| !c.passed()).map(|c| c.line()).collect();
            assert!(open.is_empty(), "{name}, margin {margin}:\n{}\n{text}", open.join("\n"));
            // No check that cannot fail.
            let vacuous: Vec<_> = thresholds.checks.iter().filter(|c| !can_fail(c)).collect();
            assert!(vacuous.is_empty(), "{name}, margin {margin}: {vacuous:?}\n{text}");
            // Every variant but the noise floor, every summary metric, every horizon: a check
            // or a comment for each side left out.
            let variants = r.variants.iter().filter(|v| v.kind != qdrift_report::VariantKind::NoiseFloor).count();
            let summary = qdrift_report::METRICS
                .iter()
                .filter(|m| m.summary && r.variants.iter().any(|v| v.horizons.iter().any(|h| h.get(m).is_some())))
                .count();
            // ppl_drift_of_generated_text is checked on both sides, unless its band reaches 0.
            let checks = variants * summary * r.workload.horizons.len();
            let sides = outcome.results.len() + text.lines().filter(|l| l.ends_with("passes it")).count();
            assert!(sides >= checks && sides <= checks + variants * r.workload.horizons.len(), "{name}: {sides}");
        }
    }
}

#[test]
fn each_bound_is_widened_by_the_margin_on_the_side_a_regression_moves() {
    let r = sample_report();
    let options = SuggestOptions {
        margin: 0.1,
        metrics: vec!["kld".into(), "token_match_rate".into(), "ppl_drift_of_generated_text".into()],
        horizons: vec![100],
        ..SuggestOptions::default()
    };
    let text = suggest_thresholds(&r, &options, "a/report.json").unwrap();
    let thresholds = Thresholds::parse(&text).unwrap();
    let int8 = r.variant("int8").unwrap().horizon(100).unwrap();
    let check = |metric: &str| thresholds.checks.iter().find(|c| c.variant == "int8" && c.metric == metric).unwrap();
    // Rounded outward to three significant digits: at most 1% further out, never further in.
    let up = |got: Option<f64>, want: f64| {
        let got = got.unwrap();
        assert!(got >= want && got <= want + 0.01 * want.abs(), "{got} for {want}");
    };
    let down = |got: Option<f64>, want: f64| {
        let got = got.unwrap();
        assert!(got <= want && got >= want - 0.01 * want.abs(), "{got} for {want}");
    };
    let [_, hi] = int8.metric("kld").unwrap().ci95;
    up(check("kld").max, hi + 0.1 * hi);
    assert_eq!(check("kld").min, None);
    let [lo, _] = int8.metric("token_match_rate").unwrap().ci95;
    down(check("token_match_rate").min, lo - 0.1 * lo);
    let [lo, hi] = int8.metric("ppl_drift_of_generated_text").unwrap().ci95;
    let ppl = check("ppl_drift_of_generated_text");
    let d = (lo - 1.0).abs().max((hi - 1.0).abs()) * 1.1;
    up(ppl.max, 1.0 + d);
    down(ppl.min, 1.0 - d);
    assert!(text.starts_with("# Suggested by `qdrift thresholds suggest --margin 0.1` from a/report.json (72 prompts"));
    assert!(!text.contains("noise-floor"), "the noise floor is the yardstick, not gated:\n{text}");
    // A later run whose interval reaches 20% past today's upper bound is not a pass.
    let mut worse = r.clone();
    let v = worse.variants.iter_mut().find(|v| v.name == "int8").unwrap();
    let h = v.horizons.iter_mut().find(|h| h.tokens == 100).unwrap();
    let mut kld = *h.metric("kld").unwrap();
    kld.ci95[1] *= 1.2;
    kld.mean = kld.mean.max(kld.ci95[0]);
    h.set("kld", kld).unwrap();
    let outcome = gate(&worse, &thresholds).unwrap();
    let kld_check = outcome.results.iter().find(|c| c.variant == "int8" && c.metric == "kld").unwrap();
    assert_ne!(kld_check.verdict, Verdict::Pass, "{}", kld_check.line());
}

#[test]
fn a_rate_is_kept_within_its_range() {
    let text = suggest_thresholds(&sample_report(), &options(5.0), "r").unwrap();
    for c in Thresholds::parse(&text).unwrap().checks {
        let m = qdrift_report::metrics::metric(&c.metric).unwrap();
        for t in [c.min, c.max].into_iter().flatten() {
            assert!(m.range.contains(t), "{} = {t}", c.metric);
        }
    }
}

#[test]
fn bad_options_are_refused_in_one_line() {
    let r = sample_report();
    let e = |o: SuggestOptions| suggest_thresholds(&r, &o, "r").unwrap_err();
    assert!(matches!(e(options(-0.1)), SuggestError::Margin(_)));
    assert!(matches!(e(options(f64::NAN)), SuggestError::Margin(_)));
    let unknown = e(SuggestOptions { metrics: vec!["kdl".into()], ..options(0.1) });
    assert!(unknown.to_string().starts_with("unknown metric \"kdl\"; known metrics: token_match_rate"), "{unknown}");
    let absent = e(SuggestOptions { metrics: vec!["expert_overlap".into()], ..options(0.1) });
    assert_eq!(absent.to_string(), "no variant of the report has expert_overlap");
    let horizon = e(SuggestOptions { horizons: vec![50], ..options(0.1) });
    assert_eq!(horizon.to_string(), "the report has no horizon 50; its horizons: [10, 100, 1000]");
    let mut floor_only = sample_report();
    floor_only.variants.retain(|v| v.kind == qdrift_report::VariantKind::NoiseFloor);
    assert!(matches!(suggest_thresholds(&floor_only, &options(0.1), "r"), Err(SuggestError::NoVariants)));
}

/// The sample report with `metric` at horizon 100 of int8 set to `e`.
fn with_int8(metric: &str, e: qdrift_report::Estimate) -> Report {
    let mut r = sample_report();
    let v = r.variants.iter_mut().find(|v| v.name == "int8").unwrap();
    v.horizons.iter_mut().find(|h| h.tokens == 100).unwrap().set(metric, e).unwrap();
    r
}

#[test]
fn a_side_no_value_can_fail_is_left_out_with_a_comment() {
    // Exact match whose interval reaches 0: its min would be 0, which every share passes.
    let r = with_int8("exact_match_fraction", common::mean_ci(0.05, 0.0, 0.2));
    let o = SuggestOptions { metrics: vec!["exact_match_fraction".into()], horizons: vec![100], ..options(0.1) };
    let text = suggest_thresholds(&r, &o, "r").unwrap();
    assert!(!text.contains("{ min = 0.0 }"), "{text}");
    assert!(
        text.contains(
            "# \"exact_match_fraction@100\" min = 0.0 left out: every value of exact_match_fraction (∈ [0, 1]) \
             passes it"
        ),
        "{text}"
    );
    let checks = Thresholds::parse(&text).unwrap().checks;
    assert!(checks.iter().all(|c| c.variant != "int8"), "{checks:?}");
    assert!(checks.iter().any(|c| c.variant == "int4-g128"), "the other variant keeps its check: {checks:?}");
    // A rate where lower is better whose interval reaches 1: its max would be 1.
    let r = with_int8("stop_missed", common::mean_ci(0.9, 0.7, 1.0));
    let o = SuggestOptions {
        metrics: vec!["stop_missed".into()],
        horizons: vec![100],
        variant: Some("int8".into()),
        ..options(0.1)
    };
    assert!(matches!(suggest_thresholds(&r, &o, "r"), Err(SuggestError::NothingToCheck)));
}

#[test]
fn one_variant_is_written_under_the_section_a_ci_run_gates() {
    let r = sample_report();
    let one = |variant: Option<&str>, section: Option<&str>| SuggestOptions {
        variant: variant.map(Into::into),
        section: section.map(Into::into),
        ..options(0.1)
    };
    let own = Thresholds::parse(&suggest_thresholds(&r, &one(Some("int4-g128"), None), "r").unwrap()).unwrap();
    assert!(own.checks.iter().all(|c| c.variant == "int4-g128") && !own.checks.is_empty(), "{own:?}");
    let text = suggest_thresholds(&r, &one(Some("int4-g128"), Some("candidate")), "r").unwrap();
    assert!(
        text.starts_with("# Suggested by `qdrift thresholds suggest --margin 0.1 --variant int4-g128 --as candidate`")
    );
    let moved = Thresholds::parse(&text).unwrap();
    assert_eq!(moved.checks.len(), own.checks.len());
    for (a, b) in own.checks.iter().zip(&moved.checks) {
        assert_eq!(
            (b.variant.as_str(), &b.metric, b.horizon, b.min, b.max),
            ("candidate", &a.metric, a.horizon, a.min, a.max)
        );
    }
    // A later CI run whose candidate is int4-g128's artifact passes the file.
    let mut later = r.clone();
    later.variants.retain(|v| v.name != "int8");
    later.variants.iter_mut().find(|v| v.name == "int4-g128").unwrap().name = "candidate".into();
    assert!(gate(&later, &moved).unwrap().passed());
    // `*`: every variant but the noise floor; the noise floor only when named.
    let star = Thresholds::parse(&suggest_thresholds(&r, &one(Some("int8"), Some("*")), "r").unwrap()).unwrap();
    assert!(star.checks.iter().all(|c| c.variant == "*"));
    let floor = suggest_thresholds(&r, &one(Some("noise-floor-f32"), None), "r").unwrap();
    assert!(floor.contains("[variant.\"noise-floor-f32\"]"), "{floor}");
    // --as with several variants, an unknown --variant, an empty section: one line each.
    let e = suggest_thresholds(&r, &one(None, Some("candidate")), "r").unwrap_err().to_string();
    assert_eq!(
        e,
        "--as writes one variant's checks, and the report has several (int8, int4-g128): name one with --variant"
    );
    let e = suggest_thresholds(&r, &one(Some("int3"), None), "r").unwrap_err().to_string();
    assert_eq!(e, "--variant \"int3\": the report has no such variant; its variants: noise-floor-f32, int8, int4-g128");
    assert!(matches!(suggest_thresholds(&r, &one(Some("int8"), Some("")), "r"), Err(SuggestError::EmptySection)));
    // A report with one candidate needs no --variant.
    let mut single = r.clone();
    single.variants.retain(|v| v.name != "int8");
    let text = suggest_thresholds(&single, &one(None, Some("candidate")), "r").unwrap();
    assert!(Thresholds::parse(&text).unwrap().checks.iter().all(|c| c.variant == "candidate"));
}

#[test]
fn a_failed_variant_named_is_refused() {
    let mut r = sample_report();
    let v = r.variants.iter_mut().find(|v| v.name == "int8").unwrap();
    v.failure = Some("non-finite logits at layer 3".into());
    v.horizons.clear();
    v.first_divergence.positions.clear();
    v.per_position.token_match.clear();
    v.entropy_strata.clear();
    let o = SuggestOptions { variant: Some("int8".into()), ..options(0.1) };
    let e = suggest_thresholds(&r, &o, "r").unwrap_err().to_string();
    assert!(e.starts_with("--variant \"int8\": the variant failed in this report (non-finite logits"), "{e}");
}
