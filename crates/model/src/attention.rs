//! Grouped-query self-attention: the q/k/v/o projections and RoPE in Burn, then either Burn's
//! composed attention over a device [`KvCache`] or the fused host kernel
//! (`host_attention`) over a host cache, as the cache's [`crate::AttentionKernel`] says.
//!
//! **Invariant: a row's output depends only on its own visible keys ([`Positions::visible`]),
//! never on the other rows of its batch; softmax runs in f32 in every compute dtype.**

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::activation::softmax;
use burn::tensor::{DType, Tensor, TensorData};

use crate::{KvCache, Positions, Rope, upload};

/// What every layer's attention needs to know about the new columns of a forward pass.
#[derive(Debug)]
pub(crate) struct ForwardContext<'a> {
    /// RoPE tables, `[batch, new, 1, head_dim / 2, 1]` each (from [`Rope::tables`]).
    pub cos: Tensor<5>,
    pub sin: Tensor<5>,
    /// `[batch, 1, 1, new, cached + new]`, f32, 0 where a key is visible and −∞ where not; built
    /// only for device caches (the host kernel asks `positions`).
    pub mask: Option<Tensor<5>>,
    /// The batch's layout: which keys each query sees.
    pub positions: &'a Positions,
}

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
    /// Attends from the new positions `x` to everything in `cache` plus themselves, with Burn's
    /// composed attention or the host kernel, as the cache says ([`crate::AttentionKernel`]).
    ///
    /// # Shapes
    /// - `x`: `[batch, new, dim]` → `[batch, new, dim]`
    ///
    /// # Panics
    /// If `context` has no mask for a device cache.
    pub(crate) fn forward(
        &self,
        x: Tensor<3>,
        rope: &Rope,
        context: &ForwardContext,
        cache: &mut KvCache,
    ) -> Tensor<3> {
        let [b, t, _] = x.dims();
        let (h, kvh, hd) = (self.heads, self.kv_heads, self.head_dim);
        let rep = h / kvh;
        let dtype = x.dtype();
        let (cos, sin) = (&context.cos, &context.sin);

        let q = rope.apply(self.wq.forward(x.clone()).reshape([b, t, h, hd]), cos, sin);
        let k = rope.apply(self.wk.forward(x.clone()).reshape([b, t, kvh, hd]), cos, sin);
        let v = self.wv.forward(x).reshape([b, t, kvh, hd]);

        if let Some((host, start)) = cache.claim_host(t) {
            let device = q.device();
            host.write(&host_f32(k), &host_f32(v), start, t);
            let out = host.attend(&host_f32(q), h, context.positions, start, t);
            return self.wo.forward(upload(&out, [b, t, h * hd], dtype, &device));
        }
        let mask = context.mask.as_ref().expect("a device cache needs the attention mask");
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

/// A tensor's values in row-major order as f32 (exact for f16 and f32 tensors).
fn host_f32<const D: usize>(x: Tensor<D>) -> Vec<f32> {
    let data: TensorData = x.into_data().convert::<f32>();
    // Burn's flex backend reads back its own tensors; a failure here is a bug, not bad input.
    data.try_into_vec::<f32>().expect("a float tensor reads back as f32")
}
