//! Writes a [`QuantizedModel`] as a Hugging Face Llama safetensors file, and (for the readers'
//! tests) a model as a quantized Hugging Face folder ([`write_hf_quantized`], the layouts of
//! `hf_packed.rs`).
//!
//! The only module of this crate that does I/O. Tensor names are those of `transformers`'
//! `LlamaForCausalLM`:
//!
//! | tensor | name |
//! |---|---|
//! | token embedding | `model.embed_tokens.weight` |
//! | attention RMSNorm | `model.layers.{i}.input_layernorm.weight` |
//! | q, k, v, o | `model.layers.{i}.self_attn.{q,k,v,o}_proj.weight` |
//! | q, k, v biases (Qwen2) | `model.layers.{i}.self_attn.{q,k,v}_proj.bias` |
//! | FFN RMSNorm | `model.layers.{i}.post_attention_layernorm.weight` |
//! | SwiGLU | `model.layers.{i}.mlp.{gate,up,down}_proj.weight` |
//! | final RMSNorm | `model.norm.weight` |
//! | output head | `lm_head.weight` (only when untied) |
//!
//! **RoPE layout.** [`HostModel`] keeps q/k rows in the interleaved layout (llama2.c, GGUF:
//! rotation pairs are rows `(2i, 2i+1)` of a head); Hugging Face checkpoints use the rotate-half
//! layout (pairs are rows `i` and `i + head_dim/2`). The writer permutes q/k rows to rotate-half
//! with [`qdrift_load::rotate_half_row_order`] (the loader's one definition, the inverse of
//! llama.cpp's `convert_hf_to_gguf.py` `permute`), and records
//! `qdrift.rope_layout = rotate_half`. q/k biases, which are never quantized, are permuted alike.
//!
//! **Packed files.** With `packed`, a quantized tensor `X.weight` is written as its
//! [`crate::PackedPart`]s `X.codes`, `X.scales`, ... (see each format's module for the layout).
//! Every part of every format is either row-major with the matrix's rows as its first dimension
//! or a single per-tensor value, and every format quantizes rows independently (groups and
//! blocks never straddle rows; a per-tensor scale is a max over all rows), so permuting the
//! rows of the parts is exactly quantizing the permuted matrix.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use qdrift_load::hf::quant::HfDtype;
use qdrift_load::{HostModel, HostTensor, rotate_half_row_order};
use safetensors::{Dtype, View};

use crate::model::{QuantizedModel, WeightSlot};
use qdrift_codecs::{PackedDtype, PackedPart};

/// Why a safetensors file could not be written. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// Creating, writing or renaming the file failed.
    #[error("{path}: cannot write: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The safetensors library refused the tensors or failed to write them.
    #[error("{path}: cannot write safetensors: {source}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// The library's error.
        source: safetensors::SafeTensorError,
    },
    /// A tensor of the model does not have the shape its architecture implies.
    #[error("{path}: {tensor}: {message}")]
    Layout {
        /// The file.
        path: PathBuf,
        /// Hugging Face name of the tensor.
        tensor: String,
        /// What is wrong.
        message: String,
    },
    /// The base folder of [`write_hf_quantized`] could not be written or read back.
    #[error("{path}: {message}")]
    Folder {
        /// The file or folder.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A quantizer refused the weights of [`write_hf_quantized`].
    #[error("{path}: {source}")]
    Quantize {
        /// The folder.
        path: PathBuf,
        /// Why.
        source: qdrift_codecs::QuantizeError,
    },
    /// An extra metadata key that qdrift already sets, or that is given twice.
    #[error("{path}: metadata key \"{key}\" is set twice")]
    MetadataKey {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
    },
}

