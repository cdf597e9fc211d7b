//! The chunk reductions of [`crate::device`] on the host, for logits that are in host memory
//! already (Burn's flex CPU backend): the same definitions, outputs and errors, computed row by
//! row in two streaming passes with no temporary of the chunk's size.
//!
//! Why: on flex, [`crate::device`]'s log-softmax, `exp` and products each materialize a
//! `[batch, positions, vocab]` f32 tensor (63 MB for 320 positions of SmolLM2's 49,152 tokens),
//! paid in allocation, page faults and passes over memory. Here a row is read twice: once for
//! its maximum (and first argmax, and top-K), once for every `exp` and sum. One call runs on one
//! thread; callers run chunks on several.
//!
//! # Arithmetic
//! Logits are widened to f64 (so `x − max` is exact), every `exp` (this module's own `exp`, within
//! 2 ulp, vectorised; terms below `2⁻¹⁰²²` flushed to 0), product and sum runs in f64, and each
//! result is rounded to f32 once: the f64 definitions of [`crate::logprob`] and
//! [`crate::compact`] to one f32 rounding. The device's f32 sums of V terms are off by up to
//! `V · 2⁻²⁴` relative; on flex its values differ from these by up to 9e-5 (relative to
//! `max(|value|, 1)`) at 49,152 tokens and 6e-4 at 151,936 on the tests' chunks.
//! With `w_i = exp(x_i − max)` and `S = Σ w_i` (a plain left-to-right sum over the vocabulary):
//!
//! ```text
//! ln p_i  = (x_i − max) − ln S
//! H(P)    = ln S − Σ w_i (x_i − max) / S
//! KL(P‖Q) = Σ w_i (d_i − e_i) / S_P + ln S_Q − ln S_P      (d_i = x_i − max_P, e_i = y_i − max_Q)
//! KL(Q‖P) = Σ v_i (e_i − d_i) / S_Q + ln S_P − ln S_Q      (v_i = exp(e_i), S_Q = Σ v_i)
//! β       = Σ min(w_i / S_P, v_i / S_Q)                    (a second pass over the row's weights)
//! tail    = ln Σ_{i∉T} w_i − ln S                          (T: the top-K ids)
//! ```
//!
//! (`KL = Σ p_i (ln p_i − ln q_i)` with `Σ p_i = 1`.) The tail is a sum of its own terms, never
//! `S − Σ_T w_i`; when that sum is below [`TAIL_FLOOR`] its terms may have underflowed, and it
//! is summed again from the tail's own maximum, as the device always does. Every function sums a
//! row the same way, so the exact and the compact paths give bit-identical log p, entropy and
//! top-1, and logits identical to the reference's give a KL of exactly 0.
//!
//! # Ties and non-finite logits (as flex)
//! - Top-1: the first maximum; the first NaN if the row holds one (flex's `argmax`).
//! - Top-K: largest logit first, lower id first on ties, also at the K-th place. The device
//!   orders its top-K the same way; which of several tokens tied at the K-th place it keeps is
//!   its sort's choice.
//! - No `0 · ln 0 = 0` convention, as on the device: the same formulas in IEEE arithmetic. A `-inf`
//!   reference logit makes that position's entropy and KL NaN; a `-inf` variant logit where the
//!   reference has mass makes the KL `+inf`; a NaN or `+inf` logit makes the row's values NaN; a
//!   tail of `-inf` logits only has a NaN log-mass. (The device's f32 probabilities underflow to 0
//!   below `e^-103`, these below `e^-745`; a `-inf` variant logit where the reference's
//!   probability lies between gives `+inf` here, NaN there.)
//!
//! # Errors
//! Those of the device functions, for the same input, in the same order; in addition a slice
//! whose length is not its shape's `batch · positions · vocab` is a
//! [`ScoreError::LengthMismatch`].

use crate::ScoreError;
use crate::agreement::{TOP_K, compact_acceptance, top_k_agreement};
use crate::compact::compact_kl;
use crate::device::{CompactChunk, DevicePositionMetrics, check_chunk, check_compact, check_tokens};

// The instruction set the vectorised loops are compiled for ([`Shifted::fill`]), chosen as
// qdrift-model's kernels choose it (the CPU's widest, narrowed by `QDRIFT_ISA`, forced by a test).
use qdrift_isa::Isa;

/// The smallest tail sum `Σ_{i∉T} exp(x_i − max)` taken as it is (`1e-250 ≈ e^-575.6`). Above
/// it, the terms that f64 `exp` rounds to subnormals or to 0 (below `e^-708`) weigh together less
/// than `e^-120` of the sum for any vocabulary below `e^12` (163k tokens).
pub const TAIL_FLOOR: f64 = 1e-250;

/// Per-position metrics of a chunk: [`crate::position_metrics_on_device`] on the host.
///
/// # Shapes
/// - `ref_logits`, `var_logits`: `[batch, positions, vocab]` row-major, `dims = [batch,
///   positions, vocab]`
/// - `tokens`: `batch * positions` token ids, row-major: the token scored at each position
/// - returns vectors of `batch * positions` values, row-major
///
/// # Errors
/// [`ScoreError::LengthMismatch`] when a slice's length is not its shape's or the tokens are
/// not one per position; [`ScoreError::OutOfRange`] for a token `≥ vocab`.
pub fn position_metrics_on_host(
    ref_logits: &[f32],
    var_logits: &[f32],
    dims: [usize; 3],
    tokens: &[u32],
) -> Result<DevicePositionMetrics, ScoreError> {
    let len = check_shape("reference logits and their shape [batch, positions, vocab]", ref_logits, dims)?;
    if var_logits.len() != len {
        return Err(ScoreError::LengthMismatch {
            what: "reference and variant logits (elements)",
            left: len,
            right: var_logits.len(),
        });
    }
    check_tokens(dims, tokens)?;
    let [batch, positions, v] = dims;
    let n = tokens.len();
    let mut out = DevicePositionMetrics {
        batch,
        positions,
        kld: Vec::with_capacity(n),
        kld_reverse: Vec::with_capacity(n),
        accept: Vec::with_capacity(n),
        top_k: Vec::with_capacity(n),
        top1_agree: Vec::with_capacity(n),
        logp_ref_of_token: Vec::with_capacity(n),
        logp_var_of_token: Vec::with_capacity(n),
        ref_entropy: Vec::with_capacity(n),
    };
    let (mut px, mut py) = (Shifted::new(), Shifted::new());
    // The row's weights, kept for the acceptance's second pass (it needs both sums first).
    let (mut wx, mut wy) = (vec![0.0f64; v], vec![0.0f64; v]);
    let (mut top_x, mut top_y) = (Vec::with_capacity(2 * TOP_K), Vec::with_capacity(2 * TOP_K));
    for (i, &token) in tokens.iter().enumerate() {
        let (x, y) = (row(ref_logits, v, i), row(var_logits, v, i));
        let (max_x, max_y) = (row_max(x), row_max(y));
        let (mx, my) = (f64::from(max_x), f64::from(max_y));
        let (mut sx, mut sy, mut entropy_sum, mut kl_sum, mut rkl_sum) = (0.0f64, 0.0f64, 0.0f64, 0.0f64, 0.0f64);
        for (b, (xc, yc)) in x.chunks(BLOCK).zip(y.chunks(BLOCK)).enumerate() {
            let ((d, w), (e, we)) = (px.fill(xc, mx), py.fill(yc, my));
            for j in 0..xc.len() {
                sx += w[j];
                sy += we[j];
                entropy_sum += w[j] * d[j];
                kl_sum += w[j] * (d[j] - e[j]);
                rkl_sum += we[j] * (e[j] - d[j]);
            }
            wx[b * BLOCK..b * BLOCK + xc.len()].copy_from_slice(w);
            wy[b * BLOCK..b * BLOCK + yc.len()].copy_from_slice(we);
        }
        let (p, q) = (Norm::new(mx, sx), Norm::new(my, sy));
        out.kld.push((kl_sum / sx + (q.ln_sum - p.ln_sum)) as f32);
        out.kld_reverse.push((rkl_sum / sy + (p.ln_sum - q.ln_sum)) as f32);
        out.accept.push(min_sum(&wx, 1.0 / sx, &wy, 1.0 / sy) as f32);
        top_k(x, TOP_K.min(v), &mut top_x);
        top_k(y, TOP_K.min(v), &mut top_y);
        out.top_k.push(top_k_agreement(&ids(&top_x), &ids(&top_y)));
        out.top1_agree.push(first_argmax(x, max_x) == first_argmax(y, max_y));
        out.logp_ref_of_token.push(p.logp(x[token as usize]) as f32);
        out.logp_var_of_token.push(q.logp(y[token as usize]) as f32);
        out.ref_entropy.push(p.entropy(entropy_sum) as f32);
    }
    Ok(out)
}

