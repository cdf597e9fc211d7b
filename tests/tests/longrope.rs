//! LongRoPE (Phi-3.5, Phi-4-mini: `Phi3ForCausalLM` with `rope_scaling.type = longrope`) on the
//! tiny-arch Phi-3 made a LongRoPE checkpoint ([`longrope_phi3`]: no `transformers`-written one
//! exists), against the independent f64 forward pass (`qdrift_tests::reference64`, which follows
//! `_compute_longrope_parameters`: the short factors up to the original context, the long ones
//! past it, cos and sin scaled by the attention factor):
//! - teacher-forced logits of golden prompt 0 and its greedy continuation (60 positions, within
//!   the original 64) on every kernel combination of the CPU backend and on wgpu agree with the
//!   f64 pass within [`AGREE`];
//! - the scaling is applied: the logits differ from the same checkpoint without LongRoPE, and
//!   from LongRoPE with an attention factor of 1;
//! - the three golden prompts decode in one left-padded batch up to the original context (each
//!   greedy token the f64 pass's best within [`AGREE`]), and one token more is refused before
//!   anything runs, naming LongRoPE and both lengths.

use burn::tensor::{DType, Device};
use qdrift_generate::{BackendChoice, ComputeDevice, GenerateError, GenerationConfig, generate};
use qdrift_load::{HostModel, RopeScaling, open_model};
use qdrift_model::{AttentionKernel, LinearKernel, Llama};
use qdrift_tests::reference64::{Rounding, naive_logits};
use qdrift_tests::{LONGROPE_ORIGINAL, LONGROPE_SHORT, cached_logits, device, longrope_phi3, shared_dir};

/// Largest |Δlogit| allowed against the f64 pass (issue #30's model tolerance).
const AGREE: f64 = 1e-4;

/// The LongRoPE checkpoint, the tiny Phi-3 it was made from, the golden prompts, and prompt 0
/// followed by its golden greedy continuation.
struct Fixture {
    longrope: HostModel,
    plain: HostModel,
    prompts: Vec<Vec<u32>>,
    tokens: Vec<u32>,
}

fn ids_of(v: &serde_json::Value) -> Vec<Vec<u32>> {
    let lists = v.as_array().expect("a list of id lists");
    lists.iter().map(|p| p.as_array().expect("ids").iter().map(|t| t.as_u64().expect("id") as u32).collect()).collect()
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    longrope_phi3(dir.path());
    let longrope = open_model(dir.path(), None).unwrap_or_else(|e| panic!("the LongRoPE Phi-3 opens: {e}")).model;
    let src = shared_dir().join("models/tiny-arch/phi3");
    let plain = open_model(&src, None).unwrap_or_else(|e| panic!("{}: {e}", src.display())).model;
    let text = std::fs::read_to_string(src.join("golden.json")).expect("golden.json reads");
    let golden: serde_json::Value = serde_json::from_str(&text).expect("golden.json is JSON");
    let prompts = ids_of(&golden["prompts"]);
    let tokens = [prompts[0].clone(), ids_of(&golden["greedy"])[0].clone()].concat();
    assert!(tokens.len() <= LONGROPE_ORIGINAL, "{} positions run the short factors", tokens.len());
    Fixture { longrope, plain, prompts, tokens }
}

fn max_abs<T: Copy + Into<f64>>(got: &[Vec<f32>], want: &[Vec<T>]) -> f64 {
    assert_eq!(got.len(), want.len(), "positions");
    got.iter().flatten().zip(want.iter().flatten()).fold(0.0, |m, (&g, &w)| m.max((f64::from(g) - w.into()).abs()))
}

