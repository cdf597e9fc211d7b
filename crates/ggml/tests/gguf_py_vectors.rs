//! The read-only GGML types (q5_0, q5_1, q2_K, q3_K, q5_K, iq4_nl, iq4_xs, nvfp4) against vectors from
//! gguf-py, f32 bit pattern for bit pattern.
//!
//! Provenance: `gguf_py/generate.py` (gguf 0.19.0, numpy 2.4.6) wrote `gguf_py/<type>.txt`: seeded
//! random blocks with finite f16 scales (one subnormal `d` per type) and `gguf.quants.dequantize`
//! of them. gguf-py's numpy dequantizers compute each value with the same f32 operations, in the
//! same order, as ggml's C `dequantize_row_*` (a product `d · q`, or `(d · sc) · q`, then at most
//! one `+ m` / `− dmin · m`), so they are bit-exact with the C. That was also checked: the same
//! blocks through a transcription of `dequantize_row_{q5_0,q5_1,q2_K,q3_K,q5_K,iq4_nl,iq4_xs}`
//! from llama.cpp `ggml/src/ggml-quants.c`, compiled with `gcc -O2 -std=c11 -ffp-contract=off` on
//! x86-64, gave the same bits for every value. (nvfp4, added later, was checked against gguf-py
//! only: its `NVFP4.dequantize_blocks` is a product of the doubled E2M1 integer and the halved
//! UE4M3 scale, as `dequantize_row_nvfp4` is, both exact.)

mod common;

use common::hex;
use qdrift_ggml::{GgmlError, GgmlType, dequantize_ggml_blocks, quantize_ggml_blocks};

/// `(type, file)`: every read-only type and its vectors.
const VECTORS: [(GgmlType, &str); 8] = [
    (GgmlType::Q5_0, include_str!("gguf_py/q5_0.txt")),
    (GgmlType::Q5_1, include_str!("gguf_py/q5_1.txt")),
    (GgmlType::Q2K, include_str!("gguf_py/q2_k.txt")),
    (GgmlType::Q3K, include_str!("gguf_py/q3_k.txt")),
    (GgmlType::Q5K, include_str!("gguf_py/q5_k.txt")),
    (GgmlType::Iq4Nl, include_str!("gguf_py/iq4_nl.txt")),
    (GgmlType::Iq4Xs, include_str!("gguf_py/iq4_xs.txt")),
    (GgmlType::Nvfp4, include_str!("gguf_py/nvfp4.txt")),
];

/// The `(block bytes, f32 bit patterns)` records of a vector file.
fn records(text: &str) -> Vec<(Vec<u8>, Vec<u32>)> {
    let mut out = Vec::new();
    let mut lines = text.lines().filter(|l| !l.starts_with('#'));
    while let Some(block) = lines.next() {
        let block = hex(block.strip_prefix("block ").expect("a block line"));
        let values = lines.next().and_then(|l| l.strip_prefix("f32 ")).expect("an f32 line after each block");
        let bits = values.split(' ').map(|v| u32::from_str_radix(v, 16).expect("hex f32 bits")).collect();
        out.push((block, bits));
    }
    out
}

#[test]
fn read_only_types_match_gguf_py_bit_for_bit() {
    for (ty, text) in VECTORS {
        let records = records(text);
        assert!(records.len() >= 3, "{ty}: a few blocks");
        let mut all_bytes = Vec::new();
        let mut all_bits = Vec::new();
        for (i, (block, want)) in records.iter().enumerate() {
            assert_eq!(block.len(), ty.type_size(), "{ty} block {i}");
            assert_eq!(want.len(), ty.block_size(), "{ty} block {i}");
            let got = dequantize_ggml_blocks(ty, block, ty.block_size()).expect("one block");
            for (j, (g, w)) in got.iter().zip(want).enumerate() {
                assert_eq!(g.to_bits(), *w, "{ty} block {i} value {j}: {g:e} vs {:e}", f32::from_bits(*w));
            }
            all_bytes.extend_from_slice(block);
            all_bits.extend_from_slice(want);
        }
        // The blocks as one buffer (a row of several blocks) give the same values.
        let got = dequantize_ggml_blocks(ty, &all_bytes, all_bits.len()).expect("whole blocks");
        assert_eq!(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), all_bits, "{ty}");
    }
}

