//! GGUF files (versions 2 and 3) with the `llama` or `qwen2` architecture.
//!
//! Spec: ggml's `docs/gguf.md`; type ids from `ggml/include/ggml.h` (`ggml_type`) and llama.cpp's
//! `gguf-py/gguf/constants.py` (`GGUFValueType`, `GGMLQuantizationType`, `Keys`). Layout, all
//! little-endian: magic `GGUF`, `u32` version, `u64` tensor count, `u64` metadata count; the
//! metadata key/value pairs (key = string; `u32` value type; value), where a string is a `u64`
//! length and UTF-8 bytes and an array is `u32` element type, `u64` count and the elements; then
//! per tensor: name, `u32` n_dims, `n_dims` × `u64` dims (`ne0`, the row length, first), `u32`
//! `ggml_type`, `u64` offset. The data section starts at the first multiple of
//! `general.alignment` (default 32) after the tensor infos; each offset is relative to it.
//!
//! Every count and length is checked against the bytes that remain before anything is allocated,
//! so a corrupt header is an error naming the file, never a panic or a huge allocation.
//!
//! Tensors are dequantized to f32 ([`HostModel`]'s form): F32, F16, BF16 and the GGML block formats
//! of `qdrift-ggml` (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K, MXFP4). A GGUF matrix with dims
//! `[ne0 = in, ne1 = out]` is `[out, in]` row-major, which is [`HostModel`]'s linear layout as
//! is. For `llama`, q/k are kept as stored: llama.cpp's converter already permutes them into the
//! interleaved RoPE layout qdrift uses (llama.cpp's `LLAMA_ROPE_TYPE_NORM`). `qwen2` files keep
//! Hugging Face's rotate-half layout (llama.cpp runs them with `LLAMA_ROPE_TYPE_NEOX`), so their
//! q/k weights and biases are un-permuted as [`crate::read_hf_folder`] does.
//!
//! Hyper-parameters are read from `{arch}.*` keys (`llama.embedding_length`,
//! `qwen2.embedding_length`, ...). Biases: `blk.N.attn_{q,k,v}.bias` (required for `qwen2`,
//! optional for `llama`, as in llama.cpp); any other `.bias` tensor is refused. RoPE, as llama.cpp
//! `llama_model::load_hparams` reads it: `{arch}.rope.dimension_count` must equal the head
//! dimension (partial rotary embeddings are refused); the per-pair divisors of
//! `rope_freqs.weight` (`[head_dim / 2]`, Llama 3.1's scaling as llama.cpp's converter writes it)
//! and the linear factor `{arch}.rope.scaling.factor` (older files: `{arch}.rope.scale_linear`;
//! applied when `{arch}.rope.scaling.type` is `linear` or absent, ignored for `none`) become
//! [`RopeScaling::FreqFactors`]; other scaling types (`yarn`, `longrope`) are refused.
//!
//! The embedded tokenizer's metadata is kept in [`GgufModel::tokenizer`];
//! [`crate::gguf_tokenizer`] builds the tokenizer from it. [`GgufModel::metadata`] has every key.

use std::collections::BTreeMap;
use std::path::Path;

use qdrift_ggml::GgmlType;

use crate::hf::permute_rows;
use crate::{HostModel, HostTensor, LayerWeights, LlamaArch, LoadError, RopeScaling};

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// `GGML_MAX_DIMS`.
const MAX_DIMS: u32 = 4;
/// Arrays of arrays deeper than this are refused (the spec allows nesting; no model uses it).
const MAX_ARRAY_DEPTH: u32 = 4;

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    /// `UINT8` (0).
    U8(u8),
    /// `INT8` (1).
    I8(i8),
    /// `UINT16` (2).
    U16(u16),
    /// `INT16` (3).
    I16(i16),
    /// `UINT32` (4).
    U32(u32),
    /// `INT32` (5).
    I32(i32),
    /// `FLOAT32` (6).
    F32(f32),
    /// `BOOL` (7).
    Bool(bool),
    /// `STRING` (8); invalid UTF-8 is replaced by U+FFFD.
    String(String),
    /// `ARRAY` (9), all elements of one type.
    Array(Vec<GgufValue>),
    /// `UINT64` (10).
    U64(u64),
    /// `INT64` (11).
    I64(i64),
    /// `FLOAT64` (12).
    F64(f64),
}

