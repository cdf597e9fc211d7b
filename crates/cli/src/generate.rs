//! `qdrift generate`.

use std::error::Error;
use std::io::Write;
use std::path::PathBuf;

use burn::tensor::DType;
use clap::Args;
use qdrift_eval::dtype_name;
use qdrift_generate::{
    BackendChoice, GenerationConfig, PromptTooLong, check_length, check_prompt_text, check_prompt_tokens,
    context_overflow, default_batch_size, generate, select_device, timed_generate,
};
use qdrift_load::{Tokenizer, WeightSource};
use qdrift_quantize::{QuantizedSource, Reference};

use crate::args::{backend_parser, batch_size_help, dtype_parser, model_help};

/// Arguments of `qdrift generate`.
#[derive(Args)]
pub struct GenerateArgs {
    // Help built from the synthetic presets, so it cannot go stale.
    #[arg(long, help = model_help())]
    model: PathBuf,
    /// Tokenizer file, when not found beside the model (llama2.c: `tokenizer.bin`, else the only
    /// `tok*.bin` there; a Hugging Face folder's `tokenizer.json`; a GGUF file carries its own).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// A prompt; repeat for several (batched as --batch-size says).
    #[arg(long, required = true)]
    prompt: Vec<String>,
    /// New tokens per prompt (exactly this many unless --stop-at-eos).
    #[arg(long)]
    max_new_tokens: usize,
    /// Compute precision.
    #[arg(long, default_value = "f32", value_parser = dtype_parser())]
    dtype: DType,
    /// Where the model runs.
    #[arg(long, default_value = "auto", value_parser = backend_parser())]
    backend: BackendChoice,
    #[arg(long, help = batch_size_help())]
    batch_size: Option<usize>,
    /// Run even when a prompt plus its new tokens exceed 8 × the model's trained context (such
    /// runs take very long).
    #[arg(long)]
    allow_long: bool,
    /// Stop a prompt once it generates the end-of-sequence token (for a llama2.c model BOS, where
    /// llama2.c's run.c stops: it delimits the training stories).
    #[arg(long)]
    stop_at_eos: bool,
    /// One JSON object per prompt per line instead of text.
    #[arg(long)]
    json: bool,
    /// Time the generation and print one JSON line on stderr: after one untimed warm-up run
    /// (shader compilation, autotuning), a run with one new token (`first_token_s`: prompt pass
    /// and first token) and the timed run (`total_s`); `decode_step_s` is
    /// (total − first) / (new tokens − 1), `tokens_per_s` counts every prompt's new tokens over
    /// `total_s`, `decode_tokens_per_s` prompts / `decode_step_s`. Each timer stops after the
    /// tokens are read back from the device. Runs the generation three times.
    #[arg(long, conflicts_with = "stop_at_eos")]
    timing_json: bool,
    /// Run a quantized variant of the FP16 reference instead of the checkpoint as it is.
    #[command(flatten)]
    variant: crate::quantize::SchemeArgs,
}

/// Encodes the prompts, refusing one too long for the `trained` context (by its bytes before
/// encoding; by its tokens after, unless `allow_long`).
fn encode_prompts(
    texts: &[String],
    tokenizer: &dyn Tokenizer,
    trained: usize,
    allow_long: bool,
) -> Result<Vec<Vec<u32>>, String> {
    let refuse = |i: usize, e: PromptTooLong| format!("--prompt {}: {e}", i + 1);
    let mut prompts = Vec::with_capacity(texts.len());
    for (i, text) in texts.iter().enumerate() {
        check_prompt_text(text, trained).map_err(|e| refuse(i, e))?;
        let tokens = tokenizer.encode(text);
        check_prompt_tokens(&tokens, trained, allow_long).map_err(|e| refuse(i, e))?;
        prompts.push(tokens);
    }
    Ok(prompts)
}

