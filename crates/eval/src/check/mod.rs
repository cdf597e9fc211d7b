//! What a run is asked to do, and everything checked before a model is built: the options, the
//! `--gate` thresholds against the run, each checkpoint variant against the reference, the plan
//! (batch size, chunk, precisions, KL mode, shard) against the device, its memory and its disks.
//!
//! | floor | contents |
//! |---|---|
//! | `gate_check.rs` | `--gate` thresholds checked against the run's variants and horizons |
//! | `space.rs` | what the run will write (reports, store, dump) sized from the plan and checked against each filesystem's free space |
//! | [`memory`] | each model of the plan sized before it is built, the largest checked against the memory available |
//! | `plan.rs` | options checked before loading; batch size, chunk, precisions, KL mode, shard; device checks |
//! | `compat.rs` | a checkpoint variant opened and checked against the reference before the run |
//! | `config.rs` | [`crate::EvalConfig`] and its defaults, [`crate::VariantSpec`], [`crate::Shard`], `MAX_RESAMPLES`, the default eval set |

pub(crate) mod compat;
pub(crate) mod config;
pub(crate) mod gate_check;
pub mod memory;
pub(crate) mod plan;
pub(crate) mod space;
