//! [`read_hf_folder`]: a Hugging Face folder into a [`LoadedModel`]. `config.json` gives the
//! architecture (`config.rs`), the safetensors files the weights (`shards.rs`; each linear layer
//! of a quantized folder dequantized by `quant/`), un-permuted from the rotate-half to the
//! interleaved RoPE layout; `tokenizer.json` with `tokenizer_config.json` and
//! `generation_config.json` the tokenizer and its special tokens (`tokenizer.rs`).

use std::path::Path;

use serde_json::Value;

use super::config::parse_config;
use super::quant::HfQuant;
use super::shards::Shards;
use super::tokenizer::{HfTokenizer, first_encoded_id, read_tokenizer_json};
use crate::LoadError;
use crate::loaded::{LoadedModel, ModelFormat, check_vocab};
use crate::rope_layout::RopeLayout::ToInterleaved;
use crate::rope_layout::permute_rows;
use crate::storage::{SizeOverflow, SourceStorage, source_storage};
use qdrift_weights::{Ffn, HostModel, HostTensor, LayerWeights, Mlp, ModelArch};

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
    let config = crate::input::read_json(&config_path, crate::input::JSON)?;
    let arch = parse_config(&config_path, &config)?;
    let quant = super::quant::read_quant_config(dir, &config_path, &config)?;
    let shards = Shards::open(dir)?;
    check_layer_count(&config_path, &shards, &arch)?;
    let model = build_model(&shards, quant.as_ref(), arch)?;
    let source_storage = match &quant {
        Some(q) => Some(quantized_storage(&shards, q, &model).map_err(|e| LoadError::Overflow {
            path: dir.to_path_buf(),
            quantity: e.quantity.to_string(),
            inputs: format!("{} tensors", shards.tensor_count()),
        })?),
        None => None,
    };

    let tokenizer_path = tokenizer.map_or_else(|| dir.join("tokenizer.json"), Path::to_path_buf);
    if !tokenizer_path.exists() {
        return Err(LoadError::invalid(&tokenizer_path, "not found; a Hugging Face model folder needs tokenizer.json"));
    }
    let inner = read_tokenizer_json(&tokenizer_path)?;
    let tok_config = crate::input::optional_json(&dir.join("tokenizer_config.json"))?;
    let gen_config = crate::input::optional_json(&dir.join("generation_config.json"))?;
    let token_id = |v: Option<&Value>| v.and_then(token_content).and_then(|t| inner.token_to_id(t));
    let bos =
        token_id(tok_config.as_ref().and_then(|c| c.get("bos_token"))).or_else(|| first_id(config.get("bos_token_id")));
    let eos = gen_config
        .as_ref()
        .and_then(|g| first_id(g.get("eos_token_id")))
        .or_else(|| token_id(tok_config.as_ref().and_then(|c| c.get("eos_token"))))
        .or_else(|| first_id(config.get("eos_token_id")));
    let wants_bos = tok_config.as_ref().and_then(|c| c.get("add_bos_token")).and_then(Value::as_bool) == Some(true);
    let pipeline_adds_bos = bos.is_some() && first_encoded_id(&inner, "a") == bos;
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

/// The stored bytes of a quantized folder for `qdrift inspect`: each quantized linear layer
/// counted once under the folder's format (`gptq 4-bit g128 v1`, ...) with its `out × in`
/// weights and the bytes of all its stored parts (codes, scales, zero points, `g_idx`, ...);
/// every other tensor under its dtype.
fn quantized_storage(shards: &Shards, quant: &HfQuant, model: &HostModel) -> Result<SourceStorage, SizeOverflow> {
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
    for (name, info) in shards.tensors() {
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
    source_storage(entries.iter().map(|(d, n, b)| (d.as_str(), *n, *b)))
}

/// Tensors every layer has whatever the architecture: seven linears and two norms.
const TENSORS_PER_LAYER: usize = 9;

/// Refuses a `num_hidden_layers` the safetensors files cannot hold, before the layer list is
/// allocated (an absurd count would otherwise abort the process on allocation).
fn check_layer_count(config_path: &Path, shards: &Shards, arch: &ModelArch) -> Result<(), LoadError> {
    let present = shards.tensor_count();
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

fn build_model(shards: &Shards, quant: Option<&HfQuant>, mut arch: ModelArch) -> Result<HostModel, LoadError> {
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
            bq: bias("self_attn.q_proj.bias", q_dim, arch.n_heads)?,
            bk: bias("self_attn.k_proj.bias", kv_dim, arch.n_kv_heads)?,
            bv: bias("self_attn.v_proj.bias", kv_dim, 0)?,
            ffn: Ffn::Dense(Mlp::new(
                lin("mlp.gate_proj", hidden, dim)?,
                lin("mlp.up_proj", hidden, dim)?,
                lin("mlp.down_proj", dim, hidden)?,
            )),
            bo: None,
            q_norm: None,
            k_norm: None,
            sinks: None,
            post_attn_norm: None,
            post_ffn_norm: None,
        });
    }
    let final_norm = shards.require("model.norm.weight", &[dim])?;
    let output = if arch.tied_embeddings { None } else { linear(shards, quant, "lm_head", vocab, dim)? };
    // A checkpoint without lm_head ties it to the embedding whatever config.json says.
    arch.tied_embeddings = output.is_none();
    Ok(HostModel { arch, token_embedding, layers, final_norm, output })
}
