//! The plan of an evaluation: [`EvalConfig`]'s options checked, and everything the run derives
//! from them, the model, the prompts and the device (horizons, batch size, teacher-forcing chunk,
//! precisions, bootstrap settings).
//!
//! **Invariant: options are checked before anything is loaded, and the request is checked
//! against the device ([`check_request`], at both precisions) before any weight is uploaded, so
//! that an evaluation that cannot finish fails in seconds, not hours.**

use burn::tensor::DType;
use qdrift_generate::{
    BackendChoice, ComputeDevice, GenerationConfig, check_request, default_batch_size, select_device,
};
use qdrift_load::LlamaArch;
use qdrift_model::LlamaConfig;

use crate::aggregate::Bootstrap;
use crate::{EvalConfig, EvalError, VariantSpec};

/// Teacher-forced chunks hold several `[batch, chunk, vocab]` f32 tensors (logits of both models,
/// their log-softmax, probabilities): one is kept under this many bytes so that large
/// vocabularies do not multiply the peak memory.
const CHUNK_BYTES: usize = 64 << 20;

/// The most bootstrap resamples an interval may take: far beyond what any interval needs (2000 is
/// the default), and small enough that the resampled statistics fit in memory.
pub const MAX_RESAMPLES: usize = 1_000_000;

/// How a variant's KL divergence is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KlMode {
    /// Against the reference's top-`k` log-probabilities plus one tail bucket: a lower bound of
    /// the exact KL (`qdrift_score::compact`), with the reference scored once.
    Compact { k: usize },
    /// Over the full vocabulary: the default, a top-K that covers the vocabulary, or a
    /// log-probability dump (which needs the reference's full distribution).
    Exact,
}

impl KlMode {
    /// The mode for a run: compact when a top-K below the vocabulary size is asked for and no
    /// dump is; else exact.
    pub fn choose(cfg: &EvalConfig, vocab_size: usize) -> KlMode {
        match cfg.reference_top_k {
            Some(k) if k < vocab_size && cfg.dump_logprobs.is_none() => KlMode::Compact { k },
            _ => KlMode::Exact,
        }
    }
}

/// How the evaluation runs: what every step after encoding the prompts needs.
pub(crate) struct Plan {
    /// Where the models run.
    pub device: ComputeDevice,
    /// The prompts, encoded, in set order.
    pub prompts: Vec<Vec<u32>>,
    /// Generated-token horizons: sorted, unique, each ≥ 1.
    pub horizons: Vec<usize>,
    /// Free-running generation: `max(horizons)` new tokens per prompt, the batch size.
    pub generation: GenerationConfig,
    /// Teacher-forcing chunk: positions per forward pass.
    pub chunk: usize,
    /// The reference's compute precision.
    pub dtype: DType,
    /// Bootstrap resamples and seed.
    pub bootstrap: Bootstrap,
    /// How KL divergence is computed.
    pub kl: KlMode,
}

impl Plan {
    /// The plan for `prompts` of a model of `arch` on `device`.
    ///
    /// # Errors
    /// A device without f16 compute, a request that does not fit it, or a variant whose
    /// KV-cache format does not fit the model.
    pub fn new(
        cfg: &EvalConfig,
        horizons: Vec<usize>,
        arch: &LlamaArch,
        prompts: Vec<Vec<u32>>,
        device: ComputeDevice,
    ) -> Result<Plan, EvalError> {
        // A batch larger than the prompts holds only the prompts; capping it keeps every size
        // derived from it small (results never depend on the batch size).
        let batch_size =
            cfg.batch_size.unwrap_or_else(|| default_batch_size(prompts.len(), &device)).min(prompts.len().max(1));
        if !device.supports_f16 {
            return Err(EvalError::NoF16 { adapter: device.adapter.clone() });
        }
        let longest = horizons.last().copied().unwrap_or(1);
        let generation = GenerationConfig { max_new_tokens: longest, batch_size, stop_at_eos: None };
        for spec in &cfg.variants {
            spec.check_fits(arch)?;
        }
        let model_config = LlamaConfig::from_arch(arch);
        // The reference and the noise floor run at both precisions between them.
        for dtype in [DType::F16, DType::F32] {
            check_request(&model_config, dtype, &device, &prompts, &generation)?;
        }
        let row_bytes = batch_size.saturating_mul(arch.vocab_size).saturating_mul(4).max(1);
        let chunk = cfg.chunk.min(CHUNK_BYTES / row_bytes).max(1);
        let bootstrap = Bootstrap { resamples: cfg.resamples, seed: cfg.seed };
        let kl = KlMode::choose(cfg, arch.vocab_size);
        Ok(Plan { device, prompts, horizons, generation, chunk, dtype: cfg.dtype, bootstrap, kl })
    }

    /// The longest horizon: tokens each model generates per prompt.
    pub fn longest(&self) -> usize {
        self.generation.max_new_tokens
    }

    /// Prompts per batch.
    pub fn batch_size(&self) -> usize {
        self.generation.batch_size
    }
}

/// Checks the options that need nothing loaded (horizons, precision, resamples, batch size,
/// variants that exist and have distinct names) and returns the horizons, sorted and unique.
/// Sizes are only compared here; [`check_length`](qdrift_generate::check_length) and
/// [`check_request`] bound what they multiply into once the prompts are known.
pub(crate) fn check_options(cfg: &EvalConfig) -> Result<Vec<usize>, EvalError> {
    let option = |option: &'static str, problem: String| Err(EvalError::Option { option, problem });
    let mut horizons = cfg.horizons.clone();
    horizons.sort_unstable();
    horizons.dedup();
    if horizons.first().is_none_or(|&h| h == 0) {
        return option("--horizons", "needs at least one horizon, each ≥ 1".into());
    }
    if !matches!(cfg.dtype, DType::F16 | DType::F32) {
        return option("--dtype", format!("{:?}: use f16 or f32", cfg.dtype));
    }
    if cfg.resamples == 0 || cfg.resamples > MAX_RESAMPLES {
        return option("--resamples", format!("{}: must be between 1 and {MAX_RESAMPLES}", cfg.resamples));
    }
    if cfg.reference_top_k == Some(0) {
        return option("--reference-top-k", "must be at least 1".into());
    }
    if cfg.batch_size == Some(0) {
        return option("--batch-size", "must be at least 1".into());
    }
    let mut names = std::collections::BTreeSet::new();
    for spec in std::iter::once(&VariantSpec::NoiseFloor).chain(&cfg.variants) {
        spec.check_exists()?;
        let name = spec.name(cfg.dtype);
        if !names.insert(name.clone()) {
            return Err(EvalError::DuplicateVariant(name));
        }
    }
    Ok(horizons)
}

/// The device `cfg.backend` selects; with a log-probability dump, one batch at a time.
pub(crate) fn eval_device(backend: BackendChoice, dump: bool) -> Result<ComputeDevice, EvalError> {
    let mut device = select_device(backend)?;
    if dump {
        // Batches side by side would interleave the dump's lines; one at a time keeps them in
        // prompt order. (The report is the same either way.)
        device.parallel_batches = 1;
    }
    Ok(device)
}
