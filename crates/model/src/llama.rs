//! The decoder itself: [`Llama::from_host`] builds a [`Llama`] module tree of [`Block`]s
//! (attention + a [`BlockFfn`], each behind an RMSNorm, with Gemma's post norms where the model has
//! them) from a `HostModel`, whose [`ModelArch`] is the one description of its hyper-parameters;
//! [`Positions`] describes a left-padded batch.
//!
//! Host-kernel coverage (`Block::host_kernels_cover`): Llama's block, with q/k/v/o and FFN biases,
//! runs on the CPU host kernels bit for bit as before. q/k norms, `x·(1 + w)` norms, sandwich norms,
//! partial rotary, another attention scale, attention soft-capping, sinks, sliding windows and a
//! GELU-tanh or clamped-SwiGLU FFN are not in the host kernels: such a layer runs as Burn ops over a
//! device cache (`Llama::new_caches_for` gives it one), and a model with one is not
//! `steps_match_teacher_forcing`.

use burn::module::{Module, Param};
use burn::tensor::{DType, Device, Int, Tensor};
use qdrift_codecs::ActivationScale;
use qdrift_isa::Isa;
use qdrift_weights::{Ffn, HostModel, HostTensor, LayerWeights, ModelArch, NormStyle, WeightSource};

use crate::attention::{Attention, AttentionSpec, ForwardContext};
pub use crate::error::ModelError;
use crate::error::{check, check_linear};
use crate::fake_quant::{InputAmax, RuntimeQuant};

/// What a forward pass records besides its output: whether every position's hidden state is
/// kept, the experts chosen, and linear inputs' amaxes (a calibration pass).
type Recording<'a> = (bool, Option<&'a std::sync::Mutex<RoutingRecord>>, Option<&'a std::sync::Mutex<InputAmax>>);
use crate::ffn::FeedForward;
use crate::host::elem::{add_rounded, is_f16_exact};
use crate::host::placement::{self, AttentionKernel, LinearKernel, RoundingPath};
use crate::linear::ProjectionStore;
use crate::moe::MoeLayer;
use crate::norm::RmsNorm;
use crate::routing::RoutingRecord;
use crate::tensors::{host_f32, upload, upload_owned};
use crate::{KvCache, Positions, Projection, Projections, Rope, TokenEmbedding};

/// What [`Llama::first_overflow`] hands each block's output to: the block's index and the
/// residual stream after it, `[batch, new, dim]` row-major.
type BlockProbe<'a> = dyn FnMut(usize, &[f32]) + 'a;

/// The largest finite value of compute dtype `dtype` (f16's 65504, bf16's ≈ 3.39e38, f32's).
pub(crate) fn dtype_max(dtype: DType) -> f32 {
    match dtype {
        DType::F16 => half::f16::MAX.to_f32(),
        DType::BF16 => half::bf16::MAX.to_f32(),
        _ => f32::MAX,
    }
}

/// `v` rounded to compute dtype `dtype` (nearest even), as f32.
pub(crate) fn round_to_dtype(v: f32, dtype: DType) -> f32 {
    match dtype {
        DType::F16 => half::f16::from_f32(v).to_f32(),
        DType::BF16 => half::bf16::from_f32(v).to_f32(),
        _ => v,
    }
}

/// Where a sequence first leaves the range of its compute dtype ([`Llama::first_overflow`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Overflow {
    /// The block (0-based) whose output first holds the value.
    pub layer: usize,
    /// The first position (0-based, in the sequence) where it does.
    pub position: usize,
    /// The value: infinite, NaN, or beyond the limit.
    pub value: f32,
}

impl Llama {
    /// Builds the model on `device` from host weights, uploading them in `dtype` (f32, f16, or
    /// bf16: a bf16 model runs as Burn ops on every device, `placement::host_kernels`),
    /// with the linear layers stored as the device runs them best ([`LinearKernel::for_device`]).
    ///
    /// Weights are converted to `dtype` on the host (round-to-nearest-even), so an f16 model on
    /// the device holds exactly the f16 rounding of the host values. The q/k/v projections get
    /// the layer's biases when it has them (Qwen2), in the row order of their weights.
    pub fn from_host(host: &HostModel, dtype: DType, device: &Device) -> Result<Llama, ModelError> {
        Self::from_host_with(host, dtype, device, LinearKernel::for_device(device, dtype))
    }

    /// [`Llama::from_host`] from a [`WeightSource`], one part at a time: each part's host
    /// tensors are dropped once the model holds them, so the peak is the model in `dtype` plus
    /// the largest part in f32 (for Llama-3.2-1B in f16: 2.5 GB plus the 1.05 GB embedding),
    /// never a whole f32 host copy.
    ///
    /// # Errors
    /// As [`Llama::from_host`], and [`ModelError::Source`] when the source fails to hand out a
    /// part.
    pub fn from_source(source: &dyn WeightSource, dtype: DType, device: &Device) -> Result<Llama, ModelError> {
        Self::from_source_within(source, dtype, device, None)
    }

    /// [`Llama::from_source`] on a device whose largest buffer holds `max_buffer_bytes`: the
    /// token embedding is held as row ranges ([`TokenEmbedding`]) and a Burn linear layer as
    /// column ranges ([`crate::SplitLinear`]) within it, each value as in one buffer. `None`
    /// (the CPU backend) keeps every tensor whole.
    ///
    /// # Errors
    /// As [`Llama::from_source`].
    pub fn from_source_within(
        source: &dyn WeightSource,
        dtype: DType,
        device: &Device,
        max_buffer_bytes: Option<u64>,
    ) -> Result<Llama, ModelError> {
        let kernel = LinearKernel::for_device(device, dtype);
        Self::build(source, dtype, device, Target { kernel, compact: true, max_buffer_bytes })
    }

    /// [`Llama::from_host`] with the linear layers stored as `kernel` says.
    ///
    /// In f32, tensors whose values are all f16 values (the FP16-rounded reference weights) are
    /// held as f16, which halves their memory and changes no result: host-packed linear weights
    /// (`host_linear`) and, on the CPU backend, the token embedding (its selected rows are
    /// widened, exactly).
    pub fn from_host_with(
        host: &HostModel,
        dtype: DType,
        device: &Device,
        kernel: LinearKernel,
    ) -> Result<Llama, ModelError> {
        Self::build(host, dtype, device, Target { kernel, compact: true, max_buffer_bytes: None })
    }

    /// [`Llama::from_host_with`] and [`Llama::from_source_within`], as `target` says.
    fn build(source: &dyn WeightSource, dtype: DType, device: &Device, target: Target) -> Result<Llama, ModelError> {
        let Target { kernel, compact, max_buffer_bytes } = target;
        if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
            return Err(ModelError::DType(dtype));
        }
        if dtype == DType::BF16 && kernel == LinearKernel::Host {
            // The host kernels store f32 or f16 and round to f16 (`host/elem.rs`).
            return Err(ModelError::DType(dtype));
        }
        // An invalid `QDRIFT_ISA` is refused here, before any kernel runs.
        Isa::from_env()?;
        let arch = &source.arch().clone();
        arch.validate().map_err(ModelError::Arch)?;
        let d = arch.dim;
        let (ropes, rope_of_layer) = layer_ropes(arch)?;
        let up = Uploader {
            dtype,
            device,
            store: ProjectionStore { dtype, device, kernel, compact, max_buffer_bytes },
            // RMSNorm's epsilon, exactly the checkpoint's f32 value.
            eps: f64::from(arch.norm_eps),
            style: arch.block.norm,
        };

