//! Properties every codec must have, on seeded matrices: dequantized values lie on the format's
//! grid, the error is bounded by half a step (for elements that do not saturate), and quantizing
//! an already-quantized tensor is idempotent where the format implies it.
//!
//! Idempotent in codes but not always in the last bit of the values: `int8` and `fp8-*` (their
//! f32 scale is recomputed as fl(fl(k·s)/k), which is not always s).
//!
//! Not idempotent in general, so not asserted: `int4-*-asym` (the max element can land one step
//! low, which shrinks the recomputed range; seen on random data), `q6_k` (its searched scales move;
//! seen on random data), and `q4_1` / `q4_k` (their FP16 d and min are re-derived from rounded
//! values; they happen to be stable on random data, but nothing in the algorithm guarantees it).

// The deterministic matrices the GGML reference vectors were recorded from: one generator for
// both crates' tests.
#[path = "../../ggml/tests/common/mod.rs"]
mod common;

use common::matrix;
use qdrift_codecs::{
    Fp8Format, GgmlType, NF4_CODE, PackedPart, QuantizedMatrix, Scheme, error_stats, fp8_decode, fp8_encode, quantize,
};

/// Shapes that exercise whole groups, short last groups (200 = 6·32 + 8) and a tiny odd row.
const SHAPES: [(usize, usize); 3] = [(5, 256), (5, 200), (2, 33)];
const SEEDS: [u32; 3] = [1, 0xC0FFEE, 0xDEAD_BEEF];

fn inputs() -> impl Iterator<Item = (Vec<f32>, usize, usize)> {
    SEEDS.into_iter().flat_map(|seed| SHAPES.map(|(r, c)| (matrix(seed, r, c), r, c)))
}

fn part(q: &QuantizedMatrix, name: &str) -> PackedPart {
    q.parts().into_iter().find(|p| p.name == name).unwrap_or_else(|| panic!("no part {name}"))
}

