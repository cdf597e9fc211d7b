//! Eval sets: JSONL files of `{"id": "...", "prompt": "..."}` (see `eval-sets/README.md`).

use std::path::Path;

use qdrift_io::read_capped;
use qdrift_report::EVAL_SET_CAP;
use serde::Deserialize;

use crate::error::EvalError;
use crate::inputs::identity::{report_name, sha256_hex};

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
    /// How reports name it: the file's name (never a machine path; [`EvalSet::sha256`] identifies
    /// the contents), or `eval-sets/NAME.jsonl (built in)` for the sets compiled into qdrift.
    pub name: String,
    /// SHA-256 of the file's bytes, lowercase hex.
    pub sha256: String,
    /// The prompts in file order.
    pub prompts: Vec<EvalPrompt>,
}

/// The sets shipped in `eval-sets/`, compiled in so that an installed binary has them too.
const BUILT_IN: &[(&str, &str)] = &[
    ("stories", include_str!("../../../../eval-sets/stories.jsonl")),
    ("english", include_str!("../../../../eval-sets/english.jsonl")),
    ("chat", include_str!("../../../../eval-sets/chat.jsonl")),
];

/// The names of the built-in sets.
pub fn built_in_names() -> Vec<&'static str> {
    BUILT_IN.iter().map(|(n, _)| *n).collect()
}

impl EvalSet {
    /// A built-in set by name (`stories`, `english`, `chat`: [`built_in_names`]).
    pub fn built_in(name: &str) -> Result<EvalSet, EvalError> {
        let (_, text) = BUILT_IN
            .iter()
            .find(|(n, _)| *n == name)
            .ok_or_else(|| EvalError::UnknownEvalSet { name: name.to_string(), known: built_in_names() })?;
        let label = format!("eval-sets/{name}.jsonl (built in)");
        Self::parse_named(&label, label.clone(), text.as_bytes())
    }

    /// Reads a JSONL file, only a regular file of at most [`EVAL_SET_CAP`] bytes ([`read_capped`]);
    /// a bare name of a built-in set (`stories`) is accepted too.
    pub fn read(path: &Path) -> Result<EvalSet, EvalError> {
        if !path.exists()
            && let Some(name) = path.to_str().filter(|s| built_in_names().contains(s))
        {
            return Self::built_in(name);
        }
        let bytes = read_capped(path, EVAL_SET_CAP, "eval set")?;
        Self::parse_named(&path.display().to_string(), report_name(path), &bytes)
    }

    /// Parses JSONL bytes: one object per non-empty line, unique non-empty ids, non-empty prompts.
    /// `path` names the source in errors; the set is named by its last component.
    pub fn parse(path: &str, bytes: &[u8]) -> Result<EvalSet, EvalError> {
        Self::parse_named(path, report_name(Path::new(path)), bytes)
    }

    /// [`EvalSet::parse`], with `source` naming the bytes in errors and `name` in reports.
    fn parse_named(source: &str, name: String, bytes: &[u8]) -> Result<EvalSet, EvalError> {
        let bad = |line: Option<usize>, problem: String| EvalError::EvalSet {
            source_name: source.to_string(),
            line,
            problem,
        };
        let text = std::str::from_utf8(bytes).map_err(|e| bad(None, format!("not UTF-8: {e}")))?;
        let mut prompts: Vec<EvalPrompt> = Vec::new();
        let mut ids = std::collections::BTreeSet::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let p: EvalPrompt = serde_json::from_str(line)
                .map_err(|e| bad(Some(i + 1), format!("expected {{\"id\": \"...\", \"prompt\": \"...\"}}: {e}")))?;
            if p.id.is_empty() || p.prompt.is_empty() {
                return Err(bad(Some(i + 1), "empty id or prompt".into()));
            }
            if !ids.insert(p.id.clone()) {
                return Err(bad(Some(i + 1), format!("duplicate id \"{}\"", qdrift_io::elide(&p.id))));
            }
            prompts.push(p);
        }
        if prompts.is_empty() {
            return Err(bad(None, "no prompts".into()));
        }
        Ok(EvalSet { name, sha256: sha256_hex(bytes), prompts })
    }
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

    #[cfg(unix)]
    #[test]
    fn an_endless_file_is_refused_without_reading_it() {
        let e = EvalSet::read(Path::new("/dev/zero")).unwrap_err().to_string();
        assert_eq!(e, "/dev/zero: the eval set is a character device, not a regular file");
    }

    #[test]
    fn a_set_is_named_by_its_file_name() {
        let set = EvalSet::parse("/home/me/sets/chat-mine.jsonl", b"{\"id\":\"a\",\"prompt\":\"p\"}").unwrap();
        assert_eq!(set.name, "chat-mine.jsonl");
        assert_eq!(EvalSet::built_in("stories").unwrap().name, "eval-sets/stories.jsonl (built in)");
    }
}
