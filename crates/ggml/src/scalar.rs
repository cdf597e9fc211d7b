//! ggml's scalar helpers that every block format shares: `nearest_int`, the C conversion of a
//! float to an integer as x86-64 executes it, and fp16 as little-endian bytes (`ggml-impl.h`,
//! `ggml-quants.c`).

use half::f16;

/// ggml's `nearest_int` (`ggml-quants.c`): adding 1.5·2^23 puts the rounded integer in the low
/// mantissa bits, so it rounds half to even for |x| < 2^22. Kept bit for bit, including what it
/// returns outside that range (where ggml only has a debug `assert`).
pub(crate) fn nearest_int(fval: f32) -> i32 {
    let val = fval + 12_582_912.0;
    (val.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// C's conversion of a float to an integer type as x86-64 builds of ggml execute it
/// (`cvttss2si`): truncation toward zero, and the "integer indefinite" `i32::MIN` for NaN and for
/// values outside the i32 range. ISO C leaves those cases undefined; they arise only in blocks whose
/// largest magnitude is so small (below ~1e-38) that `1/d` overflows. Callers narrow the result
/// with `as i8` / `as u8`, keeping the low byte as the C assignment to `int8_t` / `uint8_t` does.
pub(crate) fn c_float_to_int(x: f32) -> i32 {
    if x.is_nan() || !(-2_147_483_648.0..2_147_483_648.0).contains(&x) { i32::MIN } else { x as i32 }
}

/// `GGML_FP32_TO_FP16` as little-endian bytes: IEEE binary16 with round-to-nearest-even, which is
/// what both `ggml_compute_fp32_to_fp16` and F16C `_cvtss_sh(x, 0)` compute (see the test).
pub(crate) fn fp16_bytes(x: f32) -> [u8; 2] {
    f16::from_f32(x).to_le_bytes()
}

/// `GGML_FP16_TO_FP32` of two little-endian bytes (exact).
pub(crate) fn fp16_value(bytes: [u8; 2]) -> f32 {
    f16::from_le_bytes(bytes).to_f32()
}
