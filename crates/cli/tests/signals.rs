//! A terminating signal during `qdrift eval` (a cancelled CI job's SIGTERM, Ctrl-C's SIGINT)
//! leaves nothing beside `--out`: no lock file, no staging folder, and no `--out`; the process
//! still ends by the signal.

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::stories;

/// Starts an evaluation long enough to be running when signalled, waits until its reference
/// generates, sends `signal`, and checks how it ended and what it left in `parent`.
fn signalled_eval_leaves_nothing(signal: libc::c_int) {
    let parent = tempfile::tempdir().expect("temp dir");
    let out = parent.path().join("out");
    let model = stories().join("stories260K.bin");
    let mut command = Command::new(env!("CARGO_BIN_EXE_qdrift"));
    command
        .args(["eval", "--model", model.to_str().expect("utf-8"), "--backend", "cpu"])
        .args(["--prompts", "32", "--horizons", "1000", "--schemes", "int8"])
        .args(["--out", out.to_str().expect("utf-8")])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // A test run started in the background by a non-interactive shell (`.ci/run &`) inherits
    // SIGINT as ignored, and qdrift rightly leaves an ignored signal alone: the child gets the
    // default disposition, as a foreground run has.
    // SAFETY: runs in the forked child before exec; `signal` is async-signal-safe and touches no
    // memory of the parent.
    unsafe {
        command.pre_exec(move || {
            libc::signal(signal, libc::SIG_DFL);
            Ok(())
        });
    }
    let mut child = command.spawn().expect("qdrift runs");
    // The first progress line comes after --out is locked and staged (and the cleanup
    // registered); the rest of stderr is drained so the child never blocks on it.
    let stderr = child.stderr.take().expect("stderr");
    let (send, generating) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains(": generating ") {
                let _ = send.send(());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    if generating.recv_timeout(Duration::from_secs(120)).is_err() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("never generated: {}", reader.join().unwrap_or_default());
    }
    assert_eq!(lock_and_staging(parent.path()), (true, true), "not staged: {:?}", names(parent.path()));
    // SAFETY: kill has no memory-safety preconditions; the pid is our own child, not yet waited.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, signal) }, 0);
    let waited = Instant::now();
    let status = child.wait().expect("waits");
    let stderr = reader.join().expect("stderr read");
    assert!(waited.elapsed() < Duration::from_secs(30), "ended {:?} after the signal", waited.elapsed());
    assert!(status.signal() == Some(signal) || status.code() == Some(128 + signal), "{status:?}: {stderr}");
    assert_eq!(names(parent.path()), Vec::<String>::new(), "left beside --out after signal {signal}");
}

/// Whether the lock file and a staging folder of `out` are in `parent`.
fn lock_and_staging(parent: &Path) -> (bool, bool) {
    let names = names(parent);
    (names.iter().any(|n| n == ".out.qdrift-lock"), names.iter().any(|n| n.starts_with(".out.qdrift-new-")))
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("lists")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn sigterm_during_eval_removes_the_lock_and_the_staging_folder() {
    signalled_eval_leaves_nothing(libc::SIGTERM);
}

#[test]
fn sigint_during_eval_removes_the_lock_and_the_staging_folder() {
    signalled_eval_leaves_nothing(libc::SIGINT);
}