fn f32s(p: &PackedPart) -> Vec<f32> {
    p.bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

fn f16s(p: &PackedPart) -> Vec<f32> {
    p.bytes.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Requantizes the dequantized tensor and checks that the stored bytes and values do not change.
fn assert_idempotent(scheme: Scheme, q: &QuantizedMatrix) {
    let once = q.dequantize();
    let again = quantize(&scheme, &once, q.rows(), q.cols()).expect("finite");
    assert_eq!(again.parts(), q.parts(), "{scheme}: stored bytes changed on requantization");
    assert_eq!(bits(&again.dequantize()), bits(&once), "{scheme}");
}

#[test]
fn fp16_bf16_error_and_idempotence() {
    for (w, rows, cols) in inputs() {
        for (scheme, unit) in [(Scheme::Fp16, 2f32.powi(-11)), (Scheme::Bf16, 2f32.powi(-8))] {
            let q = quantize(&scheme, &w, rows, cols).expect("finite");
            for (&x, &y) in w.iter().zip(&q.dequantize()) {
                // Half an ulp, relative (plus the binary16 subnormal spacing for tiny values).
                assert!((x - y).abs() <= x.abs() * unit + 2f32.powi(-25), "{scheme}: {x} -> {y}");
            }
            assert_idempotent(scheme, &q);
        }
    }
}

#[test]
fn int8_grid_error_and_idempotence() {
    for (w, rows, cols) in inputs() {
        let q = quantize(&Scheme::Int8, &w, rows, cols).expect("finite");
        let scales = f32s(&part(&q, "scales"));
        let codes = part(&q, "codes").bytes;
        let deq = q.dequantize();
        for i in 0..w.len() {
            let s = scales[i / cols];
            let code = codes[i] as i8;
            assert!((-127..=127).contains(&code));
            assert_eq!(deq[i], f32::from(code) * s, "on the grid");
            // |w − q·s| ≤ s/2, with a few ulps for the f32 division and product.
            assert!((w[i] - deq[i]).abs() <= s * 0.5 * (1.0 + 1e-5), "{} -> {}", w[i], deq[i]);
        }
        // Codes are stable, but the f32 scale is recomputed as fl(fl(127·s)/127), which differs
        // from s in the last bit for ~0.8% of scales: values agree to within that ulp.
        let again = quantize(&Scheme::Int8, &deq, rows, cols).expect("finite");
        assert_eq!(part(&again, "codes").bytes, codes, "int8: codes changed");
        for (a, b) in again.dequantize().iter().zip(&deq) {
            assert!((a - b).abs() <= b.abs() * 2f32.powi(-22));
        }
    }
}

#[test]
fn int4_grid_error_and_idempotence() {
    for (w, rows, cols) in inputs() {
        for group in [32, 64, 128] {
            for asym in [false, true] {
                let scheme = Scheme::Int4 { group, asym };
                let q = quantize(&scheme, &w, rows, cols).expect("finite");
                let scales = f16s(&part(&q, "scales"));
                let deq = q.dequantize();
                let groups = cols.div_ceil(group);
                let zeros = if asym { Some(part(&q, "zeros").bytes) } else { None };
                for i in 0..w.len() {
                    let (r, c) = (i / cols, i % cols);
                    let s = scales[r * groups + c / group];
                    if s == 0.0 {
                        assert_eq!(deq[i], 0.0);
                        continue;
                    }
                    let z = zeros.as_ref().map_or(0.0, |z| {
                        let byte = z[r * groups.div_ceil(2) + c / group / 2];
                        f32::from((byte >> (4 * ((c / group) % 2))) & 0x0F)
                    });
                    // On the grid: w'/s + z is an integer in the code range.
                    let level = deq[i] / s + z;
                    assert_eq!(level, level.round(), "{scheme}: off grid");
                    let (lo, hi) = if asym { (0.0, 15.0) } else { (-8.0, 7.0) };
                    assert!((lo..=hi).contains(&level), "{scheme}: {level}");
                    // Half a step unless the element saturated at the end of the code range.
                    let ideal = w[i] / s + z;
                    if (lo..=hi).contains(&ideal.round_ties_even()) {
                        assert!((w[i] - deq[i]).abs() <= s * 0.5 * (1.0 + 1e-5), "{scheme}");
                    }
                }
                if !asym {
                    assert_idempotent(scheme, &q);
                }
            }
        }
    }
}

#[test]
fn fp8_grid_error_and_idempotence() {
    for (w, rows, cols) in inputs() {
        for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
            let (mantissa_bits, min_subnormal) = match format {
                Fp8Format::E4M3 => (3, 2f32.powi(-9)),
                Fp8Format::E5M2 => (2, 2f32.powi(-16)),
            };
            for per_tensor in [false, true] {
                let scheme = Scheme::Fp8 { format, per_tensor };
                let q = quantize(&scheme, &w, rows, cols).expect("finite");
                let scales = f32s(&part(&q, "scales"));
                let codes = part(&q, "codes").bytes;
                let deq = q.dequantize();
                for i in 0..w.len() {
                    let s = if per_tensor { scales[0] } else { scales[i / cols] };
                    let v = fp8_decode(format, codes[i]);
                    assert!(v.is_finite() && v.abs() <= format.max_finite());
                    assert_eq!(deq[i], v * s, "on the grid");
                    if s == 0.0 {
                        continue;
                    }
                    // Round to nearest: relative half-ulp in the normal range, half the smallest
                    // subnormal below it (slack for the f32 division w/s).
                    let t = w[i] / s;
                    let bound = (t.abs() * 2f32.powi(-(mantissa_bits + 1))).max(min_subnormal / 2.0);
                    assert!((t - v).abs() <= bound * (1.0 + 1e-5), "{scheme}: {t} -> {v}");
                }
                // Codes are stable; the scale is recomputed as fl(fl(max·s)/max), which differs from
                // s in the last bit for some scales, so values are compared to within that ulp.
                let again = quantize(&scheme, &deq, rows, cols).expect("finite");
                assert_eq!(part(&again, "codes").bytes, codes, "{scheme}: codes changed");
                for (a, b) in again.dequantize().iter().zip(&deq) {
                    assert!((a - b).abs() <= b.abs() * 2f32.powi(-22), "{scheme}");
                }
            }
        }
    }
}

#[test]
fn fp8_encode_is_nearest_on_random_values() {
    let mut rng = common::Rng::new(99);
    for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
        let grid: Vec<f32> = (0..=255u8).map(|c| fp8_decode(format, c)).filter(|v| v.is_finite()).collect();
        for _ in 0..20_000 {
            let x = rng.normalish() * 2f32.powi((rng.next_u32() % 40) as i32 - 20);
            let got = fp8_decode(format, fp8_encode(format, x));
            let clamped = x.clamp(-format.max_finite(), format.max_finite());
            let best = grid.iter().map(|g| (g - clamped).abs()).fold(f32::INFINITY, f32::min);
            assert_eq!((got - clamped).abs(), best, "{format:?}: {x} -> {got}");
        }
    }
}

