//! Decoding of the two OCP 8-bit floating point formats that safetensors stores as `F8_E4M3`
//! and `F8_E5M2`, for FP8 checkpoints (`hf/quant/`).
//!
//! Spec: OCP 8-bit Floating Point Specification (OFP8), revision 1.0 (2023), §4:
//!
//! | | E4M3 | E5M2 |
//! |---|---|---|
//! | exponent bias | 7 | 15 |
//! | infinities | none | `S.11111.00` |
//! | NaN | `S.1111.111` only | `S.11111.{01,10,11}` |
//! | max normal | `S.1111.110` = 448 | `S.11110.11` = 57344 |
//! | min subnormal | 2^-9 | 2^-16 |
//!
//! Decoding is exact (every OFP8 value is an f32). `qdrift-quantize`'s `fp8_decode` is the same
//! definition on the quantizer's side; load cannot depend on quantize, so the quantize crate's
//! tests check the two agree on all 256 codes of both formats, and this module's tests check
//! hand-computed codes from the spec's tables and that `qdrift-ggml`'s `e4m3_decode` (NVFP4's
//! block scales) agrees on every E4M3 code.

/// One of the two OFP8 formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ofp8 {
    /// 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities.
    E4M3,
    /// 1 sign, 5 exponent (bias 15), 2 mantissa bits; IEEE-like infinities and NaNs.
    E5M2,
}

impl Ofp8 {
    /// The exact value of `code`: NaN codes give NaN, E5M2 `S.11111.00` gives ±infinity.
    pub fn decode(self, code: u8) -> f32 {
        let (mantissa_bits, bias) = match self {
            Ofp8::E4M3 => (3u32, 7i32),
            Ofp8::E5M2 => (2, 15),
        };
        let negative = code & 0x80 != 0;
        let exponent = i32::from((code & 0x7F) >> mantissa_bits);
        let mantissa = i32::from(code & ((1 << mantissa_bits) - 1));
        let magnitude = match self {
            Ofp8::E4M3 if code & 0x7F == 0x7F => return f32::NAN,
            Ofp8::E5M2 if exponent == 31 => {
                if mantissa != 0 {
                    return f32::NAN;
                }
                f32::INFINITY
            }
            // Subnormal: m · 2^(1 − bias − M); normal: (2^M + m) · 2^(e − bias − M). Both are
            // small integers times a power of two, exact in f32.
            _ if exponent == 0 => mantissa as f32 * pow2(1 - bias - mantissa_bits as i32),
            _ => ((1 << mantissa_bits) + mantissa) as f32 * pow2(exponent - bias - mantissa_bits as i32),
        };
        if negative { -magnitude } else { magnitude }
    }
}

/// `2^k` for the exponents OFP8 needs (−18 ≤ k ≤ 15), exact.
fn pow2(k: i32) -> f32 {
    f32::from_bits(((k + 127) as u32) << 23)
}

#[cfg(test)]
mod tests {
    use super::Ofp8::{E4M3, E5M2};

    #[test]
    fn spec_table_values() {
        // E4M3: max normal 0x7E = 448, min normal 0x08 = 2^-6, min subnormal 0x01 = 2^-9,
        // 1.0 = 0x38, -2.0 = 0xC0, NaN 0x7F/0xFF, -0 = 0x80.
        assert_eq!(E4M3.decode(0x7E), 448.0);
        assert_eq!(E4M3.decode(0x08), 2f32.powi(-6));
        assert_eq!(E4M3.decode(0x01), 2f32.powi(-9));
        assert_eq!(E4M3.decode(0x07), 7.0 * 2f32.powi(-9));
        assert_eq!(E4M3.decode(0x38), 1.0);
        assert_eq!(E4M3.decode(0xC0), -2.0);
        assert!(E4M3.decode(0x7F).is_nan() && E4M3.decode(0xFF).is_nan());
        assert!(E4M3.decode(0x80) == 0.0 && E4M3.decode(0x80).is_sign_negative());
        // E5M2: max normal 0x7B = 57344, min subnormal 0x01 = 2^-16, 1.0 = 0x3C, inf 0x7C.
        assert_eq!(E5M2.decode(0x7B), 57344.0);
        assert_eq!(E5M2.decode(0x01), 2f32.powi(-16));
        assert_eq!(E5M2.decode(0x04), 2f32.powi(-14));
        assert_eq!(E5M2.decode(0x3C), 1.0);
        assert_eq!(E5M2.decode(0xFC), f32::NEG_INFINITY);
        assert!(E5M2.decode(0x7D).is_nan() && E5M2.decode(0xFF).is_nan());
    }

    #[test]
    fn e4m3_agrees_with_qdrift_ggml_on_every_code() {
        // `qdrift-ggml`'s NVFP4 scale decoding is the same OFP8 E4M3 (its `nvfp4_tensor.rs`).
        for c in 0..=255u8 {
            let (a, b) = (E4M3.decode(c), qdrift_ggml::e4m3_decode(c));
            assert!(a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()), "code {c:#04x}: {a} vs {b}");
        }
    }

    #[test]
    fn e5m2_is_the_top_byte_of_an_f16() {
        // E5M2 shares binary16's exponent: code c is the f16 with bits c << 8.
        for c in 0..=255u8 {
            let want = half::f16::from_bits(u16::from(c) << 8).to_f32();
            let got = E5M2.decode(c);
            assert!(got == want || (got.is_nan() && want.is_nan()), "code {c:#04x}: {got} vs {want}");
        }
    }
}
