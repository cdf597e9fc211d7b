//! `qdrift quantize --packed` with an FP4 scheme writes a compressed-tensors folder that
//! `qdrift eval --variant` reads back as the scheme's weights (the library side is tested in
//! `qdrift-quantize`'s `tests/ct_export.rs`, against compressed-tensors too); made W4A4 (FP4
//! `input_activations`, and NVFP4's stored `input_global_scale`s), `qdrift eval` rounds its
//! activations as declared, NVFP4's under the stored scales.

use std::path::Path;

mod common;
use common::{qdrift, stories, variant};
use qdrift_load::write::{WriteDtype, write_hf_folder};
use qdrift_load::{HostTensor, Llama2cTokenizer, open_model, read_llama2c_checkpoint};
use serde_json::{Value, json};

/// stories260K with its FFN cut to 160 hidden units (whole FP4 groups), as a Hugging Face folder.
fn source(dir: &Path) {
    let s = stories();
    let mut m = read_llama2c_checkpoint(&s.join("stories260K.bin")).expect("stories260K");
    let cut = |t: &HostTensor, rows: bool| {
        let (r, c) = (t.shape[0], t.shape[1]);
        let (nr, nc) = if rows { (160, c) } else { (r, 160) };
        let data = (0..nr).flat_map(|i| t.data[i * c..i * c + nc].iter().copied()).collect();
        HostTensor::new(vec![nr, nc], data).expect("shape")
    };
    m.arch.hidden_dim = 160;
    for layer in &mut m.layers {
        let mlp = layer.mlp_mut().expect("dense");
        (mlp.gate, mlp.up, mlp.down) = (cut(&mlp.gate, true), cut(&mlp.up, true), cut(&mlp.down, false));
    }
    let tok = Llama2cTokenizer::read(&s.join("tok512.bin")).expect("tok512");
    write_hf_folder(dir, &m, &tok, WriteDtype::F16).expect("source folder");
}

#[test]
fn packed_fp4_schemes_write_compressed_tensors_folders() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let src = tmp.path().join("source");
    source(&src);
    for (scheme, format) in [("nvfp4", "nvfp4-pack-quantized"), ("mxfp4-ct", "mxfp4-pack-quantized")] {
        let out = tmp.path().join(scheme);
        let args = ["quantize", "--model", src.to_str().unwrap(), "--scheme", scheme, "--packed", "--out"];
        let run = qdrift(&[&args[..], &[out.to_str().unwrap()]].concat());
        assert!(run.status.success(), "{scheme}: {}", String::from_utf8_lossy(&run.stderr));
        let loaded = open_model(&out, None).unwrap_or_else(|e| panic!("{scheme}: {e}"));
        let q = loaded.quantization.expect("quantized");
        assert!(q.weights.contains(format), "{scheme}: {}", q.weights);
    }
    // From a llama2.c file there is no config.json to carry over: refused by name.
    let model = stories().join("stories260K.bin");
    let out = tmp.path().join("refused");
    let run = qdrift(&[
        "quantize",
        "--model",
        model.to_str().unwrap(),
        "--scheme",
        "nvfp4",
        "--packed",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(!run.status.success());
    assert!(String::from_utf8_lossy(&run.stderr).contains("from a Hugging Face folder"));
}

/// The linear layers of stories260K's 5 layers, by the input they read (q/k/v, o, gate/up, down).
const MODULES: [&str; 7] = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
];

