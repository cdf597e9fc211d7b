//! GGML block formats, bit-exact with ggml's reference quantizers.
//!
//! What goes in: f32 values (a whole number of blocks) or the bytes of consecutive GGML blocks, as
//! a GGUF file stores them. What comes out: the blocks' bytes, or the f32 values ggml's
//! `dequantize_row_*` computes. [`GgmlType`] names each format with its block size and byte size.
//!
//! Spec: the llama.cpp sources, `ggml/src/ggml-common.h` (block layouts),
//! `ggml/src/ggml-quants.c` (`quantize_row_*_ref`, `dequantize_row_*` and their helpers) and
//! `ggml/src/ggml-impl.h` (`ggml_compute_fp32_to_fp16`, `ggml_e8m0_to_fp32_half`). Each format's
//! file cites its functions; the ports keep the C's order of f32 operations and integer
//! conversions (Rust never fuses `a * b + c` into an FMA, which matches ISO C without
//! `-ffp-contract=fast`).
//!
//! A row of `cols` (a multiple of the block size) is a whole number of blocks, so quantizing a
//! `[rows, cols]` matrix as one flat slice gives exactly the bytes of `quantize_row_*_ref` run row
//! by row, i.e. what a GGUF file stores.
//!
//! **Architecture invariant:** a leaf crate (no qdrift dependencies, no I/O): pure functions of
//! host slices, bit-exact with the cited reference C. `qdrift-load` uses it to read GGUF files,
//! `qdrift-quantize` to build its `Scheme::Ggml` variants.
//!
//! | file | format |
//! |---|---|
//! Every format dequantizes ([`GgmlType::READABLE`], what the GGUF reader accepts); those in
//! [`GgmlType::ALL`] also quantize ([`GgmlType::has_quantizer`]), and only they are offered as
//! quantization schemes. The others are read-only: [`quantize_ggml_blocks`] refuses them with
//! [`GgmlError::NoQuantizer`].
//!
//! | file | format | quantize |
//! |---|---|---|
//! | `q8_0.rs` | `block_q8_0` | yes |
//! | `q4_0.rs` | `block_q4_0` | yes |
//! | `q4_1.rs` | `block_q4_1` | yes |
//! | `q5_0.rs` | `block_q5_0` | yes |
//! | `q5_1.rs` | `block_q5_1` | read-only |
//! | `q2_k.rs` | `block_q2_K` | read-only |
//! | `q3_k.rs` | `block_q3_K` | read-only |
//! | `q4_k.rs` | `block_q4_K` | yes |
//! | `q5_k.rs` | `block_q5_K` | read-only |
//! | `q6_k.rs` | `block_q6_K` | yes |
//! | `iq4_nl.rs` | `block_iq4_nl` | read-only |
//! | `iq4_xs.rs` | `block_iq4_xs` | read-only |
//! | `mxfp4.rs` | `block_mxfp4` | yes |
//! | `nvfp4.rs` | `block_nvfp4` | read-only |
//!
//! Beside the block formats: `e2m1.rs`, the FP4 E2M1 element of MXFP4 and NVFP4 (OCP MX v1.0:
//! [`e2m1_decode`], [`e2m1_encode`]), and `nvfp4_tensor.rs`, NVFP4 as checkpoints store it (E4M3
//! scale per 16 weights and a global scale, compressed-tensors' and ModelOpt's conventions:
//! [`nvfp4_quantize`], [`nvfp4_dequantize`], [`GlobalScale`]).
//!
//! `scalar.rs` holds the C scalar helpers the formats share (`nearest_int`, C's float-to-int
//! conversion, fp16 bytes), so that every format file depends on it and never on the crate root.
//!
//! Module floors, top first: a module imports only modules on floors below its own
//! (`cargo xtask cycles` checks it).
//!
//! | floor |
//! |---|
//! | `iq4_xs.rs`, `q5_k.rs` |
//! | `iq4_nl.rs`, `mxfp4.rs`, `nvfp4.rs`, `nvfp4_tensor.rs`, `q2_k.rs`, `q3_k.rs`, `q4_0.rs`, `q4_1.rs`, `q4_k.rs`, `q5_0.rs`, `q5_1.rs`, `q6_k.rs`, `q8_0.rs` |
//! | `e2m1.rs`, `scalar.rs` |

