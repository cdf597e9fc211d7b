//! `nvfp4`: NVFP4 as ggml stores it (`GGML_TYPE_NVFP4`, GGUF type 40): 64 weights per block in
//! four sub-blocks of 16, each with an unsigned E4M3 scale byte (36 bytes per 64 weights, 4.5 bits
//! per weight). Read-only here.
//!
//! Spec: llama.cpp `ggml/src/ggml-common.h` (`block_nvfp4 { uint8_t d[4]; uint8_t qs[32]; }`,
//! `QK_NVFP4` = 64, `QK_NVFP4_SUB` = 16, the E2M1 table `kvalues_mxfp4` doubled),
//! `ggml/src/ggml-impl.h` (`ggml_ue4m3_to_fp32`) and `ggml/src/ggml-quants.c`
//! (`dequantize_row_nvfp4`); gguf-py 0.19.0 `gguf/quants.py` (`class NVFP4`) and
//! `constants.py` (`NVFP4 = 40`, `(64, 4 + 32)`) say the same.
//!
//! This differs from the checkpoints' NVFP4 (compressed-tensors, ModelOpt; see
//! `nvfp4_tensor.rs`): the scales are *unsigned* E4M3 (bit 7 ignored; 0 and 0x7F decode as 0,
//! the stored value carrying a factor 1/2 for the doubled table), the 16-value groups sit in
//! 64-value blocks, sub-block `s`'s byte `qs[8s + j]` holds element `j` (low nibble) and `j + 8`
//! (high nibble), and there is no per-tensor global scale: llama.cpp's converter folds it into a
//! separate multiplication outside the block, which this type does not carry.

use crate::e2m1::KVALUES_MXFP4;

/// `ggml_ue4m3_to_fp32`: an unsigned E4M3 byte (bias 7, no sign: bit 7 is masked off), halved.
/// 0 and 0x7F give 0.
fn ue4m3_to_fp32_half(x: u8) -> f32 {
    if x == 0 || x == 0x7F {
        return 0.0;
    }
    let exp = i32::from((x >> 3) & 0x0F);
    let man = f32::from(x & 0x07);
    // ldexpf(man, -9) or ldexpf(1 + man/8, exp - 7): exact, as is the halving.
    let raw = if exp == 0 { man * 2f32.powi(-9) } else { (1.0 + man / 8.0) * 2f32.powi(exp - 7) };
    raw * 0.5
}

/// `dequantize_row_nvfp4` for one block: `x` is 36 bytes, `y` is 64 values: the doubled integer
/// `kvalues_mxfp4[q]` times the halved scale (exact; code 8, −0, gives +0 as in the C).
pub(super) fn dequantize_block(x: &[u8], y: &mut [f32]) {
    for s in 0..4 {
        let d = ue4m3_to_fp32_half(x[s]);
        for j in 0..8 {
            let q = x[4 + s * 8 + j];
            y[s * 16 + j] = f32::from(KVALUES_MXFP4[usize::from(q & 0x0F)]) * d;
            y[s * 16 + j + 8] = f32::from(KVALUES_MXFP4[usize::from(q >> 4)]) * d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ue4m3_is_unsigned_e4m3_halved_with_two_zero_codes() {
        assert_eq!(ue4m3_to_fp32_half(0x38), 0.5, "1.0 halved");
        assert_eq!(ue4m3_to_fp32_half(0x7E), 224.0, "448 halved");
        assert_eq!(ue4m3_to_fp32_half(0x01), 2f32.powi(-10), "min subnormal halved");
        assert_eq!(ue4m3_to_fp32_half(0x7F), 0.0);
        assert_eq!(ue4m3_to_fp32_half(0x00), 0.0);
        // Bit 7 is ignored: 0xB8 is 0x38; 0xFF is 0x7F's bit fields (exp 15, man 7) = 480 / 2.
        assert_eq!(ue4m3_to_fp32_half(0xB8), 0.5);
        assert_eq!(ue4m3_to_fp32_half(0xFF), 240.0);
    }

    #[test]
    fn a_hand_computed_block() {
        // Sub-block scales 1.0, 2.0, 0.5 and 0 (code 0x7F); sub-block 0's first byte holds
        // element 0 (low nibble, 0b0001 = 0.5) and element 8 (high nibble, 0b1111 = −6).
        let mut x = [0u8; 36];
        x[..4].copy_from_slice(&[0x38, 0x40, 0x30, 0x7F]);
        x[4] = 0xF1;
        x[4 + 8] = 0x27; // sub-block 1: element 16 = 6 · 2, element 24 = 1 · 2
        x[4 + 16 + 7] = 0x9A; // sub-block 2: element 39 = −1 · 0.5, element 47 = −0.5 · 0.5
        x[4 + 24] = 0x77; // sub-block 3: scale 0
        let mut y = [f32::NAN; 64];
        dequantize_block(&x, &mut y);
        let mut want = [0.0f32; 64];
        (want[0], want[8], want[16], want[24], want[39], want[47]) = (0.5, -6.0, 12.0, 2.0, -0.5, -0.25);
        for (k, (g, w)) in y.iter().zip(want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "element {k}");
        }
    }
}
