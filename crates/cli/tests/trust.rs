//! Never measure the wrong thing: a variant of another model is refused before any work, every
//! command keeps one exit-code rule (0 pass, 1 regression, 2 unusable input, 3 inconclusive,
//! 4 environment), a closed pipe ends the process quietly, and the first stderr line says what
//! runs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

mod common;
use common::{qdrift, shared, stories};

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

fn tiny_arch(name: &str) -> PathBuf {
    shared().join("models/tiny-arch").join(name)
}

/// A copy of the tiny-arch folder `name` at `dir` (its files, one level).
fn copy_of(name: &str, dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).expect("mkdir");
    for entry in std::fs::read_dir(tiny_arch(name)).expect("a tiny-arch folder") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), dir.join(entry.file_name())).expect("copy");
    }
    dir.to_path_buf()
}

/// `qdrift eval` of `model` with int8 over 2 prompts and 4 tokens on the CPU into `out`, and
/// `extra` arguments.
fn quick_eval(model: &Path, out: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "eval",
        "--model",
        path(model),
        "--schemes",
        "int8",
        "--prompts",
        "2",
        "--horizons",
        "4",
        "--backend",
        "cpu",
        "--resamples",
        "100",
        "--out",
        path(out),
    ];
    args.extend_from_slice(extra);
    qdrift(&args)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The exit code, asserting no panic and, for a failure, exactly one `qdrift: error:` line.
fn code(out: &Output) -> i32 {
    let err = stderr(out);
    assert!(!err.contains("panicked"), "panicked: {err}");
    let code = out.status.code().unwrap_or_else(|| panic!("killed by a signal: {err}"));
    if code == 2 || code == 4 {
        assert_eq!(err.lines().filter(|l| l.starts_with("qdrift: error:")).count(), 1, "one error line: {err}");
    }
    code
}

fn eval_args<'a>(model: &'a Path, variant: &'a Path, out: &'a Path) -> Vec<&'a str> {
    vec![
        "eval",
        "--model",
        path(model),
        "--variant",
        path(variant),
        "--schemes",
        "",
        "--prompts",
        "2",
        "--horizons",
        "4",
        "--backend",
        "cpu",
        "--resamples",
        "100",
        "--out",
        path(out),
    ]
}

/// A Qwen3-MoE checkpoint as a "variant" of a Qwen3 one, whose widths, heads and tokenizer agree:
/// refused before the reference runs, naming the first difference, exit 2; accepted with
/// `--allow-different-model`, and the report says so first.
#[test]
fn a_variant_of_another_architecture_is_refused_before_any_work() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("drift");
    let (qwen3, moe) = (tiny_arch("qwen3"), tiny_arch("qwen3_moe"));
    let refused = qdrift(&eval_args(&qwen3, &moe, &out));
    let err = stderr(&refused);
    assert_eq!(code(&refused), 2, "{err}");
    assert!(err.contains("is not a quantization of the reference"), "{err}");
    assert!(err.contains("Qwen3MoeForCausalLM"), "names the first difference: {err}");
    assert!(err.contains("--allow-different-model"), "{err}");
    assert!(!err.contains("generating"), "refused before the reference ran: {err}");
    assert!(!out.exists(), "nothing written");

    let mut args = eval_args(&qwen3, &moe, &out);
    args.push("--allow-different-model");
    let allowed = qdrift(&args);
    assert_eq!(code(&allowed), 0, "{}", stderr(&allowed));
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("report.json")).expect("report")).expect("JSON");
    let variant = common::variant(&report, "qwen3_moe");
    assert!(variant["different_model"].as_str().is_some_and(|d| d.contains("Qwen3MoeForCausalLM")), "{variant}");
    let md = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    let verdict = md.find("is not a quantization of the reference").expect("the Markdown says so");
    assert!(verdict < md.find("| #").expect("the verdict table"), "said before the verdict table");
}

/// A model of another size and tokenizer (stories260K against the tiny Qwen3) is refused before
/// work even with `--allow-different-model`: the metrics compare one vocabulary.
#[test]
fn a_variant_with_another_tokenizer_is_refused_even_when_allowed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("drift");
    let stories_bin = stories().join("stories260K.bin");
    let qwen3 = tiny_arch("qwen3");
    let mut args = eval_args(&qwen3, &stories_bin, &out);
    args.push("--allow-different-model");
    let refused = qdrift(&args);
    let err = stderr(&refused);
    assert_eq!(code(&refused), 2, "{err}");
    assert!(err.contains("tokenizer"), "{err}");
    assert!(!err.contains("generating"), "{err}");
}

