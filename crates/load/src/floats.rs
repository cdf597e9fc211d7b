//! The plain float encodings checkpoint files store, decoded: shared by the GGUF and safetensors
//! readers.

/// The plain float encodings checkpoint files store (GGUF and safetensors both little-endian).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeFloat {
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary16.
    F16,
    /// bfloat16 (the top half of a binary32).
    BF16,
}

/// Little-endian floats to f32 (exact: every f16 and bf16 value is an f32). A trailing partial
/// value is dropped; callers check the count.
pub(crate) fn le_floats(kind: LeFloat, bytes: &[u8]) -> Vec<f32> {
    let halves = || bytes.chunks_exact(2).map(|c| [c[0], c[1]]);
    match kind {
        LeFloat::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        LeFloat::F16 => halves().map(|b| half::f16::from_le_bytes(b).to_f32()).collect(),
        LeFloat::BF16 => halves().map(|b| half::bf16::from_le_bytes(b).to_f32()).collect(),
    }
}
