//! The one I/O module: how qdrift reads a file it is handed and how it writes a file it makes.
//!
//! - **Reads** ([`read_capped`], [`regular_file_len`]): `std::fs::read` trusts the file, but
//!   `/dev/zero` grows memory without bound and opening a named pipe for reading blocks until a
//!   writer comes. So the path's type is checked with `metadata` first, without opening it; the
//!   open file is checked again (the path may have been replaced in between); memory is reserved
//!   fallibly; and the read stops one byte past the cap chosen per kind of file, so that a file
//!   too large is refused with a message instead of exhausting memory. The open file's stamp
//!   (size, times, inode) is compared after the read, so a file rewritten meanwhile is refused.
//! - **Large files read piece by piece** ([`PinnedFile`], `pinned.rs`): positioned reads into
//!   buffers of their own (a file cut short is an error, where a memory map would die of
//!   `SIGBUS`), each followed by a check that the file, open and at its path, is the one opened
//!   (its stamp, `stamp.rs`: size, times, inode, device).
//! - **Writes** ([`write_atomic`], [`AtomicFile`]): a file appears whole or not at all. It is
//!   written into a temporary file beside the target whose name is unique per writer (process id
//!   plus a random part, created with `O_EXCL`, so that two writers never share one and a file
//!   qdrift did not create is never truncated or deleted), flushed to disk, then renamed over the
//!   target. A write that fails, or an [`AtomicFile`] dropped before [`AtomicFile::commit`],
//!   removes its temporary file.
//!   The target is replaced only when it is a regular file (or absent): a device, a named pipe, a
//!   socket or a folder at the path is refused when the write starts and again before the
//!   rename; a symbolic link to a regular file is followed, so the file it names is replaced and
//!   the link kept.
//! - **Staging names** ([`unique_sibling`]): the same unique naming for staging folders that are
//!   renamed into place as a whole.
//! - **The output rule** ([`PathCheck`], `paths.rs`): before any work, a command's outputs are
//!   checked against their targets' types, its inputs (device and inode) and each other.
//! - **User strings in messages** ([`elide`], `text.rs`): a long string from the user or a file
//!   is quoted by its first and last characters, so an error stays one short line.
//! - **Signals** ([`RemoveOnSignal`], [`uninterrupted`], `signals.rs`): the staging folders, lock
//!   files and temporary files a run registers are removed when SIGINT, SIGTERM or SIGHUP ends
//!   it, and the process then ends as the signal would have ended it; an [`AtomicFile`]'s
//!   temporary file is registered.
//! - **Free space** ([`free_space`], `space.rs`): what the filesystem an output will be written on
//!   can still take, and which filesystem that is, for a check before the work.
//!
//! **Invariants: no qdrift crate reads a file it is handed or writes a file it makes except
//! through this crate; this crate depends on no other qdrift crate.**
//!
//! Module floors, top first: a module imports only modules on floors below its own
//! (`cargo xtask cycles` checks it).
//!
//! | floor |
//! |---|
//! | `pinned.rs` |
//! | `paths.rs`, `signals.rs`, `space.rs`, `stamp.rs`, `text.rs` |

mod paths;
mod pinned;
mod signals;
mod space;
mod stamp;
mod text;

pub use paths::PathCheck;
pub use pinned::PinnedFile;
pub use signals::{RemoveOnSignal, registered, uninterrupted};
pub use space::{FreeSpace, free_space};
pub use text::{ELIDE_KEEP, MESSAGE_MAX, elide, message_line};

