//! Resource accounting for `qdrift inspect`: parameter counts, weight memory per storage scheme,
//! KV-cache memory and FLOPs per generated token, from the architecture alone (no weights needed,
//! so [`crate::synthetic_arch`] shapes of any size can be inspected).
//!
//! Definitions (`d` = dim, `h` = hidden_dim, `q` = n_heads·head_dim, `kv` = n_kv_heads·head_dim,
//! `V` = vocab_size, `L` = n_layers):
//! - **Matrices**: the token embedding `[V, d]`; per layer `wq [q, d]`, `wk [kv, d]`,
//!   `wv [kv, d]`, `wo [d, q]`, and a dense FFN `w_gate [h, d]`, `w_up [h, d]`, `w_down [d, h]`
//!   or a mixture of experts: the router `[E, d]` and `E` experts' `[e, d]`, `[e, d]`, `[d, e]`
//!   (`e` = expert width); the output head `[V, d]` only when untied (a tied head is the
//!   embedding, counted once).
//! - **Vectors**: two RMSNorm weights `[d]` per layer (four with Gemma's sandwich norms), q/k
//!   norms `[head_dim]`, sinks `[n_heads]`, the final norm `[d]`, and the biases (q/k/v `q + 2·kv`
//!   per layer; a loaded model's are counted as it holds them: o, router and expert biases too).
//! - **Weight bytes** under a [`WeightStorage`] = Σ over the matrices (embedding, layers' linears,
//!   untied head) of its [`WeightStorage::matrix_bytes`] + the vectors at its
//!   [`WeightStorage::vector_bytes`] each. The per-matrix bytes are the storage format's own:
//!   `qdrift-quantize` implements [`WeightStorage`] for its schemes from the same layouts its
//!   codecs store (this crate cannot know them: quantize depends on load); [`Fp32`] is the
//!   unquantized baseline (4 bytes per value, vectors included). The embedding and an untied head
//!   are counted in the storage format too: the figure for quantizing every matrix.
//! - **KV cache** = `2 (K and V) · L · n_kv_heads · head_dim · bytes · seq_len · batch`.
//! - **Source storage** (GGUF files and Hugging Face folders, [`source_storage`]): per tensor type of the file, the
//!   tensors, their values and the bytes their data takes (`elements / block size · type size`),
//!   and `8 · bytes / values` bits per weight, per type and over the file: a mixed file's real cost.
//!   For a quantized Hugging Face folder each quantized linear layer counts once, under the
//!   folder's format (`gptq 4-bit g128 v1`, ...), with its `out × in` weights and the bytes of
//!   all its stored parts (codes, scales, zero points, `g_idx`); other tensors under their dtype.
//! - **FLOPs per generated token** ≈ `2 · (matmul parameters)` + `2 · 2 · L · n_heads · head_dim
//!   · context`, where the matmul parameters are the layers' linears (of a mixture of experts:
//!   the router and the `top_k` experts a token is routed to) plus the head
//!   (`V·d`, also when tied: the embedding is then multiplied as the head; the embedding lookup
//!   itself is free), and the attention term counts `q·kᵀ` and `p·v` over `context` positions.
//!   Norms, RoPE, softmax and SwiGLU's elementwise work are left out (< 1% at these sizes).

use std::fmt;
use std::path::Path;

use serde::Serialize;

pub use crate::gguf::read::{gguf_source_storage, read_gguf_tensor_sizes};
pub use crate::storage::{SizeOverflow, SourceStorage, TypeStorage, bits_per_weight, source_storage};

use crate::LoadError;
use crate::loaded::{LoadedModel, ModelFormat};
use crate::open::open_model;
use crate::storage::grouped;
use crate::synthetic;
use qdrift_weights::{Ffn, HostTensor, LayerWeights, Mlp, ModelArch};

