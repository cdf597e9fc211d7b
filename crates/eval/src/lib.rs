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
//! prompts). Logits are reduced where they are (`reduce.rs`): on the device for a GPU, on the host
//! for the CPU backend, whose tensors are host memory.
//!
//! [`evaluate_any`] (`run.rs`) runs in these steps, each in its own module:
//!
//! | step | file | contents |
//! |---|---|---|
//! | check | `plan.rs`, `gate_check.rs` | options checked before loading; `--gate` thresholds against the run's variants and horizons |
//! | encode prompts | `prompts.rs` | the first N prompts of the set, chat-wrapped for chat sets |
//! | check the checkpoints | `compat.rs` | every checkpoint variant opened and refused unless it is a quantization of the reference |
//! | plan | `plan.rs` | batch size, chunk, precisions, KL mode, shard; the request checked against the device |
//! | run the reference | `reference.rs`, `generation.rs`, `compact.rs` | its generation and its side of the comparison on its own text, kept once for every variant (or read from `store.rs`) |
//! | run each variant | `variant.rs`, `generation.rs`, `scoring.rs`, `reduce.rs`, `routing.rs` | [`VariantSpec`] → weights; generation, teacher forcing into [`Trace`]s (with experts: routing passes) |
//! | assemble | `assemble.rs`, [`aggregate`], `routing_drift.rs` | traces → statistics → [`qdrift_report::Report`] (or, for one shard, a [`Part`], `shard.rs`) |
//!
//! `output.rs` ([`OutputDir`]) locks `--out` and stages the reports so that they appear together
//! or not at all.
//!
//! Imports go one way: every file uses only files below it in this table (`lib.rs` only declares
//! the modules and re-exports), so a value passed down from [`evaluate_any`] never comes back
//! up into a file it has left.
//!
//! | file | contents |
//! |---|---|
//! | `run.rs` | [`evaluate_any`], [`evaluate`]: the orchestration, calling each step in turn |
//! | `scoring.rs` | a variant teacher-forced on the reference's text, and the reference on the variant's, into [`Trace`]s |
//! | `reference.rs` | the reference's run: its generation and its side of the comparison on its own text |
//! | `routing.rs` | a model with experts: the experts each model routes every position of a text to, compared per prompt |
//! | `store.rs` | the saved reference (`--save-reference`, `--reference`): its key, writing and reading it |
//! | `compact.rs` | the reference's compact top-K statistics per prompt (`--reference-top-k`) |
//! | `generation.rs` | greedy generation of every prompt, with progress |
//! | `reduce.rs` | where a chunk's logits are reduced: host or device |
//! | `shard.rs` | a shard's [`Part`] (`--shard`) and [`merge`] |
//! | `assemble.rs` | the report from a measurement: statistics per variant, validated |
//! | `routing_drift.rs` | routing traces → the routing metrics and each variant's routing drift |
//! | `gate_check.rs` | `--gate` thresholds checked against the run's variants and horizons |
//! | `plan.rs` | options checked before loading; batch size, chunk, precisions, KL mode, shard; device checks |
//! | [`memory`] | each model of the plan sized before it is built, the largest checked against the memory available |
//! | `space.rs` | what the run will write (reports, store, dump) sized from the plan and checked against each filesystem's free space |
//! | `config.rs` | [`EvalConfig`] and its defaults, [`Shard`], the default eval set |
//! | `variant.rs` | [`VariantSpec`] and the variant each builds (weights, precision, report header) |
//! | `compat.rs` | a checkpoint variant opened and checked against the reference before the run |
//! | `prompts.rs` | the first N prompts of the set, encoded, chat-wrapped for chat sets |
//! | `evalset.rs` | JSONL eval sets and the built-in ones |
//! | `types.rs` | what the steps hand each other: [`Progress`], the measurement, [`VariantHeader`], [`RunContext`], [`dtype_name`] |
//! | `container.rs` | the section format of stores and parts: named arrays in one data file, and traces in it |
//! | `texts.rs` | the text a model is teacher-forced on, and the tokens a chunk scores |
//! | `compare.rs` | [`compare`]: two variants of paired reports head to head, prompt by prompt (`qdrift compare`) |
//! | [`aggregate`] | traces → statistics (host, f64, bootstrap over prompts) |
//! | `identity.rs` | how reports name files: file name and SHA-256 |
//! | `chat.rs` | chat templates |
//! | `dump.rs` | `--dump-logprobs` |
//! | `output.rs` | [`OutputDir`]: `--out` locked, staged and filled at once |
//! | `error.rs` | [`EvalError`] |
//!
//! **Invariants: prompts are the unit of every interval; the same inputs and seed give a
//! byte-identical report; reference and variant always see the same batches (so a variant that
//! equals the reference shows exactly zero divergence); full-vocabulary logits never leave a
//! GPU unless a log-probability dump is asked for.**

pub mod aggregate;
mod assemble;
mod chat;
mod compact;
mod compare;
mod compat;
mod config;
mod container;
mod dump;
mod error;
mod evalset;
mod gate_check;
mod generation;
mod identity;
pub mod memory;
mod output;
mod plan;
mod prompts;
mod reduce;
mod reference;
mod routing;
mod routing_drift;
mod run;
mod scoring;
mod shard;
mod space;
mod store;
mod texts;
mod types;
mod variant;

pub use aggregate::{Bootstrap, Trace};
pub use chat::{CHAT_TEMPLATE_MEMORY, ChatSandbox, apply_chat_template, serve_chat_request, set_chat_sandbox};
pub use compare::{CompareInput, compare};
pub use config::{DEFAULT_EVAL_SET_RULE, EvalConfig, Shard, default_eval_set};
/// The seal of a store's or part's data file (for the fuzzer, which edits both files).
#[doc(hidden)]
pub use container::seal;
pub use error::EvalError;
pub use evalset::{EvalPrompt, EvalSet, built_in_names};
pub use identity::{report_name, sha256_file, sha256_hex};
pub use output::{OutputDir, path_check};
pub use plan::MAX_RESAMPLES;
pub use run::{Evaluated, evaluate, evaluate_any};
pub use shard::{PART_FORMAT, Part, merge};
pub use store::{STORE_FORMAT, StoreKey, StoreModel, verify_store};
pub use store::{StoreSettings, store_settings};
pub use types::{Progress, RunContext, VariantHeader, dtype_name, reference_format, reference_name};
pub use variant::VariantSpec;