/// `ln p(token)` at every position: [`crate::token_logprobs_on_device`] on the host.
///
/// # Shapes
/// - `logits`: `[batch, positions, vocab]` row-major, `dims = [batch, positions, vocab]`
/// - `tokens`: `batch * positions` token ids, row-major
/// - returns `batch * positions` values, row-major
///
/// # Errors
/// As [`position_metrics_on_host`].
pub fn token_logprobs_on_host(logits: &[f32], dims: [usize; 3], tokens: &[u32]) -> Result<Vec<f32>, ScoreError> {
    check_shape("logits and their shape [batch, positions, vocab]", logits, dims)?;
    check_tokens(dims, tokens)?;
    let v = dims[2];
    let mut px = Shifted::new();
    let logp = tokens.iter().enumerate().map(|(i, &token)| {
        let x = row(logits, v, i);
        let m = f64::from(row_max(x));
        let mut s = 0.0f64;
        for xc in x.chunks(BLOCK) {
            for &w in px.fill(xc, m).1 {
                s += w;
            }
        }
        Norm::new(m, s).logp(x[token as usize]) as f32
    });
    Ok(logp.collect())
}

/// The reference's [`CompactChunk`]: [`crate::compact_reference_on_device`] on the host. The
/// top-K is selected without sorting the vocabulary: candidates are kept in a buffer of `2k`
/// that is cut back to its best `k` whenever it fills, and only logits above the worst kept
/// one enter it.
///
/// # Shapes
/// - `ref_logits`: `[batch, positions, vocab]` row-major, `dims = [batch, positions, vocab]`
/// - `tokens`: `batch * positions` token ids, row-major: the token scored at each position
/// - `1 ≤ k < vocab`
///
/// # Errors
/// As [`position_metrics_on_host`]; [`ScoreError::Zero`] for `k = 0`,
/// [`ScoreError::OutOfRange`] for `k ≥ vocab`.
pub fn compact_reference_on_host(
    ref_logits: &[f32],
    dims: [usize; 3],
    tokens: &[u32],
    k: usize,
) -> Result<CompactChunk, ScoreError> {
    check_shape("reference logits and their shape [batch, positions, vocab]", ref_logits, dims)?;
    check_chunk(dims, tokens, k)?;
    let [batch, positions, v] = dims;
    let n = tokens.len();
    let mut out = CompactChunk {
        batch,
        positions,
        k,
        top_ids: Vec::with_capacity(n * k),
        top_logp: Vec::with_capacity(n * k),
        tail_logp: Vec::with_capacity(n),
        entropy: Vec::with_capacity(n),
        logp_of_token: Vec::with_capacity(n),
        argmax: Vec::with_capacity(n),
    };
    let mut candidates = Vec::with_capacity(2 * k);
    let mut in_top = vec![false; v];
    let mut px = Shifted::new();
    for (i, &token) in tokens.iter().enumerate() {
        let x = row(ref_logits, v, i);
        let max = row_max(x);
        let m = f64::from(max);
        top_k(x, k, &mut candidates);
        for &(_, id) in &candidates {
            in_top[id as usize] = true;
        }
        let (mut s, mut entropy_sum, mut tail_sum) = (0.0f64, 0.0f64, 0.0f64);
        for (xc, tops) in x.chunks(BLOCK).zip(in_top.chunks(BLOCK)) {
            let (d, w) = px.fill(xc, m);
            for j in 0..xc.len() {
                s += w[j];
                entropy_sum += w[j] * d[j];
                tail_sum += if tops[j] { 0.0 } else { w[j] };
            }
        }
        let p = Norm::new(m, s);
        out.tail_logp.push(p.tail_logp(x, &in_top, tail_sum) as f32);
        for &(_, id) in &candidates {
            in_top[id as usize] = false;
            out.top_ids.push(id);
            out.top_logp.push(p.logp(x[id as usize]) as f32);
        }
        out.entropy.push(p.entropy(entropy_sum) as f32);
        out.logp_of_token.push(p.logp(x[token as usize]) as f32);
        out.argmax.push(first_argmax(x, max) as u32);
    }
    Ok(out)
}

/// A variant's per-position metrics against the reference's [`CompactChunk`]:
/// [`crate::position_metrics_against_compact`] on the host. The KL is
/// [`crate::compact::compact_kl`] of the reference's values and the variant's, each rounded to
/// f32 first as on the device (so the reference's own logits give exactly 0 against a compact
/// reference made here).
///
/// # Shapes
/// - `reference`: `[batch, positions]` positions with `k` tokens each
/// - `var_logits`: `[batch, positions, vocab]` row-major, `dims = [batch, positions, vocab]`
/// - `tokens`: `batch * positions` token ids, row-major
///
/// # Errors
/// As [`compact_reference_on_host`] (with the reference's `k`); [`ScoreError::LengthMismatch`]
/// when the reference's positions or vectors do not fit the chunk; [`ScoreError::OutOfRange`]
/// for a top-K id `≥ vocab`; [`compact_kl`]'s for non-finite top-K log-probabilities.
pub fn position_metrics_against_compact_on_host(
    reference: &CompactChunk,
    var_logits: &[f32],
    dims: [usize; 3],
    tokens: &[u32],
) -> Result<DevicePositionMetrics, ScoreError> {
    check_shape("variant logits and their shape [batch, positions, vocab]", var_logits, dims)?;
    check_chunk(dims, tokens, reference.k)?;
    check_compact(reference, dims)?;
    let [batch, positions, v] = dims;
    let (n, k) = (tokens.len(), reference.k);
    let mut out = DevicePositionMetrics {
        batch,
        positions,
        kld: Vec::with_capacity(n),
        kld_reverse: Vec::with_capacity(n),
        accept: Vec::with_capacity(n),
        top_k: Vec::with_capacity(n),
        top1_agree: Vec::with_capacity(n),
        logp_ref_of_token: reference.logp_of_token.clone(),
        logp_var_of_token: Vec::with_capacity(n),
        ref_entropy: reference.entropy.clone(),
    };
    let mut in_top = vec![false; v];
    let (mut top_p, mut top_q) = (Vec::with_capacity(k), Vec::with_capacity(k));
    let mut top_y = Vec::with_capacity(2 * TOP_K);
    let mut py = Shifted::new();
    for (i, &token) in tokens.iter().enumerate() {
        let y = row(var_logits, v, i);
        let ids = &reference.top_ids[i * k..(i + 1) * k];
        for &id in ids {
            in_top[id as usize] = true;
        }
        let max = row_max(y);
        let m = f64::from(max);
        let (mut s, mut tail_sum) = (0.0f64, 0.0f64);
        for (yc, tops) in y.chunks(BLOCK).zip(in_top.chunks(BLOCK)) {
            let (_, w) = py.fill(yc, m);
            for j in 0..yc.len() {
                s += w[j];
                tail_sum += if tops[j] { 0.0 } else { w[j] };
            }
        }
        let q = Norm::new(m, s);
        let tail_q = f64::from(q.tail_logp(y, &in_top, tail_sum) as f32);
        top_q.clear();
        top_q.extend(ids.iter().map(|&id| f64::from(q.logp(y[id as usize]) as f32)));
        top_p.clear();
        top_p.extend(reference.top_logp[i * k..(i + 1) * k].iter().map(|&l| f64::from(l)));
        for &id in ids {
            in_top[id as usize] = false;
        }
        let tail_p = f64::from(reference.tail_logp[i]);
        out.kld.push(compact_kl(&top_p, tail_p, &top_q, tail_q)? as f32);
        out.kld_reverse.push(compact_kl(&top_q, tail_q, &top_p, tail_p)? as f32);
        out.accept.push(compact_acceptance(&top_p, tail_p, &top_q, tail_q)? as f32);
        top_k(y, TOP_K.min(v), &mut top_y);
        out.top_k.push(top_k_agreement(ids, &self::ids(&top_y)));
        out.top1_agree.push(reference.argmax[i] as usize == first_argmax(y, max));
        out.logp_var_of_token.push(q.logp(y[token as usize]) as f32);
    }
    Ok(out)
}

