//! Rotary position embeddings (Su et al. 2021) in llama2.c's interleaved layout, with Llama 3.1's
//! frequency scaling, linear, YaRN and LongRoPE (short factors) scaling, and GGUF's per-pair
//! divisors (`rope_freqs.weight`) applied to the inverse frequencies; partial rotary (Phi-3)
//! rotates the first dimensions of each head only.

use burn::tensor::{DType, Device, Int, Tensor, TensorData};

use qdrift_weights::RopeScaling;

use crate::host::rope::HostRope;
use crate::tensors::upload;

/// Rotary position embedding (Su et al. 2021, "RoFormer") in the *interleaved* layout of
/// llama2.c and GGUF: within a head, elements `(2i, 2i+1)` form one rotation pair with inverse
/// frequency `theta^(-2i/head_dim)`, optionally rescaled ([`RopeScaling`]).
///
/// Angles are computed on the host in f32 exactly as llama2.c's `run.c` does
/// (`pos * (1 / powf(theta, 2i / head_dim))`, then `cosf`/`sinf`), so f32 runs reproduce its
/// numbers; the tables are then cast to the compute dtype.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
    /// The factor cos and sin are multiplied by (YaRN's `attention_factor`; 1 otherwise).
    attention_factor: f32,
}

impl Rope {
    /// Plain RoPE: inverse frequencies `1 / theta^(2i / head_dim)` for a head of width `head_dim`
    /// (the rotated width, `rotary_dim`, under partial rotary: Phi-3's
    /// `Phi3RotaryEmbedding.compute_default_rope_parameters` divides by it).
    pub fn new(head_dim: usize, theta: f32) -> Self {
        let inv_freq = (0..head_dim / 2).map(|i| 1.0f32 / theta.powf((2 * i) as f32 / head_dim as f32)).collect();
        Self { inv_freq, attention_factor: 1.0 }
    }

    /// RoPE with the inverse frequencies of [`Rope::new`] rescaled by `scaling`:
    /// `llama3_inv_freq` for Llama 3.1's scaling, `inv_freq[i] / factors[i]` for per-pair
    /// divisors (llama.cpp's `freq_factors`), `inv_freq[i] / factor` for linear scaling
    /// (`_compute_linear_scaling_rope_parameters`), `yarn_inv_freq` and its attention factor
    /// for YaRN, `longrope_inv_freq` of the short factors and its attention factor for LongRoPE.
    /// `head_dim` is the rotated width of a head.
    ///
    /// # Errors
    /// The reason when the parameters are invalid for `head_dim` ([`RopeScaling::validate`]).
    pub fn scaled(head_dim: usize, theta: f32, scaling: Option<&RopeScaling>) -> Result<Self, String> {
        let plain = Self::new(head_dim, theta);
        let Some(scaling) = scaling else {
            return Ok(plain);
        };
        scaling.validate(head_dim)?;
        let inv_freq = match scaling {
            RopeScaling::Llama3 { .. } => llama3_inv_freq(&plain.inv_freq, scaling),
            RopeScaling::FreqFactors { factors } => plain.inv_freq.iter().zip(factors).map(|(f, d)| f / d).collect(),
            RopeScaling::Linear { factor } => plain.inv_freq.iter().map(|f| f / factor).collect(),
            RopeScaling::Yarn { attention_factor, .. } => {
                return Ok(Self {
                    inv_freq: yarn_inv_freq(head_dim, theta, scaling),
                    attention_factor: *attention_factor,
                });
            }
            RopeScaling::LongRope { short_factor, attention_factor, .. } => {
                return Ok(Self {
                    inv_freq: longrope_inv_freq(head_dim, theta, short_factor),
                    attention_factor: *attention_factor,
                });
            }
        };
        Ok(Self { inv_freq, attention_factor: 1.0 })
    }

    /// The factor cos and sin are multiplied by (YaRN's `attention_factor`; 1 otherwise).
    pub fn attention_factor(&self) -> f32 {
        self.attention_factor
    }

