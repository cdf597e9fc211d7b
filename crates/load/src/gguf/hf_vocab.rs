//! A Hugging Face folder's `tokenizer.json` as GGUF `tokenizer.*` metadata, the way llama.cpp's
//! converter writes it, for `qdrift quantize --format gguf` on a Hugging Face folder.
//!
//! References (llama.cpp, `convert_hf_to_gguf.py` and `gguf-py/gguf/`):
//! - byte-level BPE: `TextModel.get_vocab_base` and `_set_vocab_gpt2` — tokens in id order, ids
//!   missing below the model's `vocab_size` padded as `[PADi]` (type 5 unused), added tokens
//!   typed 3 (control) when `special` or when they look special (`does_token_look_special`:
//!   `<|...|>`, `<｜...｜>`, `<unused...>`, `<pad>`, `<mask>`, `<2mass>`, `[@BOS@]`), else 4
//!   (user-defined, `▁` written as a space), other tokens 1 (normal); the merges as
//!   `SpecialVocab(load_merges=True)` reads them;
//! - SentencePiece-style BPE (`byte_fallback`, `▁`, `<0xNN>`): `_set_vocab_llama_hf` with
//!   `vocab.py` `LlamaHfVocab` — tokens in id order, type 6 (byte) for `<0xNN>`, 3 (control) for
//!   the tokens `tokenizer_config.json` names as special (`all_special_ids`), 4 (user-defined)
//!   for other added tokens past the base vocabulary, 1 otherwise; `tokenizer.ggml.pre =
//!   default`; no merges;
//! - both: `vocab.py` `SpecialVocab` for the special ids (`bos`, `eos`, `unk`, `sep`, `pad`,
//!   `mask`, and `eot`/`eom` when the post-processor's last token is not `eos_token`; `cls` has
//!   no GGUF key and is skipped, as there), `add_bos_token`/`add_eos_token`/`add_sep_token` and
//!   the chat template; key names from `gguf/constants.py` (`Keys.Tokenizer`; note the spec's
//!   spelling `tokenizer.ggml.seperator_token_id`).
//!
//! Where qdrift departs from the converter, and why:
//! - `tokenizer.ggml.pre`: llama.cpp names the pre-tokenizer by hashing the ids of a test string
//!   (`get_vocab_base_pre`), which needs the tokenizer run through `transformers`. qdrift reads it
//!   off the `pre_tokenizer` instead (`byte_level_pre`); pre-tokenizers it does not recognise
//!   are refused, as the converter refuses an unknown hash.
//! - SentencePiece-style scores: `LlamaHfVocab` writes -1000 for every token, with which
//!   llama.cpp's SentencePiece tokenizer (and qdrift's, [`crate::Llama2cTokenizer`]) can only
//!   merge leftmost-first. qdrift writes the score the merges imply instead: `-r` for a piece
//!   whose first merge has rank `r`, [`UNMERGED_SCORE`] for the others. This inverts
//!   `transformers`' `LlamaConverter` (which ranks the merges by the merged piece's score), and
//!   the folder is refused when its merges are not of that shape (`spm_scores`).
//! - The converter re-normalizes non-normalized added tokens by encoding and decoding them with
//!   `transformers`; for the tokenizers read here that is the identity, and it is not done.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use serde_json::{Map, Value};

use super::read::GgufValue;
use crate::LoadError;
use crate::hf::tokenizer::{LLAMA3_REGEX, QWEN2_REGEX};
use crate::input::{CHAT_TEMPLATE, TOKENIZER, optional_json, read_file};

/// What [`hf_tokenizer_keys`] converts, for refusals.
const SUPPORTED_MODELS: &str = "BPE (byte-level as GPT-2, SmolLM2, Llama 3, Qwen2; or SentencePiece-style with \
                                byte_fallback as Llama 2)";

/// The pre-tokenizers recognised for byte-level BPE, for refusals.
const SUPPORTED_PRE: &str = "ByteLevel (gpt-2); Sequence[Digits(individual_digits), ByteLevel] (smollm); \
                             Sequence[Split(Llama 3 regex), ByteLevel(use_regex=false)] (llama-bpe); \
                             Sequence[Split(Qwen2 regex), ByteLevel(use_regex=false)] (qwen2)";

/// The score of a SentencePiece-style piece that no merge produces: below every merged piece.
pub const UNMERGED_SCORE: f32 = -1e9;

/// GGUF token types (`gguf/constants.py` `TokenType`).
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;
const BYTE: i32 = 6;

