//! The routing passes of a model with experts: which experts each model routes every position
//! of a text to ([`Routes`], from `qdrift_generate::teacher_forced_routes`), and the comparison
//! of two models' choices at the same positions ([`routing_trace`]) that `assemble/routing_drift.rs`
//! reduces to the report's numbers.
//!
//! Each pass is a teacher-forced forward pass of its own, batched and chunked as scoring's, with
//! the output layer skipped: the reference once on its own text (kept by the reference run), and
//! per variant three (the variant on the reference's text, both models on the variant's text).
//! Only models with experts pay for them.

use qdrift_generate::{ForcedRoutes, teacher_forced_routes};
use qdrift_model::Llama;

use crate::check::plan::Plan;
use crate::error::EvalError;
use crate::run::texts::Texts;
use crate::trace::RoutingTrace;

/// The experts one model routed every continuation position of a text to.
///
/// # Shapes
/// `prompts: [P]`, each `[L, H, k]` row-major: per mixture-of-experts layer, position and
/// rank, the expert (the weightiest first), for the logits that predict continuation token `t`.
#[derive(Clone, Debug)]
pub(crate) struct Routes {
    /// Experts per layer.
    pub experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// The mixture-of-experts blocks, ascending.
    pub layers: Vec<usize>,
    /// Continuation positions.
    pub positions: usize,
    /// Per prompt, `[L, H, k]`.
    pub prompts: Vec<Vec<u32>>,
}

/// The routes of `model` along every continuation of `text`; `None` for a model without
/// experts.
pub(crate) fn routes_on(model: &Llama, plan: &Plan, text: &Texts) -> Result<Option<Routes>, EvalError> {
    let Some(moe) = &model.arch.moe else { return Ok(None) };
    let layers: Vec<usize> = (0..model.arch.n_layers).filter(|&l| model.arch.has_experts(l)).collect();
    let (k, h) = (moe.top_k, text.first().map_or(0, |(_, c)| c.len()));
    let mut routes = Routes {
        experts: moe.n_experts,
        top_k: k,
        prompts: vec![vec![0; layers.len() * h * k]; text.len()],
        layers,
        positions: h,
    };
    let mut failure = None;
    teacher_forced_routes(model, plan.forcing(text), |chunk| {
        if failure.is_none() {
            failure = routes.file(chunk).err();
        }
    })?;
    failure.map_or(Ok(Some(routes)), Err)
}

impl Routes {
    /// Files one chunk's choices (one entry per layer, `[rows, len, k]`) at its prompts and
    /// positions.
    fn file(&mut self, chunk: ForcedRoutes) -> Result<(), EvalError> {
        let ForcedRoutes { first_prompt, start, routes } = chunk;
        let blocks: Vec<usize> = routes.layers.iter().map(|e| e.layer).collect();
        if blocks != self.layers {
            return Err(EvalError::Internal(format!(
                "a routing pass recorded layers {blocks:?}, the model's experts are in {:?}",
                self.layers
            )));
        }
        let (h, k) = (self.positions, self.top_k);
        for (l, entry) in routes.layers.iter().enumerate() {
            let [rows, len, kk] = entry.shape;
            if kk != k || start + len > h || first_prompt + rows > self.prompts.len() {
                return Err(EvalError::Internal(format!(
                    "a routing pass recorded {:?} at prompt {first_prompt} position {start}",
                    entry.shape
                )));
            }
            for (i, row) in entry.experts.chunks_exact(len * k).enumerate() {
                let at = (l * h + start) * k;
                self.prompts[first_prompt + i][at..at + len * k].copy_from_slice(row);
            }
        }
        Ok(())
    }
}

/// Per layer and position, how many of the `k` experts `a` and `b` share and whether their
/// top-1 experts are equal.
///
/// # Shapes
/// `a`, `b`: `[L, H, k]`; returns two `[L, H]`.
fn compare(a: &[u32], b: &[u32], k: usize) -> (Vec<u8>, Vec<bool>) {
    a.chunks_exact(k)
        .zip(b.chunks_exact(k))
        .map(|(x, y)| {
            let shared = x.iter().filter(|e| y.contains(e)).count();
            (u8::try_from(shared).unwrap_or(u8::MAX), x[0] == y[0])
        })
        .unzip()
}

/// Prompt `i`'s routing trace from the four passes: both models on the reference's text
/// (`reference`, `variant`) and on the variant's (`reference_on_var`, `variant_on_var`).
pub(crate) fn routing_trace(
    i: usize,
    reference: &Routes,
    variant: &Routes,
    reference_on_var: &Routes,
    variant_on_var: &Routes,
) -> RoutingTrace {
    let k = reference.top_k;
    let (shared, top1) = compare(&reference.prompts[i], &variant.prompts[i], k);
    let (shared_on_var_text, top1_on_var_text) = compare(&reference_on_var.prompts[i], &variant_on_var.prompts[i], k);
    RoutingTrace {
        experts: reference.experts as u32,
        top_k: k as u32,
        layers: reference.layers.iter().map(|&l| l as u32).collect(),
        shared,
        top1,
        shared_on_var_text,
        top1_on_var_text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_experts_and_top1_per_position() {
        // Two positions of one layer, k = 2: the same set in another order, then one shared.
        let (shared, top1) = compare(&[3, 1, 0, 5], &[1, 3, 0, 7], 2);
        assert_eq!(shared, vec![2, 1]);
        assert_eq!(top1, vec![false, true]);
    }
}
