//! Teacher forcing: the logits a model assigns to a given continuation, one forward pass over
//! prompt + continuation (chunked over positions so that memory stays bounded).
//!
//! The evaluation scores each model on the other's text with it; [`teacher_forced_pair`] runs two
//! models in lockstep so that their logits can be compared where they are, on the device.
//! **Invariant: batches are cut and left-padded exactly as [`crate::generate`] cuts them, and a
//! chunk's logits do not depend on the chunk length nor on the other rows of the batch; models in
//! lockstep see identical batches.**

use std::sync::Mutex;

use burn::tensor::{Int, Tensor, TensorData};
use qdrift_model::{KvCache, LayerRoutes, Llama, Positions, RoutingRecord};

use crate::greedy::{PromptBatch, prompt_batch};
use crate::parallel::{lock, run_batches};
use crate::{ComputeDevice, GenerateError, GenerationConfig, check_request, concurrent_batches};

/// One teacher-forcing request: the `(prompt, continuation)` pairs to score, how many pairs go in
/// a batch, how many continuation positions one forward pass takes, and the device they run on.
#[derive(Clone, Copy)]
pub struct Forcing<'a> {
    /// Where the model runs (its batching limits and memory).
    pub device: &'a ComputeDevice,
    /// `(prompt, continuation)` pairs; every continuation has the same length.
    pub sequences: &'a [(Vec<u32>, Vec<u32>)],
    /// Pairs per batch, cut in order as [`crate::generate`] cuts prompts.
    pub batch_size: usize,
    /// Continuation positions per forward pass (at least 1 is used).
    pub chunk: usize,
}

/// The logits of a chunk of continuation positions of one batch, handed over: an observer that
/// reads them back on the CPU backend takes them without a copy.
pub struct ForcedLogits {
    /// Index (in the caller's list) of the batch's first sequence.
    pub first_prompt: usize,
    /// Index of the first continuation token these logits predict.
    pub start: usize,
    /// `[batch, chunk, vocab]`, f32, on the model's device: `logits[b, i]` is the distribution
    /// the model predicts for continuation token `start + i` of sequence `b`, given the prompt
    /// and the continuation tokens before it.
    pub logits: Tensor<3>,
}

/// Feeds every `(prompt, continuation)` pair through `model` and hands the logits predicting each
/// continuation token to `observe`, `chunk` positions at a time.
///
/// All continuations must have the same length (free-running generation of a fixed number of
/// tokens produces that). Prompts are left-padded per batch as in [`crate::generate`], so the
/// logits of a sequence do not depend on the rest of its batch.
pub fn teacher_forced(
    model: &Llama,
    forcing: Forcing<'_>,
    mut observe: impl FnMut(ForcedLogits) + Send,
) -> Result<(), GenerateError> {
    one_model(model, ForcedRequest::new(forcing, Output::Logits), |f| f, |_, _, f| observe(f))
}

/// The experts a model routes each continuation position to, for one chunk of one batch.
pub struct ForcedRoutes {
    /// Index (in the caller's list) of the batch's first sequence.
    pub first_prompt: usize,
    /// Index of the first continuation token these routes belong to.
    pub start: usize,
    /// One entry per mixture-of-experts layer, in block order, each `[batch, chunk, top_k]`:
    /// the experts of the column whose output predicts continuation token `start + i` of
    /// sequence `b` (the prompt's last column for token 0), the weightiest first.
    pub routes: RoutingRecord,
}

/// The routing of a model with experts along every `(prompt, continuation)` pair: batched and
/// chunked as [`teacher_forced`], each chunk's choices to `observe` (a model without experts
/// hands out empty records). The output layer is not run.
pub fn teacher_forced_routes(
    model: &Llama,
    forcing: Forcing<'_>,
    mut observe: impl FnMut(ForcedRoutes) + Send,
) -> Result<(), GenerateError> {
    teacher_forced_lockstep(
        &[model],
        ForcedRequest::new(forcing, Output::Routes),
        |first_prompt, start, outputs| {
            let routes = outputs.into_iter().next().map(|c| c.routes).unwrap_or_default();
            ForcedRoutes { first_prompt, start, routes }
        },
        |_, _, r| observe(r),
    )
}

/// [`teacher_forced`], handing out the final-norm hidden states instead of the logits:
/// `observe` gets [`ForcedLogits`] whose `logits` field holds `[batch, chunk, dim]` in the
/// model's compute dtype, and [`Llama::head`] of them is exactly what [`teacher_forced`] hands
/// out for the same chunk. Keeping these costs `dim` numbers per position instead of `vocab`.
pub fn teacher_forced_hidden(
    model: &Llama,
    forcing: Forcing<'_>,
    mut observe: impl FnMut(ForcedLogits) + Send,
) -> Result<(), GenerateError> {
    one_model(model, ForcedRequest::new(forcing, Output::Hidden), |f| f, |_, _, f| observe(f))
}

