//! [`read_hf_folder`]: a Hugging Face folder into a [`LoadedModel`]. `config.json` gives the
//! architecture (`config.rs`), the safetensors files the weights (`shards.rs`; each linear layer
//! of a quantized folder dequantized by `quant/`), un-permuted from the rotate-half to the
//! interleaved RoPE layout; `tokenizer.json` with `tokenizer_config.json` and
//! `generation_config.json` the tokenizer and its special tokens (`tokenizer.rs`).

use std::path::Path;

use serde_json::Value;

use std::collections::HashMap;

use super::config::{AttnBias, HfArch, language_model_config, parse_config};
use super::quant::HfQuant;
use super::shards::Shards;
use super::tokenizer::{HfTokenizer, first_encoded_id, read_tokenizer_json};
use crate::LoadError;
use crate::arch::{Arch, ExpertTensors};
use crate::loaded::{LoadedModel, ModelFormat, ModelPart, PartFile, PartSource, check_vocab, gather_parts};
use crate::rope_layout::RopeLayout::ToInterleaved;
use crate::rope_layout::permute_head_rows;
use crate::storage::{SizeOverflow, SourceStorage, source_storage};
use crate::tokenizer::Tokenizer;
use qdrift_weights::{Experts, Ffn, HostTensor, LayerWeights, LinearName, Mlp, ModelArch, SharedExpert};

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
    let folder = Folder::open(dir)?;
    let mut modules = Modules::default();
    let model = gather_parts(folder.hf.arch.clone(), |sink| {
        folder.reader().read_parts(&mut |part| {
            modules.add(folder.hf.entry, &part);
            sink(part);
        })
    })?;
    let storage = folder.storage(modules)?;
    let arch = model.arch.clone();
    folder.finish(dir, tokenizer, &arch, storage, |_| model)
}

/// A Hugging Face folder's weights as a [`WeightSource`] that reads each part from the files
/// when asked ([`crate::open_source`]): no part of the model stays in memory between requests
/// ([`PartSource`]), and a file changed since this pass read it is refused when a part is read
/// again ([`qdrift_io::PinnedFile`]).
///
/// The folder is read through once when it is opened, as [`read_hf_folder`] reads it, keeping
/// nothing: every error [`read_hf_folder`] reports (a missing or misshapen tensor, a value that
/// is not finite, a corrupt quantized layout) is reported here, at open, and the parameter
/// count and the stored sizes come from that pass.
///
/// # Errors
/// As [`read_hf_folder`].
pub(crate) fn open_hf_source(
    dir: &Path,
    tokenizer: Option<&Path>,
) -> Result<LoadedModel<PartSource<HfFile>>, LoadError> {
    let folder = Folder::open(dir)?;
    let mut modules = Modules::default();
    let mut parameters = 0;
    folder.reader().read_parts(&mut |part| {
        modules.add(folder.hf.entry, &part);
        parameters += part.parameter_count();
    })?;
    let storage = folder.storage(modules)?;
    let hf = folder.hf.clone();
    let arch = hf.arch.clone();
    folder.finish(dir, tokenizer, &arch, storage, |f| PartSource {
        file: HfFile { shards: f.shards, quant: f.quant, hf },
        parameters,
    })
}

/// A Hugging Face folder opened: its weights files, its architecture and its quantization, the
/// weights not yet read.
struct Folder {
    config_path: std::path::PathBuf,
    config: Value,
    shards: Shards,
    hf: HfArch,
    quant: Option<HfQuant>,
    /// What a multimodal wrapper's reading left out, for [`LoadedModel::notes`].
    note: Option<String>,
}

impl Folder {
    fn open(dir: &Path) -> Result<Folder, LoadError> {
        let config_path = dir.join("config.json");
        // `exists`, not `is_file`: a config.json that is a pipe or a device is refused by name below.
        if !config_path.exists() {
            return Err(LoadError::invalid(
                dir,
                "is a folder without config.json; a Hugging Face model folder needs config.json, \
                 model.safetensors (or its shards) and tokenizer.json",
            ));
        }
        let outer = crate::input::read_json(&config_path, crate::input::JSON)?;
        let mut shards = Shards::open(dir)?;
        let (text, note) = match language_model_config(&config_path, &outer)? {
            Some((text, wrapper)) => {
                let ignored = shards.keep_language_model()?;
                let note = format!(
                    "{} is a multimodal wrapper: reading its language model ({}, text_config) and ignoring its \
                     {ignored} vision/audio tensors",
                    wrapper.class, wrapper.text_class
                );
                (Some(text), Some(note))
            }
            None => (None, None),
        };
        let config = text.as_ref().unwrap_or(&outer);
        let hf = parse_config(&config_path, config, shards.tensor_count())?;
        check_output_layer(&config_path, config, &hf, &shards)?;
        check_unexpected_tensors(config, &hf.arch, &shards)?;
        // `quantization_config` stays in the wrapper's own config.
        let quant = super::quant::read_quant_config(dir, &config_path, &outer)?;
        let fused_experts = hf.entry.moe.as_ref().is_some_and(|m| m.hf_tensors == ExpertTensors::Fused);
        if quant.as_ref().is_some_and(HfQuant::is_mxfp4) && !fused_experts {
            return Err(LoadError::invalid(
                &config_path,
                "MXFP4 quantization (quantization_config.quant_method = mxfp4) is read for GptOssForCausalLM's experts only",
            ));
        }
        Ok(Folder { config_path, config: text.unwrap_or(outer), shards, hf, quant, note })
    }

