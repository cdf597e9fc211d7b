//! The architectures, one entry each (see [`super`]); the order is `SUPPORTED_ARCHITECTURES`'.
//! Sources: `transformers` 5.25.0's config classes (defaults) and modeling files, llama.cpp's
//! `src/models/*.cpp` and `conversion/*.py` (see `hf/config.rs` and `gguf/arch.rs`).

use super::{
    ActivationRule, ArchEntry, BiasRule, Block, DenseRule, ExpertTensors, GgufRules, GgufWidth, HfRouting, HfRules,
    MoeRules, SeqCap, SoftCaps, Tied, UngatedShared, WindowRule,
};
use qdrift_weights::Routing;

/// Every architecture qdrift reads.
pub(crate) static ARCHITECTURES: [ArchEntry; 14] = [
    LLAMA, MISTRAL, QWEN2, QWEN3, QWEN3_MOE, QWEN2_MOE, GEMMA2, GEMMA3, PHI3, MIXTRAL, GPT_OSS, SMOLLM3, LLAMA4,
    GLM4_MOE,
];

/// Llama's block, features off.
const LLAMA_BLOCK: Block = Block {
    gemma_norms: false,
    qk_norm: false,
    sinks: false,
    fused: false,
    partial_rotary: false,
    partial_factor: None,
    qk_norm_key: None,
    nope: false,
    llama4_attention: false,
    softcaps: SoftCaps::None,
    local_rope_theta: None,
    activation: ActivationRule::SwiGlu,
};

/// `LlamaConfig`'s defaults.
const LLAMA_HF: HfRules = HfRules {
    eps: 1e-6,
    max_pos: 2048,
    theta: 10000.0,
    default_rope: None,
    min_tensors_per_layer: 9,
    bias: BiasRule::None,
    seq_cap: SeqCap::None,
    windows: WindowRule::None,
    padded_vocab: true,
    tied: false,
    ffn: "mlp",
    dense_width: "intermediate_size",
};

/// A NEOX family of its own GGUF name, without windows.
const NEOX_GGUF: GgufRules = GgufRules {
    name: "",
    dense: false,
    llama: false,
    swa_pattern: None,
    sliding_window: None,
    wide_scale_layers: None,
    tied: Tied::IfNoOutput,
    output_required: false,
    q_is_dim_wide: false,
    aliases: &[],
    not_read: None,
    nope_step: None,
    ffn_norm: "ffn_norm",
    nextn: false,
};

/// Qwen's softmax-top-k experts as `mlp.experts.{e}.{gate,up,down}_proj`.
const QWEN_MOE: MoeRules = MoeRules {
    experts: 128,
    top_k: 8,
    hf_routing: HfRouting::NormTopkProb,
    width: ("moe_intermediate_size", Some(768)),
    dense_layers: DenseRule::Qwen,
    shared_expert: None,
    ungated_shared: None,
    hf_tensors: ExpertTensors::PerExpert {
        router: "mlp.gate",
        experts: "mlp.experts",
        proj: ["gate_proj", "up_proj", "down_proj"],
    },
    gguf_routing: Routing::SoftmaxTopK { renormalize: true },
    gguf_width: GgufWidth::KeyOrPerExpert,
};

const LLAMA: ArchEntry = ArchEntry {
    hf_class: "LlamaForCausalLM",
    model_type: "llama",
    wrappers: &[],
    block: LLAMA_BLOCK,
    hf: HfRules { bias: BiasRule::Refused, padded_vocab: false, ..LLAMA_HF },
    moe: None,
    gguf: GgufRules { name: "llama", dense: true, llama: true, ..NEOX_GGUF },
};

const MISTRAL: ArchEntry = ArchEntry {
    hf_class: "MistralForCausalLM",
    model_type: "mistral",
    wrappers: &["Mistral3ForConditionalGeneration"],
    block: LLAMA_BLOCK,
    hf: HfRules { seq_cap: SeqCap::Always, padded_vocab: false, ..LLAMA_HF },
    moe: None,
    gguf: GgufRules { name: "llama", dense: true, llama: true, ..NEOX_GGUF },
};

const QWEN2: ArchEntry = ArchEntry {
    hf_class: "Qwen2ForCausalLM",
    model_type: "qwen2",
    wrappers: &[],
    block: LLAMA_BLOCK,
    hf: HfRules { bias: BiasRule::Qkv, seq_cap: SeqCap::IfUseSlidingWindow, padded_vocab: false, ..LLAMA_HF },
    moe: None,
    gguf: GgufRules { name: "qwen2", dense: true, ..NEOX_GGUF },
};

const QWEN3: ArchEntry = ArchEntry {
    hf_class: "Qwen3ForCausalLM",
    model_type: "qwen3",
    wrappers: &[],
    block: Block { qk_norm: true, ..LLAMA_BLOCK },
    hf: HfRules {
        max_pos: 32768,
        min_tensors_per_layer: 11,
        bias: BiasRule::QkvoIf("attention_bias", false),
        windows: WindowRule::QwenFrom,
        ..LLAMA_HF
    },
    moe: None,
    gguf: GgufRules { name: "qwen3", ..NEOX_GGUF },
};

