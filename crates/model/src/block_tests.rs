//! Tests of the blocks beyond Llama's (`Llama::from_host` with every dense feature of
//! `BlockSpec`/`LayerWeights`): small random models against a naive float64 forward pass written
//! here from `transformers`' definitions (interleaved RoPE layout, as `HostModel` holds q/k), and
//! each feature's own hand computation.

use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use qdrift_weights::{
    Activation, ArchShape, BlockSpec, Ffn, HostModel, HostTensor, LayerWeights, Mlp, ModelArch, NormStyle, RopeScaling,
};

use crate::tensors::{host_f32, upload};
use crate::{AttentionKernel, KvCache, Llama, Positions};

/// Deterministic values in `[-scale, scale)`.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, scale: f32) -> f32 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
    }

    fn tensor(&mut self, shape: &[usize], scale: f32, offset: f32) -> HostTensor {
        let n = shape.iter().product();
        HostTensor { shape: shape.to_vec(), data: (0..n).map(|_| offset + self.next(scale)).collect() }
    }
}

/// Which optional tensors a random model's layers carry.
#[derive(Clone, Copy, Default)]
struct Extras {
    qk_norm: bool,
    qkv_bias: bool,
    o_bias: bool,
    sinks: bool,
    ffn_bias: bool,
}

/// The "tiny" preset's shape (2 layers, dim 32, 4/2 heads, vocab 320) with a head of `head_dim`.
fn base_arch(head_dim: usize) -> ModelArch {
    let shape = ArchShape {
        dim: 32,
        hidden_dim: 48,
        n_layers: 2,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim,
        vocab_size: 64,
        max_seq_len: 64,
    };
    ModelArch { norm_eps: 1e-6, ..ModelArch::new("test", shape) }
}

/// Random weights for `arch` with `extras`; norms near 1 (`x̂·w`) or near 0 (`x̂·(1 + w)`).
fn random_model(arch: ModelArch, extras: Extras, seed: u64) -> HostModel {
    let mut r = Lcg(seed);
    let (d, hid, hd) = (arch.dim, arch.hidden_dim, arch.head_dim);
    let (q, kv) = (arch.q_dim(), arch.kv_dim());
    let norm_offset = if arch.block.norm == NormStyle::OnePlusWeight { 0.0 } else { 1.0 };
    let sandwich = arch.block.sandwich_norms;
    let layers = (0..arch.n_layers)
        .map(|_| {
            let mut norm = |n: usize| r.tensor(&[n], 0.3, norm_offset);
            let (attn_norm, ffn_norm) = (norm(d), norm(d));
            let (post_attn_norm, post_ffn_norm) = if sandwich { (Some(norm(d)), Some(norm(d))) } else { (None, None) };
            let (q_norm, k_norm) = if extras.qk_norm { (Some(norm(hd)), Some(norm(hd))) } else { (None, None) };
            let mut opt = |on: bool, n: usize, scale: f32| on.then(|| r.tensor(&[n], scale, 0.0));
            let (bq, bk, bv) =
                (opt(extras.qkv_bias, q, 0.3), opt(extras.qkv_bias, kv, 0.3), opt(extras.qkv_bias, kv, 0.3));
            let bo = opt(extras.o_bias, d, 0.3);
            let sinks = opt(extras.sinks, arch.n_heads, 2.0);
            let (gate_bias, up_bias, down_bias) =
                (opt(extras.ffn_bias, hid, 0.3), opt(extras.ffn_bias, hid, 0.3), opt(extras.ffn_bias, d, 0.3));
            let mut w = |rows: usize, cols: usize| r.tensor(&[rows, cols], 1.0 / (cols as f32).sqrt() * 1.7, 0.0);
            LayerWeights {
                attn_norm,
                wq: w(q, d),
                wk: w(kv, d),
                wv: w(kv, d),
                wo: w(d, q),
                bq,
                bk,
                bv,
                bo,
                q_norm,
                k_norm,
                sinks,
                post_attn_norm,
                ffn_norm,
                post_ffn_norm,
                ffn: Ffn::Dense(Mlp { gate: w(hid, d), up: w(hid, d), down: w(d, hid), gate_bias, up_bias, down_bias }),
            }
        })
        .collect();
    HostModel {
        token_embedding: r.tensor(&[arch.vocab_size, d], 1.0, 0.0),
        final_norm: r.tensor(&[d], 0.3, norm_offset),
        output: Some(r.tensor(&[arch.vocab_size, d], 0.5, 0.0)),
        layers,
        arch,
    }
}

