//! No silent FP16 overflow: stories260K with its first layer's FFN norm scaled by 3000 (finite in
//! f32, past ±65504 in f16) stops `qdrift generate` and `qdrift eval` with one line naming the
//! model, the layer, the position and the prompt, and leaves no report; the same model runs in
//! f32, where its f16 noise floor is reported as failed; as a variant of the unscaled model it is
//! reported as the variant that overflows, and a gate on it fails.

mod common;

use std::path::{Path, PathBuf};

use common::{qdrift, stories};

/// Writes into `dir` stories260K (llama2.c) with layer 0's `rms_ffn_weight` × `scale`, and its
/// tokenizer; returns the checkpoint's path.
fn scaled_stories(dir: &Path, scale: f32) -> PathBuf {
    let bytes = std::fs::read(stories().join("stories260K.bin")).expect("stories260K");
    let header: Vec<usize> =
        bytes[..28].chunks(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]).unsigned_abs() as usize).collect();
    let (dim, _hidden, layers, heads, kv_heads, vocab) =
        (header[0], header[1], header[2], header[3], header[4], header[5]);
    let kv_dim = dim * kv_heads / heads;
    // llama2.c order: embedding, rms_att, wq, wk, wv, wo, then rms_ffn (run.c's memory_map_weights).
    let floats = vocab * dim + layers * dim + layers * dim * dim * 2 + layers * dim * kv_dim * 2;
    let mut out = bytes.clone();
    for i in 0..dim {
        let at = 28 + 4 * (floats + i);
        let w = f32::from_le_bytes(out[at..at + 4].try_into().expect("4 bytes")) * scale;
        out[at..at + 4].copy_from_slice(&w.to_le_bytes());
    }
    let path = dir.join("stories260K.bin");
    std::fs::write(&path, out).expect("written");
    std::fs::copy(stories().join("tok512.bin"), dir.join("tok512.bin")).expect("tokenizer");
    path
}

fn run(args: &[&str]) -> (bool, String) {
    let o = qdrift(args);
    (o.status.success(), String::from_utf8_lossy(&o.stderr).into_owned())
}

#[test]
fn an_fp16_overflow_stops_the_run_naming_the_layer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = scaled_stories(dir.path(), 3000.0);
    let m = model.to_str().expect("utf-8");
    let generate = |dtype| {
        let args = ["--prompt", "Once upon a time", "--max-new-tokens", "8", "--dtype", dtype];
        run(&[&["generate", "--model", m, "--backend", "cpu"][..], &args].concat())
    };
    let (ok, stderr) = generate("f16");
    assert!(!ok, "{stderr}");
    let line = stderr.lines().find(|l| l.starts_with("qdrift: error:")).unwrap_or_else(|| panic!("{stderr}"));
    for says in ["overflow FP16", "layer 0 at position 0 of prompt 1 (in the prompt)", "--dtype bf16", "--dtype f32"] {
        assert!(line.contains(says), "{line:?} should say {says:?}");
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(generate("f32").0, "finite in f32");
    // bf16 has f32's exponent range: what the line suggests runs.
    assert!(generate("bf16").0, "finite in bf16");

    let out = dir.path().join("out");
    let eval = |dtype| {
        let args = ["--schemes", "int8", "--prompts", "2", "--horizons", "4", "--dtype", dtype];
        run(&[&["eval", "--model", m, "--backend", "cpu", "--out", out.to_str().expect("utf-8")][..], &args].concat())
    };
    let (ok, stderr) = eval("f16");
    assert!(!ok, "{stderr}");
    assert!(
        stderr.contains("qdrift: error: the reference (fp16): non-finite logits: the activations overflow FP16"),
        "{stderr}"
    );
    assert!(stderr.contains("layer 0 at position 0 of prompt 1"), "{stderr}");
    assert!(!out.join("report.json").exists(), "no report from a run whose reference overflowed");

    // In f32 the reference runs; its noise floor, the same weights in f16, overflows: a finding
    // in the report, not a crash.
    let (ok, stderr) = eval("f32");
    assert!(ok, "{stderr}");
    let report = report(&out);
    let floor = &report["variants"][0];
    assert_eq!(floor["name"], "noise-floor-f16");
    let failure = floor["failure"].as_str().unwrap_or_else(|| panic!("{floor}"));
    assert!(failure.contains("overflow FP16") && failure.contains("layer 0 at position 0 of prompt 1"), "{failure}");
    assert_eq!(floor["horizons"].as_array().map(Vec::len), Some(0));
    assert!(
        report["variants"][1]["failure"].is_null() && report["variants"][1]["horizons"][0]["kld"]["mean"].is_number()
    );
    let md = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    assert!(md.contains("The noise floor noise-floor-f16 failed"), "{md}");

    // In bf16 everything runs: the bf16 reference (its weights rounded to bf16), its noise floor
    // (those weights in f32) and the variant; the report names the reference's weights, its
    // compute dtype and the checkpoint's stored dtype.
    let (ok, stderr) = eval("bf16");
    assert!(ok, "{stderr}");
    let bf16 = self::report(&out);
    assert_eq!(bf16["reference"]["name"], "bf16");
    assert_eq!(bf16["reference"]["compute_dtype"], "bf16");
    assert_eq!(bf16["model"]["stored_dtype"], "f32");
    assert_eq!(bf16["variants"][0]["name"], "noise-floor-f32");
    assert!(bf16["variants"].as_array().expect("variants").iter().all(|v| v["failure"].is_null()), "{bf16}");
    let md = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    assert!(md.contains("Reference: bf16 weights computing in bf16, from a checkpoint stored in f32."), "{md}");
}

