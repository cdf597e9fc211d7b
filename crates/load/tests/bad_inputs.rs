//! One test per way a model folder or file can be wrong: each asserts the specific error
//! (naming the file, the tensor and the expected shape where they apply), never a panic.
//! Also the Hugging Face options that change how a folder reads (sharding, Qwen2 biases,
//! Mistral's sliding window, Llama 3's RoPE scaling, transformers 5's `rope_parameters`).
//!
//! Fixtures: the synthetic `tiny` model (vocab 320, dim 32, hidden 64, 2 layers, 4/2 heads,
//! tied) written by `qdrift_load::write`, then edited.

use std::path::{Path, PathBuf};

use qdrift_load::write::{WriteDtype, write_gguf, write_hf_folder};
use qdrift_load::{LoadError, LoadedModel, RopeScaling, byte_tokenizer, open_model, synthetic_model};
use safetensors::Dtype;
use serde_json::Value;

fn tiny() -> LoadedModel {
    synthetic_model("tiny", 3).expect("tiny")
}

/// A Hugging Face folder of `tiny`, F32.
fn folder() -> (tempfile::TempDir, LoadedModel) {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = tiny();
    write_hf_folder(dir.path(), &m.model, &byte_tokenizer(320).expect("tok"), WriteDtype::F32).expect("written");
    (dir, m)
}

fn st_path(dir: &Path) -> PathBuf {
    dir.join("model.safetensors")
}

/// Splits a safetensors file into its header JSON and data buffer.
fn split(bytes: &[u8]) -> (Value, Vec<u8>) {
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    (serde_json::from_slice(&bytes[8..8 + n]).expect("json"), bytes[8 + n..].to_vec())
}

fn join(header: &Value, data: &[u8]) -> Vec<u8> {
    let h = serde_json::to_vec(header).expect("json");
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(data);
    out
}

/// Rewrites the folder's safetensors header with `edit`.
fn edit_header(dir: &Path, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let (mut header, data) = split(&std::fs::read(st_path(dir)).expect("read"));
    edit(header.as_object_mut().expect("object"));
    std::fs::write(st_path(dir), join(&header, &data)).expect("write");
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let p = dir.join("config.json");
    let mut c: Value = serde_json::from_slice(&std::fs::read(&p).expect("read")).expect("json");
    edit(c.as_object_mut().expect("object"));
    std::fs::write(&p, serde_json::to_vec(&c).expect("json")).expect("write");
}

