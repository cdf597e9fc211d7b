//! A Hugging Face `tokenizer.json` converted to GGUF `tokenizer.*` keys
//! (`qdrift_load::write::hf_tokenizer_keys`, what `qdrift quantize --format gguf` writes for a
//! Hugging Face folder), checked three ways:
//! - stories260K's folder (`write_hf_folder`: SentencePiece-style BPE with byte fallback): the
//!   GGUF `llama` tokenizer built from the keys encodes and decodes as the folder's
//!   `tokenizer.json` and as llama2.c's `tok512.bin`, also after a GGUF write and read;
//! - SmolLM2 (byte-level BPE, `models/`, skipped when absent): a `tokenizer.json` rebuilt from
//!   its GGUF converts back to that GGUF's own keys, and the converted tokenizer encodes as
//!   Hugging Face's `tokenizers` runs the `tokenizer.json`;
//! - refusals of what is not converted, one line naming the file and the field.
//!
//! With `QDRIFT_GGUF_PY` naming a Python that has the `gguf` package (gguf-py), the special-token
//! keys are also compared with gguf-py's own `SpecialVocab` on the same folders
//! (`hf_to_gguf_py/special_vocab.py`). `LlamaHfVocab` needs `transformers` and is not run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use qdrift_load::write::{WriteDtype, hf_tokenizer_keys, write_gguf_with, write_hf_folder};
use qdrift_load::{
    GgufTokenizerMetadata, GgufValue, HfTokenizer, Llama2cTokenizer, Tokenizer, gguf_tokenizer, open_model,
    read_gguf_metadata,
};
use serde_json::{Value, json};

fn shared() -> PathBuf {
    std::env::var_os("QDRIFT_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"))
}

fn stories_dir() -> Option<PathBuf> {
    let dir = shared().join("models/stories260K");
    if dir.join("stories260K.bin").is_file() {
        Some(dir)
    } else {
        println!("skipped: {} is absent", dir.display());
        None
    }
}

fn smollm2() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.is_file() {
        Some(p)
    } else {
        println!("skipped: {} is absent (cargo xtask fetch-models)", p.display());
        None
    }
}

/// Texts every tokenizer pair must agree on: prose, spaces, digits, punctuation, accents, CJK,
/// emoji (byte fallback), newlines and tabs.
const TEXTS: &[&str] = &[
    "Once upon a time, there was a little girl named Lily.",
    "One day",
    "",
    " ",
    "a",
    "  two  spaces  ",
    "Tom said: \"Don't go!\"\nThen he ran.\tHe's fast; they'd say so.",
    "naïve café 東京 🙂 déjà vu",
    "1234567890 = 3.14, 2024-12-03",
    "The END.",
];

fn map(keys: &[(String, GgufValue)]) -> BTreeMap<String, GgufValue> {
    keys.iter().cloned().collect()
}

fn tokenizer_from(keys: &[(String, GgufValue)], n_vocab: usize) -> Box<dyn Tokenizer> {
    let meta = GgufTokenizerMetadata::from_metadata(&map(keys));
    gguf_tokenizer(Path::new("converted.gguf"), &meta, n_vocab).expect("the converted keys build a tokenizer")
}

fn assert_same_ids(got: &dyn Tokenizer, want: &dyn Tokenizer, texts: &[&str]) {
    assert_eq!(got.vocab_size(), want.vocab_size());
    assert_eq!((got.bos_id(), got.eos_id()), (want.bos_id(), want.eos_id()));
    for t in texts {
        let ids = want.encode(t);
        assert_eq!(got.encode(t), ids, "encode {t:?}");
        assert_eq!(got.decode(&ids), want.decode(&ids), "decode {t:?}");
    }
}

fn array(keys: &BTreeMap<String, GgufValue>, k: &str) -> Vec<GgufValue> {
    keys.get(k).and_then(GgufValue::as_array).unwrap_or_else(|| panic!("{k} is not an array")).to_vec()
}

