//! Opening a model by path: format detection and tokenizer pairing.

use std::path::{Path, PathBuf};

use crate::{
    HostModel, Llama2cTokenizer, LoadError, Tokenizer, gguf_tokenizer, read_gguf, read_hf_folder,
    read_llama2c_checkpoint, synthetic,
};

/// A model and its tokenizer, ready for the later stages.
pub struct LoadedModel {
    /// Weights and architecture.
    pub model: HostModel,
    /// The tokenizer that goes with it.
    pub tokenizer: Box<dyn Tokenizer>,
    /// The checkpoint file (the folder for a Hugging Face model, `synthetic:NAME` for a
    /// synthetic one).
    pub path: PathBuf,
    /// The tokenizer file (the checkpoint itself for GGUF's embedded tokenizer).
    pub tokenizer_path: PathBuf,
    /// The format the model was read from.
    pub format: ModelFormat,
    /// Every tensor of the source file with its stored dtype (`F32`, `BF16`, `Q4_1`, ...), in
    /// file order; for reports ([`crate::inspect`]). The weights in [`LoadedModel::model`] are
    /// f32 whatever the source dtype.
    pub source_dtypes: Vec<(String, String)>,
    /// The source file's stored bytes per tensor type and bits per weight, for `qdrift inspect`
    /// (GGUF files; `None` for other formats).
    pub source_storage: Option<crate::inspect::SourceStorage>,
    /// The chat template (Jinja) the checkpoint ships, if any (GGUF `tokenizer.chat_template`,
    /// `tokenizer_config.json` `chat_template`).
    pub chat_template: Option<String>,
    /// How a quantized Hugging Face folder stored its weights, and the dynamic activation
    /// quantization it declares (`None` for unquantized checkpoints and other formats). The
    /// weights in [`LoadedModel::model`] are already dequantized.
    pub quantization: Option<crate::CheckpointQuant>,
}

/// The format a [`LoadedModel`] was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ModelFormat {
    /// A llama2.c legacy checkpoint ([`read_llama2c_checkpoint`]).
    Llama2c,
    /// A GGUF file ([`read_gguf`]).
    Gguf,
    /// A Hugging Face folder with safetensors weights ([`read_hf_folder`]).
    HfSafetensors,
    /// Seeded random weights of a preset shape ([`crate::synthetic_model`]).
    Synthetic,
}

impl ModelFormat {
    /// The name reports and `qdrift inspect` give the format: `llama2.c`, `gguf`,
    /// `hf-safetensors` or `synthetic`.
    pub fn name(self) -> &'static str {
        match self {
            ModelFormat::Llama2c => "llama2.c",
            ModelFormat::Gguf => "gguf",
            ModelFormat::HfSafetensors => "hf-safetensors",
            ModelFormat::Synthetic => "synthetic",
        }
    }

    /// True for seeded random weights: numbers measured on such a model say nothing about a
    /// trained one, and reports must say so.
    pub fn is_synthetic(self) -> bool {
        self == ModelFormat::Synthetic
    }
}