#![forbid(unsafe_code)]

mod e2m1;
mod iq4_nl;
mod iq4_xs;
mod mxfp4;
mod nvfp4;
mod nvfp4_tensor;
mod q2_k;
mod q3_k;
mod q4_0;
mod q4_1;
mod q4_k;
mod q5_0;
mod q5_1;
mod q5_k;
mod q6_k;
mod q8_0;
mod scalar;

use std::fmt;

pub use e2m1::{E2M1_MAX, E2M1_VALUES, e2m1_decode, e2m1_encode, e2m1_pack_rows};
pub use nvfp4_tensor::{
    GlobalScale, NVFP4_GROUP, Nvfp4Matrix, Nvfp4Tool, ct_block_scale, ct_global_scale, e4m3_decode, e4m3_encode,
    nvfp4_dequantize, nvfp4_quantize,
};

/// GGML block formats, laid out as in `ggml/src/ggml-common.h`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    /// `block_q8_0`: f16 scale + 32 int8 (34 bytes per 32).
    Q8_0,
    /// `block_q4_0`: f16 scale + 32 nibbles (18 bytes per 32).
    Q4_0,
    /// `block_q4_1`: f16 scale, f16 min + 32 nibbles (20 bytes per 32).
    Q4_1,
    /// `block_q4_K`: super-block of 256 with 6-bit sub-scales and mins (144 bytes).
    Q4K,
    /// `block_q6_K`: super-block of 256 with 8-bit sub-scales (210 bytes).
    Q6K,
    /// `block_mxfp4`: E8M0 scale + 32 E2M1 nibbles (17 bytes per 32).
    Mxfp4,
    /// `block_q5_0`: f16 scale + 32 5-bit values (22 bytes per 32).
    Q5_0,
    /// `block_q5_1`: f16 scale, f16 min + 32 5-bit values (24 bytes per 32). Read-only.
    Q5_1,
    /// `block_q2_K`: super-block of 256 with 4-bit sub-scales and mins (84 bytes). Read-only.
    Q2K,
    /// `block_q3_K`: super-block of 256 with 6-bit sub-scales (110 bytes). Read-only.
    Q3K,
    /// `block_q5_K`: super-block of 256 with 6-bit sub-scales and mins (176 bytes). Read-only.
    Q5K,
    /// `block_iq4_nl`: f16 scale + 32 4-bit indices into `kvalues_iq4nl` (18 bytes per 32).
    /// Read-only.
    Iq4Nl,
    /// `block_iq4_xs`: super-block of 256 with 6-bit sub-scales, 4-bit indices into
    /// `kvalues_iq4nl` (136 bytes). Read-only.
    Iq4Xs,
    /// `block_nvfp4`: four unsigned-E4M3 scales (one per 16) + 64 E2M1 nibbles (36 bytes per 64);
    /// no global scale. Read-only.
    Nvfp4,
}

impl GgmlType {
    /// Every GGML type this crate can quantize to (the quantization schemes it offers), in CLI
    /// order. Each has [`GgmlType::has_quantizer`].
    pub const ALL: [GgmlType; 7] =
        [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q4K, GgmlType::Q6K, GgmlType::Mxfp4];

