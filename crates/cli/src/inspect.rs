//! `qdrift inspect`: [`qdrift_load::inspect::Inspection`] as text, or as JSON with `--json` (its
//! fields are documented on that type). Weight memory is listed unquantized (`fp32`), then under
//! every scheme of `qdrift quantize`, each from the scheme's own storage accounting
//! ([`SchemeFootprint`]).

use std::error::Error;
use std::path::PathBuf;

use clap::Args;
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
    if args.json {
        println!("{}", serde_json::to_string_pretty(&inspection)?);
    } else {
        print!("{inspection}");
    }
    Ok(())
}
