//! Weights handed out part by part: [`WeightSource`], implemented by [`HostModel`] (clones) and
//! [`HeldModel`] (a whole model held at 16 bits where its values allow), and by `qdrift-load`'s
//! and `qdrift-quantize`'s generating and transforming sources.

use crate::{HostModel, HostTensor, LayerWeights, ModelArch};

/// What a [`WeightSource`] returns when it cannot hand out a part: the reader's own error
/// (`qdrift-load`'s names the file and the tensor), boxed because this crate knows no formats.
pub type SourceError = Box<dyn std::error::Error + Send + Sync>;

/// A model's weights handed out one part at a time, in [`HostModel`]'s layout: what a Burn model
/// is built from, so that no stage need hold a whole model's f32 weights at once.
///
/// A part may be asked for several times (a tied output layer is the embedding; an evaluation
/// builds the reference more than once) and must then be the same values. Implementations:
/// [`HostModel`] (clones of its tensors), `qdrift-load`'s readers (a synthetic model generates a
/// block when asked; a Hugging Face folder or a GGUF file reads it from the mapped file; a
/// llama2.c checkpoint holds its weights at 16 bits), `qdrift-quantize`'s wrappers (the FP16
/// reference, a scheme's dequantized weights, each part as it passes).
pub trait WeightSource: Send + Sync {
    /// The architecture the parts follow.
    fn arch(&self) -> &ModelArch;

    /// [`HostModel::parameter_count`] of the whole model, without building it.
    fn parameter_count(&self) -> usize;

    /// The token embedding, `[vocab_size, dim]`.
    ///
    /// # Errors
    /// The reader's, naming the file and tensor.
    fn token_embedding(&self) -> Result<HostTensor, SourceError>;

    /// Block `index` (`0..arch().n_layers`).
    ///
    /// # Errors
    /// The reader's, naming the file and tensor; an index past the last block.
    fn layer(&self, index: usize) -> Result<LayerWeights, SourceError>;

    /// The final RMSNorm weight, `[dim]`.
    ///
    /// # Errors
    /// The reader's.
    fn final_norm(&self) -> Result<HostTensor, SourceError>;

    /// The untied output layer, `[vocab_size, dim]`; `None` when tied to the embedding (then
    /// [`WeightSource::token_embedding`] is the output layer).
    ///
    /// # Errors
    /// The reader's.
    fn output(&self) -> Result<Option<HostTensor>, SourceError>;
}

impl WeightSource for HostModel {
    fn arch(&self) -> &ModelArch {
        &self.arch
    }

    fn parameter_count(&self) -> usize {
        HostModel::parameter_count(self)
    }

    fn token_embedding(&self) -> Result<HostTensor, SourceError> {
        Ok(self.token_embedding.clone())
    }

    fn layer(&self, index: usize) -> Result<LayerWeights, SourceError> {
        self.layers
            .get(index)
            .cloned()
            .ok_or_else(|| format!("no block {index}: the model has {}", self.layers.len()).into())
    }

    fn final_norm(&self) -> Result<HostTensor, SourceError> {
        Ok(self.final_norm.clone())
    }

    fn output(&self) -> Result<Option<HostTensor>, SourceError> {
        Ok(self.output.clone())
    }
}

impl HostModel {
    /// Every part of `source`, gathered: the whole model in host memory (tests, writers and
    /// other consumers of a whole model).
    ///
    /// # Errors
    /// The first part the source fails to hand out.
    pub fn from_source(source: &dyn WeightSource) -> Result<HostModel, SourceError> {
        let arch = source.arch().clone();
        let token_embedding = source.token_embedding()?;
        let layers = (0..arch.n_layers).map(|i| source.layer(i)).collect::<Result<Vec<_>, _>>()?;
        let final_norm = source.final_norm()?;
        let output = source.output()?;
        Ok(HostModel { arch, token_embedding, layers, final_norm, output })
    }
}

/// One tensor's values held in the narrowest of f16, bf16 and f32 that gives every value exactly.
#[derive(Debug, Clone, PartialEq)]
enum Held {
    F16(Vec<half::f16>),
    Bf16(Vec<half::bf16>),
    F32(Vec<f32>),
}

impl Held {
    /// `values` held exactly: as f16 when every value is one (an FP16 checkpoint, the FP16
    /// reference), else as bf16 when every value is one (a BF16 checkpoint), else as f32.
    fn exact(values: Vec<f32>) -> Held {
        use half::slice::HalfFloatSliceExt;
        let mut f16 = vec![half::f16::ZERO; values.len()];
        f16.convert_from_f32_slice(&values);
        if f16.iter().zip(&values).all(|(h, v)| h.to_f32().to_bits() == v.to_bits()) {
            return Held::F16(f16);
        }
        drop(f16);
        let mut bf16 = vec![half::bf16::ZERO; values.len()];
        bf16.convert_from_f32_slice(&values);
        if bf16.iter().zip(&values).all(|(h, v)| h.to_f32().to_bits() == v.to_bits()) {
            return Held::Bf16(bf16);
        }
        Held::F32(values)
    }

    fn values(&self) -> Vec<f32> {
        use half::slice::HalfFloatSliceExt;
        match self {
            Held::F16(h) => h.to_f32_vec(),
            Held::Bf16(h) => h.to_f32_vec(),
            Held::F32(v) => v.clone(),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Held::F16(h) => 2 * h.len(),
            Held::Bf16(h) => 2 * h.len(),
            Held::F32(v) => 4 * v.len(),
        }
    }
}

/// A tensor's shape and its held values.
#[derive(Debug, Clone, PartialEq)]
struct HeldTensor {
    shape: Vec<usize>,
    values: Held,
}

