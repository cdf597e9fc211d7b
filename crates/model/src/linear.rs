//! [`Projection`]: a linear layer `y = x·Wᵀ (+ b)`, stored where its device multiplies best
//! ([`LinearKernel`]): as Burn's `Linear` (every backend; what wgpu runs), or as weights packed
//! once on the host for the CPU backend's own kernel (`host/linear.rs`).

use std::sync::Arc;

use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::tensor::{DType, Device, Tensor};

use qdrift_weights::HostTensor;

use crate::host::elem::round_f16;
use crate::host::linear::PackedLinear;
use crate::host::placement::LinearKernel;
use crate::{host_f32, host_f32_transposed, upload, upload_owned};

/// A linear layer in one of its two storages.
#[derive(Module, Debug)]
pub enum Projection {
    /// Burn's layer, weight `[in, out]`.
    Device(Linear),
    /// Packed host weights.
    Host(HostProjection),
}

/// The host storage of a [`Projection`]: no Burn parameters.
#[derive(Module, Debug)]
pub struct HostProjection {
    #[module(skip)]
    packed: Arc<PackedLinear>,
}

/// Where and how [`Projection::new`] stores a layer: the compute dtype, the device, the kernel
/// that will multiply by it, and whether host panels of an f32 layer may be stored as f16.
#[derive(Clone, Copy)]
pub(crate) struct ProjectionStore<'a> {
    pub dtype: DType,
    pub device: &'a Device,
    pub kernel: LinearKernel,
    pub compact: bool,
}

impl Projection {
    /// A layer from `[out, in]` row-major host weights and an optional `[out]` bias, in `store.dtype`
    /// (f32 or f16, rounded to nearest even on the host), stored as `store.kernel` says. Host
    /// panels of an f32 layer are stored as f16 when every weight is an f16 value and `compact`
    /// (`host/linear.rs`'s storage rule; the products are the same).
    pub(crate) fn new(
        weight: &[f32],
        [out, inp]: [usize; 2],
        bias: Option<&[f32]>,
        store: ProjectionStore<'_>,
    ) -> Self {
        let ProjectionStore { dtype, device, kernel, compact } = store;
        match kernel {
            LinearKernel::Host => {
                let f16 = dtype == DType::F16;
                let packed = if compact {
                    PackedLinear::pack(weight, out, inp, bias, f16)
                } else {
                    PackedLinear::pack_stored(weight, out, inp, bias, f16, f16)
                };
                Self::Host(HostProjection { packed: Arc::new(packed) })
            }
            LinearKernel::Burn => {
                // Burn's Linear multiplies by a [in, out] weight.
                let transposed = transpose(weight, out, inp);
                Self::Device(Linear {
                    weight: Param::from_tensor(upload(&transposed, [inp, out], dtype, device)),
                    bias: bias.map(|b| Param::from_tensor(upload(b, [out], dtype, device))),
                })
            }
        }
    }

    /// The packed host weights, for a layer stored on the host.
    pub(crate) fn packed(&self) -> Option<&PackedLinear> {
        match self {
            Self::Device(_) => None,
            Self::Host(h) => Some(&h.packed),
        }
    }

    /// Output width.
    pub fn out_features(&self) -> usize {
        match self {
            Self::Device(linear) => linear.weight.dims()[1],
            Self::Host(h) => h.packed.out(),
        }
    }

    /// Whether the layer adds a bias.
    pub fn has_bias(&self) -> bool {
        match self {
            Self::Device(linear) => linear.bias.is_some(),
            Self::Host(h) => h.packed.has_bias(),
        }
    }

    /// `x·Wᵀ + b`, in `x`'s dtype (the host kernel accumulates in f32 and rounds its output
    /// once).
    ///
    /// # Shapes
    /// - `x`: `[batch, seq, in]` → `[batch, seq, out]`
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let dtype = x.dtype();
        self.forward_to(x, dtype)
    }

    /// [`Projection::forward`] cast to `dtype`: computed and rounded in `x`'s dtype as there,
    /// then converted (the output layer's logits, in f32 whatever the compute dtype).
    ///
    /// # Shapes
    /// - `x`: `[batch, seq, in]` → `[batch, seq, out]` in `dtype`
    pub fn forward_to(&self, x: Tensor<3>, dtype: DType) -> Tensor<3> {
        match self {
            Self::Device(linear) => {
                let y = linear.forward(x);
                if y.dtype() == dtype { y } else { y.cast(dtype) }
            }
            Self::Host(h) => {
                let ([b, t, inp], x_dtype, device) = (x.dims(), x.dtype(), x.device());
                assert_eq!(inp, h.packed.inp(), "input width does not match the layer");
                let mut y = h.packed.forward(&host_f32(x), b * t);
                // Rounded to `x`'s dtype; uploading in f16 rounds alike, so only a wider
                // target needs it done here.
                if x_dtype == DType::F16 && dtype != DType::F16 {
                    round_f16(&mut y);
                }
                upload_owned(y, [b, t, h.packed.out()], dtype, &device)
            }
        }
    }

    /// The layer's weights as host values: `[out, in]` row-major (PyTorch's layout, what
    /// [`Projection::new`] took) and the `[out]` bias, exactly as stored (values of the compute
    /// dtype).
    pub(crate) fn host_weights(&self) -> (HostTensor, Option<HostTensor>) {
        match self {
            Self::Device(linear) => {
                let [inp, out] = linear.weight.val().dims();
                let weight = host_f32_transposed(linear.weight.val());
                let bias = linear.bias.as_ref().map(|b| HostTensor { shape: vec![out], data: host_f32(b.val()) });
                (HostTensor { shape: vec![out, inp], data: weight }, bias)
            }
            Self::Host(h) => {
                let (out, inp) = (h.packed.out(), h.packed.inp());
                let bias = h.packed.bias().map(|b| HostTensor { shape: vec![out], data: b.to_vec() });
                (HostTensor { shape: vec![out, inp], data: h.packed.weights() }, bias)
            }
        }
    }
}

fn transpose(data: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; data.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = data[r * cols + c];
        }
    }
    out
}
