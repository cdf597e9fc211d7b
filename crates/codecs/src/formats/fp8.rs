//! `fp8-e4m3`, `fp8-e5m2` (and their `-tensor` variants; the [`Fp8`] format): scaled OCP 8-bit
//! floats.
//!
//! Spec: OCP 8-bit Floating Point Specification (OFP8), revision 1.0 (2023), §4 (formats) and
//! §5 (conversion):
//!
//! | | E4M3 | E5M2 |
//! |---|---|---|
//! | exponent bias | 7 | 15 |
//! | infinities | none | `S.11111.00` |
//! | NaN | `S.1111.111` only | `S.11111.{01,10,11}` |
//! | max normal | `S.1111.110` = 448 | `S.11110.11` = 57344 |
//! | min normal | 2^-6 | 2^-14 |
//! | min subnormal | 2^-9 | 2^-16 |
//!
//! [`fp8_encode`] is the OFP8 *saturating* conversion with round-to-nearest, ties-to-even:
//! subnormals are produced, a magnitude that rounds above the max normal (and ±infinity) becomes
//! ±max normal, never NaN or infinity (CUDA's `__NV_SATFINITE`); NaN stays NaN (`0x7F`, the
//! canonical NaN of both formats, with the sign kept); the sign of zero is kept.
//! [`fp8_decode`] is exact. The rounding is done on the exact binary value in f64, so there is
//! no double rounding.
//!
//! Quantizer: `scale = amax / max_normal` in f32, per output channel (row) or once per tensor
//! (`-tensor`); element code `= fp8_encode(w / scale)`; `w' = fp8_decode(code) · scale`. A zero
//! scale (all-zero row) stores code 0 and dequantizes to 0. Storage: one byte per weight + one
//! f32 per row (`8 + 32/cols` bits per weight) or per tensor.

use crate::error::QuantizeError;
use crate::format::Format;
use crate::packed::{Packed, PackedDtype, PackedPart, f32_bytes};
use crate::scheme::{Fp8Format, Scheme};

/// The format of `fp8-e4m3`, `fp8-e5m2` and their `-tensor` forms.
pub(crate) struct Fp8;

impl Format for Fp8 {
    fn owns(&self, scheme: &Scheme) -> bool {
        matches!(scheme, Scheme::Fp8 { .. })
    }

    /// Per channel, then per tensor; E4M3 before E5M2.
    fn listed(&self) -> Vec<Scheme> {
        [false, true]
            .into_iter()
            .flat_map(|per_tensor| [Fp8Format::E4M3, Fp8Format::E5M2].map(|format| Scheme::Fp8 { format, per_tensor }))
            .collect()
    }

    fn name(&self, scheme: &Scheme) -> String {
        let (format, per_tensor) = params(scheme);
        let format = match format {
            Fp8Format::E4M3 => "e4m3",
            Fp8Format::E5M2 => "e5m2",
        };
        format!("fp8-{format}{}", if per_tensor { "-tensor" } else { "" })
    }

    fn describe(&self, scheme: &Scheme) -> &'static str {
        match params(scheme) {
            (Fp8Format::E4M3, false) => "OCP FP8 E4M3 (max 448) with one f32 scale per output channel.",
            (Fp8Format::E5M2, false) => "OCP FP8 E5M2 (max 57344) with one f32 scale per output channel.",
            (Fp8Format::E4M3, true) => "OCP FP8 E4M3 (max 448) with a single f32 scale for the whole tensor.",
            (Fp8Format::E5M2, true) => "OCP FP8 E5M2 (max 57344) with a single f32 scale for the whole tensor.",
        }
    }

    fn storage_bytes(&self, scheme: &Scheme, rows: u64, cols: u64) -> u64 {
        Fp8Packed::storage_bytes_for(rows, cols, params(scheme).1)
    }

    fn quantize(
        &self,
        scheme: &Scheme,
        weights: &[f32],
        rows: usize,
        cols: usize,
    ) -> Result<Box<dyn Packed>, QuantizeError> {
        let (format, per_tensor) = params(scheme);
        Ok(Box::new(Fp8Packed::quantize(weights, rows, cols, format, per_tensor)))
    }
}

/// The parameters of an FP8 scheme (the registry only hands this format its own schemes).
fn params(scheme: &Scheme) -> (Fp8Format, bool) {
    match *scheme {
        Scheme::Fp8 { format, per_tensor } => (format, per_tensor),
        _ => (Fp8Format::E4M3, false),
    }
}

