//! Synthetic models: real architectures' shapes with seeded random weights.
//!
//! For measuring speed and memory at sizes whose checkpoints are not at hand, and for tests.
//! Numbers *about model quality* measured on them mean nothing: their [`LoadedModel::format`] is
//! [`ModelFormat::Synthetic`] so reports can say so.
//!
//! Weights: every linear and embedding value is drawn from N(0, 0.02²) (the initializer range of
//! `transformers`' Llama), every RMSNorm weight is 1.0. Normal samples come from the Box–Muller
//! transform of ChaCha8 output: tensor `k` (in [`HostModel`] order: embedding, then per layer
//! attn_norm, wq, wk, wv, wo, ffn_norm, w_gate, w_up, w_down, then final norm, output) uses ChaCha8
//! seeded with `seed` on stream `k`; value pair `j` uses the stream's 32-bit words `2j`, `2j+1` as
//! `u1, u2 = (word + 0.5) / 2³²` (rounded to f32) and yields `r·cos(2πu2), r·sin(2πu2)` with
//! `r = 0.02·√(−2 ln u1)`, in f32 arithmetic. Generation is split over threads by seeking the
//! stream, so the values depend on the seed only (and the platform's `ln`/`sin_cos`, to the
//! last bit). How long it takes: docs/BENCHMARKS.md, 'Other costs'.
//!
//! Tokenizer: byte level. Ids 0, 1, 2 are `<unk>`, `<s>` (BOS, prepended), `</s>` (EOS); id
//! `3 + b` is byte `b`; the remaining ids up to the vocabulary size are `<extra_N>` pieces that
//! text never encodes to. It is [`Llama2cTokenizer`] with that vocabulary (no merges).
//!
//! Memory: [`synthetic_source`] holds no weights: its [`SyntheticSource`] generates a part (the
//! embedding, one block, the head) when a model is built from it, the same values each time, so
//! an evaluation of `llama-8b` never holds its 32 GB of f32. [`synthetic_model`] materializes
//! them all as f32 (`4 × parameters` bytes); before allocating, the size is compared with the
//! memory available to this process (Linux: `MemAvailable` of `/proc/meminfo` and the cgroup v2
//! `memory.max`), and a model that does not fit is [`LoadError::TooLarge`]. Use
//! [`synthetic_arch`] for shape-only work (`qdrift inspect`).

use std::path::{Path, PathBuf};

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};

use crate::LoadError;
use crate::hf::config::{AttnBias, HfArch};
use crate::loaded::{LoadedModel, ModelFormat};
use crate::tokenizer::{Llama2cTokenizer, SpecialIds};
use qdrift_weights::{
    ArchShape, BlockSpec, Experts, Ffn, HostModel, HostTensor, LayerWeights, Mlp, ModelArch, MoeSpec, NormStyle,
    Routing, SourceError, WeightSource,
};

/// Names accepted by [`synthetic_model`], with what they imitate.
pub const SYNTHETIC_PRESETS: &[(&str, &str)] = &[
    ("tiny", "2 layers, dim 32, 4/2 heads, vocab 320 (tests)"),
    ("smollm2-135m", "SmolLM2-135M: 30 layers, dim 576, hidden 1536, 9/3 heads, vocab 49152, tied"),
    ("llama-1b", "Llama-3.2-1B shape: 16 layers, dim 2048, hidden 8192, 32/8 heads, vocab 128256, tied"),
    ("llama-8b", "Llama-3.1-8B shape: 32 layers, dim 4096, hidden 14336, 32/8 heads, vocab 128256, untied"),
    (
        "moe-tiny",
        "Qwen3-MoE block: 2 layers, dim 32, 4/2 heads of 16, q/k norms, 8 experts of 16, top-2, vocab 320 (tests)",
    ),
    ("qwen3-8b", "Qwen3-8B: 36 layers, dim 4096, hidden 12288, 32/8 heads of 128, q/k norms, vocab 151936, untied"),
    (
        "qwen3-30b-a3b",
        "Qwen3-30B-A3B: 48 layers, dim 2048, 32/4 heads of 128, q/k norms, 128 experts of 768, top-8, vocab 151936",
    ),
    (
        "gemma3-12b",
        "Gemma 3 12B (text): 48 layers, dim 3840, hidden 15360, 16/8 heads of 256, 5 of 6 layers in a 1024-token window, GELU-tanh, vocab 262208, tied",
    ),
    (
        "gpt-oss-20b",
        "gpt-oss-20b: 24 layers, dim 2880, 64/8 heads of 64, sinks, every other layer in a 128-token window, YaRN, 32 experts of 2880, top-4, vocab 201088",
    ),
];

