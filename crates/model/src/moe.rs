//! A mixture of experts ([`MoeLayer`]): a router picks `top_k` of `n_experts` gated feed-forward
//! layers for each token, and the layer's output is their outputs weighted by the router.
//!
//! References (`transformers` 5.25): `Qwen3MoeSparseMoeBlock` / `Qwen3MoeTopKRouter` /
//! `Qwen3MoeExperts` (softmax over all experts in f32, top-k, optional `norm_topk_prob`),
//! `MixtralSparseMoeBlock` / `MixtralTopKRouter` (the same, always renormalized) and
//! `GptOssMLP` / `GptOssTopKRouter` / `GptOssExperts` (a router bias, top-k of the raw logits,
//! softmax over the chosen ones; experts with biases and the clamped SwiGLU).
//!
//! **Gathered, not dense.** Each expert runs once, on the rows routed to it: the rows are
//! `select`ed by index, the expert's three projections run on that batch, and its weighted
//! outputs are added back into their rows (`select_assign` with `Add`), experts in ascending id
//! order as `index_add_` accumulates them in the references. So a layer costs the router plus
//! `top_k` experts per token, not `n_experts`.
//!
//! **Routing on the host.** The router's logits (`[rows, n_experts]`, a few hundred bytes a
//! token) are read back and the choices ([`route`]) made on the host: a top-k with
//! `torch.topk`'s tie rule and per-row index lists are simple there and need no sort on the
//! device. The read-back is one synchronisation per MoE layer and pass.
//!
//! **Precision.** The router's input is not rounded by the activation quantization (llm-compressor
//! and vLLM leave `mlp.gate` unquantized); its logits are computed and rounded in the compute
//! dtype as the references' model-dtype `nn.Linear`, then the softmax runs in f32 and the chosen
//! weights are rounded to the compute dtype (Qwen3-MoE's `top_v.to(logits.dtype)`, gpt-oss's
//! model-dtype softmax; Mixtral keeps them in f32, which differs by one rounding in an f16 model
//! only). Every expert product `y_e · w_e` and every sum is in the compute dtype.
//!
//! **Activation rounding** ([`ForwardContext::round_input`]), as the dense feed-forward layer:
//! - the experts' input is rounded once, over the FULL layer input `[batch, seq, dim]`, before
//!   any row is gathered, so a per-sequence (per-tensor) scale covers the same values as the
//!   dense layer's;
//! - the down-projections' inputs are rounded in "slot" layout: every row's `top_k` expert
//!   activations side by side (`[rows × top_k, expert_hidden]`, slot `row·top_k + j` for its
//!   `j`-th expert by weight). A per-tensor scale in the prompt pass is one scale per sequence
//!   over all its real tokens' `top_k` activations (`[batch, seq, top_k × expert_hidden]`): what
//!   vLLM's dynamic per-tensor scale over the fused MoE's intermediate cache is at batch size 1.
//!   Per-token and per-token-group scales cover one slot (`[batch, seq × top_k, expert_hidden]`:
//!   one expert's activations of one token), as vLLM's per-row scales. Either way a row's
//!   rounding depends only on its own sequence, never on which rows an expert was given.
//!
//! **Shared expert** (Qwen2-MoE, `Qwen2MoeSparseMoeBlock`): a dense gated FFN
//! ([`FeedForward`]) every row runs, its output scaled by `σ(shared_expert_gate · x)` and added to
//! the routed experts' sum: `y = Σ_e w_e·expert_e(x) + σ(g·x)·shared(x)`. Its gate reads the
//! unrounded input at reference precision, as the router does; its logits are read back as the
//! router's are and the sigmoid taken on the host in f32, rounded to the compute dtype (the
//! reference's model-dtype `F.sigmoid`), so both paths scale by the same values. The shared FFN
//! rounds its input and its down projection's input as the dense layer does.
//!
//! **Llama 4** (`Llama4TextMoe`, [`Routing::SigmoidInput`]): the chosen experts' weights
//! `σ(logit)` (f32, rounded to the compute dtype) multiply each expert's *input* rows (after the
//! activation rounding) and the outputs are added unweighted; its shared expert is ungated (no
//! gate row) and added as it is. Such a layer runs as Burn ops on every backend (the host path
//! scales outputs only).
//!
//! **GLM-4.5 and DeepSeek-V3** ([`Routing::GroupedSigmoid`]): the router's bias
//! (`e_score_correction_bias`) is kept out of the logits ([`MoeLayer::selection_bias`]) and added
//! to their sigmoid for the group-limited choice only ([`route`]); the weights scale the outputs,
//! so such a layer runs on the host kernels as the softmax routers do.
//!
//! **Routing capture.** [`MoeLayer::forward_recording`] appends each pass's choices to a
//! [`RoutingRecord`] (layer → `[batch, seq, top_k]` expert ids in order of weight), for the
//! routing-drift metrics.

use std::sync::Mutex;

use burn::module::Module;
use burn::tensor::{DType, Device, IndexingUpdateOp, Int, Tensor, TensorData};
use qdrift_codecs::ActivationScale;
use qdrift_weights::{Activation, Experts, HostTensor, Mlp, MoeSpec, Routing, SharedExpert};

use crate::activation::gated;
use crate::attention::ForwardContext;
use crate::error::{ModelError, check_linear};
use crate::fake_quant::InputSite;
use crate::ffn::FeedForward;
use crate::host::elem::round_to_f16;
use crate::host::linear::PackedLinear;
use crate::host::placement;
use crate::host::swiglu::swiglu;
use crate::linear::ProjectionStore;
use crate::routing::{LayerRoutes, RoutingRecord};
use crate::tensors::{host_f32, upload, upload_owned};
use crate::{Projection, Projections};

/// One expert: a gated feed-forward layer `down(act(gate·x + b_g, up·x + b_u)) + b_d`.
#[derive(Module, Debug)]
pub struct Expert {
    /// Gate projection, `[expert_hidden, dim]` as host weights.
    pub gate: Projection,
    /// Up projection, `[expert_hidden, dim]` as host weights.
    pub up: Projection,
    /// Down projection, `[dim, expert_hidden]` as host weights.
    pub down: Projection,
}

/// Qwen2-MoE's shared expert (see the module documentation): the FFN every row runs and its
/// sigmoid gate (none for Llama 4's).
#[derive(Module, Debug)]
pub struct SharedExpertLayer {
    /// The FFN, `[shared_hidden, dim]` gate and up projections.
    pub ffn: FeedForward,
    /// The gate, `[1, dim]` as host weights; `None` for an ungated shared expert.
    pub gate: Option<Projection>,
}

/// A mixture-of-experts feed-forward layer (see the module documentation).
#[derive(Module, Debug)]
pub struct MoeLayer {
    /// Router, `[n_experts, dim]` as host weights, with gpt-oss's bias when it has one.
    pub router: Projection,
    /// The experts, by id.
    pub experts: Vec<Expert>,
    /// The shared expert every row runs (Qwen2-MoE).
    pub shared: Option<SharedExpertLayer>,
    /// Experts per token.
    #[module(skip)]
    pub top_k: usize,
    /// How the router's logits become weights.
    #[module(skip)]
    pub routing: Routing,
    /// [`Routing::GroupedSigmoid`]'s choice bias (`e_score_correction_bias`), `[n_experts]`, kept
    /// out of the router's logits; empty otherwise.
    #[module(skip)]
    pub selection_bias: Vec<f32>,
    /// The experts' gated activation.
    #[module(skip)]
    pub activation: Activation,
    /// The block this layer belongs to (the key of its [`RoutingRecord`] entries).
    #[module(skip)]
    pub layer: usize,
}

