//! The preallocated key/value cache of one attention layer, in device tensors or host memory.
//!
//! **Invariant: capacity is fixed when the cache is built; every forward pass claims its columns
//! through one overflow check, so nothing is reallocated while generating.**

use burn::tensor::{DType, Device, Tensor};

use qdrift_codecs::KvQuant;

use crate::host::attention::{HostKv, Precision};
use crate::host::placement::AttentionKernel;

/// Where a [`KvCache`]'s keys and values live: one storage per [`AttentionKernel`].
// One per layer, built once and never moved in a loop: boxing the larger variant buys nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum CacheStorage {
    /// `[batch, kv_heads, capacity, head_dim]` each, read by `kernel` ([`AttentionKernel::Composed`]
    /// or [`AttentionKernel::Fused`]).
    Device {
        keys: Tensor<4>,
        values: Tensor<4>,
        kernel: AttentionKernel,
    },
    Host(HostKv),
}

/// Keys and values of one attention layer for a batch, preallocated for the whole run.
///
/// Every forward pass writes its new columns in place at the current length; nothing is
/// reallocated while generating.
#[derive(Debug)]
pub struct KvCache {
    storage: CacheStorage,
    /// Rounding applied to keys and values as they are written.
    quant: Option<KvQuant>,
    len: usize,
    capacity: usize,
}

impl KvCache {
    /// An empty cache of shape `[batch, kv_heads, capacity, head_dim]` (`capacity` positions), on
    /// `device` or in host memory as `kernel` needs. Host caches store f16 values as f16 and
    /// everything else as f32.
    pub fn new(shape: [usize; 4], dtype: DType, device: &Device, kernel: AttentionKernel) -> Self {
        let [batch, kv_heads, capacity, head_dim] = shape;
        let storage = match kernel {
            AttentionKernel::Composed | AttentionKernel::Fused => {
                let shape = [batch, kv_heads, capacity, head_dim];
                CacheStorage::Device {
                    keys: Tensor::zeros(shape, (device, dtype)),
                    values: Tensor::zeros(shape, (device, dtype)),
                    kernel,
                }
            }
            AttentionKernel::Host => {
                let precision = if dtype == DType::F16 { Precision::F16 } else { Precision::F32 };
                CacheStorage::Host(HostKv::new(batch, kv_heads, capacity, head_dim, precision))
            }
        };
        Self { storage, quant: None, len: 0, capacity }
    }

    /// The cache with keys and values rounded as `quant` says when they are written (keys after
    /// RoPE, as llama.cpp and vLLM store them), by the host definition for a host cache and on
    /// the device for a device cache.
    pub fn with_quant(mut self, quant: Option<KvQuant>) -> Self {
        self.quant = quant;
        self
    }

    /// The rounding applied to written keys and values, if any.
    pub fn quant(&self) -> Option<KvQuant> {
        self.quant
    }

    /// Which attention implementation reads this cache.
    pub fn kernel(&self) -> AttentionKernel {
        match self.storage {
            CacheStorage::Device { kernel, .. } => kernel,
            CacheStorage::Host(_) => AttentionKernel::Host,
        }
    }

    /// Positions written so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing has been written yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions the cache can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Forgets the cached positions (the memory stays allocated).
    pub fn reset(&mut self) {
        self.len = 0;
    }

    /// For a host cache ([`AttentionKernel::Host`]): claims `new` columns and returns the store
    /// with the first of them, for the host kernel to write and read. `None` for a device cache.
    ///
    /// # Panics
    /// If the cache would overflow its capacity; callers size it from the request.
    pub(crate) fn claim_host(&mut self, new: usize) -> Option<(&mut HostKv, usize)> {
        let Self { storage: CacheStorage::Host(kv), len, capacity, .. } = self else {
            return None;
        };
        Some((kv, claim(len, *capacity, new)))
    }

    /// Appends `k` and `v` and returns all cached keys and values so far.
    ///
    /// The new columns come with a unit dimension after them: a key/value head's slice of a
    /// stacked projection's output (`Attention::forward`) is a strided view of that shape, which
    /// Burn would copy to drop the unit dimension (its reshape analysis takes no strided input to
    /// a lower rank), while the cache's own `[…, capacity, 1, head_dim]` view is free.
    ///
    /// # Shapes
    /// - `k`, `v`: `[batch, kv_heads, new, 1, head_dim]`
    /// - returns `([batch, kv_heads, len + new, head_dim], same)`
    ///
    /// # Panics
    /// If the cache would overflow its capacity (callers size it from the request), or if it is a
    /// host cache.
    pub fn forward(&mut self, k: Tensor<5>, v: Tensor<5>) -> (Tensor<4>, Tensor<4>) {
        let [b, h, new, _, d] = k.dims();
        let Self { storage: CacheStorage::Device { keys, values, .. }, len, capacity, .. } = self else {
            panic!("KvCache::forward on a host cache; the host kernel writes it");
        };
        let start = claim(len, *capacity, new);
        let end = start + new;
        let write = [0..b, 0..h, start..end, 0..1, 0..d];
        let cap = *capacity;
        let append = |t: Tensor<4>, x: Tensor<5>| {
            t.reshape([b, h, cap, 1, d]).slice_assign(write.clone(), x).reshape([b, h, cap, d])
        };
        keys.inplace(|t| append(t, k));
        values.inplace(|t| append(t, v));
        let read = [0..b, 0..h, 0..end, 0..d];
        (keys.clone().slice(read.clone()), values.clone().slice(read))
    }
}

/// Claims columns `len..len + new` of a cache for a forward pass and returns `len`.
///
/// # Panics
/// If the cache would overflow its capacity.
fn claim(len: &mut usize, capacity: usize, new: usize) -> usize {
    let (start, end) = (*len, *len + new);
    assert!(end <= capacity, "key-value cache overflow: {end} > {capacity}");
    *len = end;
    start
}
