//! `cargo xtask bench gpu`: decoding throughput on an NVIDIA GPU through wgpu (Vulkan), against
//! the bandwidth bound of a decode step, with peak GPU memory; and `cargo xtask bench
//! autotune-cache`, what a kept autotune cache saves a second process on any wgpu adapter.
//!
//! Order matters: the GPU is looked for first (`nvidia-smi`), so that a machine without one is
//! refused in a second, before anything is built or fetched; then the wgpu adapter must be the
//! NVIDIA one (not Mesa's llvmpipe). With `QDRIFT_BIN=PATH` it runs that prebuilt `qdrift` and
//! builds nothing (for a GPU machine without a Rust toolchain); SmolLM2 is then taken from `models/`
//! if it is there, else its shape is run with random weights (`synthetic:smollm2-135m`: speed does
//! not depend on the values).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// New tokens per prompt in every case.
const NEW_TOKENS: usize = 128;
/// Prompts of the batched cases (one batch).
const BATCH_PROMPTS: usize = 16;
/// Size of the copied tensor for the bandwidth (MiB): far above any GPU's caches; the second if
/// the device's largest buffer is under the first.
const BANDWIDTH_MIB: [&str; 2] = ["1024", "256"];

/// Why the bench cannot run here, as the one line the user sees.
const NO_GPU: &str = "no NVIDIA GPU found";

/// The NVIDIA GPUs `nvidia_smi` lists (`name, memory.total MiB` per line), or the refusal.
pub fn nvidia_gpus(nvidia_smi: &str) -> Result<Vec<String>, String> {
    let output = Command::new(nvidia_smi)
        .args(["--query-gpu=name,memory.total", "--format=csv,noheader,nounits"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                format!("{NO_GPU}: {nvidia_smi} is not installed; `bench gpu` needs an NVIDIA GPU and its driver")
            }
            _ => format!("{NO_GPU}: cannot run {nvidia_smi}: {e}"),
        })?;
    let gpus = parse_gpus(&String::from_utf8_lossy(&output.stdout));
    if !output.status.success() || gpus.is_empty() {
        let why = String::from_utf8_lossy(&output.stderr);
        let why = why.lines().next().unwrap_or("").trim();
        return Err(format!(
            "{NO_GPU}: {nvidia_smi} lists no GPU ({}{}{why})",
            output.status,
            if why.is_empty() { "" } else { ": " }
        ));
    }
    Ok(gpus)
}

/// The non-empty lines of `nvidia-smi --format=csv,noheader` output.
fn parse_gpus(stdout: &str) -> Vec<String> {
    stdout.lines().map(str::trim).filter(|l| !l.is_empty()).map(String::from).collect()
}

/// Whether a wgpu adapter name is an NVIDIA GPU (not `llvmpipe (LLVM 15.0.6, 256 bits)`).
pub fn is_nvidia_adapter(adapter: &str) -> bool {
    adapter.to_ascii_lowercase().contains("nvidia")
}

/// The number after `"key":` in a one-line JSON object qdrift printed (flat, keys unique).
pub fn json_number(line: &str, key: &str) -> Option<f64> {
    let rest = line.split(&format!("\"{key}\":")).nth(1)?;
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    rest[..end].trim().parse().ok()
}

/// The string after `"key":` in a one-line JSON object (no escaped quotes in it).
pub fn json_string(line: &str, key: &str) -> Option<String> {
    let rest = line.split(&format!("\"{key}\":")).nth(1)?.trim_start().strip_prefix('"')?;
    Some(rest[..rest.find('"')?].to_string())
}

