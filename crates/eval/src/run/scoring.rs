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
use qdrift_model::{Llama, OutputHead};
use qdrift_score::DevicePositionMetrics;

use crate::check::plan::Plan;
use crate::error::EvalError;
use crate::persist::dump::{Dump, DumpChunk};
use crate::run::generation;
use crate::run::reduce::Reduce;
use crate::run::reference::{ReferenceRun, ReferenceSide};
use crate::run::routing::{Routes, routes_on, routing_trace};
use crate::run::texts::{Texts, chunk_tokens};
use crate::trace::Trace;
use crate::types::reference_name;

/// What of the reference model stays on the device while a variant runs: as little as its
/// side needs, so that the variant's model is the only model resident.
pub(crate) enum Resident {
    /// Nothing: the side holds its logits or its compact statistics.
    Nothing,
    /// Its output layer: the side holds final-norm hidden states.
    Head(OutputHead),
    /// The whole model: its side holds nothing (lockstep), so it runs beside each variant.
    Model(Box<Llama>),
}

/// A variant's experts on both texts, kept until the reference's routes on the variant's text
/// are known (`score_reference`).
pub(crate) struct VariantRoutes {
    on_reference_text: Routes,
    on_own_text: Routes,
}

/// Where a trace first holds a value that is not finite.
#[derive(Clone, Copy, Debug)]
pub(crate) enum NonFinite {
    /// The reference on its own text (its log-probabilities, its entropy), at (prompt, position).
    Reference(usize, usize),
    /// The variant on the reference's text (its divergences, acceptance, log-probabilities).
    Variant(usize, usize),
    /// The reference on the variant's text.
    ReferenceOnVariantText(usize, usize),
}

/// What scoring compares a variant with, and how: the reference run, what of the reference
/// model is resident, and the plan (device, batch size, chunk).
pub(crate) struct ScoringContext<'a> {
    /// The reference, its text and kept logits.
    pub reference: &'a ReferenceRun,
    /// What of its model is on the device.
    pub resident: &'a Resident,
    /// Device and batching.
    pub plan: &'a Plan,
}

