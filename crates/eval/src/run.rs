//! Running the evaluation: models on the device, traces back on the host.

use std::io::Write;
use std::path::{Path, PathBuf};

use burn::tensor::{DType, Tensor};
use qdrift_generate::{
    BackendChoice, ComputeDevice, GenerationConfig, check_request, generate, select_device, teacher_forced,
    teacher_forced_pair,
};
use qdrift_load::{HostModel, LoadedModel, open_model};
use qdrift_model::{Llama, LlamaConfig};
use qdrift_quantize::{QuantizeOptions, Scheme, quantize_model};
use qdrift_report::{
    EvalSetInfo, ModelInfo, ModelShape, Reference, Report, SCHEMA_VERSION, TensorError, Variant, VariantKind, Workload,
};
use qdrift_score::{position_metrics_on_device, token_logprobs_on_device};

use crate::EvalError;
use crate::aggregate::{self, Stats, Trace};
use crate::evalset::{EvalSet, model_identity_file, sha256_file};

/// A variant to compare with the reference (the noise floor is always added).
#[derive(Clone, Debug, PartialEq)]
pub enum VariantSpec {
    /// A quantization scheme applied to the reference's FP16 weights.
    Scheme(Scheme),
    /// Another checkpoint of the same architecture and tokenizer.
    Checkpoint(PathBuf),
}

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
    /// The variants, in report order (after the noise floor).
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
    /// Prompts per batch (default: the prompts split evenly over the batches the device runs at
    /// once, at most 16 per batch).
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
    /// Largest size, in bytes, of the reference's logits on its own text that is kept across
    /// variants (each variant then costs one pass on that text instead of two); above it the
    /// reference runs again in lockstep with each variant. Same numbers either way.
    pub reference_logits_budget: u64,
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

/// The name of the reference in reports.
pub const REFERENCE_NAME: &str = "fp16";

/// The eval set used when none is given: `stories` for llama2.c models (TinyStories), `chat`
/// for models with a chat template, else `english`.
pub fn default_eval_set(loaded: &LoadedModel) -> &'static str {
    if loaded.format == qdrift_load::ModelFormat::Llama2c {
        "stories"
    } else if loaded.chat_template.is_some() {
        "chat"
    } else {
        "english"
    }
}

/// Whether a set holds chat requests (to be wrapped in the model's chat template): the built-in
/// `chat` set, or a file named `chat*.jsonl`.
fn is_chat_set(set: &EvalSet) -> bool {
    let name = set.path.rsplit('/').next().unwrap_or(&set.path);
    name.starts_with("chat")
}

/// The name `--dtype` takes and reports use for a compute dtype: `f16`, else `f32`.
pub fn dtype_name(d: DType) -> &'static str {
    if d == DType::F16 { "f16" } else { "f32" }
}

fn other(d: DType) -> DType {
    if d == DType::F16 { DType::F32 } else { DType::F16 }
}

