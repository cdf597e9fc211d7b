//! Hugging Face model folders: `config.json`, safetensors weights, `tokenizer.json`.
//!
//! Specs followed:
//! - safetensors: <https://github.com/huggingface/safetensors> (README "Format": `u64` little-endian
//!   header length N, N bytes of JSON `{name: {dtype, shape, data_offsets: [begin, end]}}` with an
//!   optional `__metadata__`, then the byte buffer; offsets are relative to the buffer), parsed
//!   with the `safetensors` crate over a memory map.
//! - sharding: `transformers`' `model.safetensors.index.json` (`weight_map: {tensor: shard file}`).
//! - `config.json`: `transformers`' `LlamaConfig`, `MistralConfig`, `Qwen2Config` (field names and
//!   their defaults: `rms_norm_eps` 1e-6, `rope_theta` 10000, `max_position_embeddings` 2048,
//!   `num_key_value_heads` = `num_attention_heads`, `tie_word_embeddings` false).
//! - tensor names: `transformers`' `modeling_llama.py` (`LlamaForCausalLM`), shared by Mistral and
//!   Qwen2:
//!
//! | [`HostModel`] field | Hugging Face name | shape |
//! |---|---|---|
//! | `token_embedding` | `model.embed_tokens.weight` | `[vocab, dim]` |
//! | `attn_norm` | `model.layers.{i}.input_layernorm.weight` | `[dim]` |
//! | `wq`, `wk`, `wv`, `wo` | `model.layers.{i}.self_attn.{q,k,v,o}_proj.weight` | `[out, in]` |
//! | `bq`, `bk`, `bv` (Qwen2) | `model.layers.{i}.self_attn.{q,k,v}_proj.bias` | `[out]` |
//! | `ffn_norm` | `model.layers.{i}.post_attention_layernorm.weight` | `[dim]` |
//! | `w_gate`, `w_up`, `w_down` | `model.layers.{i}.mlp.{gate,up,down}_proj.weight` | `[out, in]` |
//! | `final_norm` | `model.norm.weight` | `[dim]` |
//! | `output` | `lm_head.weight` (absent or ignored when tied) | `[vocab, dim]` |
//!
//! **RoPE layout.** Hugging Face stores q/k rows in the rotate-half layout (rotation pairs are
//! rows `i` and `i + head_dim/2` of a head); [`HostModel`] uses the interleaved layout (pairs are
//! rows `2i`, `2i+1`). The reader un-permutes q/k weights and biases ([`crate::rotate_half_row_order`],
//! llama.cpp `convert_hf_to_gguf.py`'s `LlamaModel.permute`).
//!
//! **Architectures.** `LlamaForCausalLM` (Llama 2/3, SmolLM, TinyLlama), `MistralForCausalLM`
//! and `Qwen2ForCausalLM`. Mistral's `sliding_window` (when set and smaller than
//! `max_position_embeddings`) caps [`LlamaArch::max_seq_len`]: within the window, sliding-window
//! attention is full causal attention, so the model is exact for every length it accepts.
//! Qwen2's q/k/v biases go to [`crate::LayerWeights::bq`] etc.; Llama 3.1+'s `rope_scaling`
//! (`rope_type = llama3`) to [`LlamaArch::rope_scaling`], as does `rope_parameters` (the form
//! `transformers` ≥ 5 writes, which also carries `rope_theta`). `qdrift-model` applies both.
//! Refused with a message: other architectures, `head_dim` ≠ `hidden_size / num_attention_heads`,
//! `hidden_act` other than `silu`, `attention_bias`/`mlp_bias` on Llama, `rope_scaling` types
//! other than `llama3` and `default`, tensor dtypes other than F32/F16/BF16 outside a
//! quantization config.
//!
//! **Quantized folders.** With a `quantization_config` (GPTQ, AWQ, compressed-tensors, FP8) each
//! linear layer is dequantized by `hf_quant.rs` (which documents and cites every layout) and then,
//! for q/k, permuted: the permutation moves the real rows.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::{Dtype, SafeTensorError, SafeTensors};
use serde_json::Value;

use crate::hf_quant::HfQuant;
use crate::hf_tokenizer::read_tokenizer_json;
use crate::open::check_vocab;
use crate::rope_layout::RopeLayout::ToInterleaved;
use crate::rope_layout::permute_rows;
use crate::{
    HfTokenizer, HostModel, HostTensor, LayerWeights, LlamaArch, LoadError, LoadedModel, ModelFormat, RopeScaling,
};

/// Architectures [`read_hf_folder`] reads, as `config.json` names them.
pub const SUPPORTED_ARCHITECTURES: &str = "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM";

