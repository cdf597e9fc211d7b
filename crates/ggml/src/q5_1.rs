//! `q5_1`: 32 5-bit values with an FP16 scale and an FP16 minimum (24 bytes per 32 weights,
//! 6 bits per weight). Read-only: qdrift dequantizes it (GGUF files) but has no quantizer for it.
//!
//! Spec: llama.cpp `ggml/src/ggml-common.h`
//! `block_q5_1 { ggml_half d; ggml_half m; uint8_t qh[4]; uint8_t qs[16]; }` and
//! `ggml/src/ggml-quants.c` `dequantize_row_q5_1`. Bit packing as `q5_0` (`qh` a little-endian
//! `u32` of fifth bits, `qs` nibbles `j` and `j + 16`). `y = q · fp16(d) + fp16(m)`, one product
//! and one sum in f32, in that order.

use crate::scalar::fp16_value;

/// `dequantize_row_q5_1` for one block: `x` is 24 bytes, `y` is 32 values.
pub(super) fn dequantize_block(x: &[u8], y: &mut [f32]) {
    let d = fp16_value([x[0], x[1]]);
    let m = fp16_value([x[2], x[3]]);
    let qh = u32::from_le_bytes([x[4], x[5], x[6], x[7]]);
    let qs = &x[8..24];
    for j in 0..16 {
        let xh_0 = ((qh >> j) << 4) & 0x10;
        let xh_1 = (qh >> (j + 12)) & 0x10;
        let x0 = u32::from(qs[j] & 0x0F) | xh_0;
        let x1 = u32::from(qs[j] >> 4) | xh_1;
        y[j] = x0 as f32 * d + m;
        y[j + 16] = x1 as f32 * d + m;
    }
}
