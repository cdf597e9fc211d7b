//! How much qdrift reads of each kind of file the report stage is handed; the reading itself is
//! `qdrift_io::read_capped` (regular files only, checked before opening, a byte cap per kind).

/// The largest `report.json` read: 256 MiB, far above any real report (a 1 000-prompt,
/// 4 096-token run with ten variants is a few MiB) yet small enough to parse in seconds.
pub const REPORT_CAP: u64 = 256 << 20;

/// The largest thresholds file read: 1 MiB, thousands of checks.
pub const THRESHOLDS_CAP: u64 = 1 << 20;

/// The largest eval set read: 64 MiB, tens of thousands of long prompts.
pub const EVAL_SET_CAP: u64 = 64 << 20;
