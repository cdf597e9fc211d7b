//! A request ([`GenerationConfig`]) and its sizing before anything is allocated: the default batch size, the context-length
//! warning, and the check that prompts and memory fit the model and the device.
//!
//! `qdrift generate` and `qdrift eval` both size their requests here, so that they batch and
//! warn alike. **Invariant: nothing here touches the device; a request that passes
//! [`check_request`] does not run out of buffer or host memory for its key-value caches,
//! prompt-pass attention scores and logits.**

use burn::tensor::DType;
use qdrift_model::AttentionKernel;
use qdrift_weights::ModelArch;

use crate::{ComputeDevice, GenerateError};

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

/// The most prompts a default batch holds.
///
/// Results never depend on the batch size; the cap only bounds a batch's memory (its key-value
/// caches and logits grow with the rows), so that many prompts on one GPU run as several batches
/// instead of one that may not fit.
pub const MAX_DEFAULT_BATCH_SIZE: usize = 16;

/// Prompts per batch when the user gives none: `prompts` split evenly over the batches `device`
/// runs at once ([`ComputeDevice::parallel_batches`]: one per core on the CPU backend, one on a
/// GPU), at most [`MAX_DEFAULT_BATCH_SIZE`], at least 1.
///
/// On a 2-core CPU, 32 prompts make 2 batches of 16 and 8 prompts 2 batches of 4; on a GPU, 40
/// prompts make batches of 16, 16 and 8.
pub fn default_batch_size(prompts: usize, device: &ComputeDevice) -> usize {
    prompts.div_ceil(device.parallel_batches.max(1)).clamp(1, MAX_DEFAULT_BATCH_SIZE)
}

/// A request that runs past the context length the model was trained for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextOverflow {
    /// Positions the longest prompt and its new tokens take.
    pub positions: usize,
    /// The model's trained context length.
    pub trained: usize,
}

impl std::fmt::Display for ContextOverflow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} positions exceed the {} the model was trained for; RoPE extrapolates beyond them",
            self.positions, self.trained
        )
    }
}

/// `Some` when the longest prompt plus `max_new_tokens` exceeds `trained` (the model's
/// `max_seq_len`): such a run works, but its positions beyond `trained` are extrapolated, which
/// the user should know. Not an error: the model may well cope.
pub fn context_overflow(prompts: &[Vec<u32>], max_new_tokens: usize, trained: usize) -> Option<ContextOverflow> {
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let positions = longest.saturating_add(max_new_tokens);
    (positions > trained).then_some(ContextOverflow { positions, trained })
}

/// Requests whose prompt plus new tokens exceed this many times the model's trained context are
/// refused unless the user asks for them (`--allow-long`): they pass the memory check but run for
/// minutes to hours, with every position past the trained context extrapolated.
pub const LONG_REQUEST_FACTOR: usize = 8;

/// Bytes of prompt text allowed per position of the longest request
/// ([`LONG_REQUEST_FACTOR`] × the trained context), checked before tokenizing: generous (no
/// tokenizer's pieces average more than a few bytes), so only a prompt that no tokenization could
/// fit is refused, before the tokenizer spends time on it.
pub const MAX_PROMPT_BYTES_PER_TOKEN: usize = 32;

/// A prompt that cannot run on a model: too long for its trained context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PromptTooLong {
    /// The text alone is longer than any prompt of the longest request can be.
    #[error(
        "is {bytes} bytes, more than the {limit} bytes a prompt may have for a model trained on {trained} positions \
         ({LONG_REQUEST_FACTOR} × {trained} positions × {MAX_PROMPT_BYTES_PER_TOKEN} bytes); shorten it"
    )]
    Bytes {
        /// The prompt's length in bytes.
        bytes: usize,
        /// The most bytes allowed.
        limit: usize,
        /// The model's trained context.
        trained: usize,
    },
    /// The encoded prompt alone exceeds the longest request.
    #[error(
        "is {tokens} tokens, more than {limit} ({LONG_REQUEST_FACTOR} × the {trained} positions the model was trained \
         for); shorten it or pass --allow-long"
    )]
    Tokens {
        /// The prompt's length in tokens.
        tokens: usize,
        /// The most tokens allowed.
        limit: usize,
        /// The model's trained context.
        trained: usize,
    },
}

