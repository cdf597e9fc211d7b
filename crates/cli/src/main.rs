//! `qdrift`: how far a quantized language model drifts from its FP16 reference.
//!
//! The binary is thin: it parses arguments, calls the pipeline crates, and turns their typed
//! errors into one line on stderr and a non-zero exit code.

mod args;
mod bandwidth;
mod eval;
mod gate;
mod generate;
mod inspect;
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
    /// Evaluate how far quantized variants drift from the FP16 reference over 10, 100 and 1000
    /// generated tokens; writes OUT/report.json.
    Eval(Box<eval::EvalArgs>),
    /// Make the report of a sharded evaluation (`qdrift eval --shard I/N`) from all its parts;
    /// byte-identical to the unsharded run's report.
    Merge(eval::MergeArgs),
    /// Check a report against thresholds: exit 0 if every check passes, 1 if any fails, 2 on
    /// unusable input.
    Gate(gate::GateArgs),
    /// Architecture, parameters, dtypes, and memory and FLOPs accounting of a model.
    Inspect(inspect::InspectArgs),
    /// Greedy generation from a model, for one or more prompts (in batches; on the CPU backend,
    /// the batches decode together as one, the layers spread over the cores, unless stopping at
    /// EOS, when they run side by side, one per core).
    Generate(generate::GenerateArgs),
    /// Quantize a model's weights (any format generate reads) with one scheme, print per-tensor
    /// error statistics, and write the result as safetensors or as a GGUF file llama.cpp runs.
    Quantize(quantize::QuantizeArgs),
    /// The device's copy bandwidth as one JSON line (for `cargo xtask bench gpu`).
    #[command(hide = true)]
    Bandwidth(bandwidth::BandwidthArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Gate(args) => return gate::run(&args),
        Command::Inspect(args) => inspect::run(args),
        Command::Eval(args) => {
            let gated = eval::gated(&args);
            match eval::run(*args) {
                Ok(Some(code)) => return code,
                Ok(None) => Ok(()),
                // A gated run that cannot be gated exits 2, as `qdrift gate` on unusable input.
                Err(e) if gated => {
                    eprintln!("qdrift: error: {e}");
                    return ExitCode::from(2);
                }
                Err(e) => Err(e),
            }
        }
        Command::Merge(args) => eval::run_merge(args),
        Command::Generate(args) => generate::run(args),
        Command::Quantize(args) => quantize::run(args),
        Command::Bandwidth(args) => bandwidth::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("qdrift: error: {e}");
            ExitCode::FAILURE
        }
    }
}
