//! `config.json` → [`ModelArch`], read as `transformers` 5.25.0 reads it (its config classes'
//! field names and defaults, and `modeling_rope_utils.py`'s `RotaryEmbeddingConfigMixin`, which
//! folds the older top-level `rope_theta`, `rope_scaling` and `partial_rotary_factor` into
//! `rope_parameters`), and the features qdrift refuses, each by name.
//!
//! | class | `transformers` source | what it adds to the Llama block |
//! |---|---|---|
//! | `LlamaForCausalLM`, `MistralForCausalLM`, `Qwen2ForCausalLM` | `LlamaConfig`, `MistralConfig`, `Qwen2Config` | Qwen2's q/k/v biases; Mistral's and Qwen2's sliding window caps `max_seq_len` |
//! | `Qwen3ForCausalLM` | `Qwen3Config`, `Qwen3Attention` | q/k norms, `head_dim`, `layer_types` |
//! | `Qwen3MoeForCausalLM` | `Qwen3MoeConfig`, `Qwen3MoeSparseMoeBlock` | experts (`SoftmaxTopK`, `norm_topk_prob`), `mlp_only_layers`, `decoder_sparse_step` |
//! | `Qwen2MoeForCausalLM` | `Qwen2MoeConfig`, `Qwen2MoeSparseMoeBlock`, `Qwen2MoeAttention` | Qwen3-MoE's experts (`norm_topk_prob` false by default) plus a sigmoid-gated shared expert (`shared_expert_intermediate_size`), q/k/v biases (`qkv_bias`), `layer_types` |
//! | `Gemma2ForCausalLM` | `Gemma2Config`, `Gemma2Attention` | `(1+w)` norms, four norms, GELU-tanh, `query_pre_attn_scalar`, both soft caps, √hidden embedding scale |
//! | `Gemma3ForCausalLM` (`gemma3_text`) | `Gemma3TextConfig`, `Gemma3Attention` | Gemma 2's, minus the attention cap (5.25 ignores `attn_logit_softcapping`), plus q/k norms and a local RoPE θ |
//! | `Phi3ForCausalLM` | `Phi3Config`, `Phi3Attention` | fused `qkv_proj`/`gate_up_proj`, `partial_rotary_factor` |
//! | `MixtralForCausalLM` | `MixtralConfig`, `MixtralSparseMoeBlock` | experts (`SoftmaxTopK`, always renormalized) |
//! | `GptOssForCausalLM` | `GptOssConfig`, `GptOssAttention`, `GptOssExperts` | q/k/v/o biases, sinks, YaRN, experts (`TopKSoftmax`), clamped SwiGLU |
//! | `SmolLM3ForCausalLM` | `SmolLM3Config`, `SmolLM3Attention` | NoPE layers (`no_rope_layers`), tied by default |
//! | `Llama4ForCausalLM` (`llama4_text`; wrapper `Llama4ForConditionalGeneration`) | `Llama4TextConfig`, `Llama4TextAttention`, `Llama4TextMoe` | NoPE layers, chunked attention, L2 q/k norm, temperature tuning, experts (`SigmoidInput`, fused `[in, out]`) on `moe_layers` with an ungated shared expert, dense FFN `intermediate_size_mlp` |
//! | `Glm4MoeForCausalLM` | `Glm4MoeConfig`, `Glm4MoeAttention`, `Glm4MoeTopkRouter` | q/k/v biases, q/k norms (`use_qk_norm`), partial rotary 0.5, experts (`GroupedSigmoid`, `e_score_correction_bias`) after `first_k_dense_replace` dense layers, ungated shared experts |

use std::path::Path;

use serde_json::{Map, Value};

use crate::LoadError;
use crate::arch::{self, ActivationRule, Arch, BiasRule, DenseRule, HfRouting, SeqCap, SoftCaps, WindowRule};
use crate::rope_values::{RopeParam, check_rope_values};
use qdrift_weights::{
    Activation, ArchShape, AttnTemperature, BlockSpec, LayerAttention, ModelArch, MoeSpec, NormStyle, RopeScaling,
    Routing,
};

/// Architectures [`read_hf_folder`](crate::read_hf_folder) reads, as `config.json` names them.
pub const SUPPORTED_ARCHITECTURES: &str = "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, \
     Qwen3ForCausalLM, Qwen3MoeForCausalLM, Qwen2MoeForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, Phi3ForCausalLM, \
     MixtralForCausalLM, GptOssForCausalLM, SmolLM3ForCausalLM, Llama4ForCausalLM, Glm4MoeForCausalLM";

/// Which attention biases a layer has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttnBias {
    /// None.
    None,
    /// `q_proj`, `k_proj`, `v_proj` (Qwen2).
    Qkv,
    /// All four (`attention_bias: true`; gpt-oss's default).
    Qkvo,
}

/// A multimodal wrapper (`…ForConditionalGeneration`) whose language model qdrift reads.
#[derive(Debug, Clone)]
pub(crate) struct Wrapper {
    /// `architectures[0]`: the wrapper's class.
    pub(crate) class: String,
    /// The class of its language model, as `config.json` would name it alone.
    pub(crate) text_class: &'static str,
}

/// The language model's configuration of a multimodal wrapper qdrift reads (its
/// `architectures[0]` is a wrapper of an entry of [`arch::ARCHITECTURES`]): the `text_config` object, named by
/// the text class, with the wrapper's `tie_word_embeddings` and special token ids where the
/// `text_config` has none; `None` for any other `config.json` (a wrapper qdrift does not read is
/// refused by [`parse_config`]).
pub(crate) fn language_model_config(path: &Path, c: &Value) -> Result<Option<(Value, Wrapper)>, LoadError> {
    let arch0 = c.get("architectures").and_then(Value::as_array).and_then(|a| a.first()).and_then(Value::as_str);
    let Some((class, entry)) = arch0.and_then(|a| Some((a, arch::by_wrapper(a)?))) else {
        return Ok(None);
    };
    let text_class = entry.hf_class;
    let Some(text) = c.get("text_config").and_then(Value::as_object) else {
        return Err(LoadError::invalid(
            path,
            format!(
                "architectures[0] is {class}, a multimodal wrapper, but its text_config is missing or not an object"
            ),
        ));
    };
    let mut text = text.clone();
    for key in ["tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id"] {
        if let Some(v) = c.get(key)
            && text.get(key).is_none_or(Value::is_null)
        {
            text.insert(key.to_string(), v.clone());
        }
    }
    text.insert("architectures".to_string(), Value::from(vec![text_class]));
    Ok(Some((Value::Object(text), Wrapper { class: class.to_string(), text_class })))
}