    fn reader(&self) -> Reader<'_> {
        Reader { shards: &self.shards, quant: self.quant.as_ref(), hf: &self.hf }
    }

    /// The stored sizes for `qdrift inspect`: per quantized module (`modules`, from a pass over
    /// the parts) in a quantized folder, else per dtype.
    fn storage(&self, modules: Modules) -> Result<SourceStorage, LoadError> {
        let storage = match &self.quant {
            Some(q) => quantized_storage(&self.shards, q, modules.0),
            None => stored_storage(&self.shards),
        };
        storage.map_err(|e| LoadError::Overflow {
            path: self.config_path.parent().unwrap_or(Path::new(".")).to_path_buf(),
            quantity: e.quantity.to_string(),
            inputs: format!("{} tensors", self.shards.tensor_count()),
        })
    }

    /// The tokenizer and its special tokens, checked against `arch`, and the [`LoadedModel`]
    /// holding `weights(self)`.
    fn finish<W>(
        self,
        dir: &Path,
        tokenizer: Option<&Path>,
        arch: &ModelArch,
        storage: SourceStorage,
        weights: impl FnOnce(Folder) -> W,
    ) -> Result<LoadedModel<W>, LoadError> {
        let config = &self.config;
        let entry = self.hf.entry;
        let tokenizer_path = tokenizer.map_or_else(|| dir.join("tokenizer.json"), Path::to_path_buf);
        if !tokenizer_path.exists() {
            return Err(LoadError::invalid(
                &tokenizer_path,
                "not found; a Hugging Face model folder needs tokenizer.json",
            ));
        }
        let inner = read_tokenizer_json(&tokenizer_path)?;
        let tok_config = crate::input::optional_json(&dir.join("tokenizer_config.json"))?;
        let gen_config = crate::input::optional_json(&dir.join("generation_config.json"))?;
        let token_id = |v: Option<&Value>| v.and_then(token_content).and_then(|t| inner.token_to_id(t));
        let bos = token_id(tok_config.as_ref().and_then(|c| c.get("bos_token")))
            .or_else(|| first_id(config.get("bos_token_id")));
        let eos = gen_config
            .as_ref()
            .and_then(|g| first_id(g.get("eos_token_id")))
            .or_else(|| token_id(tok_config.as_ref().and_then(|c| c.get("eos_token"))))
            .or_else(|| first_id(config.get("eos_token_id")));
        let wants_bos = tok_config.as_ref().and_then(|c| c.get("add_bos_token")).and_then(Value::as_bool) == Some(true);
        let pipeline_adds_bos = bos.is_some() && first_encoded_id(&inner, "a") == bos;
        let tok = HfTokenizer::new(&tokenizer_path, inner, bos, eos, wants_bos && !pipeline_adds_bos)?;
        // The newer classes' checkpoints pad the embedding beyond the tokenizer (Qwen3: 151936 rows
        // for 151669 tokens; the tiny-arch folders: 512 for 510): ids past the tokenizer are never
        // encoded. Llama, Mistral and Qwen2 keep the exact check they always had.
        let padded = entry.hf.padded_vocab && tok.vocab_size() < arch.vocab_size;
        if !padded {
            check_vocab(&tok, &tokenizer_path, arch, dir)?;
        }
        // transformers ≥ 4.43 saves the template beside tokenizer_config.json, as
        // `chat_template.jinja`: read where the config has none, as `quantize --format gguf` does.
        let chat_template = match tok_config.as_ref().and_then(|c| c.get("chat_template")) {
            Some(v) => chat_template(v),
            None => crate::gguf::hf_vocab::chat_template_file(dir)?.as_ref().and_then(chat_template),
        };
        let source_dtypes = self.shards.dtypes();
        let quantization =
            self.quant.as_ref().map(|q| q.summary_with_scales(&self.shards, arch.n_layers)).transpose()?;
        let notes = self.note.iter().cloned().collect();
        Ok(LoadedModel {
            model: weights(self),
            tokenizer: Box::new(tok),
            path: dir.to_path_buf(),
            tokenizer_path,
            format: ModelFormat::HfSafetensors,
            source_dtypes,
            source_storage: Some(storage),
            chat_template,
            quantization,
            notes,
        })
    }
}

/// A Hugging Face folder's files, read part by part ([`open_hf_source`]).
pub(crate) struct HfFile {
    shards: Shards,
    quant: Option<HfQuant>,
    /// The architecture.
    hf: HfArch,
}

