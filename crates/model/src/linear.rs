//! [`Projection`]: a linear layer `y = x·Wᵀ (+ b)`, stored where its device multiplies best
//! ([`LinearKernel`]): as Burn's `Linear` (every backend; what wgpu runs), split by output
//! columns over several `Linear`s where one weight would pass the device's largest buffer
//! ([`SplitLinear`]), or as weights packed once on the host for the CPU backend's own kernel
//! (`host/linear.rs`).

use std::sync::Arc;

use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::tensor::{DType, Device, Tensor};

use qdrift_weights::HostTensor;

use crate::host::elem::round_f16;
use crate::host::linear::PackedLinear;
use crate::host::placement::{LinearKernel, is_cpu};
use crate::tensors::{host_f32, upload, upload_owned};

/// A linear layer in one of its two storages.
#[derive(Module, Debug)]
pub enum Projection {
    /// Burn's layer, weight `[in, out]`.
    Device(Linear),
    /// Burn's layers over consecutive ranges of the output columns, for a weight larger than
    /// the device's largest buffer.
    Split(SplitLinear),
    /// Packed host weights.
    Host(HostProjection),
}

/// A linear layer whose `[in, out]` weight is held as several `[in, out_i]` column ranges, in
/// order, each within the device's largest buffer (Mesa's lavapipe allows 128 MiB in one: less
/// than Llama-3.2-1B's 525 MB f16 output layer). Each output value is the same dot product as in
/// one `Linear`; the ranges' outputs are concatenated.
#[derive(Module, Debug)]
pub struct SplitLinear {
    parts: Vec<Linear>,
}

impl SplitLinear {
    /// # Shapes
    /// - `x`: `[batch, seq, in]` → `[batch, seq, out]`
    fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        Tensor::cat(self.parts.iter().map(|p| p.forward(x.clone())).collect(), 2)
    }
}

/// How many of `total` rows of `row_values` values each, in `dtype`, one buffer of at most
/// `max_bytes` holds (at least one: a single row past the limit is the caller's to refuse), or
/// all of them without a limit.
pub(crate) fn rows_per_buffer(total: usize, row_values: usize, dtype: DType, max_bytes: Option<u64>) -> usize {
    let Some(max) = max_bytes else {
        return total.max(1);
    };
    let row_bytes = (row_values as u64).saturating_mul(dtype.size() as u64).max(1);
    usize::try_from(max / row_bytes).unwrap_or(usize::MAX).clamp(1, total.max(1))
}

/// How a Burn `Linear`'s `[in, out]` weight lies in memory: the layout each backend's matmul
/// reads in place. Measured with `count_launches` and `--timing-json`; the figures are in
/// docs/BENCHMARKS.md, "Weights read in place".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WeightLayout {
    /// `[out, in]` row-major (PyTorch's layout: each output's weights contiguous along k), the
    /// parameter being its transposed view. CubeCL's matmuls (wgpu) read a column-major
    /// right-hand side as it is, where they copy a row-major one to that layout on every call: a
    /// `CopyKernelPack` of the whole weight per projection per decode step, which reads and
    /// writes every weight once more than the matmul does.
    OutMajor,
    /// `[in, out]` row-major, for the CPU backend (flex), whose bf16 matmul is slower from the
    /// transposed view.
    InMajor,
}

impl WeightLayout {
    fn for_device(device: &Device) -> Self {
        if is_cpu(device) { Self::InMajor } else { Self::OutMajor }
    }
}

/// The host storage of a [`Projection`]: no Burn parameters.
#[derive(Module, Debug)]
pub struct HostProjection {
    #[module(skip)]
    packed: Arc<PackedLinear>,
}

/// Where and how [`Projection::new`] stores a layer: the compute dtype, the device, the kernel
/// that will multiply by it, whether host panels of an f32 layer may be stored as f16, and the
/// device's largest buffer in bytes (`None`: no limit of its own).
#[derive(Clone, Copy)]
pub(crate) struct ProjectionStore<'a> {
    pub dtype: DType,
    pub device: &'a Device,
    pub kernel: LinearKernel,
    pub compact: bool,
    pub max_buffer_bytes: Option<u64>,
}

#[cfg(test)]
impl<'a> ProjectionStore<'a> {
    /// f32 layers for `kernel` on `device`, compact, without a buffer limit: what the tests build.
    pub(crate) fn f32_for(device: &'a Device, kernel: LinearKernel) -> Self {
        ProjectionStore { dtype: DType::F32, device, kernel, compact: true, max_buffer_bytes: None }
    }
}