/// Reads a Hugging Face model folder: `config.json`, `model.safetensors` or the shards listed in
/// `model.safetensors.index.json`, and `tokenizer.json` (or `tokenizer`, if given) with
/// `tokenizer_config.json` and `generation_config.json` when present.
///
/// Weights are converted to f32 (F32, F16, BF16 sources), q/k un-permuted to the interleaved
/// RoPE layout. Special tokens: BOS is `tokenizer_config.json`'s `bos_token` (else
/// `config.json`'s `bos_token_id`); EOS the first of `generation_config.json`'s `eos_token_id`,
/// else `tokenizer_config.json`'s `eos_token`, else `config.json`'s `eos_token_id`. Whether BOS
/// is prepended is `tokenizer.json`'s post-processor (as `transformers`' fast tokenizers do),
/// plus BOS when `tokenizer_config.json` says `add_bos_token: true` and the post-processor does
/// not add it.
///
/// # Errors
/// [`LoadError`] naming the file and, for tensors, the tensor and its expected shape: a missing
/// `config.json`/`tokenizer.json`/weights file, an unsupported architecture or option, a corrupt
/// safetensors file, a missing or misshapen tensor, an unsupported dtype,
/// [`LoadError::VocabMismatch`] when the tokenizer's vocabulary differs from the model's.
pub fn read_hf_folder(dir: &Path, tokenizer: Option<&Path>) -> Result<LoadedModel, LoadError> {
    let config_path = dir.join("config.json");
    // `exists`, not `is_file`: a config.json that is a pipe or a device is refused by name below.
    if !config_path.exists() {
        return Err(LoadError::invalid(
            dir,
            "is a folder without config.json; a Hugging Face model folder needs config.json, \
             model.safetensors (or its shards) and tokenizer.json",
        ));
    }
    let config = read_json(&config_path)?;
    let arch = parse_config(&config_path, &config)?;
    let quant = crate::hf_quant::read_quant_config(dir, &config_path, &config)?;
    let shards = Shards::open(dir)?;
    check_layer_count(&config_path, &shards, &arch)?;
    let model = build_model(&shards, quant.as_ref(), arch)?;
    let source_storage = match &quant {
        Some(q) => Some(quantized_storage(&shards, q, &model).map_err(|e| LoadError::Overflow {
            path: dir.to_path_buf(),
            quantity: e.quantity.to_string(),
            inputs: format!("{} tensors", shards.index.len()),
        })?),
        None => None,
    };

    let tokenizer_path = tokenizer.map_or_else(|| dir.join("tokenizer.json"), Path::to_path_buf);
    if !tokenizer_path.exists() {
        return Err(LoadError::invalid(&tokenizer_path, "not found; a Hugging Face model folder needs tokenizer.json"));
    }
    let inner = read_tokenizer_json(&tokenizer_path)?;
    let tok_config = optional_json(&dir.join("tokenizer_config.json"))?;
    let gen_config = optional_json(&dir.join("generation_config.json"))?;
    let token_id = |v: Option<&Value>| v.and_then(token_content).and_then(|t| inner.token_to_id(t));
    let bos =
        token_id(tok_config.as_ref().and_then(|c| c.get("bos_token"))).or_else(|| first_id(config.get("bos_token_id")));
    let eos = gen_config
        .as_ref()
        .and_then(|g| first_id(g.get("eos_token_id")))
        .or_else(|| token_id(tok_config.as_ref().and_then(|c| c.get("eos_token"))))
        .or_else(|| first_id(config.get("eos_token_id")));
    let wants_bos = tok_config.as_ref().and_then(|c| c.get("add_bos_token")).and_then(Value::as_bool) == Some(true);
    let pipeline_adds_bos = bos.is_some() && crate::hf_tokenizer::first_encoded_id(&inner, "a") == bos;
    let tok = HfTokenizer::new(&tokenizer_path, inner, bos, eos, wants_bos && !pipeline_adds_bos)?;
    check_vocab(&tok, &tokenizer_path, &model, dir)?;
    let chat_template = tok_config.as_ref().and_then(|c| c.get("chat_template")).and_then(chat_template);

    Ok(LoadedModel {
        model,
        tokenizer: Box::new(tok),
        path: dir.to_path_buf(),
        tokenizer_path,
        format: ModelFormat::HfSafetensors,
        source_dtypes: shards.dtypes(),
        source_storage,
        chat_template,
        quantization: quant.map(|q| q.summary),
    })
}

