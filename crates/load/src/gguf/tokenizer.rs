//! The tokenizer embedded in a GGUF file: read ([`gguf_tokenizer`]) and written
//! ([`gguf_tokenizer_keys`], [`llama2c_tokenizer_keys`]; a Hugging Face `tokenizer.json` is
//! converted by `hf_vocab.rs`).
//!
//! Spec: ggml `docs/gguf.md`, section "Tokenizer" (`tokenizer.ggml.model`, `tokens`, `scores`,
//! `token_type`, `merges`, `bos_token_id`, `eos_token_id`, `unknown_token_id`, `add_bos_token`),
//! and llama.cpp `src/llama-vocab.cpp` for the defaults it applies.
//!
//! | `tokenizer.ggml.model` | tokenizer | BOS prepended by default |
//! |---|---|---|
//! | `gpt2` | byte-level BPE from `tokens` + `merges`, pre-tokenizer from `tokenizer.ggml.pre` ([`crate::HfTokenizer`]) | no (yes for the Llama 3 pre-tokenizers) |
//! | `llama` | SentencePiece pieces + `scores`, llama2.c's greedy merges with `<0xNN>` byte fallback ([`Llama2cTokenizer::from_pieces`]) | yes |
//!
//! `add_bos_token`, when present, overrides the default (as in llama.cpp).

use std::path::Path;

use super::hf_vocab::hf_tokenizer_keys;
use super::read::{GgufTokenizerMetadata, GgufValue, read_gguf_metadata};
use crate::LoadError;
use crate::hf::tokenizer::gguf_byte_level_bpe;
use crate::loaded::{LoadedModel, ModelFormat};
use crate::synthetic::byte_tokenizer;
use crate::tokenizer::{Llama2cTokenizer, SpecialIds, Tokenizer, is_byte_piece};

/// Builds the tokenizer described by a GGUF file's `tokenizer.ggml.*` metadata.
///
/// `path` names the file in errors; `model_vocab` is the model's vocabulary size (rows of
/// `token_embd.weight`), which the token count must equal.
///
/// # Errors
/// [`LoadError::VocabMismatch`] when the token count differs from `model_vocab`;
/// [`LoadError::Invalid`] for an absent or unsupported `tokenizer.ggml.model` or
/// `tokenizer.ggml.pre`, missing scores (llama) or merges (gpt2), malformed merges, or special
/// ids outside the vocabulary.
pub fn gguf_tokenizer(
    path: &Path,
    meta: &GgufTokenizerMetadata,
    model_vocab: usize,
) -> Result<Box<dyn Tokenizer>, LoadError> {
    let bad = |m: String| LoadError::invalid(path, m);
    if meta.tokens.len() != model_vocab {
        return Err(LoadError::VocabMismatch {
            tokenizer: path.to_path_buf(),
            tokenizer_vocab: meta.tokens.len(),
            model: path.to_path_buf(),
            model_vocab,
        });
    }
    if let Some(types) = &meta.token_type
        && types.len() != meta.tokens.len()
    {
        return Err(bad(format!(
            "tokenizer.ggml.token_type has {} entries for {} tokens",
            types.len(),
            meta.tokens.len()
        )));
    }
    match meta.model.as_deref() {
        Some("gpt2") => {
            if meta.merges.is_empty() {
                return Err(bad("tokenizer.ggml.model is gpt2 but tokenizer.ggml.merges is missing or empty".into()));
            }
            // llama.cpp's default: BOS for the Llama 3 pre-tokenizers, none for other BPE.
            let llama3 = matches!(meta.pre.as_deref(), Some("llama3" | "llama-v3" | "llama-bpe"));
            let add_bos = meta.add_bos_token.unwrap_or(llama3);
            let tok = gguf_byte_level_bpe(
                path,
                &meta.tokens,
                &meta.merges,
                meta.token_type.as_deref(),
                meta.pre.as_deref(),
                (meta.bos_token_id, meta.eos_token_id, add_bos),
            )?;
            Ok(Box::new(tok))
        }
        Some("llama") => {
            let scores = meta
                .scores
                .as_deref()
                .ok_or_else(|| bad("tokenizer.ggml.model is llama but tokenizer.ggml.scores is missing".into()))?;
            // SentencePiece's defaults, which llama.cpp also uses when the keys are absent.
            let special = SpecialIds {
                bos: meta.bos_token_id.unwrap_or(1),
                eos: meta.eos_token_id.unwrap_or(2),
                unk: meta.unknown_token_id.unwrap_or(0),
                add_bos: meta.add_bos_token.unwrap_or(true),
            };
            let tok = Llama2cTokenizer::from_pieces(&meta.tokens, scores, special)
                .map_err(|e| bad(format!("tokenizer.ggml (llama): {e}")))?;
            Ok(Box::new(tok))
        }
        Some(other) => Err(bad(format!("GGUF tokenizer type {other} is not supported; supported: gpt2, llama"))),
        None => Err(bad("tokenizer.ggml.model is missing: the file has no embedded tokenizer".into())),
    }
}

