//! **compressed-tensors FP4** (`format: nvfp4-pack-quantized`, `mxfp4-pack-quantized`):
//! unpacking on load and packing for fixtures, side by side; the E2M1 nibble packing here is also
//! ModelOpt's (`modelopt.rs`).
//!
//! Following compressed-tensors 0.20.1 `compressors/nvfp4/helpers.py` (`pack_fp4_to_uint8`,
//! `unpack_fp4_from_uint8`: two E2M1 codes per byte, element `2j` in the **low** nibble and
//! `2j + 1` in the high one, along the row), `compressors/nvfp4/base.py`
//! (`NVFP4PackedCompressor`), `compressors/mxfp4/base.py` (`MXFP4PackedCompressor`),
//! `compressors/mx_utils.py` (`decompress_mx_scale`: `2^(e − 127)`) and
//! `quantization/lifecycle/forward_helpers.py` (`_dequantize`: `scale / global_scale`, then
//! `q · scale`):
//! - NVFP4 (`weights`: `num_bits: 4`, `type: float`, `strategy: tensor_group`, `group_size: 16`):
//!   `weight_packed` U8 `[out, in/2]`, `weight_scale` F8_E4M3 `[out, in/16]`,
//!   `weight_global_scale` F32 `[1]` (= 448·6/amax), `w = e2m1(q) · (s / g)`
//!   ([`qdrift_ggml::GlobalScale::Divide`]).
//! - MXFP4 (`strategy: group`, `group_size: 32`): `weight_packed` as above, `weight_scale` U8
//!   E8M0 `[out, in/32]`, `w = e2m1(q) · 2^(e − 127)`; `e = 255` is the E8M0 NaN (OCP MX v1.0
//!   §5.4.1), refused.
//!
//! The library then casts the weight to the model's dtype; qdrift keeps the f32 values. Rows must
//! be whole groups (both compressors refuse others), the global scale finite and positive.

use std::path::Path;

use safetensors::Dtype;

use super::packing::{HfDtype, HfTensor};
use crate::LoadError;
use crate::hf::shards::Shards;
use qdrift_ggml::{GlobalScale, e2m1_decode, e2m1_pack_rows, e4m3_decode};

/// Which FP4 layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fp4Kind {
    /// NVFP4: E4M3 scale per 16, F32 global scale.
    Nvfp4,
    /// MXFP4: E8M0 scale per 32.
    Mxfp4,
}

impl Fp4Kind {
    /// Weights per block scale.
    pub fn group(self) -> usize {
        match self {
            Fp4Kind::Nvfp4 => 16,
            Fp4Kind::Mxfp4 => 32,
        }
    }
}

/// A matrix's FP4 codes as the FP4 layouts store them: one E2M1 code per weight (low 4 bits), one
/// scale byte per group of a row (E4M3 for NVFP4, E8M0 for MXFP4), and NVFP4's global scale in the
/// direction the layout stores it.
///
/// # Shapes
/// - `codes`: `[out, inp]`; `scales`: `[out, inp / group]`.
#[derive(Debug, Clone, Copy)]
pub struct Fp4Codes<'a> {
    /// Rows (output features).
    pub out: usize,
    /// Columns (input features), a multiple of the group.
    pub inp: usize,
    /// E2M1 codes, row-major.
    pub codes: &'a [u8],
    /// Scale bytes, row-major.
    pub scales: &'a [u8],
    /// NVFP4's global scale (`None` for MXFP4).
    pub global: Option<f32>,
}

impl Fp4Codes<'_> {
    /// `{module}.{name}`: the codes packed two per byte, the low nibble first.
    pub(crate) fn packed(&self, module: &str, name: &str) -> HfTensor {
        let bytes = e2m1_pack_rows(self.codes, self.inp);
        HfTensor { name: format!("{module}.{name}"), dtype: HfDtype::U8, shape: vec![self.out, self.inp / 2], bytes }
    }

    /// `{module}.weight_scale`: the scale bytes as `dtype` (F8_E4M3 or U8).
    pub(crate) fn scale(&self, module: &str, dtype: HfDtype, group: usize) -> HfTensor {
        HfTensor {
            name: format!("{module}.weight_scale"),
            dtype,
            shape: vec![self.out, self.inp / group],
            bytes: self.scales.to_vec(),
        }
    }
}

