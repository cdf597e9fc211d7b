//! The variants compared with the reference: from what the user asks for ([`VariantSpec`], in
//! `check/config.rs`) to the weights, precision and report description each one runs with
//! ([`BuiltVariant`], whose model is built part by part from the FP16 reference's weight source).
//!
//! **Invariant: every variant starts from the FP16 reference's weights (schemes, noise floor) or
//! is a checkpoint refused before the run unless it is a quantization of the reference
//! ([`crate::check::compat`]: same architecture, shapes and tokenizer; another architecture only with
//! `--allow-different-model`, named in the report), so that its positions can be compared with
//! the reference's one by one.**

use std::path::Path;

use burn::tensor::DType;
use qdrift_generate::ComputeDevice;
use std::sync::Arc;

use qdrift_load::{ActivationFormat, ActivationGranularity, CheckpointActivations, WeightSource};
use qdrift_model::Llama;
use qdrift_quantize::{
    ActivationQuant, ActivationScale, DynamicFormat, Fp8Format, Mxfp4Rule, QuantizeOptions, QuantizedSource, Recipe,
    Scheme,
};
use qdrift_report::{FileHash, RecipeParts, TensorError, VariantKind};

use crate::check::compat::CheckedCheckpoint;
use crate::check::config::{VariantSpec, check_activation_widths, other_precision};
use crate::error::EvalError;
use crate::inputs::identity::{model_identity_file, report_name};
use crate::types::{VariantHeader, dtype_name};

/// What variants need of the reference once its host weights are given up: its parameter count
/// (checkpoints were checked against the rest of it before the run, `crate::check::compat`).
pub(crate) struct ReferenceIdentity {
    /// [`qdrift_load::HostModel::parameter_count`] of its weights.
    pub parameters: usize,
}

/// The weights a variant's model is built from.
pub(crate) enum VariantWeights {
    /// The FP16 reference's own (the noise floor).
    Reference,
    /// The FP16 reference's through the recipe's weight scheme, quantized tensor by tensor as
    /// the model is built ([`QuantizedSource`]).
    Scheme,
    /// Its own (a checkpoint's), read part by part as its model is built.
    Own(Arc<dyn WeightSource>),
}

/// A variant ready to run: its weights and precision, and how the report describes it.
pub(crate) struct BuiltVariant {
    /// Its name in the report ([`VariantSpec::name`]; unique among the variants).
    pub name: String,
    /// The scheme's name, for scheme variants.
    pub scheme: Option<String>,
    /// The recipe, for scheme variants (its activation and KV-cache parts run with the model).
    pub recipe: Option<Recipe>,
    /// For a quantized Hugging Face checkpoint: its stored weight format and the dynamic
    /// activation rounding its config declares (run with the model, as a recipe's).
    pub checkpoint_quant: Option<(String, Option<ActivationQuant>)>,
    /// The checkpoint's file or folder name, for checkpoint variants.
    pub path: Option<String>,
    /// The checkpoint's SHA-256 ([`checkpoint_hash`]).
    pub sha256: Option<String>,
    /// A checkpoint folder's files and their SHA-256.
    pub files: Vec<FileHash>,
    /// Noise floor, scheme or checkpoint.
    pub kind: VariantKind,
    /// Its compute precision.
    pub dtype: DType,
    /// Its weights.
    pub host: VariantWeights,
    /// Storage bits per parameter.
    pub bits_per_weight: f64,
    /// For a checkpoint that is not a quantization of the reference, accepted by
    /// `--allow-different-model`: the first difference ([`crate::check::compat`]).
    pub different_model: Option<String>,
    /// Storage bytes of its weights.
    pub weight_bytes: u64,
    /// Per-tensor quantization error (schemes only).
    pub per_tensor_error: Vec<TensorError>,
    /// For NVFP4 activations: the prompts its static global input scales were calibrated on.
    pub calibration_prompts: Option<usize>,
    /// For a W4A4 NVFP4 checkpoint: its stored static global input scales, per layer and
    /// `qdrift_model::InputSite` ([`qdrift_load::CheckpointQuant::input_scales`]), set on its
    /// model instead of calibrating.
    pub stored_input_scales: Option<Vec<[f32; 4]>>,
}

/// Describes the variant `spec` of the reference; its model is built by
/// [`BuiltVariant::build_model`].
///
/// `checkpoint` is a checkpoint variant's model, opened and checked against the reference before
/// the run ([`crate::check::compat::open_variants`]). `dtype` is the reference's compute precision.
pub(crate) fn build_variant(
    spec: &VariantSpec,
    reference: &ReferenceIdentity,
    checkpoint: Option<CheckedCheckpoint>,
    dtype: DType,
) -> Result<BuiltVariant, EvalError> {
    let name = spec.name(dtype);
    match (spec, checkpoint) {
        (VariantSpec::NoiseFloor, _) => Ok(noise_floor(name, reference, other_precision(dtype))),
        (VariantSpec::Scheme(recipe), _) => Ok(scheme_variant(name, recipe, dtype)),
        (VariantSpec::Checkpoint { path, .. }, Some(checked)) => {
            checkpoint_variant(name, reference, path, checked, dtype)
        }
        (VariantSpec::Checkpoint { .. }, None) => {
            Err(EvalError::Internal(format!("checkpoint variant {name} was not opened before the run")))
        }
    }
}