impl HeldTensor {
    fn new(t: HostTensor) -> HeldTensor {
        HeldTensor { shape: t.shape, values: Held::exact(t.data) }
    }

    fn tensor(&self) -> HostTensor {
        HostTensor { shape: self.shape.clone(), data: self.values.values() }
    }
}

/// A block held compactly: its tensors' shapes (a [`LayerWeights`] whose tensors hold no values)
/// and their values in [`LayerWeights::for_each_tensor_mut`] order.
#[derive(Debug, Clone, PartialEq)]
struct HeldLayer {
    shapes: LayerWeights,
    values: Vec<Held>,
}

/// A whole model in host memory at 16 bits where its values allow: each tensor as f16 when all
/// its values are f16 values, else bf16 when they are bf16 values, else f32, so that every part
/// it hands out ([`WeightSource`]) is exactly the [`HostModel`]'s it was made from, at half the
/// memory for an FP16 or BF16 checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct HeldModel {
    arch: ModelArch,
    parameters: usize,
    token_embedding: HeldTensor,
    layers: Vec<HeldLayer>,
    final_norm: HeldTensor,
    output: Option<HeldTensor>,
}

impl HeldModel {
    /// `model` held compactly, each block converted as it is taken from `model` (the peak is
    /// `model` plus one block's held values).
    pub fn new(model: HostModel) -> HeldModel {
        let parameters = model.parameter_count();
        let HostModel { arch, token_embedding, layers, final_norm, output } = model;
        let token_embedding = HeldTensor::new(token_embedding);
        let layers = layers
            .into_iter()
            .map(|mut shapes| {
                let mut values = Vec::new();
                shapes.for_each_tensor_mut(|t| values.push(Held::exact(std::mem::take(&mut t.data))));
                HeldLayer { shapes, values }
            })
            .collect();
        HeldModel {
            arch,
            parameters,
            token_embedding,
            layers,
            final_norm: HeldTensor::new(final_norm),
            output: output.map(HeldTensor::new),
        }
    }

    /// Bytes its values take.
    pub fn bytes(&self) -> usize {
        let layers: usize = self.layers.iter().flat_map(|l| &l.values).map(Held::bytes).sum();
        self.token_embedding.values.bytes()
            + layers
            + self.final_norm.values.bytes()
            + self.output.as_ref().map_or(0, |o| o.values.bytes())
    }
}

impl WeightSource for HeldModel {
    fn arch(&self) -> &ModelArch {
        &self.arch
    }

    fn parameter_count(&self) -> usize {
        self.parameters
    }

    fn token_embedding(&self) -> Result<HostTensor, SourceError> {
        Ok(self.token_embedding.tensor())
    }

    fn layer(&self, index: usize) -> Result<LayerWeights, SourceError> {
        let held =
            self.layers.get(index).ok_or_else(|| format!("no block {index}: the model has {}", self.layers.len()))?;
        let mut layer = held.shapes.clone();
        let mut values = held.values.iter();
        let mut missing = false;
        layer.for_each_tensor_mut(|t| match values.next() {
            Some(v) => t.data = v.values(),
            None => missing = true,
        });
        if missing {
            return Err(format!("block {index} holds fewer tensors than its shape").into());
        }
        Ok(layer)
    }

    fn final_norm(&self) -> Result<HostTensor, SourceError> {
        Ok(self.final_norm.tensor())
    }

    fn output(&self) -> Result<Option<HostTensor>, SourceError> {
        Ok(self.output.as_ref().map(HeldTensor::tensor))
    }
}

/// A shared source is the source.
impl<T: WeightSource + ?Sized> WeightSource for std::sync::Arc<T> {
    fn arch(&self) -> &ModelArch {
        (**self).arch()
    }

    fn parameter_count(&self) -> usize {
        (**self).parameter_count()
    }

    fn token_embedding(&self) -> Result<HostTensor, SourceError> {
        (**self).token_embedding()
    }

    fn layer(&self, index: usize) -> Result<LayerWeights, SourceError> {
        (**self).layer(index)
    }

    fn final_norm(&self) -> Result<HostTensor, SourceError> {
        (**self).final_norm()
    }

    fn output(&self) -> Result<Option<HostTensor>, SourceError> {
        (**self).output()
    }
}

#[cfg(test)]
mod held_tests {
    use super::*;

    fn tensor(data: Vec<f32>) -> HostTensor {
        HostTensor { shape: vec![data.len()], data }
    }

    #[test]
    fn each_tensor_is_held_in_the_narrowest_exact_format() {
        let f16 = vec![1.0, -0.0, 65504.0, 6.1035156e-5, 0.333_251_95];
        // bf16 values beyond f16's range or precision.
        let bf16: Vec<f32> = [1.0, 1.0e30, -3.0e-20, 0.333_984_38].map(|v| half::bf16::from_f32(v).to_f32()).to_vec();
        let f32 = vec![1.0, 0.1, 1.0e30];
        for (values, bytes) in [(f16, 2), (bf16, 2), (f32, 4)] {
            let held = Held::exact(values.clone());
            assert_eq!(held.bytes(), bytes * values.len());
            let back = held.values();
            assert!(back.iter().zip(&values).all(|(a, b)| a.to_bits() == b.to_bits()), "{values:?} → {back:?}");
        }
        assert!(matches!(Held::exact(vec![0.333_251_95]), Held::F16(_)));
        assert!(matches!(Held::exact(vec![half::bf16::from_f32(1.0e30).to_f32()]), Held::Bf16(_)));
        let t = HeldTensor::new(tensor(vec![1.5, 2.0]));
        assert_eq!(t.tensor(), tensor(vec![1.5, 2.0]));
    }
}