/// The path to name for tensor `name`.
fn path_of<'a>(shards: &'a Shards, name: &str) -> &'a Path {
    shards.path_of(name).unwrap_or(Path::new("."))
}

/// Refuses rows that are not whole groups of `group` (naming the tensor), before anything is
/// read.
pub(crate) fn check_groups(shards: &Shards, name: &str, inp: usize, group: usize) -> Result<(), LoadError> {
    if inp > 0 && inp.is_multiple_of(group) {
        return Ok(());
    }
    Err(LoadError::invalid(
        path_of(shards, name),
        format!("tensor {name}: {inp} inputs per row are not whole FP4 groups of {group}"),
    ))
}

/// The E2M1 codes of U8 tensor `name` `[out, inp/2]`, two per byte, low nibble first.
///
/// # Shapes
/// - returns `[out, inp]`.
pub(crate) fn unpack_codes(shards: &Shards, name: &str, out: usize, inp: usize) -> Result<Vec<u8>, LoadError> {
    let raw = shards.raw_shaped(name, &[vec![out, inp / 2]])?;
    if raw.dtype != Dtype::U8 {
        return Err(LoadError::unsupported(raw.path, format!("tensor {name} dtype"), format!("{:?}", raw.dtype), "U8"));
    }
    Ok(raw.bytes.iter().flat_map(|&b| [b & 0x0F, b >> 4]).collect())
}

/// The bytes of scale tensor `name` `[out, groups]`, which must have `dtype`.
pub(crate) fn scale_bytes(shards: &Shards, name: &str, shape: &[usize], dtype: Dtype) -> Result<Vec<u8>, LoadError> {
    let raw = shards.raw_shaped(name, &[shape.to_vec()])?;
    if raw.dtype != dtype {
        return Err(LoadError::unsupported(
            raw.path,
            format!("tensor {name} dtype"),
            format!("{:?}", raw.dtype),
            format!("{dtype:?}"),
        ));
    }
    Ok(raw.bytes)
}

/// An F32 scalar (shape `[]` or `[1]`) that must be finite and positive (`zero_ok`: or zero),
/// else refused naming the tensor.
pub(crate) fn positive_scalar(shards: &Shards, name: &str, zero_ok: bool) -> Result<f32, LoadError> {
    let v = shards.floats_any(name, &[vec![1], vec![]])?;
    let x = v.first().copied().unwrap_or(f32::NAN);
    if x > 0.0 || (zero_ok && x == 0.0) {
        return Ok(x);
    }
    let want = if zero_ok { "finite and not negative" } else { "finite and positive" };
    Err(LoadError::invalid(path_of(shards, name), format!("tensor {name} = {x}: a global scale must be {want}")))
}

/// `w = e2m1(q) · block_scale(e4m3(s))`, NVFP4's dequantization in either global-scale direction.
///
/// # Shapes
/// - `codes`: `[out, inp]`; `scales`: `[out, inp/16]`; returns `[out, inp]`.
pub(crate) fn dequantize_nvfp4(codes: &[u8], scales: &[u8], global: GlobalScale) -> Vec<f32> {
    codes
        .chunks_exact(16)
        .zip(scales)
        .flat_map(|(block, &s)| {
            let d = global.block_scale(e4m3_decode(s));
            block.iter().map(move |&q| e2m1_decode(q) * d)
        })
        .collect()
}

