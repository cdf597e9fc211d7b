//! `qdrift eval --variant FOLDER` on quantized Hugging Face folders written from stories260K
//! (`qdrift_quantize::write_hf_quantized`), against the unquantized folder as the reference: each
//! folder stores exactly the codes and scales of a qdrift scheme, so its report entry equals the
//! `--schemes` twin's number for number, the checkpoint's declared dynamic activations included.
//! Block-FP8 folders (`quant_method: fp8`, `weight_block_size`) run with their per-token-group
//! activations, the group read from the config; a group that does not divide a linear layer's
//! input width is refused before anything runs.

use std::path::Path;

use qdrift_load::write::{WriteDtype, write_hf_folder};
use qdrift_load::{Llama2cTokenizer, read_llama2c_checkpoint};
use qdrift_quantize::{HfLayout, round_to_fp16_reference, write_hf_quantized};
use serde_json::Value;

mod common;
use common::{qdrift, stories, variant};

/// Writes the reference folder and one folder per layout; returns the folder of each.
fn folders(root: &Path, layouts: &[(&str, HfLayout)]) -> Vec<String> {
    let dir = stories();
    let mut model = read_llama2c_checkpoint(&dir.join("stories260K.bin")).expect("stories260K");
    round_to_fp16_reference(&mut model);
    let tok = Llama2cTokenizer::read(&dir.join("tok512.bin")).expect("tok512");
    write_hf_folder(&root.join("reference"), &model, &tok, WriteDtype::F16).expect("reference folder");
    layouts
        .iter()
        .map(|(name, layout)| {
            let path = root.join(name);
            write_hf_quantized(&path, &model, &tok, *layout).expect("quantized folder");
            path.to_str().expect("utf-8").to_string()
        })
        .collect()
}

#[test]
fn quantized_folders_equal_their_schemes() {
    let root = tempfile::tempdir().expect("tempdir");
    // (folder, layout, the scheme whose codes it stores). Group sizes divide 64 (hidden); the
    // 172 inputs of down_proj end in a shorter group, as int4-gG's do.
    let pairs = [
        ("ct-int4-g64", HfLayout::CtPacked { bits: 4, group: 64, asym: false }, "int4-g64"),
        ("ct-int4-g32-asym", HfLayout::CtPacked { bits: 4, group: 32, asym: true }, "int4-g32-asym"),
        ("ct-w8a8-int8", HfLayout::CtInt8 { activations: true }, "w8a8-int8"),
        ("ct-w8a8-fp8", HfLayout::CtFp8 { activations: true }, "w8a8-fp8"),
        ("gptq-8bit", HfLayout::Gptq { bits: 8, group: None, asym: false, act_order: false, v2: false }, "int8"),
        ("fp8-tensor", HfLayout::Fp8 { block: None }, "fp8-e4m3-tensor+a-fp8-tensor"),
        // Per-token-group activations (groups of 4 divide both 64 and 172, as vLLM and DeepSeek
        // require) on per-channel FP8 weights, as llm-compressor's FP8_BLOCK declares them.
        ("ct-fp8-g4", HfLayout::CtFp8TokenGroup { group: 4 }, "fp8-e4m3+a-fp8-g4"),
    ];
    // GPTQ 4-bit and AWQ cannot pack stories260K's 172-wide MLP rows (multiples of 8 needed):
    // the quantizer leaves those layers FP16, so these have no --schemes twin; their numbers are
    // printed beside int4-g32 / int4-g32-asym, which quantize every layer.
    let partial = [
        ("gptq-4bit-g32", HfLayout::Gptq { bits: 4, group: Some(32), asym: false, act_order: false, v2: false }),
        ("awq-g32", HfLayout::Awq { group: 32 }),
        // 4×4 FP8 blocks (no qdrift weight scheme stores 2-D blocks): runs with fp8-g4
        // activations, printed beside fp8-e4m3+a-fp8-g4 (per-channel weights, the same activations).
        ("fp8-block4", HfLayout::Fp8 { block: Some(4) }),
    ];
    let mut layouts: Vec<(&str, HfLayout)> = pairs.iter().map(|(n, l, _)| (*n, *l)).collect();
    layouts.extend(partial);
    let paths = folders(root.path(), &layouts);
    let out = root.path().join("out");
    let reference = root.path().join("reference");
    let mut schemes: Vec<&str> = pairs.iter().map(|p| p.2).collect();
    schemes.push("int4-g32");
    let schemes = schemes.join(",");
    let mut args = vec![
        "eval",
        "--model",
        reference.to_str().expect("utf-8"),
        "--backend",
        "cpu",
        "--out",
        out.to_str().expect("utf-8"),
        "--schemes",
        &schemes,
        "--prompts",
        "6",
        "--horizons",
        "10,50",
        "--resamples",
        "200",
    ];
    for p in &paths {
        args.extend(["--variant", p]);
    }
    let o = qdrift(&args);
    assert!(o.status.success(), "qdrift eval failed: {}", String::from_utf8_lossy(&o.stderr));
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).expect("report.json")).expect("json");
    for (folder, _, scheme) in pairs {
        let (c, s) = (variant(&report, folder), variant(&report, scheme));
        assert_eq!(c["kind"], "checkpoint");
        assert_eq!(c["horizons"], s["horizons"], "{folder} vs {scheme}");
        assert_eq!(c["first_divergence"], s["first_divergence"], "{folder} vs {scheme}");
        let h = &c["horizons"][1];
        println!(
            "{folder} ≡ {scheme}: token match {} KLD {} ({} = {})",
            h["token_match_rate"]["mean"], h["kld"]["mean"], c["recipe"]["weights"], c["recipe"]["activations"]
        );
        // The activation part is the checkpoint's, recorded as the scheme records its own.
        assert_eq!(c["recipe"]["activations"], s["recipe"]["activations"], "{folder}");
    }
    for (folder, scheme) in
        [("gptq-4bit-g32", "int4-g32"), ("awq-g32", "int4-g32-asym"), ("fp8-block4", "fp8-e4m3+a-fp8-g4")]
    {
        let (c, s) = (&variant(&report, folder)["horizons"][1], &variant(&report, scheme)["horizons"][1]);
        println!(
            "{folder} (no exact twin): token match {} KLD {}; {scheme}: token match {} KLD {}",
            c["token_match_rate"]["mean"], c["kld"]["mean"], s["token_match_rate"]["mean"], s["kld"]["mean"]
        );
        assert!(c["kld"]["mean"].as_f64().expect("kld") > 0.0);
    }
    assert_eq!(variant(&report, "gptq-4bit-g32")["recipe"]["weights"], "gptq 4-bit g32 v1");
    assert_eq!(variant(&report, "awq-g32")["recipe"]["weights"], "awq 4-bit g32");
    // The block folder's group is its config's weight_block_size[1] (4), not the usual 128.
    let block = &variant(&report, "fp8-block4")["recipe"];
    assert_eq!(
        (block["weights"].as_str(), block["activations"].as_str()),
        (Some("fp8 e4m3 block 4x4"), Some("fp8-g4"))
    );
    assert_eq!(variant(&report, "ct-fp8-g4")["recipe"]["activations"], "fp8-g4");
    assert_eq!(variant(&report, "ct-int4-g64")["recipe"]["weights"], "compressed-tensors pack-quantized int4 group 64");
    // Not the reference: quantization moved something.
    assert!(variant(&report, "ct-int4-g64")["horizons"][1]["kld"]["mean"].as_f64().expect("kld") > 0.0);
}

