//! The types the evaluation's steps hand each other, kept apart from the steps so that every
//! step depends on them and none on another step's file: progress reports ([`Progress`]), the
//! names and precisions reports use ([`reference_name`], [`dtype_name`]), what a run measured
//! ([`Measurement`]: each variant's [`VariantHeader`] and traces, the reference's tail mass
//! [`TailSums`]) and what the report says besides the variants ([`RunContext`]).

use burn::tensor::DType;
use qdrift_quantize::ReferenceFormat;
use qdrift_report::{FileHash, ModelInfo, RecipeParts, Reference, TensorError, VariantKind, Workload};
use serde::{Deserialize, Serialize};

use crate::trace::Trace;

/// Progress of a long evaluation, for a progress bar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress<'a> {
    /// A model starts generating `tokens` tokens in all (prompts × longest horizon).
    Generating {
        /// `fp16` for the reference, else the variant's name.
        model: &'a str,
        /// Tokens it will generate.
        tokens: u64,
    },
    /// `tokens` more tokens were generated.
    Generated {
        /// Tokens in this step (rows of the batch).
        tokens: u64,
    },
    /// Teacher-forced scoring of a variant starts.
    Scoring {
        /// The variant.
        model: &'a str,
    },
    /// Something the user should know that does not stop the run.
    Warning {
        /// One sentence.
        message: &'a str,
    },
    /// A variant is finished.
    Done {
        /// The variant.
        model: &'a str,
    },
}

/// A progress callback, as [`crate::evaluate`] takes it.
pub(crate) type ProgressFn<'p> = dyn FnMut(Progress<'_>) + Send + 'p;

/// The name of the reference in reports for a run at compute dtype `dtype`: `bf16` for a bf16
/// run (its weights rounded to bf16), else `fp16` (the FP16 reference, computed in f16 or f32).
pub fn reference_name(dtype: DType) -> &'static str {
    if dtype == DType::BF16 { "bf16" } else { "fp16" }
}

/// The 16-bit format a run at compute dtype `dtype` rounds the reference's weights to: bf16 for a
/// bf16 run, FP16 otherwise.
pub fn reference_format(dtype: DType) -> ReferenceFormat {
    if dtype == DType::BF16 { ReferenceFormat::Bf16 } else { ReferenceFormat::Fp16 }
}

/// The name `--dtype` takes and reports use for a compute dtype: `f16`, `bf16`, else `f32`.
pub fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        _ => "f32",
    }
}

/// What a run measured, before any statistic: every variant's description and per-prompt
/// traces (the noise floor first), and for a top-K reference its per-prompt tail mass.
pub(crate) struct Measurement {
    pub variants: Vec<(VariantHeader, Vec<Trace>)>,
    pub tail: Option<(usize, Vec<TailSums>)>,
}

/// A variant's entry in the report without the statistics of its traces.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VariantHeader {
    /// As [`qdrift_report::Variant::name`].
    pub name: String,
    /// As [`qdrift_report::Variant::scheme`].
    pub scheme: Option<String>,
    /// As [`qdrift_report::Variant::recipe`].
    pub recipe: Option<RecipeParts>,
    /// As [`qdrift_report::Variant::path`].
    pub path: Option<String>,
    /// As [`qdrift_report::Variant::sha256`].
    pub sha256: Option<String>,
    /// As [`qdrift_report::Variant::files`].
    pub files: Vec<FileHash>,
    /// As [`qdrift_report::Variant::kind`].
    pub kind: VariantKind,
    /// As [`qdrift_report::Variant::compute_dtype`].
    pub compute_dtype: String,
    /// As [`qdrift_report::Variant::bits_per_weight`].
    pub bits_per_weight: f64,
    /// As [`qdrift_report::Variant::weight_bytes`].
    pub weight_bytes: u64,
    /// As [`qdrift_report::Variant::per_tensor_error`].
    pub per_tensor_error: Vec<TensorError>,
    /// As [`qdrift_report::Variant::failure`]: set when the variant failed where the reference
    /// did not (its traces are then empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// As [`qdrift_report::Variant::different_model`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub different_model: Option<String>,
}

/// What the report says besides the variants: the model, the workload and the reference (its
/// self-perplexity and KL method filled in when the traces are summarized).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunContext {
    /// The report's `model`.
    pub model: ModelInfo,
    /// The report's `workload`.
    pub workload: Workload,
    /// The report's `reference`.
    pub reference: Reference,
}

/// The tail mass of one prompt's positions: their sum, largest value and count.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TailSums {
    /// Σ `p_tail` over the prompt's positions, summed in position order.
    pub sum: f64,
    /// Largest `p_tail`.
    pub max: f64,
    /// Positions.
    pub positions: usize,
}

/// The tail mass over every kept position: its largest and mean value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TailMass {
    /// Largest `p_tail`.
    pub max: f64,
    /// Mean `p_tail` over positions.
    pub mean: f64,
}

impl TailSums {
    /// The tail mass over all prompts, summed in prompt order (so a run and the merge of its
    /// shards give the same bits).
    pub fn total(prompts: &[TailSums]) -> TailMass {
        let (mut max, mut sum, mut n) = (0.0f64, 0.0f64, 0usize);
        for p in prompts {
            max = max.max(p.max);
            sum += p.sum;
            n += p.positions;
        }
        TailMass { max, mean: if n == 0 { 0.0 } else { sum / n as f64 } }
    }
}
