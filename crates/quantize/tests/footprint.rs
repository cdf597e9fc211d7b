//! `Scheme::storage_bytes` (bytes from the shape alone) against the bytes each codec stores, and
//! the weight memory `qdrift inspect` derives from it, by hand for stories260K and SmolLM2-135M.

// The deterministic matrices the GGML reference vectors were recorded from.
#[path = "../../ggml/tests/common/mod.rs"]
mod common;

use common::matrix;
use qdrift_load::inspect::{Fp32, Inspection, WeightStorage, inspect};
use qdrift_load::{ArchShape, ModelArch, synthetic_arch};
use qdrift_quantize::{GgmlError, GgmlType, KvQuant, QuantizeError, Scheme, SchemeFootprint, quantize};

#[test]
fn storage_bytes_is_what_every_codec_stores() {
    // Even and odd columns, whole and partial groups and GGML blocks (200 and 7 fall back to
    // F16, 576 to Q4_K's and Q6_K's fallbacks), empty matrices.
    for (rows, cols) in [(4, 256), (3, 200), (1, 7), (2, 33), (5, 576), (3, 0), (0, 64)] {
        let w = matrix(5, rows, cols);
        for scheme in Scheme::all() {
            let stored = quantize(&scheme, &w, rows, cols).expect("finite").storage_bytes();
            assert_eq!(scheme.storage_bytes(rows as u64, cols as u64), Ok(stored as u64), "{scheme} {rows}x{cols}");
        }
    }
}

#[test]
fn zero_groups_are_refused_as_quantize_refuses_them() {
    for scheme in [Scheme::Int4 { group: 0, asym: false }, Scheme::Nf4 { block: 0 }] {
        let refused = QuantizeError::ZeroGroup { scheme: scheme.to_string() };
        assert_eq!(scheme.storage_bytes(2, 8), Err(refused.clone()));
        assert_eq!(SchemeFootprint::new(scheme), Err(refused.clone()));
        assert_eq!(quantize(&scheme, &[0.0; 16], 2, 8).map(|q| q.storage_bytes()), Err(refused));
    }
}

#[test]
fn read_only_ggml_types_are_refused_as_quantize_refuses_them() {
    for ty in GgmlType::READABLE.into_iter().filter(|t| !t.has_quantizer()) {
        let scheme = Scheme::Ggml(ty);
        let refused = QuantizeError::Ggml(GgmlError::NoQuantizer { ty });
        assert_eq!(scheme.storage_bytes(2, 256), Err(refused.clone()));
        assert_eq!(SchemeFootprint::new(scheme), Err(refused.clone()));
        assert_eq!(quantize(&scheme, &[0.0; 512], 2, 256).map(|q| q.storage_bytes()), Err(refused));
        assert!(!Scheme::all().contains(&scheme), "{scheme} is listed");
        // Its name parses to no scheme, or (`nvfp4`, GGUF type 40) to another format's scheme
        // of that name, never to the read-only type.
        assert_ne!(scheme.to_string().parse::<Scheme>().ok(), Some(scheme), "{scheme} parses");
        assert!(scheme.describe().contains("cannot quantize"), "{scheme}");
        // Nor can a hand-built KV-cache format use one.
        let e = KvQuant::Ggml(ty).check_row(2, 128).unwrap_err();
        assert_eq!(e, QuantizeError::Ggml(GgmlError::NoQuantizer { ty }));
        let mut row = [0.0f32; 256];
        assert_eq!(KvQuant::Ggml(ty).round_host(&mut row, 128), Err(e));
    }
}

#[test]
fn every_listed_scheme_has_a_footprint_under_its_cli_name() {
    let all = SchemeFootprint::all();
    assert_eq!(all.iter().map(|f| f.scheme()).collect::<Vec<_>>(), Scheme::all());
    for f in &all {
        assert_eq!(SchemeFootprint::new(f.scheme()).as_ref(), Ok(f));
        assert_eq!(f.name(), f.scheme().to_string());
        assert_eq!(f.vector_bytes(), 2, "norms stay FP16");
    }
}

/// stories260K (README of shared/models/stories260K).
fn stories_arch() -> ModelArch {
    let shape = ArchShape {
        dim: 64,
        hidden_dim: 172,
        n_layers: 5,
        n_heads: 8,
        n_kv_heads: 4,
        head_dim: 8,
        vocab_size: 512,
        max_seq_len: 512,
    };
    ModelArch { tied_embeddings: true, ..ModelArch::new("llama", shape) }
}

