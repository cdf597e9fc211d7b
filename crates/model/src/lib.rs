//! A Llama-family decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU, tied or untied output
//! layer) as Burn modules built from a host model and its one description of the architecture
//! (`qdrift_weights::ModelArch` → [`Llama::from_host`]), and its key-value cache.
//!
//! Burn 0.22 carries the backend in the runtime [`Device`], not in a type
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
//! clamped SwiGLU, an embedding scale, a final-logit soft cap and mixtures of experts. The CPU host kernels compute
//! Llama's block only: a layer with any of these features falls back to Burn's ops (on the CPU
//! backend too) over a device cache, and `Llama::steps_match_teacher_forcing` is then false.
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
//! - `host/`: the CPU path, in one place: where each part of a forward pass runs
//!   (`host/placement.rs`) and the kernels themselves, one file per instruction set
//!   (`host/portable.rs`, `host/avx2.rs`, `host/avx512.rs`). Which instruction set they use
//!   ([`Isa`], narrowed by the `QDRIFT_ISA` environment variable) is chosen by the `qdrift-isa`
//!   crate, re-exported here.
//!
//! Imports run downwards: `llama` → the layer modules → `host` (and `positions`); nothing in
//! `host` imports a layer module.

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
mod moe;
mod norm;
mod positions;
mod rope;
mod routing;

pub use cache::KvCache;
pub use embedding::TokenEmbedding;
pub use error::ModelError;
pub use fake_quant::{RuntimeQuant, round_activations, round_kv};
pub use host::placement::{AttentionKernel, LinearKernel, RoundingPath};
pub use host::threads::{in_pool, single_threaded};
pub use linear::{Projection, Projections, SplitLinear, StackedLinear};
pub use llama::{Llama, OutputHead, Overflow};
pub use moe::MoeLayer;
pub use positions::Positions;
pub use qdrift_isa::{ISA_VAR, Isa, IsaError};
pub use rope::Rope;
pub use routing::{LayerRoutes, RoutingRecord};

use burn::tensor::{DType, Device, Tensor, TensorData};
use half::slice::HalfFloatSliceExt;

/// Uploads host f32 values as a tensor of `dtype` (f32, f16 or bf16), converting on the host so
/// that only the target precision crosses to the device.
pub(crate) fn upload<const D: usize>(data: &[f32], shape: [usize; D], dtype: DType, device: &Device) -> Tensor<D> {
    let data = match dtype {
        DType::F16 => {
            // `half`'s slice conversion runs F16C's 8-wide `vcvtps2ph` where the CPU has it:
            // the same round-to-nearest-even as one value at a time.
            let mut h = vec![half::f16::ZERO; data.len()];
            h.convert_from_f32_slice(data);
            TensorData::new(h, shape)
        }
        DType::BF16 => TensorData::new(data.iter().map(|&v| half::bf16::from_f32(v)).collect::<Vec<_>>(), shape),
        _ => TensorData::new(data.to_vec(), shape),
    };
    Tensor::from_data(data, (device, dtype))
}

/// [`upload`] of values the caller owns: f32 values become the tensor's data without a copy.
pub(crate) fn upload_owned<const D: usize>(
    data: Vec<f32>,
    shape: [usize; D],
    dtype: DType,
    device: &Device,
) -> Tensor<D> {
    if dtype == DType::F32 {
        return Tensor::from_data(TensorData::new(data, shape), (device, dtype));
    }
    upload(&data, shape, dtype, device)
}

/// `x · s`; in bf16 as PyTorch multiplies a tensor by a Python float: in f32 (its "opmath" type
/// for half precision), rounded once. Burn's flex rounds the scalar to bf16 first, which for
/// `1/√d` or gpt-oss's `alpha` = 1.702 is another value. f32 and f16 keep Burn's `mul_scalar`,
/// which the host kernels mirror bit for bit.
///
/// # Shapes
/// - `x`: any → same
pub(crate) fn mul_scalar_opmath<const D: usize>(x: Tensor<D>, s: f64) -> Tensor<D> {
    if x.dtype() == DType::BF16 { x.cast(DType::F32).mul_scalar(s).cast(DType::BF16) } else { x.mul_scalar(s) }
}

/// A tensor's values in row-major order as f32 (exact for f16 and f32 tensors).
pub(crate) fn host_f32<const D: usize>(x: Tensor<D>) -> Vec<f32> {
    let data: TensorData = x.into_data();
    if let Ok(h) = data.as_slice::<half::f16>() {
        // Widened 8 at a time (F16C) where the CPU can: exact, as every f16 is an f32.
        let mut out = vec![0.0f32; h.len()];
        h.convert_to_f32_slice(&mut out);
        return out;
    }
    // Burn's flex backend reads back its own tensors; a failure here is a bug, not bad input.
    data.convert::<f32>().try_into_vec::<f32>().expect("a float tensor reads back as f32")
}

/// The wgpu device the unit tests share, started once per test process on Vulkan's CPU adapter
/// (Mesa's lavapipe; CI installs it): CubeCL registers a device's runtime once per process, so a
/// second `init` of the same device fails.
#[cfg(test)]
pub(crate) fn test_wgpu() -> Device {
    use burn::tensor::DeviceKind;
    use burn::tensor::wgpu::WgpuBackend;
    static DEVICE: std::sync::OnceLock<Result<Device, String>> = std::sync::OnceLock::new();
    let started = DEVICE.get_or_init(|| {
        Device::wgpu_options()
            .device_kind(DeviceKind::Cpu)
            .graphics_api(WgpuBackend::Vulkan)
            .init()
            .map_err(|e| e.to_string())
    });
    match started {
        Ok(device) => device.clone(),
        Err(e) => panic!("this test needs a Vulkan adapter (CI installs Mesa's lavapipe): {e}"),
    }
}

/// Hands the pages of freed heap memory back to the system (glibc's `malloc_trim`; nothing
/// elsewhere). Called when a large allocation has just been freed: a model's host weights once it
/// is built, a pass's key-value caches, a model once it is done.
///
/// glibc keeps freed heap memory resident, and the large buffers here (weight panels of 1–2 MiB,
/// key-value caches of a few MiB per layer, host weight tensors) come from the heap once its
/// dynamic mmap threshold has grown past them; without this an evaluation's resident memory kept
/// the f32 host copy a variant was built from through the whole variant's run (600 MB for
/// SmolLM2). A fixed `M_MMAP_THRESHOLD` would return them too, but made every decoding step map
/// and unmap its logits (20% slower).
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only returns free memory to the system; it touches no live allocation.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod block_tests;
