//! What every reader returns: a [`LoadedModel`] (weights, tokenizer, and what the source file
//! says about itself: its [`ModelFormat`], stored dtypes and sizes, chat template, and, for a
//! quantized checkpoint, its [`CheckpointQuant`]).

use std::path::{Path, PathBuf};

use crate::LoadError;
use crate::storage::SourceStorage;
use crate::tokenizer::Tokenizer;
use qdrift_weights::{HostModel, HostTensor, LayerWeights, ModelArch, SourceError, WeightSource};

/// A model and its tokenizer, ready for the later stages.
///
/// `W` is how the weights are held: a whole [`HostModel`] ([`crate::open_model`]), or a
/// [`qdrift_weights::WeightSource`] that hands them out part by part ([`crate::open_source`]).
pub struct LoadedModel<W = HostModel> {
    /// Weights and architecture.
    pub model: W,
    /// The tokenizer that goes with it.
    pub tokenizer: Box<dyn Tokenizer>,
    /// The checkpoint file (the folder for a Hugging Face model, `synthetic:NAME` for a
    /// synthetic one).
    pub path: PathBuf,
    /// The tokenizer file (the checkpoint itself for GGUF's embedded tokenizer).
    pub tokenizer_path: PathBuf,
    /// The format the model was read from.
    pub format: ModelFormat,
    /// Every tensor of the source file with its stored dtype (`F32`, `BF16`, `Q4_1`, ...), in
    /// file order; for reports ([`crate::inspect`]). The weights in [`LoadedModel::model`] are
    /// f32 whatever the source dtype.
    pub source_dtypes: Vec<(String, String)>,
    /// The source file's stored bytes per tensor type and bits per weight, for `qdrift inspect`
    /// (GGUF files and Hugging Face folders; `None` for llama2.c and synthetic models).
    pub source_storage: Option<SourceStorage>,
    /// The chat template (Jinja) the checkpoint ships, if any (GGUF `tokenizer.chat_template`,
    /// `tokenizer_config.json` `chat_template`).
    pub chat_template: Option<String>,
    /// How a quantized Hugging Face folder stored its weights, and the dynamic activation
    /// quantization it declares (`None` for unquantized checkpoints and other formats). The
    /// weights in [`LoadedModel::model`] are already dequantized.
    pub quantization: Option<CheckpointQuant>,
    /// What the reader read differently from the checkpoint's own description, one line each, for
    /// the CLI to print (a multimodal wrapper read as its language model).
    pub notes: Vec<String>,
}

impl<W> LoadedModel<W> {
    /// The same model with its weights held another way.
    ///
    /// # Errors
    /// `f`'s.
    pub fn try_map_model<V, E>(self, f: impl FnOnce(W) -> Result<V, E>) -> Result<LoadedModel<V>, E> {
        let LoadedModel {
            model,
            tokenizer,
            path,
            tokenizer_path,
            format,
            source_dtypes,
            source_storage,
            chat_template,
            quantization,
            notes,
        } = self;
        Ok(LoadedModel {
            model: f(model)?,
            tokenizer,
            path,
            tokenizer_path,
            format,
            source_dtypes,
            source_storage,
            chat_template,
            quantization,
            notes,
        })
    }

    /// The dtype the checkpoint stores its tensors in, as a report names it: `bf16`, `f16`,
    /// `f32`, or for a file that mixes them (GGUF's quantized weights beside f32 norms) each, the
    /// most frequent first (`q4_1 + f32`). Lowercase, as `--dtype` names dtypes; empty when the
    /// loader lists no tensors.
    pub fn stored_dtype(&self) -> String {
        let counts = dtype_counts(&self.source_dtypes);
        counts.iter().map(|(dtype, _)| dtype.to_lowercase()).collect::<Vec<_>>().join(" + ")
    }
}

/// One part of a model as a checkpoint reader hands the parts out, in the order a model is
/// built ([`qdrift_weights::WeightSource`]'s): the embedding, each block with its index, the
/// final norm, the output layer (`None`: tied).
pub(crate) enum ModelPart {
    Embedding(HostTensor),
    Layer(usize, Box<LayerWeights>),
    FinalNorm(HostTensor),
    Output(Option<HostTensor>),
}

impl ModelPart {
    /// The values it holds.
    pub(crate) fn parameter_count(&self) -> usize {
        match self {
            Self::Embedding(t) | Self::FinalNorm(t) | Self::Output(Some(t)) => t.data.len(),
            Self::Layer(_, l) => l.parameter_count(),
            Self::Output(None) => 0,
        }
    }
}

