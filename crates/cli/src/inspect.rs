//! `qdrift inspect`: [`qdrift_load::inspect::Inspection`] as text, or as JSON with `--json` (its
//! fields are documented on that type). Weight memory is listed unquantized (`fp32`), then under
//! every scheme of `qdrift quantize`, each from the scheme's own storage accounting
//! ([`SchemeFootprint`]).

use std::error::Error;
use std::path::PathBuf;

use clap::Args;
use qdrift_load::ModelFormat;
use qdrift_load::inspect::{Fp32, WeightStorage, inspect, inspect_loaded};
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
}

/// Runs `qdrift inspect`.
pub fn run(args: InspectArgs) -> Result<(), Box<dyn Error>> {
    // Weight memory unquantized, then under every scheme `qdrift quantize` offers.
    let footprints = SchemeFootprint::all();
    let mut storages: Vec<&dyn WeightStorage> = vec![&Fp32];
    storages.extend(footprints.iter().map(|f| f as &dyn WeightStorage));
    let name = args.model.to_string_lossy();
    // Synthetic shapes need no weights: inspecting llama-8b must not allocate 32 GB.
    let inspection = match name.strip_prefix("synthetic:") {
        Some(preset) => {
            let preset = preset.split(':').next().unwrap_or(preset);
            let arch = qdrift_load::synthetic_arch(preset).ok_or_else(|| {
                let known: Vec<&str> = qdrift_load::SYNTHETIC_PRESETS.iter().map(|(n, _)| *n).collect();
                format!("unknown synthetic model \"{preset}\"; known: {}", known.join(", "))
            })?;
            let seq = args.seq_len.unwrap_or(arch.max_seq_len);
            inspect(&arch, &[], false, seq, args.batch, &storages).with_format(ModelFormat::Synthetic)
        }
        None => {
            let loaded = qdrift_load::open_model(&args.model, args.tokenizer.as_deref())?;
            let seq = args.seq_len.unwrap_or(loaded.model.arch.max_seq_len);
            inspect_loaded(&loaded, seq, args.batch, &storages)
        }
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&inspection)?);
    } else {
        print!("{inspection}");
    }
    Ok(())
}