impl GgufValue {
    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as an f64, if it is a float or an integer.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            GgufValue::I8(v) => Some(v.into()),
            GgufValue::I16(v) => Some(v.into()),
            GgufValue::I32(v) => Some(v.into()),
            GgufValue::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    /// The string, if it is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The boolean, if it is one.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The elements, if it is an array.
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// The tokenizer metadata of a GGUF file (`tokenizer.ggml.*`, `tokenizer.chat_template`), from
/// which [`crate::gguf_tokenizer`] builds the tokenizer. Absent keys are `None` or empty.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GgufTokenizerMetadata {
    /// `tokenizer.ggml.model`: `gpt2` (byte-level BPE), `llama` (SentencePiece), ...
    pub model: Option<String>,
    /// `tokenizer.ggml.pre`: the pre-tokenizer variant of a BPE tokenizer (`smollm`, `llama-bpe`).
    pub pre: Option<String>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unknown_token_id: Option<u32>,
    /// `tokenizer.ggml.tokens`, indexed by token id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores` (SentencePiece), one per token.
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.merges` (BPE), `"left right"` in priority order.
    pub merges: Vec<String>,
    /// `tokenizer.ggml.token_type` (1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte).
    pub token_type: Option<Vec<i32>>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_token_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_token_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`.
    pub add_bos_token: Option<bool>,
    /// `tokenizer.chat_template` (Jinja).
    pub chat_template: Option<String>,
}

/// A GGUF file read into host memory.
#[derive(Debug, Clone)]
pub struct GgufModel {
    /// The weights, dequantized to f32, and the architecture.
    pub model: HostModel,
    /// GGUF version (2 or 3).
    pub version: u32,
    /// Every metadata key/value pair.
    pub metadata: BTreeMap<String, GgufValue>,
    /// Tokenizer metadata ([`crate::gguf_tokenizer`] builds the tokenizer from it).
    pub tokenizer: GgufTokenizerMetadata,
    /// Every tensor's name and type name (`F32`, `Q4_1`, ...) in file order.
    pub tensor_types: Vec<(String, &'static str)>,
}

/// Element types of GGUF tensors that this reader dequantizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TensorType {
    F32,
    F16,
    BF16,
    Block(GgmlType),
}

impl TensorType {
    fn from_id(id: u32) -> Option<Self> {
        match id {
            0 => Some(TensorType::F32),
            1 => Some(TensorType::F16),
            30 => Some(TensorType::BF16),
            _ => GgmlType::from_gguf_id(id).map(TensorType::Block),
        }
    }

    /// The name `constants.py` gives the type.
    fn name(self) -> &'static str {
        match self {
            TensorType::F32 => "F32",
            TensorType::F16 => "F16",
            TensorType::BF16 => "BF16",
            TensorType::Block(GgmlType::Q4_0) => "Q4_0",
            TensorType::Block(GgmlType::Q4_1) => "Q4_1",
            TensorType::Block(GgmlType::Q8_0) => "Q8_0",
            TensorType::Block(GgmlType::Q4K) => "Q4_K",
            TensorType::Block(GgmlType::Q6K) => "Q6_K",
            TensorType::Block(GgmlType::Mxfp4) => "MXFP4",
        }
    }

    /// `(elements per block, bytes per block)`.
    fn block(self) -> (u64, u64) {
        match self {
            TensorType::F32 => (1, 4),
            TensorType::F16 | TensorType::BF16 => (1, 2),
            TensorType::Block(t) => (t.block_size() as u64, t.type_size() as u64),
        }
    }
}

/// Names of the `ggml_type` ids this reader does not support, for error messages.
fn unsupported_type_name(id: u32) -> &'static str {
    match id {
        6 => "Q5_0",
        7 => "Q5_1",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        13 => "Q5_K",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        34 => "TQ1_0",
        35 => "TQ2_0",
        _ => "unknown",
    }
}

const SUPPORTED_TYPES: &str = "F32, F16, BF16, Q4_0, Q4_1, Q8_0, Q4_K, Q6_K, MXFP4";

#[derive(Debug)]
struct TensorInfo {
    name: String,
    dims: Vec<u64>,
    ty: TensorType,
    /// Absolute byte range in the file.
    start: usize,
    end: usize,
}

