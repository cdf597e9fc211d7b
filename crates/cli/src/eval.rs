//! `qdrift eval`.

use std::error::Error;
use std::path::PathBuf;
use std::process::ExitCode;

use burn::tensor::DType;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use qdrift_eval::{DEFAULT_EVAL_SET_RULE, EvalConfig, Progress, VariantSpec, built_in_names, evaluate};
use qdrift_generate::BackendChoice;
use qdrift_quantize::{QuantizeOptions, Scheme};
use qdrift_report::{render_html, render_markdown, render_summary, write_atomic};

use crate::quantize::SchemeParser;

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
    /// Quantization schemes applied to the reference's weights, comma-separated.
    #[arg(long, value_delimiter = ',', value_parser = SchemeParser, default_value = "int8,fp8-e4m3,int4-g128")]
    schemes: Vec<Scheme>,
    /// Another checkpoint of the same architecture and tokenizer to compare (repeatable).
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
    /// Bootstrap resamples per interval.
    #[arg(long, default_value_t = 2000)]
    resamples: usize,
    /// Also quantize the token embedding (and a head tied to it).
    #[arg(long)]
    quantize_embeddings: bool,
    /// Also quantize an untied output layer.
    #[arg(long)]
    quantize_head: bool,
    /// Write both models' full log-probabilities at every teacher-forced position to this JSONL
    /// file (large; for independent checks).
    #[arg(long)]
    dump_logprobs: Option<PathBuf>,
    /// Output folder: report.json, report.md and report.html.
    #[arg(long)]
    out: PathBuf,
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
pub fn run(args: EvalArgs) -> Result<Option<ExitCode>, Box<dyn Error>> {
    if let Some(t) = &args.gate {
        // Refuse unusable thresholds before an evaluation that may take hours.
        qdrift_report::Thresholds::read(t)?;
    }
    std::fs::create_dir_all(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
    let mut cfg = EvalConfig::new(args.model);
    cfg.tokenizer = args.tokenizer;
    cfg.eval_set = args.eval_set;
    cfg.variants = args.schemes.into_iter().map(VariantSpec::Scheme).collect();
    cfg.variants.extend(args.variant.into_iter().map(VariantSpec::Checkpoint));
    cfg.horizons = args.horizons;
    cfg.backend = args.backend;
    cfg.dtype = args.dtype;
    cfg.prompts = args.prompts;
    cfg.seed = args.seed;
    cfg.batch_size = args.batch_size;
    cfg.resamples = args.resamples;
    cfg.quantize = QuantizeOptions { quantize_embeddings: args.quantize_embeddings, quantize_head: args.quantize_head };
    cfg.dump_logprobs = args.dump_logprobs;

    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>18} [{bar:30}] {pos}/{len} tokens  {msg} ETA {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let report = evaluate(&cfg, &mut |p| match p {
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
    let report = report?;
    let path = args.out.join("report.json");
    report.write(&path)?;
    write_atomic(&args.out.join("report.md"), render_markdown(&report).as_bytes())?;
    write_atomic(&args.out.join("report.html"), render_html(&report)?.as_bytes())?;
    print!("{}", render_summary(&report));
    println!("reports: {} (.md, .html)", path.display());
    Ok(args.gate.as_deref().map(|t| crate::gate::run_paths(&path, t, args.junit.as_deref())))
}
