//! The built-in thresholds profiles (`--thresholds default`) and `optional = true` checks.

mod common;

use std::path::Path;

use qdrift_report::testing::{sample_moe_report, sample_report};
use qdrift_report::{GateError, PROFILES, Profile, Report, Thresholds, Verdict, gate, run_gate};

fn example(name: &str) -> Report {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../reports").join(name).join("report.json");
    Report::read(&path).unwrap()
}

fn default_profile() -> &'static Profile {
    Profile::named("default").unwrap()
}

/// `(variant, verdict)` of every variant the gate checked, in report order.
fn verdicts(report: &Report) -> Vec<(String, Verdict)> {
    let thresholds = default_profile().thresholds(&report.workload.horizons).unwrap();
    let outcome = gate(report, &thresholds).unwrap_or_else(|e| panic!("{e}"));
    report.variants.iter().filter_map(|v| Some((v.name.clone(), outcome.variant_verdict(&v.name)?))).collect()
}

fn named(pairs: &[(&str, Verdict)]) -> Vec<(String, Verdict)> {
    pairs.iter().map(|(n, v)| (n.to_string(), *v)).collect()
}

/// The committed example reports under the default profile: 8-bit and fp8 weights and a rounded
/// KV cache pass, 4-bit round-to-nearest fails (excess KLD 0.09 to 0.5 nats); SmolLM2's 8
/// prompts cannot show its stops are kept (a Wilson interval of 0 of 8 reaches 0.32), so its
/// passing variants are inconclusive; only the model with experts is checked for routing flips.
#[test]
fn the_default_profile_gives_the_example_reports_a_verdict() {
    use Verdict::{Fail, Inconclusive, Pass};
    let stories = example("stories260K");
    assert_eq!(
        verdicts(&stories),
        named(&[
            ("int8", Pass),
            ("fp8-e4m3", Pass),
            ("int4-g32", Fail),
            ("int4-g128", Fail),
            ("w8a8-int8", Pass),
            ("w8a8-fp8", Pass),
            ("int4-g128+kv-q8_0", Fail),
            ("fp16+kv-q8_0", Pass),
        ])
    );
    let smollm2 = example("smollm2-135m");
    assert_eq!(
        verdicts(&smollm2),
        named(&[
            ("int8", Inconclusive),
            ("fp8-e4m3", Inconclusive),
            ("w8a8-fp8", Inconclusive),
            ("int4-g128", Fail),
            ("int4-g128+kv-q8_0", Fail),
            ("nvfp4", Fail),
            ("w4a4-nvfp4", Fail),
            ("mxfp4", Fail),
            ("mxfp4-ct", Fail),
            ("w4a4-mxfp4", Fail),
        ])
    );
    let moe = example("qwen3-moe-tiny");
    assert_eq!(
        verdicts(&moe),
        named(&[
            ("int8", Pass),
            ("fp8-e4m3", Pass),
            ("int4-g32", Fail),
            ("int4-g128", Fail),
            ("w8a8-int8", Pass),
            ("fp16+kv-q8_0", Pass),
        ])
    );
    // Routing is checked where the model has experts, and only there; the noise floor never.
    for (report, routed) in [(&stories, false), (&smollm2, false), (&moe, true)] {
        let t = default_profile().thresholds(&report.workload.horizons).unwrap();
        let outcome = gate(report, &t).unwrap();
        let longest = report.workload.horizons.last().unwrap();
        let checked = |m: &str| outcome.results.iter().filter(|r| r.metric == m && r.horizon == *longest).count();
        let variants = report.variants.len() - 1;
        assert_eq!(checked("excess_kld"), variants);
        assert_eq!(checked("stop_missed"), variants);
        assert_eq!(checked("routing_flip_rate"), if routed { variants } else { 0 });
        assert!(outcome.results.iter().all(|r| r.variant != "noise-floor-f32"));
    }
    // int4 on the model with experts fails on its routing too (20% of decisions flip).
    let t = default_profile().thresholds(&moe.workload.horizons).unwrap();
    let outcome = gate(&moe, &t).unwrap();
    let flips = outcome.results.iter().find(|r| r.variant == "int4-g32" && r.metric == "routing_flip_rate").unwrap();
    assert_eq!(flips.verdict, Fail, "{}", flips.line());
}

