//! [`evaluate`]: the evaluation in four steps (plan, encode the prompts, run each variant,
//! assemble the report), each in its own module; this one holds what `qdrift eval` configures
//! and the orchestration.

use std::borrow::Cow;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use burn::tensor::DType;
use qdrift_generate::{BackendChoice, check_length, context_overflow};
use qdrift_load::{HostModel, LoadedModel, open_model};
use qdrift_model::LlamaConfig;
use qdrift_quantize::{QuantizeOptions, round_to_fp16_reference};
use qdrift_report::{
    EvalSetInfo, KlMethod, ModelInfo, ModelShape, RecipeParts, Reference, Report, SCHEMA_VERSION, TensorError,
    Thresholds, Variant, VariantKind, Workload,
};

use crate::aggregate::{self, Bootstrap, Trace};
use crate::compact::TailSums;
use crate::dump::Dump;
use crate::gate_check::check_thresholds;
use crate::identity::{model_identity_file, report_name, sha256_file};
use crate::plan::{Plan, Shard, check_options, eval_device};
use crate::prompts::{EncodedPrompts, encode_prompts};
use crate::scoring::{ReferenceRun, ScoringContext, generate_all};
use crate::shard::Part;
use crate::store::{StoreKey, prompt_tokens_sha256, read_store, write_store};
use crate::variant::{BuiltVariant, ReferenceIdentity, VariantWeights, build_variant};
use crate::{EvalError, EvalSet, VariantSpec};

/// What `qdrift eval` was asked to do.
#[derive(Clone, Debug)]
pub struct EvalConfig {
    /// The reference checkpoint.
    pub model: PathBuf,
    /// Its tokenizer, when not found beside it.
    pub tokenizer: Option<PathBuf>,
    /// The eval set (a JSONL file or a built-in set's name); default by model (see
    /// [`default_eval_set`]).
    pub eval_set: Option<PathBuf>,
    /// The variants, in report order, after the noise floor ([`VariantSpec::NoiseFloor`], which
    /// [`evaluate`] always runs first).
    pub variants: Vec<VariantSpec>,
    /// Generated-token horizons (any order; sorted and deduplicated).
    pub horizons: Vec<usize>,
    /// Where to run.
    pub backend: BackendChoice,
    /// The reference's compute precision (`F16` or `F32`); the noise floor runs at the other.
    pub dtype: DType,
    /// Use the first `n` prompts of the set (all when `None`).
    pub prompts: Option<usize>,
    /// Seed of the bootstrap resampling.
    pub seed: u64,
    /// Prompts per batch (default: [`qdrift_generate::default_batch_size`]).
    pub batch_size: Option<usize>,
    /// Bootstrap resamples per interval.
    pub resamples: usize,
    /// Teacher-forcing chunk (positions per forward pass).
    pub chunk: usize,
    /// What the schemes quantize besides the linear layers.
    pub quantize: QuantizeOptions,
    /// Write every teacher-forced position's full log-probabilities of both models (on the
    /// reference's text) to this JSONL file, for independent checks. Large: prompts × horizon ×
    /// vocabulary × 2 numbers per variant.
    pub dump_logprobs: Option<PathBuf>,
    /// Largest size, in bytes, of what is kept of the reference's pass on its own text across
    /// variants for the exact KL: its logits, else its final hidden states (each variant then
    /// costs one pass on that text instead of two); above it the reference runs again in
    /// lockstep with each variant. Same numbers every way.
    pub reference_logits_budget: u64,
    /// Compute each variant's KL divergence against the reference's top `k` log-probabilities
    /// per position plus one tail bucket (`--reference-top-k`), a lower bound of the exact KL
    /// that keeps `k + 5` numbers per position; `None` (the default), or a `k` that covers the
    /// vocabulary, computes the exact KL.
    pub reference_top_k: Option<usize>,
    /// Save the reference's continuations, what scoring keeps of its pass on them (its final
    /// hidden states, or its top-K statistics) and the noise floor's traces to this folder
    /// (`--save-reference`), for later runs with [`EvalConfig::reference_store`].
    pub save_reference: Option<PathBuf>,
    /// Use the reference saved in this folder (`--reference`) instead of running the reference's
    /// generation, its pass on its own text and the noise floor; refused unless it was saved
    /// under the same model, tokenizer, eval set, prompts, dtype, horizons, backend, batching,
    /// KL mode and qdrift version.
    pub reference_store: Option<PathBuf>,
    /// Evaluate only this shard's batches (`--shard INDEX/COUNT`) and produce a part for
    /// [`crate::merge`] instead of a report.
    pub shard: Option<Shard>,
    /// Run even when the longest prompt plus the longest horizon exceeds
    /// [`qdrift_generate::LONG_REQUEST_FACTOR`] × the model's trained context (`--allow-long`).
    pub allow_long: bool,
    /// The thresholds `--gate` will check the report against, and their file: checked against
    /// the variants and horizons of the run before anything is loaded, so that a thresholds file
    /// that cannot apply fails in a second, not after the evaluation.
    pub gate: Option<(PathBuf, Thresholds)>,
}

