//! `timed_generate` and `copy_bandwidth` (what `cargo xtask bench gpu` measures with), and their
//! CLI lines: `qdrift generate --timing-json`, `qdrift bandwidth`. On stories260K and small
//! copies, on the CPU backend and wgpu (lavapipe here): the numbers' shape and consistency, not
//! their speed.

use std::path::{Path, PathBuf};
use std::process::Command;

use burn::tensor::DType;
use qdrift_generate::{BackendChoice, GenerateError, GenerationConfig, copy_bandwidth, generate, timed_generate};
use qdrift_model::Llama;
use qdrift_tests::{device, load_stories};

#[test]
fn timed_generation_returns_the_same_tokens_and_consistent_times() {
    let loaded = load_stories();
    let prompts: Vec<Vec<u32>> = ["Once upon a time", "The dog"].iter().map(|p| loaded.tokenizer.encode(p)).collect();
    for choice in [BackendChoice::Cpu, BackendChoice::Wgpu] {
        let device = device(choice);
        let model = Llama::from_host(&loaded.model, DType::F32, &device.device).expect("model builds");
        let config = GenerationConfig { max_new_tokens: 12, batch_size: 2, stop_at_eos: None };
        let plain = generate(&model, &device, &prompts, &config, |_| {}).expect("generates");
        let (timed, t) = timed_generate(&model, &device, &prompts, &config).expect("times");
        assert_eq!(timed, plain, "{choice:?}: timing changes no token");
        assert_eq!((t.prompts, t.batch_size, t.new_tokens), (2, 2, 12));
        assert!(t.first_token_s > 0.0 && t.total_s > 0.0, "{t:?}");
        // On a shared CPU the one-token run can take longer than the whole request: no step then.
        match t.decode_step_s {
            Some(step) => assert!(step > 0.0 && (step - (t.total_s - t.first_token_s) / 11.0).abs() < 1e-12, "{t:?}"),
            None => assert!(t.total_s <= t.first_token_s, "{t:?}"),
        }
        assert!((t.tokens_per_s() - 24.0 / t.total_s).abs() < 1e-9 * t.tokens_per_s());

        let eos = GenerationConfig { stop_at_eos: Some(2), ..config.clone() };
        assert!(matches!(timed_generate(&model, &device, &prompts, &eos), Err(GenerateError::Unsupported(_))));
        let one = GenerationConfig { max_new_tokens: 1, ..config };
        let (_, t) = timed_generate(&model, &device, &prompts, &one).expect("one token times");
        assert_eq!(t.decode_step_s, None);
    }
}

#[test]
fn copy_bandwidth_is_positive_and_refuses_sizes_it_cannot_time() {
    for choice in [BackendChoice::Cpu, BackendChoice::Wgpu] {
        let device = device(choice);
        let b = copy_bandwidth(&device, 8 << 20, 2).expect("copies");
        assert_eq!(b.bytes, 8 << 20);
        assert!(b.best_s > 0.0 && b.bytes_per_s().is_finite() && b.bytes_per_s() > 0.0, "{b:?}");
        assert!(matches!(copy_bandwidth(&device, 1000, 2), Err(GenerateError::TooLarge(_))));
        assert!(matches!(copy_bandwidth(&device, 8 << 20, 0), Err(GenerateError::Unsupported(_))));
    }
    let lavapipe = device(BackendChoice::Wgpu);
    if let Some(max) = lavapipe.max_buffer_bytes {
        let e = copy_bandwidth(&lavapipe, max + (1 << 20), 1).expect_err("over the largest buffer");
        assert!(e.to_string().contains("largest buffer"), "{e}");
    }
}

/// The `qdrift` binary built beside this test (`target/<profile>/qdrift`).
fn qdrift() -> Command {
    let exe = std::env::current_exe().expect("the test knows its path");
    let bin: PathBuf = exe.parent().and_then(Path::parent).map(|d| d.join("qdrift")).expect("target folder");
    assert!(bin.exists(), "{} is missing: `cargo test --workspace` builds it", bin.display());
    Command::new(bin)
}

/// The number after `"key":` in a flat one-line JSON object.
fn number(line: &str, key: &str) -> f64 {
    let v: serde_json::Value = serde_json::from_str(line).expect("one JSON object");
    v[key].as_f64().unwrap_or_else(|| panic!("{key} in {line}"))
}

#[test]
fn generate_timing_json_is_one_line_on_stderr_and_the_text_is_unchanged() {
    let dir = qdrift_tests::stories_dir();
    let run = |timing: bool| {
        let mut c = qdrift();
        c.args(["generate", "--backend", "cpu", "--max-new-tokens", "8", "--prompt", "Once", "--prompt", "A dog"]);
        c.arg("--model").arg(dir.join("stories260K.bin")).arg("--tokenizer").arg(dir.join("tok512.bin"));
        if timing {
            c.arg("--timing-json");
        }
        let out = c.output().expect("qdrift runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (plain, _) = run(false);
    let (text, stderr) = run(true);
    assert_eq!(text, plain);
    let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with('{')).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    let line = lines[0];
    assert_eq!(number(line, "prompts"), 2.0);
    assert_eq!(number(line, "new_tokens"), 8.0);
    let (total, first) = (number(line, "total_s"), number(line, "first_token_s"));
    assert!((number(line, "tokens_per_s") - 16.0 / total).abs() < 1e-6 * number(line, "tokens_per_s"));
    let v: serde_json::Value = serde_json::from_str(line).expect("one JSON object");
    match v["decode_step_s"].as_f64() {
        Some(step) => assert!((step - (total - first) / 7.0).abs() < 1e-9 && step > 0.0, "{line}"),
        None => assert!(total <= first && v["decode_tokens_per_s"].is_null(), "{line}"),
    }
    assert!(line.contains("\"backend\":\"cpu\""), "{line}");
    // No GPU cache on the CPU backend, whatever the build.
    assert_eq!(v["autotune_cache_persists"], serde_json::Value::Bool(false), "{line}");
    assert!(v["gpu_cache_dir"].is_null(), "{line}");
}

#[test]
fn bandwidth_prints_one_json_line_and_refuses_bad_sizes() {
    let out = qdrift().args(["bandwidth", "--backend", "cpu", "--mib", "8", "--reps", "2"]).output().expect("runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert_eq!(number(stdout.trim(), "bytes"), (8u64 << 20) as f64);
    assert!(number(stdout.trim(), "bytes_per_s") > 0.0);
    let out = qdrift().args(["bandwidth", "--backend", "cpu", "--mib", "0"]).output().expect("runs");
    assert_eq!(out.status.code(), Some(2), "clap refuses --mib 0");
}
