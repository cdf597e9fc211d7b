//! The `--out` folder of `qdrift eval`: locked against a concurrent run, checked before the
//! evaluation starts, and filled all at once.
//!
//! [`OutputDir::prepare`] runs before anything is loaded. It takes an exclusive lock
//! (`PARENT/.NAME.qdrift-lock`, an OS file lock: released when the process ends, so a crashed run
//! never blocks the next; the file holds the holder's process id, which names the other run when
//! the lock is held, and names the crashed run whose leftovers are removed when it is not) and
//! creates an empty staging folder beside `--out`, `PARENT/.NAME.qdrift-new-PID-RANDOM`
//! ([`qdrift_io::unique_sibling`]), which both proves the parent writable and is where the
//! reports are written.
//! [`OutputDir::commit`] moves them into place:
//!
//! - `--out` absent: the staging folder is renamed to `--out` (one atomic rename);
//! - `--out` empty or holding only files a report run writes (`report.json`, `report.md`,
//!   `report.html` and the staged extras such as a JUnit file): the old folder is renamed aside
//!   (`.NAME.qdrift-old-PID-RANDOM`), the staging folder renamed into its place, and the old one
//!   removed; a reader sees the old reports or the new ones, never a mix;
//! - `--out` holding other files (a screenshot, the user's own): those are left alone and the new
//!   files are renamed in one by one (each atomic), `report.json` last; then the files the
//!   previous run wrote that this one did not (a JUnit file of a gated run, a dump) are removed.
//!
//! Every run lists the files it wrote in `--out/.qdrift-outputs` ([`MANIFEST`]), so that the next
//! run knows them for its own: an earlier run's output is always replaced or removed, never left
//! beside a newer report. The list is read as untrusted input: only relative paths below `--out`
//! (no `..`, no root) count, and only regular files are removed.
//!
//! Until the commit, `--out` is untouched: a failed or interrupted run leaves the previous
//! reports (or no folder) as they were. Dropping an uncommitted [`OutputDir`] removes its staging
//! folder and its lock file; so does a terminating signal (SIGINT, SIGTERM, SIGHUP:
//! [`qdrift_io::RemoveOnSignal`]), which waits for a commit in progress to end. Staging folders of
//! crashed runs are removed by the next run that takes the lock.
//!
//! **Invariant: `--out` is never created before the run succeeds, and never holds a half-written
//! file or a mix of two runs' reports (except per file in a folder holding other files).**

use std::ffi::OsString;
use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};

use qdrift_io::{PathCheck, RemoveOnSignal, uninterrupted, unique_sibling};

use crate::check::config::EvalConfig;
use crate::check::config::VariantSpec;
use crate::error::EvalError;

/// The inputs and outputs of `cfg` for the output rule ([`PathCheck`]): the model, tokenizer,
/// eval set, checkpoint variants, saved reference and thresholds are inputs; the saved reference
/// to write (a folder replaced whole) and the log-probability dump are outputs. The CLI adds
/// `--out` and `--junit`; [`crate::evaluate_any`] checks it as it is, before anything is loaded.
pub fn path_check(cfg: &EvalConfig) -> PathCheck {
    let mut check = PathCheck::new().input("--model", &cfg.model);
    let inputs =
        [("--tokenizer", &cfg.tokenizer), ("--eval-set", &cfg.eval_set), ("--reference", &cfg.reference_store)];
    for (flag, path) in inputs {
        if let Some(p) = path {
            check = check.input(flag, p);
        }
    }
    for v in &cfg.variants {
        if let VariantSpec::Checkpoint { path: p, .. } = v {
            check = check.input("--variant", p);
        }
    }
    if let Some((p, _)) = &cfg.gate {
        check = check.input("--gate", p);
    }
    if let Some(p) = &cfg.save_reference {
        check = check.output_folder("--save-reference", p, true);
    }
    if let Some(p) = &cfg.dump_logprobs {
        check = check.output_file("--dump-logprobs", p);
    }
    check
}

/// The list of the files a run wrote into `--out`, one relative path a line (written last but
/// one, before `report.json`).
pub const MANIFEST: &str = ".qdrift-outputs";

/// Largest [`MANIFEST`] read back: a list longer than this was not written by qdrift and is
/// ignored.
const MANIFEST_CAP: u64 = 1 << 20;

/// The files every report run writes into `--out`.
const REPORT_FILES: [&str; 3] = ["report.json", "report.md", "report.html"];