    /// The inverse frequency of each rotation pair, radians per position.
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// Number of rotation pairs per head.
    pub fn pairs(&self) -> usize {
        self.inv_freq.len()
    }

    /// cos and signed sin tables for the given positions, each value repeated for the two
    /// elements of its pair: `cos` is `(c₀, c₀, c₁, c₁, …)` and `sin` is `(−s₀, s₀, −s₁, s₁, …)`,
    /// what [`Rope::apply`] multiplies `x` and its pair-swapped copy by.
    ///
    /// # Shapes
    /// - `positions`: `batch` rows of `seq` positions each
    /// - returns two tensors `[batch, seq, 1, 2 · pairs]`, broadcastable over heads
    pub fn tables(&self, positions: &[Vec<usize>], dtype: DType, device: &Device) -> (Tensor<4>, Tensor<4>) {
        let (cos, sin) = self.angles(positions);
        let cos: Vec<f32> = cos.iter().flat_map(|&c| [c, c]).collect();
        let sin: Vec<f32> = sin.iter().flat_map(|&s| [-s, s]).collect();
        let shape = [positions.len(), positions.first().map_or(0, Vec::len), 1, 2 * self.pairs()];
        (upload(&cos, shape, dtype, device), upload(&sin, shape, dtype, device))
    }

    /// [`Rope::tables`] for an attention layer's stacked projections
    /// ([`crate::Projections::new`] with one group per key/value head): each group's `rep` query
    /// heads and its key head rotated, its value head passed through (cos 1, sin 0, so `x·1 +
    /// swap(x)·0` is `x` itself, up to the sign of a zero and a non-finite value's NaN).
    ///
    /// # Shapes
    /// - returns `cos`, `sin`: `[batch, seq, 1, rep + 2, 2 · pairs]`
    pub(crate) fn grouped_tables(
        &self,
        positions: &[Vec<usize>],
        rep: usize,
        dtype: DType,
        device: &Device,
    ) -> (Tensor<5>, Tensor<5>) {
        let (cos, sin) = self.angles(positions);
        let pairs = self.pairs();
        let rows = cos.len() / pairs.max(1);
        let width = (rep + 2) * 2 * pairs;
        let (mut c, mut s) = (Vec::with_capacity(rows * width), Vec::with_capacity(rows * width));
        for (cos, sin) in cos.chunks(pairs).zip(sin.chunks(pairs)) {
            for _ in 0..rep + 1 {
                c.extend(cos.iter().flat_map(|&v| [v, v]));
                s.extend(sin.iter().flat_map(|&v| [-v, v]));
            }
            c.extend(std::iter::repeat_n(1.0, 2 * pairs));
            s.extend(std::iter::repeat_n(0.0, 2 * pairs));
        }
        let shape = [positions.len(), positions.first().map_or(0, Vec::len), 1, rep + 2, 2 * pairs];
        (upload(&c, shape, dtype, device), upload(&s, shape, dtype, device))
    }

    /// The index [`Rope::apply`] swaps the two elements of each rotation pair with,
    /// `(1, 0, 3, 2, …)`: `x.select(last, swap)` is `swap(x)`.
    ///
    /// # Shapes
    /// - returns `[2 · pairs]`
    pub fn swap_index(&self, device: &Device) -> Tensor<1, Int> {
        let swap: Vec<i32> = (0..2 * self.pairs() as i32).map(|i| i ^ 1).collect();
        Tensor::from_data(TensorData::new(swap, [2 * self.pairs()]), device)
    }

    /// [`Rope::tables`] on the host, for the CPU backend's host kernels: the same values, rounded
    /// to f16 when `f16` as uploading them in f16 rounds them.
    pub(crate) fn host_tables(&self, positions: &[Vec<usize>], f16: bool) -> HostRope {
        let (cos, sin) = self.angles(positions);
        HostRope::new(cos, sin, self.pairs(), f16)
    }