/// [`teacher_forced`] with the work on each chunk split in two: `map` runs on the batch's own
/// thread as soon as its chunk is computed (batches side by side map at the same time), and
/// `observe` gets `map`'s result one call at a time, with the chunk's first prompt and position.
/// For reductions of the logits, whose results `observe` only files away.
pub fn teacher_forced_map<R>(
    model: &Llama,
    forcing: Forcing<'_>,
    map: impl Fn(ForcedLogits) -> R + Sync,
    observe: impl FnMut(usize, usize, R) + Send,
) -> Result<(), GenerateError> {
    one_model(model, ForcedRequest::new(forcing, Output::Logits), map, observe)
}

/// [`teacher_forced_lockstep`] for one model: each chunk's output as [`ForcedLogits`] to `map`
/// (on the batch's thread), `map`'s result to `observe` (one call at a time).
fn one_model<R>(
    model: &Llama,
    request: ForcedRequest<'_>,
    map: impl Fn(ForcedLogits) -> R + Sync,
    observe: impl FnMut(usize, usize, R) + Send,
) -> Result<(), GenerateError> {
    let map = |first_prompt, start, outputs: Vec<Chunk>| {
        // One model, one output per chunk.
        outputs.into_iter().next().map(|c| map(ForcedLogits { first_prompt, start, logits: c.output }))
    };
    let mut observe = observe;
    teacher_forced_lockstep(&[model], request, map, |p, s, r| {
        if let Some(r) = r {
            observe(p, s, r);
        }
    })
}

/// A [`Forcing`] and what each of its chunks hands out, as the private drivers take it.
#[derive(Clone, Copy)]
struct ForcedRequest<'a> {
    device: &'a ComputeDevice,
    sequences: &'a [(Vec<u32>, Vec<u32>)],
    batch_size: usize,
    chunk: usize,
    output: Output,
}

impl<'a> ForcedRequest<'a> {
    fn new(forcing: Forcing<'a>, output: Output) -> Self {
        let Forcing { device, sequences, batch_size, chunk } = forcing;
        ForcedRequest { device, sequences, batch_size, chunk, output }
    }
}

/// What a teacher-forced pass hands out per chunk.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Output {
    /// Logits, `[batch, chunk, vocab]` f32 ([`Llama::forward`]).
    Logits,
    /// Final-norm hidden states, `[batch, chunk, dim]` ([`Llama::forward_hidden`]).
    Hidden,
    /// The experts each mixture-of-experts layer chose ([`Llama::forward_hidden_recording`]);
    /// the tensor is the last column's hidden state, unused.
    Routes,
}

/// One model's output for one chunk: the tensor [`Output`] asks for, and the routing record
/// (empty unless [`Output::Routes`]).
struct Chunk {
    output: Tensor<3>,
    routes: RoutingRecord,
}

impl Output {
    /// Runs `tokens` (`[batch, new]`) through `model`; `keep`: how many of the new columns the
    /// chunk's routes keep (the last ones).
    fn forward(
        self,
        model: &Llama,
        tokens: Tensor<2, Int>,
        positions: &Positions,
        caches: &mut [KvCache],
        (all, keep): (bool, usize),
    ) -> Chunk {
        let output = match self {
            Output::Logits => model.forward(tokens, positions, caches, all),
            Output::Hidden => model.forward_hidden(tokens, positions, caches, all),
            Output::Routes => {
                let record = Mutex::new(RoutingRecord::default());
                let output = model.forward_hidden_recording(tokens, positions, caches, false, Some(&record));
                let routes = record.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
                return Chunk { output, routes: last_columns(routes, keep) };
            }
        };
        Chunk { output, routes: RoutingRecord::default() }
    }
}

/// Each entry of `record` cut to its last `keep` columns (`[batch, seq, k]` → `[batch, keep, k]`).
fn last_columns(record: RoutingRecord, keep: usize) -> RoutingRecord {
    let layers = record
        .layers
        .into_iter()
        .map(|e| {
            let [b, t, k] = e.shape;
            if keep >= t {
                return e;
            }
            let experts =
                e.experts.chunks_exact((t * k).max(1)).flat_map(|row| row[(t - keep) * k..].to_vec()).collect();
            LayerRoutes { layer: e.layer, shape: [b, keep, k], experts }
        })
        .collect();
    RoutingRecord { layers }
}

/// The logits several models assign to the same positions, for comparing them there.
pub struct PairedLogits<'a> {
    /// Index (in the caller's list) of the batch's first sequence.
    pub first_prompt: usize,
    /// Index of the first continuation token these logits predict.
    pub start: usize,
    /// `[batch, chunk, vocab]` of the first model (the reference), as in [`ForcedLogits`].
    pub reference: &'a Tensor<3>,
    /// `[batch, chunk, vocab]` of the second model (the variant), for the same positions.
    pub variant: &'a Tensor<3>,
}

