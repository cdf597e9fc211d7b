//! The in-memory form of a model: a decoder's description ([`ModelArch`], with its
//! [`BlockSpec`], [`LayerAttention`], [`RopeScaling`] and [`MoeSpec`]) and its f32 weights ([`HostModel`]:
//! [`HostTensor`]s, one [`LayerWeights`] per block, whose [`Ffn`] is dense or a mixture of
//! [`Experts`]).
//!
//! Every reader of `qdrift-load` produces a [`HostModel`], and every later stage (quantization,
//! the Burn model of `qdrift-model`, the tests' references) consumes one. This crate holds only
//! the types and their arithmetic, so a crate that needs them pulls no file formats, tokenizers
//! or memory maps.
//!
//! **Architecture invariant:** weights are f32 in one fixed layout whatever the source format:
//! `[out, in]` linears, q/k rows and biases in the interleaved RoPE layout (rotation pairs are
//! rows `2i`, `2i+1` of a head). A loader that cannot express a checkpoint feature in these types
//! refuses the checkpoint.
//!
//! Module floors, top first: a module imports only modules on floors below its own
//! (`cargo xtask cycles` checks it).
//!
//! | floor |
//! |---|
//! | `source.rs` |

#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};

mod source;

pub use source::{HeldModel, SourceError, WeightSource};

/// Hyper-parameters of a decoder-only transformer: the Llama block (RMSNorm, RoPE,
/// grouped-query attention, SwiGLU) and what today's families change in it, as data ([`BlockSpec`],
/// [`MoeSpec`], per-layer sliding windows, an embedding scale, a final-logit soft cap) that the
/// loaders fill in and `qdrift-model` follows. `BlockSpec::default()`, no windows and no experts is
/// Llama's block.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelArch {
    /// Architecture name as reported to users: the checkpoint's own (`llama`/`qwen2` from GGUF's
    /// `general.architecture`, `LlamaForCausalLM`, ... from `config.json`), `llama` for llama2.c
    /// checkpoints and synthetic presets (their format is in `qdrift_load::LoadedModel::format`).
    pub architecture: String,
    /// Model (residual stream) width.
    pub dim: usize,
    /// Width of the dense feed-forward layer (unused by a layer whose FFN is a mixture of experts).
    pub hidden_dim: usize,
    /// Number of transformer blocks.
    pub n_layers: usize,
    /// Number of query heads.
    pub n_heads: usize,
    /// Number of key/value heads (grouped-query attention when smaller than `n_heads`).
    pub n_kv_heads: usize,
    /// Width of one attention head: `dim / n_heads` for Llama, set explicitly by Qwen3, Gemma and
    /// gpt-oss (`head_dim` in `config.json`).
    pub head_dim: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Context length the model was trained for.
    pub max_seq_len: usize,
    /// RMSNorm epsilon.
    pub norm_eps: f32,
    /// RoPE base frequency (theta) of the full-attention layers, and of the sliding-window layers
    /// unless `local_rope_theta` says otherwise.
    pub rope_theta: f32,
    /// Whether the output layer shares the token-embedding matrix.
    pub tied_embeddings: bool,
    /// How RoPE's inverse frequencies depart from `theta^(-2i/rotary_dim)`: Llama 3.1+'s, linear,
    /// YaRN or LongRoPE scaling from a Hugging Face config, or per-pair divisors from a GGUF file;
    /// `None` for plain RoPE. Applies to the layers that use `rope_theta`.
    pub rope_scaling: Option<RopeScaling>,
    /// What every block computes beyond the Llama block.
    #[serde(skip_serializing_if = "BlockSpec::is_llama")]
    pub block: BlockSpec,
    /// Sliding-window size of each layer, `n_layers` entries (`None`: full causal attention), or
    /// empty when every layer attends to the whole context. A query at position `p` sees the keys
    /// at positions `p − window < k ≤ p` (`transformers`' `sliding_window_overlay`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<Option<usize>>,
    /// RoPE theta of the sliding-window layers when it differs from `rope_theta` (Gemma 3: 1e4
    /// local, 1e6 global); those layers' RoPE is then unscaled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_rope_theta: Option<f32>,
    /// Factor the embedding rows are multiplied by, rounded to the compute dtype first (Gemma:
    /// √dim, `Gemma3TextScaledWordEmbedding`); `None` for 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub embedding_scale: Option<f32>,
    /// Final-logit soft-capping: `logits = cap · tanh(logits / cap)` (Gemma 2 and 3).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub final_logit_softcap: Option<f32>,
    /// The mixture of experts of the layers whose FFN is one (`None`: every FFN is dense).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeSpec>,
    /// Which layers rotate with RoPE, and Llama 4's chunked attention, L2 q/k norm and attention
    /// temperature ([`LayerAttention`]); `LayerAttention::default()` for none of them.
    #[serde(skip_serializing_if = "LayerAttention::is_plain")]
    pub layer_attention: LayerAttention,
}

/// What SmolLM3 and Llama 4 change in attention per layer, as data. The default (every layer
/// rotates, attends to its whole causal context, no L2 norm, no temperature) changes nothing.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LayerAttention {
    /// Whether each layer applies RoPE to its queries and keys, `n_layers` entries, or empty when
    /// every layer does. A layer without RoPE is a NoPE layer: `no_rope_layers[i] == 0` in
    /// `config.json` (`SmolLM3Attention`, `Llama4TextAttention`: `use_rope =
    /// config.no_rope_layers[layer_idx]`, so 1 means RoPE).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rope: Vec<bool>,
    /// Chunked local attention of each layer, `n_layers` entries (`None`: full causal attention),
    /// or empty when no layer chunks (Llama 4's `attention_chunk_size` on its `chunked_attention`
    /// layers): a query at position `p` sees the keys at positions `k ≤ p` with
    /// `⌊k / chunk⌋ = ⌊p / chunk⌋` (`masking_utils.chunked_overlay`, positions counted from the
    /// row's first real token).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub chunks: Vec<Option<usize>>,
    /// Llama 4's weightless L2 norm of every query and key head after RoPE, on the layers that
    /// apply RoPE (`use_qk_norm`, `Llama4TextL2Norm`: `x · rsqrt(mean(x²) + eps)` in f32); the
    /// value is its `eps` (`rms_norm_eps`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qk_l2_norm: Option<f32>,
    /// Llama 4's attention temperature tuning on the layers without RoPE
    /// (`attn_temperature_tuning`, [`AttnTemperature`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<AttnTemperature>,
}

impl LayerAttention {
    /// Whether this changes nothing (the default).
    pub fn is_plain(&self) -> bool {
        *self == LayerAttention::default()
    }
}

