//! Loading: model checkpoints and tokenizers into host memory.
//!
//! This crate is the first stage of qdrift's pipeline (load → quantize → generate → score →
//! report → gate). It turns files into [`HostModel`] (an architecture description plus f32
//! weights in a fixed, documented layout) and a [`Tokenizer`]. It does no tensor computation and
//! depends on no tensor library, so the quantizers and the tests can use it cheaply.
//!
//! Formats: llama2.c legacy checkpoints and tokenizers, and GGUF v2/v3 `llama` models
//! ([`read_gguf`], dequantized with `qdrift-ggml`; GGUF's embedded tokenizer is not implemented
//! yet, its metadata is kept in [`GgufModel::tokenizer`]).

mod error;
mod gguf;
mod gguf_tokenizer;
mod hf;
mod hf_tokenizer;
pub mod inspect;
mod llama2c;
mod open;
mod synthetic;
mod tokenizer;
mod weights;
pub mod write;

pub use error::LoadError;
pub use gguf::{GgufModel, GgufTokenizerMetadata, GgufValue, read_gguf};
pub use gguf_tokenizer::gguf_tokenizer;
pub use hf::read_hf_folder;
pub use hf_tokenizer::HfTokenizer;
pub use llama2c::read_llama2c_checkpoint;
pub use open::{LoadedModel, open_model};
pub use synthetic::{
    SYNTHETIC_PRESETS, SYNTHETIC_STD, byte_tokenizer, synthetic_arch, synthetic_model,
};
pub use tokenizer::{Llama2cTokenizer, SpecialIds, Tokenizer};
pub use weights::{HostModel, HostTensor, LayerWeights, LlamaArch, RopeScaling};
