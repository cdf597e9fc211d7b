//! FP4 E2M1, the 4-bit float element of MXFP4 and NVFP4: its 16 values, decoding, and encoding
//! by round to nearest, ties to even.
//!
//! Spec: OCP Microscaling Formats (MX) Specification v1.0 (2023), §5.3.3 "FP4 (E2M1)": 1 sign,
//! 2 exponent bits (bias 1) and 1 mantissa bit; exponent 0 is subnormal (`0.m · 2^0`, so code
//! `0b0001` = 0.5); max normal `S.11.1` = ±6, min normal `S.01.0` = ±1; no infinities and no
//! NaN. §6.3 (conversion to an MX element): round to nearest, ties to even, values past the
//! largest magnitude clamp to it (saturating). The positive codes are `0..=7` =
//! 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign, so `0b1000` is −0.
//!
//! NaN: E2M1 has no NaN, and the spec leaves the conversion of one to the implementation;
//! [`e2m1_encode`] returns `None` for it, so every caller says what it does. ±∞ saturate to ±6.
//! The sign of zero is kept (−0.0 and negatives that round to zero give `0b1000`), as
//! compressed-tensors' `pack_fp4_to_uint8` does (`torch.signbit`); NVIDIA ModelOpt's `_cast_fp4`
//! (`sign = weight < 0`) writes +0 for −0.0, a different code with the same value.
//!
//! Both reference quantizers round exactly so: compressed-tensors
//! `compressors/nvfp4/helpers.py` (`_quantize_and_pack_fp4_kernel`: `x ≤ 0.25 → 0`, `> 0.25 →
//! 0.5`, `≥ 0.75 → 1`, `> 1.25 → 1.5`, `≥ 1.75 → 2`, `> 2.5 → 3`, `≥ 3.5 → 4`, `> 5 → 6`) and
//! ModelOpt `modelopt/torch/quantization/qtensor/nvfp4_tensor.py` (`e2m1_bounds` = 0.25, 0.75,
//! 1.25, 1.75, 2.5, 3.5, 5 with `searchsorted`, ties at the odd bounds moved up).

/// The value of each code `0..16` (bit 3 the sign).
pub const E2M1_VALUES: [f32; 16] =
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

/// ggml's `kvalues_mxfp4` (`ggml/src/ggml-common.h`): the E2M1 values doubled, so they are
/// integers (code 8, −0, is 0); `block_mxfp4` and `block_nvfp4` halve their scales to match.
pub(crate) const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// The largest E2M1 magnitude.
pub const E2M1_MAX: f32 = 6.0;

/// The value of E2M1 code `code` (its low 4 bits; the high bits are ignored).
pub fn e2m1_decode(code: u8) -> f32 {
    E2M1_VALUES[usize::from(code & 0x0F)]
}

/// The E2M1 code nearest `x`, ties to the even code (the one whose mantissa bit is 0), magnitudes
/// past 6 saturating to ±6; the sign of `x` (including −0.0) is the code's bit 3. `None` for NaN
/// (see the module doc).
pub fn e2m1_encode(x: f32) -> Option<u8> {
    if x.is_nan() {
        return None;
    }
    let sign = if x.is_sign_negative() { 0x08 } else { 0 };
    let a = x.abs();
    // The midpoints between neighbouring magnitudes. At a midpoint the even code wins (codes 0,
    // 2, 4 and 6: values 0, 1, 2 and 4), so ties at 0.25, 1.25, 2.5 and 5 round down (`<=`) and
    // ties at 0.75, 1.75 and 3.5 round up (`<`).
    let magnitude = if a <= 0.25 {
        0
    } else if a < 0.75 {
        1
    } else if a <= 1.25 {
        2
    } else if a < 1.75 {
        3
    } else if a <= 2.5 {
        4
    } else if a < 3.5 {
        5
    } else if a <= 5.0 {
        6
    } else {
        7
    };
    Some(sign | magnitude)
}