/// What `config.json` says: the architecture and how the reader finds its tensors.
#[derive(Debug, Clone)]
pub(crate) struct HfArch {
    /// The architecture.
    pub(crate) arch: ModelArch,
    /// The architecture's entry, which names the tensors.
    pub(crate) entry: Arch,
    /// The attention biases the checkpoint stores.
    pub(crate) attn_bias: AttnBias,
}

/// `config.json`'s fields, read with `transformers`' defaults; errors name the file.
struct Config<'a> {
    path: &'a Path,
    c: &'a Value,
}

impl Config<'_> {
    fn bad(&self, m: String) -> LoadError {
        LoadError::invalid(self.path, m)
    }

    /// A non-negative integer, else `default` (absent or `null`); missing without a default is an
    /// error.
    fn int(&self, key: &str, default: Option<usize>) -> Result<usize, LoadError> {
        match self.get(key) {
            None => default.ok_or_else(|| self.bad(format!("{key} is missing"))),
            Some(v) => as_int(v).ok_or_else(|| self.bad(format!("{key} is {v}, not a non-negative integer"))),
        }
    }

    /// An optional non-negative integer: `default` when absent, `None` when `null`.
    fn opt_int(&self, key: &str, default: Option<usize>) -> Result<Option<usize>, LoadError> {
        match self.c.get(key) {
            None => Ok(default),
            Some(Value::Null) => Ok(None),
            Some(v) => as_int(v).map(Some).ok_or_else(|| self.bad(format!("{key} is {v}, not a non-negative integer"))),
        }
    }

    /// A number, else `default` (absent or `null`).
    fn float(&self, key: &str, default: f32) -> Result<f32, LoadError> {
        Ok(self.opt_float(key, Some(default))?.unwrap_or(default))
    }

    /// An optional number: `default` when absent, `None` when `null`.
    fn opt_float(&self, key: &str, default: Option<f32>) -> Result<Option<f32>, LoadError> {
        match self.c.get(key) {
            None => Ok(default),
            Some(Value::Null) => Ok(None),
            Some(v) => {
                v.as_f64().map(|f| Some(f as f32)).ok_or_else(|| self.bad(format!("{key} is {v}, not a number")))
            }
        }
    }

    /// True only when the key is `true`.
    fn flag(&self, key: &str) -> bool {
        self.c.get(key).and_then(Value::as_bool) == Some(true)
    }

    /// A boolean, else `default` (absent, `null` or not a boolean).
    fn bool_or(&self, key: &str, default: bool) -> bool {
        self.c.get(key).and_then(Value::as_bool).unwrap_or(default)
    }

    /// A present, non-`null` value.
    fn get(&self, key: &str) -> Option<&Value> {
        self.c.get(key).filter(|v| !v.is_null())
    }

    /// A present, non-`null` string.
    fn str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }
}

fn as_int(v: &Value) -> Option<usize> {
    v.as_u64().and_then(|v| usize::try_from(v).ok())
}

/// The hyper-parameters of `config.json`: refused features → class → shapes (`num_hidden_layers`
/// checked against the `tensor_count` tensors the safetensors files hold before anything per
/// layer is allocated) → RoPE → block → windows → experts.
pub(crate) fn parse_config(path: &Path, c: &Value, tensor_count: usize) -> Result<HfArch, LoadError> {
    let config = Config { path, c };
    // The features first, so that an unsupported class with one is refused naming the feature.
    let entry = config_class(&config);
    refuse_features(&config, entry.as_ref().ok().copied())?;
    let entry = entry?;
    let dim = config.int("hidden_size", None)?;
    let n_heads = config.int("num_attention_heads", None)?;
    // `getattr(config, "head_dim", None) or hidden_size // num_attention_heads`.
    let head_dim = match config.int("head_dim", Some(0))? {
        0 => dim.checked_div(n_heads).unwrap_or(0),
        h => h,
    };
    let n_layers = config.int("num_hidden_layers", None)?;
    check_layer_count(&config, entry, n_layers, tensor_count)?;
    let (activation, attn_bias) = check_options(&config, entry)?;
    let max_seq_len = max_seq_len(&config, entry)?;
    let rope = rope(&config, entry, head_dim, max_seq_len)?;
    let features = &entry.block;
    let gemma = features.gemma_norms;
    let block = BlockSpec {
        norm: if gemma { NormStyle::OnePlusWeight } else { NormStyle::Weight },
        sandwich_norms: gemma,
        qk_norm: features.qk_norm || features.qk_norm_key.is_some_and(|k| config.flag(k)),
        rotary_dim: rope.rotary_dim.filter(|&r| r != head_dim),
        // Gemma2Attention/Gemma3Attention: `scaling = query_pre_attn_scalar ** -0.5`.
        attn_scale: if gemma {
            Some(f64::from(config.float("query_pre_attn_scalar", 256.0)?).powf(-0.5) as f32)
        } else {
            None
        },
        // Gemma 3 stores attn_logit_softcapping but its attention (5.25) never applies it.
        attn_softcap: if features.softcaps == SoftCaps::AttnAndFinal {
            config.opt_float("attn_logit_softcapping", Some(50.0))?
        } else {
            None
        },
        sinks: features.sinks,
        activation,
    };
    let final_logit_softcap = match features.softcaps {
        SoftCaps::AttnAndFinal => config.opt_float("final_logit_softcapping", Some(30.0))?,
        SoftCaps::Final => config.opt_float("final_logit_softcapping", None)?,
        SoftCaps::None => None,
    };
    let shape = ArchShape {
        dim,
        hidden_dim: config.int(entry.hf.dense_width, None)?,
        n_layers,
        n_heads,
        n_kv_heads: config.int("num_key_value_heads", Some(n_heads))?,
        head_dim,
        vocab_size: config.int("vocab_size", None)?,
        max_seq_len,
    };
    let norm_eps = config.float("rms_norm_eps", entry.hf.eps)?;
    let arch = ModelArch {
        norm_eps,
        rope_theta: rope.theta,
        tied_embeddings: config.bool_or("tie_word_embeddings", entry.hf.tied),
        rope_scaling: rope.scaling,
        block,
        windows: windows(&config, entry, n_layers)?,
        local_rope_theta: rope.local_theta,
        // Gemma3TextScaledWordEmbedding: `embed_scale = hidden_size ** 0.5`.
        embedding_scale: gemma.then(|| (dim as f64).sqrt() as f32),
        final_logit_softcap,
        moe: moe(&config, entry, n_layers)?,
        layer_attention: layer_attention(&config, entry, n_layers, norm_eps)?,
        ..ModelArch::new(entry.hf_class, shape)
    };
    arch.validate().map_err(|e| config.bad(format!("inconsistent hyper-parameters: {e}")))?;
    check_rope(&config, &rope.field, &arch)?;
    check_sizes(&config, &arch)?;
    Ok(HfArch { arch, entry, attn_bias })
}

