//! `qdrift eval`.

use std::error::Error;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use burn::tensor::DType;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use qdrift_eval::{
    DEFAULT_EVAL_SET_RULE, EvalConfig, Evaluated, OutputDir, Part, Progress, Shard, VariantSpec, built_in_names,
    check_auto, evaluate_any, evaluate_auto, merge, path_check,
};
use qdrift_generate::BackendChoice;
use qdrift_io::{PathCheck, write_atomic};
use qdrift_quantize::QuantizeOptions;
use qdrift_report::{
    GateError, GateOutcome, Profile, Report, Thresholds, finish_gate, render_html_gated, render_markdown_gated,
    render_summary, render_summary_gated,
};

use crate::args::{SchemeList, SchemeListParser};
use crate::exit::Failure;
use crate::progress::{PhaseClock, PlainProgress, lock};

/// Arguments of `qdrift eval`.
#[derive(Args)]
pub struct EvalArgs {
    /// The reference checkpoint (its weights rounded to FP16 are the reference).
    #[arg(long)]
    model: PathBuf,
    /// Tokenizer file, when not found beside the model.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    // Help built from the built-in sets and the default's rule, so it cannot go stale.
    #[arg(long, help = eval_set_help())]
    eval_set: Option<PathBuf>,
    /// Variants built from the reference, comma-separated, each `WEIGHTS[+a-ACT][+kv-KV]`: a
    /// weight scheme, then optionally dynamic activation quantization (`+a-int8`, `+a-fp8`,
    /// `+a-fp8-g128` per token and group of 128 inputs, …)
    /// and KV-cache rounding (`+kv-q8_0`, `+kv-fp8-e4m3`, …); `w8a8-int8`, `w8a8-fp8` are
    /// shorthands. `--schemes` with no value runs none (only the `--variant` checkpoints).
    #[arg(long, num_args = 0.., value_parser = SchemeListParser, default_value = "int8,fp8-e4m3,int4-g128")]
    schemes: Vec<SchemeList>,
    /// Another checkpoint of the same architecture and tokenizer to compare (repeatable):
    /// llama2.c, GGUF, or a Hugging Face folder, also quantized (GPTQ, AWQ, compressed-tensors,
    /// FP8: dequantized on load; a dynamic activation quantization its config declares is
    /// applied at run time, block FP8's per token and group of its block width). Named in the
    /// report after its file stem (`a/model-q4_k_m.gguf` is `model-q4_k_m`), or `NAME=PATH` names
    /// it; the report records its SHA-256 (a folder's: of its file list with each file's hash).
    #[arg(long, value_name = "[NAME=]PATH", value_parser = parse_variant)]
    variant: Vec<(Option<String>, PathBuf)>,
    /// Generated-token horizons, comma-separated [default: 10,100,1000; with --reference, the
    /// store's].
    #[arg(long, value_delimiter = ',')]
    horizons: Option<Vec<usize>>,
    /// Where the models run.
    #[arg(long, default_value = "auto", value_parser = crate::args::backend_parser())]
    backend: BackendChoice,
    /// The reference's compute precision; the noise floor runs at the other.
    #[arg(long, default_value = "f16", value_parser = crate::args::dtype_parser())]
    dtype: DType,
    /// Use the first N prompts of the eval set (default: all; with --reference, the store's).
    /// `auto` (with --gate and --max-prompts): run again with more prompts until no gated check
    /// is inconclusive or --max-prompts is reached; the report is the last round's, exactly what
    /// `--prompts P` writes for its P.
    #[arg(long, value_name = "N|auto", value_parser = parse_prompts)]
    prompts: Option<Prompts>,
    /// With `--prompts auto`: the most prompts a round may use.
    #[arg(long, value_name = "N", requires = "prompts")]
    max_prompts: Option<usize>,
    /// Seed of the bootstrap resampling [default: 0; with --reference, the seed of the run that
    /// saved it].
    #[arg(long)]
    seed: Option<u64>,
    #[arg(long, help = crate::args::batch_size_help())]
    batch_size: Option<usize>,
    /// Bootstrap resamples per interval (at most 1000000).
    #[arg(long, default_value_t = 2000)]
    resamples: usize,
    /// Also quantize the token embedding (and a head tied to it).
    #[arg(long)]
    quantize_embeddings: bool,
    /// Also quantize an untied output layer.
    #[arg(long)]
    quantize_head: bool,
    /// Also quantize the routers of a mixture of experts (`mlp.gate`); by default they stay at
    /// reference precision, as llm-compressor and vLLM leave them.
    #[arg(long)]
    quantize_router: bool,
    /// Compute each variant's KL divergence against the reference's top K log-probabilities
    /// per position plus one tail bucket: a lower bound of the exact KL (the report gives K and
    /// the tail mass) from K + 5 numbers per position. Default: the exact KL over the whole
    /// vocabulary (the reference's logits, or its final hidden states, kept in memory when they
    /// fit 256 MiB; else the reference runs again beside each variant). A K at least the
    /// vocabulary size, or --dump-logprobs, means the exact KL.
    #[arg(long)]
    reference_top_k: Option<usize>,
    /// Save the reference's continuations, what scoring keeps of its pass on them and the noise
    /// floor's traces to this folder (versioned, checksummed, written atomically), for later
    /// runs with --reference.
    #[arg(long, conflicts_with = "reference")]
    save_reference: Option<PathBuf>,
    /// Use a reference saved with --save-reference instead of running the reference's
    /// generation and the noise floor: the run pays only for its variants. Refused, naming the
    /// field, unless model, tokenizer, eval set, prompts, dtype, horizons, backend, batch size,
    /// KL mode and qdrift version are the ones it was saved with.
    #[arg(long)]
    reference: Option<PathBuf>,
    /// Evaluate one shard of the run, INDEX/COUNT (0 ≤ INDEX < COUNT): batches INDEX,
    /// INDEX + COUNT, … of the whole prompt list (cut exactly as the unsharded run cuts them);
    /// --out receives a part (part.json, traces.bin) instead of a report. `qdrift merge` makes
    /// the report from all parts, byte-identical to the unsharded run's.
    #[arg(long)]
    shard: Option<Shard>,
    /// Write both models' full log-probabilities at every teacher-forced position to this JSONL
    /// file (large; for independent checks).
    #[arg(long)]
    dump_logprobs: Option<PathBuf>,
    /// Output folder: report.json, report.md and report.html, written together when the run
    /// succeeds (a previous report there is replaced; nothing is written on failure). Locked
    /// while the run lasts: a second run on the same folder is refused.
    #[arg(long)]
    out: PathBuf,
    /// Run even when the longest prompt plus the longest horizon exceeds 8 × the model's trained
    /// context (such runs take very long).
    #[arg(long)]
    allow_long: bool,
    /// Compare a --variant checkpoint that is not a quantization of the reference (another
    /// architecture or block structure, with the same tokenizer). Without it such a variant is
    /// refused before any work, naming the first difference (exit 2); with it the report names
    /// the difference at the top, since its numbers measure another model.
    #[arg(long)]
    allow_different_model: bool,
    /// Run `qdrift gate` with these thresholds on the new report; the exit code is the gate's (0
    /// every check passes, 1 one fails, 3 none fails but one is inconclusive: its 95% interval
    /// straddles the threshold); a run that cannot be gated exits 2 (unusable thresholds or
    /// input) or 4 (the machine: device, memory, disk), so that a CI job tells a regression from
    /// a broken configuration. `default`: the built-in profile at the run's longest horizon
    /// (`qdrift thresholds show default` prints it with each check's reason; a file named
    /// default is ./default).
    #[arg(long, value_name = "FILE|default")]
    gate: Option<PathBuf>,
    /// With --gate: also write the checks as JUnit XML.
    #[arg(long, requires = "gate")]
    junit: Option<PathBuf>,
    /// With --gate: also write the verdict as Markdown (per variant: its gate verdict, the checks
    /// that did not pass, and one line of plain words), e.g. `--summary-md "$GITHUB_STEP_SUMMARY"`.
    #[arg(long, requires = "gate")]
    summary_md: Option<PathBuf>,
    /// Print on stderr, at the end, the wall time of each phase of the run (load and plan,
    /// prefill, decode, teacher forcing with its reductions, quantizing and building variants,
    /// summary and reports), from the progress events.
    #[arg(long)]
    phase_times: bool,
}

