//! Tokenizers run by Hugging Face's `tokenizers` crate: a folder's `tokenizer.json`, and GGUF's
//! byte-level BPE (`tokenizer.ggml.model = gpt2`) rebuilt from its vocabulary and merges.

use std::path::Path;

use tokenizers::AddedToken;
use tokenizers::SplitDelimiterBehavior;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};

use crate::LoadError;
use crate::tokenizer::Tokenizer;

/// A [`Tokenizer`] backed by `tokenizers::Tokenizer`.
///
/// `encode` runs the pipeline (normalizer, pre-tokenizer, model, and the post-processor of a
/// `tokenizer.json`, which is what adds BOS for Llama checkpoints), then prepends BOS when
/// [`HfTokenizer::prepend_bos`] is set (GGUF's `add_bos_token`). Special tokens written in the
/// text (`<|im_start|>`) are matched as such, as `transformers` does. `decode` is the pipeline's
/// decoder with special tokens kept, except that a leading BOS is not shown when `encode` adds
/// one (as llama2.c prints a sequence); for byte-level BPE it is the exact inverse of `encode`.
pub struct HfTokenizer {
    inner: tokenizers::Tokenizer,
    bos: Option<u32>,
    eos: Option<u32>,
    prepend_bos: bool,
    /// Whether `encode` starts with BOS (prepended here or by the post-processor): `decode` then
    /// hides a leading BOS.
    adds_bos: bool,
    vocab_size: usize,
}

impl std::fmt::Debug for HfTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfTokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("prepend_bos", &self.prepend_bos)
            .finish_non_exhaustive()
    }
}

/// A short probe run at construction, so that a pipeline that cannot encode is an error there
/// rather than an empty encoding later.
const PROBE: &str = "Hello, world! 123 é";

impl HfTokenizer {
    /// Wraps a built pipeline. `path` names the file for errors.
    ///
    /// # Errors
    /// [`LoadError::Invalid`] when a special id is outside the vocabulary or the pipeline cannot
    /// encode a probe text.
    pub fn new(
        path: &Path,
        inner: tokenizers::Tokenizer,
        bos: Option<u32>,
        eos: Option<u32>,
        prepend_bos: bool,
    ) -> Result<Self, LoadError> {
        let vocab_size = inner.get_vocab_size(true);
        for (name, id) in [("BOS", bos), ("EOS", eos)] {
            if let Some(id) = id.filter(|&id| id as usize >= vocab_size) {
                return Err(LoadError::invalid(
                    path,
                    format!("{name} id {id} is outside the vocabulary of {vocab_size}"),
                ));
            }
        }
        if prepend_bos && bos.is_none() {
            return Err(LoadError::invalid(path, "the tokenizer adds BOS but has no BOS token"));
        }
        let probe = guarded(|| inner.encode(PROBE, true))
            .and_then(|r| r.map_err(|e| e.to_string()))
            .map_err(|e| LoadError::invalid(path, format!("the tokenizer cannot encode a probe text: {e}")))?;
        let adds_bos = prepend_bos || (bos.is_some() && probe.get_ids().first().copied() == bos);
        Ok(Self { inner, bos, eos, prepend_bos, adds_bos, vocab_size })
    }

    /// The wrapped pipeline.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Whether `encode` prepends BOS itself (beyond what the pipeline's post-processor adds).
    pub fn prepend_bos(&self) -> bool {
        self.prepend_bos
    }
}

impl Tokenizer for HfTokenizer {
    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        if let (true, Some(bos)) = (self.prepend_bos, self.bos) {
            out.push(bos);
        }
        // The pipeline encoded a probe at construction; a later failure would need a
        // pathological text for a regex engine (fancy-regex backtracking limit). The trait has no
        // error channel: the result is then the BOS alone, which callers refuse as empty.
        if let Ok(Ok(enc)) = guarded(|| self.inner.encode(text, true)) {
            out.extend_from_slice(enc.get_ids());
        }
        out
    }

    fn decode(&self, tokens: &[u32]) -> String {
        let tokens = match (tokens.first(), self.bos) {
            (Some(&first), Some(bos)) if self.adds_bos && first == bos => &tokens[1..],
            _ => tokens,
        };
        guarded(|| self.inner.decode(tokens, false)).ok().and_then(Result::ok).unwrap_or_default()
    }
}

