//! The plan of an evaluation: [`EvalConfig`]'s options checked, and everything the run derives
//! from them, the model, the prompts and the device (horizons, batch size, teacher-forcing chunk,
//! precisions, the shard).
//!
//! **Invariant: options are checked before anything is loaded, and the request is checked
//! against the device ([`check_request`], at both precisions) before any weight is uploaded, so
//! that an evaluation that cannot finish fails in seconds, not hours.**

use burn::tensor::DType;
use qdrift_generate::{
    BackendChoice, ComputeDevice, Forcing, GenerationConfig, check_request, default_batch_size, select_device,
};
use qdrift_load::ModelArch;

use crate::check::config::{EvalConfig, MAX_RESAMPLES, MAX_SHARDS, Shard, VariantSpec};
use crate::error::EvalError;

/// Teacher-forced chunks hold several `[batch, chunk, vocab]` f32 tensors (logits of both models,
/// their log-softmax, probabilities): one is kept under this many bytes so that large
/// vocabularies do not multiply the peak memory.
const CHUNK_BYTES: usize = 64 << 20;

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
    /// How KL divergence is computed.
    pub kl: KlMode,
    /// The shard this run is, if any.
    pub shard: Option<Shard>,
    /// The index in the whole prompt list of each of [`Plan::prompts`].
    pub prompt_indices: Vec<usize>,
}

impl Plan {
    /// The plan for `prompts` of a model of `arch` on `device`.
    ///
    /// # Errors
    /// A device that cannot compute in the reference's or the noise floor's dtype, a request
    /// that does not fit it, or a variant whose
    /// KV-cache format does not fit the model.
    pub fn new(
        cfg: &EvalConfig,
        horizons: Vec<usize>,
        arch: &ModelArch,
        prompts: Vec<Vec<u32>>,
        device: ComputeDevice,
    ) -> Result<Plan, EvalError> {
        // A batch larger than the prompts holds only the prompts; capping it keeps every size
        // derived from it small (results never depend on the batch size).
        let batch_size =
            cfg.batch_size.unwrap_or_else(|| default_batch_size(prompts.len(), &device)).min(prompts.len().max(1));
        let (prompts, prompt_indices) = select_shard(cfg.shard, prompts, batch_size)?;
        let longest = horizons.last().copied().unwrap_or(1);
        let generation = GenerationConfig { max_new_tokens: longest, batch_size, stop_at_eos: None };
        for spec in &cfg.variants {
            spec.check_fits(arch)?;
        }
        // The reference and the noise floor run at both precisions between them.
        let dtypes = [cfg.dtype, crate::check::config::other_precision(cfg.dtype)];
        for dtype in dtypes {
            // An f16 refusal says that the reference or the noise floor needs it (with
            // `--dtype f32` the noise floor still does).
            device.check_dtype(dtype).map_err(|e| match dtype {
                DType::F16 => EvalError::NoF16 { adapter: device.adapter.clone() },
                _ => e.into(),
            })?;
        }
        for dtype in dtypes {
            check_request(arch, dtype, &device, &prompts, &generation)?;
        }
        let row_bytes = batch_size.saturating_mul(arch.vocab_size).saturating_mul(4).max(1);
        let chunk = cfg.chunk.min(CHUNK_BYTES / row_bytes).max(1);
        let kl = KlMode::choose(cfg, arch.vocab_size);
        Ok(Plan {
            device,
            prompts,
            horizons,
            generation,
            chunk,
            dtype: cfg.dtype,
            kl,
            shard: cfg.shard,
            prompt_indices,
        })
    }

    /// The longest horizon: tokens each model generates per prompt.
    pub fn longest(&self) -> usize {
        self.generation.max_new_tokens
    }

    /// Prompts per batch.
    pub fn batch_size(&self) -> usize {
        self.generation.batch_size
    }

    /// Teacher forcing of `sequences` as this plan batches and chunks it, on its device.
    pub fn forcing<'a>(&'a self, sequences: &'a [(Vec<u32>, Vec<u32>)]) -> Forcing<'a> {
        Forcing { device: &self.device, sequences, batch_size: self.batch_size(), chunk: self.chunk }
    }
}

