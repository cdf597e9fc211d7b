//! stories260K written as a Hugging Face folder (F32/F16/BF16) and as GGUF (F32/F16) by
//! `qdrift_load::write`, read back by `open_model`: weights equal to the llama2.c weights rounded
//! to the written dtype (bit-exact for F32), same architecture, same token ids as tok512.

use std::path::PathBuf;

use qdrift_load::write::{WriteDtype, write_gguf, write_hf_folder};
use qdrift_load::{HostModel, HostTensor, Llama2cTokenizer, LoadedModel, RopeScaling, Tokenizer, open_model};

/// `../shared` beside the repository (override with `QDRIFT_SHARED`), as `qdrift-tests` finds it.
fn stories_dir() -> Option<PathBuf> {
    let shared = std::env::var_os("QDRIFT_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
    let dir = shared.join("models/stories260K");
    if dir.join("stories260K.bin").is_file() {
        Some(dir)
    } else {
        println!("skipped: {} is absent", dir.display());
        None
    }
}

fn stories() -> Option<(LoadedModel, Llama2cTokenizer, Vec<String>)> {
    let dir = stories_dir()?;
    let loaded = open_model(&dir.join("stories260K.bin"), Some(&dir.join("tok512.bin"))).expect("stories260K");
    let tok = Llama2cTokenizer::read(&dir.join("tok512.bin")).expect("tok512");
    let golden: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("golden_greedy_fp32.json")).expect("golden")).expect("json");
    let mut texts: Vec<String> = golden["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| c["prompt"].as_str().expect("prompt").to_string())
        .collect();
    texts.extend(
        [
            "",
            " ",
            "a",
            "Hello, world!",
            "  two  spaces  ",
            "Tom said: \"Don't go!\"\nThen he ran.",
            "naïve café 東京 🙂",
            "1234567890 = 3.14",
            "The END.",
        ]
        .map(str::to_string),
    );
    Some((loaded, tok, texts))
}

fn rounded(t: &HostTensor, dtype: WriteDtype) -> HostTensor {
    HostTensor { shape: t.shape.clone(), data: t.data.iter().map(|&v| dtype.round(v)).collect() }
}

/// Asserts `got` equals `reference` with every tensor rounded (norms by `norm_dtype`).
fn assert_weights(got: &HostModel, reference: &HostModel, dtype: WriteDtype, norm_dtype: WriteDtype) {
    assert_eq!(got.arch, reference.arch);
    let eq = |a: &HostTensor, b: &HostTensor, d: WriteDtype, what: &str| {
        let want = rounded(b, d);
        assert_eq!(a.shape, want.shape, "{what}");
        let same = a.data.iter().zip(&want.data).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "{what} differs from the reference rounded to {d:?}");
    };
    eq(&got.token_embedding, &reference.token_embedding, dtype, "token_embedding");
    for (i, (g, r)) in got.layers.iter().zip(&reference.layers).enumerate() {
        eq(&g.attn_norm, &r.attn_norm, norm_dtype, &format!("layer {i} attn_norm"));
        eq(&g.ffn_norm, &r.ffn_norm, norm_dtype, &format!("layer {i} ffn_norm"));
        for ((name, a), (_, b)) in g.linears().into_iter().zip(r.linears()) {
            eq(a, b, dtype, &format!("layer {i} {name}"));
        }
        assert!(g.bq.is_none() && g.bk.is_none() && g.bv.is_none());
    }
    eq(&got.final_norm, &reference.final_norm, norm_dtype, "final_norm");
    assert_eq!(got.output.is_some(), reference.output.is_some());
    assert_eq!(got.layers.len(), reference.layers.len());
}

fn assert_same_ids(got: &dyn Tokenizer, want: &dyn Tokenizer, texts: &[String]) {
    assert_eq!(got.vocab_size(), want.vocab_size());
    assert_eq!(got.bos_id(), want.bos_id());
    assert_eq!(got.eos_id(), want.eos_id());
    for t in texts {
        let ids = want.encode(t);
        assert_eq!(got.encode(t), ids, "encode {t:?}");
        assert_eq!(got.decode(&ids), want.decode(&ids), "decode {t:?}");
    }
}

#[test]
fn stories260k_hf_folder_round_trips_in_f32_f16_bf16() {
    let Some((loaded, tok, texts)) = stories() else {
        return;
    };
    for dtype in [WriteDtype::F32, WriteDtype::F16, WriteDtype::BF16] {
        let dir = tempfile::tempdir().expect("tempdir");
        write_hf_folder(dir.path(), &loaded.model, &tok, dtype).expect("written");
        let back = open_model(dir.path(), None).expect("read back");
        assert_eq!(back.format, qdrift_load::ModelFormat::HfSafetensors);
        let mut reference = loaded.model.clone();
        reference.arch.architecture = "LlamaForCausalLM".to_string();
        assert_weights(&back.model, &reference, dtype, dtype);
        assert_same_ids(back.tokenizer.as_ref(), &tok, &texts);
        let want = match dtype {
            WriteDtype::F32 => "F32",
            WriteDtype::F16 => "F16",
            WriteDtype::BF16 => "BF16",
        };
        assert!(back.source_dtypes.iter().all(|(_, d)| d == want), "{:?}", back.source_dtypes);
    }
}

