//! Host definitions of the run-time roundings of a [`crate::Recipe`]: dynamic activation
//! quantization and KV-cache quantization, as quantize→dequantize on f32 values.
//!
//! These are the definitions the device implementations (`qdrift-model`'s `fake_quant.rs`) are
//! tested against, and what the CPU host-attention cache runs. Every step is an f32 operation
//! in a fixed order:
//! - **int8** (activations per token or per tensor; KV per token per head): `s = amax/127`,
//!   `q = clamp(RNE(x/s), −127, 127)`, `x' = q·s` (SmoothQuant's / vLLM's symmetric dynamic int8,
//!   with the division the issue specifies rather than vLLM's multiplication by `127/amax`; they
//!   differ only within an ulp of a rounding boundary). An all-zero group stays zero.
//! - **FP8** (OCP OFP8 rev 1.0, the project's saturating round-to-nearest-even codec
//!   [`crate::fp8_encode`]): `s = amax/max_finite` (448 for E4M3, 57344 for E5M2),
//!   `x' = decode(encode(x/s))·s`, as vLLM's `scaled_fp8_quant` (dynamic scale, saturating
//!   cast). The KV formats without `-head` use `s = 1`, vLLM's default `kv_cache_dtype=fp8`.
//! - **Per token and group** (activations `-gG`, block-FP8 checkpoints): each token's row is cut
//!   into groups of `G` consecutive inputs, and each group is rounded as above with
//!   `s = max(amax, 1e-10)/max` — vLLM's `per_token_group_quant_fp8`
//!   (`vllm/model_executor/layers/quantization/utils/fp8_utils.py`: `_absmax =
//!   max(max(|y|), eps)`, `eps = 1e-10`, `y_s = _absmax / fp8_max`, `clamp(y / y_s, fp8_min,
//!   fp8_max)` cast to `float8_e4m3fn`, which rounds to nearest even; the clamp is the codec's
//!   saturation). DeepSeek-V3's `act_quant` (`inference/kernel.py`, `act_quant_kernel`:
//!   `s = max(|x|)/448`, `y = x/s` cast to FP8, blocks of 128) computes the same without `eps`:
//!   the two differ only for a group whose amax is below 1e-10, where DeepSeek's scale is
//!   `amax/448` (and 0/0 = NaN for an all-zero group) while vLLM's is `1e-10/448`. qdrift follows
//!   vLLM, the engine these checkpoints are served with, whose all-zero groups stay zero. vLLM's
//!   `use_ue8m0` variant (scale rounded up to a power of two, `exp2(ceil(log2(s)))`, for
//!   DeepGEMM on Blackwell; DeepSeek-V3.1's `scale_fmt: ue8m0`) is a kernel choice, not part of
//!   the checkpoint's format: qdrift does not model it. The row must be whole groups (both
//!   references assert it; [`ActivationQuant::check_width`]). The same with int8 (`int8-gG`)
//!   is vLLM's `per_token_group_quant_int8` (same `eps`, `max` = 127, round to nearest even).
//! - **MXFP4** (activations `mxfp4`, `mxfp4-ocp`; OCP MX v1.0): each token's row is cut into
//!   blocks of 32; a block's scale is `s = 2^E` with `E = floor(log2(p)) − 2` clamped to the
//!   E8M0 range (`127 + E` in `[0, 255]`), `x' = e2m1(x/s)·s` (E2M1 round to nearest even,
//!   saturating at ±6: [`qdrift_ggml::e2m1_encode`]). For `mxfp4`, `p` is the amax rounded to a
//!   power of two by adding `2^21` to its f32 bits and keeping sign and exponent (up when the
//!   mantissa is at least 1.75), as compressed-tensors 0.20.1 computes dynamic MX scales
//!   (`quantization/utils/helpers.py` `compute_dynamic_scales_and_zp` → `calculate_qparams` →
//!   `quantization/utils/mxfp_utils.py` `generate_mx_scales` / `round_to_power_2`, then
//!   `quantization/lifecycle/forward.py` `fake_quantize` → `forward_helpers.py`
//!   `_quantize_dequantize`: `x/s`, clamp ±6, `cast_to_fp4`, `·s`); vLLM's reference
//!   (`tests/quantization/reference_mxfp4.py` `qdq_mxfp4_torch`) and AMD Quark's
//!   `scale_calculation_mode="even"`, which vLLM's MXFP4 activation emulation calls, round the
//!   same way. For `mxfp4-ocp`, `p` is the amax itself: the OCP spec's §6.3 rule
//!   (`floor(log2(amax)) − emax_elem`, `emax_elem = 2`), which lets a block's largest value
//!   saturate to 6 where compressed-tensors moves to the next scale (amax mantissa ≥ 1.75).
//!   An all-zero block has `E` = −127 and stays zero. For `mxfp4-ocp` the scale follows torchao
//!   0.18.0 (`prototype/mx_formats/mx_tensor.py` `to_mx`, `ScaleCalculationMode.FLOOR`), which
//!   keeps it at or above 2^-126 (f32's least normal).
//! - **NVFP4** (activations `nvfp4`): blocks of 16; with `g` the layer's static global input
//!   scale (compressed-tensors' `input_global_scale` = `448·6/amax` over calibration,
//!   `generate_gparam`), the block scale is `s8 = e4m3(g·(amax/6))` (saturating RNE; 0 becomes
//!   compressed-tensors' eps 0.125), the effective scale `s = s8/g`, and `x' = e2m1(x/s)·s` —
//!   compressed-tensors 0.20.1 `calculate_qparams` (`max_val_pos / 6`, `global_scale * scales`,
//!   `round_to_quantized_type_dtype(…, float8_e4m3fn)`, `_get_dtype_eps`) then
//!   `_quantize_dequantize` (`scale / global_scale`, `x / scale`, clamp, `cast_to_fp4`, `·
//!   scale`). Without a global scale (`None`: a layer compressed-tensors left uncalibrated) `g`
//!   drops out: `s = e4m3(amax/6)`. vLLM's kernel (`scaled_fp4_quant`, and its emulation
//!   `ref_nvfp4_quant`) multiplies by reciprocals instead of dividing (`x · (1/(s8·(1/g)))`), which
//!   can differ within an ulp of an E2M1 rounding boundary; qdrift follows compressed-tensors,
//!   which wrote the checkpoints' scales.
//! - **q8_0 / q4_0** (KV only): ggml's `quantize_row_q8_0_ref` / `quantize_row_q4_0_ref` then
//!   `dequantize_row_*` (`ggml-quants.c`), through the project's bit-exact `qdrift-ggml` codecs.

