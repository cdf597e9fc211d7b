//! What a run leaves behind when a terminating signal ends it: nothing it registered here.
//!
//! Staging folders, lock files and temporary files are removed by `Drop` when a run fails, but a
//! signal (Ctrl-C, a cancelled CI job's SIGTERM, a closed terminal's SIGHUP) ends the process
//! without unwinding. [`RemoveOnSignal`] registers a path in a process-wide list; the first
//! registration installs a handler for SIGINT, SIGTERM and SIGHUP (a thread reading
//! signal-hook's iterator, since removing a folder is no work for a signal handler) that
//! removes every registered path, newest first, and then ends the process with the signal's
//! default action, so the exit status is the usual one (killed by the signal; 128 + N in a
//! shell). A signal the process inherited as ignored (`nohup` ignores SIGHUP, a shell ignores
//! SIGINT for a background job) stays ignored.
//!
//! [`uninterrupted`] holds the cleanup off while a commit runs: a signal that arrives during a
//! sequence of renames waits for it to end, so the user's folder is never left half-replaced,
//! and a lock file is never removed after its holder let it go (when another run may own the
//! file at that path).
//!
//! **Invariant: only paths this process created are registered, and the handler removes nothing
//! else.**

use std::cell::Cell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, Once, PoisonError, RwLock};

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

/// The signals that end a run and leave it time to clean up.
const TERMINATING: [i32; 3] = [SIGINT, SIGTERM, SIGHUP];

/// The registered paths, by registration number (so the newest are removed first).
struct Registry {
    next: u64,
    paths: BTreeMap<u64, PathBuf>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry { next: 0, paths: BTreeMap::new() });

/// Held shared by [`uninterrupted`] sections, and exclusively by the handler from a signal on.
static SECTIONS: RwLock<()> = RwLock::new(());

static HANDLER: Once = Once::new();

thread_local! {
    /// How deep this thread is in [`uninterrupted`] sections (a nested one takes no second
    /// shared lock, which a waiting handler would block).
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

fn registry() -> MutexGuard<'static, Registry> {
    // A panic while the list was held leaves it consistent: every operation is one insert or
    // remove.
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A path removed if a terminating signal ends the process while this guard lives. Dropping it
/// only forgets the path: the owner removes it (or has renamed it into place) itself.
#[must_use = "the path is forgotten when the guard is dropped"]
#[derive(Debug)]
pub struct RemoveOnSignal {
    id: u64,
}

impl RemoveOnSignal {
    /// Registers `path` (a file or a folder this process created; relative paths are made
    /// absolute now, in case the working folder changes) and installs the handler if it is not
    /// yet.
    pub fn new(path: &Path) -> RemoveOnSignal {
        HANDLER.call_once(install_handler);
        let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        let mut r = registry();
        let id = r.next;
        r.next += 1;
        r.paths.insert(id, path);
        RemoveOnSignal { id }
    }
}

impl Drop for RemoveOnSignal {
    fn drop(&mut self) {
        registry().paths.remove(&self.id);
    }
}

/// Runs `f` with the signal cleanup held off: a terminating signal that arrives meanwhile is
/// acted on once `f` returns. For short sequences that must not be cut (renames that replace a
/// folder, removing a lock file and forgetting it).
pub fn uninterrupted<T>(f: impl FnOnce() -> T) -> T {
    struct Depth;
    impl Drop for Depth {
        fn drop(&mut self) {
            DEPTH.with(|d| d.set(d.get() - 1));
        }
    }
    let outer = DEPTH.with(|d| {
        d.set(d.get() + 1);
        d.get() == 1
    });
    let _depth = Depth;
    let _shared = outer.then(|| SECTIONS.read().unwrap_or_else(PoisonError::into_inner));
    f()
}

/// The paths registered now (for tests).
#[doc(hidden)]
pub fn registered() -> Vec<PathBuf> {
    registry().paths.values().cloned().collect()
}

/// Starts the thread that acts on the terminating signals this process does not ignore.
fn install_handler() {
    let signals: Vec<i32> = TERMINATING.into_iter().filter(|&s| !ignored(s)).collect();
    if signals.is_empty() {
        return;
    }
    // The thread is started before the signals are caught: a caught signal that no thread reads
    // would never end the process. Without the handler, a signal ends the process as it did
    // before, leaving the paths for the next run to recover.
    let (send, receive) = std::sync::mpsc::sync_channel::<signal_hook::iterator::Signals>(1);
    let started = std::thread::Builder::new().name("qdrift-signals".into()).spawn(move || {
        if let Ok(mut caught) = receive.recv()
            && let Some(signal) = caught.forever().next()
        {
            clean_up_and_end(signal);
        }
    });
    if started.is_ok()
        && let Ok(caught) = signal_hook::iterator::Signals::new(&signals)
    {
        // The thread waits on the channel, so the send cannot fail.
        let _ = send.send(caught);
    }
}

/// Removes every registered path, newest first, once no [`uninterrupted`] section runs, and
/// ends the process as `signal` would have.
fn clean_up_and_end(signal: i32) -> ! {
    let _sections = SECTIONS.write().unwrap_or_else(PoisonError::into_inner);
    // Held until the process ends: a path registered from now on could not be removed.
    let registry = registry();
    for path in registry.paths.values().rev() {
        remove(path);
    }
    let _ = signal_hook::low_level::emulate_default_handler(signal);
    // emulate_default_handler ends the process for a terminating signal; this is its fallback.
    std::process::abort()
}

/// Removes a file, or a folder and what it holds (links are removed, not followed). The owner's
/// thread may still be writing into a folder: a few tries.
fn remove(path: &Path) {
    let Ok(meta) = std::fs::symlink_metadata(path) else { return };
    if !meta.is_dir() {
        let _ = std::fs::remove_file(path);
        return;
    }
    for _ in 0..4 {
        if std::fs::remove_dir_all(path).is_ok() || !path.exists() {
            return;
        }
    }
}

/// Whether `signal`'s disposition is "ignore" (inherited from the parent process).
#[cfg(unix)]
fn ignored(signal: i32) -> bool {
    // SAFETY: a zeroed sigaction is a valid value for the kernel to overwrite; a null new action
    // only queries the current one, changing nothing.
    unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        libc::sigaction(signal, std::ptr::null(), &mut current) == 0 && current.sa_sigaction == libc::SIG_IGN
    }
}