/// A copy of the compressed-tensors NVFP4 folder `base` made W4A4: every group's
/// `input_activations` is compressed-tensors' `NVFP4` preset's, and each linear layer stores
/// `input_global_scale` = `scale(layer, module)` (an F32 `[1]` in a second shard beside the
/// weights, both listed in `model.safetensors.index.json`).
fn w4a4(base: &Path, dir: &Path, scale: impl Fn(usize, &str) -> f32) {
    std::fs::create_dir_all(dir).expect("mkdir");
    for f in std::fs::read_dir(base).expect("folder") {
        let f = f.expect("entry").path();
        std::fs::copy(&f, dir.join(f.file_name().expect("name"))).expect("copy");
    }
    let config = dir.join("config.json");
    let mut c: Value = serde_json::from_slice(&std::fs::read(&config).expect("read")).expect("json");
    for g in c["quantization_config"]["config_groups"].as_object_mut().expect("groups").values_mut() {
        g["input_activations"] = json!({
            "num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
            "symmetric": true, "dynamic": "local", "observer": "static_minmax",
        });
    }
    std::fs::write(&config, serde_json::to_vec(&c).expect("json")).expect("write");
    // The safetensors layout: an 8-byte little-endian header length, the JSON header, the data.
    let weights = dir.join("model-00001-of-00002.safetensors");
    std::fs::rename(dir.join("model.safetensors"), &weights).expect("rename");
    let model = std::fs::read(&weights).expect("weights");
    let n = u64::from_le_bytes(model[..8].try_into().expect("8 bytes")) as usize;
    let header: Value = serde_json::from_slice(&model[8..8 + n]).expect("header");
    let mut map: serde_json::Map<String, Value> = header
        .as_object()
        .expect("header")
        .keys()
        .filter(|k| *k != "__metadata__")
        .map(|k| (k.clone(), json!("model-00001-of-00002.safetensors")))
        .collect();
    let (mut meta, mut data) = (serde_json::Map::new(), Vec::new());
    for layer in 0..5 {
        for m in MODULES {
            let name = format!("model.layers.{layer}.{m}.input_global_scale");
            meta.insert(
                name.clone(),
                json!({"dtype": "F32", "shape": [1], "data_offsets": [data.len(), data.len() + 4]}),
            );
            data.extend_from_slice(&scale(layer, m).to_le_bytes());
            map.insert(name, json!("model-00002-of-00002.safetensors"));
        }
    }
    let mut head = serde_json::to_vec(&Value::Object(meta)).expect("json");
    head.resize(head.len().div_ceil(8) * 8, b' ');
    let file = [&(head.len() as u64).to_le_bytes()[..], &head, &data].concat();
    std::fs::write(dir.join("model-00002-of-00002.safetensors"), file).expect("write");
    let index = json!({"metadata": {}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).expect("write");
}

#[test]
fn w4a4_fp4_folders_run_with_their_declared_activations() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let src = tmp.path().join("source");
    source(&src);
    let (base, mx) = (tmp.path().join("nvfp4"), tmp.path().join("w4a4-mx"));
    for (scheme, out) in [("nvfp4", &base), ("mxfp4-ct", &mx)] {
        let args = ["quantize", "--model", src.to_str().unwrap(), "--scheme", scheme, "--packed", "--out"];
        let run = qdrift(&[&args[..], &[out.to_str().unwrap()]].concat());
        assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    }
    // The MXFP4 folder made W4A4 with compressed-tensors' `MXFP4` preset's activations (dynamic).
    let config = mx.join("config.json");
    let mut c: Value = serde_json::from_slice(&std::fs::read(&config).expect("read")).expect("json");
    for g in c["quantization_config"]["config_groups"].as_object_mut().expect("groups").values_mut() {
        g["input_activations"] = json!({
            "num_bits": 4, "type": "float", "strategy": "group", "group_size": 32, "symmetric": true, "dynamic": true,
        });
    }
    std::fs::write(&config, serde_json::to_vec(&c).expect("json")).expect("write");
    // Global scales 448·6/amax for an amax of 16 + layer; `fused` stores smaller ones on some
    // of the linears sharing an input, which vLLM's fusion (the largest) discards; `coarse`
    // stores each 3 times smaller (a power of two would change nothing: NVFP4's E4M3 block
    // scales round the same at any binade they do not saturate or underflow in).
    let g = |layer: usize| 448.0 * 6.0 / (16.0 + layer as f32);
    w4a4(&base, &tmp.path().join("w4a4-ct"), |l, _| g(l));
    w4a4(&base, &tmp.path().join("w4a4-fused"), |l, m| match m {
        "self_attn.q_proj" | "mlp.gate_proj" => g(l) / 3.0,
        "self_attn.v_proj" => g(l) / 5.0,
        _ => g(l),
    });
    w4a4(&base, &tmp.path().join("w4a4-coarse"), |l, _| g(l) / 3.0);
    let out = tmp.path().join("out");
    let path = |name: &str| tmp.path().join(name).to_str().expect("utf-8").to_string();
    let (ct, fused, coarse, mx) = (path("w4a4-ct"), path("w4a4-fused"), path("w4a4-coarse"), path("w4a4-mx"));
    let args = [
        "eval",
        "--model",
        src.to_str().unwrap(),
        "--backend",
        "cpu",
        "--out",
        out.to_str().unwrap(),
        "--schemes",
        "w4a4-nvfp4,w4a4-mxfp4",
        "--variant",
        &ct,
        "--variant",
        &fused,
        "--variant",
        &coarse,
        "--variant",
        &mx,
        "--prompts",
        "3",
        "--horizons",
        "10",
        "--resamples",
        "100",
    ];
    let o = qdrift(&args);
    assert!(o.status.success(), "qdrift eval failed: {}", String::from_utf8_lossy(&o.stderr));
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).expect("report.json")).expect("json");
    let kld = |name: &str| variant(&report, name)["horizons"][0]["kld"]["mean"].as_f64().expect("kld");
    for name in ["w4a4-ct", "w4a4-fused", "w4a4-coarse", "w4a4-nvfp4", "w4a4-mx", "w4a4-mxfp4"] {
        println!("{name}: KLD {} ({})", kld(name), variant(&report, name)["recipe"]);
        assert!(kld(name).is_finite() && kld(name) > 0.0, "{name}");
    }
    // The scales are the stored ones, fused as vLLM fuses them: equal where the fused scales
    // are, different where they are not, and not the calibrated ones of the scheme.
    assert_eq!(variant(&report, "w4a4-ct")["horizons"], variant(&report, "w4a4-fused")["horizons"]);
    assert_ne!(kld("w4a4-ct"), kld("w4a4-coarse"));
    assert_ne!(kld("w4a4-ct"), kld("w4a4-nvfp4"));
    let recipe = &variant(&report, "w4a4-ct")["recipe"];
    assert_eq!(recipe["activations"], "nvfp4 (checkpoint input scales)");
    assert!(recipe.get("calibration_prompts").is_none(), "{recipe}");
    assert_eq!(variant(&report, "w4a4-nvfp4")["recipe"]["calibration_prompts"], 3);
    // The MXFP4 W4A4 folder is the `w4a4-mxfp4` scheme's weights and activations: the same run.
    assert_eq!(variant(&report, "w4a4-mx")["horizons"], variant(&report, "w4a4-mxfp4")["horizons"]);
    assert_eq!(variant(&report, "w4a4-mx")["recipe"]["activations"], "mxfp4");
}
