//! The readers under test, each with its seeds and its mutator.

use std::path::Path;
use std::sync::OnceLock;

use qdrift_eval::EvalSet;
use qdrift_load::write::{WriteDtype, write_gguf, write_hf_folder};
use qdrift_load::{Llama2cTokenizer, Tokenizer, byte_tokenizer, open_model, synthetic_model};
use qdrift_quantize::{HfLayout, round_to_fp16_reference, write_hf_quantized};
use qdrift_report::{Report, Thresholds, gate, render_markdown};

use super::{Outcome, Rng, Target, formats, mutate};

/// Every target, in the order `cargo xtask fuzz` runs them.
pub fn targets() -> &'static [&'static dyn Target] {
    &[
        &Gguf,
        &Safetensors,
        &HfConfig,
        &HfQuantTensors,
        &HfQuantConfig,
        &HfTokenizer,
        &Llama2c,
        &Llama2cTok,
        &EvalSetJsonl,
        &ThresholdsToml,
        &ReportJson,
        &super::sealed::PartTarget,
        &super::sealed::StoreTarget,
    ]
}

fn refused(e: impl std::fmt::Display) -> Outcome {
    Outcome::Refused(e.to_string())
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
}

fn copy_in(from: &Path, work: &Path) -> Result<Vec<u8>, String> {
    let bytes = read(from)?;
    let name = from.file_name().ok_or_else(|| format!("{}: no file name", from.display()))?;
    std::fs::write(work.join(name), &bytes).map_err(|e| format!("{}: {e}", work.display()))?;
    Ok(bytes)
}

/// Runs a loaded model's tokenizer on awkward text, as the evaluation would on a prompt.
fn use_tokenizer(t: &dyn Tokenizer) {
    let ids = t.encode("Once upon a time, \u{1F980} \u{0} é\n\t<s>");
    let _ = t.decode(&ids);
}

/// The `tiny` synthetic preset (2 layers, dim 32, vocab 320) with its byte-level tokenizer: a
/// valid model small enough for thousands of reads a second.
fn tiny() -> Result<(qdrift_load::HostModel, Llama2cTokenizer), String> {
    let loaded = synthetic_model("tiny", 7).map_err(|e| e.to_string())?;
    let tokenizer = byte_tokenizer(loaded.model.arch.vocab_size)?;
    Ok((loaded.model, tokenizer))
}

/// Opens a model file or folder and runs its tokenizer (as `qdrift eval` would).
fn open(path: &Path, tokenizer: Option<&Path>) -> Outcome {
    match open_model(path, tokenizer) {
        Ok(m) => {
            use_tokenizer(m.tokenizer.as_ref());
            Outcome::Accepted
        }
        Err(e) => refused(e),
    }
}

struct Gguf;

impl Target for Gguf {
    fn name(&self) -> &'static str {
        "gguf"
    }
    fn input_name(&self) -> &'static str {
        "model.gguf"
    }
    fn prepare(&self, work: &Path) -> Result<Vec<Vec<u8>>, String> {
        let (model, tok) = tiny()?;
        let mut seeds = Vec::new();
        for dtype in [WriteDtype::F32, WriteDtype::F16] {
            let path = work.join("seed.gguf");
            write_gguf(&path, &model, &tok, dtype).map_err(|e| e.to_string())?;
            seeds.push(read(&path)?);
        }
        Ok(seeds)
    }
    fn mutate(&self, rng: &mut Rng, seed: &[u8], donors: &[Vec<u8>]) -> Vec<u8> {
        formats::gguf(rng, seed, donors)
    }
    fn run(&self, input: &Path) -> Outcome {
        open(input, None)
    }
}

/// The `tiny` model as a Hugging Face folder `work/hf` (F16 weights).
fn prepare_hf(work: &Path, file: &str) -> Result<Vec<Vec<u8>>, String> {
    let (model, tok) = tiny()?;
    let dir = work.join("hf");
    write_hf_folder(&dir, &model, &tok, WriteDtype::F16).map_err(|e| e.to_string())?;
    Ok(vec![read(&dir.join(file))?])
}

