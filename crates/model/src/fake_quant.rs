//! Run-time roundings of a variant (`qdrift_codecs::Recipe`'s activation and KV-cache parts) on
//! the device, as quantize→dequantize steps in Burn tensor ops, and the choice between them and
//! the host definitions.
//!
//! The definitions are `qdrift_codecs`'s `round_host` functions (`dynamic.rs`); every function
//! here computes the same f32 operations in the same order and is tested against them on both
//! backends (`tests/tests/fake_quant.rs`). Values are rounded in f32 whatever the compute dtype,
//! then cast back to it (so in f16 the dequantized value is rounded once more to f16, relative
//! error ≤ 2⁻¹¹, far below the quantization step).
//!
//! Exactness on a GPU rests on three properties lavapipe has and the tests check: f32 division
//! correctly rounded (WGSL allows 2.5 ulp; a value within an ulp of a rounding boundary could
//! round the other way on a GPU that approximates), no fused multiply-add contraction, and an
//! f32→f16 conversion that rounds to nearest even.
//!
//! FP8 rounding without bit casts (Burn has none): a value's spacing on the FP8 grid is found by
//! comparing its magnitude against every binade boundary `2^k` of the format (exact powers of
//! two), then `RNE(a/spacing)·spacing` — the project codec's own method (`fp8.rs`). E2M1 (the
//! element of MXFP4 and NVFP4) is the same grid with one mantissa bit and binades 2^0…2^2.
//!
//! MXFP4's power-of-two scale, also without bit casts: the largest `2^k ≤ amax` (`k ≥ −126`) by
//! a binary search over `k` with exact products of powers of two, moved up one binade where the
//! amax is at least `1.75 · 2^k` for compressed-tensors' rule; the scale is `2^(k−2)`, at least
//! 2^-126. The host definition's 2^-127 for blocks whose amax is below 2^-123 (compressed-tensors'
//! clamp of the E8M0 exponent) is a subnormal scale that GPUs may flush, so the device keeps
//! 2^-126 there; no model activation is that small (an f16 model cannot even hold it), and an
//! all-zero block stays zero either way.

use burn::tensor::{Bool, DType, Int, Tensor};
use qdrift_codecs::{
    ActivationQuant, ActivationScale, DynamicFormat, Fp8Format, GgmlType, KvQuant, Mxfp4Rule, NVFP4_ZERO_SCALE,
    TOKEN_GROUP_EPS,
};

use crate::host::placement::RoundingPath;

/// What a model rounds at run time besides its (already quantized) weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeQuant {
    /// Dynamic quantization of every linear layer's input (q/k/v, o, gate/up, down).
    pub activations: Option<ActivationQuant>,
    /// Rounding of keys (after RoPE) and values as they are written into the cache.
    pub kv_cache: Option<KvQuant>,
    /// Where activations are rounded (KV caches follow their own storage: a host cache is
    /// rounded by the host definition, a device cache on the device).
    pub path: RoundingPath,
}

impl RuntimeQuant {
    /// Nothing rounded at run time: the model computes exactly as a weight-only variant.
    pub fn none() -> Self {
        Self { activations: None, kv_cache: None, path: RoundingPath::Device }
    }
}

/// `2^k` as f32, for the binade boundaries and spacings used here (|k| < 127).
fn exp2(k: i32) -> f32 {
    f32::from_bits(((k + 127) as u32) << 23)
}

/// Rounds values already divided by their scale onto an FP8 grid (saturating at the max normal,
/// round to nearest even), in f32.
///
/// # Shapes
/// - `y`: any, f32 → same
fn round_fp8_scaled<const D: usize>(y: Tensor<D>, format: Fp8Format) -> Tensor<D> {
    match format {
        Fp8Format::E4M3 => round_to_grid(y, 3, -6, 8, format.max_finite()),
        Fp8Format::E5M2 => round_to_grid(y, 2, -14, 15, format.max_finite()),
    }
}

/// Rounds values onto a small float grid of `mantissa` bits whose binades run from `2^min_exp`
/// (subnormals below) to `2^max_exp`, saturating at `max`, round to nearest even, in f32.
///
/// # Shapes
/// - `y`: any, f32 → same
fn round_to_grid<const D: usize>(y: Tensor<D>, mantissa: i32, min_exp: i32, max_exp: i32, max: f32) -> Tensor<D> {
    let sign = y.clone().sign();
    let a = y.abs().clamp_max(max);
    let mut spacing = a.clone().zeros_like().add_scalar(exp2(min_exp - mantissa));
    for k in min_exp + 1..=max_exp {
        spacing = spacing.mask_fill(a.clone().greater_equal_elem(exp2(k)), exp2(k - mantissa));
    }
    a.div(spacing.clone()).round().mul(spacing).mul(sign)
}

