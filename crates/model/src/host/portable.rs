//! The portable kernels: plain Rust, one output at a time. They are the definitions the AVX2
//! and AVX-512 kernels ([`super::avx2`], [`super::avx512`]) follow operation for operation, and
//! what runs where the CPU has neither.

use super::elem::Elem;
use super::panels::PANEL;

/// One row of the linear layer's panel product, the definition: `dst[c] = Σ_i x[i] · panel[i][c]`,
/// one fused multiply-add chain per output over `i` in order from 0.
///
/// # Shapes
/// - `x`: `[k]`; `panel`: `[k, PANEL]`; `dst`: the first `cols ≤ PANEL` columns
pub(super) fn panel_row<T: Elem>(x: &[f32], panel: &[T], dst: &mut [f32]) {
    for (c, d) in dst.iter_mut().enumerate() {
        let mut acc = 0.0f32;
        for (i, &xi) in x.iter().enumerate() {
            acc = xi.mul_add(panel[i * PANEL + c].widen(), acc);
        }
        *d = acc;
    }
}

/// `out[l] = Σ_i x[i] · m[i · stride + l]` for every lane `l`, one [`dot1`] per lane: attention's
/// dot products (q·k over transposed keys, P·V over values) in the portable build.
#[inline(always)]
pub(super) fn dots<T: Elem>(x: &[f32], m: &[T], stride: usize, out: &mut [f32]) {
    for (l, o) in out.iter_mut().enumerate() {
        *o = dot1(x, &m[l..], stride);
    }
}

/// `Σ_i x[i] · m[i · stride]`, the definition every SIMD lane follows: four partial sums over
/// `i mod 4`, each in increasing `i`, added as `(p0 + p1) + (p2 + p3)` (four independent chains
/// keep the adder busy, and the order is the same in every build).
#[inline(always)]
pub(super) fn dot1<T: Elem>(x: &[f32], m: &[T], stride: usize) -> f32 {
    let mut acc = [0.0f32; 4];
    for (i, &xi) in x.iter().enumerate() {
        acc[i & 3] += xi * m[i * stride].widen();
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3])
}