struct Safetensors;

impl Target for Safetensors {
    fn name(&self) -> &'static str {
        "safetensors"
    }
    fn input_name(&self) -> &'static str {
        "hf/model.safetensors"
    }
    fn prepare(&self, work: &Path) -> Result<Vec<Vec<u8>>, String> {
        prepare_hf(work, "model.safetensors")
    }
    fn mutate(&self, rng: &mut Rng, seed: &[u8], donors: &[Vec<u8>]) -> Vec<u8> {
        formats::safetensors(rng, seed, donors)
    }
    fn run(&self, input: &Path) -> Outcome {
        open(input.parent().unwrap_or(input), None)
    }
}

struct HfConfig;

impl Target for HfConfig {
    fn name(&self) -> &'static str {
        "hf-config"
    }
    fn input_name(&self) -> &'static str {
        "hf/config.json"
    }
    fn prepare(&self, work: &Path) -> Result<Vec<Vec<u8>>, String> {
        prepare_hf(work, "config.json")
    }
    fn mutate(&self, rng: &mut Rng, seed: &[u8], donors: &[Vec<u8>]) -> Vec<u8> {
        mutate::json_document(rng, seed, donors)
    }
    fn run(&self, input: &Path) -> Outcome {
        open(input.parent().unwrap_or(input), None)
    }
}

/// The `tiny` model (FP16) as a quantized Hugging Face folder `work/{dir}` in `layout`; the seed
/// is its `file`.
fn prepare_hf_quant(work: &Path, dir: &str, layout: HfLayout, file: &str) -> Result<Vec<Vec<u8>>, String> {
    let (mut model, tok) = tiny()?;
    round_to_fp16_reference(&mut model);
    let dir = work.join(dir);
    write_hf_quantized(&dir, &model, &tok, layout).map_err(|e| e.to_string())?;
    Ok(vec![read(&dir.join(file))?])
}

/// The tensors of a GPTQ v1 folder (4 bits, asymmetric, act order: `qweight`, `qzeros`,
/// `scales`, `g_idx`).
struct HfQuantTensors;

impl Target for HfQuantTensors {
    fn name(&self) -> &'static str {
        "hf-quant"
    }
    fn input_name(&self) -> &'static str {
        "hfq/model.safetensors"
    }
    fn prepare(&self, work: &Path) -> Result<Vec<Vec<u8>>, String> {
        let layout = HfLayout::Gptq { bits: 4, group: Some(16), asym: true, act_order: true, v2: false };
        prepare_hf_quant(work, "hfq", layout, "model.safetensors")
    }
    fn mutate(&self, rng: &mut Rng, seed: &[u8], donors: &[Vec<u8>]) -> Vec<u8> {
        formats::safetensors(rng, seed, donors)
    }
    fn run(&self, input: &Path) -> Outcome {
        open(input.parent().unwrap_or(input), None)
    }
}

/// The `config.json` of a compressed-tensors folder (pack-quantized int4, asymmetric, group 16):
/// its `quantization_config` is what is mutated.
struct HfQuantConfig;

impl Target for HfQuantConfig {
    fn name(&self) -> &'static str {
        "hf-quant-config"
    }
    fn input_name(&self) -> &'static str {
        "hfqc/config.json"
    }
    fn prepare(&self, work: &Path) -> Result<Vec<Vec<u8>>, String> {
        prepare_hf_quant(work, "hfqc", HfLayout::CtPacked { bits: 4, group: 16, asym: true }, "config.json")
    }
    fn mutate(&self, rng: &mut Rng, seed: &[u8], donors: &[Vec<u8>]) -> Vec<u8> {
        mutate::json_document(rng, seed, donors)
    }
    fn run(&self, input: &Path) -> Outcome {
        open(input.parent().unwrap_or(input), None)
    }
}

struct HfTokenizer;