impl Projection {
    /// A layer from `[out, in]` row-major host weights and an optional `[out]` bias, in `store.dtype`
    /// (f32 or f16, rounded to nearest even on the host), stored as `store.kernel` says. Host
    /// panels of an f32 layer are stored as f16 when every weight is an f16 value and `compact`
    /// (`host/linear.rs`'s storage rule; the products are the same).
    pub(crate) fn new(
        weight: &[f32],
        [out, inp]: [usize; 2],
        bias: Option<&[f32]>,
        store: ProjectionStore<'_>,
    ) -> Self {
        let ProjectionStore { dtype, device, kernel, compact, max_buffer_bytes } = store;
        match kernel {
            LinearKernel::Host => {
                let f16 = dtype == DType::F16;
                let packed = if compact {
                    PackedLinear::pack(weight, out, inp, bias, f16)
                } else {
                    PackedLinear::pack_stored(weight, out, inp, bias, f16, f16)
                };
                Self::Host(HostProjection { packed: Arc::new(packed) })
            }
            LinearKernel::Burn => {
                // Burn's Linear multiplies by a [in, out] weight: each column range of it is
                // output rows `lo..hi` of the [out, in] weight, transposed. Its memory layout is
                // the backend's: see `WeightLayout`.
                let layout = WeightLayout::for_device(device);
                let linear = |lo: usize, hi: usize| {
                    let rows = &weight[lo * inp..hi * inp];
                    let weight = match layout {
                        WeightLayout::OutMajor => upload(rows, [hi - lo, inp], dtype, device).transpose(),
                        WeightLayout::InMajor => upload(&transpose(rows, hi - lo, inp), [inp, hi - lo], dtype, device),
                    };
                    Linear {
                        weight: Param::from_tensor(weight),
                        bias: bias.map(|b| Param::from_tensor(upload(&b[lo..hi], [hi - lo], dtype, device))),
                    }
                };
                let per_part = rows_per_buffer(out, inp, dtype, max_buffer_bytes);
                if per_part >= out {
                    return Self::Device(linear(0, out));
                }
                let parts = (0..out).step_by(per_part).map(|lo| linear(lo, (lo + per_part).min(out))).collect();
                Self::Split(SplitLinear { parts })
            }
        }
    }

    /// The packed host weights, for a layer stored on the host.
    pub(crate) fn packed(&self) -> Option<&PackedLinear> {
        match self {
            Self::Device(_) | Self::Split(_) => None,
            Self::Host(h) => Some(&h.packed),
        }
    }

    /// Output width.
    pub fn out_features(&self) -> usize {
        match self {
            Self::Device(linear) => linear.weight.dims()[1],
            Self::Split(s) => s.parts.iter().map(|p| p.weight.dims()[1]).sum(),
            Self::Host(h) => h.packed.out(),
        }
    }

    /// Whether the layer adds a bias.
    pub fn has_bias(&self) -> bool {
        match self {
            Self::Device(linear) => linear.bias.is_some(),
            Self::Split(s) => s.parts[0].bias.is_some(),
            Self::Host(h) => h.packed.has_bias(),
        }
    }

