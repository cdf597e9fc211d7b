//! Scheme names, errors, storage accounting and the packed parts of every scheme.

// The deterministic matrices the GGML reference vectors were recorded from: one generator for
// both crates' tests.
#[path = "../../ggml/tests/common/mod.rs"]
mod common;

use common::matrix;
use qdrift_codecs::{Fp8Format, GgmlType, PackedDtype, QuantizeError, Scheme, quantize};

const CLI_NAMES: [&str; 24] = [
    "fp16",
    "bf16",
    "int8",
    "int4-g32",
    "int4-g64",
    "int4-g128",
    "int4-g32-asym",
    "int4-g64-asym",
    "int4-g128-asym",
    "fp8-e4m3",
    "fp8-e5m2",
    "fp8-e4m3-tensor",
    "fp8-e5m2-tensor",
    "nf4-g64",
    "q8_0",
    "q4_0",
    "q4_1",
    "q5_0",
    "q4_k",
    "q6_k",
    "mxfp4",
    "mxfp4-ocp",
    "mxfp4-ct",
    "nvfp4",
];

#[test]
fn names_round_trip_in_cli_order() {
    let names: Vec<String> = Scheme::all().iter().map(Scheme::to_string).collect();
    assert_eq!(names, CLI_NAMES);
    for scheme in Scheme::all() {
        assert_eq!(scheme.to_string().parse::<Scheme>(), Ok(scheme));
        let text = scheme.describe();
        assert!(text.ends_with('.') && text.len() > 20, "{scheme}: {text}");
    }
    assert_eq!("int4-g128-asym".parse(), Ok(Scheme::Int4 { group: 128, asym: true }));
    assert_eq!("fp8-e5m2-tensor".parse(), Ok(Scheme::Fp8 { format: Fp8Format::E5M2, per_tensor: true }));
    assert_eq!("q4_k".parse(), Ok(Scheme::Ggml(GgmlType::Q4K)));
}

#[test]
fn unknown_name_lists_the_known_ones() {
    let err = "int3".parse::<Scheme>().unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("unknown scheme \"int3\" (did you mean int8?); known: {}", CLI_NAMES.join(", "))
    );
    let err = "bogus".parse::<Scheme>().unwrap_err();
    assert_eq!(err.to_string(), format!("unknown scheme \"bogus\"; known: {}", CLI_NAMES.join(", ")));
    assert!("".parse::<Scheme>().is_err());
    assert!("Q4_K".parse::<Scheme>().is_err()); // names are exact
}

/// A mistyped name gets the one it probably meant; llama.cpp's file types are explained.
#[test]
fn unknown_names_get_a_hint() {
    let hint = |name: &str| name.parse::<Scheme>().unwrap_err().to_string();
    assert!(hint("int4_g128").contains("(did you mean int4-g128?)"), "{}", hint("int4_g128"));
    assert!(hint("INT8").contains("(did you mean int8?)"));
    let q4km = hint("q4_k_m");
    assert!(q4km.contains("llama.cpp's Q4_K_M is a file type"), "{q4km}");
    assert!(q4km.contains("the scheme q4_k rounds every linear layer"), "{q4km}");
    assert!(q4km.contains("--variant"), "{q4km}");
    assert!(hint("q3_k_s").contains("qdrift has no q3_k scheme"), "{}", hint("q3_k_s"));
}

#[test]
fn bad_input_is_a_typed_error_not_a_panic() {
    let w = [1.0f32; 6];
    assert_eq!(
        quantize(&Scheme::Int8, &w, 2, 4),
        Err(QuantizeError::LengthMismatch { len: 6, rows: 2, cols: 4, expected: 8 })
    );
    assert_eq!(
        quantize(&Scheme::Int8, &w, usize::MAX, 2),
        Err(QuantizeError::ShapeOverflow { rows: usize::MAX, cols: 2 })
    );
    let mut bad = w;
    bad[4] = f32::NAN;
    for scheme in Scheme::all() {
        match quantize(&scheme, &bad, 2, 3) {
            Err(QuantizeError::NonFinite { index: 4, row: 1, col: 1, value }) => assert!(value.is_nan()),
            other => panic!("{scheme}: {other:?}"),
        }
    }
    bad[4] = f32::NEG_INFINITY;
    let err = quantize(&Scheme::Fp16, &bad, 2, 3).unwrap_err();
    assert_eq!(err.to_string(), "weight 4 (row 1, col 1) is -inf; quantization needs finite weights");
    assert_eq!(
        quantize(&Scheme::Int4 { group: 0, asym: false }, &w, 2, 3),
        Err(QuantizeError::ZeroGroup { scheme: "int4-g0".into() })
    );
    assert!(matches!(quantize(&Scheme::Nf4 { block: 0 }, &w, 2, 3), Err(QuantizeError::ZeroGroup { .. })));
}

