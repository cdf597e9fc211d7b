//! llama.cpp runs the GGUF files `qdrift quantize --format gguf` writes for the newer
//! architectures (issue #30), and reads their weights as qdrift does: each tiny-arch checkpoint
//! (`../shared/models/tiny-arch`) exported as fp16, and quantized (q8_0; gpt-oss's mxfp4, as its
//! checkpoints ship), is loaded by llama.cpp's `llama-debug`, which tokenizes a prompt and saves
//! the logits of its last position. qdrift's model read from the same file, given llama.cpp's
//! tokens, computes logits within [`TOLERANCE`] of the logits' scale, with the same argmax (or
//! two within that difference of a tie):
//! - of llama.cpp's on the fp16 file (llama.cpp rounds activations to f16 there);
//! - for a quantized file, of llama.cpp's on the file's dequantized weights written as fp16: on
//!   the quantized file itself llama.cpp also rounds every activation to q8_0 blocks, which
//!   moves the logits of these tiny random models by up to 15% (printed, not compared).
//!
//! The LongRoPE Phi-3 made from the tiny one (`qdrift_tests::longrope_phi3`, original context 512)
//! runs in a context within its original length, where llama.cpp takes the short factors too. The
//! tiny Qwen2-MoE of `qdrift_tests::qwen2_moe` runs as llama.cpp's `qwen2moe`, shared expert and
//! all.
//!
//! A router whose top-k is within f16 rounding of a tie may pick another expert in llama.cpp's
//! f16 activations than in qdrift's f32 ones, which moves the logits far past [`TOLERANCE`]. Where
//! a model with experts differs that much, qdrift's model computing in f16 must then agree
//! within [`TOLERANCE`] instead: the difference is llama.cpp's activation precision, not the
//! file.
//!
//! Runs only where `QDRIFT_LLAMA_DEBUG` names a `llama-debug` binary (llama.cpp's
//! `examples/debug`); CI builds no llama.cpp, and the test says it skipped.

use std::path::{Path, PathBuf};
use std::process::Command;

use burn::tensor::{DType, Int, Tensor, TensorData};
use qdrift_generate::BackendChoice;
use qdrift_load::write::gguf_tokenizer_keys;
use qdrift_load::{GgufValue, HostModel, open_model};
use qdrift_model::{Llama, Positions};
use qdrift_quantize::{QuantizeOptions, Scheme, quantize_model, round_to_fp16_reference, write_gguf};
use qdrift_tests::{device, shared_dir};

/// Largest |Δ logit| allowed, relative to the largest |logit| of llama.cpp's row: f16
/// activations on llama.cpp's side against f32 on qdrift's.
const TOLERANCE: f64 = 0.03;

const PROMPTS: [&str; 4] = [
    "Once upon a time, a little fox found a shiny stone by the river.",
    "The cat sat on the mat and looked",
    "In the beginning",
    "She opened the door and saw a big red",
];

/// llama.cpp's context (a multiple of 256, which llama.cpp rounds a context up to): within the
/// LongRoPE Phi-3's original context, so that llama.cpp runs its short factors as qdrift does (it
/// takes the long ones when its context is longer).
const CONTEXT: &str = "256";

/// The LongRoPE Phi-3 of `qdrift_tests::longrope_phi3` in `dir`, with an original context of 512
/// (of 4096).
fn longrope_phi3(dir: &Path) {
    qdrift_tests::longrope_phi3(dir);
    let path = dir.join("config.json");
    let mut c: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).expect("config")).expect("JSON");
    c["original_max_position_embeddings"] = 512.into();
    c["max_position_embeddings"] = 4096.into();
    std::fs::write(&path, serde_json::to_vec(&c).expect("JSON")).expect("config.json writes");
}

/// llama.cpp's last-position logits for `prompt` and the tokens it fed, for `gguf`.
fn llama_cpp_logits(binary: &Path, gguf: &Path, prompt: &str, out: &Path) -> (Vec<f32>, Vec<u32>) {
    let o = Command::new(binary)
        .args(["-m", &gguf.to_string_lossy(), "-p", prompt, "--save-logits", "--logits-output-dir"])
        .arg(out)
        .args(["-c", CONTEXT, "-t", "2", "-ngl", "0"])
        .output()
        .expect("llama-debug runs");
    assert!(o.status.success(), "llama-debug on {}: {}", gguf.display(), String::from_utf8_lossy(&o.stderr));
    let stem = gguf.file_stem().expect("stem").to_string_lossy().into_owned();
    let words = |name: String| -> Vec<[u8; 4]> {
        let bytes = std::fs::read(out.join(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        bytes.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]).collect()
    };
    let logits = words(format!("llamacpp-{stem}.bin")).into_iter().map(f32::from_le_bytes).collect();
    let tokens = words(format!("llamacpp-{stem}-tokens.bin")).into_iter().map(u32::from_le_bytes).collect();
    (logits, tokens)
}

