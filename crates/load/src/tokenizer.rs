//! Tokenizers. [`Llama2cTokenizer`] reads llama2.c's `tokenizer.bin` and encodes exactly as
//! llama2.c's `run.c` (`encode`/`decode`) does.

use std::collections::HashMap;
use std::path::Path;

use crate::LoadError;

/// What the generation and scoring stages need from a tokenizer.
pub trait Tokenizer: Send + Sync {
    /// Number of tokens in the vocabulary.
    fn vocab_size(&self) -> usize;
    /// Beginning-of-sequence token, if the tokenizer prepends one.
    fn bos_id(&self) -> Option<u32>;
    /// End-of-sequence token, if any.
    fn eos_id(&self) -> Option<u32>;
    /// The token that ends a text this model writes: [`Tokenizer::eos_id`] (for a chat model
    /// through its template, the end of its turn), unless the format says otherwise (llama2.c).
    fn stop_id(&self) -> Option<u32> {
        self.eos_id()
    }
    /// The tokens a model is fed for `text`, BOS first where the tokenizer adds one.
    fn encode(&self, text: &str) -> Vec<u32>;
    /// The text of `tokens` (prompt and continuation alike), invalid UTF-8 replaced.
    fn decode(&self, tokens: &[u32]) -> String;
}

/// llama2.c's SentencePiece-derived tokenizer: pieces with merge scores and byte fallback.
///
/// File layout (`tokenizer.bin`, little-endian): `i32 max_token_length`, then for every token
/// `f32 score, i32 length, length bytes`. The file does not store the token count (llama2.c takes
/// it from the model), so the reader takes every token up to the end of the file and the caller
/// compares the count with the model's vocabulary.
///
/// The same algorithm also encodes GGUF's `llama` (SentencePiece) tokenizers
/// ([`Llama2cTokenizer::from_pieces`]): there, a space is stored as `▁` (U+2581) and the BOS/EOS
/// ids, whether BOS is prepended and the byte-fallback ids come from the file's metadata.
#[derive(Debug, Clone)]
pub struct Llama2cTokenizer {
    pub(crate) pieces: Vec<Vec<u8>>,
    pub(crate) scores: Vec<f32>,
    lookup: HashMap<Vec<u8>, u32>,
    bos: u32,
    eos: u32,
    add_bos: bool,
    /// The id of the byte-fallback piece `<0xNN>` of every byte (the unknown token if absent).
    byte_ids: Vec<u32>,
}

/// BOS and EOS ids of llama2.c's tokenizers (SentencePiece's defaults).
const BOS: u32 = 1;
const EOS: u32 = 2;
/// Byte-fallback pieces `<0x00>`..`<0xFF>` start at this id.
const BYTE_OFFSET: u32 = 3;

/// Special ids and options of a SentencePiece-style vocabulary (see
/// [`Llama2cTokenizer::from_pieces`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecialIds {
    /// Beginning-of-sequence id.
    pub bos: u32,
    /// End-of-sequence id.
    pub eos: u32,
    /// Unknown-token id, used for a byte whose `<0xNN>` piece is missing.
    pub unk: u32,
    /// Whether [`Tokenizer::encode`] prepends BOS.
    pub add_bos: bool,
}

impl Llama2cTokenizer {
    /// Reads a llama2.c `tokenizer.bin`.
    pub fn read(path: &Path) -> Result<Self, LoadError> {
        let bytes = crate::input::read_file(path, crate::input::TOKENIZER)?;
        Self::parse(path, &bytes)
    }