/// Refuses RoPE parameters whose derived inverse frequencies are not finite and positive
/// ([`check_rope_values`]), naming the key of `config.json`'s rope dict `field` they come from;
/// `validate` has checked each parameter alone.
fn check_rope(config: &Config<'_>, field: &str, a: &ModelArch) -> Result<(), LoadError> {
    let bad = |key: String, describe: String| config.bad(format!("{key} {describe}"));
    check_rope_values(a.rope_theta, a.rotary_dim(), a.rope_scaling.as_ref()).map_err(|b| {
        let key = match b.param {
            RopeParam::Theta => "rope_theta".to_string(),
            RopeParam::Factor => format!("{field}.factor"),
            RopeParam::ShortFactor(i) => format!("{field}.short_factor[{i}]"),
            RopeParam::LongFactor(i) => format!("{field}.long_factor[{i}]"),
            // Per-pair divisors come from GGUF files only.
            RopeParam::FreqFactor(i) => format!("{field} divisor {i}"),
        };
        bad(key, b.describe())
    })?;
    match a.local_rope_theta {
        Some(theta) => check_rope_values(theta, a.rotary_dim(), None)
            .map_err(|b| bad("the sliding-window layers' rope_theta (rope_local_base_freq)".into(), b.describe())),
        None => Ok(()),
    }
}

/// Refuses hyper-parameters whose tensor sizes overflow `usize`: the reader computes the shapes
/// it expects (fused `[q; k; v]` and `[gate; up]` rows, gpt-oss's `[E, dim, 2I]` experts) before
/// the files confirm them.
fn check_sizes(config: &Config<'_>, a: &ModelArch) -> Result<(), LoadError> {
    let m = |x: usize, y: usize| x.checked_mul(y);
    let q = m(a.n_heads, a.head_dim);
    let kv = m(a.n_kv_heads, a.head_dim);
    let sizes = [
        q.and_then(|q| kv.and_then(|kv| m(2, kv)).and_then(|kv2| q.checked_add(kv2))).and_then(|r| m(r, a.dim)),
        a.moe.as_ref().and_then(|e| e.shared_expert_hidden).map_or(Some(0), |h| m(3, h).and_then(|h| m(h, a.dim))),
        m(2, a.hidden_dim).and_then(|h| m(h, a.dim)),
        m(a.vocab_size, a.dim),
        a.moe
            .as_ref()
            .map_or(Some(0), |e| m(2, e.expert_hidden).and_then(|h| m(h, a.dim)).and_then(|h| m(h, e.n_experts))),
    ];
    if sizes.iter().any(Option::is_none) {
        return Err(config.bad(
            "hyper-parameters overflow: the tensor sizes they imply (heads × head_dim × hidden_size, \
             intermediate_size × hidden_size, experts) do not fit in memory addresses"
                .into(),
        ));
    }
    Ok(())
}

/// Refuses a `num_hidden_layers` the safetensors files cannot hold, before anything per layer
/// is allocated (an absurd count would otherwise abort the process on allocation).
fn check_layer_count(config: &Config<'_>, entry: Arch, n_layers: usize, present: usize) -> Result<(), LoadError> {
    let per_layer = entry.hf.min_tensors_per_layer;
    if n_layers.checked_mul(per_layer).is_none_or(|needed| needed > present) {
        return Err(config.bad(format!(
            "num_hidden_layers {n_layers} needs at least {per_layer} tensors per layer but the safetensors files \
             hold {present} tensors in all"
        )));
    }
    Ok(())
}

/// Refuses, by name, the features of today's checkpoints that qdrift cannot compute, whatever
/// the class (`entry`, when it is one qdrift reads): they are checked before an unsupported class
/// is refused, so that the message names the feature.
fn refuse_features(config: &Config<'_>, entry: Option<Arch>) -> Result<(), LoadError> {
    let refuse = |feature: &str, field: &str| {
        Err(config.bad(format!("{feature} ({field}) is not supported; qdrift reads {SUPPORTED_ARCHITECTURES}")))
    };
    let arch0 = config.get("architectures").and_then(Value::as_array).and_then(|a| a.first()).and_then(Value::as_str);
    if config.get("text_config").is_some() || config.get("vision_config").is_some() {
        let field = if config.get("text_config").is_some() { "text_config" } else { "vision_config" };
        let read: Vec<&str> = arch::ARCHITECTURES.iter().flat_map(|e| e.wrappers.iter().copied()).collect();
        return refuse(&format!("a multimodal model other than {} (Llama 4, Qwen3.5, ...)", read.join(", ")), field);
    }
    if let Some(a) = arch0.filter(|a| a.ends_with("ForConditionalGeneration")) {
        return refuse("a multimodal model", &format!("architectures[0] = {a}"));
    }
    for key in ["kv_lora_rank", "q_lora_rank"] {
        if config.get(key).is_some() {
            return refuse("DeepSeek's multi-head latent attention (MLA)", key);
        }
    }
    let llama4 = entry.is_some_and(|e| e.block.llama4_attention);
    let known = |t: Option<&str>| {
        matches!(t, Some("full_attention" | "sliding_attention")) || (llama4 && t == Some("chunked_attention"))
    };
    if let Some(types) = config.get("layer_types").and_then(Value::as_array)
        && let Some((i, t)) = types.iter().enumerate().find(|(_, t)| !known(t.as_str()))
    {
        let kind = t.as_str().map_or_else(|| t.to_string(), str::to_string);
        return refuse(
            &format!("{kind} layers (Qwen3-Next/Qwen3.5 linear attention, ...)"),
            &format!("layer_types[{i}]"),
        );
    }
    if let Some(map) = config.c.as_object()
        && let Some(key) = map.keys().find(|k| k.starts_with("linear_") && !map[*k].is_null())
    {
        return refuse("linear-attention layers (Qwen3-Next/Qwen3.5 Gated DeltaNet)", key);
    }
    if config.get("attention_chunk_size").is_some() && !llama4 {
        return refuse("Llama 4's chunked attention", "attention_chunk_size");
    }
    if config.get("no_rope_layers").is_some() && !entry.is_some_and(|e| e.block.nope) {
        return refuse("layers without RoPE (NoPE)", "no_rope_layers");
    }
    // Qwen2-MoE's, Llama 4's and GLM-4.5's shared experts are read (`moe`); the others'
    // (DeepSeek's, Qwen3-Next's) are not.
    for key in [
        "shared_expert_intermediate_size",
        "moe_shared_expert_intermediate_size",
        "n_shared_experts",
        "num_shared_experts",
    ] {
        let rules = entry.and_then(|e| e.moe.as_ref());
        let shared = rules.is_some_and(|m| m.shared_expert.is_some());
        let counted = rules.and_then(|m| m.ungated_shared).and_then(|u| u.count) == Some(key);
        let read = (shared && key == "shared_expert_intermediate_size") || counted;
        if !read && config.get(key).is_some_and(|v| v.as_u64() != Some(0)) {
            return refuse("shared experts", key);
        }
    }
    if config.flag("use_bidirectional_attention") {
        return refuse("bidirectional attention", "use_bidirectional_attention");
    }
    Ok(())
}

