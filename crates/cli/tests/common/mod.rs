//! Helpers shared by the CLI tests. Each test binary uses a subset of them, hence the
//! `dead_code` allowance.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// The stories260K folder in `../shared` beside the repository (override with `QDRIFT_SHARED`).
pub fn stories() -> PathBuf {
    std::env::var_os("QDRIFT_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"))
        .join("models/stories260K")
}

/// Runs the `qdrift` binary under test.
pub fn qdrift(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_qdrift")).args(args).output().expect("qdrift runs")
}

/// The `qdrift` binary under test as a command to configure.
pub fn qdrift_command() -> Command {
    Command::new(env!("CARGO_BIN_EXE_qdrift"))
}

/// Every refusal of hostile input must come this fast (issue #13's bound; most take milliseconds).
pub const QUICK: Duration = Duration::from_secs(20);

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