/// Bit layout of one OFP8 format.
struct Layout {
    mantissa_bits: u32,
    bias: i32,
    /// Magnitude code of the max normal (`0x7E` / `0x7B`).
    max_code: u8,
}

fn layout(format: Fp8Format) -> Layout {
    match format {
        Fp8Format::E4M3 => Layout { mantissa_bits: 3, bias: 7, max_code: 0x7E },
        Fp8Format::E5M2 => Layout { mantissa_bits: 2, bias: 15, max_code: 0x7B },
    }
}

/// `2^k` as f64 (exact for the exponents used here).
fn exp2(k: i32) -> f64 {
    f64::from_bits(((k + 1023) as u64) << 52)
}

/// Encodes an f32 to OFP8 with saturating round-to-nearest-even (see the module doc).
pub fn fp8_encode(format: Fp8Format, x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 0x80 } else { 0x00 };
    if x.is_nan() {
        return sign | 0x7F;
    }
    let l = layout(format);
    let a = f64::from(x.abs());
    if a == 0.0 {
        return sign;
    }
    // Every f32 (subnormals included) is a normal f64, so its binary exponent is exact here.
    let exponent = ((a.to_bits() >> 52) & 0x7FF) as i32 - 1023;
    let min_exponent = 1 - l.bias;
    let e = exponent.max(min_exponent);
    // The spacing of the target format in this binade is 2^(e − M); count steps, round to even.
    let steps = (a / exp2(e - l.mantissa_bits as i32)).round_ties_even();
    // Subnormal, normal and "carried into the next binade" all fall out of this one formula:
    // code = (biased exponent − 1) · 2^M + steps. `a` is finite here but may be huge, so the
    // saturation check is done in f64 before converting to an integer.
    let code = f64::from((e - min_exponent) as u32 * (1 << l.mantissa_bits)) + steps;
    if code > f64::from(l.max_code) { sign | l.max_code } else { sign | code as u8 }
}

/// Decodes an OFP8 byte to f32 (exact). NaN codes give NaN; E5M2 `S.11111.00` gives ±infinity.
pub fn fp8_decode(format: Fp8Format, code: u8) -> f32 {
    let l = layout(format);
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let exponent_field = i32::from((code & 0x7F) >> l.mantissa_bits);
    let mantissa = i32::from(code & ((1 << l.mantissa_bits) - 1));
    let magnitude = match format {
        Fp8Format::E4M3 if code & 0x7F == 0x7F => return f32::NAN,
        Fp8Format::E5M2 if exponent_field == 31 => {
            return if mantissa == 0 { sign * f32::INFINITY } else { f32::NAN };
        }
        _ if exponent_field == 0 => f64::from(mantissa) * exp2(1 - l.bias - l.mantissa_bits as i32),
        _ => f64::from((1 << l.mantissa_bits) + mantissa) * exp2(exponent_field - l.bias - l.mantissa_bits as i32),
    };
    sign * magnitude as f32
}

/// Scaled FP8 codes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Fp8Packed {
    format: Fp8Format,
    per_tensor: bool,
    /// `[rows, cols]`.
    codes: Vec<u8>,
    /// `[rows]`, or `[1]` per tensor.
    scales: Vec<f32>,
}

fn scale_for(format: Fp8Format, values: &[f32]) -> f32 {
    values.iter().fold(0.0f32, |m, w| m.max(w.abs())) / format.max_finite()
}

fn encode_scaled(format: Fp8Format, w: f32, scale: f32) -> u8 {
    if scale == 0.0 { 0 } else { fp8_encode(format, w / scale) }
}

impl Fp8Packed {
    /// # Shapes
    /// - `weights`: `[rows, cols]` row-major.
    pub(crate) fn quantize(weights: &[f32], rows: usize, cols: usize, format: Fp8Format, per_tensor: bool) -> Self {
        let scales: Vec<f32> = if per_tensor {
            vec![scale_for(format, weights)]
        } else {
            (0..rows).map(|r| scale_for(format, &weights[r * cols..(r + 1) * cols])).collect()
        };
        let codes = weights
            .iter()
            .enumerate()
            .map(|(i, &w)| encode_scaled(format, w, if per_tensor { scales[0] } else { scales[i / cols] }))
            .collect();
        Fp8Packed { format, per_tensor, codes, scales }
    }

    /// Bytes stored for a `[rows, cols]` matrix: one code per value and an f32 scale per row,
    /// or a single one per tensor.
    pub(crate) fn storage_bytes_for(rows: u64, cols: u64, per_tensor: bool) -> u64 {
        rows * cols + 4 * if per_tensor { 1 } else { rows }
    }
}

