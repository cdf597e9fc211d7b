//! Hostile model files: a GGUF whose context overflows the KV-cache arithmetic, absurd
//! `inspect` sizes, `/dev/zero` and a named pipe as `--model`, a NaN weight.

use std::path::{Path, PathBuf};
use std::process::Command;

use qdrift_load::write::{WriteDtype, write_gguf};
use qdrift_load::{HostModel, byte_tokenizer, synthetic_model};

use crate::{USER, fifo, names, qdrift_command, refused};

fn tiny() -> HostModel {
    synthetic_model("tiny", 3).expect("tiny").model
}

/// `model` written as `m.gguf` (F32) in `dir`.
fn gguf_in(dir: &Path, model: &HostModel) -> PathBuf {
    let path = dir.join("m.gguf");
    write_gguf(&path, model, &byte_tokenizer(320).expect("tok"), WriteDtype::F32).expect("written");
    path
}

/// Offset just past the length-prefixed string `s` (a metadata key) in `bytes`.
fn after_str(bytes: &[u8], s: &str) -> usize {
    let mut key = (s.len() as u64).to_le_bytes().to_vec();
    key.extend(s.as_bytes());
    bytes.windows(key.len()).position(|w| w == key).unwrap_or_else(|| panic!("{s} not in file")) + key.len()
}

/// A GGUF of `tiny` in `dir` whose `llama.context_length` is the u64 `context` (the writer
/// stores a u32: the value is widened in place and `general.name` gives back the 4 bytes).
fn gguf_with_context(dir: &Path, context: u64) -> PathBuf {
    let mut m = tiny();
    m.arch.architecture = "name-9999".into();
    let path = gguf_in(dir, &m);
    let bytes = std::fs::read(&path).expect("read");
    let name = after_str(&bytes, "general.name") + 4;
    let ctx = after_str(&bytes, "llama.context_length");
    let mut out = bytes[..name].to_vec();
    out.extend(5u64.to_le_bytes());
    out.extend(b"name-");
    out.extend(&bytes[name + 8 + 9..ctx]);
    out.extend(10u32.to_le_bytes());
    out.extend(context.to_le_bytes());
    out.extend(&bytes[ctx + 8..]);
    std::fs::write(&path, out).expect("write");
    path
}

/// `qdrift eval` of `model` on the CPU with small settings, writing to `out`.
fn eval(model: &Path, out: &Path) -> Command {
    let mut c = qdrift_command();
    c.args(["eval", "--model"]).arg(model).args(["--backend", "cpu", "--schemes", "int8"]);
    c.args(["--prompts", "2", "--horizons", "5", "--out"]).arg(out);
    c
}

#[test]
fn inspect_of_a_gguf_with_a_context_of_2_pow_62_is_an_overflow_error() {
    let dir = tempfile::tempdir().unwrap();
    let model = gguf_with_context(dir.path(), 1 << 62);
    let mut c = qdrift_command();
    c.args(["inspect", "--model"]).arg(&model);
    refused(
        USER,
        c,
        &[
            "m.gguf",
            "KV-cache bytes does not fit in 64 bits",
            "seq_len 4611686018427387904 (the model's context length)",
            "--seq-len",
        ],
    );
}

#[test]
fn inspect_with_a_huge_seq_len_and_batch_is_an_overflow_error_naming_the_flags() {
    let dir = tempfile::tempdir().unwrap();
    let model = gguf_in(dir.path(), &tiny());
    let mut c = qdrift_command();
    c.args(["inspect", "--model"]).arg(&model).args(["--seq-len", "4611686018427387904", "--batch", "1000000"]);
    refused(
        USER,
        c,
        &["m.gguf", "KV-cache bytes does not fit in 64 bits", "batch 1000000", "lower --seq-len or --batch"],
    );
}

#[test]
fn eval_of_dev_zero_is_refused_at_once() {
    let root = tempfile::tempdir().unwrap();
    let (line, took) = refused(
        USER,
        eval(Path::new("/dev/zero"), &root.path().join("out")),
        &["/dev/zero: the model is a character device, not a regular file"],
    );
    eprintln!("{line} ({took:?})");
    assert!(names(root.path()).is_empty(), "no --out left");
}

#[test]
fn eval_of_a_named_pipe_is_refused_without_opening_it() {
    let root = tempfile::tempdir().unwrap();
    let fifo = fifo(root.path(), "m.gguf");
    let (line, took) =
        refused(USER, eval(&fifo, &root.path().join("out")), &["m.gguf: the model is a named pipe (FIFO)"]);
    eprintln!("{line} ({took:?})");
    assert_eq!(names(root.path()), vec!["m.gguf"], "no --out left");
}

#[test]
fn eval_of_a_gguf_with_a_nan_weight_names_the_tensor() {
    let root = tempfile::tempdir().unwrap();
    let mut m = tiny();
    m.layers[1].mlp_mut().expect("dense").up.data[5] = f32::NAN;
    let model = gguf_in(root.path(), &m);
    refused(
        USER,
        eval(&model, &root.path().join("out")),
        &["m.gguf: tensor blk.1.ffn_up.weight has a non-finite value (NaN) at flat index 5"],
    );
    assert_eq!(names(root.path()), vec!["m.gguf"], "no --out left");
}

/// A trained context of 2^62 sizes nothing: eval allocates from the request (prompts and
/// horizons), and the length rules saturate, so the run completes as on any tiny model.
#[test]
fn eval_of_a_gguf_with_a_context_of_2_pow_62_runs_sized_by_the_request() {
    let dir = tempfile::tempdir().unwrap();
    let model = gguf_with_context(dir.path(), 1 << 62);
    let out = dir.path().join("out");
    let start = std::time::Instant::now();
    let done = eval(&model, &out).output().expect("runs");
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    assert!(start.elapsed() < crate::QUICK, "took {:?}", start.elapsed());
    assert!(out.join("report.json").exists());
}
