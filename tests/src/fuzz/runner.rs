//! Running a target: a worker loop in-process (panics caught, a watchdog for hangs) and a
//! supervisor that restarts a worker that died and saves the input it died on.
//!
//! The worker writes each input to its work folder before the reader runs, so that the input is
//! on disk when the process aborts (the memory guard, a stack overflow) or the watchdog ends it.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::panics::install_panic_hook;
use super::{Rng, Target, Workspace, crashes};

/// Exit status of a worker whose watchdog saw an execution run past the hang limit.
pub const HANG_EXIT: i32 = 86;

/// A crash's de-duplication key: the panic location (`panicked at FILE:LINE`), or the kind of
/// death (`oom`, `hang`, `abort`) and the innermost qdrift function on the backtrace.
pub fn signature(message: &str) -> String {
    match message.strip_prefix("panicked at ").and_then(|m| m.split_once(": ")) {
        Some((location, _)) => format!("panic {location}"),
        None => {
            let kind = message.split_whitespace().next().unwrap_or("");
            let frame = message
                .lines()
                .find_map(|l| l.split_once(": ").map(|(_, f)| f.trim()).filter(|f| f.starts_with("qdrift_")));
            format!("{kind} {}", frame.unwrap_or("")).trim_end().to_string()
        }
    }
}

/// What one worker or one target's run did.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    /// Executions of the reader.
    pub execs: u64,
    /// Executions that crashed (panic, or the process died).
    pub crashes: u64,
    /// Inputs saved (one per new signature).
    pub saved: Vec<PathBuf>,
}

/// Settings of a worker.
pub struct WorkerConfig {
    /// Seed of the mutation generator.
    pub seed: u64,
    /// How long to run.
    pub duration: Duration,
    /// An execution longer than this ends the worker as a hang.
    pub hang: Duration,
    /// Where crashes are saved.
    pub crash_dir: PathBuf,
    /// The work folder (the input is written there).
    pub work: PathBuf,
}

/// Milliseconds since [`EPOCH`] at which the current execution began (0: idle).
static EXEC_STARTED_MS: AtomicU64 = AtomicU64::new(0);

/// When the worker started: the watchdog's clock.
static EPOCH: OnceLock<Instant> = OnceLock::new();

fn now_ms() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// [`Workspace::exec`] under the watchdog's eye.
fn watched(target: &dyn Target, workspace: &Workspace, input: &[u8]) -> Result<super::Outcome, String> {
    EXEC_STARTED_MS.store(now_ms(), Ordering::Relaxed);
    let result = workspace.exec(target, input);
    EXEC_STARTED_MS.store(0, Ordering::Relaxed);
    result
}

/// Ends the process with [`HANG_EXIT`] when an execution runs past `hang`.
fn start_watchdog(hang: Duration) {
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(Duration::from_millis(100));
            let started = EXEC_STARTED_MS.load(Ordering::Relaxed);
            let now = now_ms();
            if started != 0 && now.saturating_sub(started) > hang.as_millis() as u64 {
                eprintln!("hang: an execution ran past {} ms", hang.as_millis());
                std::process::exit(HANG_EXIT);
            }
        }
    });
}

/// Runs `target` on mutated seeds until `config.duration` is over; prints `input PATH` first and
/// `progress EXECS CRASHES` lines, so that a supervisor can follow a worker that dies.
///
/// # Errors
/// The work folder or a crash file cannot be written.
pub fn work(target: &dyn Target, config: &WorkerConfig) -> Result<Stats, String> {
    install_panic_hook();
    let workspace = Workspace::new(target, &config.work)?;
    println!("input {}", workspace.input.display());
    let epoch = Instant::now();
    start_watchdog(config.hang);
    let mut known = crashes::signatures(&config.crash_dir, target.name());
    let mut rng = Rng::new(config.seed);
    let mut stats = Stats::default();
    let mut last_report = Instant::now();
    while epoch.elapsed() < config.duration {
        let seed = rng.pick(&workspace.seeds);
        let input = target.mutate(&mut rng, seed, &workspace.seeds);
        let result = watched(target, &workspace, &input);
        stats.execs += 1;
        if let Err(message) = result {
            stats.crashes += 1;
            if known.insert(signature(&message)) {
                let input = minimise(target, &workspace, input, &signature(&message));
                let saved = crashes::save(&config.crash_dir, target.name(), &input, &signature(&message), &message)?;
                println!("crash {} {message}", saved.display());
                stats.saved.push(saved);
            }
        }
        if last_report.elapsed() > Duration::from_secs(1) {
            println!("progress {} {}", stats.execs, stats.crashes);
            last_report = Instant::now();
        }
    }
    println!("progress {} {}", stats.execs, stats.crashes);
    Ok(stats)
}

/// Shrinks a crashing input while it crashes with the same signature: chunks deleted, from
/// halves down to single bytes, at most 300 tries (cheap next to the run, enough for headers).
fn minimise(target: &dyn Target, workspace: &Workspace, mut input: Vec<u8>, wanted: &str) -> Vec<u8> {
    let mut tries = 0;
    let mut chunk = input.len() / 2;
    while chunk > 0 && tries < 300 {
        let mut at = 0;
        while at < input.len() && tries < 300 {
            let mut candidate = input.clone();
            candidate.drain(at..(at + chunk).min(input.len()));
            tries += 1;
            match watched(target, workspace, &candidate) {
                Err(m) if signature(&m) == wanted => input = candidate,
                _ => at += chunk,
            }
        }
        chunk /= 2;
    }
    input
}

