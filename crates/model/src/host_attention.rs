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
//! bit-identical results; which one runs is chosen at run time from the CPU's features.
//!
//! Grouped-query attention: the query heads that share a key/value head see the same keys and
//! values at a position, so the AVX-512 and AVX2 builds attend up to three of them in each pass
//! over the keys and values (each vector loaded and widened once for all three); each head's
//! operations are unchanged, so are its bits.
//!
//! Threads: where the linear layers fork-join (one batch at a time, `host_linear::spreads`), a
//! call big enough spreads its queries, one (row, column, key/value head) each, over rayon's
//! threads; each is computed by the same operations whichever thread runs it, so the results do
//! not change.

use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use crate::Positions;
use crate::host_linear::spreads;

/// The dtype the model computes in, as far as attention's roundings are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Precision {
    /// Nothing is rounded below f32.
    F32,
    /// Keys and values are stored as f16; probabilities and outputs are rounded to f16.
    F16,
}

/// An element type keys and values are stored in: f32, or f16 (widened exactly to f32 as it is
/// read, with `vcvtph2ps` in the AVX2 and AVX-512 builds).
pub(crate) trait Elem: Copy + Default + std::fmt::Debug + Send + Sync {
    /// Whether this is f16.
    const F16: bool;
    /// The value, exactly, as f32.
    fn widen(self) -> f32;
    /// `v` in this type; `v` must be representable.
    fn narrow(v: f32) -> Self;
    /// [`Elem::narrow`] of every value of `src` into `dst` (of the same length).
    fn narrow_slice(src: &[f32], dst: &mut [Self]) {
        for (d, &v) in dst.iter_mut().zip(src) {
            *d = Self::narrow(v);
        }
    }
}

impl Elem for f32 {
    const F16: bool = false;
    fn widen(self) -> f32 {
        self
    }
    fn narrow(v: f32) -> Self {
        v
    }
}

