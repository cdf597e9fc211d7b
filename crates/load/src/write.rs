//! Writers: a [`HostModel`] with a SentencePiece-style [`Llama2cTokenizer`] as a Hugging Face
//! folder or as a GGUF file, readable by [`crate::open_model`] (and by `transformers` /
//! llama.cpp), and [`write_gguf_with`], the GGUF writer `qdrift quantize --format gguf` uses:
//! matrices stored as the caller packed them (ggml blocks), the tokenizer metadata carried over
//! from the source ([`gguf_tokenizer_keys`]; a Hugging Face `tokenizer.json` converted by
//! [`hf_tokenizer_keys`]).
//!
//! The Hugging Face writer and [`write_gguf`] exist so that the readers can be tested against a
//! known model (stories260K) without downloading checkpoints.

use std::borrow::Cow;
use std::path::Path;

use serde_json::{Value, json};

use qdrift_ggml::GgmlType;

pub use crate::hf_gguf_vocab::{UNMERGED_SCORE, hf_tokenizer_keys};

use crate::rope_layout::RopeLayout::ToRotateHalf;
use crate::rope_layout::{permute_rows, rotate_half_row_order};
use crate::{
    GgufValue, HostModel, HostTensor, Llama2cTokenizer, LoadError, LoadedModel, ModelFormat, RopeScaling, Tokenizer,
    read_gguf_metadata,
};

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

    fn bytes(self, t: &HostTensor) -> Vec<u8> {
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

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), LoadError> {
    std::fs::write(path, bytes).map_err(|e| LoadError::write(path, e))
}

