//! `qdrift quantize`, and the `--scheme` options shared with `generate`.

use std::error::Error;
use std::io::Write;
use std::path::PathBuf;

use clap::builder::{PossibleValue, TypedValueParser};
use clap::{Args, ValueEnum};
use qdrift_load::HostModel;
use qdrift_load::write::gguf_tokenizer_keys;
use qdrift_quantize::{
    QuantizeOptions, QuantizedModel, Recipe, check_gguf_scheme, quantize_model_owned, round_to_fp16_reference,
    write_compressed_tensors, write_gguf, write_safetensors, writes_compressed_tensors,
};

/// Which variant of the reference to build.
#[derive(Args, Clone)]
pub struct SchemeArgs {
    /// Variant, `WEIGHTS[+a-ACT][+kv-KV]`: the weight scheme applied to the FP16 reference's
    /// linear layers (q, k, v, o, gate, up, down), then optionally dynamic activation
    /// quantization of their inputs (`+a-int8`, `+a-fp8`, `+a-fp8-e5m2-tensor`,
    /// `+a-fp8-g128`, …) and KV-cache
    /// rounding (`+kv-q8_0`, `+kv-fp8-e4m3`, `+kv-int8`, …); `w8a8-int8` and `w8a8-fp8` are
    /// shorthands.
    #[arg(long, value_parser = RecipeParser)]
    pub scheme: Option<Recipe>,
    /// Also quantize the token embedding (and a head tied to it).
    #[arg(long)]
    pub quantize_embeddings: bool,
    /// Also quantize an untied output layer.
    #[arg(long)]
    pub quantize_head: bool,
    /// Also quantize the routers of a mixture of experts (`mlp.gate`); by default they stay at
    /// reference precision, as llm-compressor and vLLM leave them.
    #[arg(long)]
    pub quantize_router: bool,
}

/// Parses a `--scheme` value (`WEIGHTS[+a-ACT][+kv-KV]`, [`Recipe`];
/// [`crate::args::parse_recipe`]); `--help` lists every weight scheme with its sentence
/// ([`crate::args::recipe_possible_values`]) and the grammar with every activation and KV-cache
/// part ([`Recipe::grammar`]), so the lists cannot go stale.
#[derive(Clone, Copy)]
pub struct RecipeParser;

impl TypedValueParser for RecipeParser {
    type Value = Recipe;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<Recipe, clap::Error> {
        crate::args::parse_recipe(cmd, arg, value)
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(crate::args::recipe_possible_values())
    }
}

impl SchemeArgs {
    pub(crate) fn options(&self) -> QuantizeOptions {
        QuantizeOptions {
            quantize_embeddings: self.quantize_embeddings,
            quantize_head: self.quantize_head,
            quantize_router: self.quantize_router,
        }
    }

    /// With `--scheme`, the scheme applied to the FP16 reference of `model`
    /// ([`round_to_fp16_reference`], as `qdrift eval` builds it), quantized in place (one copy of
    /// the model); `None` without it.
    pub fn apply(&self, mut model: HostModel) -> Result<Option<QuantizedModel>, Box<dyn Error>> {
        let Some(recipe) = &self.scheme else { return Ok(None) };
        if self.quantize_router && model.arch.moe.is_none() {
            return Err("--quantize-router: the model has no experts, so no router to quantize".into());
        }
        round_to_fp16_reference(&mut model);
        Ok(Some(quantize_model_owned(model, &recipe.weights, &self.options())?))
    }
}

/// What `qdrift quantize` writes.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// A safetensors file under Hugging Face Llama names: dequantized F32 values, or with
    /// --packed the packed codes and scales.
    Safetensors,
    /// A GGUF file llama.cpp runs: the packed ggml blocks as qdrift quantized them (a q4_k/q6_k
    /// matrix whose rows are not whole 256-blocks as llama.cpp's fallback q5_0/q8_0, else F16),
    /// llama.cpp's tensor names and q/k row order, the tokenizer carried over (a Hugging Face
    /// folder's BPE tokenizer.json converted as llama.cpp's convert_hf_to_gguf.py does; WordPiece,
    /// Unigram and unrecognised pre-tokenizers refused). Schemes: fp16 and the ggml ones.
    Gguf,
}

/// Arguments of `qdrift quantize`.
#[derive(Args)]
pub struct QuantizeArgs {
    // Help built from the synthetic presets, so it cannot go stale.
    #[arg(long, help = crate::args::model_help())]
    model: PathBuf,
    /// Tokenizer file, when not found beside the model (llama2.c: `tokenizer.bin`, else the only
    /// `tok*.bin` there; a Hugging Face folder's `tokenizer.json`; a GGUF file carries its own).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Scheme and what it applies to.
    #[command(flatten)]
    scheme: SchemeArgs,
    /// Output file (`.safetensors` or `.gguf`, as --format says).
    #[arg(long)]
    out: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value = "safetensors")]
    format: OutputFormat,
    /// Safetensors only: write the packed codes and scales instead of dequantized F32 values
    /// (GGUF always stores the packed blocks). With nvfp4, mxfp4-ct or mxfp4-ocp, --out is a
    /// compressed-tensors folder (nvfp4-/mxfp4-pack-quantized, as vLLM loads it) written from a
    /// Hugging Face folder --model, whose config.json and tokenizer files it carries over.
    #[arg(long)]
    packed: bool,
    /// Print the statistics as JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Runs `qdrift quantize`.