    /// cos and sin of every position × inverse frequency, in f32, each multiplied by the
    /// attention factor (in f32, as `transformers`' rotary embeddings multiply `emb.cos()` by
    /// `attention_scaling`) when it is not 1.
    ///
    /// # Shapes
    /// - returns two `[batch, seq, pairs]` row-major vectors
    fn angles(&self, positions: &[Vec<usize>]) -> (Vec<f32>, Vec<f32>) {
        let n = positions.iter().map(Vec::len).sum::<usize>() * self.pairs();
        let (mut cos, mut sin) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for row in positions {
            for &p in row {
                for &f in &self.inv_freq {
                    let angle = p as f32 * f;
                    cos.push(angle.cos());
                    sin.push(angle.sin());
                }
            }
        }
        if self.attention_factor != 1.0 {
            let af = self.attention_factor;
            cos.iter_mut().chain(sin.iter_mut()).for_each(|v| *v *= af);
        }
        (cos, sin)
    }

    /// Rotates `x` by the tables from [`Rope::tables`]: the first `2 · pairs` dimensions of each
    /// head, in interleaved pairs; the rest of the head (partial rotary, Phi-3's
    /// `apply_rotary_pos_emb` on `q[..., :rotary_dim]`) passes through unchanged.
    ///
    /// `x·cos + swap(x)·sin`, `swap` exchanging the two elements of each pair: pair `i` becomes
    /// `(x₀·cᵢ + x₁·(−sᵢ), x₁·cᵢ + x₀·sᵢ)`, which is `(x₀·cᵢ − x₁·sᵢ, x₀·sᵢ + x₁·cᵢ)` in every
    /// rounding (negation is exact, addition commutes), as `transformers`' `q·cos +
    /// rotate_half(q)·sin` computes it. The swap is a `select` by [`Rope::swap_index`], which
    /// Burn's fusion reads inside the same kernel as the products on wgpu; a `flip` of a
    /// `[.., pairs, 2]` view was a kernel of its own, and the even and odd elements as two strided
    /// slices cost two copy kernels per tensor (docs/BENCHMARKS.md).
    ///
    /// # Shapes
    /// - `x`: `[batch, seq, heads, head_dim]` → `[batch, seq, heads, head_dim]`
    /// - `cos`, `sin`: `[batch, seq, 1, 2 · pairs]`
    /// - `swap`: `[2 · pairs]`, from [`Rope::swap_index`]
    pub fn apply(&self, x: Tensor<4>, cos: &Tensor<4>, sin: &Tensor<4>, swap: &Tensor<1, Int>) -> Tensor<4> {
        let [b, s, h, d] = x.dims();
        let rot = 2 * self.pairs();
        if rot < d {
            let tail = x.clone().slice([0..b, 0..s, 0..h, rot..d]);
            let head = self.apply(x.slice([0..b, 0..s, 0..h, 0..rot]), cos, sin, swap);
            return Tensor::cat(vec![head, tail], 3);
        }
        let (x5, alias) = (x.clone().unsqueeze::<5>(), x.unsqueeze::<5>());
        let (cos, sin) = (cos.clone().unsqueeze::<5>(), sin.clone().unsqueeze::<5>());
        rotate_pairs(x5, alias, cos, sin, swap).reshape([b, s, h, d])
    }
}

/// `x·cos + swap(x)·sin` over the last dimension, the pairs swapped by a `select` by `swap`
/// ([`Rope::swap_index`]) that reads `alias`, a second view of `x`. Both views (and `cos`, `sin`)
/// are taken by the caller before this arithmetic, so that Burn's fusion runs the swap and the
/// products as one kernel on wgpu: it refuses a tensor read both by index and directly in one
/// kernel, and a view op between the products ends the block.
///
/// # Shapes
/// - `x`, `alias`: `[.., width]`; `cos`, `sin`: broadcastable to them; `swap`: `[width]`
pub(crate) fn rotate_pairs(
    x: Tensor<5>,
    alias: Tensor<5>,
    cos: Tensor<5>,
    sin: Tensor<5>,
    swap: &Tensor<1, Int>,
) -> Tensor<5> {
    let swapped = alias.select(4, swap.clone());
    x * cos + swapped * sin
}

