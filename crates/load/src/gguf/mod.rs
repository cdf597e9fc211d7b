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
//! Tensors are dequantized to f32 ([`HostModel`]'s form): F32, F16, BF16 and every GGML block
//! format `qdrift-ggml` dequantizes (`GgmlType::READABLE`: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K,
//! Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4, NVFP4 (llama.cpp's, without a global scale); block and
//! byte sizes from `GgmlType`). Any other type (IQ1_S, IQ2_XXS, IQ3_S, TQ1_0, ...) is refused
//! with its ggml name and id. A GGUF matrix with dims `[ne0 = in, ne1 = out]` is `[out, in]`
//! row-major, which is [`HostModel`]'s linear layout as is. For `llama`, q/k are kept as stored: llama.cpp's converter already permutes them into the
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
//! [`RopeScaling::FreqFactors`](qdrift_weights::RopeScaling::FreqFactors)(crate::RopeScaling::FreqFactors); other scaling types (`yarn`, `longrope`) are refused.
//!
//! The embedded tokenizer's metadata is kept in [`GgufModel::tokenizer`];
//! [`gguf_tokenizer`] builds the tokenizer from it. [`GgufModel::metadata`] has every key.

//!
//! | file | contents |
//! |---|---|
//! | `read.rs` | [`read_gguf`], [`read_gguf_metadata`]: the container checked, the model planned (`ModelPlan`: its architecture and block reader) and its tensors dequantized, whole or part by part from the open file (`GgufFile`) |
//! | `arch.rs` | the newer architectures (the families of `arch/`): their keys and tensors read as llama.cpp's loader reads them |
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
    GgufModel, GgufTensorSize, GgufTokenizerMetadata, GgufValue, SUPPORTED_GGUF_ARCHITECTURES, read_gguf_metadata,
};
pub use tokenizer::{gguf_tokenizer, gguf_tokenizer_keys, llama2c_tokenizer_keys};
pub use write::{GgufMatrix, GgufStored};

use std::path::Path;

use crate::LoadError;
use crate::hf::write::{WriteDtype, qkv_biases_all_or_none, refuse_non_llama_block};
use crate::tokenizer::Llama2cTokenizer;
use qdrift_weights::HostModel;
use write::{Kv, gguf_arch_metadata, gguf_bytes, gguf_name, gguf_tensors};
use write_arch::{check_writable, family_metadata, family_tensors, writer_family};

/// Reads a GGUF file of one of [`SUPPORTED_GGUF_ARCHITECTURES`], dequantizing every tensor to f32.
///
/// # Errors
/// [`LoadError`] naming the file and, where it applies, the tensor, its expected dims and what is
/// wrong: an unreadable or truncated file, a bad magic or version, counts or offsets beyond the
/// file, an unsupported tensor type or architecture, a missing or misshapen tensor.
pub fn read_gguf(path: &Path) -> Result<GgufModel, LoadError> {
    let bytes = crate::input::read_file(path, crate::input::MODEL)?;
    parse_gguf(path, &bytes)
}

/// [`read_gguf`] of a file's bytes: the container read by `read.rs`, the blocks of the
/// architectures of `arch.rs` by their reader (defined here, above both, so that neither module
/// imports the other's dependants).
pub(crate) fn parse_gguf(path: &Path, bytes: &[u8]) -> Result<GgufModel, LoadError> {
    read::parse_gguf_with(path, bytes, arch::read_family_of)
}

/// [`read_gguf`] with the weights as a source that reads each part from the file when asked
/// (`GgufFile`): the file is read through once at open, so that every error [`read_gguf`] reports
/// is reported there, and nothing of it is kept; a file changed or cut short since then is an
/// error when a part is read again ([`qdrift_io::PinnedFile`]).
///
/// # Errors
/// As [`read_gguf`].
pub(crate) fn open_gguf_source(path: &Path) -> Result<GgufModel<crate::loaded::PartSource<read::GgufFile>>, LoadError> {
    let file = crate::input::open_pinned(path, crate::input::MODEL)?;
    read::gguf_source_with(path, file, arch::read_family_of)
}