#[test]
fn stories260k_hf_folder_converts_to_a_llama_gguf_tokenizer_that_encodes_as_the_folder() {
    let Some(dir) = stories_dir() else { return };
    let loaded = open_model(&dir.join("stories260K.bin"), Some(&dir.join("tok512.bin"))).expect("stories260K");
    let tok512 = Llama2cTokenizer::read(&dir.join("tok512.bin")).expect("tok512");
    let hf = tempfile::tempdir().expect("tempdir");
    write_hf_folder(hf.path(), &loaded.model, &tok512, WriteDtype::F32).expect("HF folder");
    let folder = open_model(hf.path(), None).expect("HF folder opens");
    let keys = qdrift_load::write::gguf_tokenizer_keys(&folder).expect("converted");
    let m = map(&keys);

    // What LlamaHfVocab + SpecialVocab write: the pieces in id order, `<unk>` `<s>` `</s>`
    // control (they are tokenizer_config.json's special tokens), `<0xNN>` byte, the rest normal;
    // BOS from the post-processor and add_bos_token, no separator, no EOS.
    assert_eq!(m["tokenizer.ggml.model"], GgufValue::String("llama".into()));
    assert_eq!(m["tokenizer.ggml.pre"], GgufValue::String("default".into()));
    let pieces: Vec<GgufValue> =
        tok512.pieces().map(|(p, _)| GgufValue::String(String::from_utf8_lossy(p).replace(' ', "\u{2581}"))).collect();
    assert_eq!(array(&m, "tokenizer.ggml.tokens"), pieces);
    let types: Vec<i32> = array(&m, "tokenizer.ggml.token_type").iter().map(|v| v.as_f64().unwrap() as i32).collect();
    assert_eq!(types[..3], [3, 3, 3]);
    assert!(types[3..259].iter().all(|&t| t == 6));
    assert!(types[259..].iter().all(|&t| t == 1));
    for (k, v) in [
        ("tokenizer.ggml.bos_token_id", GgufValue::U32(1)),
        ("tokenizer.ggml.eos_token_id", GgufValue::U32(2)),
        ("tokenizer.ggml.unknown_token_id", GgufValue::U32(0)),
        ("tokenizer.ggml.add_bos_token", GgufValue::Bool(true)),
        ("tokenizer.ggml.add_sep_token", GgufValue::Bool(false)),
        ("tokenizer.ggml.add_eos_token", GgufValue::Bool(false)),
    ] {
        assert_eq!(m.get(k), Some(&v), "{k}");
    }
    assert_eq!(m.len(), 11, "{:?}", m.keys().collect::<Vec<_>>());
    special_vocab_py(hf.path(), &keys, false);
    // Scores: merged pieces in merge order (tok512 orders them by its own scores), others below.
    let scores: Vec<f32> = array(&m, "tokenizer.ggml.scores").iter().map(|v| v.as_f64().unwrap() as f32).collect();
    assert!(scores[..259].iter().all(|&s| s == qdrift_load::write::UNMERGED_SCORE));
    let best =
        (259..512).max_by(|&a, &b| tok512.pieces().nth(a).unwrap().1.total_cmp(&tok512.pieces().nth(b).unwrap().1));
    assert_eq!(scores[best.unwrap()], 0.0, "the best-scoring piece of tok512 is the first merge");

    let converted = tokenizer_from(&keys, 512);
    let mut texts: Vec<&str> = TEXTS.to_vec();
    let golden: Value =
        serde_json::from_slice(&std::fs::read(dir.join("golden_greedy_fp32.json")).expect("golden")).expect("json");
    let prompts: Vec<String> =
        golden["cases"].as_array().expect("cases").iter().map(|c| c["prompt"].as_str().unwrap().to_string()).collect();
    texts.extend(prompts.iter().map(String::as_str));
    assert_same_ids(converted.as_ref(), folder.tokenizer.as_ref(), &texts);
    assert_same_ids(converted.as_ref(), &tok512, &texts);

    // Through a GGUF file: the keys as written and read, and the tokenizer open_model builds.
    let gguf = hf.path().join("stories260K.gguf");
    write_gguf_with(&gguf, &folder.model, &keys, WriteDtype::F32, &|_| None).expect("GGUF");
    let back: BTreeMap<String, GgufValue> =
        read_gguf_metadata(&gguf).expect("read").into_iter().filter(|(k, _)| k.starts_with("tokenizer.")).collect();
    assert_eq!(back, m);
    let opened = open_model(&gguf, None).expect("GGUF opens");
    assert_same_ids(opened.tokenizer.as_ref(), folder.tokenizer.as_ref(), &texts);
}