    /// Every GGML type this crate can dequantize (what the GGUF reader accepts), in `ggml_type`
    /// id order: [`GgmlType::ALL`] and the read-only types.
    pub const READABLE: [GgmlType; 14] = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::Iq4Nl,
        GgmlType::Iq4Xs,
        GgmlType::Mxfp4,
        GgmlType::Nvfp4,
    ];

    /// Whether [`quantize_ggml_blocks`] can produce this type (true exactly for
    /// [`GgmlType::ALL`]); the others are read-only.
    pub fn has_quantizer(self) -> bool {
        quantizer(self).is_some()
    }

    /// Elements per block (`QK8_0`, `QK4_0`, `QK4_1`, `QK5_0`, `QK5_1`, `QK4_NL`, `QK_MXFP4`,
    /// `QK_NVFP4`, `QK_K`).
    pub fn block_size(self) -> usize {
        match self {
            GgmlType::Q8_0
            | GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Iq4Nl
            | GgmlType::Mxfp4 => 32,
            GgmlType::Nvfp4 => 64,
            GgmlType::Q2K | GgmlType::Q3K | GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K | GgmlType::Iq4Xs => 256,
        }
    }

    /// Bytes per block (`sizeof(block_*)`).
    pub fn type_size(self) -> usize {
        match self {
            GgmlType::Q8_0 => 34,
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q4K => 144,
            GgmlType::Q6K => 210,
            GgmlType::Mxfp4 => 17,
            GgmlType::Q5_0 => 22,
            GgmlType::Q5_1 => 24,
            GgmlType::Q2K => 84,
            GgmlType::Q3K => 110,
            GgmlType::Q5K => 176,
            GgmlType::Iq4Nl => 18,
            GgmlType::Iq4Xs => 136,
            GgmlType::Nvfp4 => 36,
        }
    }

    /// The GGML / CLI name (`q8_0`, `q4_k`, `mxfp4`, ...).
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::Q8_0 => "q8_0",
            GgmlType::Q4_0 => "q4_0",
            GgmlType::Q4_1 => "q4_1",
            GgmlType::Q4K => "q4_k",
            GgmlType::Q6K => "q6_k",
            GgmlType::Mxfp4 => "mxfp4",
            GgmlType::Q5_0 => "q5_0",
            GgmlType::Q5_1 => "q5_1",
            GgmlType::Q2K => "q2_k",
            GgmlType::Q3K => "q3_k",
            GgmlType::Q5K => "q5_k",
            GgmlType::Iq4Nl => "iq4_nl",
            GgmlType::Iq4Xs => "iq4_xs",
            GgmlType::Nvfp4 => "nvfp4",
        }
    }

    /// The name `ggml.h` (`GGML_TYPE_*`) and gguf-py (`GGMLQuantizationType`) give the type, as
    /// GGUF tools print it (`Q8_0`, `Q4_K`, `IQ4_XS`, `MXFP4`, ...).
    pub fn gguf_name(self) -> &'static str {
        match self {
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q4K => "Q4_K",
            GgmlType::Q6K => "Q6_K",
            GgmlType::Mxfp4 => "MXFP4",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q2K => "Q2_K",
            GgmlType::Q3K => "Q3_K",
            GgmlType::Q5K => "Q5_K",
            GgmlType::Iq4Nl => "IQ4_NL",
            GgmlType::Iq4Xs => "IQ4_XS",
            GgmlType::Nvfp4 => "NVFP4",
        }
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl GgmlType {
    /// The `ggml_type` id a GGUF tensor info stores for this format (`GGML_TYPE_*` in
    /// `ggml/include/ggml.h`, `GGMLQuantizationType` in llama.cpp's `gguf-py/gguf/constants.py`).
    pub fn gguf_id(self) -> u32 {
        match self {
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q8_0 => 8,
            GgmlType::Q4K => 12,
            GgmlType::Q6K => 14,
            GgmlType::Mxfp4 => 39,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q2K => 10,
            GgmlType::Q3K => 11,
            GgmlType::Q5K => 13,
            GgmlType::Iq4Nl => 20,
            GgmlType::Iq4Xs => 23,
            GgmlType::Nvfp4 => 40,
        }
    }

    /// The block format with `ggml_type` id `id`, if this crate can dequantize it (any of
    /// [`GgmlType::READABLE`]).
    pub fn from_gguf_id(id: u32) -> Option<GgmlType> {
        GgmlType::READABLE.into_iter().find(|t| t.gguf_id() == id)
    }
}

