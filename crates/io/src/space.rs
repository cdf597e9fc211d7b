//! Free disk space where an output will be written, so that a command can refuse, before its
//! work, to write more than the filesystem holds.
//!
//! An output's path usually does not exist yet: its filesystem is that of its nearest existing
//! ancestor (symbolic links followed), which is where a folder created on the way would live too.
//! Outputs on one filesystem share its space: [`FreeSpace::device`] tells them apart.

use std::path::{Path, PathBuf};

use crate::IoError;

/// The filesystem an output will be written on, and how much it can still take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FreeSpace {
    /// The filesystem's device (`st_dev`): outputs with the same one share [`FreeSpace::available`].
    pub device: u64,
    /// Bytes an unprivileged process may still write there (`f_bavail × f_frsize`: the blocks
    /// reserved for root left out).
    pub available: u64,
}

/// The free space of the filesystem `path` will be written on (see the module's documentation).
///
/// # Errors
/// [`IoError::Read`] (`what`: "free space") when no ancestor of `path` can be examined or the
/// filesystem cannot be queried.
pub fn free_space(path: &Path) -> Result<FreeSpace, IoError> {
    let fail = |source| IoError::Read { path: path.to_path_buf(), what: "free space", source };
    let (existing, meta) = nearest_existing(path).map_err(fail)?;
    Ok(FreeSpace { device: device_of(&meta), available: available_bytes(&existing).map_err(fail)? })
}

/// `path` made absolute, or its nearest ancestor that exists, with its metadata.
fn nearest_existing(path: &Path) -> std::io::Result<(PathBuf, std::fs::Metadata)> {
    let abs = std::path::absolute(path)?;
    let mut candidate = abs.as_path();
    loop {
        match std::fs::metadata(candidate) {
            Ok(meta) => return Ok((candidate.to_path_buf(), meta)),
            Err(e) => candidate = candidate.parent().ok_or(e)?,
        }
    }
}

#[cfg(unix)]
fn device_of(meta: &std::fs::Metadata) -> u64 {
    std::os::unix::fs::MetadataExt::dev(meta)
}

#[cfg(not(unix))]
fn device_of(_meta: &std::fs::Metadata) -> u64 {
    0
}

/// `statvfs(2)`'s space available to unprivileged processes on `path`'s filesystem.
#[cfg(unix)]
fn available_bytes(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "the path holds a NUL byte"))?;
    let mut stats = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c_path` is a NUL-terminated string that outlives the call and `stats` points to
    // writable memory of the struct's size; the struct is read only after statvfs returned 0,
    // which means it filled it.
    let stats = unsafe {
        if libc::statvfs(c_path.as_ptr(), stats.as_mut_ptr()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        stats.assume_init()
    };
    // Both fields are u64 on Linux and narrower on some other targets.
    #[allow(clippy::unnecessary_cast)]
    let (blocks, block_size) = (stats.f_bavail as u64, stats.f_frsize as u64);
    Ok(blocks.saturating_mul(block_size))
}

#[cfg(not(unix))]
fn available_bytes(_path: &Path) -> std::io::Result<u64> {
    Ok(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_not_yet_there_has_its_existing_ancestors_filesystem() {
        let dir = tempfile::tempdir().unwrap();
        let here = free_space(dir.path()).unwrap();
        let below = free_space(&dir.path().join("not/yet/there.jsonl")).unwrap();
        assert_eq!(here.device, below.device);
        assert!(here.available > 0);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn another_filesystem_has_another_device() {
        let tmp = free_space(&std::env::temp_dir()).unwrap();
        // /proc is always its own filesystem on Linux, and holds no free space.
        let proc = free_space(Path::new("/proc/qdrift-absent")).unwrap();
        assert_ne!(tmp.device, proc.device);
        assert_eq!(proc.available, 0);
    }
}
