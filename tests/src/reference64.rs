//! An independent float64 forward pass of the decoders `qdrift_load::ModelArch` describes, written
//! from the definitions (`transformers` 5.25's modeling files, cited per function). It shares no
//! code with `qdrift-model`; what the model computes in f32 or f16 is checked against it, and it
//! is checked against `transformers`' own float64 goldens (`tests/tests/tiny_arch.rs`).
//!
//! One block, in order (`Qwen3DecoderLayer`, `Gemma3DecoderLayer`, `GptOssDecoderLayer`):
//! - RMSNorm as `x̂·w` or `x̂·(1+w)` (`Gemma3RMSNorm`);
//! - q/k/v projections with biases, per-head q/k RMSNorm (`Qwen3Attention`), then RoPE on the
//!   first `rotary_dim` dimensions of each head, pairs `(2i, 2i+1)` (the interleaved layout of
//!   `qdrift_weights`): plain, Llama 3.1's bands, per-pair divisors, linear or YaRN, with YaRN's
//!   `attention_factor` on cos and sin, and each layer's own θ (`ModelArch::layer_rope`);
//! - no RoPE on the NoPE layers (`no_rope_layers`, SmolLM3 and Llama 4); Llama 4's weightless L2
//!   norm of q and k after RoPE on the other layers (`Llama4TextL2Norm`) and its attention
//!   temperature on the NoPE layers' queries (`attn_temperature_tuning`);
//! - grouped-query causal attention, within the layer's chunk (`chunked_overlay`) or sliding
//!   window (keys at distance `< window`, `sliding_window_overlay`), scores scaled by `attn_scale` or `head_dim^-½`,
//!   soft-capped (`Gemma2Attention`), with a learned sink logit per head in the softmax's
//!   denominator (`GptOssAttention`'s `eager_attention_forward`);
//! - the output projection with its bias, a post-attention norm (Gemma's sandwich norms);
//! - the FFN: gated SwiGLU, GELU-tanh (`GELUTanh`) or clamped SwiGLU
//!   (`GptOssExperts._apply_gate`) with biases; or a mixture of experts whose router
//!   (`Qwen3MoeTopKRouter`, `MixtralTopKRouter`, `GptOssTopKRouter`) picks the `top_k` largest
//!   logits (ties to the lower expert index) and weighs them by [`qdrift_load::Routing`],
//!   plus Qwen2-MoE's shared expert scaled by `σ(shared_expert_gate · x)`
//!   (`Qwen2MoeSparseMoeBlock`); Llama 4's router scaling each chosen expert's input by `σ(logit)`
//!   and its ungated shared expert (`Llama4TextMoe`); GLM-4.5's and DeepSeek-V3's group-limited
//!   sigmoid routing (`Glm4MoeTopkRouter`, [`Routing::GroupedSigmoid`]); a post-FFN norm.
//!
//! The model scales the embeddings (`Gemma3TextScaledWordEmbedding`) and soft-caps the final
//! logits (`Gemma2ForCausalLM.forward`).
//!
//! [`Rounding`] adds a variant's run-time roundings where `qdrift-model` applies them: the input
//! of every linear layer (q/k/v, o, gate/up, down, and each expert's; not the router's; per token,
//! or per tensor over the prompt and then per token) and every key (after its q/k norm and RoPE)
//! and value as it enters the cache. Each rounding is the host definition (`round_host` of
//! `qdrift_quantize`) applied to the f64 values cast to f32, then cast back. With [`Sites`], the
//! int8 roundings within [`AMBIGUOUS`] of a boundary (where the model's f32 value may land on
//! either side) are recorded, and chosen ones rounded to the other neighbour.

use std::cell::RefCell;

use qdrift_load::{Activation, Experts, HostModel, HostTensor, LayerWeights, Mlp, NormStyle, RopeScaling, Routing};
use qdrift_model::InputSite;
use qdrift_quantize::{ActivationQuant, ActivationScale, DynamicFormat, KvQuant};

/// Distance from an int8 rounding boundary, `|y − (n + ½)| / max(|y|, 1)` with `y = x/s` on the
/// integer grid, under which the model's f32 value may round to either neighbour: its `x` and
/// `s` come out of every earlier layer computed in f32, each a few ulps (1.2e-7 apiece) from
/// the f64 values, and where f32 sums in another order (a GEMM of 7 rows, not 1) the side can
/// change too.
pub const AMBIGUOUS: f64 = 1e-6;

/// An int8-rounded value the f64 pass finds within [`AMBIGUOUS`] of a rounding boundary.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Site {
    /// Its ordinal among the int8-rounded values of the pass, in the pass's (value-independent)
    /// order: layers, then keys/values and linear inputs as they are rounded, element by element.
    pub ordinal: usize,
    /// The position (token) it belongs to.
    pub position: usize,
    /// Its distance from the boundary, as [`AMBIGUOUS`] measures it.
    pub distance: f64,
}

