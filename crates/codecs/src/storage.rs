//! What a scheme stores for a matrix of a given shape, without quantizing it.
//!
//! [`Scheme::storage_bytes`] is the shape-only form of [`crate::QuantizedMatrix::storage_bytes`]:
//! each format file states its own layout's size next to its packing (`storage_bytes_for`), and
//! `qdrift-quantize`'s `tests/footprint.rs` checks that every scheme's formula equals the bytes
//! its codec actually stores.

use crate::error::QuantizeError;
use crate::scheme::Scheme;
use crate::{float, fp8, ggml, int, nf4};

impl Scheme {
    /// Bytes this scheme stores for a `[rows, cols]` matrix (codes, scales, zero points, blocks):
    /// exactly [`crate::QuantizedMatrix::storage_bytes`] of any such matrix quantized with it.
    ///
    /// # Errors
    /// [`QuantizeError::ZeroGroup`] for a hand-built scheme with a group or block size of zero,
    /// [`QuantizeError::Ggml`] for one naming a read-only GGML type, as [`crate::quantize`]
    /// refuses them.
    pub fn storage_bytes(&self, rows: u64, cols: u64) -> Result<u64, QuantizeError> {
        self.check_usable()?;
        Ok(match *self {
            Scheme::Fp16 | Scheme::Bf16 => float::HalfPacked::storage_bytes_for(rows, cols),
            Scheme::Int8 => int::Int8Packed::storage_bytes_for(rows, cols),
            Scheme::Int4 { group, asym } => int::Int4Packed::storage_bytes_for(rows, cols, group as u64, asym),
            Scheme::Fp8 { per_tensor, .. } => fp8::Fp8Packed::storage_bytes_for(rows, cols, per_tensor),
            Scheme::Nf4 { block } => nf4::Nf4Packed::storage_bytes_for(rows, cols, block as u64),
            Scheme::Ggml(ty) => ggml::GgmlPacked::storage_bytes_for(ty, rows, cols),
        })
    }
}
