//! `nvfp4` (the [`Nvfp4`] format): NVIDIA's NVFP4 weights as compressed-tensors stores them for
//! vLLM, `nvfp4-pack-quantized`: one FP4 E2M1 code per weight, one FP8 E4M3 scale per 16
//! consecutive weights of a row (along the input dimension), one f32 global scale per tensor.
//!
//! Spec: the E2M1 element is OCP Microscaling Formats (MX) v1.0 §5.3.3 (`qdrift_ggml::e2m1`);
//! E4M3 is OCP OFP8 v1.0; the block and global scales follow compressed-tensors 0.20.1
//! (`quantization/utils/helpers.py` `generate_gparam` and `calculate_qparams`,
//! `quantization/lifecycle/forward.py` `fake_quantize`, the `tensor_group` strategy with
//! `group_size: 16` of preset `NVFP4A16`, stored by `compressors/nvfp4/`):
//!
//! - global scale `g = (448 · 6) / amax(W)` (1 when that is not finite: an all-zero tensor);
//! - block scale `s = e4m3(g · (amax_b / 6))` (clamped to ±448, rounded to nearest even; a scale
//!   that rounds to 0 becomes 0.125, compressed-tensors' E4M3 "eps");
//! - code `q = e2m1(clamp(w / (s / g), −6, 6))` (round to nearest, ties to even), and the
//!   weight `w' = e2m1(q) · (s / g)`, all in f32.
//!
//! **Direction of the global scale.** compressed-tensors stores `weight_global_scale = g =
//! 448·6/amax` and **divides** the block scale by it (`s / g`); NVIDIA ModelOpt stores
//! `weight_scale_2 = amax/(6·448)` and **multiplies** (`s · s2`). The two are reciprocal, and
//! their block scales and codes agree (`qdrift_ggml::nvfp4_tensor`, tested against both
//! libraries); this scheme stores compressed-tensors' `g` ([`qdrift_ggml::GlobalScale::Divide`]).
//! The arithmetic is `qdrift_ggml::nvfp4_quantize` (the codec the checkpoint readers share).
//!
//! A row that is not whole groups of 16 ends in a shorter group scaled by its own values
//! (compressed-tensors refuses such rows; qdrift's export then refuses the matrix). Storage: 4
//! bits per weight, a byte per 16 weights and 4 bytes per tensor, 4.5 bits per weight; the parts
//! are compressed-tensors' tensors, `weight_packed` (two codes per byte, the even element in
//! the low nibble, `pack_fp4_to_uint8`; an odd row ends in a half-used byte),
//! `weight_scale` (F8_E4M3) and `weight_global_scale` (F32 `[1]`).

use qdrift_ggml::{GlobalScale, NVFP4_GROUP, Nvfp4Matrix, Nvfp4Tool, e2m1_pack_rows, nvfp4_dequantize, nvfp4_quantize};

use crate::error::QuantizeError;
use crate::format::Format;
use crate::packed::{Packed, PackedDtype, PackedPart, f32_bytes};
use crate::scheme::Scheme;

/// The format of `nvfp4`.
pub(crate) struct Nvfp4;

impl Format for Nvfp4 {
    fn owns(&self, scheme: &Scheme) -> bool {
        matches!(scheme, Scheme::Nvfp4)
    }

    fn listed(&self) -> Vec<Scheme> {
        vec![Scheme::Nvfp4]
    }

    fn name(&self, _scheme: &Scheme) -> String {
        "nvfp4".to_owned()
    }

    fn describe(&self, _scheme: &Scheme) -> &'static str {
        "NVFP4 as compressed-tensors writes it for vLLM: E2M1 values with an FP8 E4M3 scale per block of 16 and an f32 scale per tensor, amax/(6·448) (4.5 bits/weight)."
    }

    fn storage_bytes(&self, _scheme: &Scheme, rows: u64, cols: u64) -> u64 {
        Nvfp4Packed::storage_bytes_for(rows, cols)
    }

    fn quantize(
        &self,
        _scheme: &Scheme,
        weights: &[f32],
        rows: usize,
        cols: usize,
    ) -> Result<Box<dyn Packed>, QuantizeError> {
        Ok(Box::new(Nvfp4Packed::quantize(weights, rows, cols)))
    }
}

/// A matrix in NVFP4: E2M1 codes `[rows, cols]` (one per byte here, packed two per byte in
/// [`Packed::parts`]), E4M3 scale codes `[rows, ceil(cols / 16)]` and the global scale.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Nvfp4Packed {
    m: Nvfp4Matrix,
    /// Columns of the matrix (for the packed rows).
    cols: usize,
}

