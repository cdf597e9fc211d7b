//! Quantized Hugging Face folders that qdrift does not read are refused with one message that
//! names the file, the field and what is supported ([`LoadError::Unsupported`]), or the tensor
//! and its expected shape; never a panic. Fixtures: the independent folders of `hf_quant_py/`,
//! copied and edited. W4A4 FP4 folders (FP4 `input_activations`, ModelOpt `quant_algo: NVFP4`)
//! are read with their stored input scales, tested here beside their hostile forms.

use std::path::Path;

use qdrift_load::{ActivationFormat, ActivationGranularity, CheckpointActivations, LoadError, open_model};
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

/// A tensor of a safetensors file: dtype, shape, bytes.
type Stored = (safetensors::Dtype, Vec<usize>, Vec<u8>);

/// A copy of fixture `name` whose `model.safetensors` tensors `edit` changes (and `config.json`
/// as `config` says).
fn with_tensors(
    name: &str,
    config: impl FnOnce(&mut Value),
    edit: impl FnOnce(&mut std::collections::BTreeMap<String, Stored>),
) -> tempfile::TempDir {
    let dir = edited(name, |_| {});
    let p = dir.path().join("config.json");
    let mut c: Value = serde_json::from_slice(&std::fs::read(&p).expect("read")).expect("json");
    config(&mut c);
    std::fs::write(&p, serde_json::to_vec(&c).expect("json")).expect("write");
    let p = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&p).expect("read");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    let mut tensors: std::collections::BTreeMap<String, Stored> =
        st.tensors().into_iter().map(|(n, t)| (n, (t.dtype(), t.shape().to_vec(), t.data().to_vec()))).collect();
    edit(&mut tensors);
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(n, (d, s, b))| (n.clone(), safetensors::tensor::TensorView::new(*d, s.clone(), b).expect("view")))
        .collect();
    std::fs::write(&p, safetensors::serialize(views, None).expect("serialize")).expect("write");
    dir
}

/// Sets F32 tensor `name` to the scalar `x` (shape kept).
fn set_f32(tensors: &mut std::collections::BTreeMap<String, Stored>, name: &str, x: f32) {
    let t = tensors.get_mut(name).expect(name);
    t.2 = x.to_le_bytes().to_vec();
}

const Q: &str = "model.layers.0.self_attn.q_proj";

/// compressed-tensors' `NVFP4` preset's `input_activations` (compressed-tensors 0.20.1
/// `quantization/quant_scheme.py`).
fn nvfp4_activations() -> Value {
    json!({
        "num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
        "symmetric": true, "dynamic": "local", "observer": "static_minmax",
    })
}

/// The fixtures' linear layers (one layer), each with the input scale the W4A4 folders store.
const INPUT_SCALES: [(&str, f32); 7] = [
    ("self_attn.q_proj", 100.0),
    ("self_attn.k_proj", 300.0),
    ("self_attn.v_proj", 200.0),
    ("self_attn.o_proj", 50.0),
    ("mlp.gate_proj", 70.0),
    ("mlp.up_proj", 60.0),
    ("mlp.down_proj", 40.0),
];

/// ct_nvfp4 as a W4A4 folder: NVFP4 `input_activations` and an `input_global_scale` `[1]` F32 per
/// linear layer (`scale` of each of [`INPUT_SCALES`]' values).
fn ct_w4a4(scale: impl Fn(&str, f32) -> f32) -> tempfile::TempDir {
    with_tensors(
        "ct_nvfp4",
        |c| c["quantization_config"]["config_groups"]["group_0"]["input_activations"] = nvfp4_activations(),
        |t| {
            for (m, x) in INPUT_SCALES {
                let x = scale(m, x);
                t.insert(format!("model.layers.0.{m}.input_global_scale"), (F32, vec![1], x.to_le_bytes().to_vec()));
            }
        },
    )
}

const F32: safetensors::Dtype = safetensors::Dtype::F32;

