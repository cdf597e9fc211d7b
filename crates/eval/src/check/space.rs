//! The disk space an evaluation will write, planned before any model is built: the reports in
//! `--out` (a shard's part instead, for `--shard`), the saved reference (`--save-reference`) and
//! the log-probability dump (`--dump-logprobs`), each sized from the plan as its writer writes
//! it, summed per filesystem and checked against that filesystem's free space
//! ([`qdrift_io::free_space`]), so that a run whose results would not fit is refused at once, not
//! when it writes them after hours.
//!
//! Each size is an upper bound of what its writer writes:
//! - the dump (`persist/dump.rs`): a JSON line per scored model (the noise floor, unless it comes from a
//!   `--reference` store, and each variant), prompt and position of the reference's text, with
//!   both models' log-probabilities over the vocabulary, each an f64 printed in at most 24
//!   characters (a typical one takes 18 or 19);
//! - the store (`persist/store.rs`): the continuations (u32), the hidden states (the compute dtype's bytes
//!   per element) or the compact top-K statistics, the noise floor's traces, the seal, and a
//!   manifest bounded per section and per prompt id;
//! - the reports: a bound per model, per horizon and prompt, per position of the longest horizon
//!   and per quantized tensor, far above what the example reports take; a part adds every
//!   model's traces to it.
//!
//! **Invariant: a planned size is never below what its writer writes (tested on a real run's
//! files), and nothing here reads or writes a file.**

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::tensor::DType;
use qdrift_io::{FreeSpace, IoError};
use qdrift_load::ModelArch;

use crate::check::config::EvalConfig;
use crate::check::config::VariantSpec;
use crate::check::plan::{KlMode, Plan};
use crate::error::EvalError;
use crate::inputs::prompts::EncodedPrompts;

/// Most characters of an f64 as `serde_json` prints it (`-1.2345678901234567e-100`), plus the
/// comma after it.
const DUMP_NUMBER_BYTES: u64 = 25;

/// A dump line's keys, brackets and punctuation (`{"position":`, `,"ref_logprobs":[`, …) and its
/// three integers at their widest, without the variant's name and the numbers.
const DUMP_LINE_BYTES: u64 = 82 + 20 + 20 + 10;

/// Bytes per position of one trace in a store or a part (`container::write_traces`): two u32
/// tokens, seven f32 fields, `top1` and the top-K agreement (`TOP_K + 1` bytes).
const TRACE_BYTES: u64 = 2 * 4 + 7 * 4 + 1 + (qdrift_score::agreement::TOP_K as u64 + 1);

/// The sections of a trace list without routing (`container::TRACE_SECTIONS`) and with it.
const TRACE_SECTIONS: u64 = 11;
const ROUTING_SECTIONS: u64 = 5;

/// A section's entry in a pretty-printed manifest at its widest: name, type, three dimensions,
/// offset and length.
const SECTION_JSON_BYTES: u64 = 320;

/// The rest of a manifest or part header: format, version, the key's hashes and settings.
const MANIFEST_BYTES: u64 = 4096;

/// A report's bounds (report.json, report.md and report.html together): fixed, per model, per
/// horizon and prompt of a model, per position of its longest horizon, per quantized tensor.
const REPORT_BYTES: u64 = 256 << 10;
const REPORT_MODEL_BYTES: u64 = 64 << 10;
const REPORT_PROMPT_BYTES: u64 = 1 << 10;
const REPORT_POSITION_BYTES: u64 = 256;
const REPORT_TENSOR_BYTES: u64 = 256;

/// One output a run will write: the flag that names it, where, and at most how many bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PlannedOutput {
    /// `--out`, `--save-reference` or `--dump-logprobs`.
    pub(crate) flag: &'static str,
    /// Where it goes (a folder or a file, existing or not).
    pub(crate) path: PathBuf,
    /// The most it will take.
    pub(crate) bytes: u64,
}