impl GgmlType {
    /// The type llama.cpp stores instead when a row is not a whole number of this type's blocks:
    /// `llama_tensor_get_type`'s `convert_incompatible_tensor` (llama.cpp `src/llama-quant.cpp`):
    /// Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0, Q2_K / Q3_K / IQ4_XS → IQ4_NL. `None` for the
    /// 32-element types and NVFP4 (llama.cpp has no fallback for them; see [`RowStorage::for_row`]).
    pub fn row_fallback(self) -> Option<GgmlType> {
        match self {
            GgmlType::Q4K => Some(GgmlType::Q5_0),
            GgmlType::Q5K => Some(GgmlType::Q5_1),
            GgmlType::Q6K => Some(GgmlType::Q8_0),
            GgmlType::Q2K | GgmlType::Q3K | GgmlType::Iq4Xs => Some(GgmlType::Iq4Nl),
            GgmlType::Q8_0
            | GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Iq4Nl
            | GgmlType::Mxfp4
            | GgmlType::Nvfp4 => None,
        }
    }
}

/// What a matrix asked for in a GGML type is actually stored as, given its row length: the type
/// itself, its [`GgmlType::row_fallback`], or F16.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RowStorage {
    /// Whole blocks of this type.
    Blocks(GgmlType),
    /// IEEE binary16 values (`GGML_TYPE_F16`), when no block type fits the row.
    F16,
}

impl RowStorage {
    /// llama.cpp's rule (`llama_tensor_get_type`, `src/llama-quant.cpp`): `ty` when `cols` is a
    /// whole number of its blocks; else its [`GgmlType::row_fallback`] when `cols` is a whole
    /// number of the fallback's blocks; else F16. (llama.cpp refuses a 32-element type whose rows
    /// are not whole blocks; qdrift stores F16 there too, so every matrix has a GGUF form.)
    ///
    /// # Shapes
    /// - `cols`: the row length, elements along which blocks run.
    pub fn for_row(ty: GgmlType, cols: usize) -> RowStorage {
        if cols.is_multiple_of(ty.block_size()) {
            return RowStorage::Blocks(ty);
        }
        match ty.row_fallback() {
            Some(f) if cols.is_multiple_of(f.block_size()) => RowStorage::Blocks(f),
            _ => RowStorage::F16,
        }
    }

    /// The `ggml_type` id a GGUF tensor info stores (`GGML_TYPE_F16` = 1).
    pub fn gguf_id(self) -> u32 {
        match self {
            RowStorage::Blocks(t) => t.gguf_id(),
            RowStorage::F16 => 1,
        }
    }

    /// The GGML / CLI name: the block type's name or `f16`.
    pub fn name(self) -> &'static str {
        match self {
            RowStorage::Blocks(t) => t.name(),
            RowStorage::F16 => "f16",
        }
    }

    /// Bytes stored for a `[rows, cols]` matrix whose rows this storage fits: `type_size` per
    /// block of `block_size` values, or 2 per value for F16. `None` on overflow.
    pub fn bytes_for(self, rows: u64, cols: u64) -> Option<u64> {
        let n = rows.checked_mul(cols)?;
        match self {
            RowStorage::Blocks(t) => (n / t.block_size() as u64).checked_mul(t.type_size() as u64),
            RowStorage::F16 => n.checked_mul(2),
        }
    }
}

impl fmt::Display for RowStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a block buffer was rejected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GgmlError {
    /// An element count that is not a whole number of blocks.
    #[error("{ty} stores blocks of {block} elements; {n_elements} elements is not a multiple")]
    PartialBlock {
        /// The block format.
        ty: GgmlType,
        /// Elements per block.
        block: usize,
        /// Elements requested.
        n_elements: usize,
    },

