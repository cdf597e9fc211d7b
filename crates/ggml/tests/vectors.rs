//! GGML block formats against ggml's reference quantizers, byte for byte.
//!
//! (`qdrift-quantize`'s `tests/ggml_vectors.rs` runs the same vectors through `Scheme::Ggml`.)
//!
//! Provenance of the expected values:
//! - `q8_0`, `q4_0`, `q4_1`, `mxfp4`: the literals were derived by hand from the C definitions
//!   (each test says how), then confirmed against the reference C.
//! - `q4_k`, `q6_k`: the all-zero and constant blocks were derived by reasoning through
//!   `make_qkx2_quants` / `make_qx_quants` (written out below); the ramp literals come from the
//!   reference C.
//! - The random matrices hash (FNV-1a 64) the input, the blocks and the dequantized f32 bits as
//!   produced by the reference C.
//!
//! - `q5_0` (llama.cpp's fallback for `q4_K` rows that are not whole 256-blocks): the hand vector
//!   is derived in its test; the random matrix's hashes come from the reference C, and gguf-py
//!   0.19.0's numpy `quants.quantize(…, Q5_0)` gives the same bytes for that matrix.
//!
//! "Reference C" = `quantize_row_{q8_0,q4_0,q4_1,q5_0,mxfp4,q4_K,q6_K}_ref`, `make_qkx2_quants`,
//! `make_qx_quants`, `nearest_int`, `dequantize_row_*` from llama.cpp `ggml/src/ggml-quants.c`,
//! `ggml_compute_fp32_to_fp16` / `ggml_compute_fp16_to_fp32` / `ggml_e8m0_to_fp32_half` from
//! `ggml/src/ggml-impl.h` and the block structs of `ggml/src/ggml-common.h`, compiled with
//! `gcc -O2 -std=c11 -ffp-contract=off` on x86-64 (glibc `log2f`).

mod common;

use common::{fnv1a, fnv1a_f32, hex, matrix};
use qdrift_ggml::{GgmlError, GgmlType, dequantize_ggml_blocks, quantize_ggml_blocks};

/// Quantizes one row and returns (block bytes, dequantized values).
fn ggml(ty: GgmlType, x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let bytes = quantize_ggml_blocks(ty, x).expect("whole blocks");
    assert_eq!(bytes.len(), x.len() / ty.block_size() * ty.type_size());
    let deq = dequantize_ggml_blocks(ty, &bytes, x.len()).expect("valid length");
    (bytes, deq)
}

#[test]
fn q8_0_hand_vector() {
    // amax = 127 -> d = 127/127 = 1.0 (FP16 0x3C00), id = 1. `roundf` rounds half AWAY from
    // zero: 63.5 -> 64, -63.5 -> -64, 0.5 -> 1, -0.5 -> -1, 1.5 -> 2, 2.5 -> 3. Then the exact
    // integers -12..=11. The second block is all zero: d = 0, id = 0, every byte 0.
    let mut x = vec![127.0, -127.0, 63.5, -63.5, 0.5, -0.5, 1.5, 2.5];
    x.extend((8..32).map(|j| (j - 20) as f32));
    x.extend([0.0; 32]);
    let (bytes, deq) = ggml(GgmlType::Q8_0, &x);
    let mut want = vec![0x00, 0x3C, 0x7F, 0x81, 0x40, 0xC0, 0x01, 0xFF, 0x02, 0x03];
    want.extend((-12i8..=11).map(|q| q as u8));
    want.extend([0u8; 34]);
    assert_eq!(bytes, want);
    assert_eq!(&deq[..8], &[127.0, -127.0, 64.0, -64.0, 1.0, -1.0, 2.0, 3.0]);
}