/// Writes every tensor of `model` to `path` under Hugging Face Llama names.
///
/// - `packed = false`: every tensor as F32; quantized tensors hold their dequantized values.
/// - `packed = true`: each quantized tensor as its packed parts (`….codes`, `….scales`, ...,
///   in their own dtypes); the other tensors as F32.
///
/// Metadata (`__metadata__`): `format = pt`, `qdrift.scheme` (CLI name), `qdrift.packed`,
/// `qdrift.quantize_embeddings`, `qdrift.quantize_head` (`true`/`false`),
/// `qdrift.rope_layout = rotate_half`, `qdrift.fallback` when a GGML scheme stored some tensors
/// as another type (`NAME=TYPE,…`, e.g. `…down_proj.weight=f16`; a packed part `blocks` then
/// holds that type's blocks, `values` F16 values), then `extra_metadata`.
///
/// The write is atomic ([`qdrift_io::AtomicFile`]): the file is written to a uniquely named
/// temporary file in the same folder and renamed over `path`; on failure the temporary file is
/// removed and `path` is left as it was.
///
/// # Shapes
/// q/k rows are permuted from the interleaved to the rotate-half RoPE layout (see
/// [`rotate_half_row_order`]); every other tensor is written in [`qdrift_load::HostModel`]'s
/// layout (`[out, in]` linears, `[vocab, dim]` embedding and head, `[dim]` norms).
///
/// # Errors
/// [`WriteError::Layout`] when a tensor's shape contradicts the architecture,
/// [`WriteError::MetadataKey`] when `extra_metadata` repeats a key, and the I/O or library error
/// otherwise.
pub fn write_safetensors(
    path: &Path,
    model: &QuantizedModel,
    packed: bool,
    extra_metadata: &[(String, String)],
) -> Result<(), WriteError> {
    let metadata = metadata(path, model, packed, extra_metadata)?;
    let tensors = Collector { path, model, packed, out: Vec::new() }.collect()?;
    serialize_atomic(path, tensors, Some(metadata))
}

/// `tensors` as the safetensors file `path`, written atomically: serialized into
/// [`qdrift_io::AtomicFile`]'s temporary file, then renamed over `path` (the temporary file is
/// removed on failure).
fn serialize_atomic(
    path: &Path,
    tensors: Vec<(String, OutTensor<'_>)>,
    metadata: Option<HashMap<String, String>>,
) -> Result<(), WriteError> {
    let file = qdrift_io::AtomicFile::create(path).map_err(io_error)?;
    safetensors::serialize_to_file(tensors, metadata, file.temp_path())
        .map_err(|source| WriteError::Safetensors { path: path.to_path_buf(), source })?;
    file.commit().map_err(io_error)
}

/// [`WriteError::Io`] for a failed write (same message), [`WriteError::Folder`] for a failed
/// read of the fixture writer's base folder.
fn io_error(e: qdrift_io::IoError) -> WriteError {
    match e {
        qdrift_io::IoError::Write { path, source } => WriteError::Io { path, source },
        other => WriteError::Folder { path: other.path().to_path_buf(), message: other.to_string() },
    }
}

fn metadata(
    path: &Path,
    model: &QuantizedModel,
    packed: bool,
    extra: &[(String, String)],
) -> Result<HashMap<String, String>, WriteError> {
    let mut map: HashMap<String, String> = [
        ("format", "pt".to_owned()),
        ("qdrift.scheme", model.scheme.to_string()),
        ("qdrift.packed", packed.to_string()),
        ("qdrift.quantize_embeddings", model.options.quantize_embeddings.to_string()),
        ("qdrift.quantize_head", model.options.quantize_head.to_string()),
        ("qdrift.rope_layout", "rotate_half".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let fell_back: Vec<String> = model
        .tensors
        .iter()
        .filter(|t| t.matrix.fell_back())
        .map(|t| format!("{}={}", t.name, t.matrix.stored_name()))
        .collect();
    if !fell_back.is_empty() {
        map.insert("qdrift.fallback".to_owned(), fell_back.join(","));
    }
    for (key, value) in extra {
        if map.insert(key.clone(), value.clone()).is_some() {
            return Err(WriteError::MetadataKey { path: path.to_path_buf(), key: key.clone() });
        }
    }
    Ok(map)
}

/// A tensor to write: f32 values of the model (bytes made when the writer asks for them, so the
/// whole file is never held in memory twice) or a packed part.
enum OutTensor<'a> {
    F32 {
        shape: Vec<usize>,
        values: &'a [f32],
        /// Source row of each written row (q/k), validated against `shape`.
        row_order: Option<Vec<usize>>,
    },
    Part {
        dtype: Dtype,
        shape: Vec<usize>,
        bytes: Vec<u8>,
    },
}

impl View for OutTensor<'_> {
    fn dtype(&self) -> Dtype {
        match self {
            OutTensor::F32 { .. } => Dtype::F32,
            OutTensor::Part { dtype, .. } => *dtype,
        }
    }

    fn shape(&self) -> &[usize] {
        match self {
            OutTensor::F32 { shape, .. } | OutTensor::Part { shape, .. } => shape,
        }
    }

    fn data(&self) -> Cow<'_, [u8]> {
        match self {
            OutTensor::F32 { values, row_order: None, .. } => {
                Cow::Owned(values.iter().flat_map(|v| v.to_le_bytes()).collect())
            }
            OutTensor::F32 { values, row_order: Some(order), .. } => {
                let cols = values.len().checked_div(order.len()).unwrap_or(0);
                Cow::Owned(
                    order
                        .iter()
                        .flat_map(|&r| &values[r * cols..(r + 1) * cols])
                        .flat_map(|v| v.to_le_bytes())
                        .collect(),
                )
            }
            OutTensor::Part { bytes, .. } => Cow::Borrowed(bytes),
        }
    }

    fn data_len(&self) -> usize {
        match self {
            OutTensor::F32 { values, .. } => 4 * values.len(),
            OutTensor::Part { bytes, .. } => bytes.len(),
        }
    }
}

