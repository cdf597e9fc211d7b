//! Qwen2's q/k/v biases and Llama 3.1's RoPE scaling end to end: stories260K given seeded biases
//! (or a `llama3` rope_scaling) is written as a Hugging Face folder (`Qwen2ForCausalLM` /
//! `LlamaForCausalLM` with `rope_scaling`) and as GGUF (`qwen2` / `llama` with
//! `rope_freqs.weight`), opened with `open_model` and run greedily on the CPU backend. Every file
//! must generate what the in-memory model generates, and the biases and the scaling must change
//! the logits.

use burn::tensor::DType;
use qdrift_generate::BackendChoice;
use qdrift_load::write::{WriteDtype, write_gguf, write_hf_folder};
use qdrift_load::{HostModel, HostTensor, Llama2cTokenizer, LoadedModel, RopeScaling, open_model};
use qdrift_tests::{device, golden_cases, load_stories, run_greedy, stories_dir};

const TOKENS: usize = 48;

fn greedy(model: HostModel, prompts: &[Vec<u32>]) -> (Vec<Vec<u32>>, Vec<Vec<f32>>) {
    let loaded = LoadedModel { model, ..load_stories() };
    run_greedy(&loaded, &device(BackendChoice::Cpu), DType::F32, prompts, TOKENS, prompts.len())
}

fn greedy_file(loaded: &LoadedModel, prompts: &[Vec<u32>]) -> (Vec<Vec<u32>>, Vec<Vec<f32>>) {
    run_greedy(loaded, &device(BackendChoice::Cpu), DType::F32, prompts, TOKENS, prompts.len())
}

fn prompts() -> Vec<Vec<u32>> {
    golden_cases().into_iter().map(|c| c.prompt_tokens).collect()
}

fn max_abs_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter().flatten().zip(b.iter().flatten()).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Tokens before the first difference, summed over prompts.
fn agreement(a: &[Vec<u32>], b: &[Vec<u32>]) -> usize {
    a.iter().zip(b).map(|(x, y)| x.iter().zip(y).take_while(|(p, q)| p == q).count()).sum()
}

/// The greedy run of `changed`, after checking that its first-step logits differ from the
/// unchanged stories260K's by more than 0.1 (`what` changed, for the messages).
fn changed_run(
    plain: &HostModel,
    changed: &HostModel,
    prompts: &[Vec<u32>],
    what: &str,
) -> (Vec<Vec<u32>>, Vec<Vec<f32>>) {
    let (plain_tokens, plain_logits) = greedy(plain.clone(), prompts);
    let (tokens, logits) = greedy(changed.clone(), prompts);
    let moved = max_abs_diff(&logits, &plain_logits);
    println!(
        "{what}: first-step logits move by up to {moved:.3}; {}/{} greedy tokens before the first difference",
        agreement(&tokens, &plain_tokens),
        TOKENS * prompts.len()
    );
    assert!(moved > 0.1, "{what} barely change(s) the logits ({moved})");
    (tokens, logits)
}

/// Uniform values in `[-amplitude, amplitude)` from a 64-bit LCG (Knuth's MMIX constants).
fn uniform(seed: u64, n: usize, amplitude: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * amplitude
        })
        .collect()
}