/// Refuses a prompt text that could not fit [`LONG_REQUEST_FACTOR`] × `trained` positions even at
/// [`MAX_PROMPT_BYTES_PER_TOKEN`] bytes per token, so that it is never tokenized (also with
/// `--allow-long`: the bound is far beyond any prompt a model can use).
pub fn check_prompt_text(text: &str, trained: usize) -> Result<(), PromptTooLong> {
    let limit = trained.saturating_mul(LONG_REQUEST_FACTOR).saturating_mul(MAX_PROMPT_BYTES_PER_TOKEN);
    if text.len() > limit {
        return Err(PromptTooLong::Bytes { bytes: text.len(), limit, trained });
    }
    Ok(())
}

/// Refuses an encoded prompt longer than [`LONG_REQUEST_FACTOR`] × the `trained` context unless
/// `allow_long`. (Prompts beyond the trained context itself run, with a warning
/// ([`context_overflow`]).)
pub fn check_prompt_tokens(tokens: &[u32], trained: usize, allow_long: bool) -> Result<(), PromptTooLong> {
    let limit = trained.saturating_mul(LONG_REQUEST_FACTOR);
    if tokens.len() > limit && !allow_long {
        return Err(PromptTooLong::Tokens { tokens: tokens.len(), limit, trained });
    }
    Ok(())
}

/// Refuses a request whose longest prompt plus `max_new_tokens` exceeds
/// [`LONG_REQUEST_FACTOR`] × `trained` positions unless `allow_long`; `option` names the flag that
/// set the new tokens (`--horizons`, `--max-new-tokens`). Sizes that overflow `usize` are refused
/// even with `allow_long`.
pub fn check_length(
    prompts: &[Vec<u32>],
    max_new_tokens: usize,
    trained: usize,
    allow_long: bool,
    option: &str,
) -> Result<(), GenerateError> {
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let limit = trained.saturating_mul(LONG_REQUEST_FACTOR);
    let Some(positions) = longest.checked_add(max_new_tokens) else {
        return Err(GenerateError::TooLarge(format!("{option} {max_new_tokens}: the request's positions overflow")));
    };
    if positions > limit && !allow_long {
        return Err(GenerateError::TooLarge(format!(
            "{option} {max_new_tokens}: {positions} positions (longest prompt {longest} + {max_new_tokens} new tokens) \
             exceed the limit of {limit}, {LONG_REQUEST_FACTOR} × the model's trained context of {trained}; \
             pass --allow-long to run it anyway"
        )));
    }
    Ok(())
}

/// Checks a request before anything is allocated: prompts must be non-empty and in the
/// vocabulary, a LongRoPE model's requests within its original context
/// ([`ModelArch::short_rope_limit`]: `GenerateError::LongRopeContext`, also under `--allow-long`),
/// and each batch's key-value cache, prompt-pass attention scores and logits must fit the
/// device's largest buffer and, for devices that use host memory, the memory the host has
/// available.
pub fn check_request(
    model: &ModelArch,
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
    check_short_rope(model, prompts, config.max_new_tokens)?;
    check_weight_buffers(model, dtype, device)?;
    // Batches running side by side hold their caches at once: the largest ones together must fit.
    let concurrent = concurrent_batches(model, dtype, device, prompts, config);
    for batch in prompts.chunks(config.batch_size) {
        check_memory(model, dtype, device, batch, config.max_new_tokens, concurrent)?;
    }
    Ok(())
}

