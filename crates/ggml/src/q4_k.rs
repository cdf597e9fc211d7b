//! `q4_k`: super-blocks of 256 weights in 8 sub-blocks of 32, each with a 6-bit scale and a
//! 6-bit min, themselves scaled by FP16 `d` and `dmin` (144 bytes per 256, 4.5 bits per weight).
//!
//! Spec: llama.cpp `ggml/src/ggml-common.h`
//! `block_q4_K { ggml_half d; ggml_half dmin; uint8_t scales[12]; uint8_t qs[128]; }` and
//! `ggml/src/ggml-quants.c` `quantize_row_q4_K_ref`, `make_qkx2_quants`, `get_scale_min_k4`,
//! `dequantize_row_q4_K`. Each sub-block is fitted as `x ≈ scale · L − min` with `L ∈ [0, 15]` by
//! `make_qkx2_quants` (weights `av_x + |x|`, a search over 21 candidate scales minimizing the
//! weighted squared error), the 8 scales and mins are quantized to 6 bits against their maxima,
//! and the elements are requantized against the stored (FP16 × 6-bit) scale and min.
//!
//! `scales[12]` packing (`get_scale_min_k4`): for sub-block `j < 4`, scale = `scales[j] & 63`,
//! min = `scales[j + 4] & 63`; for `j ≥ 4`, scale = `scales[j + 4] & 0xF | (scales[j − 4] >> 6) << 4`,
//! min = `scales[j + 4] >> 4 | (scales[j] >> 6) << 4`. `qs` holds, per 64 elements, 32 bytes with
//! element `l` in the low nibble and element `l + 32` in the high nibble.
//! `y = d · sc · q − dmin · m`.

use crate::scalar::{fp16_bytes, fp16_value, nearest_int};

/// `make_qkx2_quants` (n = 32 here): fits `x ≈ scale · L + min` (`min ≤ 0`) and returns `scale`,
/// writing `L` and `the_min = −min`.
#[allow(clippy::too_many_arguments)] // mirrors the C signature one to one
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
    the_min: &mut f32,
    l_aux: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> f32 {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out[..n].fill(0);
        *the_min = -min;
        return 0.0;
    }
    let nmax_f = nmax as f32;
    let mut iscale = nmax_f / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min));
        l_out[i] = l.clamp(0, nmax) as u8;
        let mut diff = scale * f32::from(l_out[i]) + min - x[i];
        diff = if use_mad { diff.abs() } else { diff * diff };
        best_error += weights[i] * diff;
    }
    if nstep < 1 {
        *the_min = -min;
        return scale;
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax_f) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            l_aux[i] = l as u8;
            let (w, l) = (weights[i], l as f32);
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let mut diff = this_scale * f32::from(l_aux[i]) + this_min - x[i];
                diff = if use_mad { diff.abs() } else { diff * diff };
                cur_error += weights[i] * diff;
            }
            if cur_error < best_error {
                l_out[..n].copy_from_slice(&l_aux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    scale
}

/// `get_scale_min_k4`: the 6-bit scale and min of sub-block `j`.
pub(super) fn get_scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// `quantize_row_q4_K_ref` for one super-block: `x` is 256 values, `y` is 144 bytes.
pub(super) fn quantize_block(x: &[f32], y: &mut [u8]) {
    let mut l = [0u8; 256];
    let mut l_aux = [0u8; 32];
    let mut weights = [0.0f32; 32];
    let mut mins = [0.0f32; 8];
    let mut scales = [0.0f32; 8];

    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        scales[j] = make_qkx2_quants(
            15,
            xs,
            &weights,
            &mut l[32 * j..32 * j + 32],
            &mut mins[j],
            &mut l_aux,
            -1.0,
            0.1,
            20,
            false,
        );
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }

    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let sc = &mut [0u8; 12];
    for j in 0..8 {
        // C: `uint8_t ls = nearest_int(...)` truncates the int to 8 bits before the MIN.
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (ls & 0x0F) | ((lm & 0x0F) << 4);
            sc[j - 4] |= (ls >> 4) << 6;
            sc[j] |= (lm >> 4) << 6;
        }
    }
    y[0..2].copy_from_slice(&fp16_bytes(max_scale / 63.0));
    y[2..4].copy_from_slice(&fp16_bytes(max_min / 63.0));
    y[4..16].copy_from_slice(sc);

    let d_all = fp16_value([y[0], y[1]]);
    let dmin_all = fp16_value([y[2], y[3]]);
    for j in 0..8 {
        let (s, m) = get_scale_min_k4(j, sc);
        let d = d_all * f32::from(s);
        if d == 0.0 {
            continue; // keeps the L of make_qkx2_quants, as the C does
        }
        let dm = dmin_all * f32::from(m);
        for ii in 0..32 {
            l[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / d).clamp(0, 15) as u8;
        }
    }

    let qs = &mut y[16..144];
    for (chunk, q) in l.chunks_exact(64).zip(qs.chunks_exact_mut(32)) {
        for i in 0..32 {
            q[i] = chunk[i] | (chunk[i + 32] << 4);
        }
    }
}

/// `dequantize_row_q4_K` for one super-block: `x` is 144 bytes, `y` is 256 values.
pub(super) fn dequantize_block(x: &[u8], y: &mut [f32]) {
    let d = fp16_value([x[0], x[1]]);
    let min = fp16_value([x[2], x[3]]);
    let scales = &x[4..16];
    for (n, (q, out)) in x[16..144].chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (sc, m) = get_scale_min_k4(2 * n, scales);
        let (d1, m1) = (d * f32::from(sc), min * f32::from(m));
        let (sc, m) = get_scale_min_k4(2 * n + 1, scales);
        let (d2, m2) = (d * f32::from(sc), min * f32::from(m));
        for l in 0..32 {
            out[l] = d1 * f32::from(q[l] & 0x0F) - m1;
            out[l + 32] = d2 * f32::from(q[l] >> 4) - m2;
        }
    }
}
