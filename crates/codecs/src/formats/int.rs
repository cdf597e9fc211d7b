//! `int8` and `int4-gG[-asym]` (the [`Int`] format): uniform integer grids with a scale (and
//! zero point).
//!
//! Spec: the affine quantization of Jacob et al. 2018, "Quantization and Training of Neural
//! Networks for Efficient Integer-Arithmetic-Only Inference" (CVPR), eq. 1: `w ≈ S (q − Z)`;
//! grouped along the input dimension as in GPTQ (Frantar et al. 2023, §"Additional details")
//! and AWQ. All arithmetic is f32; `rne` is round-half-to-even ([`f32::round_ties_even`]).
//!
//! - `int8`: per output channel (row), symmetric. `S = amax / 127` stored as f32,
//!   `q = clamp(rne(w / S), −127, 127)`, `w' = q · S`. Storage `i8` codes + one f32 per row:
//!   `8 + 32/cols` bits per weight.
//! - `int4-gG`: per group of `G` consecutive inputs of a row, symmetric.
//!   `S = f16(amax / 7)`; the quantizer divides by that FP16-rounded scale (converted back to
//!   f32), so dequantization uses exactly the scale quantization used:
//!   `q = clamp(rne(w / S), −8, 7)`, `w' = q · S`.
//! - `int4-gG-asym`: the range is first widened to contain zero, `lo = min(min w, 0)`,
//!   `hi = max(max w, 0)` (as GPTQ's quantizer does, so that 0 is exact and a group that does
//!   not straddle zero cannot saturate); `S = f16((hi − lo) / 15)`,
//!   `Z = clamp(rne(−lo / S), 0, 15)`, `q = clamp(rne(w / S) + Z, 0, 15)`, `w' = (q − Z) · S`.
//!
//! A group whose scale is 0 (all zeros, or an FP16 scale that underflows) stores `q = Z = 0` and
//! dequantizes to 0 without dividing by zero. A scale that overflows FP16 is an error. When `cols`
//! is not a multiple of `G` the last group of each row is shorter and follows the same rule.
//!
//! Packing (int4): each row is packed on its own into `ceil(cols / 2)` bytes; element `2k` of
//! the row goes in the **low** nibble of byte `k`, element `2k + 1` in the **high** nibble, and
//! an odd row ends with a zero high nibble. Symmetric codes are 4-bit two's complement
//! (`−8 = 0x8`, `−1 = 0xF`); asymmetric codes are the unsigned `q`. Scales are FP16, one per
//! group, `[rows, groups]`. Asymmetric zero points are 4-bit and packed like the codes, per row:
//! `[rows, ceil(groups / 2)]` bytes. Hence `int4-g128` costs `4 + 16/128 = 4.125` bits per
//! weight and `int4-g128-asym` `4 + 20/128 = 4.15625` when a row holds an even number of groups.

use half::f16;

use crate::error::QuantizeError;
use crate::format::Format;
use crate::packed::{AffineCodes, Packed, PackedDtype, PackedPart, f32_bytes, groups};
use crate::scheme::Scheme;

/// The format of `int8` and `int4-gG[-asym]`.
pub(crate) struct Int;

impl Format for Int {
    fn owns(&self, scheme: &Scheme) -> bool {
        matches!(scheme, Scheme::Int8 | Scheme::Int4 { .. })
    }

    /// `int8`, then `int4` symmetric and asymmetric with groups of 32, 64 and 128.
    fn listed(&self) -> Vec<Scheme> {
        let mut listed = vec![Scheme::Int8];
        for asym in [false, true] {
            for group in [32, 64, 128] {
                listed.push(Scheme::Int4 { group, asym });
            }
        }
        listed
    }

    fn name(&self, scheme: &Scheme) -> String {
        match *scheme {
            Scheme::Int4 { group, asym } => format!("int4-g{group}{}", if asym { "-asym" } else { "" }),
            _ => "int8".to_owned(),
        }
    }

