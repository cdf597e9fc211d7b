//! Batched greedy decoding.

use burn::tensor::DType;
use burn::tensor::{Int, Tensor, TensorData};
use qdrift_model::{AttentionKernel, KvCache, Llama, LlamaConfig, Positions};

use crate::ComputeDevice;
use crate::parallel::{lock, run_batches};

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

/// Why generation could not run.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// A prompt with no tokens.
    #[error("prompt {index} is empty: give at least one token (one character of text)")]
    EmptyPrompt {
        /// Its index (0-based).
        index: usize,
    },
    /// A token id outside the model's vocabulary.
    #[error("prompt {index} has token {token}, outside the model's vocabulary of {vocab}")]
    TokenOutOfRange {
        /// Prompt index.
        index: usize,
        /// The token.
        token: u32,
        /// Vocabulary size.
        vocab: usize,
    },
    /// The request does not fit the device.
    #[error("{0}")]
    TooLarge(String),
    /// Teacher forcing got continuations of different lengths.
    #[error("continuation {index} has {len} tokens, the first has {expected}: teacher forcing needs equal lengths")]
    UnequalContinuations {
        /// Index of the first continuation that differs.
        index: usize,
        /// Its length.
        len: usize,
        /// The first continuation's length.
        expected: usize,
    },
    /// Two models to be compared have different vocabularies.
    #[error(
        "the reference has a vocabulary of {reference} tokens, the variant {variant}: they cannot be compared position by position"
    )]
    VocabMismatch {
        /// The reference's vocabulary size.
        reference: usize,
        /// The variant's vocabulary size.
        variant: usize,
    },
    /// `batch_size` of zero.
    #[error("batch size must be at least 1")]
    ZeroBatch,
    /// Reading results back from the device failed.
    #[error("reading results from the device failed: {0}")]
    Readback(String),
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
    let results = run_batches(batches.len(), device.parallel_batches, |b| {
        generate_batch(model, batches[b], b * config.batch_size, vocab, config, &mut |s| (*lock(&observe))(s))
    });
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

/// Checks a request before anything is allocated: prompts must be non-empty and in the
/// vocabulary, and each batch's key-value cache, prompt-pass attention scores and logits must fit
/// the device's largest buffer and, for devices that use host memory, the memory the host has
/// available.
pub fn check_request(
    model: &LlamaConfig,
    dtype: DType,
    device: &ComputeDevice,
    prompts: &[Vec<u32>],
    config: &GenerationConfig,
) -> Result<(), GenerateError> {
    if config.batch_size == 0 {
        return Err(GenerateError::ZeroBatch);
    }
    let vocab = model.vocab_size;
    for (index, p) in prompts.iter().enumerate() {
        if p.is_empty() {
            return Err(GenerateError::EmptyPrompt { index });
        }
        if let Some(&token) = p.iter().find(|&&t| t as usize >= vocab) {
            return Err(GenerateError::TokenOutOfRange { index, token, vocab });
        }
    }
    // Batches running side by side hold their caches at once: the largest ones together must fit.
    let concurrent = device.parallel_batches.clamp(1, prompts.len().div_ceil(config.batch_size).max(1));
    for batch in prompts.chunks(config.batch_size) {
        check_memory(model, dtype, device, batch, config.max_new_tokens, concurrent)?;
    }
    Ok(())
}

fn check_memory(
    model: &LlamaConfig,
    dtype: DType,
    device: &ComputeDevice,
    prompts: &[Vec<u32>],
    max_new_tokens: usize,
    concurrent: usize,
) -> Result<(), GenerateError> {
    // u128: a request of any usize size is measured without overflow.
    let batch = prompts.len() as u128;
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0) as u128;
    let capacity = longest + max_new_tokens as u128;
    let elem = dtype.size() as u128;
    let cache_tensor = batch * model.n_kv_heads as u128 * capacity * model.head_dim() as u128 * elem;
    let cache_total = 2 * model.n_layers as u128 * cache_tensor;
    // Burn's composed attention materialises the prompt's f32 scores; the host kernel holds one
    // query's scores at a time.
    let scores = match AttentionKernel::for_device(&device.device) {
        AttentionKernel::Composed => batch * model.n_heads as u128 * longest * longest * 4,
        AttentionKernel::Host => 0,
    };
    let logits = batch * model.vocab_size as u128 * 4;
    let gib = |b: u128| b as f64 / (1u64 << 30) as f64;
    let what = format!("{} prompt(s) of up to {longest} tokens + {max_new_tokens} new tokens", prompts.len());
    if let Some(limit) = device.max_buffer_bytes {
        let largest = cache_tensor.max(scores).max(logits);
        if largest > limit as u128 {
            return Err(GenerateError::TooLarge(format!(
                "{what} need a {:.2} GiB buffer, more than the {:.2} GiB that {} allows in one buffer; use fewer new tokens, shorter prompts or a smaller --batch-size",
                gib(largest),
                gib(limit as u128),
                device.adapter
            )));
        }
    }
    if device.uses_host_memory {
        let mut sys = sysinfo::System::new();
        sys.refresh_memory();
        let available = sys.available_memory() as u128;
        let needed = (cache_total + scores + logits) * concurrent as u128;
        if needed > available {
            return Err(GenerateError::TooLarge(format!(
                "{what} need {:.2} GiB of key-value cache and activations, more than the {:.2} GiB of memory available; use fewer new tokens or a smaller --batch-size",
                gib(needed),
                gib(available)
            )));
        }
    }
    Ok(())
}
