//! The Burn model (flex CPU backend, f32) against the independent naive forward pass in f64
//! (`qdrift_tests::reference64`, from the definitions): RMSNorm, q/k/v projections with biases, interleaved RoPE
//! (with Llama 3.1's scaling and with per-pair divisors), grouped-query causal attention, SwiGLU.
//!
//! Fixture: the synthetic `tiny` model (dim 32, 2 layers, 4 query / 2 key-value heads of width 8,
//! hidden 64, vocab 320) with its linear weights scaled from std 0.02 to 0.2, so that attention
//! is far from uniform and positions matter, and seeded uniform q/k/v biases in [-0.5, 0.5].

use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use qdrift_load::{HostModel, HostTensor, RopeScaling, synthetic_model};
use qdrift_model::{AttentionKernel, KvCache, LinearKernel, Llama, ModelError, Positions};
use qdrift_tests::reference64::{Rounding, naive_logits};
use qdrift_tests::uniform;

const TOKENS: [u32; 9] = [1, 75, 104, 3, 319, 200, 42, 42, 7];

fn tiny(biases: bool, rope_scaling: Option<RopeScaling>) -> HostModel {
    let mut m = synthetic_model("tiny", 11).expect("tiny").model;
    for l in &mut m.layers {
        for (_, w) in l.linears_mut() {
            w.data.iter_mut().for_each(|x| *x *= 10.0);
        }
    }
    if biases {
        let (q, kv) = (m.arch.n_heads * m.arch.head_dim(), m.arch.kv_dim());
        for (i, l) in m.layers.iter_mut().enumerate() {
            let b = |k: u64, n: usize| Some(HostTensor::new(vec![n], uniform(10 * i as u64 + k, n)).expect("shape"));
            (l.bq, l.bk, l.bv) = (b(1, q), b(2, kv), b(3, kv));
        }
    }
    m.arch.rope_scaling = rope_scaling;
    m
}

// ---- the Burn model --------------------------------------------------------------------------

fn build_with(m: &HostModel, dtype: DType, linear: LinearKernel) -> Llama {
    Llama::from_host_with(m, dtype, &Device::flex(), linear).expect("model builds")
}

fn ids(tokens: &[u32]) -> Tensor<2, Int> {
    let data: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
    Tensor::from_data(TensorData::new(data, [1, tokens.len()]), &Device::flex())
}

fn rows(logits: Tensor<3>) -> Vec<Vec<f32>> {
    let [_, t, v] = logits.dims();
    let data = logits.into_data().try_into_vec::<f32>().expect("f32 logits");
    (0..t).map(|i| data[i * v..(i + 1) * v].to_vec()).collect()
}

/// Logits of every position: one pass over `split` tokens, then the rest one at a time through
/// the key-value cache, as generation runs, with the device's default attention kernel (the host
/// kernel on flex).
fn burn_logits(model: &Llama, tokens: &[u32], split: usize) -> Vec<Vec<f32>> {
    burn_logits_with(model, tokens, split, AttentionKernel::for_device(&Device::flex(), DType::F32))
}

fn burn_logits_with(model: &Llama, tokens: &[u32], split: usize, kernel: AttentionKernel) -> Vec<Vec<f32>> {
    let positions = Positions::left_padded(&[tokens.len()]);
    let mut caches: Vec<KvCache> = model.new_caches_for(1, tokens.len(), kernel);
    let mut out = rows(model.forward(ids(&tokens[..split]), &positions, &mut caches, true));
    for &t in &tokens[split..] {
        out.extend(rows(model.forward(ids(&[t]), &positions, &mut caches, true)));
    }
    out
}

/// max |burn − naive| / max |naive| over every position and token.
fn relative_error(got: &[Vec<f32>], want: &[Vec<f64>]) -> f64 {
    assert_eq!((got.len(), got[0].len()), (want.len(), want[0].len()));
    let scale = want.iter().flatten().fold(0.0f64, |m, v| m.max(v.abs()));
    let err =
        got.iter().flatten().zip(want.iter().flatten()).fold(0.0f64, |m, (g, w)| m.max((f64::from(*g) - w).abs()));
    err / scale
}