impl Elem for f16 {
    const F16: bool = true;
    fn widen(self) -> f32 {
        self.to_f32()
    }
    fn narrow(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn narrow_slice(src: &[f32], dst: &mut [Self]) {
        // F16C, 8 at a time where the CPU has it: the same rounding as `f16::from_f32`.
        dst.convert_from_f32_slice(src);
    }
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
        match &self.buffers {
            TypedBuffers::F32(st) => attend(st, sh, q, &queries, &mut self.scores),
            TypedBuffers::F16(st) => attend(st, sh, q, &queries, &mut self.scores),
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

fn attend<T: Elem>(st: &KvBuffers<T>, sh: Shape, q: &[f32], queries: &NewQueries, scores: &mut Vec<f32>) -> Vec<f32> {
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
            attend_group(&group(column / new, column % new, g).0, scores, o);
        });
        return out;
    }
    // On this thread, a key/value head's queries one after another while its keys are hot.
    for b in 0..sh.batch {
        for g in 0..kvh {
            for i in 0..new {
                let (jobs, at) = group(b, i, g);
                attend_group(&jobs, scores, &mut out[at..at + rep * hd]);
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

/// Computes one query's attention output into `out` (`[head_dim]`), rounding probabilities and
/// output to f16 when the keys and values are f16.
fn attend_one<T: Elem>(job: &Query<T>, scores: &mut Vec<f32>, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        if has_avx512() {
            // SAFETY: the CPU supports AVX-512F, BW and VL, AVX2 and F16C, checked just above.
            unsafe { attend_one_avx512(job, scores, out) };
        } else {
            // SAFETY: the CPU supports AVX2 and F16C, checked just above.
            unsafe { attend_one_avx2(job, scores, out) };
        }
        return;
    }
    attend_one_impl::<PORTABLE, T>(job, scores, out);
}

/// Whether the CPU runs [`attend_one_avx2`]: AVX2 and F16C.
#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("f16c")
}

/// Whether the CPU runs [`attend_one_avx512`] (given [`has_avx2`]): AVX-512F, BW (the masked
/// 16-bit loads) and VL.
#[cfg(target_arch = "x86_64")]
fn has_avx512() -> bool {
    std::is_x86_feature_detected!("avx512f")
        && std::is_x86_feature_detected!("avx512bw")
        && std::is_x86_feature_detected!("avx512vl")
}

/// The builds of [`attend_one_impl`], by the dot products they use: [`dot1`] lanes only,
/// [`dots_many_avx2`] in AVX2, or [`dot16`] in AVX-512.
const PORTABLE: u8 = 0;
const AVX2: u8 = 1;
const AVX512: u8 = 2;

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
/// (`[jobs.len(), head_dim]`), bit for bit what [`attend_one`] gives each. The AVX-512 and AVX2
/// builds run up to [`GROUP_AT_ONCE`] of them through each pass over the keys and values, so
/// each vector of keys or values is loaded and widened once for all of them (grouped-query
/// attention reads a key/value head once per group, as its kernels do on GPUs).
fn attend_group<T: Elem>(jobs: &[Query<T>], scores: &mut Vec<f32>, out: &mut [f32]) {
    let hd = jobs.first().map_or(1, |j| j.q.len()).max(1);
    #[cfg(target_arch = "x86_64")]
    if has_avx2() && jobs.first().is_some_and(|j| j.hi > j.lo) {
        let avx512 = has_avx512();
        for (group, o) in jobs.chunks(GROUP_AT_ONCE).zip(out.chunks_mut(GROUP_AT_ONCE * hd)) {
            // SAFETY: the CPU supports AVX2 and F16C, and AVX-512F, BW and VL where `avx512`,
            // checked just above; the jobs of a group share keys, values and visible columns
            // (the caller's promise, asserted in `attend_many_impl`).
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
        attend_one(job, scores, o);
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
/// the dot products of all `R` in one pass ([`dots_many`] in AVX-512, [`dots_many_avx2`] in
/// AVX2).
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
    // SAFETY (every call): the caller's contract; the operands' sizes are checked inside.
    let keys = &job.keys[job.lo..];
    match ISA {
        AVX512 => unsafe { dots_many::<R, T>(&qs, keys, job.kstride, scores, n) },
        _ => unsafe { dots_many_avx2::<R, T>(&qs, keys, job.kstride, scores, n) },
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
        AVX512 => unsafe { dots_many::<R, T>(&ws, values, hd, out, hd) },
        _ => unsafe { dots_many_avx2::<R, T>(&ws, values, hd, out, hd) },
    }
    if T::F16 {
        out.iter_mut().for_each(|o| *o = round_to_f16(*o));
    }
}

/// Runs `$step!(i, p)` for `i = 0, 1, …, $len − 1` in order, with `p = i mod 4` a literal (so
/// that the step's accumulators of partial sum `p` are named by constants and stay in
/// registers): the loop of the `R`-vector kernels ([`dot8_rows_many`], [`dot16_rows_many`]).
#[cfg(target_arch = "x86_64")]
macro_rules! each_partial_sum {
    ($len:expr, $step:ident) => {{
        let len: usize = $len;
        let quads = len / 4;
        for q in 0..quads {
            let i = 4 * q;
            $step!(i, 0);
            $step!(i + 1, 1);
            $step!(i + 2, 2);
            $step!(i + 3, 3);
        }
        let (i, rest) = (4 * quads, len % 4);
        if rest > 0 {
            $step!(i, 0);
        }
        if rest > 1 {
            $step!(i + 1, 1);
        }
        if rest > 2 {
            $step!(i + 2, 2);
        }
    }};
}

/// Checks the operands of [`dots_many`] and [`dots_many_avx2`] (`R` vectors of one length `len`,
/// `out` of `R · lanes` values, `m` at least `(len − 1) · stride + lanes` long); with empty
/// vectors every sum is 0: `out` is zeroed and the answer is false (nothing left to compute).
///
/// # Panics
/// If an operand's size is wrong.
#[cfg(target_arch = "x86_64")]
fn dots_many_operands<const R: usize, T>(
    xs: &[&[f32]; R],
    m: &[T],
    stride: usize,
    out: &mut [f32],
    lanes: usize,
) -> bool {
    let len = xs[0].len();
    assert!(xs.iter().all(|x| x.len() == len) && out.len() == R * lanes, "dots_many operands");
    let Some(last) = len.checked_sub(1) else {
        out.fill(0.0);
        return false;
    };
    assert!(m.len() >= last * stride + lanes, "dots_many reads past its matrix");
    true
}

/// [`dots_many`] in AVX2: `out[r · lanes + l] = Σ_i xs[r][i] · m[i · stride + l]`, each lane the
/// operations of [`dot1`]: one vector in blocks of 16 lanes (eight chains of additions, where
/// four leave the adder's latency exposed), several in blocks of 8 (`4 · R` chains, within the 16
/// vector registers), then a block of 8 and the rest (under 8) lane by lane
/// ([`dot8_rows_many`]). A block whose first element starts a 64-byte piece of its row
/// prefetches that row 64 elements on, so each cache line is asked for once: keys are stored
/// transposed, so a pass over them reads a piece of each of `head_dim` rows `capacity` apart,
/// more streams than the hardware prefetcher follows.
///
/// # Safety
/// The CPU has AVX2 and F16C.
///
/// # Panics
/// If the `xs` differ in length, `out` is not `R · lanes` values, or `m` is shorter than
/// `(len − 1) · stride + lanes`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn dots_many_avx2<const R: usize, T: Elem>(
    xs: &[&[f32]; R],
    m: &[T],
    stride: usize,
    out: &mut [f32],
    lanes: usize,
) {
    if !dots_many_operands(xs, m, stride, out, lanes) {
        return;
    }
    let p = m.as_ptr();
    // Vector `r`'s sums of lanes `at..` (`[[f32; 8]; K]` flattened) into its row of `out`.
    let mut write = |at: usize, r: usize, sums: &[f32]| {
        out[r * lanes + at..r * lanes + at + sums.len()].copy_from_slice(sums);
    };
    let prefetch = |at: usize| (at * std::mem::size_of::<T>()).is_multiple_of(64);
    let mut at = 0;
    // Lanes `at..at + 8 · K` of every vector, prefetching where the block starts a 64-byte piece.
    // SAFETY (every block): the caller's contract; rows are read at `i · stride ≤ (len − 1) ·
    // stride`, lanes `at..at + 8 · K ≤ lanes`, in bounds by `dots_many_operands`; a prefetch
    // never faults.
    macro_rules! block {
        ($k:literal) => {
            unsafe {
                if prefetch(at) {
                    dot8_rows_many::<R, $k, true, T>(xs, p.wrapping_add(at), stride)
                } else {
                    dot8_rows_many::<R, $k, false, T>(xs, p.wrapping_add(at), stride)
                }
            }
        };
    }
    if R == 1 {
        while at + 16 <= lanes {
            write(at, 0, block!(2)[0].as_flattened());
            at += 16;
        }
    }
    while at + 8 <= lanes {
        let sums = block!(1);
        for (r, s) in sums.iter().enumerate() {
            write(at, r, s.as_flattened());
        }
        at += 8;
    }
    for l in at..lanes {
        for (r, x) in xs.iter().enumerate() {
            write(l, r, &[dot1(x, &m[l..], stride)]);
        }
    }
}

/// The AVX2 loop of [`dots_many_avx2`]: `K` blocks of 8 lanes for `R` vectors at once. Each
/// row's `8 · K` lanes are loaded (and widened) once and multiplied by every vector's element;
/// partial sum `i mod 4` of vector `r`, block `k` in `acc[r][i mod 4][k]`, added as [`dot1`]
/// adds them. With `PREFETCH`, each row is fetched into L1 64 elements on. `R · K ≤ 3` keeps its
/// `4 · R · K` accumulators in the 16 vector registers (and no closures: a call left out of line
/// would keep them in memory).
///
/// # Safety
/// The CPU has AVX2 and F16C; `8 · K` elements can be read at `m + i · stride` for every `i <
/// xs[0].len()`, and every vector of `xs` has that length.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(unused_assignments)] // the last step moves `row` past what it reads
unsafe fn dot8_rows_many<const R: usize, const K: usize, const PREFETCH: bool, T: Elem>(
    xs: &[&[f32]; R],
    m: *const T,
    stride: usize,
) -> [[[f32; 8]; K]; R] {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch, _mm256_add_ps, _mm256_mul_ps};
    use std::arch::x86_64::{_mm256_set1_ps, _mm256_setzero_ps, _mm256_storeu_ps};
    let len = xs[0].len();
    let mut out = [[[0.0f32; 8]; K]; R];
    // SAFETY: the caller's contract; `xs[r][i]` with `i < len` is in bounds; a prefetch reads
    // nothing architecturally and never faults.
    unsafe {
        let mut acc = [[[_mm256_setzero_ps(); K]; 4]; R];
        let mut row = m;
        // Element `i` (row `i` of `m`) into partial sum `P` (a constant, so that the
        // accumulators stay in registers).
        macro_rules! step {
            ($i:expr, $p:literal) => {{
                if PREFETCH {
                    _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(64).cast::<i8>());
                }
                let mut v = [_mm256_setzero_ps(); K];
                for (k, vk) in v.iter_mut().enumerate() {
                    *vk = load8(row.wrapping_add(8 * k));
                }
                for (a, x) in acc.iter_mut().zip(xs) {
                    let xi = _mm256_set1_ps(*x.get_unchecked($i));
                    for (ak, vk) in a[$p].iter_mut().zip(&v) {
                        *ak = _mm256_add_ps(*ak, _mm256_mul_ps(xi, *vk));
                    }
                }
                row = row.wrapping_add(stride);
            }};
        }
        each_partial_sum!(len, step);
        for (o, a) in out.iter_mut().zip(&acc) {
            for (k, ok) in o.iter_mut().enumerate() {
                let sum = _mm256_add_ps(_mm256_add_ps(a[0][k], a[1][k]), _mm256_add_ps(a[2][k], a[3][k]));
                _mm256_storeu_ps(ok.as_mut_ptr(), sum);
            }
        }
    }
    out
}

/// [`dots`]'s AVX-512 build for `R` vectors `xs` at once over the same matrix: `out[r · lanes + l]
/// = Σ_i xs[r][i] · m[i · stride + l]`, each lane the operations of [`dot1`], in blocks of 32
/// lanes, then the rest (under 32) in one pass, the last block of 16 masked.
///
/// # Safety
/// The CPU has AVX-512F, BW and VL.
///
/// # Panics
/// If the `xs` differ in length, `out` is not `R · lanes` values, or `m` is shorter than
/// `(len − 1) · stride + lanes`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn dots_many<const R: usize, T: Elem>(xs: &[&[f32]; R], m: &[T], stride: usize, out: &mut [f32], lanes: usize) {
    if !dots_many_operands(xs, m, stride, out, lanes) {
        return;
    }
    let write = |out: &mut [f32], at: usize, sums: &[[[f32; 16]; 2]; R], width: usize| {
        for (r, s) in sums.iter().enumerate() {
            out[r * lanes + at..r * lanes + at + width].copy_from_slice(&s.as_flattened()[..width]);
        }
    };
    let full = lanes / 32 * 32;
    let m = m.as_ptr();
    // SAFETY (every call): the caller's contract; block rows are read at `i · stride ≤ last ·
    // stride`, within the block's lanes (masked loads touch no others), in bounds by the assert.
    for at in (0..full).step_by(32) {
        let sums = unsafe { dot16_rows_many::<R, 2, false, true, T>(xs, m.wrapping_add(at), stride, u16::MAX) };
        write(out, at, &sums, 32);
    }
    let rest = lanes - full;
    let mask = |l: usize| (1u16 << l) - 1;
    let (p, at) = (m.wrapping_add(full), full);
    match (rest / 16, rest % 16) {
        (0, 0) => {}
        (0, l) => {
            let sums = unsafe { dot16_rows_many::<R, 1, true, false, T>(xs, p, stride, mask(l)) };
            let padded: [[[f32; 16]; 2]; R] = std::array::from_fn(|r| [sums[r][0], [0.0; 16]]);
            write(out, at, &padded, l);
        }
        (_, 0) => {
            let sums = unsafe { dot16_rows_many::<R, 1, false, false, T>(xs, p, stride, u16::MAX) };
            let padded: [[[f32; 16]; 2]; R] = std::array::from_fn(|r| [sums[r][0], [0.0; 16]]);
            write(out, at, &padded, 16);
        }
        (_, l) => {
            let sums = unsafe { dot16_rows_many::<R, 2, true, false, T>(xs, p, stride, mask(l)) };
            write(out, at, &sums, 16 + l);
        }
    }
}