impl MoeLayer {
    /// The layer of block `layer` from its host weights, checked against `spec` and the router's
    /// input width (`dim`), stored as `store` says (as the dense layer's projections).
    ///
    /// # Errors
    /// [`ModelError::Arch`] when `spec` and the weights disagree on the number of experts or on
    /// a shared expert, or `top_k` is not from 1 to it; [`ModelError::Shape`] for a tensor of the
    /// wrong shape, named as Qwen3-MoE names it
    /// (`model.layers.{layer}.mlp.experts.{e}.gate_proj.weight`).
    pub(crate) fn from_host(
        layer: usize,
        weights: &Experts,
        spec: &MoeSpec,
        activation: Activation,
        store: ProjectionStore<'_>,
    ) -> Result<MoeLayer, ModelError> {
        let (n, hid) = (spec.n_experts, spec.expert_hidden);
        if weights.experts.len() != n {
            return Err(ModelError::Arch(format!(
                "layer {layer}: {} experts given, the mixture of experts has {n}",
                weights.experts.len()
            )));
        }
        if spec.top_k == 0 || spec.top_k > n {
            return Err(ModelError::Arch(format!(
                "layer {layer}: top-k {} must be from 1 to the {n} experts",
                spec.top_k
            )));
        }
        let dim = weights.router.shape.get(1).copied().unwrap_or(0);
        let name = |s: &str| format!("model.layers.{layer}.mlp.{s}");
        // A grouped router's bias biases the choice only: kept out of the logits.
        let (logit_bias, selection_bias) = if spec.routing.biases_choice_only() {
            let bias = weights.router_bias.as_ref();
            if let Some(b) = bias {
                check_linear(&name("gate"), &weights.router, Some(b), [n, dim])?;
            }
            (None, bias.map_or_else(Vec::new, |b| b.data.clone()))
        } else {
            (weights.router_bias.as_ref(), Vec::new())
        };
        let router = projection(&name("gate"), &weights.router, logit_bias, [n, dim], store)?;
        let experts = weights
            .experts
            .iter()
            .enumerate()
            .map(|(e, m)| {
                let [gate, up, down] = gated_projections(&name(&format!("experts.{e}")), m, [hid, dim], store)?;
                Ok(Expert { gate, up, down })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let shared = match (&weights.shared, spec.shared_expert_hidden) {
            (None, None) => None,
            (Some(sh), Some(w)) => Some(SharedExpertLayer {
                ffn: gated_ffn(&name("shared_expert"), &sh.mlp, [w, dim], activation, store)?,
                gate: if sh.gate.shape.first() == Some(&0) {
                    None
                } else {
                    Some(projection(&name("shared_expert_gate"), &sh.gate, None, [1, dim], store)?)
                },
            }),
            (given, _) => {
                return Err(ModelError::Arch(format!(
                    "layer {layer}: the weights {} a shared expert but the mixture of experts {}",
                    if given.is_some() { "have" } else { "lack" },
                    if given.is_some() { "has none" } else { "has one" }
                )));
            }
        };
        Ok(MoeLayer {
            router,
            experts,
            shared,
            top_k: spec.top_k,
            routing: spec.routing,
            selection_bias,
            activation,
            layer,
        })
    }

    /// The layer's weights as host values, as [`MoeLayer::from_host`] took them (values of the
    /// compute dtype).
    pub(crate) fn host_weights(&self) -> Experts {
        let (router, mut router_bias) = self.router.host_weights();
        if !self.selection_bias.is_empty() {
            router_bias =
                Some(HostTensor { shape: vec![self.selection_bias.len()], data: self.selection_bias.clone() });
        }
        let experts = self
            .experts
            .iter()
            .map(|x| {
                let ((gate, gate_bias), (up, up_bias), (down, down_bias)) =
                    (x.gate.host_weights(), x.up.host_weights(), x.down.host_weights());
                Mlp { gate, up, down, gate_bias, up_bias, down_bias }
            })
            .collect();
        let dim = self.router.host_weights().0.shape.get(1).copied().unwrap_or(0);
        let shared = self.shared.as_ref().map(|s| SharedExpert {
            mlp: s.ffn.host_weights(),
            gate: s
                .gate
                .as_ref()
                .map_or_else(|| HostTensor { shape: vec![0, dim], data: Vec::new() }, |g| g.host_weights().0),
        });
        Experts { router, router_bias, experts, shared }
    }

    /// Number of experts.
    pub fn n_experts(&self) -> usize {
        self.experts.len()
    }

    /// Width of one expert's hidden layer.
    pub fn expert_hidden(&self) -> usize {
        self.experts.first().map_or(0, |x| x.gate.out_features())
    }

    /// [`MoeLayer::forward_recording`] into the pass's record, when it keeps one
    /// (`ForwardContext::routing`).
    ///
    /// # Shapes
    /// - `x`: `[batch, seq, dim]` → `[batch, seq, dim]`
    pub(crate) fn forward(&self, x: Tensor<3>, context: &ForwardContext) -> Tensor<3> {
        self.forward_recording(x, context, context.routing)
    }

    /// Routes every row of `x`, runs each expert once on its rows and adds their weighted outputs
    /// (module documentation); appends the choices to `record` when given.
    ///
    /// # Shapes
    /// - `x`: `[batch, seq, dim]` → `[batch, seq, dim]`
    pub(crate) fn forward_recording(
        &self,
        x: Tensor<3>,
        context: &ForwardContext,
        record: Option<&Mutex<RoutingRecord>>,
    ) -> Tensor<3> {
        let ([b, t, dim], dtype, device) = (x.dims(), x.dtype(), x.device());
        if self.runs_on_host(context) {
            // All on the host: read the input back once, upload the output once.
            let y = self.forward_host(host_f32(x), [b, t], context, record);
            return upload_owned(y, [b, t, dim], dtype, &device);
        }
        self.forward_tensors(x, context, record)
    }

    /// [`MoeLayer::forward_recording`] as Burn ops (the router's choices on the host).
    ///
    /// # Shapes
    /// - `x`: `[batch, seq, dim]` → `[batch, seq, dim]`
    fn forward_tensors(
        &self,
        x: Tensor<3>,
        context: &ForwardContext,
        record: Option<&Mutex<RoutingRecord>>,
    ) -> Tensor<3> {
        let ([b, t, dim], dtype, device) = (x.dims(), x.dtype(), x.device());
        let rows = b * t;
        // The router (and the shared expert's gate) at reference precision: its input unrounded.
        let logits = host_f32(self.router.forward_to(x.clone(), DType::F32));
        let routes = route(&logits, self.n_experts(), self.top_k, self.routing, &self.selection_bias);
        self.record(record, [b, t], &routes);
        let shared = self.shared.as_ref().map(|s| {
            let g = s.gate.as_ref().map(|gate| {
                let g = shared_gate_weights(host_f32(gate.forward_to(x.clone(), DType::F32)));
                upload(&g, [rows, 1], dtype, &device)
            });
            (s.ffn.forward(x.clone(), context).reshape([rows, dim]), g)
        });
        let groups = routes.by_expert(self.n_experts());
        let xs = context.round_input(x, InputSite::Up).reshape([rows, dim]);
        let hidden: Vec<Option<Tensor<2>>> = self
            .experts
            .iter()
            .zip(&groups)
            .map(|(expert, g)| {
                (!g.rows.is_empty()).then(|| {
                    let n = g.rows.len();
                    let mut xe = xs.clone().select(0, indices(&g.rows, &device)).reshape([1, n, dim]);
                    if self.routing.scales_input() {
                        // `routed_in * router_scores`: the weight scales the expert's input.
                        xe = xe * upload(&g.weights, [1, n, 1], dtype, &device);
                    }
                    let h = gated(self.activation, expert.gate.forward(xe.clone()), expert.up.forward(xe));
                    h.reshape([n, self.expert_hidden()])
                })
            })
            .collect();
        let hidden = self.round_down_inputs(hidden, &groups, [b, t], context);
        let mut out = Tensor::<2>::zeros([rows, dim], (&device, dtype));
        for ((expert, g), h) in self.experts.iter().zip(&groups).zip(hidden) {
            let Some(h) = h else { continue };
            let n = g.rows.len();
            let y = expert.down.forward(h.reshape([1, n, self.expert_hidden()])).reshape([n, dim]);
            let y = if self.routing.scales_input() { y } else { y * upload(&g.weights, [n, 1], dtype, &device) };
            out = out.select_assign(0, indices(&g.rows, &device), y, IndexingUpdateOp::Add);
        }
        match shared {
            Some((y, Some(g))) => out = out + y * g,
            Some((y, None)) => out = out + y,
            None => {}
        }
        out.reshape([b, t, dim])
    }

    /// Whether [`MoeLayer::forward_host`] runs this layer: [`MoeLayer::packed_on_host`], and
    /// activations, if rounded, are rounded on the host ([`placement::ffn_on_host`]).
    pub(crate) fn runs_on_host(&self, context: &ForwardContext) -> bool {
        placement::ffn_on_host(self.packed_on_host(), context.rounds_on_host())
    }

    /// Whether the router, every expert and the shared expert with its gate are packed on the
    /// host and the host kernels cover the activation (SwiGLU; the others run as Burn ops) and
    /// the routing (weights scaling outputs; Llama 4's scale inputs and run as Burn ops).
    pub(crate) fn packed_on_host(&self) -> bool {
        self.activation == Activation::SwiGlu
            && !self.routing.scales_input()
            && self.router.packed().is_some()
            && self
                .shared
                .as_ref()
                .is_none_or(|s| s.ffn.packed_on_host() && s.gate.as_ref().is_none_or(|g| g.packed().is_some()))
            && self
                .experts
                .iter()
                .all(|x| x.gate.packed().is_some() && x.up.packed().is_some() && x.down.packed().is_some())
    }

    /// [`MoeLayer::forward_recording`] on host values, with the same operations and roundings as
    /// it runs on the CPU backend, so the same values. Only where [`MoeLayer::runs_on_host`].
    ///
    /// # Shapes
    /// - `xs`: `[batch, seq, dim]`, row-major, values of the compute dtype → `[batch, seq, dim]`
    ///
    /// # Panics
    /// Where [`MoeLayer::runs_on_host`] does not hold.
    pub(crate) fn forward_host(
        &self,
        mut xs: Vec<f32>,
        [b, t]: [usize; 2],
        context: &ForwardContext,
        record: Option<&Mutex<RoutingRecord>>,
    ) -> Vec<f32> {
        fn packed(p: &Projection) -> &PackedLinear {
            p.packed().expect("MoeLayer::forward_host on a layer packed on the host")
        }
        let (f16, k, w) = (context.f16, self.top_k, self.expert_hidden());
        let router = packed(&self.router);
        let (rows, dim) = (b * t, router.inp());
        let logits = router.forward_rounded(&xs, rows, f16);
        let routes = route(&logits, self.n_experts(), k, self.routing, &self.selection_bias);
        self.record(record, [b, t], &routes);
        // The shared expert on the unrounded input (it rounds its own), scaled by its gate.
        let shared = self.shared.as_ref().map(|s| {
            let g = s.gate.as_ref().map(|g| shared_gate_weights(packed(g).forward_rounded(&xs, rows, f16)));
            (s.ffn.forward_host(xs.clone(), [b, t], context), g)
        });
        let groups = routes.by_expert(self.n_experts());
        context.round_host_input(&mut xs, [b, t, dim], InputSite::Up);
        let mut hidden: Vec<Vec<f32>> = self
            .experts
            .iter()
            .zip(&groups)
            .map(|(expert, g)| {
                let xe: Vec<f32> =
                    g.rows.iter().flat_map(|&r| &xs[r as usize * dim..(r as usize + 1) * dim]).copied().collect();
                let n = g.rows.len();
                let gate = packed(&expert.gate).forward_rounded(&xe, n, f16);
                let mut h = packed(&expert.up).forward_rounded(&xe, n, f16);
                swiglu(&gate, &mut h, f16);
                h
            })
            .collect();
        if context.sees_inputs() {
            // The slot layout of `round_down_inputs`, built as its zeros plus each value (so −0
            // becomes +0 there as here).
            let mut slots = vec![0.0f32; rows * k * w];
            for (h, g) in hidden.iter().zip(&groups) {
                for (&s, hv) in g.slots.iter().zip(h.chunks_exact(w)) {
                    slots[s as usize * w..(s as usize + 1) * w].iter_mut().zip(hv).for_each(|(d, &v)| *d = 0.0 + v);
                }
            }
            context.round_host_input(&mut slots, self.slot_view(context, [b, t]), InputSite::Down);
            for (h, g) in hidden.iter_mut().zip(&groups) {
                for (&s, hv) in g.slots.iter().zip(h.chunks_exact_mut(w)) {
                    hv.copy_from_slice(&slots[s as usize * w..(s as usize + 1) * w]);
                }
            }
        }
        let mut out = vec![0.0f32; rows * dim];
        for ((expert, g), h) in self.experts.iter().zip(&groups).zip(&hidden) {
            let y = packed(&expert.down).forward_rounded(h, g.rows.len(), f16);
            for ((&r, &wt), yv) in g.rows.iter().zip(&g.weights).zip(y.chunks_exact(dim)) {
                add_scaled(&mut out[r as usize * dim..(r as usize + 1) * dim], yv, wt, f16);
            }
        }
        if let Some((y, g)) = shared {
            // An ungated shared expert is scaled by 1 (exact).
            let g = g.unwrap_or_else(|| vec![1.0; rows]);
            for ((row, yv), &g) in out.chunks_exact_mut(dim).zip(y.chunks_exact(dim)).zip(&g) {
                add_scaled(row, yv, g, f16);
            }
        }
        out
    }

    /// How the slots `[rows × top_k, expert_hidden]` are viewed for rounding: `[batch, seq,
    /// top_k × expert_hidden]` for one scale per sequence (a per-tensor scale in the prompt pass,
    /// `ForwardContext::activations`' rule), `[batch, seq × top_k, expert_hidden]` otherwise (a
    /// row's padding tokens' slots come first, so the host path's skipping of a row's first
    /// `pad` columns skips only padding).
    fn slot_view(&self, context: &ForwardContext, [b, t]: [usize; 2]) -> [usize; 3] {
        let (k, w) = (self.top_k, self.expert_hidden());
        let per_sequence =
            context.activations.is_some_and(|(q, _)| q.scale == ActivationScale::Tensor) && context.start == 0;
        if per_sequence { [b, t, k * w] } else { [b, t * k, w] }
    }

    /// Appends a pass's choices to `record`, when given.
    fn record(&self, record: Option<&Mutex<RoutingRecord>>, [b, t]: [usize; 2], routes: &Routes) {
        if let Some(record) = record {
            // A poisoned lock only means another pass panicked while recording; the record is
            // still a list of whole entries.
            let mut record = record.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            record.layers.push(LayerRoutes {
                layer: self.layer,
                shape: [b, t, self.top_k],
                experts: routes.experts.clone(),
            });
        }
    }

    /// The down-projections' inputs rounded in slot layout (module documentation); unchanged
    /// without activation quantization.
    ///
    /// # Shapes
    /// - `hidden[e]`: `[rows routed to e, expert_hidden]` (`None` for an expert without rows) →
    ///   same
    fn round_down_inputs(
        &self,
        hidden: Vec<Option<Tensor<2>>>,
        groups: &[ExpertRows],
        [b, t]: [usize; 2],
        context: &ForwardContext,
    ) -> Vec<Option<Tensor<2>>> {
        if !context.sees_inputs() {
            return hidden;
        }
        let Some(first) = hidden.iter().flatten().next() else { return hidden };
        let (dtype, device) = (first.dtype(), first.device());
        let (k, w) = (self.top_k, self.expert_hidden());
        let mut slots = Tensor::<2>::zeros([b * t * k, w], (&device, dtype));
        for (h, g) in hidden.iter().zip(groups) {
            if let Some(h) = h {
                slots = slots.select_assign(0, indices(&g.slots, &device), h.clone(), IndexingUpdateOp::Add);
            }
        }
        let slots = context
            .round_input(slots.reshape(self.slot_view(context, [b, t])), InputSite::Down)
            .reshape([b * t * k, w]);
        groups.iter().zip(hidden).map(|(g, h)| h.map(|_| slots.clone().select(0, indices(&g.slots, &device)))).collect()
    }
}

/// `row += w · y` as tensors of the compute dtype (f16 when `f16`) compute it: the weight as its
/// tensor holds it, each product and each sum rounded as one.
///
/// # Shapes
/// - `row`, `y`: `[dim]`
fn add_scaled(row: &mut [f32], y: &[f32], w: f32, f16: bool) {
    let r = |v: f32| if f16 { round_to_f16(v) } else { v };
    let w = r(w);
    for (o, &v) in row.iter_mut().zip(y) {
        *o = r(*o + r(v * w));
    }
}

/// The gate, up and down projections of a gated FFN `m` (an expert's or the shared expert's) of
/// width `hidden`, named `{prefix}.{gate,up,down}_proj`, checked.
fn gated_projections(
    prefix: &str,
    m: &Mlp,
    [hidden, dim]: [usize; 2],
    store: ProjectionStore<'_>,
) -> Result<[Projection; 3], ModelError> {
    let p = |s: &str| format!("{prefix}.{s}");
    let Mlp { gate, up, down, gate_bias, up_bias, down_bias } = m;
    Ok([
        projection(&p("gate_proj"), gate, gate_bias.as_ref(), [hidden, dim], store)?,
        projection(&p("up_proj"), up, up_bias.as_ref(), [hidden, dim], store)?,
        projection(&p("down_proj"), down, down_bias.as_ref(), [dim, hidden], store)?,
    ])
}

/// The gated FFN `m` (the shared expert's) of width `hidden` as one [`FeedForward`], its gate
/// and up projections stacked where the device allows ([`Projections::new`]); named and checked
/// as [`gated_projections`].
fn gated_ffn(
    prefix: &str,
    m: &Mlp,
    [hidden, dim]: [usize; 2],
    activation: Activation,
    store: ProjectionStore<'_>,
) -> Result<FeedForward, ModelError> {
    let p = |s: &str| format!("{prefix}.{s}");
    let Mlp { gate, up, down, gate_bias, up_bias, down_bias } = m;
    for (name, w, b) in [("gate_proj", gate, gate_bias), ("up_proj", up, up_bias)] {
        check_linear(&p(name), w, b.as_ref(), [hidden, dim])?;
    }
    let layers = [
        (&gate.data[..], [hidden, dim], gate_bias.as_ref().map(|b| &b.data[..])),
        (&up.data[..], [hidden, dim], up_bias.as_ref().map(|b| &b.data[..])),
    ];
    Ok(FeedForward {
        gate_up: Projections::new(&layers, 1, store),
        down: projection(&p("down_proj"), down, down_bias.as_ref(), [dim, hidden], store)?,
        activation,
    })
}

/// The shared expert's scale of each row, `σ(z)` of its gate's logit in f32 (rounded to the
/// compute dtype where it is used, as the reference's model-dtype `F.sigmoid`).
///
/// # Shapes
/// - `logits`: `[rows]` (the gate's `[rows, 1]`) → `[rows]`
fn shared_gate_weights(mut logits: Vec<f32>) -> Vec<f32> {
    logits.iter_mut().for_each(|z| *z = 1.0 / (1.0 + (-*z).exp()));
    logits
}

/// A projection from `[out, in]` host weights and an optional `[out]` bias, checked; `name`
/// without its `.weight`.
fn projection(
    name: &str,
    weight: &HostTensor,
    bias: Option<&HostTensor>,
    [out, inp]: [usize; 2],
    store: ProjectionStore<'_>,
) -> Result<Projection, ModelError> {
    check_linear(name, weight, bias, [out, inp])?;
    Ok(Projection::new(&weight.data, [out, inp], bias.map(|b| &b.data[..]), store))
}

/// Row (or slot) indices as an index tensor.
///
/// # Shapes
/// - returns `[indices.len()]`
fn indices(indices: &[i64], device: &Device) -> Tensor<1, Int> {
    Tensor::from_data(TensorData::new(indices.to_vec(), [indices.len()]), device)
}

/// Each row's chosen experts and their weights.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Routes {
    /// Experts per row.
    pub top_k: usize,
    /// `[rows, top_k]`: each row's experts in order of weight, ties to the lower id.
    pub experts: Vec<u32>,
    /// `[rows, top_k]`: their weights, f32 (rounded to the compute dtype on upload).
    pub weights: Vec<f32>,
}

/// One expert's share of a pass: its rows, ascending, their slots (`row · top_k + j` for the
/// row's `j`-th expert) and weights.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ExpertRows {
    pub rows: Vec<i64>,
    pub slots: Vec<i64>,
    pub weights: Vec<f32>,
}

