//! `qdrift`: how far a quantized language model drifts from its FP16 reference.
//!
//! The binary is thin: it parses arguments, calls the pipeline crates, and turns their typed
//! errors into one line on stderr and a non-zero exit code.
//!
//! One module per command, on floors: a module imports only modules on a floor below its own
//! (`cargo xtask cycles` checks it; `main.rs` dispatches to all of them).
//!
//! | floor | contents |
//! |---|---|
//! | `thresholds.rs`, `generate.rs` | `thresholds` (its horizons are `eval`'s defaults); `generate` (its `--scheme` is `quantize`'s parser) |
//! | `eval.rs`, `quantize.rs`, `compare.rs`, `gate.rs`, `inspect.rs`, `bandwidth.rs` | `eval` and `merge`; `quantize`; `compare`; `gate`; `inspect`; the hidden `bandwidth` |
//! | `progress.rs`, `exit.rs`, `args.rs` | what `eval` prints while it runs; the exit-code rule; shared argument parsers |

mod args;
mod bandwidth;
mod compare;
mod eval;
mod exit;
mod gate;
mod generate;
mod inspect;
mod progress;
mod quantize;
mod thresholds;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Examples of every command, shown under its `--help` (each line that starts with `qdrift` is
/// parsed by a test, so none goes stale).
const EXAMPLES: &str = "Examples:
  qdrift eval --model models/base.gguf --schemes int8,int4-g128 --out drift
  qdrift gate --report drift/report.json --thresholds thresholds.toml
  qdrift compare last-release/report.json drift/report.json --max-worse kld@100=0.002
  qdrift quantize --model models/base --scheme q4_k --format gguf --out base-q4_k.gguf
  qdrift inspect --model models/base.gguf
Every command: qdrift help COMMAND";

const EVAL_EXAMPLES: &str = "Examples:
  # Variants made from the reference, then a checkpoint you were given, gated in CI:
  qdrift eval --model models/base --schemes int8,w8a8-fp8,int4-g128 --out drift
  qdrift eval --model models/base --schemes --variant models/base-awq --out drift --gate thresholds.toml --junit drift/gate.xml
  # Save the reference once, reuse it for every later artifact:
  qdrift eval --model models/base.gguf --schemes int8 --save-reference ref --out drift
  qdrift eval --model models/base.gguf --schemes --variant base-q4_k_m.gguf --reference ref --out drift
  # Split a long run over machines, then merge the parts:
  qdrift eval --model models/base.gguf --shard 1/2 --out part1";

const MERGE_EXAMPLES: &str = "Examples:
  qdrift merge part1 part2 --out drift";

const GATE_EXAMPLES: &str = "Examples:
  qdrift gate --report drift/report.json --thresholds thresholds.toml --junit gate.xml
  qdrift gate --report drift/report.json --thresholds default
  qdrift gate --report drift/report.json --thresholds thresholds.toml --summary-md \"$GITHUB_STEP_SUMMARY\"";

const COMPARE_EXAMPLES: &str = "Examples:
  qdrift compare release-1/report.json release-2/report.json --max-worse kld@100=0.005 --out compared
  qdrift compare drift/report.json drift/report.json --variant-a int8 --variant-b int4-g128";

const THRESHOLDS_EXAMPLES: &str = "Examples:
  qdrift thresholds suggest drift/report.json --margin 0.1 --out thresholds.toml
  # One variant of a known-good report, as the candidate a CI run gates:
  qdrift thresholds suggest drift/report.json --variant int4-g128 --as candidate --out thresholds.toml
  qdrift thresholds suggest drift/report.json --metrics kld,token_match_rate --horizons 100,1000
  # The built-in profile that --thresholds default checks, each check with its reason:
  qdrift thresholds show default --report drift/report.json";

const INSPECT_EXAMPLES: &str = "Examples:
  qdrift inspect --model models/base.gguf
  qdrift inspect --model synthetic:llama-8b --seq-len 4096 --batch 8 --json";

const GENERATE_EXAMPLES: &str = "Examples:
  qdrift generate --model models/base.gguf --prompt \"Once upon a time\" --max-new-tokens 40
  qdrift generate --model models/base --prompt \"The capital of France is\" --prompt \"2 + 2 =\" --max-new-tokens 8 --dtype f16";

const QUANTIZE_EXAMPLES: &str = "Examples:
  qdrift quantize --model models/base --scheme int4-g128 --out base-int4.safetensors
  qdrift quantize --model models/base --scheme q4_k --format gguf --out base-q4_k.gguf";

/// Quantization-divergence evaluation: how far a quantized language model drifts from its
/// reference over 10, 100 and 1000 generated tokens, with confidence intervals, as JSON, Markdown
/// and HTML reports and a CI gate.
#[derive(Parser)]
#[command(name = "qdrift", version, about, long_about = None, after_help = format!("{EXAMPLES}\n\n{}", exit::RULE))]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Evaluate how far quantized variants drift from the FP16 reference over 10, 100 and 1000
    /// generated tokens; writes OUT/report.json.
    #[command(after_help = EVAL_EXAMPLES)]
    Eval(Box<eval::EvalArgs>),
    /// Make the report of a sharded evaluation (`qdrift eval --shard I/N`) from all its parts;
    /// byte-identical to the unsharded run's report.
    #[command(after_help = MERGE_EXAMPLES)]
    Merge(eval::MergeArgs),
    /// Check a report against thresholds: exit 0 if every check passes, 1 if any fails, 3 if none
    /// fails but some are inconclusive (the 95% interval straddles the threshold: too few
    /// prompts to tell), 2 on unusable input.
    #[command(after_help = GATE_EXAMPLES)]
    Gate(gate::GateArgs),
    /// Architecture, parameters, dtypes, and memory and FLOPs accounting of a model.
    #[command(after_help = INSPECT_EXAMPLES)]
    Inspect(inspect::InspectArgs),
    /// Greedy generation from a model, for one or more prompts (in batches; on the CPU backend,
    /// the batches decode together as one, the layers spread over the cores, unless stopping at
    /// EOS, when they run side by side, one per core).
    #[command(after_help = GENERATE_EXAMPLES)]
    Generate(generate::GenerateArgs),
    /// Quantize a model's weights (any format generate reads) with one scheme, print per-tensor
    /// error statistics, and write the result as safetensors or as a GGUF file llama.cpp runs.
    #[command(after_help = QUANTIZE_EXAMPLES)]
    Quantize(quantize::QuantizeArgs),
    /// Two variants of the same reference, prompts and seed, head to head: per metric the paired
    /// difference B − A with its bootstrap interval, the sign test over prompts, and which is
    /// closer to the reference; exit 0, 1 or 3 on --max-worse checks as `qdrift gate` does.
    #[command(after_help = COMPARE_EXAMPLES)]
    Compare(compare::CompareArgs),
    /// Thresholds files for `qdrift gate`: `suggest` writes one from a known-good report, `show`
    /// prints a built-in profile (`default`) with each check's reason.
    #[command(after_help = THRESHOLDS_EXAMPLES)]
    Thresholds(thresholds::ThresholdsArgs),
    /// The device's copy bandwidth as one JSON line (for `cargo xtask bench gpu`).
    #[command(hide = true)]
    Bandwidth(bandwidth::BandwidthArgs),
    /// Renders a chat-template request from stdin to stdout: the child process, its memory
    /// capped, in which `eval` renders a model's chat template (`qdrift_eval::ChatSandbox`).
    #[command(hide = true, name = RENDER_CHAT_TEMPLATE)]
    RenderChatTemplate,
}