/// The int8 rounding sites of one pass: which values to round to the other neighbour (as the
/// f32 model may have, one step of the scale away), and the ambiguous values met.
#[derive(Debug, Default)]
pub struct Sites {
    next: usize,
    /// Ordinals of the values rounded to the other neighbour.
    pub flipped: Vec<usize>,
    /// The ambiguous values met, in order.
    pub ambiguous: Vec<Site>,
}

impl Sites {
    /// Sites flipping `flipped`.
    pub fn flipping(flipped: Vec<usize>) -> Sites {
        Sites { next: 0, flipped, ambiguous: Vec::new() }
    }

    /// Visits `rounded` (int8-rounded from `orig` with one scale per `group` values; value `i`
    /// at position `position(i)`): records the ambiguous ones and moves the flipped ones one
    /// step of their scale to the other side of their f64 value.
    fn visit(&mut self, orig: &[f64], rounded: &mut [f64], group: usize, position: impl Fn(usize) -> usize) {
        for (g, (xs, rs)) in orig.chunks(group).zip(rounded.chunks_mut(group)).enumerate() {
            let amax = xs.iter().fold(0.0f32, |m, &v| m.max((v as f32).abs()));
            let s = amax / 127.0;
            for (j, (&x, r)) in xs.iter().zip(rs.iter_mut()).enumerate() {
                let ordinal = self.next;
                self.next += 1;
                if s == 0.0 {
                    continue;
                }
                let y = x / f64::from(s);
                let distance = (y.abs().fract() - 0.5).abs() / y.abs().max(1.0);
                if distance < AMBIGUOUS {
                    self.ambiguous.push(Site { ordinal, position: position(g * group + j), distance });
                }
                if self.flipped.contains(&ordinal) {
                    let q = (*r / f64::from(s)).round();
                    let step = if y > q { 1.0 } else { -1.0 };
                    let other = (q + step).clamp(-127.0, 127.0) as f32;
                    *r = f64::from(other * s);
                }
            }
        }
    }
}

/// The run-time roundings of a variant (none by default).
#[derive(Debug, Clone, Copy, Default)]
pub struct Rounding<'a> {
    /// Activation quantization of every linear layer's input.
    pub activations: Option<ActivationQuant>,
    /// Rounding of every cached key and value.
    pub kv_cache: Option<KvQuant>,
    /// Positions that form the prompt: a per-tensor activation scale covers them together (the
    /// prompt pass); every later position is scaled alone.
    pub prompt: usize,
    /// Where given, the int8 roundings' sites are recorded and flipped there ([`Sites`]).
    pub sites: Option<&'a RefCell<Sites>>,
    /// Where given, every mixture-of-experts layer appends the experts it routed each position
    /// to: one entry per such layer, in block order, `[position][rank]`, the weightiest first.
    pub routes: Option<&'a RefCell<Vec<Vec<Vec<usize>>>>>,
    /// The compute dtype's rounding of every operation's output ([`Compute`]).
    pub compute: Compute,
    /// Per layer, per [`InputSite`]: the static global input scales of NVFP4 activations
    /// (`Llama::calibrate_inputs`' record through `InputAmax::global_scales`); none by default.
    pub input_scales: Option<&'a [[f32; 4]]>,
    /// The layer whose inputs are rounded (set by the pass for each block).
    pub layer: usize,
}

/// Where a compute dtype rounds: nowhere (f64 throughout), or where `transformers`' bf16
/// inference rounds to bf16 (eager attention, PyTorch's CPU ops), each rounding the f64 value
/// through f32 (what an f32 accumulation rounded once gives):
/// 1. RMSNorm: `x̂ = x / rms(x)` rounded, then `w · x̂` rounded (`LlamaRMSNorm`:
///    `self.weight * hidden_states.to(input_dtype)`);
/// 2. every linear layer's output (`F.linear`: f32 accumulation, one rounding), and its bias sum
///    rounded again;
/// 3. RoPE: cos and sin rounded, then `q·cos`, `rotate_half(q)·sin` and their sum, each rounded
///    (`apply_rotary_pos_emb`);
/// 4. attention: `q·kᵀ` rounded, times the scale rounded, the softmax computed in f32 and
///    rounded (`softmax(..., dtype=float32).to(query.dtype)`), `p·v` rounded;
/// 5. SwiGLU: `silu(g)` rounded (computed in f32), `silu(g)·u` rounded;
/// 6. every residual sum rounded;
/// 7. the logits rounded (the output layer is a bf16 `nn.Linear`; they are cast to f32 after).
///
/// Only Llama's block (RMSNorm `x̂·w`, optional q/k norms, SwiGLU, no soft caps, sinks, experts,
/// sandwich norms or embedding scale) is written here with these roundings; [`naive_logits`]
/// refuses the rest under [`Compute::Bf16`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Compute {
    /// No rounding: f64 throughout.
    #[default]
    F64,
    /// bf16 at every point listed above (round-to-nearest-even).
    Bf16,
}

impl Compute {
    /// `v` rounded as this compute dtype stores an operation's output.
    pub fn round(self, v: f64) -> f64 {
        match self {
            Compute::F64 => v,
            Compute::Bf16 => f64::from(half::bf16::from_f32(v as f32).to_f32()),
        }
    }

