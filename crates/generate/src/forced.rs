//! Teacher forcing: the logits a model assigns to a given continuation, one forward pass over
//! prompt + continuation (chunked over positions so that memory stays bounded).

use burn::tensor::{Int, Tensor, TensorData};
use qdrift_model::Llama;

use crate::greedy::{PromptBatch, prompt_batch};
use crate::{ComputeDevice, GenerateError, GenerationConfig, check_request};

/// The logits of a chunk of continuation positions of one batch.
pub struct ForcedLogits<'a> {
    /// Index (in the caller's list) of the batch's first sequence.
    pub first_prompt: usize,
    /// Index of the first continuation token these logits predict.
    pub start: usize,
    /// `[batch, chunk, vocab]`, f32, on the model's device: `logits[b, i]` is the distribution
    /// the model predicts for continuation token `start + i` of sequence `b`, given the prompt
    /// and the continuation tokens before it.
    pub logits: &'a Tensor<3>,
}

/// Feeds every `(prompt, continuation)` pair through `model` and hands the logits predicting each
/// continuation token to `observe`, `chunk` positions at a time.
///
/// All continuations must have the same length (free-running generation of a fixed number of
/// tokens produces that). Prompts are left-padded per batch as in [`crate::generate`], so the
/// logits of a sequence do not depend on the rest of its batch.
pub fn teacher_forced(
    model: &Llama,
    device: &ComputeDevice,
    sequences: &[(Vec<u32>, Vec<u32>)],
    batch_size: usize,
    chunk: usize,
    mut observe: impl FnMut(ForcedLogits<'_>),
) -> Result<(), GenerateError> {
    let n = sequences.first().map_or(0, |(_, c)| c.len());
    if let Some(i) = sequences.iter().position(|(_, c)| c.len() != n) {
        return Err(GenerateError::UnequalContinuations { index: i, len: sequences[i].1.len(), expected: n });
    }
    let prompts: Vec<Vec<u32>> = sequences.iter().map(|(p, _)| p.clone()).collect();
    let config = GenerationConfig { max_new_tokens: n, batch_size, stop_at_eos: None };
    check_request(&model.config, model.dtype(), device, &prompts, &config)?;
    let vocab = model.config.vocab_size;
    if let Some((i, &t)) = sequences.iter().enumerate().find_map(|(i, (_, c))| c.iter().find(|&&t| t as usize >= vocab).map(|t| (i, t))) {
        return Err(GenerateError::TokenOutOfRange { index: i, token: t, vocab });
    }
    let chunk = chunk.max(1);
    for (b, batch) in sequences.chunks(batch_size).enumerate() {
        forced_batch(model, batch, b * batch_size, n, chunk, &mut observe);
    }
    Ok(())
}

fn forced_batch(
    model: &Llama,
    batch: &[(Vec<u32>, Vec<u32>)],
    first_prompt: usize,
    n: usize,
    chunk: usize,
    observe: &mut impl FnMut(ForcedLogits<'_>),
) {
    if n == 0 {
        return;
    }
    let rows = batch.len();
    let device = model.device();
    let PromptBatch { positions, mut caches, tokens: prompt } = prompt_batch(model, batch.iter().map(|(p, _)| p.as_slice()), n);
    // The last prompt column predicts continuation token 0.
    let logits = model.forward(prompt, &positions, &mut caches, false);
    observe(ForcedLogits { first_prompt, start: 0, logits: &logits });
    // Continuation tokens 0..n-1 predict tokens 1..n.
    let mut start = 0;
    while start + 1 < n {
        let len = chunk.min(n - 1 - start);
        let mut cols = Vec::with_capacity(rows * len);
        for (_, c) in batch {
            cols.extend(c[start..start + len].iter().map(|&t| t as i32));
        }
        let input: Tensor<2, Int> = Tensor::from_data(TensorData::new(cols, [rows, len]), &device);
        let logits = model.forward(input, &positions, &mut caches, true);
        observe(ForcedLogits { first_prompt, start: start + 1, logits: &logits });
        start += len;
    }
}
