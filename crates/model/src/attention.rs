//! Grouped-query self-attention: the q/k/v/o projections, optional per-head q/k RMSNorm and RoPE
//! in Burn, then either Burn's composed attention over a device [`KvCache`] or the fused host
//! kernel (`host/attention.rs`) over a host cache, as the cache's [`crate::AttentionKernel`] says;
//! on the CPU backend the whole layer runs on the host where `host::placement` says so.
//!
//! Beyond Llama's (`transformers` `eager_attention_forward` of each family): q/k norms before RoPE
//! (`Qwen3Attention`, `Gemma3Attention`), partial rotary (`Phi3Attention`), a score scale other
//! than `head_dim^-½` (`query_pre_attn_scalar`), attention-logit soft-capping after the scale and
//! before the mask (`Gemma2Attention`), a sliding window per layer (`sliding_window_overlay`) and
//! learned sinks (`GptOssAttention`); no RoPE on NoPE layers (`SmolLM3Attention`,
//! `Llama4TextAttention`: `use_rope = no_rope_layers[layer_idx]`), Llama 4's chunked attention
//! (`chunked_overlay`), its weightless L2 norm of q and k after RoPE (`Llama4TextL2Norm`) and its
//! attention temperature on the NoPE layers' queries (`attn_temperature_tuning`). The host kernel
//! computes Llama's attention only; a layer with any of these ([`Attention::host_kernel_covers`])
//! runs as Burn ops over a device cache.
//!
//! **Invariant: a row's output depends only on its own visible keys ([`Positions::visible`]),
//! never on the other rows of its batch; softmax runs in f32 in every compute dtype.**

use burn::module::{Module, Param};
use burn::tensor::activation::softmax;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Bool, DType, Int, Tensor};
use qdrift_codecs::{ActivationQuant, ActivationScale, KvQuant};

use crate::fake_quant::{InputAmax, InputSite, global_scale, round_activations_global, round_kv};
use crate::host::attention::HostKv;
use crate::host::elem::round_f16;
use crate::host::linear::PackedLinear;
use crate::host::placement::{self, RoundingPath};
use crate::host::rope::HostRope;
use crate::norm::RmsNorm;
use crate::positions::Span;
use crate::rope::rotate_pairs;
use crate::tensors::{host_f32, mul_scalar_opmath, upload, upload_owned};
use crate::{KvCache, Positions, Projection, Projections, Rope};

/// What every layer's attention needs to know about the new columns of a forward pass.
#[derive(Debug)]
pub(crate) struct ForwardContext<'a> {
    /// RoPE tables of each of the model's [`Rope`]s (indexed by [`AttentionSpec::rope`]),
    /// `[batch, new, 1, 2 · pairs]` each (from [`Rope::tables`]); built unless every layer runs on
    /// the host.
    pub rope: Option<Vec<(Tensor<4>, Tensor<4>)>>,
    /// RoPE tables for layers whose q/k/v projections are stacked by head group, keyed by
    /// (rope index, query heads per key/value head): `[batch, new, 1, rep + 2, 2 · pairs]` each
    /// (from [`Rope::grouped_tables`]); built for the keys such layers have.
    pub grouped_rope: Option<Vec<GroupedTables>>,
    /// The pair-swap index of each of the model's [`Rope`]s, `[2 · pairs]` (from
    /// [`Rope::swap_index`], built with the model).
    pub swaps: &'a [Tensor<1, Int>],
    /// The same tables on the host (from [`Rope::host_tables`]), for the host path
    /// ([`Attention::forward`] with host linear layers and a host cache).
    pub host_rope: Option<Vec<HostRope>>,
    /// One mask per distinct [`Span`] of the model's layers (the default: full causal attention),
    /// `[batch, 1, 1, new, cached + new]`, f32, 0 where a key is visible and −∞ where not; built
    /// only for device caches (the host kernel asks `positions`).
    pub mask: Option<Vec<(Span, Tensor<5>)>>,
    /// One boolean mask per distinct [`Span`] and head grouping (`[kv_heads, rep]`) of the
    /// layers with fused caches, `[batch, kv_heads, rep * new, cached + new]`, `true` where a key
    /// is hidden ([`Positions::grouped_hidden`]); built only for fused caches.
    pub fused_mask: Option<Vec<GroupedMask>>,
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
    /// Where the mixture-of-experts layers append the experts they chose
    /// ([`crate::MoeLayer::forward_recording`]), when the caller asked for them.
    pub routing: Option<&'a std::sync::Mutex<crate::routing::RoutingRecord>>,
    /// The layer now running, its static NVFP4 global input scales, and a calibration record.
    pub inputs: InputContext<'a>,
}

