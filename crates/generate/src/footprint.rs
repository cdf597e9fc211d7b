//! What a model of a run holds at its peak, before anything is built: its weights as the device
//! stores them, the largest part converted on the host while it is built, the key-value caches
//! of the batches that run at once and their workspace (prompt-pass attention scores, logits).
//! `qdrift eval` checks its plan against the memory there is with it, `qdrift inspect` prints it.
//!
//! The figures follow the build order of `Llama::from_source` (`ARCHITECTURE.md`, "Memory
//! proportional to one model"): the embedding and output layer are converted first, while little
//! else is resident, so a model's build peak is its stored weights plus one block in f32. A tied
//! output layer holds its own copy of the table (the lookup wants rows, the projection its own
//! layout). Measured against them on `synthetic:llama-1b`, f16, 2 prompts × 10 tokens, CPU: the
//! estimate and the peak RSS in docs/BENCHMARKS.md, '`bench scale`' (the process itself, its code
//! and allocator, is the difference).

use burn::tensor::DType;
use qdrift_weights::ModelArch;

use crate::ComputeDevice;
use crate::request::{GenerationConfig, cache_bytes, concurrent_batches, prompt_pass_attention_bytes};

/// One model's memory at its peak, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelFootprint {
    /// Its weights as the device stores them, a tied output layer counted twice.
    pub weights: u128,
    /// The largest part held in f32 on the host while the model is built: one block.
    pub build: u128,
    /// The key-value caches of the batches that run at once.
    pub kv: u128,
    /// Those batches' prompt-pass attention scores (Burn's composed attention materialises them)
    /// and logits.
    pub workspace: u128,
}

impl ModelFootprint {
    /// The peak: the weights, plus the larger of the build's f32 block and the run's caches and
    /// workspace (the caches are allocated after the build).
    pub fn peak(&self) -> u128 {
        self.weights + self.build.max(self.kv + self.workspace)
    }
}

/// Bytes per weight of a model computing in `dtype` on `device`: the dtype's size, but 2 for an
/// f32 model on the CPU backend whose weights are all f16 values (its host kernels keep those in
/// f16, `Llama::from_host_with`), as the FP16 reference's and its noise floor's are.
pub fn bytes_per_weight(dtype: DType, device: &ComputeDevice, f16_valued: bool) -> u128 {
    if dtype == DType::F32 && f16_valued && device.backend == "cpu" { 2 } else { dtype.size() as u128 }
}

/// The footprint of a model of `arch` with `parameters` weights, computing in `dtype` with its
/// weights stored at `bytes_per_weight`, on `device`, generating for `prompts` as `config` says.
pub fn model_footprint(
    (arch, parameters): (&ModelArch, usize),
    (dtype, bytes_per_weight): (DType, u128),
    device: &ComputeDevice,
    prompts: &[Vec<u32>],
    config: &GenerationConfig,
) -> ModelFootprint {
    let table = arch.vocab_size as u128 * arch.dim as u128;
    let tied = if arch.tied_embeddings { table } else { 0 };
    let weights = (parameters as u128 + tied) * bytes_per_weight;
    let outside_blocks = table + if arch.tied_embeddings { 0 } else { table } + arch.dim as u128;
    let block = (parameters as u128).saturating_sub(outside_blocks) / arch.n_layers.max(1) as u128;
    let batch_size = config.batch_size.max(1);
    let concurrent = concurrent_batches(arch, dtype, device, prompts, config) as u128;
    let largest = |f: &dyn Fn(&[Vec<u32>]) -> u128| prompts.chunks(batch_size).map(f).max().unwrap_or(0);
    let kv = largest(&|b| cache_bytes(arch, dtype, b, config.max_new_tokens)) * concurrent;
    let logits = |b: &[Vec<u32>]| b.len() as u128 * arch.vocab_size as u128 * 4;
    let workspace = largest(&|b| prompt_pass_attention_bytes(arch, dtype, device, b) + logits(b)) * concurrent;
    ModelFootprint { weights, build: block * 4, kv, workspace }
}

/// The host memory this process may still allocate: Linux's `MemAvailable` (free memory plus the
/// page cache the kernel can reclaim), bounded by a cgroup's limit less the cgroup's resident
/// memory (not its page cache, which `memory.current` counts and the kernel reclaims too).
pub fn available_host_memory() -> u128 {
    let mut sys = sysinfo::System::new();
    sys.refresh_memory();
    let available = sys.available_memory();
    let cgroup = sys.cgroup_limits().map_or(u64::MAX, |c| c.total_memory.saturating_sub(c.rss));
    u128::from(available.min(cgroup))
}

/// Bytes as GiB with two decimals.
pub fn format_gib(bytes: u128) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}
