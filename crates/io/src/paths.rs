//! The output rule, checked before any work starts ([`PathCheck`]): a command names its inputs
//! and its outputs, each with the flag that gave it, and [`PathCheck::check`] refuses, in one
//! message naming the flag and the path:
//!
//! - an output whose existing target is not what qdrift replaces: a file output must be a regular
//!   file (symbolic links followed), never a device, a named pipe or a socket; a folder output
//!   must be a folder;
//! - an output whose folder does not exist (unless the folder is itself an output, created when
//!   the run succeeds), so that a run of hours does not fail at its last write;
//! - an output that is an input: the same file (device and inode, links resolved) as an input
//!   file or as a file directly inside an input folder (a Hugging Face folder's
//!   `model.safetensors`); an output folder that is an input folder; a folder replaced whole that
//!   holds an input;
//! - two outputs that are one path, or a file output inside a folder another output replaces
//!   whole.
//!
//! [`crate::AtomicFile`] checks the target's type again when it starts and when it commits,
//! so that a writer not preceded by a [`PathCheck`] still never replaces a device.

use std::path::{Component, Path, PathBuf};

use crate::{IoError, file_kind};

/// How an output is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// One file, replaced atomically ([`crate::AtomicFile`]).
    File,
    /// A folder; `whole`: replaced as a whole (a saved reference), else filled file by file or
    /// replaced only when it holds nothing but the command's own files (`eval --out`).
    Folder { whole: bool },
}

/// A path with the flag that gave it.
#[derive(Clone, Debug)]
struct Named {
    flag: String,
    path: PathBuf,
}

/// A command's inputs and outputs, checked together before any work ([`PathCheck::check`]).
#[derive(Clone, Debug, Default)]
pub struct PathCheck {
    inputs: Vec<Named>,
    outputs: Vec<(Named, Kind)>,
}

/// A file's identity: device and inode (symbolic links followed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileId(u64, u64);

#[cfg(unix)]
fn file_id(path: &Path) -> Option<FileId> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| FileId(m.dev(), m.ino()))
}

#[cfg(not(unix))]
fn file_id(path: &Path) -> Option<FileId> {
    // No inode numbers: compare canonical paths' hashes instead.
    use std::hash::{Hash, Hasher};
    let canonical = std::fs::canonicalize(path).ok()?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    canonical.hash(&mut h);
    Some(FileId(0, h.finish()))
}

impl PathCheck {
    /// No paths yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// An input: a file, or a folder whose files are all inputs. `flag` names it in messages
    /// (`--model`, `part`, …). A path that does not exist is skipped (its reader says so).
    pub fn input(mut self, flag: &str, path: &Path) -> Self {
        self.inputs.push(Named { flag: flag.to_string(), path: path.to_path_buf() });
        self
    }

    /// An output file, replaced atomically.
    pub fn output_file(mut self, flag: &str, path: &Path) -> Self {
        self.outputs.push((Named { flag: flag.to_string(), path: path.to_path_buf() }, Kind::File));
        self
    }

    /// An output folder; `replaced_whole`: everything in it is replaced (a saved reference),
    /// else the command only adds or replaces its own files.
    pub fn output_folder(mut self, flag: &str, path: &Path, replaced_whole: bool) -> Self {
        self.outputs
            .push((Named { flag: flag.to_string(), path: path.to_path_buf() }, Kind::Folder { whole: replaced_whole }));
        self
    }