/// Refuses the plan when its outputs would not fit the free space of their filesystems.
///
/// # Errors
/// [`EvalError::DiskSpace`].
pub(crate) fn check_space(
    cfg: &EvalConfig,
    plan: &Plan,
    arch: &ModelArch,
    prompts: &EncodedPrompts<'_>,
) -> Result<(), EvalError> {
    let ids: Vec<&str> = prompts.chosen().iter().map(|p| p.id.as_str()).collect();
    check_free(&planned_outputs(cfg, plan, arch, &ids), qdrift_io::free_space)
}

/// What the run `cfg` with `plan` on a model of `arch` writes: its reports into
/// [`EvalConfig::reports`] (or its part, when sharded), its store and its dump, when asked for.
/// `ids` are the prompts' ids.
pub(crate) fn planned_outputs(cfg: &EvalConfig, plan: &Plan, arch: &ModelArch, ids: &[&str]) -> Vec<PlannedOutput> {
    let ids_bytes: u64 = ids.iter().map(|id| json_len(id) + 8).sum();
    let mut outputs = Vec::new();
    if let Some(dir) = &cfg.reports {
        let bytes = report_bytes(cfg, plan, arch, ids_bytes).saturating_add(if plan.shard.is_some() {
            part_trace_bytes(cfg, plan, arch)
        } else {
            0
        });
        outputs.push(PlannedOutput { flag: "--out", path: dir.clone(), bytes });
    }
    if let Some(dir) = &cfg.save_reference {
        outputs.push(PlannedOutput {
            flag: "--save-reference",
            path: dir.clone(),
            bytes: store_bytes(plan, arch, ids_bytes),
        });
    }
    if let Some(file) = &cfg.dump_logprobs {
        outputs.push(PlannedOutput { flag: "--dump-logprobs", path: file.clone(), bytes: dump_bytes(cfg, plan, arch) });
    }
    outputs
}

/// Refuses `outputs` when those on one filesystem (`free` says which, and its space) together
/// need more than it has, naming them, their size and the space. An output whose filesystem
/// cannot be queried is not checked: its writer will say what is wrong there.
///
/// # Errors
/// [`EvalError::DiskSpace`] for the first filesystem short of space.
pub(crate) fn check_free(
    outputs: &[PlannedOutput],
    free: impl Fn(&Path) -> Result<FreeSpace, IoError>,
) -> Result<(), EvalError> {
    let mut by_device: BTreeMap<u64, (u64, Vec<&PlannedOutput>)> = BTreeMap::new();
    let mut order = Vec::new();
    for output in outputs {
        let Ok(space) = free(&output.path) else { continue };
        let (available, on_it) = by_device.entry(space.device).or_insert_with(|| {
            order.push(space.device);
            (space.available, Vec::new())
        });
        *available = (*available).min(space.available);
        on_it.push(output);
    }
    for device in order {
        let (available, on_it) = &by_device[&device];
        let need = on_it.iter().fold(0u64, |sum, o| sum.saturating_add(o.bytes));
        if need > *available {
            return Err(EvalError::DiskSpace(short_of_space(on_it, need, *available)));
        }
    }
    Ok(())
}

/// `--save-reference DIR: needs about 1.2 GiB, 300 MiB free on its filesystem`, or for several
/// outputs on one filesystem `A and B: need about … together, … free on their filesystem`.
fn short_of_space(on_it: &[&PlannedOutput], need: u64, available: u64) -> String {
    let names: Vec<String> = on_it.iter().map(|o| format!("{} {}", o.flag, o.path.display())).collect();
    match names.as_slice() {
        [one] => format!("{one}: needs about {}, {} free on its filesystem", human(need), human(available)),
        _ => format!(
            "{}: need about {} together, {} free on their filesystem",
            names.join(" and "),
            human(need),
            human(available)
        ),
    }
}

