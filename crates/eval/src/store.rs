//! The saved reference (`--save-reference DIR`, `--reference DIR`): everything a later run needs
//! of the reference and the noise floor, so that a CI job gating a new artifact pays only for
//! the artifact.
//!
//! A store is a folder of two files, in the section format of `container.rs` (as a shard's part):
//! - `manifest.json`: format name and version, the [`StoreKey`] the data was computed under,
//!   the SHA-256 and size of the data file, and its sections (name, element type, shape, byte
//!   range);
//! - `reference.bin`: the sections' little-endian arrays, back to back: the reference's greedy
//!   continuations (`tokens`, u32 `[prompts, H]`); what scoring keeps of its pass on them (its
//!   final hidden states per teacher-forcing chunk, `hidden/FIRST_PROMPT/START`, in the compute
//!   dtype, for the exact KL; or the compact top-K statistics, `top_ids`, `top_logp`,
//!   `tail_logp`, `entropy`, `logp_of_token`, `argmax`); and the noise floor's per-prompt traces
//!   (`noise_floor/…`).
//!
//! It is written into a staging folder beside DIR and renamed into place, so DIR holds a whole
//! store or none. Reading checks the format and version, then the key field by field (a
//! mismatch is refused naming the field and both values), then the data file's size and
//! SHA-256, then every section's type, shape and range, before anything is used.
//!
//! **Invariant: a store is only ever used by a run whose key equals the one it was written
//! under, so a run with `--reference` gives byte-for-byte the report of the run that saved it
//! (for the same variants).**

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use burn::tensor::{DType, Device, Tensor, TensorData};
use qdrift_io::unique_sibling;
use qdrift_score::CompactChunk;
use serde::{Deserialize, Serialize};

use crate::aggregate::Trace;
use crate::compact::CompactReference;
use crate::container::{Section, Sections, Writer, read_file, read_traces, rows, write_traces};
use crate::error::EvalError;
use crate::identity::sha256_hex;

/// The format name in `manifest.json`.
pub const STORE_FORMAT: &str = "qdrift-reference";
/// The store layout version this build writes and reads.
pub const STORE_VERSION: u32 = 1;
/// Largest `manifest.json` read.
const MANIFEST_CAP: u64 = 16 << 20;
/// Largest `reference.bin` read.
const DATA_CAP: u64 = 64 << 30;

/// What the stored data depends on: a run may use a store only when every field is equal.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoreKey {
    /// SHA-256 of the reference checkpoint (as the report's `model.sha256`; empty for a
    /// synthetic model).
    pub model_sha256: String,
    /// SHA-256 of the tokenizer file (the model file itself when the tokenizer is embedded).
    pub tokenizer_sha256: String,
    /// SHA-256 of the eval set.
    pub eval_set_sha256: String,
    /// The ids of the prompts, in order.
    pub prompts: Vec<String>,
    /// SHA-256 of the prompts' token ids (after any chat template), u32 little-endian, each
    /// prompt prefixed by its length.
    pub prompt_tokens_sha256: String,
    /// The reference's compute dtype.
    pub dtype: String,
    /// Generated-token horizons.
    pub horizons: Vec<usize>,
    /// `cpu` or `wgpu`: the backend class (numbers differ between them in the last bits).
    pub backend: String,
    /// Prompts per batch (left padding depends on a batch's prompts).
    pub batch_size: usize,
    /// Teacher-forcing chunk.
    pub chunk: usize,
    /// How KL is computed: `exact`, or `top-K`.
    pub kl: String,
    /// What the schemes quantize besides the linear layers (the noise floor does not depend on
    /// it, but a run's other variants do; kept so that a store is used only by like runs).
    pub quantize_embeddings: bool,
    /// Likewise for an untied output layer.
    pub quantize_head: bool,
    /// The qdrift version that wrote the store.
    pub qdrift_version: String,
}

impl StoreKey {
    /// The first field where `self` (the store's) and `run` differ: its name and both values.
    fn mismatch(&self, run: &StoreKey) -> Option<(&'static str, String, String)> {
        let (a, b) = (serde_json::to_value(self).unwrap_or_default(), serde_json::to_value(run).unwrap_or_default());
        const FIELDS: [&str; 14] = [
            "model_sha256",
            "tokenizer_sha256",
            "eval_set_sha256",
            "prompts",
            "prompt_tokens_sha256",
            "dtype",
            "horizons",
            "backend",
            "batch_size",
            "chunk",
            "kl",
            "quantize_embeddings",
            "quantize_head",
            "qdrift_version",
        ];
        FIELDS.iter().find(|f| a.get(**f) != b.get(**f)).map(|f| {
            let show = |v: &serde_json::Value| v.get(*f).map(|x| x.to_string()).unwrap_or_default();
            (*f, show(&a), show(&b))
        })
    }
}

