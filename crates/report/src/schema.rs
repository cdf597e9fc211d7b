//! `report.json`, schema version 1.
//!
//! The field names and nesting are the contract in the evaluation issue; fields marked *extra*
//! are additions the contract welcomes. Every statistic is computed over prompts (prompts are the
//! unit of resampling, never tokens); `ci95` is a 95% interval `[lo, hi]`.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{ReportError, write_atomic};

/// The schema version this build writes and reads.
pub const SCHEMA_VERSION: u32 = 1;

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
    /// The path as given on the command line (`synthetic:NAME` for synthetic models).
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
    /// *extra*: the file format (`llama2.c`, `gguf`, `safetensors`, `synthetic`).
    pub format: String,
    /// *extra*: the architecture's shapes.
    pub shape: ModelShape,
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
    /// Seed of every random choice (bootstrap resampling, prompt subset).
    pub seed: u64,
    /// The prompts' source.
    pub eval_set: EvalSetInfo,
    /// The qdrift version that wrote the report.
    pub qdrift_version: String,
    /// *extra*: bootstrap resamples per interval.
    pub bootstrap_resamples: usize,
    /// *extra*: whether the chat template was applied to the prompts.
    pub chat_template: bool,
}

/// The eval set the prompts came from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EvalSetInfo {
    /// The JSONL file.
    pub path: String,
    /// SHA-256 of the file, lowercase hex.
    pub sha256: String,
    /// The ids of the prompts used, in order.
    pub prompts: Vec<String>,
}

/// The reference the variants are compared with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reference {
    /// Always `fp16`: the checkpoint's weights rounded to FP16.
    pub name: String,
    /// *extra*: the precision it computes in (`f16` or `f32`).
    pub compute_dtype: String,
    /// *extra*: bytes of its weights as run (FP16).
    pub weight_bytes: u64,
    /// *extra*: the reference's perplexity of its own continuations over their first `h` tokens,
    /// pooled over prompts (`[h, ppl]` per horizon): the denominator of
    /// `ppl_drift_of_generated_text`.
    pub self_perplexity: Vec<(usize, f64)>,
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

/// One variant and its divergence from the reference.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Variant {
    /// Unique name within the report (the scheme name, `noise-floor-f32`, or the file stem).
    pub name: String,
    /// The scheme, for `kind = scheme`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    /// The checkpoint path, for `kind = checkpoint`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// What the variant is.
    pub kind: VariantKind,
    /// *extra*: the precision the variant computes in.
    pub compute_dtype: String,
    /// Storage bits per weight over the quantized tensors (scales included).
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
}

/// A mean over prompts and its 95% interval.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MeanCi {
    /// The point estimate.
    pub mean: f64,
    /// The 95% interval `[lo, hi]`.
    pub ci95: [f64; 2],
}

/// The distribution of per-prompt mean KL divergence, and a CI on its mean.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct KldSummary {
    /// Mean over prompts of each prompt's mean KLD over positions `< h`.
    pub mean: f64,
    /// Median over all positions `< h` of all prompts.
    pub median: f64,
    /// 90th percentile over positions.
    pub p90: f64,
    /// 99th percentile over positions.
    pub p99: f64,
    /// Largest per-position KLD.
    pub max: f64,
    /// Bootstrap-over-prompts 95% interval of `mean`.
    pub ci95: [f64; 2],
}

/// Metrics over the first `tokens` generated positions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HorizonMetrics {
    /// The horizon `h`.
    pub tokens: usize,
    /// Free-running: share of positions `< h` where the variant's token equals the reference's.
    pub token_match_rate: MeanCi,
    /// Free-running: share of prompts whose first `h` tokens all match (Wilson interval).
    pub exact_match_fraction: MeanCi,
    /// Teacher-forced on the reference's continuation: KL(P_ref ‖ P_variant) in nats.
    pub kld: KldSummary,
    /// Teacher-forced: share of positions where both models' argmax agree.
    pub top1_agreement: MeanCi,
    /// Teacher-forced: root mean square of `p_variant(ref token) − p_ref(ref token)`.
    pub rms_delta_p: MeanCi,
    /// `PPL_variant(ref text) / PPL_ref(ref text)`.
    pub ppl_ratio_on_reference_text: MeanCi,
    /// `PPL_ref(variant's text) / PPL_ref(ref's text)`: rises as the variant wanders.
    pub ppl_drift_of_generated_text: MeanCi,
    /// Paired difference variant − noise floor over prompts (absent on the noise floor itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub excess_over_noise_floor: Option<Excess>,
}

/// Divergence beyond the noise floor: paired (same prompt) differences, variant − noise floor.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Excess {
    /// Token-match rate difference (negative: the variant matches less than the noise floor).
    pub token_match_rate: MeanCi,
    /// KLD difference in nats.
    pub kld: MeanCi,
}

/// First-divergence positions and their Kaplan–Meier survival curve.
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

/// The metrics `qdrift gate` can check, as written in a thresholds file (`NAME@HORIZON`).
pub const GATE_METRICS: &[&str] = &[
    "token_match_rate",
    "exact_match_fraction",
    "kld",
    "top1_agreement",
    "rms_delta_p",
    "ppl_ratio_on_reference_text",
    "ppl_drift_of_generated_text",
    "excess_token_match_rate",
    "excess_kld",
];