    /// `x·Wᵀ + b`, in `x`'s dtype (the host kernel accumulates in f32 and rounds its output
    /// once).
    ///
    /// # Shapes
    /// - `x`: `[batch, seq, in]` → `[batch, seq, out]`
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let dtype = x.dtype();
        self.forward_to(x, dtype)
    }

    /// [`Projection::forward`] cast to `dtype`: computed and rounded in `x`'s dtype as there,
    /// then converted (the output layer's logits, in f32 whatever the compute dtype).
    ///
    /// # Shapes
    /// - `x`: `[batch, seq, in]` → `[batch, seq, out]` in `dtype`
    pub fn forward_to(&self, x: Tensor<3>, dtype: DType) -> Tensor<3> {
        match self {
            Self::Device(linear) => cast_to(linear.forward(x), dtype),
            Self::Split(s) => cast_to(s.forward(x), dtype),
            Self::Host(h) => {
                let ([b, t, inp], x_dtype, device) = (x.dims(), x.dtype(), x.device());
                assert_eq!(inp, h.packed.inp(), "input width does not match the layer");
                let mut y = h.packed.forward(&host_f32(x), b * t);
                // Rounded to `x`'s dtype; uploading in f16 rounds alike, so only a wider
                // target needs it done here.
                if x_dtype == DType::F16 && dtype != DType::F16 {
                    round_f16(&mut y);
                }
                upload_owned(y, [b, t, h.packed.out()], dtype, &device)
            }
        }
    }

    /// The layer's weights as host values: `[out, in]` row-major (PyTorch's layout, what
    /// [`Projection::new`] took) and the `[out]` bias, exactly as stored (values of the compute
    /// dtype).
    pub(crate) fn host_weights(&self) -> (HostTensor, Option<HostTensor>) {
        match self {
            Self::Device(linear) => burn_linear_weights(linear),
            Self::Split(s) => {
                // Each range's rows of the [out, in] weight, in order.
                let parts: Vec<_> = s.parts.iter().map(burn_linear_weights).collect();
                let out = parts.iter().map(|(w, _)| w.shape[0]).sum();
                let inp = parts[0].0.shape[1];
                let weight = parts.iter().flat_map(|(w, _)| w.data.iter().copied()).collect();
                let bias = parts[0].1.is_some().then(|| HostTensor {
                    shape: vec![out],
                    data: parts.iter().flat_map(|(_, b)| b.iter().flat_map(|b| b.data.iter().copied())).collect(),
                });
                (HostTensor { shape: vec![out, inp], data: weight }, bias)
            }
            Self::Host(h) => {
                let (out, inp) = (h.packed.out(), h.packed.inp());
                let bias = h.packed.bias().map(|b| HostTensor { shape: vec![out], data: b.to_vec() });
                (HostTensor { shape: vec![out, inp], data: h.packed.weights() }, bias)
            }
        }
    }
}

/// One layer of a [`Projections`] set, as [`Projection::new`] takes it: `[out, in]` row-major
/// weights, their shape and an optional `[out]` bias.
pub(crate) type LayerWeights<'a> = (&'a [f32], [usize; 2], Option<&'a [f32]>);

/// Linear layers that read the same input (a layer's q, k and v projections; a gated
/// feed-forward layer's gate and up projections), multiplied as one matmul where the device
/// reads its weights in place (wgpu, `WeightLayout::OutMajor`): one launch and one pass over
/// the input instead of one per layer. Each output value is the same dot product as in its own
/// layer.
#[derive(Module, Debug)]
pub enum Projections {
    /// Each layer stored on its own ([`Projection`]): the CPU backend, host kernels, a weight
    /// split over buffers, or layers of which some have a bias and some not.
    Each(Vec<Projection>),
    /// The layers stacked as one Burn `Linear`.
    Stacked(StackedLinear),
}

/// Linear layers stacked as one Burn `Linear`, held as its transposed view (as
/// `WeightLayout::OutMajor`). Each layer's `[out_i, in]` rows are cut into `groups` equal
/// runs, and the stacked `[Σ out_i, in]` weight holds group 0 of every layer in order, then
/// group 1, …: with one group per key/value head, a layer's q, k and v rows of each head group
/// lie together, so the output `[…, groups, Σ out_i / groups]` splits into heads by views. The
/// biases are stacked alike; `widths` are the `out_i`.
#[derive(Module, Debug)]
pub struct StackedLinear {
    linear: Linear,
    #[module(skip)]
    widths: Vec<usize>,
    #[module(skip)]
    groups: usize,
}

impl StackedLinear {
    /// Where layer `i`'s run of group `g` starts in the stacked output, and its width.
    fn run(&self, i: usize, g: usize) -> (usize, usize) {
        let total: usize = self.widths.iter().sum();
        let before: usize = self.widths[..i].iter().sum();
        (g * total / self.groups + before / self.groups, self.widths[i] / self.groups)
    }
}

