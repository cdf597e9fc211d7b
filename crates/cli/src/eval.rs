//! `qdrift eval`.

use std::error::Error;
use std::path::PathBuf;
use std::process::ExitCode;

use burn::tensor::DType;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use qdrift_eval::{
    DEFAULT_EVAL_SET_RULE, EvalConfig, Evaluated, OutputDir, Part, Progress, Shard, VariantSpec, built_in_names,
    evaluate_any, merge,
};
use qdrift_generate::BackendChoice;
use qdrift_quantize::{QuantizeOptions, Recipe};
use qdrift_report::{Report, Thresholds, render_html, render_markdown, render_summary, write_atomic};

use crate::quantize::RecipeParser;

/// Arguments of `qdrift eval`.
#[derive(Args)]
pub struct EvalArgs {
    /// The reference checkpoint (its weights rounded to FP16 are the reference).
    #[arg(long)]
    model: PathBuf,
    /// Tokenizer file, when not found beside the model.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    // Help built from the built-in sets and the default's rule, so it cannot go stale.
    #[arg(long, help = eval_set_help())]
    eval_set: Option<PathBuf>,
    /// Variants built from the reference, comma-separated, each `WEIGHTS[+a-ACT][+kv-KV]`: a
    /// weight scheme, then optionally dynamic activation quantization (`+a-int8`, `+a-fp8`,
    /// `+a-fp8-g128` per token and group of 128 inputs, …)
    /// and KV-cache rounding (`+kv-q8_0`, `+kv-fp8-e4m3`, …); `w8a8-int8`, `w8a8-fp8` are
    /// shorthands. `--schemes` with no value runs none (only the `--variant` checkpoints).
    #[arg(
        long,
        value_delimiter = ',',
        num_args = 0..,
        value_parser = RecipeParser,
        default_value = "int8,fp8-e4m3,int4-g128"
    )]
    schemes: Vec<Recipe>,
    /// Another checkpoint of the same architecture and tokenizer to compare (repeatable):
    /// llama2.c, GGUF, or a Hugging Face folder, also quantized (GPTQ, AWQ, compressed-tensors,
    /// FP8: dequantized on load; a dynamic activation quantization its config declares is
    /// applied at run time, block FP8's per token and group of its block width).
    #[arg(long)]
    variant: Vec<PathBuf>,
    /// Generated-token horizons, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "10,100,1000")]
    horizons: Vec<usize>,
    /// auto: wgpu on a hardware GPU, else the CPU; wgpu; cpu.
    #[arg(long, default_value = "auto")]
    backend: BackendChoice,
    /// The reference's compute precision; the noise floor runs at the other.
    #[arg(long, default_value = "f16", value_parser = crate::generate::parse_dtype)]
    dtype: DType,
    /// Use the first N prompts of the eval set (default: all).
    #[arg(long)]
    prompts: Option<usize>,
    /// Seed of the bootstrap resampling.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long, help = crate::generate::batch_size_help())]
    batch_size: Option<usize>,
    /// Bootstrap resamples per interval (at most 1000000).
    #[arg(long, default_value_t = 2000)]
    resamples: usize,
    /// Also quantize the token embedding (and a head tied to it).
    #[arg(long)]
    quantize_embeddings: bool,
    /// Also quantize an untied output layer.
    #[arg(long)]
    quantize_head: bool,
    /// Compute each variant's KL divergence against the reference's top K log-probabilities
    /// per position plus one tail bucket: a lower bound of the exact KL (the report gives K and
    /// the tail mass) from K + 5 numbers per position. Default: the exact KL over the whole
    /// vocabulary (the reference's logits, or its final hidden states, kept in memory when they
    /// fit 256 MiB; else the reference runs again beside each variant). A K at least the
    /// vocabulary size, or --dump-logprobs, means the exact KL.
    #[arg(long)]
    reference_top_k: Option<usize>,
    /// Save the reference's continuations, what scoring keeps of its pass on them and the noise
    /// floor's traces to this folder (versioned, checksummed, written atomically), for later
    /// runs with --reference.
    #[arg(long, conflicts_with = "reference")]
    save_reference: Option<PathBuf>,
    /// Use a reference saved with --save-reference instead of running the reference's
    /// generation and the noise floor: the run pays only for its variants. Refused, naming the
    /// field, unless model, tokenizer, eval set, prompts, dtype, horizons, backend, batch size,
    /// KL mode and qdrift version are the ones it was saved with.
    #[arg(long)]
    reference: Option<PathBuf>,
    /// Evaluate one shard of the run, INDEX/COUNT (0 ≤ INDEX < COUNT): batches INDEX,
    /// INDEX + COUNT, … of the whole prompt list (cut exactly as the unsharded run cuts them);
    /// --out receives a part (part.json, traces.bin) instead of a report. `qdrift merge` makes
    /// the report from all parts, byte-identical to the unsharded run's.
    #[arg(long)]
    shard: Option<Shard>,
    /// Write both models' full log-probabilities at every teacher-forced position to this JSONL
    /// file (large; for independent checks).
    #[arg(long)]
    dump_logprobs: Option<PathBuf>,
    /// Output folder: report.json, report.md and report.html, written together when the run
    /// succeeds (a previous report there is replaced; nothing is written on failure). Locked
    /// while the run lasts: a second run on the same folder is refused.
    #[arg(long)]
    out: PathBuf,
    /// Run even when the longest prompt plus the longest horizon exceeds 8 × the model's trained
    /// context (such runs take very long).
    #[arg(long)]
    allow_long: bool,
    /// Run `qdrift gate` with these thresholds on the new report; the exit code is the gate's.
    #[arg(long)]
    gate: Option<PathBuf>,
    /// With --gate: also write the checks as JUnit XML.
    #[arg(long, requires = "gate")]
    junit: Option<PathBuf>,
}