use qdrift_ggml::{dequantize_ggml_blocks, e2m1_decode, e2m1_encode, quantize_ggml_blocks};

use crate::error::QuantizeError;
use crate::formats::fp8::{fp8_decode, fp8_encode};
use crate::recipe::{ActivationQuant, ActivationScale, DynamicFormat, KvQuant};
use crate::scheme::Mxfp4Rule;

/// Quantize→dequantize one scale group (`values` share one dynamic scale) in place.
///
/// `s = amax/max` (`max` = 127 or the FP8 max normal); an all-zero group is left as it is.
fn round_dynamic_group(format: DynamicFormat, values: &mut [f32]) {
    round_dynamic_group_eps(format, values, 0.0);
}

/// vLLM's `eps` of per-token-group scales (`per_token_group_quant_fp8`'s default, 1e-10).
pub const TOKEN_GROUP_EPS: f32 = 1e-10;

/// [`round_dynamic_group`] with `s = max(amax, eps)/max` (`eps` = 0: `s = amax/max`).
fn round_dynamic_group_eps(format: DynamicFormat, values: &mut [f32], eps: f32) {
    let amax = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let s = amax.max(eps) / format.max_value();
    if s == 0.0 {
        return;
    }
    for v in values.iter_mut() {
        *v = round_scaled(format, *v / s) * s;
    }
}