/// Parameter counts, a tied embedding counted once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ParamCounts {
    /// Token embedding, `V·d`.
    pub embedding: u64,
    /// One block: 7 linears (or the router and the experts), 2 norms, biases if any; the first
    /// block when they differ (Qwen3-MoE's dense layers).
    pub per_layer: u64,
    /// `L · per_layer`.
    pub layers: u64,
    /// Final RMSNorm, `d`.
    pub final_norm: u64,
    /// Untied output head `V·d`; 0 when tied.
    pub head: u64,
    /// Sum of the above.
    pub total: u64,
}

/// How many tensors of the source file have each dtype.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DtypeCount {
    /// Dtype name as the file has it (`F32`, `BF16`, `Q4_1`, ...).
    pub dtype: String,
    /// Number of tensors.
    pub tensors: usize,
}

/// How a storage format stores weights, for the weight-memory accounting of [`inspect`].
///
/// Implemented by `qdrift_quantize::Scheme` (from its codecs' storage layouts) and by [`Fp32`].
pub trait WeightStorage {
    /// The name reports give it (a scheme's CLI name, `fp32`).
    fn name(&self) -> String;
    /// Bytes of a `[rows, cols]` weight matrix (codes, scales, zero points as stored).
    fn matrix_bytes(&self, rows: u64, cols: u64) -> u64;
    /// Bytes per value of the vectors kept beside the matrices (RMSNorm weights, biases).
    fn vector_bytes(&self) -> u64;
}

/// Unquantized f32 weights: 4 bytes per value, matrices and vectors alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fp32;

impl WeightStorage for Fp32 {
    fn name(&self) -> String {
        "fp32".to_string()
    }

    /// Saturates rather than overflowing; [`inspect`] reports a saturated total as an overflow.
    fn matrix_bytes(&self, rows: u64, cols: u64) -> u64 {
        rows.saturating_mul(cols).saturating_mul(4)
    }

    fn vector_bytes(&self) -> u64 {
        4
    }
}

/// Weight memory under one storage format.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SchemeBytes {
    /// The format's [`WeightStorage::name`]: `fp32`, or a scheme's CLI name (`int8`, `fp8-e4m3`,
    /// `int4-g128`, `q4_k`, ...).
    pub scheme: String,
    /// Bytes of all weights (see the module docs for the formula).
    pub bytes: u64,
}

/// KV-cache memory for a context.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KvCacheBytes {
    /// Positions cached.
    pub seq_len: u64,
    /// Sequences decoded together.
    pub batch: u64,
    /// With f32 entries.
    pub f32_bytes: u64,
    /// With f16 entries.
    pub f16_bytes: u64,
}

/// Compute for one generated token at a given context.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FlopsPerToken {
    /// Positions attended to.
    pub context: u64,
    /// `2 · matmul parameters`.
    pub matmul: u64,
    /// `2 · 2 · L · n_heads · head_dim · context`.
    pub attention: u64,
    /// `matmul + attention`.
    pub total: u64,
}

/// Everything `qdrift inspect` reports about a model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Inspection {
    /// Architecture name.
    pub architecture: String,
    /// Source format (`llama2.c`, `gguf`, `hf-safetensors`, `synthetic`), if known.
    pub format: Option<ModelFormat>,
    /// Whether the weights are synthetic (random): `format` is `synthetic`.
    pub synthetic: bool,
    /// The hyper-parameters.
    pub arch: ModelArch,
    /// Whether the layers have q/k/v biases (counted in the parameters).
    pub biases: bool,
    /// Parameter counts.
    pub params: ParamCounts,
    /// Source tensors per dtype, most frequent first.
    pub source_dtypes: Vec<DtypeCount>,
    /// The source file's stored bytes per type and bits per weight (GGUF files; `None` for other
    /// formats and shapes inspected without a file).
    pub source_storage: Option<SourceStorage>,
    /// Weight memory per storage format, in the order they were asked for.
    pub weight_bytes: Vec<SchemeBytes>,
    /// KV cache for `seq_len` × `batch`.
    pub kv_cache: KvCacheBytes,
    /// FLOPs per generated token at context `seq_len`.
    pub flops_per_token: FlopsPerToken,
}

