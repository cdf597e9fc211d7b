//! Where each part of a forward pass runs: on the host, by the CPU kernels of this folder, or as
//! Burn ops on the model's device. Every such decision is made here; the model's modules gather
//! the facts (which layers are packed on the host, which caches and tables a pass has) and ask.
//!
//! On the CPU backend (Burn's flex, [`is_cpu`]) everything that can runs on the host: linear
//! layers over packed weights ([`LinearKernel::Host`]), attention over a host cache
//! ([`AttentionKernel::Host`]), activation rounding ([`RoundingPath::Host`]) and RMSNorm
//! ([`norm_on_host`]). A layer whose parts all run on the host runs wholly there
//! ([`attention_on_host`], [`ffn_on_host`]), and when every layer does, so does the residual
//! stream from the embedding to the final norm ([`residual_on_host`]). Elsewhere (wgpu) Burn's
//! ops run on the device. Either way a value is computed by the same operations, so where it runs
//! changes no result.

use burn::tensor::{DType, Device};

/// Whether `device` is the CPU backend (Burn's flex), where the host kernels replace Burn's ops.
pub(crate) fn is_cpu(device: &Device) -> bool {
    *device == Device::flex()
}

/// Whether the host kernels run a model of compute dtype `dtype` on `device`: the CPU backend, in
/// f32 or f16 (the kernels store f32 or f16 and round to f16). A bf16 model runs as Burn ops on
/// every device, each op rounding its output to bf16 as PyTorch's bf16 ops do (the list of those
/// roundings is in ARCHITECTURE.md).
pub(crate) fn host_kernels(device: &Device, dtype: DType) -> bool {
    is_cpu(device) && matches!(dtype, DType::F16 | DType::F32)
}

/// Where a model's linear layers are stored and multiplied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinearKernel {
    /// Burn's `Linear` on the device.
    Burn,
    /// Host-packed weights and qdrift's CPU kernel (AVX-512 or AVX2 where the CPU has them);
    /// the weights are not uploaded to the device at all.
    Host,
}

impl LinearKernel {
    /// The kernel a model of compute dtype `dtype` runs best on `device`: [`LinearKernel::Host`]
    /// where the host kernels run it (the CPU backend in f32 or f16),
    /// [`LinearKernel::Burn`] elsewhere.
    pub fn for_device(device: &Device, dtype: DType) -> Self {
        if host_kernels(device, dtype) { Self::Host } else { Self::Burn }
    }
}

/// Where a cache keeps its keys and values, and so which attention implementation reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionKernel {
    /// Tensors on the model's device, read by Burn's composed attention (matmul, mask, softmax,
    /// matmul). Runs on every backend.
    Composed,
    /// Tensors on the model's device, read by Burn's attention op (`burn::tensor::module::attention`):
    /// on wgpu, autotune picks among cubek's flash-attention kernels (f32 accumulators and an
    /// online f32 softmax) and Burn's own composed fallback (f16 softmax, unfused kernels). For
    /// wgpu in f16, on the layers it covers (no soft cap, no sinks); the rest keep
    /// [`AttentionKernel::Composed`]. Chosen per device by `qdrift_generate` (a hardware GPU;
    /// not lavapipe, where autotune picks the fallback and it launches more kernels than the
    /// fused composed path).
    Fused,
    /// Host memory, read by qdrift's fused CPU kernel (`host/attention.rs`). The default on the
    /// CPU backend, where it is several times faster.
    Host,
}

impl AttentionKernel {
    /// The kernel a model of compute dtype `dtype` runs best on `device`:
    /// [`AttentionKernel::Host`] where the host kernels run it (the CPU backend in f32 or f16),
    /// [`AttentionKernel::Composed`] elsewhere. [`AttentionKernel::Fused`] is asked for by name
    /// ([`crate::Llama::set_attention_kernel`]): whether it pays depends on the adapter.
    pub fn for_device(device: &Device, dtype: DType) -> Self {
        if host_kernels(device, dtype) { Self::Host } else { Self::Composed }
    }
}

/// Where activations are rounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoundingPath {
    /// Burn tensor ops on the model's device (what wgpu runs).
    Device,
    /// Read back, rounded by the host definition, uploaded again: on the CPU backend a copy, and
    /// several times faster than ~30 small tensor ops per FP8 rounding.
    Host,
}

impl RoundingPath {
    /// [`RoundingPath::Host`] where the host kernels run a model of compute dtype `dtype`
    /// (the CPU backend in f32 or f16), [`RoundingPath::Device`] elsewhere.
    pub fn for_device(device: &Device, dtype: DType) -> Self {
        if host_kernels(device, dtype) { Self::Host } else { Self::Device }
    }
}

/// Whether RMSNorm runs on the host (`RmsNorm::forward_host`) for an input on `device` in
/// `dtype`: on the CPU backend in f32 and f16, whichever path calls it, so that the host
/// residual stream and Burn's ops give the same bits.
pub(crate) fn norm_on_host(device: &Device, dtype: DType) -> bool {
    host_kernels(device, dtype)
}

