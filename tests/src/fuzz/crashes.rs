//! The crash folder: `<dir>/<target>/<hash>.bin` holds an input, `<hash>.txt` what it did (its
//! first line is the signature that de-duplicates crashes: a panic's location, `oom`, `hang`).
//! Names are the input's FNV-1a hash, so that saving the same input twice is one file.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The crash folder committed with the tests (its inputs replay in `tests/fuzz_regressions.rs`).
pub fn default_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/crashes")
}

/// FNV-1a, 64 bits: a stable file name for an input (not a security hash; collisions only merge
/// two crash files).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// Saves `input` of `target` under `dir` with `signature` and `message`; returns the input's path.
///
/// # Errors
/// The folder or a file cannot be written.
pub fn save(dir: &Path, target: &str, input: &[u8], signature: &str, message: &str) -> Result<PathBuf, String> {
    let folder = dir.join(target);
    std::fs::create_dir_all(&folder).map_err(|e| format!("{}: {e}", folder.display()))?;
    let stem = format!("{:016x}", fnv1a(input));
    let bin = folder.join(format!("{stem}.bin"));
    std::fs::write(&bin, input).map_err(|e| format!("{}: {e}", bin.display()))?;
    let txt = folder.join(format!("{stem}.txt"));
    std::fs::write(&txt, format!("{signature}\n{message}\n")).map_err(|e| format!("{}: {e}", txt.display()))?;
    Ok(bin)
}

/// The saved inputs of `target` under `dir`, sorted by name (none when the folder is missing).
pub fn inputs(dir: &Path, target: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir.join(target)) else { return Vec::new() };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "bin"))
        .collect();
    files.sort();
    files
}

/// The signatures already saved for `target`, so that a new run does not save the same bug again.
pub fn signatures(dir: &Path, target: &str) -> BTreeSet<String> {
    inputs(dir, target)
        .iter()
        .filter_map(|bin| std::fs::read_to_string(bin.with_extension("txt")).ok())
        .filter_map(|text| text.lines().next().map(str::to_string))
        .collect()
}
