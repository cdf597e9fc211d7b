//! Per-position drift metrics reduced on the device.
//!
//! The same definitions as [`crate::logprob::position_metrics`] (which is the reference these are
//! tested against), computed in f32 with Burn tensor operations on whatever device produced the
//! logits: log-softmax (stable: Burn subtracts the maximum), KL(P_ref ‖ P_var), reference
//! entropy, log-probabilities of the scored token, and top-1 agreement.

use burn::tensor::activation::log_softmax;
use burn::tensor::{DType, Int, Tensor, TensorData};

use crate::ScoreError;

/// Metrics of every position of a chunk, row-major `[batch, positions]`.
#[derive(Debug, Clone, PartialEq)]
pub struct DevicePositionMetrics {
    /// Rows (sequences) in the chunk.
    pub batch: usize,
    /// Positions per row.
    pub positions: usize,
    /// KL(P_ref ‖ P_var) in nats.
    pub kld: Vec<f32>,
    /// Whether the two argmaxes agree (first maximum on ties, as llama2.c).
    pub top1_agree: Vec<bool>,
    /// log P_ref(token).
    pub logp_ref_of_token: Vec<f32>,
    /// log P_var(token).
    pub logp_var_of_token: Vec<f32>,
    /// Entropy of P_ref in nats.
    pub ref_entropy: Vec<f32>,
}

/// Reduces reference and variant logits of the same positions to per-position metrics.
///
/// # Shapes
/// - `ref_logits`, `var_logits`: `[batch, positions, vocab]` (any float dtype; computed in f32)
/// - `tokens`: `batch * positions` token ids, row-major: the token scored at each position
/// - returns vectors of `batch * positions` values, row-major
pub fn position_metrics_on_device(
    ref_logits: Tensor<3>,
    var_logits: Tensor<3>,
    tokens: &[u32],
) -> Result<DevicePositionMetrics, ScoreError> {
    let [b, t, v] = ref_logits.dims();
    let var_dims = var_logits.dims();
    if var_dims != [b, t, v] {
        return Err(ScoreError::LengthMismatch {
            what: "reference and variant logits (elements)",
            left: b * t * v,
            right: var_dims.iter().product(),
        });
    }
    if tokens.len() != b * t {
        return Err(ScoreError::LengthMismatch {
            what: "tokens and logit positions",
            left: tokens.len(),
            right: b * t,
        });
    }
    if let Some(i) = tokens.iter().position(|&tok| tok as usize >= v) {
        return Err(ScoreError::OutOfRange { what: "token", index: tokens[i] as usize, limit: v });
    }
    let device = ref_logits.device();
    let agree = ref_logits.clone().argmax(2).equal(var_logits.clone().argmax(2)).int();
    let lr = log_softmax(ref_logits.cast(DType::F32), 2);
    let lv = log_softmax(var_logits.cast(DType::F32), 2);
    let pr = lr.clone().exp();
    let kld = (pr.clone() * (lr.clone() - lv.clone())).sum_dim(2);
    let entropy = (pr * lr.clone()).sum_dim(2).neg();
    let ids: Vec<i64> = tokens.iter().map(|&tok| i64::from(tok)).collect();
    let index: Tensor<3, Int> = Tensor::from_data(TensorData::new(ids, [b, t, 1]), &device);
    let lpr = lr.gather(2, index.clone());
    let lpv = lv.gather(2, index);

    let read = |what: &'static str, x: Tensor<3>| -> Result<Vec<f32>, ScoreError> {
        x.into_data()
            .convert::<f32>()
            .try_into_vec::<f32>()
            .map_err(|e| ScoreError::Device { what, message: format!("{e:?}") })
    };
    let agree = agree
        .into_data()
        .convert::<i64>()
        .try_into_vec::<i64>()
        .map_err(|e| ScoreError::Device { what: "top-1 agreement", message: format!("{e:?}") })?;
    Ok(DevicePositionMetrics {
        batch: b,
        positions: t,
        kld: read("KL divergence", kld)?,
        top1_agree: agree.into_iter().map(|a| a != 0).collect(),
        logp_ref_of_token: read("reference log-probabilities", lpr)?,
        logp_var_of_token: read("variant log-probabilities", lpv)?,
        ref_entropy: read("reference entropy", entropy)?,
    })
}

/// `ln p(token)` at every position: the log-softmax of `logits` (in f32, stable) gathered at the
/// scored tokens, for scoring one model on a given text (e.g. the reference on a variant's
/// continuation).
///
/// # Shapes
/// - `logits`: `[batch, positions, vocab]` (any float dtype; computed in f32)
/// - `tokens`: `batch * positions` token ids, row-major
/// - returns `batch * positions` values, row-major
pub fn token_logprobs_on_device(logits: Tensor<3>, tokens: &[u32]) -> Result<Vec<f32>, ScoreError> {
    let [b, t, v] = logits.dims();
    if tokens.len() != b * t {
        return Err(ScoreError::LengthMismatch {
            what: "tokens and logit positions",
            left: tokens.len(),
            right: b * t,
        });
    }
    if let Some(i) = tokens.iter().position(|&tok| tok as usize >= v) {
        return Err(ScoreError::OutOfRange { what: "token", index: tokens[i] as usize, limit: v });
    }
    let ids: Vec<i64> = tokens.iter().map(|&tok| i64::from(tok)).collect();
    let index: Tensor<3, Int> = Tensor::from_data(TensorData::new(ids, [b, t, 1]), &logits.device());
    let lp = log_softmax(logits.cast(DType::F32), 2).gather(2, index);
    lp.into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .map_err(|e| ScoreError::Device { what: "log-probabilities", message: format!("{e:?}") })
}
