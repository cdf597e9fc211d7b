//! NVFP4 as checkpoints store it: one E2M1 code per weight ([`crate::e2m1`]), one FP8 E4M3 scale
//! per 16 consecutive weights of a row, and one FP32 global scale per tensor. Pure functions:
//! quantizing a row-major matrix as each reference tool does, and dequantizing.
//!
//! Sources (read at compressed-tensors 0.20.1 and nvidia-modelopt 0.47.0):
//! - compressed-tensors `quantization/utils/helpers.py` (`generate_gparam`: global scale
//!   `g = 448 · 6 / amax`, computed as `(1 / amax) · 2688` in f32 as PyTorch does, NaN/∞ → 1; `calculate_qparams`: block scale `g · (amax_b / 6)`,
//!   rounded to E4M3 (`round_to_quantized_type_dtype`: clamp to ±448, cast), a zero scale
//!   replaced by 0.125), `quantization/lifecycle/forward_helpers.py` (`_quantize`, `_dequantize`:
//!   `scale = scale / g`, then `x / scale` clamped to ±6 and rounded, or `q · scale`) and
//!   `compressors/nvfp4/` (`weight_global_scale` = `g`, the `tensor_group` strategy).
//!   **compressed-tensors stores `g` = 448·6/amax and divides by it.**
//! - NVIDIA ModelOpt `modelopt/torch/quantization/qtensor/nvfp4_tensor.py`
//!   (`get_weights_scaling_factor_2`: `s2 = amax / (6 · 448)`; `get_weights_scaling_factor`:
//!   block scale `amax_b / (6 · s2)`, zero → 1, clamped to [2^-9, 448] and cast to E4M3;
//!   `quantize`: `x / (scale · s2)` cast to E2M1; `dequantize`: `q · (scale · s2)`).
//!   **ModelOpt stores `weight_scale_2` = `s2` = amax/(6·448) and multiplies by it.**
//!
//! So the same weights give reciprocal global scales in the two layouts, and [`GlobalScale`]
//! records which one a checkpoint stores. f32 arithmetic here follows each tool's order of
//! operations (in f32; the tools then cast the dequantized weight to the model's bf16/f16).
//!
//! E4M3 is OCP OFP8 v1.0 E4M3 (bias 7, max ±448, NaN `S.1111.111`, no infinities), the format
//! `torch.float8_e4m3fn` implements; [`e4m3_encode`] rounds to nearest, ties to even, as
//! PyTorch's cast does, saturating at ±448 (both tools clamp before casting). `qdrift-load`'s
//! `ofp8.rs` decodes the same format for FP8 checkpoints; its tests check that the two agree on
//! every code.

use crate::e2m1::{E2M1_MAX, e2m1_decode, e2m1_encode};

/// Weights per block scale.
pub const NVFP4_GROUP: usize = 16;

/// The largest finite E4M3 value.
const E4M3_MAX: f32 = 448.0;

/// The value of OFP8 E4M3 code `code` (NaN for `0x7F`/`0xFF`; exact).
pub fn e4m3_decode(code: u8) -> f32 {
    let magnitude = match code & 0x7F {
        0x7F => return f32::NAN,
        c if c < 8 => f32::from(c) * 2f32.powi(-9),
        c => f32::from(8 + (c & 7)) * 2f32.powi(i32::from(c >> 3) - 10),
    };
    if code & 0x80 != 0 { -magnitude } else { magnitude }
}

/// The E4M3 code nearest `x`, ties to even, magnitudes past 448 saturating to ±448; NaN gives
/// `0x7F`.
pub fn e4m3_encode(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7F;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs().min(E4M3_MAX);
    // The codes' magnitudes increase with the code: find the nearest by bisection, ties to the
    // even code (the one with mantissa bit 0).
    let (mut lo, mut hi) = (0u8, 0x7Eu8);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if e4m3_decode(mid) <= a { lo = mid } else { hi = mid }
    }
    let (dl, dh) = (a - e4m3_decode(lo), e4m3_decode(hi) - a);
    let code = if dl < dh || (dl == dh && lo % 2 == 0) { lo } else { hi };
    sign | code
}

/// A checkpoint's per-tensor scale, in the direction the checkpoint stores it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GlobalScale {
    /// compressed-tensors' `weight_global_scale` `g` = 448·6/amax: a block's scale is `s / g`.
    Divide(f32),
    /// ModelOpt's `weight_scale_2` `s2` = amax/(6·448): a block's scale is `s · s2`.
    Multiply(f32),
}

impl GlobalScale {
    /// The stored number.
    pub fn stored(self) -> f32 {
        match self {
            GlobalScale::Divide(g) | GlobalScale::Multiply(g) => g,
        }
    }

