//! [`evaluate_any`]: the evaluation's orchestration, the one file that calls each step's module
//! in turn (check the options, encode the prompts, plan, run the reference and each variant,
//! assemble the report or a shard's part) and that no other module calls.

use qdrift_generate::{check_length, context_overflow};
use qdrift_load::{HostModel, LoadedModel, open_model};
use qdrift_model::Llama;
use qdrift_quantize::round_to_fp16_reference;
use qdrift_report::{EvalSetInfo, ModelInfo, ModelShape, Reference, Report, Workload};

use crate::aggregate::Trace;
use crate::assemble::assemble_report;
use crate::config::{EvalConfig, default_eval_set};
use crate::dump::Dump;
use crate::error::EvalError;
use crate::evalset::EvalSet;
use crate::gate_check::check_thresholds;
use crate::generation::generate_all;
use crate::identity::{model_identity_file, report_name, sha256_file};
use crate::plan::{KlMode, Plan, check_options, eval_device};
use crate::prompts::{EncodedPrompts, encode_prompts};
use crate::reference::ReferenceRun;
use crate::scoring::ScoringContext;
use crate::shard::Part;
use crate::store::{StoreKey, StoreModel, prompt_tokens_sha256, read_store, write_store};
use crate::types::{Measurement, Progress, ProgressFn, REFERENCE_NAME, RunContext, VariantHeader, dtype_name};
use crate::variant::{BuiltVariant, ReferenceIdentity, VariantSpec, VariantWeights, build_variant};

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
    crate::output::path_check(cfg).check()?;
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
        (Some(dir), Some(key)) => {
            let arch = &loaded.model.arch;
            Some(read_store(dir, key, StoreModel { vocab: arch.vocab_size, dim: arch.dim })?)
        }
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
            Some(traces) => (built.header(), traces),
            None => run_variant(&scoring, built, &reference_weights, dump.as_mut(), progress)?,
        };
        variants.push(measured);
        progress(Progress::Done { model: &name });
    }
    if let Some(d) = dump {
        d.finish()?;
    }
    if let (Some(dir), Some(key), Some((header, noise_floor))) = (&cfg.save_reference, key, variants.first()) {
        if let Some(failure) = &header.failure {
            return Err(EvalError::Store {
                flag: "--save-reference",
                path: dir.clone(),
                problem: format!("the noise floor failed, so there is nothing to save for later runs: {failure}"),
            });
        }
        let stored = reference_run.to_store(noise_floor.clone())?;
        write_store(dir, key, cfg.seed, &stored)?;
    }
    let tail = reference_run.compact().map(|c| (c.k, c.tail_sums()));
    Ok(Measurement { variants, tail })
}

/// Builds `built` on the device, lets it generate, and scores it against the reference: its
/// header and one trace per prompt.
fn run_variant(
    scoring: &ScoringContext<'_>,
    mut built: BuiltVariant,
    reference_weights: &dyn Fn() -> HostModel,
    dump: Option<&mut Dump>,
    progress: &mut ProgressFn<'_>,
) -> Result<(VariantHeader, Vec<Trace>), EvalError> {
    let plan = scoring.plan;
    let header = built.header();
    let mut model = {
        // The host copy (the reference's weights, or the variant's own) lives only while the
        // model is built, each block's tensors freed once the block holds them: it is as large as
        // the reference's f32 weights.
        let host = match std::mem::replace(&mut built.host, VariantWeights::Reference) {
            VariantWeights::Reference => reference_weights(),
            VariantWeights::Own(h) => *h,
        };
        Llama::from_host_owned(host, built.dtype, &plan.device.device)?
    };
    built.apply_runtime(&mut model)?;
    drop(built);
    qdrift_model::release_free_memory();
    let tokens = match generate_all(&model, &header.name, plan, progress) {
        Err(EvalError::Overflow { model, problem }) if plan.shard.is_none() => {
            return Ok(failed(header, format!("{model}: {problem}")));
        }
        other => other?,
    };
    progress(Progress::Scoring { model: &header.name });
    let mut traces: Vec<Trace> = tokens
        .into_iter()
        .enumerate()
        .map(|(i, variant_tokens)| Trace::new(scoring.reference.continuation(i).to_vec(), variant_tokens))
        .collect();
    scoring.score(&model, &header.name, &mut traces, dump)?;
    match scoring.check_finite(&model, &header.name, &traces)? {
        Some(problem) if plan.shard.is_none() => Ok(failed(header, problem)),
        Some(problem) => Err(EvalError::Overflow { model: header.name.clone(), problem }),
        None => Ok((header, traces)),
    }
}

/// A variant that failed where the reference did not: its header with the failure, no traces.
/// (A shard stops instead: the parts of a sharded run hold every variant's traces.)
fn failed(mut header: VariantHeader, failure: String) -> (VariantHeader, Vec<Trace>) {
    header.failure = Some(failure);
    (header, Vec::new())
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
            KlMode::Exact => "exact".to_string(),
            KlMode::Compact { k } => format!("top-{k}"),
        },
        quantize_embeddings: cfg.quantize.quantize_embeddings,
        quantize_head: cfg.quantize.quantize_head,
        quantize_router: cfg.quantize.quantize_router,
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
        stop_token_id: loaded.tokenizer.stop_id(),
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