/// `Σ terms`, or [`SizeOverflow`] naming `quantity`.
fn sum(quantity: &'static str, terms: &[u64]) -> Result<u64, SizeOverflow> {
    terms.iter().try_fold(0u64, |s, &t| s.checked_add(t)).ok_or(SizeOverflow { quantity })
}

/// `Π factors`, or [`SizeOverflow`] naming `quantity`.
fn product(quantity: &'static str, factors: &[u64]) -> Result<u64, SizeOverflow> {
    factors.iter().try_fold(1u64, |p, &f| p.checked_mul(f)).ok_or(SizeOverflow { quantity })
}

/// The `[rows, cols]` of every matrix of layer `layer`, each with how many there are: `wq`,
/// `wk`, `wv`, `wo`, then `w_gate`, `w_up`, `w_down`, or the router and the experts' three
/// (`E` of each; `top_k` when `active`, the ones a token runs).
fn layer_matrices(a: &ModelArch, layer: usize, active: bool) -> Vec<(u64, u64, u64)> {
    let (d, h) = (a.dim as u64, a.hidden_dim as u64);
    let (q, kv) = ((a.n_heads * a.head_dim()) as u64, a.kv_dim() as u64);
    let mut m = vec![(q, d, 1), (kv, d, 1), (kv, d, 1), (d, q, 1)];
    match a.moe.as_ref().filter(|_| a.has_experts(layer)) {
        Some(moe) => {
            let (n, e) = ((if active { moe.top_k } else { moe.n_experts }) as u64, moe.expert_hidden as u64);
            m.extend([(moe.n_experts as u64, d, 1), (e, d, n), (e, d, n), (d, e, n)]);
            // Qwen2-MoE's shared expert runs on every token, with its `[1, dim]` gate.
            if let Some(w) = moe.shared_expert_hidden.map(|w| w as u64) {
                m.extend([(w, d, 1), (w, d, 1), (d, w, 1), (1, d, 1)]);
            }
        }
        None => m.extend([(h, d, 1), (h, d, 1), (d, h, 1)]),
    }
    m
}

/// Values of the vectors of a layer as the architecture implies them: its RMSNorm weights
/// (two, four with sandwich norms), q/k norms, sinks, and q/k/v biases when `biases`.
fn arch_vector_params(a: &ModelArch, biases: bool) -> Result<u64, SizeOverflow> {
    let (d, q, kv, hd) = (a.dim as u64, (a.n_heads * a.head_dim()) as u64, a.kv_dim() as u64, a.head_dim() as u64);
    let what = "parameters per layer";
    let b = &a.block;
    let norms = if b.sandwich_norms { 4 } else { 2 };
    sum(
        what,
        &[
            product(what, &[norms, d])?,
            if b.qk_norm { product(what, &[2, hd])? } else { 0 },
            if b.sinks { a.n_heads as u64 } else { 0 },
            if biases { sum(what, &[q, kv, kv])? } else { 0 },
        ],
    )
}

/// Values of the vectors one layer holds: norms, biases, q/k norms, sinks, the router's and the
/// experts' biases.
fn held_vector_params(l: &LayerWeights) -> u64 {
    let n = |t: &Option<HostTensor>| t.as_ref().map_or(0, |t| t.data.len() as u64);
    let mlp = |m: &Mlp| n(&m.gate_bias) + n(&m.up_bias) + n(&m.down_bias);
    let own = [&l.bq, &l.bk, &l.bv, &l.bo, &l.q_norm, &l.k_norm, &l.sinks, &l.post_attn_norm, &l.post_ffn_norm];
    let ffn = match &l.ffn {
        Ffn::Dense(m) => mlp(m),
        Ffn::Experts(e) => n(&e.router_bias) + e.experts.iter().map(mlp).sum::<u64>(),
    };
    (l.attn_norm.data.len() + l.ffn_norm.data.len()) as u64 + own.iter().map(|t| n(t)).sum::<u64>() + ffn
}

