//! [`Stamp`]: what identifies a file's content without reading it, compared before and after a
//! read to refuse a file changed meanwhile (`read_capped`, `PinnedFile`).

use std::fs::Metadata;

/// What identifies a file's content without reading it: its length, its modification and
/// status-change times (seconds, nanoseconds), its inode and its device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    len: u64,
    modified: (i64, i64),
    changed: (i64, i64),
    inode: u64,
    device: u64,
}

impl Stamp {
    #[cfg(unix)]
    pub(crate) fn of(meta: &Metadata) -> Stamp {
        use std::os::unix::fs::MetadataExt;
        Stamp {
            len: meta.len(),
            modified: (meta.mtime(), meta.mtime_nsec()),
            changed: (meta.ctime(), meta.ctime_nsec()),
            inode: meta.ino(),
            device: meta.dev(),
        }
    }

    #[cfg(not(unix))]
    pub(crate) fn of(meta: &Metadata) -> Stamp {
        // No inode or status-change time: the length and the modification time only.
        let since = |t: std::io::Result<std::time::SystemTime>| {
            t.ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or((0, 0), |d| (i64::try_from(d.as_secs()).unwrap_or(i64::MAX), i64::from(d.subsec_nanos())))
        };
        Stamp { len: meta.len(), modified: since(meta.modified()), changed: (0, 0), inode: 0, device: 0 }
    }

    /// The file's length.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// How `now` differs from `self` (the stamp at open), in words; `None` when it does not.
    pub(crate) fn change_to(&self, now: &Stamp) -> Option<String> {
        if (now.inode, now.device) != (self.inode, self.device) {
            Some(format!("the path now names another file: inode {} → {}", self.inode, now.inode))
        } else if now.len != self.len {
            Some(format!("size {} → {} bytes", self.len, now.len))
        } else if now.modified != self.modified {
            Some("its modification time changed".to_string())
        } else if now.changed != self.changed {
            Some("its status-change time changed".to_string())
        } else {
            None
        }
    }
}
