//! [`read_gguf`](super::read_gguf): a GGUF file's header, metadata and tensor infos, checked, and its tensors
//! dequantized into a [`HostModel`]; [`read_gguf_metadata`]: the header and metadata only. A file
//! opened as a source (`GgufFile`) is read with positioned reads (its header into a buffer that
//! grows as the parse needs, each tensor into a buffer of its own), never mapped: a file cut
//! short or rewritten since it was opened is an error naming it.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use qdrift_ggml::GgmlType;
use qdrift_io::PinnedFile;

use crate::LoadError;
use crate::floats::{LeFloat, le_floats};
use crate::loaded::{ModelPart, PartFile, PartSource, gather_parts};
use crate::rope_layout::{RopeLayout, permute_rows};
use crate::rope_values::{RopeParam, check_rope_values};
use crate::storage::{SizeOverflow, SourceStorage, source_storage};
use qdrift_weights::{ArchShape, Ffn, HostModel, HostTensor, LayerWeights, Mlp, ModelArch, RopeScaling};

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// `GGML_MAX_DIMS`.
const MAX_DIMS: u32 = 4;
/// `GGML_MAX_NAME`: a tensor name has fewer bytes than this.
const MAX_NAME: usize = 64;
/// Metadata values (array elements included) a file may hold. Each takes 32 bytes in memory
/// however small its encoding (a `u8` array would take 32× its bytes), so the count, not the
/// file length, bounds the memory: 2^24 values ≤ 512 MiB. Llama 3's tokenizer (128K tokens,
/// their types and 280K merges) is about 540K values.
const MAX_METADATA_VALUES: u64 = 1 << 24;

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

/// A GGUF file read into host memory ([`read_gguf`](super::read_gguf)), or opened as a source
/// whose parts are read from the file when asked (`W` = `PartSource<GgufFile>`).
#[derive(Debug, Clone)]
pub struct GgufModel<W = HostModel> {
    /// The weights, dequantized to f32, and the architecture.
    pub model: W,
    /// GGUF version (2 or 3).
    pub version: u32,
    /// Every metadata key/value pair.
    pub metadata: BTreeMap<String, GgufValue>,
    /// Tokenizer metadata ([`crate::gguf_tokenizer`] builds the tokenizer from it).
    pub tokenizer: GgufTokenizerMetadata,
    /// Every tensor's name and type name (`F32`, `Q4_1`, ...) in file order.
    pub tensor_types: Vec<(String, &'static str)>,
    /// Every tensor's stored size, in file order ([`crate::inspect::source_storage`] sums them
    /// per type).
    pub tensors: Vec<GgufTensorSize>,
}

/// A tensor of a GGUF file as its tensor info describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufTensorSize {
    /// The tensor's name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Its type's name as `constants.py` gives it (`F32`, `Q4_K`, `IQ4_XS`, ...).
    pub dtype: &'static str,
    /// Its dims, `ne0` (the row length) first.
    pub dims: Vec<u64>,
    /// Values: the product of the dims.
    pub elements: u64,
    /// Bytes of its data: `elements / block size · type size`.
    pub bytes: u64,
}

/// [`source_storage`] of a GGUF file's tensors: their stored bytes per type.
///
/// # Errors
/// [`SizeOverflow`] as [`source_storage`].
pub fn gguf_source_storage(tensors: &[GgufTensorSize]) -> Result<SourceStorage, SizeOverflow> {
    source_storage(tensors.iter().map(|t| (t.dtype, t.elements, t.bytes)))
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
            TensorType::Block(t) => t.gguf_name(),
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

/// The `ggml.h` / `constants.py` names of the `ggml_type` ids this reader does not read, for
/// error messages; `None` for an id no ggml version has used.
fn unsupported_type_name(id: u32) -> Option<&'static str> {
    Some(match id {
        4 => "Q4_2",
        5 => "Q4_3",
        9 => "Q8_1",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        21 => "IQ3_S",
        22 => "IQ2_S",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        31 => "Q4_0_4_4",
        32 => "Q4_0_4_8",
        33 => "Q4_0_8_8",
        34 => "TQ1_0",
        35 => "TQ2_0",
        36 => "IQ4_NL_4_4",
        37 => "IQ4_NL_4_8",
        38 => "IQ4_NL_8_8",
        41 => "Q1_0",
        42 => "Q2_0",
        _ => return None,
    })
}

/// The types this reader reads, for error messages: `F32, F16, BF16, Q4_0, ...`.
fn supported_types() -> String {
    let mut names = vec!["F32", "F16", "BF16"];
    names.extend(GgmlType::READABLE.map(GgmlType::gguf_name));
    names.join(", ")
}

/// The refusal of tensor `name`'s type `id`, naming the type as ggml does.
fn unsupported_type(path: &Path, name: &str, id: u32) -> LoadError {
    let ty = match unsupported_type_name(id) {
        Some(ggml_name) => format!("type {ggml_name} ({id})"),
        None => format!("type {id} (not a known ggml type)"),
    };
    LoadError::invalid(
        path,
        format!("tensor {name} has {ty}, which qdrift cannot read; it reads {}", supported_types()),
    )
}

#[derive(Debug)]
pub(super) struct TensorInfo {
    pub(super) name: String,
    pub(super) dims: Vec<u64>,
    ty: TensorType,
    /// Absolute byte range in the file.
    start: usize,
    end: usize,
}

impl TensorInfo {
    /// Its name, type and size. `locate_tensors` checked the element count (`≤ i64::MAX`) and the
    /// byte range (`end − start` is the stored size) already.
    fn size(&self) -> GgufTensorSize {
        GgufTensorSize {
            name: self.name.clone(),
            dtype: self.ty.name(),
            dims: self.dims.clone(),
            elements: self.dims.iter().product(),
            bytes: (self.end - self.start) as u64,
        }
    }
}