/// The `tokenizer.*` metadata llama.cpp's converter writes for the Hugging Face folder `dir`
/// whose tokenizer is `tokenizer_path` (`dir/tokenizer.json` unless given), for a model of
/// `n_vocab` tokens. See the module documentation for the rules and their sources.
///
/// Supported `tokenizer.json` files: `model.type = BPE` either without `byte_fallback` (byte-level:
/// `decoder` ByteLevel, `normalizer` absent or NFC, a `pre_tokenizer` `byte_level_pre`
/// recognises), written as `tokenizer.ggml.model = gpt2`; or with `byte_fallback` (SentencePiece
/// style: `decoder` a Sequence, spaces made `▁` by the normalizer — Prepend `▁` then Replace — or
/// by a Metaspace pre-tokenizer), written as `tokenizer.ggml.model = llama`.
///
/// # Errors
/// [`LoadError::Unsupported`] naming `tokenizer.json` and the field for another tokenizer model
/// (WordPiece, Unigram, ...), decoder, normalizer or pre-tokenizer; [`LoadError::Invalid`] for a
/// file that is not JSON, ids outside `n_vocab`, an id given to two tokens, malformed merges,
/// SentencePiece-style merges that the scores cannot express, a missing `tokenizer.json`.
pub fn hf_tokenizer_keys(
    dir: &Path,
    tokenizer_path: &Path,
    n_vocab: usize,
) -> Result<Vec<(String, GgufValue)>, LoadError> {
    if !tokenizer_path.exists() {
        return Err(LoadError::invalid(
            tokenizer_path,
            "not found; a Hugging Face folder is written as GGUF from its tokenizer.json",
        ));
    }
    let bytes = read_file(tokenizer_path, TOKENIZER)?;
    // Before the whole file becomes a JSON value: a list of repeated merges costs memory without end.
    crate::hf::merges::check_merges(&bytes).map_err(|m| LoadError::invalid(tokenizer_path, m))?;
    let json: Value = serde_json::from_slice(&bytes)
        .map_err(|e| LoadError::invalid(tokenizer_path, format!("not valid JSON: {e}")))?;
    let t = TokenizerJson::parse(tokenizer_path, &json, n_vocab)?;
    let byte_fallback = json["model"].get("byte_fallback").and_then(Value::as_bool).unwrap_or(false);
    if byte_fallback { llama_keys(dir, &t, &json) } else { gpt2_keys(dir, &t, &json) }
}

/// An added token of `tokenizer.json` (`added_tokens[]`).
struct Added {
    id: u32,
    content: String,
    special: bool,
}

/// The parts of `tokenizer.json` both conversions use.
struct TokenizerJson<'a> {
    path: &'a Path,
    /// `model.vocab`: token → id.
    vocab: HashMap<String, u32>,
    /// `added_tokens`, in file order.
    added: Vec<Added>,
    /// Every token by id (vocabulary and added tokens), `n_vocab` long; `None` for holes.
    by_id: Vec<Option<String>>,
    /// `model.merges` as `(left, right)`, in rank order.
    merges: Vec<(String, String)>,
}

impl<'a> TokenizerJson<'a> {
    fn parse(path: &'a Path, json: &Value, n_vocab: usize) -> Result<Self, LoadError> {
        let bad = |m: String| LoadError::invalid(path, m);
        let model = json.get("model").filter(|m| m.is_object()).ok_or_else(|| bad("model is missing".into()))?;
        match model.get("type").and_then(Value::as_str) {
            Some("BPE") => {}
            Some(other) => {
                return Err(LoadError::unsupported(path, "model.type", other.escape_debug(), SUPPORTED_MODELS));
            }
            // Older files omit `type`; a BPE model is the one with merges.
            None if model.get("merges").is_some() => {}
            None => return Err(LoadError::unsupported(path, "model.type", "(absent)", SUPPORTED_MODELS)),
        }
        let vocab_json =
            model.get("vocab").and_then(Value::as_object).ok_or_else(|| bad("model.vocab is not an object".into()))?;
        let mut by_id: Vec<Option<String>> = vec![None; n_vocab];
        let mut place = |id: &Value, token: &str, field: &str| -> Result<u32, LoadError> {
            let i =
                id.as_u64().and_then(|i| usize::try_from(i).ok()).filter(|&i| i < n_vocab).ok_or_else(|| {
                    bad(format!("{field} {token:?} has id {id}, outside the model's {n_vocab} tokens"))
                })?;
            match &by_id[i] {
                Some(other) if other != token => {
                    Err(bad(format!("id {i} is given to two tokens, {other:?} and {token:?} ({field})")))
                }
                _ => {
                    by_id[i] = Some(token.to_string());
                    Ok(i as u32)
                }
            }
        };
        let mut vocab = HashMap::with_capacity(vocab_json.len());
        for (token, id) in vocab_json {
            vocab.insert(token.clone(), place(id, token, "model.vocab token")?);
        }
        let mut added = Vec::new();
        for (k, a) in
            json.get("added_tokens").and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]).iter().enumerate()
        {
            let content = a
                .get("content")
                .and_then(Value::as_str)
                .ok_or_else(|| bad(format!("added_tokens[{k}].content is not a string")))?;
            let id = place(a.get("id").unwrap_or(&Value::Null), content, "added token")?;
            let special = a.get("special").and_then(Value::as_bool).unwrap_or(false);
            added.push(Added { id, content: content.to_string(), special });
        }
        let merges = parse_merges(path, model.get("merges"))?;
        Ok(Self { path, vocab, added, by_id, merges })
    }

    /// The id of `content` among the added tokens (the first match), as `SpecialVocab` looks
    /// special tokens up.
    fn added_id(&self, content: &str) -> Option<u32> {
        self.added.iter().find(|a| a.content == content).map(|a| a.id)
    }
}

/// `model.merges`: `"left right"` strings or `[left, right]` pairs (`tokenizers` ≥ 0.20). Pairs are
/// joined as `SpecialVocab` joins them, a space inside a part written as U+0120 (`Ġ`).
fn parse_merges(path: &Path, merges: Option<&Value>) -> Result<Vec<(String, String)>, LoadError> {
    let bad = |i: usize, m: &Value| {
        LoadError::invalid(path, format!("model.merges[{i}] = {m} is neither \"left right\" nor [left, right]"))
    };
    let Some(list) = merges.and_then(Value::as_array) else { return Ok(Vec::new()) };
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let pair = match m {
            Value::String(s) => {
                let mut parts = s.split(' ');
                match (parts.next(), parts.next(), parts.next()) {
                    (Some(a), Some(b), None) => (a.to_string(), b.to_string()),
                    _ => return Err(bad(i, m)),
                }
            }
            Value::Array(p) => match p.as_slice() {
                [Value::String(a), Value::String(b)] => (a.replace(' ', "\u{120}"), b.replace(' ', "\u{120}")),
                _ => return Err(bad(i, m)),
            },
            _ => return Err(bad(i, m)),
        };
        out.push(pair);
    }
    Ok(out)
}