    fn round_all(self, xs: &mut [f64]) {
        if self != Compute::F64 {
            xs.iter_mut().for_each(|v| *v = self.round(*v));
        }
    }
}

impl Rounding<'_> {
    /// A linear layer's inputs at `site`, one row per position (rows `0, 1, …`).
    fn inputs(&self, rows: &mut [Vec<f64>], site: InputSite) {
        let positions: Vec<usize> = (0..rows.len()).collect();
        self.inputs_at(rows, &positions, site);
    }

    /// A linear layer's inputs at `positions` (ascending; an expert's tokens): a per-tensor scale
    /// covers the rows of the prompt together; `site` picks the layer's NVFP4 global scale.
    fn inputs_at(&self, rows: &mut [Vec<f64>], positions: &[usize], site: InputSite) {
        let Some(q) = self.activations else { return };
        let global = self.input_scales.and_then(|s| s.get(self.layer)).map(|l| l[site as usize]);
        let cols = rows.first().map_or(1, Vec::len);
        let split = if q.scale == ActivationScale::Tensor {
            positions.iter().take_while(|&&p| p < self.prompt).count()
        } else {
            0
        };
        let int8 = q.format == DynamicFormat::Int8;
        let (prompt, rest) = rows.split_at_mut(split);
        if !prompt.is_empty() {
            let orig: Vec<f64> = prompt.concat();
            let mut flat = orig.clone();
            through_f32(&mut flat, |v| q.round_host_global(v, cols, global));
            if let (Some(sites), true) = (self.sites, int8) {
                sites.borrow_mut().visit(&orig, &mut flat, orig.len(), |i| positions[i / cols]);
            }
            prompt.iter_mut().zip(flat.chunks(cols)).for_each(|(r, f)| r.copy_from_slice(f));
        }
        // After the prompt pass a per-tensor scale covers one token; other scales are per token
        // (or per token and group) already.
        let later = match q.scale {
            ActivationScale::Tensor => ActivationQuant { scale: ActivationScale::Token, ..q },
            _ => q,
        };
        let group = match later.scale {
            ActivationScale::TokenGroup(g) => g,
            _ => cols,
        };
        for (r, &pos) in rest.iter_mut().zip(&positions[split..]) {
            let orig = r.clone();
            through_f32(r, |v| later.round_host_global(v, cols, global));
            if let (Some(sites), true) = (self.sites, int8) {
                sites.borrow_mut().visit(&orig, r, group, |_| pos);
            }
        }
    }

    /// Position `pos`'s keys or values, `[kv_heads * head_dim]`.
    fn cached(&self, x: &mut [f64], head_dim: usize, pos: usize) {
        if let Some(q) = self.kv_cache {
            let orig = x.to_vec();
            through_f32(x, |v| q.round_host(v, head_dim).expect("KV rows of whole blocks"));
            if let (Some(sites), KvQuant::Int8) = (self.sites, q) {
                sites.borrow_mut().visit(&orig, x, head_dim, |_| pos);
            }
        }
    }
}

/// Rounds f64 values through f32 with a host definition.
fn through_f32(x: &mut [f64], round: impl FnOnce(&mut [f32])) {
    let mut v: Vec<f32> = x.iter().map(|&a| a as f32).collect();
    round(&mut v);
    x.iter_mut().zip(v).for_each(|(a, b)| *a = f64::from(b));
}

/// `w · x` for a `[out, in]` host weight, plus the bias.
fn matvec(w: &HostTensor, b: Option<&HostTensor>, x: &[f64]) -> Vec<f64> {
    let (out, inp) = (w.shape[0], w.shape[1]);
    assert_eq!(x.len(), inp, "input width of a [{out}, {inp}] weight");
    (0..out)
        .map(|r| {
            let dot: f64 = (0..inp).map(|c| f64::from(w.data[r * inp + c]) * x[c]).sum();
            dot + b.map_or(0.0, |b| f64::from(b.data[r]))
        })
        .collect()
}

/// `w · x + b` for every row, the product and then the sum with the bias rounded by `c`.
fn linear(w: &HostTensor, b: Option<&HostTensor>, xs: &[Vec<f64>], c: Compute) -> Vec<Vec<f64>> {
    xs.iter()
        .map(|x| {
            let mut y = matvec(w, None, x);
            c.round_all(&mut y);
            if let Some(b) = b {
                y.iter_mut().zip(&b.data).for_each(|(y, &b)| *y = c.round(*y + f64::from(b)));
            }
            y
        })
        .collect()
}

/// RMSNorm over `x` (`Qwen3RMSNorm`; `Gemma3RMSNorm` with [`NormStyle::OnePlusWeight`]), `x̂`
/// and `x̂ · w` rounded by `c`.
fn rms_norm(x: &[f64], w: &HostTensor, eps: f64, style: NormStyle, c: Compute) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + eps).sqrt();
    let gain = |g: f32| match style {
        NormStyle::Weight => f64::from(g),
        NormStyle::OnePlusWeight => 1.0 + f64::from(g),
    };
    x.iter().zip(&w.data).map(|(v, &g)| c.round(c.round(v * inv) * gain(g))).collect()
}

