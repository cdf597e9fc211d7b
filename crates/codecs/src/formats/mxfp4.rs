//! `mxfp4-ocp` and `mxfp4-ct` (the [`Mxfp4`] format): OCP MXFP4 with the two scale rules
//! of the checkpoint world, beside `mxfp4` (`formats/ggml.rs`), which is llama.cpp's.
//!
//! Spec: OCP Microscaling Formats (MX) v1.0: §5.3.3 (E2M1 elements, `qdrift_ggml::e2m1`), §5.4
//! (the E8M0 shared scale, `2^(e − 127)`, 255 the NaN) and §6.3 (conversion of a block of 32).
//! A block's element is `e2m1(clamp(w / X, −6, 6))`, rounded to nearest with ties to even
//! (saturating), and `w' = e2m1(q) · X`, in f32. The three MXFP4 schemes differ only in the
//! choice of `X` for a block of absolute maximum `amax`, and in the rounding of ties:
//!
//! | scheme | `X` | ties | who makes it |
//! |---|---|---|---|
//! | `mxfp4` | `2^(floor(log2 amax) − 2)` | to the smaller magnitude at 0.75, 1.75 and 3.5 | llama.cpp (`quantize_row_mxfp4_ref`) |
//! | `mxfp4-ocp` | `2^(floor(log2 amax) − 2)` | to even | the OCP spec §6.3; torchao `to_mx` (`ScaleCalculationMode.FLOOR`, its default) |
//! | `mxfp4-ct` | `2^(floor(log2 round(amax)) − 2)` | to even | compressed-tensors / llm-compressor (`mxfp4-pack-quantized`, what vLLM loads); torchao `EVEN` |
//!
//! `round(amax)` is compressed-tensors' `round_to_power_2` (0.20.1,
//! `quantization/utils/mxfp_utils.py`, after vLLM's `tests/quantization/reference_mxfp4.py`):
//! add `2^21` to the f32 bits and keep sign and exponent, so an `amax` of at least 1.75 times a
//! power of two rounds up to the next one. The OCP rule maps the block maximum into `[4, 8)` and
//! saturates what lies above 6; compressed-tensors' maps it into `[3.5, 7)`, with less
//! saturation and a coarser grid for blocks just under a power of two. The ggml rule's ties
//! (`best_index_mxfp4` takes the first nearest entry of `kvalues_mxfp4`) differ from even
//! rounding at three of the seven midpoints, and its `floorf(log2f(amax))` rounds up to the next
//! power of two for an `amax` a few ulps below one (`log2f` of it rounds to the integer).
//!
//! The exponent is exact: `floor(log2 a)` is the f32 exponent field of `a` minus 127, so the E8M0
//! code is that field minus 2, clamped at 0 (2^-127: every block with `amax < 2^-125`, and an
//! all-zero block, as both references give). The largest code is 253 (`amax` near f32's max;
//! compressed-tensors would compute 255, the E8M0 NaN, for `amax ≥ 1.75 · 2^127`, which no weight
//! reaches).
//!
//! A row that is not whole blocks of 32 ends in a shorter block scaled by its own values (the
//! references refuse such rows). Storage: compressed-tensors' `weight_packed` (two codes per
//! byte, the even element in the low nibble; an odd row ends in a half-used byte) and
//! `weight_scale` (U8 E8M0 codes), 4.25 bits per weight.

use qdrift_ggml::{e2m1_decode, e2m1_encode, e2m1_pack_rows};

use crate::error::QuantizeError;
use crate::format::Format;
use crate::packed::{Packed, PackedDtype, PackedPart};
use crate::scheme::{Mxfp4Rule, Scheme};

/// Weights per E8M0 scale.
const BLOCK: usize = 32;

/// The format of `mxfp4-ocp` and `mxfp4-ct`.
pub(crate) struct Mxfp4;

/// The rule of an MXFP4 scheme (the registry only hands this format its own schemes).
fn rule(scheme: &Scheme) -> Mxfp4Rule {
    match *scheme {
        Scheme::Mxfp4 { rule } => rule,
        _ => Mxfp4Rule::Ocp,
    }
}

impl Format for Mxfp4 {
    fn owns(&self, scheme: &Scheme) -> bool {
        matches!(scheme, Scheme::Mxfp4 { .. })
    }

    fn listed(&self) -> Vec<Scheme> {
        [Mxfp4Rule::Ocp, Mxfp4Rule::CompressedTensors].map(|rule| Scheme::Mxfp4 { rule }).to_vec()
    }

    fn name(&self, scheme: &Scheme) -> String {
        match rule(scheme) {
            Mxfp4Rule::Ocp => "mxfp4-ocp",
            Mxfp4Rule::CompressedTensors => "mxfp4-ct",
        }
        .to_owned()
    }