/// A Hugging Face folder for SmolLM2 rebuilt from its GGUF (`tokenizer.json`,
/// `tokenizer_config.json`): vocabulary and merges from `tokenizer.ggml.tokens`/`merges` (merges
/// as `[left, right]` pairs, `tokenizers` ≥ 0.20's form), the pre-tokenizer of Hugging Face's
/// SmolLM2 `tokenizer.json` (`Sequence[Digits(individual_digits), ByteLevel(add_prefix_space =
/// false, use_regex = true)]`), the control tokens (`<|endoftext|>`, `<|im_start|>`,
/// `<|im_end|>`, ...) as special added tokens, and `tokenizer_config.json` with the special tokens,
/// `add_bos_token` and the chat template of the GGUF (as SmolLM2's own names them).
fn smollm2_folder(dir: &Path, gguf: &BTreeMap<String, GgufValue>) {
    let tokens: Vec<String> =
        array(gguf, "tokenizer.ggml.tokens").iter().map(|v| v.as_str().unwrap().to_string()).collect();
    let types = array(gguf, "tokenizer.ggml.token_type");
    let vocab: serde_json::Map<String, Value> = tokens.iter().enumerate().map(|(i, t)| (t.clone(), json!(i))).collect();
    let merges: Vec<Value> = array(gguf, "tokenizer.ggml.merges")
        .iter()
        .map(|m| {
            let (a, b) = m.as_str().unwrap().split_once(' ').unwrap();
            json!([a, b])
        })
        .collect();
    let added: Vec<Value> = types
        .iter()
        .enumerate()
        .filter(|(_, t)| t.as_f64() == Some(3.0))
        .map(|(i, _)| {
            json!({"id": i, "content": tokens[i], "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": false, "special": true})
        })
        .collect();
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added, "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
        ]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": merges}
    });
    let id = |k: &str| tokens[gguf[k].as_u64().unwrap() as usize].clone();
    let config = json!({
        "add_prefix_space": false,
        "bos_token": id("tokenizer.ggml.bos_token_id"),
        "eos_token": id("tokenizer.ggml.eos_token_id"),
        "unk_token": id("tokenizer.ggml.unknown_token_id"),
        "pad_token": id("tokenizer.ggml.padding_token_id"),
        "add_bos_token": gguf["tokenizer.ggml.add_bos_token"].as_bool().unwrap(),
        "chat_template": gguf["tokenizer.chat_template"].as_str().unwrap(),
        "tokenizer_class": "GPT2Tokenizer",
        "model_max_length": 8192,
    });
    std::fs::write(dir.join("tokenizer.json"), serde_json::to_vec(&tokenizer).unwrap()).unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), serde_json::to_vec_pretty(&config).unwrap()).unwrap();
}