// ---------------------------------------------------------------------------------------------
// The float64 reference.

fn f64s(t: &HostTensor) -> Vec<f64> {
    t.data.iter().map(|&v| f64::from(v)).collect()
}

/// `y = W·x (+ b)`, `W` `[out, in]`.
fn matvec(w: &HostTensor, b: Option<&HostTensor>, x: &[f64]) -> Vec<f64> {
    let cols = w.shape[1];
    w.data
        .chunks(cols)
        .enumerate()
        .map(|(o, row)| {
            let s: f64 = row.iter().zip(x).map(|(&a, &b)| f64::from(a) * b).sum();
            s + b.map_or(0.0, |b| f64::from(b.data[o]))
        })
        .collect()
}

fn rms_norm(x: &[f64], w: &HostTensor, eps: f64, style: NormStyle) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + eps).sqrt();
    let plus = if style == NormStyle::OnePlusWeight { 1.0 } else { 0.0 };
    x.iter().zip(f64s(w)).map(|(v, w)| v * inv * (plus + w)).collect()
}

/// The inverse frequencies of `transformers`' rope functions in float64 (over `dim` rotated
/// dimensions) and the attention factor.
fn inv_freq_f64(dim: usize, theta: f64, scaling: Option<&RopeScaling>) -> (Vec<f64>, f64) {
    let plain: Vec<f64> = (0..dim / 2).map(|i| 1.0 / theta.powf((2 * i) as f64 / dim as f64)).collect();
    match scaling {
        None => (plain, 1.0),
        Some(RopeScaling::Linear { factor }) => (plain.iter().map(|f| f / f64::from(*factor)).collect(), 1.0),
        Some(&RopeScaling::Yarn {
            factor,
            beta_fast,
            beta_slow,
            original_max_position_embeddings,
            truncate,
            attention_factor,
        }) => {
            let (d, l0) = (dim as f64, original_max_position_embeddings as f64);
            let corr = |r: f64| d * (l0 / (r * 2.0 * std::f64::consts::PI)).ln() / (2.0 * theta.ln());
            let (mut low, mut high) = (corr(f64::from(beta_fast)), corr(f64::from(beta_slow)));
            if truncate {
                (low, high) = (low.floor(), high.ceil());
            }
            let (low, mut high) = (low.max(0.0), high.min(d - 1.0));
            if low == high {
                high += 0.001;
            }
            let f = plain
                .iter()
                .enumerate()
                .map(|(i, &e)| {
                    let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                    e / f64::from(factor) * ramp + e * (1.0 - ramp)
                })
                .collect();
            (f, f64::from(attention_factor))
        }
        Some(other) => panic!("the reference has no {other:?}"),
    }
}

/// Rotates the first `2 · inv.len()` dimensions of a head in interleaved pairs.
fn rotate(head: &mut [f64], pos: usize, inv: &[f64], af: f64) {
    for (i, &f) in inv.iter().enumerate() {
        let a = pos as f64 * f;
        let (c, s) = (a.cos() * af, a.sin() * af);
        let (x0, x1) = (head[2 * i], head[2 * i + 1]);
        head[2 * i] = x0 * c - x1 * s;
        head[2 * i + 1] = x0 * s + x1 * c;
    }
}

