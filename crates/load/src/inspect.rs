//! Resource accounting for `qdrift inspect`: parameter counts, weight memory per storage scheme,
//! KV-cache memory and FLOPs per generated token, from the architecture alone (no weights needed,
//! so [`crate::synthetic_arch`] shapes of any size can be inspected).
//!
//! Definitions (`d` = dim, `h` = hidden_dim, `q` = n_heads·head_dim, `kv` = n_kv_heads·head_dim,
//! `V` = vocab_size, `L` = n_layers):
//! - **Matrices**: the token embedding `[V, d]`; per layer `wq [q, d]`, `wk [kv, d]`,
//!   `wv [kv, d]`, `wo [d, q]`, `w_gate [h, d]`, `w_up [h, d]`, `w_down [d, h]`; the output head
//!   `[V, d]` only when untied (a tied head is the embedding, counted once).
//! - **Vectors**: two RMSNorm weights `[d]` per layer, the final norm `[d]`, and q/k/v biases
//!   (`q + 2·kv` per layer) where the model has them.
//! - **Weight bytes** for a scheme = Σ over matrices of the scheme's bytes for a `[rows, cols]`
//!   matrix + the vectors at 4 bytes (FP32) or 2 bytes (every other scheme; norms are kept in
//!   FP16). Per matrix of `n = rows·cols` values:
//!   - FP32: `4n`; FP16 / BF16: `2n`;
//!   - INT8: `n` + one f32 scale per row: `n + 4·rows`;
//!   - FP8 (E4M3/E5M2): `n` + one f32 scale per tensor: `n + 4`;
//!   - INT4, group size `g` (32 or 128) along the row, groups never straddle rows, one FP16 scale
//!     per group: `rows·⌈cols/2⌉ + 2·rows·⌈cols/g⌉`.
//! - **KV cache** = `2 (K and V) · L · n_kv_heads · head_dim · bytes · seq_len · batch`.
//! - **FLOPs per generated token** ≈ `2 · (matmul parameters)` + `2 · 2 · L · n_heads · head_dim
//!   · context`, where the matmul parameters are the layers' seven linears plus the head
//!   (`V·d`, also when tied: the embedding is then multiplied as the head; the embedding lookup
//!   itself is free), and the attention term counts `q·kᵀ` and `p·v` over `context` positions.
//!   Norms, RoPE, softmax and SwiGLU's elementwise work are left out (< 1% at these sizes).

use std::fmt;

use serde::Serialize;

use crate::{LlamaArch, LoadedModel};

/// Parameter counts, a tied embedding counted once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ParamCounts {
    /// Token embedding, `V·d`.
    pub embedding: u64,
    /// One block: 7 linears, 2 norms, biases if any.
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

/// Weight memory under one storage scheme.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SchemeBytes {
    /// `fp32`, `fp16`, `int8-row`, `fp8`, `int4-g32`, `int4-g128`.
    pub scheme: &'static str,
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
    pub format: Option<String>,
    /// Whether the weights are synthetic (random).
    pub synthetic: bool,
    /// The hyper-parameters.
    pub arch: LlamaArch,
    /// Whether the layers have q/k/v biases (counted in the parameters).
    pub biases: bool,
    /// Parameter counts.
    pub params: ParamCounts,
    /// Source tensors per dtype, most frequent first.
    pub source_dtypes: Vec<DtypeCount>,
    /// Weight memory per scheme.
    pub weight_bytes: Vec<SchemeBytes>,
    /// KV cache for `seq_len` × `batch`.
    pub kv_cache: KvCacheBytes,
    /// FLOPs per generated token at context `seq_len`.
    pub flops_per_token: FlopsPerToken,
}

/// Storage schemes reported, in order.
const SCHEMES: [&str; 6] = ["fp32", "fp16", "int8-row", "fp8", "int4-g32", "int4-g128"];

/// Bytes of a `[rows, cols]` matrix under `scheme` (see the module docs).
pub fn matrix_bytes(scheme: &str, rows: u64, cols: u64) -> u64 {
    let n = rows * cols;
    match scheme {
        "fp32" => 4 * n,
        "int8-row" => n + 4 * rows,
        "fp8" => n + 4,
        "int4-g32" => rows * cols.div_ceil(2) + 2 * rows * cols.div_ceil(32),
        "int4-g128" => rows * cols.div_ceil(2) + 2 * rows * cols.div_ceil(128),
        _ => 2 * n,
    }
}

/// The `[rows, cols]` of every matrix of one layer.
fn layer_matrices(a: &LlamaArch) -> [(u64, u64); 7] {
    let (d, h) = (a.dim as u64, a.hidden_dim as u64);
    let (q, kv) = ((a.n_heads * a.head_dim()) as u64, a.kv_dim() as u64);
    [(q, d), (kv, d), (kv, d), (d, q), (h, d), (h, d), (d, h)]
}