/// Whether an f32 model may hold an f16-valued token embedding table in f16 (its selected rows
/// widened, exactly): on the CPU backend only, since wgpu adapters without f16 shaders run f32
/// models, so other devices keep the compute dtype.
pub(crate) fn f16_table_allowed(device: &Device) -> bool {
    is_cpu(device)
}

/// Whether linear layers' inputs can be rounded on the host: no activation rounding (`None`),
/// or one on the host path.
pub(crate) fn rounds_on_host(activations: Option<RoundingPath>) -> bool {
    activations != Some(RoundingPath::Device)
}

/// Whether a model's layers may run on the host: its linear layers are packed there (the output
/// layer's packing stands for all) and activations, if rounded, are rounded there
/// ([`rounds_on_host`]).
pub(crate) fn host_layers(output_packed: bool, activations: Option<RoundingPath>) -> bool {
    output_packed && rounds_on_host(activations)
}

/// The tables one forward pass builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PassTables {
    /// RoPE tables on the host, for the layers that run on the host.
    pub host_rope: bool,
    /// RoPE tables on the device, for the layers that do not.
    pub device_rope: bool,
    /// The additive attention mask, for composed caches.
    pub mask: bool,
    /// The boolean attention mask, for fused caches.
    pub fused_mask: bool,
}

/// What a forward pass builds over caches of these kernels, given [`host_layers`]: host RoPE
/// tables where host layers meet a host cache, device tables where any layer may run on the
/// device (a composed cache, or layers that cannot run on the host), a mask for composed caches.
pub(crate) fn pass_tables(host_layers: bool, caches: impl IntoIterator<Item = AttentionKernel>) -> PassTables {
    let (mut host, mut composed, mut fused) = (false, false, false);
    for kernel in caches {
        host |= kernel == AttentionKernel::Host;
        composed |= kernel == AttentionKernel::Composed;
        fused |= kernel == AttentionKernel::Fused;
    }
    PassTables {
        host_rope: host_layers && host,
        device_rope: composed || fused || !host_layers,
        mask: composed,
        fused_mask: fused,
    }
}

/// Whether a layer's attention runs wholly on the host (`Attention::forward_host`): the host
/// kernels cover its features (`kernel_covers`: Llama's attention; q/k norms, sinks, soft caps,
/// windows, partial rotary and other scales do not run there), its four projections are packed on
/// the host, the pass built host RoPE tables, activations (if rounded) are rounded on the host,
/// and its cache is a host cache. Otherwise the projections run as Burn ops, and a host cache is
/// still read by the host kernel (over q, k and v read back) where the kernel covers the layer;
/// a layer it does not cover gets a device cache ([`cache_kernel`]).
pub(crate) fn attention_on_host(
    layer: HostLayer,
    host_rope: bool,
    rounds_on_host: bool,
    cache: AttentionKernel,
) -> bool {
    layer.kernel_covers && layer.projections_packed && host_rope && rounds_on_host && cache == AttentionKernel::Host
}

/// What [`attention_on_host`] asks of a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HostLayer {
    /// The host kernels compute every feature of the layer.
    pub kernel_covers: bool,
    /// Its projections are packed on the host.
    pub projections_packed: bool,
}

/// The kernel of a layer's cache when `requested` is asked for: a layer the host attention
/// kernel does not cover (`kernel_covers` false: it falls back to Burn's composed attention)
/// gets a device cache whatever was asked.
pub(crate) fn cache_kernel(requested: AttentionKernel, host_covers: bool, fused_covers: bool) -> AttentionKernel {
    match requested {
        AttentionKernel::Host if host_covers => requested,
        AttentionKernel::Fused if fused_covers => requested,
        AttentionKernel::Composed => requested,
        _ => AttentionKernel::Composed,
    }
}

/// Whether a feed-forward layer runs wholly on the host (`FeedForward::forward_host`): its three
/// projections are packed on the host and activations (if rounded) are rounded on the host.
pub(crate) fn ffn_on_host(projections_packed: bool, rounds_on_host: bool) -> bool {
    projections_packed && rounds_on_host
}

/// Whether the residual stream stays on the host from the embedding to the final norm (no tensor
/// op, read-back or upload between the layers): every block's attention and feed-forward layer
/// run on the host.
pub(crate) fn residual_on_host(blocks_on_host: impl IntoIterator<Item = bool>) -> bool {
    blocks_on_host.into_iter().all(|on_host| on_host)
}

/// Whether a decoding step's logits are, bit for bit, what teacher forcing computes for the same
/// position (`Llama::steps_match_teacher_forcing`): the model's layers run on the host
/// ([`host_layers`]) over the host caches `device` gets, with every layer's projections packed
/// there and every layer's features covered by the host kernels (`layers_on_host`), so that
/// every value depends only on its own row and position. A layer that falls back to Burn's ops
/// (composed attention: its matmuls' blocking depends on the number of columns) makes it false.
pub(crate) fn steps_match_teacher_forcing(
    host_layers: bool,
    device: &Device,
    dtype: DType,
    layers_on_host: bool,
) -> bool {
    host_layers && AttentionKernel::for_device(device, dtype) == AttentionKernel::Host && layers_on_host
}