fn gated(a: Activation, g: f64, u: f64) -> f64 {
    match a {
        Activation::SwiGlu => g / (1.0 + (-g).exp()) * u,
        Activation::GeluTanh => {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * g * (1.0 + (k * (g + 0.044715 * g.powi(3))).tanh()) * u
        }
        Activation::ClampedSwiGlu { alpha, limit } => {
            let (limit, alpha) = (f64::from(limit), f64::from(alpha));
            let (g, u) = (g.min(limit), u.clamp(-limit, limit));
            (u + 1.0) * g / (1.0 + (-alpha * g).exp())
        }
    }
}

/// One layer's attention over positions `0..=t` (keys `ks`, values `vs`, all heads).
fn attend(m: &HostModel, i: usize, q: &[f64], ks: &[Vec<f64>], vs: &[Vec<f64>], t: usize) -> Vec<f64> {
    let a = &m.arch;
    let (h, kvh, hd) = (a.n_heads, a.n_kv_heads, a.head_dim);
    let scale = a.block.attn_scale.map_or(1.0 / (hd as f64).sqrt(), f64::from);
    let window = a.window(i);
    let mut out = vec![0.0; h * hd];
    for head in 0..h {
        let g = head / (h / kvh);
        let qh = &q[head * hd..(head + 1) * hd];
        let visible: Vec<usize> = (0..=t).filter(|&j| window.is_none_or(|w| t - j < w)).collect();
        let scores: Vec<f64> = visible
            .iter()
            .map(|&j| {
                let s = qh.iter().zip(&ks[j][g * hd..(g + 1) * hd]).map(|(a, b)| a * b).sum::<f64>() * scale;
                a.block.attn_softcap.map_or(s, |c| f64::from(c) * (s / f64::from(c)).tanh())
            })
            .collect();
        let sink = m.layers[i].sinks.as_ref().map(|s| f64::from(s.data[head]));
        let max = scores.iter().copied().chain(sink).fold(f64::NEG_INFINITY, f64::max);
        let denom: f64 = scores.iter().map(|s| (s - max).exp()).sum::<f64>() + sink.map_or(0.0, |s| (s - max).exp());
        for (&j, s) in visible.iter().zip(&scores) {
            let p = (s - max).exp() / denom;
            for (o, v) in out[head * hd..(head + 1) * hd].iter_mut().zip(&vs[j][g * hd..(g + 1) * hd]) {
                *o += p * v;
            }
        }
    }
    out
}

