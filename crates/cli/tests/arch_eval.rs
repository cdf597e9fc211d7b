//! `qdrift eval` on every tiny-arch checkpoint (`../shared/models/tiny-arch`: Qwen3, Qwen3-MoE,
//! Gemma 2 and 3, Phi-3, Mixtral, gpt-oss): an int8 weight scheme, W8A8-FP8 and a KV-cache scheme
//! each evaluate end to end, on the CPU backend, into a report whose numbers are finite and in
//! range (the report is validated when written), with the experts' routers left at reference
//! precision.

use std::path::PathBuf;

use serde_json::Value;

mod common;
use common::{qdrift, stories, variant};

const ARCHS: [&str; 7] = ["qwen3", "qwen3_moe", "gemma2", "gemma3", "phi3", "mixtral", "gpt_oss"];
const SCHEMES: [&str; 3] = ["int8", "w8a8-fp8", "int8+kv-q8_0"];

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
    }
}
