//! The Markdown, terminal and HTML renderings of a report.

use qdrift_report::testing::sample_report;
use qdrift_report::{render_markdown, render_summary};

#[test]
fn dump() {
    let r = sample_report();
    r.validate().unwrap();
    std::fs::write("/tmp/sample.md", render_markdown(&r)).unwrap();
    std::fs::write("/tmp/sample.txt", render_summary(&r)).unwrap();
}

#[test]
fn dump_html() {
    let r = sample_report();
    std::fs::write("/tmp/sample.html", qdrift_report::render_html(&r).unwrap()).unwrap();
}
