//! The GGUF writer: [`write_gguf`](super::write_gguf) (a [`HostModel`] with a SentencePiece-style
//! [`Llama2cTokenizer`], readable by [`crate::open_model`] and llama.cpp; fixtures for the
//! readers' tests) and [`write_gguf_with`](super::write_gguf_with), the writer `qdrift quantize --format gguf` uses:
//! matrices stored as the caller packed them (ggml blocks), the tokenizer metadata carried over
//! from the source ([`crate::write::gguf_tokenizer_keys`]).

use std::borrow::Cow;
use std::path::Path;

use qdrift_ggml::GgmlType;

use super::read::GgufValue;
use crate::LoadError;
use crate::hf::write::WriteDtype;
use crate::rope_layout::RopeLayout::ToRotateHalf;
use crate::rope_layout::{permute_rows, rotate_half_row_order};
use qdrift_weights::{HostModel, HostTensor, LinearName, ModelArch, RopeScaling};

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
pub(super) struct Kv(u64, Vec<u8>);

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
    pub(super) fn u32(&mut self, k: &str, v: u32) {
        self.key(k, GGUF_U32).extend(v.to_le_bytes());
    }
    pub(super) fn f32(&mut self, k: &str, v: f32) {
        self.key(k, GGUF_F32).extend(v.to_le_bytes());
    }
    pub(super) fn string(&mut self, k: &str, v: &str) {
        Self::str_raw(self.key(k, GGUF_STRING), v);
    }
    /// Any value, with the type it was read with ([`value_type`]).
    pub(super) fn value(&mut self, k: &str, v: &GgufValue) {
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

/// Which matrix of a [`HostModel`] a GGUF tensor holds, for [`write_gguf_with`](super::write_gguf_with)'s `store`.
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
        short_name: LinearName,
    },
}

/// A matrix as the caller of [`write_gguf_with`](super::write_gguf_with) stores it: a `ggml_type` id (`GGML_TYPE_F16`
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

/// `general.*` (`general.name`: `name`, see [`gguf_name`]) and the `ARCH.*` hyper-parameters.
pub(super) fn gguf_arch_metadata(
    kv: &mut Kv,
    path: &Path,
    (a, name): (&ModelArch, &str),
    arch: &str,
) -> Result<(), LoadError> {
    kv.string("general.architecture", arch);
    kv.string("general.name", name);
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
    kv.u32(&k("rope.dimension_count"), u(a.rotary_dim())?);
    kv.u32(&k("vocab_size"), u(a.vocab_size)?);
    if a.head_dim * a.n_heads != a.dim {
        // llama.cpp's head width when it is not `n_embd / n_head` (`load_hparams`).
        kv.u32(&k("attention.key_length"), u(a.head_dim)?);
        kv.u32(&k("attention.value_length"), u(a.head_dim)?);
    }
    Ok(())
}

/// `general.name` of a file of `a` with the vocabulary of `tokenizer_keys`: the architecture's
/// name, unless llama.cpp would read more into it. llama.cpp sets per-token attributes by model
/// name (`llama_vocab::impl::load`): a name containing `phi3` or `phi-3` makes it look up Phi-3's
/// `</s>`, `<unk>`, `<s>` and `<|endoftext|>`, and loading fails (`unordered_map::at`) when one
/// is missing. Such a vocabulary (Phi-4-mini's has no `</s>`) gets the name `phi` instead.
pub(super) fn gguf_name(a: &ModelArch, tokenizer_keys: &[(String, GgufValue)]) -> String {
    let name = a.architecture.to_lowercase();
    if !(name.contains("phi3") || name.contains("phi-3")) {
        return a.architecture.clone();
    }
    let tokens = tokenizer_keys.iter().find(|(k, _)| k == "tokenizer.ggml.tokens").map(|(_, v)| v);
    let has = |t: &str| match tokens {
        Some(GgufValue::Array(tokens)) => tokens.iter().any(|v| matches!(v, GgufValue::String(s) if s == t)),
        _ => false,
    };
    if ["</s>", "<unk>", "<s>", "<|endoftext|>"].into_iter().all(has) { a.architecture.clone() } else { "phi".into() }
}