impl Target for HfTokenizer {
    fn name(&self) -> &'static str {
        "hf-tokenizer"
    }
    fn input_name(&self) -> &'static str {
        "hf/tokenizer.json"
    }
    fn prepare(&self, work: &Path) -> Result<Vec<Vec<u8>>, String> {
        prepare_hf(work, "tokenizer.json")
    }
    fn mutate(&self, rng: &mut Rng, seed: &[u8], donors: &[Vec<u8>]) -> Vec<u8> {
        mutate::json_document(rng, seed, donors)
    }
    fn run(&self, input: &Path) -> Outcome {
        open(input.parent().unwrap_or(input), None)
    }
}

struct Llama2c;

impl Target for Llama2c {
    fn name(&self) -> &'static str {
        "llama2c"
    }
    fn input_name(&self) -> &'static str {
        "model.bin"
    }
    fn prepare(&self, work: &Path) -> Result<Vec<Vec<u8>>, String> {
        copy_in(&crate::stories_dir().join("tok512.bin"), work)?;
        Ok(vec![read(&crate::stories_dir().join("stories260K.bin"))?])
    }
    fn mutate(&self, rng: &mut Rng, seed: &[u8], donors: &[Vec<u8>]) -> Vec<u8> {
        formats::llama2c(rng, seed, donors)
    }
    fn run(&self, input: &Path) -> Outcome {
        open(input, Some(&input.with_file_name("tok512.bin")))
    }
}

struct Llama2cTok;

impl Target for Llama2cTok {
    fn name(&self) -> &'static str {
        "tokenizer"
    }
    fn input_name(&self) -> &'static str {
        "tokenizer.bin"
    }
    fn prepare(&self, _work: &Path) -> Result<Vec<Vec<u8>>, String> {
        Ok(vec![read(&crate::stories_dir().join("tok512.bin"))?])
    }
    fn mutate(&self, rng: &mut Rng, seed: &[u8], donors: &[Vec<u8>]) -> Vec<u8> {
        formats::llama2c_tokenizer(rng, seed, donors)
    }
    fn run(&self, input: &Path) -> Outcome {
        match Llama2cTokenizer::read(input) {
            Ok(t) => {
                use_tokenizer(&t);
                let all: Vec<u32> = (0..t.vocab_size() as u32).collect();
                let _ = t.decode(&all);
                Outcome::Accepted
            }
            Err(e) => refused(e),
        }
    }
}

struct EvalSetJsonl;

/// A small eval set: the first lines of the built-in chat set plus ids and text that are valid
/// but awkward (unicode, escapes, an empty line).
const EVAL_SET_SEED: &str = concat!(
    "{\"id\": \"chat-001\", \"prompt\": \"What is the capital of Australia?\"}\n",
    "{\"id\": \"chat-002\", \"prompt\": \"How do I boil an egg so the yolk stays soft?\"}\n",
    "\n",
    "{\"id\": \"ünï\", \"prompt\": \"Tab\\there, quote \\\" and \\u00e9\"}\n",
);

impl Target for EvalSetJsonl {
    fn name(&self) -> &'static str {
        "eval-set"
    }
    fn input_name(&self) -> &'static str {
        "prompts.jsonl"
    }
    fn prepare(&self, _work: &Path) -> Result<Vec<Vec<u8>>, String> {
        let chat = EvalSet::built_in("chat").map_err(|e| e.to_string())?;
        let lines: String = chat
            .prompts
            .iter()
            .take(8)
            .map(|p| serde_json::json!({"id": p.id, "prompt": p.prompt}).to_string() + "\n")
            .collect();
        Ok(vec![EVAL_SET_SEED.as_bytes().to_vec(), lines.into_bytes()])
    }
    fn mutate(&self, rng: &mut Rng, seed: &[u8], donors: &[Vec<u8>]) -> Vec<u8> {
        jsonl(rng, seed, donors)
    }
    fn run(&self, input: &Path) -> Outcome {
        EvalSet::read(input).map_or_else(refused, |_| Outcome::Accepted)
    }
}