impl HorizonMetrics {
    /// A metric by its gate name: the point estimate and the 95% interval. `None` for an unknown
    /// name, or an `excess_*` metric on the noise floor.
    pub fn metric(&self, name: &str) -> Option<MeanCi> {
        let kld = MeanCi { mean: self.kld.mean, ci95: self.kld.ci95 };
        Some(match name {
            "token_match_rate" => self.token_match_rate,
            "exact_match_fraction" => self.exact_match_fraction,
            "kld" => kld,
            "top1_agreement" => self.top1_agreement,
            "rms_delta_p" => self.rms_delta_p,
            "ppl_ratio_on_reference_text" => self.ppl_ratio_on_reference_text,
            "ppl_drift_of_generated_text" => self.ppl_drift_of_generated_text,
            "excess_token_match_rate" => self.excess_over_noise_floor?.token_match_rate,
            "excess_kld" => self.excess_over_noise_floor?.kld,
            _ => return None,
        })
    }
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

    /// Reads and validates a report; a report of another schema version is
    /// [`ReportError::SchemaVersion`].
    pub fn read(path: &Path) -> Result<Report, ReportError> {
        let bytes = std::fs::read(path).map_err(|source| ReportError::Io { path: path.to_path_buf(), source })?;
        let value: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|source| ReportError::Parse { path: path.to_path_buf(), source })?;
        let version = value.get("schema_version").and_then(serde_json::Value::as_u64);
        match version {
            Some(v) if v == u64::from(SCHEMA_VERSION) => {}
            Some(found) => {
                return Err(ReportError::SchemaVersion { path: path.to_path_buf(), found, expected: SCHEMA_VERSION });
            }
            None => {
                return Err(ReportError::Invalid(format!("{}: no integer schema_version", path.display())));
            }
        }
        let report: Report =
            serde_json::from_value(value).map_err(|source| ReportError::Parse { path: path.to_path_buf(), source })?;
        report.validate()?;
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
        write_atomic(path, json.as_bytes())
    }

    /// Checks that every number is finite and every rate, share and probability lies in [0, 1],
    /// intervals are ordered, and horizons match the workload's.
    pub fn validate(&self) -> Result<(), ReportError> {
        let bad = |what: String| Err(ReportError::Invalid(what));
        if self.schema_version != SCHEMA_VERSION {
            return bad(format!("schema_version {}", self.schema_version));
        }
        if self.workload.horizons.is_empty() || !self.workload.horizons.windows(2).all(|w| w[0] < w[1]) {
            return bad(format!("horizons {:?} are not ascending", self.workload.horizons));
        }
        let mut names = std::collections::BTreeSet::new();
        for v in &self.variants {
            if !names.insert(v.name.as_str()) {
                return bad(format!("two variants are named {}", v.name));
            }
            let hs: Vec<usize> = v.horizons.iter().map(|h| h.tokens).collect();
            if hs != self.workload.horizons {
                return bad(format!("variant {}: horizons {hs:?} ≠ workload {:?}", v.name, self.workload.horizons));
            }
            let finite = |what: &str, x: f64| -> Result<(), ReportError> {
                if x.is_finite() { Ok(()) } else { bad(format!("variant {}: {what} = {x}", v.name)) }
            };
            let unit = |what: &str, x: f64| -> Result<(), ReportError> {
                finite(what, x)?;
                if (0.0..=1.0).contains(&x) {
                    Ok(())
                } else {
                    bad(format!("variant {}: {what} = {x} ∉ [0, 1]", v.name))
                }
            };
            let ci = |what: &str, m: &MeanCi, in_unit: bool| -> Result<(), ReportError> {
                for x in [m.mean, m.ci95[0], m.ci95[1]] {
                    if in_unit { unit(what, x)? } else { finite(what, x)? }
                }
                if m.ci95[0] > m.ci95[1] {
                    return bad(format!("variant {}: {what} interval {:?} is reversed", v.name, m.ci95));
                }
                Ok(())
            };
            finite("bits_per_weight", v.bits_per_weight)?;
            for h in &v.horizons {
                let at = |m: &str| format!("{m}@{}", h.tokens);
                ci(&at("token_match_rate"), &h.token_match_rate, true)?;
                ci(&at("exact_match_fraction"), &h.exact_match_fraction, true)?;
                ci(&at("top1_agreement"), &h.top1_agreement, true)?;
                ci(&at("rms_delta_p"), &h.rms_delta_p, true)?;
                ci(&at("ppl_ratio_on_reference_text"), &h.ppl_ratio_on_reference_text, false)?;
                ci(&at("ppl_drift_of_generated_text"), &h.ppl_drift_of_generated_text, false)?;
                let k = &h.kld;
                for x in [k.mean, k.median, k.p90, k.p99, k.max, k.ci95[0], k.ci95[1]] {
                    finite(&at("kld"), x)?;
                }
                if let Some(e) = &h.excess_over_noise_floor {
                    ci(&at("excess.token_match_rate"), &e.token_match_rate, false)?;
                    ci(&at("excess.kld"), &e.kld, false)?;
                }
            }
            for &(_, s) in &v.first_divergence.survival {
                unit("survival", s)?;
            }
            for (what, xs) in [
                ("per_position.token_match", &v.per_position.token_match),
                ("per_position.top1_agreement", &v.per_position.top1_agreement),
            ] {
                for &x in xs {
                    unit(what, x)?;
                }
            }
            for &x in &v.per_position.kld {
                finite("per_position.kld", x)?;
            }
            for t in &v.per_tensor_error {
                finite(&format!("{} rel_frobenius", t.tensor), t.rel_frobenius)?;
                finite(&format!("{} cosine", t.tensor), t.cosine)?;
                if let Some(s) = t.sqnr_db {
                    finite(&format!("{} sqnr_db", t.tensor), s)?;
                }
            }
        }
        Ok(())
    }
}
