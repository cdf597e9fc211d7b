//! `qdrift inspect`: [`qdrift_load::inspect::Inspection`] as text, or as JSON with `--json` (its
//! fields are documented on that type). Weight memory is listed unquantized (`fp32`), then under
//! every scheme of `qdrift quantize`, each from the scheme's own storage accounting
//! ([`SchemeFootprint`]). Then the memory of each model `qdrift eval` would run with `--dtype`
//! and `--schemes` (the reference, the noise floor, each variant, one at a time), at `--seq-len`
//! positions × `--batch` prompts ([`qdrift_eval::memory`]).

use std::error::Error;
use std::path::PathBuf;

use burn::tensor::DType;
use clap::Args;
use qdrift_eval::memory::{PlannedModel, largest, planned_models};
use qdrift_eval::{EvalConfig, VariantSpec};
use qdrift_generate::{BackendChoice, GenerationConfig, format_gib, select_device};
use qdrift_load::LoadError;
use qdrift_load::inspect::{Fp32, WeightStorage, inspect_path};
use qdrift_quantize::SchemeFootprint;

/// Arguments of `qdrift inspect`.
#[derive(Args)]
pub struct InspectArgs {
    /// Model: llama2.c `.bin`, `.gguf`, a Hugging Face folder, or `synthetic:NAME`.
    #[arg(long)]
    model: PathBuf,
    /// Tokenizer file, when not found beside the model.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Context length for the KV-cache and attention FLOPs accounting (default: the model's).
    #[arg(long)]
    seq_len: Option<usize>,
    /// Sequences decoded together, for the KV-cache accounting.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// The evaluation's reference compute precision, for its memory plan.
    #[arg(long, default_value = "f16", value_parser = crate::args::dtype_parser())]
    dtype: DType,
    /// The evaluation's variants, for its memory plan (as `qdrift eval --schemes`).
    #[arg(long, num_args = 0.., value_parser = crate::args::SchemeListParser, default_value = "int8,fp8-e4m3,int4-g128")]
    schemes: Vec<crate::args::SchemeList>,
    /// The backend the evaluation runs on, for its memory plan (an f32 model on the CPU keeps
    /// f16 weights in f16).
    #[arg(long, default_value = "cpu", value_parser = crate::args::backend_parser())]
    backend: BackendChoice,
}

/// An overflowing figure names the flags that set its inputs (the library does not know them).
fn with_flag_hint(e: LoadError, args: &InspectArgs) -> Box<dyn Error> {
    match e {
        LoadError::Overflow { .. } => {
            let seq = if args.seq_len.is_some() { "--seq-len" } else { "--seq-len (default: the model's context)" };
            format!("{e}; lower {seq} or --batch").into()
        }
        other => other.into(),
    }
}

/// Runs `qdrift inspect`.
pub fn run(args: InspectArgs) -> Result<(), Box<dyn Error>> {
    // Weight memory unquantized, then under every scheme `qdrift quantize` offers.
    let footprints = SchemeFootprint::all();
    let mut storages: Vec<&dyn WeightStorage> = vec![&Fp32];
    storages.extend(footprints.iter().map(|f| f as &dyn WeightStorage));
    let inspection = inspect_path(&args.model, args.tokenizer.as_deref(), args.seq_len, args.batch, &storages)
        .map_err(|e| with_flag_hint(e, &args))?;
    let seq_len = (inspection.kv_cache.seq_len as usize).max(1);
    let models = evaluation_memory(&args, &inspection, seq_len)?;
    if args.json {
        let mut json = serde_json::to_value(&inspection)?;
        let plan: Vec<serde_json::Value> = models
            .iter()
            .map(|m| {
                let f = &m.footprint;
                serde_json::json!({
                    "name": m.name, "compute_dtype": qdrift_eval::dtype_name(m.dtype),
                    "weight_bytes": f.weights as u64, "build_bytes": f.build as u64, "kv_cache_bytes": f.kv as u64,
                    "workspace_bytes": f.workspace as u64, "peak_bytes": f.peak() as u64,
                })
            })
            .collect();
        if let Some(object) = json.as_object_mut() {
            object.insert("evaluation_memory".to_string(), plan.into());
        }
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        println!("{inspection}");
        print_evaluation_memory(&models, seq_len, args.batch);
    }
    Ok(())
}

/// The models `qdrift eval --dtype --schemes` would run, one at a time, each at `seq_len`
/// positions (a one-token prompt and the rest generated) × `--batch` prompts in one batch.
fn evaluation_memory(
    args: &InspectArgs,
    inspection: &qdrift_load::inspect::Inspection,
    seq_len: usize,
) -> Result<Vec<PlannedModel>, Box<dyn Error>> {
    let device = select_device(args.backend)?;
    device.check_dtype(args.dtype)?;
    let mut cfg = EvalConfig::new(args.model.clone());
    cfg.dtype = args.dtype;
    cfg.variants = args.schemes.iter().flat_map(|list| list.0.iter().cloned()).map(VariantSpec::Scheme).collect();
    let prompts = vec![vec![0u32]; args.batch.max(1)];
    let generation = GenerationConfig { max_new_tokens: seq_len - 1, batch_size: prompts.len(), stop_at_eos: None };
    let model = (&inspection.arch, inspection.params.total as usize);
    Ok(planned_models(&cfg, &device, &prompts, model, &generation))
}

fn print_evaluation_memory(models: &[PlannedModel], seq_len: usize, batch: usize) {
    println!("evaluation memory, one model at a time (seq {seq_len} × batch {batch}):");
    for m in models {
        let f = &m.footprint;
        println!(
            "  {:<16} {:<4} weights {:>10}  KV cache {:>10}  workspace {:>10}  peak {:>10}",
            m.name,
            qdrift_eval::dtype_name(m.dtype),
            format_gib(f.weights),
            format_gib(f.kv),
            format_gib(f.workspace),
            format_gib(f.peak())
        );
    }
    if let Some(m) = largest(models) {
        println!("  the evaluation peaks at {} ({})", format_gib(m.footprint.peak()), m.name);
    }
}