/// A locked `--out` folder with its staging folder.
#[derive(Debug)]
pub struct OutputDir {
    /// `--out` as given (for messages).
    given: PathBuf,
    /// `--out`, absolute.
    out: PathBuf,
    /// Where the reports are written until [`OutputDir::commit`].
    staging: PathBuf,
    /// The held lock; its file is removed on drop.
    lock: Option<(File, PathBuf)>,
    /// The process id a crashed run left in the lock file.
    recovered: Option<u32>,
    /// The lock file, then the staging folder: removed if a signal ends the process.
    _on_signal: Vec<RemoveOnSignal>,
}

impl OutputDir {
    /// Locks `out` and creates the staging folder beside it. `out` itself is not created; its
    /// parent is created when missing.
    ///
    /// # Errors
    /// [`EvalError::Output`] when `out` names no folder, is a file, is being written by another
    /// run, or its parent (or, when it exists, `out` itself) is not writable.
    pub fn prepare(out: &Path) -> Result<OutputDir, EvalError> {
        let fail = |problem: String| EvalError::Output { path: out.to_path_buf(), problem };
        let abs = std::path::absolute(out).map_err(|e| fail(e.to_string()))?;
        let (Some(parent), Some(name)) = (abs.parent(), abs.file_name()) else {
            return Err(fail("must name a folder (not / or ..)".into()));
        };
        if abs.exists() && !abs.is_dir() {
            return Err(fail("exists and is not a folder".into()));
        }
        std::fs::create_dir_all(parent).map_err(|e| fail(format!("cannot create {}: {e}", parent.display())))?;
        let sibling = |suffix: &str| {
            let mut n = OsString::from(".");
            n.push(name);
            n.push(suffix);
            parent.join(n)
        };
        let (file, lock_path, recovered) = take_lock(&sibling(".qdrift-lock")).map_err(fail)?;
        let mut dir = OutputDir {
            given: out.to_path_buf(),
            out: abs.clone(),
            staging: unique_sibling(&abs, "new"),
            _on_signal: vec![RemoveOnSignal::new(&lock_path)],
            lock: Some((file, lock_path)),
            recovered,
        };
        // We hold the lock: any staging or old folder of this name is a crashed run's.
        remove_stale(parent, name);
        std::fs::create_dir(&dir.staging).map_err(|e| fail(format!("cannot write in {}: {e}", parent.display())))?;
        dir._on_signal.push(RemoveOnSignal::new(&dir.staging));
        if abs.is_dir() {
            probe_writable(&abs).map_err(|e| fail(format!("cannot write in it: {e}")))?;
        }
        Ok(dir)
    }

    /// The id of a previous run that ended without removing its lock (killed or aborted), whose
    /// leftovers beside `--out` were removed when this run took the lock.
    pub fn recovered(&self) -> Option<u32> {
        self.recovered
    }

    /// The staging folder: write the reports here.
    pub fn staging(&self) -> &Path {
        &self.staging
    }

    /// `message` with the staging folder's path replaced by `--out` as the user gave it, so that
    /// an error while writing the reports names `OUT/report.html`, not a hidden staging name.
    pub fn user_paths(&self, message: &str) -> String {
        message.replace(&*self.staging.to_string_lossy(), &self.given.to_string_lossy())
    }

    /// Where `path` goes while staged, when it lies inside `--out` (`OUT/x.xml` →
    /// `STAGING/x.xml`); `None` for a path elsewhere.
    pub fn staged(&self, path: &Path) -> Option<PathBuf> {
        let abs = std::path::absolute(path).ok()?;
        let rel = abs.strip_prefix(&self.out).ok()?;
        (!rel.as_os_str().is_empty()).then(|| self.staging.join(rel))
    }

    /// Moves the staged files into `--out` (see the module's documentation) and releases the
    /// lock. A terminating signal waits for the commit to end.
    ///
    /// # Errors
    /// [`EvalError::Output`] when a rename fails; `--out` then holds what it held before.
    pub fn commit(self) -> Result<(), EvalError> {
        uninterrupted(|| self.move_in())
    }

