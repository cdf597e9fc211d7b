//! Hugging Face model folders.

use std::path::Path;

use crate::{LoadError, LoadedModel};

/// Reads a Hugging Face model folder.
pub fn read_hf_folder(dir: &Path, _tokenizer: Option<&Path>) -> Result<LoadedModel, LoadError> {
    Err(LoadError::invalid(
        dir,
        "is a folder; Hugging Face folders are not supported yet",
    ))
}
