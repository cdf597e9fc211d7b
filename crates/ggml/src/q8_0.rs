//! `q8_0`: 32 int8 with one FP16 scale (34 bytes per 32 weights, 8.5 bits per weight).
//!
//! Spec: llama.cpp `ggml/src/ggml-common.h` `block_q8_0 { ggml_half d; int8_t qs[32]; }` and
//! `ggml/src/ggml-quants.c` `quantize_row_q8_0_ref` / `dequantize_row_q8_0`:
//! `d = amax / 127`, `qs[j] = roundf(x[j] * (1/d))` (round half away from zero, computed with the
//! f32 `d`, stored with the FP16 `d`), `y = qs[j] * fp16(d)`. The float-to-int8 conversion is
//! C's (see `c_float_to_int`).

use crate::scalar::{c_float_to_int, fp16_bytes, fp16_value};

/// `quantize_row_q8_0_ref` for one block: `x` is 32 values, `y` is 34 bytes.
pub(super) fn quantize_block(x: &[f32], y: &mut [u8]) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    y[0..2].copy_from_slice(&fp16_bytes(d));
    for (q, &v) in y[2..].iter_mut().zip(x) {
        *q = c_float_to_int((v * id).round()) as i8 as u8;
    }
}

/// `dequantize_row_q8_0` for one block: `x` is 34 bytes, `y` is 32 values.
pub(super) fn dequantize_block(x: &[u8], y: &mut [f32]) {
    let d = fp16_value([x[0], x[1]]);
    for (out, &q) in y.iter_mut().zip(&x[2..]) {
        *out = f32::from(q as i8) * d;
    }
}