/// Fetches into L1 this row's `16 · K` lanes four passes on (`64 · K` elements further). Keys
/// are stored transposed, so a pass over them reads a few cache lines from each of `head_dim`
/// rows `capacity` apart: more streams than the hardware prefetcher follows, and in decoding they
/// come from memory (measured: 16 prompts × 800 SmolLM2 tokens decoded in 32.6 s instead of
/// 39.4 s). A prefetch never faults, past the end included.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_ahead<const K: usize, T: Elem>(row: *const T) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    let ahead = row.wrapping_add(4 * 16 * K).cast::<i8>();
    for line in (0..16 * K * std::mem::size_of::<T>()).step_by(64) {
        // SAFETY: a prefetch reads nothing architecturally and never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line)) };
    }
}

/// [`dot16_rows`] for `R` vectors at once: each row of `K` blocks is loaded (and widened) once
/// and multiplied by every vector's element; partial sum `i mod 4` of vector `r`, block `k` in
/// `acc[r][i mod 4][k]`, added as [`dot16_rows`] adds them.
///
/// # Safety
/// As [`dot16_rows`], for every vector of `xs` (all of one length).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn dot16_rows_many<const R: usize, const K: usize, const MASK_LAST: bool, const PREFETCH: bool, T: Elem>(
    xs: &[&[f32]; R],
    m: *const T,
    stride: usize,
    mask: u16,
) -> [[[f32; 16]; K]; R] {
    use std::arch::x86_64::{
        __m512, _mm512_add_ps, _mm512_mul_ps, _mm512_set1_ps, _mm512_setzero_ps, _mm512_storeu_ps,
    };
    let len = xs[0].len();
    let mut out = [[[0.0f32; 16]; K]; R];
    // SAFETY: the caller's contract; `xs[r][i]` with `i < len` is in bounds.
    unsafe {
        let mut acc = [[[_mm512_setzero_ps(); K]; 4]; R];
        // Element `i` (row `i` of `m`) into partial sum `P` (a constant, so that the
        // accumulators stay in registers).
        macro_rules! step {
            ($i:expr, $p:literal) => {{
                let (i, row) = ($i, m.wrapping_add($i * stride));
                if PREFETCH {
                    prefetch_ahead::<K, T>(row);
                }
                let mut v = [_mm512_setzero_ps(); K];
                for (k, vk) in v.iter_mut().enumerate() {
                    let block = row.wrapping_add(16 * k);
                    *vk = if MASK_LAST && k == K - 1 {
                        load16::<true, T>(block, mask)
                    } else {
                        load16::<false, T>(block, 0)
                    };
                }
                for (r, a) in acc.iter_mut().enumerate() {
                    let xi = _mm512_set1_ps(*xs[r].get_unchecked(i));
                    for (ak, vk) in a[$p].iter_mut().zip(&v) {
                        *ak = _mm512_add_ps(*ak, _mm512_mul_ps(xi, *vk));
                    }
                }
            }};
        }
        each_partial_sum!(len, step);
        for (o, a) in out.iter_mut().zip(&acc) {
            for (k, ok) in o.iter_mut().enumerate() {
                let sum: __m512 = _mm512_add_ps(_mm512_add_ps(a[0][k], a[1][k]), _mm512_add_ps(a[2][k], a[3][k]));
                _mm512_storeu_ps(ok.as_mut_ptr(), sum);
            }
        }
    }
    out
}

