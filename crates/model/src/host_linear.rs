//! Linear layers on the CPU backend: `y = x·Wᵀ (+ b)` over weights packed once, when the model
//! is built.
//!
//! Why hand-written: on Burn's flex backend a linear layer is a call into the `gemm` crate,
//! which packs the whole weight matrix (and, for f16, converts it to f32) on every call. For the
//! shapes of decoding, a few rows against a `576 × 1536` matrix, packing cost more than the
//! multiply: in a perf profile of SmolLM2 decoding 16 prompts in f16 (stop 14), gemm's packing
//! loop took 33% of the samples and its multiply kernels 26%. Here the weights are packed once
//! into panels of [`PANEL`] output columns, `[out / PANEL][in][PANEL]`, so a decoding step streams
//! each weight exactly once, with no copy. Both cores share the panels when the caller runs one
//! batch ([`single_threaded`] marks the threads that run batches side by side).
//!
//! Storage: panels hold f16 (widened in registers by `vcvtph2ps`, exactly) when the compute
//! dtype is f16, and also when it is f32 but every weight is exactly an f16 value (the f32 noise
//! floor runs the FP16-rounded reference weights): half the memory and half the bytes streamed
//! per step, with the same products, since widening is exact. Otherwise f32. The bias is an f32
//! vector either way, holding f16 values in an f16 layer.
//!
//! Numerics: each output is one f32 chain of fused multiply-adds over the input index in order,
//! from 0: `acc ← fma(x[k], w[k], acc)` for `k = 0, 1, …` (then `+ b`, then rounded to the
//! compute dtype by the caller, as a half-precision GEMM with f32 accumulation rounds its
//! output). The AVX-512, AVX2+FMA and portable kernels perform exactly these operations (the
//! portable one with `f32::mul_add`), so they give bit-identical results; an output depends only
//! on its own row of `x` and its own column of `W`, never on the other rows of the batch, on how
//! a sequence is cut into chunks, or on the thread count.

use std::cell::Cell;

use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use crate::host_attention::Elem;

/// Output columns per packed panel: two AVX-512 registers of f32.
pub(crate) const PANEL: usize = 32;

/// Rows of `x` multiplied against a panel at once by the AVX-512 kernel (16 accumulators).
const ROWS_AVX512: usize = 8;
/// Rows at once in the AVX2 kernel (12 accumulators over half a panel).
const ROWS_AVX2: usize = 6;
/// Rows of `x` kept hot in cache while the panels stream past.
const ROW_CHUNK: usize = 64;
/// Multiply-adds below which a call stays on its thread (a fork-join costs microseconds).
const PARALLEL_MIN_MACS: usize = 1 << 16;

thread_local! {
    /// Whether this thread may spread a layer over the cores (false on threads that run batches
    /// side by side, which already keep every core busy).
    static SPREAD: Cell<bool> = const { Cell::new(true) };
}

/// Whether a call of `macs` multiply-adds fork-joins over rayon's threads: this thread may
/// spread ([`single_threaded`]), there is more than one thread, and the work is worth a
/// fork-join. Linear layers and host attention both ask.
pub(crate) fn spreads(macs: usize) -> bool {
    SPREAD.with(Cell::get) && macs >= PARALLEL_MIN_MACS && rayon::current_num_threads() > 1
}

/// Runs `f` with this thread's linear layers and host attention kept on this thread.
pub fn single_threaded<T>(f: impl FnOnce() -> T) -> T {
    let before = SPREAD.with(|s| s.replace(false));
    let out = f();
    SPREAD.with(|s| s.set(before));
    out
}

/// Runs `f` on a thread of rayon's pool, so that the linear layers it calls fork-join within the
/// pool (workers spin briefly for work before they sleep) instead of waking it from outside and
/// blocking on every layer: a single-stream decoding step makes ~200 such calls.
pub fn in_pool<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    rayon::scope(|_| f())
}

