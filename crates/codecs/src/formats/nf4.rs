//! `nf4-g64` (the [`Nf4`] format): QLoRA 4-bit NormalFloat.
//!
//! Spec: Dettmers et al. 2023, "QLoRA: Efficient Finetuning of Quantized LLMs" (NeurIPS), §3
//! "4-bit NormalFloat Quantization"; the reference implementation is bitsandbytes
//! (`bitsandbytes/functional.py` `get_4bit_type("nf4")` for the 16 values, `csrc/kernels.cu`
//! `dQuantizeNF4` / `dDequantizeNF4` / `kQuantizeBlockwise` for the arithmetic). Per block of 64
//! consecutive inputs of a row:
//!
//! - `absmax = max |w|`, stored as f32;
//! - the normalized value is `w * (1 / absmax)` (bitsandbytes multiplies by the reciprocal);
//! - the code is the nearest of the 16 [`NF4_CODE`] values, found with bitsandbytes' own f32
//!   midpoint thresholds and strict `>` comparisons: **a value exactly on a midpoint takes the
//!   lower code**;
//! - `w' = NF4_CODE[code] * absmax` in f32.
//!
//! Packing follows bitsandbytes: two codes per byte, the **first** element of each pair in the
//! **high** nibble. Each row is packed on its own into `ceil(cols / 2)` bytes (an odd row ends in
//! a zero low nibble) and, when `cols` is not a multiple of 64, the last block of a row is
//! shorter; with `cols` a multiple of 64 this is byte-identical to bitsandbytes' flat blocking.
//! An all-zero block stores absmax 0 and code 7 (the exact 0.0) and dequantizes to 0 (bitsandbytes
//! would compute `0 * inf`). Cost: `4 + 32/64 = 4.5` bits per weight.

use crate::error::QuantizeError;
use crate::format::Format;
use crate::packed::{Packed, PackedDtype, PackedPart, f32_bytes, groups};
use crate::scheme::Scheme;

/// The format of `nf4-gB` (listed: `nf4-g64`, QLoRA's block).
pub(crate) struct Nf4;

/// The block size of an NF4 scheme (the registry only hands this format its own schemes).
fn block(scheme: &Scheme) -> usize {
    match *scheme {
        Scheme::Nf4 { block } => block,
        _ => 64,
    }
}

impl Format for Nf4 {
    fn owns(&self, scheme: &Scheme) -> bool {
        matches!(scheme, Scheme::Nf4 { .. })
    }

    fn listed(&self) -> Vec<Scheme> {
        vec![Scheme::Nf4 { block: 64 }]
    }

    fn name(&self, scheme: &Scheme) -> String {
        format!("nf4-g{}", block(scheme))
    }

    fn describe(&self, _scheme: &Scheme) -> &'static str {
        "QLoRA NormalFloat4: 16 normal-quantile levels scaled by an f32 absmax per block of 64 (4.5 bits/weight)."
    }

    fn check_usable(&self, scheme: &Scheme) -> Result<(), QuantizeError> {
        if block(scheme) == 0 { Err(QuantizeError::ZeroGroup { scheme: scheme.to_string() }) } else { Ok(()) }
    }

    fn storage_bytes(&self, scheme: &Scheme, rows: u64, cols: u64) -> u64 {
        Nf4Packed::storage_bytes_for(rows, cols, block(scheme) as u64)
    }

    fn quantize(
        &self,
        scheme: &Scheme,
        weights: &[f32],
        rows: usize,
        cols: usize,
    ) -> Result<Box<dyn Packed>, QuantizeError> {
        Ok(Box::new(Nf4Packed::quantize(weights, rows, cols, block(scheme))))
    }
}

/// The 16 NF4 values, exactly as in bitsandbytes (`get_4bit_type("nf4")`, `nf4_data`).
// The digits are bitsandbytes' verbatim (f64 prints of the f32 values), kept for grep-ability.
#[allow(clippy::excessive_precision)]
pub const NF4_CODE: [f32; 16] = [
    -1.0,
    -0.6961928009986877,
    -0.5250730514526367,
    -0.39491748809814453,
    -0.28444138169288635,
    -0.18477343022823334,
    -0.09105003625154495,
    0.0,
    0.07958029955625534,
    0.16093020141124725,
    0.24611230194568634,
    0.33791524171829224,
    0.44070982933044434,
    0.5626170039176941,
    0.7229568362236023,
    1.0,
];

/// Decision thresholds of bitsandbytes' `dQuantizeNF4`, in code order: `THRESHOLDS[i]` separates
/// code `i` from code `i + 1`.
#[allow(clippy::excessive_precision)] // verbatim from bitsandbytes
const THRESHOLDS: [f32; 15] = [
    -0.8480964004993439,
    -0.6106329262256622,
    -0.4599952697753906,
    -0.33967943489551544,
    -0.23460740596055984,
    -0.13791173323988914,
    -0.045525018125772476,
    0.03979014977812767,
    0.1202552504837513,
    0.2035212516784668,
    0.2920137718319893,
    0.3893125355243683,
    0.5016634166240692,
    0.6427869200706482,
    0.8614784181118011,
];

/// Nearest NF4 code of a normalized value; ties (exactly on a threshold) go to the lower code.
/// Equivalent to bitsandbytes' binary decision tree, which tests the same thresholds with `>`.
fn nearest_code(x: f32) -> u8 {
    THRESHOLDS.iter().filter(|&&t| x > t).count() as u8
}

