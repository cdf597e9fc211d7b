//! `q5_0`: 32 5-bit values with one FP16 scale (22 bytes per 32 weights, 5.5 bits per weight).
//! Read-only: qdrift dequantizes it (GGUF files) but has no quantizer for it.
//!
//! Spec: llama.cpp `ggml/src/ggml-common.h`
//! `block_q5_0 { ggml_half d; uint8_t qh[4]; uint8_t qs[16]; }` and `ggml/src/ggml-quants.c`
//! `dequantize_row_q5_0`. `qh` is a little-endian `u32` whose bit `j` is the fifth bit of element
//! `j`; byte `j` of `qs` holds the low 4 bits of element `j` (low nibble) and `j + 16` (high
//! nibble). `y = (q − 16) · fp16(d)`: the C multiplies the `int32_t` `q − 16` by the f32 `d`.

use super::fp16_value;

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
