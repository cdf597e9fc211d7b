//! The reference's run: built on the device from the FP16 weights, its greedy continuations,
//! and its side of the comparison on them ([`ReferenceRun`]), computed once for every variant;
//! or all of that from a saved reference ([`ReferenceRun::from_store`]).
//!
//! That side is, for the exact KL (the default), its full logits when they fit a budget, else
//! its final hidden states (each variant's chunk gets the logits back from the output layer),
//! else nothing (a lockstep rerun of the reference beside each variant); with
//! `--reference-top-k` its compact top-K statistics ([`CompactReference`]). Where a decoding
//! step computes bit for bit what teacher forcing does (the CPU backend,
//! [`Llama::steps_match_teacher_forcing`]), that side is taken from the reference's decoding
//! steps, and the reference runs over its own text once instead of twice.
//!
//! **Invariant: the side is computed with the batching and chunking every variant's run uses,
//! so a variant equal to the reference shows exactly zero divergence.**

use std::collections::HashMap;

use burn::tensor::Tensor;
use qdrift_generate::{StepLogits, teacher_forced, teacher_forced_hidden};
use qdrift_model::Llama;
use qdrift_score::{CompactChunk, compact_reference_on_host, greedy_tokens_on_host};

use crate::check::plan::{KlMode, Plan};
use crate::error::EvalError;
use crate::persist::store::{StoredReference, StoredSide, hidden_bytes, hidden_tensor};
use crate::run::generation::{generate_all, generate_all_map};
use crate::run::routing::{Routes, routes_on};
use crate::run::texts::Texts;
use crate::trace::CompactReference;
use crate::trace::Trace;
use crate::types::{Progress, ProgressFn, reference_name};

/// The reference's greedy continuations and its side of the comparison on them: what every
/// variant is compared with. The model itself is not kept: the run builds it again when it must
/// score the variants' text (`evaluate.rs`).
pub(crate) struct ReferenceRun {
    /// Per prompt, the prompt and the reference's continuation of it.
    pub text: Texts,
    /// The reference's teacher-forced side on [`ReferenceRun::text`].
    pub side: ReferenceSide,
    /// For a model with experts, the experts it routes each position of its own text to.
    pub routes: Option<Routes>,
}

/// What is kept of the reference's teacher-forced pass on its own text.
pub(crate) enum ReferenceSide {
    /// Its compact top-K statistics (the default).
    Compact(CompactReference),
    /// Its full logits (exact KL, when they fit the budget).
    Kept(KeptLogits),
    /// Its final-norm hidden states (exact KL, when the logits do not fit the budget and these
    /// do): each variant's chunk gets the reference's logits back from one pass of the output
    /// layer ([`Llama::head`]), bit for bit.
    KeptHidden(KeptLogits),
    /// Nothing: it runs again in lockstep with each variant (exact KL, when neither fits).
    Lockstep,
}

impl ReferenceRun {
    /// Lets the reference `model` (FP16 weights at the plan's precision) generate, and scores it
    /// on its own text once: compact statistics, or for the exact KL its logits when they fit
    /// `logits_budget` bytes.
    ///
    /// With `keep_hidden` (saving the reference), the exact path keeps the hidden states
    /// whatever the budget: they are what a store holds.
    pub fn start(
        model: &Llama,
        plan: &Plan,
        logits_budget: u64,
        keep_hidden: bool,
        progress: &mut ProgressFn<'_>,
    ) -> Result<ReferenceRun, EvalError> {
        let keep = match plan.kl {
            KlMode::Compact { k } => Keep::Compact(k),
            KlMode::Exact if keep_hidden => Keep::Hidden,
            KlMode::Exact => Keep::within(model, plan, logits_budget),
        };
        // Where a decoding step computes what teacher forcing would, the reference's side comes
        // from its decoding steps themselves, and the reference runs once.
        let from_steps = model.steps_match_teacher_forcing() && keep != Keep::Nothing;
        let (tokens, side) = if from_steps {
            side_from_decoding(model, plan, keep, progress)?
        } else {
            (generate_all(model, reference_name(plan.dtype), plan, progress)?, None)
        };
        progress(Progress::Scoring { model: reference_name(plan.dtype) });
        let text: Texts = plan.prompts.iter().cloned().zip(tokens).collect();
        let side = match side {
            Some(side) => side,
            None => keep.teacher_forced(model, plan, &text)?,
        };
        let routes = routes_on(model, plan, &text)?;
        Ok(ReferenceRun { text, side, routes })
    }

