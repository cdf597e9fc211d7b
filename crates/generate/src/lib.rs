//! Generation: picking a compute device, and batched greedy decoding with a preallocated
//! key-value cache.
//!
//! Input is token ids (tokenizing is the load stage's job) and a [`qdrift_model::Llama`] already
//! on a device; output is token ids, plus the logits of every step handed to a caller-supplied
//! observer so that the scoring stage can reduce them where they are computed.
//!
//! Each file imports only files below it in this table (`cargo xtask cycles` checks it):
//!
//! | floor | contents |
//! |---|---|
//! | `timing.rs` | [`timed_generate`], [`copy_bandwidth`]: honest timings for benchmarks (warm-up, read-back before the timer stops) |
//! | `forced.rs` | [`teacher_forced`], [`teacher_forced_pair`], [`teacher_forced_hidden`], [`teacher_forced_routes`]: logits (or final hidden states, or the experts a model routes to) of given continuations |
//! | `footprint.rs` | [`model_footprint`]: a model's weights, build, key-value caches and workspace before it is built, for `eval`'s plan and `inspect` |
//! | `greedy.rs` | [`generate`], [`generate_map`]: batched greedy decoding |
//! | `request.rs` | [`GenerationConfig`], [`check_request`], [`default_batch_size`], [`context_overflow`]: the request and its sizing before allocating |
//! | `parallel.rs` | independent batches side by side on the CPU's cores |
//! | `counters.rs` | [`count_launches`], [`read_back_bytes`]: kernel launches and bytes read back, counted |
//! | `device.rs` | [`select_device`]: wgpu or the CPU backend, and what a report says about it |
//! | `error.rs` | [`GenerateError`] |
//!
//! **Invariant: tokens in, tokens out; results never depend on how prompts are batched nor on how
//! many batches run at once.**

#![forbid(unsafe_code)]

mod counters;
mod device;
mod error;
mod footprint;
mod forced;
mod greedy;
mod parallel;
mod request;
mod timing;

pub use counters::{Launches, count_launches, read_back_bytes};
pub use device::{
    ATTENTION_VAR, BackendChoice, CACHE_DIR_VAR, ComputeDevice, DeviceError, gpu_cache_dir, select_device,
};
pub use error::GenerateError;
pub use footprint::{ModelFootprint, available_host_memory, bytes_per_weight, format_gib, model_footprint};
pub use forced::{
    ForcedLogits, ForcedRoutes, Forcing, PairedLogits, teacher_forced, teacher_forced_hidden, teacher_forced_map,
    teacher_forced_pair, teacher_forced_routes,
};
pub use greedy::{StepLogits, generate, generate_map, overflow};
pub use request::{
    ContextOverflow, GenerationConfig, LONG_REQUEST_FACTOR, MAX_DEFAULT_BATCH_SIZE, MAX_PROMPT_BYTES_PER_TOKEN,
    PromptTooLong, SIDE_BY_SIDE_CACHE_BYTES, check_length, check_prompt_text, check_prompt_tokens, check_request,
    concurrent_batches, context_overflow, default_batch_size,
};
pub use timing::{CopyBandwidth, GenerationTiming, copy_bandwidth, timed_generate};