impl std::fmt::Display for ModelFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl serde::Serialize for ModelFormat {
    /// As its [`ModelFormat::name`].
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

/// Opens the model at `path` with the tokenizer at `tokenizer` (or the one found beside it).
///
/// Formats, chosen by the path:
/// - `synthetic:NAME` (or `synthetic:NAME:SEED`): seeded random weights of a preset shape
///   ([`crate::synthetic_model`]); `tokenizer` must be `None`.
/// - a folder: a Hugging Face checkpoint ([`read_hf_folder`]: `config.json`, safetensors,
///   `tokenizer.json`), also when `path` is its `config.json`, a `.safetensors` file or the
///   shard index; `tokenizer` may name another `tokenizer.json`.
/// - `*.gguf`: GGUF ([`read_gguf`]) with its embedded tokenizer ([`gguf_tokenizer`]); an explicit
///   `tokenizer` is refused, as pairing a GGUF model with another tokenizer would silently
///   mis-tokenize.
/// - anything else: a llama2.c legacy checkpoint (`.bin`) with llama2.c's `tokenizer.bin`.
///   Without an explicit tokenizer, `tokenizer.bin` in the model's folder is used, else the
///   only `tok*.bin` file there.
///
/// # Errors
/// The reader's [`LoadError`]; [`LoadError::VocabMismatch`] when tokenizer and model disagree.
pub fn open_model(path: &Path, tokenizer: Option<&Path>) -> Result<LoadedModel, LoadError> {
    if let Some(spec) = path.to_str().and_then(|p| p.strip_prefix("synthetic:")) {
        if let Some(t) = tokenizer {
            return Err(LoadError::invalid(t, "a synthetic model has its own tokenizer; do not pass --tokenizer"));
        }
        return synthetic::open_synthetic(spec);
    }
    let meta = std::fs::metadata(path).map_err(|e| LoadError::io(path, e))?;
    // A file of a Hugging Face folder stands for the folder.
    let hf_file = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("safetensors"))
        || path.file_name().is_some_and(|n| n == "config.json" || n == "model.safetensors.index.json");
    if hf_file && let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        return open_model(dir, tokenizer);
    }
    if meta.is_dir() {
        return read_hf_folder(path, tokenizer);
    }
    // Before any reader opens it: a named pipe would block, a device would never end.
    crate::input::check_regular(path, meta.file_type())?;
    if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
        if let Some(t) = tokenizer {
            return Err(LoadError::invalid(
                t,
                format!("{} is GGUF and carries its own tokenizer; do not pass --tokenizer", path.display()),
            ));
        }
        let gguf = read_gguf(path)?;
        let tok = gguf_tokenizer(path, &gguf.tokenizer, gguf.model.arch.vocab_size)?;
        let source_storage = crate::inspect::gguf_source_storage(&gguf.tensors).map_err(|e| LoadError::Overflow {
            path: path.to_path_buf(),
            quantity: e.quantity.to_string(),
            inputs: format!("{} tensors", gguf.tensors.len()),
        })?;
        return Ok(LoadedModel {
            model: gguf.model,
            tokenizer: tok,
            path: path.to_path_buf(),
            tokenizer_path: path.to_path_buf(),
            format: ModelFormat::Gguf,
            source_dtypes: gguf.tensor_types.into_iter().map(|(n, t)| (n, t.to_string())).collect(),
            source_storage: Some(source_storage),
            chat_template: gguf.tokenizer.chat_template,
            quantization: None,
        });
    }
    let model = read_llama2c_checkpoint(path)?;
    let tokenizer_path = match tokenizer {
        Some(t) => t.to_path_buf(),
        None => find_llama2c_tokenizer(path)?,
    };
    let tok = Llama2cTokenizer::read(&tokenizer_path)?;
    check_vocab(&tok, &tokenizer_path, &model, path)?;
    let source_dtypes = llama2c_tensor_names(&model).into_iter().map(|n| (n, "F32".to_string())).collect();
    Ok(LoadedModel {
        model,
        tokenizer: Box::new(tok),
        path: path.to_path_buf(),
        tokenizer_path,
        format: ModelFormat::Llama2c,
        source_dtypes,
        source_storage: None,
        chat_template: None,
        quantization: None,
    })
}

/// [`LoadError::VocabMismatch`] unless the tokenizer has exactly the model's vocabulary size.
pub(crate) fn check_vocab(
    tok: &dyn Tokenizer,
    tokenizer_path: &Path,
    model: &HostModel,
    model_path: &Path,
) -> Result<(), LoadError> {
    if tok.vocab_size() != model.arch.vocab_size {
        return Err(LoadError::VocabMismatch {
            tokenizer: tokenizer_path.to_path_buf(),
            tokenizer_vocab: tok.vocab_size(),
            model: model_path.to_path_buf(),
            model_vocab: model.arch.vocab_size,
        });
    }
    Ok(())
}

/// Names for the tensors of a llama2.c checkpoint (which has none): llama2.c's field names.
fn llama2c_tensor_names(model: &HostModel) -> Vec<String> {
    let mut names = vec!["token_embedding_table".to_string()];
    for i in 0..model.layers.len() {
        for n in ["rms_att_weight", "wq", "wk", "wv", "wo", "rms_ffn_weight", "w1", "w3", "w2"] {
            names.push(format!("layers.{i}.{n}"));
        }
    }
    names.push("rms_final_weight".to_string());
    if model.output.is_some() {
        names.push("wcls".to_string());
    }
    names
}

fn find_llama2c_tokenizer(model: &Path) -> Result<PathBuf, LoadError> {
    let dir = model.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let standard = dir.join("tokenizer.bin");
    if standard.is_file() {
        return Ok(standard);
    }
    let entries = std::fs::read_dir(dir).map_err(|e| LoadError::io(dir, e))?;
    let mut candidates: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("tok") && n.ends_with(".bin")))
        .collect();
    candidates.sort();
    match candidates.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(LoadError::invalid(
            model,
            format!(
                "no tokenizer given and no tokenizer.bin or tok*.bin beside it in {}; pass --tokenizer",
                dir.display()
            ),
        )),
        many => Err(LoadError::invalid(
            model,
            format!(
                "no tokenizer given and {} candidates beside it ({}); pass --tokenizer",
                many.len(),
                many.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
            ),
        )),
    }
}