/// A value already divided by its scale, rounded to the format's grid (and dequantized).
fn round_scaled(format: DynamicFormat, y: f32) -> f32 {
    match format {
        DynamicFormat::Int8 => y.round_ties_even().clamp(-127.0, 127.0),
        DynamicFormat::Fp8(f) => fp8_decode(f, fp8_encode(f, y)),
        DynamicFormat::Mxfp4(_) | DynamicFormat::Nvfp4 => round_e2m1(y),
    }
}

/// E2M1 round to nearest even, saturating at ±6 (NaN stays NaN).
fn round_e2m1(y: f32) -> f32 {
    e2m1_encode(y).map_or(y, e2m1_decode)
}

/// compressed-tensors' eps for a zero E4M3 block scale (`_get_dtype_eps(float8_e4m3fn)`).
pub const NVFP4_ZERO_SCALE: f32 = 0.125;

/// The E8M0 scale `2^E` of an MXFP4 block of largest magnitude `amax` (see the module doc): the
/// weight formats' scale code (`formats/mxfp4.rs`, one definition of both rules), with torchao's
/// floor of 2^-126 under the OCP rule (`to_mx` clamps its f32 scale at the least normal).
pub fn mx_scale(rule: Mxfp4Rule, amax: f32) -> f32 {
    let code = crate::formats::mxfp4::scale_code(rule, amax);
    let code = if rule == Mxfp4Rule::Ocp { code.max(1) } else { code };
    crate::formats::mxfp4::scale_value(code)
}

/// The static global input scale of an NVFP4 layer whose calibrated input amax is `amax`:
/// compressed-tensors' `generate_gparam` in f32, `448·6 · (1/max(amax, f32::MIN_POSITIVE))`, 1
/// where that is not finite (an uncalibrated layer). PyTorch divides a Python number by a tensor
/// as a reciprocal then a product (`aten::reciprocal`, `mul`), two roundings rather than one.
pub fn nvfp4_global_scale(amax: f32) -> f32 {
    qdrift_ggml::ct_global_scale(amax)
}

/// The effective scale `e4m3(g·(amax/6))/g` of an NVFP4 block (see the module doc).
pub fn nvfp4_scale(amax: f32, global: Option<f32>) -> f32 {
    // The weights' block scale (qdrift-ggml's `ct_block_scale`); without a global scale, g = 1.
    let s8 = qdrift_ggml::e4m3_decode(qdrift_ggml::ct_block_scale(global.unwrap_or(1.0), amax));
    global.map_or(s8, |g| s8 / g)
}

/// Quantize→dequantize one 4-bit float block in place: `x' = e2m1(x/s)·s`.
fn round_fp4_block(format: DynamicFormat, values: &mut [f32], global: Option<f32>) {
    let amax = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let s = match format {
        DynamicFormat::Mxfp4(rule) => mx_scale(rule, amax),
        _ => nvfp4_scale(amax, global),
    };
    for v in values.iter_mut() {
        *v = round_e2m1(*v / s) * s;
    }
}

impl ActivationQuant {
    /// Quantize→dequantize the activations of one sequence's `tokens` (row-major `[tokens, cols]`)
    /// in place: one scale per token, one for all of them ([`ActivationScale::Tensor`]), or one
    /// per token and group of `G` inputs ([`ActivationScale::TokenGroup`], `s = max(amax,
    /// 1e-10)/max`). The caller passes only real tokens (never padding), the way the device
    /// implementation masks padding out.
    ///
    /// # Panics
    /// If `x.len()` is not a multiple of `cols`, `cols` is 0, or a group does not divide `cols`
    /// (refused earlier by [`ActivationQuant::check_width`]).
    pub fn round_host(&self, x: &mut [f32], cols: usize) {
        self.round_host_global(x, cols, None);
    }

