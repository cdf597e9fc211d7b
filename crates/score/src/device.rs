//! Per-position drift metrics reduced on the device.
//!
//! The same definitions as [`crate::logprob::position_metrics`] (which is the reference these are
//! tested against), computed in f32 with Burn tensor operations on whatever device produced the
//! logits: log-softmax (stable: Burn subtracts the maximum), KL(P_ref ‖ P_var), reference
//! entropy, log-probabilities of the scored token, and top-1 agreement; and the compact
//! reference of [`crate::compact`] (top-K log-probabilities and a tail bucket per position,
//! [`compact_reference_on_device`]) with a variant's metrics against it
//! ([`position_metrics_against_compact`]). [`crate::host`] computes the same on logits in host
//! memory, without the full-size intermediates these materialize on Burn's CPU backend.

use burn::tensor::activation::log_softmax;
use burn::tensor::{DType, IndexingUpdateOp, Int, Tensor, TensorData};

use crate::ScoreError;
use crate::agreement::{TOP_K, TopKAgreement, compact_acceptance, top_k_agreement};
use crate::compact::compact_kl;

/// Metrics of every position of a chunk, row-major `[batch, positions]`.
#[derive(Debug, Clone, PartialEq)]
pub struct DevicePositionMetrics {
    /// Rows (sequences) in the chunk.
    pub batch: usize,
    /// Positions per row.
    pub positions: usize,
    /// KL(P_ref ‖ P_var) in nats.
    pub kld: Vec<f32>,
    /// KL(P_var ‖ P_ref) in nats.
    pub kld_reverse: Vec<f32>,
    /// Speculative sampling's acceptance `Σ min(p_ref, p_var)` ([`crate::agreement`]).
    pub accept: Vec<f32>,
    /// Where the two models' top-[`TOP_K`] lists agree.
    pub top_k: Vec<TopKAgreement>,
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
    check_tokens([b, t, v], tokens)?;
    let device = ref_logits.device();
    let agree = ref_logits.clone().argmax(2).equal(var_logits.clone().argmax(2)).int();
    let lr = log_softmax(ref_logits.cast(DType::F32), 2);
    let lv = log_softmax(var_logits.cast(DType::F32), 2);
    let (pr, pv) = (lr.clone().exp(), lv.clone().exp());
    let kld = (pr.clone() * (lr.clone() - lv.clone())).sum_dim(2);
    let kld_reverse = (pv.clone() * (lv.clone() - lr.clone())).sum_dim(2);
    let accept = pr.clone().min_pair(pv).sum_dim(2);
    let entropy = (pr * lr.clone()).sum_dim(2).neg();
    let index: Tensor<3, Int> = Tensor::from_data(TensorData::new(token_ids(tokens), [b, t, 1]), &device);
    let k = TOP_K.min(v);
    let top_ref = top_ids("reference top-K", lr.clone(), k)?;
    let top_var = top_ids("variant top-K", lv.clone(), k)?;
    let lpr = lr.gather(2, index.clone());
    let lpv = lv.gather(2, index);
    let agree = agree
        .into_data()
        .convert::<i64>()
        .try_into_vec::<i64>()
        .map_err(|e| ScoreError::Device { what: "top-1 agreement", message: format!("{e:?}") })?;
    Ok(DevicePositionMetrics {
        batch: b,
        positions: t,
        kld: read_f32("KL divergence", kld)?,
        kld_reverse: read_f32("reverse KL divergence", kld_reverse)?,
        accept: read_f32("acceptance", accept)?,
        top_k: top_ref.chunks_exact(k).zip(top_var.chunks_exact(k)).map(|(r, v)| top_k_agreement(r, v)).collect(),
        top1_agree: agree.into_iter().map(|a| a != 0).collect(),
        logp_ref_of_token: read_f32("reference log-probabilities", lpr)?,
        logp_var_of_token: read_f32("variant log-probabilities", lpv)?,
        ref_entropy: read_f32("reference entropy", entropy)?,
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
    check_tokens([b, t, v], tokens)?;
    let index: Tensor<3, Int> = Tensor::from_data(TensorData::new(token_ids(tokens), [b, t, 1]), &logits.device());
    read_f32("log-probabilities", log_softmax(logits.cast(DType::F32), 2).gather(2, index))
}

/// The reference's side of a chunk, kept compact ([`crate::compact`]): per position its top-K
/// log-probabilities and their token ids, the log of its tail mass, its entropy, its log p of the
/// scored token and its top-1 token. What a variant's metrics need, in `K + 5` numbers per
/// position instead of the vocabulary.
#[derive(Debug, Clone, PartialEq)]
pub struct CompactChunk {
    /// Rows (sequences) in the chunk.
    pub batch: usize,
    /// Positions per row.
    pub positions: usize,
    /// Tokens kept per position.
    pub k: usize,
    /// The top-K token ids per position, most probable first, lower id first among equal
    /// log-probabilities: `[batch, positions, k]` row-major. Which of several tokens tied at the
    /// K-th place are kept: the lowest ids on the host ([`crate::host`]); on the device, the
    /// backend sort's choice (flex's sort is unstable).
    pub top_ids: Vec<u32>,
    /// Their log-probabilities: `[batch, positions, k]`.
    pub top_logp: Vec<f32>,
    /// `ln p_tail` (log-sum-exp of every other token's log-probability): `[batch, positions]`.
    pub tail_logp: Vec<f32>,
    /// Entropy of the full distribution, in nats: `[batch, positions]`.
    pub entropy: Vec<f32>,
    /// log P(scored token): `[batch, positions]`.
    pub logp_of_token: Vec<f32>,
    /// The first maximum of the logits (top-1 token, as llama2.c): `[batch, positions]`.
    pub argmax: Vec<u32>,
}

impl CompactChunk {
    /// One row of no positions yet, `k` tokens kept per position, with room for `positions`: a
    /// prompt's statistics, grown position by position with [`CompactChunk::extend_row`].
    pub fn empty_row(k: usize, positions: usize) -> CompactChunk {
        CompactChunk::with_capacity(1, 0, k, positions)
    }

    /// No rows yet, of `positions` positions each and `k` tokens kept per position, with room for
    /// `rows` rows: a chunk assembled row by row with [`CompactChunk::push_row`].
    pub fn empty_rows(positions: usize, k: usize, rows: usize) -> CompactChunk {
        CompactChunk::with_capacity(0, positions, k, rows * positions)
    }

    fn with_capacity(batch: usize, positions: usize, k: usize, capacity: usize) -> CompactChunk {
        CompactChunk {
            batch,
            positions,
            k,
            top_ids: Vec::with_capacity(capacity * k),
            top_logp: Vec::with_capacity(capacity * k),
            tail_logp: Vec::with_capacity(capacity),
            entropy: Vec::with_capacity(capacity),
            logp_of_token: Vec::with_capacity(capacity),
            argmax: Vec::with_capacity(capacity),
        }
    }

    /// Appends positions `range` of row `row` of `from` to this one-row chunk's positions.
    ///
    /// # Panics
    /// When this chunk has another number of rows than one, `from` keeps another K, or `row` and
    /// `range` do not lie inside `from`.
    pub fn extend_row(&mut self, from: &CompactChunk, row: usize, range: std::ops::Range<usize>) {
        assert_eq!(self.batch, 1, "extend_row appends to a chunk of one row");
        self.positions += range.len();
        self.append(from, row, range);
    }

    /// Appends positions `range` of row `row` of `from` as this chunk's next row.
    ///
    /// # Panics
    /// When `range` is not as long as this chunk's rows, `from` keeps another K, or `row` and
    /// `range` do not lie inside `from`.
    pub fn push_row(&mut self, from: &CompactChunk, row: usize, range: std::ops::Range<usize>) {
        assert_eq!(range.len(), self.positions, "push_row appends a row of the chunk's positions");
        self.batch += 1;
        self.append(from, row, range);
    }

    /// Copies positions `range` of row `row` of `from` to the end of every vector (row-major, so
    /// they continue the last row or start a new one alike).
    fn append(&mut self, from: &CompactChunk, row: usize, range: std::ops::Range<usize>) {
        assert_eq!(self.k, from.k, "chunks of different top-K");
        assert!(row < from.batch && range.end <= from.positions, "positions outside the chunk");
        let k = self.k;
        let (a, b) = (row * from.positions + range.start, row * from.positions + range.end);
        self.top_ids.extend_from_slice(&from.top_ids[a * k..b * k]);
        self.top_logp.extend_from_slice(&from.top_logp[a * k..b * k]);
        self.tail_logp.extend_from_slice(&from.tail_logp[a..b]);
        self.entropy.extend_from_slice(&from.entropy[a..b]);
        self.logp_of_token.extend_from_slice(&from.logp_of_token[a..b]);
        self.argmax.extend_from_slice(&from.argmax[a..b]);
    }
}

/// `ln Σ_{i ∉ ids} exp(logp_i)`, the tail's log-mass, as a masked log-sum-exp.
///
/// # Shapes
/// - `logp`: `[batch, positions, vocab]` f32; `ids`: `[batch, positions, k]`, distinct per
///   position, `k < vocab`
/// - returns `[batch, positions, 1]`
fn tail_log_sum_exp(logp: Tensor<3>, ids: Tensor<3, Int>) -> Tensor<3> {
    let [b, t, k] = ids.dims();
    let minus_inf = Tensor::full([b, t, k], f32::NEG_INFINITY, &logp.device());
    let masked = logp.scatter(2, ids, minus_inf, IndexingUpdateOp::Assign);
    let max = masked.clone().max_dim(2);
    max.clone() + (masked - max).exp().sum_dim(2).log()
}

/// Checks that `tokens` give one id below the vocabulary per position of a `[batch, positions,
/// vocab]` chunk.
pub(crate) fn check_tokens(dims: [usize; 3], tokens: &[u32]) -> Result<(), ScoreError> {
    let [b, t, v] = dims;
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
    Ok(())
}

/// Checks a chunk's shape against its tokens and a top-K.
pub(crate) fn check_chunk(dims: [usize; 3], tokens: &[u32], k: usize) -> Result<(), ScoreError> {
    let v = dims[2];
    check_tokens(dims, tokens)?;
    if k == 0 {
        return Err(ScoreError::Zero { what: "the reference's top-K" });
    }
    if k >= v {
        // A top-K that covers the vocabulary is the exact path's job.
        return Err(ScoreError::OutOfRange { what: "the reference's top-K", index: k, limit: v });
    }
    Ok(())
}

/// Checks a compact reference against the `[batch, positions, vocab]` chunk of a variant: the same
/// positions, every per-position vector of its length, every top-K id below the vocabulary.
pub(crate) fn check_compact(reference: &CompactChunk, dims: [usize; 3]) -> Result<(), ScoreError> {
    let [b, t, v] = dims;
    let (n, k) = (b * t, reference.k);
    if (reference.batch, reference.positions) != (b, t) || reference.top_ids.len() != n * k {
        return Err(ScoreError::LengthMismatch {
            what: "compact reference and variant positions",
            left: reference.top_ids.len(),
            right: n * k,
        });
    }
    for (what, len, want) in [
        ("compact reference top-K log-probabilities", reference.top_logp.len(), n * k),
        ("compact reference tail log-masses", reference.tail_logp.len(), n),
        ("compact reference entropies", reference.entropy.len(), n),
        ("compact reference log-probabilities of the tokens", reference.logp_of_token.len(), n),
        ("compact reference top-1 tokens", reference.argmax.len(), n),
    ] {
        if len != want {
            return Err(ScoreError::LengthMismatch { what, left: len, right: want });
        }
    }
    if let Some(&id) = reference.top_ids.iter().find(|&&id| id as usize >= v) {
        return Err(ScoreError::OutOfRange { what: "top-K token", index: id as usize, limit: v });
    }
    Ok(())
}

fn read_f32(what: &'static str, x: Tensor<3>) -> Result<Vec<f32>, ScoreError> {
    x.into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .map_err(|e| ScoreError::Device { what, message: format!("{e:?}") })
}

fn read_ids(what: &'static str, x: Tensor<3, Int>) -> Result<Vec<u32>, ScoreError> {
    let ids = x
        .into_data()
        .convert::<i64>()
        .try_into_vec::<i64>()
        .map_err(|e| ScoreError::Device { what, message: format!("{e:?}") })?;
    ids.into_iter()
        .map(|i| u32::try_from(i).map_err(|_| ScoreError::Device { what, message: format!("index {i} out of range") }))
        .collect()
}

/// Reduces the reference's logits of a chunk to its [`CompactChunk`].
///
/// # Shapes
/// - `ref_logits`: `[batch, positions, vocab]` (any float dtype; computed in f32)
/// - `tokens`: `batch * positions` token ids, row-major: the token scored at each position
/// - `1 ≤ k < vocab`
pub fn compact_reference_on_device(
    ref_logits: Tensor<3>,
    tokens: &[u32],
    k: usize,
) -> Result<CompactChunk, ScoreError> {
    let [b, t, v] = ref_logits.dims();
    check_chunk([b, t, v], tokens, k)?;
    let device = ref_logits.device();
    let argmax = ref_logits.clone().argmax(2);
    let lr = log_softmax(ref_logits.cast(DType::F32), 2);
    let entropy = (lr.clone().exp() * lr.clone()).sum_dim(2).neg();
    let index: Tensor<3, Int> = Tensor::from_data(TensorData::new(token_ids(tokens), [b, t, 1]), &device);
    // Read before `tail_log_sum_exp` scatters into `lr`: under Burn's fusion on wgpu (0.22.1) a
    // gather still pending when a scatter consumes its source read other values (measured: log p
    // of −8.9 for −0.03; ARCHITECTURE.md, "Fusion and autotune on wgpu").
    let logp_of_token = read_f32("reference log-probabilities", lr.clone().gather(2, index))?;
    let (top_logp, top_ids) = lr.clone().topk_with_indices(k, 2);
    let tail = tail_log_sum_exp(lr, top_ids.clone());
    let top_logp = read_f32("top-K log-probabilities", top_logp)?;
    let mut top_ids = read_ids("top-K token ids", top_ids)?;
    order_ties_by_id(&top_logp, &mut top_ids, k);
    Ok(CompactChunk {
        batch: b,
        positions: t,
        k,
        top_ids,
        top_logp,
        tail_logp: read_f32("tail log-mass", tail)?,
        entropy: read_f32("reference entropy", entropy)?,
        logp_of_token,
        argmax: read_ids("reference top-1", argmax)?,
    })
}

/// Puts the ids of equal log-probabilities in increasing order within each position's top-K:
/// Burn's top-K leaves the order of ties to the backend's sort (flex's is unstable), the
/// documented order is most probable first, lower id first on ties (as [`crate::host`]).
fn order_ties_by_id(top_logp: &[f32], top_ids: &mut [u32], k: usize) {
    for (logp, ids) in top_logp.chunks_exact(k).zip(top_ids.chunks_exact_mut(k)) {
        let mut start = 0;
        while start < k {
            let run = logp[start..].iter().take_while(|&&l| l == logp[start]).count().max(1);
            ids[start..start + run].sort_unstable();
            start += run;
        }
    }
}

/// A variant's per-position metrics against the reference's [`CompactChunk`] of the same
/// positions: KL as [`crate::compact::compact_kl`] (a lower bound of the exact KL; the sums run
/// on the host in f64), top-1 agreement, both log p of the scored token and the reference's
/// entropy (exact: they were kept).
///
/// # Shapes
/// - `reference`: `[batch, positions]` positions with `k` tokens each
/// - `var_logits`: `[batch, positions, vocab]` (any float dtype; computed in f32)
/// - `tokens`: `batch * positions` token ids, row-major
pub fn position_metrics_against_compact(
    reference: &CompactChunk,
    var_logits: Tensor<3>,
    tokens: &[u32],
) -> Result<DevicePositionMetrics, ScoreError> {
    let [b, t, v] = var_logits.dims();
    check_chunk([b, t, v], tokens, reference.k)?;
    check_compact(reference, [b, t, v])?;
    let k = reference.k;
    let n = b * t;
    let device = var_logits.device();
    let argmax = read_ids("variant top-1", var_logits.clone().argmax(2))?;
    let lv = log_softmax(var_logits.cast(DType::F32), 2);
    let ids: Vec<i64> = reference.top_ids.iter().map(|&i| i64::from(i)).collect();
    let ids: Tensor<3, Int> = Tensor::from_data(TensorData::new(ids, [b, t, k]), &device);
    let index: Tensor<3, Int> = Tensor::from_data(TensorData::new(token_ids(tokens), [b, t, 1]), &device);
    let lpv = read_f32("variant log-probabilities", lv.clone().gather(2, index))?;
    let top_q = read_f32("variant top-K log-probabilities", lv.clone().gather(2, ids.clone()))?;
    let var_k = TOP_K.min(v);
    let top_var = top_ids("variant top-K", lv.clone(), var_k)?;
    let tail_q = read_f32("variant tail log-mass", tail_log_sum_exp(lv, ids))?;
    let widen = |x: &[f32]| x.iter().map(|&v| f64::from(v)).collect::<Vec<f64>>();
    let (mut kld, mut kld_reverse, mut accept, mut top_k) =
        (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        let (p, q) = (widen(&reference.top_logp[i * k..(i + 1) * k]), widen(&top_q[i * k..(i + 1) * k]));
        let (tail_p, tail_q) = (f64::from(reference.tail_logp[i]), f64::from(tail_q[i]));
        kld.push(compact_kl(&p, tail_p, &q, tail_q)? as f32);
        kld_reverse.push(compact_kl(&q, tail_q, &p, tail_p)? as f32);
        accept.push(compact_acceptance(&p, tail_p, &q, tail_q)? as f32);
        top_k.push(top_k_agreement(&reference.top_ids[i * k..(i + 1) * k], &top_var[i * var_k..(i + 1) * var_k]));
    }
    Ok(DevicePositionMetrics {
        batch: b,
        positions: t,
        kld,
        kld_reverse,
        accept,
        top_k,
        top1_agree: reference.argmax.iter().zip(&argmax).map(|(r, v)| r == v).collect(),
        logp_ref_of_token: reference.logp_of_token.clone(),
        logp_var_of_token: lpv,
        ref_entropy: reference.entropy.clone(),
    })
}

/// The `k` largest values' ids along the last axis, largest first, lower id first among equal
/// values (Burn's top-K, its ties put in id order), `[batch · positions · k]` row-major.
///
/// # Shapes
/// - `x`: `[batch, positions, vocab]`, `k ≤ vocab`
fn top_ids(what: &'static str, x: Tensor<3>, k: usize) -> Result<Vec<u32>, ScoreError> {
    let (values, ids) = x.topk_with_indices(k, 2);
    let values = read_f32(what, values)?;
    let mut ids = read_ids(what, ids)?;
    order_ties_by_id(&values, &mut ids, k);
    Ok(ids)
}

fn token_ids(tokens: &[u32]) -> Vec<i64> {
    tokens.iter().map(|&tok| i64::from(tok)).collect()
}

#[cfg(test)]
mod tests {
    use super::CompactChunk;

    /// A chunk of `batch` rows of `positions` positions, K = 2, whose values number the
    /// positions (row-major) so that each copied value shows where it came from.
    fn numbered(batch: usize, positions: usize) -> CompactChunk {
        let n = batch * positions;
        let f = |i: usize| i as f32;
        CompactChunk {
            batch,
            positions,
            k: 2,
            top_ids: (0..2 * n as u32).collect(),
            top_logp: (0..2 * n).map(f).collect(),
            tail_logp: (0..n).map(f).collect(),
            entropy: (0..n).map(f).collect(),
            logp_of_token: (0..n).map(f).collect(),
            argmax: (0..n as u32).collect(),
        }
    }

    /// A prompt's statistics grown position by position from chunks, then cut back into a chunk
    /// of several rows, hold the values of the positions they name.
    #[test]
    fn rows_extend_and_push_as_their_positions_say() {
        let chunk = numbered(2, 3);
        let mut row = CompactChunk::empty_row(2, 4);
        row.extend_row(&chunk, 1, 0..1);
        row.extend_row(&chunk, 1, 1..3);
        assert_eq!((row.batch, row.positions), (1, 3));
        assert_eq!(row.argmax, vec![3, 4, 5]);
        assert_eq!(row.top_ids, vec![6, 7, 8, 9, 10, 11]);
        let mut rows = CompactChunk::empty_rows(2, 2, 2);
        rows.push_row(&row, 0, 1..3);
        rows.push_row(&chunk, 0, 0..2);
        assert_eq!((rows.batch, rows.positions), (2, 2));
        assert_eq!(rows.tail_logp, vec![4.0, 5.0, 0.0, 1.0]);
        assert_eq!(rows.top_logp, vec![8.0, 9.0, 10.0, 11.0, 0.0, 1.0, 2.0, 3.0]);
    }
}