/// Writes `model` and `tokenizer` as a GGUF v3 file with the `llama` architecture, or `qwen2`
/// when the layers have q/k/v biases (all three in every layer).
///
/// Spec: ggml `docs/gguf.md` (layout as [`crate::read_gguf`] describes it; alignment 32).
/// Metadata: `general.architecture` (`ARCH` = `llama` or `qwen2`), `general.alignment`,
/// `ARCH.context_length`, `ARCH.embedding_length`, `ARCH.block_count`, `ARCH.feed_forward_length`,
/// `ARCH.attention.head_count`, `ARCH.attention.head_count_kv`,
/// `ARCH.attention.layer_norm_rms_epsilon`, `ARCH.rope.freq_base`, `ARCH.rope.dimension_count`,
/// `ARCH.vocab_size`; tokenizer: [`llama2c_tokenizer_keys`].
/// Tensors use llama.cpp's names (`token_embd`, `blk.N.attn_q`, `blk.N.attn_q.bias`, ...);
/// matrices are stored in `dtype`, 1-D norms, biases and `rope_freqs.weight` always as F32 (as
/// llama.cpp's converter does). `llama` q/k stay interleaved (GGUF's layout); `qwen2` q/k weights
/// and biases are written in Hugging Face's rotate-half layout, as llama.cpp's converter leaves
/// them. RoPE scaling becomes `rope_freqs.weight`: [`RopeScaling::FreqFactors`](qdrift_weights::RopeScaling::FreqFactors) as is,
/// [`RopeScaling::Llama3`](qdrift_weights::RopeScaling::Llama3) as llama.cpp's converter computes it. The write is atomic
/// ([`write_gguf_with`]).
///
/// # Errors
/// [`LoadError::Invalid`] for `dtype = BF16` (not offered here), a piece that is not UTF-8 or
/// biases in some layers only, and the I/O error otherwise.
pub fn write_gguf(
    path: &Path,
    model: &HostModel,
    tokenizer: &Llama2cTokenizer,
    dtype: WriteDtype,
) -> Result<(), LoadError> {
    let keys = llama2c_tokenizer_keys(path, tokenizer)?;
    write_gguf_with(path, model, &keys, dtype, &|_| None).map(drop)
}

/// Writes `model` as a GGUF v3 file (as [`write_gguf`] describes it) with the tokenizer metadata
/// `tokenizer_keys` written as given (every key must start with `tokenizer.`; see
/// [`gguf_tokenizer_keys`]), and each matrix stored as `store` returns it, or in `dtype` (F32 or
/// F16) where it returns `None`. Stored rows of `qwen2` q/k are permuted to the rotate-half
/// layout like the values (blocks run along rows, so whole rows move).
///
/// The write is atomic ([`qdrift_io::write_atomic`]): the file is written to a uniquely named
/// temporary file in the same folder and renamed over `path`; on failure the temporary file is
/// removed and `path` is left as it was. Returns the stored size of every tensor written (as
/// [`read_gguf_tensor_sizes`](read::read_gguf_tensor_sizes) would read them from the file), taken from the bytes written, not
/// from `path`, which a concurrent writer of the same output may have replaced since.
///
/// # Errors
/// [`LoadError::Invalid`] for `dtype = BF16`, a tokenizer key outside `tokenizer.`, a stored
/// matrix whose type is not F16 or a readable block type, or whose bytes do not match its shape
/// (naming the tensor), biases in some layers only; the I/O error otherwise.
pub fn write_gguf_with(
    path: &Path,
    model: &HostModel,
    tokenizer_keys: &[(String, GgufValue)],
    dtype: WriteDtype,
    store: &dyn Fn(GgufMatrix) -> Option<GgufStored>,
) -> Result<Vec<GgufTensorSize>, LoadError> {
    if dtype == WriteDtype::BF16 {
        return Err(LoadError::invalid(path, "write_gguf writes F32 or F16 only"));
    }
    let mut kv = Kv::default();
    let name = gguf_name(&model.arch, tokenizer_keys);
    let tensors = match writer_family(model) {
        Some(family) => {
            check_writable(path, model, family)?;
            family_metadata(&mut kv, path, (model, &name), family)?;
            family_tensors(path, model, family)?
        }
        None => {
            let writes = "qdrift writes Llama, Mistral and Qwen2 blocks, and as GGUF also qwen3, qwen3moe, qwen2moe, \
                          gemma2, gemma3, phi3, gpt-oss and Mixtral (llama with experts)";
            refuse_non_llama_block(path, model, false, writes)?;
            let qwen2 = qkv_biases_all_or_none(path, model)?;
            gguf_arch_metadata(&mut kv, path, (&model.arch, &name), if qwen2 { "qwen2" } else { "llama" })?;
            gguf_tensors(path, model, qwen2)?
        }
    };
    for (key, value) in tokenizer_keys {
        if !key.starts_with("tokenizer.") {
            return Err(LoadError::invalid(path, format!("metadata key {key} is not a tokenizer key")));
        }
        kv.value(key, value);
    }
    let bytes = gguf_bytes(path, &kv, &tensors, dtype, store)?;
    let sizes = read::tensor_sizes_of(path, &bytes)?;
    qdrift_io::write_atomic(path, &bytes)?;
    Ok(sizes)
}
