//! The reference scored once: its compact statistics on its own text ([`CompactReference`]),
//! computed in one teacher-forced pass ([`CompactReference::compute`]) or from its decoding steps
//! (`reference.rs`) and kept on the host for every variant, instead of its full-vocabulary logits
//! (or a lockstep rerun of the reference per variant).
//!
//! Per position it keeps the top-K log-probabilities and their tokens, the tail's log-mass, the
//! entropy, log p of the scored token and the top-1 token (`qdrift_score::compact` defines them):
//! `K + 5` numbers, 8.4 MB for SmolLM2 at 16 prompts × 1000 tokens × K = 64, where its logits
//! would be 3.1 GB. Variants' KL divergence against it is the top-K + tail lower bound of the
//! exact KL; every other metric is exact.
//!
//! Each prompt's statistics are a [`CompactChunk`] of one row: the type `qdrift_score` reduces a
//! chunk of logits to, so a chunk's rows are appended to the prompts' and a chunk of any batching
//! is cut back out of them ([`CompactReference::chunk`]) without a conversion.
//!
//! **Invariant: the statistics are stored per prompt and position, independent of how the run
//! was batched or chunked; a chunk is reassembled from them for any batching.**

use qdrift_generate::teacher_forced;
use qdrift_model::Llama;
use qdrift_score::CompactChunk;

use crate::check::plan::Plan;
use crate::error::EvalError;
use crate::run::reduce::Reduce;
use crate::run::texts::{Texts, chunk_tokens};
use crate::trace::CompactReference;
use crate::types::TailSums;

impl CompactReference {
    /// Teacher-forces `reference` on `text` (batched and chunked as the plan says) and keeps each
    /// position's top-`k` statistics.
    pub(crate) fn compute(
        reference: &Llama,
        plan: &Plan,
        text: &Texts,
        k: usize,
    ) -> Result<CompactReference, EvalError> {
        let mut prompts: Vec<CompactChunk> = text.iter().map(|(_, c)| CompactChunk::empty_row(k, c.len())).collect();
        // Chunks may arrive out of order when batches run side by side; keep them by position.
        let mut chunks: Vec<(usize, usize, CompactChunk)> = Vec::new();
        let mut failure: Option<EvalError> = None;
        let reduce = Reduce::for_plan(plan);
        teacher_forced(reference, plan.forcing(text), |f| {
            if failure.is_some() {
                return;
            }
            let [rows, positions, _] = f.logits.dims();
            let tokens = chunk_tokens(text, f.first_prompt, f.start, rows, positions);
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
                prompts[first_prompt + row].extend_row(&c, row, 0..c.positions);
            }
        }
        let reference = CompactReference { k, prompts };
        reference.check(text)?;
        Ok(reference)
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
            let ok = (p.batch, p.positions, p.k) == (1, n, self.k)
                && p.tail_logp.len() == n
                && p.top_ids.len() == n * self.k
                && p.top_logp.len() == n * self.k
                && p.entropy.len() == n
                && p.logp_of_token.len() == n
                && p.argmax.len() == n;
            if !ok {
                return Err(EvalError::Internal(format!(
                    "compact reference of prompt {} holds {} positions, its continuation {n}",
                    i + 1,
                    p.tail_logp.len()
                )));
            }
        }
        Ok(())
    }

    /// The statistics of `rows` prompts from `first_prompt`, positions `start..start + positions`,
    /// as one chunk (`[rows, positions]` row-major).
    pub(crate) fn chunk(&self, first_prompt: usize, rows: usize, start: usize, positions: usize) -> CompactChunk {
        let mut c = CompactChunk::empty_rows(positions, self.k, rows);
        for p in &self.prompts[first_prompt..first_prompt + rows] {
            c.push_row(p, 0, start..start + positions);
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