/// `cap · tanh(x / cap)`.
fn soft_cap(x: f64, cap: Option<f32>) -> f64 {
    cap.map_or(x, |c| {
        let c = f64::from(c);
        c * (x / c).tanh()
    })
}

/// One layer's RoPE: the inverse frequency of each rotated pair and the factor cos and sin are
/// multiplied by.
struct Rope {
    inv_freq: Vec<f64>,
    attention_factor: f64,
}

impl Rope {
    /// Layer `layer`'s RoPE over the `rotary_dim` first dimensions of a head
    /// (`modeling_rope_utils.py`: `compute_default_rope_parameters`,
    /// `_compute_llama3_parameters`, `_compute_linear_scaling_rope_parameters`,
    /// `_compute_yarn_parameters`, `_compute_longrope_parameters`; per-pair divisors are
    /// llama.cpp's `freq_factors`) for a sequence of `seq_len` positions: LongRoPE divides by its
    /// long factors when `seq_len` exceeds `original_max_position_embeddings`
    /// (`dynamic_rope_update`'s `longrope_frequency_update`: `max(position_ids) + 1`), by its
    /// short ones otherwise.
    fn for_layer(m: &HostModel, layer: usize, seq_len: usize) -> Rope {
        let d = m.arch.rotary_dim();
        let (theta, scaling) = m.arch.layer_rope(layer);
        let theta = f64::from(theta);
        let plain = (0..d / 2).map(|i| theta.powf(-((2 * i) as f64) / d as f64));
        let (inv_freq, attention_factor) = match scaling {
            None => (plain.collect(), 1.0),
            Some(RopeScaling::Linear { factor }) => (plain.map(|f| f / f64::from(*factor)).collect(), 1.0),
            Some(RopeScaling::FreqFactors { factors }) => {
                (plain.zip(factors).map(|(f, &q)| f / f64::from(q)).collect(), 1.0)
            }
            Some(RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            }) => {
                let (factor, low, high) =
                    (f64::from(*factor), f64::from(*low_freq_factor), f64::from(*high_freq_factor));
                let old = *original_max_position_embeddings as f64;
                let band = |f: f64| {
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    if wavelen < old / high {
                        f
                    } else if wavelen > old / low {
                        f / factor
                    } else {
                        let smooth = (old / wavelen - low) / (high - low);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                };
                (plain.map(band).collect(), 1.0)
            }
            Some(RopeScaling::Yarn {
                factor,
                beta_fast,
                beta_slow,
                original_max_position_embeddings,
                truncate,
                attention_factor,
            }) => {
                let ramp = yarn_ramp(d, theta, *original_max_position_embeddings, [*beta_fast, *beta_slow], *truncate);
                let factor = f64::from(*factor);
                let inv = plain.zip(ramp).map(|(f, r)| f / factor * r + f * (1.0 - r)).collect();
                (inv, f64::from(*attention_factor))
            }
            Some(RopeScaling::LongRope {
                short_factor,
                long_factor,
                original_max_position_embeddings,
                attention_factor,
            }) => {
                let ext = if seq_len > *original_max_position_embeddings { long_factor } else { short_factor };
                // `1.0 / (ext_factors * base**inv_freq_shape)`.
                (plain.zip(ext).map(|(f, &e)| f / f64::from(e)).collect(), f64::from(*attention_factor))
            }
        };
        Rope { inv_freq, attention_factor }
    }

    /// Rotates pairs `(2i, 2i+1)` of every `head_dim`-wide head of `x` by `pos · inv_freq[i]`,
    /// cos and sin scaled by the attention factor; dimensions past the pairs are unchanged.
    /// `r` rounds cos, sin, each product and each sum.
    fn apply(&self, x: &mut [f64], head_dim: usize, pos: usize, r: Compute) {
        for head in x.chunks_mut(head_dim) {
            for (i, f) in self.inv_freq.iter().enumerate() {
                let (s, c) = (pos as f64 * f).sin_cos();
                let (s, c) = (r.round(s * self.attention_factor), r.round(c * self.attention_factor));
                let (a, b) = (head[2 * i], head[2 * i + 1]);
                head[2 * i] = r.round(r.round(a * c) - r.round(b * s));
                head[2 * i + 1] = r.round(r.round(a * s) + r.round(b * c));
            }
        }
    }
}

/// YaRN's ramp over the `d / 2` frequencies of `d` rotated dimensions (`_compute_yarn_parameters`:
/// `find_correction_range`, `linear_ramp_factor`): 0 keeps a frequency, 1 divides it by the
/// factor.
fn yarn_ramp(d: usize, theta: f64, original: usize, [beta_fast, beta_slow]: [f32; 2], truncate: bool) -> Vec<f64> {
    let corr_dim = |beta: f32| {
        d as f64 * (original as f64 / (2.0 * std::f64::consts::PI * f64::from(beta))).ln() / (2.0 * theta.ln())
    };
    let (mut low, mut high) = (corr_dim(beta_fast), corr_dim(beta_slow));
    if truncate {
        (low, high) = (low.floor(), high.ceil());
    }
    let (low, mut high) = (low.max(0.0), high.min(d as f64 - 1.0));
    if low == high {
        high += 0.001;
    }
    (0..d / 2).map(|i| ((i as f64 - low) / (high - low)).clamp(0.0, 1.0)).collect()
}