/// The `config.json` of each preset taken from a Hugging Face architecture (`transformers` 5.25's
/// field names, the published models' values), read by the Hugging Face reader's own
/// `parse_config`, so a preset's architecture is what qdrift makes of the real checkpoint.
/// Gemma 3 12B is published as `Gemma3ForConditionalGeneration`; this is its `text_config` as a
/// `Gemma3ForCausalLM`.
fn preset_config(name: &str) -> Option<&'static str> {
    Some(match name {
        "qwen3-8b" => {
            r#"{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": false, "head_dim": 128,
            "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 12288, "max_position_embeddings": 40960,
            "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
            "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "sliding_window": null,
            "use_sliding_window": false, "tie_word_embeddings": false, "vocab_size": 151936}"#
        }
        "qwen3-30b-a3b" => {
            r#"{"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "attention_bias": false,
            "decoder_sparse_step": 1, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
            "intermediate_size": 6144, "max_position_embeddings": 40960, "mlp_only_layers": [],
            "moe_intermediate_size": 768, "norm_topk_prob": true, "num_attention_heads": 32,
            "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4, "num_local_experts": 128,
            "rms_norm_eps": 1e-06, "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
            "sliding_window": null, "use_sliding_window": false, "tie_word_embeddings": false, "vocab_size": 151936}"#
        }
        "gemma3-12b" => {
            r#"{"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "attention_bias": false,
            "attn_logit_softcapping": null, "final_logit_softcapping": null, "head_dim": 256,
            "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 3840, "intermediate_size": 15360,
            "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention",
            "sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "sliding_attention",
            "sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
            "sliding_attention", "sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
            "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention", "full_attention",
            "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention",
            "full_attention", "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention",
            "sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "sliding_attention",
            "sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
            "sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
            "max_position_embeddings": 131072, "num_attention_heads": 16, "num_hidden_layers": 48,
            "num_key_value_heads": 8, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
            "rope_parameters": {"full_attention": {"rope_theta": 1000000.0, "rope_type": "linear", "factor": 8.0},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}}, "sliding_window": 1024,
            "tie_word_embeddings": true, "vocab_size": 262208}"#
        }
        "gpt-oss-20b" => {
            r#"{"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "attention_bias": true, "head_dim": 64,
            "hidden_act": "silu", "hidden_size": 2880, "intermediate_size": 2880,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention",
            "sliding_attention", "full_attention", "sliding_attention", "full_attention", "sliding_attention",
            "full_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention",
            "sliding_attention", "full_attention", "sliding_attention", "full_attention", "sliding_attention",
            "full_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            "max_position_embeddings": 131072, "num_attention_heads": 64, "num_experts_per_tok": 4,
            "num_hidden_layers": 24, "num_key_value_heads": 8, "num_local_experts": 32, "rms_norm_eps": 1e-05,
            "rope_parameters": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
            "original_max_position_embeddings": 4096, "rope_theta": 150000.0, "rope_type": "yarn", "truncate": false},
            "sliding_window": 128, "swiglu_alpha": 1.702, "swiglu_limit": 7.0, "tie_word_embeddings": false,
            "vocab_size": 201088}"#
        }
        _ => return None,
    })
}

/// A preset of [`preset_config`] through the Hugging Face reader's `parse_config`.
fn configured_preset(name: &str) -> Option<HfArch> {
    let config: serde_json::Value = serde_json::from_str(preset_config(name)?).ok()?;
    // The tensor count bounds the layers a file can hold; a preset holds what its config says.
    crate::hf::config::parse_config(Path::new(&format!("synthetic:{name}")), &config, usize::MAX).ok()
}

/// Standard deviation of the random weights.
pub const SYNTHETIC_STD: f32 = 0.02;