impl HfFile {
    fn reader(&self) -> Reader<'_> {
        Reader { shards: &self.shards, quant: self.quant.as_ref(), hf: &self.hf }
    }
}

impl PartFile for HfFile {
    fn arch(&self) -> &ModelArch {
        &self.hf.arch
    }

    fn embedding(&self) -> Result<HostTensor, LoadError> {
        self.reader().embedding()
    }

    fn layer(&self, i: usize) -> Result<LayerWeights, LoadError> {
        self.reader().layer(i)
    }

    fn final_norm(&self) -> Result<HostTensor, LoadError> {
        self.reader().final_norm()
    }

    fn output(&self) -> Result<Option<HostTensor>, LoadError> {
        self.reader().output()
    }
}

/// Refuses a folder whose `config.json` unties the output layer (`tie_word_embeddings` false, or
/// absent where the class's default is false) but whose files have no `lm_head`: `transformers`
/// would run it with the layer at its random initialisation, and qdrift used to tie it silently.
fn check_output_layer(config_path: &Path, config: &Value, hf: &HfArch, shards: &Shards) -> Result<(), LoadError> {
    if hf.arch.tied_embeddings || shards.tensors().any(|(name, _)| name.starts_with("lm_head.")) {
        return Ok(());
    }
    let said = match config.get("tie_word_embeddings").filter(|v| !v.is_null()) {
        Some(v) => format!("tie_word_embeddings is {v}"),
        None => format!("tie_word_embeddings is absent, which {} reads as false,", hf.arch.architecture),
    };
    Err(LoadError::invalid(
        config_path,
        format!(
            "{said} but the weights files have no lm_head.weight: the output layer would be untrained; set \
             tie_word_embeddings to true if the model's output layer is its embedding"
        ),
    ))
}