/// Llama 3.1's rescaled inverse frequencies ([`RopeScaling::Llama3`]), operation for operation as
/// `transformers`' `_compute_llama3_parameters` computes them on float32 tensors, so that the
/// result is HF's to the bit (up to `powf` in the plain frequencies):
///
/// ```text
/// wavelen   = 2π / inv_freq                      # torch: inv_freq.reciprocal() * f32(2π)
/// inv_llama = where(wavelen > low, inv_freq / factor, inv_freq)
/// smooth    = (old / wavelen - low_ff) / (high_ff - low_ff)    # old / wavelen likewise
/// smoothed  = (1 - smooth) * inv_llama / factor + smooth * inv_llama
/// result    = where(high <= wavelen <= low, smoothed, inv_llama)
/// ```
///
/// with `old = original_max_position_embeddings`, `low = old / low_ff`, `high = old / high_ff`
/// (Python floats, compared as f32). Returns `inv_freq` unchanged for other scalings.
pub fn llama3_inv_freq(inv_freq: &[f32], scaling: &RopeScaling) -> Vec<f32> {
    let RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } = *scaling
    else {
        return inv_freq.to_vec();
    };
    let old = original_max_position_embeddings as f64;
    // Python computes these in f64; torch compares the f32 tensor with them cast to f32.
    let low_wavelen = (old / f64::from(low_freq_factor)) as f32;
    let high_wavelen = (old / f64::from(high_freq_factor)) as f32;
    let two_pi = (2.0 * std::f64::consts::PI) as f32;
    let ff_span = (f64::from(high_freq_factor) - f64::from(low_freq_factor)) as f32;
    let old = old as f32;
    inv_freq
        .iter()
        .map(|&inv| {
            // torch's `scalar / tensor` is `tensor.reciprocal() * scalar`.
            let wavelen = (1.0 / inv) * two_pi;
            let inv_llama = if wavelen > low_wavelen { inv / factor } else { inv };
            if (high_wavelen..=low_wavelen).contains(&wavelen) {
                let smooth = ((1.0 / wavelen) * old - low_freq_factor) / ff_span;
                (1.0 - smooth) * inv_llama / factor + smooth * inv_llama
            } else {
                inv_llama
            }
        })
        .collect()
}