impl Nvfp4Packed {
    /// # Shapes
    /// - `weights`: `[rows, cols]` row-major, finite.
    fn quantize(weights: &[f32], rows: usize, cols: usize) -> Self {
        let empty = Nvfp4Matrix { codes: Vec::new(), scales: Vec::new(), global: GlobalScale::Divide(1.0) };
        // `None` only for `cols == 0` (the matrix is then empty): `weights` is `rows * cols`.
        let m = if rows * cols == 0 {
            empty
        } else {
            nvfp4_quantize(Nvfp4Tool::CompressedTensors, weights, cols).unwrap_or(empty)
        };
        Nvfp4Packed { m, cols }
    }

    /// Bytes stored for a `[rows, cols]` matrix: packed codes (a half-used byte ending an odd
    /// row), one E4M3 byte per group of 16 (or fewer) in a row, and the f32 global scale.
    fn storage_bytes_for(rows: u64, cols: u64) -> u64 {
        rows * (cols.div_ceil(2) + cols.div_ceil(NVFP4_GROUP as u64)) + 4
    }

    /// The global scale as compressed-tensors stores it (`weight_global_scale`).
    fn global(&self) -> f32 {
        self.m.global.stored()
    }
}

impl Packed for Nvfp4Packed {
    fn dequantize(&self, rows: usize, cols: usize) -> Vec<f32> {
        if rows * cols == 0 {
            return Vec::new();
        }
        nvfp4_dequantize(&self.m.codes, &self.m.scales, self.m.global, cols)
            .expect("codes and scales built by `quantize` for rows * cols")
    }

    fn storage_bytes(&self) -> usize {
        let rows = self.m.codes.len().checked_div(self.cols).unwrap_or(0);
        rows * self.cols.div_ceil(2) + self.m.scales.len() + 4
    }

    fn parts(&self, rows: usize, cols: usize) -> Vec<PackedPart> {
        let packed = e2m1_pack_rows(&self.m.codes, cols);
        vec![
            PackedPart {
                name: "weight_packed",
                dtype: PackedDtype::U8,
                shape: vec![rows, cols.div_ceil(2)],
                bytes: packed,
            },
            PackedPart {
                name: "weight_scale",
                dtype: PackedDtype::F8E4M3,
                shape: vec![rows, cols.div_ceil(NVFP4_GROUP)],
                bytes: self.m.scales.clone(),
            },
            PackedPart {
                name: "weight_global_scale",
                dtype: PackedDtype::F32,
                shape: vec![1],
                bytes: f32_bytes(&[self.global()]),
            },
        ]
    }
}

#[cfg(test)]
mod tests {
    use crate::{Scheme, quantize};

    #[test]
    fn a_hand_computed_matrix() {
        // Tensor amax 3 → g = 2688 / 3 = 896. Block 0 (0.75 × 15, then −0.4): scale
        // e4m3(896 · 0.125) = 112, d = 0.125; −0.4 / 0.125 = −3.2 → −3 → −0.375. Block 1 holds 3:
        // scale 448, d = 0.5; 1.3 / 0.5 = 2.6 → 3 → 1.5; 0.5 / 0.5 = 1 (exact).
        let mut w = vec![0.0f32; 32];
        w[..15].fill(0.75);
        w[15] = -0.4;
        (w[16], w[17], w[18]) = (3.0, 1.3, 0.5);
        let q = quantize(&Scheme::Nvfp4, &w, 1, 32).expect("finite");
        let d = q.dequantize();
        assert_eq!(&d[..16], &[[0.75; 15].as_slice(), &[-0.375]].concat()[..]);
        assert_eq!(&d[16..19], &[3.0, 1.5, 0.5]);
        assert_eq!(q.storage_bytes(), 16 + 2 + 4);
        assert_eq!(q.bits_per_weight(), (22.0 * 8.0) / 32.0);
        let parts = q.parts();
        let names: Vec<&str> = parts.iter().map(|p| p.name).collect();
        assert_eq!(names, ["weight_packed", "weight_scale", "weight_global_scale"]);
        assert_eq!(parts[1].bytes, [0x6E, 0x7E], "E4M3 112 and 448");
        assert_eq!(parts[2].bytes, 896f32.to_le_bytes());
        // 0.75 / 0.125 = 6: code 7 in both nibbles; −3 is code 0b1101 in the high nibble.
        assert_eq!(parts[0].bytes[0], 0x77);
        assert_eq!(parts[0].bytes[7], 0xD7);
    }

    #[test]
    fn bits_per_weight_is_four_and_a_half_plus_the_global_scale() {
        let w: Vec<f32> = (0..64 * 128).map(|k| ((k * 7919 % 1000) as f32 - 500.0) / 1000.0).collect();
        let q = quantize(&Scheme::Nvfp4, &w, 64, 128).expect("finite");
        assert_eq!(q.storage_bytes(), 64 * 64 + 64 * 8 + 4);
        assert_eq!(Scheme::Nvfp4.storage_bytes(64, 128), Ok(q.storage_bytes() as u64));
        assert!((q.bits_per_weight() - 4.5).abs() < 1e-2);
    }
}