use std::fs::{File, FileType};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// Why a read or a write failed. Every message starts with the path.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    /// The file could not be examined, opened or read.
    #[error("{path}: cannot read the {what}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The kind of file in words (`report`, `thresholds file`, `model`, …).
        what: &'static str,
        /// The cause.
        source: std::io::Error,
    },
    /// The path is a folder, a FIFO, a device or a socket where a regular file is read.
    #[error("{path}: the {what} is {kind}, not a regular file")]
    NotAFile {
        /// The path.
        path: PathBuf,
        /// The kind of file expected.
        what: &'static str,
        /// What it is instead ([`file_kind`]).
        kind: &'static str,
    },
    /// The file is larger than qdrift reads for its kind.
    #[error("{path}: the {what} is larger than its limit (more than {cap} bytes)")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The kind of file.
        what: &'static str,
        /// The limit in bytes.
        cap: u64,
    },
    /// The file's length changed between opening it and reading it.
    #[error("{path}: the {what} changed while being read ({expected} bytes when opened, {read} read)")]
    Changed {
        /// The file.
        path: PathBuf,
        /// The kind of file.
        what: &'static str,
        /// Its length when opened.
        expected: u64,
        /// The bytes read.
        read: u64,
    },
    /// The file changed after it was opened (its size, times, inode or device, through the open
    /// file or its path, or bytes read twice): a file rewritten in place or cut short while
    /// qdrift reads it ([`PinnedFile`], [`read_capped`]).
    #[error("{path}: the {what} changed while qdrift was reading it ({change}); rerun once the file is complete")]
    Rewritten {
        /// The file.
        path: PathBuf,
        /// The kind of file.
        what: &'static str,
        /// What changed, in words (`size 4096 → 100 bytes`).
        change: String,
    },
    /// An output path breaks the output rule ([`PathCheck`]): it is a device, a pipe or a
    /// folder where a file is written, it is an input, or another output has it.
    #[error("{flag} {path}: {problem}")]
    Output {
        /// The flag (or argument) that named it.
        flag: String,
        /// The path as given.
        path: PathBuf,
        /// What is wrong, in words.
        problem: String,
    },
    /// The file could not be written (or its temporary file created, flushed or renamed).
    #[error("{path}: cannot write: {source}")]
    Write {
        /// The target file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

impl IoError {
    /// The path the error is about.
    pub fn path(&self) -> &Path {
        match self {
            IoError::Read { path, .. }
            | IoError::NotAFile { path, .. }
            | IoError::TooLarge { path, .. }
            | IoError::Changed { path, .. }
            | IoError::Rewritten { path, .. }
            | IoError::Output { path, .. }
            | IoError::Write { path, .. } => path,
        }
    }
}

/// What a path that is not a regular file is, in words ("a named pipe (FIFO)", "a folder", …).
pub fn file_kind(kind: FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return "a named pipe (FIFO)";
        }
        if kind.is_char_device() {
            return "a character device";
        }
        if kind.is_block_device() {
            return "a block device";
        }
        if kind.is_socket() {
            return "a socket";
        }
    }
    if kind.is_dir() {
        "a folder"
    } else if kind.is_file() {
        "a regular file"
    } else {
        "not a regular file"
    }
}

/// The length of the regular file at `path` (symbolic links followed). Anything else (a FIFO, a
/// device, a socket, a folder) is refused without being opened. `what` names the kind of file.
pub fn regular_file_len(path: &Path, what: &'static str) -> Result<u64, IoError> {
    let meta = std::fs::metadata(path).map_err(|source| IoError::Read { path: path.to_path_buf(), what, source })?;
    check_regular(path, what, meta.file_type())?;
    Ok(meta.len())
}

/// Errors unless `kind` is a regular file's.
fn check_regular(path: &Path, what: &'static str, kind: FileType) -> Result<(), IoError> {
    if kind.is_file() {
        Ok(())
    } else {
        Err(IoError::NotAFile { path: path.to_path_buf(), what, kind: file_kind(kind) })
    }
}

