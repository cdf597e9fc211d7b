//! The Burn model (flex CPU backend, f32) against an independent naive forward pass in f64
//! written here from the definitions: RMSNorm, q/k/v projections with biases, interleaved RoPE
//! (with Llama 3.1's scaling and with per-pair divisors), grouped-query causal attention, SwiGLU.
//!
//! Fixture: the synthetic `tiny` model (dim 32, 2 layers, 4 query / 2 key-value heads of width 8,
//! hidden 64, vocab 320) with its linear weights scaled from std 0.02 to 0.2, so that attention
//! is far from uniform and positions matter, and seeded uniform q/k/v biases in [-0.5, 0.5].

use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use qdrift_load::{HostModel, HostTensor, RopeScaling, synthetic_model};
use qdrift_model::{AttentionKernel, KvCache, Llama, LlamaConfig, ModelError, Positions};

const TOKENS: [u32; 9] = [1, 75, 104, 3, 319, 200, 42, 42, 7];

/// Uniform values in `[-0.5, 0.5)` from a 64-bit LCG (Knuth's MMIX constants), top 24 bits.
fn uniform(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

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

// ---- the naive reference, f64 -------------------------------------------------------------

/// `w · x` for a `[out, in]` host weight, plus the bias.
fn matvec(w: &HostTensor, b: Option<&HostTensor>, x: &[f64]) -> Vec<f64> {
    let (out, inp) = (w.shape[0], w.shape[1]);
    (0..out)
        .map(|r| {
            let dot: f64 = (0..inp).map(|c| f64::from(w.data[r * inp + c]) * x[c]).sum();
            dot + b.map_or(0.0, |b| f64::from(b.data[r]))
        })
        .collect()
}

fn rms_norm(x: &[f64], w: &HostTensor, eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + eps).sqrt();
    x.iter().zip(&w.data).map(|(v, &g)| v * inv * f64::from(g)).collect()
}

/// Rotates pairs `(2i, 2i+1)` of every head by `pos · inv_freq[i]`.
fn rope(x: &mut [f64], head_dim: usize, pos: usize, inv_freq: &[f64]) {
    for head in x.chunks_mut(head_dim) {
        for (i, f) in inv_freq.iter().enumerate() {
            let (s, c) = (pos as f64 * f).sin_cos();
            let (a, b) = (head[2 * i], head[2 * i + 1]);
            head[2 * i] = a * c - b * s;
            head[2 * i + 1] = a * s + b * c;
        }
    }
}

