//! What a run reads besides the models: the eval set, the model's chat template, the prompts
//! encoded from them, and how the report names and hashes the files it was given.
//!
//! | floor | contents |
//! |---|---|
//! | `prompts.rs` | the first N prompts of the set, encoded, chat-wrapped for chat sets |
//! | `chat.rs` | chat templates, rendered in a sandbox |
//! | `evalset.rs` | JSONL eval sets and the built-in ones |
//! | `identity.rs` | how reports name files: file name and SHA-256 |

pub(crate) mod chat;
pub(crate) mod evalset;
pub(crate) mod identity;
pub(crate) mod prompts;