/// Llama 4's attention temperature tuning (Nakanishi 2025, arXiv 2501.19399; `Llama4TextAttention`):
/// the queries of position `p` (counted from the row's first token) are multiplied by
/// `ln(1 + ⌊(p + 1) / floor_scale⌋) · attn_scale + 1` before the scores.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct AttnTemperature {
    /// `floor_scale` (8192 in Llama 4 Scout).
    pub floor_scale: f32,
    /// `attn_scale` (0.1).
    pub attn_scale: f32,
}

impl AttnTemperature {
    /// The factor the queries of position `pos` are multiplied by, in f32 as `transformers`
    /// computes it (`torch.log1p(torch.floor((positions.float() + 1.0) / floor_scale)) *
    /// attn_scale + 1.0`, all f32 ops).
    pub fn factor(&self, pos: usize) -> f32 {
        ((pos as f32 + 1.0) / self.floor_scale).floor().ln_1p() * self.attn_scale + 1.0
    }
}

/// How a block normalizes, attends and transforms, beyond the Llama block. The default is Llama's:
/// pre-norms only, `x·w` RMSNorm, rotation of whole heads, `1/√head_dim` scores, SwiGLU.
///
/// Biases (q/k/v/o, FFN) are not described here: a layer has them when its weights do.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct BlockSpec {
    /// How RMSNorm applies its weight.
    pub norm: NormStyle,
    /// Gemma 2/3's four norms: the attention output and the FFN output are each normalized again
    /// (`post_attention_layernorm`, `post_feedforward_layernorm`) before their residual sums.
    pub sandwich_norms: bool,
    /// Qwen3 and Gemma 3: each query and key head is RMS-normalized (weight `[head_dim]`, shared by
    /// the heads) after its projection and before RoPE.
    pub qk_norm: bool,
    /// Dimensions of a head that RoPE rotates, from its start (Phi-3's `partial_rotary_factor`);
    /// `None` for the whole head.
    pub rotary_dim: Option<usize>,
    /// The factor the scores `q·k` are multiplied by: `query_pre_attn_scalar^-½` (Gemma); `None`
    /// for `head_dim^-½`.
    pub attn_scale: Option<f32>,
    /// Attention-logit soft-capping (Gemma 2): scaled scores become `cap · tanh(s / cap)` before
    /// the mask.
    pub attn_softcap: Option<f32>,
    /// gpt-oss's learned attention sinks: one logit per query head joins the softmax over the
    /// keys, and its probability is dropped.
    pub sinks: bool,
    /// The feed-forward layer's gated activation.
    pub activation: Activation,
}

impl BlockSpec {
    /// Whether this is Llama's block (the default).
    pub fn is_llama(&self) -> bool {
        *self == BlockSpec::default()
    }
}

/// How RMSNorm applies its weight `w` to `x / rms(x)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NormStyle {
    /// `x̂ · w` (Llama, Qwen, Phi, Mixtral, gpt-oss).
    #[default]
    Weight,
    /// `x̂ · (1 + w)`, computed in f32 (Gemma: `Gemma3RMSNorm`). GGUF files store `1 + w`
    /// already (llama.cpp's converter adds it), so a GGUF Gemma uses [`NormStyle::Weight`].
    OnePlusWeight,
}

/// The gated activation of a feed-forward layer `down(act(gate·x, up·x))`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Activation {
    /// SwiGLU (Shazeer 2020): `silu(g) · u`.
    #[default]
    SwiGlu,
    /// GELU with the tanh approximation, gated (Gemma's `gelu_pytorch_tanh`):
    /// `0.5·g·(1 + tanh(√(2/π)·(g + 0.044715·g³))) · u`.
    GeluTanh,
    /// gpt-oss's clamped SwiGLU (`GptOssExperts._apply_gate`): `g' = min(g, limit)`,
    /// `u' = clamp(u, −limit, limit)`, `(u' + 1) · g' · σ(alpha · g')`.
    ClampedSwiGlu {
        /// `swiglu_alpha` (1.702).
        alpha: f32,
        /// `swiglu_limit` (7).
        limit: f32,
    },
}

/// A mixture of experts: a router picks `top_k` of `n_experts` feed-forward layers per token and
/// the layer's output is their outputs weighted by the router's probabilities.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MoeSpec {
    /// Number of experts.
    pub n_experts: usize,
    /// Experts each token is routed to (`num_experts_per_tok`).
    pub top_k: usize,
    /// Width of one expert's feed-forward layer (`moe_intermediate_size`, or Mixtral's and
    /// gpt-oss's `intermediate_size`).
    pub expert_hidden: usize,
    /// How the router's logits become the chosen experts' weights.
    pub routing: Routing,
    /// Layers whose FFN is dense (`hidden_dim` wide) instead (Qwen3-MoE's and Qwen2-MoE's
    /// `mlp_only_layers` and `decoder_sparse_step`); empty when every layer has experts.
    pub dense_layers: Vec<usize>,
    /// Width of the shared expert every token runs besides its routed ones, scaled by a sigmoid
    /// gate (Qwen2-MoE's `shared_expert_intermediate_size`; [`SharedExpert`]); `None` without one.
    pub shared_expert_hidden: Option<usize>,
}

/// How a router turns its logits `r = W·x (+ b)` into the weights of the `top_k` experts it picks
/// (always the `top_k` largest logits; ties go to the lower expert index, as `torch.topk`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Routing {
    /// Softmax over all experts, then the chosen probabilities, divided by their sum when
    /// `renormalize` (Qwen3-MoE's `norm_topk_prob`; Mixtral always renormalizes).
    SoftmaxTopK {
        /// Divide the chosen probabilities by their sum.
        renormalize: bool,
    },
    /// Softmax over the chosen logits only (gpt-oss).
    TopKSoftmax,
    /// Llama 4 (`Llama4Router`, `Llama4TextMoe`): each chosen expert's **input** is multiplied by
    /// `σ(logit)` (computed in f32) and its output added unweighted:
    /// `y = Σ_e expert_e(σ(r_e) · x)`.
    SigmoidInput,
    /// DeepSeek-V3's and GLM-4.5's group-limited sigmoid routing (`DeepseekV3TopkRouter`,
    /// `Glm4MoeTopkRouter`, all in f32): scores `s = σ(r)`; the choice reads `c = s + b`, where `b`
    /// is the router's bias ([`Experts::router_bias`], their `e_score_correction_bias`), which
    /// the weights never see. The experts split into `n_group` consecutive groups, each scored by
    /// the sum of its two largest `c`; the `topk_group` best groups are kept and the `top_k`
    /// largest `c` among their experts chosen. Their weights are their `s`, divided by
    /// `Σ s + 1e-20` when `renormalize` (`norm_topk_prob`), times `scale`
    /// (`routed_scaling_factor`), scaling the outputs. Chosen experts are listed in order of `c`.
    GroupedSigmoid {
        /// `n_group`: groups the experts split into (dividing the experts, each group at least 2).
        n_group: usize,
        /// `topk_group`: groups kept, from 1 to `n_group`.
        topk_group: usize,
        /// Divide the chosen weights by their sum.
        renormalize: bool,
        /// `routed_scaling_factor`.
        scale: f32,
    },
}

