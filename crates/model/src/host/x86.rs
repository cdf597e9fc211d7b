//! What the AVX2 ([`super::avx2`]) and AVX-512 ([`super::avx512`]) kernels share: the loop over
//! a dot product's partial sums, the operand check of the `R`-vector dot products, and the write
//! of a block of linear-layer outputs.

use super::panels::PANEL;

/// Runs `$step!(i, p)` for `i = 0, 1, …, $len − 1` in order, with `p = i mod 4` a literal (so
/// that the step's accumulators of partial sum `p` are named by constants and stay in
/// registers): the loop of the `R`-vector kernels (`dot8_rows_many` in AVX2, `dot16_rows_many`
/// in AVX-512).
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
pub(super) use each_partial_sum;

/// Checks the operands of the `R`-vector dot products (`dots_many` in AVX2 and AVX-512): `R`
/// vectors of one length `len`, `out` of `R · lanes` values, `m` at least
/// `(len − 1) · stride + lanes` long; with empty vectors every sum is 0: `out` is zeroed and the
/// answer is false (nothing left to compute).
///
/// # Panics
/// If an operand's size is wrong.
pub(super) fn dots_many_operands<const R: usize, T>(
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

/// Writes `R` rows of `PANEL` accumulated columns (as `PANEL / LANES` vectors stored by
/// `store`) to `out` with row stride `ld`, only the first `cols`.
///
/// # Safety
/// `cols` values must be writable at `out + r·ld` for every `r < R`.
#[inline(always)]
pub(super) unsafe fn write_rows<const R: usize>(
    out: *mut f32,
    ld: usize,
    cols: usize,
    store: impl Fn(usize, *mut f32),
) {
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