/// `--eval-set`'s help: the built-in sets and the default, from the code that defines them.
fn eval_set_help() -> String {
    format!(
        "Eval set: a JSONL file of {{\"id\", \"prompt\"}}, or a built-in set ({}). Default: {DEFAULT_EVAL_SET_RULE}",
        built_in_names().join(", ")
    )
}

/// An error's message with the staging folder's paths as the user named them (`--out`), keeping
/// the error's exit code.
fn in_user_paths<E: Into<Box<dyn Error>>>(output: &OutputDir) -> impl Fn(E) -> Failure + '_ {
    move |e| {
        let e: Box<dyn Error> = e.into();
        Failure::from_error(&*e, output.user_paths(&e.to_string()))
    }
}

/// `--prompts`: a count, or `auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Prompts {
    /// The first N prompts of the eval set.
    Count(usize),
    /// As many as the gate needs, up to `--max-prompts` ([`evaluate_auto`]).
    Auto,
}

fn parse_prompts(value: &str) -> Result<Prompts, String> {
    if value == "auto" {
        return Ok(Prompts::Auto);
    }
    match value.parse::<usize>() {
        Ok(0) | Err(_) => Err(format!("{value:?} is not a positive prompt count or `auto`")),
        Ok(n) => Ok(Prompts::Count(n)),
    }
}

