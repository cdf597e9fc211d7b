//! What every packed format shares: the [`PackedPart`]s a matrix is stored as (with their
//! [`PackedDtype`]), the [`Packed`] operations each format's storage provides, and two helpers.

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

/// Operations every packed format provides; [`QuantizedMatrix`] dispatches to them.
pub(crate) trait Packed {
    /// `rows * cols` f32 values, row-major.
    fn dequantize(&self, rows: usize, cols: usize) -> Vec<f32>;
    /// Bytes of codes, scales and zero points as stored.
    fn storage_bytes(&self) -> usize;
    /// The stored arrays.
    fn parts(&self, rows: usize, cols: usize) -> Vec<PackedPart>;
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
