//! Batched greedy decoding: prompts in, a fixed number of new tokens per prompt out, every
//! step's logits shown to an observer on the way.
//!
//! Prompts are cut into batches of [`GenerationConfig::batch_size`] in order; a batch is
//! left-padded ([`prompt_batch`], shared with teacher forcing) and decoded with a preallocated
//! key-value cache. **Invariant: a prompt's tokens depend on that prompt alone, never on the other
//! rows of its batch nor on how many batches run at once; argmax runs on the device and a batch's
//! tokens are read back once (at every step only when stopping at EOS).**

use burn::tensor::{Int, Tensor, TensorData};
use qdrift_model::{KvCache, Llama, Positions};
use rayon::prelude::*;

use crate::counters::read_back;
use crate::parallel::{lock, run_batches};
use crate::request::GenerationConfig;
use crate::{ComputeDevice, GenerateError, check_request, concurrent_batches};

/// The logits of one decoding step of one batch, handed to the caller's observer.
pub struct StepLogits<'a> {
    /// Index (in the caller's prompt list) of the batch's first prompt.
    pub first_prompt: usize,
    /// Generated-token index this step predicts (0 = the first new token).
    pub step: usize,
    /// `[batch, vocab]`, f32, on the model's device.
    pub logits: &'a Tensor<2>,
    /// `[batch, 1, dim]`, the final-norm hidden states the logits come from
    /// ([`Llama::forward_hidden`]; `logits` is [`Llama::head`] of them), in the compute dtype.
    pub hidden: &'a Tensor<3>,
}

