//! Outputs (issue #29's output rule): an output never replaces a device, a named pipe or a folder
//! (links followed), never an input (device and inode), never another output; a missing folder or
//! a clash is refused before any work; temporary names are unique per writer and never a user's
//! file; a crashed run's lock and staging are recovered and named by its process id.
//!
//! And a disk that fills while the report is written: the files are staged beside `--out` and
//! renamed into place together, so a write that fails leaves `--out` as it was, not a report.json
//! and report.md without report.html.
//!
//! The full disk is simulated with the file-size limit (`ulimit -f`, `RLIMIT_FSIZE`) and
//! `SIGXFSZ` ignored, so that a write past the limit fails with `EFBIG`, as one on a full disk
//! fails with `ENOSPC`: the same error path, without mounting a filesystem.

use std::path::Path;
use std::process::Command;

use crate::{ENVIRONMENT, GATE, GATED_EVAL, QUICK, USER, fifo, names, qdrift_command, qdrift_exe, refused, stories};

/// `qdrift eval` on stories260K (2 prompts, 5 tokens, int8) writing to `out`, under a file-size
/// limit of `kib` KiB when given.
fn eval(out: &Path, kib: Option<u64>) -> Command {
    let dir = stories();
    let mut c = Command::new("bash");
    let limit = kib.map_or_else(String::new, |k| format!("trap '' XFSZ; ulimit -f {k}; "));
    c.arg("-c").arg(format!("{limit}exec \"$0\" \"$@\"")).arg(qdrift_exe());
    c.args(["eval", "--model"]).arg(dir.join("stories260K.bin")).arg("--tokenizer").arg(dir.join("tok512.bin"));
    c.args(["--backend", "cpu", "--schemes", "int8", "--prompts", "2", "--horizons", "5", "--out"]).arg(out);
    c
}

#[test]
fn a_disk_full_while_writing_the_report_leaves_the_previous_report_whole() {
    let root = tempfile::tempdir().expect("tempdir");
    // The sizes of this run's three files, from an unlimited run.
    let sizes = root.path().join("sizes");
    let done = eval(&sizes, None).output().expect("runs");
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    let reports = names(&sizes).into_iter().filter(|n| n.starts_with("report."));
    let mut files: Vec<(u64, String)> =
        reports.map(|n| (std::fs::metadata(sizes.join(&n)).expect("size").len(), n)).collect();
    files.sort();
    let [(_, _), (second, _), (largest, name)] = &files[..] else { panic!("three report files: {files:?}") };
    assert!(largest > second, "{files:?}");
    // A limit that lets every file but the largest be written.
    let kib = second.div_ceil(1024);
    assert!(kib * 1024 < *largest, "{files:?}: no limit between the two largest");

    let out = root.path().join("out");
    std::fs::create_dir(&out).expect("out");
    for n in ["report.json", "report.md", "report.html"] {
        std::fs::write(out.join(n), format!("the previous {n}")).expect("old report");
    }
    // A full disk (here the file-size limit) is the machine's failure: exit 4.
    let (line, _) = refused(ENVIRONMENT, eval(&out, Some(kib)), &[name, "File too large"]);
    // The error names --out as given, not the hidden staging folder the file was written in.
    assert!(line.contains(&format!("{}: cannot write", out.join(name).display())), "{line}");
    assert!(!line.contains(".qdrift-new-"), "{line}");
    for n in ["report.json", "report.md", "report.html"] {
        assert_eq!(std::fs::read_to_string(out.join(n)).expect("kept"), format!("the previous {n}"), "{n}");
    }
    assert_eq!(names(root.path()), vec!["out", "sizes"], "no staging folder or lock left");
    assert_eq!(names(&out), vec!["report.html", "report.json", "report.md"]);
}

/// `qdrift quantize` of stories260K (or `model`) to 8 bits at `out` in `format` (int8, or
/// GGUF's q8_0).
fn quantize(model: Option<&Path>, format: &str, out: &Path) -> Command {
    let dir = stories();
    let mut c = qdrift_command();
    c.arg("quantize").arg("--model");
    match model {
        Some(m) => c.arg(m),
        None => c.arg(dir.join("stories260K.bin")).arg("--tokenizer").arg(dir.join("tok512.bin")),
    };
    let scheme = if format == "gguf" { "q8_0" } else { "int8" };
    c.args(["--scheme", scheme, "--format", format, "--out"]).arg(out);
    c
}

