//! `cargo xtask <task>`: qdrift's chores, in Rust so that they run wherever cargo does.
//!
//! - `ci`: install the system packages the tests need, build, run every test.
//! - `demo`: the main job on the default model.
//! - `setup`: only the system packages (Mesa's software Vulkan driver for wgpu without a GPU).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

const USAGE: &str = "usage: cargo xtask <task>

tasks:
  ci      install what the tests need (Mesa's Vulkan driver), build, run every test
  demo    run qdrift on the default model (stories260K from ../shared) and print the result
  setup   install the system packages only
";

fn main() -> ExitCode {
    let task = std::env::args().nth(1).unwrap_or_default();
    let result = match task.as_str() {
        "ci" => ci(),
        "demo" => demo(),
        "setup" => setup(),
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

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// One target folder for every build and test, outside the checkout so that fresh clones on the
/// same machine reuse it (a cold build of Burn with wgpu takes ~12 minutes on 2 cores). Cargo's
/// fingerprints keep it correct; deleting it only costs time.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/var/tmp/qdrift-target"))
}

fn cargo(args: &[&str]) -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    println!("xtask: cargo {}", args.join(" "));
    let status = Command::new(&cargo)
        .args(args)
        .current_dir(root())
        .env("CARGO_TARGET_DIR", target_dir())
        .status()
        .map_err(|e| format!("cannot run {cargo}: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("cargo {} failed ({status})", args.join(" "))) }
}

/// Debian packages the tests need: Mesa's Vulkan drivers (lavapipe) and the Vulkan loader, so
/// that wgpu runs on a machine without a GPU.
const PACKAGES: &[&str] = &["mesa-vulkan-drivers", "libvulkan1"];

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

fn run(program: &str, args: &[&str]) -> Result<(), String> {
    run_env(program, args, &[])
}

fn run_env(program: &str, args: &[&str], env: &[(&str, &str)]) -> Result<(), String> {
    let status = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .status()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("{program} {} failed ({status})", args.join(" "))) }
}

fn ci() -> Result<(), String> {
    setup()?;
    // One profile (release) for the binary and the tests: Burn is unusably slow unoptimised, and
    // a second profile would build it twice.
    cargo(&["build", "--release", "--workspace", "--all-targets"])?;
    cargo(&["test", "--release", "--workspace", "--no-fail-fast"])
}

fn demo() -> Result<(), String> {
    let shared = std::env::var_os("QDRIFT_SHARED").map(PathBuf::from).unwrap_or_else(|| root().join("../shared"));
    let model = shared.join("models/stories260K/stories260K.bin");
    let tokenizer = shared.join("models/stories260K/tok512.bin");
    if !model.is_file() {
        return Err(format!("{} not found: the demo model lives in ../shared beside the checkout", model.display()));
    }
    cargo(&["build", "--release", "--package", "qdrift-cli"])?;
    let qdrift = target_dir().join("release/qdrift");
    let (m, t) = (model.to_string_lossy().into_owned(), tokenizer.to_string_lossy().into_owned());
    run(
        &qdrift.to_string_lossy(),
        &[
            "generate", "--model", &m, "--tokenizer", &t, "--max-new-tokens", "64",
            "--prompt", "Once upon a time", "--prompt", "Lily wanted to", "--prompt", "The little bird was sad because",
        ],
    )
}