/// The packed weights: f16 when the compute dtype is f16 or every weight is an f16 value, else
/// f32.
#[derive(Clone)]
enum Panels {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

/// A linear layer's weights packed for [`PackedLinear::forward`]: `[out, in]` weights as
/// `[ceil(out / PANEL)][in][PANEL]` panels (columns past `out` are zero), and the bias.
#[derive(Clone)]
pub(crate) struct PackedLinear {
    out: usize,
    inp: usize,
    panels: Panels,
    /// `[out]`, each value representable in the compute dtype.
    bias: Option<Vec<f32>>,
}

impl std::fmt::Debug for PackedLinear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dtype = match self.panels {
            Panels::F32(_) => "f32",
            Panels::F16(_) => "f16",
        };
        write!(f, "PackedLinear {{ out: {}, in: {}, {dtype}, bias: {} }}", self.out, self.inp, self.bias.is_some())
    }
}

impl PackedLinear {
    /// Packs `[out, in]` row-major weights (PyTorch's `Linear` layout) and an optional `[out]`
    /// bias, both rounded to f16 (nearest even) when `f16`. In f32, weights that are all f16
    /// values ([`is_f16_exact`]) are stored as f16: the same values in half the memory.
    ///
    /// # Panics
    /// If `weight` is not `out × inp` values or `bias` not `out` (the model checked both).
    pub(crate) fn pack(weight: &[f32], out: usize, inp: usize, bias: Option<&[f32]>, f16: bool) -> Self {
        Self::pack_stored(weight, out, inp, bias, f16, f16 || is_f16_exact(weight))
    }

    /// [`PackedLinear::pack`] with the panels stored as f16 when `store_f16` (which must hold
    /// when `f16`, and round nothing otherwise), else f32.
    pub(crate) fn pack_stored(
        weight: &[f32],
        out: usize,
        inp: usize,
        bias: Option<&[f32]>,
        f16: bool,
        store_f16: bool,
    ) -> Self {
        assert_eq!(weight.len(), out * inp, "weights are [out, in]");
        debug_assert!(store_f16 || !f16, "an f16 layer stores f16");
        let panels = if store_f16 {
            Panels::F16(pack_panels(weight, out, inp, f16::from_f32))
        } else {
            Panels::F32(pack_panels(weight, out, inp, |v| v))
        };
        let bias = bias.map(|b| {
            assert_eq!(b.len(), out, "bias is [out]");
            if f16 { b.iter().map(|&v| f16::from_f32(v).to_f32()).collect() } else { b.to_vec() }
        });
        Self { out, inp, panels, bias }
    }

    /// Output width.
    pub(crate) fn out(&self) -> usize {
        self.out
    }

    /// Whether a bias is added.
    pub(crate) fn has_bias(&self) -> bool {
        self.bias.is_some()
    }

    /// Input width.
    pub(crate) fn inp(&self) -> usize {
        self.inp
    }

    /// The weights the layer multiplies by, `[out, in]` row-major (the layout [`PackedLinear::pack`]
    /// took), exactly as stored: f16 panels widened, padding columns dropped.
    pub(crate) fn weights(&self) -> Vec<f32> {
        match &self.panels {
            Panels::F32(w) => unpack_panels(w, self.out, self.inp),
            Panels::F16(w) => unpack_panels(w, self.out, self.inp),
        }
    }

    /// The bias added, `[out]`, if any (values of the compute dtype).
    pub(crate) fn bias(&self) -> Option<&[f32]> {
        self.bias.as_deref()
    }

    /// `x·Wᵀ + b` in f32, for the caller to round to the compute dtype.
    ///
    /// # Shapes
    /// - `x`: `[m, in]`, row-major
    /// - returns `[m, out]`, row-major
    ///
    /// # Panics
    /// If `x` is not `m × in` values.
    pub(crate) fn forward(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.forward_with(x, m, Isa::detect())
    }

    /// [`PackedLinear::forward`] rounded to the compute dtype (f16 when `f16`): what a Burn
    /// linear layer in that dtype returns, read back.
    ///
    /// # Shapes
    /// - `x`: `[m, in]` → `[m, out]`
    pub(crate) fn forward_rounded(&self, x: &[f32], m: usize, f16: bool) -> Vec<f32> {
        let mut y = self.forward(x, m);
        if f16 {
            round_f16(&mut y);
        }
        y
    }