/// Runs `qdrift generate`.
pub fn run(args: GenerateArgs) -> Result<(), Box<dyn Error>> {
    for (i, p) in args.prompt.iter().enumerate() {
        if p.is_empty() {
            return Err(format!("prompt {} is empty: give at least one character", i + 1).into());
        }
    }
    // What runs, first.
    let device = select_device(args.backend)?;
    eprintln!("qdrift: {}", device.announce());
    if let Some(warning) = device.software_warning() {
        eprintln!("qdrift: warning: {warning}");
    }
    // The weights are handed out part by part as the model is built: no whole f32 copy.
    let loaded = qdrift_load::open_source(&args.model, args.tokenizer.as_deref(), &|_| {})?;
    for note in &loaded.notes {
        eprintln!("qdrift: note: {note}");
    }
    let arch = loaded.model.arch();
    let prompts = encode_prompts(&args.prompt, &*loaded.tokenizer, arch.max_seq_len, args.allow_long)?;
    check_length(&prompts, args.max_new_tokens, arch.max_seq_len, args.allow_long, "--max-new-tokens")?;
    device.check_dtype(args.dtype)?;
    if let Some(overflow) = context_overflow(&prompts, args.max_new_tokens, arch.max_seq_len) {
        eprintln!("qdrift: warning: {overflow}");
    }
    let config = GenerationConfig {
        max_new_tokens: args.max_new_tokens,
        batch_size: args.batch_size.unwrap_or_else(|| default_batch_size(prompts.len(), &device)),
        stop_at_eos: if args.stop_at_eos { loaded.tokenizer.stop_id() } else { None },
    };
    // Refuse impossible requests before uploading weights.
    qdrift_generate::check_request(arch, args.dtype, &device, &prompts, &config)?;
    if let Some(kv) = args.variant.scheme.and_then(|r| r.kv_cache) {
        kv.check_row(arch.n_kv_heads, arch.head_dim())?;
    }
    // The checkpoint as it is; with --scheme, the scheme applied to the reference (FP16, or bf16
    // under --dtype bf16) as `qdrift eval` builds it, tensor by tensor.
    let model = match &args.variant.scheme {
        None => device.build_model(&*loaded.model, args.dtype)?,
        Some(recipe) => {
            let reference = Reference { source: &*loaded.model, format: qdrift_eval::reference_format(args.dtype) };
            let quantized = QuantizedSource::new(&reference, recipe.weights, args.variant.options());
            let mut model = device.build_model(&quantized, args.dtype)?;
            model.apply_runtime(recipe)?;
            model
        }
    };
    let generated = if args.timing_json {
        let (generated, timing) = timed_generate(&model, &device, &prompts, &config)?;
        let line = serde_json::json!({
            "timing": "qdrift generate",
            "backend": device.backend,
            "adapter": device.adapter,
            "dtype": dtype_name(args.dtype),
            "prompts": timing.prompts,
            "batch_size": timing.batch_size,
            "prompt_tokens": prompts.iter().map(Vec::len).sum::<usize>(),
            "new_tokens": timing.new_tokens,
            "warm_up_s": timing.warm_up_s,
            "gpu_cache_dir": qdrift_generate::gpu_cache_dir().filter(|_| device.backend == "wgpu"),
            // Whether this build keeps autotune results in that folder (feature `autotune-cache`).
            "autotune_cache_persists": cfg!(feature = "autotune-cache") && device.backend == "wgpu",
            "first_token_s": timing.first_token_s,
            "total_s": timing.total_s,
            "decode_step_s": timing.decode_step_s,
            "tokens_per_s": timing.tokens_per_s(),
            "decode_tokens_per_s": timing.decode_tokens_per_s(),
            "first_token_launches": timing.first_token_launches,
            "decode_step_launches": timing.decode_step_launches,
            // The step's launches over its layers: embedding, final norm and head included.
            "decode_step_launches_per_layer": timing.decode_step_launches.map(|l| l / model.arch.n_layers.max(1) as f64),
            "decode_step_kernels": timing.decode_step_kernels.by_kernel,
            "decode_step_read_back_bytes": timing.decode_step_read_back_bytes,
        });
        eprintln!("{line}");
        generated
    } else {
        generate(&model, &device, &prompts, &config, |_| {})?
    };

    let mut out = std::io::stdout().lock();
    for ((text, prompt_tokens), new_tokens) in args.prompt.iter().zip(&prompts).zip(&generated) {
        let all: Vec<u32> = prompt_tokens.iter().chain(new_tokens).copied().collect();
        let full = loaded.tokenizer.decode(&all);
        if args.json {
            let line = serde_json::json!({
                "prompt": text,
                "prompt_tokens": prompt_tokens,
                "generated_tokens": new_tokens,
                "text": full,
                "continuation": loaded.tokenizer.decode(new_tokens),
                "backend": device.backend,
                "adapter": device.adapter,
                "dtype": dtype_name(args.dtype),
                "scheme": args.variant.scheme.as_ref().map(ToString::to_string),
            });
            writeln!(out, "{line}")?;
        } else {
            writeln!(out, "{full}")?;
        }
    }
    Ok(())
}
