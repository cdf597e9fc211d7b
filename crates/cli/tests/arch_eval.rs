//! `qdrift eval` on every tiny-arch checkpoint (`../shared/models/tiny-arch`: Qwen3, Qwen3-MoE,
//! Gemma 2 and 3, Phi-3, Mixtral, gpt-oss): an int8 weight scheme, W8A8-FP8 and a KV-cache scheme
//! each evaluate end to end, on the CPU backend, into a report whose numbers are finite and in
//! range (the report is validated when written), with the experts' routers left at reference
//! precision. The reports of the models with experts (Qwen3-MoE, Mixtral, gpt-oss) carry the
//! routing metrics for every variant, the noise floor included, and `qdrift gate` checks them;
//! the dense models' reports have none.

use std::path::PathBuf;

use serde_json::Value;

mod common;
use common::{qdrift, stories, variant};

const ARCHS: [&str; 7] = ["qwen3", "qwen3_moe", "gemma2", "gemma3", "phi3", "mixtral", "gpt_oss"];
const SCHEMES: [&str; 3] = ["int8", "w8a8-fp8", "int8+kv-q8_0"];
const WITH_EXPERTS: [&str; 3] = ["qwen3_moe", "mixtral", "gpt_oss"];

fn tiny_arch(name: &str) -> PathBuf {
    stories().join("../tiny-arch").join(name)
}

#[test]
fn every_architecture_evaluates_int8_w8a8_fp8_and_a_kv_scheme() {
    let root = tempfile::tempdir().expect("tempdir");
    for arch in ARCHS {
        let model = tiny_arch(arch);
        let out = root.path().join(arch);
        let args = [
            "eval",
            "--model",
            model.to_str().expect("utf-8"),
            "--backend",
            "cpu",
            "--out",
            out.to_str().expect("utf-8"),
            "--schemes",
            &SCHEMES.join(","),
            "--prompts",
            "3",
            "--horizons",
            "10",
            "--resamples",
            "100",
        ];
        let o = qdrift(&args);
        assert!(o.status.success(), "{arch}: qdrift eval failed: {}", String::from_utf8_lossy(&o.stderr));
        let text = std::fs::read_to_string(out.join("report.json")).expect("report.json");
        let report: Value = serde_json::from_str(&text).expect("json");
        for scheme in SCHEMES {
            let h = &variant(&report, scheme)["horizons"][0];
            let (tm, kld) = (h["token_match_rate"]["mean"].as_f64(), h["kld"]["mean"].as_f64());
            let (tm, kld) = (tm.expect("token match"), kld.expect("kld"));
            assert!((0.0..=1.0).contains(&tm) && kld.is_finite() && kld >= 0.0, "{arch} {scheme}: {tm} {kld}");
            println!("{arch} {scheme}: token match {tm:.3}, KLD {kld:.3e}");
        }
        check_routing(arch, &report, &out);
    }
}

