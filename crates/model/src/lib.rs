//! A Llama-family decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU, tied or untied output
//! layer) as Burn modules built from a host model and its one description of the architecture
//! (`qdrift_weights::ModelArch` → [`Llama::from_host`]), and its key-value cache.
//!
//! Burn 0.22 carries the backend in the runtime [`Device`](burn::tensor::Device), not in a type
//! parameter: one [`Llama`] runs on wgpu, on the CPU (flex) and in tests, chosen when it is built.
//! The model computes in the float dtype it was built in, f32 or f16 (an f32 model holds tensors
//! whose values are all f16 values as f16, which is exact: host-packed linear weights, and the
//! token embedding on the CPU backend); RMSNorm and the attention softmax always run in f32, as
//! Hugging Face's Llama does for half-precision.
//! Attention runs as Burn's composed ops on a device cache, or as a fused CPU kernel over a
//! host-memory cache ([`AttentionKernel`]; the default on the CPU backend).
//!
//! Beyond Llama's block the model follows what `ModelArch`'s `BlockSpec` and each layer's weights
//! describe (Qwen3, Qwen3-MoE, Gemma 2/3, Phi-3, Mixtral, gpt-oss): an explicit head width, per-head q/k
//! norms, `x·(1 + w)` and sandwich norms, partial rotary, linear and YaRN RoPE and a RoPE per
//! layer, attention scale and soft cap, sinks, sliding windows, o and FFN biases, GELU-tanh and
//! clamped SwiGLU, an embedding scale, a final-logit soft cap and mixtures of experts; and what
//! `ModelArch::layer_attention` describes (SmolLM3, Llama 4): NoPE layers, chunked attention
//! (`Positions::visible_span`), Llama 4's L2 q/k norm after RoPE and its attention temperature on
//! the NoPE layers' queries, and Llama 4's experts scaled on their input with an ungated shared
//! expert. The CPU host kernels compute Llama's block only: a layer with any of these features
//! falls back to Burn's ops (on the CPU backend too) over a device cache, and
//! `Llama::steps_match_teacher_forcing` is then false.
//!
//! Files:
//! - `activation.rs`: the gated activations of a feed-forward layer (SwiGLU, GELU-tanh, clamped
//!   SwiGLU) as Burn ops.
//! - `llama.rs`: [`Llama`] (built from a `HostModel` and its `ModelArch`) and its blocks (attention + gated
//!   feed-forward, `BlockFfn`); `block_tests.rs`: its tests against a float64 forward pass of every
//!   dense feature.
//! - `attention.rs`, `linear.rs` ([`Projection`]), `norm.rs`, `rope.rs` ([`Rope`]), `cache.rs`
//!   ([`KvCache`]): the layers as Burn modules, on any device.
//! - `moe.rs`: `MoeLayer`, a mixture of experts: the router's top-k on the host, each expert run
//!   once on the rows routed to it (its SwiGLU experts on the host kernels where the dense FFN
//!   runs there); `routing.rs`: `RoutingRecord`, the experts a pass chose, when a caller asks.
//! - `error.rs`: `ModelError`.
//! - `positions.rs`: [`Positions`], the left-padded layout of a batch.
//! - `fake_quant.rs`: run-time roundings of activations and the KV cache ([`RuntimeQuant`]).
//! - `tensors.rs`: host values to and from Burn tensors in the model's precision (`upload`,
//!   `host_f32`), which every layer module imports; `memory.rs`: [`release_free_memory`];
//!   `testing.rs`: the wgpu device the unit tests share.
//! - `host/`: the CPU path, in one place: where each part of a forward pass runs
//!   (`host/placement.rs`) and the kernels themselves, one file per instruction set
//!   (`host/portable.rs`, `host/avx2.rs`, `host/avx512.rs`). Which instruction set they use
//!   ([`Isa`], narrowed by the `QDRIFT_ISA` environment variable) is chosen by the `qdrift-isa`
//!   crate, re-exported here.
//!
//! Imports run downwards: `llama` → the layer modules → `host` (and `positions` and `tensors`);
//! nothing in `host` or `tensors` imports a layer module. `lib.rs` only declares the modules and
//! re-exports.
//!
//! Module floors, top first: a module imports only modules on floors below its own
//! (`cargo xtask cycles` checks it).
//!
//! | floor |
//! |---|
//! | `llama.rs` |
//! | `moe.rs` |
//! | `ffn.rs` |
//! | `attention.rs`, `embedding.rs` |
//! | `cache.rs`, `fake_quant.rs`, `linear.rs`, `norm.rs`, `rope.rs` |
//! | `activation.rs`, `host/` |
//! | `error.rs`, `memory.rs`, `positions.rs`, `routing.rs`, `tensors.rs` |

mod activation;
mod attention;
mod cache;
mod embedding;
mod error;
mod fake_quant;
mod ffn;
mod host;
mod linear;
mod llama;
mod memory;
mod moe;
mod norm;
mod positions;
mod rope;
mod routing;
mod tensors;
#[cfg(test)]
mod testing;

pub use cache::KvCache;
pub use embedding::TokenEmbedding;
pub use error::ModelError;
pub use fake_quant::{InputAmax, InputSite, RuntimeQuant, round_activations, round_activations_global, round_kv};
pub use host::placement::{AttentionKernel, LinearKernel, RoundingPath};
pub use host::threads::{in_pool, single_threaded};
pub use linear::{Projection, Projections, SplitLinear, StackedLinear};
pub use llama::{Llama, OutputHead, Overflow};
pub use memory::release_free_memory;
pub use moe::MoeLayer;
pub use positions::Positions;
pub use qdrift_isa::{ISA_VAR, Isa, IsaError};
pub use rope::Rope;
pub use routing::{LayerRoutes, RoutingRecord};

#[cfg(test)]
mod block_tests;