/// `out[l] = Σ_i x[i] · m[i · stride + l]` for every lane `l`, each lane the operations of
/// [`dot1`]: in the AVX-512 build 64 lanes at a time, then the rest (under 64) in one pass, the
/// last block of 16 masked; otherwise 8 at a time, then one by one.
#[inline(always)]
fn dots<const ISA: u8, T: Elem>(x: &[f32], m: &[T], stride: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if ISA == AVX512 {
        let full = out.len() / 64 * 64;
        let (blocks, o) = out.split_at_mut(full);
        for (c, block) in blocks.chunks_exact_mut(64).enumerate() {
            dot16::<4, false, T>(x, &m[64 * c..], stride, block);
        }
        let m = &m[full..];
        match (o.len() / 16, o.len() % 16 != 0) {
            (0, false) => {}
            (1, false) => dot16::<1, false, T>(x, m, stride, o),
            (2, false) => dot16::<2, false, T>(x, m, stride, o),
            (3, false) => dot16::<3, false, T>(x, m, stride, o),
            (0, true) => dot16::<1, true, T>(x, m, stride, o),
            (1, true) => dot16::<2, true, T>(x, m, stride, o),
            (2, true) => dot16::<3, true, T>(x, m, stride, o),
            _ => dot16::<4, true, T>(x, m, stride, o),
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if ISA == AVX2 {
        // SAFETY: `attend_one_avx2`, the only caller of this build, runs on CPUs with AVX2 and
        // F16C; the operands' sizes are checked inside.
        unsafe { dots_many_avx2::<1, T>(&[x], m, stride, out, out.len()) };
        return;
    }
    for (l, o) in out.iter_mut().enumerate() {
        *o = dot1(x, &m[l..], stride);
    }
}

/// Eight values at `p`, widened to f32 (exactly: `vcvtph2ps` for f16). Shared by the AVX2
/// attention and linear kernels.
///
/// # Safety
/// The CPU has AVX and F16C (the caller is compiled for them), and 8 values are readable at `p`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn load8<T: Elem>(p: *const T) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm256_cvtph_ps, _mm256_loadu_ps};
    // SAFETY: the caller's contract.
    unsafe {
        if T::F16 { _mm256_cvtph_ps(_mm_loadu_si128(p.cast::<__m128i>())) } else { _mm256_loadu_ps(p.cast::<f32>()) }
    }
}

/// [`dot1`] over `out.len()` lanes in AVX-512, as `K` blocks of 16 lanes, the last one masked
/// to the lanes `out` has left if `MASK_LAST`: the same partial sums, added the same way. Several
/// blocks at once (`4 · K` independent chains of additions) hide the adder's latency that four
/// chains alone leave exposed.
///
/// # Panics
/// If `out.len()` is not `16 · K` (or, if `MASK_LAST`, within `16 · (K − 1) + 1 .. 16 · K`), or
/// `m` is shorter than `(x.len() - 1) · stride + out.len()`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn dot16<const K: usize, const MASK_LAST: bool, T: Elem>(x: &[f32], m: &[T], stride: usize, out: &mut [f32]) {
    let lanes = out.len();
    let last_lanes = lanes.wrapping_sub(16 * (K - 1));
    if MASK_LAST {
        assert!((1..16).contains(&last_lanes), "{lanes} lanes are not {K} blocks, the last one partial");
    } else {
        assert_eq!(lanes, 16 * K, "{lanes} lanes are not {K} full blocks");
    }
    let Some(last) = x.len().checked_sub(1) else {
        out.fill(0.0);
        return;
    };
    assert!(m.len() >= last * stride + lanes, "dot16 reads past its matrix");
    let mask = if MASK_LAST { (1u16 << last_lanes) - 1 } else { u16::MAX };
    // SAFETY: only `attend_one_avx512` calls this, on CPUs with AVX-512F, BW and VL; row `i` is
    // read at `i · stride ≤ last · stride`, `lanes` elements (masked loads touch no others), in
    // bounds by the assert.
    let sums = unsafe { dot16_rows::<K, MASK_LAST, T>(x, m.as_ptr(), stride, mask) };
    out.copy_from_slice(&sums.as_flattened()[..lanes]);
}