/// Refuses `--max-prompts` without `--prompts auto` and `--prompts auto` without it; returns the
/// cap of an automatic run (what else it needs, [`check_auto`], is checked on the configuration).
fn auto_cap(args: &EvalArgs) -> Result<Option<usize>, Box<dyn Error>> {
    if args.prompts != Some(Prompts::Auto) {
        if args.max_prompts.is_some() {
            return Err("--max-prompts is for --prompts auto; give --prompts N for a fixed count".into());
        }
        return Ok(None);
    }
    let max = args.max_prompts.ok_or("--prompts auto needs --max-prompts N, the most prompts a round may use")?;
    Ok(Some(max))
}

/// Runs `qdrift eval`; with `--gate`, returns the gate's exit code.
///
/// Order: the thresholds are read, every input and output path checked (the output rule,
/// [`path_check`]) and the output folder locked and staged before anything is loaded; [`evaluate_any`] checks the options and the thresholds against the run before it loads the
/// model; the reports (and a JUnit file inside `--out`) are written to the staging folder and
/// moved into `--out` together ([`OutputDir`]).
pub fn run(args: EvalArgs) -> Result<Option<ExitCode>, Box<dyn Error>> {
    if args.schemes.iter().all(|list| list.0.is_empty()) && args.variant.is_empty() {
        return Err("--schemes names no scheme and no --variant is given: nothing to compare with the reference \
                    (name schemes, --schemes int8, or checkpoints, --variant FILE)"
            .into());
    }
    let auto = auto_cap(&args)?;
    // `--gate default` names a built-in profile, not a file.
    let profile = args.gate.as_deref().and_then(Profile::given_as);
    // Refuse unusable thresholds before an evaluation that may take hours.
    let thresholds = match (&args.gate, profile) {
        (Some(t), None) => Some((t.clone(), Thresholds::read(t)?)),
        _ => None,
    };
    let mut cfg = config(&args, thresholds)?;
    // A profile's checks are at the run's horizons, known once the configuration is.
    if let Some(p) = profile {
        cfg.gate = Some((PathBuf::from(p.name), p.thresholds(&cfg.horizons)?));
    }
    if let Some(max) = auto {
        check_auto(&cfg, max)?;
    }
    // The output rule, before the lock is taken and long before any work.
    let mut paths = path_check(&cfg).output_folder("--out", &args.out, false);
    if let Some(j) = &args.junit {
        paths = paths.output_file("--junit", j);
    }
    if let Some(m) = &args.summary_md {
        paths = paths.output_file("--summary-md", m);
    }
    paths.check()?;
    // What runs, first (the process keeps this device for the run).
    let device = qdrift_generate::select_device(args.backend)?;
    eprintln!("qdrift: {}", device.announce());
    if let Some(warning) = device.software_warning() {
        eprintln!("qdrift: warning: {warning}");
    }
    let output = OutputDir::prepare(&args.out)?;
    if let Some(pid) = output.recovered() {
        eprintln!(
            "qdrift: note: a previous run on {} (process {pid}) ended without cleaning up; its lock and staging files are removed",
            args.out.display()
        );
    }
    // A dump inside --out is staged with the reports and moved in with them.
    cfg.dump_logprobs = args.dump_logprobs.as_deref().map(|d| output.staged(d).unwrap_or_else(|| d.to_path_buf()));
    cfg.reports = Some(output.staging().to_path_buf());
    let clock = std::sync::Mutex::new(PhaseClock::new());
    let (evaluated, unsaved) = split_unsaved(match auto {
        Some(max) => evaluate_auto(&cfg, max, &mut |round| evaluate_with_progress(round, &clock), &mut |note| {
            eprintln!("qdrift: --prompts auto: {note}");
        })
        .map_err(Into::into),
        None => evaluate_with_progress(&cfg, &clock).map_err(Into::into),
    });
    let evaluated = evaluated.map_err(in_user_paths(&output))?;
    // A store that could not be written costs nothing else: the reports are written, then the
    // error is.
    let unsaved = unsaved.map(|e| {
        let message = output.user_paths(&e.to_string());
        Failure::from_error(
            &e,
            format!("{message} (the report was made and written; only the saved reference is missing)"),
        )
    });
    let report = match evaluated {
        Evaluated::Report(report) => report,
        Evaluated::Part(part) => {
            lock(&clock).enter("write the part");
            part.write(output.staging()).map_err(in_user_paths(&output))?;
            output.commit()?;
            println!("part {}: {} (merge all parts with `qdrift merge`)", part.shard(), args.out.display());
            if args.phase_times {
                eprint!("{}", lock(&clock).finish());
            }
            return Ok(None);
        }
    };
    lock(&clock).enter("summary and reports");
    let path = output.staging().join("report.json");
    report.write(&path).map_err(in_user_paths(&output))?;
    // Gated, the gate checks the report as written (the numbers `qdrift gate` on it sees), once:
    // the Markdown and HTML open with its verdict, and it prints its lines and sets the exit code.
    let gated = cfg.gate.as_ref().map(|(_, thresholds)| {
        Report::read(&path).map_err(GateError::from).and_then(|written| {
            let outcome = qdrift_report::gate(&written, thresholds)?;
            Ok((written, outcome))
        })
    });
    let outcome = gated.as_ref().and_then(|g| g.as_ref().ok()).map(|(_, o)| o);
    write_renderings(&report, outcome, &output).map_err(in_user_paths(&output))?;
    // A JUnit file inside --out is staged with the reports.
    let gate_run = gated.as_ref().map(|g| {
        let junit = args.junit.as_deref().map(|j| output.staged(j).unwrap_or_else(|| j.to_path_buf()));
        let summary = args.summary_md.as_deref().map(|m| output.staged(m).unwrap_or_else(|| m.to_path_buf()));
        finish_gate(g.as_ref().map(|(r, o)| (r, o)), junit.as_deref(), summary.as_deref())
    });
    output.commit()?;
    // Printed once every file is in place: a reader that closes the pipe early (`| head -1`)
    // ends the process by SIGPIPE, after which nothing is cleaned up or written.
    print!("{}", render_summary_gated(&report, outcome));
    let code = gate_run.map(|run| {
        if let Some(p) = profile {
            print!("{}", p.announce(&report.workload.horizons));
        }
        print!("{}", run.stdout);
        eprint!("{}", run.stderr);
        ExitCode::from(run.exit_code)
    });
    println!("reports: {} (.md, .html)", args.out.join("report.json").display());
    if args.phase_times {
        eprint!("{}", lock(&clock).finish());
    }
    match unsaved {
        Some(e) => Err(e.into()),
        None => Ok(code),
    }
}

