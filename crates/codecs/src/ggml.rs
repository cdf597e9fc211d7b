//! The `Scheme::Ggml` variants: GGML block formats on a weight matrix.
//!
//! The codecs themselves (block layouts, `quantize_row_*_ref` / `dequantize_row_*` ports and
//! their reference vectors) live in the leaf crate `qdrift-ggml`, which the loader shares for
//! GGUF files. This module only stores a matrix's blocks row by row.
//!
//! **Rows that are not whole blocks.** A scheme stores what llama.cpp's `llama-quantize` would
//! store for the matrix ([`qdrift_ggml::RowStorage::for_row`], after `llama_tensor_get_type` in
//! llama.cpp `src/llama-quant.cpp`): the scheme's type when `cols` is a whole number of its
//! blocks, else its fallback type (`q4_k` → `q5_0`, `q6_k` → `q8_0`) when `cols` is a whole
//! number of the fallback's blocks, else F16. So `qdrift eval --schemes q4_k` measures exactly
//! the tensors `qdrift quantize --format gguf` writes, and [`crate::QuantizedMatrix::stored`]
//! names what was stored ([`crate::QuantizedMatrix::fell_back`] when it is not the scheme's type).

use half::f16;
use qdrift_ggml::{GgmlType, RowStorage, quantize_ggml_blocks};

use crate::error::QuantizeError;
use crate::packed::{Packed, PackedDtype, PackedPart};

/// Dequantizes a buffer of GGML blocks exactly as `dequantize_row_*` does (for GGUF loading);
/// [`qdrift_ggml::dequantize_ggml_blocks`] with this crate's error type.
///
/// # Shapes
/// - `bytes`: `n_elements / block_size * type_size` bytes of consecutive blocks.
/// - returns: `n_elements` f32 values.
///
/// # Errors
/// [`QuantizeError::Ggml`] when `n_elements` is not a multiple of the block size or `bytes` has
/// the wrong length.
pub fn dequantize_ggml_blocks(ty: GgmlType, bytes: &[u8], n_elements: usize) -> Result<Vec<f32>, QuantizeError> {
    qdrift_ggml::dequantize_ggml_blocks(ty, bytes, n_elements).map_err(QuantizeError::from)
}

/// A matrix as GGML stores it: blocks of the scheme's type or its fallback, or F16 values.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GgmlPacked {
    /// The scheme's type.
    ty: GgmlType,
    /// What is stored ([`RowStorage::for_row`] of `ty` and the row length).
    stored: RowStorage,
    /// `[rows, cols / block_size * type_size]` bytes of blocks, or `[rows, cols]` little-endian
    /// binary16 values.
    bytes: Vec<u8>,
}

impl GgmlPacked {
    /// # Shapes
    /// - `weights`: `[rows, cols]` row-major; blocks run along each row.
    ///
    /// # Errors
    /// [`QuantizeError::Ggml`] for a type without a quantizer (callers check
    /// [`crate::Scheme::check_usable`] first).
    pub(crate) fn quantize(ty: GgmlType, weights: &[f32], rows: usize, cols: usize) -> Result<Self, QuantizeError> {
        debug_assert_eq!(weights.len(), rows * cols);
        let stored = RowStorage::for_row(ty, cols);
        let bytes = match stored {
            // Blocks never straddle rows, so one pass over the flat slice equals a pass per row;
            // `cols` being a whole number of blocks, so is `rows * cols`.
            RowStorage::Blocks(t) => quantize_ggml_blocks(t, weights)?,
            RowStorage::F16 => weights.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect(),
        };
        Ok(GgmlPacked { ty, stored, bytes })
    }

    /// What is stored: the scheme's type, its fallback, or F16.
    pub(crate) fn stored(&self) -> RowStorage {
        self.stored
    }

    /// True when the stored type is not the scheme's.
    pub(crate) fn fell_back(&self) -> bool {
        self.stored != RowStorage::Blocks(self.ty)
    }

    /// The stored bytes: blocks row by row, or binary16 values (see [`GgmlPacked::parts`]).
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Bytes stored for a `[rows, cols]` matrix: [`RowStorage::bytes_for`] of the storage
    /// [`RowStorage::for_row`] picks (saturating; no real matrix comes near).
    pub(crate) fn storage_bytes_for(ty: GgmlType, rows: u64, cols: u64) -> u64 {
        let cols_usize = usize::try_from(cols).unwrap_or(usize::MAX);
        RowStorage::for_row(ty, cols_usize).bytes_for(rows, cols).unwrap_or(u64::MAX)
    }
}

impl Packed for GgmlPacked {
    fn dequantize(&self, rows: usize, cols: usize) -> Vec<f32> {
        match self.stored {
            RowStorage::Blocks(t) => dequantize_ggml_blocks(t, &self.bytes, rows * cols)
                .expect("blocks built by `quantize` for exactly rows * cols elements"),
            RowStorage::F16 => self.bytes.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        }
    }

    fn storage_bytes(&self) -> usize {
        self.bytes.len()
    }

    fn parts(&self, rows: usize, cols: usize) -> Vec<PackedPart> {
        match self.stored {
            RowStorage::Blocks(t) => vec![PackedPart {
                name: "blocks",
                dtype: PackedDtype::U8,
                shape: vec![rows, cols / t.block_size() * t.type_size()],
                bytes: self.bytes.clone(),
            }],
            RowStorage::F16 => {
                vec![PackedPart {
                    name: "values",
                    dtype: PackedDtype::F16,
                    shape: vec![rows, cols],
                    bytes: self.bytes.clone(),
                }]
            }
        }
    }
}
