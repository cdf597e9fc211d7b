//! Opening a model by path: format detection and tokenizer pairing; each format's reader does
//! the rest.

use std::path::Path;
use std::sync::Arc;

use qdrift_weights::{HeldModel, HostModel, WeightSource};

use crate::LoadError;
use crate::gguf::read::gguf_source_storage;
use crate::gguf::read_gguf;
use crate::gguf::tokenizer::gguf_tokenizer;
use crate::hf::{open_hf_source, read_hf_folder};
use crate::llama2c::open_llama2c;
use crate::loaded::{LoadedModel, ModelFormat};
use crate::synthetic;

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
    if let Some(dir) = hf_folder(path)? {
        return read_hf_folder(dir, tokenizer);
    }
    let meta = std::fs::metadata(path).map_err(|e| LoadError::io(path, e))?;
    // Before any reader opens it: a named pipe would block, a device would never end.
    crate::input::check_regular(path, crate::input::MODEL, meta.file_type())?;
    if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
        if let Some(t) = tokenizer {
            return Err(LoadError::invalid(
                t,
                format!("{} is GGUF and carries its own tokenizer; do not pass --tokenizer", path.display()),
            ));
        }
        return open_gguf(path);
    }
    open_llama2c(path, tokenizer)
}

/// The Hugging Face folder `path` names: the folder itself, or the folder of its `config.json`,
/// a `.safetensors` file or the shard index; `None` for anything else.
fn hf_folder(path: &Path) -> Result<Option<&Path>, LoadError> {
    let meta = std::fs::metadata(path).map_err(|e| LoadError::io(path, e))?;
    let hf_file = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("safetensors"))
        || path.file_name().is_some_and(|n| n == "config.json" || n == "model.safetensors.index.json");
    if hf_file && let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        return hf_folder(dir);
    }
    Ok(meta.is_dir().then_some(path))
}

/// [`open_model`] with the weights held as a [`WeightSource`] that hands them out part by part,
/// for building a model on a device without a whole f32 host copy:
/// - a synthetic model generates each part when asked;
/// - a Hugging Face folder reads each part from its files when asked (`open_hf_source`: read
///   through once at open for its errors, nothing kept), as stored: `prepare` is not called,
///   the caller rounds each part as it builds (an evaluation's `Reference` does);
/// - another checkpoint (GGUF, llama2.c) is read whole, given to `prepare` (an evaluation rounds
///   it to its FP16 reference there), and held as a [`HeldModel`] (each tensor at 16 bits when
///   its values allow, exactly).
///
/// # Errors
/// As [`open_model`].
pub fn open_source(
    path: &Path,
    tokenizer: Option<&Path>,
    prepare: &dyn Fn(&mut HostModel),
) -> Result<LoadedModel<Arc<dyn WeightSource>>, LoadError> {
    let as_source = |s: Arc<dyn WeightSource>| Ok::<_, LoadError>(s);
    if let Some(spec) = path.to_str().and_then(|p| p.strip_prefix("synthetic:"))
        && tokenizer.is_none()
    {
        let (name, seed) = synthetic::parse_spec(spec)?;
        return synthetic::synthetic_source(name, seed)?.try_map_model(|s| as_source(Arc::new(s)));
    }
    // A synthetic model with a tokenizer goes on to `open_model`, which refuses it.
    if !path.to_string_lossy().starts_with("synthetic:")
        && let Some(dir) = hf_folder(path)?
    {
        return open_hf_source(dir, tokenizer)?.try_map_model(|s| as_source(Arc::new(s)));
    }
    open_model(path, tokenizer)?.try_map_model(|mut m| {
        prepare(&mut m);
        as_source(Arc::new(HeldModel::new(m)))
    })
}

/// A GGUF file with its embedded tokenizer and stored sizes.
fn open_gguf(path: &Path) -> Result<LoadedModel, LoadError> {
    let gguf = read_gguf(path)?;
    let tok = gguf_tokenizer(path, &gguf.tokenizer, gguf.model.arch.vocab_size)?;
    let source_storage = gguf_source_storage(&gguf.tensors).map_err(|e| LoadError::Overflow {
        path: path.to_path_buf(),
        quantity: e.quantity.to_string(),
        inputs: format!("{} tensors", gguf.tensors.len()),
    })?;
    Ok(LoadedModel {
        model: gguf.model,
        tokenizer: tok,
        path: path.to_path_buf(),
        tokenizer_path: path.to_path_buf(),
        format: ModelFormat::Gguf,
        source_dtypes: gguf.tensor_types.into_iter().map(|(n, t)| (n, t.to_string())).collect(),
        source_storage: Some(source_storage),
        chat_template: gguf.tokenizer.chat_template,
        quantization: None,
    })
}
