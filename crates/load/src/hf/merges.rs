//! The BPE merges of a `tokenizer.json`, checked before the `tokenizers` crate builds anything
//! from them ([`check_merges`]).
//!
//! `tokenizers` (0.22) reads every merge into a pair of `String`s before it looks at one (a file
//! of repeated merges costs tens of times its size in memory), and a repeated merge is not an
//! error there: the later copy's rank silently replaces the earlier one's. So the merges are
//! counted first, by a parse that keeps nothing (the file's own JSON, each value skipped), against
//! the most a vocabulary can hold, and only then read, pair by pair, until the first one that
//! repeats. A merge `a b` joins two tokens into `a + b`, which must be a token of `model.vocab`,
//! split at one of its character boundaries: so a vocabulary of tokens `t` has at most
//! `Σ (chars(t) + 1)` distinct merges. (Merges can outnumber tokens: a SentencePiece vocabulary
//! converted to BPE, Llama 2's, lists every split of a token into two others.)

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fmt;

use qdrift_io::elide;

use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// Errors (the message, for the caller to put after the file's name) when `tokenizer.json`'s
/// `model.merges` is longer than its `model.vocab` can hold, or repeats a merge (naming the
/// first repeat). A file that is not JSON of the expected shape passes: the `tokenizers` crate
/// then says what is wrong with it.
pub(crate) fn check_merges(json: &[u8]) -> Result<(), String> {
    let Ok(Counts { model }) = serde_json::from_slice::<Counts>(json) else { return Ok(()) };
    let (merges, vocab) = (model.merges.unwrap_or_default().0, model.vocab);
    if merges > vocab.splits {
        return Err(format!(
            "model.merges has {merges} merges, more than the {} tokens of model.vocab can be made by ({} ways to split \
             them in two): each merge joins two tokens into one of the vocabulary",
            vocab.tokens, vocab.splits
        ));
    }
    match serde_json::from_slice::<MergesOnly>(json) {
        Ok(MergesOnly { model: MergesModel { merges: Some(FirstRepeat(Some(repeat))) } }) => Err(repeat),
        _ => Ok(()),
    }
}

/// `{"model": {"vocab": …, "merges": […]}}`, counted.
#[derive(Deserialize)]
struct Counts {
    #[serde(default)]
    model: ModelCounts,
}

#[derive(Deserialize, Default)]
struct ModelCounts {
    #[serde(default)]
    vocab: VocabSplits,
    #[serde(default)]
    merges: Option<Count>,
}

/// A vocabulary's tokens and the ways to split them in two, `Σ (chars(t) + 1)`; a list (a
/// Unigram vocabulary of `[piece, score]`) counts its entries and no splits.
#[derive(Default)]
struct VocabSplits {
    tokens: u64,
    splits: u64,
}

impl<'de> Deserialize<'de> for VocabSplits {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(VocabSplitsVisitor)
    }
}

struct VocabSplitsVisitor;

impl<'de> Visitor<'de> for VocabSplitsVisitor {
    type Value = VocabSplits;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a vocabulary")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<VocabSplits, A::Error> {
        let mut v = VocabSplits::default();
        while let Some(Chars(n)) = map.next_key()? {
            map.next_value::<IgnoredAny>()?;
            v.tokens += 1;
            v.splits = v.splits.saturating_add(n + 1);
        }
        Ok(v)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<VocabSplits, A::Error> {
        let Count(tokens) = CountVisitor.visit_seq(seq)?;
        Ok(VocabSplits { tokens, splits: 0 })
    }
}

/// The characters of a string, counted without keeping it.
struct Chars(u64);

impl<'de> Deserialize<'de> for Chars {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Chars;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Chars, E> {
                Ok(Chars(s.chars().count() as u64))
            }
        }
        d.deserialize_str(V)
    }
}

/// The elements of a list, counted without keeping them.
#[derive(Default)]
struct Count(u64);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_seq(CountVisitor)
    }
}

struct CountVisitor;

impl<'de> Visitor<'de> for CountVisitor {
    type Value = Count;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Count, A::Error> {
        let mut n = 0u64;
        while seq.next_element::<IgnoredAny>()?.is_some() {
            n += 1;
        }
        Ok(Count(n))
    }
}

/// `{"model": {"merges": […]}}`, read until the first merge that repeats.
#[derive(Deserialize)]
struct MergesOnly {
    #[serde(default)]
    model: MergesModel,
}