fn safetensors_dtype(dtype: PackedDtype) -> Dtype {
    match dtype {
        PackedDtype::U8 => Dtype::U8,
        PackedDtype::I8 => Dtype::I8,
        PackedDtype::F16 => Dtype::F16,
        PackedDtype::BF16 => Dtype::BF16,
        PackedDtype::F32 => Dtype::F32,
        PackedDtype::F8E4M3 => Dtype::F8_E4M3,
        PackedDtype::F8E5M2 => Dtype::F8_E5M2,
        PackedDtype::I32 => Dtype::I32,
        PackedDtype::I64 => Dtype::I64,
    }
}

/// The safetensors dtype of a packed Hugging Face tensor.
fn hf_dtype(dtype: HfDtype) -> Dtype {
    match dtype {
        HfDtype::I8 => Dtype::I8,
        HfDtype::U8 => Dtype::U8,
        HfDtype::I32 => Dtype::I32,
        HfDtype::I64 => Dtype::I64,
        HfDtype::F16 => Dtype::F16,
        HfDtype::F32 => Dtype::F32,
        HfDtype::F8E4M3 => Dtype::F8_E4M3,
        HfDtype::F8E5M2 => Dtype::F8_E5M2,
    }
}

/// Gathers the named tensors of one file.
struct Collector<'a> {
    path: &'a Path,
    model: &'a QuantizedModel,
    packed: bool,
    out: Vec<(String, OutTensor<'a>)>,
}

/// How q/k rows are permuted: `(n_heads, head_dim)`.
type Rope = Option<(usize, usize)>;

impl<'a> Collector<'a> {
    fn collect(mut self) -> Result<Vec<(String, OutTensor<'a>)>, WriteError> {
        let m = &self.model.dequantized;
        let arch = &m.arch;
        if arch.n_heads == 0 || arch.n_kv_heads == 0 || !arch.dim.is_multiple_of(arch.n_heads) {
            return Err(self.layout(
                "model.layers.*.self_attn",
                format!(
                    "dim {} is not split evenly into {} query heads ({} kv heads)",
                    arch.dim, arch.n_heads, arch.n_kv_heads
                ),
            ));
        }
        let head_dim = arch.head_dim();
        self.weight(WeightSlot::TokenEmbedding, &m.token_embedding, None)?;
        for (i, layer) in m.layers.iter().enumerate() {
            self.dense(format!("model.layers.{i}.input_layernorm.weight"), &layer.attn_norm)?;
            self.dense(format!("model.layers.{i}.post_attention_layernorm.weight"), &layer.ffn_norm)?;
            for (short_name, w) in layer.linears() {
                let rope = match short_name.role {
                    "self_attn.q_proj" => Some((arch.n_heads, head_dim)),
                    "self_attn.k_proj" => Some((arch.n_kv_heads, head_dim)),
                    _ => None,
                };
                self.weight(WeightSlot::Linear { layer: i, short_name }, w, rope)?;
            }
            let biases = [
                ("q_proj", &layer.bq, Some(arch.n_heads)),
                ("k_proj", &layer.bk, Some(arch.n_kv_heads)),
                ("v_proj", &layer.bv, None),
            ];
            for (short_name, bias, heads) in biases {
                if let Some(b) = bias {
                    let name = format!("model.layers.{i}.self_attn.{short_name}.bias");
                    self.bias(name, b, heads.map(|h| (h, head_dim)))?;
                }
            }
        }
        self.dense("model.norm.weight".to_owned(), &m.final_norm)?;
        if let Some(head) = &m.output {
            self.weight(WeightSlot::OutputHead, head, None)?;
        }
        Ok(self.out)
    }