#[test]
fn smollm2_tokenizer_json_converts_back_to_its_gguf_keys_and_encodes_as_tokenizers() {
    let Some(path) = smollm2() else { return };
    let gguf: BTreeMap<String, GgufValue> =
        read_gguf_metadata(&path).expect("metadata").into_iter().filter(|(k, _)| k.starts_with("tokenizer.")).collect();
    let dir = tempfile::tempdir().expect("tempdir");
    smollm2_folder(dir.path(), &gguf);
    let tokenizer_json = dir.path().join("tokenizer.json");
    let keys = hf_tokenizer_keys(dir.path(), &tokenizer_json, 49152).expect("converted");
    let mut want = gguf.clone();
    // Written by the converter version that made this file for SentencePiece-less vocabularies;
    // convert_hf_to_gguf.py's `_set_vocab_gpt2` does not write it (llama.cpp's default for BPE is
    // the same, no prefix space).
    want.remove("tokenizer.ggml.add_space_prefix");
    let got = map(&keys);
    for k in want.keys().chain(got.keys()) {
        if want.get(k) != got.get(k) {
            let short = |v: Option<&GgufValue>| format!("{v:?}").chars().take(200).collect::<String>();
            panic!("{k}: GGUF {} but converted {}", short(want.get(k)), short(got.get(k)));
        }
    }
    assert_eq!(got, want);
    special_vocab_py(dir.path(), &keys, true);

    let converted = tokenizer_from(&keys, 49152);
    let inner = tokenizers::Tokenizer::from_file(&tokenizer_json).expect("tokenizers reads the rebuilt file");
    let hf = HfTokenizer::new(&tokenizer_json, inner, Some(1), Some(2), false).expect("HF tokenizer");
    let mut texts = TEXTS.to_vec();
    texts.extend([
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi 2024!<|im_end|>\n<|im_start|>assistant\n",
        "<|endoftext|>fn main() {\n    println!(\"{}\", 42);\n}",
        "Привет, мир! ¿Qué tal? 1 + 1 = 2",
    ]);
    assert_same_ids(converted.as_ref(), &hf, &texts);
    // An independent anchor: these ids are those of the GGUF's own tokenizer (gguf/tokenizer.rs),
    // which match Python `tokenizers`.
    assert_eq!(converted.encode("Hello world! 123"), [19556, 905, 17, 216, 33, 34, 35]);
    assert_eq!(
        converted.encode("<|im_start|>user\nHi 2024!<|im_end|>"),
        [1, 4093, 198, 26843, 216, 34, 32, 34, 36, 17, 2]
    );
}

/// Writes `tokenizer` (and `tokenizer_config.json` when given) into a fresh folder.
fn folder(tokenizer: &Value, config: Option<&Value>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("tokenizer.json"), serde_json::to_vec(tokenizer).unwrap()).unwrap();
    if let Some(c) = config {
        std::fs::write(dir.path().join("tokenizer_config.json"), serde_json::to_vec(c).unwrap()).unwrap();
    }
    dir
}

fn convert(dir: &Path, n_vocab: usize) -> Result<Vec<(String, GgufValue)>, String> {
    hf_tokenizer_keys(dir, &dir.join("tokenizer.json"), n_vocab).map_err(|e| e.to_string())
}

/// A tiny byte-level BPE in Llama 3's shape: its regex Split, `<|begin_of_text|>` prepended by a
/// TemplateProcessing post-processor, `<|eot_id|>` as EOS, one non-special added token.
fn tiny_llama3() -> (Value, Value) {
    let regex = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    let vocab = json!({"a": 0, "b": 1, "Ġ": 2, "ab": 3, "Ġab": 4});
    let tokenizer = json!({
        "added_tokens": [
            {"id": 6, "content": "<|begin_of_text|>", "special": true, "normalized": false},
            {"id": 7, "content": "<|eot_id|>", "special": true, "normalized": false},
            {"id": 8, "content": "[TOOL]", "special": false, "normalized": false},
            {"id": 9, "content": "<|reserved|>", "special": false, "normalized": false}
        ],
        "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}
        ]},
        "post_processor": {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {}}
        ]},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "byte_fallback": false, "ignore_merges": true, "vocab": vocab,
                  "merges": ["a b", "Ġ ab"]}
    });
    let config = json!({
        "bos_token": "<|begin_of_text|>",
        "eos_token": {"content": "<|eot_id|>", "special": true},
        "chat_template": [{"name": "default", "template": "{{ messages }}"}, {"name": "tool_use", "template": "T"}],
    });
    (tokenizer, config)
}

