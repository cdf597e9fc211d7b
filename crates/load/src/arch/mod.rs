//! One table of the architectures qdrift reads and writes ([`ARCHITECTURES`], in `table.rs`):
//! each family is one [`ArchEntry`] holding its names (`config.json`'s class and `model_type`,
//! its multimodal wrappers, GGUF's `general.architecture`), its block features, the defaults and
//! rules its `config.json` is read with, its mixture of experts and how GGUF stores it. The
//! Hugging Face reader (`hf/config.rs`, `hf/read.rs`), the GGUF reader (`gguf/arch.rs`) and the
//! GGUF writer (`gguf/write_arch.rs`) look entries up and follow their fields; none of them
//! names a family. Adding a family is one entry in `table.rs` plus its tests, as long as its
//! rules are among the ones below; a new rule is a new variant here and its reading in the
//! module that follows it.

mod table;

pub(crate) use table::ARCHITECTURES;

use qdrift_weights::{Activation, Routing};

/// An architecture of the table.
pub(crate) type Arch = &'static ArchEntry;

/// One architecture: everything the readers and the writer need to know about it.
#[derive(Debug)]
pub(crate) struct ArchEntry {
    /// `config.json`'s `architectures[0]`; the name a model read from it reports.
    pub(crate) hf_class: &'static str,
    /// `config.json`'s `model_type`, read when `architectures` is absent.
    pub(crate) model_type: &'static str,
    /// The multimodal wrappers (`…ForConditionalGeneration`) whose language model this is.
    pub(crate) wrappers: &'static [&'static str],
    /// What the block computes beyond Llama's.
    pub(crate) block: Block,
    /// How `config.json` is read.
    pub(crate) hf: HfRules,
    /// The mixture of experts, for the families that have one.
    pub(crate) moe: Option<MoeRules>,
    /// How GGUF stores it.
    pub(crate) gguf: GgufRules,
}

/// The block features of a family.
#[derive(Debug)]
pub(crate) struct Block {
    /// Gemma's block: `(1 + w)` RMSNorm in `transformers`, four norms per block
    /// (`post_attention_layernorm`, `pre_feedforward_layernorm`, `post_feedforward_layernorm`;
    /// GGUF `post_attention_norm`, `post_ffw_norm`), a √dim embedding scale, the
    /// `query_pre_attn_scalar` attention scale, a tied output by default.
    pub(crate) gemma_norms: bool,
    /// Per-head q/k RMSNorms.
    pub(crate) qk_norm: bool,
    /// gpt-oss's block: attention sinks, an attention output bias, router and expert biases; in
    /// GGUF the pre-FFN norm stored as `post_attention_norm` and the head width from
    /// `rope.dimension_count`.
    pub(crate) sinks: bool,
    /// Phi-3's fused projections: `qkv_proj` (q‖k‖v rows, GGUF `attn_qkv`) and `gate_up_proj`
    /// (gate‖up, GGUF `ffn_up`); the q projection is then `dim` wide.
    pub(crate) fused: bool,
    /// Phi-3's RoPE: `partial_rotary_factor` read, LongRoPE (older `su`/`yarn` read as it, GGUF
    /// `rope_factors_{long,short}`).
    pub(crate) partial_rotary: bool,
    /// GLM-4.5's partial rotary: the default of `partial_rotary_factor` (read from the rope dict
    /// or the top level) for a family whose default RoPE rotates the first
    /// `int(head_dim · factor)` dimensions of each head, rotate-half.
    pub(crate) partial_factor: Option<f64>,
    /// The `config.json` flag that adds per-head q/k RMSNorms (GLM-4.5's `use_qk_norm`).
    pub(crate) qk_norm_key: Option<&'static str>,
    /// SmolLM3's and Llama 4's NoPE layers: `no_rope_layers` (1: RoPE, 0: NoPE), else a NoPE
    /// layer every `no_rope_layer_interval` (default 4) layers.
    pub(crate) nope: bool,
    /// Llama 4's attention: chunked local attention (`attention_chunk_size` on the
    /// `chunked_attention` layers of `layer_types`), the L2 q/k norm (`use_qk_norm`, default true),
    /// temperature tuning (`attn_temperature_tuning`, `floor_scale`, `attn_scale`); its q/k rows
    /// are in the interleaved RoPE layout already (`apply_rotary_emb` rotates adjacent pairs).
    pub(crate) llama4_attention: bool,
    /// Which logit soft caps the family has.
    pub(crate) softcaps: SoftCaps,
    /// Gemma 3's RoPE per layer type: `Some(default)` of the sliding-window layers' base (its
    /// `rope_local_base_freq`, GGUF `rope.freq_base_swa`), those layers unscaled.
    pub(crate) local_rope_theta: Option<f32>,
    /// The FFN activation and where `config.json` names it.
    pub(crate) activation: ActivationRule,
}

