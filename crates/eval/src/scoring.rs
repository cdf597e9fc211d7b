//! Running the models and scoring them against each other on the device: free-running
//! generation, then teacher forcing of both models on the reference's text and of the reference
//! on the variant's, reduced to per-position values in each prompt's [`Trace`].
//!
//! **Invariant: reference and variant see identical batches and chunks (kept reference logits
//! were computed with the same batching as the lockstep run), so a variant equal to the
//! reference shows exactly zero divergence; only `[batch, positions]` values leave the device,
//! unless a log-probability dump is asked for.**

use std::collections::HashMap;

use burn::tensor::Tensor;
use qdrift_generate::{generate, teacher_forced, teacher_forced_pair};
use qdrift_load::HostModel;
use qdrift_model::{Llama, LlamaConfig};
use qdrift_score::{DevicePositionMetrics, position_metrics_on_device, token_logprobs_on_device};

use crate::aggregate::Trace;
use crate::dump::Dump;
use crate::plan::Plan;
use crate::run::ProgressFn;
use crate::{EvalError, Progress, REFERENCE_NAME};

/// Per prompt, the prompt's tokens and a continuation of it: the text a model is teacher-forced
/// on.
pub(crate) type Texts = Vec<(Vec<u32>, Vec<u32>)>;

/// The reference on the device, its greedy continuations, and (when they fit the budget) its
/// logits on them: what every variant is compared with.
pub(crate) struct ReferenceRun {
    /// The reference model.
    pub model: Llama,
    /// Per prompt, the prompt and the reference's continuation of it.
    pub text: Texts,
    /// The reference's teacher-forced logits on [`ReferenceRun::text`], when kept.
    pub kept_logits: Option<KeptLogits>,
}

impl ReferenceRun {
    /// Builds the reference from `host` (FP16 weights) at the plan's precision, lets it generate,
    /// and keeps its logits on its own text when they fit `logits_budget` bytes.
    pub fn start(
        host: &HostModel,
        plan: &Plan,
        logits_budget: u64,
        progress: &mut ProgressFn<'_>,
    ) -> Result<ReferenceRun, EvalError> {
        let model = LlamaConfig::from_arch(&host.arch).init_from_host(host, plan.dtype, &plan.device.device)?;
        let tokens = generate_all(&model, REFERENCE_NAME, plan, progress)?;
        let text: Texts = plan.prompts.iter().cloned().zip(tokens).collect();
        let kept_logits = KeptLogits::compute(&model, plan, &text, logits_budget)?;
        Ok(ReferenceRun { model, text, kept_logits })
    }

    /// The reference's continuation of prompt `i`.
    pub fn continuation(&self, i: usize) -> &[u32] {
        &self.text[i].1
    }
}

/// Greedy generation of `plan.longest()` tokens for every prompt, with progress.
pub(crate) fn generate_all(
    model: &Llama,
    name: &str,
    plan: &Plan,
    progress: &mut ProgressFn<'_>,
) -> Result<Vec<Vec<u32>>, EvalError> {
    let expected = plan.longest();
    progress(Progress::Generating { model: name, tokens: (plan.prompts.len() * expected) as u64 });
    let tokens = generate(model, &plan.device, &plan.prompts, &plan.generation, |s| {
        progress(Progress::Generated { tokens: s.logits.dims()[0] as u64 })
    })?;
    // Without a stop at EOS, generation gives every prompt exactly `expected` tokens.
    if let Some(i) = tokens.iter().position(|t| t.len() != expected) {
        let got = tokens[i].len();
        return Err(EvalError::Internal(format!(
            "{name}: prompt {} generated {got} tokens, expected {expected}",
            i + 1
        )));
    }
    Ok(tokens)
}

/// The reference's teacher-forced logits on its own continuation, `[batch, chunk, vocab]` f32
/// per chunk, keyed by (first prompt of the batch, first position of the chunk) as
/// `teacher_forced` hands them out. Every variant is compared with the same logits; keeping them
/// saves one forward pass of the reference per variant.
pub(crate) struct KeptLogits(HashMap<(usize, usize), Tensor<3>>);

impl KeptLogits {
    /// Runs the reference on its own continuation once and keeps its logits, when they fit
    /// `budget` bytes (default 256 MiB; stories260K, 32 prompts × 1000 positions × 512: 66 MB);
    /// else `None`, and each variant runs in lockstep with the reference instead (SmolLM2, 16
    /// prompts × 1000 × 49,152: 3.1 GB). Both paths batch and chunk the reference identically,
    /// so they give the same numbers.
    fn compute(reference: &Llama, plan: &Plan, text: &Texts, budget: u64) -> Result<Option<KeptLogits>, EvalError> {
        let positions: u128 = text.iter().map(|(_, c)| c.len() as u128).sum();
        if positions * reference.config.vocab_size as u128 * 4 > u128::from(budget) {
            return Ok(None);
        }
        let mut chunks = HashMap::new();
        teacher_forced(reference, &plan.device, text, plan.batch_size(), plan.chunk, |f| {
            chunks.insert((f.first_prompt, f.start), f.logits.clone());
        })?;
        Ok(Some(KeptLogits(chunks)))
    }