/// Refuses a model one row of whose weights, in `dtype`, is larger than the device's largest
/// buffer, naming the layer. A larger tensor is split into ranges of rows that fit
/// ([`ComputeDevice::build_model`]: the token embedding by rows, a linear layer by output
/// columns, each a row of `in` values), so only a single row past the limit cannot run.
fn check_weight_buffers(model: &ModelArch, dtype: DType, device: &ComputeDevice) -> Result<(), GenerateError> {
    let Some(limit) = device.max_buffer_bytes else {
        return Ok(());
    };
    let mut rows = vec![
        ("token embedding", model.dim),
        ("attention output projection", model.q_dim()),
        ("feed-forward down projection", model.hidden_dim),
    ];
    if let Some(moe) = &model.moe {
        rows.push(("expert down projection", moe.expert_hidden));
    }
    let size = dtype.size() as u128;
    let Some((name, values)) =
        rows.into_iter().max_by_key(|(_, n)| *n).filter(|(_, n)| *n as u128 * size > u128::from(limit))
    else {
        return Ok(());
    };
    Err(GenerateError::TooLarge(format!(
        "one row of the model's {name} ({values} values, {} bytes in {dtype:?}) is larger than the {limit} bytes that {} allows in one buffer; use --backend cpu, or a GPU",
        values as u128 * size,
        device.adapter
    )))
}

/// Refuses a request past a LongRoPE model's original context ([`ModelArch::short_rope_limit`]):
/// `transformers` runs its long factors beyond it (and `Phi3ForCausalLM` recomputes the sequence
/// with them), qdrift only the short ones, so its results there would not be the model's.
fn check_short_rope(model: &ModelArch, prompts: &[Vec<u32>], new_tokens: usize) -> Result<(), GenerateError> {
    let Some(original) = model.short_rope_limit() else {
        return Ok(());
    };
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let positions = longest.saturating_add(new_tokens);
    if positions > original {
        return Err(GenerateError::LongRopeContext { positions, longest, new_tokens, original });
    }
    Ok(())
}

/// The most bytes of key-value cache that batches running side by side may hold together on a
/// device that uses host memory (the CPU backend); above it they run one at a time, each
/// spreading its linear layers over the cores instead.
///
/// Side by side is faster on the CPU (each batch keeps a core busy through the whole step, not
/// only in its matrix products) but holds one cache per batch at once: for SmolLM2's f32 noise
/// floor, 2 batches of 8 prompts × 1,030 positions hold 760 MB instead of 380 MB. Results never
/// depend on it.
pub const SIDE_BY_SIDE_CACHE_BYTES: u128 = 512 << 20;

/// How many batches of a request run at once: up to [`ComputeDevice::parallel_batches`] and the
/// number of batches, and on a device that uses host memory only as many as keep their key-value
/// caches within [`SIDE_BY_SIDE_CACHE_BYTES`] together (at least one).
pub fn concurrent_batches(
    model: &ModelArch,
    dtype: DType,
    device: &ComputeDevice,
    prompts: &[Vec<u32>],
    config: &GenerationConfig,
) -> usize {
    let batch_size = config.batch_size.max(1);
    let threads = device.parallel_batches.clamp(1, prompts.len().div_ceil(batch_size).max(1));
    if !device.uses_host_memory || threads == 1 {
        return threads;
    }
    let largest =
        prompts.chunks(batch_size).map(|b| cache_bytes(model, dtype, b, config.max_new_tokens)).max().unwrap_or(0);
    if largest == 0 {
        return threads;
    }
    (SIDE_BY_SIDE_CACHE_BYTES / largest).clamp(1, threads as u128) as usize
}

/// One batch's key-value cache: `[2 · batch, kv_heads, longest prompt + new tokens, head_dim]`
/// per layer (keys and values in one tensor, `qdrift_model::KvCache`), in `dtype`; and one such
/// tensor.
fn cache_bytes_and_tensor(
    model: &ModelArch,
    dtype: DType,
    prompts: &[Vec<u32>],
    max_new_tokens: usize,
) -> (u128, u128) {
    // u128: a request of any usize size is measured without overflow.
    let batch = prompts.len() as u128;
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0) as u128;
    let capacity = longest + max_new_tokens as u128;
    let cache_tensor =
        2 * batch * model.n_kv_heads as u128 * capacity * model.head_dim() as u128 * dtype.size() as u128;
    (model.n_layers as u128 * cache_tensor, cache_tensor)
}

