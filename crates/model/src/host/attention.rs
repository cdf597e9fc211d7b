//! Attention computed on the host for the CPU backend: one fused pass per query over the keys it
//! can see, in place of Burn's composed matmul → mask → softmax → matmul.
//!
//! Why hand-written: on Burn's flex backend the composed attention was most of an evaluation's
//! time (profiled with perf on stories260K, 32 prompts × 1000 tokens: libm `expf` one value at a
//! time, the softmax, the score scaling, the additive mask and whole-tensor f16↔f32 casts, all
//! over `[batch, heads, new, keys]` score tensors that a fused pass never materialises). The
//! speed-up is measured in `cargo xtask bench`.
//!
//! Numerics are those of fused attention kernels (FlashAttention-2, Dao 2023; PyTorch's
//! `scaled_dot_product_attention`): q·k is accumulated in f32 and kept in f32, scaled by 1/√d in
//! f32, the softmax runs in f32, the probabilities are rounded to the compute dtype before they
//! weight the values (the cast in front of the P·V matmul), P·V is accumulated in f32 and the
//! output is rounded to the compute dtype. In f32 every rounding is the identity. Keys a query
//! cannot see (padding, the future) are skipped, not masked with −∞.
//!
//! Determinism: every sum has a fixed order that depends neither on the SIMD width nor on the
//! batch, its composition or how a sequence is cut into chunks (a query's result depends only on
//! its own vector and its visible keys and values). The AVX2 and AVX-512 builds of the kernel
//! perform the same IEEE operations as the portable build (vectors only put independent lanes
//! side by side, and Rust never contracts `a * b + c` into an FMA), so all three give
//! bit-identical results; which one runs is [`Isa::current`]'s choice, read once per call.
//!
//! Layout: the code here (the per-query and per-group passes, the softmax) is generic over the
//! ISA and compiled once per ISA (`attend_one_avx2`, `attend_one_avx512`, …); its dot products
//! are the per-ISA kernels of [`portable`], [`avx2`] and [`avx512`].
//!
//! Grouped-query attention: the query heads that share a key/value head see the same keys and
//! values at a position, so the AVX-512 and AVX2 builds attend up to three of them in each pass
//! over the keys and values (each vector loaded and widened once for all three); each head's
//! operations are unchanged, so are its bits.
//!
//! Threads: where the linear layers fork-join (one batch at a time, [`spreads`]), a
//! call big enough spreads its queries, one (row, column, key/value head) each, over rayon's
//! threads; each is computed by the same operations whichever thread runs it, so the results do
//! not change.

use half::f16;
use qdrift_isa::Isa;
use rayon::prelude::*;

use super::elem::{Elem, round_to_f16};
use super::portable;
use super::threads::spreads;
#[cfg(target_arch = "x86_64")]
use super::{avx2, avx512};
use crate::Positions;

/// The dtype the model computes in, as far as attention's roundings are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Precision {
    /// Nothing is rounded below f32.
    F32,
    /// Keys and values are stored as f16; probabilities and outputs are rounded to f16.
    F16,
}

/// Keys `[batch, kv_heads, head_dim, capacity]` (transposed, so that one query's scores over
/// consecutive keys are vector loads) and values `[batch, kv_heads, capacity, head_dim]`.
#[derive(Debug)]
struct KvBuffers<T> {
    keys: Vec<T>,
    values: Vec<T>,
}

/// The buffers in the cache's element type: f16 stays f16 in host memory, as on the device.
#[derive(Debug)]
enum TypedBuffers {
    F32(KvBuffers<f32>),
    F16(KvBuffers<f16>),
}

/// The shape of a [`HostKv`].
#[derive(Debug, Clone, Copy)]
struct Shape {
    batch: usize,
    kv_heads: usize,
    head_dim: usize,
    capacity: usize,
}

/// Keys and values of one attention layer for a batch, in host memory, preallocated for the whole
/// run, in the compute dtype (f16 or f32).
#[derive(Debug)]
pub(crate) struct HostKv {
    shape: Shape,
    buffers: TypedBuffers,
    /// One query's scores, reused across calls.
    scores: Vec<f32>,
}