    fn describe(&self, scheme: &Scheme) -> &'static str {
        match scheme {
            Scheme::Int4 { asym: false, .. } => {
                "Symmetric 4-bit integers in [-8, 7] with one FP16 scale = absmax/7 per group of a row."
            }
            Scheme::Int4 { asym: true, .. } => {
                "Asymmetric 4-bit integers in [0, 15] with an FP16 scale and a 4-bit zero point per group of a row."
            }
            _ => "Symmetric int8 per output channel, scale = absmax/127 in f32 (8 + 32/cols bits/weight).",
        }
    }

    fn check_usable(&self, scheme: &Scheme) -> Result<(), QuantizeError> {
        match scheme {
            Scheme::Int4 { group: 0, .. } => Err(QuantizeError::ZeroGroup { scheme: scheme.to_string() }),
            _ => Ok(()),
        }
    }

    fn storage_bytes(&self, scheme: &Scheme, rows: u64, cols: u64) -> u64 {
        match *scheme {
            Scheme::Int4 { group, asym } => Int4Packed::storage_bytes_for(rows, cols, group as u64, asym),
            _ => Int8Packed::storage_bytes_for(rows, cols),
        }
    }

    fn quantize(
        &self,
        scheme: &Scheme,
        weights: &[f32],
        rows: usize,
        cols: usize,
    ) -> Result<Box<dyn Packed>, QuantizeError> {
        Ok(match *scheme {
            Scheme::Int4 { group, asym } => Box::new(Int4Packed::quantize(weights, rows, cols, group, asym)?),
            _ => Box::new(Int8Packed::quantize(weights, rows, cols)),
        })
    }
}

/// Symmetric per-row int8.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Int8Packed {
    /// `[rows, cols]`.
    codes: Vec<i8>,
    /// `[rows]`.
    scales: Vec<f32>,
}

impl Int8Packed {
    /// # Shapes
    /// - `weights`: `[rows, cols]` row-major.
    pub(crate) fn quantize(weights: &[f32], rows: usize, cols: usize) -> Self {
        let mut codes = Vec::with_capacity(weights.len());
        let mut scales = Vec::with_capacity(rows);
        for r in 0..rows {
            let row = &weights[r * cols..(r + 1) * cols];
            let amax = row.iter().fold(0.0f32, |m, w| m.max(w.abs()));
            let scale = amax / 127.0;
            scales.push(scale);
            codes.extend(
                row.iter().map(
                    |&w| {
                        if scale == 0.0 { 0 } else { (w / scale).round_ties_even().clamp(-127.0, 127.0) as i8 }
                    },
                ),
            );
        }
        Int8Packed { codes, scales }
    }

    /// Bytes stored for a `[rows, cols]` matrix: one code per value and an f32 scale per row.
    pub(crate) fn storage_bytes_for(rows: u64, cols: u64) -> u64 {
        rows * cols + 4 * rows
    }
}

impl Packed for Int8Packed {
    fn dequantize(&self, _rows: usize, cols: usize) -> Vec<f32> {
        self.codes
            .chunks_exact(cols.max(1))
            .zip(&self.scales)
            .flat_map(|(row, &scale)| row.iter().map(move |&q| f32::from(q) * scale))
            .collect()
    }

    fn storage_bytes(&self) -> usize {
        self.codes.len() + 4 * self.scales.len()
    }

    fn parts(&self, rows: usize, cols: usize) -> Vec<PackedPart> {
        vec![
            PackedPart {
                name: "codes",
                dtype: PackedDtype::I8,
                shape: vec![rows, cols],
                bytes: self.codes.iter().map(|&q| q as u8).collect(),
            },
            PackedPart { name: "scales", dtype: PackedDtype::F32, shape: vec![rows], bytes: f32_bytes(&self.scales) },
        ]
    }

    /// Codes `q + 128`, zero point 128, one group per row.
    fn affine(&self, rows: usize, cols: usize) -> Option<AffineCodes> {
        Some(AffineCodes {
            codes: self.codes.iter().map(|&q| i32::from(q) + 128).collect(),
            zeros: vec![128; rows],
            scales: self.scales.clone(),
            group: cols,
        })
    }
}

/// Grouped int4, symmetric or asymmetric.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Int4Packed {
    group: usize,
    asym: bool,
    /// `[rows, ceil(cols / 2)]`, two codes per byte (low nibble first).
    codes: Vec<u8>,
    /// `[rows, groups]`.
    scales: Vec<f16>,
    /// `[rows, ceil(groups / 2)]` packed 4-bit zero points; empty when symmetric.
    zeros: Vec<u8>,
}

