//! What a scheme stores for a matrix of a given shape, without quantizing it.
//!
//! [`Scheme::storage_bytes`] is the shape-only form of [`crate::QuantizedMatrix::storage_bytes`]:
//! each format file states its own layout's size next to its packing (`storage_bytes_for`), and
//! `tests/footprint.rs` checks that every scheme's formula equals the bytes its codec actually
//! stores. [`SchemeFootprint`] lends that accounting to `qdrift inspect`
//! ([`qdrift_load::inspect::WeightStorage`]), which sizes models too large to quantize here.

use qdrift_load::inspect::WeightStorage;

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

/// A scheme's storage, for [`qdrift_load::inspect::inspect`]'s weight-memory accounting: matrices
/// at [`Scheme::storage_bytes`], vectors (RMSNorm weights, biases) at 2 bytes, as they stay FP16
/// in every variant (schemes quantize matrices only, starting from the FP16 reference).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchemeFootprint(Scheme);

impl SchemeFootprint {
    /// The footprint of `scheme`.
    ///
    /// # Errors
    /// [`QuantizeError::ZeroGroup`] for a scheme [`Scheme::storage_bytes`] refuses.
    pub fn new(scheme: Scheme) -> Result<Self, QuantizeError> {
        scheme.check_usable()?;
        Ok(SchemeFootprint(scheme))
    }

    /// The footprints of every scheme with a CLI name, in [`Scheme::all`]'s order.
    pub fn all() -> Vec<SchemeFootprint> {
        // Every listed scheme has non-zero group and block sizes (checked by tests/footprint.rs).
        Scheme::all().into_iter().map(SchemeFootprint).collect()
    }

    /// The scheme.
    pub fn scheme(&self) -> Scheme {
        self.0
    }
}

impl WeightStorage for SchemeFootprint {
    fn name(&self) -> String {
        self.0.to_string()
    }

    fn matrix_bytes(&self, rows: u64, cols: u64) -> u64 {
        // `new` and `all` only hold schemes that `storage_bytes` accepts.
        self.0.storage_bytes(rows, cols).unwrap_or(0)
    }

    fn vector_bytes(&self) -> u64 {
        2
    }
}