    /// A block buffer of the wrong byte length.
    #[error("{ty} data for {n_elements} elements must be {expected} bytes, got {actual}")]
    BlockBytes {
        /// The block format.
        ty: GgmlType,
        /// Elements requested.
        n_elements: usize,
        /// `n_elements / block * type_size`.
        expected: usize,
        /// Bytes given.
        actual: usize,
    },

    /// Quantizing to a read-only format (one qdrift dequantizes but has no quantizer for).
    #[error(
        "{ty} is read-only: qdrift dequantizes it but has no quantizer for it; quantizable: {}",
        quantizable_names()
    )]
    NoQuantizer {
        /// The block format.
        ty: GgmlType,
    },
}

/// The names of [`GgmlType::ALL`], comma-separated, for [`GgmlError::NoQuantizer`].
fn quantizable_names() -> String {
    GgmlType::ALL.map(GgmlType::name).join(", ")
}

/// Quantizes one block: `block_size` values into `type_size` bytes.
type QuantizeBlock = fn(&[f32], &mut [u8]);

/// Dequantizes one block: `type_size` bytes into `block_size` values.
type DequantizeBlock = fn(&[u8], &mut [f32]);

/// `quantize_row_*_ref` of `ty` for one block, or `None` for a read-only type.
fn quantizer(ty: GgmlType) -> Option<QuantizeBlock> {
    match ty {
        GgmlType::Q8_0 => Some(q8_0::quantize_block),
        GgmlType::Q4_0 => Some(q4_0::quantize_block),
        GgmlType::Q4_1 => Some(q4_1::quantize_block),
        GgmlType::Q4K => Some(q4_k::quantize_block),
        GgmlType::Q6K => Some(q6_k::quantize_block),
        GgmlType::Mxfp4 => Some(mxfp4::quantize_block),
        GgmlType::Q5_0 => Some(q5_0::quantize_block),
        GgmlType::Q5_1
        | GgmlType::Q2K
        | GgmlType::Q3K
        | GgmlType::Q5K
        | GgmlType::Iq4Nl
        | GgmlType::Iq4Xs
        | GgmlType::Nvfp4 => None,
    }
}

/// `dequantize_row_*` of `ty` for one block.
fn dequantizer(ty: GgmlType) -> DequantizeBlock {
    match ty {
        GgmlType::Q8_0 => q8_0::dequantize_block,
        GgmlType::Q4_0 => q4_0::dequantize_block,
        GgmlType::Q4_1 => q4_1::dequantize_block,
        GgmlType::Q4K => q4_k::dequantize_block,
        GgmlType::Q6K => q6_k::dequantize_block,
        GgmlType::Mxfp4 => mxfp4::dequantize_block,
        GgmlType::Q5_0 => q5_0::dequantize_block,
        GgmlType::Q5_1 => q5_1::dequantize_block,
        GgmlType::Q2K => q2_k::dequantize_block,
        GgmlType::Q3K => q3_k::dequantize_block,
        GgmlType::Q5K => q5_k::dequantize_block,
        GgmlType::Iq4Nl => iq4_nl::dequantize_block,
        GgmlType::Iq4Xs => iq4_xs::dequantize_block,
        GgmlType::Nvfp4 => nvfp4::dequantize_block,
    }
}

/// Quantizes `x` exactly as `quantize_row_*_ref` does.
///
/// # Shapes
/// - `x`: a whole number of blocks (`x.len()` a multiple of [`GgmlType::block_size`]); blocks
///   never straddle the rows of a matrix whose row length is a multiple of the block size.
/// - returns: `x.len() / block_size * type_size` bytes of consecutive blocks.
///
/// # Errors
/// [`GgmlError::NoQuantizer`] for a read-only type (not in [`GgmlType::ALL`]),
/// [`GgmlError::PartialBlock`] when `x.len()` is not a multiple of the block size.
pub fn quantize_ggml_blocks(ty: GgmlType, x: &[f32]) -> Result<Vec<u8>, GgmlError> {
    let quantize_block = quantizer(ty).ok_or(GgmlError::NoQuantizer { ty })?;
    let block = ty.block_size();
    if !x.len().is_multiple_of(block) {
        return Err(GgmlError::PartialBlock { ty, block, n_elements: x.len() });
    }
    let mut out = vec![0u8; x.len() / block * ty.type_size()];
    for (x, y) in x.chunks_exact(block).zip(out.chunks_exact_mut(ty.type_size())) {
        quantize_block(x, y);
    }
    Ok(out)
}