/// Sets nibble `index` of a packed row (low nibble first).
fn put_nibble(bytes: &mut [u8], index: usize, value: u8) {
    bytes[index / 2] |= (value & 0x0F) << (4 * (index % 2));
}

/// Reads nibble `index` of a packed row (low nibble first).
fn nibble(bytes: &[u8], index: usize) -> u8 {
    (bytes[index / 2] >> (4 * (index % 2))) & 0x0F
}

impl Int4Packed {
    /// # Shapes
    /// - `weights`: `[rows, cols]` row-major; groups of `group` run along each row.
    pub(crate) fn quantize(
        weights: &[f32],
        rows: usize,
        cols: usize,
        group: usize,
        asym: bool,
    ) -> Result<Self, QuantizeError> {
        let row_bytes = cols.div_ceil(2);
        let n_groups = cols.div_ceil(group);
        let zero_bytes = if asym { n_groups.div_ceil(2) } else { 0 };
        let mut codes = vec![0u8; rows * row_bytes];
        let mut zeros = vec![0u8; rows * zero_bytes];
        let mut scales = Vec::with_capacity(rows * n_groups);

        for r in 0..rows {
            let row = &weights[r * cols..(r + 1) * cols];
            let row_codes = &mut codes[r * row_bytes..(r + 1) * row_bytes];
            let row_zeros = &mut zeros[r * zero_bytes..(r + 1) * zero_bytes];
            for (g, (start, end)) in groups(cols, group).enumerate() {
                let values = &row[start..end];
                let (scale32, lo) = if asym {
                    let lo = values.iter().fold(0.0f32, |m, &w| m.min(w));
                    let hi = values.iter().fold(0.0f32, |m, &w| m.max(w));
                    ((hi - lo) / 15.0, lo)
                } else {
                    (values.iter().fold(0.0f32, |m, w| m.max(w.abs())) / 7.0, 0.0)
                };
                let scale16 = f16::from_f32(scale32);
                if scale16.is_infinite() {
                    return Err(QuantizeError::ScaleOverflow {
                        scheme: Scheme::Int4 { group, asym }.to_string(),
                        row: r,
                        group: g,
                        scale: scale32,
                    });
                }
                scales.push(scale16);
                let scale = scale16.to_f32();
                if scale == 0.0 {
                    continue; // codes and zero point stay 0: the group dequantizes to 0.
                }
                if asym {
                    let zero = (-lo / scale).round_ties_even().clamp(0.0, 15.0);
                    put_nibble(row_zeros, g, zero as u8);
                    for (i, &w) in values.iter().enumerate() {
                        let q = ((w / scale).round_ties_even() + zero).clamp(0.0, 15.0);
                        put_nibble(row_codes, start + i, q as u8);
                    }
                } else {
                    for (i, &w) in values.iter().enumerate() {
                        let q = (w / scale).round_ties_even().clamp(-8.0, 7.0) as i8;
                        put_nibble(row_codes, start + i, q as u8);
                    }
                }
            }
        }
        Ok(Int4Packed { group, asym, codes, scales, zeros })
    }

    /// Bytes stored for a `[rows, cols]` matrix (see the module docs for the packing): per row,
    /// `⌈cols/2⌉` code bytes, an FP16 scale per group and, asymmetric, `⌈groups/2⌉` zero-point
    /// bytes.
    pub(crate) fn storage_bytes_for(rows: u64, cols: u64, group: u64, asym: bool) -> u64 {
        let groups = cols.div_ceil(group);
        let zero_bytes = if asym { groups.div_ceil(2) } else { 0 };
        rows * (cols.div_ceil(2) + 2 * groups + zero_bytes)
    }
}

