//! [`EvalError`]: why an evaluation could not run, one variant per kind of fault; every module of
//! the crate returns it.

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
        /// The built-in sets ([`crate::built_in_names`]).
        known: Vec<&'static str>,
    },
    /// A prompt of the set cannot be run.
    #[error("prompt {} {problem}", qdrift_io::elide(id))]
    Prompt {
        /// The prompt's id in the set.
        id: String,
        /// What is wrong, after the prompt's id.
        problem: String,
    },
    /// The model's chat template does not render.
    #[error("the model's chat template: {0}")]
    ChatTemplate(minijinja::Error),
    /// The model's chat template ran past a limit: its fuel (instructions) or the size of what it
    /// renders (chat.rs).
    #[error("{}the model's chat template {limit}", .file.as_ref().map(|f| format!("{}: ", f.display())).unwrap_or_default())]
    ChatTemplateLimit {
        /// The file the template came from (the GGUF file, `tokenizer_config.json`), when known.
        file: Option<std::path::PathBuf>,
        /// The limit it hit, in words.
        limit: String,
    },
    /// The model's chat template failed where it rendered in a child process ([`crate::ChatSandbox`]).
    #[error("{}the model's chat template: {message}", .file.as_ref().map(|f| format!("{}: ", f.display())).unwrap_or_default())]
    ChatTemplateFailed {
        /// The file the template came from, when known.
        file: Option<std::path::PathBuf>,
        /// The error's message.
        message: String,
    },
    /// A variant cannot be compared with the reference.
    #[error("variant {variant}: {problem}")]
    Variant {
        /// The variant as given (a checkpoint's path).
        variant: String,
        /// What is wrong.
        problem: String,
    },
    /// Two variants have the same name, so the report could not tell them apart.
    #[error(
        "two variants are named {0}; give each once (two checkpoints whose files share a name: name them, \
         --variant NAME=PATH)"
    )]
    DuplicateVariant(String),
    /// The plan's largest model would not fit in the memory available ([`crate::check::memory`]).
    #[error("{0}")]
    Memory(String),
    /// What the run would write does not fit the free space of its filesystems (`check/space.rs`).
    #[error("{0}")]
    DiskSpace(String),
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
    /// A model's logits went non-finite (an FP16 overflow): which model, where, and what to do.
    #[error("{model}: {problem}")]
    Overflow {
        /// `the reference (fp16)` or `variant NAME`.
        model: String,
        /// Where, and what to do (a [`qdrift_generate::GenerateError::Overflow`]'s message).
        problem: String,
    },
    /// Two reports `qdrift compare` cannot pair, or a variant or check it cannot find.
    #[error("cannot compare: {0}")]
    Compare(String),
    /// A saved reference (`--reference`, `--save-reference`) cannot be used or written.
    #[error("{flag} {}: {problem}", .path.display())]
    Store {
        /// The flag that named the store: `--reference` (reading) or `--save-reference` (writing).
        flag: &'static str,
        /// The store's folder as given.
        path: std::path::PathBuf,
        /// What is wrong, naming the field or file.
        problem: String,
    },
    /// The run measured every variant and made its report, but `--save-reference` could not be
    /// written: the report is here, to be written all the same.
    #[error("{source} (the report was made; only the saved reference is missing)")]
    ReferenceNotSaved {
        /// The report.
        report: Box<qdrift_report::Report>,
        /// Why the store was not written.
        source: Box<EvalError>,
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
