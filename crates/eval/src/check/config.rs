//! What `qdrift eval` configures: [`EvalConfig`] (its options, with the CLI's defaults), the
//! variants it names ([`VariantSpec`], with the checks each needs before anything loads), the
//! shard a run may be ([`Shard`]), the limits of `--shard` and `--resamples` and the eval set
//! used when none is given ([`default_eval_set`]).

use std::path::{Path, PathBuf};

use burn::tensor::DType;
use qdrift_generate::BackendChoice;
use qdrift_load::{LoadedModel, ModelArch};
use qdrift_quantize::{ActivationQuant, QuantizeOptions, Recipe};
use qdrift_report::Thresholds;

use crate::error::EvalError;
use crate::inputs::identity::report_name;
use crate::types::dtype_name;

/// What `qdrift eval` was asked to do.
#[derive(Clone, Debug)]
pub struct EvalConfig {
    /// The reference checkpoint.
    pub model: PathBuf,
    /// Its tokenizer, when not found beside it.
    pub tokenizer: Option<PathBuf>,
    /// The eval set (a JSONL file or a built-in set's name); default by model (see
    /// [`default_eval_set`]).
    pub eval_set: Option<PathBuf>,
    /// The variants, in report order, after the noise floor ([`VariantSpec::NoiseFloor`], which
    /// [`crate::evaluate`] always runs first).
    pub variants: Vec<VariantSpec>,
    /// Generated-token horizons (any order; sorted and deduplicated).
    pub horizons: Vec<usize>,
    /// Where to run.
    pub backend: BackendChoice,
    /// The reference's compute precision (`F16` or `F32`); the noise floor runs at the other.
    pub dtype: DType,
    /// Use the first `n` prompts of the set (all when `None`).
    pub prompts: Option<usize>,
    /// Seed of the bootstrap resampling.
    pub seed: u64,
    /// Prompts per batch (default: [`qdrift_generate::default_batch_size`]).
    pub batch_size: Option<usize>,
    /// Bootstrap resamples per interval.
    pub resamples: usize,
    /// Teacher-forcing chunk (positions per forward pass).
    pub chunk: usize,
    /// What the schemes quantize besides the linear layers.
    pub quantize: QuantizeOptions,
    /// Write every teacher-forced position's full log-probabilities of both models (on the
    /// reference's text) to this JSONL file, for independent checks. Large: prompts × horizon ×
    /// vocabulary × 2 numbers per variant.
    pub dump_logprobs: Option<PathBuf>,
    /// Where the reports (or a shard's part) will be written: `--out`, or the staging folder
    /// beside it that the CLI writes them to. Only for the free-space check before the run, which
    /// leaves them out when `None`.
    pub reports: Option<PathBuf>,
    /// Largest size, in bytes, of what is kept of the reference's pass on its own text across
    /// variants for the exact KL: its logits, else its final hidden states (each variant then
    /// costs one pass on that text instead of two); above it the reference runs again in
    /// lockstep with each variant. Same numbers every way.
    pub reference_logits_budget: u64,
    /// Compute each variant's KL divergence against the reference's top `k` log-probabilities
    /// per position plus one tail bucket (`--reference-top-k`), a lower bound of the exact KL
    /// that keeps `k + 5` numbers per position; `None` (the default), or a `k` that covers the
    /// vocabulary, computes the exact KL.
    pub reference_top_k: Option<usize>,
    /// Save the reference's continuations, what scoring keeps of its pass on them (its final
    /// hidden states, or its top-K statistics) and the noise floor's traces to this folder
    /// (`--save-reference`), for later runs with [`EvalConfig::reference_store`].
    pub save_reference: Option<PathBuf>,
    /// Use the reference saved in this folder (`--reference`) instead of running the reference's
    /// generation, its pass on its own text and the noise floor; refused unless it was saved
    /// under the same model, tokenizer, eval set, prompts, dtype, horizons, backend, batching,
    /// KL mode and qdrift version.
    pub reference_store: Option<PathBuf>,
    /// Evaluate only this shard's batches (`--shard INDEX/COUNT`) and produce a part for
    /// [`crate::merge`] instead of a report.
    pub shard: Option<Shard>,
    /// Run even when the longest prompt plus the longest horizon exceeds
    /// [`qdrift_generate::LONG_REQUEST_FACTOR`] × the model's trained context (`--allow-long`).
    pub allow_long: bool,
    /// Compare a checkpoint variant that is not a quantization of the reference (another
    /// architecture or block structure, the same tokenizer) instead of refusing it before the run
    /// (`--allow-different-model`); the report names the difference first ([`crate::VariantSpec`]).
    pub allow_different_model: bool,
    /// Take [`EvalConfig::prompts`] as a most: a set with fewer prompts runs them all instead of
    /// being refused (`--prompts auto`'s rounds; the report says how many ran).
    pub prompts_up_to_set: bool,
    /// The thresholds `--gate` will check the report against, and their file: checked against
    /// the variants and horizons of the run before anything is loaded, so that a thresholds file
    /// that cannot apply fails in a second, not after the evaluation.
    pub gate: Option<(PathBuf, Thresholds)>,
}