/// Reads the regular file `path` whole, refusing anything else before opening it, and refusing a
/// file of more than `cap` bytes (pass `u64::MAX` for no cap beyond the file's own length). The
/// open file's type is checked again, memory is reserved fallibly, and at most its length plus
/// one byte is read, so a file that grows or shrinks while being read is refused too.
pub fn read_capped(path: &Path, cap: u64, what: &'static str) -> Result<Vec<u8>, IoError> {
    let read = |source| IoError::Read { path: path.to_path_buf(), what, source };
    let len = regular_file_len(path, what)?;
    if len > cap {
        return Err(IoError::TooLarge { path: path.to_path_buf(), what, cap });
    }
    let mut file = File::open(path).map_err(read)?;
    let meta = file.metadata().map_err(read)?;
    check_regular(path, what, meta.file_type())?;
    let len = meta.len();
    if len > cap {
        return Err(IoError::TooLarge { path: path.to_path_buf(), what, cap });
    }
    let mut bytes = Vec::new();
    let want = usize::try_from(len).map_err(|_| IoError::TooLarge { path: path.to_path_buf(), what, cap: len })?;
    bytes.try_reserve_exact(want).map_err(|_| {
        read(std::io::Error::new(std::io::ErrorKind::OutOfMemory, format!("{len} bytes do not fit in memory")))
    })?;
    (&mut file).take(len.saturating_add(1)).read_to_end(&mut bytes).map_err(read)?;
    if bytes.len() as u64 != len {
        return Err(IoError::Changed { path: path.to_path_buf(), what, expected: len, read: bytes.len() as u64 });
    }
    // Same length, other bytes: rewritten in place while read.
    let after = file.metadata().map_err(read)?;
    if let Some(change) = stamp::Stamp::of(&meta).change_to(&stamp::Stamp::of(&after)) {
        return Err(IoError::Rewritten { path: path.to_path_buf(), what, change });
    }
    Ok(bytes)
}

/// A name beside `path`, unique to this writer: `.NAME.qdrift-TAG-PID-RANDOM` in `path`'s folder
/// (`.` for a bare file name). The random part comes from the clock and a process-wide counter;
/// callers that create the file or folder must still use an exclusive create (`create_new`,
/// `create_dir`), which [`AtomicFile`] does.
pub fn unique_sibling(path: &Path, tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = folder_of(path);
    let name = path.file_name().map_or_else(|| "qdrift".into(), |n| n.to_string_lossy().into_owned());
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    // SplitMix64's finaliser mixes the clock and the counter into one random-looking word.
    let mut x = nanos ^ count.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    dir.join(format!(".{name}.qdrift-{tag}-{}-{x:016x}", std::process::id()))
}

/// The folder a file named by `path` lives in (`.` for a bare file name).
fn folder_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Writes `bytes` to `path` atomically (see [`AtomicFile`]): a reader sees the old file or the
/// whole new one, never a part.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), IoError> {
    let mut file = AtomicFile::create(path)?;
    file.write_all(bytes).map_err(|source| IoError::Write { path: path.to_path_buf(), source })?;
    file.commit()
}

/// A file being written in place of `path`: bytes go to a temporary file beside it (a name from
/// [`unique_sibling`], created exclusively), [`AtomicFile::commit`] flushes it to disk and renames
/// it over `path`. Dropped without a commit, the temporary file is removed.
pub struct AtomicFile {
    /// The target as given (for messages).
    path: PathBuf,
    /// The file replaced: `path`, or the regular file a link at `path` names.
    target: PathBuf,
    temp: PathBuf,
    out: Option<BufWriter<File>>,
    /// The temporary file, removed if a signal ends the process before the commit.
    _on_signal: Option<RemoveOnSignal>,
}