fn read_json(path: &Path) -> Result<Value, LoadError> {
    let bytes = crate::input::read_file(path, crate::input::MAX_JSON_BYTES)?;
    serde_json::from_slice(&bytes).map_err(|e| LoadError::invalid(path, format!("not valid JSON: {e}")))
}

fn optional_json(path: &Path) -> Result<Option<Value>, LoadError> {
    if path.exists() { read_json(path).map(Some) } else { Ok(None) }
}

/// A special token in `tokenizer_config.json`: a string or `{"content": ...}` (`AddedToken`).
fn token_content(v: &Value) -> Option<&str> {
    v.as_str().or_else(|| v.get("content").and_then(Value::as_str))
}

/// An id or the first of a list of ids.
fn first_id(v: Option<&Value>) -> Option<u32> {
    let v = v?;
    let v = v.as_array().and_then(|a| a.first()).unwrap_or(v);
    v.as_u64().and_then(|i| u32::try_from(i).ok())
}

/// A string, or the `default` entry of a list of `{name, template}`.
fn chat_template(v: &Value) -> Option<String> {
    if let Some(s) = v.as_str() {
        return Some(s.to_string());
    }
    v.as_array()?
        .iter()
        .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
        .and_then(|t| t.get("template"))
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// `config.json`'s fields, read with `transformers`' defaults; errors name the file.
struct Config<'a> {
    path: &'a Path,
    c: &'a Value,
}

impl Config<'_> {
    fn bad(&self, m: String) -> LoadError {
        LoadError::invalid(self.path, m)
    }

    /// A non-negative integer, else `default` (absent or `null`); missing without a default is an
    /// error.
    fn int(&self, key: &str, default: Option<usize>) -> Result<usize, LoadError> {
        match self.c.get(key) {
            Some(Value::Null) | None => default.ok_or_else(|| self.bad(format!("{key} is missing"))),
            Some(v) => v
                .as_u64()
                .and_then(|v| usize::try_from(v).ok())
                .ok_or_else(|| self.bad(format!("{key} is {v}, not a non-negative integer"))),
        }
    }

    /// A number, else `default` (absent or `null`).
    fn float(&self, key: &str, default: f32) -> Result<f32, LoadError> {
        match self.c.get(key) {
            Some(Value::Null) | None => Ok(default),
            Some(v) => v.as_f64().map(|f| f as f32).ok_or_else(|| self.bad(format!("{key} is {v}, not a number"))),
        }
    }

    /// True only when the key is `true`.
    fn flag(&self, key: &str) -> bool {
        self.c.get(key).and_then(Value::as_bool) == Some(true)
    }

    /// A present, non-`null` value.
    fn get(&self, key: &str) -> Option<&Value> {
        self.c.get(key).filter(|v| !v.is_null())
    }
}

/// The hyper-parameters of `config.json`: architecture → refused options → context → RoPE →
/// shapes.
fn parse_config(path: &Path, c: &Value) -> Result<LlamaArch, LoadError> {
    let config = Config { path, c };
    let architecture = config_architecture(&config)?;
    let dim = config.int("hidden_size", None)?;
    let n_heads = config.int("num_attention_heads", None)?;
    check_options(&config, &architecture)?;
    let max_seq_len = max_seq_len(&config, &architecture)?;
    let (rope_theta, rope_scaling) = rope(&config)?;
    let arch = LlamaArch {
        architecture,
        dim,
        hidden_dim: config.int("intermediate_size", None)?,
        n_layers: config.int("num_hidden_layers", None)?,
        n_heads,
        n_kv_heads: config.int("num_key_value_heads", Some(n_heads))?,
        vocab_size: config.int("vocab_size", None)?,
        max_seq_len,
        norm_eps: config.float("rms_norm_eps", 1e-6)?,
        rope_theta,
        tied_embeddings: config.flag("tie_word_embeddings"),
        rope_scaling,
    };
    check_head_dim(&config, dim, n_heads)?;
    arch.validate().map_err(|e| config.bad(format!("inconsistent hyper-parameters: {e}")))?;
    Ok(arch)
}

/// `architectures[0]`, else the class `model_type` implies; one of [`SUPPORTED_ARCHITECTURES`].
fn config_architecture(config: &Config<'_>) -> Result<String, LoadError> {
    let c = config.c;
    let architecture = c
        .get("architectures")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| {
            c.get("model_type").and_then(Value::as_str).and_then(|t| match t {
                "llama" => Some("LlamaForCausalLM".to_string()),
                "mistral" => Some("MistralForCausalLM".to_string()),
                "qwen2" => Some("Qwen2ForCausalLM".to_string()),
                _ => None,
            })
        })
        .ok_or_else(|| {
            let t = c.get("model_type").and_then(Value::as_str).unwrap_or("(none)");
            config.bad(format!(
                "unsupported architecture: no architectures[0] and model_type {t}; supported: {SUPPORTED_ARCHITECTURES}"
            ))
        })?;
    if !matches!(architecture.as_str(), "LlamaForCausalLM" | "MistralForCausalLM" | "Qwen2ForCausalLM") {
        return Err(
            config.bad(format!("unsupported architecture {architecture}; supported: {SUPPORTED_ARCHITECTURES}"))
        );
    }
    Ok(architecture)
}