/// Runs the whole evaluation and returns the report (not yet written).
pub fn evaluate(cfg: &EvalConfig, progress: &mut (dyn FnMut(Progress<'_>) + Send)) -> Result<Report, EvalError> {
    let input = |m: String| Err(EvalError::Input(m));
    let mut horizons = cfg.horizons.clone();
    horizons.sort_unstable();
    horizons.dedup();
    if horizons.is_empty() || horizons[0] == 0 {
        return input("--horizons needs at least one horizon, each ≥ 1".into());
    }
    if !matches!(cfg.dtype, DType::F16 | DType::F32) {
        return input(format!("compute dtype {:?}: use f16 or f32", cfg.dtype));
    }
    if cfg.resamples == 0 {
        return input("bootstrap resamples must be at least 1".into());
    }
    let longest = *horizons.last().unwrap_or(&1);
    for spec in &cfg.variants {
        if let VariantSpec::Checkpoint(p) = spec {
            if !p.exists() {
                return input(format!("variant {}: no such file or folder", p.display()));
            }
        }
    }

    let mut loaded = open_model(&cfg.model, cfg.tokenizer.as_deref())?;
    let set = match &cfg.eval_set {
        Some(p) => EvalSet::read(p)?,
        None => EvalSet::built_in(default_eval_set(&loaded))?,
    };
    let n = cfg.prompts.unwrap_or(set.prompts.len());
    if n == 0 || n > set.prompts.len() {
        return input(format!("--prompts {n}: the eval set {} has {} prompts", set.path, set.prompts.len()));
    }
    let chosen = &set.prompts[..n];
    let template = loaded.chat_template.clone().filter(|_| is_chat_set(&set));
    let prompts: Vec<Vec<u32>> = match template.as_deref() {
        None => chosen.iter().map(|p| loaded.tokenizer.encode(&p.prompt)).collect(),
        Some(t) => {
            let piece = |id: Option<u32>| id.map(|i| loaded.tokenizer.decode(&[i])).unwrap_or_default();
            let (bos, eos) = (piece(loaded.tokenizer.bos_id()), piece(loaded.tokenizer.eos_id()));
            let mut out = Vec::with_capacity(n);
            for p in chosen {
                out.push(loaded.tokenizer.encode(&crate::apply_chat_template(t, &p.prompt, &bos, &eos)?));
            }
            out
        }
    };
    if let Some(i) = prompts.iter().position(Vec::is_empty) {
        return input(format!("prompt {} encodes to no tokens", chosen[i].id));
    }
    if cfg.batch_size == Some(0) {
        return input("--batch-size must be at least 1".into());
    }

    let mut device = select_device(cfg.backend)?;
    if cfg.dump_logprobs.is_some() {
        // Batches side by side would interleave the dump's lines; one at a time keeps them in
        // prompt order. (The report is the same either way.)
        device.parallel_batches = 1;
    }
    // By default the prompts are split evenly over the batches the device runs side by side
    // (the CPU's cores), at most 16 per batch.
    let batch_size = cfg.batch_size.unwrap_or(n.div_ceil(device.parallel_batches.max(1)).min(16));
    if !device.supports_f16 {
        return input(format!(
            "{} does not support f16 compute, which the reference or the noise floor needs",
            device.adapter
        ));
    }
    let arch = loaded.model.arch.clone();
    let model_config = LlamaConfig::from_arch(&arch);
    let gen_cfg = GenerationConfig { max_new_tokens: longest, batch_size, stop_at_eos: None };
    for dtype in [DType::F16, DType::F32] {
        check_request(&model_config, dtype, &device, &prompts, &gen_cfg)?;
    }
    let positions = prompts.iter().map(Vec::len).max().unwrap_or(0) + longest;
    if positions > arch.max_seq_len {
        let message = format!(
            "{positions} positions exceed the {} the model was trained for; beyond them RoPE extrapolates and divergence reflects that too",
            arch.max_seq_len
        );
        progress(Progress::Warning { message: &message });
    }
    let stats = Stats { resamples: cfg.resamples, seed: cfg.seed };
    let parameters = loaded.model.parameter_count() as u64;

    // The reference is the checkpoint's weights rounded to FP16, in place: a model's host copy
    // is its largest allocation, so the evaluation holds as few as it can (this one, plus at
    // most one variant's).
    loaded.model.round_to_f16();
    let reference_host = &loaded.model;
    let reference = model_config.init_from_host(reference_host, cfg.dtype, &device.device)?;
    // Teacher-forced chunks hold several [batch, chunk, vocab] f32 tensors (logits of both
    // models, their log-softmax, probabilities): keep one under 64 MiB so that large
    // vocabularies do not multiply the peak memory.
    let chunk = cfg.chunk.min((64usize << 20) / (batch_size * arch.vocab_size * 4).max(1)).max(1);
    let ref_tokens = run_generation(&reference, &device, &prompts, &gen_cfg, REFERENCE_NAME, progress)?;
    // (prompt, continuation) pairs of the reference's text, which every variant is scored on.
    let on_ref: Vec<(Vec<u32>, Vec<u32>)> = prompts.iter().cloned().zip(ref_tokens.iter().cloned()).collect();
    let kept = reference_logits(&reference, &device, &on_ref, batch_size, chunk, cfg.reference_logits_budget)?;

    let mut dump = match &cfg.dump_logprobs {
        Some(p) => Some(Dump::create(p)?),
        None => None,
    };
    let nf_dtype = other(cfg.dtype);
    let nf_name = format!("noise-floor-{}", dtype_name(nf_dtype));
    let mut variants = Vec::new();
    let mut noise_floor: Option<Vec<Trace>> = None;
    let mut self_ppl = Vec::new();
    let specs: Vec<Option<&VariantSpec>> = std::iter::once(None).chain(cfg.variants.iter().map(Some)).collect();
    for spec in specs {
        let built = build_variant(spec, reference_host, &loaded, &prompts, cfg, nf_dtype, &nf_name)?;
        if variants.iter().any(|v: &Variant| v.name == built.name) {
            return input(format!("two variants are named {}; give each once", built.name));
        }
        let model =
            LlamaConfig::from_arch(&built.host.arch).init_from_host(&built.host, built.dtype, &device.device)?;
        let var_tokens = run_generation(&model, &device, &prompts, &gen_cfg, &built.name, progress)?;
        progress(Progress::Scoring { model: &built.name });
        let mut traces: Vec<Trace> =
            ref_tokens.iter().zip(&var_tokens).map(|(r, v)| Trace::new(r.clone(), v.clone())).collect();
        score(
            &reference,
            &model,
            kept.as_ref(),
            &device,
            &on_ref,
            &mut traces,
            batch_size,
            chunk,
            &built.name,
            &mut dump,
        )?;
        drop(model);
        if self_ppl.is_empty() {
            self_ppl = horizons.iter().map(|&h| (h, aggregate::self_perplexity(&traces, h))).collect();
        }
        let metrics = aggregate::horizon_metrics(&traces, noise_floor.as_deref(), &horizons, stats)?;
        variants.push(Variant {
            name: built.name.clone(),
            scheme: built.scheme,
            path: built.path,
            kind: built.kind,
            compute_dtype: dtype_name(built.dtype).to_string(),
            bits_per_weight: built.bits_per_weight,
            weight_bytes: built.weight_bytes,
            horizons: metrics,
            first_divergence: aggregate::first_divergence_summary(&traces, longest)?,
            per_position: aggregate::per_position(&traces, longest),
            entropy_strata: aggregate::entropy_strata(&traces, longest)?,
            per_tensor_error: built.per_tensor_error,
        });
        if noise_floor.is_none() {
            noise_floor = Some(traces);
        }
        progress(Progress::Done { model: &built.name });
    }
    if let Some(d) = dump {
        d.finish()?;
    }

    let model_path = cfg.model.display().to_string();
    let synthetic = loaded.format.is_synthetic();
    let report = Report {
        schema_version: SCHEMA_VERSION,
        model: ModelInfo {
            path: model_path,
            sha256: if synthetic { String::new() } else { sha256_file(&model_identity_file(&cfg.model))? },
            architecture: arch.architecture.clone(),
            parameters,
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
        },
        workload: Workload {
            backend: device.backend.to_string(),
            adapter: device.adapter.clone(),
            compute_dtype: dtype_name(cfg.dtype).to_string(),
            prompts: n,
            horizons,
            batch_size,
            seed: cfg.seed,
            eval_set: EvalSetInfo {
                path: set.path.clone(),
                sha256: set.sha256.clone(),
                prompts: chosen.iter().map(|p| p.id.clone()).collect(),
            },
            qdrift_version: env!("CARGO_PKG_VERSION").to_string(),
            bootstrap_resamples: cfg.resamples,
            chat_template: template.is_some(),
        },
        reference: Reference {
            name: REFERENCE_NAME.to_string(),
            compute_dtype: dtype_name(cfg.dtype).to_string(),
            weight_bytes: parameters * 2,
            self_perplexity: self_ppl,
        },
        variants,
    };
    report.validate()?;
    Ok(report)
}

/// A variant ready to run.
struct BuiltVariant<'a> {
    name: String,
    scheme: Option<String>,
    path: Option<String>,
    kind: VariantKind,
    dtype: DType,
    /// The noise floor borrows the reference's weights; other variants own theirs.
    host: std::borrow::Cow<'a, HostModel>,
    bits_per_weight: f64,
    weight_bytes: u64,
    per_tensor_error: Vec<TensorError>,
}

fn build_variant<'a>(
    spec: Option<&VariantSpec>,
    reference: &'a HostModel,
    loaded: &LoadedModel,
    prompts: &[Vec<u32>],
    cfg: &EvalConfig,
    nf_dtype: DType,
    nf_name: &str,
) -> Result<BuiltVariant<'a>, EvalError> {
    let params = reference.parameter_count() as u64;
    match spec {
        None => Ok(BuiltVariant {
            name: nf_name.to_string(),
            scheme: None,
            path: None,
            kind: VariantKind::NoiseFloor,
            dtype: nf_dtype,
            host: std::borrow::Cow::Borrowed(reference),
            bits_per_weight: 16.0,
            weight_bytes: params * 2,
            per_tensor_error: Vec::new(),
        }),
        Some(VariantSpec::Scheme(scheme)) => {
            let q = quantize_model(reference, scheme, &cfg.quantize)?;
            let s = q.summary();
            let per_tensor_error = q
                .reports()
                .into_iter()
                .map(|r| TensorError {
                    tensor: r.tensor,
                    sqnr_db: r.sqnr_db,
                    rel_frobenius: r.rel_frobenius,
                    cosine: r.cosine,
                })
                .collect();
            // Tensors the scheme leaves alone stay FP16.
            let rest = params.saturating_sub(s.quantized_weights as u64) * 2;
            Ok(BuiltVariant {
                name: scheme.to_string(),
                scheme: Some(scheme.to_string()),
                path: None,
                kind: VariantKind::Scheme,
                dtype: cfg.dtype,
                host: std::borrow::Cow::Owned(q.dequantized),
                bits_per_weight: s.bits_per_weight,
                weight_bytes: s.storage_bytes as u64 + rest,
                per_tensor_error,
            })
        }
        Some(VariantSpec::Checkpoint(path)) => {
            let other = open_model(path, None)?;
            check_same_model(loaded, &other, prompts, path)?;
            // The checkpoint's file size stands for its weight bytes (metadata and tokenizer
            // included, a small overestimate for GGUF).
            let bytes = std::fs::metadata(model_identity_file(path))
                .map_err(|e| EvalError::Input(format!("{}: {e}", path.display())))?
                .len();
            let name =
                path.file_stem().map_or_else(|| path.display().to_string(), |s| s.to_string_lossy().into_owned());
            Ok(BuiltVariant {
                name,
                scheme: None,
                path: Some(path.display().to_string()),
                kind: VariantKind::Checkpoint,
                dtype: cfg.dtype,
                host: std::borrow::Cow::Owned(other.model),
                bits_per_weight: bytes as f64 * 8.0 / params.max(1) as f64,
                weight_bytes: bytes,
                per_tensor_error: Vec::new(),
            })
        }
    }
}