impl EvalConfig {
    /// The defaults of `qdrift eval` for a model.
    pub fn new(model: PathBuf) -> EvalConfig {
        EvalConfig {
            model,
            tokenizer: None,
            eval_set: None,
            variants: Vec::new(),
            horizons: vec![10, 100, 1000],
            backend: BackendChoice::Auto,
            dtype: DType::F16,
            prompts: None,
            seed: 0,
            batch_size: None,
            resamples: 2000,
            chunk: 64,
            quantize: QuantizeOptions::default(),
            dump_logprobs: None,
            reference_logits_budget: 256 << 20,
            reference_top_k: None,
            save_reference: None,
            shard: None,
            reference_store: None,
            allow_long: false,
            gate: None,
        }
    }
}

/// Progress of a long evaluation, for a progress bar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress<'a> {
    /// A model starts generating `tokens` tokens in all (prompts × longest horizon).
    Generating {
        /// `fp16` for the reference, else the variant's name.
        model: &'a str,
        /// Tokens it will generate.
        tokens: u64,
    },
    /// `tokens` more tokens were generated.
    Generated {
        /// Tokens in this step (rows of the batch).
        tokens: u64,
    },
    /// Teacher-forced scoring of a variant starts.
    Scoring {
        /// The variant.
        model: &'a str,
    },
    /// Something the user should know that does not stop the run.
    Warning {
        /// One sentence.
        message: &'a str,
    },
    /// A variant is finished.
    Done {
        /// The variant.
        model: &'a str,
    },
}

/// A progress callback, as [`evaluate`] takes it.
pub(crate) type ProgressFn<'p> = dyn FnMut(Progress<'_>) + Send + 'p;

/// The name of the reference in reports.
pub const REFERENCE_NAME: &str = "fp16";

/// [`default_eval_set`]'s rule in words, for `--help`.
pub const DEFAULT_EVAL_SET_RULE: &str =
    "stories for llama2.c models (TinyStories), chat for models with a chat template, else english";

/// The eval set used when none is given: `stories` for llama2.c models (TinyStories), `chat`
/// for models with a chat template, else `english` ([`DEFAULT_EVAL_SET_RULE`]).
pub fn default_eval_set(loaded: &LoadedModel) -> &'static str {
    if loaded.format == qdrift_load::ModelFormat::Llama2c {
        "stories"
    } else if loaded.chat_template.is_some() {
        "chat"
    } else {
        "english"
    }
}

/// The name `--dtype` takes and reports use for a compute dtype: `f16`, else `f32`.
pub fn dtype_name(d: DType) -> &'static str {
    if d == DType::F16 { "f16" } else { "f32" }
}