/// An evaluation's outcome with a store that could not be written taken apart: the report it
/// carries, and the store's error.
fn split_unsaved(
    result: Result<Evaluated, Box<dyn Error>>,
) -> (Result<Evaluated, Box<dyn Error>>, Option<qdrift_eval::EvalError>) {
    match result.map_err(|e| e.downcast::<qdrift_eval::EvalError>()) {
        Ok(evaluated) => (Ok(evaluated), None),
        Err(Ok(e)) => match *e {
            qdrift_eval::EvalError::ReferenceNotSaved { report, source } => {
                (Ok(Evaluated::Report(report)), Some(*source))
            }
            other => (Err(other.into()), None),
        },
        Err(Err(other)) => (Err(other), None),
    }
}

/// Writes report.json, report.md and report.html into `output`'s staging folder.
fn write_reports(report: &Report, output: &OutputDir) -> Result<(), Box<dyn Error>> {
    report.write(&output.staging().join("report.json"))?;
    write_renderings(report, None, output)
}

/// Writes report.md and report.html into `output`'s staging folder, opening with `gate`'s
/// verdict when the run was gated.
fn write_renderings(report: &Report, gate: Option<&GateOutcome>, output: &OutputDir) -> Result<(), Box<dyn Error>> {
    write_atomic(&output.staging().join("report.md"), render_markdown_gated(report, gate).as_bytes())?;
    write_atomic(&output.staging().join("report.html"), render_html_gated(report, gate)?.as_bytes())?;
    Ok(())
}

