//! The tokenizer embedded in a GGUF file.
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

use crate::hf_tokenizer::gguf_byte_level_bpe;
use crate::tokenizer::SpecialIds;
use crate::{GgufTokenizerMetadata, Llama2cTokenizer, LoadError, Tokenizer};

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