/// A character device made inside `dir` (the null device's numbers), as root only: the test
/// never touches `/dev`. `None` when not root.
fn device_node(dir: &Path) -> Option<std::path::PathBuf> {
    let node = dir.join("null");
    let made = Command::new("mknod").arg(&node).args(["c", "1", "3"]).status().ok()?;
    made.success().then_some(node)
}

/// Whether `path` is still a FIFO, a character device or a link to one (not replaced by a
/// regular file).
fn still_special(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    let link = std::fs::symlink_metadata(path).expect("still there").file_type();
    let t = std::fs::metadata(path).expect("resolves").file_type();
    (link.is_symlink() || !link.is_file()) && (t.is_fifo() || t.is_char_device())
}

#[test]
fn a_device_a_pipe_or_a_link_to_one_given_as_an_output_is_refused_and_left_alone() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut specials = vec![fifo(root.path(), "pipe")];
    specials.extend(device_node(root.path()));
    let link = root.path().join("link");
    std::os::unix::fs::symlink(&specials[0], &link).expect("symlink");
    specials.push(link);
    let out = root.path().join("out");
    for special in &specials {
        let shown = special.display().to_string();
        let mut dump = crate::commands::eval(&out, &[]);
        dump.arg("--dump-logprobs").arg(special);
        refused(USER, dump, &["--dump-logprobs", &shown, "qdrift writes over regular files only"]);
        let mut junit = crate::commands::eval(&out, &["--gate"]);
        junit.arg(root.path().join("gate.toml")).arg("--junit").arg(special);
        std::fs::write(root.path().join("gate.toml"), "[variant.\"int8\"]\n\"kld@5\" = { max = 0.1 }\n")
            .expect("thresholds");
        refused(GATED_EVAL, junit, &["--junit", &shown, "qdrift writes over regular files only"]);
        refused(USER, quantize(None, "gguf", special), &["--out", &shown, "qdrift writes over regular files only"]);
        assert!(still_special(special), "{shown} was replaced");
    }
    assert!(!out.exists());
}

#[test]
fn an_output_that_is_an_input_is_refused_and_the_input_kept() {
    let root = tempfile::tempdir().expect("tempdir");
    // A GGUF input quantized onto itself.
    let gguf = root.path().join("m.gguf");
    let made = quantize(None, "gguf", &gguf).output().expect("runs");
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let before = std::fs::read(&gguf).expect("gguf");
    refused(USER, quantize(Some(&gguf), "gguf", &gguf), &["--out", "is the same file as --model"]);
    assert_eq!(std::fs::read(&gguf).expect("gguf"), before);
    // A Hugging Face folder's weights file as the output.
    let hf = root.path().join("hf");
    let tok = qdrift_load::Llama2cTokenizer::read(&stories().join("tok512.bin")).expect("tok512");
    let model = qdrift_tests::load_stories().model;
    qdrift_load::write::write_hf_folder(&hf, &model, &tok, qdrift_load::write::WriteDtype::F16).expect("HF folder");
    let weights = hf.join("model.safetensors");
    let before = std::fs::read(&weights).expect("weights");
    refused(USER, quantize(Some(&hf), "safetensors", &weights), &["--out", "is the same file as --model"]);
    assert_eq!(std::fs::read(&weights).expect("weights"), before);
}

#[test]
fn outputs_that_clash_or_lack_a_folder_are_refused_before_any_work() {
    let root = tempfile::tempdir().expect("tempdir");
    let d = root.path().join("D");
    let mut c = crate::commands::eval(&d, &[]);
    c.arg("--dump-logprobs").arg(&d);
    refused(USER, c, &["--out", "is also --dump-logprobs"]);
    let mut c = crate::commands::eval(&d, &[]);
    c.arg("--save-reference").arg(&d);
    refused(USER, c, &["--out", "is also --save-reference"]);
    let mut c = crate::commands::eval(&d, &[]);
    c.arg("--dump-logprobs").arg(root.path().join("missing/d.jsonl"));
    let (_, took) = refused(USER, c, &["--dump-logprobs", "missing does not exist"]);
    assert!(took < QUICK);
    // The model's own folder as a saved reference, which is replaced whole.
    let copy = root.path().join("models");
    std::fs::create_dir(&copy).expect("folder");
    std::fs::copy(stories().join("stories260K.bin"), copy.join("m.bin")).expect("copy");
    std::fs::copy(stories().join("tok512.bin"), copy.join("tokenizer.bin")).expect("copy");
    let mut c = qdrift_command();
    c.args(["eval", "--model"]).arg(copy.join("m.bin")).args(["--backend", "cpu", "--schemes", "int8"]);
    c.args(["--prompts", "2", "--horizons", "5", "--out"]).arg(&d).arg("--save-reference").arg(&copy);
    refused(USER, c, &["--save-reference", "holds --model"]);
    assert_eq!(names(root.path()), vec!["models"], "nothing written");
    assert_eq!(names(&copy), vec!["m.bin", "tokenizer.bin"]);
}