/// A short description of a `tokenizer.json` component for refusals: its `type`, with the
/// types of a Sequence's members.
fn describe(v: Option<&Value>) -> String {
    let Some(v) = v.filter(|v| !v.is_null()) else { return "null".into() };
    // Escaped: a refusal is one line whatever the file holds.
    let ty = v.get("type").and_then(Value::as_str).unwrap_or("?").escape_debug().to_string();
    let members = ["pretokenizers", "normalizers", "decoders", "processors"].iter().find_map(|k| v.get(*k));
    match members.and_then(Value::as_array) {
        Some(m) => format!("{ty}[{}]", m.iter().map(|x| describe(Some(x))).collect::<Vec<_>>().join(", ")),
        None => ty,
    }
}

/// `tokenizer.ggml.pre` for a byte-level `pre_tokenizer`, the value llama.cpp's hash names it
/// for the families whose `tokenizer.json` writes it so (the rule qdrift uses instead of the hash):
/// - `ByteLevel { add_prefix_space: false, use_regex: true }` (GPT-2's regex): `gpt-2`;
/// - `Sequence[Digits { individual_digits: true }, ByteLevel { add_prefix_space: false,
///   use_regex: true }]` (SmolLM, SmolLM2; also StarCoder's): `smollm`;
/// - `Sequence[Split { Regex: LLAMA3_REGEX, Isolated, invert: false }, ByteLevel {
///   add_prefix_space: false, use_regex: false }]` (Llama 3): `llama-bpe`;
/// - the same with Qwen2's regex (Qwen1.5, Qwen2, Qwen2.5): `qwen2`.
///
/// `None` for anything else.
pub(crate) fn byte_level_pre(pre: Option<&Value>) -> Option<&'static str> {
    let ty = |v: &Value| v.get("type").and_then(Value::as_str).map(str::to_string);
    let flag = |v: &Value, k: &str, default: bool| v.get(k).and_then(Value::as_bool).unwrap_or(default);
    let byte_level = |v: &Value, use_regex: bool| {
        ty(v).as_deref() == Some("ByteLevel")
            && !flag(v, "add_prefix_space", true)
            && flag(v, "use_regex", true) == use_regex
    };
    let split = |v: &Value, regex: &str| {
        ty(v).as_deref() == Some("Split")
            && v.get("pattern").and_then(|p| p.get("Regex")).and_then(Value::as_str) == Some(regex)
            && v.get("behavior").and_then(Value::as_str) == Some("Isolated")
            && !flag(v, "invert", false)
    };
    let pre = pre?;
    if byte_level(pre, true) {
        return Some("gpt-2");
    }
    if ty(pre).as_deref() != Some("Sequence") {
        return None;
    }
    match pre.get("pretokenizers").and_then(Value::as_array).map(Vec::as_slice)? {
        [d, b] if ty(d).as_deref() == Some("Digits") && flag(d, "individual_digits", false) && byte_level(b, true) => {
            Some("smollm")
        }
        [s, b] if split(s, LLAMA3_REGEX) && byte_level(b, false) => Some("llama-bpe"),
        [s, b] if split(s, QWEN2_REGEX) && byte_level(b, false) => Some("qwen2"),
        _ => None,
    }
}

/// `does_token_look_special` of `convert_hf_to_gguf.py`.
fn looks_special(t: &str) -> bool {
    matches!(t, "<pad>" | "<mask>" | "<2mass>" | "[@BOS@]")
        || (t.starts_with("<|") && t.ends_with("|>"))
        || (t.starts_with("<\u{ff5c}") && t.ends_with("\u{ff5c}>"))
        || (t.starts_with("<unused") && t.ends_with('>'))
}

fn key(k: &str, v: GgufValue) -> (String, GgufValue) {
    (k.to_string(), v)
}

fn strings(v: Vec<String>) -> GgufValue {
    GgufValue::Array(v.into_iter().map(GgufValue::String).collect())
}

/// `_set_vocab_gpt2`: byte-level BPE.
fn gpt2_keys(dir: &Path, t: &TokenizerJson<'_>, json: &Value) -> Result<Vec<(String, GgufValue)>, LoadError> {
    let path = t.path;
    let decoder = json.get("decoder");
    if decoder.and_then(|d| d.get("type")).and_then(Value::as_str) != Some("ByteLevel") {
        return Err(LoadError::unsupported(
            path,
            "decoder",
            describe(decoder),
            "ByteLevel for a byte-level BPE (model.byte_fallback false)",
        ));
    }
    let normalizer = json.get("normalizer").filter(|n| !n.is_null());
    if let Some(n) = normalizer
        && n.get("type").and_then(Value::as_str) != Some("NFC")
    {
        return Err(LoadError::unsupported(
            path,
            "normalizer",
            describe(Some(n)),
            "none, or NFC (Qwen2) for a byte-level BPE",
        ));
    }
    let pre = byte_level_pre(json.get("pre_tokenizer")).ok_or_else(|| {
        LoadError::unsupported(path, "pre_tokenizer", describe(json.get("pre_tokenizer")), SUPPORTED_PRE)
    })?;
    if t.merges.is_empty() {
        return Err(LoadError::invalid(path, "model.merges is missing or empty; a BPE tokenizer needs its merges"));
    }
    let added: HashMap<&str, &Added> = t.added.iter().map(|a| (a.content.as_str(), a)).collect();
    let mut tokens = Vec::with_capacity(t.by_id.len());
    let mut types = Vec::with_capacity(t.by_id.len());
    for (i, tok) in t.by_id.iter().enumerate() {
        let Some(tok) = tok else {
            tokens.push(format!("[PAD{i}]"));
            types.push(GgufValue::I32(UNUSED));
            continue;
        };
        let ty = match added.get(tok.as_str()) {
            Some(a) if a.special || looks_special(tok) => CONTROL,
            Some(_) => USER_DEFINED,
            None => NORMAL,
        };
        tokens.push(if ty == USER_DEFINED { tok.replace('\u{2581}', " ") } else { tok.clone() });
        types.push(GgufValue::I32(ty));
    }
    let merges = t.merges.iter().map(|(a, b)| format!("{a} {b}")).collect();
    let mut keys = vec![
        key("tokenizer.ggml.model", GgufValue::String("gpt2".into())),
        key("tokenizer.ggml.pre", GgufValue::String(pre.into())),
        key("tokenizer.ggml.tokens", strings(tokens)),
        key("tokenizer.ggml.token_type", GgufValue::Array(types)),
        key("tokenizer.ggml.merges", strings(merges)),
    ];
    keys.extend(special_vocab(dir, t, json, None)?);
    Ok(keys)
}

