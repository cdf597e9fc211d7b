//! `q4_1`: 32 4-bit values with an FP16 scale and an FP16 minimum (20 bytes per 32 weights,
//! 5 bits per weight).
//!
//! Spec: llama.cpp `ggml/src/ggml-common.h`
//! `block_q4_1 { ggml_half d; ggml_half m; uint8_t qs[16]; }` and `ggml/src/ggml-quants.c`
//! `quantize_row_q4_1_ref` / `dequantize_row_q4_1`: `d = (max − min) / 15`,
//! `q = min(15, (int8_t)((x − min) * (1/d) + 0.5f))`, computed with the f32 `d` and `min` and
//! stored as FP16. Byte `j` holds element `j` (low nibble) and `j + 16` (high nibble).
//! `y = q · fp16(d) + fp16(min)`.

use crate::scalar::{c_float_to_int, fp16_bytes, fp16_value};

/// `quantize_row_q4_1_ref` for one block: `x` is 32 values, `y` is 20 bytes.
pub(super) fn quantize_block(x: &[f32], y: &mut [u8]) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    let d = (max - min) / 15.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    y[0..2].copy_from_slice(&fp16_bytes(d));
    y[2..4].copy_from_slice(&fp16_bytes(min));
    let quant = |v: f32| (c_float_to_int((v - min) * id + 0.5) as i8).min(15) as u8;
    for j in 0..16 {
        y[4 + j] = quant(x[j]) | (quant(x[16 + j]) << 4);
    }
}

/// `dequantize_row_q4_1` for one block: `x` is 20 bytes, `y` is 32 values.
pub(super) fn dequantize_block(x: &[u8], y: &mut [f32]) {
    let d = fp16_value([x[0], x[1]]);
    let m = fp16_value([x[2], x[3]]);
    for j in 0..16 {
        let q = x[4 + j];
        y[j] = f32::from(q & 0x0F) * d + m;
        y[j + 16] = f32::from(q >> 4) * d + m;
    }
}
