//! `qdrift compare`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use qdrift_eval::{CompareInput, compare, report_name};
use qdrift_io::PathCheck;
use qdrift_report::{Comparison, MaxWorse, Report, error_line};

/// Arguments of `qdrift compare`.
#[derive(Args)]
pub struct CompareArgs {
    /// The baseline's report.json (A).
    a: PathBuf,
    /// The candidate's report.json (B): the same reference, prompts and seed as A (one run, or two
    /// runs with a saved reference); the same file as A compares two of its variants.
    b: PathBuf,
    /// A's variant (default: A's only variant that is not the noise floor).
    #[arg(long, value_name = "NAME")]
    variant_a: Option<String>,
    /// B's variant (default: B's only variant that is not the noise floor).
    #[arg(long, value_name = "NAME")]
    variant_b: Option<String>,
    /// Check that B is no worse than A by more than X on METRIC at horizon H: exit 1 when the
    /// whole 95% interval of B's worsening is above X, 3 when it straddles X (too few prompts to
    /// tell), 0 when it is at most X. Repeat for several checks.
    #[arg(long = "max-worse", value_name = "METRIC@H=X")]
    max_worse: Vec<String>,
    /// Also write compare.json, compare.md and compare.html into this folder.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

/// Runs `qdrift compare`: prints the comparison (Markdown) and the checks' verdicts; exit 0 when
/// every check passes (or none is asked for), 1 when one fails, 3 when none fails but some are
/// inconclusive, 2 with one `qdrift: error:` line on unusable input.
pub fn run(args: &CompareArgs) -> ExitCode {
    match comparison(args) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprint!("{}", error_line(&e));
            ExitCode::from(2)
        }
    }
}

/// The files `--out` gets.
const OUT_FILES: [&str; 3] = ["compare.json", "compare.md", "compare.html"];

fn comparison(args: &CompareArgs) -> Result<u8, String> {
    let checks = args.max_worse.iter().map(|c| MaxWorse::parse(c)).collect::<Result<Vec<_>, _>>()?;
    // Before the reports are read, so that a run never computes what it cannot write.
    if let Some(dir) = &args.out {
        check_out(dir, &args.a, &args.b)?;
    }
    let read = |p: &Path| Report::read(p).map_err(|e| e.to_string());
    let (ra, rb) = (read(&args.a)?, read(&args.b)?);
    let a = CompareInput { report: &ra, name: name(&args.a), variant: args.variant_a.as_deref() };
    let b = CompareInput { report: &rb, name: name(&args.b), variant: args.variant_b.as_deref() };
    let c = compare(a, b, &checks).map_err(|e| e.to_string())?;
    if let Some(dir) = &args.out {
        write_out(dir, &c)?;
    }
    print!("{}", c.markdown());
    if !c.checks.is_empty() {
        println!();
        print!("{}", c.summary());
    }
    Ok(c.exit_code())
}

/// Refuses an `--out` that compare cannot write its folder into, naming the path in the way and
/// what to do: an existing file there (or in place of a folder above it), and the output rule
/// ([`PathCheck`]: no output file is an input or other than a regular file).
fn check_out(dir: &Path, a: &Path, b: &Path) -> Result<(), String> {
    if let Some(blocker) = not_a_folder(dir) {
        return Err(format!(
            "--out {}: {} exists and is not a folder; compare writes {} into a folder: remove it or choose \
             another --out",
            dir.display(),
            blocker.display(),
            OUT_FILES.join(", ")
        ));
    }
    let mut paths = PathCheck::new().input("A", a).input("B", b).output_folder("--out", dir, false);
    for file in OUT_FILES {
        paths = paths.output_file("--out", &dir.join(file));
    }
    paths.check().map_err(|e| e.to_string())
}

/// The nearest existing path of `dir` and the folders above it, when it is not a folder (links
/// followed): what `create_dir_all` would fail on with only `File exists`.
fn not_a_folder(dir: &Path) -> Option<&Path> {
    let existing = dir.ancestors().filter(|p| !p.as_os_str().is_empty()).find(|p| std::fs::metadata(p).is_ok())?;
    (!existing.is_dir()).then_some(existing)
}

/// Writes compare.json, compare.md and compare.html into `dir` (created if missing), each
/// atomically.
fn write_out(dir: &Path, c: &Comparison) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("--out {}: cannot create the folder: {e}", dir.display()))?;
    let json = serde_json::to_string_pretty(c).map_err(|e| e.to_string())? + "\n";
    for (file, text) in OUT_FILES.into_iter().zip([json, c.markdown(), c.html()]) {
        qdrift_io::write_atomic(&dir.join(file), text.as_bytes()).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// How the comparison names a report: its folder and file name (`int8/report.json`), no other
/// folder of this machine.
fn name(path: &Path) -> String {
    let file = report_name(path);
    match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(parent) => format!("{}/{file}", report_name(parent)),
        None => file,
    }
}