/// Bytes a decode step reads from the model's weights at 2 bytes per parameter (f16), from
/// `qdrift inspect --json`'s parameter counts: every parameter except the token embedding (a
/// decode step gathers one row of it), plus the output head, which is the embedding itself when
/// tied (`head` 0). KV-cache reads are not counted.
pub fn f16_weight_bytes_per_step(inspect_json: &str) -> Result<u64, String> {
    let params = inspect_json.split("\"params\"").nth(1).ok_or("qdrift inspect --json printed no \"params\"")?;
    let field = |key: &str| -> Result<u64, String> {
        let rest =
            params.split(&format!("\"{key}\":")).nth(1).ok_or(format!("no params.{key} in qdrift inspect --json"))?;
        let end = rest.find([',', '}', '\n']).unwrap_or(rest.len());
        rest[..end].trim().parse().map_err(|e| format!("params.{key} in qdrift inspect --json: {e}"))
    };
    let (embedding, head, total) = (field("embedding")?, field("head")?, field("total")?);
    let read = if head == 0 { total } else { total - embedding };
    Ok(2 * read)
}

/// Samples `nvidia-smi`'s used memory of the first GPU (MiB) every 100 ms until stopped; the
/// handle returns the largest sample.
struct MemoryPoll {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<Option<u64>>,
}

fn memory_used_mib() -> Option<u64> {
    let out = Command::new("nvidia-smi")
        .args(["--query-gpu=memory.used", "--format=csv,noheader,nounits"])
        .stdin(Stdio::null())
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).lines().next()?.trim().parse().ok()
}

impl MemoryPoll {
    fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let handle = std::thread::spawn(move || {
            let mut peak = None;
            while !flag.load(Ordering::Relaxed) {
                peak = peak.max(memory_used_mib());
                std::thread::sleep(Duration::from_millis(100));
            }
            peak.max(memory_used_mib())
        });
        MemoryPoll { stop, handle }
    }

    fn finish(self) -> Option<u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().ok().flatten()
    }
}