/// The same checkpoint as its own variant is a quantization (the identity): accepted.
#[test]
fn the_same_checkpoint_passes_the_check() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("drift");
    let qwen3 = tiny_arch("qwen3");
    let run = qdrift(&eval_args(&qwen3, &qwen3, &out));
    assert_eq!(code(&run), 0, "{}", stderr(&run));
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("report.json")).expect("report")).expect("JSON");
    assert!(common::variant(&report, "qwen3").get("different_model").is_none());
}

/// The exit-code table, command by command: unusable input 2, an environment failure 4.
#[test]
fn every_command_keeps_the_exit_code_rule() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("no-such-model.gguf");
    let out = dir.path().join("drift");
    let report = dir.path().join("no-report.json");
    let unusable: Vec<Vec<&str>> = vec![
        vec!["eval", "--model", path(&missing), "--schemes", "int8", "--backend", "cpu", "--out", path(&out)],
        vec!["eval", "--model", path(&missing), "--schemes", "int9", "--out", path(&out)],
        vec!["generate", "--model", path(&missing), "--prompt", "x", "--max-new-tokens", "2", "--backend", "cpu"],
        vec!["quantize", "--model", path(&missing), "--scheme", "int8", "--out", path(&out)],
        vec!["inspect", "--model", path(&missing)],
        vec!["merge", path(&missing), "--out", path(&out)],
        vec!["gate", "--report", path(&report), "--thresholds", path(&missing)],
        vec!["compare", path(&report), path(&report)],
        vec!["thresholds", "suggest", path(&report), "--out", path(&out)],
        vec!["thresholds", "show", "no-such-profile"],
        vec!["no-such-command"],
    ];
    for args in &unusable {
        let run = qdrift(args);
        assert_eq!(run.status.code(), Some(2), "{args:?}: {}", stderr(&run));
        assert!(!stderr(&run).contains("panicked"), "{args:?}");
    }
    // No Vulkan driver to be found: no device is the machine's failure, 4, said before any work.
    let stories_bin = stories().join("stories260K.bin");
    let run = Command::new(env!("CARGO_BIN_EXE_qdrift"))
        .args([
            "generate",
            "--model",
            path(&stories_bin),
            "--prompt",
            "Tom",
            "--max-new-tokens",
            "2",
            "--backend",
            "wgpu",
        ])
        .env("VK_ICD_FILENAMES", dir.path().join("none.json"))
        .env("VK_DRIVER_FILES", dir.path().join("none.json"))
        .output()
        .expect("qdrift runs");
    assert_eq!(code(&run), 4, "{}", stderr(&run));
    assert!(stderr(&run).contains("no wgpu adapter"), "{}", stderr(&run));
}

/// `qdrift … | head -1`: a closed standard output ends the process by SIGPIPE, with nothing on
/// stderr, as a Unix tool does.
#[test]
fn a_closed_pipe_ends_the_process_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let stories_bin = stories().join("stories260K.bin");
    let mut child = Command::new(env!("CARGO_BIN_EXE_qdrift"))
        .args(["inspect", "--model", path(&stories_bin)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("qdrift runs");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("qdrift ends");
    assert_eq!(out.status.signal(), Some(13), "SIGPIPE ends it: {:?} {}", out.status, stderr(&out));
    assert!(stderr(&out).is_empty(), "quiet: {}", stderr(&out));
}

/// `qdrift eval --gate … | head -1` with the reader gone before the summary: the reports, the
/// JUnit file and the summary are in place before anything is printed, so the SIGPIPE that ends
/// the process leaves neither the lock nor the staging folder, and loses nothing.
#[test]
fn a_closed_pipe_costs_an_eval_nothing() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let thresholds = dir.path().join("thresholds.toml");
    std::fs::write(&thresholds, "[variant.int8]\n\"kld@4\" = { max = 1.0 }\n").expect("write");
    let out = dir.path().join("drift");
    let stories_bin = stories().join("stories260K.bin");
    let mut child = Command::new(env!("CARGO_BIN_EXE_qdrift"))
        .args(["eval", "--model", path(&stories_bin), "--schemes", "int8", "--prompts", "2", "--horizons", "4"])
        .args(["--backend", "cpu", "--resamples", "100", "--gate", path(&thresholds), "--junit", "gate.xml"])
        .args(["--out", path(&out)])
        .current_dir(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("qdrift runs");
    drop(child.stdout.take());
    let run = child.wait_with_output().expect("qdrift ends");
    assert_eq!(run.status.signal(), Some(13), "SIGPIPE ends it: {:?} {}", run.status, stderr(&run));
    assert!(!stderr(&run).contains("panicked"), "{}", stderr(&run));
    for file in ["report.json", "report.md", "report.html"] {
        assert!(out.join(file).is_file(), "{file} written");
    }
    assert!(dir.path().join("gate.xml").is_file(), "the JUnit file is written");
    let mut left: Vec<String> = std::fs::read_dir(dir.path())
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into())
        .collect();
    left.sort();
    assert_eq!(left, ["drift", "gate.xml", "thresholds.toml"], "no lock or staging folder left");
}