#[test]
fn q4_0_hand_vector() {
    // Block A: the value of largest magnitude is -8 -> d = -8 / -8 = 1.0 (0x3C00), id = 1,
    // q = min(15, trunc(x + 8.5)): -8 -> 0, -7.6 -> 0, -1.5 -> 7, -0.5 -> 8, 0 -> 8, 0.5 -> 9,
    // 1.5 -> 10, 7 -> 15, 7.4 -> 15, 7.9 -> 16 -> 15 (saturates), 3 -> 11, -3 -> 5, 2.5 -> 11,
    // -2.5 -> 6, 6.5 -> 15, -6.5 -> 2; second half: 1 -> 9, zeros -> 8, -1 -> 7.
    // Byte j = q[j] | q[j + 16] << 4.
    let mut x = vec![-8.0, -7.6, -1.5, -0.5, 0.0, 0.5, 1.5, 7.0, 7.4, 7.9, 3.0, -3.0, 2.5, -2.5, 6.5, -6.5];
    x.push(1.0);
    x.extend([0.0; 14]);
    x.push(-1.0);
    // Block B: largest magnitude is +4 (first of ±4) -> d = 4 / -8 = -0.5 (0xB800), id = -2:
    // 4 -> trunc(0.5) = 0, -4 -> 16 -> 15 (the negative extreme saturates at -3.5),
    // 1 -> 6, -0.25 -> 9, 0.25 -> 8, zeros -> 8.
    x.extend([4.0, -4.0, 1.0, -0.25, 0.25]);
    x.extend([0.0; 27]);
    let (bytes, deq) = ggml(GgmlType::Q4_0, &x);
    let want = hex("003c 9080 8788 8889 8a8f 8f8f 8b85 8b86 8f72
         00b8 808f 8689 8888 8888 8888 8888 8888 8888");
    assert_eq!(bytes, want);
    assert_eq!(&deq[..16], &[-8.0, -8.0, -1.0, 0.0, 0.0, 1.0, 2.0, 7.0, 7.0, 7.0, 3.0, -3.0, 3.0, -2.0, 7.0, -6.0]);
    assert_eq!(&deq[32..36], &[4.0, -3.5, 1.0, -0.5]);
    // (8 − 8) · −0.5 is −0.0 in C too.
    assert_eq!(deq[36].to_bits(), (-0.0f32).to_bits());
}

#[test]
fn q5_0_hand_vector() {
    // The ramp (j − 16) / 4: max = −4 (largest magnitude, first), d = −4 / −16 = 0.25 (FP16
    // 0x3400), id = 4, q = (int8_t)(x·4 + 16.5) = j (truncation of j + 0.5), so the 5-bit codes
    // are 0..=31: nibbles j & 15, fifth bits set for j ≥ 16 (qh = 0xFFFF0000). The second block is
    // all zero: d = 0, id = 0, q = (int8_t)16.5 = 16 for all (nibbles 0, qh = 0xFFFFFFFF).
    // Confirmed against the reference C.
    let mut x: Vec<f32> = (0..32).map(|j| (j - 16) as f32 / 4.0).collect();
    x.extend([0.0; 32]);
    let (bytes, deq) = ggml(GgmlType::Q5_0, &x);
    assert_eq!(
        bytes,
        hex("00340000ffff00112233445566778899aabbccddeeff
             0080ffffffff00000000000000000000000000000000")
    );
    assert_eq!(deq, x);
}

#[test]
fn q4_1_hand_vector() {
    // Block A: min -1, max 14 -> d = 15/15 = 1 (0x3C00), m = -1 (0xBC00), id = 1,
    // q = min(15, trunc(x + 1 + 0.5)): -1 -> 0, 14 -> 15, 0 -> 1, 0.5 -> 2, -0.5 -> 1, 6.5 -> 8,
    // 2.4 -> 3, 2.6 -> 4, 13.5 -> 15, 13.49 -> 14, 1..=6 -> 2..=7; second half zeros -> 1.
    // Block B: constant 2.5 -> d = 0 (id = 0, every q = 0), m = 2.5 (0x4100); dequantizes
    // exactly to 0·0 + 2.5.
    let mut x = vec![-1.0, 14.0, 0.0, 0.5, -0.5, 6.5, 2.4, 2.6, 13.5, 13.49, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    x.extend([0.0; 16]);
    x.extend([2.5; 32]);
    let (bytes, deq) = ggml(GgmlType::Q4_1, &x);
    let want = hex("003c 00bc 101f 1112 1118 1314 1f1e 1213 1415 1617
         0000 0041 0000 0000 0000 0000 0000 0000 0000 0000");
    assert_eq!(bytes, want);
    assert_eq!(&deq[..16], &[-1.0, 14.0, 0.0, 1.0, 0.0, 7.0, 2.0, 3.0, 14.0, 13.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert!(deq[32..].iter().all(|&v| v == 2.5));
}

#[test]
fn mxfp4_hand_vector() {
    // Block A: amax 6 -> floor(log2 6) = 2 -> e = 2 − 2 + 127 = 127 (0x7F),
    // d = e8m0_half(127) = 2^-1, so the grid is kvalues · 0.5 = E2M1 {0, .5, 1, 1.5, 2, 3, 4, 6}.
    // best_index keeps the FIRST index on ties (strict <), so ties go to the smaller magnitude
    // and ±0.25 go to index 0 (+0): 6 -> 7, -6 -> 15, 5 -> 6 (4), -5 -> 14 (-4), 2.5 -> 4 (2),
    // 0.25 -> 0, -0.25 -> 0, 1.25 -> 2 (1), 1.3 -> 3 (1.5), -1.3 -> 11, 3.5 -> 5 (3),
    // 0.75 -> 1 (.5), 0 -> 0, 4 -> 6, -3 -> 13, 0.5 -> 1; second half: 1 -> 2, zeros, -2 -> 12.
    // Block B: all zero -> e = 0, every index 0.
    let mut x = vec![6.0, -6.0, 5.0, -5.0, 2.5, 0.25, -0.25, 1.25, 1.3, -1.3, 3.5, 0.75, 0.0, 4.0, -3.0, 0.5];
    x.push(1.0);
    x.extend([0.0; 14]);
    x.push(-2.0);
    x.extend([0.0; 32]);
    let (bytes, deq) = ggml(GgmlType::Mxfp4, &x);
    let want = hex("7f 270f 060e 0400 0002 030b 0501 0006 0dc1
         00 0000 0000 0000 0000 0000 0000 0000 0000");
    assert_eq!(bytes, want);
    assert_eq!(&deq[..16], &[6.0, -6.0, 4.0, -4.0, 2.0, 0.0, 0.0, 1.0, 1.5, -1.5, 3.0, 0.5, 0.0, 4.0, -3.0, 0.5]);
    assert_eq!((deq[16], deq[31]), (1.0, -2.0));
}

#[test]
fn q4_k_zero_and_constant_blocks() {
    // All zero: make_qkx2_quants sees max == min == 0 and returns scale 0, the_min = -0.0, L = 0;
    // max_scale = max_min = 0, so every 6-bit scale/min is 0, d = dmin = FP16(0): 144 zero bytes.
    //
    // Constant 1.0: min is clamped to 0, iscale = 15, scale = fl(1/15); every L = 15 with zero
    // error. In the search every candidate puts all 32 values on one level, so
    // D = Σw·Σwl² − (Σwl)² = 0 exactly and nothing changes: each sub-block has scale fl(1/15),
    // min -0.0. Then inv_scale = 63/scale rounds to 945, ls = nearest_int(63.0000038) = 63, lm = 0:
    // scales[0..4] = 63 | (63 >> 4) << 6 = 0xFF, scales[4..8] = 0, scales[8..12] = 63 & 0xF = 0x0F.
    // d = FP16(fl(1/15) / 63) = 0x1456, dmin = 0. Requantizing 1/(d·63) ≈ 15.0 gives L = 15:
    // every qs byte is 0xFF.
    let mut x = vec![0.0; 256];
    x.extend([1.0; 256]);
    let (bytes, deq) = ggml(GgmlType::Q4K, &x);
    let mut want = vec![0u8; 144];
    want.extend(hex("5614 0000 ffffffff 00000000 0f0f0f0f"));
    want.extend([0xFF; 128]);
    assert_eq!(bytes, want);
    assert!(deq[..256].iter().all(|&v| v == 0.0));
    let d = half::f16::from_bits(0x1456).to_f32();
    assert!(deq[256..].iter().all(|&v| v == d * 63.0 * 15.0));
}

#[test]
fn q6_k_zero_and_constant_blocks() {
    // All zero: every make_qx_quants returns 0, max_abs_scale < GROUP_MAX_EPS, the block is
    // memset to 0 (210 zero bytes). Dequantizes to d·0·(0 − 32) = -0.0, as in C.
    //
    // Constant +1: make_qx_quants(nmax = 32): max = 1, iscale = -32, every l = -32 (L = 0),
    // w = x² = 1: sumlx = -512, suml2 = 16384, scale = -1/32, best = 16. Each candidate
    // iscale = -(32 + 0.1·is) puts all 16 values on one level l, where sumlx²/suml2 = 16 = best,
    // and the test is strict (>), so nothing changes. All 16 scales are -1/32: iscale = -128 / (-1/32)
    // = 4096, d = FP16(1/4096) = 0x0C00, each int8 scale = nearest_int(4096 · -1/32) = -128 (0x80),
    // and requantizing 1 / (2^-12 · -128) = -32 keeps L = 0: ql = qh = 0.
    // Dequantized: 2^-12 · -128 · (0 − 32) = 1 exactly.
    //
    // Constant -1: the same with every sign flipped except the codes: scale +1/32,
    // d = FP16(-1/4096) = 0x8C00, int8 scales still -128, L = 0; dequantizes to exactly -1.
    let mut x = vec![0.0; 256];
    x.extend([1.0; 256]);
    x.extend([-1.0; 256]);
    let (bytes, deq) = ggml(GgmlType::Q6K, &x);
    let mut want = vec![0u8; 210];
    for d in [[0x00, 0x0C], [0x00, 0x8C]] {
        want.extend([0u8; 192]);
        want.extend([0x80; 16]);
        want.extend(d);
    }
    assert_eq!(bytes, want);
    assert!(deq[..256].iter().all(|&v| v.to_bits() == (-0.0f32).to_bits()));
    assert!(deq[256..512].iter().all(|&v| v == 1.0));
    assert!(deq[512..].iter().all(|&v| v == -1.0));
}

/// The ramp (i − 128) / 64 for i in 0..256: exact values in [-2, 2).
fn ramp() -> Vec<f32> {
    (0..256).map(|i| (i - 128) as f32 / 64.0).collect()
}

#[test]
fn q4_k_ramp_matches_reference() {
    // From the reference C. Readable parts: qs starts 00 00 11 11 22 22 ...: each sub-block of
    // 32 ramp steps lands on 16 levels two by two; sub-blocks 0 and 1 share the bytes (low / high
    // nibble).
    let want = hex("32180c284f4fcfcf3f2f1f10000f000f0000111122223333444455556666777788889999aaaabbbbccccddddeeeeffff
         00101021213232434354546565767687879899a9aababbcbccdcddedeefeffff80808191929293a3a4a4a5b5b6b6b7c7
         c8c8c9d9dadadaebebececfdfdfefeffcacacacbcbcbcbcbdbdcdcdcdcdcdcddedededededeeeeeefefefefeffffffff");
    let (bytes, deq) = ggml(GgmlType::Q4K, &ramp());
    assert_eq!(bytes, want);
    // Each sub-block spans 31/64, a 4-bit step of 31/64/15. make_qkx2_quants minimizes a
    // weighted squared error, so it may clip a sub-block's extreme elements for the bulk: the
    // reference's worst element (index 248, last sub-block) is 1.88 steps off. Bound: 2 steps.
    let step = 31.0 / 64.0 / 15.0;
    for (x, y) in ramp().iter().zip(&deq) {
        assert!((x - y).abs() <= 2.0 * step, "{x} -> {y}");
    }
}

#[test]
fn q6_k_ramp_matches_reference() {
    let want = hex("00001011212131324242525363637374001010213131425252627373839494a400102131415262728393a3b4c4d4e5f5
         0020416181a2c2e30323446485a5c5e6606e5c5a474543313f2d2b1816140200505f4e4d4c3b3a392827261514130201
         4b4a4a393838272626251414130202014837373636252524241313121201010000000000000000000000000000000000
         000000000000000040404040404040400201010101010101000000000000000001000000000000000000000000000000
         8090a0b0c0d0e0f00f2031404f5f6f7ff78f");
    let (bytes, deq) = ggml(GgmlType::Q6K, &ramp());
    assert_eq!(bytes, want);
    // q6_K is symmetric per 16-element sub-block, scale ≈ max|x| / 32 ≤ 2/32: every element
    // within half of the largest step, 2/64 (the reference's worst is 0.0251).
    for (x, y) in ramp().iter().zip(&deq) {
        assert!((x - y).abs() <= 2.0 / 64.0, "{x} -> {y}");
    }
}

/// (type, generator seed, FNV of the input f32, FNV of the blocks, FNV of the dequantized f32),
/// for a 5 × 512 matrix from `common::matrix`, hashed from the reference C's output.
const RANDOM: [(GgmlType, u32, u64, u64, u64); 7] = [
    (GgmlType::Q8_0, 0x5eed003e, 0xb114f22fe3eb8707, 0xb71d05264778451b, 0x89856f8068c8982e),
    (GgmlType::Q4_0, 0x5eed002e, 0xced518bba6bd5e4a, 0xcdf8995e95e07c9d, 0xd1605da08c292c5f),
    (GgmlType::Q4_1, 0x5eed0030, 0xefdbaa845b05bd8d, 0x47b22396108783c7, 0xf7dad05b0614303b),
    (GgmlType::Q5_0, 0x5eed0050, 0x2fc0d0892b963f51, 0xff74e201fba836f2, 0x1c5d59de827b6cf3),
    (GgmlType::Mxfp4, 0x5eed0034, 0xadb815387491631d, 0x1ffdb6e76000d0f3, 0xc91125c3f726b301),
    (GgmlType::Q4K, 0x5eed00ac, 0xf7d610eba63b6b2a, 0x84ec80711d5a52b6, 0x7e1bb50efd69e729),
    (GgmlType::Q6K, 0x5eed00ee, 0x3ce91fb878a7552a, 0xbe4a307e18f1c789, 0x5e303f8c5bfa6ae3),
];

#[test]
fn random_matrices_match_reference_hashes() {
    for (ty, seed, input_hash, block_hash, deq_hash) in RANDOM {
        let x = matrix(seed, 5, 512);
        assert_eq!(fnv1a_f32(&x), input_hash, "{ty}: the test generator drifted");
        let (bytes, deq) = ggml(ty, &x);
        assert_eq!(bytes.len(), 5 * 512 / ty.block_size() * ty.type_size());
        assert_eq!(fnv1a(&bytes), block_hash, "{ty}: blocks differ from ggml");
        assert_eq!(fnv1a_f32(&deq), deq_hash, "{ty}: dequantized values differ from ggml");
    }
}

#[test]
fn first_block_of_row_one_matches_reference_bytes() {
    // The same matrices as above, one block spelled out per format to make a failure readable.
    let expected = [
        (GgmlType::Q8_0, "e024cff2e2b7e2deb6eb977f14e10101973503cee3120ef4440519c344ddaf3c3e90"),
        (GgmlType::Q4_0, "5bb574383caa888aa95a604479954ba79413"),
        (GgmlType::Q4_1, "3f357bc1fabc8e8ad0aa49e6b89389579950f4b8"),
        (GgmlType::Q5_0, "1c31c835c1f75dd9a8c4a0cb3172456602dc80459d2e"),
        (GgmlType::Mxfp4, "7e3cad930a30d4c49d34e901f60033ab00"),
    ];
    for (ty, want) in expected {
        let seed = RANDOM.iter().find(|r| r.0 == ty).map(|r| r.1).expect("listed");
        let x = matrix(seed, 5, 512);
        let (bytes, _) = ggml(ty, &x[512..544]);
        assert_eq!(bytes, hex(want), "{ty}");
    }
}

#[test]
fn rows_that_are_not_whole_blocks_fall_back_as_llama_cpp_does() {
    use qdrift_ggml::RowStorage;
    use qdrift_ggml::RowStorage::{Blocks, F16};
    // SmolLM2's 576-wide rows: 576 = 2.25 · 256 = 18 · 32.
    assert_eq!(RowStorage::for_row(GgmlType::Q4K, 576), Blocks(GgmlType::Q5_0));
    assert_eq!(RowStorage::for_row(GgmlType::Q6K, 576), Blocks(GgmlType::Q8_0));
    assert_eq!(RowStorage::for_row(GgmlType::Q4K, 1536), Blocks(GgmlType::Q4K));
    // The read-only K and IQ types follow llama.cpp's table too.
    assert_eq!(RowStorage::for_row(GgmlType::Q5K, 576), Blocks(GgmlType::Q5_1));
    assert_eq!(RowStorage::for_row(GgmlType::Q2K, 576), Blocks(GgmlType::Iq4Nl));
    assert_eq!(RowStorage::for_row(GgmlType::Q3K, 576), Blocks(GgmlType::Iq4Nl));
    assert_eq!(RowStorage::for_row(GgmlType::Iq4Xs, 576), Blocks(GgmlType::Iq4Nl));
    // stories260K's 172-wide FFN rows fit neither the type nor a fallback: F16.
    for ty in GgmlType::ALL {
        assert_eq!(RowStorage::for_row(ty, 172), F16, "{ty}");
        assert_eq!(RowStorage::for_row(ty, 512), Blocks(ty), "{ty}");
    }
    assert_eq!(RowStorage::for_row(GgmlType::Q4K, 64), Blocks(GgmlType::Q5_0));
    assert_eq!(F16.gguf_id(), 1);
    assert_eq!(F16.bytes_for(3, 172), Some(3 * 172 * 2));
    assert_eq!(Blocks(GgmlType::Q5_0).bytes_for(2, 576), Some(2 * 18 * 22));
    assert_eq!(F16.bytes_for(u64::MAX, 2), None);
}

#[test]
fn dequantize_ggml_blocks_validates_lengths() {
    assert_eq!(
        dequantize_ggml_blocks(GgmlType::Q4K, &[0; 144], 255),
        Err(GgmlError::PartialBlock { ty: GgmlType::Q4K, block: 256, n_elements: 255 })
    );
    assert_eq!(
        dequantize_ggml_blocks(GgmlType::Q8_0, &[0; 33], 32),
        Err(GgmlError::BlockBytes { ty: GgmlType::Q8_0, n_elements: 32, expected: 34, actual: 33 })
    );
    assert_eq!(dequantize_ggml_blocks(GgmlType::Q6K, &[], 0), Ok(vec![]));
    let text = dequantize_ggml_blocks(GgmlType::Mxfp4, &[0; 16], 32).unwrap_err().to_string();
    assert_eq!(text, "mxfp4 data for 32 elements must be 17 bytes, got 16");
}

#[test]
fn quantize_ggml_blocks_needs_whole_blocks() {
    assert_eq!(
        quantize_ggml_blocks(GgmlType::Q4_0, &[0.0; 40]),
        Err(GgmlError::PartialBlock { ty: GgmlType::Q4_0, block: 32, n_elements: 40 })
    );
    assert_eq!(quantize_ggml_blocks(GgmlType::Q6K, &[]), Ok(vec![]));
}

#[test]
fn gguf_ids_match_ggml_h() {
    // `GGML_TYPE_*` in ggml/include/ggml.h (= GGMLQuantizationType in gguf-py constants.py).
    let ids: Vec<u32> = GgmlType::ALL.iter().map(|t| t.gguf_id()).collect();
    assert_eq!(ids, [8, 2, 3, 6, 12, 14, 39]);
    for ty in GgmlType::ALL {
        assert_eq!(GgmlType::from_gguf_id(ty.gguf_id()), Some(ty));
    }
    assert_eq!(GgmlType::from_gguf_id(0), None); // F32: not a block format
    assert_eq!(GgmlType::from_gguf_id(16), None); // IQ2_XXS: not implemented
}
