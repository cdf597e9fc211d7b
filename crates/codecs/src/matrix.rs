//! [`QuantizedMatrix`]: a weight matrix in the packed storage of its [`Scheme`], and [`quantize`],
//! which checks the input and hands it to the scheme's format (`formats/`). The matrix holds the
//! format's packed storage as a [`Packed`] trait object, so every method here is the format's
//! own; nothing in this file knows a format.

use std::fmt;

use qdrift_ggml::RowStorage;

use crate::error::QuantizeError;
use crate::packed::{AffineCodes, Packed, PackedPart};
use crate::scheme::Scheme;

/// A weight matrix in the packed storage of its [`Scheme`].
pub struct QuantizedMatrix {
    scheme: Scheme,
    rows: usize,
    cols: usize,
    storage: Box<dyn Packed>,
}

impl fmt::Debug for QuantizedMatrix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QuantizedMatrix")
            .field("scheme", &self.scheme)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .field("storage", &self.storage)
            .finish()
    }
}

impl Clone for QuantizedMatrix {
    fn clone(&self) -> Self {
        QuantizedMatrix { scheme: self.scheme, rows: self.rows, cols: self.cols, storage: self.storage.clone_box() }
    }
}

impl PartialEq for QuantizedMatrix {
    fn eq(&self, other: &Self) -> bool {
        (self.scheme, self.rows, self.cols) == (other.scheme, other.rows, other.cols)
            && self.storage.eq_dyn(other.storage.as_ref())
    }
}

impl QuantizedMatrix {
    /// The scheme it was quantized with.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// Output channels.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Back to f32: code × scale (minus zero point), computed in f32 as each format specifies.
    ///
    /// # Shapes
    /// - returns: `[rows, cols]`, row-major.
    pub fn dequantize(&self) -> Vec<f32> {
        self.storage.dequantize(self.rows, self.cols)
    }

    /// Exact bytes of codes, scales and zero points as stored (no padding beyond what the
    /// layout itself has, such as the unused nibble that ends an odd-length int4 or NF4 row).
    pub fn storage_bytes(&self) -> usize {
        self.storage.storage_bytes()
    }

    /// `storage_bytes * 8 / (rows * cols)`; 0 for an empty matrix.
    pub fn bits_per_weight(&self) -> f64 {
        let n = self.rows * self.cols;
        if n == 0 { 0.0 } else { self.storage_bytes() as f64 * 8.0 / n as f64 }
    }

    /// True when a GGML scheme could not store its own type (`cols` not a multiple of its block
    /// size) and stored its llama.cpp fallback type or F16 instead ([`QuantizedMatrix::stored`]).
    pub fn fell_back(&self) -> bool {
        self.storage.fell_back()
    }

    /// The GGML storage of a matrix a GGUF file can hold as it is: a GGML scheme's type, its
    /// llama.cpp fallback or F16 ([`RowStorage::for_row`]), and `fp16` as F16. `None` for every
    /// other scheme (bf16, int8, int4, FP8, NF4), which GGUF has no type for here
    /// ([`Scheme::gguf_storable`]).
    pub fn stored(&self) -> Option<RowStorage> {
        self.storage.stored()
    }

    /// The name of what is stored: [`QuantizedMatrix::stored`]'s name where there is one
    /// (`q4_k`, `q5_0`, `f16`, ...), else the scheme's.
    pub fn stored_name(&self) -> String {
        self.stored().map_or_else(|| self.scheme.to_string(), |s| s.name().to_owned())
    }

    /// The bytes a GGUF tensor of type [`QuantizedMatrix::stored`] holds, row by row (blocks, or
    /// little-endian binary16 values); `None` where `stored` is `None`.
    ///
    /// # Shapes
    /// - returns: `rows` equal chunks, one per row, of `stored.bytes_for(1, cols)` bytes.
    pub fn gguf_bytes(&self) -> Option<Vec<u8>> {
        self.storage.gguf_bytes(self.rows, self.cols)
    }

    /// The stored arrays, for writing a packed safetensors file.
    pub fn parts(&self) -> Vec<PackedPart> {
        self.storage.parts(self.rows, self.cols)
    }

    /// An integer scheme's (`int8`, `int4-g*`) codes in unsigned affine form, as the integer
    /// checkpoint layouts store them; `None` for every other scheme.
    ///
    /// # Shapes
    /// - codes `[rows, cols]`; zeros and scales `[rows, groups]`.
    pub fn affine(&self) -> Option<AffineCodes> {
        self.storage.affine(self.rows, self.cols)
    }
}

/// Quantizes a weight matrix.
///
/// # Shapes
/// - `weights`: `[rows, cols]` row-major, `rows` = output channels, `cols` = input features.
///
/// # Errors
/// Length mismatch, a non-finite weight (named by index), a zero group size in a hand-built
/// scheme, or an int4 group scale that overflows FP16.
pub fn quantize(scheme: &Scheme, weights: &[f32], rows: usize, cols: usize) -> Result<QuantizedMatrix, QuantizeError> {
    let expected = rows.checked_mul(cols).ok_or(QuantizeError::ShapeOverflow { rows, cols })?;
    if weights.len() != expected {
        return Err(QuantizeError::LengthMismatch { len: weights.len(), rows, cols, expected });
    }
    if let Some(index) = weights.iter().position(|w| !w.is_finite()) {
        return Err(QuantizeError::NonFinite { index, row: index / cols, col: index % cols, value: weights[index] });
    }
    scheme.check_usable()?;
    let storage = scheme.format().quantize(scheme, weights, rows, cols)?;
    Ok(QuantizedMatrix { scheme: *scheme, rows, cols, storage })
}
