//! Weight-only quantization of a whole [`HostModel`].
//!
//! The seven linear weights of every block are always quantized; the token embedding and an
//! untied output head only when [`QuantizeOptions`] asks for them, because most deployed
//! quantizations keep them at higher precision and because they dominate the size of small
//! models. RMSNorm weights are never quantized.
//!
//! Every quantized tensor is dequantized back to f32 into a clone of the reference
//! ([`QuantizedModel::dequantized`]), which is what the generate stage runs: the variant's
//! logits then differ from the reference's only through the quantization of its weights. The
//! packed matrices are kept too, for [`crate::write_safetensors`] and for exact storage
//! accounting.

use qdrift_weights::{HostModel, HostTensor, LinearName};
use serde::Serialize;

use qdrift_codecs::{ErrorStats, QuantizeError, QuantizedMatrix, Scheme, quantize, try_error_stats};

/// Which tensors beyond the blocks' linear layers to quantize. The default quantizes neither.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct QuantizeOptions {
    /// Quantize the token embedding `[vocab, dim]` (groups run along `dim`). When the output
    /// head is tied to the embedding, the head follows: it *is* the embedding.
    pub quantize_embeddings: bool,
    /// Quantize an untied output head `[vocab, dim]`. Ignored for a tied head, which always
    /// follows the embedding (see `quantize_embeddings`).
    pub quantize_head: bool,
    /// Quantize the routers of a mixture of experts (`mlp.gate`, `[n_experts, dim]`). By default
    /// a router stays at reference precision, as llm-compressor's recipes and vLLM leave it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub quantize_router: bool,
}

/// Where a quantized tensor lives in the [`HostModel`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightSlot {
    /// `token_embedding` (and the tied head, when tied).
    TokenEmbedding,
    /// The untied `output` head.
    OutputHead,
    /// A linear weight of block `layer`, named by its Hugging Face short name
    /// (`self_attn.q_proj`, ..., `mlp.down_proj`, as [`qdrift_load::LayerWeights::linears`]).
    Linear {
        /// Block index.
        layer: usize,
        /// Hugging Face short name.
        short_name: LinearName,
    },
    /// A router of block `layer`'s mixture of experts, with `quantize_router`: `mlp.gate`, or a
    /// shared expert's `mlp.shared_expert_gate` ([`qdrift_load::LayerWeights::routers_mut`]).
    Router {
        /// Block index.
        layer: usize,
        /// Its name within the block (`mlp.gate`, `mlp.shared_expert_gate`).
        name: &'static str,
    },
}

impl WeightSlot {
    /// The Hugging Face Llama name of the weight (`model.embed_tokens.weight`,
    /// `lm_head.weight`, `model.layers.{i}.self_attn.q_proj.weight`, ...).
    pub fn hf_name(&self) -> String {
        match self {
            WeightSlot::TokenEmbedding => "model.embed_tokens.weight".to_owned(),
            WeightSlot::OutputHead => "lm_head.weight".to_owned(),
            WeightSlot::Linear { layer, short_name } => {
                format!("model.layers.{layer}.{short_name}.weight")
            }
            WeightSlot::Router { layer, name } => format!("model.layers.{layer}.{name}.weight"),
        }
    }
}

/// One quantized weight matrix of a model, with its error against the reference.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizedTensor {
    /// Where it lives in the model.
    pub slot: WeightSlot,
    /// Hugging Face name, e.g. `model.layers.0.self_attn.q_proj.weight`.
    pub name: String,
    /// `[rows, cols]` = `[out_features, in_features]` (`[vocab, dim]` for embedding and head).
    /// q/k rows are in the interleaved RoPE layout of [`HostModel`].
    pub shape: [usize; 2],
    /// The packed storage.
    pub matrix: QuantizedMatrix,
    /// Error of the dequantized values against the reference.
    pub stats: ErrorStats,
    /// `Σ ref²` in f64, for aggregating SQNR over tensors.
    pub signal_energy: f64,
    /// `Σ (ref − dequantized)²` in f64, for aggregating SQNR over tensors.
    pub noise_energy: f64,
}

impl QuantizedTensor {
    /// The row of a per-tensor report.
    pub fn report(&self) -> TensorReport {
        TensorReport {
            tensor: self.name.clone(),
            shape: self.shape.to_vec(),
            sqnr_db: sqnr_or_exact(self.stats.sqnr_db),
            rel_frobenius: self.stats.rel_frobenius,
            cosine: self.stats.cosine,
            bits_per_weight: self.matrix.bits_per_weight(),
            storage_bytes: self.matrix.storage_bytes(),
            stored: self.matrix.stored_name(),
            fell_back: self.matrix.fell_back(),
        }
    }
}