/// The first stderr line of `eval` names the backend and the adapter.
#[test]
fn eval_says_what_runs_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("drift");
    let stories_bin = stories().join("stories260K.bin");
    let run = quick_eval(&stories_bin, &out, &[]);
    assert_eq!(code(&run), 0, "{}", stderr(&run));
    let err = stderr(&run);
    let first = err.lines().next().unwrap_or_default();
    assert!(first.starts_with("qdrift: cpu: CPU ("), "{err}");
}

/// `--prompts auto --max-prompts N` on a set smaller than N: the rounds stop at the set's size
/// (here a 5-prompt set, whose first round would be 16), and the run is gated on all of it.
#[test]
fn prompts_auto_stops_at_the_sets_size() {
    let dir = tempfile::tempdir().expect("tempdir");
    let set = dir.path().join("five.jsonl");
    let lines: Vec<String> =
        (1..=5).map(|i| format!("{{\"id\": \"p{i}\", \"prompt\": \"Once upon a time, number {i}\"}}")).collect();
    std::fs::write(&set, lines.join("\n") + "\n").expect("write");
    let thresholds = dir.path().join("thresholds.toml");
    // A threshold no run can fail and none can leave inconclusive: the rounds stop for the set.
    std::fs::write(&thresholds, "[variant.int8]\n\"token_match_rate@4\" = { min = 0.0 }\n").expect("write");
    let out = dir.path().join("drift");
    let stories_bin = stories().join("stories260K.bin");
    let run = qdrift(&[
        "eval",
        "--model",
        path(&stories_bin),
        "--eval-set",
        path(&set),
        "--schemes",
        "int8",
        "--horizons",
        "4",
        "--resamples",
        "100",
        "--backend",
        "cpu",
        "--prompts",
        "auto",
        "--max-prompts",
        "40",
        "--gate",
        path(&thresholds),
        "--out",
        path(&out),
    ]);
    let err = stderr(&run);
    assert_eq!(code(&run), 0, "{err}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("report.json")).expect("report")).expect("JSON");
    assert_eq!(report["workload"]["prompts"], 5, "{err}");
}

/// A Hugging Face Hub id where a path is expected gets a hint to download it, not a bare
/// `No such file or directory`.
#[test]
fn a_hub_id_gets_a_download_hint() {
    let run = qdrift(&["inspect", "--model", "Qwen/Qwen3-0.6B"]);
    let err = stderr(&run);
    assert_eq!(code(&run), 2, "{err}");
    assert!(err.contains("looks like a Hugging Face Hub id"), "{err}");
    assert!(err.contains("hf download Qwen/Qwen3-0.6B --local-dir Qwen3-0.6B"), "{err}");
}

/// Names a report could not show as themselves, or could confuse with a scheme, a precision or
/// the noise floor, are refused before any work.
#[test]
fn unusable_variant_names_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("drift");
    let stories_bin = stories().join("stories260K.bin");
    for name in ["..", "fp16", "int8", "noise-floor-f32", " ", "a\u{202e}b", "a\u{1b}[31mb"] {
        let variant = format!("{name}={}", path(&stories_bin));
        let run = qdrift(&[
            "eval",
            "--model",
            path(&stories_bin),
            "--variant",
            &variant,
            "--schemes",
            "",
            "--backend",
            "cpu",
            "--out",
            path(&out),
        ]);
        let err = stderr(&run);
        assert_eq!(code(&run), 2, "{name:?}: {err}");
        assert!(err.contains("choose another"), "{name:?}: {err}");
        assert!(!err.contains('\u{202e}') && !err.contains('\u{1b}'), "escaped: {err:?}");
    }
}