    fn layout(&self, tensor: &str, message: String) -> WriteError {
        WriteError::Layout { path: self.path.to_path_buf(), tensor: tensor.to_owned(), message }
    }

    /// A tensor written as F32 whatever the mode (norms).
    fn dense(&mut self, name: String, t: &'a HostTensor) -> Result<(), WriteError> {
        if t.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) != Some(t.data.len()) {
            return Err(self.layout(&name, format!("shape {:?} does not hold {} values", t.shape, t.data.len())));
        }
        self.out.push((name, OutTensor::F32 { shape: t.shape.clone(), values: &t.data, row_order: None }));
        Ok(())
    }

    /// The rotate-half permutation of `count` rows (`what`: "rows" or "values", for the error)
    /// that are `rope`'s heads of an even head dimension; `None` when `rope` is.
    fn row_order(&self, name: &str, rope: Rope, count: usize, what: &str) -> Result<Option<Vec<usize>>, WriteError> {
        let Some((heads, head_dim)) = rope else {
            return Ok(None);
        };
        if !head_dim.is_multiple_of(2) || heads.checked_mul(head_dim) != Some(count) {
            return Err(
                self.layout(name, format!("{count} {what} are not {heads} heads of an even head dimension {head_dim}"))
            );
        }
        Ok(Some(rotate_half_row_order(heads, head_dim)))
    }

    /// A q/k/v bias, F32; q/k rows permuted to rotate-half as their weights are.
    fn bias(&mut self, name: String, t: &'a HostTensor, rope: Rope) -> Result<(), WriteError> {
        let n = t.data.len();
        if t.shape != [n] {
            return Err(self.layout(&name, format!("shape {:?} is not a vector of {n} values", t.shape)));
        }
        let row_order = self.row_order(&name, rope, n, "values")?;
        self.out.push((name, OutTensor::F32 { shape: t.shape.clone(), values: &t.data, row_order }));
        Ok(())
    }

    /// A weight matrix: packed parts when packing and quantized, F32 otherwise; q/k rows
    /// permuted to rotate-half.
    fn weight(&mut self, slot: WeightSlot, t: &'a HostTensor, rope: Rope) -> Result<(), WriteError> {
        let name = slot.hf_name();
        let [rows, _] = crate::model::matrix_shape(&name, t).map_err(|e| WriteError::Layout {
            path: self.path.to_path_buf(),
            tensor: name.clone(),
            message: e.to_string(),
        })?;
        let row_order = self.row_order(&name, rope, rows, "rows")?;
        let quantized = if self.packed { self.model.tensor(slot) } else { None };
        let Some(q) = quantized else {
            self.out.push((name, OutTensor::F32 { shape: t.shape.clone(), values: &t.data, row_order }));
            return Ok(());
        };
        let base = name.strip_suffix(".weight").unwrap_or(&name).to_owned();
        for part in q.matrix.parts() {
            let part_name = format!("{base}.{}", part.name);
            let part = match &row_order {
                None => part,
                Some(order) => permute_part_rows(part, rows, order).map_err(|m| self.layout(&part_name, m))?,
            };
            self.out.push((
                part_name,
                OutTensor::Part { dtype: safetensors_dtype(part.dtype), shape: part.shape, bytes: part.bytes },
            ));
        }
        Ok(())
    }
}

/// Reorders the rows of a packed part: written row `r` is row `order[r]`. A part of one element
/// (a per-tensor scale) is left as is.
///
/// # Shapes
/// - `part.shape`: `[rows, ...]` or one element in all; `order`: `rows` indices.
fn permute_part_rows(part: PackedPart, rows: usize, order: &[usize]) -> Result<PackedPart, String> {
    if part.shape.first() != Some(&rows) {
        return if part.shape.iter().product::<usize>() == 1 {
            Ok(part)
        } else {
            Err(format!("packed part of shape {:?} is neither per row ({rows} rows) nor per tensor", part.shape))
        };
    }
    let row_bytes = part.bytes.len().checked_div(rows).unwrap_or(0);
    if rows == 0 || row_bytes * rows != part.bytes.len() || order.len() != rows {
        return Err(format!("{} bytes do not split into {rows} rows", part.bytes.len()));
    }
    let bytes = order.iter().flat_map(|&r| &part.bytes[r * row_bytes..(r + 1) * row_bytes]).copied().collect();
    Ok(PackedPart { bytes, ..part })
}

