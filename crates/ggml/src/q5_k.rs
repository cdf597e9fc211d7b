//! `q5_k`: super-blocks of 256 weights in 8 sub-blocks of 32, each with a 6-bit scale and a
//! 6-bit min, themselves scaled by FP16 `d` and `dmin` (176 bytes per 256, 5.5 bits per weight).
//! Read-only: qdrift dequantizes it (GGUF files) but has no quantizer for it.
//!
//! Spec: llama.cpp `ggml/src/ggml-common.h`
//! `block_q5_K { ggml_half d; ggml_half dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; }`
//! and `ggml/src/ggml-quants.c` `dequantize_row_q5_K` (with `get_scale_min_k4`, shared with
//! `q4_k`). Scales and mins pack as in `q4_k`; `qs` holds, per 64 elements, 32 bytes with element
//! `l` in the low nibble and `l + 32` in the high nibble; the fifth bit of element `64·n + l` is
//! bit `2n` of `qh[l]`, that of `64·n + 32 + l` bit `2n + 1`. `y = (d · sc) · q − dmin · m`.

use super::q4_k::get_scale_min_k4;
use crate::scalar::fp16_value;

/// `dequantize_row_q5_K` for one super-block: `x` is 176 bytes, `y` is 256 values.
pub(super) fn dequantize_block(x: &[u8], y: &mut [f32]) {
    let d = fp16_value([x[0], x[1]]);
    let min = fp16_value([x[2], x[3]]);
    let scales = &x[4..16];
    let qh = &x[16..48];
    for (n, (ql, out)) in x[48..176].chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (sc, m) = get_scale_min_k4(2 * n, scales);
        let (d1, m1) = (d * f32::from(sc), min * f32::from(m));
        let (sc, m) = get_scale_min_k4(2 * n + 1, scales);
        let (d2, m2) = (d * f32::from(sc), min * f32::from(m));
        let (u1, u2) = (1u8 << (2 * n), 2u8 << (2 * n));
        for l in 0..32 {
            let q1 = (ql[l] & 0x0F) + if qh[l] & u1 != 0 { 16 } else { 0 };
            let q2 = (ql[l] >> 4) + if qh[l] & u2 != 0 { 16 } else { 0 };
            out[l] = d1 * f32::from(q1) - m1;
            out[l + 32] = d2 * f32::from(q2) - m2;
        }
    }
}
