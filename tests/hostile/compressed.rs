//! Hostile compressed-tensors folders (issue #29, section 3): `re:` patterns in `ignore` and
//! `targets` are matched in linear time by the `regex` crate (patterns it cannot run, or too large
//! to compile, are refused naming the field), and every integer code and zero point is checked
//! against its bit width, naming the tensor and the flat index.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use qdrift_load::{HostModel, byte_tokenizer, synthetic_model};
use qdrift_quantize::{HfLayout, round_to_fp16_reference, write_hf_quantized};
use serde_json::{Value, json};

use crate::{QUICK, USER, qdrift_command, refused};

/// A tensor of a safetensors file: dtype, shape, little-endian bytes.
type Tensor = (String, Vec<usize>, Vec<u8>);

/// `tiny` as a compressed-tensors `int-quantized` folder (I8 codes, channel scales) in `dir/m`.
fn ct_int8_folder(dir: &Path) -> PathBuf {
    let mut model: HostModel = synthetic_model("tiny", 3).expect("tiny").model;
    round_to_fp16_reference(&mut model);
    let folder = dir.join("m");
    std::fs::create_dir(&folder).expect("mkdir");
    let tok = byte_tokenizer(320).expect("tok");
    write_hf_quantized(&folder, &model, &tok, HfLayout::CtInt8 { activations: false }).expect("written");
    folder
}

/// Edits `config.json`'s `quantization_config`.
fn edit_config(folder: &Path, edit: impl FnOnce(&mut Value)) {
    let path = folder.join("config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("config")).expect("JSON");
    edit(&mut config["quantization_config"]);
    std::fs::write(&path, config.to_string()).expect("write");
}

/// Rewrites `model.safetensors`: `edit` sees every tensor by name (and may change it) and
/// returns tensors to add.
fn edit_tensors(folder: &Path, mut edit: impl FnMut(&str, &mut Tensor) -> Vec<(String, Tensor)>) {
    let path = folder.join("model.safetensors");
    let bytes = std::fs::read(&path).expect("weights");
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header: serde_json::Map<String, Value> = serde_json::from_slice(&bytes[8..8 + n]).expect("header");
    let data = &bytes[8 + n..];
    let mut tensors: Vec<(String, Tensor)> = Vec::new();
    for (name, info) in &header {
        if name == "__metadata__" {
            continue;
        }
        let offsets: Vec<usize> = info["data_offsets"]
            .as_array()
            .expect("offsets")
            .iter()
            .map(|o| o.as_u64().expect("offset") as usize)
            .collect();
        let shape =
            info["shape"].as_array().expect("shape").iter().map(|d| d.as_u64().expect("dim") as usize).collect();
        let mut t = (info["dtype"].as_str().expect("dtype").to_string(), shape, data[offsets[0]..offsets[1]].to_vec());
        let added = edit(name, &mut t);
        tensors.push((name.clone(), t));
        tensors.extend(added);
    }
    let (mut head, mut body) = (serde_json::Map::new(), Vec::new());
    for (name, (dtype, shape, b)) in tensors {
        head.insert(name, json!({"dtype": dtype, "shape": shape, "data_offsets": [body.len(), body.len() + b.len()]}));
        body.extend(b);
    }
    let mut head = Value::Object(head).to_string().into_bytes();
    while !head.len().is_multiple_of(8) {
        head.push(b' ');
    }
    let mut out = (head.len() as u64).to_le_bytes().to_vec();
    out.extend(head);
    out.extend(body);
    std::fs::write(&path, out).expect("write");
}

/// Whether tensor `name` of dtype `dtype` holds a quantized layer's I8 codes.
fn is_codes(name: &str, t: &Tensor) -> bool {
    name.ends_with(".weight") && t.0 == "I8"
}

/// `qdrift eval` of `model` on the CPU with small settings, writing to `out`.
fn eval(model: &Path, out: &Path) -> Command {
    let mut c = qdrift_command();
    c.args(["eval", "--model"]).arg(model).args(["--backend", "cpu", "--schemes", "int8"]);
    c.args(["--prompts", "2", "--horizons", "5", "--out"]).arg(out);
    c
}

#[test]
fn thirty_stars_in_an_ignore_pattern_match_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let folder = ct_int8_folder(dir.path());
    // The old backtracking matcher's time grew steeply with each `.*` (docs/BENCHMARKS.md,
    // 'Other costs').
    let pattern = format!("re:{}z$", ".*".repeat(30));
    edit_config(&folder, |q| q["ignore"] = json!(["lm_head", pattern]));
    let start = Instant::now();
    let run = eval(&folder, &dir.path().join("out")).output().expect("runs");
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert!(start.elapsed() < QUICK, "{:?}", start.elapsed());
}

#[test]
fn a_look_around_pattern_is_refused_naming_the_field_and_the_pattern() {
    let dir = tempfile::tempdir().unwrap();
    let folder = ct_int8_folder(dir.path());
    edit_config(&folder, |q| q["config_groups"]["group_0"]["targets"] = json!(["re:(?!lm_head).*"]));
    refused(
        USER,
        eval(&folder, &dir.path().join("out")),
        &["config.json", "quantization_config.config_groups.group_0.targets", "re:(?!lm_head).*", "look-around"],
    );
}

#[test]
fn a_pattern_too_large_to_compile_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let folder = ct_int8_folder(dir.path());
    edit_config(&folder, |q| q["ignore"] = json!(["re:((a{1000}){1000}){1000}"]));
    refused(USER, eval(&folder, &dir.path().join("out")), &["quantization_config.ignore", "size limit"]);
}

#[test]
fn i64_codes_past_int8_are_refused_not_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let folder = ct_int8_folder(dir.path());
    edit_tensors(&folder, |name, t| {
        if is_codes(name, t) {
            let mut wide: Vec<i64> = t.2.iter().map(|&b| i64::from(b as i8)).collect();
            wide[0] = (1 << 40) + 3;
            *t = ("I64".into(), t.1.clone(), wide.iter().flat_map(|v| v.to_le_bytes()).collect());
        }
        Vec::new()
    });
    refused(USER, eval(&folder, &dir.path().join("out")), &[".weight[0] = 1099511627779", "not an int8 code"]);
}

/// The folder made asymmetric, with I32 zero points `[out, 1]` whose first is `first`.
fn with_zero_point(folder: &Path, first: i32) {
    edit_config(folder, |q| q["config_groups"]["group_0"]["weights"]["symmetric"] = json!(false));
    edit_tensors(folder, |name, t| {
        if !is_codes(name, t) {
            return Vec::new();
        }
        let mut zeros = vec![0i32; t.1[0]];
        zeros[0] = first;
        let zp = ("I32".to_string(), vec![t.1[0], 1], zeros.iter().flat_map(|z| z.to_le_bytes()).collect());
        vec![(format!("{}_zero_point", name), zp)]
    });
}

#[test]
fn an_int8_zero_point_of_a_million_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let folder = ct_int8_folder(dir.path());
    with_zero_point(&folder, 1_000_000);
    refused(
        USER,
        eval(&folder, &dir.path().join("out")),
        &["weight_zero_point[0] = 1000000", "not an int8 zero point"],
    );
}

#[test]
fn an_i32_max_zero_point_is_refused_not_an_overflow() {
    let dir = tempfile::tempdir().unwrap();
    let folder = ct_int8_folder(dir.path());
    with_zero_point(&folder, i32::MAX);
    refused(USER, eval(&folder, &dir.path().join("out")), &["weight_zero_point[0] = 2147483647", "-128..=127"]);
}
