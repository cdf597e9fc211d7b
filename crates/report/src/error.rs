//! Errors of the report stage.

use std::path::PathBuf;

/// Why a report could not be read, checked or written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A file handed to qdrift could not be read.
    #[error("{path}: cannot read the {what}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The kind of file (`report`, `thresholds file`, `eval set`).
        what: &'static str,
        /// The cause.
        source: std::io::Error,
    },
    /// A path handed to qdrift as a file is a folder, a FIFO, a device or a socket.
    #[error("{path}: the {what} is {kind}, not a regular file")]
    NotAFile {
        /// The path.
        path: PathBuf,
        /// The kind of file expected.
        what: &'static str,
        /// What it is instead.
        kind: &'static str,
    },
    /// A file is larger than qdrift reads for its kind.
    #[error("{path}: the {what} is larger than its limit (more than {cap} bytes)")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The kind of file.
        what: &'static str,
        /// The limit in bytes.
        cap: u64,
    },
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