/// The `tokenizer.*` metadata a GGUF file of `loaded` carries, by its source format:
/// - GGUF: every `tokenizer.*` key of the source file (`tokenizer.ggml.*`,
///   `tokenizer.chat_template`, ...), as read ([`read_gguf_metadata`]);
/// - llama2.c: [`llama2c_tokenizer_keys`] of its `tokenizer.bin`;
/// - synthetic: [`llama2c_tokenizer_keys`] of its byte-level tokenizer
///   ([`crate::byte_tokenizer`]);
/// - a Hugging Face folder: its `tokenizer.json` (with `tokenizer_config.json` and
///   `config.json`) converted as llama.cpp's `convert_hf_to_gguf.py` converts it
///   ([`hf_tokenizer_keys`]): byte-level BPE (GPT-2, SmolLM2, Llama 3, Qwen2) as
///   `tokenizer.ggml.model = gpt2`, SentencePiece-style BPE with byte fallback (Llama 2) as
///   `llama`; other tokenizers (WordPiece, Unigram, unrecognised pre-tokenizers) are refused.
///
/// # Errors
/// The conversion's [`LoadError`] for a Hugging Face folder whose tokenizer it refuses; the
/// reader's error otherwise.
pub fn gguf_tokenizer_keys(loaded: &LoadedModel) -> Result<Vec<(String, GgufValue)>, LoadError> {
    match loaded.format {
        ModelFormat::Gguf => {
            let meta = read_gguf_metadata(&loaded.path)?;
            Ok(meta.into_iter().filter(|(k, _)| k.starts_with("tokenizer.")).collect())
        }
        ModelFormat::Llama2c => {
            let tok = Llama2cTokenizer::read(&loaded.tokenizer_path)?;
            llama2c_tokenizer_keys(&loaded.tokenizer_path, &tok)
        }
        ModelFormat::Synthetic => {
            let tok = byte_tokenizer(loaded.model.arch.vocab_size).map_err(|e| LoadError::invalid(&loaded.path, e))?;
            llama2c_tokenizer_keys(&loaded.path, &tok)
        }
        ModelFormat::HfSafetensors => {
            hf_tokenizer_keys(&loaded.path, &loaded.tokenizer_path, loaded.model.arch.vocab_size)
        }
    }
}

/// The `tokenizer.ggml.*` keys of a llama2.c (SentencePiece) tokenizer, as llama.cpp's
/// converter writes a SentencePiece vocabulary: `tokenizer.ggml.model = llama` with `tokens`
/// (`▁` for spaces), `scores`, `token_type` (2 unknown for id 0, 3 control for BOS/EOS, 6 byte
/// for `<0xNN>`, 1 otherwise), `bos_token_id`, `eos_token_id`, `unknown_token_id = 0`,
/// `add_bos_token = true`.
///
/// # Errors
/// [`LoadError::Invalid`] (naming `path`) for a piece that is not UTF-8, as GGUF strings must be.
pub fn llama2c_tokenizer_keys(
    path: &Path,
    tokenizer: &Llama2cTokenizer,
) -> Result<Vec<(String, GgufValue)>, LoadError> {
    let mut tokens = Vec::with_capacity(tokenizer.pieces.len());
    for (i, p) in tokenizer.pieces.iter().enumerate() {
        let s = std::str::from_utf8(p)
            .map_err(|_| LoadError::invalid(path, format!("token {i} is not UTF-8; GGUF strings must be")))?;
        tokens.push(GgufValue::String(s.replace(' ', "\u{2581}")));
    }
    let n = tokenizer.pieces.len();
    let key = |k: &str, v: GgufValue| (k.to_owned(), v);
    let mut keys = vec![
        key("tokenizer.ggml.model", GgufValue::String("llama".into())),
        key("tokenizer.ggml.tokens", GgufValue::Array(tokens)),
        key("tokenizer.ggml.scores", GgufValue::Array(tokenizer.scores.iter().map(|&s| GgufValue::F32(s)).collect())),
        key(
            "tokenizer.ggml.token_type",
            GgufValue::Array((0..n).map(|i| GgufValue::I32(token_type(tokenizer, i))).collect()),
        ),
    ];
    if let Some(b) = tokenizer.bos_id() {
        keys.push(key("tokenizer.ggml.bos_token_id", GgufValue::U32(b)));
    }
    if let Some(e) = tokenizer.eos_id() {
        keys.push(key("tokenizer.ggml.eos_token_id", GgufValue::U32(e)));
    }
    keys.push(key("tokenizer.ggml.unknown_token_id", GgufValue::U32(0)));
    keys.push(key("tokenizer.ggml.add_bos_token", GgufValue::Bool(true)));
    Ok(keys)
}

/// GGUF's token type of piece `i`: 2 unknown (id 0), 3 control (BOS, EOS), 6 byte (`<0xNN>`),
/// 1 normal.
fn token_type(tokenizer: &Llama2cTokenizer, i: usize) -> i32 {
    let id = Some(i as u32);
    if i == 0 {
        2
    } else if id == tokenizer.bos_id() || id == tokenizer.eos_id() {
        3
    } else if is_byte_piece(&tokenizer.pieces[i]) {
        6
    } else {
        1
    }
}