impl ScoringContext<'_> {
    /// Teacher-forces the variant on the reference's text, filling every trace's per-position
    /// fields but the reference's log p of the variant's text (`score_reference`, once the
    /// reference is back on the device); for a model with experts, the variant's routes on both
    /// texts. `name` labels the variant's lines in the dump.
    pub fn score_variant(
        &self,
        variant: &Llama,
        name: &str,
        traces: &mut [Trace],
        dump: Option<&mut Dump>,
    ) -> Result<Option<VariantRoutes>, EvalError> {
        self.score_on_reference_text(variant, name, traces, dump)?;
        if self.reference.routes.is_none() {
            return Ok(None);
        }
        let on_reference_text = routes_on(variant, self.plan, &self.reference.text)?;
        let on_own_text = routes_on(variant, self.plan, &variant_text(self.plan, traces))?;
        match (on_reference_text, on_own_text) {
            (Some(on_reference_text), Some(on_own_text)) => Ok(Some(VariantRoutes { on_reference_text, on_own_text })),
            _ => Err(EvalError::Internal("the variant has no experts where the reference has".into())),
        }
    }

    /// The reference's log p of each token the variant generated, and for a model with experts
    /// where the variant's routing differs from the reference's on both texts
    /// (`routing.rs`: the variant's two passes from [`ScoringContext::score_variant`], the
    /// reference's here).
    pub fn score_reference(
        &self,
        reference: &Llama,
        traces: &mut [Trace],
        routes: Option<&VariantRoutes>,
    ) -> Result<(), EvalError> {
        let text = variant_text(self.plan, traces);
        self.score_reference_on_variant_text(reference, &text, traces)?;
        let (Some(on_reference_text), Some(v)) = (&self.reference.routes, routes) else { return Ok(()) };
        let Some(reference_on_var) = routes_on(reference, self.plan, &text)? else {
            return Err(EvalError::Internal("the reference has no experts on the variant's text".into()));
        };
        for (i, t) in traces.iter_mut().enumerate() {
            t.routing =
                Some(routing_trace(i, on_reference_text, &v.on_reference_text, &reference_on_var, &v.on_own_text));
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
                        .and_then(|t| if hidden { Ok(self.head()?.forward(t.clone())) } else { Ok(t.clone()) })
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
            ReferenceSide::Lockstep => teacher_forced_pair(self.resident_model()?, variant, forcing, |p| {
                if failure.is_none() {
                    failure = record(traces, p.first_prompt, p.start, p.reference.clone(), p.variant.clone()).err();
                }
            })?,
        }
        failure.map_or(Ok(()), Err)
    }

    /// The resident output layer, for a side of hidden states.
    fn head(&self) -> Result<&OutputHead, EvalError> {
        match self.resident {
            Resident::Head(h) => Ok(h),
            _ => Err(EvalError::Internal("hidden states kept without the reference's output layer".into())),
        }
    }

    /// The resident reference, for lockstep scoring.
    fn resident_model(&self) -> Result<&Llama, EvalError> {
        match self.resident {
            Resident::Model(m) => Ok(m),
            _ => Err(EvalError::Internal("lockstep scoring without the reference resident".into())),
        }
    }

    /// The reference's log p of each token the variant generated (`text`: the variant's text).
    fn score_reference_on_variant_text(
        &self,
        reference: &Llama,
        text: &Texts,
        traces: &mut [Trace],
    ) -> Result<(), EvalError> {
        let mut failure: Option<EvalError> = None;
        let reduce = Reduce::for_plan(self.plan);
        let reduced = |f: ForcedLogits| {
            let [rows, positions, _] = f.logits.dims();
            let tokens = chunk_tokens(text, f.first_prompt, f.start, rows, positions);
            (rows, positions, reduce.token_logprobs(f.logits, &tokens))
        };
        teacher_forced_map(reference, self.plan.forcing(text), reduced, |first, start, r| {
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

/// The first non-finite value of `traces`: the reference's on its own text first, then the
/// variant's, then (with `reference_on_variant_text`, once scored) the reference's on the
/// variant's text; each at its prompt's earliest position.
pub(crate) fn first_non_finite(traces: &[Trace], reference_on_variant_text: bool) -> Option<NonFinite> {
    type Field = fn(&Trace) -> &Vec<f32>;
    let first = |fields: &[Field]| {
        traces.iter().enumerate().find_map(|(i, t)| {
            let bad = |f: &Field| f(t).iter().position(|v| !v.is_finite());
            fields.iter().filter_map(bad).min().map(|p| (i, p))
        })
    };
    if let Some((i, p)) = first(&[|t| &t.logp_ref, |t| &t.ref_entropy]) {
        return Some(NonFinite::Reference(i, p));
    }
    if let Some((i, p)) = first(&[|t| &t.kld, |t| &t.kld_reverse, |t| &t.accept, |t| &t.logp_var]) {
        return Some(NonFinite::Variant(i, p));
    }
    let on_variant_text = reference_on_variant_text.then(|| first(&[|t| &t.logp_ref_on_var_text])).flatten();
    on_variant_text.map(|(i, p)| NonFinite::ReferenceOnVariantText(i, p))
}

/// One line naming where `model` (the reference, or the variant `name`) first leaves its dtype's
/// range on the sequence behind `at` ([`Llama::first_overflow`], through
/// [`qdrift_generate::overflow`]) and what to do, with who it is.
pub(crate) fn diagnose(model: &Llama, plan: &Plan, name: &str, traces: &[Trace], at: NonFinite) -> (String, String) {
    let (who, text, (i, position)) = match at {
        NonFinite::Reference(i, p) => {
            (generation::who(reference_name(plan.dtype), plan), &traces[i].ref_tokens, (i, p))
        }
        NonFinite::Variant(i, p) => (generation::who(name, plan), &traces[i].ref_tokens, (i, p)),
        NonFinite::ReferenceOnVariantText(i, p) => {
            let reference = reference_name(plan.dtype);
            (format!("the reference ({reference}) on variant {name}'s text"), &traces[i].var_tokens, (i, p))
        }
    };
    // The logits at `position` predict `text[position]` from the prompt and the text before.
    let e = qdrift_generate::overflow(model, &plan.prompts[i], &text[..=position], plan.prompt_indices[i]);
    (who, format!("{e} (teacher-forced)"))
}

/// Each prompt with the variant's continuation (`traces[i].var_tokens`).
fn variant_text(plan: &Plan, traces: &[Trace]) -> Texts {
    plan.prompts.iter().cloned().zip(traces.iter().map(|t| t.var_tokens.clone())).collect()
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