/// The architecture of a preset, without allocating weights.
///
/// Llama 3.x's `rope_scaling` is left out (`None`): a synthetic model has no trained long-context
/// behaviour to preserve, and plain RoPE costs the same.
pub fn synthetic_arch(name: &str) -> Option<ModelArch> {
    // (dim, hidden, layers, heads, kv_heads, vocab, max_seq_len, eps, theta, tied)
    let (dim, hidden, layers, heads, kv, vocab, ctx, eps, theta, tied) = match name {
        "tiny" => (32, 64, 2, 4, 2, 320, 256, 1e-5, 10000.0, true),
        "smollm2-135m" => (576, 1536, 30, 9, 3, 49152, 8192, 1e-5, 100000.0, true),
        "llama-1b" => (2048, 8192, 16, 32, 8, 128256, 131072, 1e-5, 500000.0, true),
        "llama-8b" => (4096, 14336, 32, 32, 8, 128256, 131072, 1e-5, 500000.0, false),
        "moe-tiny" => return Some(moe_tiny()),
        _ => return configured_preset(name).map(|p| p.arch),
    };
    let shape = ArchShape {
        dim,
        hidden_dim: hidden,
        n_layers: layers,
        n_heads: heads,
        n_kv_heads: kv,
        head_dim: dim.checked_div(heads).unwrap_or(0),
        vocab_size: vocab,
        max_seq_len: ctx,
    };
    Some(ModelArch { norm_eps: eps, rope_theta: theta, tied_embeddings: tied, ..ModelArch::new("llama", shape) })
}

/// `moe-tiny`: a Qwen3-MoE block (`Qwen3MoeForCausalLM`: per-head q/k norms, head_dim 16 ≠
/// dim / heads 8, a softmax router picking 2 of 8 experts, renormalized) at test size.
fn moe_tiny() -> ModelArch {
    let shape = ArchShape {
        dim: 32,
        hidden_dim: 64,
        n_layers: 2,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 16,
        vocab_size: 320,
        max_seq_len: 256,
    };
    ModelArch {
        norm_eps: 1e-6,
        rope_theta: 1_000_000.0,
        block: BlockSpec { qk_norm: true, ..BlockSpec::default() },
        moe: Some(MoeSpec {
            n_experts: 8,
            top_k: 2,
            expert_hidden: 16,
            routing: Routing::SoftmaxTopK { renormalize: true },
            dense_layers: Vec::new(),
            shared_expert_hidden: None,
        }),
        ..ModelArch::new("Qwen3MoeForCausalLM", shape)
    }
}

fn preset_list() -> String {
    SYNTHETIC_PRESETS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
}

/// `synthetic:NAME` or `synthetic:NAME:SEED` (the part after `synthetic:`) for [`crate::open_model`].
pub(crate) fn open_synthetic(spec: &str) -> Result<LoadedModel, LoadError> {
    let (name, seed) = parse_spec(spec)?;
    synthetic_model(name, seed)
}

/// `NAME` or `NAME:SEED` (the part after `synthetic:`) as the preset name and the seed (0 when
/// absent).
pub(crate) fn parse_spec(spec: &str) -> Result<(&str, u64), LoadError> {
    match spec.split_once(':') {
        Some((n, s)) => {
            let seed = s.parse::<u64>().map_err(|_| {
                LoadError::invalid(
                    Path::new(&format!("synthetic:{spec}")),
                    format!("seed {s:?} is not an unsigned integer"),
                )
            })?;
            Ok((n, seed))
        }
        None => Ok((spec, 0)),
    }
}

/// [`synthetic_arch`], or an error naming the known presets.
pub(crate) fn preset_arch(name: &str) -> Result<ModelArch, LoadError> {
    synthetic_arch(name).ok_or_else(|| {
        LoadError::invalid(
            Path::new(&format!("synthetic:{name}")),
            format!("unknown synthetic model {name}; presets: {}", preset_list()),
        )
    })
}

/// A synthetic model of preset `name` (see [`SYNTHETIC_PRESETS`]) with weights from `seed`, every
/// weight generated ([`synthetic_source`] generates each part when asked).
///
/// # Errors
/// [`LoadError::Invalid`] for an unknown preset; [`LoadError::TooLarge`] when its f32 weights do
/// not fit in available memory.
pub fn synthetic_model(name: &str, seed: u64) -> Result<LoadedModel, LoadError> {
    let loaded = synthetic_source(name, seed)?;
    check_fits(&loaded.path, loaded.model.arch.parameter_count() as u64 * 4, available_memory())?;
    let path = loaded.path.clone();
    loaded.try_map_model(|source| HostModel::from_source(&source).map_err(|e| LoadError::invalid(&path, e.to_string())))
}

