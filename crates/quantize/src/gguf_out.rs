//! Writes a [`QuantizedModel`] as a GGUF file llama.cpp runs: the variant qdrift measured.
//!
//! Spec: ggml `docs/gguf.md`; the layout, metadata and tensor names are
//! [`qdrift_load::write::write_gguf_with`]'s (llama.cpp's names and architectures: `llama` q/k rows
//! interleaved, `qwen2`, `qwen3`, `qwen3moe`, `gemma2`, `gemma3`, `phi3`, `gpt-oss` q/k
//! rotate-half; phi3's fused q‖k‖v and gate‖up and the stacked experts `[E, rows, cols]` made of
//! each matrix's stored rows, so an expert keeps the blocks qdrift quantized it to). Each quantized matrix is stored as it was packed
//! ([`crate::QuantizedMatrix::stored`]: the scheme's ggml type, llama.cpp's fallback type, or F16,
//! with [`crate::QuantizedMatrix::gguf_bytes`], the exact blocks qdrift's quantizer produced);
//! matrices the scheme left alone (the embedding and head unless asked for) as F16, norms and
//! biases as F32. The model's weights are the FP16 reference's ([`crate::round_to_fp16_reference`]),
//! so F16 storage of the unquantized matrices is exact and reading the file back gives
//! [`QuantizedModel::dequantized`] bit for bit.
//!
//! Schemes GGUF can store: those whose format says so ([`Scheme::gguf_storable`]: `fp16` and every
//! ggml scheme, [`gguf_schemes`]); the others (bf16, int8, int4, FP8, NF4) have no ggml type here
//! and are refused. Nothing here names a format.

use std::path::{Path, PathBuf};

use qdrift_load::write::{GgufMatrix, GgufStored, WriteDtype, write_gguf_with};
use qdrift_load::{GgufTensorSize, GgufValue, LoadError};

use crate::model::{QuantizedModel, WeightSlot};
use qdrift_codecs::Scheme;

/// Why a GGUF file could not be written.
#[derive(Debug, thiserror::Error)]
pub enum GgufWriteError {
    /// The scheme has no GGUF (ggml) type.
    #[error(
        "--scheme {scheme} cannot be written as GGUF: GGUF stores ggml types; schemes it can hold: {}",
        gguf_scheme_names()
    )]
    Scheme {
        /// The scheme's CLI name.
        scheme: String,
    },
    /// A quantized tensor with no GGUF storage (a broken invariant: its scheme was checked).
    #[error("{path}: tensor {tensor} has no GGUF storage")]
    Tensor {
        /// The file.
        path: PathBuf,
        /// Hugging Face name of the tensor.
        tensor: String,
    },
    /// The writer's error (I/O, shapes), naming the file.
    #[error(transparent)]
    Load(#[from] LoadError),
}

/// The schemes a GGUF file can store ([`Scheme::gguf_storable`]: `fp16` and the ggml schemes),
/// in [`Scheme::all`] order.
pub fn gguf_schemes() -> Vec<Scheme> {
    Scheme::all().into_iter().filter(Scheme::gguf_storable).collect()
}

fn gguf_scheme_names() -> String {
    gguf_schemes().iter().map(Scheme::to_string).collect::<Vec<_>>().join(", ")
}

/// [`GgufWriteError::Scheme`] unless `scheme` is one of [`gguf_schemes`].
///
/// # Errors
/// As described.
pub fn check_gguf_scheme(scheme: &Scheme) -> Result<(), GgufWriteError> {
    if gguf_schemes().contains(scheme) { Ok(()) } else { Err(GgufWriteError::Scheme { scheme: scheme.to_string() }) }
}

/// Writes `model` to `path` as GGUF v3 with `tokenizer_keys` (the source's `tokenizer.*`
/// metadata, [`qdrift_load::write::gguf_tokenizer_keys`]); atomically (a temporary file beside
/// `path`, renamed over it). Returns the stored size of every tensor in the bytes written
/// (`qdrift_load::write::write_gguf_with`).
///
/// # Shapes
/// Every matrix as [`qdrift_load::HostModel`] holds it (`[out, in]`, blocks along rows); GGUF
/// dims are written innermost first (`[in, out]`), as `gguf.md` orders them.
///
/// # Errors
/// [`GgufWriteError::Scheme`] for a scheme GGUF cannot store, [`GgufWriteError::Tensor`] for a
/// tensor without GGUF storage, and the writer's [`LoadError`] (I/O, shapes) otherwise.
pub fn write_gguf(
    path: &Path,
    model: &QuantizedModel,
    tokenizer_keys: &[(String, GgufValue)],
) -> Result<Vec<GgufTensorSize>, GgufWriteError> {
    check_gguf_scheme(&model.scheme)?;
    // Every quantized tensor must have a GGUF form before anything is written.
    if let Some(t) = model.tensors.iter().find(|t| t.matrix.stored().is_none()) {
        return Err(GgufWriteError::Tensor { path: path.to_path_buf(), tensor: t.name.clone() });
    }
    let stored = |m: GgufMatrix| -> Option<GgufStored> {
        let slot = match m {
            GgufMatrix::TokenEmbedding => WeightSlot::TokenEmbedding,
            GgufMatrix::Output => WeightSlot::OutputHead,
            GgufMatrix::Linear { layer, short_name } => WeightSlot::Linear { layer, short_name },
        };
        let t = model.tensor(slot)?;
        let (ty, bytes) = t.matrix.stored().zip(t.matrix.gguf_bytes())?;
        Some(GgufStored { ggml_type: ty.gguf_id(), bytes })
    };
    Ok(write_gguf_with(path, &model.dequantized, tokenizer_keys, WriteDtype::F16, &stored)?)
}