/// One row's softmax normalizer: `ln p_i = (x_i − max) − ln S`.
/// Logits a [`Shifted`] block holds: the sums run over a row in blocks of this many.
const BLOCK: usize = 256;

/// A block of a row's shifted logits and their exponentials: `d_j = x_j − m` (exact in f64, as
/// both are f32 values) and `w_j = e^{d_j}` ([`exp`]), computed elementwise in a loop the
/// compiler vectorises (for AVX-512 or AVX2 when [`Isa::current`] is one of them: the same
/// operations at any width, so the same values). The sums over them stay plain left-to-right
/// f64 sums.
struct Shifted {
    d: Box<[f64; BLOCK]>,
    w: Box<[f64; BLOCK]>,
}

impl Shifted {
    fn new() -> Self {
        Self { d: Box::new([0.0; BLOCK]), w: Box::new([0.0; BLOCK]) }
    }

    /// `d` and `w` of `x` (at most [`BLOCK`] logits) shifted by `m`.
    fn fill(&mut self, x: &[f32], m: f64) -> (&[f64], &[f64]) {
        let n = x.len();
        let (d, w) = (&mut self.d[..n], &mut self.w[..n]);
        match Isa::current() {
            // SAFETY: the CPU runs the current ISA (AVX-512F and more, here).
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { shift_exp_avx512(x, m, d, w) },
            // SAFETY: the CPU runs the current ISA (AVX2 and more, here).
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { shift_exp_avx2(x, m, d, w) },
            _ => shift_exp(x, m, d, w),
        }
        (d, w)
    }
}

/// [`shift_exp`] compiled for AVX-512.
///
/// # Safety
/// The CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn shift_exp_avx512(x: &[f32], m: f64, d: &mut [f64], w: &mut [f64]) {
    shift_exp(x, m, d, w);
}

/// [`shift_exp`] compiled for AVX2.
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn shift_exp_avx2(x: &[f32], m: f64, d: &mut [f64], w: &mut [f64]) {
    shift_exp(x, m, d, w);
}

/// `d_j = x_j − m`, `w_j = e^{d_j}`.
#[inline(always)]
fn shift_exp(x: &[f32], m: f64, d: &mut [f64], w: &mut [f64]) {
    for ((&xi, dj), wj) in x.iter().zip(d.iter_mut()).zip(w.iter_mut()) {
        *dj = f64::from(xi) - m;
        *wj = exp(*dj);
    }
}

/// `e^x` in f64 for the arguments the reductions take (`x_j − max ≤ 0`, `-inf`, or NaN),
/// branch-free so that loops over it vectorise: Cody–Waite reduction `x = n·ln 2 + r` with
/// fdlibm's two-part ln 2 (`n · LN2_HI` exact), `|r| ≤ ln 2 / 2`, and the Taylor polynomial of
/// `e^r` to degree 13 (truncation below 5·10⁻¹⁸ relative, under 0.05 ulp), in Horner form: within
/// 2 ulp of the exact value (tested against glibc's `exp`). Results below the smallest normal f64
/// (`x < -708.39`) are flushed to 0: those terms weigh less than `2⁻¹⁰⁰⁰` of any sum here,
/// which holds `e^0 = 1`. Arguments above 709 give `e^709`. `exp(0) == 1` exactly; NaN in,
/// NaN out.
///
/// Why hand-written: glibc's `exp` is one call per value (a fifth of a SmolLM2 evaluation's
/// reductions, 49,152 of them per position and model), and its results are not needed to the
/// last bit: every sum is rounded to f32 once.
#[inline(always)]
pub(crate) fn exp(x: f64) -> f64 {
    const LOG2E: f64 = std::f64::consts::LOG2_E;
    // 1.5 · 2⁵²: adding it rounds to an integer (ties to even) held in the low mantissa bits.
    const MAGIC: f64 = 6_755_399_441_055_744.0;
    // fdlibm's ln 2 split: LN2_HI has 32 significant bits, so n · LN2_HI is exact for |n| < 2²⁰.
    #[allow(clippy::excessive_precision)]
    const LN2_HI: f64 = 6.931_471_803_691_238_164_90e-1;
    #[allow(clippy::excessive_precision)]
    const LN2_LO: f64 = 1.908_214_929_270_587_700_02e-10;
    const LO: f64 = -708.39; // e^LO is just above 2⁻¹⁰²², the smallest normal f64
    const HI: f64 = 709.0;
    // 1/k! for k = 13 down to 2.
    const INV_FACT: [f64; 12] = [
        1.0 / 6_227_020_800.0,
        1.0 / 479_001_600.0,
        1.0 / 39_916_800.0,
        1.0 / 3_628_800.0,
        1.0 / 362_880.0,
        1.0 / 40_320.0,
        1.0 / 5_040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
    ];
    let xc = x.clamp(LO, HI);
    let t = xc * LOG2E + MAGIC;
    let n = t - MAGIC;
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let mut p = INV_FACT[0];
    for c in &INV_FACT[1..] {
        p = p * r + c;
    }
    let y = (p * r + 1.0) * r + 1.0;
    // 2ⁿ from the integer in t's mantissa: t's bits are 0x4338_0000_0000_0000 + n.
    let pow2 = f64::from_bits(t.to_bits().wrapping_sub(0x4338_0000_0000_0000).wrapping_add(1023) << 52);
    let e = y * pow2;
    if x < LO {
        0.0
    } else if x.is_nan() {
        x
    } else {
        e
    }
}

struct Norm {
    max: f64,
    sum: f64,
    ln_sum: f64,
}

impl Norm {
    fn new(max: f64, sum: f64) -> Self {
        Self { max, sum, ln_sum: sum.ln() }
    }

    fn logp(&self, x: f32) -> f64 {
        (f64::from(x) - self.max) - self.ln_sum
    }

    /// `H = ln S − Σ w_i (x_i − max) / S` from the row's `Σ w_i (x_i − max)`.
    fn entropy(&self, weighted: f64) -> f64 {
        self.ln_sum - weighted / self.sum
    }

