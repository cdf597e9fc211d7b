//! `write_gguf`: a quantized stories260K written as GGUF and read back by qdrift's GGUF reader
//! gives the variant's dequantized weights bit for bit, for every scheme GGUF can store, with the
//! stored ggml types (fallbacks included), Qwen2's rotate-half q/k rows and the source's
//! tokenizer keys carried over.

use std::path::{Path, PathBuf};

use qdrift_load::write::{WriteDtype, gguf_tokenizer_keys, llama2c_tokenizer_keys};
use qdrift_load::{HostModel, HostTensor, Llama2cTokenizer, open_model, read_gguf, read_gguf_metadata};
use qdrift_quantize::{
    GgmlType, GgufWriteError, QuantizeOptions, QuantizedModel, Scheme, gguf_schemes, quantize_model,
    round_to_fp16_reference, write_gguf,
};

fn shared() -> PathBuf {
    std::env::var_os("QDRIFT_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"))
}

fn stories() -> (HostModel, Llama2cTokenizer) {
    let dir = shared().join("models/stories260K");
    let loaded = open_model(&dir.join("stories260K.bin"), None).expect("stories260K loads");
    let mut model = loaded.model;
    round_to_fp16_reference(&mut model);
    (model, Llama2cTokenizer::read(&dir.join("tok512.bin")).expect("tokenizer"))
}

/// Every tensor of `a` and `b` equal bit for bit, named on failure.
fn assert_bit_equal(a: &HostModel, b: &HostModel, what: &str) {
    let bits = |t: &HostTensor| t.data.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let mut ta = Vec::new();
    let mut tb = Vec::new();
    a.clone().for_each_tensor_mut(|t| ta.push((t.shape.clone(), bits(t))));
    b.clone().for_each_tensor_mut(|t| tb.push((t.shape.clone(), bits(t))));
    assert_eq!(ta.len(), tb.len(), "{what}: tensor count");
    for (i, (x, y)) in ta.iter().zip(&tb).enumerate() {
        assert!(x == y, "{what}: tensor {i} differs");
    }
    assert_eq!(a.arch, b.arch, "{what}");
}

fn write_and_read(q: &QuantizedModel, tok: &Llama2cTokenizer, dir: &Path) -> qdrift_load::GgufModel {
    let path = dir.join(format!("{}.gguf", q.scheme));
    let keys = llama2c_tokenizer_keys(&path, tok).expect("UTF-8 pieces");
    write_gguf(&path, q, &keys).expect("written");
    read_gguf(&path).expect("qdrift reads its own GGUF")
}

#[test]
fn every_gguf_scheme_reads_back_as_the_dequantized_variant() {
    let (reference, tok) = stories();
    let dir = tempfile::tempdir().expect("tempdir");
    assert_eq!(
        gguf_schemes().iter().map(Scheme::to_string).collect::<Vec<_>>(),
        ["fp16", "q8_0", "q4_0", "q4_1", "q5_0", "q4_k", "q6_k", "mxfp4"]
    );
    for scheme in gguf_schemes() {
        for quantize_embeddings in [false, true] {
            let opts = QuantizeOptions { quantize_embeddings, quantize_head: false, ..Default::default() };
            let q = quantize_model(&reference, &scheme, &opts).expect("quantizes");
            let back = write_and_read(&q, &tok, dir.path());
            assert_bit_equal(&back.model, &q.dequantized, &format!("{scheme} embeddings={quantize_embeddings}"));
            // Each tensor is stored as the type the quantizer recorded.
            let types: std::collections::HashMap<&str, &str> =
                back.tensor_types.iter().map(|(n, t)| (n.as_str(), *t)).collect();
            let down = q.tensor(qdrift_quantize::WeightSlot::Linear {
                layer: 0,
                short_name: qdrift_load::LinearName::dense("mlp.down_proj"),
            });
            let down = down.expect("quantized");
            assert_eq!(types["blk.0.ffn_down.weight"], down.matrix.stored_name().to_uppercase().as_str());
            assert_eq!(types["blk.0.attn_norm.weight"], "F32");
            let embd =
                if quantize_embeddings { q.tensors[0].matrix.stored_name().to_uppercase() } else { "F16".into() };
            assert_eq!(types["token_embd.weight"], embd.as_str(), "{scheme}");
        }
    }
    // stories260K's 64-wide rows are not whole 256-blocks: q4_k stores q5_0 there, and its
    // 172-wide down_proj rows fit nothing: F16.
    let q = quantize_model(&reference, &Scheme::Ggml(GgmlType::Q4K), &QuantizeOptions::default()).expect("q4_k");
    let back = write_and_read(&q, &tok, dir.path());
    let types: std::collections::HashMap<&str, &str> =
        back.tensor_types.iter().map(|(n, t)| (n.as_str(), *t)).collect();
    assert_eq!(types["blk.3.attn_q.weight"], "Q5_0");
    assert_eq!(types["blk.3.ffn_down.weight"], "F16");
}