/// A checkpoint whose parts are read from its files one at a time ([`PartSource`]), each part
/// with positioned reads into buffers of its own ([`qdrift_io::PinnedFile`]): a file changed or
/// cut short since it was opened is an error naming it.
pub(crate) trait PartFile: Send + Sync {
    /// The architecture the parts follow.
    fn arch(&self) -> &ModelArch;
    /// The token embedding, `[vocab, dim]`.
    fn embedding(&self) -> Result<HostTensor, LoadError>;
    /// Block `i`, below `arch().n_layers`.
    fn layer(&self, i: usize) -> Result<LayerWeights, LoadError>;
    /// The final norm, `[dim]`.
    fn final_norm(&self) -> Result<HostTensor, LoadError>;
    /// The output layer, `[vocab, dim]`; `None` when tied.
    fn output(&self) -> Result<Option<HostTensor>, LoadError>;
}

/// A [`PartFile`] as a [`WeightSource`]: each part read from the files when asked and nothing
/// kept between requests, so that building a model holds no more of the checkpoint than the
/// part it is reading (its bytes are read into buffers that live while it is decoded).
pub(crate) struct PartSource<F> {
    pub(crate) file: F,
    /// [`HostModel::parameter_count`] of the whole model, counted when the file was opened.
    pub(crate) parameters: usize,
}

impl<F: PartFile> PartSource<F> {
    /// `read(file)`, its error boxed.
    fn part<T>(&self, read: impl FnOnce(&F) -> Result<T, LoadError>) -> Result<T, SourceError> {
        read(&self.file).map_err(|e| Box::new(e) as SourceError)
    }
}

impl<F: PartFile> WeightSource for PartSource<F> {
    fn arch(&self) -> &ModelArch {
        self.file.arch()
    }

    fn parameter_count(&self) -> usize {
        self.parameters
    }

    fn token_embedding(&self) -> Result<HostTensor, SourceError> {
        self.part(F::embedding)
    }

    fn layer(&self, index: usize) -> Result<LayerWeights, SourceError> {
        let layers = self.file.arch().n_layers;
        if index >= layers {
            return Err(format!("no block {index}: the model has {layers}").into());
        }
        self.part(|f| f.layer(index))
    }

    fn final_norm(&self) -> Result<HostTensor, SourceError> {
        self.part(F::final_norm)
    }

    fn output(&self) -> Result<Option<HostTensor>, SourceError> {
        self.part(F::output)
    }
}

/// The whole model of architecture `arch` from the parts `read` hands out in build order; the
/// model is tied exactly when no output layer came (a GGUF file without `output.weight`; a
/// Hugging Face folder's `config.json` says which, and its reader refuses an untied one without
/// `lm_head`).
pub(crate) fn gather_parts(
    arch: ModelArch,
    read: impl FnOnce(&mut dyn FnMut(ModelPart)) -> Result<(), LoadError>,
) -> Result<HostModel, LoadError> {
    let empty = || HostTensor { shape: Vec::new(), data: Vec::new() };
    let mut model = HostModel { arch, token_embedding: empty(), layers: Vec::new(), final_norm: empty(), output: None };
    read(&mut |part| match part {
        ModelPart::Embedding(t) => model.token_embedding = t,
        ModelPart::Layer(_, l) => model.layers.push(*l),
        ModelPart::FinalNorm(t) => model.final_norm = t,
        ModelPart::Output(o) => {
            model.arch.tied_embeddings = o.is_none();
            model.output = o;
        }
    })?;
    Ok(model)
}

/// `(dtype, tensors)` of a [`LoadedModel::source_dtypes`] list, most frequent first (ties by
/// name).
pub(crate) fn dtype_counts(source_dtypes: &[(String, String)]) -> Vec<(String, usize)> {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for (_, dtype) in source_dtypes {
        match counts.iter_mut().find(|(d, _)| d == dtype) {
            Some((_, n)) => *n += 1,
            None => counts.push((dtype.clone(), 1)),
        }
    }
    counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    counts
}

/// The format a [`LoadedModel`] was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ModelFormat {
    /// A llama2.c legacy checkpoint ([`crate::read_llama2c_checkpoint`]).
    Llama2c,
    /// A GGUF file ([`crate::read_gguf`]).
    Gguf,
    /// A Hugging Face folder with safetensors weights ([`crate::read_hf_folder`]).
    HfSafetensors,
    /// Seeded random weights of a preset shape ([`crate::synthetic_model`]).
    Synthetic,
}

