//! The dense gated feed-forward layer ([`FeedForward`]): a block's FFN, and a mixture of experts'
//! shared expert (`moe.rs`).

use burn::module::Module;
use burn::tensor::Tensor;
use qdrift_weights::{Activation, Mlp};

use crate::activation::gated;
use crate::attention::ForwardContext;
use crate::fake_quant::InputSite;
use crate::host::placement;
use crate::host::swiglu::swiglu;
use crate::tensors::{host_f32, upload_owned};
use crate::{Projection, Projections};

/// A gated feed-forward layer: `down(act(gate(x), up(x)))` with the block's activation
/// (`activation.rs`: SwiGLU (Shazeer 2020), GELU-tanh or clamped SwiGLU) and optional biases.
#[derive(Module, Debug)]
pub struct FeedForward {
    /// The gate and up projections, in that order, weights `[dim, hidden]` each (one matmul on
    /// wgpu).
    pub gate_up: Projections,
    /// Down projection, weight `[hidden, dim]`.
    pub down: Projection,
    /// The gated activation.
    #[module(skip)]
    pub activation: Activation,
}

impl FeedForward {
    /// The gate/up input and the down input are rounded as `context`'s activation quantization
    /// says (the gate and up projections share one rounding of their common input).
    ///
    /// # Shapes
    /// - `x`: `[batch, seq, dim]` → `[batch, seq, dim]`
    pub(crate) fn forward(&self, x: Tensor<3>, context: &ForwardContext) -> Tensor<3> {
        if self.runs_on_host(context) {
            // All three on the host: read the input back once, upload the output once.
            let ([b, t, _], dtype, device) = (x.dims(), x.dtype(), x.device());
            let y = self.forward_host(host_f32(x), [b, t], context);
            return upload_owned(y, [b, t, self.down.out_features()], dtype, &device);
        }
        let x = context.round_input(x, InputSite::Up);
        let [g, u]: [Tensor<3>; 2] = self.gate_up.forward(x).try_into().expect("two projections");
        let h = gated(self.activation, g, u);
        self.down.forward(context.round_input(h, InputSite::Down))
    }

    /// Whether [`FeedForward::forward_host`] runs this layer ([`placement::ffn_on_host`]).
    pub(crate) fn runs_on_host(&self, context: &ForwardContext) -> bool {
        placement::ffn_on_host(self.packed_on_host(), context.rounds_on_host())
    }

    /// Whether all three projections are packed on the host and the host kernels cover the
    /// activation (SwiGLU; the others run as Burn ops).
    pub(crate) fn packed_on_host(&self) -> bool {
        self.activation == Activation::SwiGlu && self.gate_up.packed().is_some() && self.down.packed().is_some()
    }

    /// [`FeedForward::forward`] on host values, the output rounded to the compute dtype. Only
    /// where [`FeedForward::runs_on_host`].
    ///
    /// # Shapes
    /// - `xs`: `[batch, seq, dim]`, row-major, values of the compute dtype → `[batch, seq, dim]`
    ///
    /// # Panics
    /// Where [`FeedForward::runs_on_host`] does not hold.
    pub(crate) fn forward_host(&self, mut xs: Vec<f32>, [b, t]: [usize; 2], context: &ForwardContext) -> Vec<f32> {
        let (Some(gate_up), Some(down)) = (self.gate_up.packed(), self.down.packed()) else {
            panic!("FeedForward::forward_host on a layer that does not run on the host");
        };
        let (gate, up) = (gate_up[0], gate_up[1]);
        let f16 = context.f16;
        context.round_host_input(&mut xs, [b, t, gate.inp()], InputSite::Up);
        let g = gate.forward_rounded(&xs, b * t, f16);
        let mut h = up.forward_rounded(&xs, b * t, f16);
        swiglu(&g, &mut h, f16);
        context.round_host_input(&mut h, [b, t, up.out()], InputSite::Down);
        down.forward_rounded(&h, b * t, f16)
    }

    /// The three projections' host weights and biases, as [`Mlp`].
    pub(crate) fn host_weights(&self) -> Mlp {
        let mut gate_up = self.gate_up.host_weights().into_iter();
        let (Some((gate, gate_bias)), Some((up, up_bias))) = (gate_up.next(), gate_up.next()) else {
            unreachable!("a feed-forward layer has a gate and an up projection");
        };
        let (down, down_bias) = self.down.host_weights();
        Mlp { gate, up, down, gate_bias, up_bias, down_bias }
    }
}