/// Runs the whole evaluation and returns the report (not yet written).
///
/// Steps: check the options and the `--gate` thresholds (before loading anything); open the model
/// and the eval set and encode the prompts (each refused when too long for the trained context);
/// refuse a request longer than [`qdrift_generate::LONG_REQUEST_FACTOR`] × the trained context
/// unless [`EvalConfig::allow_long`]; plan the run on the device; round the weights to the FP16 reference, run
/// it, then run and score each variant, the noise floor first; assemble the report (or, for one
/// shard, the part [`crate::merge`] assembles it from).
pub fn evaluate_any(cfg: &EvalConfig, progress: &mut (dyn FnMut(Progress<'_>) + Send)) -> Result<Evaluated, EvalError> {
    let horizons = check_options(cfg)?;
    if let Some((path, thresholds)) = &cfg.gate {
        check_thresholds(cfg, &horizons, thresholds)
            .map_err(|source| EvalError::Gate { path: path.clone(), source })?;
    }
    let mut loaded = open_model(&cfg.model, cfg.tokenizer.as_deref())?;
    let set = match &cfg.eval_set {
        Some(p) => EvalSet::read(p)?,
        None => EvalSet::built_in(default_eval_set(&loaded))?,
    };
    let prompts = encode_prompts(&loaded, &set, cfg.prompts, cfg.allow_long)?;
    let trained = loaded.model.arch.max_seq_len;
    let longest = horizons.last().copied().unwrap_or(0);
    check_length(&prompts.tokens, longest, trained, cfg.allow_long, "--horizons")?;
    let device = eval_device(cfg.backend, cfg.dump_logprobs.is_some())?;
    let plan = Plan::new(cfg, horizons, &loaded.model.arch, prompts.tokens.clone(), device)?;
    if let Some(overflow) = context_overflow(&plan.prompts, plan.longest(), loaded.model.arch.max_seq_len) {
        let message = format!("{overflow}, and divergence there reflects that too");
        progress(Progress::Warning { message: &message });
    }
    // The reference is the checkpoint's weights rounded to FP16, in place: a model's host copy
    // is its largest allocation, so the evaluation holds as few as it can (this one, plus at
    // most one variant's).
    round_to_fp16_reference(&mut loaded.model);
    let key = (cfg.save_reference.is_some() || cfg.reference_store.is_some())
        .then(|| store_key(cfg, &plan, &loaded, &prompts))
        .transpose()?;
    let context = RunContext {
        model: model_info(cfg, &loaded)?,
        workload: workload(cfg, &plan, &prompts),
        reference: reference_info(cfg, &loaded),
    };
    let measurement = run_variants(cfg, &plan, loaded, key.as_ref(), progress)?;
    match &plan.shard {
        Some(shard) => {
            Ok(Evaluated::Part(Box::new(Part::new(context, *shard, plan.prompt_indices.clone(), measurement))))
        }
        None => Ok(Evaluated::Report(Box::new(assemble_report(context, measurement)?))),
    }
}

/// What [`evaluate_any`] produced: a whole report, or one shard's part.
pub enum Evaluated {
    /// The report of an unsharded run.
    Report(Box<Report>),
    /// The measurements of one shard ([`EvalConfig::shard`]), for [`crate::merge`].
    Part(Box<Part>),
}

/// Runs the whole evaluation and returns the report (not yet written); refuses a sharded
/// configuration (use [`evaluate_any`]).
pub fn evaluate(cfg: &EvalConfig, progress: &mut (dyn FnMut(Progress<'_>) + Send)) -> Result<Report, EvalError> {
    match evaluate_any(cfg, progress)? {
        Evaluated::Report(r) => Ok(*r),
        Evaluated::Part(_) => Err(EvalError::Option {
            option: "--shard",
            problem: "produces a part, not a report: merge the parts with `qdrift merge`".into(),
        }),
    }
}

/// What a run measured, before any statistic: every variant's description and per-prompt
/// traces (the noise floor first), and for a top-K reference its per-prompt tail mass.
pub(crate) struct Measurement {
    pub variants: Vec<(VariantHeader, Vec<Trace>)>,
    pub tail: Option<(usize, Vec<TailSums>)>,
}

/// A variant's entry in the report without the statistics of its traces.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VariantHeader {
    /// As [`Variant::name`].
    pub name: String,
    /// As [`Variant::scheme`].
    pub scheme: Option<String>,
    /// As [`Variant::recipe`].
    pub recipe: Option<RecipeParts>,
    /// As [`Variant::path`].
    pub path: Option<String>,
    /// As [`Variant::kind`].
    pub kind: VariantKind,
    /// As [`Variant::compute_dtype`].
    pub compute_dtype: String,
    /// As [`Variant::bits_per_weight`].
    pub bits_per_weight: f64,
    /// As [`Variant::weight_bytes`].
    pub weight_bytes: u64,
    /// As [`Variant::per_tensor_error`].
    pub per_tensor_error: Vec<TensorError>,
}

impl VariantHeader {
    fn of(built: &BuiltVariant) -> VariantHeader {
        VariantHeader {
            recipe: built.recipe_parts(),
            name: built.name.clone(),
            scheme: built.scheme.clone(),
            path: built.path.clone(),
            kind: built.kind,
            compute_dtype: dtype_name(built.dtype).to_string(),
            bits_per_weight: built.bits_per_weight,
            weight_bytes: built.weight_bytes,
            per_tensor_error: built.per_tensor_error.clone(),
        }
    }
}

/// What the report says besides the variants: the model, the workload and the reference (its
/// self-perplexity and KL method filled in when the traces are summarized).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunContext {
    /// The report's `model`.
    pub model: ModelInfo,
    /// The report's `workload`.
    pub workload: Workload,
    /// The report's `reference`.
    pub reference: Reference,
}

/// Runs the reference (`loaded.model`, FP16 weights), then each variant, the noise floor first,
/// each scored against the reference.
///
/// The reference's host weights are given up as soon as its model is built: a variant that
/// starts from them (the noise floor, a scheme) gets them back from that model
/// ([`Llama::host_weights`], the same values), so that the run holds at most one f32 host copy,
/// briefly, while a variant is built.
fn run_variants(
    cfg: &EvalConfig,
    plan: &Plan,
    loaded: LoadedModel,
    key: Option<&StoreKey>,
    progress: &mut ProgressFn<'_>,
) -> Result<Measurement, EvalError> {
    let stored = match (&cfg.reference_store, key) {
        (Some(dir), Some(key)) => Some(read_store(dir, key)?),
        _ => None,
    };
    let LoadedModel { model: host, tokenizer, .. } = loaded;
    let identity = ReferenceIdentity { arch: host.arch.clone(), parameters: host.parameter_count(), tokenizer };
    let (reference_run, mut stored_noise_floor) = match stored {
        Some(s) => {
            // A shard uses its own prompts' part of a store saved by an unsharded run.
            let s = s.select(&plan.prompt_indices)?;
            (ReferenceRun::from_store(host, plan, s.continuations, s.side)?, Some(s.noise_floor))
        }
        None => {
            let keep_hidden = cfg.save_reference.is_some();
            (ReferenceRun::start(host, plan, cfg.reference_logits_budget, keep_hidden, progress)?, None)
        }
    };
    let scoring = ScoringContext { reference: &reference_run, plan };
    let reference_weights = || reference_run.model.host_weights();
    let mut dump = cfg.dump_logprobs.as_deref().map(Dump::create).transpose()?;
    let mut variants: Vec<(VariantHeader, Vec<Trace>)> = Vec::with_capacity(cfg.variants.len() + 1);
    for spec in std::iter::once(&VariantSpec::NoiseFloor).chain(&cfg.variants) {
        let built = build_variant(spec, &identity, &reference_weights, &plan.prompts, cfg.dtype, &cfg.quantize)?;
        let name = built.name.clone();
        let measured = match stored_noise_floor.take() {
            Some(traces) => (VariantHeader::of(&built), traces),
            None => run_variant(&scoring, built, &reference_weights, dump.as_mut(), progress)?,
        };
        variants.push(measured);
        progress(Progress::Done { model: &name });
    }
    if let Some(d) = dump {
        d.finish()?;
    }
    if let (Some(dir), Some(key), Some((_, noise_floor))) = (&cfg.save_reference, key, variants.first()) {
        let stored = reference_run.to_store(noise_floor.clone())?;
        write_store(dir, key, &stored)?;
    }
    let tail = reference_run.compact().map(|c| (c.k, c.tail_sums()));
    Ok(Measurement { variants, tail })
}

/// The statistics of a measurement, as the report's variants and the reference's
/// self-perplexity and KL method.
///
/// # Shapes
/// Every variant's traces: one per prompt, in prompt order, `max(horizons)` positions each.
pub(crate) fn summarize_all(context: &mut RunContext, measurement: Measurement) -> Result<Vec<Variant>, EvalError> {
    let w = &context.workload;
    let (horizons, bootstrap) = (w.horizons.clone(), Bootstrap { resamples: w.bootstrap_resamples, seed: w.seed });
    let longest = horizons.last().copied().unwrap_or(0);
    let noise_floor = measurement.variants.first().map(|(_, t)| t.clone());
    if let Some(traces) = &noise_floor {
        // Every variant's traces hold the reference's log p on its own text; the noise floor's,
        // the first, serve.
        context.reference.self_perplexity =
            horizons.iter().map(|&h| (h, aggregate::self_perplexity(traces, h))).collect();
    }
    context.reference.kl = Some(match &measurement.tail {
        Some((k, sums)) => {
            let tail = TailSums::total(sums);
            KlMethod::TopKTail { top_k: *k, tail_mass_max: tail.max, tail_mass_mean: tail.mean }
        }
        None => KlMethod::Exact,
    });
    let mut variants = Vec::with_capacity(measurement.variants.len());
    for (i, (header, traces)) in measurement.variants.into_iter().enumerate() {
        let floor = if i == 0 { None } else { noise_floor.as_deref() };
        variants.push(summarize(header, &traces, floor, &horizons, bootstrap, longest)?);
    }
    Ok(variants)
}

/// Builds `built` on the device, lets it generate, and scores it against the reference: its
/// header and one trace per prompt.
fn run_variant(
    scoring: &ScoringContext<'_>,
    built: BuiltVariant,
    reference_weights: &dyn Fn() -> HostModel,
    dump: Option<&mut Dump>,
    progress: &mut ProgressFn<'_>,
) -> Result<(VariantHeader, Vec<Trace>), EvalError> {
    let plan = scoring.plan;
    let header = VariantHeader::of(&built);
    let mut model = {
        // The host copy (the reference's weights, or the variant's own) lives only while the
        // model is built: it is as large as the reference's f32 weights.
        let host = match &built.host {
            VariantWeights::Reference => Cow::Owned(reference_weights()),
            VariantWeights::Own(h) => Cow::Borrowed(&**h),
        };
        LlamaConfig::from_arch(&host.arch).init_from_host(&host, built.dtype, &plan.device.device)?
    };
    built.apply_runtime(&mut model)?;
    drop(built);
    qdrift_model::release_free_memory();
    let tokens = generate_all(&model, &header.name, plan, progress)?;
    progress(Progress::Scoring { model: &header.name });
    let mut traces: Vec<Trace> = tokens
        .into_iter()
        .enumerate()
        .map(|(i, variant_tokens)| Trace::new(scoring.reference.continuation(i).to_vec(), variant_tokens))
        .collect();
    scoring.score(&model, &header.name, &mut traces, dump)?;
    Ok((header, traces))
}

/// A variant's entry in the report: its description and the statistics of its traces, paired
/// with the noise floor's (`None` for the noise floor itself).
fn summarize(
    header: VariantHeader,
    traces: &[Trace],
    noise_floor: Option<&[Trace]>,
    horizons: &[usize],
    bootstrap: Bootstrap,
    longest: usize,
) -> Result<Variant, EvalError> {
    Ok(Variant {
        recipe: header.recipe,
        name: header.name,
        scheme: header.scheme,
        path: header.path,
        kind: header.kind,
        compute_dtype: header.compute_dtype,
        bits_per_weight: header.bits_per_weight,
        weight_bytes: header.weight_bytes,
        horizons: aggregate::horizon_metrics(traces, noise_floor, horizons, bootstrap)?,
        first_divergence: aggregate::first_divergence_summary(traces, longest)?,
        per_position: aggregate::per_position(traces, longest),
        entropy_strata: aggregate::entropy_strata(traces, longest)?,
        per_tensor_error: header.per_tensor_error,
    })
}

/// The report: the model, the workload, the reference and the measured variants' statistics;
/// validated.
pub(crate) fn assemble_report(mut context: RunContext, measurement: Measurement) -> Result<Report, EvalError> {
    let variants = summarize_all(&mut context, measurement)?;
    let report = Report {
        schema_version: SCHEMA_VERSION,
        model: context.model,
        workload: context.workload,
        reference: context.reference,
        variants,
    };
    report.validate()?;
    Ok(report)
}

/// The reference's entry before its statistics.
fn reference_info(cfg: &EvalConfig, loaded: &LoadedModel) -> Reference {
    Reference {
        name: REFERENCE_NAME.to_string(),
        compute_dtype: dtype_name(cfg.dtype).to_string(),
        weight_bytes: loaded.model.parameter_count() as u64 * 2,
        self_perplexity: Vec::new(),
        kl: None,
    }
}

/// What a saved reference depends on, for this run.
fn store_key(
    cfg: &EvalConfig,
    plan: &Plan,
    loaded: &LoadedModel,
    prompts: &EncodedPrompts<'_>,
) -> Result<StoreKey, EvalError> {
    let synthetic = loaded.format.is_synthetic();
    let hash = |p: &std::path::Path| if synthetic { Ok(String::new()) } else { sha256_file(p) };
    Ok(StoreKey {
        model_sha256: hash(&model_identity_file(&cfg.model))?,
        tokenizer_sha256: hash(&loaded.tokenizer_path)?,
        eval_set_sha256: prompts.set.sha256.clone(),
        prompts: prompts.chosen().iter().map(|p| p.id.clone()).collect(),
        prompt_tokens_sha256: prompt_tokens_sha256(&prompts.tokens),
        dtype: dtype_name(plan.dtype).to_string(),
        horizons: plan.horizons.clone(),
        backend: plan.device.backend.to_string(),
        batch_size: plan.batch_size(),
        chunk: plan.chunk,
        kl: match plan.kl {
            crate::plan::KlMode::Exact => "exact".to_string(),
            crate::plan::KlMode::Compact { k } => format!("top-{k}"),
        },
        quantize_embeddings: cfg.quantize.quantize_embeddings,
        quantize_head: cfg.quantize.quantize_head,
        qdrift_version: env!("CARGO_PKG_VERSION").to_string(),
    })
}

/// The model as reports name it: file (or folder) name and SHA-256, never a machine path.
fn model_info(cfg: &EvalConfig, loaded: &LoadedModel) -> Result<ModelInfo, EvalError> {
    let arch = &loaded.model.arch;
    let synthetic = loaded.format.is_synthetic();
    Ok(ModelInfo {
        path: report_name(&cfg.model),
        sha256: if synthetic { String::new() } else { sha256_file(&model_identity_file(&cfg.model))? },
        architecture: arch.architecture.clone(),
        parameters: loaded.model.parameter_count() as u64,
        synthetic,
        format: loaded.format.to_string(),
        shape: ModelShape {
            layers: arch.n_layers,
            dim: arch.dim,
            hidden_dim: arch.hidden_dim,
            heads: arch.n_heads,
            kv_heads: arch.n_kv_heads,
            vocab_size: arch.vocab_size,
        },
    })
}

/// What ran, where, and on which prompts.
fn workload(cfg: &EvalConfig, plan: &Plan, prompts: &EncodedPrompts<'_>) -> Workload {
    Workload {
        backend: plan.device.backend.to_string(),
        adapter: plan.device.adapter.clone(),
        compute_dtype: dtype_name(plan.dtype).to_string(),
        prompts: prompts.tokens.len(),
        horizons: plan.horizons.clone(),
        batch_size: plan.batch_size(),
        seed: cfg.seed,
        eval_set: EvalSetInfo {
            path: prompts.set.name.clone(),
            sha256: prompts.set.sha256.clone(),
            prompts: prompts.chosen().iter().map(|p| p.id.clone()).collect(),
        },
        qdrift_version: env!("CARGO_PKG_VERSION").to_string(),
        bootstrap_resamples: cfg.resamples,
        chat_template: prompts.chat_template,
    }
}