/// `2^(e − 127)`, the E8M0 scale (exact; `e = 0` is the subnormal 2^-127); `None` for the NaN
/// code 255.
fn e8m0(e: u8) -> Option<f32> {
    match e {
        255 => None,
        0 => Some(f32::from_bits(0x0040_0000)),
        e => Some(f32::from_bits(u32::from(e) << 23)),
    }
}

/// Dequantizes compressed-tensors FP4 linear layer `module` (see the module doc).
///
/// # Shapes
/// - `weight_packed`: `[out, inp/2]`; `weight_scale`: `[out, inp/group]`; returns `[out, inp]`.
pub(crate) fn unpack_ct(
    kind: Fp4Kind,
    shards: &Shards,
    module: &str,
    out: usize,
    inp: usize,
) -> Result<Vec<f32>, LoadError> {
    let packed = format!("{module}.weight_packed");
    let group = kind.group();
    check_groups(shards, &packed, inp, group)?;
    let scale_name = format!("{module}.weight_scale");
    let shape = [out, inp / group];
    match kind {
        Fp4Kind::Nvfp4 => {
            let scales = scale_bytes(shards, &scale_name, &shape, Dtype::F8_E4M3)?;
            let g = positive_scalar(shards, &format!("{module}.weight_global_scale"), false)?;
            let codes = unpack_codes(shards, &packed, out, inp)?;
            Ok(dequantize_nvfp4(&codes, &scales, GlobalScale::Divide(g)))
        }
        Fp4Kind::Mxfp4 => {
            let scales = scale_bytes(shards, &scale_name, &shape, Dtype::U8)?;
            let scales = scales
                .iter()
                .enumerate()
                .map(|(k, &e)| {
                    e8m0(e).ok_or_else(|| {
                        LoadError::invalid(
                            path_of(shards, &scale_name),
                            format!("tensor {scale_name}[{k}] = 255 is the E8M0 NaN, not a scale"),
                        )
                    })
                })
                .collect::<Result<Vec<f32>, _>>()?;
            let codes = unpack_codes(shards, &packed, out, inp)?;
            Ok(codes
                .chunks_exact(32)
                .zip(scales)
                .flat_map(|(b, d)| b.iter().map(move |&q| e2m1_decode(q) * d))
                .collect())
        }
    }
}

/// Packs FP4 codes of linear layer `module` as compressed-tensors stores them: `weight_packed`,
/// `weight_scale` (F8_E4M3 or U8) and, for NVFP4, `weight_global_scale` F32 `[1]` (`codes.global`,
/// 1 when absent).
///
/// # Shapes
/// - `codes`: as [`Fp4Codes`] says; returns `weight_packed` `[out, inp/2]`, `weight_scale`
///   `[out, inp/group]`, `weight_global_scale` `[1]`.
pub(crate) fn pack_ct(kind: Fp4Kind, module: &str, codes: &Fp4Codes<'_>) -> Vec<HfTensor> {
    let mut parts = vec![codes.packed(module, "weight_packed")];
    match kind {
        Fp4Kind::Nvfp4 => {
            parts.push(codes.scale(module, HfDtype::F8E4M3, 16));
            let g = codes.global.unwrap_or(1.0);
            parts.push(HfTensor::floats(format!("{module}.weight_global_scale"), HfDtype::F32, vec![1], &[g]));
        }
        Fp4Kind::Mxfp4 => parts.push(codes.scale(module, HfDtype::U8, 32)),
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e8m0_is_two_to_the_e_minus_127() {
        for e in 0..=254u8 {
            assert_eq!(f64::from(e8m0(e).expect("finite")), 2f64.powi(i32::from(e) - 127), "e = {e}");
        }
        assert_eq!(e8m0(255), None);
    }

    #[test]
    fn packing_puts_the_even_element_in_the_low_nibble() {
        let codes = [0x1, 0xF, 0x7, 0x8];
        let c = Fp4Codes { out: 1, inp: 4, codes: &codes, scales: &[], global: None };
        assert_eq!(c.packed("m", "weight_packed").bytes, [0xF1, 0x87]);
    }
}
