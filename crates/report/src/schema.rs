//! `report.json`, schema version 2 ([`SCHEMA_VERSION`]).
//!
//! The field names and nesting are the contract in the evaluation issue; fields marked *extra*
//! are additions the contract welcomes. Every statistic is computed over prompts (prompts are the
//! unit of resampling, never tokens); `ci95` is a 95% interval `[lo, hi]`. The per-horizon
//! metrics are listed once, in [`METRICS`](crate::metrics::METRICS).
//!
//! When the version changes, and when it does not, is written on [`SCHEMA_VERSION`].

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::read::REPORT_CAP;
use crate::{Estimate, HorizonMetrics, ReportError};
use qdrift_io::{read_capped, write_atomic};

/// The schema version this build writes and reads.
///
/// # When the schema version changes
///
/// The version says what a reader may rely on, so:
/// - **Adding** a metric (an entry of [`METRICS`](crate::metrics::METRICS) placed
///   [`Placement::Optional`](crate::metrics::Placement::Optional)) or an optional field (an
///   `Option`, read as `None` when absent) **keeps** the version: readers ignore keys they do not
///   know (no type here denies unknown fields, and [`HorizonMetrics`] skips unknown metrics), and
///   a report written before the addition, which lacks it, still reads (a missing optional metric
///   shows as `—` and cannot be gated).
/// - **Removing or renaming** a field or a metric, **changing its meaning or unit**, or making an
///   optional field or metric required **bumps** the version, and [`Report::read`] refuses
///   reports of any other version ([`ReportError::SchemaVersion`]).
///
/// History: 2 made [`Variant::bits_per_weight`] one figure for every variant, over the whole
/// model (in 1 a scheme's was over its quantized tensors only and a checkpoint's its file size
/// over the parameters); nothing else changed.
pub const SCHEMA_VERSION: u32 = 2;

/// A whole evaluation: the reference, the workload, and one entry per variant.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Always [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// The reference checkpoint.
    pub model: ModelInfo,
    /// The conditions of the run: what any quality or performance claim needs.
    pub workload: Workload,
    /// The reference the variants are compared with.
    pub reference: Reference,
    /// The variants, noise floor first, then in the order they were asked for.
    pub variants: Vec<Variant>,
}

/// The reference checkpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    /// The checkpoint's file (or folder) name, without the folders around it (`synthetic:NAME` for
    /// synthetic models): a report names no path of the machine that wrote it. Reports written
    /// before may hold the path as given on the command line; renderings show only its last
    /// component.
    pub path: String,
    /// SHA-256 of the checkpoint file, lowercase hex (of the weights file for a folder; empty for
    /// synthetic models).
    pub sha256: String,
    /// Architecture, e.g. `llama`.
    pub architecture: String,
    /// Parameter count (a tied embedding counted once).
    pub parameters: u64,
    /// Whether the weights are seeded random numbers with a real architecture's shapes.
    pub synthetic: bool,
    /// *extra*: the file format as the loader names it (`llama2.c`, `gguf`, `hf-safetensors`,
    /// `synthetic`).
    pub format: String,
    /// *extra*: the architecture's shapes.
    pub shape: ModelShape,
    /// *extra*: the token that ends a text the model writes, whose first position in each model's
    /// own free-running text the stopping metrics compare: the tokenizer's end-of-sequence token
    /// (for a chat model, the end of its turn), or for a llama2.c model BOS, which separates its
    /// training stories (llama2.c's `run.c` stops there). Absent when the tokenizer has none, and in
    /// older reports (added in schema 2 as an optional field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_token_id: Option<u32>,
    /// *extra*: the dtype the checkpoint stores its tensors in (`bf16`, `f16`, `f32`; for a file
    /// that mixes them each, the most frequent first: `q4_1 + f32`), beside the reference's
    /// compute dtype ([`Reference::compute_dtype`]). Absent in older reports (added in schema 2 as
    /// an optional field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_dtype: Option<String>,
}

/// *extra*: the shapes of a decoder-only transformer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelShape {
    /// Transformer blocks.
    pub layers: usize,
    /// Residual width.
    pub dim: usize,
    /// Feed-forward width.
    pub hidden_dim: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
}

