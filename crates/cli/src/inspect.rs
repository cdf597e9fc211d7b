//! `qdrift inspect`.

use std::error::Error;
use std::path::PathBuf;

use clap::Args;
use qdrift_load::inspect::{inspect, inspect_loaded};

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
            let mut i = inspect(&arch, &[], false, seq, args.batch);
            i.synthetic = true;
            i.format = Some("synthetic".to_string());
            i
        }
        None => {
            let loaded = qdrift_load::open_model(&args.model, args.tokenizer.as_deref())?;
            let seq = args.seq_len.unwrap_or(loaded.model.arch.max_seq_len);
            inspect_loaded(&loaded, seq, args.batch)
        }
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&inspection)?);
    } else {
        print!("{inspection}");
    }
    Ok(())
}