#[test]
fn activation_groups_that_do_not_divide_a_layer_are_refused_before_running() {
    // Blocks of 32: the 172 inputs of down_proj are not whole groups of 32, which vLLM and
    // DeepSeek-V3's act_quant refuse too. The same for a --schemes recipe.
    let root = tempfile::tempdir().expect("tempdir");
    let paths = folders(root.path(), &[("fp8-block", HfLayout::Fp8 { block: Some(32) })]);
    let reference = root.path().join("reference");
    let out = root.path().join("out");
    for (flag, value, names) in [
        ("--variant", paths[0].as_str(), ["fp8-block", "per token per group of 32"]),
        ("--schemes", "fp8-e4m3+a-fp8-g32", ["fp8-e4m3+a-fp8-g32", "groups"]),
    ] {
        let o = qdrift(&[
            "eval",
            "--model",
            reference.to_str().expect("utf-8"),
            "--backend",
            "cpu",
            "--out",
            out.to_str().expect("utf-8"),
            flag,
            value,
            "--prompts",
            "2",
            "--horizons",
            "5",
        ]);
        assert!(!o.status.success());
        let stderr = String::from_utf8_lossy(&o.stderr);
        // One error line; progress lines (stderr is a pipe here) may come before it.
        assert_eq!(stderr.lines().filter(|l| l.starts_with("qdrift: error: ")).count(), 1, "{stderr}");
        for name in names.into_iter().chain(["fp8-g32", "172 inputs"]) {
            assert!(stderr.contains(name), "{name}: {stderr}");
        }
        assert!(!out.exists());
    }
}

#[test]
fn a_quantized_folder_of_another_shape_is_refused_before_running() {
    // The independent GPTQ fixture (dim 64, 1 layer, vocab 16) against stories260K.
    let other = Path::new(env!("CARGO_MANIFEST_DIR")).join("../load/tests/hf_quant_py/gptq_v2_8bit_asym");
    let model = stories().join("stories260K.bin");
    let root = tempfile::tempdir().expect("tempdir");
    let out = root.path().join("out");
    let o = qdrift(&[
        "eval",
        "--model",
        model.to_str().expect("utf-8"),
        "--backend",
        "cpu",
        "--out",
        out.to_str().expect("utf-8"),
        "--schemes",
        "int8",
        "--variant",
        other.to_str().expect("utf-8"),
        "--prompts",
        "2",
        "--horizons",
        "5",
    ]);
    assert!(!o.status.success());
    let stderr = String::from_utf8_lossy(&o.stderr);
    // One error line; progress lines (stderr is a pipe here) may come before it.
    assert_eq!(stderr.lines().filter(|l| l.starts_with("qdrift: error: ")).count(), 1, "{stderr}");
    assert!(
        stderr.contains("gptq_v2_8bit_asym") && stderr.contains("is not a quantization of the reference"),
        "{stderr}"
    );
    assert_eq!(o.status.code(), Some(2), "unusable input: {stderr}");
    assert!(!out.exists());
}
