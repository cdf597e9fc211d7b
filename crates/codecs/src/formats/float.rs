//! `fp16` and `bf16`: each weight rounded to a 16-bit float (the [`Float`] format).
//!
//! Spec: IEEE 754-2019 binary16 (1 sign, 5 exponent, 10 fraction bits) and bfloat16 (the top
//! 16 bits of binary32: 1 sign, 8 exponent, 7 fraction bits), both with round-to-nearest,
//! ties-to-even, subnormals kept, overflow to infinity (IEEE 754-2019 §4.3.1, §7.4). The `half`
//! crate's `f16::from_f32` / `bf16::from_f32` implement exactly that rounding; conversion back
//! to f32 is exact. Values already representable in the target format are unchanged, so the
//! codec is idempotent.

use half::{bf16, f16};
use qdrift_ggml::RowStorage;

use crate::error::QuantizeError;
use crate::format::Format;
use crate::packed::{Packed, PackedDtype, PackedPart};
use crate::scheme::Scheme;

/// The format of `fp16` and `bf16`.
pub(crate) struct Float;

impl Format for Float {
    fn owns(&self, scheme: &Scheme) -> bool {
        matches!(scheme, Scheme::Fp16 | Scheme::Bf16)
    }

    fn listed(&self) -> Vec<Scheme> {
        vec![Scheme::Fp16, Scheme::Bf16]
    }

    fn name(&self, scheme: &Scheme) -> String {
        (if *scheme == Scheme::Fp16 { "fp16" } else { "bf16" }).to_owned()
    }

    fn describe(&self, scheme: &Scheme) -> &'static str {
        if *scheme == Scheme::Fp16 {
            "IEEE half precision, each weight rounded to nearest even (16 bits/weight)."
        } else {
            "bfloat16, each weight rounded to nearest even (16 bits/weight)."
        }
    }

    fn storage_bytes(&self, _scheme: &Scheme, rows: u64, cols: u64) -> u64 {
        HalfPacked::storage_bytes_for(rows, cols)
    }

    fn quantize(
        &self,
        scheme: &Scheme,
        weights: &[f32],
        _rows: usize,
        _cols: usize,
    ) -> Result<Box<dyn Packed>, QuantizeError> {
        let half = if *scheme == Scheme::Fp16 { Half::F16 } else { Half::BF16 };
        Ok(Box::new(HalfPacked::quantize(half, weights)))
    }

    /// `fp16` is GGUF's F16.
    fn gguf_storable(&self, scheme: &Scheme) -> bool {
        *scheme == Scheme::Fp16
    }
}

/// Which 16-bit float.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Half {
    F16,
    BF16,
}

/// Raw 16-bit patterns, row-major.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HalfPacked {
    format: Half,
    bits: Vec<u16>,
}

impl HalfPacked {
    /// # Shapes
    /// - `weights`: `[rows, cols]` row-major (any shape: the codec is element-wise).
    pub(crate) fn quantize(format: Half, weights: &[f32]) -> Self {
        let bits = match format {
            Half::F16 => weights.iter().map(|&w| f16::from_f32(w).to_bits()).collect(),
            Half::BF16 => weights.iter().map(|&w| bf16::from_f32(w).to_bits()).collect(),
        };
        HalfPacked { format, bits }
    }

    /// The values as little-endian bytes.
    fn le_bytes(&self) -> Vec<u8> {
        self.bits.iter().flat_map(|b| b.to_le_bytes()).collect()
    }

    /// Bytes stored for a `[rows, cols]` matrix: two per value.
    pub(crate) fn storage_bytes_for(rows: u64, cols: u64) -> u64 {
        2 * rows * cols
    }
}

impl Packed for HalfPacked {
    fn dequantize(&self, _rows: usize, _cols: usize) -> Vec<f32> {
        match self.format {
            Half::F16 => self.bits.iter().map(|&b| f16::from_bits(b).to_f32()).collect(),
            Half::BF16 => self.bits.iter().map(|&b| bf16::from_bits(b).to_f32()).collect(),
        }
    }

    fn storage_bytes(&self) -> usize {
        2 * self.bits.len()
    }

    fn parts(&self, rows: usize, cols: usize) -> Vec<PackedPart> {
        let dtype = match self.format {
            Half::F16 => PackedDtype::F16,
            Half::BF16 => PackedDtype::BF16,
        };
        vec![PackedPart { name: "values", dtype, shape: vec![rows, cols], bytes: self.le_bytes() }]
    }

    /// binary16 is GGUF's F16 type; bfloat16 is not stored in GGUF here.
    fn stored(&self) -> Option<RowStorage> {
        (self.format == Half::F16).then_some(RowStorage::F16)
    }

    fn gguf_bytes(&self, _rows: usize, _cols: usize) -> Option<Vec<u8>> {
        (self.format == Half::F16).then(|| self.le_bytes())
    }
}

#[cfg(test)]
mod tests {
    use crate::{Scheme, quantize};

    fn roundtrip(scheme: Scheme, w: &[f32]) -> Vec<f32> {
        quantize(&scheme, w, 1, w.len()).expect("finite input").dequantize()
    }

    #[test]
    fn fp16_rounds_to_nearest_even() {
        // Around 1.0 binary16 has a spacing of 2^-10; 1 + 2^-11 is a tie between 1 and
        // 1 + 2^-10 and goes to the even mantissa (1.0); 1 + 3*2^-11 goes up to 1 + 2^-9.
        let w = [1.0 + 2f32.powi(-11), 1.0 + 3.0 * 2f32.powi(-11), 65504.0, 65520.0, 1e-8];
        let got = roundtrip(Scheme::Fp16, &w);
        assert_eq!(got[0], 1.0);
        assert_eq!(got[1], 1.0 + 2f32.powi(-9));
        assert_eq!(got[2], 65504.0);
        // 65520 is the tie between the max normal and 2^16: rounds to even = overflow to inf.
        assert_eq!(got[3], f32::INFINITY);
        // 1e-8 is below half the smallest subnormal (2^-24 ≈ 5.96e-8): flushes to +0.
        assert_eq!(got[4], 0.0);
        // Smallest subnormal survives.
        assert_eq!(roundtrip(Scheme::Fp16, &[2f32.powi(-24)])[0], 2f32.powi(-24));
    }

    #[test]
    fn fp16_is_identity_on_representable_values() {
        let w: Vec<f32> = (0..=0x7bffu16)
            .step_by(7)
            .flat_map(|b| {
                let v = half::f16::from_bits(b).to_f32();
                [v, -v]
            })
            .collect();
        assert_eq!(roundtrip(Scheme::Fp16, &w), w);
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        // bf16 keeps 8 significant bits: spacing 2^-7 at 1.0.
        let w = [1.0 + 2f32.powi(-8), 1.0 + 3.0 * 2f32.powi(-8), -3.0e38];
        let got = roundtrip(Scheme::Bf16, &w);
        assert_eq!(got[0], 1.0);
        assert_eq!(got[1], 1.0 + 2f32.powi(-6));
        // 3e38 = 1.7632 x 2^127 -> mantissa 97.69/128 rounds to 98/128: bits 0xff62.
        assert_eq!(got[2].to_bits(), 0xff62_u32 << 16);
    }
}
