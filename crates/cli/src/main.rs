//! `qdrift`: how far a quantized language model drifts from its FP16 reference.
//!
//! The binary is thin: it parses arguments, calls the pipeline crates, and turns their typed
//! errors into one line on stderr and a non-zero exit code.

mod generate;
mod quantize;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Quantization-divergence evaluation for language models.
#[derive(Parser)]
#[command(name = "qdrift", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Greedy generation from a model, for one or more prompts in one batch.
    Generate(generate::GenerateArgs),
    /// Quantize a model's weights with one scheme, print per-tensor error statistics, and write
    /// the result as safetensors.
    Quantize(quantize::QuantizeArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Generate(args) => generate::run(args),
        Command::Quantize(args) => quantize::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("qdrift: error: {e}");
            ExitCode::FAILURE
        }
    }
}
