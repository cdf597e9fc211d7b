//! [`PinnedFile`]: a large input file (a model's weights) read piece by piece with positioned
//! reads, each piece into a buffer of its own, and refused as soon as it is seen to differ from
//! the file that was opened.
//!
//! A memory map of such a file trusts it twice over: a file truncated while mapped kills the
//! process with `SIGBUS` on the next access past its new end, and a file rewritten in place
//! (`dd conv=notrunc`, `rsync --inplace`, a resumed download) changes the bytes under the map,
//! so a reader that checked the file once and reads it again later computes with other bytes
//! than it checked. Here a short file is an error from `pread`, and every read is followed by a
//! check of the file's stamp (size, modification and status-change times, inode, device), both
//! through the open descriptor and through the path, plus a checksum of the bytes against the
//! first read of the same range, which catches a rewrite within one tick of the file system's
//! clock as well.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use crate::stamp::Stamp;
use crate::{IoError, check_regular, regular_file_len};

/// A regular file opened for positioned reads ([`PinnedFile::read_at`]), pinned to the stamp it
/// had when opened: every read checks that neither the open file nor the file at its path has
/// changed since, and that bytes read twice are the same bytes.
#[derive(Debug)]
pub struct PinnedFile {
    path: PathBuf,
    what: &'static str,
    file: File,
    stamp: Stamp,
    /// The checksum of each range read so far, `(offset, length)` → [`checksum`].
    sums: Mutex<HashMap<(u64, usize), u64>>,
}

impl PinnedFile {
    /// Opens the regular file at `path` (symbolic links followed); anything else (a FIFO, a
    /// device, a socket, a folder) is refused without being opened, and the opened file is
    /// checked again (the path may have been replaced in between). `what` names the kind of file
    /// in messages (`model`).
    pub fn open(path: &Path, what: &'static str) -> Result<PinnedFile, IoError> {
        let read = |source| IoError::Read { path: path.to_path_buf(), what, source };
        regular_file_len(path, what)?;
        let file = File::open(path).map_err(read)?;
        let meta = file.metadata().map_err(read)?;
        check_regular(path, what, meta.file_type())?;
        let stamp = Stamp::of(&meta);
        Ok(PinnedFile { path: path.to_path_buf(), what, file, stamp, sums: Mutex::default() })
    }

    /// The path it was opened by.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its length in bytes when it was opened.
    pub fn len(&self) -> u64 {
        self.stamp.len()
    }

    /// Whether it was empty when opened.
    pub fn is_empty(&self) -> bool {
        self.stamp.len() == 0
    }

    /// `len` bytes from `offset`, in a buffer of their own; then the file is checked unchanged
    /// ([`PinnedFile::check_unchanged`]), so that a write before or during the read is caught,
    /// and the bytes against those of an earlier read of the same range, if any.
    ///
    /// # Errors
    /// [`IoError::Rewritten`] when the file changed (a file cut short reads short, which is
    /// reported as the change), [`IoError::Read`] when the read fails otherwise or `len` bytes do
    /// not fit in memory.
    pub fn read_at(&self, offset: u64, len: usize) -> Result<Vec<u8>, IoError> {
        let read = |source| IoError::Read { path: self.path.clone(), what: self.what, source };
        let mut bytes = Vec::new();
        bytes.try_reserve_exact(len).map_err(|_| {
            read(std::io::Error::new(std::io::ErrorKind::OutOfMemory, format!("{len} bytes do not fit in memory")))
        })?;
        bytes.resize(len, 0);
        let result = read_exact_at(&self.file, &mut bytes, offset);
        // A short read of a file that shrank is the change, not an end of file.
        self.check_unchanged()?;
        result.map_err(read)?;
        self.check_same_bytes(offset, &bytes)?;
        Ok(bytes)
    }

    /// Errors unless the open file and the file at its path both still have the stamp the file
    /// had when opened.
    ///
    /// # Errors
    /// [`IoError::Rewritten`] naming the first difference; [`IoError::Read`] when the open file
    /// cannot be examined.
    pub fn check_unchanged(&self) -> Result<(), IoError> {
        // The path first: a file replaced there also changes the open one's status-change time
        // (its link count drops), and "another file" is the better message.
        let at_path =
            std::fs::metadata(&self.path).map_err(|e| self.rewritten(format!("the path no longer names it: {e}")))?;
        if let Some(change) = self.stamp.change_to(&Stamp::of(&at_path)) {
            return Err(self.rewritten(change));
        }
        let open = self.file.metadata().map_err(|source| IoError::Read {
            path: self.path.clone(),
            what: self.what,
            source,
        })?;
        match self.stamp.change_to(&Stamp::of(&open)) {
            Some(change) => Err(self.rewritten(change)),
            None => Ok(()),
        }
    }

