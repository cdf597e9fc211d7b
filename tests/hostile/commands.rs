//! Command-line limits and the output folder: prompts and horizons past the trained context,
//! absurd `--resamples`, `--gate` thresholds that cannot match, a missing model, an unwritable or
//! locked `--out` — each refused before anything runs, and a concurrent second writer refused
//! while the first commits whole.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{GATED_EVAL, QUICK, USER, names, qdrift_command, refused, stories};

/// `qdrift eval` on stories260K with small defaults; `extra` adds flags (and replaces the
/// defaults of `--prompts` and `--horizons`).
pub(crate) fn eval(out: &Path, extra: &[&str]) -> Command {
    let dir = stories();
    let mut c = qdrift_command();
    c.args(["eval", "--model"]).arg(dir.join("stories260K.bin")).arg("--tokenizer").arg(dir.join("tok512.bin"));
    c.args(["--backend", "cpu", "--schemes", "int8", "--out"]).arg(out);
    for (flag, default) in [("--prompts", "2"), ("--horizons", "5")] {
        if !extra.contains(&flag) {
            c.args([flag, default]);
        }
    }
    c.args(extra);
    c
}

#[test]
fn a_megabyte_prompt_is_refused_before_tokenizing_naming_prompt_and_file() {
    let root = tempfile::tempdir().unwrap();
    let set = root.path().join("huge.jsonl");
    let prompt = "Once upon a time there was a cat. ".repeat((1 << 20) / 34);
    let lines = format!("{{\"id\":\"small\",\"prompt\":\"Hi\"}}\n{{\"id\":\"huge\",\"prompt\":\"{prompt}\"}}\n");
    std::fs::write(&set, lines).unwrap();
    let out = root.path().join("out");
    let mut c = eval(&out, &["--eval-set"]);
    c.arg(&set);
    refused(USER, c, &["prompt huge", "huge.jsonl", "bytes", "trained on 512 positions"]);
    assert_eq!(names(root.path()), vec!["huge.jsonl"], "no --out, no staging, no lock left");
}

#[test]
fn a_100_kb_prompt_id_is_quoted_short() {
    let root = tempfile::tempdir().unwrap();
    let set = root.path().join("ids.jsonl");
    let id = "i".repeat(100_000);
    std::fs::write(&set, format!("{{\"id\":\"{id}\",\"prompt\":\"Hi\"}}\n{{\"id\":\"{id}\",\"prompt\":\"Ho\"}}\n"))
        .unwrap();
    let mut c = eval(&root.path().join("out"), &["--eval-set"]);
    c.arg(&set);
    let (line, _) = refused(USER, c, &["ids.jsonl", "duplicate id", "…(100000 bytes)…"]);
    assert!(line.len() < 400, "{} bytes", line.len());
}

#[test]
fn horizons_far_beyond_the_context_are_refused_without_allow_long() {
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("out");
    refused(
        USER,
        eval(&out, &["--horizons", "10,1000000"]),
        &["--horizons 1000000", "trained context of 512", "--allow-long"],
    );
    assert!(!out.exists());
    assert_eq!(names(root.path()), Vec::<String>::new());
    // With the flag the length rule steps aside, and the memory check (which knows the host)
    // decides; horizons whose positions overflow are refused either way.
    let overflow = format!("{}", usize::MAX);
    refused(USER, eval(&out, &["--horizons", &overflow, "--allow-long"]), &["--horizons", "overflow"]);
}

#[test]
fn generate_refuses_a_million_new_tokens_without_allow_long() {
    let dir = stories();
    let mut c = qdrift_command();
    c.args(["generate", "--model"]).arg(dir.join("stories260K.bin")).arg("--tokenizer").arg(dir.join("tok512.bin"));
    c.args(["--backend", "cpu", "--prompt", "Once", "--max-new-tokens", "1000000"]);
    refused(USER, c, &["--max-new-tokens 1000000", "trained context of 512", "--allow-long"]);
}

/// A LongRoPE model (the tiny Phi-3 made one, original context 64 of 512) runs requests up to
/// its original context only: `generate` and `eval` past it are refused in one line naming
/// LongRoPE and both lengths, also with `--allow-long`, before anything runs.
#[test]
fn longrope_requests_past_the_original_context_are_refused() {
    let root = tempfile::tempdir().unwrap();
    let model = root.path().join("phi3-longrope");
    std::fs::create_dir(&model).unwrap();
    qdrift_tests::longrope_phi3(&model);
    let mut c = qdrift_command();
    c.args(["generate", "--model"]).arg(&model);
    c.args(["--backend", "cpu", "--prompt", "Hello", "--max-new-tokens", "64", "--allow-long"]);
    refused(USER, c, &["LongRoPE", "exceed the model's original context of 64 positions", "short factors"]);
    let out = root.path().join("out");
    let mut c = qdrift_command();
    c.args(["eval", "--model"]).arg(&model);
    c.args(["--backend", "cpu", "--schemes", "int8", "--prompts", "2", "--horizons", "5,64", "--out"]).arg(&out);
    refused(USER, c, &["LongRoPE", "+ 64 new tokens", "original context of 64 positions"]);
    assert!(!out.exists());
}

