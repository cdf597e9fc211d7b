//! The safetensors files of a Hugging Face folder: `model.safetensors` or the shards
//! `model.safetensors.index.json` lists, each opened once ([`qdrift_io::PinnedFile`]) and its
//! header parsed and checked once, and typed access to the stored tensors (floats as f32,
//! integers, FP8 codes) for the reader and the quantized layouts. Each tensor's bytes are read
//! when asked, with a positioned read into a buffer of their own that lives while the tensor is
//! decoded: a file cut short or rewritten since it was opened is an error naming it, not a
//! `SIGBUS` or other numbers.
//!
//! Spec: <https://github.com/huggingface/safetensors> (README "Format": `u64` little-endian header
//! length N, N bytes of JSON `{name: {dtype, shape, data_offsets: [begin, end]}}` with an optional
//! `__metadata__`, then the byte buffer; offsets are relative to the buffer), checked with the
//! `safetensors` crate's `Metadata`; sharding: `transformers`' `model.safetensors.index.json` (`weight_map:
//! {tensor: shard file}`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use qdrift_io::PinnedFile;
use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::{Dtype, SafeTensorError};
use serde_json::Value;

use crate::LoadError;
use crate::floats::{LeFloat, le_floats};
use crate::ofp8::Ofp8;
use qdrift_weights::HostTensor;

/// The safetensors files of a folder and which holds each tensor.
pub(crate) struct Shards {
    files: Vec<ShardFile>,
    /// Tensor name → index in `files`.
    index: HashMap<String, usize>,
}

/// One safetensors file, open, with its header parsed once.
struct ShardFile {
    path: PathBuf,
    file: PinnedFile,
    /// Where the byte buffer starts (8 + header length).
    data_start: usize,
    /// Tensors in file order.
    tensors: Vec<(String, TensorInfo)>,
}

impl Shards {
    /// Opens the weights files of the folder `dir` and reads their headers.
    pub(crate) fn open(dir: &Path) -> Result<Self, LoadError> {
        let single = dir.join("model.safetensors");
        let index_path = dir.join("model.safetensors.index.json");
        let names: Vec<PathBuf> = if single.exists() {
            vec![single]
        } else if index_path.exists() {
            let index = crate::input::read_json(&index_path, crate::input::JSON)?;
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
            // Checked before opening: opening a named pipe blocks, and a device reads endlessly.
            let file = crate::input::open_pinned(&path, crate::input::MODEL)?;
            let (header_len, meta) = read_header(&file)?;
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
            files.push(ShardFile { path, file, data_start, tensors });
        }
        Ok(Self { files, index })
    }

    /// A multimodal wrapper's files seen as its language model's: `model.language_model.X`
    /// (`transformers` ≥ 4.52) and `language_model.model.X` (older) become `model.X`,
    /// `language_model.lm_head.X` becomes `lm_head.X`, and the towers' and projectors' tensors
    /// (a name whose first part, after `model.`, holds `vision`, `audio`, `multi_modal` or
    /// `mm_`) are set aside; every other name is kept, for the reader to read or refuse. Returns
    /// how many tensors were set aside.
    pub(crate) fn keep_language_model(&mut self) -> Result<usize, LoadError> {
        let mut index = HashMap::new();
        let mut ignored = 0;
        for (i, f) in self.files.iter_mut().enumerate() {
            let tensors = std::mem::take(&mut f.tensors);
            for (name, info) in tensors {
                let Some(name) = language_model_name(&name) else {
                    ignored += 1;
                    continue;
                };
                if index.insert(name.clone(), i).is_some() {
                    return Err(LoadError::invalid(
                        &f.path,
                        format!("tensor {name} is stored twice (under two names)"),
                    ));
                }
                f.tensors.push((name, info));
            }
        }
        self.index = index;
        Ok(ignored)
    }

    /// How many tensors the files hold in all.
    pub(crate) fn tensor_count(&self) -> usize {
        self.index.len()
    }

    /// Every stored tensor with its header entry, file by file in file order.
    pub(crate) fn tensors(&self) -> impl Iterator<Item = (&str, &TensorInfo)> {
        self.files.iter().flat_map(|f| f.tensors.iter().map(|(n, t)| (n.as_str(), t)))
    }