        let token_embedding = part(source.token_embedding())?;
        check("model.embed_tokens.weight", &token_embedding, &[arch.vocab_size, d])?;
        let table = &token_embedding.data;
        // An f32 model on the CPU backend keeps an f16-valued table in f16: wgpu adapters without
        // f16 shaders run f32 models, so other devices keep the compute dtype.
        let f16_table = dtype == DType::F32 && compact && placement::f16_table_allowed(device);
        let stored = if f16_table && is_f16_exact(table) { DType::F16 } else { dtype };
        let embedding = TokenEmbedding::new(table, [arch.vocab_size, d], stored, device, max_buffer_bytes);
        // The output layer next, while little else is resident: the two largest host tensors
        // (the embedding and an untied head, in f32) are never held beside the blocks. A tied
        // output layer gets its own copy of the embedding: the lookup wants [vocab, dim] rows, the
        // projection its own layout ([dim, vocab] for Burn, panels for the host).
        let mut kept = arch.tied_embeddings.then_some(token_embedding);
        let untied = part(source.output())?;
        let tied_output = untied.is_none();
        let head = match (untied, kept.take()) {
            (Some(head), _) => head,
            (None, Some(embedding)) => embedding,
            (None, None) => part(source.token_embedding())?,
        };
        let output = up.linear("lm_head", &head, None, [arch.vocab_size, d])?;
        drop(head);
        let layers = (0..arch.n_layers)
            .map(|i| {
                let l = part(source.layer(i))?;
                up.block(arch, i, &l, rope_of_layer[i])
            })
            .collect::<Result<Vec<_>, _>>()?;
        let norm = up.norm("model.norm.weight".into(), &part(source.final_norm())?, d)?;
        let swaps = ropes.iter().map(|r| r.swap_index(device)).collect();
        Ok(Llama {
            embedding,
            layers,
            norm,
            output,
            ropes,
            swaps,
            dtype,
            runtime: RuntimeQuant::none(),
            input_scales: None,
            arch: arch.clone(),
            tied_output,
            attention: None,
        })
    }
}

/// How [`Llama::build`] stores the model: where linear layers are multiplied, whether
/// f16-valued tensors of an f32 model are held as f16 (tests compare both), and the device's
/// largest buffer in bytes (`None`: no limit of its own).
#[derive(Clone, Copy)]
struct Target {
    kernel: LinearKernel,
    compact: bool,
    max_buffer_bytes: Option<u64>,
}

/// A model's output layer and its final-logit soft cap, without the rest ([`Llama::into_head`]).
#[derive(Debug)]
pub struct OutputHead {
    output: Projection,
    softcap: Option<f32>,
}

impl OutputHead {
    /// [`Llama::head`] of the model this came from, bit for bit.
    ///
    /// # Shapes
    /// - `hidden`: `[batch, positions, dim]` in the compute dtype
    /// - returns `[batch, positions, vocab]`, f32
    pub fn forward(&self, hidden: Tensor<3>) -> Tensor<3> {
        head(&self.output, self.softcap, hidden)
    }
}

/// The output layer's logits in f32 (rounded to the compute dtype first), soft-capped.
///
/// # Shapes
/// - `hidden`: `[batch, positions, dim]` → `[batch, positions, vocab]`
fn head(output: &Projection, softcap: Option<f32>, hidden: Tensor<3>) -> Tensor<3> {
    let logits = output.forward_to(hidden, DType::F32);
    match softcap {
        Some(cap) => logits.div_scalar(f64::from(cap)).tanh().mul_scalar(f64::from(cap)),
        None => logits,
    }
}

/// One [`Rope`] per distinct `(theta, scaling)` of the layers ([`ModelArch::layer_rope`]: Gemma
/// 3's local θ for its sliding-window layers), over the rotated width of a head, and each
/// layer's index into them.
fn layer_ropes(arch: &ModelArch) -> Result<(Vec<Rope>, Vec<usize>), ModelError> {
    let mut keys: Vec<(f32, Option<&qdrift_weights::RopeScaling>)> = Vec::new();
    let mut ropes = Vec::new();
    let mut of_layer = Vec::with_capacity(arch.n_layers);
    for layer in 0..arch.n_layers.max(1) {
        let key = arch.layer_rope(layer);
        let index = match keys.iter().position(|k| *k == key) {
            Some(i) => i,
            None => {
                ropes.push(Rope::scaled(arch.rotary_dim(), key.0, key.1).map_err(ModelError::Arch)?);
                keys.push(key);
                keys.len() - 1
            }
        };
        of_layer.push(index);
    }
    Ok((ropes, of_layer))
}

/// How [`Llama::build`] uploads a host model's tensors: the compute dtype, the device, where
/// linear layers are stored, and the norms' epsilon and style.
struct Uploader<'a> {
    dtype: DType,
    device: &'a Device,
    store: ProjectionStore<'a>,
    eps: f64,
    style: NormStyle,
}

