//! GGML block formats, bit-exact with ggml's reference quantizers.
//!
//! Spec: the llama.cpp sources, `ggml/src/ggml-common.h` (block layouts),
//! `ggml/src/ggml-quants.c` (`quantize_row_*_ref`, `dequantize_row_*` and their helpers) and
//! `ggml/src/ggml-impl.h` (`ggml_compute_fp32_to_fp16`, `ggml_e8m0_to_fp32_half`). Each format's
//! file cites its functions; the ports keep the C's order of f32 operations and integer
//! conversions (Rust never fuses `a * b + c` into an FMA, which matches ISO C without
//! `-ffp-contract=fast`).
//!
//! Rows are quantized one by one; since a row of `cols` (a multiple of the block size) is a whole
//! number of blocks, the bytes are exactly those of `quantize_row_*_ref` over the flat tensor,
//! i.e. what a GGUF file stores. When `cols` is not a multiple of the block size the matrix is kept
//! as an f32 copy and [`crate::QuantizedMatrix::fell_back`] is true, as llama.cpp keeps such
//! tensors unquantized.

mod mxfp4;
mod q4_0;
mod q4_1;
mod q4_k;
mod q6_k;
mod q8_0;

use half::f16;

use crate::error::QuantizeError;
use crate::scheme::GgmlType;
use crate::{Packed, PackedDtype, PackedPart, f32_bytes};