    /// The reference from a store: its saved continuations and side (nothing is generated), and
    /// the routes of `model` (the reference on the device) on its text, for a model with experts.
    pub fn from_store(
        model: &Llama,
        plan: &Plan,
        continuations: Vec<Vec<u32>>,
        side: StoredSide,
    ) -> Result<ReferenceRun, EvalError> {
        let text: Texts = plan.prompts.iter().cloned().zip(continuations).collect();
        let side = match side {
            StoredSide::Compact(c) => {
                c.check(&text)?;
                ReferenceSide::Compact(c)
            }
            StoredSide::Hidden(chunks) => {
                let dim = model.arch.dim;
                if let Some((_, shape, _)) = chunks.iter().find(|(_, shape, _)| shape[2] != dim) {
                    return Err(EvalError::Internal(format!(
                        "stored hidden states are {shape:?}, the model's width is {dim}"
                    )));
                }
                let device = &plan.device.device;
                let kept = chunks
                    .into_iter()
                    .map(|(key, shape, bytes)| (key, hidden_tensor(shape, bytes, plan.dtype, device)))
                    .collect();
                ReferenceSide::KeptHidden(KeptLogits(kept))
            }
        };
        let routes = routes_on(model, plan, &text)?;
        Ok(ReferenceRun { text, side, routes })
    }

    /// What a store keeps of this run (hidden states in `dtype`, the reference's), with the
    /// noise floor's traces.
    pub fn to_store(&self, dtype: burn::tensor::DType, noise_floor: Vec<Trace>) -> Result<StoredReference, EvalError> {
        let side = match &self.side {
            ReferenceSide::Compact(c) => StoredSide::Compact(c.clone()),
            ReferenceSide::KeptHidden(kept) => {
                let mut chunks = Vec::with_capacity(kept.0.len());
                for (key, t) in &kept.0 {
                    let (shape, bytes) = hidden_bytes(t, dtype)?;
                    chunks.push((*key, shape, bytes));
                }
                chunks.sort_by_key(|(k, _, _)| *k);
                StoredSide::Hidden(chunks)
            }
            _ => return Err(EvalError::Internal("saving a reference that kept no hidden states".into())),
        };
        let continuations = self.text.iter().map(|(_, c)| c.clone()).collect();
        Ok(StoredReference { continuations, side, noise_floor })
    }

    /// The compact statistics, when the run keeps them.
    pub fn compact(&self) -> Option<&CompactReference> {
        match &self.side {
            ReferenceSide::Compact(c) => Some(c),
            _ => None,
        }
    }

    /// The reference's continuation of prompt `i`.
    pub fn continuation(&self, i: usize) -> &[u32] {
        &self.text[i].1
    }
}

/// The reference's teacher-forced logits (`[batch, chunk, vocab]` f32) or final-norm hidden
/// states (`[batch, chunk, dim]`) on its own continuation, per chunk, keyed by (first prompt of
/// the batch, first position of the chunk) as `teacher_forced` hands them out. Every variant is
/// compared with the same logits; keeping them saves one forward pass of the reference per
/// variant.
pub(crate) struct KeptLogits(HashMap<(usize, usize), Tensor<3>>);

/// What the reference keeps of its side on its own text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Keep {
    /// Compact top-`k` statistics.
    Compact(usize),
    /// Full logits.
    Logits,
    /// Final-norm hidden states.
    Hidden,
    /// Nothing: lockstep reruns.
    Nothing,
}

impl Keep {
    /// For the exact KL, what fits `budget` bytes (default 256 MiB): the reference's logits
    /// (stories260K, 32 prompts × 1000 positions × 512: 66 MB), else its hidden states (SmolLM2,
    /// 16 prompts × 1000 × 576 × 2 bytes in f16: 18 MB, where its logits would be 3.1 GB); else
    /// nothing, and each variant runs in lockstep with the reference. Every path batches and
    /// chunks the reference identically and the output layer is the same operation on the same
    /// hidden states, so they give the same numbers.
    fn within(reference: &Llama, plan: &Plan, budget: u64) -> Keep {
        let positions = plan.prompts.len() as u128 * plan.longest() as u128;
        let budget = u128::from(budget);
        let hidden_bytes = if reference.dtype() == burn::tensor::DType::F32 { 4 } else { 2 };
        if positions * reference.arch.vocab_size as u128 * 4 <= budget {
            Keep::Logits
        } else if positions * reference.arch.dim as u128 * hidden_bytes <= budget {
            Keep::Hidden
        } else {
            Keep::Nothing
        }
    }

