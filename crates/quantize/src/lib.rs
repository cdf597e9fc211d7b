//! Exact weight quantization codecs for qdrift.
//!
//! What goes in: a row-major f32 weight matrix in PyTorch `Linear` layout, `[rows, cols]` =
//! `[out_features, in_features]`, and a [`Scheme`]. What comes out: a [`QuantizedMatrix`] holding
//! the real packed storage (codes, scales, zero points or GGML blocks as bytes), which can be
//! dequantized back to f32, measured ([`QuantizedMatrix::bits_per_weight`]) and written out
//! ([`QuantizedMatrix::parts`]). Groups and blocks always run along a row, over consecutive
//! input features.
//!
//! On top of the codecs, [`quantize_model`] applies a scheme to a whole
//! [`qdrift_weights::HostModel`] (weight-only: the blocks' linear layers, optionally the embedding
//! and head); [`write_safetensors`] writes the result as a Hugging Face Llama checkpoint,
//! dequantized (F32) or packed, and [`write_gguf`] as the GGUF file llama.cpp runs (ggml
//! schemes and fp16).
//!
//! **Architecture invariant:** this crate knows no tensor library; the codecs and
//! [`quantize_model`] are pure functions of host data, and `safetensors_out.rs` and `gguf_out.rs`
//! are the only modules that do I/O. Each format family lives in one file whose module doc cites its spec:
//!
//! | file | contents |
//! |---|---|
//! | `matrix.rs` | [`QuantizedMatrix`] and [`quantize`]: dispatch to the format's codec |
//! | `packed.rs` | what the formats share: [`PackedPart`], [`PackedDtype`], the `Packed` trait |
//! | `float.rs` | `fp16`, `bf16` |
//! | `int.rs` | `int8`, `int4-g*`, `int4-g*-asym` |
//! | `fp8.rs` | `fp8-e4m3`, `fp8-e5m2` (+ `-tensor`), with the OFP8 codec |
//! | `nf4.rs` | `nf4-g64` |
//! | `ggml.rs` | `q8_0`, `q4_0`, `q4_1`, `q5_0`, `q4_k`, `q6_k`, `mxfp4` (codecs in `qdrift-ggml`; llama.cpp's fallback for rows that are not whole blocks) |
//! | `footprint.rs` | [`Scheme::storage_bytes`] (bytes per matrix shape), [`SchemeFootprint`] for `qdrift inspect` |
//! | `recipe.rs` | [`Recipe`]: the variant grammar `WEIGHTS[+a-ACT][+kv-KV]`, [`ActivationQuant`], [`KvQuant`] |
//! | `dynamic.rs` | host definitions of activation and KV-cache rounding (`round_host`) |
//! | `stats.rs` | [`error_stats`] |
//! | `reference.rs` | [`round_to_fp16_reference`]: the FP16 reference every variant is measured against |
//! | `model.rs` | [`quantize_model`]: a whole model, per-tensor [`TensorReport`]s, [`QuantSummary`] |
//! | `safetensors_out.rs` | [`write_safetensors`]: HF names, rotate-half q/k, F32 or packed parts; [`write_hf_quantized`] (fixtures) |
//! | `hf_packed.rs` | [`pack_hf`]: a model's linear layers in a Hugging Face quantized layout ([`HfLayout`]), packed by that layout's code in `qdrift-load` ([`qdrift_load::hf::quant`]) |
//! | `gguf_out.rs` | [`write_gguf`]: llama.cpp names and q/k layout, the packed ggml blocks as stored |

mod dynamic;
mod error;
mod float;
mod footprint;
mod fp8;
mod ggml;
mod gguf_out;
mod hf_packed;
mod int;
mod matrix;
mod model;
mod nf4;
mod packed;
mod recipe;
mod reference;
mod safetensors_out;
mod scheme;
mod stats;

pub use dynamic::TOKEN_GROUP_EPS;
pub use error::QuantizeError;
pub use footprint::SchemeFootprint;
pub use fp8::{fp8_decode, fp8_encode};
pub use ggml::dequantize_ggml_blocks;
pub use gguf_out::{GgufWriteError, check_gguf_scheme, gguf_schemes, write_gguf};
pub use hf_packed::{HfLayout, HfPacked, HfTensor, pack_hf};
pub use matrix::{QuantizedMatrix, quantize};
pub use model::{
    QuantSummary, QuantizeOptions, QuantizedModel, QuantizedTensor, TensorReport, WeightSlot, quantize_model,
    quantize_model_owned,
};
pub use nf4::NF4_CODE;
pub use packed::{PackedDtype, PackedPart};
pub use qdrift_ggml::{GgmlError, RowStorage};
pub use qdrift_load::rotate_half_row_order;
pub use recipe::{ActivationQuant, ActivationScale, DynamicFormat, KvQuant, Recipe};
pub use reference::round_to_fp16_reference;
pub use safetensors_out::{WriteError, write_hf_quantized, write_safetensors};
pub use scheme::{Fp8Format, GgmlType, Scheme};
pub use stats::{ErrorStats, error_stats, try_error_stats};
