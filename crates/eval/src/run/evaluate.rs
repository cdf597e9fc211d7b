//! [`evaluate_any`]: the evaluation's orchestration, the one file that calls each step's module
//! in turn (check the options, encode the prompts, plan, run the reference and each variant,
//! assemble the report or a shard's part) and that no other module calls.

use qdrift_generate::{check_length, context_overflow};
use std::sync::Arc;

use qdrift_load::{LoadedModel, WeightSource, open_source};
use qdrift_model::Llama;
use qdrift_quantize::{QuantizeOptions, Reference as RoundedReference, round_to_reference};
use qdrift_report::{EvalSetInfo, ModelInfo, ModelShape, Reference, Report, Workload};

use crate::assemble::report::assemble_report;
use crate::check::compat::{CheckedCheckpoint, open_variants};
use crate::check::config::VariantSpec;
use crate::check::config::{EvalConfig, default_eval_set};
use crate::check::gate_check::check_thresholds;
use crate::check::plan::{KlMode, Plan, check_options, eval_device};
use crate::error::EvalError;
use crate::inputs::evalset::EvalSet;
use crate::inputs::identity::{model_identity_file, report_name, sha256_file};
use crate::inputs::prompts::{EncodedPrompts, encode_prompts};
use crate::persist::dump::Dump;
use crate::persist::shard::Part;
use crate::persist::store::{StoreKey, StoreModel, prompt_tokens_sha256, read_store, write_store};
use crate::run::generation::generate_all;
use crate::run::reference::{ReferenceRun, ReferenceSide};
use crate::run::scoring::{NonFinite, Resident, ScoringContext, VariantRoutes, diagnose, first_non_finite};
use crate::run::variant::{BuiltVariant, ReferenceIdentity, build_variant};
use crate::trace::Trace;
use crate::types::{
    Measurement, Progress, ProgressFn, RunContext, VariantHeader, dtype_name, reference_format, reference_name,
};