/// The gated activation `act(g, u)` ([`Activation`]); under `c`, SwiGLU's `silu(g)` and the
/// product rounded (the other activations are not written with roundings).
fn activate(activation: Activation, g: f64, u: f64, c: Compute) -> f64 {
    let sigmoid = |x: f64| 1.0 / (1.0 + (-x).exp());
    match activation {
        Activation::SwiGlu => c.round(c.round(g * sigmoid(g)) * u),
        Activation::GeluTanh => {
            let inner = (2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g);
            0.5 * g * (1.0 + inner.tanh()) * u
        }
        Activation::ClampedSwiGlu { alpha, limit } => {
            let limit = f64::from(limit);
            let (g, u) = (g.min(limit), u.clamp(-limit, limit));
            (u + 1.0) * g * sigmoid(f64::from(alpha) * g)
        }
    }
}

/// Logits `[position][vocab]` of one sequence, every position, with `rounding` applied.
pub fn naive_logits(m: &HostModel, tokens: &[u32], rounding: &Rounding) -> Vec<Vec<f64>> {
    let a = &m.arch;
    a.validate().expect("a valid architecture");
    let c = rounding.compute;
    if c != Compute::F64 {
        let b = &a.block;
        let llama = b.norm == NormStyle::Weight
            && b.activation == Activation::SwiGlu
            && !b.sandwich_norms
            && !b.sinks
            && b.attn_softcap.is_none()
            && a.final_logit_softcap.is_none()
            && a.embedding_scale.is_none()
            && a.moe.is_none();
        assert!(llama, "the {c:?} roundings are written for Llama's block only (Compute)");
    }
    let (dim, eps) = (a.dim, f64::from(a.norm_eps));
    let scale = a.embedding_scale.map_or(1.0, f64::from);
    let emb = &m.token_embedding;
    let mut xs: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&t| emb.data[t as usize * dim..][..dim].iter().map(|&v| f64::from(v) * scale).collect())
        .collect();
    for (i, l) in m.layers.iter().enumerate() {
        let attended = attention(m, i, l, &xs, rounding);
        add(&mut xs, &attended, c);
        let ffn_out = ffn(m, i, l, &xs, rounding);
        add(&mut xs, &ffn_out, c);
    }
    let style = a.block.norm;
    xs.iter()
        .map(|x| {
            let logits = matvec(m.output_weight(), None, &rms_norm(x, &m.final_norm, eps, style, c));
            logits.into_iter().map(|v| soft_cap(c.round(v), a.final_logit_softcap)).collect()
        })
        .collect()
}

/// `xs += ys`, row by row, each sum rounded by `c`.
fn add(xs: &mut [Vec<f64>], ys: &[Vec<f64>], c: Compute) {
    for (x, y) in xs.iter_mut().zip(ys) {
        x.iter_mut().zip(y).for_each(|(a, b)| *a = c.round(*a + b));
    }
}

/// RMS-normalizes every `head_dim`-wide head of `x` with the shared weight `w` (`q_norm`,
/// `k_norm`).
fn norm_heads(x: &mut [f64], w: Option<&HostTensor>, eps: f64, style: NormStyle, c: Compute) {
    let w = w.expect("a q/k norm weight for qk_norm");
    let hd = w.data.len();
    for head in x.chunks_mut(hd) {
        let normed = rms_norm(head, w, eps, style, c);
        head.copy_from_slice(&normed);
    }
}

/// Llama 4's weightless L2 norm of every `head_dim`-wide head of `x` (`Llama4TextL2Norm`:
/// `x · rsqrt(mean(x²) + eps)`).
fn l2_norm_heads(x: &mut [f64], head_dim: usize, eps: f64) {
    for head in x.chunks_mut(head_dim) {
        let ms = head.iter().map(|v| v * v).sum::<f64>() / head_dim as f64;
        let r = 1.0 / (ms + eps).sqrt();
        head.iter_mut().for_each(|v| *v *= r);
    }
}

