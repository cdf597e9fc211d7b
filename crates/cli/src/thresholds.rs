//! `qdrift thresholds suggest`.

use std::error::Error;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use qdrift_io::{PathCheck, write_atomic};
use qdrift_report::{Report, SuggestOptions, suggest_thresholds};

/// Arguments of `qdrift thresholds`.
#[derive(Args)]
pub struct ThresholdsArgs {
    #[command(subcommand)]
    command: ThresholdsCommand,
}

#[derive(Subcommand)]
enum ThresholdsCommand {
    /// Write a thresholds file from a known-good report: each check is the report's 95% bound on
    /// the side a regression moves, widened by --margin, so that report passes and a later run
    /// passes where it is no worse by more than the margin.
    Suggest(SuggestArgs),
}

/// Arguments of `qdrift thresholds suggest`.
#[derive(Args)]
struct SuggestArgs {
    /// The report.json of the known-good run.
    report: PathBuf,
    /// Relative margin (≥ 0): 0.1 widens each bound by 10% of itself (perplexity ratios: of
    /// their distance from 1).
    #[arg(long, default_value_t = 0.1)]
    margin: f64,
    /// Metrics to check, comma-separated (default: those the terminal summary shows that the
    /// report has: token_match_rate, exact_match_fraction, kld, top1_agreement,
    /// ppl_drift_of_generated_text, and for a model with experts expert_overlap and
    /// routing_flip_rate).
    #[arg(long, value_delimiter = ',')]
    metrics: Vec<String>,
    /// Horizons to check, comma-separated (default: every horizon of the report).
    #[arg(long, value_delimiter = ',')]
    horizons: Vec<usize>,
    /// Suggest checks for this variant only (default: every variant but the noise floor).
    #[arg(long, value_name = "NAME")]
    variant: Option<String>,
    /// Write the checks as `[variant."SECTION"]` instead of under the variant's own name: the name
    /// the CI run gives its candidate, or `*` for every variant but the noise floor. Needs one
    /// variant: --variant, or the report's only one.
    #[arg(long = "as", value_name = "SECTION")]
    section: Option<String>,
    /// Write the thresholds here (atomically) instead of to standard output.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Runs `qdrift thresholds`: exit 0, or one `qdrift: error:` line and the exit code of its kind
/// (2 on unusable input, as every command; `crate::exit`).
pub fn run(args: ThresholdsArgs) -> Result<(), Box<dyn Error>> {
    let ThresholdsCommand::Suggest(args) = args.command;
    suggest(&args)
}

/// `qdrift thresholds suggest`: check the paths, read the report, write the thresholds.
fn suggest(args: &SuggestArgs) -> Result<(), Box<dyn Error>> {
    let mut paths = PathCheck::new().input("REPORT", &args.report);
    if let Some(out) = &args.out {
        paths = paths.output_file("--out", out);
    }
    paths.check()?;
    let report = Report::read(&args.report)?;
    let options = SuggestOptions {
        margin: args.margin,
        metrics: args.metrics.clone(),
        horizons: args.horizons.clone(),
        variant: args.variant.clone(),
        section: args.section.clone(),
    };
    let source =
        args.report.file_name().map_or_else(|| args.report.display().to_string(), |n| n.to_string_lossy().into_owned());
    let text = suggest_thresholds(&report, &options, &source)?;
    match &args.out {
        Some(out) => write_atomic(out, text.as_bytes())?,
        None => print!("{text}"),
    }
    Ok(())
}