impl Routes {
    /// The rows of each of `n_experts` experts.
    pub(crate) fn by_expert(&self, n_experts: usize) -> Vec<ExpertRows> {
        let mut out = vec![ExpertRows::default(); n_experts];
        for (slot, (&e, &w)) in self.experts.iter().zip(&self.weights).enumerate() {
            let g = &mut out[e as usize];
            g.rows.push((slot / self.top_k) as i64);
            g.slots.push(slot as i64);
            g.weights.push(w);
        }
        out
    }
}

/// Routes each row of router logits, in f32:
/// - [`Routing::SoftmaxTopK`]: softmax over all experts, the `top_k` largest probabilities
///   (`Qwen3MoeTopKRouter`, `MixtralTopKRouter`), divided by their sum when `renormalize`;
/// - [`Routing::TopKSoftmax`]: the `top_k` largest logits, softmax over them (`GptOssTopKRouter`);
/// - [`Routing::SigmoidInput`]: the `top_k` largest logits, `σ` of each (`Llama4Router`);
/// - [`Routing::GroupedSigmoid`]: `σ` of the logits, chosen by `σ + selection_bias` within the
///   best groups ([`grouped_choice`]; `Glm4MoeTopkRouter`, `DeepseekV3TopkRouter`), weighted by
///   `σ`, renormalized (`+ 1e-20`) and scaled.
///
/// The top-k is `torch.topk`'s: sorted descending, NaN above every number, equal values in
/// ascending expert id.
///
/// # Shapes
/// - `logits`: `[rows, n_experts]`, `selection_bias`: `[n_experts]` or empty → [`Routes`] of
///   `[rows, top_k]`
pub(crate) fn route(
    logits: &[f32],
    n_experts: usize,
    top_k: usize,
    routing: Routing,
    selection_bias: &[f32],
) -> Routes {
    let rows = logits.len() / n_experts.max(1);
    let mut experts = Vec::with_capacity(rows * top_k);
    let mut weights = Vec::with_capacity(rows * top_k);
    let mut probs = vec![0.0f32; n_experts];
    let mut choice = vec![0.0f32; n_experts];
    let mut order: Vec<usize> = Vec::with_capacity(n_experts);
    for row in logits.chunks_exact(n_experts) {
        let scores = match routing {
            Routing::SoftmaxTopK { .. } => {
                softmax(row, &mut probs);
                &probs[..]
            }
            Routing::GroupedSigmoid { .. } => {
                probs.iter_mut().zip(row).for_each(|(p, &l)| *p = 1.0 / (1.0 + (-l).exp()));
                &probs[..]
            }
            Routing::TopKSoftmax | Routing::SigmoidInput => row,
        };
        let by: &[f32] = match routing {
            Routing::GroupedSigmoid { n_group, topk_group, .. } => {
                grouped_choice(scores, selection_bias, n_group, topk_group, &mut choice);
                &choice
            }
            _ => scores,
        };
        order.clear();
        order.extend(0..n_experts);
        order.sort_by(|&a, &b| topk_order((a, by[a]), (b, by[b])));
        let chosen = &order[..top_k];
        let mut w: Vec<f32> = chosen.iter().map(|&e| scores[e]).collect();
        match routing {
            Routing::SoftmaxTopK { renormalize: true } => {
                let sum: f32 = w.iter().sum();
                w.iter_mut().for_each(|v| *v /= sum);
            }
            Routing::SoftmaxTopK { renormalize: false } => {}
            Routing::TopKSoftmax => {
                let logits = w.clone();
                softmax(&logits, &mut w);
            }
            Routing::SigmoidInput => w.iter_mut().for_each(|v| *v = 1.0 / (1.0 + (-*v).exp())),
            Routing::GroupedSigmoid { renormalize, scale, .. } => {
                if renormalize {
                    let sum = w.iter().sum::<f32>() + 1e-20;
                    w.iter_mut().for_each(|v| *v /= sum);
                }
                w.iter_mut().for_each(|v| *v *= scale);
            }
        }
        experts.extend(chosen.iter().map(|&e| e as u32));
        weights.extend(w);
    }
    Routes { top_k, experts, weights }
}