/// JSON Lines: one line's value edited, then text and byte edits.
fn jsonl(rng: &mut Rng, seed: &[u8], donors: &[Vec<u8>]) -> Vec<u8> {
    let mut lines: Vec<Vec<u8>> = seed.split(|b| *b == b'\n').map(<[u8]>::to_vec).collect();
    let at = rng.below(lines.len());
    let line = std::mem::take(&mut lines[at]);
    lines[at] = mutate::json_document(rng, &line, &[]);
    lines[at].retain(|b| *b != b'\n' || rng.one_in(8));
    let mut out = lines.join(&b'\n');
    mutate::generic_tail(rng, &mut out, donors, seed.len() * 4 + 4096);
    out
}

struct ThresholdsToml;

/// A thresholds file for [`sample`]: every key form the gate accepts.
const THRESHOLDS_SEED: &str = r#"[defaults]
bound = "ci"

[variant."int4-g128"]
"token_match_rate@100" = { min = 0.80 }
"kld@1000" = { max = 0.05 }
"ppl_drift_of_generated_text@1000" = { max = 1.10, bound = "point" }

[variant."*"]
"top1_agreement@10" = { min = 0.95 }
"excess_kld@100" = { max = 0.5 }

[variant."noise-floor-f32"]
"kld@10" = { min = 0.0, max = 1.0 }
"#;

/// The sample report the gate checks (built once: it has 1000-long curves).
fn sample() -> &'static Report {
    static SAMPLE: OnceLock<Report> = OnceLock::new();
    SAMPLE.get_or_init(qdrift_report::testing::sample_report)
}

impl Target for ThresholdsToml {
    fn name(&self) -> &'static str {
        "thresholds"
    }
    fn input_name(&self) -> &'static str {
        "thresholds.toml"
    }
    fn prepare(&self, _work: &Path) -> Result<Vec<Vec<u8>>, String> {
        Ok(vec![THRESHOLDS_SEED.as_bytes().to_vec()])
    }
    fn mutate(&self, rng: &mut Rng, seed: &[u8], donors: &[Vec<u8>]) -> Vec<u8> {
        let mut out = seed.to_vec();
        for _ in 0..rng.below(3) + 1 {
            mutate::text(rng, &mut out);
        }
        if rng.one_in(3) {
            mutate::bytes(rng, &mut out, donors, seed.len() * 4);
        }
        out
    }
    fn run(&self, input: &Path) -> Outcome {
        match Thresholds::read(input) {
            Ok(t) => gate(sample(), &t).map_or_else(refused, |o| {
                let _ = o.lines();
                Outcome::Accepted
            }),
            Err(e) => refused(e),
        }
    }
}

struct ReportJson;

impl Target for ReportJson {
    fn name(&self) -> &'static str {
        "report"
    }
    fn input_name(&self) -> &'static str {
        "report.json"
    }
    fn prepare(&self, _work: &Path) -> Result<Vec<Vec<u8>>, String> {
        Ok(vec![small_report()?.into_bytes()])
    }
    fn mutate(&self, rng: &mut Rng, seed: &[u8], donors: &[Vec<u8>]) -> Vec<u8> {
        mutate::json_document(rng, seed, donors)
    }
    fn run(&self, input: &Path) -> Outcome {
        match Report::read(input) {
            Ok(report) => {
                let _ = render_markdown(&report);
                if let Ok(t) = Thresholds::parse(THRESHOLDS_SEED) {
                    let _ = gate(&report, &t);
                }
                Outcome::Accepted
            }
            Err(e) => refused(e),
        }
    }
}

/// The sample report as JSON. It is used whole: cutting its curves shorter would make it a report
/// no run produces (per-position curves must be `max(horizons)` long, one id per prompt), which
/// validation refuses, so every mutation would start from an input that is refused anyway.
fn small_report() -> Result<String, String> {
    serde_json::to_string_pretty(sample()).map_err(|e| e.to_string())
}