/// A worker's process: the command that starts it, and what the supervisor learns from it.
struct Worker {
    input: Option<PathBuf>,
    last: Stats,
    stderr_tail: String,
}

/// Runs `target` for `duration` in worker processes of `exe` (`exe worker ...`), restarting a
/// worker that dies and saving the input it died on (out of memory, hang, abort).
///
/// # Errors
/// A worker cannot be started, or dies 20 times.
pub fn supervise(
    exe: &Path,
    target: &dyn Target,
    seed: u64,
    duration: Duration,
    hang: Duration,
    crash_dir: &Path,
) -> Result<Stats, String> {
    let start = Instant::now();
    let mut total = Stats::default();
    let mut known: BTreeSet<String> = crashes::signatures(crash_dir, target.name());
    let work = std::env::temp_dir().join(format!("qdrift-fuzz-{}-{}", target.name(), std::process::id()));
    for restart in 0u64..20 {
        let left = duration.saturating_sub(start.elapsed());
        if left.is_zero() {
            break;
        }
        let config = WorkerConfig {
            seed: seed ^ restart.wrapping_mul(0x9E37_79B9_7F4A_7C15),
            duration: left,
            hang,
            crash_dir: crash_dir.to_path_buf(),
            work: work.clone(),
        };
        let (worker, status) = run_worker(exe, target, &config)?;
        total.execs += worker.last.execs;
        total.crashes += worker.last.crashes;
        total.saved.extend(worker.last.saved);
        if status.success() {
            let _ = std::fs::remove_dir_all(&work);
            return Ok(total);
        }
        total.crashes += 1;
        let message = death_message(status, &worker.stderr_tail);
        let input = worker.input.as_deref().map(std::fs::read).and_then(Result::ok).unwrap_or_default();
        if known.insert(signature(&message)) {
            total.saved.push(crashes::save(crash_dir, target.name(), &input, &signature(&message), &message)?);
        }
    }
    let _ = std::fs::remove_dir_all(&work);
    if start.elapsed() < duration { Err(format!("{}: the worker died 20 times", target.name())) } else { Ok(total) }
}

/// `hang`, `oom: ...` or the exit status, with the last lines the worker wrote to stderr.
fn death_message(status: std::process::ExitStatus, stderr: &str) -> String {
    let kind = if status.code() == Some(HANG_EXIT) {
        "hang"
    } else if stderr.contains("memory allocation") || stderr.contains("memory guard") {
        "oom"
    } else if stderr.contains("overflowed its stack") {
        "stack overflow"
    } else {
        "abort"
    };
    format!("{kind} ({status})\n{}", stderr.trim())
}

fn run_worker(
    exe: &Path,
    target: &dyn Target,
    config: &WorkerConfig,
) -> Result<(Worker, std::process::ExitStatus), String> {
    let mut child = Command::new(exe)
        .args(["worker", "--target", target.name()])
        .args(["--seed", &config.seed.to_string()])
        .args(["--millis", &config.duration.as_millis().to_string()])
        .args(["--hang-millis", &config.hang.as_millis().to_string()])
        .arg("--crashes")
        .arg(&config.crash_dir)
        .arg("--work")
        .arg(&config.work)
        .env("RUST_BACKTRACE", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    let mut stderr = child.stderr.take().ok_or("no stderr")?;
    let stderr_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        death_lines(&text)
    });
    let mut worker = Worker { input: None, last: Stats::default(), stderr_tail: String::new() };
    let stdout = child.stdout.take().ok_or("no stdout")?;
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        follow(&mut worker, &line);
    }
    let status = child.wait().map_err(|e| format!("{}: {e}", exe.display()))?;
    worker.stderr_tail = stderr_reader.join().unwrap_or_default();
    Ok((worker, status))
}

/// What a dead worker said: its messages and the backtrace frames in qdrift's own crates (which
/// say which reader is at fault), at most 12 lines.
fn death_lines(stderr: &str) -> String {
    let frame = |l: &str| l.trim_start().split_once(": ").is_some_and(|(n, _)| n.parse::<u32>().is_ok());
    let keep = |l: &&str| {
        !l.trim_start().starts_with("at ")
            && (!frame(l) || l.contains("qdrift_load") || l.contains("qdrift_report") || l.contains("qdrift_eval"))
    };
    let lines: Vec<&str> = stderr.lines().filter(keep).collect();
    lines[lines.len().saturating_sub(12)..].join("\n")
}

/// Reads one line of a worker's protocol (`input`, `progress`, `crash`).
fn follow(worker: &mut Worker, line: &str) {
    if let Some(path) = line.strip_prefix("input ") {
        worker.input = Some(PathBuf::from(path));
    } else if let Some(counts) = line.strip_prefix("progress ") {
        let mut n = counts.split(' ').map(|x| x.parse().unwrap_or(0));
        worker.last.execs = n.next().unwrap_or(0);
        worker.last.crashes = n.next().unwrap_or(0);
    } else if let Some(crash) = line.strip_prefix("crash ") {
        let path = crash.split(' ').next().unwrap_or("");
        println!("  crash saved: {crash}");
        worker.last.saved.push(PathBuf::from(path));
    }
}