impl Routing {
    /// Whether the router's weights scale the experts' inputs rather than their outputs.
    pub fn scales_input(self) -> bool {
        self == Routing::SigmoidInput
    }

    /// Whether the router's bias biases the choice only ([`Routing::GroupedSigmoid`]) rather
    /// than the logits.
    pub fn biases_choice_only(self) -> bool {
        matches!(self, Routing::GroupedSigmoid { .. })
    }
}

/// RoPE frequency scaling, applied by `qdrift-model`'s `Rope` to the inverse frequencies
/// `inv_freq[i] = theta^(-2i/head_dim)` of the rotation pairs `i < head_dim / 2`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rope_type", rename_all = "snake_case")]
pub enum RopeScaling {
    /// `rope_scaling` of a Hugging Face `config.json` with `rope_type = "llama3"` (Llama 3.1+).
    ///
    /// Spec: `transformers` `modeling_rope_utils.py` `_compute_llama3_parameters`: with
    /// `wavelen = 2π / inv_freq`, `low = original_max_position_embeddings / low_freq_factor`,
    /// `high = original_max_position_embeddings / high_freq_factor`: frequencies with
    /// `wavelen > low` are divided by `factor`, those with `wavelen < high` kept, and those between
    /// interpolated with `smooth = (original_max_position_embeddings / wavelen - low_freq_factor) /
    /// (high_freq_factor - low_freq_factor)`: `(1 - smooth) · inv_freq / factor + smooth · inv_freq`.
    Llama3 {
        /// `factor`.
        factor: f32,
        /// `low_freq_factor`.
        low_freq_factor: f32,
        /// `high_freq_factor`.
        high_freq_factor: f32,
        /// `original_max_position_embeddings`.
        original_max_position_embeddings: usize,
    },
    /// One divisor per rotation pair: `inv_freq[i] / factors[i]`. llama.cpp's `freq_factors`
    /// (`ggml_rope_ext`: the angle of pair `i` is `pos · theta^(-2i/n_rot) / freq_factors[i]`),
    /// stored in GGUF as the tensor `rope_freqs.weight` (`[head_dim / 2]`; llama.cpp's converter
    /// writes Llama 3.1's scaling this way); GGUF's linear scaling (`rope.scaling.factor`) is
    /// folded in as a common divisor.
    FreqFactors {
        /// `head_dim / 2` positive divisors.
        factors: Vec<f32>,
    },
    /// Linear position interpolation (`rope_type = "linear"`; Gemma 3's global layers): every
    /// inverse frequency divided by `factor` (`_compute_linear_scaling_rope_parameters`).
    Linear {
        /// `factor`.
        factor: f32,
    },
    /// YaRN (Peng et al. 2023; `rope_type = "yarn"`, gpt-oss), as `transformers`
    /// `modeling_rope_utils.py` `_compute_yarn_parameters` computes it over the `d` rotated
    /// dimensions: `low`/`high` are `find_correction_dim` of `beta_fast`/`beta_slow`
    /// (`d · ln(original_max_position_embeddings / (2π·β)) / (2 ln θ)`, floored/ceiled when
    /// `truncate`, clamped to `[0, d − 1]`); with `ramp[i] = clamp((i − low) / (high − low), 0, 1)`
    /// (`high` nudged by 0.001 when equal), `inv_freq[i] = inv_freq[i]/factor · ramp[i] +
    /// inv_freq[i] · (1 − ramp[i])`; cos and sin are multiplied by `attention_factor`.
    Yarn {
        /// `factor`.
        factor: f32,
        /// `beta_fast` (32 by default).
        beta_fast: f32,
        /// `beta_slow` (1 by default).
        beta_slow: f32,
        /// `original_max_position_embeddings`.
        original_max_position_embeddings: usize,
        /// `truncate` (true by default; gpt-oss sets false).
        truncate: bool,
        /// The factor cos and sin are scaled by: `attention_factor`, else `0.1 · ln(factor) + 1`.
        attention_factor: f32,
    },
    /// LongRoPE (Ding et al. 2024; `rope_type = "longrope"`, older `su`, and Phi-3's `yarn`, which
    /// `Phi3Config.convert_rope_params_to_dict` renames): Phi-3.5 and Phi-4-mini. `transformers`
    /// `modeling_rope_utils.py` `_compute_longrope_parameters` computes, over the `d` rotated
    /// dimensions, `inv_freq[i] = 1 / (ext_factors[i] · θ^(2i/d))`, where `ext_factors` is
    /// `short_factor` while the sequence length (the largest position + 1,
    /// `dynamic_rope_update`'s `longrope_frequency_update`) is at most
    /// `original_max_position_embeddings` and `long_factor` beyond it; cos and sin are multiplied
    /// by `attention_factor`. Once a generation passes the original length, `Phi3ForCausalLM`'s
    /// `prepare_inputs_for_generation` drops the key-value cache and recomputes the whole
    /// sequence with the long factors.
    ///
    /// qdrift runs the **short factors** only, and refuses a request whose prompt plus new tokens
    /// exceed `original_max_position_embeddings` (`qdrift_generate::check_request`): up to there
    /// it computes what `transformers` does; `long_factor` is kept so that writers keep it.
    #[serde(rename = "longrope")]
    LongRope {
        /// `short_factor`: `d / 2` divisors of the inverse frequencies, used up to
        /// `original_max_position_embeddings` positions.
        short_factor: Vec<f32>,
        /// `long_factor`: `d / 2` divisors used beyond them (kept, not run).
        long_factor: Vec<f32>,
        /// `original_max_position_embeddings`: the context the short factors serve.
        original_max_position_embeddings: usize,
        /// The factor cos and sin are scaled by: `attention_factor`, else
        /// `√(1 + ln(factor) / ln(original_max_position_embeddings))`, with `factor` the dict's or
        /// `max_position_embeddings / original_max_position_embeddings` (1 when `factor ≤ 1`).
        attention_factor: f32,
    },
}

