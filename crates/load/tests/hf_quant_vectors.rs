//! Quantized Hugging Face folders packed by an independent implementation (`hf_quant_py/`,
//! numpy transliterations of AutoGPTQ's, GPTQModel's, AutoAWQ's and compressed-tensors' packing
//! functions and of the FP8 block layout; see `generate.py`; and FP4 folders packed by
//! compressed-tensors 0.20.1 and nvidia-modelopt 0.47.0 themselves, see `generate_fp4.py`) read
//! by `open_model`: every linear layer equals the script's dequantization bit for bit, after the
//! reader's q/k permutation to the interleaved RoPE layout.

use std::path::Path;

use qdrift_load::{ActivationFormat, ActivationGranularity, CheckpointActivations, open_model, rotate_half_row_order};
use safetensors::SafeTensors;

const LINEARS: [&str; 7] = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
];

/// Reads `name`'s folder and compares each linear layer with `expected.safetensors`; returns
/// the reported weight format and activations.
fn check(name: &str) -> (String, Option<CheckpointActivations>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hf_quant_py").join(name);
    let loaded = open_model(&dir, None).unwrap_or_else(|e| panic!("{name}: {e}"));
    let bytes = std::fs::read(dir.join("expected.safetensors")).expect("expected.safetensors");
    let expected = SafeTensors::deserialize(&bytes).expect("safetensors");
    let arch = &loaded.model.arch;
    let layer = &loaded.model.layers[0];
    for (short, got) in layer.linears() {
        assert!(LINEARS.contains(&short.role));
        let t = expected.tensor(&format!("model.layers.0.{short}.weight")).expect("expected tensor");
        let want: Vec<f32> = t.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let (rows, cols) = (t.shape()[0], t.shape()[1]);
        assert_eq!(got.shape, [rows, cols], "{name} {short}");
        // Hugging Face row r is interleaved row order[r] for q and k.
        let heads = match short.role {
            "self_attn.q_proj" => Some(arch.n_heads),
            "self_attn.k_proj" => Some(arch.n_kv_heads),
            _ => None,
        };
        let order: Vec<usize> = heads.map_or_else(|| (0..rows).collect(), |h| rotate_half_row_order(h, rows / h));
        for (r, &o) in order.iter().enumerate() {
            for c in 0..cols {
                let (g, w) = (got.data[o * cols + c], want[r * cols + c]);
                assert_eq!(g.to_bits(), w.to_bits(), "{name} {short}[{r}, {c}]: {g} vs {w}");
            }
        }
    }
    let q = loaded.quantization.expect("a quantized folder");
    (q.weights, q.activations)
}

#[test]
fn gptq_v1_4bit_act_order() {
    assert_eq!(check("gptq_v1_4bit_desc_act").0, "gptq 4-bit g16 v1");
}

#[test]
fn gptq_v2_8bit_asymmetric() {
    assert_eq!(check("gptq_v2_8bit_asym").0, "gptq 8-bit g16 v2");
}

#[test]
fn awq_gemm() {
    assert_eq!(check("awq_gemm").0, "awq 4-bit g16");
}

#[test]
fn compressed_tensors_pack_quantized_int4_asymmetric_padded() {
    assert_eq!(check("ct_pack_int4_asym").0, "compressed-tensors pack-quantized int4 group 4 asym");
}

#[test]
fn compressed_tensors_fp8_with_dynamic_token_activations() {
    let (weights, acts) = check("ct_fp8_channel");
    assert_eq!(weights, "compressed-tensors float-quantized fp8 per channel");
    let want = CheckpointActivations { format: ActivationFormat::Fp8E4M3, granularity: ActivationGranularity::Token };
    assert_eq!(acts, Some(want));
}

#[test]
fn fp8_blocks_with_partial_blocks() {
    let (weights, acts) = check("fp8_block");
    assert_eq!(weights, "fp8 e4m3 block 16x16");
    assert_eq!(acts.map(|a| a.granularity), Some(ActivationGranularity::TokenGroup(16)));
}

#[test]
fn compressed_tensors_nvfp4() {
    assert_eq!(check("ct_nvfp4"), ("compressed-tensors nvfp4-pack-quantized fp4 group 16".to_string(), None));
}

#[test]
fn compressed_tensors_mxfp4() {
    assert_eq!(check("ct_mxfp4"), ("compressed-tensors mxfp4-pack-quantized fp4 group 32".to_string(), None));
}

#[test]
fn modelopt_nvfp4_weight_only() {
    assert_eq!(check("modelopt_nvfp4"), ("modelopt nvfp4 (W4A16) group 16".to_string(), None));
}