/// Logit soft caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SoftCaps {
    /// None.
    None,
    /// Attention logits (default 50) and final logits (default 30), always (Gemma 2).
    AttnAndFinal,
    /// Final logits when the config sets a cap (Gemma 3).
    Final,
}

/// The FFN activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ActivationRule {
    /// SwiGLU; `hidden_act` must be `silu` when given.
    SwiGlu,
    /// `hidden_activation`: `gelu_pytorch_tanh` (the default, GELU-tanh gated) or `silu`; GGUF:
    /// GELU-tanh.
    GeluTanh,
    /// gpt-oss's clamped SwiGLU (`swiglu_alpha`, `swiglu_limit`; GGUF: llama.cpp's constants).
    ClampedSwiGlu,
}

impl ActivationRule {
    /// The activation llama.cpp's graph uses.
    pub(crate) fn gguf(self) -> Activation {
        match self {
            ActivationRule::SwiGlu => Activation::SwiGlu,
            ActivationRule::GeluTanh => Activation::GeluTanh,
            ActivationRule::ClampedSwiGlu => GPT_OSS_ACTIVATION,
        }
    }
}

/// llama.cpp's gpt-oss constants (`llama-graph.cpp` `LLM_FFN_SWIGLU_OAI_MOE`: alpha 1.702, limit 7).
pub(crate) const GPT_OSS_ACTIVATION: Activation = Activation::ClampedSwiGlu { alpha: 1.702, limit: 7.0 };

/// The defaults and rules of a family's `config.json` (its `transformers` config class).
#[derive(Debug)]
pub(crate) struct HfRules {
    /// `rms_norm_eps` when absent.
    pub(crate) eps: f32,
    /// `max_position_embeddings` when absent.
    pub(crate) max_pos: usize,
    /// `rope_theta` when absent (Gemma 3: the global one).
    pub(crate) theta: f64,
    /// The RoPE dict when the config has none, as JSON (gpt-oss's YaRN).
    pub(crate) default_rope: Option<&'static str>,
    /// Tensors every layer has at least (a linear counts one): bounds `num_hidden_layers` by the
    /// files before anything per layer is allocated.
    pub(crate) min_tensors_per_layer: usize,
    /// The attention biases.
    pub(crate) bias: BiasRule,
    /// Whether `sliding_window` caps `max_seq_len` (Mistral's and Qwen2's single window).
    pub(crate) seq_cap: SeqCap,
    /// Which layers slide.
    pub(crate) windows: WindowRule,
    /// Whether the embedding may have rows past the tokenizer (never encoded); else the
    /// vocabularies must match.
    pub(crate) padded_vocab: bool,
    /// `tie_word_embeddings` when absent.
    pub(crate) tied: bool,
    /// The module of the feed-forward layer (`mlp`; Llama 4's `feed_forward`).
    pub(crate) ffn: &'static str,
    /// The key of the dense FFN's width (`intermediate_size`; Llama 4's `intermediate_size_mlp`).
    pub(crate) dense_width: &'static str,
}