impl RopeScaling {
    /// Checks the parameters for `head_dim` rotated dimensions of a head.
    pub fn validate(&self, head_dim: usize) -> Result<(), String> {
        let positive = |name: &str, v: f32| {
            if v > 0.0 && v.is_finite() { Ok(()) } else { Err(format!("rope scaling {name} {v} must be positive")) }
        };
        let original = |n: usize| {
            if n > 0 {
                Ok(())
            } else {
                Err("rope scaling original_max_position_embeddings must be positive".to_string())
            }
        };
        match self {
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
                positive("factor", *factor)?;
                positive("low_freq_factor", *low_freq_factor)?;
                positive("high_freq_factor", *high_freq_factor)?;
                if high_freq_factor <= low_freq_factor {
                    return Err(format!(
                        "rope scaling high_freq_factor {high_freq_factor} must be greater than low_freq_factor \
                         {low_freq_factor}"
                    ));
                }
                original(*original_max_position_embeddings)
            }
            RopeScaling::FreqFactors { factors } => {
                if factors.len() != head_dim / 2 {
                    return Err(format!(
                        "{} RoPE frequency factors for a head dimension of {head_dim}; expected {}",
                        factors.len(),
                        head_dim / 2
                    ));
                }
                factors.iter().try_for_each(|&f| positive("frequency factor", f))
            }
            RopeScaling::Linear { factor } => positive("factor", *factor),
            RopeScaling::Yarn {
                factor,
                beta_fast,
                beta_slow,
                original_max_position_embeddings,
                truncate: _,
                attention_factor,
            } => {
                positive("factor", *factor)?;
                positive("beta_fast", *beta_fast)?;
                positive("beta_slow", *beta_slow)?;
                positive("attention_factor", *attention_factor)?;
                original(*original_max_position_embeddings)
            }
            RopeScaling::LongRope { short_factor, long_factor, original_max_position_embeddings, attention_factor } => {
                for (name, factors) in [("short_factor", short_factor), ("long_factor", long_factor)] {
                    if factors.len() != head_dim / 2 {
                        return Err(format!(
                            "rope scaling {name} has {} values for {head_dim} rotated dimensions; expected {}",
                            factors.len(),
                            head_dim / 2
                        ));
                    }
                    factors.iter().try_for_each(|&f| positive(name, f))?;
                }
                positive("attention_factor", *attention_factor)?;
                original(*original_max_position_embeddings)
            }
        }
    }
}

/// The sizes every [`ModelArch`] states; [`ModelArch::new`] defaults the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArchShape {
    /// Model (residual stream) width.
    pub dim: usize,
    /// Width of the dense feed-forward layer.
    pub hidden_dim: usize,
    /// Number of transformer blocks.
    pub n_layers: usize,
    /// Number of query heads.
    pub n_heads: usize,
    /// Number of key/value heads.
    pub n_kv_heads: usize,
    /// Width of one attention head.
    pub head_dim: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Context length the model was trained for.
    pub max_seq_len: usize,
}

