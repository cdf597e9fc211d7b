//! Weight sources that transform another source's parts as they pass, so that a model is built
//! tensor by tensor and never held as a whole host copy: [`Reference`] (the reference: every
//! tensor rounded to FP16 or bf16, as [`crate::round_to_reference`] rounds a whole model) and
//! [`QuantizedSource`] (a scheme's dequantized weights, as [`crate::quantize_model`] gives them,
//! with the same per-tensor statistics gathered as the tensors pass).
//!
//! **Invariant: a part handed out here has exactly the values the whole-model function gives
//! that part (tested); a part asked for twice is the same values and is counted once.**

use std::collections::BTreeMap;
use std::sync::Mutex;

use qdrift_weights::{HostTensor, LayerWeights, ModelArch, SourceError, WeightSource};

use crate::model::{QuantSummary, QuantizeOptions, TensorReport, TensorTally, WeightSlot, quantize_tensor, summarize};
use crate::reference::{ReferenceFormat, round_tensor};
use qdrift_codecs::Scheme;

/// The reference of a source: every part rounded to `format` (round-to-nearest-even).
pub struct Reference<'a> {
    /// The checkpoint's weights.
    pub source: &'a dyn WeightSource,
    /// The 16-bit format they are rounded to.
    pub format: ReferenceFormat,
}

impl Reference<'_> {
    fn round(&self, mut t: HostTensor) -> HostTensor {
        round_tensor(&mut t, self.format);
        t
    }
}

impl WeightSource for Reference<'_> {
    fn arch(&self) -> &ModelArch {
        self.source.arch()
    }

    fn parameter_count(&self) -> usize {
        self.source.parameter_count()
    }

    fn token_embedding(&self) -> Result<HostTensor, SourceError> {
        Ok(self.round(self.source.token_embedding()?))
    }

    fn layer(&self, index: usize) -> Result<LayerWeights, SourceError> {
        let mut l = self.source.layer(index)?;
        l.for_each_tensor_mut(|t| round_tensor(t, self.format));
        Ok(l)
    }

    fn final_norm(&self) -> Result<HostTensor, SourceError> {
        Ok(self.round(self.source.final_norm()?))
    }

    fn output(&self) -> Result<Option<HostTensor>, SourceError> {
        Ok(self.source.output()?.map(|t| self.round(t)))
    }
}

/// A source's weights through `scheme`: the tensors [`crate::quantize_model`] quantizes (every
/// block's linear weights; the embedding, an untied head and the routers as
/// [`QuantizeOptions`] says) replaced by their dequantized values as they pass, everything else
/// as the source gives it. Each quantized tensor's report row is kept (not its codes), for
/// [`QuantizedSource::summary`] and [`QuantizedSource::reports`] once the model is built.
pub struct QuantizedSource<'a> {
    inner: &'a dyn WeightSource,
    scheme: Scheme,
    options: QuantizeOptions,
    /// Keyed by place in [`crate::QuantizedModel::tensors`]' order: (0 embedding, 1 blocks,
    /// 2 head; block; index within the block).
    tallies: Mutex<BTreeMap<(u8, usize, usize), TensorTally>>,
}

impl<'a> QuantizedSource<'a> {
    /// `inner`'s weights (normally a [`Reference`]) through `scheme`.
    pub fn new(inner: &'a dyn WeightSource, scheme: Scheme, options: QuantizeOptions) -> Self {
        Self { inner, scheme, options, tallies: Mutex::new(BTreeMap::new()) }
    }

    /// Quantizes `t` (at `slot`, filed under `key`) and replaces its values.
    fn replace(&self, key: (u8, usize, usize), slot: WeightSlot, t: &mut HostTensor) -> Result<(), SourceError> {
        let (tensor, values) = quantize_tensor(&self.scheme, slot, t)?;
        t.data = values;
        let tally = tensor.tally();
        self.tallies.lock().map_err(|_| "a quantizing thread panicked")?.insert(key, tally);
        Ok(())
    }