/// Architectures [`read_gguf`](super::read_gguf) reads, as `general.architecture` names them.
pub const SUPPORTED_GGUF_ARCHITECTURES: &str = "llama (with or without experts), qwen2, qwen3, qwen3moe, qwen2moe, gemma2, gemma3, phi3, gpt-oss, smollm3, glm4moe";

/// Reads only a GGUF file's header and metadata (every key with its value), with the same checks
/// as [`read_gguf`](super::read_gguf); no tensor is read, so any architecture is accepted.
///
/// # Errors
/// [`LoadError`] naming the file: unreadable, truncated, a bad magic or version, counts beyond
/// the file, duplicate keys, malformed values.
pub fn read_gguf_metadata(path: &Path) -> Result<BTreeMap<String, GgufValue>, LoadError> {
    let bytes = crate::input::read_file(path, crate::input::MODEL)?;
    let mut r = Reader::new(path, Bytes::Whole(&bytes));
    let Header { kv_count, .. } = read_header(&mut r)?;
    read_metadata(&mut r, kv_count)
}

/// The stored size of every tensor of a GGUF file (as [`gguf_source_storage`] sums them), from its
/// header, metadata and tensor infos with [`read_gguf`](super::read_gguf)'s checks on their layout;
/// no tensor is dequantized, so any architecture is accepted.
///
/// # Errors
/// [`LoadError`] naming the file, as [`read_gguf`](super::read_gguf) for the layout.
pub fn read_gguf_tensor_sizes(path: &Path) -> Result<Vec<GgufTensorSize>, LoadError> {
    let bytes = crate::input::read_file(path, crate::input::MODEL)?;
    tensor_sizes_of(path, &bytes)
}

/// [`read_gguf_tensor_sizes`] of a GGUF file's `bytes` in memory (`path` names them in errors).
pub(super) fn tensor_sizes_of(path: &Path, bytes: &[u8]) -> Result<Vec<GgufTensorSize>, LoadError> {
    let layout = read_layout(path, Bytes::Whole(bytes))?;
    Ok(layout.infos.iter().map(TensorInfo::size).collect())
}

/// What a GGUF file says before its tensors' data: its version, metadata and tensors, each
/// tensor located in the data section.
struct Layout {
    version: u32,
    metadata: BTreeMap<String, GgufValue>,
    infos: Vec<TensorInfo>,
    data: DataSection,
}

/// The header, metadata and tensor infos of a GGUF file's `bytes`, with every check on where the
/// tensors lie: inside the data section, none overlapping another.
fn read_layout(path: &Path, bytes: Bytes<'_>) -> Result<Layout, LoadError> {
    let file_len = bytes.len();
    let mut r = Reader::new(path, bytes);
    let Header { version, tensor_count, kv_count } = read_header(&mut r)?;
    let metadata = read_metadata(&mut r, kv_count)?;
    let raw_infos = read_tensor_infos(&mut r, tensor_count)?;
    let data = data_section(path, &metadata, r.pos, file_len)?;
    let infos = locate_tensors(path, raw_infos, data, file_len as u64)?;
    check_no_overlap(path, &infos, data.start)?;
    Ok(Layout { version, metadata, infos, data })
}

/// A GGUF file's bytes: in memory whole, or open and read as needed.
pub(super) enum Bytes<'a> {
    /// The whole file ([`read_gguf`](super::read_gguf), tests).
    Whole(&'a [u8]),
    /// The open file and, for the header's parse, its first bytes read so far.
    File(&'a PinnedFile, Vec<u8>),
}

/// The least a file's header buffer grows by: one read covers the header of a small file, and a
/// large header (a 256k-token vocabulary is tens of MB) is read in doublings.
const HEADER_READ: usize = 1 << 20;

impl Bytes<'_> {
    /// The file's length.
    fn len(&self) -> usize {
        match self {
            Bytes::Whole(b) => b.len(),
            // A source is opened only where the file's length fits in memory addresses (a
            // 64-bit target); `locate_tensors` checks every range against it.
            Bytes::File(f, _) => usize::try_from(f.len()).unwrap_or(usize::MAX),
        }
    }

    /// Bytes `start..end`, which lie within [`Bytes::len`]: for an open file, read into the
    /// header buffer (which grows to at least twice its length, so a header of `n` bytes takes
    /// `O(log n)` reads).
    fn prefix_range(&mut self, start: usize, end: usize) -> Result<&[u8], LoadError> {
        let len = self.len();
        match self {
            Bytes::Whole(b) => Ok(&b[start..end]),
            Bytes::File(f, read) => {
                if end > read.len() {
                    let want = end.max(2 * read.len()).max(HEADER_READ).min(len);
                    let more = f.read_at(read.len() as u64, want - read.len())?;
                    read.extend_from_slice(&more);
                }
                Ok(&read[start..end])
            }
        }
    }

    /// Bytes `start..end` of a tensor, which lie within [`Bytes::len`]: borrowed when the file is
    /// in memory, else read from the file into a buffer of their own.
    fn tensor_range(&self, start: usize, end: usize) -> Result<Cow<'_, [u8]>, LoadError> {
        match self {
            Bytes::Whole(b) => Ok(Cow::Borrowed(&b[start..end])),
            Bytes::File(f, _) => Ok(Cow::Owned(f.read_at(start as u64, end - start)?)),
        }
    }
}

/// A bounds-checked little-endian cursor.
struct Reader<'a> {
    path: &'a Path,
    bytes: Bytes<'a>,
    pos: usize,
    /// Metadata values read so far (array elements included), against [`MAX_METADATA_VALUES`].
    values: u64,
}

