//! Reading `quantization_config`: field access that names the field in errors
//! (`quantization_config.config_groups.group_0.weights.num_bits`), shared by every layout's
//! parser.

use std::path::Path;

use qdrift_io::elide;
use serde_json::Value;

use crate::LoadError;

/// A JSON object of a config with the path of its fields, for errors that name the field.
pub(crate) struct Fields<'a> {
    /// The file the configuration came from.
    pub(crate) path: &'a Path,
    /// The path of this object in the file (`quantization_config`, empty for a whole file).
    pub(crate) prefix: String,
    /// The object.
    pub(crate) v: &'a Value,
}

impl<'a> Fields<'a> {
    /// The full name of `key` in the file.
    pub(crate) fn field(&self, key: &str) -> String {
        if self.prefix.is_empty() { key.to_string() } else { format!("{}.{key}", self.prefix) }
    }

    /// `key`'s value, absent when `null`.
    pub(crate) fn get(&self, key: &str) -> Option<&'a Value> {
        self.v.get(key).filter(|v| !v.is_null())
    }

    /// The object at `key`, if it is one.
    pub(crate) fn child(&self, key: &str) -> Option<Fields<'a>> {
        self.get(key).filter(|v| v.is_object()).map(|v| Fields { path: self.path, prefix: self.field(key), v })
    }

    /// [`LoadError::Unsupported`] for `key`, the value quoted short ([`elide`]).
    pub(crate) fn unsupported(&self, key: &str, value: impl std::fmt::Display, supported: &str) -> LoadError {
        LoadError::unsupported(self.path, self.field(key), elide(&value.to_string()), supported)
    }

    /// A string, if present.
    pub(crate) fn str(&self, key: &str) -> Result<Option<&'a str>, LoadError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(LoadError::invalid(
                self.path,
                format!("{} is {}, not a string", self.field(key), elide(&v.to_string())),
            )),
        }
    }

    /// An integer, if present.
    pub(crate) fn int(&self, key: &str) -> Result<Option<i64>, LoadError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_i64().map(Some).ok_or_else(|| {
                LoadError::invalid(
                    self.path,
                    format!("{} is {}, not an integer", self.field(key), elide(&v.to_string())),
                )
            }),
        }
    }

    /// A boolean, else `default`.
    pub(crate) fn flag(&self, key: &str, default: bool) -> Result<bool, LoadError> {
        match self.get(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(LoadError::invalid(
                self.path,
                format!("{} is {}, not true or false", self.field(key), elide(&v.to_string())),
            )),
        }
    }

    /// A group size: a positive integer, or −1 (one group per row).
    pub(crate) fn group_size(&self, key: &str) -> Result<Option<usize>, LoadError> {
        match self.int(key)? {
            None | Some(-1) => Ok(None),
            Some(g) if g > 0 => Ok(usize::try_from(g).ok()),
            Some(g) => Err(self.unsupported(key, g, "a positive group size or -1")),
        }
    }
}