/// E2M1 (OCP MX v1.0 §5.3.3): one mantissa bit, binades 2^0…2^2, ±6, round to nearest even.
///
/// # Shapes
/// - `y`: any, f32 → same
fn round_e2m1<const D: usize>(y: Tensor<D>) -> Tensor<D> {
    round_to_grid(y, 1, 0, 2, 6.0)
}

/// The largest power of two `2^k ≤ amax` with `k ≥ −126` (2^-126 below), exactly.
///
/// # Shapes
/// - `amax`: any, f32, ≥ 0 → same
fn pow2_floor<const D: usize>(amax: Tensor<D>) -> Tensor<D> {
    let mut p = amax.zeros_like().add_scalar(exp2(-126));
    // Steps of 2^7 (two factors of 2^64: 2^128 is not an f32), 2^6, …, 2^0 span k ∈ [−126, 129).
    let steps: [&[i32]; 8] = [&[64, 64], &[64], &[32], &[16], &[8], &[4], &[2], &[1]];
    for factors in steps {
        let candidate = factors.iter().fold(p.clone(), |c, &f| c.mul_scalar(exp2(f)));
        p = p.mask_where(amax.clone().greater_equal(candidate.clone()), candidate);
    }
    p
}

/// Quantize→dequantize 4-bit float blocks (MXFP4 or NVFP4), as `dynamic.rs` defines them.
///
/// # Shapes
/// - `x`: `[.., blocks, block]`, f32 → same
fn round_fp4_blocks(x: Tensor<4>, format: DynamicFormat, global: Option<f32>) -> Tensor<4> {
    let amax = x.clone().abs().max_dim(3);
    let s = match format {
        DynamicFormat::Mxfp4(rule) => {
            let mut p = pow2_floor(amax.clone());
            if rule == Mxfp4Rule::CompressedTensors {
                // compressed-tensors' `round_to_power_2`: up a binade from a mantissa of 1.75.
                let up = amax.greater_equal(p.clone().mul_scalar(1.75));
                p = p.clone().mask_where(up, p.mul_scalar(2.0));
            }
            p.clamp_min(exp2(-124)).mul_scalar(0.25)
        }
        _ => {
            let local = amax.div_scalar(DynamicFormat::Nvfp4.max_value());
            let local = match global {
                Some(g) => local.mul_scalar(g),
                None => local,
            };
            let s8 = round_fp8_scaled(local, Fp8Format::E4M3);
            let s8 = s8.clone().mask_fill(s8.equal_elem(0.0), NVFP4_ZERO_SCALE);
            match global {
                Some(g) => s8.div_scalar(g),
                None => s8,
            }
        }
    };
    round_e2m1(x.div(s.clone())).mul(s)
}

/// Quantize→dequantize groups that share one dynamic scale, given each group's `amax`.
///
/// # Shapes
/// - `x`: any, f32; `amax`: broadcastable to `x` (1 along the grouped dims) → `x`'s shape
fn round_with_amax<const D: usize>(x: Tensor<D>, amax: Tensor<D>, format: DynamicFormat) -> Tensor<D> {
    let s = amax.div_scalar(format.max_value());
    // An all-zero group: s = 0; dividing by 1 instead keeps it zero (the host leaves it as is).
    let s = s.clone().mask_fill(s.equal_elem(0.0), 1.0);
    let y = x.div(s.clone());
    let q = match format {
        DynamicFormat::Int8 => y.round().clamp(-127.0, 127.0),
        DynamicFormat::Fp8(f) => round_fp8_scaled(y, f),
        DynamicFormat::Mxfp4(_) | DynamicFormat::Nvfp4 => round_e2m1(y),
    };
    q.mul(s)
}

/// Dynamic quantization of linear-layer inputs on the device, in f32, cast back to `x`'s dtype:
/// one scale per token, per sequence ([`ActivationScale::Tensor`]), or per token and group of `G`
/// inputs ([`ActivationScale::TokenGroup`]: `[.., cols]` viewed as `[.., cols/G, G]`, amax over
/// each group, `s = max(amax, 1e-10)/max` as the host definition).
///
/// # Shapes
/// - `x`: `[batch, new, cols]` → same
/// - `real`: `[batch, new, 1]`, f32, 1 for a real token and 0 for padding; needed only for
///   per-tensor scales (padding never contributes to a sequence's scale)
///
/// # Panics
/// If the scale is per tensor and `real` is `None`, or a group does not divide `cols` (refused
/// earlier by `ActivationQuant::check_width` when the model's [`RuntimeQuant`] is set).
pub fn round_activations(x: Tensor<3>, q: ActivationQuant, real: Option<&Tensor<3>>) -> Tensor<3> {
    round_activations_global(x, q, real, None)
}