/// The loop of [`dot16`] (no closures: a call the compiler left out of line would keep the
/// accumulators in memory). Lanes outside `mask` in the last block are read as 0, and their sums
/// are no result (0 · ∞ is NaN).
///
/// # Safety
/// The CPU has AVX-512F, BW and VL; `16 · K` elements (the lanes of `mask` in the last block if
/// `MASK_LAST`) can be read at `m + i · stride` for every `i < x.len()`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn dot16_rows<const K: usize, const MASK_LAST: bool, T: Elem>(
    x: &[f32],
    m: *const T,
    stride: usize,
    mask: u16,
) -> [[f32; 16]; K] {
    use std::arch::x86_64::{__m512, _mm512_add_ps, _mm512_setzero_ps, _mm512_storeu_ps};
    /// `acc[k] += xi · row[16k..16k + 16]`.
    #[inline(always)]
    unsafe fn step<const K: usize, const MASK_LAST: bool, T: Elem>(
        acc: &mut [__m512; K],
        xi: f32,
        row: *const T,
        mask: u16,
    ) {
        use std::arch::x86_64::{_mm512_mul_ps, _mm512_set1_ps};
        // SAFETY: the caller's contract.
        unsafe {
            if !MASK_LAST {
                prefetch_ahead::<K, T>(row);
            }
            let xi = _mm512_set1_ps(xi);
            for (k, a) in acc.iter_mut().enumerate() {
                let block = row.wrapping_add(16 * k);
                let v =
                    if MASK_LAST && k == K - 1 { load16::<true, T>(block, mask) } else { load16::<false, T>(block, 0) };
                *a = _mm512_add_ps(*a, _mm512_mul_ps(xi, v));
            }
        }
    }
    let mut out = [[0.0f32; 16]; K];
    // SAFETY: the caller's contract.
    unsafe {
        // Partial sum `i mod 4` of block `k` in `acc[i mod 4][k]`.
        let mut acc = [[_mm512_setzero_ps(); K]; 4];
        let mut row = m;
        let mut quads = x.chunks_exact(4);
        for q in &mut quads {
            step::<K, MASK_LAST, T>(&mut acc[0], q[0], row, mask);
            step::<K, MASK_LAST, T>(&mut acc[1], q[1], row.wrapping_add(stride), mask);
            step::<K, MASK_LAST, T>(&mut acc[2], q[2], row.wrapping_add(2 * stride), mask);
            step::<K, MASK_LAST, T>(&mut acc[3], q[3], row.wrapping_add(3 * stride), mask);
            row = row.wrapping_add(4 * stride);
        }
        let rest = quads.remainder();
        if let Some(&xi) = rest.first() {
            step::<K, MASK_LAST, T>(&mut acc[0], xi, row, mask);
        }
        if let Some(&xi) = rest.get(1) {
            step::<K, MASK_LAST, T>(&mut acc[1], xi, row.wrapping_add(stride), mask);
        }
        if let Some(&xi) = rest.get(2) {
            step::<K, MASK_LAST, T>(&mut acc[2], xi, row.wrapping_add(2 * stride), mask);
        }
        let [a0, a1, a2, a3] = acc;
        for (k, o) in out.iter_mut().enumerate() {
            let sum = _mm512_add_ps(_mm512_add_ps(a0[k], a1[k]), _mm512_add_ps(a2[k], a3[k]));
            _mm512_storeu_ps(o.as_mut_ptr(), sum);
        }
    }
    out
}

