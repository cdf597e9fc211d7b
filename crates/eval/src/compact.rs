//! The reference scored once: its compact statistics on its own text ([`CompactReference`]),
//! computed in one teacher-forced pass and kept on the host for every variant, instead of its
//! full-vocabulary logits (or a lockstep rerun of the reference per variant).
//!
//! Per position it keeps the top-K log-probabilities and their tokens, the tail's log-mass, the
//! entropy, log p of the scored token and the top-1 token (`qdrift_score::compact` defines them):
//! `K + 5` numbers, 8.4 MB for SmolLM2 at 16 prompts × 1000 tokens × K = 64, where its logits
//! would be 3.1 GB. Variants' KL divergence against it is the top-K + tail lower bound of the
//! exact KL; every other metric is exact.
//!
//! **Invariant: the statistics are stored per prompt and position, independent of how the run
//! was batched or chunked; a chunk is reassembled from them for any batching.**

use qdrift_generate::{StepLogits, teacher_forced};
use qdrift_model::Llama;
use qdrift_score::{CompactChunk, compact_reference_on_host, greedy_tokens_on_host};
use serde::{Deserialize, Serialize};

use crate::plan::Plan;
use crate::run::ProgressFn;
use crate::scoring::{Texts, generate_all_map};
use crate::{EvalError, REFERENCE_NAME};

/// The compact statistics of one prompt's continuation, position-major.
#[derive(Clone, Debug, PartialEq)]
pub struct PromptStats {
    /// Top-K token ids per position, most probable first: `[positions, k]`.
    pub top_ids: Vec<u32>,
    /// Their log-probabilities: `[positions, k]`.
    pub top_logp: Vec<f32>,
    /// Log of the tail mass: `[positions]`.
    pub tail_logp: Vec<f32>,
    /// Entropy in nats: `[positions]`.
    pub entropy: Vec<f32>,
    /// log p of the continuation's token: `[positions]`.
    pub logp_of_token: Vec<f32>,
    /// Top-1 token: `[positions]`.
    pub argmax: Vec<u32>,
}

impl PromptStats {
    fn with_capacity(positions: usize, k: usize) -> PromptStats {
        PromptStats {
            top_ids: Vec::with_capacity(positions * k),
            top_logp: Vec::with_capacity(positions * k),
            tail_logp: Vec::with_capacity(positions),
            entropy: Vec::with_capacity(positions),
            logp_of_token: Vec::with_capacity(positions),
            argmax: Vec::with_capacity(positions),
        }
    }

    /// Positions held.
    pub fn positions(&self) -> usize {
        self.tail_logp.len()
    }

    /// Appends row `row` of `c` (its `c.positions` positions).
    fn push_row(&mut self, c: &CompactChunk, row: usize) {
        let (k, a, b) = (c.k, row * c.positions, (row + 1) * c.positions);
        self.top_ids.extend_from_slice(&c.top_ids[a * k..b * k]);
        self.top_logp.extend_from_slice(&c.top_logp[a * k..b * k]);
        self.tail_logp.extend_from_slice(&c.tail_logp[a..b]);
        self.entropy.extend_from_slice(&c.entropy[a..b]);
        self.logp_of_token.extend_from_slice(&c.logp_of_token[a..b]);
        self.argmax.extend_from_slice(&c.argmax[a..b]);
    }
}

/// The reference's compact statistics on its own text, for every prompt.
#[derive(Clone, Debug, PartialEq)]
pub struct CompactReference {
    /// Tokens kept per position.
    pub k: usize,
    /// One entry per prompt, in prompt order.
    pub prompts: Vec<PromptStats>,
}

/// The tail mass of one prompt's positions: their sum, largest value and count.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TailSums {
    /// Σ `p_tail` over the prompt's positions, summed in position order.
    pub sum: f64,
    /// Largest `p_tail`.
    pub max: f64,
    /// Positions.
    pub positions: usize,
}