/// `architectures[0]`, else the class `model_type` implies; one of [`SUPPORTED_ARCHITECTURES`].
fn config_class(config: &Config<'_>) -> Result<Arch, LoadError> {
    let c = config.c;
    if let Some(a) = c.get("architectures").and_then(Value::as_array).and_then(|a| a.first()).and_then(Value::as_str) {
        return arch::by_class(a)
            .ok_or_else(|| config.bad(format!("unsupported architecture {a}; supported: {SUPPORTED_ARCHITECTURES}")));
    }
    let t = c.get("model_type").and_then(Value::as_str).unwrap_or("(none)");
    arch::by_model_type(t).ok_or_else(|| {
        config.bad(format!(
            "unsupported architecture: no architectures[0] and model_type {t}; supported: {SUPPORTED_ARCHITECTURES}"
        ))
    })
}

/// The FFN's activation and the attention biases, refusing the options the class cannot have:
/// `hidden_act` (Gemma: `hidden_activation`) other than `silu` (Gemma also `gelu_pytorch_tanh`;
/// gpt-oss ignores it: `GptOssExperts` always computes its clamped SwiGLU), Llama's
/// `attention_bias`/`mlp_bias`.
fn check_options(config: &Config<'_>, entry: Arch) -> Result<(Activation, AttnBias), LoadError> {
    let activation = match entry.block.activation {
        ActivationRule::ClampedSwiGlu => Activation::ClampedSwiGlu {
            alpha: config.float("swiglu_alpha", 1.702)?,
            limit: config.float("swiglu_limit", 7.0)?,
        },
        ActivationRule::GeluTanh => match config.str("hidden_activation").unwrap_or("gelu_pytorch_tanh") {
            "gelu_pytorch_tanh" => Activation::GeluTanh,
            "silu" => Activation::SwiGlu,
            act => {
                return Err(config.bad(format!(
                    "hidden_activation {act} is not supported; supported: gelu_pytorch_tanh (GELU-tanh gated), silu \
                     (SwiGLU)"
                )));
            }
        },
        ActivationRule::SwiGlu => match config.str("hidden_act") {
            None | Some("silu") => Activation::SwiGlu,
            Some(act) => {
                return Err(config.bad(format!("hidden_act {act} is not supported; supported: silu (SwiGLU)")));
            }
        },
    };
    let attn_bias = match entry.hf.bias {
        BiasRule::Refused if config.flag("attention_bias") || config.flag("mlp_bias") => {
            return Err(config.bad(format!("attention_bias/mlp_bias = true is not supported for {}", entry.hf_class)));
        }
        BiasRule::Qkv => AttnBias::Qkv,
        // `Qwen2MoeAttention`: q/k/v biases iff `qkv_bias` (true by default), never o's.
        BiasRule::QkvIf(key, default) if config.bool_or(key, default) => AttnBias::Qkv,
        BiasRule::QkvoIf(key, default) if config.bool_or(key, default) => AttnBias::Qkvo,
        _ => AttnBias::None,
    };
    Ok((activation, attn_bias))
}

/// `max_position_embeddings`, capped by Mistral's and Qwen2's sliding window (within the window,
/// sliding-window attention is full causal attention); the newer classes describe their windows
/// per layer ([`windows`]).
fn max_seq_len(config: &Config<'_>, entry: Arch) -> Result<usize, LoadError> {
    let max_seq_len = config.int("max_position_embeddings", Some(entry.hf.max_pos))?;
    let sliding = match entry.hf.seq_cap {
        SeqCap::Always => true,
        SeqCap::IfUseSlidingWindow => config.flag("use_sliding_window"),
        SeqCap::None => false,
    };
    let window = config.c.get("sliding_window").and_then(Value::as_u64).and_then(|w| usize::try_from(w).ok());
    Ok(match window {
        Some(w) if sliding => max_seq_len.min(w),
        _ => max_seq_len,
    })
}

/// Each layer's sliding window (empty when none has one): `layer_types` (`sliding_attention` →
/// `sliding_window`), else the class's default pattern (`Qwen3Config`: layers from
/// `max_window_layers`; `Gemma2Config`, `GptOssConfig`: even layers; `Gemma3TextConfig`: all but
/// every `sliding_window_pattern`-th; `Qwen2MoeConfig`: odd-numbered layers (`(i + 1) % 2`) below
/// `max_window_layers`); Qwen3-MoE, Phi-3 and Mixtral slide in every layer when `sliding_window`
/// is set. Qwen3's, Qwen3-MoE's and Qwen2-MoE's `sliding_window` counts only with
/// `use_sliding_window`.
fn windows(config: &Config<'_>, entry: Arch, n_layers: usize) -> Result<Vec<Option<usize>>, LoadError> {
    let qwen_window = || -> Result<Option<usize>, LoadError> {
        if config.flag("use_sliding_window") { config.opt_int("sliding_window", Some(4096)) } else { Ok(None) }
    };
    let rule = entry.hf.windows;
    let (window, default_sliding): (Option<usize>, Box<dyn Fn(usize) -> bool>) = match rule {
        WindowRule::None => return Ok(Vec::new()),
        WindowRule::QwenFrom => {
            let w = qwen_window()?;
            let from = config.int("max_window_layers", Some(28))?;
            (w, Box::new(move |i| w.is_some() && i >= from))
        }
        WindowRule::QwenAll => {
            let w = qwen_window()?;
            (w, Box::new(move |_| w.is_some()))
        }
        WindowRule::QwenEvenBelow => {
            let w = qwen_window()?;
            let below = config.int("max_window_layers", Some(28))?;
            (w, Box::new(move |i| w.is_some() && (i + 1) % 2 != 0 && i < below))
        }
        WindowRule::AllIfSet => {
            let w = config.opt_int("sliding_window", None)?;
            (w, Box::new(move |_| w.is_some()))
        }
        WindowRule::Alternate(w) => (config.opt_int("sliding_window", Some(w))?, Box::new(|i| (i + 1) % 2 != 0)),
        WindowRule::LayerTypes => (config.opt_int("sliding_window", None)?, Box::new(|_| false)),
        WindowRule::Pattern => {
            // `Gemma3TextConfig.__post_init__`: `sliding_window_pattern` (older configs), which
            // 5.25 saves as `_sliding_window_pattern`; 6 by default.
            let key = if config.get("sliding_window_pattern").is_some() {
                "sliding_window_pattern"
            } else {
                "_sliding_window_pattern"
            };
            let pattern = config.int(key, Some(6))?;
            if pattern == 0 {
                return Err(config.bad(format!("{key} is 0; it must be positive")));
            }
            (config.opt_int("sliding_window", Some(4096))?, Box::new(move |i| (i + 1) % pattern != 0))
        }
    };
    let explicit = rule.reads_layer_types();
    let sliding: Vec<bool> = match config.get("layer_types").and_then(Value::as_array).filter(|_| explicit) {
        Some(types) => {
            if types.len() != n_layers {
                return Err(
                    config.bad(format!("layer_types has {} entries for num_hidden_layers {n_layers}", types.len()))
                );
            }
            types.iter().map(|t| t.as_str() == Some("sliding_attention")).collect()
        }
        None => (0..n_layers).map(default_sliding).collect(),
    };
    if !sliding.contains(&true) {
        return Ok(Vec::new());
    }
    let Some(w) = window else {
        return Err(config.bad(
            "layer_types has sliding_attention layers but sliding_window is null (or use_sliding_window is false); \
             transformers cannot build their mask"
                .into(),
        ));
    };
    Ok(sliding.into_iter().map(|s| s.then_some(w)).collect())
}