/// Is `p` a byte piece `<0xNN>` (`LlamaHfVocab.get_token_type`'s `<0x[0-9A-Fa-f]{2}>`)?
fn is_byte_piece(p: &str) -> bool {
    let b = p.as_bytes();
    b.len() == 6 && p.starts_with("<0x") && p.ends_with('>') && b[3].is_ascii_hexdigit() && b[4].is_ascii_hexdigit()
}

/// Whether spaces become `▁` as SentencePiece (and qdrift's GGUF `llama` tokenizer) makes them:
/// Llama 2's normalizer `Sequence[Prepend("▁"), Replace(" ", "▁")]` without a pre-tokenizer, or
/// the Metaspace pre-tokenizer newer `transformers` writes instead (`replacement = ▁`, prepended
/// to the first word or always, not split) without a normalizer.
fn spm_spaces(json: &Value) -> bool {
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    let normalizer = json.get("normalizer").filter(|v| !v.is_null());
    let pre = json.get("pre_tokenizer").filter(|v| !v.is_null());
    match (normalizer, pre) {
        (Some(n), None) => {
            let Some([prepend, replace]) = n.get("normalizers").and_then(Value::as_array).map(Vec::as_slice) else {
                return false;
            };
            s(n, "type").as_deref() == Some("Sequence")
                && s(prepend, "type").as_deref() == Some("Prepend")
                && s(prepend, "prepend").as_deref() == Some("\u{2581}")
                && s(replace, "type").as_deref() == Some("Replace")
                && replace.get("pattern").and_then(|p| p.get("String")).and_then(Value::as_str) == Some(" ")
                && s(replace, "content").as_deref() == Some("\u{2581}")
        }
        (None, Some(p)) => {
            s(p, "type").as_deref() == Some("Metaspace")
                && s(p, "replacement").as_deref() == Some("\u{2581}")
                && matches!(s(p, "prepend_scheme").as_deref(), Some("first" | "always"))
                && !p.get("split").and_then(Value::as_bool).unwrap_or(true)
        }
        _ => false,
    }
}

/// `_set_vocab_llama_hf` (`LlamaHfVocab`): SentencePiece-style BPE.
fn llama_keys(dir: &Path, t: &TokenizerJson<'_>, json: &Value) -> Result<Vec<(String, GgufValue)>, LoadError> {
    let path = t.path;
    let decoder = json.get("decoder");
    if decoder.and_then(|d| d.get("type")).and_then(Value::as_str) != Some("Sequence") {
        return Err(LoadError::unsupported(
            path,
            "decoder",
            describe(decoder),
            "a Sequence (Replace ▁, ByteFallback, Fuse, Strip) for a BPE with byte_fallback",
        ));
    }
    if !spm_spaces(json) {
        return Err(LoadError::unsupported(
            path,
            "normalizer/pre_tokenizer",
            format!("{} / {}", describe(json.get("normalizer")), describe(json.get("pre_tokenizer"))),
            "Sequence[Prepend ▁, Replace ' ' → ▁] / null (Llama 2), or null / Metaspace(▁, prepend first, no split) \
             for a BPE with byte_fallback",
        ));
    }
    let tokens: Vec<String> = t
        .by_id
        .iter()
        .enumerate()
        .map(|(i, tok)| {
            tok.clone().ok_or_else(|| {
                LoadError::invalid(
                    path,
                    format!(
                        "no token has id {i} of the model's {} (LlamaHfVocab needs every id below the vocabulary size)",
                        t.by_id.len()
                    ),
                )
            })
        })
        .collect::<Result<_, _>>()?;
    let specials = all_special_ids(dir, t)?;
    let base = t.vocab.len();
    let types: Vec<i32> = tokens
        .iter()
        .enumerate()
        .map(|(i, tok)| {
            if i >= base {
                if specials.contains(&(i as u32)) { CONTROL } else { USER_DEFINED }
            } else if is_byte_piece(tok) {
                BYTE
            } else if specials.contains(&(i as u32)) {
                CONTROL
            } else {
                NORMAL
            }
        })
        .collect();
    let scores = spm_scores(t, &tokens, &types)?;
    let n = tokens.len();
    let mut keys = vec![
        key("tokenizer.ggml.model", GgufValue::String("llama".into())),
        key("tokenizer.ggml.pre", GgufValue::String("default".into())),
        key("tokenizer.ggml.tokens", strings(tokens)),
        key("tokenizer.ggml.scores", GgufValue::Array(scores.into_iter().map(GgufValue::F32).collect())),
        key("tokenizer.ggml.token_type", GgufValue::Array(types.into_iter().map(GgufValue::I32).collect())),
    ];
    keys.extend(special_vocab(dir, t, json, Some(n))?);
    Ok(keys)
}

