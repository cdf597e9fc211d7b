use burn::tensor::{DType, Device, Tensor};

/// Rotary position embedding (Su et al. 2021, "RoFormer") in the *interleaved* layout of
/// llama2.c and GGUF: within a head, elements `(2i, 2i+1)` form one rotation pair with inverse
/// frequency `theta^(-2i/head_dim)`.
///
/// Angles are computed on the host in f32 exactly as llama2.c's `run.c` does
/// (`pos * (1 / powf(theta, 2i / head_dim))`, then `cosf`/`sinf`), so f32 runs reproduce its
/// numbers; the tables are then cast to the compute dtype.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
}

impl Rope {
    /// Inverse frequencies for a head of width `head_dim` and base `theta`.
    pub fn new(head_dim: usize, theta: f32) -> Self {
        let inv_freq = (0..head_dim / 2)
            .map(|i| 1.0f32 / theta.powf((2 * i) as f32 / head_dim as f32))
            .collect();
        Self { inv_freq }
    }

    /// Number of rotation pairs per head.
    pub fn pairs(&self) -> usize {
        self.inv_freq.len()
    }

    /// cos and sin tables for the given positions.
    ///
    /// # Shapes
    /// - `positions`: `batch` rows of `seq` positions each
    /// - returns two tensors `[batch, seq, 1, pairs, 1]`, broadcastable over heads and pair halves
    pub fn tables(&self, positions: &[Vec<usize>], dtype: DType, device: &Device) -> (Tensor<5>, Tensor<5>) {
        let batch = positions.len();
        let seq = positions.first().map_or(0, Vec::len);
        let pairs = self.pairs();
        let mut cos = Vec::with_capacity(batch * seq * pairs);
        let mut sin = Vec::with_capacity(batch * seq * pairs);
        for row in positions {
            for &p in row {
                for &f in &self.inv_freq {
                    let angle = p as f32 * f;
                    cos.push(angle.cos());
                    sin.push(angle.sin());
                }
            }
        }
        let shape = [batch, seq, 1, pairs, 1];
        (crate::upload(&cos, shape, dtype, device), crate::upload(&sin, shape, dtype, device))
    }

    /// Rotates `x` by the tables from [`Rope::tables`].
    ///
    /// # Shapes
    /// - `x`: `[batch, seq, heads, head_dim]` → `[batch, seq, heads, head_dim]`
    /// - `cos`, `sin`: `[batch, seq, 1, head_dim / 2, 1]`
    pub fn apply(&self, x: Tensor<4>, cos: &Tensor<5>, sin: &Tensor<5>) -> Tensor<4> {
        let [b, s, h, d] = x.dims();
        let pairs = x.reshape([b, s, h, d / 2, 2]);
        let x0 = pairs.clone().slice([0..b, 0..s, 0..h, 0..d / 2, 0..1]);
        let x1 = pairs.slice([0..b, 0..s, 0..h, 0..d / 2, 1..2]);
        let r0 = x0.clone() * cos.clone() - x1.clone() * sin.clone();
        let r1 = x0 * sin.clone() + x1 * cos.clone();
        Tensor::cat(vec![r0, r1], 4).reshape([b, s, h, d])
    }
}