impl ModelArch {
    /// A Llama block of `shape` named `architecture`: RMSNorm epsilon 1e-5, RoPE theta 10000 and
    /// unscaled, an output layer of its own, `BlockSpec::default()`, no windows, no embedding
    /// scale, no soft cap, no experts. Other values are set with struct update syntax
    /// (`ModelArch { rope_theta: 1e6, ..ModelArch::new(name, shape) }`).
    pub fn new(architecture: impl Into<String>, shape: ArchShape) -> Self {
        let ArchShape { dim, hidden_dim, n_layers, n_heads, n_kv_heads, head_dim, vocab_size, max_seq_len } = shape;
        ModelArch {
            architecture: architecture.into(),
            dim,
            hidden_dim,
            n_layers,
            n_heads,
            n_kv_heads,
            head_dim,
            vocab_size,
            max_seq_len,
            norm_eps: 1e-5,
            rope_theta: 10000.0,
            tied_embeddings: false,
            rope_scaling: None,
            block: BlockSpec::default(),
            windows: Vec::new(),
            local_rope_theta: None,
            embedding_scale: None,
            final_logit_softcap: None,
            moe: None,
            layer_attention: LayerAttention::default(),
        }
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Total width of the key (or value) projection.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Total width of the query projection (and of the output projection's input).
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Dimensions of a head that RoPE rotates (the first ones; the rest pass unchanged).
    pub fn rotary_dim(&self) -> usize {
        self.block.rotary_dim.unwrap_or(self.head_dim)
    }

    /// Layer `layer`'s sliding window (`None`: full attention).
    pub fn window(&self, layer: usize) -> Option<usize> {
        self.windows.get(layer).copied().flatten()
    }

    /// Layer `layer`'s RoPE: theta and scaling (a sliding-window layer with its own theta is
    /// unscaled).
    pub fn layer_rope(&self, layer: usize) -> (f32, Option<&RopeScaling>) {
        match self.local_rope_theta {
            Some(theta) if self.window(layer).is_some() => (theta, None),
            _ => (self.rope_theta, self.rope_scaling.as_ref()),
        }
    }

    /// The most positions (prompt + new tokens) a request may span: LongRoPE's
    /// `original_max_position_embeddings`, past which `transformers` switches to the long factors
    /// that qdrift does not run ([`RopeScaling::LongRope`]); `None` for every other RoPE.
    pub fn short_rope_limit(&self) -> Option<usize> {
        match self.rope_scaling {
            Some(RopeScaling::LongRope { original_max_position_embeddings, .. }) => {
                Some(original_max_position_embeddings)
            }
            _ => None,
        }
    }

    /// Whether layer `layer` rotates its queries and keys with RoPE (false on a NoPE layer,
    /// [`LayerAttention::rope`]).
    pub fn uses_rope(&self, layer: usize) -> bool {
        self.layer_attention.rope.get(layer).copied().unwrap_or(true)
    }

    /// Layer `layer`'s attention chunk ([`LayerAttention::chunks`]; `None`: not chunked).
    pub fn chunk(&self, layer: usize) -> Option<usize> {
        self.layer_attention.chunks.get(layer).copied().flatten()
    }

    /// Layer `layer`'s L2 q/k norm epsilon: Llama 4's, on the layers that apply RoPE.
    pub fn qk_l2_norm(&self, layer: usize) -> Option<f32> {
        self.layer_attention.qk_l2_norm.filter(|_| self.uses_rope(layer))
    }

    /// Layer `layer`'s attention temperature: Llama 4's, on the layers without RoPE.
    pub fn temperature(&self, layer: usize) -> Option<AttnTemperature> {
        self.layer_attention.temperature.filter(|_| !self.uses_rope(layer))
    }

    /// Whether layer `layer`'s FFN is a mixture of experts.
    pub fn has_experts(&self, layer: usize) -> bool {
        self.moe.as_ref().is_some_and(|m| !m.dense_layers.contains(&layer))
    }

    /// Checks the relations between the fields that the model relies on.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("dim", self.dim),
            ("hidden_dim", self.hidden_dim),
            ("n_layers", self.n_layers),
            ("n_heads", self.n_heads),
            ("n_kv_heads", self.n_kv_heads),
            ("head_dim", self.head_dim),
            ("vocab_size", self.vocab_size),
            ("max_seq_len", self.max_seq_len),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("{name} must be positive"));
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(format!("n_heads {} is not a multiple of n_kv_heads {}", self.n_heads, self.n_kv_heads));
        }
        let rotary = self.rotary_dim();
        if rotary == 0 || rotary > self.head_dim || !rotary.is_multiple_of(2) {
            return Err(format!(
                "RoPE rotates {rotary} of a head's {} dimensions; it needs an even count from 2 to the head's width",
                self.head_dim
            ));
        }
        if !(self.norm_eps > 0.0 && self.norm_eps.is_finite()) {
            return Err(format!("norm_eps {} must be positive", self.norm_eps));
        }
        for (name, theta) in [("rope_theta", Some(self.rope_theta)), ("local rope_theta", self.local_rope_theta)] {
            if let Some(t) = theta
                && !(t > 0.0 && t.is_finite())
            {
                return Err(format!("{name} {t} must be positive"));
            }
        }
        if let Some(s) = &self.rope_scaling {
            s.validate(rotary)?;
        }
        if !self.windows.is_empty() && self.windows.len() != self.n_layers {
            return Err(format!("{} sliding windows for {} layers", self.windows.len(), self.n_layers));
        }
        if self.windows.iter().flatten().any(|&w| w == 0) {
            return Err("a sliding window must be positive".to_string());
        }
        let la = &self.layer_attention;
        for (name, len) in [("RoPE flags", la.rope.len()), ("attention chunks", la.chunks.len())] {
            if len != 0 && len != self.n_layers {
                return Err(format!("{len} {name} for {} layers", self.n_layers));
            }
        }
        if la.chunks.iter().flatten().any(|&c| c == 0) {
            return Err("an attention chunk must be positive".to_string());
        }
        let finite_positive = |name: &str, v: Option<f32>| match v {
            Some(v) if !(v > 0.0 && v.is_finite()) => Err(format!("{name} {v} must be positive")),
            _ => Ok(()),
        };
        finite_positive("embedding scale", self.embedding_scale)?;
        finite_positive("final-logit soft cap", self.final_logit_softcap)?;
        finite_positive("attention scale", self.block.attn_scale)?;
        finite_positive("attention-logit soft cap", self.block.attn_softcap)?;
        finite_positive("L2 q/k norm epsilon", la.qk_l2_norm)?;
        if let Some(t) = la.temperature {
            finite_positive("temperature floor_scale", Some(t.floor_scale))?;
            if !t.attn_scale.is_finite() {
                return Err(format!("temperature attn_scale {} must be finite", t.attn_scale));
            }
        }
        if let Activation::ClampedSwiGlu { alpha, limit } = self.block.activation {
            finite_positive("swiglu alpha", Some(alpha))?;
            finite_positive("swiglu limit", Some(limit))?;
        }
        if let Some(m) = &self.moe {
            if m.n_experts == 0 || m.expert_hidden == 0 {
                return Err("a mixture of experts needs at least one expert of positive width".to_string());
            }
            if m.top_k == 0 || m.top_k > m.n_experts {
                return Err(format!("top-k {} must be from 1 to the {} experts", m.top_k, m.n_experts));
            }
            if let Some(&l) = m.dense_layers.iter().find(|&&l| l >= self.n_layers) {
                return Err(format!("dense layer {l} of {} layers", self.n_layers));
            }
            if m.shared_expert_hidden == Some(0) {
                return Err("a shared expert needs a positive width".to_string());
            }
            if let Routing::GroupedSigmoid { n_group, topk_group, scale, .. } = m.routing {
                let per_group = m.n_experts.checked_div(n_group).unwrap_or(0);
                if n_group == 0 || !m.n_experts.is_multiple_of(n_group) || per_group < 2 {
                    return Err(format!(
                        "n_group {n_group} must divide the {} experts into groups of at least 2",
                        m.n_experts
                    ));
                }
                if topk_group == 0 || topk_group > n_group || m.top_k > topk_group * per_group {
                    return Err(format!(
                        "topk_group {topk_group} must be from 1 to n_group {n_group} and keep the top-k {} experts",
                        m.top_k
                    ));
                }
                if !scale.is_finite() {
                    return Err(format!("routed_scaling_factor {scale} must be finite"));
                }
            }
        }
        Ok(())
    }

    /// Number of weights the architecture implies, counting a tied embedding once: norms and
    /// linear weights (biases, sinks and q/k norms are counted by [`HostModel::parameter_count`],
    /// which holds them).
    pub fn parameter_count(&self) -> usize {
        // Saturating: readers check every dimension against the file, but an architecture can
        // also be built by hand (inspect's presets, tests).
        let (d, h, q, kv) = (self.dim, self.hidden_dim, self.q_dim(), self.kv_dim());
        let mul = usize::saturating_mul;
        let norms = if self.block.sandwich_norms { 4 * d } else { 2 * d };
        let attention = mul(mul(d, q), 2).saturating_add(mul(mul(2, d), kv));
        let dense = mul(mul(3, d), h);
        let experts = self.moe.as_ref().map_or(0, |m| {
            let shared = m.shared_expert_hidden.map_or(0, |s| mul(mul(3, d), s).saturating_add(d));
            mul(m.n_experts, mul(mul(3, d), m.expert_hidden)).saturating_add(mul(m.n_experts, d)).saturating_add(shared)
        });
        let mut dense_layers = self.moe.as_ref().map_or(Vec::new(), |m| m.dense_layers.clone());
        dense_layers.sort_unstable();
        dense_layers.dedup();
        let moe_layers = if self.moe.is_some() { self.n_layers.saturating_sub(dense_layers.len()) } else { 0 };
        let layers = mul(self.n_layers, norms.saturating_add(attention))
            .saturating_add(mul(moe_layers, experts))
            .saturating_add(mul(self.n_layers - moe_layers, dense));
        let embedding = mul(self.vocab_size, d);
        let head = if self.tied_embeddings { 0 } else { embedding };
        embedding.saturating_add(layers).saturating_add(d).saturating_add(head)
    }
}