impl<'a> Reader<'a> {
    fn new(path: &'a Path, bytes: Bytes<'a>) -> Self {
        Reader { path, bytes, pos: 0, values: 0 }
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&[u8], LoadError> {
        if n > self.remaining() as u64 {
            return Err(LoadError::truncated(
                self.path,
                format!("{} needs {n} bytes at offset {}, the file has {} left", what(), self.pos, self.remaining()),
            ));
        }
        let (start, end) = (self.pos, self.pos + n as usize);
        self.pos = end;
        self.bytes.prefix_range(start, end)
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
                self.values = self.values.saturating_add(count);
                if self.values > MAX_METADATA_VALUES {
                    return Err(LoadError::invalid(
                        self.path,
                        format!(
                            "{}: an array of {count} values brings the metadata past {MAX_METADATA_VALUES} values \
                             (about 512 MiB in memory); no model's metadata comes close",
                            what()
                        ),
                    ));
                }
                let mut out = Vec::with_capacity(preallocation(count));
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

/// Capacity to reserve for `count` declared items. A count passes [`Reader::check_count`] when
/// its items' smallest encodings fit in the file, but a decoded item takes more memory than its
/// encoding (a [`GgufValue`] is 32 bytes, a `u8` element 1 byte in the file): reserving at most
/// this many up front keeps memory proportional to the items actually read.
fn preallocation(count: u64) -> usize {
    const MAX_PREALLOCATION: u64 = 1 << 16;
    count.min(MAX_PREALLOCATION) as usize
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

/// How a file's blocks are read once its architecture is known: llama's reader
/// ([`read_layer`]) or a family's (`arch.rs`).
pub(super) trait BlockReader: Send + Sync {
    /// Block `i` of a model of architecture `arch`.
    fn layer(&self, table: &TensorTable<'_>, arch: &ModelArch, i: usize) -> Result<LayerWeights, LoadError>;

    /// The refusal of tensor `name`, which no part read; `None` where the architecture lets it be
    /// (`llama` and `qwen2` refuse unknown tensors by name first, `check_refusals`).
    fn unused(&self, name: &str) -> Option<String>;
}

/// `llama`'s and `qwen2`'s blocks, q/k rows stored as the layout says.
struct LlamaBlocks(QkLayout);

impl BlockReader for LlamaBlocks {
    fn layer(&self, table: &TensorTable<'_>, arch: &ModelArch, i: usize) -> Result<LayerWeights, LoadError> {
        read_layer(table, arch, i, self.0)
    }

    fn unused(&self, _: &str) -> Option<String> {
        None
    }
}

/// The architecture and block reader of a file whose architecture has its own reader
/// (`arch.rs`), `None` for `llama` and `qwen2`: given to [`parse_gguf_with`] by its caller, so
/// that this module, which the architectures' readers build on, does not depend on them.
pub(super) type FamilyReader =
    fn(&TensorTable<'_>, &ArchKeys<'_>, &GgufTokenizerMetadata) -> Result<Option<ModelPlan>, LoadError>;

/// A file's model before its weights are read: the architecture and how its blocks read.
pub(crate) struct ModelPlan {
    pub(super) arch: ModelArch,
    pub(super) blocks: Box<dyn BlockReader>,
    /// Blocks past the model's that no part reads (glm4moe's MTP layers, `nextn_predict_layers`).
    pub(super) skipped_blocks: usize,
}

impl ModelPlan {
    /// Architecture → hyper-parameters → refusals → RoPE scaling, by `family` where it reads the
    /// architecture.
    fn new(
        table: &TensorTable<'_>,
        meta: &BTreeMap<String, GgufValue>,
        tokenizer: &GgufTokenizerMetadata,
        family: FamilyReader,
    ) -> Result<ModelPlan, LoadError> {
        let path = table.path;
        let (arch_name, q_k_layout) = read_architecture(path, meta)?;
        let keys = ArchKeys { path, meta, arch: arch_name };
        let plan = match family(table, &keys, tokenizer)? {
            Some(plan) => plan,
            None => {
                let mut arch = read_hyper_parameters(&keys, table, tokenizer)?;
                check_refusals(&keys, &arch, table.infos)?;
                arch.rope_scaling = read_rope_scaling(&keys, table, arch.head_dim())?;
                ModelPlan { arch, blocks: Box::new(LlamaBlocks(q_k_layout)), skipped_blocks: 0 }
            }
        };
        check_rope(&keys, table, &plan.arch)?;
        check_indices(&keys, table.infos, &plan.arch, plan.skipped_blocks)?;
        Ok(plan)
    }

    /// `token_embd.weight`, `[vocab, dim]`.
    fn embedding(&self, table: &TensorTable<'_>) -> Result<HostTensor, LoadError> {
        table.tensor("token_embd.weight", &[self.arch.vocab_size, self.arch.dim])
    }

    /// `output_norm.weight`, `[dim]`.
    fn final_norm(&self, table: &TensorTable<'_>) -> Result<HostTensor, LoadError> {
        table.tensor("output_norm.weight", &[self.arch.dim])
    }

    /// `output.weight`, `[vocab, dim]`; `None` when tied (gemma2's loader always ties it:
    /// `output` is `token_embd`, TENSOR_DUPLICATED).
    fn output(&self, table: &TensorTable<'_>) -> Result<Option<HostTensor>, LoadError> {
        if self.arch.tied_embeddings {
            return Ok(None);
        }
        table.tensor("output.weight", &[self.arch.vocab_size, self.arch.dim]).map(Some)
    }

    /// Every part in build order, each handed to `each` as it is read, then the refusal of any
    /// tensor no part (nor the plan) read, where the architecture refuses those.
    fn read_parts(&self, table: &TensorTable<'_>, each: &mut dyn FnMut(ModelPart)) -> Result<(), LoadError> {
        each(ModelPart::Embedding(self.embedding(table)?));
        for i in 0..self.arch.n_layers {
            each(ModelPart::Layer(i, Box::new(self.blocks.layer(table, &self.arch, i)?)));
        }
        each(ModelPart::FinalNorm(self.final_norm(table)?));
        each(ModelPart::Output(self.output(table)?));
        let used = table.used.borrow();
        match table.infos.iter().filter(|t| !used.contains(&t.name)).find_map(|t| self.blocks.unused(&t.name)) {
            Some(refusal) => Err(LoadError::invalid(table.path, refusal)),
            None => Ok(()),
        }
    }
}

/// The table of a file's located tensors and the model planned from its metadata (by `family`
/// where it reads the architecture).
fn plan_file<'a>(
    path: &'a Path,
    bytes: &'a Bytes<'a>,
    infos: &'a [TensorInfo],
    metadata: &BTreeMap<String, GgufValue>,
    tokenizer: &GgufTokenizerMetadata,
    family: FamilyReader,
) -> Result<(TensorTable<'a>, ModelPlan), LoadError> {
    let table = TensorTable { path, bytes, infos, used: Default::default() };
    let plan = ModelPlan::new(&table, metadata, tokenizer, family)?;
    Ok((table, plan))
}

/// The file's layout in order: header, metadata, tensor infos, then the model read whole.
pub(super) fn parse_gguf_with(path: &Path, bytes: &[u8], family: FamilyReader) -> Result<GgufModel, LoadError> {
    let Layout { version, metadata, infos, data } = read_layout(path, Bytes::Whole(bytes))?;
    check_file_order(path, &infos, data)?;
    let tensor_types = infos.iter().map(|t| (t.name.clone(), t.ty.name())).collect();
    let tensors = infos.iter().map(TensorInfo::size).collect();
    let tokenizer = tokenizer_metadata(&metadata);
    let bytes = Bytes::Whole(bytes);
    let (table, plan) = plan_file(path, &bytes, &infos, &metadata, &tokenizer, family)?;
    let model = gather_parts(plan.arch.clone(), |sink| plan.read_parts(&table, sink))?;
    Ok(GgufModel { model, version, metadata, tokenizer, tensor_types, tensors })
}

/// A GGUF file's weights, read part by part from the open file as planned.
pub(crate) struct GgufFile {
    path: PathBuf,
    file: PinnedFile,
    infos: Vec<TensorInfo>,
    plan: ModelPlan,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GgufFile({}, {} tensors)", self.path.display(), self.infos.len())
    }
}

impl GgufFile {
    /// Part `read` of the file, from a table over its tensors.
    fn read<T>(&self, read: impl FnOnce(&TensorTable<'_>) -> Result<T, LoadError>) -> Result<T, LoadError> {
        let bytes = Bytes::File(&self.file, Vec::new());
        read(&TensorTable { path: &self.path, bytes: &bytes, infos: &self.infos, used: Default::default() })
    }
}

impl PartFile for GgufFile {
    fn arch(&self) -> &ModelArch {
        &self.plan.arch
    }

    fn embedding(&self) -> Result<HostTensor, LoadError> {
        self.read(|t| self.plan.embedding(t))
    }

    fn layer(&self, i: usize) -> Result<LayerWeights, LoadError> {
        self.read(|t| self.plan.blocks.layer(t, &self.plan.arch, i))
    }

    fn final_norm(&self) -> Result<HostTensor, LoadError> {
        self.read(|t| self.plan.final_norm(t))
    }

    fn output(&self) -> Result<Option<HostTensor>, LoadError> {
        self.read(|t| self.plan.output(t))
    }
}

/// The open GGUF file `file` at `path` as a source ([`PartSource`]), read through once as
/// [`parse_gguf_with`] reads it, keeping nothing: every error [`parse_gguf_with`] reports is
/// reported here, and the parameter count comes from that pass.
pub(super) fn gguf_source_with(
    path: &Path,
    file: PinnedFile,
    family: FamilyReader,
) -> Result<GgufModel<PartSource<GgufFile>>, LoadError> {
    let Layout { version, metadata, infos, data } = read_layout(path, Bytes::File(&file, Vec::new()))?;
    check_file_order(path, &infos, data)?;
    let tensor_types = infos.iter().map(|t| (t.name.clone(), t.ty.name())).collect();
    let tensors = infos.iter().map(TensorInfo::size).collect();
    let tokenizer = tokenizer_metadata(&metadata);
    let mut parameters = 0;
    let plan = {
        let bytes = Bytes::File(&file, Vec::new());
        let (table, plan) = plan_file(path, &bytes, &infos, &metadata, &tokenizer, family)?;
        plan.read_parts(&table, &mut |part| parameters += part.parameter_count())?;
        plan
    };
    let file = GgufFile { path: path.to_path_buf(), file, infos, plan };
    Ok(GgufModel { model: PartSource { file, parameters }, version, metadata, tokenizer, tensor_types, tensors })
}

/// The fixed-size start of the file.
struct Header {
    version: u32,
    tensor_count: u64,
    kv_count: u64,
}

/// Magic, version and the two counts, each count checked against the bytes left.
fn read_header(r: &mut Reader<'_>) -> Result<Header, LoadError> {
    let magic = r.array::<4>(&|| "the magic".to_string())?;
    if &magic != MAGIC {
        return Err(LoadError::invalid(
            r.path,
            format!("not a GGUF file: magic is {magic:02x?}, expected \"GGUF\" (47 47 55 46)"),
        ));
    }
    let version = r.u32(&|| "the version".to_string())?;
    if version != 2 && version != 3 {
        let hint =
            if version.swap_bytes() <= 3 { " (a big-endian GGUF file? only little-endian is supported)" } else { "" };
        return Err(LoadError::invalid(
            r.path,
            format!("GGUF version {version} is not supported; supported: 2, 3{hint}"),
        ));
    }
    let tensor_count = r.u64(&|| "the tensor count".to_string())?;
    let kv_count = r.u64(&|| "the metadata count".to_string())?;
    // A key/value pair takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at least
    // 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset).
    r.check_count(kv_count, 13, &|| "the header's metadata count".to_string())?;
    r.check_count(tensor_count, 24, &|| "the header's tensor count".to_string())?;
    Ok(Header { version, tensor_count, kv_count })
}

/// `kv_count` key/value pairs.
fn read_metadata(r: &mut Reader<'_>, kv_count: u64) -> Result<BTreeMap<String, GgufValue>, LoadError> {
    let mut metadata = BTreeMap::new();
    for i in 0..kv_count {
        let key = r.string(&|| format!("metadata key {i}"))?;
        let what = || format!("metadata value {key}");
        let ty = r.u32(&what)?;
        let value = r.value(ty, 0, &what)?;
        if metadata.contains_key(&key) {
            // llama.cpp refuses these too: which copy would win is up to the reader.
            return Err(LoadError::invalid(r.path, format!("metadata key {key} appears more than once")));
        }
        metadata.insert(key, value);
    }
    Ok(metadata)
}

/// A tensor info as stored: its offset is relative to the data section, not yet checked.
struct RawTensorInfo {
    name: String,
    dims: Vec<u64>,
    ty: TensorType,
    offset: u64,
}

/// `tensor_count` tensor infos; an unsupported type or too many dims is refused here, naming the
/// tensor.
fn read_tensor_infos(r: &mut Reader<'_>, tensor_count: u64) -> Result<Vec<RawTensorInfo>, LoadError> {
    let path = r.path;
    let mut raw_infos = Vec::with_capacity(preallocation(tensor_count));
    let mut names = HashSet::with_capacity(preallocation(tensor_count));
    for i in 0..tensor_count {
        let name = r.string(&|| format!("the name of tensor {i}"))?;
        check_tensor_name(path, &name, &mut names)?;
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
        check_dims(path, &name, &dims)?;
        let type_id = r.u32(&what)?;
        let offset = r.u64(&what)?;
        let ty = TensorType::from_id(type_id).ok_or_else(|| unsupported_type(path, &name, type_id))?;
        raw_infos.push(RawTensorInfo { name, dims, ty, offset });
    }
    Ok(raw_infos)
}

/// Errors on a name llama.cpp would refuse: one it has seen already (which copy would win is up
/// to the reader) or one of `GGML_MAX_NAME` bytes or more.
fn check_tensor_name(path: &Path, name: &str, seen: &mut HashSet<String>) -> Result<(), LoadError> {
    if name.len() >= MAX_NAME {
        return Err(LoadError::invalid(
            path,
            format!("tensor {name}: its name is {} bytes; GGUF allows at most {}", name.len(), MAX_NAME - 1),
        ));
    }
    if !seen.insert(name.to_string()) {
        return Err(LoadError::invalid(path, format!("tensor {name} appears more than once")));
    }
    Ok(())
}

/// Errors on a zero dimension, one beyond `i64` (ggml's `int64_t ne`, so a negative one there),
/// or an element count that overflows `i64`, as llama.cpp's `gguf_init_from_file_impl` does.
fn check_dims(path: &Path, name: &str, dims: &[u64]) -> Result<(), LoadError> {
    if let Some(d) = dims.iter().find(|&&d| d == 0 || d > i64::MAX as u64) {
        return Err(LoadError::invalid(
            path,
            format!("tensor {name}: dimension {d} in {dims:?}; every dimension must be in 1..=2^63-1"),
        ));
    }
    if dims.iter().try_fold(1i64, |n, &d| n.checked_mul(d as i64)).is_none() {
        return Err(LoadError::invalid(path, format!("tensor {name}: dims {dims:?} overflow a 64-bit element count")));
    }
    Ok(())
}

/// Where the data section lies and how its tensors are aligned.
#[derive(Debug, Clone, Copy)]
struct DataSection {
    /// Absolute offset of the section: the first multiple of `alignment` after the tensor infos.
    start: u64,
    /// `general.alignment` (default 32): a power of two, each tensor offset a multiple of it.
    alignment: u64,
}

/// `general.alignment`, which llama.cpp requires to be a `u32` non-zero power of two.
fn alignment(path: &Path, metadata: &BTreeMap<String, GgufValue>) -> Result<u64, LoadError> {
    match metadata.get("general.alignment") {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(GgufValue::U32(a)) if a.is_power_of_two() => Ok(u64::from(*a)),
        Some(v) => {
            Err(LoadError::invalid(path, format!("general.alignment is {v:?}; it must be a u32 non-zero power of two")))
        }
    }
}

/// Where the data section starts: the first multiple of `general.alignment` at or after
/// `infos_end`, the end of the tensor infos.
fn data_section(
    path: &Path,
    metadata: &BTreeMap<String, GgufValue>,
    infos_end: usize,
    file_len: usize,
) -> Result<DataSection, LoadError> {
    let alignment = alignment(path, metadata)?;
    let start = (infos_end as u64).div_ceil(alignment).saturating_mul(alignment);
    if start > file_len as u64 {
        return Err(LoadError::truncated(
            path,
            format!("the data section starts at byte {start}, the file has {file_len} bytes"),
        ));
    }
    Ok(DataSection { start, alignment })
}

/// Each tensor's absolute byte range, checked to be whole blocks within the file at an offset
/// that is a multiple of the alignment.
fn locate_tensors(
    path: &Path,
    raw_infos: Vec<RawTensorInfo>,
    data: DataSection,
    file_len: u64,
) -> Result<Vec<TensorInfo>, LoadError> {
    let data_start = data.start;
    let data_len = file_len - data_start;
    let mut infos = Vec::with_capacity(raw_infos.len());
    for RawTensorInfo { name, dims, ty, offset } in raw_infos {
        let n_elements = dims.iter().try_fold(1u64, |n, &d| n.checked_mul(d));
        let (block, block_bytes) = ty.block();
        let size = n_elements
            .filter(|_| dims.first().is_none_or(|ne0| ne0 % block == 0))
            .and_then(|n| (n / block).checked_mul(block_bytes));
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
        if !offset.is_multiple_of(data.alignment) {
            return Err(LoadError::invalid(
                path,
                format!(
                    "tensor {name}: data offset {offset} is not a multiple of general.alignment {}",
                    data.alignment
                ),
            ));
        }
        infos.push(TensorInfo {
            name,
            dims,
            ty,
            start: (data_start + offset) as usize,
            end: (data_start + end) as usize,
        });
    }
    Ok(infos)
}

/// Errors when two tensors share bytes (each would read the other's data), naming both.
fn check_no_overlap(path: &Path, infos: &[TensorInfo], data_start: u64) -> Result<(), LoadError> {
    let mut by_start: Vec<&TensorInfo> = infos.iter().collect();
    by_start.sort_by_key(|t| t.start);
    let rel = |t: &TensorInfo| (t.start as u64 - data_start, t.end as u64 - data_start);
    for pair in by_start.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if b.start < a.end {
            let ((a0, a1), (b0, b1)) = (rel(a), rel(b));
            return Err(LoadError::invalid(
                path,
                format!(
                    "tensor {}: data bytes {b0}..{b1} overlap tensor {}'s bytes {a0}..{a1} (data section offsets)",
                    b.name, a.name
                ),
            ));
        }
    }
    Ok(())
}

/// llama.cpp's layout rule: the tensors' data follow each other in the order of their infos,
/// each starting where the previous one ends rounded up to the alignment.
fn check_file_order(path: &Path, infos: &[TensorInfo], data: DataSection) -> Result<(), LoadError> {
    let mut expected = 0u64;
    for t in infos {
        let offset = t.start as u64 - data.start;
        if offset != expected {
            return Err(LoadError::invalid(
                path,
                format!(
                    "tensor {}: data offset {offset}, expected {expected}: GGUF tensors are stored in the order \
                     of their infos, each padded to general.alignment {} (as llama.cpp requires)",
                    t.name, data.alignment
                ),
            ));
        }
        // `end` is within the file, so rounding it up cannot overflow.
        expected = (t.end as u64 - data.start).next_multiple_of(data.alignment);
    }
    Ok(())
}

impl GgufTokenizerMetadata {
    /// The tokenizer fields of a file's metadata (as [`read_gguf_metadata`] returns it, or the
    /// keys a writer is about to store), absent or mistyped keys as `None`/empty.
    pub fn from_metadata(m: &BTreeMap<String, GgufValue>) -> Self {
        tokenizer_metadata(m)
    }
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

/// The located tensors of a file, read by name into [`HostTensor`]s; the names read are kept
/// (`used`), so that the readers of the newer architectures refuse a tensor they do not use.
pub(super) struct TensorTable<'a> {
    pub(super) path: &'a Path,
    bytes: &'a Bytes<'a>,
    pub(super) infos: &'a [TensorInfo],
    pub(super) used: std::cell::RefCell<HashSet<String>>,
}

impl TensorTable<'_> {
    pub(super) fn find(&self, name: &str) -> Option<&TensorInfo> {
        self.infos.iter().find(|t| t.name == name)
    }

    /// Tensor `name`, dequantized, checked to have `shape` ([`HostModel`]'s, outermost first;
    /// GGUF lists the same dims innermost first).
    pub(super) fn tensor(&self, name: &str, shape: &[usize]) -> Result<HostTensor, LoadError> {
        let path = self.path;
        self.used.borrow_mut().insert(name.to_string());
        let gguf_dims: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
        let info = self.find(name).ok_or_else(|| {
            LoadError::invalid(path, format!("tensor {name} is missing; expected dims {gguf_dims:?} (ne0 first)"))
        })?;
        if info.dims != gguf_dims {
            return Err(LoadError::invalid(
                path,
                format!("tensor {name} has dims {:?}; expected {gguf_dims:?} (ne0 first)", info.dims),
            ));
        }
        let stored = self.bytes.tensor_range(info.start, info.end)?;
        let data = decode(info.ty, &stored, shape.iter().product())
            .map_err(|e| LoadError::invalid(path, format!("tensor {name}: {e}")))?;
        drop(stored);
        // After dequantizing: a NaN block scale makes a whole block NaN.
        crate::input::check_finite(path, name, &data)?;
        HostTensor::new(shape.to_vec(), data)
            .ok_or_else(|| LoadError::invalid(path, format!("tensor {name}: element count does not match {shape:?}")))
    }

    /// Tensor `name` when the file has it.
    pub(super) fn optional(&self, name: &str, shape: &[usize]) -> Result<Option<HostTensor>, LoadError> {
        match self.find(name) {
            Some(_) => self.tensor(name, shape).map(Some),
            None => Ok(None),
        }
    }
}

/// The `{arch}.*` hyper-parameter keys of one architecture.
pub(super) struct ArchKeys<'a> {
    pub(super) path: &'a Path,
    pub(super) meta: &'a BTreeMap<String, GgufValue>,
    /// `general.architecture`: `llama`, `qwen2`, `qwen3`, ...
    pub(super) arch: &'a str,
}

impl ArchKeys<'_> {
    pub(super) fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    /// `{arch}.{k}` as a non-negative integer, else `default`; missing without a default is an error.
    pub(super) fn int(&self, k: &str, default: Option<usize>) -> Result<usize, LoadError> {
        let key = self.key(k);
        match self.meta.get(&key) {
            Some(v) => v
                .as_u64()
                .and_then(|v| usize::try_from(v).ok())
                .ok_or_else(|| LoadError::invalid(self.path, format!("{key} is {v:?}, not a non-negative integer"))),
            None => default.ok_or_else(|| LoadError::invalid(self.path, format!("{key} is missing"))),
        }
    }

