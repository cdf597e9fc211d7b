//! Errors of the report stage.

use std::path::PathBuf;

/// Why a report could not be read, checked or written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A file could not be read or written (`qdrift_io`: missing, not a regular file, over its
    /// cap, or a failed atomic write).
    #[error(transparent)]
    File(#[from] qdrift_io::IoError),
    /// A report file is not valid JSON or does not have the schema's shape.
    #[error("{path}: not a qdrift report: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: serde_json::Error,
    },
    /// A report has another schema version than this build reads.
    #[error("{path}: report schema_version {found}; this qdrift reads schema_version {expected}")]
    SchemaVersion {
        /// The file.
        path: PathBuf,
        /// The version in the file.
        found: u64,
        /// The version this build reads.
        expected: u32,
    },
    /// A report holds a value outside its range (NaN, infinite, a rate outside [0, 1], …).
    #[error("invalid report: {0}")]
    Invalid(String),
    /// A report file holds a value that no run can produce ([`ReportError::Invalid`] of a file).
    #[error("{path}: invalid report: {why}")]
    InvalidFile {
        /// The file.
        path: PathBuf,
        /// What is wrong: the variant, the metric and horizon, and the problem.
        why: String,
    },
    /// A chart could not be drawn.
    #[error("chart {0}")]
    Chart(String),
}