/// A dense f32 tensor in host memory, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// `shape.iter().product()` values, row-major.
    pub data: Vec<f32>,
}

impl HostTensor {
    /// Wraps `data` with `shape`; `None` when the sizes disagree.
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Option<Self> {
        (shape.iter().product::<usize>() == data.len()).then_some(Self { shape, data })
    }
}

/// Weights of one transformer block.
///
/// Linear weights are in PyTorch's `[out_features, in_features]` layout. The query and key
/// projections use the *interleaved* RoPE layout (llama2.c, GGUF: rotation pairs are adjacent
/// elements `(2i, 2i+1)` of a head's rotated dimensions); loaders of checkpoints that use the
/// rotate-half layout (Hugging Face) un-permute them, and the q/k norm weights with them.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerWeights {
    /// RMSNorm weight before attention, `[dim]`.
    pub attn_norm: HostTensor,
    /// Query projection, `[n_heads * head_dim, dim]`.
    pub wq: HostTensor,
    /// Key projection, `[n_kv_heads * head_dim, dim]`.
    pub wk: HostTensor,
    /// Value projection, `[n_kv_heads * head_dim, dim]`.
    pub wv: HostTensor,
    /// Attention output projection, `[dim, n_heads * head_dim]`.
    pub wo: HostTensor,
    /// Query bias `[n_heads * head_dim]` (Qwen2, gpt-oss), in the same interleaved row order as
    /// `wq`; `None` for Llama.
    pub bq: Option<HostTensor>,
    /// Key bias `[n_kv_heads * head_dim]`, in `wk`'s row order.
    pub bk: Option<HostTensor>,
    /// Value bias `[n_kv_heads * head_dim]`.
    pub bv: Option<HostTensor>,
    /// Output bias `[dim]` (gpt-oss).
    pub bo: Option<HostTensor>,
    /// Per-head query RMSNorm weight `[head_dim]` (Qwen3, Gemma 3), in the interleaved order of a
    /// head's rows.
    pub q_norm: Option<HostTensor>,
    /// Per-head key RMSNorm weight `[head_dim]`, in the same order.
    pub k_norm: Option<HostTensor>,
    /// Attention-sink logits, one per query head `[n_heads]` (gpt-oss).
    pub sinks: Option<HostTensor>,
    /// RMSNorm weight of the attention output before its residual sum, `[dim]` (Gemma's
    /// `post_attention_layernorm`).
    pub post_attn_norm: Option<HostTensor>,
    /// RMSNorm weight before the feed-forward layer, `[dim]` (Llama's `post_attention_layernorm`,
    /// Gemma's `pre_feedforward_layernorm`).
    pub ffn_norm: HostTensor,
    /// RMSNorm weight of the FFN output before its residual sum, `[dim]` (Gemma's
    /// `post_feedforward_layernorm`).
    pub post_ffn_norm: Option<HostTensor>,
    /// The feed-forward layer.
    pub ffn: Ffn,
}

/// A block's feed-forward layer: dense, or a mixture of experts.
#[derive(Debug, Clone, PartialEq)]
pub enum Ffn {
    /// One gated FFN, `hidden_dim` wide.
    Dense(Mlp),
    /// A router and its experts, each `expert_hidden` wide ([`MoeSpec`]).
    Experts(Experts),
}

/// A gated feed-forward layer `down(act(gate·x + b_g, up·x + b_u)) + b_d`.
#[derive(Debug, Clone, PartialEq)]
pub struct Mlp {
    /// Gate projection, `[hidden, dim]`.
    pub gate: HostTensor,
    /// Up projection, `[hidden, dim]`.
    pub up: HostTensor,
    /// Down projection, `[dim, hidden]`.
    pub down: HostTensor,
    /// Gate bias `[hidden]` (gpt-oss's experts).
    pub gate_bias: Option<HostTensor>,
    /// Up bias `[hidden]`.
    pub up_bias: Option<HostTensor>,
    /// Down bias `[dim]`.
    pub down_bias: Option<HostTensor>,
}

impl Mlp {
    /// A dense FFN without biases.
    pub fn new(gate: HostTensor, up: HostTensor, down: HostTensor) -> Mlp {
        Mlp { gate, up, down, gate_bias: None, up_bias: None, down_bias: None }
    }
}

const Q: &str = "self_attn.q_proj";
const K: &str = "self_attn.k_proj";
const V: &str = "self_attn.v_proj";
const O: &str = "self_attn.o_proj";
const GATE: &str = "mlp.gate_proj";
const UP: &str = "mlp.up_proj";
const DOWN: &str = "mlp.down_proj";
const SHARED_GATE: &str = "mlp.shared_expert.gate_proj";
const SHARED_UP: &str = "mlp.shared_expert.up_proj";
const SHARED_DOWN: &str = "mlp.shared_expert.down_proj";

/// A linear weight's name within its block: its role, as the Hugging Face Llama short name
/// (`self_attn.q_proj` ... `mlp.down_proj`), and in a mixture of experts its expert. Displayed
/// as Qwen3-MoE names it (`mlp.experts.3.gate_proj`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LinearName {
    /// `self_attn.q_proj`, `self_attn.k_proj`, `self_attn.v_proj`, `self_attn.o_proj`,
    /// `mlp.gate_proj`, `mlp.up_proj` or `mlp.down_proj`; a shared expert's
    /// `mlp.shared_expert.{gate,up,down}_proj`.
    pub role: &'static str,
    /// The expert, for a weight of a mixture of experts.
    pub expert: Option<usize>,
}

impl LinearName {
    /// A dense layer's weight.
    pub fn dense(role: &'static str) -> LinearName {
        LinearName { role, expert: None }
    }
}

impl std::fmt::Display for LinearName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.expert, self.role.strip_prefix("mlp.")) {
            (Some(e), Some(rest)) => write!(f, "mlp.experts.{e}.{rest}"),
            _ => f.write_str(self.role),
        }
    }
}

/// A mixture of experts' weights.
#[derive(Debug, Clone, PartialEq)]
pub struct Experts {
    /// Router, `[n_experts, dim]` (`mlp.gate`, Mixtral's `block_sparse_moe.gate`, gpt-oss's
    /// `mlp.router`).
    pub router: HostTensor,
    /// Router bias `[n_experts]`: gpt-oss's, added to the logits; with
    /// [`Routing::GroupedSigmoid`], the `e_score_correction_bias` added to the scores for the
    /// choice only.
    pub router_bias: Option<HostTensor>,
    /// The experts, `n_experts` of them.
    pub experts: Vec<Mlp>,
    /// The shared expert, when the mixture has one ([`MoeSpec::shared_expert_hidden`]).
    pub shared: Option<SharedExpert>,
}