/// The choice values of [`Routing::GroupedSigmoid`] (`Glm4MoeTopkRouter.forward`): `s + b` for
/// the experts of the `topk_group` best of `n_group` consecutive groups, a group scored by the
/// sum of its two largest `s + b`; `-inf` elsewhere (`masked_fill(~score_mask, -inf)`).
///
/// # Shapes
/// - `scores`, `out`: `[n_experts]`; `bias`: `[n_experts]` or empty (none)
fn grouped_choice(scores: &[f32], bias: &[f32], n_group: usize, topk_group: usize, out: &mut [f32]) {
    for (e, (o, &s)) in out.iter_mut().zip(scores).enumerate() {
        *o = s + bias.get(e).copied().unwrap_or(0.0);
    }
    let size = out.len() / n_group.max(1);
    let group_scores: Vec<f32> = out
        .chunks_exact(size.max(1))
        .map(|g| {
            let mut idx: Vec<usize> = (0..g.len()).collect();
            idx.sort_by(|&a, &b| topk_order((a, g[a]), (b, g[b])));
            idx.iter().take(2).map(|&i| g[i]).sum()
        })
        .collect();
    let mut groups: Vec<usize> = (0..group_scores.len()).collect();
    groups.sort_by(|&a, &b| topk_order((a, group_scores[a]), (b, group_scores[b])));
    for &g in &groups[topk_group.min(groups.len())..] {
        out[g * size..(g + 1) * size].iter_mut().for_each(|v| *v = f32::NEG_INFINITY);
    }
}