/// Scores for GGUF's SentencePiece tokenizer that make its merges (highest-scoring adjacent
/// piece first) those of `tokenizer.json`'s BPE (lowest-ranked adjacent pair first): `-r` for a
/// piece whose first merge has rank `r`, [`UNMERGED_SCORE`] for pieces no merge produces.
///
/// That is exact when the merges are what `transformers`' `LlamaConverter` makes of a
/// SentencePiece model — for every piece, all its splits into two pieces, the pieces in
/// descending score — so the folder is refused unless, over the normal pieces: every merge
/// producing a piece comes in one run of ranks, and every split of a normal piece into two normal
/// pieces is a merge (else SentencePiece would reach a piece the BPE never makes). As in
/// llama2.c, pieces produced by two different splits may still merge in another order when both
/// splits are present at once.
fn spm_scores(t: &TokenizerJson<'_>, tokens: &[String], types: &[i32]) -> Result<Vec<f32>, LoadError> {
    let bad = |m: String| LoadError::invalid(t.path, m);
    if t.merges.len() >= 1 << 24 {
        return Err(bad(format!("{} merges: ranks past 2^24 have no exact f32 score", t.merges.len())));
    }
    let normal = |s: &str| t.vocab.get(s).is_some_and(|&id| types[id as usize] == NORMAL);
    // First and last rank of the merges producing each piece.
    let mut ranks: HashMap<String, (usize, usize)> = HashMap::new();
    let mut pairs: HashSet<(&str, &str)> = HashSet::with_capacity(t.merges.len());
    for (r, (a, b)) in t.merges.iter().enumerate() {
        let p = format!("{a}{b}");
        match ranks.get_mut(&p) {
            None => {
                ranks.insert(p, (r, r));
            }
            Some(e) if e.1 + 1 == r => e.1 = r,
            Some(&mut (first, last)) => {
                return Err(bad(format!(
                    "model.merges: the merges producing {p:?} are not consecutive (ranks {first}..={last} and {r}), \
                     so no SentencePiece score reproduces this BPE; convert the folder with llama.cpp's \
                     convert_hf_to_gguf.py"
                )));
            }
        }
        pairs.insert((a, b));
    }
    for tok in tokens.iter().filter(|tok| normal(tok)) {
        for (k, _) in tok.char_indices().skip(1) {
            let (a, b) = tok.split_at(k);
            if normal(a) && normal(b) && !pairs.contains(&(a, b)) {
                return Err(bad(format!(
                    "model.merges has no merge \"{a} {b}\" although {tok:?}, {a:?} and {b:?} are pieces, so \
                     SentencePiece's merging would reach {tok:?} where this BPE does not"
                )));
            }
        }
    }
    Ok(tokens.iter().map(|tok| ranks.get(tok).map_or(UNMERGED_SCORE, |&(first, _)| 0.0 - first as f32)).collect())
}

/// A special token entry of `tokenizer_config.json`: its content (a string or `{content}`).
fn content(v: Option<&Value>) -> Option<&str> {
    let v = v?;
    v.as_str().or_else(|| v.get("content").and_then(Value::as_str))
}

/// The ids `transformers`' `all_special_ids` gives (as `LlamaHfVocab` types them): the tokens
/// `tokenizer_config.json` (else `special_tokens_map.json`) names as `bos`, `eos`, `unk`, `sep`,
/// `pad`, `cls`, `mask` and `additional_special_tokens`, looked up in the vocabulary.
fn all_special_ids(dir: &Path, t: &TokenizerJson<'_>) -> Result<HashSet<u32>, LoadError> {
    let mut ids = HashSet::new();
    for file in ["tokenizer_config.json", "special_tokens_map.json"] {
        let Some(c) = optional_json(&dir.join(file))? else { continue };
        let mut names: Vec<&str> = ["bos", "eos", "unk", "sep", "pad", "cls", "mask"]
            .iter()
            .filter_map(|typ| content(c.get(format!("{typ}_token"))))
            .collect();
        if let Some(extra) = c.get("additional_special_tokens").and_then(Value::as_array) {
            names.extend(extra.iter().filter_map(|v| content(Some(v))));
        }
        let lookup = |n: &str| t.vocab.get(n).copied().or_else(|| t.added_id(n));
        ids.extend(names.into_iter().filter_map(lookup));
    }
    Ok(ids)
}

/// An ordered map with Python `dict` semantics for the few entries `SpecialVocab` keeps.
#[derive(Default)]
struct Ordered<V>(Vec<(String, V)>);

impl<V> Ordered<V> {
    fn set(&mut self, k: &str, v: V) {
        match self.0.iter_mut().find(|(key, _)| key == k) {
            Some(e) => e.1 = v,
            None => self.0.push((k.to_string(), v)),
        }
    }
    fn contains(&self, k: &str) -> bool {
        self.0.iter().any(|(key, _)| key == k)
    }
}

/// Python truthiness of an optional JSON value (`None`, `null`, `""`, `{}`, `[]`, `false`, 0 are
/// false).
fn truthy(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
    }
}

