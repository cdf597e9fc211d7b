//! The report stage: the `report.json` contract and everything built from it.
//!
//! [`Report`] is schema version 1 of `report.json`, the one artifact `qdrift eval` produces and
//! every later stage (Markdown, HTML, JUnit, `qdrift gate`) reads. It depends on no tensor
//! library: a report can be read, rendered and gated on a machine that never ran a model.
//!
//! Code map:
//! - `schema`: the types of `report.json`, [`Report::read`] / [`Report::write`] / validation.
//! - `document`: what a rendered report says (headings, paragraphs, tables), built once and
//!   printed by [`render_markdown`] and [`render_html`], so their tables cannot drift apart;
//!   [`render_summary`] is the terminal's short table.
//! - `charts`: the HTML's inline SVG charts (plotters' SVG backend; series tagged
//!   `data-series`/`data-part` for tests).
//! - `gate`: [`Thresholds`] (TOML), [`gate`], [`exit_code`] and [`run_gate`], the whole
//!   `qdrift gate` command for a thin CLI; `junit`: [`junit_xml`].
//! - [`testing::sample_report`]: a realistic report for tests.
//!
//! **Invariants: every number in a report is finite (checked by [`Report::validate`] before
//! anything is written or drawn); every file is written atomically ([`write_atomic`]: temp file
//! in the same folder, then rename), so an interrupted run never leaves a half-written file;
//! every output is deterministic (same report → same bytes: fields in declaration order, no
//! timestamps, no hash maps); every string from a report is escaped for its markup.**

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
