//! `q2_k`: super-blocks of 256 weights in 16 sub-blocks of 16, each with a 4-bit scale and a
//! 4-bit min, themselves scaled by FP16 `d` and `dmin` (84 bytes per 256, 2.625 bits per weight).
//! Read-only: qdrift dequantizes it (GGUF files) but has no quantizer for it.
//!
//! Spec: llama.cpp `ggml/src/ggml-common.h`
//! `block_q2_K { uint8_t scales[16]; uint8_t qs[64]; ggml_half d; ggml_half dmin; }` and
//! `ggml/src/ggml-quants.c` `dequantize_row_q2_K`. `scales[s]` holds sub-block `s`'s scale (low
//! nibble) and min (high nibble). Per 128 elements, 32 bytes of `qs`: element `32·j + l` (`j` in
//! `0..4`, `l` in `0..32`) is bits `2j..2j+2` of byte `l`; sub-blocks run in element order.
//! `y = (d · sc) · q − dmin · m`: the C forms `dl = d * (sc & 0xF)` and `ml = min * (sc >> 4)`
//! once per sub-block, then `dl * q - ml`.

use crate::scalar::fp16_value;

/// `dequantize_row_q2_K` for one super-block: `x` is 84 bytes, `y` is 256 values.
pub(super) fn dequantize_block(x: &[u8], y: &mut [f32]) {
    let scales = &x[0..16];
    let d = fp16_value([x[80], x[81]]);
    let min = fp16_value([x[82], x[83]]);
    let mut is = 0;
    for (q, out) in x[16..80].chunks_exact(32).zip(y.chunks_exact_mut(128)) {
        for (j, out) in out.chunks_exact_mut(32).enumerate() {
            let shift = 2 * j;
            for (half, out) in out.chunks_exact_mut(16).enumerate() {
                let sc = scales[is];
                is += 1;
                let dl = d * f32::from(sc & 0x0F);
                let ml = min * f32::from(sc >> 4);
                for (l, v) in out.iter_mut().enumerate() {
                    let q = (q[16 * half + l] >> shift) & 3;
                    *v = dl * f32::from(q) - ml;
                }
            }
        }
    }
}
