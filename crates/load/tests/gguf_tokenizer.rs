//! GGUF's embedded tokenizers: the SmolLM2 file from `models/` (skipped when absent) and small
//! vocabularies built in memory.

use std::path::{Path, PathBuf};

use qdrift_load::{GgufTokenizerMetadata, LoadError, gguf_tokenizer, open_model};

fn smollm2() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.is_file() {
        Some(p)
    } else {
        println!("skipped: {} is absent (cargo xtask fetch-models)", p.display());
        None
    }
}

/// Expected ids: Python `tokenizers` 0.22 (Hugging Face) with `models.BPE(vocab, merges)` built
/// from this GGUF's `tokenizer.ggml.tokens`/`merges` (read with the `gguf` Python package), the
/// pre-tokenizer `Sequence([Digits(individual_digits=True), ByteLevel(add_prefix_space=False)])`
/// and the 17 control tokens added as special tokens. "Hello world! 123", "Café déjà vu." and
/// "  multiple   spaces" also match the SmolLM2 ids published by an unrelated project's tests.
const SMOLLM2_CASES: &[(&str, &[u32])] = &[
    ("The capital of France is", &[504, 3575, 282, 4649, 314]),
    ("Hello world! 123", &[19556, 905, 17, 216, 33, 34, 35]),
    ("Café déjà vu.", &[51, 1939, 2756, 32564, 90, 16739, 386, 101, 30]),
    ("  multiple   spaces", &[216, 2701, 256, 5600]),
    ("\n", &[198]),
    ("<|im_start|>user\nHi 2024!<|im_end|>", &[1, 4093, 198, 26843, 216, 34, 32, 34, 36, 17, 2]),
    ("naïve 東京 🙂 x=3.14;", &[3546, 46494, 17097, 247, 126, 16736, 122, 47526, 1792, 45, 35, 30, 33, 36, 43]),
];

#[test]
fn smollm2_gguf_tokenizer_matches_hf_tokenizers_ids_and_round_trips() {
    let Some(path) = smollm2() else { return };
    let loaded = open_model(&path, None).expect("SmolLM2 GGUF opens with its tokenizer");
    let tok = &loaded.tokenizer;
    assert_eq!(loaded.format, qdrift_load::ModelFormat::Gguf);
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(tok.bos_id(), Some(1));
    assert_eq!(tok.eos_id(), Some(2));
    for (text, ids) in SMOLLM2_CASES {
        // add_bos_token is false in this file: no BOS is prepended.
        assert_eq!(tok.encode(text), *ids, "{text:?}");
        assert_eq!(tok.decode(ids), *text, "{text:?}");
    }
    assert!(loaded.chat_template.as_deref().is_some_and(|t| t.contains("<|im_start|>")));
    assert!(loaded.source_dtypes.iter().any(|(_, t)| t == "Q4_1"));
}

#[test]
fn smollm2_gguf_refuses_an_explicit_tokenizer() {
    let Some(path) = smollm2() else { return };
    let e = open_model(&path, Some(Path::new("tok512.bin"))).err().expect("refused").to_string();
    assert!(e.contains("carries its own tokenizer"), "{e}");
}

/// A SentencePiece vocabulary in GGUF's form: `▁` for spaces, `<0xNN>` byte pieces.
fn llama_meta() -> GgufTokenizerMetadata {
    let mut tokens = vec!["<unk>".to_string(), "<s>".to_string(), "</s>".to_string()];
    tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    let extra = [("▁", -1.0), ("a", -2.0), ("b", -3.0), ("▁a", -4.0), ("ab", -0.5), ("▁ab", -5.0)];
    tokens.extend(extra.iter().map(|(p, _)| p.to_string()));
    let mut scores = vec![0.0; 259];
    scores.extend(extra.iter().map(|(_, s)| *s));
    GgufTokenizerMetadata {
        model: Some("llama".into()),
        tokens,
        scores: Some(scores),
        bos_token_id: Some(1),
        eos_token_id: Some(2),
        ..Default::default()
    }
}

#[test]
fn gguf_llama_tokenizer_merges_by_score_with_byte_fallback() {
    let meta = llama_meta();
    let tok = gguf_tokenizer(Path::new("m.gguf"), &meta, 265).expect("valid");
    // "▁" "a" "b" -> "ab" (-0.5) first, then "▁ab" (264); é has no piece: bytes C3 A9.
    assert_eq!(tok.encode("ab"), vec![1, 264]);
    assert_eq!(tok.encode("é"), vec![1, 259, 0xC3 + 3, 0xA9 + 3]);
    assert_eq!(tok.decode(&tok.encode("ab é")), "ab é");
    let no_bos = GgufTokenizerMetadata { add_bos_token: Some(false), ..meta };
    let tok = gguf_tokenizer(Path::new("m.gguf"), &no_bos, 265).expect("valid");
    assert_eq!(tok.encode("ab"), vec![264]);
    assert_eq!(tok.decode(&[264]), "ab");
}