    /// Errors when `bytes`, read at `offset`, differ from an earlier read of the same range;
    /// records their checksum otherwise.
    fn check_same_bytes(&self, offset: u64, bytes: &[u8]) -> Result<(), IoError> {
        let sum = checksum(bytes);
        let mut sums = self.sums.lock().unwrap_or_else(PoisonError::into_inner);
        match *sums.entry((offset, bytes.len())).or_insert(sum) {
            first if first == sum => Ok(()),
            _ => Err(self.rewritten(format!(
                "bytes {offset}..{} differ from when they were first read",
                offset.saturating_add(bytes.len() as u64)
            ))),
        }
    }

    fn rewritten(&self, change: String) -> IoError {
        IoError::Rewritten { path: self.path.clone(), what: self.what, change }
    }
}

#[cfg(unix)]
fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
}

#[cfg(not(unix))]
fn read_exact_at(file: &File, mut buf: &mut [u8], mut offset: u64) -> std::io::Result<()> {
    use std::os::windows::fs::FileExt;
    while !buf.is_empty() {
        match file.seek_read(buf, offset) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A 64-bit checksum of `bytes`, to tell whether a range read again is the same: four lanes of
/// 64-bit words, each word xored in and the lane multiplied by an odd constant and rotated. Each
/// step is a bijection of the lane for a given word, so one changed word always changes the
/// result; four independent lanes keep the multiplier busy (this runs over every byte of a model
/// at open).
fn checksum(bytes: &[u8]) -> u64 {
    const K: [u64; 4] = [0x9E37_79B9_7F4A_7C15, 0xC2B2_AE3D_27D4_EB4F, 0x1656_67B1_9E37_79F9, 0xBF58_476D_1CE4_E5B9];
    let word = |c: &[u8]| c.iter().rev().fold(0u64, |w, &b| (w << 8) | u64::from(b));
    let mut lanes = K;
    let mut blocks = bytes.chunks_exact(32);
    for block in &mut blocks {
        for (i, lane) in lanes.iter_mut().enumerate() {
            *lane = (*lane ^ word(&block[8 * i..8 * i + 8])).wrapping_mul(K[i]).rotate_left(31);
        }
    }
    for (i, w) in blocks.remainder().chunks(8).enumerate() {
        lanes[i] = (lanes[i] ^ word(w)).wrapping_mul(K[i]).rotate_left(31);
    }
    let len = bytes.len() as u64;
    lanes.iter().zip(K).fold(len, |h, (&l, k)| (h ^ l).wrapping_mul(k).rotate_left(27))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, SeekFrom, Write};

    fn file_of(bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        std::fs::write(&path, bytes).unwrap();
        (dir, path)
    }

    #[test]
    fn ranges_read_back_and_a_read_past_the_end_is_an_error() {
        let (_dir, path) = file_of(b"0123456789");
        let f = PinnedFile::open(&path, "model").unwrap();
        assert_eq!((f.len(), f.read_at(2, 3).unwrap()), (10, b"234".to_vec()));
        assert_eq!(f.read_at(2, 3).unwrap(), b"234");
        let e = f.read_at(8, 3).unwrap_err().to_string();
        assert!(e.contains("m.gguf: cannot read the model"), "{e}");
    }

    #[test]
    fn a_file_cut_short_is_an_error_naming_the_change() {
        let (_dir, path) = file_of(&[7u8; 4096]);
        let f = PinnedFile::open(&path, "model").unwrap();
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(100).unwrap();
        let e = f.read_at(0, 4096).unwrap_err().to_string();
        assert!(e.contains("m.gguf: the model changed while qdrift was reading it (size 4096 → 100 bytes)"), "{e}");
    }

    #[test]
    fn bytes_rewritten_in_place_are_an_error() {
        let (_dir, path) = file_of(&[7u8; 4096]);
        let f = PinnedFile::open(&path, "model").unwrap();
        assert!(f.read_at(1024, 1024).is_ok());
        let mut w = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        w.seek(SeekFrom::Start(1500)).unwrap();
        w.write_all(&[8]).unwrap();
        drop(w);
        let e = f.read_at(1024, 1024).unwrap_err().to_string();
        assert!(e.contains("the model changed while qdrift was reading it"), "{e}");
        assert!(e.ends_with("rerun once the file is complete"), "{e}");
    }

    #[test]
    fn a_file_replaced_at_its_path_is_an_error() {
        let (dir, path) = file_of(&[7u8; 64]);
        let f = PinnedFile::open(&path, "model").unwrap();
        let other = dir.path().join("new.gguf");
        std::fs::write(&other, [7u8; 64]).unwrap();
        std::fs::rename(&other, &path).unwrap();
        let e = f.read_at(0, 8).unwrap_err().to_string();
        assert!(e.contains("the path now names another file"), "{e}");
    }

    #[test]
    fn one_changed_byte_changes_the_checksum() {
        let mut bytes: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let sum = checksum(&bytes);
        for at in [0, 31, 32, 500, 999] {
            bytes[at] ^= 1;
            assert_ne!(checksum(&bytes), sum, "byte {at}");
            bytes[at] ^= 1;
        }
        assert_ne!(checksum(&bytes[..999]), checksum(&bytes[..998]));
    }
}
