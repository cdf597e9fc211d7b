//! What a run writes and reads back besides the report: the saved reference (`--save-reference`,
//! `--reference`), a shard's part (`--shard`, `qdrift merge`), the section container both are
//! kept in, the log-probability dump, and the `--out` folder the reports are staged in.
//!
//! | floor | contents |
//! |---|---|
//! | `shard.rs` | a shard's [`crate::Part`] (`--shard`) and [`crate::merge`] |
//! | `store.rs` | the saved reference: its key, writing and reading it |
//! | `output.rs` | [`crate::OutputDir`]: `--out` locked, staged and filled at once |
//! | `dump.rs` | `--dump-logprobs` |
//! | `container.rs` | the section format of stores and parts: named arrays in one data file, and traces in it |

pub(crate) mod container;
pub(crate) mod dump;
pub(crate) mod output;
pub(crate) mod shard;
pub(crate) mod store;
