//! The gated activations of a feed-forward layer `down(act(gate·x, up·x))`, as Burn ops on any
//! device: [`gated`] for each [`Activation`] a [`qdrift_weights::BlockSpec`] (or an expert of a
//! mixture) names. Shared by the dense feed-forward layer (`llama.rs`) and the experts
//! (`moe.rs`).

use burn::tensor::activation::{sigmoid, silu};
use burn::tensor::{DType, Tensor};
use qdrift_weights::Activation;

use crate::tensors::mul_scalar_opmath;

/// `act(gate, up)`, elementwise, in the inputs' dtype:
/// - [`Activation::SwiGlu`]: `silu(g) · u` (`transformers` `SiLUActivation`, as Llama's MLP), in
///   f32 and f16 as Burn's `silu` runs it (the same ops the host kernel mirrors), in bf16 with
///   `silu(g)` computed in f32 and rounded once, as PyTorch computes it on bf16 tensors;
/// - [`Activation::GeluTanh`]: `0.5·g·(1 + tanh(√(2/π)·(g + 0.044715·g³))) · u` (`transformers`
///   `GELUTanh`, `gelu_pytorch_tanh`, Gemma's MLP), the GELU computed in f32 and cast back to the
///   compute dtype before the product, as PyTorch's half-precision `gelu` computes in f32;
/// - [`Activation::ClampedSwiGlu`]: gpt-oss's `GptOssExperts._apply_gate`: `g' = min(g, limit)`,
///   `u' = clamp(u, −limit, limit)`, `(u' + 1) · g' · σ(alpha · g')`, in the compute dtype.
///
/// # Shapes
/// - `gate`, `up`: `[batch, seq, hidden]` → `[batch, seq, hidden]`
pub(crate) fn gated(a: Activation, gate: Tensor<3>, up: Tensor<3>) -> Tensor<3> {
    match a {
        // In bf16 as PyTorch's `silu` on a bf16 tensor: computed in f32, rounded once (Burn's
        // `silu` is `x·σ(x)`, two bf16 roundings). f16 keeps Burn's ops, which the host kernel
        // mirrors bit for bit.
        Activation::SwiGlu if gate.dtype() == DType::BF16 => silu(gate.cast(DType::F32)).cast(DType::BF16) * up,
        Activation::SwiGlu => silu(gate) * up,
        Activation::GeluTanh => {
            let dtype = gate.dtype();
            gelu_tanh(gate.cast(DType::F32)).cast(dtype) * up
        }
        Activation::ClampedSwiGlu { alpha, limit } => {
            let limit = f64::from(limit);
            let g = gate.clamp_max(limit);
            let u = up.clamp(-limit, limit);
            let glu = g.clone() * sigmoid(mul_scalar_opmath(g, f64::from(alpha)));
            (u + 1.0) * glu
        }
    }
}

/// GELU with the tanh approximation, `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, in the
/// input's dtype (`torch.nn.functional.gelu(x, approximate="tanh")`).
///
/// # Shapes
/// - `x`: any → same
fn gelu_tanh<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    // √(2/π), as PyTorch's `M_SQRT2 * M_2_SQRTPI * 0.5`.
    const SQRT_2_OVER_PI: f64 = std::f64::consts::SQRT_2 * std::f64::consts::FRAC_2_SQRT_PI * 0.5;
    let cube = x.clone() * x.clone() * x.clone();
    let inner = (x.clone() + cube.mul_scalar(0.044715)).mul_scalar(SQRT_2_OVER_PI);
    x.mul_scalar(0.5) * (inner.tanh() + 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensors::{host_f32, upload};
    use burn::tensor::Device;

    fn run(a: Activation, g: &[f32], u: &[f32]) -> Vec<f32> {
        let device = Device::flex();
        let t = |v: &[f32]| upload(v, [1, 1, v.len()], DType::F32, &device);
        host_f32(gated(a, t(g), t(u)))
    }

    const G: [f32; 7] = [-9.0, -2.5, -0.3, 0.0, 0.7, 3.1, 8.5];
    const U: [f32; 7] = [1.5, -0.25, 2.0, 4.0, -1.2, 0.6, -8.0];

    fn close(got: &[f32], want: impl Iterator<Item = f64>, what: &str) {
        for (i, (&g, w)) in got.iter().zip(want).enumerate() {
            assert!((f64::from(g) - w).abs() <= 1e-6 * (1.0 + w.abs()), "{what} [{i}]: {g} vs {w}");
        }
    }

    #[test]
    fn swiglu_is_silu_gate_times_up() {
        let got = run(Activation::SwiGlu, &G, &U);
        let want = G.iter().zip(&U).map(|(&g, &u)| {
            let g = f64::from(g);
            g / (1.0 + (-g).exp()) * f64::from(u)
        });
        close(&got, want, "swiglu");
    }

    #[test]
    fn gelu_tanh_matches_the_f64_formula() {
        let got = run(Activation::GeluTanh, &G, &U);
        let want = G.iter().zip(&U).map(|(&g, &u)| {
            let g = f64::from(g);
            let k = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * g * (1.0 + (k * (g + 0.044715 * g.powi(3))).tanh()) * f64::from(u)
        });
        close(&got, want, "gelu_tanh");
    }

    #[test]
    fn clamped_swiglu_clamps_gate_above_and_up_both_ways() {
        let (alpha, limit) = (1.702f32, 7.0f32);
        let got = run(Activation::ClampedSwiGlu { alpha, limit }, &G, &U);
        let want = G.iter().zip(&U).map(|(&g, &u)| {
            let g = f64::from(g).min(7.0);
            let u = f64::from(u).clamp(-7.0, 7.0);
            (u + 1.0) * g / (1.0 + (-1.702 * g).exp())
        });
        close(&got, want, "clamped swiglu");
        // The gate 8.5 is clamped to 7 and the up −8 to −7: (−7 + 1) · 7 · σ(1.702 · 7).
        let last = -6.0 * 7.0 / (1.0 + (-1.702f64 * 7.0).exp());
        assert!((f64::from(got[6]) - last).abs() < 1e-5, "{}", got[6]);
    }
}
