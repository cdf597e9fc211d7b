//! The README's commands run as written. Every ```` ```sh ```` block of `README.md` runs, in the
//! README's order, as one `bash -euo pipefail` script in one scratch folder, with the `qdrift`
//! under test first on `PATH`, `./my-model` the tiny Qwen3 folder of
//! `../shared/models/tiny-arch/qwen3` and `./my-model-Q4_K_M.gguf` a GGUF made from it. Synopses
//! and commands that need a checkout or the network are in ```` ```text ```` blocks, which do not
//! run; the one exception is `pip install qdrift`, which `cargo xtask ci` runs against the wheel
//! it built (`xtask::wheel_check`), and which this test skips by name.

use std::path::Path;
use std::process::Command;

mod common;
use common::{qdrift, shared};

/// The lines of every ```` ```sh ```` block, in order, one entry per block.
fn sh_blocks(readme: &str) -> Vec<String> {
    readme
        .split("\n```sh\n")
        .skip(1)
        .map(|rest| rest.split("\n```").next().expect("a closed block").to_string())
        .collect()
}

#[test]
fn every_sh_block_of_the_readme_runs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let blocks = sh_blocks(&readme);
    assert!(blocks.len() >= 5, "the README's quick start, gate and scaling-out commands: {blocks:?}");

    let work = tempfile::tempdir().expect("tempdir");
    let dir = work.path();
    let bin = dir.join(".bin");
    std::fs::create_dir(&bin).expect("bin folder");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_qdrift"), bin.join("qdrift")).expect("link qdrift");
    std::os::unix::fs::symlink(shared().join("models/tiny-arch/qwen3"), dir.join("my-model")).expect("link model");
    // "A GGUF you were given": made here, as the README's reader would have downloaded it.
    let given = dir.join("my-model-Q4_K_M.gguf");
    let o = qdrift(&[
        "quantize",
        "--model",
        dir.join("my-model").to_str().expect("utf-8"),
        "--scheme",
        "q4_0",
        "--format",
        "gguf",
        "--out",
        given.to_str().expect("utf-8"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let mut skipped = Vec::new();
    for block in &blocks {
        let script: Vec<&str> = block
            .lines()
            .filter(|line| {
                let pip = line.trim_start().starts_with("pip install");
                if pip {
                    skipped.push(line.trim().to_string());
                }
                !pip
            })
            .collect();
        let o = Command::new("bash")
            .args(["-euo", "pipefail", "-c", &script.join("\n")])
            .current_dir(dir)
            .env("PATH", &path)
            .output()
            .expect("bash runs");
        assert!(
            o.status.success(),
            "README block failed ({}):\n{block}\nstdout:\n{}\nstderr:\n{}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    assert_eq!(skipped, ["pip install qdrift"], "only the wheel's install is left to `cargo xtask ci`");

    // What the commands promise, checked on what they wrote.
    let report = |out: &str| -> serde_json::Value {
        let text = std::fs::read_to_string(dir.join(out).join("report.json"))
            .unwrap_or_else(|e| panic!("{out}/report.json: {e}"));
        serde_json::from_str(&text).expect("JSON")
    };
    let names = |r: &serde_json::Value| -> Vec<String> {
        r["variants"]
            .as_array()
            .expect("variants")
            .iter()
            .map(|v| v["name"].as_str().expect("name").to_string())
            .collect()
    };
    assert_eq!(names(&report("drift")), ["noise-floor-f32", "int8", "w8a8-fp8", "int4-g128"]);
    assert_eq!(names(&report("drift-files")), ["noise-floor-f32", "mine", "given"]);
    assert_eq!(names(&report("drift-given-saved")), ["noise-floor-f32", "given"]);
    // The run on the saved reference took its settings from the store.
    assert_eq!(report("drift-given-saved")["workload"]["batch_size"], 8);
    // The two shards merge into the report of one run over all the prompts.
    assert_eq!(report("merged")["workload"]["prompts"], 16);
    assert!(
        dir.join("thresholds.toml").is_file() && dir.join("gate.xml").is_file() && dir.join("summary.md").is_file()
    );
}
