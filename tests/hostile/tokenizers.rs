//! Tokenizing a 1 MB prompt takes time linear-ish in its length, for llama2.c's tokenizer
//! (stories260K's `tok512.bin`) and GGUF's byte-level BPE (SmolLM2, skipped when absent).

use std::path::Path;
use std::time::{Duration, Instant};

use qdrift_load::{Llama2cTokenizer, Tokenizer};
use qdrift_tests::stories_dir;

/// A generous bound: the quadratic merges took longer than this on a twentieth of the input and
/// did not finish the whole (docs/BENCHMARKS.md, 'Other costs').
const BOUND: Duration = Duration::from_secs(10);

/// About 1 MB of English-like text with the spacing, punctuation, digits and non-ASCII bytes of
/// real prompts.
fn megabyte() -> String {
    let sentence = "Once upon a time, Lily found 3 shiny stones near the café. She said: \"Look, Mom!\" ";
    sentence.repeat((1 << 20) / sentence.len() + 1)
}

fn encode_timed(tokenizer: &dyn Tokenizer, text: &str) -> (Vec<u32>, Duration) {
    let start = Instant::now();
    let tokens = tokenizer.encode(text);
    (tokens, start.elapsed())
}

#[test]
fn llama2c_tokenizer_encodes_a_megabyte_quickly_and_as_its_parts() {
    let tok = Llama2cTokenizer::read(&stories_dir().join("tok512.bin")).expect("tok512.bin reads");
    let text = megabyte();
    let (tokens, took) = encode_timed(&tok, &text);
    println!("llama2.c tokenizer: {} bytes -> {} tokens in {took:?}", text.len(), tokens.len());
    assert!(took < BOUND, "{} bytes took {took:?}", text.len());
    assert!(tokens.len() > text.len() / 8, "{} tokens for {} bytes", tokens.len(), text.len());
    assert_eq!(tok.decode(&tokens), text);
}

#[test]
fn gguf_byte_level_bpe_encodes_a_megabyte_quickly() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.is_file() {
        println!("skipped: {} is absent (cargo xtask fetch-models)", path.display());
        return;
    }
    let loaded = qdrift_load::open_model(&path, None).expect("SmolLM2 loads");
    for text in [megabyte(), unbroken()] {
        let (tokens, took) = encode_timed(&*loaded.tokenizer, &text);
        println!("GGUF gpt2 tokenizer: {} bytes -> {} tokens in {took:?}", text.len(), tokens.len());
        assert!(took < BOUND, "{} bytes took {took:?}", text.len());
        assert_eq!(loaded.tokenizer.decode(&tokens), text);
    }
}

/// About 1 MB of letters without a space or punctuation: one word for pre-tokenizers, and the
/// worst case for merge loops that rescan (every merge creates new candidate pairs beside it).
fn unbroken() -> String {
    "onceuponatimetherewasalittlegirl".repeat((1 << 20) / 32)
}

#[test]
fn a_megabyte_without_spaces_encodes_quickly() {
    let tok = Llama2cTokenizer::read(&stories_dir().join("tok512.bin")).expect("tok512.bin reads");
    let text = unbroken();
    let (tokens, took) = encode_timed(&tok, &text);
    println!("llama2.c tokenizer, no spaces: {} bytes -> {} tokens in {took:?}", text.len(), tokens.len());
    assert!(took < BOUND, "{} bytes took {took:?}", text.len());
    assert_eq!(tok.decode(&tokens), text);
}