/// The attention sub-block of layer `li`: what it adds to the residual stream, one row per
/// position.
fn attention(m: &HostModel, li: usize, l: &LayerWeights, xs: &[Vec<f64>], rounding: &Rounding) -> Vec<Vec<f64>> {
    let a = &m.arch;
    let (hd, heads, kv_heads) = (a.head_dim(), a.n_heads, a.n_kv_heads);
    let (eps, style) = (f64::from(a.norm_eps), a.block.norm);
    let rope = Rope::for_layer(m, li, xs.len());
    let rounding = &Rounding { layer: li, ..*rounding };
    let c = rounding.compute;
    let mut xn: Vec<Vec<f64>> = xs.iter().map(|x| rms_norm(x, &l.attn_norm, eps, style, c)).collect();
    rounding.inputs(&mut xn, InputSite::Qkv);
    let mut qs = linear(&l.wq, l.bq.as_ref(), &xn, c);
    let mut ks = linear(&l.wk, l.bk.as_ref(), &xn, c);
    let mut vs = linear(&l.wv, l.bv.as_ref(), &xn, c);
    for (pos, ((q, k), v)) in qs.iter_mut().zip(&mut ks).zip(&mut vs).enumerate() {
        if a.block.qk_norm {
            norm_heads(q, l.q_norm.as_ref(), eps, style, c);
            norm_heads(k, l.k_norm.as_ref(), eps, style, c);
        }
        // SmolLM3 and Llama 4: `if self.use_rope` (`no_rope_layers[layer_idx]`, 1 = RoPE).
        if a.uses_rope(li) {
            rope.apply(q, hd, pos, c);
            rope.apply(k, hd, pos, c);
        }
        // Llama 4: `Llama4TextL2Norm` of q and k after RoPE, on the RoPE layers only.
        if let Some(eps) = a.layer_attention.qk_l2_norm.filter(|_| a.uses_rope(li)) {
            l2_norm_heads(q, hd, f64::from(eps));
            l2_norm_heads(k, hd, f64::from(eps));
        }
        // Llama 4's temperature tuning on the NoPE layers, its factor computed in f32 as
        // `torch.log1p(torch.floor((positions.float() + 1.0) / floor_scale)) * attn_scale + 1.0`.
        if let Some(temp) = a.layer_attention.temperature.filter(|_| !a.uses_rope(li)) {
            let floored = ((pos as f32 + 1.0) / temp.floor_scale).floor();
            let factor = f64::from(floored.ln_1p() * temp.attn_scale + 1.0);
            q.iter_mut().for_each(|v| *v *= factor);
        }
        rounding.cached(k, hd, pos);
        rounding.cached(v, hd, pos);
    }
    let scale = a.block.attn_scale.map_or(1.0 / (hd as f64).sqrt(), f64::from);
    let window = a.window(li);
    // Llama 4's `chunked_overlay`: keys in the query's own chunk of positions.
    let chunk = a.layer_attention.chunks.get(li).copied().flatten();
    let mut attended: Vec<Vec<f64>> = (0..xs.len())
        .map(|t| {
            let first = window.map_or(0, |w| (t + 1).saturating_sub(w));
            let first = chunk.map_or(first, |ch| first.max(t / ch * ch));
            let mut out = vec![0.0; heads * hd];
            for h in 0..heads {
                let kvh = h / (heads / kv_heads);
                let q = &qs[t][h * hd..][..hd];
                let scores: Vec<f64> = (first..=t)
                    .map(|s| {
                        let dot = q.iter().zip(&ks[s][kvh * hd..][..hd]).map(|(a, b)| a * b).sum::<f64>();
                        soft_cap(c.round(c.round(dot) * scale), a.block.attn_softcap)
                    })
                    .collect();
                let sink = a.block.sinks.then(|| f64::from(l.sinks.as_ref().expect("sink logits").data[h]));
                let max = scores.iter().chain(&sink).copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let z: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - max).exp());
                for (s, w) in (first..=t).zip(&e) {
                    let p = c.round(w / z);
                    for j in 0..hd {
                        out[h * hd + j] += p * vs[s][kvh * hd + j];
                    }
                }
            }
            c.round_all(&mut out);
            out
        })
        .collect();
    rounding.inputs(&mut attended, InputSite::O);
    let out = linear(&l.wo, l.bo.as_ref(), &attended, c);
    post_norm(out, l.post_attn_norm.as_ref(), a.block.sandwich_norms, eps, style)
}

/// Gemma's post-attention or post-FFN norm, when the block has sandwich norms.
fn post_norm(ys: Vec<Vec<f64>>, w: Option<&HostTensor>, sandwich: bool, eps: f64, style: NormStyle) -> Vec<Vec<f64>> {
    if !sandwich {
        return ys;
    }
    let w = w.expect("a post norm weight for sandwich norms");
    ys.iter().map(|y| rms_norm(y, w, eps, style, Compute::F64)).collect()
}

/// The FFN sub-block of layer `li`: what it adds to the residual stream, one row per position.
fn ffn(m: &HostModel, li: usize, l: &LayerWeights, xs: &[Vec<f64>], rounding: &Rounding) -> Vec<Vec<f64>> {
    let a = &m.arch;
    let rounding = &Rounding { layer: li, ..*rounding };
    let (eps, style) = (f64::from(a.norm_eps), a.block.norm);
    let xn: Vec<Vec<f64>> = xs.iter().map(|x| rms_norm(x, &l.ffn_norm, eps, style, rounding.compute)).collect();
    let positions: Vec<usize> = (0..xs.len()).collect();
    assert_eq!(a.has_experts(li), l.experts().is_some(), "layer {li}: experts as the architecture says");
    let out = match l.mlp() {
        Some(mlp) => {
            let mut xr = xn;
            rounding.inputs(&mut xr, InputSite::Up);
            gated(mlp, a.block.activation, &xr, &positions, rounding)
        }
        None => {
            let experts = l.experts().expect("a dense FFN or experts");
            let routing = a.moe.as_ref().expect("an MoeSpec for a layer with experts");
            mixture(experts, routing.routing, routing.top_k, a.block.activation, &xn, rounding)
        }
    };
    post_norm(out, l.post_ffn_norm.as_ref(), a.block.sandwich_norms, eps, style)
}