    fn parse(path: &Path, bytes: &[u8]) -> Result<Self, LoadError> {
        let mut at = 0usize;
        let read4 = |what: &str, at: &mut usize| -> Result<[u8; 4], LoadError> {
            let b = bytes.get(*at..*at + 4).ok_or_else(|| {
                LoadError::truncated(path, format!("{what} at byte {} runs past the end ({} bytes)", *at, bytes.len()))
            })?;
            *at += 4;
            Ok([b[0], b[1], b[2], b[3]])
        };
        let max_len = i32::from_le_bytes(read4("max_token_length", &mut at)?);
        if max_len <= 0 {
            return Err(LoadError::invalid(path, format!("not a llama2.c tokenizer: max_token_length is {max_len}")));
        }
        let mut pieces = Vec::new();
        let mut scores = Vec::new();
        while at < bytes.len() {
            let i = pieces.len();
            let score = f32::from_le_bytes(read4(&format!("score of token {i}"), &mut at)?);
            let len = i32::from_le_bytes(read4(&format!("length of token {i}"), &mut at)?);
            if len < 0 || len > max_len {
                return Err(LoadError::invalid(
                    path,
                    format!("token {i} has length {len}, outside 0..={max_len} (max_token_length)"),
                ));
            }
            let piece = bytes.get(at..at + len as usize).ok_or_else(|| {
                LoadError::truncated(
                    path,
                    format!("token {i} needs {len} bytes at byte {at}, file has {}", bytes.len()),
                )
            })?;
            at += len as usize;
            if !score.is_finite() {
                return Err(LoadError::invalid(path, format!("token {i} has a non-finite score")));
            }
            pieces.push(piece.to_vec());
            scores.push(score);
        }
        let vocab_size = pieces.len();
        if vocab_size < (BYTE_OFFSET + 256) as usize {
            return Err(LoadError::invalid(
                path,
                format!("tokenizer has {vocab_size} tokens, fewer than the 259 that byte fallback needs"),
            ));
        }
        let byte_ids = (0..256).map(|b| b + BYTE_OFFSET).collect();
        Ok(Self::build(pieces, scores, SpecialIds { bos: BOS, eos: EOS, unk: 0, add_bos: true }, Some(byte_ids)))
    }

    /// A tokenizer from SentencePiece pieces (spaces as `▁` or as ` `) and their merge scores,
    /// encoding with llama2.c's algorithm. Byte-fallback ids are those of the pieces `<0x00>` ..
    /// `<0xFF>`; a byte without one encodes as `special.unk`.
    ///
    /// Used for GGUF `tokenizer.ggml.model = llama`. llama.cpp's `llm_tokenizer_spm` merges the
    /// same way (highest-scoring adjacent pair first, via a priority queue); the two can differ
    /// only in the order of equal-score merges.
    ///
    /// # Errors
    /// A message when the lengths of `pieces` and `scores` differ or a special id is out of range.
    pub fn from_pieces(pieces: &[String], scores: &[f32], special: SpecialIds) -> Result<Self, String> {
        if pieces.len() != scores.len() {
            return Err(format!("{} tokens but {} scores", pieces.len(), scores.len()));
        }
        for (name, id) in [("BOS", special.bos), ("EOS", special.eos), ("unknown", special.unk)] {
            if id as usize >= pieces.len() {
                return Err(format!("{name} id {id} is outside the vocabulary of {}", pieces.len()));
            }
        }
        if let Some(i) = scores.iter().position(|s| !s.is_finite()) {
            return Err(format!("token {i} has a non-finite score"));
        }
        let pieces: Vec<Vec<u8>> = pieces.iter().map(|p| p.replace('\u{2581}', " ").into_bytes()).collect();
        Ok(Self::build(pieces, scores.to_vec(), special, None))
    }

    fn build(pieces: Vec<Vec<u8>>, scores: Vec<f32>, special: SpecialIds, byte_ids: Option<Vec<u32>>) -> Self {
        // llama2.c looks pieces up by binary search in a sorted copy; with duplicate pieces the
        // first id is kept here (the pieces of llama2.c's tokenizers are unique).
        let mut lookup = HashMap::with_capacity(pieces.len());
        for (id, p) in pieces.iter().enumerate() {
            lookup.entry(p.clone()).or_insert(id as u32);
        }
        let byte_ids = byte_ids.unwrap_or_else(|| {
            (0..=255u8).map(|b| lookup.get(format!("<0x{b:02X}>").as_bytes()).copied().unwrap_or(special.unk)).collect()
        });
        Self { pieces, scores, lookup, bos: special.bos, eos: special.eos, add_bos: special.add_bos, byte_ids }
    }

    /// The pieces (spaces as ` `) and their scores, indexed by token id.
    pub fn pieces(&self) -> impl Iterator<Item = (&[u8], f32)> {
        self.pieces.iter().map(Vec::as_slice).zip(self.scores.iter().copied())
    }

