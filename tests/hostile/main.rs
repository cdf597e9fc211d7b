//! The hostile-input suite (issue #13): one or more cases for every class of input that once
//! got through, each run as a user would run it — the `qdrift` binary on a command line — and
//! each asserting, through [`refused`], the exit code, exactly one stderr line that names the
//! file or flag and the problem, nothing on stdout, a bounded time ([`QUICK`], the process is
//! killed past it) and a bounded peak memory ([`MEMORY`], sampled while it runs), and, where the
//! case writes, no partial output.
//!
//! | class | module |
//! |---|---|
//! | panics and aborts: overflowing sizes from a file or a flag, absurd `--resamples` | `models`, `commands` |
//! | non-finite weights | `models` |
//! | GGUF spec violations | `crates/load/tests/hostile_files.rs` (library level, every rule) |
//! | endless or special files (`/dev/zero`, named pipes) as model, eval set, report, thresholds | `models`, `reports` |
//! | quadratic time: megabyte prompts, horizons past the context | `tokenizers`, `commands` |
//! | the gate trusting impossible reports | `reports`; every rule in `crates/report/tests/impossible.rs` |
//! | concurrent runs and partial output: lock, staging, unwritable `--out`, a full disk | `commands`, `output` |
//! | edited parts and saved references (sealed JSON, counts, indices, values), `--shard` counts without a batch, special files as members | `metadata` |
//! | compressed-tensors: `re:` patterns in linear time, integer codes and zero points in range | `compressed` |
//! | bounded cost: chat templates (fuel, rendered size), `bandwidth --mib`, long strings quoted short, `--schemes ''` | `limits` |
//!
//! Needs the `qdrift` binary beside this test's executable (`target/release/qdrift`), which
//! `cargo test --workspace` builds, and stories260K from `../shared` (override with
//! `QDRIFT_SHARED`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod commands;
mod compressed;
mod limits;
mod metadata;
mod models;
mod output;
mod reports;
mod tokenizers;

/// Every refusal of hostile input must come this fast (issue #13's bound; most take milliseconds).
pub const QUICK: Duration = Duration::from_secs(20);

/// Peak resident memory a refusal may reach: the whole binary with Burn's CPU backend loaded
/// stays far below it, and `/dev/zero` read into memory passed 3 GB in seconds.
pub const MEMORY: u64 = 512 << 20;

/// How a command refuses input: its exit code and the start of its one error line.
#[derive(Clone, Copy)]
pub struct Refusal {
    code: i32,
    prefix: &'static str,
}

/// `qdrift` commands other than `gate`: exit 1, `qdrift: error: …`.
pub const USER: Refusal = Refusal { code: 1, prefix: "qdrift: error: " };

/// `qdrift eval --gate` that cannot run its gate (unusable thresholds, any error): exit 2,
/// `qdrift: error: …`, so that exit 1 always means a failed check.
pub const GATED_EVAL: Refusal = Refusal { code: 2, prefix: "qdrift: error: " };

/// `qdrift gate` on unusable input: exit 2, `qdrift: error: …` (one prefix for every command).
pub const GATE: Refusal = Refusal { code: 2, prefix: "qdrift: error: " };

/// The `qdrift` binary built beside this test (`target/<profile>/qdrift`).
pub fn qdrift_exe() -> PathBuf {
    let exe = std::env::current_exe().expect("the test knows its path");
    // target/<profile>/deps/hostile-HASH → target/<profile>/qdrift
    let bin = exe.parent().and_then(Path::parent).map(|d| d.join("qdrift")).expect("target folder");
    assert!(bin.exists(), "{} is missing: `cargo test --workspace` builds it", bin.display());
    bin
}

/// The `qdrift` binary as a command to configure.
pub fn qdrift_command() -> Command {
    Command::new(qdrift_exe())
}

/// The stories260K folder in `../shared`.
pub fn stories() -> PathBuf {
    qdrift_tests::stories_dir()
}

/// The names in `dir`, sorted (hidden staging and lock files included).
pub fn names(dir: &Path) -> Vec<String> {
    let mut n: Vec<String> = std::fs::read_dir(dir)
        .expect("folder reads")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    n.sort();
    n
}

/// A named pipe at `dir/NAME` that no one ever writes: reading it would block forever.
pub fn fifo(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    let status = Command::new("mkfifo").arg(&path).status().expect("mkfifo runs");
    assert!(status.success(), "mkfifo {}", path.display());
    path
}

/// Peak resident set of a running process (`VmHWM`, bytes), if it is still there.
fn peak_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 =
        status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib * 1024)
}

/// Runs `c` with no stdin, killed past [`QUICK`] (so a blocking read fails the test rather than
/// hanging it) or past [`MEMORY`] (sampled every 2 ms), and asserts how it refused: `how`'s exit
/// code, nothing on stdout, and exactly one stderr line starting with `how`'s prefix and
/// containing every one of `needles`. Returns that line and how long it took.
pub fn refused(how: Refusal, mut c: Command, needles: &[&str]) -> (String, Duration) {
    let start = Instant::now();
    let mut child = c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("runs");
    let mut peak = 0;
    while child.try_wait().expect("waits").is_none() {
        peak = peak.max(peak_rss(child.id()).unwrap_or(0));
        if start.elapsed() > QUICK || peak > MEMORY {
            child.kill().expect("kill");
            panic!("killed after {:?} at {} MiB: past the time or memory bound", start.elapsed(), peak >> 20);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let took = start.elapsed();
    let out = child.wait_with_output().expect("output");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(how.code), "stderr: {stderr}");
    assert!(out.stdout.is_empty(), "no partial output: {}", String::from_utf8_lossy(&out.stdout));
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with(how.prefix)).collect();
    assert_eq!(errors.len(), 1, "one error line expected: {stderr}");
    for n in needles {
        assert!(errors[0].contains(n), "{n:?} missing from: {}", errors[0]);
    }
    (errors[0].to_string(), took)
}
