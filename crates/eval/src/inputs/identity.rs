//! How a report identifies what it measured: a file's name (never a machine path, which says
//! nothing on another machine) and the SHA-256 of its bytes.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use qdrift_report::FileHash;

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

/// A checkpoint's identity: for a file its SHA-256 and no list; for a folder every regular file
/// in it (recursively, by relative `/`-separated name, sorted) with its SHA-256, and the SHA-256 of
/// that list as `sha256sum` prints it (`HASH  NAME\n` per file), so that `sha256sum` run in the
/// folder reproduces it. Names starting with `.` are skipped (a download tool's `.cache/`
/// changes between downloads of the same weights). Symbolic links are followed to regular files;
/// anything else in the folder (a pipe, a device) is refused rather than hashed, and so is a
/// folder nested deeper than 16 levels (a link loop).
pub fn checkpoint_hash(path: &Path) -> Result<(String, Vec<FileHash>), EvalError> {
    if !path.is_dir() {
        return Ok((sha256_file(path)?, Vec::new()));
    }
    let mut names = Vec::new();
    collect_files(path, "", 0, &mut names)?;
    names.sort();
    let mut files = Vec::with_capacity(names.len());
    let mut listing = String::new();
    for name in names {
        let sha256 = sha256_file(&path.join(&name))?;
        listing.push_str(&format!("{sha256}  {name}\n"));
        files.push(FileHash { name, sha256 });
    }
    Ok((sha256_hex(listing.as_bytes()), files))
}

/// The relative names of the files under `dir` (`prefix` is `dir`'s own relative name, `depth`
/// its nesting), but for those starting with `.`.
fn collect_files(dir: &Path, prefix: &str, depth: usize, out: &mut Vec<String>) -> Result<(), EvalError> {
    if depth > 16 {
        let e = std::io::Error::new(std::io::ErrorKind::InvalidInput, "folders nested deeper than 16 levels");
        return Err(EvalError::io(dir)(e));
    }
    for entry in std::fs::read_dir(dir).map_err(EvalError::io(dir))? {
        let entry = entry.map_err(EvalError::io(dir))?;
        let file_name = entry.file_name().to_string_lossy().into_owned();
        if file_name.starts_with('.') {
            continue;
        }
        let name = format!("{prefix}{file_name}");
        let p = entry.path();
        if p.is_dir() {
            collect_files(&p, &format!("{name}/"), depth + 1, out)?;
        } else {
            out.push(name);
        }
    }
    Ok(())
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

    /// A folder's hash is its `sha256sum` listing's, as coreutils computes it, dot-files aside.
    #[test]
    fn a_folder_hashes_as_sha256sum_of_its_files() {
        let dir = std::env::temp_dir().join(format!("qdrift-hash-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::create_dir_all(dir.join(".cache")).unwrap();
        std::fs::write(dir.join("model.safetensors"), b"weights").unwrap();
        std::fs::write(dir.join("config.json"), b"{}").unwrap();
        std::fs::write(dir.join("sub/tokenizer.json"), b"tok").unwrap();
        std::fs::write(dir.join(".cache/download.lock"), b"changes every download").unwrap();
        let (hash, files) = checkpoint_hash(&dir).unwrap();
        let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["config.json", "model.safetensors", "sub/tokenizer.json"]);
        let script = "find . -type f -not -path './.*' | sed 's|^./||' | LC_ALL=C sort | xargs sha256sum | sha256sum";
        let out = std::process::Command::new("sh").arg("-c").arg(script).current_dir(&dir).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).split_whitespace().next(), Some(hash.as_str()));
        assert_eq!(checkpoint_hash(&dir.join("config.json")).unwrap(), (sha256_hex(b"{}"), Vec::new()));
        std::fs::remove_dir_all(&dir).unwrap();
    }

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
