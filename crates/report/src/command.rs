//! The whole `qdrift gate REPORT THRESHOLDS [--junit FILE]` command: read both files, run the
//! check (`gate`), print its outcome and write it as JUnit (`junit`). Kept apart from the check
//! so that `junit` depends on `gate` and this module on both, never the other way round.

use std::path::Path;

use crate::Report;
use crate::format::plain;
use crate::gate::{GateError, GateOutcome, Thresholds, gate};
use crate::junit::{junit_error_xml, junit_xml};
use crate::markdown::render_verdict_markdown;
use crate::profile::Profile;
use qdrift_io::write_atomic;

/// The one line every `qdrift` command prints on standard error when it cannot run:
/// `qdrift: error: MESSAGE` and a newline, the message made safe for a terminal and bounded
/// ([`qdrift_io::message_line`]: a name from a report cannot move the cursor, reorder the text or
/// end the line, and a huge one is elided). One form for every command, so that a CI log is
/// searched for one prefix.
pub fn error_line(message: &str) -> String {
    format!("qdrift: error: {}\n", qdrift_io::message_line(message))
}

/// What `qdrift gate` prints and returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GateRun {
    /// The process exit code ([`exit_code`](crate::exit_code); 2 also when the JUnit file or the
    /// summary cannot be written).
    pub exit_code: u8,
    /// For standard output: the outcome lines and the total line.
    pub stdout: String,
    /// For standard error: the one-line error, if any.
    pub stderr: String,
}

/// The whole `qdrift gate REPORT THRESHOLDS [--junit FILE]` command, so the CLI is a thin
/// wrapper: print `stdout` and `stderr`, exit with `exit_code`. `THRESHOLDS` is a file, or the
/// name of a built-in profile ([`Profile::given_as`]: `default`), whose checks are then made at
/// the report's horizons and named in the first line printed ([`Profile::announce`]). With `junit`, the JUnit XML is
/// written atomically, also when the input is unusable (then it holds one error test case), so
/// a CI job never reads a stale file.
pub fn run_gate(report_path: &Path, thresholds_path: &Path, junit: Option<&Path>) -> GateRun {
    run_gate_with(report_path, thresholds_path, junit, None)
}

/// [`run_gate`], also writing the verdict as Markdown to `summary_md` (for a CI job's summary
/// page, e.g. `$GITHUB_STEP_SUMMARY`): the report's verdict section with the gate's outcome
/// ([`render_verdict_markdown`]), or the one-line error when the input is unusable. Written
/// atomically, like the JUnit file.
pub fn run_gate_with(
    report_path: &Path,
    thresholds_path: &Path,
    junit: Option<&Path>,
    summary_md: Option<&Path>,
) -> GateRun {
    // `--thresholds default` names a built-in profile, not a file.
    let profile = Profile::given_as(thresholds_path);
    // The output rule first: a JUnit path that is the report, the thresholds or a device is
    // refused before anything is read or written.
    let mut paths = qdrift_io::PathCheck::new().input("--report", report_path);
    if profile.is_none() {
        paths = paths.input("--thresholds", thresholds_path);
    }
    if let Some(j) = junit {
        paths = paths.output_file("--junit", j);
    }
    if let Some(s) = summary_md {
        paths = paths.output_file("--summary-md", s);
    }
    if let Err(e) = paths.check() {
        return GateRun { exit_code: 2, stdout: String::new(), stderr: error_line(&e.to_string()) };
    }
    let report = Report::read(report_path).map_err(GateError::from);
    // A profile's checks are at the report's horizons: said first, so that every line after
    // it reads against them.
    let announce = profile.zip(report.as_ref().ok()).map(|(p, r)| p.announce(&r.workload.horizons));
    let outcome = report.and_then(|report| {
        let thresholds = match profile {
            Some(p) => p.thresholds(&report.workload.horizons)?,
            None => Thresholds::read(thresholds_path)?,
        };
        let outcome = gate(&report, &thresholds)?;
        Ok((report, outcome))
    });
    let mut run = finish_gate(outcome.as_ref().map(|(r, o)| (r, o)), junit, summary_md);
    if let Some(line) = announce {
        run.stdout.insert_str(0, &line);
    }
    run
}

/// What a gate's outcome (or why it could not run) becomes: the lines to print, the exit code,
/// and the JUnit file and Markdown summary written atomically where asked for. For a caller that
/// has the report and the outcome in memory already (a gated `qdrift eval`) and has applied the
/// output rule to `junit` and `summary_md` itself.
pub fn finish_gate(
    outcome: Result<(&Report, &GateOutcome), &GateError>,
    junit: Option<&Path>,
    summary_md: Option<&Path>,
) -> GateRun {
    let code = outcome.map_or(2, |(_, o)| o.exit_code());
    let mut run = GateRun { exit_code: code, stdout: String::new(), stderr: String::new() };
    let (xml, summary) = match outcome {
        Ok((report, o)) => {
            run.stdout = o.lines();
            (junit_xml(o), render_verdict_markdown(report, Some(o)) + "\n")
        }
        Err(e) => {
            let message = plain(&e.to_string());
            run.stderr = error_line(&message);
            (junit_error_xml(e), format!("## Verdict\n\n**Gate: ERROR** — the gate could not run: {message}\n"))
        }
    };
    for (path, bytes, what) in [(junit, xml, "JUnit file"), (summary_md, summary, "summary")] {
        if let Some(path) = path
            && let Err(e) = write_atomic(path, bytes.as_bytes())
        {
            run.stderr.push_str(&error_line(&format!("cannot write the {what}: {e}")));
            run.exit_code = 2;
        }
    }
    run
}