/// Refuses a checkpoint variant whose shapes or tokenizer differ from the reference's.
fn check_same_model(
    reference: &LoadedModel,
    other: &LoadedModel,
    prompts: &[Vec<u32>],
    path: &Path,
) -> Result<(), EvalError> {
    let (a, b) = (&reference.model.arch, &other.model.arch);
    let shape = |x: &qdrift_load::LlamaArch| (x.dim, x.hidden_dim, x.n_layers, x.n_heads, x.n_kv_heads, x.vocab_size);
    if shape(a) != shape(b) {
        return Err(EvalError::Input(format!(
            "{}: shapes (dim, hidden, layers, heads, kv heads, vocab) {:?} differ from the reference's {:?}",
            path.display(),
            shape(b),
            shape(a)
        )));
    }
    if reference.tokenizer.vocab_size() != other.tokenizer.vocab_size() {
        return Err(EvalError::Input(format!(
            "{}: its tokenizer has {} tokens, the reference's {}",
            path.display(),
            other.tokenizer.vocab_size(),
            reference.tokenizer.vocab_size()
        )));
    }
    for (i, p) in prompts.iter().enumerate() {
        let text = reference.tokenizer.decode(p);
        if other.tokenizer.encode(&text) != reference.tokenizer.encode(&text) {
            return Err(EvalError::Input(format!(
                "{}: its tokenizer encodes prompt {} differently from the reference's",
                path.display(),
                i + 1
            )));
        }
    }
    Ok(())
}