    /// [`PackedLinear::forward`] with a given kernel (tests compare them).
    fn forward_with(&self, x: &[f32], m: usize, isa: Isa) -> Vec<f32> {
        assert_eq!(x.len(), m * self.inp, "x is [m, in]");
        let mut y = vec![0.0f32; m * self.out];
        let n_panels = self.out.div_ceil(PANEL);
        if m == 0 || n_panels == 0 {
            return y;
        }
        let threads =
            if spreads(m * self.inp * self.out) { rayon::current_num_threads().clamp(1, n_panels) } else { 1 };
        let per_task = n_panels.div_ceil(threads);
        let out = Out { ptr: y.as_mut_ptr(), ld: self.out };
        let run = |task: usize| {
            let first = task * per_task;
            let count = per_task.min(n_panels.saturating_sub(first));
            match &self.panels {
                Panels::F32(w) => self.panels_range(w, x, m, first..first + count, out, isa),
                Panels::F16(w) => self.panels_range(w, x, m, first..first + count, out, isa),
            }
        };
        if threads > 1 {
            (0..threads).into_par_iter().for_each(run);
        } else {
            run(0);
        }
        if let Some(b) = &self.bias {
            for row in y.chunks_exact_mut(self.out) {
                for (v, &bv) in row.iter_mut().zip(b) {
                    *v += bv;
                }
            }
        }
        y
    }

    /// `panels` against all `m` rows, written into their columns of `out` (`[m, out]`).
    fn panels_range<T: Elem>(&self, w: &[T], x: &[f32], m: usize, panels: std::ops::Range<usize>, out: Out, isa: Isa) {
        let k = self.inp;
        for r0 in (0..m).step_by(ROW_CHUNK) {
            let rows = (m - r0).min(ROW_CHUNK);
            let xs = &x[r0 * k..(r0 + rows) * k];
            for p in panels.clone() {
                let panel = &w[p * k * PANEL..(p + 1) * k * PANEL];
                let (col, cols) = (p * PANEL, (self.out - p * PANEL).min(PANEL));
                // SAFETY: rows r0..r0 + rows < m and columns col..col + cols ≤ out of the
                // `[m, out]` buffer `out` points to, alive for the whole call (`forward_with`);
                // each task writes only its own panels' columns, so no two writes overlap.
                unsafe { rows_times_panel(isa, xs, rows, k, panel, out.ptr.add(r0 * out.ld + col), out.ld, cols) };
            }
        }
    }
}

/// The `[m, out]` result the tasks of one call write into, each its own panels' columns.
#[derive(Clone, Copy)]
struct Out {
    ptr: *mut f32,
    /// Row stride (`out`).
    ld: usize,
}

// SAFETY: `Out` is only shared by the tasks of one `forward_with` call, which write disjoint
// columns of a buffer that outlives them.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

/// Rounds every value to f16 (nearest even) and back: what storing it in an f16 tensor does.
pub(crate) fn round_f16(values: &mut [f32]) {
    // Through a small f16 buffer with `half`'s slice conversions (F16C, 8 at a time, where the
    // CPU has it): the same rounding as `f16::from_f32` one value at a time.
    let mut buf = [f16::ZERO; 256];
    for chunk in values.chunks_mut(256) {
        let h = &mut buf[..chunk.len()];
        h.convert_from_f32_slice(chunk);
        h.convert_to_f32_slice(chunk);
    }
}

/// Whether every value is exactly an f16 value, bit for bit (−0.0 included; NaN never is): what
/// f16 storage keeps unchanged.
pub(crate) fn is_f16_exact(values: &[f32]) -> bool {
    // Through a small f16 buffer with `half`'s slice conversions (F16C where the CPU has it).
    let mut buf = [f16::ZERO; 256];
    let mut back = [0.0f32; 256];
    values.chunks(256).all(|chunk| {
        let (h, b) = (&mut buf[..chunk.len()], &mut back[..chunk.len()]);
        h.convert_from_f32_slice(chunk);
        h.convert_to_f32_slice(b);
        chunk.iter().zip(b.iter()).all(|(v, r)| v.to_bits() == r.to_bits() && !v.is_nan())
    })
}