fn write_json(path: &Path, v: &Value) -> Result<(), LoadError> {
    let s = serde_json::to_string_pretty(v).map_err(|e| LoadError::invalid(path, format!("cannot serialize: {e}")))?;
    write_file(path, s.as_bytes())
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
        push(format!("{p}.mlp.gate_proj.weight"), &l.w_gate);
        push(format!("{p}.mlp.up_proj.weight"), &l.w_up);
        push(format!("{p}.mlp.down_proj.weight"), &l.w_down);
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
fn write_safetensors(path: &Path, tensors: &[(String, Bytes)]) -> Result<(), LoadError> {
    let views = tensors.iter().map(|(n, b)| (n.clone(), b));
    let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(views, Some(meta), path)
        .map_err(|e| LoadError::invalid(path, format!("cannot write safetensors: {e}")))
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

/// Whether every layer has q, k and v biases (Qwen2); `false` when none has any.
fn has_qkv_biases(path: &Path, model: &HostModel) -> Result<bool, LoadError> {
    let count = |l: &crate::LayerWeights| [&l.bq, &l.bk, &l.bv].iter().filter(|b| b.is_some()).count();
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

/// llama.cpp's converter (`convert_hf_to_gguf.py`, `LlamaModel.generate_extra_tensors`) turns
/// Llama 3.1's `rope_scaling` into the per-pair divisors of `rope_freqs.weight`: 1 where
/// `wavelen < high`, `factor` where `wavelen > low`, `1 / ((1 - smooth) / factor + smooth)`
/// between (see [`RopeScaling::Llama3`]), computed in f32 from the f32 inverse frequencies.
fn llama3_freq_factors(scaling: &RopeScaling, head_dim: usize, theta: f32) -> Option<Vec<f32>> {
    let RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } = *scaling
    else {
        return None;
    };
    let old = original_max_position_embeddings as f32;
    let (low, high) = (old / low_freq_factor, old / high_freq_factor);
    let factors = (0..head_dim / 2)
        .map(|i| {
            let freq = 1.0 / theta.powf((2 * i) as f32 / head_dim as f32);
            let wavelen = 2.0 * std::f32::consts::PI / freq;
            if wavelen < high {
                1.0
            } else if wavelen > low {
                factor
            } else {
                let smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                1.0 / ((1.0 - smooth) / factor + smooth)
            }
        })
        .collect();
    Some(factors)
}

/// Is `p` a byte-fallback piece `<0xNN>`?
fn is_byte_piece(p: &[u8]) -> bool {
    p.len() == 6 && p.starts_with(b"<0x") && p.ends_with(b">")
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

/// GGUF metadata value types (`gguf.md` `gguf_metadata_value_type`).
const GGUF_U32: u32 = 4;
const GGUF_F32: u32 = 6;
const GGUF_BOOL: u32 = 7;
const GGUF_STRING: u32 = 8;
const GGUF_ARRAY: u32 = 9;
const ALIGNMENT: usize = 32;

/// `ggml_type` ids of the unquantized tensor types (`ggml.h` `GGML_TYPE_F32`, `GGML_TYPE_F16`).
const GGML_F32: u32 = 0;
const GGML_F16: u32 = 1;

/// GGUF metadata being written: `(count, bytes)`.
#[derive(Default)]
struct Kv(u64, Vec<u8>);

impl Kv {
    fn str_raw(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }
    fn key(&mut self, k: &str, ty: u32) -> &mut Vec<u8> {
        self.0 += 1;
        Self::str_raw(&mut self.1, k);
        self.1.extend(ty.to_le_bytes());
        &mut self.1
    }
    fn u32(&mut self, k: &str, v: u32) {
        self.key(k, GGUF_U32).extend(v.to_le_bytes());
    }
    fn f32(&mut self, k: &str, v: f32) {
        self.key(k, GGUF_F32).extend(v.to_le_bytes());
    }
    fn string(&mut self, k: &str, v: &str) {
        Self::str_raw(self.key(k, GGUF_STRING), v);
    }
    /// Any value, with the type it was read with ([`value_type`]).
    fn value(&mut self, k: &str, v: &GgufValue) {
        let out = self.key(k, value_type(v));
        value_bytes(out, v);
    }
}

/// The `gguf_metadata_value_type` of a value; an empty array's elements are taken to be strings
/// (a [`GgufValue::Array`] does not keep its element type, and the `tokenizer.ggml.*` arrays that
/// can be empty, `tokens` and `merges`, are string arrays).
fn value_type(v: &GgufValue) -> u32 {
    match v {
        GgufValue::U8(_) => 0,
        GgufValue::I8(_) => 1,
        GgufValue::U16(_) => 2,
        GgufValue::I16(_) => 3,
        GgufValue::U32(_) => GGUF_U32,
        GgufValue::I32(_) => 5,
        GgufValue::F32(_) => GGUF_F32,
        GgufValue::Bool(_) => GGUF_BOOL,
        GgufValue::String(_) => GGUF_STRING,
        GgufValue::Array(_) => GGUF_ARRAY,
        GgufValue::U64(_) => 10,
        GgufValue::I64(_) => 11,
        GgufValue::F64(_) => 12,
    }
}

/// A value's payload as `gguf.md` lays it out (arrays: element type, count, elements).
fn value_bytes(out: &mut Vec<u8>, v: &GgufValue) {
    match v {
        GgufValue::U8(x) => out.push(*x),
        GgufValue::I8(x) => out.extend(x.to_le_bytes()),
        GgufValue::U16(x) => out.extend(x.to_le_bytes()),
        GgufValue::I16(x) => out.extend(x.to_le_bytes()),
        GgufValue::U32(x) => out.extend(x.to_le_bytes()),
        GgufValue::I32(x) => out.extend(x.to_le_bytes()),
        GgufValue::F32(x) => out.extend(x.to_le_bytes()),
        GgufValue::Bool(x) => out.push(u8::from(*x)),
        GgufValue::String(x) => Kv::str_raw(out, x),
        GgufValue::Array(items) => {
            out.extend(items.first().map_or(GGUF_STRING, value_type).to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            for item in items {
                value_bytes(out, item);
            }
        }
        GgufValue::U64(x) => out.extend(x.to_le_bytes()),
        GgufValue::I64(x) => out.extend(x.to_le_bytes()),
        GgufValue::F64(x) => out.extend(x.to_le_bytes()),
    }
}

/// Writes `model` and `tokenizer` as a GGUF v3 file with the `llama` architecture, or `qwen2`
/// when the layers have q/k/v biases (all three in every layer).
///
/// Spec: ggml `docs/gguf.md` (layout as [`crate::read_gguf`] describes it; alignment 32).
/// Metadata: `general.architecture` (`ARCH` = `llama` or `qwen2`), `general.alignment`,
/// `ARCH.context_length`, `ARCH.embedding_length`, `ARCH.block_count`, `ARCH.feed_forward_length`,
/// `ARCH.attention.head_count`, `ARCH.attention.head_count_kv`,
/// `ARCH.attention.layer_norm_rms_epsilon`, `ARCH.rope.freq_base`, `ARCH.rope.dimension_count`,
/// `ARCH.vocab_size`; tokenizer: [`llama2c_tokenizer_keys`].
/// Tensors use llama.cpp's names (`token_embd`, `blk.N.attn_q`, `blk.N.attn_q.bias`, ...);
/// matrices are stored in `dtype`, 1-D norms, biases and `rope_freqs.weight` always as F32 (as
/// llama.cpp's converter does). `llama` q/k stay interleaved (GGUF's layout); `qwen2` q/k weights
/// and biases are written in Hugging Face's rotate-half layout, as llama.cpp's converter leaves
/// them. RoPE scaling becomes `rope_freqs.weight`: [`RopeScaling::FreqFactors`] as is,
/// [`RopeScaling::Llama3`] as llama.cpp's converter computes it. The write is atomic
/// ([`write_gguf_with`]).
///
/// # Errors
/// [`LoadError::Invalid`] for `dtype = BF16` (not offered here), a piece that is not UTF-8 or
/// biases in some layers only, and the I/O error otherwise.
pub fn write_gguf(
    path: &Path,
    model: &HostModel,
    tokenizer: &Llama2cTokenizer,
    dtype: WriteDtype,
) -> Result<(), LoadError> {
    let keys = llama2c_tokenizer_keys(path, tokenizer)?;
    write_gguf_with(path, model, &keys, dtype, &|_| None)
}

/// Which matrix of a [`HostModel`] a GGUF tensor holds, for [`write_gguf_with`]'s `store`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgufMatrix {
    /// `token_embd.weight` ([`HostModel::token_embedding`]).
    TokenEmbedding,
    /// `output.weight` (an untied [`HostModel::output`]).
    Output,
    /// A linear weight of block `layer`, by its Hugging Face short name as
    /// [`crate::LayerWeights::linears`] gives it (`self_attn.q_proj` is `blk.{layer}.attn_q`).
    Linear {
        /// Block index.
        layer: usize,
        /// Hugging Face short name.
        short_name: &'static str,
    },
}

/// A matrix as the caller of [`write_gguf_with`] stores it: a `ggml_type` id (`GGML_TYPE_F16`
/// = 1 or a block type of `qdrift-ggml`'s [`qdrift_ggml::GgmlType::READABLE`]) and its bytes.
///
/// # Shapes
/// - `bytes`: the matrix's `rows` rows one after the other, in [`HostModel`]'s row order (q/k
///   interleaved), each a whole number of the type's blocks (or `cols` binary16 values).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufStored {
    /// `ggml_type` id.
    pub ggml_type: u32,
    /// The stored rows.
    pub bytes: Vec<u8>,
}

/// Writes `model` as a GGUF v3 file (as [`write_gguf`] describes it) with the tokenizer metadata
/// `tokenizer_keys` written as given (every key must start with `tokenizer.`; see
/// [`gguf_tokenizer_keys`]), and each matrix stored as `store` returns it, or in `dtype` (F32 or
/// F16) where it returns `None`. Stored rows of `qwen2` q/k are permuted to the rotate-half
/// layout like the values (blocks run along rows, so whole rows move).
///
/// The write is atomic: the file is written as `path` with extension `gguf.tmp` in the same
/// folder and renamed over `path`; on failure the temporary file is removed and `path` is left as
/// it was.
///
/// # Errors
/// [`LoadError::Invalid`] for `dtype = BF16`, a tokenizer key outside `tokenizer.`, a stored
/// matrix whose type is not F16 or a readable block type, or whose bytes do not match its shape
/// (naming the tensor), biases in some layers only; the I/O error otherwise.
pub fn write_gguf_with(
    path: &Path,
    model: &HostModel,
    tokenizer_keys: &[(String, GgufValue)],
    dtype: WriteDtype,
    store: &dyn Fn(GgufMatrix) -> Option<GgufStored>,
) -> Result<(), LoadError> {
    if dtype == WriteDtype::BF16 {
        return Err(LoadError::invalid(path, "write_gguf writes F32 or F16 only"));
    }
    let qwen2 = has_qkv_biases(path, model)?;
    let mut kv = Kv::default();
    gguf_arch_metadata(&mut kv, path, &model.arch, if qwen2 { "qwen2" } else { "llama" })?;
    for (key, value) in tokenizer_keys {
        if !key.starts_with("tokenizer.") {
            return Err(LoadError::invalid(path, format!("metadata key {key} is not a tokenizer key")));
        }
        kv.value(key, value);
    }
    let tensors = gguf_tensors(path, model, qwen2)?;
    let bytes = gguf_bytes(path, &kv, &tensors, dtype, store)?;
    write_atomic(path, &bytes)
}

/// Writes `bytes` to `path` through a temporary file beside it, renamed over `path`.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), LoadError> {
    let tmp = path.with_extension("gguf.tmp");
    let tmp = match tmp.parent() {
        Some(parent) if parent.as_os_str().is_empty() => Path::new(".").join(tmp),
        _ => tmp,
    };
    let written =
        std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, path)).map_err(|e| LoadError::write(path, e));
    if written.is_err() {
        // Nothing to report if it was never created.
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// The `tokenizer.*` metadata a GGUF file of `loaded` carries, by its source format:
/// - GGUF: every `tokenizer.*` key of the source file (`tokenizer.ggml.*`,
///   `tokenizer.chat_template`, ...), as read ([`read_gguf_metadata`]);
/// - llama2.c: [`llama2c_tokenizer_keys`] of its `tokenizer.bin`;
/// - synthetic: [`llama2c_tokenizer_keys`] of its byte-level tokenizer
///   ([`crate::byte_tokenizer`]);
/// - a Hugging Face folder: its `tokenizer.json` (with `tokenizer_config.json` and
///   `config.json`) converted as llama.cpp's `convert_hf_to_gguf.py` converts it
///   ([`hf_tokenizer_keys`]): byte-level BPE (GPT-2, SmolLM2, Llama 3, Qwen2) as
///   `tokenizer.ggml.model = gpt2`, SentencePiece-style BPE with byte fallback (Llama 2) as
///   `llama`; other tokenizers (WordPiece, Unigram, unrecognised pre-tokenizers) are refused.
///
/// # Errors
/// The conversion's [`LoadError`] for a Hugging Face folder whose tokenizer it refuses; the
/// reader's error otherwise.
pub fn gguf_tokenizer_keys(loaded: &LoadedModel) -> Result<Vec<(String, GgufValue)>, LoadError> {
    match loaded.format {
        ModelFormat::Gguf => {
            let meta = read_gguf_metadata(&loaded.path)?;
            Ok(meta.into_iter().filter(|(k, _)| k.starts_with("tokenizer.")).collect())
        }
        ModelFormat::Llama2c => {
            let tok = Llama2cTokenizer::read(&loaded.tokenizer_path)?;
            llama2c_tokenizer_keys(&loaded.tokenizer_path, &tok)
        }
        ModelFormat::Synthetic => {
            let tok =
                crate::byte_tokenizer(loaded.model.arch.vocab_size).map_err(|e| LoadError::invalid(&loaded.path, e))?;
            llama2c_tokenizer_keys(&loaded.path, &tok)
        }
        ModelFormat::HfSafetensors => {
            hf_tokenizer_keys(&loaded.path, &loaded.tokenizer_path, loaded.model.arch.vocab_size)
        }
    }
}

/// `general.*` and the `ARCH.*` hyper-parameters.
fn gguf_arch_metadata(kv: &mut Kv, path: &Path, a: &crate::LlamaArch, arch: &str) -> Result<(), LoadError> {
    kv.string("general.architecture", arch);
    kv.string("general.name", &a.architecture);
    kv.u32("general.alignment", ALIGNMENT as u32);
    let u = |x: usize| u32::try_from(x).map_err(|_| LoadError::invalid(path, format!("{x} does not fit a u32")));
    let k = |key: &str| format!("{arch}.{key}");
    kv.u32(&k("context_length"), u(a.max_seq_len)?);
    kv.u32(&k("embedding_length"), u(a.dim)?);
    kv.u32(&k("block_count"), u(a.n_layers)?);
    kv.u32(&k("feed_forward_length"), u(a.hidden_dim)?);
    kv.u32(&k("attention.head_count"), u(a.n_heads)?);
    kv.u32(&k("attention.head_count_kv"), u(a.n_kv_heads)?);
    kv.f32(&k("attention.layer_norm_rms_epsilon"), a.norm_eps);
    kv.f32(&k("rope.freq_base"), a.rope_theta);
    kv.u32(&k("rope.dimension_count"), u(a.head_dim())?);
    kv.u32(&k("vocab_size"), u(a.vocab_size)?);
    Ok(())
}

/// The `tokenizer.ggml.*` keys of a llama2.c (SentencePiece) tokenizer, as llama.cpp's
/// converter writes a SentencePiece vocabulary: `tokenizer.ggml.model = llama` with `tokens`
/// (`▁` for spaces), `scores`, `token_type` (2 unknown for id 0, 3 control for BOS/EOS, 6 byte
/// for `<0xNN>`, 1 otherwise), `bos_token_id`, `eos_token_id`, `unknown_token_id = 0`,
/// `add_bos_token = true`.
///
/// # Errors
/// [`LoadError::Invalid`] (naming `path`) for a piece that is not UTF-8, as GGUF strings must be.
pub fn llama2c_tokenizer_keys(
    path: &Path,
    tokenizer: &Llama2cTokenizer,
) -> Result<Vec<(String, GgufValue)>, LoadError> {
    let mut tokens = Vec::with_capacity(tokenizer.pieces.len());
    for (i, p) in tokenizer.pieces.iter().enumerate() {
        let s = std::str::from_utf8(p)
            .map_err(|_| LoadError::invalid(path, format!("token {i} is not UTF-8; GGUF strings must be")))?;
        tokens.push(GgufValue::String(s.replace(' ', "\u{2581}")));
    }
    let n = tokenizer.pieces.len();
    let key = |k: &str, v: GgufValue| (k.to_owned(), v);
    let mut keys = vec![
        key("tokenizer.ggml.model", GgufValue::String("llama".into())),
        key("tokenizer.ggml.tokens", GgufValue::Array(tokens)),
        key("tokenizer.ggml.scores", GgufValue::Array(tokenizer.scores.iter().map(|&s| GgufValue::F32(s)).collect())),
        key(
            "tokenizer.ggml.token_type",
            GgufValue::Array((0..n).map(|i| GgufValue::I32(token_type(tokenizer, i))).collect()),
        ),
    ];
    if let Some(b) = tokenizer.bos_id() {
        keys.push(key("tokenizer.ggml.bos_token_id", GgufValue::U32(b)));
    }
    if let Some(e) = tokenizer.eos_id() {
        keys.push(key("tokenizer.ggml.eos_token_id", GgufValue::U32(e)));
    }
    keys.push(key("tokenizer.ggml.unknown_token_id", GgufValue::U32(0)));
    keys.push(key("tokenizer.ggml.add_bos_token", GgufValue::Bool(true)));
    Ok(keys)
}

/// GGUF's token type of piece `i`: 2 unknown (id 0), 3 control (BOS, EOS), 6 byte (`<0xNN>`),
/// 1 normal.
fn token_type(tokenizer: &Llama2cTokenizer, i: usize) -> i32 {
    let id = Some(i as u32);
    if i == 0 {
        2
    } else if id == tokenizer.bos_id() || id == tokenizer.eos_id() {
        3
    } else if is_byte_piece(&tokenizer.pieces[i]) {
        6
    } else {
        1
    }
}

/// A tensor to write under llama.cpp's name.
struct GgufTensor<'a> {
    name: String,
    /// The values, q/k rows already in the file's layout.
    tensor: Cow<'a, HostTensor>,
    /// The matrix it holds (`None` for 1-D norms, biases, `rope_freqs.weight`, which are stored
    /// as F32 whatever the dtype).
    matrix: Option<GgufMatrix>,
    /// `qwen2` q/k: the heads whose rows were permuted to the rotate-half layout.
    rope_heads: Option<usize>,
}