/// `act(gate·x + b_g, up·x + b_u)` of each row of `xs`.
fn gated_hidden(mlp: &Mlp, act: Activation, xs: &[Vec<f64>], c: Compute) -> Vec<Vec<f64>> {
    let g = linear(&mlp.gate, mlp.gate_bias.as_ref(), xs, c);
    let u = linear(&mlp.up, mlp.up_bias.as_ref(), xs, c);
    g.iter().zip(&u).map(|(g, u)| g.iter().zip(u).map(|(&g, &u)| activate(act, g, u, c)).collect()).collect()
}

/// `down(act(gate·x + b_g, up·x + b_u)) + b_d` of rows `xs` (already rounded) at `positions`; the
/// down projection's input is rounded over these rows.
fn gated(mlp: &Mlp, act: Activation, xs: &[Vec<f64>], positions: &[usize], rounding: &Rounding) -> Vec<Vec<f64>> {
    let mut h = gated_hidden(mlp, act, xs, rounding.compute);
    rounding.inputs_at(&mut h, positions, InputSite::Down);
    linear(&mlp.down, mlp.down_bias.as_ref(), &h, rounding.compute)
}

/// The experts each row is routed to and their weights (`Qwen3MoeTopKRouter`,
/// `MixtralTopKRouter`, `GptOssTopKRouter`, `Llama4Router`): the `top_k` largest router logits,
/// ties to the lower expert index; `Glm4MoeTopkRouter`'s group-limited choice for
/// [`Routing::GroupedSigmoid`], with `bias` its `e_score_correction_bias` (empty: none).
///
/// # Shapes
/// - `logits`, `bias`: `[n_experts]`; returns `top_k` `(expert, weight)` pairs, in the order of
///   choice.
pub fn route(logits: &[f64], bias: &[f64], routing: Routing, top_k: usize) -> Vec<(usize, f64)> {
    if let Routing::GroupedSigmoid { n_group, topk_group, renormalize, scale } = routing {
        return grouped_route(logits, bias, [n_group, topk_group, top_k], renormalize, f64::from(scale));
    }
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&i, &j| logits[j].total_cmp(&logits[i]).then(i.cmp(&j)));
    order.truncate(top_k);
    let softmax_over = |idx: &[usize]| {
        let max = idx.iter().map(|&i| logits[i]).fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = idx.iter().map(|&i| (logits[i] - max).exp()).sum();
        idx.iter().map(|&i| (logits[i] - max).exp() / z).collect::<Vec<f64>>()
    };
    let weights = match routing {
        Routing::TopKSoftmax => softmax_over(&order),
        Routing::SoftmaxTopK { renormalize } => {
            let all: Vec<usize> = (0..logits.len()).collect();
            let p = softmax_over(&all);
            let chosen: Vec<f64> = order.iter().map(|&i| p[i]).collect();
            let sum: f64 = chosen.iter().sum();
            chosen.iter().map(|w| if renormalize { w / sum } else { *w }).collect()
        }
        // `Llama4Router`: `sigmoid(router_scores.float())`, so σ in f32 of the f32 logit.
        Routing::SigmoidInput | Routing::GroupedSigmoid { .. } => order
            .iter()
            .map(|&i| {
                let l = logits[i] as f32;
                f64::from(1.0 / (1.0 + (-l).exp()))
            })
            .collect(),
    };
    order.into_iter().zip(weights).collect()
}

/// `Glm4MoeTopkRouter.forward` (and `DeepseekV3TopkRouter`'s): the logits in f32
/// (`F.linear(hidden.float(), weight.float())`), `s = σ(logits)`, the choice on `c = s + bias`:
/// `n_group` consecutive groups scored by the sum of their two largest `c`, the `topk_group`
/// best kept, the `top_k` largest `c` among their experts; weights `s`, over `Σ s + 1e-20` when
/// `renormalize`, times `scale` (f32 throughout, as `transformers`).
///
/// # Shapes
/// - `logits`, `bias`: `[n_experts]`; returns `top_k` `(expert, weight)` pairs.
fn grouped_route(
    logits: &[f64],
    bias: &[f64],
    [n_group, topk_group, top_k]: [usize; 3],
    renormalize: bool,
    scale: f64,
) -> Vec<(usize, f64)> {
    let n = logits.len();
    let s: Vec<f32> = logits.iter().map(|&l| 1.0 / (1.0 + (-(l as f32)).exp())).collect();
    let c: Vec<f32> = s.iter().enumerate().map(|(e, &v)| v + bias.get(e).map_or(0.0, |&b| b as f32)).collect();
    let desc = |v: &[f32]| {
        let mut idx: Vec<usize> = (0..v.len()).collect();
        idx.sort_by(|&i, &j| v[j].total_cmp(&v[i]).then(i.cmp(&j)));
        idx
    };
    let size = n / n_group;
    let group_scores: Vec<f32> = (0..n_group)
        .map(|g| {
            let part = &c[g * size..(g + 1) * size];
            desc(part).iter().take(2).map(|&i| part[i]).sum()
        })
        .collect();
    let kept: Vec<usize> = desc(&group_scores).into_iter().take(topk_group).collect();
    let masked: Vec<f32> =
        c.iter().enumerate().map(|(e, &v)| if kept.contains(&(e / size)) { v } else { f32::NEG_INFINITY }).collect();
    let chosen: Vec<usize> = desc(&masked).into_iter().take(top_k).collect();
    let sum = chosen.iter().map(|&e| s[e]).sum::<f32>() + 1e-20;
    chosen
        .into_iter()
        .map(|e| {
            let w = if renormalize { s[e] / sum } else { s[e] };
            (e, f64::from(w * scale as f32))
        })
        .collect()
}

