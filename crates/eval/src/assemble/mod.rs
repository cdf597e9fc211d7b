//! Traces into numbers: the statistics of each variant, the report they make, and two reports'
//! variants compared head to head.
//!
//! | floor | contents |
//! |---|---|
//! | `compare.rs` | [`crate::compare`]: two variants of paired reports head to head, prompt by prompt (`qdrift compare`) |
//! | `report.rs` | the report from a measurement: statistics per variant, validated |
//! | `routing_drift.rs` | routing traces → the routing metrics and each variant's routing drift |
//! | [`aggregate`] | traces → statistics (host, f64, bootstrap over prompts) |

pub mod aggregate;
pub(crate) mod compare;
pub(crate) mod report;
pub(crate) mod routing_drift;