/// Bytes in binary units: `300 MiB`, `1.2 GiB` (one decimal below 10 of a unit).
fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 || value >= 10.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// The models a run reports on: the noise floor and every variant.
fn models(cfg: &EvalConfig) -> u64 {
    cfg.variants.len() as u64 + 1
}

/// Positions of every prompt of the plan: prompts × the longest horizon.
fn positions(plan: &Plan) -> u64 {
    (plan.prompts.len() as u64).saturating_mul(plan.longest() as u64)
}

/// The reports' bound (see [`REPORT_BYTES`]); `ids_bytes` for the prompt ids they list.
fn report_bytes(cfg: &EvalConfig, plan: &Plan, arch: &ModelArch, ids_bytes: u64) -> u64 {
    let experts = arch.moe.as_ref().map_or(0, |m| m.n_experts as u64 + 1);
    let tensors = arch.n_layers as u64 * (7 + 3 * experts) + 2;
    let cells = (plan.horizons.len() as u64).saturating_mul(plan.prompts.len() as u64);
    let per_model = REPORT_MODEL_BYTES
        .saturating_add(cells.saturating_mul(REPORT_PROMPT_BYTES))
        .saturating_add((plan.longest() as u64).saturating_mul(REPORT_POSITION_BYTES))
        .saturating_add(tensors * REPORT_TENSOR_BYTES);
    REPORT_BYTES.saturating_add(ids_bytes).saturating_add(models(cfg).saturating_mul(per_model))
}

/// One trace list's bytes for the plan's prompts (routing included for a model with experts),
/// and its sections.
fn traces_bytes(plan: &Plan, arch: &ModelArch) -> (u64, u64) {
    let mut bytes = positions(plan).saturating_mul(TRACE_BYTES);
    let mut sections = TRACE_SECTIONS;
    if arch.moe.is_some() {
        // Four bytes per layer and position (shared experts and top-1, on both texts), and the
        // layer list.
        bytes = bytes.saturating_add(positions(plan).saturating_mul(4 * arch.n_layers as u64));
        bytes = bytes.saturating_add(4 * (arch.n_layers as u64 + 2));
        sections += ROUTING_SECTIONS;
    }
    (bytes, sections)
}

/// What a part adds to the reports' bound: every model's traces and their sections.
fn part_trace_bytes(cfg: &EvalConfig, plan: &Plan, arch: &ModelArch) -> u64 {
    let (bytes, sections) = traces_bytes(plan, arch);
    models(cfg).saturating_mul(bytes.saturating_add((sections + 1) * SECTION_JSON_BYTES))
}

/// The saved reference: continuations, what scoring keeps of the reference's pass on them, the
/// noise floor's traces, the seal and the manifest.
fn store_bytes(plan: &Plan, arch: &ModelArch, ids_bytes: u64) -> u64 {
    let n = positions(plan);
    let (side, side_sections) = match plan.kl {
        KlMode::Exact => {
            let element = if plan.dtype == DType::F32 { 4 } else { 2 };
            let batches = plan.prompts.len().div_ceil(plan.batch_size().max(1)) as u64;
            // Position 0 alone, then chunks of `plan.chunk` (`store::hidden_grid`).
            let chunks = 1 + (plan.longest().saturating_sub(1)).div_ceil(plan.chunk.max(1)) as u64;
            (n.saturating_mul(arch.dim as u64 * element), batches.saturating_mul(chunks))
        }
        // top_ids and top_logp (k each), tail_logp, entropy, logp_of_token, argmax.
        KlMode::Compact { k } => (n.saturating_mul(8 * k as u64 + 16), 6),
    };
    let (traces, trace_sections) = traces_bytes(plan, arch);
    let sections = 1 + side_sections.saturating_add(trace_sections);
    let manifest = MANIFEST_BYTES.saturating_add(ids_bytes).saturating_add(sections.saturating_mul(SECTION_JSON_BYTES));
    n.saturating_mul(4).saturating_add(side).saturating_add(traces).saturating_add(32).saturating_add(manifest)
}