#[test]
fn stories260k_gguf_round_trips_in_f32_f16() {
    let Some((loaded, tok, texts)) = stories() else {
        return;
    };
    for dtype in [WriteDtype::F32, WriteDtype::F16] {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("stories260K.gguf");
        write_gguf(&path, &loaded.model, &tok, dtype).expect("written");
        let back = open_model(&path, None).expect("read back");
        let mut reference = loaded.model.clone();
        reference.arch.architecture = "llama".to_string();
        // Norms are stored as F32 whatever the matrices' dtype, as llama.cpp's converter does.
        assert_weights(&back.model, &reference, dtype, WriteDtype::F32);
        assert_same_ids(back.tokenizer.as_ref(), &tok, &texts);
    }
}

#[test]
fn write_gguf_refuses_bf16() {
    let Some((loaded, tok, _)) = stories() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let e = write_gguf(&dir.path().join("m.gguf"), &loaded.model, &tok, WriteDtype::BF16).unwrap_err().to_string();
    assert!(e.contains("F32 or F16 only"), "{e}");
}

/// The synthetic `tiny` model (head_dim 8, theta 10000) with seeded q/k/v biases whose values
/// differ from row to row, so that a permutation error would show.
fn tiny_with_biases() -> (HostModel, Llama2cTokenizer) {
    let mut m = qdrift_load::synthetic_model("tiny", 5).expect("tiny").model;
    for (i, l) in m.layers.iter_mut().enumerate() {
        let b = |k: usize, n: usize| {
            let data = (0..n).map(|r| (100 * i + 10 * k + r) as f32 / 64.0 - 1.0).collect();
            Some(HostTensor::new(vec![n], data).expect("shape"))
        };
        (l.bq, l.bk, l.bv) = (b(1, 32), b(2, 16), b(3, 16));
    }
    (m, qdrift_load::byte_tokenizer(320).expect("tok"))
}

/// Llama 3.1-style scaling for head_dim 8 and theta 10000 (wavelengths 6.3, 63, 628, 6283):
/// pair 0 kept, pair 1 interpolated, pairs 2 and 3 divided by the factor.
fn tiny_llama3() -> RopeScaling {
    RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 8.0,
        original_max_position_embeddings: 256,
    }
}

#[test]
fn biases_round_trip_as_qwen2_through_hf_and_gguf() {
    let (m, tok) = tiny_with_biases();
    let dir = tempfile::tempdir().expect("tempdir");
    write_hf_folder(dir.path(), &m, &tok, WriteDtype::F32).expect("written");
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("config.json")).expect("config")).expect("json");
    assert_eq!(config["architectures"][0], "Qwen2ForCausalLM");
    assert_eq!(config["model_type"], "qwen2");
    let hf = open_model(dir.path(), None).expect("Qwen2 folder opens");
    assert_eq!(hf.model.arch.architecture, "Qwen2ForCausalLM");
    assert_eq!(hf.model.layers, m.layers, "biases and weights bit-exact, q/k order restored");

    let path = dir.path().join("tiny-qwen2.gguf");
    write_gguf(&path, &m, &tok, WriteDtype::F32).expect("written");
    let gguf = open_model(&path, None).expect("qwen2 GGUF opens");
    assert_eq!(gguf.model.arch.architecture, "qwen2");
    assert_eq!(gguf.model.layers, m.layers, "qwen2's rotate-half q/k rows un-permuted");
    assert!(gguf.source_dtypes.iter().any(|(n, d)| n == "blk.1.attn_k.bias" && d == "F32"), "{:?}", gguf.source_dtypes);

    // Some layers biased and others not cannot be written as either architecture.
    let mut partial = m.clone();
    partial.layers[1].bv = None;
    let e = write_hf_folder(&dir.path().join("partial"), &partial, &tok, WriteDtype::F32).unwrap_err().to_string();
    assert!(e.contains("some q/k/v biases are missing"), "{e}");
}