    /// Whether any file holds `name`.
    pub(crate) fn has(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// The file holding `name` and its header entry; `None` when no file has it.
    fn entry(&self, name: &str) -> Option<(&ShardFile, &TensorInfo)> {
        let f = &self.files[*self.index.get(name)?];
        let (_, info) = f.tensors.iter().find(|(n, _)| n == name)?;
        Some((f, info))
    }

    /// The stored bytes of `name` with its dtype and shape, read from its file; `None` when no
    /// file has it.
    pub(crate) fn raw(&self, name: &str) -> Result<Option<Raw<'_>>, LoadError> {
        let Some((f, info)) = self.entry(name) else {
            return Ok(None);
        };
        let bytes = f.read(info)?;
        Ok(Some(Raw { path: &f.path, dtype: info.dtype, shape: &info.shape, bytes }))
    }

    /// The stored dtype of `name`.
    pub(crate) fn dtype(&self, name: &str) -> Option<Dtype> {
        self.entry(name).map(|(_, info)| info.dtype)
    }

    /// The stored shape of `name`.
    pub(crate) fn shape(&self, name: &str) -> Option<&[usize]> {
        self.entry(name).map(|(_, info)| info.shape.as_slice())
    }

    /// The file holding `name`.
    pub(crate) fn path_of(&self, name: &str) -> Option<&Path> {
        self.entry(name).map(|(f, _)| f.path.as_path())
    }

    /// The first weights file, for errors about a tensor no file has.
    pub(crate) fn first_path(&self) -> &Path {
        self.files.first().map_or(Path::new("."), |f| f.path.as_path())
    }

    /// Every tensor with its stored dtype, file by file in file order.
    pub(crate) fn dtypes(&self) -> Vec<(String, String)> {
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
        let bytes = f.read(info)?;
        let data =
            to_f32(info.dtype, &bytes).map_err(|m| LoadError::invalid(&f.path, format!("tensor {name}: {m}")))?;
        crate::input::check_finite(&f.path, name, &data)?;
        HostTensor::new(shape.to_vec(), data).map(Some).ok_or_else(|| {
            LoadError::invalid(&f.path, format!("tensor {name}: byte count does not match shape {shape:?}"))
        })
    }

    /// The tensor `name` as f32 of `shape`; an error naming the files searched when none has it.
    pub(crate) fn require(&self, name: &str, shape: &[usize]) -> Result<HostTensor, LoadError> {
        self.get(name, shape)?.ok_or_else(|| {
            let files: Vec<String> = self.files.iter().map(|f| f.path.display().to_string()).collect();
            LoadError::invalid(
                self.files.first().map_or(Path::new("."), |f| f.path.as_path()),
                format!("tensor {name} is missing; expected shape {shape:?} (searched {})", files.join(", ")),
            )
        })
    }
}

/// A wrapper's tensor name as its language model's ([`Shards::keep_language_model`]); `None` for
/// a tower's or projector's.
fn language_model_name(name: &str) -> Option<String> {
    for (from, to) in [
        ("model.language_model.", "model."),
        ("language_model.model.", "model."),
        ("language_model.lm_head.", "lm_head."),
    ] {
        if let Some(rest) = name.strip_prefix(from) {
            return Some(format!("{to}{rest}"));
        }
    }
    let first = name.strip_prefix("model.").unwrap_or(name).split('.').next().unwrap_or("");
    let tower = ["vision", "audio", "multi_modal", "mm_"].iter().any(|t| first.contains(t));
    (!tower).then(|| name.to_string())
}