/// The linear layers' weights of a folder.
fn weights(dir: &Path) -> Vec<Vec<f32>> {
    let m = open_model(dir, None).expect("read").model;
    m.layers[0].linears().into_iter().map(|(_, w)| w.data.clone()).collect()
}

#[test]
fn fp4_activations_w4a4_are_read_with_their_stored_input_scales() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hf_quant_py");
    let nvfp4 =
        CheckpointActivations { format: ActivationFormat::Nvfp4, granularity: ActivationGranularity::TokenGroup(16) };
    // compressed-tensors' NVFP4 (W4A4): the weights are ct_nvfp4's; q/k/v and gate/up share an
    // input, so a layer's scale is the largest stored (vLLM's `input_global_scale.max()`).
    let d = ct_w4a4(|_, x| x);
    let q = open_model(d.path(), None).expect("W4A4 read").quantization.expect("quantized");
    assert_eq!(q.activations, Some(nvfp4));
    assert_eq!(q.input_scales, Some(vec![[300.0, 50.0, 70.0, 40.0]]));
    assert_eq!(weights(d.path()), weights(&fixtures.join("ct_nvfp4")));
    // MXFP4 (W4A4): dynamic E8M0 scales per 32, no stored scale.
    let d = edited("ct_mxfp4", |q| {
        q["config_groups"]["group_0"]["input_activations"] = json!({
            "num_bits": 4, "type": "float", "strategy": "group", "group_size": 32, "symmetric": true, "dynamic": true,
        });
    });
    let q = open_model(d.path(), None).expect("MXFP4 W4A4 read").quantization.expect("quantized");
    let mxfp4 =
        CheckpointActivations { format: ActivationFormat::Mxfp4, granularity: ActivationGranularity::TokenGroup(32) };
    assert_eq!((q.activations, q.input_scales), (Some(mxfp4), None));
    // ModelOpt's NVFP4 (W4A4): `input_scale` = amax/(6·448), the inverse of compressed-tensors'
    // global scale; vLLM fuses by `input_scale.max()`, the smallest global scale.
    let d = with_tensors(
        "modelopt_nvfp4",
        |c| c["quantization_config"]["quant_algo"] = json!("NVFP4"),
        |t| {
            for (m, x) in INPUT_SCALES {
                t.insert(format!("model.layers.0.{m}.input_scale"), (F32, vec![], (1.0 / x).to_le_bytes().to_vec()));
            }
        },
    );
    let q = open_model(d.path(), None).expect("ModelOpt W4A4 read").quantization.expect("quantized");
    assert_eq!(q.activations, Some(nvfp4));
    assert!(q.weights.contains("W4A4"), "{}", q.weights);
    let inv = |x: f32| 1.0 / (1.0 / x);
    assert_eq!(q.input_scales, Some(vec![[inv(100.0), inv(50.0), inv(60.0), inv(40.0)]]));
    assert_eq!(weights(d.path()), weights(&fixtures.join("modelopt_nvfp4")));
}

