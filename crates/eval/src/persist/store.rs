//! The saved reference (`--save-reference DIR`, `--reference DIR`): everything a later run needs
//! of the reference and the noise floor, so that a CI job gating a new artifact pays only for
//! the artifact.
//!
//! A store is a folder of two files, in the section format of `container.rs` (as a shard's part):
//! - `manifest.json`: format name and version, the [`StoreKey`] the data was computed under,
//!   the size of the data, and its sections (name, element type, shape, byte range);
//! - `reference.bin`: the sections' little-endian arrays, back to back: the reference's greedy
//!   continuations (`tokens`, u32 `[prompts, H]`); what scoring keeps of its pass on them (its
//!   final hidden states per teacher-forcing chunk, `hidden/FIRST_PROMPT/START`, in the compute
//!   dtype, for the exact KL; or the compact top-K statistics, `top_ids`, `top_logp`,
//!   `tail_logp`, `entropy`, `logp_of_token`, `argmax`); and the noise floor's per-prompt traces
//!   (`noise_floor/…`); then the seal (`container::seal`): a SHA-256 over `manifest.json`'s bytes
//!   and the data, so that neither file can be edited alone.
//!
//! It is written into a staging folder beside DIR (removed by a terminating signal too,
//! [`qdrift_io::RemoveOnSignal`]) and renamed into place, so DIR holds a whole store or none. Reading checks the format and version, then the key field by field (a
//! mismatch is refused naming the field and both values), then the seal, then every section's
//! type, shape and range against what a run with that key writes (the hidden-state chunks are
//! exactly the batches and teacher-forcing chunks of the key's batch size and chunk), then every
//! value ([`check_stored`]: tokens within the model's vocabulary, finite hidden states, KL
//! divergences, entropies and log-probabilities in their ranges), before anything is used. The
//! writer checks the same values, so a store a run saves is always one a run can read.
//!
//! **Invariant: a store is only ever used by a run whose key equals the one it was written
//! under, so a run with `--reference` gives byte-for-byte the report of the run that saved it
//! (for the same variants).**

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use burn::tensor::{DType, Device, Tensor, TensorData};
use qdrift_io::{RemoveOnSignal, elide, uninterrupted, unique_sibling};
use qdrift_score::CompactChunk;
use serde::{Deserialize, Serialize};

use crate::error::EvalError;
use crate::inputs::identity::sha256_hex;
use crate::persist::container::{
    Bound, ROUNDING, SEAL_BYTES, Section, Sections, Writer, check_floats, check_format, check_tokens, check_traces,
    read_file, read_traces, rows, seal, unseal, write_traces,
};
use crate::trace::CompactReference;
use crate::trace::Trace;

/// The format name in `manifest.json`.
pub const STORE_FORMAT: &str = "qdrift-reference";
/// The store layout version this build writes and reads (2: `manifest.json` sealed with the data;
/// 3: traces with the reverse KL, the acceptance and the top-K agreement).
pub const STORE_VERSION: u32 = 3;
/// What to do with a store of another version.
const REDO: &str = "save the reference again with this qdrift (`qdrift eval --save-reference`)";
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
    /// Likewise for the routers of a mixture of experts (absent when false, so stores of
    /// models without experts read as before).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub quantize_router: bool,
    /// The qdrift version that wrote the store.
    pub qdrift_version: String,
}

impl StoreKey {
    /// Every field where `self` (the store's) and `run` differ, in key order: its name and both
    /// values (long ones elided).
    fn mismatches(&self, run: &StoreKey) -> Vec<(&'static str, String, String)> {
        let (a, b) = (serde_json::to_value(self).unwrap_or_default(), serde_json::to_value(run).unwrap_or_default());
        const FIELDS: [&str; 15] = [
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
            "quantize_router",
            "qdrift_version",
        ];
        // Other prompts tokenize to other tokens: their hash would repeat the prompts' difference.
        let prompts_differ = a.get("prompts") != b.get("prompts");
        FIELDS
            .iter()
            .filter(|f| a.get(**f) != b.get(**f))
            .filter(|f| !(prompts_differ && **f == "prompt_tokens_sha256"))
            .map(|f| {
                if *f == "prompts" {
                    let (stored, now) = prompts_in_words(&self.prompts, &run.prompts);
                    return (*f, stored, now);
                }
                let show =
                    |v: &serde_json::Value| v.get(*f).map(|x| elide(&x.to_string()).into_owned()).unwrap_or_default();
                (*f, show(&a), show(&b))
            })
            .collect()
    }
}

