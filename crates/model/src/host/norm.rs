//! RMSNorm on host values, with the roundings of an f16 model's tensors: what `RmsNorm::forward`
//! runs on the CPU backend ([`super::placement::norm_on_host`]).

use super::elem::round_f16;

/// RMSNorm of rows of `w.len()` values of the compute dtype (f16 values when `f16`), weighted by
/// `w`: per row, `s = Σ x²` summed in f64 over eight interleaved lanes added in a fixed tree
/// (each square is exact in f64, so the statistic is within a few f64 roundings of the exact
/// one), `inv = 1 / sqrt(s / dim + eps)` in f64 rounded once to f32, then
/// `y = round(round(x · inv) · w)`, each product in f32 and rounded to the compute dtype (the
/// product of two f16 values is exact in f32, so the last rounding is f16's own).
///
/// # Shapes
/// - `x`: `[rows, dim]`, row-major; `w`: `[dim]` → `[rows, dim]`
pub(crate) fn rms_norm(x: &[f32], w: &[f32], eps: f64, f16: bool) -> Vec<f32> {
    let dim = w.len().max(1);
    let mut y = vec![0.0f32; x.len()];
    for (xs, ys) in x.chunks_exact(dim).zip(y.chunks_exact_mut(dim)) {
        let inv = (1.0 / (sum_of_squares(xs) / dim as f64 + eps).sqrt()) as f32;
        for (yv, &xv) in ys.iter_mut().zip(xs) {
            *yv = xv * inv;
        }
        if f16 {
            round_f16(ys);
        }
        for (yv, &wv) in ys.iter_mut().zip(w) {
            *yv *= wv;
        }
    }
    if f16 {
        round_f16(&mut y);
    }
    y
}

/// `Σ x²` in f64: element `j` in lane `j % 8`, the lanes added in a fixed tree, so the order does
/// not depend on how the loop is vectorised.
fn sum_of_squares(x: &[f32]) -> f64 {
    let mut acc = [0.0f64; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += f64::from(v) * f64::from(v);
        }
    }
    for (a, &v) in acc.iter_mut().zip(chunks.remainder()) {
        *a += f64::from(v) * f64::from(v);
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}