    /// The f32 scale of a block whose E4M3 scale is `scale` (compressed-tensors `scale / g`,
    /// ModelOpt `scale · s2`).
    pub fn block_scale(self, scale: f32) -> f32 {
        match self {
            GlobalScale::Divide(g) => scale / g,
            GlobalScale::Multiply(s2) => scale * s2,
        }
    }
}

/// A matrix in NVFP4: one E2M1 code per weight (not yet packed two to a byte), one E4M3 scale
/// code per 16 weights of a row, and the global scale.
#[derive(Debug, Clone, PartialEq)]
pub struct Nvfp4Matrix {
    /// `[rows, cols]` E2M1 codes, row-major.
    pub codes: Vec<u8>,
    /// `[rows, cols / 16]` E4M3 codes.
    pub scales: Vec<u8>,
    /// The per-tensor scale.
    pub global: GlobalScale,
}

/// Which reference tool's quantizer [`nvfp4_quantize`] follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nvfp4Tool {
    /// compressed-tensors / llm-compressor (`weight_global_scale`).
    CompressedTensors,
    /// NVIDIA ModelOpt (`weight_scale_2`).
    ModelOpt,
}

/// The largest magnitude of `x` (NaN-ignoring, as `torch.amax` is not; callers pass finite
/// weights).
fn abs_max(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// compressed-tensors' global scale of a tensor (weights, or a layer's calibrated input) whose
/// largest magnitude is `amax`: `448 · 6 / amax`, a Python float over a tensor, which PyTorch
/// computes as `amax.reciprocal() * 2688` (`Tensor.__rtruediv__`): two roundings, kept here;
/// 1 where that is not finite (`generate_gparam`).
pub fn ct_global_scale(amax: f32) -> f32 {
    let g = (1.0 / amax.max(f32::MIN_POSITIVE)) * (E4M3_MAX * E2M1_MAX);
    if g.is_finite() { g } else { 1.0 }
}

/// compressed-tensors' E4M3 code of the scale of a block whose largest magnitude is `amax_b`,
/// under the global scale `g`: `e4m3(g · (amax_b / 6))`, a zero scale replaced by E4M3's eps
/// 0.125 (code 0x20).
pub fn ct_block_scale(g: f32, amax_b: f32) -> u8 {
    let s = e4m3_encode(g * (amax_b / E2M1_MAX));
    if e4m3_decode(s) == 0.0 { 0x20 } else { s }
}

/// Quantizes a row-major `[rows, cols]` matrix `x` (finite values) to NVFP4 as `tool` does; `None`
/// when `cols` is 0 or `x` is not whole rows.
///
/// Both tools refuse rows that are not whole groups of 16; here such a row ends in a shorter
/// group whose scale is taken from its own values, as for any other group (qdrift's `nvfp4`
/// scheme quantizes every matrix; its writers refuse what the checkpoint formats cannot hold).
///
/// # Shapes
/// - `x`: `[rows, cols]`; returns codes `[rows, cols]`, scales `[rows, ceil(cols / 16)]`.
pub fn nvfp4_quantize(tool: Nvfp4Tool, x: &[f32], cols: usize) -> Option<Nvfp4Matrix> {
    if cols == 0 || !x.len().is_multiple_of(cols) {
        return None;
    }
    let amax = abs_max(x);
    let global = match tool {
        Nvfp4Tool::CompressedTensors => GlobalScale::Divide(ct_global_scale(amax)),
        Nvfp4Tool::ModelOpt => GlobalScale::Multiply(amax / (E2M1_MAX * E4M3_MAX)),
    };
    let mut codes = Vec::with_capacity(x.len());
    let mut scales = Vec::with_capacity(x.len() / cols * cols.div_ceil(NVFP4_GROUP));
    for block in x.chunks_exact(cols).flat_map(|row| row.chunks(NVFP4_GROUP)) {
        let amax_b = abs_max(block);
        let scale = match global {
            GlobalScale::Divide(g) => ct_block_scale(g, amax_b),
            GlobalScale::Multiply(s2) => {
                let s = amax_b / (E2M1_MAX * s2);
                let s = if s == 0.0 { 1.0 } else { s };
                e4m3_encode(s.clamp(2f32.powi(-9), E4M3_MAX))
            }
        };
        scales.push(scale);
        let d = global.block_scale(e4m3_decode(scale));
        codes.extend(block.iter().map(|&v| {
            let q = match tool {
                // `cast_to_fp4` multiplies by `torch.sign(x)`, which is +0 for −0.0: a −0.0
                // weight gives +0 (`+ 0.0`), a negative one that rounds to zero −0.
                Nvfp4Tool::CompressedTensors => ((v / d) + 0.0).clamp(-E2M1_MAX, E2M1_MAX),
                // `_cast_fp4` takes the sign from `x < 0`: −0.0 is +0.
                Nvfp4Tool::ModelOpt => (v / d) + 0.0,
            };
            e2m1_encode(q).unwrap_or(0)
        }));
    }
    Some(Nvfp4Matrix { codes, scales, global })
}

/// Dequantizes NVFP4: `w = e2m1(code) · block_scale(e4m3(scale))`, in f32.
///
/// # Shapes
/// - `codes`: `[rows, cols]` E2M1 codes; `scales`: `[rows, ceil(cols / 16)]` E4M3 codes (a row
///   that is not whole groups ends in a shorter one, as [`nvfp4_quantize`] makes it); returns
///   `[rows, cols]`. `None` when the lengths disagree or `cols` is 0.
pub fn nvfp4_dequantize(codes: &[u8], scales: &[u8], global: GlobalScale, cols: usize) -> Option<Vec<f32>> {
    let groups = cols.div_ceil(NVFP4_GROUP);
    if cols == 0 || !codes.len().is_multiple_of(cols) || scales.len() != codes.len() / cols * groups {
        return None;
    }
    Some(
        codes
            .chunks_exact(cols)
            .flat_map(|row| row.chunks(NVFP4_GROUP))
            .zip(scales)
            .flat_map(|(block, &s)| {
                let d = global.block_scale(e4m3_decode(s));
                block.iter().map(move |&q| e2m1_decode(q) * d)
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_spec_values_and_round_trip() {
        assert_eq!(e4m3_decode(0x7E), 448.0);
        assert_eq!(e4m3_decode(0x08), 2f32.powi(-6));
        assert_eq!(e4m3_decode(0x01), 2f32.powi(-9));
        assert_eq!(e4m3_decode(0x38), 1.0);
        assert_eq!(e4m3_decode(0xC0), -2.0);
        assert!(e4m3_decode(0x7F).is_nan() && e4m3_decode(0xFF).is_nan());
        for c in (0..=255u8).filter(|c| c & 0x7F != 0x7F) {
            assert_eq!(e4m3_encode(e4m3_decode(c)), c, "{c:#04x}");
        }
        // Ties to even: 1 + 1/16 lies between 0x38 (1.0) and 0x39 (1.125).
        assert_eq!(e4m3_encode(1.0625), 0x38);
        assert_eq!(e4m3_encode(1.1875), 0x3A);
        assert_eq!(e4m3_encode(2f32.powi(-10)), 0x00, "half the least subnormal: to zero (even)");
        assert_eq!(e4m3_encode(3.0 * 2f32.powi(-10)), 0x02);
        assert_eq!(e4m3_encode(1e6), 0x7E);
        assert_eq!(e4m3_encode(-1e6), 0xFE);
    }

    #[test]
    fn the_two_tools_store_reciprocal_global_scales_and_agree_on_the_weights() {
        let x: Vec<f32> = (0..64).map(|k| ((k * 37 % 64) as f32 - 31.5) / 8.0).collect();
        let ct = nvfp4_quantize(Nvfp4Tool::CompressedTensors, &x, 32).expect("quantizes");
        let mo = nvfp4_quantize(Nvfp4Tool::ModelOpt, &x, 32).expect("quantizes");
        let amax = 31.5 / 8.0;
        assert_eq!(ct.global, GlobalScale::Divide((1.0 / amax) * 2688.0));
        assert_eq!(mo.global, GlobalScale::Multiply(amax / 2688.0));
        for m in [&ct, &mo] {
            let w = nvfp4_dequantize(&m.codes, &m.scales, m.global, 32).expect("dequantizes");
            for (a, b) in w.iter().zip(&x) {
                // Within half an E2M1 step of the largest block value (6 = amax_b / scale).
                assert!((a - b).abs() <= 1.0 / 6.0 * amax * 1.01, "{a} vs {b}");
            }
        }
        assert_eq!(nvfp4_quantize(Nvfp4Tool::ModelOpt, &x, 24), None);
        assert_eq!(nvfp4_dequantize(&ct.codes, &ct.scales[1..], ct.global, 32), None);
    }

    #[test]
    fn a_row_that_is_not_whole_groups_ends_in_a_shorter_group_with_its_own_scale() {
        // Two rows of 20: groups of 16 and 4 per row. Row 0's short group holds 3.0 (the tensor
        // amax, scale 448 · 3/6 / g = 0.5 exactly), row 1's 0.375 (scale 0.0625 after E4M3).
        let mut x = vec![0.0f32; 40];
        x[..16].fill(0.75);
        x[16] = 3.0;
        x[20 + 19] = -0.375;
        let m = nvfp4_quantize(Nvfp4Tool::CompressedTensors, &x, 20).expect("quantizes");
        assert_eq!(m.scales.len(), 4);
        assert_eq!(m.global, GlobalScale::Divide(2688.0 / 3.0));
        let w = nvfp4_dequantize(&m.codes, &m.scales, m.global, 20).expect("dequantizes");
        assert_eq!(w, x, "every value sits on its group's grid");
        assert_eq!(nvfp4_dequantize(&m.codes, &m.scales[..3], m.global, 20), None);
    }
}