/// Which attention biases a layer has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BiasRule {
    /// None; `attention_bias`/`mlp_bias` ignored.
    None,
    /// None; `attention_bias`/`mlp_bias` true is refused (Llama).
    Refused,
    /// q/k/v always (Qwen2).
    Qkv,
    /// q/k/v when the key (default the bool) is true (Qwen2-MoE's `qkv_bias`).
    QkvIf(&'static str, bool),
    /// q/k/v/o when the key (default the bool) is true (`attention_bias`).
    QkvoIf(&'static str, bool),
}

/// Whether `sliding_window` caps `max_seq_len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SeqCap {
    /// Never.
    None,
    /// Always (Mistral).
    Always,
    /// When `use_sliding_window` is true (Qwen2).
    IfUseSlidingWindow,
}

/// Which layers attend through a sliding window when `layer_types` does not say (and whether
/// it may).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WindowRule {
    /// No per-layer windows.
    None,
    /// Qwen3: with `use_sliding_window`, the layers from `max_window_layers` (default 28).
    QwenFrom,
    /// Qwen3-MoE: with `use_sliding_window`, every layer.
    QwenAll,
    /// Qwen2-MoE: with `use_sliding_window`, the even-numbered layers (`(i + 1) % 2`) below
    /// `max_window_layers`.
    QwenEvenBelow,
    /// Every layer when `sliding_window` is set (Phi-3, Mixtral).
    AllIfSet,
    /// Every other layer, the first sliding; `sliding_window` defaults to the value.
    Alternate(usize),
    /// The `sliding_attention` layers of `layer_types`, none without it (SmolLM3).
    LayerTypes,
    /// All but every `sliding_window_pattern`-th (default 6); `sliding_window` default 4096.
    Pattern,
}

impl WindowRule {
    /// Whether `layer_types` is read.
    pub(crate) fn reads_layer_types(self) -> bool {
        !matches!(self, WindowRule::None | WindowRule::QwenAll | WindowRule::AllIfSet)
    }
}

/// A family's mixture of experts.
#[derive(Debug)]
pub(crate) struct MoeRules {
    /// `num_experts` (or `num_local_experts`) when absent.
    pub(crate) experts: usize,
    /// `num_experts_per_tok` when absent.
    pub(crate) top_k: usize,
    /// `transformers`' routing.
    pub(crate) hf_routing: HfRouting,
    /// The key of the expert width, with its default.
    pub(crate) width: (&'static str, Option<usize>),
    /// Which layers are dense.
    pub(crate) dense_layers: DenseRule,
    /// A sigmoid-gated shared expert: the default of `shared_expert_intermediate_size`.
    pub(crate) shared_expert: Option<usize>,
    /// An ungated shared expert (Llama 4's, GLM-4.5's).
    pub(crate) ungated_shared: Option<UngatedShared>,
    /// The checkpoint's expert tensors.
    pub(crate) hf_tensors: ExpertTensors,
    /// llama.cpp's routing (`build_moe_ffn`).
    pub(crate) gguf_routing: Routing,
    /// GGUF's expert width.
    pub(crate) gguf_width: GgufWidth,
}

/// Which layers of a mixture of experts are dense.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DenseRule {
    /// None.
    None,
    /// Qwen's `decoder_sparse_step` and `mlp_only_layers`.
    Qwen,
    /// Llama 4's: all but `moe_layers`, by default every `interleave_moe_layer_step`-th (default
    /// 1) from `step - 1`.
    MoeLayers,
    /// DeepSeek-V3's and GLM-4.5's first `first_k_dense_replace` (default the value).
    FirstK(usize),
}

/// An ungated shared expert, added as it is: `{ffn}.{name}.{gate,up,down}_proj`, as wide as an
/// expert times the `count` key's value (default 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UngatedShared {
    /// The module (`shared_expert`, GLM's `shared_experts`).
    pub(crate) name: &'static str,
    /// The key of the shared experts' count (`n_shared_experts`), when there is one.
    pub(crate) count: Option<&'static str>,
}