const QWEN3_MOE: ArchEntry = ArchEntry {
    hf_class: "Qwen3MoeForCausalLM",
    model_type: "qwen3_moe",
    wrappers: &[],
    block: Block { qk_norm: true, ..LLAMA_BLOCK },
    hf: HfRules {
        max_pos: 32768,
        min_tensors_per_layer: 11,
        bias: BiasRule::QkvoIf("attention_bias", false),
        windows: WindowRule::QwenAll,
        ..LLAMA_HF
    },
    moe: Some(QWEN_MOE),
    gguf: GgufRules { name: "qwen3moe", ..NEOX_GGUF },
};

const QWEN2_MOE: ArchEntry = ArchEntry {
    hf_class: "Qwen2MoeForCausalLM",
    model_type: "qwen2_moe",
    wrappers: &[],
    block: LLAMA_BLOCK,
    hf: HfRules {
        max_pos: 32768,
        bias: BiasRule::QkvIf("qkv_bias", true),
        windows: WindowRule::QwenEvenBelow,
        ..LLAMA_HF
    },
    // `qwen2moe.cpp`: `build_moe_ffn(.., LLM_FFN_SILU, false, ..)`.
    moe: Some(MoeRules {
        experts: 60,
        top_k: 4,
        width: ("moe_intermediate_size", Some(1408)),
        shared_expert: Some(5632),
        gguf_routing: Routing::SoftmaxTopK { renormalize: false },
        ..QWEN_MOE
    }),
    gguf: GgufRules { name: "qwen2moe", output_required: true, q_is_dim_wide: true, ..NEOX_GGUF },
};

const GEMMA2: ArchEntry = ArchEntry {
    hf_class: "Gemma2ForCausalLM",
    model_type: "gemma2",
    wrappers: &[],
    block: Block {
        gemma_norms: true,
        softcaps: SoftCaps::AttnAndFinal,
        activation: ActivationRule::GeluTanh,
        ..LLAMA_BLOCK
    },
    hf: HfRules {
        max_pos: 8192,
        min_tensors_per_layer: 11,
        bias: BiasRule::QkvoIf("attention_bias", false),
        windows: WindowRule::Alternate(4096),
        tied: true,
        ..LLAMA_HF
    },
    moe: None,
    gguf: GgufRules {
        name: "gemma2",
        swa_pattern: Some(2),
        sliding_window: Some(4096),
        wide_scale_layers: Some(46),
        tied: Tied::Always,
        ..NEOX_GGUF
    },
};

const GEMMA3: ArchEntry = ArchEntry {
    hf_class: "Gemma3ForCausalLM",
    model_type: "gemma3_text",
    wrappers: &["Gemma3ForConditionalGeneration"],
    block: Block {
        gemma_norms: true,
        qk_norm: true,
        softcaps: SoftCaps::Final,
        local_rope_theta: Some(10000.0),
        activation: ActivationRule::GeluTanh,
        ..LLAMA_BLOCK
    },
    hf: HfRules {
        max_pos: 131072,
        theta: 1e6,
        min_tensors_per_layer: 13,
        bias: BiasRule::QkvoIf("attention_bias", false),
        windows: WindowRule::Pattern,
        tied: true,
        ..LLAMA_HF
    },
    moe: None,
    gguf: GgufRules {
        name: "gemma3",
        swa_pattern: Some(6),
        sliding_window: Some(0),
        wide_scale_layers: Some(62),
        aliases: &["gemma3_text"],
        ..NEOX_GGUF
    },
};

const PHI3: ArchEntry = ArchEntry {
    hf_class: "Phi3ForCausalLM",
    model_type: "phi3",
    wrappers: &[],
    block: Block { fused: true, partial_rotary: true, ..LLAMA_BLOCK },
    hf: HfRules { eps: 1e-5, max_pos: 4096, min_tensors_per_layer: 6, windows: WindowRule::AllIfSet, ..LLAMA_HF },
    moe: None,
    gguf: GgufRules { name: "phi3", q_is_dim_wide: true, ..NEOX_GGUF },
};

const MIXTRAL: ArchEntry = ArchEntry {
    hf_class: "MixtralForCausalLM",
    model_type: "mixtral",
    wrappers: &[],
    block: LLAMA_BLOCK,
    hf: HfRules {
        eps: 1e-5,
        max_pos: 131072,
        theta: 1e6,
        min_tensors_per_layer: 8,
        windows: WindowRule::AllIfSet,
        ..LLAMA_HF
    },
    moe: Some(MoeRules {
        experts: 8,
        top_k: 2,
        hf_routing: HfRouting::Renormalized,
        width: ("intermediate_size", None),
        dense_layers: DenseRule::None,
        hf_tensors: ExpertTensors::PerExpert {
            router: "block_sparse_moe.gate",
            experts: "block_sparse_moe.experts",
            proj: ["w1", "w3", "w2"],
        },
        gguf_width: GgufWidth::FeedForward,
        ..QWEN_MOE
    }),
    gguf: GgufRules { name: "llama", llama: true, ..NEOX_GGUF },
};