/// A mixture of experts over rows `xn` (normalized, not yet rounded): the router reads them at
/// full precision; the experts read them rounded as any linear input. The down projections'
/// inputs are rounded as `qdrift-model`'s `MoeLayer` lays them out, every position's `top_k`
/// expert activations side by side ("slots"): a per-tensor scale covers all the slots of the
/// prompt's positions together, a per-token (or per-token-group) scale one slot, so that a
/// position's rounding never depends on which other positions an expert was given. The
/// weighted outputs are summed in ascending expert order (`Qwen3MoeExperts`' `index_add_`).
/// A shared expert (`Qwen2MoeSparseMoeBlock`) runs on every position's rounded input, its down
/// input rounded as a dense FFN's, and adds `σ(gate · x) · shared(x)` with the gate reading the
/// unrounded input, as the router.
fn mixture(
    e: &Experts,
    routing: Routing,
    top_k: usize,
    act: Activation,
    xn: &[Vec<f64>],
    rounding: &Rounding,
) -> Vec<Vec<f64>> {
    let mut xr = xn.to_vec();
    rounding.inputs(&mut xr, InputSite::Up);
    // (position, expert, weight) of every slot, position-major, experts ascending.
    let mut slots: Vec<(usize, usize, f64)> = Vec::new();
    let mut routed = Vec::with_capacity(xn.len());
    for (pos, x) in xn.iter().enumerate() {
        // A grouped router's bias biases the choice only (`e_score_correction_bias`).
        let (logit_bias, choice_bias) = if routing.biases_choice_only() {
            (None, e.router_bias.as_ref().map_or_else(Vec::new, |b| b.data.iter().map(|&v| f64::from(v)).collect()))
        } else {
            (e.router_bias.as_ref(), Vec::new())
        };
        let mut chosen = route(&matvec(&e.router, logit_bias, x), &choice_bias, routing, top_k);
        routed.push(chosen.iter().map(|&(ei, _)| ei).collect());
        chosen.sort_by_key(|&(ei, _)| ei);
        slots.extend(chosen.into_iter().map(|(ei, w)| (pos, ei, w)));
    }
    if let Some(routes) = rounding.routes {
        routes.borrow_mut().push(routed);
    }
    // `Llama4TextMoe`: `routed_in = hidden_states * router_scores`, the expert's input scaled, its
    // output added as it is.
    let scales_input = routing == Routing::SigmoidInput;
    let mut hidden: Vec<Vec<f64>> = slots
        .iter()
        .map(|&(pos, ei, w)| {
            let x: Vec<f64> = if scales_input { xr[pos].iter().map(|v| v * w).collect() } else { xr[pos].clone() };
            gated_hidden(&e.experts[ei], act, std::slice::from_ref(&x), Compute::F64).remove(0)
        })
        .collect();
    let positions: Vec<usize> = slots.iter().map(|&(pos, _, _)| pos).collect();
    rounding.inputs_at(&mut hidden, &positions, InputSite::Down);
    let mut out = vec![vec![0.0; xn.first().map_or(0, Vec::len)]; xn.len()];
    for (&(pos, ei, w), h) in slots.iter().zip(&hidden) {
        let down = &e.experts[ei];
        let y = matvec(&down.down, down.down_bias.as_ref(), h);
        let w = if scales_input { 1.0 } else { w };
        out[pos].iter_mut().zip(y).for_each(|(o, v)| *o += w * v);
    }
    if let Some(sh) = &e.shared {
        let positions: Vec<usize> = (0..xn.len()).collect();
        let ys = gated(&sh.mlp, act, &xr, &positions, rounding);
        for ((o, y), x) in out.iter_mut().zip(ys).zip(xn) {
            // Llama 4's shared expert has no gate (`[0, dim]`) and is added as it is.
            let g = if sh.gate.data.is_empty() { 1.0 } else { 1.0 / (1.0 + (-matvec(&sh.gate, None, x)[0]).exp()) };
            o.iter_mut().zip(y).for_each(|(o, v)| *o += g * v);
        }
    }
    out
}
