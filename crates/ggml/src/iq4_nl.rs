//! `iq4_nl`: 32 4-bit indices into the non-linear table `kvalues_iq4nl` with one FP16 scale
//! (18 bytes per 32 weights, 4.5 bits per weight). Read-only: qdrift dequantizes it (GGUF files)
//! but has no quantizer for it.
//!
//! Spec: llama.cpp `ggml/src/ggml-common.h` `block_iq4_nl { ggml_half d; uint8_t qs[16]; }` and
//! its table `kvalues_iq4nl`, and `ggml/src/ggml-quants.c` `dequantize_row_iq4_nl`. Byte `j` holds
//! the index of element `j` (low nibble) and `j + 16` (high nibble).
//! `y = fp16(d) · kvalues_iq4nl[q]`.

use crate::scalar::fp16_value;

/// `kvalues_iq4nl` of `ggml-common.h` (`int8_t`).
pub(super) const KVALUES_IQ4NL: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// `dequantize_row_iq4_nl` for one block: `x` is 18 bytes, `y` is 32 values.
pub(super) fn dequantize_block(x: &[u8], y: &mut [f32]) {
    let d = fp16_value([x[0], x[1]]);
    for (j, &q) in x[2..18].iter().enumerate() {
        y[j] = d * f32::from(KVALUES_IQ4NL[usize::from(q & 0x0F)]);
        y[j + 16] = d * f32::from(KVALUES_IQ4NL[usize::from(q >> 4)]);
    }
}
