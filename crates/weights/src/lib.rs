//! The in-memory form of a model: a Llama-family architecture ([`LlamaArch`], with its
//! [`RopeScaling`]) and its f32 weights ([`HostModel`]: [`HostTensor`]s, one [`LayerWeights`] per
//! block).
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

use serde::{Deserialize, Serialize};

/// Hyper-parameters of a Llama-family decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LlamaArch {
    /// Architecture name as reported to users: the checkpoint's own (`llama`/`qwen2` from GGUF's
    /// `general.architecture`, `LlamaForCausalLM`, ... from `config.json`), `llama` for llama2.c
    /// checkpoints and synthetic presets (their format is in `qdrift_load::LoadedModel::format`).
    pub architecture: String,
    /// Model (residual stream) width.
    pub dim: usize,
    /// Width of the SwiGLU feed-forward layer.
    pub hidden_dim: usize,
    /// Number of transformer blocks.
    pub n_layers: usize,
    /// Number of query heads.
    pub n_heads: usize,
    /// Number of key/value heads (grouped-query attention when smaller than `n_heads`).
    pub n_kv_heads: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Context length the model was trained for.
    pub max_seq_len: usize,
    /// RMSNorm epsilon.
    pub norm_eps: f32,
    /// RoPE base frequency (theta).
    pub rope_theta: f32,
    /// Whether the output layer shares the token-embedding matrix.
    pub tied_embeddings: bool,
    /// How RoPE's inverse frequencies depart from `theta^(-2i/head_dim)`: Llama 3.1+'s scaling
    /// from a Hugging Face config, or per-pair divisors from a GGUF file; `None` for plain RoPE.
    pub rope_scaling: Option<RopeScaling>,
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
}

impl RopeScaling {
    /// Checks the parameters for a head of width `head_dim`.
    pub fn validate(&self, head_dim: usize) -> Result<(), String> {
        let positive = |name: &str, v: f32| {
            if v > 0.0 && v.is_finite() { Ok(()) } else { Err(format!("rope scaling {name} {v} must be positive")) }
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
                if *original_max_position_embeddings == 0 {
                    return Err("rope scaling original_max_position_embeddings must be positive".to_string());
                }
                Ok(())
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
        }
    }
}

impl LlamaArch {
    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.dim / self.n_heads
    }

    /// Total width of the key (or value) projection.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim()
    }

    /// Checks the relations between the fields that the model relies on.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("dim", self.dim),
            ("hidden_dim", self.hidden_dim),
            ("n_layers", self.n_layers),
            ("n_heads", self.n_heads),
            ("n_kv_heads", self.n_kv_heads),
            ("vocab_size", self.vocab_size),
            ("max_seq_len", self.max_seq_len),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("{name} must be positive"));
        }
        if !self.dim.is_multiple_of(self.n_heads) {
            return Err(format!("dim {} is not a multiple of n_heads {}", self.dim, self.n_heads));
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(format!("n_heads {} is not a multiple of n_kv_heads {}", self.n_heads, self.n_kv_heads));
        }
        if !self.head_dim().is_multiple_of(2) {
            return Err(format!("head dimension {} is odd; RoPE needs pairs", self.head_dim()));
        }
        if !(self.norm_eps > 0.0 && self.norm_eps.is_finite()) {
            return Err(format!("norm_eps {} must be positive", self.norm_eps));
        }
        if !(self.rope_theta > 0.0 && self.rope_theta.is_finite()) {
            return Err(format!("rope_theta {} must be positive", self.rope_theta));
        }
        if let Some(s) = &self.rope_scaling {
            s.validate(self.head_dim())?;
        }
        Ok(())
    }

    /// Number of weights, counting a tied embedding once.
    pub fn parameter_count(&self) -> usize {
        // Saturating: readers check every dimension against the file, but an architecture can
        // also be built by hand (inspect's presets, tests).
        let (d, h, kv) = (self.dim, self.hidden_dim, self.kv_dim());
        let mul = usize::saturating_mul;
        let per_layer = (2 * d)
            .saturating_add(mul(mul(d, d), 2))
            .saturating_add(mul(mul(2, d), kv))
            .saturating_add(mul(mul(3, d), h));
        let embedding = mul(self.vocab_size, d);
        let head = if self.tied_embeddings { 0 } else { embedding };
        embedding.saturating_add(mul(self.n_layers, per_layer)).saturating_add(d).saturating_add(head)
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
/// elements `(2i, 2i+1)` of a head); loaders of checkpoints that use the rotate-half layout
/// (Hugging Face) un-permute them.
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
    /// RMSNorm weight before the feed-forward layer, `[dim]`.
    pub ffn_norm: HostTensor,
    /// SwiGLU gate projection, `[hidden_dim, dim]`.
    pub w_gate: HostTensor,
    /// SwiGLU up projection, `[hidden_dim, dim]`.
    pub w_up: HostTensor,
    /// SwiGLU down projection, `[dim, hidden_dim]`.
    pub w_down: HostTensor,
    /// Query bias `[n_heads * head_dim]` (Qwen2), in the same interleaved row order as `wq`;
    /// `None` for Llama.
    pub bq: Option<HostTensor>,
    /// Key bias `[n_kv_heads * head_dim]` (Qwen2), in `wk`'s row order.
    pub bk: Option<HostTensor>,
    /// Value bias `[n_kv_heads * head_dim]` (Qwen2).
    pub bv: Option<HostTensor>,
}

impl LayerWeights {
    /// The seven linear weights with their Hugging Face short names, in a fixed order.
    pub fn linears(&self) -> [(&'static str, &HostTensor); 7] {
        [
            ("self_attn.q_proj", &self.wq),
            ("self_attn.k_proj", &self.wk),
            ("self_attn.v_proj", &self.wv),
            ("self_attn.o_proj", &self.wo),
            ("mlp.gate_proj", &self.w_gate),
            ("mlp.up_proj", &self.w_up),
            ("mlp.down_proj", &self.w_down),
        ]
    }

    /// Mutable access to the seven linear weights, same order as [`LayerWeights::linears`].
    pub fn linears_mut(&mut self) -> [(&'static str, &mut HostTensor); 7] {
        [
            ("self_attn.q_proj", &mut self.wq),
            ("self_attn.k_proj", &mut self.wk),
            ("self_attn.v_proj", &mut self.wv),
            ("self_attn.o_proj", &mut self.wo),
            ("mlp.gate_proj", &mut self.w_gate),
            ("mlp.up_proj", &mut self.w_up),
            ("mlp.down_proj", &mut self.w_down),
        ]
    }
}

/// A whole model in host memory: what every loader returns and every later stage consumes.
#[derive(Debug, Clone, PartialEq)]
pub struct HostModel {
    /// Architecture.
    pub arch: LlamaArch,
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
    /// Parameters actually held: [`LlamaArch::parameter_count`] plus the q/k/v biases, if any
    /// (Qwen2).
    pub fn parameter_count(&self) -> usize {
        let biases: usize = self
            .layers
            .iter()
            .flat_map(|l| [&l.bq, &l.bk, &l.bv])
            .map(|b| b.as_ref().map_or(0, |t| t.data.len()))
            .sum();
        self.arch.parameter_count() + biases
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
            f(&mut layer.attn_norm);
            f(&mut layer.ffn_norm);
            for b in [&mut layer.bq, &mut layer.bk, &mut layer.bv].into_iter().flatten() {
                f(b);
            }
            for (_, w) in layer.linears_mut() {
                f(w);
            }
        }
        f(&mut self.final_norm);
        if let Some(o) = &mut self.output {
            f(o);
        }
    }
}
