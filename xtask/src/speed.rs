//! `cargo xtask bench speed`: qdrift's CPU decoding against llama.cpp in the same run, on the
//! same model file, prompts and machine.
//!
//! The peer is llama.cpp through llama-cpp-python (`LLAMA_CPP_PYTHON`), installed into a
//! virtualenv under the target directory on first use (pip builds llama.cpp from source with the
//! machine's C++ compiler, a few minutes on 2 cores; nothing of it runs in `ci`). Both sides
//! decode greedily: llama.cpp one prompt at a time (`peer/llama_cpp_peer.py`), qdrift through
//! `qdrift generate --timing-json`, batched (16 prompts) and single-stream. Targets (issue 16):
//! batched ≥ 2.5× and single stream ≥ 0.5× llama.cpp's single-stream tokens/s.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::gpu::json_number;

/// The peer, pinned: the version the numbers were measured with.
const LLAMA_CPP_PYTHON: &str = "llama-cpp-python==0.3.36";
/// New tokens per prompt, both sides.
const NEW_TOKENS: usize = 128;
/// Prompts of the batched run (the first of the chat set's prompts, raw, without the template).
const PROMPTS: usize = 16;

/// Runs the comparison; `qdrift` is the built binary, `model` the SmolLM2 GGUF.
pub fn bench_speed(qdrift: &Path, model: &Path, target: &Path, chat_set: &str) -> Result<(), String> {
    let prompts = chat_prompts(chat_set, PROMPTS)?;
    let python = peer_python(target)?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let model_s = model.to_string_lossy();
    let conditions = format!(
        "SmolLM2-135M-Instruct Q4_1 GGUF, {} chat prompts (raw text), {NEW_TOKENS} new tokens each, greedy, cpu, {threads} threads",
        prompts.len()
    );
    println!("bench speed: {conditions}");

    let peer_args = format!(
        "{{\"model\": {}, \"prompts\": [{}], \"new_tokens\": {NEW_TOKENS}, \"threads\": {threads}}}",
        json_str(&model_s),
        prompts.iter().map(|p| json_str(p)).collect::<Vec<_>>().join(", ")
    );
    let script = crate::common::root().join("xtask/peer/llama_cpp_peer.py");
    let peer = capture(&python, &[&script.to_string_lossy(), &peer_args])?;
    let peer_line =
        peer.lines().find(|l| l.contains("\"timing\"")).ok_or("the llama.cpp peer printed no timing line")?;
    let peer_tps = number(peer_line, "decode_tokens_per_s")?;
    if let Some(info) = peer.lines().find(|l| l.starts_with("system_info:")) {
        println!("bench speed: llama.cpp {info}");
    }
    println!(
        "bench speed: llama.cpp ({LLAMA_CPP_PYTHON}, Q4_1 weights, Q8_1 activations), one stream: {peer_tps:.1} decode tok/s, {:.1} tok/s with the prompt pass",
        number(peer_line, "tokens_per_s")?
    );

    let runs: [(&str, usize, &str, f64); 3] = [
        ("batched, f16 (FP16 reference weights)", prompts.len(), "f16", 2.5),
        ("one stream, f16", 1, "f16", 0.5),
        ("one stream, f32", 1, "f32", 0.5),
    ];
    for (what, n, dtype, target_ratio) in runs {
        let new = NEW_TOKENS.to_string();
        let mut args = vec!["generate", "--model", &model_s, "--max-new-tokens", &new, "--dtype", dtype];
        args.extend(["--backend", "cpu", "--timing-json"]);
        for p in &prompts[..n] {
            args.extend(["--prompt", p.as_str()]);
        }
        let stderr = capture_stderr(qdrift, &args)?;
        let line = stderr.lines().find(|l| l.contains("\"timing\"")).ok_or("qdrift printed no timing line")?;
        let (tps, decode) = (number(line, "tokens_per_s")?, json_number(line, "decode_tokens_per_s"));
        let batch = json_number(line, "batch_size").unwrap_or(0.0);
        let ratio = tps / peer_tps;
        let verdict = if ratio >= target_ratio { "met" } else { "missed" };
        println!(
            "bench speed: qdrift {what}, {n} prompt(s), batch {batch:.0}: {tps:.1} tok/s (decode steps {}), {ratio:.2}× llama.cpp's one stream; target ≥ {target_ratio}×: {verdict}",
            decode.map_or("n/a".into(), |d| format!("{d:.1} tok/s"))
        );
    }
    Ok(())
}

