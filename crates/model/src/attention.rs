//! Grouped-query self-attention: the q/k/v/o projections and RoPE in Burn, then either Burn's
//! composed attention over a device [`KvCache`] or the fused host kernel
//! (`host/attention.rs`) over a host cache, as the cache's [`crate::AttentionKernel`] says; on
//! the CPU backend the whole layer runs on the host where `host::placement` says so.
//!
//! **Invariant: a row's output depends only on its own visible keys ([`Positions::visible`]),
//! never on the other rows of its batch; softmax runs in f32 in every compute dtype.**

use burn::module::Module;
use burn::tensor::activation::softmax;
use burn::tensor::{DType, Tensor};
use qdrift_codecs::{ActivationQuant, ActivationScale, KvQuant};

use crate::fake_quant::{round_activations, round_kv};
use crate::host::attention::HostKv;
use crate::host::elem::round_f16;
use crate::host::linear::PackedLinear;
use crate::host::placement::{self, RoundingPath};
use crate::host::rope::HostRope;
use crate::{KvCache, Positions, Projection, Rope, host_f32, upload, upload_owned};

/// What every layer's attention needs to know about the new columns of a forward pass.
#[derive(Debug)]
pub(crate) struct ForwardContext<'a> {
    /// RoPE tables, `[batch, new, 1, head_dim / 2, 1]` each (from [`Rope::tables`]); built
    /// unless every layer runs on the host.
    pub rope: Option<(Tensor<5>, Tensor<5>)>,
    /// The same tables on the host (from [`Rope::host_tables`]), for the host path
    /// ([`Attention::forward`] with host linear layers and a host cache).
    pub host_rope: Option<HostRope>,
    /// `[batch, 1, 1, new, cached + new]`, f32, 0 where a key is visible and −∞ where not; built
    /// only for device caches (the host kernel asks `positions`).
    pub mask: Option<Tensor<5>>,
    /// The batch's layout: which keys each query sees.
    pub positions: &'a Positions,
    /// Column of the first new position.
    pub start: usize,
    /// Dynamic quantization of every linear layer's input, and where it runs.
    pub activations: Option<(ActivationQuant, RoundingPath)>,
    /// `[batch, new, 1]`, f32, 1 for real tokens and 0 for padding; built only for per-tensor
    /// activation scales on the device.
    pub real: Option<Tensor<3>>,
    /// Whether the model computes in f16: a rounded activation (`q × scale`) is then stored as
    /// the f16 value a tensor of the model's dtype holds, on the host as on the device.
    pub f16: bool,
}