/// `Σ count·rows·cols` of layer `layer`'s matrices.
fn layer_matmul_params(a: &ModelArch, layer: usize, active: bool) -> Result<u64, SizeOverflow> {
    let what = "parameters per layer";
    let sizes = layer_matrices(a, layer, active).into_iter().map(|(r, c, n)| product(what, &[r, c, n]));
    sum(what, &sizes.collect::<Result<Vec<_>, _>>()?)
}

/// The kinds of layers of an architecture: `(a layer of the kind, how many)`; one kind unless
/// some layers are dense and others have experts.
fn layer_kinds(a: &ModelArch) -> Vec<(usize, u64)> {
    let Some(moe) = &a.moe else { return vec![(0, a.n_layers as u64)] };
    let mut dense: Vec<usize> = moe.dense_layers.iter().copied().filter(|&l| l < a.n_layers).collect();
    dense.sort_unstable();
    dense.dedup();
    let n_dense = dense.len() as u64;
    let n_moe = a.n_layers as u64 - n_dense;
    let first_moe = (0..a.n_layers).find(|l| !dense.contains(l));
    let mut kinds = Vec::new();
    if let Some(l) = first_moe {
        kinds.push((l, n_moe));
    }
    if let Some(&l) = dense.first() {
        kinds.push((l, n_dense));
    }
    kinds.sort_unstable();
    kinds
}

/// The vectors of a layer of each kind: from the architecture, or from the loaded weights.
enum Vectors<'a> {
    Arch { biases: bool },
    Held(&'a [LayerWeights]),
}

impl Vectors<'_> {
    fn of(&self, a: &ModelArch, layer: usize) -> Result<u64, SizeOverflow> {
        match self {
            Vectors::Arch { biases } => arch_vector_params(a, *biases),
            Vectors::Held(layers) => match layers.get(layer) {
                Some(l) => Ok(held_vector_params(l)),
                None => arch_vector_params(a, false),
            },
        }
    }
}

/// Inspects an architecture. `source_dtypes` are `(tensor, dtype)` pairs of the source file
/// (may be empty), `biases` whether the layers carry q/k/v biases; weight memory is accounted
/// under each of `storages`, in that order.
///
/// # Errors
/// [`SizeOverflow`] when a figure does not fit in 64 bits (an absurd `seq_len` or `batch`, or an
/// architecture no file could hold).
pub fn inspect(
    arch: &ModelArch,
    source_dtypes: &[(String, String)],
    biases: bool,
    seq_len: usize,
    batch: usize,
    storages: &[&dyn WeightStorage],
) -> Result<Inspection, SizeOverflow> {
    inspect_with(arch, source_dtypes, biases, &Vectors::Arch { biases }, (seq_len, batch), storages)
}

/// [`inspect`] with the layers' vectors counted by `vectors`.
fn inspect_with(
    arch: &ModelArch,
    source_dtypes: &[(String, String)],
    biases: bool,
    vectors: &Vectors<'_>,
    (seq_len, batch): (usize, usize),
    storages: &[&dyn WeightStorage],
) -> Result<Inspection, SizeOverflow> {
    Ok(Inspection {
        architecture: arch.architecture.clone(),
        format: None,
        synthetic: false,
        arch: arch.clone(),
        biases,
        params: param_counts(arch, vectors)?,
        source_dtypes: dtype_counts(source_dtypes),
        source_storage: None,
        weight_bytes: storages.iter().map(|s| weight_bytes(arch, vectors, *s)).collect::<Result<_, _>>()?,
        kv_cache: kv_cache_bytes(arch, seq_len, batch)?,
        flops_per_token: flops_per_token(arch, seq_len)?,
    })
}