#[test]
fn llama3_rope_scaling_round_trips_through_hf_and_becomes_rope_freqs_in_gguf() {
    let (mut m, tok) = tiny_with_biases();
    for l in &mut m.layers {
        (l.bq, l.bk, l.bv) = (None, None, None);
    }
    m.arch.rope_scaling = Some(tiny_llama3());
    let dir = tempfile::tempdir().expect("tempdir");
    write_hf_folder(dir.path(), &m, &tok, WriteDtype::F32).expect("written");
    let hf = open_model(dir.path(), None).expect("Llama 3.1-style folder opens");
    assert_eq!(hf.model.arch.architecture, "LlamaForCausalLM");
    assert_eq!(hf.model.arch.rope_scaling, Some(tiny_llama3()));

    let path = dir.path().join("tiny-llama31.gguf");
    write_gguf(&path, &m, &tok, WriteDtype::F16).expect("written");
    let gguf = open_model(&path, None).expect("GGUF with rope_freqs.weight opens");
    let Some(RopeScaling::FreqFactors { factors }) = &gguf.model.arch.rope_scaling else {
        panic!("rope_freqs.weight not read: {:?}", gguf.model.arch.rope_scaling);
    };
    // convert_hf_to_gguf.py: 1 below the high band, factor above the low band, and
    // 1 / ((1 - smooth) / factor + smooth) for pair 1 (wavelength 20π between 32 and 256).
    let smooth = (256.0 / (20.0 * std::f64::consts::PI) - 1.0) / 7.0;
    let middle = 1.0 / ((1.0 - smooth) / 8.0 + smooth);
    assert_eq!(factors.len(), 4);
    assert_eq!((factors[0], factors[2], factors[3]), (1.0, 8.0, 8.0));
    assert!((f64::from(factors[1]) - middle).abs() < 1e-5 * middle, "{} vs {middle}", factors[1]);
    assert!(gguf.source_dtypes.iter().any(|(n, d)| n == "rope_freqs.weight" && d == "F32"));

    // Per-pair divisors from a GGUF file have no config.json form.
    let e = write_hf_folder(&dir.path().join("back"), &gguf.model, &tok, WriteDtype::F32).unwrap_err().to_string();
    assert!(e.contains("no config.json form"), "{e}");
}

#[test]
fn write_gguf_with_checks_stored_matrices_and_keys_and_leaves_nothing_on_failure() {
    use qdrift_load::GgufValue;
    use qdrift_load::write::{GgufMatrix, GgufStored, llama2c_tokenizer_keys, write_gguf_with};
    let Some((loaded, tok, _)) = stories() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("m.gguf");
    let keys = llama2c_tokenizer_keys(&path, &tok).expect("keys");
    let q0 = GgufMatrix::Linear { layer: 0, short_name: qdrift_load::LinearName::dense("self_attn.q_proj") };
    // wq is [64, 64]: Q8_0 rows are 2 blocks of 34 bytes.
    let cases: [(u32, usize, &str); 4] = [
        (8, 64 * 68 - 1, "4351 bytes stored for 64 rows of 68 bytes"),
        (12, 64 * 144, "64 columns are not whole Q4_K blocks of 256"),
        (16, 64 * 64, "ggml_type 16 is not F16 or a block type qdrift reads"),
        (1, 64 * 64, "4096 bytes stored for 64 rows of 128 bytes"),
    ];
    for (ggml_type, len, message) in cases {
        let store = |m: GgufMatrix| (m == q0).then(|| GgufStored { ggml_type, bytes: vec![0; len] });
        let e = write_gguf_with(&path, &loaded.model, &keys, WriteDtype::F16, &store).unwrap_err().to_string();
        assert!(e.contains("tensor blk.0.attn_q.weight") && e.contains(message), "{e}");
        assert!(std::fs::read_dir(dir.path()).expect("dir").next().is_none(), "a file was left behind");
    }
    let bad_key = vec![("general.name".to_string(), GgufValue::String("x".into()))];
    let e = write_gguf_with(&path, &loaded.model, &bad_key, WriteDtype::F16, &|_| None).unwrap_err().to_string();
    assert!(e.contains("metadata key general.name is not a tokenizer key"), "{e}");
    // All-zero Q8_0 blocks for wq are valid: they read back as zeros.
    let store = |m: GgufMatrix| (m == q0).then(|| GgufStored { ggml_type: 8, bytes: vec![0; 64 * 68] });
    write_gguf_with(&path, &loaded.model, &keys, WriteDtype::F16, &store).expect("written");
    let back = open_model(&path, None).expect("reads");
    assert!(back.model.layers[0].wq.data.iter().all(|&v| v == 0.0));
    assert_eq!(
        back.source_dtypes.iter().find(|(n, _)| n == "blk.0.attn_q.weight").map(|(_, t)| t.as_str()),
        Some("Q8_0")
    );
    let names: Vec<_> = std::fs::read_dir(dir.path()).expect("dir").map(|e| e.expect("entry").file_name()).collect();
    assert_eq!(names, ["m.gguf"]);
}