/// One row of the per-tensor quantization report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TensorReport {
    /// Hugging Face name of the tensor.
    pub tensor: String,
    /// `[rows, cols]`.
    pub shape: Vec<usize>,
    /// SQNR in dB; `None` when the tensor is reproduced exactly (+∞ dB), since JSON has no
    /// infinity. (−∞ would need an all-zero reference with a non-zero approximation; every
    /// codec here maps an all-zero group to zeros.)
    pub sqnr_db: Option<f64>,
    /// `‖ref − approx‖ / ‖ref‖`.
    pub rel_frobenius: f64,
    /// Cosine similarity of the dequantized tensor to the reference.
    pub cosine: f64,
    /// Stored bits per weight (codes, scales and zero points).
    pub bits_per_weight: f64,
    /// Stored bytes.
    pub storage_bytes: usize,
    /// What is stored: the scheme, or for a GGML scheme the type actually stored (its own, its
    /// llama.cpp fallback `q5_0`/`q8_0`, or `f16`).
    pub stored: String,
    /// True when a GGML scheme stored another type than its own (rows not a whole number of its
    /// blocks; see `stored`).
    pub fell_back: bool,
}

/// Totals over the quantized tensors of a model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QuantSummary {
    /// The scheme's CLI name.
    pub scheme: String,
    /// Number of quantized tensors (a tied embedding/head counts once).
    pub quantized_tensors: usize,
    /// Number of quantized weights.
    pub quantized_weights: usize,
    /// Stored bytes of the quantized tensors.
    pub storage_bytes: usize,
    /// `storage_bytes · 8 / quantized_weights`; 0 when nothing was quantized.
    pub bits_per_weight: f64,
    /// Bytes of the whole model's weights as the variant holds them: the quantized tensors as
    /// stored and every other weight at FP16, as the reference holds it.
    pub weight_bytes: u64,
    /// The model's bits per weight, [`qdrift_load::inspect::bits_per_weight`]`(weight_bytes,
    /// parameters)`: the figure `report.json` gives the variant.
    pub model_bits_per_weight: f64,
    /// Aggregate SQNR over all quantized elements, `10·log10(Σ ref² / Σ err²)` dB; `None` when
    /// every quantized tensor is exact (+∞ dB) or nothing was quantized.
    pub sqnr_db: Option<f64>,
    /// Names of the tensors a GGML scheme stored as another type (see
    /// [`TensorReport::fell_back`]).
    pub fell_back: Vec<String>,
}

/// A model whose weights went through a scheme: the dequantized model to run and, per
/// quantized tensor, its packed form and error.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizedModel {
    /// The scheme applied.
    pub scheme: Scheme,
    /// Which optional tensors were quantized.
    pub options: QuantizeOptions,
    /// The reference with every quantized tensor replaced by its dequantized f32 values; a tied
    /// head stays tied (`output: None`).
    pub dequantized: HostModel,
    /// The quantized tensors: the embedding first (when quantized), then block by block in
    /// [`qdrift_load::LayerWeights::linears`] order, then the untied head (when quantized).
    pub tensors: Vec<QuantizedTensor>,
}

impl QuantizedModel {
    /// The quantized tensor at `slot`, if that tensor was quantized.
    pub fn tensor(&self, slot: WeightSlot) -> Option<&QuantizedTensor> {
        self.tensors.iter().find(|t| t.slot == slot)
    }

    /// One report row per quantized tensor, in [`QuantizedModel::tensors`] order.
    pub fn reports(&self) -> Vec<TensorReport> {
        self.tensors.iter().map(QuantizedTensor::report).collect()
    }

    /// Totals over the quantized tensors.
    pub fn summary(&self) -> QuantSummary {
        let tallies: Vec<TensorTally> = self.tensors.iter().map(QuantizedTensor::tally).collect();
        summarize(&self.scheme, &tallies, self.dequantized.parameter_count())
    }
}

/// What a model's totals need of one quantized tensor, without its codes: its report row and
/// the energies its SQNR aggregates.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TensorTally {
    /// Its report row (name, shape, stored bytes, fallback).
    pub report: TensorReport,
    /// `Σ ref²`.
    pub signal_energy: f64,
    /// `Σ (ref − dequantized)²`.
    pub noise_energy: f64,
}

impl QuantizedTensor {
    /// Its [`TensorTally`].
    pub(crate) fn tally(&self) -> TensorTally {
        TensorTally { report: self.report(), signal_energy: self.signal_energy, noise_energy: self.noise_energy }
    }
}

/// The totals of `tallies`, the quantized tensors of a model of `parameters` weights.
pub(crate) fn summarize(scheme: &Scheme, tallies: &[TensorTally], parameters: usize) -> QuantSummary {
    let quantized_weights: usize = tallies.iter().map(|t| t.report.shape.iter().product::<usize>()).sum();
    let storage_bytes: usize = tallies.iter().map(|t| t.report.storage_bytes).sum();
    let signal: f64 = tallies.iter().map(|t| t.signal_energy).sum();
    let noise: f64 = tallies.iter().map(|t| t.noise_energy).sum();
    let weight_bytes = storage_bytes as u64 + (parameters as u64).saturating_sub(quantized_weights as u64) * 2;
    QuantSummary {
        scheme: scheme.to_string(),
        quantized_tensors: tallies.len(),
        quantized_weights,
        storage_bytes,
        bits_per_weight: if quantized_weights == 0 {
            0.0
        } else {
            storage_bytes as f64 * 8.0 / quantized_weights as f64
        },
        weight_bytes,
        model_bits_per_weight: qdrift_load::inspect::bits_per_weight(weight_bytes, parameters as u64),
        sqnr_db: if noise == 0.0 { None } else { Some(10.0 * (signal / noise).log10()) },
        fell_back: tallies.iter().filter(|t| t.report.fell_back).map(|t| t.report.tensor.clone()).collect(),
    }
}