/// The mixture of experts: `num_local_experts` (or `num_experts`, which `attribute_map` aliases;
/// GLM-4.5's `n_routed_experts`), `num_experts_per_tok`, the expert width and the routing of the
/// class (`Qwen3MoeTopKRouter`: softmax, top-k, renormalized iff `norm_topk_prob`;
/// `MixtralTopKRouter`: always renormalized; `GptOssTopKRouter`: top-k, then softmax;
/// `Llama4Router`: σ of the top-k, scaling inputs; `Glm4MoeTopkRouter`: [`Routing::GroupedSigmoid`]
/// from `n_group` (default 1), `topk_group` (1), `norm_topk_prob` (true) and
/// `routed_scaling_factor` (1)), the dense layers ([`dense_layers`]) and the shared expert:
/// Qwen2-MoE's (`shared_expert_intermediate_size`, 5632 by default; `Qwen2MoeSparseMoeBlock`
/// always has one, with its sigmoid gate), Llama 4's ungated one as wide as an expert, GLM-4.5's
/// `n_shared_experts` (default 1) times an expert's width (`Glm4MoeMoE`), none when 0.
fn moe(config: &Config<'_>, entry: Arch, n_layers: usize) -> Result<Option<MoeSpec>, LoadError> {
    let Some(rules) = &entry.moe else {
        return Ok(None);
    };
    let routing = match rules.hf_routing {
        HfRouting::NormTopkProb => Routing::SoftmaxTopK { renormalize: config.flag("norm_topk_prob") },
        HfRouting::Renormalized => Routing::SoftmaxTopK { renormalize: true },
        HfRouting::TopKSoftmax => Routing::TopKSoftmax,
        HfRouting::SigmoidInput => Routing::SigmoidInput,
        HfRouting::GroupedSigmoid => Routing::GroupedSigmoid {
            n_group: config.int("n_group", Some(1))?,
            topk_group: config.int("topk_group", Some(1))?,
            renormalize: config.bool_or("norm_topk_prob", true),
            scale: config.float("routed_scaling_factor", 1.0)?,
        },
    };
    let experts_key = experts_key(config.c);
    let n_experts = config.int(experts_key, Some(rules.experts))?;
    let top_k = config.int("num_experts_per_tok", Some(rules.top_k))?;
    let (width_key, default_width) = rules.width;
    let expert_hidden = config.int(width_key, default_width)?;
    let shared_expert_hidden = match (rules.shared_expert, rules.ungated_shared) {
        (Some(default), _) => Some(config.int("shared_expert_intermediate_size", Some(default))?),
        (None, Some(shared)) => {
            let count = match shared.count {
                Some(key) => config.int(key, Some(1))?,
                None => 1,
            };
            match count {
                0 => None,
                n => Some(n.checked_mul(expert_hidden).ok_or_else(|| {
                    config.bad(format!("{width_key} {expert_hidden} × {n} shared experts overflows"))
                })?),
            }
        }
        (None, None) => None,
    };
    let dense_layers = dense_layers(config, rules.dense_layers, n_experts, n_layers)?;
    if dense_layers.len() == n_layers {
        return Ok(None);
    }
    Ok(Some(MoeSpec { n_experts, top_k, expert_hidden, routing, dense_layers, shared_expert_hidden }))
}

/// The key `config.json` gives the number of routed experts under: `num_local_experts`,
/// `num_experts` or `n_routed_experts`, the first present (`num_experts` when none is).
pub(crate) fn experts_key(c: &Value) -> &'static str {
    ["num_local_experts", "num_experts", "n_routed_experts"]
        .into_iter()
        .find(|k| c.get(*k).is_some_and(|v| !v.is_null()))
        .unwrap_or("num_experts")
}

/// The dense layers of a mixture of experts: Qwen3-MoE's and Qwen2-MoE's (`Qwen3MoeDecoderLayer`,
/// `Qwen2MoeDecoderLayer`: experts iff `layer_idx not in mlp_only_layers and num_experts > 0 and
/// (layer_idx + 1) % decoder_sparse_step == 0`), Llama 4's (experts on `moe_layers`, by default
/// `range(interleave_moe_layer_step - 1, num_hidden_layers, interleave_moe_layer_step)`), GLM-4.5's
/// (`layer_idx < first_k_dense_replace`).
fn dense_layers(
    config: &Config<'_>,
    rule: DenseRule,
    n_experts: usize,
    n_layers: usize,
) -> Result<Vec<usize>, LoadError> {
    let list = |key: &str| -> Result<Option<Vec<usize>>, LoadError> {
        match config.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_array()
                .and_then(|a| a.iter().map(as_int).collect::<Option<Vec<_>>>())
                .map(Some)
                .ok_or_else(|| config.bad(format!("{key} is {v}, not a list of layer indices"))),
        }
    };
    let positive = |key: &str| -> Result<usize, LoadError> {
        match config.int(key, Some(1))? {
            0 => Err(config.bad(format!("{key} is 0; it must be positive"))),
            n => Ok(n),
        }
    };
    Ok(match rule {
        DenseRule::None => Vec::new(),
        DenseRule::Qwen => {
            let step = positive("decoder_sparse_step")?;
            let only = list("mlp_only_layers")?.unwrap_or_default();
            (0..n_layers).filter(|&i| only.contains(&i) || n_experts == 0 || (i + 1) % step != 0).collect()
        }
        DenseRule::MoeLayers => {
            let moe_layers = match list("moe_layers")? {
                Some(l) => l,
                None => {
                    let step = positive("interleave_moe_layer_step")?;
                    (step - 1..n_layers).step_by(step).collect()
                }
            };
            (0..n_layers).filter(|i| !moe_layers.contains(i)).collect()
        }
        DenseRule::FirstK(default) => (0..config.int("first_k_dense_replace", Some(default))?.min(n_layers)).collect(),
    })
}

