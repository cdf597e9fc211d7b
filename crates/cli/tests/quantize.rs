//! `qdrift quantize` and `qdrift generate --scheme` on stories260K.

use std::collections::HashMap;
use std::path::Path;

mod common;
use common::{qdrift, stories};
use qdrift_quantize::Scheme;

/// Per-tensor SQNR (dB; `f64::INFINITY` for exact) printed by `qdrift quantize --json`.
fn sqnr(scheme: &str, dir: &Path) -> HashMap<String, f64> {
    let model = stories().join("stories260K.bin");
    let out_file = dir.join(format!("{scheme}.safetensors"));
    let out = qdrift(&[
        "quantize",
        "--model",
        model.to_str().unwrap(),
        "--scheme",
        scheme,
        "--out",
        out_file.to_str().unwrap(),
        "--json",
    ]);
    assert!(out.status.success(), "{scheme}: {}", String::from_utf8_lossy(&out.stderr));
    assert!(out_file.is_file(), "{scheme}: no output file");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["scheme"], scheme);
    v["tensors"]
        .as_array()
        .expect("tensors")
        .iter()
        .map(|t| (t["tensor"].as_str().unwrap().to_string(), t["sqnr_db"].as_f64().unwrap_or(f64::INFINITY)))
        .collect()
}

#[test]
fn every_scheme_quantizes_stories260k_and_int8_beats_int4() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let mut all = HashMap::new();
    // The names themselves are pinned by `crates/quantize/tests/schemes.rs`; here every one of
    // them must work through the binary.
    for scheme in Scheme::all().iter().map(ToString::to_string) {
        let s = sqnr(&scheme, tmp.path());
        assert_eq!(s.len(), 35, "{scheme}: 5 layers × 7 linear weights");
        assert!(s.values().all(|v| !v.is_nan()), "{scheme}: NaN SQNR");
        all.insert(scheme, s);
    }
    for (tensor, int8) in &all["int8"] {
        let (g32, g128) = (all["int4-g32"][tensor], all["int4-g128"][tensor]);
        println!("{tensor:<42} int8 {int8:7.3} int4-g32 {g32:7.3} int4-g128 {g128:7.3}");
        assert!(*int8 > g32 && g32 > g128, "{tensor}: int8 {int8} > int4-g32 {g32} > int4-g128 {g128} fails");
    }
    assert!(all["fp16"].values().all(|v| v.is_infinite()), "fp16 on an FP16 reference is exact");
}

#[test]
fn table_output_names_fallbacks_and_bits() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let model = stories().join("stories260K.bin");
    let out_file = tmp.path().join("q.safetensors");
    let out = qdrift(&[
        "quantize",
        "--model",
        model.to_str().unwrap(),
        "--scheme",
        "q8_0",
        "--out",
        out_file.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("model.layers.0.self_attn.q_proj.weight"), "{stdout}");
    assert!(stdout.contains("8.5000"), "q8_0 is 8.5 bits/weight: {stdout}");
    assert!(stdout.contains("kept at reference precision: model.layers.0.mlp.down_proj.weight"), "{stdout}");
}

#[test]
fn unknown_scheme_lists_the_known_ones() {
    let model = stories().join("stories260K.bin");
    let out = qdrift(&[
        "quantize",
        "--model",
        model.to_str().unwrap(),
        "--scheme",
        "int3",
        "--out",
        "/tmp/never.safetensors",
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr
            .contains("unknown weight scheme `int3`; a variant is WEIGHTS[+a-ACT][+kv-KV]; WEIGHTS: fp16, bf16, int8"),
        "{stderr}"
    );
    assert!(!Path::new("/tmp/never.safetensors").exists());
}

#[test]
fn generate_runs_a_quantized_variant() {
    let model = stories().join("stories260K.bin");
    let run = |scheme: &str| {
        let out = qdrift(&[
            "generate",
            "--model",
            model.to_str().unwrap(),
            "--prompt",
            "Once upon a time",
            "--max-new-tokens",
            "40",
            "--backend",
            "cpu",
            "--dtype",
            "f16",
            "--scheme",
            scheme,
            "--json",
        ]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(v["scheme"], scheme);
        v["generated_tokens"].clone()
    };
    let fp16 = run("fp16");
    // Same FP16 reference weights with and without the identity scheme: identical tokens.
    let plain = qdrift(&[
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--prompt",
        "Once upon a time",
        "--max-new-tokens",
        "40",
        "--backend",
        "cpu",
        "--dtype",
        "f16",
        "--json",
    ]);
    let plain: serde_json::Value = serde_json::from_slice(&plain.stdout).expect("JSON");
    assert_eq!(plain["generated_tokens"], fp16);
    let q4 = run("int4-g32");
    assert_eq!(q4.as_array().map(Vec::len), Some(40));
}