fn noise_floor(name: String, reference: &ReferenceIdentity, dtype: DType) -> BuiltVariant {
    BuiltVariant {
        name,
        scheme: None,
        recipe: None,
        checkpoint_quant: None,
        path: None,
        sha256: None,
        files: Vec::new(),
        kind: VariantKind::NoiseFloor,
        dtype,
        host: VariantWeights::Reference,
        bits_per_weight: 16.0,
        different_model: None,
        weight_bytes: reference.parameters as u64 * 2,
        per_tensor_error: Vec::new(),
        calibration_prompts: None,
        stored_input_scales: None,
    }
}

/// A scheme variant; its storage and per-tensor errors are known once its model is built.
fn scheme_variant(name: String, recipe: &Recipe, dtype: DType) -> BuiltVariant {
    BuiltVariant {
        name,
        scheme: Some(recipe.to_string()),
        recipe: Some(*recipe),
        checkpoint_quant: None,
        path: None,
        sha256: None,
        files: Vec::new(),
        kind: VariantKind::Scheme,
        dtype,
        host: VariantWeights::Scheme,
        bits_per_weight: 0.0,
        different_model: None,
        weight_bytes: 0,
        per_tensor_error: Vec::new(),
        calibration_prompts: None,
        stored_input_scales: None,
    }
}

fn checkpoint_variant(
    name: String,
    reference: &ReferenceIdentity,
    path: &Path,
    checked: CheckedCheckpoint,
    dtype: DType,
) -> Result<BuiltVariant, EvalError> {
    let CheckedCheckpoint { model: other, different_model, hash: (sha256, files) } = checked;
    let checkpoint_quant =
        other.quantization.as_ref().map(|q| (q.weights.clone(), q.activations.map(activation_quant)));
    let stored_input_scales = other.quantization.as_ref().and_then(|q| q.input_scales.clone());
    if let Some(declared) = other.quantization.as_ref().and_then(|q| q.activations) {
        check_activation_widths(activation_quant(declared), other.model.arch()).map_err(|e| EvalError::Variant {
            variant: path.display().to_string(),
            problem: format!("its quantization_config declares {declared} activations: {e}"),
        })?;
    }
    // The bytes its tensors take as stored (GGUF, safetensors); a llama2.c file is all weights
    // but for its 28-byte header, so its size stands for them.
    // `bits_per_weight` is then over the values the file stores, as `qdrift inspect` and
    // llama.cpp give a file's.
    let (bytes, bits_per_weight) = match &other.source_storage {
        Some(storage) => (storage.bytes, storage.bits_per_weight),
        None => {
            let identity = model_identity_file(path);
            let bytes = std::fs::metadata(&identity).map_err(EvalError::io(&identity))?.len();
            (bytes, qdrift_load::inspect::bits_per_weight(bytes, reference.parameters as u64))
        }
    };
    Ok(BuiltVariant {
        name,
        scheme: None,
        recipe: None,
        checkpoint_quant,
        path: Some(report_name(path)),
        sha256: Some(sha256),
        files,
        kind: VariantKind::Checkpoint,
        dtype,
        host: VariantWeights::Own(other.model),
        bits_per_weight,
        different_model,
        weight_bytes: bytes,
        per_tensor_error: Vec::new(),
        calibration_prompts: None,
        stored_input_scales,
    })
}

impl BuiltVariant {
    /// Builds its model on `device` from `reference` (the FP16 reference's weights, handed out
    /// part by part) or from its own weights, with the recipe's run-time roundings; a scheme's
    /// tensors are quantized as they pass, and its storage and per-tensor errors filled in.
    pub fn build_model(
        &mut self,
        reference: &dyn WeightSource,
        quantize: &QuantizeOptions,
        device: &ComputeDevice,
    ) -> Result<Llama, EvalError> {
        let mut model = match std::mem::replace(&mut self.host, VariantWeights::Reference) {
            VariantWeights::Reference => device.build_model(reference, self.dtype)?,
            VariantWeights::Scheme => {
                let recipe =
                    self.recipe.ok_or_else(|| EvalError::Internal("a scheme variant without its recipe".into()))?;
                let source = QuantizedSource::new(reference, recipe.weights, *quantize);
                let model = device.build_model(&source, self.dtype)?;
                let summary = source.summary();
                // Tensors the scheme leaves alone count at FP16 (`QuantSummary::weight_bytes`).
                self.bits_per_weight = summary.model_bits_per_weight;
                self.weight_bytes = summary.weight_bytes;
                self.per_tensor_error = source
                    .reports()
                    .into_iter()
                    .map(|r| TensorError {
                        tensor: r.tensor,
                        sqnr_db: r.sqnr_db,
                        rel_frobenius: r.rel_frobenius,
                        cosine: r.cosine,
                    })
                    .collect();
                model
            }
            VariantWeights::Own(source) => device.build_model(&*source, self.dtype)?,
        };
        self.apply_runtime(&mut model)?;
        Ok(model)
    }