/// llama.cpp's converter (`convert_hf_to_gguf.py`, `LlamaModel.generate_extra_tensors`) turns
/// Llama 3.1's `rope_scaling` into the per-pair divisors of `rope_freqs.weight`: 1 where
/// `wavelen < high`, `factor` where `wavelen > low`, `1 / ((1 - smooth) / factor + smooth)`
/// between (see [`RopeScaling::Llama3`]), computed in f32 from the f32 inverse frequencies.
pub(super) fn llama3_freq_factors(scaling: &RopeScaling, head_dim: usize, theta: f32) -> Option<Vec<f32>> {
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

/// A tensor to write under llama.cpp's name.
pub(super) struct GgufTensor<'a> {
    pub(super) name: String,
    /// The values, q/k rows already in the file's layout (a matrix `[out, in]`, or experts
    /// stacked `[E, out, in]`).
    pub(super) tensor: Cow<'a, HostTensor>,
    /// The matrices it is made of, in row order, whose stored form `store` may give (empty for
    /// 1-D norms, biases, routers, sinks and `rope_freqs.weight`, which are stored as F32 whatever
    /// the dtype, as llama.cpp's converter does).
    pub(super) parts: Vec<Part>,
}

/// One matrix of a [`GgufTensor`]: which one, its shape, and the row order it is written in.
pub(super) struct Part {
    pub(super) matrix: GgufMatrix,
    pub(super) rows: usize,
    pub(super) cols: usize,
    /// Rotate-half q/k rows: written row `r` is the matrix's row `order[r]`.
    pub(super) order: Option<Vec<usize>>,
}

impl Part {
    /// A matrix `[rows, cols]` written in its own row order.
    pub(super) fn of(matrix: GgufMatrix, t: &HostTensor) -> Part {
        let rows = t.shape.first().copied().unwrap_or(0);
        let cols = t.data.len() / rows.max(1);
        Part { matrix, rows, cols, order: None }
    }
}

/// Every tensor in file order, under llama.cpp's names; `qwen2` q/k rows in the rotate-half
/// layout; RoPE scaling as `rope_freqs.weight`.
pub(super) fn gguf_tensors<'a>(
    path: &Path,
    model: &'a HostModel,
    qwen2: bool,
) -> Result<Vec<GgufTensor<'a>>, LoadError> {
    let a = &model.arch;
    let rope_rows = |t: &HostTensor, heads: usize| -> HostTensor {
        if qwen2 { permute_rows(t, heads, ToRotateHalf) } else { t.clone() }
    };
    let matrix = |name: String, t: Cow<'a, HostTensor>, m: GgufMatrix| {
        let parts = vec![Part::of(m, &t)];
        GgufTensor { name, tensor: t, parts }
    };
    let vector = |name: String, t: Cow<'a, HostTensor>| GgufTensor { name, tensor: t, parts: Vec::new() };
    let rope_part = |mut t: GgufTensor<'a>, heads: usize| {
        if qwen2 {
            for p in &mut t.parts {
                p.order = Some(rotate_half_row_order(heads, p.rows / heads.max(1)));
            }
        }
        t
    };
    let mut tensors =
        vec![matrix("token_embd.weight".into(), Cow::Borrowed(&model.token_embedding), GgufMatrix::TokenEmbedding)];
    if let Some(s) = &a.rope_scaling {
        let factors = match s {
            RopeScaling::FreqFactors { factors } => factors.clone(),
            RopeScaling::Llama3 { .. } => llama3_freq_factors(s, a.head_dim(), a.rope_theta).unwrap_or_default(),
            RopeScaling::Linear { .. } | RopeScaling::Yarn { .. } => {
                return Err(LoadError::invalid(path, "linear and YaRN RoPE scaling cannot be written to GGUF yet"));
            }
            RopeScaling::LongRope { .. } => {
                return Err(LoadError::invalid(path, "LongRoPE scaling is written to GGUF for phi3 only"));
            }
        };
        let t = HostTensor::new(vec![factors.len()], factors)
            .ok_or_else(|| LoadError::invalid(path, "RoPE frequency factors"))?;
        tensors.push(vector("rope_freqs.weight".into(), Cow::Owned(t)));
    }
    for (i, l) in model.layers.iter().enumerate() {
        let b = format!("blk.{i}");
        let lin = |short_name: &'static str| GgufMatrix::Linear { layer: i, short_name: LinearName::dense(short_name) };
        tensors.push(vector(format!("{b}.attn_norm.weight"), Cow::Borrowed(&l.attn_norm)));
        let q = matrix(format!("{b}.attn_q.weight"), Cow::Owned(rope_rows(&l.wq, a.n_heads)), lin("self_attn.q_proj"));
        tensors.push(rope_part(q, a.n_heads));
        let k =
            matrix(format!("{b}.attn_k.weight"), Cow::Owned(rope_rows(&l.wk, a.n_kv_heads)), lin("self_attn.k_proj"));
        tensors.push(rope_part(k, a.n_kv_heads));
        tensors.push(matrix(format!("{b}.attn_v.weight"), Cow::Borrowed(&l.wv), lin("self_attn.v_proj")));
        if let (Some(bq), Some(bk), Some(bv)) = (&l.bq, &l.bk, &l.bv) {
            tensors.push(vector(format!("{b}.attn_q.bias"), Cow::Owned(rope_rows(bq, a.n_heads))));
            tensors.push(vector(format!("{b}.attn_k.bias"), Cow::Owned(rope_rows(bk, a.n_kv_heads))));
            tensors.push(vector(format!("{b}.attn_v.bias"), Cow::Borrowed(bv)));
        }
        tensors.push(matrix(format!("{b}.attn_output.weight"), Cow::Borrowed(&l.wo), lin("self_attn.o_proj")));
        tensors.push(vector(format!("{b}.ffn_norm.weight"), Cow::Borrowed(&l.ffn_norm)));
        let m =
            l.mlp().ok_or_else(|| LoadError::invalid(path, "a mixture of experts cannot be written to GGUF yet"))?;
        tensors.push(matrix(format!("{b}.ffn_gate.weight"), Cow::Borrowed(&m.gate), lin("mlp.gate_proj")));
        tensors.push(matrix(format!("{b}.ffn_up.weight"), Cow::Borrowed(&m.up), lin("mlp.up_proj")));
        tensors.push(matrix(format!("{b}.ffn_down.weight"), Cow::Borrowed(&m.down), lin("mlp.down_proj")));
    }
    tensors.push(vector("output_norm.weight".into(), Cow::Borrowed(&model.final_norm)));
    if let Some(o) = &model.output {
        tensors.push(matrix("output.weight".into(), Cow::Borrowed(o), GgufMatrix::Output));
    }
    Ok(tensors)
}