/// Llama 3's pre-tokenizer regex, as its `tokenizer.json` writes it (llama.cpp's
/// `LLAMA_VOCAB_PRE_TYPE_LLAMA3` uses an equivalent spelled without `(?i:...)`).
pub(crate) const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's pre-tokenizer regex, as its `tokenizer.json` writes it (llama.cpp's
/// `LLAMA_VOCAB_PRE_TYPE_QWEN2` uses an equivalent spelled without `(?i:...)`): Llama 3's but
/// with every digit alone (`\p{N}`, not `\p{N}{1,3}`).
pub(crate) const QWEN2_REGEX: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How GGUF's `tokenizer.ggml.pre` value pre-tokenizes byte-level BPE: the pre-tokenizer and
/// whether a pre-token found whole in the vocabulary skips the merges (`ignore_merges`).
///
/// Source: llama.cpp `src/llama-vocab.cpp` (`llm_tokenizer_bpe` constructor, `regex_exprs` per
/// `LLAMA_VOCAB_PRE_TYPE_*`, and the `tokenizer_pre ==` mapping in `llama_vocab::impl::load`):
/// - `default`, `gpt2`, `gpt-2` (llama.cpp's name, which its converter writes for GPT-2) and an
///   absent key: the GPT-2 regex
///   `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`, which is what
///   `ByteLevel { use_regex: true }` splits with;
/// - `smollm`, `starcoder`, `refact`, `codeshell`: first `\p{N}` (every digit alone), then the
///   GPT-2 regex — Hugging Face's SmolLM2 `tokenizer.json` writes the same as
///   `Sequence[Digits(individual_digits), ByteLevel(add_prefix_space = false)]`;
/// - `llama3`, `llama-v3`, `llama-bpe`: [`LLAMA3_REGEX`] (digits in runs of at most three), with
///   `ignore_merges` (llama.cpp sets `tokenizer_ignore_merges`; Llama 3's `tokenizer.json` has
///   `"ignore_merges": true`);
/// - `qwen2`: [`QWEN2_REGEX`], without `ignore_merges` (llama.cpp sets it for Llama 3 only).
///
/// Other values (deepseek, ...) use other regexes and are refused rather than tokenized wrongly.
fn byte_level_pre_tokenizer(pre: Option<&str>) -> Result<(PreTokenizerWrapper, bool), String> {
    let byte_level = ByteLevel::new(false, true, true);
    match pre.unwrap_or("default") {
        "default" | "gpt2" | "gpt-2" => Ok((PreTokenizerWrapper::ByteLevel(byte_level), false)),
        "smollm" | "starcoder" | "refact" | "codeshell" => Ok((
            PreTokenizerWrapper::Sequence(Sequence::new(vec![
                PreTokenizerWrapper::Digits(Digits::new(true)),
                PreTokenizerWrapper::ByteLevel(byte_level),
            ])),
            false,
        )),
        "llama3" | "llama-v3" | "llama-bpe" => Ok((regex_then_byte_level(LLAMA3_REGEX)?, true)),
        "qwen2" => Ok((regex_then_byte_level(QWEN2_REGEX)?, false)),
        other => Err(format!(
            "tokenizer.ggml.pre = {other} is not supported; supported: default, gpt2, gpt-2, smollm, starcoder, refact, \
             codeshell, llama3, llama-v3, llama-bpe, qwen2"
        )),
    }
}

/// A split on `regex` (matches isolated), then the byte-to-unicode map without GPT-2's regex.
fn regex_then_byte_level(regex: &str) -> Result<PreTokenizerWrapper, String> {
    let split = Split::new(SplitPattern::Regex(regex.to_string()), SplitDelimiterBehavior::Isolated, false)
        .map_err(|e| format!("the pre-tokenizer regex does not compile: {e}"))?;
    Ok(PreTokenizerWrapper::Sequence(Sequence::new(vec![
        PreTokenizerWrapper::Split(split),
        PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, false)),
    ])))
}