#[test]
fn fp4_activations_w4a4_hostile_scales_and_forms_are_refused_by_name() {
    const K: &str = "model.layers.0.self_attn.k_proj.input_global_scale";
    for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let d = ct_w4a4(|m, x| if m == "self_attn.k_proj" { bad } else { x });
        let (_, m) = refused(&d);
        assert!(m.contains(K), "{bad}: {m}");
    }
    let d = with_tensors(
        "ct_nvfp4",
        |c| c["quantization_config"]["config_groups"]["group_0"]["input_activations"] = nvfp4_activations(),
        |_| {},
    );
    let (_, m) = refused(&d);
    assert!(m.contains("model.layers.0.self_attn.q_proj.input_global_scale") && m.contains("missing"), "{m}");
    // Other FP4 activation forms than the two presets.
    let d = edited("ct_nvfp4", |q| {
        let mut a = nvfp4_activations();
        a["group_size"] = json!(32);
        q["config_groups"]["group_0"]["input_activations"] = a;
    });
    unsupported(&d, "quantization_config.config_groups.group_0.input_activations.group_size/dynamic", "NVFP4");
    let d = edited("ct_nvfp4", |q| {
        let mut a = nvfp4_activations();
        a["strategy"] = json!("token");
        q["config_groups"]["group_0"]["input_activations"] = a;
    });
    unsupported(&d, "quantization_config.config_groups.group_0.input_activations.strategy", "MXFP4");
    // ModelOpt's other activation-quantizing algorithms stay refused by quant_algo.
    let d = edited("modelopt_nvfp4", |q| q["quant_algo"] = json!("NVFP4_AWQ"));
    unsupported(&d, "quantization_config.quant_algo", "also quantizes activations");
    let d = edited("modelopt_nvfp4", |q| *q = Value::Null);
    std::fs::write(d.path().join("hf_quant_config.json"), br#"{"quantization": {"quant_algo": "W4A8_NVFP4_FP8"}}"#)
        .expect("write");
    let (e, m) = refused(&d);
    match e {
        LoadError::Unsupported { path, field, .. } => {
            assert!(path.ends_with("hf_quant_config.json") && field == "quantization.quant_algo", "{m}");
        }
        other => panic!("not Unsupported: {other}"),
    }
    // A ModelOpt W4A4 folder without a layer's input_scale, and a zero one.
    let d = with_tensors("modelopt_nvfp4", |c| c["quantization_config"]["quant_algo"] = json!("NVFP4"), |_| {});
    let (_, m) = refused(&d);
    assert!(m.contains(&format!("{Q}.input_scale")) && m.contains("missing"), "{m}");
    let d = with_tensors(
        "modelopt_nvfp4",
        |c| c["quantization_config"]["quant_algo"] = json!("NVFP4"),
        |t| {
            for (m, _) in INPUT_SCALES {
                t.insert(format!("model.layers.0.{m}.input_scale"), (F32, vec![], 0f32.to_le_bytes().to_vec()));
            }
        },
    );
    let (_, m) = refused(&d);
    assert!(m.contains(&format!("{Q}.input_scale")), "{m}");
    // A weight-only config with a layer that stores an activation scale.
    let d = with_tensors(
        "modelopt_nvfp4",
        |_| {},
        |t| drop(t.insert(format!("{Q}.input_scale"), (F32, vec![], 1f32.to_le_bytes().to_vec()))),
    );
    let (_, m) = refused(&d);
    assert!(m.contains(&format!("{Q}.input_scale")) && m.contains("W4A4"), "{m}");
    let d = edited("modelopt_nvfp4", |q| q["kv_cache_scheme"] = json!({"num_bits": 8, "type": "float"}));
    unsupported(&d, "quantization_config.kv_cache_scheme", "null");
}

#[test]
fn fp4_configs_must_match_their_format() {
    let w = |q: &mut Value| q["config_groups"]["group_0"]["weights"].clone();
    let d = edited("ct_nvfp4", |q| {
        let mut weights = w(q);
        weights["group_size"] = json!(32);
        q["config_groups"]["group_0"]["weights"] = weights;
    });
    unsupported(&d, "quantization_config.config_groups.group_0.weights.strategy", "tensor_group with group_size 16");
    let d = edited("ct_mxfp4", |q| q["config_groups"]["group_0"]["weights"]["num_bits"] = json!(8));
    unsupported(&d, "quantization_config.config_groups.group_0.weights.type/num_bits", "float/4");
    let d = edited("modelopt_nvfp4", |q| q["config_groups"]["group_0"]["weights"]["group_size"] = json!(32));
    unsupported(&d, "quantization_config.group_size", "16");
}