    /// `ln Σ_{i∉T} p_i` from the tail's `Σ_{i∉T} w_i`; below [`TAIL_FLOOR`], summed again from
    /// the tail's own maximum.
    fn tail_logp(&self, x: &[f32], in_top: &[bool], tail_sum: f64) -> f64 {
        if tail_sum >= TAIL_FLOOR {
            return tail_sum.ln() - self.ln_sum;
        }
        let tail = || x.iter().zip(in_top).filter(|&(_, &top)| !top).map(|(&xi, _)| xi);
        let m = f64::from(tail().fold(f32::NEG_INFINITY, |m, xi| if xi > m { xi } else { m }));
        let s: f64 = tail().map(|xi| exp(f64::from(xi) - m)).sum();
        (m - self.max) + s.ln() - self.ln_sum
    }
}

/// Checks that a slice holds the elements of its `[batch, positions, vocab]` shape; returns
/// their number.
fn check_shape(what: &'static str, logits: &[f32], dims: [usize; 3]) -> Result<usize, ScoreError> {
    let [b, t, v] = dims;
    match b.checked_mul(t).and_then(|n| n.checked_mul(v)) {
        Some(n) if n == logits.len() => Ok(n),
        n => Err(ScoreError::LengthMismatch { what, left: logits.len(), right: n.unwrap_or(usize::MAX) }),
    }
}

fn row(logits: &[f32], vocab: usize, i: usize) -> &[f32] {
    &logits[i * vocab..(i + 1) * vocab]
}

/// The largest logit of a row; NaN if the row holds one (flex's `max_dim`).
fn row_max(x: &[f32]) -> f32 {
    // Independent lanes, so that the loop compiles to packed compares.
    const LANES: usize = 16;
    let (mut max, mut nan) = ([f32::NEG_INFINITY; LANES], [false; LANES]);
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for j in 0..LANES {
            max[j] = if c[j] > max[j] { c[j] } else { max[j] };
            nan[j] |= c[j].is_nan();
        }
    }
    let mut m = f32::NEG_INFINITY;
    for &xi in max.iter().chain(rest) {
        m = if xi > m { xi } else { m };
    }
    if nan.contains(&true) || rest.iter().any(|xi| xi.is_nan()) { f32::NAN } else { m }
}

/// Each row's top-1 token as [`compact_reference_on_host`] reports it: the first index holding
/// the row's largest logit (the first NaN where a row holds one), what greedy decoding's argmax
/// picks. The tokens a decoding step's logits are scored on when the reference's statistics are
/// taken from its decoding steps.
///
/// # Shapes
/// - `logits`: `[rows, vocab]`, row-major → `[rows]`
///
/// # Errors
/// [`ScoreError::LengthMismatch`] when `logits` is not `rows × vocab` values.
pub fn greedy_tokens_on_host(logits: &[f32], rows: usize, vocab: usize) -> Result<Vec<u32>, ScoreError> {
    check_shape("logits and their shape [rows, 1, vocab]", logits, [rows, 1, vocab])?;
    Ok((0..rows)
        .map(|i| {
            let x = row(logits, vocab, i);
            first_argmax(x, row_max(x)) as u32
        })
        .collect())
}

/// The first index holding `max` (the row's [`row_max`]); the first NaN when `max` is NaN.
fn first_argmax(x: &[f32], max: f32) -> usize {
    let at = if max.is_nan() { x.iter().position(|xi| xi.is_nan()) } else { x.iter().position(|&xi| xi == max) };
    at.unwrap_or(0)
}

/// The ids of a [`top_k`] list.
fn ids(top: &[(f32, u32)]) -> Vec<u32> {
    top.iter().map(|&(_, id)| id).collect()
}

/// `Σ_i min(a_i · sa, b_i · sb)` in f64, left to right: the acceptance `Σ min(p_i, q_i)` from a
/// row's weights and the inverses of their sums.
/// NaN when either row's sum is (a NaN or `+inf` logit), as on the device.
fn min_sum(a: &[f64], sa: f64, b: &[f64], sb: f64) -> f64 {
    if sa.is_nan() || sb.is_nan() {
        return f64::NAN;
    }
    let mut sum = 0.0;
    for (&ai, &bi) in a.iter().zip(b) {
        let (p, q) = (ai * sa, bi * sb);
        sum += if p < q { p } else { q };
    }
    sum
}

/// Order of the top-K: larger logit first, lower id first on ties (`+0.0` and `-0.0` are made
/// equal by the caller; NaNs go to either end, deterministically).
fn by_rank(a: &(f32, u32), b: &(f32, u32)) -> std::cmp::Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

