//! `qdrift thresholds suggest` end to end on the committed stories260K report (no model runs):
//! one variant written as the section a CI run gates, and unusable input refused with exit 2
//! and one `qdrift: error:` line, as `qdrift gate` and `qdrift compare` refuse it.

mod common;

use std::path::{Path, PathBuf};

use common::qdrift;
use serde_json::Value;

/// The committed stories260K report.
fn committed() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../reports/stories260K/report.json")
}

fn utf8(p: &Path) -> &str {
    p.to_str().expect("utf-8")
}

/// `qdrift` with `args`: exit code, stdout, stderr.
fn run(args: &[&str]) -> (i32, String, String) {
    let o = qdrift(args);
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (o.status.code().expect("exit code"), text(&o.stdout), text(&o.stderr))
}

#[test]
fn one_variant_is_suggested_as_the_candidate_a_ci_run_gates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let toml = dir.path().join("t.toml");
    let (code, _, stderr) = run(&[
        "thresholds",
        "suggest",
        utf8(&committed()),
        "--variant",
        "int4-g128",
        "--as",
        "candidate",
        "--out",
        utf8(&toml),
    ]);
    assert_eq!(code, 0, "{stderr}");
    let text = std::fs::read_to_string(&toml).expect("written");
    assert_eq!(text.matches("[variant.").count(), 1, "{text}");
    assert!(text.contains("[variant.\"candidate\"]\n\"token_match_rate@10\" = { min = "), "{text}");
    // The CI run's report: the same run with int4-g128 named candidate.
    let mut report: Value = serde_json::from_str(&std::fs::read_to_string(committed()).expect("report")).expect("JSON");
    let variants = report["variants"].as_array_mut().expect("variants");
    variants.retain(|v| v["kind"] == "noise_floor" || v["name"] == "int4-g128");
    variants[1]["name"] = "candidate".into();
    let candidate = dir.path().join("report.json");
    std::fs::write(&candidate, serde_json::to_string(&report).expect("JSON")).expect("written");
    let (code, stdout, stderr) = run(&["gate", "--report", utf8(&candidate), "--thresholds", utf8(&toml)]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("PASS candidate kld@100 bound=ci"), "{stdout}");
}

#[test]
fn unusable_input_is_exit_2_and_one_error_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("t.toml");
    let report = committed();
    let cases: [(&[&str], &str); 4] = [
        (&["--margin=-1"], "--margin -1: expected a finite number ≥ 0"),
        (&["--variant", "int3"], "--variant \"int3\": the report has no such variant"),
        (&["--as", "candidate"], "--as writes one variant's checks, and the report has several"),
        (&["--metrics", "kdl"], "unknown metric \"kdl\""),
    ];
    for (extra, says) in cases {
        let mut args = vec!["thresholds", "suggest", utf8(&report), "--out", utf8(&out)];
        args.extend_from_slice(extra);
        let (code, stdout, stderr) = run(&args);
        assert_eq!(code, 2, "{extra:?}: {stderr}");
        assert!(stdout.is_empty(), "{stdout}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.starts_with("qdrift: error: ") && stderr.contains(says), "{extra:?}: {stderr}");
        assert!(!out.exists(), "nothing is written");
    }
    let missing = dir.path().join("missing.json");
    let (code, _, stderr) = run(&["thresholds", "suggest", utf8(&missing)]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.starts_with("qdrift: error: ") && stderr.contains("missing.json"), "{stderr}");
}

/// `qdrift thresholds show default` prints the profile `--thresholds default` checks: a
/// thresholds file, each check under its reason, at eval's longest default horizon or a
/// report's; it gates that report exactly as `default` does (after the profile's announcement). An unknown profile is exit 2.
#[test]
fn the_default_profile_is_shown_as_a_thresholds_file() {
    let (code, shown, stderr) = run(&["thresholds", "show", "default"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(shown.contains("\n\"excess_kld@1000\" = { max = 0.05 }\n"), "{shown}");
    assert!(shown.contains("\n\"routing_flip_rate@1000\" = { max = 0.1, optional = true }\n"), "{shown}");
    assert!(shown.contains("# KL divergence from the reference beyond the noise floor's"), "{shown}");
    let smollm2 = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../reports/smollm2-135m/report.json");
    let (code, at_report, stderr) = run(&["thresholds", "show", "default", "--report", utf8(&smollm2)]);
    assert_eq!(code, 0, "{stderr}");
    assert!(at_report.contains("\n\"stop_missed@100\" = { max = 0.25, optional = true }\n"), "{at_report}");
    let (_, at_horizons, _) = run(&["thresholds", "show", "default", "--horizons", "10,100"]);
    assert_eq!(at_horizons.lines().filter(|l| l.contains("@100\"")).count(), 3, "{at_horizons}");
    // The shown file gates the report as the profile does, line for line after the first.
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("default.toml");
    std::fs::write(&file, &at_report).expect("written");
    let (code, from_file, _) = run(&["gate", "--report", utf8(&smollm2), "--thresholds", utf8(&file)]);
    let (profile_code, from_profile, _) = run(&["gate", "--report", utf8(&smollm2), "--thresholds", "default"]);
    assert_eq!((code, profile_code), (1, 1), "{from_file}");
    // The profile's gate first names the profile and its checks (a line each), then gates alike.
    let announced = 1 + from_profile.lines().skip(1).take_while(|l| l.starts_with("gate:   ")).count();
    assert_eq!(announced, 4, "{from_profile}");
    let gated: String = from_profile.split_inclusive('\n').skip(announced).collect();
    assert_eq!(gated, from_file);
    let (code, stdout, stderr) = run(&["thresholds", "show", "strict"]);
    assert_eq!(code, 2, "{stdout}");
    assert_eq!(stderr, "qdrift: error: unknown thresholds profile \"strict\"; profiles: default\n");
}