/// Refuses the first stored tensor (in file order) that belongs to the decoder but lies beyond
/// what `config.json` accounts for: a layer at or past `num_hidden_layers`, or an expert at or
/// past the layer's experts (none in a dense layer). The reader reads tensors by the names the
/// configuration implies, so it would ignore such a tensor and run another model than the
/// checkpoint; tensors outside the layers (and inside them, by other names) are left to it.
fn check_unexpected_tensors(config: &Value, a: &ModelArch, shards: &Shards) -> Result<(), LoadError> {
    let experts_key = super::config::experts_key(config);
    // GLM-4.5's and DeepSeek-V3's multi-token-prediction layers follow the decoder's
    // (`num_nextn_predict_layers`); `transformers` ignores them too.
    let nextn = config.get("num_nextn_predict_layers").and_then(Value::as_u64).map_or(0, |n| n as usize);
    for (name, _) in shards.tensors() {
        let Some((layer, rest)) = crate::names::indexed(name, "model.layers.") else { continue };
        if layer >= a.n_layers && layer - a.n_layers < nextn {
            continue;
        }
        let problem = if layer >= a.n_layers {
            format!("is in layer {layer}, but config.json's num_hidden_layers is {}", a.n_layers)
        } else if let Some(e) = crate::names::expert_index(rest) {
            match a.moe.as_ref().filter(|_| a.has_experts(layer)) {
                Some(m) if e < m.n_experts => continue,
                Some(m) => format!("is expert {e}, but config.json's {experts_key} is {}", m.n_experts),
                None => format!("is an expert of layer {layer}, which config.json makes dense (no experts)"),
            }
        } else {
            continue;
        };
        let path = shards.path_of(name).unwrap_or(shards.first_path());
        return Err(LoadError::invalid(path, format!("tensor {name} {problem}; qdrift would run without it")));
    }
    Ok(())
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
/// every other tensor under its dtype. A fused module (Phi-3's `qkv_proj`, `gate_up_proj`) is
/// one layer holding the weights of the linears it is split into.
fn quantized_storage(
    shards: &Shards,
    quant: &HfQuant,
    mut modules: Vec<(String, u64)>,
) -> Result<SourceStorage, SizeOverflow> {
    modules.retain(|(m, _)| quant.stores_quantized(shards, m));
    let index: HashMap<&str, usize> = modules.iter().enumerate().map(|(k, (m, _))| (m.as_str(), k)).collect();
    let kind = quant.summary.weights.as_str();
    let mut entries: Vec<(String, u64, u64)> = modules.iter().map(|(_, n)| (kind.to_string(), *n, 0)).collect();
    for (name, info) in shards.tensors() {
        let owner = name.rsplit_once('.').and_then(|(m, _)| index.get(m).copied());
        match owner {
            Some(k) => entries[k].2 += stored(info).2,
            None => entries.push(stored(info)),
        }
    }
    source_storage(entries.iter().map(|(d, n, b)| (d.as_str(), *n, *b)))
}

/// The checkpoint modules that hold a model's linear layers, in model order, each with the
/// values of the linears it holds (a fused module's parts summed), gathered part by part.
#[derive(Default)]
struct Modules(Vec<(String, u64)>);

impl Modules {
    fn add(&mut self, entry: Arch, part: &ModelPart) {
        match part {
            ModelPart::Layer(i, layer) => {
                for (name, w) in layer.linears() {
                    let Some(m) = hf_module(entry, name) else { continue };
                    let module = format!("model.layers.{i}.{m}");
                    let n = w.data.len() as u64;
                    // The linears of one fused module are consecutive.
                    match self.0.last_mut() {
                        Some((last, count)) if *last == module => *count += n,
                        _ => self.0.push((module, n)),
                    }
                }
            }
            ModelPart::Output(Some(o)) => self.0.push(("lm_head".to_string(), o.data.len() as u64)),
            _ => {}
        }
    }
}

/// A stored tensor as `source_storage` counts it: its dtype's name, its values, its bytes.
fn stored(info: &safetensors::tensor::TensorInfo) -> (String, u64, u64) {
    let (begin, end) = info.data_offsets;
    (format!("{:?}", info.dtype), info.shape.iter().map(|&d| d as u64).product(), (end - begin) as u64)
}

/// The stored size of an unquantized folder's tensors, per safetensors dtype.
fn stored_storage(shards: &Shards) -> Result<SourceStorage, SizeOverflow> {
    let entries: Vec<(String, u64, u64)> = shards.tensors().map(|(_, info)| stored(info)).collect();
    source_storage(entries.iter().map(|(d, n, b)| (d.as_str(), *n, *b)))
}

/// The checkpoint's module (within a layer) that holds linear `name`: Phi-3's fused
/// `self_attn.qkv_proj` and `mlp.gate_up_proj`, Mixtral's `block_sparse_moe.experts.{e}.w1`
/// (gate), `w3` (up), `w2` (down), Qwen3-MoE's `mlp.experts.{e}.{gate,up,down}_proj`; `None` for
/// gpt-oss's experts, which are 3-D tensors of all experts, not modules.
fn hf_module(entry: Arch, name: LinearName) -> Option<String> {
    let fused = entry.block.fused;
    match (entry.moe.as_ref().map(|m| m.hf_tensors), name.expert, name.role) {
        (_, None, "self_attn.q_proj" | "self_attn.k_proj" | "self_attn.v_proj") if fused => {
            Some("self_attn.qkv_proj".into())
        }
        (_, None, "mlp.gate_proj" | "mlp.up_proj") if fused => Some("mlp.gate_up_proj".into()),
        (Some(ExpertTensors::PerExpert { experts, proj: [gate, up, down], .. }), Some(e), role) => {
            let w = match role {
                "mlp.gate_proj" => gate,
                "mlp.up_proj" => up,
                _ => down,
            };
            Some(format!("{experts}.{e}.{w}"))
        }
        (Some(ExpertTensors::Fused | ExpertTensors::FusedInOut), Some(_), _) => None,
        _ => {
            let module = name.to_string();
            let shared = entry.moe.as_ref().and_then(|m| m.ungated_shared).map_or("shared_expert", |u| u.name);
            let module = module.replacen("mlp.shared_expert.", &format!("mlp.{shared}."), 1);
            Some(match module.strip_prefix("mlp.") {
                Some(rest) if entry.hf.ffn != "mlp" => format!("{}.{rest}", entry.hf.ffn),
                _ => module,
            })
        }
    }
}

/// The linear layer `module` as f32 `[out, inp]` in the checkpoint's row order: dequantized when
/// the folder is quantized, else its `.weight`.
///
/// # Shapes
/// - returns `[out, inp]`.
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

/// Rows `start..start + n` of a `[rows, cols]` tensor (a fused projection's part).
///
/// # Shapes
/// - `t`: `[rows, cols]`; returns `[n, cols]`.
fn rows(t: &HostTensor, start: usize, n: usize) -> HostTensor {
    let cols = t.shape.get(1).copied().unwrap_or(1);
    HostTensor { shape: vec![n, cols], data: t.data[start * cols..(start + n) * cols].to_vec() }
}

/// Reads a folder's tensors by the names of its class, part by part.
struct Reader<'a> {
    shards: &'a Shards,
    quant: Option<&'a HfQuant>,
    hf: &'a HfArch,
}