/// Every tensor of the folder, for rewriting with `safetensors::serialize_to_file`.
fn tensors(dir: &Path) -> Vec<(String, Dtype, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(st_path(dir)).expect("read");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("valid");
    let mut out: Vec<_> =
        st.iter().map(|(n, v)| (n.to_string(), v.dtype(), v.shape().to_vec(), v.data().to_vec())).collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn write_tensors(path: &Path, tensors: &[(String, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.clone(), safetensors::tensor::TensorView::new(*d, s.clone(), b).expect("view")))
        .collect();
    safetensors::serialize_to_file(views, None, path).expect("write");
}

fn err(dir: &Path) -> String {
    open_model(dir, None).err().expect("refused").to_string()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn fixture_reads_back() {
    let (dir, m) = folder();
    let back = open_model(dir.path(), None).expect("valid folder");
    assert_eq!(back.model.token_embedding, m.model.token_embedding);
    assert_eq!(back.model.layers, m.model.layers);
    // The folder's files stand for the folder.
    for file in ["model.safetensors", "config.json"] {
        let again = open_model(&dir.path().join(file), None).expect("via a file of the folder");
        assert_eq!(again.path, dir.path());
    }
}

#[test]
fn truncated_safetensors() {
    let (dir, _) = folder();
    let bytes = std::fs::read(st_path(dir.path())).expect("read");
    std::fs::write(st_path(dir.path()), &bytes[..bytes.len() - 100]).expect("write");
    let e = err(dir.path());
    assert!(e.starts_with(&format!("{}: tensor ", st_path(dir.path()).display())), "{e}");
    assert!(e.contains("run past the end of the data buffer") && e.contains("truncated file?"), "{e}");
    std::fs::write(st_path(dir.path()), &bytes[..5]).expect("write");
    let e = err(dir.path());
    assert!(e.contains("truncated: the 8-byte header length, the file has 5 bytes"), "{e}");
}

#[test]
fn safetensors_header_length_beyond_file() {
    let (dir, _) = folder();
    let mut bytes = std::fs::read(st_path(dir.path())).expect("read");
    let len = bytes.len() as u64;
    bytes[..8].copy_from_slice(&(len * 2).to_le_bytes());
    std::fs::write(st_path(dir.path()), &bytes).expect("write");
    let e = err(dir.path());
    assert!(
        e.contains(&format!(
            "truncated: the header declares {} bytes of JSON but only {} bytes follow",
            len * 2,
            len - 8
        )),
        "{e}"
    );
}

#[test]
fn safetensors_tensor_offsets_out_of_range() {
    let (dir, _) = folder();
    edit_header(dir.path(), |h| {
        let t = h.get_mut("model.norm.weight").expect("tensor");
        let begin = t["data_offsets"][0].as_u64().expect("offset");
        t["data_offsets"] = serde_json::json!([begin, begin + 1_000_000]);
    });
    let e = err(dir.path());
    assert!(e.contains("tensor model.norm.weight: data_offsets"), "{e}");
    assert!(e.contains("hold 1000000 bytes but dtype F32 and shape [32] need 128"), "{e}");
}

#[test]
fn safetensors_wrong_dtype() {
    let (dir, _) = folder();
    edit_header(dir.path(), |h| h["model.norm.weight"]["dtype"] = "I32".into());
    let e = err(dir.path());
    assert_eq!(
        e,
        format!(
            "{}: tensor model.norm.weight: dtype I32 is not supported; supported: F32, F16, BF16",
            st_path(dir.path()).display()
        )
    );
}

#[test]
fn safetensors_missing_tensor_names_it_and_its_shape() {
    let (dir, _) = folder();
    edit_header(dir.path(), |h| {
        let t = h.remove("model.layers.1.mlp.up_proj.weight").expect("tensor");
        h.insert("model.layers.1.mlp.up_proj.weight_renamed".into(), t);
    });
    let e = err(dir.path());
    assert!(e.contains("tensor model.layers.1.mlp.up_proj.weight is missing; expected shape [64, 32]"), "{e}");
}

#[test]
fn safetensors_wrong_shape() {
    let (dir, _) = folder();
    edit_header(dir.path(), |h| h["model.layers.0.self_attn.k_proj.weight"]["shape"] = serde_json::json!([32, 16]));
    let e = err(dir.path());
    assert!(e.contains("tensor model.layers.0.self_attn.k_proj.weight has shape [32, 16]; expected [16, 32]"), "{e}");
}

#[test]
fn unsupported_architecture() {
    let (dir, _) = folder();
    edit_config(dir.path(), |c| c["architectures"] = serde_json::json!(["GPT2LMHeadModel"]));
    let e = err(dir.path());
    assert!(
        e.ends_with(
            "config.json: unsupported architecture GPT2LMHeadModel; supported: LlamaForCausalLM, MistralForCausalLM, \
             Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, Qwen2MoeForCausalLM, Gemma2ForCausalLM, \
             Gemma3ForCausalLM, Phi3ForCausalLM, MixtralForCausalLM, GptOssForCausalLM, SmolLM3ForCausalLM, \
             Llama4ForCausalLM, Glm4MoeForCausalLM"
        ),
        "{e}"
    );
}

#[test]
fn missing_config_json() {
    let (dir, _) = folder();
    std::fs::remove_file(dir.path().join("config.json")).expect("rm");
    let e = err(dir.path());
    assert!(e.contains("is a folder without config.json"), "{e}");
}

#[test]
fn missing_tokenizer_json() {
    let (dir, _) = folder();
    std::fs::remove_file(dir.path().join("tokenizer.json")).expect("rm");
    let e = err(dir.path());
    assert!(e.contains("tokenizer.json: not found"), "{e}");
}

#[test]
fn hf_tokenizer_vocab_differs_from_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_hf_folder(dir.path(), &tiny().model, &byte_tokenizer(300).expect("tok"), WriteDtype::F32).expect("written");
    let e = open_model(dir.path(), None).err().expect("refused");
    assert!(matches!(e, LoadError::VocabMismatch { tokenizer_vocab: 300, model_vocab: 320, .. }), "{e}");
}

#[test]
fn gguf_tokenizer_vocab_differs_from_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("m.gguf");
    write_gguf(&path, &tiny().model, &byte_tokenizer(300).expect("tok"), WriteDtype::F32).expect("written");
    let e = open_model(&path, None).err().expect("refused");
    assert!(matches!(e, LoadError::VocabMismatch { tokenizer_vocab: 300, model_vocab: 320, .. }), "{e}");
}