/// `gguf-py` `SpecialVocab(dir, n_vocab=…)`'s keys, in the order `add_to_gguf` writes them
/// (special ids, `add_*_token` flags, chat template); its merges are written by the caller.
fn special_vocab(
    dir: &Path,
    t: &TokenizerJson<'_>,
    json: &Value,
    n_vocab: Option<usize>,
) -> Result<Vec<(String, GgufValue)>, LoadError> {
    let mut state = SpecialVocab::read(dir)?;
    state.post_processor(json);
    state.keys(dir, t, n_vocab)
}

/// `SpecialVocab`'s state as it reads `tokenizer_config.json` and then the post-processor, which
/// may fill in and override that file's special tokens.
struct SpecialVocab {
    /// The special token types; `eot`/`eom` are added when the post-processor's last token is not
    /// `eos_token`.
    types: Vec<&'static str>,
    /// `add_{type}_token` flags, in the order they were set.
    add: Ordered<bool>,
    /// `tokenizer_config.json` (`SpecialVocab`'s `tokenizer_config`, updated as it goes).
    tc: Option<Map<String, Value>>,
    /// Its `bos_token`, `cls_token`, `eos_token` and `sep_token` as they stand.
    bos: Option<Value>,
    cls: Option<Value>,
    eos: Option<Value>,
    sep: Option<Value>,
}

/// The id of a `TemplateProcessing` `SpecialToken` piece, when truthy.
fn special_id(v: &Value) -> Option<Value> {
    v.get("SpecialToken").and_then(|s| s.get("id")).cloned().filter(|v| truthy(Some(v)))
}

impl SpecialVocab {
    /// `tokenizer_config.json`'s special tokens; BOS falls back to CLS and EOS to SEP.
    fn read(dir: &Path) -> Result<Self, LoadError> {
        let tc: Option<Map<String, Value>> =
            optional_json(&dir.join("tokenizer_config.json"))?.and_then(|v| v.as_object().cloned());
        let get = |k: &str| tc.as_ref().and_then(|m| m.get(k)).cloned();
        let (bos, cls, eos, sep) = (get("bos_token"), get("cls_token"), get("eos_token"), get("sep_token"));
        let types = vec!["bos", "eos", "unk", "sep", "pad", "cls", "mask"];
        let mut s = SpecialVocab { types, add: Ordered::default(), tc, bos, cls, eos, sep };
        if !truthy(s.bos.as_ref())
            && truthy(s.cls.as_ref())
            && let Some(m) = s.tc.as_mut().filter(|m| !m.is_empty())
        {
            s.bos.clone_from(&s.cls);
            m.insert("bos_token".into(), s.cls.clone().unwrap_or(Value::Null));
        }
        if !truthy(s.eos.as_ref())
            && truthy(s.sep.as_ref())
            && let Some(m) = s.tc.as_mut().filter(|m| !m.is_empty())
        {
            s.eos.clone_from(&s.sep);
            m.insert("eos_token".into(), s.sep.clone().unwrap_or(Value::Null));
        }
        Ok(s)
    }

    /// Whether `tokenizer_config.json` is present and not empty.
    fn tc_truthy(&self) -> bool {
        self.tc.as_ref().is_some_and(|m| !m.is_empty())
    }

    /// `_try_load_from_tokenizer_json`'s post-processor part: `RobertaProcessing` and
    /// `TemplateProcessing`, alone or in a `Sequence`.
    fn post_processor(&mut self, json: &Value) {
        let Some(pp) = json.get("post_processor").filter(|p| truthy(Some(p))) else { return };
        let processors = pp.get("processors").and_then(Value::as_array).cloned().unwrap_or_else(|| vec![pp.clone()]);
        for p in &processors {
            match p.get("type").and_then(Value::as_str) {
                Some("RobertaProcessing") => self.roberta(p),
                Some("TemplateProcessing") => {
                    let (first, last) = self.template_single(p);
                    self.template_pair(p, first.as_ref(), last.as_ref());
                }
                _ => {}
            }
        }
    }

    /// `RobertaProcessing`: BOS, EOS and SEP added; CLS and SEP from the processor when the
    /// config has none.
    fn roberta(&mut self, p: &Value) {
        self.add.set("bos", true);
        self.add.set("eos", true);
        self.add.set("sep", true);
        if !truthy(self.cls.as_ref())
            && let Some(m) = self.tc.as_mut().filter(|m| !m.is_empty())
        {
            self.cls = p.get("cls").and_then(|c| c.get(0)).cloned().or_else(|| self.bos.clone());
            m.insert("cls_token".into(), self.cls.clone().unwrap_or(Value::Null));
        }
        if !truthy(self.sep.as_ref())
            && let Some(m) = self.tc.as_mut().filter(|m| !m.is_empty())
        {
            self.sep = p.get("sep").and_then(|c| c.get(0)).cloned().or_else(|| self.eos.clone());
            m.insert("sep_token".into(), self.sep.clone().unwrap_or(Value::Null));
        }
    }

    /// `TemplateProcessing`'s `single` template: its first special token is BOS (added when it is
    /// `bos_token` or `cls_token`), its last EOS (a last token other than `eos_token` becomes EOS,
    /// the old one `eot`, else `eom`). Returns the first and last special ids.
    fn template_single(&mut self, p: &Value) -> (Option<Value>, Option<Value>) {
        let single = p.get("single").and_then(Value::as_array).cloned().unwrap_or_default();
        if single.len() <= 1 {
            return (None, None);
        }
        let first = special_id(&single[0]);
        if let Some(f) = &first {
            if !self.tc_truthy() {
                self.bos = Some(f.clone());
            }
            self.add.set("bos", Some(f) == self.bos.as_ref() || Some(f) == self.cls.as_ref());
        }
        let last = special_id(&single[single.len() - 1]);
        if let Some(l) = &last {
            if !self.tc_truthy() {
                self.eos = Some(l.clone());
            } else if Some(l) != self.eos.as_ref()
                && let Some(m) = self.tc.as_mut()
            {
                let old = self.eos.clone().unwrap_or(Value::Null);
                if !self.types.contains(&"eot") {
                    self.types.push("eot");
                    m.insert("eot_token".into(), old);
                } else if !self.types.contains(&"eom") {
                    self.types.push("eom");
                    m.insert("eom_token".into(), old);
                }
                m.insert("eos_token".into(), l.clone());
                self.eos = Some(l.clone());
            }
            self.add.set("eos", Some(l) == self.eos.as_ref());
        }
        (first, last)
    }

