//! Rotary position embeddings on host values: the tables of [`crate::Rope`] applied in place,
//! with the operations and roundings of Burn's tensor ops, for the CPU path.

use qdrift_isa::Isa;

use super::elem::{round_f16, round_to_f16};

/// RoPE tables on the host (`Rope::host_tables`): `[batch, seq, pairs]` each.
#[derive(Debug)]
pub(crate) struct HostRope {
    cos: Vec<f32>,
    sin: Vec<f32>,
    pairs: usize,
    f16: bool,
}

impl HostRope {
    /// Tables from the cos and sin of every position × inverse frequency, rounded to f16 when
    /// `f16` (as uploading them in f16 rounds them).
    ///
    /// # Shapes
    /// - `cos`, `sin`: `[batch, seq, pairs]`, row-major, f32
    pub(crate) fn new(mut cos: Vec<f32>, mut sin: Vec<f32>, pairs: usize, f16: bool) -> Self {
        if f16 {
            round_f16(&mut cos);
            round_f16(&mut sin);
        }
        Self { cos, sin, pairs, f16 }
    }

    /// `Rope::apply` in place on host values: the same operations (`x0·cos − x1·sin`,
    /// `x0·sin + x1·cos` on each interleaved pair), each product and sum rounded to f16 in an
    /// f16 model as Burn's f16 tensor ops round them, so both give the same values.
    ///
    /// # Shapes
    /// - `x`: `[batch, seq, heads, 2 · pairs]`, row-major, `[batch, seq]` as the tables
    pub(crate) fn apply(&self, x: &mut [f32], heads: usize) {
        let hd = 2 * self.pairs;
        assert_eq!(x.len(), self.cos.len() / self.pairs.max(1) * heads * hd, "x does not match the tables");
        if !self.f16 {
            self.rotate(x, heads, |v| v);
            return;
        }
        // The f16 roundings are a dozen integer and float operations per value: compiled for
        // the widest vectors the ISA has. Each value's operations are the same at any width.
        match Isa::current() {
            // SAFETY: the CPU runs the current ISA, AVX-512 here.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { self.rotate_f16_avx512(x, heads) },
            // SAFETY: the CPU runs the current ISA, AVX2 here.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { self.rotate_f16_avx2(x, heads) },
            _ => self.rotate(x, heads, round_to_f16),
        }
    }

    /// [`HostRope::rotate`] with f16 rounding, compiled for AVX2.
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn rotate_f16_avx2(&self, x: &mut [f32], heads: usize) {
        self.rotate(x, heads, round_to_f16);
    }

    /// [`HostRope::rotate`] with f16 rounding, compiled for AVX-512.
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn rotate_f16_avx512(&self, x: &mut [f32], heads: usize) {
        self.rotate(x, heads, round_to_f16);
    }

    /// [`HostRope::apply`] with rounding `r`: inlined, branch-free (`round_to_f16` or the
    /// identity), so that the loop over a head's pairs vectorises.
    #[inline(always)]
    fn rotate(&self, x: &mut [f32], heads: usize, r: impl Fn(f32) -> f32) {
        let hd = 2 * self.pairs;
        let columns = self.cos.chunks_exact(self.pairs.max(1)).zip(self.sin.chunks_exact(self.pairs.max(1)));
        for (xs, (cos, sin)) in x.chunks_exact_mut(heads * hd).zip(columns) {
            for head in xs.chunks_exact_mut(hd) {
                for ((pair, &c), &s) in head.chunks_exact_mut(2).zip(cos).zip(sin) {
                    let (x0, x1) = (pair[0], pair[1]);
                    pair[0] = r(r(x0 * c) - r(x1 * s));
                    pair[1] = r(r(x0 * s) + r(x1 * c));
                }
            }
        }
    }
}