#[cfg(not(unix))]
fn ignored(_signal: i32) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Set in the child process of [`a_terminating_signal_removes_the_registered_paths`].
    const CHILD: &str = "QDRIFT_SIGNALS_TEST_CHILD";

    #[test]
    fn a_guard_registers_its_path_until_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("staging");
        let guard = RemoveOnSignal::new(&path);
        assert!(registered().contains(&path));
        drop(guard);
        assert!(!registered().contains(&path));
    }

    #[test]
    fn nested_uninterrupted_sections_run() {
        assert_eq!(uninterrupted(|| uninterrupted(|| 7)), 7);
    }

    /// Run as a child by the test below: registers the folder and file named in the environment,
    /// writes a marker, and waits to be signalled.
    #[test]
    #[ignore = "a helper process of a_terminating_signal_removes_the_registered_paths"]
    fn signal_child() {
        let Some(dir) = std::env::var_os(CHILD).map(PathBuf::from) else { return };
        std::fs::create_dir(dir.join("staging")).unwrap();
        std::fs::write(dir.join("staging/part"), b"x").unwrap();
        std::fs::write(dir.join("lock"), b"1").unwrap();
        let _lock = RemoveOnSignal::new(&dir.join("lock"));
        let _staging = RemoveOnSignal::new(&dir.join("staging"));
        std::fs::write(dir.join("ready"), b"").unwrap();
        std::thread::sleep(std::time::Duration::from_secs(60));
    }

    #[cfg(unix)]
    #[test]
    fn a_terminating_signal_removes_the_registered_paths() {
        use std::os::unix::process::{CommandExt, ExitStatusExt};
        for signal in [SIGTERM, SIGINT, SIGHUP] {
            let dir = tempfile::tempdir().unwrap();
            let mut command = std::process::Command::new(std::env::current_exe().unwrap());
            command
                .args(["--exact", "signals::tests::signal_child", "--ignored", "--test-threads=1"])
                .env(CHILD, dir.path())
                .stdout(std::process::Stdio::null());
            // The child must not inherit an ignored disposition (a test run under `nohup` ignores
            // SIGHUP, and a guard rightly leaves an inherited "ignore" alone): reset it first.
            // SAFETY: runs in the forked child before exec; `signal` is async-signal-safe and
            // touches no memory of the parent.
            unsafe {
                command.pre_exec(move || {
                    libc::signal(signal, libc::SIG_DFL);
                    Ok(())
                });
            }
            let mut child = command.spawn().unwrap();
            let ready = dir.path().join("ready");
            let start = std::time::Instant::now();
            while !ready.exists() {
                assert!(start.elapsed().as_secs() < 30, "the child never got ready");
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            // SAFETY: kill has no memory-safety preconditions; the pid is our own live child.
            assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, signal) }, 0);
            let status = child.wait().unwrap();
            assert_eq!(status.signal(), Some(signal), "{status:?}");
            let mut left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
            left.sort();
            assert_eq!(left, ["ready"], "signal {signal}");
        }
    }
}