/// Checks both attention kernels and both linear-layer kernels against the naive pass; returns
/// the host kernels' logits.
fn check_against_naive(m: &HostModel, what: &str) -> Vec<Vec<f32>> {
    let want = naive_logits(m, &TOKENS, &Rounding::default());
    let mut got = Vec::new();
    for linear in [LinearKernel::Burn, LinearKernel::Host] {
        let model = build_with(m, DType::F32, linear);
        for kernel in [AttentionKernel::Composed, AttentionKernel::Host] {
            got = burn_logits_with(&model, &TOKENS, 6, kernel);
            let rel = relative_error(&got, &want);
            println!(
                "{what}, {linear:?} linear, {kernel:?} attention: max relative error {rel:.2e} (logit scale {:.3})",
                want.iter().flatten().fold(0.0f64, |a, v| a.max(v.abs()))
            );
            assert!(rel < 1e-5, "{what}, {linear:?} linear, {kernel:?} attention: relative error {rel:e}");
        }
    }
    got
}

#[test]
fn biased_model_matches_the_naive_forward_pass() {
    let with = check_against_naive(&tiny(true, None), "q/k/v biases");
    let without = check_against_naive(&tiny(false, None), "no biases");
    // The biases change the result well beyond the agreement above.
    let differ = relative_error(&with, &naive_logits(&tiny(false, None), &TOKENS, &Rounding::default()));
    println!("biases move the logits by {differ:.2e} (relative)");
    assert!(differ > 1e-2, "biases barely matter: {differ:e}");
    assert_ne!(with, without);
}

#[test]
fn zero_biases_give_the_unbiased_logits_exactly() {
    let plain = tiny(false, None);
    let mut zero = plain.clone();
    for l in &mut zero.layers {
        let z = |n: usize| Some(HostTensor::new(vec![n], vec![0.0; n]).expect("shape"));
        (l.bq, l.bk, l.bv) = (z(l.wq.shape[0]), z(l.wk.shape[0]), z(l.wv.shape[0]));
    }
    for linear in [LinearKernel::Burn, LinearKernel::Host] {
        let model = build_with(&zero, DType::F32, linear);
        assert!(model.layers[0].attn.qkv.has_bias(0), "the bias is kept");
        let plain = build_with(&plain, DType::F32, linear);
        assert_eq!(burn_logits(&model, &TOKENS, 6), burn_logits(&plain, &TOKENS, 6), "{linear:?}");
    }
}

#[test]
fn llama3_scaled_rope_matches_the_naive_forward_pass() {
    // head_dim 8, theta 10000: wavelengths 6.3, 63, 628, 6283. With original context 256 and
    // frequency factors 1 and 8, pair 0 is kept (< 32), pair 1 interpolated, pairs 2 and 3
    // (> 256) divided by the factor: every band of the formula is exercised.
    let scaling = RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 8.0,
        original_max_position_embeddings: 256,
    };
    let scaled = check_against_naive(&tiny(true, Some(scaling)), "llama3 RoPE scaling");
    let plain = check_against_naive(&tiny(true, None), "plain RoPE");
    assert_ne!(scaled, plain, "the scaling changes the logits");
    let divisors = RopeScaling::FreqFactors { factors: vec![1.0, 2.5, 8.0, 8.0] };
    check_against_naive(&tiny(true, Some(divisors)), "per-pair frequency divisors");
}

#[test]
fn misshapen_bias_is_an_error_naming_the_tensor() {
    let mut m = tiny(true, None);
    m.layers[1].bk = Some(HostTensor::new(vec![15], vec![0.0; 15]).expect("shape"));
    let e = Llama::from_host(&m, DType::F32, &Device::flex()).expect_err("refused");
    assert!(matches!(e, ModelError::Shape { .. }));
    assert_eq!(e.to_string(), "tensor model.layers.1.self_attn.k_proj.bias has shape [15], expected [16]");
}

#[test]
fn f16_model_with_biases_and_scaling_stays_close() {
    let scaling = RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 8.0,
        original_max_position_embeddings: 256,
    };
    let m = tiny(true, Some(scaling));
    let want = naive_logits(&m, &TOKENS, &Rounding::default());
    for linear in [LinearKernel::Burn, LinearKernel::Host] {
        let model = build_with(&m, DType::F16, linear);
        for kernel in [AttentionKernel::Composed, AttentionKernel::Host] {
            let got = burn_logits_with(&model, &TOKENS, 6, kernel);
            let rel = relative_error(&got, &want);
            println!("f16, {linear:?} linear, {kernel:?} attention: max relative error {rel:.2e}");
            assert!(rel < 2e-2, "f16, {linear:?} linear, {kernel:?} attention: relative error {rel:e}");
        }
    }
}
