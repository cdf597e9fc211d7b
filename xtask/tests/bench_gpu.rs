//! `cargo xtask bench gpu` on a machine without an NVIDIA GPU (CI's, this one): one line, a
//! non-zero exit, in seconds, nothing built or fetched.

use std::process::Command;
use std::time::{Duration, Instant};

/// Runs `xtask bench gpu` with a `PATH` that holds no `nvidia-smi` (and no cargo, so that a build
/// attempt would fail loudly instead of passing unnoticed).
fn bench_gpu_without_nvidia_smi(extra_env: &[(&str, &str)]) -> (std::process::Output, Duration) {
    let empty = std::env::temp_dir().join(format!("xtask-empty-path-{}", std::process::id()));
    std::fs::create_dir_all(&empty).expect("temp folder");
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["bench", "gpu"])
        .env("PATH", &empty)
        .env_remove("CARGO")
        .envs(extra_env.iter().copied())
        .output()
        .expect("xtask runs");
    (out, start.elapsed())
}

#[test]
fn bench_gpu_refuses_a_machine_without_an_nvidia_gpu_in_one_line() {
    for env in [&[][..], &[("QDRIFT_BIN", "/nonexistent/qdrift")][..]] {
        let (out, took) = bench_gpu_without_nvidia_smi(env);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "", "nothing else runs before the check");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.starts_with("xtask: error: no NVIDIA GPU found: nvidia-smi is not installed"), "{stderr}");
        assert!(took < Duration::from_secs(10), "took {took:?}");
    }
}