    /// `{arch}.{k}` as a number, else `default`; missing without a default is an error.
    pub(super) fn float(&self, k: &str, default: Option<f32>) -> Result<f32, LoadError> {
        let key = self.key(k);
        match self.meta.get(&key) {
            Some(v) => v
                .as_f64()
                .map(|f| f as f32)
                .ok_or_else(|| LoadError::invalid(self.path, format!("{key} is {v:?}, not a number"))),
            None => default.ok_or_else(|| LoadError::invalid(self.path, format!("{key} is missing"))),
        }
    }
}

/// How a file stores q/k rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QkLayout {
    /// `llama`: llama.cpp's converter already permuted them into the interleaved RoPE layout.
    Interleaved,
    /// `qwen2`: Hugging Face's rotate-half layout, un-permuted on reading.
    RotateHalf,
}

/// `general.architecture` and how its q/k rows are stored.
fn read_architecture<'m>(path: &Path, meta: &'m BTreeMap<String, GgufValue>) -> Result<(&'m str, QkLayout), LoadError> {
    let arch_name = match meta.get("general.architecture") {
        Some(GgufValue::String(s)) => s.as_str(),
        Some(other) => {
            return Err(LoadError::invalid(path, format!("general.architecture is {other:?}, not a string")));
        }
        None => return Err(LoadError::invalid(path, "general.architecture is missing")),
    };
    // The table's families (its GGUF names; a family not read yet is refused by name there).
    match crate::arch::ARCHITECTURES.iter().find(|e| e.gguf.name == arch_name) {
        Some(e) if e.gguf.llama => Ok((arch_name, QkLayout::Interleaved)),
        Some(_) => Ok((arch_name, QkLayout::RotateHalf)),
        None => Err(LoadError::invalid(
            path,
            format!("unsupported architecture {arch_name}; supported: {SUPPORTED_GGUF_ARCHITECTURES}"),
        )),
    }
}