/// SmolLM3's and Llama 4's attention per layer ([`LayerAttention`]): the NoPE layers
/// (`no_rope_layers`, 1 for RoPE; when absent or empty, `SmolLM3Config`'s and
/// `Llama4TextConfig`'s default: layer `i` rotates iff `(i + 1) % no_rope_layer_interval != 0`,
/// interval 4); Llama 4's chunked layers (`layer_types`' `chunked_attention`, by default the RoPE
/// layers when `attention_chunk_size` (default 8192) is not null), its L2 q/k norm (`use_qk_norm`,
/// default true, with `rms_norm_eps`) and its temperature tuning (`attn_temperature_tuning`,
/// default true; `floor_scale` 8192, `attn_scale` 0.1).
fn layer_attention(config: &Config<'_>, entry: Arch, n_layers: usize, eps: f32) -> Result<LayerAttention, LoadError> {
    let mut la = LayerAttention::default();
    if !entry.block.nope {
        return Ok(la);
    }
    let given = config.get("no_rope_layers").filter(|v| v.as_array().is_none_or(|a| !a.is_empty()));
    let rope: Vec<bool> = match given {
        Some(v) => v
            .as_array()
            .and_then(|a| a.iter().map(|x| as_int(x).map(|i| i != 0)).collect::<Option<Vec<_>>>())
            .ok_or_else(|| config.bad(format!("no_rope_layers is {v}, not a list of 0s and 1s")))?,
        None => {
            let every = config.int("no_rope_layer_interval", Some(4))?;
            if every == 0 {
                return Err(config.bad("no_rope_layer_interval is 0; it must be positive".into()));
            }
            (0..n_layers).map(|i| (i + 1) % every != 0).collect()
        }
    };
    if rope.len() != n_layers {
        return Err(config.bad(format!("no_rope_layers has {} entries for num_hidden_layers {n_layers}", rope.len())));
    }
    if !entry.block.llama4_attention {
        if rope.contains(&false) {
            la.rope = rope;
        }
        return Ok(la);
    }
    let chunk = config.opt_int("attention_chunk_size", Some(8192))?;
    let chunked: Vec<bool> = match config.get("layer_types").and_then(Value::as_array) {
        Some(types) if types.len() != n_layers => {
            return Err(config.bad(format!("layer_types has {} entries for num_hidden_layers {n_layers}", types.len())));
        }
        Some(types) => types.iter().map(|t| t.as_str() == Some("chunked_attention")).collect(),
        None => rope.iter().map(|&r| r && chunk.is_some()).collect(),
    };
    if chunked.contains(&true) {
        let Some(chunk) = chunk.filter(|&c| c > 0) else {
            return Err(
                config.bad("layer_types has chunked_attention layers but attention_chunk_size is null or 0".into())
            );
        };
        la.chunks = chunked.iter().map(|&c| c.then_some(chunk)).collect();
    }
    if rope.contains(&false) {
        la.rope = rope;
    }
    if config.bool_or("use_qk_norm", true) {
        la.qk_l2_norm = Some(eps);
    }
    if config.bool_or("attn_temperature_tuning", true) {
        // `ModelArch::validate` refuses a floor_scale that is not positive.
        let floor_scale = config.float("floor_scale", 8192.0)?;
        la.temperature = Some(AttnTemperature { floor_scale, attn_scale: config.float("attn_scale", 0.1)? });
    }
    Ok(la)
}

/// RoPE as `config.json` gives it: the (global) theta and scaling, the rotated dimensions of a
/// head, and Gemma 3's local theta; `field` names the dict the scaling came from (in messages).
struct Rope {
    field: String,
    theta: f32,
    scaling: Option<RopeScaling>,
    rotary_dim: Option<usize>,
    local_theta: Option<f32>,
}

/// RoPE, as `RotaryEmbeddingConfigMixin.convert_rope_params_to_dict` and
/// `standardize_rope_params` settle it: the dict is `rope_scaling` (older configs) or
/// `rope_parameters` (5.x), its `rope_theta` else the top-level `rope_theta` else the class's
/// `default_theta`, its `partial_rotary_factor` else the top-level one; Gemma 3 has one dict per
/// layer type ([`gemma3_rope`]).
fn rope(config: &Config<'_>, entry: Arch, head_dim: usize, max_pos: usize) -> Result<Rope, LoadError> {
    if let Some(local) = entry.block.local_rope_theta {
        return gemma3_rope(config, entry, head_dim, max_pos, local);
    }
    let (field, mut dict) = match (config.get("rope_scaling"), config.get("rope_parameters")) {
        (Some(r), _) => ("rope_scaling", object(config, "rope_scaling", r)?),
        (None, Some(r)) => ("rope_parameters", object(config, "rope_parameters", r)?),
        // The config class's default (GptOssConfig.__post_init__'s).
        (None, None) if entry.hf.default_rope.is_some() => (
            "rope_parameters",
            entry
                .hf
                .default_rope
                .and_then(|j| serde_json::from_str::<Value>(j).ok())
                .and_then(|v| v.as_object().cloned())
                .unwrap_or_default(),
        ),
        (None, None) => ("rope_parameters", Map::new()),
    };
    for key in ["rope_theta", "partial_rotary_factor"] {
        if dict.get(key).is_none_or(Value::is_null)
            && let Some(v) = config.get(key)
        {
            dict.insert(key.to_string(), v.clone());
        }
    }
    let theta = number(&dict, "rope_theta").map_err(|m| config.bad(format!("{field}: {m}")))?.unwrap_or(entry.hf.theta);
    let mut kind = rope_kind(&dict);
    // Phi3Config.convert_rope_params_to_dict renames the older `su` and `yarn` to `longrope`.
    if entry.block.partial_rotary && matches!(kind, "su" | "yarn") {
        kind = "longrope";
    }
    let rotary_dim = rotary_dim(config, entry, field, &dict, kind, head_dim)?;
    let scaling = parse_rope_scaling(config, entry, &dict, &dict, kind, max_pos)
        .map_err(|m| config.bad(format!("{field}: {m}")))?;
    Ok(Rope { field: field.to_string(), theta: theta as f32, scaling, rotary_dim, local_theta: None })
}