#[test]
fn nf4_grid_nearest_and_idempotence() {
    for (w, rows, cols) in inputs() {
        let scheme = Scheme::Nf4 { block: 64 };
        let q = quantize(&scheme, &w, rows, cols).expect("finite");
        let absmax = f32s(&part(&q, "scales"));
        let deq = q.dequantize();
        let blocks = cols.div_ceil(64);
        for i in 0..w.len() {
            let a = absmax[(i / cols) * blocks + (i % cols) / 64];
            assert!(NF4_CODE.iter().any(|&c| c * a == deq[i]), "off grid");
            if a > 0.0 {
                // The chosen code is the nearest one (thresholds are f32 midpoints: 1e-6 slack).
                let x = w[i] * (1.0 / a);
                let chosen = (deq[i] / a - x).abs();
                let best = NF4_CODE.iter().map(|c| (c - x).abs()).fold(f32::INFINITY, f32::min);
                assert!(chosen <= best + 1e-6, "{x}: {chosen} vs {best}");
            }
        }
        assert_idempotent(scheme, &q);
    }
}

/// The GGML scale `d` of block `b` as (f32 value computed by the quantizer, FP16 stored).
fn q8_like_d(w: &[f32], b: usize, divisor: f32) -> (f32, f32) {
    let amax = w[32 * b..32 * b + 32].iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / divisor;
    (d, half::f16::from_f32(d).to_f32())
}