/// The file: header (magic, version 3, counts), metadata, tensor infos, then the data section
/// (aligned to [`ALIGNMENT`], each tensor at an aligned offset).
pub(super) fn gguf_bytes(
    path: &Path,
    kv: &Kv,
    tensors: &[GgufTensor<'_>],
    dtype: WriteDtype,
    store: &dyn Fn(GgufMatrix) -> Option<GgufStored>,
) -> Result<Vec<u8>, LoadError> {
    let mut infos = Vec::new();
    let mut data = Vec::new();
    for GgufTensor { name, tensor, parts } in tensors {
        let (ty, bytes) = tensor_bytes(path, name, tensor, parts, dtype, store)?;
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

/// A tensor's `ggml_type` and bytes: F32 for one without matrices; else every matrix as `store`
/// gives it (all in one type, concatenated in order), or the values in `dtype` when `store` gives
/// none of them.
///
/// # Shapes
/// - `tensor`: the values in the file's layout; `parts`: its matrices, whose rows add up to its
///   outer dims.
fn tensor_bytes(
    path: &Path,
    name: &str,
    tensor: &HostTensor,
    parts: &[Part],
    dtype: WriteDtype,
    store: &dyn Fn(GgufMatrix) -> Option<GgufStored>,
) -> Result<(u32, Vec<u8>), LoadError> {
    let stored: Vec<Option<GgufStored>> = parts.iter().map(|p| store(p.matrix)).collect();
    if stored.iter().all(Option::is_none) {
        return Ok(if parts.is_empty() || dtype == WriteDtype::F32 {
            (GGML_F32, WriteDtype::F32.bytes(tensor))
        } else {
            (GGML_F16, WriteDtype::F16.bytes(tensor))
        });
    }
    let mut ty = None;
    let mut bytes = Vec::new();
    for (part, s) in parts.iter().zip(stored) {
        let Some(s) = s else {
            return Err(LoadError::invalid(
                path,
                format!("tensor {name}: some of its matrices are stored, others not"),
            ));
        };
        if ty.is_some_and(|t| t != s.ggml_type) {
            return Err(LoadError::invalid(
                path,
                format!("tensor {name}: its matrices are stored in different ggml types ({ty:?} and {})", s.ggml_type),
            ));
        }
        ty = Some(s.ggml_type);
        bytes.extend(stored_rows(path, name, part, s)?);
    }
    Ok((ty.unwrap_or(GGML_F32), bytes))
}

/// A stored matrix's bytes, checked against its shape and type, rows reordered when the part
/// has an order (rotate-half q/k).
///
/// # Shapes
/// - `part`: `[rows, cols]`; `stored.bytes`: `rows` rows of `cols / block_size * type_size`
///   bytes (`2 * cols` for F16).
fn stored_rows(path: &Path, name: &str, part: &Part, stored: GgufStored) -> Result<Vec<u8>, LoadError> {
    let bad = |m: String| LoadError::invalid(path, format!("tensor {name}: {m}"));
    let (rows, cols) = (part.rows, part.cols);
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
    let Some(order) = &part.order else { return Ok(stored.bytes) };
    Ok(order.iter().flat_map(|&r| &stored.bytes[r * row_bytes..(r + 1) * row_bytes]).copied().collect())
}