#[test]
fn gguf_tokenizer_vocab_mismatch_is_an_error() {
    let e = gguf_tokenizer(Path::new("m.gguf"), &llama_meta(), 300).err().expect("mismatch");
    assert!(matches!(e, LoadError::VocabMismatch { tokenizer_vocab: 265, model_vocab: 300, .. }), "{e}");
    assert!(e.to_string().contains("has 265 tokens but model m.gguf has a vocabulary of 300"), "{e}");
}

#[test]
fn gguf_tokenizer_unsupported_kinds_are_errors() {
    let meta = GgufTokenizerMetadata { model: Some("bert".into()), ..llama_meta() };
    let e = gguf_tokenizer(Path::new("m.gguf"), &meta, 265).err().expect("refused").to_string();
    assert!(e.contains("GGUF tokenizer type bert is not supported; supported: gpt2, llama"), "{e}");
    let meta = GgufTokenizerMetadata {
        model: Some("gpt2".into()),
        pre: Some("deepseek-llm".into()),
        merges: vec!["a b".into()],
        ..llama_meta()
    };
    let e = gguf_tokenizer(Path::new("m.gguf"), &meta, 265).err().expect("refused").to_string();
    assert!(e.contains("tokenizer.ggml.pre = deepseek-llm is not supported"), "{e}");
    let meta = GgufTokenizerMetadata { scores: None, ..llama_meta() };
    let e = gguf_tokenizer(Path::new("m.gguf"), &meta, 265).err().expect("refused").to_string();
    assert!(e.contains("tokenizer.ggml.scores is missing"), "{e}");
}

/// A byte-level BPE vocabulary (ASCII only, so GPT-2's byte-to-unicode map is the identity but
/// for the space, `Ġ`) with one merge, `H e`, whose whole words only `ignore_merges` reaches.
fn bpe_meta(pre: &str) -> GgufTokenizerMetadata {
    let mut tokens: Vec<String> = vec!["<|begin_of_text|>".into(), "<|end_of_text|>".into()];
    tokens.extend("Helowrd123456'sĠ".chars().map(String::from));
    tokens.extend(["He", "Hello", "Ġworld", "123", "456", "'s"].map(String::from));
    let mut token_type = vec![3, 3];
    token_type.resize(tokens.len(), 1);
    GgufTokenizerMetadata {
        model: Some("gpt2".into()),
        pre: Some(pre.into()),
        merges: vec!["H e".into()],
        token_type: Some(token_type),
        bos_token_id: Some(0),
        eos_token_id: Some(1),
        tokens,
        ..Default::default()
    }
}

#[test]
fn gguf_llama3_and_qwen2_pre_tokenizers_split_digits_and_merge_as_llama_cpp() {
    let tokens = bpe_meta("gpt2").tokens;
    let id = |t: &str| tokens.iter().position(|x| x == t).expect("token") as u32;
    let chars = |s: &str| s.chars().map(|c| id(&c.to_string())).collect::<Vec<_>>();
    let text = "Hello world123456's";
    let encode = |pre: &str| {
        let meta = bpe_meta(pre);
        let tok = gguf_tokenizer(Path::new("m.gguf"), &meta, meta.tokens.len()).expect("valid");
        let ids = tok.encode(text);
        assert_eq!(tok.decode(&ids), text, "{pre}");
        ids
    };
    // Llama 3: "Hello" " world" "123" "456" "'s", each whole in the vocabulary; BOS by default.
    assert_eq!(encode("llama-bpe"), vec![0, id("Hello"), id("Ġworld"), id("123"), id("456"), id("'s")]);
    // GPT-2: "Hello" " world" "123456" "'s", merged with the one merge "H e"; no BOS by default.
    let mut want = vec![id("He")];
    want.extend(chars("lloĠworld123456's"));
    assert_eq!(encode("gpt2"), want);
    // llama.cpp's own name for it, which convert_hf_to_gguf.py writes for GPT-2.
    assert_eq!(encode("gpt-2"), want);
    // Qwen2 (llama.cpp's regex): every digit alone, merges applied (no ignore_merges), no BOS.
    // With merges that build "123" from its digits, only a pre-tokenizer that keeps the digits
    // together (GPT-2's) reaches it.
    let mut meta = bpe_meta("qwen2");
    meta.tokens.push("12".into());
    meta.token_type.as_mut().expect("types").push(1);
    meta.merges.extend(["1 2".to_string(), "12 3".to_string()]);
    let encode = |meta: &GgufTokenizerMetadata| {
        let tok = gguf_tokenizer(Path::new("m.gguf"), meta, meta.tokens.len()).expect("valid");
        let ids = tok.encode("Hello world123");
        assert_eq!(tok.decode(&ids), "Hello world123");
        ids
    };
    let mut want = vec![id("He")];
    want.extend(chars("lloĠworld123"));
    assert_eq!(encode(&meta), want);
    meta.pre = Some("gpt2".into());
    let mut want = vec![id("He")];
    want.extend(chars("lloĠworld"));
    want.push(id("123"));
    assert_eq!(encode(&meta), want);
}