/// `torch.topk`'s order: larger first, NaN above every number, ties by ascending index.
fn topk_order((ia, a): (usize, f32), (ib, b): (usize, f32)) -> std::cmp::Ordering {
    use std::cmp::Ordering::{Equal, Greater, Less};
    let by_value = match (a.is_nan(), b.is_nan()) {
        (true, true) => Equal,
        (true, false) => Less,
        (false, true) => Greater,
        (false, false) => b.partial_cmp(&a).unwrap_or(Equal),
    };
    by_value.then(ia.cmp(&ib))
}

/// `out = softmax(x)` in f32: `exp(x − max)` over its sum.
fn softmax(x: &[f32], out: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for (o, &v) in out.iter_mut().zip(x) {
        *o = (v - max).exp();
        sum += *o;
    }
    out.iter_mut().for_each(|o| *o /= sum);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::placement::{AttentionKernel, LinearKernel, RoundingPath};
    use crate::{Llama, Positions};
    use qdrift_codecs::{ActivationQuant, DynamicFormat};
    use qdrift_weights::{Ffn, HostModel};

    /// Deterministic values in `[-scale, scale)` (a 64-bit LCG).
    fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    }

    fn tensor(shape: &[usize], seed: u64, scale: f32) -> HostTensor {
        let n = shape.iter().product();
        // f16 values, so an f16 model holds the same weights.
        let data = values(n, seed, scale).into_iter().map(|v| half::f16::from_f32(v).to_f32()).collect();
        HostTensor { shape: shape.to_vec(), data }
    }

    struct Setup {
        experts: Experts,
        spec: MoeSpec,
        activation: Activation,
        dim: usize,
    }

    fn setup(dim: usize, n: usize, k: usize, hid: usize, routing: Routing, biases: bool) -> Setup {
        let bias = |len: usize, seed: u64| biases.then(|| tensor(&[len], seed, 0.1));
        let experts = Experts {
            router: tensor(&[n, dim], 1, 0.5),
            router_bias: bias(n, 2),
            experts: (0..n as u64)
                .map(|e| Mlp {
                    gate: tensor(&[hid, dim], 10 + e, 0.3),
                    up: tensor(&[hid, dim], 100 + e, 0.3),
                    down: tensor(&[dim, hid], 1000 + e, 0.3),
                    gate_bias: bias(hid, 20 + e),
                    up_bias: bias(hid, 200 + e),
                    down_bias: bias(dim, 2000 + e),
                })
                .collect(),
            shared: None,
        };
        let spec = MoeSpec {
            n_experts: n,
            top_k: k,
            expert_hidden: hid,
            routing,
            dense_layers: vec![],
            shared_expert_hidden: None,
        };
        let activation =
            if biases { Activation::ClampedSwiGlu { alpha: 1.702, limit: 7.0 } } else { Activation::SwiGlu };
        Setup { experts, spec, activation, dim }
    }

    /// `s` with a Qwen2-MoE shared expert of width 24 and its gate.
    fn with_shared(mut s: Setup) -> Setup {
        let (dim, w) = (s.dim, 24);
        s.experts.shared = Some(SharedExpert {
            mlp: Mlp::new(tensor(&[w, dim], 7, 0.3), tensor(&[w, dim], 8, 0.3), tensor(&[dim, w], 9, 0.3)),
            gate: tensor(&[1, dim], 6, 0.5),
        });
        s.spec.shared_expert_hidden = Some(w);
        s
    }

    fn build(s: &Setup, dtype: DType, kernel: LinearKernel) -> MoeLayer {
        let device = Device::flex();
        let store = ProjectionStore { dtype, device: &device, kernel, compact: true, max_buffer_bytes: None };
        MoeLayer::from_host(3, &s.experts, &s.spec, s.activation, store).expect("builds")
    }

    fn context(
        positions: &Positions,
        activations: Option<(ActivationQuant, RoundingPath)>,
        t: usize,
        f16: bool,
    ) -> ForwardContext<'_> {
        let real = match activations {
            Some((q, RoundingPath::Device)) if q.scale == ActivationScale::Tensor => {
                Some(positions.real(0, t, &Device::flex()))
            }
            _ => None,
        };
        ForwardContext {
            rope: None,
            grouped_rope: None,
            swaps: &[],
            host_rope: None,
            mask: None,
            fused_mask: None,
            positions,
            start: 0,
            activations,
            real,
            f16,
            routing: None,
            inputs: Default::default(),
        }
    }

    fn input(b: usize, t: usize, dim: usize, seed: u64, dtype: DType) -> Tensor<3> {
        upload(&values(b * t * dim, seed, 1.0), [b, t, dim], dtype, &Device::flex())
    }

    /// The f64 routing of one row, independently: sort by value (descending, stable by id).
    fn naive_route(row: &[f64], k: usize, routing: Routing) -> (Vec<usize>, Vec<f64>) {
        let softmax = |v: &[f64]| {
            let m = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = v.iter().map(|x| (x - m).exp()).collect();
            let s: f64 = e.iter().sum();
            e.into_iter().map(|x| x / s).collect::<Vec<f64>>()
        };
        let scores = match routing {
            Routing::SoftmaxTopK { .. } => softmax(row),
            Routing::TopKSoftmax | Routing::SigmoidInput => row.to_vec(),
            // One group, no bias: the choice is the scores'.
            Routing::GroupedSigmoid { .. } => row.iter().map(|v| 1.0 / (1.0 + (-v).exp())).collect(),
        };
        let mut ids: Vec<usize> = (0..row.len()).collect();
        ids.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
        ids.truncate(k);
        let chosen: Vec<f64> = ids.iter().map(|&e| scores[e]).collect();
        let w = match routing {
            Routing::SoftmaxTopK { renormalize: true } => {
                let s: f64 = chosen.iter().sum();
                chosen.iter().map(|v| v / s).collect()
            }
            Routing::SoftmaxTopK { renormalize: false } => chosen,
            Routing::TopKSoftmax => softmax(&chosen),
            Routing::SigmoidInput => chosen.iter().map(|v| 1.0 / (1.0 + (-v).exp())).collect(),
            Routing::GroupedSigmoid { renormalize, scale, .. } => {
                let s: f64 = if renormalize { chosen.iter().sum::<f64>() + 1e-20 } else { 1.0 };
                chosen.iter().map(|v| v / s * f64::from(scale)).collect()
            }
        };
        (ids, w)
    }

    const ROUTINGS: [Routing; 3] =
        [Routing::SoftmaxTopK { renormalize: true }, Routing::SoftmaxTopK { renormalize: false }, Routing::TopKSoftmax];

    #[test]
    fn routing_matches_a_naive_f64_computation() {
        let (rows, n, k) = (50, 8, 3);
        let logits = values(rows * n, 7, 4.0);
        let grouped = Routing::GroupedSigmoid { n_group: 1, topk_group: 1, renormalize: true, scale: 2.5 };
        for routing in ROUTINGS.into_iter().chain([grouped]) {
            let r = route(&logits, n, k, routing, &[]);
            assert_eq!((r.experts.len(), r.weights.len()), (rows * k, rows * k));
            for (i, row) in logits.chunks(n).enumerate() {
                let (ids, w) = naive_route(&row.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(), k, routing);
                let got: Vec<usize> = r.experts[i * k..(i + 1) * k].iter().map(|&e| e as usize).collect();
                assert_eq!(got, ids, "{routing:?} row {i}");
                for (g, w) in r.weights[i * k..(i + 1) * k].iter().zip(&w) {
                    assert!((f64::from(*g) - w).abs() < 1e-6, "{routing:?} row {i}: {g} vs {w}");
                }
            }
        }
    }

    /// `Glm4MoeTopkRouter` by hand: 4 groups of 2, the best 2 groups kept (by the sum of their two
    /// `σ + b`), top-2 within them by `σ + b`, weights `σ` renormalized and scaled.
    #[test]
    fn grouped_routing_chooses_within_the_best_groups() {
        let routing = Routing::GroupedSigmoid { n_group: 4, topk_group: 2, renormalize: true, scale: 2.5 };
        let logits = [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        let bias = [0.45, 0.0, 0.4, 0.0, 0.0, 0.0, 0.3, 0.35];
        // σ + b: [1.181, .5, .9, .5, .5, .5, .8, .85]; groups 1.681, 1.4, 1.0, 1.65: groups 0 and 3
        // kept, so expert 2 (.9) is out and experts 0 and 7 are chosen.
        let r = route(&logits, 8, 2, routing, &bias);
        assert_eq!(r.experts, [0, 7]);
        let s0 = 1.0 / (1.0 + (-1.0f64).exp());
        let want = [s0 / (s0 + 0.5) * 2.5, 0.5 / (s0 + 0.5) * 2.5];
        for (w, want) in r.weights.iter().zip(want) {
            assert!((f64::from(*w) - want).abs() < 1e-6, "{w} vs {want}");
        }
        // Without the groups' limit (one group), expert 2 comes second.
        let flat = Routing::GroupedSigmoid { n_group: 1, topk_group: 1, renormalize: false, scale: 1.0 };
        let r = route(&logits, 8, 2, flat, &bias);
        assert_eq!((r.experts.as_slice(), r.weights[1]), (&[0, 2][..], 0.5));
    }

    #[test]
    fn ties_go_to_the_lower_expert_and_nan_ranks_first() {
        for routing in ROUTINGS {
            let r = route(&[1.0, 3.0, 3.0, 0.5, 3.0], 5, 2, routing, &[]);
            assert_eq!(r.experts, [1, 2], "{routing:?}");
            assert_eq!(r.weights[0], r.weights[1], "{routing:?}");
            // −0 and +0 are equal: the lower id first.
            let r = route(&[-1.0, 0.0, -0.0, -2.0], 4, 2, routing, &[]);
            assert_eq!(r.experts, [1, 2], "{routing:?}");
        }
        // torch.topk ranks NaN above every number.
        let r = route(&[1.0, f32::NAN, 2.0], 3, 2, Routing::TopKSoftmax, &[]);
        assert_eq!(r.experts, [1, 2]);
    }

    #[test]
    fn shapes_are_checked_and_named() {
        let mut s = setup(16, 4, 2, 8, Routing::TopKSoftmax, true);
        s.experts.experts[2].down_bias = Some(tensor(&[15], 3, 0.1));
        let device = Device::flex();
        let store = ProjectionStore::f32_for(&device, LinearKernel::Host);
        let err = MoeLayer::from_host(5, &s.experts, &s.spec, s.activation, store).expect_err("bad bias");
        assert!(err.to_string().contains("model.layers.5.mlp.experts.2.down_proj.bias"), "{err}");
        let mut s = setup(16, 4, 2, 8, Routing::TopKSoftmax, true);
        s.spec.n_experts = 5;
        let err = MoeLayer::from_host(5, &s.experts, &s.spec, s.activation, store).expect_err("count");
        assert!(err.to_string().contains("4 experts given"), "{err}");
    }

    /// The naive computation: every expert on every row, weighted by the routing mask (0 where a
    /// row did not choose it), summed in ascending expert id.
    fn every_expert_on_every_row(layer: &MoeLayer, x: Tensor<3>, context: &ForwardContext) -> Tensor<3> {
        let ([b, t, dim], dtype, device) = (x.dims(), x.dtype(), x.device());
        let logits = host_f32(layer.router.forward_to(x.clone(), DType::F32));
        let routes = route(&logits, layer.n_experts(), layer.top_k, layer.routing, &layer.selection_bias);
        let x = context.round_input(x, InputSite::Up);
        let mut out = Tensor::<3>::zeros([b, t, dim], (&device, dtype));
        for (e, expert) in layer.experts.iter().enumerate() {
            let mut mask = vec![0.0f32; b * t];
            for (slot, (&id, &w)) in routes.experts.iter().zip(&routes.weights).enumerate() {
                if id as usize == e {
                    mask[slot / layer.top_k] = w;
                }
            }
            let h = gated(layer.activation, expert.gate.forward(x.clone()), expert.up.forward(x.clone()));
            let y = expert.down.forward(h);
            out = out + y * upload(&mask, [b, t, 1], dtype, &device);
        }
        out
    }

    #[test]
    fn gathered_experts_equal_every_expert_on_every_row() {
        let (b, t) = (3, 7);
        for (routing, biases) in [(Routing::SoftmaxTopK { renormalize: true }, false), (Routing::TopKSoftmax, true)] {
            let s = setup(32, 8, 2, 24, routing, biases);
            for kernel in [LinearKernel::Host, LinearKernel::Burn] {
                for dtype in [DType::F32, DType::F16] {
                    let layer = build(&s, dtype, kernel);
                    let positions = Positions::left_padded(&[t, t, t]);
                    let ctx = context(&positions, None, t, dtype == DType::F16);
                    let x = input(b, t, s.dim, 9, dtype);
                    let got = host_f32(layer.forward(x.clone(), &ctx));
                    let want = host_f32(every_expert_on_every_row(&layer, x, &ctx));
                    let what = format!("{routing:?} {kernel:?} {dtype:?}");
                    if kernel == LinearKernel::Host {
                        // Host linear layers compute each row alone, and the sums run in the
                        // same order: the same bits.
                        assert_eq!(got, want, "{what}");
                    } else {
                        let tol = if dtype == DType::F16 { 2e-3 } else { 1e-6 };
                        for (g, w) in got.iter().zip(&want) {
                            assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{what}: {g} vs {w}");
                        }
                    }
                }
            }
        }
    }

    /// On the CPU backend the host path gives the Burn-op path's values bit for bit, in f32 and
    /// f16, with and without activation rounding (each scale), padding included.
    #[test]
    fn the_host_path_equals_the_tensor_path() {
        let plain = setup(32, 8, 3, 16, Routing::SoftmaxTopK { renormalize: false }, false);
        let shared = with_shared(setup(32, 8, 3, 16, Routing::SoftmaxTopK { renormalize: false }, false));
        for s in [plain, shared] {
            host_path_equals_tensor_path(&s);
        }
    }

    fn host_path_equals_tensor_path(s: &Setup) {
        let (b, t, lengths) = (2, 6, [3usize, 6]);
        let positions = Positions::left_padded(&lengths);
        let quants =
            [None, Some(ActivationScale::Token), Some(ActivationScale::Tensor), Some(ActivationScale::TokenGroup(8))];
        for dtype in [DType::F32, DType::F16] {
            let layer = build(s, dtype, LinearKernel::Host);
            for scale in quants {
                let q = scale.map(|scale| {
                    (
                        ActivationQuant { format: DynamicFormat::Fp8(qdrift_codecs::Fp8Format::E4M3), scale },
                        RoundingPath::Host,
                    )
                });
                let ctx = context(&positions, q, t, dtype == DType::F16);
                assert!(layer.runs_on_host(&ctx));
                let x = input(b, t, s.dim, 21, dtype);
                let host = layer.forward_host(host_f32(x.clone()), [b, t], &ctx, None);
                let tensors = host_f32(layer.forward_tensors(x, &ctx, None));
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                let shared = s.experts.shared.is_some();
                assert_eq!(bits(&host), bits(&tensors), "{dtype:?} {scale:?}, shared expert {shared}");
            }
        }
    }

    /// An f64 forward pass of the layer from its host weights.
    fn naive_f64(s: &Setup, x: &[f32]) -> Vec<f64> {
        let (dim, hid, k) = (s.dim, s.spec.expert_hidden, s.spec.top_k);
        let lin = |w: &HostTensor, b: Option<&HostTensor>, x: &[f64]| -> Vec<f64> {
            let inp = w.shape[1];
            (0..w.shape[0])
                .map(|o| {
                    let dot: f64 = (0..inp).map(|i| f64::from(w.data[o * inp + i]) * x[i]).sum();
                    dot + b.map_or(0.0, |b| f64::from(b.data[o]))
                })
                .collect()
        };
        let mut out = Vec::new();
        for row in x.chunks(dim) {
            let row: Vec<f64> = row.iter().map(|&v| f64::from(v)).collect();
            let logits = lin(&s.experts.router, s.experts.router_bias.as_ref(), &row);
            let (ids, w) = naive_route(&logits, k, s.spec.routing);
            let mut y = vec![0.0f64; dim];
            let mut order: Vec<(usize, f64)> = ids.into_iter().zip(w).collect();
            order.sort_by_key(|&(e, _)| e);
            for (e, w) in order {
                let m = &s.experts.experts[e];
                let g = lin(&m.gate, m.gate_bias.as_ref(), &row);
                let u = lin(&m.up, m.up_bias.as_ref(), &row);
                let h: Vec<f64> = (0..hid)
                    .map(|i| match s.activation {
                        Activation::ClampedSwiGlu { alpha, limit } => {
                            let (a, l) = (f64::from(alpha), f64::from(limit));
                            let g = g[i].min(l);
                            (u[i].clamp(-l, l) + 1.0) * g / (1.0 + (-a * g).exp())
                        }
                        _ => g[i] / (1.0 + (-g[i]).exp()) * u[i],
                    })
                    .collect();
                for (yv, d) in y.iter_mut().zip(lin(&m.down, m.down_bias.as_ref(), &h)) {
                    *yv += w * d;
                }
            }
            if let Some(sh) = &s.experts.shared {
                // `Qwen2MoeSparseMoeBlock`: + σ(gate·x) · shared(x).
                let m = &sh.mlp;
                let (g, u) = (lin(&m.gate, None, &row), lin(&m.up, None, &row));
                let h: Vec<f64> = g.iter().zip(&u).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
                let gate = 1.0 / (1.0 + (-lin(&sh.gate, None, &row)[0]).exp());
                for (yv, d) in y.iter_mut().zip(lin(&m.down, None, &h)) {
                    *yv += gate * d;
                }
            }
            out.extend(y);
        }
        out
    }

    #[test]
    fn the_layer_matches_an_f64_forward_pass() {
        let (b, t) = (2, 9);
        for (routing, biases, shared) in [
            (Routing::SoftmaxTopK { renormalize: true }, false, false),
            (Routing::SoftmaxTopK { renormalize: false }, false, false),
            (Routing::SoftmaxTopK { renormalize: false }, false, true),
            (Routing::TopKSoftmax, true, false),
        ] {
            let s = setup(32, 6, 2, 16, routing, biases);
            let s = if shared { with_shared(s) } else { s };
            let positions = Positions::left_padded(&[t, t]);
            let x = values(b * t * s.dim, 4, 1.0);
            let want = naive_f64(&s, &x);
            for (dtype, tol) in [(DType::F32, 1e-5), (DType::F16, 2e-2)] {
                let layer = build(&s, dtype, LinearKernel::Host);
                let ctx = context(&positions, None, t, dtype == DType::F16);
                let got = host_f32(layer.forward(upload(&x, [b, t, s.dim], dtype, &Device::flex()), &ctx));
                let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!((f64::from(*g) - w).abs() <= tol * scale, "{routing:?} {dtype:?} [{i}]: {g} vs {w}");
                }
            }
        }
    }

    /// With activation rounding, and per-sequence (per-tensor) scales in particular, a sequence's
    /// outputs do not depend on its neighbours in the batch nor on its padding: each sequence of a
    /// left-padded batch gives, bit for bit, what it gives alone.
    #[test]
    fn a_sequence_routes_and_rounds_as_it_does_alone() {
        let s = setup(32, 8, 2, 16, Routing::SoftmaxTopK { renormalize: true }, false);
        let lengths = [4usize, 9];
        let t = 9;
        let x = values(2 * t * s.dim, 12, 1.0);
        for scale in [ActivationScale::Tensor, ActivationScale::Token, ActivationScale::TokenGroup(8)] {
            for path in [RoundingPath::Host, RoundingPath::Device] {
                let q = ActivationQuant { format: DynamicFormat::Int8, scale };
                let layer = build(&s, DType::F32, LinearKernel::Host);
                let positions = Positions::left_padded(&lengths);
                let ctx = context(&positions, Some((q, path)), t, false);
                let batch = host_f32(layer.forward(upload(&x, [2, t, s.dim], DType::F32, &Device::flex()), &ctx));
                let plain = host_f32(layer.forward(
                    upload(&x, [2, t, s.dim], DType::F32, &Device::flex()),
                    &context(&positions, None, t, false),
                ));
                assert_ne!(batch, plain, "{scale:?} {path:?} rounds");
                for (row, &len) in lengths.iter().enumerate() {
                    let pad = t - len;
                    let own = &x[(row * t + pad) * s.dim..(row + 1) * t * s.dim];
                    let alone_positions = Positions::left_padded(&[len]);
                    let ctx = context(&alone_positions, Some((q, path)), len, false);
                    let alone =
                        host_f32(layer.forward(upload(own, [1, len, s.dim], DType::F32, &Device::flex()), &ctx));
                    assert_eq!(
                        &batch[(row * t + pad) * s.dim..(row + 1) * t * s.dim],
                        &alone[..],
                        "{scale:?} {path:?} row {row}"
                    );
                }
            }
        }
    }

    #[test]
    fn routing_is_recorded_in_order_of_weight() {
        let s = setup(16, 4, 2, 8, Routing::TopKSoftmax, true);
        let layer = build(&s, DType::F32, LinearKernel::Host);
        let positions = Positions::left_padded(&[3, 3]);
        let ctx = context(&positions, None, 3, false);
        let record = Mutex::new(RoutingRecord::default());
        let x = input(2, 3, 16, 5, DType::F32);
        let logits = host_f32(layer.router.forward_to(x.clone(), DType::F32));
        layer.forward_recording(x, &ctx, Some(&record));
        let record = record.into_inner().expect("not poisoned");
        assert_eq!(record.layers.len(), 1);
        let entry = &record.layers[0];
        assert_eq!((entry.layer, entry.shape), (3, [2, 3, 2]));
        for (row, ids) in logits.chunks(4).zip(entry.experts.chunks(2)) {
            let (first, second) = (ids[0] as usize, ids[1] as usize);
            assert!(row[first] >= row[second] && row.iter().all(|&v| v <= row[first]), "{row:?} {ids:?}");
        }
    }

    #[test]
    fn host_weights_round_trip() {
        let with = with_shared(setup(16, 4, 2, 8, Routing::SoftmaxTopK { renormalize: false }, false));
        for s in [setup(16, 4, 2, 8, Routing::TopKSoftmax, true), with] {
            for kernel in [LinearKernel::Host, LinearKernel::Burn] {
                assert_eq!(build(&s, DType::F32, kernel).host_weights(), s.experts, "{kernel:?}");
            }
        }
    }

    /// A shared expert the architecture and the weights disagree on is refused, naming the layer.
    #[test]
    fn a_shared_expert_the_spec_lacks_is_refused() {
        let device = Device::flex();
        let store = ProjectionStore::f32_for(&device, LinearKernel::Host);
        let mut s = with_shared(setup(16, 4, 2, 8, Routing::SoftmaxTopK { renormalize: false }, false));
        s.spec.shared_expert_hidden = None;
        let e = MoeLayer::from_host(3, &s.experts, &s.spec, s.activation, store).expect_err("refused");
        assert!(e.to_string().contains("layer 3: the weights have a shared expert"), "{e}");
        let mut s = setup(16, 4, 2, 8, Routing::SoftmaxTopK { renormalize: false }, false);
        s.spec.shared_expert_hidden = Some(24);
        let e = MoeLayer::from_host(3, &s.experts, &s.spec, s.activation, store).expect_err("refused");
        assert!(e.to_string().contains("layer 3: the weights lack a shared expert"), "{e}");
    }

    /// On wgpu (Mesa's lavapipe here, any adapter in CI) the layer gives flex's values within f32
    /// rounding, gpt-oss's routing and biases included; the run-time choices (top-k on the host)
    /// are the same.
    #[test]
    fn wgpu_matches_flex() {
        let wgpu = crate::testing::test_wgpu();
        let (b, t) = (2, 5);
        let positions = Positions::left_padded(&[3, 5]);
        for (routing, biases, shared) in [
            (Routing::SoftmaxTopK { renormalize: true }, false, false),
            (Routing::TopKSoftmax, true, false),
            (Routing::SoftmaxTopK { renormalize: false }, false, true),
        ] {
            let s = setup(32, 8, 2, 16, routing, biases);
            let s = if shared { with_shared(s) } else { s };
            let x = values(b * t * s.dim, 31, 1.0);
            let flex =
                host_f32(build(&s, DType::F32, LinearKernel::Burn).forward(
                    upload(&x, [b, t, s.dim], DType::F32, &Device::flex()),
                    &context(&positions, None, t, false),
                ));
            let store = ProjectionStore::f32_for(&wgpu, LinearKernel::Burn);
            let layer = MoeLayer::from_host(0, &s.experts, &s.spec, s.activation, store).expect("builds");
            let got = host_f32(
                layer.forward(upload(&x, [b, t, s.dim], DType::F32, &wgpu), &context(&positions, None, t, false)),
            );
            for (i, (g, f)) in got.iter().zip(&flex).enumerate() {
                assert!((g - f).abs() <= 1e-5 * (1.0 + f.abs()), "{routing:?} [{i}]: wgpu {g} vs flex {f}");
            }
        }
    }

    /// The "tiny" preset (2 layers, dim 32) with a mixture of experts in layer 0 (4 experts of
    /// width 24, top-2) and its dense FFN in layer 1, all weights f16 values.
    fn tiny_moe(routing: Routing) -> HostModel {
        let mut m = qdrift_load::synthetic_model("tiny", 5).expect("tiny").model;
        let s = setup(m.arch.dim, 4, 2, 24, routing, false);
        m.arch.moe = Some(MoeSpec { dense_layers: vec![1], ..s.spec });
        m.layers[0].ffn = Ffn::Experts(s.experts);
        m.round_to_f16();
        m
    }

    const TOKENS: [i32; 9] = [1, 75, 104, 3, 319, 200, 42, 7, 7];

    /// Logits of every position (the first `split` tokens as one pass, then one per step), with
    /// the routing record of the passes.
    fn model_logits(model: &Llama, split: usize, kernel: AttentionKernel) -> (Vec<f32>, RoutingRecord) {
        let device = model.device();
        let ids = |t: &[i32]| Tensor::<2, Int>::from_data(TensorData::new(t.to_vec(), [1, t.len()]), &device);
        let positions = Positions::left_padded(&[TOKENS.len()]);
        let mut caches = model.new_caches_for(1, TOKENS.len(), kernel);
        let record = Mutex::new(RoutingRecord::default());
        let mut out = Vec::new();
        for chunk in std::iter::once(&TOKENS[..split]).chain(TOKENS[split..].chunks(1)) {
            let h = model.forward_hidden_recording(ids(chunk), &positions, &mut caches, true, Some(&record));
            out.extend(host_f32(model.head(h)));
        }
        (out, record.into_inner().expect("not poisoned"))
    }

    /// A model with experts builds from its host model and gives it back; on the CPU backend its
    /// decoding steps give teacher forcing's logits bit for bit (host caches), device caches and
    /// Burn's linear layers agree within f32 rounding; the routing record holds layer 0's choices
    /// of every pass, the same whichever way the columns came.
    #[test]
    fn a_model_with_experts_runs_as_one_with_dense_layers() {
        for routing in ROUTINGS {
            let host = tiny_moe(routing);
            let model = Llama::from_host_with(&host, DType::F32, &Device::flex(), LinearKernel::Host).expect("builds");
            assert!(model.host_weights() == host, "{routing:?} round trip");
            assert!(model.steps_match_teacher_forcing(), "{routing:?}: the experts run on the host");
            let (forced, forced_routes) = model_logits(&model, TOKENS.len(), AttentionKernel::Host);
            let (stepped, stepped_routes) = model_logits(&model, 3, AttentionKernel::Host);
            assert_eq!(forced_routes.layers.len(), 1);
            assert_eq!((forced_routes.layers[0].layer, forced_routes.layers[0].shape), (0, [1, TOKENS.len(), 2]));
            assert_eq!(stepped_routes.layers.len(), 1 + TOKENS.len() - 3);
            let steps: Vec<u32> = stepped_routes.layers.iter().flat_map(|l| l.experts.clone()).collect();
            assert_eq!(steps, forced_routes.layers[0].experts, "{routing:?}: the same choices");
            let same = |a: &[f32], b: &[f32], what: &str| {
                let diff = a.iter().zip(b).position(|(x, y)| x.to_bits() != y.to_bits());
                let delta = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
                assert!(diff.is_none(), "{routing:?} {what}: first difference at {diff:?}, max {delta:e}");
            };
            same(&stepped, &forced, "steps against teacher forcing");
            // Burn's composed attention over device caches sums in another order.
            let (composed, _) = model_logits(&model, 3, AttentionKernel::Composed);
            let delta = composed.iter().zip(&forced).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            assert!(delta < 1e-5, "{routing:?}: device caches {delta:e} from host caches");
            let burn = Llama::from_host_with(&host, DType::F32, &Device::flex(), LinearKernel::Burn).expect("builds");
            assert!(burn.host_weights() == host, "{routing:?} round trip (Burn)");
            let (got, _) = model_logits(&burn, 3, AttentionKernel::Composed);
            let delta = got.iter().zip(&forced).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            assert!(delta < 1e-4, "{routing:?}: Burn's linear layers {delta:e} from the host's");
        }
    }

    #[test]
    fn experts_the_architecture_and_the_weights_disagree_on_are_refused() {
        let mut host = tiny_moe(Routing::TopKSoftmax);
        host.arch.moe.as_mut().expect("moe").dense_layers = vec![];
        let e = Llama::from_host(&host, DType::F32, &Device::flex()).expect_err("layer 1 is dense");
        assert!(e.to_string().contains("layer 1 has a dense feed-forward layer"), "{e}");
        host.arch.moe.as_mut().expect("moe").dense_layers = vec![0, 1];
        let e = Llama::from_host(&host, DType::F32, &Device::flex()).expect_err("layer 0 has experts");
        assert!(e.to_string().contains("layer 0 has experts"), "{e}");
        let mut host = tiny_moe(Routing::TopKSoftmax);
        host.arch.moe.as_mut().expect("moe").top_k = 5;
        let e = Llama::from_host(&host, DType::F32, &Device::flex()).expect_err("top-k");
        assert!(e.to_string().contains("top-k 5"), "{e}");
    }

    /// Milliseconds of the fastest of `runs` calls of `f` (after one warm-up call).
    fn best_ms(runs: usize, f: impl Fn() -> Vec<f32>) -> f64 {
        std::hint::black_box(f());
        (0..runs)
            .map(|_| {
                let start = std::time::Instant::now();
                std::hint::black_box(f());
                start.elapsed().as_secs_f64() * 1e3
            })
            .fold(f64::INFINITY, f64::min)
    }

    /// The cost of a mixture of experts (8 experts of width 512, top-2) against a dense SwiGLU
    /// layer of width 1024 (the same active parameters), dim 512, 8 × 64 tokens, f32 on flex:
    /// ms per layer forward, printed. Run with `--ignored --nocapture`.
    #[test]
    #[ignore = "timing; run with --ignored --nocapture"]
    fn cost_against_a_dense_layer_with_the_same_active_parameters() {
        use crate::ffn::FeedForward;
        let (dim, width, n, k, b, t) = (512, 512, 8, 2, 8, 64);
        let s = setup(dim, n, k, width, Routing::SoftmaxTopK { renormalize: true }, false);
        let positions = Positions::left_padded(&vec![t; b]);
        let ctx = context(&positions, None, t, false);
        let device = Device::flex();
        let x = input(b, t, dim, 3, DType::F32);
        for kernel in [LinearKernel::Host, LinearKernel::Burn] {
            let store = ProjectionStore::f32_for(&device, kernel);
            let p = |out: usize, inp: usize, seed: u64| {
                Projection::new(&tensor(&[out, inp], seed, 0.3).data, [out, inp], None, store)
            };
            let dense = FeedForward {
                gate_up: Projections::Each(vec![p(k * width, dim, 1), p(k * width, dim, 2)]),
                down: p(dim, k * width, 3),
                activation: Activation::SwiGlu,
            };
            let layer = build(&s, DType::F32, kernel);
            let dense_ms = best_ms(5, || host_f32(dense.forward(x.clone(), &ctx)));
            let moe_ms = best_ms(5, || host_f32(layer.forward(x.clone(), &ctx)));
            let naive_ms = best_ms(3, || host_f32(every_expert_on_every_row(&layer, x.clone(), &ctx)));
            println!(
                "{kernel:?} linear layers, {b}x{t} tokens, dim {dim}: dense width {}: {dense_ms:.2} ms; \
                 {n} experts of width {width}, top-{k}, gathered: {moe_ms:.2} ms ({:.2}x); every expert on every \
                 token: {naive_ms:.2} ms",
                k * width,
                moe_ms / dense_ms
            );
        }
    }
}