/// A model with experts: every variant has the four routing metrics and its routing drift, and a
/// gate on routing flips runs (passes with a loose bound, fails with an impossible one); a dense
/// model has neither.
fn check_routing(arch: &str, report: &Value, out: &std::path::Path) {
    let experts = WITH_EXPERTS.contains(&arch);
    let names = ["expert_overlap", "routing_flip_rate", "expert_overlap_on_generated_text"];
    for v in report["variants"].as_array().expect("variants") {
        let h = &v["horizons"][0];
        for name in names.iter().chain(&["routing_flip_rate_on_generated_text"]) {
            let mean = h[name]["mean"].as_f64();
            assert_eq!(mean.is_some(), experts, "{arch} {}: {name}", v["name"]);
            assert!(mean.is_none_or(|m| (0.0..=1.0).contains(&m)), "{arch} {}: {name} {mean:?}", v["name"]);
        }
        let layers = v["routing"]["layers"].as_array().map_or(0, Vec::len);
        assert_eq!(layers, if experts { 4 } else { 0 }, "{arch} {}: routing layers", v["name"]);
    }
    // The run says the routers stayed at reference precision (no --quantize-router), and a
    // report with routing says so in words.
    assert_eq!(report["workload"]["quantize_router"], false, "{arch}");
    let md = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    assert_eq!(md.contains(" · routers at reference precision"), experts, "{arch}");
    if !experts {
        return;
    }
    let gate = |max: f64| {
        let thresholds = out.join(format!("thresholds-{max}.toml"));
        let toml =
            format!("[defaults]\nbound = \"point\"\n[variant.\"*\"]\n\"routing_flip_rate@10\" = {{ max = {max} }}\n");
        std::fs::write(&thresholds, toml).expect("thresholds");
        let report = out.join("report.json");
        let args =
            ["gate", "--report", report.to_str().expect("utf-8"), "--thresholds", thresholds.to_str().expect("utf-8")];
        qdrift(&args).status.code()
    };
    assert_eq!(gate(1.0), Some(0), "{arch}: routing flips ≤ 1 passes");
    let flips = SCHEMES.iter().map(|s| variant(report, s)["horizons"][0]["routing_flip_rate"]["mean"].as_f64());
    if flips.flatten().any(|f| f > 0.0) {
        assert_eq!(gate(0.0), Some(1), "{arch}: a variant with flips fails routing flips ≤ 0");
    }
}

/// W4A4 on Qwen3-MoE (every linear input a multiple of 32): MXFP4 weights and activations, and
/// NVFP4 weights and activations with static global input scales calibrated on the reference over
/// the eval set's prompts, whose number `report.json` states under the variant's recipe; run
/// twice, the same numbers (the calibration is deterministic).
#[test]
fn w4a4_variants_evaluate_and_state_their_calibration() {
    let root = tempfile::tempdir().expect("tempdir");
    let model = tiny_arch("qwen3_moe");
    let schemes = ["w4a4-mxfp4", "w4a4-nvfp4+kv-fp8-e4m3"];
    let run = |out: &std::path::Path| -> Value {
        let args = [
            "eval",
            "--model",
            model.to_str().expect("utf-8"),
            "--backend",
            "cpu",
            "--out",
            out.to_str().expect("utf-8"),
            "--schemes",
            &schemes.join(","),
            "--prompts",
            "3",
            "--horizons",
            "10",
            "--resamples",
            "100",
        ];
        let o = qdrift(&args);
        assert!(o.status.success(), "qdrift eval failed: {}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).expect("report.json")).expect("json")
    };
    let (a, b) = (run(&root.path().join("a")), run(&root.path().join("b")));
    for scheme in schemes {
        let h = |r: &Value| variant(r, scheme)["horizons"][0]["kld"]["mean"].as_f64().expect("kld");
        assert!(h(&a).is_finite() && h(&a) > 0.0, "{scheme}: {}", h(&a));
        assert_eq!(h(&a), h(&b), "{scheme}: the same numbers twice");
    }
    assert_eq!(variant(&a, "w4a4-mxfp4")["recipe"]["activations"], "mxfp4");
    assert!(variant(&a, "w4a4-mxfp4")["recipe"].get("calibration_prompts").is_none());
    let nv = &variant(&a, "w4a4-nvfp4+kv-fp8-e4m3")["recipe"];
    assert_eq!((nv["activations"].as_str(), nv["calibration_prompts"].as_u64()), (Some("nvfp4"), Some(3)));
    // The reports say it too, in the Variants table's activation column.
    let dir = root.path().join("a");
    for file in ["report.md", "report.html"] {
        let text = std::fs::read_to_string(dir.join(file)).expect("report");
        assert!(text.contains("nvfp4 (input scales calibrated on 3 prompts)"), "{file}");
        assert!(!text.contains("mxfp4 (input scales"), "{file}: dynamic scales are not calibrated");
    }
}
