//! [`ModelError`]: why a model cannot be built or run as asked.

use burn::tensor::DType;
use qdrift_isa::IsaError;
use qdrift_weights::HostTensor;

/// Errors building a model on a device.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A host tensor does not have the shape the architecture implies.
    #[error("tensor {name} has shape {actual:?}, expected {expected:?}")]
    Shape {
        /// Tensor name (Hugging Face naming).
        name: String,
        /// Its shape.
        actual: Vec<usize>,
        /// The shape the architecture implies.
        expected: Vec<usize>,
    },
    /// The architecture is inconsistent.
    #[error("invalid architecture: {0}")]
    Arch(String),
    /// The run-time quantization does not fit the model (a ggml KV format on rows that are not
    /// whole blocks).
    #[error("{0}")]
    Runtime(#[from] qdrift_codecs::QuantizeError),
    /// The weight source failed to hand out a part (a checkpoint's reader: the file and tensor).
    #[error("{0}")]
    Source(qdrift_weights::SourceError),
    /// The compute dtype is not one the model supports.
    #[error("unsupported compute dtype {0:?}; use f32 or f16")]
    DType(DType),
    /// `QDRIFT_ISA` names an instruction set the CPU kernels lack, or one this CPU cannot run.
    #[error("{0}")]
    Isa(#[from] IsaError),
}

/// `t` has shape `expected` (and as many values), or [`ModelError::Shape`] naming `name`.
pub(crate) fn check(name: &str, t: &HostTensor, expected: &[usize]) -> Result<(), ModelError> {
    if t.shape != expected || t.data.len() != expected.iter().product::<usize>() {
        return Err(ModelError::Shape { name: name.to_string(), actual: t.shape.clone(), expected: expected.to_vec() });
    }
    Ok(())
}

/// A linear layer's `[out, inp]` weight and optional `[out]` bias, checked; `name` without its
/// `.weight`.
pub(crate) fn check_linear(
    name: &str,
    weight: &HostTensor,
    bias: Option<&HostTensor>,
    [out, inp]: [usize; 2],
) -> Result<(), ModelError> {
    check(&format!("{name}.weight"), weight, &[out, inp])?;
    if let Some(b) = bias {
        check(&format!("{name}.bias"), b, &[out])?;
    }
    Ok(())
}