/// Architectures [`read_gguf`] reads, as `general.architecture` names them.
pub const SUPPORTED_GGUF_ARCHITECTURES: &str = "llama, qwen2";

/// Reads a GGUF file with the `llama` or `qwen2` architecture, dequantizing every tensor to f32.
///
/// # Errors
/// [`LoadError`] naming the file and, where it applies, the tensor, its expected dims and what is
/// wrong: an unreadable or truncated file, a bad magic or version, counts or offsets beyond the
/// file, an unsupported tensor type or architecture, a missing or misshapen tensor.
pub fn read_gguf(path: &Path) -> Result<GgufModel, LoadError> {
    let bytes = std::fs::read(path).map_err(|e| LoadError::io(path, e))?;
    parse_gguf(path, &bytes)
}

/// A bounds-checked little-endian cursor.
struct Reader<'a> {
    path: &'a Path,
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8], LoadError> {
        if n > self.remaining() as u64 {
            return Err(LoadError::truncated(
                self.path,
                format!("{} needs {n} bytes at offset {}, the file has {} left", what(), self.pos, self.remaining()),
            ));
        }
        let n = n as usize;
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], LoadError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, LoadError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, LoadError> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, LoadError> {
        let len = self.u64(what)?;
        let bytes = self.take(len, what)?;
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }

    /// Errors unless `count` items of at least `min_size` bytes each fit in what is left.
    fn check_count(&self, count: u64, min_size: u64, what: &dyn Fn() -> String) -> Result<(), LoadError> {
        if count.checked_mul(min_size).is_none_or(|n| n > self.remaining() as u64) {
            return Err(LoadError::invalid(
                self.path,
                format!(
                    "{} declares {count} entries of at least {min_size} bytes each, but only {} bytes remain \
                     (corrupt or truncated file)",
                    what(),
                    self.remaining()
                ),
            ));
        }
        Ok(())
    }

    fn value(&mut self, ty: u32, depth: u32, what: &dyn Fn() -> String) -> Result<GgufValue, LoadError> {
        Ok(match ty {
            0 => GgufValue::U8(self.array::<1>(what)?[0]),
            1 => GgufValue::I8(self.array::<1>(what)?[0] as i8),
            2 => GgufValue::U16(u16::from_le_bytes(self.array(what)?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array(what)?)),
            4 => GgufValue::U32(self.u32(what)?),
            5 => GgufValue::I32(i32::from_le_bytes(self.array(what)?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array(what)?)),
            7 => match self.array::<1>(what)?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => {
                    return Err(LoadError::invalid(self.path, format!("{}: bool byte {b} is neither 0 nor 1", what())));
                }
            },
            8 => GgufValue::String(self.string(what)?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(LoadError::invalid(
                        self.path,
                        format!("{}: arrays nested deeper than {MAX_ARRAY_DEPTH}", what()),
                    ));
                }
                let elem = self.u32(what)?;
                let count = self.u64(what)?;
                let min = min_value_size(elem).ok_or_else(|| {
                    LoadError::invalid(self.path, format!("{}: unknown array element type {elem}", what()))
                })?;
                self.check_count(count, min, what)?;
                let mut out = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    out.push(self.value(elem, depth + 1, what)?);
                }
                GgufValue::Array(out)
            }
            10 => GgufValue::U64(self.u64(what)?),
            11 => GgufValue::I64(i64::from_le_bytes(self.array(what)?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array(what)?)),
            other => {
                return Err(LoadError::invalid(self.path, format!("{}: unknown value type {other}", what())));
            }
        })
    }
}

/// Smallest encoding of a value of type `ty` (for count checks); `None` for an unknown type.
fn min_value_size(ty: u32) -> Option<u64> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 => 8,
        9 => 12,
        10..=12 => 8,
        _ => return None,
    })
}