pub(crate) fn cache_bytes(model: &ModelArch, dtype: DType, prompts: &[Vec<u32>], max_new_tokens: usize) -> u128 {
    cache_bytes_and_tensor(model, dtype, prompts, max_new_tokens).0
}

fn check_memory(
    model: &ModelArch,
    dtype: DType,
    device: &ComputeDevice,
    prompts: &[Vec<u32>],
    max_new_tokens: usize,
    concurrent: usize,
) -> Result<(), GenerateError> {
    let (cache_total, cache_tensor) = cache_bytes_and_tensor(model, dtype, prompts, max_new_tokens);
    let batch = prompts.len() as u128;
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0) as u128;
    // Burn's attention materialises the prompt's scores and masks, which grow with its square;
    // the host kernel holds one query's scores at a time.
    let scores = prompt_pass_attention_bytes(model, dtype, device, prompts);
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
                "{what} need {:.2} GiB of key-value cache and activations (the prompt pass holds attention scores for every pair of its positions), more than the {:.2} GiB of memory available; use shorter prompts, fewer new tokens or a smaller --batch-size",
                gib(needed),
                gib(available)
            )));
        }
    }
    Ok(())
}

/// The bytes the prompt pass of `batch` holds for attention beyond the caches, whatever the
/// prompt's length (they grow with its square): with Burn's attention, the f32 scores of every
/// head (the fused op's boolean mask has their shape, and autotune may pick Burn's composed
/// fallback, which materialises them) and, for the composed path, the additive mask of each
/// distinct window (`Positions::window_mask`, built whole on the host). Layers the CPU's host
/// kernel does not compute (q/k norms, sinks, other scales, soft caps, windows, partial rotary,
/// bf16: `Attention::host_kernel_covers`) run Burn's composed attention even on the CPU backend.
pub(crate) fn prompt_pass_attention_bytes(
    arch: &ModelArch,
    dtype: DType,
    device: &ComputeDevice,
    batch: &[Vec<u32>],
) -> u128 {
    let b = &arch.block;
    let host_covers = dtype != DType::BF16
        && !b.qk_norm
        && !b.sinks
        && b.attn_scale.is_none()
        && b.attn_softcap.is_none()
        && b.rotary_dim.is_none()
        && arch.windows.iter().all(Option::is_none);
    let longest = batch.iter().map(Vec::len).max().unwrap_or(0) as u128;
    let square = batch.len() as u128 * longest * longest;
    let scores = square * arch.n_heads as u128 * 4;
    let mut windows: Vec<Option<usize>> = arch.windows.clone();
    windows.sort_unstable();
    windows.dedup();
    let masks = square * windows.len().max(1) as u128 * 4;
    match device.attention_kernel(dtype) {
        AttentionKernel::Host if host_covers => 0,
        AttentionKernel::Fused => scores,
        AttentionKernel::Host | AttentionKernel::Composed => scores + masks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qdrift_weights::ArchShape;

    fn device_with(parallel_batches: usize) -> ComputeDevice {
        ComputeDevice {
            device: burn::tensor::Device::flex(),
            backend: "cpu",
            adapter: "test".to_string(),
            adapter_detail: String::new(),
            reason: String::new(),
            max_buffer_bytes: None,
            supports_f16: true,
            uses_host_memory: true,
            parallel_batches,
        }
    }

    /// The batch sizes the example reports record (32 and 8 prompts on 2 cores), a GPU's cap, and
    /// the edges.
    #[test]
    fn default_batches_split_prompts_over_the_device_up_to_the_cap() {
        assert_eq!(default_batch_size(32, &device_with(2)), 16);
        assert_eq!(default_batch_size(8, &device_with(2)), 4);
        assert_eq!(default_batch_size(7, &device_with(2)), 4);
        assert_eq!(default_batch_size(40, &device_with(1)), MAX_DEFAULT_BATCH_SIZE);
        assert_eq!(default_batch_size(3, &device_with(8)), 1);
        assert_eq!(default_batch_size(0, &device_with(0)), 1);
    }

    /// Llama-3.2-1B's f16 embedding (525 MB) on lavapipe (128 MiB) is split, not refused; a
    /// device whose buffer holds less than one row refuses, naming the layer.
    #[test]
    fn only_a_row_past_the_largest_buffer_is_refused() {
        // Llama-3.2-1B's shape on SmolLM2's: 2048 wide, 8192 hidden, 32/8 heads, vocab 128256.
        let arch = ModelArch {
            dim: 2048,
            hidden_dim: 8192,
            n_layers: 16,
            n_heads: 32,
            n_kv_heads: 8,
            vocab_size: 128_256,
            ..smollm2()
        };
        let mut lavapipe = device_with(1);
        lavapipe.adapter = "llvmpipe (LLVM 15.0.6, 256 bits)".into();
        lavapipe.max_buffer_bytes = Some(128 << 20);
        assert!(check_weight_buffers(&arch, DType::F16, &lavapipe).is_ok());
        lavapipe.max_buffer_bytes = Some(16_000);
        let e = check_weight_buffers(&arch, DType::F16, &lavapipe).expect_err("a row too large").to_string();
        assert!(
            e.contains("one row of the model's feed-forward down projection (8192 values, 16384 bytes in F16)"),
            "{e}"
        );
        assert!(e.contains("16000 bytes that llvmpipe (LLVM 15.0.6, 256 bits) allows in one buffer"), "{e}");
        assert!(check_weight_buffers(&arch, DType::F16, &device_with(1)).is_ok(), "no limit of its own");
    }

    /// SmolLM2-135M's shape: 30 layers, 3 key/value heads of 64.
    fn smollm2() -> ModelArch {
        let shape = ArchShape {
            dim: 576,
            hidden_dim: 1536,
            n_layers: 30,
            n_heads: 9,
            n_kv_heads: 3,
            head_dim: 64,
            vocab_size: 49152,
            max_seq_len: 8192,
        };
        ModelArch { rope_theta: 100_000.0, tied_embeddings: true, ..ModelArch::new("LlamaForCausalLM", shape) }
    }

    /// The bench's case: 16 prompts in 2 batches of 8 for 1,000 new tokens run side by side in
    /// f16 (2 × 190 MB of cache) but one at a time in f32 (2 × 380 MB would pass the budget).
    #[test]
    fn batches_run_side_by_side_only_while_their_caches_fit_the_budget() {
        let prompts = vec![vec![1u32; 30]; 16];
        let config = GenerationConfig { max_new_tokens: 1000, batch_size: 8, stop_at_eos: None };
        let cpu = device_with(2);
        let bytes = |dtype: DType| cache_bytes(&smollm2(), dtype, &prompts[..8], 1000);
        assert_eq!(bytes(DType::F16), 8 * 3 * 1030 * 64 * 2 * 2 * 30);
        assert!(2 * bytes(DType::F16) <= SIDE_BY_SIDE_CACHE_BYTES && 2 * bytes(DType::F32) > SIDE_BY_SIDE_CACHE_BYTES);
        assert_eq!(concurrent_batches(&smollm2(), DType::F16, &cpu, &prompts, &config), 2);
        assert_eq!(concurrent_batches(&smollm2(), DType::F32, &cpu, &prompts, &config), 1);
        // Short requests keep every core; a device whose memory is not the host's is not limited.
        let short = GenerationConfig { max_new_tokens: 100, ..config };
        assert_eq!(concurrent_batches(&smollm2(), DType::F32, &cpu, &prompts, &short), 2);
        let gpu = ComputeDevice { uses_host_memory: false, ..device_with(2) };
        assert_eq!(concurrent_batches(&smollm2(), DType::F32, &gpu, &prompts, &config), 2);
        // Never more than the batches, never fewer than one.
        assert_eq!(concurrent_batches(&smollm2(), DType::F16, &device_with(8), &prompts, &config), 2);
        let huge = GenerationConfig { max_new_tokens: 1 << 24, ..config };
        assert_eq!(concurrent_batches(&smollm2(), DType::F32, &cpu, &prompts, &huge), 1);
    }

    #[test]
    fn long_requests_are_refused_unless_allowed() {
        let prompts = vec![vec![1; 12]];
        assert!(check_length(&prompts, 16 * 8 - 12, 16, false, "--horizons").is_ok());
        let e = check_length(&prompts, 16 * 8 - 11, 16, false, "--horizons").unwrap_err().to_string();
        assert!(e.starts_with("--horizons 117: 129 positions"), "{e}");
        assert!(e.contains("limit of 128") && e.contains("context of 16") && e.contains("--allow-long"), "{e}");
        assert!(check_length(&prompts, 1_000_000, 16, true, "--horizons").is_ok());
        let e = check_length(&prompts, usize::MAX, 16, true, "--max-new-tokens").unwrap_err().to_string();
        assert!(e.contains("overflow"), "{e}");
    }

    #[test]
    fn prompts_longer_than_the_longest_request_are_refused() {
        let bytes = 16 * LONG_REQUEST_FACTOR * MAX_PROMPT_BYTES_PER_TOKEN;
        assert!(check_prompt_text(&"a".repeat(bytes), 16).is_ok());
        let e = check_prompt_text(&"a".repeat(bytes + 1), 16).unwrap_err();
        assert_eq!(e, PromptTooLong::Bytes { bytes: bytes + 1, limit: bytes, trained: 16 });
        assert!(check_prompt_tokens(&[1; 128], 16, false).is_ok());
        let e = check_prompt_tokens(&[1; 129], 16, false).unwrap_err().to_string();
        assert!(e.starts_with("is 129 tokens, more than 128 (8 × the 16 positions"), "{e}");
        assert!(check_prompt_tokens(&[1; 129], 16, true).is_ok());
    }

    /// A LongRoPE model runs requests up to its original context, refused past it in one line
    /// naming LongRoPE and both lengths; other models are not limited by it.
    #[test]
    fn longrope_requests_past_the_original_context_are_refused() {
        let mut arch = smollm2();
        arch.rope_scaling = Some(qdrift_weights::RopeScaling::LongRope {
            short_factor: vec![1.0; 32],
            long_factor: vec![2.0; 32],
            original_max_position_embeddings: 64,
            attention_factor: 1.2,
        });
        let cpu = device_with(1);
        let prompts = vec![vec![1u32; 10], vec![1u32; 40]];
        let config = |n| GenerationConfig { max_new_tokens: n, batch_size: 2, stop_at_eos: None };
        assert!(check_request(&arch, DType::F32, &cpu, &prompts, &config(24)).is_ok());
        let e = check_request(&arch, DType::F32, &cpu, &prompts, &config(25)).unwrap_err();
        assert!(
            matches!(e, GenerateError::LongRopeContext { positions: 65, longest: 40, new_tokens: 25, original: 64 }),
            "{e:?}"
        );
        let line = e.to_string();
        assert!(!line.contains('\n'), "{line}");
        assert!(
            line.starts_with(
                "LongRoPE: 65 positions (longest prompt 40 + 25 new tokens) exceed the model's original \
                 context of 64 positions (original_max_position_embeddings)"
            ),
            "{line}"
        );
        let e = check_request(&arch, DType::F32, &cpu, &prompts, &config(usize::MAX)).unwrap_err();
        assert!(matches!(e, GenerateError::LongRopeContext { positions: usize::MAX, .. }), "{e:?}");
        assert!(check_request(&smollm2(), DType::F32, &cpu, &prompts, &config(25)).is_ok());
    }

    #[test]
    fn context_overflow_counts_the_longest_prompt_and_new_tokens() {
        let prompts = vec![vec![1; 5], vec![1; 9]];
        assert_eq!(context_overflow(&prompts, 7, 16), None);
        let over = context_overflow(&prompts, 8, 16).expect("17 > 16");
        assert_eq!(over, ContextOverflow { positions: 17, trained: 16 });
        assert!(over.to_string().starts_with("17 positions exceed the 16"), "{over}");
        assert_eq!(context_overflow(&prompts, usize::MAX, 16).map(|o| o.positions), Some(usize::MAX));
    }
}
