//! Scoring a variant against the reference on the device: teacher forcing of both models on the
//! reference's text (the reference's side kept by [`ReferenceRun`]) and of the reference on the
//! variant's, reduced to per-position values in each prompt's [`Trace`].
//!
//! **Invariant: reference and variant see identical batches and chunks (the reference's
//! statistics or kept logits were computed with the same batching as the variant's run), so a
//! variant equal to the reference shows exactly zero divergence; only `[batch, positions]` values
//! (and the compact reference's top-K) leave the device, unless a log-probability dump is asked
//! for.**

use burn::tensor::Tensor;
use qdrift_generate::{ForcedLogits, teacher_forced, teacher_forced_map, teacher_forced_pair};
use qdrift_model::Llama;
use qdrift_score::DevicePositionMetrics;

use crate::aggregate::Trace;
use crate::dump::{Dump, DumpChunk};
use crate::error::EvalError;
use crate::generation;
use crate::plan::Plan;
use crate::reduce::Reduce;
use crate::reference::{ReferenceRun, ReferenceSide};
use crate::routing::{routes_on, routing_trace};
use crate::texts::{Texts, chunk_tokens};
use crate::types::REFERENCE_NAME;

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
        // The variant's text: each prompt with the variant's continuation.
        let variant_text: Texts =
            self.plan.prompts.iter().cloned().zip(traces.iter().map(|t| t.var_tokens.clone())).collect();
        self.score_reference_on_variant_text(&variant_text, traces)?;
        self.score_routing(variant, &variant_text, traces)
    }

    /// For a model with experts, where the variant's routing differs from the reference's, on
    /// the reference's text and on the variant's (`routing.rs`: three teacher-forced passes).
    fn score_routing(&self, variant: &Llama, variant_text: &Texts, traces: &mut [Trace]) -> Result<(), EvalError> {
        let Some(reference) = &self.reference.routes else { return Ok(()) };
        let on_reference_text = routes_on(variant, self.plan, &self.reference.text)?;
        let reference_on_var = routes_on(&self.reference.model, self.plan, variant_text)?;
        let variant_on_var = routes_on(variant, self.plan, variant_text)?;
        let (Some(v), Some(rv), Some(vv)) = (on_reference_text, reference_on_var, variant_on_var) else {
            return Err(EvalError::Internal("the variant has no experts where the reference has".into()));
        };
        for (i, t) in traces.iter_mut().enumerate() {
            t.routing = Some(routing_trace(i, reference, &v, &rv, &vv));
        }
        Ok(())
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
        let reduce = Reduce::for_plan(self.plan);
        let dumping = dump.is_some();
        let mut record = |traces: &mut [Trace],
                          first_prompt: usize,
                          start: usize,
                          r: Tensor<3>,
                          v: Tensor<3>|
         -> Result<(), EvalError> {
            let [rows, positions, _] = r.dims();
            let tokens = chunk_tokens(text, first_prompt, start, rows, positions);
            if let Some(d) = dump.as_deref_mut() {
                d.write_chunk(name, DumpChunk { first_prompt, start, reference: &r, var: &v, tokens: &tokens })?;
            }
            let metrics = reduce.position_metrics(r, v, &tokens)?;
            fill_position_metrics(traces, first_prompt, start, &metrics);
            Ok(())
        };
        // Observers cannot return errors: the first one is kept and the rest of the run skipped.
        let mut failure: Option<EvalError> = None;
        let forcing = self.plan.forcing(text);
        // Each chunk is reduced on its batch's thread (`teacher_forced_map`); only filing the
        // per-position values into the traces is serialized.
        let mut file =
            |first_prompt: usize, start: usize, metrics: Result<DevicePositionMetrics, EvalError>| match metrics {
                Ok(m) if failure.is_none() => fill_position_metrics(traces, first_prompt, start, &m),
                Err(e) if failure.is_none() => failure = Some(e),
                _ => {}
            };
        match &self.reference.side {
            ReferenceSide::Compact(compact) => teacher_forced_map(
                variant,
                forcing,
                |f| {
                    let [rows, positions, _] = f.logits.dims();
                    let tokens = chunk_tokens(text, f.first_prompt, f.start, rows, positions);
                    let reference = compact.chunk(f.first_prompt, rows, f.start, positions);
                    reduce.against_compact(&reference, f.logits, &tokens)
                },
                &mut file,
            )?,
            ReferenceSide::Kept(kept) | ReferenceSide::KeptHidden(kept) => {
                let hidden = matches!(self.reference.side, ReferenceSide::KeptHidden(_));
                // Kept hidden states become the reference's logits through its output layer.
                let reference_logits = |f: &ForcedLogits| {
                    kept.get(f.first_prompt, f.start)
                        .map(|t| if hidden { self.reference.model.head(t.clone()) } else { t.clone() })
                };
                if dumping {
                    // The dump writes both models' logits in chunk order: under the observer's lock.
                    teacher_forced(variant, forcing, |f| {
                        if failure.is_none() {
                            let reference = reference_logits(&f);
                            failure =
                                reference.and_then(|r| record(traces, f.first_prompt, f.start, r, f.logits)).err();
                        }
                    })?
                } else {
                    let reduced = |f: ForcedLogits| {
                        let [rows, positions, _] = f.logits.dims();
                        let tokens = chunk_tokens(text, f.first_prompt, f.start, rows, positions);
                        reduce.position_metrics(reference_logits(&f)?, f.logits, &tokens)
                    };
                    teacher_forced_map(variant, forcing, reduced, &mut file)?
                }
            }
            ReferenceSide::Lockstep => teacher_forced_pair(&self.reference.model, variant, forcing, |p| {
                if failure.is_none() {
                    failure = record(traces, p.first_prompt, p.start, p.reference.clone(), p.variant.clone()).err();
                }
            })?,
        }
        failure.map_or(Ok(()), Err)
    }

    /// The reference's log p of each token the variant generated (`text`: the variant's text).
    fn score_reference_on_variant_text(&self, text: &Texts, traces: &mut [Trace]) -> Result<(), EvalError> {
        let mut failure: Option<EvalError> = None;
        let reduce = Reduce::for_plan(self.plan);
        let reduced = |f: ForcedLogits| {
            let [rows, positions, _] = f.logits.dims();
            let tokens = chunk_tokens(text, f.first_prompt, f.start, rows, positions);
            (rows, positions, reduce.token_logprobs(f.logits, &tokens))
        };
        teacher_forced_map(&self.reference.model, self.plan.forcing(text), reduced, |first, start, r| {
            if failure.is_some() {
                return;
            }
            let (rows, positions, logp) = r;
            match logp {
                Ok(logp) => {
                    for i in 0..rows {
                        let row = &logp[i * positions..(i + 1) * positions];
                        traces[first + i].logp_ref_on_var_text[start..start + positions].copy_from_slice(row);
                    }
                }
                Err(e) => failure = Some(e),
            }
        })?;
        failure.map_or(Ok(()), Err)
    }
}