/// The conditions of the run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    /// `wgpu` or `cpu`.
    pub backend: String,
    /// The adapter the backend ran on (e.g. `llvmpipe (LLVM 19.1.7, 256 bits)`).
    pub adapter: String,
    /// `f16` or `f32`: the precision the reference computes in.
    pub compute_dtype: String,
    /// Number of prompts evaluated.
    pub prompts: usize,
    /// Generated-token horizons, ascending.
    pub horizons: Vec<usize>,
    /// Prompts per batch.
    pub batch_size: usize,
    /// Seed of the bootstrap resampling, the run's only random choice (the prompts are the eval
    /// set's first `prompts`, not a random subset).
    pub seed: u64,
    /// The prompts' source.
    pub eval_set: EvalSetInfo,
    /// The qdrift version that wrote the report.
    pub qdrift_version: String,
    /// *extra*: bootstrap resamples per interval.
    pub bootstrap_resamples: usize,
    /// *extra*: whether the chat template was applied to the prompts.
    pub chat_template: bool,
    /// *extra*: whether the run quantized the routers of a mixture of experts (`mlp.gate`) with
    /// each scheme variant's weights (`--quantize-router`); `false`: they stayed at the
    /// reference's precision, as llm-compressor and vLLM leave them (always, for a dense model,
    /// which has none). A checkpoint variant's routers are as its file stores them. Absent in
    /// older reports (added in schema 2 as an optional field), which do not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantize_router: Option<bool>,
}

/// The eval set the prompts came from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EvalSetInfo {
    /// The JSONL file's name, without the folders around it (`NAME.jsonl (built in)` for a set
    /// compiled into qdrift); older reports may hold a path, shown by its last component.
    pub path: String,
    /// SHA-256 of the file, lowercase hex.
    pub sha256: String,
    /// The ids of the prompts used, in order.
    pub prompts: Vec<String>,
}

/// The reference the variants are compared with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reference {
    /// `fp16`: the checkpoint's weights rounded to FP16; `bf16` for a bf16 run: rounded to bf16.
    pub name: String,
    /// *extra*: the precision it computes in (`f16`, `bf16` or `f32`).
    pub compute_dtype: String,
    /// *extra*: bytes of its weights as run (FP16).
    pub weight_bytes: u64,
    /// *extra*: the reference's perplexity of its own continuations over their first `h` tokens,
    /// pooled over prompts (`[h, ppl]` per horizon): the denominator of
    /// `ppl_drift_of_generated_text`.
    pub self_perplexity: Vec<(usize, f64)>,
    /// *extra*: how the variants' KL divergence was computed (added in schema 1 as an optional
    /// field; older reports have none and computed it exactly).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kl: Option<KlMethod>,
}

/// How the KL divergence of every variant was computed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "method", rename_all = "snake_case")]
pub enum KlMethod {
    /// Over the full vocabulary.
    Exact,
    /// Against the reference's top-`top_k` log-probabilities per position plus one tail bucket:
    /// `Σ_top p (ln p − ln q) + p_tail ln(p_tail / q_tail)`, a lower bound of the exact KL (the
    /// log-sum inequality); the bound loses at most what the tail holds. The same merge makes
    /// the reverse KL a lower bound and the acceptance `Σ min(p, q)` an upper bound; the top-K
    /// overlaps up to `top_k`, the reference's top-1 in the variant's top-5, and every metric
    /// not computed from the distributions are exact.
    TopKTail {
        /// Tokens kept per position.
        top_k: usize,
        /// Largest tail mass `p_tail` over the reference's positions.
        tail_mass_max: f64,
        /// Mean tail mass over the reference's positions.
        tail_mass_mean: f64,
    },
}

impl KlMethod {
    /// How the KL divergences were computed, in words for a message: `exact (over the full
    /// vocabulary)` or `against the reference's top-64 log-probabilities plus a tail bucket
    /// (--reference-top-k 64): a lower bound`. `None` is an older report's, which computed them
    /// exactly.
    pub fn describe(method: Option<&KlMethod>) -> String {
        match method {
            None | Some(KlMethod::Exact) => "exact (over the full vocabulary)".to_string(),
            Some(KlMethod::TopKTail { top_k, .. }) => format!(
                "against the reference's top-{top_k} log-probabilities plus a tail bucket (--reference-top-k \
                 {top_k}): a lower bound"
            ),
        }
    }