/// [`round_activations`] with an NVFP4 layer's static global input scale (`ActivationQuant::
/// round_host_global`'s `global`; ignored by the other formats).
///
/// # Shapes
/// As [`round_activations`].
///
/// # Panics
/// As [`round_activations`].
pub fn round_activations_global(
    x: Tensor<3>,
    q: ActivationQuant,
    real: Option<&Tensor<3>>,
    global: Option<f32>,
) -> Tensor<3> {
    let dtype = x.dtype();
    let x = x.cast(DType::F32);
    let out = match q.scale {
        ActivationScale::TokenGroup(g) if q.format.block().is_some() => {
            let [b, t, cols] = x.dims();
            assert!(g > 0 && cols.is_multiple_of(g), "rows of {cols} activations are not blocks of {g}");
            round_fp4_blocks(x.reshape([b, t, cols / g, g]), q.format, global).reshape([b, t, cols])
        }
        ActivationScale::Token => round_with_amax(x.clone(), x.abs().max_dim(2), q.format),
        ActivationScale::Tensor => {
            let real = real.expect("per-tensor activation scales need the padding mask");
            round_with_amax(x.clone(), x.abs().mul(real.clone()).max_dim(2).max_dim(1), q.format)
        }
        ActivationScale::TokenGroup(g) => {
            let [b, t, cols] = x.dims();
            assert!(g > 0 && cols.is_multiple_of(g), "rows of {cols} activations are not groups of {g}");
            let groups = x.reshape([b, t, cols / g, g]);
            let amax = groups.clone().abs().max_dim(3).clamp_min(TOKEN_GROUP_EPS);
            round_with_amax(groups, amax, q.format).reshape([b, t, cols])
        }
    };
    out.cast(dtype)
}

/// KV-cache rounding of new keys or values on the device, in f32, cast back to `x`'s dtype.
///
/// # Shapes
/// - `x`: `[batch, new, kv_heads, head_dim]` → same
///
/// # Panics
/// If a ggml format's row (`kv_heads × head_dim`) is not whole blocks, or the format is not q8_0
/// or q4_0 (both checked by `KvQuant::check_row` when the model's [`RuntimeQuant`] is set).
pub fn round_kv(x: Tensor<4>, q: KvQuant) -> Tensor<4> {
    let dtype = x.dtype();
    let [b, t, kvh, hd] = x.dims();
    let x = x.cast(DType::F32);
    let out = match q {
        KvQuant::Fp8(f) => round_fp8_scaled(x, f),
        KvQuant::Fp8PerHead(f) => round_with_amax(x.clone(), x.abs().max_dim(3), DynamicFormat::Fp8(f)),
        KvQuant::Int8 => round_with_amax(x.clone(), x.abs().max_dim(3), DynamicFormat::Int8),
        KvQuant::Ggml(ty) => {
            let block = ty.block_size();
            assert!((kvh * hd).is_multiple_of(block), "KV row of {} values is not whole {block}-blocks", kvh * hd);
            let blocks = x.reshape([b, t, kvh * hd / block, block]);
            let out = match ty {
                GgmlType::Q4_0 => round_q4_0(blocks),
                GgmlType::Q8_0 => round_q8_0(blocks),
                other => panic!("{} is not a KV-cache format (refused by KvQuant::check_row)", other.name()),
            };
            out.reshape([b, t, kvh, hd])
        }
    };
    out.cast(dtype)
}

/// `d` and `id = d ? 1/d : 0` as `quantize_row_*_ref` computes them.
fn scale_and_inverse(d: Tensor<4>) -> (Tensor<4>, Tensor<4>) {
    let zero: Tensor<4, Bool> = d.clone().equal_elem(0.0);
    let id = d.clone().mask_fill(zero.clone(), 1.0).recip().mask_fill(zero, 0.0);
    (d, id)
}

/// The FP16 rounding of f32 values (what `GGML_FP32_TO_FP16` stores), back in f32.
fn through_f16(x: Tensor<4>) -> Tensor<4> {
    x.cast(DType::F16).cast(DType::F32)
}