/// Dequantizes a buffer of GGML blocks exactly as `dequantize_row_*` does (for GGUF loading); any
/// of [`GgmlType::READABLE`].
///
/// # Shapes
/// - `bytes`: `n_elements / block_size * type_size` bytes of consecutive blocks.
/// - returns: `n_elements` f32 values.
///
/// # Errors
/// [`GgmlError::PartialBlock`] when `n_elements` is not a multiple of the block size,
/// [`GgmlError::BlockBytes`] when `bytes` has the wrong length.
pub fn dequantize_ggml_blocks(ty: GgmlType, bytes: &[u8], n_elements: usize) -> Result<Vec<f32>, GgmlError> {
    let block = ty.block_size();
    if !n_elements.is_multiple_of(block) {
        return Err(GgmlError::PartialBlock { ty, block, n_elements });
    }
    let expected = n_elements / block * ty.type_size();
    if bytes.len() != expected {
        return Err(GgmlError::BlockBytes { ty, n_elements, expected, actual: bytes.len() });
    }
    let dequantize_block = dequantizer(ty);
    let mut out = vec![0.0f32; n_elements];
    for (x, y) in bytes.chunks_exact(ty.type_size()).zip(out.chunks_exact_mut(block)) {
        dequantize_block(x, y);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use crate::scalar::{fp16_bytes, nearest_int};

    /// `ggml_compute_fp32_to_fp16` from `ggml/src/ggml-impl.h` (the portable path), transcribed
    /// only to prove that `half`'s rounding is the same function.
    fn ggml_compute_fp32_to_fp16(f: f32) -> u16 {
        let scale_to_inf = f32::from_bits(0x7780_0000); // 0x1.0p+112f
        let scale_to_zero = f32::from_bits(0x0880_0000); // 0x1.0p-110f
        let mut base = (f.abs() * scale_to_inf) * scale_to_zero;
        let w = f.to_bits();
        let shl1_w = w.wrapping_add(w);
        let sign = w & 0x8000_0000;
        let bias = (shl1_w & 0xFF00_0000).max(0x7100_0000);
        base += f32::from_bits((bias >> 1) + 0x0780_0000);
        let bits = base.to_bits();
        let exp_bits = (bits >> 13) & 0x0000_7C00;
        let mantissa_bits = bits & 0x0000_0FFF;
        let nonsign = exp_bits + mantissa_bits;
        ((sign >> 16) | if shl1_w > 0xFF00_0000 { 0x7E00 } else { nonsign }) as u16
    }

    #[test]
    fn fp16_rounding_matches_ggml_compute_fp32_to_fp16() {
        // Random f32 bit patterns, then a dense sweep of the binary16 range and its edges.
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let check = |bits: u32| {
            let f = f32::from_bits(bits);
            if f.is_finite() {
                assert_eq!(u16::from_le_bytes(fp16_bytes(f)), ggml_compute_fp32_to_fp16(f), "{f:e}");
            }
        };
        for _ in 0..2_000_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            check(state as u32);
        }
        // All f32 in [2^-26, 2^17) at a stride that hits every binary16 rounding boundary class.
        for bits in (0x3280_0000u32..0x4800_0000).step_by(0x1001) {
            check(bits);
            check(bits | 0x8000_0000);
        }
    }

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(-0.5), 0);
        assert_eq!(nearest_int(-1.5), -2);
        assert_eq!(nearest_int(-2.5), -2);
        assert_eq!(nearest_int(3.49), 3);
        assert_eq!(nearest_int(-4194303.0), -4194303);
        assert_eq!(nearest_int(4194303.0), 4194303);
    }
}