/// A copy of the tiny Qwen3 folder whose `tokenizer_config.json` carries `template`.
fn qwen3_with_template(dir: &Path, template: &str) -> PathBuf {
    let model = copy_of("qwen3", &dir.join("qwen3"));
    let config = model.join("tokenizer_config.json");
    let mut json: serde_json::Value = serde_json::from_slice(&std::fs::read(&config).expect("read")).expect("JSON");
    json["chat_template"] = serde_json::Value::String(template.to_string());
    std::fs::write(&config, serde_json::to_vec(&json).expect("JSON")).expect("write");
    model
}

/// Chat templates that ask for gigabytes without writing anything (a string doubled a dozen
/// times, a huge `format` width) are refused in one line, the run ends cleanly and writes
/// nothing; a real template still renders (the chat set runs through it).
#[test]
fn chat_template_memory_bombs_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let doubling = format!("{{% set s = 'x' * 1000000 %}}{}{{{{ s|length }}}}", "{% set s = s ~ s %}".repeat(12));
    let replaced =
        format!("{{% set s = 'x' * 1000000 %}}{}{{{{ s|length }}}}", "{% set s = s|replace('x', 'xx') %}".repeat(12));
    let namespace = "{% set ns = namespace(s='x' * 1000000) %}{% for i in range(30) %}{% set ns.s = ns.s ~ ns.s %}\
                     {% endfor %}{{ ns.s|length }}";
    let bombs = [doubling.as_str(), "{{ '%3000000000s'|format('x')|length }}", replaced.as_str(), namespace];
    for (i, bomb) in bombs.iter().enumerate() {
        let model = qwen3_with_template(&dir.path().join(format!("bomb{i}")), bomb);
        let out = dir.path().join(format!("drift{i}"));
        let run = qdrift(&[
            "eval",
            "--model",
            path(&model),
            "--schemes",
            "int8",
            "--prompts",
            "2",
            "--horizons",
            "4",
            "--backend",
            "cpu",
            "--out",
            path(&out),
        ]);
        let err = stderr(&run);
        assert_eq!(code(&run), 2, "{bomb}: {err}");
        assert!(err.contains("MiB of memory to render one prompt"), "{bomb}: {err}");
        assert!(!out.exists(), "nothing written");
    }
    // The same bomb in a GGUF file (`tokenizer.chat_template`, as `quantize --format gguf` embeds
    // the folder's template).
    let gguf = dir.path().join("bomb.gguf");
    let folder = qwen3_with_template(&dir.path().join("gguf-bomb"), namespace);
    let made =
        qdrift(&["quantize", "--model", path(&folder), "--scheme", "q8_0", "--format", "gguf", "--out", path(&gguf)]);
    assert_eq!(code(&made), 0, "{}", stderr(&made));
    let out = dir.path().join("drift-gguf");
    let run = quick_eval(&gguf, &out, &[]);
    let err = stderr(&run);
    assert_eq!(code(&run), 2, "{err}");
    assert!(err.contains("bomb.gguf: the model's chat template needs more than"), "{err}");
    assert!(!out.exists(), "nothing written");
    let chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
                  {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    let model = qwen3_with_template(&dir.path().join("real"), chatml);
    let out = dir.path().join("real-drift");
    let run = quick_eval(&model, &out, &[]);
    assert_eq!(code(&run), 0, "{}", stderr(&run));
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("report.json")).expect("report")).expect("JSON");
    assert_eq!(report["workload"]["chat_template"], true, "the chat set ran through the template");
}

/// `inspect` on a mixture of experts shows the experts, top-k and routing.
#[test]
fn inspect_shows_the_experts() {
    let run = qdrift(&["inspect", "--model", path(&tiny_arch("qwen3_moe"))]);
    assert_eq!(code(&run), 0, "{}", stderr(&run));
    let text = String::from_utf8_lossy(&run.stdout);
    assert!(text.contains("experts 8, top-2 (softmax over all, top-k renormalised), expert FFN 32"), "{text}");
}