/// The reference as [`open_source`] opens it: its weights handed out part by part.
type Loaded = LoadedModel<Arc<dyn WeightSource>>;

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
    crate::persist::output::path_check(cfg).check()?;
    if let Some((path, thresholds)) = &cfg.gate {
        check_thresholds(cfg, &horizons, thresholds)
            .map_err(|source| EvalError::Gate { path: path.clone(), source })?;
    }
    // A checkpoint is held as its reference (FP16, or bf16 for a bf16 run: 16 bits, exactly):
    // every model the run builds from it (reference, noise floor, schemes) starts from those
    // values.
    let format = reference_format(cfg.dtype);
    let loaded = open_source(&cfg.model, cfg.tokenizer.as_deref(), &|m| round_to_reference(m, format))?;
    for note in &loaded.notes {
        progress(Progress::Warning { message: note });
    }
    if cfg.quantize.quantize_router && loaded.model.arch().moe.is_none() {
        return Err(EvalError::Option {
            option: "--quantize-router",
            problem: "is for a model with experts, and this one has none: it has no router to quantize".into(),
        });
    }
    let set = match &cfg.eval_set {
        Some(p) => EvalSet::read(p)?,
        None => EvalSet::built_in(default_eval_set(&loaded))?,
    };
    // `--prompts auto` asks for rounds of prompts up to the set's size, never past it.
    let count = cfg.prompts.map(|n| if cfg.prompts_up_to_set { n.min(set.prompts.len()) } else { n });
    let prompts = encode_prompts(&loaded, &set, count, cfg.allow_long)?;
    // Every checkpoint variant is a quantization of the reference, checked before any work.
    let paths = cfg.variants.iter().map(VariantSpec::checkpoint_path);
    let checkpoints = open_variants(paths, &loaded, &prompts.tokens, cfg.allow_different_model)?;
    let trained = loaded.model.arch().max_seq_len;
    let longest = horizons.last().copied().unwrap_or(0);
    check_length(&prompts.tokens, longest, trained, cfg.allow_long, "--horizons")?;
    let device = eval_device(cfg.backend, cfg.dump_logprobs.is_some())?;
    let plan = Plan::new(cfg, horizons, loaded.model.arch(), prompts.tokens.clone(), device)?;
    let (arch, parameters) = (loaded.model.arch(), loaded.model.parameter_count());
    crate::check::memory::check_plan_memory(cfg, &plan, arch, parameters, crate::check::memory::available_for(&plan))?;
    crate::check::space::check_space(cfg, &plan, arch, &prompts)?;
    if let Some(overflow) = context_overflow(&plan.prompts, plan.longest(), trained) {
        let message = format!("{overflow}, and divergence there reflects that too");
        progress(Progress::Warning { message: &message });
    }
    let key = (cfg.save_reference.is_some() || cfg.reference_store.is_some())
        .then(|| store_key(cfg, &plan, &loaded, &prompts))
        .transpose()?;
    let context = RunContext {
        model: model_info(cfg, &loaded)?,
        workload: workload(cfg, &plan, &prompts),
        reference: reference_info(cfg, &loaded),
    };
    let (measurement, unsaved) = run_variants(cfg, &plan, (loaded, checkpoints), key.as_ref(), progress)?;
    let evaluated = match &plan.shard {
        Some(shard) => Evaluated::Part(Box::new(Part::new(context, *shard, plan.prompt_indices.clone(), measurement))),
        None => Evaluated::Report(Box::new(assemble_report(context, measurement)?)),
    };
    match (unsaved, evaluated) {
        (Some(source), Evaluated::Report(report)) => {
            Err(EvalError::ReferenceNotSaved { report, source: Box::new(source) })
        }
        (Some(source), Evaluated::Part(_)) => Err(source),
        (None, evaluated) => Ok(evaluated),
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

/// A variant between its run and the reference's pass over its text.
struct Pending {
    header: VariantHeader,
    traces: Vec<Trace>,
    routes: Option<VariantRoutes>,
    /// Measured already (a saved reference's noise floor) or failed: nothing left to score.
    done: bool,
}

/// Runs the reference (the checkpoint's weights rounded to FP16), then each variant, the noise
/// floor first, each scored against the reference.
///
/// One model is resident at a time (the memory invariant, ARCHITECTURE.md): every model is built
/// part by part from the weight source (the reference's FP16 parts; a scheme's quantized as they
/// pass), with no whole host copy. The reference generates and keeps its side, then leaves the
/// device (but for its output layer when the side is hidden states, or all of it for lockstep
/// scoring); each variant is built, generates, is scored on the reference's text and leaves;
/// then the reference is built again and scores every variant's text.
fn run_variants(
    cfg: &EvalConfig,
    plan: &Plan,
    (loaded, checkpoints): (Loaded, Vec<Option<CheckedCheckpoint>>),
    key: Option<&StoreKey>,
    progress: &mut ProgressFn<'_>,
) -> Result<(Measurement, Option<EvalError>), EvalError> {
    let stored = match (&cfg.reference_store, key) {
        (Some(dir), Some(key)) => {
            let arch = loaded.model.arch();
            Some(read_store(dir, key, StoreModel { vocab: arch.vocab_size, dim: arch.dim })?)
        }
        _ => None,
    };
    let LoadedModel { model: weights, .. } = loaded;
    let fp16 = RoundedReference { source: &*weights, format: reference_format(plan.dtype) };
    let identity = ReferenceIdentity { parameters: weights.parameter_count() };
    let build_reference = || -> Result<Llama, EvalError> {
        let model = plan.device.build_model(&fp16, plan.dtype)?;
        qdrift_model::release_free_memory();
        Ok(model)
    };
    let reference = build_reference()?;
    let (reference_run, mut stored_noise_floor) = match stored {
        Some(s) => {
            // A shard uses its own prompts' part of a store saved by an unsharded run.
            let s = s.select(&plan.prompt_indices)?;
            (ReferenceRun::from_store(&reference, plan, s.continuations, s.side)?, Some(s.noise_floor))
        }
        None => {
            let keep_hidden = cfg.save_reference.is_some();
            (ReferenceRun::start(&reference, plan, cfg.reference_logits_budget, keep_hidden, progress)?, None)
        }
    };
    let resident = match reference_run.side {
        ReferenceSide::KeptHidden(_) => Resident::Head(reference.into_head()),
        ReferenceSide::Lockstep => Resident::Model(Box::new(reference)),
        ReferenceSide::Kept(_) | ReferenceSide::Compact(_) => {
            drop(reference);
            Resident::Nothing
        }
    };
    qdrift_model::release_free_memory();
    let scoring = ScoringContext { reference: &reference_run, resident: &resident, plan };
    let mut dump = cfg.dump_logprobs.as_deref().map(Dump::create).transpose()?;
    let sources = VariantSources { fp16: &fp16, quantize: &cfg.quantize, reference: &build_reference };
    let mut pending: Vec<Pending> = Vec::with_capacity(cfg.variants.len() + 1);
    let specs = std::iter::once(&VariantSpec::NoiseFloor).chain(&cfg.variants);
    for (spec, checkpoint) in specs.zip(std::iter::once(None).chain(checkpoints)) {
        let built = build_variant(spec, &identity, checkpoint, cfg.dtype)?;
        let name = built.name.clone();
        let measured = match stored_noise_floor.take() {
            Some(traces) => Pending { header: built.header(), traces, routes: None, done: true },
            None => run_variant(&scoring, built, &sources, dump.as_mut(), progress)?,
        };
        pending.push(measured);
        progress(Progress::Done { model: &name });
    }
    if let Some(d) = dump {
        d.finish()?;
    }
    // The reference back on the device, for the variants' text.
    let reference = match resident {
        Resident::Model(m) => *m,
        Resident::Head(_) | Resident::Nothing => {
            drop(resident);
            qdrift_model::release_free_memory();
            build_reference()?
        }
    };
    let scoring = ScoringContext { reference: &reference_run, resident: &Resident::Nothing, plan };
    let mut variants: Vec<(VariantHeader, Vec<Trace>)> = Vec::with_capacity(pending.len());
    for mut p in pending {
        if !p.done {
            progress(Progress::Scoring { model: &p.header.name });
            scoring.score_reference(&reference, &mut p.traces, p.routes.as_ref())?;
            if let Some(at) = first_non_finite(&p.traces, true) {
                let (model, problem) = diagnose(&reference, plan, &p.header.name, &p.traces, at);
                return Err(EvalError::Overflow { model, problem });
            }
        }
        variants.push((p.header, p.traces));
    }
    // A store that cannot be written does not cost the measurement: the report is still made.
    let unsaved = match (&cfg.save_reference, key, variants.first()) {
        (Some(dir), Some(key), Some(floor)) => save_reference(dir, (key, cfg.seed), plan, &reference_run, floor).err(),
        _ => None,
    };
    let tail = reference_run.compact().map(|c| (c.k, c.tail_sums()));
    Ok((Measurement { variants, tail }, unsaved))
}

/// Writes the reference's store (`--save-reference DIR`) from its run and the noise floor's traces.
fn save_reference(
    dir: &std::path::Path,
    (key, seed): (&StoreKey, u64),
    plan: &Plan,
    reference_run: &ReferenceRun,
    (header, noise_floor): &(VariantHeader, Vec<Trace>),
) -> Result<(), EvalError> {
    if let Some(failure) = &header.failure {
        return Err(EvalError::Store {
            flag: "--save-reference",
            path: dir.to_path_buf(),
            problem: format!("the noise floor failed, so there is nothing to save for later runs: {failure}"),
        });
    }
    let stored = reference_run.to_store(plan.dtype, noise_floor.clone())?;
    write_store(dir, key, seed, &stored)
}

/// Where variants get their weights: the FP16 reference's parts, the quantization options, and
/// the reference model itself when it must come back.
struct VariantSources<'a> {
    fp16: &'a dyn WeightSource,
    quantize: &'a QuantizeOptions,
    reference: &'a dyn Fn() -> Result<Llama, EvalError>,
}

