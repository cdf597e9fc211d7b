//! Loading: model checkpoints and tokenizers into host memory.
//!
//! This crate is the first stage of qdrift's pipeline (load → quantize → generate → score →
//! report → gate). It turns files into [`HostModel`] (an architecture description plus f32
//! weights in a fixed, documented layout) and a [`Tokenizer`]. It does no tensor computation and
//! depends on no tensor library, so the quantizers and the tests can use it cheaply.
//!
//! [`open_model`] picks the format from the path:
//!
//! | path | format | reader | tokenizer |
//! |---|---|---|---|
//! | `*.bin` | llama2.c legacy checkpoint | [`read_llama2c_checkpoint`] | llama2.c `tokenizer.bin` ([`Llama2cTokenizer`]) |
//! | `*.gguf` | GGUF v2/v3 `llama` or `qwen2`, dequantized with `qdrift-ggml` | [`read_gguf`] | embedded: `gpt2` byte-level BPE or `llama` SentencePiece ([`gguf_tokenizer`]) |
//! | a folder | Hugging Face `config.json` + safetensors (F32/F16/BF16, sharded or not; GPTQ, AWQ, compressed-tensors and FP8 quantized folders dequantized on load): Llama, Mistral, Qwen2 | [`read_hf_folder`] | `tokenizer.json` via the `tokenizers` crate ([`HfTokenizer`]) |
//! | `synthetic:NAME[:SEED]` | seeded random weights of a real shape | [`synthetic_model`] | byte level ([`byte_tokenizer`]) |
//!
//! Every reader checks the file against its spec (cited in each module) before allocating, and
//! every bad input is a [`LoadError`] naming the file and, where it applies, the tensor and its
//! expected shape. Before a file is opened its type is checked (a named pipe, a device or a
//! socket is refused unopened); small files read whole (JSON, tokenizers) have a size cap;
//! declared counts are checked against the file's length before anything is allocated; every
//! weight is checked to be finite after decoding. [`LoadedModel`] also carries the source dtypes, the chat template, the
//! [`ModelFormat`] (which says whether the weights are synthetic) and, for a quantized Hugging
//! Face folder, its [`CheckpointQuant`] (stored format and declared dynamic activations) for
//! reports and `qdrift eval`.
//!
//! Beside the readers: [`write`](mod@write) writes a model as a Hugging Face folder or a GGUF file (fixtures
//! for round-trip tests, and `qdrift quantize --format gguf`'s writer, which stores ggml blocks as
//! the caller packed them with the source's tokenizer metadata, a Hugging Face `tokenizer.json`
//! converted to GGUF's vocabulary), and [`inspect`] accounts parameters, weight memory per storage scheme,
//! KV-cache memory, FLOPs per token and a GGUF file's stored bytes and bits per weight per tensor
//! type.
//!
//! **Architecture invariant:** weights leave this crate as f32 in [`HostModel`]'s layout
//! (`[out, in]` linears, q/k rows and biases in the interleaved RoPE layout) whatever the source
//! format; a checkpoint feature that [`HostModel`] cannot carry (another RoPE scaling, other
//! biases, partial rotary dimensions) is refused by its reader, never dropped.

mod error;
mod gguf;
mod gguf_tokenizer;
mod hf;
mod hf_gguf_vocab;
mod hf_quant;
mod hf_tokenizer;
mod input;
pub mod inspect;
mod llama2c;
pub mod ofp8;
mod open;
mod rope_layout;
mod synthetic;
mod tokenizer;
mod weights;
pub mod write;

pub use error::LoadError;
pub use gguf::{GgufModel, GgufTensorSize, GgufTokenizerMetadata, GgufValue, read_gguf, read_gguf_metadata};
pub use gguf_tokenizer::gguf_tokenizer;
pub use hf::read_hf_folder;
pub use hf_quant::{ActivationFormat, ActivationGranularity, CheckpointActivations, CheckpointQuant};
pub use hf_tokenizer::HfTokenizer;
pub use llama2c::read_llama2c_checkpoint;
pub use open::{LoadedModel, ModelFormat, open_model};
pub use rope_layout::rotate_half_row_order;
pub use synthetic::{SYNTHETIC_PRESETS, SYNTHETIC_STD, byte_tokenizer, synthetic_arch, synthetic_model};
pub use tokenizer::{Llama2cTokenizer, SpecialIds, Tokenizer};
pub use weights::{HostModel, HostTensor, LayerWeights, LlamaArch, RopeScaling};