#[test]
fn empty_matrices_are_fine() {
    for scheme in Scheme::all() {
        for (rows, cols) in [(0, 0), (0, 64), (3, 0)] {
            let q = quantize(&scheme, &[], rows, cols).expect("empty is valid");
            assert!(q.dequantize().is_empty(), "{scheme}");
            assert_eq!(q.bits_per_weight(), 0.0);
        }
    }
}

fn dtype_size(dtype: PackedDtype) -> usize {
    match dtype {
        PackedDtype::U8 | PackedDtype::I8 | PackedDtype::F8E4M3 | PackedDtype::F8E5M2 => 1,
        PackedDtype::F16 | PackedDtype::BF16 => 2,
        PackedDtype::F32 | PackedDtype::I32 => 4,
        PackedDtype::I64 => 8,
    }
}

#[test]
fn parts_add_up_to_storage_bytes() {
    for (rows, cols) in [(4, 256), (3, 200), (1, 7), (3, 0), (0, 64)] {
        let w = matrix(11, rows, cols);
        for scheme in Scheme::all() {
            let q = quantize(&scheme, &w, rows, cols).expect("finite");
            let parts = q.parts();
            let total: usize = parts.iter().map(|p| p.bytes.len()).sum();
            assert_eq!(total, q.storage_bytes(), "{scheme} {rows}x{cols}");
            for p in &parts {
                let elements: usize = p.shape.iter().product();
                assert_eq!(elements * dtype_size(p.dtype), p.bytes.len(), "{scheme} {}", p.name);
            }
            assert_eq!(q.dequantize().len(), rows * cols);
            assert_eq!((q.rows(), q.cols(), q.scheme()), (rows, cols, scheme));
        }
    }
}

#[test]
fn bits_per_weight() {
    let (rows, cols) = (4, 512);
    let w = matrix(3, rows, cols);
    let bpw = |name: &str| {
        let scheme: Scheme = name.parse().expect("known");
        quantize(&scheme, &w, rows, cols).expect("finite").bits_per_weight()
    };
    assert_eq!(bpw("fp16"), 16.0);
    assert_eq!(bpw("bf16"), 16.0);
    assert_eq!(bpw("int8"), 8.0 + 32.0 / cols as f64);
    assert_eq!(bpw("int4-g32"), 4.0 + 16.0 / 32.0);
    assert_eq!(bpw("int4-g128"), 4.125);
    // Asymmetric: + a 4-bit zero point per group (cols / 128 = 4 groups: an even count per row).
    assert_eq!(bpw("int4-g128-asym"), 4.0 + 20.0 / 128.0);
    assert_eq!(bpw("fp8-e4m3"), 8.0 + 32.0 / cols as f64);
    assert_eq!(bpw("fp8-e5m2-tensor"), 8.0 + 32.0 / (rows * cols) as f64);
    assert_eq!(bpw("nf4-g64"), 4.5);
    assert_eq!(bpw("q8_0"), 8.5);
    assert_eq!(bpw("q4_0"), 4.5);
    assert_eq!(bpw("q4_1"), 5.0);
    assert_eq!(bpw("q4_k"), 4.5);
    assert_eq!(bpw("q6_k"), 6.5625);
    assert_eq!(bpw("mxfp4"), 4.25);
    // int8 on a narrow matrix: the per-row scale weighs more.
    let q = quantize(&Scheme::Int8, &matrix(3, 2, 64), 2, 64).expect("finite");
    assert_eq!(q.bits_per_weight(), 8.0 + 32.0 / 64.0);
}
