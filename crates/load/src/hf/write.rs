//! [`write_hf_folder`]: a [`HostModel`] with a SentencePiece-style [`Llama2cTokenizer`] as a
//! Hugging Face folder, readable by [`crate::open_model`] (and by `transformers`), so that the
//! readers can be tested against a known model (stories260K) without downloading checkpoints.
//! [`WriteDtype`] is shared with the GGUF writer.

use std::borrow::Cow;
use std::path::Path;

use serde_json::{Value, json};

use crate::LoadError;
use crate::rope_layout::RopeLayout::ToRotateHalf;
use crate::rope_layout::permute_rows;
use crate::tokenizer::{Llama2cTokenizer, Tokenizer, is_byte_piece};
use qdrift_weights::{HostModel, HostTensor, LayerWeights, RopeScaling};

/// Element type of the written weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteDtype {
    /// IEEE single precision (bit-exact round trip).
    F32,
    /// IEEE half precision, round-to-nearest-even.
    F16,
    /// bfloat16, round-to-nearest-even (Hugging Face only; GGUF refuses it here).
    BF16,
}

impl WriteDtype {
    /// `x` rounded to this dtype and back, as the readers will return it.
    pub fn round(self, x: f32) -> f32 {
        match self {
            WriteDtype::F32 => x,
            WriteDtype::F16 => half::f16::from_f32(x).to_f32(),
            WriteDtype::BF16 => half::bf16::from_f32(x).to_f32(),
        }
    }

    /// The little-endian bytes of `t` in this dtype.
    pub(crate) fn bytes(self, t: &HostTensor) -> Vec<u8> {
        match self {
            WriteDtype::F32 => t.data.iter().flat_map(|v| v.to_le_bytes()).collect(),
            WriteDtype::F16 => t.data.iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect(),
            WriteDtype::BF16 => t.data.iter().flat_map(|&v| half::bf16::from_f32(v).to_le_bytes()).collect(),
        }
    }

    fn torch_name(self) -> &'static str {
        match self {
            WriteDtype::F32 => "float32",
            WriteDtype::F16 => "float16",
            WriteDtype::BF16 => "bfloat16",
        }
    }
}

/// An f32 as the shortest decimal that reads back as the same f32 (`1e-5`, not
/// `9.999999747378752e-6`), for JSON.
fn json_f32(x: f32) -> Value {
    format!("{x}").parse::<f64>().ok().and_then(serde_json::Number::from_f64).map_or(Value::Null, Value::Number)
}

/// `v` as pretty JSON, written atomically.
fn write_json(path: &Path, v: &Value) -> Result<(), LoadError> {
    let s = serde_json::to_string_pretty(v).map_err(|e| LoadError::invalid(path, format!("cannot serialize: {e}")))?;
    Ok(qdrift_io::write_atomic(path, s.as_bytes())?)
}