/// `inspect` of `arch` under fp32 and every scheme.
fn inspect_all(arch: &ModelArch) -> Inspection {
    let footprints = SchemeFootprint::all();
    let mut storages: Vec<&dyn WeightStorage> = vec![&Fp32];
    storages.extend(footprints.iter().map(|f| f as &dyn WeightStorage));
    inspect(arch, &[], false, 256, 1, &storages).expect("fits in 64 bits")
}

fn bytes_of(i: &Inspection, scheme: &str) -> u64 {
    i.weight_bytes.iter().find(|s| s.scheme == scheme).expect("scheme").bytes
}

#[test]
fn stories260k_weight_memory_by_hand() {
    let i = inspect_all(&stories_arch());
    let names: Vec<&str> = i.weight_bytes.iter().map(|s| s.scheme.as_str()).collect();
    assert_eq!(names[0], "fp32");
    assert_eq!(names.len(), 1 + Scheme::all().len());
    // Linears per layer: wq 64·64 + wk 32·64 + wv 32·64 + wo 64·64 + 3 · 172·64 = 45,312 values,
    // 64 + 32 + 32 + 64 + 172 + 172 + 64 = 600 rows; two norms of 64 per layer, final norm 64.
    let linears = 4096 + 2048 + 2048 + 4096 + 3 * 11008;
    assert_eq!(bytes_of(&i, "fp32"), 4 * 260_032);
    assert_eq!(bytes_of(&i, "fp16"), 2 * 260_032);
    assert_eq!(bytes_of(&i, "bf16"), 2 * 260_032);
    // INT8: values + a 4-byte scale per row of every matrix; norms at 2 bytes.
    let int8_layer = (4096 + 4 * 64) + 2 * (2048 + 4 * 32) + (4096 + 4 * 64) // q, k, v, o
        + 2 * (11008 + 4 * 172) + (11008 + 4 * 64) // gate, up ([172, 64]); down ([64, 172])
        + 2 * 2 * 64; // norms
    let int8 = (32768 + 4 * 512) + 5 * int8_layer + 2 * 64;
    assert_eq!(int8, 274_784);
    assert_eq!(bytes_of(&i, "int8"), int8);
    // FP8 per output channel: the same layout as INT8 (a byte per value, an f32 per row).
    assert_eq!(bytes_of(&i, "fp8-e4m3"), 32768 + 4 * 512 + 5 * (linears + 4 * 600 + 2 * 2 * 64) + 2 * 64);
    assert_eq!(bytes_of(&i, "fp8-e4m3"), int8);
    // FP8 per tensor: values + one 4-byte scale per matrix (embedding + 7 per layer).
    let fp8_tensor = 32768 + 4 + 5 * (linears + 7 * 4 + 2 * 2 * 64) + 2 * 64;
    assert_eq!(bytes_of(&i, "fp8-e4m3-tensor"), fp8_tensor);
    assert_eq!(bytes_of(&i, "fp8-e5m2-tensor"), fp8_tensor);
    // INT4 g32: rows·cols/2 code bytes + 2 bytes per 32 values of a row.
    //   cols 64 → 2 groups/row, cols 172 → ⌈172/32⌉ = 6 groups/row.
    let g = |rows: u64, cols: u64, groups: u64| rows * cols / 2 + 2 * rows * groups;
    let int4_layer = g(64, 64, 2) + 2 * g(32, 64, 2) + g(64, 64, 2) + 2 * g(172, 64, 2) + g(64, 172, 6) + 4 * 64;
    assert_eq!(bytes_of(&i, "int4-g32"), g(512, 64, 2) + 5 * int4_layer + 2 * 64);
    // INT4 g128: cols 64 → 1 group, cols 172 → 2 groups.
    let int4_layer = g(64, 64, 1) + 2 * g(32, 64, 1) + g(64, 64, 1) + 2 * g(172, 64, 1) + g(64, 172, 2) + 4 * 64;
    assert_eq!(bytes_of(&i, "int4-g128"), g(512, 64, 1) + 5 * int4_layer + 2 * 64);
    // Q8_0 blocks rows of 64 (2 blocks of 34 bytes); rows of 172 are not whole blocks of 32 and
    // q8_0 has no fallback type: F16 (w_down).
    let q8 = |rows: u64, cols: u64| rows * cols / 32 * 34;
    let q8_layer = q8(64, 64) + 2 * q8(32, 64) + q8(64, 64) + 2 * q8(172, 64) + 2 * 64 * 172 + 4 * 64;
    assert_eq!(bytes_of(&i, "q8_0"), q8(512, 64) + 5 * q8_layer + 2 * 64);
    // Q4_K: rows of 64 are not whole 256-blocks; llama.cpp's fallback Q5_0 (22 bytes per 32)
    // blocks them; rows of 172 fit neither: F16.
    let q5 = |rows: u64, cols: u64| rows * cols / 32 * 22;
    let q4k_layer = q5(64, 64) + 2 * q5(32, 64) + q5(64, 64) + 2 * q5(172, 64) + 2 * 64 * 172 + 4 * 64;
    assert_eq!(bytes_of(&i, "q4_k"), q5(512, 64) + 5 * q4k_layer + 2 * 64);
}