    /// `TemplateProcessing`'s `pair` template, without the single template's first and last
    /// special tokens: `A`, a separator (`sep_token` or `eos_token`), `B` adds SEP.
    fn template_pair(&mut self, p: &Value, first: Option<&Value>, last: Option<&Value>) {
        let mut pair = p.get("pair").and_then(Value::as_array).cloned().unwrap_or_default();
        if pair.is_empty() {
            return;
        }
        let start = usize::from(first.is_some() && special_id(&pair[0]).as_ref() == first);
        let stop_last = last.is_some() && special_id(&pair[pair.len() - 1]).as_ref() == last;
        let end = if stop_last { pair.len() - 1 } else { pair.len() };
        pair = pair.get(start..end.max(start)).map(<[Value]>::to_vec).unwrap_or_default();
        if pair.is_empty() {
            return;
        }
        let (a, b) = (seq(&pair[0]), seq(&pair[pair.len() - 1]));
        if a != Some("A") || b != Some("B") || pair.len() <= 2 {
            return;
        }
        let middle = &pair[1..pair.len() - 1];
        let is_sep = |e: &Value| Some(e) == self.sep.as_ref() || Some(e) == self.eos.as_ref();
        let mut add_sep = false;
        if let Some(e) = special_id(&middle[0])
            && is_sep(&e)
            && last.is_none()
        {
            add_sep = true;
        }
        if middle.len() == 2
            && let Some(e) = special_id(&middle[1])
            && is_sep(&e)
        {
            add_sep = true;
        }
        self.add.set("sep", add_sep);
        if add_sep
            && !truthy(self.sep.as_ref())
            && let Some(m) = self.tc.as_mut().filter(|m| !m.is_empty())
        {
            m.insert("sep_token".into(), self.eos.clone().unwrap_or(Value::Null));
        }
    }

    /// The keys: the special ids (from `tokenizer_config.json`'s added tokens, then `config.json`'s
    /// `*_token_id`), the `add_bos`/`add_eos`/`add_sep` flags, the chat template.
    fn keys(
        mut self,
        dir: &Path,
        t: &TokenizerJson<'_>,
        n_vocab: Option<usize>,
    ) -> Result<Vec<(String, GgufValue)>, LoadError> {
        let mut ids: Ordered<u32> = Ordered::default();
        let mut chat_template = None;
        if let Some(tc) = self.tc.as_ref().filter(|m| !m.is_empty()) {
            let alt = chat_template_file(dir)?;
            chat_template = match tc.get("chat_template") {
                Some(v) => Some(v.clone()),
                None => alt,
            };
            for typ in &self.types {
                if let Some(b) = tc.get(&format!("add_{typ}_token")).and_then(Value::as_bool) {
                    self.add.set(typ, b);
                }
                let Some(c) = content(tc.get(&format!("{typ}_token"))) else { continue };
                if let Some(id) = t.added_id(c) {
                    set_special(&mut ids, typ, id, n_vocab);
                }
            }
        }
        if let Some(config) = optional_json(&dir.join("config.json"))? {
            for typ in &self.types {
                let k = format!("{typ}_token_id");
                let v = config
                    .get(&k)
                    .filter(|v| !v.is_null())
                    .or_else(|| config.get("text_config").and_then(|c| c.get(&k)));
                if let Some(id) = v.and_then(Value::as_u64).and_then(|i| u32::try_from(i).ok()) {
                    set_special(&mut ids, typ, id, n_vocab);
                }
            }
        }
        let mut keys = Vec::new();
        for (typ, id) in ids.0 {
            let name = match typ.as_str() {
                "bos" => "bos_token_id",
                "eos" => "eos_token_id",
                "unk" => "unknown_token_id",
                "sep" => "seperator_token_id",
                "pad" => "padding_token_id",
                "mask" => "mask_token_id",
                "eot" => "eot_token_id",
                "eom" => "eom_token_id",
                // `cls` has no GGUF key (SpecialVocab skips it with a warning).
                _ => continue,
            };
            keys.push(key(&format!("tokenizer.ggml.{name}"), GgufValue::U32(id)));
        }
        for (typ, b) in self.add.0 {
            if matches!(typ.as_str(), "bos" | "eos" | "sep") {
                keys.push(key(&format!("tokenizer.ggml.add_{typ}_token"), GgufValue::Bool(b)));
            }
        }
        keys.extend(chat_template_keys(chat_template.as_ref()));
        Ok(keys)
    }
}

/// The `id` of a `TemplateProcessing` `Sequence` piece (`A` or `B`).
fn seq(v: &Value) -> Option<&str> {
    v.get("Sequence").and_then(|s| s.get("id")).and_then(Value::as_str)
}

/// `SpecialVocab._set_special_token`: the first id set for a type wins; ids past `n_vocab` are
/// skipped.
fn set_special(ids: &mut Ordered<u32>, typ: &str, id: u32, n_vocab: Option<usize>) {
    if n_vocab.is_none_or(|n| (id as usize) < n) && !ids.contains(typ) {
        ids.set(typ, id);
    }
}

