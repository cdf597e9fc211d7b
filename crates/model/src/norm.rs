//! RMSNorm (Zhang & Sennrich 2019), its statistic computed in f32 or wider whatever the compute
//! dtype, as Hugging Face's `LlamaRMSNorm` does for half precision.
//!
//! On the CPU backend it runs on the host ([`RmsNorm::forward_host`]) whichever path calls it, so
//! that the host residual stream (`Llama::forward_hidden`) and Burn's ops give the same bits; on
//! other devices it runs as Burn ops. Gemma's `x̂·(1 + w)` ([`NormStyle::OnePlusWeight`]) runs as
//! Burn ops on every device.

use std::sync::Arc;

use burn::module::{Module, Param};
use burn::tensor::{DType, Tensor};
use qdrift_weights::NormStyle;

use crate::host::norm::rms_norm;
use crate::host::placement::norm_on_host;
use crate::tensors::{host_f32, upload_owned};

/// Root-mean-square layer normalisation (Zhang & Sennrich 2019), as in Llama:
/// `y = x / sqrt(mean(x²) + eps) · weight`.
///
/// The statistic and the normalisation are computed in f32 (f64 for the statistic on the host)
/// whatever the input dtype, then cast back before the weight is applied (Hugging Face's
/// `LlamaRMSNorm` does the same), so f16 runs do not overflow in `x²`.
#[derive(Module, Debug)]
pub struct RmsNorm {
    /// Learned scale, `[dim]`.
    pub weight: Param<Tensor<1>>,
    /// Added to the mean square before the square root.
    pub eps: f64,
    /// `weight`'s values on the host, for [`RmsNorm::forward_host`].
    #[module(skip)]
    host_weight: Arc<Vec<f32>>,
    /// Gemma's `x̂·(1 + w)` ([`NormStyle::OnePlusWeight`]) instead of `x̂·w`.
    #[module(skip)]
    one_plus: bool,
    /// What [`RmsNorm::forward`] multiplies by, `[1, 1, dim]`: `weight` (`x̂·w`), or `1 + w` in
    /// f32 (Gemma's). Shaped once here because a reshape in every forward pass split Burn's fused
    /// norm on wgpu in two launches (the reduction and the product; docs/BENCHMARKS.md).
    #[module(skip)]
    row: Tensor<3>,
}

impl RmsNorm {
    /// The norm with learned scale `weight` (`[dim]`, in the compute dtype).
    pub fn new(weight: Param<Tensor<1>>, eps: f64) -> Self {
        Self::styled(weight, eps, NormStyle::Weight)
    }

    /// The norm with learned weight `weight` (`[dim]`, in the compute dtype) applied as `style`
    /// says: `x̂·w` as [`RmsNorm::new`], or Gemma's `x̂·(1 + w)` wholly in f32 and cast to the
    /// compute dtype at the end (`transformers` `Gemma3RMSNorm.forward`: `output * (1.0 +
    /// self.weight.float())`, the weight a value of the model's dtype).
    pub fn styled(weight: Param<Tensor<1>>, eps: f64, style: NormStyle) -> Self {
        let host_weight = Arc::new(host_f32(weight.val()));
        let one_plus = style == NormStyle::OnePlusWeight;
        let row = match one_plus {
            true => weight.val().cast(DType::F32).add_scalar(1.0).unsqueeze::<3>(),
            false => weight.val().unsqueeze::<3>(),
        };
        Self { weight, eps, host_weight, one_plus, row }
    }

    /// Whether [`RmsNorm::forward_host`] computes this norm (`x̂·w`; Gemma's runs as Burn ops).
    pub(crate) fn runs_on_host(&self) -> bool {
        !self.one_plus
    }

    /// # Shapes
    /// - `x`: `[batch, seq, dim]` → `[batch, seq, dim]`
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let dtype = x.dtype();
        if self.one_plus {
            let x32 = x.cast(DType::F32);
            let inv_rms = x32.clone().square().mean_dim(2).add_scalar(self.eps).sqrt().recip();
            return (x32 * inv_rms * self.row.clone()).cast(dtype);
        }
        if norm_on_host(&x.device(), dtype) {
            let (dims, device) = (x.dims(), x.device());
            let y = self.forward_host(&host_f32(x), dtype == DType::F16);
            return upload_owned(y, dims, dtype, &device);
        }
        let x32 = x.cast(DType::F32);
        let inv_rms = x32.clone().square().mean_dim(2).add_scalar(self.eps).sqrt().recip();
        (x32 * inv_rms).cast(dtype) * self.row.clone()
    }

    /// [`RmsNorm::forward`] on host values, rows of `dim` values of the compute dtype (f16 values
    /// when `f16`), with the statistic and roundings `host::norm::rms_norm` states.
    ///
    /// # Shapes
    /// - `x`: `[rows, dim]`, row-major → `[rows, dim]`
    ///
    /// # Panics
    /// For Gemma's style ([`RmsNorm::runs_on_host`] is false).
    pub(crate) fn forward_host(&self, x: &[f32], f16: bool) -> Vec<f32> {
        assert!(self.runs_on_host(), "RmsNorm::forward_host on a (1 + w) norm");
        rms_norm(x, &self.host_weight, self.eps, f16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::elem::round_f16;
    use crate::tensors::upload;
    use burn::tensor::Device;

    fn norm(weight: &[f32], dtype: DType, device: &Device) -> RmsNorm {
        RmsNorm::new(Param::from_tensor(upload(weight, [weight.len()], dtype, device)), 1e-5)
    }

    #[test]
    fn host_norm_is_the_f64_definition_within_f32_roundings() {
        let dim = 13;
        let x: Vec<f32> = (0..3 * dim).map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.37).collect();
        let w: Vec<f32> = (0..dim).map(|i| 0.5 + i as f32 * 0.1).collect();
        let y = norm(&w, DType::F32, &Device::flex()).forward_host(&x, false);
        for (r, (xs, ys)) in x.chunks(dim).zip(y.chunks(dim)).enumerate() {
            let ms = xs.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / dim as f64;
            for ((&xv, &yv), &wv) in xs.iter().zip(ys).zip(&w) {
                let want = f64::from(xv) / (ms + 1e-5).sqrt() * f64::from(wv);
                assert!((f64::from(yv) - want).abs() <= 4.0 * f64::from(f32::EPSILON) * want.abs(), "row {r}");
            }
        }
    }

    #[test]
    fn f16_norm_rounds_like_its_f16_tensor() {
        let dim = 24;
        let mut x: Vec<f32> = (0..2 * dim).map(|i| ((i * 7 % 19) as f32 - 9.0) * 31.7).collect();
        round_f16(&mut x);
        let mut w: Vec<f32> = (0..dim).map(|i| 0.9 + i as f32 * 0.013).collect();
        round_f16(&mut w);
        let y = norm(&w, DType::F16, &Device::flex()).forward_host(&x, true);
        let mut rounded = y.clone();
        round_f16(&mut rounded);
        assert_eq!(y, rounded, "outputs are f16 values");
        // The same through Burn's entry point on the CPU backend.
        let t = upload(&x, [1, 2, dim], DType::F16, &Device::flex());
        assert_eq!(host_f32(norm(&w, DType::F16, &Device::flex()).forward(t)), y);
    }
}