/// 16 elements at `p` widened to f32, all of them, or (if `MASKED`) those of `mask` and 0 for
/// the others.
///
/// # Safety
/// The CPU has AVX-512F (and BW and VL if `MASKED`); those elements can be read.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn load16<const MASKED: bool, T: Elem>(p: *const T, mask: u16) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_maskz_loadu_epi16, _mm512_cvtph_ps};
    use std::arch::x86_64::{_mm512_loadu_ps, _mm512_maskz_loadu_ps};
    // SAFETY: the caller's contract.
    unsafe {
        match (T::F16, MASKED) {
            (true, false) => _mm512_cvtph_ps(_mm256_loadu_si256(p.cast::<__m256i>())),
            (true, true) => _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, p.cast::<i16>())),
            (false, false) => _mm512_loadu_ps(p.cast::<f32>()),
            (false, true) => _mm512_maskz_loadu_ps(mask, p.cast::<f32>()),
        }
    }
}

/// `Σ_i x[i] · m[i · stride]`, the definition every SIMD lane follows: four partial sums over
/// `i mod 4`, each in increasing `i`, added as `(p0 + p1) + (p2 + p3)` (four independent chains
/// keep the adder busy, and the order is the same in every build). The portable build of
/// [`dots`] is one of these per lane.
#[inline(always)]
fn dot1<T: Elem>(x: &[f32], m: &[T], stride: usize) -> f32 {
    let mut acc = [0.0f32; 4];
    for (i, &xi) in x.iter().enumerate() {
        acc[i & 3] += xi * m[i * stride].widen();
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3])
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

