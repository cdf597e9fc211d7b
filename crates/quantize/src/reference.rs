//! The FP16 reference: the checkpoint's weights rounded to IEEE half precision, which every
//! variant (scheme, noise floor, other checkpoint) is measured against.
//!
//! qdrift compares variants with the model as it would be served at 16 bits, not with the f32
//! weights a llama2.c checkpoint (or an F32/BF16 file) stores; `qdrift eval` and `qdrift
//! generate --scheme`/`qdrift quantize` both build it here, so they start from the same weights.
//! **Invariant: every tensor is rounded (embedding, norms, biases, linear layers, head), with the
//! rounding of the `fp16` scheme (round-to-nearest-even, IEEE 754-2019), so rounding twice changes
//! nothing and the `fp16` scheme applied to the reference is the reference.**

use half::f16;
use qdrift_weights::{HostModel, HostTensor};

/// Rounds every weight of `model` to FP16 in place, making it the reference.
///
/// In place because a model's host copy is its largest allocation: callers hold the checkpoint and
/// its reference once, not twice.
pub fn round_to_fp16_reference(model: &mut HostModel) {
    model.for_each_tensor_mut(round_tensor);
}

/// Rounds one tensor to FP16 in place: the reference's rounding of each tensor, for
/// [`crate::Fp16Reference`], which rounds a source's parts as they pass.
pub(crate) fn round_tensor(t: &mut HostTensor) {
    for v in &mut t.data {
        *v = f16::from_f32(*v).to_f32();
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
}