/// `--quantize-router` on a model without experts is refused, not ignored.
#[test]
fn quantize_router_needs_experts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stories_bin = stories().join("stories260K.bin");
    let run = qdrift(&[
        "eval",
        "--model",
        path(&stories_bin),
        "--schemes",
        "int8",
        "--quantize-router",
        "--backend",
        "cpu",
        "--out",
        path(&dir.path().join("drift")),
    ]);
    assert_eq!(code(&run), 2, "{}", stderr(&run));
    assert!(
        stderr(&run).contains("--quantize-router is for a model with experts, and this one has none"),
        "{}",
        stderr(&run)
    );
}

/// `eval --gate --summary-md FILE` writes the verdict as `qdrift gate --summary-md` does.
#[test]
fn eval_gate_writes_the_summary() {
    let dir = tempfile::tempdir().expect("tempdir");
    let thresholds = dir.path().join("thresholds.toml");
    std::fs::write(&thresholds, "[variant.int8]\n\"kld@4\" = { max = 1.0 }\n").expect("write");
    let summary = dir.path().join("summary.md");
    let stories_bin = stories().join("stories260K.bin");
    let run = qdrift(&[
        "eval",
        "--model",
        path(&stories_bin),
        "--schemes",
        "int8",
        "--prompts",
        "4",
        "--horizons",
        "4",
        "--resamples",
        "100",
        "--backend",
        "cpu",
        "--gate",
        path(&thresholds),
        "--summary-md",
        path(&summary),
        "--out",
        path(&dir.path().join("drift")),
    ]);
    assert_eq!(code(&run), 0, "{}", stderr(&run));
    let md = std::fs::read_to_string(&summary).expect("the summary is written");
    assert!(md.contains("int8"), "{md}");
}

/// A named pipe or a symbolic-link loop inside a `--variant` folder is refused before the
/// reference runs (the folder is hashed and opened when the variants are checked).
#[test]
fn a_hostile_variant_folder_is_refused_before_any_work() {
    let dir = tempfile::tempdir().expect("tempdir");
    let qwen3 = tiny_arch("qwen3");
    for (i, plant) in ["fifo", "loop"].iter().enumerate() {
        let variant = copy_of("qwen3", &dir.path().join(format!("variant{i}")));
        if *plant == "fifo" {
            let made = Command::new("mkfifo").arg(variant.join("pipe")).status().expect("mkfifo runs");
            assert!(made.success());
        } else {
            std::os::unix::fs::symlink(variant.join("b"), variant.join("a")).expect("link");
            std::os::unix::fs::symlink(variant.join("a"), variant.join("b")).expect("link");
        }
        let out = dir.path().join(format!("drift{i}"));
        let run = qdrift(&eval_args(&qwen3, &variant, &out));
        let err = stderr(&run);
        assert_eq!(code(&run), 2, "{plant}: {err}");
        assert!(!err.contains("generating"), "{plant}: refused before the reference ran: {err}");
    }
}

/// A long-context config with a long prompt, within every documented limit: the prompt pass's
/// attention scores and masks grow with the prompt's square, and the request check counts them
/// (Qwen3's q/k norms run Burn's attention even on the CPU backend), so the run is refused in one
/// line instead of aborting on a 236 GB allocation. (Run under a
/// 16 GB address-space limit, so that a regression aborts rather than exhausting the machine.)
#[test]
fn a_long_prompt_is_planned_with_its_square() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = copy_of("qwen3", &dir.path().join("qwen3"));
    let config = model.join("config.json");
    let mut json: serde_json::Value = serde_json::from_slice(&std::fs::read(&config).expect("read")).expect("JSON");
    json["max_position_embeddings"] = serde_json::json!(1 << 20);
    std::fs::write(&config, serde_json::to_vec(&json).expect("JSON")).expect("write");
    let words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "and", "runs"];
    let text: String =
        (0..200_000usize).map(|i| words[(i * i + 7 * i + i / 5) % words.len()]).collect::<Vec<_>>().join(" ");
    let set = dir.path().join("long.jsonl");
    let line = serde_json::json!({ "id": "long", "prompt": &text[..480_000] });
    std::fs::write(&set, format!("{line}\n")).expect("write");
    let out = dir.path().join("drift");
    let command = "ulimit -v 16000000; exec \"$0\" eval --model \"$1\" --eval-set \"$2\" --schemes int8 --prompts 1 \
                   --horizons 1 --backend cpu --out \"$3\"";
    let run = Command::new("bash")
        .args(["-c", command, env!("CARGO_BIN_EXE_qdrift"), path(&model), path(&set), path(&out)])
        .output()
        .expect("bash runs");
    let err = stderr(&run);
    assert_eq!(code(&run), 2, "a request too large to run: {err}");
    assert!(err.contains("attention scores for every pair of its positions"), "the request check refuses it: {err}");
    assert!(!out.exists());
}

