//! [`Scheme`]: the weight formats as values, with their parameters.
//!
//! A `Scheme` names a format and its parameters; it is plain data (copied, compared, hashed,
//! matched by callers that choose a scheme). What a scheme *does* (its CLI name, its `describe`
//! sentence, its storage and codec) is its format's, in `formats/<format>.rs`, reached through
//! the registry in `formats/mod.rs`. The enum lives here, apart from the registry, because every
//! format file names its own variants: the registry imports the formats, the formats import this
//! file, and no module imports one that imports it (`cargo xtask cycles`).

pub use qdrift_ggml::GgmlType;

/// The two OCP 8-bit floating point formats (OFP8 rev 1.0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp8Format {
    /// 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities; max normal 448.
    E4M3,
    /// 1 sign, 5 exponent (bias 15), 2 mantissa bits; IEEE-like inf/NaN; max normal 57344.
    E5M2,
}

impl Fp8Format {
    /// Largest finite magnitude of the format.
    pub fn max_finite(self) -> f32 {
        match self {
            Fp8Format::E4M3 => 448.0,
            Fp8Format::E5M2 => 57344.0,
        }
    }
}

/// Which rule an OCP MXFP4 scheme chooses its power-of-two block scale by (`formats/mxfp4.rs`;
/// llama.cpp's own rule is `Scheme::Ggml(GgmlType::Mxfp4)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mxfp4Rule {
    /// The OCP MX v1.0 §6.3 rule, `2^(floor(log2 amax) − 2)` (`mxfp4-ocp`).
    Ocp,
    /// compressed-tensors' rule: the amax rounded to a power of two first (`mxfp4-ct`).
    CompressedTensors,
}

/// A weight quantization scheme. See [`Scheme::describe`] for each one in a sentence; each
/// variant's behaviour is in the file of its format (`formats/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// Round each weight to IEEE binary16 (`formats/float.rs`).
    Fp16,
    /// Round each weight to bfloat16 (`formats/float.rs`).
    Bf16,
    /// Symmetric int8, one f32 scale per output channel (`formats/int.rs`).
    Int8,
    /// 4-bit integers with one FP16 scale per `group` consecutive inputs of a row
    /// (`formats/int.rs`).
    Int4 {
        /// Elements per group along a row.
        group: usize,
        /// Asymmetric (scale + 4-bit zero point) instead of symmetric.
        asym: bool,
    },
    /// OCP FP8 with an f32 scale per output channel, or per tensor (`formats/fp8.rs`).
    Fp8 {
        /// E4M3 or E5M2.
        format: Fp8Format,
        /// One scale for the whole tensor instead of one per row.
        per_tensor: bool,
    },
    /// QLoRA NormalFloat4 with an f32 absmax per block of `block` inputs of a row
    /// (`formats/nf4.rs`).
    Nf4 {
        /// Elements per absmax block along a row (64 in QLoRA).
        block: usize,
    },
    /// A GGML block format, bit-exact with ggml's reference quantizer (`formats/ggml.rs`).
    Ggml(GgmlType),
    /// OCP MXFP4 (E2M1, an E8M0 scale per 32 inputs of a row) by a checkpoint tool's scale rule
    /// (`formats/mxfp4.rs`).
    Mxfp4 {
        /// How the block scale is chosen.
        rule: Mxfp4Rule,
    },
    /// NVFP4 (E2M1, an E4M3 scale per 16 inputs of a row, an f32 scale per tensor) as
    /// compressed-tensors quantizes it (`formats/nvfp4.rs`).
    Nvfp4,
}
