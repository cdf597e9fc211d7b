//! JUnit XML for CI systems: one test case per gate check.
//!
//! ```xml
//! <testsuites tests="3" failures="1" errors="0">
//!   <testsuite name="qdrift gate" tests="3" failures="1" errors="0">
//!     <testcase classname="qdrift.gate.int4-g128" name="kld@1000">
//!       <failure message="FAIL int4-g128 kld@1000 …">…</failure>
//!     </testcase>
//! ```

use std::fmt::Write as _;

// The HTML escaping is XML 1.0's too (numeric `&#39;`, and U+FFFD for every character XML 1.0
// cannot hold).
use crate::format::{escape_html as xml_escape, plain};
use crate::gate::{GateError, GateOutcome};

/// The gate's outcome as JUnit XML: suite `qdrift gate`, one `<testcase>` per check with
/// `classname="qdrift.gate.VARIANT"` and `name="METRIC@H"`, a `<failure>` for each failed check
/// and the outcome line as `<system-out>` for each passed one. Deterministic.
pub fn junit_xml(outcome: &GateOutcome) -> String {
    let tests = outcome.results.len();
    let failures = outcome.failures().count();
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(out, "<testsuites tests=\"{tests}\" failures=\"{failures}\" errors=\"0\">");
    let _ = writeln!(out, "  <testsuite name=\"qdrift gate\" tests=\"{tests}\" failures=\"{failures}\" errors=\"0\">");
    for r in &outcome.results {
        let line = xml_escape(&r.line());
        let _ = writeln!(
            out,
            "    <testcase classname=\"qdrift.gate.{}\" name=\"{}\">",
            xml_escape(&plain(&r.variant)),
            xml_escape(&r.name())
        );
        if r.passed {
            let _ = writeln!(out, "      <system-out>{line}</system-out>");
        } else {
            let _ = writeln!(out, "      <failure message=\"{line}\" type=\"threshold\">{line}</failure>");
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
