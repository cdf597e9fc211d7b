use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::activation::softmax;
use burn::tensor::{DType, Tensor};

use crate::{KvCache, Rope};

/// Multi-head self-attention with grouped key/value heads (Ainslie et al. 2023, "GQA"): query
/// head `h` attends with key/value head `h / (heads / kv_heads)`, as in llama2.c.
#[derive(Module, Debug)]
pub struct Attention {
    /// Query projection, weight `[dim, heads * head_dim]`.
    pub wq: Linear,
    /// Key projection, weight `[dim, kv_heads * head_dim]`.
    pub wk: Linear,
    /// Value projection, weight `[dim, kv_heads * head_dim]`.
    pub wv: Linear,
    /// Output projection, weight `[heads * head_dim, dim]`.
    pub wo: Linear,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
}

impl Attention {
    /// Attends from the new positions `x` to everything in `cache` plus themselves.
    ///
    /// # Shapes
    /// - `x`: `[batch, new, dim]` → `[batch, new, dim]`
    /// - `cos`, `sin`: `[batch, new, 1, head_dim / 2, 1]` (from [`Rope::tables`])
    /// - `mask`: `[batch, 1, 1, new, cached + new]`, f32, 0 where a key is visible and −∞ where not
    pub fn forward(
        &self,
        x: Tensor<3>,
        rope: &Rope,
        cos: &Tensor<5>,
        sin: &Tensor<5>,
        mask: &Tensor<5>,
        cache: &mut KvCache,
    ) -> Tensor<3> {
        let [b, t, _] = x.dims();
        let (h, kvh, hd) = (self.heads, self.kv_heads, self.head_dim);
        let rep = h / kvh;
        let dtype = x.dtype();

        let q = rope.apply(self.wq.forward(x.clone()).reshape([b, t, h, hd]), cos, sin);
        let k = rope.apply(self.wk.forward(x.clone()).reshape([b, t, kvh, hd]), cos, sin);
        let v = self.wv.forward(x).reshape([b, t, kvh, hd]);

        let (k, v) = cache.forward(k.swap_dims(1, 2), v.swap_dims(1, 2));
        let s = k.dims()[2];

        // Group the query heads that share a key/value head so that one batched matmul serves
        // the whole group without materialising repeated keys: [b, kvh, rep * t, hd].
        let q = q.swap_dims(1, 2).reshape([b, kvh, rep * t, hd]);
        let scores = q.matmul(k.swap_dims(2, 3)).div_scalar((hd as f64).sqrt());
        let scores = scores.reshape([b, kvh, rep, t, s]).cast(DType::F32) + mask.clone();
        let weights = softmax(scores, 4).cast(dtype).reshape([b, kvh, rep * t, s]);
        let out = weights.matmul(v); // [b, kvh, rep * t, hd]
        let out = out.reshape([b, h, t, hd]).swap_dims(1, 2).reshape([b, t, h * hd]);
        self.wo.forward(out)
    }
}
