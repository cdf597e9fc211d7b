//! Synthetic models.

use std::path::Path;

use crate::{LoadError, LoadedModel};

pub(crate) fn open_synthetic(spec: &str) -> Result<LoadedModel, LoadError> {
    Err(LoadError::invalid(
        Path::new(spec),
        "synthetic models are not supported yet",
    ))
}
