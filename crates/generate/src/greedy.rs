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

use crate::parallel::{lock, run_batches};
use crate::{ComputeDevice, GenerateError, check_request, concurrent_batches};

/// How to generate.
#[derive(Debug, Clone)]
pub struct GenerationConfig {
    /// New tokens per prompt (exactly this many unless `stop_at_eos`).
    pub max_new_tokens: usize,
    /// Prompts per batch; prompts are processed in this order, `batch_size` at a time.
    pub batch_size: usize,
    /// Stop a prompt at this token (included in its output) when set.
    pub stop_at_eos: Option<u32>,
}

/// The logits of one decoding step of one batch, handed to the caller's observer.
pub struct StepLogits<'a> {
    /// Index (in the caller's prompt list) of the batch's first prompt.
    pub first_prompt: usize,
    /// Generated-token index this step predicts (0 = the first new token).
    pub step: usize,
    /// `[batch, vocab]`, f32, on the model's device.
    pub logits: &'a Tensor<2>,
}

/// Generates greedily (argmax at every step) for every prompt.
///
/// Prompts of a batch are left-padded to the same length ([`Positions`]); each prompt's tokens do
/// not depend on the other prompts of its batch. `observe` sees the logits of every step of every
/// batch; with [`ComputeDevice::parallel_batches`] above 1, batches run side by side and their
/// steps reach `observe` interleaved (one call at a time). Returns, per prompt, only the new
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
    observe: impl FnMut(StepLogits<'_>) + Send,
) -> Result<Vec<Vec<u32>>, GenerateError> {
    check_request(&model.config, model.dtype(), device, prompts, config)?;
    let vocab = model.config.vocab_size;
    let batches: Vec<&[Vec<u32>]> = prompts.chunks(config.batch_size).collect();
    let observe = std::sync::Mutex::new(observe);
    let concurrent = concurrent_batches(&model.config, model.dtype(), device, prompts, config);
    let results = run_batches(batches.len(), concurrent, |b| {
        generate_batch(model, batches[b], b * config.batch_size, vocab, config, &mut |s| (*lock(&observe))(s))
    });
    // The batches' key-value caches are freed: hand their pages back.
    qdrift_model::release_free_memory();
    let mut out = Vec::with_capacity(prompts.len());
    for rows in results {
        out.extend(rows?);
    }
    Ok(out)
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
    for step in 0..n {
        let logits = model.forward(input, &positions, &mut caches, false).reshape([batch, vocab]);
        observe(StepLogits { first_prompt, step, logits: &logits });
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
    if let Some(eos) = config.stop_at_eos {
        for row in &mut rows {
            if let Some(at) = row.iter().position(|&t| t == eos) {
                row.truncate(at + 1);
            }
        }
    }
    Ok(rows)
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
    let data = t.into_data();
    let ids = data.convert::<i64>().try_into_vec::<i64>().map_err(|e| GenerateError::Readback(format!("{e:?}")))?;
    Ok(ids.into_iter().map(|v| v as u32).collect())
}