fn parse_gguf(path: &Path, bytes: &[u8]) -> Result<GgufModel, LoadError> {
    let mut r = Reader { path, bytes, pos: 0 };
    let magic = r.array::<4>(&|| "the magic".to_string())?;
    if &magic != MAGIC {
        return Err(LoadError::invalid(
            path,
            format!("not a GGUF file: magic is {magic:02x?}, expected \"GGUF\" (47 47 55 46)"),
        ));
    }
    let version = r.u32(&|| "the version".to_string())?;
    if version != 2 && version != 3 {
        let hint =
            if version.swap_bytes() <= 3 { " (a big-endian GGUF file? only little-endian is supported)" } else { "" };
        return Err(LoadError::invalid(
            path,
            format!("GGUF version {version} is not supported; supported: 2, 3{hint}"),
        ));
    }
    let tensor_count = r.u64(&|| "the tensor count".to_string())?;
    let kv_count = r.u64(&|| "the metadata count".to_string())?;
    // A key/value pair takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at least
    // 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset).
    r.check_count(kv_count, 13, &|| "the header's metadata count".to_string())?;
    r.check_count(tensor_count, 24, &|| "the header's tensor count".to_string())?;

    let mut metadata = BTreeMap::new();
    for i in 0..kv_count {
        let key = r.string(&|| format!("metadata key {i}"))?;
        let what = || format!("metadata value {key}");
        let ty = r.u32(&what)?;
        let value = r.value(ty, 0, &what)?;
        metadata.insert(key, value);
    }

    let mut raw_infos = Vec::with_capacity(tensor_count as usize);
    for i in 0..tensor_count {
        let name = r.string(&|| format!("the name of tensor {i}"))?;
        let what = || format!("tensor info of {name}");
        let n_dims = r.u32(&what)?;
        if n_dims > MAX_DIMS {
            return Err(LoadError::invalid(
                path,
                format!("tensor {name}: {n_dims} dimensions; GGUF allows at most {MAX_DIMS}"),
            ));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(r.u64(&what)?);
        }
        let type_id = r.u32(&what)?;
        let offset = r.u64(&what)?;
        let ty = TensorType::from_id(type_id).ok_or_else(|| {
            LoadError::invalid(
                path,
                format!(
                    "tensor {name}: GGML type {type_id} ({}) is not supported; supported: {SUPPORTED_TYPES}",
                    unsupported_type_name(type_id)
                ),
            )
        })?;
        raw_infos.push((name, dims, ty, offset));
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u64() {
            Some(a) if a > 0 && a.is_power_of_two() => a,
            _ => {
                return Err(LoadError::invalid(path, format!("general.alignment {v:?} is not a power of two")));
            }
        },
    };
    let data_start = (r.pos as u64).div_ceil(alignment).saturating_mul(alignment);
    if data_start > bytes.len() as u64 {
        return Err(LoadError::truncated(
            path,
            format!("the data section starts at byte {data_start}, the file has {} bytes", bytes.len()),
        ));
    }
    let data_len = bytes.len() as u64 - data_start;

    let mut infos = Vec::with_capacity(raw_infos.len());
    for (name, dims, ty, offset) in raw_infos {
        let n_elements = dims.iter().try_fold(1u64, |n, &d| n.checked_mul(d));
        let (block, block_bytes) = ty.block();
        let size =
            n_elements.and_then(|n| (dims.first().is_none_or(|ne0| ne0 % block == 0)).then(|| n / block * block_bytes));
        let Some(size) = size else {
            return Err(LoadError::invalid(
                path,
                format!(
                    "tensor {name}: dims {dims:?} are not a whole number of {} blocks of {block} elements (or overflow)",
                    ty.name()
                ),
            ));
        };
        let end = offset.checked_add(size).filter(|&e| e <= data_len).ok_or_else(|| {
            LoadError::invalid(
                path,
                format!(
                    "tensor {name}: {size} bytes at data offset {offset} run past the end of the data section \
                     ({data_len} bytes)"
                ),
            )
        })?;
        infos.push(TensorInfo {
            name,
            dims,
            ty,
            start: (data_start + offset) as usize,
            end: (data_start + end) as usize,
        });
    }

    let tensor_types = infos.iter().map(|t| (t.name.clone(), t.ty.name())).collect();
    let tokenizer = tokenizer_metadata(&metadata);
    let model = build_llama(path, bytes, &metadata, &infos, &tokenizer)?;
    Ok(GgufModel { model, version, metadata, tokenizer, tensor_types })
}