impl Projections {
    /// The layers `layers`, all of the same input width, stored as `store` says: stacked in
    /// `groups` runs ([`StackedLinear`]) where `store` puts Burn layers on a device that reads
    /// `[out, in]` rows in place, all of them fit one buffer, every layer's rows split into
    /// `groups` equal runs and either all or none have a bias; each as [`Projection::new`]
    /// otherwise.
    pub(crate) fn new(layers: &[LayerWeights<'_>], groups: usize, store: ProjectionStore<'_>) -> Self {
        let inp = layers.first().map_or(0, |(_, [_, inp], _)| *inp);
        let total: usize = layers.iter().map(|(_, [out, _], _)| out).sum();
        let biased = layers.iter().filter(|(_, _, b)| b.is_some()).count();
        let stack = layers.len() > 1
            && groups > 0
            && store.kernel == LinearKernel::Burn
            && WeightLayout::for_device(store.device) == WeightLayout::OutMajor
            && layers.iter().all(|(_, [out, i], _)| *i == inp && out.is_multiple_of(groups))
            && rows_per_buffer(total, inp, store.dtype, store.max_buffer_bytes) >= total
            && (biased == 0 || biased == layers.len());
        if !stack {
            return Self::each(layers, store);
        }
        let (dtype, device) = (store.dtype, store.device);
        let (mut rows, mut bias) = (Vec::with_capacity(total * inp), Vec::with_capacity(total));
        for g in 0..groups {
            for &(w, [out, _], b) in layers {
                let run = g * out / groups..(g + 1) * out / groups;
                rows.extend_from_slice(&w[run.start * inp..run.end * inp]);
                bias.extend_from_slice(b.map_or(&[][..], |b| &b[run]));
            }
        }
        let bias = (biased > 0).then(|| Param::from_tensor(upload(&bias, [total], dtype, device)));
        let weight = Param::from_tensor(upload(&rows, [total, inp], dtype, device).transpose());
        let widths = layers.iter().map(|(_, [out, _], _)| *out).collect();
        Self::Stacked(StackedLinear { linear: Linear { weight, bias }, widths, groups })
    }

    /// The layers `layers`, each stored as [`Projection::new`] stores it.
    pub(crate) fn each(layers: &[LayerWeights<'_>], store: ProjectionStore<'_>) -> Self {
        Self::Each(layers.iter().map(|&(w, shape, b)| Projection::new(w, shape, b, store)).collect())
    }

    /// Each layer's `x·Wᵀ + b`, in `x`'s dtype, in the order the layers were given. Stacked in
    /// one group, each is a column range of one product: a view where its byte offsets meet the
    /// device's alignment (`burn-cubecl`'s `slice`), else a copy; in several groups, a copy.
    ///
    /// # Shapes
    /// - `x`: `[batch, seq, in]` → one `[batch, seq, out_i]` per layer
    pub fn forward(&self, x: Tensor<3>) -> Vec<Tensor<3>> {
        match self {
            Self::Each(layers) => layers.iter().map(|p| p.forward(x.clone())).collect(),
            Self::Stacked(s) => {
                let y = s.linear.forward(x);
                let [b, t, total] = y.dims();
                if s.groups == 1 {
                    return (0..s.widths.len())
                        .map(|i| {
                            let (lo, w) = s.run(i, 0);
                            y.clone().slice([0..b, 0..t, lo..lo + w])
                        })
                        .collect();
                }
                let y = y.reshape([b, t, s.groups, total / s.groups]);
                (0..s.widths.len())
                    .map(|i| {
                        let (lo, w) = s.run(i, 0);
                        y.clone().slice([0..b, 0..t, 0..s.groups, lo..lo + w]).reshape([b, t, w * s.groups])
                    })
                    .collect()
            }
        }
    }

    /// The stacked product, for a caller that splits it itself: `None` where the layers are
    /// stored each on its own.
    ///
    /// # Shapes
    /// - `x`: `[batch, seq, in]` → `[batch, seq, Σ out_i]` in [`StackedLinear`]'s order
    pub fn forward_stacked(&self, x: Tensor<3>) -> Option<Tensor<3>> {
        match self {
            Self::Each(_) => None,
            Self::Stacked(s) => Some(s.linear.forward(x)),
        }
    }

    /// How many layers the set holds.
    pub fn len(&self) -> usize {
        match self {
            Self::Each(layers) => layers.len(),
            Self::Stacked(s) => s.widths.len(),
        }
    }

    /// Whether the set holds no layer.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Layer `i`'s output width.
    ///
    /// # Panics
    /// If `i` is out of range.
    pub fn out_features(&self, i: usize) -> usize {
        match self {
            Self::Each(layers) => layers[i].out_features(),
            Self::Stacked(s) => s.widths[i],
        }
    }

    /// Whether layer `i` adds a bias.
    ///
    /// # Panics
    /// If `i` is out of range.
    pub fn has_bias(&self, i: usize) -> bool {
        match self {
            Self::Each(layers) => layers[i].has_bias(),
            Self::Stacked(s) => {
                assert!(i < s.widths.len(), "layer {i} of {}", s.widths.len());
                s.linear.bias.is_some()
            }
        }
    }

    /// Every layer's packed host weights, where all are stored on the host.
    pub(crate) fn packed(&self) -> Option<Vec<&PackedLinear>> {
        match self {
            Self::Each(layers) => layers.iter().map(Projection::packed).collect(),
            Self::Stacked(_) => None,
        }
    }

    /// Each layer's weights as host values, as [`Projection::host_weights`] gives them.
    pub(crate) fn host_weights(&self) -> Vec<(HostTensor, Option<HostTensor>)> {
        match self {
            Self::Each(layers) => layers.iter().map(Projection::host_weights).collect(),
            Self::Stacked(s) => {
                let (weight, bias) = burn_linear_weights(&s.linear);
                let inp = weight.shape[1];
                (0..s.widths.len())
                    .map(|i| {
                        let runs = (0..s.groups).map(|g| s.run(i, g));
                        let rows = runs.clone().flat_map(|(lo, w)| &weight.data[lo * inp..(lo + w) * inp]);
                        let b = bias.as_ref().map(|b| HostTensor {
                            shape: vec![s.widths[i]],
                            data: runs.flat_map(|(lo, w)| &b.data[lo..lo + w]).copied().collect(),
                        });
                        (HostTensor { shape: vec![s.widths[i], inp], data: rows.copied().collect() }, b)
                    })
                    .collect()
            }
        }
    }
}

/// A Burn `Linear`'s weights as host values: `[out, in]` row-major and the `[out]` bias.
fn burn_linear_weights(linear: &Linear) -> (HostTensor, Option<HostTensor>) {
    let [inp, out] = linear.weight.val().dims();
    // Read back as `[out, in]`: a copy on the device for an in-major weight, none for an
    // out-major one ([`WeightLayout`]).
    let weight = host_f32(linear.weight.val().transpose());
    let bias = linear.bias.as_ref().map(|b| HostTensor { shape: vec![out], data: host_f32(b.val()) });
    (HostTensor { shape: vec![out, inp], data: weight }, bias)
}

/// `y` in `dtype`, converted only when it is not.
fn cast_to(y: Tensor<3>, dtype: DType) -> Tensor<3> {
    if y.dtype() == dtype { y } else { y.cast(dtype) }
}

fn transpose(data: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; data.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = data[r * cols + c];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values in [−1, 1), rounded to f16 (so that f16 storage holds them exactly).
    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n as u32)
            .map(|i| {
                let h = (i.wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(40_503)).wrapping_mul(2_246_822_519);
                half::f16::from_f32((h >> 8) as f32 / (1u32 << 23) as f32 - 1.0).to_f32()
            })
            .collect()
    }