    /// Applies the output rule (see the module's documentation).
    ///
    /// # Errors
    /// [`IoError::Output`] naming the first output that breaks it, its flag and the problem.
    pub fn check(&self) -> Result<(), IoError> {
        let inputs = self.input_files();
        let whole = Kind::Folder { whole: true };
        for (i, (out, kind)) in self.outputs.iter().enumerate() {
            let refuse = |problem: String| IoError::Output { flag: out.flag.clone(), path: out.path.clone(), problem };
            // A folder replaced whole holding an input or another output.
            let holds = |inside: &Named| {
                refuse(format!(
                    "holds {} {}, and this folder is replaced as a whole; choose another folder",
                    inside.flag,
                    inside.path.display()
                ))
            };
            self.check_target(out, *kind).map_err(refuse)?;
            if let Some(id) = file_id(&out.path)
                && let Some((input, _)) = inputs.iter().find(|(_, f)| *f == id)
            {
                let what = if input.path.is_dir() && *kind != Kind::File { "folder" } else { "file" };
                return Err(refuse(format!(
                    "is the same {what} as {} {}; an output never replaces an input",
                    input.flag,
                    input.path.display()
                )));
            }
            if *kind == whole
                && let Some(inside) = self.inputs.iter().find(|n| lies_in(&n.path, &out.path))
            {
                return Err(holds(inside));
            }
            for (other, other_kind) in &self.outputs[..i] {
                if same_path(&other.path, &out.path) {
                    return Err(refuse(format!("is also {}; give each output its own path", other.flag)));
                }
                if *other_kind == whole && lies_in(&out.path, &other.path) {
                    return Err(refuse(format!(
                        "lies inside {} {}, which is replaced as a whole",
                        other.flag,
                        other.path.display()
                    )));
                }
                if *kind == whole && lies_in(&other.path, &out.path) {
                    return Err(holds(other));
                }
            }
        }
        Ok(())
    }

    /// Refuses an existing target of the wrong type, a file output whose folder is missing and
    /// not created by another output, and a folder output under a file.
    fn check_target(&self, out: &Named, kind: Kind) -> Result<(), String> {
        match (std::fs::metadata(&out.path), kind) {
            (Ok(m), Kind::File) if !m.is_file() => {
                Err(format!("is {}; qdrift writes over regular files only", file_kind(m.file_type())))
            }
            (Ok(m), Kind::Folder { .. }) if !m.is_dir() => {
                Err(format!("is {}, not a folder", file_kind(m.file_type())))
            }
            (Ok(_), _) => Ok(()),
            // A folder is made with its missing ancestors, unless the nearest existing one is no
            // folder (`file/store`): refused now, not when the run ends.
            (Err(_), Kind::Folder { .. }) => {
                match out.path.ancestors().skip(1).find_map(|a| std::fs::metadata(a).ok().map(|m| (a, m))) {
                    Some((a, m)) if !m.is_dir() => {
                        Err(format!("cannot be made: {} is {}", a.display(), file_kind(m.file_type())))
                    }
                    _ => Ok(()),
                }
            }
            (Err(_), Kind::File) => {
                let parent = match out.path.parent() {
                    Some(p) if !p.as_os_str().is_empty() => p,
                    _ => Path::new("."),
                };
                let made_by_an_output = self
                    .outputs
                    .iter()
                    .any(|(o, k)| *k != Kind::File && (same_path(&o.path, parent) || lies_in(parent, &o.path)));
                match std::fs::metadata(parent) {
                    Ok(m) if m.is_dir() => Ok(()),
                    _ if made_by_an_output => Ok(()),
                    Ok(m) => Err(format!("its folder {} is {}", parent.display(), file_kind(m.file_type()))),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        Err(format!("its folder {} does not exist", parent.display()))
                    }
                    Err(e) => Err(format!("its folder {} cannot be used: {e}", parent.display())),
                }
            }
        }
    }

    /// Every input file's identity with the input that holds it: each input file, each input
    /// folder, and each file directly inside an input folder.
    fn input_files(&self) -> Vec<(&Named, FileId)> {
        let mut files = Vec::new();
        for input in &self.inputs {
            let Some(id) = file_id(&input.path) else { continue };
            files.push((input, id));
            if input.path.is_dir()
                && let Ok(entries) = std::fs::read_dir(&input.path)
            {
                // A model folder is flat (config, shards, tokenizer); its size is bounded by
                // what a folder holds, and the entries are only stat-ed, never opened.
                files.extend(entries.flatten().filter_map(|e| file_id(&e.path())).map(|id| (input, id)));
            }
        }
        files
    }
}

/// `path` made absolute and lexically normal (`.` dropped, `..` applied), links not resolved
/// (the path may not exist yet); for an existing path's parent, links are resolved so that two
/// spellings of one folder compare equal.
fn normal(path: &Path) -> PathBuf {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut out = PathBuf::new();
    for c in abs.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    match (out.parent().and_then(|p| std::fs::canonicalize(p).ok()), out.file_name()) {
        (Some(parent), Some(name)) => parent.join(name),
        _ => out,
    }
}