    /// Teacher-forces the reference on its own text once and keeps this.
    fn teacher_forced(self, reference: &Llama, plan: &Plan, text: &Texts) -> Result<ReferenceSide, EvalError> {
        let forcing = plan.forcing(text);
        let mut chunks = HashMap::new();
        Ok(match self {
            Keep::Compact(k) => ReferenceSide::Compact(CompactReference::compute(reference, plan, text, k)?),
            Keep::Logits => {
                teacher_forced(reference, forcing, |f| {
                    chunks.insert((f.first_prompt, f.start), f.logits);
                })?;
                ReferenceSide::Kept(KeptLogits(chunks))
            }
            Keep::Hidden => {
                teacher_forced_hidden(reference, forcing, |f| {
                    chunks.insert((f.first_prompt, f.start), f.logits);
                })?;
                ReferenceSide::KeptHidden(KeptLogits(chunks))
            }
            Keep::Nothing => ReferenceSide::Lockstep,
        })
    }
}

/// Lets the reference generate and takes what `keep` asks for from its decoding steps, for a
/// reference whose steps compute what teacher forcing computes
/// ([`Llama::steps_match_teacher_forcing`]): its greedy continuations and, bit for bit, the side
/// [`Keep::teacher_forced`] would give on them. Logits and hidden states are kept per step and
/// joined into the chunks teacher forcing cuts (position 0 alone, from the prompt pass, then
/// `plan.chunk` positions at a time), keyed as it keys them.
///
/// The side is `None` when the compact statistics' top-1 tokens are not the generated ones
/// (see [`compact_from_decoding`]): the caller then teacher-forces.
fn side_from_decoding(
    reference: &Llama,
    plan: &Plan,
    keep: Keep,
    progress: &mut ProgressFn<'_>,
) -> Result<(Vec<Vec<u32>>, Option<ReferenceSide>), EvalError> {
    let step_tensor = match keep {
        Keep::Compact(k) => {
            let (tokens, compact) = compact_from_decoding(reference, plan, k, progress)?;
            return Ok((tokens, compact.map(ReferenceSide::Compact)));
        }
        Keep::Logits => |s: StepLogits<'_>| {
            let [rows, vocab] = s.logits.dims();
            s.logits.clone().reshape([rows, 1, vocab])
        },
        Keep::Hidden => |s: StepLogits<'_>| s.hidden.clone(),
        Keep::Nothing => return Err(EvalError::Internal("no reference side to keep from decoding".into())),
    };
    // Per batch (keyed by its first prompt), its steps' tensors in step order.
    let mut steps: HashMap<usize, Vec<Tensor<3>>> = HashMap::new();
    let mut failure: Option<EvalError> = None;
    let tokens =
        generate_all_map(reference, reference_name(plan.dtype), plan, progress, step_tensor, |first, step, t| {
            let batch = steps.entry(first).or_default();
            // A batch's steps reach here in order.
            if batch.len() != step && failure.is_none() {
                failure = Some(EvalError::Internal(format!(
                    "batch of prompt {}: step {step} after {}",
                    first + 1,
                    batch.len()
                )));
            }
            batch.push(t);
        })?;
    if let Some(e) = failure {
        return Err(e);
    }
    let n = plan.longest();
    let mut chunks = HashMap::new();
    for (first, batch) in steps {
        if batch.len() != n {
            return Err(EvalError::Internal(format!(
                "batch of prompt {}: {} steps, expected {n}",
                first + 1,
                batch.len()
            )));
        }
        let mut batch = batch.into_iter();
        // As `teacher_forced` cuts a continuation: the prompt pass predicts position 0, then
        // chunks of `plan.chunk` positions from 1.
        let mut start = 0;
        while start < n {
            let len = if start == 0 { 1 } else { plan.chunk.max(1).min(n - start) };
            let parts: Vec<Tensor<3>> = batch.by_ref().take(len).collect();
            chunks.insert((first, start), Tensor::cat(parts, 1));
            start += len;
        }
    }
    let kept = KeptLogits(chunks);
    Ok((tokens, Some(if keep == Keep::Hidden { ReferenceSide::KeptHidden(kept) } else { ReferenceSide::Kept(kept) })))
}