/// NF4 codes and per-block absmax.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Nf4Packed {
    block: usize,
    /// `[rows, ceil(cols / 2)]`, first element of a pair in the high nibble.
    codes: Vec<u8>,
    /// `[rows, ceil(cols / block)]`.
    absmax: Vec<f32>,
}

impl Nf4Packed {
    /// # Shapes
    /// - `weights`: `[rows, cols]` row-major; blocks of `block` run along each row.
    pub(crate) fn quantize(weights: &[f32], rows: usize, cols: usize, block: usize) -> Self {
        let row_bytes = cols.div_ceil(2);
        let mut codes = vec![0u8; rows * row_bytes];
        let mut absmax = Vec::with_capacity(rows * cols.div_ceil(block));
        for r in 0..rows {
            let row = &weights[r * cols..(r + 1) * cols];
            let row_codes = &mut codes[r * row_bytes..(r + 1) * row_bytes];
            for (start, end) in groups(cols, block) {
                let amax = row[start..end].iter().fold(0.0f32, |m, w| m.max(w.abs()));
                absmax.push(amax);
                let inverse = if amax == 0.0 { 0.0 } else { 1.0 / amax };
                for (i, &w) in row[start..end].iter().enumerate() {
                    let code = nearest_code(w * inverse);
                    let index = start + i;
                    row_codes[index / 2] |= code << if index % 2 == 0 { 4 } else { 0 };
                }
            }
        }
        Nf4Packed { block, codes, absmax }
    }

    /// Bytes stored for a `[rows, cols]` matrix: per row, `⌈cols/2⌉` code bytes and an f32
    /// absmax per block.
    pub(crate) fn storage_bytes_for(rows: u64, cols: u64, block: u64) -> u64 {
        rows * (cols.div_ceil(2) + 4 * cols.div_ceil(block))
    }
}

impl Packed for Nf4Packed {
    fn dequantize(&self, rows: usize, cols: usize) -> Vec<f32> {
        let row_bytes = cols.div_ceil(2);
        let n_blocks = cols.div_ceil(self.block);
        let mut out = Vec::with_capacity(rows * cols);
        for r in 0..rows {
            let row_codes = &self.codes[r * row_bytes..(r + 1) * row_bytes];
            for (b, (start, end)) in groups(cols, self.block).enumerate() {
                let amax = self.absmax[r * n_blocks + b];
                out.extend((start..end).map(|i| {
                    let byte = row_codes[i / 2];
                    let code = if i % 2 == 0 { byte >> 4 } else { byte & 0x0F };
                    NF4_CODE[usize::from(code)] * amax
                }));
            }
        }
        out
    }

    fn storage_bytes(&self) -> usize {
        self.codes.len() + 4 * self.absmax.len()
    }

    fn parts(&self, rows: usize, cols: usize) -> Vec<PackedPart> {
        vec![
            PackedPart {
                name: "codes",
                dtype: PackedDtype::U8,
                shape: vec![rows, cols.div_ceil(2)],
                bytes: self.codes.clone(),
            },
            PackedPart {
                name: "scales",
                dtype: PackedDtype::F32,
                shape: vec![rows, cols.div_ceil(self.block)],
                bytes: f32_bytes(&self.absmax),
            },
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::{NF4_CODE, THRESHOLDS, nearest_code};
    use crate::{Scheme, quantize};

    #[test]
    fn thresholds_are_the_midpoints_of_the_code() {
        for (i, &t) in THRESHOLDS.iter().enumerate() {
            let mid = (f64::from(NF4_CODE[i]) + f64::from(NF4_CODE[i + 1])) / 2.0;
            assert!((f64::from(t) - mid).abs() < 1e-7, "threshold {i}");
        }
    }

    #[test]
    fn every_code_value_maps_to_itself() {
        for (i, &v) in NF4_CODE.iter().enumerate() {
            assert_eq!(usize::from(nearest_code(v)), i);
        }
    }

    #[test]
    fn hand_vector_with_tie_and_zero_block() {
        // Block of 4 with absmax 1 (reciprocal exactly 1): 1 -> 15, -1 -> 0, 0 -> 7, and the
        // threshold between codes 7 and 8 itself -> 7 (ties go down). Second block: absmax 2,
        // 1.2 / 2 = 0.6 lies between thresholds 12 and 13 -> code 13; -0.6 / 2 = -0.3 -> code 4.
        // Third (short) block is all zero -> code 7, absmax 0.
        let w = [1.0, -1.0, 0.0, THRESHOLDS[7], 2.0, 1.2, -0.6, -2.0, 0.0, 0.0];
        let q = quantize(&Scheme::Nf4 { block: 4 }, &w, 1, 10).expect("valid");
        let parts = q.parts();
        // High nibble first: (15, 0) (7, 7) (15, 13) (4, 0) (7, 7).
        assert_eq!(parts[0].bytes, [0xF0, 0x77, 0xFD, 0x40, 0x77]);
        let absmax: Vec<u8> = [1.0f32, 2.0, 0.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(parts[1].bytes, absmax);
        assert_eq!(q.dequantize(), [1.0, -1.0, 0.0, 0.0, 2.0, NF4_CODE[13] * 2.0, NF4_CODE[4] * 2.0, -2.0, 0.0, 0.0]);
    }

    #[test]
    fn bits_per_weight_is_4_5() {
        let q = quantize(&Scheme::Nf4 { block: 64 }, &[0.5; 2 * 128], 2, 128).expect("valid");
        assert_eq!(q.bits_per_weight(), 4.5);
    }
}
