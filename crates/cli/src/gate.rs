//! `qdrift gate`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

/// Arguments of `qdrift gate`.
#[derive(Args)]
pub struct GateArgs {
    /// The report.json written by `qdrift eval`.
    #[arg(long)]
    report: PathBuf,
    /// Thresholds (TOML): `[variant."NAME"]` tables of `"metric@horizon" = { min = x }` or
    /// `{ max = x }`; `[defaults] bound = "ci"` (the 95% CI bound must clear the threshold) or
    /// `"point"` (the mean must). `default`: the built-in profile, with no file to write: excess
    /// KLD, missed stops and, for a model with experts, routing flips at the report's longest
    /// horizon (`qdrift thresholds show default` prints it with each check's reason; a file named
    /// default is ./default).
    #[arg(long, value_name = "FILE|default")]
    thresholds: PathBuf,
    /// Also write the checks as JUnit XML (one testcase per check; an inconclusive one is
    /// `<skipped>`).
    #[arg(long)]
    junit: Option<PathBuf>,
    /// Also write the verdict as Markdown (per variant: its gate verdict, the checks that did not
    /// pass, and one line of plain words), e.g. `--summary-md "$GITHUB_STEP_SUMMARY"`.
    #[arg(long)]
    summary_md: Option<PathBuf>,
}

/// Runs `qdrift gate`: exit 0 when every check passes, 1 when any fails, 3 when none fails but
/// some are inconclusive, 2 on unusable input.
pub fn run(args: &GateArgs) -> ExitCode {
    let run =
        qdrift_report::run_gate_with(&args.report, &args.thresholds, args.junit.as_deref(), args.summary_md.as_deref());
    print!("{}", run.stdout);
    eprint!("{}", run.stderr);
    ExitCode::from(run.exit_code)
}