/// Whether `a` and `b` name one path (existing: one file; else the same normal path).
fn same_path(a: &Path, b: &Path) -> bool {
    match (file_id(a), file_id(b)) {
        (Some(x), Some(y)) => x == y,
        _ => normal(a) == normal(b),
    }
}

/// Whether `path` lies strictly inside the folder `dir` (links resolved where they exist).
fn lies_in(path: &Path, dir: &Path) -> bool {
    let resolve = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| normal(p));
    let (p, d) = (resolve(path), resolve(dir));
    p != d && p.starts_with(&d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(c: PathCheck) -> String {
        c.check().unwrap_err().to_string()
    }

    #[test]
    fn an_output_that_is_an_input_is_refused_by_inode_through_links() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("m.bin");
        std::fs::write(&model, b"weights").unwrap();
        let e = err(PathCheck::new().input("--model", &model).output_file("--out", &model));
        assert!(e.contains("--out") && e.contains("is the same file as --model"), "{e}");
        #[cfg(unix)]
        {
            let link = dir.path().join("link.bin");
            std::os::unix::fs::symlink(&model, &link).unwrap();
            let e = err(PathCheck::new().input("--model", &model).output_file("--out", &link));
            assert!(e.contains("is the same file as --model"), "{e}");
        }
        assert_eq!(std::fs::read(&model).unwrap(), b"weights");
    }

    #[test]
    fn a_file_inside_an_input_folder_is_an_input() {
        let dir = tempfile::tempdir().unwrap();
        let hf = dir.path().join("gptq");
        std::fs::create_dir(&hf).unwrap();
        std::fs::write(hf.join("model.safetensors"), b"x").unwrap();
        let e = err(PathCheck::new().input("--model", &hf).output_file("--out", &hf.join("model.safetensors")));
        assert!(e.contains("is the same file as --model"), "{e}");
        // A new file beside the model's is no input.
        PathCheck::new().input("--model", &hf).output_file("--out", &hf.join("q.gguf")).check().unwrap();
    }

    #[test]
    fn two_outputs_on_one_path_and_an_output_inside_a_folder_replaced_whole_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("D");
        let e = err(PathCheck::new().output_folder("--out", &d, false).output_file("--dump-logprobs", &d));
        assert!(e.contains("--dump-logprobs") && e.contains("is also --out"), "{e}");
        let e = err(PathCheck::new().output_folder("--save-reference", &d, true).output_folder("--out", &d, false));
        assert!(e.contains("is also --save-reference"), "{e}");
        let e =
            err(PathCheck::new().output_folder("--save-reference", &d, true).output_file("--junit", &d.join("j.xml")));
        assert!(e.contains("lies inside --save-reference"), "{e}");
        // A file inside an --out that is not yet there: its folder comes with the output.
        PathCheck::new().output_folder("--out", &d, false).output_file("--junit", &d.join("j.xml")).check().unwrap();
    }

    #[test]
    fn a_folder_replaced_whole_may_not_hold_an_input() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("m.gguf");
        std::fs::write(&model, b"x").unwrap();
        let e = err(PathCheck::new().input("--model", &model).output_folder("--save-reference", dir.path(), true));
        assert!(e.contains("holds --model"), "{e}");
        PathCheck::new().input("--model", &model).output_folder("--out", dir.path(), false).check().unwrap();
    }

    #[test]
    fn special_files_and_missing_folders_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let e = err(PathCheck::new().output_file("--junit", dir.path()));
        assert!(e.ends_with("is a folder; qdrift writes over regular files only"), "{e}");
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        let e = err(PathCheck::new().output_folder("--out", &file, false));
        assert!(e.ends_with("is a regular file, not a folder"), "{e}");
        let e = err(PathCheck::new().output_file("--dump-logprobs", &dir.path().join("missing/d.jsonl")));
        assert!(e.contains("--dump-logprobs") && e.ends_with("missing does not exist"), "{e}");
        #[cfg(unix)]
        {
            let fifo = dir.path().join("p");
            if std::process::Command::new("mkfifo").arg(&fifo).status().is_ok_and(|s| s.success()) {
                let e = err(PathCheck::new().output_file("--out", &fifo));
                assert!(e.ends_with("is a named pipe (FIFO); qdrift writes over regular files only"), "{e}");
            }
        }
    }
}