/// `[out, in]` → `[ceil(out / PANEL)][in][PANEL]`, zero-padded, converted by `conv`.
fn pack_panels<T: Copy + Default>(w: &[f32], out: usize, inp: usize, conv: impl Fn(f32) -> T) -> Vec<T> {
    let n_panels = out.div_ceil(PANEL);
    let mut packed = vec![T::default(); n_panels * inp * PANEL];
    for (col, row) in w.chunks_exact(inp.max(1)).enumerate().take(out) {
        let (p, c) = (col / PANEL, col % PANEL);
        let panel = &mut packed[p * inp * PANEL..(p + 1) * inp * PANEL];
        for (k, &v) in row.iter().enumerate() {
            panel[k * PANEL + c] = conv(v);
        }
    }
    packed
}

/// [`pack_panels`] undone: `[out, in]` row-major f32.
fn unpack_panels<T: Elem>(packed: &[T], out: usize, inp: usize) -> Vec<f32> {
    let mut w = vec![0.0f32; out * inp];
    for (col, row) in w.chunks_exact_mut(inp.max(1)).enumerate().take(out) {
        let (p, c) = (col / PANEL, col % PANEL);
        let panel = &packed[p * inp * PANEL..(p + 1) * inp * PANEL];
        for (k, v) in row.iter_mut().enumerate() {
            *v = panel[k * PANEL + c].widen();
        }
    }
    w
}

/// The instruction set a kernel runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Isa {
    /// 16-wide f32 FMAs, f16 widened by `vcvtph2ps` (AVX-512F).
    Avx512,
    /// 8-wide f32 FMAs (AVX2 + FMA + F16C).
    Avx2,
    /// `f32::mul_add` one value at a time.
    Portable,
}

impl Isa {
    fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f") {
                return Self::Avx512;
            }
            if std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma")
                && std::is_x86_feature_detected!("f16c")
            {
                return Self::Avx2;
            }
        }
        Self::Portable
    }
}

/// `out[r·ld + c] = Σ_k x[r][k] · panel[k][c]` for `rows` rows and the first `cols ≤ PANEL`
/// columns, in the order the module doc states.
///
/// # Shapes
/// - `x`: `[rows, k]`; `panel`: `[k, PANEL]`; `out`: `rows` rows of stride `ld`
///
/// # Safety
/// `out` must be valid for writes of `cols` values at `out + r·ld` for every `r < rows`.
#[allow(clippy::too_many_arguments)]
unsafe fn rows_times_panel<T: Elem>(
    isa: Isa,
    x: &[f32],
    rows: usize,
    k: usize,
    panel: &[T],
    out: *mut f32,
    ld: usize,
    cols: usize,
) {
    assert!(x.len() >= rows * k && panel.len() >= k * PANEL && cols <= PANEL, "kernel operands too short");
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => {
            // SAFETY: `Isa::Avx512` is only chosen when the CPU has AVX-512F (`Isa::detect`, or
            // tests that check it first); operands as asserted above and promised by the caller.
            unsafe { x86::rows_avx512(x, rows, k, panel, out, ld, cols) }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => {
            // SAFETY: as above, for AVX2, FMA and F16C.
            unsafe { x86::rows_avx2(x, rows, k, panel, out, ld, cols) }
        }
        _ => {
            for r in 0..rows {
                // SAFETY: the caller promises `cols` writable values at `out + r·ld`.
                let dst = unsafe { std::slice::from_raw_parts_mut(out.add(r * ld), cols) };
                rows_portable(&x[r * k..(r + 1) * k], panel, dst);
            }
        }
    }
}