/// The first `n` prompts of a JSONL eval set (`{"id": …, "prompt": …}` per line).
fn chat_prompts(jsonl: &str, n: usize) -> Result<Vec<String>, String> {
    let prompts: Vec<String> = jsonl
        .lines()
        .filter_map(|l| {
            let rest = l.split("\"prompt\":").nth(1)?.trim_start().strip_prefix('"')?;
            // The chat set's prompts carry no escaped quotes; a line that does is skipped.
            let end = rest.find('"')?;
            (!rest[..end].ends_with('\\')).then(|| rest[..end].to_string())
        })
        .take(n)
        .collect();
    if prompts.len() < n {
        return Err(format!("the chat set has {} usable prompts, {n} wanted", prompts.len()));
    }
    Ok(prompts)
}

/// A JSON string literal of `s` (quotes, backslashes and control characters escaped).
fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn number(line: &str, key: &str) -> Result<f64, String> {
    json_number(line, key).ok_or_else(|| format!("no number {key} in {line}"))
}

/// llama.cpp's CMake options for the peer, for this CPU: the x86 extensions it has, never ggml's
/// AMX backend. On a CPU that advertises AMX, a native build's `ggml_backend_amx_mul_mat`
/// segfaults on the first multi-token batch (llama-cpp-python 0.3.36 on a 2-core Xeon with
/// AMX-INT8/BF16), so `GGML_NATIVE` is off (`-march=native` would turn AMX back on) and each
/// extension is named instead. Printed with the peer's numbers.
fn peer_cmake_args() -> String {
    let mut args = vec!["-DGGML_NATIVE=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"];
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        let extensions = [
            (has!("avx"), "-DGGML_AVX=ON"),
            (has!("avx2"), "-DGGML_AVX2=ON"),
            (has!("fma"), "-DGGML_FMA=ON"),
            (has!("f16c"), "-DGGML_F16C=ON"),
            (has!("avx512f"), "-DGGML_AVX512=ON"),
            (has!("avx512vbmi"), "-DGGML_AVX512_VBMI=ON"),
            (has!("avx512vnni"), "-DGGML_AVX512_VNNI=ON"),
            (has!("avx512bf16"), "-DGGML_AVX512_BF16=ON"),
        ];
        args.extend(extensions.into_iter().filter(|&(on, _)| on).map(|(_, option)| option));
    }
    args.join(" ")
}

/// The virtualenv's python with llama-cpp-python importable, built from source with
/// [`peer_cmake_args`] on first use (and again when the options change).
fn peer_python(target: &Path) -> Result<std::path::PathBuf, String> {
    let venv = target.join("llama-cpp-venv");
    let python = venv.join("bin/python");
    let cmake_args = peer_cmake_args();
    let pinned = venv.join(format!("{LLAMA_CPP_PYTHON}.installed"));
    let built_with = std::fs::read_to_string(&pinned).unwrap_or_default();
    println!("bench speed: the llama.cpp peer is built with CMAKE_ARGS=\"{cmake_args}\"");
    if built_with != cmake_args {
        if Command::new("c++").arg("--version").stdout(Stdio::null()).status().is_err() {
            return Err(
                "bench speed builds llama.cpp from source: install a C++ compiler (apt-get install -y g++)".into()
            );
        }
        println!("xtask: installing {LLAMA_CPP_PYTHON} into {} (builds llama.cpp: minutes)", venv.display());
        crate::common::run("python3", &["-m", "venv", &venv.to_string_lossy()])?;
        let pip = venv.join("bin/pip");
        // From source (no wheel, no cache), so that CMAKE_ARGS is what builds it.
        let args = [
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--force-reinstall",
            "--no-cache-dir",
            "--no-binary",
            "llama-cpp-python",
            LLAMA_CPP_PYTHON,
        ];
        crate::common::run_env(&pip.to_string_lossy(), &args, &[("CMAKE_ARGS", &cmake_args)])?;
        std::fs::write(&pinned, &cmake_args).map_err(|e| format!("{}: {e}", pinned.display()))?;
    }
    Ok(python)
}

fn capture(program: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(format!("{} failed ({}): {}", program.display(), out.status, stderr.lines().last().unwrap_or("")));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn capture_stderr(program: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        return Err(format!(
            "qdrift {} failed ({}): {}",
            args.join(" "),
            out.status,
            stderr.lines().last().unwrap_or("")
        ));
    }
    Ok(stderr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_come_from_the_chat_set_in_order() {
        let set = include_str!("../../eval-sets/chat.jsonl");
        let p = chat_prompts(set, 16).expect("16 prompts");
        assert_eq!(p[0], "What is the capital of Australia?");
        assert_eq!(p.len(), 16);
        assert!(chat_prompts("{\"id\": \"a\", \"prompt\": \"x\"}\n", 2).is_err());
    }

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_str("a \"b\" \\ c\n"), "\"a \\\"b\\\" \\\\ c\\u000a\"");
    }
}