#[test]
fn absurd_resamples_are_refused_before_loading() {
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("out");
    refused(
        USER,
        eval(&out, &["--resamples", "1000000000000"]),
        &["--resamples 1000000000000", "between 1 and 1000000"],
    );
    assert_eq!(names(root.path()), Vec::<String>::new());
}

#[test]
fn gate_thresholds_with_an_unknown_variant_fail_before_generation() {
    let root = tempfile::tempdir().unwrap();
    let thresholds = root.path().join("gate.toml");
    std::fs::write(&thresholds, "[variant.\"int9\"]\n\"kld@5\" = { max = 0.1 }\n").unwrap();
    let out = root.path().join("out");
    let start = Instant::now();
    let mut c = eval(&out, &["--gate"]);
    c.arg(&thresholds);
    refused(GATED_EVAL, c, &["--gate", "gate.toml", "\"int9\"", "int8"]);
    assert!(start.elapsed() < Duration::from_secs(2), "took {:?}", start.elapsed());
    let mut c = eval(&out, &["--gate"]);
    std::fs::write(&thresholds, "[variant.\"int8\"]\n\"kld@50\" = { max = 0.1 }\n").unwrap();
    c.arg(&thresholds);
    refused(GATED_EVAL, c, &["--gate", "no horizon 50"]);
    // A missing thresholds file, or a model that does not load: the gate cannot run either.
    let mut c = eval(&out, &["--gate"]);
    c.arg(root.path().join("missing.toml"));
    refused(GATED_EVAL, c, &["missing.toml"]);
    assert_eq!(names(root.path()), vec!["gate.toml"]);
}

#[test]
fn an_early_failure_leaves_no_out_folder() {
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("out");
    let mut c = qdrift_command();
    c.args(["eval", "--model"]).arg(root.path().join("missing.bin")).arg("--out").arg(&out);
    refused(USER, c, &["missing.bin"]);
    assert_eq!(names(root.path()), Vec::<String>::new());
}

#[test]
fn an_unwritable_out_fails_at_once() {
    let root = tempfile::tempdir().unwrap();
    // A parent that is a file: unwritable for every user, root included.
    let file = root.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    refused(USER, eval(&file.join("out"), &[]), &["--out", "file/out"]);
    // A read-only parent, where the OS enforces it (not for root).
    use std::os::unix::fs::PermissionsExt;
    let parent = root.path().join("ro");
    std::fs::create_dir(&parent).unwrap();
    std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o555)).unwrap();
    if std::fs::write(parent.join("probe"), b"x").is_ok() {
        println!("skipped the read-only case: this user writes into read-only folders");
    } else {
        refused(USER, eval(&parent.join("out"), &[]), &["--out", "cannot write in", "ro"]);
        assert_eq!(names(&parent), Vec::<String>::new());
    }
    std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A second eval on the same `--out` is refused while the first runs; the first then replaces the
/// previous report as a whole, with its JUnit file inside `--out`, and leaves nothing beside it.
#[test]
fn a_concurrent_eval_on_the_same_out_is_refused_and_the_first_commits_whole() {
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("report.json"), b"an older report").unwrap();
    std::fs::write(out.join("report.md"), b"an older report").unwrap();
    let thresholds = root.path().join("gate.toml");
    std::fs::write(&thresholds, "[variant.\"*\"]\n\"top1_agreement@5\" = { min = 0.0 }\n").unwrap();
    let junit = out.join("gate.xml");
    // Long enough (8 prompts, 300 tokens) to still run when the second starts.
    let mut first = eval(&out, &["--prompts", "8", "--horizons", "5,300", "--gate"]);
    first.arg(&thresholds).arg("--junit").arg(&junit).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut first = first.spawn().expect("first eval starts");
    let lock = root.path().join(".out.qdrift-lock");
    let start = Instant::now();
    while !lock.exists() {
        if first.try_wait().expect("wait").is_some() {
            let done = first.wait_with_output().expect("output");
            panic!("the first eval ended early: {}", String::from_utf8_lossy(&done.stderr));
        }
        assert!(start.elapsed() < QUICK, "the first eval never took the lock");
        std::thread::sleep(Duration::from_millis(5));
    }
    refused(USER, eval(&out, &[]), &["--out", "another qdrift run (process "]);
    let done = first.wait_with_output().expect("first eval ends");
    assert!(done.status.success(), "first eval: {}", String::from_utf8_lossy(&done.stderr));
    assert_eq!(names(root.path()), vec!["gate.toml", "out"], "no staging, old folder or lock left");
    assert_eq!(names(&out), vec![".qdrift-outputs", "gate.xml", "report.html", "report.json", "report.md"]);
    let json = std::fs::read_to_string(out.join("report.json")).unwrap();
    assert!(json.contains("\"schema_version\""), "the new report replaced the old one");
}