#[test]
fn qwen2_q_k_blocks_are_written_rotate_half_and_an_untied_head_as_stored() {
    let (mut reference, tok) = stories();
    // Qwen2-style biases and an untied head (a perturbed embedding), all FP16-exact.
    let a = reference.arch.clone();
    for (i, l) in reference.layers.iter_mut().enumerate() {
        let b = |n: usize, k: usize| {
            HostTensor::new(vec![n], (0..n).map(|j| ((j * 7 + i + k) % 11) as f32 / 16.0).collect())
        };
        l.bq = b(a.n_heads * a.head_dim(), 0);
        l.bk = b(a.kv_dim(), 1);
        l.bv = b(a.kv_dim(), 2);
    }
    let mut head = reference.token_embedding.clone();
    head.data.iter_mut().enumerate().for_each(|(i, v)| *v = half::f16::from_f32(*v + (i % 5) as f32 / 64.0).to_f32());
    reference.output = Some(head);
    reference.arch.tied_embeddings = false;
    let dir = tempfile::tempdir().expect("tempdir");
    for scheme in [Scheme::Ggml(GgmlType::Q8_0), Scheme::Ggml(GgmlType::Q4K), Scheme::Fp16] {
        let opts = QuantizeOptions { quantize_embeddings: true, quantize_head: true, ..Default::default() };
        let q = quantize_model(&reference, &scheme, &opts).expect("quantizes");
        let back = write_and_read(&q, &tok, dir.path());
        assert_eq!(back.model.arch.architecture, "qwen2");
        let mut want = q.dequantized.clone();
        want.arch.architecture = "qwen2".into(); // the architecture GGUF names for q/k/v biases
        assert_bit_equal(&back.model, &want, &format!("qwen2 {scheme}"));
    }
}

#[test]
fn schemes_without_a_ggml_type_are_refused_before_writing() {
    let (reference, tok) = stories();
    let dir = tempfile::tempdir().expect("tempdir");
    for scheme in ["int4-g128", "nf4-g64", "fp8-e4m3", "int8", "bf16"] {
        let scheme: Scheme = scheme.parse().expect("listed");
        let q = quantize_model(&reference, &scheme, &QuantizeOptions::default()).expect("quantizes");
        let path = dir.path().join("x.gguf");
        let keys = llama2c_tokenizer_keys(&path, &tok).expect("keys");
        let e = write_gguf(&path, &q, &keys).unwrap_err();
        assert!(matches!(e, GgufWriteError::Scheme { .. }));
        assert_eq!(
            e.to_string(),
            format!(
                "--scheme {scheme} cannot be written as GGUF: GGUF stores ggml types; schemes it can hold: \
                 fp16, q8_0, q4_0, q4_1, q5_0, q4_k, q6_k, mxfp4"
            )
        );
        assert!(!path.exists());
    }
}

#[test]
fn a_gguf_source_keeps_its_tokenizer_keys_verbatim() {
    let (reference, tok) = stories();
    let dir = tempfile::tempdir().expect("tempdir");
    let source = dir.path().join("source.gguf");
    qdrift_load::write::write_gguf(&source, &reference, &tok, WriteDtype::F16).expect("source written");
    let loaded = open_model(&source, None).expect("opens");
    let keys = gguf_tokenizer_keys(&loaded).expect("GGUF keys");
    let source_meta = read_gguf_metadata(&source).expect("metadata");
    let want: Vec<_> = source_meta.into_iter().filter(|(k, _)| k.starts_with("tokenizer.")).collect();
    assert_eq!(keys, want);
    assert!(keys.iter().any(|(k, _)| k == "tokenizer.ggml.tokens"));
    let q = quantize_model(&loaded.model, &Scheme::Ggml(GgmlType::Q6K), &QuantizeOptions::default()).expect("q6_k");
    let out = dir.path().join("q6_k.gguf");
    write_gguf(&out, &q, &keys).expect("written");
    let out_meta = read_gguf_metadata(&out).expect("metadata");
    let got: Vec<_> = out_meta.into_iter().filter(|(k, _)| k.starts_with("tokenizer.")).collect();
    assert_eq!(got, want);
    assert_bit_equal(&read_gguf(&out).expect("reads").model, &q.dequantized, "q6_k from GGUF");
}