#[test]
fn a_dump_inside_out_is_written_with_the_reports() {
    let root = tempfile::tempdir().expect("tempdir");
    let out = root.path().join("out");
    let mut c = crate::commands::eval(&out, &["--prompts", "1", "--horizons", "2"]);
    c.arg("--dump-logprobs").arg(out.join("dump.jsonl"));
    let done = c.output().expect("runs");
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    assert_eq!(names(&out), vec![".qdrift-outputs", "dump.jsonl", "report.html", "report.json", "report.md"]);
    assert_eq!(names(root.path()), vec!["out"], "no temporary or staging left");
}

#[test]
fn concurrent_quantizes_to_one_file_all_succeed_and_a_users_tmp_file_is_kept() {
    let root = tempfile::tempdir().expect("tempdir");
    let out = root.path().join("same.gguf");
    let users = root.path().join("same.gguf.tmp");
    std::fs::write(&users, b"the user's own file").expect("user file");
    let children: Vec<_> = (0..6)
        .map(|_| {
            let mut c = quantize(None, "gguf", &out);
            c.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped()).spawn().expect("starts")
        })
        .collect();
    for child in children {
        let done = child.wait_with_output().expect("ends");
        assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    }
    assert_eq!(std::fs::read(&users).expect("kept"), b"the user's own file");
    assert_eq!(names(root.path()), vec!["same.gguf", "same.gguf.tmp"], "no temporary left");
    qdrift_load::open_model(&out, None).expect("the result is a whole GGUF");
}

#[test]
fn a_crashed_runs_lock_and_staging_do_not_block_the_next_run_which_names_it() {
    let root = tempfile::tempdir().expect("tempdir");
    let out = root.path().join("out");
    // What an aborted eval leaves beside --out (no destructor ran).
    std::fs::write(root.path().join(".out.qdrift-lock"), "999999\n").expect("lock");
    std::fs::create_dir(root.path().join(".out.qdrift-new-999999-0123456789abcdef")).expect("staging");
    let done = crate::commands::eval(&out, &[]).output().expect("runs");
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert!(done.status.success(), "{stderr}");
    assert!(
        stderr.contains("a previous run on") && stderr.contains("(process 999999) ended without cleaning up"),
        "{stderr}"
    );
    assert_eq!(names(root.path()), vec!["out"]);
}

#[test]
fn gate_and_merge_never_write_over_their_inputs() {
    let root = tempfile::tempdir().expect("tempdir");
    let out = root.path().join("out");
    let done = crate::commands::eval(&out, &[]).output().expect("runs");
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    let report = out.join("report.json");
    let before = std::fs::read(&report).expect("report");
    let thresholds = root.path().join("gate.toml");
    std::fs::write(&thresholds, "[variant.\"int8\"]\n\"kld@5\" = { max = 10.0 }\n").expect("thresholds");
    let mut c = qdrift_command();
    c.arg("gate").arg("--report").arg(&report).arg("--thresholds").arg(&thresholds).arg("--junit").arg(&report);
    refused(GATE, c, &["--junit", "is the same file as --report"]);
    assert_eq!(std::fs::read(&report).expect("report"), before);
    // A part's folder as merge's --out.
    let part = root.path().join("part0");
    let done = crate::commands::eval(&part, &["--shard", "0/1"]).output().expect("runs");
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    let mut c = qdrift_command();
    c.arg("merge").arg(&part).arg("--out").arg(&part);
    refused(USER, c, &["--out", "is the same folder as part"]);
}
