//! RMSNorm (Zhang & Sennrich 2019), its statistic computed in f32 whatever the compute dtype, as
//! Hugging Face's `LlamaRMSNorm` does for half precision.

use burn::module::{Module, Param};
use burn::tensor::{DType, Tensor};

/// Root-mean-square layer normalisation (Zhang & Sennrich 2019), as in Llama:
/// `y = x / sqrt(mean(x²) + eps) · weight`.
///
/// The statistic and the normalisation are computed in f32 whatever the input dtype, then cast
/// back before the weight is applied (Hugging Face's `LlamaRMSNorm` does the same), so f16 runs
/// do not overflow in `x²`.
#[derive(Module, Debug)]
pub struct RmsNorm {
    /// Learned scale, `[dim]`.
    pub weight: Param<Tensor<1>>,
    /// Added to the mean square before the square root.
    pub eps: f64,
}

impl RmsNorm {
    /// # Shapes
    /// - `x`: `[batch, seq, dim]` → `[batch, seq, dim]`
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let dtype = x.dtype();
        let x32 = x.cast(DType::F32);
        let inv_rms = x32.clone().square().mean_dim(2).add_scalar(self.eps).sqrt().recip();
        (x32 * inv_rms).cast(dtype) * self.weight.val().unsqueeze::<3>()
    }
}
