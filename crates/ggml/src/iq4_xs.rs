//! `iq4_xs`: super-blocks of 256 weights in 8 sub-blocks of 32, each with a 6-bit scale, scaled
//! by one FP16 `d`; elements are 4-bit indices into `kvalues_iq4nl` (136 bytes per 256,
//! 4.25 bits per weight). Read-only: qdrift dequantizes it (GGUF files) but has no quantizer for
//! it.
//!
//! Spec: llama.cpp `ggml/src/ggml-common.h`
//! `block_iq4_xs { ggml_half d; uint16_t scales_h; uint8_t scales_l[4]; uint8_t qs[128]; }` and
//! `ggml/src/ggml-quants.c` `dequantize_row_iq4_xs`. Sub-block `ib`'s scale is
//! `ls = (scales_l[ib / 2] >> 4·(ib % 2)) & 0xF | ((scales_h >> 2·ib) & 3) << 4` (`scales_h`
//! little-endian); its 16 bytes of `qs` hold element `j` (low nibble) and `j + 16` (high nibble).
//! `y = (d · (ls − 32)) · kvalues_iq4nl[q]`: the C forms `dl = d * (ls - 32)` once per sub-block.

use super::iq4_nl::KVALUES_IQ4NL;
use crate::scalar::fp16_value;

/// `dequantize_row_iq4_xs` for one super-block: `x` is 136 bytes, `y` is 256 values.
pub(super) fn dequantize_block(x: &[u8], y: &mut [f32]) {
    let d = fp16_value([x[0], x[1]]);
    let scales_h = u16::from_le_bytes([x[2], x[3]]);
    let scales_l = &x[4..8];
    for (ib, (qs, out)) in x[8..136].chunks_exact(16).zip(y.chunks_exact_mut(32)).enumerate() {
        let ls = i32::from((scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0F) | (i32::from((scales_h >> (2 * ib)) & 3) << 4);
        let dl = d * (ls - 32) as f32;
        for (j, &q) in qs.iter().enumerate() {
            out[j] = dl * f32::from(KVALUES_IQ4NL[usize::from(q & 0x0F)]);
            out[j + 16] = dl * f32::from(KVALUES_IQ4NL[usize::from(q >> 4)]);
        }
    }
}