/// [`teacher_forced`] for two models in lockstep: both score the same sequences, batched the same
/// way, and `observe` gets both models' logits of each chunk at once, so that per-position
/// comparisons (KL divergence, top-1 agreement) can be reduced on the device without holding a
/// whole run's full-vocabulary logits. Both models must share a device and a vocabulary.
pub fn teacher_forced_pair(
    reference: &Llama,
    variant: &Llama,
    forcing: Forcing<'_>,
    mut observe: impl FnMut(PairedLogits<'_>) + Send,
) -> Result<(), GenerateError> {
    if reference.arch.vocab_size != variant.arch.vocab_size {
        return Err(GenerateError::VocabMismatch {
            reference: reference.arch.vocab_size,
            variant: variant.arch.vocab_size,
        });
    }
    teacher_forced_lockstep(
        &[reference, variant],
        ForcedRequest::new(forcing, Output::Logits),
        |_, _, chunks| chunks.into_iter().map(|c| c.output).collect::<Vec<_>>(),
        |first_prompt, start, logits| {
            observe(PairedLogits { first_prompt, start, reference: &logits[0], variant: &logits[1] })
        },
    )
}

/// Every model of `models` over the same batches and chunks: each chunk's outputs (one per
/// model) go to `map` on the batch's own thread, outside the lock that serializes `observe`, so
/// batches side by side map (reduce) their chunks at the same time.
fn teacher_forced_lockstep<R>(
    models: &[&Llama],
    request: ForcedRequest<'_>,
    map: impl Fn(usize, usize, Vec<Chunk>) -> R + Sync,
    observe: impl FnMut(usize, usize, R) + Send,
) -> Result<(), GenerateError> {
    let ForcedRequest { device, sequences, batch_size, chunk, .. } = request;
    let n = sequences.first().map_or(0, |(_, c)| c.len());
    if let Some(i) = sequences.iter().position(|(_, c)| c.len() != n) {
        return Err(GenerateError::UnequalContinuations { index: i, len: sequences[i].1.len(), expected: n });
    }
    let prompts: Vec<Vec<u32>> = sequences.iter().map(|(p, _)| p.clone()).collect();
    let config = GenerationConfig { max_new_tokens: n, batch_size, stop_at_eos: None };
    for model in models {
        check_request(&model.arch, model.dtype(), device, &prompts, &config)?;
        let vocab = model.arch.vocab_size;
        if let Some((i, &t)) = sequences
            .iter()
            .enumerate()
            .find_map(|(i, (_, c))| c.iter().find(|&&t| t as usize >= vocab).map(|t| (i, t)))
        {
            return Err(GenerateError::TokenOutOfRange { index: i, token: t, vocab });
        }
    }
    let chunked = ForcedRequest { chunk: chunk.max(1), ..request };
    let batches: Vec<&[(Vec<u32>, Vec<u32>)]> = sequences.chunks(batch_size).collect();
    let observe = std::sync::Mutex::new(observe);
    // Models in lockstep hold their caches at once: the one with the largest decides.
    let concurrent =
        models.iter().map(|m| concurrent_batches(&m.arch, m.dtype(), device, &prompts, &config)).min().unwrap_or(1);
    run_batches(batches.len(), concurrent, |b| {
        forced_batch(models, batches[b], b * batch_size, n, &chunked, &mut |p, s, l| {
            let mapped = map(p, s, l);
            (*lock(&observe))(p, s, mapped)
        });
    });
    // The batches' key-value caches are freed: hand their pages back.
    qdrift_model::release_free_memory();
    Ok(())
}

/// One batch of `request` (its `chunk` at least 1), the sequences from `first_prompt` on, each
/// continuation `n` tokens long; `observe` gets every chunk's outputs, one per model.
fn forced_batch(
    models: &[&Llama],
    batch: &[(Vec<u32>, Vec<u32>)],
    first_prompt: usize,
    n: usize,
    request: &ForcedRequest<'_>,
    observe: &mut dyn FnMut(usize, usize, Vec<Chunk>),
) {
    let (chunk, output) = (request.chunk, request.output);
    if n == 0 {
        return;
    }
    let rows = batch.len();
    let mut states: Vec<PromptBatch> =
        models.iter().map(|m| prompt_batch(m, batch.iter().map(|(p, _)| p.as_slice()), n)).collect();
    // The last prompt column predicts continuation token 0.
    let logits: Vec<Chunk> = models
        .iter()
        .zip(&mut states)
        .map(|(m, s)| output.forward(m, s.tokens.clone(), &s.positions, &mut s.caches, (false, 1)))
        .collect();
    observe(first_prompt, 0, logits);
    // Continuation tokens 0..n-1 predict tokens 1..n.
    let mut start = 0;
    while start + 1 < n {
        let len = chunk.min(n - 1 - start);
        let mut cols = Vec::with_capacity(rows * len);
        for (_, c) in batch {
            cols.extend(c[start..start + len].iter().map(|&t| t as i32));
        }
        let logits: Vec<Chunk> = models
            .iter()
            .zip(&mut states)
            .map(|(m, s)| {
                let input: Tensor<2, Int> = Tensor::from_data(TensorData::new(cols.clone(), [rows, len]), &m.device());
                output.forward(m, input, &s.positions, &mut s.caches, (true, len))
            })
            .collect();
        observe(first_prompt, start + 1, logits);
        start += len;
    }
}