impl Packed for Int4Packed {
    fn dequantize(&self, rows: usize, cols: usize) -> Vec<f32> {
        let row_bytes = cols.div_ceil(2);
        let n_groups = cols.div_ceil(self.group);
        let zero_bytes = n_groups.div_ceil(2);
        let mut out = Vec::with_capacity(rows * cols);
        for r in 0..rows {
            let row_codes = &self.codes[r * row_bytes..(r + 1) * row_bytes];
            for (g, (start, end)) in groups(cols, self.group).enumerate() {
                let scale = self.scales[r * n_groups + g].to_f32();
                let zero =
                    if self.asym { i32::from(nibble(&self.zeros[r * zero_bytes..(r + 1) * zero_bytes], g)) } else { 0 };
                out.extend((start..end).map(|i| {
                    let raw = nibble(row_codes, i);
                    let q = if self.asym {
                        i32::from(raw)
                    } else {
                        // Sign-extend the 4-bit two's complement code.
                        i32::from(((raw << 4) as i8) >> 4)
                    };
                    (q - zero) as f32 * scale
                }));
            }
        }
        out
    }

    fn storage_bytes(&self) -> usize {
        self.codes.len() + 2 * self.scales.len() + self.zeros.len()
    }

    fn parts(&self, rows: usize, cols: usize) -> Vec<PackedPart> {
        let n_groups = cols.div_ceil(self.group);
        let mut parts = vec![
            PackedPart {
                name: "codes",
                dtype: PackedDtype::U8,
                shape: vec![rows, cols.div_ceil(2)],
                bytes: self.codes.clone(),
            },
            PackedPart {
                name: "scales",
                dtype: PackedDtype::F16,
                shape: vec![rows, n_groups],
                bytes: self.scales.iter().flat_map(|s| s.to_le_bytes()).collect(),
            },
        ];
        if self.asym {
            parts.push(PackedPart {
                name: "zeros",
                dtype: PackedDtype::U8,
                shape: vec![rows, n_groups.div_ceil(2)],
                bytes: self.zeros.clone(),
            });
        }
        parts
    }

    /// Symmetric: codes `q + 8`, zero point 8; asymmetric: the stored nibbles.
    fn affine(&self, rows: usize, cols: usize) -> Option<AffineCodes> {
        let n_groups = cols.div_ceil(self.group);
        let (row_bytes, zero_bytes) = (cols.div_ceil(2), n_groups.div_ceil(2));
        let codes = (0..rows * cols)
            .map(|k| {
                let raw = nibble(&self.codes[(k / cols) * row_bytes..], k % cols);
                if self.asym { i32::from(raw) } else { i32::from(((raw << 4) as i8) >> 4) + 8 }
            })
            .collect();
        let zeros = (0..rows * n_groups)
            .map(|k| {
                if self.asym { i32::from(nibble(&self.zeros[(k / n_groups) * zero_bytes..], k % n_groups)) } else { 8 }
            })
            .collect();
        let scales = self.scales.iter().map(|s| s.to_f32()).collect();
        Some(AffineCodes { codes, zeros, scales, group: self.group })
    }
}

#[cfg(test)]
mod tests {
    use crate::{QuantizeError, Scheme, quantize};

    fn part(q: &crate::QuantizedMatrix, name: &str) -> Vec<u8> {
        q.parts().into_iter().find(|p| p.name == name).map(|p| p.bytes).unwrap_or_default()
    }