/// Every tensor in file order, under llama.cpp's names; `qwen2` q/k rows in the rotate-half
/// layout; RoPE scaling as `rope_freqs.weight`.
fn gguf_tensors<'a>(path: &Path, model: &'a HostModel, qwen2: bool) -> Result<Vec<GgufTensor<'a>>, LoadError> {
    let a = &model.arch;
    let rope_rows = |t: &HostTensor, heads: usize| -> HostTensor {
        if qwen2 { permute_rows(t, heads, ToRotateHalf) } else { t.clone() }
    };
    let matrix = |name: String, t: Cow<'a, HostTensor>, m: GgufMatrix| GgufTensor {
        name,
        tensor: t,
        matrix: Some(m),
        rope_heads: None,
    };
    let vector = |name: String, t: Cow<'a, HostTensor>| GgufTensor { name, tensor: t, matrix: None, rope_heads: None };
    let mut tensors =
        vec![matrix("token_embd.weight".into(), Cow::Borrowed(&model.token_embedding), GgufMatrix::TokenEmbedding)];
    if let Some(s) = &a.rope_scaling {
        let factors = match s {
            RopeScaling::FreqFactors { factors } => factors.clone(),
            RopeScaling::Llama3 { .. } => llama3_freq_factors(s, a.head_dim(), a.rope_theta).unwrap_or_default(),
        };
        let t = HostTensor::new(vec![factors.len()], factors)
            .ok_or_else(|| LoadError::invalid(path, "RoPE frequency factors"))?;
        tensors.push(vector("rope_freqs.weight".into(), Cow::Owned(t)));
    }
    for (i, l) in model.layers.iter().enumerate() {
        let b = format!("blk.{i}");
        let lin = |short_name: &'static str| GgufMatrix::Linear { layer: i, short_name };
        let rope_heads = |heads: usize| qwen2.then_some(heads);
        tensors.push(vector(format!("{b}.attn_norm.weight"), Cow::Borrowed(&l.attn_norm)));
        tensors.push(GgufTensor {
            rope_heads: rope_heads(a.n_heads),
            ..matrix(format!("{b}.attn_q.weight"), Cow::Owned(rope_rows(&l.wq, a.n_heads)), lin("self_attn.q_proj"))
        });
        tensors.push(GgufTensor {
            rope_heads: rope_heads(a.n_kv_heads),
            ..matrix(format!("{b}.attn_k.weight"), Cow::Owned(rope_rows(&l.wk, a.n_kv_heads)), lin("self_attn.k_proj"))
        });
        tensors.push(matrix(format!("{b}.attn_v.weight"), Cow::Borrowed(&l.wv), lin("self_attn.v_proj")));
        if let (Some(bq), Some(bk), Some(bv)) = (&l.bq, &l.bk, &l.bv) {
            tensors.push(vector(format!("{b}.attn_q.bias"), Cow::Owned(rope_rows(bq, a.n_heads))));
            tensors.push(vector(format!("{b}.attn_k.bias"), Cow::Owned(rope_rows(bk, a.n_kv_heads))));
            tensors.push(vector(format!("{b}.attn_v.bias"), Cow::Borrowed(bv)));
        }
        tensors.push(matrix(format!("{b}.attn_output.weight"), Cow::Borrowed(&l.wo), lin("self_attn.o_proj")));
        tensors.push(vector(format!("{b}.ffn_norm.weight"), Cow::Borrowed(&l.ffn_norm)));
        tensors.push(matrix(format!("{b}.ffn_gate.weight"), Cow::Borrowed(&l.w_gate), lin("mlp.gate_proj")));
        tensors.push(matrix(format!("{b}.ffn_up.weight"), Cow::Borrowed(&l.w_up), lin("mlp.up_proj")));
        tensors.push(matrix(format!("{b}.ffn_down.weight"), Cow::Borrowed(&l.w_down), lin("mlp.down_proj")));
    }
    tensors.push(vector("output_norm.weight".into(), Cow::Borrowed(&model.final_norm)));
    if let Some(o) = &model.output {
        tensors.push(matrix("output.weight".into(), Cow::Borrowed(o), GgufMatrix::Output));
    }
    Ok(tensors)
}