impl ModelFormat {
    /// The name reports and `qdrift inspect` give the format: `llama2.c`, `gguf`,
    /// `hf-safetensors` or `synthetic`.
    pub fn name(self) -> &'static str {
        match self {
            ModelFormat::Llama2c => "llama2.c",
            ModelFormat::Gguf => "gguf",
            ModelFormat::HfSafetensors => "hf-safetensors",
            ModelFormat::Synthetic => "synthetic",
        }
    }

    /// True for seeded random weights: numbers measured on such a model say nothing about a
    /// trained one, and reports must say so.
    pub fn is_synthetic(self) -> bool {
        self == ModelFormat::Synthetic
    }
}

impl std::fmt::Display for ModelFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl serde::Serialize for ModelFormat {
    /// As its [`ModelFormat::name`].
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

/// How a quantized checkpoint was stored, for reports and for the run-time roundings that come
/// with it.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointQuant {
    /// A short description of the weight format: `gptq 4-bit g128 v1`, `awq 4-bit g128`,
    /// `compressed-tensors pack-quantized int4 group 128`, `fp8 e4m3 block 128x128`.
    pub weights: String,
    /// The checkpoint's activation quantization, if it declares one.
    pub activations: Option<CheckpointActivations>,
    /// For NVFP4 activations (W4A4): the stored static global input scales, per layer, per
    /// input site (q/k/v input, o input, gate/up input, down input: `qdrift_model::InputSite`'s
    /// order), in compressed-tensors' direction (`x / g` is quantized, `g = 448·6/amax`); linear
    /// layers sharing an input share the scale as vLLM fuses them (see `hf/quant/mod.rs`).
    pub input_scales: Option<Vec<[f32; 4]>>,
}

/// A checkpoint's dynamic quantization of the inputs of its linear layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointActivations {
    /// The number format.
    pub format: ActivationFormat,
    /// One scale per what.
    pub granularity: ActivationGranularity,
}

/// The number format of dynamically quantized activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActivationFormat {
    /// Symmetric int8.
    Int8,
    /// OCP FP8 E4M3.
    Fp8E4M3,
    /// OCP FP8 E5M2.
    Fp8E5M2,
    /// NVFP4: E2M1 per block of 16 with E4M3 block scales under a static global input scale
    /// ([`CheckpointQuant::input_scales`]).
    Nvfp4,
    /// MXFP4 (compressed-tensors' rule): E2M1 per block of 32 with E8M0 scales, dynamic.
    Mxfp4,
}

/// Which values share one dynamic activation scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActivationGranularity {
    /// One scale per token.
    Token,
    /// One scale per tensor.
    Tensor,
    /// One scale per token and group of this many inputs (block FP8 checkpoints).
    TokenGroup(usize),
}

impl std::fmt::Display for CheckpointActivations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let format = match self.format {
            ActivationFormat::Int8 => "int8",
            ActivationFormat::Fp8E4M3 => "fp8-e4m3",
            ActivationFormat::Fp8E5M2 => "fp8-e5m2",
            ActivationFormat::Nvfp4 => "nvfp4",
            ActivationFormat::Mxfp4 => "mxfp4",
        };
        match self.granularity {
            ActivationGranularity::Token => write!(f, "{format} per token"),
            ActivationGranularity::Tensor => write!(f, "{format} per tensor"),
            ActivationGranularity::TokenGroup(g) => write!(f, "{format} per token per group of {g}"),
        }
    }
}

/// [`LoadError::VocabMismatch`] unless the tokenizer has exactly the model's vocabulary size.
pub(crate) fn check_vocab(
    tok: &dyn Tokenizer,
    tokenizer_path: &Path,
    arch: &ModelArch,
    model_path: &Path,
) -> Result<(), LoadError> {
    if tok.vocab_size() != arch.vocab_size {
        return Err(LoadError::VocabMismatch {
            tokenizer: tokenizer_path.to_path_buf(),
            tokenizer_vocab: tok.vocab_size(),
            model: model_path.to_path_buf(),
            model_vocab: arch.vocab_size,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_stored_dtype_names_each_dtype_most_frequent_first() {
        let mut m = crate::synthetic_source("tiny", 1).expect("tiny");
        assert_eq!(m.stored_dtype(), "f32");
        let names = ["blk.0.attn_q.weight", "blk.0.attn_norm.weight", "token_embd.weight", "blk.0.ffn_up.weight"];
        let dtypes = ["Q4_1", "F32", "Q4_1", "Q4_1"];
        m.source_dtypes = names.iter().zip(dtypes).map(|(n, d)| (n.to_string(), d.to_string())).collect();
        assert_eq!(m.stored_dtype(), "q4_1 + f32");
        m.source_dtypes.clear();
        assert_eq!(m.stored_dtype(), "");
    }
}
