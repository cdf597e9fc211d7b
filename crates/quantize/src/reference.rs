//! The reference: the checkpoint's weights rounded to the 16-bit format it is served in, which
//! every variant (scheme, noise floor, other checkpoint) is measured against. IEEE half precision
//! (FP16) by default; bfloat16 for a `--dtype bf16` evaluation, the precision nearly every
//! checkpoint is published and served in.
//!
//! qdrift compares variants with the model as it would be served at 16 bits, not with the f32
//! weights a llama2.c checkpoint (or an F32 file) stores; `qdrift eval` and `qdrift generate
//! --scheme`/`qdrift quantize` both build it here, so they start from the same weights.
//! **Invariant: every tensor is rounded (embedding, norms, biases, linear layers, head), with the
//! rounding of the `fp16` scheme (round-to-nearest-even, IEEE 754-2019) or bfloat16's
//! (round-to-nearest-even to 8 significand bits, the top half of an IEEE binary32, as PyTorch's
//! `tensor.to(torch.bfloat16)` and `half::bf16::from_f32`), so rounding twice changes nothing and
//! the `fp16` scheme applied to the FP16 reference is the reference.**

use half::{bf16, f16};
use qdrift_weights::{HostModel, HostTensor};

/// The 16-bit format a reference's weights are rounded to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReferenceFormat {
    /// IEEE 754 binary16, round-to-nearest-even.
    #[default]
    Fp16,
    /// bfloat16 (binary32's sign, 8 exponent bits and top 7 fraction bits), round-to-nearest-even.
    Bf16,
}

impl ReferenceFormat {
    /// Its name: `fp16` or `bf16`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Fp16 => "fp16",
            Self::Bf16 => "bf16",
        }
    }

    /// `v` rounded to this format, as f32.
    pub fn round(self, v: f32) -> f32 {
        match self {
            Self::Fp16 => f16::from_f32(v).to_f32(),
            Self::Bf16 => bf16::from_f32(v).to_f32(),
        }
    }
}

/// Rounds every weight of `model` to FP16 in place, making it the FP16 reference
/// ([`round_to_reference`] with [`ReferenceFormat::Fp16`]).
pub fn round_to_fp16_reference(model: &mut HostModel) {
    round_to_reference(model, ReferenceFormat::Fp16);
}

/// Rounds every weight of `model` to `format` in place, making it the reference.
///
/// In place because a model's host copy is its largest allocation: callers hold the checkpoint and
/// its reference once, not twice.
pub fn round_to_reference(model: &mut HostModel, format: ReferenceFormat) {
    model.for_each_tensor_mut(|t| round_tensor(t, format));
}

/// Rounds one tensor to `format` in place: the reference's rounding of each tensor, for
/// [`crate::Reference`], which rounds a source's parts as they pass.
pub(crate) fn round_tensor(t: &mut HostTensor, format: ReferenceFormat) {
    for v in &mut t.data {
        *v = format.round(*v);
    }
}

#[cfg(test)]
mod tests {
    use qdrift_load::synthetic_model;

    use super::*;
    use crate::{QuantizeOptions, Scheme, quantize_model};

    fn tiny() -> HostModel {
        synthetic_model("tiny", 7).expect("the tiny preset builds").model
    }

    #[test]
    fn every_tensor_is_rounded_and_the_fp16_scheme_leaves_the_reference_unchanged() {
        let mut model = tiny();
        round_to_fp16_reference(&mut model);
        let mut all_half = true;
        model.clone().for_each_tensor_mut(|t| all_half &= t.data.iter().all(|&v| f16::from_f32(v).to_f32() == v));
        assert!(all_half, "a weight is not an FP16 value");
        let options = QuantizeOptions { quantize_embeddings: true, quantize_head: true, quantize_router: true };
        let fp16 = quantize_model(&model, &Scheme::Fp16, &options).expect("fp16 quantizes").dequantized;
        assert!(fp16 == model, "the fp16 scheme changed the reference");
        let mut twice = model.clone();
        round_to_fp16_reference(&mut twice);
        assert!(twice == model, "rounding is not idempotent");
    }

    #[test]
    fn the_bf16_reference_is_bf16_values_and_rounding_twice_changes_nothing() {
        let mut model = tiny();
        round_to_reference(&mut model, ReferenceFormat::Bf16);
        let mut all_bf16 = true;
        model.clone().for_each_tensor_mut(|t| {
            // A bf16 value is an f32 whose low 16 bits are zero.
            all_bf16 &= t.data.iter().all(|&v| v.to_bits() & 0xFFFF == 0);
        });
        assert!(all_bf16, "a weight is not a bf16 value");
        let mut twice = model.clone();
        round_to_reference(&mut twice, ReferenceFormat::Bf16);
        assert!(twice == model, "rounding is not idempotent");
        // Round-to-nearest-even on the 16 bits dropped: PyTorch's `torch.tensor(x).to(bfloat16)`.
        let cases = [
            (1.0 + 2f32.powi(-8), 1.0),
            (1.0 + 3.0 * 2f32.powi(-8), 1.0 + 2f32.powi(-6)),
            (3.0e38, f32::from_bits(0x7F62_0000)),
        ];
        for (x, want) in cases {
            assert_eq!(ReferenceFormat::Bf16.round(x), want, "{x:e}");
        }
    }
}
