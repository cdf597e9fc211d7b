//! How far a dequantized tensor is from its reference, in f64.
//!
//! - SQNR (signal-to-quantization-noise ratio) `= 10 log10(Σ ref² / Σ (ref − approx)²)` dB;
//!   `+inf` when the approximation is exact (including an all-zero reference reproduced
//!   exactly), `-inf` when the reference is all zero but the approximation is not.
//! - relative Frobenius error `= ‖ref − approx‖₂ / ‖ref‖₂`; 0 when exact, `+inf` when the
//!   reference is all zero but the approximation is not.
//! - cosine similarity `= ⟨ref, approx⟩ / (‖ref‖₂ ‖approx‖₂)`, clamped to `[-1, 1]` (the f64
//!   division of two nearly equal tensors can land one ulp above 1); 1 when both are all zero, 0
//!   when exactly one is.

use crate::error::QuantizeError;

/// Error of an approximation against its reference.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ErrorStats {
    /// Signal-to-quantization-noise ratio in dB (higher is better).
    pub sqnr_db: f64,
    /// `‖ref − approx‖ / ‖ref‖` (lower is better).
    pub rel_frobenius: f64,
    /// Cosine similarity (1 is best).
    pub cosine: f64,
}

/// Error statistics of `approx` against `reference`, computed in f64.
///
/// # Shapes
/// - `reference`, `approx`: the same length (any shape, flattened).
///
/// When the lengths differ every field is NaN; use [`try_error_stats`] for a typed error.
pub fn error_stats(reference: &[f32], approx: &[f32]) -> ErrorStats {
    try_error_stats(reference, approx).unwrap_or(ErrorStats {
        sqnr_db: f64::NAN,
        rel_frobenius: f64::NAN,
        cosine: f64::NAN,
    })
}

/// [`error_stats`], with a length mismatch reported as [`QuantizeError::LengthMismatch`]
/// (`rows` = 1, `cols` = `reference.len()`).
pub fn try_error_stats(reference: &[f32], approx: &[f32]) -> Result<ErrorStats, QuantizeError> {
    if reference.len() != approx.len() {
        return Err(QuantizeError::LengthMismatch {
            len: approx.len(),
            rows: 1,
            cols: reference.len(),
            expected: reference.len(),
        });
    }
    let (mut signal, mut noise, mut dot, mut approx_energy) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
    for (&r, &a) in reference.iter().zip(approx) {
        let (r, a) = (f64::from(r), f64::from(a));
        signal += r * r;
        noise += (r - a) * (r - a);
        dot += r * a;
        approx_energy += a * a;
    }
    let sqnr_db = if noise == 0.0 { f64::INFINITY } else { 10.0 * (signal / noise).log10() };
    let rel_frobenius = if noise == 0.0 { 0.0 } else { (noise / signal).sqrt() };
    let cosine = match (signal == 0.0, approx_energy == 0.0) {
        (true, true) => 1.0,
        (true, false) | (false, true) => 0.0,
        (false, false) => (dot / (signal.sqrt() * approx_energy.sqrt())).clamp(-1.0, 1.0),
    };
    Ok(ErrorStats { sqnr_db, rel_frobenius, cosine })
}

#[cfg(test)]
mod tests {
    use super::{error_stats, try_error_stats};

    /// Tensors equal up to rounding give a cosine of at most 1: `[0.1; 3]` against itself scaled
    /// by `1 + 2⁻²³` computes `⟨r, a⟩ / (‖r‖ ‖a‖)` one ulp above 1 in f64 before the clamp.
    #[test]
    fn cosine_is_never_above_one() {
        let r = [0.1f32, 0.1, 0.1];
        let a = r.map(|x| x * (1.0 + f32::EPSILON));
        assert!(error_stats(&r, &a).cosine <= 1.0);
        for n in 1..200 {
            let r: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let a: Vec<f32> = r.iter().map(|x| x * 1.0001).collect();
            let c = error_stats(&r, &a).cosine;
            assert!((0.9999..=1.0).contains(&c), "{n}: {c}");
        }
    }

    #[test]
    fn exact_copy() {
        let s = error_stats(&[1.0, -2.0, 3.0], &[1.0, -2.0, 3.0]);
        assert_eq!(s.sqnr_db, f64::INFINITY);
        assert_eq!(s.rel_frobenius, 0.0);
        assert!((s.cosine - 1.0).abs() < 1e-15);
    }

    #[test]
    fn hand_computed() {
        // ref = (3, 4), approx = (3, 3): Σref² = 25, noise = 1 -> SQNR = 10·log10(25) dB,
        // rel = 1/5, cosine = (9 + 12) / (5 · √18).
        let s = error_stats(&[3.0, 4.0], &[3.0, 3.0]);
        assert!((s.sqnr_db - 10.0 * 25f64.log10()).abs() < 1e-12);
        assert!((s.rel_frobenius - 0.2).abs() < 1e-15);
        assert!((s.cosine - 21.0 / (5.0 * 18f64.sqrt())).abs() < 1e-15);
        // Negated approximation: cosine −1, noise = 4·Σref² -> SQNR = −10·log10(4).
        let n = error_stats(&[1.0, 2.0], &[-1.0, -2.0]);
        assert!((n.cosine + 1.0).abs() < 1e-15);
        assert!((n.sqnr_db + 10.0 * 4f64.log10()).abs() < 1e-12);
        assert!((n.rel_frobenius - 2.0).abs() < 1e-15);
    }

    #[test]
    fn zero_reference_and_length_mismatch() {
        let z = error_stats(&[0.0, 0.0], &[0.0, 0.0]);
        assert_eq!((z.sqnr_db, z.rel_frobenius, z.cosine), (f64::INFINITY, 0.0, 1.0));
        let nz = error_stats(&[0.0, 0.0], &[1.0, 0.0]);
        assert_eq!((nz.sqnr_db, nz.rel_frobenius, nz.cosine), (f64::NEG_INFINITY, f64::INFINITY, 0.0));
        assert!(error_stats(&[1.0], &[1.0, 2.0]).sqnr_db.is_nan());
        assert!(try_error_stats(&[1.0], &[1.0, 2.0]).is_err());
    }
}