/// Writes `model` as a quantized Hugging Face folder in `layout` ([`crate::pack_hf`]), with
/// `tokenizer`, and returns the model a reader of the folder must produce (the packed layers
/// dequantized).
///
/// The folder is [`qdrift_load::write::write_hf_folder`]'s at F16 (so `model` should hold FP16
/// values, such as [`crate::round_to_fp16_reference`]'s, for the unquantized tensors to read back
/// unchanged), with each packed layer's `.weight` replaced by its packed tensors and
/// `quantization_config` added to `config.json`. Fixtures for readers' tests, not a conversion
/// tool; each file is written atomically, the folder as a whole is not.
///
/// # Errors
/// [`WriteError::Quantize`] when a quantizer refuses the weights, [`WriteError::Folder`] when a
/// file cannot be written or read back.
pub fn write_hf_quantized(
    dir: &Path,
    model: &HostModel,
    tokenizer: &qdrift_load::Llama2cTokenizer,
    layout: crate::hf_packed::HfLayout,
) -> Result<HostModel, WriteError> {
    let folder = |path: &Path, message: String| WriteError::Folder { path: path.to_path_buf(), message };
    let packed = crate::hf_packed::pack_hf(model, layout)
        .map_err(|source| WriteError::Quantize { path: dir.to_path_buf(), source })?;
    qdrift_load::write::write_hf_folder(dir, model, tokenizer, qdrift_load::write::WriteDtype::F16)
        .map_err(|e| folder(dir, e.to_string()))?;
    let weights = dir.join("model.safetensors");
    let bytes = qdrift_io::read_capped(&weights, u64::MAX, "model").map_err(io_error)?;
    let base = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| folder(&weights, e.to_string()))?;
    let mut tensors: Vec<(String, OutTensor<'_>)> = Vec::new();
    for (name, view) in base.tensors() {
        if packed.replaced.contains(&name) {
            continue;
        }
        let (dtype, shape, bytes) = (view.dtype(), view.shape().to_vec(), view.data().to_vec());
        tensors.push((name, OutTensor::Part { dtype, shape, bytes }));
    }
    for t in &packed.tensors {
        let (dtype, shape, bytes) = (hf_dtype(t.dtype), t.shape.clone(), t.bytes.clone());
        tensors.push((t.name.clone(), OutTensor::Part { dtype, shape, bytes }));
    }
    serialize_atomic(&weights, tensors, None)?;
    let config_path = dir.join("config.json");
    let text = qdrift_io::read_capped(&config_path, 64 << 20, "config").map_err(io_error)?;
    let mut config: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| folder(&config_path, e.to_string()))?;
    let q: serde_json::Value =
        serde_json::from_str(&packed.quantization_config).map_err(|e| folder(&config_path, e.to_string()))?;
    if let Some(obj) = config.as_object_mut() {
        obj.insert("quantization_config".into(), q);
    }
    let text = serde_json::to_string_pretty(&config).map_err(|e| folder(&config_path, e.to_string()))?;
    qdrift_io::write_atomic(&config_path, text.as_bytes()).map_err(io_error)?;
    Ok(packed.dequantized)
}

/// The files of a Hugging Face folder besides its weights and `config.json` that
/// [`write_compressed_tensors`] carries over from the source folder when present.
const CARRIED_FILES: [&str; 7] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
];

