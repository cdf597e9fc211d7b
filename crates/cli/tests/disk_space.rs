//! `qdrift eval` refuses, before it builds any model, a run whose outputs would not fit the free
//! space of their filesystem (the size formulas: crates/eval/src/space.rs's tests).

mod common;

use common::{qdrift, stories};

/// `/proc` is a real filesystem with no free space on every Linux machine: a store planned there
/// is refused with the one-line message, and `--out` is neither created nor left locked.
#[cfg(target_os = "linux")]
#[test]
fn a_store_on_a_full_filesystem_is_refused_before_the_run() {
    let parent = tempfile::tempdir().expect("temp dir");
    let out = parent.path().join("out");
    let model = stories().join("stories260K.bin");
    let o = qdrift(&[
        "eval",
        "--model",
        model.to_str().expect("utf-8"),
        "--backend",
        "cpu",
        "--prompts",
        "2",
        "--horizons",
        "5",
        "--schemes",
        "int8",
        "--save-reference",
        "/proc/qdrift-store",
        "--out",
        out.to_str().expect("utf-8"),
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(4), "no space is the machine's failure: {stderr}");
    assert!(
        stderr.contains("qdrift: error: --save-reference /proc/qdrift-store: needs about ")
            && stderr.contains(" KiB, 0 bytes free on its filesystem"),
        "{stderr}"
    );
    assert!(!stderr.contains("generating"), "refused after the run started: {stderr}");
    assert_eq!(std::fs::read_dir(parent.path()).expect("lists").count(), 0, "left beside --out");
}
