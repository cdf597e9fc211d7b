//! Atomic file writes.

use std::io::Write;
use std::path::Path;

use crate::ReportError;

/// Writes `bytes` to `path` atomically: into a temporary file in the same folder, flushed to
/// disk, then renamed over `path`. A reader sees the old file or the whole new one, never a part;
/// an interrupted run leaves at most a stray `.tmp` file, never a truncated report.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ReportError> {
    let io = |source| ReportError::Io { path: path.to_path_buf(), source };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let name =
        path.file_name().ok_or_else(|| io(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name")))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = dir.join(tmp_name);
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_whole_file_and_leaves_no_temporary() {
        let dir = std::env::temp_dir().join(format!("qdrift-atomic-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("report.json");
        std::fs::write(&path, b"old contents that are longer").unwrap();
        write_atomic(&path, b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 1, "stray files: {names:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_folder_is_an_error_naming_the_file() {
        let path = Path::new("/nonexistent-qdrift-dir/report.json");
        let e = write_atomic(path, b"x").unwrap_err();
        assert!(e.to_string().contains("/nonexistent-qdrift-dir/report.json"), "{e}");
    }
}
