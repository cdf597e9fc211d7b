//! `qdrift-fuzz`: runs the structure-aware fuzzer of `qdrift_tests::fuzz` (see its docs).
//!
//! ```text
//! qdrift-fuzz [--seconds N] [--target NAME] [--seed S] [--hang-millis MS] [--crashes DIR] [--jobs J]
//! qdrift-fuzz list
//! qdrift-fuzz replay TARGET FILE...
//! ```
//! Each target runs N seconds (default 60) in a worker process, J targets at a time (default: one
//! per core); a summary line per target, in target order once all have run, gives executions,
//! executions per second and crashes. The exit status is 1 when anything crashed.
//! `replay` runs saved inputs with the default panic output, to see a crash whole.
//! `worker ...` is the supervisor's internal mode.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use qdrift_tests::fuzz::{self, crashes, runner};

/// Live heap bytes above which an allocation fails: a reader that sizes a buffer from a hostile
/// header must refuse it, not ask for it. The failed allocation aborts the worker (Rust's
/// allocation error handler) and the supervisor saves the input as an `oom` crash.
const MEMORY_GUARD: usize = 1 << 30;

/// The system allocator, counting live bytes to enforce [`MEMORY_GUARD`].
struct Guarded;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to `System` with the same layout; the counter only decides
// whether to forward an allocation at all (returning null is the allocation-failure contract).
unsafe impl GlobalAlloc for Guarded {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size() > MEMORY_GUARD {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            over_guard();
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let grow = new_size.saturating_sub(layout.size());
        if LIVE.load(Ordering::Relaxed) + grow > MEMORY_GUARD {
            over_guard();
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded with the caller's pointer and layout.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            LIVE.fetch_add(new_size, Ordering::Relaxed);
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        new
    }
}

/// Says why the allocation is about to fail, without allocating.
fn over_guard() {
    use std::io::Write;
    let _ = std::io::stderr().write_all(b"memory guard: live heap would pass 1 GiB\n");
}

#[global_allocator]
static ALLOCATOR: Guarded = Guarded;

/// Command-line options (both modes).
struct Options {
    seconds: u64,
    millis: Option<u64>,
    target: Option<String>,
    seed: u64,
    hang_millis: u64,
    crashes: PathBuf,
    work: Option<PathBuf>,
    jobs: usize,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        seconds: 60,
        millis: None,
        target: None,
        seed: 1,
        hang_millis: 3000,
        crashes: crashes::default_dir(),
        work: None,
        jobs: std::thread::available_parallelism().map_or(1, usize::from),
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().cloned().ok_or_else(|| format!("{flag} needs a value"));
        let number = |v: String| v.parse::<u64>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--seconds" => o.seconds = number(value()?)?,
            "--millis" => o.millis = Some(number(value()?)?),
            "--seed" => o.seed = number(value()?)?,
            "--hang-millis" => o.hang_millis = number(value()?)?,
            "--target" => o.target = Some(value()?),
            "--crashes" => o.crashes = PathBuf::from(value()?),
            "--work" => o.work = Some(PathBuf::from(value()?)),
            "--jobs" => o.jobs = usize::try_from(number(value()?)?).map_err(|e| e.to_string())?.max(1),
            other => return Err(format!("unknown option {other}")),
        }
    }
    if let Some(t) = o.target.as_deref().filter(|t| fuzz::target(t).is_none()) {
        return Err(format!("unknown target {t}; targets: {}", names()));
    }
    Ok(o)
}

fn names() -> String {
    fuzz::targets().iter().map(|t| t.name()).collect::<Vec<_>>().join(", ")
}

fn worker(o: &Options) -> Result<bool, String> {
    let target = o.target.as_deref().and_then(fuzz::target).ok_or("worker needs --target")?;
    let config = runner::WorkerConfig {
        seed: o.seed,
        duration: Duration::from_millis(o.millis.unwrap_or(o.seconds * 1000)),
        hang: Duration::from_millis(o.hang_millis),
        crash_dir: o.crashes.clone(),
        work: o.work.clone().ok_or("worker needs --work")?,
    };
    runner::work(target, &config).map(|_| true)
}

/// Runs every selected target under a supervisor, `o.jobs` at a time; true when nothing crashed.
fn supervise(o: &Options) -> Result<bool, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let start = Instant::now();
    let selected: Vec<&'static dyn fuzz::Target> =
        fuzz::targets().iter().copied().filter(|t| o.target.as_deref().is_none_or(|n| n == t.name())).collect();
    // Each slot is filled by whichever thread takes its target: its stats and seconds.
    type Done = Result<(runner::Stats, f64), String>;
    let done: Vec<std::sync::Mutex<Option<Done>>> = selected.iter().map(|_| std::sync::Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..o.jobs.min(selected.len()) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&target) = selected.get(i) else { break };
                    let t0 = Instant::now();
                    let seed = o.seed ^ crashes::fnv1a(target.name().as_bytes());
                    let duration = Duration::from_secs(o.seconds);
                    let hang = Duration::from_millis(o.hang_millis);
                    let result = runner::supervise(&exe, target, seed, duration, hang, &o.crashes)
                        .map(|stats| (stats, t0.elapsed().as_secs_f64()));
                    *done[i].lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(result);
                }
            });
        }
    });
    let mut clean = true;
    for (target, slot) in selected.iter().zip(done) {
        let result = slot.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (stats, secs) = result.unwrap_or_else(|| Err("its supervisor did not finish".to_string()))?;
        println!(
            "fuzz {:<13} {:>9} execs {:>8.0} execs/s {:>6} crashes {:>3} new inputs saved",
            target.name(),
            stats.execs,
            stats.execs as f64 / secs,
            stats.crashes,
            stats.saved.len()
        );
        for saved in &stats.saved {
            println!("    {}", saved.display());
        }
        clean &= stats.crashes == 0;
    }
    println!(
        "fuzz: {:.0} s ({} at a time), crashes under {}",
        start.elapsed().as_secs_f64(),
        o.jobs,
        o.crashes.display()
    );
    Ok(clean)
}

/// Runs each file through the target's reader and prints what it did.
fn replay(args: &[String]) -> Result<bool, String> {
    let (name, files) = args.split_first().ok_or("replay needs a target and files")?;
    let target = fuzz::target(name).ok_or_else(|| format!("unknown target {name}; targets: {}", names()))?;
    let work = std::env::temp_dir().join(format!("qdrift-fuzz-replay-{}", std::process::id()));
    let workspace = fuzz::Workspace::new(target, &work)?;
    let mut clean = true;
    for file in files {
        let bytes = std::fs::read(file).map_err(|e| format!("{file}: {e}"))?;
        let outcome = workspace.exec(target, &bytes);
        println!("{file}: {outcome:?}");
        clean &= outcome.is_ok();
    }
    let _ = std::fs::remove_dir_all(&work);
    Ok(clean)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("list") => {
            println!("{}", names());
            Ok(true)
        }
        Some("replay") => replay(&args[1..]),
        Some("worker") => parse(&args[1..]).and_then(|o| worker(&o)),
        _ => parse(&args).and_then(|o| supervise(&o)),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("qdrift-fuzz: error: {e}");
            ExitCode::from(2)
        }
    }
}