#[test]
fn qwen2_biases_load_from_hf_and_gguf_and_generate() {
    let reference = load_stories();
    let tok = Llama2cTokenizer::read(&stories_dir().join("tok512.bin")).expect("tok512");
    let mut biased = reference.model.clone();
    let (q, kv) = (biased.arch.n_heads * biased.arch.head_dim(), biased.arch.kv_dim());
    for (i, l) in biased.layers.iter_mut().enumerate() {
        let b = |k: u64, n: usize| Some(HostTensor::new(vec![n], uniform(10 * i as u64 + k, n, 0.5)).expect("shape"));
        (l.bq, l.bk, l.bv) = (b(1, q), b(2, kv), b(3, kv));
    }
    // Reports count the biases: stories260K has 5 layers, q 64 and kv 32 wide.
    assert_eq!(biased.parameter_count(), reference.model.parameter_count() + 5 * (64 + 2 * 32));
    assert_eq!(reference.model.parameter_count(), reference.model.arch.parameter_count());
    let prompts = prompts();
    let (want_tokens, want_logits) = changed_run(&reference.model, &biased, &prompts, "biases");

    let dir = tempfile::tempdir().expect("tempdir");
    let hf = dir.path().join("qwen2");
    write_hf_folder(&hf, &biased, &tok, WriteDtype::F32).expect("writes HF folder");
    let gguf = dir.path().join("qwen2.gguf");
    write_gguf(&gguf, &biased, &tok, WriteDtype::F32).expect("writes GGUF");
    for (path, architecture) in [(&hf, "Qwen2ForCausalLM"), (&gguf, "qwen2")] {
        let loaded = open_model(path, None).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(loaded.model.arch.architecture, architecture);
        assert_eq!(loaded.model.layers, biased.layers, "{}: F32 weights and biases bit-exact", path.display());
        let (tokens, logits) = greedy_file(&loaded, &prompts);
        assert_eq!(logits, want_logits, "{}: logits", path.display());
        assert_eq!(tokens, want_tokens, "{}: greedy tokens", path.display());
    }
}

#[test]
fn llama31_rope_scaling_loads_from_hf_and_gguf_and_generates() {
    let reference = load_stories();
    let tok = Llama2cTokenizer::read(&stories_dir().join("tok512.bin")).expect("tok512");
    // stories260K: head_dim 8, theta 10000, so wavelengths 6.3, 63, 628 and 6283 positions. This
    // scaling keeps pair 0, interpolates pair 1 and divides pairs 2 and 3 by 8, as Llama 3.1's
    // does for its 128-wide heads and 8192-position original context.
    let scaling = RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 8.0,
        original_max_position_embeddings: 256,
    };
    let mut scaled = reference.model.clone();
    assert_eq!((scaled.arch.head_dim(), scaled.arch.rope_theta), (8, 10000.0));
    scaled.arch.rope_scaling = Some(scaling.clone());
    let prompts = prompts();
    let (want_tokens, want_logits) = changed_run(&reference.model, &scaled, &prompts, "llama3 scaling");

    let dir = tempfile::tempdir().expect("tempdir");
    let hf = dir.path().join("llama31");
    write_hf_folder(&hf, &scaled, &tok, WriteDtype::F32).expect("writes HF folder");
    let loaded = open_model(&hf, None).expect("a Llama 3.1-style folder opens");
    assert_eq!(loaded.model.arch.rope_scaling, Some(scaling));
    let (tokens, logits) = greedy_file(&loaded, &prompts);
    assert_eq!((tokens, logits), (want_tokens.clone(), want_logits.clone()), "HF folder: same computation");

    // GGUF carries the scaling as llama.cpp's converter writes it, per-pair divisors in
    // rope_freqs.weight: the same frequencies up to f32 rounding.
    let gguf = dir.path().join("llama31.gguf");
    write_gguf(&gguf, &scaled, &tok, WriteDtype::F32).expect("writes GGUF");
    let loaded = open_model(&gguf, None).expect("a GGUF with rope_freqs.weight opens");
    assert!(matches!(loaded.model.arch.rope_scaling, Some(RopeScaling::FreqFactors { .. })));
    let (tokens, logits) = greedy_file(&loaded, &prompts);
    let diff = max_abs_diff(&logits, &want_logits);
    println!(
        "GGUF rope_freqs vs HF rope_scaling: first-step logits max |Δ| {diff:.2e}; {}/{} tokens agree",
        agreement(&tokens, &want_tokens),
        TOKENS * prompts.len()
    );
    assert!(diff < 1e-4, "GGUF logits differ by {diff}");
    assert_eq!(tokens, want_tokens, "GGUF greedy tokens");
}