    fn id_of(&self, piece: &[u8]) -> Option<u32> {
        self.lookup.get(piece).copied()
    }

    /// The bytes token `token` stands for after `prev`, as llama2.c's `decode` prints them.
    fn piece_bytes(&self, prev: Option<u32>, token: u32) -> Vec<u8> {
        let Some(piece) = self.pieces.get(token as usize) else {
            return Vec::new();
        };
        let mut piece = piece.as_slice();
        // At the start (after BOS), SentencePiece strips the leading space of the first piece.
        let at_start = prev == Some(self.bos) || (prev.is_none() && !self.add_bos);
        if at_start && piece.first() == Some(&b' ') {
            piece = &piece[1..];
        }
        // Byte-fallback pieces are literally "<0xNN>".
        if piece.len() == 6
            && piece.starts_with(b"<0x")
            && piece.ends_with(b">")
            && let Some(b) = std::str::from_utf8(&piece[3..5]).ok().and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            return vec![b];
        }
        piece.to_vec()
    }
}

/// Is `p` a byte-fallback piece `<0xNN>`? (The writers type them as bytes.)
pub(crate) fn is_byte_piece(p: &[u8]) -> bool {
    p.len() == 6 && p.starts_with(b"<0x") && p.ends_with(b">")
}

/// A merge candidate: adjacent symbols `left` and `right` (indices into the initial symbols)
/// whose concatenation is the piece `id`, with `id`'s score.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    score: f32,
    left: usize,
    right: usize,
    right_id: u32,
    id: u32,
}

impl Ord for Candidate {
    /// Highest score first; on equal scores the leftmost pair, as `run.c`'s strict `>` keeps the
    /// first best pair of its scan. Scores are finite (checked at construction) and `-0.0` is
    /// normalised to `0.0` where candidates are made, so `total_cmp` orders as `>` compares.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.score.total_cmp(&other.score).then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for Candidate {}

/// "No symbol" in the linked list of [`Llama2cTokenizer::merge`].
const NONE: usize = usize::MAX;

impl Llama2cTokenizer {
    /// `run.c`'s greedy merges (repeatedly merge the adjacent pair whose concatenation is the
    /// highest-scoring piece, the leftmost on ties) in O(n log n): the symbols form a linked list
    /// and the candidate pairs a priority queue, instead of rescanning the whole sequence after
    /// every merge (quadratic: docs/BENCHMARKS.md, 'Other costs'). A candidate whose symbols changed since
    /// it was queued is skipped when it comes out; the order of the valid ones is `run.c`'s, so
    /// the tokens are identical.
    fn merge(&self, symbols: &[u32]) -> Vec<u32> {
        let mut ids = symbols.to_vec();
        let n = ids.len();
        let mut next: Vec<usize> = (1..=n).map(|i| if i == n { NONE } else { i }).collect();
        let mut prev: Vec<usize> = (0..n).map(|i| if i == 0 { NONE } else { i - 1 }).collect();
        let mut alive = vec![true; n];
        let mut queue = std::collections::BinaryHeap::with_capacity(n);
        let mut pair = Vec::new();
        for left in 0..n.saturating_sub(1) {
            self.push_candidate(&mut queue, &mut pair, &ids, left, left + 1);
        }
        while let Some(c) = queue.pop() {
            let valid = alive[c.left] && alive[c.right] && next[c.left] == c.right && ids[c.right] == c.right_id;
            if !valid {
                continue;
            }
            ids[c.left] = c.id;
            alive[c.right] = false;
            let after = next[c.right];
            next[c.left] = after;
            if after != NONE {
                prev[after] = c.left;
                self.push_candidate(&mut queue, &mut pair, &ids, c.left, after);
            }
            if prev[c.left] != NONE {
                self.push_candidate(&mut queue, &mut pair, &ids, prev[c.left], c.left);
            }
        }
        (0..n).filter(|&i| alive[i]).map(|i| ids[i]).collect()
    }