impl Reader<'_> {
    fn arch(&self) -> &ModelArch {
        &self.hf.arch
    }

    /// A tensor that must be there, F32/F16/BF16.
    fn tensor(&self, name: &str, shape: &[usize]) -> Result<HostTensor, LoadError> {
        self.shards.require(name, shape)
    }

    /// A linear layer that must be there, dequantized when the folder is quantized.
    ///
    /// # Shapes
    /// - returns `[out, inp]`.
    fn lin(&self, module: &str, out: usize, inp: usize) -> Result<HostTensor, LoadError> {
        linear(self.shards, self.quant, module, out, inp)?.ok_or_else(|| {
            LoadError::invalid(
                self.shards.first_path(),
                format!("tensor {module}.weight is missing; expected shape [{out}, {inp}] (or its quantized parts)"),
            )
        })
    }

    /// A q or k projection (or bias) of `heads` heads, rotate-half rows to interleaved, the
    /// first `rotary_dim` rows of each head only.
    ///
    /// # Shapes
    /// - `t`: `[heads * head_dim, cols]` or `[heads * head_dim]`; same shape out.
    fn interleave(&self, t: &HostTensor, heads: usize) -> HostTensor {
        if self.hf.entry.block.llama4_attention {
            // Llama 4's `apply_rotary_emb` rotates adjacent pairs: interleaved already.
            return t.clone();
        }
        permute_head_rows(t, heads, self.arch().rotary_dim(), ToInterleaved)
    }

    /// Every part in the order a model is built, each handed to `each` as it is read.
    fn read_parts(&self, each: &mut dyn FnMut(ModelPart)) -> Result<(), LoadError> {
        each(ModelPart::Embedding(self.embedding()?));
        // `check_layer_count` bounded n_layers by the files' tensor count.
        for i in 0..self.arch().n_layers {
            each(ModelPart::Layer(i, Box::new(self.layer(i)?)));
        }
        each(ModelPart::FinalNorm(self.final_norm()?));
        each(ModelPart::Output(self.output()?));
        Ok(())
    }

    /// `model.embed_tokens.weight`, `[vocab, dim]`.
    fn embedding(&self) -> Result<HostTensor, LoadError> {
        self.tensor("model.embed_tokens.weight", &[self.arch().vocab_size, self.arch().dim])
    }

    /// `model.norm.weight`, `[dim]`.
    fn final_norm(&self) -> Result<HostTensor, LoadError> {
        self.tensor("model.norm.weight", &[self.arch().dim])
    }

    /// `lm_head`, `[vocab, dim]`, dequantized when the folder is quantized; `None` when
    /// `config.json` ties it (`check_output_layer` refused an untied folder without one).
    fn output(&self) -> Result<Option<HostTensor>, LoadError> {
        let a = self.arch();
        if a.tied_embeddings {
            return Ok(None);
        }
        self.lin("lm_head", a.vocab_size, a.dim).map(Some)
    }

    /// Block `i`. Dequantized first, then (q, k) permuted: the permutation moves real rows.
    fn layer(&self, i: usize) -> Result<LayerWeights, LoadError> {
        let a = self.arch();
        let (dim, hd) = (a.dim, a.head_dim);
        let (q_dim, kv_dim) = (a.q_dim(), a.kv_dim());
        let p = format!("model.layers.{i}");
        let (wq, wk, wv) = if self.hf.entry.block.fused {
            // Phi3Attention: `qkv_proj` rows are [q; k; v].
            let qkv = self.lin(&format!("{p}.self_attn.qkv_proj"), q_dim + 2 * kv_dim, dim)?;
            (rows(&qkv, 0, q_dim), rows(&qkv, q_dim, kv_dim), rows(&qkv, q_dim + kv_dim, kv_dim))
        } else {
            let proj = |name: &str, out: usize| self.lin(&format!("{p}.self_attn.{name}"), out, dim);
            (proj("q_proj", q_dim)?, proj("k_proj", kv_dim)?, proj("v_proj", kv_dim)?)
        };
        let bias = |name: &str, n: usize| self.tensor(&format!("{p}.self_attn.{name}.bias"), &[n]);
        let (bq, bk, bv, bo) = match self.hf.attn_bias {
            AttnBias::None => (None, None, None, None),
            AttnBias::Qkv | AttnBias::Qkvo => (
                Some(self.interleave(&bias("q_proj", q_dim)?, a.n_heads)),
                Some(self.interleave(&bias("k_proj", kv_dim)?, a.n_kv_heads)),
                Some(bias("v_proj", kv_dim)?),
                if self.hf.attn_bias == AttnBias::Qkvo { Some(bias("o_proj", dim)?) } else { None },
            ),
        };
        let qk_norm = |name: &str| -> Result<Option<HostTensor>, LoadError> {
            if !a.block.qk_norm {
                return Ok(None);
            }
            Ok(Some(self.interleave(&self.tensor(&format!("{p}.self_attn.{name}.weight"), &[hd])?, 1)))
        };
        let norm = |name: &str| self.tensor(&format!("{p}.{name}.weight"), &[dim]);
        // The naming trap: Gemma's `post_attention_layernorm` normalizes the attention output;
        // everyone else's is the pre-FFN norm.
        let (post_attn_norm, ffn_norm, post_ffn_norm) = if a.block.sandwich_norms {
            (
                Some(norm("post_attention_layernorm")?),
                norm("pre_feedforward_layernorm")?,
                Some(norm("post_feedforward_layernorm")?),
            )
        } else {
            (None, norm("post_attention_layernorm")?, None)
        };
        Ok(LayerWeights {
            attn_norm: norm("input_layernorm")?,
            wq: self.interleave(&wq, a.n_heads),
            wk: self.interleave(&wk, a.n_kv_heads),
            wv,
            wo: self.lin(&format!("{p}.self_attn.o_proj"), dim, q_dim)?,
            bq,
            bk,
            bv,
            bo,
            q_norm: qk_norm("q_norm")?,
            k_norm: qk_norm("k_norm")?,
            sinks: if a.block.sinks { Some(self.tensor(&format!("{p}.self_attn.sinks"), &[a.n_heads])?) } else { None },
            post_attn_norm,
            ffn_norm,
            post_ffn_norm,
            ffn: if a.has_experts(i) { Ffn::Experts(self.experts(&p)?) } else { Ffn::Dense(self.dense(&p)?) },
        })
    }

    /// A dense FFN: `mlp.{gate,up,down}_proj` (Llama 4's `feed_forward.*`), Phi-3's
    /// `mlp.gate_up_proj` ([gate; up] rows, `Phi3MLP`) split.
    fn dense(&self, p: &str) -> Result<Mlp, LoadError> {
        let (dim, hidden) = (self.arch().dim, self.arch().hidden_dim);
        let ffn = self.hf.entry.hf.ffn;
        let down = self.lin(&format!("{p}.{ffn}.down_proj"), dim, hidden)?;
        if self.hf.entry.block.fused {
            let gate_up = self.lin(&format!("{p}.{ffn}.gate_up_proj"), 2 * hidden, dim)?;
            return Ok(Mlp::new(rows(&gate_up, 0, hidden), rows(&gate_up, hidden, hidden), down));
        }
        self.mlp(&format!("{p}.{ffn}"), hidden, down)
    }

    /// A gated FFN `{m}.{gate,up}_proj` of width `hidden` with its `down` projection.
    fn mlp(&self, m: &str, hidden: usize, down: HostTensor) -> Result<Mlp, LoadError> {
        let dim = self.arch().dim;
        Ok(Mlp::new(
            self.lin(&format!("{m}.gate_proj"), hidden, dim)?,
            self.lin(&format!("{m}.up_proj"), hidden, dim)?,
            down,
        ))
    }

    /// A mixture of experts: Qwen3-MoE's and Qwen2-MoE's `mlp.gate` and
    /// `mlp.experts.{e}.{gate,up,down}_proj` (Qwen2-MoE's shared expert:
    /// `mlp.shared_expert.{gate,up,down}_proj` and `mlp.shared_expert_gate` `[1, dim]`),
    /// Mixtral's `block_sparse_moe.gate` and `block_sparse_moe.experts.{e}.{w1,w3,w2}`, gpt-oss's
    /// `mlp.router` (with bias) and fused `mlp.experts.*` ([`Reader::gpt_oss_experts`]).
    fn experts(&self, p: &str) -> Result<Experts, LoadError> {
        let a = self.arch();
        let Some(m) = &a.moe else {
            return Err(LoadError::invalid(self.shards.first_path(), format!("{p}: experts without a MoeSpec")));
        };
        let (n, eh, dim) = (m.n_experts, m.expert_hidden, a.dim);
        let rules = self.hf.entry.moe.as_ref();
        let tensors = rules.map_or(ExpertTensors::Fused, |m| m.hf_tensors);
        let ffn = self.hf.entry.hf.ffn;
        // An ungated shared expert (Llama 4's `shared_expert`, GLM-4.5's `shared_experts`).
        let ungated = |width: usize, name: &str| -> Result<SharedExpert, LoadError> {
            let s = format!("{p}.{ffn}.{name}");
            let down = self.lin(&format!("{s}.down_proj"), dim, width)?;
            Ok(SharedExpert {
                mlp: self.mlp(&s, width, down)?,
                gate: HostTensor { shape: vec![0, dim], data: Vec::new() },
            })
        };
        let (router, prefix, [gate, up, down]) = match tensors {
            ExpertTensors::PerExpert { router, experts, proj } => (router, experts, proj),
            ExpertTensors::Fused => {
                let router_w = self.lin(&format!("{p}.mlp.router"), n, dim)?;
                let router_bias = Some(self.tensor(&format!("{p}.mlp.router.bias"), &[n])?);
                return Ok(Experts { router: router_w, router_bias, experts: self.gpt_oss_experts(p)?, shared: None });
            }
            ExpertTensors::FusedInOut => {
                let shared = match (m.shared_expert_hidden, rules.and_then(|r| r.ungated_shared)) {
                    (Some(w), Some(u)) => Some(ungated(w, u.name)?),
                    _ => None,
                };
                return Ok(Experts {
                    router: self.lin(&format!("{p}.{ffn}.router"), n, dim)?,
                    router_bias: None,
                    experts: self.llama4_experts(&format!("{p}.{ffn}.experts"))?,
                    shared,
                });
            }
        };
        let router_w = self.lin(&format!("{p}.{router}"), n, dim)?;
        // `Glm4MoeTopkRouter.e_score_correction_bias`: the choice's bias (`Routing::GroupedSigmoid`).
        let router_bias = if m.routing.biases_choice_only() {
            Some(self.tensor(&format!("{p}.{router}.e_score_correction_bias"), &[n])?)
        } else {
            None
        };
        let mut experts = Vec::new();
        for e in 0..n {
            let name = |w: &str| format!("{p}.{prefix}.{e}.{w}");
            experts.push(Mlp::new(
                self.lin(&name(gate), eh, dim)?,
                self.lin(&name(up), eh, dim)?,
                self.lin(&name(down), dim, eh)?,
            ));
        }
        let shared = match (m.shared_expert_hidden, rules.and_then(|r| r.ungated_shared)) {
            (Some(w), Some(u)) => Some(ungated(w, u.name)?),
            (Some(w), None) => {
                let name = |s: &str| format!("{p}.mlp.shared_expert.{s}");
                Some(SharedExpert {
                    mlp: Mlp::new(
                        self.lin(&name("gate_proj"), w, dim)?,
                        self.lin(&name("up_proj"), w, dim)?,
                        self.lin(&name("down_proj"), dim, w)?,
                    ),
                    gate: self.lin(&format!("{p}.mlp.shared_expert_gate"), 1, dim)?,
                })
            }
            (None, _) => None,
        };
        Ok(Experts { router: router_w, router_bias, experts, shared })
    }

    /// Llama 4's experts (`Llama4TextExperts`), stored `[E, in, out]` (`x @ W`): `{m}.gate_up_proj`
    /// `[E, dim, 2I]` (gate columns, then up: `chunk(2, dim=-1)`) and `{m}.down_proj` `[E, I, dim]`;
    /// each transposed to `[out, in]`.
    ///
    /// # Shapes
    /// - returns `n_experts` of: gate, up `[I, dim]`, down `[dim, I]`.
    fn llama4_experts(&self, m: &str) -> Result<Vec<Mlp>, LoadError> {
        let a = self.arch();
        let Some(spec) = &a.moe else { return Ok(Vec::new()) };
        let (n, h, d) = (spec.n_experts, spec.expert_hidden, a.dim);
        let gate_up = self.tensor(&format!("{m}.gate_up_proj"), &[n, d, 2 * h])?;
        let down = self.tensor(&format!("{m}.down_proj"), &[n, h, d])?;
        // Columns `from..from + rows` of `[inp, out]` matrix `e` of `t` as an `[rows, inp]` weight.
        let transposed = |t: &HostTensor, e: usize, [inp, out]: [usize; 2], from: usize, rows: usize| {
            let x = &t.data[e * inp * out..(e + 1) * inp * out];
            let data = (0..rows).flat_map(|r| (0..inp).map(move |i| x[i * out + from + r])).collect();
            HostTensor { shape: vec![rows, inp], data }
        };
        Ok((0..n)
            .map(|e| {
                Mlp::new(
                    transposed(&gate_up, e, [d, 2 * h], 0, h),
                    transposed(&gate_up, e, [d, 2 * h], h, h),
                    transposed(&down, e, [h, d], 0, d),
                )
            })
            .collect())
    }

    /// gpt-oss's experts (`GptOssExperts`), stored `[E, in, out]` (`x @ W`): `gate_up_proj
    /// [E, dim, 2I]` whose columns interleave gate (`0::2`) and up (`1::2`), `gate_up_proj_bias
    /// [E, 2I]` the same way, `down_proj [E, I, dim]`, `down_proj_bias [E, dim]`; each transposed
    /// to `[out, in]`. An MXFP4 checkpoint stores `gate_up_proj_blocks`/`_scales` and
    /// `down_proj_blocks`/`_scales` instead ([`Reader::mxfp4`]), already `[E, out, in]`.
    ///
    /// # Shapes
    /// - returns `n_experts` of: gate, up `[I, dim]`, down `[dim, I]`, biases `[I]`, `[I]`, `[dim]`.
    fn gpt_oss_experts(&self, p: &str) -> Result<Vec<Mlp>, LoadError> {
        let a = self.arch();
        let Some(m) = &a.moe else { return Ok(Vec::new()) };
        let (n, eh, dim) = (m.n_experts, m.expert_hidden, a.dim);
        let gu_name = format!("{p}.mlp.experts.gate_up_proj");
        let down_name = format!("{p}.mlp.experts.down_proj");
        // Both as [E, out, in]: gate_up [E, 2I, dim] (gate rows 0::2), down [E, dim, I].
        let (gate_up, down) = if self.shards.has(&format!("{gu_name}_blocks")) {
            (self.mxfp4(&gu_name, n, 2 * eh, dim)?, self.mxfp4(&down_name, n, dim, eh)?)
        } else {
            let transposed = |t: HostTensor, rows: usize, cols: usize| -> Vec<f32> {
                // [E, cols (in), rows (out)] -> [E, rows, cols]
                (0..n)
                    .flat_map(|e| {
                        let x = &t.data[e * rows * cols..(e + 1) * rows * cols];
                        (0..rows).flat_map(move |r| (0..cols).map(move |c| x[c * rows + r]))
                    })
                    .collect()
            };
            (
                transposed(self.tensor(&gu_name, &[n, dim, 2 * eh])?, 2 * eh, dim),
                transposed(self.tensor(&down_name, &[n, eh, dim])?, dim, eh),
            )
        };
        let gate_up_bias = self.tensor(&format!("{gu_name}_bias"), &[n, 2 * eh])?;
        let down_bias = self.tensor(&format!("{down_name}_bias"), &[n, dim])?;
        let mut experts = Vec::new();
        for e in 0..n {
            let gu = &gate_up[e * 2 * eh * dim..(e + 1) * 2 * eh * dim];
            // Row 2j + half of `gu` ([2I, dim]) is row j of gate (half 0) or up (1).
            let split = |half: usize| -> Vec<f32> {
                (0..eh).flat_map(|j| gu[(2 * j + half) * dim..(2 * j + half + 1) * dim].iter().copied()).collect()
            };
            let gub = &gate_up_bias.data[e * 2 * eh..(e + 1) * 2 * eh];
            let t = |shape: Vec<usize>, data: Vec<f32>| HostTensor { shape, data };
            experts.push(Mlp {
                gate: t(vec![eh, dim], split(0)),
                up: t(vec![eh, dim], split(1)),
                down: t(vec![dim, eh], down[e * dim * eh..(e + 1) * dim * eh].to_vec()),
                gate_bias: Some(t(vec![eh], gub.iter().step_by(2).copied().collect())),
                up_bias: Some(t(vec![eh], gub.iter().skip(1).step_by(2).copied().collect())),
                down_bias: Some(t(vec![dim], down_bias.data[e * dim..(e + 1) * dim].to_vec())),
            });
        }
        Ok(experts)
    }

    /// gpt-oss's MXFP4 tensor `name` (`transformers`' `integrations/mxfp4.py`,
    /// `_convert_moe_packed_tensors`): `{name}_blocks [E, rows, cols/32, 16]` U8, two E2M1 codes
    /// per byte (element `2k` in the low nibble of byte `k`, `2k + 1` in the high one), and
    /// `{name}_scales [E, rows, cols/32]` U8, E8M0 exponents biased by 127:
    /// `w = FP4_VALUES[code] · 2^(scale − 127)`. Each 32-element group is repacked into ggml's
    /// `block_mxfp4` (element `j` low, `j + 16` high) and dequantized by `qdrift-ggml`, whose
    /// values are the same (`kvalues_mxfp4 · 2^(e − 128)`, the table doubled).
    ///
    /// # Shapes
    /// - returns `[E, rows, cols]` row-major.
    fn mxfp4(&self, name: &str, e: usize, rows: usize, cols: usize) -> Result<Vec<f32>, LoadError> {
        let (blocks_name, scales_name) = (format!("{name}_blocks"), format!("{name}_scales"));
        let path = self.shards.path_of(&blocks_name).unwrap_or(self.shards.first_path()).to_path_buf();
        if !cols.is_multiple_of(32) {
            return Err(LoadError::invalid(
                &path,
                format!("{blocks_name}: {cols} columns are not whole MXFP4 groups of 32"),
            ));
        }
        let g = cols / 32;
        let u8s = |n: &str, shape: &[usize]| -> Result<Vec<u8>, LoadError> {
            let raw = self.shards.raw(n)?.ok_or_else(|| {
                LoadError::invalid(&path, format!("tensor {n} is missing; expected U8 of shape {shape:?}"))
            })?;
            if raw.dtype != safetensors::Dtype::U8 || raw.shape != shape {
                return Err(LoadError::invalid(
                    raw.path,
                    format!("tensor {n} is {:?} {:?}; expected U8 {shape:?}", raw.dtype, raw.shape),
                ));
            }
            Ok(raw.bytes)
        };
        let blocks = u8s(&blocks_name, &[e, rows, g, 16])?;
        let scales = u8s(&scales_name, &[e, rows, g])?;
        let mut ggml = Vec::with_capacity(scales.len() * 17);
        for (scale, b) in scales.iter().zip(blocks.chunks_exact(16)) {
            let code = |k: usize| (b[k / 2] >> (4 * (k % 2))) & 0x0F;
            ggml.push(*scale);
            ggml.extend((0..16).map(|j| code(j) | (code(j + 16) << 4)));
        }
        let data = qdrift_ggml::dequantize_ggml_blocks(qdrift_ggml::GgmlType::Mxfp4, &ggml, scales.len() * 32)
            .map_err(|err| LoadError::invalid(&path, format!("{blocks_name}: {err}")))?;
        crate::input::check_finite(&path, &blocks_name, &data)?;
        Ok(data)
    }
}