    /// Whether two reports' KL divergences are the same measurement: both exact, or both against
    /// the same number of the reference's top tokens (the tail masses follow from the reference).
    pub fn same_measurement(a: Option<&KlMethod>, b: Option<&KlMethod>) -> bool {
        let k = |m: Option<&KlMethod>| match m {
            None | Some(KlMethod::Exact) => None,
            Some(KlMethod::TopKTail { top_k, .. }) => Some(*top_k),
        };
        k(a) == k(b)
    }
}

/// What a variant is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VariantKind {
    /// The reference weights quantized with a scheme.
    Scheme,
    /// Another checkpoint of the same architecture and tokenizer.
    Checkpoint,
    /// The reference weights run at the other compute precision: the divergence no quantization
    /// caused.
    NoiseFloor,
}

/// A file of a checkpoint folder and its SHA-256.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileHash {
    /// The name relative to the folder, `/`-separated.
    pub name: String,
    /// SHA-256 of its bytes, lowercase hex.
    pub sha256: String,
}

/// One variant and its divergence from the reference.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Variant {
    /// Unique name within the report (the scheme name, `noise-floor-f32`, or the file stem).
    pub name: String,
    /// The scheme, for `kind = scheme`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    /// What a `kind = scheme` variant quantizes, part by part (added in schema 1 as an optional
    /// field; older reports have none); for a quantized Hugging Face checkpoint, its stored weight
    /// format (`gptq 4-bit g128 v1`, ...) and the activation rounding its config declares.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recipe: Option<RecipeParts>,
    /// The checkpoint's file (or folder) name, without the folders around it, for
    /// `kind = checkpoint`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// *extra*: for `kind = checkpoint`, the SHA-256 (lowercase hex) of the file, or for a folder
    /// of its [`Variant::files`] list as `sha256sum` prints it (`HASH  NAME\n` per file, by name).
    /// Added in schema 1 as an optional field; older reports have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// *extra*: for a checkpoint folder, every regular file in it (recursively, by relative
    /// name, `/`-separated, sorted) with its SHA-256. Empty for a file and in older reports.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<FileHash>,
    /// What the variant is.
    pub kind: VariantKind,
    /// *extra*: the precision the variant computes in.
    pub compute_dtype: String,
    /// Storage bits per weight over the whole model: 8 × the bytes of its weight tensors over the
    /// weights they hold (a scheme's quantized tensors as stored, scales included, the rest at
    /// FP16, over `model.parameters`; a checkpoint's tensors as its files store them, over the
    /// values they hold, as `qdrift inspect` and llama.cpp give a file's; the noise floor 16).
    pub bits_per_weight: f64,
    /// Bytes of all weights as stored by the variant.
    pub weight_bytes: u64,
    /// Metrics over the first `h` generated tokens, one entry per horizon, ascending.
    pub horizons: Vec<HorizonMetrics>,
    /// When each prompt's free-running continuation first differs from the reference's.
    pub first_divergence: FirstDivergence,
    /// Per generated position `t` (0-based, `max(horizons)` entries), the mean over prompts.
    pub per_position: PerPosition,
    /// *extra*: KLD and top-1 agreement by the reference's entropy quartile (over all positions
    /// of the longest horizon).
    pub entropy_strata: Vec<EntropyStratum>,
    /// Error of each quantized weight tensor against the reference (empty for the noise floor).
    pub per_tensor_error: Vec<TensorError>,
    /// *extra*: for a model with experts, where the variant's expert choices differ from the
    /// reference's (added in schema 1 as an optional field; absent for a dense model and in
    /// older reports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<RoutingDrift>,
    /// *extra*: why the variant has no metrics, when it failed where the reference did not (its
    /// logits went non-finite: an FP16 overflow, with the layer, position and prompt), in one
    /// line; its horizons, curves and strata are then empty. Absent for a variant that ran (and
    /// in older reports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// *extra*: set when the variant is not a quantization of the reference (another architecture
    /// or block structure, with the same tokenizer) and was compared only because the run asked
    /// for it (`--allow-different-model`): the first difference, in words. Its numbers measure
    /// another model, and every rendering says so first. Absent otherwise (and in older reports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub different_model: Option<String>,
}