    /// [`OutputDir::commit`]'s work.
    fn move_in(&self) -> Result<(), EvalError> {
        let fail = |problem: String| EvalError::Output { path: self.given.clone(), problem };
        let written = write_manifest(&self.staging).map_err(|e| fail(format!("cannot list the reports: {e}")))?;
        if !self.out.exists() {
            std::fs::rename(&self.staging, &self.out).map_err(|e| fail(format!("cannot move the reports in: {e}")))?;
            return Ok(());
        }
        let previous = read_manifest(&self.out);
        if only_report_files(&self.out, &self.staging, &previous).map_err(|e| fail(e.to_string()))? {
            self.swap().map_err(|e| fail(format!("cannot replace the previous reports: {e}")))?;
        } else {
            move_files_in(&self.staging, &self.out).map_err(|e| fail(format!("cannot move the reports in: {e}")))?;
            let _ = std::fs::remove_dir_all(&self.staging);
            for stale in previous.iter().filter(|p| !written.contains(p)) {
                let path = self.out.join(stale);
                // Only a regular file the previous run wrote; a failure loses nothing new.
                if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file()) {
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        Ok(())
    }

    /// Replaces `--out` by the staging folder: old aside, new in, old removed.
    fn swap(&self) -> std::io::Result<()> {
        let old = unique_sibling(&self.out, "old");
        std::fs::rename(&self.out, &old)?;
        if let Err(e) = std::fs::rename(&self.staging, &self.out) {
            // Put the previous reports back; the staging folder goes on drop.
            let _ = std::fs::rename(&old, &self.out);
            return Err(e);
        }
        // The new reports are in place; a failure to delete the old ones loses nothing.
        let _ = std::fs::remove_dir_all(&old);
        Ok(())
    }
}

impl Drop for OutputDir {
    fn drop(&mut self) {
        // Uninterrupted: once the lock is released, another run may own the file at its path,
        // which a signal's cleanup must not remove.
        uninterrupted(|| {
            // After a commit the staging folder is gone and this does nothing.
            let _ = std::fs::remove_dir_all(&self.staging);
            if let Some((file, path)) = self.lock.take() {
                // Removed while still held, so no other run can lock the removed file (see take_lock).
                let _ = std::fs::remove_file(&path);
                drop(file);
            }
            self._on_signal.clear();
        });
    }
}

/// Takes the exclusive lock at `path` and writes this process's id into it; returns the lock and
/// the id a previous holder left there (a run that ended without removing its lock: killed, or
/// aborted). A run that removes its lock file does so while holding it, so a lock taken on a
/// file that is no longer at `path` is retried on the new file.
fn take_lock(path: &Path) -> Result<(File, PathBuf, Option<u32>), String> {
    for _ in 0..8 {
        let mut file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| format!("cannot create the lock file {}: {e}", path.display()))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let holder = lock_holder(&mut file).map_or_else(String::new, |pid| format!(" (process {pid})"));
                return Err(format!(
                    "another qdrift run{holder} is writing this folder (it holds {}); wait for it to finish or \
                     choose another --out",
                    path.display()
                ));
            }
            Err(TryLockError::Error(e)) => return Err(format!("cannot lock {}: {e}", path.display())),
        }
        if same_file(&file, path) {
            // The OS lock was free, so whoever wrote an id here has ended.
            let stale = lock_holder(&mut file).filter(|&pid| pid != std::process::id());
            write_holder(&mut file).map_err(|e| format!("cannot write the lock file {}: {e}", path.display()))?;
            return Ok((file, path.to_path_buf(), stale));
        }
    }
    Err(format!("cannot lock {}: it keeps being replaced", path.display()))
}