/// Gemma 3's RoPE (`Gemma3TextConfig.convert_rope_params_to_dict`): `rope_parameters` nested by
/// layer type; an older config's `rope_scaling` updates the `full_attention` one, its `rope_theta`
/// (default 1e6) and `rope_local_base_freq` (default 1e4) are the two thetas. The sliding-window
/// layers must be unscaled ([`ModelArch::layer_rope`]).
fn gemma3_rope(
    config: &Config<'_>,
    entry: Arch,
    head_dim: usize,
    max_pos: usize,
    local_default: f32,
) -> Result<Rope, LoadError> {
    let outer = match config.get("rope_parameters") {
        Some(r) => object(config, "rope_parameters", r)?,
        None => Map::new(),
    };
    let nested = |key: &str| -> Result<Map<String, Value>, LoadError> {
        match outer.get(key).filter(|v| !v.is_null()) {
            Some(r) => object(config, &format!("rope_parameters.{key}"), r),
            None => Ok(serde_json::json!({"rope_type": "default"}).as_object().cloned().unwrap_or_default()),
        }
    };
    let mut full = nested("full_attention")?;
    if let Some(r) = config.get("rope_scaling") {
        full.extend(object(config, "rope_scaling", r)?);
    }
    let mut local = nested("sliding_attention")?;
    for (dict, key) in [(&mut full, "rope_theta"), (&mut local, "rope_local_base_freq")] {
        if dict.get("rope_theta").is_none_or(Value::is_null)
            && let Some(v) = config.get(key)
        {
            dict.insert("rope_theta".to_string(), v.clone());
        }
    }
    let field = "rope_parameters.full_attention";
    let theta = number(&full, "rope_theta").map_err(|m| config.bad(format!("{field}: {m}")))?.unwrap_or(entry.hf.theta);
    let local_theta = number(&local, "rope_theta")
        .map_err(|m| config.bad(format!("rope_parameters.sliding_attention: {m}")))?
        .unwrap_or(f64::from(local_default));
    let local_kind = rope_kind(&local);
    if local_kind != "default" {
        return Err(config.bad(format!(
            "rope_parameters.sliding_attention: RoPE scaling type {local_kind} on the sliding-window layers is not \
             supported; supported: default"
        )));
    }
    let kind = rope_kind(&full);
    let rotary_dim = rotary_dim(config, entry, field, &full, kind, head_dim)?;
    let scaling = parse_rope_scaling(config, entry, &full, &outer, kind, max_pos)
        .map_err(|m| config.bad(format!("{field}: {m}")))?;
    Ok(Rope {
        field: field.to_string(),
        theta: theta as f32,
        scaling,
        rotary_dim,
        local_theta: Some(local_theta as f32),
    })
}

fn object(config: &Config<'_>, field: &str, v: &Value) -> Result<Map<String, Value>, LoadError> {
    v.as_object().cloned().ok_or_else(|| config.bad(format!("{field} is {v}, not an object")))
}

/// `rope_type`, else the older `type`, else `default`.
fn rope_kind(dict: &Map<String, Value>) -> &str {
    dict.get("rope_type").or_else(|| dict.get("type")).and_then(Value::as_str).unwrap_or("default")
}

/// A number of a rope dict; `None` when absent or `null`.
fn number(dict: &Map<String, Value>, key: &str) -> Result<Option<f64>, String> {
    match dict.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| format!("{key} is {v}, not a number")),
    }
}

/// The rotated dimensions of a head, `int(head_dim * partial_rotary_factor)`, when
/// `transformers` rotates a part only: Phi-3 and GLM-4.5 (whose factor defaults to 0.5,
/// `Glm4MoeConfig.__post_init__`) always read the factor (`Phi3RotaryEmbedding`,
/// `apply_rotary_pos_emb` rotates `q[..., :rot]`); the other classes' default RoPE ignores it, and
/// their scaled RoPE would rotate fewer dimensions than their `apply_rotary_pos_emb` multiplies, which
/// fails in `transformers`, so it is refused.
fn rotary_dim(
    config: &Config<'_>,
    entry: Arch,
    field: &str,
    dict: &Map<String, Value>,
    kind: &str,
    head_dim: usize,
) -> Result<Option<usize>, LoadError> {
    let factor = number(dict, "partial_rotary_factor").map_err(|m| config.bad(format!("{field}: {m}")))?;
    let Some(factor) = factor.or(entry.block.partial_factor).filter(|&f| f != 1.0) else {
        return Ok(None);
    };
    if !entry.block.partial_rotary && entry.block.partial_factor.is_none() {
        if kind == "default" {
            return Ok(None);
        }
        return Err(config.bad(format!(
            "{field}: partial rotary (partial_rotary_factor {factor}) with RoPE scaling type {kind} is not supported \
             for this class; transformers rotates whole heads there"
        )));
    }
    if !(factor > 0.0 && factor <= 1.0) {
        return Err(config.bad(format!("{field}: partial_rotary_factor {factor} must be in (0, 1]")));
    }
    // Python's `int()` truncates; the product is at most head_dim.
    Ok(Some((head_dim as f64 * factor) as usize))
}

/// `original_max_position_embeddings` of a `llama3`/`yarn` dict, as `standardize_rope_params`
/// settles it: the top-level config field when present (Phi-3 saves it there), else the dict's,
/// else `max_position_embeddings`.
fn original_max(config: &Config<'_>, r: &Map<String, Value>, max_pos: usize) -> Result<usize, String> {
    let v = config
        .get("original_max_position_embeddings")
        .or_else(|| r.get("original_max_position_embeddings").filter(|v| !v.is_null()));
    match v {
        None => Ok(max_pos),
        Some(v) => {
            as_int(v).ok_or_else(|| format!("original_max_position_embeddings is {v}, not a non-negative integer"))
        }
    }
}