impl Uploader<'_> {
    /// A `[n]` vector in the compute dtype, checked.
    fn vector(&self, name: &str, t: &HostTensor, n: usize) -> Result<Param<Tensor<1>>, ModelError> {
        check(name, t, &[n])?;
        Ok(Param::from_tensor(upload(&t.data, [n], self.dtype, self.device)))
    }

    /// An RMSNorm of width `n` in the model's style.
    fn norm(&self, name: String, t: &HostTensor, n: usize) -> Result<RmsNorm, ModelError> {
        Ok(RmsNorm::styled(self.vector(&name, t, n)?, self.eps, self.style))
    }

    /// An optional RMSNorm of width `n` in the model's style.
    fn norm_opt(&self, name: String, t: Option<&HostTensor>, n: usize) -> Result<Option<RmsNorm>, ModelError> {
        t.map(|t| self.norm(name, t, n)).transpose()
    }

    /// A linear layer `[out, inp]` with an optional bias; `name` without its `.weight`.
    fn linear(
        &self,
        name: &str,
        t: &HostTensor,
        b: Option<&HostTensor>,
        [out, inp]: [usize; 2],
    ) -> Result<Projection, ModelError> {
        check_linear(name, t, b, [out, inp])?;
        let bias = b.map(|b| &b.data[..]);
        Ok(Projection::new(&t.data, [out, inp], bias, self.store))
    }

    /// Linear layers over one input (`[name, weight, bias, [out, inp]]` each, as
    /// [`Self::linear`] takes them), checked, stacked in `groups` runs where the device allows
    /// ([`Projections::new`]), or each on its own for `None`.
    fn linears<const N: usize>(
        &self,
        layers: [(&str, &HostTensor, Option<&HostTensor>, [usize; 2]); N],
        groups: Option<usize>,
    ) -> Result<Projections, ModelError> {
        for (name, t, b, shape) in layers {
            check_linear(name, t, b, shape)?;
        }
        let parts = layers.map(|(_, t, b, shape)| (&t.data[..], shape, b.map(|b| &b.data[..])));
        Ok(match groups {
            Some(groups) => Projections::new(&parts, groups, self.store),
            None => Projections::each(&parts, self.store),
        })
    }

    /// Block `i` from its host weights, rotated by rope `rope` of the model's.
    fn block(&self, arch: &ModelArch, i: usize, l: &LayerWeights, rope: usize) -> Result<Block, ModelError> {
        let (d, hd) = (arch.dim, arch.head_dim());
        let (q_out, kv_out) = (arch.q_dim(), arch.kv_dim());
        let p = |s: &str| format!("model.layers.{i}.{s}.weight");
        let attn = |s: &str| format!("model.layers.{i}.self_attn.{s}");
        let block = &arch.block;
        let spec = AttentionSpec {
            scale: block.attn_scale,
            softcap: block.attn_softcap,
            window: arch.window(i),
            rope,
            partial_rotary: arch.rotary_dim() < hd,
            nope: !arch.uses_rope(i),
            chunk: arch.chunk(i),
            l2_norm: arch.qk_l2_norm(i),
            temperature: arch.temperature(i),
        };
        let sinks = l.sinks.as_ref().map(|s| self.vector(&attn("sinks"), s, arch.n_heads)).transpose()?;
        // q, k and v stacked by key/value head group, rotated together (`Attention::forward`):
        // only where no per-head norm or partial rotation treats q and k apart from v.
        let stack_qkv = l.q_norm.is_none() && l.k_norm.is_none() && !spec.partial_rotary && !spec.per_layer_features();
        Ok(Block {
            attn_norm: self.norm(p("input_layernorm"), &l.attn_norm, d)?,
            attn: Attention {
                qkv: self.linears(
                    [
                        (&attn("q_proj"), &l.wq, l.bq.as_ref(), [q_out, d]),
                        (&attn("k_proj"), &l.wk, l.bk.as_ref(), [kv_out, d]),
                        (&attn("v_proj"), &l.wv, l.bv.as_ref(), [kv_out, d]),
                    ],
                    stack_qkv.then_some(arch.n_kv_heads),
                )?,
                wo: self.linear(&attn("o_proj"), &l.wo, l.bo.as_ref(), [d, q_out])?,
                q_norm: self.norm_opt(attn("q_norm.weight"), l.q_norm.as_ref(), hd)?,
                k_norm: self.norm_opt(attn("k_norm.weight"), l.k_norm.as_ref(), hd)?,
                sinks,
                heads: arch.n_heads,
                kv_heads: arch.n_kv_heads,
                head_dim: hd,
                spec,
            },
            post_attn_norm: self.norm_opt(p("post_attention_layernorm"), l.post_attn_norm.as_ref(), d)?,
            ffn_norm: self.norm(
                p(if block.sandwich_norms { "pre_feedforward_layernorm" } else { "post_attention_layernorm" }),
                &l.ffn_norm,
                d,
            )?,
            ffn: self.ffn(arch, i, l)?,
            post_ffn_norm: self.norm_opt(p("post_feedforward_layernorm"), l.post_ffn_norm.as_ref(), d)?,
        })
    }

    /// Layer `i`'s feed-forward layer: dense, or a mixture of experts ([`MoeLayer`]) where the
    /// architecture says so ([`ModelArch::has_experts`]) and the weights agree.
    fn ffn(&self, arch: &ModelArch, i: usize, l: &LayerWeights) -> Result<BlockFfn, ModelError> {
        let spec = arch.moe.as_ref().filter(|_| arch.has_experts(i));
        let mlp = match (&l.ffn, spec) {
            (Ffn::Dense(m), None) => m,
            (Ffn::Experts(e), Some(spec)) => {
                check(&format!("model.layers.{i}.mlp.gate.weight"), &e.router, &[spec.n_experts, arch.dim])?;
                let layer = MoeLayer::from_host(i, e, spec, arch.block.activation, self.store)?;
                return Ok(BlockFfn::Experts(layer));
            }
            (Ffn::Experts(_), None) => {
                return Err(ModelError::Arch(format!(
                    "layer {i} has experts, but the architecture says its feed-forward layer is dense"
                )));
            }
            (Ffn::Dense(_), Some(_)) => {
                return Err(ModelError::Arch(format!(
                    "layer {i} has a dense feed-forward layer, but the architecture says it is a mixture of experts"
                )));
            }
        };
        let (d, hid) = (arch.dim, arch.hidden_dim);
        let w = |s: &str| format!("model.layers.{i}.mlp.{s}");
        Ok(BlockFfn::Dense(FeedForward {
            gate_up: self.linears(
                [
                    (&w("gate_proj"), &mlp.gate, mlp.gate_bias.as_ref(), [hid, d]),
                    (&w("up_proj"), &mlp.up, mlp.up_bias.as_ref(), [hid, d]),
                ],
                Some(1),
            )?,
            down: self.linear(&w("down_proj"), &mlp.down, mlp.down_bias.as_ref(), [d, hid])?,
            activation: arch.block.activation,
        }))
    }
}

/// A part from a [`WeightSource`], its failure as [`ModelError::Source`].
fn part<T>(r: Result<T, qdrift_weights::SourceError>) -> Result<T, ModelError> {
    r.map_err(ModelError::Source)
}

/// A block's feed-forward layer: dense, or a mixture of experts (`moe.rs`).
// One per block, built once: the size difference between the variants costs nothing, and Burn's
// `Module` derive needs the variants unboxed.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum BlockFfn {
    /// One gated feed-forward layer.
    Dense(FeedForward),
    /// A router and its experts, each run on the rows routed to it.
    Experts(MoeLayer),
}

impl BlockFfn {
    /// # Shapes
    /// - `x`: `[batch, seq, dim]` → `[batch, seq, dim]`
    pub(crate) fn forward(&self, x: Tensor<3>, context: &ForwardContext) -> Tensor<3> {
        match self {
            Self::Dense(f) => f.forward(x, context),
            Self::Experts(m) => m.forward(x, context),
        }
    }

    /// Whether [`BlockFfn::forward_host`] runs this layer.
    fn runs_on_host(&self, context: &ForwardContext) -> bool {
        match self {
            Self::Dense(f) => f.runs_on_host(context),
            Self::Experts(m) => m.runs_on_host(context),
        }
    }

    /// Whether the layer is packed on the host and covered by the host kernels.
    fn packed_on_host(&self) -> bool {
        match self {
            Self::Dense(f) => f.packed_on_host(),
            Self::Experts(m) => m.packed_on_host(),
        }
    }

    /// [`BlockFfn::forward`] on host values; only where [`BlockFfn::runs_on_host`].
    ///
    /// # Shapes
    /// - `xs`: `[batch, seq, dim]`, row-major → `[batch, seq, dim]`
    fn forward_host(&self, xs: Vec<f32>, shape: [usize; 2], context: &ForwardContext) -> Vec<f32> {
        match self {
            Self::Dense(f) => f.forward_host(xs, shape, context),
            Self::Experts(m) => m.forward_host(xs, shape, context, context.routing),
        }
    }

    /// The layer's host weights.
    fn host_weights(&self) -> Ffn {
        match self {
            Self::Dense(f) => Ffn::Dense(f.host_weights()),
            Self::Experts(m) => Ffn::Experts(m.host_weights()),
        }
    }
}