/// `--variant [NAME=]PATH`: a path that exists is a path, whatever it holds; otherwise the text
/// before the first `=` names the variant when it is a name (not empty, no `/`) and the rest is
/// the path.
fn parse_variant(s: &str) -> Result<(Option<String>, PathBuf), String> {
    if std::path::Path::new(s).exists() {
        return Ok((None, PathBuf::from(s)));
    }
    match s.split_once('=') {
        // A name the report cannot show (control characters, `..`) is refused by the evaluation's check.
        Some((name, path)) if !name.is_empty() && !name.contains('/') => {
            if path.is_empty() {
                return Err(format!("{name}=: no path after the name"));
            }
            Ok((Some(name.to_string()), PathBuf::from(path)))
        }
        _ => Ok((None, PathBuf::from(s))),
    }
}

/// Arguments of `qdrift merge`.
#[derive(Args)]
pub struct MergeArgs {
    /// The parts, one folder per shard (`qdrift eval --shard I/N --out PART`), in any order.
    #[arg(required = true)]
    parts: Vec<PathBuf>,
    /// Output folder: report.json, report.md and report.html, written together (as `qdrift
    /// eval` writes them).
    #[arg(long)]
    out: PathBuf,
}

/// Runs `qdrift merge`: reads every part, checks they are the shards of one run, and writes the
/// report.
pub fn run_merge(args: MergeArgs) -> Result<(), Box<dyn Error>> {
    let paths = args.parts.iter().fold(PathCheck::new(), |c, p| c.input("part", p));
    paths.output_folder("--out", &args.out, false).check()?;
    let output = OutputDir::prepare(&args.out)?;
    let parts = args.parts.iter().map(|p| Part::read(p)).collect::<Result<Vec<_>, _>>()?;
    let report = merge(parts)?;
    write_reports(&report, &output).map_err(in_user_paths(&output))?;
    // Committed before anything is printed, as `qdrift eval` does (a closed pipe ends the process).
    output.commit()?;
    print!("{}", render_summary(&report));
    println!("reports: {} (.md, .html)", args.out.join("report.json").display());
    Ok(())
}