impl KeptLogits {
    pub(crate) fn get(&self, first_prompt: usize, start: usize) -> Result<&Tensor<3>, EvalError> {
        self.0.get(&(first_prompt, start)).ok_or_else(|| {
            EvalError::Internal(format!("no reference logits kept for prompt {first_prompt} position {start}"))
        })
    }
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
fn compact_from_decoding(
    reference: &Llama,
    plan: &Plan,
    k: usize,
    progress: &mut ProgressFn<'_>,
) -> Result<(Vec<Vec<u32>>, Option<CompactReference>), EvalError> {
    let mut prompts: Vec<CompactChunk> =
        plan.prompts.iter().map(|_| CompactChunk::empty_row(k, plan.longest())).collect();
    let mut failure: Option<EvalError> = None;
    let reduce = |s: StepLogits<'_>| -> Result<CompactChunk, EvalError> {
        let [rows, vocab] = s.logits.dims();
        let values = s.logits.to_data().try_into_vec::<f32>().map_err(|e| {
            EvalError::Internal(format!("step logits [{rows}, {vocab}] do not read back as f32: {e:?}"))
        })?;
        let tokens = greedy_tokens_on_host(&values, rows, vocab)?;
        Ok(compact_reference_on_host(&values, [rows, 1, vocab], &tokens, k)?)
    };
    let tokens = generate_all_map(reference, reference_name(plan.dtype), plan, progress, reduce, |first, step, c| {
        match c {
            Ok(c) if failure.is_none() => {
                for row in 0..c.batch {
                    let p = &mut prompts[first + row];
                    // A batch's steps reach here in order.
                    if p.positions != step {
                        failure = Some(EvalError::Internal(format!(
                            "prompt {}: decoding step {step} after {} positions",
                            first + row + 1,
                            p.positions
                        )));
                        return;
                    }
                    p.extend_row(&c, row, 0..c.positions);
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

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use burn::tensor::DType;
    use qdrift_generate::BackendChoice;

    use super::*;
    use crate::check::config::EvalConfig;

    /// A tensor's dims and its values' f32 bits: what "the same numbers" means here.
    fn bits(t: &Tensor<3>) -> (Vec<usize>, Vec<u32>) {
        let t = t.clone().cast(DType::F32);
        let dims = t.dims().to_vec();
        let values = t.into_data().try_into_vec::<f32>().expect("f32");
        (dims, values.iter().map(|v| v.to_bits()).collect())
    }

    fn same_side(a: &ReferenceSide, b: &ReferenceSide, what: &str) {
        match (a, b) {
            (ReferenceSide::Compact(a), ReferenceSide::Compact(b)) => {
                assert!(a == b, "{what}: compact statistics differ")
            }
            (ReferenceSide::Kept(a), ReferenceSide::Kept(b))
            | (ReferenceSide::KeptHidden(a), ReferenceSide::KeptHidden(b)) => {
                let mut keys: Vec<_> = a.0.keys().copied().collect();
                keys.sort_unstable();
                let mut other: Vec<_> = b.0.keys().copied().collect();
                other.sort_unstable();
                assert_eq!(keys, other, "{what}: chunks");
                for key in keys {
                    assert!(bits(&a.0[&key]) == bits(&b.0[&key]), "{what}: chunk {key:?} differs");
                }
            }
            _ => panic!("{what}: different kinds of side"),
        }
    }

    /// On the CPU backend, the reference's side taken from its decoding steps is bit for bit the
    /// side a teacher-forced pass over its continuations gives: compact statistics, logits and
    /// hidden states, in f16 and f32, with prompts of different lengths (left padding), a short
    /// last batch and continuations cut into several chunks.
    #[test]
    fn the_side_from_decoding_is_the_teacher_forced_side_bit_for_bit() {
        let loaded = qdrift_load::open_model(Path::new("synthetic:tiny"), None).expect("tiny model");
        let vocab = loaded.model.arch.vocab_size as u32;
        let prompts: Vec<Vec<u32>> =
            (0..5u32).map(|i| (0..3 + 2 * i).map(|j| (7 * i + 13 * j + 1) % vocab).collect()).collect();
        for dtype in [DType::F16, DType::F32] {
            let mut cfg = EvalConfig::new(PathBuf::from("synthetic:tiny"));
            cfg.backend = BackendChoice::Cpu;
            cfg.dtype = dtype;
            cfg.batch_size = Some(2);
            cfg.chunk = 3;
            let device = qdrift_generate::select_device(BackendChoice::Cpu).expect("cpu");
            let plan = Plan::new(&cfg, vec![4, 11], &loaded.model.arch, prompts.clone(), device).expect("plan");
            let model = Llama::from_host(&loaded.model, dtype, &plan.device.device).expect("model");
            assert!(model.steps_match_teacher_forcing(), "{dtype:?}: the CPU backend runs every layer on the host");
            for keep in [Keep::Compact(5), Keep::Logits, Keep::Hidden] {
                let (tokens, side) = side_from_decoding(&model, &plan, keep, &mut |_| {}).expect("decoding");
                let side = side.expect("the statistics' top-1 tokens are the generated ones");
                let text: Texts = plan.prompts.iter().cloned().zip(tokens).collect();
                let forced = keep.teacher_forced(&model, &plan, &text).expect("teacher forcing");
                same_side(&side, &forced, &format!("{dtype:?} {keep:?}"));
            }
        }
    }
}