/// What a linear layer's input rounding needs to know of its layer ([`InputSite`]).
#[derive(Debug, Default)]
pub(crate) struct InputContext<'a> {
    /// The index of the layer now running (set by the model's layer loop).
    pub layer: std::cell::Cell<usize>,
    /// Per layer, per [`InputSite`]: the static global input scale of NVFP4 activations.
    pub scales: Option<&'a [[f32; 4]]>,
    /// Where a calibration pass takes each input's amax ([`crate::Llama::calibrate_inputs`]).
    pub record: Option<&'a std::sync::Mutex<InputAmax>>,
}

/// RoPE tables for stacked q/k/v and what they were built for: (rope index, `rep`).
pub(crate) type GroupedTables = ((usize, usize), (Tensor<5>, Tensor<5>));

/// A fused-attention mask and what it was built for: the [`Span`] and `[kv_heads, rep]`.
pub(crate) type GroupedMask = ((Span, [usize; 2]), Tensor<4, Bool>);

impl ForwardContext<'_> {
    /// The boolean mask of `span` for heads grouped as `[kv_heads, rep]`, for a fused cache.
    ///
    /// # Panics
    /// If the pass built none for them (it builds one per span and grouping of the layers with
    /// fused caches).
    fn grouped_mask(&self, span: Span, grouping: [usize; 2]) -> &Tensor<4, Bool> {
        let masks = self.fused_mask.as_ref().expect("a fused cache needs the boolean attention mask");
        &masks.iter().find(|(key, _)| *key == (span, grouping)).expect("a mask for every fused layer").1
    }

    /// The device RoPE tables of rope `index`.
    ///
    /// # Panics
    /// If the pass did not build them (`placement::pass_tables` builds them for device caches).
    fn device_tables(&self, index: usize) -> &(Tensor<4>, Tensor<4>) {
        let tables = self.rope.as_ref().expect("device RoPE tables are built unless every layer is on the host");
        &tables[index]
    }

    /// The pair-swap index of rope `index` ([`Rope::swap_index`]).
    fn swap(&self, index: usize) -> &Tensor<1, Int> {
        &self.swaps[index]
    }

    /// The grouped RoPE tables of rope `index` for `rep` query heads per key/value head.
    ///
    /// # Panics
    /// If the pass did not build them (`Llama` builds them for its stacked layers).
    fn grouped_tables(&self, index: usize, rep: usize) -> &(Tensor<5>, Tensor<5>) {
        let tables = self.grouped_rope.as_ref().expect("stacked q/k/v need the grouped RoPE tables");
        &tables.iter().find(|(key, _)| *key == (index, rep)).expect("grouped tables for every stacked layer").1
    }

    /// The mask of `span`, for a device cache.
    ///
    /// # Panics
    /// If the pass built no mask for it (it builds one per span of the model for device caches).
    fn window_mask(&self, span: Span) -> &Tensor<5> {
        let masks = self.mask.as_ref().expect("a device cache needs the attention mask");
        &masks.iter().find(|(w, _)| *w == span).expect("a mask for every span of the model").1
    }

    /// A linear layer's input, rounded as the variant's activation quantization says (unchanged
    /// without one); `site` picks the layer's NVFP4 global input scale. A calibration pass
    /// records the input's amax over the real tokens instead.
    ///
    /// # Shapes
    /// - `x`: `[batch, new, cols]` → same
    pub fn round_input(&self, x: Tensor<3>, site: InputSite) -> Tensor<3> {
        if self.inputs.record.is_some() {
            let [b, t, cols] = x.dims();
            self.record_amax(&host_f32(x.clone()), [b, t, cols], site);
        }
        let global = self.global_scale(site);
        match self.activations() {
            None => x,
            Some((q, RoundingPath::Device)) => round_activations_global(x, q, self.real.as_ref(), global),
            Some((q, RoundingPath::Host)) => {
                let ([b, t, cols], dtype, device) = (x.dims(), x.dtype(), x.device());
                let mut data = host_f32(x);
                self.round_host(&mut data, q, [b, t, cols], global);
                upload(&data, [b, t, cols], dtype, &device)
            }
        }
    }

    /// Whether linear layers' inputs are rounded or recorded (a calibration pass) in this pass.
    pub fn sees_inputs(&self) -> bool {
        self.activations.is_some() || self.inputs.record.is_some()
    }

    /// The running layer's static global input scale at `site`, if the model has them.
    fn global_scale(&self, site: InputSite) -> Option<f32> {
        global_scale(self.inputs.scales, self.inputs.layer.get(), site)
    }

    /// Takes the amax of a linear layer's input over each row's real tokens into the calibration
    /// record.
    fn record_amax(&self, data: &[f32], [b, t, cols]: [usize; 3], site: InputSite) {
        let Some(record) = self.inputs.record else { return };
        let mut amax = 0.0f32;
        for (row, values) in data.chunks(t * cols).take(b).enumerate() {
            let first_real = self.positions.pad[row].saturating_sub(self.start).min(t);
            amax = values[first_real * cols..].iter().fold(amax, |m, v| m.max(v.abs()));
        }
        record.lock().expect("calibration record").record(self.inputs.layer.get(), site, amax);
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
        if self.rounds_on_host() { x } else { self.round_input(x, InputSite::O) }
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
    pub fn round_host_input(&self, data: &mut [f32], [b, t, cols]: [usize; 3], site: InputSite) {
        self.record_amax(data, [b, t, cols], site);
        if let Some((q, RoundingPath::Host)) = self.activations() {
            self.round_host(data, q, [b, t, cols], self.global_scale(site));
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
    fn round_host(&self, data: &mut [f32], q: ActivationQuant, [b, t, cols]: [usize; 3], global: Option<f32>) {
        for (row, values) in data.chunks_mut(t * cols).take(b).enumerate() {
            let first_real = self.positions.pad[row].saturating_sub(self.start).min(t);
            q.round_host_global(&mut values[first_real * cols..], cols, global);
        }
    }
}

/// What a layer's attention computes beyond Llama's, as plain numbers (see [`Attention`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AttentionSpec {
    /// The factor scores are multiplied by; `None`: divided by `√head_dim` (Llama).
    pub scale: Option<f32>,
    /// Attention-logit soft-capping: scaled scores become `cap · tanh(s / cap)` before the mask.
    pub softcap: Option<f32>,
    /// Sliding window: a query at position `p` sees the keys at `p − window < k ≤ p`.
    pub window: Option<usize>,
    /// Which of the model's [`Rope`]s rotates this layer's queries and keys.
    pub rope: usize,
    /// Whether that rope rotates only the first dimensions of each head.
    pub partial_rotary: bool,
    /// A NoPE layer: queries and keys are not rotated (SmolLM3's and Llama 4's `no_rope_layers`).
    pub nope: bool,
    /// Chunked attention: a query sees the keys of its own chunk of positions up to itself.
    pub chunk: Option<usize>,
    /// Llama 4's weightless L2 norm of each query and key head after RoPE, with this epsilon.
    pub l2_norm: Option<f32>,
    /// Llama 4's attention temperature: queries scaled by a factor of their position.
    pub temperature: Option<qdrift_weights::AttnTemperature>,
}

impl AttentionSpec {
    /// The keys this layer's queries see within their causal context.
    pub(crate) fn span(&self) -> Span {
        Span { window: self.window, chunk: self.chunk }
    }

    /// Whether the layer has a feature of SmolLM3 or Llama 4 (NoPE, chunks, L2 norm,
    /// temperature), which only the unstacked Burn path computes.
    pub(crate) fn per_layer_features(&self) -> bool {
        self.nope || self.chunk.is_some() || self.l2_norm.is_some() || self.temperature.is_some()
    }
}

/// Multi-head self-attention with grouped key/value heads (Ainslie et al. 2023, "GQA"): query
/// head `h` attends with key/value head `h / (heads / kv_heads)`, as in llama2.c.
#[derive(Module, Debug)]
pub struct Attention {
    /// The query, key and value projections, in that order: weights `[dim, heads * head_dim]`,
    /// `[dim, kv_heads * head_dim]` and `[dim, kv_heads * head_dim]` (one matmul on wgpu).
    pub qkv: Projections,
    /// Output projection, weight `[heads * head_dim, dim]`.
    pub wo: Projection,
    /// Per-head query RMSNorm, weight `[head_dim]` (Qwen3, Gemma 3), before RoPE.
    pub q_norm: Option<RmsNorm>,
    /// Per-head key RMSNorm, weight `[head_dim]`, before RoPE.
    pub k_norm: Option<RmsNorm>,
    /// Learned sink logits, `[heads]`, in the compute dtype (gpt-oss).
    pub sinks: Option<Param<Tensor<1>>>,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Scale, soft cap, window and RoPE of this layer.
    #[module(skip)]
    pub spec: AttentionSpec,
}

impl Attention {
    /// The four projections' host weights, when all four are stored on the host.
    pub(crate) fn packed(&self) -> Option<[&PackedLinear; 4]> {
        let qkv = self.qkv.packed()?;
        Some([qkv[0], qkv[1], qkv[2], self.wo.packed()?])
    }

    /// Whether the host attention kernel computes this layer: Llama's attention (no q/k norm, no
    /// sinks, `1/√head_dim` scores, no soft cap, no window, whole heads rotated). Biases are the
    /// host linear layers'.
    pub(crate) fn host_kernel_covers(&self) -> bool {
        let AttentionSpec { scale, softcap, window, rope: _, partial_rotary, .. } = self.spec;
        !self.spec.per_layer_features()
            && self.q_norm.is_none()
            && self.k_norm.is_none()
            && self.sinks.is_none()
            && scale.is_none()
            && softcap.is_none()
            && window.is_none()
            && !partial_rotary
    }

    /// Whether Burn's attention op computes this layer ([`crate::AttentionKernel::Fused`]): no
    /// soft cap and no sinks, which the flash kernels do not take (Burn sends a soft cap to its
    /// composed fallback). A scale other than `1/√head_dim` is folded into the queries.
    pub(crate) fn fused_op_covers(&self) -> bool {
        self.sinks.is_none() && self.spec.softcap.is_none()
    }

    /// Attention through Burn's attention op, over the grouped layout of the composed path: the
    /// `rep` query heads sharing a key/value head are one sequence of `rep * new` queries, so
    /// keys and values are never repeated. The op scales by `1/√head_dim`; another scale is
    /// multiplied into the queries first (in the compute dtype: one more rounding of q than the
    /// composed path, which scales the f16 scores).
    ///
    /// # Shapes
    /// - `q`: `[batch, kv_heads, rep * new, head_dim]` (grouped)
    /// - `k`, `v`: `[batch, kv_heads, keys, head_dim]`
    /// - `mask`: `[batch, kv_heads, rep * new, keys]`, `true` where hidden
    /// - returns `[batch, kv_heads, rep * new, head_dim]`
    fn attend_fused(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, mask: &Tensor<4, Bool>) -> Tensor<4> {
        let hd = q.dims()[3];
        let default = (hd as f64).sqrt().recip() as f32;
        let q = match self.spec.scale {
            Some(scale) if scale != default => q.mul_scalar(f64::from(scale) * (hd as f64).sqrt()),
            _ => q,
        };
        let options = AttentionModuleOptions { scale: None, softcap: None, is_causal: false };
        attention(q, k, v, Some(mask.clone()), None, options)
    }

    /// Per-head RMSNorm of queries or keys (`norm` over each head's `head_dim` values), if any.
    ///
    /// # Shapes
    /// - `x`: `[batch, new, heads, head_dim]` → same
    fn norm_heads(norm: Option<&RmsNorm>, x: Tensor<4>) -> Tensor<4> {
        let Some(norm) = norm else {
            return x;
        };
        let [b, t, h, hd] = x.dims();
        norm.forward(x.reshape([b, t * h, hd])).reshape([b, t, h, hd])
    }

    /// Scaled, soft-capped, masked scores → attention weights in f32, with the sinks' column
    /// joining the softmax and then dropped (`GptOssAttention`'s `eager_attention_forward`:
    /// `softmax(cat(s, sink) − max)[..., :-1]`; Burn's softmax subtracts the row maximum, sink
    /// included).
    ///
    /// # Shapes
    /// - `scores`: `[batch, kv_heads, rep, new, keys]` in the compute dtype, unscaled
    /// - `mask`: `[batch, 1, 1, new, keys]`, f32
    /// - returns `[batch, kv_heads, rep, new, keys]`, f32
    fn weights(&self, scores: Tensor<5>, mask: &Tensor<5>) -> Tensor<5> {
        let [b, kvh, rep, t, s] = scores.dims();
        // `scores * self.scaling` (`mul_scalar_opmath`); f32 and f16 divide by √d, as the
        // host kernel does.
        let scores = match self.spec.scale {
            None if scores.dtype() != DType::BF16 => scores.div_scalar((self.head_dim as f64).sqrt()),
            None => mul_scalar_opmath(scores, 1.0 / (self.head_dim as f64).sqrt()),
            Some(scale) => mul_scalar_opmath(scores, f64::from(scale)),
        };
        let mut scores = scores.cast(DType::F32);
        if let Some(cap) = self.spec.softcap {
            let cap = f64::from(cap);
            scores = scores.div_scalar(cap).tanh().mul_scalar(cap);
        }
        let scores = scores + mask.clone();
        let Some(sinks) = &self.sinks else {
            return softmax(scores, 4);
        };
        let sink = sinks.val().cast(DType::F32).reshape([1, kvh, rep, 1, 1]).repeat_dim(0, b).repeat_dim(3, t);
        softmax(Tensor::cat(vec![scores, sink], 4), 4).slice([0..b, 0..kvh, 0..rep, 0..t, 0..s])
    }

    /// Attends from the new positions `x` to everything in `cache` plus themselves, with Burn's
    /// composed attention or the host kernel, as the cache says ([`crate::AttentionKernel`]),
    /// with the layer's RoPE among `ropes`.
    ///
    /// # Shapes
    /// - `x`: `[batch, new, dim]` → `[batch, new, dim]`
    ///
    /// # Panics
    /// If `context` has no mask for a device cache, or if a layer the host kernel does not cover
    /// ([`Attention::host_kernel_covers`]) is given a host cache (`Llama::new_caches_for` gives
    /// such layers device caches).
    pub(crate) fn forward(
        &self,
        x: Tensor<3>,
        ropes: &[Rope],
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
        let x = context.round_input(x, InputSite::Qkv);
        // Queries as [b, t, kvh, rep, hd], the `rep` query heads that share a key/value head side
        // by side, and keys and values as [b, t, kvh, 2, hd], each group's key head then its
        // value head.
        let (q, kv) = match self.qkv.forward_stacked(x.clone()) {
            Some(y) => {
                // One product for all three, laid out by head group ([`Projections::new`]), rotated
                // in one pass (value heads pass through): then every split below is a view.
                let (cos, sin) = context.grouped_tables(self.spec.rope, rep);
                // Two views of the product: the swap reads its own (`rotate_pairs`).
                let (y, alias) = (y.clone().reshape([b, t, kvh, rep + 2, hd]), y.reshape([b, t, kvh, rep + 2, hd]));
                let y = rotate_pairs(y, alias, cos.clone(), sin.clone(), context.swap(self.spec.rope));
                let head = |r: std::ops::Range<usize>| y.clone().slice([0..b, 0..t, 0..kvh, r, 0..hd]);
                (head(0..rep), head(rep..rep + 2))
            }
            None => {
                let rope = &ropes[self.spec.rope];
                let (cos, sin) = context.device_tables(self.spec.rope);
                let [q, k, v]: [Tensor<3>; 3] = self.qkv.forward(x).try_into().expect("three projections");
                let q = Self::norm_heads(self.q_norm.as_ref(), q.reshape([b, t, h, hd]));
                let k = Self::norm_heads(self.k_norm.as_ref(), k.reshape([b, t, kvh, hd]));
                let swap = context.swap(self.spec.rope);
                let (q, k) = if self.spec.nope {
                    (q, k)
                } else {
                    (rope.apply(q, cos, sin, swap), rope.apply(k, cos, sin, swap))
                };
                let (q, k) = match self.spec.l2_norm {
                    Some(eps) => (l2_norm_heads(q, eps), l2_norm_heads(k, eps)),
                    None => (q, k),
                };
                let q = match self.spec.temperature {
                    Some(temperature) => scale_by_temperature(q, temperature, context),
                    None => q,
                };
                let kv = Tensor::cat(vec![k.reshape([b, t, kvh, 1, hd]), v.reshape([b, t, kvh, 1, hd])], 3);
                (q.reshape([b, t, kvh, rep, hd]), kv)
            }
        };
        // The keys (0) or the values (1) of `kv`: [b, t, kvh, 1, hd].
        let half = |kv: &Tensor<5>, i: usize| kv.clone().slice([0..b, 0..t, 0..kvh, i..i + 1, 0..hd]);

        if cache.kernel() == crate::AttentionKernel::Host {
            assert!(self.host_kernel_covers(), "this attention layer needs a device cache (Llama::new_caches_for)");
        }
        if let Some((host, start)) = cache.claim_host(t) {
            // The host kernel over q/k/v computed on the device ([b, t, heads, hd] row-major).
            let device = q.device();
            let (k, v) = (host_f32(half(&kv, 0)), host_f32(half(&kv, 1)));
            let new = NewColumns { q: &host_f32(q), k, v, shape: [b, t] };
            let out = self.attend_host(host, start, kv_quant, new, context);
            return self.wo.forward(context.upload_rounded_output(out, [b, t, h * hd], dtype, &device));
        }
        let kv = match kv_quant {
            Some(kvq) => {
                let round = |x: Tensor<5>| round_kv(x.reshape([b, t, kvh, hd]), kvq).reshape([b, t, kvh, 1, hd]);
                Tensor::cat(vec![round(half(&kv, 0)), round(half(&kv, 1))], 3)
            }
            None => kv,
        };
        let (k, v) = cache.forward(kv);

        // Each group of query heads attends to its own key/value head without repeating the
        // keys: q [b, kvh, rep, t, hd] against k [b, kvh, 1, hd, s], broadcast over the group
        // (one matmul of `rep · t` rows per head when t = 1, as Burn's matmul reinterprets it).
        let q = q.permute([0, 2, 3, 1, 4]);
        let out = if cache.kernel() == crate::AttentionKernel::Fused {
            assert!(self.fused_op_covers(), "this attention layer needs a composed cache (Llama::new_caches_for)");
            let q = q.reshape([b, kvh, rep * t, hd]);
            let out = self.attend_fused(q, k, v, context.grouped_mask(self.spec.span(), [kvh, rep]));
            out.reshape([b, kvh, rep, t, hd])
        } else {
            let mask = context.window_mask(self.spec.span());
            let scores = q.matmul(k.unsqueeze_dim::<5>(2).swap_dims(3, 4));
            let weights = self.weights(scores, mask).cast(dtype);
            weights.matmul(v.unsqueeze_dim::<5>(2))
        }; // [b, kvh, rep, t, hd]
        let out = out.permute([0, 3, 1, 2, 4]).reshape([b, t, h * hd]);
        self.wo.forward(context.round_input(out, InputSite::O))
    }

    /// Whether [`Attention::forward_host`] runs this layer over `cache`
    /// ([`placement::attention_on_host`]).
    pub(crate) fn runs_on_host(&self, context: &ForwardContext, cache: &KvCache) -> bool {
        let layer = placement::HostLayer {
            kernel_covers: self.host_kernel_covers(),
            projections_packed: self.packed().is_some(),
        };
        placement::attention_on_host(layer, context.host_rope.is_some(), context.rounds_on_host(), cache.kernel())
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
            (self.packed(), context.host_rope.as_ref().map(|r| &r[self.spec.rope]), cache.claim_host(t))
        else {
            panic!("Attention::forward_host on a layer that does not run on the host");
        };
        let f16 = context.f16;
        context.round_host_input(&mut xs, [b, t, wq.inp()], InputSite::Qkv);
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
        context.round_host_input(&mut out, [b, t, h * hd], InputSite::O);
        out
    }
}

/// Llama 4's weightless L2 norm of every head (`Llama4TextL2Norm`: `x · rsqrt(mean(x²) + eps)`,
/// computed in f32 and cast back to the compute dtype).
///
/// # Shapes
/// - `x`: `[batch, new, heads, head_dim]` → same
fn l2_norm_heads(x: Tensor<4>, eps: f32) -> Tensor<4> {
    let dtype = x.dtype();
    let x = x.cast(DType::F32);
    let rms = x.clone().powi_scalar(2).mean_dim(3).add_scalar(f64::from(eps)).sqrt();
    x.div(rms).cast(dtype)
}

/// Queries multiplied by Llama 4's attention temperature of their positions (counted from each
/// row's first real token, `Positions::rows`), in f32 and cast back to the compute dtype
/// (`(query_states * attn_scales).to(query_states.dtype)`).
///
/// # Shapes
/// - `q`: `[batch, new, heads, head_dim]` → same
fn scale_by_temperature(
    q: Tensor<4>,
    temperature: qdrift_weights::AttnTemperature,
    context: &ForwardContext,
) -> Tensor<4> {
    let [b, t, _, _] = q.dims();
    let (dtype, device) = (q.dtype(), q.device());
    let factors: Vec<f32> =
        context.positions.rows(context.start, t).iter().flatten().map(|&p| temperature.factor(p)).collect();
    let factors = upload_owned(factors, [b, t, 1, 1], DType::F32, &device);
    q.cast(DType::F32).mul(factors).cast(dtype)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::placement::LinearKernel;
    use crate::linear::ProjectionStore;
    use burn::tensor::Device;

    /// An attention layer of one key/value head shared by `heads` query heads of width 2, with
    /// `spec` and `sinks`; only [`Attention::weights`] is used.
    fn layer(heads: usize, spec: AttentionSpec, sinks: Option<&[f32]>) -> Attention {
        let device = Device::flex();
        let store = ProjectionStore::f32_for(&device, LinearKernel::Burn);
        let p = |out: usize, inp: usize| Projection::new(&vec![0.0; out * inp], [out, inp], None, store);
        Attention {
            qkv: Projections::Each(vec![p(heads * 2, 4), p(2, 4), p(2, 4)]),
            wo: p(4, heads * 2),
            q_norm: None,
            k_norm: None,
            sinks: sinks.map(|s| Param::from_tensor(upload(s, [s.len()], DType::F32, &device))),
            heads,
            kv_heads: 1,
            head_dim: 2,
            spec,
        }
    }

    /// Weights of one query over `scores` (unscaled), no mask.
    fn weights(a: &Attention, scores: &[f32]) -> Vec<f32> {
        let device = Device::flex();
        let (rep, s) = (a.heads, scores.len() / a.heads);
        let scores = upload(scores, [1, 1, rep, 1, s], DType::F32, &device);
        let mask = Tensor::zeros([1, 1, 1, 1, s], (&device, DType::F32));
        host_f32(a.weights(scores, &mask))
    }

    /// Zero scores over 4 keys and a sink logit ln 4: the sink takes half the mass, each key
    /// 1/8; a head without mass in its sink (−30) keeps rows summing to 1.
    #[test]
    fn sinks_take_their_share_of_the_probability_mass() {
        let a = layer(2, AttentionSpec::default(), Some(&[4f32.ln(), -30.0]));
        let w = weights(&a, &[0.0; 8]);
        for (i, &v) in w[..4].iter().enumerate() {
            assert!((v - 0.125).abs() < 1e-6, "key {i}: {v}");
        }
        let rest: f32 = w[4..].iter().sum();
        assert!((rest - 1.0).abs() < 1e-6, "{rest}");
        let plain = weights(&layer(2, AttentionSpec::default(), None), &[0.0; 8]);
        assert!(plain.iter().all(|&v| (v - 0.25).abs() < 1e-6));
    }

    /// Scaled scores `[10, 0]` under a cap of 2 become `[2·tanh(5), 0]` before the softmax.
    #[test]
    fn soft_capping_bounds_the_scores_before_the_softmax() {
        let spec = AttentionSpec { scale: Some(1.0), softcap: Some(2.0), ..AttentionSpec::default() };
        let w = weights(&layer(1, spec, None), &[10.0, 0.0]);
        let capped = 2.0 * 5f64.tanh();
        let want = capped.exp() / (capped.exp() + 1.0);
        assert!((f64::from(w[0]) - want).abs() < 1e-6, "{} vs {want}", w[0]);
        // Uncapped, the same scores put almost all the mass on the first key.
        let spec = AttentionSpec { scale: Some(1.0), ..AttentionSpec::default() };
        assert!(weights(&layer(1, spec, None), &[10.0, 0.0])[0] > 0.9999);
        // The default scale divides by √head_dim: [√2, 0] → [1, 0].
        let w = weights(&layer(1, AttentionSpec::default(), None), &[2f32.sqrt(), 0.0]);
        assert!((f64::from(w[0]) - 1f64.exp() / (1f64.exp() + 1.0)).abs() < 1e-6);
    }
}
