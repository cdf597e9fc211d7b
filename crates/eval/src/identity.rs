//! How a report identifies what it measured: a file's name (never a machine path, which says
//! nothing on another machine) and the SHA-256 of its bytes.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::EvalError;

/// SHA-256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// SHA-256 of a regular file (streamed), lowercase hex. The loaders have read the file already;
/// the type is checked once more, before opening it ([`qdrift_io::regular_file_len`]: opening a
/// pipe swapped in since would block) and on the open file, so that nothing endless (a device, a
/// pipe) is ever hashed.
pub fn sha256_file(path: &Path) -> Result<String, EvalError> {
    qdrift_io::regular_file_len(path, "file to hash")?;
    let f = std::fs::File::open(path).map_err(EvalError::io(path))?;
    if !f.metadata().map_err(EvalError::io(path))?.is_file() {
        let e = std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file; cannot hash it");
        return Err(EvalError::io(path)(e));
    }
    let mut f = f;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).map_err(EvalError::io(path))?;
    Ok(hex(&h.finalize()))
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The file whose hash identifies a model: the file itself, or for a folder its weights.
pub fn model_identity_file(path: &Path) -> PathBuf {
    if path.is_dir() {
        for name in ["model.safetensors", "model.safetensors.index.json"] {
            if path.join(name).exists() {
                return path.join(name);
            }
        }
    }
    path.to_path_buf()
}

/// How a report names a model, eval set or checkpoint: the last component of `path` (a file or
/// folder name, `synthetic:NAME` as given); for paths that end in `.` or `..`, the name of the
/// folder they resolve to.
pub fn report_name(path: &Path) -> String {
    let name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
    name(path)
        .or_else(|| std::fs::canonicalize(path).ok().as_deref().and_then(name))
        .unwrap_or_else(|| path.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_matches_a_known_vector() {
        // FIPS 180-2 example "abc".
        assert_eq!(sha256_hex(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }

    #[cfg(unix)]
    #[test]
    fn a_device_is_refused_before_it_is_opened() {
        let e = sha256_file(Path::new("/dev/zero")).unwrap_err().to_string();
        assert_eq!(e, "/dev/zero: the file to hash is a character device, not a regular file");
    }

    #[test]
    fn reports_name_files_and_folders_without_their_machine_path() {
        let shared = Path::new("/work/main/xtask/../../shared/models/stories260K/stories260K.bin");
        assert_eq!(report_name(shared), "stories260K.bin");
        assert_eq!(report_name(Path::new("/models/SmolLM2-135M-Instruct/")), "SmolLM2-135M-Instruct");
        assert_eq!(report_name(Path::new("synthetic:tiny")), "synthetic:tiny");
        let here = std::env::current_dir().expect("a current folder");
        assert_eq!(report_name(Path::new(".")), report_name(&here));
    }
}
