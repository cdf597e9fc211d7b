//! The AVX-512 kernels (AVX-512F, BW and VL; [`qdrift_isa::Isa::Avx512`]): the linear layer's
//! block of rows × one panel, and attention's dot products, 16 lanes per vector, the last lanes
//! in a masked block. Each performs the operations of its portable definition
//! ([`super::portable`]) in the same order, so gives the same bits.

use std::arch::x86_64::*;

use super::elem::Elem;
use super::panels::{PANEL, PanelRows};
use super::x86::{dots_many_operands, each_partial_sum, write_rows};

/// Rows of `x` multiplied against a panel at once by the linear kernel (16 accumulators).
const ROWS: usize = 8;

/// Panel rows fetched ahead of the one being multiplied.
const PREFETCH: usize = 24;

/// Calls `$kernel::<R>` for blocks of `$max` rows, then once for the rest.
macro_rules! by_blocks {
    ($kernel:ident, $max:expr, $x:expr, $rows:expr, $k:expr, $panel:expr, $out:expr, $ld:expr, $cols:expr) => {{
        let (x, rows, k, panel, out, ld, cols) = ($x, $rows, $k, $panel, $out, $ld, $cols);
        let mut r = 0;
        while r + $max <= rows {
            // SAFETY: the caller of `panel_rows` promises AVX-512F, `rows × k` values of `x` and
            // `cols` writable values at `out + r·ld` for every row `r < rows`: here rows
            // `r..r + $max ≤ rows`, so `out + r·ld` is in that allocation and the kernel's rows are
            // among those promised (it asserts its reads of `x` and the panel).
            unsafe { $kernel::<T, { $max }>(&x[r * k..], k, panel, out.add(r * ld), ld, cols) };
            r += $max;
        }
        let (x, out) = (&x[r * k..], out.wrapping_add(r * ld));
        // SAFETY: as in the loop, for the `rows - r < $max ≤ 8` rows left, `r..rows`: each arm
        // hands the kernel exactly that many rows.
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

/// The linear layer's product of `rows` rows of `x` and one panel: `out[r·ld + c] = Σ_i
/// x[r][i] · panel[i][c]` for the first `cols ≤ PANEL` columns, each output one fused chain over
/// `i` in order ([`super::portable::panel_row`]), in blocks of [`ROWS`] rows, then the rest.
///
/// # Safety
/// The CPU must have AVX-512F; `x` holds `rows × k`, `panel` `k × PANEL` values; `cols`
/// values are writable at `out + r·ld` for every `r < rows`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn panel_rows<T: Elem>(job: PanelRows<'_, T>) {
    let PanelRows { x, rows, k, panel, out, ld, cols } = job;
    by_blocks!(panel_block, ROWS, x, rows, k, panel, out, ld, cols);
}

/// `R` rows × `PANEL` columns.
///
/// # Safety
/// As [`panel_rows`] for `R` rows.
#[inline(always)]
unsafe fn panel_block<T: Elem, const R: usize>(
    x: &[f32],
    k: usize,
    panel: &[T],
    out: *mut f32,
    ld: usize,
    cols: usize,
) {
    assert!(x.len() >= R * k && panel.len() >= k * PANEL);
    // SAFETY: only reached from `panel_rows` (AVX-512F present); every read is of `x[r·k + i]`
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

/// Attention's dot products of one vector: `out[l] = Σ_i x[i] · m[i · stride + l]` for every
/// lane `l`, each lane the operations of [`super::portable::dot1`], 64 lanes at a time, then the
/// rest (under 64) in one pass, the last block of 16 masked.
///
/// # Safety
/// The CPU has AVX-512F, BW and VL.
///
/// # Panics
/// If `m` is shorter than `(x.len() - 1) · stride + out.len()`.
#[inline(always)]
pub(super) unsafe fn dots<T: Elem>(x: &[f32], m: &[T], stride: usize, out: &mut [f32]) {
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
}

/// [`dots`] for `R` vectors `xs` at once over the same matrix: `out[r · lanes + l] = Σ_i
/// xs[r][i] · m[i · stride + l]`, each lane the operations of `dot1`, in blocks of 32
/// lanes, then the rest (under 32) in one pass, the last block of 16 masked.
///
/// # Safety
/// The CPU has AVX-512F, BW and VL.
///
/// # Panics
/// If the `xs` differ in length, `out` is not `R · lanes` values, or `m` is shorter than
/// `(len − 1) · stride + lanes`.
#[inline(always)]
pub(super) unsafe fn dots_many<const R: usize, T: Elem>(
    xs: &[&[f32]; R],
    m: &[T],
    stride: usize,
    out: &mut [f32],
    lanes: usize,
) {
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
    // Every block below reads rows `i < len` at `i · stride` (`dots_many_operands` asserted
    // `m.len() ≥ (len − 1) · stride + lanes`), each at the block's lanes only.
    for at in (0..full).step_by(32) {
        // SAFETY: the caller promises AVX-512F, BW and VL; lanes `at..at + 32 ≤ full ≤ lanes` of
        // every row are in bounds.
        let sums = unsafe { dot16_rows_many::<R, 2, false, true, T>(xs, m.wrapping_add(at), stride, u16::MAX) };
        write(out, at, &sums, 32);
    }
    let rest = lanes - full;
    let mask = |l: usize| (1u16 << l) - 1;
    let (p, at) = (m.wrapping_add(full), full);
    match (rest / 16, rest % 16) {
        (0, 0) => {}
        (0, l) => {
            // SAFETY: AVX-512F, BW and VL as above; one block masked to its first `l` lanes,
            // `full..full + l = lanes` (a masked load touches no other lane, nor faults on one).
            let sums = unsafe { dot16_rows_many::<R, 1, true, false, T>(xs, p, stride, mask(l)) };
            let padded: [[[f32; 16]; 2]; R] = std::array::from_fn(|r| [sums[r][0], [0.0; 16]]);
            write(out, at, &padded, l);
        }
        (_, 0) => {
            // SAFETY: AVX-512F, BW and VL as above; one full block, lanes `full..full + 16 = lanes`.
            let sums = unsafe { dot16_rows_many::<R, 1, false, false, T>(xs, p, stride, u16::MAX) };
            let padded: [[[f32; 16]; 2]; R] = std::array::from_fn(|r| [sums[r][0], [0.0; 16]]);
            write(out, at, &padded, 16);
        }
        (_, l) => {
            // SAFETY: AVX-512F, BW and VL as above; a full block, lanes `full..full + 16`, and one
            // masked to its first `l`, `full + 16..full + 16 + l = lanes`.
            let sums = unsafe { dot16_rows_many::<R, 2, true, false, T>(xs, p, stride, mask(l)) };
            write(out, at, &sums, 16 + l);
        }
    }
}

/// Fetches into L1 this row's `16 · K` lanes four passes on (`64 · K` elements further). Keys
/// are stored transposed, so a pass over them reads a few cache lines from each of `head_dim`
/// rows `capacity` apart: more streams than the hardware prefetcher follows, and in decoding they
/// come from memory (measured on 16 prompts × 800 SmolLM2 tokens: docs/BENCHMARKS.md, 'Steps
/// measured on the way (A/B)', 0cde4b8). A prefetch never faults, past the end included.
#[inline(always)]
fn prefetch_ahead<const K: usize, T: Elem>(row: *const T) {
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
#[inline(always)]
unsafe fn dot16_rows_many<const R: usize, const K: usize, const MASK_LAST: bool, const PREFETCH: bool, T: Elem>(
    xs: &[&[f32]; R],
    m: *const T,
    stride: usize,
    mask: u16,
) -> [[[f32; 16]; K]; R] {
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

/// `dot1` ([`super::portable::dot1`]) over `out.len()` lanes, as `K` blocks of 16 lanes, the last one masked
/// to the lanes `out` has left if `MASK_LAST`: the same partial sums, added the same way. Several
/// blocks at once (`4 · K` independent chains of additions) hide the adder's latency that four
/// chains alone leave exposed.
///
/// # Panics
/// If `out.len()` is not `16 · K` (or, if `MASK_LAST`, within `16 · (K − 1) + 1 .. 16 · K`), or
/// `m` is shorter than `(x.len() - 1) · stride + out.len()`.
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
    // SAFETY: only [`dots`] calls this, whose caller promises AVX-512F, BW and VL; row `i` is
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
#[inline(always)]
unsafe fn dot16_rows<const K: usize, const MASK_LAST: bool, T: Elem>(
    x: &[f32],
    m: *const T,
    stride: usize,
    mask: u16,
) -> [[f32; 16]; K] {
    /// `acc[k] += xi · row[16k..16k + 16]`.
    #[inline(always)]
    unsafe fn step<const K: usize, const MASK_LAST: bool, T: Elem>(
        acc: &mut [__m512; K],
        xi: f32,
        row: *const T,
        mask: u16,
    ) {
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
#[inline(always)]
unsafe fn load16<const MASKED: bool, T: Elem>(p: *const T, mask: u16) -> __m512 {
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