/// Refuses an activation other than SiLU and Llama's optional attention/MLP biases.
fn check_options(config: &Config<'_>, architecture: &str) -> Result<(), LoadError> {
    if let Some(act) = config.c.get("hidden_act").and_then(Value::as_str)
        && act != "silu"
    {
        return Err(config.bad(format!("hidden_act {act} is not supported; supported: silu (SwiGLU)")));
    }
    if architecture == "LlamaForCausalLM" && (config.flag("attention_bias") || config.flag("mlp_bias")) {
        return Err(config.bad("attention_bias/mlp_bias = true is not supported for LlamaForCausalLM".into()));
    }
    Ok(())
}

/// `max_position_embeddings`, capped by a sliding window where one applies.
fn max_seq_len(config: &Config<'_>, architecture: &str) -> Result<usize, LoadError> {
    let max_seq_len = config.int("max_position_embeddings", Some(2048))?;
    // Mistral: full attention equals sliding-window attention for contexts within the window.
    let sliding = match architecture {
        "MistralForCausalLM" => true,
        "Qwen2ForCausalLM" => config.flag("use_sliding_window"),
        _ => false,
    };
    let window = config.c.get("sliding_window").and_then(Value::as_u64).and_then(|w| usize::try_from(w).ok());
    Ok(match window {
        Some(w) if sliding => max_seq_len.min(w),
        _ => max_seq_len,
    })
}

/// RoPE's theta and scaling. `transformers` ≥ 5 writes `rope_parameters` (`{rope_type,
/// rope_theta, ...}`) in place of `rope_theta` and `rope_scaling`; earlier versions write those
/// two, which win when both are present.
fn rope(config: &Config<'_>) -> Result<(f32, Option<RopeScaling>), LoadError> {
    let rope_parameters = config.get("rope_parameters");
    let rope_scaling = match config.get("rope_scaling") {
        Some(r) => parse_rope_scaling(r).map_err(|m| config.bad(format!("rope_scaling: {m}")))?,
        None => match rope_parameters {
            Some(r) => parse_rope_scaling(r).map_err(|m| config.bad(format!("rope_parameters: {m}")))?,
            None => None,
        },
    };
    let theta =
        config.get("rope_theta").or_else(|| rope_parameters.and_then(|r| r.get("rope_theta"))).filter(|v| !v.is_null());
    let rope_theta = match theta {
        Some(v) => {
            v.as_f64().map(|f| f as f32).ok_or_else(|| config.bad(format!("rope_theta is {v}, not a number")))?
        }
        None => 10000.0,
    };
    Ok((rope_theta, rope_scaling))
}

/// Refuses a `head_dim` other than `hidden_size / num_attention_heads`.
fn check_head_dim(config: &Config<'_>, dim: usize, n_heads: usize) -> Result<(), LoadError> {
    let Some(default_head_dim) = dim.checked_div(n_heads) else {
        return Ok(());
    };
    let head_dim = config.int("head_dim", Some(default_head_dim))?;
    if head_dim.checked_mul(n_heads) != Some(dim) {
        return Err(config.bad(format!(
            "head_dim {head_dim} × num_attention_heads {n_heads} ≠ hidden_size {dim}; \
             qdrift supports head_dim = hidden_size / num_attention_heads only"
        )));
    }
    Ok(())
}

/// `rope_scaling` (or `rope_parameters`) of `transformers`' `modeling_rope_utils.py`:
/// `rope_type = "llama3"`, or `"default"` (plain RoPE, `None`).
fn parse_rope_scaling(r: &Value) -> Result<Option<RopeScaling>, String> {
    let kind = r.get("rope_type").or_else(|| r.get("type")).and_then(Value::as_str).unwrap_or("(none)");
    match kind {
        "default" => return Ok(None),
        "llama3" => {}
        _ => {
            return Err(format!("type {kind} is not supported; supported: default, llama3"));
        }
    }
    let num = |k: &str| r.get(k).and_then(Value::as_f64).ok_or_else(|| format!("{k} is missing or not a number"));
    let original = r
        .get("original_max_position_embeddings")
        .and_then(Value::as_u64)
        .and_then(|v| usize::try_from(v).ok())
        .ok_or("original_max_position_embeddings is missing or not a non-negative integer")?;
    Ok(Some(RopeScaling::Llama3 {
        factor: num("factor")? as f32,
        low_freq_factor: num("low_freq_factor")? as f32,
        high_freq_factor: num("high_freq_factor")? as f32,
        original_max_position_embeddings: original,
    }))
}

