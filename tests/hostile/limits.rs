//! Limits on what one input may cost (issue #29, sections 4 and 5): a model file's chat template
//! runs on a fuel budget and a cap on what it renders, `bandwidth --mib` is capped by the
//! machine's available memory, long user strings are quoted short, and `--schemes ''` means no
//! built-in scheme (the README's external-variants-only run), refused only with no `--variant`.

use std::path::{Path, PathBuf};
use std::process::Command;

use qdrift_load::write::{WriteDtype, llama2c_tokenizer_keys, write_gguf, write_gguf_with};
use qdrift_load::{GgufValue, HostModel, byte_tokenizer, synthetic_model};
use serde_json::Value;

use crate::{QUICK, USER, qdrift_command, refused};

fn tiny() -> HostModel {
    synthetic_model("tiny", 3).expect("tiny").model
}

/// `tiny` as `m.gguf` in `dir`, its `tokenizer.chat_template` set to `template`.
fn gguf_with_template(dir: &Path, template: &str) -> PathBuf {
    let path = dir.join("m.gguf");
    let mut keys = llama2c_tokenizer_keys(&path, &byte_tokenizer(320).expect("tok")).expect("keys");
    keys.push(("tokenizer.chat_template".into(), GgufValue::String(template.into())));
    write_gguf_with(&path, &tiny(), &keys, WriteDtype::F32, &|_| None).expect("written");
    path
}

/// `qdrift eval` of `model` on the CPU with the built-in `chat` set, writing to `out`.
fn eval_chat(model: &Path, out: &Path) -> Command {
    let mut c = qdrift_command();
    c.args(["eval", "--model"]).arg(model).args(["--backend", "cpu", "--schemes", "int8", "--eval-set", "chat"]);
    c.args(["--prompts", "2", "--horizons", "5", "--out"]).arg(out);
    c
}

#[test]
fn a_chat_template_of_nested_loops_runs_out_of_fuel_fast_in_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let template = r#"{% for i in range(9000) %}{% for j in range(9000) %}{{ "x"*32 }}{% endfor %}{% endfor %}"#;
    let model = gguf_with_template(dir.path(), template);
    let out = dir.path().join("out");
    let (line, took) = refused(
        USER,
        eval_chat(&model, &out),
        &[&model.display().to_string(), "chat template", "instructions", "fuel"],
    );
    assert!(took < QUICK, "{line}");
    assert!(!out.exists(), "no report folder for a refused run");
}

#[test]
fn a_chat_template_rendering_past_a_mebibyte_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let model = gguf_with_template(dir.path(), r#"{% for i in range(8) %}{{ "x" * 200000 }}{% endfor %}"#);
    let out = dir.path().join("out");
    refused(USER, eval_chat(&model, &out), &[&model.display().to_string(), "renders more than 1048576 bytes"]);
}

#[test]
fn bandwidth_past_the_available_memory_is_refused_before_allocating() {
    let mut c = qdrift_command();
    c.args(["bandwidth", "--backend", "cpu", "--mib", "1048576", "--reps", "1"]);
    refused(USER, c, &["--mib 1048576", "available memory", "MemAvailable"]);
}

#[test]
fn a_100_kb_recipe_is_quoted_short_once() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.gguf");
    write_gguf(&model, &tiny(), &byte_tokenizer(320).expect("tok"), WriteDtype::F32).expect("written");
    let recipe = format!("int8+a-{}", "y".repeat(100_000));
    let mut c = qdrift_command();
    c.args(["quantize", "--model"]).arg(&model).args(["--scheme", &recipe, "--out"]).arg(dir.path().join("q.gguf"));
    let out = c.output().expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.len() < 8000, "{} bytes of stderr: {}", stderr.len(), &stderr[..400]);
    assert!(stderr.contains("…(100007 bytes)…"), "{stderr}");
    // Through `eval --schemes` alike, the list's entry and the list quoted short.
    let mut c = qdrift_command();
    c.args(["eval", "--model"]).arg(&model).args(["--schemes", &format!("int8,{recipe}"), "--out"]);
    c.arg(dir.path().join("out"));
    let out = c.output().expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.len() < 8000, "{} bytes of stderr", stderr.len());
    assert!(stderr.contains("…(100012 bytes)…") && stderr.contains("…(100007 bytes)…"), "{stderr}");
}

#[test]
fn schemes_empty_runs_the_variants_only_and_is_refused_without_any() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.gguf");
    write_gguf(&model, &tiny(), &byte_tokenizer(320).expect("tok"), WriteDtype::F32).expect("written");
    let out = dir.path().join("out");
    let eval = |extra: &[&str]| {
        let mut c = qdrift_command();
        c.args(["eval", "--model"]).arg(&model).args(["--backend", "cpu", "--schemes", ""]).args(extra);
        c.args(["--prompts", "2", "--horizons", "5", "--out"]).arg(&out);
        c
    };
    refused(USER, eval(&[]), &["--schemes", "--variant", "nothing to compare"]);
    assert!(!out.exists());
    let variant = model.display().to_string();
    let run = eval(&["--variant", &variant]).output().expect("runs");
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let report = std::fs::read_to_string(out.join("report.json")).expect("report");
    let v: Value = serde_json::from_str(&report).expect("JSON");
    // The noise floor and the --variant checkpoint; no built-in scheme.
    let variants = v["variants"].as_array().expect("variants");
    let schemes: Vec<&Value> = variants.iter().filter(|v| !v["scheme"].is_null()).collect();
    assert!(schemes.is_empty(), "no built-in scheme runs: {schemes:?}");
    assert_eq!(variants.iter().filter(|v| v["kind"] == "checkpoint").count(), 1, "the --variant runs: {variants:?}");
}
