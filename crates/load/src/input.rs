//! Reading input files within a budget, and the finiteness check every loader applies.
//!
//! Every file this crate reads whole goes through [`read_file`], which is
//! [`qdrift_io::read_capped`]: the path must name a regular file (checked with `metadata` before
//! opening, because opening a named pipe blocks until a writer comes and a device such as
//! `/dev/zero` never ends), no longer than its [`FileKind`]'s cap, and it is read up to the length
//! `metadata` reported (plus one byte, to notice a file that grows while it is read). Weights read
//! part by part are opened as a [`qdrift_io::PinnedFile`] ([`open_pinned`]): checked the same way
//! before they are opened, then read with positioned reads, each checked against the file as it
//! was opened. Declared counts inside a file are then checked against that length by each reader
//! before anything is allocated.

use std::fs::FileType;
use std::path::Path;

use crate::LoadError;

/// A kind of file read whole: its name in messages and its size cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileKind {
    /// What the file is, for messages (`the JSON file is larger than its limit`).
    pub(crate) what: &'static str,
    /// The most bytes read.
    pub(crate) cap: u64,
}

/// Small JSON files read whole (`config.json`, `generation_config.json`, `tokenizer_config.json`,
/// `model.safetensors.index.json`): the largest real ones (a `tokenizer_config.json` listing 250k
/// added tokens, with a chat template) are a few tens of MB.
pub(crate) const JSON: FileKind = FileKind { what: "JSON file", cap: 64 << 20 };

/// A chat template beside a Hugging Face folder's JSON files (`chat_template.jinja`), capped alike.
pub(crate) const CHAT_TEMPLATE: FileKind = FileKind { what: "chat template", cap: JSON.cap };

/// Tokenizer files (`tokenizer.json`, llama2.c `tokenizer.bin`): the largest real vocabularies
/// (256k tokens with merges) take well under 100 MB.
pub(crate) const TOKENIZER: FileKind = FileKind { what: "tokenizer", cap: 512 << 20 };

/// Model files read whole (GGUF, llama2.c): no cap beyond the file's own length (the memory check
/// is the caller's).
pub(crate) const MODEL: FileKind = FileKind { what: "model", cap: u64::MAX };

/// Errors unless `ft`, the type of the file at `path` of `kind`, is a regular file's.
pub(crate) fn check_regular(path: &Path, kind: FileKind, ft: FileType) -> Result<(), LoadError> {
    if ft.is_file() {
        return Ok(());
    }
    Err(qdrift_io::IoError::NotAFile { path: path.to_path_buf(), what: kind.what, kind: qdrift_io::file_kind(ft) }
        .into())
}

/// The regular file at `path` of `kind`, open for positioned reads that each check it is still
/// the file opened; anything else (a FIFO, a device) is refused before it is opened, and the
/// opened file is checked again (it may have been replaced in between).
pub(crate) fn open_pinned(path: &Path, kind: FileKind) -> Result<qdrift_io::PinnedFile, LoadError> {
    Ok(qdrift_io::PinnedFile::open(path, kind.what)?)
}

/// The whole regular file at `path`, refused when it is longer than `kind`'s cap.
pub(crate) fn read_file(path: &Path, kind: FileKind) -> Result<Vec<u8>, LoadError> {
    Ok(qdrift_io::read_capped(path, kind.cap, kind.what)?)
}

/// The JSON file at `path` of `kind`, parsed.
pub(crate) fn read_json(path: &Path, kind: FileKind) -> Result<serde_json::Value, LoadError> {
    let bytes = read_file(path, kind)?;
    serde_json::from_slice(&bytes).map_err(|e| LoadError::invalid(path, format!("not valid JSON: {e}")))
}

/// The small JSON file at `path` ([`JSON`]), parsed; `None` when there is none.
pub(crate) fn optional_json(path: &Path) -> Result<Option<serde_json::Value>, LoadError> {
    if path.exists() { read_json(path, JSON).map(Some) } else { Ok(None) }
}

/// Errors naming the file, the tensor and the flat index of its first NaN or infinity.
///
/// One pass over memory, branch-free within a chunk so it vectorises; the index is looked up
/// only in the chunk that has a bad value.
pub(crate) fn check_finite(path: &Path, tensor: &str, values: &[f32]) -> Result<(), LoadError> {
    const CHUNK: usize = 4096;
    const EXPONENT: u32 = 0x7f80_0000;
    for (c, chunk) in values.chunks(CHUNK).enumerate() {
        let bad = chunk.iter().fold(false, |bad, v| bad | (v.to_bits() & EXPONENT == EXPONENT));
        if bad && let Some(i) = chunk.iter().position(|v| !v.is_finite()) {
            let v = chunk[i];
            return Err(LoadError::invalid(
                path,
                format!("tensor {tensor} has a non-finite value ({v}) at flat index {}", c * CHUNK + i),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_finite_names_the_first_bad_index_across_chunks() {
        let mut v = vec![0.5f32; 10_000];
        assert!(check_finite(Path::new("m"), "t", &v).is_ok());
        v[9_000] = f32::INFINITY;
        v[9_500] = f32::NAN;
        let e = check_finite(Path::new("m"), "t", &v).unwrap_err().to_string();
        assert_eq!(e, "m: tensor t has a non-finite value (inf) at flat index 9000");
    }

    #[test]
    fn devices_and_folders_are_refused_unopened() {
        let e = read_file(Path::new("/dev/zero"), MODEL).unwrap_err().to_string();
        assert_eq!(e, "/dev/zero: the model is a character device, not a regular file");
        let dir = tempfile::tempdir().unwrap();
        assert!(read_file(dir.path(), MODEL).unwrap_err().to_string().contains("is a folder"));
    }

    #[test]
    fn files_over_the_cap_are_refused_before_reading() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.json");
        std::fs::write(&p, b"{}   ").unwrap();
        let kind = |cap| FileKind { what: "JSON file", cap };
        assert_eq!(read_file(&p, kind(5)).unwrap(), b"{}   ");
        let e = read_file(&p, kind(4)).unwrap_err().to_string();
        assert!(e.ends_with("config.json: the JSON file is larger than its limit (more than 4 bytes)"), "{e}");
    }
}