impl Packed for Fp8Packed {
    fn dequantize(&self, _rows: usize, cols: usize) -> Vec<f32> {
        self.codes
            .iter()
            .enumerate()
            .map(|(i, &c)| {
                let scale = if self.per_tensor { self.scales[0] } else { self.scales[i / cols] };
                fp8_decode(self.format, c) * scale
            })
            .collect()
    }

    fn storage_bytes(&self) -> usize {
        self.codes.len() + 4 * self.scales.len()
    }

    fn parts(&self, rows: usize, cols: usize) -> Vec<PackedPart> {
        let dtype = match self.format {
            Fp8Format::E4M3 => PackedDtype::F8E4M3,
            Fp8Format::E5M2 => PackedDtype::F8E5M2,
        };
        vec![
            PackedPart { name: "codes", dtype, shape: vec![rows, cols], bytes: self.codes.clone() },
            PackedPart {
                name: "scales",
                dtype: PackedDtype::F32,
                shape: vec![self.scales.len()],
                bytes: f32_bytes(&self.scales),
            },
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::{fp8_decode, fp8_encode};
    use crate::{Fp8Format, Scheme, quantize};

    const E4M3: Fp8Format = Fp8Format::E4M3;
    const E5M2: Fp8Format = Fp8Format::E5M2;

    /// The spec's value of a code, written independently of `fp8_decode`:
    /// (−1)^S · 2^(E − bias) · (1 + M / 2^m) for E > 0, (−1)^S · 2^(1 − bias) · M / 2^m for E = 0.
    fn spec_value(format: Fp8Format, code: u8) -> f64 {
        let (e_bits, m_bits, bias) = match format {
            Fp8Format::E4M3 => (4, 3, 7),
            Fp8Format::E5M2 => (5, 2, 15),
        };
        let s = if code >> 7 == 1 { -1.0 } else { 1.0 };
        let e = i32::from((code >> m_bits) & ((1 << e_bits) - 1));
        let m = f64::from(code & ((1 << m_bits) - 1));
        let frac = m / f64::from(1u32 << m_bits);
        let max_e = (1 << e_bits) - 1;
        match format {
            Fp8Format::E4M3 if e == max_e && m == 7.0 => f64::NAN,
            Fp8Format::E5M2 if e == max_e && m == 0.0 => s * f64::INFINITY,
            Fp8Format::E5M2 if e == max_e => f64::NAN,
            _ if e == 0 => s * 2f64.powi(1 - bias) * frac,
            _ => s * 2f64.powi(e - bias) * (1.0 + frac),
        }
    }

    #[test]
    fn all_256_codes_decode_to_the_spec_value_and_reencode_to_themselves() {
        for format in [E4M3, E5M2] {
            let mut nans = 0;
            for code in 0..=255u8 {
                let want = spec_value(format, code);
                let got = fp8_decode(format, code);
                if want.is_nan() {
                    assert!(got.is_nan(), "{format:?} {code:#04x}");
                    nans += 1;
                    continue;
                }
                assert_eq!(f64::from(got), want, "{format:?} {code:#04x}");
                assert_eq!(got.is_sign_negative(), code & 0x80 != 0, "sign of {code:#04x}");
                if got.is_infinite() {
                    // Saturating conversion: ±inf becomes ±max normal (see module doc).
                    assert_eq!(fp8_encode(format, got), (code & 0x80) | 0x7B);
                } else {
                    assert_eq!(fp8_encode(format, got), code, "{format:?} {code:#04x} = {got}");
                }
            }
            assert_eq!(nans, if format == E4M3 { 2 } else { 6 });
        }
    }

    #[test]
    fn spot_values_from_the_spec_tables() {
        assert_eq!(fp8_decode(E4M3, 0x7E), 448.0);
        assert_eq!(fp8_decode(E4M3, 0x08), 2f32.powi(-6));
        assert_eq!(fp8_decode(E4M3, 0x01), 2f32.powi(-9));
        assert_eq!(fp8_decode(E4M3, 0x38), 1.0);
        assert_eq!(fp8_decode(E4M3, 0x80).to_bits(), (-0.0f32).to_bits());
        assert_eq!(fp8_decode(E5M2, 0x7B), 57344.0);
        assert_eq!(fp8_decode(E5M2, 0x04), 2f32.powi(-14));
        assert_eq!(fp8_decode(E5M2, 0x01), 2f32.powi(-16));
        assert_eq!(fp8_decode(E5M2, 0x3C), 1.0);
        assert_eq!(fp8_decode(E5M2, 0xFC), f32::NEG_INFINITY);
    }

    #[test]
    fn ties_round_to_even() {
        // E4M3 around 1: spacing 1/8. 1 + 1/16 is a tie between 0x38 (even) and 0x39.
        assert_eq!(fp8_encode(E4M3, 1.0625), 0x38);
        // 1 + 3/16 ties between 0x39 and 0x3A (even).
        assert_eq!(fp8_encode(E4M3, 1.1875), 0x3A);
        // E5M2 around 1: spacing 1/4. 1.125 -> 1.0 (0x3C), 1.375 -> 1.5 (0x3E).
        assert_eq!(fp8_encode(E5M2, 1.125), 0x3C);
        assert_eq!(fp8_encode(E5M2, 1.375), 0x3E);
        // Just above a tie rounds up.
        assert_eq!(fp8_encode(E4M3, f32::from_bits(1.0625f32.to_bits() + 1)), 0x39);
    }

    #[test]
    fn subnormals() {
        let s = 2f32.powi(-9); // E4M3 min subnormal
        assert_eq!(fp8_encode(E4M3, s), 0x01);
        assert_eq!(fp8_encode(E4M3, 7.0 * s), 0x07); // max subnormal
        assert_eq!(fp8_encode(E4M3, 0.5 * s), 0x00); // tie with 0 -> even (0)
        assert_eq!(fp8_encode(E4M3, 1.5 * s), 0x02); // tie 1 vs 2 -> 2
        assert_eq!(fp8_encode(E4M3, 2.5 * s), 0x02); // tie 2 vs 3 -> 2
        assert_eq!(fp8_encode(E4M3, -0.6 * s), 0x81);
        assert_eq!(fp8_encode(E4M3, 7.5 * s), 0x08); // rounds up into the min normal
        assert_eq!(fp8_encode(E4M3, -1e-30), 0x80); // underflow keeps the sign
        let s = 2f32.powi(-16); // E5M2 min subnormal
        assert_eq!(fp8_encode(E5M2, 3.0 * s), 0x03);
        assert_eq!(fp8_encode(E5M2, 1.5 * s), 0x02);
        assert_eq!(fp8_decode(E5M2, 0x03), 3.0 * s);
    }

    #[test]
    fn large_values_saturate_to_max_not_nan_or_inf() {
        assert_eq!(fp8_encode(E4M3, 448.0), 0x7E);
        assert_eq!(fp8_encode(E4M3, 464.0), 0x7E); // tie 448 / 480 -> even (448)
        assert_eq!(fp8_encode(E4M3, 470.0), 0x7E); // would round to 480: saturates
        assert_eq!(fp8_encode(E4M3, -1e9), 0xFE);
        assert_eq!(fp8_encode(E4M3, f32::INFINITY), 0x7E);
        assert_eq!(fp8_encode(E4M3, f32::MAX), 0x7E);
        assert_eq!(fp8_encode(E5M2, 61440.0), 0x7B); // tie 57344 / 65536 -> saturates
        assert_eq!(fp8_encode(E5M2, 1e30), 0x7B);
        assert_eq!(fp8_encode(E5M2, f32::NEG_INFINITY), 0xFB);
        assert_eq!(fp8_encode(E5M2, f32::NAN) & 0x7F, 0x7F);
    }

    #[test]
    fn per_channel_and_per_tensor_scales() {
        // Row 0 amax 448 -> scale 1; row 1 amax 4.48 -> scale 0.01; per tensor: scale 1.
        let w = [448.0, -1.0625, 0.5, 4.48, 2.0, 0.0];
        let q = quantize(&Scheme::Fp8 { format: E4M3, per_tensor: false }, &w, 2, 3).expect("valid");
        let d = q.dequantize();
        assert_eq!(&d[..3], &[448.0, -1.0, 0.5]);
        assert_eq!(q.storage_bytes(), 6 + 8);
        let t = quantize(&Scheme::Fp8 { format: E4M3, per_tensor: true }, &w, 2, 3).expect("valid");
        assert_eq!(t.storage_bytes(), 6 + 4);
        // 4.48 -> 4.5 on the E4M3 grid (spacing 0.5 in [4, 8)).
        assert_eq!(t.dequantize(), [448.0, -1.0, 0.5, 4.5, 2.0, 0.0]);
        // An all-zero row dequantizes to zeros.
        let z = quantize(&Scheme::Fp8 { format: E5M2, per_tensor: false }, &[0.0; 4], 2, 2).expect("valid");
        assert_eq!(z.dequantize(), [0.0; 4]);
    }
}