/// The memory-mapped safetensors files of a folder and which holds each tensor.
pub(crate) struct Shards {
    files: Vec<ShardFile>,
    /// Tensor name → index in `files`.
    index: HashMap<String, usize>,
}

/// One safetensors file, mapped, with its header parsed once.
struct ShardFile {
    path: PathBuf,
    map: memmap2::Mmap,
    /// Where the byte buffer starts (8 + header length).
    data_start: usize,
    /// Tensors in file order.
    tensors: Vec<(String, TensorInfo)>,
}

impl Shards {
    fn open(dir: &Path) -> Result<Self, LoadError> {
        let single = dir.join("model.safetensors");
        let index_path = dir.join("model.safetensors.index.json");
        let names: Vec<PathBuf> = if single.exists() {
            vec![single]
        } else if index_path.exists() {
            let index = read_json(&index_path)?;
            let map = index
                .get("weight_map")
                .and_then(Value::as_object)
                .ok_or_else(|| LoadError::invalid(&index_path, "has no weight_map object"))?;
            let mut files: Vec<&str> = Vec::new();
            for (tensor, file) in map {
                let file = file
                    .as_str()
                    .filter(|f| !f.contains('/') && !f.contains('\\') && *f != ".." && !f.is_empty())
                    .ok_or_else(|| {
                        LoadError::invalid(&index_path, format!("weight_map[{tensor}] = {file} is not a file name"))
                    })?;
                if !files.contains(&file) {
                    files.push(file);
                }
            }
            files.sort_unstable();
            files.into_iter().map(|f| dir.join(f)).collect()
        } else {
            return Err(LoadError::invalid(
                dir,
                "has neither model.safetensors nor model.safetensors.index.json (only safetensors weights are read)",
            ));
        };
        let mut files = Vec::with_capacity(names.len());
        let mut index = HashMap::new();
        for (i, path) in names.into_iter().enumerate() {
            // Checked before opening: opening a named pipe blocks, and a device maps endlessly.
            crate::input::regular_file_len(&path)?;
            let file = std::fs::File::open(&path).map_err(|e| LoadError::io(&path, e))?;
            let opened = file.metadata().map_err(|e| LoadError::io(&path, e))?;
            crate::input::check_regular(&path, opened.file_type())?;
            // SAFETY: the map is read-only and private; as for every memory-mapped reader, a file
            // truncated by another process while mapped may fault. Model files are not rewritten
            // in place by the tools that produce them (they write and rename).
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| LoadError::io(&path, e))?;
            let (header_len, meta) = parse_safetensors(&path, &map)?;
            let data_start = 8 + header_len;
            let mut tensors: Vec<(String, TensorInfo)> =
                meta.tensors().into_iter().map(|(n, t)| (n, t.clone())).collect();
            tensors.sort_by_key(|(_, t)| t.data_offsets);
            for (name, _) in &tensors {
                if let Some(prev) = index.insert(name.clone(), i) {
                    let p: &ShardFile = &files[prev];
                    return Err(LoadError::invalid(&path, format!("tensor {name} is also in {}", p.path.display())));
                }
            }
            files.push(ShardFile { path, map, data_start, tensors });
        }
        Ok(Self { files, index })
    }

    /// Whether any file holds `name`.
    pub(crate) fn has(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// The stored bytes of `name` with its dtype and shape; `None` when no file has it.
    pub(crate) fn raw(&self, name: &str) -> Option<Raw<'_>> {
        let f = &self.files[*self.index.get(name)?];
        let (_, info) = f.tensors.iter().find(|(n, _)| n == name)?;
        // `parse_safetensors` validated every range against the file.
        let (begin, end) = info.data_offsets;
        let bytes = &f.map[f.data_start + begin..f.data_start + end];
        Some(Raw { path: &f.path, dtype: info.dtype, shape: &info.shape, bytes })
    }

    /// The stored dtype of `name`.
    pub(crate) fn dtype(&self, name: &str) -> Option<Dtype> {
        self.raw(name).map(|r| r.dtype)
    }

    /// The stored shape of `name`.
    pub(crate) fn shape(&self, name: &str) -> Option<&[usize]> {
        self.raw(name).map(|r| r.shape)
    }

    /// The file holding `name`.
    pub(crate) fn path_of(&self, name: &str) -> Option<&Path> {
        self.raw(name).map(|r| r.path)
    }

    /// The first weights file, for errors about a tensor no file has.
    pub(crate) fn first_path(&self) -> &Path {
        self.files.first().map_or(Path::new("."), |f| f.path.as_path())
    }

    fn dtypes(&self) -> Vec<(String, String)> {
        self.files.iter().flat_map(|f| f.tensors.iter().map(|(n, t)| (n.clone(), format!("{:?}", t.dtype)))).collect()
    }

    /// The tensor `name` as f32 of `shape`, or `None` when no file has it.
    pub(crate) fn get(&self, name: &str, shape: &[usize]) -> Result<Option<HostTensor>, LoadError> {
        let Some(&i) = self.index.get(name) else {
            return Ok(None);
        };
        let f = &self.files[i];
        let Some((_, info)) = f.tensors.iter().find(|(n, _)| n == name) else {
            return Ok(None);
        };
        if info.shape != shape {
            return Err(LoadError::invalid(
                &f.path,
                format!("tensor {name} has shape {:?}; expected {shape:?}", info.shape),
            ));
        }
        // `parse_safetensors` validated every range against the file.
        let (begin, end) = info.data_offsets;
        let bytes = &f.map[f.data_start + begin..f.data_start + end];
        let data = to_f32(info.dtype, bytes).map_err(|m| LoadError::invalid(&f.path, format!("tensor {name}: {m}")))?;
        crate::input::check_finite(&f.path, name, &data)?;
        HostTensor::new(shape.to_vec(), data).map(Some).ok_or_else(|| {
            LoadError::invalid(&f.path, format!("tensor {name}: byte count does not match shape {shape:?}"))
        })
    }

    fn require(&self, name: &str, shape: &[usize]) -> Result<HostTensor, LoadError> {
        self.get(name, shape)?.ok_or_else(|| {
            let files: Vec<String> = self.files.iter().map(|f| f.path.display().to_string()).collect();
            LoadError::invalid(
                self.files.first().map_or(Path::new("."), |f| f.path.as_path()),
                format!("tensor {name} is missing; expected shape {shape:?} (searched {})", files.join(", ")),
            )
        })
    }
}