/// Writes `model`, quantized with an FP4 scheme, as a compressed-tensors folder `dir` that
/// compressed-tensors (and so vLLM) loads: `nvfp4` as `nvfp4-pack-quantized`, `mxfp4-ct` and
/// `mxfp4-ocp` as `mxfp4-pack-quantized` (`hf_packed::ct_fp4_scheme`).
///
/// - `model.safetensors`: [`write_safetensors`]' packed file, whose FP4 parts are
///   compressed-tensors' own tensors (`….weight_packed`, `….weight_scale`,
///   `….weight_global_scale`); the other tensors F32.
/// - `config.json`: the source folder's, with `quantization_config` (`targets: ["Linear"]`,
///   `ignore: ["lm_head"]` unless the head was quantized) from `qdrift-load`'s
///   compressed-tensors code, which also reads the folder back.
/// - the source's tokenizer and generation files (`CARRIED_FILES`), copied.
///
/// Every file is written atomically; the folder as a whole is not.
///
/// # Errors
/// [`WriteError::Folder`] when the scheme has no compressed-tensors FP4 layout, the source is not
/// a Hugging Face folder, the model has experts (their routers are not written yet) or other
/// tensors beyond the Llama and Qwen2 layouts [`write_safetensors`] writes, or a quantized
/// embedding (compressed-tensors quantizes `Linear` layers only), or a file cannot be
/// read or written; [`WriteError::Layout`] for a quantized matrix whose rows are not whole
/// groups (compressed-tensors refuses them).
pub fn write_compressed_tensors(dir: &Path, model: &QuantizedModel, source: &Path) -> Result<(), WriteError> {
    let folder = |path: &Path, message: String| WriteError::Folder { path: path.to_path_buf(), message };
    let Some((scheme, group)) = crate::hf_packed::ct_fp4_scheme(&model.scheme) else {
        return Err(folder(
            dir,
            format!(
                "scheme {}: compressed-tensors folders are written for nvfp4, mxfp4-ct and mxfp4-ocp",
                model.scheme
            ),
        ));
    };
    let config_path = source.join("config.json");
    if !config_path.is_file() {
        return Err(folder(
            source,
            "a compressed-tensors folder is written from a Hugging Face folder (its config.json and tokenizer \
             files are carried over)"
                .into(),
        ));
    }
    if model.dequantized.arch.moe.is_some() {
        return Err(folder(dir, "a compressed-tensors folder of a mixture of experts is not written yet".into()));
    }
    if model.options.quantize_embeddings {
        return Err(folder(dir, "compressed-tensors quantizes Linear layers only: drop --quantize-embeddings".into()));
    }
    if let Some(t) = model.tensors.iter().find(|t| !t.shape[1].is_multiple_of(group)) {
        return Err(WriteError::Layout {
            path: dir.to_path_buf(),
            tensor: t.name.clone(),
            message: format!("{} inputs per row are not whole {} groups of {group}", t.shape[1], model.scheme),
        });
    }
    // Every tensor the model holds must be among those the Llama-layout writer writes.
    let written: usize = Collector { path: dir, model, packed: false, out: Vec::new() }
        .collect()?
        .iter()
        .map(|(_, t)| t.shape().iter().product::<usize>())
        .sum();
    if written != model.dequantized.parameter_count() {
        return Err(folder(
            dir,
            format!(
                "the {} model has tensors (q/k norms, sinks, ...) that the safetensors writer does not write yet \
                 (Llama and Qwen2 layouts only)",
                model.dequantized.arch.architecture
            ),
        ));
    }
    let text = qdrift_io::read_capped(&config_path, 64 << 20, "config").map_err(io_error)?;
    let mut config: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| folder(&config_path, e.to_string()))?;
    let head_quantized = model.tensor(WeightSlot::OutputHead).is_some();
    let ignore = if head_quantized { vec![] } else { vec!["lm_head".to_string()] };
    let groups = vec![qdrift_load::hf::quant::CtGroup { targets: vec!["Linear".to_string()], scheme }];
    let q = qdrift_load::hf::quant::Compressed { groups, ignore }.quantization_config();
    let q: serde_json::Value = serde_json::from_str(&q).map_err(|e| folder(dir, e.to_string()))?;
    let Some(obj) = config.as_object_mut() else {
        return Err(folder(&config_path, "config.json is not a JSON object".into()));
    };
    obj.insert("quantization_config".into(), q);
    std::fs::create_dir_all(dir).map_err(|e| folder(dir, format!("cannot create the folder: {e}")))?;
    write_safetensors(&dir.join("model.safetensors"), model, true, &[])?;
    let text = serde_json::to_string_pretty(&config).map_err(|e| folder(dir, e.to_string()))?;
    qdrift_io::write_atomic(&dir.join("config.json"), text.as_bytes()).map_err(io_error)?;
    for name in CARRIED_FILES {
        let from = source.join(name);
        if from.is_file() {
            let bytes = qdrift_io::read_capped(&from, 1 << 30, "tokenizer").map_err(io_error)?;
            qdrift_io::write_atomic(&dir.join(name), &bytes).map_err(io_error)?;
        }
    }
    Ok(())
}
