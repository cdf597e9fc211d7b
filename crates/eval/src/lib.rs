//! The evaluation: how far each variant of a model drifts from its FP16 reference, over 10, 100
//! and 1000 tokens of free-running generation.
//!
//! This crate runs the pipeline's middle stages for `qdrift eval`: it builds the reference (the
//! checkpoint's weights rounded to FP16) and the variants (quantization schemes applied to those
//! weights, other checkpoints, and the noise floor: the same FP16 weights at the other compute
//! precision), lets each generate greedily, teacher-forces each on the other's text, and reduces
//! what comes back to per-prompt [`Trace`]s and then to a [`qdrift_report::Report`].
//!
//! Data flow per variant: `generate` (free run, both models) → `teacher_forced` on the
//! reference's continuation (KL, top-1, log p of the reference token) → `teacher_forced` of the
//! reference on the variant's continuation (log p) → [`aggregate`] (host, f64, bootstrap over
//! prompts). Logits are reduced where they are (`reduce.rs`): on the device for a GPU, on the host
//! for the CPU backend, whose tensors are host memory.
//!
//! [`evaluate`] (`run.rs`) runs in four steps, each in its own module:
//!
//! | step | file | contents |
//! |---|---|---|
//! | plan | `plan.rs` | options checked before loading; batch size, chunk, precisions, device checks |
//! | encode prompts | `prompts.rs` | the first N prompts of the set, chat-wrapped for chat sets |
//! | run each variant | `variant.rs`, `scoring.rs`, `reduce.rs` | [`VariantSpec`] → weights; the reference run, generation, teacher forcing into [`Trace`]s |
//! | assemble | `run.rs`, [`aggregate`] | traces → statistics → [`qdrift_report::Report`] |
//!
//! Before any of them, `gate_check.rs` checks `--gate` thresholds against the run's variants and
//! horizons; `output.rs` ([`OutputDir`]) locks `--out` and stages the reports so that they
//! appear together or not at all.
//!
//! Beside them: `evalset.rs` (JSONL eval sets, the built-in ones), `chat.rs` (chat templates),
//! `identity.rs` (how reports name files: file name and SHA-256), `dump.rs` (`--dump-logprobs`).
//!
//! **Invariants: prompts are the unit of every interval; the same inputs and seed give a
//! byte-identical report; reference and variant always see the same batches (so a variant that
//! equals the reference shows exactly zero divergence); full-vocabulary logits never leave a
//! GPU unless a log-probability dump is asked for.**

pub mod aggregate;
mod chat;
mod compact;
mod dump;
mod evalset;
mod gate_check;
mod identity;
mod output;
mod plan;
mod prompts;
mod reduce;
mod run;
mod scoring;
mod shard;
mod store;
mod variant;

pub use aggregate::{Bootstrap, Trace};
pub use chat::apply_chat_template;
pub use evalset::{EvalPrompt, EvalSet, built_in_names};
pub use identity::{report_name, sha256_file, sha256_hex};
pub use output::OutputDir;
pub use plan::MAX_RESAMPLES;
pub use plan::Shard;
pub use run::{
    DEFAULT_EVAL_SET_RULE, EvalConfig, Evaluated, Progress, REFERENCE_NAME, RunContext, VariantHeader,
    default_eval_set, dtype_name, evaluate, evaluate_any,
};
pub use shard::{Part, merge};
pub use variant::VariantSpec;

/// Why an evaluation could not run. Every message is one line naming the option, file, prompt or
/// variant at fault.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// An option's value cannot be used (`--horizons 0`, `--prompts` beyond the set, ...).
    #[error("{option} {problem}")]
    Option {
        /// The option as the CLI spells it (`--horizons`).
        option: &'static str,
        /// What is wrong with its value, after the option's name.
        problem: String,
    },
    /// An eval set's contents are unusable.
    #[error("{source_name}{}: {problem}", .line.map(|l| format!(":{l}")).unwrap_or_default())]
    EvalSet {
        /// The file (as given) or built-in set.
        source_name: String,
        /// The 1-based line at fault, when one is.
        line: Option<usize>,
        /// What is wrong.
        problem: String,
    },
    /// `--eval-set` names no file and no built-in set.
    #[error("no built-in eval set \"{name}\"; known: {}", .known.join(", "))]
    UnknownEvalSet {
        /// The name asked for.
        name: String,
        /// The built-in sets ([`built_in_names`]).
        known: Vec<&'static str>,
    },
    /// A prompt of the set cannot be run.
    #[error("prompt {id} {problem}")]
    Prompt {
        /// The prompt's id in the set.
        id: String,
        /// What is wrong, after the prompt's id.
        problem: String,
    },
    /// The model's chat template does not render.
    #[error("the model's chat template: {0}")]
    ChatTemplate(minijinja::Error),
    /// A variant cannot be compared with the reference.
    #[error("variant {variant}: {problem}")]
    Variant {
        /// The variant as given (a checkpoint's path).
        variant: String,
        /// What is wrong.
        problem: String,
    },
    /// Two variants have the same name, so the report could not tell them apart.
    #[error("two variants are named {0}; give each once")]
    DuplicateVariant(String),
    /// The device cannot run the reference and the noise floor (one of them computes in f16).
    #[error("{adapter} does not support f16 compute, which the reference or the noise floor needs")]
    NoF16 {
        /// The device's adapter.
        adapter: String,
    },
    /// The `--gate` thresholds cannot apply to this run (an unknown variant or horizon, ...).
    #[error("--gate {}: {source}", .path.display())]
    Gate {
        /// The thresholds file.
        path: std::path::PathBuf,
        /// What is wrong.
        source: qdrift_report::GateError,
    },
    /// The `--out` folder cannot take the reports (not writable, locked by another run, ...).
    #[error("--out {}: {problem}", .path.display())]
    Output {
        /// The folder as given.
        path: std::path::PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// A shard's part cannot be read.
    #[error("part {}: {problem}", .path.display())]
    Part {
        /// The part's folder as given.
        path: std::path::PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// Parts cannot be merged into one report.
    #[error("cannot merge: {0}")]
    Merge(String),
    /// A saved reference (`--reference`, `--save-reference`) cannot be used or written.
    #[error("reference store {}: {problem}", .path.display())]
    Store {
        /// The store's folder as given.
        path: std::path::PathBuf,
        /// What is wrong, naming the field or file.
        problem: String,
    },
    /// Reading or writing a file failed.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A fault of qdrift itself (an invariant of the evaluation did not hold): a bug to report.
    #[error("internal error: {0}")]
    Internal(String),
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
    /// A file could not be read or written (`qdrift_io`).
    #[error(transparent)]
    File(#[from] qdrift_io::IoError),
}

impl EvalError {
    /// An [`EvalError::Io`] for `path`, for `map_err`.
    pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> EvalError + '_ {
        move |source| EvalError::Io { path: path.to_path_buf(), source }
    }
}