/// Runs `qdrift` with `args`, returns (stdout, stderr); an error with its last stderr line if it fails.
fn capture(qdrift: &Path, args: &[&str]) -> Result<(String, String), String> {
    let out = Command::new(qdrift)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", qdrift.display()))?;
    let (stdout, stderr) =
        (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    if !out.status.success() {
        let last = stderr.lines().last().unwrap_or("");
        return Err(format!("qdrift {} failed ({}): {last}", args.join(" "), out.status));
    }
    Ok((stdout, stderr))
}

/// One model to bench: its name in the output, `--model`, and where it came from.
struct Model {
    name: &'static str,
    path: String,
    note: &'static str,
}

/// The real-size synthetic presets. For the mixtures of experts (Qwen3-30B-A3B, gpt-oss-20b) the
/// bandwidth bound counts every expert: a step reads only the experts its tokens are routed to,
/// so their share of the bound is a floor.
const REAL_SIZES: [&str; 4] = ["qwen3-8b", "gemma3-12b", "gpt-oss-20b", "qwen3-30b-a3b"];

/// The f16 weights of `synthetic:NAME` in GB, as `qdrift inspect --json` plans them (the FP16
/// reference's `weight_bytes`, a tied table counted twice).
fn f16_weights_gb(qdrift: &Path, name: &str) -> Result<f64, String> {
    let (stdout, _) = capture(qdrift, &["inspect", "--model", &format!("synthetic:{name}"), "--json"])?;
    planned_f16_gb(&stdout)
        .ok_or_else(|| format!("qdrift inspect --json of synthetic:{name} gave no FP16 weight_bytes"))
}

/// The first planned model's `weight_bytes` (the FP16 reference) in GB, from `qdrift inspect
/// --json`'s output.
fn planned_f16_gb(inspect_json: &str) -> Option<f64> {
    let v: serde_json::Value = serde_json::from_str(inspect_json).ok()?;
    v.pointer("/evaluation_memory/0/weight_bytes")?.as_f64().map(|b| b / 1e9)
}

/// Whether `f16_gb` of weights leave a quarter more and 8 GB of KV caches and workspace free
/// on a GPU of `gpu_mib`.
fn fits_with_room(f16_gb: f64, gpu_mib: u64) -> bool {
    f16_gb * 1.25 + 8.0 <= gpu_mib as f64 * 1.048_576e-3
}

/// The `memory.total` MiB of one `nvidia-smi` line (`NVIDIA H100 80GB HBM3, 81559`).
fn gpu_memory_mib(line: &str) -> Option<u64> {
    line.rsplit(',').next()?.trim().parse().ok()
}

/// The models `bench gpu` runs: SmolLM2 (`smollm2`, its file or its shape), `synthetic:llama-1b`,
/// and the real-size presets the first of `gpus` holds with room.
fn bench_models(qdrift: &Path, gpus: &[String], smollm2: &Path) -> Result<Vec<Model>, String> {
    let smollm2_is_file = smollm2.is_file();
    let mut models = vec![
        Model {
            name: "SmolLM2-135M",
            path: smollm2.to_string_lossy().into_owned(),
            note: if smollm2_is_file {
                "Q4_1 GGUF held as f16"
            } else {
                "synthetic:smollm2-135m, its shape with random weights"
            },
        },
        Model {
            name: "llama-1b",
            path: "synthetic:llama-1b".to_string(),
            note: "synthetic:llama-1b, Llama 3.2 1B's shape with random weights",
        },
    ];
    // The real-size presets of the architectures people quantize now, those whose f16 weights
    // leave room on the first GPU.
    let gpu_mib = gpus.first().and_then(|g| gpu_memory_mib(g)).unwrap_or(0);
    for name in REAL_SIZES {
        let f16_gb = f16_weights_gb(qdrift, name)?;
        if fits_with_room(f16_gb, gpu_mib) {
            models.push(Model { name, path: format!("synthetic:{name}"), note: "its shape with random weights" });
        } else {
            println!("bench gpu: skipping synthetic:{name} ({f16_gb:.1} GB of f16 weights; the GPU has {gpu_mib} MiB)");
        }
    }
    Ok(models)
}

/// `cargo xtask bench gpu`. `build` builds qdrift and fetches SmolLM2 (unless `QDRIFT_BIN` is
/// set); it runs only once an NVIDIA GPU is found.
pub fn bench_gpu(build: impl FnOnce() -> Result<(PathBuf, PathBuf), String>, models: &Path) -> Result<(), String> {
    let start = Instant::now();
    let gpus = nvidia_gpus("nvidia-smi")?;
    println!("xtask: bench gpu on {}", gpus.join("; "));
    let (qdrift, smollm2) = match std::env::var_os("QDRIFT_BIN") {
        Some(bin) => {
            // The checkout's models/, or (a carried xtask, built elsewhere) the current folder's.
            let local = [models, Path::new("models")]
                .map(|m| m.join(crate::common::SMOLLM2_FILE))
                .into_iter()
                .find(|p| p.is_file());
            (PathBuf::from(bin), local.unwrap_or_else(|| PathBuf::from("synthetic:smollm2-135m")))
        }
        None => build()?,
    };
    let models = bench_models(&qdrift, &gpus, &smollm2)?;

    // Bandwidth first: it also proves wgpu runs on the NVIDIA adapter.
    let bandwidth_args = |mib| ["bandwidth", "--backend", "wgpu", "--mib", mib, "--reps", "10"];
    // A GPU whose largest buffer is under 1 GiB gets a quarter of that (still far above its caches).
    let (line, _) = capture(&qdrift, &bandwidth_args(BANDWIDTH_MIB[0])).or_else(|e| {
        if e.contains("largest buffer") { capture(&qdrift, &bandwidth_args(BANDWIDTH_MIB[1])) } else { Err(e) }
    })?;
    let adapter =
        json_string(&line, "adapter").ok_or_else(|| format!("qdrift bandwidth printed no adapter: {line}"))?;
    if !is_nvidia_adapter(&adapter) {
        return Err(format!(
            "{NO_GPU}: wgpu runs on {adapter}, not the NVIDIA GPU (is its Vulkan driver installed? VK_DRIVER_FILES)"
        ));
    }
    let bandwidth =
        json_number(&line, "bytes_per_s").ok_or_else(|| format!("qdrift bandwidth printed no bytes_per_s: {line}"))?;
    println!(
        "bench gpu: wgpu adapter {adapter}; copy bandwidth {:.0} GB/s (f32 tensor of {:.0} MiB read + written, 8 copies per rep, best of 10 after 2 warm-up)",
        bandwidth / 1e9,
        json_number(&line, "bytes").unwrap_or(0.0) / f64::from(1 << 20),
    );

    // The bench starts from an empty GPU cache folder, and reruns its first case at the end in a
    // new process: the second warm-up run is what a repeated evaluation pays. `cargo xtask bench
    // gpu` builds qdrift with the persistent autotune cache (feature `qdrift-cli/autotune-cache`);
    // a prebuilt `QDRIFT_BIN` without it tunes again in every process (its timing line says which).
    let cache = std::env::temp_dir().join("qdrift-bench-gpu-cache");
    let _ = std::fs::remove_dir_all(&cache);
    // SAFETY: single-threaded here; the variable is read by the child processes only.
    unsafe { std::env::set_var("QDRIFT_CACHE_DIR", &cache) };
    let idle = memory_used_mib();
    let mut first_case = None;
    for model in &models {
        let (inspect, _) = capture(&qdrift, &["inspect", "--model", &model.path, "--json"])?;
        let weight_bytes = f16_weight_bytes_per_step(&inspect)?;
        let bound_s = weight_bytes as f64 / bandwidth;
        for prompts in [BATCH_PROMPTS, 1] {
            let texts: Vec<String> =
                (0..prompts).map(|i| format!("Question {}: what is the capital of France? Answer:", i + 1)).collect();
            let new_tokens = NEW_TOKENS.to_string();
            let batch = prompts.to_string();
            let mut args = vec!["generate", "--model", &model.path, "--max-new-tokens", &new_tokens, "--dtype", "f16"];
            args.extend(["--backend", "wgpu", "--batch-size", &batch, "--timing-json"]);
            for t in &texts {
                args.extend(["--prompt", t]);
            }
            let poll = MemoryPoll::start();
            let result = timing_line(&qdrift, &args);
            let peak = poll.finish();
            let line = result?;
            if first_case.is_none() {
                first_case = Some((args.iter().map(|a| a.to_string()).collect::<Vec<_>>(), line.clone()));
            }
            let line = line.as_str();
            println!("bench gpu json: {line}");
            let number = |k: &str| json_number(line, k).ok_or_else(|| format!("no {k} in {line}"));
            let launches = match (
                json_number(line, "decode_step_launches"),
                json_number(line, "decode_step_launches_per_layer"),
            ) {
                (Some(step), Some(layer)) => {
                    format!("{step:.0} kernel launches per decode step ({layer:.1} per layer)")
                }
                _ => "kernel launches per decode step not measured".to_string(),
            };
            let (tps, first) = (number("tokens_per_s")?, number("first_token_s")?);
            // No decode step when timing noise exceeded it (qdrift prints null then).
            let decode = match (json_number(line, "decode_step_s"), json_number(line, "decode_tokens_per_s")) {
                (Some(step), Some(decode_tps)) => format!(
                    "{decode_tps:.0} tokens/s while decoding, decode step {:.2} ms = {:.1}% of the bandwidth bound",
                    step * 1e3,
                    100.0 * bound_s / step
                ),
                _ => "decode step not measurable (the one-token run took as long as the whole run)".to_string(),
            };
            let memory = match (peak, idle) {
                (Some(p), Some(i)) => format!("peak GPU memory {p} MiB ({:+} MiB over idle)", p as i64 - i as i64),
                _ => "peak GPU memory unknown (nvidia-smi gave no reading)".to_string(),
            };
            println!(
                "bench gpu: {} ({}), f16, {prompts} prompt{} × {NEW_TOKENS} tokens, batch {prompts}: {tps:.0} tokens/s, first token {:.1} ms; {decode}; {launches}; bound {:.3} ms/step ({:.0} MB of weights / {:.0} GB/s); {memory}",
                model.name,
                model.note,
                if prompts == 1 { "" } else { "s" },
                first * 1e3,
                bound_s * 1e3,
                weight_bytes as f64 / 1e6,
                bandwidth / 1e9,
            );
        }
    }
    if let Some((args, cold)) = first_case {
        rerun_warm(&qdrift, &args, &cold, &cache)?;
    }
    println!("xtask: bench gpu took {:.1} min", start.elapsed().as_secs_f64() / 60.0);
    Ok(())
}

/// Reruns the bench's first case (`args`, whose first run printed `cold`) in a new process with
/// the same GPU cache folder, and prints both warm-up runs: what each process pays for compiling
/// and autotuning.
fn rerun_warm(qdrift: &Path, args: &[String], cold: &str, cache: &Path) -> Result<(), String> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let warm = timing_line(qdrift, &args)?;
    println!("bench gpu json: {warm}");
    let warm_up = |line: &str| json_number(line, "warm_up_s").map_or("?".to_string(), |s| format!("{s:.2} s"));
    println!(
        "bench gpu: the first case's warm-up run (the whole request, shaders and autotuning included) took {} in the first process, {} in a second one with the same cache folder {} ({})",
        warm_up(cold),
        warm_up(&warm),
        cache.display(),
        persistence(&warm)
    );
    Ok(())
}