    /// On wgpu, q/k/v-like layers stacked in 2 groups and gate/up-like layers in 1: the set's
    /// outputs are each layer's own product, within f16 rounding of the sums (autotune may pick
    /// another kernel for the stacked shape), and its host weights are the layers' rows and
    /// biases as given.
    #[test]
    fn stacked_layers_give_each_layers_product_and_weights_on_wgpu() {
        let device = crate::testing::test_wgpu();
        let store = ProjectionStore {
            dtype: DType::F16,
            device: &device,
            kernel: LinearKernel::Burn,
            compact: true,
            max_buffer_bytes: None,
        };
        let inp = 64;
        let x = upload(&values(3 * 2 * inp, 9), [3, 2, inp], DType::F16, &device);
        for (outs, groups, biased) in [(vec![128, 64, 64], 2, true), (vec![96, 96], 1, false)] {
            let weights: Vec<Vec<f32>> = outs.iter().zip(1..).map(|(&o, s)| values(o * inp, s)).collect();
            let biases: Vec<Vec<f32>> = outs.iter().zip(20..).map(|(&o, s)| values(o, s)).collect();
            let layers: Vec<LayerWeights<'_>> =
                (0..outs.len()).map(|i| (&weights[i][..], [outs[i], inp], biased.then_some(&biases[i][..]))).collect();
            let stacked = Projections::new(&layers, groups, store);
            assert!(matches!(stacked, Projections::Stacked(_)), "stacked on wgpu");
            let each = Projections::each(&layers, store);
            for (i, (got, want)) in stacked.forward(x.clone()).into_iter().zip(each.forward(x.clone())).enumerate() {
                assert_eq!(got.dims(), [3, 2, outs[i]]);
                for (g, w) in host_f32(got).iter().zip(host_f32(want)) {
                    assert!((g - w).abs() <= 2e-3 * w.abs().max(1.0), "layer {i}: {g} vs {w}");
                }
            }
            for (i, (w, b)) in stacked.host_weights().into_iter().enumerate() {
                assert_eq!((w.shape, w.data), (vec![outs[i], inp], weights[i].clone()), "layer {i}");
                assert_eq!(b.map(|b| b.data), biased.then(|| biases[i].clone()), "layer {i}");
            }
        }
    }
}