/// The tail mass over every kept position: its largest and mean value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TailMass {
    /// Largest `p_tail`.
    pub max: f64,
    /// Mean `p_tail` over positions.
    pub mean: f64,
}

impl TailSums {
    /// The tail mass over all prompts, summed in prompt order (so a run and the merge of its
    /// shards give the same bits).
    pub fn total(prompts: &[TailSums]) -> TailMass {
        let (mut max, mut sum, mut n) = (0.0f64, 0.0f64, 0usize);
        for p in prompts {
            max = max.max(p.max);
            sum += p.sum;
            n += p.positions;
        }
        TailMass { max, mean: if n == 0 { 0.0 } else { sum / n as f64 } }
    }
}

impl CompactReference {
    /// Teacher-forces `reference` on `text` (batched and chunked as the plan says) and keeps each
    /// position's top-`k` statistics.
    pub(crate) fn compute(
        reference: &Llama,
        plan: &Plan,
        text: &Texts,
        k: usize,
    ) -> Result<CompactReference, EvalError> {
        let mut prompts: Vec<PromptStats> = text.iter().map(|(_, c)| PromptStats::with_capacity(c.len(), k)).collect();
        // Chunks may arrive out of order when batches run side by side; keep them by position.
        let mut chunks: Vec<(usize, usize, CompactChunk)> = Vec::new();
        let mut failure: Option<EvalError> = None;
        let reduce = crate::reduce::Reduce::for_plan(plan);
        teacher_forced(reference, &plan.device, text, plan.batch_size(), plan.chunk, |f| {
            if failure.is_some() {
                return;
            }
            let [rows, positions, _] = f.logits.dims();
            let tokens = crate::scoring::chunk_tokens(text, f.first_prompt, f.start, rows, positions);
            match reduce.compact(f.logits, &tokens, k) {
                Ok(c) => chunks.push((f.first_prompt, f.start, c)),
                Err(e) => failure = Some(e),
            }
        })?;
        if let Some(e) = failure {
            return Err(e);
        }
        chunks.sort_by_key(|(p, s, _)| (*p, *s));
        for (first_prompt, _, c) in chunks {
            for row in 0..c.batch {
                prompts[first_prompt + row].push_row(&c, row);
            }
        }
        let reference = CompactReference { k, prompts };
        reference.check(text)?;
        Ok(reference)
    }

