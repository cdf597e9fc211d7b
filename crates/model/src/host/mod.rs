//! The CPU path: everything the model computes on host values on Burn's CPU backend (flex), and
//! where each part of a forward pass runs.
//!
//! On the CPU backend Burn's composed ops spend most of a forward pass packing, casting and
//! materialising; the model runs its own kernels over host memory instead (why, and what that
//! gained, is in each file). Every kernel gives the same bits as the Burn ops it replaces, or as
//! the definition it states, at every instruction set.
//!
//! Choices, each made in one place:
//! - [`placement`]: where each part of a forward pass runs (host or device), and so which of the
//!   files below a layer calls.
//! - [`qdrift_isa`] (its own crate, which qdrift-score's kernels share): which instruction set
//!   the kernels run with (portable, AVX2, AVX-512): the CPU's widest, narrowed by `QDRIFT_ISA`
//!   or forced by a test.
//! - [`threads`]: when a call spreads over rayon's threads.
//!
//! The host computations, by layer:
//! - [`linear`]: linear layers over packed weights ([`panels`] is the packed layout).
//! - [`attention`]: fused attention over a host key-value cache.
//! - [`rope`]: rotary embeddings; [`norm`]: RMSNorm; [`swiglu`]: the feed-forward activation.
//! - [`elem`]: the stored element types (f32, f16) and the f16 roundings of an f16 model.
//!
//! The kernels by instruction set, as ggml lays out its CPU backend (one file per ISA, the
//! generic code calling into them; they never call back):
//! - [`portable`]: plain Rust, the definitions the others follow operation for operation.
//! - [`avx2`]: AVX2, FMA and F16C (x86-64 only).
//! - [`avx512`]: AVX-512F, BW and VL (x86-64 only).
//! - [`x86`]: what the AVX2 and AVX-512 kernels share.
//!
//! Imports run one way: `placement`, `threads` and `elem` import nothing of the crate;
//! `panels` imports `elem`; the ISA files import `elem`, `panels` and `x86` (and `avx2` the
//! portable `dot1`); `linear`, `attention`, `rope`, `norm` and `swiglu` import those (and
//! `attention` the crate's `Positions`). The model's modules above import from here, never the
//! other way round.

pub(crate) mod attention;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
pub(crate) mod elem;
pub(crate) mod linear;
pub(crate) mod norm;
mod panels;
pub(crate) mod placement;
mod portable;
pub(crate) mod rope;
pub(crate) mod swiglu;
pub(crate) mod threads;
#[cfg(target_arch = "x86_64")]
mod x86;
