//! `cargo xtask bench gpu` on a machine without an NVIDIA GPU (CI's, this one): one line, a
//! non-zero exit, in seconds, nothing built or fetched. And its orchestration on a fake GPU
//! machine (an `nvidia-smi` and a `QDRIFT_BIN` that print what the real ones print), so that the
//! parsing and the arithmetic of the bound are tested where no GPU is.

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
    let _ = std::fs::remove_dir_all(&empty);
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

/// A fake `nvidia-smi` (one GPU, 123 MiB used) and a fake `qdrift` whose wgpu adapter is
/// `adapter`, in a fresh folder that is the whole `PATH`.
fn fake_gpu_machine(adapter: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("xtask-fake-gpu-{}-{}", std::process::id(), adapter.len()));
    std::fs::create_dir_all(&dir).expect("temp folder");
    let smi = "#!/bin/sh\ncase \"$1\" in *name*) echo 'NVIDIA Fake GPU, 1000';; *) echo 123;; esac\n";
    // 1e9 parameters, tied head: 2 GB per step at f16; at the fake bandwidth (4e12 bytes per
    // second) the bound is half the fake step of one millisecond: 50%.
    let qdrift = format!(
        "#!/bin/sh\ncase \"$1\" in\n\
         bandwidth) echo '{{\"adapter\":\"{adapter}\",\"backend\":\"wgpu\",\"bytes\":1073741824,\"bytes_per_s\":4.0e12,\"copies\":8}}';;\n\
         inspect) echo '{{ \"params\": {{ \"embedding\": 100, \"head\": 0, \"total\": 1000000000 }}, \"evaluation_memory\": [{{ \"weight_bytes\": 2000000000 }}] }}';;\n\
         generate) echo 'qdrift: backend wgpu' >&2; echo '{{\"decode_step_s\":0.001,\"decode_tokens_per_s\":16000.0,\"first_token_s\":0.01,\"timing\":\"qdrift generate\",\"tokens_per_s\":12000.0}}' >&2;;\n\
         *) exit 3;;\nesac\n"
    );
    for (name, text) in [("nvidia-smi", smi.to_string()), ("qdrift", qdrift)] {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("script written");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("executable");
    }
    dir
}

#[test]
fn bench_gpu_reports_every_case_against_the_bound_on_a_fake_gpu() {
    let dir = fake_gpu_machine("NVIDIA Fake GPU");
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["bench", "gpu"])
        .env("PATH", &dir)
        .env("QDRIFT_BIN", dir.join("qdrift"))
        .output()
        .expect("xtask runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("copy bandwidth 4000 GB/s"), "{stdout}");
    let cases: Vec<&str> = stdout.lines().filter(|l| l.contains(" tokens/s, first token ")).collect();
    assert_eq!(cases.len(), 4, "{stdout}");
    for case in &cases {
        assert!(case.contains("12000 tokens/s, first token 10.0 ms"), "{case}");
        assert!(
            case.contains("16000 tokens/s while decoding, decode step 1.00 ms = 50.0% of the bandwidth bound"),
            "{case}"
        );
        assert!(case.contains("bound 0.500 ms/step (2000 MB of weights / 4000 GB/s)"), "{case}");
        assert!(case.contains("peak GPU memory 123 MiB (+0 MiB over idle)"), "{case}");
    }
    assert!(cases[0].contains("16 prompts × 128 tokens") && cases[1].contains("1 prompt × 128 tokens"), "{stdout}");
    assert!(cases[2].starts_with("bench gpu: llama-1b"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_gpu_refuses_a_software_wgpu_adapter_beside_an_nvidia_gpu() {
    let dir = fake_gpu_machine("llvmpipe (LLVM 15.0.6, 256 bits)");
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["bench", "gpu"])
        .env("PATH", &dir)
        .env("QDRIFT_BIN", dir.join("qdrift"))
        .output()
        .expect("xtask runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("xtask: error: no NVIDIA GPU found: wgpu runs on llvmpipe (LLVM 15.0.6, 256 bits)"),
        "{stderr}"
    );
}