/// The hostile cases of FP4 tensors: each a typed [`LoadError`] naming the tensor, never a panic
/// or a silently wrong weight.
#[test]
fn hostile_fp4_tensors_are_refused_naming_the_tensor() {
    let error = |name: &str, edit: &dyn Fn(&mut std::collections::BTreeMap<String, Stored>)| {
        let d = with_tensors(name, |_| {}, edit);
        refused(&d).1
    };
    // Global scales: zero, NaN, infinite, negative (compressed-tensors divides by them).
    let gs = format!("{Q}.weight_global_scale");
    for x in [0.0, f32::NAN, f32::INFINITY, -2.0] {
        let m = error("ct_nvfp4", &|t| set_f32(t, &gs, x));
        assert!(m.contains(&gs), "{x}: {m}");
    }
    // ModelOpt's weight_scale_2 multiplies: zero is an all-zero weight, the others are refused.
    let s2 = format!("{Q}.weight_scale_2");
    for x in [f32::NAN, f32::NEG_INFINITY, -1.0] {
        let m = error("modelopt_nvfp4", &|t| set_f32(t, &s2, x));
        assert!(m.contains(&s2), "{x}: {m}");
    }
    let d = with_tensors("modelopt_nvfp4", |_| {}, |t| set_f32(t, &s2, 0.0));
    let zero = open_model(d.path(), None).expect("a zero weight_scale_2 is an all-zero weight");
    assert!(zero.model.layers[0].linears()[0].1.data.iter().all(|&w| w == 0.0));
    // Scale grids of the wrong shape or dtype.
    let scale = format!("{Q}.weight_scale");
    for name in ["ct_nvfp4", "ct_mxfp4", "modelopt_nvfp4"] {
        let m = error(name, &|t| {
            let s = t.get_mut(&scale).expect("scale");
            s.1 = vec![s.1[0] * 2, s.1[1] / 2];
        });
        assert!(m.contains(&scale) && m.contains("has shape"), "{name}: {m}");
        let m = error(name, &|t| {
            let s = t.get_mut(&scale).expect("scale");
            s.0 = if s.0 == safetensors::Dtype::U8 { safetensors::Dtype::I8 } else { safetensors::Dtype::U8 };
        });
        assert!(m.contains(&scale) && m.contains("dtype"), "{name}: {m}");
    }
    // The E8M0 NaN scale, and an E4M3 NaN scale (the weight's values are checked finite).
    let m = error("ct_mxfp4", &|t| t.get_mut(&scale).expect("scale").2[3] = 255);
    assert!(m.contains(&format!("{scale}[3] = 255")) && m.contains("NaN"), "{m}");
    let m = error("ct_nvfp4", &|t| t.get_mut(&scale).expect("scale").2[5] = 0x7F);
    assert!(m.contains(&format!("{Q}.weight")) && m.contains("NaN"), "{m}");
    // Packed codes of the wrong dtype.
    let m =
        error("ct_nvfp4", &|t| t.get_mut(&format!("{Q}.weight_packed")).expect("packed").0 = safetensors::Dtype::I8);
    assert!(m.contains("weight_packed") && m.contains("U8"), "{m}");
}

/// Rows that are not whole FP4 groups (intermediate size 40: `down_proj` has 40 inputs) are
/// refused before the codes are read.
#[test]
fn fp4_rows_must_be_whole_groups() {
    for (name, packed, group) in
        [("ct_nvfp4", "weight_packed", 16), ("ct_mxfp4", "weight_packed", 32), ("modelopt_nvfp4", "weight", 16)]
    {
        let d = with_tensors(
            name,
            |c| c["intermediate_size"] = json!(40),
            |t| {
                for (module, out, inp) in [("gate_proj", 40, 64), ("up_proj", 40, 64), ("down_proj", 64, 40)] {
                    let p = format!("model.layers.0.mlp.{module}");
                    for (suffix, t) in t.iter_mut().filter(|(n, _)| n.starts_with(&p)) {
                        let cols = match &suffix[p.len() + 1..] {
                            "weight_packed" | "weight" => inp / 2,
                            "weight_scale" => inp / group,
                            _ => continue,
                        };
                        t.1 = vec![out, cols];
                        t.2 = vec![0x38; out * cols];
                    }
                }
            },
        );
        let (_, m) = refused(&d);
        let want =
            format!("model.layers.0.mlp.down_proj.{packed}: 40 inputs per row are not whole FP4 groups of {group}");
        assert!(m.contains(&want), "{name}: {m}");
    }
}
