//! Loading: model checkpoints and tokenizers into host memory.
//!
//! This crate is the first stage of qdrift's pipeline (load → quantize → generate → score →
//! report → gate). It turns files into [`HostModel`] (an architecture description plus f32
//! weights in a fixed, documented layout) and a [`Tokenizer`]. It does no tensor computation and
//! depends on no tensor library, so the quantizers and the tests can use it cheaply.

mod error;
mod llama2c;
mod open;
mod tokenizer;
mod weights;

pub use error::LoadError;
pub use llama2c::read_llama2c_checkpoint;
pub use open::{LoadedModel, open_model};
pub use tokenizer::{Llama2cTokenizer, Tokenizer};
pub use weights::{HostModel, HostTensor, LayerWeights, LlamaArch};
