//! Reports, thresholds and eval sets that cannot be trusted or read: an impossible report
//! (negative KL), `/dev/zero` and named pipes as report, thresholds or eval set.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{GATE, USER, fifo, qdrift_command, refused, stories};

fn committed_report() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../reports/stories260K/report.json")
}

/// A thresholds file that checks the committed report, in `dir`.
fn thresholds(dir: &Path) -> PathBuf {
    let path = dir.join("thresholds.toml");
    std::fs::write(&path, "[variant.\"int8\"]\n\"kld@100\" = { max = 0.5 }\n").expect("writes");
    path
}

/// `qdrift gate --report REPORT --thresholds THRESHOLDS`.
fn gate(report: &Path, thresholds: &Path) -> Command {
    let mut c = qdrift_command();
    c.arg("gate").arg("--report").arg(report).arg("--thresholds").arg(thresholds);
    c
}

#[test]
fn the_committed_report_passes_the_gate() {
    let dir = tempfile::tempdir().unwrap();
    let out = gate(&committed_report(), &thresholds(dir.path())).output().expect("qdrift runs");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn an_impossible_report_exits_2_naming_the_file_variant_metric_and_horizon() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(committed_report()).unwrap();
    let mut report: serde_json::Value = serde_json::from_str(&text).unwrap();
    // A negative KL divergence, with an interval around it: no run writes that.
    report["variants"][1]["horizons"][1]["kld"]["mean"] = serde_json::json!(-0.25);
    report["variants"][1]["horizons"][1]["kld"]["ci95"] = serde_json::json!([-0.5, 0.0]);
    let path = dir.path().join("report.json");
    std::fs::write(&path, serde_json::to_string(&report).unwrap()).unwrap();
    let needles = [path.to_str().unwrap(), "variant int8", "kld = -0.25, not ≥ 0", "at horizon 100"];
    refused(GATE, gate(&path, &thresholds(dir.path())), &needles);
}

#[test]
fn dev_zero_as_report_or_thresholds_exits_2_without_reading_it() {
    let dir = tempfile::tempdir().unwrap();
    let zero = Path::new("/dev/zero");
    let needles = ["/dev/zero", "the report is a character device, not a regular file"];
    refused(GATE, gate(zero, &thresholds(dir.path())), &needles);
    let needles = ["/dev/zero", "the thresholds file is a character device, not a regular file"];
    refused(GATE, gate(&committed_report(), zero), &needles);
}

#[test]
fn a_named_pipe_as_report_or_thresholds_exits_2_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let pipe = fifo(dir.path(), "pipe");
    let needles = ["pipe", "the report is a named pipe (FIFO), not a regular file"];
    refused(GATE, gate(&pipe, &thresholds(dir.path())), &needles);
    let needles = ["pipe", "the thresholds file is a named pipe (FIFO), not a regular file"];
    refused(GATE, gate(&committed_report(), &pipe), &needles);
}

/// `qdrift eval` on stories260K with the eval set `set`, writing to `out`.
fn eval(out: &Path, set: &Path) -> Command {
    let dir = stories();
    let mut c = qdrift_command();
    c.args(["eval", "--model"]).arg(dir.join("stories260K.bin")).arg("--tokenizer").arg(dir.join("tok512.bin"));
    c.args(["--backend", "cpu", "--schemes", "int8", "--prompts", "2", "--horizons", "5", "--out"]).arg(out);
    c.arg("--eval-set").arg(set);
    c
}

#[test]
fn an_endless_or_blocking_eval_set_exits_1_and_creates_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let needles = ["/dev/zero", "the eval set is a character device, not a regular file"];
    refused(USER, eval(&out, Path::new("/dev/zero")), &needles);
    assert!(!out.exists(), "--out created");
    let pipe = fifo(dir.path(), "set.jsonl");
    let needles = ["set.jsonl", "the eval set is a named pipe (FIFO), not a regular file"];
    refused(USER, eval(&out, &pipe), &needles);
    assert!(!out.exists(), "--out created");
}
