//! Where a teacher-forced chunk's logits are reduced to per-position values: on the host for the
//! CPU backend (`qdrift_score`'s `*_on_host`: one pass per row, no full-size temporaries), on the
//! device elsewhere (`*_on_device`: only `[batch, positions]` values leave a GPU).
//!
//! On the CPU backend the device reductions materialize several `[batch, chunk, vocab]` f32
//! intermediates (SmolLM2: 64 MB each) per chunk and model; the host reductions compute the same
//! definitions (tested against each other in `qdrift-score`) from one read-back copy.

use burn::tensor::Tensor;
use qdrift_score::{
    CompactChunk, DevicePositionMetrics, compact_reference_on_device, compact_reference_on_host,
    position_metrics_against_compact, position_metrics_against_compact_on_host, position_metrics_on_device,
    position_metrics_on_host, token_logprobs_on_device, token_logprobs_on_host,
};

use crate::check::plan::Plan;
use crate::error::EvalError;

/// Where a run reduces its logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reduce {
    /// On the host, from the logits read back (the CPU backend, whose tensors are host memory).
    Host,
    /// On the device.
    Device,
}

impl Reduce {
    /// [`Reduce::Host`] on the CPU (flex) backend, else [`Reduce::Device`]: the rule the model's
    /// host kernels follow (`LinearKernel::for_device`, `RoundingPath::for_device`).
    pub fn for_plan(plan: &Plan) -> Self {
        if plan.device.device == burn::tensor::Device::flex() { Reduce::Host } else { Reduce::Device }
    }

    /// KL, top-1 agreement, both log p of the scored token and the reference's entropy per
    /// position.
    ///
    /// # Shapes
    /// - `reference`, `variant`: `[batch, positions, vocab]` f32; `tokens`: `batch × positions`
    pub fn position_metrics(
        self,
        reference: Tensor<3>,
        variant: Tensor<3>,
        tokens: &[u32],
    ) -> Result<DevicePositionMetrics, EvalError> {
        Ok(match self {
            Reduce::Host => {
                let (r, dims) = host_values(reference)?;
                position_metrics_on_host(&r, &host_values(variant)?.0, dims, tokens)?
            }
            Reduce::Device => position_metrics_on_device(reference, variant, tokens)?,
        })
    }

    /// The variant's metrics against the reference's compact top-K statistics.
    ///
    /// # Shapes
    /// - `variant`: `[batch, positions, vocab]` f32; `tokens`: `batch × positions`
    pub fn against_compact(
        self,
        reference: &CompactChunk,
        variant: Tensor<3>,
        tokens: &[u32],
    ) -> Result<DevicePositionMetrics, EvalError> {
        Ok(match self {
            Reduce::Host => {
                let (v, dims) = host_values(variant)?;
                position_metrics_against_compact_on_host(reference, &v, dims, tokens)?
            }
            Reduce::Device => position_metrics_against_compact(reference, variant, tokens)?,
        })
    }

    /// log p of each scored token.
    ///
    /// # Shapes
    /// - `logits`: `[batch, positions, vocab]` f32; `tokens` and the result: `batch × positions`
    pub fn token_logprobs(self, logits: Tensor<3>, tokens: &[u32]) -> Result<Vec<f32>, EvalError> {
        Ok(match self {
            Reduce::Host => {
                let (l, dims) = host_values(logits)?;
                token_logprobs_on_host(&l, dims, tokens)?
            }
            Reduce::Device => token_logprobs_on_device(logits, tokens)?,
        })
    }

    /// The reference's compact top-`k` statistics of a chunk.
    ///
    /// # Shapes
    /// - `logits`: `[batch, positions, vocab]` f32; `tokens`: `batch × positions`
    pub fn compact(self, logits: Tensor<3>, tokens: &[u32], k: usize) -> Result<CompactChunk, EvalError> {
        Ok(match self {
            Reduce::Host => {
                let (l, dims) = host_values(logits)?;
                compact_reference_on_host(&l, dims, tokens, k)?
            }
            Reduce::Device => compact_reference_on_device(logits, tokens, k)?,
        })
    }
}

/// A logits tensor's values, row-major, and its dims: moved out of the tensor without a copy when
/// it is the only handle on its buffer (the logits a pass hands over are).
fn host_values(t: Tensor<3>) -> Result<(Vec<f32>, [usize; 3]), EvalError> {
    let dims = t.dims();
    let values = t
        .into_data()
        .try_into_vec::<f32>()
        .map_err(|e| EvalError::Internal(format!("logits {dims:?} do not read back as f32: {e:?}")))?;
    Ok((values, dims))
}