impl ForwardContext<'_> {
    /// A linear layer's input, rounded as the variant's activation quantization says (unchanged
    /// without one).
    ///
    /// # Shapes
    /// - `x`: `[batch, new, cols]` → same
    pub fn round_input(&self, x: Tensor<3>) -> Tensor<3> {
        match self.activations() {
            None => x,
            Some((q, RoundingPath::Device)) => round_activations(x, q, self.real.as_ref()),
            Some((q, RoundingPath::Host)) => {
                let ([b, t, cols], dtype, device) = (x.dims(), x.dtype(), x.device());
                let mut data = host_f32(x);
                self.round_host(&mut data, q, b, t, cols);
                upload(&data, [b, t, cols], dtype, &device)
            }
        }
    }

    /// The host attention kernel's output, already rounded on the host where the activation
    /// quantization runs there ([`Attention::attend_host`]), uploaded in `dtype` and rounded on
    /// the device where it runs there: what [`ForwardContext::round_input`] gives.
    ///
    /// # Shapes
    /// - `data`: `[batch, new, cols]`, row-major → uploaded `[batch, new, cols]` in `dtype`
    fn upload_rounded_output(
        &self,
        data: Vec<f32>,
        shape: [usize; 3],
        dtype: DType,
        device: &burn::tensor::Device,
    ) -> Tensor<3> {
        let x = upload_owned(data, shape, dtype, device);
        if self.rounds_on_host() { x } else { self.round_input(x) }
    }

    /// Whether a linear layer's input can be rounded on the host ([`ForwardContext::round_host_input`]):
    /// no activation quantization, or one on the host path ([`placement::rounds_on_host`]).
    pub fn rounds_on_host(&self) -> bool {
        placement::rounds_on_host(self.activations().map(|(_, path)| path))
    }

    /// A linear layer's input as host values, rounded as the variant's activation quantization
    /// says; only where [`ForwardContext::rounds_on_host`].
    ///
    /// # Shapes
    /// - `data`: `[batch, new, cols]`, row-major, rounded in place
    pub fn round_host_input(&self, data: &mut [f32], [b, t, cols]: [usize; 3]) {
        if let Some((q, RoundingPath::Host)) = self.activations() {
            self.round_host(data, q, b, t, cols);
            if self.f16 {
                round_f16(data);
            }
        }
    }

    /// The activation rounding of this pass: a per-tensor scale covers the prompt pass (the
    /// first, `start` = 0) only; every later token is scaled alone, as vLLM at batch size 1 runs
    /// prefill then decoding. Teacher forcing, which feeds continuation tokens several at a time,
    /// so rounds exactly as generation does.
    fn activations(&self) -> Option<(ActivationQuant, RoundingPath)> {
        self.activations.map(|(q, path)| match q.scale {
            ActivationScale::Tensor if self.start > 0 => (ActivationQuant { scale: ActivationScale::Token, ..q }, path),
            _ => (q, path),
        })
    }

    /// The host definition over each row's real tokens (a suffix of its columns: padding is on
    /// the left, and never part of a sequence's scale).
    fn round_host(&self, data: &mut [f32], q: ActivationQuant, b: usize, t: usize, cols: usize) {
        for (row, values) in data.chunks_mut(t * cols).take(b).enumerate() {
            let first_real = self.positions.pad[row].saturating_sub(self.start).min(t);
            q.round_host(&mut values[first_real * cols..], cols);
        }
    }
}

/// Multi-head self-attention with grouped key/value heads (Ainslie et al. 2023, "GQA"): query
/// head `h` attends with key/value head `h / (heads / kv_heads)`, as in llama2.c.
#[derive(Module, Debug)]
pub struct Attention {
    /// Query projection, weight `[dim, heads * head_dim]`.
    pub wq: Projection,
    /// Key projection, weight `[dim, kv_heads * head_dim]`.
    pub wk: Projection,
    /// Value projection, weight `[dim, kv_heads * head_dim]`.
    pub wv: Projection,
    /// Output projection, weight `[heads * head_dim, dim]`.
    pub wo: Projection,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
}

impl Attention {
    /// The four projections' host weights, when all four are stored on the host.
    pub(crate) fn packed(&self) -> Option<[&PackedLinear; 4]> {
        Some([self.wq.packed()?, self.wk.packed()?, self.wv.packed()?, self.wo.packed()?])
    }

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
        let kv_quant = cache.quant();
        if self.runs_on_host(context, cache) {
            let device = x.device();
            let y = self.forward_host(host_f32(x), [b, t], context, cache);
            return upload_owned(y, [b, t, self.wo.out_features()], dtype, &device);
        }
        let (cos, sin) = context.rope.as_ref().expect("device RoPE tables are built unless every layer is on the host");
        let x = context.round_input(x);
        let q = rope.apply(self.wq.forward(x.clone()).reshape([b, t, h, hd]), cos, sin);
        let k = rope.apply(self.wk.forward(x.clone()).reshape([b, t, kvh, hd]), cos, sin);
        let v = self.wv.forward(x).reshape([b, t, kvh, hd]);

