//! The `Scheme::Ggml` variants: GGML block formats on a weight matrix.
//!
//! The codecs themselves (block layouts, `quantize_row_*_ref` / `dequantize_row_*` ports and
//! their reference vectors) live in the leaf crate `qdrift-ggml`, which the loader shares for
//! GGUF files. This module only stores a matrix's blocks row by row. When `cols` is not a multiple
//! of the block size the matrix is kept as an f32 copy and [`crate::QuantizedMatrix::fell_back`]
//! is true, as llama.cpp keeps such tensors unquantized.

use qdrift_ggml::{GgmlType, quantize_ggml_blocks};

use crate::error::QuantizeError;
use crate::{Packed, PackedDtype, PackedPart, f32_bytes};

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

#[derive(Debug, Clone, PartialEq)]
enum Data {
    /// `[rows, cols / block_size * type_size]` bytes.
    Blocks(Vec<u8>),
    /// `cols` is not a multiple of the block size: the weights as given.
    Fallback(Vec<f32>),
}

/// A matrix in one GGML block format (or its f32 fallback).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GgmlPacked {
    ty: GgmlType,
    data: Data,
}

impl GgmlPacked {
    /// # Shapes
    /// - `weights`: `[rows, cols]` row-major; blocks run along each row.
    pub(crate) fn quantize(ty: GgmlType, weights: &[f32], rows: usize, cols: usize) -> Self {
        debug_assert_eq!(weights.len(), rows * cols);
        if !cols.is_multiple_of(ty.block_size()) {
            return GgmlPacked { ty, data: Data::Fallback(weights.to_vec()) };
        }
        // Blocks never straddle rows, so one pass over the flat slice equals a pass per row;
        // `cols` being a whole number of blocks, so is `rows * cols`.
        match quantize_ggml_blocks(ty, weights) {
            Ok(bytes) => GgmlPacked { ty, data: Data::Blocks(bytes) },
            Err(_) => GgmlPacked { ty, data: Data::Fallback(weights.to_vec()) },
        }
    }

    pub(crate) fn fell_back(&self) -> bool {
        matches!(self.data, Data::Fallback(_))
    }

    /// Bytes stored for a `[rows, cols]` matrix: `type_size` bytes per block of `block_size`
    /// values, or 4 per value when `cols` is not a whole number of blocks (the f32 fallback).
    pub(crate) fn storage_bytes_for(ty: GgmlType, rows: u64, cols: u64) -> u64 {
        let block = ty.block_size() as u64;
        if cols.is_multiple_of(block) { rows * cols / block * ty.type_size() as u64 } else { 4 * rows * cols }
    }
}

impl Packed for GgmlPacked {
    fn dequantize(&self, rows: usize, cols: usize) -> Vec<f32> {
        match &self.data {
            Data::Blocks(bytes) => dequantize_ggml_blocks(self.ty, bytes, rows * cols)
                .expect("blocks built by `quantize` for exactly rows * cols elements"),
            Data::Fallback(values) => values.clone(),
        }
    }

    fn storage_bytes(&self) -> usize {
        match &self.data {
            Data::Blocks(bytes) => bytes.len(),
            Data::Fallback(values) => 4 * values.len(),
        }
    }

    fn parts(&self, rows: usize, cols: usize) -> Vec<PackedPart> {
        match &self.data {
            Data::Blocks(bytes) => vec![PackedPart {
                name: "blocks",
                dtype: PackedDtype::U8,
                shape: vec![rows, cols / self.ty.block_size() * self.ty.type_size()],
                bytes: bytes.clone(),
            }],
            Data::Fallback(values) => vec![PackedPart {
                name: "values",
                dtype: PackedDtype::F32,
                shape: vec![rows, cols],
                bytes: f32_bytes(values),
            }],
        }
    }
}
