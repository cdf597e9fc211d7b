//! What every packed format shares: the [`PackedPart`]s a matrix is stored as (with their
//! [`PackedDtype`]), the [`Packed`] operations each format's storage provides, the integer
//! formats' [`AffineCodes`], and two helpers.

use std::any::Any;
use std::fmt;
use std::panic::{RefUnwindSafe, UnwindSafe};

use qdrift_ggml::RowStorage;

/// Element type of one [`PackedPart`], named as safetensors names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PackedDtype {
    /// Unsigned bytes (packed nibbles, FP8/GGML raw bytes).
    U8,
    /// Signed bytes.
    I8,
    /// IEEE binary16, little-endian.
    F16,
    /// bfloat16, little-endian.
    BF16,
    /// IEEE binary32, little-endian.
    F32,
    /// OCP FP8 E4M3 (safetensors `F8_E4M3`).
    F8E4M3,
    /// OCP FP8 E5M2 (safetensors `F8_E5M2`).
    F8E5M2,
    /// Little-endian 32-bit integers (GPTQ/AWQ/compressed-tensors packed words).
    I32,
    /// Little-endian 64-bit integers (compressed-tensors `weight_shape`).
    I64,
}

impl PackedDtype {
    /// The safetensors dtype string.
    pub fn safetensors_name(self) -> &'static str {
        match self {
            PackedDtype::U8 => "U8",
            PackedDtype::I8 => "I8",
            PackedDtype::F16 => "F16",
            PackedDtype::BF16 => "BF16",
            PackedDtype::F32 => "F32",
            PackedDtype::F8E4M3 => "F8_E4M3",
            PackedDtype::F8E5M2 => "F8_E5M2",
            PackedDtype::I32 => "I32",
            PackedDtype::I64 => "I64",
        }
    }
}

/// One stored array of a quantized matrix, ready to be written as a safetensors tensor named
/// `<weight name>.<name>`.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedPart {
    /// Suffix naming the part: `values`, `codes`, `scales`, `zeros` or `blocks`.
    pub name: &'static str,
    /// Element type of `bytes`.
    pub dtype: PackedDtype,
    /// Shape in elements of `dtype` (row-major).
    pub shape: Vec<usize>,
    /// Little-endian contents.
    pub bytes: Vec<u8>,
}

/// An integer format's codes in the unsigned affine form `w = S · (q − Z)` (Jacob et al. 2018,
/// eq. 1), with a scale and a zero point per group of a row: what the integer checkpoint layouts
/// (GPTQ, AWQ, compressed-tensors) store. A symmetric scheme's signed code `q` is
/// `q + 2^(bits−1)` here and its zero point `2^(bits−1)`; an asymmetric scheme's codes and zero
/// points are unsigned already. [`crate::QuantizedMatrix::affine`] gives them.
#[derive(Debug, Clone, PartialEq)]
pub struct AffineCodes {
    /// `[rows, cols]`, unsigned.
    pub codes: Vec<i32>,
    /// `[rows, groups]`.
    pub zeros: Vec<i32>,
    /// `[rows, groups]`, as f32 (exactly the scheme's scales).
    pub scales: Vec<f32>,
    /// Codes per group along a row (`cols` for one group per row).
    pub group: usize,
}

/// Operations every packed format provides; [`crate::QuantizedMatrix`] dispatches to them.
/// The defaults are "this storage has no such form". Storage is plain data, so a matrix stays
/// `Send`, `Sync` and unwind-safe as it was with one enum of storages.
pub(crate) trait Packed: fmt::Debug + Send + Sync + UnwindSafe + RefUnwindSafe + DynPacked {
    /// `rows * cols` f32 values, row-major.
    fn dequantize(&self, rows: usize, cols: usize) -> Vec<f32>;
    /// Bytes of codes, scales and zero points as stored.
    fn storage_bytes(&self) -> usize;
    /// The stored arrays.
    fn parts(&self, rows: usize, cols: usize) -> Vec<PackedPart>;
    /// The GGML storage a GGUF file holds this matrix as, if it can.
    fn stored(&self) -> Option<RowStorage> {
        None
    }
    /// The bytes of a GGUF tensor of type [`Packed::stored`], row by row.
    fn gguf_bytes(&self, _rows: usize, _cols: usize) -> Option<Vec<u8>> {
        None
    }
    /// True when the storage is not the scheme's own type (llama.cpp's fallback).
    fn fell_back(&self) -> bool {
        false
    }
    /// The codes in unsigned affine form, for an integer format.
    fn affine(&self, _rows: usize, _cols: usize) -> Option<AffineCodes> {
        None
    }
}

/// Cloning and comparing a boxed [`Packed`], so that [`crate::QuantizedMatrix`] stays `Clone`
/// and `PartialEq`; implemented for every `Packed + Clone + PartialEq` type.
pub(crate) trait DynPacked {
    /// A boxed copy.
    fn clone_box(&self) -> Box<dyn Packed>;
    /// Equal when `other` is the same storage type with equal contents.
    fn eq_dyn(&self, other: &dyn Packed) -> bool;
    /// For [`DynPacked::eq_dyn`]'s downcast.
    fn as_any(&self) -> &dyn Any;
}

impl<T: Packed + Clone + PartialEq + 'static> DynPacked for T {
    fn clone_box(&self) -> Box<dyn Packed> {
        Box::new(self.clone())
    }

    fn eq_dyn(&self, other: &dyn Packed) -> bool {
        other.as_any().downcast_ref::<T>() == Some(self)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Little-endian bytes of a slice of f32.
pub(crate) fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Splits `len` elements into consecutive groups of `group` (the last one possibly shorter)
/// and returns `(start, end)` of each.
pub(crate) fn groups(len: usize, group: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..len.div_ceil(group)).map(move |g| (g * group, ((g + 1) * group).min(len)))
}