/// The hidden subcommand of [`Command::RenderChatTemplate`].
const RENDER_CHAT_TEMPLATE: &str = "render-chat-template";

/// qdrift never shows a window, but looking for a GPU loads the Vulkan and EGL drivers, and
/// their Wayland code (libwayland's `wl_display_connect`) prints `error: XDG_RUNTIME_DIR is
/// invalid or not set in the environment.` on a machine without a desktop session (a CI runner,
/// a container), twice per run. With no Wayland display named, name one by an absolute path that
/// does not exist: libwayland then fails to connect without printing, and without
/// `XDG_RUNTIME_DIR` there was no display to connect to anyway.
fn quiet_display_probe() {
    let unset = |name: &str| std::env::var_os(name).is_none();
    if unset("XDG_RUNTIME_DIR") && unset("WAYLAND_DISPLAY") && unset("WAYLAND_SOCKET") {
        // SAFETY: the first thing main does, before any thread exists, so nothing reads the
        // environment while it changes.
        unsafe { std::env::set_var("WAYLAND_DISPLAY", "/nonexistent/qdrift-needs-no-display") }
    }
}

fn main() -> ExitCode {
    exit::quiet_sigpipe();
    quiet_display_probe();
    let cli = Cli::parse();
    // A model's chat template renders in a child process whose memory is capped.
    if let Ok(program) = std::env::current_exe() {
        qdrift_eval::set_chat_sandbox(qdrift_eval::ChatSandbox { program, args: vec![RENDER_CHAT_TEMPLATE.into()] });
    }
    let result = match cli.command {
        Command::Gate(args) => return gate::run(&args),
        Command::Compare(args) => return compare::run(&args),
        Command::Inspect(args) => inspect::run(args),
        Command::Eval(args) => match eval::run(*args) {
            Ok(Some(code)) => return code,
            Ok(None) => Ok(()),
            Err(e) => Err(e),
        },
        Command::Merge(args) => eval::run_merge(args),
        Command::Generate(args) => generate::run(args),
        Command::Quantize(args) => quantize::run(args),
        Command::Thresholds(args) => thresholds::run(args),
        Command::Bandwidth(args) => bandwidth::run(&args),
        Command::RenderChatTemplate => {
            qdrift_eval::serve_chat_request(std::io::stdin().lock(), std::io::stdout().lock()).map_err(Into::into)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One bounded line, whatever a hostile input put in the message.
            eprintln!("qdrift: error: {}", qdrift_io::message_line(&e.to_string()));
            ExitCode::from(exit::code_of(&*e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// `line` split as a shell would split these examples: on spaces, double quotes grouping.
    fn words(line: &str) -> Vec<String> {
        let (mut out, mut word, mut quoted) = (Vec::new(), String::new(), false);
        for c in line.chars() {
            match c {
                '"' => quoted = !quoted,
                ' ' if !quoted => {
                    if !word.is_empty() {
                        out.push(std::mem::take(&mut word));
                    }
                }
                c => word.push(c),
            }
        }
        if !word.is_empty() {
            out.push(word);
        }
        out
    }

    /// Every flag that takes one of a fixed set of values lists them in `--help` (clap prints a
    /// "Possible values" list for each), `--dtype` and `--backend` included.
    #[test]
    fn every_enum_flag_lists_its_values() {
        let mut cli = Cli::command();
        for name in ["eval", "generate"] {
            let sub = cli.find_subcommand_mut(name).unwrap_or_else(|| panic!("{name} is a command"));
            for flag in ["dtype", "backend"] {
                let arg = sub.get_arguments().find(|a| a.get_id() == flag).unwrap_or_else(|| panic!("{name} --{flag}"));
                assert!(!arg.get_possible_values().is_empty(), "{name} --{flag} lists no values");
            }
        }
        for sub in cli.get_subcommands_mut() {
            let name = sub.get_name().to_string();
            let help = sub.render_long_help().to_string();
            let listed: Vec<(String, Vec<String>)> = sub
                .get_arguments()
                .filter(|a| !a.get_possible_values().is_empty() && !a.is_hide_set())
                .map(|a| {
                    (a.get_id().to_string(), a.get_possible_values().iter().map(|v| v.get_name().to_string()).collect())
                })
                .collect();
            for (arg, values) in listed {
                for v in values {
                    assert!(help.contains(&format!("- {v}")), "{name} --{arg}: {v} not listed in --help");
                }
            }
        }
    }

    /// Every command's `--help` has examples, and every example parses as the command it shows.
    #[test]
    fn every_command_has_examples_that_parse() {
        let examples = [
            ("qdrift", EXAMPLES),
            ("eval", EVAL_EXAMPLES),
            ("merge", MERGE_EXAMPLES),
            ("gate", GATE_EXAMPLES),
            ("compare", COMPARE_EXAMPLES),
            ("inspect", INSPECT_EXAMPLES),
            ("generate", GENERATE_EXAMPLES),
            ("quantize", QUANTIZE_EXAMPLES),
            ("thresholds", THRESHOLDS_EXAMPLES),
        ];
        let mut cli = Cli::command();
        for (name, text) in examples {
            let help = if name == "qdrift" {
                cli.render_long_help().to_string()
            } else {
                let sub = cli.find_subcommand_mut(name).unwrap_or_else(|| panic!("{name} is a command"));
                sub.render_long_help().to_string()
            };
            assert!(help.contains(text), "{name} --help shows its examples");
            let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| l.starts_with("qdrift ")).collect();
            assert!(!lines.is_empty(), "{name}: at least one example");
            for line in lines {
                if let Err(e) = Cli::try_parse_from(words(line)) {
                    panic!("{name}: {line:?} does not parse: {e}");
                }
            }
        }
        let public = cli.get_subcommands().filter(|c| !c.is_hide_set() && c.get_name() != "help").count();
        assert_eq!(public, examples.len() - 1, "every public command has examples");
    }
}
