//! What can go wrong generating or teacher forcing, for every module of the crate.
//!
//! Each message is one line that names what is wrong and, where it can, what to change.

/// Why generation could not run.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// A prompt's logits went non-finite: an activation left the range of the compute dtype
    /// (FP16's ±65504), or the weights hold a NaN.
    #[error("{}", overflow_message(*.index, *.prompt_len, .at.as_ref(), *.f16))]
    Overflow {
        /// The prompt's index (0-based).
        index: usize,
        /// Its length in tokens: positions from there on are generated.
        prompt_len: usize,
        /// Where the residual stream first leaves the range, when a block's output does.
        at: Option<qdrift_model::Overflow>,
        /// Whether the model computes in f16.
        f16: bool,
    },
    /// A prompt with no tokens.
    #[error("prompt {index} is empty: give at least one token (one character of text)")]
    EmptyPrompt {
        /// Its index (0-based).
        index: usize,
    },
    /// A token id outside the model's vocabulary.
    #[error("prompt {index} has token {token}, outside the model's vocabulary of {vocab}")]
    TokenOutOfRange {
        /// Prompt index.
        index: usize,
        /// The token.
        token: u32,
        /// Vocabulary size.
        vocab: usize,
    },
    /// The request does not fit the device.
    #[error("{0}")]
    TooLarge(String),
    /// A request longer than a LongRoPE model's original context
    /// ([`RopeScaling::LongRope`](qdrift_weights::RopeScaling::LongRope)): past it `transformers`
    /// switches to the long factors and recomputes the whole sequence, which qdrift does not do.
    #[error(
        "LongRoPE: {positions} positions (longest prompt {longest} + {new_tokens} new tokens) exceed the model's \
         original context of {original} positions (original_max_position_embeddings), past which transformers \
         switches to the long RoPE factors and recomputes the sequence; qdrift runs the short factors only, so \
         shorten the prompts or ask for fewer new tokens"
    )]
    LongRopeContext {
        /// The request's positions: longest prompt plus new tokens (saturating).
        positions: usize,
        /// The longest prompt, in tokens.
        longest: usize,
        /// New tokens asked for.
        new_tokens: usize,
        /// The model's `original_max_position_embeddings`.
        original: usize,
    },
    /// Teacher forcing got continuations of different lengths.
    #[error("continuation {index} has {len} tokens, the first has {expected}: teacher forcing needs equal lengths")]
    UnequalContinuations {
        /// Index of the first continuation that differs.
        index: usize,
        /// Its length.
        len: usize,
        /// The first continuation's length.
        expected: usize,
    },
    /// Two models to be compared have different vocabularies.
    #[error(
        "the reference has a vocabulary of {reference} tokens, the variant {variant}: they cannot be compared position by position"
    )]
    VocabMismatch {
        /// The reference's vocabulary size.
        reference: usize,
        /// The variant's vocabulary size.
        variant: usize,
    },
    /// `batch_size` of zero.
    #[error("batch size must be at least 1")]
    ZeroBatch,
    /// A request this function does not handle (e.g. timing a generation that stops at EOS).
    #[error("{0}")]
    Unsupported(String),
    /// Reading results back from the device failed.
    #[error("reading results from the device failed: {0}")]
    Readback(String),
}

/// One line: where a prompt's values left the range and what to do.
fn overflow_message(index: usize, prompt_len: usize, at: Option<&qdrift_model::Overflow>, f16: bool) -> String {
    let place = match at {
        Some(o) if o.position < prompt_len => {
            format!(
                "layer {} at position {} of prompt {} (in the prompt), value {}",
                o.layer,
                o.position,
                index + 1,
                o.value
            )
        }
        Some(o) => format!(
            "layer {} at position {} of prompt {} (generated token {}), value {}",
            o.layer,
            o.position,
            index + 1,
            o.position - prompt_len + 1,
            o.value
        ),
        None => format!("the final norm or output layer, prompt {}", index + 1),
    };
    if f16 {
        format!(
            "non-finite logits: the activations overflow FP16 (beyond ±65504) at {place}; run with --dtype bf16 (CPU backend) or --dtype f32"
        )
    } else {
        format!("non-finite logits at {place}: the weights or activations hold a NaN or infinity")
    }
}
