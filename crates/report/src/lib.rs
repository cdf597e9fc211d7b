//! The report stage: the `report.json` contract and everything built from it.
//!
//! [`Report`] is schema version 2 of `report.json`, the one artifact `qdrift eval` produces and
//! every later stage (Markdown, HTML, JUnit, `qdrift gate`) reads. It depends on no tensor
//! library: a report can be read, rendered and gated on a machine that never ran a model.
//!
//! Code map, each module depending only on those listed before it:
//! - `format`: numbers, file names and escaping for each markup (a leaf).
//! - [`metrics`]: the metric registry [`METRICS`] (name, title, description, range, direction,
//!   format, JSON placement) and [`Estimate`], the value of a metric.
//! - `horizon`: [`HorizonMetrics`], a horizon's metrics held by name, with the hand-written JSON
//!   layout it has had since schema 1.
//! - `read`: the byte cap per kind of file read ([`REPORT_CAP`], [`THRESHOLDS_CAP`],
//!   [`EVAL_SET_CAP`]); the reading itself is `qdrift_io::read_capped`.
//! - `schema`: the other types of `report.json`, [`Report::read`] / [`Report::write`], and the
//!   rule for when the schema version changes; `validate`: [`Report::validate`], what makes a
//!   report one a run can produce; `json_schema`: [`report_json_schema`], the same contract as
//!   a JSON Schema (`schema/report.schema.json`), its metrics from the registry.
//! - `gate`: [`Thresholds`] (TOML) and the check, [`gate`] and [`exit_code`], with three
//!   [`Verdict`]s (inconclusive when the interval straddles a threshold); `profile`: the built-in
//!   thresholds profiles ([`PROFILES`]: `default`), each check with its reason, written as a
//!   thresholds file at a report's horizons.
//! - `document`: what a rendered report says (the verdict first, then headings, paragraphs,
//!   tables), built once and printed by [`render_markdown`] (`markdown`) and [`render_html`]
//!   (`html`), so their tables cannot drift apart (their `_gated` forms put a gate's outcome in
//!   the verdict); [`render_summary`] is the terminal's short table, ending with the same verdict
//!   in plain lines ([`render_summary_gated`] with the gate's verdict per variant).
//! - `charts`: inline SVG line and interval charts (plotters' SVG backend; series tagged
//!   `data-series`/`data-part` for tests); `figures`: the report's charts built with them (four,
//!   six for a model with experts).
//! - `junit`: [`junit_xml`] of a check's outcome; `command`: [`run_gate`] and [`run_gate_with`],
//!   the whole `qdrift gate` command (read the files, check, write the JUnit and the Markdown
//!   summary) for a thin CLI; `suggest`: [`suggest_thresholds`], a thresholds file from a
//!   known-good report.
//! - `compare`: [`Comparison`], two variants of paired reports head to head (`qdrift compare`;
//!   computed by `qdrift_eval::compare`), [`check_paired`], the `--max-worse` checks
//!   ([`MaxWorse`]), and its Markdown and HTML from one document.
//! - [`testing::sample_report`]: a realistic report for tests; [`testing::sample_moe_report`] the
//!   same run on a model with experts (with routing drift).
//!
//! **Invariants: every number in a report is finite (checked by [`Report::validate`] before
//! anything is written or drawn); every file is written atomically (`qdrift_io::write_atomic`: a
//! unique temp file in the same folder, then rename), so an interrupted run never leaves a half-written file;
//! every output is deterministic (same report → same bytes: fields in declaration order, metrics
//! in table order, no timestamps, no hash maps); every string from a report is escaped for its
//! markup; no module cycles.**
//!
//! Module floors, top first: a module imports only modules on floors below its own
//! (`cargo xtask cycles` checks it).
//!
//! | floor |
//! |---|
//! | `command.rs`, `compare.rs` |
//! | `html.rs`, `markdown.rs` |
//! | `document.rs`, `junit.rs`, `profile.rs`, `suggest.rs` |
//! | `figures.rs`, `gate.rs`, `json_schema.rs`, `testing.rs`, `validate.rs` |
//! | `schema.rs` |
//! | `horizon.rs` |
//! | `charts.rs`, `metrics.rs` |
//! | `error.rs`, `format.rs`, `read.rs` |

#![forbid(unsafe_code)]

mod charts;
mod command;
mod compare;
mod document;
mod error;
mod figures;
mod format;
mod gate;
mod horizon;
mod html;
mod json_schema;
mod junit;
mod markdown;
pub mod metrics;
mod profile;
mod read;
mod schema;
mod suggest;
#[doc(hidden)]
pub mod testing;
mod validate;

pub use command::{GateRun, error_line, finish_gate, run_gate, run_gate_with};
pub use compare::{
    COMPARISON_FORMAT, COMPARISON_VERSION, Closer, CompareCheck, ComparedHorizon, ComparedMetric, ComparedSide,
    Comparison, MaxWorse, SignTestResult, advantage, check_paired, pick_variant,
};
pub use error::ReportError;
pub use gate::{
    Bound, Check, CheckResult, GateError, GateOutcome, INCONCLUSIVE_EXIT, Side, Thresholds, Verdict, WILDCARD,
    exit_code, gate,
};
pub use horizon::HorizonMetrics;
pub use html::{render_html, render_html_gated};
pub use json_schema::{REPORT_SCHEMA_ID, report_json_schema};
pub use junit::{junit_error_xml, junit_xml};
pub use markdown::{
    render_markdown, render_markdown_gated, render_summary, render_summary_gated, render_verdict_markdown,
};
pub use metrics::{Distribution, Estimate, Group, METRICS, Metric, PerPrompt};
pub use profile::{PROFILES, Profile, ProfileCheck, ProfileError};
pub use read::{EVAL_SET_CAP, REPORT_CAP, THRESHOLDS_CAP};
pub use schema::*;
pub use suggest::{SuggestError, SuggestOptions, suggest_thresholds};