/// One pre-norm transformer block, with Gemma's sandwich norms when it has them
/// (`Gemma2DecoderLayer.forward`: the attention and FFN outputs are normalized again before
/// their residual sums).
#[derive(Module, Debug)]
pub struct Block {
    /// Norm before attention.
    pub attn_norm: RmsNorm,
    /// Self-attention.
    pub attn: Attention,
    /// Norm of the attention output before its residual sum (Gemma's `post_attention_layernorm`).
    pub post_attn_norm: Option<RmsNorm>,
    /// Norm before the feed-forward layer.
    pub ffn_norm: RmsNorm,
    /// Feed-forward layer.
    pub ffn: BlockFfn,
    /// Norm of the FFN output before its residual sum (Gemma's `post_feedforward_layernorm`).
    pub post_ffn_norm: Option<RmsNorm>,
}

impl Block {
    /// # Shapes
    /// - `x`: `[batch, new, dim]` → `[batch, new, dim]`
    fn forward(&self, x: Tensor<3>, ropes: &[Rope], context: &ForwardContext, cache: &mut KvCache) -> Tensor<3> {
        let mut a = self.attn.forward(self.attn_norm.forward(x.clone()), ropes, context, cache);
        if let Some(norm) = &self.post_attn_norm {
            a = norm.forward(a);
        }
        let h = x + a;
        let mut f = self.ffn.forward(self.ffn_norm.forward(h.clone()), context);
        if let Some(norm) = &self.post_ffn_norm {
            f = norm.forward(f);
        }
        h + f
    }

    /// Whether the host kernels compute every part of this block: Llama's attention
    /// ([`Attention::host_kernel_covers`]), `x̂·w` norms and no sandwich norms, a SwiGLU FFN.
    /// Any other block falls back to Burn's ops (its attention over a device cache).
    fn host_kernels_cover(&self) -> bool {
        self.attn.host_kernel_covers()
            && self.attn_norm.runs_on_host()
            && self.ffn_norm.runs_on_host()
            && self.post_attn_norm.is_none()
            && self.post_ffn_norm.is_none()
    }

    /// Whether [`Block::forward_host`] runs this block over `cache`: the host kernels cover it
    /// and its attention and its feed-forward layer both run on the host.
    fn runs_on_host(&self, context: &ForwardContext, cache: &KvCache) -> bool {
        self.host_kernels_cover() && self.attn.runs_on_host(context, cache) && self.ffn.runs_on_host(context)
    }

    /// [`Block::forward`] on host values, in place: the same operations (the norms as
    /// [`RmsNorm::forward`] runs them on the CPU backend, each residual sum rounded to the
    /// compute dtype as a tensor of it stores it), so the same values. Only where
    /// [`Block::runs_on_host`].
    ///
    /// # Shapes
    /// - `x`: `[batch, new, dim]`, row-major, values of the compute dtype
    fn forward_host(&self, x: &mut [f32], [b, t]: [usize; 2], context: &ForwardContext, cache: &mut KvCache) {
        let f16 = context.f16;
        let a = self.attn.forward_host(self.attn_norm.forward_host(x, f16), [b, t], context, cache);
        add_rounded(x, &a, f16);
        let f = self.ffn.forward_host(self.ffn_norm.forward_host(x, f16), [b, t], context);
        add_rounded(x, &f, f16);
    }

    /// The block's host weights.
    fn host_weights(&self) -> LayerWeights {
        let vector = |p: &Param<Tensor<1>>| {
            let data = host_f32(p.val());
            HostTensor { shape: vec![data.len()], data }
        };
        let norm = |n: Option<&RmsNorm>| n.map(|n| vector(&n.weight));
        let a = &self.attn;
        let mut qkv = a.qkv.host_weights().into_iter();
        let (Some((wq, bq)), Some((wk, bk)), Some((wv, bv))) = (qkv.next(), qkv.next(), qkv.next()) else {
            unreachable!("an attention layer has q, k and v projections");
        };
        let (wo, bo) = a.wo.host_weights();
        LayerWeights {
            attn_norm: vector(&self.attn_norm.weight),
            wq,
            wk,
            wv,
            wo,
            bq,
            bk,
            bv,
            bo,
            q_norm: norm(a.q_norm.as_ref()),
            k_norm: norm(a.k_norm.as_ref()),
            sinks: a.sinks.as_ref().map(vector),
            post_attn_norm: norm(self.post_attn_norm.as_ref()),
            ffn_norm: vector(&self.ffn_norm.weight),
            post_ffn_norm: norm(self.post_ffn_norm.as_ref()),
            ffn: self.ffn.host_weights(),
        }
    }
}
/// A decoder of the Llama family and its descendants (`ModelArch`) on a device.
#[derive(Module, Debug)]
pub struct Llama {
    /// Token embedding, `[vocab, dim]`, in the compute dtype, or in f16 in an f32 model on the
    /// CPU backend whose embeddings are all f16 values (the rows a forward pass selects are
    /// widened, exactly).
    pub embedding: TokenEmbedding,
    /// The blocks.
    pub layers: Vec<Block>,
    /// Final norm.
    pub norm: RmsNorm,
    /// Output layer, weight `[dim, vocab]`.
    pub output: Projection,
    /// The rotary embeddings of the layers, one per distinct `(theta, scaling)`
    /// ([`ModelArch::layer_rope`]); each layer's attention names its own
    /// (`AttentionSpec::rope`).
    #[module(skip)]
    pub ropes: Vec<Rope>,
    /// Each rope's pair-swap index on the model's device ([`Rope::swap_index`]), uploaded once.
    #[module(skip)]
    swaps: Vec<Tensor<1, Int>>,
    /// Compute dtype: the dtype the weights were converted to (an f32 model may hold f16-valued
    /// tensors as f16, see [`Llama::from_host_with`]).
    #[module(skip)]
    pub dtype: DType,
    /// What is rounded at run time (activations, KV cache); nothing by default. Set it with
    /// [`Llama::set_runtime_quant`], which checks it against the architecture.
    #[module(skip)]
    runtime: RuntimeQuant,
    /// Per layer, per [`crate::InputSite`]: the static global input scales of NVFP4 activations
    /// ([`Llama::set_input_scales`]); none by default.
    #[module(skip)]
    input_scales: Option<std::sync::Arc<[[f32; 4]]>>,
    /// The architecture the model was built from: its one description of the hyper-parameters
    /// (and of the host model [`Llama::host_weights`] returns).
    #[module(skip)]
    pub arch: ModelArch,
    /// Whether that model's output layer was its token embedding (`output: None`).
    #[module(skip)]
    tied_output: bool,
    /// The attention kernel [`Llama::new_caches`] asks for; `None`: the device's default
    /// ([`AttentionKernel::for_device`]). Set with [`Llama::set_attention_kernel`].
    #[module(skip)]
    attention: Option<AttentionKernel>,
}