fn run_generation(
    model: &Llama,
    device: &ComputeDevice,
    prompts: &[Vec<u32>],
    gen_cfg: &GenerationConfig,
    name: &str,
    progress: &mut (dyn FnMut(Progress<'_>) + Send),
) -> Result<Vec<Vec<u32>>, EvalError> {
    progress(Progress::Generating { model: name, tokens: (prompts.len() * gen_cfg.max_new_tokens) as u64 });
    let tokens = generate(model, device, prompts, gen_cfg, |s| {
        progress(Progress::Generated { tokens: s.logits.dims()[0] as u64 })
    })?;
    if let Some(i) = tokens.iter().position(|t| t.len() != gen_cfg.max_new_tokens) {
        return Err(EvalError::Input(format!(
            "{name}: prompt {} generated {} tokens, expected {}",
            i + 1,
            tokens[i].len(),
            gen_cfg.max_new_tokens
        )));
    }
    Ok(tokens)
}

/// The reference's teacher-forced logits on its own continuation, `[batch, chunk, vocab]` f32
/// per chunk, keyed by (first prompt of the batch, first position of the chunk) as
/// `teacher_forced` hands them out. Every variant is compared with the same logits; keeping them
/// saves one forward pass of the reference per variant.
struct ReferenceLogits(std::collections::HashMap<(usize, usize), Tensor<3>>);

/// Runs the reference on its own continuation once and keeps its logits, when they fit
/// `budget` bytes (default 256 MiB; stories260K, 32 prompts × 1000 positions × 512: 66 MB); else
/// `None`, and each variant runs in lockstep with the reference instead (SmolLM2, 16 prompts ×
/// 1000 × 49,152: 3.1 GB). Both paths batch and chunk the reference identically, so they give the
/// same numbers.
fn reference_logits(
    reference: &Llama,
    device: &ComputeDevice,
    on_ref: &[(Vec<u32>, Vec<u32>)],
    batch_size: usize,
    chunk: usize,
    budget: u64,
) -> Result<Option<ReferenceLogits>, EvalError> {
    let positions: u128 = on_ref.iter().map(|(_, c)| c.len() as u128).sum();
    if positions * reference.config.vocab_size as u128 * 4 > u128::from(budget) {
        return Ok(None);
    }
    let mut kept = std::collections::HashMap::new();
    teacher_forced(reference, device, on_ref, batch_size, chunk, |f| {
        kept.insert((f.first_prompt, f.start), f.logits.clone());
    })?;
    Ok(Some(ReferenceLogits(kept)))
}

/// Teacher-forces both models on the reference's text `on_ref` (the reference's logits from
/// `kept` when given) and the reference on the variant's, filling every trace's per-position
/// fields.
#[allow(clippy::too_many_arguments)]
fn score(
    reference: &Llama,
    variant: &Llama,
    kept: Option<&ReferenceLogits>,
    device: &ComputeDevice,
    on_ref: &[(Vec<u32>, Vec<u32>)],
    traces: &mut [Trace],
    batch_size: usize,
    chunk: usize,
    name: &str,
    dump: &mut Option<Dump>,
) -> Result<(), EvalError> {
    let mut record = |first_prompt: usize, start: usize, r: &Tensor<3>, v: &Tensor<3>| -> Result<(), EvalError> {
        let [b, c, _] = r.dims();
        let tokens: Vec<u32> =
            (0..b).flat_map(|i| on_ref[first_prompt + i].1[start..start + c].iter().copied()).collect();
        if let Some(d) = dump.as_mut() {
            d.write_chunk(name, first_prompt, start, r, v, &tokens)?;
        }
        let m = position_metrics_on_device(r.clone(), v.clone(), &tokens)?;
        for i in 0..b {
            let tr = &mut traces[first_prompt + i];
            for j in 0..c {
                let (k, t) = (i * c + j, start + j);
                tr.kld[t] = m.kld[k];
                tr.top1[t] = m.top1_agree[k];
                tr.logp_ref[t] = m.logp_ref_of_token[k];
                tr.logp_var[t] = m.logp_var_of_token[k];
                tr.ref_entropy[t] = m.ref_entropy[k];
            }
        }
        Ok(())
    };
    let mut failure: Option<EvalError> = None;
    match kept {
        Some(kept) => teacher_forced(variant, device, on_ref, batch_size, chunk, |f| {
            if failure.is_none() {
                let result = match kept.0.get(&(f.first_prompt, f.start)) {
                    Some(r) => record(f.first_prompt, f.start, r, f.logits),
                    None => Err(EvalError::Input(format!(
                        "internal error: no reference logits kept for prompt {} position {}",
                        f.first_prompt, f.start
                    ))),
                };
                failure = result.err();
            }
        })?,
        None => teacher_forced_pair(reference, variant, device, on_ref, batch_size, chunk, |p| {
            if failure.is_none() {
                failure = record(p.first_prompt, p.start, p.reference, p.variant).err();
            }
        })?,
    }
    if let Some(e) = failure {
        return Err(e);
    }
    let on_var: Vec<(Vec<u32>, Vec<u32>)> =
        on_ref.iter().zip(traces.iter()).map(|((p, _), t)| (p.clone(), t.var_tokens.clone())).collect();
    let mut failure: Option<EvalError> = None;
    teacher_forced(reference, device, &on_var, batch_size, chunk, |f| {
        if failure.is_some() {
            return;
        }
        let [b, c, _] = f.logits.dims();
        let tokens: Vec<u32> =
            (0..b).flat_map(|i| on_var[f.first_prompt + i].1[f.start..f.start + c].iter().copied()).collect();
        match token_logprobs_on_device(f.logits.clone(), &tokens) {
            Ok(lp) => {
                for i in 0..b {
                    let tr = &mut traces[f.first_prompt + i];
                    tr.logp_ref_on_var_text[f.start..f.start + c].copy_from_slice(&lp[i * c..(i + 1) * c]);
                }
            }
            Err(e) => failure = Some(e.into()),
        }
    })?;
    failure.map_or(Ok(()), Err)
}

/// The optional log-probability dump: JSONL, one line per (variant, prompt, position), written
/// to a temporary file and renamed into place when complete.
struct Dump {
    path: PathBuf,
    tmp: PathBuf,
    out: std::io::BufWriter<std::fs::File>,
}

impl Dump {
    fn create(path: &Path) -> Result<Dump, EvalError> {
        let tmp = path.with_extension("jsonl.tmp");
        let file = std::fs::File::create(&tmp).map_err(|e| EvalError::Input(format!("{}: {e}", tmp.display())))?;
        Ok(Dump { path: path.to_path_buf(), tmp, out: std::io::BufWriter::new(file) })
    }

    fn write_chunk(
        &mut self,
        variant: &str,
        first_prompt: usize,
        start: usize,
        reference: &Tensor<3>,
        var: &Tensor<3>,
        tokens: &[u32],
    ) -> Result<(), EvalError> {
        let [b, c, v] = reference.dims();
        let host = |t: &Tensor<3>| -> Result<Vec<f32>, EvalError> {
            t.to_data()
                .convert::<f32>()
                .try_into_vec::<f32>()
                .map_err(|e| EvalError::Input(format!("reading logits for the dump: {e:?}")))
        };
        let (r, q) = (host(reference)?, host(var)?);
        for k in 0..b * c {
            let line = serde_json::json!({
                "variant": variant,
                "prompt": first_prompt + k / c,
                "position": start + k % c,
                "token": tokens[k],
                "ref_logprobs": qdrift_score::log_softmax(&r[k * v..(k + 1) * v])?,
                "var_logprobs": qdrift_score::log_softmax(&q[k * v..(k + 1) * v])?,
            });
            writeln!(self.out, "{line}").map_err(|e| EvalError::Input(format!("{}: {e}", self.tmp.display())))?;
        }
        Ok(())
    }

    fn finish(mut self) -> Result<(), EvalError> {
        let io = |e: std::io::Error| EvalError::Input(format!("{}: {e}", self.path.display()));
        self.out.flush().map_err(io)?;
        std::fs::rename(&self.tmp, &self.path).map_err(io)
    }
}