/// [`synthetic_model`] without its weights: a [`SyntheticSource`] generates each part when a
/// model is built from it, so that no whole f32 copy is ever held (`llama-8b` is 32 GB of f32).
///
/// # Errors
/// [`LoadError::Invalid`] for an unknown preset.
pub fn synthetic_source(name: &str, seed: u64) -> Result<LoadedModel<SyntheticSource>, LoadError> {
    let path = PathBuf::from(format!("synthetic:{name}"));
    // A configured preset is parsed once: its architecture, and the tensors it has beyond a
    // Llama block (its class's biases and sinks).
    let (arch, attn_bias, expert_bias) = match configured_preset(name) {
        Some(p) => (p.arch, p.attn_bias, p.entry.block.sinks),
        None => (preset_arch(name)?, AttnBias::None, false),
    };
    let tokenizer = byte_tokenizer(arch.vocab_size).map_err(|e| LoadError::invalid(&path, e))?;
    let mut source_dtypes = vec![("token_embedding".to_string(), "F32".to_string())];
    for i in 0..arch.n_layers {
        for n in ["attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w_gate", "w_up", "w_down"] {
            source_dtypes.push((format!("layers.{i}.{n}"), "F32".to_string()));
        }
    }
    source_dtypes.push(("final_norm".to_string(), "F32".to_string()));
    if !arch.tied_embeddings {
        source_dtypes.push(("output".to_string(), "F32".to_string()));
    }
    Ok(LoadedModel {
        model: SyntheticSource { arch, seed, attn_bias, expert_bias },
        tokenizer: Box::new(tokenizer),
        path: path.clone(),
        tokenizer_path: path,
        format: ModelFormat::Synthetic,
        source_dtypes,
        source_storage: None,
        chat_template: None,
        quantization: None,
        notes: Vec::new(),
    })
}

/// The byte-level tokenizer of the synthetic models (see the module docs).
pub fn byte_tokenizer(vocab_size: usize) -> Result<Llama2cTokenizer, String> {
    if vocab_size < 259 {
        return Err(format!("a byte-level vocabulary needs at least 259 tokens, not {vocab_size}"));
    }
    let mut pieces = vec!["<unk>".to_string(), "<s>".to_string(), "</s>".to_string()];
    pieces.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    pieces.extend((259..vocab_size).map(|i| format!("<extra_{i}>")));
    let scores = vec![0.0; vocab_size];
    Llama2cTokenizer::from_pieces(&pieces, &scores, SpecialIds { bos: 1, eos: 2, unk: 0, add_bos: true })
}

/// [`LoadError::TooLarge`] when `needed` bytes exceed `available` (unknown: assume they fit).
fn check_fits(what: &Path, needed: u64, available: Option<u64>) -> Result<(), LoadError> {
    match available {
        Some(available) if needed > available => {
            Err(LoadError::TooLarge { what: what.to_path_buf(), needed_bytes: needed, available_bytes: available })
        }
        _ => Ok(()),
    }
}

/// Bytes this process may still allocate, if known.
fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
    });
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max").ok().and_then(|s| s.trim().parse::<u64>().ok());
    let used = std::fs::read_to_string("/sys/fs/cgroup/memory.current").ok().and_then(|s| s.trim().parse::<u64>().ok());
    let cgroup_left = cgroup.map(|max| max.saturating_sub(used.unwrap_or(0)));
    match (meminfo, cgroup_left) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A preset's weights, generated part by part when asked (see the module docs for the values):
/// the same values whichever part is asked first or how often.
pub struct SyntheticSource {
    arch: ModelArch,
    seed: u64,
    /// The attention biases every block has (gpt-oss: all four).
    attn_bias: AttnBias,
    /// Whether the router and the experts have biases (gpt-oss).
    expert_bias: bool,
}

impl SyntheticSource {
    /// The same preset with its shapes changed by `resize` (its features, biases and sinks kept):
    /// a real-size preset at test size. The values are drawn as for any preset, from the new
    /// shapes.
    pub fn resized(mut self, resize: impl FnOnce(&mut ModelArch)) -> Self {
        resize(&mut self.arch);
        self
    }

    /// N(0, 0.02²) values of `shape` on stream `k` (the `k`-th tensor in [`HostModel`] order).
    fn rand(&self, shape: &[usize], k: usize) -> HostTensor {
        random_tensor(shape, self.seed, k as u64)
    }
}

fn ones(n: usize) -> HostTensor {
    HostTensor { shape: vec![n], data: vec![1.0; n] }
}

impl SyntheticSource {
    /// A norm weight of width `n` that leaves `x̂` unscaled: ones for `x̂·w`, zeros for Gemma's
    /// `x̂·(1 + w)`.
    fn unit_norm(&self, n: usize) -> HostTensor {
        match self.arch.block.norm {
            NormStyle::Weight => ones(n),
            NormStyle::OnePlusWeight => HostTensor { shape: vec![n], data: vec![0.0; n] },
        }
    }