impl Llama {
    /// The dtype the model computes in.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Whether a decoding step's logits are, bit for bit, what teacher forcing computes for the
    /// same position: every layer runs on the host over host caches (`Block::forward_host`) and
    /// so does the output layer, where each value depends only on its own row and position, never
    /// on how many columns a call carries (host linear layers, the host attention kernel and
    /// RMSNorm work row by row; activation scales never span rows or chunks). The evaluation
    /// then takes the reference's statistics from its decoding steps instead of a second pass.
    pub fn steps_match_teacher_forcing(&self) -> bool {
        // What `forward_hidden` asks of each layer (`Block::runs_on_host`), for the caches
        // `new_caches` makes on this device.
        let on_host = self.norm.runs_on_host()
            && self
                .layers
                .iter()
                .all(|l| l.host_kernels_cover() && l.attn.packed().is_some() && l.ffn.packed_on_host());
        placement::steps_match_teacher_forcing(self.host_layers(), &self.device(), self.dtype, on_host)
    }

    /// Whether layers may run on the host ([`placement::host_layers`]).
    fn host_layers(&self) -> bool {
        placement::host_layers(self.output.packed().is_some(), self.runtime.activations.map(|_| self.runtime.path))
    }

    /// Rounds activations and/or the KV cache at run time from now on (caches made afterwards
    /// carry the KV rounding).
    ///
    /// # Errors
    /// [`ModelError::Runtime`] when a ggml KV-cache format does not fit the cache rows
    /// (`kv_heads × head_dim` not a multiple of 32), or per-token-group activation scales do not
    /// divide a linear layer's input width (`dim` for q/k/v and gate/up, `heads × head_dim` for o,
    /// `hidden_dim` for down, `expert_hidden` for an expert's down).
    pub fn set_runtime_quant(&mut self, runtime: RuntimeQuant) -> Result<(), ModelError> {
        if let Some(kv) = runtime.kv_cache {
            kv.check_row(self.arch.n_kv_heads, self.arch.head_dim())?;
        }
        if let Some(a) = runtime.activations {
            let c = &self.arch;
            let experts = c.moe.as_ref().map(|m| m.expert_hidden);
            for cols in [c.dim, c.n_heads * c.head_dim(), c.hidden_dim].into_iter().chain(experts) {
                a.check_width(cols)?;
            }
        }
        self.runtime = runtime;
        Ok(())
    }

    /// Rounds what `recipe` quantizes at run time (its activation and KV-cache parts), on the path
    /// this model's device runs best ([`RoundingPath::for_device`]); a weight-only recipe rounds
    /// nothing. The weights themselves are the caller's: build the model from the recipe's
    /// quantized weights.
    ///
    /// # Errors
    /// As [`Llama::set_runtime_quant`].
    pub fn apply_runtime(&mut self, recipe: &qdrift_codecs::Recipe) -> Result<(), ModelError> {
        let path = RoundingPath::for_device(&self.device(), self.dtype);
        self.set_runtime_quant(RuntimeQuant { activations: recipe.activations, kv_cache: recipe.kv_cache, path })
    }

    /// The device the weights live on.
    pub fn device(&self) -> Device {
        self.embedding.device()
    }

    /// One empty key-value cache per layer for `batch` rows and `capacity` positions, for the
    /// attention kernel set with [`Llama::set_attention_kernel`], else the one the model's
    /// device runs best ([`AttentionKernel::for_device`]).
    pub fn new_caches(&self, batch: usize, capacity: usize) -> Vec<KvCache> {
        let kernel = self.attention.unwrap_or_else(|| AttentionKernel::for_device(&self.device(), self.dtype));
        self.new_caches_for(batch, capacity, kernel)
    }

    /// The attention kernel [`Llama::new_caches`] asks for from now on (layers it does not cover
    /// still get a composed cache, see [`Llama::new_caches_for`]).
    ///
    /// # Panics
    /// If `kernel` is [`AttentionKernel::Fused`] and the model computes on the CPU backend, whose
    /// attention op is the composed fallback.
    pub fn set_attention_kernel(&mut self, kernel: AttentionKernel) {
        assert!(
            kernel != AttentionKernel::Fused || !placement::is_cpu(&self.device()),
            "the fused attention op is for wgpu"
        );
        self.attention = Some(kernel);
    }

    /// [`Llama::new_caches`] for a given attention kernel; a layer the host attention kernel
    /// does not cover (q/k norms, sinks, soft caps, windows, partial rotary, another scale; every
    /// layer of a bf16 model) gets a device cache whatever `kernel` says
    /// (`placement::cache_kernel`).
    pub fn new_caches_for(&self, batch: usize, capacity: usize, kernel: AttentionKernel) -> Vec<KvCache> {
        let device = self.device();
        let (kvh, hd) = (self.arch.n_kv_heads, self.arch.head_dim());
        let quant = self.runtime.kv_cache;
        self.layers
            .iter()
            .map(|l| {
                let covers = l.attn.host_kernel_covers() && self.dtype != DType::BF16;
                let kernel = placement::cache_kernel(kernel, covers, l.attn.fused_op_covers());
                KvCache::new([batch, kvh, capacity, hd], self.dtype, &device, kernel).with_quant(quant)
            })
            .collect()
    }

    /// The distinct spans (sliding windows, chunks) of the layers, each once.
    fn spans(&self) -> Vec<crate::positions::Span> {
        let mut spans = Vec::new();
        for l in &self.layers {
            if !spans.contains(&l.attn.spec.span()) {
                spans.push(l.attn.spec.span());
            }
        }
        spans
    }

    /// Runs new token columns through the model, appending them to the caches.
    ///
    /// The caches all hold `start` columns; `tokens` are columns `start..start + new` of the
    /// batch laid out by `positions`. With `all_logits` the logits of every new column are
    /// returned, else only those of the last one (what generation needs). Equal to
    /// [`Llama::head`] of [`Llama::forward_hidden`].
    ///
    /// # Shapes
    /// - `tokens`: `[batch, new]`
    /// - returns `[batch, new, vocab]` (or `[batch, 1, vocab]`), always f32
    pub fn forward(
        &self,
        tokens: Tensor<2, Int>,
        positions: &Positions,
        caches: &mut [KvCache],
        all_logits: bool,
    ) -> Tensor<3> {
        self.head(self.forward_hidden(tokens, positions, caches, all_logits))
    }

    /// [`Llama::forward`] up to and including the final norm: the hidden states the output
    /// layer turns into logits. Keeping these (`dim` numbers per position) instead of the logits
    /// (`vocab` numbers) and applying [`Llama::head`] later gives the same logits bit for bit.
    ///
    /// # Shapes
    /// - `tokens`: `[batch, new]`
    /// - returns `[batch, new, dim]` (or `[batch, 1, dim]`), in the compute dtype
    pub fn forward_hidden(
        &self,
        tokens: Tensor<2, Int>,
        positions: &Positions,
        caches: &mut [KvCache],
        all_positions: bool,
    ) -> Tensor<3> {
        self.forward_hidden_recording(tokens, positions, caches, all_positions, None)
    }

    /// [`Llama::forward_hidden`], appending to `routing` (when given) the experts each
    /// mixture-of-experts layer chose for every new column: one [`crate::LayerRoutes`] per such
    /// layer, `[batch, new, top_k]` expert ids in order of weight, in the order the layers ran.
    /// The choices are the same with or without a record.
    ///
    /// # Shapes
    /// - `tokens`: `[batch, new]`
    /// - returns `[batch, new, dim]` (or `[batch, 1, dim]`), in the compute dtype
    pub fn forward_hidden_recording(
        &self,
        tokens: Tensor<2, Int>,
        positions: &Positions,
        caches: &mut [KvCache],
        all_positions: bool,
        routing: Option<&std::sync::Mutex<RoutingRecord>>,
    ) -> Tensor<3> {
        self.forward_probed(tokens, positions, caches, (all_positions, routing, None), None)
    }

