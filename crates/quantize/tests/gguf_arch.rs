//! `quantize --format gguf` for the newer architectures: each `../shared/models/tiny-arch/`
//! checkpoint quantized (q8_0, q4_0, mxfp4; experts included, row by row), written by
//! `write_gguf` as llama.cpp's architecture and read back by qdrift's GGUF reader: the variant's
//! dequantized weights bit for bit, up to what GGUF states differently (llama.cpp's architecture
//! name, Gemma's norms stored as `1 + w`, `sqrtf(n_embd)` as Gemma's embedding scale, gpt-oss's
//! YaRN correction dims truncated). The tiny Gemma 2's untied head is refused by name.

use std::path::{Path, PathBuf};

use qdrift_load::write::gguf_tokenizer_keys;
use qdrift_load::{HostModel, HostTensor, NormStyle, RopeScaling, open_model, read_gguf};
use qdrift_quantize::{GgmlType, QuantizeOptions, Scheme, quantize_model, round_to_fp16_reference, write_gguf};

fn tiny_arch(name: &str) -> Option<PathBuf> {
    let shared = std::env::var_os("QDRIFT_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
    let dir = shared.join("models/tiny-arch").join(name);
    if dir.join("config.json").is_file() {
        Some(dir)
    } else {
        println!("skipped: {} is absent", dir.display());
        None
    }
}

/// `m` as a GGUF reader states it.
fn as_gguf_states_it(m: &HostModel, gguf_arch: &str) -> HostModel {
    let mut e = m.clone();
    e.arch.architecture = gguf_arch.to_string();
    if e.arch.block.norm == NormStyle::OnePlusWeight {
        e.arch.block.norm = NormStyle::Weight;
        let plus = |t: &mut HostTensor| t.data.iter_mut().for_each(|v| *v += 1.0);
        plus(&mut e.final_norm);
        for l in &mut e.layers {
            plus(&mut l.attn_norm);
            plus(&mut l.ffn_norm);
            for t in [&mut l.post_attn_norm, &mut l.post_ffn_norm, &mut l.q_norm, &mut l.k_norm].into_iter().flatten() {
                plus(t);
            }
        }
    }
    if e.arch.embedding_scale.is_some() {
        e.arch.embedding_scale = Some((e.arch.dim as f32).sqrt());
    }
    if let Some(RopeScaling::Yarn { truncate, .. }) = &mut e.arch.rope_scaling {
        *truncate = true;
    }
    e
}

#[test]
fn tiny_arch_variants_write_as_gguf_and_read_back_as_the_dequantized_variant() {
    let dir = tempfile::tempdir().expect("tempdir");
    let schemes = [Scheme::Ggml(GgmlType::Q8_0), Scheme::Ggml(GgmlType::Q4_0), Scheme::Ggml(GgmlType::Mxfp4)];
    for (folder, arch) in [
        ("qwen3", "qwen3"),
        ("qwen3_moe", "qwen3moe"),
        ("gemma2", "gemma2"),
        ("gemma3", "gemma3"),
        ("phi3", "phi3"),
        ("gpt_oss", "gpt-oss"),
        ("mixtral", "llama"),
    ] {
        let Some(src) = tiny_arch(folder) else { continue };
        let loaded = open_model(&src, None).unwrap_or_else(|e| panic!("{folder}: {e}"));
        let keys = gguf_tokenizer_keys(&loaded).expect("tokenizer keys");
        let mut reference = loaded.model.clone();
        round_to_fp16_reference(&mut reference);
        for scheme in &schemes {
            let opts = QuantizeOptions { quantize_embeddings: true, quantize_head: true, ..Default::default() };
            let q = quantize_model(&reference, scheme, &opts).unwrap_or_else(|e| panic!("{folder} {scheme}: {e}"));
            let path = dir.path().join(format!("{folder}-{scheme}.gguf"));
            let written = write_gguf(&path, &q, &keys);
            if folder == "gemma2" {
                let e = written.expect_err("untied gemma2 head").to_string();
                assert!(e.ends_with("an untied output head (llama.cpp's gemma2 always uses the embedding)"), "{e}");
                continue;
            }
            written.unwrap_or_else(|e| panic!("{folder} {scheme}: {e}"));
            let g = read_gguf(&path).unwrap_or_else(|e| panic!("{folder} {scheme}: {e}"));
            let want = as_gguf_states_it(&q.dequantized, arch);
            assert_eq!(g.model.arch, want.arch, "{folder} {scheme}");
            assert!(g.model == want, "{folder} {scheme}: the weights read back differ from the variant's");
            let types: std::collections::BTreeSet<&str> = g.tensor_types.iter().map(|(_, t)| *t).collect();
            println!("{folder} {scheme}: read back equal; stored types {types:?}");
        }
    }
}