/// The file: header (magic, version 3, counts), metadata, tensor infos, then the data section
/// (aligned to [`ALIGNMENT`], each tensor at an aligned offset).
fn gguf_bytes(
    path: &Path,
    kv: &Kv,
    tensors: &[GgufTensor<'_>],
    dtype: WriteDtype,
    store: &dyn Fn(GgufMatrix) -> Option<GgufStored>,
) -> Result<Vec<u8>, LoadError> {
    let mut infos = Vec::new();
    let mut data = Vec::new();
    for GgufTensor { name, tensor, matrix, rope_heads } in tensors {
        let (ty, bytes) = match matrix.and_then(store) {
            Some(stored) => (stored.ggml_type, stored_rows(path, name, tensor, stored, *rope_heads)?),
            None if matrix.is_none() || dtype == WriteDtype::F32 => (GGML_F32, WriteDtype::F32.bytes(tensor)),
            None => (GGML_F16, WriteDtype::F16.bytes(tensor)),
        };
        data.resize(data.len().next_multiple_of(ALIGNMENT), 0);
        Kv::str_raw(&mut infos, name);
        infos.extend((tensor.shape.len() as u32).to_le_bytes());
        for d in tensor.shape.iter().rev() {
            infos.extend((*d as u64).to_le_bytes());
        }
        infos.extend(ty.to_le_bytes());
        infos.extend((data.len() as u64).to_le_bytes());
        data.extend(bytes);
    }
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend(kv.0.to_le_bytes());
    out.extend(&kv.1);
    out.extend(&infos);
    out.resize(out.len().next_multiple_of(ALIGNMENT), 0);
    out.extend(data);
    Ok(out)
}

/// A stored matrix's bytes, checked against its shape and type, rows permuted to the rotate-half
/// layout when `rope_heads` is set (`qwen2` q/k).
///
/// # Shapes
/// - `tensor`: `[rows, cols]`; `stored.bytes`: `rows` rows of `cols / block_size * type_size`
///   bytes (`2 * cols` for F16).
fn stored_rows(
    path: &Path,
    name: &str,
    tensor: &HostTensor,
    stored: GgufStored,
    rope_heads: Option<usize>,
) -> Result<Vec<u8>, LoadError> {
    let bad = |m: String| LoadError::invalid(path, format!("tensor {name}: {m}"));
    let [rows, cols] = tensor.shape[..] else {
        return Err(bad(format!("a stored tensor must be a matrix, not {:?}", tensor.shape)));
    };
    let row_bytes = match stored.ggml_type {
        GGML_F16 => Some(2 * cols),
        id => match GgmlType::from_gguf_id(id) {
            Some(t) if cols.is_multiple_of(t.block_size()) => Some(cols / t.block_size() * t.type_size()),
            Some(t) => {
                return Err(bad(format!(
                    "{cols} columns are not whole {} blocks of {}",
                    t.gguf_name(),
                    t.block_size()
                )));
            }
            None => None,
        },
    };
    let Some(row_bytes) = row_bytes else {
        return Err(bad(format!("ggml_type {} is not F16 or a block type qdrift reads", stored.ggml_type)));
    };
    if rows.checked_mul(row_bytes) != Some(stored.bytes.len()) {
        return Err(bad(format!("{} bytes stored for {rows} rows of {row_bytes} bytes", stored.bytes.len())));
    }
    let Some(heads) = rope_heads else { return Ok(stored.bytes) };
    let order = rotate_half_row_order(heads, rows / heads.max(1));
    Ok(order.iter().flat_map(|&r| &stored.bytes[r * row_bytes..(r + 1) * row_bytes]).copied().collect())
}