    /// Where one sequence first leaves the range of the compute dtype: its tokens run from the
    /// start (a fresh cache, batch 1) and the residual stream after each block is read back; the
    /// first block whose output holds a value that is not finite or exceeds the compute dtype's
    /// largest (65504 in an f16 model) in magnitude, and the first position there. `None` when every
    /// block's output stays within it (a non-finite logit then comes from the final norm or the
    /// output layer). A diagnosis after a failure, not a hot path: every block's output crosses
    /// to the host.
    ///
    /// # Shapes
    /// - `tokens`: `[n]`, `n ≥ 1`
    pub fn first_overflow(&self, tokens: &[u32]) -> Option<Overflow> {
        if tokens.is_empty() {
            return None;
        }
        let limit = dtype_max(self.dtype);
        let device = self.device();
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let input = Tensor::<2, Int>::from_data(burn::tensor::TensorData::new(ids, [1, tokens.len()]), &device);
        let positions = Positions::left_padded(&[tokens.len()]);
        let mut caches = self.new_caches(1, tokens.len());
        let dim = self.arch.dim;
        let mut found = None;
        let mut probe = |layer: usize, xs: &[f32]| {
            if found.is_some() {
                return;
            }
            if let Some(i) = xs.iter().position(|x| x.is_nan() || x.abs() > limit) {
                found = Some(Overflow { layer, position: i / dim, value: xs[i] });
            }
        };
        self.forward_probed(input, &positions, &mut caches, (true, None, None), Some(&mut probe));
        found
    }

    /// The largest magnitude of every linear layer's input ([`crate::InputSite`]) over `prompts`,
    /// each run alone from a fresh cache as one prompt pass (batch 1: no padding), in order:
    /// the calibration of NVFP4's static global input scales (compressed-tensors'
    /// `input_global_scale`, observed by llm-compressor's `static_minmax` over calibration
    /// samples). Deterministic: the same prompts give the same record. The model's own run-time
    /// roundings apply, so calibrate a model without them (the reference) to observe its
    /// unrounded inputs.
    ///
    /// # Shapes
    /// - `prompts`: token ids, each non-empty
    pub fn calibrate_inputs(&self, prompts: &[Vec<u32>]) -> InputAmax {
        let record = std::sync::Mutex::new(InputAmax::default());
        let device = self.device();
        for prompt in prompts.iter().filter(|p| !p.is_empty()) {
            let ids: Vec<i32> = prompt.iter().map(|&t| t as i32).collect();
            let input = Tensor::<2, Int>::from_data(burn::tensor::TensorData::new(ids, [1, prompt.len()]), &device);
            let positions = Positions::left_padded(&[prompt.len()]);
            let mut caches = self.new_caches(1, prompt.len());
            self.forward_probed(input, &positions, &mut caches, (false, None, Some(&record)), None);
        }
        let mut amax = record.into_inner().expect("calibration record");
        amax.sequences = prompts.iter().filter(|p| !p.is_empty()).count();
        amax.layers.resize(self.layers.len(), [0.0; 4]);
        amax
    }

    /// The static global input scale of every linear layer's NVFP4 activations from now on,
    /// from a calibration record ([`Llama::calibrate_inputs`]; [`InputAmax::global_scales`]).
    /// Without one an NVFP4 input has no global scale (compressed-tensors' uncalibrated layer).
    pub fn set_input_scales(&mut self, amax: &InputAmax) {
        self.set_global_input_scales(amax.global_scales());
    }

    /// The static global input scales themselves (per layer, per [`crate::InputSite`] in
    /// [`crate::InputSite::ALL`]'s order; compressed-tensors' `input_global_scale`, the divisor of
    /// the input), as a W4A4 checkpoint stores them.
    pub fn set_global_input_scales(&mut self, scales: Vec<[f32; 4]>) {
        self.input_scales = Some(std::sync::Arc::from(scales));
    }

    /// [`Llama::forward_hidden_recording`], handing each block's output (the residual stream,
    /// `[batch, new, dim]` row-major, as f32) to `probe` with the block's index.
    fn forward_probed(
        &self,
        tokens: Tensor<2, Int>,
        positions: &Positions,
        caches: &mut [KvCache],
        (all_positions, routing, calibration): Recording<'_>,
        mut probe: Option<&mut BlockProbe<'_>>,
    ) -> Tensor<3> {
        let [b, t] = tokens.dims();
        let start = caches.first().map_or(0, KvCache::len);
        let device = tokens.device();
        let rows = positions.rows(start, t);
        // Host linear layers over a host cache run their layer's attention on the host (unless
        // activations are rounded on the device), with the host RoPE tables; every other layer
        // uses Burn's.
        let tables = placement::pass_tables(self.host_layers(), caches.iter().map(KvCache::kernel));
        let mask = tables
            .mask
            .then(|| self.spans().into_iter().map(|w| (w, positions.window_mask(start, t, w, &device))).collect());
        let fused_mask = tables.fused_mask.then(|| {
            let mut masks: Vec<crate::attention::GroupedMask> = Vec::new();
            for (layer, cache) in self.layers.iter().zip(caches.iter()) {
                let a = &layer.attn;
                let key = (a.spec.span(), [a.kv_heads, a.heads / a.kv_heads]);
                if cache.kernel() == AttentionKernel::Fused && !masks.iter().any(|(k, _)| *k == key) {
                    masks.push((key, positions.grouped_hidden((start, t), key.0, key.1, &device)));
                }
            }
            masks
        });
        let activations = self.runtime.activations.map(|q| (q, self.runtime.path));
        let real = match activations {
            Some((q, RoundingPath::Device)) if q.scale == ActivationScale::Tensor && start == 0 => {
                Some(positions.real(start, t, &device))
            }
            _ => None,
        };
        let f16 = self.dtype == DType::F16;
        let host_rope = tables.host_rope.then(|| self.ropes.iter().map(|r| r.host_tables(&rows, f16)).collect());
        // Layers with stacked q/k/v rotate with the grouped tables; the plain ones are built only
        // where some layer is not stacked.
        let stacked = |a: &Attention| matches!(a.qkv, Projections::Stacked(_));
        let rope = (tables.device_rope && !self.layers.iter().all(|l| stacked(&l.attn)))
            .then(|| self.ropes.iter().map(|r| r.tables(&rows, self.dtype, &device)).collect());
        let grouped_rope = tables.device_rope.then(|| {
            let mut grouped: Vec<crate::attention::GroupedTables> = Vec::new();
            for a in self.layers.iter().map(|l| &l.attn).filter(|a| stacked(a)) {
                let key = (a.spec.rope, a.heads / a.kv_heads);
                if !grouped.iter().any(|(k, _)| *k == key) {
                    grouped.push((key, self.ropes[key.0].grouped_tables(&rows, key.1, self.dtype, &device)));
                }
            }
            grouped
        });
        let context = ForwardContext {
            rope,
            grouped_rope,
            swaps: &self.swaps,
            host_rope,
            mask,
            fused_mask,
            positions,
            start,
            activations,
            real,
            f16,
            routing,
            inputs: crate::attention::InputContext {
                layer: std::cell::Cell::new(0),
                scales: self.input_scales.as_deref(),
                record: calibration,
            },
        };

        let dim = self.embedding.dims()[1];
        let mut x = self.embedding.select(tokens.reshape([b * t]));
        if let Some(scale) = self.arch.embedding_scale {
            // Gemma's normalizer, a value of the compute dtype (`Gemma3TextScaledWordEmbedding`:
            // `embed_scale.to(self.weight.dtype)`), multiplied in the compute dtype.
            let scale = round_to_dtype(scale, self.dtype);
            x = x.cast(self.dtype).mul_scalar(f64::from(scale));
        }
        let blocks = self.layers.iter().zip(caches.iter());
        let layers_on_host = blocks.map(|(layer, cache)| layer.runs_on_host(&context, cache));
        if self.norm.runs_on_host() && placement::residual_on_host(layers_on_host) {
            // The residual stream stays on the host from the embedding to the final norm: no
            // tensor op, read-back or upload between the layers.
            let mut xs = host_f32(x);
            for (i, (layer, cache)) in self.layers.iter().zip(caches.iter_mut()).enumerate() {
                context.inputs.layer.set(i);
                layer.forward_host(&mut xs, [b, t], &context, cache);
                if let Some(p) = probe.as_mut() {
                    p(i, &xs);
                }
            }
            let (xs, kept) = if all_positions {
                (xs, t)
            } else {
                // Each row's last column.
                (xs.chunks_exact(t * dim).flat_map(|row| &row[(t - 1) * dim..]).copied().collect(), 1)
            };
            return upload_owned(self.norm.forward_host(&xs, f16), [b, kept, dim], self.dtype, &device);
        }
        if x.dtype() != self.dtype {
            // An f16 table of an f32 model: widening is exact.
            x = x.cast(self.dtype);
        }
        let mut x = x.reshape([b, t, dim]);
        for (i, (layer, cache)) in self.layers.iter().zip(caches.iter_mut()).enumerate() {
            context.inputs.layer.set(i);
            x = layer.forward(x, &self.ropes, &context, cache);
            if let Some(p) = probe.as_mut() {
                p(i, &host_f32(x.clone()));
            }
        }
        if !all_positions {
            x = x.slice([0..b, t - 1..t, 0..dim]);
        }
        self.norm.forward(x)
    }