/// SHA-256 of prompts' token ids, each prompt prefixed by its length (u32 little-endian).
pub(crate) fn prompt_tokens_sha256(prompts: &[Vec<u32>]) -> String {
    let mut bytes = Vec::new();
    for p in prompts {
        bytes.extend_from_slice(&(p.len() as u32).to_le_bytes());
        for t in p {
            bytes.extend_from_slice(&t.to_le_bytes());
        }
    }
    sha256_hex(&bytes)
}

/// One chunk of stored hidden states: (first prompt, start), shape `[rows, positions, dim]`,
/// dtype-native little-endian bytes.
pub(crate) type HiddenChunk = ((usize, usize), [usize; 3], Vec<u8>);

/// What the reference kept of its pass on its own text.
pub(crate) enum StoredSide {
    /// Final hidden states per chunk, in (first prompt, start) order.
    Hidden(Vec<HiddenChunk>),
    /// The compact statistics.
    Compact(CompactReference),
}

/// A store's contents.
pub(crate) struct StoredReference {
    /// The reference's continuations, one per prompt.
    pub continuations: Vec<Vec<u32>>,
    /// What it kept of its pass on them.
    pub side: StoredSide,
    /// The noise floor's traces, one per prompt.
    pub noise_floor: Vec<Trace>,
}

impl StoredReference {
    /// The part of the store for the prompts at `indices` of the whole list (a shard's, in
    /// order): their continuations, statistics and noise-floor traces, and the hidden-state
    /// chunks of their batches renumbered from the first selected prompt. `indices` must be
    /// whole batches of the stored run ([`crate::plan::Shard`] selects such).
    pub fn select(self, indices: &[usize]) -> Result<StoredReference, EvalError> {
        let n = self.continuations.len();
        if indices.len() == n && indices.iter().enumerate().all(|(i, &j)| i == j) {
            return Ok(self);
        }
        if let Some(&i) = indices.iter().find(|&&i| i >= n) {
            return Err(EvalError::Internal(format!("prompt {i} beyond the store's {n}")));
        }
        let local: HashMap<usize, usize> = indices.iter().enumerate().map(|(l, &g)| (g, l)).collect();
        let pick = |v: &[Vec<u32>]| indices.iter().map(|&i| v[i].clone()).collect::<Vec<_>>();
        let continuations = pick(&self.continuations);
        let noise_floor = indices.iter().map(|&i| self.noise_floor[i].clone()).collect();
        let side = match self.side {
            StoredSide::Compact(c) => StoredSide::Compact(CompactReference {
                k: c.k,
                prompts: indices.iter().map(|&i| c.prompts[i].clone()).collect(),
            }),
            StoredSide::Hidden(chunks) => {
                let mut kept = Vec::new();
                for ((first, start), shape, bytes) in chunks {
                    let Some(&l) = local.get(&first) else { continue };
                    // A chunk's rows must all be selected: shards take whole batches.
                    if (0..shape[0]).any(|r| local.get(&(first + r)) != Some(&(l + r))) {
                        return Err(EvalError::Internal(format!(
                            "the store's batch at prompt {first} is split by the shard"
                        )));
                    }
                    kept.push(((l, start), shape, bytes));
                }
                StoredSide::Hidden(kept)
            }
        };
        Ok(StoredReference { continuations, side, noise_floor })
    }
}

#[derive(Serialize, Deserialize)]
struct Manifest {
    format: String,
    version: u32,
    key: StoreKey,
    data_bytes: u64,
    data_sha256: String,
    sections: Vec<Section>,
}