/// `quantize_row_q8_0_ref` then `dequantize_row_q8_0`: `d = amax/127`, `q = roundf(x·(1/d))`
/// (half away from zero), `y = q·fp16(d)`.
///
/// # Shapes
/// - `x`: `[batch, new, blocks, 32]`, f32 → same
fn round_q8_0(x: Tensor<4>) -> Tensor<4> {
    let (d, id) = scale_and_inverse(x.clone().abs().max_dim(3).div_scalar(127.0));
    let v = x.mul(id);
    // C's roundf: half away from zero, exact for |v| < 2^23 (here |v| ≤ 127).
    let a = v.clone().abs();
    let f = a.clone().floor();
    let up: Tensor<4> = a.sub(f.clone()).greater_equal_elem(0.5).float().cast(DType::F32);
    let q = f.add(up).mul(v.sign());
    q.mul(through_f16(d))
}

/// `quantize_row_q4_0_ref` then `dequantize_row_q4_0`: `max` = the first value of largest
/// magnitude (sign kept), `d = max/−8`, `q = min(15, (int)(x·(1/d) + 8.5))`, `y = (q − 8)·fp16(d)`.
///
/// # Shapes
/// - `x`: `[batch, new, blocks, 32]`, f32 → same
fn round_q4_0(x: Tensor<4>) -> Tensor<4> {
    let [b, t, n, block] = x.dims();
    let device = x.device();
    let a = x.clone().abs();
    let amax = a.clone().max_dim(3);
    // The first index holding the largest magnitude, as ggml's strict `amax < fabsf(v)` scan.
    let index: Tensor<4> = Tensor::<1, Int>::arange(0..block as i64, &device)
        .float()
        .cast(DType::F32)
        .reshape([1, 1, 1, block])
        .expand([b, t, n, block]);
    let not_max = a.equal(amax.expand([b, t, n, block])).bool_not();
    let first = index.mask_fill(not_max, block as f32).min_dim(3).int();
    let max = x.clone().gather(3, first);
    let (d, id) = scale_and_inverse(max.div_scalar(-8.0));
    // x·id + 8.5 lies in [0.5, 16.5], so C's truncation is floor.
    let q = x.mul(id).add_scalar(8.5).floor().clamp_max(15.0);
    q.sub_scalar(8.0).mul(through_f16(d))
}

/// Which linear layers a rounded input feeds; each has its own static NVFP4 global input scale
/// per layer, as compressed-tensors' `input_global_scale` is per module. Modules reading the same
/// input share one (q, k and v; gate and up, of every expert and the shared expert: their
/// calibrated amaxes are equal, and vLLM fuses them), and a mixture-of-experts layer's down
/// projections share the largest of theirs (vLLM's fused MoE takes one input scale per layer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputSite {
    /// The q/k/v projections' input (the normed residual stream).
    Qkv,
    /// The output projection's input (the attention's output).
    O,
    /// The gate/up projections' input.
    Up,
    /// The down projection's input.
    Down,
}

impl InputSite {
    /// Every site, in the order of [`InputAmax::layers`]' entries.
    pub const ALL: [InputSite; 4] = [InputSite::Qkv, InputSite::O, InputSite::Up, InputSite::Down];

    fn index(self) -> usize {
        self as usize
    }
}

/// The largest magnitude each linear layer's input reached over a calibration pass
/// ([`crate::Llama::calibrate_inputs`]), compressed-tensors' `static_minmax` observer for
/// `input_global_scale`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InputAmax {
    /// Per layer, per [`InputSite`] (in [`InputSite::ALL`]'s order); 0 where no value was seen.
    pub layers: Vec<[f32; 4]>,
    /// How many sequences the pass ran.
    pub sequences: usize,
}

impl InputAmax {
    /// Takes `amax` for `site` of `layer` into the running maximum.
    pub fn record(&mut self, layer: usize, site: InputSite, amax: f32) {
        if self.layers.len() <= layer {
            self.layers.resize(layer + 1, [0.0; 4]);
        }
        let slot = &mut self.layers[layer][site.index()];
        *slot = slot.max(amax);
    }

    /// Each layer's and site's static global input scale, `448·6/amax` as compressed-tensors'
    /// `generate_gparam` (1 where nothing was seen).
    pub fn global_scales(&self) -> Vec<[f32; 4]> {
        self.layers.iter().map(|l| l.map(qdrift_codecs::nvfp4_global_scale)).collect()
    }
}

/// The global input scale of `site` in `layer`, from per-layer scales.
pub(crate) fn global_scale(scales: Option<&[[f32; 4]]>, layer: usize, site: InputSite) -> Option<f32> {
    scales.and_then(|s| s.get(layer)).map(|l| l[site.index()])
}