/// One stored tensor: its file, dtype, shape and bytes (validated against the file).
pub(crate) struct Raw<'a> {
    /// The file holding it.
    pub path: &'a Path,
    /// The stored dtype.
    pub dtype: Dtype,
    /// The stored shape.
    pub shape: &'a [usize],
    /// Its bytes, `shape.product() × dtype size` of them.
    pub bytes: &'a [u8],
}

/// Parses a safetensors buffer, turning the library's terse errors into messages for people.
/// Returns the header length and the parsed header; every tensor's range is validated.
pub(crate) fn parse_safetensors(path: &Path, bytes: &[u8]) -> Result<(usize, Metadata), LoadError> {
    let Some(len) = bytes.get(..8) else {
        return Err(LoadError::truncated(
            path,
            format!("the 8-byte header length, the file has {} bytes (not a safetensors file?)", bytes.len()),
        ));
    };
    let mut n = [0u8; 8];
    n.copy_from_slice(len);
    let n = u64::from_le_bytes(n);
    let rest = (bytes.len() - 8) as u64;
    if n > rest {
        return Err(LoadError::truncated(
            path,
            format!(
                "the header declares {n} bytes of JSON but only {rest} bytes follow the length (corrupt or not safetensors)"
            ),
        ));
    }
    SafeTensors::read_metadata(bytes).map_err(|e| {
        let header = &bytes[8..8 + n as usize];
        let detail = diagnose_header(header, rest - n).unwrap_or_else(|| describe(&e, bytes.len()));
        LoadError::invalid(path, detail)
    })
}