#[test]
fn read_only_types_by_hand() {
    // q5_0: d = 1.0 (0x3C00); qh bit j = fifth bit of element j. Element 0: low nibble 0xF,
    // fifth bit 1 -> 31 - 16 = 15; element 16: high nibble 0, fifth bit (qh bit 16) 0 -> -16.
    let mut b = vec![0x00, 0x3C, 0x01, 0x00, 0x00, 0x00, 0x0F];
    b.extend([0u8; 15]);
    let y = dequantize_ggml_blocks(GgmlType::Q5_0, &b, 32).unwrap();
    assert_eq!((y[0], y[1], y[16]), (15.0, -16.0, -16.0));

    // iq4_nl: d = 0.5 (0x3800); byte 0x0F -> kvalues[15] = 113 and kvalues[0] = -127.
    let mut b = vec![0x00, 0x38, 0x0F];
    b.extend([0x88u8; 15]);
    let y = dequantize_ggml_blocks(GgmlType::Iq4Nl, &b, 32).unwrap();
    assert_eq!((y[0], y[16], y[1], y[17]), (56.5, -63.5, 0.5, 0.5));

    // q3_K: every 6-bit scale 32 + 1 = 33 (low nibbles 1, high bits 2 -> 0b10_0001), d = 1:
    // dl = 1 · (33 − 32) = 1. qs = 0xFF (q = 3 at every shift), hmask = 0 (every element − 4):
    // every value 3 − 4 = −1.
    let mut b = vec![0u8; 32];
    b.extend([0xFFu8; 64]);
    b.extend([0x11u8; 8]);
    b.extend([0xAAu8; 4]);
    b.extend([0x00, 0x3C]);
    let y = dequantize_ggml_blocks(GgmlType::Q3K, &b, 256).unwrap();
    assert!(y.iter().all(|&v| v == -1.0), "{y:?}");
}

#[test]
fn read_only_types_refuse_to_quantize() {
    for ty in GgmlType::READABLE {
        assert_eq!(ty.has_quantizer(), GgmlType::ALL.contains(&ty), "{ty}");
        if !ty.has_quantizer() {
            let e = quantize_ggml_blocks(ty, &vec![0.0; ty.block_size()]).unwrap_err();
            assert_eq!(e, GgmlError::NoQuantizer { ty });
            // Refused before the length is looked at.
            assert_eq!(quantize_ggml_blocks(ty, &[0.0; 3]), Err(GgmlError::NoQuantizer { ty }));
        }
    }
    let e = quantize_ggml_blocks(GgmlType::Q5K, &[0.0; 256]).unwrap_err().to_string();
    assert_eq!(
        e,
        "q5_k is read-only: qdrift dequantizes it but has no quantizer for it; \
         quantizable: q8_0, q4_0, q4_1, q5_0, q4_k, q6_k, mxfp4"
    );
}

#[test]
fn sizes_and_ids_match_gguf_py() {
    // `GGML_QUANT_SIZES` and `GGMLQuantizationType` in gguf-py 0.19.0 `constants.py`:
    // (id, name, block size, type size).
    let want = [
        (2, "Q4_0", 32, 18),
        (3, "Q4_1", 32, 20),
        (6, "Q5_0", 32, 22),
        (7, "Q5_1", 32, 24),
        (8, "Q8_0", 32, 34),
        (10, "Q2_K", 256, 84),
        (11, "Q3_K", 256, 110),
        (12, "Q4_K", 256, 144),
        (13, "Q5_K", 256, 176),
        (14, "Q6_K", 256, 210),
        (20, "IQ4_NL", 32, 18),
        (23, "IQ4_XS", 256, 136),
        (39, "MXFP4", 32, 17),
        (40, "NVFP4", 64, 36),
    ];
    let got: Vec<_> =
        GgmlType::READABLE.iter().map(|t| (t.gguf_id(), t.gguf_name(), t.block_size(), t.type_size())).collect();
    assert_eq!(got, want);
    for ty in GgmlType::READABLE {
        assert_eq!(GgmlType::from_gguf_id(ty.gguf_id()), Some(ty));
        assert_eq!(ty.name(), ty.gguf_name().to_lowercase());
    }
    // IQ2_XXS, IQ1_S, TQ1_0: not readable.
    for id in [16, 19, 34] {
        assert_eq!(GgmlType::from_gguf_id(id), None);
    }
}