/// The horizons of a run that names none (and has no saved reference to take them from).
pub(crate) const DEFAULT_HORIZONS: [usize; 3] = [10, 100, 1000];

/// The evaluation's configuration from the arguments. With `--reference STORE`, the prompt count,
/// horizons, batch size and seed not given are the store's, so that reusing a store repeats
/// nothing; a value given that differs from the store's is refused with the store's other
/// mismatches when the run reads it.
fn config(args: &EvalArgs, gate: Option<(PathBuf, Thresholds)>) -> Result<EvalConfig, Box<dyn Error>> {
    let stored = args.reference.as_deref().map(qdrift_eval::store_settings).transpose()?;
    let mut cfg = EvalConfig::new(args.model.clone());
    cfg.tokenizer = args.tokenizer.clone();
    cfg.eval_set = args.eval_set.clone();
    cfg.variants = args.schemes.iter().flat_map(|list| list.0.iter().cloned()).map(VariantSpec::Scheme).collect();
    cfg.variants.extend(args.variant.iter().cloned().map(|(name, path)| VariantSpec::Checkpoint { path, name }));
    cfg.horizons = match (&args.horizons, &stored) {
        (Some(h), _) => h.clone(),
        (None, Some(s)) => s.horizons.clone(),
        (None, None) => DEFAULT_HORIZONS.to_vec(),
    };
    cfg.backend = args.backend;
    cfg.dtype = args.dtype;
    let given = match args.prompts {
        Some(Prompts::Count(n)) => Some(n),
        Some(Prompts::Auto) | None => None,
    };
    cfg.prompts = given.or(stored.as_ref().map(|s| s.prompts));
    cfg.seed = args.seed.or(stored.as_ref().and_then(|s| s.seed)).unwrap_or(0);
    cfg.batch_size = args.batch_size.or(stored.as_ref().map(|s| s.batch_size));
    cfg.resamples = args.resamples;
    cfg.quantize = QuantizeOptions {
        quantize_embeddings: args.quantize_embeddings,
        quantize_head: args.quantize_head,
        quantize_router: args.quantize_router,
    };
    cfg.dump_logprobs = args.dump_logprobs.clone();
    cfg.reference_top_k = args.reference_top_k;
    cfg.save_reference = args.save_reference.clone();
    cfg.reference_store = args.reference.clone();
    cfg.shard = args.shard;
    cfg.allow_long = args.allow_long;
    cfg.allow_different_model = args.allow_different_model;
    cfg.gate = gate;
    Ok(cfg)
}

/// [`evaluate_any`] with a progress bar on stderr, or, when stderr is not a terminal (a CI log),
/// plain lines ([`PlainProgress`]), so that a long run is never silent.
fn evaluate_with_progress(
    cfg: &EvalConfig,
    clock: &std::sync::Mutex<PhaseClock>,
) -> Result<Evaluated, qdrift_eval::EvalError> {
    let models = 2 + cfg.variants.len();
    let mut plain = (!std::io::stderr().is_terminal()).then(|| PlainProgress::new(models));
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>18} [{bar:30}] {pos}/{len} tokens  {msg} ETA {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let report = evaluate_any(cfg, &mut |p| {
        lock(clock).observe(&p);
        if let Some(plain) = &mut plain {
            if let Some(line) = plain.line(&p) {
                eprintln!("{line}");
            }
        } else {
            match p {
                Progress::Generating { model, tokens } => {
                    bar.reset();
                    bar.set_length(tokens);
                    bar.set_prefix(model.to_string());
                    bar.set_message("generating");
                }
                Progress::Generated { tokens } => bar.inc(tokens),
                Progress::Scoring { model } => {
                    bar.set_prefix(model.to_string());
                    bar.set_message("scoring");
                }
                Progress::Warning { message } => bar.suspend(|| eprintln!("qdrift: warning: {message}")),
                Progress::Done { .. } => {}
            }
        }
        if let Progress::Done { .. } = p {
            qdrift_model::release_free_memory();
        }
    });
    bar.finish_and_clear();
    report
}