/// `x` rounded to the nearest f16 value (ties to even), returned as f32: what
/// `f16::from_f32(x).to_f32()` gives (IEEE 754 binary16), branch-free so that loops vectorise.
#[inline(always)]
pub(crate) fn round_to_f16(x: f32) -> f32 {
    const MIN_NORMAL: f32 = 6.103_515_6e-5; // 2⁻¹⁴
    let a = x.abs();
    let bits = a.to_bits();
    // Normal f16: keep 10 of the 23 significand bits, rounding half to even.
    let normal = f32::from_bits(bits.wrapping_add(0x0FFF + ((bits >> 13) & 1)) & !0x1FFF);
    // Subnormal f16 has spacing 2⁻²⁴, which is f32's spacing at 0.5: adding and removing 0.5
    // rounds to that grid, half to even.
    let subnormal = (a + 0.5) - 0.5;
    let r = if a < MIN_NORMAL { subnormal } else { normal };
    let r = if r > 65504.0 { f32::INFINITY } else { r };
    let r = if a.is_nan() { a } else { r };
    r.copysign(x)
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

    #[test]
    fn f16_rounding_matches_the_half_crate() {
        let specials = [0.0, -0.0, 1.0, 65504.0, 65519.99, 65520.0, 1e9, 5.96e-8, 2.98e-8, 2.99e-8, 6.1e-5, 6.104e-5];
        let strided = (0..u32::MAX / 4099).map(|i| f32::from_bits(i * 4099));
        for x in
            specials.into_iter().flat_map(|x: f32| [x, -x]).chain(strided).chain([f32::INFINITY, f32::NEG_INFINITY])
        {
            let want = f16::from_f32(x).to_f32();
            let got = round_to_f16(x);
            assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "{x:e}: {got:e} vs {want:e}");
        }
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

    #[test]
    fn spreading_queries_over_threads_changes_no_bit() {
        use crate::host_linear::single_threaded;
        // 2 rows (the second left-padded by 5), 6 query heads over 2 kv heads of width 24 (no
        // multiple of 8: the tails run too), a prompt of 120 columns, then 30 decoding steps.
        let (b, kvh, h, hd, cols, prompt) = (2, 2, 6, 24, 150, 120);
        let positions = Positions { pad: vec![0, 5] };
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        if rayon::current_num_threads() > 1 {
            assert!(spreads(b * h * 2 * hd * (prompt + 1)), "the test's calls are big enough to spread");
        }
        for precision in [Precision::F32, Precision::F16] {
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
                    let mut call = || kv.attend(&q, h, &positions, start, new);
                    outs.push(bits(&if spread { call() } else { single_threaded(call) }));
                    start += new;
                }
                outs
            };
            assert_eq!(run(true), run(false), "{precision:?}");
        }
    }

    /// Query heads attended as a group (shared keys and values; up to three at once in the
    /// AVX-512 build) give each head's [`attend_one`] result bit for bit, for group sizes that
    /// leave every remainder of three, over key counts and head widths that take each block and
    /// masked path.
    #[test]
    fn grouped_heads_are_each_heads_own_attention_bit_for_bit() {
        fn check<T: Elem>(rep: usize, hd: usize, n: usize) {
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
                    attend_one(job, &mut Vec::new(), o);
                }
                let mut got = vec![0.0; rep * hd];
                attend_group(&jobs, &mut Vec::new(), &mut got);
                assert_eq!(bits(&got), bits(&want), "f16 {} heads {rep} head_dim {hd} keys {lo}..{n}", T::F16);
            }
        }
        for rep in 1..=7 {
            for (hd, n) in [(64, 1070), (64, 33), (16, 203), (12, 3), (40, 47), (48, 129), (7, 16), (1, 2), (96, 80)] {
                check::<f32>(rep, hd, n);
                check::<f16>(rep, hd, n);
            }
        }
    }

    /// Every build the CPU can run against the portable one, on f32 and f16, with key counts and
    /// head widths that take each of the AVX-512 build's paths (blocks of 64, then 0 to 3 full
    /// blocks of 16 and a masked one) and the AVX2 build's 8- and 1-lane remainders, over head
    /// widths that leave partial groups of four.
    #[test]
    fn portable_avx2_and_avx512_kernels_agree_bit_for_bit() {
        type Kernel<T> = fn(&Query<T>, &mut Vec<f32>, &mut [f32]);
        fn builds<T: Elem>() -> Vec<(&'static str, Kernel<T>)> {
            let mut builds: Vec<(&'static str, Kernel<T>)> = Vec::new();
            #[cfg(target_arch = "x86_64")]
            {
                if has_avx2() {
                    // SAFETY: the CPU supports AVX2 and F16C, checked just above.
                    builds.push(("avx2", |job, scores, out| unsafe { attend_one_avx2(job, scores, out) }));
                    if has_avx512() {
                        // SAFETY: the CPU supports AVX-512F, BW and VL, AVX2 and F16C, checked
                        // just above.
                        builds.push(("avx512", |job, scores, out| unsafe { attend_one_avx512(job, scores, out) }));
                    } else {
                        eprintln!("skipped the AVX-512 build: this CPU lacks avx512f, avx512bw or avx512vl");
                    }
                } else {
                    eprintln!("skipped the AVX2 and AVX-512 builds: this CPU lacks avx2 or f16c");
                }
            }
            builds.push(("dispatched", attend_one::<T>));
            builds
        }
        fn check<T: Elem>(hd: usize, n: usize, q: &[f32], keys: &[f32], vals: &[f32]) {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let stored = |x: &f32| T::narrow(if T::F16 { f16::from_f32(*x).to_f32() } else { *x });
            let (keys, vals): (Vec<T>, Vec<T>) = (keys.iter().map(stored).collect(), vals.iter().map(stored).collect());
            for lo in [0, 1, n / 2, n - 1] {
                let job = Query { q, keys: &keys, kstride: n, values: &vals, lo, hi: n, scale: 0.25 };
                let mut want = vec![0.0; hd];
                attend_one_impl::<PORTABLE, T>(&job, &mut Vec::new(), &mut want);
                for (name, kernel) in builds::<T>() {
                    let mut got = vec![0.0; hd];
                    kernel(&job, &mut Vec::new(), &mut got);
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
            check::<f32>(hd, n, &q, &keys, &vals);
            check::<f16>(hd, n, &q, &keys, &vals);
        }
    }
}
