//! A disk that fills while the report is written: the files are staged beside `--out` and
//! renamed into place together, so a write that fails leaves `--out` as it was, not a report.json
//! and report.md without report.html.
//!
//! The full disk is simulated with the file-size limit (`ulimit -f`, `RLIMIT_FSIZE`) and
//! `SIGXFSZ` ignored, so that a write past the limit fails with `EFBIG`, as one on a full disk
//! fails with `ENOSPC`: the same error path, without mounting a filesystem.

use std::path::Path;
use std::process::Command;

use crate::{USER, names, qdrift_exe, refused, stories};

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
    let mut files: Vec<(u64, String)> =
        names(&sizes).into_iter().map(|n| (std::fs::metadata(sizes.join(&n)).expect("size").len(), n)).collect();
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
    refused(USER, eval(&out, Some(kib)), &[name, "File too large"]);
    for n in ["report.json", "report.md", "report.html"] {
        assert_eq!(std::fs::read_to_string(out.join(n)).expect("kept"), format!("the previous {n}"), "{n}");
    }
    assert_eq!(names(root.path()), vec!["out", "sizes"], "no staging folder or lock left");
    assert_eq!(names(&out), vec!["report.html", "report.json", "report.md"]);
}