impl HostKv {
    pub(crate) fn new(batch: usize, kv_heads: usize, capacity: usize, head_dim: usize, precision: Precision) -> Self {
        let n = batch * kv_heads * capacity * head_dim;
        let buffers = match precision {
            Precision::F32 => TypedBuffers::F32(KvBuffers { keys: vec![0.0; n], values: vec![0.0; n] }),
            Precision::F16 => TypedBuffers::F16(KvBuffers { keys: vec![f16::ZERO; n], values: vec![f16::ZERO; n] }),
        };
        Self { shape: Shape { batch, kv_heads, head_dim, capacity }, buffers, scores: Vec::new() }
    }

    /// Writes keys and values for columns `start..start + new`.
    ///
    /// # Shapes
    /// - `k`, `v`: `[batch, new, kv_heads, head_dim]`, row-major, representable in the stored dtype
    pub(crate) fn write(&mut self, k: &[f32], v: &[f32], start: usize, new: usize) {
        let sh = self.shape;
        assert_eq!(k.len(), sh.batch * new * sh.kv_heads * sh.head_dim, "keys do not match the cache's shape");
        assert_eq!(v.len(), k.len(), "values do not match the keys");
        match &mut self.buffers {
            TypedBuffers::F32(st) => write(st, sh, k, v, start, new),
            TypedBuffers::F16(st) => write(st, sh, k, v, start, new),
        }
    }

    /// Attention of the queries in columns `start..start + new` over the columns written so far
    /// (`0..start + new`), each over the keys [`Positions::visible`] gives it.
    ///
    /// # Shapes
    /// - `q`: `[batch, new, heads, head_dim]`, row-major; query head `h` uses key/value head
    ///   `h / (heads / kv_heads)`
    /// - returns `[batch, new, heads * head_dim]`, rounded to the compute dtype
    pub(crate) fn attend(
        &mut self,
        q: &[f32],
        heads: usize,
        positions: &Positions,
        start: usize,
        new: usize,
    ) -> Vec<f32> {
        let sh = self.shape;
        assert_eq!(q.len(), sh.batch * new * heads * sh.head_dim, "queries do not match the cache's shape");
        assert_eq!(positions.pad.len(), sh.batch, "one padding width per row");
        let queries = NewQueries { heads, positions, start, new };
        let isa = Isa::current();
        match &self.buffers {
            TypedBuffers::F32(st) => attend(st, sh, q, &queries, isa, &mut self.scores),
            TypedBuffers::F16(st) => attend(st, sh, q, &queries, isa, &mut self.scores),
        }
    }
}

fn write<T: Elem>(st: &mut KvBuffers<T>, sh: Shape, k: &[f32], v: &[f32], start: usize, new: usize) {
    let (kvh, hd, cap) = (sh.kv_heads, sh.head_dim, sh.capacity);
    let mut key = vec![T::default(); hd];
    for b in 0..sh.batch {
        for i in 0..new {
            for g in 0..kvh {
                let src = ((b * new + i) * kvh + g) * hd;
                let block = b * kvh + g;
                let at = (block * cap + start + i) * hd;
                T::narrow_slice(&v[src..src + hd], &mut st.values[at..at + hd]);
                // Keys are stored transposed: one column of the block's `[head_dim, capacity]`.
                T::narrow_slice(&k[src..src + hd], &mut key);
                for (d, &kd) in key.iter().enumerate() {
                    st.keys[(block * hd + d) * cap + start + i] = kd;
                }
            }
        }
    }
}

/// The queries of one forward pass: `new` columns from `start`, `heads` per column, laid out by `positions`.
struct NewQueries<'a> {
    heads: usize,
    positions: &'a Positions,
    start: usize,
    new: usize,
}