/// Builds GGUF's byte-level BPE (`tokenizer.ggml.model = gpt2`) from its metadata.
///
/// Spec: ggml `docs/gguf.md` ("Tokenizer", `tokenizer.ggml.tokens`/`merges`/`token_type`); the
/// tokens are GPT-2's byte-to-unicode strings (`Ġ` for a space), the merges `"left right"` in
/// rank order. Tokens of type 3 (control) and 4 (user-defined) become special added tokens, so a
/// chat template's `<|im_start|>` in the text encodes as that one token (llama.cpp with
/// `parse_special`). BOS is prepended only when `add_bos` is true.
pub(crate) fn gguf_byte_level_bpe(
    path: &Path,
    tokens: &[String],
    merges: &[String],
    token_type: Option<&[i32]>,
    pre: Option<&str>,
    (bos, eos, add_bos): (Option<u32>, Option<u32>, bool),
) -> Result<HfTokenizer, LoadError> {
    let bad = |m: String| LoadError::invalid(path, m);
    let vocab: Vocab = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    if vocab.len() != tokens.len() {
        return Err(bad(format!(
            "tokenizer.ggml.tokens has duplicate tokens ({} unique of {})",
            vocab.len(),
            tokens.len()
        )));
    }
    let mut pairs = Vec::with_capacity(merges.len());
    for (i, m) in merges.iter().enumerate() {
        let Some((a, b)) = m.split_once(' ') else {
            return Err(bad(format!("tokenizer.ggml.merges[{i}] = {m:?} is not \"left right\"")));
        };
        pairs.push((a.to_string(), b.to_string()));
    }
    let (pre, ignore_merges) = byte_level_pre_tokenizer(pre).map_err(bad)?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, pairs)
        .ignore_merges(ignore_merges)
        .build()
        .map_err(|e| bad(format!("tokenizer.ggml.merges: {e}")))?;
    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner.with_pre_tokenizer(Some(pre));
    inner.with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::new(false, true, true))));
    if let Some(types) = token_type {
        let special: Vec<AddedToken> = types
            .iter()
            .zip(tokens)
            .filter(|(t, _)| matches!(t, 3 | 4))
            .map(|(_, tok)| AddedToken::from(tok.clone(), true))
            .collect();
        inner.add_special_tokens(&special);
    }
    HfTokenizer::new(path, inner, bos, eos, add_bos)
}

/// Reads a Hugging Face `tokenizer.json` (the `tokenizers` serialization), its BPE merges
/// checked first ([`super::merges::check_merges`]).
pub(crate) fn read_tokenizer_json(path: &Path) -> Result<tokenizers::Tokenizer, LoadError> {
    let bytes = crate::input::read_file(path, crate::input::TOKENIZER)?;
    super::merges::check_merges(&bytes).map_err(|m| LoadError::invalid(path, m))?;
    guarded(|| tokenizers::Tokenizer::from_bytes(&bytes))
        .and_then(|r| r.map_err(|e| e.to_string()))
        .map_err(|e| LoadError::invalid(path, format!("not a tokenizers JSON file this version reads: {e}")))
}

/// The first id `inner` gives `text`, if it encodes (used to see whether its post-processor
/// prepends BOS).
pub(crate) fn first_encoded_id(inner: &tokenizers::Tokenizer, text: &str) -> Option<u32> {
    guarded(|| inner.encode(text, true)).ok()?.ok()?.get_ids().first().copied()
}

/// Runs `f`, turning a panic into its message. The `tokenizers` crate (0.22) panics on some
/// malformed `tokenizer.json` files instead of returning an error — in its deserializer
/// (`decoders/mod.rs`, `expect("Helper")`) and in a `TemplateProcessing` that names a special
/// token it does not map (`processors/template.rs`) — as qdrift's fuzzer found; a file must never
/// crash qdrift, so every call into it on file-defined data goes through here.
fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".to_string());
        format!("the tokenizers library failed on this file ({message})")
    })
}