    /// [`ActivationQuant::round_host`] with an NVFP4 layer's static global input scale `g`
    /// (`448·6/amax` of its calibrated input, compressed-tensors' `input_global_scale`); `None`
    /// and every other format: no global scale.
    ///
    /// # Panics
    /// As [`ActivationQuant::round_host`].
    pub fn round_host_global(&self, x: &mut [f32], cols: usize, global: Option<f32>) {
        assert!(cols > 0 && x.len().is_multiple_of(cols), "activations of {} values are not rows of {cols}", x.len());
        if self.format.block().is_some() {
            let ActivationScale::TokenGroup(g) = self.scale else {
                panic!("{} activations are scaled per block (refused by check_width)", self);
            };
            assert!(g > 0 && cols.is_multiple_of(g), "rows of {cols} activations are not blocks of {g}");
            x.chunks_mut(g).for_each(|block| round_fp4_block(self.format, block, global));
            return;
        }
        match self.scale {
            ActivationScale::Token => x.chunks_mut(cols).for_each(|row| round_dynamic_group(self.format, row)),
            ActivationScale::Tensor => round_dynamic_group(self.format, x),
            ActivationScale::TokenGroup(g) => {
                assert!(g > 0 && cols.is_multiple_of(g), "rows of {cols} activations are not groups of {g}");
                x.chunks_mut(g).for_each(|group| round_dynamic_group_eps(self.format, group, TOKEN_GROUP_EPS));
            }
        }
    }
}

