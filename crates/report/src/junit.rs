//! JUnit XML for CI systems: one test case per gate check.
//!
//! ```xml
//! <testsuites tests="3" failures="1" errors="0" skipped="1">
//!   <testsuite name="qdrift gate" tests="3" failures="1" errors="0" skipped="1">
//!     <testcase classname="qdrift.gate.int4-g128" name="kld@1000">
//!       <failure message="FAIL int4-g128 kld@1000 …">…</failure>
//!     </testcase>
//!     <testcase classname="qdrift.gate.int8" name="kld@100">
//!       <skipped message="INCONCLUSIVE int8 kld@100 …"/>
//!     </testcase>
//! ```
//!
//! An inconclusive check is `<skipped>`: JUnit has no third verdict, and "could not be decided"
//! is what NUnit's and xUnit's JUnit exports map their own inconclusive result to. The gate's
//! exit code (3) still fails a CI step; the JUnit file says which checks need more prompts.

use std::fmt::Write as _;

// The HTML escaping is XML 1.0's too (numeric `&#39;`, and U+FFFD for every character XML 1.0
// cannot hold).
use crate::format::{escape_html as xml_escape, plain};
use crate::gate::{GateError, GateOutcome, Verdict};

/// The gate's outcome as JUnit XML: suite `qdrift gate`, one `<testcase>` per check with
/// `classname="qdrift.gate.VARIANT"` and `name="METRIC@H"`, a `<failure>` for each failed check,
/// a `<skipped>` for each inconclusive one and the outcome line as `<system-out>` for each passed
/// one. Deterministic.
pub fn junit_xml(outcome: &GateOutcome) -> String {
    let tests = outcome.results.len();
    let failures = outcome.failures().count();
    let skipped = outcome.inconclusive().count();
    let counts = format!("tests=\"{tests}\" failures=\"{failures}\" errors=\"0\" skipped=\"{skipped}\"");
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(out, "<testsuites {counts}>");
    let _ = writeln!(out, "  <testsuite name=\"qdrift gate\" {counts}>");
    for r in &outcome.results {
        let line = xml_escape(&r.line());
        let _ = writeln!(
            out,
            "    <testcase classname=\"qdrift.gate.{}\" name=\"{}\">",
            xml_escape(&plain(&r.variant)),
            xml_escape(&r.name())
        );
        match r.verdict {
            Verdict::Pass => {
                let _ = writeln!(out, "      <system-out>{line}</system-out>");
            }
            Verdict::Fail => {
                let _ = writeln!(out, "      <failure message=\"{line}\" type=\"threshold\">{line}</failure>");
            }
            Verdict::Inconclusive => {
                let _ = writeln!(out, "      <skipped message=\"{line}\"/>");
            }
        }
        out.push_str("    </testcase>\n");
    }
    out.push_str("  </testsuite>\n</testsuites>\n");
    out
}

/// JUnit XML for a gate that could not run: one test case `qdrift.gate` / `input` with an
/// `<error>` holding the message, so CI shows why instead of a stale or missing file.
pub fn junit_error_xml(error: &GateError) -> String {
    let message = xml_escape(&plain(&error.to_string()));
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
         <testsuites tests=\"1\" failures=\"0\" errors=\"1\">\n  \
         <testsuite name=\"qdrift gate\" tests=\"1\" failures=\"0\" errors=\"1\">\n    \
         <testcase classname=\"qdrift.gate\" name=\"input\">\n      \
         <error message=\"{message}\" type=\"unusable input\">{message}</error>\n    \
         </testcase>\n  </testsuite>\n</testsuites>\n"
    )
}