/// Two prompt lists that differ, in words: `saved 16` and `asks for 32`, or where equal counts
/// part (`prompt 3 is "b"` against `"c"`).
fn prompts_in_words(stored: &[String], now: &[String]) -> (String, String) {
    if stored.len() != now.len() {
        return (format!("saved {}", stored.len()), format!("asks for {}", now.len()));
    }
    match stored.iter().zip(now).position(|(a, b)| a != b) {
        Some(i) => (
            format!("{} saved, prompt {} is \"{}\"", stored.len(), i + 1, elide(&stored[i])),
            format!("\"{}\"", elide(&now[i])),
        ),
        None => (format!("{} saved", stored.len()), format!("{}", now.len())),
    }
}

/// The refusal of a store whose key differs from the run's: every differing field at once, as
/// `field stored (this run: now)`.
fn mismatch_message(mismatches: &[(&str, String, String)]) -> String {
    let fields: Vec<String> =
        mismatches.iter().map(|(f, stored, now)| format!("{f} {stored} (this run: {now})")).collect();
    format!(
        "was saved with other settings: {}; run with the store's settings or save a new reference",
        fields.join(", ")
    )
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
    /// whole batches of the stored run ([`crate::check::plan::Shard`] selects such).
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
#[serde(deny_unknown_fields)]
struct Manifest {
    format: String,
    version: u32,
    key: StoreKey,
    /// The bootstrap seed of the run that saved the store: not part of the key (the stored data
    /// do not depend on it), the seed a later run takes unless it is given one. Absent in stores
    /// written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    seed: Option<u64>,
    /// Bytes of `reference.bin` before its seal.
    data_bytes: u64,
    sections: Vec<Section>,
}

/// What a store's numbers are checked against besides its key: the run's model.
#[derive(Clone, Copy, Debug)]
pub struct StoreModel {
    /// Vocabulary size: every stored token id is below it.
    pub vocab: usize,
    /// Residual width: the hidden states' last dimension.
    pub dim: usize,
}

/// The error of the store at `dir` given with `flag`.
fn store_error<'a>(flag: &'static str, dir: &'a Path) -> impl Fn(String) -> EvalError + 'a {
    move |problem| EvalError::Store { flag, path: dir.to_path_buf(), problem }
}

/// Writes a store to `dir`, atomically (staged beside it, then renamed; a previous store there is
/// replaced). Errors name `--save-reference` and `dir`, never the staging folder.
///
/// # Shapes
/// - `continuations`: `[prompts][H]`; `noise_floor`: one trace per prompt, `H` positions each
/// - hidden chunks: `[rows, positions, dim]`
pub(crate) fn write_store(dir: &Path, key: &StoreKey, seed: u64, stored: &StoredReference) -> Result<(), EvalError> {
    let fail = store_error("--save-reference", dir);
    check_stored(stored, key, None).map_err(|e| fail(format!("cannot save the reference: {e}")))?;
    let n = stored.continuations.len();
    let h = stored.continuations.first().map_or(0, Vec::len);
    let mut w = Writer::default();
    w.u32s("tokens", vec![n, h], stored.continuations.iter().flatten().copied());
    match &stored.side {
        StoredSide::Hidden(chunks) => {
            let dtype = hidden_section_type(&key.dtype);
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
        seed: Some(seed),
        data_bytes: w.data.len() as u64,
        sections: w.sections,
    };
    let json = serde_json::to_vec_pretty(&manifest).map_err(|e| fail(format!("cannot encode manifest.json: {e}")))?;
    let digest = seal(STORE_FORMAT, &json, &w.data);
    w.data.extend_from_slice(&digest);
    let staging = staging_dir(dir)?;
    let result = (|| {
        std::fs::create_dir(&staging).map_err(|e| fail(format!("cannot create a folder beside it: {e}")))?;
        let _on_signal = RemoveOnSignal::new(&staging);
        for (name, bytes) in [("reference.bin", &w.data), ("manifest.json", &json)] {
            std::fs::write(staging.join(name), bytes).map_err(|e| fail(format!("cannot write {name}: {e}")))?;
        }
        // A signal waits for the renames: the previous store is never left aside.
        uninterrupted(|| replace_dir(&staging, dir))
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    result
}

/// A unique staging folder name beside `dir` (`PARENT/.NAME.qdrift-store-PID-RANDOM`,
/// [`unique_sibling`]); creates PARENT when missing.
fn staging_dir(dir: &Path) -> Result<PathBuf, EvalError> {
    let fail = store_error("--save-reference", dir);
    let abs = std::path::absolute(dir).map_err(|e| fail(e.to_string()))?;
    match (abs.parent(), abs.file_name()) {
        (Some(parent), Some(_)) => {
            std::fs::create_dir_all(parent).map_err(|e| fail(format!("cannot create its parent folder: {e}")))?;
            Ok(unique_sibling(&abs, "store"))
        }
        _ => Err(fail("must name a folder (not / or ..)".into())),
    }
}

/// Moves `staging` to `dir`; an existing store at `dir` is moved aside first (to a unique name
/// beside it) and removed after.
fn replace_dir(staging: &Path, dir: &Path) -> Result<(), EvalError> {
    let fail = store_error("--save-reference", dir);
    if dir.exists() {
        // Only a folder of exactly a store's two regular files is replaced (checked by type,
        // nothing opened but the folder itself).
        let is_store = dir.is_dir() && dir.join("manifest.json").is_file() && dir.join("reference.bin").is_file();
        if !is_store || std::fs::read_dir(dir).map_err(|e| fail(format!("cannot list it: {e}")))?.count() != 2 {
            return Err(fail("exists and is not a reference store; refusing to replace it".into()));
        }
        let abs = std::path::absolute(dir).map_err(|e| fail(e.to_string()))?;
        let old = unique_sibling(&abs, "store-old");
        std::fs::rename(dir, &old).map_err(|e| fail(format!("cannot move the previous store aside: {e}")))?;
        std::fs::rename(staging, dir).map_err(|e| fail(format!("cannot move the new store into place: {e}")))?;
        std::fs::remove_dir_all(&old).map_err(|e| fail(format!("cannot remove the previous store: {e}")))?;
        return Ok(());
    }
    std::fs::rename(staging, dir).map_err(|e| fail(format!("cannot move the new store into place: {e}")))
}

/// The store's `manifest.json` (`--reference DIR`): its bytes (the seal covers them) and what
/// they say, the format and version checked.
fn read_manifest(dir: &Path) -> Result<(Vec<u8>, Manifest), EvalError> {
    let fail = store_error("--reference", dir);
    let json = read_file(&dir.join("manifest.json"), MANIFEST_CAP, "store manifest").map_err(&fail)?;
    check_format(&json, "manifest.json", (STORE_FORMAT, STORE_VERSION), REDO).map_err(&fail)?;
    let manifest: Manifest = serde_json::from_slice(&json)
        .map_err(|e| fail(format!("manifest.json is not a reference store manifest: {e}")))?;
    Ok((json, manifest))
}

/// The settings a run with `--reference DIR` takes from the store unless it is given them: the
/// prompt count, horizons and batch size its key was computed under, and the seed of the run
/// that saved it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreSettings {
    /// How many prompts (the eval set's first ones).
    pub prompts: usize,
    /// Generated-token horizons.
    pub horizons: Vec<usize>,
    /// Prompts per batch.
    pub batch_size: usize,
    /// Bootstrap seed; `None` for a store written before it was kept.
    pub seed: Option<u64>,
}

/// Reads the settings of the store at `dir` from its `manifest.json` (format and version
/// checked; the data are checked when the run reads the store).
pub fn store_settings(dir: &Path) -> Result<StoreSettings, EvalError> {
    let (_, manifest) = read_manifest(dir)?;
    let k = manifest.key;
    Ok(StoreSettings { prompts: k.prompts.len(), horizons: k.horizons, batch_size: k.batch_size, seed: manifest.seed })
}

/// Reads the store at `dir` (`--reference`) for a run with key `run` on `model`; refuses any
/// mismatch, damage, or value a run with that key could not have written.
pub(crate) fn read_store(dir: &Path, run: &StoreKey, model: StoreModel) -> Result<StoredReference, EvalError> {
    let fail = store_error("--reference", dir);
    let (json, manifest) = read_manifest(dir)?;
    let mismatches = manifest.key.mismatches(run);
    if !mismatches.is_empty() {
        return Err(fail(mismatch_message(&mismatches)));
    }
    let cap = manifest.data_bytes.checked_add(SEAL_BYTES).map_or(DATA_CAP, |b| b.min(DATA_CAP));
    let file = read_file(&dir.join("reference.bin"), cap, "store data").map_err(&fail)?;
    let data = unseal(STORE_FORMAT, &json, &file, ("manifest.json", "reference.bin")).map_err(&fail)?;
    if data.len() as u64 != manifest.data_bytes {
        return Err(fail(format!(
            "manifest.json: data_bytes is {}, reference.bin holds {}",
            manifest.data_bytes,
            data.len()
        )));
    }
    let in_data = |e: String| fail(format!("reference.bin: {e}"));
    let sections = Sections::new(&manifest.sections, data).map_err(in_data)?;
    let stored = decode(&sections, run, model.dim).map_err(in_data)?;
    check_stored(&stored, run, Some(model)).map_err(in_data)?;
    Ok(stored)
}

/// Reads the store at `dir` as a run with key `run` on `model` would (`--reference`) and drops
/// it: the store reader's entry point for the fuzzer and the tests.
///
/// # Errors
/// As a run with `--reference` would refuse the store.
#[doc(hidden)]
pub fn verify_store(dir: &Path, run: &StoreKey, model: StoreModel) -> Result<(), EvalError> {
    read_store(dir, run, model).map(drop)
}

/// The hidden-state chunks a run with `key` keeps for `n` prompts of `h` positions: per batch of
/// `key.batch_size` prompts (keyed by its first), position 0 alone, then `key.chunk` positions at
/// a time from 1, as `qdrift_generate::teacher_forced` cuts them. Each: (first prompt, start),
/// (rows, positions).
fn hidden_grid(key: &StoreKey, n: usize, h: usize) -> Vec<((usize, usize), (usize, usize))> {
    let (batch, chunk) = (key.batch_size.max(1), key.chunk.max(1));
    let mut grid = Vec::new();
    for first in (0..n).step_by(batch) {
        let rows = batch.min(n - first);
        let mut start = 0;
        while start < h {
            let len = if start == 0 { 1 } else { chunk.min(h - start) };
            grid.push(((first, start), (rows, len)));
            start += len;
        }
    }
    grid
}

fn decode(s: &Sections<'_>, run: &StoreKey, dim: usize) -> Result<StoredReference, String> {
    let n = run.prompts.len();
    let h = run.horizons.iter().copied().max().unwrap_or(0);
    let continuations = rows(s.u32s("tokens", &[n, h])?, h);
    let (side, side_sections) = if run.kl == "exact" {
        let dtype = hidden_section_type(&run.dtype);
        let grid = hidden_grid(run, n, h);
        let mut chunks = Vec::with_capacity(grid.len());
        for ((p, start), (rows, len)) in grid {
            let bytes = s.get(&format!("hidden/{p}/{start}"), dtype, &[rows, len, dim])?;
            chunks.push(((p, start), [rows, len, dim], bytes.to_vec()));
        }
        let count = chunks.len();
        (StoredSide::Hidden(chunks), count)
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
        (StoredSide::Compact(CompactReference { k, prompts }), 6)
    };
    let (noise_floor, trace_sections) = read_traces(s, "noise_floor", n, h)?;
    // The tokens, the side's sections and the noise floor's.
    s.all_used(1 + side_sections + trace_sections)?;
    Ok(StoredReference { continuations, side, noise_floor })
}

/// Every value of a store in the range a run with `key` writes: `n` continuations of `h`
/// tokens, the hidden-state chunks of [`hidden_grid`] with finite values, the compact
/// statistics' log-probabilities and entropies in range, the noise floor's traces
/// ([`check_traces`]); with `model`, every token below its vocabulary and the hidden states
/// its width (the writer, which has no model at hand, checks the rest).
fn check_stored(s: &StoredReference, key: &StoreKey, model: Option<StoreModel>) -> Result<(), String> {
    let n = key.prompts.len();
    let h = key.horizons.iter().copied().max().unwrap_or(0);
    let vocab = model.map_or(usize::MAX, |m| m.vocab);
    if s.continuations.len() != n || s.continuations.iter().any(|c| c.len() != h) || s.noise_floor.len() != n {
        return Err(format!("does not hold {n} prompts of {h} positions"));
    }
    for (i, c) in s.continuations.iter().enumerate() {
        check_tokens("tokens", i + 1, c, vocab)?;
    }
    check_traces("noise_floor", &s.noise_floor, h, vocab, &s.continuations)?;
    match &s.side {
        StoredSide::Hidden(chunks) => {
            let grid = hidden_grid(key, n, h);
            let dims = chunks.first().map(|c| c.1[2]);
            if chunks.len() != grid.len()
                || chunks.iter().zip(&grid).any(|(c, g)| (c.0, (c.1[0], c.1[1])) != *g || Some(c.1[2]) != dims)
            {
                return Err("the hidden states are not cut as the run's batches and chunks".into());
            }
            if let (Some(m), Some(d)) = (model, dims)
                && m.dim != d
            {
                return Err(format!("the hidden states are {d} wide, the model {}", m.dim));
            }
            let dtype = hidden_section_type(&key.dtype);
            for ((p, start), _, bytes) in chunks {
                if !hidden_finite(bytes, dtype) {
                    return Err(format!("section hidden/{p}/{start}: a hidden state is not finite"));
                }
            }
        }
        StoredSide::Compact(c) => {
            for (i, p) in c.prompts.iter().enumerate() {
                check_tokens("top_ids", i + 1, &p.top_ids, vocab)?;
                check_tokens("argmax", i + 1, &p.argmax, vocab)?;
                check_floats("top_logp", i + 1, &p.top_logp, Bound::LogProb)?;
                check_floats("entropy", i + 1, &p.entropy, Bound::NonNegative)?;
                check_floats("logp_of_token", i + 1, &p.logp_of_token, Bound::LogProb)?;
                // The tail's log-mass is −∞ when the top K hold all of it.
                if let Some(t) = p.tail_logp.iter().position(|&l| l.is_nan() || l > ROUNDING) {
                    return Err(format!(
                        "section tail_logp: prompt {} position {t} is {}, not a log-probability (≤ 0)",
                        i + 1,
                        p.tail_logp[t]
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The section type of the hidden states of a run at compute dtype `dtype` (its name):
/// `f16`, `bf16` or `f32`, what the reference computes them in.
fn hidden_section_type(dtype: &str) -> &'static str {
    match dtype {
        "f16" => "f16",
        "bf16" => "bf16",
        _ => "f32",
    }
}

/// Whether every little-endian value of `bytes`, of section type `dtype` (`f16`, `bf16` or
/// `f32`), is finite: its exponent field is not all ones.
fn hidden_finite(bytes: &[u8], dtype: &str) -> bool {
    let half = |exponent: fn(u16) -> bool| bytes.chunks_exact(2).all(|b| exponent(u16::from_le_bytes([b[0], b[1]])));
    match dtype {
        "f16" => half(|h| (h >> 10) & 0x1f != 0x1f),
        "bf16" => half(|h| (h >> 7) & 0xff != 0xff),
        _ => bytes.chunks_exact(4).all(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_finite()),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn key(batch_size: usize, chunk: usize) -> StoreKey {
        StoreKey {
            model_sha256: String::new(),
            tokenizer_sha256: String::new(),
            eval_set_sha256: String::new(),
            prompts: vec!["a".into(); 5],
            prompt_tokens_sha256: String::new(),
            dtype: "f16".into(),
            horizons: vec![5, 20],
            backend: "cpu".into(),
            batch_size,
            chunk,
            kl: "exact".into(),
            quantize_embeddings: false,
            quantize_head: false,
            quantize_router: false,
            qdrift_version: String::new(),
        }
    }

    /// The hidden-state chunks a store must hold: per batch, position 0 alone, then `chunk`
    /// positions at a time (as teacher forcing cuts them).
    #[test]
    fn the_hidden_state_grid_is_the_runs_batches_and_chunks() {
        let grid = hidden_grid(&key(2, 8), 5, 20);
        let first: Vec<_> = grid.iter().filter(|((p, _), _)| *p == 0).copied().collect();
        assert_eq!(first, [((0, 0), (2, 1)), ((0, 1), (2, 8)), ((0, 9), (2, 8)), ((0, 17), (2, 3))]);
        assert_eq!(grid.iter().filter(|((p, _), _)| *p == 4).map(|(_, (rows, _))| *rows).max(), Some(1));
        assert_eq!(grid.len(), 12);
        assert!(hidden_grid(&key(2, 8), 5, 0).is_empty());
    }

    #[test]
    fn non_finite_hidden_states_are_found_in_every_dtype() {
        let half = |bits: u16| bits.to_le_bytes().to_vec();
        assert!(hidden_finite(&half(0x3c00), "f16"));
        assert!(!hidden_finite(&half(0x7c00), "f16") && !hidden_finite(&half(0x7e00), "f16"));
        // bf16: 1.0 is 0x3f80, +inf 0x7f80, a NaN 0x7fc0; 0x7c00 is a finite 2^121.
        assert!(hidden_finite(&half(0x3f80), "bf16") && hidden_finite(&half(0x7c00), "bf16"));
        assert!(!hidden_finite(&half(0x7f80), "bf16") && !hidden_finite(&half(0x7fc0), "bf16"));
        assert!(hidden_finite(&1.5f32.to_le_bytes(), "f32"));
        assert!(!hidden_finite(&f32::NAN.to_le_bytes(), "f32"));
        assert_eq!(["f16", "bf16", "f32"].map(hidden_section_type), ["f16", "bf16", "f32"]);
    }

    #[test]
    fn a_store_key_mismatch_names_every_field_and_elides_long_values() {
        let mut other = key(2, 8);
        other.prompts = vec!["p".repeat(500)];
        other.horizons = vec![5];
        other.batch_size += 1;
        other.prompt_tokens_sha256 = "f".repeat(64);
        let all = key(2, 8).mismatches(&other);
        let fields: Vec<&str> = all.iter().map(|(f, _, _)| *f).collect();
        assert_eq!(fields, ["prompts", "horizons", "batch_size"]);
        // Prompt lists in words: how many were saved and asked for.
        assert_eq!((all[0].1.as_str(), all[0].2.as_str()), ("saved 5", "asks for 1"));
        let line = mismatch_message(&all);
        assert!(line.starts_with("was saved with other settings: prompts saved 5 (this run: asks for 1)"), "{line}");
        assert!(line.contains(&format!("horizons {} (this run: [5])", all[1].1)), "{line}");
        assert!(line.ends_with("run with the store's settings or save a new reference"), "{line}");
        assert!(key(2, 8).mismatches(&key(2, 8)).is_empty());
        // The same count, other prompts: the first that differs, its id elided.
        let mut swapped = key(2, 8);
        swapped.prompts[2] = "q".repeat(500);
        let (_, stored, now) = key(2, 8).mismatches(&swapped).remove(0);
        assert_eq!(stored, "5 saved, prompt 3 is \"a\"");
        assert!(now.starts_with("\"qqq") && now.contains("(500 bytes)"), "{now}");
        // The same prompts tokenized otherwise (another tokenizer file): the tokens' hash says so.
        let mut retokenized = key(2, 8);
        retokenized.prompt_tokens_sha256 = "f".repeat(64);
        let fields: Vec<&str> = key(2, 8).mismatches(&retokenized).iter().map(|(f, _, _)| *f).collect();
        assert_eq!(fields, ["prompt_tokens_sha256"]);
    }
}