impl KvQuant {
    /// Quantize→dequantize one token's keys or values, `row` = `[kv_heads × head_dim]` (heads
    /// consecutive), in place.
    ///
    /// # Errors
    /// [`QuantizeError::KvRow`] when a ggml format's row is not whole blocks.
    ///
    /// # Panics
    /// If `row.len()` is not a multiple of `head_dim` or `head_dim` is 0.
    pub fn round_host(&self, row: &mut [f32], head_dim: usize) -> Result<(), QuantizeError> {
        assert!(
            head_dim > 0 && row.len().is_multiple_of(head_dim),
            "a KV row of {} values is not heads of {head_dim}",
            row.len()
        );
        match *self {
            KvQuant::Fp8(f) => row.iter_mut().for_each(|v| *v = fp8_decode(f, fp8_encode(f, *v))),
            KvQuant::Fp8PerHead(f) => {
                row.chunks_mut(head_dim).for_each(|head| round_dynamic_group(DynamicFormat::Fp8(f), head));
            }
            KvQuant::Int8 => row.chunks_mut(head_dim).for_each(|head| round_dynamic_group(DynamicFormat::Int8, head)),
            KvQuant::Ggml(ty) => {
                self.check_row(row.len() / head_dim, head_dim)?;
                let blocks = quantize_ggml_blocks(ty, row)?;
                let back = dequantize_ggml_blocks(ty, &blocks, row.len())?;
                row.copy_from_slice(&back);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheme::Fp8Format;
    use qdrift_ggml::GgmlType;

    #[test]
    fn int8_per_token_is_symmetric_rne_with_amax_over_127() {
        let a = ActivationQuant { format: DynamicFormat::Int8, scale: ActivationScale::Token };
        // Row 1: amax 127 → s = 1, so values round to integers, ties to even.
        // Row 2: amax 2.54 → s = 0.02.
        let mut x = vec![127.0, 0.5, 1.5, -2.5, 3.4, -127.0, 2.54, 0.01, 0.03, 0.0, -1.0, 0.0];
        a.round_host(&mut x, 6);
        assert_eq!(&x[..6], &[127.0, 0.0, 2.0, -2.0, 3.0, -127.0]);
        let s = 2.54f32 / 127.0;
        let expect: Vec<f32> = [2.54f32, 0.01, 0.03, 0.0, -1.0, 0.0]
            .iter()
            .map(|v| (v / s).round_ties_even().clamp(-127.0, 127.0) * s)
            .collect();
        assert_eq!(&x[6..], &expect[..]);
        assert_eq!(x[6], 127.0 * s);
    }

    #[test]
    fn per_tensor_shares_one_scale_and_zero_groups_stay_zero() {
        let a = ActivationQuant { format: DynamicFormat::Int8, scale: ActivationScale::Tensor };
        let mut x = vec![254.0, 1.0, 0.0, 3.0];
        a.round_host(&mut x, 2); // s = 2 for both rows: 0.5 and 1.5 round to even
        assert_eq!(x, [254.0, 0.0, 0.0, 4.0]);
        let mut z = vec![0.0; 8];
        ActivationQuant { format: DynamicFormat::Fp8(Fp8Format::E4M3), scale: ActivationScale::Token }
            .round_host(&mut z, 4);
        assert_eq!(z, [0.0; 8]);
    }

    #[test]
    fn fp8_activations_scale_amax_to_the_max_normal_and_use_the_codec() {
        let a = ActivationQuant { format: DynamicFormat::Fp8(Fp8Format::E4M3), scale: ActivationScale::Token };
        // amax 8 → s = 8/448; 8 maps to 448 (exact), 1 maps to 56 (exact in E4M3),
        // 0.3 maps to 16.8 → 16 (spacing 2 in [16, 32)), back to 16·s.
        let mut x = vec![8.0, 1.0, 0.3, -8.0];
        a.round_host(&mut x, 4);
        let s = 8.0f32 / 448.0;
        assert_eq!(x, [448.0 * s, 56.0 * s, 16.0 * s, -448.0 * s]);
    }

    #[test]
    fn token_groups_scale_each_group_alone_with_vllms_eps() {
        let a = ActivationQuant { format: DynamicFormat::Fp8(Fp8Format::E4M3), scale: ActivationScale::TokenGroup(2) };
        // One token of three groups: amax 8 (s = 8/448), amax 448 (s = 1), all zero (stays zero).
        let mut x = vec![8.0, 0.3, 448.0, 3.3, 0.0, -0.0];
        a.round_host(&mut x, 6);
        let s = 8.0f32 / 448.0;
        assert_eq!(&x[..4], &[448.0 * s, 16.0 * s, 448.0, 3.25]);
        assert_eq!(&x[4..], &[0.0, 0.0]);
        // Below eps the scale is 1e-10/448 (vLLM), not amax/448 (DeepSeek-V3): 1e-12 maps to
        // 4.48 on the grid, rounded to 4.5 (spacing 0.5 in [4, 8)).
        let mut tiny = vec![1e-12f32, 0.0];
        a.round_host(&mut tiny, 2);
        let s = 1e-10f32 / 448.0;
        assert_eq!(tiny[0], fp8_decode(Fp8Format::E4M3, fp8_encode(Fp8Format::E4M3, 1e-12 / s)) * s);
        assert_eq!(fp8_decode(Fp8Format::E4M3, fp8_encode(Fp8Format::E4M3, 1e-12 / s)), 4.5);
        // Int8 groups: amax/127 per group, ties to even.
        let a = ActivationQuant { format: DynamicFormat::Int8, scale: ActivationScale::TokenGroup(2) };
        let mut x = vec![127.0, 2.5, 254.0, 3.0];
        a.round_host(&mut x, 4);
        assert_eq!(x, [127.0, 2.0, 254.0, 4.0]);
    }

    #[test]
    fn mx_scale_rules_differ_from_a_mantissa_of_1_75_and_nvfp4_scales_follow_compressed_tensors() {
        // amax 7 = 1.75·4: compressed-tensors rounds it up to 8 (E = 3 − 2, s = 2: 7 → 3.5 → 4
        // → 8); the OCP rule keeps 4 (E = 0, s = 1: 7 saturates to 6).
        assert_eq!((mx_scale(Mxfp4Rule::CompressedTensors, 7.0), mx_scale(Mxfp4Rule::Ocp, 7.0)), (2.0, 1.0));
        assert_eq!((mx_scale(Mxfp4Rule::CompressedTensors, 6.99), mx_scale(Mxfp4Rule::Ocp, 6.99)), (1.0, 1.0));
        // Zero blocks: E8M0's least scale, 2^-127 (torchao: 2^-126).
        assert_eq!(mx_scale(Mxfp4Rule::CompressedTensors, 0.0), 2f32.powi(-127));
        assert_eq!(mx_scale(Mxfp4Rule::Ocp, 0.0), 2f32.powi(-126));
        let mut x = vec![7.0, 1.0, 0.0, -3.3];
        x.extend([0.0; 28]);
        let (mut even, mut floor) = (x.clone(), x.clone());
        ActivationQuant::fp4(DynamicFormat::Mxfp4(Mxfp4Rule::CompressedTensors)).round_host(&mut even, 32);
        ActivationQuant::fp4(DynamicFormat::Mxfp4(Mxfp4Rule::Ocp)).round_host(&mut floor, 32);
        assert_eq!((&even[..4], &floor[..4]), (&[8.0, 1.0, 0.0, -3.0][..], &[6.0, 1.0, 0.0, -3.0][..]));
        // NVFP4 without a global scale: s = e4m3(amax/6); amax 6 → s = 1 and E2M1 ties go even.
        let nv = ActivationQuant::fp4(DynamicFormat::Nvfp4);
        let mut x = vec![6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        nv.round_host(&mut x, 16);
        assert_eq!(&x[..9], &[6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -6.0]);
        // A block scale that rounds to zero in E4M3 becomes compressed-tensors' eps 0.125.
        assert_eq!(nvfp4_scale(1e-6, None), NVFP4_ZERO_SCALE);
        // With the global scale g: s = e4m3(g·amax/6)/g.
        assert_eq!(nvfp4_scale(6.0, Some(448.0)), 1.0);
        assert_eq!(nvfp4_global_scale(2688.0), 1.0);
        assert_eq!(nvfp4_global_scale(0.0), 1.0, "an uncalibrated layer");
    }

    #[test]
    fn kv_fp8_scale_one_saturates_and_rounds_in_place() {
        let mut row = vec![1000.0, -0.3, 1.0625, 0.0];
        KvQuant::Fp8(Fp8Format::E4M3).round_host(&mut row, 2).expect("fp8");
        // E4M3: 1000 saturates to 448; −0.3 → −0.3125 (spacing 1/32 in [0.25, 0.5)); 1.0625 is a
        // tie between 1.0 and 1.125 → even mantissa 1.0.
        assert_eq!(row, [448.0, -0.3125, 1.0, 0.0]);
    }

    #[test]
    fn kv_int8_and_fp8_head_scale_each_head_alone() {
        let mut row = vec![127.0, 1.4, 2.54, 0.02];
        KvQuant::Int8.round_host(&mut row, 2).expect("int8");
        let s = 2.54f32 / 127.0;
        assert_eq!(row, [127.0, 1.0, 127.0 * s, 1.0 * s]);
        let mut row = vec![448.0, 3.0, 1.0, 0.25];
        KvQuant::Fp8PerHead(Fp8Format::E4M3).round_host(&mut row, 2).expect("fp8 head");
        assert_eq!(&row[..2], &[448.0, 3.0]);
        assert_eq!(row[2], 448.0 * (1.0 / 448.0));
    }

    #[test]
    fn kv_ggml_blocks_are_the_ggml_codecs_and_need_whole_blocks() {
        let row: Vec<f32> = (0..64).map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0).collect();
        for ty in [GgmlType::Q8_0, GgmlType::Q4_0] {
            let mut got = row.clone();
            KvQuant::Ggml(ty).round_host(&mut got, 16).expect("two blocks");
            let blocks = quantize_ggml_blocks(ty, &row).expect("quantize");
            assert_eq!(got, dequantize_ggml_blocks(ty, &blocks, 64).expect("dequantize"));
            assert_ne!(got, row);
        }
        let mut short = vec![1.0; 48];
        let e = KvQuant::Ggml(GgmlType::Q4_0).round_host(&mut short, 16).expect_err("48 values");
        assert!(e.to_string().contains("48 values"), "{e}");
    }
}
