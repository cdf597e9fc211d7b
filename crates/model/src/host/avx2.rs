//! The AVX2 kernels (AVX2, FMA and F16C; [`qdrift_isa::Isa::Avx2`]): the linear layer's block
//! of rows × one panel, and attention's dot products over `R` vectors at once. Each performs the
//! operations of its portable definition ([`super::portable`]) in the same order, so gives the
//! same bits.

use std::arch::x86_64::*;

use super::elem::Elem;
use super::panels::{PANEL, PanelRows};
use super::portable::dot1;
use super::x86::{dots_many_operands, each_partial_sum, write_rows};

/// Rows at once in the linear kernel (12 accumulators over half a panel).
const ROWS: usize = 6;

/// The linear layer's product of `rows` rows of `x` and one panel: `out[r·ld + c] = Σ_i
/// x[r][i] · panel[i][c]` for the first `cols ≤ PANEL` columns, each output one fused chain over
/// `i` in order ([`super::portable::panel_row`]), in blocks of up to [`ROWS`] rows.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `x` holds `rows × k`, `panel` `k × PANEL` values;
/// `cols ≤ PANEL` values are writable at `out + r·ld` for every `r < rows`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn panel_rows<T: Elem>(job: PanelRows<'_, T>) {
    let PanelRows { x, rows, k, panel, out, ld, cols } = job;
    // Blocks as even as possible (8 rows as 4 + 4, not 6 + 2): a block of few rows has too
    // few accumulators to hide the FMA latency.
    let blocks = rows.div_ceil(ROWS);
    let mut r = 0;
    for b in 0..blocks {
        let size = rows / blocks + usize::from(b < rows % blocks);
        let (x, out) = (&x[r * k..], out.wrapping_add(r * ld));
        // SAFETY: `panel_rows`' caller promises AVX2, FMA and F16C, `rows × k` values of `x` and
        // `cols` writable values at `out + r·ld` for every `r < rows`; this block's rows are
        // `r..r + size ≤ rows`, and each arm hands the kernel `size` rows (`size ≤ ROWS`).
        unsafe {
            match size {
                1 => panel_block::<T, 1>(x, k, panel, out, ld, cols),
                2 => panel_block::<T, 2>(x, k, panel, out, ld, cols),
                3 => panel_block::<T, 3>(x, k, panel, out, ld, cols),
                4 => panel_block::<T, 4>(x, k, panel, out, ld, cols),
                5 => panel_block::<T, 5>(x, k, panel, out, ld, cols),
                _ => panel_block::<T, ROWS>(x, k, panel, out, ld, cols),
            }
        }
        r += size;
    }
}

/// `R` rows × `PANEL` columns, as two halves of 16 columns (12 accumulators at most),
/// each half written to a local `[R][PANEL]` block first.
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
    let mut block = [[0.0f32; PANEL]; R];
    // SAFETY: only reached from `panel_rows` (AVX2, FMA, F16C present); every read is of
    // `x[r·k + i]` with r < R, i < k, or of panel row i < k at column offsets `half + 8 < PANEL`,
    // in bounds by the assert; writes into `block`, then the caller's promised rows.
    unsafe {
        // Called through an opaque pointer: `#[inline(never)]` alone did not keep LLVM from
        // inlining it (and spilling again); one indirect call per half panel costs nothing
        // beside its `k`-long loop.
        let f: unsafe fn(*const f32, usize, *const T, &mut [[f32; PANEL]; R], usize) =
            std::hint::black_box(panel_half::<T, R>);
        f(x.as_ptr(), k, panel.as_ptr(), &mut block, 0);
        f(x.as_ptr(), k, panel.as_ptr(), &mut block, 16);
        write_rows::<R>(out, ld, cols, |r, dst| std::ptr::copy_nonoverlapping(block[r].as_ptr(), dst, PANEL));
    }
}

/// Columns `half..half + 16` of `R` rows × one panel into `block`. Kept out of line so that
/// its `2R` accumulators, two weight vectors and a broadcast stay in the 16 registers: inlined
/// into [`panel_block`], LLVM spilled one accumulator at `R = 6`, and the store-to-load chain
/// through the stack halved the kernel's speed (perf, Zen 2).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `x` holds `R × k` values, `panel` `k × PANEL`;
/// `half + 16 ≤ PANEL`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline(never)]
unsafe fn panel_half<T: Elem, const R: usize>(
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

/// Attention's dot products for `R` vectors `xs` at once over the same matrix: `out[r · lanes +
/// l] = Σ_i xs[r][i] · m[i · stride + l]`, each lane the operations of [`dot1`]: one vector in blocks of 16 lanes (eight chains of additions, where
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
    let p = m.as_ptr();
    // Vector `r`'s sums of lanes `at..` (`[[f32; 8]; K]` flattened) into its row of `out`.
    let mut write = |at: usize, r: usize, sums: &[f32]| {
        out[r * lanes + at..r * lanes + at + sums.len()].copy_from_slice(sums);
    };
    let prefetch = |at: usize| (at * std::mem::size_of::<T>()).is_multiple_of(64);
    let mut at = 0;
    // Lanes `at..at + 8 · K` of every vector, prefetching where the block starts a 64-byte piece.
    macro_rules! block {
        ($k:literal) => {
            // SAFETY: the caller promises AVX2 and F16C; every use below has `at + 8 · K ≤
            // lanes`, and rows are read at `i · stride ≤ (len − 1) · stride`, so in bounds by
            // `dots_many_operands`' assert; a prefetch never faults.
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

/// The loop of [`dots_many`]: `K` blocks of 8 lanes for `R` vectors at once. Each
/// row's `8 · K` lanes are loaded (and widened) once and multiplied by every vector's element;
/// partial sum `i mod 4` of vector `r`, block `k` in `acc[r][i mod 4][k]`, added as [`dot1`]
/// adds them. With `PREFETCH`, each row is fetched into L1 64 elements on. `R · K ≤ 3` keeps its
/// `4 · R · K` accumulators in the 16 vector registers (and no closures: a call left out of line
/// would keep them in memory).
///
/// # Safety
/// The CPU has AVX2 and F16C; `8 · K` elements can be read at `m + i · stride` for every `i <
/// xs[0].len()`, and every vector of `xs` has that length.
#[inline(always)]
#[allow(unused_assignments)] // the last step moves `row` past what it reads
unsafe fn dot8_rows_many<const R: usize, const K: usize, const PREFETCH: bool, T: Elem>(
    xs: &[&[f32]; R],
    m: *const T,
    stride: usize,
) -> [[[f32; 8]; K]; R] {
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

/// Eight values at `p`, widened to f32 (exactly: `vcvtph2ps` for f16). Shared by the AVX2
/// attention and linear kernels.
///
/// # Safety
/// The CPU has AVX and F16C (the caller is compiled for them), and 8 values are readable at `p`.
#[inline(always)]
unsafe fn load8<T: Elem>(p: *const T) -> __m256 {
    // SAFETY: the caller's contract.
    unsafe {
        if T::F16 { _mm256_cvtph_ps(_mm_loadu_si128(p.cast::<__m128i>())) } else { _mm256_loadu_ps(p.cast::<f32>()) }
    }
}