/// Checks the options that need nothing loaded (horizons, precision, resamples, batch size,
/// variants that exist and have distinct names) and returns the horizons, sorted and unique.
/// Sizes are only compared here; [`check_length`](qdrift_generate::check_length) and
/// [`check_request`] bound what they multiply into once the prompts are known.
/// The prompts of `shard` (all of them without one) and their indices in the whole list: the
/// whole list is cut into batches of `batch_size` (the last may be shorter) and the shard takes
/// every `count`-th batch from its index. Cutting the shard's list into batches of `batch_size`
/// again gives the same batches, since only the last batch of the whole list can be short.
fn select_shard(
    shard: Option<Shard>,
    prompts: Vec<Vec<u32>>,
    batch_size: usize,
) -> Result<(Vec<Vec<u32>>, Vec<usize>), EvalError> {
    let Some(shard) = shard else {
        let indices = (0..prompts.len()).collect();
        return Ok((prompts, indices));
    };
    let batches = prompts.len().div_ceil(batch_size.max(1));
    shard.check(batches, batch_size).map_err(|problem| EvalError::Option { option: "--shard", problem })?;
    let indices: Vec<usize> = shard.prompt_indices(prompts.len(), batch_size).collect();
    let chosen = indices.iter().map(|&i| prompts[i].clone()).collect();
    Ok((chosen, indices))
}

/// Refuses, before anything is loaded, a `--shard` count that cannot give every shard a batch:
/// more than `--prompts` make batches (with `--batch-size`, exactly that many), or more than
/// any eval set holds prompts ([`MAX_SHARDS`]).
fn check_shard_count(shard: Shard, prompts: Option<usize>, batch_size: Option<usize>) -> Result<(), EvalError> {
    let (most, why) = match (prompts, batch_size) {
        (Some(p), Some(b)) => (p.div_ceil(b.max(1)), format!("{p} prompts in batches of {b} make")),
        (Some(p), None) => (p, format!("{p} prompts make at most")),
        (None, _) => (MAX_SHARDS, "an eval set's prompts make at most".to_string()),
    };
    if shard.count > most {
        let problem =
            format!("{shard}: {why} {most} batches, and every shard needs at least one; use at most {most} shards");
        return Err(EvalError::Option { option: "--shard", problem });
    }
    Ok(())
}

pub(crate) fn check_options(cfg: &EvalConfig) -> Result<Vec<usize>, EvalError> {
    let option = |option: &'static str, problem: String| Err(EvalError::Option { option, problem });
    let mut horizons = cfg.horizons.clone();
    horizons.sort_unstable();
    horizons.dedup();
    if horizons.first().is_none_or(|&h| h == 0) {
        return option("--horizons", "needs at least one horizon, each ≥ 1".into());
    }
    if !matches!(cfg.dtype, DType::F16 | DType::BF16 | DType::F32) {
        return option("--dtype", format!("{:?}: use f16, bf16 or f32", cfg.dtype));
    }
    if cfg.resamples == 0 || cfg.resamples > MAX_RESAMPLES {
        return option("--resamples", format!("{}: must be between 1 and {MAX_RESAMPLES}", cfg.resamples));
    }
    if cfg.reference_top_k == Some(0) {
        return option("--reference-top-k", "must be at least 1".into());
    }
    if let Some(shard) = cfg.shard {
        check_shard_count(shard, cfg.prompts, cfg.batch_size)?;
        let combined = [
            (cfg.save_reference.is_some(), "--save-reference"),
            (cfg.gate.is_some(), "--gate"),
            (cfg.dump_logprobs.is_some(), "--dump-logprobs"),
        ];
        if let Some((_, other)) = combined.iter().find(|(on, _)| *on) {
            return option(
                "--shard",
                format!("cannot be combined with {other}: a shard writes a part, `qdrift merge` makes the report"),
            );
        }
    }
    if cfg.batch_size == Some(0) {
        return option("--batch-size", "must be at least 1".into());
    }
    let mut names = std::collections::BTreeSet::new();
    for spec in std::iter::once(&VariantSpec::NoiseFloor).chain(&cfg.variants) {
        spec.check_exists()?;
        spec.check_given_name()?;
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