    fn get(&self, first_prompt: usize, start: usize) -> Result<&Tensor<3>, EvalError> {
        self.0.get(&(first_prompt, start)).ok_or_else(|| {
            EvalError::Internal(format!("no reference logits kept for prompt {first_prompt} position {start}"))
        })
    }
}

/// What scoring compares a variant with, and how: the reference run and the plan (device,
/// batch size, chunk).
pub(crate) struct ScoringContext<'a> {
    /// The reference, its text and kept logits.
    pub reference: &'a ReferenceRun,
    /// Device and batching.
    pub plan: &'a Plan,
}

impl ScoringContext<'_> {
    /// Teacher-forces both models on the reference's text and the reference on the variant's
    /// (`traces[i].var_tokens`), filling every trace's per-position fields. `name` labels the
    /// variant's lines in the dump.
    pub fn score(
        &self,
        variant: &Llama,
        name: &str,
        traces: &mut [Trace],
        dump: Option<&mut Dump>,
    ) -> Result<(), EvalError> {
        self.score_on_reference_text(variant, name, traces, dump)?;
        self.score_reference_on_variant_text(traces)
    }

    /// KL, top-1 agreement, both log p of the reference's token and the reference's entropy, per
    /// position of the reference's text.
    fn score_on_reference_text(
        &self,
        variant: &Llama,
        name: &str,
        traces: &mut [Trace],
        mut dump: Option<&mut Dump>,
    ) -> Result<(), EvalError> {
        let text = &self.reference.text;
        let mut record = |first_prompt: usize, start: usize, r: &Tensor<3>, v: &Tensor<3>| -> Result<(), EvalError> {
            let [rows, positions, _] = r.dims();
            let tokens = chunk_tokens(text, first_prompt, start, rows, positions);
            if let Some(d) = dump.as_deref_mut() {
                d.write_chunk(name, first_prompt, start, r, v, &tokens)?;
            }
            let metrics = position_metrics_on_device(r.clone(), v.clone(), &tokens)?;
            fill_position_metrics(&mut traces[first_prompt..first_prompt + rows], start, positions, &metrics);
            Ok(())
        };
        // Observers cannot return errors: the first one is kept and the rest of the run skipped.
        let mut failure: Option<EvalError> = None;
        let (device, batch_size, chunk) = (&self.plan.device, self.plan.batch_size(), self.plan.chunk);
        match &self.reference.kept_logits {
            Some(kept) => teacher_forced(variant, device, text, batch_size, chunk, |f| {
                if failure.is_none() {
                    let reference = kept.get(f.first_prompt, f.start);
                    failure = reference.and_then(|r| record(f.first_prompt, f.start, r, f.logits)).err();
                }
            })?,
            None => teacher_forced_pair(&self.reference.model, variant, device, text, batch_size, chunk, |p| {
                if failure.is_none() {
                    failure = record(p.first_prompt, p.start, p.reference, p.variant).err();
                }
            })?,
        }
        failure.map_or(Ok(()), Err)
    }

    /// The reference's log p of each token the variant generated.
    fn score_reference_on_variant_text(&self, traces: &mut [Trace]) -> Result<(), EvalError> {
        let text: Texts = self.plan.prompts.iter().cloned().zip(traces.iter().map(|t| t.var_tokens.clone())).collect();
        let mut failure: Option<EvalError> = None;
        let (device, batch_size, chunk) = (&self.plan.device, self.plan.batch_size(), self.plan.chunk);
        teacher_forced(&self.reference.model, device, &text, batch_size, chunk, |f| {
            if failure.is_some() {
                return;
            }
            let [rows, positions, _] = f.logits.dims();
            let tokens = chunk_tokens(&text, f.first_prompt, f.start, rows, positions);
            match token_logprobs_on_device(f.logits.clone(), &tokens) {
                Ok(logp) => {
                    for i in 0..rows {
                        let row = &logp[i * positions..(i + 1) * positions];
                        traces[f.first_prompt + i].logp_ref_on_var_text[f.start..f.start + positions]
                            .copy_from_slice(row);
                    }
                }
                Err(e) => failure = Some(e.into()),
            }
        })?;
        failure.map_or(Ok(()), Err)
    }
}

/// The continuation tokens a chunk scores: `positions` tokens from `start` of `rows` prompts from
/// `first_prompt`, row-major (`[rows, positions]`).
fn chunk_tokens(text: &Texts, first_prompt: usize, start: usize, rows: usize, positions: usize) -> Vec<u32> {
    text[first_prompt..first_prompt + rows]
        .iter()
        .flat_map(|(_, c)| c[start..start + positions].iter().copied())
        .collect()
}

/// Copies a chunk's per-position metrics (`[rows, positions]`, row-major, one row per trace) into
/// the traces, at positions `start..start + positions`.
fn fill_position_metrics(traces: &mut [Trace], start: usize, positions: usize, m: &DevicePositionMetrics) {
    for (i, trace) in traces.iter_mut().enumerate() {
        for j in 0..positions {
            let (k, t) = (i * positions + j, start + j);
            trace.kld[t] = m.kld[k];
            trace.top1[t] = m.top1_agree[k];
            trace.logp_ref[t] = m.logp_ref_of_token[k];
            trace.logp_var[t] = m.logp_var_of_token[k];
            trace.ref_entropy[t] = m.ref_entropy[k];
        }
    }
}