/// A mistyped flag gets the one it probably meant (clap's suggestion), exit 2.
#[test]
fn a_mistyped_flag_gets_a_suggestion() {
    let run = qdrift(&["eval", "--modle", "x", "--out", "y"]);
    let err = stderr(&run);
    assert_eq!(run.status.code(), Some(2), "{err}");
    assert!(err.contains("similar argument exists: '--model'"), "{err}");
}

/// `--phase-times` names every phase of a run, not only the total: loading and planning, prefill,
/// decode, teacher forcing, quantizing the next variant, and the reports.
#[test]
fn phase_times_name_every_phase() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stories_bin = stories().join("stories260K.bin");
    let run = quick_eval(&stories_bin, &dir.path().join("drift"), &["--phase-times"]);
    let err = stderr(&run);
    assert_eq!(code(&run), 0, "{err}");
    let table = &err[err.find("phase times:\n").expect("the table")..];
    let phases = [
        "load and plan",
        "prefill",
        "decode",
        "teacher forcing and reductions",
        "quantize and build the next variant",
        "summary and reports",
        "total",
    ];
    for phase in phases {
        let line =
            table.lines().find(|l| l.trim_start().starts_with(phase)).unwrap_or_else(|| panic!("{phase}: {table}"));
        assert!(line.contains(" s"), "{line}");
    }
    // Each phase's share, all of them together the whole run (to the table's rounding).
    let shares: f64 = table
        .lines()
        .filter_map(|l| l.trim_end().strip_suffix('%'))
        .map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).expect("a share"))
        .sum();
    assert!((shares - 100.0).abs() < 0.5, "{shares}: {table}");
}

/// The exit-code rule is written once for the user: `qdrift --help` ends with it and README's
/// paragraph says the same five codes.
#[test]
fn the_exit_code_rule_is_in_help_and_the_readme() {
    let help = qdrift(&["--help"]);
    assert_eq!(code(&help), 0);
    let text = String::from_utf8_lossy(&help.stdout);
    let rule = text.trim_end().rsplit("\n\n").next().expect("a last paragraph");
    assert!(rule.starts_with("Exit codes, for every command: 0 pass; 1 regression"), "{text}");
    for said in ["2 unusable input or usage", "3 inconclusive", "4 environment"] {
        assert!(rule.contains(said), "{said}: {rule}");
    }
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md")).expect("README");
    assert_eq!(readme.matches("**Exit codes**, one rule for every command").count(), 1, "written once");
    let paragraph = &readme[readme.find("**Exit codes**").expect("the paragraph")..];
    let paragraph = &paragraph[..paragraph.find("\n\n").expect("its end")];
    for said in
        ["0 pass", "1 regression", "2 unusable input or usage", "3 **inconclusive**", "4 environment", "head -1"]
    {
        assert!(paragraph.contains(said), "{said}: {paragraph}");
    }
}