impl AtomicFile {
    /// Creates the temporary file for `path` (for a symbolic link to a regular file, for the
    /// file it names). An existing target that is not a regular file is refused.
    pub fn create(path: &Path) -> Result<Self, IoError> {
        let write = |source| IoError::Write { path: path.to_path_buf(), source };
        if path.file_name().is_none() {
            return Err(write(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name")));
        }
        let target = resolve_link(path);
        replaceable(&target).map_err(write)?;
        // A clash with another writer's name is astronomically unlikely; retry a few times anyway.
        let mut last = None;
        for _ in 0..8 {
            let temp = unique_sibling(&target, "tmp");
            match std::fs::OpenOptions::new().write(true).create_new(true).open(&temp) {
                Ok(file) => {
                    let on_signal = Some(RemoveOnSignal::new(&temp));
                    let out = Some(BufWriter::new(file));
                    return Ok(AtomicFile { path: path.to_path_buf(), target, temp, out, _on_signal: on_signal });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
                Err(e) => return Err(write(e)),
            }
        }
        Err(write(last.unwrap_or_else(|| std::io::Error::other("no unique temporary name"))))
    }

    /// The temporary file's path, for writers that take a path rather than a [`Write`]r (write
    /// through it only before [`AtomicFile::commit`], and not through `self` at the same time).
    pub fn temp_path(&self) -> &Path {
        &self.temp
    }

    /// The target's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Flushes the temporary file to disk and renames it over the target. On an error the
    /// temporary file is removed and the target is left as it was.
    pub fn commit(mut self) -> Result<(), IoError> {
        let write = |source| IoError::Write { path: self.path.clone(), source };
        let out = self.out.take().ok_or_else(|| write(std::io::Error::other("already committed")))?;
        let file = out.into_inner().map_err(|e| write(e.into_error()))?;
        file.sync_all().map_err(write)?;
        drop(file);
        // The target may have been replaced by something else while the file was written.
        replaceable(&self.target).map_err(write)?;
        std::fs::rename(&self.temp, &self.target).map_err(write)?;
        // Renamed: nothing left for Drop or a signal to remove.
        self.temp = PathBuf::new();
        self._on_signal = None;
        Ok(())
    }
}

/// `path`, or, when it is a symbolic link that resolves, the path it resolves to (so that the
/// file a link names is replaced, not the link).
fn resolve_link(path: &Path) -> PathBuf {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()),
        _ => path.to_path_buf(),
    }
}

/// Errors unless `target` is absent or a regular file: qdrift never replaces a device, a named
/// pipe, a socket or a folder.
fn replaceable(target: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(target) {
        Ok(m) if !m.is_file() && !m.file_type().is_symlink() => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("it is {}; qdrift writes over regular files only", file_kind(m.file_type())),
        )),
        _ => Ok(()),
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match &mut self.out {
            Some(out) => out.write(buf),
            None => Err(std::io::Error::other("already committed")),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match &mut self.out {
            Some(out) => out.flush(),
            None => Ok(()),
        }
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        self.out = None;
        if !self.temp.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.temp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    #[test]
    fn write_atomic_replaces_the_whole_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("report.json");
        std::fs::write(&path, b"old contents that are longer").unwrap();
        write_atomic(&path, b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        assert_eq!(names(dir.path()), ["report.json"]);
    }

    #[test]
    fn a_dropped_atomic_file_leaves_the_target_and_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.gguf");
        std::fs::write(&path, b"old").unwrap();
        {
            let mut f = AtomicFile::create(&path).unwrap();
            f.write_all(b"half of a new fi").unwrap();
            assert!(f.temp_path().exists());
        }
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        assert_eq!(names(dir.path()), ["model.gguf"]);
    }

    /// A terminating signal removes a temporary file until its commit (signals.rs).
    #[test]
    fn an_atomic_files_temporary_is_registered_until_committed() {
        let dir = tempfile::tempdir().unwrap();
        let file = AtomicFile::create(&dir.path().join("out.json")).unwrap();
        let temp = file.temp_path().to_path_buf();
        assert!(registered().contains(&temp));
        file.commit().unwrap();
        assert!(!registered().contains(&temp));
        drop(AtomicFile::create(&dir.path().join("dropped.json")).unwrap());
        assert!(registered().iter().all(|p| !p.starts_with(dir.path())));
    }