#[test]
fn ggml_32_blocks_error_bounds_and_idempotence() {
    for (w, rows, cols) in inputs() {
        if cols % 32 != 0 {
            continue; // falls back to f32, covered in ggml_vectors.rs
        }
        for ty in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Mxfp4] {
            let scheme = Scheme::Ggml(ty);
            let q = quantize(&scheme, &w, rows, cols).expect("finite");
            let deq = q.dequantize();
            for b in 0..w.len() / 32 {
                let xs = &w[32 * b..32 * b + 32];
                let ys = &deq[32 * b..32 * b + 32];
                match ty {
                    GgmlType::Q8_0 => {
                        // Quantized with the f32 d, dequantized with the FP16 d.
                        let (d, d16) = q8_like_d(w.as_slice(), b, 127.0);
                        for (x, y) in xs.iter().zip(ys) {
                            assert_eq!((y / d16).fract(), 0.0, "q8_0 off grid");
                            assert!((x - y).abs() <= d / 2.0 + 127.0 * (d - d16).abs() + d * 1e-5);
                        }
                    }
                    GgmlType::Q4_0 => {
                        let (d, d16) = q8_like_d(w.as_slice(), b, 8.0);
                        for (x, y) in xs.iter().zip(ys) {
                            let level = y / d16;
                            assert!(level.fract() == 0.0 && (-8.0..=8.0).contains(&level.abs()));
                            // The element opposite the max may saturate: one full step.
                            assert!((x - y).abs() <= d + 8.0 * (d - d16).abs() + d * 1e-5);
                        }
                    }
                    GgmlType::Q4_1 => {
                        let min = xs.iter().fold(f32::MAX, |m, &v| m.min(v));
                        let max = xs.iter().fold(-f32::MAX, |m, &v| m.max(v));
                        let d = (max - min) / 15.0;
                        let d16 = half::f16::from_f32(d).to_f32();
                        let m16 = half::f16::from_f32(min).to_f32();
                        for (x, y) in xs.iter().zip(ys) {
                            let bound = d / 2.0 + 15.0 * (d - d16).abs() + (min - m16).abs();
                            assert!((x - y).abs() <= bound * (1.0 + 1e-5) + 1e-30, "q4_1 {x} -> {y}");
                        }
                    }
                    GgmlType::Mxfp4 => {
                        // Nearest point of the scaled E2M1 grid (values above 6·2^(E−2) saturate).
                        let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                        let d = 2f32.powi(amax.log2().floor() as i32 - 3);
                        let grid = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0].map(|k| k * 2.0 * d);
                        for (x, y) in xs.iter().zip(ys) {
                            assert!(grid.contains(&y.abs()), "mxfp4 off grid: {y}");
                            let best = grid.iter().map(|g| (g - x.abs()).abs()).fold(f32::INFINITY, f32::min);
                            assert_eq!((x - y).abs(), best, "mxfp4 not nearest: {x} -> {y}");
                        }
                    }
                    _ => unreachable!(),
                }
            }
            if ty != GgmlType::Q4_1 {
                assert_idempotent(scheme, &q);
            }
        }
    }
}

#[test]
fn k_quants_error_is_small() {
    // Per-row SQNR of gaussian-like rows with outliers: ~6 dB per bit is the rule of thumb.
    // Rows of magnitude ~1e-5 (row 4 of `matrix`) are skipped: their super-block scale `d` falls
    // in FP16's subnormal range and loses precision — a property of the format, which ggml shares
    // (the reference hashes in ggml_vectors.rs include such rows).
    for seed in SEEDS {
        let (rows, cols) = (5, 512);
        let w = matrix(seed, rows, cols);
        for (ty, min_db) in [(GgmlType::Q4K, 18.0), (GgmlType::Q6K, 28.0)] {
            let q = quantize(&Scheme::Ggml(ty), &w, rows, cols).expect("finite");
            let deq = q.dequantize();
            for r in (0..rows).filter(|r| common::ROW_SCALES[r % 5] > 1e-4) {
                let row = r * cols..(r + 1) * cols;
                let stats = error_stats(&w[row.clone()], &deq[row]);
                assert!(stats.sqnr_db > min_db, "{ty} row {r}: {:.1} dB", stats.sqnr_db);
                assert!(stats.cosine > 0.99, "{ty} row {r}: cosine {}", stats.cosine);
            }
        }
    }
}

#[test]
fn more_bits_means_less_error() {
    let (rows, cols) = (5, 512);
    let w = matrix(5, rows, cols);
    let sqnr = |name: &str| {
        let q = quantize(&name.parse().expect("known"), &w, rows, cols).expect("finite");
        error_stats(&w, &q.dequantize()).sqnr_db
    };
    assert!(sqnr("fp16") > sqnr("bf16"));
    assert!(sqnr("bf16") > sqnr("int8"));
    assert!(sqnr("int8") > sqnr("int4-g32"));
    assert!(sqnr("q8_0") > sqnr("q6_k"));
    assert!(sqnr("q6_k") > sqnr("q4_k"));
    assert!(sqnr("int4-g32") > sqnr("int4-g128"));
    assert!(sqnr("fp8-e4m3") > sqnr("fp8-e5m2"));
}
