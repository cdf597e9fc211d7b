//! Exact weight and activation quantization codecs for qdrift.
//!
//! What goes in: a row-major f32 weight matrix in PyTorch `Linear` layout, `[rows, cols]` =
//! `[out_features, in_features]`, and a [`Scheme`]. What comes out: a [`QuantizedMatrix`] holding
//! the real packed storage (codes, scales, zero points or GGML blocks as bytes), which can be
//! dequantized back to f32, measured ([`QuantizedMatrix::bits_per_weight`]) and written out
//! ([`QuantizedMatrix::parts`]). Groups and blocks always run along a row, over consecutive
//! input features. Beside the weight codecs: the variant grammar ([`Recipe`]) and the host
//! definitions of run-time activation and KV-cache rounding that `qdrift-model` follows.
//!
//! **Architecture invariant:** this crate knows no tensor library, no model and no file format;
//! everything here is a pure function of host data. Whole-model quantization and the writers live
//! one crate up, in `qdrift-quantize`, so that `qdrift-model` can use the codecs without pulling
//! the loaders (tokenizers, safetensors, memory maps) into its build. Each format family lives in
//! one file whose module doc cites its spec:
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
//! | `storage.rs` | [`Scheme::storage_bytes`]: bytes per matrix shape, without quantizing |
//! | `scheme.rs` | [`Scheme`]: the weight formats and their CLI names |
//! | `recipe.rs` | [`Recipe`]: the variant grammar `WEIGHTS[+a-ACT][+kv-KV]`, [`ActivationQuant`], [`KvQuant`] |
//! | `dynamic.rs` | host definitions of activation and KV-cache rounding (`round_host`) |
//! | `stats.rs` | [`error_stats`] |
//! | `error.rs` | [`QuantizeError`] |

#![forbid(unsafe_code)]

mod dynamic;
mod error;
mod float;
mod fp8;
mod ggml;
mod int;
mod matrix;
mod nf4;
mod packed;
mod recipe;
mod scheme;
mod stats;
mod storage;

pub use dynamic::TOKEN_GROUP_EPS;
pub use error::QuantizeError;
pub use fp8::{fp8_decode, fp8_encode};
pub use ggml::dequantize_ggml_blocks;
pub use matrix::{QuantizedMatrix, quantize};
pub use nf4::NF4_CODE;
pub use packed::{PackedDtype, PackedPart};
pub use qdrift_ggml::{GgmlError, RowStorage};
pub use recipe::{ActivationQuant, ActivationScale, DynamicFormat, KvQuant, Recipe};
pub use scheme::{Fp8Format, GgmlType, Scheme};
pub use stats::{ErrorStats, error_stats, try_error_stats};
