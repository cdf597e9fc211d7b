//! The element types the CPU kernels store (f32, or f16 widened exactly as it is read) and the
//! roundings to f16 that an f16 model's tensors perform.

use half::f16;
use half::slice::HalfFloatSliceExt;

/// An element type weights, keys and values are stored in: f32, or f16 (widened exactly to f32
/// as it is read, with `vcvtph2ps` in the AVX2 and AVX-512 kernels).
pub(crate) trait Elem: Copy + Default + std::fmt::Debug + Send + Sync {
    /// Whether this is f16.
    const F16: bool;
    /// The value, exactly, as f32.
    fn widen(self) -> f32;
    /// `v` in this type; `v` must be representable.
    fn narrow(v: f32) -> Self;
    /// [`Elem::narrow`] of every value of `src` into `dst` (of the same length).
    fn narrow_slice(src: &[f32], dst: &mut [Self]) {
        for (d, &v) in dst.iter_mut().zip(src) {
            *d = Self::narrow(v);
        }
    }
}

impl Elem for f32 {
    const F16: bool = false;
    fn widen(self) -> f32 {
        self
    }
    fn narrow(v: f32) -> Self {
        v
    }
}

impl Elem for f16 {
    const F16: bool = true;
    fn widen(self) -> f32 {
        self.to_f32()
    }
    fn narrow(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn narrow_slice(src: &[f32], dst: &mut [Self]) {
        // F16C, 8 at a time where the CPU has it: the same rounding as `f16::from_f32`.
        dst.convert_from_f32_slice(src);
    }
}

/// Rounds every value to f16 (nearest even) and back: what storing it in an f16 tensor does.
pub(crate) fn round_f16(values: &mut [f32]) {
    // Through a small f16 buffer with `half`'s slice conversions (F16C, 8 at a time, where the
    // CPU has it): the same rounding as `f16::from_f32` one value at a time.
    let mut buf = [f16::ZERO; 256];
    for chunk in values.chunks_mut(256) {
        let h = &mut buf[..chunk.len()];
        h.convert_from_f32_slice(chunk);
        h.convert_to_f32_slice(chunk);
    }
}

/// Whether every value is exactly an f16 value, bit for bit (−0.0 included; NaN never is): what
/// f16 storage keeps unchanged.
pub(crate) fn is_f16_exact(values: &[f32]) -> bool {
    // Through a small f16 buffer with `half`'s slice conversions (F16C where the CPU has it).
    let mut buf = [f16::ZERO; 256];
    let mut back = [0.0f32; 256];
    values.chunks(256).all(|chunk| {
        let (h, b) = (&mut buf[..chunk.len()], &mut back[..chunk.len()]);
        h.convert_from_f32_slice(chunk);
        h.convert_to_f32_slice(b);
        chunk.iter().zip(b.iter()).all(|(v, r)| v.to_bits() == r.to_bits() && !v.is_nan())
    })
}

/// `x` rounded to the nearest f16 value (ties to even), returned as f32: what
/// `f16::from_f32(x).to_f32()` gives (IEEE 754 binary16), branch-free so that loops vectorise.
#[inline(always)]
pub(crate) fn round_to_f16(x: f32) -> f32 {
    const MIN_NORMAL: f32 = 6.103_515_6e-5; // 2⁻¹⁴
    let a = x.abs();
    let bits = a.to_bits();
    // Normal f16: keep 10 of the 23 significand bits, rounding half to even.
    let normal = f32::from_bits(bits.wrapping_add(0x0FFF + ((bits >> 13) & 1)) & !0x1FFF);
    // Subnormal f16 has spacing 2⁻²⁴, which is f32's spacing at 0.5: adding and removing 0.5
    // rounds to that grid, half to even.
    let subnormal = (a + 0.5) - 0.5;
    let r = if a < MIN_NORMAL { subnormal } else { normal };
    let r = if r > 65504.0 { f32::INFINITY } else { r };
    let r = if a.is_nan() { a } else { r };
    r.copysign(x)
}

/// `x[i] ← x[i] + y[i]`, rounded to f16 when `f16`: what adding two tensors of the compute dtype
/// stores (an f32 sum of two f16 values rounded to f16 is their correctly rounded f16 sum, since
/// f32 carries more than twice f16's precision).
pub(crate) fn add_rounded(x: &mut [f32], y: &[f32], f16: bool) {
    for (xv, &yv) in x.iter_mut().zip(y) {
        *xv += yv;
    }
    if f16 {
        round_f16(x);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_rounding_matches_the_half_crate() {
        let specials = [0.0, -0.0, 1.0, 65504.0, 65519.99, 65520.0, 1e9, 5.96e-8, 2.98e-8, 2.99e-8, 6.1e-5, 6.104e-5];
        let strided = (0..u32::MAX / 4099).map(|i| f32::from_bits(i * 4099));
        for x in
            specials.into_iter().flat_map(|x: f32| [x, -x]).chain(strided).chain([f32::INFINITY, f32::NEG_INFINITY])
        {
            let want = f16::from_f32(x).to_f32();
            let got = round_to_f16(x);
            assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "{x:e}: {got:e} vs {want:e}");
        }
    }
}