/// Names the tensor whose byte range contradicts its dtype and shape, or the byte counts of a
/// truncated buffer; `None` when the header is not readable JSON or nothing specific is found.
fn diagnose_header(header: &[u8], buffer_len: u64) -> Option<String> {
    let v: Value = serde_json::from_slice(header).ok()?;
    let mut end_max = 0u64;
    for (name, t) in v.as_object()? {
        if name == "__metadata__" {
            continue;
        }
        let dtype = t.get("dtype")?.as_str()?;
        let size: u64 = match dtype {
            "F64" | "I64" | "U64" => 8,
            "F32" | "I32" | "U32" => 4,
            "F16" | "BF16" | "I16" | "U16" => 2,
            "BOOL" | "U8" | "I8" | "F8_E4M3" | "F8_E5M2" => 1,
            _ => return None,
        };
        let shape: Vec<u64> = t.get("shape")?.as_array()?.iter().map(Value::as_u64).collect::<Option<_>>()?;
        let offsets = t.get("data_offsets")?.as_array()?;
        let (begin, end) = (offsets.first()?.as_u64()?, offsets.get(1)?.as_u64()?);
        let want = shape.iter().try_fold(size, |n, &d| n.checked_mul(d))?;
        if end < begin || end - begin != want {
            return Some(format!(
                "tensor {name}: data_offsets [{begin}, {end}] hold {} bytes but dtype {dtype} and shape {shape:?} need {want}",
                end.wrapping_sub(begin)
            ));
        }
        if end > buffer_len {
            return Some(format!(
                "tensor {name}: data_offsets [{begin}, {end}] run past the end of the data buffer ({buffer_len} bytes; \
                 truncated file?)"
            ));
        }
        end_max = end_max.max(end);
    }
    (end_max != buffer_len).then(|| {
        format!("the tensors' data ends at byte {end_max} of the data buffer but the buffer has {buffer_len} bytes")
    })
}

fn describe(e: &SafeTensorError, file_len: usize) -> String {
    match e {
        SafeTensorError::MetadataIncompleteBuffer => format!(
            "the tensors' data offsets do not end at the end of the file ({file_len} bytes): truncated, or bytes past the last tensor"
        ),
        SafeTensorError::InvalidOffset(name) => {
            format!("tensor {name}: data_offsets are out of range or overlap another tensor")
        }
        SafeTensorError::TensorInvalidInfo => "a tensor's data_offsets do not match its dtype and shape".to_string(),
        SafeTensorError::InvalidHeaderDeserialization(j) => {
            format!("the header is not valid safetensors JSON: {j}")
        }
        SafeTensorError::InvalidHeader(u) => format!("the header is not UTF-8: {u}"),
        SafeTensorError::HeaderTooLarge => "the header is larger than the 100 MB safetensors allows".to_string(),
        SafeTensorError::ValidationOverflow => "a tensor's shape overflows".to_string(),
        other => format!("not a valid safetensors file: {other}"),
    }
}

/// Little-endian F32/F16/BF16 bytes to f32.
pub(crate) fn to_f32(dtype: Dtype, bytes: &[u8]) -> Result<Vec<f32>, String> {
    use crate::weights::{LeFloat, le_floats};
    Ok(match dtype {
        Dtype::F32 => le_floats(LeFloat::F32, bytes),
        Dtype::F16 => le_floats(LeFloat::F16, bytes),
        Dtype::BF16 => le_floats(LeFloat::BF16, bytes),
        Dtype::F8_E4M3 | Dtype::F8_E5M2 => {
            return Err(format!(
                "dtype {dtype:?} without a quantization_config in config.json (FP8 weights need their scales); \
                 supported: F32, F16, BF16"
            ));
        }
        other => {
            return Err(format!("dtype {other:?} is not supported; supported: F32, F16, BF16"));
        }
    })
}

/// The stored bytes of a quantized folder for `qdrift inspect`: each quantized linear layer
/// counted once under the folder's format (`gptq 4-bit g128 v1`, ...) with its `out × in`
/// weights and the bytes of all its stored parts (codes, scales, zero points, `g_idx`, ...);
/// every other tensor under its dtype.
fn quantized_storage(
    shards: &Shards,
    quant: &HfQuant,
    model: &HostModel,
) -> Result<crate::inspect::SourceStorage, crate::inspect::SizeOverflow> {
    let mut modules: Vec<(String, u64)> = Vec::new();
    for (i, layer) in model.layers.iter().enumerate() {
        for (name, w) in layer.linears() {
            modules.push((format!("model.layers.{i}.{name}"), w.data.len() as u64));
        }
    }
    if let Some(o) = &model.output {
        modules.push(("lm_head".to_string(), o.data.len() as u64));
    }
    modules.retain(|(m, _)| quant.stores_quantized(shards, m));
    let kind = quant.summary.weights.as_str();
    let mut entries: Vec<(String, u64, u64)> = modules.iter().map(|(_, n)| (kind.to_string(), *n, 0)).collect();
    for f in &shards.files {
        for (name, info) in &f.tensors {
            let (begin, end) = info.data_offsets;
            let bytes = (end - begin) as u64;
            let owner = name.rsplit_once('.').and_then(|(m, _)| modules.iter().position(|(x, _)| x == m));
            match owner {
                Some(k) => entries[k].2 += bytes,
                None => {
                    let n = info.shape.iter().map(|&d| d as u64).product();
                    entries.push((format!("{:?}", info.dtype), n, bytes));
                }
            }
        }
    }
    crate::inspect::source_storage(entries.iter().map(|(d, n, b)| (d.as_str(), *n, *b)))
}