/// The inverse frequencies from the definitions (f64): `theta^(-2i/d)`, Llama 3.1's bands,
/// or per-pair divisors.
fn inv_freq(m: &HostModel) -> Vec<f64> {
    let (hd, theta) = (m.arch.head_dim(), f64::from(m.arch.rope_theta));
    let plain = (0..hd / 2).map(|i| theta.powf(-((2 * i) as f64) / hd as f64));
    match &m.arch.rope_scaling {
        None => plain.collect(),
        Some(RopeScaling::FreqFactors { factors }) => plain.zip(factors).map(|(f, &d)| f / f64::from(d)).collect(),
        Some(RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings }) => {
            let (factor, low, high) = (f64::from(*factor), f64::from(*low_freq_factor), f64::from(*high_freq_factor));
            let old = *original_max_position_embeddings as f64;
            plain
                .map(|f| {
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    if wavelen < old / high {
                        f
                    } else if wavelen > old / low {
                        f / factor
                    } else {
                        let smooth = (old / wavelen - low) / (high - low);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect()
        }
    }
}

/// Logits `[position][vocab]` of one sequence, every position.
fn naive_logits(m: &HostModel, tokens: &[u32]) -> Vec<Vec<f64>> {
    let a = &m.arch;
    let (dim, hd, heads, kv_heads) = (a.dim, a.head_dim(), a.n_heads, a.n_kv_heads);
    let eps = f64::from(a.norm_eps);
    let freqs = inv_freq(m);
    let emb = &m.token_embedding;
    let mut xs: Vec<Vec<f64>> =
        tokens.iter().map(|&t| emb.data[t as usize * dim..][..dim].iter().map(|&v| f64::from(v)).collect()).collect();
    for l in &m.layers {
        let (mut qs, mut ks, mut vs) = (Vec::new(), Vec::new(), Vec::new());
        for (pos, x) in xs.iter().enumerate() {
            let xn = rms_norm(x, &l.attn_norm, eps);
            let mut q = matvec(&l.wq, l.bq.as_ref(), &xn);
            let mut k = matvec(&l.wk, l.bk.as_ref(), &xn);
            rope(&mut q, hd, pos, &freqs);
            rope(&mut k, hd, pos, &freqs);
            qs.push(q);
            ks.push(k);
            vs.push(matvec(&l.wv, l.bv.as_ref(), &xn));
        }
        for (t, x) in xs.iter_mut().enumerate() {
            let mut attended = vec![0.0; heads * hd];
            for h in 0..heads {
                let kvh = h / (heads / kv_heads);
                let q = &qs[t][h * hd..][..hd];
                let scores: Vec<f64> = (0..=t)
                    .map(|s| {
                        q.iter().zip(&ks[s][kvh * hd..][..hd]).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let z: f64 = e.iter().sum();
                for (s, w) in e.iter().enumerate() {
                    for j in 0..hd {
                        attended[h * hd + j] += w / z * vs[s][kvh * hd + j];
                    }
                }
            }
            for (xi, o) in x.iter_mut().zip(matvec(&l.wo, None, &attended)) {
                *xi += o;
            }
            let xn = rms_norm(x, &l.ffn_norm, eps);
            let (g, u) = (matvec(&l.w_gate, None, &xn), matvec(&l.w_up, None, &xn));
            let act: Vec<f64> = g.iter().zip(&u).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
            for (xi, o) in x.iter_mut().zip(matvec(&l.w_down, None, &act)) {
                *xi += o;
            }
        }
    }
    xs.iter().map(|x| matvec(m.output_weight(), None, &rms_norm(x, &m.final_norm, eps))).collect()
}

// ---- the Burn model --------------------------------------------------------------------------

fn build(m: &HostModel) -> Llama {
    LlamaConfig::from_arch(&m.arch).init_from_host(m, DType::F32, &Device::flex()).expect("model builds")
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
    burn_logits_with(model, tokens, split, AttentionKernel::for_device(&Device::flex()))
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

/// Checks both attention kernels against the naive pass; returns the host kernel's logits.
fn check_against_naive(m: &HostModel, what: &str) -> Vec<Vec<f32>> {
    let want = naive_logits(m, &TOKENS);
    let model = build(m);
    let mut got = Vec::new();
    for kernel in [AttentionKernel::Composed, AttentionKernel::Host] {
        got = burn_logits_with(&model, &TOKENS, 6, kernel);
        let rel = relative_error(&got, &want);
        println!(
            "{what}, {kernel:?} attention: max relative error {rel:.2e} (logit scale {:.3})",
            want.iter().flatten().fold(0.0f64, |a, v| a.max(v.abs()))
        );
        assert!(rel < 1e-5, "{what}, {kernel:?} attention: relative error {rel:e}");
    }
    got
}

#[test]
fn biased_model_matches_the_naive_forward_pass() {
    let with = check_against_naive(&tiny(true, None), "q/k/v biases");
    let without = check_against_naive(&tiny(false, None), "no biases");
    // The biases change the result well beyond the agreement above.
    let differ = relative_error(&with, &naive_logits(&tiny(false, None), &TOKENS));
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
    let model = build(&zero);
    assert!(model.layers[0].attn.wq.bias.is_some(), "the bias is uploaded");
    assert_eq!(burn_logits(&model, &TOKENS, 6), burn_logits(&build(&plain), &TOKENS, 6));
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
    let e = LlamaConfig::from_arch(&m.arch).init_from_host(&m, DType::F32, &Device::flex()).expect_err("refused");
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
    let want = naive_logits(&m, &TOKENS);
    let model = LlamaConfig::from_arch(&m.arch).init_from_host(&m, DType::F16, &Device::flex()).expect("f16 builds");
    for kernel in [AttentionKernel::Composed, AttentionKernel::Host] {
        let got = burn_logits_with(&model, &TOKENS, 6, kernel);
        let rel = relative_error(&got, &want);
        println!("f16, {kernel:?} attention: max relative error {rel:.2e}");
        assert!(rel < 2e-2, "f16, {kernel:?} attention: relative error {rel:e}");
    }
}