pub fn run(args: QuantizeArgs) -> Result<(), Box<dyn Error>> {
    let Some(recipe) = args.scheme.scheme else {
        return Err("--scheme is required; known: see `qdrift quantize --help`".into());
    };
    if !recipe.is_weight_only() {
        return Err(format!(
            "--scheme {recipe}: quantize writes weights only; activation and KV-cache parts (+a-…, +kv-…) \
             are applied at run time: give `--scheme {}` here, and the whole variant to `qdrift eval --schemes` \
             or `qdrift generate --scheme`",
            recipe.weights
        )
        .into());
    }
    let scheme = recipe.weights;
    let gguf = args.format == OutputFormat::Gguf;
    if gguf {
        check_gguf_scheme(&scheme)?;
        if args.packed {
            return Err("--packed is for --format safetensors; GGUF always stores the packed blocks".into());
        }
    }
    let mut paths = qdrift_io::PathCheck::new().input("--model", &args.model);
    if let Some(t) = &args.tokenizer {
        paths = paths.input("--tokenizer", t);
    }
    let ct_folder = !gguf && args.packed && writes_compressed_tensors(&scheme);
    paths =
        if ct_folder { paths.output_folder("--out", &args.out, false) } else { paths.output_file("--out", &args.out) };
    paths.check()?;
    let loaded = qdrift_load::open_model(&args.model, args.tokenizer.as_deref())?;
    for note in &loaded.notes {
        eprintln!("qdrift: note: {note}");
    }
    // Before quantizing: a source whose tokenizer cannot be carried over is refused.
    let tokenizer_keys = if gguf { Some(gguf_tokenizer_keys(&loaded)?) } else { None };
    let q = args.scheme.apply(loaded.model)?.ok_or("no scheme applied")?;
    // A GGUF's tensor sizes come from the bytes written: the file at --out may already be another
    // concurrent writer's.
    let sizes = match &tokenizer_keys {
        Some(keys) => Some(write_gguf(&args.out, &q, keys)?),
        None if ct_folder => {
            write_compressed_tensors(&args.out, &q, &args.model)?;
            None
        }
        None => {
            let source = args.model.display().to_string();
            write_safetensors(&args.out, &q, args.packed, &[("qdrift.source".to_string(), source)])?;
            None
        }
    };

    let summary = q.summary();
    // A GGUF's bits per weight as the file stores its tensors (norms and biases as F32, as
    // llama.cpp's converter writes them): what `qdrift inspect` and `qdrift eval --variant` give
    // the file.
    let file = match &sizes {
        Some(sizes) => Some(qdrift_load::inspect::gguf_source_storage(sizes).map_err(|e| e.to_string())?),
        None => None,
    };
    let mut out = std::io::stdout().lock();
    if args.json {
        let file = file.as_ref().map(|s| serde_json::json!({ "bytes": s.bytes, "bits_per_weight": s.bits_per_weight }));
        let v = serde_json::json!({
            "scheme": scheme.to_string(),
            "summary": summary,
            "file": file,
            "tensors": q.reports(),
        });
        writeln!(out, "{v}")?;
        return Ok(());
    }
    writeln!(out, "scheme {scheme}: {}", scheme.describe())?;
    writeln!(
        out,
        "{:<42} {:>10} {:>12} {:>10} {:>8} {:>10}",
        "tensor", "SQNR dB", "rel. Frob.", "cosine", "bits/w", "bytes"
    )?;
    for r in q.reports() {
        let sqnr = r.sqnr_db.map_or("exact".to_string(), |v| format!("{v:.3}"));
        let note = if r.fell_back {
            format!("  (stored as {}: rows are not whole {scheme} blocks, as llama.cpp falls back)", r.stored)
        } else {
            String::new()
        };
        writeln!(
            out,
            "{:<42} {:>10} {:>12.4e} {:>10.6} {:>8.4} {:>10}{note}",
            r.tensor, sqnr, r.rel_frobenius, r.cosine, r.bits_per_weight, r.storage_bytes
        )?;
    }
    let total = summary.sqnr_db.map_or("exact".to_string(), |v| format!("{v:.3}"));
    writeln!(
        out,
        "quantized: {} tensors, {} weights, {} bytes ({:.4} bits per quantized weight), SQNR {total} dB",
        summary.quantized_tensors, summary.quantized_weights, summary.storage_bytes, summary.bits_per_weight
    )?;
    writeln!(
        out,
        "model: {} bytes of weights, {:.4} bits/weight (the other tensors at FP16, as `qdrift eval --schemes {scheme}` reports it)",
        summary.weight_bytes, summary.model_bits_per_weight
    )?;
    if let Some(s) = &file {
        writeln!(
            out,
            "file: {} bytes of tensors, {:.4} bits/weight (as stored: norms and biases F32; as `qdrift inspect` and `qdrift eval --variant` report the file)",
            s.bytes, s.bits_per_weight
        )?;
    }
    let fell_back: Vec<String> =
        q.reports().into_iter().filter(|r| r.fell_back).map(|r| format!("{} ({})", r.tensor, r.stored)).collect();
    if !fell_back.is_empty() {
        writeln!(out, "stored as llama.cpp's fallback type: {}", fell_back.join(", "))?;
    }
    writeln!(out, "wrote {}", args.out.display())?;
    Ok(())
}