/// The process id written in a lock file, if it holds one (at most 32 bytes are read).
fn lock_holder(file: &mut File) -> Option<u32> {
    use std::io::{Read, Seek};
    let mut text = String::new();
    file.seek(std::io::SeekFrom::Start(0)).ok()?;
    file.take(32).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

/// Replaces a lock file's contents by this process's id.
fn write_holder(file: &mut File) -> std::io::Result<()> {
    use std::io::{Seek, Write};
    file.set_len(0)?;
    file.seek(std::io::SeekFrom::Start(0))?;
    writeln!(file, "{}", std::process::id())
}

/// Whether `path` still names the open `file` (not a file created after it was removed).
#[cfg(unix)]
fn same_file(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(not(unix))]
fn same_file(_file: &File, path: &Path) -> bool {
    path.exists()
}

/// Removes the staging and old folders crashed runs left for `name` in `parent`.
fn remove_stale(parent: &Path, name: &std::ffi::OsStr) {
    let Ok(entries) = std::fs::read_dir(parent) else { return };
    let prefix = format!(".{}.qdrift-", name.to_string_lossy());
    for entry in entries.flatten() {
        let n = entry.file_name().to_string_lossy().into_owned();
        if let Some(rest) = n.strip_prefix(&prefix)
            && (rest.starts_with("new-") || rest.starts_with("old-"))
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Creates and removes a file in `dir`.
fn probe_writable(dir: &Path) -> std::io::Result<()> {
    let probe = dir.join(format!(".qdrift-probe-{}", std::process::id()));
    File::create(&probe)?;
    std::fs::remove_file(&probe)
}

/// Whether every entry of `out` is a report file, an entry the staging folder also has, or a
/// regular file the previous run wrote (`previous`, from its [`MANIFEST`]; a folder it wrote into
/// is not taken for its own, so the other branch of [`OutputDir::commit`] removes its files one
/// by one).
fn only_report_files(out: &Path, staging: &Path, previous: &[PathBuf]) -> std::io::Result<bool> {
    for entry in std::fs::read_dir(out)? {
        let name = entry?.file_name();
        let ours = REPORT_FILES.iter().any(|f| name == *f)
            || staging.join(&name).exists()
            || (previous.iter().any(|p| p.as_os_str() == name)
                && std::fs::symlink_metadata(out.join(&name)).is_ok_and(|m| m.is_file()));
        if !ours {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Renames every file under `staging` to the same place under `out`, `report.json` last (a
/// reader that finds it finds the rest).
fn move_files_in(staging: &Path, out: &Path) -> std::io::Result<()> {
    let mut files = Vec::new();
    collect_files(staging, &mut files)?;
    files.sort_by_key(|f| f.ends_with("report.json"));
    for f in files {
        let rel = f.strip_prefix(staging).map_err(std::io::Error::other)?;
        let to = out.join(rel);
        if let Some(dir) = to.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::rename(&f, &to)?;
    }
    Ok(())
}

/// Writes `staging/MANIFEST`: the relative paths of every file under `staging`, sorted; returns
/// them.
fn write_manifest(staging: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    collect_files(staging, &mut files)?;
    let mut rel: Vec<PathBuf> =
        files.iter().filter_map(|f| f.strip_prefix(staging).ok()).map(Path::to_path_buf).collect();
    rel.sort();
    let mut text = String::new();
    for p in &rel {
        // Paths qdrift writes are its own names or ones the user gave as UTF-8 arguments.
        text.push_str(&p.to_string_lossy());
        text.push('\n');
    }
    std::fs::write(staging.join(MANIFEST), text)?;
    Ok(rel)
}

/// The files `out/MANIFEST` lists that are relative paths below `out` (every component a name:
/// no `..`, no root, no `.`); empty when there is no list, it cannot be read, it is larger than
/// [`MANIFEST_CAP`] or not UTF-8.
fn read_manifest(out: &Path) -> Vec<PathBuf> {
    let Ok(bytes) = qdrift_io::read_capped(&out.join(MANIFEST), MANIFEST_CAP, "the list of a previous run's outputs")
    else {
        return Vec::new();
    };
    let Ok(text) = String::from_utf8(bytes) else { return Vec::new() };
    text.lines()
        .map(PathBuf::from)
        .filter(|p| {
            p.components().next().is_some()
                && p.components().all(|c| matches!(c, std::path::Component::Normal(_)))
                && p.as_os_str() != MANIFEST
        })
        .collect()
}

fn collect_files(dir: &Path, into: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect_files(&path, into)?;
        } else {
            into.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut n: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        n.sort();
        n
    }

    #[test]
    fn an_uncommitted_run_leaves_nothing_and_a_committed_one_replaces_the_folder() {
        let root = tempfile::tempdir().unwrap();
        let out = root.path().join("out");
        let dir = OutputDir::prepare(&out).unwrap();
        std::fs::write(dir.staging().join("report.json"), b"new").unwrap();
        let staged = format!("{}: cannot write: disk full", dir.staging().join("report.html").display());
        assert_eq!(dir.user_paths(&staged), format!("{}: cannot write: disk full", out.join("report.html").display()));
        drop(dir);
        assert_eq!(names(root.path()), Vec::<String>::new());

        std::fs::create_dir(&out).unwrap();
        std::fs::write(out.join("report.json"), b"old").unwrap();
        std::fs::write(out.join("report.md"), b"old").unwrap();
        let dir = OutputDir::prepare(&out).unwrap();
        std::fs::write(dir.staging().join("report.json"), b"new").unwrap();
        dir.commit().unwrap();
        assert_eq!(names(root.path()), vec!["out"]);
        assert_eq!(names(&out), vec![MANIFEST, "report.json"]);
        assert_eq!(std::fs::read(out.join("report.json")).unwrap(), b"new");
        assert_eq!(std::fs::read_to_string(out.join(MANIFEST)).unwrap(), "report.json\n");
    }

    #[test]
    fn other_files_in_out_are_kept() {
        let root = tempfile::tempdir().unwrap();
        let out = root.path().join("out");
        std::fs::create_dir(&out).unwrap();
        std::fs::write(out.join("report.png"), b"picture").unwrap();
        let dir = OutputDir::prepare(&out).unwrap();
        assert_eq!(dir.staged(&out.join("gate.xml")), Some(dir.staging().join("gate.xml")));
        assert_eq!(dir.staged(&root.path().join("gate.xml")), None);
        std::fs::write(dir.staging().join("report.json"), b"new").unwrap();
        dir.commit().unwrap();
        assert_eq!(names(&out), vec![MANIFEST, "report.json", "report.png"]);
        assert_eq!(names(root.path()), vec!["out"]);
    }

    /// A gated run's JUnit file (or any file a run wrote) does not outlive the next run that does
    /// not write it, whether `--out` holds other files or not; the user's files stay, and a list
    /// naming paths outside `--out` removes nothing there.
    #[test]
    fn an_earlier_runs_outputs_are_replaced_or_removed() {
        let root = tempfile::tempdir().unwrap();
        let out = root.path().join("out");
        let run = |files: &[&str]| {
            let dir = OutputDir::prepare(&out).unwrap();
            for f in files {
                let path = dir.staging().join(f);
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(path, b"x").unwrap();
            }
            dir.commit().unwrap();
        };
        run(&["report.json", "gate.xml"]);
        run(&["report.json"]);
        assert_eq!(names(&out), vec![MANIFEST, "report.json"], "the folder was replaced whole");
        run(&["report.json", "logs/dump.jsonl"]);
        run(&["report.json"]);
        assert_eq!(names(&out), vec![MANIFEST, "logs", "report.json"]);
        assert_eq!(names(&out.join("logs")), Vec::<String>::new(), "the dump removed, its folder left");
        std::fs::remove_dir(out.join("logs")).unwrap();
        run(&["report.json", "gate.xml"]);
        std::fs::write(out.join("report.png"), b"the user's").unwrap();
        run(&["report.json"]);
        assert_eq!(names(&out), vec![MANIFEST, "report.json", "report.png"], "gate.xml removed, the PNG kept");
        // A hostile list: nothing outside --out, nothing that is not a regular file.
        std::fs::write(root.path().join("outside"), b"keep").unwrap();
        std::fs::create_dir(out.join("folder")).unwrap();
        std::fs::write(out.join(MANIFEST), "../outside\n/etc/hostname\nfolder\n./report.png\n").unwrap();
        run(&["report.json"]);
        assert!(root.path().join("outside").exists() && out.join("folder").is_dir() && out.join("report.png").exists());
    }

    /// The lock file and the staging folder are removed by a terminating signal until the
    /// commit, or the drop, removes them itself (the signal itself: crates/cli/tests/signals.rs).
    #[test]
    fn the_lock_and_the_staging_folder_are_registered_for_signals_until_committed() {
        let root = tempfile::tempdir().unwrap();
        let ours = || {
            let mut paths: Vec<PathBuf> =
                qdrift_io::registered().into_iter().filter(|p| p.starts_with(root.path())).collect();
            paths.sort();
            paths
        };
        let out = root.path().join("out");
        let dir = OutputDir::prepare(&out).unwrap();
        let staging = dir.staging().to_path_buf();
        assert_eq!(ours(), [root.path().join(".out.qdrift-lock"), staging]);
        std::fs::write(dir.staging().join("report.json"), b"new").unwrap();
        dir.commit().unwrap();
        assert!(ours().is_empty());
        drop(OutputDir::prepare(&out).unwrap());
        assert!(ours().is_empty());
    }

    #[test]
    fn a_second_run_on_the_same_out_is_refused_until_the_first_ends() {
        let root = tempfile::tempdir().unwrap();
        let out = root.path().join("out");
        let first = OutputDir::prepare(&out).unwrap();
        let e = OutputDir::prepare(&out).unwrap_err().to_string();
        let me = std::process::id();
        assert!(e.contains(&format!("another qdrift run (process {me}) is writing this folder")), "{e}");
        drop(first);
        assert!(OutputDir::prepare(&out).is_ok());
    }

    #[test]
    fn a_crashed_runs_lock_and_staging_are_recovered_and_named() {
        let root = tempfile::tempdir().unwrap();
        let out = root.path().join("out");
        // What an aborted run leaves: its lock file with its id, and its staging folder.
        std::fs::write(root.path().join(".out.qdrift-lock"), b"4242\n").unwrap();
        std::fs::create_dir(root.path().join(".out.qdrift-new-4242-00000000deadbeef")).unwrap();
        let dir = OutputDir::prepare(&out).unwrap();
        assert_eq!(dir.recovered(), Some(4242));
        std::fs::write(dir.staging().join("report.json"), b"new").unwrap();
        dir.commit().unwrap();
        assert_eq!(names(root.path()), vec!["out"]);
    }
}