impl EvalConfig {
    /// The defaults of `qdrift eval` for a model.
    pub fn new(model: PathBuf) -> EvalConfig {
        EvalConfig {
            model,
            tokenizer: None,
            eval_set: None,
            variants: Vec::new(),
            horizons: vec![10, 100, 1000],
            backend: BackendChoice::Auto,
            dtype: DType::F16,
            prompts: None,
            seed: 0,
            batch_size: None,
            resamples: 2000,
            chunk: 64,
            quantize: QuantizeOptions::default(),
            dump_logprobs: None,
            reports: None,
            reference_logits_budget: 256 << 20,
            reference_top_k: None,
            save_reference: None,
            shard: None,
            reference_store: None,
            allow_long: false,
            allow_different_model: false,
            prompts_up_to_set: false,
            gate: None,
        }
    }
}

/// One shard of a run (`--shard INDEX/COUNT`): batches `INDEX`, `INDEX + COUNT`, … of the
/// run's batches, which are cut from the whole prompt list exactly as an unsharded run cuts
/// them, so every prompt shares its batch (and its left padding) with the same prompts and its
/// numbers are the unsharded run's bit for bit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Shard {
    /// This shard, from 0.
    pub index: usize,
    /// Shards in the run.
    pub count: usize,
}

impl std::str::FromStr for Shard {
    type Err = String;

    fn from_str(s: &str) -> Result<Shard, String> {
        let parse = |x: &str| x.trim().parse::<usize>().ok();
        match s.split_once('/').map(|(i, n)| (parse(i), parse(n))) {
            Some((Some(index), Some(count))) if count >= 1 && index < count => Ok(Shard { index, count }),
            _ => Err(format!("{s:?}: expected INDEX/COUNT with 0 ≤ INDEX < COUNT, e.g. 0/4")),
        }
    }
}

/// The most bootstrap resamples an interval may take: far beyond what any interval needs (2000 is
/// the default), and small enough that the resampled statistics fit in memory.
pub const MAX_RESAMPLES: usize = 1_000_000;

/// Most shards a run can have: every shard needs a batch, every batch a prompt, and an eval set
/// holds at most one prompt per 16 bytes of its [`qdrift_report::EVAL_SET_CAP`] (a JSONL line
/// with an `id` and a `prompt` takes more). A larger `--shard` count is refused before anything
/// is loaded.
pub const MAX_SHARDS: usize = (qdrift_report::EVAL_SET_CAP / 16) as usize;

impl Shard {
    /// The indices, in the whole list of `prompts`, of this shard's prompts: the list is cut into
    /// batches of `batch_size` (the last may be shorter) and the shard takes every `count`-th
    /// batch from its `index`. The one definition of a shard's prompts: the run selects them with
    /// it and `merge` checks a part's indices against it.
    pub fn prompt_indices(self, prompts: usize, batch_size: usize) -> impl Iterator<Item = usize> {
        let batch_size = batch_size.max(1);
        (0..prompts).filter(move |i| (i / batch_size).checked_rem(self.count) == Some(self.index))
    }