/// Inspects the model at `path` as `qdrift inspect` does: a `synthetic:NAME[:SEED]` preset from
/// its shape alone (no weights are made: `llama-8b` would need 32 GB), any other model opened
/// with [`open_model`] (and `tokenizer`, if given). `seq_len` defaults to the model's context.
///
/// # Errors
/// An unknown preset or a bad seed; [`open_model`]'s errors; [`LoadError::Overflow`] naming the
/// model, the figure and the `seq_len` (and where it came from) and `batch` it was computed for.
pub fn inspect_path(
    path: &Path,
    tokenizer: Option<&Path>,
    seq_len: Option<usize>,
    batch: usize,
    storages: &[&dyn WeightStorage],
) -> Result<Inspection, LoadError> {
    if let Some(spec) = path.to_str().and_then(|p| p.strip_prefix("synthetic:")) {
        let (name, _seed) = synthetic::parse_spec(spec)?;
        let arch = synthetic::preset_arch(name)?;
        let seq = seq_len.unwrap_or(arch.max_seq_len);
        let inspection = inspect(&arch, &[], false, seq, batch, storages)
            .map_err(|e| overflow_error(path, e, seq_len.is_some(), seq, batch))?;
        return Ok(inspection.with_format(ModelFormat::Synthetic));
    }
    let loaded = open_model(path, tokenizer)?;
    let seq = seq_len.unwrap_or(loaded.model.arch.max_seq_len);
    inspect_loaded(&loaded, seq, batch, storages).map_err(|e| overflow_error(path, e, seq_len.is_some(), seq, batch))
}

/// [`LoadError::Overflow`] for `path`, saying whether `seq` was asked for or is the model's own
/// context length (a file can declare 2^62).
fn overflow_error(path: &Path, e: SizeOverflow, seq_asked: bool, seq: usize, batch: usize) -> LoadError {
    let origin = if seq_asked { "as asked" } else { "the model's context length" };
    LoadError::Overflow {
        path: path.to_path_buf(),
        quantity: e.quantity.to_string(),
        inputs: format!("seq_len {seq} ({origin}), batch {batch}"),
    }
}

/// [`inspect`] of a loaded model, with its format, source dtypes, source storage (GGUF) and biases.
///
/// # Errors
/// [`SizeOverflow`] as [`inspect`].
pub fn inspect_loaded(
    m: &LoadedModel,
    seq_len: usize,
    batch: usize,
    storages: &[&dyn WeightStorage],
) -> Result<Inspection, SizeOverflow> {
    let biases = m.model.layers.iter().any(|l| l.bq.is_some() || l.bk.is_some() || l.bv.is_some());
    let vectors = Vectors::Held(&m.model.layers);
    let inspection = inspect_with(&m.model.arch, &m.source_dtypes, biases, &vectors, (seq_len, batch), storages)?;
    Ok(Inspection { source_storage: m.source_storage.clone(), ..inspection.with_format(m.format) })
}

impl Inspection {
    /// The same inspection, of a model read in `format` (which also sets `synthetic`).
    pub fn with_format(self, format: ModelFormat) -> Self {
        Inspection { format: Some(format), synthetic: format.is_synthetic(), ..self }
    }
}

/// Parameter counts (see the module docs).
fn param_counts(arch: &ModelArch, vectors: &Vectors<'_>) -> Result<ParamCounts, SizeOverflow> {
    let (d, v) = (arch.dim as u64, arch.vocab_size as u64);
    let what = "parameters";
    let layer = |l: usize| sum(what, &[layer_matmul_params(arch, l, false)?, vectors.of(arch, l)?]);
    let per_layer = layer(0)?;
    let kinds =
        layer_kinds(arch).into_iter().map(|(l, n)| product(what, &[layer(l)?, n])).collect::<Result<Vec<_>, _>>()?;
    let layers = sum(what, &kinds)?;
    let embedding = product(what, &[v, d])?;
    let head = if arch.tied_embeddings { 0 } else { embedding };
    Ok(ParamCounts {
        embedding,
        per_layer,
        layers,
        final_norm: d,
        head,
        total: sum(what, &[embedding, layers, d, head])?,
    })
}