/// Inspects an architecture. `source_dtypes` are `(tensor, dtype)` pairs of the source file
/// (may be empty), `biases` whether the layers carry q/k/v biases.
pub fn inspect(
    arch: &LlamaArch,
    source_dtypes: &[(String, String)],
    biases: bool,
    seq_len: usize,
    batch: usize,
) -> Inspection {
    let (d, v, l) = (arch.dim as u64, arch.vocab_size as u64, arch.n_layers as u64);
    let (q, kv) = ((arch.n_heads * arch.head_dim()) as u64, arch.kv_dim() as u64);
    let linears: u64 = layer_matrices(arch).iter().map(|(r, c)| r * c).sum();
    let bias_params = if biases { q + 2 * kv } else { 0 };
    let layer_vectors = 2 * d + bias_params;
    let per_layer = linears + layer_vectors;
    let embedding = v * d;
    let head = if arch.tied_embeddings { 0 } else { v * d };
    let params = ParamCounts {
        embedding,
        per_layer,
        layers: l * per_layer,
        final_norm: d,
        head,
        total: embedding + l * per_layer + d + head,
    };

    let weight_bytes = SCHEMES
        .iter()
        .map(|&scheme| {
            let vector_bytes = if scheme == "fp32" { 4 } else { 2 };
            let layer: u64 = layer_matrices(arch).iter().map(|&(r, c)| matrix_bytes(scheme, r, c)).sum::<u64>()
                + vector_bytes * layer_vectors;
            let head = if arch.tied_embeddings { 0 } else { matrix_bytes(scheme, v, d) };
            SchemeBytes { scheme, bytes: matrix_bytes(scheme, v, d) + l * layer + vector_bytes * d + head }
        })
        .collect();

    let (seq, b) = (seq_len as u64, batch as u64);
    let kv_entries = 2 * l * arch.n_kv_heads as u64 * arch.head_dim() as u64 * seq * b;
    let kv_cache = KvCacheBytes { seq_len: seq, batch: b, f32_bytes: 4 * kv_entries, f16_bytes: 2 * kv_entries };

    let matmul = 2 * (l * linears + v * d);
    let attention = 2 * 2 * l * arch.n_heads as u64 * arch.head_dim() as u64 * seq;
    let flops_per_token = FlopsPerToken { context: seq, matmul, attention, total: matmul + attention };

    let mut counts: Vec<DtypeCount> = Vec::new();
    for (_, dtype) in source_dtypes {
        match counts.iter_mut().find(|c| &c.dtype == dtype) {
            Some(c) => c.tensors += 1,
            None => counts.push(DtypeCount { dtype: dtype.clone(), tensors: 1 }),
        }
    }
    counts.sort_by(|a, b| b.tensors.cmp(&a.tensors).then_with(|| a.dtype.cmp(&b.dtype)));

    Inspection {
        architecture: arch.architecture.clone(),
        format: None,
        synthetic: false,
        arch: arch.clone(),
        biases,
        params,
        source_dtypes: counts,
        weight_bytes,
        kv_cache,
        flops_per_token,
    }
}

/// [`inspect`] of a loaded model, with its format, synthetic flag, source dtypes and biases.
pub fn inspect_loaded(m: &LoadedModel, seq_len: usize, batch: usize) -> Inspection {
    let biases = m.model.layers.iter().any(|l| l.bq.is_some() || l.bk.is_some() || l.bv.is_some());
    let mut i = inspect(&m.model.arch, &m.source_dtypes, biases, seq_len, batch);
    i.format = Some(m.format.to_string());
    i.synthetic = m.synthetic;
    i
}

/// `1234567` → `1,234,567`.
fn grouped(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
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

impl fmt::Display for Inspection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let a = &self.arch;
        write!(f, "{}", self.architecture)?;
        if let Some(format) = &self.format {
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
        let p = &self.params;
        writeln!(
            f,
            "parameters {} = embedding {} + {} × layer {} + final norm {} + head {}{}",
            grouped(p.total),
            grouped(p.embedding),
            a.n_layers,
            grouped(p.per_layer),
            grouped(p.final_norm),
            grouped(p.head),
            if self.biases { " (layers include q/k/v biases)" } else { "" }
        )?;
        if !self.source_dtypes.is_empty() {
            let list: Vec<String> = self.source_dtypes.iter().map(|c| format!("{} × {}", c.tensors, c.dtype)).collect();
            writeln!(f, "source tensors: {}", list.join(", "))?;
        }
        writeln!(f, "weight memory:")?;
        for s in &self.weight_bytes {
            writeln!(f, "  {:<10} {:>16} B  {}", s.scheme, grouped(s.bytes), human_bytes(s.bytes))?;
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
        )?;
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
