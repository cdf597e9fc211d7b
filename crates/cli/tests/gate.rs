//! `qdrift gate` through the binary on the committed stories260K report (no model runs): its
//! refusals are one `qdrift: error:` line and exit 2, the same line `compare` and `thresholds`
//! print, and `--summary-md` says the gate could not run.

mod common;

use std::path::{Path, PathBuf};

use common::qdrift;

/// The committed stories260K report.
fn committed() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../reports/stories260K/report.json")
}

fn utf8(p: &Path) -> &str {
    p.to_str().expect("utf-8")
}

/// `qdrift gate` of the committed report against `toml`, with a Markdown summary: exit code,
/// stdout, stderr and the summary.
fn gate(toml: &str) -> (i32, String, String, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (thresholds, summary) = (dir.path().join("t.toml"), dir.path().join("summary.md"));
    std::fs::write(&thresholds, toml).expect("written");
    let o = qdrift(&[
        "gate",
        "--report",
        utf8(&committed()),
        "--thresholds",
        utf8(&thresholds),
        "--summary-md",
        utf8(&summary),
    ]);
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let md = std::fs::read_to_string(&summary).expect("the summary is written");
    (o.status.code().expect("exit code"), text(&o.stdout), text(&o.stderr), md)
}

#[test]
fn unusable_thresholds_are_one_qdrift_error_line_and_exit_2() {
    let (code, stdout, stderr, md) = gate("[variant.\"int3\"]\n\"kld@100\" = { max = 0.01 }\n");
    assert_eq!(code, 2, "{stdout}");
    assert!(stdout.is_empty(), "{stdout}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("qdrift: error: variant.\"int3\": the report has no such variant"), "{stderr}");
    assert!(md.contains("**Gate: ERROR**") && md.contains("no such variant"), "{md}");
}

#[test]
fn an_unquoted_key_with_an_at_sign_says_to_quote_it() {
    let (code, _, stderr, _) = gate("[variant.\"int8\"]\nkld@100 = { max = 0.01 }\n");
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.starts_with("qdrift: error: ") && stderr.contains("t.toml:2:"), "{stderr}");
    assert!(stderr.ends_with("; keys with @ must be quoted: \"kld@100\" = { max = 0.01 }\n"), "{stderr}");
}

#[test]
fn gate_lines_round_to_four_significant_digits() {
    let (code, stdout, stderr, _) = gate("[variant.\"int8\"]\n\"kld@100\" = { max = 0.01 }\n");
    assert_eq!(code, 0, "{stdout}{stderr}");
    // int8's KLD over 100 tokens: 3.41e-4, interval [3.13e-4, 3.72e-4] (README's example).
    assert_eq!(
        stdout.lines().next().expect("a line"),
        "PASS int8 kld@100 bound=ci value=3.722e-4 (upper CI bound) threshold=max ≤ 0.01 ci95=[3.127e-4, 3.722e-4] \
         mde=3.086e-5"
    );
}

/// `--thresholds default` is the built-in profile, with no file: on the committed stories260K
/// report its 8-bit variants pass and its 4-bit ones fail (exit 1), the first lines name the
/// profile and each threshold with its reason, and a dense model has no routing check.
#[test]
fn the_default_profile_gates_without_a_file() {
    let o = qdrift(&["gate", "--report", utf8(&committed()), "--thresholds", "default"]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{stdout}{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        stdout.starts_with("gate: thresholds profile \"default\" on every variant but the noise floor ("),
        "{stdout}"
    );
    // Every threshold is printed with its reason.
    assert!(stdout.contains("\ngate:   excess_kld@1000 max 0.05: KL divergence from the reference"), "{stdout}");
    assert!(stdout.contains("\ngate:   stop_missed@1000 max 0.25 where present: Share of prompts"), "{stdout}");
    for line in
        ["PASS int8 excess_kld@1000 bound=ci", "PASS int8 stop_missed@1000 bound=ci", "FAIL int4-g128 excess_kld@1000"]
    {
        assert!(stdout.contains(&format!("\n{line}")), "{line} missing from\n{stdout}");
    }
    assert!(!stdout.contains("PASS int8 routing_flip_rate"), "{stdout}");
    assert!(stdout.ends_with("FAIL\n"), "{stdout}");
}
