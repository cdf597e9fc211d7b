use burn::tensor::{DType, Device, Tensor};

/// Keys and values of one attention layer for a batch, preallocated for the whole run.
///
/// Every forward pass writes its new columns in place at the current length; nothing is
/// reallocated while generating.
#[derive(Debug)]
pub struct KvCache {
    /// `[batch, kv_heads, capacity, head_dim]`.
    keys: Tensor<4>,
    /// `[batch, kv_heads, capacity, head_dim]`.
    values: Tensor<4>,
    len: usize,
    capacity: usize,
}

impl KvCache {
    /// An empty cache for `capacity` positions.
    pub fn new(batch: usize, kv_heads: usize, capacity: usize, head_dim: usize, dtype: DType, device: &Device) -> Self {
        let shape = [batch, kv_heads, capacity, head_dim];
        Self {
            keys: Tensor::zeros(shape, (device, dtype)),
            values: Tensor::zeros(shape, (device, dtype)),
            len: 0,
            capacity,
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

    /// Appends `k` and `v` and returns all cached keys and values so far.
    ///
    /// # Shapes
    /// - `k`, `v`: `[batch, kv_heads, new, head_dim]`
    /// - returns `([batch, kv_heads, len + new, head_dim], same)`
    ///
    /// # Panics
    /// If the cache would overflow its capacity; callers size it from the request.
    pub fn forward(&mut self, k: Tensor<4>, v: Tensor<4>) -> (Tensor<4>, Tensor<4>) {
        let [b, h, new, d] = k.dims();
        let end = self.len + new;
        assert!(end <= self.capacity, "key-value cache overflow: {end} > {}", self.capacity);
        let write = [0..b, 0..h, self.len..end, 0..d];
        self.keys.inplace(|t| t.slice_assign(write.clone(), k));
        self.values.inplace(|t| t.slice_assign(write, v));
        self.len = end;
        let read = [0..b, 0..h, 0..end, 0..d];
        (self.keys.clone().slice(read.clone()), self.values.clone().slice(read))
    }
}
