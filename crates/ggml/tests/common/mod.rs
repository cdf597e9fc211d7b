//! Deterministic inputs shared by the integration tests. The generator uses only exact integer
//! operations and IEEE-rounded f32 conversions and products, so the same matrices were produced
//! bit for bit by the script that recorded the GGML reference vectors.

#![allow(dead_code)] // each test binary uses a different subset

/// xorshift32 (Marsaglia 2003), seeded.
pub struct Rng(u32);

impl Rng {
    pub fn new(seed: u32) -> Self {
        Rng(seed)
    }

    pub fn next_u32(&mut self) -> u32 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.0 = x;
        x
    }

    /// Roughly normal (Irwin–Hall of 4 uniforms), std ≈ 1.15, in [−4, 4): the sum is exact in
    /// integers, then converted to f32 (rounding to nearest even) and scaled by 2^-23 (exact).
    pub fn normalish(&mut self) -> f32 {
        let s: i64 = (0..4).map(|_| i64::from(self.next_u32() >> 8)).sum::<i64>() - (1 << 25);
        s as f32 * 2f32.powi(-23)
    }
}

/// Row scales cycle through these, so a matrix mixes tiny, typical and large rows.
pub const ROW_SCALES: [f32; 5] = [0.02, 1.0, 0.003, 150.0, 1e-5];

/// A `[rows, cols]` test matrix; every 97th element (offset 13) is an 8× outlier.
pub fn matrix(seed: u32, rows: usize, cols: usize) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..rows * cols)
        .map(|i| {
            let v = rng.normalish() * ROW_SCALES[(i / cols) % ROW_SCALES.len()];
            if i % 97 == 13 { v * 8.0 } else { v }
        })
        .collect()
}

/// FNV-1a, 64-bit.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// FNV-1a of the little-endian bytes of f32 values (bit patterns, so -0.0 and NaN count).
pub fn fnv1a_f32(values: &[f32]) -> u64 {
    fnv1a(&values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())
}

/// Decodes a hex string (whitespace ignored).
pub fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    digits
        .chunks_exact(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).expect("ascii"), 16).expect("hex digit"))
        .collect()
}