/// Qwen2-MoE's shared expert (`Qwen2MoeSparseMoeBlock`): a gated FFN every token runs, its output
/// scaled by `σ(gate·x)` and added to the routed experts' weighted sum:
/// `y = Σ_e w_e·expert_e(x) + σ(gate·x) · shared(x)`. Llama 4's (`Llama4TextMoe`) is ungated:
/// its `gate` is `[0, dim]` (no row), and `y = Σ_e expert_e(…) + shared(x)`.
#[derive(Debug, Clone, PartialEq)]
pub struct SharedExpert {
    /// The FFN (`mlp.shared_expert.{gate,up,down}_proj`), `shared_expert_hidden` wide.
    pub mlp: Mlp,
    /// The sigmoid gate `mlp.shared_expert_gate`, `[1, dim]`, or `[0, dim]` for an ungated shared
    /// expert (Llama 4); kept at reference precision with the router unless `--quantize-router`.
    pub gate: HostTensor,
}

impl LayerWeights {
    /// The dense FFN, when the layer has one.
    pub fn mlp(&self) -> Option<&Mlp> {
        match &self.ffn {
            Ffn::Dense(m) => Some(m),
            Ffn::Experts(_) => None,
        }
    }

    /// The dense FFN, mutably, when the layer has one.
    pub fn mlp_mut(&mut self) -> Option<&mut Mlp> {
        match &mut self.ffn {
            Ffn::Dense(m) => Some(m),
            Ffn::Experts(_) => None,
        }
    }

    /// The mixture of experts, when the layer has one.
    pub fn experts(&self) -> Option<&Experts> {
        match &self.ffn {
            Ffn::Dense(_) => None,
            Ffn::Experts(e) => Some(e),
        }
    }

    /// The linear weights that weight schemes quantize, by name, in a fixed order: q, k, v, o,
    /// then the dense FFN's gate, up, down or each expert's. A router is not among them
    /// ([`LayerWeights::routers_mut`]).
    pub fn linears(&self) -> Vec<(LinearName, &HostTensor)> {
        let attn = [(Q, &self.wq), (K, &self.wk), (V, &self.wv), (O, &self.wo)];
        let mut out: Vec<(LinearName, &HostTensor)> =
            attn.into_iter().map(|(r, t)| (LinearName::dense(r), t)).collect();
        fn mlp(m: &Mlp) -> [(&'static str, &HostTensor); 3] {
            [(GATE, &m.gate), (UP, &m.up), (DOWN, &m.down)]
        }
        match &self.ffn {
            Ffn::Dense(m) => out.extend(mlp(m).map(|(r, t)| (LinearName::dense(r), t))),
            Ffn::Experts(e) => {
                for (i, m) in e.experts.iter().enumerate() {
                    out.extend(mlp(m).map(|(role, t)| (LinearName { role, expert: Some(i) }, t)));
                }
                if let Some(sh) = &e.shared {
                    let named = [(SHARED_GATE, &sh.mlp.gate), (SHARED_UP, &sh.mlp.up), (SHARED_DOWN, &sh.mlp.down)];
                    out.extend(named.map(|(r, t)| (LinearName::dense(r), t)));
                }
            }
        }
        out
    }

    /// Mutable access to the linear weights, same names and order as [`LayerWeights::linears`].
    pub fn linears_mut(&mut self) -> Vec<(LinearName, &mut HostTensor)> {
        let attn = [(Q, &mut self.wq), (K, &mut self.wk), (V, &mut self.wv), (O, &mut self.wo)];
        let mut out: Vec<(LinearName, &mut HostTensor)> =
            attn.into_iter().map(|(r, t)| (LinearName::dense(r), t)).collect();
        match &mut self.ffn {
            Ffn::Dense(m) => {
                out.extend(
                    [(GATE, &mut m.gate), (UP, &mut m.up), (DOWN, &mut m.down)].map(|(r, t)| (LinearName::dense(r), t)),
                );
            }
            Ffn::Experts(e) => {
                for (i, m) in e.experts.iter_mut().enumerate() {
                    let named = [(GATE, &mut m.gate), (UP, &mut m.up), (DOWN, &mut m.down)];
                    out.extend(named.map(|(role, t)| (LinearName { role, expert: Some(i) }, t)));
                }
                if let Some(sh) = &mut e.shared {
                    let m = &mut sh.mlp;
                    let named = [(SHARED_GATE, &mut m.gate), (SHARED_UP, &mut m.up), (SHARED_DOWN, &mut m.down)];
                    out.extend(named.map(|(r, t)| (LinearName::dense(r), t)));
                }
            }
        }
        out
    }

    /// The routers' weights with their names, for a layer with experts: `mlp.gate`
    /// (`[n_experts, dim]`) and a shared expert's sigmoid gate `mlp.shared_expert_gate`
    /// (`[1, dim]`); kept at reference precision unless `--quantize-router`, as llm-compressor's
    /// Qwen MoE recipes ignore both.
    pub fn routers_mut(&mut self) -> Vec<(&'static str, &mut HostTensor)> {
        match &mut self.ffn {
            Ffn::Dense(_) => Vec::new(),
            Ffn::Experts(e) => {
                let mut out = vec![("mlp.gate", &mut e.router)];
                out.extend(e.shared.as_mut().map(|s| ("mlp.shared_expert_gate", &mut s.gate)));
                out
            }
        }
    }

    /// Every value of every tensor of the block.
    pub fn parameter_count(&self) -> usize {
        let count = |t: &HostTensor| t.data.len();
        let mut n = self.linears().iter().map(|(_, t)| count(t)).sum::<usize>();
        n += [&self.attn_norm, &self.ffn_norm].iter().map(|t| count(t)).sum::<usize>();
        let optional = [
            &self.bq,
            &self.bk,
            &self.bv,
            &self.bo,
            &self.q_norm,
            &self.k_norm,
            &self.sinks,
            &self.post_attn_norm,
            &self.post_ffn_norm,
        ];
        n += optional.iter().filter_map(|t| t.as_ref()).map(count).sum::<usize>();
        let mlp_biases = |m: &Mlp| {
            [&m.gate_bias, &m.up_bias, &m.down_bias].iter().filter_map(|t| t.as_ref()).map(count).sum::<usize>()
        };
        n + match &self.ffn {
            Ffn::Dense(m) => mlp_biases(m),
            Ffn::Experts(e) => {
                count(&e.router)
                    + e.router_bias.as_ref().map_or(0, count)
                    + e.experts.iter().map(mlp_biases).sum::<usize>()
                    + e.shared.as_ref().map_or(0, |s| count(&s.gate) + mlp_biases(&s.mlp))
            }
        }
    }

    /// Applies `f` to every tensor of the block: norms, biases, sinks, routers, then the linear
    /// weights.
    pub fn for_each_tensor_mut(&mut self, mut f: impl FnMut(&mut HostTensor)) {
        for t in self.others_mut() {
            f(t);
        }
        for (_, w) in self.linears_mut() {
            f(w);
        }
    }

    /// Every tensor of the block that is not a linear weight of [`LayerWeights::linears`]: norms,
    /// biases, sinks, the router and its bias.
    fn others_mut(&mut self) -> Vec<&mut HostTensor> {
        fn mlp_biases(m: &mut Mlp) -> impl Iterator<Item = &mut HostTensor> {
            [&mut m.gate_bias, &mut m.up_bias, &mut m.down_bias].into_iter().flatten()
        }
        let mut out = vec![&mut self.attn_norm, &mut self.ffn_norm];
        let optional = [
            &mut self.bq,
            &mut self.bk,
            &mut self.bv,
            &mut self.bo,
            &mut self.q_norm,
            &mut self.k_norm,
            &mut self.sinks,
            &mut self.post_attn_norm,
            &mut self.post_ffn_norm,
        ];
        out.extend(optional.into_iter().flatten());
        match &mut self.ffn {
            Ffn::Dense(m) => out.extend(mlp_biases(m)),
            Ffn::Experts(e) => {
                out.push(&mut e.router);
                out.extend(e.router_bias.as_mut());
                for m in &mut e.experts {
                    out.extend(mlp_biases(m));
                }
                if let Some(sh) = &mut e.shared {
                    out.push(&mut sh.gate);
                    out.extend(mlp_biases(&mut sh.mlp));
                }
            }
        }
        out
    }
}

/// A whole model in host memory: what every loader returns and every later stage consumes.
#[derive(Debug, Clone, PartialEq)]
pub struct HostModel {
    /// Architecture.
    pub arch: ModelArch,
    /// Token embedding, `[vocab_size, dim]`.
    pub token_embedding: HostTensor,
    /// The blocks, first to last.
    pub layers: Vec<LayerWeights>,
    /// Final RMSNorm weight, `[dim]`.
    pub final_norm: HostTensor,
    /// Output layer `[vocab_size, dim]`; `None` when tied to the token embedding.
    pub output: Option<HostTensor>,
}

impl HostModel {
    /// Parameters actually held: every value of every tensor, a tied embedding once.
    pub fn parameter_count(&self) -> usize {
        let count = |t: &HostTensor| t.data.len();
        count(&self.token_embedding)
            + count(&self.final_norm)
            + self.output.as_ref().map_or(0, count)
            + self.layers.iter().map(LayerWeights::parameter_count).sum::<usize>()
    }

