//! stories260K written as quantized Hugging Face folders (GPTQ v1/v2 4- and 8-bit with and
//! without act order, AWQ GEMM, compressed-tensors pack-/int-/float-quantized, FP8 per tensor
//! and in blocks) by `write_hf_quantized` and read back by `qdrift_load::open_model`: the weights
//! equal qdrift's schemes' dequantized weights bit for bit (f32 equality), unquantized tensors
//! stay FP16, and the declared activation quantization is carried. Also checks the loader's
//! OFP8 decoding against `fp8_decode` on every code.

use std::path::{Path, PathBuf};

use qdrift_load::ofp8::Ofp8;
use qdrift_load::{
    ActivationFormat, ActivationGranularity, CheckpointActivations, HostModel, Llama2cTokenizer, open_model,
    read_llama2c_checkpoint,
};
use qdrift_quantize::{
    Fp8Format, HfLayout, QuantizeOptions, Scheme, fp8_decode, quantize_model, round_to_fp16_reference,
    write_hf_quantized,
};

fn stories() -> PathBuf {
    std::env::var_os("QDRIFT_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"))
        .join("models/stories260K")
}

fn reference() -> (HostModel, Llama2cTokenizer) {
    let dir = stories();
    let mut model = read_llama2c_checkpoint(&dir.join("stories260K.bin")).expect("stories260K");
    round_to_fp16_reference(&mut model);
    (model, Llama2cTokenizer::read(&dir.join("tok512.bin")).expect("tok512"))
}

/// Writes `layout`, reads it back, asserts the read model is what the writer says and returns
/// it with its activations.
fn round_trip(layout: HfLayout) -> (HostModel, Option<CheckpointActivations>, String) {
    let (model, tok) = reference();
    let dir = tempfile::tempdir().expect("tempdir");
    let expected = write_hf_quantized(dir.path(), &model, &tok, layout).expect("written");
    let loaded = open_model(dir.path(), None).unwrap_or_else(|e| panic!("{layout:?}: {e}"));
    if let Some(diff) = first_difference(&loaded.model, &expected) {
        panic!("{layout:?}: read-back weights differ from the packed ones: {diff}");
    }
    let q = loaded.quantization.expect("quantization reported");
    (loaded.model, q.activations, q.weights)
}

/// The first tensor (and index) where two models' weights differ (bit patterns); the
/// architecture's name differs between a llama2.c model and an HF folder, so it is not compared.
fn first_difference(a: &HostModel, b: &HostModel) -> Option<String> {
    let mut a = a.clone();
    let mut tensors_b = Vec::new();
    b.clone().for_each_tensor_mut(|t| tensors_b.push(t.clone()));
    let mut i = 0;
    let mut diff = None;
    a.for_each_tensor_mut(|t| {
        let other = &tensors_b[i];
        if diff.is_none() {
            if t.shape != other.shape {
                diff = Some(format!("tensor #{i}: shape {:?} vs {:?}", t.shape, other.shape));
            } else if let Some(k) = t.data.iter().zip(&other.data).position(|(x, y)| x.to_bits() != y.to_bits()) {
                diff = Some(format!("tensor #{i} {:?}, index {k}: {} vs {}", t.shape, t.data[k], other.data[k]));
            }
        }
        i += 1;
    });
    diff.or_else(|| (i != tensors_b.len()).then(|| format!("{i} vs {} tensors", tensors_b.len())))
}

fn same(a: &HostModel, b: &HostModel) -> bool {
    first_difference(a, b).is_none()
}

fn scheme(s: Scheme) -> HostModel {
    quantize_model(&reference().0, &s, &QuantizeOptions::default()).expect("quantizes").dequantized
}

/// Only the attention projections are packable in GPTQ 4-bit (hidden 172 is not a multiple of
/// 8): the expected model is the scheme on attention, FP16 elsewhere.
fn attention_only(s: Scheme) -> HostModel {
    let mut want = scheme(s);
    for (w, r) in want.layers.iter_mut().zip(reference().0.layers) {
        w.ffn = r.ffn;
    }
    want
}

/// AWQ packs along the output: every layer but gate/up (172 outputs).
fn all_but_gate_up(s: Scheme) -> HostModel {
    let mut want = scheme(s);
    for (w, r) in want.layers.iter_mut().zip(reference().0.layers) {
        {
            let (wm, rm) = (w.mlp_mut().expect("dense"), r.mlp().expect("dense"));
            (wm.gate, wm.up) = (rm.gate.clone(), rm.up.clone());
        }
    }
    want
}

