//! Opening a model by path: format detection and tokenizer pairing; each format's reader does
//! the rest.

use std::path::Path;
use std::sync::Arc;

use qdrift_weights::{HeldModel, HostModel, WeightSource};

use crate::LoadError;
use crate::gguf::read::gguf_source_storage;
use crate::gguf::tokenizer::gguf_tokenizer;
use crate::gguf::{GgufModel, open_gguf_source, read_gguf};
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
    match classify(path, tokenizer)? {
        Checkpoint::Synthetic(spec) => synthetic::open_synthetic(spec),
        Checkpoint::HfFolder(dir) => read_hf_folder(dir, tokenizer),
        Checkpoint::Gguf => {
            let gguf = read_gguf(path)?;
            let vocab = gguf.model.arch.vocab_size;
            gguf_loaded(path, gguf, vocab)
        }
        Checkpoint::Llama2c => open_llama2c(path, tokenizer),
    }
}

/// Which reader a path goes to.
enum Checkpoint<'a> {
    /// `synthetic:SPEC`.
    Synthetic(&'a str),
    /// A Hugging Face folder (the path or its parent).
    HfFolder(&'a Path),
    /// A `.gguf` file.
    Gguf,
    /// Anything else: a llama2.c checkpoint.
    Llama2c,
}

/// The reader for `path`, after the checks every reader relies on: a synthetic model or a GGUF
/// file takes no tokenizer; a file must be a regular one (a named pipe would block, a device
/// would never end).
fn classify<'a>(path: &'a Path, tokenizer: Option<&Path>) -> Result<Checkpoint<'a>, LoadError> {
    if let Some(spec) = path.to_str().and_then(|p| p.strip_prefix("synthetic:")) {
        if let Some(t) = tokenizer {
            return Err(LoadError::invalid(t, "a synthetic model has its own tokenizer; do not pass --tokenizer"));
        }
        return Ok(Checkpoint::Synthetic(spec));
    }
    if let Some(id) = hub_id(path) {
        return Err(LoadError::invalid(
            path,
            format!(
                "not found; {id} looks like a Hugging Face Hub id, and qdrift reads local files only: download it \
                 first (`hf download {id} --local-dir {name}`) and pass the folder",
                name = id.rsplit('/').next().unwrap_or(id)
            ),
        ));
    }
    if let Some(dir) = hf_folder(path)? {
        return Ok(Checkpoint::HfFolder(dir));
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
        return Ok(Checkpoint::Gguf);
    }
    Ok(Checkpoint::Llama2c)
}

/// `path` as a Hugging Face Hub id (`Qwen/Qwen3-0.6B`) when nothing is at that path and it has
/// an id's form: two names of letters, digits, `-`, `_` and `.`, joined by one `/`, the first not
/// starting with `.`.
fn hub_id(path: &Path) -> Option<&str> {
    let s = path.to_str()?;
    let (owner, name) = s.split_once('/')?;
    let part = |p: &str| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    let id = part(owner) && part(name) && !owner.starts_with('.') && !name.contains('/');
    (id && !path.exists()).then_some(s)
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
/// - a Hugging Face folder and a GGUF file read each part from the file when asked
///   (`open_hf_source`, `open_gguf_source`: read through once at open for their errors,
///   nothing kept; a file changed or cut short since is refused when a part is read), as stored: `prepare` is not called, the caller rounds each part as it builds
///   (an evaluation's `Reference` does);
/// - a llama2.c checkpoint is read whole, given to `prepare` (an evaluation rounds it to its
///   FP16 reference there), and held as a [`HeldModel`] (each tensor at 16 bits when its values
///   allow, exactly).
///
/// # Errors
/// As [`open_model`].
pub fn open_source(
    path: &Path,
    tokenizer: Option<&Path>,
    prepare: &dyn Fn(&mut HostModel),
) -> Result<LoadedModel<Arc<dyn WeightSource>>, LoadError> {
    let as_source = |s: Arc<dyn WeightSource>| Ok::<_, LoadError>(s);
    match classify(path, tokenizer)? {
        Checkpoint::Synthetic(spec) => {
            let (name, seed) = synthetic::parse_spec(spec)?;
            synthetic::synthetic_source(name, seed)?.try_map_model(|s| as_source(Arc::new(s)))
        }
        Checkpoint::HfFolder(dir) => open_hf_source(dir, tokenizer)?.try_map_model(|s| as_source(Arc::new(s))),
        Checkpoint::Gguf => {
            let gguf = open_gguf_source(path)?;
            let vocab = gguf.model.arch().vocab_size;
            gguf_loaded(path, gguf, vocab)?.try_map_model(|s| as_source(Arc::new(s)))
        }
        Checkpoint::Llama2c => open_llama2c(path, tokenizer)?.try_map_model(|mut m| {
            prepare(&mut m);
            as_source(Arc::new(HeldModel::new(m)))
        }),
    }
}

/// A GGUF file read (its weights as `W`, of a model with `vocab` rows) with its embedded
/// tokenizer and stored sizes.
fn gguf_loaded<W>(path: &Path, gguf: GgufModel<W>, vocab: usize) -> Result<LoadedModel<W>, LoadError> {
    let tok = gguf_tokenizer(path, &gguf.tokenizer, vocab)?;
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
        notes: Vec::new(),
    })
}