#[test]
fn modelopt_nvfp4_from_hf_quant_config_alone() {
    // Older ModelOpt exports have only `hf_quant_config.json`: the same folder without
    // `quantization_config` in config.json reads the same.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hf_quant_py/modelopt_nvfp4");
    let dir = tempfile::tempdir().expect("temp dir");
    for f in ["model.safetensors", "tokenizer.json", "hf_quant_config.json"] {
        std::fs::copy(src.join(f), dir.path().join(f)).expect("copy");
    }
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).expect("config")).expect("JSON");
    config.as_object_mut().expect("object").remove("quantization_config");
    std::fs::write(dir.path().join("config.json"), config.to_string()).expect("write");
    let a = open_model(dir.path(), None).expect("reads");
    let b = open_model(&src, None).expect("reads");
    assert_eq!(a.quantization, b.quantization);
    assert_eq!(a.model.layers[0].linears().len(), 7);
    for ((_, x), (_, y)) in a.model.layers[0].linears().into_iter().zip(b.model.layers[0].linears()) {
        assert_eq!(x.data, y.data);
    }
}

#[test]
fn inspect_reports_the_stored_bytes_per_format() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hf_quant_py/gptq_v1_4bit_desc_act");
    let loaded = open_model(&dir, None).expect("gptq folder");
    let s = loaded.source_storage.expect("source storage");
    let q = s.by_type.iter().find(|t| t.dtype == "gptq 4-bit g16 v1").expect("the quantized layers");
    assert_eq!(q.tensors, 7);
    // 64·64·5 + 32·64·2 = 24,576 weights: 4 bits each, per 16 inputs an F16
    // scale and a 4-bit zero point per output, + 4 bytes of g_idx per input.
    assert_eq!(q.elements, 24_576);
    let (codes, scales, zeros) = (24_576 / 2, 24_576 / 16 * 2, 24_576 / 16 / 2);
    let g_idx = 7 * 64 * 4;
    assert_eq!(q.bytes, (codes + scales + zeros + g_idx) as u64);
    let f16 = s.by_type.iter().find(|t| t.dtype == "F16").expect("embedding and norms");
    assert_eq!((f16.tensors, f16.elements), (4, 16 * 64 + 3 * 64));
}

/// The writer's side: re-packing the codes the reference libraries stored gives back their
/// tensors byte for byte (compressed-tensors' `weight_packed`/`weight_scale`/`weight_global_scale`,
/// ModelOpt's `weight`/`weight_scale`/`weight_scale_2`).
#[test]
fn fp4_packing_reproduces_the_libraries_tensors() {
    use qdrift_load::hf::quant::{CtFormat, CtScheme, CtWeights, Fp4Codes, HfDtype, ModelOpt, Strategy};
    let scheme = |format, group| CtScheme {
        format,
        weights: CtWeights { bits: 4, float: true, symmetric: true, strategy: Strategy::Group(group) },
        activations: None,
    };
    for (name, packed_name, global_name) in [
        ("ct_nvfp4", "weight_packed", Some("weight_global_scale")),
        ("ct_mxfp4", "weight_packed", None),
        ("modelopt_nvfp4", "weight", Some("weight_scale_2")),
    ] {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hf_quant_py").join(name);
        let bytes = std::fs::read(dir.join("model.safetensors")).expect("model.safetensors");
        let st = SafeTensors::deserialize(&bytes).expect("safetensors");
        for short in LINEARS {
            let m = format!("model.layers.0.{short}");
            let packed = st.tensor(&format!("{m}.{packed_name}")).expect("packed");
            let scale = st.tensor(&format!("{m}.weight_scale")).expect("scale");
            let codes: Vec<u8> = packed.data().iter().flat_map(|&b| [b & 0x0F, b >> 4]).collect();
            let global = global_name.map(|g| {
                let d = st.tensor(&format!("{m}.{g}")).expect("global").data().to_vec();
                f32::from_le_bytes([d[0], d[1], d[2], d[3]])
            });
            let (out, inp) = (packed.shape()[0], packed.shape()[1] * 2);
            let c = Fp4Codes { out, inp, codes: &codes, scales: scale.data(), global };
            let parts = match name {
                "ct_nvfp4" => scheme(CtFormat::Nvfp4, 16).pack_fp4(&m, &c).expect("FP4"),
                "ct_mxfp4" => scheme(CtFormat::Mxfp4, 32).pack_fp4(&m, &c).expect("FP4"),
                _ => ModelOpt { group: 16 }.pack(&m, &c),
            };
            assert_eq!(parts.len(), if global.is_some() { 3 } else { 2 });
            for p in parts {
                let want = st.tensor(&p.name).unwrap_or_else(|_| panic!("{name}: {}", p.name));
                assert_eq!(p.shape, want.shape(), "{}", p.name);
                assert_eq!(p.bytes, want.data(), "{}", p.name);
                let dtype = match want.dtype() {
                    safetensors::Dtype::U8 => HfDtype::U8,
                    safetensors::Dtype::F8_E4M3 => HfDtype::F8E4M3,
                    _ => HfDtype::F32,
                };
                assert_eq!(p.dtype, dtype, "{}", p.name);
            }
        }
    }
}