    /// The output layer's weight, `[vocab_size, dim]` (the embedding when tied).
    pub fn output_weight(&self) -> &HostTensor {
        self.output.as_ref().unwrap_or(&self.token_embedding)
    }

    /// Rounds every weight to IEEE half precision (round-to-nearest-even) in place.
    ///
    /// qdrift's reference model is the checkpoint at FP16 weights; a llama2.c checkpoint stores
    /// f32, so it is rounded once here.
    pub fn round_to_f16(&mut self) {
        let round = |t: &mut HostTensor| {
            for v in &mut t.data {
                *v = half::f16::from_f32(*v).to_f32();
            }
        };
        self.for_each_tensor_mut(round);
    }

    /// Applies `f` to every weight tensor (embedding, every layer's tensors, norm, head).
    pub fn for_each_tensor_mut(&mut self, mut f: impl FnMut(&mut HostTensor)) {
        f(&mut self.token_embedding);
        for layer in &mut self.layers {
            layer.for_each_tensor_mut(&mut f);
        }
        f(&mut self.final_norm);
        if let Some(o) = &mut self.output {
            f(o);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `log1p(floor((p + 1) / 8)) · 0.1 + 1`: 1 below position 7, `ln 2 · 0.1 + 1` from 7 to 14,
    /// `ln 3 · 0.1 + 1` at 15.
    #[test]
    fn the_temperature_grows_with_the_log_of_the_position() {
        let t = AttnTemperature { floor_scale: 8.0, attn_scale: 0.1 };
        assert_eq!(t.factor(0), 1.0);
        assert_eq!(t.factor(6), 1.0);
        assert!((f64::from(t.factor(7)) - (2f64.ln() * 0.1 + 1.0)).abs() < 1e-7);
        assert_eq!(t.factor(14), t.factor(7));
        assert!((f64::from(t.factor(15)) - (3f64.ln() * 0.1 + 1.0)).abs() < 1e-7);
    }

    /// Per-layer lists have one entry per layer; the L2 norm follows the RoPE layers and the
    /// temperature the NoPE ones.
    #[test]
    fn layer_attention_is_checked_and_split_by_rope() {
        let mut a = ModelArch {
            architecture: "llama".into(),
            dim: 8,
            hidden_dim: 16,
            n_layers: 2,
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 4,
            vocab_size: 10,
            max_seq_len: 32,
            norm_eps: 1e-6,
            rope_theta: 1e4,
            tied_embeddings: true,
            rope_scaling: None,
            block: BlockSpec::default(),
            windows: Vec::new(),
            local_rope_theta: None,
            embedding_scale: None,
            final_logit_softcap: None,
            moe: None,
            layer_attention: LayerAttention {
                rope: vec![true, false],
                chunks: vec![Some(4), None],
                qk_l2_norm: Some(1e-6),
                temperature: Some(AttnTemperature { floor_scale: 8.0, attn_scale: 0.1 }),
            },
        };
        assert_eq!(a.validate(), Ok(()));
        assert_eq!((a.uses_rope(0), a.uses_rope(1)), (true, false));
        assert_eq!((a.chunk(0), a.chunk(1)), (Some(4), None));
        assert_eq!((a.qk_l2_norm(0), a.qk_l2_norm(1)), (Some(1e-6), None));
        assert_eq!((a.temperature(0).is_some(), a.temperature(1).is_some()), (false, true));
        a.layer_attention.chunks = vec![Some(0), None];
        assert_eq!(a.validate(), Err("an attention chunk must be positive".to_string()));
        a.layer_attention.chunks = vec![Some(4)];
        assert_eq!(a.validate(), Err("1 attention chunks for 2 layers".to_string()));
        a.layer_attention = LayerAttention::default();
        assert!(a.layer_attention.is_plain() && a.uses_rope(1) && a.chunk(0).is_none());
    }
}