/// A written GGUF and the offset of the `u32` type of tensor `name` in it.
fn gguf_with_type_offset(name: &str) -> (tempfile::TempDir, PathBuf, Vec<u8>, usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("m.gguf");
    write_gguf(&path, &tiny().model, &byte_tokenizer(320).expect("tok"), WriteDtype::F16).expect("written");
    let bytes = std::fs::read(&path).expect("read");
    let mut key = (name.len() as u64).to_le_bytes().to_vec();
    key.extend(name.as_bytes());
    let at = bytes.windows(key.len()).position(|w| w == key).expect("tensor info") + key.len();
    let n_dims = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4")) as usize;
    (dir, path, bytes, at + 4 + 8 * n_dims)
}

#[test]
fn gguf_unknown_tensor_type() {
    let (_dir, path, mut bytes, at) = gguf_with_type_offset("blk.1.ffn_up.weight");
    bytes[at..at + 4].copy_from_slice(&99u32.to_le_bytes());
    std::fs::write(&path, &bytes).expect("write");
    let e = open_model(&path, None).err().expect("refused").to_string();
    assert!(
        e.contains(
            "tensor blk.1.ffn_up.weight has type 99 (not a known ggml type), which qdrift cannot read; it reads F32"
        ),
        "{e}"
    );
    // A real ggml type qdrift does not read is named as ggml names it.
    bytes[at..at + 4].copy_from_slice(&16u32.to_le_bytes());
    std::fs::write(&path, &bytes).expect("write");
    let e = open_model(&path, None).err().expect("refused").to_string();
    assert!(
        e.contains("tensor blk.1.ffn_up.weight has type IQ2_XXS (16), which qdrift cannot read; it reads F32"),
        "{e}"
    );
}

#[test]
fn gguf_bad_magic() {
    let (_dir, path, mut bytes, _) = gguf_with_type_offset("output_norm.weight");
    bytes[..4].copy_from_slice(b"GGML");
    std::fs::write(&path, &bytes).expect("write");
    let e = open_model(&path, None).err().expect("refused").to_string();
    assert!(e.contains("not a GGUF file: magic is"), "{e}");
}

