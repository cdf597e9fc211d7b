//! The feed-forward layer's SwiGLU on host values, with the operations and roundings of Burn's
//! `silu(gate) * up` on the CPU backend.

use half::f16;
use half::slice::HalfFloatSliceExt;

use super::elem::round_f16;

/// `up[i] ← silu(gate[i]) · up[i]` on host values, with the operations and roundings of Burn's
/// `silu(gate) * up` on the flex backend: `silu(g) = g · sigmoid(g)`, the sigmoid as flex's
/// `sigmoid_f32`, each result rounded to f16 in an f16 model, so both give the same values.
///
/// In an f16 model `gate` holds f16 values, so `round(g · round(sigmoid(g)))` takes one of 2¹⁶
/// values: it is looked up ([`silu_f16_table`], built once with the same operations), and the
/// product with `up[i]`, two f16 values, is exact in f32 before its rounding. The same bits as
/// computing it, without an `expf` call and a division per element.
pub(crate) fn swiglu(gate: &[f32], up: &mut [f32], f16: bool) {
    if f16 {
        let table = silu_f16_table();
        let mut bits = [f16::ZERO; 256];
        for (g, u) in gate.chunks(256).zip(up.chunks_mut(256)) {
            let h = &mut bits[..g.len()];
            h.convert_from_f32_slice(g);
            for (uv, hv) in u.iter_mut().zip(h.iter()) {
                *uv *= table[usize::from(hv.to_bits())];
            }
            round_f16(u);
        }
        return;
    }
    for (u, &g) in up.iter_mut().zip(gate) {
        *u *= silu_host(g, false);
    }
}

/// `silu(g) = g · sigmoid(g)` as flex computes it, rounded to f16 after each operation when
/// `f16`.
fn silu_host(g: f32, f16: bool) -> f32 {
    let r = |v: f32| if f16 { f16::from_f32(v).to_f32() } else { v };
    let sigmoid = |x: f32| {
        if x >= 0.0 {
            1.0 / (1.0 + (-x).exp())
        } else {
            let e = x.exp();
            e / (1.0 + e)
        }
    };
    r(g * r(sigmoid(g)))
}

/// [`silu_host`] in f16 of every f16 value, indexed by its bits.
fn silu_f16_table() -> &'static [f32] {
    static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| (0..=u16::MAX).map(|b| silu_host(f16::from_bits(b).to_f32(), true)).collect())
}