#[test]
fn byte_level_bpe_pads_holes_types_added_tokens_and_reads_special_tokens_as_special_vocab() {
    let (tokenizer, config) = tiny_llama3();
    let dir = folder(&tokenizer, Some(&config));
    std::fs::write(
        dir.path().join("config.json"),
        br#"{"bos_token_id": 6, "eos_token_id": [7, 8], "pad_token_id": 9}"#,
    )
    .unwrap();
    let keys = convert(dir.path(), 11).expect("converted");
    let names: Vec<&str> = keys.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names,
        [
            "tokenizer.ggml.model",
            "tokenizer.ggml.pre",
            "tokenizer.ggml.tokens",
            "tokenizer.ggml.token_type",
            "tokenizer.ggml.merges",
            "tokenizer.ggml.bos_token_id",
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.padding_token_id",
            "tokenizer.ggml.add_bos_token",
            "tokenizer.ggml.add_sep_token",
            "tokenizer.chat_template.tool_use",
            "tokenizer.chat_templates",
            "tokenizer.chat_template",
        ]
    );
    let m = map(&keys);
    assert_eq!(m["tokenizer.ggml.pre"], GgufValue::String("llama-bpe".into()));
    let s = |v: &[&str]| GgufValue::Array(v.iter().map(|x| GgufValue::String(x.to_string())).collect());
    // Ids 5 and 10 are holes; "[TOOL]" is user-defined, "<|reserved|>" looks special.
    assert_eq!(
        m["tokenizer.ggml.tokens"],
        s(&[
            "a",
            "b",
            "Ġ",
            "ab",
            "Ġab",
            "[PAD5]",
            "<|begin_of_text|>",
            "<|eot_id|>",
            "[TOOL]",
            "<|reserved|>",
            "[PAD10]"
        ])
    );
    let types = GgufValue::Array([1, 1, 1, 1, 1, 5, 3, 3, 4, 3, 5].map(GgufValue::I32).to_vec());
    assert_eq!(m["tokenizer.ggml.token_type"], types);
    assert_eq!(m["tokenizer.ggml.merges"], s(&["a b", "Ġ ab"]));
    // EOS from tokenizer_config.json (a {content} entry) wins over config.json's list; pad from
    // config.json; the template's leading special token is BOS, so BOS is added.
    assert_eq!(m["tokenizer.ggml.bos_token_id"], GgufValue::U32(6));
    assert_eq!(m["tokenizer.ggml.eos_token_id"], GgufValue::U32(7));
    assert_eq!(m["tokenizer.ggml.padding_token_id"], GgufValue::U32(9));
    assert_eq!(m["tokenizer.ggml.add_bos_token"], GgufValue::Bool(true));
    // SpecialVocab's reading of the pair template `BOS A BOS B`: no separator.
    assert_eq!(m["tokenizer.ggml.add_sep_token"], GgufValue::Bool(false));
    assert_eq!(m["tokenizer.chat_template"], GgufValue::String("{{ messages }}".into()));
    assert_eq!(m["tokenizer.chat_templates"], s(&["tool_use"]));
    // The GGUF tokenizer it makes runs Llama 3's pre-tokenizer (ignore_merges) with BOS.
    let tok = tokenizer_from(&keys, 11);
    assert_eq!(tok.encode("ab ab<|eot_id|>"), [6, 3, 4, 7]);
    assert_eq!(tok.decode(&[6, 3, 4, 7]), "ab ab<|eot_id|>");
    special_vocab_py(dir.path(), &keys, true);
}

