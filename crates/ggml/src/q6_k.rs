//! `q6_k`: super-blocks of 256 weights in 16 sub-blocks of 16, each with an int8 scale, scaled by
//! one FP16 `d` (210 bytes per 256, 6.5625 bits per weight).
//!
//! Spec: llama.cpp `ggml/src/ggml-common.h`
//! `block_q6_K { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; ggml_half d; }` and
//! `ggml/src/ggml-quants.c` `quantize_row_q6_K_ref`, `make_qx_quants` (with `rmse_type = 1`,
//! no importance weights: weights `x²` and a search over 18 perturbed scales), and
//! `dequantize_row_q6_K`. Each sub-block gets a scale from `make_qx_quants(16, 32, ...)`; the 16
//! scales are quantized to int8 against the one of largest magnitude (`iscale = −128 / max`);
//! elements are requantized to `[−32, 31]` against the stored scale and kept as `q + 32`.
//!
//! Packing, per 128 elements (`l` in `0..32`): `ql[l]` = low 4 bits of elements `l` (low nibble)
//! and `l + 64` (high nibble), `ql[l + 32]` = those of `l + 32` and `l + 96`; `qh[l]` = the high
//! 2 bits of elements `l`, `l + 32`, `l + 64`, `l + 96` at bit offsets 0, 2, 4, 6.
//! `y = d · scales[sub-block] · (q − 32)`.

use crate::scalar::{fp16_bytes, fp16_value, nearest_int};

/// `GROUP_MAX_EPS` of `ggml-quants.c`.
const GROUP_MAX_EPS: f32 = 1e-15;

/// `make_qx_quants` with `rmse_type = 1` and `qw = NULL`: returns the scale, writes
/// `L = l + nmax` with `l ∈ [−nmax, nmax − 1]`.
fn make_qx_quants(nmax: i32, x: &[f32], l_out: &mut [u8]) -> f32 {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out[..x.len()].fill(0);
        return 0.0;
    }
    let nmax_f = nmax as f32;
    let quant = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let mut iscale = -nmax_f / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (i, &v) in x.iter().enumerate() {
        let l = quant(iscale, v);
        l_out[i] = (l + nmax) as u8;
        let (w, l) = (v * v, l as f32);
        sumlx += w * v * l;
        suml2 += w * l * l;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax_f + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &v in x {
            let (w, l) = (v * v, quant(iscale, v) as f32);
            sumlx += w * v * l;
            suml2 += w * l * l;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (i, &v) in x.iter().enumerate() {
                l_out[i] = (quant(iscale, v) + nmax) as u8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `quantize_row_q6_K_ref` for one super-block: `x` is 256 values, `y` is 210 bytes.
pub(super) fn quantize_block(x: &[f32], y: &mut [u8]) {
    let mut l = [0u8; 256];
    let mut scales = [0.0f32; 16];
    let mut max_scale = 0.0f32;
    let mut max_abs_scale = 0.0f32;
    for ib in 0..16 {
        let scale = make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..16 * ib + 16]);
        scales[ib] = scale;
        if scale.abs() > max_abs_scale {
            max_abs_scale = scale.abs();
            max_scale = scale;
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        y.fill(0);
        y[208..210].copy_from_slice(&fp16_bytes(0.0));
        return;
    }

    let iscale = -128.0 / max_scale;
    y[208..210].copy_from_slice(&fp16_bytes(1.0 / iscale));
    for ib in 0..16 {
        // C: `y[i].scales[ib] = MIN(127, nearest_int(...))` into an int8_t.
        y[192 + ib] = nearest_int(iscale * scales[ib]).min(127) as i8 as u8;
    }
    let d_all = fp16_value([y[208], y[209]]);
    for j in 0..16 {
        let d = d_all * f32::from(y[192 + j] as i8);
        if d == 0.0 {
            continue; // keeps the L of make_qx_quants, as the C does
        }
        for ii in 0..16 {
            let q = nearest_int(x[16 * j + ii] / d).clamp(-32, 31);
            l[16 * j + ii] = (q + 32) as u8;
        }
    }

    let (ql, rest) = y.split_at_mut(128);
    let qh = &mut rest[..64];
    for (half, chunk) in l.chunks_exact(128).enumerate() {
        let ql = &mut ql[64 * half..64 * half + 64];
        let qh = &mut qh[32 * half..32 * half + 32];
        for i in 0..32 {
            let (q1, q2, q3, q4) = (chunk[i], chunk[i + 32], chunk[i + 64], chunk[i + 96]);
            ql[i] = (q1 & 0x0F) | ((q3 & 0x0F) << 4);
            ql[i + 32] = (q2 & 0x0F) | ((q4 & 0x0F) << 4);
            qh[i] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
        }
    }
}

/// `dequantize_row_q6_K` for one super-block: `x` is 210 bytes, `y` is 256 values.
pub(super) fn dequantize_block(x: &[u8], y: &mut [f32]) {
    let d = fp16_value([x[208], x[209]]);
    for (half, out) in y.chunks_exact_mut(128).enumerate() {
        let ql = &x[64 * half..64 * half + 64];
        let qh = &x[128 + 32 * half..128 + 32 * half + 32];
        let sc = &x[192 + 8 * half..192 + 8 * half + 8];
        let scale = |k: usize| d * f32::from(sc[k] as i8);
        for l in 0..32 {
            let is = l / 16;
            let q1 = i32::from((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) - 32;
            let q2 = i32::from((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
            let q3 = i32::from((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            let q4 = i32::from((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            out[l] = scale(is) * q1 as f32;
            out[l + 32] = scale(is + 2) * q2 as f32;
            out[l + 64] = scale(is + 4) * q3 as f32;
            out[l + 96] = scale(is + 6) * q4 as f32;
        }
    }
}
