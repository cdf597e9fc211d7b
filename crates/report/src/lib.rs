//! The report stage: the `report.json` contract and everything built from it.
//!
//! [`Report`] is schema version 1 of `report.json`, the one artifact `qdrift eval` produces and
//! every later stage (Markdown, HTML, JUnit, `qdrift gate`) reads. It depends on no tensor
//! library: a report can be read, rendered and gated on a machine that never ran a model.
//!
//! **Invariants: every number in a report is finite (checked by [`Report::validate`] before
//! anything is written); reports are written atomically ([`write_atomic`]: temp file in the same
//! folder, then rename), so an interrupted run never leaves a half-written file; serialization is
//! deterministic (fields in declaration order, no timestamps, no hash maps).**

mod atomic;
mod charts;
mod document;
mod error;
mod format;
mod gate;
mod html;
mod junit;
mod markdown;
mod schema;
#[doc(hidden)]
pub mod testing;

pub use atomic::write_atomic;
pub use error::ReportError;
pub use gate::{
    Bound, Check, CheckResult, GateError, GateOutcome, GateRun, Side, Thresholds, WILDCARD, exit_code, gate, run_gate,
};
pub use html::render_html;
pub use junit::{junit_error_xml, junit_xml};
pub use markdown::{render_markdown, render_summary};
pub use schema::*;
