//! The score stage: drift metrics between a reference model and a quantized variant, and the
//! statistics that put confidence intervals on them.
//!
//! Inputs are host slices (`f32` logits of one position, token sequences, per-prompt values);
//! everything is computed in `f64`. One metric or statistic per module:
//!
//! - [`logprob`]: log-softmax, KL divergence, entropy, top-1 and [`PositionMetrics`] from the
//!   full-vocabulary logits of one position (the reference the GPU reductions are tested against).
//! - [`agreement`]: top-K overlap of the two distributions, and speculative sampling's
//!   acceptance `Σ min(p_ref, p_var)` with the tokens per step it gives.
//! - [`freerun`]: free-running comparison of two generated token sequences.
//! - [`survival`]: Kaplan–Meier estimate of the share of prompts still identical after `t` tokens.
//! - [`bootstrap`]: percentile bootstrap over prompts (means, paired differences, any statistic).
//! - [`wilson`]: Wilson score interval for a proportion.
//! - [`signtest`]: the sign test of paired differences (how often B beats A, prompt by prompt).
//! - [`quantiles`]: type-7 quantiles and the mean/median/p90/p99/max summary.
//! - [`strata`]: metrics stratified by the reference's entropy quartiles.
//! - [`ppl`]: perplexity and perplexity ratios.
//! - [`speculative`]: greedy speculative decoding, the variant drafting for the reference: the
//!   verification steps a continuation takes, from the top-1 agreement sequence.
//! - [`compact`]: the compact reference (top-K log-probabilities plus one tail bucket per
//!   position) and the KL divergence against it, a lower bound of the exact KL.
//! - [`topk`]: both KL directions against a variant known only by its top-K log-probabilities
//!   (an inference server's `logprobs`), as an interval: the merged-tail lower bound, and the
//!   largest value the listed tokens allow.
//! - [`device`]: the per-position metrics of [`logprob`] computed on the device for whole
//!   `[batch, positions, vocab]` chunks of logits, so that only `[batch, positions]` values come
//!   back to the host (full-vocabulary log-probabilities are never held for a whole run).
//! - [`host`]: the same chunk reductions on logits in host memory (Burn's CPU backend), in two
//!   streaming passes per position and f64 sums, with the same outputs and errors.
//!
//! **Invariant: prompts are the unit of resampling, never tokens; same seed → identical numbers;
//! no I/O; every device reduction is tested against its host definition.** Nothing here panics on bad input: every public function returns [`ScoreError`].
//!
//! Module floors, top first: a module imports only modules on floors below its own
//! (`cargo xtask cycles` checks it).
//!
//! | floor |
//! |---|
//! | `host.rs` |
//! | `device.rs`, `ppl.rs`, `topk.rs`, `wilson.rs` |
//! | `agreement.rs`, `bootstrap.rs`, `compact.rs`, `freerun.rs`, `strata.rs` |
//! | `logprob.rs`, `quantiles.rs`, `signtest.rs`, `speculative.rs`, `survival.rs` |
//! | `error.rs` |

pub mod agreement;
pub mod bootstrap;
pub mod compact;
pub mod device;
mod error;
pub mod freerun;
pub mod host;
pub mod logprob;
pub mod ppl;
pub mod quantiles;
pub mod signtest;
pub mod speculative;
pub mod strata;
pub mod survival;
pub mod topk;
pub mod wilson;

pub use agreement::{TOP_K, TopKAgreement, acceptance, expected_tokens, top_k_agreement, top_k_ids};
pub use bootstrap::{Interval, bootstrap_ci, bootstrap_mean_ci, paired_difference_ci, pooled_quantile_ci};
pub use compact::{CompactPosition, compact_kl, compact_position, variant_on_compact};
pub use device::{
    CompactChunk, DevicePositionMetrics, compact_reference_on_device, position_metrics_against_compact,
    position_metrics_on_device, token_logprobs_on_device,
};
pub use error::ScoreError;
pub use freerun::{Divergence, exact_match, first_divergence, token_match_rate};
pub use host::{
    compact_reference_on_host, greedy_tokens_on_host, position_metrics_against_compact_on_host,
    position_metrics_on_host, token_logprobs_on_host,
};
pub use logprob::{PositionMetrics, entropy, kl_divergence, log_softmax, position_metrics, top1};
pub use ppl::{PromptLogProbs, perplexity, pooled_ppl_ratio, ppl_ratio, ppl_ratio_ci};
pub use quantiles::{Summary, quantile, quantile_sorted, summarize};
pub use signtest::{SignTest, sign_test};
pub use speculative::greedy_speculative_steps;
pub use strata::{Stratum, entropy_quartiles};
pub use survival::{Observation, SurvivalStep, kaplan_meier, median_survival, survival_at};
pub use topk::{TopKBounds, TopKDivergence, topk_divergence};
pub use wilson::wilson_interval;
