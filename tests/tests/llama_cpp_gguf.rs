//! llama.cpp runs the GGUF files `qdrift quantize --format gguf` writes for the newer
//! architectures (issue #30): each tiny-arch checkpoint (`../shared/models/tiny-arch`) exported as
//! fp16 and q8_0 (mxfp4 experts for gpt-oss, as its checkpoints ship) is loaded by llama.cpp's
//! `llama-debug`, which tokenizes a prompt and saves the logits of its last position; qdrift's
//! model read from the same file, given llama.cpp's tokens, computes logits that agree with them
//! (same argmax, max |Δ| within [`TOLERANCE`] of the logits' scale). llama.cpp rounds
//! activations (to f16 for f16 weights, to q8_0 blocks for q8_0 weights) where qdrift keeps f32,
//! so agreement is within that rounding, not bit for bit.
//!
//! Runs only where `QDRIFT_LLAMA_DEBUG` names a `llama-debug` binary (llama.cpp's
//! `examples/debug`); CI builds no llama.cpp, and the test says it skipped.

use std::path::{Path, PathBuf};
use std::process::Command;

use burn::tensor::{DType, Int, Tensor, TensorData};
use qdrift_generate::BackendChoice;
use qdrift_load::open_model;
use qdrift_load::write::gguf_tokenizer_keys;
use qdrift_model::{Llama, Positions};
use qdrift_quantize::{QuantizeOptions, Scheme, quantize_model, round_to_fp16_reference, write_gguf};
use qdrift_tests::{device, shared_dir};

/// Largest |Δ logit| allowed, relative to the largest |logit| of llama.cpp's row.
const TOLERANCE: f64 = 0.05;

const PROMPT: &str = "Once upon a time, a little fox found a shiny stone by the river.";

/// llama.cpp's last-position logits and the tokens it fed, for `gguf`.
fn llama_cpp_logits(binary: &Path, gguf: &Path, out: &Path) -> (Vec<f32>, Vec<u32>) {
    let o = Command::new(binary)
        .args(["-m", &gguf.to_string_lossy(), "-p", PROMPT, "--save-logits", "--logits-output-dir"])
        .arg(out)
        .args(["-c", "256", "-t", "2", "-ngl", "0"])
        .output()
        .expect("llama-debug runs");
    assert!(o.status.success(), "llama-debug on {}: {}", gguf.display(), String::from_utf8_lossy(&o.stderr));
    let stem = gguf.file_stem().expect("stem").to_string_lossy().into_owned();
    let floats = |name: String| -> Vec<[u8; 4]> {
        let bytes = std::fs::read(out.join(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        bytes.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]).collect()
    };
    let logits = floats(format!("llamacpp-{stem}.bin")).into_iter().map(f32::from_le_bytes).collect();
    let tokens = floats(format!("llamacpp-{stem}-tokens.bin")).into_iter().map(u32::from_le_bytes).collect();
    (logits, tokens)
}

/// qdrift's last-position logits of `tokens`, from the GGUF file, f32 on the CPU backend.
fn qdrift_logits(gguf: &Path, tokens: &[u32]) -> Vec<f32> {
    let loaded = open_model(gguf, None).unwrap_or_else(|e| panic!("{}: {e}", gguf.display()));
    let model = Llama::from_host(&loaded.model, DType::F32, &device(BackendChoice::Cpu).device).expect("model");
    let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
    let input: Tensor<2, Int> = Tensor::from_data(TensorData::new(ids, [1, tokens.len()]), &model.device());
    let mut caches = model.new_caches(1, tokens.len());
    let logits = model.forward(input, &Positions::left_padded(&[tokens.len()]), &mut caches, false);
    logits.into_data().try_into_vec::<f32>().expect("f32 logits")
}

fn argmax(xs: &[f32]) -> usize {
    xs.iter().enumerate().fold(0, |best, (i, &x)| if x > xs[best] { i } else { best })
}

#[test]
fn llama_cpp_runs_the_exported_architectures() {
    let Some(binary) = std::env::var_os("QDRIFT_LLAMA_DEBUG").map(PathBuf::from) else {
        println!("skipped: QDRIFT_LLAMA_DEBUG does not name llama.cpp's llama-debug");
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    // gemma2's tiny checkpoint has an untied head, which llama.cpp's gemma2 cannot hold (refused).
    for folder in ["qwen3", "qwen3_moe", "gemma3", "phi3", "gpt_oss", "mixtral"] {
        let loaded = open_model(&shared_dir().join("models/tiny-arch").join(folder), None).expect("tiny-arch");
        let keys = gguf_tokenizer_keys(&loaded).expect("tokenizer keys");
        let mut reference = loaded.model;
        round_to_fp16_reference(&mut reference);
        let quantized = if folder == "gpt_oss" { "mxfp4" } else { "q8_0" };
        for scheme in ["fp16", quantized] {
            let s: Scheme = scheme.parse().expect("scheme");
            let q = quantize_model(&reference, &s, &QuantizeOptions::default()).expect("quantized");
            let path = dir.path().join(format!("{folder}-{scheme}.gguf"));
            write_gguf(&path, &q, &keys).unwrap_or_else(|e| panic!("{folder} {scheme}: {e}"));
            let (want, tokens) = llama_cpp_logits(&binary, &path, dir.path());
            let got = qdrift_logits(&path, &tokens);
            let scale = want.iter().fold(0f64, |m, &x| m.max(f64::from(x).abs()));
            let diff = want.iter().zip(&got).fold(0f64, |m, (&a, &b)| m.max((f64::from(a) - f64::from(b)).abs()));
            println!(
                "{folder} {scheme}: {} tokens, argmax {} / {}, max |Δ| {diff:.2e} of scale {scale:.2}",
                tokens.len(),
                argmax(&want),
                argmax(&got)
            );
            assert_eq!(want.len(), got.len(), "{folder} {scheme}: vocabulary");
            assert_eq!(argmax(&want), argmax(&got), "{folder} {scheme}: argmax");
            assert!(diff <= TOLERANCE * scale, "{folder} {scheme}: max |Δ| {diff} of scale {scale}");
        }
    }
}
