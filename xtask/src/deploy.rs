//! `cargo xtask validate-deploy`: every manifest under `deploy/` against the Kubernetes OpenAPI
//! schemas, offline once the validator is installed.
//!
//! The validator is `kubernetes-validate` from PyPI (it bundles the JSON schemas of each
//! Kubernetes release, so validating needs no cluster and no network), installed once into a
//! virtual environment under the target folder. Strict: a field the schema does not know is an
//! error. Not part of `cargo xtask ci`: the first install is slow, the validation itself quick
//! (docs/BENCHMARKS.md, 'Other costs').

use std::path::{Path, PathBuf};
use std::process::Command;

/// The validator, pinned.
const VALIDATOR: &str = "kubernetes-validate==1.37.0";
/// The Kubernetes release the manifests are checked against (Indexed Jobs are GA since 1.24).
const KUBERNETES_VERSION: &str = "1.34.0";

/// `.yaml` and `.yml` files under `dir`, recursively, sorted.
fn manifests(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut found = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| format!("{}: {e}", dir.display()))?.path();
        if path.is_dir() {
            found.extend(manifests(&path)?);
        } else if path.extension().is_some_and(|x| x == "yaml" || x == "yml") {
            found.push(path);
        }
    }
    found.sort();
    Ok(found)
}

/// `cargo xtask validate-deploy`.
pub fn validate_deploy(root: &Path, target: &Path) -> Result<(), String> {
    let files = manifests(&root.join("deploy"))?;
    if files.is_empty() {
        return Err(format!("no manifests under {}", root.join("deploy").display()));
    }
    let venv = target.join("deploy-venv");
    let validator = venv.join("bin/kubernetes-validate");
    let pinned = venv.join(format!("{VALIDATOR}.installed"));
    if !pinned.is_file() {
        println!("xtask: installing {VALIDATOR} into {}", venv.display());
        crate::common::run("python3", &["-m", "venv", &venv.to_string_lossy()])?;
        let pip = venv.join("bin/pip");
        crate::common::run(&pip.to_string_lossy(), &["install", "--quiet", "--disable-pip-version-check", VALIDATOR])?;
        std::fs::write(&pinned, "").map_err(|e| format!("{}: {e}", pinned.display()))?;
    }
    let start = std::time::Instant::now();
    let status = Command::new(&validator)
        .args(["--kubernetes-version", KUBERNETES_VERSION, "--strict"])
        .args(&files)
        .status()
        .map_err(|e| format!("cannot run {}: {e}", validator.display()))?;
    if !status.success() {
        return Err(format!(
            "manifests under deploy/ do not validate against Kubernetes {KUBERNETES_VERSION} ({status})"
        ));
    }
    println!(
        "xtask: {} manifest file(s) valid against Kubernetes {KUBERNETES_VERSION} ({:.1} s)",
        files.len(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    /// The sharded evaluation's manifest, checked for the shape the README promises (the schema
    /// check is `validate-deploy`'s; this is the structure a schema cannot see).
    const EVAL_JOB: &str = include_str!("../../deploy/kubernetes/eval-job.yaml");

    /// The documents of a multi-document YAML file, comments and blank lines dropped.
    fn documents(yaml: &str) -> Vec<Vec<&str>> {
        yaml.split("\n---")
            .map(|d| d.lines().filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty()).collect::<Vec<_>>())
            .filter(|d| !d.is_empty())
            .collect()
    }

    /// The value of the first `key: value` line (any indentation) of a document.
    fn value<'a>(doc: &[&'a str], key: &str) -> Option<&'a str> {
        doc.iter().find_map(|l| l.trim_start().strip_prefix(&format!("{key}:")).map(str::trim))
    }

    #[test]
    fn eval_job_is_an_indexed_job_whose_shards_are_merged() {
        let docs = documents(EVAL_JOB);
        let kinds: Vec<_> = docs.iter().map(|d| value(d, "kind").unwrap_or("")).collect();
        assert_eq!(kinds, ["PersistentVolumeClaim", "Job", "Job"]);
        let (volume, eval, merge) = (&docs[0], &docs[1], &docs[2]);
        assert!(volume.iter().any(|l| l.contains("ReadWriteMany")), "the parts volume must be shared by nodes");

        assert_eq!(value(eval, "completionMode"), Some("Indexed"));
        let n = value(eval, "completions").expect("completions");
        assert_eq!(value(eval, "parallelism"), Some(n), "every shard runs at once");
        let shard = format!("$(JOB_COMPLETION_INDEX)/{n}");
        let args: Vec<&str> = eval.iter().filter_map(|l| l.trim_start().strip_prefix("- ")).collect();
        let after = |flag: &str| args.iter().position(|a| *a == flag).and_then(|i| args.get(i + 1)).copied();
        assert_eq!(after("--shard"), Some(shard.as_str()));
        assert_eq!(after("--out"), Some("/parts/part-$(JOB_COMPLETION_INDEX)"));
        assert!(args.contains(&"eval"), "each shard runs qdrift eval");
        assert!(eval.iter().filter(|l| l.trim() == "nvidia.com/gpu: 1").count() >= 1, "each shard asks for a GPU");
        assert!(eval.iter().any(|l| l.trim() == "claimName: qdrift-data"));

        assert!(merge.iter().any(|l| l.contains("qdrift merge /parts/part-* --out /reports/")));
        assert!(!merge.iter().any(|l| l.contains("nvidia.com/gpu")), "the merge is CPU only");
        let waits =
            merge.iter().find(|l| l.trim_start().starts_with("for i in")).expect("the merge waits for the parts");
        let waited: Vec<&str> =
            waits.trim().trim_start_matches("for i in").trim_end_matches("; do").split_whitespace().collect();
        let shards: usize = n.parse().expect("completions is a number");
        assert_eq!(waited, (0..shards).map(|i| i.to_string()).collect::<Vec<_>>(), "the merge waits for every shard");
    }
}