/// The definition, one output at a time: `dst[c] = Σ_i x[i] · panel[i][c]`.
fn rows_portable<T: Elem>(x: &[f32], panel: &[T], dst: &mut [f32]) {
    for (c, d) in dst.iter_mut().enumerate() {
        let mut acc = 0.0f32;
        for (i, &xi) in x.iter().enumerate() {
            acc = xi.mul_add(panel[i * PANEL + c].widen(), acc);
        }
        *d = acc;
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The kernels: a block of rows × one panel, accumulators in registers, the panel streamed
    //! once per block.

    use std::arch::x86_64::*;

    use super::{Elem, PANEL, ROWS_AVX2, ROWS_AVX512};
    use crate::host_attention::load8;

    /// Panel rows fetched ahead of the one being multiplied.
    const PREFETCH: usize = 24;

    /// Calls `$kernel::<R>` for blocks of `$max` rows, then once for the rest.
    macro_rules! by_blocks {
        ($kernel:ident, $max:expr, $x:expr, $rows:expr, $k:expr, $panel:expr, $out:expr, $ld:expr, $cols:expr) => {{
            let (x, rows, k, panel, out, ld, cols) = ($x, $rows, $k, $panel, $out, $ld, $cols);
            let mut r = 0;
            while r + $max <= rows {
                // SAFETY (every call): rows r.. of `out` are writable, as the caller promised.
                unsafe { $kernel::<T, { $max }>(&x[r * k..], k, panel, out.add(r * ld), ld, cols) };
                r += $max;
            }
            let (x, out) = (&x[r * k..], out.wrapping_add(r * ld));
            unsafe {
                match rows - r {
                    0 => {}
                    1 => $kernel::<T, 1>(x, k, panel, out, ld, cols),
                    2 => $kernel::<T, 2>(x, k, panel, out, ld, cols),
                    3 => $kernel::<T, 3>(x, k, panel, out, ld, cols),
                    4 => $kernel::<T, 4>(x, k, panel, out, ld, cols),
                    5 => $kernel::<T, 5>(x, k, panel, out, ld, cols),
                    6 => $kernel::<T, 6>(x, k, panel, out, ld, cols),
                    _ => $kernel::<T, 7>(x, k, panel, out, ld, cols),
                }
            }
        }};
    }

    /// Writes `R` rows of `PANEL` accumulated columns (as `PANEL / LANES` vectors stored by
    /// `store`) to `out` with row stride `ld`, only the first `cols`.
    ///
    /// # Safety
    /// `cols` values must be writable at `out + r·ld` for every `r < R`.
    #[inline(always)]
    unsafe fn write_rows<const R: usize>(out: *mut f32, ld: usize, cols: usize, store: impl Fn(usize, *mut f32)) {
        for r in 0..R {
            // SAFETY: as the caller promises; a partial panel goes through a local buffer.
            unsafe {
                if cols == PANEL {
                    store(r, out.add(r * ld));
                } else {
                    let mut tmp = [0.0f32; PANEL];
                    store(r, tmp.as_mut_ptr());
                    std::ptr::copy_nonoverlapping(tmp.as_ptr(), out.add(r * ld), cols);
                }
            }
        }
    }

    /// # Safety
    /// The CPU must have AVX-512F; `x` holds `rows × k`, `panel` `k × PANEL` values; `cols`
    /// values are writable at `out + r·ld` for every `r < rows`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn rows_avx512<T: Elem>(
        x: &[f32],
        rows: usize,
        k: usize,
        panel: &[T],
        out: *mut f32,
        ld: usize,
        cols: usize,
    ) {
        by_blocks!(block_avx512, ROWS_AVX512, x, rows, k, panel, out, ld, cols);
    }

    /// `R` rows × `PANEL` columns.
    ///
    /// # Safety
    /// As [`rows_avx512`] for `R` rows.
    #[inline(always)]
    unsafe fn block_avx512<T: Elem, const R: usize>(
        x: &[f32],
        k: usize,
        panel: &[T],
        out: *mut f32,
        ld: usize,
        cols: usize,
    ) {
        assert!(x.len() >= R * k && panel.len() >= k * PANEL);
        // SAFETY: only reached from `rows_avx512` (AVX-512F present); every read is of `x[r·k + i]`
        // with r < R, i < k, or of panel row i < k, in bounds by the assert; the writes are the
        // caller's promise.
        unsafe {
            let load = |p: *const T| -> __m512 {
                if T::F16 { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) } else { _mm512_loadu_ps(p.cast()) }
            };
            let mut acc = [[_mm512_setzero_ps(); 2]; R];
            let (xp, wp) = (x.as_ptr(), panel.as_ptr());
            for i in 0..k {
                // The panel streams from memory once per block: ask for it well ahead (a
                // prefetch past the end is harmless, and never faults).
                _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add((i + PREFETCH) * PANEL).cast());
                let w0 = load(wp.add(i * PANEL));
                let w1 = load(wp.add(i * PANEL + 16));
                for (r, a) in acc.iter_mut().enumerate() {
                    let xv = _mm512_set1_ps(*xp.add(r * k + i));
                    a[0] = _mm512_fmadd_ps(xv, w0, a[0]);
                    a[1] = _mm512_fmadd_ps(xv, w1, a[1]);
                }
            }
            write_rows::<R>(out, ld, cols, |r, dst| {
                _mm512_storeu_ps(dst, acc[r][0]);
                _mm512_storeu_ps(dst.add(16), acc[r][1]);
            });
        }
    }

    /// # Safety
    /// The CPU must have AVX2, FMA and F16C; operands as [`rows_avx512`].
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn rows_avx2<T: Elem>(
        x: &[f32],
        rows: usize,
        k: usize,
        panel: &[T],
        out: *mut f32,
        ld: usize,
        cols: usize,
    ) {
        // Blocks as even as possible (8 rows as 4 + 4, not 6 + 2): a block of few rows has too
        // few accumulators to hide the FMA latency.
        let blocks = rows.div_ceil(ROWS_AVX2);
        let mut r = 0;
        for b in 0..blocks {
            let size = rows / blocks + usize::from(b < rows % blocks);
            let (x, out) = (&x[r * k..], out.wrapping_add(r * ld));
            // SAFETY (every call): rows r..r + size ≤ rows of `out` are writable, as the caller
            // promised.
            unsafe {
                match size {
                    1 => block_avx2::<T, 1>(x, k, panel, out, ld, cols),
                    2 => block_avx2::<T, 2>(x, k, panel, out, ld, cols),
                    3 => block_avx2::<T, 3>(x, k, panel, out, ld, cols),
                    4 => block_avx2::<T, 4>(x, k, panel, out, ld, cols),
                    5 => block_avx2::<T, 5>(x, k, panel, out, ld, cols),
                    _ => block_avx2::<T, ROWS_AVX2>(x, k, panel, out, ld, cols),
                }
            }
            r += size;
        }
    }

    /// `R` rows × `PANEL` columns, as two halves of 16 columns (12 accumulators at most),
    /// each half written to a local `[R][PANEL]` block first.
    ///
    /// # Safety
    /// As [`rows_avx2`] for `R` rows.
    #[inline(always)]
    unsafe fn block_avx2<T: Elem, const R: usize>(
        x: &[f32],
        k: usize,
        panel: &[T],
        out: *mut f32,
        ld: usize,
        cols: usize,
    ) {
        assert!(x.len() >= R * k && panel.len() >= k * PANEL);
        let mut block = [[0.0f32; PANEL]; R];
        // SAFETY: only reached from `rows_avx2` (AVX2, FMA, F16C present); reads as in
        // `block_avx512`, with column offsets `half + 8 < PANEL`; writes into `block`, then the
        // caller's promised rows.
        unsafe {
            // Called through an opaque pointer: `#[inline(never)]` alone did not keep LLVM from
            // inlining it (and spilling again); one indirect call per half panel costs nothing
            // beside its `k`-long loop.
            let f: unsafe fn(*const f32, usize, *const T, &mut [[f32; PANEL]; R], usize) =
                std::hint::black_box(half_avx2::<T, R>);
            f(x.as_ptr(), k, panel.as_ptr(), &mut block, 0);
            f(x.as_ptr(), k, panel.as_ptr(), &mut block, 16);
            write_rows::<R>(out, ld, cols, |r, dst| std::ptr::copy_nonoverlapping(block[r].as_ptr(), dst, PANEL));
        }
    }

    /// Columns `half..half + 16` of `R` rows × one panel into `block`. Kept out of line so that
    /// its `2R` accumulators, two weight vectors and a broadcast stay in the 16 registers: inlined
    /// into [`block_avx2`], LLVM spilled one accumulator at `R = 6`, and the store-to-load chain
    /// through the stack halved the kernel's speed (perf, Zen 2).
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `x` holds `R × k` values, `panel` `k × PANEL`;
    /// `half + 16 ≤ PANEL`.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline(never)]
    unsafe fn half_avx2<T: Elem, const R: usize>(
        xp: *const f32,
        k: usize,
        wp: *const T,
        block: &mut [[f32; PANEL]; R],
        half: usize,
    ) {
        // SAFETY: the caller's contract.
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); 2]; R];
            // Pointers stepped, not indices multiplied: `qdrift-model` keeps overflow checks,
            // and checked index arithmetic in this loop cost a third of its speed.
            let rows: [*const f32; R] = std::array::from_fn(|r| xp.add(r * k));
            let mut w = wp.add(half);
            // Only the first block's first pass over a panel reads it from memory (at decoding
            // shapes, faster than the memory streams it on both cores); every block's second
            // half fetches the next panel meanwhile, row for row, into L2 (after the first
            // block's, the lines are there already and a prefetch costs one load slot; past the
            // last panel it touches nothing and never faults).
            let ahead = half != 0;
            for i in 0..k {
                if ahead {
                    // Row `i` of the next panel: one 64-byte line in f16, two in f32.
                    let next = w.wrapping_add(k * PANEL - half);
                    _mm_prefetch::<_MM_HINT_T1>(next.cast());
                    if !T::F16 {
                        _mm_prefetch::<_MM_HINT_T1>(next.wrapping_add(16).cast());
                    }
                }
                let w0 = load8(w);
                let w1 = load8(w.add(8));
                w = w.add(PANEL);
                for (row, a) in rows.iter().zip(acc.iter_mut()) {
                    let xv = _mm256_set1_ps(*row.add(i));
                    a[0] = _mm256_fmadd_ps(xv, w0, a[0]);
                    a[1] = _mm256_fmadd_ps(xv, w1, a[1]);
                }
            }
            for (row, a) in block.iter_mut().zip(&acc) {
                _mm256_storeu_ps(row.as_mut_ptr().add(half), a[0]);
                _mm256_storeu_ps(row.as_mut_ptr().add(half + 8), a[1]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values in [-1, 1) (a 64-bit LCG; no `rand` dependency in this crate).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn isas() -> Vec<Isa> {
        let mut v = vec![Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f") {
                v.push(Isa::Avx512);
            }
            if std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma")
                && std::is_x86_feature_detected!("f16c")
            {
                v.push(Isa::Avx2);
            }
        }
        v
    }

    #[test]
    fn every_kernel_gives_the_definition_bit_for_bit() {
        // Odd widths: a partial last panel, row counts around both kernels' block sizes and the
        // row chunk, an input width that is no multiple of any vector width.
        for &(m, inp, out) in &[(1, 37, 70), (5, 64, 32), (7, 3, 1), (8, 100, 96), (13, 37, 65), (70, 19, 33)] {
            let (w, x, b) = (values(out * inp, 1), values(m * inp, 2), values(out, 3));
            for f16 in [false, true] {
                let layer = PackedLinear::pack(&w, out, inp, Some(&b), f16);
                let wq: Vec<f32> = if f16 { w.iter().map(|&v| f16::from_f32(v).to_f32()).collect() } else { w.clone() };
                let bq: Vec<f32> = if f16 { b.iter().map(|&v| f16::from_f32(v).to_f32()).collect() } else { b.clone() };
                // The definition: one fused chain per output, then the bias.
                let mut want = vec![0.0f32; m * out];
                for r in 0..m {
                    for c in 0..out {
                        let mut acc = 0.0f32;
                        for i in 0..inp {
                            acc = x[r * inp + i].mul_add(wq[c * inp + i], acc);
                        }
                        want[r * out + c] = acc + bq[c];
                    }
                }
                for isa in isas() {
                    for spread in [false, true] {
                        let got = if spread {
                            layer.forward_with(&x, m, isa)
                        } else {
                            single_threaded(|| layer.forward_with(&x, m, isa))
                        };
                        let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "{isa:?} f16={f16} spread={spread} m={m} in={inp} out={out}");
                    }
                }
            }
        }
    }

    /// Deterministic f16 values (as f32) with the edge cases f16 storage must keep: −0.0, the
    /// largest finite value, subnormals.
    fn f16_values(n: usize, seed: u64) -> Vec<f32> {
        let mut v: Vec<f32> = values(n, seed).iter().map(|&x| f16::from_f32(x * 4.0).to_f32()).collect();
        let specials = [-0.0, 0.0, 65504.0, -65504.0, 5.960_464_5e-8, -6.097_555e-5, 1.0, -1.0];
        for (d, s) in v.iter_mut().step_by(7).zip(specials) {
            *d = s;
        }
        v
    }

    fn stores_f16(layer: &PackedLinear) -> bool {
        matches!(layer.panels, Panels::F16(_))
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn f16_exact_weights_are_stored_as_f16_with_bit_identical_results() {
        for &(m, inp, out) in &[(1, 37, 70), (8, 100, 96), (13, 37, 65)] {
            let (w, x) = (f16_values(out * inp, 6), values(m * inp, 7));
            // A bias that is no f16 value stays f32 in an f32 layer.
            let b: Vec<f32> = values(out, 8).iter().map(|v| v + 1e-6).collect();
            assert!(is_f16_exact(&w) && !is_f16_exact(&b));
            let compact = PackedLinear::pack(&w, out, inp, Some(&b), false);
            let wide = PackedLinear::pack_stored(&w, out, inp, Some(&b), false, false);
            assert!(stores_f16(&compact) && !stores_f16(&wide), "{compact:?} / {wide:?}");
            assert_eq!(compact.bias().map(bits), Some(bits(&b)), "the bias is kept as given");
            assert_eq!(bits(&compact.weights()), bits(&w), "f16 panels unpack to the weights");
            assert_eq!(bits(&wide.weights()), bits(&w), "f32 panels unpack to the weights");
            for isa in isas() {
                for spread in [false, true] {
                    let run = |layer: &PackedLinear| {
                        if spread {
                            layer.forward_with(&x, m, isa)
                        } else {
                            single_threaded(|| layer.forward_with(&x, m, isa))
                        }
                    };
                    assert_eq!(bits(&run(&compact)), bits(&run(&wide)), "{isa:?} spread={spread} m={m} {inp}→{out}");
                }
            }
        }
    }

    #[test]
    fn weights_that_are_not_all_f16_values_stay_f32() {
        let (out, inp) = (40, 24);
        let w = f16_values(out * inp, 9);
        assert!(stores_f16(&PackedLinear::pack(&w, out, inp, None, false)));
        // One weight between two f16 values, one NaN (never an f16 value here), one f32 subnormal.
        for odd in [1.0 + 2f32.powi(-12), f32::NAN, f32::from_bits(1)] {
            let mut w = w.clone();
            w[out * inp / 2 + 1] = odd;
            assert!(!is_f16_exact(&w), "{odd:e}");
            let layer = PackedLinear::pack(&w, out, inp, None, false);
            assert!(!stores_f16(&layer), "{odd:e}");
            assert_eq!(bits(&layer.weights()), bits(&w), "{odd:e}: f32 panels keep every bit");
            // An f16 layer rounds it, as before.
            let half = PackedLinear::pack(&w, out, inp, None, true);
            assert!(stores_f16(&half));
        }
        assert!(is_f16_exact(&[-0.0, f32::INFINITY, f32::NEG_INFINITY]) && is_f16_exact(&[]));
    }

    #[test]
    fn a_row_does_not_depend_on_its_batch() {
        let (m, inp, out) = (9, 48, 40);
        let (w, x) = (values(out * inp, 4), values(m * inp, 5));
        let layer = PackedLinear::pack(&w, out, inp, None, true);
        let all = layer.forward(&x, m);
        for r in 0..m {
            let alone = layer.forward(&x[r * inp..(r + 1) * inp], 1);
            assert_eq!(alone, all[r * out..(r + 1) * out], "row {r}");
        }
        assert!(layer.forward(&[], 0).is_empty());
    }
}