/// The log-probability dump: a line per scored model, prompt and position.
fn dump_bytes(cfg: &EvalConfig, plan: &Plan, arch: &ModelArch) -> u64 {
    let numbers = (2 * arch.vocab_size as u64).saturating_mul(DUMP_NUMBER_BYTES);
    let noise_floor = cfg.reference_store.is_none().then_some(&VariantSpec::NoiseFloor);
    noise_floor
        .into_iter()
        .chain(&cfg.variants)
        .map(|v| {
            let line = DUMP_LINE_BYTES + json_len(&v.name(cfg.dtype)) + numbers;
            positions(plan).saturating_mul(line)
        })
        .fold(0, u64::saturating_add)
}

/// Bytes of `s` as a JSON string, quotes included.
fn json_len(s: &str) -> u64 {
    serde_json::to_string(s).map_or(6 * s.len() as u64 + 2, |j| j.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(flag: &'static str, path: &str, bytes: u64) -> PlannedOutput {
        PlannedOutput { flag, path: PathBuf::from(path), bytes }
    }

    /// Free space by path prefix: `/a` and `/b` on device 1 with 1 GiB, `/c` on device 2 with
    /// 300 MiB.
    fn fake(path: &Path) -> Result<FreeSpace, IoError> {
        Ok(if path.starts_with("/c") {
            FreeSpace { device: 2, available: 300 << 20 }
        } else {
            FreeSpace { device: 1, available: 1 << 30 }
        })
    }

    #[test]
    fn an_output_past_its_filesystems_free_space_is_refused_in_one_line() {
        let big = output("--save-reference", "/c/store", 1288 << 20);
        let e = check_free(&[output("--out", "/a/out", 1 << 20), big], fake).expect_err("too big").to_string();
        assert_eq!(e, "--save-reference /c/store: needs about 1.3 GiB, 300 MiB free on its filesystem");
        assert!(check_free(&[output("--save-reference", "/c/store", 300 << 20)], fake).is_ok(), "exactly fits");
    }

    #[test]
    fn outputs_on_one_filesystem_share_its_space() {
        let store = output("--save-reference", "/a/store", 600 << 20);
        let dump = output("--dump-logprobs", "/b/dump.jsonl", 600 << 20);
        assert!(check_free(std::slice::from_ref(&store), fake).is_ok());
        assert!(check_free(std::slice::from_ref(&dump), fake).is_ok());
        let e = check_free(&[store, dump, output("--out", "/c/out", 1 << 20)], fake).expect_err("together").to_string();
        assert_eq!(
            e,
            "--save-reference /a/store and --dump-logprobs /b/dump.jsonl: need about 1.2 GiB together, 1.0 GiB free \
             on their filesystem"
        );
    }

    #[test]
    fn a_filesystem_that_cannot_be_queried_is_not_checked() {
        let unknown = |p: &Path| {
            if p.starts_with("/x") {
                Err(IoError::Read {
                    path: p.to_path_buf(),
                    what: "free space",
                    source: std::io::ErrorKind::Other.into(),
                })
            } else {
                fake(p)
            }
        };
        assert!(check_free(&[output("--out", "/x/out", u64::MAX)], unknown).is_ok());
        assert!(
            check_free(&[output("--out", "/x/out", 1), output("--dump-logprobs", "/c/d", 1 << 30)], unknown).is_err()
        );
    }

    /// stories260K in the shared models folder (`QDRIFT_SHARED` overrides where that is).
    fn stories() -> PathBuf {
        std::env::var_os("QDRIFT_SHARED")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"))
            .join("models/stories260K")
    }

    /// A small evaluation of stories260K on the CPU writing into `dir`: 3 prompts in batches of
    /// 2, horizons 5 and 40, chunks of 8, int8.
    fn small_run(dir: &Path) -> EvalConfig {
        let mut cfg = EvalConfig::new(stories().join("stories260K.bin"));
        cfg.tokenizer = Some(stories().join("tok512.bin"));
        (cfg.prompts, cfg.horizons, cfg.batch_size, cfg.chunk, cfg.resamples) = (Some(3), vec![5, 40], Some(2), 8, 50);
        cfg.backend = qdrift_generate::BackendChoice::Cpu;
        cfg.variants = vec![VariantSpec::Scheme("int8".parse().expect("int8"))];
        cfg.save_reference = Some(dir.join("store"));
        cfg.reports = Some(dir.join("out"));
        cfg
    }

    /// The run's plan and prompt ids, made as [`crate::evaluate_any`] makes them.
    fn planned(cfg: &EvalConfig) -> Vec<PlannedOutput> {
        let loaded = qdrift_load::open_model(&cfg.model, cfg.tokenizer.as_deref()).expect("stories260K loads");
        let set = crate::EvalSet::built_in("stories").expect("stories set");
        let prompts = crate::inputs::prompts::encode_prompts(&loaded, &set, cfg.prompts, false).expect("prompts");
        let device = crate::check::plan::eval_device(cfg.backend, cfg.dump_logprobs.is_some()).expect("cpu");
        let arch = qdrift_load::WeightSource::arch(&loaded.model);
        let horizons = cfg.horizons.clone();
        let plan = Plan::new(cfg, horizons, arch, prompts.tokens.clone(), device).expect("plan");
        let ids: Vec<&str> = prompts.chosen().iter().map(|p| p.id.as_str()).collect();
        planned_outputs(cfg, &plan, arch, &ids)
    }

    /// Bytes of a file, or of every file under a folder.
    fn bytes_under(path: &Path) -> u64 {
        if path.is_file() {
            return std::fs::metadata(path).expect("metadata").len();
        }
        std::fs::read_dir(path).expect("lists").map(|e| bytes_under(&e.expect("entry").path())).sum()
    }

    /// Runs `cfg`, writes its reports as the CLI does, and compares each planned size with the
    /// bytes written: never below, and for the store and the dump within twice of them.
    fn planned_against_written(cfg: &EvalConfig) {
        let planned = planned(cfg);
        let report = crate::evaluate(cfg, &mut |_| {}).expect("the small run");
        let out = cfg.reports.as_deref().expect("reports");
        std::fs::create_dir(out).expect("out");
        report.write(&out.join("report.json")).expect("report.json");
        let html = qdrift_report::render_html_gated(&report, None).expect("html");
        std::fs::write(out.join("report.html"), html).expect("report.html");
        std::fs::write(out.join("report.md"), qdrift_report::render_markdown_gated(&report, None)).expect("md");
        assert_eq!(planned.len(), 2 + usize::from(cfg.dump_logprobs.is_some()));
        for p in planned {
            let written = bytes_under(&p.path);
            assert!(p.bytes >= written, "{}: planned {} < written {written}", p.flag, p.bytes);
            if p.flag != "--out" {
                assert!(p.bytes <= 2 * written, "{}: planned {} > 2 × written {written}", p.flag, p.bytes);
            }
        }
    }

    /// The exact KL's store (hidden states in f16) and the dump.
    #[test]
    fn planned_sizes_bound_a_small_runs_store_dump_and_reports() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut cfg = small_run(dir.path());
        cfg.dump_logprobs = Some(dir.path().join("logprobs.jsonl"));
        planned_against_written(&cfg);
    }

    /// The compact top-K store, of an f32 reference (whose noise floor computes in f16).
    #[test]
    fn planned_sizes_bound_a_compact_store() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut cfg = small_run(dir.path());
        (cfg.reference_top_k, cfg.dtype) = (Some(8), DType::F32);
        planned_against_written(&cfg);
    }

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(human(512), "512 bytes");
        assert_eq!(human(300 << 20), "300 MiB");
        assert_eq!(human((12 << 30) / 10), "1.2 GiB");
        assert_eq!(human(u64::MAX), "16777216 TiB");
    }
}