/// Where a variant's mixture-of-experts routing differs from the reference's, both models
/// teacher-forced on the reference's continuation, over the longest horizon. The per-horizon
/// means (`expert_overlap`, `routing_flip_rate` and their `_on_generated_text` twins) are
/// registry metrics; this holds what they cannot: the first flip and the split by layer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoutingDrift {
    /// Experts per mixture-of-experts layer.
    pub experts: usize,
    /// Experts each token is routed to (`k`).
    pub top_k: usize,
    /// Per prompt, the first position where the top-1 expert of any layer differs from the
    /// reference's (teacher-forced on the reference's text), with its Kaplan–Meier curve; a
    /// prompt with no flip within the longest horizon is censored there.
    pub first_flip: FirstDivergence,
    /// Per generated position `t` (`max(horizons)` entries), the mean over prompts of the share
    /// of mixture-of-experts layers whose top-1 expert differs from the reference's.
    pub flip_by_position: Vec<f64>,
    /// One entry per mixture-of-experts layer, in block order.
    pub layers: Vec<LayerRouting>,
}

/// One mixture-of-experts layer's routing drift over the longest horizon, on the reference's
/// text.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerRouting {
    /// The block, 0-based.
    pub layer: usize,
    /// Share of positions whose top-1 expert differs from the reference's: the mean over prompts
    /// with its bootstrap interval.
    pub flip_rate: Estimate,
    /// `|experts ∩ experts_ref| / k`: the mean over prompts with its bootstrap interval.
    pub expert_overlap: Estimate,
    /// The Kaplan–Meier median of the position of this layer's first flip (0-based); `None` when
    /// more than half the prompts have none within the longest horizon.
    pub first_flip_median: Option<usize>,
}

/// First-divergence positions and their Kaplan–Meier survival curve. Positions here, as
/// everywhere in `report.json`, are 0-based (0 is the first generated token); the Markdown, HTML
/// and terminal renderings show them 1-based, as their charts do.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FirstDivergence {
    /// Median first-divergence position, 0-based (the Kaplan–Meier median: `t − 1` for the
    /// smallest `t` with `S(t) ≤ 0.5`); `None` when more than half the prompts never diverge
    /// within the longest horizon.
    pub median: Option<usize>,
    /// `[t, S(t)]` at `t = 0` and at every event time: the share of prompts whose first `t`
    /// generated tokens all match the reference's (a divergence at position `p` is an event at
    /// `t = p + 1`).
    pub survival: Vec<(usize, f64)>,
    /// Prompts that never diverged within the longest horizon (censored observations).
    pub censored: usize,
    /// *extra*: each prompt's first-divergence position (the longest horizon if none).
    pub positions: Vec<usize>,
}

/// Per-position means over prompts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PerPosition {
    /// Share of prompts whose token at `t` matches the reference's.
    pub token_match: Vec<f64>,
    /// Mean teacher-forced KLD at `t`.
    pub kld: Vec<f64>,
    /// Share of prompts whose top-1 agrees at `t`.
    pub top1_agreement: Vec<f64>,
}

/// KLD and top-1 agreement over positions whose reference entropy falls in one quartile.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct EntropyStratum {
    /// Lower entropy bound in nats (inclusive).
    pub entropy_lo: f64,
    /// Upper entropy bound in nats.
    pub entropy_hi: f64,
    /// Positions in the stratum.
    pub positions: usize,
    /// Mean KLD in the stratum (`None` when empty).
    pub kld_mean: Option<f64>,
    /// Top-1 agreement in the stratum (`None` when empty).
    pub top1_agreement: Option<f64>,
}

/// A scheme variant's parts (`WEIGHTS[+a-ACT][+kv-KV]`): what it quantizes, each part by its
/// name in the grammar; `null` for a part the variant leaves at the reference's precision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecipeParts {
    /// The weight scheme (`fp16` leaves the FP16 reference's weights as they are).
    pub weights: String,
    /// Dynamic activation quantization of every linear layer's input (`int8`, `fp8`,
    /// `fp8-e5m2-tensor`, …).
    pub activations: Option<String>,
    /// KV-cache rounding (`q8_0`, `fp8-e4m3`, `int8`, …).
    pub kv_cache: Option<String>,
    /// For NVFP4 activations: how many of the eval set's prompts the reference's calibration
    /// pass ran to set each linear layer's static global input scale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration_prompts: Option<usize>,
}

impl RecipeParts {
    /// What the variant quantizes, as reports group variants: `weights`, `weights + activations`,
    /// `KV cache`, `weights + activations + KV cache`, …
    pub fn group(&self) -> String {
        let mut parts = Vec::new();
        if self.weights != "fp16" {
            parts.push("weights");
        }
        if self.activations.is_some() {
            parts.push("activations");
        }
        if self.kv_cache.is_some() {
            parts.push("KV cache");
        }
        if parts.is_empty() { "nothing".to_string() } else { parts.join(" + ") }
    }