/// Every query of `queries` (`q`, `[batch, new, heads, head_dim]`) over the keys and values of
/// `st`, with `isa`'s kernels (on every thread it spreads over); returns `[batch, new, heads ·
/// head_dim]`.
fn attend<T: Elem>(
    st: &KvBuffers<T>,
    sh: Shape,
    q: &[f32],
    queries: &NewQueries,
    isa: Isa,
    scores: &mut Vec<f32>,
) -> Vec<f32> {
    let (kvh, hd, cap) = (sh.kv_heads, sh.head_dim, sh.capacity);
    let (heads, new) = (queries.heads, queries.new);
    let rep = heads / kvh;
    let scale = 1.0 / (hd as f32).sqrt();
    let mut out = vec![0.0f32; q.len()];
    // Query head `h` of column `i` of row `b`, at `at` in `q` and `out`.
    let job = |b: usize, i: usize, h: usize, at: usize| {
        let block = b * kvh + h / rep;
        let visible = queries.positions.visible(b, queries.start + i);
        Query {
            q: &q[at..at + hd],
            keys: &st.keys[block * hd * cap..(block + 1) * hd * cap],
            kstride: cap,
            values: &st.values[block * cap * hd..(block + 1) * cap * hd],
            lo: visible.start,
            hi: visible.end,
            scale,
        }
    };
    // Multiply-adds, at most: q·k and P·V over every key written so far, for every query.
    let macs = (sh.batch * new * heads).saturating_mul(2 * hd * (queries.start + new));
    // The query heads of key/value head `g` at column `i` of row `b`: `out[at..at + rep · hd]`.
    let group = |b: usize, i: usize, g: usize| -> (Vec<Query<'_, T>>, usize) {
        let at = ((b * new + i) * heads + g * rep) * hd;
        ((0..rep).map(|r| job(b, i, g * rep + r, at + r * hd)).collect(), at)
    };
    if spreads(macs) {
        // One task per (row, column, key/value head); `out` is `[batch · new, kv_heads, rep ·
        // head_dim]`.
        out.par_chunks_mut((rep * hd).max(1)).enumerate().for_each_init(Vec::new, |scores, (task, o)| {
            let (g, column) = (task % kvh, task / kvh);
            attend_group(&group(column / new, column % new, g).0, isa, scores, o);
        });
        return out;
    }
    // On this thread, a key/value head's queries one after another while its keys are hot.
    for b in 0..sh.batch {
        for g in 0..kvh {
            for i in 0..new {
                let (jobs, at) = group(b, i, g);
                attend_group(&jobs, isa, scores, &mut out[at..at + rep * hd]);
            }
        }
    }
    out
}

/// One query and the keys and values it attends over.
struct Query<'a, T> {
    /// `[head_dim]`.
    q: &'a [f32],
    /// `[head_dim, ≥ hi]` with row stride `kstride`.
    keys: &'a [T],
    kstride: usize,
    /// `[≥ hi, head_dim]`.
    values: &'a [T],
    /// Visible columns `lo..hi`.
    lo: usize,
    hi: usize,
    /// 1/√head_dim.
    scale: f32,
}

/// Computes one query's attention output into `out` (`[head_dim]`) with `isa`'s kernels (which
/// the CPU must run), rounding probabilities and output to f16 when the keys and values are f16.
fn attend_one<T: Elem>(job: &Query<T>, isa: Isa, scores: &mut Vec<f32>, out: &mut [f32]) {
    match isa {
        // SAFETY: the CPU runs AVX-512 (the caller's promise).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { attend_one_avx512(job, scores, out) },
        // SAFETY: the CPU runs AVX2 (the caller's promise).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { attend_one_avx2(job, scores, out) },
        _ => attend_one_impl::<PORTABLE, T>(job, scores, out),
    }
}

/// The builds of [`attend_one_impl`], by the dot products they use ([`dots`]): the portable
/// lanes ([`portable::dots`]), or the AVX2 or AVX-512 kernels.
const PORTABLE: u8 = Isa::Portable as u8;
const AVX2: u8 = Isa::Avx2 as u8;
const AVX512: u8 = Isa::Avx512 as u8;

/// [`attend_one_impl`] with its dot products in AVX2 intrinsics and the rest compiled for AVX2.
/// Same operations in the same order, same results as the portable build.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn attend_one_avx2<T: Elem>(job: &Query<T>, scores: &mut Vec<f32>, out: &mut [f32]) {
    attend_one_impl::<AVX2, T>(job, scores, out);
}

/// [`attend_one_impl`] with its dot products 16 lanes at a time (or 64, four blocks of 16) in
/// AVX-512 intrinsics, the last lanes in a masked block, and the rest compiled for AVX-512.
/// Same operations in the same order, same results as the portable build.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
unsafe fn attend_one_avx512<T: Elem>(job: &Query<T>, scores: &mut Vec<f32>, out: &mut [f32]) {
    attend_one_impl::<AVX512, T>(job, scores, out);
}

#[inline(always)]
fn attend_one_impl<const ISA: u8, T: Elem>(job: &Query<T>, scores: &mut Vec<f32>, out: &mut [f32]) {
    let hd = job.q.len();
    let n = job.hi - job.lo;
    scores.clear();
    scores.resize(n, 0.0);
    let s = &mut scores[..];
    // scores[j] = Σ_d q[d] · k[d, j], key j in lane j.
    dots::<ISA, T>(job.q, &job.keys[job.lo..], job.kstride, s);
    softmax::<T>(s, job.scale);
    // out[d] = Σ_j w[j] · v[j, d], dimension d in lane d.
    dots::<ISA, T>(s, &job.values[job.lo * hd..job.hi * hd], hd, out);
    if T::F16 {
        out.iter_mut().for_each(|o| *o = round_to_f16(*o));
    }
}