    /// Block `layer`'s `j`-th tensor beyond a Llama block's (biases, sinks), on stream
    /// `2³³ + 2¹⁶·layer + j` (apart from the dense tensors' and the experts' streams).
    fn extra(&self, n: usize, layer: usize, j: u64) -> HostTensor {
        random_tensor(&[n], self.seed, (2u64 << 32) + ((layer as u64) << 16) + j)
    }

    /// Parameters a block holds beyond [`ModelArch::parameter_count`]'s: q/k norms, attention
    /// biases, sinks, and the router's and experts' biases.
    fn extra_per_layer(&self, layer: usize) -> usize {
        let arch = &self.arch;
        let (q, kv) = (arch.n_heads * arch.head_dim(), arch.kv_dim());
        let qk_norms = if arch.block.qk_norm { 2 * arch.head_dim() } else { 0 };
        let biases = match self.attn_bias {
            AttnBias::None => 0,
            AttnBias::Qkv => q + 2 * kv,
            AttnBias::Qkvo => q + 2 * kv + arch.dim,
        };
        let sinks = if arch.block.sinks { arch.n_heads } else { 0 };
        let experts = match &arch.moe {
            Some(m) if self.expert_bias && arch.has_experts(layer) => {
                m.n_experts * (1 + 2 * m.expert_hidden + arch.dim)
            }
            _ => 0,
        };
        qk_norms + biases + sinks + experts
    }
}

impl WeightSource for SyntheticSource {
    fn arch(&self) -> &ModelArch {
        &self.arch
    }

    fn parameter_count(&self) -> usize {
        // Every tensor the parts hold: the architecture's count plus what it leaves to the
        // weights (q/k norms, biases, sinks).
        self.arch.parameter_count() + (0..self.arch.n_layers).map(|i| self.extra_per_layer(i)).sum::<usize>()
    }

    fn token_embedding(&self) -> Result<HostTensor, SourceError> {
        Ok(self.rand(&[self.arch.vocab_size, self.arch.dim], 0))
    }

    fn layer(&self, i: usize) -> Result<LayerWeights, SourceError> {
        let arch = &self.arch;
        if i >= arch.n_layers {
            return Err(format!("no block {i}: the model has {}", arch.n_layers).into());
        }
        let (d, h) = (arch.dim, arch.hidden_dim);
        let (q, kv) = (arch.n_heads * arch.head_dim(), arch.kv_dim());
        // Stream k is the k-th tensor in HostModel order (norms included, though they are ones).
        let k = 1 + 9 * i;
        let qkv_bias = self.attn_bias != AttnBias::None;
        let sandwich = arch.block.sandwich_norms;
        Ok(LayerWeights {
            attn_norm: self.unit_norm(d),
            wq: self.rand(&[q, d], k + 1),
            wk: self.rand(&[kv, d], k + 2),
            wv: self.rand(&[kv, d], k + 3),
            wo: self.rand(&[d, q], k + 4),
            ffn_norm: self.unit_norm(d),
            bq: qkv_bias.then(|| self.extra(q, i, 0)),
            bk: qkv_bias.then(|| self.extra(kv, i, 1)),
            bv: qkv_bias.then(|| self.extra(kv, i, 2)),
            ffn: match &arch.moe {
                Some(moe) if arch.has_experts(i) => {
                    Ffn::Experts(random_experts(moe, d, self.seed, i, self.expert_bias))
                }
                _ => Ffn::Dense(Mlp::new(
                    self.rand(&[h, d], k + 6),
                    self.rand(&[h, d], k + 7),
                    self.rand(&[d, h], k + 8),
                )),
            },
            bo: (self.attn_bias == AttnBias::Qkvo).then(|| self.extra(d, i, 3)),
            q_norm: arch.block.qk_norm.then(|| self.unit_norm(arch.head_dim())),
            k_norm: arch.block.qk_norm.then(|| self.unit_norm(arch.head_dim())),
            sinks: arch.block.sinks.then(|| self.extra(arch.n_heads, i, 4)),
            post_attn_norm: sandwich.then(|| self.unit_norm(d)),
            post_ffn_norm: sandwich.then(|| self.unit_norm(d)),
        })
    }

    fn final_norm(&self) -> Result<HostTensor, SourceError> {
        Ok(self.unit_norm(self.arch.dim))
    }

    fn output(&self) -> Result<Option<HostTensor>, SourceError> {
        let (v, d, n) = (self.arch.vocab_size, self.arch.dim, self.arch.n_layers);
        Ok((!self.arch.tied_embeddings).then(|| self.rand(&[v, d], 2 + 9 * n)))
    }
}