/// Quantizes the weights of `reference` with `scheme` (weight-only; activations stay f32).
///
/// Always: the linear weights of every block ([`qdrift_load::LayerWeights::linears`]: attention,
/// the dense FFN or every expert). With `quantize_embeddings`: the token embedding, and with it a
/// tied head. With `quantize_head`: an untied head only. With `quantize_router`: each mixture of
/// experts' router.
///
/// # Shapes
/// - linear weights: `[out_features, in_features]`; embedding and head: `[vocab, dim]`. Groups
///   and blocks run along the last dimension.
///
/// # Errors
/// [`QuantizeError::NotAMatrix`] when a tensor to quantize is not 2-D or its data does not match
/// its shape; [`QuantizeError::InTensor`] naming the tensor when its codec fails (non-finite
/// weight, FP16 scale overflow, ...).
pub fn quantize_model(
    reference: &HostModel,
    scheme: &Scheme,
    opts: &QuantizeOptions,
) -> Result<QuantizedModel, QuantizeError> {
    quantize_model_owned(reference.clone(), scheme, opts)
}

/// [`quantize_model`] on a model the caller gives up: each tensor's values are replaced by their
/// dequantized values in place, so the peak is the model plus one tensor (and the codes), not two
/// models. The result is the same as [`quantize_model`]'s.
///
/// # Errors
/// As [`quantize_model`].
pub fn quantize_model_owned(
    mut model: HostModel,
    scheme: &Scheme,
    opts: &QuantizeOptions,
) -> Result<QuantizedModel, QuantizeError> {
    let mut tensors = Vec::new();
    let mut replace = |slot: WeightSlot, t: &mut HostTensor| -> Result<(), QuantizeError> {
        let (tensor, values) = quantize_tensor(scheme, slot, t)?;
        t.data = values;
        tensors.push(tensor);
        Ok(())
    };
    if opts.quantize_embeddings {
        replace(WeightSlot::TokenEmbedding, &mut model.token_embedding)?;
    }
    for (layer, weights) in model.layers.iter_mut().enumerate() {
        for (short_name, weight) in weights.linears_mut() {
            replace(WeightSlot::Linear { layer, short_name }, weight)?;
        }
        if opts.quantize_router {
            for (name, router) in weights.routers_mut() {
                replace(WeightSlot::Router { layer, name }, router)?;
            }
        }
    }
    if opts.quantize_head
        && let Some(head) = &mut model.output
    {
        replace(WeightSlot::OutputHead, head)?;
    }
    Ok(QuantizedModel { scheme: *scheme, options: *opts, dequantized: model, tensors })
}

/// Quantizes one model tensor and returns it with its dequantized values.
///
/// # Shapes
/// - `weight`: `[rows, cols]`; returned values: `rows * cols`, row-major.
pub(crate) fn quantize_tensor(
    scheme: &Scheme,
    slot: WeightSlot,
    weight: &HostTensor,
) -> Result<(QuantizedTensor, Vec<f32>), QuantizeError> {
    let name = slot.hf_name();
    let [rows, cols] = matrix_shape(&name, weight)?;
    let matrix = quantize(scheme, &weight.data, rows, cols)
        .map_err(|e| QuantizeError::InTensor { tensor: name.clone(), source: Box::new(e) })?;
    let values = matrix.dequantize();
    let stats = try_error_stats(&weight.data, &values)
        .map_err(|e| QuantizeError::InTensor { tensor: name.clone(), source: Box::new(e) })?;
    let (mut signal_energy, mut noise_energy) = (0.0f64, 0.0f64);
    for (&r, &a) in weight.data.iter().zip(&values) {
        let (r, a) = (f64::from(r), f64::from(a));
        signal_energy += r * r;
        noise_energy += (r - a) * (r - a);
    }
    let tensor = QuantizedTensor { slot, name, shape: [rows, cols], matrix, stats, signal_energy, noise_energy };
    Ok((tensor, values))
}

/// `[rows, cols]` of a tensor that must be a 2-D matrix whose data matches its shape.
pub(crate) fn matrix_shape(name: &str, t: &HostTensor) -> Result<[usize; 2], QuantizeError> {
    match t.shape[..] {
        [rows, cols] if rows.checked_mul(cols) == Some(t.data.len()) => Ok([rows, cols]),
        _ => Err(QuantizeError::NotAMatrix { tensor: name.to_owned(), shape: t.shape.clone(), len: t.data.len() }),
    }
}

/// `+inf` (exact) as `None`, anything else as is.
fn sqnr_or_exact(sqnr_db: f64) -> Option<f64> {
    (sqnr_db != f64::INFINITY).then_some(sqnr_db)
}
