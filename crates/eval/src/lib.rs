//! The evaluation: how far each variant of a model drifts from its FP16 reference, over 10, 100
//! and 1000 tokens of free-running generation.
//!
//! This crate runs the pipeline's middle stages for `qdrift eval`: it builds the reference (the
//! checkpoint's weights rounded to FP16) and the variants (quantization schemes applied to those
//! weights, other checkpoints, and the noise floor: the same FP16 weights at the other compute
//! precision), lets each generate greedily, teacher-forces each on the other's text, and reduces
//! what comes back to per-prompt [`Trace`]s and then to a [`qdrift_report::Report`].
//!
//! Data flow per variant: `generate` (free run, both models) → `teacher_forced_pair` on the
//! reference's continuation (KL, top-1, log p of the reference token, reduced on the device) →
//! `teacher_forced` of the reference on the variant's continuation (log p reduced on the device)
//! → [`aggregate`] (host, f64, bootstrap over prompts).
//!
//! **Invariants: prompts are the unit of every interval; the same inputs and seed give a
//! byte-identical report; reference and variant always see the same batches (so a variant that
//! equals the reference shows exactly zero divergence); full-vocabulary logits never leave the
//! device unless a log-probability dump is asked for.**

pub mod aggregate;
mod chat;
mod evalset;
mod run;

pub use aggregate::{Bootstrap, Trace};
pub use chat::apply_chat_template;
pub use evalset::{EvalPrompt, EvalSet, built_in_names, sha256_file, sha256_hex};
pub use run::{EvalConfig, Progress, VariantSpec, dtype_name, evaluate};

/// Why an evaluation could not run.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// Bad input: an eval set, a variant, an option.
    #[error("{0}")]
    Input(String),
    /// Loading a model failed.
    #[error(transparent)]
    Load(#[from] qdrift_load::LoadError),
    /// Quantizing failed.
    #[error(transparent)]
    Quantize(#[from] qdrift_quantize::QuantizeError),
    /// Building a model on the device failed.
    #[error(transparent)]
    Model(#[from] qdrift_model::ModelError),
    /// Choosing the device failed.
    #[error(transparent)]
    Device(#[from] qdrift_generate::DeviceError),
    /// Generation or teacher forcing failed.
    #[error(transparent)]
    Generate(#[from] qdrift_generate::GenerateError),
    /// A metric or statistic could not be computed.
    #[error(transparent)]
    Score(#[from] qdrift_score::ScoreError),
    /// The report could not be built or written.
    #[error(transparent)]
    Report(#[from] qdrift_report::ReportError),
}