/// [`ModelArch`] from the `{arch}.*` keys, the vocabulary from `token_embd.weight`'s dims (which
/// must hold the tokenizer's tokens), tied when `output.weight` is absent; RoPE scaling unset.
pub(super) fn read_hyper_parameters(
    keys: &ArchKeys<'_>,
    table: &TensorTable<'_>,
    tokenizer: &GgufTokenizerMetadata,
) -> Result<ModelArch, LoadError> {
    let path = keys.path;
    let dim = keys.int("embedding_length", None)?;
    let n_heads = keys.int("attention.head_count", None)?;
    let embd = table.find("token_embd.weight").ok_or_else(|| {
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
    let shape = ArchShape {
        dim,
        hidden_dim: keys.int("feed_forward_length", None)?,
        n_layers: keys.int("block_count", None)?,
        n_heads,
        n_kv_heads: keys.int("attention.head_count_kv", Some(n_heads))?,
        // `validate` refuses 0 heads below; llama.cpp's `attention.key_length` when present.
        head_dim: keys.int("attention.key_length", Some(dim.checked_div(n_heads).unwrap_or(0)))?,
        vocab_size,
        max_seq_len: keys.int("context_length", None)?,
    };
    let arch = ModelArch {
        norm_eps: keys.float("attention.layer_norm_rms_epsilon", None)?,
        rope_theta: keys.float("rope.freq_base", Some(10000.0))?,
        tied_embeddings: table.find("output.weight").is_none(),
        ..ModelArch::new(keys.arch, shape)
    };
    arch.validate()
        .map_err(|e| LoadError::invalid(path, format!("inconsistent {} hyper-parameters: {e}", keys.arch)))?;
    Ok(arch)
}

/// Refuses RoPE parameters whose derived inverse frequencies are not finite and positive
/// ([`check_rope_values`]), naming the key or tensor they come from.
fn check_rope(keys: &ArchKeys<'_>, table: &TensorTable<'_>, a: &ModelArch) -> Result<(), LoadError> {
    let bad = |key: String, describe: String| LoadError::invalid(keys.path, format!("{key} {describe}"));
    check_rope_values(a.rope_theta, a.rotary_dim(), a.rope_scaling.as_ref()).map_err(|b| {
        let key = match b.param {
            RopeParam::Theta => keys.key("rope.freq_base"),
            RopeParam::FreqFactor(i) if table.find("rope_freqs.weight").is_some() => {
                format!("tensor rope_freqs.weight[{i}] (with {})", keys.key("rope.scaling.factor"))
            }
            RopeParam::Factor | RopeParam::FreqFactor(_) => keys.key("rope.scaling.factor"),
            RopeParam::ShortFactor(i) => format!("tensor rope_factors_short.weight[{i}]"),
            RopeParam::LongFactor(i) => format!("tensor rope_factors_long.weight[{i}]"),
        };
        bad(key, b.describe())
    })?;
    match a.local_rope_theta {
        Some(theta) => check_rope_values(theta, a.rotary_dim(), None)
            .map_err(|b| bad(keys.key("rope.freq_base_swa"), b.describe())),
        None => Ok(()),
    }
}

/// Refuses the first tensor (in file order) of a block at or past `{arch}.block_count` (the
/// model's blocks and the `mtp` skipped after them), or of
/// experts where a block has none or past `{arch}.expert_count`: blocks are read by the names
/// the metadata implies, so `llama` and `qwen2`, which refuse no other unread tensor, would run
/// without it.
fn check_indices(keys: &ArchKeys<'_>, infos: &[TensorInfo], a: &ModelArch, mtp: usize) -> Result<(), LoadError> {
    let experts = |layer| a.moe.as_ref().filter(|_| a.has_experts(layer)).map_or(0, |m| m.n_experts);
    // `mtp`: glm4moe's MTP blocks follow the model's (`nextn_predict_layers`), read by no one.
    for t in infos {
        let Some((layer, rest)) = crate::names::indexed(&t.name, "blk.") else { continue };
        let problem = if layer >= a.n_layers + mtp {
            format!("is in block {layer}, but {} is {}", keys.key("block_count"), a.n_layers + mtp)
        } else if layer >= a.n_layers {
            continue;
        } else if let Some(e) = legacy_expert(rest).filter(|&e| e >= experts(layer)) {
            format!("is expert {e}, but block {layer} has {} ({})", experts(layer), keys.key("expert_count"))
        } else if experts(layer) == 0 && ["_exps", "_shexp", "ffn_gate_inp"].iter().any(|p| rest.contains(p)) {
            format!("holds experts, but block {layer} has none ({})", keys.key("expert_count"))
        } else {
            continue;
        };
        return Err(LoadError::invalid(keys.path, format!("tensor {} {problem}; qdrift would run without it", t.name)));
    }
    Ok(())
}

/// The expert of an older split-experts tensor, `ffn_{gate,up,down}.{e}.weight`.
fn legacy_expert(rest: &str) -> Option<usize> {
    ["ffn_gate.", "ffn_up.", "ffn_down."].iter().find_map(|p| crate::names::indexed(rest, p)).map(|(e, _)| e)
}

/// Refuses what [`HostModel`] cannot carry: partial rotary embeddings, biases other than q/k/v.
fn check_refusals(keys: &ArchKeys<'_>, arch: &ModelArch, infos: &[TensorInfo]) -> Result<(), LoadError> {
    let head_dim = arch.head_dim();
    let value_length = keys.int("attention.value_length", Some(head_dim))?;
    if value_length != head_dim {
        return Err(LoadError::invalid(
            keys.path,
            format!(
                "{} is {value_length} but the key head width is {head_dim}: different key and value head widths \
                 are not supported",
                keys.key("attention.value_length")
            ),
        ));
    }
    let rope_dims = keys.int("rope.dimension_count", Some(head_dim))?;
    if rope_dims != head_dim {
        return Err(LoadError::invalid(
            keys.path,
            format!(
                "{} is {rope_dims} but the head dimension is {head_dim}: partial rotary \
                 embeddings are not supported",
                keys.key("rope.dimension_count")
            ),
        ));
    }
    if let Some(t) = infos.iter().find(|t| t.name.ends_with(".bias") && !is_qkv_bias(&t.name)) {
        return Err(LoadError::invalid(
            keys.path,
            format!("tensor {}: biases other than blk.N.attn_q/attn_k/attn_v.bias are not supported", t.name),
        ));
    }
    Ok(())
}

/// [`RopeScaling::FreqFactors`] from `rope_freqs.weight` (per-pair divisors) times the linear
/// factor, or `None` when the file has neither.
pub(super) fn read_rope_scaling(
    keys: &ArchKeys<'_>,
    table: &TensorTable<'_>,
    head_dim: usize,
) -> Result<Option<RopeScaling>, LoadError> {
    let linear = rope_linear_factor(keys.path, keys.meta, keys.arch)?;
    let freqs = table.optional("rope_freqs.weight", &[head_dim / 2])?.map(|t| t.data);
    if freqs.is_none() && linear.is_none() {
        return Ok(None);
    }
    let mut factors = freqs.unwrap_or_else(|| vec![1.0; head_dim / 2]);
    if let Some(l) = linear {
        factors.iter_mut().for_each(|f| *f *= l);
    }
    let scaling = RopeScaling::FreqFactors { factors };
    scaling.validate(head_dim).map_err(|e| LoadError::invalid(keys.path, format!("tensor rope_freqs.weight: {e}")))?;
    Ok(Some(scaling))
}

/// Block `i`'s weights (`blk.{i}.*`); q/k/v biases required for `qwen2`, optional otherwise; q/k
/// rows brought to the interleaved layout.
fn read_layer(
    table: &TensorTable<'_>,
    arch: &ModelArch,
    i: usize,
    layout: QkLayout,
) -> Result<LayerWeights, LoadError> {
    let (dim, hidden, kv_dim) = (arch.dim, arch.hidden_dim, arch.kv_dim());
    let q_dim = arch.n_heads * arch.head_dim();
    let rope_rows = |t: HostTensor, heads: usize| match layout {
        QkLayout::Interleaved => t,
        QkLayout::RotateHalf => permute_rows(&t, heads, RopeLayout::ToInterleaved),
    };
    let t = |suffix: &str, shape: &[usize]| table.tensor(&format!("blk.{i}.{suffix}.weight"), shape);
    let bias = |suffix: &str, n: usize| -> Result<Option<HostTensor>, LoadError> {
        let name = format!("blk.{i}.{suffix}.bias");
        match layout {
            QkLayout::RotateHalf => table.tensor(&name, &[n]).map(Some),
            QkLayout::Interleaved => table.optional(&name, &[n]),
        }
    };
    Ok(LayerWeights {
        attn_norm: t("attn_norm", &[dim])?,
        wq: rope_rows(t("attn_q", &[q_dim, dim])?, arch.n_heads),
        wk: rope_rows(t("attn_k", &[kv_dim, dim])?, arch.n_kv_heads),
        wv: t("attn_v", &[kv_dim, dim])?,
        wo: t("attn_output", &[dim, q_dim])?,
        ffn_norm: t("ffn_norm", &[dim])?,
        bq: bias("attn_q", q_dim)?.map(|b| rope_rows(b, arch.n_heads)),
        bk: bias("attn_k", kv_dim)?.map(|b| rope_rows(b, arch.n_kv_heads)),
        bv: bias("attn_v", kv_dim)?,
        ffn: Ffn::Dense(Mlp::new(
            t("ffn_gate", &[hidden, dim])?,
            t("ffn_up", &[hidden, dim])?,
            t("ffn_down", &[dim, hidden])?,
        )),
        bo: None,
        q_norm: None,
        k_norm: None,
        sinks: None,
        post_attn_norm: None,
        post_ffn_norm: None,
    })
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