    /// The output layer: logits from [`Llama::forward_hidden`]'s hidden states, soft-capped
    /// in f32 when the model caps them (`Gemma2ForCausalLM.forward`: `cap · tanh(logits / cap)`).
    ///
    /// # Shapes
    /// - `hidden`: `[batch, positions, dim]` in the compute dtype
    /// - returns `[batch, positions, vocab]`, f32
    pub fn head(&self, hidden: Tensor<3>) -> Tensor<3> {
        head(&self.output, self.arch.final_logit_softcap, hidden)
    }

    /// The output layer alone, the rest of the model dropped: what turns a run's kept
    /// final-norm hidden states into logits ([`OutputHead::forward`] is [`Llama::head`]) once the
    /// model itself need not stay resident.
    pub fn into_head(self) -> OutputHead {
        OutputHead { output: self.output, softcap: self.arch.final_logit_softcap }
    }

    /// The model's weights as a host model: the architecture it was built from and every value
    /// it holds, as f32 (exact), in [`HostModel`]'s layout, whichever storage holds them (host
    /// panels, Burn's `[in, out]` linear weights, an f16 table). `output` is `None` when the model
    /// was built from a host model without one (tied).
    ///
    /// For a host model whose values are all values of the compute dtype (f16-rounded weights in
    /// f16 or f32) this gives that host model back exactly, so a caller may drop it once the
    /// model is built and ask for it again. Only the result is allocated, plus the read-back of
    /// one tensor at a time.
    pub fn host_weights(&self) -> HostModel {
        let vector = |p: &Param<Tensor<1>>| {
            let data = host_f32(p.val());
            HostTensor { shape: vec![data.len()], data }
        };
        let [vocab, dim] = self.embedding.dims();
        let token_embedding = HostTensor { shape: vec![vocab, dim], data: self.embedding.host_values() };
        let layers = self.layers.iter().map(Block::host_weights).collect();
        HostModel {
            arch: self.arch.clone(),
            token_embedding,
            layers,
            final_norm: vector(&self.norm.weight),
            output: (!self.tied_output).then(|| self.output.host_weights().0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::TensorData;

    #[test]
    fn a_bf16_model_runs_as_burn_ops_and_refuses_the_host_kernels() {
        let host = tiny_f16_values();
        let cpu = Device::flex();
        assert_eq!(LinearKernel::for_device(&cpu, DType::BF16), LinearKernel::Burn);
        assert_eq!(AttentionKernel::for_device(&cpu, DType::BF16), AttentionKernel::Composed);
        assert_eq!(RoundingPath::for_device(&cpu, DType::BF16), RoundingPath::Device);
        let e = Llama::from_host_with(&host, DType::BF16, &cpu, LinearKernel::Host).expect_err("host kernels");
        assert!(matches!(e, ModelError::DType(DType::BF16)), "{e}");
        let model = Llama::from_host(&host, DType::BF16, &cpu).expect("bf16");
        assert_eq!(model.embedding.dtype(), DType::BF16);
        assert!(!model.steps_match_teacher_forcing());
        // A host cache asked for is a device cache: the host kernel keeps f32 or f16.
        let caches = model.new_caches_for(1, 4, AttentionKernel::Host);
        assert!(caches.iter().all(|c| c.kernel() == AttentionKernel::Composed));
        assert_eq!((dtype_max(DType::BF16), dtype_max(DType::F16)), (half::bf16::MAX.to_f32(), 65504.0));
        assert_eq!(round_to_dtype(1.0 + 2f32.powi(-9), DType::BF16), 1.0);
    }

    fn tiny_f16_values() -> HostModel {
        let mut m = qdrift_load::synthetic_model("tiny", 5).expect("tiny").model;
        m.round_to_f16();
        m
    }

    fn logits(model: &Llama, kernel: AttentionKernel) -> Vec<u32> {
        let tokens = [1i32, 75, 104, 3, 319, 200, 42];
        let device = model.device();
        let ids = |t: &[i32]| Tensor::<2, Int>::from_data(TensorData::new(t.to_vec(), [1, t.len()]), &device);
        let positions = Positions::left_padded(&[tokens.len()]);
        let mut caches = model.new_caches_for(1, tokens.len(), kernel);
        let mut out = host_f32(model.forward(ids(&tokens[..5]), &positions, &mut caches, true));
        for &t in &tokens[5..] {
            out.extend(host_f32(model.forward(ids(&[t]), &positions, &mut caches, true)));
        }
        out.iter().map(|v| v.to_bits()).collect()
    }

    /// A device whose largest buffer holds 7 rows of the model: the embedding is held in row
    /// ranges and every linear layer in column ranges, holding the same values, and the logits are
    /// those of the whole tensors within the last bit of the products (a narrower product may sum
    /// in another order), on wgpu (Mesa's lavapipe here) and on the CPU backend's Burn ops.
    #[test]
    fn weights_split_over_small_buffers_give_the_same_logits() {
        let host = tiny_f16_values();
        for (device, dtype) in
            [(Device::flex(), DType::F32), (Device::flex(), DType::F16), (crate::testing::test_wgpu(), DType::F16)]
        {
            let dim = host.arch.dim;
            let limit = (7 * dim * dtype.size()) as u64;
            let build = |max_buffer_bytes| {
                let target = Target { kernel: LinearKernel::Burn, compact: true, max_buffer_bytes };
                Llama::build(&host, dtype, &device, target).expect("builds")
            };
            let (whole, split) = (build(None), build(Some(limit)));
            assert_eq!(whole.embedding.parts(), 1);
            // An f32 model on the CPU backend holds the f16-valued table in f16: 14 rows a range.
            let rows = 7 * dtype.size() / split.embedding.dtype().size();
            assert_eq!(split.embedding.parts(), host.arch.vocab_size.div_ceil(rows), "{dtype:?}");
            assert!(matches!(split.output, Projection::Split(_)) && matches!(whole.output, Projection::Device(_)));
            let BlockFfn::Dense(ffn) = &split.layers[0].ffn else { panic!("the tiny preset is dense") };
            assert!(matches!(ffn.down, Projection::Split(_)), "{dtype:?}");
            assert_eq!(split.host_weights(), whole.host_weights(), "{dtype:?}: the same values");
            let kernel = AttentionKernel::Composed;
            let (a, b) = (logits(&split, kernel), logits(&whole, kernel));
            let f = |v: &u32| f32::from_bits(*v);
            let scale = b.iter().map(|v| f(v).abs()).fold(0f32, f32::max);
            let worst = a.iter().zip(&b).map(|(x, y)| (f(x) - f(y)).abs()).fold(0f32, f32::max);
            // flex's matrix product orders its sums by the output width, and on wgpu autotune
            // picks a matmul kernel per shape (ARCHITECTURE.md, "Fusion and autotune on wgpu"),
            // so a narrower product may round its last bit differently (measured: 4.5e-8 in f32
            // and one f16 step of 2.4e-4 in f16 on flex, 2.4e-7 on lavapipe, of logits up to
            // 0.76). Without fusion and autotune lavapipe gave the same bits.
            let tolerance = if dtype == DType::F16 { scale * 2f32.powi(-10) } else { scale * 1e-6 };
            assert!(worst <= tolerance, "{dtype:?}: max |Δ| {worst:e} of max |logit| {scale}");
        }
    }

    #[test]
    fn f16_valued_f32_weights_are_held_as_f16_with_the_same_logits() {
        let host = tiny_f16_values();
        for kernel in [LinearKernel::Host, LinearKernel::Burn] {
            let build = |compact| {
                let target = Target { kernel, compact, max_buffer_bytes: None };
                Llama::build(&host, DType::F32, &Device::flex(), target).expect("builds")
            };
            let (compact, wide) = (build(true), build(false));
            assert_eq!(compact.embedding.dtype(), DType::F16, "{kernel:?}");
            assert_eq!(wide.embedding.dtype(), DType::F32, "{kernel:?}");
            if kernel == LinearKernel::Host {
                let stored = |m: &Llama| match &m.layers[0].ffn {
                    BlockFfn::Dense(f) => format!("{:?}", f.down.packed().expect("host")),
                    BlockFfn::Experts(_) => panic!("the tiny preset is dense"),
                };
                assert!(stored(&compact).contains("f16") && stored(&wide).contains("f32"));
            }
            for attention in [AttentionKernel::Host, AttentionKernel::Composed] {
                assert_eq!(logits(&compact, attention), logits(&wide, attention), "{kernel:?} {attention:?}");
            }
        }
    }

    /// A model built part by part from a source (here the weights held at 16 bits) is the model
    /// built from the whole host model; a part the source cannot hand out is the build's error.
    #[test]
    fn a_model_from_a_weight_source_gives_the_same_logits() {
        for dtype in [DType::F32, DType::F16] {
            let host = tiny_f16_values();
            let whole = Llama::from_host(&host, dtype, &Device::flex()).expect("builds");
            let held = qdrift_weights::HeldModel::new(host.clone());
            assert_eq!(held.bytes(), 2 * host.parameter_count(), "f16 values are held as f16");
            let parts = Llama::from_source(&held, dtype, &Device::flex()).expect("builds");
            for attention in [AttentionKernel::Host, AttentionKernel::Composed] {
                assert_eq!(logits(&parts, attention), logits(&whole, attention), "{dtype:?} {attention:?}");
            }
        }
        struct Failing(HostModel);
        impl WeightSource for Failing {
            fn arch(&self) -> &ModelArch {
                &self.0.arch
            }
            fn parameter_count(&self) -> usize {
                self.0.parameter_count()
            }
            fn token_embedding(&self) -> Result<HostTensor, qdrift_weights::SourceError> {
                Ok(self.0.token_embedding.clone())
            }
            fn layer(&self, index: usize) -> Result<LayerWeights, qdrift_weights::SourceError> {
                Err(format!("model.bin: block {index} is truncated").into())
            }
            fn final_norm(&self) -> Result<HostTensor, qdrift_weights::SourceError> {
                Ok(self.0.final_norm.clone())
            }
            fn output(&self) -> Result<Option<HostTensor>, qdrift_weights::SourceError> {
                Ok(self.0.output.clone())
            }
        }
        let e = Llama::from_source(&Failing(tiny_f16_values()), DType::F16, &Device::flex()).expect_err("fails");
        assert_eq!(e.to_string(), "model.bin: block 0 is truncated");
    }

    /// A whole model, prompt then decoding steps, gives the same logits bit for bit at every ISA
    /// the CPU runs (forced on this thread, where the forward passes run), in f32 and f16, with
    /// host linear layers over host or composed attention.
    #[test]
    fn every_isa_gives_the_same_logits() {
        let host = tiny_f16_values();
        let isas = Isa::runnable_reporting_skips("every_isa_gives_the_same_logits");
        for dtype in [DType::F32, DType::F16] {
            let model = Llama::from_host_with(&host, dtype, &Device::flex(), LinearKernel::Host).expect("builds");
            for attention in [AttentionKernel::Host, AttentionKernel::Composed] {
                let want = Isa::Portable.forced(|| logits(&model, attention)).expect("portable runs everywhere");
                for &isa in &isas {
                    let got = isa.forced(|| logits(&model, attention)).expect("a runnable ISA");
                    assert_eq!(got, want, "{isa} {dtype:?} {attention:?}");
                }
            }
        }
    }

    #[test]
    fn embeddings_that_are_not_f16_values_stay_in_the_compute_dtype() {
        let mut host = tiny_f16_values();
        host.token_embedding.data[3] += 1e-6;
        let f32 = Llama::from_host_with(&host, DType::F32, &Device::flex(), LinearKernel::Host).expect("f32");
        assert_eq!(f32.embedding.dtype(), DType::F32);
        let f16 = Llama::from_host_with(&host, DType::F16, &Device::flex(), LinearKernel::Host).expect("f16");
        assert_eq!(f16.embedding.dtype(), DType::F16);
    }
}