/// `transformers`' routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HfRouting {
    /// Softmax, top-k, renormalized iff `norm_topk_prob`.
    NormTopkProb,
    /// Softmax, top-k, renormalized.
    Renormalized,
    /// Top-k, then softmax.
    TopKSoftmax,
    /// Llama 4's `Llama4Router`: σ of the top-k logits, scaling the experts' inputs.
    SigmoidInput,
    /// `Glm4MoeTopkRouter`, `DeepseekV3TopkRouter`: group-limited sigmoid routing (`n_group`,
    /// `topk_group`, `norm_topk_prob`, `routed_scaling_factor`, the router's
    /// `e_score_correction_bias` for selection only).
    GroupedSigmoid,
}

/// How a checkpoint stores the experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExpertTensors {
    /// A router and one module per expert: `{experts}.{e}.{gate,up,down}`.
    PerExpert { router: &'static str, experts: &'static str, proj: [&'static str; 3] },
    /// gpt-oss: `mlp.router` with a bias, 3-D tensors of all experts.
    Fused,
    /// Llama 4: `feed_forward.router`, `feed_forward.experts.gate_up_proj` `[E, dim, 2I]` (gate
    /// columns, then up) and `down_proj` `[E, I, dim]`, both `[in, out]`.
    FusedInOut,
}

/// GGUF's expert width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GgufWidth {
    /// `feed_forward_length` (llama with experts).
    FeedForward,
    /// `expert_feed_forward_length`, else `feed_forward_length / expert_used_count`.
    KeyOrPerExpert,
    /// `expert_feed_forward_length`, required.
    Key,
}

/// How GGUF stores a family.
#[derive(Debug)]
pub(crate) struct GgufRules {
    /// `general.architecture`.
    pub(crate) name: &'static str,
    /// Read and written as the dense `llama`/`qwen2` files always were (no family rules).
    pub(crate) dense: bool,
    /// llama.cpp's `llama`: q/k rows interleaved, its RoPE scaling (linear, `rope_freqs.weight`),
    /// no `attention.key_length` or expert width keys written; else q/k rows rotate-half (NEOX).
    pub(crate) llama: bool,
    /// `attention.sliding_window_pattern`'s default, for the families with sliding windows.
    pub(crate) swa_pattern: Option<usize>,
    /// `attention.sliding_window`'s default (`None`: required); a default of 0 makes the windows
    /// optional (gemma3: a file without the key slides nowhere), else 0 is refused.
    pub(crate) sliding_window: Option<usize>,
    /// The layer count of the shapes whose attention scale is `1/√(n_embd/n_head)` (Gemma's
    /// 27B: 46 layers for gemma2, 62 for gemma3).
    pub(crate) wide_scale_layers: Option<usize>,
    /// Whether the output layer is the embedding.
    pub(crate) tied: Tied,
    /// llama.cpp's loader requires `output.weight`: a tied head is written as a copy.
    pub(crate) output_required: bool,
    /// llama.cpp's q projection is `dim` wide (`head_dim · n_heads` must be `dim`).
    pub(crate) q_is_dim_wide: bool,
    /// Other names (lowercase) a model's `architecture` may have to be written as this family.
    pub(crate) aliases: &'static [&'static str],
    /// The feature that keeps qdrift from reading (and writing) the family's GGUF files yet.
    pub(crate) not_read: Option<&'static str>,
    /// llama.cpp's fixed NoPE layers (`hparams.n_no_rope_layer_step`, smollm3: 4): layer `il`
    /// rotates iff `(il + 1) % step != 0`; no key states it.
    pub(crate) nope_step: Option<usize>,
    /// The pre-FFN norm's tensor name: `ffn_norm`, or `post_attention_norm` (gpt-oss's and
    /// glm4moe's converters map `post_attention_layernorm` there).
    pub(crate) ffn_norm: &'static str,
    /// llama.cpp's `nextn_predict_layers` (glm4moe): that many blocks past the model's, the
    /// multi-token-prediction layers, which llama.cpp loads but its graph does not run; qdrift
    /// reads the model's blocks and skips theirs, and writes none.
    pub(crate) nextn: bool,
}