const GPT_OSS: ArchEntry = ArchEntry {
    hf_class: "GptOssForCausalLM",
    model_type: "gpt_oss",
    wrappers: &[],
    block: Block { sinks: true, activation: ActivationRule::ClampedSwiGlu, ..LLAMA_BLOCK },
    hf: HfRules {
        eps: 1e-5,
        max_pos: 131072,
        theta: 150000.0,
        // `GptOssConfig.__post_init__`.
        default_rope: Some(
            r#"{"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": false,
                "original_max_position_embeddings": 4096}"#,
        ),
        min_tensors_per_layer: 13,
        bias: BiasRule::QkvoIf("attention_bias", true),
        windows: WindowRule::Alternate(128),
        ..LLAMA_HF
    },
    moe: Some(MoeRules {
        experts: 128,
        top_k: 4,
        hf_routing: HfRouting::TopKSoftmax,
        width: ("intermediate_size", None),
        dense_layers: DenseRule::None,
        hf_tensors: ExpertTensors::Fused,
        gguf_routing: Routing::TopKSoftmax,
        gguf_width: GgufWidth::Key,
        ..QWEN_MOE
    }),
    gguf: GgufRules {
        name: "gpt-oss",
        swa_pattern: Some(2),
        tied: Tied::Never,
        output_required: true,
        ffn_norm: "post_attention_norm",
        ..NEOX_GGUF
    },
};

const SMOLLM3: ArchEntry = ArchEntry {
    hf_class: "SmolLM3ForCausalLM",
    model_type: "smollm3",
    wrappers: &[],
    block: Block { nope: true, ..LLAMA_BLOCK },
    hf: HfRules {
        max_pos: 32768,
        theta: 2_000_000.0,
        bias: BiasRule::QkvoIf("attention_bias", false),
        windows: WindowRule::LayerTypes,
        tied: true,
        ..LLAMA_HF
    },
    moe: None,
    // llama.cpp's `smollm3`: Llama's tensors (`SmolLM3Model(LlamaModel)` permutes q/k) and a NoPE
    // layer every 4th (`llama_model_smollm3`: `n_no_rope_layer_step = 4`).
    gguf: GgufRules { name: "smollm3", llama: true, nope_step: Some(4), ..NEOX_GGUF },
};

const LLAMA4: ArchEntry = ArchEntry {
    hf_class: "Llama4ForCausalLM",
    model_type: "llama4_text",
    wrappers: &["Llama4ForConditionalGeneration"],
    block: Block { nope: true, llama4_attention: true, ..LLAMA_BLOCK },
    hf: HfRules {
        eps: 1e-5,
        max_pos: 131072,
        theta: 500_000.0,
        bias: BiasRule::QkvoIf("attention_bias", false),
        ffn: "feed_forward",
        dense_width: "intermediate_size_mlp",
        ..LLAMA_HF
    },
    moe: Some(MoeRules {
        experts: 16,
        top_k: 1,
        hf_routing: HfRouting::SigmoidInput,
        width: ("intermediate_size", Some(8192)),
        dense_layers: DenseRule::MoeLayers,
        ungated_shared: Some(UngatedShared { name: "shared_expert", count: None }),
        hf_tensors: ExpertTensors::FusedInOut,
        gguf_routing: Routing::SigmoidInput,
        ..QWEN_MOE
    }),
    gguf: GgufRules {
        name: "llama4",
        llama: true,
        not_read: Some("chunked attention, NoPE layers and temperature tuning"),
        ..NEOX_GGUF
    },
};

const GLM4_MOE: ArchEntry = ArchEntry {
    hf_class: "Glm4MoeForCausalLM",
    model_type: "glm4_moe",
    wrappers: &[],
    block: Block { partial_factor: Some(0.5), qk_norm_key: Some("use_qk_norm"), ..LLAMA_BLOCK },
    hf: HfRules { eps: 1e-5, max_pos: 131072, bias: BiasRule::QkvIf("attention_bias", false), ..LLAMA_HF },
    moe: Some(MoeRules {
        experts: 128,
        top_k: 8,
        hf_routing: HfRouting::GroupedSigmoid,
        width: ("moe_intermediate_size", Some(1408)),
        dense_layers: DenseRule::FirstK(1),
        ungated_shared: Some(UngatedShared { name: "shared_experts", count: Some("n_shared_experts") }),
        // The variant only: `gguf/arch.rs` reads its groups, norm and scale from the keys.
        gguf_routing: Routing::GroupedSigmoid { n_group: 1, topk_group: 1, renormalize: true, scale: 1.0 },
        gguf_width: GgufWidth::Key,
        ..QWEN_MOE
    }),
    // llama.cpp's `glm4moe` (`Glm4MoeModel`, `glm4-moe.cpp`): NEOX q/k rows, optional q/k norms,
    // `post_attention_norm` before the FFN, the correction bias as `exp_probs_b.bias`.
    gguf: GgufRules { name: "glm4moe", ffn_norm: "post_attention_norm", nextn: true, ..NEOX_GGUF },
};