impl ShardFile {
    /// The stored bytes of the tensor `info` describes, read from the file: `read_header`
    /// checked its range against the file's length at open, and the read checks that the file is
    /// still the one opened.
    fn read(&self, info: &TensorInfo) -> Result<Vec<u8>, LoadError> {
        let (begin, end) = info.data_offsets;
        Ok(self.file.read_at((self.data_start + begin) as u64, end - begin)?)
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
    pub bytes: Vec<u8>,
}

/// `safetensors`' limit on a header (`MAX_HEADER_SIZE`).
const MAX_HEADER: u64 = 100_000_000;

/// Reads and parses a safetensors file's header, turning the library's terse errors into
/// messages for people. Returns the header length and the parsed header; every tensor's range is
/// validated against the file's length.
fn read_header(file: &PinnedFile) -> Result<(usize, Metadata), LoadError> {
    let (path, file_len) = (file.path(), file.len());
    if file_len < 8 {
        return Err(LoadError::truncated(
            path,
            format!("the 8-byte header length, the file has {file_len} bytes (not a safetensors file?)"),
        ));
    }
    let mut n = [0u8; 8];
    n.copy_from_slice(&file.read_at(0, 8)?);
    let n = u64::from_le_bytes(n);
    let rest = file_len - 8;
    if n > rest {
        return Err(LoadError::truncated(
            path,
            format!(
                "the header declares {n} bytes of JSON but only {rest} bytes follow the length (corrupt or not safetensors)"
            ),
        ));
    }
    if n > MAX_HEADER {
        return Err(LoadError::invalid(path, describe(&SafeTensorError::HeaderTooLarge, file_len)));
    }
    // Below MAX_HEADER, so it fits in usize.
    let header = file.read_at(8, n as usize)?;
    Ok((n as usize, parse_header(path, &header, rest - n)?))
}

/// A header's JSON as `safetensors` deserializes it (its `HashMetadata`): `__metadata__`, and
/// every other key a tensor.
#[derive(serde::Deserialize)]
struct HeaderJson {
    #[serde(rename = "__metadata__")]
    metadata: Option<HashMap<String, String>>,
    #[serde(flatten)]
    tensors: HashMap<String, TensorInfo>,
}

/// The header `header` of a file whose byte buffer (after the header) has `buffer_len` bytes,
/// checked as `SafeTensors::read_metadata` checks it: UTF-8 JSON, tensors contiguous in the
/// buffer in offset order, each range the size of its dtype and shape, the last one ending the
/// buffer.
fn parse_header(path: &Path, header: &[u8], buffer_len: u64) -> Result<Metadata, LoadError> {
    let file_len = buffer_len.saturating_add(8 + header.len() as u64);
    let fail = |e: SafeTensorError| {
        LoadError::invalid(path, diagnose_header(header, buffer_len).unwrap_or_else(|| describe(&e, file_len)))
    };
    let text = std::str::from_utf8(header).map_err(|e| fail(SafeTensorError::InvalidHeader(e)))?;
    let json: HeaderJson =
        serde_json::from_str(text).map_err(|e| fail(SafeTensorError::InvalidHeaderDeserialization(e)))?;
    let mut tensors: Vec<(String, TensorInfo)> = json.tensors.into_iter().collect();
    tensors.sort_by_key(|(_, t)| t.data_offsets);
    let meta = Metadata::new(json.metadata, tensors).map_err(fail)?;
    if meta.data_len() as u64 != buffer_len {
        return Err(fail(SafeTensorError::MetadataIncompleteBuffer));
    }
    Ok(meta)
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

fn describe(e: &SafeTensorError, file_len: u64) -> String {
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

impl Shards {
    /// The FP8 format and bytes of `name`, which must have `shape`.
    pub(crate) fn fp8(&self, name: &str, shape: &[usize]) -> Result<(Ofp8, Vec<u8>), LoadError> {
        let raw = self.raw_shaped(name, &[shape.to_vec()])?;
        let format = match raw.dtype {
            Dtype::F8_E4M3 => Ofp8::E4M3,
            Dtype::F8_E5M2 => Ofp8::E5M2,
            other => {
                return Err(LoadError::unsupported(
                    raw.path,
                    format!("tensor {name} dtype"),
                    format!("{other:?}"),
                    "F8_E4M3, F8_E5M2",
                ));
            }
        };
        Ok((format, raw.bytes))
    }

    /// An I32 tensor of exactly `shape`.
    pub(crate) fn ints(&self, name: &str, shape: &[usize]) -> Result<Vec<i32>, LoadError> {
        let raw = self.raw_shaped(name, &[shape.to_vec()])?;
        if raw.dtype != Dtype::I32 {
            return Err(LoadError::unsupported(
                raw.path,
                format!("tensor {name} dtype"),
                format!("{:?}", raw.dtype),
                "I32",
            ));
        }
        Ok(raw.bytes.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }

    /// An integer tensor (I8, I16, I32, I64, U8) of exactly `shape`, widened to i64.
    pub(crate) fn ints_any(&self, name: &str, shape: &[usize]) -> Result<Vec<i64>, LoadError> {
        let raw = self.raw_shaped(name, &[shape.to_vec()])?;
        int_values(raw.dtype, &raw.bytes).ok_or_else(|| {
            LoadError::unsupported(
                raw.path,
                format!("tensor {name} dtype"),
                format!("{:?}", raw.dtype),
                "I8, I16, I32, I64, U8",
            )
        })
    }

    /// Zero points: any integer or float dtype, one of `shapes`.
    pub(crate) fn numbers_any(&self, name: &str, shapes: &[Vec<usize>]) -> Result<Vec<i64>, LoadError> {
        let raw = self.raw_shaped(name, shapes)?;
        if let Some(v) = int_values(raw.dtype, &raw.bytes) {
            return Ok(v);
        }
        let f =
            to_f32(raw.dtype, &raw.bytes).map_err(|m| LoadError::invalid(raw.path, format!("tensor {name}: {m}")))?;
        f.iter()
            .map(|&z| {
                (z.fract() == 0.0 && z.abs() < 1e9).then_some(z as i64).ok_or_else(|| {
                    LoadError::invalid(raw.path, format!("tensor {name}: zero point {z} is not an integer"))
                })
            })
            .collect()
    }

    /// A float (F32/F16/BF16) tensor of exactly `shape`, as f32.
    pub(crate) fn floats(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, LoadError> {
        self.floats_any(name, &[shape.to_vec()])
    }

    /// A float (F32/F16/BF16) tensor with one of `shapes`, as f32; checked finite.
    pub(crate) fn floats_any(&self, name: &str, shapes: &[Vec<usize>]) -> Result<Vec<f32>, LoadError> {
        let raw = self.raw_shaped(name, shapes)?;
        let v =
            to_f32(raw.dtype, &raw.bytes).map_err(|m| LoadError::invalid(raw.path, format!("tensor {name}: {m}")))?;
        crate::input::check_finite(raw.path, name, &v)?;
        Ok(v)
    }

    /// `name`, present and with one of `shapes` (checked before its bytes are read).
    pub(crate) fn raw_shaped(&self, name: &str, shapes: &[Vec<usize>]) -> Result<Raw<'_>, LoadError> {
        let (f, info) = self.entry(name).ok_or_else(|| {
            LoadError::invalid(
                self.first_path(),
                format!("tensor {name} is missing; the quantization config needs it with shape {}", show(shapes)),
            )
        })?;
        if !shapes.contains(&info.shape) {
            return Err(LoadError::invalid(
                &f.path,
                format!("tensor {name} has shape {:?}; expected {}", info.shape, show(shapes)),
            ));
        }
        let bytes = f.read(info)?;
        Ok(Raw { path: &f.path, dtype: info.dtype, shape: &info.shape, bytes })
    }
}

fn show(shapes: &[Vec<usize>]) -> String {
    shapes.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(" or ")
}

/// Little-endian integers of an integer dtype, widened; `None` for other dtypes.
fn int_values(dtype: Dtype, bytes: &[u8]) -> Option<Vec<i64>> {
    Some(match dtype {
        Dtype::I8 => bytes.iter().map(|&b| i64::from(b as i8)).collect(),
        Dtype::U8 => bytes.iter().map(|&b| i64::from(b)).collect(),
        Dtype::I16 => bytes.chunks_exact(2).map(|c| i64::from(i16::from_le_bytes([c[0], c[1]]))).collect(),
        Dtype::I32 => bytes.chunks_exact(4).map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect(),
        Dtype::I64 => bytes
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect(),
        _ => return None,
    })
}