/// One query's scores (`s`, q·k per visible key) turned into its probabilities in place: scaled
/// by `scale`, softmax, rounded to f16 when the keys and values are f16 (the cast in front of the
/// P·V matmul).
#[inline(always)]
fn softmax<T: Elem>(s: &mut [f32], scale: f32) {
    // The loops below are branch-free (`exp` and `round_to_f16` included), so the compiler
    // vectorises them at the build's width; each element's operations are the same at any width.
    let max = lanes_max(s) * scale;
    for sj in s.iter_mut() {
        *sj = exp(*sj * scale - max);
    }
    let inv_sum = 1.0 / lanes_sum(s);
    if T::F16 {
        s.iter_mut().for_each(|w| *w = round_to_f16(*w * inv_sum));
    } else {
        s.iter_mut().for_each(|w| *w *= inv_sum);
    }
}

/// Query heads the SIMD builds attend at once ([`attend_group`]): three share each load (and
/// f16 widening) of a key or value, across 24 accumulators of the 32 vector registers in AVX-512,
/// 12 of the 16 in AVX2.
const GROUP_AT_ONCE: usize = 3;

/// [`attend_one`] for several queries that see the same keys and values (the query heads of one
/// key/value head at one position: same keys, values and visible columns), into `out`
/// (`[jobs.len(), head_dim]`), with `isa`'s kernels (which the CPU must run), bit for bit what
/// [`attend_one`] gives each at any ISA. The AVX-512 and AVX2
/// builds run up to [`GROUP_AT_ONCE`] of them through each pass over the keys and values, so
/// each vector of keys or values is loaded and widened once for all of them (grouped-query
/// attention reads a key/value head once per group, as its kernels do on GPUs).
fn attend_group<T: Elem>(jobs: &[Query<T>], isa: Isa, scores: &mut Vec<f32>, out: &mut [f32]) {
    let hd = jobs.first().map_or(1, |j| j.q.len()).max(1);
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Portable && jobs.first().is_some_and(|j| j.hi > j.lo) {
        let avx512 = isa == Isa::Avx512;
        for (group, o) in jobs.chunks(GROUP_AT_ONCE).zip(out.chunks_mut(GROUP_AT_ONCE * hd)) {
            // SAFETY: the CPU runs `isa`, AVX2 or AVX-512 (the caller's promise); the jobs of a
            // group share keys, values and visible columns (the caller's promise, asserted in
            // `attend_many_impl`).
            unsafe {
                match (group.len(), avx512) {
                    (1, true) => attend_one_avx512(&group[0], scores, o),
                    (2, true) => attend_many_avx512::<2, T>(group, scores, o),
                    (_, true) => attend_many_avx512::<3, T>(group, scores, o),
                    (1, false) => attend_one_avx2(&group[0], scores, o),
                    (2, false) => attend_many_avx2::<2, T>(group, scores, o),
                    (_, false) => attend_many_avx2::<3, T>(group, scores, o),
                }
            }
        }
        return;
    }
    for (job, o) in jobs.iter().zip(out.chunks_mut(hd)) {
        attend_one(job, isa, scores, o);
    }
}

/// [`attend_many_impl`] compiled for AVX-512.
///
/// # Safety
/// The CPU has AVX-512F, BW and VL, AVX2 and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
unsafe fn attend_many_avx512<const R: usize, T: Elem>(jobs: &[Query<T>], scores: &mut Vec<f32>, out: &mut [f32]) {
    // SAFETY: the caller's contract.
    unsafe { attend_many_impl::<AVX512, R, T>(jobs, scores, out) }
}

/// [`attend_many_impl`] compiled for AVX2.
///
/// # Safety
/// The CPU has AVX2 and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn attend_many_avx2<const R: usize, T: Elem>(jobs: &[Query<T>], scores: &mut Vec<f32>, out: &mut [f32]) {
    // SAFETY: the caller's contract.
    unsafe { attend_many_impl::<AVX2, R, T>(jobs, scores, out) }
}