/// The scaling of a rope dict of `transformers`' `modeling_rope_utils.py` (`ROPE_INIT_FUNCTIONS`):
/// `default` (plain RoPE, `None`), `llama3` (`_compute_llama3_parameters`), `linear`
/// (`_compute_linear_scaling_rope_parameters`), `yarn` (`_compute_yarn_parameters`, whose
/// `truncate` is read from `outer`, the config's whole `rope_parameters`), `longrope`
/// (`_compute_longrope_parameters`, [`longrope`]).
fn parse_rope_scaling(
    config: &Config<'_>,
    entry: Arch,
    r: &Map<String, Value>,
    outer: &Map<String, Value>,
    kind: &str,
    max_pos: usize,
) -> Result<Option<RopeScaling>, String> {
    let num = |k: &str| number(r, k)?.ok_or_else(|| format!("{k} is missing or not a number"));
    match kind {
        "default" => Ok(None),
        "llama3" => Ok(Some(RopeScaling::Llama3 {
            factor: num("factor")? as f32,
            low_freq_factor: num("low_freq_factor")? as f32,
            high_freq_factor: num("high_freq_factor")? as f32,
            original_max_position_embeddings: original_max(config, r, max_pos)?,
        })),
        "linear" => Ok(Some(RopeScaling::Linear { factor: num("factor")? as f32 })),
        "yarn" => yarn(config, r, outer, max_pos).map(Some),
        "longrope" => longrope(config, entry, r, max_pos).map(Some),
        _ => Err(format!(
            "type {kind} is not supported (RoPE scaling {kind}); supported: default, linear, llama3, yarn, longrope"
        )),
    }
}

/// LongRoPE's parameters (`_compute_longrope_parameters`, `_validate_longrope_rope_parameters`):
/// `short_factor` and `long_factor` (lists of numbers; their length, `rotary_dim / 2`, is checked
/// by [`ModelArch::validate`]), `original_max_position_embeddings` and `attention_factor`, else
/// `√(1 + ln(factor) / ln(original_max_position_embeddings))` (1 when `factor ≤ 1`), where
/// `factor` is the dict's, else `max_position_embeddings / original_max_position_embeddings`.
///
/// `original_max_position_embeddings` is as `standardize_rope_params` settles it: the config's
/// top-level field when the config has that attribute, which `Phi3Config` always has (default
/// 4096, and the dict's value is then overwritten); for other classes, the top-level field, else
/// the dict's, else `max_position_embeddings`.
fn longrope(config: &Config<'_>, entry: Arch, r: &Map<String, Value>, max_pos: usize) -> Result<RopeScaling, String> {
    let original = if entry.block.partial_rotary {
        match config.c.get("original_max_position_embeddings") {
            None => 4096,
            Some(v) => as_int(v)
                .ok_or_else(|| format!("original_max_position_embeddings is {v}, not a non-negative integer"))?,
        }
    } else {
        original_max(config, r, max_pos)?
    };
    if original == 0 {
        return Err("original_max_position_embeddings is 0; it must be positive".into());
    }
    let factors = |key: &str| -> Result<Vec<f32>, String> {
        let v = r.get(key).filter(|v| !v.is_null()).ok_or_else(|| format!("{key} is missing (LongRoPE needs it)"))?;
        v.as_array()
            .and_then(|a| a.iter().map(|x| x.as_f64().map(|f| f as f32)).collect::<Option<Vec<f32>>>())
            .ok_or_else(|| format!("{key} is {v}, not a list of numbers"))
    };
    let (short_factor, long_factor) = (factors("short_factor")?, factors("long_factor")?);
    let factor = number(r, "factor")?.unwrap_or(max_pos as f64 / original as f64);
    let attention_factor = match number(r, "attention_factor")? {
        Some(a) => a,
        None if factor <= 1.0 => 1.0,
        None => (1.0 + factor.ln() / (original as f64).ln()).sqrt(),
    };
    if !(attention_factor > 0.0 && attention_factor.is_finite()) {
        return Err(format!(
            "attention_factor {attention_factor} (LongRoPE, factor {factor}, original_max_position_embeddings \
             {original}) must be positive and finite"
        ));
    }
    Ok(RopeScaling::LongRope {
        short_factor,
        long_factor,
        original_max_position_embeddings: original,
        attention_factor: attention_factor as f32,
    })
}

/// YaRN's parameters, with `attention_factor` computed as `_compute_yarn_parameters` does when
/// the dict has none: `get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)` when both
/// are set and non-zero, else `get_mscale(factor)`, where `get_mscale(s, m) = 0.1·m·ln(s) + 1`
/// (1 for `s ≤ 1`). `factor` defaults to `max_position_embeddings /
/// original_max_position_embeddings`, `beta_fast`/`beta_slow` to 32/1 (also when 0: Python's
/// `or`), `truncate` to true.
fn yarn(
    config: &Config<'_>,
    r: &Map<String, Value>,
    outer: &Map<String, Value>,
    max_pos: usize,
) -> Result<RopeScaling, String> {
    let original = original_max(config, r, max_pos)?;
    if original == 0 {
        return Err("original_max_position_embeddings is 0; it must be positive".into());
    }
    let factor = number(r, "factor")?.unwrap_or(max_pos as f64 / original as f64);
    let mscale_fn = |s: f64, m: f64| if s <= 1.0 { 1.0 } else { 0.1 * m * s.ln() + 1.0 };
    let truthy = |k: &str| -> Result<Option<f64>, String> { Ok(number(r, k)?.filter(|&v| v != 0.0)) };
    let attention_factor = match (number(r, "attention_factor")?, truthy("mscale")?, truthy("mscale_all_dim")?) {
        (Some(a), _, _) => a,
        (None, Some(m), Some(m_all)) => mscale_fn(factor, m) / mscale_fn(factor, m_all),
        _ => mscale_fn(factor, 1.0),
    };
    let truncate = match outer.get("truncate") {
        None | Some(Value::Null) => true,
        Some(v) => v.as_bool().ok_or_else(|| format!("truncate is {v}, not a boolean"))?,
    };
    Ok(RopeScaling::Yarn {
        factor: factor as f32,
        beta_fast: truthy("beta_fast")?.unwrap_or(32.0) as f32,
        beta_slow: truthy("beta_slow")?.unwrap_or(1.0) as f32,
        original_max_position_embeddings: original,
        truncate,
        attention_factor: attention_factor as f32,
    })
}

#[cfg(test)]
mod tests {
    /// [`super::SUPPORTED_ARCHITECTURES`] lists the table's classes, in its order.
    #[test]
    fn supported_architectures_are_the_tables() {
        let classes: Vec<&str> = crate::arch::ARCHITECTURES.iter().map(|e| e.hf_class).collect();
        let listed: Vec<&str> = super::SUPPORTED_ARCHITECTURES.split(',').map(str::trim).collect();
        assert_eq!(listed, classes);
    }
}
