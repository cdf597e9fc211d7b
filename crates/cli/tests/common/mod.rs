//! Helpers shared by the CLI tests. Each test binary uses a subset of them, hence the
//! `dead_code` allowance.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The shared checkpoints, `../shared` beside the repository (override with `QDRIFT_SHARED`).
pub fn shared() -> PathBuf {
    std::env::var_os("QDRIFT_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"))
}

/// The stories260K folder in [`shared`].
pub fn stories() -> PathBuf {
    shared().join("models/stories260K")
}

/// Runs the `qdrift` binary under test.
pub fn qdrift(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_qdrift")).args(args).output().expect("qdrift runs")
}

/// The variant named `name` in a report read as JSON.
pub fn variant<'a>(report: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    report["variants"]
        .as_array()
        .expect("variants")
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no variant {name}"))
}