/// qdrift's last-position logits of `tokens`, from the GGUF file, computed in `dtype` on the CPU
/// backend.
fn qdrift_logits(gguf: &Path, tokens: &[u32], dtype: DType) -> Vec<f32> {
    let loaded = open_model(gguf, None).unwrap_or_else(|e| panic!("{}: {e}", gguf.display()));
    let model = Llama::from_host(&loaded.model, dtype, &device(BackendChoice::Cpu).device).expect("model");
    let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
    let input: Tensor<2, Int> = Tensor::from_data(TensorData::new(ids, [1, tokens.len()]), &model.device());
    let mut caches = model.new_caches(1, tokens.len());
    let logits = model.forward(input, &Positions::left_padded(&[tokens.len()]), &mut caches, false);
    logits.into_data().convert::<f32>().try_into_vec::<f32>().expect("f32 logits")
}

fn argmax(xs: &[f32]) -> usize {
    xs.iter().enumerate().fold(0, |best, (i, &x)| if x > xs[best] { i } else { best })
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).fold(0f64, |m, (&x, &y)| m.max((f64::from(x) - f64::from(y)).abs()))
}

/// `model` quantized with `scheme` and written as GGUF at `path`; the dequantized weights.
fn export(model: &HostModel, scheme: &str, keys: &[(String, GgufValue)], path: &Path) -> HostModel {
    let s: Scheme = scheme.parse().expect("scheme");
    let q = quantize_model(model, &s, &QuantizeOptions::default()).expect("quantized");
    write_gguf(path, &q, keys).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    q.dequantized
}

#[test]
fn llama_cpp_runs_the_exported_architectures() {
    let Some(binary) = std::env::var_os("QDRIFT_LLAMA_DEBUG").map(PathBuf::from) else {
        println!("skipped: QDRIFT_LLAMA_DEBUG does not name llama.cpp's llama-debug");
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path();
    let longrope = out.join("phi3_longrope");
    std::fs::create_dir(&longrope).expect("folder");
    longrope_phi3(&longrope);
    let qwen2_moe = out.join("qwen2_moe");
    std::fs::create_dir(&qwen2_moe).expect("folder");
    qdrift_tests::qwen2_moe(&qwen2_moe, &[]);
    // gemma2's tiny checkpoint has an untied head, which llama.cpp's gemma2 cannot hold (refused).
    let tiny = |name: &str| shared_dir().join("models/tiny-arch").join(name);
    let models = ["qwen3", "qwen3_moe", "gemma3", "phi3", "gpt_oss", "mixtral", "smollm3"].map(|f| (f, tiny(f)));
    let made = [("phi3_longrope", longrope.clone()), ("qwen2_moe", qwen2_moe.clone())];
    for (folder, source) in models.into_iter().chain(made) {
        let loaded = open_model(&source, None).expect("tiny-arch");
        let keys = gguf_tokenizer_keys(&loaded).expect("tokenizer keys");
        let mut reference = loaded.model;
        round_to_fp16_reference(&mut reference);
        let quantized = if folder == "gpt_oss" { "mxfp4" } else { "q8_0" };
        let fp16 = out.join(format!("{folder}-fp16.gguf"));
        export(&reference, "fp16", &keys, &fp16);
        let file = out.join(format!("{folder}-{quantized}.gguf"));
        let dequantized = export(&reference, quantized, &keys, &file);
        let as_f16 = out.join(format!("{folder}-{quantized}-dequantized.gguf"));
        export(&dequantized, "fp16", &keys, &as_f16);
        for prompt in PROMPTS {
            for (what, theirs, ours) in [("fp16", &fp16, &fp16), (quantized, &as_f16, &file)] {
                let (want, tokens) = llama_cpp_logits(&binary, theirs, prompt, out);
                let mut got = qdrift_logits(ours, &tokens, DType::F32);
                let scale = want.iter().fold(0f64, |m, &x| m.max(f64::from(x).abs()));
                let mut diff = max_abs_diff(&want, &got);
                println!("{folder} {what}, {} tokens: max |Δ| {diff:.2e} of scale {scale:.2}", tokens.len());
                if diff > TOLERANCE * scale && reference.arch.moe.is_some() {
                    got = qdrift_logits(theirs, &tokens, DType::F16);
                    diff = max_abs_diff(&want, &got);
                    println!("  a route within f16 rounding of a tie: qdrift in f16 differs by {diff:.2e}");
                }
                assert_eq!(want.len(), got.len(), "{folder} {what}: vocabulary");
                // The same top token, unless the two are within the logits' difference of a tie.
                let (a, b) = (argmax(&want), argmax(&got));
                let gap = f64::from(got[b] - got[a]).max(f64::from(want[a] - want[b]));
                assert!(a == b || gap <= 2.0 * diff, "{folder} {what} {prompt:?}: argmax {a} against {b}, gap {gap}");
                assert!(diff <= TOLERANCE * scale, "{folder} {what} {prompt:?}: max |Δ| {diff} of scale {scale}");
            }
            let (own, _) = llama_cpp_logits(&binary, &file, prompt, out);
            let (dq, _) = llama_cpp_logits(&binary, &as_f16, prompt, out);
            println!(
                "  llama.cpp on its {quantized} file against the dequantized weights: {:.2e}",
                max_abs_diff(&own, &dq)
            );
        }
    }
}