/// Whether the build behind a `--timing-json` line keeps autotune results.
fn persists(line: &str) -> bool {
    line.contains("\"autotune_cache_persists\":true")
}

/// [`persists`], in words.
fn persistence(line: &str) -> &'static str {
    match persists(line) {
        true => "this build keeps autotune results there",
        false => "this build keeps no autotune results: it was built without the feature qdrift-cli/autotune-cache",
    }
}

/// `cargo xtask bench autotune-cache`: `qdrift` (built with the feature `qdrift-cli/autotune-cache`)
/// generates from SmolLM2 (`smollm2`, f16, 2 prompts × 16 tokens, batch 2) on wgpu, whatever the
/// adapter (lavapipe without a GPU), in two processes sharing one empty cache folder. Fails unless
/// the build keeps autotune results, the folder holds CubeCL's database after the first process,
/// the second process's warm-up run is shorter, and both print the same text.
pub fn bench_autotune_cache(qdrift: &Path, smollm2: &Path) -> Result<(), String> {
    let cache = std::env::temp_dir().join("qdrift-bench-autotune-cache");
    let _ = std::fs::remove_dir_all(&cache);
    // SAFETY: single-threaded here; the variable is read by the child processes only.
    unsafe { std::env::set_var("QDRIFT_CACHE_DIR", &cache) };
    let model = smollm2.to_string_lossy();
    let mut args = vec!["generate", "--model", &model, "--dtype", "f16", "--backend", "wgpu"];
    args.extend(["--prompt", "Once upon a time", "--prompt", "The capital of France"]);
    args.extend(["--max-new-tokens", "16", "--timing-json"]);
    // One process: its text (stdout), its timing line and its warm-up run.
    let run = |which: &str| -> Result<(String, f64), String> {
        let (text, line) = timed_run(qdrift, &args)?;
        println!("bench autotune-cache json: {line}");
        if !persists(&line) {
            return Err(format!("bench autotune-cache: {}", persistence(&line)));
        }
        let warm_up = json_number(&line, "warm_up_s").ok_or_else(|| format!("no warm_up_s in {line}"))?;
        println!(
            "bench autotune-cache: {which} process on {}: warm-up run {warm_up:.1} s",
            json_string(&line, "adapter").unwrap_or_default()
        );
        Ok((text, warm_up))
    };
    let (first_text, cold) = run("first")?;
    let stored = std::fs::read_dir(&cache).map(|d| d.count()).unwrap_or(0);
    let (second_text, warm) = run("second")?;
    println!(
        "bench autotune-cache: SmolLM2-135M f16, 2 prompts × 16 tokens, batch 2: warm-up run {cold:.1} s, then {warm:.1} s in a second process ({:.1}× shorter) with the {stored} files the first left in {}",
        cold / warm,
        cache.display()
    );
    if stored == 0 {
        return Err(format!("bench autotune-cache: the first process stored nothing in {}", cache.display()));
    }
    if warm >= cold {
        return Err(format!(
            "bench autotune-cache: the second process's warm-up run ({warm:.1} s) is not shorter than the first's ({cold:.1} s)"
        ));
    }
    if first_text != second_text {
        return Err(format!(
            "bench autotune-cache: the two processes printed different text:\n{first_text}\n---\n{second_text}"
        ));
    }
    Ok(())
}