    /// Refuses a shard of a run of `batches` batches that some shard would get none of (or an
    /// index not below the count), so that every part written can be merged.
    pub fn check(self, batches: usize, batch_size: usize) -> Result<(), String> {
        if self.count == 0 || self.index >= self.count {
            return Err(format!("{self}: expected INDEX/COUNT with 0 ≤ INDEX < COUNT"));
        }
        if self.count > batches {
            return Err(format!(
                "{self}: the run has {batches} batches of up to {batch_size} prompts, so {} of the {} shards would be empty; use at most {batches} shards",
                self.count - batches,
                self.count
            ));
        }
        Ok(())
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// [`default_eval_set`]'s rule in words, for `--help`.
pub const DEFAULT_EVAL_SET_RULE: &str =
    "stories for llama2.c models (TinyStories), chat for models with a chat template, else english";

/// The eval set used when none is given: `stories` for llama2.c models (TinyStories), `chat`
/// for models with a chat template, else `english` ([`DEFAULT_EVAL_SET_RULE`]).
pub fn default_eval_set<W>(loaded: &LoadedModel<W>) -> &'static str {
    if loaded.format == qdrift_load::ModelFormat::Llama2c {
        "stories"
    } else if loaded.chat_template.is_some() {
        "chat"
    } else {
        "english"
    }
}

/// A variant to compare with the reference.
#[derive(Clone, Debug, PartialEq)]
pub enum VariantSpec {
    /// The noise floor: the reference's own FP16 weights at the other compute precision, the
    /// divergence that precision alone causes. [`crate::evaluate`] always runs it first; listing
    /// it in [`crate::EvalConfig::variants`] is refused as a duplicate.
    NoiseFloor,
    /// A quantization recipe (`WEIGHTS[+a-ACT][+kv-KV]`): its weight scheme applied to the
    /// reference's FP16 weights, its activation and KV-cache roundings at run time.
    Scheme(Recipe),
    /// Another checkpoint of the same architecture and tokenizer. A quantized Hugging Face folder
    /// runs the dynamic activation quantization its config declares: per token, per tensor, or
    /// per token and group (block FP8, `+a-fp8-gG` with the config's own G), refused before
    /// anything runs when G does not divide a linear layer's input width.
    Checkpoint {
        /// The file or folder.
        path: PathBuf,
        /// Its name in the report (`--variant NAME=PATH`); `None`: the file stem.
        name: Option<String>,
    },
}

impl VariantSpec {
    /// Its name in the report, for a reference computing at `reference_dtype`:
    /// `noise-floor-f32` (or `-f16`), the scheme's name, or the checkpoint's file stem.
    pub fn name(&self, reference_dtype: DType) -> String {
        match self {
            VariantSpec::NoiseFloor => format!("noise-floor-{}", dtype_name(other_precision(reference_dtype))),
            VariantSpec::Scheme(recipe) => recipe.to_string(),
            VariantSpec::Checkpoint { name: Some(name), .. } => name.clone(),
            VariantSpec::Checkpoint { path, name: None } => {
                path.file_stem().map_or_else(|| report_name(path), |s| s.to_string_lossy().into_owned())
            }
        }
    }

    /// Refuses a recipe whose KV-cache format does not fit the model's cache rows (a ggml block
    /// format needs `kv_heads × head_dim` to be whole blocks), or whose per-token-group
    /// activation scales do not divide a linear layer's input width, before anything runs.
    pub(crate) fn check_fits(&self, arch: &ModelArch) -> Result<(), EvalError> {
        let VariantSpec::Scheme(recipe) = self else { return Ok(()) };
        let fits = || {
            if let Some(kv) = recipe.kv_cache {
                kv.check_row(arch.n_kv_heads, arch.head_dim())?;
            }
            recipe.activations.map_or(Ok(()), |a| check_activation_widths(a, arch))
        };
        fits().map_err(|e| EvalError::Variant { variant: self.name(DType::F32), problem: e.to_string() })
    }

    /// The checkpoint's file or folder, for a checkpoint variant.
    pub(crate) fn checkpoint_path(&self) -> Option<&Path> {
        match self {
            VariantSpec::Checkpoint { path, .. } => Some(path),
            _ => None,
        }
    }

    /// Refuses a name given to a checkpoint (`--variant NAME=PATH`) that a report could not show
    /// as itself or could confuse with another model: empty or blank, `.` or `..`, with a `/`,
    /// with characters that break or reorder a line (control characters, bidirectional
    /// overrides, zero-width ones), over 100 characters, or the name of a scheme or recipe, of a
    /// compute precision or of the noise floor.
    pub(crate) fn check_given_name(&self) -> Result<(), EvalError> {
        let VariantSpec::Checkpoint { name: Some(name), .. } = self else { return Ok(()) };
        let refuse = |why: &str| {
            Err(EvalError::Option {
                option: "--variant",
                problem: format!("NAME=PATH: the name \"{}\" {why}; choose another", qdrift_io::elide(name)),
            })
        };
        if name.trim().is_empty() || name == "." || name == ".." || name.contains('/') {
            return refuse("is no name a report can show");
        }
        if qdrift_io::message_line(name) != name.as_str() {
            return refuse("holds characters that break or reorder a line on a terminal");
        }
        if name.chars().count() > 100 {
            return refuse("is longer than 100 characters");
        }
        if name.parse::<Recipe>().is_ok()
            || ["fp16", "bf16", "f16", "f32", "fp32"].contains(&name.as_str())
            || name.starts_with("noise-floor")
        {
            return refuse("is what qdrift calls a scheme, a precision or the noise floor");
        }
        Ok(())
    }