/// Layer `layer`'s router and experts: the router on stream `2³² + 2¹⁶·layer`, expert `e`'s gate,
/// up and down on the next `3e + 1 … 3e + 3` (streams apart from the dense tensors' `k < 2³²`);
/// with `biases` (gpt-oss) the router's bias and each expert's three on stream
/// `2³⁴ + 2¹⁶·layer + 4e + j`.
fn random_experts(moe: &MoeSpec, d: usize, seed: u64, layer: usize, biases: bool) -> Experts {
    let base = (1u64 << 32) + ((layer as u64) << 16);
    let rand = |shape: &[usize], k: u64| random_tensor(shape, seed, base + k);
    let bias_base = (4u64 << 32) + ((layer as u64) << 16);
    let bias = |n: usize, k: u64| biases.then(|| random_tensor(&[n], seed, bias_base + k));
    let w = moe.expert_hidden;
    let experts = (0..moe.n_experts as u64)
        .map(|e| {
            let mut mlp = Mlp::new(rand(&[w, d], 3 * e + 1), rand(&[w, d], 3 * e + 2), rand(&[d, w], 3 * e + 3));
            (mlp.gate_bias, mlp.up_bias, mlp.down_bias) = (bias(w, 4 * e + 1), bias(w, 4 * e + 2), bias(d, 4 * e + 3));
            mlp
        })
        .collect();
    Experts { router: rand(&[moe.n_experts, d], 0), router_bias: bias(moe.n_experts, 0), experts, shared: None }
}

/// N(0, SYNTHETIC_STD²) values of ChaCha8 stream `stream` (see the module docs), generated on all
/// cores.
fn random_tensor(shape: &[usize], seed: u64, stream: u64) -> HostTensor {
    let n: usize = shape.iter().product();
    let mut data = vec![0.0f32; n];
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    // Chunks of an even length, so that each starts on a value pair.
    let chunk = n.div_ceil(threads).next_multiple_of(2).max(2);
    std::thread::scope(|s| {
        for (c, out) in data.chunks_mut(chunk).enumerate() {
            s.spawn(move || fill_normal(out, seed, stream, (c * chunk) as u128));
        }
    });
    HostTensor { shape: shape.to_vec(), data }
}