/// The thresholds the gate checks are the printed file's, parsed: what `qdrift thresholds show`
/// prints is exactly what is checked, each check under its reason, at the longest horizon.
#[test]
fn a_profile_is_the_thresholds_file_it_prints() {
    for p in PROFILES {
        let text = p.toml(&[10, 100], "the horizons given").unwrap();
        assert_eq!(p.thresholds(&[10, 100]).unwrap(), Thresholds::parse(&text).unwrap(), "{text}");
        assert!(text.contains("[variant.\"*\"]\n") && text.contains("bound = \"ci\""), "{text}");
        for c in p.checks {
            let line = text.lines().position(|l| l.starts_with(&format!("\"{}@100\"", c.metric))).unwrap();
            let comment: Vec<&str> = text.lines().collect::<Vec<_>>()[..line]
                .iter()
                .rev()
                .take_while(|l| l.starts_with("# "))
                .map(|l| &l[2..])
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            assert_eq!(comment.join(" "), c.reason, "{} has its reason above it", c.metric);
            assert_eq!(text.lines().nth(line).unwrap().contains("optional = true"), c.optional, "{}", c.metric);
        }
        assert!(text.lines().all(|l| l.chars().count() <= 100), "{text}");
        assert!(p.toml(&[], "").is_none());
        assert!(matches!(p.thresholds(&[]), Err(GateError::NoChecks)));
    }
    let d = default_profile();
    let announced = d.announce(&[10, 100, 1000]);
    let lines: Vec<&str> = announced.lines().collect();
    assert_eq!(
        lines[0],
        "gate: thresholds profile \"default\" on every variant but the noise floor (`qdrift thresholds show default` \
         gives each check's reason in full):"
    );
    assert_eq!(lines.len(), 1 + d.checks.len(), "{announced}");
    assert_eq!(
        lines[1],
        "gate:   excess_kld@1000 max 0.05: KL divergence from the reference beyond the noise floor's, teacher-forced, \
         mean per token: at most 0.05 nats."
    );
    assert!(lines[2].starts_with("gate:   stop_missed@1000 max 0.25 where present: Share of prompts"), "{announced}");
    assert!(lines[3].starts_with("gate:   routing_flip_rate@1000 max 0.1 where present: Models with experts"));
    assert!(lines.iter().all(|l| l.ends_with('.') || l.ends_with(':')), "{announced}");
    assert!(Profile::named("strict").unwrap_err().to_string().contains("profiles: default"));
    assert!(Profile::given_as(Path::new("default")).is_some());
    assert!(Profile::given_as(Path::new("./default")).is_none());
}

/// `v` as a variant that failed: one line of why, and no statistics.
fn fail(v: &mut qdrift_report::Variant) {
    v.failure = Some("non-finite logits".into());
    v.horizons.clear();
    v.first_divergence.positions.clear();
    v.per_position.token_match.clear();
    v.entropy_strata.clear();
    v.routing = None;
}

/// A check of a metric a variant lacks refuses the file, unless it says `optional = true`: then
/// a dense model's report skips it, and one with experts checks it.
#[test]
fn an_optional_check_is_skipped_where_the_report_lacks_the_metric() {
    let dense = sample_report();
    let file = "[variant.\"*\"]\n\"kld@100\" = { max = 1 }\n\"routing_flip_rate@100\" = { max = 0.5 }\n";
    let refused = gate(&dense, &Thresholds::parse(file).unwrap()).unwrap_err().to_string();
    assert!(refused.contains("the report has no routing_flip_rate@100") && refused.contains("optional = true"));
    let optional = file.replace("max = 0.5 }", "max = 0.5, optional = true }");
    let t = Thresholds::parse(&optional).unwrap();
    assert!(t.checks.iter().any(|c| c.metric == "routing_flip_rate" && c.optional));
    let outcome = gate(&dense, &t).unwrap();
    assert!(outcome.results.iter().all(|r| r.metric == "kld"), "{}", outcome.lines());
    let moe = sample_moe_report();
    let outcome = gate(&moe, &t).unwrap();
    assert_eq!(outcome.results.iter().filter(|r| r.metric == "routing_flip_rate").count(), moe.variants.len() - 1);
    // Only optional checks, none of whose metrics the report has: nothing is checked, exit 2.
    let only = "[variant.\"*\"]\n\"routing_flip_rate@100\" = { max = 0.5, optional = true }\n";
    assert!(matches!(gate(&dense, &Thresholds::parse(only).unwrap()), Err(GateError::NoChecks)));
    // A variant that failed has no metrics: an optional check fails it where other variants
    // have the metric, and is skipped where none has.
    let mut failed = sample_moe_report();
    fail(&mut failed.variants[1]);
    let outcome = gate(&failed, &t).unwrap();
    let name = failed.variants[1].name.clone();
    assert!(outcome.results.iter().any(|r| r.variant == name && r.metric == "routing_flip_rate" && !r.passed()));
    let mut dense_failed = sample_report();
    fail(&mut dense_failed.variants[1]);
    let outcome = gate(&dense_failed, &t).unwrap();
    assert!(outcome.results.iter().all(|r| r.metric == "kld"), "{}", outcome.lines());
}

/// `run_gate` with `default` for the thresholds: the profile at the report's horizons, named in
/// the first line; no file is read.
#[test]
fn run_gate_takes_the_default_profile_by_name() {
    let dir = common::temp_dir("gate-profile");
    let path = dir.join("report.json");
    example("smollm2-135m").write(&path).unwrap();
    let run = run_gate(&path, Path::new("default"), None);
    assert_eq!(run.exit_code, 1, "{}{}", run.stdout, run.stderr);
    assert!(run.stderr.is_empty(), "{}", run.stderr);
    let first = run.stdout.lines().next().unwrap();
    assert!(first.starts_with("gate: thresholds profile \"default\""), "{}", run.stdout);
    assert!(run.stdout.contains("\ngate:   excess_kld@100 max 0.05: KL divergence"), "{}", run.stdout);
    assert!(run.stdout.contains("\nINCONCLUSIVE int8 stop_missed@100 bound=ci"), "{}", run.stdout);
    assert!(run.stdout.contains("\nFAIL int4-g128 excess_kld@100 bound=ci"), "{}", run.stdout);
    // `./default` is a file, and there is none.
    let run = run_gate(&path, Path::new("./default"), None);
    assert_eq!(run.exit_code, 2);
    assert!(!run.stdout.contains("profile"), "{}", run.stdout);
}
