//! Opening a model by path: format detection and tokenizer pairing.

use std::path::{Path, PathBuf};

use crate::{HostModel, Llama2cTokenizer, LoadError, Tokenizer, read_gguf, read_llama2c_checkpoint};

/// A model and its tokenizer, ready for the later stages.
pub struct LoadedModel {
    /// Weights and architecture.
    pub model: HostModel,
    /// The tokenizer that goes with it.
    pub tokenizer: Box<dyn Tokenizer>,
    /// The checkpoint file.
    pub path: PathBuf,
    /// The tokenizer file.
    pub tokenizer_path: PathBuf,
    /// Format name (`"llama2.c"`).
    pub format: &'static str,
}

/// Opens the model at `path` with the tokenizer at `tokenizer` (or the one found beside it).
///
/// Formats: llama2.c legacy checkpoints (`.bin`) with llama2.c's `tokenizer.bin`. Without an
/// explicit tokenizer, `tokenizer.bin` in the model's folder is used, else the only `tok*.bin`
/// file there. A `.gguf` file is read and checked ([`read_gguf`]), then refused: its embedded
/// tokenizer (`tokenizer.ggml.model`) is not implemented yet, and pairing it with another
/// tokenizer would silently mis-tokenize.
pub fn open_model(path: &Path, tokenizer: Option<&Path>) -> Result<LoadedModel, LoadError> {
    let meta = std::fs::metadata(path).map_err(|e| LoadError::io(path, e))?;
    if meta.is_dir() {
        return Err(LoadError::invalid(path, "is a folder; give a llama2.c checkpoint file (.bin)"));
    }
    if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
        let gguf = read_gguf(path)?;
        let kind = gguf.tokenizer.model.as_deref().unwrap_or("(none)");
        return Err(LoadError::invalid(path, format!("GGUF tokenizer type {kind} is not supported yet")));
    }
    let model = read_llama2c_checkpoint(path)?;
    let tokenizer_path = match tokenizer {
        Some(t) => t.to_path_buf(),
        None => find_llama2c_tokenizer(path)?,
    };
    let tok = Llama2cTokenizer::read(&tokenizer_path)?;
    if tok.vocab_size() != model.arch.vocab_size {
        return Err(LoadError::VocabMismatch {
            tokenizer: tokenizer_path,
            tokenizer_vocab: tok.vocab_size(),
            model: path.to_path_buf(),
            model_vocab: model.arch.vocab_size,
        });
    }
    Ok(LoadedModel { model, tokenizer: Box::new(tok), path: path.to_path_buf(), tokenizer_path, format: "llama2.c" })
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
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("tok") && n.ends_with(".bin"))
        })
        .collect();
    candidates.sort();
    match candidates.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(LoadError::invalid(
            model,
            format!("no tokenizer given and no tokenizer.bin or tok*.bin beside it in {}; pass --tokenizer", dir.display()),
        )),
        many => Err(LoadError::invalid(
            model,
            format!("no tokenizer given and {} candidates beside it ({}); pass --tokenizer", many.len(),
                many.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")),
        )),
    }
}