/// `R` queries over the same keys and values: [`attend_one_impl`]'s `ISA` build for each, with
/// the dot products of all `R` in one pass ([`avx512::dots_many`] or [`avx2::dots_many`]).
///
/// # Safety
/// The CPU has AVX-512F, BW and VL if `ISA` is [`AVX512`], AVX2 and F16C if it is [`AVX2`].
///
/// # Panics
/// If `jobs` is not `R` queries of one width over the same keys, values and visible columns, or
/// `out` not `R` times that width.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn attend_many_impl<const ISA: u8, const R: usize, T: Elem>(
    jobs: &[Query<T>],
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let job = &jobs[0];
    let (hd, n) = (job.q.len(), job.hi - job.lo);
    assert!(
        jobs.len() == R
            && out.len() == R * hd
            && jobs.iter().all(|j| {
                j.q.len() == hd
                    && std::ptr::eq(j.keys, job.keys)
                    && std::ptr::eq(j.values, job.values)
                    && (j.kstride, j.lo, j.hi, j.scale.to_bits()) == (job.kstride, job.lo, job.hi, job.scale.to_bits())
            }),
        "a group's queries share their keys and values"
    );
    scores.clear();
    scores.resize(R * n, 0.0);
    let mut qs = [job.q; R];
    for (q, j) in qs.iter_mut().zip(jobs) {
        *q = j.q;
    }
    let keys = &job.keys[job.lo..];
    match ISA {
        // SAFETY: with `ISA` = AVX512 the caller promises AVX-512F, BW and VL; `dots_many`
        // asserts that `keys` holds `n` lanes of every query element's row and `scores` `R · n`.
        AVX512 => unsafe { avx512::dots_many::<R, T>(&qs, keys, job.kstride, scores, n) },
        // SAFETY: the other build is `AVX2` (`attend_many_avx2`, the only other caller), for
        // which the caller promises AVX2 and F16C; `dots_many` asserts the operands' sizes.
        _ => unsafe { avx2::dots_many::<R, T>(&qs, keys, job.kstride, scores, n) },
    }
    for s in scores.chunks_exact_mut(n) {
        softmax::<T>(s, job.scale);
    }
    let mut ws = [&scores[..0]; R];
    for (r, w) in ws.iter_mut().enumerate() {
        *w = &scores[r * n..(r + 1) * n];
    }
    let values = &job.values[job.lo * hd..job.hi * hd];
    match ISA {
        // SAFETY: AVX-512F, BW and VL as for the scores above; `dots_many` asserts that `values`
        // holds `hd` lanes of each of the `n` weights' rows and `out` `R · hd`.
        AVX512 => unsafe { avx512::dots_many::<R, T>(&ws, values, hd, out, hd) },
        // SAFETY: AVX2 and F16C as for the scores above; `dots_many` asserts the operands' sizes.
        _ => unsafe { avx2::dots_many::<R, T>(&ws, values, hd, out, hd) },
    }
    if T::F16 {
        out.iter_mut().for_each(|o| *o = round_to_f16(*o));
    }
}

/// `out[l] = Σ_i x[i] · m[i · stride + l]` for every lane `l`, each lane the operations of
/// [`portable::dot1`], by the kernels of `ISA`: [`avx512::dots`] (64 lanes at a time, then the
/// rest in one pass, the last block of 16 masked), [`avx2::dots_many`] (16 lanes at a time, then
/// 8, then one by one) or [`portable::dots`].
#[inline(always)]
fn dots<const ISA: u8, T: Elem>(x: &[f32], m: &[T], stride: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if ISA == AVX512 {
        // SAFETY: `attend_one_avx512`, the only caller of this build, runs on CPUs with AVX-512F,
        // BW and VL; the operands' sizes are checked inside.
        unsafe { avx512::dots(x, m, stride, out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if ISA == AVX2 {
        // SAFETY: `attend_one_avx2`, the only caller of this build, runs on CPUs with AVX2 and
        // F16C; the operands' sizes are checked inside.
        unsafe { avx2::dots_many::<1, T>(&[x], m, stride, out, out.len()) };
        return;
    }
    portable::dots(x, m, stride, out);
}

/// Sum of `v` over 8 interleaved lanes (element `j` in lane `j % 8`), the lanes then added in a
/// fixed tree: the same order whatever the SIMD width.
#[inline(always)]
fn lanes_sum(v: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut chunks = v.chunks_exact(8);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += x;
        }
    }
    for (a, &x) in acc.iter_mut().zip(chunks.remainder()) {
        *a += x;
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

/// Largest element of `v` (−∞ for an empty slice); exact in any order.
#[inline(always)]
fn lanes_max(v: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 8];
    let mut chunks = v.chunks_exact(8);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = if x > *a { x } else { *a };
        }
    }
    for (a, &x) in acc.iter_mut().zip(chunks.remainder()) {
        *a = if x > *a { x } else { *a };
    }
    acc.into_iter().fold(f32::NEG_INFINITY, |m, x| if x > m { x } else { m })
}

