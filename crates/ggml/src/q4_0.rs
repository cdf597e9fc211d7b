//! `q4_0`: 32 4-bit values with one FP16 scale (18 bytes per 32 weights, 4.5 bits per weight).
//!
//! Spec: llama.cpp `ggml/src/ggml-common.h` `block_q4_0 { ggml_half d; uint8_t qs[16]; }` and
//! `ggml/src/ggml-quants.c` `quantize_row_q4_0_ref` / `dequantize_row_q4_0`. `max` is the value of
//! largest magnitude (the first one on ties), `d = max / -8`, and
//! `q = min(15, (int8_t)(x * (1/d) + 8.5f))` (truncation, so round half up), computed with the f32
//! `d` and stored with the FP16 `d`. Byte `j` holds element `j` in its low nibble and element
//! `j + 16` in its high nibble. `y = (q − 8) · fp16(d)`.
//!
//! The product and the `+ 8.5f` are two roundings, as ISO C writes them; a build of ggml that lets
//! the compiler contract them into one FMA can differ in rare ties (gguf-py's `Q4_0` notes this).

use crate::scalar::{c_float_to_int, fp16_bytes, fp16_value};

/// `quantize_row_q4_0_ref` for one block: `x` is 32 values, `y` is 18 bytes.
pub(super) fn quantize_block(x: &[f32], y: &mut [u8]) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    y[0..2].copy_from_slice(&fp16_bytes(d));
    let quant = |v: f32| (c_float_to_int(v * id + 8.5) as i8).min(15) as u8;
    for j in 0..16 {
        y[2 + j] = quant(x[j]) | (quant(x[16 + j]) << 4);
    }
}

/// `dequantize_row_q4_0` for one block: `x` is 18 bytes, `y` is 32 values.
pub(super) fn dequantize_block(x: &[u8], y: &mut [f32]) {
    let d = fp16_value([x[0], x[1]]);
    for j in 0..16 {
        let q = x[2 + j];
        y[j] = (i32::from(q & 0x0F) - 8) as f32 * d;
        y[j + 16] = (i32::from(q >> 4) - 8) as f32 * d;
    }
}