/// `chat_template.jinja`, else `chat_template.json`'s `chat_template` (SpecialVocab's fallbacks
/// when `tokenizer_config.json` has none; the `additional_chat_templates/` folder is not read).
pub(crate) fn chat_template_file(dir: &Path) -> Result<Option<Value>, LoadError> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.exists() {
        let bytes = crate::input::read_file(&jinja, CHAT_TEMPLATE)?;
        let text = String::from_utf8(bytes).map_err(|_| LoadError::invalid(&jinja, "is not UTF-8"))?;
        return Ok(Some(Value::String(text)));
    }
    Ok(optional_json(&dir.join("chat_template.json"))?.and_then(|v| v.get("chat_template").cloned()))
}

/// `GGUFWriter.add_chat_template`: a string as `tokenizer.chat_template`; a list of `{name,
/// template}` as `tokenizer.chat_template.NAME` (name with non-alphanumerics as `_`) plus
/// `tokenizer.chat_templates` listing the names, and `default` as `tokenizer.chat_template`.
/// Other values are ignored, as there.
fn chat_template_keys(v: Option<&Value>) -> Vec<(String, GgufValue)> {
    match v {
        Some(Value::String(s)) => vec![key("tokenizer.chat_template", GgufValue::String(s.clone()))],
        Some(Value::Array(list)) => {
            let mut keys = Vec::new();
            let mut names = Vec::new();
            let mut default = None;
            for choice in list {
                let name: String = choice
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .chars()
                    .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                    .collect();
                let Some(template) = choice.get("template").and_then(Value::as_str) else { continue };
                if name.is_empty() {
                    continue;
                }
                if name == "default" {
                    default = Some(template.to_string());
                } else {
                    keys.push(key(&format!("tokenizer.chat_template.{name}"), GgufValue::String(template.into())));
                    if !names.contains(&name) {
                        names.push(name);
                    }
                }
            }
            if !names.is_empty() {
                keys.push(key("tokenizer.chat_templates", strings(names)));
            }
            if let Some(d) = default {
                keys.push(key("tokenizer.chat_template", GgufValue::String(d)));
            }
            keys
        }
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merges_read_as_strings_or_pairs_and_refuse_other_shapes() {
        let p = Path::new("tokenizer.json");
        let want = vec![("a".to_string(), "b".to_string()), ("Ġ".to_string(), "c".to_string())];
        assert_eq!(parse_merges(p, Some(&json!(["a b", "Ġ c"]))).unwrap(), want);
        assert_eq!(parse_merges(p, Some(&json!([["a", "b"], [" ", "c"]]))).unwrap(), want);
        for bad in [json!(["a b c"]), json!(["ab"]), json!([["a"]]), json!([1])] {
            let e = parse_merges(p, Some(&bad)).unwrap_err().to_string();
            assert!(e.starts_with("tokenizer.json: model.merges[0] = "), "{e}");
        }
    }

    #[test]
    fn byte_level_pre_tokenizers_are_named_by_their_shape() {
        let bl =
            |re: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": re});
        let split =
            |r: &str| json!({"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": false});
        let seq = |a: Value, b: Value| json!({"type": "Sequence", "pretokenizers": [a, b]});
        let digits = json!({"type": "Digits", "individual_digits": true});
        assert_eq!(byte_level_pre(Some(&bl(true))), Some("gpt-2"));
        assert_eq!(byte_level_pre(Some(&seq(digits.clone(), bl(true)))), Some("smollm"));
        assert_eq!(byte_level_pre(Some(&seq(split(LLAMA3_REGEX), bl(false)))), Some("llama-bpe"));
        assert_eq!(byte_level_pre(Some(&seq(split(QWEN2_REGEX), bl(false)))), Some("qwen2"));
        // Not recognised: another regex, a prefix space, the regex applied twice, nothing.
        assert_eq!(byte_level_pre(Some(&seq(split("\\s+"), bl(false)))), None);
        assert_eq!(byte_level_pre(Some(&json!({"type": "ByteLevel", "add_prefix_space": true}))), None);
        assert_eq!(byte_level_pre(Some(&seq(split(LLAMA3_REGEX), bl(true)))), None);
        assert_eq!(byte_level_pre(Some(&seq(json!({"type": "Digits", "individual_digits": false}), bl(true)))), None);
        assert_eq!(byte_level_pre(None), None);
        assert_eq!(describe(Some(&seq(digits, bl(true)))), "Sequence[Digits, ByteLevel]");
    }

    #[test]
    fn tokens_that_look_special_are_those_of_the_converter() {
        for t in ["<|im_start|>", "<｜begin▁of▁sentence｜>", "<unused12>", "<pad>", "<mask>"] {
            assert!(looks_special(t), "{t}");
        }
        for t in ["<s>", "<|x", "[PAD]", "<0x0A>"] {
            assert!(!looks_special(t), "{t}");
        }
        assert!(is_byte_piece("<0x0A>") && is_byte_piece("<0xff>") && !is_byte_piece("<0xZZ>"));
    }

    #[test]
    fn chat_template_lists_become_named_keys() {
        let keys = chat_template_keys(Some(&json!([
            {"name": "default", "template": "D"}, {"name": "tool use", "template": "T"}, {"template": "x"}
        ])));
        let names: Vec<&str> = keys.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["tokenizer.chat_template.tool_use", "tokenizer.chat_templates", "tokenizer.chat_template"]);
        assert_eq!(keys[2].1, GgufValue::String("D".into()));
        assert!(chat_template_keys(Some(&json!(3))).is_empty());
    }
}