fn tokenizer_metadata(m: &BTreeMap<String, GgufValue>) -> GgufTokenizerMetadata {
    let get = |k: &str| m.get(k);
    let strings = |k: &str| -> Vec<String> {
        get(k)
            .and_then(GgufValue::as_array)
            .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
            .unwrap_or_default()
    };
    let id = |k: &str| get(k).and_then(GgufValue::as_u64).and_then(|v| u32::try_from(v).ok());
    GgufTokenizerMetadata {
        model: get("tokenizer.ggml.model").and_then(GgufValue::as_str).map(str::to_string),
        pre: get("tokenizer.ggml.pre").and_then(GgufValue::as_str).map(str::to_string),
        unknown_token_id: id("tokenizer.ggml.unknown_token_id"),
        tokens: strings("tokenizer.ggml.tokens"),
        scores: get("tokenizer.ggml.scores")
            .and_then(GgufValue::as_array)
            .map(|a| a.iter().filter_map(|v| v.as_f64().map(|f| f as f32)).collect()),
        merges: strings("tokenizer.ggml.merges"),
        token_type: get("tokenizer.ggml.token_type")
            .and_then(GgufValue::as_array)
            .map(|a| a.iter().filter_map(|v| v.as_f64().map(|f| f as i32)).collect()),
        bos_token_id: id("tokenizer.ggml.bos_token_id"),
        eos_token_id: id("tokenizer.ggml.eos_token_id"),
        add_bos_token: get("tokenizer.ggml.add_bos_token").and_then(GgufValue::as_bool),
        chat_template: get("tokenizer.chat_template").and_then(GgufValue::as_str).map(str::to_string),
    }
}

