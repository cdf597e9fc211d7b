//! The `qdrift` binary end to end: output format and bad input (one clear error line, non-zero
//! exit, no panic).

use std::path::Path;
use std::process::Output;

mod common;
use common::{qdrift, stories};

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Asserts a failed run that printed exactly one error line and did not panic.
fn assert_one_line_error(out: &Output, expected: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "should fail: {stderr}");
    assert!(!stderr.contains("panicked"), "panicked: {stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("qdrift: error:")).collect();
    assert_eq!(errors.len(), 1, "one error line expected, got: {stderr}");
    assert!(errors[0].contains(expected), "error {:?} should mention {expected:?}", errors[0]);
}

#[test]
fn json_output_has_one_object_per_prompt() {
    let dir = stories();
    let out = qdrift(&[
        "generate",
        "--model",
        path(&dir.join("stories260K.bin")),
        "--tokenizer",
        path(&dir.join("tok512.bin")),
        "--prompt",
        "Once upon a time",
        "--prompt",
        "Lily wanted to",
        "--max-new-tokens",
        "12",
        "--backend",
        "cpu",
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // The first line says what runs: the backend, and the CPU's threads and instruction set.
    let first = stderr.lines().next().unwrap_or_default();
    assert!(first.starts_with("qdrift: cpu: CPU ("), "the first stderr line should name the backend: {stderr}");
    assert!(first.contains(" thread"), "{first}");
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["prompt"], "Once upon a time");
    assert_eq!(lines[0]["prompt_tokens"], serde_json::json!([1, 403, 407, 261, 378]));
    // llama2.c's golden continuation of this prompt starts with these tokens.
    assert_eq!(lines[0]["generated_tokens"].as_array().map(Vec::len), Some(12));
    let generated = lines[0]["generated_tokens"].as_array().expect("array");
    assert_eq!(generated[..3], [432, 383, 286]);
    assert!(lines[0]["text"].as_str().unwrap().starts_with("Once upon a time, there was"));
    assert_eq!(lines[1]["backend"], "cpu");
    assert!(lines[1]["adapter"].as_str().is_some_and(|a| a.starts_with("CPU (")), "{}", lines[1]["adapter"]);
}

#[test]
fn tokenizer_is_found_beside_the_model() {
    let dir = stories();
    let out = qdrift(&[
        "generate",
        "--model",
        path(&dir.join("stories260K.bin")),
        "--prompt",
        "Tom",
        "--max-new-tokens",
        "3",
        "--backend",
        "cpu",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn truncated_checkpoint_is_one_clear_error() {
    let dir = stories();
    let tmp = tempfile::tempdir().expect("temp dir");
    let bytes = std::fs::read(dir.join("stories260K.bin")).expect("model");
    let cut = tmp.path().join("cut.bin");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).expect("write");
    let out = qdrift(&[
        "generate",
        "--model",
        path(&cut),
        "--tokenizer",
        path(&dir.join("tok512.bin")),
        "--prompt",
        "Hi",
        "--max-new-tokens",
        "4",
        "--backend",
        "cpu",
    ]);
    assert_one_line_error(&out, "cut.bin: truncated");
}

#[test]
fn wrong_size_tokenizer_is_one_clear_error() {
    let dir = stories();
    let tmp = tempfile::tempdir().expect("temp dir");
    // tok512.bin plus one more token: 513 tokens for a 512-token model.
    let mut bytes = std::fs::read(dir.join("tok512.bin")).expect("tokenizer");
    bytes.extend(0f32.to_le_bytes());
    bytes.extend(3i32.to_le_bytes());
    bytes.extend(b"xyz");
    let tok = tmp.path().join("tok513.bin");
    std::fs::write(&tok, &bytes).expect("write");
    let out = qdrift(&[
        "generate",
        "--model",
        path(&dir.join("stories260K.bin")),
        "--tokenizer",
        path(&tok),
        "--prompt",
        "Hi",
        "--max-new-tokens",
        "4",
        "--backend",
        "cpu",
    ]);
    assert_one_line_error(&out, "tok513.bin has 513 tokens but model");
}

#[test]
fn empty_prompt_is_one_clear_error() {
    let dir = stories();
    let out = qdrift(&[
        "generate",
        "--model",
        path(&dir.join("stories260K.bin")),
        "--prompt",
        "Hi",
        "--prompt",
        "",
        "--max-new-tokens",
        "4",
        "--backend",
        "cpu",
    ]);
    assert_one_line_error(&out, "prompt 2 is empty");
}

#[test]
fn too_many_new_tokens_is_one_clear_error() {
    let dir = stories();
    for backend in ["cpu", "wgpu"] {
        let out = qdrift(&[
            "generate",
            "--model",
            path(&dir.join("stories260K.bin")),
            "--prompt",
            "Hi",
            "--max-new-tokens",
            "1000000000000",
            "--backend",
            backend,
        ]);
        assert_one_line_error(&out, "pass --allow-long");
        // With --allow-long the length rule steps aside and the memory check refuses.
        let out = qdrift(&[
            "generate",
            "--model",
            path(&dir.join("stories260K.bin")),
            "--prompt",
            "Hi",
            "--max-new-tokens",
            "1000000000000",
            "--allow-long",
            "--backend",
            backend,
        ]);
        assert_one_line_error(&out, "new tokens need");
    }
}

#[test]
fn missing_model_and_bad_options_are_errors() {
    let out = qdrift(&["generate", "--model", "/nonexistent/m.bin", "--prompt", "Hi", "--max-new-tokens", "4"]);
    assert_one_line_error(&out, "/nonexistent/m.bin: cannot read");
    let dir = stories();
    let out = qdrift(&[
        "generate",
        "--model",
        path(&dir.join("stories260K.bin")),
        "--prompt",
        "Hi",
        "--max-new-tokens",
        "4",
        "--dtype",
        "f8",
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("invalid value 'f8' for '--dtype <DTYPE>'") && stderr.contains("f16, f32"), "{stderr}");
}

#[test]
fn auto_backend_says_what_it_chose_and_why() {
    let dir = stories();
    let out =
        qdrift(&["generate", "--model", path(&dir.join("stories260K.bin")), "--prompt", "Hi", "--max-new-tokens", "2"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // The first line says what runs and why.
    let line = stderr.lines().next().filter(|l| l.starts_with("qdrift: cpu: ") || l.starts_with("qdrift: wgpu: "));
    let line = line.expect("a backend line first");
    // Either a hardware adapter was found, or the CPU was chosen and the adapters seen are named.
    assert!(
        line.contains("(--backend auto: hardware GPU adapter") || line.contains("no hardware GPU adapter"),
        "{line}"
    );
}

/// Looking for a GPU on a machine without a desktop session prints no `error:` line of the
/// display server's (libwayland's complaint about `XDG_RUNTIME_DIR`): the one line on stderr is
/// qdrift's choice of backend.
#[test]
fn the_gpu_probe_prints_no_spurious_errors() {
    let dir = stories();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_qdrift"))
        .args(["generate", "--model", path(&dir.join("stories260K.bin")), "--prompt", "Hi", "--max-new-tokens", "2"])
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("WAYLAND_DISPLAY")
        .env_remove("WAYLAND_SOCKET")
        .output()
        .expect("qdrift runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("XDG_RUNTIME_DIR") && !stderr.contains("error"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

/// `generate --scheme` takes the whole variant grammar: the KV-cache part changes what the model
/// generates though the weights are the same, and the JSON names the variant canonically.
#[test]
fn generate_runs_activation_and_kv_parts() {
    let dir = stories();
    let run = |scheme: &str| -> Vec<serde_json::Value> {
        let out = qdrift(&[
            "generate",
            "--model",
            path(&dir.join("stories260K.bin")),
            "--prompt",
            "Once upon a time",
            "--prompt",
            "Lily wanted to",
            "--max-new-tokens",
            "100",
            "--dtype",
            "f16",
            "--backend",
            "cpu",
            "--json",
            "--scheme",
            scheme,
        ]);
        assert!(out.status.success(), "{scheme}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).expect("JSON")).collect()
    };
    let tokens = |lines: &[serde_json::Value]| -> Vec<serde_json::Value> {
        lines.iter().map(|l| l["generated_tokens"].clone()).collect()
    };
    let plain = run("fp16");
    let kv = run("fp16+kv-q4_0");
    assert_eq!(kv[0]["scheme"], "fp16+kv-q4_0");
    assert_ne!(tokens(&plain), tokens(&kv), "a q4_0 cache changes 100 greedy tokens of stories260K");
    let w8a8 = run("int8+a-int8");
    assert_eq!(w8a8[0]["scheme"], "w8a8-int8");
    // Whether per-token int8 activations (a step of amax/127) change 100 greedy tokens is a
    // matter of chance; E5M2 activations (2 mantissa bits: every input moves by up to 12.5%) do.
    let e5m2 = run("int8+a-fp8-e5m2");
    assert_eq!(e5m2[0]["scheme"], "int8+a-fp8-e5m2");
    assert_ne!(tokens(&e5m2), tokens(&run("int8")), "E5M2 activations change the tokens");
}

#[test]
fn bf16_on_wgpu_is_refused_naming_the_adapter() {
    let dir = stories();
    let model = dir.join("stories260K.bin");
    let generate = ["generate", "--model", path(&model), "--prompt", "Hi", "--max-new-tokens", "2"];
    let out = tempfile::tempdir().expect("tempdir");
    let eval = ["eval", "--model", path(&model), "--schemes", "int8", "--prompts", "2", "--horizons", "2", "--out"];
    let eval = [&eval[..], &[path(out.path())]].concat();
    for command in [&generate[..], &eval[..]] {
        let out = qdrift(&[command, &["--dtype", "bf16", "--backend", "wgpu"]].concat());
        // The adapter's name is lavapipe's here, a GPU's elsewhere: the line names it either way.
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_one_line_error(&out, "cannot compute in bf16: wgpu's shading language (WGSL) has no bf16 type");
        let line = stderr.lines().find(|l| l.starts_with("qdrift: error:")).expect("an error line");
        assert!(!line.starts_with("qdrift: error:  cannot"), "the adapter is named: {line}");
        assert!(line.contains("--backend cpu"), "{line}");
    }
}

/// Total memory of this machine, from `/proc/meminfo` (Linux), in GiB.
fn total_memory_gib() -> Option<f64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: f64 =
        info.lines().find_map(|l| l.strip_prefix("MemTotal:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb / (1024.0 * 1024.0))
}

#[test]
fn an_evaluation_larger_than_memory_is_refused_before_anything_is_built() {
    // Qwen3-30B-A3B's weights are 57 GiB in f16: past this machine's memory, not a 64 GiB one's.
    if total_memory_gib().is_none_or(|gib| gib > 56.0) {
        println!("skipped: this machine may hold synthetic:qwen3-30b-a3b");
        return;
    }
    let out_dir = tempfile::tempdir().expect("tempdir");
    let out = out_dir.path().join("out");
    let start = std::time::Instant::now();
    let run = qdrift(&[
        "eval",
        "--model",
        "synthetic:qwen3-30b-a3b",
        "--schemes",
        "int8",
        "--prompts",
        "2",
        "--horizons",
        "10",
        "--backend",
        "cpu",
        "--out",
        path(&out),
    ]);
    assert_one_line_error(&run, "int8 in f16: weights 56.87 GiB");
    assert_one_line_error(&run, "its weights alone do not fit, at any batch size");
    assert!(start.elapsed().as_secs() < 30, "refused in {:?}, after building something", start.elapsed());
    assert!(!out.join("report.json").exists());
}

#[test]
fn inspect_lists_each_planned_models_memory() {
    let out = qdrift(&["inspect", "--model", "synthetic:llama-1b", "--seq-len", "1200", "--batch", "16", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let plan = json["evaluation_memory"].as_array().expect("evaluation_memory");
    let names: Vec<&str> = plan.iter().filter_map(|m| m["name"].as_str()).collect();
    assert_eq!(names, ["fp16", "noise-floor-f32", "int8", "fp8-e4m3", "int4-g128"]);
    // Weights in f16, the tied table twice; 16 × 1200 positions of f16 keys and values.
    assert_eq!(plan[0]["weight_bytes"], (1_235_814_400u64 + 262_668_288) * 2);
    assert_eq!(plan[0]["kv_cache_bytes"], 16u64 * 1200 * 8 * 64 * 2 * 16 * 2);
    assert_eq!(plan[1]["compute_dtype"], "f32");
    assert_eq!(plan[1]["kv_cache_bytes"].as_u64(), plan[0]["kv_cache_bytes"].as_u64().map(|b| 2 * b));
    let text = qdrift(&["inspect", "--model", "synthetic:llama-1b", "--dtype", "bf16", "--schemes", "int8"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("evaluation memory, one model at a time"), "{text}");
    assert!(text.lines().any(|l| l.trim_start().starts_with("bf16") && l.contains("bf16 weights")), "{text}");
}