    /// Its entry in the report, without the statistics of its traces.
    pub fn header(&self) -> VariantHeader {
        VariantHeader {
            recipe: self.recipe_parts(),
            name: self.name.clone(),
            scheme: self.scheme.clone(),
            path: self.path.clone(),
            sha256: self.sha256.clone(),
            files: self.files.clone(),
            kind: self.kind,
            compute_dtype: dtype_name(self.dtype).to_string(),
            bits_per_weight: self.bits_per_weight,
            weight_bytes: self.weight_bytes,
            per_tensor_error: self.per_tensor_error.clone(),
            failure: None,
            different_model: self.different_model.clone(),
        }
    }

    /// The recipe's parts as `report.json` records them; for a quantized checkpoint, its weight
    /// format and declared activation rounding.
    pub fn recipe_parts(&self) -> Option<RecipeParts> {
        if let Some((weights, activations)) = &self.checkpoint_quant {
            // NVFP4 activations run with the checkpoint's stored global input scales: said here,
            // where a recipe's calibrated ones give `calibration_prompts`.
            let stored = if self.stored_input_scales.is_some() { " (checkpoint input scales)" } else { "" };
            return Some(RecipeParts {
                weights: weights.clone(),
                activations: activations.map(|a| format!("{a}{stored}")),
                kv_cache: None,
                calibration_prompts: None,
            });
        }
        self.recipe.map(|r| RecipeParts {
            weights: r.weights.to_string(),
            activations: r.activations.map(|a| a.to_string()),
            kv_cache: r.kv_cache.map(|k| k.to_string()),
            calibration_prompts: self.calibration_prompts,
        })
    }

    /// Whether its run-time roundings need static global input scales calibrated on the
    /// reference (NVFP4 activations: compressed-tensors' `input_global_scale`).
    pub fn needs_calibration(&self) -> bool {
        self.recipe.and_then(|r| r.activations).is_some_and(|a| a.format == DynamicFormat::Nvfp4)
    }

    /// Gives `model` (built from this variant's weights) the recipe's run-time roundings, and a
    /// W4A4 NVFP4 checkpoint's stored global input scales.
    ///
    /// # Errors
    /// A KV-cache format that does not fit the model (checked earlier by
    /// [`VariantSpec::check_fits`]).
    pub fn apply_runtime(&self, model: &mut Llama) -> Result<(), EvalError> {
        if let Some(recipe) = &self.recipe {
            model.apply_runtime(recipe)?;
        }
        if let Some((_, Some(activations))) = &self.checkpoint_quant {
            // Only the activation part is read; the weights are the checkpoint's own.
            let recipe = Recipe { weights: Scheme::Fp16, activations: Some(*activations), kv_cache: None };
            model.apply_runtime(&recipe)?;
        }
        if let Some(scales) = &self.stored_input_scales {
            model.set_global_input_scales(scales.clone());
        }
        Ok(())
    }
}

/// The run-time rounding of a checkpoint's declared activation quantization: NVFP4 per 16
/// (under the checkpoint's stored global input scales) or MXFP4 per 32 (compressed-tensors'
/// scale rule, what its `MXFP4` preset and vLLM's emulation run), or int8 or FP8, per token, per tensor (`ActivationScale::Tensor` is vLLM's dynamic per-tensor scale, one
/// per sequence's prompt pass then one per token), or per token and group of `G` inputs (block
/// FP8 checkpoints: `G` is the config's own group, `weight_block_size[1]` or compressed-tensors'
/// `group_size`, read, never assumed 128). A group that does not divide a linear layer's input
/// width is refused by [`check_activation_widths`] when the variant is built, before it runs.
fn activation_quant(a: CheckpointActivations) -> ActivationQuant {
    let format = match a.format {
        ActivationFormat::Int8 => DynamicFormat::Int8,
        ActivationFormat::Fp8E4M3 => DynamicFormat::Fp8(Fp8Format::E4M3),
        ActivationFormat::Fp8E5M2 => DynamicFormat::Fp8(Fp8Format::E5M2),
        ActivationFormat::Nvfp4 => DynamicFormat::Nvfp4,
        ActivationFormat::Mxfp4 => DynamicFormat::Mxfp4(Mxfp4Rule::CompressedTensors),
    };
    let scale = match a.granularity {
        ActivationGranularity::Token => ActivationScale::Token,
        ActivationGranularity::Tensor => ActivationScale::Tensor,
        ActivationGranularity::TokenGroup(g) => ActivationScale::TokenGroup(g),
    };
    ActivationQuant { format, scale }
}
