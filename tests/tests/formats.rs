//! Every loader on one real model: stories260K written as Hugging Face folders (F32, F16, BF16)
//! and as GGUF (F32, F16) generates the same greedy tokens as the llama2.c checkpoint with the
//! same weight values; and SmolLM2-135M (GGUF, its own tokenizer) knows the capital of France.

use burn::tensor::DType;
use qdrift_generate::BackendChoice;
use qdrift_load::write::{WriteDtype, write_gguf, write_hf_folder};
use qdrift_load::{Llama2cTokenizer, LoadedModel, open_model};
use qdrift_tests::{device, golden_cases, load_stories, run_greedy, stories_dir};

const TOKENS: usize = 48;

fn greedy(loaded: &LoadedModel, prompts: &[Vec<u32>]) -> Vec<Vec<u32>> {
    run_greedy(loaded, &device(BackendChoice::Cpu), DType::F32, prompts, TOKENS, prompts.len()).0
}

#[test]
fn every_format_generates_what_the_llama2c_checkpoint_generates() {
    let reference = load_stories();
    let tok = Llama2cTokenizer::read(&stories_dir().join("tok512.bin")).expect("tok512");
    let cases = golden_cases();
    let prompts: Vec<Vec<u32>> = cases.iter().map(|c| reference.tokenizer.encode(&c.prompt)).collect();
    let f32_tokens = greedy(&reference, &prompts);
    for (c, t) in cases.iter().zip(&f32_tokens) {
        assert_eq!(t[..], c.greedy_tokens[..TOKENS], "llama2.c path vs golden");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mut by_dtype: Vec<(WriteDtype, Vec<Vec<u32>>)> = Vec::new();
    for dtype in [WriteDtype::F32, WriteDtype::F16, WriteDtype::BF16] {
        // The llama2.c weights rounded as the file stores them: the tokens must be identical.
        let mut rounded = reference.model.clone();
        rounded.for_each_tensor_mut(|t| t.data.iter_mut().for_each(|x| *x = dtype.round(*x)));
        let rounded = LoadedModel { model: rounded, ..load_stories() };
        let expected = greedy(&rounded, &prompts);

        let hf = dir.path().join(format!("hf-{dtype:?}"));
        write_hf_folder(&hf, &reference.model, &tok, dtype).expect("writes HF folder");
        let mut files = vec![hf];
        if dtype != WriteDtype::BF16 {
            let gguf = dir.path().join(format!("stories260K-{dtype:?}.gguf"));
            write_gguf(&gguf, &reference.model, &tok, dtype).expect("writes GGUF");
            files.push(gguf);
        }
        for file in files {
            let loaded = open_model(&file, None).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let encoded: Vec<Vec<u32>> = cases.iter().map(|c| loaded.tokenizer.encode(&c.prompt)).collect();
            assert_eq!(encoded, prompts, "{}: tokenizer", file.display());
            let got = greedy(&loaded, &prompts);
            assert_eq!(
                got,
                expected,
                "{}: tokens differ from the llama2.c weights rounded to {dtype:?}",
                file.display()
            );
            let agree: usize =
                got.iter().zip(&f32_tokens).map(|(a, b)| a.iter().zip(b).take_while(|(x, y)| x == y).count()).sum();
            println!(
                "{dtype:?} {}: identical to the rounded llama2.c weights; {agree}/{} tokens before the first difference from f32",
                loaded.format,
                TOKENS * prompts.len()
            );
        }
        by_dtype.push((dtype, expected));
    }
    assert_eq!(by_dtype[0].1, f32_tokens, "an F32 file is the checkpoint itself");
}

#[test]
fn smollm2_says_paris() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.is_file() {
        println!("skipped: {} absent (cargo xtask fetch-models)", path.display());
        return;
    }
    let loaded = open_model(&path, None).expect("SmolLM2 loads");
    let prompt = loaded.tokenizer.encode("The capital of France is");
    let out = run_greedy(&loaded, &device(BackendChoice::Cpu), DType::F32, &[prompt], 4, 1).0;
    let text = loaded.tokenizer.decode(&out[0]);
    println!("SmolLM2 f32: \"The capital of France is\" → {text:?}");
    assert!(text.starts_with(" Paris"), "continuation {text:?}");
}
