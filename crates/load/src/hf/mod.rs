//! Hugging Face model folders: `config.json`, safetensors weights, `tokenizer.json`; read, and
//! written for tests.
//!
//! Specs followed:
//! - safetensors: <https://github.com/huggingface/safetensors> (README "Format": `u64` little-endian
//!   header length N, N bytes of JSON `{name: {dtype, shape, data_offsets: [begin, end]}}` with an
//!   optional `__metadata__`, then the byte buffer; offsets are relative to the buffer), parsed
//!   with the `safetensors` crate's `Metadata`; each tensor read from the file when asked
//!   ([`qdrift_io::PinnedFile`]).
//! - sharding: `transformers`' `model.safetensors.index.json` (`weight_map: {tensor: shard file}`).
//! - `config.json`: as `transformers` 5.25.0's config classes read it (`config.rs` lists the
//!   classes, keys, defaults and refusals).
//! - tensor names: `transformers`' `modeling_*.py` of each class:
//!
//! | [`HostModel`](crate::HostModel) field | Hugging Face name | shape |
//! |---|---|---|
//! | `token_embedding` | `model.embed_tokens.weight` | `[vocab, dim]` |
//! | `attn_norm` | `model.layers.{i}.input_layernorm.weight` | `[dim]` |
//! | `wq`, `wk`, `wv`, `wo` | `model.layers.{i}.self_attn.{q,k,v,o}_proj.weight`; Phi-3: `self_attn.qkv_proj.weight` (`[q; k; v]` rows, split) | `[out, in]` |
//! | `bq`, `bk`, `bv` (Qwen2; `attention_bias`), `bo` (`attention_bias`; gpt-oss) | `model.layers.{i}.self_attn.{q,k,v,o}_proj.bias` | `[out]` |
//! | `q_norm`, `k_norm` (Qwen3, Qwen3-MoE, Gemma 3) | `model.layers.{i}.self_attn.{q,k}_norm.weight` | `[head_dim]` |
//! | `sinks` (gpt-oss) | `model.layers.{i}.self_attn.sinks` | `[n_heads]` |
//! | `post_attn_norm` (Gemma) | `model.layers.{i}.post_attention_layernorm.weight` | `[dim]` |
//! | `ffn_norm` | `model.layers.{i}.post_attention_layernorm.weight`; Gemma: `pre_feedforward_layernorm.weight` | `[dim]` |
//! | `post_ffn_norm` (Gemma) | `model.layers.{i}.post_feedforward_layernorm.weight` | `[dim]` |
//! | dense `gate`, `up`, `down` | `model.layers.{i}.mlp.{gate,up,down}_proj.weight`; Phi-3: `mlp.gate_up_proj.weight` (`[gate; up]` rows, split) | `[out, in]` |
//! | experts' `router` | Qwen3-MoE and Qwen2-MoE `mlp.gate.weight`, Mixtral `block_sparse_moe.gate.weight`, gpt-oss `mlp.router.weight` (+ `.bias`) | `[n_experts, dim]` |
//! | expert `e`'s `gate`, `up`, `down` | Qwen3-MoE `mlp.experts.{e}.{gate,up,down}_proj.weight`; Mixtral `block_sparse_moe.experts.{e}.{w1,w3,w2}.weight`; gpt-oss `mlp.experts.gate_up_proj` `[E, dim, 2I]` (columns: gate `0::2`, up `1::2`), `down_proj` `[E, I, dim]`, transposed, with `gate_up_proj_bias`, `down_proj_bias` | `[out, in]` |
//! | shared expert's `gate`, `up`, `down`, `gate` (Qwen2-MoE) | `mlp.shared_expert.{gate,up,down}_proj.weight`, `mlp.shared_expert_gate.weight` | `[out, in]`, `[1, dim]` |
//! | `final_norm` | `model.norm.weight` | `[dim]` |
//! | `output` | `lm_head.weight` (absent or ignored when tied) | `[vocab, dim]` |
//!
//! **RoPE layout.** Hugging Face stores q/k rows in the rotate-half layout (rotation pairs are
//! rows `i` and `i + rotary_dim/2` of a head); [`HostModel`](crate::HostModel) uses the
//! interleaved layout (pairs are rows `2i`, `2i+1`). The reader un-permutes q/k weights and
//! biases and the q/k norm weights, the first `rotary_dim` rows of each head
//! ([`crate::rotate_half_row_order_partial`], llama.cpp `convert_hf_to_gguf.py`'s
//! `LlamaModel.permute`).
//!
//! **Architectures.** `LlamaForCausalLM` (Llama 2/3, SmolLM, TinyLlama), `MistralForCausalLM`,
//! `Qwen2ForCausalLM`, `Qwen3ForCausalLM`, `Qwen3MoeForCausalLM`, `Qwen2MoeForCausalLM`, `Gemma2ForCausalLM`,
//! `Gemma3ForCausalLM` (`gemma3_text`), `Phi3ForCausalLM`, `MixtralForCausalLM`,
//! `GptOssForCausalLM`. Mistral's and Qwen2's `sliding_window` (when set and smaller than
//! `max_position_embeddings`) caps [`crate::ModelArch::max_seq_len`] (within the window,
//! sliding-window attention is full causal attention); the newer classes' windows are per layer
//! ([`crate::ModelArch::windows`]). Multimodal wrappers whose language model is one of these
//! (`Gemma3ForConditionalGeneration`, `Mistral3ForConditionalGeneration`) are read as it: its
//! `text_config`, its weights under `model.language_model.` (or `language_model.model.`), the
//! vision and audio towers set aside with a note ([`crate::LoadedModel::notes`]). Refused with a
//! one-line message naming the feature and the `config.json` field: other multimodal configs, MLA, linear attention, chunked attention, NoPE
//! layers, shared experts other than Qwen2-MoE's, bidirectional attention, RoPE types other than `default`, `linear`,
//! `llama3`, `yarn`, unsupported activations, other architectures; tensor dtypes other than
//! F32/F16/BF16 outside a quantization config; MXFP4 experts.
//!
//! **Quantized folders.** With a `quantization_config` (GPTQ, AWQ, compressed-tensors, FP8) each
//! linear layer is dequantized by [`quant`] (which documents and cites every layout, one file per
//! layout with its unpacking and packing side by side) and then, for q/k, permuted: the
//! permutation moves the real rows. Phi-3's fused modules are dequantized whole, then split;
//! experts stored one module each (Qwen3-MoE, Mixtral) go through the same path; gpt-oss's
//! fused 3-D experts are read as F32/F16/BF16 only (its MXFP4 checkpoints are refused by name).

