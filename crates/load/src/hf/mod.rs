//! Hugging Face model folders: `config.json`, safetensors weights, `tokenizer.json`; read, and
//! written for tests.
//!
//! Specs followed:
//! - safetensors: <https://github.com/huggingface/safetensors> (README "Format": `u64` little-endian
//!   header length N, N bytes of JSON `{name: {dtype, shape, data_offsets: [begin, end]}}` with an
//!   optional `__metadata__`, then the byte buffer; offsets are relative to the buffer), parsed
//!   with the `safetensors` crate over a memory map.
//! - sharding: `transformers`' `model.safetensors.index.json` (`weight_map: {tensor: shard file}`).
//! - `config.json`: `transformers`' `LlamaConfig`, `MistralConfig`, `Qwen2Config` (field names and
//!   their defaults: `rms_norm_eps` 1e-6, `rope_theta` 10000, `max_position_embeddings` 2048,
//!   `num_key_value_heads` = `num_attention_heads`, `tie_word_embeddings` false).
//! - tensor names: `transformers`' `modeling_llama.py` (`LlamaForCausalLM`), shared by Mistral and
//!   Qwen2:
//!
//! | [`HostModel`](crate::HostModel) field | Hugging Face name | shape |
//! |---|---|---|
//! | `token_embedding` | `model.embed_tokens.weight` | `[vocab, dim]` |
//! | `attn_norm` | `model.layers.{i}.input_layernorm.weight` | `[dim]` |
//! | `wq`, `wk`, `wv`, `wo` | `model.layers.{i}.self_attn.{q,k,v,o}_proj.weight` | `[out, in]` |
//! | `bq`, `bk`, `bv` (Qwen2) | `model.layers.{i}.self_attn.{q,k,v}_proj.bias` | `[out]` |
//! | `ffn_norm` | `model.layers.{i}.post_attention_layernorm.weight` | `[dim]` |
//! | `w_gate`, `w_up`, `w_down` | `model.layers.{i}.mlp.{gate,up,down}_proj.weight` | `[out, in]` |
//! | `final_norm` | `model.norm.weight` | `[dim]` |
//! | `output` | `lm_head.weight` (absent or ignored when tied) | `[vocab, dim]` |
//!
//! **RoPE layout.** Hugging Face stores q/k rows in the rotate-half layout (rotation pairs are
//! rows `i` and `i + head_dim/2` of a head); [`HostModel`](crate::HostModel) uses the interleaved
//! layout (pairs are rows `2i`, `2i+1`). The reader un-permutes q/k weights and biases
//! ([`crate::rotate_half_row_order`], llama.cpp `convert_hf_to_gguf.py`'s `LlamaModel.permute`).
//!
//! **Architectures.** `LlamaForCausalLM` (Llama 2/3, SmolLM, TinyLlama), `MistralForCausalLM`
//! and `Qwen2ForCausalLM`. Mistral's `sliding_window` (when set and smaller than
//! `max_position_embeddings`) caps [`crate::ModelArch::max_seq_len`]: within the window,
//! sliding-window attention is full causal attention, so the model is exact for every length it
//! accepts. Qwen2's q/k/v biases go to [`crate::LayerWeights::bq`] etc.; Llama 3.1+'s
//! `rope_scaling` (`rope_type = llama3`) to [`crate::ModelArch::rope_scaling`], as does
//! `rope_parameters` (the form `transformers` ≥ 5 writes, which also carries `rope_theta`).
//! `qdrift-model` applies both.
//! Refused with a message: other architectures, `head_dim` ≠ `hidden_size / num_attention_heads`,
//! `hidden_act` other than `silu`, `attention_bias`/`mlp_bias` on Llama, `rope_scaling` types
//! other than `llama3` and `default`, tensor dtypes other than F32/F16/BF16 outside a
//! quantization config.
//!
//! **Quantized folders.** With a `quantization_config` (GPTQ, AWQ, compressed-tensors, FP8) each
//! linear layer is dequantized by [`quant`] (which documents and cites every layout, one file per
//! layout with its unpacking and packing side by side) and then, for q/k, permuted: the
//! permutation moves the real rows.

//!
//! | file | contents |
//! |---|---|
//! | `read.rs` | [`read_hf_folder`]: the folder into a [`crate::LoadedModel`], special tokens, source storage of quantized folders |
//! | `config.rs` | `config.json` → [`ModelArch`](crate::ModelArch), refusals |
//! | `shards.rs` | the safetensors files, memory-mapped and checked; typed tensor access |
//! | `quant/` | quantized folders: `quantization_config` and one file per layout (GPTQ, AWQ, compressed-tensors, FP8) |
//! | `tokenizer.rs` | [`HfTokenizer`]: `tokenizer.json` through the `tokenizers` crate (also GGUF's byte-level BPE) |
//! | `write.rs` | [`write_hf_folder`]: a [`HostModel`](crate::HostModel) as a folder (test fixtures) |

mod config;
pub mod quant;
mod read;
pub(crate) mod shards;
pub(crate) mod tokenizer;
pub(crate) mod write;

pub use read::read_hf_folder;
pub use tokenizer::HfTokenizer;
pub use write::{WriteDtype, write_hf_folder};
