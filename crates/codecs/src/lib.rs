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
//! the loaders (tokenizers, safetensors, memory maps) into its build. A format may state plain
//! facts its writers need (a ggml type, integer codes in affine form), never write a file.
//!
//! **A format is one file.** Each weight format implements the `Format` trait (`format.rs`) in
//! one file of `formats/`, whose module doc cites its spec: its schemes and their CLI names (its
//! grammar), `describe`, `check_usable`, `storage_bytes`, the quantizer and, through the
//! packed storage it returns (the `Packed` trait, `packed.rs`), dequantization, stored bytes,
//! parts and its GGUF form. [`Scheme`] is the value that names a format and its parameters;
//! every one of its methods, and [`quantize`], asks the format that owns it, found in the
//! `FORMATS` table of `formats/mod.rs`. Nothing outside `formats/` matches on a scheme's kind.
//!
//! | file | contents |
//! |---|---|
//! | `scheme.rs` | [`Scheme`] (the formats as values) and [`Fp8Format`] |
//! | `format.rs` | the `Format` trait: what each format owns, and why a static table of trait objects |
//! | `formats/mod.rs` | the registry `FORMATS`; [`Scheme`]'s methods, names and [`Scheme::all`] taken from it |
//! | `formats/float.rs` | `fp16`, `bf16` |
//! | `formats/int.rs` | `int8`, `int4-g*`, `int4-g*-asym` |
//! | `formats/fp8.rs` | `fp8-e4m3`, `fp8-e5m2` (+ `-tensor`), with the OFP8 codec |
//! | `formats/nf4.rs` | `nf4-g64` |
//! | `formats/ggml.rs` | `q8_0`, `q4_0`, `q4_1`, `q5_0`, `q4_k`, `q6_k`, `mxfp4` (codecs in `qdrift-ggml`; llama.cpp's fallback for rows that are not whole blocks) |
//! | `formats/mxfp4.rs` | `mxfp4-ocp`, `mxfp4-ct`: OCP MXFP4 by the spec's and compressed-tensors' scale rules |
//! | `formats/nvfp4.rs` | `nvfp4`: E2M1, E4M3 scale per 16, f32 per tensor, as compressed-tensors quantizes it |
//! | `packed.rs` | what the formats' storage shares: [`PackedPart`], [`PackedDtype`], [`AffineCodes`], the `Packed` trait |
//! | `matrix.rs` | [`QuantizedMatrix`] (a format's packed storage) and [`quantize`] |
//! | `recipe.rs` | [`Recipe`]: the variant grammar `WEIGHTS[+a-ACT][+kv-KV]`, [`ActivationQuant`], [`KvQuant`] |
//! | `dynamic.rs` | host definitions of activation and KV-cache rounding (`round_host`) |
//! | `stats.rs` | [`error_stats`] |
//! | `error.rs` | [`QuantizeError`] |
//!
//! # Adding a format
//!
//! 1. Write `formats/<name>.rs`: a module doc citing the spec (layouts, rounding, what a zero or
//!    overflowing scale does), a packed struct implementing `Packed` (dequantize, storage bytes,
//!    parts; `stored`/`gguf_bytes` if GGUF can hold it), and a unit struct implementing
//!    `Format`, with unit tests of hand-computed vectors at the end of the file. A scale of its
//!    own at a second level (NVFP4's E4M3 scale per 16 values under an f32 scale per tensor) is
//!    one more field and one more part; `formats/fp8.rs`' `fp8_encode` is there to use.
//! 2. Register it in `formats/mod.rs`: its `mod` line and its entry in `FORMATS` (the position is
//!    its place in [`Scheme::all`] and `--help`).
//! 3. Give it its [`Scheme`] variant in `scheme.rs` (the value, with its parameters); the
//!    registry's test names every variant without a wildcard, so it does not compile until the
//!    variant is named there too, and then checks that exactly one format owns it.
//! 4. Export any public item of its own (a code table, a codec function) from this file.
//!
//! The CLI's `--scheme` list and `--help`, `Scheme`'s name round trip, `storage_bytes`,
//! `qdrift inspect`'s footprints and `qdrift-quantize`'s GGUF writer then follow from the trait;
//! `qdrift-quantize`'s `tests/footprint.rs` and this crate's `tests/` check every listed scheme.
//!
//! Module floors, top first: a module imports only modules on floors below its own
//! (`cargo xtask cycles` checks it).
//!
//! | floor |
//! |---|
//! | `dynamic.rs` |
//! | `recipe.rs` |
//! | `formats/` |
//! | `format.rs`, `matrix.rs`, `stats.rs` |
//! | `error.rs`, `packed.rs`, `scheme.rs` |

#![forbid(unsafe_code)]

mod dynamic;
mod error;
mod format;
mod formats;
mod matrix;
mod packed;
mod recipe;
mod scheme;
mod stats;

pub use dynamic::{NVFP4_ZERO_SCALE, TOKEN_GROUP_EPS, mx_scale, nvfp4_global_scale, nvfp4_scale};
pub use error::QuantizeError;
pub use formats::fp8::{fp8_decode, fp8_encode};
pub use formats::ggml::dequantize_ggml_blocks;
pub use formats::nf4::NF4_CODE;
pub use matrix::{QuantizedMatrix, quantize};
pub use packed::{AffineCodes, PackedDtype, PackedPart};
pub use qdrift_ggml::{GgmlError, RowStorage};
pub use recipe::{ActivationQuant, ActivationScale, DynamicFormat, KvQuant, Recipe};
pub use scheme::{Fp8Format, GgmlType, Mxfp4Rule, Scheme};
pub use stats::{ErrorStats, error_stats, try_error_stats};