fn build_llama(
    path: &Path,
    bytes: &[u8],
    meta: &BTreeMap<String, GgufValue>,
    infos: &[TensorInfo],
    tokenizer: &GgufTokenizerMetadata,
) -> Result<HostModel, LoadError> {
    let arch_name = match meta.get("general.architecture") {
        Some(GgufValue::String(s)) => s.as_str(),
        Some(other) => {
            return Err(LoadError::invalid(path, format!("general.architecture is {other:?}, not a string")));
        }
        None => return Err(LoadError::invalid(path, "general.architecture is missing")),
    };
    // qwen2 keeps Hugging Face's rotate-half q/k rows and always has q/k/v biases.
    let qwen2 = match arch_name {
        "llama" => false,
        "qwen2" => true,
        other => {
            return Err(LoadError::invalid(
                path,
                format!("unsupported architecture {other}; supported: {SUPPORTED_GGUF_ARCHITECTURES}"),
            ));
        }
    };
    let key = |k: &str| format!("{arch_name}.{k}");
    let int = |key: &str, default: Option<usize>| -> Result<usize, LoadError> {
        match meta.get(key) {
            Some(v) => v
                .as_u64()
                .and_then(|v| usize::try_from(v).ok())
                .ok_or_else(|| LoadError::invalid(path, format!("{key} is {v:?}, not a non-negative integer"))),
            None => default.ok_or_else(|| LoadError::invalid(path, format!("{key} is missing"))),
        }
    };
    let float = |key: &str, default: Option<f32>| -> Result<f32, LoadError> {
        match meta.get(key) {
            Some(v) => v
                .as_f64()
                .map(|f| f as f32)
                .ok_or_else(|| LoadError::invalid(path, format!("{key} is {v:?}, not a number"))),
            None => default.ok_or_else(|| LoadError::invalid(path, format!("{key} is missing"))),
        }
    };
    let dim = int(&key("embedding_length"), None)?;
    let n_heads = int(&key("attention.head_count"), None)?;

    let find = |name: &str| infos.iter().find(|t| t.name == name);
    let embd = find("token_embd.weight").ok_or_else(|| {
        LoadError::invalid(
            path,
            format!("tensor token_embd.weight is missing; expected dims [{dim}, vocab] (ne0 first)"),
        )
    })?;
    let vocab_size = match embd.dims.as_slice() {
        [d, v] if *d == dim as u64 => *v as usize,
        other => {
            return Err(LoadError::invalid(
                path,
                format!("tensor token_embd.weight has dims {other:?}; expected [{dim}, vocab] (ne0 first)"),
            ));
        }
    };
    if tokenizer.tokens.len() > vocab_size {
        return Err(LoadError::invalid(
            path,
            format!(
                "tokenizer.ggml.tokens has {} tokens but token_embd.weight only {vocab_size} rows",
                tokenizer.tokens.len()
            ),
        ));
    }
    let output = find("output.weight");
    let mut arch = LlamaArch {
        architecture: arch_name.to_string(),
        dim,
        hidden_dim: int(&key("feed_forward_length"), None)?,
        n_layers: int(&key("block_count"), None)?,
        n_heads,
        n_kv_heads: int(&key("attention.head_count_kv"), Some(n_heads))?,
        vocab_size,
        max_seq_len: int(&key("context_length"), None)?,
        norm_eps: float(&key("attention.layer_norm_rms_epsilon"), None)?,
        rope_theta: float(&key("rope.freq_base"), Some(10000.0))?,
        tied_embeddings: output.is_none(),
        rope_scaling: None,
    };
    arch.validate().map_err(|e| LoadError::invalid(path, format!("inconsistent {arch_name} hyper-parameters: {e}")))?;
    let head_dim = arch.head_dim();
    let rope_dims = int(&key("rope.dimension_count"), Some(head_dim))?;
    if rope_dims != head_dim {
        return Err(LoadError::invalid(
            path,
            format!(
                "{} is {rope_dims} but the head dimension is {head_dim}: partial rotary \
                 embeddings are not supported",
                key("rope.dimension_count")
            ),
        ));
    }
    if let Some(t) = infos.iter().find(|t| t.name.ends_with(".bias") && !is_qkv_bias(&t.name)) {
        return Err(LoadError::invalid(
            path,
            format!("tensor {}: biases other than blk.N.attn_q/attn_k/attn_v.bias are not supported", t.name),
        ));
    }

    // `shape` is HostModel's (outermost first); GGUF lists the same dims innermost first.
    let tensor = |name: &str, shape: &[usize]| -> Result<HostTensor, LoadError> {
        let gguf_dims: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
        let info = find(name).ok_or_else(|| {
            LoadError::invalid(path, format!("tensor {name} is missing; expected dims {gguf_dims:?} (ne0 first)"))
        })?;
        if info.dims != gguf_dims {
            return Err(LoadError::invalid(
                path,
                format!("tensor {name} has dims {:?}; expected {gguf_dims:?} (ne0 first)", info.dims),
            ));
        }
        let data = decode(info.ty, &bytes[info.start..info.end], shape.iter().product())
            .map_err(|e| LoadError::invalid(path, format!("tensor {name}: {e}")))?;
        HostTensor::new(shape.to_vec(), data)
            .ok_or_else(|| LoadError::invalid(path, format!("tensor {name}: element count does not match {shape:?}")))
    };

    let linear = rope_linear_factor(path, meta, arch_name)?;
    let freqs = match find("rope_freqs.weight") {
        Some(_) => Some(tensor("rope_freqs.weight", &[head_dim / 2])?.data),
        None => None,
    };
    if freqs.is_some() || linear.is_some() {
        let mut factors = freqs.unwrap_or_else(|| vec![1.0; head_dim / 2]);
        if let Some(l) = linear {
            factors.iter_mut().for_each(|f| *f *= l);
        }
        let scaling = RopeScaling::FreqFactors { factors };
        scaling.validate(head_dim).map_err(|e| LoadError::invalid(path, format!("tensor rope_freqs.weight: {e}")))?;
        arch.rope_scaling = Some(scaling);
    }

    let (kv_dim, hidden) = (arch.kv_dim(), arch.hidden_dim);
    let q_dim = arch.n_heads * head_dim;
    // Rows of a qwen2 q/k weight or bias, rotate-half → interleaved.
    let rope_rows = |t: HostTensor, heads: usize| {
        if qwen2 { permute_rows(&t, heads, true) } else { t }
    };
    let token_embedding = tensor("token_embd.weight", &[vocab_size, dim])?;
    let mut layers = Vec::with_capacity(arch.n_layers.min(infos.len()));
    for i in 0..arch.n_layers {
        let t = |suffix: &str, shape: &[usize]| tensor(&format!("blk.{i}.{suffix}.weight"), shape);
        let bias = |suffix: &str, n: usize| -> Result<Option<HostTensor>, LoadError> {
            let name = format!("blk.{i}.{suffix}.bias");
            if qwen2 || find(&name).is_some() { tensor(&name, &[n]).map(Some) } else { Ok(None) }
        };
        layers.push(LayerWeights {
            attn_norm: t("attn_norm", &[dim])?,
            wq: rope_rows(t("attn_q", &[q_dim, dim])?, arch.n_heads),
            wk: rope_rows(t("attn_k", &[kv_dim, dim])?, arch.n_kv_heads),
            wv: t("attn_v", &[kv_dim, dim])?,
            wo: t("attn_output", &[dim, q_dim])?,
            ffn_norm: t("ffn_norm", &[dim])?,
            w_gate: t("ffn_gate", &[hidden, dim])?,
            w_up: t("ffn_up", &[hidden, dim])?,
            w_down: t("ffn_down", &[dim, hidden])?,
            bq: bias("attn_q", q_dim)?.map(|b| rope_rows(b, arch.n_heads)),
            bk: bias("attn_k", kv_dim)?.map(|b| rope_rows(b, arch.n_kv_heads)),
            bv: bias("attn_v", kv_dim)?,
        });
    }
    let final_norm = tensor("output_norm.weight", &[dim])?;
    let output = match output {
        Some(_) => Some(tensor("output.weight", &[vocab_size, dim])?),
        None => None,
    };
    Ok(HostModel { arch, token_embedding, layers, final_norm, output })
}