    /// Lets `reference` generate (as [`generate_all`]) and keeps each decoding step's top-`k`
    /// statistics, scored on the step's top-1 token: its greedy continuations, and its
    /// statistics on them without a teacher-forced pass. For a reference whose decoding steps
    /// compute what teacher forcing computes ([`Llama::steps_match_teacher_forcing`]), reduced
    /// on the host; the statistics are then bit for bit those of [`CompactReference::compute`].
    ///
    /// The statistics are `None` when a step's top-1 token (the first largest logit) is not the
    /// token generation picked, which the shared argmax rule should rule out: the caller then
    /// teacher-forces instead.
    pub(crate) fn from_decoding(
        reference: &Llama,
        plan: &Plan,
        k: usize,
        progress: &mut ProgressFn<'_>,
    ) -> Result<(Vec<Vec<u32>>, Option<CompactReference>), EvalError> {
        let mut prompts: Vec<PromptStats> =
            plan.prompts.iter().map(|_| PromptStats::with_capacity(plan.longest(), k)).collect();
        let mut failure: Option<EvalError> = None;
        let reduce = |s: StepLogits<'_>| -> Result<CompactChunk, EvalError> {
            let [rows, vocab] = s.logits.dims();
            let values = s.logits.to_data().try_into_vec::<f32>().map_err(|e| {
                EvalError::Internal(format!("step logits [{rows}, {vocab}] do not read back as f32: {e:?}"))
            })?;
            let tokens = greedy_tokens_on_host(&values, rows, vocab)?;
            Ok(compact_reference_on_host(&values, [rows, 1, vocab], &tokens, k)?)
        };
        let tokens = generate_all_map(reference, REFERENCE_NAME, plan, progress, reduce, |first, step, c| {
            match c {
                Ok(c) if failure.is_none() => {
                    for row in 0..c.batch {
                        let p = &mut prompts[first + row];
                        // A batch's steps reach here in order.
                        if p.positions() != step {
                            failure = Some(EvalError::Internal(format!(
                                "prompt {}: decoding step {step} after {} positions",
                                first + row + 1,
                                p.positions()
                            )));
                            return;
                        }
                        p.push_row(&c, row);
                    }
                }
                Err(e) if failure.is_none() => failure = Some(e),
                _ => {}
            }
        })?;
        if let Some(e) = failure {
            return Err(e);
        }
        let reference = CompactReference { k, prompts };
        let text: Texts = plan.prompts.iter().cloned().zip(tokens.iter().cloned()).collect();
        reference.check(&text)?;
        let agrees = reference.prompts.iter().zip(&tokens).all(|(p, t)| p.argmax == *t);
        Ok((tokens, agrees.then_some(reference)))
    }

    /// Refuses statistics that do not cover `text` position for position.
    pub(crate) fn check(&self, text: &Texts) -> Result<(), EvalError> {
        if self.prompts.len() != text.len() {
            return Err(EvalError::Internal(format!(
                "compact reference holds {} prompts, the run has {}",
                self.prompts.len(),
                text.len()
            )));
        }
        for (i, (p, (_, c))) in self.prompts.iter().zip(text).enumerate() {
            let n = c.len();
            let ok = p.positions() == n
                && p.top_ids.len() == n * self.k
                && p.top_logp.len() == n * self.k
                && p.entropy.len() == n
                && p.logp_of_token.len() == n
                && p.argmax.len() == n;
            if !ok {
                return Err(EvalError::Internal(format!(
                    "compact reference of prompt {} holds {} positions, its continuation {n}",
                    i + 1,
                    p.positions()
                )));
            }
        }
        Ok(())
    }

    /// The statistics of `rows` prompts from `first_prompt`, positions `start..start + positions`,
    /// as one chunk (`[rows, positions]` row-major).
    pub(crate) fn chunk(&self, first_prompt: usize, rows: usize, start: usize, positions: usize) -> CompactChunk {
        let k = self.k;
        let mut c = CompactChunk {
            batch: rows,
            positions,
            k,
            top_ids: Vec::with_capacity(rows * positions * k),
            top_logp: Vec::with_capacity(rows * positions * k),
            tail_logp: Vec::with_capacity(rows * positions),
            entropy: Vec::with_capacity(rows * positions),
            logp_of_token: Vec::with_capacity(rows * positions),
            argmax: Vec::with_capacity(rows * positions),
        };
        let (a, b) = (start, start + positions);
        for p in &self.prompts[first_prompt..first_prompt + rows] {
            c.top_ids.extend_from_slice(&p.top_ids[a * k..b * k]);
            c.top_logp.extend_from_slice(&p.top_logp[a * k..b * k]);
            c.tail_logp.extend_from_slice(&p.tail_logp[a..b]);
            c.entropy.extend_from_slice(&p.entropy[a..b]);
            c.logp_of_token.extend_from_slice(&p.logp_of_token[a..b]);
            c.argmax.extend_from_slice(&p.argmax[a..b]);
        }
        c
    }

    /// Each prompt's tail mass (the share of the reference's probability the top K do not
    /// hold, where the KL bound can lose divergence): sum, largest value, positions.
    pub fn tail_sums(&self) -> Vec<TailSums> {
        self.prompts
            .iter()
            .map(|p| {
                let (mut max, mut sum) = (0.0f64, 0.0f64);
                for l in &p.tail_logp {
                    let m = f64::from(*l).exp();
                    max = max.max(m);
                    sum += m;
                }
                TailSums { sum, max, positions: p.tail_logp.len() }
            })
            .collect()
    }
}