    /// Queues the pair (`left`, `right`) when their concatenation is a piece.
    fn push_candidate(
        &self,
        queue: &mut std::collections::BinaryHeap<Candidate>,
        pair: &mut Vec<u8>,
        ids: &[u32],
        left: usize,
        right: usize,
    ) {
        pair.clear();
        pair.extend_from_slice(&self.pieces[ids[left] as usize]);
        pair.extend_from_slice(&self.pieces[ids[right] as usize]);
        if let Some(id) = self.id_of(pair) {
            // `+ 0.0` turns -0.0 into 0.0, which `run.c`'s `>` treats as equal.
            let score = self.scores[id as usize] + 0.0;
            queue.push(Candidate { score, left, right, right_id: ids[right], id });
        }
    }
}

impl Tokenizer for Llama2cTokenizer {
    fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    fn bos_id(&self) -> Option<u32> {
        Some(self.bos)
    }

    fn eos_id(&self) -> Option<u32> {
        Some(self.eos)
    }

    /// BOS: llama2.c's models were trained on stories each opened by BOS, which `run.c` stops
    /// at ("the BOS (=1) token delimits sequences"); they never emit EOS.
    fn stop_id(&self) -> Option<u32> {
        Some(self.bos)
    }

    fn encode(&self, text: &str) -> Vec<u32> {
        let mut tokens = if self.add_bos { vec![self.bos] } else { Vec::new() };
        let first = tokens.len();
        if text.is_empty() {
            return tokens;
        }
        // SentencePiece's "dummy prefix": the text is encoded as if it started with a space.
        if let Some(space) = self.id_of(b" ") {
            tokens.push(space);
        }
        // One token per UTF-8 character where the vocabulary has it, else one per byte.
        for ch in text.chars() {
            let mut buf = [0u8; 4];
            let bytes = ch.encode_utf8(&mut buf).as_bytes();
            match self.id_of(bytes) {
                Some(id) => tokens.push(id),
                None => tokens.extend(bytes.iter().map(|&b| self.byte_ids[b as usize])),
            }
        }
        let merged = self.merge(&tokens[first..]);
        tokens.truncate(first);
        tokens.extend(merged);
        tokens
    }
    fn decode(&self, tokens: &[u32]) -> String {
        let mut out = Vec::new();
        let mut prev = None;
        // As llama2.c prints a sequence: the leading BOS is not shown, a BOS generated later is
        // shown as its piece.
        for (i, &t) in tokens.iter().enumerate() {
            if !(i == 0 && t == self.bos) {
                out.extend(self.piece_bytes(prev, t));
            }
            prev = Some(t);
        }
        String::from_utf8_lossy(&out).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A vocabulary: <unk>, <s>, </s>, 256 byte pieces, then " ", "a", "b", " a", "ab", " ab".
    fn tiny_file(extra: &[(&str, f32)]) -> Vec<u8> {
        let mut b = 8i32.to_le_bytes().to_vec();
        let mut push = |piece: &[u8], score: f32| {
            b.extend(score.to_le_bytes());
            b.extend((piece.len() as i32).to_le_bytes());
            b.extend(piece);
        };
        push(b"<unk>", 0.0);
        push(b"<s>", 0.0);
        push(b"</s>", 0.0);
        for byte in 0..=255u8 {
            push(format!("<0x{byte:02X}>").as_bytes(), 0.0);
        }
        for (p, s) in extra {
            push(p.as_bytes(), *s);
        }
        b
    }

    fn tiny() -> (Llama2cTokenizer, usize) {
        let extra = [(" ", -1.0), ("a", -2.0), ("b", -3.0), (" a", -4.0), ("ab", -0.5), (" ab", -5.0)];
        let n = 259 + extra.len();
        (Llama2cTokenizer::parse(Path::new("tok.bin"), &tiny_file(&extra)).expect("valid"), n)
    }

    #[test]
    fn merges_by_score_with_dummy_prefix_and_byte_fallback() {
        let (t, _) = tiny();
        // " " "a" "b" -> "ab" (score -0.5) beats " a" (-4.0); then " " + "ab" -> " ab".
        assert_eq!(t.encode("ab"), vec![1, 264]);
        // "é" is not in the vocabulary: two byte-fallback tokens (0xC3, 0xA9) + 3.
        assert_eq!(t.encode("é"), vec![1, 259, 0xC3 + 3, 0xA9 + 3]);
        assert_eq!(t.encode(""), vec![1]);
        assert_eq!(t.decode(&t.encode("ab é")), "ab é");
    }

    /// `run.c`'s merge loop as written there: rescan every pair after every merge (quadratic).
    fn merge_by_rescanning(t: &Llama2cTokenizer, mut tokens: Vec<u32>) -> Vec<u32> {
        loop {
            let mut best: Option<(f32, usize, u32)> = None;
            for i in 0..tokens.len().saturating_sub(1) {
                let pair = [t.pieces[tokens[i] as usize].clone(), t.pieces[tokens[i + 1] as usize].clone()].concat();
                if let Some(id) = t.id_of(&pair) {
                    let score = t.scores[id as usize];
                    if best.is_none_or(|(s, _, _)| score > s) {
                        best = Some((score, i, id));
                    }
                }
            }
            let Some((_, i, id)) = best else { return tokens };
            tokens[i] = id;
            tokens.remove(i + 1);
        }
    }

    /// The queue-based merges give `run.c`'s tokens on texts full of overlapping pairs and
    /// equal scores (including -0.0 against 0.0), where a wrong tie order would show.
    #[test]
    fn queued_merges_equal_rescanning_merges() {
        let extra = [
            (" ", -1.0),
            ("a", -2.0),
            ("b", -3.0),
            ("aa", 0.0),
            ("ab", -0.0),
            ("ba", 0.0),
            ("bb", -1.0),
            ("aaa", -0.5),
            ("aab", -0.5),
            ("aba", -0.5),
            ("abab", 1.0),
            (" a", -0.0),
            (" aa", 0.5),
            ("bbb", 1.0),
        ];
        let t = Llama2cTokenizer::parse(Path::new("tok.bin"), &tiny_file(&extra)).expect("valid");
        let mut state = 0x2545_f491_u32;
        for len in 0..200 {
            let text: String = (0..len)
                .map(|_| {
                    state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                    ['a', 'b', ' ', 'é'][(state >> 16) as usize % 4]
                })
                .collect();
            let encoded = t.encode(&text);
            let mut unmerged = vec![1];
            if !text.is_empty() {
                unmerged.push(t.id_of(b" ").expect("space"));
                for ch in text.chars() {
                    let mut buf = [0u8; 4];
                    let bytes = ch.encode_utf8(&mut buf).as_bytes();
                    match t.id_of(bytes) {
                        Some(id) => unmerged.push(id),
                        None => unmerged.extend(bytes.iter().map(|&b| t.byte_ids[b as usize])),
                    }
                }
            }
            let expected = [vec![1], merge_by_rescanning(&t, unmerged[1..].to_vec())].concat();
            assert_eq!(encoded, expected, "{text:?}");
        }
    }

    #[test]
    fn truncation_and_bad_lengths_are_errors() {
        let (t, n) = tiny();
        assert_eq!(t.vocab_size(), n);
        let file = tiny_file(&[(" ", -1.0), ("a", -2.0), ("b", -3.0), (" a", -4.0), ("ab", -0.5), (" ab", -5.0)]);
        let e = Llama2cTokenizer::parse(Path::new("tok.bin"), &file[..file.len() - 1]).unwrap_err().to_string();
        assert!(e.starts_with("tok.bin: truncated"), "{e}");
        let e = Llama2cTokenizer::parse(Path::new("tok.bin"), &[1, 0]).unwrap_err().to_string();
        assert!(e.starts_with("tok.bin: truncated"), "{e}");
        let mut three = 8i32.to_le_bytes().to_vec();
        for piece in [&b"<unk>"[..], b"<s>", b"</s>"] {
            three.extend(0f32.to_le_bytes());
            three.extend((piece.len() as i32).to_le_bytes());
            three.extend(piece);
        }
        let e = Llama2cTokenizer::parse(Path::new("tok.bin"), &three).unwrap_err().to_string();
        assert!(e.contains("fewer than the 259"), "{e}");
        let mut bad = file.clone();
        bad[8..12].copy_from_slice(&(-3i32).to_le_bytes());
        let e = Llama2cTokenizer::parse(Path::new("tok.bin"), &bad).unwrap_err().to_string();
        assert!(e.contains("length -3"), "{e}");
    }
}