/// A tensor ready for `safetensors::serialize`.
struct Bytes {
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl safetensors::View for &Bytes {
    fn dtype(&self) -> safetensors::Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// Writes `model` and `tokenizer` as a Hugging Face folder: `config.json`, `model.safetensors`
/// (every tensor in `dtype`, HF names, q/k rows permuted to the rotate-half layout — see
/// [`crate::read_hf_folder`]'s table), `tokenizer.json`, `tokenizer_config.json`.
///
/// The architecture is `Qwen2ForCausalLM` when the layers have q/k/v biases (all three in every
/// layer, as Qwen2 has them), else `LlamaForCausalLM`; [`RopeScaling::Llama3`] is written as
/// `rope_scaling` (`rope_type = llama3`). [`RopeScaling::FreqFactors`] has no `config.json` form
/// and is refused.
///
/// The `tokenizer.json` is a `tokenizers` BPE model equivalent to llama2.c's encoder (as
/// Hugging Face's Llama 2 `tokenizer.json` is to SentencePiece):
/// - normalizer: prepend `▁` (SentencePiece's dummy prefix), replace spaces with `▁`;
/// - model: BPE with `byte_fallback` (`<0xNN>` pieces), `unk = <unk>`; its merges are, for every
///   piece `p` and every split `p = a + b` with `a`, `b` pieces, the pair `(a, b)`, ranked by
///   `p`'s score (highest first) — the greedy "merge the best-scoring adjacent pair" of llama2.c.
///   Only equal scores could order differently (llama2.c takes the leftmost pair);
/// - post-processor: `<s> $A` (BOS); decoder: `▁` → space, byte fallback, fuse, strip one leading
///   space;
/// - `<unk>`, `<s>`, `</s>` (ids 0, 1, 2) as special added tokens.
///
/// # Errors
/// [`LoadError`] naming the file that could not be written, or the model when its shape
/// contradicts its architecture, some layers have biases and others not, or its RoPE scaling has
/// no `config.json` form.
pub fn write_hf_folder(
    dir: &Path,
    model: &HostModel,
    tokenizer: &Llama2cTokenizer,
    dtype: WriteDtype,
) -> Result<(), LoadError> {
    let qwen2 = has_qkv_biases(dir, model)?;
    let config = config_json(dir, model, tokenizer, dtype, qwen2)?;
    std::fs::create_dir_all(dir).map_err(|e| LoadError::write(dir, e))?;
    write_json(&dir.join("config.json"), &config)?;
    write_safetensors(&dir.join("model.safetensors"), &hf_tensors(model, dtype))?;
    write_json(&dir.join("tokenizer.json"), &tokenizer_json(tokenizer))?;
    write_json(&dir.join("tokenizer_config.json"), &tokenizer_config_json(tokenizer, model.arch.max_seq_len))
}

/// `config.json`: `transformers`' `LlamaConfig` (or `Qwen2Config`) fields of the architecture.
fn config_json(
    dir: &Path,
    model: &HostModel,
    tokenizer: &Llama2cTokenizer,
    dtype: WriteDtype,
    qwen2: bool,
) -> Result<Value, LoadError> {
    let a = &model.arch;
    let rope_scaling = match &a.rope_scaling {
        None => Value::Null,
        Some(RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings }) => {
            json!({
                "rope_type": "llama3",
                "factor": json_f32(*factor),
                "low_freq_factor": json_f32(*low_freq_factor),
                "high_freq_factor": json_f32(*high_freq_factor),
                "original_max_position_embeddings": original_max_position_embeddings,
            })
        }
        Some(RopeScaling::Linear { factor }) => json!({ "rope_type": "linear", "factor": json_f32(*factor) }),
        Some(RopeScaling::Yarn { .. }) => {
            return Err(LoadError::invalid(dir, "YaRN RoPE scaling cannot be written to config.json yet"));
        }
        Some(RopeScaling::LongRope { .. }) => {
            return Err(LoadError::invalid(dir, "LongRoPE scaling cannot be written to config.json yet"));
        }
        Some(RopeScaling::FreqFactors { .. }) => {
            return Err(LoadError::invalid(
                dir,
                "RoPE frequency factors (GGUF rope_freqs.weight) have no config.json form",
            ));
        }
    };
    let (architecture, model_type) = if qwen2 { ("Qwen2ForCausalLM", "qwen2") } else { ("LlamaForCausalLM", "llama") };
    Ok(json!({
        "architectures": [architecture],
        "model_type": model_type,
        "hidden_size": a.dim,
        "intermediate_size": a.hidden_dim,
        "num_hidden_layers": a.n_layers,
        "num_attention_heads": a.n_heads,
        "num_key_value_heads": a.n_kv_heads,
        "vocab_size": a.vocab_size,
        "max_position_embeddings": a.max_seq_len,
        "rms_norm_eps": json_f32(a.norm_eps),
        "rope_theta": json_f32(a.rope_theta),
        "rope_scaling": rope_scaling,
        "tie_word_embeddings": a.tied_embeddings,
        "hidden_act": "silu",
        "bos_token_id": tokenizer.bos_id(),
        "eos_token_id": tokenizer.eos_id(),
        "torch_dtype": dtype.torch_name(),
    }))
}

/// Every tensor under its Hugging Face name, in `dtype`, q/k rows in the rotate-half layout.
fn hf_tensors(model: &HostModel, dtype: WriteDtype) -> Vec<(String, Bytes)> {
    let a = &model.arch;
    let st_dtype = match dtype {
        WriteDtype::F32 => safetensors::Dtype::F32,
        WriteDtype::F16 => safetensors::Dtype::F16,
        WriteDtype::BF16 => safetensors::Dtype::BF16,
    };
    let mut tensors: Vec<(String, Bytes)> = Vec::new();
    let mut push = |name: String, t: &HostTensor| {
        tensors.push((name, Bytes { dtype: st_dtype, shape: t.shape.clone(), data: dtype.bytes(t) }));
    };
    push("model.embed_tokens.weight".into(), &model.token_embedding);
    for (i, l) in model.layers.iter().enumerate() {
        let p = format!("model.layers.{i}");
        push(format!("{p}.input_layernorm.weight"), &l.attn_norm);
        push(format!("{p}.self_attn.q_proj.weight"), &permute_rows(&l.wq, a.n_heads, ToRotateHalf));
        push(format!("{p}.self_attn.k_proj.weight"), &permute_rows(&l.wk, a.n_kv_heads, ToRotateHalf));
        push(format!("{p}.self_attn.v_proj.weight"), &l.wv);
        push(format!("{p}.self_attn.o_proj.weight"), &l.wo);
        push(format!("{p}.post_attention_layernorm.weight"), &l.ffn_norm);
        if let Some(m) = l.mlp() {
            // Every FFN is dense: `has_qkv_biases` refused the others.
            push(format!("{p}.mlp.gate_proj.weight"), &m.gate);
            push(format!("{p}.mlp.up_proj.weight"), &m.up);
            push(format!("{p}.mlp.down_proj.weight"), &m.down);
        }
        if let Some(b) = &l.bq {
            push(format!("{p}.self_attn.q_proj.bias"), &permute_rows(b, a.n_heads, ToRotateHalf));
        }
        if let Some(b) = &l.bk {
            push(format!("{p}.self_attn.k_proj.bias"), &permute_rows(b, a.n_kv_heads, ToRotateHalf));
        }
        if let Some(b) = &l.bv {
            push(format!("{p}.self_attn.v_proj.bias"), b);
        }
    }
    push("model.norm.weight".into(), &model.final_norm);
    if let Some(o) = &model.output {
        push("lm_head.weight".into(), o);
    }
    tensors
}

/// `tensors` as one safetensors file with `format = pt` metadata.
/// Written atomically: through [`qdrift_io::AtomicFile`]'s temporary file, renamed over `path`.
fn write_safetensors(path: &Path, tensors: &[(String, Bytes)]) -> Result<(), LoadError> {
    let views = tensors.iter().map(|(n, b)| (n.clone(), b));
    let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    let file = qdrift_io::AtomicFile::create(path)?;
    safetensors::serialize_to_file(views, Some(meta), file.temp_path())
        .map_err(|e| LoadError::invalid(path, format!("cannot write safetensors: {e}")))?;
    Ok(file.commit()?)
}

/// `tokenizer_config.json`: a `LlamaTokenizer` that prepends BOS.
fn tokenizer_config_json(tokenizer: &Llama2cTokenizer, max_seq_len: usize) -> Value {
    let piece = |id: Option<u32>| {
        id.and_then(|i| tokenizer.pieces.get(i as usize)).map(|p| String::from_utf8_lossy(p).into_owned())
    };
    json!({
        "tokenizer_class": "LlamaTokenizer",
        "bos_token": piece(tokenizer.bos_id()),
        "eos_token": piece(tokenizer.eos_id()),
        "unk_token": piece(Some(0)),
        "add_bos_token": true,
        "add_eos_token": false,
        "model_max_length": max_seq_len,
    })
}

/// Whether every layer has q, k and v biases (Qwen2); `false` when none has any. A model whose
/// blocks are not Llama's (or Qwen2's) is refused, naming what the Hugging Face writer cannot
/// express ([`refuse_non_llama_block`] with `config.json`'s limits).
pub(crate) fn has_qkv_biases(path: &Path, model: &HostModel) -> Result<bool, LoadError> {
    refuse_non_llama_block(path, model, true, "qdrift writes Llama, Mistral and Qwen2 blocks")?;
    qkv_biases_all_or_none(path, model)
}

/// Refuses a model whose block a Llama/Qwen2 writer cannot express, naming the feature:
/// another block, experts, sliding windows, an embedding scale or logit soft cap, output or FFN
/// biases, and with `head_dim_divides` a `head_dim` other than `dim / n_heads` (`config.json`
/// as written has no `head_dim`; GGUF writes `attention.key_length`). `writes` ends the message
/// (what the writer does write).
pub(crate) fn refuse_non_llama_block(
    path: &Path,
    model: &HostModel,
    head_dim_divides: bool,
    writes: &str,
) -> Result<(), LoadError> {
    let a = &model.arch;
    let other = if !a.block.is_llama() {
        Some("its block (norms, attention or activation) is not Llama's")
    } else if a.moe.is_some() {
        Some("it has a mixture of experts")
    } else if !a.windows.is_empty() {
        Some("it has sliding-window layers")
    } else if !a.layer_attention.is_plain() {
        Some("it has NoPE, chunked or temperature-tuned attention layers")
    } else if a.embedding_scale.is_some() || a.final_logit_softcap.is_some() {
        Some("it scales its embeddings or soft-caps its logits")
    } else if head_dim_divides && a.head_dim * a.n_heads != a.dim {
        Some("its head_dim is not dim / n_heads")
    } else if model.layers.iter().any(|l| {
        l.bo.is_some() || l.mlp().is_none_or(|m| m.gate_bias.is_some() || m.up_bias.is_some() || m.down_bias.is_some())
    }) {
        Some("it has output or feed-forward biases")
    } else {
        None
    };
    match other {
        Some(why) => {
            Err(LoadError::invalid(path, format!("{} cannot be written yet: {why}; {writes}", a.architecture)))
        }
        None => Ok(()),
    }
}

/// Whether every layer has q, k and v biases; `false` when none has any; refused when some
/// layers or projections have them and others not.
pub(crate) fn qkv_biases_all_or_none(path: &Path, model: &HostModel) -> Result<bool, LoadError> {
    let count = |l: &LayerWeights| [&l.bq, &l.bk, &l.bv].iter().filter(|b| b.is_some()).count();
    let counts: Vec<usize> = model.layers.iter().map(count).collect();
    if counts.iter().all(|&c| c == 0) {
        Ok(false)
    } else if counts.iter().all(|&c| c == 3) {
        Ok(true)
    } else {
        Err(LoadError::invalid(
            path,
            "some q/k/v biases are missing; only models with all three biases in every layer \
             (Qwen2) or none are written",
        ))
    }
}

/// The pieces with `▁` for spaces, as SentencePiece and GGUF store them.
fn sp_pieces(tok: &Llama2cTokenizer) -> Vec<String> {
    tok.pieces.iter().map(|p| String::from_utf8_lossy(p).replace(' ', "\u{2581}")).collect()
}

/// The `tokenizers` JSON equivalent to `tok` (see [`write_hf_folder`]).
fn tokenizer_json(tok: &Llama2cTokenizer) -> Value {
    let pieces = sp_pieces(tok);
    let special: Vec<u32> = [Some(0), tok.bos_id(), tok.eos_id()].into_iter().flatten().collect();
    let mergeable = |id: u32| !special.contains(&id) && !is_byte_piece(&tok.pieces[id as usize]);
    let mut vocab = serde_json::Map::new();
    let mut ids = std::collections::HashMap::new();
    for (i, p) in pieces.iter().enumerate() {
        // Duplicate pieces keep their first id, as the encoder does.
        if !vocab.contains_key(p) {
            vocab.insert(p.clone(), json!(i));
            ids.insert(p.as_str(), i as u32);
        }
    }
    // (score of the merged piece, its id, left, right); highest score first, then id.
    let mut merges: Vec<(f32, u32, &str, &str)> = Vec::new();
    for (i, p) in pieces.iter().enumerate() {
        let id = i as u32;
        if !mergeable(id) || ids.get(p.as_str()) != Some(&id) {
            continue;
        }
        for (k, _) in p.char_indices().skip(1) {
            let (l, r) = p.split_at(k);
            if let (Some(&li), Some(&ri)) = (ids.get(l), ids.get(r))
                && mergeable(li)
                && mergeable(ri)
            {
                merges.push((tok.scores[i], id, l, r));
            }
        }
    }
    merges.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let merges: Vec<Value> = merges.iter().map(|(_, _, l, r)| json!([l, r])).collect();
    let added: Vec<Value> = special
        .iter()
        .map(|&id| {
            json!({"id": id, "content": pieces[id as usize], "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let bos = tok.bos_id().map(|b| pieces[b as usize].clone()).unwrap_or_default();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u{2581}"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}
        ]},
        "pre_tokenizer": null,
        "model": {
            "type": "BPE", "dropout": null, "unk_token": pieces[0], "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
            "vocab": vocab, "merges": merges
        },
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos.clone(): {"id": bos, "ids": [tok.bos_id()], "tokens": [bos]}}
        },
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}
        ]}
    })
}