/// Builds `built` on the device from `weights` (the FP16 reference's parts), lets it generate,
/// and scores it on the reference's text: its header (storage known once built) and one trace
/// per prompt, still without the reference's pass over its text. The reference comes back
/// (`weights.reference`) only to name where it overflows.
fn run_variant(
    scoring: &ScoringContext<'_>,
    mut built: BuiltVariant,
    weights: &VariantSources<'_>,
    dump: Option<&mut Dump>,
    progress: &mut ProgressFn<'_>,
) -> Result<Pending, EvalError> {
    let plan = scoring.plan;
    let calibration = calibrate(&built, plan, weights)?;
    let mut model = built.build_model(weights.fp16, weights.quantize, &plan.device)?;
    if let Some(amax) = &calibration {
        model.set_input_scales(amax);
        built.calibration_prompts = Some(amax.sequences);
    }
    let header = built.header();
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
    let routes = scoring.score_variant(&model, &header.name, &mut traces, dump)?;
    match first_non_finite(&traces, false) {
        None => Ok(Pending { header, traces, routes, done: false }),
        Some(at @ NonFinite::Variant(..)) => {
            let (who, problem) = diagnose(&model, plan, &header.name, &traces, at);
            if plan.shard.is_none() {
                Ok(failed(header, format!("{who}: {problem}")))
            } else {
                Err(EvalError::Overflow { model: header.name.clone(), problem })
            }
        }
        Some(at) => {
            // The reference's own values: it comes back (alone) to say where.
            drop(model);
            let reference = (weights.reference)()?;
            let (model, problem) = diagnose(&reference, plan, &header.name, &traces, at);
            Err(EvalError::Overflow { model, problem })
        }
    }
}