#[test]
fn a_variant_that_overflows_where_the_reference_does_not_is_reported_failed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let variant = scaled_stories(dir.path(), 3000.0);
    let reference = stories().join("stories260K.bin");
    let out = dir.path().join("out");
    let scaled = format!("scaled={}", variant.display());
    let (ok, stderr) = run(&[
        "eval",
        "--model",
        reference.to_str().expect("utf-8"),
        "--backend",
        "cpu",
        "--schemes",
        "--variant",
        &scaled,
        "--prompts",
        "2",
        "--horizons",
        "4",
        "--dtype",
        "f16",
        "--out",
        out.to_str().expect("utf-8"),
    ]);
    assert!(ok, "{stderr}");
    let report = report(&out);
    let v = &report["variants"][1];
    let failure = v["failure"].as_str().unwrap_or_else(|| panic!("{v}"));
    assert!(failure.starts_with("variant scaled (where the reference does not): non-finite logits"), "{failure}");
    assert!(failure.contains("layer 0 at position 0 of prompt 1"), "{failure}");
    // A gate on it fails, saying why.
    let thresholds = dir.path().join("gate.toml");
    std::fs::write(&thresholds, "[variant.scaled]\n\"kld@4\" = { max = 1.0 }\n").expect("written");
    let report_path = out.join("report.json");
    let o = qdrift(&[
        "gate",
        "--report",
        report_path.to_str().expect("utf-8"),
        "--thresholds",
        thresholds.to_str().expect("utf-8"),
    ]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("FAIL scaled kld@4 the variant failed: variant scaled"), "{stdout}");
}

fn report(out: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).expect("report.json")).expect("JSON")
}

/// A `--save-reference` that cannot be written at the end of a run (here: the f16 noise floor
/// overflows, so there is nothing to save) costs nothing else: the reports are written, then the
/// one error line names the store, and the run exits non-zero.
#[test]
fn a_store_that_cannot_be_saved_does_not_cost_the_report() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = scaled_stories(dir.path(), 3000.0);
    let (out, store) = (dir.path().join("out"), dir.path().join("store"));
    let o = qdrift(&[
        "eval",
        "--model",
        model.to_str().expect("utf-8"),
        "--backend",
        "cpu",
        "--dtype",
        "f32",
        "--schemes",
        "int8",
        "--prompts",
        "2",
        "--horizons",
        "4",
        "--out",
        out.to_str().expect("utf-8"),
        "--save-reference",
        store.to_str().expect("utf-8"),
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("qdrift: error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(errors[0].contains("--save-reference") && errors[0].contains("the report was made"), "{stderr}");
    assert!(out.join("report.json").is_file() && out.join("report.md").is_file(), "the reports are written");
    assert!(!store.exists(), "no half store");
}
