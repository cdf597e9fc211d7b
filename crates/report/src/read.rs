//! [`read_capped`]: the one way qdrift reads a file a person hands it (a report, a thresholds
//! file, an eval set).
//!
//! `std::fs::read` trusts the file: `/dev/zero` grows memory without bound and a named pipe
//! blocks forever. So the path's type is checked first, without opening it (opening a FIFO for
//! reading blocks until a writer comes), and the read stops one byte past a cap chosen per kind
//! of file, so that a file too large is refused with a message instead of exhausting memory.

use std::fs::FileType;
use std::io::Read;
use std::path::Path;

use crate::ReportError;

/// The largest `report.json` read: 256 MiB, far above any real report (a 1 000-prompt,
/// 4 096-token run with ten variants is a few MiB) yet small enough to parse in seconds.
pub const REPORT_CAP: u64 = 256 << 20;

/// The largest thresholds file read: 1 MiB, thousands of checks.
pub const THRESHOLDS_CAP: u64 = 1 << 20;

/// The largest eval set read: 64 MiB, tens of thousands of long prompts.
pub const EVAL_SET_CAP: u64 = 64 << 20;

/// Reads the regular file `path`, refusing anything else (a folder, a FIFO, a device, a socket)
/// before opening it, and refusing a file of more than `cap` bytes after reading at most
/// `cap + 1`. `what` names the kind of file in messages (`report`, `thresholds file`, …).
pub fn read_capped(path: &Path, cap: u64, what: &'static str) -> Result<Vec<u8>, ReportError> {
    let io = |source| ReportError::Read { path: path.to_path_buf(), what, source };
    let kind = std::fs::metadata(path).map_err(io)?.file_type();
    if !kind.is_file() {
        return Err(ReportError::NotAFile { path: path.to_path_buf(), what, kind: describe(kind) });
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path).map_err(io)?.take(cap.saturating_add(1)).read_to_end(&mut bytes).map_err(io)?;
    if bytes.len() as u64 > cap {
        return Err(ReportError::TooLarge { path: path.to_path_buf(), what, cap });
    }
    Ok(bytes)
}

/// What a path that is not a regular file is, in words.
fn describe(kind: FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return "a named pipe (FIFO)";
        }
        if kind.is_char_device() || kind.is_block_device() {
            return "a device";
        }
        if kind.is_socket() {
            return "a socket";
        }
    }
    if kind.is_dir() { "a folder" } else { "not a regular file" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_within_the_cap_is_read_whole() {
        let dir = std::env::temp_dir().join(format!("qdrift-read-capped-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("x.json");
        std::fs::write(&path, b"12345").unwrap();
        assert_eq!(read_capped(&path, 5, "report").unwrap(), b"12345");
        let e = read_capped(&path, 4, "report").unwrap_err().to_string();
        assert!(e.contains("x.json") && e.contains("more than 4 bytes"), "{e}");
        let e = read_capped(&dir, 4, "report").unwrap_err().to_string();
        assert!(e.contains("is a folder, not a regular file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn a_device_is_refused_without_reading_it() {
        let e = read_capped(Path::new("/dev/zero"), 1 << 20, "thresholds file").unwrap_err().to_string();
        assert_eq!(e, "/dev/zero: the thresholds file is a device, not a regular file");
    }
}
