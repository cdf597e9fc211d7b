//! Whole-model quantization and the quantized checkpoints qdrift writes.
//!
//! The codecs themselves (a matrix and a [`Scheme`] in, a [`QuantizedMatrix`] out, and the
//! variant grammar [`Recipe`]) live in `qdrift-codecs` and are re-exported here. On top of them,
//! [`quantize_model`] applies a scheme to a whole [`qdrift_weights::HostModel`] (weight-only: the
//! blocks' linear layers, optionally the embedding and head); [`write_safetensors`] writes the
//! result as a Hugging Face Llama checkpoint, dequantized (F32) or packed, and [`write_gguf`] as
//! the GGUF file llama.cpp runs (ggml schemes and fp16).
//!
//! **Architecture invariant:** this crate knows no tensor library; [`quantize_model`] is a pure
//! function of host data, and `safetensors_out.rs` and `gguf_out.rs` are the only modules that do
//! I/O.
//!
//! | file | contents |
//! |---|---|
//! | `footprint.rs` | [`SchemeFootprint`] for `qdrift inspect` |
//! | `reference.rs` | [`round_to_fp16_reference`]: the FP16 reference every variant is measured against |
//! | `model.rs` | [`quantize_model`]: a whole model, per-tensor [`TensorReport`]s, [`QuantSummary`] |
//! | `source.rs` | [`Reference`], [`QuantizedSource`]: the same, part by part, as a model is built from a weight source |
//! | `safetensors_out.rs` | [`write_safetensors`]: HF names, rotate-half q/k, F32 or packed parts; [`write_compressed_tensors`] (FP4 folders vLLM loads); [`write_hf_quantized`] (fixtures) |
//! | `hf_packed.rs` | [`pack_hf`]: a model's linear layers in a Hugging Face quantized layout ([`HfLayout`]), packed by that layout's code in `qdrift-load` ([`qdrift_load::hf::quant`]) |
//! | `gguf_out.rs` | [`write_gguf`]: llama.cpp names and q/k layout, the packed ggml blocks as stored |
//!
//! Module floors, top first: a module imports only modules on floors below its own
//! (`cargo xtask cycles` checks it).
//!
//! | floor |
//! |---|
//! | `gguf_out.rs`, `safetensors_out.rs`, `source.rs` |
//! | `footprint.rs`, `hf_packed.rs`, `model.rs`, `reference.rs` |

#![forbid(unsafe_code)]

mod footprint;
mod gguf_out;
mod hf_packed;
mod model;
mod reference;
mod safetensors_out;
mod source;

pub use footprint::SchemeFootprint;
pub use gguf_out::{GgufWriteError, check_gguf_scheme, gguf_schemes, write_gguf};
pub use hf_packed::{HfLayout, HfPacked, HfTensor, pack_hf, writes_compressed_tensors};
pub use model::{
    QuantSummary, QuantizeOptions, QuantizedModel, QuantizedTensor, TensorReport, WeightSlot, quantize_model,
    quantize_model_owned,
};
pub use qdrift_codecs::{
    ActivationQuant, ActivationScale, DynamicFormat, ErrorStats, Fp8Format, GgmlError, GgmlType, KvQuant, Mxfp4Rule,
    NF4_CODE, PackedDtype, PackedPart, QuantizeError, QuantizedMatrix, Recipe, RowStorage, Scheme, TOKEN_GROUP_EPS,
    dequantize_ggml_blocks, error_stats, fp8_decode, fp8_encode, quantize, try_error_stats,
};
pub use qdrift_load::rotate_half_row_order;
pub use reference::{ReferenceFormat, round_to_fp16_reference, round_to_reference};
pub use safetensors_out::{WriteError, write_compressed_tensors, write_hf_quantized, write_safetensors};
pub use source::{QuantizedSource, Reference};
