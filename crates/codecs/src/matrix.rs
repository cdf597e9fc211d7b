//! [`QuantizedMatrix`]: a weight matrix in the packed storage of its [`Scheme`], and [`quantize`],
//! which dispatches to the format's codec (`float.rs`, `int.rs`, `fp8.rs`, `nf4.rs`, `ggml.rs`).

use qdrift_ggml::RowStorage;

use crate::error::QuantizeError;
use crate::packed::{Packed, PackedPart};
use crate::scheme::Scheme;
use crate::{float, fp8, ggml, int, nf4};

#[derive(Debug, Clone, PartialEq)]
enum Storage {
    Float(float::HalfPacked),
    Int8(int::Int8Packed),
    Int4(int::Int4Packed),
    Fp8(fp8::Fp8Packed),
    Nf4(nf4::Nf4Packed),
    Ggml(ggml::GgmlPacked),
}

impl Storage {
    fn packed(&self) -> &dyn Packed {
        match self {
            Storage::Float(p) => p,
            Storage::Int8(p) => p,
            Storage::Int4(p) => p,
            Storage::Fp8(p) => p,
            Storage::Nf4(p) => p,
            Storage::Ggml(p) => p,
        }
    }
}

/// A weight matrix in the packed storage of its [`Scheme`].
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizedMatrix {
    scheme: Scheme,
    rows: usize,
    cols: usize,
    storage: Storage,
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
        self.storage.packed().dequantize(self.rows, self.cols)
    }

    /// Exact bytes of codes, scales and zero points as stored (no padding beyond what the
    /// layout itself has, such as the unused nibble that ends an odd-length int4 or NF4 row).
    pub fn storage_bytes(&self) -> usize {
        self.storage.packed().storage_bytes()
    }

    /// `storage_bytes * 8 / (rows * cols)`; 0 for an empty matrix.
    pub fn bits_per_weight(&self) -> f64 {
        let n = self.rows * self.cols;
        if n == 0 { 0.0 } else { self.storage_bytes() as f64 * 8.0 / n as f64 }
    }

    /// True when a GGML scheme could not store its own type (`cols` not a multiple of its block
    /// size) and stored its llama.cpp fallback type or F16 instead ([`QuantizedMatrix::stored`]).
    pub fn fell_back(&self) -> bool {
        matches!(&self.storage, Storage::Ggml(p) if p.fell_back())
    }

    /// The GGML storage of a matrix a GGUF file can hold as it is: a GGML scheme's type, its
    /// llama.cpp fallback or F16 ([`RowStorage::for_row`]), and `fp16` as F16. `None` for every
    /// other scheme (bf16, int8, int4, FP8, NF4), which GGUF has no type for here.
    pub fn stored(&self) -> Option<RowStorage> {
        match &self.storage {
            Storage::Ggml(p) => Some(p.stored()),
            Storage::Float(_) if self.scheme == Scheme::Fp16 => Some(RowStorage::F16),
            _ => None,
        }
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
        match &self.storage {
            Storage::Ggml(p) => Some(p.bytes().to_vec()),
            Storage::Float(_) if self.scheme == Scheme::Fp16 => self.parts().into_iter().next().map(|part| part.bytes),
            _ => None,
        }
    }

    /// The stored arrays, for writing a packed safetensors file.
    pub fn parts(&self) -> Vec<PackedPart> {
        self.storage.packed().parts(self.rows, self.cols)
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
    let storage = match *scheme {
        Scheme::Fp16 => Storage::Float(float::HalfPacked::quantize(float::Half::F16, weights)),
        Scheme::Bf16 => Storage::Float(float::HalfPacked::quantize(float::Half::BF16, weights)),
        Scheme::Int8 => Storage::Int8(int::Int8Packed::quantize(weights, rows, cols)),
        Scheme::Int4 { group, asym } => Storage::Int4(int::Int4Packed::quantize(weights, rows, cols, group, asym)?),
        Scheme::Fp8 { format, per_tensor } => {
            Storage::Fp8(fp8::Fp8Packed::quantize(weights, rows, cols, format, per_tensor))
        }
        Scheme::Nf4 { block } => Storage::Nf4(nf4::Nf4Packed::quantize(weights, rows, cols, block)),
        Scheme::Ggml(ty) => Storage::Ggml(ggml::GgmlPacked::quantize(ty, weights, rows, cols)?),
    };
    Ok(QuantizedMatrix { scheme: *scheme, rows, cols, storage })
}