/// NVFP4 activations' static global input scales: every linear layer's input amax over the
/// eval set's prompts, each run alone through the reference (a prefill pass, batch 1:
/// `Llama::calibrate_inputs`), as llm-compressor calibrates `input_global_scale` on its samples.
/// Deterministic; `None` for a variant that needs none. The reference comes back for it and is
/// dropped before the variant is built.
///
/// # Errors
/// [`EvalError::Variant`] for a sharded run (each shard holds only its prompts, and the scales
/// must not depend on the shard); the reference's building errors.
fn calibrate(
    built: &BuiltVariant,
    plan: &Plan,
    weights: &VariantSources<'_>,
) -> Result<Option<qdrift_model::InputAmax>, EvalError> {
    if !built.needs_calibration() {
        return Ok(None);
    }
    if plan.shard.is_some() {
        return Err(EvalError::Variant {
            variant: built.name.clone(),
            problem: "NVFP4 activations calibrate their global input scales over the whole eval set; run it unsharded"
                .into(),
        });
    }
    let reference = (weights.reference)()?;
    Ok(Some(reference.calibrate_inputs(&plan.prompts)))
}

/// A variant that failed where the reference did not: its header with the failure, no traces.
/// (A shard stops instead: the parts of a sharded run hold every variant's traces.)
fn failed(mut header: VariantHeader, failure: String) -> Pending {
    header.failure = Some(failure);
    Pending { header, traces: Vec::new(), routes: None, done: true }
}

/// The reference's entry before its statistics.
fn reference_info(cfg: &EvalConfig, loaded: &Loaded) -> Reference {
    Reference {
        name: reference_name(cfg.dtype).to_string(),
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
    loaded: &Loaded,
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
fn model_info(cfg: &EvalConfig, loaded: &Loaded) -> Result<ModelInfo, EvalError> {
    let arch = loaded.model.arch();
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
        stored_dtype: Some(loaded.stored_dtype()).filter(|d| !d.is_empty()),
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
        quantize_router: Some(cfg.quantize.quantize_router),
    }
}
