//! The one error type of the crate: every failure names what was wrong and where.

/// Why a quantization, a scheme name or a block buffer was rejected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QuantizeError {
    /// The weight slice does not hold `rows * cols` values.
    #[error("weights hold {len} values but the matrix is {rows} x {cols} = {expected}")]
    LengthMismatch {
        /// Number of values passed.
        len: usize,
        /// Declared output channels.
        rows: usize,
        /// Declared input features.
        cols: usize,
        /// `rows * cols`.
        expected: usize,
    },

    /// `rows * cols` does not fit in `usize`.
    #[error("a {rows} x {cols} matrix has more elements than usize can count")]
    ShapeOverflow {
        /// Declared output channels.
        rows: usize,
        /// Declared input features.
        cols: usize,
    },

    /// A scheme name that [`crate::Scheme`]'s [`FromStr`](std::str::FromStr) does not know.
    #[error("unknown scheme \"{}\"{hint}; known: {known}", qdrift_io::elide(name))]
    UnknownScheme {
        /// The name as given.
        name: String,
        /// What was probably meant, after the name (` (did you mean int4-g128?)`), or empty.
        hint: String,
        /// Comma-separated list of the known names.
        known: String,
    },

    /// A variant string that does not follow `WEIGHTS[+a-ACT][+kv-KV]`.
    #[error("bad variant \"{name}\": {problem}; {grammar}")]
    BadRecipe {
        /// The string as given.
        name: String,
        /// Which part is wrong.
        problem: String,
        /// The grammar with every valid part ([`crate::Recipe::grammar`]).
        grammar: String,
    },

    /// Per-token-group activation scales on a linear layer whose input is not whole groups.
    #[error(
        "activation quantization {activations} needs linear-layer inputs of whole {group}-value groups, but this model has a linear layer with {cols} inputs (vLLM and DeepSeek-V3 refuse such layers too)"
    )]
    ActivationRow {
        /// The activation part's name (`fp8-g128`).
        activations: String,
        /// The layer's input width.
        cols: usize,
        /// The group size.
        group: usize,
    },

    /// A ggml KV-cache format on a model whose cache rows are not whole blocks.
    #[error(
        "KV-cache format {format} needs rows of whole {block}-value blocks, but this model's cache row is {row} values ({kv_heads} KV heads × head dim {head_dim})"
    )]
    KvRow {
        /// The KV-cache part's name.
        format: String,
        /// Values per cached token (`kv_heads × head_dim`).
        row: usize,
        /// Key/value heads.
        kv_heads: usize,
        /// Width of a head.
        head_dim: usize,
        /// The format's block size.
        block: usize,
    },

    /// A weight is NaN or infinite; no scale can represent it.
    #[error("weight {index} (row {row}, col {col}) is {value}; quantization needs finite weights")]
    NonFinite {
        /// Flat row-major index of the value.
        index: usize,
        /// Its row (output channel).
        row: usize,
        /// Its column (input feature).
        col: usize,
        /// The offending value.
        value: f32,
    },

    /// A group or block size of zero in a hand-built [`crate::Scheme`].
    #[error("scheme {scheme} needs a group size of at least 1")]
    ZeroGroup {
        /// The scheme's name.
        scheme: String,
    },

    /// An FP16 group scale overflowed to infinity (weights above ~4.5e5 in magnitude).
    #[error(
        "row {row}, group {group}: scale {scale} does not fit in FP16 (max 65504); \
         the weights are too large for {scheme}"
    )]
    ScaleOverflow {
        /// The scheme's name.
        scheme: String,
        /// Row of the group.
        row: usize,
        /// Index of the group within its row.
        group: usize,
        /// The f32 scale before rounding to FP16.
        scale: f32,
    },

    /// A GGML buffer that is not a whole number of blocks, or of the wrong byte length.
    #[error(transparent)]
    Ggml(#[from] qdrift_ggml::GgmlError),

    /// A model tensor that should be a matrix is not: its shape is not 2-D or its data does not
    /// hold the elements its shape names.
    #[error("{tensor}: shape {shape:?} with {len} values is not a 2-D weight matrix")]
    NotAMatrix {
        /// Hugging Face name of the tensor.
        tensor: String,
        /// Its shape as stored.
        shape: Vec<usize>,
        /// Number of values it holds.
        len: usize,
    },

    /// Quantizing one tensor of a model failed; `source` says why.
    #[error("{tensor}: {source}")]
    InTensor {
        /// Hugging Face name of the tensor.
        tensor: String,
        /// The codec's error.
        source: Box<QuantizeError>,
    },
    /// A Hugging Face checkpoint layout that cannot hold the given codes or parameters.
    #[error("{message}")]
    HfLayout {
        /// What is wrong.
        message: String,
    },
}
