//! The layout the CPU linear kernels read weights in: an `[out, in]` matrix as
//! `[ceil(out / PANEL)][in][PANEL]` panels of [`PANEL`] output columns (columns past `out` are
//! zero), so that a decoding step streams each weight exactly once, with no copy.

use super::elem::Elem;

/// Output columns per packed panel: two AVX-512 registers of f32.
pub(crate) const PANEL: usize = 32;

/// `[out, in]` → `[ceil(out / PANEL)][in][PANEL]`, zero-padded, converted by `conv`.
pub(super) fn pack_panels<T: Copy + Default>(w: &[f32], out: usize, inp: usize, conv: impl Fn(f32) -> T) -> Vec<T> {
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
pub(super) fn unpack_panels<T: Elem>(packed: &[T], out: usize, inp: usize) -> Vec<f32> {
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

/// One call of a linear kernel: `rows` rows of `x` times one panel, into the first
/// `cols ≤ PANEL` columns of `rows` rows of `out` (row stride `ld`):
/// `out[r·ld + c] = Σ_i x[r·k + i] · panel[i·PANEL + c]`.
#[derive(Clone, Copy)]
pub(super) struct PanelRows<'a, T> {
    /// `[rows, k]`, row-major.
    pub x: &'a [f32],
    pub rows: usize,
    pub k: usize,
    /// `[k, PANEL]`.
    pub panel: &'a [T],
    pub out: *mut f32,
    pub ld: usize,
    pub cols: usize,
}