//!
//! | file | contents |
//! |---|---|
//! | `read.rs` | [`read_hf_folder`]: the folder into a [`crate::LoadedModel`], whole or as a source read part by part (`open_hf_source`), special tokens, source storage of quantized folders |
//! | `config.rs` | `config.json` → [`ModelArch`](crate::ModelArch), refusals |
//! | `shards.rs` | the safetensors files, opened and checked, each tensor read when asked; typed tensor access |
//! | `quant/` | quantized folders: `quantization_config` and one file per layout (GPTQ, AWQ, compressed-tensors, FP8) |
//! | `tokenizer.rs` | [`HfTokenizer`]: `tokenizer.json` through the `tokenizers` crate (also GGUF's byte-level BPE) |
//! | `merges.rs` | a `tokenizer.json`'s BPE merges counted against its vocabulary and checked for repeats, before the `tokenizers` crate reads them |
//! | `write.rs` | [`write_hf_folder`]: a [`HostModel`](crate::HostModel) as a folder (test fixtures) |

pub(crate) mod config;
pub(crate) mod merges;
pub mod quant;
mod read;
pub(crate) mod shards;
pub(crate) mod tokenizer;
pub(crate) mod write;

pub(crate) use read::open_hf_source;
pub use read::read_hf_folder;
pub use tokenizer::HfTokenizer;
pub use write::{WriteDtype, write_hf_folder};
