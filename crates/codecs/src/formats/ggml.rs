//! The `Scheme::Ggml` variants (the [`Ggml`] format): GGML block formats on a weight matrix.
//!
//! The codecs themselves (block layouts, `quantize_row_*_ref` / `dequantize_row_*` ports and
//! their reference vectors) live in the leaf crate `qdrift-ggml`, which the loader shares for
//! GGUF files. This module only stores a matrix's blocks row by row.
//!
//! `mxfp4` here is llama.cpp's MXFP4 (what `llama-quantize` writes): the OCP scale rule with
//! ggml's own rounding of ties. The OCP spec's rule (ties to even) and compressed-tensors' (what
//! vLLM checkpoints hold) are `mxfp4-ocp` and `mxfp4-ct`, in `formats/mxfp4.rs`, whose table
//! compares the three.
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
use crate::format::Format;
use crate::packed::{Packed, PackedDtype, PackedPart};
use crate::scheme::Scheme;

/// The format of the `Scheme::Ggml` schemes: one per quantizing [`GgmlType`] (`GgmlType::ALL`).
pub(crate) struct Ggml;

/// The ggml type of a ggml scheme (the registry only hands this format its own schemes).
fn ty(scheme: &Scheme) -> GgmlType {
    match *scheme {
        Scheme::Ggml(ty) => ty,
        _ => GgmlType::Q8_0,
    }
}

impl Format for Ggml {
    fn owns(&self, scheme: &Scheme) -> bool {
        matches!(scheme, Scheme::Ggml(_))
    }

    fn listed(&self) -> Vec<Scheme> {
        GgmlType::ALL.map(Scheme::Ggml).to_vec()
    }

    /// ggml's own name of the type (`q4_k`).
    fn name(&self, scheme: &Scheme) -> String {
        ty(scheme).name().to_owned()
    }

    fn describe(&self, scheme: &Scheme) -> &'static str {
        match ty(scheme) {
            GgmlType::Q8_0 => "llama.cpp Q8_0: int8 with an FP16 scale per block of 32 (8.5 bits/weight).",
            GgmlType::Q4_0 => "llama.cpp Q4_0: 4-bit with an FP16 scale per block of 32 (4.5 bits/weight).",
            GgmlType::Q4_1 => {
                "llama.cpp Q4_1: 4-bit with an FP16 scale and FP16 minimum per block of 32 (5 bits/weight)."
            }
            GgmlType::Q5_0 => "llama.cpp Q5_0: 5-bit with an FP16 scale per block of 32 (5.5 bits/weight).",
            GgmlType::Q4K => {
                "llama.cpp Q4_K: 4-bit super-blocks of 256 with searched 6-bit sub-block scales and mins (4.5 bits/weight); rows that are not whole 256-blocks as Q5_0, as llama.cpp does."
            }
            GgmlType::Q6K => {
                "llama.cpp Q6_K: 6-bit super-blocks of 256 with searched 8-bit sub-block scales (6.5625 bits/weight); rows that are not whole 256-blocks as Q8_0, as llama.cpp does."
            }
            GgmlType::Mxfp4 => {
                "OCP MXFP4 as llama.cpp quantizes it: E2M1 values with an E8M0 scale 2^(floor(log2 amax) − 2) per block of 32, ties to the smaller value (4.25 bits/weight)."
            }
            // Not in `GgmlType::ALL`: only a hand-built scheme can name one, and `quantize` refuses it.
            GgmlType::Q5_1
            | GgmlType::Q2K
            | GgmlType::Q3K
            | GgmlType::Q5K
            | GgmlType::Iq4Nl
            | GgmlType::Iq4Xs
            | GgmlType::Nvfp4 => "A llama.cpp block format qdrift reads from GGUF files but cannot quantize to.",
        }
    }

    /// Refuses a read-only type ([`qdrift_ggml::GgmlError::NoQuantizer`]).
    fn check_usable(&self, scheme: &Scheme) -> Result<(), QuantizeError> {
        let ty = ty(scheme);
        if ty.has_quantizer() { Ok(()) } else { Err(qdrift_ggml::GgmlError::NoQuantizer { ty }.into()) }
    }

    fn storage_bytes(&self, scheme: &Scheme, rows: u64, cols: u64) -> u64 {
        GgmlPacked::storage_bytes_for(ty(scheme), rows, cols)
    }

    fn quantize(
        &self,
        scheme: &Scheme,
        weights: &[f32],
        rows: usize,
        cols: usize,
    ) -> Result<Box<dyn Packed>, QuantizeError> {
        Ok(Box::new(GgmlPacked::quantize(ty(scheme), weights, rows, cols)?))
    }

    /// Every ggml scheme: GGUF holds its blocks (or llama.cpp's fallback, or F16) as they are.
    fn gguf_storable(&self, _scheme: &Scheme) -> bool {
        true
    }
}

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
    /// [`Scheme::check_usable`] first).
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

    /// What is stored: the scheme's type, its fallback, or F16.
    fn stored(&self) -> Option<RowStorage> {
        Some(self.stored)
    }

    /// The stored bytes: blocks row by row, or binary16 values.
    fn gguf_bytes(&self, _rows: usize, _cols: usize) -> Option<Vec<u8>> {
        Some(self.bytes.clone())
    }

    /// True when the stored type is not the scheme's.
    fn fell_back(&self) -> bool {
        self.stored != RowStorage::Blocks(self.ty)
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
