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

use half::f16;
use qdrift_isa::Isa;
use rayon::prelude::*;

use super::elem::{Elem, is_f16_exact, round_f16};
use super::panels::{PANEL, PanelRows, pack_panels, unpack_panels};
use super::portable;
use super::threads::spreads;
#[cfg(target_arch = "x86_64")]
use super::{avx2, avx512};

/// Rows of `x` kept hot in cache while the panels stream past.
const ROW_CHUNK: usize = 64;
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
        self.forward_with(x, m, Isa::current())
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

    /// [`PackedLinear::forward`] with the kernels of `isa`, which the CPU must run (tests compare
    /// them).
    fn forward_with(&self, x: &[f32], m: usize, isa: Isa) -> Vec<f32> {
        assert_eq!(x.len(), m * self.inp, "x is [m, in]");
        debug_assert!(isa.runs_here(), "the {isa} kernels on a CPU that cannot run them");
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
                Panels::F32(w) => self.panels_range(w, x, first..first + count, out, isa),
                Panels::F16(w) => self.panels_range(w, x, first..first + count, out, isa),
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

    /// `panels` against all rows of `x` (`[m, in]`), written into their columns of `out`
    /// (`[m, out]`).
    fn panels_range<T: Elem>(&self, w: &[T], x: &[f32], panels: std::ops::Range<usize>, out: Out, isa: Isa) {
        let k = self.inp;
        let m = x.len() / k;
        for r0 in (0..m).step_by(ROW_CHUNK) {
            let rows = (m - r0).min(ROW_CHUNK);
            let xs = &x[r0 * k..(r0 + rows) * k];
            for p in panels.clone() {
                let panel = &w[p * k * PANEL..(p + 1) * k * PANEL];
                let (col, cols) = (p * PANEL, (self.out - p * PANEL).min(PANEL));
                // SAFETY: rows r0..r0 + rows < m and columns col..col + cols ≤ out of the
                // `[m, out]` buffer `out` points to, alive for the whole call (`forward_with`);
                // each task writes only its own panels' columns, so no two writes overlap. The
                // CPU runs `isa`, as `forward_with`'s caller promises.
                unsafe {
                    let dst = out.ptr.add(r0 * out.ld + col);
                    rows_times_panel(isa, PanelRows { x: xs, rows, k, panel, out: dst, ld: out.ld, cols });
                }
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

// SAFETY: an `Out` points into the buffer of one `forward_with` call, which outlives every task
// it is sent to; the pointer owns nothing, so moving it to another thread frees or moves nothing.
unsafe impl Send for Out {}
// SAFETY: the tasks sharing an `Out` only write through it, each the columns of its own panels,
// so no element is written by two threads or read by one while another writes it.
unsafe impl Sync for Out {}

/// `out[r·ld + c] = Σ_k x[r][k] · panel[k][c]` for `rows` rows and the first `cols ≤ PANEL`
/// columns, in the order the module doc states, by `isa`'s kernel.
///
/// # Shapes
/// - `x`: `[rows, k]`; `panel`: `[k, PANEL]`; `out`: `rows` rows of stride `ld`
///
/// # Safety
/// `out` must be valid for writes of `cols` values at `out + r·ld` for every `r < rows`; the CPU
/// runs `isa` (as every [`Isa`] the kernels are handed does: [`Isa::current`], or a test's
/// [`Isa::forced`] or [`Isa::runnable`]).
unsafe fn rows_times_panel<T: Elem>(isa: Isa, job: PanelRows<'_, T>) {
    let PanelRows { x, rows, k, panel, out, ld, cols } = job;
    assert!(x.len() >= rows * k && panel.len() >= k * PANEL && cols <= PANEL, "kernel operands too short");
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => {
            // SAFETY: the CPU runs AVX-512 (the caller's promise); operands as asserted above and
            // promised by the caller.
            unsafe { avx512::panel_rows(job) }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => {
            // SAFETY: as above, for AVX2.
            unsafe { avx2::panel_rows(job) }
        }
        _ => {
            for r in 0..rows {
                // SAFETY: the caller promises `cols` writable values at `out + r·ld`.
                let dst = unsafe { std::slice::from_raw_parts_mut(out.add(r * ld), cols) };
                portable::panel_row(&x[r * k..(r + 1) * k], panel, dst);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::threads::single_threaded;

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

    #[test]
    fn every_kernel_gives_the_definition_bit_for_bit() {
        // Odd widths: a partial last panel, row counts around both kernels' block sizes and the
        // row chunk, an input width that is no multiple of any vector width.
        let isas = Isa::runnable_reporting_skips("every_kernel_gives_the_definition_bit_for_bit");
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
                for &isa in &isas {
                    for spread in [false, true] {
                        // Through the dispatch: `forward` at the forced ISA, spread over the
                        // threads or not.
                        let run = || isa.forced(|| layer.forward(&x, m)).expect("a runnable ISA");
                        let got = if spread { run() } else { single_threaded(run) };
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
        let isas = Isa::runnable_reporting_skips("f16_exact_weights_are_stored_as_f16_with_bit_identical_results");
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
            for &isa in &isas {
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