#[test]
fn compressed_tensors_equal_qdrift_schemes() {
    let cases = [
        (HfLayout::CtPacked { bits: 4, group: 64, asym: false }, Scheme::Int4 { group: 64, asym: false }),
        (HfLayout::CtPacked { bits: 4, group: 32, asym: true }, Scheme::Int4 { group: 32, asym: true }),
        (HfLayout::CtPacked { bits: 8, group: 0, asym: false }, Scheme::Int8),
        (HfLayout::CtInt8 { activations: false }, Scheme::Int8),
        (HfLayout::CtFp8 { activations: false }, Scheme::Fp8 { format: Fp8Format::E4M3, per_tensor: false }),
    ];
    for (layout, s) in cases {
        let layout = match layout {
            HfLayout::CtPacked { bits: 8, asym, .. } => HfLayout::CtPacked { bits: 8, group: 1, asym },
            other => other,
        };
        let (model, acts, _) = round_trip(layout);
        assert!(same(&model, &scheme(s)), "{layout:?} differs from {s}");
        assert_eq!(acts, None);
    }
}

#[test]
fn compressed_tensors_activations_are_carried() {
    let (_, acts, name) = round_trip(HfLayout::CtInt8 { activations: true });
    let token = ActivationGranularity::Token;
    assert_eq!(acts, Some(CheckpointActivations { format: ActivationFormat::Int8, granularity: token }));
    assert_eq!(name, "compressed-tensors int-quantized int8 per channel");
    let (_, acts, _) = round_trip(HfLayout::CtFp8 { activations: true });
    assert_eq!(acts, Some(CheckpointActivations { format: ActivationFormat::Fp8E4M3, granularity: token }));
    // llm-compressor's FP8_BLOCK activations: per token and group, the group read from the config.
    let (model, acts, _) = round_trip(HfLayout::CtFp8TokenGroup { group: 4 });
    let group = ActivationGranularity::TokenGroup(4);
    assert_eq!(acts, Some(CheckpointActivations { format: ActivationFormat::Fp8E4M3, granularity: group }));
    assert!(same(&model, &scheme(Scheme::Fp8 { format: Fp8Format::E4M3, per_tensor: false })));
}

#[test]
fn gptq_equals_qdrift_schemes() {
    // 8 bits packs every layer (64 and 172 are multiples of 4): int8 exactly.
    for v2 in [false, true] {
        let layout = HfLayout::Gptq { bits: 8, group: None, asym: false, act_order: false, v2 };
        let (model, _, _) = round_trip(layout);
        assert!(same(&model, &scheme(Scheme::Int8)), "{layout:?}");
    }
    // 4 bits: attention only.
    let layout = HfLayout::Gptq { bits: 4, group: Some(32), asym: false, act_order: false, v2: false };
    let (model, _, name) = round_trip(layout);
    assert!(same(&model, &attention_only(Scheme::Int4 { group: 32, asym: false })));
    assert_eq!(name, "gptq 4-bit g32 v1");
    let layout = HfLayout::Gptq { bits: 4, group: Some(16), asym: true, act_order: false, v2: false };
    let (model, _, _) = round_trip(layout);
    assert!(same(&model, &attention_only(Scheme::Int4 { group: 16, asym: true })));
}

#[test]
fn gptq_act_order_reads_groups_through_g_idx() {
    // Groups follow a permuted column order, so the weights differ from plain int4-g16 and
    // equal what the writer computed from the permuted columns (asserted in round_trip).
    for asym in [false, true] {
        let layout = HfLayout::Gptq { bits: 4, group: Some(16), asym, act_order: true, v2: true };
        let (model, _, _) = round_trip(layout);
        assert!(model != attention_only(Scheme::Int4 { group: 16, asym }));
    }
}

#[test]
fn awq_equals_int4_asym_where_packable() {
    let (model, _, name) = round_trip(HfLayout::Awq { group: 32 });
    assert!(same(&model, &all_but_gate_up(Scheme::Int4 { group: 32, asym: true })));
    assert_eq!(name, "awq 4-bit g32");
}

#[test]
fn fp8_checkpoints() {
    let (model, acts, _) = round_trip(HfLayout::Fp8 { block: None });
    assert!(same(&model, &scheme(Scheme::Fp8 { format: Fp8Format::E4M3, per_tensor: true })));
    let tensor = ActivationGranularity::Tensor;
    assert_eq!(acts, Some(CheckpointActivations { format: ActivationFormat::Fp8E4M3, granularity: tensor }));
    // Blocks of 32: 172 rows and columns end in partial blocks.
    let (model, acts, name) = round_trip(HfLayout::Fp8 { block: Some(32) });
    assert_eq!(name, "fp8 e4m3 block 32x32");
    assert_eq!(acts.map(|a| a.granularity), Some(ActivationGranularity::TokenGroup(32)));
    assert!(!same(&model, &reference().0));
}

#[test]
fn load_ofp8_decoding_equals_the_quantizer_codec() {
    for code in 0..=255u8 {
        for (ours, theirs) in [(Ofp8::E4M3, Fp8Format::E4M3), (Ofp8::E5M2, Fp8Format::E5M2)] {
            let (a, b) = (ours.decode(code), fp8_decode(theirs, code));
            assert!(a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()), "{theirs:?} {code:#04x}: {a} vs {b}");
        }
    }
}