    fn describe(&self, scheme: &Scheme) -> &'static str {
        match rule(scheme) {
            Mxfp4Rule::Ocp => {
                "OCP MXFP4 by the spec's rule: E2M1 values (ties to even) with an E8M0 scale 2^(floor(log2 amax) − 2) per block of 32 (4.25 bits/weight)."
            }
            Mxfp4Rule::CompressedTensors => {
                "OCP MXFP4 as compressed-tensors writes it for vLLM: the block amax rounded up to a power of two from 1.75 times one before the E8M0 scale, per block of 32 (4.25 bits/weight)."
            }
        }
    }

    fn storage_bytes(&self, _scheme: &Scheme, rows: u64, cols: u64) -> u64 {
        rows * (cols.div_ceil(2) + cols.div_ceil(BLOCK as u64))
    }

    fn quantize(
        &self,
        scheme: &Scheme,
        weights: &[f32],
        rows: usize,
        cols: usize,
    ) -> Result<Box<dyn Packed>, QuantizeError> {
        Ok(Box::new(Mxfp4Packed::quantize(rule(scheme), weights, rows, cols)))
    }
}

/// The E8M0 code of a block whose largest magnitude is `amax` (see the module doc).
pub(crate) fn scale_code(rule: Mxfp4Rule, amax: f32) -> u8 {
    let a = match rule {
        Mxfp4Rule::Ocp => amax,
        // `round_to_power_2`: add half of the E2M1-mantissa step below the f32 exponent, keep
        // sign and exponent.
        Mxfp4Rule::CompressedTensors => f32::from_bits((amax.to_bits() + (1 << 21)) & 0xFF80_0000),
    };
    let field = (a.to_bits() >> 23) & 0xFF;
    // A NaN or infinite `a` (field 255) cannot come from finite weights but one rounded up from
    // f32's largest binade: 253 keeps the scale finite.
    (field.min(255) as u8).saturating_sub(2)
}

/// `2^(code − 127)` in f32 (exact; code 0 is the subnormal 2^-127; 255 is not made here).
pub(crate) fn scale_value(code: u8) -> f32 {
    if code == 0 { f32::from_bits(0x0040_0000) } else { f32::from_bits(u32::from(code) << 23) }
}

/// E2M1 codes and E8M0 scale codes of a matrix.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Mxfp4Packed {
    /// `[rows, cols]` E2M1 codes, one per byte.
    codes: Vec<u8>,
    /// `[rows, ceil(cols / 32)]` E8M0 codes.
    scales: Vec<u8>,
    /// Columns (for the packed rows).
    cols: usize,
}

impl Mxfp4Packed {
    /// # Shapes
    /// - `weights`: `[rows, cols]` row-major, finite.
    fn quantize(rule: Mxfp4Rule, weights: &[f32], rows: usize, cols: usize) -> Self {
        let mut codes = Vec::with_capacity(weights.len());
        let mut scales = Vec::with_capacity(rows * cols.div_ceil(BLOCK));
        if cols > 0 {
            for block in weights.chunks_exact(cols).flat_map(|row| row.chunks(BLOCK)) {
                let amax = block.iter().fold(0.0f32, |m, w| m.max(w.abs()));
                let code = scale_code(rule, amax);
                let x = scale_value(code);
                scales.push(code);
                // Finite weights give a finite quotient or ±∞, which saturates to ±6.
                // compressed-tensors' `cast_to_fp4` multiplies by `torch.sign(x)`, +0 for −0.0:
                // a −0.0 weight gives +0 there (`+ 0.0`); torchao keeps the sign bit.
                let zero = if rule == Mxfp4Rule::CompressedTensors { 0.0 } else { -0.0 };
                codes.extend(block.iter().map(|&w| e2m1_encode(w / x + zero).unwrap_or(0)));
            }
        }
        Mxfp4Packed { codes, scales, cols }
    }
}

impl Packed for Mxfp4Packed {
    fn dequantize(&self, _rows: usize, cols: usize) -> Vec<f32> {
        if cols == 0 {
            return Vec::new();
        }
        self.codes
            .chunks_exact(cols)
            .flat_map(|row| row.chunks(BLOCK))
            .zip(&self.scales)
            .flat_map(|(block, &s)| {
                let x = scale_value(s);
                block.iter().map(move |&q| e2m1_decode(q) * x)
            })
            .collect()
    }

    fn storage_bytes(&self) -> usize {
        let rows = self.codes.len().checked_div(self.cols).unwrap_or(0);
        rows * self.cols.div_ceil(2) + self.scales.len()
    }