#[test]
fn a_template_ending_in_another_token_makes_eos_that_token_and_the_old_one_eot() {
    let (mut tokenizer, config) = tiny_llama3();
    tokenizer["post_processor"] = json!({"type": "TemplateProcessing",
        "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}],
        "pair": [], "special_tokens": {}});
    let dir = folder(&tokenizer, Some(&config));
    let m = map(&convert(dir.path(), 11).expect("converted"));
    assert_eq!(m["tokenizer.ggml.eos_token_id"], GgufValue::U32(6));
    assert_eq!(m["tokenizer.ggml.eot_token_id"], GgufValue::U32(7));
    assert_eq!(m["tokenizer.ggml.add_eos_token"], GgufValue::Bool(true));
    assert!(!m.contains_key("tokenizer.ggml.add_bos_token"));
    special_vocab_py(dir.path(), &convert(dir.path(), 11).unwrap(), true);
}

#[test]
fn unsupported_tokenizers_are_refused_in_one_line_naming_the_field() {
    let (tokenizer, config) = tiny_llama3();
    let refused = |t: &Value, n: usize| {
        let dir = folder(t, Some(&config));
        let e = convert(dir.path(), n).expect_err("refused");
        assert_eq!(e.lines().count(), 1, "{e}");
        let prefix = format!("{}: ", dir.path().join("tokenizer.json").display());
        e.strip_prefix(&prefix).unwrap_or_else(|| panic!("{e} does not name the file")).to_string()
    };
    let unigram = json!({"model": {"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0.0], ["a", -1.0]]}});
    assert_eq!(
        refused(&unigram, 2),
        "model.type = Unigram is not supported; supported: BPE (byte-level as GPT-2, SmolLM2, Llama 3, Qwen2; or \
         SentencePiece-style with byte_fallback as Llama 2)"
    );
    let wordpiece = json!({"model": {"type": "WordPiece", "unk_token": "[UNK]", "vocab": {"[UNK]": 0}}});
    assert!(refused(&wordpiece, 1).starts_with("model.type = WordPiece is not supported"));
    let mut whitespace = tokenizer.clone();
    whitespace["pre_tokenizer"] = json!({"type": "Whitespace"});
    assert_eq!(
        refused(&whitespace, 11),
        "pre_tokenizer = Whitespace is not supported; supported: ByteLevel (gpt-2); Sequence[Digits(individual_digits), \
         ByteLevel] (smollm); Sequence[Split(Llama 3 regex), ByteLevel(use_regex=false)] (llama-bpe); \
         Sequence[Split(Qwen2 regex), ByteLevel(use_regex=false)] (qwen2)"
    );
    let mut other_regex = tokenizer.clone();
    other_regex["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = json!("\\p{N}+|\\s+");
    assert!(refused(&other_regex, 11).starts_with("pre_tokenizer = Sequence[Split, ByteLevel] is not supported"));
    let mut decoder = tokenizer.clone();
    decoder["decoder"] = json!({"type": "WordPiece"});
    assert!(refused(&decoder, 11).starts_with("decoder = WordPiece is not supported"));
    let mut nfkc = tokenizer.clone();
    nfkc["normalizer"] = json!({"type": "NFKC"});
    assert!(refused(&nfkc, 11).starts_with("normalizer = NFKC is not supported"));
    // Malformed files: an id past the model's vocabulary, two tokens on one id, bad merges.
    assert_eq!(refused(&tokenizer, 8), "added token \"[TOOL]\" has id 8, outside the model's 8 tokens");
    let mut twice = tokenizer.clone();
    twice["added_tokens"][2]["id"] = json!(0);
    assert_eq!(refused(&twice, 11), "id 0 is given to two tokens, \"a\" and \"[TOOL]\" (added token)");
    let mut merges = tokenizer.clone();
    merges["model"]["merges"] = json!([["a", "b", "c"]]);
    assert_eq!(
        refused(&merges, 11),
        "model.merges[0] = [\"a\",\"b\",\"c\"] is neither \"left right\" nor [left, right]"
    );
    assert!(refused(&json!([1, 2]), 11).starts_with("model is missing"));
    // Not JSON, no tokenizer.json at all.
    let dir = folder(&json!({}), None);
    std::fs::write(dir.path().join("tokenizer.json"), b"{not json").unwrap();
    assert!(convert(dir.path(), 1).unwrap_err().contains("tokenizer.json: not valid JSON"));
    std::fs::remove_file(dir.path().join("tokenizer.json")).unwrap();
    assert!(
        convert(dir.path(), 1)
            .unwrap_err()
            .ends_with("tokenizer.json: not found; a Hugging Face folder is written as GGUF from its tokenizer.json")
    );
}

/// A SentencePiece-style BPE in Llama 2's shape over `vocab` with `merges`.
fn tiny_spm(vocab: &[&str], merges: &[&str]) -> Value {
    let vocab: serde_json::Map<String, Value> =
        vocab.iter().enumerate().map(|(i, t)| (t.to_string(), json!(i))).collect();
    json!({
        "added_tokens": [{"id": 0, "content": "<unk>", "special": true}, {"id": 1, "content": "<s>", "special": true}],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        "pre_tokenizer": null,
        "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "byte_fallback": true, "unk_token": "<unk>", "vocab": vocab, "merges": merges}
    })
}

#[test]
fn sentencepiece_style_merges_that_scores_cannot_express_are_refused() {
    let config = json!({"bos_token": "<s>", "unk_token": "<unk>", "add_bos_token": true});
    let vocab = ["<unk>", "<s>", "▁", "a", "b", "ab", "▁a", "▁ab"];
    let ok = folder(&tiny_spm(&vocab, &["a b", "▁ a", "▁a b", "▁ ab"]), Some(&config));
    let m = map(&convert(ok.path(), 8).expect("converted"));
    let scores = GgufValue::Array([-1e9, -1e9, -1e9, -1e9, -1e9, 0.0, -1.0, -2.0].map(GgufValue::F32).to_vec());
    assert_eq!(m["tokenizer.ggml.scores"], scores);
    assert_eq!(m["tokenizer.ggml.token_type"], GgufValue::Array([3, 3, 1, 1, 1, 1, 1, 1].map(GgufValue::I32).to_vec()));
    special_vocab_py(ok.path(), &convert(ok.path(), 8).unwrap(), false);
    let tok = tokenizer_from(&convert(ok.path(), 8).unwrap(), 8);
    assert_eq!(tok.encode("ab a"), [1, 7, 6]);
    // "▁ab" from two merges that other merges separate: no one score per piece orders them.
    let split = folder(&tiny_spm(&vocab, &["a b", "▁a b", "▁ a", "▁ ab"]), Some(&config));
    let e = convert(split.path(), 8).unwrap_err();
    assert!(e.contains("model.merges: the merges producing \"▁ab\" are not consecutive (ranks 1..=1 and 3)"), "{e}");
    // "▁ab" = "▁a" + "b" without that merge: SentencePiece would reach it, this BPE does not.
    let missing = folder(&tiny_spm(&vocab, &["a b", "▁ a", "▁ ab"]), Some(&config));
    let e = convert(missing.path(), 8).unwrap_err();
    assert!(e.contains("model.merges has no merge \"▁a b\""), "{e}");
    // A hole in the ids: LlamaHfVocab needs every id.
    let e = convert(ok.path(), 9).unwrap_err();
    assert!(e.contains("no token has id 8 of the model's 9"), "{e}");
}

/// With `QDRIFT_GGUF_PY` set: gguf-py's `SpecialVocab` on `dir` (merges when `merges`) gives the
/// special-token keys, `add_*_token` flags, merges and chat template qdrift converted.
fn special_vocab_py(dir: &Path, keys: &[(String, GgufValue)], merges: bool) {
    let Some(python) = std::env::var_os("QDRIFT_GGUF_PY") else {
        println!("skipped the gguf-py comparison: set QDRIFT_GGUF_PY to a Python with the gguf package");
        return;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hf_to_gguf_py/special_vocab.py");
    let n_vocab = keys
        .iter()
        .find(|(k, _)| k == "tokenizer.ggml.tokens")
        .and_then(|(_, v)| v.as_array())
        .map_or(0, <[GgufValue]>::len);
    let mode = if merges { "merges".to_string() } else { n_vocab.to_string() };
    let out = std::process::Command::new(python).arg(&script).arg(dir).arg(mode).output().expect("python runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let want: BTreeMap<String, Value> = serde_json::from_slice(&out.stdout).expect("JSON from special_vocab.py");
    let got: BTreeMap<String, Value> = keys
        .iter()
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                "tokenizer.ggml.model"
                    | "tokenizer.ggml.pre"
                    | "tokenizer.ggml.tokens"
                    | "tokenizer.ggml.token_type"
                    | "tokenizer.ggml.scores"
            )
        })
        .map(|(k, v)| (k.clone(), gguf_json(v)))
        .collect();
    assert_eq!(got, want, "qdrift vs gguf-py SpecialVocab on {}", dir.display());
}

fn gguf_json(v: &GgufValue) -> Value {
    match v {
        GgufValue::String(s) => json!(s),
        GgufValue::Bool(b) => json!(b),
        GgufValue::Array(a) => Value::Array(a.iter().map(gguf_json).collect()),
        other => json!(other.as_u64()),
    }
}

#[test]
fn malformed_fields_are_errors_never_panics() {
    // Every field the conversion reads, in turn replaced by values of the wrong type or shape:
    // the conversion returns (a one-line error or keys), it never panics.
    let (llama3, config) = tiny_llama3();
    let spm = tiny_spm(&["<unk>", "<s>", "▁", "a", "b", "ab", "▁a", "▁ab"], &["a b", "▁ a", "▁a b", "▁ ab"]);
    let pointers = [
        "/model",
        "/model/type",
        "/model/vocab",
        "/model/vocab/a",
        "/model/merges",
        "/model/merges/0",
        "/model/byte_fallback",
        "/added_tokens",
        "/added_tokens/0",
        "/added_tokens/0/id",
        "/added_tokens/0/content",
        "/added_tokens/0/special",
        "/normalizer",
        "/normalizer/normalizers",
        "/pre_tokenizer",
        "/pre_tokenizer/pretokenizers",
        "/pre_tokenizer/pretokenizers/0/pattern",
        "/post_processor",
        "/post_processor/processors/1/single",
        "/post_processor/processors/1/single/0",
        "/post_processor/processors/1/pair",
        "/decoder",
    ];
    let junk = [
        json!(null),
        json!(-1),
        json!(1e300),
        json!("x"),
        json!([]),
        json!([[]]),
        json!({}),
        json!({"id": 1}),
        json!({"type": "a\nb"}),
        json!("a\nb"),
    ];
    let configs = [
        config.clone(),
        json!({"bos_token": 5, "eos_token": [1], "add_bos_token": "yes", "chat_template": {"x": 1}}),
        json!([]),
    ];
    for base in [&llama3, &spm] {
        for p in pointers {
            for j in &junk {
                let mut t = base.clone();
                if let Some(slot) = t.pointer_mut(p) {
                    *slot = j.clone();
                }
                for c in &configs {
                    let dir = folder(&t, Some(c));
                    std::fs::write(dir.path().join("config.json"), br#"{"bos_token_id": -3, "text_config": 1}"#)
                        .unwrap();
                    for n in [0, 8, 11] {
                        if let Err(e) = convert(dir.path(), n) {
                            assert_eq!(e.lines().count(), 1, "{p} = {j}: {e}");
                        }
                    }
                }
            }
        }
    }
}
