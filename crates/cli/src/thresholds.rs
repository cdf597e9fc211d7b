//! `qdrift thresholds suggest` and `qdrift thresholds show`.

use std::error::Error;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use qdrift_io::{PathCheck, write_atomic};
use qdrift_report::{Profile, Report, SuggestOptions, suggest_thresholds};

use crate::eval::DEFAULT_HORIZONS;

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
    /// Print a built-in thresholds profile as the thresholds file it is (`default`: what `qdrift
    /// gate --thresholds default` and `qdrift eval --gate default` check), a comment above each
    /// check giving its reason: a file to start from.
    Show(ShowArgs),
}

/// Arguments of `qdrift thresholds show`.
#[derive(Args)]
struct ShowArgs {
    /// The profile: default.
    profile: String,
    /// Write the checks at this report's longest horizon, as a gate of it checks them (default:
    /// the longest of `qdrift eval`'s default horizons, 1000).
    #[arg(long, conflicts_with = "horizons")]
    report: Option<PathBuf>,
    /// Write the checks at the longest of these horizons, comma-separated (a run's --horizons).
    #[arg(long, value_delimiter = ',')]
    horizons: Vec<usize>,
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
    match args.command {
        ThresholdsCommand::Suggest(args) => suggest(&args),
        ThresholdsCommand::Show(args) => show(&args),
    }
}

/// `qdrift thresholds show`: the profile at the horizons asked for, to standard output.
fn show(args: &ShowArgs) -> Result<(), Box<dyn Error>> {
    let profile = Profile::named(&args.profile)?;
    let (horizons, origin) = match (&args.report, args.horizons.is_empty()) {
        (Some(path), _) => {
            let report = Report::read(path)?;
            let list: Vec<String> = report.workload.horizons.iter().map(usize::to_string).collect();
            (report.workload.horizons, format!("the horizons of that report: {}", list.join(", ")))
        }
        (None, false) => (args.horizons.clone(), "the horizons given".to_string()),
        (None, true) => (
            DEFAULT_HORIZONS.to_vec(),
            "qdrift eval's default horizons; --report REPORT writes them at a report's".to_string(),
        ),
    };
    let text = profile.toml(&horizons, &origin).ok_or("--horizons: no horizon given")?;
    print!("{text}");
    Ok(())
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
