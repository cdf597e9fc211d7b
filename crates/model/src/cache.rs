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
    /// Keys and values in one tensor, `[2 · batch, kv_heads, capacity, head_dim]`: the keys of
    /// row `r` at row `r`, its values at row `batch + r`, so that one `slice_assign` writes both
    /// ([`KvCache::forward`]) and each reads back as a view. Read by `kernel`
    /// ([`AttentionKernel::Composed`] or [`AttentionKernel::Fused`]).
    Device {
        kv: Tensor<4>,
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
                let shape = [2 * batch, kv_heads, capacity, head_dim];
                CacheStorage::Device { kv: Tensor::zeros(shape, (device, dtype)), kernel }
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

    /// Appends the new keys and values `kv` (keys at index 0 of dimension 3, values at 1) in one
    /// write and returns all cached keys and values so far.
    ///
    /// `kv` is what `Attention::forward` has: a view of a stacked projection's output where the
    /// key and value head of each group lie side by side. It is written through a
    /// `[2, batch, kv_heads, capacity, head_dim]` view of the cache, so no reshape of the strided
    /// view (which Burn would copy) is needed.
    ///
    /// # Shapes
    /// - `kv`: `[batch, new, kv_heads, 2, head_dim]`
    /// - returns `([batch, kv_heads, len + new, head_dim], same)`, views of the cache
    ///
    /// # Panics
    /// If the cache would overflow its capacity (callers size it from the request), or if it is a
    /// host cache.
    pub fn forward(&mut self, kv: Tensor<5>) -> (Tensor<4>, Tensor<4>) {
        let [b, new, h, _, d] = kv.dims();
        let Self { storage: CacheStorage::Device { kv: cache, .. }, len, capacity, .. } = self else {
            panic!("KvCache::forward on a host cache; the host kernel writes it");
        };
        let start = claim(len, *capacity, new);
        let end = start + new;
        // The cache's own batch (the rows written may be fewer).
        let [rows, heads, cap, width] = cache.dims();
        let batch = rows / 2;
        let write = [0..2, 0..b, 0..h, start..end, 0..d];
        // [b, new, h, 2, d] → [2, b, h, new, d]: a view, as the cache's 5-D view is.
        let kv = kv.permute([3, 0, 2, 1, 4]);
        cache.inplace(|t| {
            t.reshape([2, batch, heads, cap, width]).slice_assign(write, kv).reshape([rows, heads, cap, width])
        });
        let keys = cache.clone().slice([0..b, 0..h, 0..end, 0..d]);
        (keys, cache.clone().slice([batch..batch + b, 0..h, 0..end, 0..d]))
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
