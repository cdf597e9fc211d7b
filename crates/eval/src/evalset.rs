//! Eval sets: JSONL files of `{"id": "...", "prompt": "..."}` (see `eval-sets/README.md`).

use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::EvalError;

/// One prompt of an eval set.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalPrompt {
    /// Unique within the set.
    pub id: String,
    /// The text the model continues (or, for chat sets, the user's message).
    pub prompt: String,
}

/// A parsed eval set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvalSet {
    /// Where it came from (`eval-sets/NAME.jsonl (built in)` for the sets compiled into qdrift).
    pub path: String,
    /// SHA-256 of the file's bytes, lowercase hex.
    pub sha256: String,
    /// The prompts in file order.
    pub prompts: Vec<EvalPrompt>,
}

/// The sets shipped in `eval-sets/`, compiled in so that an installed binary has them too.
const BUILT_IN: &[(&str, &str)] = &[
    ("stories", include_str!("../../../eval-sets/stories.jsonl")),
    ("english", include_str!("../../../eval-sets/english.jsonl")),
    ("chat", include_str!("../../../eval-sets/chat.jsonl")),
];

/// The names of the built-in sets.
pub fn built_in_names() -> Vec<&'static str> {
    BUILT_IN.iter().map(|(n, _)| *n).collect()
}

impl EvalSet {
    /// A built-in set by name (`stories`, `english`, `chat`).
    pub fn built_in(name: &str) -> Result<EvalSet, EvalError> {
        let (_, text) = BUILT_IN.iter().find(|(n, _)| *n == name).ok_or_else(|| {
            EvalError::Input(format!("no built-in eval set \"{name}\"; known: {}", built_in_names().join(", ")))
        })?;
        Self::parse(&format!("eval-sets/{name}.jsonl (built in)"), text.as_bytes())
    }

    /// Reads a JSONL file; a bare name of a built-in set (`stories`) is accepted too.
    pub fn read(path: &Path) -> Result<EvalSet, EvalError> {
        if !path.exists() {
            if let Some(name) = path.to_str().filter(|s| built_in_names().contains(s)) {
                return Self::built_in(name);
            }
        }
        let bytes = std::fs::read(path).map_err(|e| EvalError::Input(format!("{}: {e}", path.display())))?;
        Self::parse(&path.display().to_string(), &bytes)
    }

    /// Parses JSONL bytes: one object per non-empty line, unique non-empty ids, non-empty prompts.
    pub fn parse(path: &str, bytes: &[u8]) -> Result<EvalSet, EvalError> {
        let bad = |line: usize, what: String| EvalError::Input(format!("{path}:{line}: {what}"));
        let text = std::str::from_utf8(bytes).map_err(|e| EvalError::Input(format!("{path}: not UTF-8: {e}")))?;
        let mut prompts: Vec<EvalPrompt> = Vec::new();
        let mut ids = std::collections::BTreeSet::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let p: EvalPrompt = serde_json::from_str(line)
                .map_err(|e| bad(i + 1, format!("expected {{\"id\": \"...\", \"prompt\": \"...\"}}: {e}")))?;
            if p.id.is_empty() || p.prompt.is_empty() {
                return Err(bad(i + 1, "empty id or prompt".into()));
            }
            if !ids.insert(p.id.clone()) {
                return Err(bad(i + 1, format!("duplicate id \"{}\"", p.id)));
            }
            prompts.push(p);
        }
        if prompts.is_empty() {
            return Err(EvalError::Input(format!("{path}: no prompts")));
        }
        Ok(EvalSet { path: path.to_string(), sha256: sha256_hex(bytes), prompts })
    }
}

/// SHA-256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 of a file (streamed), lowercase hex.
pub fn sha256_file(path: &Path) -> Result<String, EvalError> {
    let io = |e: std::io::Error| EvalError::Input(format!("{}: {e}", path.display()));
    let mut f = std::fs::File::open(path).map_err(io)?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).map_err(io)?;
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_sets_meet_their_sizes() {
        for (name, min) in [("stories", 64), ("english", 64), ("chat", 32)] {
            let set = EvalSet::built_in(name).expect(name);
            assert!(set.prompts.len() >= min, "{name}: {}", set.prompts.len());
            assert_eq!(set.sha256.len(), 64);
        }
    }

    #[test]
    fn bad_lines_are_named() {
        let e = EvalSet::parse("x.jsonl", b"{\"id\":\"a\",\"prompt\":\"p\"}\n{\"id\":\"a\",\"prompt\":\"q\"}\n")
            .unwrap_err();
        assert!(e.to_string().contains("x.jsonl:2: duplicate id \"a\""), "{e}");
        let e = EvalSet::parse("x.jsonl", b"{\"id\":\"a\"}\n").unwrap_err();
        assert!(e.to_string().starts_with("x.jsonl:1: expected"), "{e}");
        let e = EvalSet::parse("x.jsonl", b"\n\n").unwrap_err();
        assert!(e.to_string().contains("no prompts"), "{e}");
        let e = EvalSet::parse("x.jsonl", b"{\"id\":\"a\",\"prompt\":\"\"}").unwrap_err();
        assert!(e.to_string().contains("empty"), "{e}");
    }

    #[test]
    fn sha256_matches_a_known_vector() {
        // FIPS 180-2 example "abc".
        assert_eq!(sha256_hex(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