        if let Some((host, start)) = cache.claim_host(t) {
            // The host kernel over q/k/v computed on the device.
            let device = q.device();
            let new = NewColumns { q: &host_f32(q), k: host_f32(k), v: host_f32(v), shape: [b, t] };
            let out = self.attend_host(host, start, kv_quant, new, context);
            return self.wo.forward(context.upload_rounded_output(out, [b, t, h * hd], dtype, &device));
        }
        let mask = context.mask.as_ref().expect("a device cache needs the attention mask");
        let (k, v) = match kv_quant {
            Some(kvq) => (round_kv(k, kvq), round_kv(v, kvq)),
            None => (k, v),
        };
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
        self.wo.forward(context.round_input(out))
    }

    /// Whether [`Attention::forward_host`] runs this layer over `cache`
    /// ([`placement::attention_on_host`]).
    pub(crate) fn runs_on_host(&self, context: &ForwardContext, cache: &KvCache) -> bool {
        let packed = self.packed().is_some();
        placement::attention_on_host(packed, context.host_rope.is_some(), context.rounds_on_host(), cache.kernel())
    }

    /// [`Attention::forward`] wholly on the host: q/k/v from the packed weights, the host RoPE
    /// tables, the host kernel over the host cache, the output projection; the output is rounded
    /// to the compute dtype. Only where [`Attention::runs_on_host`].
    ///
    /// # Shapes
    /// - `xs`: `[batch, new, dim]`, row-major, values of the compute dtype → `[batch, new, dim]`
    ///
    /// # Panics
    /// Where [`Attention::runs_on_host`] does not hold.
    pub(crate) fn forward_host(
        &self,
        mut xs: Vec<f32>,
        [b, t]: [usize; 2],
        context: &ForwardContext,
        cache: &mut KvCache,
    ) -> Vec<f32> {
        let (h, kvh) = (self.heads, self.kv_heads);
        let kv_quant = cache.quant();
        let (Some([wq, wk, wv, wo]), Some(rope), Some((host, start))) =
            (self.packed(), context.host_rope.as_ref(), cache.claim_host(t))
        else {
            panic!("Attention::forward_host on a layer that does not run on the host");
        };
        let f16 = context.f16;
        context.round_host_input(&mut xs, [b, t, wq.inp()]);
        let (mut q, mut k, v) = (
            wq.forward_rounded(&xs, b * t, f16),
            wk.forward_rounded(&xs, b * t, f16),
            wv.forward_rounded(&xs, b * t, f16),
        );
        rope.apply(&mut q, h);
        rope.apply(&mut k, kvh);
        let out = self.attend_host(host, start, kv_quant, NewColumns { q: &q, k, v, shape: [b, t] }, context);
        wo.forward_rounded(&out, b * t, f16)
    }

    /// The host kernel's part of attention: rounds the new keys and values as the cache's
    /// quantization `kv_quant` says (keys after RoPE), writes them at column `start` of the host
    /// cache, attends, and rounds the output as the activation quantization says where that runs
    /// on the host ([`ForwardContext::round_host_input`]).
    ///
    /// # Shapes
    /// - `new`: see [`NewColumns`]
    /// - returns `[batch, new, heads * head_dim]`, row-major
    fn attend_host(
        &self,
        host: &mut HostKv,
        start: usize,
        kv_quant: Option<KvQuant>,
        new: NewColumns<'_>,
        context: &ForwardContext,
    ) -> Vec<f32> {
        let (h, kvh, hd) = (self.heads, self.kv_heads, self.head_dim);
        let NewColumns { q, mut k, mut v, shape: [b, t] } = new;
        if let Some(kvq) = kv_quant {
            for row in k.chunks_mut(kvh * hd).chain(v.chunks_mut(kvh * hd)) {
                // The row width was checked when the model's run-time quantization was set.
                kvq.round_host(row, hd).expect("KV rows are whole blocks");
            }
        }
        host.write(&k, &v, start, t);
        let mut out = host.attend(q, h, context.positions, start, t);
        context.round_host_input(&mut out, [b, t, h * hd]);
        out
    }
}

/// The new columns' queries, keys and values, for the host kernel ([`Attention::attend_host`]):
/// values of the compute dtype, row-major.
struct NewColumns<'a> {
    /// `[batch, new, heads, head_dim]`.
    q: &'a [f32],
    /// `[batch, new, kv_heads, head_dim]`.
    k: Vec<f32>,
    /// `[batch, new, kv_heads, head_dim]`.
    v: Vec<f32>,
    /// `[batch, new]`.
    shape: [usize; 2],
}
