//! The evaluation: how far each variant of a model drifts from its FP16 reference, over 10, 100
//! and 1000 tokens of free-running generation.
//!
//! This crate runs the pipeline's middle stages for `qdrift eval`: it builds the reference (the
//! checkpoint's weights rounded to FP16) and the variants (quantization schemes applied to those
//! weights, other checkpoints, and the noise floor: the same FP16 weights at the other compute
//! precision), lets each generate greedily, teacher-forces each on the other's text, and reduces
//! what comes back to per-prompt [`Trace`]s and then to a [`qdrift_report::Report`].
//!
//! Data flow per variant: `generate` (free run, both models) → `teacher_forced` on the
//! reference's continuation (KL, top-1, log p of the reference token) → `teacher_forced` of the
//! reference on the variant's continuation (log p) → [`aggregate`] (host, f64, bootstrap over
//! prompts). Logits are reduced where they are (`run/reduce.rs`): on the device for a GPU, on the
//! host for the CPU backend, whose tensors are host memory.
//!
//! [`evaluate_any`] (`run/evaluate.rs`) runs in these steps:
//!
//! | step | files | contents |
//! |---|---|---|
//! | check | `check/plan.rs`, `check/gate_check.rs` | options checked before loading; `--gate` thresholds against the run's variants and horizons |
//! | encode prompts | `inputs/prompts.rs` | the first N prompts of the set, chat-wrapped for chat sets |
//! | check the checkpoints | `check/compat.rs` | every checkpoint variant opened and refused unless it is a quantization of the reference |
//! | plan | `check/plan.rs`, [`memory`], `check/space.rs` | batch size, chunk, precisions, KL mode, shard; the request checked against the device, memory and disk |
//! | run the reference | `run/reference.rs`, `run/generation.rs`, `run/compact.rs` | its generation and its side of the comparison on its own text, kept once for every variant (or read from `persist/store.rs`) |
//! | run each variant | `run/variant.rs`, `run/scoring.rs`, `run/reduce.rs`, `run/routing.rs` | [`VariantSpec`] → weights; generation, teacher forcing into [`Trace`]s (with experts: routing passes) |
//! | assemble | `assemble/report.rs`, [`aggregate`], `assemble/routing_drift.rs` | traces → statistics → [`qdrift_report::Report`] (or, for one shard, a [`Part`], `persist/shard.rs`) |
//!
//! [`evaluate_auto`] (`run/auto.rs`) is `--prompts auto`: whole runs with more prompts until the
//! gate's checks resolve. [`OutputDir`] (`persist/output.rs`) locks `--out` and stages the reports
//! so that they appear together or not at all.
//!
//! The crate is five rooms and three shared files, on floors: a module imports only modules on
//! floors below its own, here and in each room's own table (`cargo xtask cycles` checks both), so
//! a value passed down from [`evaluate_any`] never comes back up into a file it has left. `lib.rs`
//! only declares the modules and re-exports.
//!
//! | floor | contents |
//! |---|---|
//! | `run/` | orchestration: the reference's and each variant's generation and scoring, `--prompts auto`'s rounds |
//! | `persist/` | what a run writes and reads back: the saved reference (store), a shard's part, their section container, `--dump-logprobs`, `--out` |
//! | `assemble/` | traces → statistics → the report, and `qdrift compare` |
//! | `check/` | [`EvalConfig`] and [`VariantSpec`]; options, thresholds, checkpoints, memory and disk checked before the run |
//! | `inputs/` | eval sets, chat templates, the encoded prompts, and how files are named and hashed |
//! | `types.rs` | what the steps hand each other: [`Progress`], the measurement, [`VariantHeader`], [`RunContext`], [`dtype_name`] |
//! | `trace.rs` | what is measured per prompt: [`Trace`], `RoutingTrace`, `CompactReference` |
//! | `error.rs` | [`EvalError`] |
//!
//! **Invariants: prompts are the unit of every interval; the same inputs and seed give a
//! byte-identical report; reference and variant always see the same batches (so a variant that
//! equals the reference shows exactly zero divergence); full-vocabulary logits never leave a
//! GPU unless a log-probability dump is asked for.**

mod assemble;
mod check;
mod error;
mod inputs;
mod persist;
mod run;
mod trace;
mod types;

pub use assemble::aggregate;
pub use assemble::aggregate::Bootstrap;
pub use assemble::compare::{CompareInput, compare};
pub use check::config::{DEFAULT_EVAL_SET_RULE, EvalConfig, MAX_RESAMPLES, Shard, VariantSpec, default_eval_set};
pub use check::memory;
pub use error::EvalError;
pub use inputs::chat::{CHAT_TEMPLATE_MEMORY, ChatSandbox, apply_chat_template, serve_chat_request, set_chat_sandbox};
pub use inputs::evalset::{EvalPrompt, EvalSet, built_in_names};
pub use inputs::identity::{report_name, sha256_file, sha256_hex};
/// The seal of a store's or part's data file (for the fuzzer, which edits both files).
#[doc(hidden)]
pub use persist::container::seal;
pub use persist::output::{OutputDir, path_check};
pub use persist::shard::{PART_FORMAT, Part, merge};
pub use persist::store::{STORE_FORMAT, StoreKey, StoreModel, verify_store};
pub use persist::store::{StoreSettings, store_settings};
pub use run::auto::{AutoRound, check_auto, evaluate_auto};
pub use run::evaluate::{Evaluated, evaluate, evaluate_any};
pub use trace::Trace;
pub use types::{Progress, RunContext, VariantHeader, dtype_name, reference_format, reference_name};