#[test]
fn longrope_logits_match_the_f64_pass_on_both_backends() {
    let f = fixture();
    let af = (1.0 + 8f64.ln() / 64f64.ln()).sqrt();
    match &f.longrope.arch.rope_scaling {
        Some(RopeScaling::LongRope { short_factor, original_max_position_embeddings, attention_factor, .. }) => {
            assert_eq!((short_factor.as_slice(), *original_max_position_embeddings), (&LONGROPE_SHORT[..], 64));
            assert_eq!(*attention_factor, af as f32);
        }
        other => panic!("LongRoPE expected, got {other:?}"),
    }
    let want = naive_logits(&f.longrope, &f.tokens, &Rounding::default());
    let split = f.prompts[0].len();
    for linear in [LinearKernel::Burn, LinearKernel::Host] {
        let model = Llama::from_host_with(&f.longrope, DType::F32, &Device::flex(), linear).expect("model builds");
        for kernel in [AttentionKernel::Composed, AttentionKernel::Host] {
            let err = max_abs(&cached_logits(&model, &Device::flex(), &f.tokens, (split, 1), kernel), &want);
            println!("LongRoPE phi3, CPU, {linear:?} linear, {kernel:?} attention: max |Δlogit| {err:.2e}");
            assert!(err <= AGREE, "CPU {linear:?}/{kernel:?}: max |Δlogit| {err:.2e}");
        }
    }
    let gpu = device(BackendChoice::Wgpu);
    let model = Llama::from_host(&f.longrope, DType::F32, &gpu.device).expect("model builds");
    let err = max_abs(&cached_logits(&model, &gpu.device, &f.tokens, (split, 7), AttentionKernel::Composed), &want);
    println!("LongRoPE phi3, wgpu ({}): max |Δlogit| {err:.2e}", gpu.adapter);
    assert!(err <= AGREE, "wgpu: max |Δlogit| {err:.2e}");
}

#[test]
fn longrope_changes_the_logits() {
    let f = fixture();
    let cpu = |m: &HostModel| {
        let model = Llama::from_host(m, DType::F32, &Device::flex()).expect("model builds");
        cached_logits(&model, &Device::flex(), &f.tokens, (f.tokens.len(), 1), AttentionKernel::Host)
    };
    let scaled = cpu(&f.longrope);
    let mut unit = f.longrope.clone();
    if let Some(RopeScaling::LongRope { attention_factor, .. }) = &mut unit.arch.rope_scaling {
        *attention_factor = 1.0;
    }
    let plain = max_abs(&scaled, &cpu(&f.plain));
    let unit = max_abs(&scaled, &cpu(&unit));
    println!("LongRoPE vs plain RoPE: max |Δlogit| {plain:.3}; vs attention factor 1: {unit:.3}");
    assert!(plain > 1000.0 * AGREE && unit > 1000.0 * AGREE, "{plain:.2e}, {unit:.2e}");
}

/// Greedy decoding of the three golden prompts in one left-padded batch on `dev`, up to the
/// original context: each new token must be the f64 pass's best within [`AGREE`]. One token more
/// is refused.
fn decode_to_the_original_context(f: &Fixture, dev: &ComputeDevice) {
    let model = Llama::from_host(&f.longrope, DType::F32, &dev.device).expect("model builds");
    let longest = f.prompts.iter().map(Vec::len).max().unwrap_or(0);
    let config = |n| GenerationConfig { max_new_tokens: n, batch_size: f.prompts.len(), stop_at_eos: None };
    let n = LONGROPE_ORIGINAL - longest;
    let out = generate(&model, dev, &f.prompts, &config(n), |_| {}).expect("decodes up to the original context");
    for (i, (p, new)) in f.prompts.iter().zip(&out).enumerate() {
        assert_eq!(new.len(), n, "prompt {i}");
        let seq = [p.clone(), new[..n - 1].to_vec()].concat();
        let want = naive_logits(&f.longrope, &seq, &Rounding::default());
        for (k, &t) in new.iter().enumerate() {
            let row = &want[p.len() - 1 + k];
            let best = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            assert!(row[t as usize] >= best - AGREE, "{}: prompt {i}, new token {k}: {t} is not the best", dev.adapter);
        }
    }
    let e = generate(&model, dev, &f.prompts, &config(n + 1), |_| panic!("nothing runs")).unwrap_err();
    let want = GenerateError::LongRopeContext { positions: 65, longest, new_tokens: n + 1, original: 64 };
    assert_eq!(e.to_string(), want.to_string());
    let line = e.to_string();
    assert!(line.starts_with("LongRoPE: 65 positions") && line.contains("original context of 64"), "{line}");
}

#[test]
fn longrope_decodes_to_the_original_context_and_refuses_past_it() {
    let f = fixture();
    for choice in [BackendChoice::Cpu, BackendChoice::Wgpu] {
        decode_to_the_original_context(&f, &device(choice));
    }
}