/// Generates greedily (argmax at every step) for every prompt.
///
/// Prompts of a batch are left-padded to the same length ([`Positions`]); each prompt's tokens do
/// not depend on the other prompts of its batch. `observe` sees the logits of every step of every
/// batch; with [`ComputeDevice::parallel_batches`] above 1, batches run side by side (on the CPU
/// fused into one batch of all their rows unless stopping at EOS, see `generate_batches`) and
/// their steps reach `observe` interleaved (one call at a time). Returns, per prompt, only the new
/// tokens, in prompt order.
///
/// Memory is checked before anything is allocated: the key-value cache of a batch, the attention
/// scores of the prompt pass and the logits must fit the device's largest buffer and, for devices
/// that use host memory, the memory the host has available.
pub fn generate(
    model: &Llama,
    device: &ComputeDevice,
    prompts: &[Vec<u32>],
    config: &GenerationConfig,
    mut observe: impl FnMut(StepLogits<'_>) + Send,
) -> Result<Vec<Vec<u32>>, GenerateError> {
    let observe = std::sync::Mutex::new(&mut observe);
    generate_batches(model, device, prompts, config, &|s| (*lock(&observe))(s))
}

/// [`generate`] with the work on each step's logits split in two: `map` runs on the batch's own
/// thread (batches side by side map at the same time), and `observe` gets `map`'s result one
/// call at a time, with the batch's first prompt and the step. For reductions of the logits,
/// whose results `observe` only files away.
pub fn generate_map<R>(
    model: &Llama,
    device: &ComputeDevice,
    prompts: &[Vec<u32>],
    config: &GenerationConfig,
    map: impl Fn(StepLogits<'_>) -> R + Sync,
    observe: impl FnMut(usize, usize, R) + Send,
) -> Result<Vec<Vec<u32>>, GenerateError> {
    let observe = std::sync::Mutex::new(observe);
    generate_batches(model, device, prompts, config, &|s| {
        let (first_prompt, step) = (s.first_prompt, s.step);
        let mapped = map(s);
        (*lock(&observe))(first_prompt, step, mapped)
    })
}

/// The batches of [`generate`], side by side where the device allows, each step's logits to
/// `observe` on the batch's thread.
fn generate_batches(
    model: &Llama,
    device: &ComputeDevice,
    prompts: &[Vec<u32>],
    config: &GenerationConfig,
    observe: &(dyn Fn(StepLogits<'_>) + Sync),
) -> Result<Vec<Vec<u32>>, GenerateError> {
    check_request(&model.arch, model.dtype(), device, prompts, config)?;
    let vocab = model.arch.vocab_size;
    let concurrent = concurrent_batches(&model.arch, model.dtype(), device, prompts, config);
    let results = if device.uses_host_memory && concurrent > 1 && config.stop_at_eos.is_none() {
        // On the CPU, the batches that would run side by side decode as one batch of all their
        // rows instead, its linear layers and attention spread over the cores: each step then
        // streams the weights from memory once, not once per batch (SmolLM2 f16, 16 prompts ×
        // 200 tokens on 2 Zen 2 cores: docs/BENCHMARKS.md, 'Steps measured on the way (A/B)',
        // 6ab9ac4). Tokens are the same (a row never
        // depends on its batch); `observe` still sees each batch of `batch_size` on its own,
        // with the same first prompt and steps, the batches' calls side by side. Not when
        // stopping at EOS: a fused batch would step on after one of its parts had stopped.
        let group = concurrent.saturating_mul(config.batch_size);
        let groups: Vec<&[Vec<u32>]> = prompts.chunks(group).collect();
        run_batches(groups.len(), 1, |g| {
            generate_batch(model, groups[g], g * group, vocab, config, &mut |s| {
                observe_by_batch(s, config.batch_size, observe)
            })
        })
    } else {
        let batches: Vec<&[Vec<u32>]> = prompts.chunks(config.batch_size).collect();
        run_batches(batches.len(), concurrent, |b| {
            generate_batch(model, batches[b], b * config.batch_size, vocab, config, &mut |s| observe(s))
        })
    };
    // The batches' key-value caches are freed: hand their pages back.
    qdrift_model::release_free_memory();
    let mut out = Vec::with_capacity(prompts.len());
    for rows in results {
        out.extend(rows?);
    }
    Ok(out)
}

/// One step of a fused batch handed to `observe` as the batches of `batch_size` rows it joins
/// (the last may be shorter), on rayon's threads side by side.
///
/// # Shapes
/// - `s.logits`: `[rows, vocab]` and `s.hidden`: `[rows, 1, dim]`, cut along `rows`
fn observe_by_batch(s: StepLogits<'_>, batch_size: usize, observe: &(dyn Fn(StepLogits<'_>) + Sync)) {
    let rows = s.logits.dims()[0];
    if rows <= batch_size {
        return observe(s);
    }
    let parts: Vec<(usize, Tensor<2>, Tensor<3>)> = (0..rows)
        .step_by(batch_size.max(1))
        .map(|a| {
            let b = (a + batch_size).min(rows);
            (a, s.logits.clone().narrow(0, a, b - a), s.hidden.clone().narrow(0, a, b - a))
        })
        .collect();
    parts.par_iter().for_each(|(a, logits, hidden)| {
        observe(StepLogits { first_prompt: s.first_prompt + a, step: s.step, logits, hidden });
    });
}

fn generate_batch(
    model: &Llama,
    prompts: &[Vec<u32>],
    first_prompt: usize,
    vocab: usize,
    config: &GenerationConfig,
    observe: &mut dyn FnMut(StepLogits<'_>),
) -> Result<Vec<Vec<u32>>, GenerateError> {
    let n = config.max_new_tokens;
    let batch = prompts.len();
    if n == 0 {
        return Ok(vec![Vec::new(); batch]);
    }
    let PromptBatch { positions, mut caches, tokens: mut input } =
        prompt_batch(model, prompts.iter().map(Vec::as_slice), n);
    let mut steps: Vec<Tensor<2, Int>> = Vec::with_capacity(n);
    let mut finished = vec![false; batch];
    // Each row's largest logit, summed over the steps on the device: NaN or infinite once any
    // step's logits are (an FP16 overflow), read back once with the tokens.
    let mut peaks: Option<Tensor<2>> = None;
    for step in 0..n {
        // `Llama::forward` is exactly this: the output layer over the final hidden states.
        let hidden = model.forward_hidden(input, &positions, &mut caches, false);
        let logits = model.head(hidden.clone()).reshape([batch, vocab]);
        observe(StepLogits { first_prompt, step, logits: &logits, hidden: &hidden });
        let peak = logits.clone().max_dim(1); // [batch, 1]
        peaks = Some(match peaks {
            Some(sum) => sum + peak,
            None => peak,
        });
        let next = logits.argmax(1); // [batch, 1]
        steps.push(next.clone());
        if let Some(eos) = config.stop_at_eos {
            let ids = read_ids(next.clone())?;
            for (f, &t) in finished.iter_mut().zip(&ids) {
                *f |= t == eos;
            }
            if finished.iter().all(|&f| f) {
                break;
            }
        }
        input = next;
    }
    let all = read_ids(Tensor::cat(steps, 1))?;
    let produced = all.len() / batch;
    let mut rows: Vec<Vec<u32>> = all.chunks(produced).map(<[u32]>::to_vec).collect();
    if let Some(peaks) = peaks {
        let peaks = read_back(peaks).convert::<f32>();
        let peaks = peaks.try_into_vec::<f32>().map_err(|e| GenerateError::Readback(format!("{e:?}")))?;
        if let Some(r) = peaks.iter().position(|p| !p.is_finite()) {
            return Err(overflow(model, &prompts[r], &rows[r], first_prompt + r));
        }
    }
    if let Some(eos) = config.stop_at_eos {
        for row in &mut rows {
            if let Some(at) = row.iter().position(|&t| t == eos) {
                row.truncate(at + 1);
            }
        }
    }
    Ok(rows)
}

/// The error of prompt `index` whose logits went non-finite by the last token of `continuation`:
/// where its sequence (the prompt and the continuation, whose last token was predicted by those
/// logits and never run) first leaves the compute dtype's range, found by
/// [`Llama::first_overflow`]. Generation's check, and teacher forcing's (`qdrift_eval`).
pub fn overflow(model: &Llama, prompt: &[u32], continuation: &[u32], index: usize) -> GenerateError {
    let mut sequence = prompt.to_vec();
    sequence.extend_from_slice(&continuation[..continuation.len().saturating_sub(1)]);
    GenerateError::Overflow {
        index,
        prompt_len: prompt.len(),
        at: model.first_overflow(&sequence),
        f16: model.dtype() == burn::tensor::DType::F16,
    }
}

/// A batch of prompts laid out for the model: left-padded token columns, their [`Positions`],
/// and empty caches with room for the prompts plus `extra` positions.
pub(crate) struct PromptBatch {
    pub positions: Positions,
    pub caches: Vec<KvCache>,
    /// `[batch, longest prompt]`; padding columns hold token 0, masked out of every real token's
    /// attention.
    pub tokens: Tensor<2, Int>,
}

pub(crate) fn prompt_batch<'a>(
    model: &Llama,
    prompts: impl Iterator<Item = &'a [u32]> + Clone,
    extra: usize,
) -> PromptBatch {
    let lengths: Vec<usize> = prompts.clone().map(<[u32]>::len).collect();
    let (rows, longest) = (lengths.len(), lengths.iter().copied().max().unwrap_or(0));
    let positions = Positions::left_padded(&lengths);
    let mut ids = Vec::with_capacity(rows * longest);
    for (p, &pad) in prompts.zip(&positions.pad) {
        ids.extend(std::iter::repeat_n(0i32, pad));
        ids.extend(p.iter().map(|&t| t as i32));
    }
    let caches = model.new_caches(rows, longest + extra);
    let tokens = Tensor::from_data(TensorData::new(ids, [rows, longest]), &model.device());
    PromptBatch { positions, caches, tokens }
}

fn read_ids(t: Tensor<2, Int>) -> Result<Vec<u32>, GenerateError> {
    let data = read_back(t);
    let ids = data.convert::<i64>().try_into_vec::<i64>().map_err(|e| GenerateError::Readback(format!("{e:?}")))?;
    Ok(ids.into_iter().map(|v| v as u32).collect())
}