/// Packs E2M1 codes two per byte as compressed-tensors' `pack_fp4_to_uint8` and ModelOpt store
/// them, row by row: element `2j` of a row in the low nibble, `2j + 1` in the high one; a row of
/// odd length ends in a byte whose high nibble is 0.
///
/// # Shapes
/// - `codes`: `[rows, cols]` (low 4 bits used); returns `[rows, ceil(cols / 2)]`. Empty when
///   `cols` is 0.
pub fn e2m1_pack_rows(codes: &[u8], cols: usize) -> Vec<u8> {
    if cols == 0 {
        return Vec::new();
    }
    codes.chunks(cols).flat_map(|row| row.chunks(2).map(|p| (p[0] & 0x0F) | (p.get(1).map_or(0, |h| h << 4)))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// OCP MX v1.0 §5.3.3, Table "FP4 (E2M1)": every code from its bit fields, computed here
    /// independently of the table above: exponent `e` (bias 1), mantissa `m`; `e = 0` subnormal
    /// `m · 0.5`, else `(1 + m/2) · 2^(e − 1)`.
    #[test]
    fn every_code_matches_the_spec_bit_fields() {
        for code in 0..16u8 {
            let (s, e, m) = (code >> 3, (code >> 1) & 3, code & 1);
            let magnitude =
                if e == 0 { f32::from(m) * 0.5 } else { (1.0 + f32::from(m) / 2.0) * 2f32.powi(i32::from(e) - 1) };
            let want = if s == 1 { -magnitude } else { magnitude };
            let got = e2m1_decode(code);
            assert_eq!(got.to_bits(), want.to_bits(), "code {code:#06b}");
            assert_eq!(e2m1_decode(code | 0xF0).to_bits(), want.to_bits());
            // Every value encodes back to its code.
            assert_eq!(e2m1_encode(got), Some(code), "{got}");
        }
        assert_eq!(e2m1_decode(0b0111), E2M1_MAX);
        assert_eq!(e2m1_decode(0b0010), 1.0, "min normal");
        assert_eq!(e2m1_decode(0b0001), 0.5, "the one subnormal");
        for code in 0..16 {
            assert_eq!(f32::from(KVALUES_MXFP4[code]), 2.0 * E2M1_VALUES[code], "ggml's doubled table");
        }
    }

    #[test]
    fn ties_go_to_the_even_code() {
        for (x, want) in [(0.25, 0.0), (0.75, 1.0), (1.25, 1.0), (1.75, 2.0), (2.5, 2.0), (3.5, 4.0), (5.0, 4.0)] {
            let code = e2m1_encode(x).expect("finite");
            assert_eq!(e2m1_decode(code), want, "{x}");
            assert_eq!(code & 1, 0, "{x}: even code");
            assert_eq!(e2m1_decode(e2m1_encode(-x).expect("finite")), -want, "-{x}");
        }
        // Just off the ties, the nearer value.
        for (x, want) in [(0.2500001f32, 0.5), (0.7499999, 0.5), (1.2500001, 1.5), (4.9999995, 4.0), (5.0000005, 6.0)] {
            assert_eq!(e2m1_decode(e2m1_encode(x).expect("finite")), want, "{x}");
        }
    }

    #[test]
    fn saturates_keeps_signed_zero_and_refuses_nan() {
        for x in [6.0, 7.0, 1e30, f32::MAX, f32::INFINITY] {
            assert_eq!(e2m1_encode(x), Some(0b0111), "{x}");
            assert_eq!(e2m1_encode(-x), Some(0b1111), "-{x}");
        }
        assert_eq!(e2m1_encode(0.0), Some(0));
        assert_eq!(e2m1_encode(-0.0), Some(0b1000));
        assert_eq!(e2m1_encode(-0.1), Some(0b1000));
        assert!(e2m1_decode(0b1000) == 0.0 && e2m1_decode(0b1000).is_sign_negative());
        assert_eq!(e2m1_encode(f32::MIN_POSITIVE / 4.0), Some(0));
        assert_eq!(e2m1_encode(0.3), Some(0b0001), "rounds to the subnormal 0.5");
        assert_eq!(e2m1_encode(f32::NAN), None);
    }

    #[test]
    fn packing_puts_the_even_element_in_the_low_nibble_row_by_row() {
        assert_eq!(e2m1_pack_rows(&[0x1, 0xF, 0x7, 0x8], 4), [0xF1, 0x87]);
        assert_eq!(e2m1_pack_rows(&[0x1, 0xF, 0x7, 0x8, 0x2, 0x3], 3), [0xF1, 0x07, 0x28, 0x03]);
        assert!(e2m1_pack_rows(&[], 0).is_empty());
    }
}
