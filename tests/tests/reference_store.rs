//! The saved reference (`--save-reference`, `--reference`): a run that reads the store gives the
//! report of the run that wrote it, byte for byte, in both KL modes; a store made under other
//! conditions, or damaged, is refused naming the field or file.

use qdrift_eval::{EvalConfig, VariantSpec, evaluate};
use qdrift_report::Report;
use qdrift_tests::stories_eval;

fn config() -> EvalConfig {
    stories_eval(6, 4, &[])
}

fn schemes(names: &[&str]) -> Vec<VariantSpec> {
    names.iter().map(|s| VariantSpec::Scheme(s.parse().expect("scheme"))).collect()
}

/// Everything but the timestamps-free parts that legitimately differ: none do, so the whole
/// report as JSON.
fn json(r: &Report) -> String {
    serde_json::to_string(r).expect("serializes")
}

fn round_trip(top_k: Option<usize>) {
    let tmp = tempfile::tempdir().expect("temp dir");
    let store = tmp.path().join("reference");
    let mut cfg = config();
    cfg.reference_top_k = top_k;
    cfg.variants = schemes(&["int8", "int4-g32"]);
    cfg.save_reference = Some(store.clone());
    let saved = evaluate(&cfg, &mut |_| {}).expect("run that saves the reference");
    assert!(store.join("manifest.json").is_file() && store.join("reference.bin").is_file());
    cfg.save_reference = None;
    let full = evaluate(&cfg, &mut |_| {}).expect("run without a store");
    assert_eq!(json(&saved), json(&full), "saving changes nothing");

    // A later run gating one new variant reads the store: no reference generation, no noise floor.
    cfg.reference_store = Some(store.clone());
    cfg.variants = schemes(&["int4-g32"]);
    let mut generated = Vec::new();
    let reused = evaluate(&cfg, &mut |p| {
        if let qdrift_eval::Progress::Generating { model, .. } = p {
            generated.push(model.to_string());
        }
    })
    .expect("run from the store");
    assert_eq!(generated, ["int4-g32"], "only the new variant generates");
    cfg.reference_store = None;
    let direct = evaluate(&cfg, &mut |_| {}).expect("the same run without the store");
    assert_eq!(json(&reused), json(&direct), "a stored reference gives the same report");
}

#[test]
fn a_stored_exact_reference_gives_the_same_report() {
    round_trip(None);
}

#[test]
fn a_stored_top_k_reference_gives_the_same_report() {
    round_trip(Some(16));
}

#[test]
fn stores_made_otherwise_or_damaged_are_refused() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let store = tmp.path().join("reference");
    let mut cfg = config();
    cfg.variants = schemes(&["int8"]);
    cfg.save_reference = Some(store.clone());
    evaluate(&cfg, &mut |_| {}).expect("saves");
    cfg.save_reference = None;
    cfg.reference_store = Some(store.clone());
    let refused = |cfg: &EvalConfig, needle: &str| {
        let e = evaluate(cfg, &mut |_| {}).expect_err("refused").to_string();
        assert!(e.contains(needle) && e.contains("--reference"), "{e:?} should name --reference and {needle}");
        println!("refused: {e}");
    };
    let mut other = cfg.clone();
    other.horizons = vec![5, 20];
    refused(&other, "horizons");
    let mut other = cfg.clone();
    other.dtype = burn::tensor::DType::F32;
    refused(&other, "dtype");
    let mut other = cfg.clone();
    other.prompts = Some(5);
    refused(&other, "prompts");
    let mut other = cfg.clone();
    other.batch_size = Some(3);
    refused(&other, "batch_size");
    let mut other = cfg.clone();
    other.reference_top_k = Some(8);
    refused(&other, "kl");

    let data = store.join("reference.bin");
    let mut bytes = std::fs::read(&data).expect("reads");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 1;
    std::fs::write(&data, &bytes).expect("writes");
    refused(&cfg, "checksum");
    std::fs::write(store.join("manifest.json"), b"{\"format\": 3}").expect("writes");
    refused(&cfg, "manifest.json");
    refused(&EvalConfig { reference_store: Some(tmp.path().join("absent")), ..cfg.clone() }, "manifest.json");
}
