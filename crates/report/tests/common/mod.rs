//! Helpers shared by the integration tests.

#![allow(dead_code)]

use std::path::PathBuf;

use qdrift_report::Estimate;

/// A fresh, empty folder for one test (named after it, so parallel tests never share one).
pub fn temp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("qdrift-report-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a temporary folder");
    dir
}

/// A mean with its interval.
pub fn mean_ci(mean: f64, lo: f64, hi: f64) -> Estimate {
    Estimate::new(mean, [lo, hi])
}