/// A report whose per-prompt values no run can have (a rate of 2.0 beside a 0.0, so that the
/// mean agrees), or whose pooled p99 is not its distribution's (1e308 where the table shows the
/// distribution's), is refused by every command that reads reports: `gate`, `compare` and
/// `thresholds suggest`, exit 2 in one line naming the value.
#[test]
fn an_impossible_report_is_refused_by_every_command_that_reads_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let committed = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../reports/stories260K/report.json");
    let edited = |name: &str, edit: &dyn Fn(&mut serde_json::Value)| -> PathBuf {
        let mut report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&committed).expect("the committed report")).expect("JSON");
        let variants = report["variants"].as_array_mut().expect("variants");
        edit(&mut variants.iter_mut().find(|v| v["name"] == "int8").expect("int8")["horizons"]);
        let file = dir.path().join(name);
        std::fs::write(&file, serde_json::to_vec(&report).expect("JSON")).expect("write");
        file
    };
    let rate = edited("rate.json", &|h| {
        let values = &mut h[0]["per_prompt"]["token_match_rate"];
        assert_eq!((values[0].as_f64(), values[1].as_f64()), (Some(1.0), Some(1.0)), "{values}");
        values[0] = 2.0.into();
        values[1] = 0.0.into();
    });
    let p99 = edited("p99.json", &|h| {
        h[1]["kld_reverse_p99"]["mean"] = 1e308.into();
        h[1]["kld_reverse_p99"]["ci95"] = serde_json::json!([1e308, 1e308]);
    });
    let thresholds = dir.path().join("t.toml");
    std::fs::write(&thresholds, "[variant.int8]\n\"kld@10\" = { max = 1.0 }\n").expect("write");
    let out = dir.path().join("suggested.toml");
    let cases = [
        (&rate, "per_prompt.token_match_rate value 0 = 2.0, not ∈ [0, 1] at horizon 10"),
        (&p99, "kld_reverse_p99 = 1e308, but kld_reverse's p99 over the same positions is"),
    ];
    for (report, says) in cases {
        let report = path(report);
        let commands: [Vec<&str>; 3] = [
            vec!["gate", "--report", report, "--thresholds", path(&thresholds)],
            vec!["compare", report, report, "--variant-a", "int8", "--variant-b", "int4-g128"],
            vec!["thresholds", "suggest", report, "--out", path(&out)],
        ];
        for args in commands {
            let run = qdrift(&args);
            let err = stderr(&run);
            assert_eq!(code(&run), 2, "{args:?}: {err}");
            assert!(err.contains(says), "{args:?}: {err}");
            assert!(run.stdout.is_empty(), "{args:?}: nothing but the error");
        }
        assert!(!out.exists(), "nothing suggested");
    }
}

/// `--backend wgpu`: the first stderr line names the adapter and its kind, and a software
/// rasterizer (Mesa's lavapipe on a machine without a GPU) is warned of, with the slowdown
/// measured against `cpu`, before any work (the bf16 refusal that follows costs nothing);
/// `--backend auto` never picks a software adapter.
#[test]
fn a_software_adapter_is_named_warned_of_and_never_picked_by_auto() {
    let stories_bin = stories().join("stories260K.bin");
    let base = ["generate", "--model", path(&stories_bin), "--prompt", "Tom", "--max-new-tokens", "2"];
    let run = qdrift(&[&base[..], &["--backend", "wgpu", "--dtype", "bf16"]].concat());
    let err = stderr(&run);
    assert_eq!(code(&run), 2, "bf16 on wgpu is a request no adapter can meet: {err}");
    assert!(!err.contains("flex"), "{err}");
    let mut lines = err.lines();
    let first = lines.next().unwrap_or_default();
    assert!(first.starts_with("qdrift: wgpu: "), "{err}");
    let software = first.contains("(software rasterizer, CPU)");
    assert!(software || first.contains("(GPU: "), "the adapter's kind: {first}");
    let second = lines.next().unwrap_or_default();
    if software {
        assert!(second.starts_with("qdrift: warning: ") && second.contains("is a software rasterizer"), "{err}");
        assert!(second.contains("6 min 0 s on it, 2 s with --backend cpu"), "the measured slowdown: {second}");
    } else {
        assert!(second.starts_with("qdrift: error:"), "no warning on a GPU: {err}");
    }
    let auto = qdrift(&base);
    let err = stderr(&auto);
    assert_eq!(code(&auto), 0, "{err}");
    let first = err.lines().next().unwrap_or_default();
    assert!(!first.contains("software rasterizer") && !err.contains("qdrift: warning:"), "{err}");
    // wgpu takes the best adapter there is: a software one means there is no hardware GPU.
    if software {
        assert!(first.starts_with("qdrift: cpu: CPU ("), "{err}");
        assert!(first.contains("no hardware GPU adapter (") && first.contains("Cpu)"), "names what it saw: {first}");
    }
}
