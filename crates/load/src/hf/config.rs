//! `config.json` → [`ModelArch`]: `transformers`' `LlamaConfig`, `MistralConfig` and
//! `Qwen2Config` (field names and their defaults: `rms_norm_eps` 1e-6, `rope_theta` 10000,
//! `max_position_embeddings` 2048, `num_key_value_heads` = `num_attention_heads`,
//! `tie_word_embeddings` false), Mistral's and Qwen2's sliding window, Llama 3.1+'s `rope_scaling`
//! and `transformers` ≥ 5's `rope_parameters`, and the options qdrift refuses (see
//! [`crate::read_hf_folder`]).

use std::path::Path;

use serde_json::Value;

use crate::LoadError;
use qdrift_weights::{BlockSpec, ModelArch, RopeScaling};

/// Architectures [`read_hf_folder`] reads, as `config.json` names them.
pub const SUPPORTED_ARCHITECTURES: &str = "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM";

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
pub(crate) fn parse_config(path: &Path, c: &Value) -> Result<ModelArch, LoadError> {
    let config = Config { path, c };
    let architecture = config_architecture(&config)?;
    let dim = config.int("hidden_size", None)?;
    let n_heads = config.int("num_attention_heads", None)?;
    check_options(&config, &architecture)?;
    let max_seq_len = max_seq_len(&config, &architecture)?;
    let (rope_theta, rope_scaling) = rope(&config)?;
    let arch = ModelArch {
        architecture,
        dim,
        hidden_dim: config.int("intermediate_size", None)?,
        n_layers: config.int("num_hidden_layers", None)?,
        n_heads,
        n_kv_heads: config.int("num_key_value_heads", Some(n_heads))?,
        head_dim: dim.checked_div(n_heads).unwrap_or(0),
        vocab_size: config.int("vocab_size", None)?,
        max_seq_len,
        norm_eps: config.float("rms_norm_eps", 1e-6)?,
        rope_theta,
        tied_embeddings: config.flag("tie_word_embeddings"),
        rope_scaling,
        block: BlockSpec::default(),
        windows: Vec::new(),
        local_rope_theta: None,
        embedding_scale: None,
        final_logit_softcap: None,
        moe: None,
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