    #[test]
    fn int8_hand_vector_with_ties_and_zero_row() {
        // Row 0: amax 127 -> scale exactly 1.0; -63.5 ties to even -64, 0.5 -> 0, 1.5 -> 2,
        // 2.5 -> 2. Row 1 is all zero: scale 0, codes 0, dequantizes to 0.
        let w = [127.0, -63.5, 0.5, 1.5, 2.5, -127.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        let q = quantize(&Scheme::Int8, &w, 2, 6).expect("valid");
        assert_eq!(part(&q, "codes"), [127u8, (-64i8) as u8, 0, 2, 2, (-127i8) as u8, 0, 0, 0, 0, 0, 0]);
        assert_eq!(part(&q, "scales"), [1.0f32.to_le_bytes(), 0.0f32.to_le_bytes()].concat());
        assert_eq!(q.dequantize(), [127.0, -64.0, 0.0, 2.0, 2.0, -127.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        assert_eq!(q.storage_bytes(), 12 + 8);
    }

    #[test]
    fn int4_sym_hand_vector_with_short_last_group() {
        // Groups of 4 over 10 columns: [7, 3.5, -2.5, 0.5] amax 7 -> scale 1 -> 7, 4, -2, 0
        // (ties to even); [14, -1, 3, 5] amax 14 -> scale 2 -> 7, -0 (−0.5 ties to 0), 2 (1.5),
        // 2 (2.5); the short group [0, 0] has scale 0.
        let w = [7.0, 3.5, -2.5, 0.5, 14.0, -1.0, 3.0, 5.0, 0.0, 0.0];
        let q = quantize(&Scheme::Int4 { group: 4, asym: false }, &w, 1, 10).expect("valid");
        // Nibbles low-first, two's complement: (7,4) 0x47, (-2,0) 0x0E, (7,0) 0x07, (2,2) 0x22, (0,0).
        assert_eq!(part(&q, "codes"), [0x47, 0x0E, 0x07, 0x22, 0x00]);
        // FP16 1.0 = 0x3C00, 2.0 = 0x4000, 0.0.
        assert_eq!(part(&q, "scales"), [0x00, 0x3C, 0x00, 0x40, 0x00, 0x00]);
        assert_eq!(q.dequantize(), [7.0, 4.0, -2.0, 0.0, 14.0, 0.0, 4.0, 4.0, 0.0, 0.0]);
    }

    #[test]
    fn int4_sym_saturates_when_the_fp16_scale_underflows() {
        // amax = 9.8·2^-24 -> amax/7 = 1.4·2^-24 rounds to the smallest FP16 subnormal 2^-24,
        // so ±amax / scale = ±9.8 which saturates to 7 and -8.
        let t = 2f32.powi(-24);
        let w = [9.8 * t, -9.8 * t, 3.0 * t, 0.0];
        let q = quantize(&Scheme::Int4 { group: 4, asym: false }, &w, 1, 4).expect("valid");
        assert_eq!(q.dequantize(), [7.0 * t, -8.0 * t, 3.0 * t, 0.0]);
    }

    #[test]
    fn int4_asym_hand_vectors() {
        // [-1, 0, 2, 14]: lo -1, hi 14 -> scale 1, zero 1 -> q 0, 1, 3, 15, exact.
        // [0.5, 1.5, 2.5, 15]: lo widened to 0 -> scale 1, zero 0 -> q 0 (0.5 ties to 0), 2, 2, 15.
        // [5, 5] (short last group): lo 0, hi 5 -> scale f16(1/3) = 0x3555 = 0.33325195,
        //   zero 0, q = rne(15.0037) = 15 -> 15 × 0.33325195 = 4.9987793.
        let w = [-1.0, 0.0, 2.0, 14.0, 0.5, 1.5, 2.5, 15.0, 5.0, 5.0];
        let q = quantize(&Scheme::Int4 { group: 4, asym: true }, &w, 1, 10).expect("valid");
        assert_eq!(part(&q, "codes"), [0x10, 0xF3, 0x20, 0xF2, 0xFF]);
        assert_eq!(part(&q, "scales"), [0x00, 0x3C, 0x00, 0x3C, 0x55, 0x35]);
        // Zero points 1, 0, 0 packed low nibble first, per row: [0x01, 0x00].
        assert_eq!(part(&q, "zeros"), [0x01, 0x00]);
        let third = half::f16::from_bits(0x3555).to_f32();
        assert_eq!(q.dequantize(), [-1.0, 0.0, 2.0, 14.0, 0.0, 2.0, 2.0, 15.0, 15.0 * third, 15.0 * third]);
    }

    #[test]
    fn int4_all_zero_group_is_zero_not_nan() {
        for asym in [false, true] {
            let q = quantize(&Scheme::Int4 { group: 32, asym }, &[0.0; 64], 2, 32).expect("valid");
            assert!(q.dequantize().iter().all(|&v| v == 0.0));
        }
    }

    #[test]
    fn int4_scale_overflow_is_an_error() {
        let w = [1.0e6, 0.0];
        let err = quantize(&Scheme::Int4 { group: 2, asym: false }, &w, 1, 2).unwrap_err();
        assert!(matches!(err, QuantizeError::ScaleOverflow { row: 0, group: 0, .. }));
    }
}
