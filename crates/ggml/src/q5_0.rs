//! `q5_0`: 32 5-bit values with one FP16 scale (22 bytes per 32 weights, 5.5 bits per weight).
//! llama.cpp's fallback for a `q4_K` tensor whose rows are not whole 256-blocks (see
//! [`crate::GgmlType::row_fallback`]).
//!
//! Spec: llama.cpp `ggml/src/ggml-common.h`
//! `block_q5_0 { ggml_half d; uint8_t qh[4]; uint8_t qs[16]; }` and `ggml/src/ggml-quants.c`
//! `quantize_row_q5_0_ref` / `dequantize_row_q5_0`. `max` is the value of largest magnitude (the
//! first one on ties), `d = max / -16`, and `q = min(31, (int8_t)(x * (1/d) + 16.5f))`
//! (truncation, so round half up), computed with the f32 `d` and stored with the FP16 `d`.
//! `qh` is a little-endian `u32` whose bit `j` is the fifth bit of element `j`; byte `j` of `qs`
//! holds the low 4 bits of element `j` (low nibble) and `j + 16` (high nibble).
//! `y = (q − 16) · fp16(d)`: the C multiplies the `int32_t` `q − 16` by the f32 `d`.
//!
//! As for `q4_0`, the product and the `+ 16.5f` are two roundings, as ISO C writes them (gguf-py's
//! numpy `Q5_0` computes them in f64 instead and can differ in rare ties).

use crate::scalar::{c_float_to_int, fp16_bytes, fp16_value};

/// `quantize_row_q5_0_ref` for one block: `x` is 32 values, `y` is 22 bytes.
pub(super) fn quantize_block(x: &[f32], y: &mut [u8]) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -16.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    y[0..2].copy_from_slice(&fp16_bytes(d));
    let quant = |v: f32| (c_float_to_int(v * id + 16.5) as i8).min(31) as u8;
    let mut qh = 0u32;
    for j in 0..16 {
        let (xi0, xi1) = (quant(x[j]), quant(x[16 + j]));
        y[6 + j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
        qh |= u32::from((xi0 & 0x10) >> 4) << j;
        qh |= u32::from((xi1 & 0x10) >> 4) << (j + 16);
    }
    y[2..6].copy_from_slice(&qh.to_le_bytes());
}

/// `dequantize_row_q5_0` for one block: `x` is 22 bytes, `y` is 32 values.
pub(super) fn dequantize_block(x: &[u8], y: &mut [f32]) {
    let d = fp16_value([x[0], x[1]]);
    let qh = u32::from_le_bytes([x[2], x[3], x[4], x[5]]);
    let qs = &x[6..22];
    for j in 0..16 {
        // C: `xh_0 = ((qh >> j) << 4) & 0x10`, `xh_1 = (qh >> (j + 12)) & 0x10`.
        let xh_0 = ((qh >> j) << 4) & 0x10;
        let xh_1 = (qh >> (j + 12)) & 0x10;
        let x0 = (u32::from(qs[j] & 0x0F) | xh_0) as i32 - 16;
        let x1 = (u32::from(qs[j] >> 4) | xh_1) as i32 - 16;
        y[j] = x0 as f32 * d;
        y[j + 16] = x1 as f32 * d;
    }
}