    fn parts(&self, rows: usize, cols: usize) -> Vec<PackedPart> {
        let packed = e2m1_pack_rows(&self.codes, cols);
        vec![
            PackedPart {
                name: "weight_packed",
                dtype: PackedDtype::U8,
                shape: vec![rows, cols.div_ceil(2)],
                bytes: packed,
            },
            PackedPart {
                name: "weight_scale",
                dtype: PackedDtype::U8,
                shape: vec![rows, cols.div_ceil(BLOCK)],
                bytes: self.scales.clone(),
            },
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::{scale_code, scale_value};
    use crate::{GgmlType, Mxfp4Rule, Scheme, quantize};

    const OCP: Mxfp4Rule = Mxfp4Rule::Ocp;
    const CT: Mxfp4Rule = Mxfp4Rule::CompressedTensors;

    #[test]
    fn scale_rules_from_the_spec_and_compressed_tensors() {
        // OCP: 2^(floor(log2 amax) − 2). amax 6 → 2^0 (code 127); 7.5 → 2^0; 8 → 2^1.
        assert_eq!(scale_code(OCP, 6.0), 127);
        assert_eq!(scale_code(OCP, 7.5), 127);
        assert_eq!(scale_code(OCP, 8.0), 128);
        assert_eq!(scale_code(OCP, 4.0), 127);
        assert_eq!(scale_code(OCP, 3.99), 126);
        // compressed-tensors: amax ≥ 1.75 · 2^k counts as 2^(k+1).
        assert_eq!(scale_code(CT, 6.0), 127, "6 = 1.5 · 4 stays");
        assert_eq!(scale_code(CT, 7.0), 128, "7 = 1.75 · 4 rounds up");
        assert_eq!(scale_code(CT, 6.99), 127);
        assert_eq!(scale_code(CT, 7.5), 128);
        // Zero and tiny blocks: code 0 (2^-127) under both; the largest f32 stays finite.
        for rule in [OCP, CT] {
            assert_eq!(scale_code(rule, 0.0), 0);
            assert_eq!(scale_code(rule, 2f32.powi(-126)), 0);
            assert_eq!(scale_code(rule, f32::MIN_POSITIVE / 8.0), 0);
            assert!(scale_code(rule, f32::MAX) <= 253);
        }
        assert_eq!(scale_code(OCP, 2f32.powi(-124)), 1);
        for code in 0..=254u8 {
            assert_eq!(f64::from(scale_value(code)), 2f64.powi(i32::from(code) - 127), "code {code}");
        }
    }

    #[test]
    fn the_three_mxfp4_schemes_part_where_the_module_doc_says() {
        // A block of amax 6 (X = 1 under every rule) holding the E2M1 ties 0.75, 1.75, 3.5:
        // even rounding takes 1, 2, 4; ggml's first-nearest entry takes 0.5, 1.5, 3.
        let mut w = [0.0f32; 32];
        w[..4].copy_from_slice(&[6.0, 0.75, 1.75, 3.5]);
        let ocp = quantize(&Scheme::Mxfp4 { rule: OCP }, &w, 1, 32).expect("finite").dequantize();
        let ct = quantize(&Scheme::Mxfp4 { rule: CT }, &w, 1, 32).expect("finite").dequantize();
        let ggml = quantize(&Scheme::Ggml(GgmlType::Mxfp4), &w, 1, 32).expect("finite").dequantize();
        assert_eq!(&ocp[..4], &[6.0, 1.0, 2.0, 4.0]);
        assert_eq!(ct, ocp);
        assert_eq!(&ggml[..4], &[6.0, 0.5, 1.5, 3.0]);
        // amax 7.5: OCP and ggml saturate it to 6 (X = 1); compressed-tensors takes X = 2.
        w[0] = 7.5;
        let ocp = quantize(&Scheme::Mxfp4 { rule: OCP }, &w, 1, 32).expect("finite").dequantize();
        let ct = quantize(&Scheme::Mxfp4 { rule: CT }, &w, 1, 32).expect("finite").dequantize();
        assert_eq!(ocp[0], 6.0);
        assert_eq!(&ct[..4], &[8.0, 1.0, 2.0, 4.0]);
        // An amax just below 8: its f32 log2 rounds to 3, so ggml's `floorf(log2f(amax))` takes
        // X = 2 where the exact floor gives X = 1 (OCP saturates it to 6).
        w[0] = 8f32.next_down();
        let ocp = quantize(&Scheme::Mxfp4 { rule: OCP }, &w, 1, 32).expect("finite").dequantize();
        let ggml = quantize(&Scheme::Ggml(GgmlType::Mxfp4), &w, 1, 32).expect("finite").dequantize();
        assert_eq!((ocp[0], ggml[0]), (6.0, 8.0));
    }

    #[test]
    fn storage_and_parts() {
        let w: Vec<f32> = (0..3 * 70).map(|k| (k as f32 - 100.0) / 37.0).collect();
        let q = quantize(&Scheme::Mxfp4 { rule: CT }, &w, 3, 70).expect("finite");
        // 70 columns: 35 bytes of codes and 3 scales (32, 32, 6) per row.
        assert_eq!(q.storage_bytes(), 3 * (35 + 3));
        assert_eq!(Scheme::Mxfp4 { rule: CT }.storage_bytes(3, 70), Ok(3 * 38));
        let parts = q.parts();
        assert_eq!(parts[0].shape, [3, 35]);
        assert_eq!(parts[1].shape, [3, 3]);
        let big = quantize(&Scheme::Mxfp4 { rule: OCP }, &vec![0.5; 64 * 128], 64, 128).expect("finite");
        assert_eq!(big.bits_per_weight(), 4.25);
        assert_eq!(big.dequantize(), vec![0.5; 64 * 128]);
    }
}
