use std::path::PathBuf;

/// Everything that can go wrong while reading a model or a tokenizer.
///
/// Every variant names the file it is about, so the CLI can print one line that tells the user
/// what to fix.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file (or folder) could not be examined, opened or listed.
    #[error("{path}: cannot read: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A file could not be read whole (missing, not a regular file, over its size cap, changed
    /// while read) or written atomically: `qdrift_io`'s error, whose message names the file.
    #[error(transparent)]
    File(#[from] qdrift_io::IoError),
    /// A file could not be written (the writers of [`crate::write`]).
    #[error("{path}: cannot write: {source}")]
    Write {
        /// The file or folder.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The file ended before the structure it declares.
    #[error("{path}: truncated: {what}")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// What was being read, and how much was expected versus present.
        what: String,
    },
    /// The file is readable but its content contradicts itself or the format.
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A value the file declares that qdrift does not read (a quantization method, a bit width,
    /// a packing layout): names the file, the field and what is supported.
    #[error("{path}: {field} = {value} is not supported; supported: {supported}")]
    Unsupported {
        /// The file.
        path: PathBuf,
        /// The field, as a path into the file (`quantization_config.bits`) or a tensor name.
        field: String,
        /// The value found.
        value: String,
        /// What qdrift reads instead.
        supported: String,
    },
    /// A model and a tokenizer that do not belong together.
    #[error("tokenizer {tokenizer} has {tokenizer_vocab} tokens but model {model} has a vocabulary of {model_vocab}")]
    VocabMismatch {
        /// The tokenizer file.
        tokenizer: PathBuf,
        /// Its token count.
        tokenizer_vocab: usize,
        /// The model file.
        model: PathBuf,
        /// The model's vocabulary size.
        model_vocab: usize,
    },
    /// A model whose weights would not fit in the memory available to this process; refused
    /// before allocating.
    #[error(
        "{what}: needs {needed_bytes} bytes ({:.1} GiB) of f32 weights but only {available_bytes} bytes ({:.1} GiB) are available",
        *needed_bytes as f64 / 1073741824.0,
        *available_bytes as f64 / 1073741824.0
    )]
    TooLarge {
        /// The model.
        what: PathBuf,
        /// Bytes the weights need.
        needed_bytes: u64,
        /// Bytes available.
        available_bytes: u64,
    },
    /// A figure computed from a file's sizes or the caller's (a context length, a batch) that does
    /// not fit in 64 bits.
    #[error("{path}: {quantity} does not fit in 64 bits ({inputs})")]
    Overflow {
        /// The model.
        path: PathBuf,
        /// What was being computed (`KV-cache bytes`, `attention FLOPs per token`, ...).
        quantity: String,
        /// The numbers it was computed from.
        inputs: String,
    },
    /// Text that cannot be tokenized (for example an empty prompt).
    #[error("{0}")]
    BadText(String),
}

impl LoadError {
    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> Self {
        LoadError::Io { path: path.to_path_buf(), source }
    }
    pub(crate) fn write(path: &std::path::Path, source: std::io::Error) -> Self {
        LoadError::Write { path: path.to_path_buf(), source }
    }
    pub(crate) fn invalid(path: &std::path::Path, message: impl Into<String>) -> Self {
        LoadError::Invalid { path: path.to_path_buf(), message: message.into() }
    }
    pub(crate) fn unsupported(
        path: &std::path::Path,
        field: impl Into<String>,
        value: impl std::fmt::Display,
        supported: impl Into<String>,
    ) -> Self {
        LoadError::Unsupported {
            path: path.to_path_buf(),
            field: field.into(),
            value: value.to_string(),
            supported: supported.into(),
        }
    }
    pub(crate) fn truncated(path: &std::path::Path, what: impl Into<String>) -> Self {
        LoadError::Truncated { path: path.to_path_buf(), what: what.into() }
    }
}