/// `--eval-set`'s help: the built-in sets and the default, from the code that defines them.
fn eval_set_help() -> String {
    format!(
        "Eval set: a JSONL file of {{\"id\", \"prompt\"}}, or a built-in set ({}). Default: {DEFAULT_EVAL_SET_RULE}",
        built_in_names().join(", ")
    )
}

/// Runs `qdrift eval`; with `--gate`, returns the gate's exit code.
///
/// Order: the thresholds are read and the output folder locked and staged before anything is
/// loaded; [`evaluate_any`] checks the options and the thresholds against the run before it loads the
/// model; the reports (and a JUnit file inside `--out`) are written to the staging folder and
/// moved into `--out` together ([`OutputDir`]).
pub fn run(args: EvalArgs) -> Result<Option<ExitCode>, Box<dyn Error>> {
    // Refuse unusable thresholds before an evaluation that may take hours.
    let thresholds =
        args.gate.as_ref().map(|t| Ok::<_, Box<dyn Error>>((t.clone(), Thresholds::read(t)?))).transpose()?;
    let output = OutputDir::prepare(&args.out)?;
    let cfg = config(&args, thresholds);
    let report = match evaluate_with_progress(&cfg)? {
        Evaluated::Report(report) => report,
        Evaluated::Part(part) => {
            part.write(output.staging())?;
            output.commit()?;
            println!("part {}: {} (merge all parts with `qdrift merge`)", part.shard(), args.out.display());
            return Ok(None);
        }
    };
    write_reports(&report, &output)?;
    let path = output.staging().join("report.json");
    print!("{}", render_summary(&report));
    // The gate reads the staged report; a JUnit file inside --out is staged with it.
    let code = args.gate.as_deref().map(|t| {
        let junit = args.junit.as_deref().map(|j| output.staged(j).unwrap_or_else(|| j.to_path_buf()));
        crate::gate::run_paths(&path, t, junit.as_deref())
    });
    output.commit()?;
    println!("reports: {} (.md, .html)", args.out.join("report.json").display());
    Ok(code)
}

/// Writes report.json, report.md and report.html into `output`'s staging folder.
fn write_reports(report: &Report, output: &OutputDir) -> Result<(), Box<dyn Error>> {
    report.write(&output.staging().join("report.json"))?;
    write_atomic(&output.staging().join("report.md"), render_markdown(report).as_bytes())?;
    write_atomic(&output.staging().join("report.html"), render_html(report)?.as_bytes())?;
    Ok(())
}

/// Arguments of `qdrift merge`.
#[derive(Args)]
pub struct MergeArgs {
    /// The parts, one folder per shard (`qdrift eval --shard I/N --out PART`), in any order.
    #[arg(required = true)]
    parts: Vec<PathBuf>,
    /// Output folder: report.json, report.md and report.html, written together (as `qdrift
    /// eval` writes them).
    #[arg(long)]
    out: PathBuf,
}

/// Runs `qdrift merge`: reads every part, checks they are the shards of one run, and writes the
/// report.
pub fn run_merge(args: MergeArgs) -> Result<(), Box<dyn Error>> {
    let output = OutputDir::prepare(&args.out)?;
    let parts = args.parts.iter().map(|p| Part::read(p)).collect::<Result<Vec<_>, _>>()?;
    let report = merge(parts)?;
    write_reports(&report, &output)?;
    print!("{}", render_summary(&report));
    output.commit()?;
    println!("reports: {} (.md, .html)", args.out.join("report.json").display());
    Ok(())
}

/// The evaluation's configuration from the arguments.
fn config(args: &EvalArgs, gate: Option<(PathBuf, Thresholds)>) -> EvalConfig {
    let mut cfg = EvalConfig::new(args.model.clone());
    cfg.tokenizer = args.tokenizer.clone();
    cfg.eval_set = args.eval_set.clone();
    cfg.variants = args.schemes.iter().cloned().map(VariantSpec::Scheme).collect();
    cfg.variants.extend(args.variant.iter().cloned().map(VariantSpec::Checkpoint));
    cfg.horizons = args.horizons.clone();
    cfg.backend = args.backend;
    cfg.dtype = args.dtype;
    cfg.prompts = args.prompts;
    cfg.seed = args.seed;
    cfg.batch_size = args.batch_size;
    cfg.resamples = args.resamples;
    cfg.quantize = QuantizeOptions { quantize_embeddings: args.quantize_embeddings, quantize_head: args.quantize_head };
    cfg.dump_logprobs = args.dump_logprobs.clone();
    cfg.reference_top_k = args.reference_top_k;
    cfg.save_reference = args.save_reference.clone();
    cfg.reference_store = args.reference.clone();
    cfg.shard = args.shard;
    cfg.allow_long = args.allow_long;
    cfg.gate = gate;
    cfg
}

/// [`evaluate_any`] with a progress bar on stderr.
fn evaluate_with_progress(cfg: &EvalConfig) -> Result<Evaluated, qdrift_eval::EvalError> {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>18} [{bar:30}] {pos}/{len} tokens  {msg} ETA {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let report = evaluate_any(cfg, &mut |p| match p {
        Progress::Generating { model, tokens } => {
            bar.reset();
            bar.set_length(tokens);
            bar.set_prefix(model.to_string());
            bar.set_message("generating");
        }
        Progress::Generated { tokens } => bar.inc(tokens),
        Progress::Scoring { model } => {
            bar.set_prefix(model.to_string());
            bar.set_message("scoring");
        }
        Progress::Warning { message } => bar.suspend(|| eprintln!("qdrift: warning: {message}")),
        Progress::Done { .. } => {}
    });
    bar.finish_and_clear();
    report
}