/// The `k` largest logits of a row with their ids, in [`by_rank`] order, into `out`
/// (`1 ≤ k ≤ x.len()`).
fn top_k(x: &[f32], k: usize, out: &mut Vec<(f32, u32)>) {
    out.clear();
    let cut = |out: &mut Vec<(f32, u32)>| {
        out.select_nth_unstable_by(k - 1, by_rank);
        out.truncate(k);
    };
    // Once the buffer has been cut, only logits above the worst kept one can enter: an equal
    // one has a higher id than every kept one (and a NaN never enters).
    let (mut floor, mut cut_once) = (f32::NEG_INFINITY, false);
    for (i, &xi) in x.iter().enumerate() {
        if !cut_once || xi > floor {
            out.push((xi + 0.0, i as u32));
            if out.len() == 2 * k {
                cut(out);
                floor = out[k - 1].0;
                cut_once = true;
            }
        }
    }
    if out.len() > k {
        cut(out);
    }
    out.sort_unstable_by(by_rank);
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, Tensor, TensorData};

    use super::*;
    use crate::agreement::TopKAgreement;
    use crate::device::{
        compact_reference_on_device, position_metrics_against_compact, position_metrics_on_device,
        token_logprobs_on_device,
    };

    /// [`exp`] against glibc's `exp` (correctly rounded in all but rare cases) over the
    /// arguments the reductions take, and at its edges.
    #[test]
    fn exp_is_within_two_ulp_of_glibc() {
        let ulp = |v: f64| f64::from_bits(v.to_bits() + 1) - v;
        let mut worst = 0.0f64;
        let mut x = -708.3;
        while x <= 0.0 {
            let (got, want) = (exp(x), x.exp());
            worst = worst.max((got - want).abs() / ulp(want));
            x += 0.000_913;
        }
        for x in [-1e-300, -5e-324, -1e-9, -0.5, -0.346_573_590_279_972_6, -1.0, -700.0, 1.0, 0.5, 700.0] {
            worst = worst.max((exp(x) - x.exp()).abs() / ulp(x.exp()));
        }
        assert!(worst <= 2.0, "worst error {worst} ulp");
        println!("exp: worst error {worst:.3} ulp against glibc");
        assert_eq!(exp(0.0).to_bits(), 1.0f64.to_bits());
        assert_eq!(exp(-0.0).to_bits(), 1.0f64.to_bits());
        assert_eq!(exp(-709.0), 0.0);
        assert_eq!(exp(f64::NEG_INFINITY), 0.0);
        assert!(exp(f64::NAN).is_nan());
    }

    /// The AVX-512, AVX2 and portable builds of a block's exponentials give the same bits, at
    /// every ISA this CPU runs (the others are reported as skipped).
    #[test]
    fn shifted_blocks_are_the_same_in_every_build() {
        let isas = Isa::runnable_reporting_skips("shifted_blocks_are_the_same_in_every_build");
        let mut rng = Rng(7);
        let x: Vec<f32> = (0..BLOCK).map(|_| 30.0 * rng.normal()).chain([f32::NEG_INFINITY, f32::NAN]).collect();
        let m = f64::from(row_max(&x[..BLOCK]));
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for x in x.chunks(BLOCK) {
            let (mut d, mut w) = (vec![0.0; x.len()], vec![0.0; x.len()]);
            shift_exp(x, m, &mut d, &mut w);
            let mut builds: Vec<(&str, Vec<f64>, Vec<f64>)> = Vec::new();
            let mut shifted = Shifted::new();
            for &isa in &isas {
                let (d2, w2) = isa
                    .forced(|| {
                        let (d2, w2) = shifted.fill(x, m);
                        (d2.to_vec(), w2.to_vec())
                    })
                    .expect("a runnable ISA");
                builds.push((isa.name(), d2, w2));
            }
            let (d3, w3) = shifted.fill(x, m);
            builds.push(("dispatched", d3.to_vec(), w3.to_vec()));
            for (name, d2, w2) in builds {
                assert_eq!(bits(&d2), bits(&d), "{name}: d");
                assert_eq!(bits(&w2), bits(&w), "{name}: w");
            }
        }
    }

    /// splitmix64: seeded test data.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        /// Uniform in [0, 1).
        fn uniform(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1u64 << 53) as f64
        }

        fn normal(&mut self) -> f32 {
            let (u, v) = (1.0 - self.uniform(), self.uniform());
            ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
        }

        fn below(&mut self, n: usize) -> usize {
            (self.uniform() * n as f64) as usize
        }
    }

    /// A chunk of reference and variant logits and the scored tokens.
    struct Chunk {
        x: Vec<f32>,
        y: Vec<f32>,
        tokens: Vec<u32>,
    }

    /// Rows of five kinds in turn: normal (σ = 3) with a small perturbation; uniform in ±80 with
    /// a large one; peaked; coarse values with many exact ties (at the maximum and at the K-th
    /// place); a variant equal to the reference. Even rows score the reference's top-1 (as a
    /// greedy continuation), odd rows a random token. `grid` rounds every logit to a multiple of
    /// 2⁻¹⁰: distinct logits then stay distinct in the device's f32 log-probabilities, whose order
    /// is the one its top-K follows.
    fn chunk(dims: [usize; 3], seed: u64, grid: bool) -> Chunk {
        let [b, t, v] = dims;
        let mut rng = Rng(seed);
        let snap = |l: f32| if grid { (l * 1024.0).round() / 1024.0 } else { l };
        let (mut x, mut y, mut tokens) = (Vec::new(), Vec::new(), Vec::new());
        for r in 0..b * t {
            let row: Vec<f32> = match r % 5 {
                0 => (0..v).map(|_| 3.0 * rng.normal()).collect(),
                1 => (0..v).map(|_| (160.0 * rng.uniform() - 80.0) as f32).collect(),
                2 => {
                    let hot = rng.below(v);
                    (0..v).map(|i| 2.0 * rng.normal() + if i == hot { 15.0 } else { 0.0 }).collect()
                }
                3 => (0..v).map(|_| (rng.below(17) as f32 - 8.0) * 0.5).collect(),
                _ => (0..v).map(|_| 1.5 * rng.normal()).collect(),
            };
            let row: Vec<f32> = row.into_iter().map(snap).collect();
            y.extend(row.iter().map(|&l| {
                snap(match r % 5 {
                    0 => l + 0.05 * rng.normal(),
                    1 => l + 0.5 * rng.normal(),
                    2 => l + 0.02 * rng.normal(),
                    3 => l + 0.5 * rng.below(2) as f32,
                    _ => l,
                })
            }));
            tokens.push(if r % 2 == 0 { plain_top1(&row) as u32 } else { rng.below(v) as u32 });
            x.extend(row);
        }
        Chunk { x, y, tokens }
    }

    fn tensor(data: &[f32], dims: [usize; 3]) -> Tensor<3> {
        Tensor::from_data(TensorData::new(data.to_vec(), dims), &Device::flex())
    }

    /// Host and device values agree within the device's own error: its f32 sums of `vocab`
    /// terms are off by up to γ_V = V·2⁻²⁴ relative (the bound of a recursive sum), which
    /// carries into `ln S` and every log-probability, entropy and KL, so the bound is taken
    /// relative to `max(|value|, 1)`. Measured worst on these chunks: a third of γ_V at V = 7
    /// (KL), 9.3e-5 at V = 49,152 (γ_V = 2.9e-3), 5.8e-4 at V = 151,936 (γ_V = 9.1e-3), all
    /// of it the device's: the host's own error is one f32 rounding ([`assert_rounded`]). NaNs
    /// and infinities must match exactly.
    fn assert_device(what: &str, vocab: usize, host: &[f32], device: &[f32]) {
        assert_eq!(host.len(), device.len(), "{what}: lengths");
        let gamma = vocab as f64 * 2f64.powi(-24);
        for (i, (&h, &d)) in host.iter().zip(device).enumerate() {
            let (h, d) = (f64::from(h), f64::from(d));
            let same = (h.is_nan() && d.is_nan()) || h == d || (h - d).abs() <= gamma * h.abs().max(1.0);
            assert!(same, "{what}[{i}], V = {vocab}: host {h} vs device {d} (tolerance {gamma:.1e})");
        }
    }

    /// The top-K agreements of host and device are the same, except at positions where either
    /// row has a tie at the [`TOP_K`]-th place (which tied token is kept is the device sort's
    /// choice).
    fn assert_top_k(c: &Chunk, v: usize, host: &[TopKAgreement], device: &[TopKAgreement]) {
        assert_eq!(host.len(), device.len(), "top-K: lengths");
        let tied = |x: &[f32]| {
            let mut sorted = x.to_vec();
            sorted.sort_by(|a, b| b.total_cmp(a));
            sorted.len() > TOP_K && sorted[TOP_K - 1] == sorted[TOP_K]
        };
        let mut compared = 0;
        for i in 0..host.len() {
            if !tied(&c.x[i * v..(i + 1) * v]) && !tied(&c.y[i * v..(i + 1) * v]) {
                assert_eq!(host[i], device[i], "position {i}, V = {v}: top-K agreement");
                compared += 1;
            }
        }
        assert!(compared * 2 >= host.len(), "too few positions without ties: {compared} of {}", host.len());
    }

    /// The host's value is the f64 definition rounded once to f32: within one f32 ulp
    /// (2⁻²³ relative, twice the rounding), plus 1e-12 for the f64 sums' own error near 0.
    fn assert_rounded(what: &str, got: f32, want: f64) {
        let got = f64::from(got);
        let ok = got == want || (got - want).abs() <= want.abs() * 2f64.powi(-23) + 1e-12;
        assert!(ok, "{what}: {got} vs the f64 definition's {want}");
    }

    // The f64 definitions, written plainly: log-softmax in two passes, then sums over it.

    fn plain_log_softmax(x: &[f32]) -> Vec<f64> {
        let m = x.iter().map(|&l| f64::from(l)).fold(f64::NEG_INFINITY, f64::max);
        let z = m + x.iter().map(|&l| (f64::from(l) - m).exp()).sum::<f64>().ln();
        x.iter().map(|&l| f64::from(l) - z).collect()
    }

    fn plain_top1(x: &[f32]) -> usize {
        (1..x.len()).fold(0, |best, i| if x[i] > x[best] { i } else { best })
    }

    fn plain_lse(l: &[f64]) -> f64 {
        let m = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        m + l.iter().map(|&v| (v - m).exp()).sum::<f64>().ln()
    }

    /// `(KL, H(P), ln p(token), ln q(token))`.
    fn plain_metrics(x: &[f32], y: &[f32], token: usize) -> (f64, f64, f64, f64) {
        let (lp, lq) = (plain_log_softmax(x), plain_log_softmax(y));
        let kl = lp.iter().zip(&lq).map(|(&p, &q)| p.exp() * (p - q)).sum();
        let h = -lp.iter().map(|&p| p.exp() * p).sum::<f64>();
        (kl, h, lp[token], lq[token])
    }

    /// `(KL(Q ‖ P), Σ min(p, q))`.
    fn plain_reverse_and_acceptance(x: &[f32], y: &[f32]) -> (f64, f64) {
        let (lp, lq) = (plain_log_softmax(x), plain_log_softmax(y));
        let kl = lq.iter().zip(&lp).map(|(&q, &p)| q.exp() * (q - p)).sum();
        (kl, lp.iter().zip(&lq).map(|(&p, &q)| p.exp().min(q.exp())).sum())
    }

    /// `Σ e^a (a − b)` over paired log-probabilities, and the bound on how far rounding each
    /// to f32 can move it: d/da e^a (a − b) = e^a (a − b + 1), d/db = −e^a; each moves by up to
    /// 2⁻²⁴ of itself.
    fn kl_and_tolerance(pairs: &[(f64, f64)]) -> (f64, f64) {
        let kl: f64 = pairs.iter().map(|&(a, b)| a.exp() * (a - b)).sum();
        let moved: f64 = pairs.iter().map(|&(a, b)| a.exp() * (((a - b).abs() + 1.0) * a.abs() + b.abs())).sum();
        (kl, 2f64.powi(-23) * (moved + kl.abs()) + 1e-12)
    }

    /// The top-K by a stable sort of the log-probabilities (lower id first on ties), their
    /// log-probabilities and the tail's.
    fn plain_compact(x: &[f32], k: usize) -> (Vec<u32>, Vec<f64>, f64) {
        let lp = plain_log_softmax(x);
        let mut order: Vec<usize> = (0..x.len()).collect();
        order.sort_by(|&a, &b| lp[b].total_cmp(&lp[a]));
        let tail: Vec<f64> = order[k..].iter().map(|&i| lp[i]).collect();
        (order[..k].iter().map(|&i| i as u32).collect(), order[..k].iter().map(|&i| lp[i]).collect(), plain_lse(&tail))
    }

    const SHAPES: [([usize; 3], usize); 6] = [
        ([1, 1, 7], 3),
        ([2, 3, 17], 4),
        ([3, 5, 1000], 16),
        ([2, 5, 4099], 64),
        ([1, 10, 49_152], 64),
        ([1, 5, 151_936], 256),
    ];

    /// Every output against the device reductions on flex, on chunks of every kind: values
    /// within the device's error ([`assert_device`]), top-1 and top-K ids exactly, except which
    /// of the tokens tied at the K-th place are kept (there the device's ids must be tied
    /// tokens too, in increasing order).
    #[test]
    fn matches_the_device_reductions_on_flex() {
        for (seed, &(dims, k)) in SHAPES.iter().enumerate() {
            let c = chunk(dims, seed as u64, true);
            let v = dims[2];
            let (tx, ty) = (tensor(&c.x, dims), tensor(&c.y, dims));
            let h = position_metrics_on_host(&c.x, &c.y, dims, &c.tokens).expect("host");
            let d = position_metrics_on_device(tx.clone(), ty.clone(), &c.tokens).expect("device");
            assert_eq!((h.batch, h.positions), (d.batch, d.positions));
            assert_eq!(h.top1_agree, d.top1_agree, "{dims:?}: top-1 agreement");
            assert_device("KL", v, &h.kld, &d.kld);
            assert_device("reverse KL", v, &h.kld_reverse, &d.kld_reverse);
            assert_device("acceptance", v, &h.accept, &d.accept);
            assert_top_k(&c, v, &h.top_k, &d.top_k);
            assert_device("log p_ref(token)", v, &h.logp_ref_of_token, &d.logp_ref_of_token);
            assert_device("log p_var(token)", v, &h.logp_var_of_token, &d.logp_var_of_token);
            assert_device("entropy", v, &h.ref_entropy, &d.ref_entropy);
            let lp = token_logprobs_on_host(&c.x, dims, &c.tokens).expect("host");
            assert_eq!(lp, h.logp_ref_of_token, "token_logprobs_on_host is position_metrics_on_host's");
            assert_device("token log p", v, &lp, &token_logprobs_on_device(tx.clone(), &c.tokens).expect("device"));

            let ch = compact_reference_on_host(&c.x, dims, &c.tokens, k).expect("host compact");
            let cd = compact_reference_on_device(tx, &c.tokens, k).expect("device compact");
            assert_eq!(ch.argmax, cd.argmax, "{dims:?}: reference top-1");
            assert_device("top-K log p", v, &ch.top_logp, &cd.top_logp);
            assert_device("tail log-mass", v, &ch.tail_logp, &cd.tail_logp);
            assert_device("compact entropy", v, &ch.entropy, &cd.entropy);
            assert_device("compact log p(token)", v, &ch.logp_of_token, &cd.logp_of_token);
            let mut boundary_ties = 0;
            for i in 0..c.tokens.len() {
                let x = &c.x[i * v..(i + 1) * v];
                let (hi, di) = (&ch.top_ids[i * k..(i + 1) * k], &cd.top_ids[i * k..(i + 1) * k]);
                let kth = x[hi[k - 1] as usize];
                for j in 0..k {
                    if x[hi[j] as usize] == kth {
                        assert_eq!(x[di[j] as usize], kth, "{dims:?} position {i}: a token tied at the K-th place");
                        assert!(j == 0 || x[hi[j - 1] as usize] > kth || di[j - 1] < di[j], "tied ids increase");
                    } else {
                        assert_eq!(hi[j], di[j], "{dims:?} position {i}: top-K id {j}");
                    }
                }
                boundary_ties += usize::from(hi != di);
            }

            // The host against the device's compact reference (same ids), and each against its own.
            let both = position_metrics_against_compact(&cd, ty, &c.tokens).expect("device");
            let host_on_device_ref =
                position_metrics_against_compact_on_host(&cd, &c.y, dims, &c.tokens).expect("host");
            let own = position_metrics_against_compact_on_host(&ch, &c.y, dims, &c.tokens).expect("host");
            assert_device("KL_K", v, &host_on_device_ref.kld, &both.kld);
            assert_device("reverse KL_K", v, &host_on_device_ref.kld_reverse, &both.kld_reverse);
            assert_device("acceptance_K", v, &host_on_device_ref.accept, &both.accept);
            assert_top_k(&c, v, &host_on_device_ref.top_k, &both.top_k);
            assert_eq!(host_on_device_ref.top1_agree, both.top1_agree);
            assert_eq!(own.top1_agree, both.top1_agree);
            assert_device("compact log p_var(token)", v, &own.logp_var_of_token, &both.logp_var_of_token);
            for i in 0..c.tokens.len() {
                if ch.top_ids[i * k..(i + 1) * k] == cd.top_ids[i * k..(i + 1) * k] {
                    assert_device("own KL_K", v, &own.kld[i..=i], &both.kld[i..=i]);
                }
            }
            println!("{dims:?} K = {k}: {boundary_ties} positions keep other tokens tied at the K-th place");
        }
    }

    /// Every output against the f64 definitions: one f32 rounding ([`assert_rounded`]), top-1
    /// and top-K ids exactly; the compact KL within what rounding its K + 1 log-probabilities
    /// of each side to f32 (as the device does) can move it.
    #[test]
    fn matches_the_f64_definitions() {
        for (seed, &(dims, k)) in SHAPES[..5].iter().enumerate() {
            let c = chunk(dims, 100 + seed as u64, false);
            let v = dims[2];
            let h = position_metrics_on_host(&c.x, &c.y, dims, &c.tokens).expect("host");
            let ch = compact_reference_on_host(&c.x, dims, &c.tokens, k).expect("host compact");
            let m = position_metrics_against_compact_on_host(&ch, &c.y, dims, &c.tokens).expect("host");
            for (i, &token) in c.tokens.iter().enumerate() {
                let (x, y) = (&c.x[i * v..(i + 1) * v], &c.y[i * v..(i + 1) * v]);
                let (kl, entropy, lpr, lpv) = plain_metrics(x, y, token as usize);
                assert_rounded("KL", h.kld[i], kl);
                assert_rounded("entropy", h.ref_entropy[i], entropy);
                assert_rounded("log p_ref(token)", h.logp_ref_of_token[i], lpr);
                assert_rounded("log p_var(token)", h.logp_var_of_token[i], lpv);
                assert_eq!(h.top1_agree[i], plain_top1(x) == plain_top1(y));
                let (reverse, accept) = plain_reverse_and_acceptance(x, y);
                assert_rounded("reverse KL", h.kld_reverse[i], reverse);
                assert_rounded("acceptance", h.accept[i], accept);
                let top = |z: &[f32]| crate::top_k_ids(z, TOP_K).expect("top-K");
                let want = crate::top_k_agreement(&top(x), &top(y));
                assert_eq!(h.top_k[i], want, "{dims:?} position {i}: top-K agreement");
                assert_eq!(h.top_k[i].ref_top1_rank == 0, h.top1_agree[i], "rank 0 is top-1 agreement");

                let (ids, top_p, tail_p) = plain_compact(x, k);
                assert_eq!(ch.top_ids[i * k..(i + 1) * k], ids[..], "{dims:?} position {i}: top-K ids");
                assert_eq!(ch.argmax[i] as usize, plain_top1(x));
                for (j, &want) in top_p.iter().enumerate() {
                    assert_rounded("top-K log p", ch.top_logp[i * k + j], want);
                }
                assert_rounded("tail log-mass", ch.tail_logp[i], tail_p);
                assert_eq!((ch.entropy[i], ch.logp_of_token[i]), (h.ref_entropy[i], h.logp_ref_of_token[i]));

                let lq = plain_log_softmax(y);
                let top_q: Vec<f64> = ids.iter().map(|&id| lq[id as usize]).collect();
                let rest: Vec<f64> = (0..v).filter(|j| !ids.contains(&(*j as u32))).map(|j| lq[j]).collect();
                let tail_q = plain_lse(&rest);
                let pairs: Vec<(f64, f64)> = top_p.iter().copied().zip(top_q).chain([(tail_p, tail_q)]).collect();
                let (kl_k, tol) = kl_and_tolerance(&pairs);
                let got = f64::from(m.kld[i]);
                assert!((got - kl_k).abs() <= tol, "{dims:?} position {i}: KL_K {got} vs {kl_k} (tolerance {tol:.1e})");
                let swapped: Vec<(f64, f64)> = pairs.iter().map(|&(p, q)| (q, p)).collect();
                let (reverse_k, tol) = kl_and_tolerance(&swapped);
                let got = f64::from(m.kld_reverse[i]);
                assert!((got - reverse_k).abs() <= tol, "{dims:?} position {i}: reverse KL_K {got} vs {reverse_k}");
                assert!(reverse_k <= reverse + 1e-12, "the compact reverse KL is a lower bound");
                let accept_k: f64 = pairs.iter().map(|&(p, q)| p.exp().min(q.exp())).sum();
                // Each term moves by up to 2⁻²⁴ of |ln|, relative.
                let tol =
                    2f64.powi(-23) * pairs.iter().map(|&(p, q)| p.exp() * p.abs() + q.exp() * q.abs()).sum::<f64>();
                let got = f64::from(m.accept[i]);
                assert!(
                    (got - accept_k).abs() <= tol + 1e-7,
                    "{dims:?} position {i}: acceptance_K {got} vs {accept_k}"
                );
                assert!(accept_k >= accept - 1e-12, "the compact acceptance is an upper bound");
                let known = crate::top_k_agreement(&ids[..k.min(TOP_K)], &top(y));
                assert_eq!(m.top_k[i], known, "{dims:?} position {i}: compact top-K agreement");
            }
        }
    }

    /// The exact and the compact paths give bit-identical log p, entropy and top-1 (a compact
    /// run changes nothing but the KL), and a variant equal to the reference gives exactly 0.
    #[test]
    fn paths_agree_bit_for_bit_and_identity_gives_zero() {
        let dims = [2, 5, 3001];
        let c = chunk(dims, 3, false);
        let exact = position_metrics_on_host(&c.x, &c.y, dims, &c.tokens).expect("exact");
        let reference = compact_reference_on_host(&c.x, dims, &c.tokens, 32).expect("compact");
        let compact = position_metrics_against_compact_on_host(&reference, &c.y, dims, &c.tokens).expect("compact");
        assert_eq!(compact.top1_agree, exact.top1_agree);
        assert_eq!(compact.logp_ref_of_token, exact.logp_ref_of_token);
        assert_eq!(compact.logp_var_of_token, exact.logp_var_of_token);
        assert_eq!(compact.ref_entropy, exact.ref_entropy);
        assert_eq!(compact.top_k, exact.top_k, "K = 32 ≥ 5: the top-K agreement is exact");
        for i in (4..10).step_by(5) {
            assert_eq!((exact.kld[i], compact.kld[i]), (0.0, 0.0), "row {i}: the variant is the reference");
            assert_eq!((exact.kld_reverse[i], compact.kld_reverse[i]), (0.0, 0.0));
            assert!((exact.accept[i] - 1.0).abs() < 1e-6 && (compact.accept[i] - 1.0).abs() < 1e-6);
        }
        let same = position_metrics_against_compact_on_host(&reference, &c.x, dims, &c.tokens).expect("same");
        assert!(same.kld.iter().all(|&kl| kl == 0.0), "{:?}", same.kld);
        assert!(position_metrics_on_host(&c.x, &c.x, dims, &c.tokens).expect("same").kld.iter().all(|&kl| kl == 0.0));
    }

    /// `-inf`, NaN and `+inf` logits give what the device gives (see the module docs).
    #[test]
    fn non_finite_logits_as_on_the_device() {
        let dims = [1, 5, 37];
        let v = dims[2];
        let c = chunk(dims, 9, true);
        let (mut x, mut y) = (c.x.clone(), c.y.clone());
        let tokens = vec![1, 2, 3, 4, 1];
        x[5] = f32::NEG_INFINITY; // row 0: a reference token with no mass
        y[v + 6] = f32::NEG_INFINITY; // row 1: a variant token with none
        x[2 * v + 7] = f32::NAN;
        x[3 * v + 8] = f32::INFINITY;
        x[4 * v + 3..5 * v].fill(f32::NEG_INFINITY); // row 4: three tokens, then -inf
        let h = position_metrics_on_host(&x, &y, dims, &tokens).expect("host");
        let d = position_metrics_on_device(tensor(&x, dims), tensor(&y, dims), &tokens).expect("device");
        assert!(h.kld[0].is_nan() && h.ref_entropy[0].is_nan() && h.logp_ref_of_token[0].is_finite());
        assert_eq!(h.kld[1], f32::INFINITY);
        assert!(h.kld[2].is_nan() && h.logp_ref_of_token[3].is_nan());
        assert_eq!(h.top1_agree, d.top1_agree);
        assert_device("KL", v, &h.kld, &d.kld);
        assert_device("reverse KL", v, &h.kld_reverse, &d.kld_reverse);
        assert_device("acceptance", v, &h.accept, &d.accept);
        assert_device("entropy", v, &h.ref_entropy, &d.ref_entropy);
        assert_device("log p_ref(token)", v, &h.logp_ref_of_token, &d.logp_ref_of_token);
        assert_device("log p_var(token)", v, &h.logp_var_of_token, &d.logp_var_of_token);

        let k = 3;
        let ch = compact_reference_on_host(&x, dims, &tokens, k).expect("host");
        let cd = compact_reference_on_device(tensor(&x, dims), &tokens, k).expect("device");
        assert_eq!(ch.argmax, cd.argmax, "the first maximum, or the first NaN");
        assert_eq!((ch.argmax[2], ch.argmax[3]), (7, 8));
        assert!(ch.tail_logp[4].is_nan(), "a tail of -inf only: NaN, as the device");
        assert!(ch.tail_logp[0].is_finite() && ch.entropy[0].is_nan());
        assert_device("tail log-mass", v, &ch.tail_logp, &cd.tail_logp);
        assert_device("compact entropy", v, &ch.entropy, &cd.entropy);
        assert_eq!(ch.top_ids[..k], cd.top_ids[..k]);
        // NaN top-K log-probabilities (rows 2 and 3) are refused by compact_kl, on both sides.
        let hv = position_metrics_against_compact_on_host(&ch, &y, dims, &tokens);
        let dv = position_metrics_against_compact(&cd, tensor(&y, dims), &tokens);
        match (hv, dv) {
            (
                Err(ScoreError::NonFinite { what: hw, index: hi, .. }),
                Err(ScoreError::NonFinite { what: dw, index: di, .. }),
            ) => assert_eq!((hw, hi), (dw, di)),
            other => panic!("{other:?}"),
        }
    }

    /// A tail more than 745 nats below the top, where `exp(x − max)` underflows to 0, is summed
    /// from its own maximum.
    #[test]
    fn a_tail_far_below_the_top_is_summed_from_its_own_maximum() {
        let dims = [1, 1, 50];
        let mut x = vec![0.0f32; 50];
        x[7] = 1000.0;
        let c = compact_reference_on_host(&x, dims, &[7], 1).expect("host");
        let want = 49f64.ln() - 1000.0;
        assert_rounded("tail log-mass", c.tail_logp[0], want);
        let d = compact_reference_on_device(tensor(&x, dims), &[7], 1).expect("device");
        assert_device("tail log-mass", 50, &c.tail_logp, &d.tail_logp);
        let m = position_metrics_against_compact_on_host(&c, &x, dims, &[7]).expect("host");
        assert_eq!(m.kld, [0.0]);
    }

    /// The selection keeps what a stable sort keeps, in its order, whatever the row's order.
    #[test]
    fn top_k_is_a_stable_sort_cut() {
        let mut rng = Rng(5);
        let rows: Vec<Vec<f32>> = vec![
            (0..300).map(|i| i as f32).collect(),
            (0..300).map(|i| -(i as f32)).collect(),
            vec![1.5; 300],
            (0..300).map(|i| (i % 7) as f32).collect(),
            (0..300).map(|i| if i % 2 == 0 { 0.0 } else { -0.0 }).collect(),
            (0..300).map(|_| rng.below(5) as f32).collect(),
        ];
        let mut out = Vec::new();
        for x in &rows {
            for k in [1, 2, 7, 64, 150, 299, 300] {
                top_k(x, k, &mut out);
                let mut order: Vec<usize> = (0..x.len()).collect();
                order.sort_by(|&a, &b| x[b].partial_cmp(&x[a]).expect("finite"));
                let want: Vec<u32> = order[..k].iter().map(|&i| i as u32).collect();
                assert_eq!(out.iter().map(|&(_, id)| id).collect::<Vec<_>>(), want, "k = {k}");
            }
        }
    }

    /// Bad input gives the device functions' errors; a slice that is not its shape is refused.
    #[test]
    fn bad_input_gives_the_device_errors() {
        let dims = [2, 3, 11];
        let c = chunk(dims, 4, true);
        let (x, y) = (&c.x, &c.y);
        let t = |data: &[f32], dims| tensor(data, dims);
        let mut bad_token = c.tokens.clone();
        bad_token[4] = 11;
        let short = &c.tokens[..5];
        for tokens in [&bad_token[..], short] {
            assert_eq!(
                position_metrics_on_host(x, y, dims, tokens),
                position_metrics_on_device(t(x, dims), t(y, dims), tokens)
            );
            assert_eq!(token_logprobs_on_host(x, dims, tokens), token_logprobs_on_device(t(x, dims), tokens));
            assert_eq!(
                compact_reference_on_host(x, dims, tokens, 3),
                compact_reference_on_device(t(x, dims), tokens, 3)
            );
        }
        let wide = vec![0.0f32; 2 * 3 * 12];
        assert_eq!(
            position_metrics_on_host(x, &wide, dims, &c.tokens),
            position_metrics_on_device(t(x, dims), t(&wide, [2, 3, 12]), &c.tokens)
        );
        for k in [0, 11, 12] {
            let host = compact_reference_on_host(x, dims, &c.tokens, k);
            assert!(host.is_err());
            assert_eq!(host, compact_reference_on_device(t(x, dims), &c.tokens, k));
        }

        let reference = compact_reference_on_host(x, dims, &c.tokens, 3).expect("reference");
        let against = |r: &CompactChunk, y: &[f32], dims, tokens: &[u32]| {
            let host = position_metrics_against_compact_on_host(r, y, dims, tokens);
            assert!(host.is_err(), "{host:?}");
            assert_eq!(host, position_metrics_against_compact(r, t(y, dims), tokens));
        };
        against(&reference, y, dims, &bad_token);
        against(&reference, y, dims, short);
        against(&reference, &y[..2 * 2 * 11], [2, 2, 11], &c.tokens[..4]);
        let narrow: Vec<f32> = vec![0.0; 2 * 3 * 3];
        against(&reference, &narrow, [2, 3, 3], &[0; 6]);
        let mut tampered = reference.clone();
        tampered.top_ids[5] = 11;
        against(&tampered, y, dims, &c.tokens);
        let mut tampered = reference.clone();
        tampered.top_logp.pop();
        against(&tampered, y, dims, &c.tokens);
        let mut tampered = reference.clone();
        tampered.argmax.push(0);
        against(&tampered, y, dims, &c.tokens);

        let shape = |what, left, right| Some(ScoreError::LengthMismatch { what, left, right });
        assert_eq!(
            position_metrics_on_host(&x[1..], y, dims, &c.tokens).err(),
            shape("reference logits and their shape [batch, positions, vocab]", 65, 66)
        );
        assert_eq!(
            token_logprobs_on_host(x, [2, 3, 12], &c.tokens).err(),
            shape("logits and their shape [batch, positions, vocab]", 66, 72)
        );
        assert_eq!(
            compact_reference_on_host(x, [usize::MAX, 2, 11], &c.tokens, 3).err(),
            shape("reference logits and their shape [batch, positions, vocab]", 66, usize::MAX)
        );
        assert_eq!(
            position_metrics_against_compact_on_host(&reference, &y[..65], dims, &c.tokens).err(),
            shape("variant logits and their shape [batch, positions, vocab]", 65, 66)
        );
        // An empty chunk is no error.
        let empty = position_metrics_on_host(&[], &[], [0, 3, 11], &[]).expect("empty");
        assert!(empty.kld.is_empty() && empty.batch == 0);
        assert!(compact_reference_on_host(&[], [2, 0, 11], &[], 3).expect("empty").top_ids.is_empty());
    }
}