#[test]
fn smollm2_q4_k_and_q6_k_fall_back_as_llama_cpp_and_stay_below_fp16() {
    // SmolLM2-135M: dim 576 = 2.25 · 256, so every matrix with 576-wide rows (q, k, v, o, gate,
    // up) stores Q4_K's fallback Q5_0 (5.5 bits/weight); down_proj's 1536-wide rows are 6 whole
    // 256-blocks of Q4_K (4.5 bits/weight). Q6_K falls back to Q8_0 (8.5) and keeps 6.5625.
    let arch = synthetic_arch("smollm2-135m").expect("preset");
    let i = inspect_all(&arch);
    let (q4k, q6k) = (Scheme::Ggml(GgmlType::Q4K), Scheme::Ggml(GgmlType::Q6K));
    assert_eq!(q4k.storage_bytes(1536, 576), Ok(1536 * 18 * 22));
    assert_eq!(q4k.storage_bytes(576, 1536), Ok(576 * 6 * 144));
    assert_eq!(q6k.storage_bytes(1536, 576), Ok(1536 * 18 * 34));
    assert_eq!(q6k.storage_bytes(576, 1536), Ok(576 * 6 * 210));
    let w = matrix(9, 4, 576);
    for (scheme, stored, bits) in [(q4k, "q5_0", 5.5), (q6k, "q8_0", 8.5)] {
        let q = quantize(&scheme, &w, 4, 576).expect("finite");
        assert!(q.fell_back());
        assert_eq!(q.stored_name(), stored);
        assert_eq!(q.bits_per_weight(), bits);
    }
    // Per layer: q, o [576, 576]; k, v [192, 576]; gate, up [1536, 576]; down [576, 1536]; two
    // norms of 576 at 2 bytes. inspect sizes every matrix with the scheme, the (tied) embedding
    // [49152, 576] included.
    let layer = |narrow: &dyn Fn(u64, u64) -> u64, wide: &dyn Fn(u64, u64) -> u64| {
        2 * narrow(576, 576) + 2 * narrow(192, 576) + 2 * narrow(1536, 576) + wide(576, 1536) + 2 * 2 * 576
    };
    let q5 = |r: u64, c: u64| r * c / 32 * 22;
    let q4 = |r: u64, c: u64| r * c / 256 * 144;
    assert_eq!(bytes_of(&i, "q4_k"), q5(49152, 576) + 30 * layer(&q5, &q4) + 2 * 576);
    let q8 = |r: u64, c: u64| r * c / 32 * 34;
    let q6 = |r: u64, c: u64| r * c / 256 * 210;
    assert_eq!(bytes_of(&i, "q6_k"), q8(49152, 576) + 30 * layer(&q8, &q6) + 2 * 576);
    let fp16 = bytes_of(&i, "fp16");
    assert!(bytes_of(&i, "q4_k") < fp16 && bytes_of(&i, "q6_k") < fp16);
    // Bits per weight of the matrices: was 32 (an f32 copy) for every 576-wide matrix.
    let values = (134_515_008 - 61 * 576) as f64;
    let q4k_bits = (bytes_of(&i, "q4_k") - (61 * 576 * 2)) as f64 * 8.0 / values;
    assert!((5.2..5.4).contains(&q4k_bits), "{q4k_bits}");
}

#[test]
fn smollm2_135m_int4_g128_by_hand() {
    let i = inspect_all(&synthetic_arch("smollm2-135m").expect("preset"));
    assert_eq!(bytes_of(&i, "fp16"), 2 * 134_515_008);
    // INT4 g128: cols 576 → ⌈576/128⌉ = 5 groups per row (the last one of 64 values), 1536 → 12.
    let g = |rows: u64, cols: u64| rows * cols / 2 + 2 * rows * cols.div_ceil(128);
    assert_eq!(g(1, 576), 288 + 2 * 5);
    let int4_g128 = Scheme::Int4 { group: 128, asym: false };
    assert_eq!(int4_g128.storage_bytes(1536, 576), Ok(g(1536, 576)));
    let layer = 2 * g(576, 576) + 2 * g(192, 576) + 2 * g(1536, 576) + g(576, 1536) + 2 * 2 * 576;
    assert_eq!(bytes_of(&i, "int4-g128"), g(49152, 576) + 30 * layer + 2 * 576);
}