/// Bytes of every weight under `storage`: the embedding, the layers' matrices and vectors, the
/// final norm and an untied head.
fn weight_bytes(
    arch: &ModelArch,
    vectors: &Vectors<'_>,
    storage: &dyn WeightStorage,
) -> Result<SchemeBytes, SizeOverflow> {
    let (d, v) = (arch.dim as u64, arch.vocab_size as u64);
    let what = "weight bytes";
    let vector = storage.vector_bytes();
    let layer = |l: usize| -> Result<u64, SizeOverflow> {
        let matrices = layer_matrices(arch, l, false)
            .into_iter()
            .map(|(r, c, n)| product(what, &[storage.matrix_bytes(r, c), n]))
            .collect::<Result<Vec<_>, _>>()?;
        sum(what, &[sum(what, &matrices)?, product(what, &[vector, vectors.of(arch, l)?])?])
    };
    let kinds =
        layer_kinds(arch).into_iter().map(|(l, n)| product(what, &[layer(l)?, n])).collect::<Result<Vec<_>, _>>()?;
    let embedding = storage.matrix_bytes(v, d);
    let head = if arch.tied_embeddings { 0 } else { embedding };
    let bytes = sum(what, &[embedding, sum(what, &kinds)?, product(what, &[vector, d])?, head])?;
    // `matrix_bytes` saturates where it would overflow.
    if bytes == u64::MAX {
        return Err(SizeOverflow { quantity: what });
    }
    Ok(SchemeBytes { scheme: storage.name(), bytes })
}

/// KV-cache bytes for `seq_len` positions of `batch` sequences.
fn kv_cache_bytes(arch: &ModelArch, seq_len: usize, batch: usize) -> Result<KvCacheBytes, SizeOverflow> {
    let (seq, b) = (seq_len as u64, batch as u64);
    let what = "KV-cache bytes";
    let entries = product(what, &[2, arch.n_layers as u64, arch.n_kv_heads as u64, arch.head_dim() as u64, seq, b])?;
    Ok(KvCacheBytes {
        seq_len: seq,
        batch: b,
        f32_bytes: product(what, &[4, entries])?,
        f16_bytes: product(what, &[2, entries])?,
    })
}

/// FLOPs of one generated token at context `seq_len` (see the module docs).
fn flops_per_token(arch: &ModelArch, seq_len: usize) -> Result<FlopsPerToken, SizeOverflow> {
    let (d, v, l) = (arch.dim as u64, arch.vocab_size as u64, arch.n_layers as u64);
    let what = "FLOPs per token";
    let layers = layer_kinds(arch)
        .into_iter()
        .map(|(k, n)| product(what, &[layer_matmul_params(arch, k, true)?, n]))
        .collect::<Result<Vec<_>, _>>()?;
    let params = sum(what, &[sum(what, &layers)?, product(what, &[v, d])?])?;
    let matmul = product(what, &[2, params])?;
    let attention = product(what, &[2, 2, l, arch.n_heads as u64, arch.head_dim() as u64, seq_len as u64])?;
    Ok(FlopsPerToken { context: seq_len as u64, matmul, attention, total: sum(what, &[matmul, attention])? })
}

/// Tensors per dtype, most frequent first (ties by name).
fn dtype_counts(source_dtypes: &[(String, String)]) -> Vec<DtypeCount> {
    crate::loaded::dtype_counts(source_dtypes)
        .into_iter()
        .map(|(dtype, tensors)| DtypeCount { dtype, tensors })
        .collect()
}

/// Bytes as MiB or GiB.
fn human_bytes(b: u64) -> String {
    let b = b as f64;
    if b >= 1024.0 * 1024.0 * 1024.0 {
        format!("{:.2} GiB", b / (1024.0 * 1024.0 * 1024.0))
    } else {
        format!("{:.2} MiB", b / (1024.0 * 1024.0))
    }
}

