//! Host values to and from Burn tensors, in the precision the model computes in: [`upload`] and
//! [`upload_owned`] convert on the host so that only the target precision crosses to the device,
//! [`host_f32`] reads a tensor back as f32, and [`mul_scalar_opmath`] multiplies by a scalar as
//! PyTorch does in bf16. Every module that moves values between the host and a device imports
//! them from here; this module imports nothing of the crate.

use burn::tensor::{DType, Device, Tensor, TensorData};
use half::slice::HalfFloatSliceExt;

/// Uploads host f32 values as a tensor of `dtype` (f32, f16 or bf16), converting on the host so
/// that only the target precision crosses to the device.
pub(crate) fn upload<const D: usize>(data: &[f32], shape: [usize; D], dtype: DType, device: &Device) -> Tensor<D> {
    let data = match dtype {
        DType::F16 => {
            // `half`'s slice conversion runs F16C's 8-wide `vcvtps2ph` where the CPU has it:
            // the same round-to-nearest-even as one value at a time.
            let mut h = vec![half::f16::ZERO; data.len()];
            h.convert_from_f32_slice(data);
            TensorData::new(h, shape)
        }
        DType::BF16 => TensorData::new(data.iter().map(|&v| half::bf16::from_f32(v)).collect::<Vec<_>>(), shape),
        _ => TensorData::new(data.to_vec(), shape),
    };
    Tensor::from_data(data, (device, dtype))
}

/// [`upload`] of values the caller owns: f32 values become the tensor's data without a copy.
pub(crate) fn upload_owned<const D: usize>(
    data: Vec<f32>,
    shape: [usize; D],
    dtype: DType,
    device: &Device,
) -> Tensor<D> {
    if dtype == DType::F32 {
        return Tensor::from_data(TensorData::new(data, shape), (device, dtype));
    }
    upload(&data, shape, dtype, device)
}

/// `x · s`; in bf16 as PyTorch multiplies a tensor by a Python float: in f32 (its "opmath" type
/// for half precision), rounded once. Burn's flex rounds the scalar to bf16 first, which for
/// `1/√d` or gpt-oss's `alpha` = 1.702 is another value. f32 and f16 keep Burn's `mul_scalar`,
/// which the host kernels mirror bit for bit.
///
/// # Shapes
/// - `x`: any → same
pub(crate) fn mul_scalar_opmath<const D: usize>(x: Tensor<D>, s: f64) -> Tensor<D> {
    if x.dtype() == DType::BF16 { x.cast(DType::F32).mul_scalar(s).cast(DType::BF16) } else { x.mul_scalar(s) }
}

/// A tensor's values in row-major order as f32 (exact for f16 and f32 tensors).
pub(crate) fn host_f32<const D: usize>(x: Tensor<D>) -> Vec<f32> {
    let data: TensorData = x.into_data();
    if let Ok(h) = data.as_slice::<half::f16>() {
        // Widened 8 at a time (F16C) where the CPU can: exact, as every f16 is an f32.
        let mut out = vec![0.0f32; h.len()];
        h.convert_to_f32_slice(&mut out);
        return out;
    }
    // Burn's flex backend reads back its own tensors; a failure here is a bug, not bad input.
    data.convert::<f32>().try_into_vec::<f32>().expect("a float tensor reads back as f32")
}