/// Runs `qdrift generate … --timing-json` and returns its timing line.
fn timing_line(qdrift: &Path, args: &[&str]) -> Result<String, String> {
    timed_run(qdrift, args).map(|(_, line)| line)
}

/// Runs `qdrift generate … --timing-json` and returns what it printed on stdout (the text) and its
/// timing line.
fn timed_run(qdrift: &Path, args: &[&str]) -> Result<(String, String), String> {
    let (stdout, stderr) = capture(qdrift, args)?;
    let line = stderr.lines().rev().find(|l| l.contains("\"timing\"")).map(String::from);
    Ok((stdout, line.ok_or("qdrift generate --timing-json printed no timing line")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_machine_without_nvidia_smi_is_refused_in_one_line() {
        let e = nvidia_gpus("/nonexistent/nvidia-smi").unwrap_err();
        assert!(e.starts_with("no NVIDIA GPU found: /nonexistent/nvidia-smi is not installed"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }

    #[test]
    fn a_program_that_lists_no_gpu_is_refused() {
        // `true` exits 0 and prints nothing, as nvidia-smi does with no device visible.
        let e = nvidia_gpus("true").unwrap_err();
        assert!(e.starts_with("no NVIDIA GPU found: true lists no GPU"), "{e}");
    }

    #[test]
    fn real_sizes_run_where_the_gpu_holds_them() {
        assert_eq!(gpu_memory_mib("NVIDIA H100 80GB HBM3, 81559"), Some(81559));
        assert_eq!(gpu_memory_mib("no number"), None);
        // The presets' f16 weights as `qdrift inspect` plans them: 16.4 to 61.1 GB.
        assert!(fits_with_room(61.1, 81559) && !fits_with_room(61.1, 49152), "qwen3-30b-a3b on 80 GB, not 48");
        assert!(!fits_with_room(16.4, 16384), "qwen3-8b not on a 16 GB GPU");
        let inspect = r#"{"evaluation_memory": [{"name": "fp16", "weight_bytes": 61064245248}]}"#;
        assert_eq!(planned_f16_gb(inspect), Some(61.064245248));
        assert_eq!(planned_f16_gb("{}"), None);
    }

    #[test]
    fn gpus_and_adapters_are_told_apart() {
        assert_eq!(parse_gpus("NVIDIA H200, 143771\n\n"), ["NVIDIA H200, 143771"]);
        assert!(is_nvidia_adapter("NVIDIA H200"));
        assert!(!is_nvidia_adapter("llvmpipe (LLVM 15.0.6, 256 bits)"));
    }

    #[test]
    fn numbers_and_strings_are_read_from_qdrift_json_lines() {
        let line = r#"{"adapter":"NVIDIA H200","bytes_per_s":4.2e12,"decode_step_s":null,"n":16}"#;
        assert_eq!(json_number(line, "bytes_per_s"), Some(4.2e12));
        assert_eq!(json_number(line, "n"), Some(16.0));
        assert_eq!(json_number(line, "decode_step_s"), None);
        assert_eq!(json_number(line, "missing"), None);
        assert_eq!(json_string(line, "adapter").as_deref(), Some("NVIDIA H200"));
    }

    #[test]
    fn weight_bytes_count_the_head_once_and_skip_an_untied_embedding() {
        let tied = r#"{ "params": { "embedding": 100, "per_layer": 10, "layers": 40, "final_norm": 2, "head": 0, "total": 142 }, "flops_per_token": { "total": 9 } }"#;
        assert_eq!(f16_weight_bytes_per_step(tied), Ok(2 * 142));
        let untied = tied.replace("\"head\": 0, \"total\": 142", "\"head\": 100, \"total\": 242");
        assert_eq!(f16_weight_bytes_per_step(&untied), Ok(2 * 142));
        assert!(f16_weight_bytes_per_step("{}").is_err());
    }
}
