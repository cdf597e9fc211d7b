//! `q3_k`: super-blocks of 256 weights in 16 sub-blocks of 16, each with a 6-bit scale, scaled by
//! one FP16 `d` (110 bytes per 256, 3.4375 bits per weight). Read-only: qdrift dequantizes it
//! (GGUF files) but has no quantizer for it.
//!
//! Spec: llama.cpp `ggml/src/ggml-common.h`
//! `block_q3_K { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; ggml_half d; }` and
//! `ggml/src/ggml-quants.c` `dequantize_row_q3_K`. Each element is 2 low bits in `qs` (per 128
//! elements, 32 bytes: element `32·j + l` is bits `2j..2j+2` of byte `l`) and a high bit in `hmask`
//! (element `32·k + l` is bit `k` of `hmask[l]`, `k` in `0..8`); a clear high bit subtracts 4, so
//! `q ∈ [−4, 3]`. `scales[12]` packs sixteen 6-bit scales (the C's `kmask` shuffle): scale `s` has
//! its low 4 bits in `scales[s % 8]` (low nibble for `s < 8`, high nibble otherwise) and its high
//! 2 bits at bit offset `2·(s / 4)` of `scales[8 + s % 4]`.
//! `y = (d · (sc − 32)) · q`: the C forms `dl = d_all * (scales[is] - 32)` once per sub-block.

use crate::scalar::fp16_value;

/// The sixteen 6-bit scales, unpacked as `dequantize_row_q3_K`'s `aux` shuffle does.
fn unpack_scales(s: &[u8]) -> [u8; 16] {
    let mut out = [0u8; 16];
    for j in 0..4 {
        let h = s[8 + j];
        out[j] = (s[j] & 0x0F) | ((h & 3) << 4);
        out[j + 4] = (s[j + 4] & 0x0F) | (((h >> 2) & 3) << 4);
        out[j + 8] = (s[j] >> 4) | (((h >> 4) & 3) << 4);
        out[j + 12] = (s[j + 4] >> 4) | (((h >> 6) & 3) << 4);
    }
    out
}

/// `dequantize_row_q3_K` for one super-block: `x` is 110 bytes, `y` is 256 values.
pub(super) fn dequantize_block(x: &[u8], y: &mut [f32]) {
    let hm = &x[0..32];
    let scales = unpack_scales(&x[96..108]);
    let d_all = fp16_value([x[108], x[109]]);
    let mut is = 0;
    let mut m = 1u8;
    for (q, out) in x[32..96].chunks_exact(32).zip(y.chunks_exact_mut(128)) {
        for (j, out) in out.chunks_exact_mut(32).enumerate() {
            let shift = 2 * j;
            for (half, out) in out.chunks_exact_mut(16).enumerate() {
                let dl = d_all * (i32::from(scales[is]) - 32) as f32;
                is += 1;
                for (l, v) in out.iter_mut().enumerate() {
                    let i = 16 * half + l;
                    let q = i32::from((q[i] >> shift) & 3) - if hm[i] & m != 0 { 0 } else { 4 };
                    *v = dl * q as f32;
                }
            }
            m <<= 1;
        }
    }
}