/// ggml's `nearest_int` (`ggml-quants.c`): adding 1.5·2^23 puts the rounded integer in the low
/// mantissa bits, so it rounds half to even for |x| < 2^22. Kept bit for bit, including what it
/// returns outside that range (where ggml only has a debug `assert`).
fn nearest_int(fval: f32) -> i32 {
    let val = fval + 12_582_912.0;
    (val.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// C's conversion of a float to an integer type as x86-64 builds of ggml execute it
/// (`cvttss2si`): truncation toward zero, and the "integer indefinite" `i32::MIN` for NaN and for
/// values outside the i32 range. ISO C leaves those cases undefined; they arise only in blocks whose
/// largest magnitude is so small (below ~1e-38) that `1/d` overflows. Callers narrow the result
/// with `as i8` / `as u8`, keeping the low byte as the C assignment to `int8_t` / `uint8_t` does.
fn c_float_to_int(x: f32) -> i32 {
    if x.is_nan() || !(-2_147_483_648.0..2_147_483_648.0).contains(&x) {
        i32::MIN
    } else {
        x as i32
    }
}

/// `GGML_FP32_TO_FP16` as little-endian bytes: IEEE binary16 with round-to-nearest-even, which is
/// what both `ggml_compute_fp32_to_fp16` and F16C `_cvtss_sh(x, 0)` compute (see the test).
fn fp16_bytes(x: f32) -> [u8; 2] {
    f16::from_f32(x).to_le_bytes()
}

/// `GGML_FP16_TO_FP32` of two little-endian bytes (exact).
fn fp16_value(bytes: [u8; 2]) -> f32 {
    f16::from_le_bytes(bytes).to_f32()
}

/// Quantizes `x` (a whole number of blocks) into `out`, appending `type_size` bytes per block.
fn quantize_blocks(ty: GgmlType, x: &[f32], out: &mut Vec<u8>) {
    for block in x.chunks_exact(ty.block_size()) {
        let start = out.len();
        out.resize(start + ty.type_size(), 0);
        let y = &mut out[start..];
        match ty {
            GgmlType::Q8_0 => q8_0::quantize_block(block, y),
            GgmlType::Q4_0 => q4_0::quantize_block(block, y),
            GgmlType::Q4_1 => q4_1::quantize_block(block, y),
            GgmlType::Q4K => q4_k::quantize_block(block, y),
            GgmlType::Q6K => q6_k::quantize_block(block, y),
            GgmlType::Mxfp4 => mxfp4::quantize_block(block, y),
        }
    }
}

/// Dequantizes whole blocks, appending `block_size` values per block.
fn dequantize_blocks(ty: GgmlType, bytes: &[u8], out: &mut Vec<f32>) {
    for block in bytes.chunks_exact(ty.type_size()) {
        let start = out.len();
        out.resize(start + ty.block_size(), 0.0);
        let y = &mut out[start..];
        match ty {
            GgmlType::Q8_0 => q8_0::dequantize_block(block, y),
            GgmlType::Q4_0 => q4_0::dequantize_block(block, y),
            GgmlType::Q4_1 => q4_1::dequantize_block(block, y),
            GgmlType::Q4K => q4_k::dequantize_block(block, y),
            GgmlType::Q6K => q6_k::dequantize_block(block, y),
            GgmlType::Mxfp4 => mxfp4::dequantize_block(block, y),
        }
    }
}

/// Dequantizes a buffer of GGML blocks exactly as `dequantize_row_*` does (for GGUF loading).
///
/// # Shapes
/// - `bytes`: `n_elements / block_size * type_size` bytes of consecutive blocks.
/// - returns: `n_elements` f32 values.
///
/// # Errors
/// [`QuantizeError::PartialBlock`] when `n_elements` is not a multiple of the block size,
/// [`QuantizeError::BlockBytes`] when `bytes` has the wrong length.
pub fn dequantize_ggml_blocks(
    ty: GgmlType,
    bytes: &[u8],
    n_elements: usize,
) -> Result<Vec<f32>, QuantizeError> {
    let block = ty.block_size();
    if !n_elements.is_multiple_of(block) {
        return Err(QuantizeError::PartialBlock {
            ty,
            block,
            n_elements,
        });
    }
    let expected = n_elements / block * ty.type_size();
    if bytes.len() != expected {
        return Err(QuantizeError::BlockBytes {
            ty,
            n_elements,
            expected,
            actual: bytes.len(),
        });
    }
    let mut out = Vec::with_capacity(n_elements);
    dequantize_blocks(ty, bytes, &mut out);
    Ok(out)
}

#[derive(Debug, Clone, PartialEq)]
enum Data {
    /// `[rows, cols / block_size * type_size]` bytes.
    Blocks(Vec<u8>),
    /// `cols` is not a multiple of the block size: the weights as given.
    Fallback(Vec<f32>),
}

/// A matrix in one GGML block format (or its f32 fallback).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GgmlPacked {
    ty: GgmlType,
    data: Data,
}

impl GgmlPacked {
    /// # Shapes
    /// - `weights`: `[rows, cols]` row-major; blocks run along each row.
    pub(crate) fn quantize(ty: GgmlType, weights: &[f32], rows: usize, cols: usize) -> Self {
        if !cols.is_multiple_of(ty.block_size()) {
            return GgmlPacked {
                ty,
                data: Data::Fallback(weights.to_vec()),
            };
        }
        let mut bytes = Vec::with_capacity(rows * cols / ty.block_size() * ty.type_size());
        // Blocks never straddle rows, so one pass over the flat slice equals a pass per row.
        quantize_blocks(ty, weights, &mut bytes);
        GgmlPacked {
            ty,
            data: Data::Blocks(bytes),
        }
    }

    pub(crate) fn fell_back(&self) -> bool {
        matches!(self.data, Data::Fallback(_))
    }
}

impl Packed for GgmlPacked {
    fn dequantize(&self, rows: usize, cols: usize) -> Vec<f32> {
        match &self.data {
            Data::Blocks(bytes) => {
                let mut out = Vec::with_capacity(rows * cols);
                dequantize_blocks(self.ty, bytes, &mut out);
                out
            }
            Data::Fallback(values) => values.clone(),
        }
    }

    fn storage_bytes(&self) -> usize {
        match &self.data {
            Data::Blocks(bytes) => bytes.len(),
            Data::Fallback(values) => 4 * values.len(),
        }
    }

    fn parts(&self, rows: usize, cols: usize) -> Vec<PackedPart> {
        match &self.data {
            Data::Blocks(bytes) => vec![PackedPart {
                name: "blocks",
                dtype: PackedDtype::U8,
                shape: vec![rows, cols / self.ty.block_size() * self.ty.type_size()],
                bytes: bytes.clone(),
            }],
            Data::Fallback(values) => vec![PackedPart {
                name: "values",
                dtype: PackedDtype::F32,
                shape: vec![rows, cols],
                bytes: f32_bytes(values),
            }],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{fp16_bytes, nearest_int};

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
        ((sign >> 16)
            | if shl1_w > 0xFF00_0000 {
                0x7E00
            } else {
                nonsign
            }) as u16
    }

    #[test]
    fn fp16_rounding_matches_ggml_compute_fp32_to_fp16() {
        // Random f32 bit patterns, then a dense sweep of the binary16 range and its edges.
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let check = |bits: u32| {
            let f = f32::from_bits(bits);
            if f.is_finite() {
                assert_eq!(
                    u16::from_le_bytes(fp16_bytes(f)),
                    ggml_compute_fp32_to_fp16(f),
                    "{f:e}"
                );
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
