//! Free-running generation for the evaluation: greedy, `plan.longest()` tokens for every prompt,
//! batched as the plan says, with progress ([`generate_all`]); [`generate_all_map`] also hands
//! each decoding step's logits to the caller (the reference's side taken from its decoding
//! steps, `scoring.rs`).
//!
//! **Invariant: every prompt gets exactly `plan.longest()` tokens (no stop at EOS), so every
//! trace has the same positions.**

use qdrift_generate::{GenerateError, StepLogits, generate_map};
use qdrift_model::Llama;

use crate::check::plan::Plan;
use crate::error::EvalError;
use crate::types::{Progress, ProgressFn};

/// Greedy generation of `plan.longest()` tokens for every prompt, with progress.
pub(crate) fn generate_all(
    model: &Llama,
    name: &str,
    plan: &Plan,
    progress: &mut ProgressFn<'_>,
) -> Result<Vec<Vec<u32>>, EvalError> {
    generate_all_map(model, name, plan, progress, |_| (), |_, _, ()| {})
}

/// [`generate_all`], each step's logits (`[batch, vocab]`) mapped by `map` on its batch's thread
/// and the result filed by `file` (one call at a time) with the batch's first prompt and the step.
pub(crate) fn generate_all_map<R>(
    model: &Llama,
    name: &str,
    plan: &Plan,
    progress: &mut ProgressFn<'_>,
    map: impl Fn(StepLogits<'_>) -> R + Sync,
    mut file: impl FnMut(usize, usize, R) + Send,
) -> Result<Vec<Vec<u32>>, EvalError> {
    let expected = plan.longest();
    progress(Progress::Generating { model: name, tokens: (plan.prompts.len() * expected) as u64 });
    let tokens = generate_map(
        model,
        &plan.device,
        &plan.prompts,
        &plan.generation,
        |s| (s.logits.dims()[0], map(s)),
        |first_prompt, step, (rows, r)| {
            progress(Progress::Generated { tokens: rows as u64 });
            file(first_prompt, step, r);
        },
    )
    .map_err(|e| match e {
        GenerateError::Overflow { .. } => EvalError::Overflow { model: who(name, plan), problem: e.to_string() },
        e => e.into(),
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

/// How an error names the model `name`: `the reference (fp16)`, or `variant NAME` (one that
/// overflows where the reference did not: the reference generated first).
pub(crate) fn who(name: &str, plan: &Plan) -> String {
    if name == crate::types::reference_name(plan.dtype) {
        format!("the reference ({name})")
    } else {
        format!("variant {name} (where the reference does not)")
    }
}