    /// Sort key of [`RecipeParts::group`]: weight-only first, then activations, then the KV
    /// cache, then both.
    fn rank(&self) -> (bool, bool, bool) {
        (self.kv_cache.is_some(), self.activations.is_some(), self.weights == "fp16")
    }
}

impl Variant {
    /// What the variant quantizes, as reports group variants: `noise floor`, `checkpoint`, or
    /// its [`RecipeParts::group`] (`weights` for a scheme variant from a report without parts).
    pub fn group(&self) -> String {
        match (self.kind, &self.recipe) {
            (VariantKind::NoiseFloor, _) => "noise floor".to_string(),
            (VariantKind::Checkpoint, _) => "checkpoint".to_string(),
            (VariantKind::Scheme, Some(r)) => r.group(),
            (VariantKind::Scheme, None) => "weights".to_string(),
        }
    }
}

impl Report {
    /// The variants grouped by what they quantize (noise floor; weights only; with activations;
    /// with the KV cache; with both; checkpoints), in report order within a group: the order
    /// every table lists them in.
    pub fn variants_grouped(&self) -> Vec<&Variant> {
        let mut v: Vec<&Variant> = self.variants.iter().collect();
        v.sort_by_key(|v| match (v.kind, &v.recipe) {
            (VariantKind::NoiseFloor, _) => (0, (false, false, false)),
            (VariantKind::Scheme, r) => (1, r.as_ref().map_or((false, false, false), RecipeParts::rank)),
            (VariantKind::Checkpoint, _) => (2, (false, false, false)),
        });
        v
    }
}

/// Error of one quantized tensor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorError {
    /// The tensor's Hugging Face name.
    pub tensor: String,
    /// Signal-to-quantization-noise ratio in dB (`None`: reconstructed exactly).
    pub sqnr_db: Option<f64>,
    /// ‖W − Ŵ‖_F / ‖W‖_F.
    pub rel_frobenius: f64,
    /// Cosine similarity of W and Ŵ.
    pub cosine: f64,
}

impl Variant {
    /// The metrics at horizon `tokens`, if the report has that horizon.
    pub fn horizon(&self, tokens: usize) -> Option<&HorizonMetrics> {
        self.horizons.iter().find(|h| h.tokens == tokens)
    }
}

impl Report {
    /// A variant by name.
    pub fn variant(&self, name: &str) -> Option<&Variant> {
        self.variants.iter().find(|v| v.name == name)
    }

    /// Reads and validates a report ([`Report::validate`]; a report no run can produce is
    /// [`ReportError::InvalidFile`]); a report of another schema version is
    /// [`ReportError::SchemaVersion`]. Only a regular file of at most [`REPORT_CAP`] bytes is
    /// read ([`read_capped`]).
    pub fn read(path: &Path) -> Result<Report, ReportError> {
        let bytes = read_capped(path, REPORT_CAP, "report")?;
        let value: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|source| ReportError::Parse { path: path.to_path_buf(), source })?;
        let version = value.get("schema_version").and_then(serde_json::Value::as_u64);
        match version {
            Some(v) if v == u64::from(SCHEMA_VERSION) => {}
            Some(found) => {
                return Err(ReportError::SchemaVersion { path: path.to_path_buf(), found, expected: SCHEMA_VERSION });
            }
            None => {
                let why = "no integer schema_version".to_string();
                return Err(ReportError::InvalidFile { path: path.to_path_buf(), why });
            }
        }
        let report: Report =
            serde_json::from_value(value).map_err(|source| ReportError::Parse { path: path.to_path_buf(), source })?;
        report.validate().map_err(|e| match e {
            ReportError::Invalid(why) => ReportError::InvalidFile { path: path.to_path_buf(), why },
            other => other,
        })?;
        Ok(report)
    }

    /// The report as pretty-printed JSON (deterministic: same report → same bytes).
    pub fn to_json(&self) -> Result<String, ReportError> {
        self.validate()?;
        serde_json::to_string_pretty(self).map_err(|e| ReportError::Invalid(e.to_string()))
    }

    /// Validates and writes the report atomically.
    pub fn write(&self, path: &Path) -> Result<(), ReportError> {
        let mut json = self.to_json()?;
        json.push('\n');
        Ok(write_atomic(path, json.as_bytes())?)
    }
}
