//! Quantized Hugging Face folders that qdrift does not read are refused with one message that
//! names the file, the field and what is supported ([`LoadError::Unsupported`]), or the tensor
//! and its expected shape; never a panic. Fixtures: the independent folders of `hf_quant_py/`,
//! copied and edited.

use std::path::Path;

use qdrift_load::{LoadError, open_model};
use serde_json::{Value, json};

/// A copy of fixture `name` with `edit` applied to `config.json`'s `quantization_config`.
fn edited(name: &str, edit: impl FnOnce(&mut Value)) -> tempfile::TempDir {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hf_quant_py").join(name);
    let dir = tempfile::tempdir().expect("tempdir");
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(src.join(f), dir.path().join(f)).expect("copy");
    }
    let p = dir.path().join("config.json");
    let mut c: Value = serde_json::from_slice(&std::fs::read(&p).expect("read")).expect("json");
    edit(&mut c["quantization_config"]);
    std::fs::write(&p, serde_json::to_vec(&c).expect("json")).expect("write");
    dir
}

/// The error of opening the folder, as the CLI prints it.
fn refused(dir: &tempfile::TempDir) -> (LoadError, String) {
    let e = match open_model(dir.path(), None) {
        Ok(_) => panic!("{} was read", dir.path().display()),
        Err(e) => e,
    };
    let m = e.to_string();
    assert!(!m.contains('\n'), "{m}");
    (e, m)
}

fn unsupported(dir: &tempfile::TempDir, field: &str, supported: &str) {
    let (e, m) = refused(dir);
    match e {
        LoadError::Unsupported { path, field: f, supported: s, .. } => {
            assert!(path.ends_with("config.json"), "{m}");
            assert_eq!(f, field, "{m}");
            assert!(s.contains(supported), "{m}");
        }
        other => panic!("not Unsupported: {other}"),
    }
}

#[test]
fn unknown_method_bits_and_layouts() {
    let d = edited("gptq_v2_8bit_asym", |q| q["quant_method"] = json!("bitnet"));
    unsupported(&d, "quantization_config.quant_method", "gptq, awq, compressed-tensors, fp8");
    let d = edited("gptq_v2_8bit_asym", |q| q["bits"] = json!(3));
    unsupported(&d, "quantization_config.bits", "4, 8");
    let d = edited("gptq_v2_8bit_asym", |q| q["checkpoint_format"] = json!("marlin"));
    unsupported(&d, "quantization_config.checkpoint_format", "gptq_v2");
    for version in ["gemv", "gemv_fast", "marlin", "exllama"] {
        let d = edited("awq_gemm", |q| q["version"] = json!(version));
        unsupported(&d, "quantization_config.version", "gemm");
    }
    let d = edited("ct_pack_int4_asym", |q| q["format"] = json!("marlin-24"));
    unsupported(&d, "quantization_config.format", "pack-quantized");
    let d = edited("ct_pack_int4_asym", |q| q["config_groups"]["group_0"]["weights"]["num_bits"] = json!(2));
    unsupported(&d, "quantization_config.config_groups.group_0.weights.num_bits", "4, 8");
    let d =
        edited("ct_pack_int4_asym", |q| q["config_groups"]["group_0"]["weights"]["strategy"] = json!("tensor_group"));
    unsupported(&d, "quantization_config.config_groups.group_0.weights.strategy", "tensor, channel, group, block");
    let d = edited("fp8_block", |q| q["fmt"] = json!("e3m4"));
    unsupported(&d, "quantization_config.fmt", "e4m3, e5m2");
}

#[test]
fn static_activation_scales_are_refused() {
    let d = edited("ct_fp8_channel", |q| q["config_groups"]["group_0"]["input_activations"]["dynamic"] = json!(false));
    unsupported(&d, "quantization_config.config_groups.group_0.input_activations.dynamic", "dynamic: true");
    let d = edited("fp8_block", |q| q["activation_scheme"] = json!("static"));
    unsupported(&d, "quantization_config.activation_scheme", "dynamic");
    let d = edited("fp8_block", |q| q["scale_fmt"] = json!("ue8m0"));
    unsupported(&d, "quantization_config.scale_fmt", "ue8m0 scales are not modelled");
    let d = edited("ct_fp8_channel", |q| {
        q["config_groups"]["group_0"]["input_activations"]["strategy"] = json!("group");
    });
    unsupported(&d, "quantization_config.config_groups.group_0.input_activations.group_size", "a positive group size");
    let d = edited("ct_fp8_channel", |q| q["kv_cache_scheme"] = json!({"num_bits": 8, "type": "float"}));
    unsupported(&d, "quantization_config.kv_cache_scheme", "null");
}

#[test]
fn contradicting_tensors_name_the_tensor_and_shape() {
    // The config says group 16 but the scales were written for group 16 of a different width:
    // claim group 8, so qzeros/scales have half the groups the config implies.
    let d = edited("awq_gemm", |q| q["group_size"] = json!(8));
    let (_, m) = refused(&d);
    assert!(m.contains("model.safetensors") && m.contains("qzeros") && m.contains("expected [8, 8]"), "{m}");
    // A GPTQ folder read as 4-bit finds qweight of the wrong shape.
    let d = edited("gptq_v2_8bit_asym", |q| q["bits"] = json!(4));
    let (_, m) = refused(&d);
    assert!(m.contains("qweight") && m.contains("has shape"), "{m}");
    // An FP8 weight without a quantization_config is not read as if unscaled.
    let d = edited("fp8_block", |q| *q = Value::Null);
    let (_, m) = refused(&d);
    assert!(m.contains("F8_E4M3") && m.contains("quantization_config"), "{m}");
}

/// AutoGPTQ's older folders keep the configuration in `quantize_config.json`, without
/// `quant_method`: read as GPTQ, the same weights as with `quantization_config`.
#[test]
fn legacy_quantize_config_json_is_gptq() {
    let mut moved = Value::Null;
    let d = edited("gptq_v1_4bit_desc_act", |q| moved = q.take());
    if let Some(m) = moved.as_object_mut() {
        m.remove("quant_method");
    }
    std::fs::write(d.path().join("quantize_config.json"), serde_json::to_vec(&moved).expect("json")).expect("write");
    let legacy = open_model(d.path(), None).expect("legacy GPTQ folder");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hf_quant_py/gptq_v1_4bit_desc_act");
    let current = open_model(&src, None).expect("GPTQ folder");
    assert!(legacy.model == current.model);
    assert_eq!(legacy.quantization, current.quantization);
    // An unknown bit width there names that file.
    std::fs::write(d.path().join("quantize_config.json"), br#"{"bits": 3, "group_size": 16}"#).expect("write");
    let (e, m) = refused(&d);
    match e {
        LoadError::Unsupported { path, field, .. } => {
            assert!(path.ends_with("quantize_config.json") && field == "bits", "{m}");
        }
        other => panic!("not Unsupported: {other}"),
    }
}
