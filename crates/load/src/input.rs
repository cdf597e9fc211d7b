//! Reading input files within a budget, and the finiteness check every loader applies.
//!
//! Every file this crate reads whole goes through [`read_file`]: the path must name a regular
//! file (checked with `metadata` before opening, because opening a named pipe blocks until a
//! writer comes and a device such as `/dev/zero` never ends), at most `max` bytes long, and it
//! is read up to the length `metadata` reported (plus one byte, to notice a file that grows while
//! it is read). Declared counts inside a file are then checked against that length by each
//! reader before anything is allocated.

use std::fs::{File, FileType};
use std::io::Read;
use std::path::Path;

use crate::LoadError;

/// Cap for small JSON files read whole (`config.json`, `generation_config.json`,
/// `tokenizer_config.json`, `model.safetensors.index.json`): the largest real ones (a
/// `tokenizer_config.json` listing 250k added tokens, with a chat template) are a few tens of MB.
pub(crate) const MAX_JSON_BYTES: u64 = 64 << 20;

/// Cap for tokenizer files (`tokenizer.json`, llama2.c `tokenizer.bin`): the largest real
/// vocabularies (256k tokens with merges) take well under 100 MB.
pub(crate) const MAX_TOKENIZER_BYTES: u64 = 512 << 20;

/// No cap beyond the file's own length (model weights: the memory check is the caller's).
pub(crate) const NO_CAP: u64 = u64::MAX;

/// What a non-regular file is, for the refusal message.
fn kind_of(ft: FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_dir() {
        "a folder"
    } else if ft.is_fifo() {
        "a named pipe (FIFO)"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// The length of the regular file at `path` (symbolic links followed); anything else (a FIFO, a
/// device, a socket, a folder) is refused without being opened.
pub(crate) fn regular_file_len(path: &Path) -> Result<u64, LoadError> {
    let meta = std::fs::metadata(path).map_err(|e| LoadError::io(path, e))?;
    check_regular(path, meta.file_type())?;
    Ok(meta.len())
}

/// Errors unless `ft` is a regular file.
pub(crate) fn check_regular(path: &Path, ft: FileType) -> Result<(), LoadError> {
    if ft.is_file() {
        return Ok(());
    }
    Err(LoadError::invalid(
        path,
        format!("is {}, not a regular file; models and tokenizers are read from regular files", kind_of(ft)),
    ))
}

/// The whole regular file at `path`, refused when it is longer than `max` bytes.
pub(crate) fn read_file(path: &Path, max: u64) -> Result<Vec<u8>, LoadError> {
    let len = regular_file_len(path)?;
    if len > max {
        return Err(LoadError::invalid(
            path,
            format!("is {len} bytes; files of this kind over {max} bytes are refused"),
        ));
    }
    let file = File::open(path).map_err(|e| LoadError::io(path, e))?;
    // The path may have been replaced between the check and the open: check the open file too.
    let meta = file.metadata().map_err(|e| LoadError::io(path, e))?;
    check_regular(path, meta.file_type())?;
    let len = meta.len();
    let mut bytes = Vec::new();
    bytes
        .try_reserve_exact(usize::try_from(len).unwrap_or(usize::MAX))
        .map_err(|_| LoadError::invalid(path, format!("is {len} bytes, more than this process can hold in memory")))?;
    file.take(len.saturating_add(1)).read_to_end(&mut bytes).map_err(|e| LoadError::io(path, e))?;
    if bytes.len() as u64 != len {
        return Err(LoadError::invalid(
            path,
            format!("changed while being read: {len} bytes when opened, {} read", bytes.len()),
        ));
    }
    Ok(bytes)
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
        let e = read_file(Path::new("/dev/zero"), NO_CAP).unwrap_err().to_string();
        assert_eq!(
            e,
            "/dev/zero: is a character device, not a regular file; models and tokenizers are read from regular files"
        );
        let dir = tempfile::tempdir().unwrap();
        assert!(read_file(dir.path(), NO_CAP).unwrap_err().to_string().contains("is a folder"));
    }

    #[test]
    fn files_over_the_cap_are_refused_before_reading() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.json");
        std::fs::write(&p, b"{}   ").unwrap();
        assert_eq!(read_file(&p, 5).unwrap(), b"{}   ");
        let e = read_file(&p, 4).unwrap_err().to_string();
        assert!(e.ends_with("config.json: is 5 bytes; files of this kind over 4 bytes are refused"), "{e}");
    }
}