#[test]
fn sharded_folder_reads_like_a_single_file() {
    let (dir, m) = folder();
    let all = tensors(dir.path());
    let (a, b) = all.split_at(all.len() / 2);
    write_tensors(&dir.path().join("model-00001-of-00002.safetensors"), a);
    write_tensors(&dir.path().join("model-00002-of-00002.safetensors"), b);
    std::fs::remove_file(st_path(dir.path())).expect("rm");
    let mut map = serde_json::Map::new();
    for (names, file) in [(a, "model-00001-of-00002.safetensors"), (b, "model-00002-of-00002.safetensors")] {
        for (n, ..) in names {
            map.insert(n.clone(), file.into());
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(dir.path().join("model.safetensors.index.json"), index.to_string()).expect("write");
    let back = open_model(dir.path(), None).expect("sharded");
    assert_eq!(back.model.layers, m.model.layers);
    assert_eq!(back.source_dtypes.len(), all.len());
}

#[test]
fn qwen2_biases_are_read_unpermuted() {
    let (dir, m) = folder();
    edit_config(dir.path(), |c| {
        c["architectures"] = serde_json::json!(["Qwen2ForCausalLM"]);
        c["model_type"] = "qwen2".into();
    });
    let mut all = tensors(dir.path());
    // q bias rows in HF (rotate-half) order: value = row index, so the un-permutation is visible.
    let (q, kv) = (32usize, 16usize);
    for i in 0..2 {
        let p = format!("model.layers.{i}.self_attn");
        let rows = |n: usize| f32_bytes(&(0..n).map(|r| r as f32).collect::<Vec<_>>());
        all.push((format!("{p}.q_proj.bias"), Dtype::F32, vec![q], rows(q)));
        all.push((format!("{p}.k_proj.bias"), Dtype::F32, vec![kv], rows(kv)));
        all.push((format!("{p}.v_proj.bias"), Dtype::F32, vec![kv], rows(kv)));
    }
    write_tensors(&st_path(dir.path()), &all);
    let read = open_model(dir.path(), None).expect("a Qwen2 folder opens");
    assert_eq!(read.model.arch.architecture, "Qwen2ForCausalLM");
    let l = &read.model.layers[0];
    // head_dim 8: rotate-half row h·8 + a·4 + i is interleaved row h·8 + 2i + a.
    let bq = &l.bq.as_ref().expect("bq").data;
    assert_eq!(&bq[..8], &[0.0, 4.0, 1.0, 5.0, 2.0, 6.0, 3.0, 7.0]);
    assert_eq!(l.bv.as_ref().expect("bv").data, (0..16).map(|r| r as f32).collect::<Vec<_>>());
    assert_eq!(l.wq, m.model.layers[0].wq);

    // Qwen2 without its biases is a missing tensor, named with its expected shape.
    all.retain(|t| t.0 != "model.layers.1.self_attn.k_proj.bias");
    write_tensors(&st_path(dir.path()), &all);
    let e = err(dir.path());
    assert!(e.contains("tensor model.layers.1.self_attn.k_proj.bias is missing; expected shape [16]"), "{e}");
}

#[test]
fn mistral_sliding_window_caps_the_context() {
    let (dir, _) = folder();
    edit_config(dir.path(), |c| {
        c["architectures"] = serde_json::json!(["MistralForCausalLM"]);
        c["max_position_embeddings"] = 32768.into();
        c.insert("sliding_window".into(), 100.into());
    });
    let m = open_model(dir.path(), None).expect("mistral");
    assert_eq!(m.model.arch.max_seq_len, 100);
    assert_eq!(m.model.arch.architecture, "MistralForCausalLM");
}

#[test]
fn llama3_rope_scaling_is_read() {
    let (dir, _) = folder();
    edit_config(dir.path(), |c| {
        c.insert(
            "rope_scaling".into(),
            serde_json::json!({"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
        );
    });
    let r = open_model(dir.path(), None).expect("opens");
    assert_eq!(
        r.model.arch.rope_scaling,
        Some(RopeScaling::Llama3 {
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192
        })
    );
    // `rope_type: default` is plain RoPE.
    edit_config(dir.path(), |c| c["rope_scaling"] = serde_json::json!({"rope_type": "default"}));
    assert_eq!(open_model(dir.path(), None).expect("opens").model.arch.rope_scaling, None);
    edit_config(dir.path(), |c| c["rope_scaling"] = serde_json::json!({"rope_type": "longrope", "factor": 4.0}));
    let e = err(dir.path());
    assert!(e.contains("rope_scaling: short_factor is missing (LongRoPE needs it)"), "{e}");
    edit_config(dir.path(), |c| c["rope_scaling"] = serde_json::json!({"rope_type": "su_typo", "factor": 4.0}));
    let e = err(dir.path());
    assert!(e.contains("rope_scaling: type su_typo is not supported (RoPE scaling su_typo); supported: default, linear, llama3, yarn, longrope"), "{e}");
    // high_freq_factor must exceed low_freq_factor (the interpolation divides by their gap).
    edit_config(dir.path(), |c| {
        c["rope_scaling"] = serde_json::json!({"rope_type": "llama3", "factor": 8.0,
            "low_freq_factor": 4.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    });
    let e = err(dir.path());
    assert!(e.contains("high_freq_factor 4 must be greater than low_freq_factor 4"), "{e}");
}

#[test]
fn transformers_5_rope_parameters_are_read() {
    let (dir, _) = folder();
    edit_config(dir.path(), |c| {
        c.remove("rope_theta");
        c.insert(
            "rope_parameters".into(),
            serde_json::json!({"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}),
        );
    });
    let a = open_model(dir.path(), None).expect("opens").model.arch;
    assert_eq!(a.rope_theta, 500000.0);
    assert!(matches!(a.rope_scaling, Some(RopeScaling::Llama3 { factor: 8.0, .. })));
    edit_config(dir.path(), |c| {
        c["rope_parameters"] = serde_json::json!({"rope_type": "default", "rope_theta": 100000.0})
    });
    let a = open_model(dir.path(), None).expect("opens").model.arch;
    assert_eq!((a.rope_theta, a.rope_scaling), (100000.0, None));
    edit_config(dir.path(), |c| c["rope_parameters"] = serde_json::json!({"rope_type": "dynamic", "rope_theta": 1e4}));
    let e = err(dir.path());
    assert!(e.contains("rope_parameters: type dynamic is not supported (RoPE scaling dynamic); supported: default, linear, llama3, yarn"), "{e}");
}

#[test]
fn lm_head_is_read_when_untied_and_ignored_when_tied() {
    let (dir, m) = folder();
    let mut all = tensors(dir.path());
    let head: Vec<f32> = (0..320 * 32).map(|i| i as f32).collect();
    all.push(("lm_head.weight".into(), Dtype::F32, vec![320, 32], f32_bytes(&head)));
    write_tensors(&st_path(dir.path()), &all);
    // config.json says tie_word_embeddings = true: lm_head is ignored, as transformers ties it.
    let tied = open_model(dir.path(), None).expect("tied");
    assert!(tied.model.arch.tied_embeddings && tied.model.output.is_none());
    edit_config(dir.path(), |c| c["tie_word_embeddings"] = false.into());
    let untied = open_model(dir.path(), None).expect("untied");
    assert!(!untied.model.arch.tied_embeddings);
    assert_eq!(untied.model.output.as_ref().expect("head").data, head);
    assert_eq!(untied.model.token_embedding, m.model.token_embedding);
}

/// RoPE factors that are positive f32 values but make a derived inverse frequency infinite (a
/// YaRN `factor` of 1e-45, a LongRoPE `short_factor` of 1e-44) are refused naming config.json and
/// the key, before the model's first layer turns them into non-finite logits blamed on the
/// weights.
#[test]
fn rope_factors_that_overflow_a_frequency_are_refused_by_key() {
    let (dir, _) = folder();
    edit_config(dir.path(), |c| {
        c.insert(
            "rope_scaling".into(),
            serde_json::json!({"rope_type": "yarn", "factor": 1e-45, "original_max_position_embeddings": 256}),
        );
    });
    let e = err(dir.path());
    let config = dir.path().join("config.json").display().to_string();
    assert!(
        e.starts_with(&format!("{config}: rope_scaling.factor 1e-45 makes pair 0's RoPE inverse frequency inf")),
        "{e}"
    );
    edit_config(dir.path(), |c| {
        c["rope_scaling"] = serde_json::json!({"rope_type": "longrope", "short_factor": [1.0, 1e-44, 1.0, 1.0],
            "long_factor": [1.0, 1.0, 1.0, 1.0], "original_max_position_embeddings": 128});
    });
    let e = err(dir.path());
    assert!(e.starts_with(&format!("{config}: rope_scaling.short_factor[1] 1e-44 makes pair 1's")), "{e}");
}

/// Tensors of the decoder beyond what config.json accounts for, which the reader (reading by
/// the names the configuration implies) silently left out: a layer past `num_hidden_layers`, an
/// expert in a model without experts. Each is refused naming the first such tensor.
#[test]
fn tensors_beyond_the_configs_layers_and_experts_are_refused() {
    for (extra, want) in [
        ("model.layers.2.self_attn.q_proj.weight", "is in layer 2, but config.json's num_hidden_layers is 2"),
        (
            "model.layers.0.mlp.experts.0.gate_proj.weight",
            "is an expert of layer 0, which config.json makes dense (no experts)",
        ),
    ] {
        let (dir, _) = folder();
        let mut all = tensors(dir.path());
        all.push((extra.into(), Dtype::F32, vec![32, 32], f32_bytes(&[0.5; 32 * 32])));
        write_tensors(&st_path(dir.path()), &all);
        let e = err(dir.path());
        let st = st_path(dir.path()).display().to_string();
        assert_eq!(e, format!("{st}: tensor {extra} {want}; qdrift would run without it"));
    }
}