impl ScoringContext<'_> {
    /// Finds a non-finite value in traces and names the model whose logits went non-finite,
    /// where its sequence first leaves the range ([`Llama::first_overflow`]) and what to do: the
    /// reference on its own text (its log-probabilities and entropy) or on the variant's text,
    /// an error; `model` (the variant `name`) teacher-forced on the reference's text (its KL
    /// divergences, acceptance and log-probabilities), the variant's failure (`Some`, one line).
    pub(crate) fn check_finite(
        &self,
        model: &Llama,
        name: &str,
        traces: &[Trace],
    ) -> Result<Option<String>, EvalError> {
        type Field = fn(&Trace) -> &Vec<f32>;
        // The first prompt with a non-finite value in any of `fields`, and its earliest position.
        let first = |fields: &[Field]| {
            traces.iter().enumerate().find_map(|(i, t)| {
                let bad = |f: &Field| f(t).iter().position(|v| !v.is_finite());
                fields.iter().filter_map(bad).min().map(|p| (i, p))
            })
        };
        let reference = first(&[|t| &t.logp_ref, |t| &t.ref_entropy]);
        let variant = first(&[|t| &t.kld, |t| &t.kld_reverse, |t| &t.accept, |t| &t.logp_var]);
        let (who, failing, text, (i, position)) = match (reference, variant, first(&[|t| &t.logp_ref_on_var_text])) {
            (Some(at), _, _) => (generation::who(REFERENCE_NAME), &self.reference.model, &traces[at.0].ref_tokens, at),
            (None, Some(at), _) => (generation::who(name), model, &traces[at.0].ref_tokens, at),
            (None, None, Some(at)) => (
                format!("the reference ({REFERENCE_NAME}) on variant {name}'s text"),
                &self.reference.model,
                &traces[at.0].var_tokens,
                at,
            ),
            (None, None, None) => return Ok(None),
        };
        // The logits at `position` predict `text[position]` from the prompt and the text before.
        let e =
            qdrift_generate::overflow(failing, &self.plan.prompts[i], &text[..=position], self.plan.prompt_indices[i]);
        let problem = format!("{e} (teacher-forced)");
        if reference.is_none() && variant.is_some() {
            Ok(Some(format!("{who}: {problem}")))
        } else {
            Err(EvalError::Overflow { model: who, problem })
        }
    }
}

/// Copies a chunk's per-position metrics (`[rows, positions]`, row-major, one row per trace from
/// `first_prompt`) into the traces, at positions `start..start + positions`.
fn fill_position_metrics(traces: &mut [Trace], first_prompt: usize, start: usize, m: &DevicePositionMetrics) {
    let positions = m.positions;
    for (i, trace) in traces[first_prompt..first_prompt + m.batch].iter_mut().enumerate() {
        for j in 0..positions {
            let (k, t) = (i * positions + j, start + j);
            trace.kld[t] = m.kld[k];
            trace.kld_reverse[t] = m.kld_reverse[k];
            trace.accept[t] = m.accept[k];
            trace.top_k[t] = m.top_k[k];
            trace.top1[t] = m.top1_agree[k];
            trace.logp_ref[t] = m.logp_ref_of_token[k];
            trace.logp_var[t] = m.logp_var_of_token[k];
            trace.ref_entropy[t] = m.ref_entropy[k];
        }
    }
}
