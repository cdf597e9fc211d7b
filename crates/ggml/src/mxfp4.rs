//! `mxfp4`: OCP MXFP4 as ggml stores it: one E8M0 scale byte and 32 E2M1 nibbles (17 bytes per
//! 32 weights, 4.25 bits per weight).
//!
//! Spec: OCP Microscaling Formats (MX) v1.0 §5 (E2M1 elements, E8M0 shared scale) and llama.cpp
//! `ggml/src/ggml-common.h` (`block_mxfp4 { uint8_t e; uint8_t qs[16]; }`, `kvalues_mxfp4`, the
//! E2M1 values doubled so they are integers), `ggml/src/ggml-impl.h` (`ggml_e8m0_to_fp32_half`)
//! and `ggml/src/ggml-quants.c` (`quantize_row_mxfp4_ref`, `best_index_mxfp4`,
//! `dequantize_row_mxfp4`):
//!
//! - `e = amax > 0 ? (uint8_t)(floorf(log2f(amax)) − 2 + 127) : 0`;
//! - `d = ggml_e8m0_to_fp32_half(e)` = 2^(e − 128) (the halving undoes the doubled table);
//! - each element takes the first index `i` minimizing `|kvalues_mxfp4[i] · d − x|`;
//! - byte `j` holds element `j` (low nibble) and `j + 16` (high nibble); `y = kvalues[q] · d`.
//!
//! This is llama.cpp's rule, which llama.cpp's GGUF files hold. Its scale is the OCP spec's
//! (§6.3), but `best_index_mxfp4` rounds the ties at 0.75, 1.75 and 3.5 (times the scale) down
//! where the spec rounds to even; qdrift-codecs' `mxfp4-ocp` and `mxfp4-ct` schemes are the
//! spec's and compressed-tensors' (vLLM's checkpoints) rules.
//!
//! `log2f` is the platform's, as in ggml (Rust's `f32::log2` calls the same libm function). For
//! `amax < 2^-125` the C cast of a negative float to `uint8_t` is undefined; this port keeps the
//! low byte of the truncated value, as x86-64 builds of ggml do (see `c_float_to_int`).

use crate::e2m1::KVALUES_MXFP4 as KVALUES;
use crate::scalar::c_float_to_int;

/// `ggml_e8m0_to_fp32_half`: 2^(x − 128), with the two subnormal cases spelled out.
fn e8m0_to_fp32_half(x: u8) -> f32 {
    let bits = if x < 2 { 0x0020_0000u32 << x } else { (u32::from(x) - 1) << 23 };
    f32::from_bits(bits)
}

/// `best_index_mxfp4`.
fn best_index(x: f32, e: f32) -> u8 {
    let mut best_index = 0;
    let mut best_err = (f32::from(KVALUES[0]) * e - x).abs();
    for (i, &k) in KVALUES.iter().enumerate().skip(1) {
        let err = (f32::from(k) * e - x).abs();
        if err < best_err {
            best_index = i as u8;
            best_err = err;
        }
    }
    best_index
}

/// `quantize_row_mxfp4_ref` for one block: `x` is 32 values, `y` is 17 bytes.
pub(super) fn quantize_block(x: &[f32], y: &mut [u8]) {
    let amax = x.iter().fold(0.0f32, |m, &v| if m < v.abs() { v.abs() } else { m });
    let e = if amax > 0.0 { c_float_to_int(amax.log2().floor() - 2.0 + 127.0) as u8 } else { 0 };
    let d = e8m0_to_fp32_half(e);
    y[0] = e;
    for j in 0..16 {
        y[1 + j] = best_index(x[j], d) | (best_index(x[16 + j], d) << 4);
    }
}

/// `dequantize_row_mxfp4` for one block: `x` is 17 bytes, `y` is 32 values.
pub(super) fn dequantize_block(x: &[u8], y: &mut [f32]) {
    let d = e8m0_to_fp32_half(x[0]);
    for j in 0..16 {
        let q = x[1 + j];
        y[j] = f32::from(KVALUES[usize::from(q & 0x0F)]) * d;
        y[j + 16] = f32::from(KVALUES[usize::from(q >> 4)]) * d;
    }
}

#[cfg(test)]
mod tests {
    use super::e8m0_to_fp32_half;

    #[test]
    fn e8m0_half_is_two_to_the_e_minus_128() {
        for e in 0..=254u8 {
            assert_eq!(f64::from(e8m0_to_fp32_half(e)), 2f64.powi(i32::from(e) - 128), "e = {e}");
        }
    }
}