/// Tensors every layer has whatever the architecture: seven linears and two norms.
const TENSORS_PER_LAYER: usize = 9;

/// Refuses a `num_hidden_layers` the safetensors files cannot hold, before the layer list is
/// allocated (an absurd count would otherwise abort the process on allocation).
fn check_layer_count(config_path: &Path, shards: &Shards, arch: &LlamaArch) -> Result<(), LoadError> {
    let present = shards.index.len();
    if arch.n_layers.checked_mul(TENSORS_PER_LAYER).is_none_or(|needed| needed > present) {
        return Err(LoadError::invalid(
            config_path,
            format!(
                "num_hidden_layers {} needs at least {TENSORS_PER_LAYER} tensors per layer but the safetensors files \
                 hold {present} tensors in all",
                arch.n_layers
            ),
        ));
    }
    Ok(())
}

/// The linear layer `module` as f32 `[out, inp]` in the checkpoint's row order: dequantized when
/// the folder is quantized, else its `.weight`.
fn linear(
    shards: &Shards,
    quant: Option<&HfQuant>,
    module: &str,
    out: usize,
    inp: usize,
) -> Result<Option<HostTensor>, LoadError> {
    match quant {
        Some(q) => q.linear(shards, module, out, inp),
        None => shards.get(&format!("{module}.weight"), &[out, inp]),
    }
}

fn build_model(shards: &Shards, quant: Option<&HfQuant>, mut arch: LlamaArch) -> Result<HostModel, LoadError> {
    let (dim, hidden, vocab) = (arch.dim, arch.hidden_dim, arch.vocab_size);
    let (q_dim, kv_dim) = (arch.n_heads * arch.head_dim(), arch.kv_dim());
    let qwen = arch.architecture == "Qwen2ForCausalLM";
    let token_embedding = shards.require("model.embed_tokens.weight", &[vocab, dim])?;
    let mut layers = Vec::with_capacity(arch.n_layers);
    for i in 0..arch.n_layers {
        let p = format!("model.layers.{i}");
        let t = |name: &str, shape: &[usize]| shards.require(&format!("{p}.{name}"), shape);
        // Dequantized first, then (q, k) permuted: the permutation moves real rows.
        let lin = |name: &str, out: usize, inp: usize| -> Result<HostTensor, LoadError> {
            let module = format!("{p}.{name}");
            linear(shards, quant, &module, out, inp)?.ok_or_else(|| {
                LoadError::invalid(
                    shards.first_path(),
                    format!(
                        "tensor {module}.weight is missing; expected shape [{out}, {inp}] (or its quantized parts)"
                    ),
                )
            })
        };
        let bias = |name: &str, n: usize, heads: usize| -> Result<Option<HostTensor>, LoadError> {
            let b = if qwen { Some(t(name, &[n])?) } else { None };
            Ok(b.map(|b| if heads > 0 { permute_rows(&b, heads, ToInterleaved) } else { b }))
        };
        layers.push(LayerWeights {
            attn_norm: t("input_layernorm.weight", &[dim])?,
            wq: permute_rows(&lin("self_attn.q_proj", q_dim, dim)?, arch.n_heads, ToInterleaved),
            wk: permute_rows(&lin("self_attn.k_proj", kv_dim, dim)?, arch.n_kv_heads, ToInterleaved),
            wv: lin("self_attn.v_proj", kv_dim, dim)?,
            wo: lin("self_attn.o_proj", dim, q_dim)?,
            ffn_norm: t("post_attention_layernorm.weight", &[dim])?,
            w_gate: lin("mlp.gate_proj", hidden, dim)?,
            w_up: lin("mlp.up_proj", hidden, dim)?,
            w_down: lin("mlp.down_proj", dim, hidden)?,
            bq: bias("self_attn.q_proj.bias", q_dim, arch.n_heads)?,
            bk: bias("self_attn.k_proj.bias", kv_dim, arch.n_kv_heads)?,
            bv: bias("self_attn.v_proj.bias", kv_dim, 0)?,
        });
    }
    let final_norm = shards.require("model.norm.weight", &[dim])?;
    let output = if arch.tied_embeddings { None } else { linear(shards, quant, "lm_head", vocab, dim)? };
    // A checkpoint without lm_head ties it to the embedding whatever config.json says.
    arch.tied_embeddings = output.is_none();
    Ok(HostModel { arch, token_embedding, layers, final_norm, output })
}