    /// Refuses a checkpoint that does not exist, before anything is loaded.
    pub(crate) fn check_exists(&self) -> Result<(), EvalError> {
        match self {
            VariantSpec::Checkpoint { path: p, .. } if !p.exists() => Err(EvalError::Variant {
                variant: p.display().to_string(),
                problem: format!("no such file or folder{}", scheme_hint(p)),
            }),
            _ => Ok(()),
        }
    }
}

/// What a `--variant` that names no file but reads as a scheme meant, after "no such file or
/// folder": `; int4-g128 is a scheme: evaluate it with --schemes int4-g128`, or the scheme
/// grammar's hint for a near miss (`int4_g128+kv-q8_0`: did you mean int4-g128?); empty for
/// anything else (a path with a folder in it is a path).
fn scheme_hint(path: &Path) -> String {
    let Some(text) = path.to_str().filter(|t| !t.contains('/')) else { return String::new() };
    match text.parse::<Recipe>() {
        Ok(recipe) => format!("; {recipe} is a scheme: evaluate it with --schemes {recipe}"),
        Err(qdrift_quantize::QuantizeError::BadRecipe { problem, .. })
            if problem.contains("(did you mean") || problem.contains("llama.cpp") =>
        {
            format!("; read as a scheme (for --schemes): {problem}")
        }
        Err(_) => String::new(),
    }
}

/// The precision the noise floor runs at: f16 for an f32 reference, f32 for an f16 or bf16 one
/// (the reference's own 16-bit weights computed without its activations' roundings).
pub(crate) fn other_precision(reference: DType) -> DType {
    if reference == DType::F32 { DType::F16 } else { DType::F32 }
}

/// Checks that `a`'s scale groups divide every linear layer's input width: `dim` (q/k/v,
/// gate/up), `heads × head_dim` (o) and `hidden_dim` (down).
pub(crate) fn check_activation_widths(
    a: ActivationQuant,
    arch: &ModelArch,
) -> Result<(), qdrift_quantize::QuantizeError> {
    [arch.dim, arch.n_heads * arch.head_dim(), arch.hidden_dim].into_iter().try_for_each(|cols| a.check_width(cols))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shard takes every COUNT-th batch from its index; every prompt is in exactly one shard.
    /// A `--variant` that is no file but a scheme, or nearly one, says how to run it; a path
    /// says only that it is missing.
    #[test]
    fn a_missing_variant_that_reads_as_a_scheme_says_so() {
        let missing = |p: &str| {
            let spec = VariantSpec::Checkpoint { name: None, path: PathBuf::from(p) };
            spec.check_exists().expect_err("missing").to_string()
        };
        let e = missing("int4-g128+kv-q8_0");
        assert!(
            e.ends_with(
                "no such file or folder; int4-g128+kv-q8_0 is a scheme: evaluate it with --schemes int4-g128+kv-q8_0"
            ),
            "{e}"
        );
        let e = missing("int4_g128");
        assert!(e.ends_with("no such file or folder; read as a scheme (for --schemes): unknown weight scheme `int4_g128` (did you mean int4-g128?)"), "{e}");
        assert!(missing("models/int4-g128").ends_with("no such file or folder"));
        assert!(missing("model-q4_k_m.gguf").ends_with("no such file or folder"));
    }

    #[test]
    fn a_shards_prompts_are_its_batches() {
        let indices = |index, count| Shard { index, count }.prompt_indices(7, 2).collect::<Vec<_>>();
        assert_eq!(indices(0, 3), [0, 1, 6]);
        assert_eq!(indices(1, 3), [2, 3]);
        assert_eq!(indices(2, 3), [4, 5]);
        assert_eq!(indices(0, 0), Vec::<usize>::new(), "a zero count selects nothing rather than dividing by 0");
    }

    #[test]
    fn a_shard_count_beyond_the_batches_is_refused() {
        assert!(Shard { index: 3, count: 4 }.check(4, 2).is_ok());
        let e = Shard { index: 0, count: 5 }.check(2, 8).expect_err("empty shards");
        assert_eq!(
            e,
            "0/5: the run has 2 batches of up to 8 prompts, so 3 of the 5 shards would be empty; use at most 2 shards"
        );
        assert!(Shard { index: 2, count: 2 }.check(4, 2).is_err());
        assert!(Shard { index: 0, count: 0 }.check(4, 2).is_err());
        assert!("0/0".parse::<Shard>().is_err() && "1/99999999999".parse::<Shard>().is_ok());
    }
}
