//! GGUF files (versions 2 and 3) with the `llama` or `qwen2` architecture, and llama.cpp's
//! `qwen3`, `qwen3moe`, `gemma2`, `gemma3`, `phi3`, `gpt-oss` and `llama` with experts (see
//! `arch.rs`'s table): read, and written.
//!
//! Spec: ggml's `docs/gguf.md`; type ids from `ggml/include/ggml.h` (`ggml_type`) and llama.cpp's
//! `gguf-py/gguf/constants.py` (`GGUFValueType`, `GGMLQuantizationType`, `Keys`). Layout, all
//! little-endian: magic `GGUF`, `u32` version, `u64` tensor count, `u64` metadata count; the
//! metadata key/value pairs (key = string; `u32` value type; value), where a string is a `u64`
//! length and UTF-8 bytes and an array is `u32` element type, `u64` count and the elements; then
//! per tensor: name, `u32` n_dims, `n_dims` × `u64` dims (`ne0`, the row length, first), `u32`
//! `ggml_type`, `u64` offset. The data section starts at the first multiple of
//! `general.alignment` (default 32) after the tensor infos; each offset is relative to it.
//!
//! Every count and length is checked against the bytes that remain before anything is allocated,
//! so a corrupt header is an error naming the file, never a panic or a huge allocation. The file
//! is refused wherever llama.cpp's `gguf_init_from_file_impl` refuses it: a metadata key or a
//! tensor name that appears twice, a name of 64 bytes or more, more than 4 dims, a zero dim or
//! one beyond `i64`, an element count that overflows `i64`, a row that is not whole blocks, an
//! unknown type, a `general.alignment` that is not a `u32` power of two, and tensor data that is
//! misaligned, overlaps another tensor's, runs past the file, or does not follow the infos' order
//! (each tensor where the previous one ends, rounded up to the alignment). Decoded values
//! (dequantized ones included) must be finite.
//!
//! Tensors are dequantized to f32 ([`HostModel`](crate::HostModel)'s form): F32, F16, BF16 and every GGML block
//! format `qdrift-ggml` dequantizes (`GgmlType::READABLE`: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K,
//! Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4; block and byte sizes from `GgmlType`). Any other type
//! (IQ1_S, IQ2_XXS, IQ3_S, TQ1_0, ...) is refused with its ggml name and id. A GGUF matrix with dims
//! `[ne0 = in, ne1 = out]` is `[out, in]` row-major, which is [`HostModel`](crate::HostModel)'s linear layout as
//! is. For `llama`, q/k are kept as stored: llama.cpp's converter already permutes them into the
//! interleaved RoPE layout qdrift uses (llama.cpp's `LLAMA_ROPE_TYPE_NORM`). `qwen2` files keep
//! Hugging Face's rotate-half layout (llama.cpp runs them with `LLAMA_ROPE_TYPE_NEOX`), so their
//! q/k weights and biases are un-permuted as [`crate::read_hf_folder`] does.
//!
//! Hyper-parameters are read from `{arch}.*` keys (`llama.embedding_length`,
//! `qwen2.embedding_length`, ...). Biases: `blk.N.attn_{q,k,v}.bias` (required for `qwen2`,
//! optional for `llama`, as in llama.cpp); any other `.bias` tensor is refused. RoPE, as llama.cpp
//! `llama_model::load_hparams` reads it: `{arch}.rope.dimension_count` must equal the head
//! dimension (partial rotary embeddings are refused); the per-pair divisors of
//! `rope_freqs.weight` (`[head_dim / 2]`, Llama 3.1's scaling as llama.cpp's converter writes it)
//! and the linear factor `{arch}.rope.scaling.factor` (older files: `{arch}.rope.scale_linear`;
//! applied when `{arch}.rope.scaling.type` is `linear` or absent, ignored for `none`) become
//! [`RopeScaling::FreqFactors`](crate::RopeScaling::FreqFactors); other scaling types (`yarn`, `longrope`) are refused.
//!
//! The embedded tokenizer's metadata is kept in [`GgufModel::tokenizer`];
//! [`gguf_tokenizer`] builds the tokenizer from it. [`GgufModel::metadata`] has every key.

//!
//! | file | contents |
//! |---|---|
//! | `read.rs` | [`read_gguf`], [`read_gguf_metadata`]: the container checked, the tensors dequantized |
//! | `arch.rs` | the newer architectures (`Family`): their keys and tensors read as llama.cpp's loader reads them |
//! | `write_arch.rs` | the writer's side of them: which one a model is, refusals by feature, metadata and tensors as llama.cpp's converter writes them |
//! | `tokenizer.rs` | the embedded tokenizer: [`gguf_tokenizer`] reads it; [`gguf_tokenizer_keys`] and [`llama2c_tokenizer_keys`] write it |
//! | `hf_vocab.rs` | [`hf_tokenizer_keys`]: a Hugging Face `tokenizer.json` as GGUF tokenizer metadata, as llama.cpp's converter writes it |
//! | `write.rs` | [`write_gguf`], [`write_gguf_with`]: the writer (fixtures, and `qdrift quantize --format gguf`) |
//! | `tests.rs` | files built in memory, one test per way a file can be wrong |

pub(crate) mod arch;
pub(crate) mod hf_vocab;
pub(crate) mod read;
pub(crate) mod tokenizer;
pub(crate) mod write;
pub(crate) mod write_arch;

#[cfg(test)]
mod tests;

pub use hf_vocab::{UNMERGED_SCORE, hf_tokenizer_keys};
pub use read::{
    GgufModel, GgufTensorSize, GgufTokenizerMetadata, GgufValue, SUPPORTED_GGUF_ARCHITECTURES, read_gguf,
    read_gguf_metadata,
};
pub use tokenizer::{gguf_tokenizer, gguf_tokenizer_keys, llama2c_tokenizer_keys};
pub use write::{GgufMatrix, GgufStored, write_gguf, write_gguf_with};
