//! The `Scheme::Ggml` wrapper around `qdrift-ggml`: the same block bytes and values as the codec
//! crate (whose own tests check them byte for byte against ggml's reference C), ggml's
//! fall-back for rows that are not a whole number of blocks, and the error mapping.

// The deterministic matrices the GGML reference vectors were recorded from: one generator for
// both crates' tests.
#[path = "../../ggml/tests/common/mod.rs"]
mod common;

use common::{fnv1a_f32, matrix};
use qdrift_codecs::{GgmlError, GgmlType, QuantizeError, RowStorage, Scheme, dequantize_ggml_blocks, quantize};

#[test]
fn wrapper_stores_exactly_the_codec_blocks() {
    for ty in GgmlType::ALL {
        let cols = 512;
        let x = matrix(11, 5, cols);
        let q = quantize(&Scheme::Ggml(ty), &x, 5, cols).expect("finite input");
        assert!(!q.fell_back(), "{ty}");
        let parts = q.parts();
        assert_eq!(parts.len(), 1, "{ty}");
        assert_eq!(parts[0].name, "blocks");
        let mut expected = Vec::new();
        for row in x.chunks(cols) {
            expected.extend(qdrift_ggml::quantize_ggml_blocks(ty, row).expect("whole blocks"));
        }
        assert_eq!(parts[0].bytes, expected, "{ty}");
        assert_eq!(parts[0].shape, vec![5, cols / ty.block_size() * ty.type_size()], "{ty}");
        let deq = q.dequantize();
        let again = dequantize_ggml_blocks(ty, &parts[0].bytes, x.len()).expect("valid length");
        assert_eq!(fnv1a_f32(&deq), fnv1a_f32(&again), "{ty}");
    }
}

#[test]
fn dequantize_ggml_blocks_validates_lengths() {
    assert_eq!(
        dequantize_ggml_blocks(GgmlType::Q4K, &[0; 144], 255),
        Err(QuantizeError::Ggml(GgmlError::PartialBlock { ty: GgmlType::Q4K, block: 256, n_elements: 255 }))
    );
    assert_eq!(
        dequantize_ggml_blocks(GgmlType::Q8_0, &[0; 33], 32),
        Err(QuantizeError::Ggml(GgmlError::BlockBytes {
            ty: GgmlType::Q8_0,
            n_elements: 32,
            expected: 34,
            actual: 33
        }))
    );
    assert_eq!(dequantize_ggml_blocks(GgmlType::Q6K, &[], 0), Ok(vec![]));
    let text = dequantize_ggml_blocks(GgmlType::Mxfp4, &[0; 16], 32).unwrap_err().to_string();
    assert_eq!(text, "mxfp4 data for 32 elements must be 17 bytes, got 16");
}

#[test]
fn cols_that_fit_no_block_fall_back_to_f16() {
    let x = matrix(7, 3, 40);
    for ty in GgmlType::ALL {
        let q = quantize(&Scheme::Ggml(ty), &x, 3, 40).expect("finite input");
        assert!(q.fell_back(), "{ty}");
        assert_eq!(q.stored(), Some(RowStorage::F16));
        let f16: Vec<f32> = x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect();
        assert_eq!(q.dequantize(), f16);
        assert_eq!(q.bits_per_weight(), 16.0);
        assert_eq!(q.parts()[0].name, "values");
        assert_eq!(q.gguf_bytes(), Some(q.parts()[0].bytes.clone()));
    }
    // 256 columns block fine for the 32-element formats.
    let q = quantize(&Scheme::Ggml(GgmlType::Q4_0), &matrix(7, 2, 256), 2, 256).expect("finite");
    assert!(!q.fell_back());
}

#[test]
fn k_quants_on_rows_of_whole_32_blocks_store_llama_cpp_fallback_blocks() {
    // 96 = 3 · 32: Q4_K stores Q5_0 blocks, Q6_K stores Q8_0 blocks, exactly those codecs' bytes.
    let x = matrix(11, 3, 96);
    for (ty, fallback) in [(GgmlType::Q4K, GgmlType::Q5_0), (GgmlType::Q6K, GgmlType::Q8_0)] {
        let q = quantize(&Scheme::Ggml(ty), &x, 3, 96).expect("finite");
        let direct = quantize(&Scheme::Ggml(fallback), &x, 3, 96).expect("finite");
        assert!(q.fell_back() && !direct.fell_back());
        assert_eq!(q.stored(), Some(RowStorage::Blocks(fallback)));
        assert_eq!(q.stored_name(), fallback.name());
        assert_eq!(q.gguf_bytes(), direct.gguf_bytes());
        assert_eq!(q.dequantize(), direct.dequantize());
        assert_eq!(q.storage_bytes(), direct.storage_bytes());
    }
}