    /// The tallies of the tensors quantized so far, in [`crate::QuantizedModel::tensors`] order.
    fn tallies(&self) -> Vec<TensorTally> {
        self.tallies.lock().map(|t| t.values().cloned().collect()).unwrap_or_default()
    }

    /// [`crate::QuantizedModel::summary`] of the tensors handed out so far (the whole model once
    /// a model has been built from this source).
    pub fn summary(&self) -> QuantSummary {
        summarize(&self.scheme, &self.tallies(), self.inner.parameter_count())
    }

    /// [`crate::QuantizedModel::reports`] of the tensors handed out so far.
    pub fn reports(&self) -> Vec<TensorReport> {
        self.tallies().into_iter().map(|t| t.report).collect()
    }
}

impl WeightSource for QuantizedSource<'_> {
    fn arch(&self) -> &ModelArch {
        self.inner.arch()
    }

    fn parameter_count(&self) -> usize {
        self.inner.parameter_count()
    }

    fn token_embedding(&self) -> Result<HostTensor, SourceError> {
        let mut t = self.inner.token_embedding()?;
        if self.options.quantize_embeddings {
            self.replace((0, 0, 0), WeightSlot::TokenEmbedding, &mut t)?;
        }
        Ok(t)
    }

    fn layer(&self, layer: usize) -> Result<LayerWeights, SourceError> {
        let mut l = self.inner.layer(layer)?;
        let mut k = 0;
        for (short_name, weight) in l.linears_mut() {
            self.replace((1, layer, k), WeightSlot::Linear { layer, short_name }, weight)?;
            k += 1;
        }
        if self.options.quantize_router {
            for (name, router) in l.routers_mut() {
                self.replace((1, layer, k), WeightSlot::Router { layer, name }, router)?;
                k += 1;
            }
        }
        Ok(l)
    }

    fn final_norm(&self) -> Result<HostTensor, SourceError> {
        self.inner.final_norm()
    }

    fn output(&self) -> Result<Option<HostTensor>, SourceError> {
        let mut t = self.inner.output()?;
        if self.options.quantize_head
            && let Some(head) = &mut t
        {
            self.replace((2, 0, 0), WeightSlot::OutputHead, head)?;
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use qdrift_load::synthetic_model;
    use qdrift_weights::HostModel;

    use super::*;
    use crate::{quantize_model, round_to_fp16_reference};

    #[test]
    fn parts_are_the_whole_model_functions_values_and_statistics() {
        for name in ["tiny", "moe-tiny"] {
            let source = synthetic_model(name, 3).expect("preset").model;
            let mut reference = source.clone();
            round_to_fp16_reference(&mut reference);
            let fp16 = Reference { source: &source, format: ReferenceFormat::Fp16 };
            assert_eq!(HostModel::from_source(&fp16).expect("parts"), reference, "{name}: FP16 reference");
            let mut bf16 = source.clone();
            crate::round_to_reference(&mut bf16, ReferenceFormat::Bf16);
            let streamed = Reference { source: &source, format: ReferenceFormat::Bf16 };
            assert_eq!(HostModel::from_source(&streamed).expect("parts"), bf16, "{name}: bf16 reference");
            let all = QuantizeOptions { quantize_embeddings: true, quantize_head: true, quantize_router: true };
            for (scheme, options) in
                [(Scheme::Int8, QuantizeOptions::default()), (Scheme::Int4 { group: 16, asym: true }, all)]
            {
                let whole = quantize_model(&reference, &scheme, &options).expect("quantizes");
                let streamed = QuantizedSource::new(&fp16, scheme, options);
                let built = HostModel::from_source(&streamed).expect("parts");
                assert_eq!(built, whole.dequantized, "{name} {scheme}: values");
                // A tied embedding asked for again (as a tied output layer is) counts once.
                if reference.output.is_none() {
                    streamed.token_embedding().expect("again");
                }
                assert_eq!(streamed.reports(), whole.reports(), "{name} {scheme}: per-tensor rows");
                assert_eq!(streamed.summary(), whole.summary(), "{name} {scheme}: totals");
            }
        }
    }
}
