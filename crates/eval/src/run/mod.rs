//! The orchestration: the reference's and each variant's models built, generating and
//! teacher-forced, into traces; `--prompts auto`'s rounds of whole runs.
//!
//! | floor | contents |
//! |---|---|
//! | `auto.rs` | [`crate::evaluate_auto`]: `--prompts auto`, whole runs with more prompts until the gate's checks resolve |
//! | `evaluate.rs` | [`crate::evaluate_any`], [`crate::evaluate`]: calling each step in turn |
//! | `scoring.rs` | a variant teacher-forced on the reference's text, and the reference on the variant's, into traces |
//! | `reference.rs` | the reference's run: its generation and its side of the comparison on its own text |
//! | `variant.rs` | the variant each [`crate::VariantSpec`] builds (weights, precision, report header) |
//! | `routing.rs` | a model with experts: the experts each model routes every position of a text to, compared per prompt |
//! | `compact.rs` | the reference's compact top-K statistics per prompt (`--reference-top-k`) |
//! | `generation.rs` | greedy generation of every prompt, with progress |
//! | `reduce.rs` | where a chunk's logits are reduced: host or device |
//! | `texts.rs` | the text a model is teacher-forced on, and the tokens a chunk scores |

pub(crate) mod auto;
pub(crate) mod compact;
pub(crate) mod evaluate;
pub(crate) mod generation;
pub(crate) mod reduce;
pub(crate) mod reference;
pub(crate) mod routing;
pub(crate) mod scoring;
pub(crate) mod texts;
pub(crate) mod variant;
