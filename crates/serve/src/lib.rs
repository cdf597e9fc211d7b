//! A variant run by an inference server instead of qdrift's own forward pass: the client side of
//! the OpenAI-compatible completions API that vLLM, SGLang, llama.cpp's `llama-server`,
//! llama-cpp-python's server and TensorRT-LLM's `trtllm-serve` all expose.
//!
//! qdrift sends a prompt (as token ids where the server takes them, as text otherwise) and reads
//! back each generated token with its top-K log-probabilities, greedily (temperature 0), for a
//! fixed number of tokens (`ignore_eos`/`min_tokens` where the server has them); with `echo` it
//! reads the prompt's own log-probabilities, which is how a reference's text is scored
//! teacher-forced through the server.
//!
//! | file | contents |
//! |---|---|
//! | `endpoint.rs` | [`Endpoint`]: `http(s)://HOST:PORT/v1[#MODEL]`; [`TOKEN_ENV`] |
//! | `client.rs` | [`Server`]: the HTTP client, retries, the bearer token, model resolution |
//! | `completion.rs` | [`Request`], [`Completion`]: the request body and the answer's dialects (OpenAI's legacy `logprobs`, vLLM's `token_id:N` tokens, `llama-server`'s `content` list) |
//! | `pool.rs` | [`run_bounded`]: requests in parallel, at most `--concurrency` at once, in order |
//! | `provenance.rs` | [`ServerInfo`]: what the server says about itself, for the report |
//! | `error.rs` | [`ServeError`]: every failure names the URL |
//!
//! **Architecture invariant:** this crate knows no tokenizer, model or metric. It returns what the
//! server said, token by token, and refuses an answer it cannot read whole; mapping token text to
//! ids and scoring belong to the caller (`qdrift-eval`, `qdrift-score`).
//!
//! Module floors, top first: a module imports only modules on floors below its own
//! (`cargo xtask cycles` checks it).
//!
//! | floor |
//! |---|
//! | `completion.rs`, `provenance.rs` |
//! | `client.rs` |
//! | `endpoint.rs` |
//! | `error.rs`, `pool.rs` |

#![forbid(unsafe_code)]

mod client;
mod completion;
mod endpoint;
mod error;
mod pool;
mod provenance;

pub use client::{Server, ServerOptions};
pub use completion::{Completion, Prompt, Request, Step, Token};
pub use endpoint::{Endpoint, TOKEN_ENV};
pub use error::ServeError;
pub use pool::run_bounded;
pub use provenance::ServerInfo;