/// Writes a store to `dir`, atomically (staged beside it, then renamed; a previous store there is
/// replaced).
///
/// # Shapes
/// - `continuations`: `[prompts][H]`; `noise_floor`: one trace per prompt, `H` positions each
/// - hidden chunks: `[rows, positions, dim]`
pub(crate) fn write_store(dir: &Path, key: &StoreKey, stored: &StoredReference) -> Result<(), EvalError> {
    let n = stored.continuations.len();
    let h = stored.continuations.first().map_or(0, Vec::len);
    let mut w = Writer::default();
    w.u32s("tokens", vec![n, h], stored.continuations.iter().flatten().copied());
    match &stored.side {
        StoredSide::Hidden(chunks) => {
            let dtype = if key.dtype == "f16" { "f16" } else { "f32" };
            for ((p, s), shape, bytes) in chunks {
                w.push(format!("hidden/{p}/{s}"), dtype, shape.to_vec(), bytes);
            }
        }
        StoredSide::Compact(c) => {
            let k = c.k;
            w.u32s("top_ids", vec![n, h, k], c.prompts.iter().flat_map(|p| p.top_ids.iter().copied()));
            w.f32s("top_logp", vec![n, h, k], c.prompts.iter().flat_map(|p| &p.top_logp));
            w.f32s("tail_logp", vec![n, h], c.prompts.iter().flat_map(|p| &p.tail_logp));
            w.f32s("entropy", vec![n, h], c.prompts.iter().flat_map(|p| &p.entropy));
            w.f32s("logp_of_token", vec![n, h], c.prompts.iter().flat_map(|p| &p.logp_of_token));
            w.u32s("argmax", vec![n, h], c.prompts.iter().flat_map(|p| p.argmax.iter().copied()));
        }
    }
    write_traces(&mut w, "noise_floor", &stored.noise_floor, h);
    let manifest = Manifest {
        format: STORE_FORMAT.into(),
        version: STORE_VERSION,
        key: key.clone(),
        data_bytes: w.data.len() as u64,
        data_sha256: sha256_hex(&w.data),
        sections: w.sections,
    };
    let json = serde_json::to_vec_pretty(&manifest).map_err(|e| EvalError::Internal(e.to_string()))?;
    let staging = staging_dir(dir)?;
    let result = (|| {
        std::fs::create_dir(&staging).map_err(EvalError::io(&staging))?;
        std::fs::write(staging.join("reference.bin"), &w.data).map_err(EvalError::io(&staging))?;
        std::fs::write(staging.join("manifest.json"), json).map_err(EvalError::io(&staging))?;
        replace_dir(&staging, dir)
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    result
}

/// A unique staging folder name beside `dir` (`PARENT/.NAME.qdrift-store-PID-RANDOM`,
/// [`unique_sibling`]); creates PARENT when missing.
fn staging_dir(dir: &Path) -> Result<PathBuf, EvalError> {
    let abs = std::path::absolute(dir).map_err(EvalError::io(dir))?;
    match (abs.parent(), abs.file_name()) {
        (Some(parent), Some(_)) => {
            std::fs::create_dir_all(parent).map_err(EvalError::io(parent))?;
            Ok(unique_sibling(&abs, "store"))
        }
        _ => Err(EvalError::Store { path: dir.to_path_buf(), problem: "must name a folder (not / or ..)".into() }),
    }
}

/// Moves `staging` to `dir`; an existing store at `dir` is moved aside first (to a unique name
/// beside it) and removed after.
fn replace_dir(staging: &Path, dir: &Path) -> Result<(), EvalError> {
    if dir.exists() {
        let is_store = dir.join("manifest.json").is_file() && dir.join("reference.bin").is_file();
        let entries = std::fs::read_dir(dir).map_err(EvalError::io(dir))?.count();
        if !is_store || entries != 2 {
            return Err(EvalError::Store {
                path: dir.to_path_buf(),
                problem: "exists and is not a reference store; refusing to replace it".into(),
            });
        }
        let abs = std::path::absolute(dir).map_err(EvalError::io(dir))?;
        let old = unique_sibling(&abs, "store-old");
        std::fs::rename(dir, &old).map_err(EvalError::io(dir))?;
        std::fs::rename(staging, dir).map_err(EvalError::io(dir))?;
        std::fs::remove_dir_all(&old).map_err(EvalError::io(&old))?;
        return Ok(());
    }
    std::fs::rename(staging, dir).map_err(EvalError::io(dir))
}

/// Reads the store at `dir` for a run with key `run`; refuses any mismatch or damage.
pub(crate) fn read_store(dir: &Path, run: &StoreKey) -> Result<StoredReference, EvalError> {
    let fail = |problem: String| EvalError::Store { path: dir.to_path_buf(), problem };
    let manifest_path = dir.join("manifest.json");
    let text = read_file(&manifest_path, MANIFEST_CAP, "store manifest").map_err(fail)?;
    let manifest: Manifest = serde_json::from_slice(&text)
        .map_err(|e| fail(format!("manifest.json is not a reference store manifest: {e}")))?;
    if manifest.format != STORE_FORMAT || manifest.version != STORE_VERSION {
        return Err(fail(format!(
            "is {} version {}; this qdrift reads {STORE_FORMAT} version {STORE_VERSION}",
            manifest.format, manifest.version
        )));
    }
    if let Some((field, stored, now)) = manifest.key.mismatch(run) {
        return Err(fail(format!("was saved with {field} = {stored}, this run has {now}; save a new reference")));
    }
    let data_path = dir.join("reference.bin");
    let data = read_file(&data_path, DATA_CAP.min(manifest.data_bytes), "store data").map_err(fail)?;
    if data.len() as u64 != manifest.data_bytes {
        return Err(fail(format!(
            "reference.bin holds {} bytes, the manifest says {}",
            data.len(),
            manifest.data_bytes
        )));
    }
    if sha256_hex(&data) != manifest.data_sha256 {
        return Err(fail("reference.bin does not match its checksum (damaged or edited)".into()));
    }
    let sections = Sections::new(&manifest.sections, &data).map_err(fail)?;
    decode(&sections, run).map_err(fail)
}

fn decode(s: &Sections<'_>, run: &StoreKey) -> Result<StoredReference, String> {
    let n = run.prompts.len();
    let h = run.horizons.iter().copied().max().unwrap_or(0);
    let continuations = rows(s.u32s("tokens", &[n, h])?, h);
    let side = if run.kl == "exact" {
        let dtype = if run.dtype == "f16" { "f16" } else { "f32" };
        let mut chunks = Vec::new();
        for (name, sec, bytes) in s.iter() {
            let Some(rest) = name.strip_prefix("hidden/") else { continue };
            let mut parts = rest.split('/').map(str::parse::<usize>);
            let (Some(Ok(p)), Some(Ok(start)), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(format!("section {name}: not hidden/PROMPT/START"));
            };
            let [rows, len, dim] = sec.shape[..] else {
                return Err(format!("section {name}: shape {:?} is not [rows, positions, dim]", sec.shape));
            };
            if sec.dtype != dtype || p + rows > n || start + len > h {
                return Err(format!(
                    "section {name}: {} {:?} does not fit {n} prompts × {h} positions in {dtype}",
                    sec.dtype, sec.shape
                ));
            }
            chunks.push(((p, start), [rows, len, dim], bytes.to_vec()));
        }
        chunks.sort_by_key(|(k, _, _)| *k);
        StoredSide::Hidden(chunks)
    } else {
        let k: usize =
            run.kl.strip_prefix("top-").and_then(|k| k.parse().ok()).ok_or_else(|| format!("kl {}", run.kl))?;
        let top_ids = s.u32s("top_ids", &[n, h, k])?;
        let top_logp = s.f32s("top_logp", &[n, h, k])?;
        let tail_logp = s.f32s("tail_logp", &[n, h])?;
        let entropy = s.f32s("entropy", &[n, h])?;
        let logp_of_token = s.f32s("logp_of_token", &[n, h])?;
        let argmax = s.u32s("argmax", &[n, h])?;
        let prompts = (0..n)
            .map(|i| CompactChunk {
                batch: 1,
                positions: h,
                k,
                top_ids: top_ids[i * h * k..(i + 1) * h * k].to_vec(),
                top_logp: top_logp[i * h * k..(i + 1) * h * k].to_vec(),
                tail_logp: tail_logp[i * h..(i + 1) * h].to_vec(),
                entropy: entropy[i * h..(i + 1) * h].to_vec(),
                logp_of_token: logp_of_token[i * h..(i + 1) * h].to_vec(),
                argmax: argmax[i * h..(i + 1) * h].to_vec(),
            })
            .collect();
        StoredSide::Compact(CompactReference { k, prompts })
    };
    let noise_floor = read_traces(s, "noise_floor", n, h)?;
    Ok(StoredReference { continuations, side, noise_floor })
}

/// Reads a kept hidden-state chunk back from the device as dtype-native bytes.
///
/// # Shapes
/// `hidden`: `[rows, positions, dim]` in the compute dtype.
pub(crate) fn hidden_bytes(hidden: &Tensor<3>, dtype: DType) -> Result<([usize; 3], Vec<u8>), EvalError> {
    let dims = hidden.dims();
    let data = hidden.to_data();
    if data.dtype() != dtype {
        return Err(EvalError::Internal(format!(
            "hidden states are {:?}, the reference computes in {dtype:?}",
            data.dtype()
        )));
    }
    Ok((dims, data.into_bytes().to_vec()))
}

/// Uploads a stored hidden-state chunk.
///
/// # Shapes
/// `[rows, positions, dim]` of `dtype` (f16 or f32) from `bytes`.
pub(crate) fn hidden_tensor(shape: [usize; 3], bytes: Vec<u8>, dtype: DType, device: &Device) -> Tensor<3> {
    Tensor::from_data(TensorData::from_bytes_vec(bytes, shape, dtype), (device, dtype))
}
