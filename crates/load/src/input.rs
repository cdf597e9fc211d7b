//! Reading input files within a budget, and the finiteness check every loader applies.
//!
//! Every file this crate reads whole goes through [`read_file`], which is
//! [`qdrift_io::read_capped`]: the path must name a regular file (checked with `metadata` before
//! opening, because opening a named pipe blocks until a writer comes and a device such as
//! `/dev/zero` never ends), no longer than its [`FileKind`]'s cap, and it is read up to the length
//! `metadata` reported (plus one byte, to notice a file that grows while it is read). Memory-mapped
//! weights are checked the same way before they are opened ([`regular_file_len`],
//! [`check_regular`]). Declared counts inside a file are then checked against that length by each
//! reader before anything is allocated.

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

/// The length of the regular file `path` of `kind` (symbolic links followed); anything else (a
/// FIFO, a device, a socket, a folder) is refused without being opened.
pub(crate) fn regular_file_len(path: &Path, kind: FileKind) -> Result<u64, LoadError> {
    Ok(qdrift_io::regular_file_len(path, kind.what)?)
}

/// Errors unless `ft`, the type of the file at `path` of `kind`, is a regular file's.
pub(crate) fn check_regular(path: &Path, kind: FileKind, ft: FileType) -> Result<(), LoadError> {
    if ft.is_file() {
        return Ok(());
    }
    Err(qdrift_io::IoError::NotAFile { path: path.to_path_buf(), what: kind.what, kind: qdrift_io::file_kind(ft) }
        .into())
}

/// The regular file at `path` of `kind`, memory-mapped read-only; anything else (a FIFO, a
/// device) is refused before it is opened, and the opened file is checked again (it may have
/// been replaced in between).
pub(crate) fn map_file(path: &Path, kind: FileKind) -> Result<memmap2::Mmap, LoadError> {
    regular_file_len(path, kind)?;
    let file = std::fs::File::open(path).map_err(|e| LoadError::io(path, e))?;
    let opened = file.metadata().map_err(|e| LoadError::io(path, e))?;
    check_regular(path, kind, opened.file_type())?;
    // SAFETY: the map is read-only and private; as for every memory-mapped reader, a file
    // truncated by another process while mapped may fault. Model files are not rewritten in
    // place by the tools that produce them (they write and rename).
    unsafe { memmap2::Mmap::map(&file) }.map_err(|e| LoadError::io(path, e))
}

/// Unmaps the pages of `map` read so far from this process (`madvise(MADV_DONTNEED)`), leaving
/// them in the kernel's page cache: a reader that hands out a model part by part then holds no
/// more of the file than the part it is reading, in resident memory as in fact. A later read
/// maps the same bytes again from the cache or the file.
///
/// Best effort: where the call fails (it does not on Linux for a mapping made by [`map_file`])
/// the pages stay mapped, and reclaimable, as before it.
pub(crate) fn release_pages(map: &memmap2::Mmap) {
    #[cfg(unix)]
    // SAFETY: the mapping is read-only and private and never written, so it holds no private
    // copies for MADV_DONTNEED to discard: the next access reads the file's unchanged bytes
    // again. No slice of it is held across the call (parts are copied into f32 tensors first).
    let _ = unsafe { map.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) };
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