fn fill_normal(out: &mut [f32], seed: u64, stream: u64, first_value: u128) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    // Value pair j uses words 2j and 2j+1: value i starts at word i (i even).
    rng.set_word_pos(first_value);
    // u1 ≥ 2⁻³³ (> 0, so ln is finite) and r ≤ 0.02·√(66 ln 2) ≈ 0.136.
    let unit = |w: u32| ((f64::from(w) + 0.5) / 4_294_967_296.0) as f32;
    for pair in out.chunks_mut(2) {
        let (u1, u2) = (unit(rng.next_u32()), unit(rng.next_u32()));
        let r = SYNTHETIC_STD * (-2.0 * u1.ln()).sqrt();
        let (sin, cos) = (std::f32::consts::TAU * u2).sin_cos();
        pair[0] = r * cos;
        if let Some(second) = pair.get_mut(1) {
            *second = r * sin;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_source_counts_the_parameters_its_parts_hold_in_any_order() {
        for name in ["tiny", "moe-tiny"] {
            let source = synthetic_source(name, 5).expect("preset").model;
            let whole = HostModel::from_source(&source).expect("parts");
            assert_eq!(source.parameter_count(), whole.parameter_count(), "{name}");
            // A part asked for again, after others, is the same values.
            let last = whole.arch.n_layers - 1;
            assert_eq!(source.layer(last).expect("block"), whole.layers[last]);
            assert_eq!(source.token_embedding().expect("embedding"), whole.token_embedding);
            assert!(source.layer(whole.arch.n_layers).is_err());
        }
    }

    /// The configured presets, with their published parameter counts in billions (Qwen3-8B
    /// 8.2B, Qwen3-30B-A3B 30.5B, Gemma 3 12B's language model 11.8B, gpt-oss-20b 20.9B).
    const CONFIGURED: [(&str, f64); 4] =
        [("qwen3-8b", 8.19), ("qwen3-30b-a3b", 30.5), ("gemma3-12b", 11.77), ("gpt-oss-20b", 20.9)];

    #[test]
    fn the_configured_presets_have_the_published_parameter_counts() {
        for (name, billions) in CONFIGURED {
            let source = synthetic_source(name, 0).expect(name).model;
            assert_eq!(source.arch().validate(), Ok(()), "{name}");
            let got = source.parameter_count() as f64 / 1e9;
            assert!((got - billions).abs() / billions < 0.005, "{name}: {got:.3} B parameters");
        }
        let gemma = synthetic_arch("gemma3-12b").expect("gemma");
        assert_eq!(gemma.windows.iter().filter(|w| w.is_some()).count(), 40, "5 of 6 layers slide");
        assert_eq!((gemma.local_rope_theta, gemma.embedding_scale.is_some()), (Some(10000.0), true));
        let oss = synthetic_arch("gpt-oss-20b").expect("gpt-oss");
        assert!(oss.block.sinks && oss.windows[0] == Some(128) && oss.windows[1].is_none());
        let moe = synthetic_arch("qwen3-30b-a3b").expect("qwen3 moe").moe.expect("experts");
        assert_eq!((moe.n_experts, moe.top_k, moe.expert_hidden), (128, 8, 768));
    }

    /// Each configured preset at test size (its features, small shapes): the parts hold what
    /// `parameter_count` counts (biases, sinks, sandwich and q/k norms included), and a Gemma
    /// norm is zeros (`x̂·(1 + 0)`).
    #[test]
    fn shrunken_configured_presets_hand_out_the_parts_they_count() {
        for (name, _) in CONFIGURED {
            let mut source = synthetic_source(name, 3).expect(name).model;
            let a = &mut source.arch;
            (a.n_layers, a.dim, a.hidden_dim, a.n_heads, a.n_kv_heads, a.head_dim, a.vocab_size) =
                (2, 32, 16, 4, 2, 8, 300);
            a.windows.truncate(2);
            if let Some(m) = &mut a.moe {
                (m.n_experts, m.top_k, m.expert_hidden) = (4, 2, 8);
            }
            assert_eq!(a.validate(), Ok(()), "{name}");
            let whole = HostModel::from_source(&source).expect("parts");
            assert_eq!(source.parameter_count(), whole.parameter_count(), "{name}");
            let l = &whole.layers[0];
            let gemma = name.starts_with("gemma");
            assert_eq!(l.post_ffn_norm.is_some(), gemma, "{name}");
            assert_eq!(l.attn_norm.data[0], if gemma { 0.0 } else { 1.0 }, "{name}");
            let oss = name.starts_with("gpt-oss");
            assert_eq!((l.bo.is_some(), l.sinks.is_some()), (oss, oss), "{name}");
            if let Some(e) = l.experts() {
                assert_eq!(e.router_bias.is_some(), oss, "{name}");
                assert_eq!(e.experts[1].down_bias.is_some(), oss, "{name}");
            }
        }
    }

    #[test]
    fn values_do_not_depend_on_the_split_over_threads() {
        let whole = random_tensor(&[1001], 7, 3);
        let mut parts = vec![0.0f32; 1001];
        let (a, b) = parts.split_at_mut(500);
        fill_normal(a, 7, 3, 0);
        fill_normal(b, 7, 3, 500);
        assert_eq!(whole.data, parts);
        assert_ne!(random_tensor(&[8], 7, 4).data, random_tensor(&[8], 7, 3).data);
        assert_ne!(random_tensor(&[8], 8, 3).data, random_tensor(&[8], 7, 3).data);
    }

    #[test]
    fn weights_have_the_documented_mean_and_std() {
        let t = random_tensor(&[200_000], 1, 0);
        let n = t.data.len() as f64;
        let mean = t.data.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
        let var = t.data.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / n;
        // Standard errors: 0.02/√n ≈ 4.5e-5 for the mean, ≈ 0.2% relative for the std.
        assert!(mean.abs() < 3e-4, "{mean}");
        assert!((var.sqrt() - 0.02).abs() < 0.02 * 0.01, "{}", var.sqrt());
    }

    #[test]
    fn moe_tiny_has_distinct_seeded_experts_and_q_k_norms() {
        let m = synthetic_model("moe-tiny", 5).expect("moe-tiny").model;
        assert_eq!(m.arch.validate(), Ok(()));
        for l in &m.layers {
            let e = l.experts().expect("every layer has experts");
            assert_eq!(e.router.shape, [8, 32]);
            assert_eq!(e.experts.len(), 8);
            assert_eq!(
                (e.experts[3].gate.shape.as_slice(), e.experts[3].down.shape.as_slice()),
                (&[16, 32][..], &[32, 16][..])
            );
            assert_ne!(e.experts[0].gate, e.experts[1].gate);
            assert_eq!(l.q_norm.as_ref().map(|t| t.shape.clone()), Some(vec![16]));
            // Attention, then three matrices per expert.
            assert_eq!(l.linears().len(), 4 + 3 * 8);
        }
        assert_ne!(m.layers[0].experts().map(|e| &e.router), m.layers[1].experts().map(|e| &e.router));
        assert_eq!(m, synthetic_model("moe-tiny", 5).expect("moe-tiny").model);
        // Norms and the router's weights are counted; q/k norms (2 × 16 per layer) only by the model.
        assert_eq!(m.parameter_count(), m.arch.parameter_count() + 2 * 2 * 16);
    }

    #[test]
    fn tiny_preset_is_seeded_marked_and_byte_tokenized() {
        let a = synthetic_model("tiny", 1).expect("tiny");
        let b = crate::open_model(Path::new("synthetic:tiny:1"), None).expect("tiny via open_model");
        assert!(a.format.is_synthetic() && b.format.is_synthetic());
        assert_eq!(a.format.name(), "synthetic");
        assert_eq!(a.model, b.model);
        assert_ne!(a.model, synthetic_model("tiny", 2).expect("tiny").model);
        assert_eq!(a.model.arch.validate(), Ok(()));
        assert!(a.model.layers[0].attn_norm.data.iter().all(|&v| v == 1.0));
        assert_eq!(a.tokenizer.vocab_size(), 320);
        assert_eq!(
            a.tokenizer.encode("Hi é"),
            vec![1, 3 + b'H' as u32, 3 + b'i' as u32, 3 + b' ' as u32, 3 + 0xC3, 3 + 0xA9]
        );
        assert_eq!(a.tokenizer.decode(&a.tokenizer.encode("Hi é")), "Hi é");
    }

    #[test]
    fn a_model_larger_than_memory_is_refused_before_allocating() {
        let arch = synthetic_arch("llama-8b").expect("preset");
        let needed = arch.parameter_count() as u64 * 4;
        let e = check_fits(Path::new("synthetic:llama-8b"), needed, Some(24 << 30)).unwrap_err();
        assert!(matches!(e, LoadError::TooLarge { needed_bytes: 32_121_044_992, .. }), "{e}");
        assert_eq!(
            e.to_string(),
            "synthetic:llama-8b: needs 32121044992 bytes (29.9 GiB) of f32 weights but only 25769803776 bytes \
             (24.0 GiB) are available"
        );
        assert!(check_fits(Path::new("x"), needed, None).is_ok());
        // On this machine (or any with less than 30 GiB free) the preset itself is refused.
        if available_memory().is_some_and(|a| a < needed) {
            let e = synthetic_model("llama-8b", 0).err().expect("too large");
            assert!(matches!(e, LoadError::TooLarge { .. }), "{e}");
        }
    }

    /// Timing of the larger presets: `cargo test --release -p qdrift-load -- --ignored --nocapture`.
    #[test]
    #[ignore = "allocates 0.5 and 5 GB"]
    fn synthetic_generation_time() {
        for name in ["smollm2-135m", "llama-1b"] {
            let t = std::time::Instant::now();
            let m = synthetic_model(name, 0).expect("fits");
            println!("{name}: {} parameters in {:.2} s", m.model.arch.parameter_count(), t.elapsed().as_secs_f64());
        }
    }

    #[test]
    fn unknown_presets_and_seeds_are_errors() {
        let e = crate::open_model(Path::new("synthetic:gpt-5"), None).err().expect("unknown").to_string();
        assert!(e.contains("unknown synthetic model gpt-5; presets: tiny, smollm2-135m, llama-1b, llama-8b"), "{e}");
        let e = crate::open_model(Path::new("synthetic:tiny:x"), None).err().expect("bad seed").to_string();
        assert!(e.contains("seed \"x\" is not an unsigned integer"), "{e}");
    }

    #[test]
    fn preset_shapes_match_the_models_they_imitate() {
        let s = synthetic_arch("smollm2-135m").expect("preset");
        // SmolLM2-135M: 134,515,008 parameters (tied).
        assert_eq!(s.parameter_count(), 134_515_008);
        let l = synthetic_arch("llama-1b").expect("preset");
        // Llama-3.2-1B: 1,235,814,400 parameters (tied).
        assert_eq!(l.parameter_count(), 1_235_814_400);
        let l = synthetic_arch("llama-8b").expect("preset");
        // Llama-3.1-8B: 8,030,261,248 parameters.
        assert_eq!(l.parameter_count(), 8_030_261_248);
    }
}