/// Logits of every position of `tokens` (a single sequence from position 0), float64.
fn reference(m: &HostModel, tokens: &[usize]) -> Vec<Vec<f64>> {
    let a = &m.arch;
    let (d, hd, eps, style) = (a.dim, a.head_dim, f64::from(a.norm_eps), a.block.norm);
    let scale = a.embedding_scale.map_or(1.0, f64::from);
    let mut xs: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&t| m.token_embedding.data[t * d..(t + 1) * d].iter().map(|&v| f64::from(v) * scale).collect())
        .collect();
    for (i, l) in m.layers.iter().enumerate() {
        let (theta, scaling) = a.layer_rope(i);
        let (inv, af) = inv_freq_f64(a.rotary_dim(), f64::from(theta), scaling);
        let (mut ks, mut vs, mut qs) = (Vec::new(), Vec::new(), Vec::new());
        for (pos, x) in xs.iter().enumerate() {
            let h = rms_norm(x, &l.attn_norm, eps, style);
            let (mut q, mut k) = (matvec(&l.wq, l.bq.as_ref(), &h), matvec(&l.wk, l.bk.as_ref(), &h));
            for (v, n) in [(&mut q, &l.q_norm), (&mut k, &l.k_norm)] {
                for head in v.chunks_mut(hd) {
                    if let Some(n) = n {
                        let normed = rms_norm(head, n, eps, style);
                        head.copy_from_slice(&normed);
                    }
                    rotate(head, pos, &inv, af);
                }
            }
            qs.push(q);
            ks.push(k);
            vs.push(matvec(&l.wv, l.bv.as_ref(), &h));
        }
        for (t, x) in xs.iter_mut().enumerate() {
            let o = attend(m, i, &qs[t], &ks, &vs, t);
            let mut y = matvec(&l.wo, l.bo.as_ref(), &o);
            if let Some(n) = &l.post_attn_norm {
                y = rms_norm(&y, n, eps, style);
            }
            x.iter_mut().zip(&y).for_each(|(x, y)| *x += y);
            let h = rms_norm(x, &l.ffn_norm, eps, style);
            let mlp = l.mlp().expect("dense");
            let g = matvec(&mlp.gate, mlp.gate_bias.as_ref(), &h);
            let u = matvec(&mlp.up, mlp.up_bias.as_ref(), &h);
            let act: Vec<f64> = g.iter().zip(&u).map(|(&g, &u)| gated(a.block.activation, g, u)).collect();
            let mut y = matvec(&mlp.down, mlp.down_bias.as_ref(), &act);
            if let Some(n) = &l.post_ffn_norm {
                y = rms_norm(&y, n, eps, style);
            }
            x.iter_mut().zip(&y).for_each(|(x, y)| *x += y);
        }
    }
    xs.iter()
        .map(|x| {
            let logits = matvec(m.output_weight(), None, &rms_norm(x, &m.final_norm, eps, style));
            match a.final_logit_softcap {
                Some(c) => logits.iter().map(|l| f64::from(c) * (l / f64::from(c)).tanh()).collect(),
                None => logits,
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The models under test.

/// Qwen3: an explicit head_dim (q_dim 64 ≠ dim 32), per-head q/k norms.
fn qwen3() -> HostModel {
    let mut a = base_arch(16);
    a.block.qk_norm = true;
    random_model(a, Extras { qk_norm: true, ..Extras::default() }, 1)
}

/// Gemma 2: (1 + w) norms, sandwich norms, GELU-tanh, query_pre_attn_scalar, attention and final
/// soft caps (small, so that they bite), embedding scale, a sliding window on even layers.
fn gemma2() -> HostModel {
    let mut a = base_arch(8);
    a.block = BlockSpec {
        norm: NormStyle::OnePlusWeight,
        sandwich_norms: true,
        attn_scale: Some(12f32.powf(-0.5)),
        attn_softcap: Some(1.5),
        activation: Activation::GeluTanh,
        ..BlockSpec::default()
    };
    a.windows = vec![Some(3), None];
    a.embedding_scale = Some(32f32.sqrt());
    a.final_logit_softcap = Some(2.0);
    random_model(a, Extras::default(), 2)
}

/// Gemma 3: Gemma 2's block with (1 + w) q/k norms and no attention cap, local θ on the sliding
/// layer, linear scaling on the global one.
fn gemma3() -> HostModel {
    let mut m = gemma2();
    let a = &mut m.arch;
    a.block.attn_softcap = None;
    a.block.qk_norm = true;
    a.rope_theta = 1e6;
    a.local_rope_theta = Some(10000.0);
    a.rope_scaling = Some(RopeScaling::Linear { factor: 4.0 });
    a.head_dim = 16;
    let arch = a.clone();
    random_model(arch, Extras { qk_norm: true, ..Extras::default() }, 3)
}

/// Phi-3: partial rotary, 12 of a head's 16 dimensions.
fn phi3() -> HostModel {
    let mut a = base_arch(16);
    a.block.rotary_dim = Some(12);
    random_model(a, Extras::default(), 4)
}

/// gpt-oss's dense parts: q/k/v/o biases, sinks, YaRN, a window on even layers, clamped SwiGLU
/// with FFN biases.
fn gpt_oss_dense() -> HostModel {
    let mut a = base_arch(16);
    a.block.sinks = true;
    a.block.activation = Activation::ClampedSwiGlu { alpha: 1.702, limit: 1.5 };
    a.windows = vec![Some(4), None];
    a.rope_theta = 150000.0;
    a.rope_scaling = Some(yarn_tiny_gpt_oss());
    let extras = Extras { qkv_bias: true, o_bias: true, sinks: true, ffn_bias: true, ..Extras::default() };
    random_model(a, extras, 5)
}

/// The tiny gpt-oss checkpoint's YaRN (`arch-spec.md` §8).
fn yarn_tiny_gpt_oss() -> RopeScaling {
    RopeScaling::Yarn {
        factor: 32.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        original_max_position_embeddings: 4096,
        truncate: false,
        attention_factor: 1.346_573_6,
    }
}

fn all_models() -> Vec<(&'static str, HostModel)> {
    vec![("qwen3", qwen3()), ("gemma2", gemma2()), ("gemma3", gemma3()), ("phi3", phi3()), ("gpt-oss", gpt_oss_dense())]
}

const TOKENS: [usize; 11] = [1, 7, 33, 2, 60, 15, 15, 41, 9, 0, 28];

fn ids(t: &[usize], device: &Device) -> Tensor<2, Int> {
    let v: Vec<i32> = t.iter().map(|&t| t as i32).collect();
    Tensor::from_data(TensorData::new(v, [1, t.len()]), device)
}

/// Logits of every position: the first `split` tokens as one pass, then one token per step.
fn model_logits(model: &Llama, tokens: &[usize], split: usize, kernel: AttentionKernel) -> Vec<Vec<f32>> {
    let device = model.device();
    let positions = Positions::left_padded(&[tokens.len()]);
    let mut caches: Vec<KvCache> = model.new_caches_for(1, tokens.len(), kernel);
    let mut out = host_f32(model.forward(ids(&tokens[..split], &device), &positions, &mut caches, true));
    for &t in &tokens[split..] {
        out.extend(host_f32(model.forward(ids(&[t], &device), &positions, &mut caches, true)));
    }
    out.chunks(model.arch.vocab_size).map(<[f32]>::to_vec).collect()
}

/// The largest `|a − b|` over two runs' logits.
fn max_apart<'a>(a: impl IntoIterator<Item = &'a f32>, b: impl IntoIterator<Item = &'a f32>) -> f32 {
    a.into_iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn max_delta(got: &[Vec<f32>], want: &[Vec<f64>]) -> f64 {
    got.iter().flatten().zip(want.iter().flatten()).map(|(&g, w)| (f64::from(g) - w).abs()).fold(0.0, f64::max)
}

#[test]
fn every_dense_feature_matches_the_f64_reference_in_f32() {
    for (name, host) in all_models() {
        let want = reference(&host, &TOKENS);
        let model = Llama::from_host(&host, DType::F32, &Device::flex()).expect(name);
        for kernel in [AttentionKernel::Host, AttentionKernel::Composed] {
            let got = model_logits(&model, &TOKENS, TOKENS.len(), kernel);
            let delta = max_delta(&got, &want);
            assert!(delta < 1e-4, "{name} {kernel:?}: max |Δlogit| {delta:e}");
        }
    }
}

/// Burn's attention op ([`AttentionKernel::Fused`], on wgpu whatever kernel its autotune picks)
/// against the composed path and the f64 reference, in f16 on wgpu, for every dense feature:
/// q/k norms, a scale other than `1/√head_dim` (Gemma 3's `query_pre_attn_scalar`, folded into
/// the queries), sliding windows, partial rotary, and grouped heads (4 query heads over 2 key/
/// value heads). Gemma 2's soft cap and gpt-oss's sinks are not the op's to compute: those models
/// get composed caches. The prompt pass and single-token steps both run, and a batch of two
/// left-padded rows checks the mask: each row's logits equal its own run alone within f16
/// rounding.
#[test]
fn fused_attention_matches_the_composed_path_and_the_f64_reference_on_wgpu() {
    let device = crate::testing::test_wgpu();
    for (name, host) in all_models() {
        let want = reference(&host, &TOKENS);
        let model = Llama::from_host(&host, DType::F16, &device).expect(name);
        let covered = model.layers.iter().all(|l| l.attn.fused_op_covers());
        assert_eq!(covered, !matches!(name, "gemma2" | "gpt-oss"), "{name}: which layers the op covers");
        let fused_caches = model.new_caches_for(1, 4, AttentionKernel::Fused);
        assert_eq!(
            fused_caches.iter().all(|c| c.kernel() == AttentionKernel::Fused),
            covered,
            "{name}: covered layers get fused caches, the rest composed ones"
        );
        if !covered {
            // Composed caches, so the composed path: nothing fused to compare (and each kernel
            // shape costs lavapipe a compilation).
            continue;
        }
        let composed = model_logits(&model, &TOKENS, 4, AttentionKernel::Composed);
        let fused = model_logits(&model, &TOKENS, 4, AttentionKernel::Fused);
        let (d_fused, d_composed) = (max_delta(&fused, &want), max_delta(&composed, &want));
        let between = max_apart(fused.iter().flatten(), composed.iter().flatten());
        println!("{name}: fused {d_fused:.2e}, composed {d_composed:.2e} from f64; {between:.2e} apart");
        assert!(d_fused < 5e-2, "{name} fused: max |Δlogit| {d_fused:e} from f64");
        assert!(between < 5e-2, "{name}: fused and composed {between:e} apart");

        // Two rows, the shorter left-padded: each row as it computes alone.
        let (long, short) = (&TOKENS[..7], &TOKENS[2..6]);
        let positions = Positions::left_padded(&[long.len(), short.len()]);
        let mut caches = model.new_caches_for(2, 9, AttentionKernel::Fused);
        let mut padded = vec![0usize; long.len() - short.len()];
        padded.extend_from_slice(short);
        let both: Vec<i32> = long.iter().chain(&padded).map(|&t| t as i32).collect();
        let prompt = Tensor::<2, Int>::from_data(TensorData::new(both, [2, long.len()]), &device);
        let mut batched = vec![host_f32(model.forward(prompt, &positions, &mut caches, false))];
        let step = Tensor::<2, Int>::from_data(TensorData::new(vec![5i32, 9], [2, 1]), &device);
        batched.push(host_f32(model.forward(step, &positions, &mut caches, false)));
        for (row, tokens) in [(0, long), (1, short)] {
            let alone =
                model_logits(&model, &[tokens, &[[5, 9][row]][..]].concat(), tokens.len(), AttentionKernel::Fused);
            let v = model.arch.vocab_size;
            for (pass, got) in batched.iter().enumerate() {
                let alone = &alone[tokens.len() - 1 + pass];
                let d = max_apart(&got[row * v..(row + 1) * v], alone);
                assert!(d < 1e-2, "{name}: row {row} pass {pass} differs from the row alone by {d:e}");
            }
        }
    }
}

#[test]
fn every_dense_feature_runs_in_f16_near_the_reference() {
    for (name, host) in all_models() {
        let want = reference(&host, &TOKENS);
        let model = Llama::from_host(&host, DType::F16, &Device::flex()).expect(name);
        let got = model_logits(&model, &TOKENS, 4, AttentionKernel::Host);
        let delta = max_delta(&got, &want);
        assert!(delta < 5e-2, "{name} f16: max |Δlogit| {delta:e}");
    }
}

/// Prompt then decoding steps gives teacher forcing's logits for every feature (within f32
/// rounding: a fallback layer's composed attention blocks its matmuls by column count, so
/// `steps_match_teacher_forcing` says no for them).
#[test]
fn prompt_then_steps_equals_teacher_forcing_for_every_feature() {
    for (name, host) in all_models() {
        let model = Llama::from_host(&host, DType::F32, &Device::flex()).expect(name);
        let forced = model_logits(&model, &TOKENS, TOKENS.len(), AttentionKernel::Host);
        let stepped = model_logits(&model, &TOKENS, 3, AttentionKernel::Host);
        let delta = max_apart(forced.iter().flatten(), stepped.iter().flatten());
        assert!(delta < 1e-5, "{name}: {delta:e}");
        assert!(!model.steps_match_teacher_forcing(), "{name} falls back to Burn's attention");
    }
    let llama = qdrift_load::synthetic_model("tiny", 3).expect("tiny").model;
    assert!(Llama::from_host(&llama, DType::F32, &Device::flex()).expect("llama").steps_match_teacher_forcing());
}

#[test]
fn host_weights_round_trip_every_new_tensor() {
    for (name, host) in all_models() {
        for dtype in [DType::F32, DType::F16] {
            let mut host = host.clone();
            if dtype == DType::F16 {
                host.round_to_f16();
            }
            let model = Llama::from_host(&host, dtype, &Device::flex()).expect(name);
            assert!(model.host_weights() == host, "{name} {dtype:?}");
        }
    }
}

/// A batch of two left-padded rows gives each row its own logits (padding never attended to,
/// windows counted in positions).
#[test]
fn a_left_padded_batch_gives_each_row_its_own_logits() {
    for (name, host) in all_models() {
        let model = Llama::from_host(&host, DType::F32, &Device::flex()).expect(name);
        let device = Device::flex();
        let (long, short) = (&TOKENS[..], &TOKENS[4..]);
        let positions = Positions::left_padded(&[long.len(), short.len()]);
        let mut padded = vec![0usize; long.len() - short.len()];
        padded.extend_from_slice(short);
        let batch: Vec<i32> = long.iter().chain(&padded).map(|&t| t as i32).collect();
        let tokens = Tensor::<2, Int>::from_data(TensorData::new(batch, [2, long.len()]), &device);
        let mut caches = model.new_caches(2, long.len());
        let out = host_f32(model.forward(tokens, &positions, &mut caches, false));
        let vocab = model.arch.vocab_size;
        for (row, alone) in [long, short].iter().enumerate() {
            let want = model_logits(&model, alone, alone.len(), AttentionKernel::Host);
            let last = want.last().expect("logits");
            let got = &out[row * vocab..(row + 1) * vocab];
            let delta = max_apart(got, last);
            assert!(delta < 1e-5, "{name} row {row}: {delta:e}");
        }
    }
}

/// With one layer and a window of 3, the last position's logits depend on the tokens at
/// distances 0..=2 and not on the one at distance 3 (`q − window < k`).
#[test]
fn a_window_sees_distance_window_minus_one_and_not_window() {
    let mut a = base_arch(8);
    a.n_layers = 1;
    a.windows = vec![Some(3)];
    let host = random_model(a, Extras::default(), 9);
    let model = Llama::from_host(&host, DType::F32, &Device::flex()).expect("builds");
    let last =
        |tokens: &[usize]| model_logits(&model, tokens, tokens.len(), AttentionKernel::Host).pop().expect("logits");
    let base = [5usize, 6, 7, 8, 9];
    let mut far = base;
    far[1] = 40; // distance 3 from the last position
    let mut near = base;
    near[2] = 40; // distance 2
    assert_eq!(last(&base), last(&far), "a key `window` positions back is not visible");
    assert_ne!(last(&base), last(&near), "a key `window − 1` positions back is visible");
    // The full-attention model sees the far token.
    let mut full = host.clone();
    full.arch.windows = Vec::new();
    let full = Llama::from_host(&full, DType::F32, &Device::flex()).expect("builds");
    let last_full = |tokens: &[usize]| model_logits(&full, tokens, 2, AttentionKernel::Host).pop().expect("logits");
    assert_ne!(last_full(&base), last_full(&far));
}

#[test]
fn final_logits_stay_within_the_soft_cap() {
    let mut host = gemma2();
    host.arch.final_logit_softcap = Some(0.5);
    let model = Llama::from_host(&host, DType::F32, &Device::flex()).expect("builds");
    let logits = model_logits(&model, &TOKENS, TOKENS.len(), AttentionKernel::Host);
    let max = logits.iter().flatten().fold(0.0f32, |m, v| m.max(v.abs()));
    assert!(max <= 0.5 && max > 0.3, "{max}");
}

/// YaRN's inverse frequencies for the tiny gpt-oss config (head_dim 32, θ 150000, factor 32,
/// β 32/1, L0 4096, truncate false) against `arch-spec.md` §8's table (its float64 column).
#[test]
fn yarn_inv_freq_matches_the_spec_table() {
    let want = [
        1.0,
        4.7478205548e-01,
        2.2541800020e-01,
        1.0702442148e-01,
        5.0813274815e-02,
        1.9335001127e-02,
        6.7949594897e-03,
        2.0937923790e-03,
        4.5648391922e-04,
        3.8308812374e-05,
        1.8188336682e-05,
        8.6354958754e-06,
        4.0999784818e-06,
        1.9465962110e-06,
        9.2420895024e-07,
        4.3879782509e-07,
    ];
    let rope = crate::Rope::scaled(32, 150000.0, Some(&yarn_tiny_gpt_oss())).expect("valid");
    assert_eq!(rope.pairs(), 16);
    for (i, (&got, want)) in rope.inv_freq().iter().zip(want).enumerate() {
        assert!((f64::from(got) - want).abs() <= 1e-6 * want, "pair {i}: {got:e} vs {want:e}");
    }
    assert_eq!(rope.attention_factor(), 1.346_573_6);
}

/// Partial rotary: the first 12 of 16 dimensions of each head rotate, the last 4 pass through
/// bit for bit; the rotated part is whole-head RoPE over 12 dimensions.
#[test]
fn partial_rotary_leaves_the_tail_unchanged() {
    let device = Device::flex();
    let partial = crate::Rope::new(12, 10000.0);
    let mut r = Lcg(11);
    let (b, s, h, hd) = (1, 3, 2, 16);
    let x: Vec<f32> = (0..b * s * h * hd).map(|_| r.next(1.0)).collect();
    let positions = vec![vec![0, 5, 9]];
    let (cos, sin) = partial.tables(&positions, DType::F32, &device);
    let swap = partial.swap_index(&device);
    let y = host_f32(partial.apply(upload(&x, [b, s, h, hd], DType::F32, &device), &cos, &sin, &swap));
    let heads: Vec<f32> = x.chunks(hd).flat_map(|c| c[..12].to_vec()).collect();
    let rotated = host_f32(partial.apply(upload(&heads, [b, s, h, 12], DType::F32, &device), &cos, &sin, &swap));
    for (i, (yh, xh)) in y.chunks(hd).zip(x.chunks(hd)).enumerate() {
        assert_eq!(&yh[12..], &xh[12..], "head {i}: the tail passes through");
        assert_eq!(&yh[..12], &rotated[i * 12..(i + 1) * 12], "head {i}: the rotated part");
    }
    assert_ne!(&y[16 * 2..16 * 2 + 12], &x[16 * 2..16 * 2 + 12], "position 5 rotates");
}

/// An architecture with experts over dense weights is refused, naming the layer and the
/// mixture of experts (the experts themselves are `moe.rs`'s tests).
#[test]
fn experts_missing_from_the_weights_are_refused_by_name() {
    let mut host = qwen3();
    host.arch.moe = Some(qdrift_weights::MoeSpec {
        n_experts: 2,
        top_k: 1,
        expert_hidden: 8,
        routing: qdrift_weights::Routing::SoftmaxTopK { renormalize: true },
        dense_layers: Vec::new(),
        shared_expert_hidden: None,
    });
    let e = Llama::from_host(&host, DType::F32, &Device::flex()).expect_err("refused");
    assert!(
        e.to_string().contains("layer 0 has a dense feed-forward layer")
            && e.to_string().contains("a mixture of experts"),
        "{e}"
    );
}