impl GgufRules {
    /// The NoPE layers llama.cpp's graph gives `n_layers` layers ([`GgufRules::nope_step`]), as
    /// [`qdrift_weights::LayerAttention::rope`] holds them (empty when every layer rotates).
    pub(crate) fn rope_layers(&self, n_layers: usize) -> Vec<bool> {
        let rope: Vec<bool> = match self.nope_step {
            Some(step) => (0..n_layers).map(|il| (il + 1) % step != 0).collect(),
            None => Vec::new(),
        };
        if rope.contains(&false) { rope } else { Vec::new() }
    }
}

/// Whether GGUF's output layer is the embedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tied {
    /// When the file has no `output.weight`.
    IfNoOutput,
    /// Always (gemma2).
    Always,
    /// Never (gpt-oss).
    Never,
}

/// The entry of `config.json`'s `architectures[0]`.
pub(crate) fn by_class(class: &str) -> Option<Arch> {
    ARCHITECTURES.iter().find(|e| e.hf_class == class)
}

/// The entry whose multimodal wrapper is `class`.
pub(crate) fn by_wrapper(class: &str) -> Option<Arch> {
    ARCHITECTURES.iter().find(|e| e.wrappers.contains(&class))
}

/// The entry of `model_type`.
pub(crate) fn by_model_type(model_type: &str) -> Option<Arch> {
    ARCHITECTURES.iter().find(|e| e.model_type == model_type)
}

/// The family a GGUF file's `general.architecture` names, read by the family rules (not
/// `dense`); `has_experts` says whether the file declares experts, asked only when the name is
/// shared by a dense and a mixture-of-experts entry (`llama`, Mixtral).
pub(crate) fn by_gguf_name<E>(name: &str, has_experts: impl FnOnce() -> Result<bool, E>) -> Result<Option<Arch>, E> {
    let mut candidates = ARCHITECTURES.iter().filter(|e| e.gguf.name == name && !e.gguf.dense);
    let Some(first) = candidates.next() else {
        return Ok(None);
    };
    let shared = ARCHITECTURES.iter().any(|e| e.gguf.name == name && e.gguf.dense);
    if shared && !has_experts()? {
        return Ok(None);
    }
    Ok(Some(first))
}

/// The family a model named `architecture` is written to GGUF as, by name: its GGUF name (unless
/// a dense entry shares it), its class or a wrapper's (case-insensitively), an alias; `None` for
/// the dense entries.
pub(crate) fn by_written_name(architecture: &str) -> Option<Arch> {
    let lower = architecture.to_ascii_lowercase();
    ARCHITECTURES.iter().filter(|e| !e.gguf.dense).find(|e| {
        let gguf_shared = ARCHITECTURES.iter().any(|d| d.gguf.dense && d.gguf.name == e.gguf.name);
        (!gguf_shared && e.gguf.name == lower)
            || e.hf_class.eq_ignore_ascii_case(&lower)
            || e.wrappers.iter().any(|w| w.eq_ignore_ascii_case(&lower))
            || e.gguf.aliases.contains(&lower.as_str())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names are unique where a lookup relies on them.
    #[test]
    fn names_are_unique() {
        for (i, e) in ARCHITECTURES.iter().enumerate() {
            for later in &ARCHITECTURES[i + 1..] {
                assert_ne!(e.hf_class, later.hf_class);
                assert_ne!(e.model_type, later.model_type);
                assert!(e.wrappers.iter().all(|w| !later.wrappers.contains(w)), "{}", e.hf_class);
                let both_family = !e.gguf.dense && !later.gguf.dense;
                assert!(!both_family || e.gguf.name != later.gguf.name, "{}", e.gguf.name);
            }
        }
    }
}