#[derive(Deserialize, Default)]
struct MergesModel {
    #[serde(default)]
    merges: Option<FirstRepeat>,
}

/// The refusal of the first merge that repeats an earlier one, if any.
struct FirstRepeat(Option<String>);

impl<'de> Deserialize<'de> for FirstRepeat {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_seq(FirstRepeatVisitor)
    }
}

struct FirstRepeatVisitor;

impl<'de> Visitor<'de> for FirstRepeatVisitor {
    type Value = FirstRepeat;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of merges")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<FirstRepeat, A::Error> {
        let mut seen: HashMap<Merge, usize> = HashMap::new();
        let mut i = 0;
        while let Some(merge) = seq.next_element::<Merge>()? {
            match seen.entry(merge) {
                Entry::Vacant(v) => {
                    v.insert(i);
                }
                Entry::Occupied(o) => {
                    let (Merge(a, b), first) = (o.key(), o.get());
                    let repeat = format!(
                        "model.merges[{i}] ({} {}) repeats model.merges[{first}]: a BPE tokenizer merges each pair once",
                        elide(a),
                        elide(b)
                    );
                    // The rest is skipped, not kept.
                    while seq.next_element::<IgnoredAny>()?.is_some() {}
                    return Ok(FirstRepeat(Some(repeat)));
                }
            }
            i += 1;
        }
        Ok(FirstRepeat(None))
    }
}

/// One merge, `"a b"` (split at its first space) or `["a", "b"]`.
#[derive(PartialEq, Eq, Hash)]
struct Merge(String, String);

impl<'de> Deserialize<'de> for Merge {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(MergeVisitor)
    }
}

struct MergeVisitor;

impl<'de> Visitor<'de> for MergeVisitor {
    type Value = Merge;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a merge")
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Merge, E> {
        let (a, b) = s.split_once(' ').unwrap_or((s, ""));
        Ok(Merge(a.to_string(), b.to_string()))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Merge, A::Error> {
        let a: String = seq.next_element()?.unwrap_or_default();
        let b: String = seq.next_element()?.unwrap_or_default();
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Merge(a, b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bpe(vocab: &str, merges: &str) -> Vec<u8> {
        format!(r#"{{"version": "1.0", "model": {{"type": "BPE", "vocab": {vocab}, "merges": {merges}}}}}"#)
            .into_bytes()
    }

    #[test]
    fn distinct_merges_within_the_vocabulary_pass() {
        let vocab = r#"{"a": 0, "b": 1, "ab": 2, "abb": 3}"#;
        assert_eq!(check_merges(&bpe(vocab, r#"["a b", "ab b"]"#)), Ok(()));
        assert_eq!(check_merges(&bpe(vocab, r#"[["a", "b"], ["ab", "b"]]"#)), Ok(()));
        // Not a tokenizer.json this check reads: left to the tokenizers crate.
        assert_eq!(check_merges(b"[1, 2]"), Ok(()));
        assert_eq!(check_merges(&bpe("7", "[]")), Ok(()));
    }

    #[test]
    fn the_first_repeated_merge_is_named() {
        let vocab = r#"{"a": 0, "b": 1, "ab": 2, "abb": 3}"#;
        let e = check_merges(&bpe(vocab, r#"["a b", "ab b", "a b", "ab b"]"#)).expect_err("repeats");
        assert_eq!(e, "model.merges[2] (a b) repeats model.merges[0]: a BPE tokenizer merges each pair once");
        let e = check_merges(&bpe(vocab, r#"[["a", "b"], ["ab", "b"], ["ab", "b"]]"#)).expect_err("repeats");
        assert!(e.starts_with("model.merges[2] (ab b) repeats model.merges[1]"), "{e}");
    }

    #[test]
    fn more_merges_than_the_vocabulary_can_make_are_refused_before_reading_them() {
        // a, b: 2 splits each; ab: 3. Eight distinct merges cannot all make tokens of it.
        let vocab = r#"{"a": 0, "b": 1, "ab": 2}"#;
        let merges: Vec<String> = (0..8).map(|i| format!("\"x{i} y\"")).collect();
        let e = check_merges(&bpe(vocab, &format!("[{}]", merges.join(", ")))).expect_err("too many");
        assert!(
            e.starts_with("model.merges has 8 merges, more than the 3 tokens of model.vocab can be made by (7 ways"),
            "{e}"
        );
    }
}