    #[test]
    fn a_users_file_named_like_an_old_temporary_is_never_touched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x");
        for user in ["x.gguf.tmp", "x.tmp", ".x.tmp"] {
            std::fs::write(dir.path().join(user), b"mine").unwrap();
        }
        write_atomic(&path, b"new").unwrap();
        for user in ["x.gguf.tmp", "x.tmp", ".x.tmp"] {
            assert_eq!(std::fs::read(dir.path().join(user)).unwrap(), b"mine", "{user}");
        }
    }

    #[test]
    fn concurrent_writers_of_one_target_never_share_a_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("same.gguf");
        std::thread::scope(|s| {
            for i in 0..16u8 {
                let path = &path;
                s.spawn(move || write_atomic(path, &[i; 4096]).unwrap());
            }
        });
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len(), 4096);
        assert!(bytes.iter().all(|&b| b == bytes[0]), "a torn write");
        assert_eq!(names(dir.path()), ["same.gguf"]);
    }

    #[cfg(unix)]
    #[test]
    fn a_special_file_is_never_replaced_and_a_link_is_followed() {
        use std::os::unix::fs::FileTypeExt;
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe");
        if std::process::Command::new("mkfifo").arg(&fifo).status().is_ok_and(|s| s.success()) {
            let e = write_atomic(&fifo, b"x").unwrap_err().to_string();
            assert!(
                e.ends_with("pipe: cannot write: it is a named pipe (FIFO); qdrift writes over regular files only"),
                "{e}"
            );
            assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
        }
        let e = write_atomic(dir.path(), b"x").unwrap_err().to_string();
        assert!(e.contains("it is a folder"), "{e}");
        let real = dir.path().join("real.json");
        std::fs::write(&real, b"old").unwrap();
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        write_atomic(&link, b"new").unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read(&real).unwrap(), b"new");
    }

    #[test]
    fn a_missing_folder_is_an_error_naming_the_file() {
        let e = write_atomic(Path::new("/nonexistent-qdrift-dir/report.json"), b"x").unwrap_err().to_string();
        assert!(e.starts_with("/nonexistent-qdrift-dir/report.json: cannot write"), "{e}");
    }

    #[test]
    fn unique_siblings_differ_and_stay_in_the_folder() {
        let a = unique_sibling(Path::new("out/report"), "new");
        let b = unique_sibling(Path::new("out/report"), "new");
        assert_ne!(a, b);
        assert_eq!(a.parent(), Some(Path::new("out")));
        let name = a.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with(&format!(".report.qdrift-new-{}-", std::process::id())), "{name}");
        assert_eq!(unique_sibling(Path::new("bare"), "tmp").parent(), Some(Path::new(".")));
    }

    #[test]
    fn a_file_within_the_cap_is_read_whole_and_one_over_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.json");
        std::fs::write(&path, b"12345").unwrap();
        assert_eq!(read_capped(&path, 5, "report").unwrap(), b"12345");
        let e = read_capped(&path, 4, "report").unwrap_err().to_string();
        assert!(e.ends_with("x.json: the report is larger than its limit (more than 4 bytes)"), "{e}");
        assert_eq!(regular_file_len(&path, "report").unwrap(), 5);
    }

    #[test]
    fn a_folder_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let e = read_capped(dir.path(), 4, "report").unwrap_err().to_string();
        assert!(e.ends_with("the report is a folder, not a regular file"), "{e}");
    }

    #[cfg(unix)]
    #[test]
    fn a_device_is_refused_without_reading_it() {
        let e = read_capped(Path::new("/dev/zero"), u64::MAX, "thresholds file").unwrap_err().to_string();
        assert_eq!(e, "/dev/zero: the thresholds file is a character device, not a regular file");
    }

    #[cfg(unix)]
    #[test]
    fn a_named_pipe_is_refused_without_opening_it() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("manifest.json");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if !made.is_ok_and(|s| s.success()) {
            eprintln!("skipped: mkfifo is not available");
            return;
        }
        // Opening the FIFO for reading would block this test forever: the refusal must come first.
        let e = read_capped(&fifo, 1 << 20, "store manifest").unwrap_err().to_string();
        assert!(e.ends_with("manifest.json: the store manifest is a named pipe (FIFO), not a regular file"), "{e}");
    }
}