/// YaRN's inverse frequencies ([`RopeScaling::Yarn`]) over `dim` rotated dimensions, as
/// `transformers` `modeling_rope_utils.py` `_compute_yarn_parameters` computes them: the
/// correction range in f64 (Python floats), the frequencies and the ramp on f32 tensors, each
/// Python float cast to f32 where it meets one:
///
/// ```text
/// pos_freq[i] = theta^(2i/dim)                      (f32)
/// low, high   = find_correction_range(beta_fast, beta_slow, dim, theta, L0, truncate)   (f64)
/// ramp[i]     = clamp((i − low) / (high − low), 0, 1)    (f32; high += 0.001 when equal)
/// ef[i]       = 1 − ramp[i]
/// inv_freq[i] = 1/(factor·pos_freq[i]) · (1 − ef[i]) + 1/pos_freq[i] · ef[i]
/// ```
///
/// Returns the plain frequencies for other scalings.
pub fn yarn_inv_freq(dim: usize, theta: f32, scaling: &RopeScaling) -> Vec<f32> {
    let RopeScaling::Yarn { factor, beta_fast, beta_slow, original_max_position_embeddings, truncate, .. } = *scaling
    else {
        return Rope::new(dim, theta).inv_freq;
    };
    let (d, base, l0) = (dim as f64, f64::from(theta), original_max_position_embeddings as f64);
    // `find_correction_dim`: d · ln(L0 / (2π·r)) / (2 ln base).
    let correction = |r: f64| d * (l0 / (r * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln());
    let (mut low, mut high) = (correction(f64::from(beta_fast)), correction(f64::from(beta_slow)));
    if truncate {
        (low, high) = (low.floor(), high.ceil());
    }
    let (low, mut high) = (low.max(0.0), high.min(d - 1.0));
    if low == high {
        high += 0.001;
    }
    let (low32, span32) = (low as f32, (high - low) as f32);
    (0..dim / 2)
        .map(|i| {
            let pos_freq = theta.powf((2 * i) as f32 / dim as f32);
            let extrapolation = 1.0 / pos_freq;
            let interpolation = 1.0 / (factor * pos_freq);
            let ramp = ((i as f32 - low32) / span32).clamp(0.0, 1.0);
            let ef = 1.0 - ramp;
            interpolation * (1.0 - ef) + extrapolation * ef
        })
        .collect()
}

/// LongRoPE's inverse frequencies ([`RopeScaling::LongRope`]) of the short factors over `dim`
/// rotated dimensions, as `transformers` `_compute_longrope_parameters` computes them on f32
/// tensors: `inv_freq[i] = 1 / (ext_factors[i] · θ^(2i/dim))` (`1.0 / (ext_factors *
/// base**inv_freq_shape)`), with `ext_factors` = `short_factor` (`dim / 2` values, checked by
/// [`RopeScaling::validate`]).
pub fn longrope_inv_freq(dim: usize, theta: f32, ext_factors: &[f32]) -> Vec<f32> {
    ext_factors.iter().enumerate().map(|(i, &f)| 1.0 / (f * theta.powf((2 * i) as f32 / dim as f32))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Llama 3.1 8B's `config.json`: head_dim 4096 / 32 = 128, `rope_theta` 500000,
    /// `rope_scaling = {factor: 8, low_freq_factor: 1, high_freq_factor: 4,
    /// original_max_position_embeddings: 8192, rope_type: llama3}`.
    fn llama31() -> RopeScaling {
        RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        }
    }

    /// The formula of `_compute_llama3_parameters` written the obvious way, in f64.
    fn llama3_f64(head_dim: usize, theta: f64, factor: f64, low_ff: f64, high_ff: f64, old: f64) -> Vec<f64> {
        (0..head_dim / 2)
            .map(|i| {
                let inv = 1.0 / theta.powf((2 * i) as f64 / head_dim as f64);
                let wavelen = 2.0 * std::f64::consts::PI / inv;
                if wavelen < old / high_ff {
                    inv
                } else if wavelen > old / low_ff {
                    inv / factor
                } else {
                    let smooth = (old / wavelen - low_ff) / (high_ff - low_ff);
                    (1.0 - smooth) * inv / factor + smooth * inv
                }
            })
            .collect()
    }

    fn rel(a: f64, b: f64) -> f64 {
        (a - b).abs() / b.abs()
    }

    #[test]
    fn llama31_8b_matches_an_f64_implementation_of_the_formula() {
        let rope = Rope::scaled(128, 500000.0, Some(&llama31())).expect("valid");
        let want = llama3_f64(128, 500000.0, 8.0, 1.0, 4.0, 8192.0);
        assert_eq!(rope.pairs(), 64);
        let plain = Rope::new(128, 500000.0);
        let mut bands = [0usize; 3]; // kept, interpolated, divided by factor
        for (i, (&got, &want)) in rope.inv_freq().iter().zip(&want).enumerate() {
            assert!(rel(f64::from(got), want) < 1e-6, "pair {i}: {got} vs {want}");
            let ratio = f64::from(plain.inv_freq()[i]) / f64::from(got);
            bands[if ratio == 1.0 {
                0
            } else if (ratio - 8.0).abs() < 1e-6 {
                2
            } else {
                1
            }] += 1;
        }
        // wavelen < 2048 for pairs 0..=28, > 8192 for pairs 35..=63, interpolated between.
        assert_eq!(bands, [29, 6, 29]);
    }

    #[test]
    fn llama31_8b_matches_transformers_values() {
        // Computed with numpy 2.4 (float32 arrays, the operations of transformers'
        // `_compute_default_rope_parameters` and `_compute_llama3_parameters` in their order,
        // `scalar / tensor` as `reciprocal() * scalar` as torch does):
        //   inv = 1 / np.power(f32(500000), np.arange(0, 128, 2).astype(f32) / f32(128))
        //   wavelen = (1 / inv) * f32(2π); inv_l = where(wavelen > 8192, inv / 8, inv)
        //   smooth = ((1 / wavelen) * 8192 - 1) / 3
        //   out = where(2048 <= wavelen <= 8192, (1 - smooth) * inv_l / 8 + smooth * inv_l, inv_l)
        // The same formula in float64 agrees with these to 3.3e-7 (relative).
        let expected: [(usize, f32); 9] = [
            (0, 1.0),
            (1, 8.146172e-1),
            (20, 1.656044e-2),
            (28, 3.211446e-3),
            (29, 2.1665706e-3), // first interpolated pair
            (31, 8.5675146e-4),
            (34, 1.7850779e-4), // last interpolated pair
            (35, 9.556212e-5),
            (63, 3.068926e-7),
        ];
        let rope = Rope::scaled(128, 500000.0, Some(&llama31())).expect("valid");
        for (i, want) in expected {
            let got = rope.inv_freq()[i];
            // Two ulps: `powf` may round differently from numpy's; the rest is IEEE arithmetic.
            assert!(rel(f64::from(got), f64::from(want)) < 2.5e-7, "pair {i}: {got:e} vs {want:e}");
        }
    }

    #[test]
    fn plain_rope_is_llama2c_and_unscaled() {
        let plain = Rope::new(8, 10000.0);
        for (&got, want) in plain.inv_freq().iter().zip([1.0, 0.1, 0.01, 0.001]) {
            assert!(rel(f64::from(got), want) < 1e-7, "{got} vs {want}");
        }
        assert_eq!(Rope::scaled(8, 10000.0, None).expect("plain").inv_freq(), plain.inv_freq());
    }

    #[test]
    fn frequency_factors_divide_each_pair() {
        let factors = vec![1.0, 2.0, 4.0, 8.0];
        let rope = Rope::scaled(8, 10000.0, Some(&RopeScaling::FreqFactors { factors })).expect("valid");
        let plain = Rope::new(8, 10000.0);
        let want: Vec<f32> = plain.inv_freq().iter().zip([1.0, 2.0, 4.0, 8.0]).map(|(f, d)| f / d).collect();
        assert_eq!(rope.inv_freq(), &want[..]);
    }

    /// The host rotation (`HostRope::apply`, at every ISA the CPU runs) against Burn's
    /// ([`Rope::apply`] on the flex backend), bit for bit, in f32 and f16: rows at different
    /// positions, a head width of 64 (SmolLM2's) and one of 6, values over f16's range,
    /// subnormals included.
    #[test]
    fn host_rotation_is_burns_to_the_bit() {
        use crate::host::elem::round_f16;
        use qdrift_isa::Isa;
        let device = Device::flex();
        let isas = Isa::runnable_reporting_skips("host_rotation_is_burns_to_the_bit");
        for (hd, heads) in [(64, 3), (6, 2)] {
            let rope = Rope::new(hd, 10000.0);
            let positions: Vec<Vec<usize>> = vec![(0..5).collect(), (37..42).collect(), (995..1000).collect()];
            let (b, s) = (positions.len(), positions[0].len());
            let n = b * s * heads * hd;
            let mut seed = 7u64;
            let x: Vec<f32> = (0..n)
                .map(|i| {
                    seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                    let unit = (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                    // Magnitudes from 2⁻²¹ (f16 subnormals) to 2¹³, and some exact zeros.
                    if i % 97 == 0 { 0.0 } else { unit * 2f32.powi((i % 35) as i32 - 20) }
                })
                .collect();
            for dtype in [DType::F32, DType::F16] {
                let f16 = dtype == DType::F16;
                let (cos, sin) = rope.tables(&positions, dtype, &device);
                let swap = rope.swap_index(&device);
                let burn = rope.apply(crate::tensors::upload(&x, [b, s, heads, hd], dtype, &device), &cos, &sin, &swap);
                let want = crate::tensors::host_f32(burn);
                let mut got = x.clone();
                if f16 {
                    round_f16(&mut got);
                }
                let host = rope.host_tables(&positions, f16);
                let mut builds = Vec::new();
                for &isa in &isas {
                    let mut rotated = got.clone();
                    isa.forced(|| host.apply(&mut rotated, heads)).expect("runnable");
                    builds.push((isa.name(), rotated));
                }
                host.apply(&mut got, heads);
                builds.push(("dispatched", got));
                for (build, got) in builds {
                    let differs = got.iter().zip(&want).position(|(g, w)| g.to_bits() != w.to_bits());
                    if let Some(i) = differs {
                        panic!("{build} {dtype:?} head_dim {hd}, element {i}: {:e} vs Burn's {:e}", got[i], want[i]);
                    }
                }
            }
        }
    }

    /// LongRoPE runs its short factors, `1 / (f_i · θ^(2i/d))`, and scales cos and sin by the
    /// attention factor; a factor list of the wrong length is refused naming it.
    #[test]
    fn longrope_uses_the_short_factors_and_the_attention_factor() {
        let short: Vec<f32> = vec![1.0, 1.5, 2.0, 2.5, 3.0, 3.5];
        let scaling = RopeScaling::LongRope {
            short_factor: short.clone(),
            long_factor: vec![4.0; 6],
            original_max_position_embeddings: 64,
            attention_factor: 1.2,
        };
        let rope = Rope::scaled(12, 10000.0, Some(&scaling)).expect("valid");
        assert_eq!(rope.attention_factor(), 1.2);
        for (i, (&got, f)) in rope.inv_freq().iter().zip(&short).enumerate() {
            let want = 1.0 / (f64::from(*f) * 10000f64.powf(2.0 * i as f64 / 12.0));
            assert!((f64::from(got) - want).abs() <= 1e-6 * want, "pair {i}: {got} vs {want}");
        }
        let (cos, sin) = rope.angles(&[vec![0, 5]]);
        assert_eq!(cos[0], 1.2, "cos(0) scaled by the attention factor");
        let angle = 5.0 * f64::from(rope.inv_freq()[1]);
        assert!((f64::from(sin[6 + 1]) - 1.2 * angle.sin()).abs() < 1e-6);
        let mut wrong = scaling.clone();
        if let RopeScaling::LongRope { long_factor, .. } = &mut wrong {
            long_factor.pop();
        }
        assert_eq!(
            Rope::scaled(12, 10000.0, Some(&wrong)).unwrap_err(),
            "rope scaling long_factor has 5 values for 12 rotated dimensions; expected 6"
        );
    }

    #[test]
    fn invalid_scaling_is_an_error() {
        let short = RopeScaling::FreqFactors { factors: vec![1.0; 3] };
        assert_eq!(
            Rope::scaled(8, 10000.0, Some(&short)).unwrap_err(),
            "3 RoPE frequency factors for a head dimension of 8; expected 4"
        );
        let inverted = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 4.0,
            high_freq_factor: 1.0,
            original_max_position_embeddings: 8192,
        };
        let e = Rope::scaled(8, 10000.0, Some(&inverted)).unwrap_err();
        assert!(e.contains("high_freq_factor 1 must be greater than low_freq_factor 4"), "{e}");
    }
}
