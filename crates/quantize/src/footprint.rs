//! What a scheme stores for a model, without quantizing it: [`SchemeFootprint`] lends
//! [`Scheme::storage_bytes`] (`qdrift-codecs`) to `qdrift inspect`
//! ([`qdrift_load::inspect::WeightStorage`]), which sizes models too large to quantize here.
//! `tests/footprint.rs` checks that every scheme's formula equals the bytes its codec actually
//! stores.

use qdrift_load::inspect::WeightStorage;

use qdrift_codecs::{QuantizeError, Scheme};

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