/// A mixture of experts in one line: `experts 8, top-2 (softmax, renormalised), expert FFN 32,
/// in 4 of 4 layers, shared expert 48`.
fn experts_line(moe: &qdrift_weights::MoeSpec, layers: usize) -> String {
    let routing = match moe.routing {
        qdrift_weights::Routing::SoftmaxTopK { renormalize: true } => "softmax over all, top-k renormalised",
        qdrift_weights::Routing::SoftmaxTopK { renormalize: false } => "softmax over all",
        qdrift_weights::Routing::TopKSoftmax => "softmax over the top-k",
        qdrift_weights::Routing::SigmoidInput => "sigmoid of the top-k, scaling each expert's input",
        qdrift_weights::Routing::GroupedSigmoid { .. } => "sigmoid, group-limited top-k with a selection bias",
    };
    let with_experts = layers.saturating_sub(moe.dense_layers.iter().filter(|&&l| l < layers).count());
    let shared = moe.shared_expert_hidden.map_or_else(String::new, |w| format!(", shared expert {w}"));
    format!(
        "experts {}, top-{} ({routing}), expert FFN {}, in {with_experts} of {layers} layers{shared}",
        moe.n_experts, moe.top_k, moe.expert_hidden
    )
}

impl fmt::Display for Inspection {
    /// The model, its parameters, weight memory, KV cache and FLOPs, one section after another.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fmt_model(f)?;
        self.fmt_params(f)?;
        self.fmt_memory(f)?;
        self.fmt_flops(f)
    }
}

impl Inspection {
    /// Architecture, format, synthetic warning and the hyper-parameters.
    fn fmt_model(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let a = &self.arch;
        write!(f, "{}", self.architecture)?;
        if let Some(format) = self.format {
            write!(f, " ({format})")?;
        }
        if self.synthetic {
            write!(f, " [SYNTHETIC random weights: quality numbers are meaningless]")?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "  layers {}, dim {}, hidden {}, heads {}/{} (head_dim {}), vocab {}, context {}, {}",
            a.n_layers,
            a.dim,
            a.hidden_dim,
            a.n_heads,
            a.n_kv_heads,
            a.head_dim(),
            a.vocab_size,
            a.max_seq_len,
            if a.tied_embeddings { "tied embedding" } else { "untied head" }
        )?;
        if let Some(moe) = &a.moe {
            writeln!(f, "  {}", experts_line(moe, a.n_layers))?;
        }
        Ok(())
    }

    /// Parameter counts and the source file's dtypes.
    fn fmt_params(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.params;
        let n = self.arch.n_layers;
        // Layers differ (Qwen3-MoE's dense ones): their sum, and the first.
        let layers = if (n as u64).checked_mul(p.per_layer) == Some(p.layers) {
            format!("{n} × layer {}", grouped(p.per_layer))
        } else {
            format!("{n} layers {} (the first {})", grouped(p.layers), grouped(p.per_layer))
        };
        writeln!(
            f,
            "parameters {} = embedding {} + {layers} + final norm {} + head {}{}",
            grouped(p.total),
            grouped(p.embedding),
            grouped(p.final_norm),
            grouped(p.head),
            if self.biases { " (layers include q/k/v biases)" } else { "" }
        )?;
        if !self.source_dtypes.is_empty() {
            let list: Vec<String> = self.source_dtypes.iter().map(|c| format!("{} × {}", c.tensors, c.dtype)).collect();
            writeln!(f, "source tensors: {}", list.join(", "))?;
        }
        if let Some(storage) = &self.source_storage {
            write!(f, "{storage}")?;
        }
        Ok(())
    }

    /// Weight memory per storage format and the KV cache.
    fn fmt_memory(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.weight_bytes.is_empty() {
            writeln!(f, "weight memory:")?;
        }
        for s in &self.weight_bytes {
            writeln!(f, "  {:<16} {:>16} B  {}", s.scheme, grouped(s.bytes), human_bytes(s.bytes))?;
        }
        let k = &self.kv_cache;
        writeln!(
            f,
            "KV cache (seq {} × batch {}): f32 {} B ({}), f16 {} B ({})",
            k.seq_len,
            k.batch,
            grouped(k.f32_bytes),
            human_bytes(k.f32_bytes),
            grouped(k.f16_bytes),
            human_bytes(k.f16_bytes)
        )
    }

    /// FLOPs per generated token.
    fn fmt_flops(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.flops_per_token;
        write!(
            f,
            "FLOPs per generated token at context {}: {} = matmul {} + attention {}",
            t.context,
            grouped(t.total),
            grouped(t.matmul),
            grouped(t.attention)
        )
    }
}