/// `e^x` in f32, branch-free so that loops over it vectorise: Cody–Waite reduction
/// `x = n·ln 2 + r`, |r| ≤ ln 2 / 2, and the degree-7 minimax polynomial of the Cephes library's
/// `expf.c` (S. L. Moshier), whose error is within 2 ulp; results below `e^-87.33` (the smallest
/// normal f32) are flushed to 0. `exp(0) == 1` exactly. NaN in, NaN out.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // 1.5 · 2²³: adding it rounds to an integer (ties to even) held in the low mantissa bits.
    const MAGIC: f32 = 12_582_912.0;
    // ln 2, high part (9 significant bits: n · C1 is exact), written as its exact binary value.
    #[allow(clippy::excessive_precision)]
    const C1: f32 = 0.693_359_375;
    const C2: f32 = -2.121_944_4e-4; // ln 2 − C1
    const LO: f32 = -87.336_55; // ln(2⁻¹²⁶)
    const HI: f32 = 88.376_26; // just below ln(f32::MAX)
    let xc = x.clamp(LO, HI);
    let t = xc * LOG2E + MAGIC;
    let n = t - MAGIC;
    let r = (xc - n * C1) - n * C2;
    let z = r * r;
    let p = ((((1.987_569_2e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r + 1.666_666_5e-1)
        * r
        + 0.5; // Cephes writes 5.0000001e-1, which is 0.5 in f32
    let y = (p * z + r) + 1.0;
    // 2ⁿ from the integer in t's mantissa: t's bits are 0x4B40_0000 + n for |n| < 2²².
    let pow2 = f32::from_bits(t.to_bits().wrapping_sub(0x4B40_0000 - 127) << 23);
    let e = y * pow2;
    if x < LO {
        0.0
    } else if x.is_nan() {
        x
    } else {
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_two_ulp_of_f64_exp() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = f64::from(x).exp();
            let got = f64::from(exp(x));
            let ulp = f64::from(f32::EPSILON) * 2f64.powi(want.log2().floor() as i32);
            worst = worst.max((got - want).abs() / ulp);
            x += 0.000_37;
        }
        assert!(worst <= 2.0, "worst error {worst} ulp");
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-88.0), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert!(exp(f32::NAN).is_nan());
    }

    /// The plain definition, in f64: softmax(q·kᵀ/√d) over the visible keys, then the weighted
    /// sum of the values.
    fn naive(q: &[f32], keys: &[Vec<f32>], values: &[Vec<f32>]) -> Vec<f64> {
        let scale = 1.0 / (q.len() as f64).sqrt();
        let s: Vec<f64> = keys
            .iter()
            .map(|k| k.iter().zip(q).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum::<f64>() * scale)
            .collect();
        let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = e.iter().sum();
        (0..q.len()).map(|d| e.iter().zip(values).map(|(w, v)| w / z * f64::from(v[d])).sum()).collect()
    }

    fn values(seed: u64, n: usize, amplitude: f32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * amplitude
            })
            .collect()
    }

    /// A cache of 2 rows (the second left-padded by 3) × 2 kv heads × 19 columns, 4 query heads
    /// of width 8, filled in two chunks (16 columns, then 3), against [`naive`].
    #[test]
    fn matches_the_definition_with_padding_and_grouped_heads() {
        for precision in [Precision::F32, Precision::F16] {
            let (b, kvh, h, hd, cols) = (2, 2, 4, 8, 19);
            let quantise = |v: Vec<f32>| match precision {
                Precision::F32 => v,
                Precision::F16 => v.into_iter().map(round_to_f16).collect(),
            };
            let k = quantise(values(1, b * cols * kvh * hd, 3.0));
            let v = quantise(values(2, b * cols * kvh * hd, 1.0));
            let q = quantise(values(3, b * cols * h * hd, 3.0));
            let pad = [0, 3];
            let positions = Positions { pad: pad.to_vec() };
            let mut kv = HostKv::new(b, kvh, cols, hd, precision);
            let mut got = vec![0.0; b * cols * h * hd];
            for (start, new) in [(0, 16), (16, 3)] {
                let rows = |x: &[f32], heads: usize| -> Vec<f32> {
                    (0..b)
                        .flat_map(|r| {
                            x[(r * cols + start) * heads * hd..(r * cols + start + new) * heads * hd].to_vec()
                        })
                        .collect()
                };
                kv.write(&rows(&k, kvh), &rows(&v, kvh), start, new);
                let out = kv.attend(&rows(&q, h), h, &positions, start, new);
                for r in 0..b {
                    let dst = (r * cols + start) * h * hd;
                    got[dst..dst + new * h * hd].copy_from_slice(&out[r * new * h * hd..(r + 1) * new * h * hd]);
                }
            }
            let tol = if precision == Precision::F32 { 2e-6 } else { 2e-3 };
            for r in 0..b {
                for c in pad[r]..cols {
                    for head in 0..h {
                        let g = head / (h / kvh);
                        let at = |x: &[f32], col: usize, heads: usize, hh: usize| {
                            x[((r * cols + col) * heads + hh) * hd..][..hd].to_vec()
                        };
                        let keys: Vec<_> = (pad[r]..=c).map(|j| at(&k, j, kvh, g)).collect();
                        let vals: Vec<_> = (pad[r]..=c).map(|j| at(&v, j, kvh, g)).collect();
                        let want = naive(&at(&q, c, h, head), &keys, &vals);
                        let got = at(&got, c, h, head);
                        for (g, w) in got.iter().zip(&want) {
                            assert!(
                                (f64::from(*g) - w).abs() <= tol,
                                "{precision:?} row {r} col {c} head {head}: {g} vs {w}"
                            );
                            if precision == Precision::F16 {
                                assert_eq!(round_to_f16(*g), *g, "output is an f16 value");
                            }
                        }
                    }
                }
            }
        }
    }

    /// At every ISA the CPU runs (forced, so that `HostKv::attend` dispatches to it).
    #[test]
    fn spreading_queries_over_threads_changes_no_bit() {
        use crate::host::threads::single_threaded;
        // 2 rows (the second left-padded by 5), 6 query heads over 2 kv heads of width 24 (no
        // multiple of 8: the tails run too), a prompt of 120 columns, then 30 decoding steps.
        let (b, kvh, h, hd, cols, prompt) = (2, 2, 6, 24, 150, 120);
        let positions = Positions { pad: vec![0, 5] };
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        if rayon::current_num_threads() > 1 {
            assert!(spreads(b * h * 2 * hd * (prompt + 1)), "the test's calls are big enough to spread");
        }
        let isas = Isa::runnable_reporting_skips("spreading_queries_over_threads_changes_no_bit");
        for (isa, precision) in isas.into_iter().flat_map(|isa| [(isa, Precision::F32), (isa, Precision::F16)]) {
            let run = |spread: bool| {
                let mut kv = HostKv::new(b, kvh, cols, hd, precision);
                let mut outs = Vec::new();
                let mut start = 0;
                for new in std::iter::once(prompt).chain(std::iter::repeat_n(1, cols - prompt)) {
                    let seed = start as u64;
                    let round = |v: Vec<f32>| match precision {
                        Precision::F32 => v,
                        Precision::F16 => v.into_iter().map(round_to_f16).collect(),
                    };
                    let k = round(values(3 * seed + 1, b * new * kvh * hd, 3.0));
                    let v = round(values(3 * seed + 2, b * new * kvh * hd, 1.0));
                    let q = round(values(3 * seed + 3, b * new * h * hd, 3.0));
                    kv.write(&k, &v, start, new);
                    let mut call = || isa.forced(|| kv.attend(&q, h, &positions, start, new)).expect("runnable");
                    outs.push(bits(&if spread { call() } else { single_threaded(call) }));
                    start += new;
                }
                outs
            };
            assert_eq!(run(true), run(false), "{isa} {precision:?}");
        }
    }

    /// Query heads attended as a group (shared keys and values; up to three at once in the
    /// AVX-512 and AVX2 builds) give each head's [`attend_one`] result bit for bit, at every ISA
    /// the CPU runs, for group sizes that leave every remainder of three, over key counts and head
    /// widths that take each block and masked path.
    #[test]
    fn grouped_heads_are_each_heads_own_attention_bit_for_bit() {
        fn check<T: Elem>(isa: Isa, rep: usize, hd: usize, n: usize) {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let stored = |x: &f32| T::narrow(if T::F16 { f16::from_f32(*x).to_f32() } else { *x });
            let keys: Vec<T> = values(5, hd * n, 4.0).iter().map(stored).collect();
            let vals: Vec<T> = values(6, n * hd, 1.0).iter().map(stored).collect();
            let q = values(4, rep * hd, 4.0);
            for lo in [0, 1, n / 2, n - 1] {
                let jobs: Vec<Query<T>> = (0..rep)
                    .map(|r| Query {
                        q: &q[r * hd..(r + 1) * hd],
                        keys: &keys,
                        kstride: n,
                        values: &vals,
                        lo,
                        hi: n,
                        scale: 0.3,
                    })
                    .collect();
                let mut want = vec![0.0; rep * hd];
                for (job, o) in jobs.iter().zip(want.chunks_mut(hd)) {
                    attend_one(job, isa, &mut Vec::new(), o);
                }
                let mut got = vec![0.0; rep * hd];
                attend_group(&jobs, isa, &mut Vec::new(), &mut got);
                assert_eq!(bits(&got), bits(&want), "{isa} f16 {} heads {rep} head_dim {hd} keys {lo}..{n}", T::F16);
            }
        }
        for isa in Isa::runnable_reporting_skips("grouped_heads_are_each_heads_own_attention_bit_for_bit") {
            for rep in 1..=7 {
                for (hd, n) in
                    [(64, 1070), (64, 33), (16, 203), (12, 3), (40, 47), (48, 129), (7, 16), (1, 2), (96, 80)]
                {
                    check::<f32>(isa, rep, hd, n);
                    check::<f16>(isa, rep, hd, n);
                }
            }
        }
    }

    /// Every build the CPU can run ([`Isa::runnable_reporting_skips`]; the others are reported as
    /// skipped) and the dispatched one ([`Isa::current`]) against the portable one, on f32 and
    /// f16, with key counts and head widths that take each of the AVX-512 build's paths (blocks
    /// of 64, then 0 to 3 full blocks of 16 and a masked one) and the AVX2 build's 8- and 1-lane
    /// remainders, over head widths that leave partial groups of four.
    #[test]
    fn portable_avx2_and_avx512_kernels_agree_bit_for_bit() {
        let mut isas: Vec<(String, Isa)> =
            Isa::runnable_reporting_skips("portable_avx2_and_avx512_kernels_agree_bit_for_bit")
                .into_iter()
                .map(|isa| (isa.to_string(), isa))
                .collect();
        isas.push(("dispatched".to_string(), Isa::current()));
        fn check<T: Elem>(isas: &[(String, Isa)], hd: usize, n: usize, q: &[f32], keys: &[f32], vals: &[f32]) {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let stored = |x: &f32| T::narrow(if T::F16 { f16::from_f32(*x).to_f32() } else { *x });
            let (keys, vals): (Vec<T>, Vec<T>) = (keys.iter().map(stored).collect(), vals.iter().map(stored).collect());
            for lo in [0, 1, n / 2, n - 1] {
                let job = Query { q, keys: &keys, kstride: n, values: &vals, lo, hi: n, scale: 0.25 };
                let mut want = vec![0.0; hd];
                attend_one_impl::<PORTABLE, T>(&job, &mut Vec::new(), &mut want);
                for (name, isa) in isas {
                    let mut got = vec![0.0; hd];
                    attend_one(&job, *isa, &mut Vec::new(), &mut got);
                    assert_eq!(bits(&got), bits(&want), "{name} f16 {} head_dim {hd} keys {lo}..{n}", T::F16);
                }
            }
        }
        // (head_dim, keys), the keys seen from 0, 1, half way and the last.
        let shapes = [
            (16, 203),
            (8, 8),
            (12, 3),
            (64, 1070),
            (64, 47),
            (27, 61),
            (40, 33),
            (7, 16),
            (1, 2),
            (5, 17),
            (32, 49),
            (48, 129),
            (50, 65),
            (96, 80),
            (130, 7),
        ];
        for (hd, n) in shapes {
            let q = values(4, hd, 4.0);
            let keys = values(5, hd * n, 4.0);
            let vals = values(6, n * hd, 1.0);
            check::<f32>(&isas, hd, n, &q, &keys, &vals);
            check::<f16>(&isas, hd, n, &q, &keys, &vals);
        }
    }
}