/// `blk.N.attn_q.bias`, `blk.N.attn_k.bias` or `blk.N.attn_v.bias`.
fn is_qkv_bias(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("blk.") else {
        return false;
    };
    let Some((layer, suffix)) = rest.split_once('.') else {
        return false;
    };
    !layer.is_empty()
        && layer.bytes().all(|b| b.is_ascii_digit())
        && matches!(suffix, "attn_q.bias" | "attn_k.bias" | "attn_v.bias")
}

/// llama.cpp's linear RoPE scaling as a divisor of every frequency (`rope_freq_scale_train` is its
/// inverse): `{arch}.rope.scaling.factor`, else the older `{arch}.rope.scale_linear`, applied when
/// `{arch}.rope.scaling.type` is `linear` (llama.cpp's default when the key is absent) and ignored
/// for `none`. `None` when it is absent, 0 (llama.cpp's "unset") or 1.
fn rope_linear_factor(path: &Path, meta: &BTreeMap<String, GgufValue>, arch: &str) -> Result<Option<f32>, LoadError> {
    let type_key = format!("{arch}.rope.scaling.type");
    let kind = match meta.get(&type_key) {
        None => "linear",
        Some(GgufValue::String(s)) => s.as_str(),
        Some(other) => {
            return Err(LoadError::invalid(path, format!("{type_key} is {other:?}, not a string")));
        }
    };
    match kind {
        "none" => return Ok(None),
        "linear" => {}
        other => {
            return Err(LoadError::invalid(
                path,
                format!(
                    "{type_key} = {other} is not supported; supported: none, linear \
                     (and per-pair factors in rope_freqs.weight)"
                ),
            ));
        }
    }
    let factor_key = [format!("{arch}.rope.scaling.factor"), format!("{arch}.rope.scale_linear")]
        .into_iter()
        .find(|k| meta.contains_key(k));
    let Some(k) = factor_key else {
        return Ok(None);
    };
    let v = &meta[&k];
    let factor = v.as_f64().ok_or_else(|| LoadError::invalid(path, format!("{k} is {v:?}, not a number")))? as f32;
    if factor == 0.0 || factor == 1.0 {
        return Ok(None);
    }
    if !(factor > 0.0 && factor.is_finite()) {
        return Err(LoadError::invalid(path, format!("{k} is {factor}; a RoPE scaling factor must be positive")));
    }
    Ok(Some(factor))
}

/// Dequantizes one tensor's bytes (whose length the caller checked) to `n` f32 values.
fn decode(ty: TensorType, bytes: &[u8], n: usize) -> Result<Vec<f32>, String> {
    use crate::weights::{LeFloat, le_floats};
    let out: Vec<f32> = match ty {
        TensorType::F32 => le_floats(LeFloat::F32, bytes),
        TensorType::F16 => le_floats(LeFloat::F16, bytes),
        TensorType::BF16 => le_floats(LeFloat::BF16, bytes),
        TensorType::Block(t) => {
            return qdrift_ggml::dequantize_ggml_blocks(t, bytes, n).map_err(|e| e.to_string());
        }
    };
    if out.len() == n { Ok(out) } else { Err(format!("{} bytes hold {} values, expected {n}", bytes.len(), out.len())) }
}

#[cfg(test)]
mod tests;
